// Symmetric INT8 / INT4 quantizers: every code against a float64 model (|w − q·s| ≤ s/2), scales exactly as defined,
// the clip percentile against an independent sort, int4 nibbles against a bit-level reference, per-token activation
// quantization including non-finite rows, and one test per rejection.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "quant/int4.h"
#include "quant/int8.h"
#include "support/test_support.h"

namespace cider {
namespace {

const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Values stored in a float dtype, plus the exact float32 values those bytes hold (what the quantizer sees).
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  DType dtype;
  TensorView view(std::initializer_list<int64_t> shape) const { return TensorView(bytes.data(), dtype, shape); }
};

Stored store(const std::vector<float>& v, DType t) {
  Stored s{test::to_dtype_bytes(v, t), {}, t};
  s.values = test::from_dtype_bytes(s.bytes.data(), t, v.size());
  return s;
}

// Random [rows, cols] values whose rows differ in magnitude by up to 2^±6 (real weights do), with row `zero_row`
// (if in range) all zeros to exercise the "scale 0 becomes 1" rule.
std::vector<float> random_rows(std::mt19937_64& rng, int64_t rows, int64_t cols, int64_t zero_row = -1) {
  std::vector<float> v = test::randn(rng, static_cast<size_t>(rows * cols));
  std::uniform_real_distribution<float> expo(-6.0f, 6.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float mag = r == zero_row ? 0.0f : std::exp2(expo(rng));
    for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(r * cols + c)] *= mag;
  }
  return v;
}

// |w − q·s| for a value inside the clipping range: half a step, plus the float32 rounding of w/s (at most
// (qmax + 1)·2^-24 in units of s) that can move rint across a half-way point.
double half_step_bound(double s, int qmax) { return s * (0.5 + (qmax + 1) * 0x1p-24); }

// Independent int4 decoding: the nibble as a remainder / quotient of the byte, not as a mask / shift.
int nibble_code(const uint8_t* packed, int64_t K, int64_t n, int64_t k) {
  const unsigned byte = packed[n * (K / 2) + k / 2];
  const unsigned nibble = (k % 2 == 0) ? byte % 16u : byte / 16u;
  return static_cast<int>(nibble) - 8;
}

// The sorted-order-statistics percentile of |v| (NumPy 'linear'), written as a weighted mean of the neighbours.
double percentile_reference(const std::vector<float>& v, double p) {
  std::vector<double> a;
  for (float x : v) a.push_back(std::fabs(static_cast<double>(x)));
  std::sort(a.begin(), a.end());
  const double h = p / 100.0 * static_cast<double>(a.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(h));
  if (i + 1 >= a.size()) return a.back();
  const double f = h - static_cast<double>(i);
  return a[i] * (1.0 - f) + a[i + 1] * f;
}

// Checks one block of values sharing scale s: the scale is max|w|/qmax exactly (1 for an all-zero block), every
// code is in range and within half a step, and the largest value gets ±qmax.
template <typename CodeAt>
::testing::AssertionResult check_block(const float* w, int64_t n, float s, int qmin, int qmax, CodeAt code_at) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  const float want_s = amax == 0.0f ? 1.0f : amax / static_cast<float>(qmax);
  if (s != want_s) return ::testing::AssertionFailure() << "scale " << s << ", want " << want_s;
  for (int64_t i = 0; i < n; ++i) {
    const int q = code_at(i);
    if (q < qmin || q > qmax) return ::testing::AssertionFailure() << "element " << i << " code " << q;
    const double err = std::fabs(static_cast<double>(w[i]) - q * static_cast<double>(s));
    if (!(err <= half_step_bound(s, qmax)))
      return ::testing::AssertionFailure() << "element " << i << ": w " << w[i] << ", q " << q << ", s " << s
                                           << ", |w - q s| " << err << " > " << half_step_bound(s, qmax);
    if (amax > 0.0f && std::fabs(w[i]) == amax && std::abs(q) != qmax)
      return ::testing::AssertionFailure() << "element " << i << " is the block maximum but has code " << q;
  }
  return ::testing::AssertionSuccess();
}

