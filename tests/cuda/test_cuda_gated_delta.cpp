// The hybrid models' kernels (kernels/cuda/gated_delta.h, and prepare_heads' gate heads) against float64 references
// written here, on fresh random inputs ($CIDER_TEST_SEED replays a run), in shapes with tails (head dims 16 and 128,
// value heads of 16/32/100/128, 1–2 key heads serving 1–4 value heads, 1, 7 and 300 tokens, conv kernels of 1, 2
// and 4 taps). Every output element is compared against a bound derived from float32 rounding (u = 2⁻²⁴; NaN never
// passes); outputs are poisoned (0xFF bytes = NaN) before each launch and guard regions on both sides are checked.
//
// The recurrence's bound (delta_ref below): per state column j (the columns evolve independently:
// s ← A_t s + β v_j k with A_t = e^g (I − β k kᵀ), ‖A_t‖₂ ≤ e^g since 0 < β < 1 and ‖k‖ = 1), the error a step adds is
// at most (2·Dk + 20)·u·(‖s_{t−1}‖ + ‖s_t‖ + |v_j|) (the decay's exp and product, the dot Sᵀk, δ, the update's FMA,
// and k's own l2norm rounding), and A_t shrinks what earlier steps left by e^g at least: the column's error is at most
// E_t = e^{g_t}·E_{t−1} + that step's term, the output's at most ‖q‖·(E_t + the dot's (2·Dk + 20)·u·‖s_t‖). The
// test allows twice that (the CPU's float32 kernels use under 1 % of it).
// GatedDeltaReference.TheBoundsHoldForTheCpuKernels checks the same bounds on the CPU's float32 kernels
// (nn/gated_delta.h), without a GPU: the bounds are not tuned to the GPU's results.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/model_ops.h"
#include "nn/gated_delta.h"
#include "support/gated_delta_ref.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace {

using test::gdn::DeltaCase;
using test::gdn::DeltaRef;
using test::gdn::delta_ref;
using test::gdn::kShapes;
using test::gdn::make_delta_case;
using test::gdn::q_scale_of;
using test::gdn::Shape;
using test::gdn::shape_name;
using test::gdn::tiled_case;
using test::gdn::tiled_head;
using test::gdn::within;

using test::gdn::dbl;
using test::gdn::kU;
using test::gdn::sz;

// A device float array of n elements with 64 floats of 0xFF bytes on both sides (data() keeps 256-byte alignment).
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  explicit Guarded(size_t n) : n_(n), buf_((n + 2 * kGuard) * sizeof(float)) { buf_.fill(0xFF); }
  float* data() const { return buf_.as<float>() + kGuard; }
  void upload(const std::vector<float>& v) {
    ASSERT_EQ(v.size(), n_);
    buf_.upload(v.data(), n_ * sizeof(float), kGuard * sizeof(float));
  }
  std::vector<float> download() const {
    std::vector<float> v(n_);
    buf_.download(v.data(), n_ * sizeof(float), kGuard * sizeof(float));
    return v;
  }
  ::testing::AssertionResult guards_intact() const {
    std::vector<uint8_t> all(buf_.bytes());
    buf_.download(all.data(), all.size());
    const size_t lo = kGuard * sizeof(float), hi = (kGuard + n_) * sizeof(float);
    for (size_t i = 0; i < all.size(); ++i)
      if ((i < lo || i >= hi) && all[i] != 0xFF)
        return ::testing::AssertionFailure() << "guard byte " << (i < lo ? "before" : "after") << " the data written";
    return ::testing::AssertionSuccess();
  }

 private:
  size_t n_;
  DeviceBuffer buf_;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

