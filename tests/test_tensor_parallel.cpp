// Tensor-parallel shares of a model (model/tensor_parallel.h): tp_range's split, the row / column / per-part shares
// of every weight kind checked byte for byte against the source layer and through the active CPU kernels (row
// shares bit-exact; column shares summed over the ranks within a bound derived from the arithmetic), the shares'
// rejections, and check_tensor_parallel / tp_shard_config on hand-built configs. Layers are random (codes, scales
// whose magnitude varies by 2^±3 so a scale taken from the wrong row or group shows), shapes have tails, every
// element is compared, and NaN never passes (outputs start as NaN bytes in canary-guarded buffers).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/tensor_parallel.h"
#include "support/test_support.h"

namespace cider {
namespace {

using model::Linear;
using model::LinearShare;
using model::tp_range;
using nn::WeightKind;

constexpr double kU = 0x1p-24;  // float32 unit roundoff

struct Spec {
  const char* name;
  WeightKind kind;
  DType dtype;
  int gs;
};
const Spec kSpecs[] = {
    {"f32", WeightKind::kDense, DType::kF32, 0},     {"bf16", WeightKind::kDense, DType::kBF16, 0},
    {"int8/channel", WeightKind::kInt8, DType::kI8, 0}, {"int8/g64", WeightKind::kInt8, DType::kI8, 64},
    {"int8/g128", WeightKind::kInt8, DType::kI8, 128},  {"int4/channel", WeightKind::kInt4, DType::kU8, 0},
    {"int4/g32", WeightKind::kInt4, DType::kU8, 32},    {"int4/g64", WeightKind::kInt4, DType::kU8, 64},
    {"int4/g128", WeightKind::kInt4, DType::kU8, 128}};
bool is_int(const Spec& s) { return s.kind != WeightKind::kDense; }
// Inputs per indivisible piece of a row for share_cols: a group, an int4 byte pair, or one value.
int64_t col_unit(const Spec& s) { return s.gs > 0 ? s.gs : s.kind == WeightKind::kInt4 ? 2 : 1; }

// A random layer owning its tensors, and its weights as the kernels see them (float64, dequantized).
struct Layer {
  std::vector<uint8_t> w;
  std::vector<float> scales, bias;
  std::vector<double> deq;  // [N, K]
  Linear L;
  int64_t row_bytes = 0;
};

Layer make_layer(std::mt19937_64& rng, const Spec& s, int64_t N, int64_t K, bool with_bias) {
  Layer l;
  l.L.name = "model.layers.0.test_proj";
  l.L.kind = s.kind;
  l.L.N = N;
  l.L.K = K;
  l.L.w_dtype = s.dtype;
  l.L.group_size = s.gs;
  std::uniform_int_distribution<int> byte(0, 255), code(-127, 127);
  std::uniform_real_distribution<float> expo(-3.0f, 3.0f);
  if (s.kind == WeightKind::kDense) {
    l.w = test::to_dtype_bytes(test::randn(rng, static_cast<size_t>(N * K)), s.dtype);
    l.row_bytes = K * dtype_size(s.dtype);
  } else if (s.kind == WeightKind::kInt8) {
    l.w.resize(static_cast<size_t>(N * K));
    for (auto& b : l.w) b = static_cast<uint8_t>(static_cast<int8_t>(code(rng)));
    l.row_bytes = K;
  } else {  // int4: any nibble is a code (q + 8)
    l.w.resize(static_cast<size_t>(N * K / 2));
    for (auto& b : l.w) b = static_cast<uint8_t>(byte(rng));
    l.row_bytes = K / 2;
  }
  if (is_int(s)) {
    l.scales.resize(static_cast<size_t>(s.gs == 0 ? N : K / s.gs * N));
    for (auto& v : l.scales) v = 0.01f * std::exp2(expo(rng));
  }
  if (with_bias) l.bias = test::randn(rng, static_cast<size_t>(N));
  l.L.w = l.w.data();
  l.L.scales = l.scales.empty() ? nullptr : l.scales.data();
  l.L.bias = l.bias.empty() ? nullptr : l.bias.data();
  const std::vector<float> dense = s.kind == WeightKind::kDense
                                       ? test::from_dtype_bytes(l.w.data(), s.dtype, static_cast<size_t>(N * K))
                                       : std::vector<float>();
  l.deq.resize(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(n * K + k);
      if (s.kind == WeightKind::kDense) { l.deq[i] = dense[i]; continue; }
      const int q = s.kind == WeightKind::kInt8 ? static_cast<int8_t>(l.w[i])
                                                : static_cast<int>((l.w[static_cast<size_t>(n * K / 2 + k / 2)] >>
                                                                    (k % 2 == 0 ? 0 : 4)) & 15) - 8;
      l.deq[i] = q * static_cast<double>(l.scales[static_cast<size_t>(s.gs == 0 ? n : k / s.gs * N + n)]);
    }
  return l;
}

// out [M, N] = the layer's forward on x through the active kernel table; unwritten elements stay NaN.
std::vector<float> forward(const nn::LinearWeights& L, const std::vector<float>& x, int64_t M) {
  test::GuardedBuffer out(static_cast<size_t>(M * L.N) * sizeof(float));
  out.fill_inside(0xFF);
  L.forward(x.data(), M, out.as<float>());
  EXPECT_TRUE(out.canaries_intact());
  return std::vector<float>(out.as<float>(), out.as<float>() + M * L.N);
}

// Columns [k0, k1) of x [M, K].
std::vector<float> cols(const std::vector<float>& x, int64_t M, int64_t K, int64_t k0, int64_t k1) {
  std::vector<float> s;
  for (int64_t m = 0; m < M; ++m) s.insert(s.end(), x.begin() + m * K + k0, x.begin() + m * K + k1);
  return s;
}

// Bit-identical floats, neither NaN.
::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::isnan(got[i]) || std::isnan(want[i]) || std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i];
  return ::testing::AssertionSuccess();
}

