// The recent block's exact part of attention, merged (kernel_table.h RecentBlockArgs; nn::attention's
// add_recent_block): every ISA level's entry against the reference on fresh random inputs — head dims with tails
// (not multiples of 8 or 16), GQA, sinks, value windows, causal masks with and without a window, no mask, softcap,
// rows whose kernel part saw nothing (lse = −inf) — every output element and every lse; bool and additive masks
// (sent to the reference by the fast levels) bit-identical to it.
//
// The bound, per query row, with u = 2^-24 and γ_k = k·u/(1 − k·u):
//   scores: both sides sum each dot product of Dk terms in float32 (the reference in its 16 lanes, the fast levels in
//     the same lanes with FMAs), each within γ_Dk·Σ_d|q_d·k_d| of the exact dot, and round the product by the scale
//     (u·|s|) and the softcap's division, tanh and product (a few u of |s| or the cap; tanh's slope is at most 1):
//     Δ_j = 2·γ_Dk·|scale|·Σ_d|q_d·k_jd| + 4u·|s_j| + 8u·cap; δ = max_j Δ_j over the row's visible keys.
//   weights: M moves by at most δ, so each s_j − M by 2δ plus the subtraction's rounding (u·|s_j − M| on each side),
//     and std::exp of it relatively by e^(2δ + 2u·|s_j − M| + 2u) − 1 (its own rounding on each side: u); the kernel
//     part's weight e^(lse − M) the same with lse for s_j. ρ = the largest of these over the row.
//   output: a weighted mean of the rows x_k (the kernel's o and the visible value rows) with weights each moved by a
//     relative ρ at most moves by at most 2ρ/(1 − ρ)·max_k|x_k − mean| <= 4ρ/(1 − ρ)·X, X = max|x_k| over the row;
//     each side's float32 sums (n + 1 products, the division) add γ_(n+4)·X, and its normaliser's (Σ of n + 1
//     positive weights) γ_(n+1)·X: tol = X·(4ρ/(1 − ρ) + 2·γ_(n+4) + 2·γ_(n+1)).
//   lse = M + log(w_q + l): δ + ρ/(1 − ρ) + 2·γ_(n+1), plus the log's and the sum's rounding: 4u·(|M| + |log|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/kernel_table.h"
#include "support/test_support.h"

namespace cider {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kU = 0x1p-24;
double gamma(double k) { return k * kU / (1.0 - k * kU); }

uint16_t to_bf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct Case {
  int64_t B, Hq, Hkv, L, kL, Dk, Dv, block, lo, sink, sink_rows, xlo, vwin;
  kernels::MaskKind mask;
  int64_t window;
  float softcap;
  std::string describe() const {
    std::ostringstream s;
    s << "B" << B << " Hq" << Hq << " Hkv" << Hkv << " L" << L << " kL" << kL << " Dk" << Dk << " Dv" << Dv << " block"
      << block << " lo" << lo << " sink" << sink << " xlo" << xlo << " vwin" << vwin << " mask" << static_cast<int>(mask)
      << " window" << window << " cap" << softcap;
    return s.str();
  }
};

// The inputs of one case, and the arguments over them (out / lse filled per run).
struct Data {
  Case c;
  std::vector<float> q, o_in, lse_in, mask_add;
  std::vector<uint8_t> mask_bool;
  std::vector<uint16_t> keys, values, values_exact, sink_keys, sink_values;
  float scale = 0;

