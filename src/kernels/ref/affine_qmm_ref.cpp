// PLACEHOLDER: replaced in the next step.
#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
namespace cider::kernels::ref {
void affine_qmm(const AffineQmmArgs&) { fail(ErrorCode::kUnsupported, "affine_qmm", "not implemented yet"); }
}  // namespace cider::kernels::ref
