// Affine (MLX-format) quantization: bounds from the maths against float64, packing against an independent
// bit-level reference, quantized_matmul against float64 x @ dequant(w), and every rejection.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nn/quantized_matmul.h"
#include "quant/affine.h"
#include "support/test_support.h"

namespace cider {
namespace {

const int kAllBits[] = {2, 3, 4, 5, 6, 8};
const int kAllGroups[] = {32, 64, 128};
const DType kFloatTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Independent packing model: the row as a vector of bits, element k at bits [k·bits, (k+1)·bits).
std::vector<uint32_t> pack_reference(const std::vector<uint8_t>& codes, int bits) {
  std::vector<bool> stream;
  for (uint8_t c : codes)
    for (int b = 0; b < bits; ++b) stream.push_back((c >> b) & 1);
  std::vector<uint32_t> words(stream.size() / 32, 0);
  for (size_t j = 0; j < stream.size(); ++j)
    if (stream[j]) words[j / 32] |= (1u << (j % 32));
  return words;
}

TEST(AffinePacking, MatchesBitLevelReferenceForEveryWidth) {
  auto rng = test::make_rng(11);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int64_t n : {32, 64, 96, 128, 4096}) {
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1u));
      std::vector<uint32_t> got(static_cast<size_t>(n * bits / 32) + 2, 0xdeadbeefu);  // two canary words
      quant::pack_codes(codes.data(), n, bits, got.data());
      std::vector<uint32_t> want = pack_reference(codes, bits);
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "bits " << bits << " word " << i;
      EXPECT_EQ(got[want.size()], 0xdeadbeefu);
      EXPECT_EQ(got[want.size() + 1], 0xdeadbeefu);
      std::vector<uint8_t> back(static_cast<size_t>(n));
      quant::unpack_codes(got.data(), n, bits, back.data());
      EXPECT_EQ(back, codes);
    }
  }
}

TEST(AffinePacking, ThreeBitElementTenStraddlesWords) {
  // Element 10 of a 3-bit row uses bits 30-31 of word 0 and bit 0 of word 1 (docs/formats.md).
  std::vector<uint8_t> codes(32, 0);
  codes[10] = 0b111;
  uint32_t words[3];
  quant::pack_codes(codes.data(), 32, 3, words);
  EXPECT_EQ(words[0], 0xC0000000u);
  EXPECT_EQ(words[1], 0x1u);
  EXPECT_EQ(words[2], 0u);
}

// Every element is rounded to the nearest point of its group's grid {bias + q·scale : q = 0 … 2^bits − 1}:
// |w − deq(w)| ≤ |scale|/2 (plus the rounding of the stored scale/bias and of the dequantized value to the dtype),
// except for values beyond an end of the grid, which get the end code. MLX's scheme makes such values exist: it
// moves the scale so that zero is exact (scale = edge/rint(edge/scale0)), which can shorten the grid by up to one
// step at the end opposite the edge (docs/formats.md). Checked against float64 arithmetic on the stored values.
TEST(AffineQuantize, ErrorWithinHalfScaleForEveryBitsGroupAndDtype) {
  auto rng = test::make_rng(12);
  for (DType dt : kFloatTypes) {
    for (int bits : kAllBits) {
      for (int gs : kAllGroups) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " bits " + std::to_string(bits) + " gs " + std::to_string(gs));
        const int64_t rows = 7, K = 2 * gs;
        std::vector<float> w = test::randn(rng, static_cast<size_t>(rows * K), 2.0f);
        w[3] = 40.0f;  // an outlier in the first group
        auto bytes = test::to_dtype_bytes(w, dt);
        auto stored = test::from_dtype_bytes(bytes.data(), dt, w.size());  // the values actually quantized
        auto q = quant::affine_quantize(TensorView(bytes.data(), dt, {rows, K}), gs, bits);
        Tensor deq = quant::affine_dequantize(q.packed.view(), q.scales.view(), q.biases.view(), gs, bits,
                                              DType::kF32);
        const double u = dt == DType::kF32 ? 6e-8 : dt == DType::kF16 ? 4.9e-4 : 3.9e-3;  // unit roundoff
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t k = 0; k < K; ++k) {
            const int64_t g = r * (K / gs) + k / gs;
            const double s = std::fabs(load_float(q.scales.buffer.data(), dt, g));
            const double b = std::fabs(load_float(q.biases.buffer.data(), dt, g));
            const double x = stored[static_cast<size_t>(r * K + k)];
            const double got = deq.ptr<float>()[r * K + k];
            const uint32_t code = quant::unpack_code(q.packed.ptr<uint32_t>() + r * K * bits / 32, k, bits);
            ASSERT_LT(code, 1u << bits);
            const double sb = load_float(q.biases.buffer.data(), dt, g);
            const double ss = load_float(q.scales.buffer.data(), dt, g);
            const double grid_lo = std::min(sb, sb + ss * ((1 << bits) - 1));
            const double grid_hi = std::max(sb, sb + ss * ((1 << bits) - 1));
            // Rounding of scale (relative u, times up to 2^bits−1 codes), of bias, and of q·s and q·s+b.
            const double slack = u * (static_cast<double>((1 << bits)) * s + 2.0 * b + 2.0 * std::fabs(x)) + 1e-7;
            if (x > grid_hi + slack || x < grid_lo - slack) {
              // Beyond the grid: the end code, i.e. the dequantized value is that end of the grid.
              const double end = x > grid_hi ? grid_hi : grid_lo;
              ASSERT_LE(std::fabs(got - end), slack + u * std::fabs(end)) << "row " << r << " col " << k;
              ASSERT_LE(std::fabs(x - end), 1.5 * s + slack) << "clamped by more than the shortened step";
            } else {
              ASSERT_LE(std::fabs(got - x), s / 2.0 + slack) << "row " << r << " col " << k;
            }
          }
        }
      }
    }
  }
}