// ---- INT8 weights ----------------------------------------------------------------------------------------------

TEST(Int8Weights, PerChannelCodesWithinHalfStepOverShapesAndDtypes) {
  auto rng = test::make_rng(101);
  int variant = 0;
  for (DType t : kFloatTypes) {
    for (int64_t N : {1, 7, 33}) {
      for (int64_t K : {1, 7, 33, 67, 129, 4097}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " N " << N << " K " << K);
        Stored w = store(random_rows(rng, N, K, variant++ % 3 == 0 ? N / 2 : -1), t);
        quant::Int8Weights q = quant::quantize_int8_weights(w.view({N, K}), 0);
        ASSERT_EQ(q.group_size, 0);
        ASSERT_EQ(q.q.shape, (std::vector<int64_t>{N, K}));
        ASSERT_EQ(q.scales.shape, (std::vector<int64_t>{N}));
        ASSERT_EQ(q.q.dtype, DType::kI8);
        ASSERT_EQ(q.scales.dtype, DType::kF32);
        for (int64_t n = 0; n < N; ++n) {
          const int8_t* codes = q.q.ptr<int8_t>() + n * K;
          ASSERT_TRUE(check_block(w.values.data() + n * K, K, q.scales.ptr<float>()[n], -127, 127,
                                  [&](int64_t k) { return static_cast<int>(codes[k]); }))
              << "row " << n;
        }
      }
    }
  }
}

TEST(Int8Weights, PerGroupScalesAreTransposedAndCodesWithinHalfStep) {
  auto rng = test::make_rng(102);
  int variant = 0;
  for (int gs : {64, 128, 256}) {
    for (int64_t K : {static_cast<int64_t>(gs), 3 * static_cast<int64_t>(gs), int64_t{4096}}) {
      for (int64_t N : {1, 7, 33}) {
        const DType t = kFloatTypes[variant++ % 3];
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " gs " << gs << " N " << N << " K " << K);
        std::vector<float> v = random_rows(rng, N, K);
        // One all-zero group in the last row: its scale must be 1 and its codes 0, neighbours unaffected.
        if (K > gs) std::fill(v.end() - gs, v.end(), 0.0f);
        Stored w = store(v, t);
        quant::Int8Weights q = quant::quantize_int8_weights(w.view({N, K}), gs);
        ASSERT_EQ(q.group_size, gs);
        ASSERT_EQ(q.scales.shape, (std::vector<int64_t>{K / gs, N}));
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t g = 0; g < K / gs; ++g) {
            const int8_t* codes = q.q.ptr<int8_t>() + n * K + g * gs;
            ASSERT_TRUE(check_block(w.values.data() + n * K + g * gs, gs, q.scales.ptr<float>()[g * N + n], -127,
                                    127, [&](int64_t k) { return static_cast<int>(codes[k]); }))
                << "row " << n << " group " << g;
          }
        }
      }
    }
  }
}

TEST(Int8Weights, RoundsHalfToEven) {
  // max 127 gives scale exactly 1, so w/s is w and the .5 cases are exact ties.
  const std::vector<float> w = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f};
  quant::Int8Weights q = quant::quantize_int8_weights(TensorView(w.data(), DType::kF32, {1, 8}), 0);
  EXPECT_EQ(q.scales.ptr<float>()[0], 1.0f);
  const std::vector<int8_t> want = {127, 0, 2, 2, 0, -2, -2, 126};
  EXPECT_EQ(std::vector<int8_t>(q.q.ptr<int8_t>(), q.q.ptr<int8_t>() + 8), want);
}

