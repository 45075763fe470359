// cider/kernels/cuda/linear_gemv_rows.h — the one-warp-per-weight-row decode GEMV (linear_gemv_rows.cu), reached
// only through cuda::w8a8_gemv / w4a8_gemv (linear_gemv.cu validates the arguments and picks the kernel).
#pragma once

#include <cstdint>

#include "kernels/kernel_table.h"

namespace cider::cuda::gemv_rows {

// Largest K this kernel takes (one quantized activation row, plus W4's per-chunk code sums, in shared memory).
constexpr int64_t kMaxK = 65536;

// True when the kernel serves this call: one activation row (M = 1) and K ≤ kMaxK. Everything else that the
// launcher accepts runs the tile kernel.
inline bool supports(int64_t M, int64_t K) { return M == 1 && K <= kMaxK; }

// Launches y = x · Wᵀ for M = 1 on `stream` (a cudaStream_t). Arguments are validated by the caller (linear_gemv.cu);
// xq/sx: the activation codes and scale already quantized into the workspace, or null to quantize in every block.
void launch(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq, const float* sx, void* stream,
            const char* op);

}  // namespace cider::cuda::gemv_rows
