// cider/quant/affine.h — MLX-compatible affine group quantization (mx.quantize / mx.dequantize).
//
// A row of K values is split into groups of `group_size` consecutive values; each group gets a float scale and bias
// and every value a `bits`-wide unsigned code q, with  w ≈ q·scale + bias.  The arithmetic follows MLX's CPU backend
// exactly (docs/formats.md): codes computed in float32 with the unrounded scale/bias, the stored scale/bias rounded
// to the input dtype, round-half-to-even. Codes are packed as one little-endian bit stream per row: element k takes
// stream bits [k·bits, (k+1)·bits), stream bit j is bit (j mod 32) of uint32 word j/32; a row takes K·bits/32 words.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/tensor.h"

namespace cider::quant {

// Allowed settings (MLX's): bits 2, 3, 4, 5, 6, 8; group size 32, 64, 128.
bool is_affine_bits(int bits);
bool is_affine_group_size(int group_size);
// Throws Error naming `op` unless bits / group size are allowed and K is a multiple of the group size.
void check_affine_params(const char* op, int64_t K, int group_size, int bits);

// uint32 words per packed row of `dim` codes: dim·bits/32 (dim·bits must be a multiple of 32).
constexpr int64_t packed_words(int64_t dim, int bits) { return dim * bits / 32; }

// ---- bit-stream packing (any width 1..8) ----
// Packs n codes (each < 2^bits) into n·bits/32 words (overwriting them). n·bits must be a multiple of 32.
void pack_codes(const uint8_t* codes, int64_t n, int bits, uint32_t* words);
// Reads code k of a packed row.
inline uint32_t unpack_code(const uint32_t* words, int64_t k, int bits) {
  int64_t bit = k * bits;
  int64_t w = bit >> 5;
  int shift = static_cast<int>(bit & 31);
  uint64_t two = words[w];
  if (shift + bits > 32) two |= static_cast<uint64_t>(words[w + 1]) << 32;
  return static_cast<uint32_t>((two >> shift) & ((1u << bits) - 1u));
}
// Unpacks n codes of a packed row.
void unpack_codes(const uint32_t* words, int64_t n, int bits, uint8_t* codes);

// ---- one group / one row (used by the KV cache and converters) ----
// Quantizes one group of `group_size` float32 values: writes the codes and the float32 (unrounded) scale and bias
// that produced them. The caller stores round_to(dtype, scale/bias) as MLX does.
void affine_quantize_group(const float* w, int group_size, int bits, uint8_t* codes, float* scale, float* bias);

// Quantizes one row of K float32 values: packed [K·bits/32] words, scales/biases [K/group_size] stored in
// scale_dtype (rounded from the float32 values used for the codes).
void affine_quantize_row(const float* w, int64_t K, int group_size, int bits, uint32_t* packed, void* scales,
                         void* biases, DType scale_dtype);

// Quantizes a block of n rows × dim columns per column (the KV cache's per-channel keys): column d of rows
// x[t·x_stride + d], t < n, is one group of n values (affine_quantize_group's arithmetic; n in 32, 64, 128), its
// scale and bias stored at scales[d], biases[d] in scale_dtype. Row t's codes are packed as a row of dim codes into
// packed + t·packed_stride words (dim·bits a multiple of 32).
void affine_quantize_columns(const float* x, int64_t x_stride, int64_t n, int64_t dim, int bits, uint32_t* packed,
                             int64_t packed_stride, void* scales, void* biases, DType scale_dtype);

// Symmetric quantization of one group (Q4_0-style; the KV cache's symmetric values, nn/kv_spec.h): edge = the value of
// largest magnitude (the first such), the step d = round_to(scale_dtype, edge / −2^(bits−1)) (the edge's code is 0),
// codes c = clamp(rint(w/d) + 2^(bits−1), 0, 2^bits − 1) in float32 with a true division, round half to even (all
// 2^(bits−1) when d is 0; a NaN gives 0). Then w ≈ d·(c − 2^(bits−1)) = d·c + b with b = symmetric_bias(d, bits),
// the affine algebra with a bias that is not stored. Writes the codes and the stored step (already rounded).
void symmetric_quantize_group(const float* w, int group_size, int bits, DType scale_dtype, uint8_t* codes,
                              float* step);
// Its step alone (the SIMD appends compute the codes from it): round_to(scale_dtype, edge / −2^(bits−1)).
float symmetric_step(const float* w, int group_size, int bits, DType scale_dtype);
// One row of K values: packed [K·bits/32] words, steps [K/group_size] in scale_dtype.
void symmetric_quantize_row(const float* w, int64_t K, int group_size, int bits, uint32_t* packed, void* scales,
                            DType scale_dtype);
// The bias a symmetric group's codes imply: −2^(bits−1)·d (exact in float32: a power-of-two multiple).
inline float symmetric_bias(float step, int bits) { return -static_cast<float>(1 << (bits - 1)) * step; }

// Dequantizes one value as MLX does: q·scale, rounded to scale_dtype, plus bias, rounded again (no FMA).
inline float affine_dequantize_value(uint32_t q, float scale, float bias, DType scale_dtype) {
  float prod = round_to(scale_dtype, static_cast<float>(q) * scale);
  return round_to(scale_dtype, prod + bias);
}

// Outlier key channels (nn/kv_spec.h): 4 more bits on a channel's affine code c. The residual of a rounded affine
// code, x − (c·s + b), lies within ±|s|/2; its refinement code r in 0..15 stands for (r − 7.5) steps of |s|/15 (the
// 16 levels spread over that interval: a refined value is within |s|/30 of x).
inline float outlier_step(float scale) { return std::fabs(scale) / 15.0f; }
inline uint32_t outlier_code(float residual, float step) {
  if (!(step > 0.0f)) return 8u;  // a constant channel: its coarse value is exact (0.5 steps of 0)
  const float r = std::floor(residual / step + 8.0f);  // the nearest of the levels r − 7.5
  return static_cast<uint32_t>(std::clamp(r, 0.0f, 15.0f));
}
inline float outlier_refinement(uint32_t code, float scale) {
  return outlier_step(scale) * (static_cast<float>(code) - 7.5f);
}

// ---- whole tensors (public, validated) ----
// w: [..., K] float32/float16/bfloat16, contiguous. packed: [..., K·bits/32] uint32; scales, biases: [..., K/gs]
// with w's dtype. All outputs caller-allocated and contiguous.
void affine_quantize(const TensorView& w, int group_size, int bits, const TensorView& packed,
                     const TensorView& scales, const TensorView& biases);

// out: [..., K] any float dtype; values computed in the scales' dtype (as MLX does), then stored in out's dtype.
void affine_dequantize(const TensorView& packed, const TensorView& scales, const TensorView& biases, int group_size,
                       int bits, const TensorView& out);

// Allocating forms.
struct AffineQuantized {
  Tensor packed;  // [..., K·bits/32] uint32
  Tensor scales;  // [..., K/gs]
  Tensor biases;  // [..., K/gs]
  int group_size = 64;
  int bits = 4;
};
AffineQuantized affine_quantize(const TensorView& w, int group_size, int bits);
Tensor affine_dequantize(const TensorView& packed, const TensorView& scales, const TensorView& biases,
                         int group_size, int bits, DType out_dtype);

}  // namespace cider::quant
