// cider's encoder into the GGUF block formats (quant/ggml_quantize.h), checked through the formats' own decoders:
// values already on a block's grid come back bit for bit (so requantizing a GGUF tensor into its own type is
// lossless), the least-squares fit is never worse in total than the plain rule of scaling by the largest value
// (written here independently, without any block bytes), importance weights lower the weighted error, and bad input
// is refused by name. GPTQ's error feedback: its factor against a float64 inverse, a diagonal second moment giving the
// weighted fit byte for byte, correlated inputs giving a lower output error than the fit alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_quantize.h"
#include "quant/gptq.h"
#include "support/test_support.h"

namespace cider {
namespace {

using quant::GgmlType;
using test::throws_code;

constexpr GgmlType kTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                               GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K};

const quant::GgmlBlockFormat& fmt(GgmlType t) { return *quant::ggml_block_format(static_cast<uint32_t>(t)); }

// x quantized by cider's encoder (with the importance weights, when given), as bytes.
std::vector<uint8_t> encode(GgmlType t, const std::vector<float>& x, const float* importance = nullptr) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> blocks(static_cast<size_t>(quant::ggml_row_bytes(fmt(t), n)));
  quant::ggml_quantize_row(t, x.data(), n, blocks.data(), importance);
  return blocks;
}

// Quantizes x with cider's encoder and decodes it with the format's decoder.
std::vector<float> round_trip(GgmlType t, const std::vector<float>& x, const float* importance = nullptr) {
  const quant::GgmlBlockFormat& f = fmt(t);
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<uint8_t> blocks = encode(t, x, importance);
  std::vector<float> y(x.size());
  for (int64_t b = 0; b < n / f.block_size; ++b)
    f.decode(blocks.data() + b * f.block_bytes, y.data() + b * f.block_size);
  return y;
}

float f16r(float v) { return f16_to_f32(f32_to_f16(v)); }
float clampr(float v, float lo, float hi) { return std::min(hi, std::max(lo, std::rint(v))); }

// The plain rule (no search), value by value, for comparison: symmetric types scale the largest-magnitude value to
// the negative end code (ggml's reference rule), affine types span [min, max], K-quant sub-scales are coded against
// the largest one. Returns the decoded values.
std::vector<float> max_rule(GgmlType t, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  auto sym = [](const float* v, int n, float lo, float* s_out) {  // d = ext / lo, unrounded
    float ext = 0.0f;
    for (int i = 0; i < n; ++i)
      if (std::fabs(v[i]) > std::fabs(ext)) ext = v[i];
    *s_out = ext / lo;
  };
  const int bs = fmt(t).block_size;
  for (size_t b0 = 0; b0 < x.size(); b0 += static_cast<size_t>(bs)) {
    const float* v = x.data() + b0;
    float* o = y.data() + b0;
    switch (t) {
      case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ5_0: {
        const float lo = t == GgmlType::kQ8_0 ? -127.0f : (t == GgmlType::kQ4_0 ? -8.0f : -16.0f);
        const float hi = t == GgmlType::kQ8_0 ? 127.0f : -lo - 1.0f;
        float d;
        sym(v, 32, lo, &d);
        d = f16r(d);
        for (int i = 0; i < 32; ++i) o[i] = d == 0.0f ? 0.0f : d * clampr(v[i] / d, lo, hi);
        break;
      }
      case GgmlType::kQ4_1: case GgmlType::kQ5_1: {
        const float qmax = t == GgmlType::kQ4_1 ? 15.0f : 31.0f;
        const float mn = *std::min_element(v, v + 32), mx = *std::max_element(v, v + 32);
        const float d = f16r((mx - mn) / qmax), m = f16r(mn);
        for (int i = 0; i < 32; ++i) o[i] = d == 0.0f ? m : d * clampr((v[i] - m) / d, 0.0f, qmax) + m;
        break;
      }
      case GgmlType::kQ4_K: {
        float s[8], mm[8];
        for (int j = 0; j < 8; ++j) {
          const float mn = std::min(0.0f, *std::min_element(v + 32 * j, v + 32 * j + 32));
          const float mx = *std::max_element(v + 32 * j, v + 32 * j + 32);
          s[j] = std::max(0.0f, (mx - mn) / 15.0f);
          mm[j] = -mn;
        }
        const float d = f16r(*std::max_element(s, s + 8) / 63.0f), dm = f16r(*std::max_element(mm, mm + 8) / 63.0f);
        for (int j = 0; j < 8; ++j) {
          const float dl = d * (d > 0 ? clampr(s[j] / d, 0, 63) : 0.0f);
          const float ml = dm * (dm > 0 ? clampr(mm[j] / dm, 0, 63) : 0.0f);
          for (int i = 32 * j; i < 32 * j + 32; ++i)
            o[i] = dl * (dl > 0 ? clampr((v[i] + ml) / dl, 0, 15) : 0.0f) - ml;
        }
        break;
      }
      case GgmlType::kQ6_K: {
        float s[16], smax = 0.0f;
        for (int j = 0; j < 16; ++j) {
          sym(v + 16 * j, 16, -32.0f, &s[j]);
          smax = std::max(smax, std::fabs(s[j]));
        }
        const float d = f16r(smax / 127.0f);
        for (int j = 0; j < 16; ++j) {
          const float dl = d * (d > 0 ? clampr(s[j] / d, -128, 127) : 0.0f);
          for (int i = 16 * j; i < 16 * j + 16; ++i) o[i] = dl * (dl != 0 ? clampr(v[i] / dl, -32, 31) : 0.0f);
        }
        break;
      }
      default: ADD_FAILURE() << "no rule";
    }
  }
  return y;
}

