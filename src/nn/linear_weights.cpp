// Linear-layer weight descriptors (nn/linear_weights.h).
#include "nn/linear_weights.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
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

namespace {

// Native GGUF weights with many activation rows (batched decode, prefill), where the level's int8 block kernel is
// GEMV-shaped (ref: KernelTable::ggml_linear_prefill false): the weight rows are decoded to float32, kRows at a time
// (in parallel, the ggml_dequantize entry: bit for bit the blocks' decoder, so the weights are exactly the file's),
// and multiplied by the dense GEMM entry — faster than a GEMV-shaped int8 kernel (the AVX2 GEMV kernel on the
// AVX-512 VM, 2 threads: 371 vs 80 ms on 512 × 4096 × 4096 Q4_K) and closer to the reference, the activations staying
// float32. The avx512 and avx2 levels' ggml_linear are GEMMs over unpacked panels from 16 rows and beat this path
// (avx512: 38 vs 80 ms there; 145–216 vs 270–377 ms at 512 × 3584 × 18944 and 512 × 18944 × 3584, Q4_K and Q6_K;
// 16 rows: 2.7 vs 5.6 ms. avx2, the AVX2 VM: 60 vs 169 ms at 16 × 640 × 262144 Q8_0, 55 vs 87 ms at 64 × 4096 ×
// 14336 Q4_K; docs/benchmarks.md), so they take every M. The rule: use_dense_path.
constexpr int64_t kDenseFromM = 16;

bool use_dense_path(const kernels::KernelTable& kt, int64_t M) { return M >= kDenseFromM && !kt.ggml_linear_prefill; }
constexpr int64_t kRows = 256;

void ggml_forward_dense(const LinearWeights& L, const quant::GgmlBlockFormat& f, const float* x, int64_t M,
                        float* out) {
  const int64_t rb = quant::ggml_row_bytes(f, L.K);
  thread_local std::vector<float> wf, tmp;
  wf.resize(static_cast<size_t>(kRows * L.K));
  tmp.resize(static_cast<size_t>(M * kRows));
  float* const w32 = wf.data();  // the caller's buffer (a worker naming `wf` would get its own thread_local)
  const kernels::KernelTable& kt = kernels::active_kernels();
  for (int64_t n0 = 0; n0 < L.N; n0 += kRows) {
    const int64_t rows = std::min(kRows, L.N - n0);
    default_thread_pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
      kernels::GgmlDequantArgs d{static_cast<const uint8_t*>(L.w) + (n0 + r0) * rb, L.ggml_type, rb, r1 - r0, L.K,
                                 w32 + r0 * L.K};
      if (L.interleaved) {  // the tensor's first byte and the first row (GgmlDequantArgs)
        d.w = L.w;
        d.interleaved = true;
        d.row0 = n0 + r0;
      }
      kt.ggml_dequantize(d);  // the decoder's values bit for bit
    });
    kernels::DenseGemmArgs a{};
    a.x = x;
    a.w = w32;
    a.w_dtype = DType::kF32;
    a.bias = L.bias ? L.bias + n0 : nullptr;
    a.out = tmp.data();
    a.M = M;
    a.N = rows;
    a.K = L.K;
    kt.dense_gemm(a);
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(out + m * L.N + n0, tmp.data() + m * rows, static_cast<size_t>(rows) * sizeof(float));
  }
}

}  // namespace

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
          "format with kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K); got type id ", ggml_type);
    if (use_dense_path(kt, M)) return ggml_forward_dense(*this, *f, x, M, out);
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
    g.interleaved = interleaved;
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
