// Small kernels of the GPU model (model/cuda/model_kernels.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "model/cuda/model_kernels.h"

namespace cider::model::gpu {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}

// Element (t, h, d) of in [a, b, D] goes to out[(h·a + t)·D + d]. One thread per element, grid-stride.
__global__ void transpose_heads_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t a, int64_t b,
                                       int64_t D) {
  const int64_t total = a * b * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % D;
    const int64_t h = (i / D) % b;
    const int64_t t = i / (D * b);
    out[(h * a + t) * D + d] = in[i];
  }
}

// SplitMix64 finalizer of (seed, index): independent 64-bit values per element, reproducible from the seed.
__device__ uint64_t hash64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_kernel(void* out, bool bf16, int64_t count, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(hash64(seed, static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    const float v = lo + (hi - lo) * u;
    if (bf16) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

__global__ void fill_bytes_kernel(uint8_t* out, int64_t count, uint64_t seed, bool as_int8) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = hash64(seed, static_cast<uint64_t>(i));
    out[i] = as_int8 ? static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(r % 255u) - 127))
                     : static_cast<uint8_t>(r >> 56);
  }
}

}  // namespace

void transpose_heads(const float* in, float* out, int64_t a, int64_t b, int64_t D, void* stream) {
  constexpr const char* op = "cuda.transpose_heads";
  check(a >= 0 && b >= 0 && D >= 0, ErrorCode::kInvalidArgument, op, "dims must be >= 0; got ", a, ", ", b, ", ", D);
  if (a * b * D == 0) return;
  transpose_heads_kernel<<<grid_for(a * b * D), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, a, b, D);
  cuda::check_last_launch(op);
}

void fill_uniform(void* out, DType dtype, int64_t count, uint64_t seed, float lo, float hi, void* stream) {
  constexpr const char* op = "cuda.fill_uniform";
  check(dtype == DType::kF32 || dtype == DType::kBF16, ErrorCode::kInvalidArgument, op,
        "dtype must be f32 or bf16; got ", dtype_name(dtype));
  if (count <= 0) return;
  fill_uniform_kernel<<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      out, dtype == DType::kBF16, count, seed, lo, hi);
  cuda::check_last_launch(op);
}

void fill_random_bytes(void* out, int64_t count, uint64_t seed, bool as_int8, void* stream) {
  constexpr const char* op = "cuda.fill_random_bytes";
  if (count <= 0) return;
  fill_bytes_kernel<<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint8_t*>(out), count, seed, as_int8);
  cuda::check_last_launch(op);
}

}  // namespace cider::model::gpu
