// cider/kernels/cuda/glu.cuh — the gated activations of an MLP (SwiGLU / GeGLU) on the device (model_ops.cu: glu_rows).
// (A GEMV that formed act(gate)·up in its quantization front was tried on 2026-11-30 and measured slower than this
// kernel + the plain GEMV: every block recomputes all K gated values; docs/cuda/ops.md.)
#pragma once

#include <cuda_runtime.h>

namespace cider::cuda::act {

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// GELU, tanh approximation (PyTorch's approximate="tanh"), the CPU engine's constants.
__device__ __forceinline__ float gelu_tanh(float v) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  return 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kCubic * v * v * v)));
}

// act 0: silu(g)·u, 1: gelu_tanh(g)·u.
__device__ __forceinline__ float glu(float g, float u, int act) { return (act == 0 ? silu(g) : gelu_tanh(g)) * u; }

}  // namespace cider::cuda::act