TEST(Int8Weights, AbsPercentileInterpolatesBetweenOrderStatistics) {
  std::vector<float> v = {5, 1, 4, 2, 3};
  EXPECT_EQ(quant::abs_percentile(v.data(), 5, 50.0), 3.0f);
  v = {5, 1, 4, 2, 3};
  EXPECT_FLOAT_EQ(quant::abs_percentile(v.data(), 5, 90.0), 4.6f);  // h = 3.6: 4 + 0.6·(5 − 4)
  v = {5, 1, 4, 2, 3};
  EXPECT_EQ(quant::abs_percentile(v.data(), 5, 100.0), 5.0f);
  v = {5, 1, 4, 2, 3};
  EXPECT_FLOAT_EQ(quant::abs_percentile(v.data(), 5, 10.0), 1.4f);  // h = 0.4
  v = {2.5f};
  EXPECT_EQ(quant::abs_percentile(v.data(), 1, 37.0), 2.5f);
}

TEST(Int8Weights, ClipPercentileClampsBeyondThresholdAndKeepsTheRestWithinHalfStep) {
  auto rng = test::make_rng(103);
  for (DType t : kFloatTypes) {
    for (int64_t K : {7, 67, 129, 4097}) {
      const int64_t N = 7;
      // A few outlier channels 40x larger: exactly what clipping is for.
      Stored w = store(test::randn_with_outlier_channels(rng, static_cast<size_t>(N), static_cast<size_t>(K), 40.0f,
                                                         2),
                       t);
      quant::Int8Weights unclipped = quant::quantize_int8_weights(w.view({N, K}), 0);
      for (float p : {50.0f, 90.0f, 99.5f, 100.0f}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " K " << K << " p " << p);
        quant::Int8Weights q = quant::quantize_int8_weights(w.view({N, K}), 0, p);
        for (int64_t n = 0; n < N; ++n) {
          std::vector<float> row(w.values.begin() + n * K, w.values.begin() + (n + 1) * K);
          const double thr = percentile_reference(row, p);
          const float s = q.scales.ptr<float>()[n];
          // The threshold is computed once in float64 and rounded to float32, so scale = float(thr)/127 up to the
          // last bit of float(thr).
          ASSERT_NEAR(s, static_cast<double>(static_cast<float>(thr)) / 127.0, 0x1p-22 * s) << "row " << n;
          for (int64_t k = 0; k < K; ++k) {
            const int q_k = q.q.ptr<int8_t>()[n * K + k];
            const double v = row[static_cast<size_t>(k)];
            ASSERT_LE(std::abs(q_k), 127);
            const double clipped = std::clamp(v, -thr, thr);
            ASSERT_LE(std::fabs(clipped - q_k * static_cast<double>(s)), half_step_bound(s, 127) + 0x1p-22 * thr)
                << "row " << n << " k " << k << " w " << v;
            if (std::fabs(v) >= thr) {
              ASSERT_EQ(q_k, v > 0 ? 127 : -127) << "row " << n << " k " << k;
            }
          }
        }
        if (p == 100.0f) {
          // The 100th percentile is the maximum: identical to no clipping.
          EXPECT_EQ(std::memcmp(q.q.ptr<int8_t>(), unclipped.q.ptr<int8_t>(), static_cast<size_t>(N * K)), 0);
          EXPECT_EQ(std::memcmp(q.scales.ptr<float>(), unclipped.scales.ptr<float>(), sizeof(float) * N), 0);
        } else if (K >= 67) {
          // With outliers present, a lower percentile means a finer step for every row — unless the order
          // statistics it interpolates between are tied with the maximum (bf16/f16 rounding can make the two
          // outliers equal), when the threshold is the maximum itself and the step stays the same.
          for (int64_t n = 0; n < N; ++n) {
            std::vector<float> row(w.values.begin() + n * K, w.values.begin() + (n + 1) * K);
            double max_abs = 0;
            for (float v : row) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
            if (static_cast<float>(percentile_reference(row, p)) < static_cast<float>(max_abs)) {
              EXPECT_LT(q.scales.ptr<float>()[n], unclipped.scales.ptr<float>()[n]) << "row " << n;
            } else {
              EXPECT_EQ(q.scales.ptr<float>()[n], unclipped.scales.ptr<float>()[n]) << "row " << n;
            }
          }
        }
      }
    }
  }
}

