// tests/support/gated_delta_ref.h — the float64 reference of the gated delta rule (nn/gated_delta.h) with its
// rounding bound, shared by the CPU kernel tests (tests/test_gated_delta.cpp: every ISA level's kernel table) and the
// CUDA ones (tests/cuda/test_cuda_gated_delta.cpp).
//
// The bound: per value column j the state evolves as s ← A_t s + β v_j k with A_t = e^g (I − β k kᵀ), ‖A_t‖₂ ≤ e^g
// (0 < β < 1, ‖k‖ = 1), so the error a step adds is at most (2·Dk + 20)·u·(‖s_{t−1}‖ + ‖s_t‖ + |v_j|) (the decay's exp
// and product, the dot Sᵀk, δ, the update's FMA, k's own l2norm rounding), and A_t shrinks what earlier steps left by
// e^g: the column's error is at most E_t = e^{g_t}·E_{t−1} + that step's term, the output's at most ‖q‖·(E_t + the
// dot's (2·Dk + 20)·u·‖s_t‖). Tests allow twice that.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace cider::test::gdn {

inline constexpr double kU = 1.0 / 16777216.0;  // 2⁻²⁴: float32 unit roundoff

inline size_t sz(int64_t n) { return static_cast<size_t>(n); }
inline double dbl(int64_t n) { return static_cast<double>(n); }

