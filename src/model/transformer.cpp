// Linear layers, RMSNorm and the CPU caches of the engine's weights (transformer.h); the forward is model/forward.cpp.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernel_table.h"
#include "model/backend.h"

namespace cider::model {

// ---- elementwise pieces ------------------------------------------------------------------------------------------

void rms_norm(const float* x, const float* w, float offset, int64_t rows, int64_t dim, double eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] * inv) * (offset + w[i]);
  }
}

std::unique_ptr<nn::KVCache> Model::Impl::make_cache(int64_t layer) const {
  const KVOptions& kv = options.kv;
  // Each layer gets its own rotation seed (the layer index), so layers do not share quantization error patterns.
  const auto seed = static_cast<uint64_t>(layer);
  if (kv.quantized) {
    nn::QuantizedKVCacheConfig qc;
    qc.k_bits = kv.k_bits;
    qc.v_bits = kv.v_bits;
    qc.group_size = kv.group_size;
    qc.rotation = kv.rotation;
    qc.scale_dtype = kv.scale_dtype;
    qc.key_layout = kv.key_layout;
    qc.seed = seed;
    return std::make_unique<nn::QuantizedKVCache>(qc);
  }
  nn::PlainKVCacheConfig pc;
  pc.dtype = kv.plain_dtype;
  pc.rotation = nn::RotationKind::kNone;
  pc.seed = seed;
  return std::make_unique<nn::PlainKVCache>(pc);
}

Session::Impl::~Impl() = default;

}  // namespace cider::model
