// cider/quant/int4.h — symmetric INT4 weight quantization, the weight format of the W4A8 linear kernels
// (kernels/kernel_table.h, IntLinearArgs).
//
// Weights w [N, K] (N output channels, row-major), all arithmetic float32, rint rounds half to even:
//   per channel (group_size 0):        s[n]   = max_k |w[n,k]| / 7         scales float32 [N]
//   per group   (32/64/128/256 on K):  s[g,n] = max_{k∈g} |w[n,k]| / 7     scales float32 [K/gs, N] (transposed)
//   q = clamp(rint(w / s), -8, 7); a scale of 0 becomes 1 (codes 0).
// Since |w/s| ≤ 7, -8 appears only if a caller packs it directly; it is kept because the nibble format allows it.
//
// Packing: the nibble stored is q + 8 (zero point 8, so 0..15). Row n takes K/2 bytes (K must be even); byte i holds
// element 2i in bits 0..3 and element 2i+1 in bits 4..7.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace cider::quant {

constexpr int kInt4QMax = 7;
constexpr int kInt4QMin = -8;
constexpr int kInt4ZeroPoint = 8;
// Largest K for which a per-channel W4A8 sum Σ_k xq·wq (|term| ≤ 127·8) cannot overflow int32.
constexpr int64_t kInt4MaxAccumK = INT32_MAX / (127 * -kInt4QMin);

// Group sizes of INT4 weights: 0 (per output channel), 32, 64, 128, 256.
bool is_int4_group_size(int group_size);

struct Int4Weights {
  Tensor packed;       // uint8 [N, K/2]
  Tensor scales;       // float32 [N] (group_size 0) or [K/group_size, N]
  int group_size = 0;  // 0 = per output channel
  int64_t rows() const { return packed.shape.empty() ? 0 : packed.shape[0]; }  // N
  int64_t cols() const { return packed.shape.size() < 2 ? 0 : 2 * packed.shape[1]; }  // K
};

// w: [N, K] float32/float16/bfloat16, contiguous, finite; K even and a multiple of group_size (if > 0).
Int4Weights quantize_int4_weights(const TensorView& w, int group_size);

// The signed code q in [-8, 7] of element k of a packed row.
inline int int4_code(const uint8_t* packed_row, int64_t k) {
  const uint8_t byte = packed_row[k >> 1];
  const int nibble = (k & 1) ? (byte >> 4) : (byte & 0x0f);
  return nibble - kInt4ZeroPoint;
}

// Packs n (even) signed codes in [-8, 7] into n/2 bytes.
void pack_int4(const int8_t* codes, int64_t n, uint8_t* packed_row);

}  // namespace cider::quant
