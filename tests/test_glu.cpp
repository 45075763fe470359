// Gated activation of the MLP (kernel_table.h GluArgs; model/cpu_backend.cpp glu_rows): every ISA level's entry
// against the reference on fresh random inputs (x up to ±20 and a few far beyond, tiny and subnormal values, exact
// zeros), counts with tails (not multiples of 8 or 16), every element; the reference itself against x·σ(z) in long
// double; the edge values (±inf, NaN, ±0, ±FLT_MAX) exactly as the reference; nothing read or written past count.
//
// The bound, per element, with ε = 2^-24 (the relative rounding error of one float32 operation), r the reference's
// float64 result, z the sigmoid's argument (SiLU: z = x; GELU: z = 2y = 2·√(2/π)·(x + 0.044715·x³)):
//   |fast − ref| <= ε·(14 + 6·|z|·σ(−z))·|r| + 2^-52·|x·u| + 2^-146·max(1, |u|)
// The fast levels compute e = exp(−|z|), σ = 1/(1 + e) (z >= 0) or e/(1 + e) (z < 0), act = x·σ, then act·u:
//   - exp8/exp16 (Cody–Waite by ln 2, degree-6 Cephes polynomial): exp8 measured over every float in [−87.3, 0]
//     against float64 exp is within 1.26 ulp (exp16 is the same polynomial); the bound allows 3 ulp = 6ε relative;
//   - 1 + e: ε, plus e's error damped by e/(1 + e) <= 1/2: 3ε; so 4ε;
//   - σ: the division ε, the numerator (e: 6ε, or 1: exact) and 1 + e (4ε): <= 11ε;
//   - x·σ: ε; ·u: ε; the reference rounding its float64 result once to float32: ε. Total 14ε.
//   - GELU only: z itself is rounded: 2·√(2/π) as a float (ε), times x (ε), x² (ε), 0.044715 as a float (ε) and the
//     fma 1 + a·x² (ε) — their share of 1 + a·x² is a·x²/(1 + a·x²) < 1 — and the product (ε): |Δz| <= 6ε·|z|, and
//     d ln σ(z)/dz = σ(−z), so σ moves by 6ε·|z|·σ(−z) relative (at most 1.7ε for z > 0; for z < 0 it grows with |z|:
//     GELU's relative condition in the negative tail, which any float32 evaluation of z has).
// Absolute terms: the reference evaluates 1 + tanh(y) in float64, which cancels for y < 0 (an absolute error of
// 2^-53 in tanh, times 0.5·|x·u|: 2^-54·|x·u|; PyTorch's float32 formula has 2^-25·|x·u| there); the AVX2 level takes
// e^−|z| < 2^-126 as 0 (2^-126·|x·u|): both under 2^-52·|x·u|. The float32 steps in the subnormal range round by up
// to 2^-150 absolute each (x·σ, then ·u, and the reference's rounding): under 2^-146·max(1, |u|).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/kernel_table.h"
#include "support/test_support.h"