template <typename Fn>
void expect_error(Fn&& fn, const char* op, ErrorCode code, const char* fragment = "") {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one from " << op;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

struct StreamExec {
  Stream stream;
  void* s() const { return stream.handle(); }
};

double silu64(double z) { return z / (1.0 + std::exp(-z)); }
double sigmoid64(double z) { return 1.0 / (1.0 + std::exp(-z)); }

// ---- the references, in float64 (shared by the GPU tests and the CPU-kernel check) ---------------------------------

// nn::causal_conv1d_silu's semantics: out (n, C), the new state ((K − 1, C), exact copies), and the bound
// 1.1·(K + 1)·u·Σ|w·x| (the float32 sum; silu' ∈ [−0.1, 1.1]) + 8u·|out| (silu's own evaluation) + 1e-37.
struct ConvRef {
  std::vector<double> out, tol;
  std::vector<float> state;
};
ConvRef conv_ref(const std::vector<float>& x, int64_t x_stride, int64_t n, int64_t C, const std::vector<float>& w,
                 int64_t K, const std::vector<float>& state0) {
  ConvRef r;
  auto win = [&](int64_t row, int64_t c) {  // window row: state rows, then x rows
    return row < K - 1 ? state0[sz(row * C + c)] : x[sz((row - (K - 1)) * x_stride + c)];
  };
  r.out.resize(sz(n * C));
  r.tol.resize(sz(n * C));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0, mag = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        const double p = static_cast<double>(w[sz(c * K + j)]) * win(t + j, c);
        acc += p;
        mag += std::abs(p);
      }
      const double o = silu64(acc);
      r.out[sz(t * C + c)] = o;
      r.tol[sz(t * C + c)] = 1.1 * dbl(K + 1) * kU * mag + 8.0 * kU * std::abs(o) + 1e-37;
    }
  r.state.resize(sz((K - 1) * C));
  for (int64_t i = 0; i < K - 1; ++i)
    for (int64_t c = 0; c < C; ++c) r.state[sz(i * C + c)] = win(n + i, c);
  return r;
}

// ---- the bounds on the CPU's float32 kernels (no GPU needed) -------------------------------------------------------

// nn::causal_conv1d_silu and nn::gated_delta_rule, the CPU path the GPU must match, meet the bounds the GPU is held
// to: a check of the references and bounds themselves.
TEST(GatedDeltaReference, TheBoundsHoldForTheCpuKernels) {
  auto rng = test::make_rng(400);
  for (const Shape& s : kShapes)
    for (int64_t n : {1, 7, 300}) {
      SCOPED_TRACE(shape_name(s, n));
      const DeltaCase d = make_delta_case(rng, s.Hk, s.Hv, s.Dk, s.Dv, n);
      const DeltaRef ref = delta_ref(d, q_scale_of(s.Dk));
      std::vector<float> state = d.S0, out(sz(n * s.Hv * s.Dv), std::nanf(""));
      nn::GatedDeltaArgs a;
      a.n = n;
      a.Hk = s.Hk;
      a.Hv = s.Hv;
      a.Dk = s.Dk;
      a.Dv = s.Dv;
      a.q = d.rows.data();
      a.k = d.rows.data() + s.Hk * s.Dk;
      a.v = d.rows.data() + 2 * s.Hk * s.Dk;
      a.row_stride = d.stride;
      a.g = d.g.data();
      a.beta = d.beta.data();
      a.state = state.data();
      a.out = out.data();
      nn::gated_delta_rule(a);
      EXPECT_TRUE(within(out, ref.out, ref.out_tol, "out"));
      EXPECT_TRUE(within(state, ref.S, ref.S_tol, "state"));
    }
  for (int64_t K : {1, 2, 4})
    for (int64_t n : {1, 7, 300}) {
      const int64_t C = 37, stride = C + 13;
      const std::vector<float> x = test::randn(rng, sz(n * stride)), w = test::randn(rng, sz(C * K), 0.5f);
      std::vector<float> state = test::randn(rng, sz((K - 1) * C)), out(sz(n * C));
      const ConvRef ref = conv_ref(x, stride, n, C, w, K, state);
      nn::causal_conv1d_silu(x.data(), stride, n, C, w.data(), K, state.data(), out.data());
      EXPECT_TRUE(within(out, ref.out, ref.tol, "conv out"));
      EXPECT_TRUE(same_bits(state, ref.state));
    }
}

// ---- gdn_gates ---------------------------------------------------------------------------------------------------

