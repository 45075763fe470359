// W8A8 / W4A8 linear layers and their reference kernels.
//
// Every output element is checked twice, with per-element tolerances derived from the arithmetic:
//  1. against float64 x̂·ŵᵀ + b on the dequantized activations (x̂ = xq·sx) and weights (ŵ = wq·sw): the integer sums
//     are exact, so only the float32 epilogue rounds: float(acc_g) (once), sw·acc_g (once), the sum of G group terms
//     (G − 1 additions), ·sx (once) and +bias (once) — at most (G + 3)·u·S + u·|y| with u = 2^-24 and
//     S = sx·Σ_g |sw_g·acc_g| — then rounding to the output dtype (half an ulp, relative 2^-11 f16, 2^-8 bf16);
//     the float64 reference sum itself is off by at most (K + 2)·2^-53·Σ_k |x̂_k·ŵ_k|, which is added too;
//  2. against float64 x·wᵀ + b on the ORIGINAL values: x̂ŵ − xw = x·dw + w·dx + dx·dw with |dx| ≤ sx/2, |dw| ≤ sw/2,
//     so |Δy| ≤ Σ_k (|x_k|·sw/2 + |w_k|·sx/2 + sx·sw/4), plus the epilogue bound of 1.
// Outputs are written into canary-guarded buffers; NaN never passes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/kernel_table.h"
#include "nn/linear.h"
#include "quant/affine.h"
#include "support/test_support.h"

namespace cider {
namespace {

const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr double kU = 0x1p-24;  // float32 unit roundoff

// Values stored in a float dtype, plus the exact float32 values those bytes hold.
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  DType dtype = DType::kF32;
  TensorView view(const std::vector<int64_t>& shape) const { return TensorView(bytes.data(), dtype, shape); }
};

Stored store(const std::vector<float>& v, DType t) {
  Stored s{test::to_dtype_bytes(v, t), {}, t};
  s.values = test::from_dtype_bytes(s.bytes.data(), t, v.size());
  return s;
}

// Relative half-ulp of a float dtype's normal numbers, and half its smallest subnormal spacing.
double out_rel_eps(DType t) { return t == DType::kF16 ? 0x1p-11 : t == DType::kBF16 ? 0x1p-8 : 0.0; }
double out_abs_eps(DType t) { return t == DType::kF16 ? 0x1p-25 : t == DType::kBF16 ? 0x1p-134 : 0.0; }

// Per-token activation quantization written from the contract, independently of quant/int8.cpp.
struct TokenCodes {
  std::vector<int> q;     // [M, K]
  std::vector<float> s;   // [M]; NaN for a row holding NaN/inf
};
TokenCodes quantize_tokens(const std::vector<float>& x, int64_t M, int64_t K) {
  TokenCodes t{std::vector<int>(static_cast<size_t>(M * K)), std::vector<float>(static_cast<size_t>(M))};
  for (int64_t m = 0; m < M; ++m) {
    float amax = 0.0f;
    bool finite = true;
    for (int64_t k = 0; k < K; ++k) {
      const float v = x[static_cast<size_t>(m * K + k)];
      if (!std::isfinite(v)) finite = false;
      else if (std::fabs(v) > amax) amax = std::fabs(v);
    }
    float s = amax / 127.0f;
    if (s == 0.0f) s = 1.0f;
    if (!finite) s = std::numeric_limits<float>::quiet_NaN();
    t.s[static_cast<size_t>(m)] = s;
    for (int64_t k = 0; k < K; ++k) {
      const float r = finite ? std::nearbyint(x[static_cast<size_t>(m * K + k)] / s) : 0.0f;
      t.q[static_cast<size_t>(m * K + k)] = static_cast<int>(std::min(127.0f, std::max(-127.0f, r)));
    }
  }
  return t;
}

// What every element of out [M, N] is compared with.
struct Expected {
  std::vector<double> y_deq, tol_deq;    // check 1
  std::vector<double> y_orig, tol_orig;  // check 2
};

// weight_code(n, k) is the layer's stored code; scales its [N] or [K/gs, N] float32 scales; bias float32 [N] or null.
// w_half_step(s) bounds |w − q·s| for the weight format (half a step plus the float rounding of w/s).
template <typename WeightCode>
Expected expected_outputs(const std::vector<float>& x, const std::vector<float>& w, int64_t M, int64_t N, int64_t K,
                          int gs, const float* scales, const float* bias, WeightCode weight_code, int w_qmax,
                          DType out_dtype) {
  const TokenCodes xt = quantize_tokens(x, M, K);
  const int64_t span = gs == 0 ? K : gs, G = K / span;
  const double rel = out_rel_eps(out_dtype), abs_out = out_abs_eps(out_dtype);
  Expected e;
  for (auto* v : {&e.y_deq, &e.tol_deq, &e.y_orig, &e.tol_orig}) v->assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    const double sx = xt.s[static_cast<size_t>(m)];
    const double dx = sx * (0.5 + 128 * kU);  // |x − xq·sx|
    for (int64_t n = 0; n < N; ++n) {
      const double b = bias ? bias[n] : 0.0;
      // abs_deq / abs_orig: Σ|terms|, which bounds the float64 rounding of the reference sums themselves.
      double y_deq = 0.0, S = 0.0, y_orig = 0.0, bound_orig = 0.0, abs_deq = 0.0, abs_orig = 0.0;
      for (int64_t g = 0; g < G; ++g) {
        const double sw = gs == 0 ? scales[n] : scales[g * N + n];
        const double dw = sw * (0.5 + (w_qmax + 1) * kU);  // |w − wq·sw|
        int64_t acc = 0;
        for (int64_t k = g * span; k < (g + 1) * span; ++k) {
          const int xq = xt.q[static_cast<size_t>(m * K + k)], wq = weight_code(n, k);
          acc += static_cast<int64_t>(xq) * wq;
          y_deq += (xq * sx) * (wq * sw);
          abs_deq += std::fabs((xq * sx) * (wq * sw));
          const double xv = x[static_cast<size_t>(m * K + k)], wv = w[static_cast<size_t>(n * K + k)];
          y_orig += xv * wv;
          abs_orig += std::fabs(xv * wv);
          bound_orig += std::fabs(xv) * dw + std::fabs(wv) * dx + dx * dw;
        }
        S += std::fabs(sw * static_cast<double>(acc));
      }
      S *= sx;
      y_deq += b;
      y_orig += b;
      const double ref_rounding = static_cast<double>(K + 2) * 0x1p-53;  // per unit of Σ|terms|
      const double epilogue = (static_cast<double>(G) + 3.0) * kU * S + kU * std::fabs(y_deq) + ref_rounding * abs_deq;
      const size_t i = static_cast<size_t>(m * N + n);
      e.y_deq[i] = y_deq;
      e.tol_deq[i] = (epilogue + rel * (std::fabs(y_deq) + epilogue)) * (1.0 + 1e-6) + abs_out;
      e.y_orig[i] = y_orig;
      const double t = bound_orig + epilogue + ref_rounding * abs_orig;
      e.tol_orig[i] = (t + rel * (std::fabs(y_orig) + t)) * (1.0 + 1e-6) + abs_out;
    }
  }
  return e;
}

