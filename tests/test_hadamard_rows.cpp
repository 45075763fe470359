// The kernel table's hadamard_rows (nn::Rotation's Hadamard kind: queries into the cache's rotated space, attention
// outputs back) at every ISA level this machine runs, against kernels::ref::hadamard_row: bit for bit, forward and
// inverse — the fast levels do the reference's multiplies x·(s·c) and butterfly adds/subtracts in the same order per
// element, so no rounding differs (and a NaN travels to the same places with the same bits). Fresh random rows over
// head sizes whose Hadamard block P (the largest power of two dividing D) is below, at and above a vector (4 … 1024,
// tails such as 80 = 5·16 and 96 = 3·32), magnitudes from 2^-10 to 2^10 times N(0, 1), and a NaN and an infinity
// in one row.
// The reference itself is checked against float64 in tests/test_rotation.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/kernel_table.h"
#include "kernels/ref/ref_kernels.h"
#include "support/test_support.h"

namespace cider {
namespace {

std::vector<float> random_rows(std::mt19937_64& rng, int64_t n, int64_t D) {
  std::vector<float> v = test::randn(rng, static_cast<size_t>(n * D));
  std::uniform_int_distribution<int> e(-10, 10);
  for (float& x : v) x = std::ldexp(x, e(rng));  // a spread of magnitudes inside each row
  return v;
}

std::vector<float> random_signs(std::mt19937_64& rng, int64_t D) {
  std::vector<float> s(static_cast<size_t>(D));
  std::bernoulli_distribution coin(0.5);
  for (float& x : s) x = coin(rng) ? 1.0f : -1.0f;
  return s;
}

TEST(HadamardRows, EveryLevelEqualsTheReferenceBitForBit) {
  std::mt19937_64 rng = test::make_rng(0x4adu);
  int checked = 0;
  for (int64_t D : {4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 192, 256, 320, 512, 1024}) {
    for (int64_t n : {1, 3}) {
      for (bool inverse : {false, true}) {
        const std::vector<float> src = random_rows(rng, n, D), signs = random_signs(rng, D);
        std::vector<float> want = src;
        for (int64_t r = 0; r < n; ++r) kernels::ref::hadamard_row(want.data() + r * D, signs.data(), D, inverse);
        for (IsaLevel level : supported_isas()) {
          std::vector<float> got = src;
          kernels::kernels_for_isa(level).hadamard_rows({got.data(), n, D, signs.data(), inverse});
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
              << isa_name(level) << " D " << D << " n " << n << (inverse ? " inverse" : " forward");
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// A NaN and an infinity spread over their block as the reference spreads them (same lanes, same bits); the rows
// beside them are untouched by it.
TEST(HadamardRows, NonFiniteValuesSpreadAsInTheReference) {
  std::mt19937_64 rng = test::make_rng(0x4aeu);
  for (int64_t D : {96, 256}) {
    for (bool inverse : {false, true}) {
      std::vector<float> src = random_rows(rng, 2, D);
      const std::vector<float> signs = random_signs(rng, D);
      src[5] = std::numeric_limits<float>::quiet_NaN();
      src[9] = std::numeric_limits<float>::infinity();
      std::vector<float> want = src;
      for (int64_t r = 0; r < 2; ++r) kernels::ref::hadamard_row(want.data() + r * D, signs.data(), D, inverse);
      int nan_count = 0;
      for (int64_t d = 0; d < D; ++d) nan_count += std::isnan(want[static_cast<size_t>(d)]) ? 1 : 0;
      EXPECT_GT(nan_count, 0);
      for (int64_t d = D; d < 2 * D; ++d) EXPECT_TRUE(std::isfinite(want[static_cast<size_t>(d)])) << d;
      for (IsaLevel level : supported_isas()) {
        std::vector<float> got = src;
        kernels::kernels_for_isa(level).hadamard_rows({got.data(), 2, D, signs.data(), inverse});
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << isa_name(level) << " D " << D << (inverse ? " inverse" : " forward");
      }
    }
  }
}

}  // namespace
}  // namespace cider