// ---- tp_range -------------------------------------------------------------------------------------------------

TEST(TensorParallel, RangesAreContiguousBalancedAndCoverEverything) {
  for (int64_t n : {0, 1, 7, 8, 13, 128256}) {
    for (int size = 1; size <= 8; ++size) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " size " << size);
      int64_t end = 0;
      for (int r = 0; r < size; ++r) {
        const auto [b, e] = tp_range(n, r, size);
        EXPECT_EQ(b, end) << "rank " << r;
        EXPECT_EQ(e - b, n / size + (r < n % size ? 1 : 0)) << "rank " << r;
        end = e;
      }
      EXPECT_EQ(end, n);
    }
  }
}

// ---- share_rows: output rows, bit-exact ------------------------------------------------------------------------

// Same rows, same activations → the kernels do the same arithmetic per element, so the share's forward is the whole
// forward's columns [r0, r1) exactly; the share's bytes are the source rows'.
TEST(TensorParallel, RowSharesOfEveryKindAreTheWholeLayersColumnsBitExact) {
  auto rng = test::make_rng(1);
  const int64_t N = 37;
  for (const Spec& s : kSpecs) {
    const int64_t K = s.gs > 0 ? 3 * s.gs : s.kind == WeightKind::kInt4 ? 130 : 67;
    for (bool bias : {false, true}) {
      const Layer l = make_layer(rng, s, N, K, bias);
      std::vector<std::pair<int64_t, int64_t>> ranges = {{0, N}, {N - 1, N}, {5, 5}};
      for (int r = 0; r < 3; ++r) ranges.push_back(tp_range(N, r, 3));
      for (int64_t M : {1, 3, 17}) {
        const std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
        const std::vector<float> full = forward(l.L, x, M);
        for (const auto& [r0, r1] : ranges) {
          SCOPED_TRACE(::testing::Message() << s.name << " bias " << bias << " M " << M << " rows [" << r0 << ", "
                                            << r1 << ")");
          const LinearShare sh = model::share_rows(l.L, r0, r1);
          const int64_t n = r1 - r0;
          ASSERT_EQ(sh.linear.N, n);
          ASSERT_EQ(sh.linear.K, K);
          ASSERT_TRUE(sh.linear.kind == s.kind && sh.linear.w_dtype == s.dtype && sh.linear.group_size == s.gs);
          EXPECT_EQ(std::memcmp(sh.linear.w, l.w.data() + r0 * l.row_bytes, static_cast<size_t>(n * l.row_bytes)), 0);
          for (int64_t g = 0; is_int(s) && g < (s.gs == 0 ? 1 : K / s.gs); ++g) {
            for (int64_t i = 0; i < n; ++i)
              ASSERT_EQ(sh.linear.scales[g * n + i], l.scales[static_cast<size_t>(g * N + r0 + i)]) << g << "," << i;
          }
          ASSERT_EQ(sh.linear.bias != nullptr, bias);
          for (int64_t i = 0; bias && i < n; ++i) ASSERT_EQ(sh.linear.bias[i], l.bias[static_cast<size_t>(r0 + i)]);
          std::vector<float> want;
          for (int64_t m = 0; m < M; ++m) want.insert(want.end(), full.begin() + m * N + r0, full.begin() + m * N + r1);
          EXPECT_TRUE(same_bits(forward(sh.linear, x, M), want));
        }
      }
    }
  }
}

