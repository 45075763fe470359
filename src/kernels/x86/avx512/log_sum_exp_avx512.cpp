// log-sum-exp of a row, AVX-512 (kernel_table.h LogSumExpArgs; the reference is kernels/ref/log_sum_exp_ref.cpp):
// avx2/log_sum_exp_avx2.cpp's two passes over 16 lanes, masked tails reading −inf.
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/x86/avx512/fast_exp.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx512 {

void log_sum_exp(const LogSumExpArgs& a) {
  const float* z = a.z;
  const int64_t n = a.n;
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  auto load = [&](int64_t i) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
    return _mm512_mask_loadu_ps(ninf, m, z + i);
  };
  __m512 mx = ninf;
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = load(i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    mx = _mm512_max_ps(mx, v);
  }
  const float m = _mm512_reduce_max_ps(mx);
  *a.max = m;
  if (nan != 0 || m == std::numeric_limits<float>::infinity()) {
    *a.lse = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  if (m == -std::numeric_limits<float>::infinity()) {
    *a.lse = -std::numeric_limits<double>::infinity();
    return;
  }
  const __m512 mv = _mm512_set1_ps(m);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(load(i), mv));
    s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  *a.lse = std::log(_mm512_reduce_add_pd(_mm512_add_pd(s0, s1)));
}

}  // namespace cider::kernels::x86::avx512
