// cider/nn/linear.h — linear layers y = x·Wᵀ + b with symmetric integer weights and int8 per-token activations.
//
//   Int8Linear (W8A8): int8 weights [N, K], per output channel (group_size 0) or per group of 64/128/256 along K.
//   Int4Linear (W4A8): int4 weights packed uint8 [N, K/2], per output channel or per group of 32/64/128/256.
// Formats: quant/int8.h, quant/int4.h; kernel contract (activation quantization, int32 sums, float epilogue):
// kernels/kernel_table.h, IntLinearArgs. A layer holds only the quantized weights, their float32 scales
// ([N] or [K/gs, N]) and an optional float32 bias [N]; no float copy of the weights is kept.
//
// Conversion from an MLX affine-quantized layer dequantizes (quant::affine_dequantize, exact MLX arithmetic, values
// in the scales' dtype) and requantizes symmetrically. Default target group size when none is given:
//   Int8Linear: 8-bit MLX weights with group 64/128/256 keep that group size (the seed's rule); anything else
//               becomes per channel.
//   Int4Linear: the MLX group size (32, 64 or 128, all valid INT4 group sizes) for every bit width — INT4 per
//               channel loses far more accuracy than the grouped source had, so the granularity is kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "core/tensor.h"
#include "nn/linear_weights.h"
#include "quant/int4.h"
#include "quant/int8.h"

namespace cider::nn {

class Int8Linear {
 public:
  // w: [N, K] float32/float16/bfloat16, contiguous, finite. bias: nullptr or [N] of any float dtype.
  // group_size: 0 (per channel), 64, 128 or 256 (K a multiple of it). clip_percentile (per channel only): in
  // (0, 100], see quant/int8.h for its exact definition.
  static Int8Linear from_float(const TensorView& w, const TensorView* bias, int group_size = 0,
                               std::optional<float> clip_percentile = std::nullopt);

  // packed: uint32 [N, K·mlx_bits/32]; scales, biases: [N, K/mlx_group_size] in one float dtype (MLX's layout).
  static Int8Linear from_mlx_affine(const TensorView& packed, const TensorView& scales, const TensorView& biases,
                                    int mlx_group_size, int mlx_bits, const TensorView* bias,
                                    std::optional<int> target_group_size = std::nullopt,
                                    std::optional<float> clip_percentile = std::nullopt);

  // x: [..., K] float32/float16/bfloat16; out: [..., N] float32/float16/bfloat16 with x's leading dimensions.
  // Both contiguous and not overlapping. M = product of the leading dimensions; M == 1 uses the GEMV kernel.
  void forward(const TensorView& x, const TensorView& out) const;

  int64_t in_features() const { return w_.cols(); }   // K
  int64_t out_features() const { return w_.rows(); }  // N
  int group_size() const { return w_.group_size; }
  TensorView weights() const { return w_.q.view(); }       // int8 [N, K]
  TensorView scales() const { return w_.scales.view(); }   // float32 [N] or [K/group_size, N]
  std::optional<TensorView> bias() const;                  // float32 [N]
  size_t nbytes() const;                                   // weights + scales + bias
  LinearWeights descriptor() const;                        // this layer as nn/linear_weights.h describes layers

 private:
  Int8Linear(quant::Int8Weights w, std::optional<Tensor> bias) : w_(std::move(w)), bias_(std::move(bias)) {}
  static Int8Linear build(const char* op, const TensorView& w, const TensorView* bias, int group_size,
                          std::optional<float> clip_percentile);

  quant::Int8Weights w_;
  std::optional<Tensor> bias_;
};

class Int4Linear {
 public:
  // w: [N, K] float32/float16/bfloat16, contiguous, finite, K even. bias: nullptr or [N] of any float dtype.
  // group_size: 0 (per channel), 32, 64, 128 or 256 (K a multiple of it). clip_percentile is accepted only to keep
  // the signature of Int8Linear; any value is rejected (clipping is defined for per-channel INT8 only).
  static Int4Linear from_float(const TensorView& w, const TensorView* bias, int group_size = 0,
                               std::optional<float> clip_percentile = std::nullopt);

  // As Int8Linear::from_mlx_affine; default target group size = mlx_group_size.
  static Int4Linear from_mlx_affine(const TensorView& packed, const TensorView& scales, const TensorView& biases,
                                    int mlx_group_size, int mlx_bits, const TensorView* bias,
                                    std::optional<int> target_group_size = std::nullopt,
                                    std::optional<float> clip_percentile = std::nullopt);

  // As Int8Linear::forward.
  void forward(const TensorView& x, const TensorView& out) const;

  int64_t in_features() const { return w_.cols(); }   // K
  int64_t out_features() const { return w_.rows(); }  // N
  int group_size() const { return w_.group_size; }
  TensorView weights() const { return w_.packed.view(); }  // uint8 [N, K/2], element 2i in the low nibble, q + 8
  TensorView scales() const { return w_.scales.view(); }   // float32 [N] or [K/group_size, N]
  std::optional<TensorView> bias() const;                  // float32 [N]
  size_t nbytes() const;                                   // weights + scales + bias
  LinearWeights descriptor() const;                        // this layer as nn/linear_weights.h describes layers

 private:
  Int4Linear(quant::Int4Weights w, std::optional<Tensor> bias) : w_(std::move(w)), bias_(std::move(bias)) {}
  static Int4Linear build(const char* op, const TensorView& w, const TensorView* bias, int group_size,
                          std::optional<float> clip_percentile);

  quant::Int4Weights w_;
  std::optional<Tensor> bias_;
};

}  // namespace cider::nn
