// PLACEHOLDER until the attention work lands: replaced by the real reference kernel.
#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
namespace cider::kernels::ref {
void attention(const AttentionArgs&) { fail(ErrorCode::kUnsupported, "attention", "not implemented yet"); }
}  // namespace cider::kernels::ref