// ---- share_cols: input columns, summed over the ranks ----------------------------------------------------------

// Rank r holds columns [k0, k1) = tp_range(K / unit, r, size)·unit and the bias on rank 0 only; Σ_r y_r (summed here
// in float64, exact enough) against the whole layer's y, per element:
//  dense: each forward is a float32 dot product (FMA or not, any order) plus the bias: off the exact value by at most
//    (K_r + 1)·u·(Σ_{k∈r} |x_k·w_nk| + |b|). The full forward and the ranks' together: ≤ 2(K + size + 2)·u·(A + |b|),
//    A = Σ_k |x_k·w_nk| (bf16 weights are widened exactly, x stays float32, so bf16 changes nothing here).
//  int: each forward quantizes its own x to int8 per row: sx = max|x over its columns| / 127, |x − xq·sx| ≤
//    sx·(0.5 + 128u). The integer sums are exact, so exactly y = Σ_k xq_k·sx·ŵ_nk + b (ŵ the dequantized weight), and
//    |y_split − y_full| ≤ Σ_k |ŵ_nk|·(s_piece(k) + s_full)·(0.5 + 128u), plus each forward's float32 epilogue
//    (float(acc), ·sw, the G group sums, ·sx, +b: ≤ (G + 3)·u·(Σ_k |ŵ_nk|·(|x_k| + s) + |b|) + u|y|, see
//    tests/test_linear.cpp), bounded together by (G + size + 8)·u·(T_full + T_split + 2|b|).
TEST(TensorParallel, ColumnSharesSumToTheWholeLayerWithinTheirRoundingBound) {
  auto rng = test::make_rng(2);
  const int64_t N = 37;
  for (const Spec& s : kSpecs) {
    const int64_t K = s.gs > 0 ? 5 * s.gs : s.kind == WeightKind::kInt4 ? 130 : 131, unit = col_unit(s);
    const int64_t G = s.gs > 0 ? K / s.gs : 1;
    const Layer l = make_layer(rng, s, N, K, true);
    for (int size = 1; size <= 4; ++size) {
      for (int64_t M : {1, 3, 17}) {
        SCOPED_TRACE(::testing::Message() << s.name << " size " << size << " M " << M);
        std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
        for (int64_t k = 0; k < K / 3; ++k) x[static_cast<size_t>(k)] *= 8.0f;  // pieces of row 0 differ in range
        const std::vector<float> full = forward(l.L, x, M);
        std::vector<double> sum(static_cast<size_t>(M * N), 0.0);
        std::vector<int64_t> bounds = {0};
        for (int r = 0; r < size; ++r) {
          const auto [u0, u1] = tp_range(K / unit, r, size);
          const int64_t k0 = u0 * unit, k1 = u1 * unit;
          bounds.push_back(k1);
          const LinearShare sh = model::share_cols(l.L, k0, k1, r == 0);
          ASSERT_EQ(sh.linear.N, N);
          ASSERT_EQ(sh.linear.K, k1 - k0);
          ASSERT_TRUE(sh.linear.kind == s.kind && sh.linear.w_dtype == s.dtype && sh.linear.group_size == s.gs);
          const int64_t bytes = l.row_bytes * (k1 - k0) / K, at = l.row_bytes * k0 / K;
          for (int64_t n = 0; n < N; ++n)
            ASSERT_EQ(std::memcmp(static_cast<const uint8_t*>(sh.linear.w) + n * bytes,
                                  l.w.data() + n * l.row_bytes + at, static_cast<size_t>(bytes)), 0) << "row " << n;
          for (int64_t g = 0; is_int(s) && g < (s.gs == 0 ? 1 : (k1 - k0) / s.gs); ++g) {
            for (int64_t n = 0; n < N; ++n)
              ASSERT_EQ(sh.linear.scales[g * N + n],
                        l.scales[static_cast<size_t>((s.gs == 0 ? 0 : k0 / s.gs + g) * N + n)]) << g << "," << n;
          }
          ASSERT_EQ(sh.linear.bias != nullptr, r == 0);
          for (int64_t n = 0; r == 0 && n < N; ++n) ASSERT_EQ(sh.linear.bias[n], l.bias[static_cast<size_t>(n)]);
          const std::vector<float> y = forward(sh.linear, cols(x, M, K, k0, k1), M);
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
        }
        for (int64_t m = 0; m < M; ++m) {
          const float* xm = x.data() + m * K;
          auto act_scale = [&](int64_t k0, int64_t k1) {  // the kernels' per-row activation scale over [k0, k1)
            float amax = 0.0f;
            for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(xm[k]));
            return amax == 0.0f ? 1.0 : static_cast<double>(amax / 127.0f);
          };
          const double s_full = act_scale(0, K);
          std::vector<double> s_piece(static_cast<size_t>(K));
          for (int r = 0; r < size; ++r)
            std::fill(s_piece.begin() + bounds[r], s_piece.begin() + bounds[r + 1], act_scale(bounds[r], bounds[r + 1]));
          for (int64_t n = 0; n < N; ++n) {
            double A = 0, Q = 0, T_full = 0, T_split = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double w = std::fabs(l.deq[static_cast<size_t>(n * K + k)]), xa = std::fabs(xm[k]);
              A += w * xa;
              Q += w * (s_piece[static_cast<size_t>(k)] + s_full);
              T_full += w * (xa + s_full);
              T_split += w * (xa + s_piece[static_cast<size_t>(k)]);
            }
            const double b = std::fabs(l.bias[static_cast<size_t>(n)]);
            const double tol = is_int(s) ? Q * (0.5 + 128 * kU) + static_cast<double>(G + size + 8) * kU * (T_full + T_split + 2 * b)
                                         : 2.0 * static_cast<double>(K + size + 2) * kU * (A + b);
            const size_t i = static_cast<size_t>(m * N + n);
            const double got = sum[i], want = full[i];
            ASSERT_TRUE(std::abs(got - want) <= tol * (1 + 1e-9))
                << "m " << m << " n " << n << ": split " << got << ", whole " << want << ", |diff| "
                << std::abs(got - want) << " > " << tol;
          }
        }
      }
    }
  }
}

