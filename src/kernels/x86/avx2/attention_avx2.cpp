// AVX2 attention: placeholder (the reference) until the AVX2 kernel lands.
#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/attention_x86.h"

namespace cider::kernels::x86::avx2 {
void attention(const AttentionArgs& a) { ref::attention(a); }
void kv_append(const KVAppendArgs& a) { ref::kv_append(a); }
}  // namespace cider::kernels::x86::avx2