  Data(const Case& cs, std::mt19937_64& rng) : c(cs) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    const int64_t n = c.kL - c.lo;
    std::vector<float> outlier(static_cast<size_t>(c.Dk), 1.0f);  // a few large key channels, as Gemma's
    for (int k = 0; k < 3; ++k) outlier[rng() % c.Dk] = 30.0f;
    auto rows = [&](std::vector<uint16_t>& v, int64_t count, int64_t D, bool key) {
      v.resize(static_cast<size_t>(count * D));
      for (size_t x = 0; x < v.size(); ++x) v[x] = to_bf16(nd(rng) * (key ? outlier[x % D] : 2.0f));
    };
    rows(keys, c.B * c.Hkv * n, c.Dk, true);
    rows(values, c.B * c.Hkv * n, c.Dv, false);
    rows(values_exact, c.B * c.Hkv * n, c.Dv, false);
    rows(sink_keys, c.B * c.Hkv * c.sink_rows, c.Dk, true);
    rows(sink_values, c.B * c.Hkv * c.sink_rows, c.Dv, false);
    q.resize(static_cast<size_t>(c.B * c.Hq * c.L * c.Dk));
    for (float& x : q) x = nd(rng);
    o_in.resize(static_cast<size_t>(c.B * c.Hq * c.L * c.Dv));
    for (float& x : o_in) x = 3.0f * ud(rng);
    lse_in.resize(static_cast<size_t>(c.B * c.Hq * c.L));
    for (float& x : lse_in) x = rng() % 4 == 0 ? kNegInf : 20.0f * ud(rng);
    const size_t mcount = static_cast<size_t>(c.B * c.Hq * c.L * c.kL);
    mask_bool.resize(mcount);
    mask_add.resize(mcount);
    for (size_t x = 0; x < mcount; ++x) {
      mask_bool[x] = rng() % 3 != 0;
      mask_add[x] = rng() % 5 == 0 ? kNegInf : 2.0f * ud(rng);
    }
    scale = 1.0f / std::sqrt(static_cast<float>(c.Dk));
  }

  kernels::RecentBlockArgs args(std::vector<float>& out, std::vector<float>& lse) const {
    kernels::RecentBlockArgs a{};
    a.q = q.data();
    a.out = out.data();
    a.lse = lse.data();
    a.B = c.B;
    a.Hq = c.Hq;
    a.Hkv = c.Hkv;
    a.L = c.L;
    a.kL = c.kL;
    a.Dk = c.Dk;
    a.Dv = c.Dv;
    a.scale = scale;
    a.softcap = c.softcap;
    a.mask_kind = c.mask;
    a.window = c.window;
    if (c.mask == kernels::MaskKind::kBool) {
      a.mask = mask_bool.data();
      a.mask_dtype = DType::kBool;
    } else if (c.mask == kernels::MaskKind::kAdditive) {
      a.mask = mask_add.data();
      a.mask_dtype = DType::kF32;
    }
    if (a.mask) {
      a.mask_stride[0] = c.Hq * c.L * c.kL;
      a.mask_stride[1] = c.L * c.kL;
      a.mask_stride[2] = c.kL;
      a.mask_stride[3] = 1;
    }
    a.keys = keys.data();
    a.values = values.data();
    a.values_exact = values_exact.data();
    a.lo = c.lo;
    a.n = c.kL - c.lo;
    a.block = c.block;
    a.xlo = c.xlo;
    a.vwin = c.vwin;
    a.sink_keys = sink_keys.data();
    a.sink_values = sink_values.data();
    a.sink = c.sink;
    a.sink_rows = c.sink_rows;
    a.row_begin = 0;
    a.row_end = c.B * c.Hq;
    return a;
  }