TEST(Int8Weights, ClipPercentileWithZeroThresholdGivesScaleOneAndZeroCodes) {
  // 60 zeros and 7 non-zeros: the 50th percentile of |w| is 0, every value clamps to 0.
  std::vector<float> w(67, 0.0f);
  for (int i = 0; i < 7; ++i) w[static_cast<size_t>(i * 9)] = static_cast<float>(i + 1);
  quant::Int8Weights q = quant::quantize_int8_weights(TensorView(w.data(), DType::kF32, {1, 67}), 0, 50.0f);
  EXPECT_EQ(q.scales.ptr<float>()[0], 1.0f);
  for (int64_t k = 0; k < 67; ++k) ASSERT_EQ(q.q.ptr<int8_t>()[k], 0) << k;
}

// ---- INT8 activations ------------------------------------------------------------------------------------------

TEST(Int8Activations, PerTokenScalesAndCodesWithinHalfStep) {
  auto rng = test::make_rng(104);
  for (DType t : kFloatTypes) {
    for (int64_t M : {1, 2, 7, 33}) {
      for (int64_t K : {1, 7, 33, 67, 129, 4097}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " M " << M << " K " << K);
        Stored x = store(random_rows(rng, M, K, M > 2 ? 1 : -1), t);
        quant::Int8Activations a = quant::quantize_int8_activations(x.view({M, K}));
        ASSERT_EQ(a.q.shape, (std::vector<int64_t>{M, K}));
        ASSERT_EQ(a.scales.shape, (std::vector<int64_t>{M}));
        for (int64_t m = 0; m < M; ++m) {
          const int8_t* codes = a.q.ptr<int8_t>() + m * K;
          ASSERT_TRUE(check_block(x.values.data() + m * K, K, a.scales.ptr<float>()[m], -127, 127,
                                  [&](int64_t k) { return static_cast<int>(codes[k]); }))
              << "row " << m;
        }
      }
    }
  }
}

TEST(Int8Activations, RoundsHalfToEven) {
  // max 127 gives sx exactly 1, so the .5 cases are exact ties.
  const std::vector<float> x = {-127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f};
  for (DType t : kFloatTypes) {
    Stored xs = store(x, t);
    int8_t q[8];
    EXPECT_EQ(quant::quantize_int8_row(xs.bytes.data(), t, 8, q), 1.0f) << dtype_name(t);
    const std::vector<int8_t> want = {-127, 0, 2, 2, 0, -2, -2, 126};
    EXPECT_EQ(std::vector<int8_t>(q, q + 8), want) << dtype_name(t);
  }
}

TEST(Int8Activations, LeadingDimensionsFlattenToTokens) {
  auto rng = test::make_rng(105);
  Stored x = store(test::randn(rng, 2 * 3 * 33), DType::kBF16);
  quant::Int8Activations a = quant::quantize_int8_activations(x.view({2, 3, 33}));
  ASSERT_EQ(a.q.shape, (std::vector<int64_t>{6, 33}));
  for (int64_t m = 0; m < 6; ++m) {
    int8_t q_row[33];
    const float s = quant::quantize_int8_row(x.bytes.data() + m * 33 * 2, DType::kBF16, 33, q_row);
    EXPECT_EQ(s, a.scales.ptr<float>()[m]);
    EXPECT_EQ(std::memcmp(q_row, a.q.ptr<int8_t>() + m * 33, 33), 0);
  }
}

