// Gated activation of the MLP, AVX2 + FMA (kernel_table.h GluArgs; the reference is kernels/ref/glu_ref.cpp).
// Both activations are x·σ(z) (SiLU: z = x; GELU-tanh: 0.5·(1 + tanh y) = σ(2y), z = 2·√(2/π)·x·(1 + 0.044715·x²)),
// and σ takes exp only of −|z| <= 0 (exp8, avx2/fast_exp.h): e = e^−|z|, σ(z) = 1/(1 + e) for z >= 0, e/(1 + e) below
// (no cancellation: the result keeps its relative accuracy deep in the negative tail). e^−|z| below 2^-126 is taken as
// 0 (exp8 clamps its argument at −87.3, so it would return e^−87.3 there). 8 lanes a step; the tail (count mod 8)
// through masked loads and stores, nothing read or written past count. act(−inf) = −0 is set explicitly (−inf·σ
// would be −inf·0); a NaN x gives z NaN, the z >= 0 branch (σ = 1) and x·1 = NaN.
#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "kernels/x86/avx2/fast_exp.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

// act(x) for 8 lanes.
template <bool kGelu>
inline __m256 act8(__m256 x) {
  __m256 z = x;
  if constexpr (kGelu) {
    const __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), _mm256_mul_ps(x, x), _mm256_set1_ps(1.0f));
    z = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f), x), p);  // 2·√(2/π)·x, then ·(1 + a·x²)
  }
  const __m256 t = _mm256_or_ps(z, _mm256_set1_ps(-0.0f));  // −|z|
  const __m256 e = _mm256_and_ps(exp8(t), _mm256_cmp_ps(t, _mm256_set1_ps(-87.3f), _CMP_GT_OQ));
  const __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);  // false for NaN
  const __m256 s = _mm256_div_ps(_mm256_blendv_ps(_mm256_set1_ps(1.0f), e, neg), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 minf = _mm256_cmp_ps(x, _mm256_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
  return _mm256_blendv_ps(_mm256_mul_ps(x, s), _mm256_set1_ps(-0.0f), minf);
}

template <bool kGelu>
void glu_impl(float* g, const float* u, int64_t count) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(g + i, _mm256_mul_ps(act8<kGelu>(_mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  if (i < count) {
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count - i)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 r = _mm256_mul_ps(act8<kGelu>(_mm256_maskload_ps(g + i, m)), _mm256_maskload_ps(u + i, m));
    _mm256_maskstore_ps(g + i, m, r);
  }
}

}  // namespace

void glu(const GluArgs& a) {
  if (a.act == GluActivation::kGeluTanh) {
    glu_impl<true>(a.g, a.u, a.count);
  } else {
    glu_impl<false>(a.g, a.u, a.count);
  }
}

}  // namespace cider::kernels::x86::avx2