double sse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = static_cast<double>(a[i]) - b[i];
    s += e * e;
  }
  return s;
}

// Weight-like rows: normal, heavy-tailed (a few values 8× larger), uniform, tiny and large scales, all-zero and
// constant stretches, one value alone in its block.
std::vector<float> weight_row(std::mt19937_64& rng, int64_t n, int kind) {
  std::vector<float> x = test::randn(rng, static_cast<size_t>(n), kind == 3 ? 1e-3f : (kind == 4 ? 50.0f : 0.02f));
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::uniform_int_distribution<int64_t> pos(0, n - 1);
  switch (kind) {
    case 1: for (int i = 0; i < 8; ++i) x[static_cast<size_t>(pos(rng))] *= 8.0f; break;
    case 2: for (float& v : x) v = u(rng); break;
    case 5:
      std::fill(x.begin(), x.begin() + n / 2, 0.0f);
      std::fill(x.begin() + n / 2, x.begin() + 3 * n / 4, 0.0123f);
      break;
    case 6: std::fill(x.begin(), x.end(), 0.0f); x[static_cast<size_t>(pos(rng))] = -0.7f; break;
    default: break;
  }
  return x;
}

TEST(GgmlQuantize, NoWorseInTotalThanTheMaxRule) {
  auto rng = test::make_rng(2027);
  for (GgmlType t : kTypes) {
    for (int kind = 0; kind < 7; ++kind) {
      const int64_t n = 256 * 24;
      const std::vector<float> x = weight_row(rng, n, kind);
      const std::vector<float> ours = round_trip(t, x), plain = max_rule(t, x);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(std::isfinite(ours[i])) << fmt(t).name << " value " << i;
      const double e_ours = sse(x, ours), e_plain = sse(x, plain);
      EXPECT_LE(e_ours, e_plain) << fmt(t).name << " kind " << kind;
      // A grid of b bits over the data's range cannot be worse than one step per value: a garbled byte layout is.
      double ss = 0.0;
      for (float v : x) ss += static_cast<double>(v) * v;
      EXPECT_LE(e_ours, ss) << fmt(t).name << " kind " << kind;
      if (kind == 0) {
        const double rel = std::sqrt(e_ours / ss);
        const double bound = t == GgmlType::kQ8_0 ? 0.01 : (t == GgmlType::kQ6_K ? 0.03 : (
                             t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1 ? 0.06 : 0.12));
        EXPECT_LT(rel, bound) << fmt(t).name << ": relative RMS error " << rel;  // normal data: ≈ step / √12
        std::printf("%s normal rows: relative RMS error %.4f (max rule %.4f)\n", fmt(t).name, rel,
                    std::sqrt(e_plain / ss));
      }
    }
  }
}

