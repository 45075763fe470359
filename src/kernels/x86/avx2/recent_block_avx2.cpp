// The recent block's exact part of attention, merged — AVX2 (kernel_table.h RecentBlockArgs; the reference is
// kernels/ref/recent_block_ref.cpp). avx512/recent_block_avx512.cpp's design with 8 lanes: each dot product in the
// reference's 16 lanes as two 8-lane sums (the tail of a row not a multiple of 16 through zero-padded copies), reduced
// in the reference's order; the value sums in 8 registers (64 dimensions) per pass over the keys, the last Dv mod 8
// dimensions in scalar float32. Bool and additive masks go to the reference.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

constexpr int kValueRegs = 8;  // value sums: 8 × 8 dimensions per pass over the keys

inline __m256 load_bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The reference's reduction of its 16 lanes (lo = lanes 0..7, hi = 8..15): l += l + 8, l += l + 4, (0 + 2) + (1 + 3).
inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 a = _mm256_add_ps(lo, hi);
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  alignas(16) float f[4];
  _mm_store_ps(f, b);
  return (f[0] + f[2]) + (f[1] + f[3]);
}

inline int64_t imax(int64_t x, int64_t y) { return x > y ? x : y; }
inline int64_t imin(int64_t x, int64_t y) { return x < y ? x : y; }
// kernel_table.h's recent_block_start, defined here: an inline function of a shared header compiled with this file's
// ISA flags could be the copy the linker keeps for baseline code too (x86_kernels.h).
inline int64_t block_start(int64_t pos, int64_t block, int64_t lo) { return imax(pos / block * block, lo); }

