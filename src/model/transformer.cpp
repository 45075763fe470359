// Linear layers, RMSNorm and the CPU caches of the engine's weights (transformer.h); the forward is model/forward.cpp.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/kernel_table.h"
#include "model/backend.h"

namespace cider::model {

// ---- elementwise pieces ------------------------------------------------------------------------------------------

void rms_norm(const float* x, const float* w, float offset, int64_t rows, int64_t dim, double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    // Σ x² in float64, in 8 running sums (independent lanes the compiler vectorises; one chain of dependent adds cost
    // 4 % of a Gemma 3 270M prefill), added in a fixed order.
    double acc[8] = {};
    int64_t i0 = 0;
    for (; i0 + 8 <= dim; i0 += 8)
      for (int l = 0; l < 8; ++l) acc[l] += static_cast<double>(xr[i0 + l]) * xr[i0 + l];
    for (int l = 0; i0 + l < dim; ++l) acc[l] += static_cast<double>(xr[i0 + l]) * xr[i0 + l];
    const double ss = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] * inv) * (offset + w[i]);
  }
}

void route_experts(const float* logits, int64_t n, int64_t E, int64_t K, bool normalize, int32_t* chosen,
                   float* weight) {
  std::vector<float> p(static_cast<size_t>(E));
  for (int64_t r = 0; r < n; ++r) {
    const float* z = logits + r * E;
    float zmax = z[0];
    for (int64_t e = 1; e < E; ++e) zmax = std::max(zmax, z[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += p[static_cast<size_t>(e)] = std::exp(z[e] - zmax);
    for (int64_t e = 0; e < E; ++e) p[static_cast<size_t>(e)] /= sum;
    int32_t* ch = chosen + r * K;
    float* w = weight + r * K;
    float kept = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (std::find(ch, ch + k, static_cast<int32_t>(e)) != ch + k) continue;
        if (best < 0 || p[static_cast<size_t>(e)] > p[static_cast<size_t>(best)]) best = e;
      }
      ch[k] = static_cast<int32_t>(best);
      w[k] = p[static_cast<size_t>(best)];
      kept += w[k];
    }
    if (normalize)
      for (int64_t k = 0; k < K; ++k) w[k] /= kept;
  }
}

std::unique_ptr<nn::KVCache> Model::Impl::make_cache(int64_t layer) const {
  const KVOptions& kv = options.kv;
  // Each layer gets its own rotation seed (the layer index), so layers do not share quantization error patterns.
  const auto seed = static_cast<uint64_t>(layer);
  // Sliding-window layers keep only their window (nn/kv_cache.h), unless the options keep every position.
  const int64_t window = sliding_cache_window(layer);
  if (kv.quantized) {
    nn::QuantizedKVCacheConfig qc;
    qc.k_bits = kv.k_bits;
    qc.v_bits = kv.v_bits;
    qc.group_size = kv.group_size;
    qc.rotation = kv.rotation;
    qc.scale_dtype = kv.scale_dtype;
    qc.key_layout = kv.key_layout;
    qc.key_outliers = kv.key_outliers;
    qc.v_symmetric = kv.v_symmetric;
    qc.recent_exact = kv.recent_exact;
    qc.seed = seed;
    qc.window = window;
    return std::make_unique<nn::QuantizedKVCache>(qc);
  }
  nn::PlainKVCacheConfig pc;
  pc.dtype = kv.plain_dtype;
  pc.rotation = nn::RotationKind::kNone;
  pc.seed = seed;
  pc.window = window;
  return std::make_unique<nn::PlainKVCache>(pc);
}

int64_t Model::Impl::sliding_cache_window(int64_t layer) const {
  const bool sliding = static_cast<size_t>(layer) < config.layer_sliding.size() &&
                       config.layer_sliding[static_cast<size_t>(layer)] != 0;
  return sliding && !options.kv_full_sliding ? config.sliding_window : 0;
}

Session::Impl::~Impl() = default;

}  // namespace cider::model