TEST(AffineQuantize, ZeroIsRepresentedExactly) {
  for (int bits : kAllBits) {
    std::vector<float> w(64);
    for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.37f - 5.0f;
    w[17] = 0.0f;
    auto q = quant::affine_quantize(TensorView(w.data(), DType::kF32, {1, 64}), 64, bits);
    Tensor d = quant::affine_dequantize(q.packed.view(), q.scales.view(), q.biases.view(), 64, bits, DType::kF32);
    EXPECT_EQ(d.ptr<float>()[17], 0.0f) << "bits " << bits;
  }
}

// Float64 x @ dequant(w)ᵀ computed from the dequantized matrix, the most direct reading of the definition.
std::vector<double> matmul_reference(const std::vector<float>& x, const Tensor& deq, int64_t M, int64_t K, int64_t N,
                                     bool transpose) {
  std::vector<double> y(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        double wv = transpose ? deq.ptr<float>()[n * K + k] : deq.ptr<float>()[k * N + n];
        acc += static_cast<double>(x[static_cast<size_t>(m * K + k)]) * wv;
      }
      y[static_cast<size_t>(m * N + n)] = acc;
    }
  return y;
}

TEST(QuantizedMatmul, MatchesFloat64OnDequantizedWeightsOverShapesWithTails) {
  auto rng = test::make_rng(14);
  for (int bits : kAllBits) {
    for (int gs : kAllGroups) {
      for (bool transpose : {true, false}) {
        for (int64_t M : {1, 7, 33}) {
          const int64_t K = transpose ? 2 * gs : 67;      // reduction
          const int64_t N = transpose ? 67 : 2 * gs;      // outputs; the quantized dimension must be a multiple of gs
          SCOPED_TRACE("bits " + std::to_string(bits) + " gs " + std::to_string(gs) + " transpose " +
                       std::to_string(transpose) + " M " + std::to_string(M));
          const int64_t wr = transpose ? N : K, wc = transpose ? K : N;
          std::vector<float> w = test::randn(rng, static_cast<size_t>(wr * wc));
          auto q = quant::affine_quantize(TensorView(w.data(), DType::kF32, {wr, wc}), gs, bits);
          Tensor deq = quant::affine_dequantize(q.packed.view(), q.scales.view(), q.biases.view(), gs, bits,
                                                DType::kF32);
          std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
          test::GuardedBuffer out(static_cast<size_t>(M * N) * 4);
          nn::quantized_matmul(TensorView(x.data(), DType::kF32, {M, K}), q.packed.view(), q.scales.view(),
                               q.biases.view(), transpose, gs, bits, TensorView(out.data(), DType::kF32, {M, N}));
          ASSERT_TRUE(out.canaries_intact());
          auto want = matmul_reference(x, deq, M, K, N, transpose);
          // float32 accumulation over K terms: |err| ≤ K·u·Σ|x·w|; bound with Σ|x·w| ≤ ‖x‖₁·max|w|.
          double xmax = 0.0, wmax = 0.0;
          for (float v : x) xmax = std::max(xmax, static_cast<double>(std::fabs(v)));
          for (int64_t i = 0; i < deq.numel(); ++i) wmax = std::max(wmax, static_cast<double>(std::fabs(deq.ptr<float>()[i])));
          const double atol = static_cast<double>(K) * 6e-8 * static_cast<double>(K) * xmax * wmax * 2.0;
          ASSERT_TRUE(test::all_close(out.as<float>(), want.data(), want.size(), atol, 1e-6));
        }
      }
    }
  }
}

