// The C API (include/cider/cider.h) driven as a C caller would: results equal the C++ API's, every failure returns
// a status and a message naming the operation and the value.
#include "cider/cider.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "nn/linear.h"
#include "quant/affine.h"
#include "support/test_support.h"

namespace {

cider_tensor tensor(void* data, cider_dtype dtype, std::initializer_list<int64_t> shape) {
  cider_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t d : shape) t.shape[i++] = d;
  return t;
}

void expect_failure(cider_status st, cider_status want, const std::string& op, const std::string& value) {
  EXPECT_EQ(st, want) << cider_last_error();
  std::string msg = cider_last_error();
  EXPECT_NE(msg.find(op), std::string::npos) << msg;
  EXPECT_NE(msg.find(value), std::string::npos) << msg;
}

TEST(CApi, AffineQuantizeDequantizeAndMatmulMatchCpp) {
  auto rng = cider::test::make_rng(301);
  const int64_t N = 33, K = 128, M = 7;
  std::vector<float> w = cider::test::randn(rng, N * K), x = cider::test::randn(rng, M * K);
  std::vector<uint32_t> packed(N * K * 4 / 32);
  std::vector<float> scales(N * 2), biases(N * 2), deq(N * K), y(M * N);
  cider_tensor tw = tensor(w.data(), CIDER_F32, {N, K}), tp = tensor(packed.data(), CIDER_U32, {N, K / 8}),
               ts = tensor(scales.data(), CIDER_F32, {N, 2}), tb = tensor(biases.data(), CIDER_F32, {N, 2}),
               td = tensor(deq.data(), CIDER_F32, {N, K}), tx = tensor(x.data(), CIDER_F32, {M, K}),
               ty = tensor(y.data(), CIDER_F32, {M, N});
  ASSERT_EQ(cider_affine_quantize(&tw, 64, 4, &tp, &ts, &tb), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(cider_last_error(), "");
  ASSERT_EQ(cider_affine_dequantize(&tp, &ts, &tb, 64, 4, &td), CIDER_OK) << cider_last_error();
  ASSERT_EQ(cider_quantized_matmul(&tx, &tp, &ts, &tb, 1, 64, 4, &ty), CIDER_OK) << cider_last_error();

  auto q = cider::quant::affine_quantize(cider::TensorView(w.data(), cider::DType::kF32, {N, K}), 64, 4);
  EXPECT_EQ(0, std::memcmp(q.packed.buffer.data(), packed.data(), packed.size() * 4));
  EXPECT_EQ(0, std::memcmp(q.scales.buffer.data(), scales.data(), scales.size() * 4));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        acc += static_cast<double>(x[m * K + k]) * deq[n * K + k];
        mag += std::fabs(static_cast<double>(x[m * K + k]) * deq[n * K + k]);
      }
      ASSERT_NEAR(y[m * N + n], acc, 1e-5 * mag + 1e-6);
    }
}