// Values on a 32-block grid whose block uses an end code: re-encoded to the same values, bit for bit.
TEST(GgmlQuantize, ValuesOnTheGridComeBackBitForBit) {
  auto rng = test::make_rng(2028);
  std::uniform_real_distribution<float> scale(1e-4f, 0.1f);
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    const bool affine = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
    const int lo = t == GgmlType::kQ8_0 ? -127 : (t == GgmlType::kQ4_0 ? -8 : (t == GgmlType::kQ5_0 ? -16 : 0));
    const int hi = t == GgmlType::kQ8_0 ? 127 : (t == GgmlType::kQ4_1 ? 15 : (t == GgmlType::kQ5_1 ? 31 : -lo - 1));
    std::uniform_int_distribution<int> code(lo, hi);
    std::vector<float> x(32 * 64);
    for (int b = 0; b < 64; ++b) {
      const float d = f16r(scale(rng)), m = f16r(affine ? -scale(rng) * 5.0f : 0.0f);
      int q[32];
      for (int& c : q) c = code(rng);
      q[b % 32] = affine || b % 2 ? lo : hi;  // an end code in use (both ends for the affine grids)
      if (affine) q[(b + 7) % 32] = hi;
      for (int i = 0; i < 32; ++i)
        x[static_cast<size_t>(32 * b + i)] = affine ? d * static_cast<float>(q[i]) + m : d * static_cast<float>(q[i]);
    }
    const std::vector<float> y = round_trip(t, x);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(y[i], x[i]) << fmt(t).name << " value " << i << ": " << y[i] << " vs " << x[i];
  }
}

// A GGUF tensor requantized into its own K-quant type: decoding, re-encoding and decoding again reproduces the
// values of blocks whose largest sub-scale (and min) is coded 63 / ±127 and whose sub-blocks use their end codes —
// built here through the encoder itself from data on such a grid, then checked to be a fixed point.
TEST(GgmlQuantize, KQuantBlocksAreAFixedPoint) {
  auto rng = test::make_rng(2029);
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const std::vector<float> x = weight_row(rng, 256 * 32, 0);
    const std::vector<float> once = round_trip(t, x);
    const std::vector<float> twice = round_trip(t, once);
    // Not every block is exactly reproducible (a sub-block whose codes miss both ends is refitted), but the second
    // pass can only move a value within its own grid step: its error against the first is below the first's.
    EXPECT_LE(sse(once, twice), sse(x, once)) << fmt(t).name;
    int64_t same = 0;
    for (size_t i = 0; i < once.size(); ++i) same += f32_bits(once[i]) == f32_bits(twice[i]);
    EXPECT_GT(static_cast<double>(same), 0.9 * static_cast<double>(once.size())) << fmt(t).name;
  }
}

// Importance weights (the mean squared activation of each input channel, heavy-tailed as real ones are): the fits
// minimise the weighted error, so in total over many rows it is below the plain fit's weighted error.
TEST(GgmlQuantize, ImportanceLowersTheWeightedError) {
  auto rng = test::make_rng(2031);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t K = 256 * 4, rows = 48;
  std::vector<float> imp(static_cast<size_t>(K));
  for (float& v : imp) v = std::exp(2.0f * g(rng));
  for (GgmlType t : kTypes) {
    if (t == GgmlType::kQ8_0) continue;  // its plain rule always (checked below)
    double e_w = 0.0, e_plain = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> x = weight_row(rng, K, static_cast<int>(r % 7));
      const std::vector<float> yw = round_trip(t, x, imp.data()), yp = round_trip(t, x);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(yw[i])) << fmt(t).name << " value " << i;
        const double dw = static_cast<double>(x[i]) - yw[i], dp = static_cast<double>(x[i]) - yp[i];
        e_w += imp[i] * dw * dw;
        e_plain += imp[i] * dp * dp;
      }
    }
    EXPECT_LT(e_w, e_plain) << fmt(t).name;
    std::printf("%s: weighted error with importance %.3f of the plain fit's\n", fmt(t).name, e_w / e_plain);
  }
}