TEST(QuantizedMatmul, HalfPrecisionOutputsAndBatchedBroadcast) {
  auto rng = test::make_rng(15);
  const int gs = 64, bits = 4;
  const int64_t B = 3, M = 5, K = 128, N = 33;
  // w batched [1, N, Kp] broadcast against x [B, M, K]; also w [B, N, Kp] with x [1, M, K].
  std::vector<float> w = test::randn(rng, static_cast<size_t>(B * N * K));
  auto q = quant::affine_quantize(TensorView(w.data(), DType::kF32,
                                             {B, N, K}), gs, bits);
  Tensor deq = quant::affine_dequantize(q.packed.view(), q.scales.view(), q.biases.view(), gs, bits, DType::kF32);
  std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
  auto xb = test::to_dtype_bytes(x, DType::kBF16);
  std::vector<float> xr = test::from_dtype_bytes(xb.data(), DType::kBF16, x.size());
  TensorView xv(xb.data(), DType::kBF16, {1, M, K});
  auto shape = nn::quantized_matmul_output_shape(xv, q.packed.view(), true, bits);
  ASSERT_EQ(shape, (std::vector<int64_t>{B, M, N}));
  EXPECT_EQ(nn::quantized_matmul_output_dtype(xv, q.scales.view()), DType::kF32);
  Tensor out(DType::kBF16, shape);
  nn::quantized_matmul(xv, q.packed.view(), q.scales.view(), q.biases.view(), true, gs, bits, out.view());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0.0, mag = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          double p = static_cast<double>(xr[static_cast<size_t>(m * K + k)]) * deq.ptr<float>()[(b * N + n) * K + k];
          acc += p;
          mag += std::fabs(p);
        }
        double got = load_float(out.buffer.data(), DType::kBF16, (b * M + m) * N + n);
        ASSERT_LE(std::fabs(got - acc), 4e-3 * std::fabs(acc) + 1e-5 * mag) << b << " " << m << " " << n;
      }
  }
}

// ---- rejections: each names the op and the bad value ----

void expect_error(const std::function<void()>& f, const std::string& op, const std::string& value) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one naming " << op << " and " << value;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[" + op + "]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(value), std::string::npos) << msg;
  }
}