TEST(CudaGatedDelta, GatesMatchFloat64) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(401);
  StreamExec se;
  for (int64_t H : {64, 100, 2048})
    for (int64_t Hv : {1, 3, 32})
      for (int64_t n : {1, 7, 300}) {
        SCOPED_TRACE("H " + std::to_string(H) + " Hv " + std::to_string(Hv) + " n " + std::to_string(n));
        const float ws = static_cast<float>(1.0 / std::sqrt(dbl(H)));
        const std::vector<float> x = test::randn(rng, sz(n * H)), wb = test::randn(rng, sz(Hv * H), ws),
                                 wa = test::randn(rng, sz(Hv * H), 2.0f * ws),
                                 A_log = test::uniform(rng, sz(Hv), -2.0f, 1.0f);
        std::vector<float> dt = test::randn(rng, sz(Hv));
        dt[0] = 25.0f;                // softplus' linear branch (a + dt_bias > 20)
        if (Hv > 1) dt[1] = -30.0f;   // log1p of a tiny exp
        Guarded d_x(x.size()), d_wb(wb.size()), d_wa(wa.size()), d_A(A_log.size()), d_dt(dt.size()),
            d_beta(sz(n * Hv)), d_g(sz(n * Hv));
        d_x.upload(x);
        d_wb.upload(wb);
        d_wa.upload(wa);
        d_A.upload(A_log);
        d_dt.upload(dt);
        gdn_gates(d_x.data(), n, H, d_wb.data(), d_wa.data(), d_A.data(), d_dt.data(), Hv, d_beta.data(), d_g.data(),
                  se.s());
        se.stream.synchronize();
        std::vector<double> beta(sz(n * Hv)), beta_tol(beta.size()), g(beta.size()), g_tol(beta.size());
        for (int64_t t = 0; t < n; ++t)
          for (int64_t h = 0; h < Hv; ++h) {
            double sb = 0, mb = 0, sa = 0, ma = 0;
            for (int64_t i = 0; i < H; ++i) {
              const double xi = x[sz(t * H + i)];
              sb += xi * wb[sz(h * H + i)];
              mb += std::abs(xi * wb[sz(h * H + i)]);
              sa += xi * wa[sz(h * H + i)];
              ma += std::abs(xi * wa[sz(h * H + i)]);
            }
            const size_t at = sz(t * Hv + h);
            // Sums: ≤ (H + 2)·u·Σ|x·w| in any order; sigmoid' ≤ 1/4, softplus' ≤ 1; exp, log1p, the divisions and
            // products: a few ulps of the result.
            beta[at] = sigmoid64(sb);
            beta_tol[at] = 0.25 * dbl(H + 2) * kU * mb + 8.0 * kU * beta[at] + 1e-38;
            const double y = sa + dt[sz(h)], sp = y > 20.0 ? y : std::log1p(std::exp(y));
            const double ea = std::exp(static_cast<double>(A_log[sz(h)]));
            g[at] = -ea * sp;
            g_tol[at] = ea * (dbl(H + 2) * kU * ma + 2.0 * kU * std::abs(y)) + 10.0 * kU * std::abs(g[at]) + 1e-38;
          }
        EXPECT_TRUE(within(d_beta.download(), beta, beta_tol, "beta"));
        EXPECT_TRUE(within(d_g.download(), g, g_tol, "g"));
        EXPECT_TRUE(d_beta.guards_intact());
        EXPECT_TRUE(d_g.guards_intact());
      }
}

// ---- causal_conv1d_silu --------------------------------------------------------------------------------------------

// The conv over n rows given in pieces (1, 2, then the rest: pieces shorter than the window's K − 1 rows shift the
// state through itself) against one float64 pass over the whole window; the final state bit for bit; the padding of
// the input rows is never read into the output, the gaps between output rows never written.
TEST(CudaGatedDelta, ConvMatchesFloat64AndCarriesItsWindow) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(402);
  StreamExec se;
  for (int64_t C : {1, 37, 128, 1000})
    for (int64_t K : {1, 2, 4})
      for (int64_t n : {1, 7, 300}) {
        SCOPED_TRACE("C " + std::to_string(C) + " K " + std::to_string(K) + " n " + std::to_string(n));
        const int64_t x_stride = C + 13, out_stride = C == 37 ? C + 3 : C;
        const std::vector<float> x = test::randn(rng, sz(n * x_stride)), w = test::randn(rng, sz(C * K), 0.5f),
                                 state0 = test::randn(rng, sz((K - 1) * C));
        Guarded d_x(x.size()), d_w(w.size()), d_state(state0.size()), d_out(sz(n * out_stride));
        d_x.upload(x);
        d_w.upload(w);
        d_state.upload(state0);
        std::vector<int64_t> pieces;
        for (int64_t done = 0, p = 1; done < n; done += pieces.back(), p = p == 1 ? 2 : n)
          pieces.push_back(std::min(p, n - done));
        int64_t t0 = 0;
        for (int64_t p : pieces) {
          causal_conv1d_silu(d_x.data() + t0 * x_stride, x_stride, p, C, d_w.data(), K, d_state.data(),
                             d_out.data() + t0 * out_stride, out_stride, se.s());
          t0 += p;
        }
        se.stream.synchronize();
        const ConvRef ref = conv_ref(x, x_stride, n, C, w, K, state0);
        const std::vector<float> all = d_out.download();
        std::vector<float> got(sz(n * C));
        for (int64_t t = 0; t < n; ++t)
          for (int64_t c = 0; c < out_stride; ++c) {
            const float v = all[sz(t * out_stride + c)];
            if (c < C) {
              got[sz(t * C + c)] = v;
            } else {
              uint32_t bits = 0;
              std::memcpy(&bits, &v, 4);
              EXPECT_EQ(bits, 0xFFFFFFFFu) << "the gap after row " << t << " was written";
            }
          }
        EXPECT_TRUE(within(got, ref.out, ref.tol, "conv out"));
        EXPECT_TRUE(same_bits(d_state.download(), ref.state)) << "the window state after " << n << " rows";
        EXPECT_TRUE(d_out.guards_intact());
        EXPECT_TRUE(d_state.guards_intact());
      }
}