TEST(Int8Activations, RowWithNaNOrInfGetsNaNScaleAndZeroCodes) {
  auto rng = test::make_rng(106);
  const int64_t M = 5, K = 67;
  std::vector<float> x = test::randn(rng, M * K);
  x[1 * K + 3] = std::numeric_limits<float>::quiet_NaN();
  x[2 * K + 66] = std::numeric_limits<float>::infinity();
  x[3 * K + 0] = -std::numeric_limits<float>::infinity();
  for (DType t : kFloatTypes) {
    Stored xs = store(x, t);
    quant::Int8Activations a = quant::quantize_int8_activations(xs.view({M, K}));
    for (int64_t m = 0; m < M; ++m) {
      const float s = a.scales.ptr<float>()[m];
      if (m >= 1 && m <= 3) {
        EXPECT_TRUE(std::isnan(s)) << dtype_name(t) << " row " << m;
        for (int64_t k = 0; k < K; ++k) ASSERT_EQ(a.q.ptr<int8_t>()[m * K + k], 0);
      } else {
        EXPECT_TRUE(std::isfinite(s) && s > 0.0f) << dtype_name(t) << " row " << m;
      }
    }
  }
}

// ---- INT4 weights ----------------------------------------------------------------------------------------------

TEST(Int4Weights, CodesWithinHalfStepPerChannelAndPerGroup) {
  auto rng = test::make_rng(107);
  int variant = 0;
  for (int gs : {0, 32, 64, 128, 256}) {
    std::vector<int64_t> Ks = gs == 0 ? std::vector<int64_t>{2, 8, 34, 68, 130, 4098}
                                      : std::vector<int64_t>{gs, 3 * static_cast<int64_t>(gs), 4096};
    for (int64_t K : Ks) {
      for (int64_t N : {1, 7, 33}) {
        const DType t = kFloatTypes[variant++ % 3];
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " gs " << gs << " N " << N << " K " << K);
        Stored w = store(random_rows(rng, N, K, N > 1 ? N - 1 : -1), t);
        quant::Int4Weights q = quant::quantize_int4_weights(w.view({N, K}), gs);
        ASSERT_EQ(q.group_size, gs);
        ASSERT_EQ(q.packed.dtype, DType::kU8);
        ASSERT_EQ(q.packed.shape, (std::vector<int64_t>{N, K / 2}));
        ASSERT_EQ(q.scales.shape, (gs == 0 ? std::vector<int64_t>{N} : std::vector<int64_t>{K / gs, N}));
        const int64_t span = gs == 0 ? K : gs;
        const uint8_t* packed = q.packed.ptr<uint8_t>();
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t g = 0; g < K / span; ++g) {
            const float s = q.scales.ptr<float>()[gs == 0 ? n : g * N + n];
            ASSERT_TRUE(check_block(w.values.data() + n * K + g * span, span, s, -8, 7,
                                    [&](int64_t k) { return nibble_code(packed, K, n, g * span + k); }))
                << "row " << n << " group " << g;
          }
        }
      }
    }
  }
}

TEST(Int4Weights, PackingMatchesBitLevelReference) {
  auto rng = test::make_rng(108);
  const int64_t N = 7, K = 130;
  // Codes chosen first; each row holds a ±7 so its scale is exactly 1 and w = code is reproduced exactly.
  std::vector<int> codes(static_cast<size_t>(N * K));
  std::uniform_int_distribution<int> pick(-7, 7);
  for (auto& c : codes) c = pick(rng);
  for (int64_t n = 0; n < N; ++n) codes[static_cast<size_t>(n * K + (n * 13) % K)] = (n % 2) ? -7 : 7;
  std::vector<float> w(codes.begin(), codes.end());
  quant::Int4Weights q = quant::quantize_int4_weights(TensorView(w.data(), DType::kF32, {N, K}), 0);
  for (int64_t n = 0; n < N; ++n) ASSERT_EQ(q.scales.ptr<float>()[n], 1.0f);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < K / 2; ++i) {
      // Byte i: bits 0-3 hold code(2i) + 8, bits 4-7 hold code(2i + 1) + 8.
      unsigned want = 0;
      const int lo = codes[static_cast<size_t>(n * K + 2 * i)] + 8;
      const int hi = codes[static_cast<size_t>(n * K + 2 * i + 1)] + 8;
      for (int b = 0; b < 4; ++b) {
        if ((lo >> b) & 1) want |= 1u << b;
        if ((hi >> b) & 1) want |= 1u << (b + 4);
      }
      ASSERT_EQ(q.packed.ptr<uint8_t>()[n * (K / 2) + i], want) << "row " << n << " byte " << i;
    }
  }
}