// Importance 1 everywhere is the plain fit, bit for bit, for the 32-blocks (the K-quants then also search their
// sub-scale codes: no worse); Q8_0 ignores importance; a block whose importances are all 0 gets its plain fit.
TEST(GgmlQuantize, ImportanceEdgeCasesAreThePlainFit) {
  auto rng = test::make_rng(2032);
  std::uniform_real_distribution<float> u(0.1f, 10.0f);
  const int64_t K = 256 * 2;
  const std::vector<float> ones(static_cast<size_t>(K), 1.0f);
  std::vector<float> imp(static_cast<size_t>(K));
  for (float& v : imp) v = u(rng);
  for (GgmlType t : kTypes) {
    const quant::GgmlBlockFormat& f = fmt(t);
    const std::vector<float> x = weight_row(rng, K, 1);
    const std::vector<uint8_t> plain = encode(t, x);
    if (f.block_size == 32) {
      EXPECT_EQ(encode(t, x, ones.data()), plain) << f.name;
    } else {  // a K-quant with weights also searches its sub-scale codes' neighbours: never worse than the nearest
      EXPECT_LE(sse(x, round_trip(t, x, ones.data())), sse(x, round_trip(t, x))) << f.name;
    }
    if (t == GgmlType::kQ8_0) {
      EXPECT_EQ(encode(t, x, imp.data()), plain) << f.name;
    }
    std::vector<float> zero_first = imp;  // the first block's importances all 0
    std::fill(zero_first.begin(), zero_first.begin() + f.block_size, 0.0f);
    const std::vector<uint8_t> z = encode(t, x, zero_first.data());
    EXPECT_TRUE(std::equal(z.begin(), z.begin() + f.block_bytes, plain.begin())) << f.name;
  }
}

TEST(GgmlQuantize, RefusesBadInputByName) {
  std::vector<float> x(64, 0.5f);
  std::vector<uint8_t> out(4096);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row(GgmlType::kQ4_0, x.data(), 64, out.data()); },
                          ErrorCode::kInvalidArgument, "value 5 is nan"));
  x[5] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row(GgmlType::kQ8_0, x.data(), 64, out.data()); },
                          ErrorCode::kInvalidArgument, "finite"));
  x[5] = 0.5f;
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row(GgmlType::kQ4_K, x.data(), 64, out.data()); },
                          ErrorCode::kShapeMismatch, "multiple of 256"));
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row(GgmlType::kQ3_K, x.data(), 64, out.data()); },
                          ErrorCode::kUnsupported, "no encoder"));
  std::vector<float> imp(64, 1.0f);
  imp[9] = -1.0f;
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row(GgmlType::kQ4_0, x.data(), 64, out.data(), imp.data()); },
                          ErrorCode::kInvalidArgument, "importance 9 is -1"));
  imp[9] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row(GgmlType::kQ4_1, x.data(), 64, out.data(), imp.data()); },
                          ErrorCode::kInvalidArgument, "finite and >= 0"));
  EXPECT_FALSE(quant::ggml_can_quantize(GgmlType::kQ2_K));
  for (GgmlType t : kTypes) EXPECT_TRUE(quant::ggml_can_quantize(t)) << fmt(t).name;
}

// Inputs with correlated channels (x = z·A, z standard normal, A a random mixing with a few large channels): the
// second moment H = AᵀA (exact, float64 → float).
std::vector<float> correlated_second_moment(std::mt19937_64& rng, int64_t K) {
  std::normal_distribution<double> g(0.0, 1.0);
  std::vector<double> A(static_cast<size_t>(K * K));
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j)
      A[static_cast<size_t>(i * K + j)] = (i == j ? 1.0 : 0.0) + 0.35 * g(rng) * (j % 9 == 0 ? 4.0 : 1.0);
  std::vector<float> H(static_cast<size_t>(K * K));
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) {
      double s = 0.0;
      for (int64_t t = 0; t < K; ++t) s += A[static_cast<size_t>(t * K + i)] * A[static_cast<size_t>(t * K + j)];
      H[static_cast<size_t>(i * K + j)] = static_cast<float>(s);
    }
  return H;
}