// ---- l2norm_qk ---------------------------------------------------------------------------------------------------

TEST(CudaGatedDelta, L2NormOfQAndKHeadsMatchesFloat64) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(403);
  StreamExec se;
  for (int64_t Hk : {1, 2})
    for (int64_t Dk : {16, 128})
      for (int64_t n : {1, 7, 300}) {
        SCOPED_TRACE("Hk " + std::to_string(Hk) + " Dk " + std::to_string(Dk) + " n " + std::to_string(n));
        const int64_t stride = 2 * Hk * Dk + 2 * Hk * 32 + 5;
        std::vector<float> x = test::randn(rng, sz(n * stride));
        for (int64_t i = 0; i < Dk; ++i) x[sz(i)] = 0.0f;  // row 0's first q head: zero (the eps keeps it finite)
        for (int64_t t = 1; t < n; t += 3)                   // rows of very different scales
          for (int64_t i = 0; i < stride; ++i) x[sz(t * stride + i)] *= t % 2 ? 1e3f : 1e-3f;
        const float q_scale = q_scale_of(Dk);
        Guarded d_x(x.size());
        d_x.upload(x);
        l2norm_qk(d_x.data(), n, stride, Hk, Dk, q_scale, se.s());
        se.stream.synchronize();
        const std::vector<float> all = d_x.download();
        std::vector<float> got;
        std::vector<double> want, tol;
        for (int64_t t = 0; t < n; ++t)
          for (int64_t head = 0; head < 2 * Hk; ++head) {
            const float* p = x.data() + t * stride + head * Dk;
            double ss = 0.0;
            for (int64_t i = 0; i < Dk; ++i) ss += static_cast<double>(p[i]) * p[i];
            const double inv = 1.0 / std::sqrt(ss + 1e-6), scale = head < Hk ? static_cast<double>(q_scale) : 1.0;
            for (int64_t i = 0; i < Dk; ++i) {
              got.push_back(all[sz(t * stride + head * Dk + i)]);
              want.push_back(p[i] * inv * scale);
              // The float32 sum of squares (≤ (Dk + 1)·u relative), half of it through the root, the root, the
              // division and the two products.
              tol.push_back((0.5 * dbl(Dk + 1) + 6.0) * kU * std::abs(want.back()) + 1e-38);
            }
          }
        EXPECT_TRUE(within(got, want, tol, "l2norm"));
        for (int64_t t = 0; t < n; ++t)  // the v heads and the padding untouched
          EXPECT_EQ(std::memcmp(all.data() + t * stride + 2 * Hk * Dk, x.data() + t * stride + 2 * Hk * Dk,
                                sz(stride - 2 * Hk * Dk) * sizeof(float)),
                    0)
              << "row " << t;
        EXPECT_TRUE(d_x.guards_intact());
      }
}

// ---- gated_delta_rule ------------------------------------------------------------------------------------------

