// cider/nn/linear_weights.h — the one description of a linear layer's weights y = x·Wᵀ + b, W [N, K], in any of
// cider's formats, on any device: what the engine's loaded layers (model::Linear), the seeds' classes (Int8Linear /
// Int4Linear, which own their tensors and hand out this view) and the CUDA backend's device layers (GpuLinear, whose
// pointers are device memory) all are. It points; it owns nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/kernel_table.h"

namespace cider::nn {

// float weights, int8 codes, packed int4 codes, a GGUF block format kept as in the file (quant/ggml_blocks.h)
enum class WeightKind { kDense, kInt8, kInt4, kGgml };

struct LinearWeights {
  WeightKind kind = WeightKind::kDense;
  int64_t N = 0, K = 0;
  const void* w = nullptr;        // dense: (N, K) in w_dtype; int8: int8 (N, K); int4: uint8 (N, K/2), q + 8 nibbles;
                                  // ggml: N rows of K / block_size blocks
  DType w_dtype = DType::kF32;    // dense: f32, f16 or bf16; int8: kI8; int4 and ggml: kU8
  uint32_t ggml_type = 0;         // ggml: the quant::GgmlType (one with an integer form)
  bool interleaved = false;       // ggml: rows interleaved 8 at a time (quant/ggml_interleave.h; CPU only, where the
                                  // kernel table asks for it: KernelTable::ggml_interleave)
  const float* scales = nullptr;  // int8/int4: (N) per channel or (K/group_size, N) per group
  int group_size = 0;             // int8/int4: 0 = per output channel
  const float* bias = nullptr;    // (N) or nullptr

  size_t nbytes() const;  // weights + scales + bias
  // The int kernels' arguments for out (M, N) float32 = x (M, K) float32 · Wᵀ + b with this layer's weights.
  kernels::IntLinearArgs int_args(const float* x, int64_t M, float* out) const;
  // out (M, N) = x (M, K)·Wᵀ + b, float32, through the active CPU kernel table (GEMV entries when M == 1).
  void forward(const float* x, int64_t M, float* out) const;
};

}  // namespace cider::nn
