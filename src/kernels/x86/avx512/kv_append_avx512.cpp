// AVX-512 kv_append: placeholder (the reference) until the fused kernel lands.
#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/attention_x86.h"

namespace cider::kernels::x86::avx512 {
void kv_append(const KVAppendArgs& a) { ref::kv_append(a); }
}  // namespace cider::kernels::x86::avx512
