// AVX-512 helpers shared by the files of kernels/x86/avx512 (compiled with the avx512 flags only). Everything here
// is `static inline` (one private copy per file; see kernels/x86/x86_kernels.h for why).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "core/dtype.h"  // DType only: its inline helpers are not used here

namespace cider::kernels::x86::avx512 {

constexpr float kInt8QMax = 127.0f;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
static inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}
static inline __mmask64 mask64(int64_t n) {
  return n >= 64 ? ~__mmask64(0) : n <= 0 ? __mmask64(0) : ((__mmask64(1) << n) - 1);
}

// 16 float dtype elements from p[i..] (lanes outside `m` read as 0, their memory untouched), widened exactly.
static inline __m512 load16(const void* p, DType t, int64_t i, __mmask16 m) {
  switch (t) {
    case DType::kF16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
    case DType::kBF16:
      return _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i)), 16));
    default:
      return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  }
}

// Rounds 16 floats to bfloat16, nearest even, NaN kept quiet: the arithmetic of cider::f32_to_bf16.
static inline __m256i f32_to_bf16_16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// Stores 16 floats to p[i..] in dtype t (round to nearest even), lanes in `m` only.
static inline void store16(void* p, DType t, int64_t i, __m512 v, __mmask16 m) {
  switch (t) {
    case DType::kF16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case DType::kBF16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, f32_to_bf16_16(v));
      break;
    default:
      _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, v);
      break;
  }
}

// Per-token INT8 quantization of one row of K values, bit for bit quant::quantize_int8_row: sx = max|x|/127 (1 if
// 0), q = clamp(rint(x/sx), ±127); a row holding NaN/±inf gets sx = NaN and codes 0. Writes q[0..K) and zeros in
// q[K..Kp). Returns sx.
static inline float quantize_row(const void* x, DType t, int64_t K, int64_t Kp, int8_t* q) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = mask16(K - k);
    const __m512 a = _mm512_and_ps(load16(x, t, k, m), abs_mask);
    bad |= _mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ);  // NaN or inf
    amax = _mm512_max_ps(amax, a);
  }
  if (bad) {
    for (int64_t k = 0; k < Kp; k += 64) _mm512_mask_storeu_epi8(q + k, mask64(Kp - k), _mm512_setzero_si512());
    return std::numeric_limits<float>::quiet_NaN();
  }
  float sx = _mm512_reduce_max_ps(amax) / kInt8QMax;
  if (sx == 0.0f) sx = 1.0f;
  const __m512 vs = _mm512_set1_ps(sx), lo = _mm512_set1_ps(-kInt8QMax), hi = _mm512_set1_ps(kInt8QMax);
  for (int64_t k = 0; k < Kp; k += 16) {
    const __mmask16 m = mask16(K - k);  // 0 past K: zeros
    __m512 v = _mm512_div_ps(load16(x, t, k, m), vs);
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    _mm_mask_storeu_epi8(q + k, mask16(Kp - k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  return sx;
}

// One piece of 32 float32 values: quantize_row(x, kF32, 32, 32, q) bit for bit (codes q[0..32), the step returned),
// and the sums of its two halves' codes *s0 (q[0..16)) and *s1 (q[16..32)) taken from the registers — reading the
// codes back from q right after the narrowing stores stalls on store forwarding (measured: a third of the
// activation quantization's time in the native-weight GEMM).
static inline float quantize_piece32(const float* x, int8_t* q, int* s0, int* s1) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  const __m512 a0 = _mm512_and_ps(x0, abs_mask), a1 = _mm512_and_ps(x1, abs_mask);
  if (_mm512_cmp_ps_mask(a0, inf, _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, inf, _CMP_NLT_UQ)) {  // NaN or inf
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_setzero_si256());
    *s0 = *s1 = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  float sx = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)) / kInt8QMax;
  if (sx == 0.0f) sx = 1.0f;
  const __m512 vs = _mm512_set1_ps(sx), lo = _mm512_set1_ps(-kInt8QMax), hi = _mm512_set1_ps(kInt8QMax);
  auto codes = [&](__m512 v) {
    v = _mm512_roundscale_ps(_mm512_div_ps(v, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lo), hi));
  };
  const __m512i c0 = codes(x0), c1 = codes(x1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(c0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(c1));
  *s0 = _mm512_reduce_add_epi32(c0);
  *s1 = _mm512_reduce_add_epi32(c1);
  return sx;
}