TEST(TensorParallel, ColumnSharesRejectRangesOffTheWeightsUnits) {
  auto rng = test::make_rng(3);
  const auto bad = [](const Linear& L, int64_t k0, int64_t k1) {
    return test::throws_code([&] { model::share_cols(L, k0, k1, true); }, ErrorCode::kInvalidArgument, "columns [");
  };
  const Layer g8 = make_layer(rng, {"int8/g64", WeightKind::kInt8, DType::kI8, 64}, 5, 256, true);
  EXPECT_TRUE(bad(g8.L, 32, 256));  // k0 inside a group
  EXPECT_TRUE(bad(g8.L, 0, 96));    // k1 inside a group
  EXPECT_TRUE(bad(g8.L, 64, 64));   // empty
  EXPECT_TRUE(bad(g8.L, 0, 320));   // past K
  const Layer g4 = make_layer(rng, {"int4/g32", WeightKind::kInt4, DType::kU8, 32}, 5, 128, false);
  EXPECT_TRUE(bad(g4.L, 16, 128));
  EXPECT_TRUE(bad(g4.L, 0, 48));
  const Layer c4 = make_layer(rng, {"int4/channel", WeightKind::kInt4, DType::kU8, 0}, 5, 130, false);
  EXPECT_TRUE(bad(c4.L, 1, 130));  // odd: splits a byte
  EXPECT_TRUE(bad(c4.L, 0, 65));
  EXPECT_TRUE(bad(c4.L, 10, 10));
  EXPECT_NO_THROW(model::share_cols(c4.L, 2, 64, false));
  const Layer d = make_layer(rng, {"f32", WeightKind::kDense, DType::kF32, 0}, 5, 67, false);
  EXPECT_TRUE(bad(d.L, 3, 3));
  EXPECT_TRUE(bad(d.L, 5, 4));
  EXPECT_TRUE(bad(d.L, -1, 4));
  EXPECT_NO_THROW(model::share_cols(d.L, 3, 4, false));
  EXPECT_TRUE(test::throws_code([&] { model::share_rows(d.L, 2, 6); }, ErrorCode::kInvalidArgument, "rows ["));
}

