// cider/kernels/cuda/linear_gemv_rows.h — the one-warp-per-weight-row decode GEMV (linear_gemv_rows.cu), reached
// only through cuda::w8a8_gemv / w4a8_gemv (linear_gemv.cu validates the arguments and picks the kernel).
#pragma once

#include <cstdint>

#include "kernels/cuda/moe.h"
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

// The same kernel over a mixture-of-experts layer's slots (cuda::moe_gemv, which validates the arguments): slot s in
// [0, slots) computes out[s] = x[s / x_div] · W_eᵀ with e = sel[s] and W_e = table[e] (int8 [N, K] or int4 [N, K/2],
// scales [N] or [K/group_size, N]); x (rows, K) and out (slots, N) float32. sel is read after the programmatic-launch
// wait, so the previous kernel on the stream may write it.
void launch_experts(const MoeExpertWeights* table, const int32_t* sel, int64_t slots, int64_t x_div, bool int4,
                    int group_size, int64_t N, int64_t K, const float* x, float* out, void* stream, const char* op);

}  // namespace cider::cuda::gemv_rows