// l2norm_qk then gated_delta_rule (the GPU's linear_attention) against the float64 recurrence, over n tokens in one
// call; the same tokens in pieces (1, then 6, then the rest) carry the state through device memory and must give the
// same bits, outputs and final state alike.
TEST(CudaGatedDelta, RecurrenceMatchesFloat64InOneCallAndInPieces) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(404);
  StreamExec se;
  for (const Shape& s : kShapes)
    for (int64_t n : {1, 7, 300}) {
      SCOPED_TRACE(shape_name(s, n));
      const DeltaCase d = make_delta_case(rng, s.Hk, s.Hv, s.Dk, s.Dv, n);
      const float q_scale = q_scale_of(s.Dk);
      const DeltaRef ref = delta_ref(d, q_scale);
      auto run = [&](const std::vector<int64_t>& pieces, std::vector<float>& out, std::vector<float>& state) {
        Guarded d_rows(d.rows.size()), d_g(d.g.size()), d_beta(d.beta.size()), d_S(d.S0.size()),
            d_out(sz(n * s.Hv * s.Dv));
        d_rows.upload(d.rows);
        d_g.upload(d.g);
        d_beta.upload(d.beta);
        d_S.upload(d.S0);
        l2norm_qk(d_rows.data(), n, d.stride, s.Hk, s.Dk, q_scale, se.s());
        int64_t t0 = 0;
        for (int64_t p : pieces) {
          GatedDeltaArgs a;
          a.n = p;
          a.Hk = s.Hk;
          a.Hv = s.Hv;
          a.Dk = s.Dk;
          a.Dv = s.Dv;
          const float* rows = d_rows.data() + t0 * d.stride;
          a.q = rows;
          a.k = rows + s.Hk * s.Dk;
          a.v = rows + 2 * s.Hk * s.Dk;
          a.row_stride = d.stride;
          a.g = d_g.data() + t0 * s.Hv;
          a.beta = d_beta.data() + t0 * s.Hv;
          a.state = d_S.data();
          a.out = d_out.data() + t0 * s.Hv * s.Dv;
          gated_delta_rule(a, se.s());
          t0 += p;
        }
        se.stream.synchronize();
        out = d_out.download();
        state = d_S.download();
        EXPECT_TRUE(d_out.guards_intact());
        EXPECT_TRUE(d_S.guards_intact());
        EXPECT_TRUE(d_rows.guards_intact());
      };
      std::vector<float> out, state, out_p, state_p;
      run({n}, out, state);
      EXPECT_TRUE(within(out, ref.out, ref.out_tol, "out"));
      EXPECT_TRUE(within(state, ref.S, ref.S_tol, "state"));
      if (n > 1) {
        run(n > 7 ? std::vector<int64_t>{1, 6, n - 7} : std::vector<int64_t>{1, n - 1}, out_p, state_p);
        EXPECT_TRUE(same_bits(out_p, out)) << "the pieces' outputs differ from one call's";
        EXPECT_TRUE(same_bits(state_p, state)) << "the pieces' final state differs from one call's";
      }
    }
}

// Value heads in llama.cpp's tiled order (GatedDeltaArgs::v_tiled; head j·Hk + i is key head i's j-th): a case whose
// value heads (v, g, β, the state) sit at the tiled places gives the float64 recurrence of the grouped case at the
// same places, within its bound.
TEST(CudaGatedDelta, TiledValueHeadsMatchFloat64) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(405);
  StreamExec se;
  for (const Shape& s : {Shape{2, 4, 16, 100}, Shape{3, 6, 8, 12}}) {
    const int64_t n = 9;
    SCOPED_TRACE(shape_name(s, n));
    const DeltaCase d = make_delta_case(rng, s.Hk, s.Hv, s.Dk, s.Dv, n);
    const float q_scale = q_scale_of(s.Dk);
    const DeltaRef ref = delta_ref(d, q_scale);
    const DeltaCase t = tiled_case(d);
    auto tiled_of = [&](int64_t g) { return tiled_head(d, g); };
    Guarded d_rows(t.rows.size()), d_g(t.g.size()), d_beta(t.beta.size()), d_S(t.S0.size()), d_out(sz(n * s.Hv * s.Dv));
    d_rows.upload(t.rows);
    d_g.upload(t.g);
    d_beta.upload(t.beta);
    d_S.upload(t.S0);
    l2norm_qk(d_rows.data(), n, t.stride, s.Hk, s.Dk, q_scale, se.s());
    GatedDeltaArgs a;
    a.n = n;
    a.Hk = s.Hk;
    a.Hv = s.Hv;
    a.Dk = s.Dk;
    a.Dv = s.Dv;
    a.q = d_rows.data();
    a.k = d_rows.data() + s.Hk * s.Dk;
    a.v = d_rows.data() + 2 * s.Hk * s.Dk;
    a.row_stride = t.stride;
    a.g = d_g.data();
    a.beta = d_beta.data();
    a.state = d_S.data();
    a.out = d_out.data();
    a.v_tiled = true;
    gated_delta_rule(a, se.s());
    se.stream.synchronize();
    const std::vector<float> out_t = d_out.download(), state_t = d_S.download();
    // Back to the grouped places, then the grouped case's bound.
    std::vector<float> out(out_t.size()), state(state_t.size());
    for (int64_t g = 0; g < s.Hv; ++g) {
      const int64_t p = tiled_of(g);
      for (int64_t tok = 0; tok < n; ++tok)
        std::copy_n(out_t.begin() + (tok * s.Hv + p) * s.Dv, s.Dv, out.begin() + (tok * s.Hv + g) * s.Dv);
      std::copy_n(state_t.begin() + p * s.Dk * s.Dv, s.Dk * s.Dv, state.begin() + g * s.Dk * s.Dv);
    }
    EXPECT_TRUE(within(out, ref.out, ref.out_tol, "out"));
    EXPECT_TRUE(within(state, ref.S, ref.S_tol, "state"));
    EXPECT_TRUE(d_out.guards_intact());
    EXPECT_TRUE(d_S.guards_intact());
  }
}