// ---- share_rows_of_parts: rows [r0, r1) of each part, bit-exact -------------------------------------------------

TEST(TensorParallel, PartSharesAreEachPartsColumnsBitExact) {
  auto rng = test::make_rng(4);
  const int64_t P = 19;  // rows per part
  const Spec specs[] = {kSpecs[0], kSpecs[1], kSpecs[4], kSpecs[5], kSpecs[6]};
  for (const Spec& s : specs) {
    for (int64_t parts : {2, 3}) {
      const int64_t K = s.gs > 0 ? 2 * s.gs : 130, N = parts * P;
      const Layer l = make_layer(rng, s, N, K, true);
      std::vector<std::pair<int64_t, int64_t>> ranges = {{0, P}, {P - 1, P}};
      for (int r = 0; r < 4; ++r) ranges.push_back(tp_range(P, r, 4));
      for (int64_t M : {1, 3, 17}) {
        const std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
        const std::vector<float> full = forward(l.L, x, M);
        for (const auto& [r0, r1] : ranges) {
          SCOPED_TRACE(::testing::Message() << s.name << " parts " << parts << " M " << M << " rows [" << r0 << ", "
                                            << r1 << ")");
          const LinearShare sh = model::share_rows_of_parts(l.L, P, r0, r1);
          ASSERT_EQ(sh.linear.N, parts * (r1 - r0));
          std::vector<float> want;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t p = 0; p < parts; ++p)
              want.insert(want.end(), full.begin() + m * N + p * P + r0, full.begin() + m * N + p * P + r1);
          EXPECT_TRUE(same_bits(forward(sh.linear, x, M), want));
        }
      }
    }
  }
}

// ---- check_tensor_parallel / tp_shard_config -------------------------------------------------------------------

model::ModelConfig llama_like() {
  model::ModelConfig c;
  c.arch = model::Architecture::kLlama;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 4;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position = 8192;
  return c;
}

