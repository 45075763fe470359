// Linear-layer weight descriptors (nn/linear_weights.h).
#include "nn/linear_weights.h"

#include "core/error.h"
#include "quant/ggml_blocks.h"

namespace cider::nn {

size_t LinearWeights::nbytes() const {
  size_t n = 0;
  switch (kind) {
    case WeightKind::kDense: n = static_cast<size_t>(N * K * dtype_size(w_dtype)); break;
    case WeightKind::kInt8: n = static_cast<size_t>(N * K); break;
    case WeightKind::kInt4: n = static_cast<size_t>(N * K / 2); break;
    case WeightKind::kGgml: {
      const quant::GgmlBlockFormat* f = quant::ggml_block_format(ggml_type);
      n = f ? static_cast<size_t>(N * quant::ggml_row_bytes(*f, K)) : 0;
      break;
    }
  }
  if (kind == WeightKind::kInt8 || kind == WeightKind::kInt4) n += static_cast<size_t>(group_size == 0 ? N : (K / group_size) * N) * sizeof(float);
  if (bias) n += static_cast<size_t>(N) * sizeof(float);
  return n;
}

kernels::IntLinearArgs LinearWeights::int_args(const float* x, int64_t M, float* out) const {
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
  return a;
}

void LinearWeights::forward(const float* x, int64_t M, float* out) const {
  const kernels::KernelTable& kt = kernels::active_kernels();
  if (kind == WeightKind::kDense) {
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
  if (kind == WeightKind::kGgml) {
    const quant::GgmlBlockFormat* f = quant::ggml_block_format(ggml_type);
    check(f != nullptr && f->integer_form, ErrorCode::kUnsupported, "linear", "native weights need a GGUF block "
          "format with kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); got type id ", ggml_type);
    kernels::GgmlLinearArgs g{};
    g.x = x;
    g.w = w;
    g.ggml_type = ggml_type;
    g.row_bytes = quant::ggml_row_bytes(*f, K);
    g.bias = bias;
    g.out = out;
    g.M = M;
    g.N = N;
    g.K = K;
    kt.ggml_linear(g);
    return;
  }
  const kernels::IntLinearArgs a = int_args(x, M, out);
  if (kind == WeightKind::kInt8) {
    (M == 1 ? kt.w8a8_gemv : kt.w8a8_gemm)(a);
  } else {
    (M == 1 ? kt.w4a8_gemv : kt.w4a8_gemm)(a);
  }
}

}  // namespace cider::nn