// Every element within its tolerance; a NaN output always fails.
::testing::AssertionResult within(const std::vector<float>& got, const std::vector<double>& want,
                                  const std::vector<double>& tol, const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], err = std::fabs(g - want[i]);
    if (std::isnan(g) || !(err <= tol[i]))
      return ::testing::AssertionFailure() << what << ": element " << i << " of " << got.size() << ": got " << g
                                           << ", want " << want[i] << " (|diff| " << err << " > tol " << tol[i]
                                           << ")";
  }
  return ::testing::AssertionSuccess();
}

// Runs `fill` on a canary-guarded [rows, N] buffer of out_dtype; returns the values as float32.
template <typename Fill>
std::vector<float> guarded_output(int64_t rows, int64_t N, DType out_dtype, Fill fill) {
  const size_t n = static_cast<size_t>(rows * N);
  test::GuardedBuffer out(n * static_cast<size_t>(dtype_size(out_dtype)));
  out.fill_inside(0xFF);  // a NaN pattern in every float dtype: an element the kernel skips cannot pass
  fill(out.data());
  EXPECT_TRUE(out.canaries_intact());
  std::vector<float> v = test::from_dtype_bytes(out.data(), out_dtype, n);
  EXPECT_TRUE(test::no_nan(v.data(), v.size()));
  return v;
}

// The pieces of one layer format the generic sweep needs.
struct Int8Format {
  using Layer = nn::Int8Linear;
  static constexpr int kQMax = 127;
  static constexpr auto kGemm = &kernels::KernelTable::w8a8_gemm;
  static constexpr auto kGemv = &kernels::KernelTable::w8a8_gemv;
  static auto weight_code(const Layer& l) {
    const int8_t* q = l.weights().ptr<int8_t>();
    const int64_t K = l.in_features();
    return [q, K](int64_t n, int64_t k) { return static_cast<int>(q[n * K + k]); };
  }
};
struct Int4Format {
  using Layer = nn::Int4Linear;
  static constexpr int kQMax = 7;
  static constexpr auto kGemm = &kernels::KernelTable::w4a8_gemm;
  static constexpr auto kGemv = &kernels::KernelTable::w4a8_gemv;
  // Decodes with arithmetic on the byte (remainder / quotient), not the library's mask and shift.
  static auto weight_code(const Layer& l) {
    const uint8_t* p = l.weights().ptr<uint8_t>();
    const int64_t half = l.in_features() / 2;
    return [p, half](int64_t n, int64_t k) {
      const int byte = p[n * half + k / 2];
      return (k % 2 == 0 ? byte % 16 : byte / 16) - 8;
    };
  }
};

// The tables to test: the reference, and the active one when it differs.
std::vector<const kernels::KernelTable*> tables() {
  std::vector<const kernels::KernelTable*> t = {&kernels::ref_kernels()};
  if (&kernels::active_kernels() != &kernels::ref_kernels()) t.push_back(&kernels::active_kernels());
  return t;
}

struct Case {
  int64_t M, N, K;
  int gs;
  DType x_dtype, w_dtype, out_dtype;
  bool with_bias;
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << "M " << c.M << " N " << c.N << " K " << c.K << " gs " << c.gs << " x " << dtype_name(c.x_dtype) << " w "
    << dtype_name(c.w_dtype) << " out " << dtype_name(c.out_dtype) << (c.with_bias ? " bias" : " no bias");
  return s.str();
}

