// AVX2 (+FMA, F16C) helpers shared by the files of kernels/x86/avx2 (compiled with the avx2 flags only). Everything
// here is `static inline` (one private copy per file; see kernels/x86/x86_kernels.h for why).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "core/dtype.h"  // DType only: its inline helpers are not used here

namespace cider::kernels::x86::avx2 {

constexpr float kInt8QMax = 127.0f;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
static inline int64_t esize(DType t) { return t == DType::kF32 ? 4 : 2; }

// 8 float dtype elements p[i..i+n) (n < 8: the rest read as 0 without touching memory past them), widened exactly.
static inline __m256 load8(const void* p, DType t, int64_t i, int64_t n) {
  alignas(32) uint8_t tmp[32];
  const uint8_t* src = static_cast<const uint8_t*>(p) + i * esize(t);
  if (n < 8) {
    std::memset(tmp, 0, sizeof tmp);
    if (n > 0) std::memcpy(tmp, src, static_cast<size_t>(n * esize(t)));
    src = tmp;
  }
  switch (t) {
    case DType::kF16: return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    case DType::kBF16:
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src))), 16));
    default: return _mm256_loadu_ps(reinterpret_cast<const float*>(src));
  }
}

// Stores 8 floats to p[i..i+n) in dtype t, round to nearest even (bf16: the arithmetic of cider::f32_to_bf16).
static inline void store8(void* p, DType t, int64_t i, __m256 v, int64_t n) {
  alignas(32) uint8_t tmp[32];
  uint8_t* dst = static_cast<uint8_t*>(p) + i * esize(t);
  uint8_t* w = n < 8 ? tmp : dst;
  switch (t) {
    case DType::kF16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(w), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case DType::kBF16: {
      const __m256i u = _mm256_castps_si256(v);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
      const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
      const __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
      const __m256i nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));  // both ≥ 0 as int32
      const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
      const __m256i h = _mm256_blendv_epi8(r, q, nan);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(w),
                       _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
      break;
    }
    default: _mm256_storeu_ps(reinterpret_cast<float*>(w), v); break;
  }
  if (n < 8 && n > 0) std::memcpy(dst, tmp, static_cast<size_t>(n * esize(t)));
}

// The int8 step of values whose |x| lanes' maximum is amax (finite): max/127, 1 when it is 0 (quant::quantize_int8_row).
static inline float int8_step(__m256 amax) {
  alignas(32) float m8[8];
  _mm256_store_ps(m8, amax);
  float mx = 0.0f;
  for (float v : m8) mx = v > mx ? v : mx;
  const float sx = mx / kInt8QMax;
  return sx == 0.0f ? 1.0f : sx;
}

// Per-token INT8 quantization, bit for bit quant::quantize_int8_row (see avx512/simd.h); zeros in q[K..Kp), Kp a
// multiple of 8.
static inline float quantize_row(const void* x, DType t, int64_t K, int64_t Kp, int8_t* q) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 amax = _mm256_setzero_ps();
  int bad = 0;
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 a = _mm256_and_ps(load8(x, t, k, K - k), abs_mask);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
    amax = _mm256_max_ps(amax, a);
  }
  if (bad) {
    std::memset(q, 0, static_cast<size_t>(Kp));
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float sx = int8_step(amax);
  const __m256 vs = _mm256_set1_ps(sx), lo = _mm256_set1_ps(-kInt8QMax), hi = _mm256_set1_ps(kInt8QMax);
  for (int64_t k = 0; k < Kp; k += 8) {
    __m256 v = _mm256_div_ps(load8(x, t, k, K - k), vs);
    v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m256i i32 = _mm256_cvtps_epi32(v);
    const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_packs_epi16(i16, i16));
  }
  return sx;
}

// One piece of 32 float32 values: quantize_row(x, kF32, 32, 32, q) bit for bit (codes q[0..32), the step returned),
// and the sums of its two halves' codes *s0 (q[0..16)) and *s1 (q[16..32)) taken from the registers (reading the
// codes back right after the narrowing stores stalls on store forwarding; avx512/simd.h).
static inline float quantize_piece32(const float* x, int8_t* q, int* s0, int* s1) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  __m256 xv[4], amax = _mm256_setzero_ps();
  int bad = 0;
  for (int k = 0; k < 4; ++k) {
    xv[k] = _mm256_loadu_ps(x + 8 * k);
    const __m256 a = _mm256_and_ps(xv[k], abs_mask);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ));
    amax = _mm256_max_ps(amax, a);
  }
  if (bad) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_setzero_si256());
    *s0 = *s1 = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float sx = int8_step(amax);
  const __m256 vs = _mm256_set1_ps(sx), lo = _mm256_set1_ps(-kInt8QMax), hi = _mm256_set1_ps(kInt8QMax);
  __m256i c[4];
  for (int k = 0; k < 4; ++k) {
    __m256 v = _mm256_round_ps(_mm256_div_ps(xv[k], vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
  }
  // int32 → int16 → int8 with saturation (exact: |c| <= 127); packs interleave 128-bit lanes, the permute restores
  // the order.
  const __m256i w01 = _mm256_packs_epi32(c[0], c[1]), w23 = _mm256_packs_epi32(c[2], c[3]);
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), b);
  auto hsum = [](__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
  };
  *s0 = hsum(_mm256_add_epi32(c[0], c[1]));
  *s1 = hsum(_mm256_add_epi32(c[2], c[3]));
  return sx;
}

static inline int64_t sum_i8(const int8_t* q, int64_t n) {
  int64_t s = 0;
  for (int64_t k = 0; k < n; ++k) s += q[k];
  return s;
}

// Transposed reduction of 8 int32 vectors (row r = v[r]): lo lane r = Σ of v[r]'s lanes 0..3, hi = lanes 4..7.
static inline void reduce8_halves(const __m256i v[8], __m256i* lo, __m256i* hi) {
  const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  *lo = _mm256_permute2x128_si256(u0, u1, 0x20);
  *hi = _mm256_permute2x128_si256(u0, u1, 0x31);
}

static inline __m256 reduce8_ps(const __m256 v[8]) {
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

static inline float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace cider::kernels::x86::avx2
