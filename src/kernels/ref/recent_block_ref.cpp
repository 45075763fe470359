// The recent block's exact part of attention, merged — reference (kernel_table.h RecentBlockArgs): plain float32
// in a fixed order (dot products in 16 running sums added pairwise at the end, value sums key by key), std::exp,
// std::tanh, std::log; the rows read in place in bfloat16.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::ref {

namespace {

// bfloat16 bits → float32 (exact: the bits are the float's upper half).
inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Σ_d q_d·k_d over bfloat16 k, in 16 running float32 sums (k's 16-element runs), added in a fixed order at the end;
// the tail after the last full run goes to the lanes it reaches.
float dot_bf16(const float* q, const uint16_t* k, int64_t n) {
  float acc[16] = {};
  int64_t d = 0;
  for (; d + 16 <= n; d += 16)
    for (int l = 0; l < 16; ++l) acc[l] += q[d + l] * bf16_to_f32(k[d + l]);
  for (int l = 0; d + l < n; ++l) acc[l] += q[d + l] * bf16_to_f32(k[d + l]);
  for (int l = 0; l < 8; ++l) acc[l] += acc[l + 8];
  for (int l = 0; l < 4; ++l) acc[l] += acc[l + 4];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

}  // namespace

void recent_block(const RecentBlockArgs& a) {
  const int64_t rep = a.Hq / a.Hkv, ns = a.sink, n = ns + a.n;  // rows: the sink's, then the stage's
  if (n == 0) return;
  const int64_t L = a.L, kL = a.kL, Dk = a.Dk, Dv = a.Dv;
  auto pos_of = [&](int64_t j) { return j < ns ? j : a.lo + (j - ns); };
  auto key_row = [&](int64_t bh, int64_t j) {
    return j < ns ? a.sink_keys + (bh * a.sink_rows + j) * Dk : a.keys + (bh * a.n + j - ns) * Dk;
  };
  auto value_row = [&](int64_t bh, int64_t j, bool exact) {
    if (j < ns) return a.sink_values + (bh * a.sink_rows + j) * Dv;
    return (exact ? a.values_exact : a.values) + (bh * a.n + j - ns) * Dv;
  };
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> sc(static_cast<size_t>(n)), acc(static_cast<size_t>(Dv));
  for (int64_t row = a.row_begin; row < a.row_end; ++row) {
    const int64_t b = row / a.Hq, h = row % a.Hq, bh = b * a.Hkv + h / rep;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t t = kL - L + i, e = recent_block_start(t, a.block, a.lo);
      const int64_t w = std::max(t / a.vwin * a.vwin, a.xlo);  // values as appended from w on
      int64_t plo = 0, phi = kL;  // visible positions [plo, phi)
      if (a.mask_kind == MaskKind::kCausal) {
        phi = t + 1;
        if (a.window > 0) plo = std::max<int64_t>(0, t - a.window + 1);
      }
      // rows [0, min(ns, e)) of the sink and [ns + e − lo, n) of the stage, within [plo, phi)
      const int64_t ranges[2][2] = {{std::max<int64_t>(0, plo), std::min({ns, e, phi})},
                                    {ns + std::max(e, plo) - a.lo, ns + std::min(kL, phi) - a.lo}};
      const float* qr = a.q + ((b * a.Hq + h) * L + i) * Dk;
      const int64_t moff = b * a.mask_stride[0] + h * a.mask_stride[1] + i * a.mask_stride[2];
      float m = kNegInf;
      for (const auto& r : ranges)
        for (int64_t j = r[0]; j < r[1]; ++j) {
          float v = a.scale * dot_bf16(qr, key_row(bh, j), Dk);
          if (a.softcap > 0.0f) v = a.softcap * std::tanh(v / a.softcap);
          const int64_t off = moff + pos_of(j) * a.mask_stride[3];
          if (a.mask_kind == MaskKind::kBool) {
            if (static_cast<const uint8_t*>(a.mask)[off] == 0) v = kNegInf;
          } else if (a.mask_kind == MaskKind::kAdditive) {
            v += load_float(a.mask, a.mask_dtype, off);
          }
          sc[static_cast<size_t>(j)] = v;
          m = std::max(m, v);
        }
      float* lse = a.lse + (b * a.Hq + h) * L + i;
      const float lq = *lse;
      const float M = std::max(m, lq);
      if (M == kNegInf) continue;  // neither part saw a key: the kernel's zeros stay
      std::fill(acc.begin(), acc.end(), 0.0f);
      float l = 0.0f;
      for (const auto& r : ranges)
        for (int64_t j = r[0]; j < r[1]; ++j) {
          const float p = std::exp(sc[static_cast<size_t>(j)] - M);  // exp(−inf) = 0: masked
          if (p == 0.0f) continue;
          l += p;
          const uint16_t* vr = value_row(bh, j, j >= ns && pos_of(j) >= w);
          for (int64_t d = 0; d < Dv; ++d) acc[static_cast<size_t>(d)] += p * bf16_to_f32(vr[d]);
        }
      const float wq = lq == kNegInf ? 0.0f : std::exp(lq - M);
      float* orow = a.out + ((b * a.Hq + h) * L + i) * Dv;
      const float inv = 1.0f / (wq + l);
      for (int64_t d = 0; d < Dv; ++d) orow[d] = (wq * orow[d] + acc[static_cast<size_t>(d)]) * inv;
      *lse = M + std::log(wq + l);  // the merged row's, for a later merge (segments)
    }
  }
}

}  // namespace cider::kernels::ref
