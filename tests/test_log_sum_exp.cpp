// log-sum-exp of a row (kernel_table.h LogSumExpArgs; the runtime's logprobs): every ISA level's entry against a
// float64 computation written here, on fresh random rows with tails (lengths not multiples of 8 or 16), logits as
// wide as a model's (scale up to 30, a few far below the max, −inf entries), a vocabulary-sized row, and the edge
// rows (one entry, all −inf, a NaN, a +inf). The bound: 2^-24·max|z − max| for the float32 rounding of z − max, plus
// 1e-6 for exp's few ulp (relative, on a sum of positive terms) and the float64 sum.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/kernel_table.h"
#include "support/test_support.h"

namespace cider {
namespace {

struct Lse {
  double max, lse;
};

Lse run(const kernels::KernelTable& t, const std::vector<float>& z) {
  Lse r{0.0, 0.0};
  t.log_sum_exp({z.data(), static_cast<int64_t>(z.size()), &r.max, &r.lse});
  return r;
}

// The oracle: long double sums of exp over the finite entries.
Lse oracle(const std::vector<float>& z) {
  long double mx = -std::numeric_limits<long double>::infinity();
  for (float x : z) mx = std::max(mx, static_cast<long double>(x));
  long double s = 0.0L;
  for (float x : z) s += std::exp(static_cast<long double>(x) - mx);
  return {static_cast<double>(mx), static_cast<double>(std::log(s))};
}

TEST(LogSumExp, EveryLevelMatchesFloat64) {
  auto rng = test::make_rng(9100);
  const int64_t lengths[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1000, 4097, 262144};
  for (IsaLevel level : supported_isas()) {
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    SCOPED_TRACE(t.name);
    for (int64_t n : lengths)
      for (float scale : {0.5f, 4.0f, 30.0f}) {
        SCOPED_TRACE(::testing::Message() << "n " << n << " scale " << scale);
        std::vector<float> z = test::randn(rng, static_cast<size_t>(n), scale);
        if (n > 10) {
          z[static_cast<size_t>(n / 3)] = -std::numeric_limits<float>::infinity();
          z[static_cast<size_t>(n / 2)] -= 200.0f;  // far below the max: exp underflows
        }
        const Lse want = oracle(z), got = run(t, z);
        double spread = 0.0;
        for (float x : z)
          if (std::isfinite(x)) spread = std::max(spread, want.max - static_cast<double>(x));
        EXPECT_EQ(got.max, want.max);
        ASSERT_TRUE(std::isfinite(got.lse));
        EXPECT_NEAR(got.lse, want.lse, std::ldexp(spread, -24) + 1e-6);
      }
    // Edge rows.
    const float inf = std::numeric_limits<float>::infinity();
    Lse r = run(t, {2.5f});
    EXPECT_EQ(r.max, 2.5);
    EXPECT_EQ(r.lse, 0.0);
    r = run(t, std::vector<float>(19, -inf));
    EXPECT_EQ(r.max, -static_cast<double>(inf));
    EXPECT_EQ(r.lse, -static_cast<double>(inf));
    for (float bad : {std::nanf(""), inf})
      for (size_t at : {size_t{0}, size_t{16}, size_t{20}}) {
        std::vector<float> z = test::randn(rng, 21, 1.0f);
        z[at] = bad;
        EXPECT_TRUE(std::isnan(run(t, z).lse)) << "bad value " << bad << " at " << at;
      }
  }
}

}  // namespace
}  // namespace cider
