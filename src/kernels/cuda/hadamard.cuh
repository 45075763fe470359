// cider/kernels/cuda/hadamard.cuh — the device side of hadamard.h: one warp rotates one row held in shared memory.
// Shared by kernels/cuda/hadamard.cu and the GPU model's fused head kernels (kernels/cuda/model_ops.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace cider::cuda {

// The largest power of two dividing D: the Hadamard block (kernels::ref::hadamard_block).
__host__ __device__ __forceinline__ int64_t hadamard_block_of(int64_t D) { return D & -D; }

// float32(1/√P) as the CPU computes it: 1/sqrt in double, rounded once to float.
__device__ __forceinline__ float hadamard_scale(int64_t P) {
  return static_cast<float>(1.0 / sqrt(static_cast<double>(P)));
}

// The unnormalized FWHT over every block of P in row[0, D) (shared memory), by the 32 lanes of one warp: stage h
// visits the D/2 pairs (j, j + h), j with (j & h) == 0, pair p ↦ j = (p / h)·2h + p % h (blocks are aligned to P, so
// pairs never straddle blocks). __syncwarp between stages (and on entry: the caller's writes are visible).
__device__ __forceinline__ void warp_fwht(float* row, int64_t D, int64_t P, int lane) {
  __syncwarp();
  for (int64_t h = 1; h < P; h *= 2) {
    for (int64_t p = lane; p < D / 2; p += 32) {
      const int64_t j = (p / h) * 2 * h + p % h;
      const float a = row[j], b = row[j + h];
      row[j] = __fadd_rn(a, b);
      row[j + h] = __fsub_rn(a, b);
    }
    __syncwarp();
  }
}

// x[i] ← x[i]·(s[i]·c) over row[0, D) (s[i]·c is exact: a sign flip of c).
__device__ __forceinline__ void warp_sign_scale(float* row, const float* __restrict__ signs, int64_t D, float c,
                                                int lane) {
  __syncwarp();
  for (int64_t i = lane; i < D; i += 32) row[i] = __fmul_rn(row[i], __fmul_rn(signs[i], c));
  __syncwarp();
}

// The whole rotation of one row in shared memory (forward or inverse), by one warp.
__device__ __forceinline__ void warp_hadamard(float* row, const float* __restrict__ signs, int64_t D, bool inverse,
                                              int lane) {
  const int64_t P = hadamard_block_of(D);
  const float c = hadamard_scale(P);
  if (inverse) warp_fwht(row, D, P, lane);
  warp_sign_scale(row, signs, D, c, lane);
  if (!inverse) warp_fwht(row, D, P, lane);
}

}  // namespace cider::cuda
