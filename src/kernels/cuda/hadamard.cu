// cider/kernels/cuda/hadamard.cu — randomized Hadamard rotation of float32 rows (hadamard.h). One warp per row, the
// row staged in shared memory (dim ≤ 2048 floats per warp); kWarps rows per CTA. Memory-bound and tiny in the model
// (decode: 40 rows of 128), so the design is the simplest exactly-right one: coalesced load, warp_hadamard, store.
#include "kernels/cuda/hadamard.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/hadamard.cuh"

namespace cider::cuda {

namespace {

constexpr int kWarps = 4;

__global__ void __launch_bounds__(kWarps * 32) hadamard_rows_kernel(float* x, int64_t rows, int64_t dim,
                                                                     int64_t row_stride,
                                                                     const float* __restrict__ signs, bool inverse) {
  extern __shared__ float hadamard_smem[];  // [kWarps, dim]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= rows) return;  // whole warps leave; no block-wide barrier below
  float* row = hadamard_smem + static_cast<int64_t>(warp) * dim;
  float* g = x + r * row_stride;
  for (int64_t i = lane; i < dim; i += 32) row[i] = g[i];
  warp_hadamard(row, signs, dim, inverse, lane);
  for (int64_t i = lane; i < dim; i += 32) g[i] = row[i];
}

}  // namespace

void hadamard_rows(float* x, int64_t rows, int64_t dim, int64_t row_stride, const float* signs, bool inverse,
                   const Exec& exec) {
  constexpr const char* op = "cuda.hadamard_rows";
  check(dim >= 1 && dim <= kMaxHadamardDim, ErrorCode::kShapeMismatch, op, "dim must be in [1, ", kMaxHadamardDim,
        "]; got ", dim);
  check(rows >= 0, ErrorCode::kShapeMismatch, op, "rows must be >= 0; got ", rows);
  check(row_stride >= dim, ErrorCode::kShapeMismatch, op, "row_stride must be >= dim ", dim, "; got ", row_stride);
  if (rows == 0) return;
  check(x != nullptr && signs != nullptr, ErrorCode::kInvalidArgument, op, "x and signs must not be null");
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  check(blocks <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "rows must fit a grid; got ", rows);
  const size_t smem = static_cast<size_t>(kWarps * dim) * sizeof(float);  // ≤ 32 KB: no opt-in attribute needed
  hadamard_rows_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, smem, static_cast<cudaStream_t>(exec.stream)>>>(
      x, rows, dim, row_stride, signs, inverse);
  check_last_launch(op);
}

}  // namespace cider::cuda