// Builds a layer from random float weights and checks forward(), the GEMM entry (whole batch) and the GEMV entry
// (row by row) of every table against both references.
template <typename Format>
void check_case(const Case& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const int64_t M = c.M, N = c.N, K = c.K;
  // Tokens of different magnitudes (2^±4); row 1 all zero when M > 2 (scale 1, output = bias).
  std::vector<float> xv = test::randn(rng, static_cast<size_t>(M * K));
  std::uniform_real_distribution<float> expo(-4.0f, 4.0f);
  for (int64_t m = 0; m < M; ++m) {
    const float mag = (M > 2 && m == 1) ? 0.0f : std::exp2(expo(rng));
    for (int64_t k = 0; k < K; ++k) xv[static_cast<size_t>(m * K + k)] *= mag;
  }
  const Stored x = store(xv, c.x_dtype);
  const Stored w = store(test::randn(rng, static_cast<size_t>(N * K), 0.05f), c.w_dtype);
  const Stored b = store(test::randn(rng, static_cast<size_t>(N)), c.w_dtype);
  const TensorView bias_view = b.view({N});

  typename Format::Layer layer = Format::Layer::from_float(w.view({N, K}), c.with_bias ? &bias_view : nullptr, c.gs);
  ASSERT_EQ(layer.in_features(), K);
  ASSERT_EQ(layer.out_features(), N);
  ASSERT_EQ(layer.group_size(), c.gs);
  ASSERT_EQ(layer.bias().has_value(), c.with_bias);
  const float* bias = c.with_bias ? layer.bias()->template ptr<float>() : nullptr;
  if (bias) {
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(bias[n], b.values[static_cast<size_t>(n)]);  // exact widening
  }
  const Expected e = expected_outputs(x.values, w.values, M, N, K, c.gs, layer.scales().template ptr<float>(), bias,
                                      Format::weight_code(layer), Format::kQMax, c.out_dtype);

  auto check_out = [&](const std::vector<float>& got, const char* what) {
    EXPECT_TRUE(within(got, e.y_deq, e.tol_deq, what)) << "vs float64 on dequantized values";
    EXPECT_TRUE(within(got, e.y_orig, e.tol_orig, what)) << "vs float64 on original values";
    if (M > 2) {  // the all-zero token
      for (int64_t n = 0; n < N; ++n)
        EXPECT_EQ(got[static_cast<size_t>(N + n)], round_to(c.out_dtype, bias ? bias[n] : 0.0f)) << what;
    }
  };

  check_out(guarded_output(M, N, c.out_dtype,
                           [&](void* out) { layer.forward(x.view({M, K}), TensorView(out, c.out_dtype, {M, N})); }),
            "forward");

  kernels::IntLinearArgs a{};
  a.x_dtype = c.x_dtype;
  a.w = layer.weights().data;
  a.w_scales = layer.scales().template ptr<float>();
  a.bias = bias;
  a.out_dtype = c.out_dtype;
  a.N = N;
  a.K = K;
  a.group_size = c.gs;
  for (const kernels::KernelTable* table : tables()) {
    SCOPED_TRACE(table->name);
    if (M > 1) {
      check_out(guarded_output(M, N, c.out_dtype,
                               [&](void* out) {
                                 a.x = x.bytes.data();
                                 a.out = out;
                                 a.M = M;
                                 (table->*Format::kGemm)(a);
                               }),
                "gemm");
    }
    std::vector<float> rows;
    for (int64_t m = 0; m < M; ++m) {
      std::vector<float> row = guarded_output(1, N, c.out_dtype, [&](void* out) {
        a.x = x.bytes.data() + m * K * dtype_size(c.x_dtype);
        a.out = out;
        a.M = 1;
        (table->*Format::kGemv)(a);
      });
      rows.insert(rows.end(), row.begin(), row.end());
    }
    check_out(rows, "gemv");
  }
}

