// cider/quant/kv_stats.h — the one-byte code of the query statistics that choose a block's outlier key channels
// (nn/kv_spec.h, KVSpec::key_outliers): per cached position and channel, s = Σ q² over the KV head's query heads.
// Shared by the CPU cache (nn/kv_cache.cpp) and the GPU append (kernels/cuda/kv_append.cu), which must write the same
// bytes: integer and comparison arithmetic only, no log2/exp2 whose last bit could differ between the two.
//
// The grid is a quarter octave: code 0 is s = 0 (or below 2^-32), code c in 1..255 is s ≈ 2^((c − 128)/4), s rounded
// to the nearest grid point in log2 (within 2^(1/8): 9% of s, 4.4% of the RMS √s that ranks a channel; the sums over
// a block's positions average it further). Values from 2^31.875 up (and +inf) take code 255. The statistic only
// ranks channels (range × RMS); one byte per value is half the bfloat16 it replaces.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CIDER_KV_STATS_HD __host__ __device__
#else
#define CIDER_KV_STATS_HD
#endif

namespace cider::quant {

CIDER_KV_STATS_HD inline uint32_t kv_stat_bits(float s) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(s);
#else
  uint32_t u;
  std::memcpy(&u, &s, sizeof u);
  return u;
#endif
}

CIDER_KV_STATS_HD inline float kv_stat_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// s >= 0 (a NaN or a negative s is a caller's bug: code 0).
CIDER_KV_STATS_HD inline uint8_t kv_stat_encode(float s) {
  if (!(s > 0.0f)) return 0;
  const uint32_t u = kv_stat_bits(s);
  const int e = static_cast<int>((u >> 23) & 0xFFu) - 127;  // s in [2^e, 2^(e+1)) (normal numbers; tiny ones: code 0)
  // The mantissa as 1.m, against the midpoints 2^(1/8), 2^(3/8), 2^(5/8), 2^(7/8) of the quarter-octave grid: q = how
  // many it reaches (no branches: a prefill encodes every key channel of every position). Exponents outside
  // [−33, 32] fall to 0 / 255 through the clamp.
  const float m = kv_stat_float((u & 0x7FFFFFu) | 0x3F800000u);
  const int q = static_cast<int>(m >= 1.09050773f) + static_cast<int>(m >= 1.29683955f) +
                static_cast<int>(m >= 1.54221083f) + static_cast<int>(m >= 1.83400808f);
  int c = 4 * e + q + 128;
  c = c < 0 ? 0 : c;
  c = c > 255 ? 255 : c;
  return static_cast<uint8_t>(c);
}

// The grid point of a code (exact: 2^k times one of 1, 2^(1/4), 2^(1/2), 2^(3/4) rounded to float32).
CIDER_KV_STATS_HD inline float kv_stat_decode(uint8_t code) {
  if (code == 0) return 0.0f;
  const int c = static_cast<int>(code) - 128;
  const int e = c >= 0 ? c / 4 : -((-c + 3) / 4);  // floor(c / 4)
  const int q = c - 4 * e;
  const float frac = q == 0 ? 1.0f : q == 1 ? 1.18920712f : q == 2 ? 1.41421356f : 1.68179283f;
  return frac * kv_stat_float(static_cast<uint32_t>(e + 127) << 23);  // e in [-32, 31]: a normal power of two
}

}  // namespace cider::quant
