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

}  // namespace cider::kernels::ref