// Sweeps M × N × K with a rotating choice of dtypes and bias, so every combination of x / w / out dtype appears.
template <typename Format>
void sweep(uint64_t salt, int gs, const std::vector<int64_t>& Ks, const std::vector<int64_t>& Ns) {
  auto rng = test::make_rng(salt);
  int i = 0;
  for (int64_t M : {1, 2, 7, 33})
    for (int64_t K : Ks)
      for (int64_t N : Ns) {
        const Case c{M, N, K, gs, kFloatTypes[i % 3], kFloatTypes[(i / 3) % 3], kFloatTypes[(i / 9) % 3],
                     (i / 2) % 2 == 0};
        ++i;
        check_case<Format>(c, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

std::vector<int64_t> group_multiples(int gs) { return {gs, 3 * static_cast<int64_t>(gs), 4096}; }

TEST(W8A8Linear, PerChannelMatchesFloat64OverShapesWithTails) {
  sweep<Int8Format>(201, 0, {1, 7, 33, 67, 129, 4097}, {1, 7, 33, 67, 129});
}

TEST(W8A8Linear, PerGroupMatchesFloat64OverShapesWithTails) {
  for (int gs : {64, 128, 256})
    sweep<Int8Format>(202 + static_cast<uint64_t>(gs), gs, group_multiples(gs), {1, 7, 33, 67});
}

TEST(W4A8Linear, PerChannelMatchesFloat64OverShapesWithTails) {
  sweep<Int4Format>(203, 0, {2, 8, 34, 68, 130, 4098}, {1, 7, 33, 67, 129});
}

TEST(W4A8Linear, PerGroupMatchesFloat64OverShapesWithTails) {
  for (int gs : {32, 64, 128, 256})
    sweep<Int4Format>(204 + static_cast<uint64_t>(gs), gs, group_multiples(gs), {1, 7, 33, 67});
}

// ---- construction ----------------------------------------------------------------------------------------------

TEST(Int8Linear, HoldsExactlyTheQuantizerOutputAndCountsItsBytes) {
  auto rng = test::make_rng(205);
  const int64_t N = 33, K = 256;
  const Stored w = store(test::randn(rng, N * K), DType::kBF16);
  const Stored b = store(test::randn(rng, N), DType::kF16);
  const TensorView bv = b.view({N});
  for (int gs : {0, 64, 128, 256}) {
    nn::Int8Linear layer = nn::Int8Linear::from_float(w.view({N, K}), &bv, gs);
    quant::Int8Weights q = quant::quantize_int8_weights(w.view({N, K}), gs);
    ASSERT_EQ(layer.weights().dtype, DType::kI8);
    ASSERT_EQ(layer.weights().shape_vector(), q.q.shape);
    ASSERT_EQ(layer.scales().shape_vector(), q.scales.shape);
    EXPECT_EQ(std::memcmp(layer.weights().data, q.q.buffer.data(), static_cast<size_t>(N * K)), 0);
    EXPECT_EQ(std::memcmp(layer.scales().data, q.scales.buffer.data(), static_cast<size_t>(q.scales.numel()) * 4), 0);
    const size_t scale_count = gs == 0 ? N : static_cast<size_t>(K / gs * N);
    EXPECT_EQ(layer.nbytes(), static_cast<size_t>(N * K) + 4 * scale_count + 4 * N);
  }
  nn::Int8Linear clipped = nn::Int8Linear::from_float(w.view({N, K}), nullptr, 0, 99.0f);
  quant::Int8Weights q = quant::quantize_int8_weights(w.view({N, K}), 0, 99.0f);
  EXPECT_EQ(std::memcmp(clipped.weights().data, q.q.buffer.data(), static_cast<size_t>(N * K)), 0);
  EXPECT_EQ(std::memcmp(clipped.scales().data, q.scales.buffer.data(), static_cast<size_t>(N) * 4), 0);
  EXPECT_FALSE(clipped.bias().has_value());
  EXPECT_EQ(clipped.nbytes(), static_cast<size_t>(N * K + 4 * N));
}

TEST(Int4Linear, HoldsExactlyTheQuantizerOutputAndCountsItsBytes) {
  auto rng = test::make_rng(206);
  const int64_t N = 7, K = 512;
  const Stored w = store(test::randn(rng, N * K), DType::kF16);
  for (int gs : {0, 32, 64, 128, 256}) {
    nn::Int4Linear layer = nn::Int4Linear::from_float(w.view({N, K}), nullptr, gs);
    quant::Int4Weights q = quant::quantize_int4_weights(w.view({N, K}), gs);
    ASSERT_EQ(layer.weights().dtype, DType::kU8);
    ASSERT_EQ(layer.weights().shape_vector(), (std::vector<int64_t>{N, K / 2}));
    EXPECT_EQ(std::memcmp(layer.weights().data, q.packed.buffer.data(), static_cast<size_t>(N * K / 2)), 0);
    EXPECT_EQ(std::memcmp(layer.scales().data, q.scales.buffer.data(), static_cast<size_t>(q.scales.numel()) * 4), 0);
    const size_t scale_count = gs == 0 ? N : static_cast<size_t>(K / gs * N);
    EXPECT_EQ(layer.nbytes(), static_cast<size_t>(N * K / 2) + 4 * scale_count);
  }
}

TEST(Int8Linear, ClippedLayerMatchesFloat64OnItsDequantizedValues) {
  auto rng = test::make_rng(207);
  for (int64_t M : {1, 7}) {
    const int64_t N = 33, K = 129;
    const Stored w = store(test::randn_with_outlier_channels(rng, N, K, 30.0f, 3), DType::kF32);
    const Stored x = store(test::randn(rng, M * K), DType::kF16);
    nn::Int8Linear layer = nn::Int8Linear::from_float(w.view({N, K}), nullptr, 0, 99.0f);
    const Expected e = expected_outputs(x.values, w.values, M, N, K, 0, layer.scales().ptr<float>(), nullptr,
                                        Int8Format::weight_code(layer), 127, DType::kF32);
    std::vector<float> got = guarded_output(M, N, DType::kF32, [&](void* out) {
      layer.forward(x.view({M, K}), TensorView(out, DType::kF32, {M, N}));
    });
    EXPECT_TRUE(within(got, e.y_deq, e.tol_deq, "clipped forward"));
  }
}

// ---- forward shapes and non-finite input -----------------------------------------------------------------------

template <typename Format>
void check_leading_dimensions(uint64_t salt, int gs) {
  auto rng = test::make_rng(salt);
  const int64_t N = 67, K = 256;
  const Stored w = store(test::randn(rng, N * K, 0.1f), DType::kF32);
  typename Format::Layer layer = Format::Layer::from_float(w.view({N, K}), nullptr, gs);
  // [2, 3, K] is six tokens; [K] is one token (the GEMV path).
  const Stored x = store(test::randn(rng, 6 * K), DType::kBF16);
  const Expected e = expected_outputs(x.values, w.values, 6, N, K, gs, layer.scales().template ptr<float>(), nullptr,
                                      Format::weight_code(layer), Format::kQMax, DType::kF16);
  std::vector<float> got = guarded_output(6, N, DType::kF16, [&](void* out) {
    layer.forward(x.view({2, 3, K}), TensorView(out, DType::kF16, {2, 3, N}));
  });
  EXPECT_TRUE(within(got, e.y_deq, e.tol_deq, "[2, 3, K]"));
  std::vector<float> one = guarded_output(1, N, DType::kF16, [&](void* out) {
    layer.forward(x.view({K}), TensorView(out, DType::kF16, {N}));
  });
  EXPECT_TRUE(within(one, std::vector<double>(e.y_deq.begin(), e.y_deq.begin() + N),
                     std::vector<double>(e.tol_deq.begin(), e.tol_deq.begin() + N), "[K]"));
  // Zero tokens: nothing to compute, nothing written.
  test::GuardedBuffer empty(0);
  layer.forward(TensorView(nullptr, DType::kF32, {0, K}), TensorView(empty.data(), DType::kF32, {0, N}));
  EXPECT_TRUE(empty.canaries_intact());
}

TEST(W8A8Linear, LeadingDimensionsFlattenToTokens) { check_leading_dimensions<Int8Format>(208, 128); }
TEST(W4A8Linear, LeadingDimensionsFlattenToTokens) { check_leading_dimensions<Int4Format>(209, 0); }

// A token holding NaN or ±inf yields a row of NaN (never finite garbage); other tokens are unaffected.
template <typename Format>
void check_non_finite_tokens(uint64_t salt, int gs) {
  auto rng = test::make_rng(salt);
  const int64_t M = 5, N = 33, K = 128;
  const Stored w = store(test::randn(rng, N * K), DType::kF32);
  const Stored b = store(test::randn(rng, N), DType::kF32);
  const TensorView bv = b.view({N});
  typename Format::Layer layer = Format::Layer::from_float(w.view({N, K}), &bv, gs);
  std::vector<float> xv = test::randn(rng, M * K);
  xv[1 * K + 7] = std::numeric_limits<float>::quiet_NaN();
  xv[2 * K + 0] = std::numeric_limits<float>::infinity();
  xv[3 * K + 127] = -std::numeric_limits<float>::infinity();
  for (DType t : kFloatTypes) {
    const Stored x = store(xv, t);
    for (int64_t rows : {int64_t{1}, M}) {  // GEMV (the NaN token alone, row 1) and GEMM
      const int64_t first = rows == 1 ? 1 : 0;
      test::GuardedBuffer out(static_cast<size_t>(rows * N) * 4);
      TensorView xs(x.bytes.data() + first * K * dtype_size(t), t, {rows, K});
      layer.forward(xs, TensorView(out.data(), DType::kF32, {rows, N}));
      EXPECT_TRUE(out.canaries_intact());
      for (int64_t r = 0; r < rows; ++r) {
        const bool bad = (first + r) >= 1 && (first + r) <= 3;
        for (int64_t n = 0; n < N; ++n) {
          const float y = out.as<float>()[r * N + n];
          ASSERT_EQ(std::isnan(y), bad) << dtype_name(t) << " token " << first + r << " n " << n << " y " << y;
          if (!bad) {
            ASSERT_TRUE(std::isfinite(y));
          }
        }
      }
    }
  }
}

TEST(W8A8Linear, NonFiniteTokenGivesNaNRow) {
  check_non_finite_tokens<Int8Format>(210, 0);
  check_non_finite_tokens<Int8Format>(211, 64);
}
TEST(W4A8Linear, NonFiniteTokenGivesNaNRow) {
  check_non_finite_tokens<Int4Format>(212, 0);
  check_non_finite_tokens<Int4Format>(213, 32);
}

// ---- from MLX affine layers ------------------------------------------------------------------------------------

struct MlxCase {
  int bits, mlx_gs;
  std::optional<int> target;
  std::optional<float> clip;
  int want_gs;  // the group size the rule must choose
};

// Quantizes random weights the MLX way, converts, and checks the layer equals from_float on the exact
// dequantized matrix (same codes, scales, bias, group size), then runs forward against float64.
template <typename Format>
void check_from_mlx(uint64_t salt, const std::vector<MlxCase>& cases) {
  auto rng = test::make_rng(salt);
  int i = 0;
  for (const MlxCase& c : cases) {
    const DType t = kFloatTypes[i++ % 3];
    const int64_t N = 33, K = 768;
    SCOPED_TRACE(::testing::Message() << "bits " << c.bits << " mlx gs " << c.mlx_gs << " target "
                                      << (c.target ? *c.target : -1) << " " << dtype_name(t));
    const Stored w = store(test::randn(rng, N * K, 0.05f), t);
    const Stored b = store(test::randn(rng, N), t);
    const TensorView bv = b.view({N});
    quant::AffineQuantized mlx = quant::affine_quantize(w.view({N, K}), c.mlx_gs, c.bits);
    typename Format::Layer layer = Format::Layer::from_mlx_affine(mlx.packed.view(), mlx.scales.view(),
                                                                  mlx.biases.view(), c.mlx_gs, c.bits, &bv,
                                                                  c.target, c.clip);
    Tensor deq = quant::affine_dequantize(mlx.packed.view(), mlx.scales.view(), mlx.biases.view(), c.mlx_gs, c.bits,
                                          DType::kF32);
    typename Format::Layer want = Format::Layer::from_float(deq.view(), &bv, c.want_gs, c.clip);
    ASSERT_EQ(layer.group_size(), c.want_gs);
    ASSERT_EQ(layer.in_features(), K);
    ASSERT_EQ(layer.out_features(), N);
    ASSERT_EQ(layer.weights().shape_vector(), want.weights().shape_vector());
    ASSERT_EQ(layer.scales().shape_vector(), want.scales().shape_vector());
    const size_t wbytes = static_cast<size_t>(layer.weights().numel() * dtype_size(layer.weights().dtype));
    EXPECT_EQ(std::memcmp(layer.weights().data, want.weights().data, wbytes), 0);
    EXPECT_EQ(std::memcmp(layer.scales().data, want.scales().data, static_cast<size_t>(layer.scales().numel()) * 4),
              0);
    ASSERT_TRUE(layer.bias().has_value());
    EXPECT_EQ(std::memcmp(layer.bias()->data, want.bias()->data, static_cast<size_t>(N) * 4), 0);

    const int64_t M = 7;
    const Stored x = store(test::randn(rng, M * K), DType::kF32);
    const std::vector<float> deq_values(deq.ptr<float>(), deq.ptr<float>() + N * K);
    const Expected e = expected_outputs(x.values, deq_values, M, N, K, c.want_gs, layer.scales().template ptr<float>(),
                                        layer.bias()->template ptr<float>(), Format::weight_code(layer), Format::kQMax,
                                        DType::kF32);
    std::vector<float> got = guarded_output(M, N, DType::kF32, [&](void* out) {
      layer.forward(x.view({M, K}), TensorView(out, DType::kF32, {M, N}));
    });
    EXPECT_TRUE(within(got, e.y_deq, e.tol_deq, "from_mlx forward vs dequantized"));
    if (!c.clip) {
      EXPECT_TRUE(within(got, e.y_orig, e.tol_orig, "from_mlx forward vs MLX-dequantized weights"));
    }
  }
}

TEST(Int8Linear, FromMlxAffineRequantizesTheDequantizedWeights) {
  check_from_mlx<Int8Format>(214, {
                                      {8, 64, std::nullopt, std::nullopt, 64},   // 8-bit, group kept
                                      {8, 128, std::nullopt, std::nullopt, 128},
                                      {8, 32, std::nullopt, std::nullopt, 0},    // 32 is no INT8 group size
                                      {4, 64, std::nullopt, std::nullopt, 0},    // not 8-bit: per channel
                                      {3, 128, std::nullopt, std::nullopt, 0},
                                      {4, 64, 256, std::nullopt, 256},           // explicit target wins
                                      {8, 64, 0, 99.0f, 0},                      // per channel with clipping
                                      {6, 32, std::nullopt, 99.9f, 0},
                                  });
}

TEST(Int4Linear, FromMlxAffineRequantizesTheDequantizedWeights) {
  check_from_mlx<Int4Format>(215, {
                                      {4, 64, std::nullopt, std::nullopt, 64},  // default: the MLX group size
                                      {4, 32, std::nullopt, std::nullopt, 32},
                                      {8, 128, std::nullopt, std::nullopt, 128},
                                      {3, 64, 0, std::nullopt, 0},              // explicit per channel
                                      {2, 128, 256, std::nullopt, 256},
                                  });
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

// A valid [4, 128] float32 weight matrix, bias and inputs to break one at a time.
struct Valid {
  std::vector<float> w = std::vector<float>(4 * 128, 0.5f);
  std::vector<float> bias = std::vector<float>(4, 1.0f);
  std::vector<float> x = std::vector<float>(2 * 128, 1.0f);
  std::vector<float> out = std::vector<float>(2 * 4, 0.0f);
  TensorView wv(int64_t N = 4, int64_t K = 128) const { return TensorView(w.data(), DType::kF32, {N, K}); }
  TensorView xv() const { return TensorView(x.data(), DType::kF32, {2, 128}); }
  TensorView outv() const { return TensorView(out.data(), DType::kF32, {2, 4}); }
};

constexpr const char* kI8From = "int8_linear.from_float";
constexpr const char* kI8Fwd = "int8_linear.forward";
constexpr const char* kI8Mlx = "int8_linear.from_mlx_affine";
constexpr const char* kI4From = "int4_linear.from_float";
constexpr const char* kI4Fwd = "int4_linear.forward";
constexpr const char* kI4Mlx = "int4_linear.from_mlx_affine";

TEST(Int8LinearRejects, GroupSizeNotAllowed) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), nullptr, 48); }, kI8From,
                           "group_size must be 0 (per channel), 64, 128 or 256; got 48"));
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), nullptr, 32); }, kI8From, "got 32"));
}