namespace cider {
namespace {

using kernels::GluActivation;

constexpr float kInf = std::numeric_limits<float>::infinity();
const char* act_name(GluActivation a) { return a == GluActivation::kSiLU ? "silu" : "gelu_tanh"; }

// z of the bound (the sigmoid's argument), in double.
double sigmoid_arg(double x, GluActivation a) {
  if (a == GluActivation::kSiLU) return x;
  return 2.0 * std::sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x);
}

double bound(float x, float u, double r, GluActivation a) {
  double rel = 14.0;
  if (a == GluActivation::kGeluTanh) {
    const double z = sigmoid_arg(x, a);
    rel += 6.0 * std::fabs(z) / (1.0 + std::exp(z));  // |z|·σ(−z); exp overflow → 0
  }
  const double xu = std::fabs(static_cast<double>(x) * static_cast<double>(u));
  return std::ldexp(rel, -24) * std::fabs(r) + std::ldexp(xu, -52) +
         std::ldexp(std::max(1.0, std::fabs(static_cast<double>(u))), -146);
}

// x: mostly |x| <= 20 (the activations a model produces), with tiny and subnormal magnitudes, exact ±0 and a few huge
// values (x² overflowing float32).
std::vector<float> draw_x(std::mt19937_64& rng, size_t n) {
  std::uniform_int_distribution<int> kind(0, 19);
  std::uniform_real_distribution<double> wide(-20.0, 20.0), unit(-1.0, 1.0), tiny_exp(-45.0, -20.0),
      huge_exp(1.3, 37.0);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> x(n);
  for (float& v : x) {
    const int k = kind(rng);
    const double s = sign(rng) ? -1.0 : 1.0;
    if (k < 9) v = static_cast<float>(wide(rng));
    else if (k < 13) v = static_cast<float>(normal(rng));
    else if (k < 15) v = static_cast<float>(unit(rng));
    else if (k < 17) v = static_cast<float>(s * std::pow(10.0, tiny_exp(rng)));
    else if (k < 18) v = static_cast<float>(s * 0.0);
    else if (k < 19) v = static_cast<float>(s * std::pow(10.0, huge_exp(rng)));
    else v = static_cast<float>(wide(rng) * 0.25);
  }
  return x;
}

// u: N(0, 1.5²) mostly, some tiny, some exact zeros.
std::vector<float> draw_u(std::mt19937_64& rng, size_t n) {
  std::uniform_int_distribution<int> kind(0, 19);
  std::normal_distribution<double> normal(0.0, 1.5);
  std::uniform_real_distribution<double> tiny_exp(-40.0, -10.0);
  std::vector<float> u(n);
  for (float& v : u) {
    const int k = kind(rng);
    if (k < 17) v = static_cast<float>(normal(rng));
    else if (k < 19) v = static_cast<float>((k == 17 ? 1.0 : -1.0) * std::pow(10.0, tiny_exp(rng)));
    else v = 0.0f;
  }
  return u;
}

std::vector<float> run(const kernels::KernelTable& t, std::vector<float> g, const std::vector<float>& u,
                       GluActivation a) {
  t.glu({g.data(), u.data(), static_cast<int64_t>(g.size()), a});
  return g;
}

// Same value, NaN-ness or sign of zero included.
bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

TEST(Glu, ReferenceMatchesSigmoidFormInLongDouble) {
  // The reference's formulas (0.5·x·(1 + tanh y), x/(1 + e^−x)) against x·σ(z) in long double: within the rounding to
  // float32 (ε·|r|) plus the float64 cancellation term of the bound.
  auto rng = test::make_rng(9200);
  for (GluActivation a : {GluActivation::kSiLU, GluActivation::kGeluTanh}) {
    SCOPED_TRACE(act_name(a));
    const std::vector<float> x = draw_x(rng, 20001), u = draw_u(rng, 20001);
    const std::vector<float> r = run(kernels::ref_kernels(), x, u, a);
    for (size_t i = 0; i < x.size(); ++i) {
      const long double z = a == GluActivation::kSiLU
                                ? static_cast<long double>(x[i])
                                : 2.0L * std::sqrt(2.0L / 3.14159265358979323846264L) *
                                      (static_cast<long double>(x[i]) + 0.044715L * x[i] * x[i] * static_cast<long double>(x[i]));
      const long double want = static_cast<long double>(x[i]) / (1.0L + std::exp(-z)) * u[i];
      const double tol = std::ldexp(std::fabs(static_cast<double>(want)), -24) +
                         std::ldexp(std::fabs(static_cast<double>(x[i]) * u[i]), -52) + std::ldexp(1.0, -149);
      ASSERT_FALSE(std::isnan(r[i])) << i;
      ASSERT_LE(std::fabs(static_cast<double>(r[i]) - static_cast<double>(want)), tol)
          << "x " << x[i] << " u " << u[i] << " ref " << r[i] << " long double " << static_cast<double>(want);
    }
  }
}

TEST(Glu, EveryLevelMatchesReference) {
  auto rng = test::make_rng(9201);
  const int64_t counts[] = {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 67, 129, 1001, 4099, 100003};
  for (IsaLevel level : supported_isas()) {
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    SCOPED_TRACE(t.name);
    for (GluActivation a : {GluActivation::kSiLU, GluActivation::kGeluTanh}) {
      SCOPED_TRACE(act_name(a));
      double worst = 0.0;  // the largest |fast − ref| / bound seen (printed on failure)
      for (int64_t n : counts) {
        SCOPED_TRACE(::testing::Message() << "count " << n);
        const std::vector<float> x = draw_x(rng, static_cast<size_t>(n)), u = draw_u(rng, static_cast<size_t>(n));
        const std::vector<float> want = run(kernels::ref_kernels(), x, u, a);
        // g in a guarded buffer: nothing written outside [0, n).
        test::GuardedBuffer buf(static_cast<size_t>(n) * sizeof(float));
        std::memcpy(buf.data(), x.data(), buf.nbytes());
        t.glu({buf.as<float>(), u.data(), n, a});
        ASSERT_TRUE(buf.canaries_intact());
        const float* got = buf.as<float>();
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = static_cast<size_t>(i);
          const double tol = bound(x[k], u[k], want[k], a), err = std::fabs(double{got[k]} - double{want[k]});
          ASSERT_FALSE(std::isnan(got[k])) << "at " << i << ", x " << x[k] << " u " << u[k];
          ASSERT_LE(err, tol) << "at " << i << ", x " << x[k] << " u " << u[k] << ": got " << got[k] << ", reference "
                              << want[k] << " (worst so far " << worst << " of the bound)";
          worst = std::max(worst, err / tol);
        }
      }
      RecordProperty(std::string(t.name) + "_" + act_name(a) + "_worst_of_bound", std::to_string(worst));
    }
  }
}