TEST(AffineRejects, BadBitsGroupSizeShapeDtypeAndNonFinite) {
  std::vector<float> w(2 * 64, 1.0f);
  TensorView wv(w.data(), DType::kF32, {2, 64});
  expect_error([&] { quant::affine_quantize(wv, 64, 7); }, "affine_quantize", "got 7");
  expect_error([&] { quant::affine_quantize(wv, 48, 4); }, "affine_quantize", "got 48");
  std::vector<float> odd(2 * 67, 1.0f);
  expect_error([&] { quant::affine_quantize(TensorView(odd.data(), DType::kF32, {2, 67}), 64, 4); },
               "affine_quantize", "got 67");
  std::vector<int32_t> ints(128);
  expect_error([&] { quant::affine_quantize(TensorView(ints.data(), DType::kI32, {2, 64}), 64, 4); },
               "affine_quantize", "int32");
  w[5] = std::nanf("");
  expect_error([&] { quant::affine_quantize(wv, 64, 4); }, "affine_quantize", "nan");
  w[5] = INFINITY;
  expect_error([&] { quant::affine_quantize(wv, 64, 4); }, "affine_quantize", "inf");
  w[5] = 1.0f;
  // Wrong output shapes.
  Tensor p(DType::kU32, {2, 7}), s(DType::kF32, {2, 1}), b(DType::kF32, {2, 1});
  expect_error([&] { quant::affine_quantize(wv, 64, 4, p.view(), s.view(), b.view()); }, "affine_quantize",
               "(2, 7)");
  Tensor p2(DType::kU32, {2, 8}), s16(DType::kF16, {2, 1}), b16(DType::kF16, {2, 1});
  expect_error([&] { quant::affine_quantize(wv, 64, 4, p2.view(), s16.view(), b16.view()); }, "affine_quantize",
               "float16");
}

TEST(AffineRejects, DequantizeMismatchedScalesAndOut) {
  std::vector<float> w(2 * 64, 1.0f);
  auto q = quant::affine_quantize(TensorView(w.data(), DType::kF32, {2, 64}), 64, 4);
  Tensor bad_s(DType::kF32, {2, 2});
  expect_error([&] { quant::affine_dequantize(q.packed.view(), bad_s.view(), q.biases.view(), 64, 4, DType::kF32); },
               "affine_dequantize", "(2, 2)");
  Tensor s16(DType::kF16, {2, 1});
  expect_error([&] { quant::affine_dequantize(q.packed.view(), q.scales.view(), s16.view(), 64, 4, DType::kF32); },
               "affine_dequantize", "float16");
  Tensor out(DType::kF32, {2, 65});
  expect_error([&] { quant::affine_dequantize(q.packed.view(), q.scales.view(), q.biases.view(), 64, 4, out.view()); },
               "affine_dequantize", "(2, 65)");
  expect_error([&] { quant::affine_dequantize(q.packed.view(), q.scales.view(), q.biases.view(), 64, 9, DType::kF32); },
               "affine_dequantize", "got 9");
}

TEST(AffineRejects, QuantizedMatmulShapes) {
  std::vector<float> w(33 * 64, 0.5f);
  auto q = quant::affine_quantize(TensorView(w.data(), DType::kF32, {33, 64}), 64, 4);
  std::vector<float> x(5 * 63, 1.0f), y(5 * 33);
  expect_error([&] {
    nn::quantized_matmul(TensorView(x.data(), DType::kF32, {5, 63}), q.packed.view(), q.scales.view(),
                         q.biases.view(), true, 64, 4, TensorView(y.data(), DType::kF32, {5, 33}));
  }, "quantized_matmul", "(5, 63)");
  std::vector<float> x2(5 * 64, 1.0f);
  expect_error([&] {
    nn::quantized_matmul(TensorView(x2.data(), DType::kF32, {5, 64}), q.packed.view(), q.scales.view(),
                         q.biases.view(), true, 64, 4, TensorView(y.data(), DType::kF32, {5, 32}));
  }, "quantized_matmul", "(5, 32)");
  expect_error([&] {
    nn::quantized_matmul(TensorView(x2.data(), DType::kF32, {5, 64}), q.packed.view(), q.scales.view(),
                         q.biases.view(), true, 32, 4, TensorView(y.data(), DType::kF32, {5, 33}));
  }, "quantized_matmul", "(33, 2)");
  // Batched shapes that do not broadcast.
  std::vector<float> wb(2 * 8 * 64, 0.5f);
  auto qb = quant::affine_quantize(TensorView(wb.data(), DType::kF32, {2, 8, 64}), 64, 4);
  std::vector<float> xb(3 * 4 * 64, 1.0f), yb(3 * 4 * 8);
  expect_error([&] {
    nn::quantized_matmul(TensorView(xb.data(), DType::kF32, {3, 4, 64}), qb.packed.view(), qb.scales.view(),
                         qb.biases.view(), true, 64, 4, TensorView(yb.data(), DType::kF32, {3, 4, 8}));
  }, "quantized_matmul", "(3)");
}

}  // namespace
}  // namespace cider