TEST(Int8LinearRejects, KNotMultipleOfGroupSize) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(4, 96), nullptr, 64); }, kI8From, "(4, 96)"));
}

TEST(Int8LinearRejects, ClipPercentileWithGroups) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), nullptr, 128, 99.0f); }, kI8From,
                           "got group_size 128"));
}

TEST(Int8LinearRejects, ClipPercentileOutOfRange) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), nullptr, 0, 0.0f); }, kI8From, "got 0"));
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), nullptr, 0, 101.0f); }, kI8From, "got 101"));
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_float(v.wv(), nullptr, 0, std::numeric_limits<float>::quiet_NaN()); }, kI8From,
      "got nan"));
}

TEST(Int8LinearRejects, NonFiniteWeight) {
  Valid v;
  v.w[1 * 128 + 2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), nullptr, 0); }, kI8From, "nan at [1, 2]"));
}

TEST(Int8LinearRejects, WeightDtype) {
  std::vector<int8_t> w(4 * 128);
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(TensorView(w.data(), DType::kI8, {4, 128}), nullptr); },
                           kI8From, "got int8"));
}

TEST(Int8LinearRejects, WeightRank) {
  Valid v;
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_float(TensorView(v.w.data(), DType::kF32, {2, 2, 128}), nullptr); }, kI8From,
      "(2, 2, 128)"));
}

