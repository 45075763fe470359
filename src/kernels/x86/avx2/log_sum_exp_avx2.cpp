// log-sum-exp of a row, AVX2 + FMA (kernel_table.h LogSumExpArgs; the reference is kernels/ref/log_sum_exp_ref.cpp).
// Pass 1: the max over 8 lanes (a NaN noted by an unordered compare). Pass 2: exp8(z − max) in float32, each 8 values
// widened to two float64 vectors and added there, so the sum of up to 10^6 terms keeps float64 precision. Tails:
// masked loads that read −inf (exp = 0).
#include <immintrin.h>

#include <cmath>
#include <limits>

#include "kernels/x86/avx2/fast_exp.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {
// z[i, i + 8) with lanes at or past n reading as −inf.
inline __m256 load_tail(const float* z, int64_t i, int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), lane);
  const __m256 v = _mm256_maskload_ps(z + i, m);
  return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), v, _mm256_castsi256_ps(m));
}
}  // namespace

void log_sum_exp(const LogSumExpArgs& a) {
  const float* z = a.z;
  const int64_t n = a.n, n8 = n / 8 * 8;
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 v = _mm256_loadu_ps(z + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, v);
  }
  if (n8 < n) {
    const __m256 v = load_tail(z, n8, n);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  float m = lanes[0];
  for (int k = 1; k < 8; ++k) m = std::max(m, lanes[k]);
  *a.max = m;
  if (_mm256_movemask_ps(nan) != 0 || m == std::numeric_limits<float>::infinity()) {
    *a.lse = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  if (m == -std::numeric_limits<float>::infinity()) {
    *a.lse = -std::numeric_limits<double>::infinity();
    return;
  }
  const __m256 mv = _mm256_set1_ps(m);
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  auto add = [&](__m256 v) {
    const __m256 e = exp8(_mm256_sub_ps(v, mv));
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  };
  for (int64_t i = 0; i < n8; i += 8) add(_mm256_loadu_ps(z + i));
  if (n8 < n) add(load_tail(z, n8, n));
  alignas(32) double d[4];
  _mm256_store_pd(d, _mm256_add_pd(s0, s1));
  *a.lse = std::log((d[0] + d[1]) + (d[2] + d[3]));
}

}  // namespace cider::kernels::x86::avx2