TEST(Int4Weights, PackAndDecodeEveryNibblePair) {
  std::vector<int8_t> codes;
  for (int hi = -8; hi <= 7; ++hi)
    for (int lo = -8; lo <= 7; ++lo) {
      codes.push_back(static_cast<int8_t>(lo));
      codes.push_back(static_cast<int8_t>(hi));
    }
  std::vector<uint8_t> packed(codes.size() / 2 + 1, 0xA5);  // one canary byte
  quant::pack_int4(codes.data(), static_cast<int64_t>(codes.size()), packed.data());
  EXPECT_EQ(packed.back(), 0xA5);
  for (size_t i = 0; i < codes.size() / 2; ++i) EXPECT_EQ(packed[i], i) << "pair " << i;  // every byte value once
  for (int64_t k = 0; k < static_cast<int64_t>(codes.size()); ++k) {
    ASSERT_EQ(quant::int4_code(packed.data(), k), codes[static_cast<size_t>(k)]) << k;
    ASSERT_EQ(nibble_code(packed.data(), static_cast<int64_t>(codes.size()), 0, k), codes[static_cast<size_t>(k)]);
  }
}

TEST(Int4Weights, RoundsHalfToEven) {
  // max 7 gives scale exactly 1.
  const std::vector<float> w = {7.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 6.5f};
  quant::Int4Weights q = quant::quantize_int4_weights(TensorView(w.data(), DType::kF32, {1, 8}), 0);
  EXPECT_EQ(q.scales.ptr<float>()[0], 1.0f);
  const int want[] = {7, 0, 2, 2, 0, -2, -2, 6};
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(nibble_code(q.packed.ptr<uint8_t>(), 8, 0, k), want[k]) << k;
}

// ---- rejections ------------------------------------------------------------------------------------------------

// Runs f and checks it throws cider::Error whose message names [op] and contains `value`.
template <typename F>
::testing::AssertionResult throws_error(F&& f, const std::string& op, const std::string& value) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("[" + op + "]") == std::string::npos || msg.find(value) == std::string::npos)
      return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks [" << op << "] or \"" << value << "\"";
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-cider exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

const std::vector<float> kW4x128(4 * 128, 0.25f);
TensorView w_view(int64_t N, int64_t K, const std::vector<float>& storage = kW4x128) {
  return TensorView(storage.data(), DType::kF32, {N, K});
}

TEST(Int8WeightsRejects, GroupSizeNotAllowed) {
  EXPECT_TRUE(throws_error([] { quant::quantize_int8_weights(w_view(4, 128), 48); }, "quantize_int8_weights",
                           "got 48"));
  EXPECT_TRUE(throws_error([] { quant::quantize_int8_weights(w_view(4, 128), 32); }, "quantize_int8_weights",
                           "got 32"));
}

TEST(Int8WeightsRejects, KNotMultipleOfGroupSize) {
  EXPECT_TRUE(throws_error([] { quant::quantize_int8_weights(w_view(4, 96), 64); }, "quantize_int8_weights",
                           "(4, 96)"));
}

TEST(Int8WeightsRejects, ClipPercentileWithGroups) {
  EXPECT_TRUE(throws_error([] { quant::quantize_int8_weights(w_view(4, 128), 64, 99.0f); }, "quantize_int8_weights",
                           "group_size 64"));
}

TEST(Int8WeightsRejects, ClipPercentileOutOfRange) {
  for (float p : {0.0f, -3.0f, 100.5f, std::numeric_limits<float>::quiet_NaN()}) {
    std::ostringstream value;
    value << "got " << p;
    EXPECT_TRUE(throws_error([p] { quant::quantize_int8_weights(w_view(4, 128), 0, p); }, "quantize_int8_weights",
                             value.str()));
  }
}