TEST(Int8LinearRejects, WeightNotContiguous) {
  Valid v;
  TensorView w = v.wv(4, 64);
  w.stride[0] = 128;
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(w, nullptr); }, kI8From, "(4, 64)"));
}

TEST(Int8LinearRejects, WeightNullPointer) {
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(TensorView(nullptr, DType::kF32, {4, 128}), nullptr); },
                           kI8From, "w must not be a null pointer"));
}

TEST(Int8LinearRejects, WeightOnCuda) {
  Valid v;
  TensorView w = v.wv();
  w.device = Device::kCUDA;
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(w, nullptr); }, kI8From, "CUDA"));
}

TEST(Int8LinearRejects, EmptyWeight) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(0, 128), nullptr); }, kI8From, "(0, 128)"));
}

TEST(Int8LinearRejects, BiasShape) {
  Valid v;
  const TensorView b5(v.x.data(), DType::kF32, {5});
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), &b5); }, kI8From, "got (5)"));
  const TensorView b14(v.bias.data(), DType::kF32, {1, 4});
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), &b14); }, kI8From, "got (1, 4)"));
}

TEST(Int8LinearRejects, BiasDtype) {
  Valid v;
  std::vector<int32_t> b(4);
  const TensorView bi(b.data(), DType::kI32, {4});
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(v.wv(), &bi); }, kI8From, "got int32"));
}

