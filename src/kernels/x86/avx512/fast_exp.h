// exp16: the avx512 level's float32 exp for softmax weights, shared by its attention and log_sum_exp kernels (compiled
// with the avx512 flags only; `static inline`, one private copy per file).
#pragma once

#include <immintrin.h>

namespace cider::kernels::x86::avx512 {

// exp(x) for x <= 0 (or −inf -> exactly 0): Cody–Waite reduction by ln 2 and a degree-6 polynomial on
// [−ln2/2, ln2/2] (Cephes expf coefficients), then scaling by 2^n. Relative error about 2 ulp against std::exp.
static inline __m512 exp16(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-3.0e38f), _CMP_GT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(y, n));
}

}  // namespace cider::kernels::x86::avx512