  // Per query row: the output bound and the lse bound of the header, from the row's visible keys (as the kernels
  // choose them: the causal range and the recent block's rule; masked keys of a bool/additive mask counted too).
  void bounds(int64_t row, int64_t i, const std::vector<float>& lse_ref, double& tol_o, double& tol_lse) const {
    const int64_t b = row / c.Hq, h = row % c.Hq, bh = b * c.Hkv + h / (c.Hq / c.Hkv), n = c.kL - c.lo;
    const int64_t t = c.kL - c.L + i, e = kernels::recent_block_start(t, c.block, c.lo);
    int64_t plo = 0, phi = c.kL;
    if (c.mask == kernels::MaskKind::kCausal) {
      phi = t + 1;
      if (c.window > 0) plo = std::max<int64_t>(0, t - c.window + 1);
    }
    const float* qr = q.data() + (row * c.L + i) * c.Dk;
    double delta = 0, smax = -1e300, smin = 1e300, X = 0;
    int64_t count = 0;
    const float* orow = o_in.data() + (row * c.L + i) * c.Dv;
    for (int64_t d = 0; d < c.Dv; ++d) X = std::max(X, std::fabs(static_cast<double>(orow[d])));
    auto visit = [&](const uint16_t* k, const uint16_t* v0, const uint16_t* v1) {
      double s = 0, sa = 0;
      for (int64_t d = 0; d < c.Dk; ++d) {
        const double p = static_cast<double>(qr[d]) * from_bf16(k[d]);
        s += p;
        sa += std::fabs(p);
      }
      s *= scale;
      if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
      delta = std::max(delta, 2 * gamma(static_cast<double>(c.Dk)) * scale * sa + 4 * kU * std::fabs(s) +
                                  8 * kU * c.softcap);
      smax = std::max(smax, s);
      smin = std::min(smin, s);
      for (int64_t d = 0; d < c.Dv; ++d) {
        X = std::max(X, std::fabs(static_cast<double>(from_bf16(v0[d]))));
        X = std::max(X, std::fabs(static_cast<double>(from_bf16(v1[d]))));
      }
      ++count;
    };
    for (int64_t j = std::max<int64_t>(0, plo); j < std::min({c.sink, e, phi}); ++j) {
      const uint16_t* sv = sink_values.data() + (bh * c.sink_rows + j) * c.Dv;
      visit(sink_keys.data() + (bh * c.sink_rows + j) * c.Dk, sv, sv);
    }
    for (int64_t p = std::max(e, plo); p < std::min(c.kL, phi); ++p) {
      const int64_t r = bh * n + (p - c.lo);
      visit(keys.data() + r * c.Dk, values.data() + r * c.Dv, values_exact.data() + r * c.Dv);
    }
    if (c.mask == kernels::MaskKind::kAdditive) {  // scores moved by at most the mask's 2 (−inf: dropped)
      smax += 2;
      smin -= 2;
    }
    const double lq = lse_in[static_cast<size_t>(row * c.L + i)];
    const double M = std::isinf(lq) ? smax : std::max(smax, lq);
    double spread = M - smin;  // the largest |s_j − M| (and |lse − M|)
    if (!std::isinf(lq)) spread = std::max(spread, M - lq);
    const double rho = std::expm1(2 * delta + 2 * kU * std::min(spread, 200.0) + 2 * kU);
    const double nn = static_cast<double>(count);
    tol_o = X * (4 * rho / (1 - rho) + 2 * gamma(nn + 4) + 2 * gamma(nn + 1));
    const double lr = lse_ref[static_cast<size_t>(row * c.L + i)];
    tol_lse = delta + rho / (1 - rho) + 2 * gamma(nn + 1) + 4 * kU * (std::fabs(M) + std::fabs(lr - M)) + 1e-30;
  }
};

Case random_case(std::mt19937_64& rng) {
  const int64_t dims[] = {256, 128, 64, 80, 40, 100, 24, 12, 200, 72};
  const int64_t gqa[][2] = {{4, 1}, {8, 2}, {2, 2}, {3, 1}};
  Case c{};
  c.B = 1 + rng() % 2;
  const auto& g = gqa[rng() % 4];
  c.Hq = g[0];
  c.Hkv = g[1];
  c.Dk = dims[rng() % 10];
  c.Dv = rng() % 2 ? c.Dk : dims[rng() % 10];
  const int64_t blocks[] = {16, 32, 64};
  c.block = blocks[rng() % 3];
  const int64_t lens[] = {1, 1, 5, 40, 70};
  c.L = lens[rng() % 5];
  c.sink = rng() % 3 == 0 ? 0 : 1 + rng() % 4;
  c.sink_rows = c.sink + rng() % 3;
  c.kL = std::max<int64_t>(c.L + c.sink, 1 + static_cast<int64_t>(rng() % 300));
  const int64_t first = c.kL - c.L;  // the first query's position; the stage starts at or before it, after the sink
  c.lo = c.sink + static_cast<int64_t>(rng() % static_cast<uint32_t>(first - c.sink + 1));
  c.lo = std::min(c.lo, std::max(c.sink, first / c.block * c.block));
  c.xlo = c.lo + static_cast<int64_t>(rng() % static_cast<uint32_t>(c.kL - c.lo + 1));
  c.vwin = rng() % 2 ? c.block : 16;
  const int kind = static_cast<int>(rng() % 4);
  c.mask = kind == 0 ? kernels::MaskKind::kNone : kernels::MaskKind::kCausal;
  c.window = kind == 2 ? 1 + static_cast<int64_t>(rng() % 100) : 0;
  c.softcap = kind == 3 ? 50.0f : 0.0f;
  return c;
}

