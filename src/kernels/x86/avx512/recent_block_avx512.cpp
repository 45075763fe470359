// The recent block's exact part of attention, merged — AVX-512 (kernel_table.h RecentBlockArgs; the reference is
// kernels/ref/recent_block_ref.cpp). Per query row: the scores of its visible keys, 4 keys at a time, each dot product
// in the reference's 16 lanes (bfloat16 widened exactly by a 16-bit shift, float32 FMAs; the tail through a lane
// mask) reduced in the reference's order; std::exp / std::tanh per score as the reference; then the value sums in 8
// registers (128 dimensions) per pass over the keys, FMAs of e^(s−M) into widened value rows. Bool and additive
// masks go to the reference (a prefill or decode step of the models uses none or causal).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int kValueRegs = 8;  // value sums: 8 × 16 dimensions per pass over the keys

inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
inline __m512 load_bf16(const uint16_t* p, __mmask16 m) {
  return widen_bf16(_mm256_maskz_loadu_epi16(m, p));
}
inline __mmask16 lanes(int64_t n) {  // the first min(n, 16) lanes (n >= 0)
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// The reference's reduction of its 16 lanes: l += l + 8, then l += l + 4, then (0 + 2) + (1 + 3).
inline float reduce16(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  alignas(16) float f[4];
  _mm_store_ps(f, b);
  return (f[0] + f[2]) + (f[1] + f[3]);
}

inline int64_t imax(int64_t x, int64_t y) { return x > y ? x : y; }
inline int64_t imin(int64_t x, int64_t y) { return x < y ? x : y; }

// Scores of keys [j0, j1) (key rows at kp(j)) against q into s[j]: scale·q·k, softcapped.
template <typename KeyRow>
void scores(const float* q, int64_t Dk, int64_t j0, int64_t j1, const KeyRow& kp, float scale, float softcap, float* s) {
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    const uint16_t* k0 = kp(j);
    const uint16_t* k1 = kp(j + 1);
    const uint16_t* k2 = kp(j + 2);
    const uint16_t* k3 = kp(j + 3);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t d = 0; d < Dk; d += 16) {
      const __mmask16 m = lanes(Dk - d);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
      a0 = _mm512_fmadd_ps(qv, load_bf16(k0 + d, m), a0);
      a1 = _mm512_fmadd_ps(qv, load_bf16(k1 + d, m), a1);
      a2 = _mm512_fmadd_ps(qv, load_bf16(k2 + d, m), a2);
      a3 = _mm512_fmadd_ps(qv, load_bf16(k3 + d, m), a3);
    }
    s[j] = scale * reduce16(a0);
    s[j + 1] = scale * reduce16(a1);
    s[j + 2] = scale * reduce16(a2);
    s[j + 3] = scale * reduce16(a3);
  }
  for (; j < j1; ++j) {
    const uint16_t* k0 = kp(j);
    __m512 a0 = _mm512_setzero_ps();
    for (int64_t d = 0; d < Dk; d += 16) {
      const __mmask16 m = lanes(Dk - d);
      a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), load_bf16(k0 + d, m), a0);
    }
    s[j] = scale * reduce16(a0);
  }
  if (softcap > 0.0f)
    for (j = j0; j < j1; ++j) s[j] = softcap * std::tanh(s[j] / softcap);
}

}  // namespace

