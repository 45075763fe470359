#include "apps/demo.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"

namespace cider::apps {

namespace {

struct CacheConfig {
  std::string name;
  bool quantized;
  int k_bits, v_bits;
  DType plain_dtype;
  nn::RotationKind rotation;
};

// Causal attention in float64 on the original (unrotated, unquantized) data: the ground truth.
// q [Hq, L, D], k/v [Hkv, T, D] -> out [Hq, L, D].
std::vector<double> reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t Hq, int64_t Hkv, int64_t L, int64_t T,
                                        int64_t D, double scale) {
  std::vector<double> out(static_cast<size_t>(Hq * L * D), 0.0);
  std::vector<double> p(static_cast<size_t>(T));
  const int64_t group = Hq / Hkv;
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t kvh = h / group;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t pos = T - L + i;
      double mx = -INFINITY;
      for (int64_t j = 0; j <= pos; ++j) {
        double s = 0.0;
        for (int64_t d = 0; d < D; ++d)
          s += static_cast<double>(q[static_cast<size_t>((h * L + i) * D + d)]) * k[static_cast<size_t>((kvh * T + j) * D + d)];
        p[static_cast<size_t>(j)] = s * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= pos; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
      for (int64_t j = 0; j <= pos; ++j)
        for (int64_t d = 0; d < D; ++d)
          out[static_cast<size_t>((h * L + i) * D + d)] +=
              p[static_cast<size_t>(j)] / sum * v[static_cast<size_t>((kvh * T + j) * D + d)];
    }
  }
  return out;
}

}  // namespace

int run_demo(const DemoOptions& o) {
  check(o.heads_q > 0 && o.heads_kv > 0 && o.heads_q % o.heads_kv == 0, ErrorCode::kInvalidArgument, "demo",
        "--heads-q must be a positive multiple of --heads-kv; got ", o.heads_q, " and ", o.heads_kv);
  check(o.tokens > 0 && o.queries > 0 && o.queries <= o.tokens, ErrorCode::kInvalidArgument, "demo",
        "need 0 < --queries <= --tokens; got ", o.queries, " and ", o.tokens);
  const int64_t Hq = o.heads_q, Hkv = o.heads_kv, D = o.head_dim, T = o.tokens, L = o.queries;

  // Keys: N(0,1) with a few channels scaled up in every row, as the keys of real models have; values N(0,1).
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(Hkv * T * D)), values(keys.size()), queries(static_cast<size_t>(Hq * L * D));
  for (auto& x : keys) x = normal(rng);
  for (auto& x : values) x = normal(rng);
  for (auto& x : queries) x = normal(rng);
  std::uniform_int_distribution<int64_t> pick(0, D - 1);
  for (int c = 0; c < o.outlier_channels; ++c) {
    const int64_t ch = pick(rng);
    for (int64_t r = 0; r < Hkv * T; ++r) keys[static_cast<size_t>(r * D + ch)] *= o.outlier_scale;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const std::vector<double> want = reference_attention(queries, keys, values, Hq, Hkv, L, T, D, scale);
  double ref_norm = 0.0;
  for (double x : want) ref_norm += x * x;

  std::vector<CacheConfig> configs = {{"f32", false, 0, 0, DType::kF32, nn::RotationKind::kNone},
                                      {"bf16", false, 0, 0, DType::kBF16, nn::RotationKind::kNone},
                                      {"f16", false, 0, 0, DType::kF16, nn::RotationKind::kNone}};
  const int pairs[][2] = {{8, 8}, {4, 4}, {4, 3}, {3, 3}, {3, 2}, {2, 2}};
  for (const auto& kv : pairs)
    for (auto rot : {nn::RotationKind::kNone, nn::RotationKind::kSO4Fast, nn::RotationKind::kSO4Full})
    {
      char name[16];
      std::snprintf(name, sizeof(name), "k%dv%d", kv[0], kv[1]);
      configs.push_back({name, true, kv[0], kv[1], DType::kF16, rot});
    }

  std::printf("cider demo: attention over a KV cache, B=1 Hq=%lld Hkv=%lld D=%lld, %lld cached tokens, %lld causal "
              "queries;\nkeys N(0,1) with %d outlier channels x%.0f, values N(0,1); group size %d, f16 scales.\n"
              "error = ||out - ref||/||ref||, ref = float64 attention on the original data.\n\n",
              static_cast<long long>(Hq), static_cast<long long>(Hkv), static_cast<long long>(D),
              static_cast<long long>(T), static_cast<long long>(L), o.outlier_channels,
              static_cast<double>(o.outlier_scale), o.group_size);
  std::printf("%-6s %-9s %10s %14s %10s %12s\n", "cache", "rotation", "bits/value", "bytes/token", "vs bf16",
              "attn error");
  const double bf16_bytes_per_token = 2.0 * 2.0 * static_cast<double>(Hkv * D);  // keys + values, 2 bytes each
  for (const CacheConfig& c : configs) {
    std::unique_ptr<nn::KVCache> cache;
    if (c.quantized) {
      nn::QuantizedKVCacheConfig qc;
      qc.k_bits = c.k_bits;
      qc.v_bits = c.v_bits;
      qc.group_size = o.group_size;
      qc.rotation = c.rotation;
      qc.seed = o.seed;
      cache = std::make_unique<nn::QuantizedKVCache>(qc);
    } else {
      nn::PlainKVCacheConfig pc;
      pc.dtype = c.plain_dtype;
      cache = std::make_unique<nn::PlainKVCache>(pc);
    }
    cache->update_and_fetch(TensorView(keys.data(), DType::kF32, {1, Hkv, T, D}),
                            TensorView(values.data(), DType::kF32, {1, Hkv, T, D}));
    std::vector<float> out(want.size());
    nn::AttentionMask mask;
    mask.kind = kernels::MaskKind::kCausal;
    nn::attention(TensorView(queries.data(), DType::kF32, {1, Hq, L, D}), *cache, scale, mask,
                  TensorView(out.data(), DType::kF32, {1, Hq, L, D}));
    double err = 0.0;
    for (size_t i = 0; i < out.size(); ++i) err += (out[i] - want[i]) * (out[i] - want[i]);
    const double bytes_per_token = static_cast<double>(cache->nbytes()) / static_cast<double>(cache->capacity());
    const double bits_per_value = bytes_per_token * 8.0 / (2.0 * static_cast<double>(Hkv * D));
    std::printf("%-6s %-9s %10.2f %14.0f %9.2fx %12.2e\n", c.name.c_str(),
                c.quantized ? nn::rotation_kind_name(c.rotation) : "-", bits_per_value, bytes_per_token,
                bf16_bytes_per_token / bytes_per_token, std::sqrt(err / ref_norm));
  }
  std::printf("\nbytes/token: keys + values of one layer, all KV heads (storage / capacity).\n");
  return 0;
}

}  // namespace cider::apps
