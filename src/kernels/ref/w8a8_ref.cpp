// PLACEHOLDER until the linear-layer work lands: replaced by the real reference kernels.
#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
namespace cider::kernels::ref {
void w8a8_gemm(const IntLinearArgs&) { fail(ErrorCode::kUnsupported, "w8a8_gemm", "not implemented yet"); }
void w8a8_gemv(const IntLinearArgs&) { fail(ErrorCode::kUnsupported, "w8a8_gemv", "not implemented yet"); }
}  // namespace cider::kernels::ref