TEST(Int8LinearRejects, PerChannelKBeyondInt32Accumulation) {
  const int64_t K = quant::kInt8MaxAccumK + 1;
  std::vector<float> w(static_cast<size_t>(K), 0.5f);
  std::ostringstream value;
  value << "(1, " << K << ")";
  EXPECT_TRUE(throws_error([&] { nn::Int8Linear::from_float(TensorView(w.data(), DType::kF32, {1, K}), nullptr); },
                           kI8From, value.str()));
}

TEST(Int8LinearRejects, ForwardXLastDimension) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(), nullptr);
  EXPECT_TRUE(throws_error([&] { l.forward(TensorView(v.x.data(), DType::kF32, {2, 127}), v.outv()); }, kI8Fwd,
                           "got shape (2, 127)"));
}

TEST(Int8LinearRejects, ForwardXDtype) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(), nullptr);
  std::vector<int8_t> x(256);
  EXPECT_TRUE(throws_error([&] { l.forward(TensorView(x.data(), DType::kI8, {2, 128}), v.outv()); }, kI8Fwd,
                           "got int8"));
}

TEST(Int8LinearRejects, ForwardXRankZero) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(), nullptr);
  const TensorView scalar(v.x.data(), DType::kF32, std::vector<int64_t>{});
  EXPECT_TRUE(throws_error([&] { l.forward(scalar, v.outv()); }, kI8Fwd, "got shape ()"));
}

TEST(Int8LinearRejects, ForwardXNotContiguous) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(4, 64), nullptr);
  TensorView x(v.x.data(), DType::kF32, {2, 64});
  x.stride[0] = 128;
  EXPECT_TRUE(throws_error([&] { l.forward(x, v.outv()); }, kI8Fwd, "x must be contiguous"));
}

TEST(Int8LinearRejects, ForwardNullX) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(), nullptr);
  EXPECT_TRUE(throws_error([&] { l.forward(TensorView(nullptr, DType::kF32, {2, 128}), v.outv()); }, kI8Fwd,
                           "x must not be a null pointer"));
}

TEST(Int8LinearRejects, ForwardOutShape) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(), nullptr);
  EXPECT_TRUE(throws_error([&] { l.forward(v.xv(), TensorView(v.out.data(), DType::kF32, {2, 3})); }, kI8Fwd,
                           "got (2, 3)"));
  EXPECT_TRUE(throws_error([&] { l.forward(v.xv(), TensorView(v.out.data(), DType::kF32, {1, 2, 4})); }, kI8Fwd,
                           "got (1, 2, 4)"));
}

TEST(Int8LinearRejects, ForwardOutDtype) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(), nullptr);
  std::vector<int32_t> out(8);
  EXPECT_TRUE(throws_error([&] { l.forward(v.xv(), TensorView(out.data(), DType::kI32, {2, 4})); }, kI8Fwd,
                           "got int32"));
}

TEST(Int8LinearRejects, ForwardOutOverlapsX) {
  Valid v;
  nn::Int8Linear l = nn::Int8Linear::from_float(v.wv(), nullptr);
  EXPECT_TRUE(throws_error([&] { l.forward(v.xv(), TensorView(v.x.data() + 100, DType::kF32, {2, 4})); }, kI8Fwd,
                           "out must not overlap x"));
}

// Valid MLX inputs: [4, 128] float16 weights at 4 bits, group 64.
struct ValidMlx {
  std::vector<uint8_t> w = test::to_dtype_bytes(std::vector<float>(4 * 128, 0.25f), DType::kF16);
  quant::AffineQuantized q = quant::affine_quantize(TensorView(w.data(), DType::kF16, {4, 128}), 64, 4);
};

TEST(Int8LinearRejects, MlxBits) {
  ValidMlx m;
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_mlx_affine(m.q.packed.view(), m.q.scales.view(), m.q.biases.view(), 64, 7, nullptr); },
      kI8Mlx, "got 7"));
}

TEST(Int8LinearRejects, MlxGroupSize) {
  ValidMlx m;
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_mlx_affine(m.q.packed.view(), m.q.scales.view(), m.q.biases.view(), 16, 4, nullptr); },
      kI8Mlx, "got 16"));
}

TEST(Int8LinearRejects, MlxPackedDtype) {
  ValidMlx m;
  TensorView p = m.q.packed.view();
  p.dtype = DType::kF32;
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_mlx_affine(p, m.q.scales.view(), m.q.biases.view(), 64, 4, nullptr); }, kI8Mlx,
      "got float32"));
}

TEST(Int8LinearRejects, MlxPackedShape) {
  ValidMlx m;
  // 4 bits with group 64 and 2 groups need 16 words per row; claiming 8 bits does not fit.
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_mlx_affine(m.q.packed.view(), m.q.scales.view(), m.q.biases.view(), 64, 8, nullptr); },
      kI8Mlx, "got (4, 16)"));
}

