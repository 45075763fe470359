#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"
namespace cider::kernels::x86::avx2 {
void w8a8_gemv(const IntLinearArgs& a) { ref::w8a8_gemv(a); }
void w8a8_gemm(const IntLinearArgs& a) { ref::w8a8_gemm(a); }
void w4a8_gemv(const IntLinearArgs& a) { ref::w4a8_gemv(a); }
void w4a8_gemm(const IntLinearArgs& a) { ref::w4a8_gemm(a); }
void dense_gemm(const DenseGemmArgs& a) { ref::dense_gemm(a); }
void affine_qmm(const AffineQmmArgs& a) { ref::affine_qmm(a); }
}
namespace cider::kernels::x86::avx512 {
void dense_gemm(const DenseGemmArgs& a) { ref::dense_gemm(a); }
void affine_qmm(const AffineQmmArgs& a) { ref::affine_qmm(a); }
}
