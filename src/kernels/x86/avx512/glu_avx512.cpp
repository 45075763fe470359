// Gated activation of the MLP, AVX-512 (kernel_table.h GluArgs; the reference is kernels/ref/glu_ref.cpp):
// avx2/glu_avx2.cpp's x·σ(z) with σ from exp16(−|z|) (avx512/fast_exp.h; it reaches the subnormal range and is 0 below
// about −104, so no cut-off is needed here), 16 lanes a step, the tail through a lane mask (nothing read or written
// past count).
#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "kernels/x86/avx512/fast_exp.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

// act(x) for 16 lanes.
template <bool kGelu>
inline __m512 act16(__m512 x) {
  __m512 z = x;
  if constexpr (kGelu) {
    const __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), _mm512_mul_ps(x, x), _mm512_set1_ps(1.0f));
    z = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(1.5957691216057308f), x), p);  // 2·√(2/π)·x, then ·(1 + a·x²)
  }
  const __m512 t = _mm512_or_ps(z, _mm512_set1_ps(-0.0f));  // −|z|
  const __m512 e = exp16(t);
  const __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);  // false for NaN
  const __m512 s = _mm512_div_ps(_mm512_mask_mov_ps(_mm512_set1_ps(1.0f), neg, e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  const __mmask16 minf =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
  return _mm512_mask_mov_ps(_mm512_mul_ps(x, s), minf, _mm512_set1_ps(-0.0f));
}

template <bool kGelu>
void glu_impl(float* g, const float* u, int64_t count) {
  int64_t i = 0;
  for (; i + 16 <= count; i += 16)
    _mm512_storeu_ps(g + i, _mm512_mul_ps(act16<kGelu>(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
  if (i < count) {
    const __mmask16 m = static_cast<__mmask16>((1u << (count - i)) - 1u);
    const __m512 r = _mm512_mul_ps(act16<kGelu>(_mm512_maskz_loadu_ps(m, g + i)), _mm512_maskz_loadu_ps(m, u + i));
    _mm512_mask_storeu_ps(g + i, m, r);
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

}  // namespace cider::kernels::x86::avx512