TEST(CApi, AffineErrors) {
  std::vector<float> w(64, 1.0f);
  std::vector<uint32_t> p(8);
  std::vector<float> s(1), b(1);
  cider_tensor tw = tensor(w.data(), CIDER_F32, {1, 64}), tp = tensor(p.data(), CIDER_U32, {1, 8}),
               ts = tensor(s.data(), CIDER_F32, {1, 1}), tb = tensor(b.data(), CIDER_F32, {1, 1});
  expect_failure(cider_affine_quantize(&tw, 64, 7, &tp, &ts, &tb), CIDER_ERR_INVALID_ARGUMENT, "affine_quantize",
                 "got 7");
  expect_failure(cider_affine_quantize(nullptr, 64, 4, &tp, &ts, &tb), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_affine_quantize", "w must not be NULL");
  cider_tensor bad = tw;
  bad.dtype = 42;
  expect_failure(cider_affine_quantize(&bad, 64, 4, &tp, &ts, &tb), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_affine_quantize", "got 42");
  bad = tw;
  bad.rank = 9;
  expect_failure(cider_affine_quantize(&bad, 64, 4, &tp, &ts, &tb), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_affine_quantize", "got 9");
  cider_tensor tp_bad = tensor(p.data(), CIDER_U32, {1, 7});
  expect_failure(cider_affine_quantize(&tw, 64, 4, &tp_bad, &ts, &tb), CIDER_ERR_SHAPE_MISMATCH, "affine_quantize",
                 "(1, 7)");
  cider_tensor null_data = tw;
  null_data.data = nullptr;
  expect_failure(cider_affine_quantize(&null_data, 64, 4, &tp, &ts, &tb), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_affine_quantize", "null pointer");
  // A success clears the message.
  ASSERT_EQ(cider_affine_quantize(&tw, 64, 4, &tp, &ts, &tb), CIDER_OK);
  EXPECT_STREQ(cider_last_error(), "");
}

TEST(CApi, IntWeightsAndLinearMatchCpp) {
  auto rng = cider::test::make_rng(302);
  const int64_t N = 67, K = 256, M = 7;
  std::vector<float> w = cider::test::randn(rng, N * K), x = cider::test::randn(rng, M * K),
                     bias = cider::test::randn(rng, N);
  cider_tensor tw = tensor(w.data(), CIDER_F32, {N, K}), tx = tensor(x.data(), CIDER_F32, {M, K}),
               tbias = tensor(bias.data(), CIDER_F32, {N});
  // Raw weight quantizers.
  std::vector<int8_t> q8(N * K);
  std::vector<float> s8(2 * N);
  cider_tensor tq8 = tensor(q8.data(), CIDER_I8, {N, K}), ts8 = tensor(s8.data(), CIDER_F32, {2, N});
  ASSERT_EQ(cider_int8_quantize_weights(&tw, 128, 0.0f, &tq8, &ts8), CIDER_OK) << cider_last_error();
  auto ref8 = cider::quant::quantize_int8_weights(cider::TensorView(w.data(), cider::DType::kF32, {N, K}), 128);
  EXPECT_EQ(0, std::memcmp(ref8.q.buffer.data(), q8.data(), q8.size()));
  EXPECT_EQ(0, std::memcmp(ref8.scales.buffer.data(), s8.data(), s8.size() * 4));
  std::vector<uint8_t> q4(N * K / 2);
  std::vector<float> s4(N);
  cider_tensor tq4 = tensor(q4.data(), CIDER_U8, {N, K / 2}), ts4 = tensor(s4.data(), CIDER_F32, {N});
  ASSERT_EQ(cider_int4_quantize_weights(&tw, 0, &tq4, &ts4), CIDER_OK) << cider_last_error();
  auto ref4 = cider::quant::quantize_int4_weights(cider::TensorView(w.data(), cider::DType::kF32, {N, K}), 0);
  EXPECT_EQ(0, std::memcmp(ref4.packed.buffer.data(), q4.data(), q4.size()));
  cider_tensor ts4_bad = tensor(s4.data(), CIDER_F32, {N - 1});
  expect_failure(cider_int4_quantize_weights(&tw, 0, &tq4, &ts4_bad), CIDER_ERR_SHAPE_MISMATCH,
                 "cider_int4_quantize_weights", "(66)");

  // Linear layers through handles vs the C++ classes.
  cider::TensorView wv(w.data(), cider::DType::kF32, {N, K}), bv(bias.data(), cider::DType::kF32, {N}),
      xv(x.data(), cider::DType::kF32, {M, K});
  for (int fmt : {CIDER_W8A8, CIDER_W4A8}) {
    cider_linear* layer = nullptr;
    ASSERT_EQ(cider_linear_create(fmt, &tw, &tbias, 64, 0.0f, &layer), CIDER_OK) << cider_last_error();
    int64_t in = 0, out = 0;
    int gs = -1;
    size_t nbytes = 0;
    ASSERT_EQ(cider_linear_info(layer, &in, &out, &gs, &nbytes), CIDER_OK);
    EXPECT_EQ(in, K);
    EXPECT_EQ(out, N);
    EXPECT_EQ(gs, 64);
    EXPECT_GT(nbytes, 0u);
    std::vector<float> y(M * N), want(M * N);
    cider_tensor ty = tensor(y.data(), CIDER_F32, {M, N});
    ASSERT_EQ(cider_linear_forward(layer, &tx, &ty), CIDER_OK) << cider_last_error();
    cider::TensorView wantv(want.data(), cider::DType::kF32, {M, N});
    if (fmt == CIDER_W8A8)
      cider::nn::Int8Linear::from_float(wv, &bv, 64).forward(xv, wantv);
    else
      cider::nn::Int4Linear::from_float(wv, &bv, 64).forward(xv, wantv);
    EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * 4));
    cider_tensor ty_bad = tensor(y.data(), CIDER_F32, {M, N + 1});
    expect_failure(cider_linear_forward(layer, &tx, &ty_bad), CIDER_ERR_SHAPE_MISMATCH, "linear", "68");
    cider_linear_free(layer);
  }
  cider_linear* layer = nullptr;
  expect_failure(cider_linear_create(5, &tw, nullptr, 0, 0.0f, &layer),
                 CIDER_ERR_INVALID_ARGUMENT, "cider_linear_create", "got 5");
  expect_failure(cider_linear_create(CIDER_W8A8, &tw, nullptr, 48, 0.0f, &layer), CIDER_ERR_INVALID_ARGUMENT,
                 "from_float", "48");
  expect_failure(cider_linear_create(CIDER_W8A8, &tw, nullptr, 0, 0.0f, nullptr), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_linear_create", "NULL");
  EXPECT_EQ(layer, nullptr);
}

TEST(CApi, LinearFromMlxMatchesCpp) {
  auto rng = cider::test::make_rng(303);
  const int64_t N = 33, K = 128;
  std::vector<float> w = cider::test::randn(rng, N * K), x = cider::test::randn(rng, K);
  auto q = cider::quant::affine_quantize(cider::TensorView(w.data(), cider::DType::kF32, {N, K}), 64, 8);
  cider_tensor tp = tensor(q.packed.buffer.data(), CIDER_U32, {N, K / 4}),
               ts = tensor(q.scales.buffer.data(), CIDER_F32, {N, 2}),
               tb = tensor(q.biases.buffer.data(), CIDER_F32, {N, 2}), tx = tensor(x.data(), CIDER_F32, {1, K});
  cider_linear* layer = nullptr;
  ASSERT_EQ(cider_linear_create_from_mlx(CIDER_W8A8, &tp, &ts, &tb, 64, 8, nullptr, -1, 0.0f, &layer), CIDER_OK)
      << cider_last_error();
  int gs = -1;
  ASSERT_EQ(cider_linear_info(layer, nullptr, nullptr, &gs, nullptr), CIDER_OK);
  EXPECT_EQ(gs, 64);  // 8-bit MLX with group 64 keeps per-group INT8 with group 64
  std::vector<float> y(N), want(N);
  cider_tensor ty = tensor(y.data(), CIDER_F32, {1, N});
  ASSERT_EQ(cider_linear_forward(layer, &tx, &ty), CIDER_OK) << cider_last_error();
  cider::nn::Int8Linear::from_mlx_affine(q.packed.view(), q.scales.view(), q.biases.view(), 64, 8, nullptr)
      .forward(cider::TensorView(x.data(), cider::DType::kF32, {1, K}),
               cider::TensorView(want.data(), cider::DType::kF32, {1, N}));
  EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * 4));
  cider_linear_free(layer);
}

TEST(CApi, KVCacheLifecycleAndAttentionMatchCpp) {
  auto rng = cider::test::make_rng(304);
  const int64_t B = 1, Hq = 4, Hkv = 2, D = 64, T = 300, L = 3;
  std::vector<float> k = cider::test::randn(rng, B * Hkv * T * D), v = cider::test::randn(rng, B * Hkv * T * D),
                     q = cider::test::randn(rng, B * Hq * L * D);
  cider_kv_config cfg = cider_kv_config_default();
  EXPECT_EQ(cfg.k_bits, 8);
  EXPECT_EQ(cfg.v_bits, 4);
  EXPECT_EQ(cfg.group_size, 64);
  EXPECT_EQ(cfg.rotation, CIDER_ROTATION_HADAMARD);
  cider_kv_cache* cache = nullptr;
  ASSERT_EQ(cider_kv_cache_create(&cfg, &cache), CIDER_OK) << cider_last_error();
  cider_tensor tk = tensor(k.data(), CIDER_F32, {B, Hkv, T, D}), tv = tensor(v.data(), CIDER_F32, {B, Hkv, T, D}),
               tq = tensor(q.data(), CIDER_F32, {B, Hq, L, D});
  ASSERT_EQ(cider_kv_cache_append(cache, &tk, &tv), CIDER_OK) << cider_last_error();
  int64_t offset = 0;
  ASSERT_EQ(cider_kv_cache_offset(cache, &offset), CIDER_OK);
  EXPECT_EQ(offset, T);
  size_t nbytes = 0;
  ASSERT_EQ(cider_kv_cache_nbytes(cache, &nbytes), CIDER_OK);
  // capacity 512 positions; per position and head (the default K8/V4, g64, f16 scales): keys 64*8/8 + 2*1*2 bytes,
  // values 64*4/8 + 2*1*2 bytes.
  EXPECT_EQ(nbytes, static_cast<size_t>(B * Hkv * 512 * ((64 + 4) + (32 + 4))));

  // Same data through the C++ cache: identical attention output.
  cider::nn::QuantizedKVCache cpp_cache;
  cpp_cache.update_and_fetch(cider::TensorView(k.data(), cider::DType::kF32, {B, Hkv, T, D}),
                             cider::TensorView(v.data(), cider::DType::kF32, {B, Hkv, T, D}));
  std::vector<float> out(B * Hq * L * D), want(out.size());
  cider_tensor tout = tensor(out.data(), CIDER_F32, {B, Hq, L, D});
  const float scale = 0.125f;
  ASSERT_EQ(cider_attention(&tq, cache, scale, 1, 0, nullptr, &tout), CIDER_OK) << cider_last_error();
  cider::nn::AttentionMask mask;
  mask.kind = cider::kernels::MaskKind::kCausal;
  cider::nn::attention(cider::TensorView(q.data(), cider::DType::kF32, {B, Hq, L, D}), cpp_cache, scale, mask,
                       cider::TensorView(want.data(), cider::DType::kF32, {B, Hq, L, D}));
  EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * 4));

  // Snapshot, trim, restore: the restored cache attends exactly as before.
  cider_kv_snapshot* snap = nullptr;
  ASSERT_EQ(cider_kv_cache_snapshot(cache, &snap), CIDER_OK);
  int64_t removed = 0;
  ASSERT_EQ(cider_kv_cache_trim(cache, 1000, &removed), CIDER_OK);
  EXPECT_EQ(removed, T);
  ASSERT_EQ(cider_kv_cache_offset(cache, &offset), CIDER_OK);
  EXPECT_EQ(offset, 0);
  ASSERT_EQ(cider_kv_cache_restore(cache, snap), CIDER_OK) << cider_last_error();
  ASSERT_EQ(cider_kv_cache_offset(cache, &offset), CIDER_OK);
  EXPECT_EQ(offset, T);
  std::vector<float> out2(out.size());
  cider_tensor tout2 = tensor(out2.data(), CIDER_F32, {B, Hq, L, D});
  ASSERT_EQ(cider_attention(&tq, cache, scale, 1, 0, nullptr, &tout2), CIDER_OK) << cider_last_error();
  EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * 4));

  // Errors.
  expect_failure(cider_kv_cache_trim(cache, -1, nullptr), CIDER_ERR_INVALID_ARGUMENT, "cider_kv_cache_trim", "-1");
  expect_failure(cider_attention(&tq, cache, scale, 7, 0, nullptr, &tout), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_attention", "got 7");
  expect_failure(cider_attention(&tq, cache, scale, 2, 0, nullptr, &tout), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_attention", "mask_kind 2");
  cider_tensor tq_bad = tensor(q.data(), CIDER_F32, {B, 3, L, D});  // 3 query heads over 2 KV heads
  std::vector<float> o3(B * 3 * L * D);
  cider_tensor to3 = tensor(o3.data(), CIDER_F32, {B, 3, L, D});
  expect_failure(cider_attention(&tq_bad, cache, scale, 1, 0, nullptr, &to3), CIDER_ERR_SHAPE_MISMATCH,
                 "attention", "3");
  std::vector<float> k2(B * Hkv * 1 * 32);
  cider_tensor tk2 = tensor(k2.data(), CIDER_F32, {B, Hkv, 1, 32});
  expect_failure(cider_kv_cache_append(cache, &tk2, &tk2), CIDER_ERR_SHAPE_MISMATCH, "", "32");
  expect_failure(cider_kv_cache_append(nullptr, &tk, &tv), CIDER_ERR_INVALID_ARGUMENT, "cider_kv_cache_append",
                 "NULL");
  cider_kv_snapshot_free(snap);
  cider_kv_cache_free(cache);

  cider_kv_config bad = cider_kv_config_default();
  bad.k_bits = 7;
  cider_kv_cache* c2 = nullptr;
  expect_failure(cider_kv_cache_create(&bad, &c2), CIDER_ERR_INVALID_ARGUMENT, "", "7");
  bad = cider_kv_config_default();
  bad.rotation = 9;
  expect_failure(cider_kv_cache_create(&bad, &c2), CIDER_ERR_INVALID_ARGUMENT, "cider_kv_cache_create", "got 9");
  bad = cider_kv_config_default();
  bad.scale_dtype = CIDER_I8;
  expect_failure(cider_kv_cache_create(&bad, &c2), CIDER_ERR_INVALID_ARGUMENT, "cider_kv_cache_create", "got 4");
  EXPECT_EQ(c2, nullptr);
}

TEST(CApi, PlainCacheThroughCApi) {
  auto rng = cider::test::make_rng(305);
  cider_kv_config cfg = cider_kv_config_default();
  cfg.quantized = 0;
  cfg.plain_dtype = CIDER_BF16;
  cfg.rotation = CIDER_ROTATION_NONE;
  cider_kv_cache* cache = nullptr;
  ASSERT_EQ(cider_kv_cache_create(&cfg, &cache), CIDER_OK) << cider_last_error();
  const int64_t D = 128, T = 5;
  std::vector<float> k = cider::test::randn(rng, T * D), v = cider::test::randn(rng, T * D),
                     q = cider::test::randn(rng, D), out(D);
  cider_tensor tk = tensor(k.data(), CIDER_F32, {1, 1, T, D}), tv = tensor(v.data(), CIDER_F32, {1, 1, T, D}),
               tq = tensor(q.data(), CIDER_F32, {1, 1, 1, D}), to = tensor(out.data(), CIDER_F32, {1, 1, 1, D});
  ASSERT_EQ(cider_kv_cache_append(cache, &tk, &tv), CIDER_OK) << cider_last_error();
  ASSERT_EQ(cider_attention(&tq, cache, 0.1f, 0, 0, nullptr, &to), CIDER_OK) << cider_last_error();
  // float64 attention on the bf16-rounded keys/values.
  std::vector<double> p(T);
  double mx = -1e300, sum = 0.0;
  for (int64_t j = 0; j < T; ++j) {
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(q[d]) * cider::round_to(cider::DType::kBF16, k[j * D + d]);
    p[j] = 0.1 * s;
    mx = std::max(mx, p[j]);
  }
  for (auto& x : p) sum += (x = std::exp(x - mx));
  for (int64_t d = 0; d < D; ++d) {
    double o = 0.0;
    for (int64_t j = 0; j < T; ++j) o += p[j] / sum * cider::round_to(cider::DType::kBF16, v[j * D + d]);
    ASSERT_NEAR(out[d], o, 1e-5);
  }
  cider_kv_cache_free(cache);
}

}  // namespace