void recent_block(const RecentBlockArgs& a) {
  if (a.mask_kind == MaskKind::kBool || a.mask_kind == MaskKind::kAdditive) {
    ref::recent_block(a);
    return;
  }
  const int64_t rep = a.Hq / a.Hkv, ns = a.sink, n = ns + a.n;
  if (n == 0) return;
  const int64_t L = a.L, kL = a.kL, Dk = a.Dk, Dv = a.Dv;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* sc = static_cast<float*>(scratch(0, static_cast<size_t>(n) * sizeof(float)));
  for (int64_t row = a.row_begin; row < a.row_end; ++row) {
    const int64_t b = row / a.Hq, h = row % a.Hq, bh = b * a.Hkv + h / rep;
    const uint16_t* sink_k = a.sink_keys + bh * a.sink_rows * Dk;
    const uint16_t* stage_k = a.keys + bh * a.n * Dk;  // row j >= ns at stage_k + (j − ns)·Dk
    const uint16_t* sink_v = a.sink_values + bh * a.sink_rows * Dv;
    const uint16_t* stage_v = a.values + bh * a.n * Dv;
    const uint16_t* stage_vx = a.values_exact + bh * a.n * Dv;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t t = kL - L + i, e = recent_block_start(t, a.block, a.lo);
      const int64_t w = imax(t / a.vwin * a.vwin, a.xlo);  // values as appended from w on
      int64_t plo = 0, phi = kL;
      if (a.mask_kind == MaskKind::kCausal) {
        phi = t + 1;
        if (a.window > 0) plo = imax(0, t - a.window + 1);
      }
      const int64_t s0 = imax(0, plo), s1 = imin(imin(ns, e), phi);                     // the sink's rows
      const int64_t r0 = ns + imax(e, plo) - a.lo, r1 = ns + imin(kL, phi) - a.lo;   // the stage's rows
      const int64_t xr = ns + w - a.lo;  // stage rows from xr on: values as appended
      const float* qr = a.q + (row * L + i) * Dk;
      if (s1 > s0) scores(qr, Dk, s0, s1, [&](int64_t j) { return sink_k + j * Dk; }, a.scale, a.softcap, sc);
      if (r1 > r0) scores(qr, Dk, r0, r1, [&](int64_t j) { return stage_k + (j - ns) * Dk; }, a.scale, a.softcap, sc);
      float m = kNegInf;
      for (int64_t j = s0; j < s1; ++j) m = m > sc[j] ? m : sc[j];
      for (int64_t j = r0; j < r1; ++j) m = m > sc[j] ? m : sc[j];
      float* lse = a.lse + row * L + i;
      const float lq = *lse;
      const float M = m > lq ? m : lq;
      if (M == kNegInf) continue;  // neither part saw a key: the kernel's zeros stay
      float l = 0.0f;
      for (int64_t j = s0; j < s1; ++j) l += (sc[j] = std::exp(sc[j] - M));
      for (int64_t j = r0; j < r1; ++j) l += (sc[j] = std::exp(sc[j] - M));
      const float wq = lq == kNegInf ? 0.0f : std::exp(lq - M);
      const float inv = 1.0f / (wq + l);
      const __m512 wqv = _mm512_set1_ps(wq), invv = _mm512_set1_ps(inv);
      float* orow = a.out + (row * L + i) * Dv;
      for (int64_t d0 = 0; d0 < Dv; d0 += 16 * kValueRegs) {
        __mmask16 mk[kValueRegs];
        __m512 acc[kValueRegs];
        for (int c = 0; c < kValueRegs; ++c) {
          mk[c] = lanes(imax(0, Dv - d0 - 16 * c));
          acc[c] = _mm512_setzero_ps();
        }
        auto add_row = [&](float p, const uint16_t* vr) {
          const __m512 pv = _mm512_set1_ps(p);
          for (int c = 0; c < kValueRegs; ++c) acc[c] = _mm512_fmadd_ps(pv, load_bf16(vr + 16 * c, mk[c]), acc[c]);
        };
        for (int64_t j = s0; j < s1; ++j)
          if (sc[j] != 0.0f) add_row(sc[j], sink_v + j * Dv + d0);
        for (int64_t j = r0; j < r1; ++j)
          if (sc[j] != 0.0f) add_row(sc[j], (j >= xr ? stage_vx : stage_v) + (j - ns) * Dv + d0);
        for (int c = 0; c < kValueRegs; ++c) {
          float* op = orow + d0 + 16 * c;
          const __m512 o = _mm512_maskz_loadu_ps(mk[c], op);
          _mm512_mask_storeu_ps(op, mk[c], _mm512_mul_ps(_mm512_fmadd_ps(wqv, o, acc[c]), invv));
        }
      }
      *lse = M + std::log(wq + l);
    }
  }
}

}  // namespace cider::kernels::x86::avx512