// ---- gated_rms_norm, sigmoid_gate_rows ---------------------------------------------------------------------------

TEST(CudaGatedDelta, GatedRmsNormMatchesFloat64) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(405);
  StreamExec se;
  const float eps = 1e-6f;
  for (int64_t Hv : {1, 4})
    for (int64_t Dv : {16, 32, 100, 128})
      for (int64_t n : {1, 7, 300}) {
        SCOPED_TRACE("Hv " + std::to_string(Hv) + " Dv " + std::to_string(Dv) + " n " + std::to_string(n));
        const int64_t V = Hv * Dv, z_stride = 3 * V + 9;  // z sits inside wider rows (the q|k|v|z projection's)
        std::vector<float> o = test::randn(rng, sz(n * V));
        for (int64_t i = 0; i < Dv; ++i) o[sz(i)] = 0.0f;  // a zero head: eps keeps it finite (0 out)
        const std::vector<float> z = test::randn(rng, sz(n * z_stride), 2.0f), w = test::randn(rng, sz(Dv));
        Guarded d_o(o.size()), d_z(z.size()), d_w(w.size());
        d_o.upload(o);
        d_z.upload(z);
        d_w.upload(w);
        gated_rms_norm(d_o.data(), n, Hv, Dv, d_z.data() + 7, z_stride, d_w.data(), eps, se.s());
        se.stream.synchronize();
        std::vector<double> want(o.size()), tol(o.size());
        for (int64_t t = 0; t < n; ++t)
          for (int64_t h = 0; h < Hv; ++h) {
            const float* p = o.data() + (t * Hv + h) * Dv;
            double ss = 0.0;
            for (int64_t i = 0; i < Dv; ++i) ss += static_cast<double>(p[i]) * p[i];
            const double inv = 1.0 / std::sqrt(ss / dbl(Dv) + static_cast<double>(eps));
            for (int64_t i = 0; i < Dv; ++i) {
              const size_t at = sz((t * Hv + h) * Dv + i);
              want[at] = p[i] * inv * w[sz(i)] * silu64(z[sz(7 + t * z_stride + h * Dv + i)]);
              // The sum of squares (≤ (Dv + 1)·u), halved by the root, the division by Dv, + eps, the root, 1/x,
              // three products and silu's own few ulps.
              tol[at] = (0.5 * dbl(Dv + 1) + 12.0) * kU * std::abs(want[at]) + 1e-38;
            }
          }
        EXPECT_TRUE(within(d_o.download(), want, tol, "gated rms norm"));
        EXPECT_TRUE(d_o.guards_intact());
      }
}

TEST(CudaGatedDelta, SigmoidGateRowsMatchFloat64) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(406);
  StreamExec se;
  for (int64_t width : {32, 100, 4096})
    for (int64_t n : {1, 7, 300}) {
      SCOPED_TRACE("width " + std::to_string(width) + " n " + std::to_string(n));
      const int64_t gate_stride = 3 * width + 1;
      const std::vector<float> x = test::randn(rng, sz(n * width)), gate = test::randn(rng, sz(n * gate_stride), 3.0f);
      Guarded d_x(x.size()), d_gate(gate.size());
      d_x.upload(x);
      d_gate.upload(gate);
      sigmoid_gate_rows(d_x.data(), n, width, d_gate.data(), gate_stride, se.s());
      se.stream.synchronize();
      std::vector<double> want(x.size()), tol(x.size());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < width; ++i) {
          const size_t at = sz(t * width + i);
          want[at] = x[at] * sigmoid64(gate[sz(t * gate_stride + i)]);
          tol[at] = 8.0 * kU * std::abs(want[at]) + 1e-38;  // exp, 1 + e, 1/x, the product
        }
      EXPECT_TRUE(within(d_x.download(), want, tol, "gated rows"));
      EXPECT_TRUE(same_bits(d_gate.download(), gate)) << "the gates were written";
      EXPECT_TRUE(d_x.guards_intact());
    }
}

