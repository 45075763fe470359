// cider's affine quantization against vectors produced by MLX itself (tools/gen_mlx_affine_vectors.py, MLX 0.32 CPU).
// quantize and dequantize must match bit for bit; quantized_matmul to float32-accumulation accuracy.
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "nn/quantized_matmul.h"
#include "quant/affine.h"
#include "support/test_support.h"

namespace cider {
namespace {

const std::string kDir = std::string(CIDER_SOURCE_DIR) + "/tests/data/mlx_affine/";

DType parse_dtype(const std::string& s) {
  if (s == "float32") return DType::kF32;
  if (s == "float16") return DType::kF16;
  if (s == "bfloat16") return DType::kBF16;
  if (s == "uint32") return DType::kU32;
  throw std::runtime_error("unknown dtype " + s);
}

struct Array {
  std::vector<uint8_t> bytes;
  DType dtype;
  std::vector<int64_t> shape;
  TensorView view() const { return TensorView(bytes.data(), dtype, shape); }
  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

struct Case {
  std::string name;
  int bits, group_size;
  std::vector<uint8_t> blob;
  nlohmann::json files;
  Array get(const std::string& key) const {
    const auto& f = files.at(key);
    Array a;
    a.dtype = parse_dtype(f.at("dtype"));
    a.shape = f.at("shape").get<std::vector<int64_t>>();
    size_t off = f.at("offset"), n = f.at("nbytes");
    a.bytes.assign(blob.begin() + static_cast<std::ptrdiff_t>(off), blob.begin() + static_cast<std::ptrdiff_t>(off + n));
    return a;
  }
};

std::vector<Case> load_cases() {
  std::ifstream mf(kDir + "manifest.json");
  if (!mf) throw std::runtime_error("cannot open " + kDir + "manifest.json");
  nlohmann::json m = nlohmann::json::parse(mf);
  std::vector<Case> cases;
  for (const auto& c : m.at("cases")) {
    Case k;
    k.name = c.at("name");
    k.bits = c.at("bits");
    k.group_size = c.at("group_size");
    k.files = c.at("files");
    std::ifstream bf(kDir + k.name + ".bin", std::ios::binary);
    k.blob.assign(std::istreambuf_iterator<char>(bf), {});
    cases.push_back(std::move(k));
  }
  return cases;
}

TEST(MlxVectors, ManifestCoversEveryBitsGroupSizeAndDtype) {
  auto cases = load_cases();
  EXPECT_EQ(cases.size(), 6u * 3u * 3u);
}

TEST(MlxVectors, QuantizeMatchesMlxBitForBit) {
  for (const Case& c : load_cases()) {
    SCOPED_TRACE(c.name);
    Array w = c.get("w"), packed = c.get("packed"), scales = c.get("scales"), biases = c.get("biases");
    auto q = quant::affine_quantize(w.view(), c.group_size, c.bits);
    ASSERT_EQ(q.packed.shape, packed.shape);
    ASSERT_EQ(q.scales.shape, scales.shape);
    ASSERT_EQ(0, std::memcmp(q.scales.buffer.data(), scales.bytes.data(), scales.bytes.size())) << "scales differ";
    ASSERT_EQ(0, std::memcmp(q.biases.buffer.data(), biases.bytes.data(), biases.bytes.size())) << "biases differ";
    const uint32_t* got = q.packed.ptr<uint32_t>();
    const uint32_t* want = reinterpret_cast<const uint32_t*>(packed.bytes.data());
    for (int64_t i = 0; i < packed.numel(); ++i) ASSERT_EQ(got[i], want[i]) << "packed word " << i;
  }
}

TEST(MlxVectors, DequantizeMatchesMlxBitForBit) {
  for (const Case& c : load_cases()) {
    SCOPED_TRACE(c.name);
    Array packed = c.get("packed"), scales = c.get("scales"), biases = c.get("biases"), deq = c.get("dequantized");
    Tensor out = quant::affine_dequantize(packed.view(), scales.view(), biases.view(), c.group_size, c.bits,
                                          deq.dtype);
    ASSERT_EQ(out.shape, deq.shape);
    ASSERT_EQ(0, std::memcmp(out.buffer.data(), deq.bytes.data(), deq.bytes.size()));
  }
}

// MLX's CPU path dequantizes with rounding in the input dtype and accumulates in it; cider computes q·scale + bias
// and accumulates in float32. They agree to the accumulation error K·eps·Σ|x·w| plus the dequantization rounding
// eps·Σ|x|·(|w| + 2|bias|) per output.
TEST(MlxVectors, QuantizedMatmulMatchesMlx) {
  for (const Case& c : load_cases()) {
    SCOPED_TRACE(c.name);
    Array packed = c.get("packed"), scales = c.get("scales"), biases = c.get("biases"), deq = c.get("dequantized");
    const int64_t groups = biases.shape[1];
    for (bool transpose : {true, false}) {
      Array x = c.get(transpose ? "x_t" : "x_n"), y = c.get(transpose ? "y_t" : "y_n");
      Tensor out(y.dtype, y.shape);
      nn::quantized_matmul(x.view(), packed.view(), scales.view(), biases.view(), transpose, c.group_size, c.bits,
                           out.view());
      const int64_t M = x.shape[0], Kx = x.shape[1], N = y.shape[1];
      const int64_t Kw = deq.shape[1];
      const double eps = y.dtype == DType::kF32 ? 1.2e-7 : y.dtype == DType::kF16 ? 9.8e-4 : 7.9e-3;
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          double abs_sum = 0.0, deq_err = 0.0;
          for (int64_t k = 0; k < Kx; ++k) {
            double xv = load_float(x.bytes.data(), x.dtype, m * Kx + k);
            double wv = transpose ? load_float(deq.bytes.data(), deq.dtype, n * Kw + k)
                                  : load_float(deq.bytes.data(), deq.dtype, k * Kw + n);
            double bv = transpose ? load_float(biases.bytes.data(), biases.dtype, n * groups + k / c.group_size)
                                  : load_float(biases.bytes.data(), biases.dtype, k * groups + n / c.group_size);
            abs_sum += std::fabs(xv * wv);
            deq_err += std::fabs(xv) * (std::fabs(wv) + 2.0 * std::fabs(bv));
          }
          double got = load_float(out.buffer.data(), out.dtype, m * N + n);
          double want = load_float(y.bytes.data(), y.dtype, m * N + n);
          double tol = static_cast<double>(Kx) * eps * abs_sum + eps * deq_err + eps * std::fabs(want);
          ASSERT_FALSE(std::isnan(got));
          ASSERT_LE(std::fabs(got - want), tol) << "transpose " << transpose << " m " << m << " n " << n;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cider
