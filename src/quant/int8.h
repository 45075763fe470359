// cider/quant/int8.h — symmetric INT8 quantization: weights (per output channel or per group) and activations
// (per token), the formats consumed by the W8A8 linear kernels (kernels/kernel_table.h, IntLinearArgs).
//
// Symmetric means no zero point: w ≈ q·s with q in [-127, 127] (-128 is never produced, so negation is exact and
// the int8 range is symmetric). All arithmetic is float32; rint rounds half to even.
//
// Weights w [N, K] (N output channels, row-major):
//   per channel (group_size 0):  s[n] = max_k |w[n,k]| / 127                      scales float32 [N]
//   per group   (64/128/256):    s[g,n] = max_{k∈g} |w[n,k]| / 127                scales float32 [K/gs, N]
//   q = clamp(rint(w / s), -127, 127); a scale of 0 (all-zero row/group, or a max so small that max/127
//   underflows) becomes 1, which gives codes 0.
// The per-group scales are stored transposed ([K/gs, N], as the seed does) so a kernel walking N output channels of
// one group reads consecutive scales.
//
// Optional clipping (per channel only): clip_percentile p in (0, 100]. Per row, let a_0 ≤ … ≤ a_{K-1} be the sorted
// |w[n,:]|, h = (p/100)·(K−1), i = floor(h); the threshold is t = a_i + (h − i)·(a_{i+1} − a_i) (a_{K-1} when i =
// K−1), computed in float64 and rounded to float32 — linear interpolation between order statistics, NumPy's default
// percentile method. Values are clamped to [−t, t] before quantizing and s[n] = t/127, so p = 100 is no clipping.
#pragma once

#include <cstdint>
#include <optional>

#include "core/tensor.h"

namespace cider::quant {

// Largest |code| of symmetric INT8.
constexpr int kInt8QMax = 127;
// Largest K for which a per-channel W8A8 sum Σ_k xq·wq (|term| ≤ 127·127) cannot overflow int32.
constexpr int64_t kInt8MaxAccumK = INT32_MAX / (kInt8QMax * kInt8QMax);

// Group sizes of INT8 weights: 0 (per output channel), 64, 128, 256.
bool is_int8_group_size(int group_size);

struct Int8Weights {
  Tensor q;            // int8 [N, K]
  Tensor scales;       // float32 [N] (group_size 0) or [K/group_size, N]
  int group_size = 0;  // 0 = per output channel
  int64_t rows() const { return q.shape.empty() ? 0 : q.shape[0]; }  // N
  int64_t cols() const { return q.shape.size() < 2 ? 0 : q.shape[1]; }  // K
};

// w: [N, K] float32/float16/bfloat16, contiguous, finite. K must be a multiple of group_size (if > 0).
// clip_percentile only with group_size 0.
Int8Weights quantize_int8_weights(const TensorView& w, int group_size,
                                  std::optional<float> clip_percentile = std::nullopt);

// The clipping threshold defined above, for n ≥ 1 values (reorders `abs_values`, which must all be ≥ 0).
float abs_percentile(float* abs_values, int64_t n, double percentile);

// ---- activations, per token (row) ----
// Quantizes one row of K values stored in x_dtype (f32/f16/bf16): writes codes q[K] and returns the scale
// sx = max|x| / 127 (1 when that is 0), with q = clamp(rint(x / sx), -127, 127).
// A row holding any NaN or ±inf gets sx = NaN and codes 0, so every output computed from it is NaN instead of a
// finite wrong number. No validation (kernels call this with checked arguments).
float quantize_int8_row(const void* x, DType x_dtype, int64_t K, int8_t* q);

struct Int8Activations {
  Tensor q;       // int8 [M, K]
  Tensor scales;  // float32 [M]
};
// x: [..., K] float32/float16/bfloat16, contiguous; M is the product of the leading dimensions.
Int8Activations quantize_int8_activations(const TensorView& x);

}  // namespace cider::quant