// ---- prepare_heads with gated attention's gate heads ------------------------------------------------------------

// Rows [q | gates | k | v] (gate_heads = Hq) give the same bits as rows [q | k | v] without gates — q out, k and v in
// place — and leave the gates as they were; the register kernel (D 64) and the shared-memory one (D 32), with q/k
// norms and rope, plain and with the Hadamard rotation (v heads too).
TEST(CudaGatedDelta, PrepareHeadsReadsAroundTheGateHeads) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(407);
  StreamExec se;
  const int64_t n = 5, Hq = 4, Hkv = 2, positions = 16;
  for (int64_t D : {32, 64})
    for (int rotation : {0, 3}) {
      SCOPED_TRACE("D " + std::to_string(D) + " rotation " + std::to_string(rotation));
      std::vector<float> table(sz(positions * D));
      const std::vector<float> inv_freq = test::uniform(rng, sz(D / 2), 0.01f, 1.0f);
      for (int64_t p = 0; p < positions; ++p)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double a = dbl(p) * static_cast<double>(inv_freq[sz(i)]);
          table[sz(p * D + i)] = static_cast<float>(std::cos(a));
          table[sz(p * D + D / 2 + i)] = static_cast<float>(std::sin(a));
        }
      std::vector<float> signs(sz(D));
      for (float& v : signs) v = (rng() & 1) != 0 ? 1.0f : -1.0f;
      const std::vector<float> q_norm = test::randn(rng, sz(D)), k_norm = test::randn(rng, sz(D));
      const int64_t plain_stride = (Hq + 2 * Hkv) * D, gated_stride = (2 * Hq + 2 * Hkv) * D;
      const std::vector<float> plain = test::randn(rng, sz(n * plain_stride));
      std::vector<float> gated(sz(n * gated_stride));
      const std::vector<float> gates = test::randn(rng, sz(n * Hq * D));
      for (int64_t t = 0; t < n; ++t) {
        const float* src = plain.data() + t * plain_stride;
        float* dst = gated.data() + t * gated_stride;
        std::copy_n(src, Hq * D, dst);                                     // q
        std::copy_n(gates.data() + t * Hq * D, Hq * D, dst + Hq * D);      // gates
        std::copy_n(src + Hq * D, 2 * Hkv * D, dst + 2 * Hq * D);          // k, v
      }
      Guarded d_table(table.size()), d_signs(signs.size()), d_qn(q_norm.size()), d_kn(k_norm.size()),
          d_plain(plain.size()), d_gated(gated.size()), q_plain(sz(n * Hq * D)), q_gated(sz(n * Hq * D));
      d_table.upload(table);
      d_signs.upload(signs);
      d_qn.upload(q_norm);
      d_kn.upload(k_norm);
      d_plain.upload(plain);
      d_gated.upload(gated);
      auto args = [&](float* qkv, float* q_out, int64_t gate_heads) {
        HeadPrepArgs a{};
        a.qkv = qkv;
        a.n = n;
        a.Hq = Hq;
        a.Hkv = Hkv;
        a.D = D;
        a.q_norm = d_qn.data();
        a.k_norm = d_kn.data();
        a.norm_offset = 1.0f;
        a.eps = 1e-6f;
        a.rope_table = d_table.data();
        a.rope_positions = positions;
        a.pos0 = 3;
        a.d_pos = nullptr;
        a.rotation = rotation;
        a.qL = rotation == 3 ? d_signs.data() : nullptr;
        a.qR = nullptr;
        a.q_out = q_out;
        a.q_head_major = true;
        a.gate_heads = gate_heads;
        return a;
      };
      prepare_heads(args(d_plain.data(), q_plain.data(), 0), se.s());
      prepare_heads(args(d_gated.data(), q_gated.data(), Hq), se.s());
      se.stream.synchronize();
      EXPECT_TRUE(same_bits(q_gated.download(), q_plain.download())) << "q heads";
      const std::vector<float> p = d_plain.download(), g = d_gated.download();
      for (int64_t t = 0; t < n; ++t) {
        EXPECT_EQ(std::memcmp(g.data() + t * gated_stride + 2 * Hq * D, p.data() + t * plain_stride + Hq * D,
                              sz(2 * Hkv * D) * sizeof(float)),
                  0)
            << "k/v heads of row " << t;
        EXPECT_EQ(std::memcmp(g.data() + t * gated_stride + Hq * D, gates.data() + t * Hq * D,
                              sz(Hq * D) * sizeof(float)),
                  0)
            << "the gates of row " << t << " were written";
      }
      EXPECT_TRUE(d_gated.guards_intact());
      EXPECT_TRUE(q_gated.guards_intact());
    }
}