TEST(TensorParallel, ChecksAndShardsAModelConfig) {
  using model::WeightFormat;
  const model::ModelConfig c = llama_like();
  for (WeightFormat f : {WeightFormat::kF32, WeightFormat::kBF16, WeightFormat::kW8A8, WeightFormat::kW8A8G64,
                         WeightFormat::kW8A8G128, WeightFormat::kW8A8G256, WeightFormat::kW4A8, WeightFormat::kNative})
    for (int size : {1, 2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << model::weight_format_name(f) << " size " << size);
      EXPECT_NO_THROW(model::check_tensor_parallel(c, f, size));
      const model::ModelConfig s = model::tp_shard_config(c, size);
      EXPECT_EQ(s.num_heads, 32 / size);
      EXPECT_EQ(s.num_kv_heads, 8 / size);
      EXPECT_EQ(s.intermediate_size, 14336 / size);
      EXPECT_EQ(s.head_dim, 128);
      EXPECT_EQ(s.hidden_size, 4096);
      EXPECT_EQ(s.vocab_size, 128256);
      EXPECT_EQ(s.num_layers, 4);
    }

  const auto refused = [](const model::ModelConfig& m, WeightFormat f, int size, ErrorCode code, const char* needle) {
    return test::throws_code([&] { model::check_tensor_parallel(m, f, size); }, code, needle);
  };
  for (int size : {0, 9, -1}) EXPECT_TRUE(refused(c, WeightFormat::kBF16, size, ErrorCode::kInvalidArgument, "--tp"));

  model::ModelConfig odd = c;  // anything goes on one rank
  odd.num_kv_heads = 3;
  odd.intermediate_size = 1000;
  odd.layer_linear = {0, 1, 0, 1};
  odd.qk_norm = odd.qk_norm_full = true;
  EXPECT_NO_THROW(model::check_tensor_parallel(odd, WeightFormat::kW8A8G128, 1));

  model::ModelConfig kv = c;
  kv.num_kv_heads = 6;
  EXPECT_TRUE(refused(kv, WeightFormat::kBF16, 4, ErrorCode::kUnsupported, "KV heads"));
  EXPECT_NO_THROW(model::check_tensor_parallel(kv, WeightFormat::kBF16, 2));
  model::ModelConfig mlp = c;
  mlp.intermediate_size = 14338;
  EXPECT_TRUE(refused(mlp, WeightFormat::kBF16, 4, ErrorCode::kUnsupported, "intermediate"));
  model::ModelConfig groups = c;  // I / 2 = 192: a whole number of groups of 64, not of 128
  groups.intermediate_size = 384;
  EXPECT_NO_THROW(model::check_tensor_parallel(groups, WeightFormat::kBF16, 2));
  EXPECT_NO_THROW(model::check_tensor_parallel(groups, WeightFormat::kW8A8G64, 2));
  EXPECT_NO_THROW(model::check_tensor_parallel(groups, WeightFormat::kW8A8, 2));
  EXPECT_TRUE(refused(groups, WeightFormat::kW8A8G128, 2, ErrorCode::kUnsupported, "down_proj"));
  EXPECT_TRUE(refused(groups, WeightFormat::kNative, 2, ErrorCode::kUnsupported, "down_proj"));
  model::ModelConfig moe = c;
  moe.num_experts = 8;
  moe.experts_per_token = 2;
  moe.expert_intermediate_size = 1026;
  moe.layer_moe = {1, 1, 1, 1};
  EXPECT_TRUE(refused(moe, WeightFormat::kBF16, 4, ErrorCode::kUnsupported, "experts"));
  model::ModelConfig hybrid = c;
  hybrid.layer_linear = {1, 1, 1, 0};
  hybrid.linear_attn = {16, 32, 128, 128, 4};
  EXPECT_TRUE(refused(hybrid, WeightFormat::kBF16, 2, ErrorCode::kUnsupported, "linear-attention"));
  model::ModelConfig qkn = c;
  qkn.qk_norm = qkn.qk_norm_full = true;
  EXPECT_TRUE(refused(qkn, WeightFormat::kBF16, 2, ErrorCode::kUnsupported, "q/k norms"));
}

}  // namespace
}  // namespace cider