TEST(Int8WeightsRejects, NonFiniteWeight) {
  std::vector<float> w = kW4x128;
  w[2 * 128 + 5] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(throws_error([&] { quant::quantize_int8_weights(w_view(4, 128, w), 0); }, "quantize_int8_weights",
                           "inf at [2, 5]"));
  w[2 * 128 + 5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_error([&] { quant::quantize_int8_weights(w_view(4, 128, w), 64); }, "quantize_int8_weights",
                           "nan at [2, 5]"));
}

TEST(Int8WeightsRejects, WrongDtypeRankContiguityAndEmpty) {
  std::vector<int8_t> i8(512);
  EXPECT_TRUE(throws_error([&] { quant::quantize_int8_weights(TensorView(i8.data(), DType::kI8, {4, 128}), 0); },
                           "quantize_int8_weights", "int8"));
  EXPECT_TRUE(throws_error(
      [] { quant::quantize_int8_weights(TensorView(kW4x128.data(), DType::kF32, {512}), 0); },
      "quantize_int8_weights", "(512)"));
  TensorView strided = w_view(4, 64);
  strided.stride[0] = 128;
  EXPECT_TRUE(throws_error([&] { quant::quantize_int8_weights(strided, 0); }, "quantize_int8_weights", "(4, 64)"));
  EXPECT_TRUE(throws_error([] { quant::quantize_int8_weights(w_view(0, 128), 0); }, "quantize_int8_weights",
                           "(0, 128)"));
}

TEST(Int8ActivationsRejects, WrongDtypeRankAndContiguity) {
  std::vector<int32_t> i32(64);
  EXPECT_TRUE(throws_error([&] { quant::quantize_int8_activations(TensorView(i32.data(), DType::kI32, {2, 32})); },
                           "quantize_int8_activations", "int32"));
  const TensorView scalar(kW4x128.data(), DType::kF32, std::vector<int64_t>{});
  EXPECT_TRUE(throws_error([&] { quant::quantize_int8_activations(scalar); }, "quantize_int8_activations", "()"));
  TensorView strided = w_view(4, 64);
  strided.stride[0] = 128;
  EXPECT_TRUE(throws_error([&] { quant::quantize_int8_activations(strided); }, "quantize_int8_activations",
                           "(4, 64)"));
}

TEST(Int4WeightsRejects, OddK) {
  EXPECT_TRUE(throws_error([] { quant::quantize_int4_weights(w_view(4, 67), 0); }, "quantize_int4_weights",
                           "(4, 67)"));
}

TEST(Int4WeightsRejects, GroupSizeNotAllowed) {
  EXPECT_TRUE(throws_error([] { quant::quantize_int4_weights(w_view(4, 128), 16); }, "quantize_int4_weights",
                           "got 16"));
  EXPECT_TRUE(throws_error([] { quant::quantize_int4_weights(w_view(4, 128), -1); }, "quantize_int4_weights",
                           "got -1"));
}

TEST(Int4WeightsRejects, KNotMultipleOfGroupSize) {
  EXPECT_TRUE(throws_error([] { quant::quantize_int4_weights(w_view(4, 96), 64); }, "quantize_int4_weights",
                           "(4, 96)"));
}

TEST(Int4WeightsRejects, NonFiniteWeightAndWrongDtype) {
  std::vector<float> w = kW4x128;
  w[3 * 128 + 127] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(throws_error([&] { quant::quantize_int4_weights(w_view(4, 128, w), 32); }, "quantize_int4_weights",
                           "-inf at [3, 127]"));
  std::vector<uint32_t> u32(512);
  EXPECT_TRUE(throws_error([&] { quant::quantize_int4_weights(TensorView(u32.data(), DType::kU32, {4, 128}), 0); },
                           "quantize_int4_weights", "uint32"));
}

}  // namespace
}  // namespace cider