// ---- argument errors ---------------------------------------------------------------------------------------------

TEST(CudaGatedDelta, BadArgumentsAreErrorsNamingTheRule) {
  CIDER_REQUIRE_GPU();
  StreamExec se;
  DeviceBuffer buf(size_t{1} << 20);
  float* f = buf.as<float>();
  GatedDeltaArgs good;
  good.n = 1;
  good.Hk = 1;
  good.Hv = 2;
  good.Dk = 16;
  good.Dv = 16;
  good.q = good.k = good.v = good.g = good.beta = f;
  good.row_stride = 64;
  good.state = f;
  good.out = f;
  auto bad = [&](auto change, ErrorCode code, const char* fragment) {
    GatedDeltaArgs a = good;
    change(a);
    expect_error([&] { gated_delta_rule(a, se.s()); }, "cuda.gated_delta_rule", code, fragment);
  };
  bad([](GatedDeltaArgs& a) { a.Dv = kGatedDeltaMaxDv + 1; }, ErrorCode::kUnsupported, "one thread per state column");
  bad([](GatedDeltaArgs& a) { a.Dk = 1024, a.Dv = 1024; }, ErrorCode::kUnsupported, "shared memory");
  bad([](GatedDeltaArgs& a) { a.Hk = 2, a.Hv = 3; }, ErrorCode::kShapeMismatch, "multiple of Hk");
  bad([](GatedDeltaArgs& a) { a.row_stride = 20; }, ErrorCode::kShapeMismatch, "row stride");
  bad([](GatedDeltaArgs& a) { a.state = nullptr; }, ErrorCode::kInvalidArgument, "not null");
  expect_error([&] { check_gated_delta_shape(1024, 1024, "cuda.model"); }, "cuda.model", ErrorCode::kUnsupported,
               "k_head_dim 1024");
  EXPECT_NO_THROW(check_gated_delta_shape(128, 128, "cuda.model"));  // Qwen3-Next's and Qwen3.5's heads
  expect_error([&] { causal_conv1d_silu(f, 8, 1, 8, f, 65, f, f, 8, se.s()); }, "cuda.causal_conv1d_silu",
               ErrorCode::kUnsupported, "taps");
  expect_error([&] { causal_conv1d_silu(f, 7, 1, 8, f, 4, f, f, 8, se.s()); }, "cuda.causal_conv1d_silu",
               ErrorCode::kShapeMismatch, "row strides");
  expect_error([&] { l2norm_qk(f, 1, 31, 1, 16, 0.25f, se.s()); }, "cuda.l2norm_qk", ErrorCode::kShapeMismatch,
               "row stride");
  expect_error([&] { gated_rms_norm(f, 1, 2, 16, f, 31, f, 1e-6f, se.s()); }, "cuda.gated_rms_norm",
               ErrorCode::kShapeMismatch, "z row stride");
  expect_error([&] { sigmoid_gate_rows(f, 1, 16, f, 15, se.s()); }, "cuda.sigmoid_gate_rows",
               ErrorCode::kShapeMismatch, "gate row stride");
  expect_error([&] { gdn_gates(f, 1, 0, f, f, f, f, 2, f, f, se.s()); }, "cuda.gdn_gates", ErrorCode::kShapeMismatch,
               "H >= 1");
  HeadPrepArgs h{};
  h.qkv = f;
  h.n = 1;
  h.Hq = 4;
  h.Hkv = 2;
  h.D = 32;
  h.rope_table = f;
  h.rope_positions = 4;
  h.q_out = f;
  h.gate_heads = 3;
  expect_error([&] { prepare_heads(h, se.s()); }, "cuda.prepare_heads", ErrorCode::kShapeMismatch, "gate_heads");
  // Nothing to do: no launch, no error.
  EXPECT_NO_THROW(causal_conv1d_silu(nullptr, 8, 0, 8, nullptr, 4, nullptr, nullptr, 8, se.s()));
  GatedDeltaArgs none = good;
  none.n = 0;
  none.q = nullptr;
  EXPECT_NO_THROW(gated_delta_rule(none, se.s()));
  se.stream.synchronize();
}

}  // namespace
}  // namespace cider::cuda