// Σ q[0..n) as int64 (n a multiple of 64 not required: reads exactly n bytes).
static inline int64_t sum_i8(const int8_t* q, int64_t n) {
  __m512i acc = _mm512_setzero_si512();
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t k = 0; k < n; k += 64) {
    const __m512i v = _mm512_maskz_loadu_epi8(mask64(n - k), q + k);
    acc = _mm512_dpbusd_epi32(acc, ones, v);  // 1·q summed in groups of 4
  }
  return _mm512_reduce_add_epi32(acc);  // |Σ| ≤ 127·n: no overflow for the K allowed
}

// Transposed reduction of 16 int32 vectors (one per row r): returns, for each 128-bit quarter L of the vectors,
// out[L] lane r = Σ of v[r]'s four lanes in quarter L. Σ_L out[L] gives each row's full horizontal sum.
static inline void reduce16_quarters(const __m512i v[16], __m512i out[4]) {
  __m512i s[8], q[4];
  for (int i = 0; i < 8; ++i)  // per quarter: [a0+a2, b0+b2, a1+a3, b1+b3]
    s[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]),
                            _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per quarter: [a, b, c, d] (rows 4i..4i+3)
    q[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(s[2 * i], s[2 * i + 1]),
                            _mm512_unpackhi_epi64(s[2 * i], s[2 * i + 1]));
  // 4x4 transpose of 128-bit quarters: out[L] = [q0.L, q1.L, q2.L, q3.L].
  const __m512i t0 = _mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i t1 = _mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i t2 = _mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i t3 = _mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(3, 2, 3, 2));
  out[0] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
  out[1] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
  out[2] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
  out[3] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
}

// Float version: the same transposed reduction for 16 float vectors, returning the full sums.
static inline __m512 reduce16_ps(const __m512 v[16]) {
  __m512i q[4];
  __m512 s[8], t[4];
  for (int i = 0; i < 8; ++i)
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
    t[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    q[i] = _mm512_castps_si512(t[i]);
  }
  const __m512i t0 = _mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i t1 = _mm512_shuffle_i32x4(q[0], q[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i t2 = _mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i t3 = _mm512_shuffle_i32x4(q[2], q[3], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 o0 = _mm512_castsi512_ps(_mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0)));
  const __m512 o1 = _mm512_castsi512_ps(_mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 o2 = _mm512_castsi512_ps(_mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0)));
  const __m512 o3 = _mm512_castsi512_ps(_mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_add_ps(o0, o1), _mm512_add_ps(o2, o3));
}

// In-place transpose of a 16x16 matrix of 32-bit elements (r[i] = row i).
static inline void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  // Now r[4i + j] holds, in each 128-bit quarter L, elements (rows 4i..4i+3, column 4L + j).
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[4 + i], _MM_SHUFFLE(2, 0, 2, 0));
    t[4 + i] = _mm512_shuffle_i32x4(r[i], r[4 + i], _MM_SHUFFLE(3, 1, 3, 1));
    t[8 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], _MM_SHUFFLE(2, 0, 2, 0));
    t[12 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], _MM_SHUFFLE(2, 0, 2, 0));
    r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], _MM_SHUFFLE(3, 1, 3, 1));
    r[4 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], _MM_SHUFFLE(3, 1, 3, 1));
  }
}

}  // namespace cider::kernels::x86::avx512
