// cider/kernels/cuda/hadamard.h — the KV cache's randomized Hadamard rotation (nn::RotationKind::kHadamard = 3) of
// float32 rows on the GPU, bit-identical to the CPU's kernels::ref::hadamard_row (nn/rotation.h has the maths):
//   forward: x[i] ← x[i]·(s[i]·c), c = float32(1/√P); then per block of P = D & −D the fast Walsh–Hadamard transform,
//            stages h = 1, 2, …, P/2, pairs (j, j + h) with (j & h) == 0 → (x[j] + x[j+h], x[j] − x[j+h]);
//   inverse: the same transform first, then the sign/scale multiply.
// Each output is the same chain of rounded float32 adds whatever order the independent pairs of a stage run in, and
// the kernel uses explicit _rn intrinsics (never contracted into FMA), so the bytes equal the CPU's.
// The GPU model rotates keys and values with it before kv_append(rotation 0) — the cache then holds the same bytes as
// the CPU cache with rotation 3 — queries before attention, and the attention output back after it.
// Plain C++ (no CUDA headers); same conventions as cuda_api.h (device pointers, asynchronous, graph-capturable).
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_api.h"

namespace cider::cuda {

constexpr int64_t kMaxHadamardDim = 2048;  // one row of float32 in shared memory per warp (4 warps: ≤ 32 KB)

// In place on rows [rows, dim] float32 (row r at x + r·row_stride, row_stride ≥ dim, elements); signs device
// [dim] (±1, nn::Rotation::signs()). dim in [1, kMaxHadamardDim]. Errors name "cuda.hadamard_rows".
void hadamard_rows(float* x, int64_t rows, int64_t dim, int64_t row_stride, const float* signs, bool inverse,
                   const Exec& exec);

}  // namespace cider::cuda