TEST(RecentBlock, EveryLevelMatchesReference) {
  auto rng = test::make_rng(__LINE__);
  int64_t compared = 0;
  for (int iter = 0; iter < 120; ++iter) {
    const Case c = random_case(rng);
    SCOPED_TRACE(c.describe());
    const Data data(c, rng);
    std::vector<float> o_ref = data.o_in, lse_ref = data.lse_in;
    kernels::ref_kernels().recent_block(data.args(o_ref, lse_ref));
    for (IsaLevel level : supported_isas()) {
      if (level == IsaLevel::kRef) continue;
      SCOPED_TRACE(isa_name(level));
      std::vector<float> o = data.o_in, lse = data.lse_in;
      kernels::kernels_for_isa(level).recent_block(data.args(o, lse));
      for (int64_t row = 0; row < c.B * c.Hq; ++row)
        for (int64_t i = 0; i < c.L; ++i) {
          double tol_o = 0, tol_lse = 0;
          data.bounds(row, i, lse_ref, tol_o, tol_lse);
          const size_t r = static_cast<size_t>(row * c.L + i);
          if (std::isinf(lse_ref[r])) {
            ASSERT_EQ(lse[r], lse_ref[r]) << "row " << row << " i " << i;
          } else {
            ASSERT_TRUE(std::isfinite(lse[r])) << "row " << row << " i " << i << ": " << lse[r];
            ASSERT_LE(std::fabs(static_cast<double>(lse[r]) - lse_ref[r]), tol_lse) << "lse row " << row << " i " << i;
          }
          for (int64_t d = 0; d < c.Dv; ++d) {
            const size_t x = r * static_cast<size_t>(c.Dv) + static_cast<size_t>(d);
            ASSERT_TRUE(std::isfinite(o[x])) << "row " << row << " i " << i << " d " << d << ": " << o[x];
            ASSERT_LE(std::fabs(static_cast<double>(o[x]) - o_ref[x]), tol_o)
                << "row " << row << " i " << i << " d " << d << ": " << o[x] << " vs " << o_ref[x];
            ++compared;
          }
        }
    }
  }
  if (supported_isas().size() > 1) {
    EXPECT_GT(compared, 0);
  }
}