// (w − ŵ) H (w − ŵ)ᵀ in float64: the expected squared output error of one row.
double output_error(const std::vector<float>& w, const std::vector<float>& y, const std::vector<float>& H) {
  const size_t K = w.size();
  double e = 0.0;
  for (size_t i = 0; i < K; ++i)
    for (size_t j = 0; j < K; ++j)
      e += (static_cast<double>(w[i]) - y[i]) * H[i * K + j] * (static_cast<double>(w[j]) - y[j]);
  return e;
}

std::vector<float> decode_row(GgmlType t, const std::vector<uint8_t>& blocks, int64_t n) {
  const quant::GgmlBlockFormat& f = fmt(t);
  std::vector<float> y(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / f.block_size; ++b) f.decode(blocks.data() + b * f.block_bytes, y.data() + b * f.block_size);
  return y;
}

std::vector<uint8_t> encode_gptq(GgmlType t, std::vector<float> x, const std::vector<float>& U,
                                 const float* importance) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> blocks(static_cast<size_t>(quant::ggml_row_bytes(fmt(t), n)));
  quant::ggml_quantize_row_gptq(t, x.data(), n, U.data(), blocks.data(), importance);
  return blocks;
}

// The factor: Uᵀ U = (H + λ·mean(diag)·I)⁻¹, U upper, against a float64 Gauss-Jordan inverse, every element; the
// tolerance: float32 output (2⁻²⁴ relative) times the damped matrix's condition (≤ 1 + max eig / (λ·mean diag)).
TEST(Gptq, FactorIsTheCholeskyOfTheDampedInverse) {
  auto rng = test::make_rng(2041);
  for (const int64_t K : {1, 7, 64, 200}) {
    const std::vector<float> H = correlated_second_moment(rng, K);
    const double damp = 0.01;
    const std::vector<float> U = quant::gptq_factor(H.data(), K, damp);
    ASSERT_EQ(static_cast<int64_t>(U.size()), K * K);
    double mean = 0.0, trace = 0.0;
    for (int64_t i = 0; i < K; ++i) mean += H[static_cast<size_t>(i * K + i)];
    trace = mean;
    mean /= static_cast<double>(K);
    // Gauss-Jordan on [A | I], A = H + λ·mean·I, partial pivoting, float64.
    const auto k = static_cast<size_t>(K);
    std::vector<double> A(k * k), inv(k * k, 0.0);
    for (size_t i = 0; i < k * k; ++i) A[i] = H[i];
    for (size_t i = 0; i < k; ++i) {
      A[i * k + i] += damp * mean;
      inv[i * k + i] = 1.0;
    }
    for (size_t c = 0; c < k; ++c) {
      size_t p = c;
      for (size_t r = c + 1; r < k; ++r)
        if (std::fabs(A[r * k + c]) > std::fabs(A[p * k + c])) p = r;
      for (size_t j = 0; j < k; ++j) {
        std::swap(A[c * k + j], A[p * k + j]);
        std::swap(inv[c * k + j], inv[p * k + j]);
      }
      const double d = A[c * k + c];
      for (size_t j = 0; j < k; ++j) {
        A[c * k + j] /= d;
        inv[c * k + j] /= d;
      }
      for (size_t r = 0; r < k; ++r)
        if (r != c) {
          const double f = A[r * k + c];
          for (size_t j = 0; j < k; ++j) {
            A[r * k + j] -= f * A[c * k + j];
            inv[r * k + j] -= f * inv[c * k + j];
          }
        }
    }
    const double cond = 1.0 + trace / (damp * mean);  // trace ≥ the largest eigenvalue
    double max_inv = 0.0;
    for (const double v : inv) max_inv = std::max(max_inv, std::fabs(v));
    const double tol = 8.0 * static_cast<double>(K) * std::ldexp(1.0, -24) * cond * max_inv;
    for (size_t i = 0; i < k; ++i)
      for (size_t j = 0; j < k; ++j) {
        if (i > j) {
          ASSERT_EQ(U[i * k + j], 0.0f) << "K " << K << " below the diagonal (" << i << ", " << j << ")";
          continue;
        }
        double s = 0.0;
        for (size_t t = 0; t <= i; ++t) s += static_cast<double>(U[t * k + i]) * U[t * k + j];
        ASSERT_NEAR(s, inv[i * k + j], tol) << "K " << K << " (" << i << ", " << j << ")";
      }
  }
}

