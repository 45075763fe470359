// cider/kernels/ref — the reference kernels: plain scalar C++, float32/float64 accumulation, kept forever as the
// oracle for every fast kernel. One file per op × format.
#pragma once

#include "kernels/kernel_table.h"

namespace cider::kernels::ref {

void affine_qmm(const AffineQmmArgs& a);       // affine_qmm_ref.cpp
void w8a8_gemm(const IntLinearArgs& a);        // w8a8_ref.cpp
void w8a8_gemv(const IntLinearArgs& a);        // w8a8_ref.cpp
void w4a8_gemm(const IntLinearArgs& a);        // w4a8_ref.cpp
void w4a8_gemv(const IntLinearArgs& a);        // w4a8_ref.cpp
void attention(const AttentionArgs& a);        // attention_ref.cpp
void dense_gemm(const DenseGemmArgs& a);       // dense_gemm_ref.cpp
void kv_append(const KVAppendArgs& a);        // kv_append_ref.cpp
void ggml_linear(const GgmlLinearArgs& a);     // ggml_linear_ref.cpp
void ggml_dequantize(const GgmlDequantArgs& a);  // ggml_linear_ref.cpp
void gated_delta(const GatedDeltaKernelArgs& a);  // gated_delta_ref.cpp
void log_sum_exp(const LogSumExpArgs& a);          // log_sum_exp_ref.cpp
void glu(const GluArgs& a);                        // glu_ref.cpp
void recent_block(const RecentBlockArgs& a);       // recent_block_ref.cpp
void hadamard_rows(const HadamardRowsArgs& a);     // kv_append_ref.cpp: hadamard_row per row

// The randomized Hadamard rotation of nn/rotation.h (kind 3) on one row of D float32 values in place, signs [D]
// values ±1: forward x ← H·diag(s)·x/√P, inverse x ← diag(s)·H·x/√P, H block-diagonal with blocks of
// P = hadamard_block(D) (= D when D is a power of two), each rounding step in the documented order
// (kv_append_ref.cpp). nn::Rotation calls it, so the cache and the reference kernel agree.
void hadamard_row(float* x, const float* signs, int64_t D, bool inverse);
// The largest power of two dividing D > 0 (D & −D): 256 → 256, 96 → 32, 80 → 16.
inline int64_t hadamard_block(int64_t D) { return D & -D; }

}  // namespace cider::kernels::ref