TEST(Glu, EdgeValuesAsTheReference) {
  // act(+inf) = +inf, act(−inf) = −0, NaN in → NaN out (in x or in u), the signs of zeros, x² overflowing float32 —
  // each at a vector position and in the tail, with u of both signs, 0, ±inf and NaN: bit for bit as the reference
  // (any NaN for a NaN).
  const float nan = std::numeric_limits<float>::quiet_NaN(), fmax = std::numeric_limits<float>::max();
  const float xs[] = {kInf, -kInf, nan, -nan, 0.0f, -0.0f, fmax, -fmax, 1e20f, -1e20f, 1e-45f, -1e-45f, 1.0f, -1.0f};
  const float us[] = {1.0f, -2.0f, 0.0f, -0.0f, kInf, -kInf, nan};
  EXPECT_TRUE(std::isnan(run(kernels::ref_kernels(), {nan}, {1.0f}, GluActivation::kSiLU)[0]));
  for (IsaLevel level : supported_isas()) {
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    SCOPED_TRACE(t.name);
    for (GluActivation a : {GluActivation::kSiLU, GluActivation::kGeluTanh})
      for (float xv : xs)
        for (float uv : us)
          for (size_t at : {size_t{0}, size_t{5}, size_t{16}, size_t{20}}) {
            std::vector<float> x(21, 0.5f), u(21, 1.0f);
            x[at] = xv;
            u[at] = uv;
            const std::vector<float> want = run(kernels::ref_kernels(), x, u, a), got = run(t, x, u, a);
            for (size_t i = 0; i < x.size(); ++i) {  // exact where x or u is ±inf, NaN or ±0, or x huge
              if (i == at && !(std::isfinite(xv) && xv != 0.0f && std::fabs(xv) < 1e19f && std::isfinite(uv) && uv != 0.0f)) {
                // u = ±inf where act(x) rounds to 0 in float32 (x subnormal, the negative tail): the fast levels
                // multiply that 0 by u (NaN) where the reference's float64 act(x)·u is still ±inf (kernel_table.h).
                const bool underflow_times_inf =
                    std::isinf(uv) && run(kernels::ref_kernels(), {xv}, {1.0f}, a)[0] == 0.0f && std::isnan(got[i]);
                EXPECT_TRUE(same(got[i], want[i]) || underflow_times_inf) << act_name(a) << " x " << xv << " u " << uv << " at " << at
                                                   << ": got " << got[i] << ", reference " << want[i];
              } else {
                EXPECT_LE(std::fabs(got[i] - want[i]), bound(x[i], u[i], want[i], a)) << "at " << i << ", x " << xv << " u " << uv;
              }
            }
          }
    // The limits themselves (the reference's contract): +inf·u, −0·u.
    for (GluActivation a : {GluActivation::kSiLU, GluActivation::kGeluTanh}) {
      const std::vector<float> r = run(t, {kInf, -kInf, -kInf}, {3.0f, 3.0f, -3.0f}, a);
      EXPECT_EQ(r[0], kInf);
      EXPECT_TRUE(r[1] == 0.0f && std::signbit(r[1]));
      EXPECT_TRUE(r[2] == 0.0f && !std::signbit(r[2]));
    }
  }
}

TEST(Glu, NothingReadOrWrittenPastCount) {
  // g and u end exactly at a page followed by an inaccessible one: a load or store past count faults.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto guarded = [&]() {
    void* p = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    EXPECT_EQ(mprotect(static_cast<char*>(p) + page, page, PROT_NONE), 0);
    return static_cast<char*>(p);
  };
  char* gp = guarded();
  char* up = guarded();
  auto rng = test::make_rng(9202);
  for (IsaLevel level : supported_isas()) {
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    SCOPED_TRACE(t.name);
    for (int64_t n = 0; n <= 40; ++n)
      for (GluActivation a : {GluActivation::kSiLU, GluActivation::kGeluTanh}) {
        float* g = reinterpret_cast<float*>(gp + page) - n;
        float* u = reinterpret_cast<float*>(up + page) - n;
        const std::vector<float> x = test::randn(rng, static_cast<size_t>(n) + 1, 3.0f);
        const std::vector<float> uu = test::randn(rng, static_cast<size_t>(n) + 1, 1.0f);
        std::memcpy(g, x.data(), static_cast<size_t>(n) * sizeof(float));
        std::memcpy(u, uu.data(), static_cast<size_t>(n) * sizeof(float));
        t.glu({g, u, n, a});
        std::vector<float> want(x.begin(), x.begin() + n);
        kernels::ref_kernels().glu({want.data(), u, n, a});
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = static_cast<size_t>(i);
          EXPECT_LE(std::fabs(g[i] - want[k]), bound(x[k], u[i], want[k], a)) << "count " << n << " at " << i;
        }
      }
  }
  munmap(gp, 2 * page);
  munmap(up, 2 * page);
}

}  // namespace
}  // namespace cider