// A diagonal second moment has nothing to spread an error over: GPTQ gives the importance-weighted fit with that
// diagonal, byte for byte, for every type.
TEST(Gptq, DiagonalSecondMomentIsTheWeightedFit) {
  auto rng = test::make_rng(2042);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t K = 512;
  std::vector<float> H(static_cast<size_t>(K * K), 0.0f), diag(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) H[static_cast<size_t>(i * K + i)] = diag[static_cast<size_t>(i)] = std::exp(g(rng));
  const std::vector<float> U = quant::gptq_factor(H.data(), K);
  for (GgmlType t : kTypes)
    for (int kind = 0; kind < 7; ++kind) {
      const std::vector<float> x = weight_row(rng, K, kind);
      EXPECT_EQ(encode_gptq(t, x, U, diag.data()), encode(t, x, diag.data())) << fmt(t).name << " kind " << kind;
    }
}

// Correlated inputs: the rows coded with error feedback have a lower expected output error (w − ŵ) H (w − ŵ)ᵀ than
// the weighted fit alone, summed over rows, for every type; values decode finite.
TEST(Gptq, ErrorFeedbackLowersTheOutputError) {
  auto rng = test::make_rng(2043);
  const int64_t K = 512, rows = 24;
  const std::vector<float> H = correlated_second_moment(rng, K);
  std::vector<float> diag(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) diag[static_cast<size_t>(i)] = H[static_cast<size_t>(i * K + i)];
  const std::vector<float> U = quant::gptq_factor(H.data(), K);
  for (GgmlType t : kTypes) {
    double e_gptq = 0.0, e_fit = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> x = weight_row(rng, K, static_cast<int>(r % 3));
      const std::vector<float> yg = decode_row(t, encode_gptq(t, x, U, diag.data()), K);
      for (size_t i = 0; i < yg.size(); ++i) ASSERT_TRUE(std::isfinite(yg[i])) << fmt(t).name << " value " << i;
      e_gptq += output_error(x, yg, H);
      e_fit += output_error(x, round_trip(t, x, diag.data()), H);
    }
    EXPECT_LT(e_gptq, 0.9 * e_fit) << fmt(t).name;
    std::printf("%s: output error with GPTQ %.3f of the weighted fit's\n", fmt(t).name, e_gptq / e_fit);
  }
}

TEST(Gptq, RefusesBadInputByName) {
  std::vector<float> H = {4.0f, 1.0f, 1.0f, 3.0f};
  EXPECT_TRUE(throws_code([&] { (void)quant::gptq_factor(H.data(), 2, 0.0); }, ErrorCode::kInvalidArgument,
                          "damp must be in (0, 1]"));
  H[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_code([&] { (void)quant::gptq_factor(H.data(), 2); }, ErrorCode::kInvalidArgument,
                          "value (0, 1) is nan"));
  H = {-1.0f, 0.0f, 0.0f, 1.0f};
  EXPECT_TRUE(throws_code([&] { (void)quant::gptq_factor(H.data(), 2); }, ErrorCode::kInvalidArgument,
                          "diagonal value 0 is -1"));
  H = {1.0f, 2.0f, 2.0f, 1.0f};  // eigenvalues 3 and −1: not a second moment
  EXPECT_TRUE(throws_code([&] { (void)quant::gptq_factor(H.data(), 2); }, ErrorCode::kInvalidArgument,
                          "not positive definite"));
  std::vector<float> x(64, 0.5f), U(64 * 64, 0.0f);
  for (int i = 0; i < 64; ++i) U[static_cast<size_t>(i * 64 + i)] = 1.0f;
  std::vector<uint8_t> out(4096);
  x[3] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row_gptq(GgmlType::kQ4_1, x.data(), 64, U.data(), out.data()); },
                          ErrorCode::kInvalidArgument, "ggml_quantize_row_gptq"));
  x[3] = 0.5f;
  EXPECT_TRUE(throws_code([&] { quant::ggml_quantize_row_gptq(GgmlType::kQ4_K, x.data(), 64, U.data(), out.data()); },
                          ErrorCode::kShapeMismatch, "multiple of 256"));
}

}  // namespace
}  // namespace cider
