// The gated delta rule (hybrid models' linear-attention layers): every ISA level's kernel-table entry against the
// float64 recurrence, within the rounding bound of tests/support/gated_delta_ref.h (derived from the maths, not from
// any kernel's results), on fresh random inputs over shapes with tails (Dv not a multiple of 8, blocks past 64
// columns, value heads sharing key heads); NaN never passes. Plus nn::gated_delta_rule (the active table) and the
// head-range split the thread pool makes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/kernel_table.h"
#include "nn/gated_delta.h"
#include "support/gated_delta_ref.h"
#include "support/test_support.h"

namespace cider {
namespace {

using test::gdn::DeltaCase;
using test::gdn::DeltaRef;
using test::gdn::sz;

// The shared shapes plus tails of the AVX2 kernel's column blocks: 100 = 64 + 32 + 4, 72 = 64 + 8, 136 = 2·64 + 8, 12.
const test::gdn::Shape kMoreShapes[] = {{1, 2, 16, 100}, {2, 2, 32, 72}, {1, 1, 128, 136}, {1, 2, 8, 12}};

// q and k of every token and key head l2-normalised as nn::gated_delta_rule does (the sum in double, x·inv·scale).
void normalise(const DeltaCase& d, float q_scale, std::vector<float>& qn, std::vector<float>& kn) {
  qn.assign(sz(d.n * d.Hk * d.Dk), 0.0f);
  kn.assign(qn.size(), 0.0f);
  auto l2 = [&](const float* x, float scale, float* out) {
    double ss = 0.0;
    for (int64_t i = 0; i < d.Dk; ++i) ss += static_cast<double>(x[i]) * x[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
    for (int64_t i = 0; i < d.Dk; ++i) out[i] = x[i] * inv * scale;
  };
  for (int64_t t = 0; t < d.n; ++t)
    for (int64_t h = 0; h < d.Hk; ++h) {
      l2(d.rows.data() + t * d.stride + h * d.Dk, q_scale, qn.data() + (t * d.Hk + h) * d.Dk);
      l2(d.rows.data() + t * d.stride + d.Hk * d.Dk + h * d.Dk, 1.0f, kn.data() + (t * d.Hk + h) * d.Dk);
    }
}

// Runs `table`'s gated_delta over value heads [h0, h1) of the case: state (updated) and out as the kernel leaves them.
void run_kernel(const kernels::KernelTable& table, const DeltaCase& d, const std::vector<float>& qn,
                const std::vector<float>& kn, int64_t h0, int64_t h1, std::vector<float>& state,
                std::vector<float>& out, bool v_tiled = false) {
  kernels::GatedDeltaKernelArgs a{};
  a.v_tiled = v_tiled;
  a.q = qn.data();
  a.k = kn.data();
  a.v = d.rows.data() + 2 * d.Hk * d.Dk;
  a.v_stride = d.stride;
  a.g = d.g.data();
  a.beta = d.beta.data();
  a.state = state.data();
  a.out = out.data();
  a.n = d.n;
  a.Hk = d.Hk;
  a.Hv = d.Hv;
  a.Dk = d.Dk;
  a.Dv = d.Dv;
  a.h0 = h0;
  a.h1 = h1;
  table.gated_delta(a);
}

TEST(GatedDelta, EveryIsaLevelMeetsTheFloat64Bound) {
  auto rng = test::make_rng(410);
  std::vector<test::gdn::Shape> shapes(std::begin(test::gdn::kShapes), std::end(test::gdn::kShapes));
  shapes.insert(shapes.end(), std::begin(kMoreShapes), std::end(kMoreShapes));
  for (IsaLevel level : supported_isas()) {
    const kernels::KernelTable& table = kernels::kernels_for_isa(level);
    for (const test::gdn::Shape& s : shapes)
      for (int64_t n : {1, 7, 130}) {
        SCOPED_TRACE(std::string(isa_name(level)) + " " + test::gdn::shape_name(s, n));
        const DeltaCase d = test::gdn::make_delta_case(rng, s.Hk, s.Hv, s.Dk, s.Dv, n);
        const float qs = test::gdn::q_scale_of(s.Dk);
        const DeltaRef ref = test::gdn::delta_ref(d, qs);
        std::vector<float> qn, kn;
        normalise(d, qs, qn, kn);
        std::vector<float> state = d.S0, out(sz(n * s.Hv * s.Dv), std::nanf(""));
        run_kernel(table, d, qn, kn, 0, s.Hv, state, out);
        EXPECT_TRUE(test::gdn::within(out, ref.out, ref.out_tol, "out"));
        EXPECT_TRUE(test::gdn::within(state, ref.S, ref.S_tol, "state"));
        // The pool's split: heads [0, 1) then [1, Hv) in two calls leave exactly the same bits.
        std::vector<float> state2 = d.S0, out2(out.size(), std::nanf(""));
        run_kernel(table, d, qn, kn, 0, 1, state2, out2);
        run_kernel(table, d, qn, kn, 1, s.Hv, state2, out2);
        EXPECT_EQ(std::memcmp(state.data(), state2.data(), state.size() * 4), 0);
        EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * 4), 0);
      }
  }
}

// Value heads in llama.cpp's tiled order (v_tiled: head j·Hk + i is key head i's j-th, the checkpoints' i·r + j): a
// case whose value heads (v, g, β, the state) are moved to the tiled places gives, at every ISA level, the grouped
// run's outputs and states at the same places, bit for bit (every head's arithmetic is the same).
TEST(GatedDelta, TiledValueHeadsArePermutedGroupedHeads) {
  auto rng = test::make_rng(412);
  for (IsaLevel level : supported_isas()) {
    const kernels::KernelTable& table = kernels::kernels_for_isa(level);
    for (const test::gdn::Shape& s : {test::gdn::Shape{2, 4, 16, 100}, test::gdn::Shape{3, 6, 8, 12}}) {
      const int64_t n = 9;
      SCOPED_TRACE(std::string(isa_name(level)) + " " + test::gdn::shape_name(s, n));
      const DeltaCase d = test::gdn::make_delta_case(rng, s.Hk, s.Hv, s.Dk, s.Dv, n);
      const DeltaCase t = test::gdn::tiled_case(d);
      auto tiled_of = [&](int64_t g) { return test::gdn::tiled_head(d, g); };
      const float qs = test::gdn::q_scale_of(s.Dk);
      std::vector<float> qn, kn;
      normalise(d, qs, qn, kn);  // q and k are the same in both
      std::vector<float> state = d.S0, out(sz(n * s.Hv * s.Dv), std::nanf(""));
      run_kernel(table, d, qn, kn, 0, s.Hv, state, out);
      std::vector<float> state_t = t.S0, out_t(out.size(), std::nanf(""));
      run_kernel(table, t, qn, kn, 0, s.Hv, state_t, out_t, /*v_tiled=*/true);
      size_t differ = 0;
      for (int64_t g = 0; g < s.Hv; ++g) {
        const int64_t p = tiled_of(g);
        for (int64_t tok = 0; tok < n; ++tok)
          for (int64_t e = 0; e < s.Dv; ++e)
            differ += !(out_t[sz((tok * s.Hv + p) * s.Dv + e)] == out[sz((tok * s.Hv + g) * s.Dv + e)]);
        for (int64_t e = 0; e < s.Dk * s.Dv; ++e)
          differ += !(state_t[sz(p * s.Dk * s.Dv + e)] == state[sz(g * s.Dk * s.Dv + e)]);
      }
      EXPECT_EQ(differ, 0u);
      // The same case read in grouped order differs (the mapping is exercised).
      std::vector<float> state_w = t.S0, out_w(out.size(), std::nanf(""));
      run_kernel(table, t, qn, kn, 0, s.Hv, state_w, out_w, /*v_tiled=*/false);
      EXPECT_NE(std::memcmp(out_w.data(), out_t.data(), out.size() * 4), 0);
    }
  }
}

// nn::gated_delta_rule (normalisation + the active table + the pool), fed a sequence whole and in two pieces.
TEST(GatedDelta, TheRuleMeetsTheBoundWholeAndInPieces) {
  auto rng = test::make_rng(411);
  for (const test::gdn::Shape& s : {test::gdn::Shape{2, 4, 128, 128}, test::gdn::Shape{1, 2, 16, 100}})
    for (int64_t n : {1, 300}) {
      SCOPED_TRACE(test::gdn::shape_name(s, n));
      const DeltaCase d = test::gdn::make_delta_case(rng, s.Hk, s.Hv, s.Dk, s.Dv, n);
      const DeltaRef ref = test::gdn::delta_ref(d, test::gdn::q_scale_of(s.Dk));
      auto rule = [&](int64_t t0, int64_t count, std::vector<float>& state, std::vector<float>& out) {
        nn::GatedDeltaArgs a;
        a.n = count;
        a.Hk = s.Hk;
        a.Hv = s.Hv;
        a.Dk = s.Dk;
        a.Dv = s.Dv;
        a.q = d.rows.data() + t0 * d.stride;
        a.k = a.q + s.Hk * s.Dk;
        a.v = a.q + 2 * s.Hk * s.Dk;
        a.row_stride = d.stride;
        a.g = d.g.data() + t0 * s.Hv;
        a.beta = d.beta.data() + t0 * s.Hv;
        a.state = state.data();
        a.out = out.data() + t0 * s.Hv * s.Dv;
        nn::gated_delta_rule(a);
      };
      std::vector<float> state = d.S0, out(sz(n * s.Hv * s.Dv), std::nanf(""));
      rule(0, n, state, out);
      EXPECT_TRUE(test::gdn::within(out, ref.out, ref.out_tol, "out"));
      EXPECT_TRUE(test::gdn::within(state, ref.S, ref.S_tol, "state"));
      if (n > 1) {
        std::vector<float> state2 = d.S0, out2(out.size(), std::nanf(""));
        rule(0, n / 3, state2, out2);
        rule(n / 3, n - n / 3, state2, out2);
        EXPECT_EQ(std::memcmp(out.data(), out2.data(), out.size() * 4), 0);
        EXPECT_EQ(std::memcmp(state.data(), state2.data(), state.size() * 4), 0);
      }
    }
}

}  // namespace
}  // namespace cider