// Scores of keys [j0, j1) (key rows at kp(j)) against q into s[j]: scale·q·k, softcapped. full = Dk rounded down to
// 16; qt = q's tail (Dk − full values) zero-padded to 16.
template <typename KeyRow>
void scores(const float* q, const float* qt, int64_t Dk, int64_t j0, int64_t j1, const KeyRow& kp, float scale,
            float softcap, float* s) {
  const int64_t full = Dk / 16 * 16;
  int64_t j = j0;
  for (; j + 2 <= j1; j += 2) {
    const uint16_t* k0 = kp(j);
    const uint16_t* k1 = kp(j + 1);
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;
    for (int64_t d = 0; d < full; d += 16) {
      const __m256 ql = _mm256_loadu_ps(q + d), qh = _mm256_loadu_ps(q + d + 8);
      a0 = _mm256_fmadd_ps(ql, load_bf16(k0 + d), a0);
      b0 = _mm256_fmadd_ps(qh, load_bf16(k0 + d + 8), b0);
      a1 = _mm256_fmadd_ps(ql, load_bf16(k1 + d), a1);
      b1 = _mm256_fmadd_ps(qh, load_bf16(k1 + d + 8), b1);
    }
    if (full < Dk) {
      alignas(32) uint16_t t0[16] = {}, t1[16] = {};
      std::memcpy(t0, k0 + full, static_cast<size_t>(Dk - full) * sizeof(uint16_t));
      std::memcpy(t1, k1 + full, static_cast<size_t>(Dk - full) * sizeof(uint16_t));
      const __m256 ql = _mm256_loadu_ps(qt), qh = _mm256_loadu_ps(qt + 8);
      a0 = _mm256_fmadd_ps(ql, load_bf16(t0), a0);
      b0 = _mm256_fmadd_ps(qh, load_bf16(t0 + 8), b0);
      a1 = _mm256_fmadd_ps(ql, load_bf16(t1), a1);
      b1 = _mm256_fmadd_ps(qh, load_bf16(t1 + 8), b1);
    }
    s[j] = scale * reduce16(a0, b0);
    s[j + 1] = scale * reduce16(a1, b1);
  }
  for (; j < j1; ++j) {
    const uint16_t* k0 = kp(j);
    __m256 a0 = _mm256_setzero_ps(), b0 = a0;
    for (int64_t d = 0; d < full; d += 16) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_bf16(k0 + d), a0);
      b0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load_bf16(k0 + d + 8), b0);
    }
    if (full < Dk) {
      alignas(32) uint16_t t0[16] = {};
      std::memcpy(t0, k0 + full, static_cast<size_t>(Dk - full) * sizeof(uint16_t));
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qt), load_bf16(t0), a0);
      b0 = _mm256_fmadd_ps(_mm256_loadu_ps(qt + 8), load_bf16(t0 + 8), b0);
    }
    s[j] = scale * reduce16(a0, b0);
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
  const int64_t full = Dk / 16 * 16, vfull = Dv / 8 * 8;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* sc = static_cast<float*>(scratch(0, static_cast<size_t>(n) * sizeof(float)));
  alignas(32) float qt[16];
  float tail_acc[8];
  for (int64_t row = a.row_begin; row < a.row_end; ++row) {
    const int64_t b = row / a.Hq, h = row % a.Hq, bh = b * a.Hkv + h / rep;
    const uint16_t* sink_k = a.sink_keys + bh * a.sink_rows * Dk;
    const uint16_t* stage_k = a.keys + bh * a.n * Dk;  // row j >= ns at stage_k + (j − ns)·Dk
    const uint16_t* sink_v = a.sink_values + bh * a.sink_rows * Dv;
    const uint16_t* stage_v = a.values + bh * a.n * Dv;
    const uint16_t* stage_vx = a.values_exact + bh * a.n * Dv;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t t = kL - L + i, e = block_start(t, a.block, a.lo);
      const int64_t w = imax(t / a.vwin * a.vwin, a.xlo);  // values as appended from w on
      int64_t plo = 0, phi = kL;
      if (a.mask_kind == MaskKind::kCausal) {
        phi = t + 1;
        if (a.window > 0) plo = imax(0, t - a.window + 1);
      }
      const int64_t s0 = imax(0, plo), s1 = imin(imin(ns, e), phi);                   // the sink's rows
      const int64_t r0 = ns + imax(e, plo) - a.lo, r1 = ns + imin(kL, phi) - a.lo;  // the stage's rows
      const int64_t xr = ns + w - a.lo;  // stage rows from xr on: values as appended
      const float* qr = a.q + (row * L + i) * Dk;
      for (int l = 0; l < 16; ++l) qt[l] = full + l < Dk ? qr[full + l] : 0.0f;
      if (s1 > s0) scores(qr, qt, Dk, s0, s1, [&](int64_t j) { return sink_k + j * Dk; }, a.scale, a.softcap, sc);
      if (r1 > r0)
        scores(qr, qt, Dk, r0, r1, [&](int64_t j) { return stage_k + (j - ns) * Dk; }, a.scale, a.softcap, sc);
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
      const __m256 wqv = _mm256_set1_ps(wq), invv = _mm256_set1_ps(inv);
      float* orow = a.out + (row * L + i) * Dv;
      auto value_row = [&](int64_t j) {
        return j < ns ? sink_v + j * Dv : (j >= xr ? stage_vx : stage_v) + (j - ns) * Dv;
      };
      for (int64_t d0 = 0; d0 < vfull; d0 += 8 * kValueRegs) {
        const int64_t nv = imin(kValueRegs, (vfull - d0) / 8);
        __m256 acc[kValueRegs];
        for (int c = 0; c < kValueRegs; ++c) acc[c] = _mm256_setzero_ps();
        auto add_row = [&](float p, const uint16_t* vr) {
          const __m256 pv = _mm256_set1_ps(p);
          if (nv == kValueRegs) {
            for (int c = 0; c < kValueRegs; ++c) acc[c] = _mm256_fmadd_ps(pv, load_bf16(vr + 8 * c), acc[c]);
          } else {
            for (int c = 0; c < kValueRegs; ++c)
              if (c < nv) acc[c] = _mm256_fmadd_ps(pv, load_bf16(vr + 8 * c), acc[c]);
          }
        };
        for (int64_t j = s0; j < s1; ++j)
          if (sc[j] != 0.0f) add_row(sc[j], value_row(j) + d0);
        for (int64_t j = r0; j < r1; ++j)
          if (sc[j] != 0.0f) add_row(sc[j], value_row(j) + d0);
        for (int c = 0; c < kValueRegs; ++c)
          if (c < nv) {
            float* op = orow + d0 + 8 * c;
            _mm256_storeu_ps(op, _mm256_mul_ps(_mm256_fmadd_ps(wqv, _mm256_loadu_ps(op), acc[c]), invv));
          }
      }
      if (vfull < Dv) {  // the last Dv mod 8 dimensions
        const int64_t nt = Dv - vfull;
        for (int64_t d = 0; d < nt; ++d) tail_acc[d] = 0.0f;
        for (int part = 0; part < 2; ++part)
          for (int64_t j = part ? r0 : s0; j < (part ? r1 : s1); ++j) {
            if (sc[j] == 0.0f) continue;
            const uint16_t* vr = value_row(j) + vfull;
            for (int64_t d = 0; d < nt; ++d) tail_acc[d] += sc[j] * bf16_to_f32(vr[d]);
          }
        for (int64_t d = 0; d < nt; ++d) orow[vfull + d] = (wq * orow[vfull + d] + tail_acc[d]) * inv;
      }
      *lse = M + std::log(wq + l);
    }
  }
}

}  // namespace cider::kernels::x86::avx2