TEST(Int8LinearRejects, MlxBiasesDtypeAndShape) {
  ValidMlx m;
  Tensor b32(DType::kF32, {4, 2});
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_mlx_affine(m.q.packed.view(), m.q.scales.view(), b32.view(), 64, 4, nullptr); },
      kI8Mlx, "got float32"));
  Tensor b_short(DType::kF16, {4, 1});
  EXPECT_TRUE(throws_error(
      [&] { nn::Int8Linear::from_mlx_affine(m.q.packed.view(), m.q.scales.view(), b_short.view(), 64, 4, nullptr); },
      kI8Mlx, "got (4, 1)"));
}

TEST(Int8LinearRejects, MlxTargetGroupSize) {
  ValidMlx m;
  EXPECT_TRUE(throws_error(
      [&] {
        nn::Int8Linear::from_mlx_affine(m.q.packed.view(), m.q.scales.view(), m.q.biases.view(), 64, 4, nullptr, 48);
      },
      kI8Mlx, "got 48"));
}

TEST(Int8LinearRejects, MlxClipWithPerGroupDefault) {
  // 8-bit group 64 defaults to per-group INT8, where clipping is not defined.
  std::vector<uint8_t> w = test::to_dtype_bytes(std::vector<float>(4 * 128, 0.25f), DType::kF16);
  quant::AffineQuantized q = quant::affine_quantize(TensorView(w.data(), DType::kF16, {4, 128}), 64, 8);
  EXPECT_TRUE(throws_error(
      [&] {
        nn::Int8Linear::from_mlx_affine(q.packed.view(), q.scales.view(), q.biases.view(), 64, 8, nullptr,
                                        std::nullopt, 99.0f);
      },
      kI8Mlx, "got group_size 64"));
}

TEST(Int4LinearRejects, OddK) {
  std::vector<float> w(4 * 67, 0.5f);
  EXPECT_TRUE(throws_error([&] { nn::Int4Linear::from_float(TensorView(w.data(), DType::kF32, {4, 67}), nullptr); },
                           kI4From, "must be even (two int4 codes per byte); got w shape (4, 67)"));
}

TEST(Int4LinearRejects, GroupSizeNotAllowed) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int4Linear::from_float(v.wv(), nullptr, 16); }, kI4From,
                           "group_size must be 0 (per channel), 32, 64, 128 or 256; got 16"));
}

TEST(Int4LinearRejects, KNotMultipleOfGroupSize) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int4Linear::from_float(v.wv(4, 96), nullptr, 64); }, kI4From, "(4, 96)"));
}

TEST(Int4LinearRejects, ClipPercentile) {
  Valid v;
  EXPECT_TRUE(throws_error([&] { nn::Int4Linear::from_float(v.wv(), nullptr, 0, 99.5f); }, kI4From, "got 99.5"));
}

TEST(Int4LinearRejects, NonFiniteWeight) {
  Valid v;
  v.w[3 * 128 + 100] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(throws_error([&] { nn::Int4Linear::from_float(v.wv(), nullptr, 32); }, kI4From, "-inf at [3, 100]"));
}

TEST(Int4LinearRejects, BiasShape) {
  Valid v;
  const TensorView b3(v.bias.data(), DType::kF32, {3});
  EXPECT_TRUE(throws_error([&] { nn::Int4Linear::from_float(v.wv(), &b3); }, kI4From, "got (3)"));
}

TEST(Int4LinearRejects, PerChannelKBeyondInt32Accumulation) {
  const int64_t K = quant::kInt4MaxAccumK + 1 + (quant::kInt4MaxAccumK + 1) % 2;  // even
  std::vector<float> w(static_cast<size_t>(K), 0.5f);
  std::ostringstream value;
  value << "(1, " << K << ")";
  EXPECT_TRUE(throws_error([&] { nn::Int4Linear::from_float(TensorView(w.data(), DType::kF32, {1, K}), nullptr); },
                           kI4From, value.str()));
}

TEST(Int4LinearRejects, ForwardXLastDimension) {
  Valid v;
  nn::Int4Linear l = nn::Int4Linear::from_float(v.wv(), nullptr);
  EXPECT_TRUE(throws_error([&] { l.forward(TensorView(v.x.data(), DType::kF32, {1, 256}), v.outv()); }, kI4Fwd,
                           "got shape (1, 256)"));
}

TEST(Int4LinearRejects, ForwardOutShape) {
  Valid v;
  nn::Int4Linear l = nn::Int4Linear::from_float(v.wv(), nullptr);
  EXPECT_TRUE(throws_error([&] { l.forward(v.xv(), TensorView(v.out.data(), DType::kF32, {8})); }, kI4Fwd,
                           "got (8)"));
}

TEST(Int4LinearRejects, ForwardOutDtype) {
  Valid v;
  nn::Int4Linear l = nn::Int4Linear::from_float(v.wv(), nullptr);
  EXPECT_TRUE(throws_error([&] { l.forward(v.xv(), TensorView(v.out.data(), DType::kU8, {2, 4})); }, kI4Fwd,
                           "got uint8"));
}

TEST(Int4LinearRejects, MlxTargetGroupSize) {
  ValidMlx m;
  EXPECT_TRUE(throws_error(
      [&] {
        nn::Int4Linear::from_mlx_affine(m.q.packed.view(), m.q.scales.view(), m.q.biases.view(), 64, 4, nullptr, 48);
      },
      kI4Mlx, "got 48"));
}

}  // namespace
}  // namespace cider
