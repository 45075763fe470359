// Linear layers, RMSNorm and the CPU caches of the engine's weights (transformer.h); the forward is model/forward.cpp.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/kernel_table.h"
#include "model/backend.h"

namespace cider::model {

// ---- linear layers -----------------------------------------------------------------------------------------------

size_t Linear::nbytes() const {
  size_t n = 0;
  switch (kind) {
    case Kind::kDense: n = static_cast<size_t>(N * K * dtype_size(w_dtype)); break;
    case Kind::kInt8: n = static_cast<size_t>(N * K); break;
    case Kind::kInt4: n = static_cast<size_t>(N * K / 2); break;
  }
  if (kind != Kind::kDense) n += static_cast<size_t>(group_size == 0 ? N : (K / group_size) * N) * sizeof(float);
  if (bias) n += static_cast<size_t>(N) * sizeof(float);
  return n;
}

void Linear::forward(const float* x, int64_t M, float* out) const {
  const kernels::KernelTable& kt = kernels::active_kernels();
  if (kind == Kind::kDense) {
    kernels::DenseGemmArgs a{};
    a.x = x;
    a.w = w;
    a.w_dtype = w_dtype;
    a.bias = bias;
    a.out = out;
    a.M = M;
    a.N = N;
    a.K = K;
    kt.dense_gemm(a);
    return;
  }
  kernels::IntLinearArgs a{};
  a.x = x;
  a.x_dtype = DType::kF32;
  a.w = w;
  a.w_scales = scales;
  a.bias = bias;
  a.out = out;
  a.out_dtype = DType::kF32;
  a.M = M;
  a.N = N;
  a.K = K;
  a.group_size = group_size;
  if (kind == Kind::kInt8) {
    (M == 1 ? kt.w8a8_gemv : kt.w8a8_gemm)(a);
  } else {
    (M == 1 ? kt.w4a8_gemv : kt.w4a8_gemm)(a);
  }
}

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