// The reference against float64 on its own inputs: the merged output and lse from the same visible keys, recomputed
// in double (the bound of the header with the reference's side only, doubled for margin).
TEST(RecentBlock, ReferenceMatchesFloat64) {
  auto rng = test::make_rng(__LINE__);
  for (int iter = 0; iter < 40; ++iter) {
    Case c = random_case(rng);
    c.softcap = 0.0f;
    SCOPED_TRACE(c.describe());
    const Data data(c, rng);
    std::vector<float> o = data.o_in, lse = data.lse_in;
    kernels::ref_kernels().recent_block(data.args(o, lse));
    const int64_t n = c.kL - c.lo;
    for (int64_t row = 0; row < c.B * c.Hq; ++row) {
      const int64_t b = row / c.Hq, h = row % c.Hq, bh = b * c.Hkv + h / (c.Hq / c.Hkv);
      for (int64_t i = 0; i < c.L; ++i) {
        const int64_t t = c.kL - c.L + i, e = kernels::recent_block_start(t, c.block, c.lo);
        const int64_t w = std::max(t / c.vwin * c.vwin, c.xlo);
        int64_t plo = 0, phi = c.kL;
        if (c.mask == kernels::MaskKind::kCausal) {
          phi = t + 1;
          if (c.window > 0) plo = std::max<int64_t>(0, t - c.window + 1);
        }
        std::vector<double> s;
        std::vector<const uint16_t*> vr;
        const float* qr = data.q.data() + (row * c.L + i) * c.Dk;
        auto score = [&](const uint16_t* k) {
          double x = 0;
          for (int64_t d = 0; d < c.Dk; ++d) x += static_cast<double>(qr[d]) * from_bf16(k[d]);
          return x * data.scale;
        };
        for (int64_t j = std::max<int64_t>(0, plo); j < std::min({c.sink, e, phi}); ++j) {
          s.push_back(score(data.sink_keys.data() + (bh * c.sink_rows + j) * c.Dk));
          vr.push_back(data.sink_values.data() + (bh * c.sink_rows + j) * c.Dv);
        }
        for (int64_t p = std::max(e, plo); p < std::min(c.kL, phi); ++p) {
          const int64_t r = bh * n + (p - c.lo);
          s.push_back(score(data.keys.data() + r * c.Dk));
          vr.push_back((p >= w ? data.values_exact.data() : data.values.data()) + r * c.Dv);
        }
        const size_t r = static_cast<size_t>(row * c.L + i);
        const double lq = data.lse_in[r];
        double M = lq;
        for (double x : s) M = std::max(M, x);
        if (std::isinf(M)) {
          ASSERT_EQ(lse[r], kNegInf);
          continue;
        }
        const double wq = std::isinf(lq) ? 0.0 : std::exp(lq - M);
        double l = wq;
        for (double x : s) l += std::exp(x - M);
        double tol_o = 0, tol_lse = 0;
        data.bounds(row, i, lse, tol_o, tol_lse);
        EXPECT_NEAR(lse[r], M + std::log(l), 2 * tol_lse) << "row " << row << " i " << i;
        for (int64_t d = 0; d < c.Dv; ++d) {
          double acc = wq * data.o_in[r * static_cast<size_t>(c.Dv) + static_cast<size_t>(d)];
          for (size_t j = 0; j < s.size(); ++j) acc += std::exp(s[j] - M) * from_bf16(vr[j][d]);
          ASSERT_NEAR(o[r * static_cast<size_t>(c.Dv) + static_cast<size_t>(d)], acc / l, 2 * tol_o)
              << "row " << row << " i " << i << " d " << d;
        }
      }
    }
  }
}

// Bool and additive masks: the fast levels hand them to the reference — bit-identical results.
TEST(RecentBlock, MaskTensorsAsTheReference) {
  auto rng = test::make_rng(__LINE__);
  for (int iter = 0; iter < 20; ++iter) {
    Case c = random_case(rng);
    c.mask = iter % 2 ? kernels::MaskKind::kBool : kernels::MaskKind::kAdditive;
    c.window = 0;
    SCOPED_TRACE(c.describe());
    const Data data(c, rng);
    std::vector<float> o_ref = data.o_in, lse_ref = data.lse_in;
    kernels::ref_kernels().recent_block(data.args(o_ref, lse_ref));
    for (IsaLevel level : supported_isas()) {
      std::vector<float> o = data.o_in, lse = data.lse_in;
      kernels::kernels_for_isa(level).recent_block(data.args(o, lse));
      ASSERT_EQ(0, std::memcmp(o.data(), o_ref.data(), o.size() * sizeof(float))) << isa_name(level);
      ASSERT_EQ(0, std::memcmp(lse.data(), lse_ref.data(), lse.size() * sizeof(float))) << isa_name(level);
    }
  }
}

}  // namespace
}  // namespace cider