// |got[i] − want[i]| ≤ tol[i] for every i (NaN fails).
inline ::testing::AssertionResult within(const std::vector<float>& got, const std::vector<double>& want,
                                  const std::vector<double>& tol, const char* what) {
  if (got.size() != want.size() || got.size() != tol.size())
    return ::testing::AssertionFailure() << what << ": sizes " << got.size() << " / " << want.size() << " / "
                                         << tol.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(got[i]) || !(err <= tol[i]))
      return ::testing::AssertionFailure() << what << " element " << i << ": got " << got[i] << ", want " << want[i]
                                           << " (error " << err << " > tolerance " << tol[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

// One gated DeltaNet problem: rows of [q (Hk·Dk) | k (Hk·Dk) | v (Hv·Dv) | padding] (raw q and k: the l2norm is
// part of the computation), g (n, Hv) ≤ 0, beta (n, Hv) in (0, 1), the state before the first token.
struct DeltaCase {
  int64_t Hk, Hv, Dk, Dv, n, stride;
  std::vector<float> rows, g, beta, S0;
};

inline DeltaCase make_delta_case(std::mt19937_64& rng, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, int64_t n) {
  DeltaCase d{Hk, Hv, Dk, Dv, n, 2 * Hk * Dk + Hv * Dv + 3, {}, {}, {}, {}};
  d.rows = test::randn(rng, sz(n * d.stride));
  const std::vector<float> u = test::uniform(rng, sz(n * Hv), 0.0f, 1.0f);
  d.g.resize(u.size());
  for (size_t i = 0; i < u.size(); ++i) d.g[i] = -3.0f * u[i] * u[i] * u[i];  // decays from e⁻³ to ≈ 1
  d.beta = test::uniform(rng, sz(n * Hv), 0.02f, 0.98f);
  d.S0 = test::randn(rng, sz(Hv * Dk * Dv), 0.3f);  // mid-sequence: a state already there
  return d;
}

// llama.cpp's tiled value-head order (LinearAttention::v_tiled): the checkpoints' value head g = i·r + j (key head i,
// r = Hv / Hk) sits at j·Hk + i.
inline int64_t tiled_head(const DeltaCase& d, int64_t g) {
  const int64_t r = d.Hv / d.Hk;
  return (g % r) * d.Hk + g / r;
}
// The case with its value heads (v, g, β, the state) moved to their tiled places; q and k unchanged.
inline DeltaCase tiled_case(const DeltaCase& d) {
  DeltaCase t = d;
  const int64_t v0 = 2 * d.Hk * d.Dk, S = d.Dk * d.Dv;
  for (int64_t g = 0; g < d.Hv; ++g) {
    const int64_t p = tiled_head(d, g);
    for (int64_t tok = 0; tok < d.n; ++tok) {
      for (int64_t e = 0; e < d.Dv; ++e)
        t.rows[sz(tok * d.stride + v0 + p * d.Dv + e)] = d.rows[sz(tok * d.stride + v0 + g * d.Dv + e)];
      t.g[sz(tok * d.Hv + p)] = d.g[sz(tok * d.Hv + g)];
      t.beta[sz(tok * d.Hv + p)] = d.beta[sz(tok * d.Hv + g)];
    }
    for (int64_t e = 0; e < S; ++e) t.S0[sz(p * S + e)] = d.S0[sz(g * S + e)];
  }
  return t;
}

// The float64 reference of nn::gated_delta_rule (l2norm with eps 1e-6 inside the root, q × q_scale, the float32
// value the kernels are given), with the bound of the file comment per output and per final state element.
struct DeltaRef {
  std::vector<double> out, out_tol, S, S_tol;
};
inline DeltaRef delta_ref(const DeltaCase& d, float q_scale) {
  const int64_t Hk = d.Hk, Hv = d.Hv, Dk = d.Dk, Dv = d.Dv, n = d.n, r = Hv / Hk;
  const double c = dbl(2 * Dk + 20) * kU;
  DeltaRef ref;
  ref.out.resize(sz(n * Hv * Dv));
  ref.out_tol.resize(ref.out.size());
  ref.S.resize(sz(Hv * Dk * Dv));
  ref.S_tol.resize(ref.S.size());
  std::vector<double> q(sz(Dk)), k(sz(Dk)), S(sz(Dk * Dv)), E(sz(Dv)), prev(sz(Dv));
  auto l2 = [&](const float* x, double scale, std::vector<double>& out) {
    double ss = 0.0;
    for (int64_t i = 0; i < Dk; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss + 1e-6);
    for (int64_t i = 0; i < Dk; ++i) out[sz(i)] = x[i] * inv * scale;
  };
  auto col_norm = [&](int64_t j) {
    double s = 0.0;
    for (int64_t i = 0; i < Dk; ++i) s += S[sz(i * Dv + j)] * S[sz(i * Dv + j)];
    return std::sqrt(s);
  };
  for (int64_t h = 0; h < Hv; ++h) {
    const int64_t kh = h / r;
    for (size_t i = 0; i < S.size(); ++i) S[i] = d.S0[sz(h * Dk * Dv) + i];
    std::fill(E.begin(), E.end(), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      const float* row = d.rows.data() + t * d.stride;
      l2(row + kh * Dk, static_cast<double>(q_scale), q);
      l2(row + Hk * Dk + kh * Dk, 1.0, k);
      double qn = 0.0;
      for (double v : q) qn += v * v;
      qn = std::sqrt(qn);
      const double decay = std::exp(static_cast<double>(d.g[sz(t * Hv + h)]));
      const double beta = d.beta[sz(t * Hv + h)];
      for (int64_t j = 0; j < Dv; ++j) prev[sz(j)] = col_norm(j);
      for (int64_t j = 0; j < Dv; ++j) {
        const double v = row[2 * Hk * Dk + h * Dv + j];
        double kv = 0.0;
        for (int64_t i = 0; i < Dk; ++i) {
          S[sz(i * Dv + j)] *= decay;
          kv += S[sz(i * Dv + j)] * k[sz(i)];
        }
        const double delta = (v - kv) * beta;
        double o = 0.0;
        for (int64_t i = 0; i < Dk; ++i) {
          S[sz(i * Dv + j)] += k[sz(i)] * delta;
          o += S[sz(i * Dv + j)] * q[sz(i)];
        }
        const double now = col_norm(j);
        E[sz(j)] = decay * E[sz(j)] + c * (prev[sz(j)] + now + std::abs(v));
        const size_t at = sz(t * Hv * Dv + h * Dv + j);
        ref.out[at] = o;
        ref.out_tol[at] = 2.0 * qn * (E[sz(j)] + c * now) + 1e-30;
      }
    }
    for (int64_t i = 0; i < Dk; ++i)
      for (int64_t j = 0; j < Dv; ++j) {
        ref.S[sz(h * Dk * Dv + i * Dv + j)] = S[sz(i * Dv + j)];
        ref.S_tol[sz(h * Dk * Dv + i * Dv + j)] = 2.0 * E[sz(j)] + 1e-30;
      }
  }
  return ref;
}

inline float q_scale_of(int64_t Dk) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dk))); }

struct Shape {
  int64_t Hk, Hv, Dk, Dv;
};
inline const Shape kShapes[] = {{1, 2, 16, 16}, {2, 4, 16, 32}, {1, 2, 128, 128}, {2, 4, 128, 32}, {2, 2, 16, 128},
                         {1, 3, 128, 16}};

inline std::string shape_name(const Shape& s, int64_t n) {
  return "Hk " + std::to_string(s.Hk) + " Hv " + std::to_string(s.Hv) + " Dk " + std::to_string(s.Dk) + " Dv " +
         std::to_string(s.Dv) + " n " + std::to_string(n);
}


}  // namespace cider::test::gdn
