// The CUDA backend (model/cuda/cuda_backend.h): uploading a loaded CPU model, random benchmark models, and sessions
// whose executor runs the one forward (model/forward.cpp) with the CUDA launchers.
#include "model/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/hadamard.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/moe.h"
#include "model/arch/arch.h"
#include "model/backend.h"
#include "model/cuda/tp_backend.h"
#include "model/loader.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "nn/kv_cache.h"
#include "nn/rotation.h"
#include "quant/ggml_blocks.h"

namespace cider::model::gpu {

namespace {

constexpr const char* kOp = "cuda.model";

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

size_t sz(int64_t n) { return static_cast<size_t>(n); }

cuda::DeviceBuffer upload_floats(const float* p, int64_t n) {
  if (p == nullptr || n <= 0) return {};
  return cuda::to_device(p, sz(n) * sizeof(float));
}

// What the GPU can run; checked before anything is uploaded or allocated.
void check_supported(const ModelConfig& c, WeightFormat weights, const KVOptions& kv) {
  check(weight_format_info(weights).cuda, ErrorCode::kUnsupported, kOp, "--device cuda runs the weight formats ",
        weight_format_names(/*cuda_only=*/true), "; got --weights ", weight_format_name(weights));
  kv.validate(kOp);
  check(!kv.recent_exact, ErrorCode::kUnsupported, kOp,
        "--device cuda reads every position of a complete block quantized; got --kv-recent exact in ",
        kv_format_name(kv), " (use --device cpu)");
  check(!kv.v_symmetric, ErrorCode::kUnsupported, kOp,
        "--device cuda stores values with a scale and a bias per group (affine); got --kv-values symmetric in ",
        kv_format_name(kv), " (use --device cpu)");
  // Outlier key channels are read by the tensor-core attention kernels only (cuda::kchan_tc_format): said at load,
  // naming what they take. (An `auto` count is resolved to head_dim/32 before this.)
  if (kv.key_outliers > 0)
    check(kv.quantized && kv.key_layout == nn::KeyLayout::kChannel &&
              cuda::kchan_tc_format(kv.k_bits, kv.v_bits, kv.group_size, kv.scale_dtype, c.head_dim, kv.key_outliers),
          ErrorCode::kUnsupported, kOp,
          "--device cuda runs outlier key channels with per-channel keys k4v4, k5v4 or k5v5, group 64, f16 scales, "
          "head_dim 128 or 256 and at most head_dim/16 channels; got ", kv_format_name(kv), ", head_dim ", c.head_dim,
          ", ", kv.key_outliers, " channels (use --device cpu)");
  check(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= cuda::kMaxHadamardDim, ErrorCode::kUnsupported, kOp,
        "--device cuda needs an even head_dim (rotary pairs) of at most ", cuda::kMaxHadamardDim, "; got ",
        c.head_dim);
  // Hybrid models: the recurrence kernel's limits (one thread per state column, the state in shared memory) are
  // said at load, naming the model's dims.
  // (The geometry itself — value heads a multiple of key heads, a kernel of 1 to 64 taps — is validate_config's.)
  if (c.has_linear_layers()) cuda::check_gated_delta_shape(c.linear_attn.k_head_dim, c.linear_attn.v_head_dim, kOp);
  // The attention kernels (kernels/cuda/attention.cu) are instantiated for these head dims: said at load, not at the
  // first forward.
  check(c.head_dim == 32 || c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256, ErrorCode::kUnsupported, kOp,
        "--device cuda runs attention heads of 32, 64, 128 or 256 dims; this model's head_dim is ", c.head_dim,
        " (use --device cpu)");
  check(static_cast<int64_t>(c.layer_sliding.size()) == c.num_layers, ErrorCode::kInvalidArgument, kOp,
        "layer_sliding must have one entry per layer (", c.num_layers, "); got ", c.layer_sliding.size());
}

// Layer l's cache rotation, the CPU cache's (nn::QuantizedKVCache seeds layer l's rotation with l; keys and values
// share it): SO(4) quaternions, or the Hadamard signs (in rot_left).
void upload_rotation(GpuLayer& L, const GpuModel& m, int64_t layer) {
  if (m.rotation() == 0) return;
  const nn::Rotation rot(m.config.head_dim, m.kv.rotation, static_cast<uint64_t>(layer));
  if (m.kv.rotation == nn::RotationKind::kHadamard) {
    L.rot_left = cuda::to_device(rot.signs().data(), rot.signs().size() * sizeof(float));
    return;
  }
  L.rot_left = cuda::to_device(rot.left().data(), rot.left().size() * sizeof(float));
  L.rot_right = cuda::to_device(rot.right().data(), rot.right().size() * sizeof(float));
}

// The model's RoPE tables for its whole context (m.ctx positions; config and ctx already set), cos/sin times each
// rope's attention factor (config.rope / rope_local).
void upload_rope_tables(GpuModel& m, const std::vector<float>& inv, const std::vector<float>& inv_local) {
  const int64_t half = m.config.head_dim / 2;
  check(static_cast<int64_t>(inv.size()) == half, ErrorCode::kShapeMismatch, kOp, "inv_freq must have head_dim/2 = ",
        half, " entries; got ", inv.size());
  const double factor = m.config.rope.attention_factor, factor_local = m.config.rope_local.attention_factor;
  const std::vector<float> table = rope_table(inv, m.ctx, factor);
  m.rope_global = upload_floats(table.data(), static_cast<int64_t>(table.size()));
  const bool any_sliding =
      std::any_of(m.config.layer_sliding.begin(), m.config.layer_sliding.end(), [](auto v) { return v != 0; });
  if (any_sliding && (inv_local != inv || factor_local != factor)) {
    check(static_cast<int64_t>(inv_local.size()) == half, ErrorCode::kShapeMismatch, kOp,
          "the local inv_freq must have head_dim/2 = ", half, " entries; got ", inv_local.size());
    const std::vector<float> local = rope_table(inv_local, m.ctx, factor_local);
    m.rope_local = upload_floats(local.data(), static_cast<int64_t>(local.size()));
  }
}

// Bytes of one weight row of a native GGUF layer (a block format with CUDA kernels: said at load, naming the layer).
int64_t ggml_row_bytes(const nn::LinearWeights& L) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(L.ggml_type);
  check(f != nullptr && f->integer_form, ErrorCode::kUnsupported, kOp, "native GGUF weights need a block format with "
        "kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K); got type id ", L.ggml_type);
  return quant::ggml_row_bytes(*f, L.K);
}

GpuLinear upload_linear(const Linear& L) {
  GpuLinear g;
  g.N = L.N;
  g.K = L.K;
  g.group_size = L.group_size;
  const size_t nk = sz(L.N) * sz(L.K);
  switch (L.kind) {
    case Linear::Kind::kDense:
      g.kind = WeightKind::kDense;
      g.w_dtype = DType::kBF16;
      g.group_size = 0;
      if (L.w_dtype == DType::kBF16) {
        g.w_buf = cuda::to_device(L.w, nk * 2);
      } else {  // f16 / f32 tensors: rounded to bf16 once (round to nearest even, as store_float does)
        std::vector<uint16_t> tmp(nk);
        for (size_t i = 0; i < nk; ++i)
          store_float(tmp.data(), DType::kBF16, static_cast<int64_t>(i),
                      load_float(L.w, L.w_dtype, static_cast<int64_t>(i)));
        g.w_buf = cuda::to_device(tmp.data(), nk * 2);
      }
      break;
    case Linear::Kind::kInt8:
      g.kind = WeightKind::kInt8;
      g.w_dtype = DType::kI8;
      g.w_buf = cuda::to_device(L.w, nk);
      break;
    case Linear::Kind::kInt4:
      g.kind = WeightKind::kInt4;
      g.w_dtype = DType::kU8;
      g.w_buf = cuda::to_device(L.w, nk / 2);
      break;
    case Linear::Kind::kGgml:  // the file's blocks as they are (kernels/cuda/linear_ggml.cu)
      check(!L.interleaved, ErrorCode::kInternal, "cuda_backend", L.name,
            ": rows interleaved for the CPU's kernels (only a CPU model interleaves them)");
      g.kind = WeightKind::kGgml;
      g.w_dtype = DType::kU8;
      g.ggml_type = L.ggml_type;
      g.group_size = 0;
      g.w_buf = cuda::to_device(L.w, sz(L.N) * sz(ggml_row_bytes(L)));
      break;
  }
  if (L.kind == Linear::Kind::kInt8 || L.kind == Linear::Kind::kInt4) {
    const int64_t n_scales = L.group_size == 0 ? L.N : (L.K / L.group_size) * L.N;
    g.scales_buf = upload_floats(L.scales, n_scales);
  }
  g.bias_buf = upload_floats(L.bias, L.N);
  g.attach();
  return g;
}

// Dense weights of any float dtype as bf16 [N, K] on the host (bf16 copied, others rounded to nearest even).
void append_bf16_rows(const Linear& L, std::vector<uint16_t>& out) {
  const size_t nk = sz(L.N) * sz(L.K), at = out.size();
  out.resize(at + nk);
  if (L.w_dtype == DType::kBF16) {
    std::memcpy(out.data() + at, L.w, nk * 2);
    return;
  }
  for (size_t i = 0; i < nk; ++i)
    store_float(out.data() + at, DType::kBF16, static_cast<int64_t>(i), load_float(L.w, L.w_dtype, static_cast<int64_t>(i)));
}

// q|k|v or gate|up as one layer (GpuFusedLinear): rows concatenated; scales per channel concatenated, per group
// [K/gs, N] concatenated row by row; biases concatenated (zeros for a part without one). Parts of different kinds or
// group sizes stay separate.
GpuFusedLinear upload_fused(const std::vector<const Linear*>& parts) {
  GpuFusedLinear f;
  f.K = parts[0]->K;
  bool same = true;
  for (const Linear* p : parts) {
    f.N += p->N;
    check(p->K == f.K, ErrorCode::kShapeMismatch, kOp, "fused linear parts must share K; got ", p->K, " and ", f.K);
    same = same && p->kind == parts[0]->kind && (p->kind == Linear::Kind::kDense || p->group_size == parts[0]->group_size) &&
           p->ggml_type == parts[0]->ggml_type;
  }
  if (!same) {
    for (const Linear* p : parts) f.parts.push_back(upload_linear(*p));
    return f;
  }
  const Linear& first = *parts[0];
  GpuLinear& g = f.fused;
  g.N = f.N;
  g.K = f.K;
  g.group_size = first.kind == Linear::Kind::kDense ? 0 : first.group_size;
  if (first.kind == Linear::Kind::kDense) {
    g.kind = WeightKind::kDense;
    g.w_dtype = DType::kBF16;
    std::vector<uint16_t> w;
    w.reserve(sz(f.N) * sz(f.K));
    for (const Linear* p : parts) append_bf16_rows(*p, w);
    g.w_buf = cuda::to_device(w.data(), w.size() * 2);
  } else {
    // Byte rows (int8 codes, int4 pairs, or GGUF blocks of one format), concatenated.
    const bool ggml = first.kind == Linear::Kind::kGgml, int8 = first.kind == Linear::Kind::kInt8;
    g.kind = ggml ? WeightKind::kGgml : int8 ? WeightKind::kInt8 : WeightKind::kInt4;
    g.w_dtype = int8 ? DType::kI8 : DType::kU8;
    g.ggml_type = first.ggml_type;
    const size_t row_bytes = ggml ? sz(ggml_row_bytes(first)) : int8 ? sz(f.K) : sz(f.K) / 2;
    std::vector<uint8_t> w(sz(f.N) * row_bytes);
    size_t at = 0;
    for (const Linear* p : parts) {
      std::memcpy(w.data() + at, p->w, sz(p->N) * row_bytes);
      at += sz(p->N) * row_bytes;
    }
    g.w_buf = cuda::to_device(w.data(), w.size());
  }
  if (first.kind == Linear::Kind::kInt8 || first.kind == Linear::Kind::kInt4) {
    const int64_t groups = g.group_size == 0 ? 1 : f.K / g.group_size;  // scale rows: [groups, N]
    std::vector<float> sc(sz(groups) * sz(f.N));
    for (int64_t r = 0; r < groups; ++r) {
      int64_t col = 0;
      for (const Linear* p : parts) {
        std::memcpy(sc.data() + sz(r * f.N + col), p->scales + r * p->N, sz(p->N) * sizeof(float));
        col += p->N;
      }
    }
    g.scales_buf = cuda::to_device(sc.data(), sc.size() * sizeof(float));
  }
  bool any_bias = false;
  for (const Linear* p : parts) any_bias = any_bias || p->bias != nullptr;
  if (any_bias) {
    std::vector<float> b(sz(f.N), 0.0f);
    int64_t col = 0;
    for (const Linear* p : parts) {
      if (p->bias) std::memcpy(b.data() + col, p->bias, sz(p->N) * sizeof(float));
      col += p->N;
    }
    g.bias_buf = cuda::to_device(b.data(), b.size() * sizeof(float));
  }
  g.attach();
  return f;
}

// A float32 [N, K] layer kept float32 (routers, gates), as a pointer to its N·K values; cider::Error (kInternal) when
// the loader held it otherwise.
const float* float32_weights(const Linear& L, int64_t N, int64_t K, int64_t layer) {
  check(L.kind == Linear::Kind::kDense && L.w_dtype == DType::kF32 && L.N == N && L.K == K && L.w != nullptr &&
            L.bias == nullptr,
        ErrorCode::kInternal, kOp, L.name, " (layer ", layer, ") must be float32 (", N, ", ", K, ") without a bias");
  return static_cast<const float*>(L.w);
}

// A gated DeltaNet layer's weights (GpuLayer: lin_qkvz, lin_out, lin_ba, A_log, dt_bias, conv_w, lin_norm).
void upload_linear_attention(GpuLayer& g, const LayerWeights& L, const ModelConfig& c, int64_t layer) {
  const ModelConfig::LinearAttention& la = c.linear_attn;
  const int64_t H = c.hidden_size, Hv = la.num_v_heads, C = la.conv_dim(), V = la.value_dim();
  check(L.lin_qkv.N == C && L.lin_z.N == V && L.lin_out.N == H && L.lin_out.K == V && L.conv_w != nullptr &&
            L.A_log != nullptr && L.dt_bias != nullptr && L.lin_norm.w != nullptr,
        ErrorCode::kInternal, kOp, "linear-attention layer ", layer, " lacks weights of its geometry (q|k|v ", C,
        ", z ", V, " rows, out (", H, ", ", V, "), conv, A_log, dt_bias, norm)");
  g.lin_qkvz = upload_fused({&L.lin_qkv, &L.lin_z});
  g.lin_out = upload_linear(L.lin_out);
  std::vector<float> ba(sz(2 * Hv * H));
  std::memcpy(ba.data(), float32_weights(L.lin_b, Hv, H, layer), sz(Hv * H) * sizeof(float));
  std::memcpy(ba.data() + Hv * H, float32_weights(L.lin_a, Hv, H, layer), sz(Hv * H) * sizeof(float));
  g.lin_ba = upload_floats(ba.data(), 2 * Hv * H);
  g.A_log = upload_floats(L.A_log, Hv);
  g.dt_bias = upload_floats(L.dt_bias, Hv);
  g.conv_w = upload_floats(L.conv_w, C * la.conv_kernel);
  g.lin_norm = upload_floats(L.lin_norm.w, la.v_head_dim);
}

// f(linear) for every linear layer of L that holds weights (a fused layer's one layer, or its parts): Layer is
// GpuLayer or const GpuLayer.
template <typename Layer, typename F>
void for_each_linear(Layer& L, F&& f) {
  auto one = [&](auto& g) {
    if (g.N > 0) f(g);
  };
  auto fused = [&](auto& fl) {
    one(fl.fused);
    for (auto& p : fl.parts) one(p);
  };
  fused(L.qkv);
  one(L.o);
  fused(L.gate_up);
  one(L.down);
  for (auto& x : L.experts) {
    fused(x.gate_up);
    one(x.down);
  }
  fused(L.shared.gate_up);
  one(L.shared.down);
  fused(L.lin_qkvz);
  one(L.lin_out);
}

size_t layer_bytes(const GpuLayer& L) {
  size_t b = L.attn_norm.bytes() + L.q_norm.bytes() + L.k_norm.bytes() + L.post_attn_norm.bytes() +
             L.mlp_norm.bytes() + L.post_mlp_norm.bytes() + L.rot_left.bytes() + L.rot_right.bytes();
  b += L.qkv.nbytes() + L.o.owned_bytes() + L.gate_up.nbytes() + L.down.owned_bytes();
  for (const GpuExpert& x : L.experts) b += x.gate_up.nbytes() + x.down.owned_bytes();
  b += L.shared.gate_up.nbytes() + L.shared.down.owned_bytes();
  b += L.lin_qkvz.nbytes() + L.lin_out.owned_bytes() + L.lin_ba.bytes() + L.A_log.bytes() + L.dt_bias.bytes() +
       L.conv_w.bytes() + L.lin_norm.bytes();
  return b;
}

// ---- random models (benchmarks) ---------------------------------------------------------------------------------

GpuLinear random_linear(int64_t N, int64_t K, WeightFormat f, uint64_t seed, void* stream) {
  GpuLinear g;
  g.N = N;
  g.K = K;
  const float a = 1.0f / std::sqrt(static_cast<float>(K));
  const Linear::Kind kind = weight_format_info(f).kind;
  if (kind == Linear::Kind::kDense) {
    g.kind = WeightKind::kDense;
    g.w_dtype = DType::kBF16;
    g.w_buf = cuda::DeviceBuffer(sz(N) * sz(K) * 2);
    cuda::fill_uniform(g.w_buf.data(), DType::kBF16, N * K, seed, -a, a, stream);
    g.attach();
    return g;
  }
  if (kind == Linear::Kind::kGgml) {
    // Native weights: Q4_K blocks (the bulk of a Q4_K_M file) of random codes and 6-bit scales, d and dmin set to
    // f16 0x0404 = 2^-14·(1 + 4/1024) in every block, so |w| ≤ (63·15 + 63)·6.1e-5 ≈ 0.06.
    check(K % 256 == 0, ErrorCode::kInvalidArgument, kOp, "random native (Q4_K) weights need K a multiple of 256; got ",
          K);
    g.kind = WeightKind::kGgml;
    g.w_dtype = DType::kU8;
    g.ggml_type = static_cast<uint32_t>(quant::GgmlType::kQ4_K);
    const int64_t blocks = N * K / 256, bytes = blocks * 144;
    g.w_buf = cuda::DeviceBuffer(sz(bytes));
    cuda::fill_random_bytes(g.w_buf.data(), bytes, seed, /*as_int8=*/false, stream);
    CIDER_CUDA_CHECK(kOp, cudaMemset2DAsync(g.w_buf.data(), 144, 0x04, 4, sz(blocks), as_stream(stream)));
    g.attach();
    return g;
  }
  g.group_size = weight_format_info(f).group_size;
  const bool int8 = kind == Linear::Kind::kInt8;
  g.kind = int8 ? WeightKind::kInt8 : WeightKind::kInt4;
  g.w_dtype = int8 ? DType::kI8 : DType::kU8;
  const int64_t w_bytes = int8 ? N * K : N * K / 2;
  g.w_buf = cuda::DeviceBuffer(sz(w_bytes));
  cuda::fill_random_bytes(g.w_buf.data(), w_bytes, seed, int8, stream);
  const int64_t n_scales = g.group_size == 0 ? N : (K / g.group_size) * N;
  g.scales_buf = cuda::DeviceBuffer(sz(n_scales) * sizeof(float));
  const float s = a / (int8 ? 127.0f : 7.0f);
  cuda::fill_uniform(g.scales_buf.data(), DType::kF32, n_scales, seed ^ 0x5CA1E5ull, 0.5f * s, 1.5f * s, stream);
  g.attach();
  return g;
}

cuda::DeviceBuffer ones(int64_t n, void* stream) {
  cuda::DeviceBuffer b(sz(n) * sizeof(float));
  cuda::fill_uniform(b.data(), DType::kF32, n, 0, 1.0f, 1.0f, stream);
  return b;
}

// What enqueue() enqueues on st, captured into a graph (the caller destroys it); on an exception the capture ends
// (leaving the stream usable) and the exception goes on.
template <typename Enqueue>
cudaGraph_t capture_graph(cudaStream_t st, const Enqueue& enqueue) {
  cudaGraph_t graph = nullptr;
  CIDER_CUDA_CHECK(kOp, cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(st, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CIDER_CUDA_CHECK(kOp, cudaStreamEndCapture(st, &graph));
  return graph;
}

// Capacity buckets of the decode graphs: the attention grid is sized for a bound on the KV length.
int64_t kv_bound(int64_t length, int64_t ctx) {
  int64_t b = 256;
  while (b < length) b *= 2;
  return std::min(b, ctx);
}

}  // namespace

// ---- GpuLinear, GpuModel ------------------------------------------------------------------------------------------

void GpuLinear::attach() {
  if (w == nullptr) w = w_buf.data();
  scales = scales_buf.bytes() ? scales_buf.as<float>() : nullptr;
  bias = bias_buf.bytes() ? bias_buf.as<float>() : nullptr;
}

size_t GpuLinear::owned_bytes() const { return w_buf.bytes() + scales_buf.bytes() + bias_buf.bytes(); }

void GpuLinear::forward(const float* x, int64_t M, float* out, const cuda::Exec& exec) const {
  if (kind == WeightKind::kDense) {
    if (split_x) {
      cuda::dense_bf16_split(x, w, bias, out, M, N, K, exec);
    } else {
      cuda::dense_bf16(x, w, bias, out, M, N, K, exec);
    }
    return;
  }
  if (kind == WeightKind::kGgml) {
    kernels::GgmlLinearArgs a{};
    a.x = x;
    a.w = w;
    a.ggml_type = ggml_type;
    a.row_bytes = ggml_row_bytes(*this);
    a.bias = bias;
    a.out = out;
    a.M = M;
    a.N = N;
    a.K = K;
    cuda::ggml_linear(a, exec);
    return;
  }
  cuda::int_linear(int_args(x, M, out), kind == WeightKind::kInt4, exec);
}

size_t GpuFusedLinear::nbytes() const {
  size_t b = fused.owned_bytes();
  for (const GpuLinear& p : parts) b += p.owned_bytes();
  return b;
}

int64_t GpuFusedLinear::max_part_N() const {
  int64_t n = 0;
  for (const GpuLinear& p : parts) n = std::max(n, p.N);
  return n;
}

void GpuFusedLinear::forward(const float* x, int64_t M, float* out, float* scratch, const cuda::Exec& exec) const {
  if (parts.empty()) {
    fused.forward(x, M, out, exec);
    return;
  }
  int64_t col = 0;
  for (const GpuLinear& p : parts) {
    if (M == 1) {  // one row: the column slice is contiguous
      p.forward(x, 1, out + col, exec);
    } else {
      p.forward(x, M, scratch, exec);
      CIDER_CUDA_CHECK(kOp, cudaMemcpy2DAsync(out + col, sz(N) * sizeof(float), scratch, sz(p.N) * sizeof(float),
                                              sz(p.N) * sizeof(float), sz(M), cudaMemcpyDeviceToDevice,
                                              as_stream(exec.stream)));
    }
    col += p.N;
  }
}

std::vector<float> rope_table(const std::vector<float>& inv_freq, int64_t positions, double attention_factor) {
  const auto half = static_cast<int64_t>(inv_freq.size());
  std::vector<float> table(sz(positions) * sz(2 * half));
  for (int64_t p = 0; p < positions; ++p) {
    float* row = table.data() + sz(p) * sz(2 * half);
    for (int64_t i = 0; i < half; ++i) {
      if (inv_freq[sz(i)] == 0.0f) {  // a pair that does not rotate (partial rotary: model.h rotary_dim)
        row[i] = 1.0f;
        row[half + i] = 0.0f;
        continue;
      }
      const float angle = static_cast<float>(p) * inv_freq[sz(i)];
      row[i] = static_cast<float>(std::cos(static_cast<double>(angle)) * attention_factor);
      row[half + i] = static_cast<float>(std::sin(static_cast<double>(angle)) * attention_factor);
    }
  }
  return table;
}

const float* GpuModel::rope_for(bool sliding) const {
  return sliding && rope_local.bytes() != 0 ? rope_local.as<float>() : rope_global.as<float>();
}

int GpuModel::rotation() const { return kv.quantized ? static_cast<int>(kv.rotation) : 0; }

int64_t GpuModel::slide_capacity(int64_t chunk) const {
  const bool any = std::any_of(config.layer_sliding.begin(), config.layer_sliding.end(), [](auto v) { return v != 0; });
  if (!any || kv_full_sliding || config.sliding_window <= 0) return 0;
  const int64_t cap = nn::window_capacity(config.sliding_window, nn::window_align(kv), chunk);
  return cap < ctx ? cap : 0;
}

DType GpuModel::kv_store_dtype() const {
  return kv.quantized ? kv.scale_dtype : kv.plain_dtype;
}

namespace {

// Device routing for the MoE layers (GpuModel::moe_on_device), the default ($CIDER_CUDA_MOE_ROUTING=host turns it
// off): when every expert of every MoE layer is one fused gate|up layer and one down layer of one kind the moe
// kernels take (kernels/cuda/moe.h), the router, the shared expert's gate and the experts' weight tables go to the
// device. On the H200 it decodes a Mixtral-shaped model (W4A8) faster than host routing (docs/benchmarks.md).
// Rows per pass: each slot (row, chosen expert) streams its expert's matrices, where host routing streams each
// chosen expert once for all its rows; so the device takes a pass while its slots are at most half the experts
// (n·K ≤ E/2, and always a single row): Mixtral (E 8, K 2) 2 rows, Qwen3-MoE (E 128, K 8) 8. A choice from the
// bytes streamed, measured only for one row.
cuda::MoeWeightKind moe_kind(const GpuLinear& g) {
  return g.kind == WeightKind::kDense ? cuda::MoeWeightKind::kBF16
         : g.kind == WeightKind::kInt8 ? cuda::MoeWeightKind::kInt8
                                       : cuda::MoeWeightKind::kInt4;
}

void prepare_device_moe(GpuModel& m) {
  const ModelConfig& c = m.config;
  if (c.layer_moe.empty() || c.has_linear_layers()) return;
  if (env_word("CIDER_CUDA_MOE_ROUTING", "device", {"device", "host"}, kOp) == "host") return;
  if (c.num_experts > cuda::kMoeMaxExperts || c.experts_per_token > cuda::kMoeMaxTopK) return;
  auto fits = [&](const GpuLinear& g) {
    if (g.N == 0 || g.bias != nullptr || g.split_x || g.kind == WeightKind::kGgml) return false;
    if (g.kind == WeightKind::kDense && g.w_dtype != DType::kBF16) return false;
    return cuda::moe_gemv_supports(moe_kind(g), g.K, g.group_size);
  };
  const GpuLinear* first = nullptr;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    for (const GpuExpert& x : m.layers[sz(l)].experts) {
      if (!x.gate_up.parts.empty() || !fits(x.gate_up.fused) || !fits(x.down)) return;
      if (first == nullptr) first = &x.gate_up.fused;
      if (x.gate_up.fused.kind != first->kind || x.down.kind != first->kind) return;
    }
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe_layer(l)) continue;
    GpuLayer& g = m.layers[sz(l)];
    g.router_dev = upload_floats(g.router.data(), static_cast<int64_t>(g.router.size()));
    if (!g.shared_gate.empty()) g.shared_gate_dev = upload_floats(g.shared_gate.data(), c.hidden_size);
    std::vector<cuda::MoeExpertWeights> gu, down;
    for (const GpuExpert& x : g.experts) {
      gu.push_back({x.gate_up.fused.w, x.gate_up.fused.scales});
      down.push_back({x.down.w, x.down.scales});
    }
    g.moe_gu_table = cuda::to_device(gu.data(), gu.size() * sizeof(cuda::MoeExpertWeights));
    g.moe_down_table = cuda::to_device(down.data(), down.size() * sizeof(cuda::MoeExpertWeights));
  }
  m.moe_on_device = true;
  m.moe_device_rows = std::clamp<int64_t>(c.num_experts / (2 * c.experts_per_token), 1, GpuModel::kMoeDeviceRows);
}


}  // namespace

std::shared_ptr<const GpuModel> upload_model(const Model::Impl& cpu, std::shared_ptr<Collective> comm) {
  cuda::require_device(kOp);
  const ModelConfig& full = cpu.config;
  const int rank = comm ? comm->rank() : 0, ranks = comm ? comm->size() : 1;
  check_tensor_parallel(full, cpu.options.weights, ranks);
  const ModelConfig c = tp_shard_config(full, ranks);  // this rank's shape (the whole model's with one rank)
  check_supported(c, cpu.options.weights, cpu.options.kv);
  auto m = std::make_shared<GpuModel>();
  m->config = c;
  m->kv = cpu.options.kv;
  m->ctx = cpu.ctx;
  m->kv_full_sliding = cpu.options.kv_full_sliding;
  m->weights = cpu.options.weights;
  m->comm = std::move(comm);
  CIDER_CUDA_CHECK(kOp, cudaGetDevice(&m->device));
  const Weights& W = cpu.w;
  // This rank's query heads, KV heads and intermediate rows (model/tensor_parallel.h): the whole ranges with one rank.
  const int64_t D = c.head_dim;
  const auto [q0, q1] = tp_range(full.num_heads, rank, ranks);
  const auto [kv0, kv1] = tp_range(full.num_kv_heads, rank, ranks);
  auto mlp_shares = [&](const Linear& gate, const Linear& up, const Linear& down, int64_t I, GpuFusedLinear& gu,
                        GpuLinear& dn) {
    const auto [i0, i1] = tp_range(I, rank, ranks);
    const LinearShare g = share_rows(gate, i0, i1), u = share_rows(up, i0, i1);
    gu = upload_fused({&g.linear, &u.linear});
    dn = upload_linear(share_cols(down, i0, i1, /*with_bias=*/rank == 0).linear);
  };

  m->embed_dtype = W.embed_dtype;
  m->embed_ggml_type = W.embed_ggml_type;
  if (W.embed_ggml_type != 0) {  // native blocks (the loader keeps only formats with kernels)
    nn::LinearWeights rows;
    rows.K = c.hidden_size;
    rows.ggml_type = W.embed_ggml_type;
    m->embed = cuda::to_device(W.embed, sz(c.vocab_size) * sz(ggml_row_bytes(rows)));
  } else {
    m->embed = cuda::to_device(W.embed, sz(c.vocab_size) * sz(c.hidden_size) * dtype_size(W.embed_dtype));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = W.layers[sz(l)];
    GpuLayer& g = m->layers.emplace_back();
    g.attn_norm = upload_floats(L.attn_norm.w, c.hidden_size);
    g.mlp_norm = upload_floats(L.mlp_norm.w, c.hidden_size);
    if (c.qk_norm) {  // per head, or over the whole projection (OLMoE; one rank: check_tensor_parallel)
      g.q_norm = upload_floats(L.q_norm.w, c.qk_norm_full ? c.num_heads * c.head_dim : c.head_dim);
      g.k_norm = upload_floats(L.k_norm.w, c.qk_norm_full ? c.num_kv_heads * c.head_dim : c.head_dim);
    }
    if (c.sandwich_norms) {
      g.post_attn_norm = upload_floats(L.post_attn_norm.w, c.hidden_size);
      g.post_mlp_norm = upload_floats(L.post_mlp_norm.w, c.hidden_size);
    }
    if (c.is_linear_layer(l)) {  // a gated DeltaNet instead of attention (one rank: check_tensor_parallel)
      upload_linear_attention(g, L, c, l);
    } else {
      // Gated attention: q_proj holds the queries then the gates (loader), so the fused row is [q | gates | k | v]:
      // this rank's heads of both parts.
      const int64_t q_rows = (c.attn_output_gate ? 2 : 1) * full.num_heads * D;
      check(L.q.N == q_rows, ErrorCode::kInternal, kOp, "q_proj of layer ", l, " must have ", q_rows, " rows",
            c.attn_output_gate ? " (queries then gates)" : "", "; got ", L.q.N);
      const LinearShare q = share_rows_of_parts(L.q, full.num_heads * D, q0 * D, q1 * D);
      const LinearShare k = share_rows(L.k, kv0 * D, kv1 * D), v = share_rows(L.v, kv0 * D, kv1 * D);
      g.qkv = upload_fused({&q.linear, &k.linear, &v.linear});
      g.o = upload_linear(share_cols(L.o, q0 * D, q1 * D, /*with_bias=*/rank == 0).linear);
    }
    if (c.is_moe_layer(l)) {
      check(L.router.kind == WeightKind::kDense && L.router.w_dtype == DType::kF32, ErrorCode::kInternal, kOp,
            "the router of layer ", l, " must be float32");
      const auto* r = static_cast<const float*>(L.router.w);
      g.router.assign(r, r + c.num_experts * c.hidden_size);
      for (const LayerWeights::Expert& x : L.experts) {
        GpuExpert& ge = g.experts.emplace_back();
        mlp_shares(x.gate, x.up, x.down, full.expert_intermediate_size, ge.gate_up, ge.down);
      }
      if (c.shared_expert_intermediate_size > 0) {
        mlp_shares(L.shared.gate, L.shared.up, L.shared.down, full.shared_expert_intermediate_size, g.shared.gate_up,
                   g.shared.down);
        const float* sg = float32_weights(L.shared_gate, 1, c.hidden_size, l);
        g.shared_gate.assign(sg, sg + c.hidden_size);
      }
    } else {
      mlp_shares(L.gate, L.up, L.down, full.intermediate_size, g.gate_up, g.down);
    }
    upload_rotation(g, *m, l);
  }
  m->final_norm = upload_floats(W.final_norm.w, c.hidden_size);
  const auto [v0, v1] = tp_range(c.vocab_size, rank, ranks);  // this rank's rows of the head
  m->vocab0 = v0;
  if (W.head_is_embedding && W.embed_dtype == DType::kBF16) {
    m->lm_head.kind = WeightKind::kDense;  // the tied head reads the device embedding itself
    m->lm_head.w_dtype = DType::kBF16;
    m->lm_head.N = v1 - v0;
    m->lm_head.K = c.hidden_size;
    m->lm_head.w = static_cast<const uint16_t*>(m->embed.data()) + v0 * c.hidden_size;
  } else if (W.head_is_embedding && W.embed_ggml_type != 0) {  // native blocks: the head reads them in place too
    m->lm_head.kind = WeightKind::kGgml;
    m->lm_head.w_dtype = DType::kU8;
    m->lm_head.ggml_type = W.embed_ggml_type;
    m->lm_head.N = v1 - v0;
    m->lm_head.K = c.hidden_size;
    m->lm_head.w = static_cast<const uint8_t*>(m->embed.data()) + v0 * ggml_row_bytes(m->lm_head);
  } else {
    m->lm_head = upload_linear(share_rows(W.lm_head, v0, v1).linear);
  }
  upload_rope_tables(*m, cpu.inv_freq, cpu.inv_freq_local);
  if (c.has_linear_layers()) {  // float32-faithful activations for every dense layer (GpuModel::split_activations)
    auto mark = [&](GpuLinear& g) {
      if (g.kind != WeightKind::kDense) return;
      g.split_x = true;
      m->split_activations = true;
    };
    for (GpuLayer& L : m->layers) for_each_linear(L, mark);
    mark(m->lm_head);
  }

  prepare_device_moe(*m);

  m->weight_bytes = m->embed.bytes() + m->final_norm.bytes() + m->lm_head.owned_bytes();
  for (const GpuLayer& L : m->layers) m->weight_bytes += layer_bytes(L);
  return m;
}

std::shared_ptr<const GpuModel> random_model(const ModelConfig& config, WeightFormat weights, const KVOptions& kv,
                                             int64_t ctx, uint64_t seed, std::shared_ptr<Collective> comm) {
  cuda::require_device(kOp);
  const int ranks = comm ? comm->size() : 1;
  check_tensor_parallel(config, weights, ranks);
  check_supported(config, weights, kv);
  check(ctx >= 1, ErrorCode::kInvalidArgument, kOp, "ctx must be >= 1; got ", ctx);
  bool any_moe = false;
  for (int64_t l = 0; l < config.num_layers; ++l) any_moe = any_moe || config.is_moe_layer(l);
  check(!config.has_linear_layers() && !config.attn_output_gate && !any_moe, ErrorCode::kUnsupported,
        kOp, "random benchmark models have dense attention and MLP layers only (no linear-attention, gated-attention "
        "or mixture-of-experts weights)");
  const ModelConfig c = tp_shard_config(config, ranks);
  auto m = std::make_shared<GpuModel>();
  m->config = c;
  m->comm = std::move(comm);
  CIDER_CUDA_CHECK(kOp, cudaGetDevice(&m->device));
  m->kv = kv;
  if (!kv.quantized) m->kv.rotation = nn::RotationKind::kNone;
  m->ctx = ctx;
  m->weights = weights;
  cuda::Stream stream;
  void* s = stream.handle();
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  uint64_t salt = seed * 1000003ull;
  m->embed_dtype = DType::kBF16;
  m->embed = cuda::DeviceBuffer(sz(c.vocab_size) * sz(H) * 2);
  cuda::fill_uniform(m->embed.data(), DType::kBF16, c.vocab_size * H, ++salt, -1.0f, 1.0f, s);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    GpuLayer& g = m->layers.emplace_back();
    g.attn_norm = ones(H, s);
    g.mlp_norm = ones(H, s);
    if (c.qk_norm) {
      g.q_norm = ones(D, s);
      g.k_norm = ones(D, s);
    }
    if (c.sandwich_norms) {
      g.post_attn_norm = ones(H, s);
      g.post_mlp_norm = ones(H, s);
    }
    g.qkv.fused = random_linear((c.num_heads + 2 * c.num_kv_heads) * D, H, weights, ++salt, s);
    g.qkv.N = g.qkv.fused.N;
    g.qkv.K = H;
    g.o = random_linear(H, c.num_heads * D, weights, ++salt, s);
    g.gate_up.fused = random_linear(2 * I, H, weights, ++salt, s);
    g.gate_up.N = 2 * I;
    g.gate_up.K = H;
    g.down = random_linear(H, I, weights, ++salt, s);
    upload_rotation(g, *m, l);
  }
  m->final_norm = ones(H, s);
  const auto [v0, v1] = tp_range(c.vocab_size, m->comm ? m->comm->rank() : 0, ranks);
  m->vocab0 = v0;
  m->lm_head = random_linear(v1 - v0, H, weights, ++salt, s);
  upload_rope_tables(*m, rope_inv_freq(c.rope, D, ctx, c.rotary_dim), rope_inv_freq(c.rope_local, D, ctx, c.rotary_dim));
  stream.synchronize();
  m->weight_bytes = m->embed.bytes() + m->final_norm.bytes() + m->lm_head.owned_bytes();
  for (const GpuLayer& L : m->layers) m->weight_bytes += layer_bytes(L);
  return m;
}

// ---- sessions -----------------------------------------------------------------------------------------------------

namespace {

// One layer's cache: keys then values in one allocation per kind, [2, Hkv, cap, ·] when keys and values have the same
// row size (one kv_append with B = 2 writes both), else keys [Hkv, cap, ·] followed by values [Hkv, cap, ·]; cap is
// ctx, or GpuModel::slide_capacity on a bounded sliding layer (storage row 0 = position Impl::slide_base).
// Per-channel keys (nn::KeyLayout::kChannel): key codes [Hkv, ctx, D·bits/32], key scales/biases per block
// [Hkv, blocks, D] (the first part of scales/biases, values' [Hkv, ctx, D/gs] after it), and the bfloat16 residual
// window [Hkv, gs, D] in `residual`.
struct LayerCache {
  cuda::DeviceBuffer data, scales, biases;  // quantized: codes u32 [.., D·bits/32], scales/biases [.., D/gs]; plain: [.., D]
  cuda::DeviceBuffer residual;
  // Outlier key channels (per-channel keys): refinement codes [Hkv, blocks, N·gs/2] uint8, channel indices
  // [Hkv, blocks, N] uint16, the window positions' query statistics [Hkv, gs, D + 1] uint8 (quant/kv_stats.h's
  // one-byte code per channel, then the count: the CPU cache's bytes).
  cuda::DeviceBuffer ocodes, oindex, qstats;
  void* k = nullptr;
  void* v = nullptr;
  void* k_scales = nullptr;
  void* v_scales = nullptr;
  void* k_biases = nullptr;
  void* v_biases = nullptr;
  int64_t cap = 0;       // positions of storage
  bool bounded = false;  // a sliding layer that keeps only its window
};

void* at_byte(const cuda::DeviceBuffer& b, size_t offset) { return static_cast<uint8_t*>(b.data()) + offset; }

// A linear-attention layer's state for one session (ModelConfig::LinearAttention, the CPU session's LinearState):
// the recurrent state S float32 [Hv, Dk, Dv] and the conv window float32 [K − 1, C] of the last raw q|k|v rows, after
// `pos` positions (host bookkeeping: the launches that advance it are enqueued by the host, never replayed by a
// graph). Allocated zeroed with the session.
struct LinearState {
  cuda::DeviceBuffer S, conv;
  int64_t pos = 0;
};

}  // namespace

// The session's executor: the Backend ops (model/backend.h) as launches on a stream, over the session's activations
// and caches. A pass's state (rows, positions: host values for a prompt, device words for a graph's decode step) is
// set by begin_pass / begin_decode; the ops read it.
struct GpuSession::Impl final : public PassBackend {
  const GpuModel& m;
  cuda::Stream stream;
  cuda::DeviceBuffer workspace;
  std::vector<LayerCache> caches;
  bool kv_same_rows = false;  // keys and values have the same row bytes: one kv_append for both
  // Activations, float32, sized for `chunk` rows: x, h, tmp (rows, hidden); qkv (rows, (Hq + 2·Hkv)·D, gated
  // attention (rows, (2·Hq + 2·Hkv)·D)); q, ao, att (rows, Hq·D); gu (rows, 2·I); ffn (rows, I); scratch (rows, largest
  // unfused part) only for unfused parts; logits_last (vocab); logits_all (rows, vocab), grown as multi-row heads ask.
  // Hybrid models also: la_qkvz (rows, C + V), la_conv (rows, C), la_o (rows, V), la_beta and la_g (rows, Hv).
  cuda::DeviceBuffer x, h, tmp, qkv, q, ao, att, gu, ffn, scratch, logits_last, logits_all;
  cuda::DeviceBuffer la_qkvz, la_conv, la_o, la_beta, la_g;
  std::vector<LinearState> lin_states;  // (layer): the linear-attention layers' states, empty elsewhere
  int64_t chunk = 0;          // prefill rows per pass (GpuSession::prefill_chunk)
  cuda::DeviceBuffer tokens;  // int32 [ctx]: the tokens of one forward call
  // int32 [kStepWords]: the decode step's token, position, KV length, and the bounded sliding layers' storage
  // offset and length (position − slide_base, + 1); read by the graph.
  static constexpr int kStepWords = 8;
  cuda::DeviceBuffer step;
  int32_t* step_host = nullptr;   // pinned [kStepWords], copied into `step` by the first node of a decode step
  float* logits_host = nullptr;   // pinned [vocab], written by the last node of a decode step
  int64_t decode_position = -1;   // the host mirror of step_host[1]
  bool copy_logits = true;        // whether the decode step ends with the copy of the logits to logits_host
  bool pending = false;           // a decode step was enqueued without waiting for it (step_host still in use)
  // Decode graphs by 2 · KV bound + (copy_logits ? 0 : 1).
  std::map<int64_t, cudaGraphExec_t> graphs;
  // Device sampling (candidates()): cuda::topk_logits's workspace, and one device and one pinned block laid out as
  // excluded [kTopkMaxExcluded] | ids [kTopkMaxK] | vals [kTopkMaxK] | excluded_vals [kTopkMaxExcluded] | status,
  // 4-byte words; allocated on first use.
  cuda::DeviceBuffer topk_ws, topk_dev;
  int32_t* topk_host = nullptr;
  int skip = 0;                   // GpuSession::bench_skip of the step being enqueued

  explicit Impl(const GpuModel& model);
  ~Impl();

  cuda::Exec exec(void* s) const {
    cuda::Exec e;
    e.stream = s;
    e.workspace = workspace.data();
    e.workspace_bytes = workspace.bytes();
    return e;
  }
  kernels::KVTensorView view(int64_t layer, bool keys, int64_t length) const;
  kernels::AttentionArgs attention_args(int64_t layer, const float* q_heads, float* out_heads, int64_t L,
                                        int64_t kv_length) const;
  // Appends n positions of keys and values read from qkv-shaped rows: key head h of token t at
  // k_src + t·row_stride + h·D, its value Hkv·D further (already rotated when the rotation is Hadamard).
  bool kchan() const { return m.kv.quantized && m.kv.key_layout == nn::KeyLayout::kChannel; }
  int64_t key_blocks(int64_t layer) const {
    return (caches[sz(layer)].cap + m.kv.group_size - 1) / m.kv.group_size;
  }
  // Bounded sliding layers (GpuModel::slide_capacity): storage row 0 holds position slide_base, a multiple of
  // nn::window_align; make_room drops what the next n positions from pos0 cannot see (as nn's sliding-window caches:
  // all but the last window − 1 positions, in multiples of the alignment), moving the kept rows down on stream e.
  int64_t slide_cap = 0;
  int64_t slide_base = 0;
  void make_room(int64_t pos0, int64_t n, const cuda::Exec& e);
  bool can_truncate(int64_t position) const;
  int64_t store_pos(int64_t layer, int64_t position) const {
    return caches[sz(layer)].bounded ? position - slide_base : position;
  }
  cuda::KVChannelKeysArgs channel_keys_args(int64_t layer) const;
  int64_t kv_end = 0;  // positions [0, kv_end) were written (a trim back into a quantized block refills the window)
  // q_src: the positions' queries [Hq, n, D] (after RoPE), for the outlier key channels' statistics (null: none).
  void append_kv(int64_t layer, const float* k_src, int64_t row_stride, int64_t n, int64_t offset,
                 const int32_t* d_offset, const cuda::Exec& e, const float* q_src = nullptr) const;
  // The head over rows [first, first + rows) of h (already final-normed) into out (rows, vocab), with the softcap.
  void enqueue_head(int64_t first, int64_t rows, float* out, const cuda::Exec& e);
  void enqueue_decode(void* s);
  void decode(int32_t token, int64_t position, float* logits, bool use_graphs);
  void candidates(const CandidateRequest& request, Candidates& out);

  // ---- the pass (begin_pass: a prompt's chunk at host positions; begin_decode: one token at device positions) ----
  cuda::Exec e_{};
  int64_t n_ = 0;                   // rows
  const int32_t* d_tok_ = nullptr;  // the rows' token ids (device)
  const float* o_in_ = nullptr;     // the o projection's input (finish_heads' output, or attention's)
  std::vector<PassSegment> segs_;   // the pass's sequences (one, unless GpuSession::forward_batch)
  std::vector<Impl*> batch_{this};  // segs_[i].seq's session: whose caches its kv_append and attention use
  // Decode passes (one row per sequence, positions on the device): sequence i's step words (device int32: position,
  // KV length after the append, and the same two in the bounded sliding layers' storage rows) at words_ + i·kBatchWords,
  // and the graph's bound on every sequence's KV length. words_ null for a pass at host positions (begin_pass).
  const int32_t* words_ = nullptr;
  int64_t bound_ = 0;
  bool batch_rows_ = false;  // a batched decode pass: row i is sequence i's one token
  // A pass at host positions whose first dec_ segments are one row each (the server's decode rows beside prompt
  // chunks, GpuSession::forward_batch): their heads are prepared and finished in one launch each (positions from
  // dec_pos, int32 [chunk]), their appends and attention run on the branch streams as a decode batch's do. 0: none.
  int64_t dec_ = 0;
  cuda::DeviceBuffer dec_pos;
  const int32_t* words(const PassSegment& g) const { return words_ ? words_ + g.seq * kBatchWords : nullptr; }
  // Segment g's kv_append / attention (its session's cache and positions) on e.
  void append_segment(int64_t layer, const PassSegment& g, const cuda::Exec& e);
  void attend_segment(int64_t layer, const PassSegment& g, const cuda::Exec& e);
  void begin_decode(void* s);

  // ---- batched decode (GpuSession::forward_batch with one token per session), on the lead session ----
  // bstep: int32 [B tokens | B × kBatchWords words], copied in from bstep_host (pinned) by a step's first node;
  // blogits: the head's rows [B, head_rows], copied out to blogits_host (pinned) by its last. Sized for batch_cap
  // sequences; the graphs hold their addresses (a larger batch frees both and the graphs).
  static constexpr int64_t kBatchWords = 4;
  int64_t batch_cap = 0;
  cuda::DeviceBuffer bstep, blogits;
  int32_t* bstep_host = nullptr;
  float* blogits_host = nullptr;
  // Graphs of batched decode steps, keyed by [B, the batch's KV bound (the largest of its sequences' buckets), whether
  // the rows are copied out, each sequence's session id]: a batch whose sequences and order repeat (a steady decode)
  // replays its graph. A key that differs from a held graph's only in its sessions is captured at once and that graph
  // updated in place (cudaGraphExecUpdate: the same kernels, other cache pointers). Another new key is captured the
  // second step in a row it is seen (the first runs directly, which also sets up the launchers' state outside any
  // capture; a batch that changes size at every step, as requests arrive, captures nothing). At most kBatchGraphs
  // kept; a new one updates the least recently used in place when the topology allows, else replaces it.
  struct BatchGraph {
    std::vector<int64_t> key;
    cudaGraphExec_t exec = nullptr;
    uint64_t used = 0;
  };
  static constexpr size_t kBatchGraphs = 4;
  // A decode batch's kv_append + attention of sequence i run on branch stream i % kBranches, forked from the pass's
  // stream and joined back in every layer (in a graph: parallel branches), each with its own attention workspace
  // (branch_ws_bytes, enough for one row at any KV length): one sequence's attention fills a few SMs, several fill
  // the GPU. Made on a session's first batch.
  static constexpr int kBranches = 8;
  std::vector<std::unique_ptr<cuda::Stream>> branch_streams;
  std::vector<cudaEvent_t> branch_events;  // [0] the fork, [1 + p] branch p's join
  cuda::DeviceBuffer branch_ws;
  size_t branch_ws_bytes = 0;
  void make_branches();
  std::vector<BatchGraph> batch_graphs;
  uint64_t batch_clock = 0;
  int64_t batch_captures = 0;
  int64_t batch_updates = 0;  // graphs of another composition updated in place for a new one
  std::vector<int64_t> last_batch_key;  // the previous batched step's key when it ran directly
  bool batch_copy_ = true;  // the decode batch being enqueued copies its rows of logits to blogits_host
  // batch_candidates: per row kBatchCandWords int32 words — excluded [kTopkMaxExcluded] | ids [kTopkMaxK] |
  // vals [kTopkMaxK] | excluded_vals [kTopkMaxExcluded] | status | max | log-sum — on the device (bcand) and pinned
  // (bcand_host), sized for batch_cap rows; the normalizers also land in bstats [2 · rows] first. Topk workspace once.
  static constexpr int64_t kBatchCandWords = 2 * cuda::kTopkMaxExcluded + 2 * cuda::kTopkMaxK + 3;
  cuda::DeviceBuffer bcand, bstats, bcand_ws;
  int32_t* bcand_host = nullptr;
  int64_t bcand_cap = 0;
  void batch_candidates(std::span<const CandidateRequest> requests, std::span<Candidates> out);
  const int64_t id;  // unique among the process's sessions (a batch graph's key names sessions by it)
  void decode_batch(std::span<Impl* const> seqs, std::span<const SequenceStep> steps, bool use_graphs);
  // bound: the batch's KV bound, the largest of its sequences' buckets (its key changes only when that one does).
  void enqueue_decode_batch(std::span<const int64_t> positions, int64_t bound);
  void drop_batch_graphs();

  // ---- Backend (model/backend.h) ----
  int64_t max_pass_rows() const override { return chunk; }
  void begin_pass(std::span<const PassSegment> segments, const int32_t* tokens) override;
  void embed() override;
  void residual_norm(bool add, int64_t layer, NormSlot post, int64_t next_layer, NormSlot next) override;
  void linear(int64_t layer, LinearSlot slot) override;
  void prepare_heads(int64_t layer) override;
  void kv_append(int64_t layer) override;
  void attention(int64_t layer) override;
  void finish_heads(int64_t layer) override;
  void glu() override;
  // Tensor parallelism: tmp (the rows' block output, a partial sum on each rank) ← its sum over the ranks.
  void all_reduce_block();
  // Mixture-of-experts layer. Passes of at most GpuModel::moe_device_rows rows with moe_on_device: routed on the
  // device (kernels/cuda/moe.h: route, the slots' gate|up, GLU, down through the experts' weight tables, combine in
  // expert order), graph-capturable. Otherwise h is copied to the host, routed there (route_experts, the CPU's rule,
  // with the router in float32), then per expert with rows: gather its rows, gate|up, GLU, down, and add them
  // weighted into tmp; the copy synchronises the stream, so such steps run without CUDA graphs.
  // A shared expert (Qwen3-Next) then runs on every row, its output scatter-added with the weights sigmoid(h·w_sg)
  // computed on the host from the same copy of h (slots n·K … n·K + n − 1 of the index and weight buffers).
  void moe(int64_t layer) override;
  // A gated DeltaNet layer (kernels/cuda/gated_delta.h), h → tmp: q|k|v|z linear and gdn_gates over all rows, then per
  // sequence the conv on its window and the recurrence on its state, l2norm_qk and gated_rms_norm over all rows, out.
  void linear_attention(int64_t layer) override;
  int64_t row_stride_qkv() const;   // floats per row of qkv: (Hq + gates + 2·Hkv)·D
  bool linear_states_at(int64_t position) const;  // every linear-attention state is at `position`
  void reset_linear_states();       // zeros on the stream, positions 0
  std::vector<float> moe_h, moe_logits, moe_w;      // host: h (n, hidden), router logits (n, E), slot weights
  std::vector<int32_t> moe_chosen, moe_rows;        // host: experts (n, K); slots' rows grouped by expert
  cuda::DeviceBuffer moe_in, moe_gu, moe_ffn, moe_out, moe_scratch, moe_idx, moe_wdev;  // allocated on first use
  // Device routing (GpuModel::moe_on_device), for up to moe_device_rows rows: each slot's expert and weight, the rows'
  // shared-expert weights, gate|up (slots, 2·Ie), GLU (slots, Ie), down (slots, H).
  cuda::DeviceBuffer moe_sel, moe_wk, moe_wsh, moe_y1, moe_y2, moe_y3;
  void logits(int64_t first, int64_t rows, float* dst) override;
  void gather_rows(std::span<const int64_t> rows) override;
  void end_forward() override { stream.synchronize(); }
  const float* norm(int64_t layer, NormSlot slot) const;
  cuda::HeadPrepArgs head_prep(int64_t layer, const PassSegment& g) const;
};

std::atomic<int64_t> g_next_session_id{1};

GpuSession::Impl::Impl(const GpuModel& model) : m(model), id(g_next_session_id.fetch_add(1)) {
  const ModelConfig& c = m.config;
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, I = c.intermediate_size;
  chunk = GpuSession::prefill_chunk_for(m.ctx);
  const int64_t R = chunk, ctx = m.ctx;
  auto f32 = [](int64_t n) { return cuda::DeviceBuffer(sz(n) * sizeof(float)); };
  x = f32(R * H);
  h = f32(R * H);
  tmp = f32(R * H);
  qkv = f32(R * row_stride_qkv());
  q = f32(R * Hq * D);
  ao = f32(R * Hq * D);
  att = f32(R * Hq * D);
  gu = f32(R * 2 * I);
  ffn = f32(R * I);
  int64_t part_n = 0;  // (the experts' parts use moe_scratch)
  for (const GpuLayer& L : m.layers)
    part_n = std::max({part_n, L.qkv.max_part_N(), L.gate_up.max_part_N(), L.lin_qkvz.max_part_N()});
  if (part_n > 0) scratch = f32(R * part_n);
  // Hybrid models: the linear-attention activations, and each linear layer's state (zeros: a fresh sequence).
  const ModelConfig::LinearAttention& la = c.linear_attn;
  const int64_t la_C = la.conv_dim(), la_V = la.value_dim();
  if (c.has_linear_layers()) {
    la_qkvz = f32(R * (la_C + la_V));
    la_conv = f32(R * la_C);
    la_o = f32(R * la_V);
    la_beta = f32(R * la.num_v_heads);
    la_g = f32(R * la.num_v_heads);
  }
  lin_states.resize(sz(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_linear_layer(l)) continue;
    LinearState& st = lin_states[sz(l)];
    st.S = f32(la.num_v_heads * la.k_head_dim * la.v_head_dim);
    st.conv = f32((la.conv_kernel - 1) * la_C);
    st.S.fill(0);
    st.conv.fill(0);
  }
  logits_last = f32(m.head_rows());
  tokens = cuda::DeviceBuffer(sz(ctx) * sizeof(int32_t));
  step = cuda::DeviceBuffer(kStepWords * sizeof(int32_t));

  // KV planes for the whole context (bounded sliding layers: for their window and a chunk), allocated once.
  const KVOptions& kv = m.kv;
  const DType sd = m.kv_store_dtype();
  slide_cap = m.slide_capacity(chunk);
  kv_same_rows = !kv.quantized || (kv.k_bits == kv.v_bits && !kchan());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerCache& lc = caches.emplace_back();
    if (c.is_linear_layer(l)) continue;  // a recurrent state instead (linear): no cache, cap 0
    lc.bounded = slide_cap > 0 && c.layer_sliding[sz(l)] != 0;
    lc.cap = lc.bounded ? slide_cap : ctx;
    const size_t rows = sz(Hkv) * sz(lc.cap);
    if (kchan()) {
      const size_t k_group = sz(Hkv) * sz(key_blocks(l)) * sz(D) * dtype_size(sd);
      const size_t v_group = rows * sz(D / kv.group_size) * dtype_size(sd);
      const size_t k_bytes = rows * sz(D * kv.k_bits / 32) * 4, v_bytes = rows * sz(D * kv.v_bits / 32) * 4;
      lc.data = cuda::DeviceBuffer(k_bytes + v_bytes);
      lc.scales = cuda::DeviceBuffer(k_group + v_group);
      lc.biases = cuda::DeviceBuffer(k_group + v_group);
      lc.residual = cuda::DeviceBuffer(sz(Hkv) * sz(kv.group_size) * sz(D) * sizeof(uint16_t));
      if (kv.key_outliers > 0) {
        const size_t nb = sz(Hkv) * sz(key_blocks(l));
        lc.ocodes = cuda::DeviceBuffer(nb * sz(kv.key_outliers) * sz(kv.group_size / 2));
        lc.oindex = cuda::DeviceBuffer(nb * sz(kv.key_outliers) * sizeof(uint16_t));
        lc.qstats = cuda::DeviceBuffer(sz(Hkv) * sz(kv.group_size) * sz(D + 1));  // one byte each (quant/kv_stats.h)
      }
      lc.k = lc.data.data();
      lc.v = at_byte(lc.data, k_bytes);
      lc.k_scales = lc.scales.data();
      lc.v_scales = at_byte(lc.scales, k_group);
      lc.k_biases = lc.biases.data();
      lc.v_biases = at_byte(lc.biases, k_group);
    } else if (kv.quantized) {
      const size_t group_bytes = rows * sz(D / kv.group_size) * dtype_size(sd);
      const size_t k_bytes = rows * sz(D * kv.k_bits / 32) * 4, v_bytes = rows * sz(D * kv.v_bits / 32) * 4;
      lc.data = cuda::DeviceBuffer(k_bytes + v_bytes);
      lc.scales = cuda::DeviceBuffer(2 * group_bytes);
      lc.biases = cuda::DeviceBuffer(2 * group_bytes);
      lc.k = lc.data.data();
      lc.v = at_byte(lc.data, k_bytes);
      lc.k_scales = lc.scales.data();
      lc.v_scales = at_byte(lc.scales, group_bytes);
      lc.k_biases = lc.biases.data();
      lc.v_biases = at_byte(lc.biases, group_bytes);
    } else {
      const size_t plane = rows * sz(D) * dtype_size(sd);
      lc.data = cuda::DeviceBuffer(2 * plane);
      lc.k = lc.data.data();
      lc.v = at_byte(lc.data, plane);
    }
    // Zeros rather than whatever the allocator left: positions past the length are never meant to be read, but a
    // finite value there keeps a masked-out read from turning into 0·NaN.
    for (cuda::DeviceBuffer* b : {&lc.data, &lc.scales, &lc.biases, &lc.residual, &lc.ocodes, &lc.oindex, &lc.qstats})
      if (b->bytes() > 0) b->fill(0);
  }

  // One workspace for every launcher (they run one after another on the stream): the largest need of the quantized
  // / bf16 linear layers at `chunk` rows, and of attention over every decode bucket and the prefill tile shapes.
  size_t ws = 0;
  // The linear layers' K: hidden (q|k|v, gate|up, lin_qkvz), Hq·D (o), I (down), the experts' and the shared expert's
  // intermediate sizes (their down), V (out_proj).
  const int64_t max_k = std::max({H, Hq * D, I, c.expert_intermediate_size, c.shared_expert_intermediate_size, la_V});
  if (m.weights == WeightFormat::kBF16) {
    ws = std::max(ws, cuda::dense_bf16_workspace_bytes(R, max_k));
  } else if (weight_format_info(m.weights).kind == WeightKind::kGgml) {
    // Native GGUF (or requantized into blocks: q4_k, …): tensors of a type without kernels are bf16 (dense_bf16); each block layer needs the GEMV's
    // activation codes up to kGgmlGemvRows rows and, past them, its rows decoded to bf16 (N·K·2 bytes) plus the dense
    // GEMM's share.
    ws = std::max(ws, cuda::dense_bf16_workspace_bytes(R, max_k));
    auto native = [&](const GpuLinear& g) {
      if (g.kind != WeightKind::kGgml) return;
      ws = std::max({ws, cuda::ggml_linear_workspace_bytes(R, g.N, g.K),
                     cuda::ggml_linear_workspace_bytes(std::min<int64_t>(R, cuda::kGgmlGemvRows), g.N, g.K)});
    };
    for (const GpuLayer& L : m.layers) for_each_linear(L, native);
    native(m.lm_head);
  } else {
    ws = std::max(ws, cuda::int_linear_workspace_bytes(R, max_k));
  }
  // The head of a bf16-embedding model with int weights is still an int layer (upload_linear), so the above covers
  // it; a tied bf16 head only occurs with bf16 weights.
  if (m.split_activations) {  // dense_bf16_split: pieces of up to 512 rows of each layer; the head at least a row
    const int64_t rows = std::min<int64_t>(R, 512);
    for (const GpuLayer& L : m.layers)
      for_each_linear(L, [&](const GpuLinear& g) {
        if (g.split_x) ws = std::max(ws, cuda::dense_bf16_split_workspace_bytes(rows, g.N, g.K));
      });
    if (m.lm_head.split_x) ws = std::max(ws, cuda::dense_bf16_split_workspace_bytes(1, m.lm_head.N, m.lm_head.K));
  }
  std::vector<int64_t> lengths;
  for (int64_t b = 256; b < ctx; b *= 2) lengths.push_back(b);
  lengths.push_back(ctx);
  // An attention layer of each kind (full-attention and sliding, where the model has both; linear-attention layers
  // have no cache).
  std::vector<int64_t> probe_layers;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.is_linear_layer(l)) continue;
    if (probe_layers.empty() || c.layer_sliding[sz(l)] != c.layer_sliding[sz(probe_layers[0])]) probe_layers.push_back(l);
    if (probe_layers.size() == 2) break;
  }
  auto probe = [&](int64_t layer, int64_t L, int64_t len) {
    len = std::min(len, caches[sz(layer)].cap);  // a bounded sliding layer never holds more
    if (L > len) return;
    ws = std::max(ws, cuda::attention_workspace_bytes(attention_args(layer, q.as<float>(), ao.as<float>(), L, len)));
  };
  for (int64_t layer : probe_layers) {
    for (int64_t len : lengths)  // the decode graphs' KV bounds
      for (int64_t L : {int64_t{1}, int64_t{2}, int64_t{16}, int64_t{17}})
        if (L <= len) probe(layer, L, len);
    // A prompt's last chunk can have any length, and the split partials a call needs are not monotone in its rows
    // (fewer rows → fewer CTAs → more splits: 500 rows need more than 2048 with 2048-row chunks), so every length up
    // to the chunk is probed, against the whole context (a call's split count only grows with its key length).
    for (int64_t L = 1; L <= R; ++L) probe(layer, L, ctx);
  }
  workspace = cuda::DeviceBuffer(std::max<size_t>(ws, 256));

  CIDER_CUDA_CHECK(kOp, cudaHostAlloc(reinterpret_cast<void**>(&step_host), kStepWords * sizeof(int32_t),
                                      cudaHostAllocDefault));
  CIDER_CUDA_CHECK(kOp, cudaHostAlloc(reinterpret_cast<void**>(&logits_host), sz(m.head_rows()) * sizeof(float),
                                      cudaHostAllocDefault));
  std::memset(step_host, 0, kStepWords * sizeof(int32_t));
}

GpuSession::Impl::~Impl() {
  for (auto& [bound, g] : graphs) cudaGraphExecDestroy(g);
  drop_batch_graphs();
  for (cudaEvent_t ev : branch_events) cudaEventDestroy(ev);
  if (bstep_host) cudaFreeHost(bstep_host);
  if (blogits_host) cudaFreeHost(blogits_host);
  if (step_host) cudaFreeHost(step_host);
  if (logits_host) cudaFreeHost(logits_host);
  if (topk_host) cudaFreeHost(topk_host);
  if (bcand_host) cudaFreeHost(bcand_host);
}

kernels::KVTensorView GpuSession::Impl::view(int64_t layer, bool keys, int64_t length) const {
  const LayerCache& lc = caches[sz(layer)];
  const KVOptions& kv = m.kv;
  kernels::KVTensorView t{};
  t.B = 1;
  t.H = m.config.num_kv_heads;
  t.length = length;
  t.capacity = lc.cap;
  t.dim = m.config.head_dim;
  t.data = keys ? lc.k : lc.v;
  if (kv.quantized) {
    t.scales = keys ? lc.k_scales : lc.v_scales;
    t.biases = keys ? lc.k_biases : lc.v_biases;
    t.dtype = DType::kU32;
    t.scale_dtype = m.kv_store_dtype();
    t.bits = keys ? kv.k_bits : kv.v_bits;
    t.group_size = kv.group_size;
    if (keys && kchan()) {
      t.layout = 1;
      t.blocks = key_blocks(layer);
      t.residual = lc.residual.data();
      t.outliers = static_cast<int>(kv.key_outliers);
      t.outlier_codes = lc.ocodes.bytes() ? lc.ocodes.data() : nullptr;
      t.outlier_index = lc.oindex.bytes() ? lc.oindex.data() : nullptr;
    }
  } else {
    t.dtype = kv.plain_dtype;
    t.scale_dtype = kv.plain_dtype;
    t.bits = 0;
    t.group_size = 0;
  }
  return t;
}

kernels::AttentionArgs GpuSession::Impl::attention_args(int64_t layer, const float* q_heads, float* out_heads,
                                                        int64_t L, int64_t kv_length) const {
  const ModelConfig& c = m.config;
  kernels::AttentionArgs a{};
  a.q = q_heads;
  a.out = out_heads;
  a.B = 1;
  a.Hq = c.num_heads;
  a.L = L;
  a.keys = view(layer, true, kv_length);
  a.values = view(layer, false, kv_length);
  a.scale = c.attn_scale;
  a.softcap = c.attn_logit_softcap;  // Gemma 2: scores capped before the mask (0 = none)
  a.mask_kind = kernels::MaskKind::kCausal;  // + the window on sliding layers, as the CPU forward masks
  a.window = c.layer_sliding[sz(layer)] != 0 ? c.sliding_window : 0;
  a.mask = nullptr;
  a.mask_dtype = DType::kBool;
  a.kv_splits = 0;
  return a;
}

void GpuSession::Impl::append_kv(int64_t layer, const float* k_src, int64_t row_stride, int64_t n, int64_t offset,
                                 const int32_t* d_offset, const cuda::Exec& e, const float* q_src) const {
  const ModelConfig& c = m.config;
  const LayerCache& lc = caches[sz(layer)];
  const GpuLayer& L = m.layers[sz(layer)];
  const int64_t Hkv = c.num_kv_heads, D = c.head_dim;
  const int rot = m.rotation();
  cuda::KVAppendBatchArgs a{};
  a.src_dtype = DType::kF32;
  a.H = Hkv;
  a.n = n;
  a.dim = D;
  a.src_stride_b = Hkv * D;  // the value heads follow the key heads in a qkv row
  a.src_stride_h = D;
  a.src_stride_t = row_stride;
  // Hadamard rows arrive rotated (prepare_heads): append them as they are, which stores the CPU cache's bytes.
  a.rotation = rot == 3 ? 0 : rot;
  a.qL = a.rotation ? L.rot_left.as<float>() : nullptr;
  a.qR = a.rotation == 2 ? L.rot_right.as<float>() : nullptr;
  a.dst_dtype = m.kv_store_dtype();
  a.group_size = m.kv.group_size;
  a.capacity = lc.cap;
  a.offset = offset;
  auto plane = [&](bool keys) {
    cuda::KVAppendBatchArgs p = a;
    p.B = kv_same_rows ? 2 : 1;  // [2, Hkv, ctx, ·]: keys then values as one batch of two
    p.src = keys ? k_src : k_src + Hkv * D;
    p.dst = keys ? lc.k : lc.v;
    p.scales = keys ? lc.k_scales : lc.v_scales;
    p.biases = keys ? lc.k_biases : lc.v_biases;
    p.bits = m.kv.quantized ? (keys ? m.kv.k_bits : m.kv.v_bits) : 0;
    return p;
  };
  if (kchan()) {  // values as a batch of one; keys to the window and, as blocks fill, per channel
    cuda::KVAppendBatchArgs v = plane(false);
    v.B = 1;
    cuda::kv_append(v, d_offset, e);
    cuda::KVChannelKeysArgs k = channel_keys_args(layer);
    k.src = k_src;
    k.src_dtype = DType::kF32;
    k.n = n;
    k.src_stride_b = 0;
    k.src_stride_h = D;
    k.src_stride_t = row_stride;
    k.offset = offset;
    if (k.outliers > 0 && q_src != nullptr) {  // the positions' queries, [Hq, n, D] (attention's layout)
      k.q = q_src;
      k.Hq = m.config.num_heads;
      k.q_stride_b = 0;
      k.q_stride_h = n * D;
      k.q_stride_t = D;
    }
    cuda::kv_append_channel_keys(k, d_offset, e);
    return;
  }
  // One launch either way: equal rows as a batch of two planes, different bits (k8v4) as a pair.
  if (kv_same_rows) {
    cuda::kv_append(plane(true), d_offset, e);
  } else {
    cuda::kv_append_pair(plane(true), plane(false), d_offset, e);
  }
}

cuda::KVChannelKeysArgs GpuSession::Impl::channel_keys_args(int64_t layer) const {
  const LayerCache& lc = caches[sz(layer)];
  cuda::KVChannelKeysArgs k{};
  k.B = 1;
  k.H = m.config.num_kv_heads;
  k.dim = m.config.head_dim;
  k.codes = static_cast<uint32_t*>(lc.k);
  k.scales = lc.k_scales;
  k.biases = lc.k_biases;
  k.residual = lc.residual.as<uint16_t>();
  k.scale_dtype = m.kv_store_dtype();
  k.bits = m.kv.k_bits;
  k.group_size = m.kv.group_size;
  k.capacity = lc.cap;
  k.blocks = key_blocks(layer);
  k.outliers = static_cast<int>(m.kv.key_outliers);
  k.outlier_codes = lc.ocodes.bytes() ? lc.ocodes.as<uint8_t>() : nullptr;
  k.outlier_index = lc.oindex.bytes() ? lc.oindex.as<uint16_t>() : nullptr;
  k.qstats = lc.qstats.bytes() ? lc.qstats.as<uint8_t>() : nullptr;
  return k;
}

const float* GpuSession::Impl::norm(int64_t layer, NormSlot slot) const {
  if (slot == NormSlot::kFinal) return m.final_norm.as<float>();
  const GpuLayer& L = m.layers[sz(layer)];
  switch (slot) {
    case NormSlot::kAttn: return L.attn_norm.as<float>();
    case NormSlot::kPostAttn: return L.post_attn_norm.as<float>();
    case NormSlot::kMlp: return L.mlp_norm.as<float>();
    case NormSlot::kPostMlp: return L.post_mlp_norm.as<float>();
    default: return nullptr;
  }
}

void GpuSession::Impl::begin_pass(std::span<const PassSegment> segments, const int32_t* host_tokens) {
  check(segments.size() <= batch_.size(), ErrorCode::kInternal, kOp, "a pass of ", segments.size(),
        " sequences needs as many sessions; got ", batch_.size());
  segs_.assign(segments.begin(), segments.end());
  e_ = exec(stream.handle());
  n_ = 0;
  for (const PassSegment& g : segments) n_ += g.n;
  words_ = nullptr;
  batch_rows_ = false;
  int32_t* d = tokens.as<int32_t>();
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(d, host_tokens, sz(n_) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                        as_stream(e_.stream)));
  d_tok_ = d;
  for (const PassSegment& g : segments) batch_[sz(g.seq)]->make_room(g.pos0, g.n, e_);
  dec_ = 0;
  while (dec_ < static_cast<int64_t>(segs_.size()) && segs_[sz(dec_)].n == 1) ++dec_;
  if (dec_ < 2) {
    dec_ = 0;
    return;
  }
  std::vector<int32_t> pos(sz(dec_));  // pageable: staged by the copy call, so the next pass may reuse it at once
  for (int64_t i = 0; i < dec_; ++i) pos[sz(i)] = static_cast<int32_t>(segs_[sz(i)].pos0);
  if (dec_pos.bytes() == 0) dec_pos = cuda::DeviceBuffer(sz(chunk) * sizeof(int32_t));
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(dec_pos.data(), pos.data(), sz(dec_) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                        as_stream(e_.stream)));
  make_branches();
}

void GpuSession::Impl::make_room(int64_t pos0, int64_t n, const cuda::Exec& e) {
  if (slide_cap == 0) return;
  check(pos0 >= slide_base, ErrorCode::kOutOfRange, kOp, "the bounded sliding layers hold positions from ",
        slide_base, " (older ones were dropped); got a step at position ", pos0);
  const int64_t stored = pos0 - slide_base;
  if (stored + n <= slide_cap) return;
  const int64_t W = m.config.sliding_window, align = nn::window_align(m.kv);
  int64_t d = std::max<int64_t>(0, stored - (W - 1));
  d -= d % align;
  const int64_t kept = stored - d;
  check(kept + n <= slide_cap, ErrorCode::kInternal, kOp, "a pass of ", n, " rows does not fit the sliding layers' ",
        slide_cap, " rows after keeping ", kept);
  const int64_t Hkv = m.config.num_kv_heads, D = m.config.head_dim, gs = m.kv.group_size;
  const int64_t es = static_cast<int64_t>(dtype_size(m.kv_store_dtype()));
  const cudaStream_t st = as_stream(e.stream);
  // Rows [drop, drop + keep) of each head's rows_per_head move to [0, keep), in pieces of at most `drop` rows so that
  // no copy overlaps itself (the pieces run in stream order, front first).
  auto shift = [&](void* base, int64_t row_bytes, int64_t rows_per_head, int64_t drop, int64_t keep) {
    if (base == nullptr || drop <= 0 || keep <= 0) return;
    auto* p = static_cast<uint8_t*>(base);
    const size_t pitch = sz(rows_per_head * row_bytes);
    for (int64_t done = 0; done < keep; done += drop) {
      const int64_t len = std::min(drop, keep - done);
      CIDER_CUDA_CHECK(kOp, cudaMemcpy2DAsync(p + done * row_bytes, pitch, p + (drop + done) * row_bytes, pitch,
                                              sz(len * row_bytes), sz(Hkv), cudaMemcpyDeviceToDevice, st));
    }
  };
  for (size_t l = 0; l < caches.size(); ++l) {
    const LayerCache& lc = caches[l];
    if (!lc.bounded) continue;
    if (!m.kv.quantized) {
      shift(lc.k, D * es, lc.cap, d, kept);
      shift(lc.v, D * es, lc.cap, d, kept);
      continue;
    }
    shift(lc.k, D * m.kv.k_bits / 32 * 4, lc.cap, d, kept);
    shift(lc.v, D * m.kv.v_bits / 32 * 4, lc.cap, d, kept);
    shift(lc.v_scales, D / gs * es, lc.cap, d, kept);
    shift(lc.v_biases, D / gs * es, lc.cap, d, kept);
    if (kchan()) {  // one [D] row per block of gs positions (d is a multiple of gs); the residual window stays
      const int64_t blocks = key_blocks(static_cast<int64_t>(l));
      shift(lc.k_scales, D * es, blocks, d / gs, (stored + gs - 1) / gs - d / gs);
      shift(lc.k_biases, D * es, blocks, d / gs, (stored + gs - 1) / gs - d / gs);
      if (m.kv.key_outliers > 0) {  // the outlier planes' rows per block likewise
        shift(lc.ocodes.data(), m.kv.key_outliers * gs / 2, blocks, d / gs, (stored + gs - 1) / gs - d / gs);
        shift(lc.oindex.data(), m.kv.key_outliers * 2, blocks, d / gs, (stored + gs - 1) / gs - d / gs);
      }
    } else {
      shift(lc.k_scales, D / gs * es, lc.cap, d, kept);
      shift(lc.k_biases, D / gs * es, lc.cap, d, kept);
    }
  }
  slide_base += d;
}

bool GpuSession::Impl::can_truncate(int64_t position) const {
  if (position <= 0) return true;  // a reset
  if (!linear_states_at(position)) return false;  // a recurrent state holds only its latest position
  if (slide_cap == 0 || slide_base == 0 || position >= kv_end) return true;
  return position - slide_base >= m.config.sliding_window - 1;
}

void GpuSession::Impl::begin_decode(void* s) {
  e_ = exec(s);
  n_ = 1;
  int32_t* d_step = step.as<int32_t>();
  d_tok_ = d_step;
  words_ = d_step + 1;
  bound_ = kv_bound(decode_position + 1, m.ctx);
  batch_rows_ = false;
  dec_ = 0;
  segs_.assign(1, PassSegment{0, 0, 1, decode_position});
}

void GpuSession::Impl::embed() {
  const ModelConfig& c = m.config;
  if (m.embed_ggml_type != 0) {
    cuda::ggml_embed_rows(m.embed.data(), m.embed_ggml_type, c.vocab_size, c.hidden_size, d_tok_, n_, c.embed_scale,
                          x.as<float>(), e_);
    return;
  }
  cuda::embed_rows(m.embed.data(), m.embed_dtype, c.vocab_size, c.hidden_size, d_tok_, n_, c.embed_scale,
                   x.as<float>(), e_);
}

void GpuSession::Impl::residual_norm(bool add, int64_t layer, NormSlot post, int64_t next_layer, NormSlot next) {
  if ((skip & GpuSession::kSkipSmall) != 0) return;
  const ModelConfig& c = m.config;
  cuda::residual_norm(x.as<float>(), add ? tmp.as<float>() : nullptr,
                      add && post != NormSlot::kNone ? norm(layer, post) : nullptr, norm(next_layer, next),
                      c.norm_weight_offset, n_, c.hidden_size, static_cast<float>(c.rms_norm_eps), h.as<float>(),
                      e_.stream);
}

void GpuSession::Impl::linear(int64_t layer, LinearSlot slot) {
  if ((skip & GpuSession::kSkipLinear) != 0) return;
  const GpuLayer& L = m.layers[sz(layer)];
  float* scr = scratch.bytes() ? scratch.as<float>() : nullptr;
  switch (slot) {
    case LinearSlot::kQKV: L.qkv.forward(h.as<float>(), n_, qkv.as<float>(), scr, e_); break;
    case LinearSlot::kO: L.o.forward(o_in_, n_, tmp.as<float>(), e_); break;
    case LinearSlot::kGateUp: L.gate_up.forward(h.as<float>(), n_, gu.as<float>(), scr, e_); break;
    case LinearSlot::kDown: L.down.forward(ffn.as<float>(), n_, tmp.as<float>(), e_); break;
  }
  if (slot == LinearSlot::kO || slot == LinearSlot::kDown) all_reduce_block();
}

void GpuSession::Impl::all_reduce_block() {
  if (m.comm) m.comm->all_reduce_sum(tmp.as<float>(), n_ * m.config.hidden_size, e_.stream);
}

cuda::HeadPrepArgs GpuSession::Impl::head_prep(int64_t layer, const PassSegment& g) const {
  const ModelConfig& c = m.config;
  const GpuLayer& L = m.layers[sz(layer)];
  const int rot = m.rotation();
  cuda::HeadPrepArgs p{};
  p.qkv = qkv.as<float>() + g.row0 * row_stride_qkv();
  p.gate_heads = c.attn_output_gate ? c.num_heads : 0;
  p.n = g.n;
  p.Hq = c.num_heads;
  p.Hkv = c.num_kv_heads;
  p.D = c.head_dim;
  const bool per_head = c.qk_norm && !c.qk_norm_full;  // whole-row norms ran before (prepare_heads)
  p.q_norm = per_head ? L.q_norm.as<float>() : nullptr;
  p.k_norm = per_head ? L.k_norm.as<float>() : nullptr;
  p.norm_offset = c.norm_weight_offset;
  p.eps = static_cast<float>(c.rms_norm_eps);
  p.rope_table = m.rope_for(c.layer_sliding[sz(layer)] != 0);
  p.rope_positions = m.ctx;
  p.pos0 = g.pos0;
  p.d_pos = words(g);
  p.rotation = rot;
  p.rotate_qk = !kchan();  // per-channel keys are stored unrotated: q and k stay as they are
  p.qL = rot ? L.rot_left.as<float>() : nullptr;
  p.qR = rot == 1 || rot == 2 ? L.rot_right.as<float>() : nullptr;
  p.q_out = q.as<float>() + g.row0 * c.num_heads * c.head_dim;
  p.q_head_major = g.n > 1;  // attention's [B, Hq, L, D] per sequence; for one token both layouts are the same
  return p;
}

void GpuSession::Impl::prepare_heads(int64_t layer) {
  if ((skip & GpuSession::kSkipSmall) != 0) return;
  const ModelConfig& c = m.config;
  if (c.qk_norm_full || c.clip_qkv > 0.0f) {  // OLMoE: whole-row q/k norms and clamps, before the heads' RoPE
    const GpuLayer& L = m.layers[sz(layer)];
    const int64_t D = c.head_dim, q_len = c.num_heads * D, kv_len = c.num_kv_heads * D;
    const int64_t k_col = (c.attn_output_gate ? 2 : 1) * q_len;
    const bool full = c.qk_norm && c.qk_norm_full;
    cuda::qkv_norm_clip_rows(qkv.as<float>(), n_, row_stride_qkv(), q_len, k_col, kv_len, kv_len,
                             full ? L.q_norm.as<float>() : nullptr, full ? L.k_norm.as<float>() : nullptr,
                             c.norm_weight_offset, static_cast<float>(c.rms_norm_eps), c.clip_qkv, e_.stream);
  }
  if (batch_rows_) {  // one launch: row i at sequence i's position (its first word; the words kBatchWords apart)
    cuda::HeadPrepArgs p = head_prep(layer, PassSegment{0, 0, n_, segs_[0].pos0});
    p.d_pos_stride = kBatchWords;
    p.q_head_major = false;  // one row per sequence: (n, Hq, D) is each sequence's [Hq, 1, D]
    cuda::prepare_heads(p, e_.stream);
    return;
  }
  size_t first = 0;
  if (dec_ > 1) {  // the leading one-row segments: one launch, row i at dec_pos[i]
    cuda::HeadPrepArgs p = head_prep(layer, PassSegment{0, 0, dec_, segs_[0].pos0});
    p.d_pos = dec_pos.as<int32_t>();
    p.d_pos_stride = 1;
    p.q_head_major = false;
    cuda::prepare_heads(p, e_.stream);
    first = sz(dec_);
  }
  for (size_t i = first; i < segs_.size(); ++i) cuda::prepare_heads(head_prep(layer, segs_[i]), e_.stream);
}

void GpuSession::Impl::append_segment(int64_t layer, const PassSegment& g, const cuda::Exec& e) {
  const ModelConfig& c = m.config;
  const int64_t stride = row_stride_qkv();
  // The k heads follow the q heads (and, with gated attention, the gates).
  const int64_t k_col = (c.attn_output_gate ? 2 : 1) * c.num_heads * c.head_dim;
  // A bounded sliding layer writes at position − slide_base (decode: step word 3).
  const int32_t* w = words(g);
  const int32_t* d_off = w == nullptr ? nullptr : caches[sz(layer)].bounded ? w + 2 : w;
  Impl& s = *batch_[sz(g.seq)];
  s.append_kv(layer, qkv.as<float>() + g.row0 * stride + k_col, stride, g.n, s.store_pos(layer, g.pos0), d_off, e,
              q.as<float>() + g.row0 * c.num_heads * c.head_dim);
}

void GpuSession::Impl::attend_segment(int64_t layer, const PassSegment& g, const cuda::Exec& e) {
  const int64_t HqD = m.config.num_heads * m.config.head_dim;
  const LayerCache& lc = caches[sz(layer)];
  // A bounded sliding layer holds positions [slide_base, end): its length is end − slide_base (decode: step word 4,
  // under the graph's bound capped at the storage).
  const int32_t* w = words(g);
  const int32_t* d_len = w == nullptr ? nullptr : lc.bounded ? w + 3 : w + 1;
  Impl& s = *batch_[sz(g.seq)];
  const int64_t length = w ? std::min(bound_, lc.cap) : s.store_pos(layer, g.pos0 + g.n);
  cuda::attention(s.attention_args(layer, q.as<float>() + g.row0 * HqD, ao.as<float>() + g.row0 * HqD, g.n, length),
                  d_len, e);
}

void GpuSession::Impl::kv_append(int64_t layer) {
  if ((skip & GpuSession::kSkipAppend) != 0 || batch_rows_) return;  // a decode batch appends in attention()'s branches
  for (size_t i = sz(dec_); i < segs_.size(); ++i) append_segment(layer, segs_[i], e_);  // (dec_ rows: likewise)
}

void GpuSession::Impl::attention(int64_t layer) {
  // A decode batch's sequences, or a pass's leading one-row segments: each one's append then attention on branch
  // stream (its index mod kBranches; make_branches), forked from the pass's stream and joined back; the pass's other
  // segments attend on its stream meanwhile.
  const size_t branched = batch_rows_ ? segs_.size() : sz(dec_);
  const cudaStream_t st = as_stream(e_.stream);
  const int branches = static_cast<int>(std::min<int64_t>(kBranches, static_cast<int64_t>(branched)));
  if (branches > 0) {
    CIDER_CUDA_CHECK(kOp, cudaEventRecord(branch_events[0], st));
    for (int p = 0; p < branches; ++p)
      CIDER_CUDA_CHECK(kOp, cudaStreamWaitEvent(as_stream(branch_streams[sz(p)]->handle()), branch_events[0], 0));
    for (size_t i = 0; i < branched; ++i) {
      const int p = static_cast<int>(i % sz(branches));
      cuda::Exec be;
      be.stream = branch_streams[sz(p)]->handle();
      be.workspace = static_cast<uint8_t*>(branch_ws.data()) + sz(p) * branch_ws_bytes;
      be.workspace_bytes = branch_ws_bytes;
      if ((skip & GpuSession::kSkipAppend) == 0) append_segment(layer, segs_[i], be);
      if ((skip & GpuSession::kSkipAttention) == 0) attend_segment(layer, segs_[i], be);
    }
  }
  if ((skip & GpuSession::kSkipAttention) == 0)
    for (size_t i = branched; i < segs_.size(); ++i) attend_segment(layer, segs_[i], e_);
  for (int p = 0; p < branches; ++p) {
    CIDER_CUDA_CHECK(kOp, cudaEventRecord(branch_events[sz(1 + p)], as_stream(branch_streams[sz(p)]->handle())));
    CIDER_CUDA_CHECK(kOp, cudaStreamWaitEvent(st, branch_events[sz(1 + p)], 0));
  }
}

void GpuSession::Impl::finish_heads(int64_t layer) {
  // Outputs back from the rotated value space, and (Hq, n, D) → (n, Hq, D) for a sequence of several rows; with
  // several sequences every segment is written to att (rotation 0 and one row: a copy).
  const int rot = m.rotation();
  bool needed = rot != 0 || (segs_.size() > 1 && !batch_rows_);
  for (const PassSegment& g : segs_) needed = needed || g.n > 1;
  o_in_ = ao.as<float>();
  if ((skip & GpuSession::kSkipSmall) != 0) return;
  const int64_t HqD = m.config.num_heads * m.config.head_dim;
  float* out = ao.as<float>();
  if (needed && batch_rows_) {  // one row per sequence: one launch over (n, Hq, D)
    const cuda::HeadPrepArgs p = head_prep(layer, segs_[0]);
    cuda::finish_heads(ao.as<float>(), false, n_, p.Hq, p.D, rot, p.qL, p.qR, att.as<float>(), e_.stream);
    out = att.as<float>();
  } else if (needed) {
    size_t first = 0;
    if (dec_ > 1) {  // the leading one-row segments: one launch over their (dec_, Hq, D)
      const cuda::HeadPrepArgs p = head_prep(layer, segs_[0]);
      cuda::finish_heads(ao.as<float>(), false, dec_, p.Hq, p.D, rot, p.qL, p.qR, att.as<float>(), e_.stream);
      first = sz(dec_);
    }
    for (size_t i = first; i < segs_.size(); ++i) {
      const PassSegment& g = segs_[i];
      const cuda::HeadPrepArgs p = head_prep(layer, g);
      cuda::finish_heads(ao.as<float>() + g.row0 * HqD, g.n > 1, g.n, p.Hq, p.D, rot, p.qL, p.qR,
                         att.as<float>() + g.row0 * HqD, e_.stream);
    }
    out = att.as<float>();
  }
  o_in_ = out;
  // Gated attention: the (rows, Hq·D) output times sigmoid of its gates (each qkv row's second Hq·D values), in place
  // (the buffer is the o projection's input only).
  if (m.config.attn_output_gate)
    cuda::sigmoid_gate_rows(out, n_, HqD, qkv.as<float>() + HqD, row_stride_qkv(), e_.stream);
}

void GpuSession::Impl::glu() {
  if ((skip & GpuSession::kSkipSmall) != 0) return;
  const ModelConfig& c = m.config;
  cuda::glu_rows(gu.as<float>(), n_, c.intermediate_size, c.activation == Activation::kSiLU ? 0 : 1, ffn.as<float>(),
                 e_.stream);
}

void GpuSession::Impl::moe(int64_t layer) {
  const ModelConfig& c = m.config;
  const GpuLayer& L = m.layers[sz(layer)];
  const int64_t n = n_, H = c.hidden_size, E = c.num_experts, K = c.experts_per_token;
  const int64_t Ie = c.expert_intermediate_size, Is = c.shared_expert_intermediate_size;
  const bool shared = Is > 0;
  const int64_t slots = n * K + (shared ? n : 0);  // the routed slots, then the shared expert's n rows
  const cudaStream_t st = as_stream(e_.stream);
  auto f32 = [](int64_t count) { return cuda::DeviceBuffer(sz(count) * sizeof(float)); };
  if (moe_in.bytes() == 0) {  // sized for a whole pass routed to one expert (or the shared expert, every row)
    const int64_t Im = std::max(Ie, Is);
    moe_in = f32(chunk * H);
    moe_gu = f32(chunk * 2 * Im);
    moe_ffn = f32(chunk * Im);
    moe_out = f32(chunk * H);
    moe_scratch = f32(chunk * Im);
    moe_idx = cuda::DeviceBuffer(sz(chunk * (K + 1)) * sizeof(int32_t));
    moe_wdev = f32(chunk * (K + 1));
  }
  // ---- decode rows: routed on the device (kernels/cuda/moe.h), no host round trip ----
  if (m.moe_on_device && n <= m.moe_device_rows) {
    const int64_t R = m.moe_device_rows, routed = n * K;
    if (moe_sel.bytes() == 0) {
      moe_sel = cuda::DeviceBuffer(sz(R * K) * sizeof(int32_t));
      moe_wk = f32(R * K);
      moe_wsh = f32(R);
      moe_y1 = f32(R * K * 2 * Ie);
      moe_y2 = f32(R * K * Ie);
      moe_y3 = f32(R * K * H);
    }
    cuda::moe_route(h.as<float>(), n, H, L.router_dev.as<float>(), E, K, c.norm_topk_prob,
                    shared ? L.shared_gate_dev.as<float>() : nullptr, moe_sel.as<int32_t>(), moe_wk.as<float>(),
                    shared ? moe_wsh.as<float>() : nullptr, e_.stream);
    const int act = c.activation == Activation::kSiLU ? 0 : 1;
    // slot s = (row s / K, its k-th expert in index order): gate|up of the row, GLU, down
    auto gemv = [&](const cuda::DeviceBuffer& table, const GpuLinear& like, int64_t N, int64_t Kin, const float* in,
                    int64_t x_div, float* out) {
      cuda::MoeGemvArgs a;
      a.table = static_cast<const cuda::MoeExpertWeights*>(table.data());
      a.kind = moe_kind(like);
      a.N = N;
      a.K = Kin;
      a.group_size = like.group_size;
      a.x = in;
      a.x_div = x_div;
      a.sel = moe_sel.as<int32_t>();
      a.slots = routed;
      a.out = out;
      cuda::moe_gemv(a, e_.stream);
    };
    gemv(L.moe_gu_table, L.experts[0].gate_up.fused, 2 * Ie, H, h.as<float>(), K, moe_y1.as<float>());
    cuda::glu_rows(moe_y1.as<float>(), routed, Ie, act, moe_y2.as<float>(), e_.stream);
    gemv(L.moe_down_table, L.experts[0].down, H, Ie, moe_y2.as<float>(), 1, moe_y3.as<float>());
    if (shared) {  // every row of h through the shared expert (its own layers), weighted in moe_combine
      const GpuExpert& ex = L.shared;
      ex.gate_up.forward(h.as<float>(), n, moe_gu.as<float>(), moe_scratch.as<float>(), e_);
      cuda::glu_rows(moe_gu.as<float>(), n, Is, act, moe_ffn.as<float>(), e_.stream);
      ex.down.forward(moe_ffn.as<float>(), n, moe_out.as<float>(), e_);
    }
    cuda::moe_combine(moe_y3.as<float>(), moe_wk.as<float>(), n, K, H, shared ? moe_out.as<float>() : nullptr,
                      shared ? moe_wsh.as<float>() : nullptr, tmp.as<float>(), e_.stream);
    all_reduce_block();
    return;
  }
  // ---- routing on the host ----
  moe_h.resize(sz(n * H));
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(moe_h.data(), h.data(), sz(n * H) * sizeof(float), cudaMemcpyDeviceToHost, st));
  CIDER_CUDA_CHECK(kOp, cudaStreamSynchronize(st));
  moe_logits.resize(sz(n * E));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t e = 0; e < E; ++e) {
      const float* a = moe_h.data() + r * H;
      const float* w = L.router.data() + e * H;
      float acc = 0.0f;
      for (int64_t i = 0; i < H; ++i) acc += a[i] * w[i];
      moe_logits[sz(r * E + e)] = acc;
    }
  moe_chosen.resize(sz(n * K));
  std::vector<float> weight(sz(n * K));
  route_experts(moe_logits.data(), n, E, K, c.norm_topk_prob, moe_chosen.data(), weight.data());
  // Slots grouped by expert (rows ascending within an expert): their rows and weights, uploaded once.
  std::vector<int64_t> count(sz(E) + 1, 0);
  for (int32_t e : moe_chosen) ++count[sz(e) + 1];
  for (int64_t e = 0; e < E; ++e) count[sz(e) + 1] += count[sz(e)];
  moe_rows.assign(sz(n * K), 0);
  moe_w.assign(sz(n * K), 0.0f);
  std::vector<int64_t> fill(count.begin(), count.end() - 1);
  for (int64_t i = 0; i < n * K; ++i) {
    const int64_t at = fill[sz(moe_chosen[sz(i)])]++;
    moe_rows[sz(at)] = static_cast<int32_t>(i / K);
    moe_w[sz(at)] = weight[sz(i)];
  }
  if (shared) {  // every row r, weighted sigmoid(h_r·w_sg) (the CPU's float32 gate)
    moe_rows.resize(sz(slots));
    moe_w.resize(sz(slots));
    for (int64_t r = 0; r < n; ++r) {
      const float* a = moe_h.data() + r * H;
      float acc = 0.0f;
      for (int64_t i = 0; i < H; ++i) acc += a[i] * L.shared_gate[sz(i)];
      moe_rows[sz(n * K + r)] = static_cast<int32_t>(r);
      moe_w[sz(n * K + r)] = 1.0f / (1.0f + std::exp(-acc));
    }
  }
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(moe_idx.data(), moe_rows.data(), sz(slots) * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, st));
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(moe_wdev.data(), moe_w.data(), sz(slots) * sizeof(float),
                                        cudaMemcpyHostToDevice, st));
  // ---- the experts, in index order ----
  CIDER_CUDA_CHECK(kOp, cudaMemsetAsync(tmp.data(), 0, sz(n * H) * sizeof(float), st));
  const int act = c.activation == Activation::kSiLU ? 0 : 1;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t rows = count[sz(e) + 1] - count[sz(e)];
    if (rows == 0) continue;
    const int32_t* idx = moe_idx.as<int32_t>() + count[sz(e)];
    const GpuExpert& ex = L.experts[sz(e)];
    cuda::gather_rows(h.as<float>(), idx, rows, H, moe_in.as<float>(), e_.stream);
    ex.gate_up.forward(moe_in.as<float>(), rows, moe_gu.as<float>(), moe_scratch.as<float>(), e_);
    cuda::glu_rows(moe_gu.as<float>(), rows, Ie, act, moe_ffn.as<float>(), e_.stream);
    ex.down.forward(moe_ffn.as<float>(), rows, moe_out.as<float>(), e_);
    cuda::scatter_add_rows(moe_out.as<float>(), idx, moe_wdev.as<float>() + count[sz(e)], rows, H, tmp.as<float>(),
                           e_.stream);
  }
  // ---- the shared expert, after the routed ones (the CPU's order of the adds): every row of h ----
  if (shared) {
    const GpuExpert& ex = L.shared;
    ex.gate_up.forward(h.as<float>(), n, moe_gu.as<float>(), moe_scratch.as<float>(), e_);
    cuda::glu_rows(moe_gu.as<float>(), n, Is, act, moe_ffn.as<float>(), e_.stream);
    ex.down.forward(moe_ffn.as<float>(), n, moe_out.as<float>(), e_);
    cuda::scatter_add_rows(moe_out.as<float>(), moe_idx.as<int32_t>() + n * K, moe_wdev.as<float>() + n * K, n, H,
                           tmp.as<float>(), e_.stream);
  }
  all_reduce_block();
  // The host buffers above were read by the copies, which completed before the next synchronize at the latest; keep
  // them alive until then (members, reused by the next layer only after its own synchronize).
}

int64_t GpuSession::Impl::row_stride_qkv() const {
  const ModelConfig& c = m.config;
  return ((c.attn_output_gate ? 2 : 1) * c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
}

void GpuSession::Impl::linear_attention(int64_t layer) {
  const ModelConfig& c = m.config;
  const GpuLayer& L = m.layers[sz(layer)];
  const ModelConfig::LinearAttention& la = c.linear_attn;
  const int64_t n = n_, H = c.hidden_size, Hk = la.num_k_heads, Hv = la.num_v_heads, Dk = la.k_head_dim;
  const int64_t Dv = la.v_head_dim, KD = la.key_dim(), C = la.conv_dim(), V = la.value_dim(), W = C + V;
  // Every sequence's state must be where its rows start (host bookkeeping, checked before anything is enqueued).
  for (const PassSegment& g : segs_) {
    const LinearState& st = batch_[sz(g.seq)]->lin_states[sz(layer)];
    check(st.pos == g.pos0, ErrorCode::kInternal, kOp, "layer ", layer, "'s recurrent state is at position ", st.pos,
          ", the pass at ", g.pos0);
  }
  float* qkvz = la_qkvz.as<float>();  // (n, C + V): q | k | v (the conv's input), then z
  float* conv = la_conv.as<float>();  // (n, C): the conv's output; q and k normalised in place
  float* o = la_o.as<float>();        // (n, V)
  float* beta = la_beta.as<float>();  // (n, Hv)
  float* g_log = la_g.as<float>();    // (n, Hv): log decay
  if ((skip & GpuSession::kSkipLinear) == 0)
    L.lin_qkvz.forward(h.as<float>(), n, qkvz, scratch.bytes() ? scratch.as<float>() : nullptr, e_);
  const float* ba = L.lin_ba.as<float>();  // b's Hv rows, then a's
  cuda::gdn_gates(h.as<float>(), n, H, ba, ba + Hv * H, L.A_log.as<float>(), L.dt_bias.as<float>(), Hv, beta, g_log,
                  e_.stream);
  for (const PassSegment& g : segs_) {  // each sequence through its own conv window
    LinearState& st = batch_[sz(g.seq)]->lin_states[sz(layer)];
    cuda::causal_conv1d_silu(qkvz + g.row0 * W, W, g.n, C, L.conv_w.as<float>(), la.conv_kernel, st.conv.as<float>(),
                             conv + g.row0 * C, C, e_.stream);
  }
  const auto q_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dk)));  // nn::gated_delta_rule's
  cuda::l2norm_qk(conv, n, C, Hk, Dk, q_scale, e_.stream);
  for (const PassSegment& g : segs_) {  // each sequence's recurrence on its own state
    LinearState& st = batch_[sz(g.seq)]->lin_states[sz(layer)];
    const float* rows = conv + g.row0 * C;
    cuda::GatedDeltaArgs a;
    a.n = g.n;
    a.Hk = Hk;
    a.Hv = Hv;
    a.Dk = Dk;
    a.Dv = Dv;
    a.q = rows;
    a.k = rows + KD;
    a.v = rows + 2 * KD;
    a.row_stride = C;
    a.g = g_log + g.row0 * Hv;
    a.beta = beta + g.row0 * Hv;
    a.state = st.S.as<float>();
    a.out = o + g.row0 * V;
    a.v_tiled = c.linear_attn.v_tiled;
    cuda::gated_delta_rule(a, e_.stream);
    st.pos = g.pos0 + g.n;
  }
  cuda::gated_rms_norm(o, n, Hv, Dv, qkvz + C, W, L.lin_norm.as<float>(), static_cast<float>(c.rms_norm_eps),
                       e_.stream);
  if ((skip & GpuSession::kSkipLinear) == 0) L.lin_out.forward(o, n, tmp.as<float>(), e_);
}

bool GpuSession::Impl::linear_states_at(int64_t position) const {
  for (size_t l = 0; l < lin_states.size(); ++l)
    if (m.config.is_linear_layer(static_cast<int64_t>(l)) && lin_states[l].pos != position) return false;
  return true;
}

void GpuSession::Impl::reset_linear_states() {
  const cudaStream_t st = as_stream(stream.handle());  // after whatever of this session's work is still queued
  for (LinearState& ls : lin_states) {
    if (ls.S.bytes() > 0) CIDER_CUDA_CHECK(kOp, cudaMemsetAsync(ls.S.data(), 0, ls.S.bytes(), st));
    if (ls.conv.bytes() > 0) CIDER_CUDA_CHECK(kOp, cudaMemsetAsync(ls.conv.data(), 0, ls.conv.bytes(), st));
    ls.pos = 0;
  }
}

void GpuSession::Impl::logits(int64_t first, int64_t rows, float* dst) {
  const int64_t V = m.head_rows();
  const cudaStream_t st = as_stream(e_.stream);
  if (rows == 1) {  // the last row: kept in logits_last (candidates() reads it there)
    enqueue_head(first, 1, logits_last.as<float>(), e_);
    if (dst != nullptr)
      CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(dst, logits_last.data(), sz(V) * sizeof(float), cudaMemcpyDeviceToHost, st));
    return;
  }
  check(dst != nullptr, ErrorCode::kInternal, kOp, "logits of several rows go to the host");
  if (logits_all.bytes() < sz(rows) * sz(V) * sizeof(float)) {  // grown as asked (a decode batch's rows, a chunk's)
    logits_all = cuda::DeviceBuffer();
    logits_all = cuda::DeviceBuffer(sz(std::min(chunk, (rows + 63) / 64 * 64)) * sz(V) * sizeof(float));
  }
  enqueue_head(first, rows, logits_all.as<float>(), e_);
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(dst, logits_all.data(), sz(rows) * sz(V) * sizeof(float),
                                        cudaMemcpyDeviceToHost, st));
}

void GpuSession::Impl::gather_rows(std::span<const int64_t> rows) {
  const int64_t H = m.config.hidden_size;
  float* hp = h.as<float>();
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] != static_cast<int64_t>(i))
      CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(hp + static_cast<int64_t>(i) * H, hp + rows[i] * H, sz(H) * sizeof(float),
                                            cudaMemcpyDeviceToDevice, as_stream(e_.stream)));
}

void GpuSession::Impl::enqueue_head(int64_t first, int64_t rows, float* out, const cuda::Exec& e) {
  const ModelConfig& c = m.config;
  if ((skip & GpuSession::kSkipLinear) == 0) m.lm_head.forward(h.as<float>() + first * c.hidden_size, rows, out, e);
  if (c.final_logit_softcap > 0.0f) cuda::softcap(out, rows * m.head_rows(), c.final_logit_softcap, e);
}

void GpuSession::Impl::enqueue_decode(void* s) {
  const ModelConfig& c = m.config;
  check(decode_position >= 0 && decode_position < m.ctx, ErrorCode::kOutOfRange, kOp,
        "the decode position must be in [0, ctx = ", m.ctx, "); got ", decode_position);
  const cudaStream_t st = as_stream(s);
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(step.as<int32_t>(), step_host, kStepWords * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, st));
  begin_decode(s);
  embed();
  run_layers(c, *this);
  enqueue_head(0, 1, logits_last.as<float>(), e_);
  if (copy_logits)
    CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(logits_host, logits_last.data(), sz(m.head_rows()) * sizeof(float),
                                          cudaMemcpyDeviceToHost, st));
}

void GpuSession::Impl::decode(int32_t token, int64_t position, float* logits, bool use_graphs) {
  if (pending) stream.synchronize();  // the previous step's graph may not have read step_host yet
  pending = false;
  make_room(position, 1, exec(stream.handle()));  // on the stream, before the step reads the cache
  step_host[0] = token;
  step_host[1] = static_cast<int32_t>(position);
  step_host[2] = static_cast<int32_t>(position + 1);
  step_host[3] = static_cast<int32_t>(position - slide_base);
  step_host[4] = static_cast<int32_t>(position - slide_base + 1);
  decode_position = position;
  copy_logits = logits != nullptr;
  void* s = stream.handle();
  const cudaStream_t st = as_stream(s);
  if (!use_graphs) {
    enqueue_decode(s);
  } else {
    const int64_t bound = kv_bound(position + 1, m.ctx);
    const int64_t key = 2 * bound + (copy_logits ? 0 : 1);
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      // First step of this bucket: run it once directly, so that launchers which set up state on first use (cuBLASLt
      // plans, kernel attributes) do it outside the capture. The graph then recomputes the same step: it writes the
      // same KV rows at this position and the same logits.
      enqueue_decode(s);
      cudaGraph_t graph = capture_graph(st, [&] { enqueue_decode(s); });
      cudaGraphExec_t ge = nullptr;
      const cudaError_t err = cudaGraphInstantiate(&ge, graph, 0);
      cudaGraphDestroy(graph);
      CIDER_CUDA_CHECK(kOp, err);
      it = graphs.emplace(key, ge).first;
    }
    CIDER_CUDA_CHECK(kOp, cudaGraphLaunch(it->second, st));
  }
  if (logits == nullptr) {  // the row stays on the device (candidates() reads it on the same stream and waits)
    pending = true;
    return;
  }
  stream.synchronize();
  std::memcpy(logits, logits_host, sz(m.head_rows()) * sizeof(float));
}

void GpuSession::Impl::drop_batch_graphs() {
  for (BatchGraph& g : batch_graphs) cudaGraphExecDestroy(g.exec);
  batch_graphs.clear();
}

void GpuSession::Impl::make_branches() {
  if (!branch_streams.empty()) return;
  // One row's attention workspace at the longest KV length of any layer (a call's split count only grows with it).
  size_t ws = 256;
  for (int64_t l = 0; l < m.config.num_layers; ++l)
    if (!m.config.is_linear_layer(l))
      ws = std::max(ws, cuda::attention_workspace_bytes(
                            attention_args(l, q.as<float>(), ao.as<float>(), 1, caches[sz(l)].cap)));
  branch_ws_bytes = (ws + 255) / 256 * 256;
  branch_ws = cuda::DeviceBuffer(sz(kBranches) * branch_ws_bytes);
  for (int p = 0; p < kBranches; ++p) branch_streams.push_back(std::make_unique<cuda::Stream>());
  for (int p = 0; p < 1 + kBranches; ++p) {
    cudaEvent_t ev = nullptr;
    CIDER_CUDA_CHECK(kOp, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    branch_events.push_back(ev);
  }
}

void GpuSession::Impl::enqueue_decode_batch(std::span<const int64_t> positions, int64_t bound) {
  const auto B = static_cast<int64_t>(positions.size());
  const int64_t V = m.head_rows();
  const cudaStream_t st = as_stream(stream.handle());
  int32_t* d = bstep.as<int32_t>();
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(d, bstep_host, sz(B + B * kBatchWords) * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, st));
  e_ = exec(stream.handle());
  n_ = B;
  d_tok_ = d;
  segs_.clear();
  for (int64_t i = 0; i < B; ++i) segs_.push_back(PassSegment{i, i, 1, positions[sz(i)]});
  words_ = d + B;
  bound_ = bound;
  batch_rows_ = B > 1;
  dec_ = 0;
  embed();
  run_layers(m.config, *this);
  enqueue_head(0, B, blogits.as<float>(), e_);
  if (batch_copy_)
    CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(blogits_host, blogits.data(), sz(B * V) * sizeof(float),
                                          cudaMemcpyDeviceToHost, st));
  batch_rows_ = false;
}

void GpuSession::Impl::decode_batch(std::span<Impl* const> seqs, std::span<const SequenceStep> steps,
                                    bool use_graphs) {
  const auto B = static_cast<int64_t>(seqs.size());
  const int64_t V = m.head_rows();
  const cudaStream_t st = as_stream(stream.handle());
  if (B > batch_cap) {  // the graphs hold the old buffers' addresses
    drop_batch_graphs();
    if (bstep_host) cudaFreeHost(bstep_host);
    if (blogits_host) cudaFreeHost(blogits_host);
    bstep_host = nullptr;
    blogits_host = nullptr;
    batch_cap = std::min(chunk, std::max<int64_t>({B, 2 * batch_cap, 8}));
    bstep = cuda::DeviceBuffer(sz(batch_cap * (1 + kBatchWords)) * sizeof(int32_t));
    blogits = cuda::DeviceBuffer(sz(batch_cap * V) * sizeof(float));
    CIDER_CUDA_CHECK(kOp, cudaHostAlloc(reinterpret_cast<void**>(&bstep_host),
                                        sz(batch_cap * (1 + kBatchWords)) * sizeof(int32_t), cudaHostAllocDefault));
    CIDER_CUDA_CHECK(kOp, cudaHostAlloc(reinterpret_cast<void**>(&blogits_host), sz(batch_cap * V) * sizeof(float),
                                        cudaHostAllocDefault));
  }
  // Each sequence's inputs: its token, then its words (make_room first: it moves the sliding base on the stream).
  // The rows go to the host unless every step keeps them on the device (batch_candidates).
  batch_copy_ = steps[0].logits != nullptr;
  std::vector<int64_t> positions(sz(B)), key{B, 0, batch_copy_ ? 1 : 0};
  int32_t* words = bstep_host + B;
  for (int64_t i = 0; i < B; ++i) {
    Impl& s = *seqs[sz(i)];
    const int64_t pos = steps[sz(i)].start;
    s.make_room(pos, 1, exec(stream.handle()));
    bstep_host[i] = steps[sz(i)].tokens[0];
    int32_t* w = words + i * kBatchWords;
    w[0] = static_cast<int32_t>(pos);
    w[1] = static_cast<int32_t>(pos + 1);
    w[2] = static_cast<int32_t>(pos - s.slide_base);
    w[3] = static_cast<int32_t>(pos - s.slide_base + 1);
    s.decode_position = pos;
    positions[sz(i)] = pos;
    key.push_back(s.id);
    key[1] = std::max(key[1], kv_bound(pos + 1, m.ctx));
  }
  batch_.assign(seqs.begin(), seqs.end());
  make_branches();
  if (!use_graphs) {
    enqueue_decode_batch(positions, key[1]);
  } else {
    auto it = std::find_if(batch_graphs.begin(), batch_graphs.end(), [&](const BatchGraph& g) { return g.key == key; });
    // A graph of this lead's with the same size, KV bound and copy, only other sessions (a request finished and
    // another took its place): the same kernels with other cache pointers, so the step is captured at once and that
    // graph, the most recently used such, updated in place (no direct run first, no instantiation).
    auto same = batch_graphs.end();
    for (auto g = batch_graphs.begin(); g != batch_graphs.end() && it == batch_graphs.end(); ++g)
      if (std::equal(key.begin(), key.begin() + 3, g->key.begin(), g->key.begin() + 3) &&
          (same == batch_graphs.end() || g->used > same->used))
        same = g;
    if (same != batch_graphs.end()) {
      cudaGraph_t graph = capture_graph(st, [&] { enqueue_decode_batch(positions, key[1]); });
      cudaGraphExecUpdateResultInfo info{};
      const bool updated = cudaGraphExecUpdate(same->exec, graph, &info) == cudaSuccess;
      cudaGraphDestroy(graph);
      if (updated) {
        same->key = key;
        it = same;
        ++batch_updates;
        ++batch_captures;
      } else {  // another topology after all: a failed update leaves no sticky error; the steps below as for a new key
        (void)cudaGetLastError();
      }
    }
    if (it == batch_graphs.end() && key != last_batch_key) {
      // First seen: directly (which also sets up the launchers' state outside any capture, as decode()'s first run).
      enqueue_decode_batch(positions, key[1]);
      last_batch_key = key;
    } else if (it == batch_graphs.end()) {
      last_batch_key.clear();
      cudaGraph_t graph = capture_graph(st, [&] { enqueue_decode_batch(positions, key[1]); });
      cudaGraphExec_t ge = nullptr;
      if (batch_graphs.size() >= kBatchGraphs) {  // the least recently used one: updated in place, else replaced
        auto lru = std::min_element(batch_graphs.begin(), batch_graphs.end(),
                                    [](const BatchGraph& a, const BatchGraph& b) { return a.used < b.used; });
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(lru->exec, graph, &info) == cudaSuccess) {
          ge = lru->exec;
        } else {
          (void)cudaGetLastError();  // a failed update leaves no sticky error
          cudaGraphExecDestroy(lru->exec);
        }
        batch_graphs.erase(lru);
      }
      cudaError_t err = cudaSuccess;
      if (ge == nullptr) err = cudaGraphInstantiate(&ge, graph, 0);
      cudaGraphDestroy(graph);
      CIDER_CUDA_CHECK(kOp, err);
      batch_graphs.push_back(BatchGraph{key, ge, 0});
      it = batch_graphs.end() - 1;
      ++batch_captures;
    }
    if (it != batch_graphs.end()) {
      it->used = ++batch_clock;
      CIDER_CUDA_CHECK(kOp, cudaGraphLaunch(it->exec, st));
    }
  }
  stream.synchronize();
  if (!batch_copy_) return;
  // The rows to the callers' buffers (pageable), several at once: 0.5 MB a row for a 128k vocabulary.
  default_thread_pool().parallel_for(B, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) std::memcpy(steps[sz(i)].logits, blogits_host + i * V, sz(V) * sizeof(float));
  });
}

void GpuSession::Impl::candidates(const CandidateRequest& request, Candidates& out) {
  check(m.comm == nullptr, ErrorCode::kInternal, kOp, "a tensor-parallel rank holds a share of the logits: the "
        "sampler's candidates come from the host");
  const int64_t V = m.config.vocab_size, k = request.k, n_ex = static_cast<int64_t>(request.excluded.size());
  static_assert(kDeviceTopkMax == cuda::kTopkMaxK && kDeviceExcludedMax == cuda::kTopkMaxExcluded,
                "the sampler asks the device for what cuda::topk_logits can answer");
  check(k >= 1 && k <= cuda::kTopkMaxK && n_ex <= cuda::kTopkMaxExcluded, ErrorCode::kInvalidArgument, kOp,
        "candidates need 1 <= k <= ", cuda::kTopkMaxK, " and at most ", cuda::kTopkMaxExcluded,
        " excluded tokens; got k ", k, ", ", n_ex, " excluded");
  constexpr size_t kEx = static_cast<size_t>(cuda::kTopkMaxExcluded), kK = static_cast<size_t>(cuda::kTopkMaxK);
  constexpr size_t kWords = kEx + kK + kK + kEx + 1;
  if (topk_host == nullptr) {
    topk_ws = cuda::DeviceBuffer(std::max<size_t>(cuda::topk_workspace_bytes(V, cuda::kTopkMaxK), 256));
    topk_dev = cuda::DeviceBuffer(kWords * 4);
    CIDER_CUDA_CHECK(kOp, cudaHostAlloc(reinterpret_cast<void**>(&topk_host), kWords * 4, cudaHostAllocDefault));
  }
  int32_t* dev = topk_dev.as<int32_t>();
  int32_t* d_excluded = dev;
  int32_t* d_ids = dev + kEx;
  float* d_vals = reinterpret_cast<float*>(dev + kEx + kK);
  float* d_exvals = reinterpret_cast<float*>(dev + kEx + 2 * kK);
  int32_t* d_status = dev + 2 * kEx + 2 * kK;
  void* s = stream.handle();
  const cudaStream_t st = as_stream(s);
  if (n_ex > 0) {
    std::memcpy(topk_host, request.excluded.data(), sz(n_ex) * sizeof(int32_t));
    CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(d_excluded, topk_host, sz(n_ex) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                          st));
  }
  cuda::Exec e;
  e.stream = s;
  e.workspace = topk_ws.data();
  e.workspace_bytes = topk_ws.bytes();
  cuda::topk_logits(logits_last.as<float>(), V, d_excluded, n_ex, k, d_ids, d_vals, d_exvals, d_status, e);
  // ids, vals, excluded_vals and status are contiguous: one copy back.
  CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(topk_host + kEx, d_ids, (kK + kK + kEx + 1) * 4, cudaMemcpyDeviceToHost, st));
  stream.synchronize();
  const int32_t* h_ids = topk_host + kEx;
  const auto* h_vals = reinterpret_cast<const float*>(topk_host + kEx + kK);
  const auto* h_exvals = reinterpret_cast<const float*>(topk_host + kEx + 2 * kK);
  out.ids.assign(h_ids, h_ids + k);
  out.logits.assign(h_vals, h_vals + k);
  out.excluded_logits.assign(h_exvals, h_exvals + n_ex);
  out.bad_index = topk_host[2 * kEx + 2 * kK];
  pending = false;
}

void GpuSession::Impl::batch_candidates(std::span<const CandidateRequest> requests, std::span<Candidates> out) {
  const auto B = static_cast<int64_t>(requests.size());
  const int64_t V = m.config.vocab_size, HV = m.head_rows();
  check(m.comm == nullptr, ErrorCode::kInternal, kOp, "a tensor-parallel rank holds a share of the logits");
  constexpr int64_t kEx = cuda::kTopkMaxExcluded, kK = cuda::kTopkMaxK, W = kBatchCandWords;
  static_assert(kDeviceTopkMax == kK && kDeviceExcludedMax == kEx, "the sampler asks what topk_logits answers");
  for (int64_t i = 0; i < B; ++i) {
    const CandidateRequest& r = requests[sz(i)];
    const auto n_ex = static_cast<int64_t>(r.excluded.size());
    check(r.k >= 1 && r.k <= kK && n_ex <= kEx, ErrorCode::kInvalidArgument, kOp, "candidates need 1 <= k <= ", kK,
          " and at most ", kEx, " excluded tokens; got k ", r.k, ", ", n_ex, " excluded (row ", i, ")");
  }
  if (B > bcand_cap) {
    if (bcand_host) cudaFreeHost(bcand_host);
    bcand_host = nullptr;
    bcand_cap = std::max(B, batch_cap);
    bcand = cuda::DeviceBuffer(sz(bcand_cap * W) * 4);
    bstats = cuda::DeviceBuffer(sz(bcand_cap * 2) * 4);
    CIDER_CUDA_CHECK(kOp, cudaHostAlloc(reinterpret_cast<void**>(&bcand_host), sz(bcand_cap * W) * 4,
                                        cudaHostAllocDefault));
  }
  const size_t ws = cuda::topk_workspace_bytes(V, kK);
  if (bcand_ws.bytes() < ws) bcand_ws = cuda::DeviceBuffer(std::max<size_t>(ws, 256));
  const cudaStream_t st = as_stream(stream.handle());
  // The excluded lists in, one copy (each row's block starts with its list).
  int64_t last_ex = -1;
  for (int64_t i = 0; i < B; ++i) {
    const CandidateRequest& r = requests[sz(i)];
    if (!r.excluded.empty()) {
      std::memcpy(bcand_host + i * W, r.excluded.data(), r.excluded.size() * sizeof(int32_t));
      last_ex = i;
    }
  }
  int32_t* dev = bcand.as<int32_t>();
  if (last_ex >= 0)
    CIDER_CUDA_CHECK(kOp, cudaMemcpyAsync(dev, bcand_host, sz(last_ex * W + kEx) * 4, cudaMemcpyHostToDevice, st));
  cuda::Exec e;
  e.stream = stream.handle();
  e.workspace = bcand_ws.data();
  e.workspace_bytes = bcand_ws.bytes();
  const float* rows = blogits.as<float>();
  for (int64_t i = 0; i < B; ++i) {
    const CandidateRequest& r = requests[sz(i)];
    int32_t* b = dev + i * W;
    cuda::topk_logits(rows + i * HV, V, b, static_cast<int64_t>(r.excluded.size()), r.k, b + kEx,
                      reinterpret_cast<float*>(b + kEx + kK), reinterpret_cast<float*>(b + kEx + 2 * kK),
                      b + 2 * kEx + 2 * kK, e);
  }
  // The normalizers (rows B apart by head_rows; V = head_rows on one device), then into each row's last two words.
  cuda::log_normalizers(rows, B, V, bstats.as<float>(), e);
  CIDER_CUDA_CHECK(kOp, cudaMemcpy2DAsync(dev + 2 * kEx + 2 * kK + 1, sz(W) * 4, bstats.data(), 8, 8, sz(B),
                                          cudaMemcpyDeviceToDevice, st));
  // ids | vals | excluded_vals | status | max | log-sum of every row back in one copy.
  CIDER_CUDA_CHECK(kOp, cudaMemcpy2DAsync(bcand_host + kEx, sz(W) * 4, dev + kEx, sz(W) * 4, sz(W - kEx) * 4, sz(B),
                                          cudaMemcpyDeviceToHost, st));
  stream.synchronize();
  for (int64_t i = 0; i < B; ++i) {
    const CandidateRequest& r = requests[sz(i)];
    const int32_t* words = bcand_host + i * W;
    const int32_t* ids = words + kEx;
    const auto* vals = reinterpret_cast<const float*>(words + kEx + kK);
    const auto* exvals = reinterpret_cast<const float*>(words + kEx + 2 * kK);
    Candidates& c = out[sz(i)];
    c.ids.assign(ids, ids + r.k);
    c.logits.assign(vals, vals + r.k);
    c.excluded_logits.assign(exvals, exvals + r.excluded.size());
    c.bad_index = words[2 * kEx + 2 * kK];
    c.row_max = reinterpret_cast<const float*>(words)[2 * kEx + 2 * kK + 1];
    c.row_log_sum = reinterpret_cast<const float*>(words)[2 * kEx + 2 * kK + 2];
  }
}

// ---- GpuSession ---------------------------------------------------------------------------------------------------

namespace {

// MoE layers routed on the host synchronise inside the step, and linear-attention layers advance their states'
// positions on the host (a replayed graph would not; capturing a bucket's first step also runs it twice): no graph
// can hold either. MoE layers routed on the device (GpuModel::moe_on_device) can.
bool host_steps(const GpuModel& m) {
  return (!m.config.layer_moe.empty() && !m.moe_on_device) || m.config.has_linear_layers() ||
         (m.comm && !m.comm->graph_capturable());
}

// A step of one token for each of n sessions (of prefill chunk `chunk`) runs as one decode pass at device positions
// (GpuSession::Impl::decode_batch): its rows may stay on the device.
bool one_decode_pass(const GpuModel& m, int64_t n, int64_t chunk) {
  return n >= 1 && n <= chunk && !host_steps(m) && m.comm == nullptr;
}

}  // namespace

GpuSession::GpuSession(std::shared_ptr<const GpuModel> model) : model_(std::move(model)) {
  check(model_ != nullptr, ErrorCode::kInvalidArgument, kOp, "a session needs a model");
  impl_ = std::make_unique<Impl>(*model_);
}

GpuSession::~GpuSession() = default;

void GpuSession::forward(const int32_t* tokens, int64_t n, int64_t start, float* logits, bool all_logits) {
  check(n >= 1 && start >= 0 && start + n <= model_->ctx, ErrorCode::kOutOfRange, kOp,
        "positions must stay within the context length ", model_->ctx, "; got ", start, " + ", n, " tokens");
  check(logits != nullptr || !all_logits, ErrorCode::kInvalidArgument, kOp, "all_logits needs a logits buffer");
  if (n == 1) {
    impl_->decode(tokens[0], start, logits, use_graphs && !host_steps(*model_));
  } else {
    const SequenceStep step{tokens, n, start, logits, all_logits};
    run_forward(model_->config, *impl_, std::span<const SequenceStep>(&step, 1));
  }
  impl_->kv_end = start + n;
}

bool GpuSession::can_truncate(int64_t position) const { return impl_->can_truncate(position); }

void GpuSession::copy_prefix_from(const GpuSession& src, int64_t position) {
  check(src.model_ == model_, ErrorCode::kInvalidArgument, "session_copy", "a copy needs a session of the same model");
  check(src.impl_->can_truncate(position), ErrorCode::kOutOfRange, "session_copy", "cannot copy a prefix of ",
        position, " positions: the source cannot go back to it (GpuSession::can_truncate)");
  Impl& d = *impl_;
  const Impl& s = *src.impl_;
  s.stream.synchronize();  // what the source still has queued writes the bytes copied here
  const cudaStream_t st = as_stream(d.stream.handle());
  auto copy = [&](cuda::DeviceBuffer& to, const cuda::DeviceBuffer& from) {
    check(to.bytes() == from.bytes(), ErrorCode::kInternal, "session_copy", "buffers of one model's sessions differ: ",
          to.bytes(), " and ", from.bytes(), " bytes");
    if (from.bytes() > 0)
      CIDER_CUDA_CHECK("session_copy", cudaMemcpyAsync(to.data(), from.data(), from.bytes(), cudaMemcpyDeviceToDevice, st));
  };
  // Whole buffers (their layouts differ by cache kind; positions past the prefix are overwritten or refilled later).
  for (size_t l = 0; l < s.caches.size(); ++l) {
    LayerCache& to = d.caches[l];
    const LayerCache& from = s.caches[l];
    copy(to.data, from.data);
    copy(to.scales, from.scales);
    copy(to.biases, from.biases);
    copy(to.residual, from.residual);
    copy(to.ocodes, from.ocodes);
    copy(to.oindex, from.oindex);
    copy(to.qstats, from.qstats);
  }
  for (size_t l = 0; l < s.lin_states.size(); ++l) {
    copy(d.lin_states[l].S, s.lin_states[l].S);
    copy(d.lin_states[l].conv, s.lin_states[l].conv);
    d.lin_states[l].pos = s.lin_states[l].pos;
  }
  d.slide_base = s.slide_base;
  d.kv_end = s.kv_end;
  truncate(position);  // per-channel keys: a block cut inside comes back into the copy's window
}

namespace {

// Layer cache lc's device planes in the nn::KVCacheSnapshot order (what nn::kv_snapshot_planes sizes). The device
// takes neither symmetric values nor the exact recent block (refused at load), so their planes never appear here.
std::vector<void*> device_planes(const LayerCache& lc, const nn::KVCacheMeta& meta, const char* op) {
  check(!meta.v_symmetric && !meta.recent_exact, ErrorCode::kInternal, op,
        "a device cache with symmetric values or an exact recent block");
  if (!meta.quantized) return {lc.k, lc.v};
  std::vector<void*> p = {lc.k, lc.k_scales, lc.k_biases, lc.v, lc.v_scales, lc.v_biases};
  if (meta.key_layout == nn::KeyLayout::kChannel) {
    p.push_back(lc.residual.data());
    if (meta.key_outliers > 0) p.insert(p.end(), {lc.ocodes.data(), lc.oindex.data(), lc.qstats.data()});
  }
  return p;
}

}  // namespace

void GpuSession::snapshot(std::span<const nn::KVCacheMeta> metas, SessionState& out) const {
  constexpr const char* op = "session_snapshot";
  const Impl& im = *impl_;
  const ModelConfig& c = model_->config;
  check(static_cast<int64_t>(metas.size()) == c.num_layers, ErrorCode::kInternal, op, "one cache format per layer: ",
        c.num_layers, "; got ", metas.size());
  im.stream.synchronize();  // what is still queued writes the bytes copied here
  const cudaStream_t st = as_stream(im.stream.handle());
  out.caches.clear();
  out.linear.assign(sz(c.num_layers), LinearStateCopy{});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    nn::KVCacheMeta meta = metas[sz(l)];
    if (c.is_linear_layer(l)) {
      out.caches.emplace_back(meta, std::vector<Buffer>{});
      const LinearState& ls = im.lin_states[sz(l)];
      if (ls.pos > 0) {  // a fresh state is empty, as the CPU session's
        LinearStateCopy& to = out.linear[sz(l)];
        to.S.resize(ls.S.bytes() / sizeof(float));
        to.conv.resize(ls.conv.bytes() / sizeof(float));
        ls.S.download(to.S.data(), ls.S.bytes());
        ls.conv.download(to.conv.data(), ls.conv.bytes());
        to.pos = ls.pos;
      }
      continue;
    }
    if (im.kv_end == 0) {  // nothing appended yet: a cache without dims, as the CPU's
      meta.has_dims = false;
      meta.B = meta.H = meta.Dk = meta.Dv = 0;
      out.caches.emplace_back(meta, std::vector<Buffer>{});
      continue;
    }
    const LayerCache& lc = im.caches[sz(l)];
    meta.start = lc.bounded ? im.slide_base : 0;
    meta.length = im.kv_end - meta.start;
    const std::vector<nn::KVPlaneRows> want = nn::kv_snapshot_planes(meta, meta.length);
    const std::vector<nn::KVPlaneRows> held = nn::kv_snapshot_planes(meta, lc.cap);
    const std::vector<void*> dev = device_planes(lc, meta, op);
    check(dev.size() == want.size(), ErrorCode::kInternal, op, "layer ", l, ": ", dev.size(), " device planes for ",
          want.size(), " snapshot planes");
    std::vector<Buffer> planes;
    for (size_t p = 0; p < want.size(); ++p) {
      const size_t row = sz(want[p].row_bytes), width = sz(want[p].rows) * row;
      Buffer b(sz(meta.H) * width);
      if (width > 0)
        CIDER_CUDA_CHECK(op, cudaMemcpy2DAsync(b.data(), width, dev[p], sz(held[p].rows) * row, width, sz(meta.H),
                                               cudaMemcpyDeviceToHost, st));
      planes.push_back(std::move(b));
    }
    CIDER_CUDA_CHECK(op, cudaStreamSynchronize(st));
    out.caches.emplace_back(meta, std::move(planes));
  }
}

void GpuSession::restore(std::span<const nn::KVCacheMeta> metas, const SessionState& state) {
  constexpr const char* op = "session_restore";
  Impl& im = *impl_;
  const ModelConfig& c = model_->config;
  check(static_cast<int64_t>(metas.size()) == c.num_layers && state.caches.size() == metas.size() &&
            state.linear.size() == metas.size(),
        ErrorCode::kInternal, op, "one cache and one linear state per layer (", c.num_layers, ")");
  // What only this device requires, checked before anything is written.
  int64_t base = -1;  // the bounded sliding layers' common start
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const nn::KVCacheMeta& m = state.caches[sz(l)].meta();
    if (c.is_linear_layer(l) || !m.has_dims) continue;
    const LayerCache& lc = im.caches[sz(l)];
    check(m.length <= lc.cap, ErrorCode::kUnsupported, op, "layer ", l, " holds ", m.length, " positions; this ",
          "device's cache for it stores ", lc.cap);
    if (lc.bounded) {
      check(base < 0 || m.start == base, ErrorCode::kUnsupported, op, "the bounded sliding layers must start at one ",
            "position on this device; layer ", l, " starts at ", m.start, ", an earlier one at ", base);
      base = m.start;
    } else {
      check(m.start == 0, ErrorCode::kUnsupported, op, "layer ", l, " keeps every position on this device: its cache ",
            "must start at 0; got ", m.start);
    }
  }
  const cudaStream_t st = as_stream(im.stream.handle());
  im.reset_linear_states();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.is_linear_layer(l)) {
      const LinearStateCopy& from = state.linear[sz(l)];
      LinearState& to = im.lin_states[sz(l)];
      if (!from.S.empty()) {  // Model::restore_session checked the sizes
        CIDER_CUDA_CHECK(op, cudaMemcpyAsync(to.S.data(), from.S.data(), to.S.bytes(), cudaMemcpyHostToDevice, st));
        CIDER_CUDA_CHECK(op, cudaMemcpyAsync(to.conv.data(), from.conv.data(), to.conv.bytes(), cudaMemcpyHostToDevice,
                                             st));
        to.pos = from.pos;
      }
      continue;
    }
    const nn::KVCacheSnapshot& snap = state.caches[sz(l)];
    const nn::KVCacheMeta& m = snap.meta();
    if (!m.has_dims) continue;
    const LayerCache& lc = im.caches[sz(l)];
    const std::vector<nn::KVPlaneRows> want = nn::kv_snapshot_planes(m, m.length);
    const std::vector<nn::KVPlaneRows> held = nn::kv_snapshot_planes(metas[sz(l)], lc.cap);
    const std::vector<void*> dev = device_planes(lc, m, op);
    check(dev.size() == want.size() && snap.num_planes() == want.size(), ErrorCode::kInternal, op, "layer ", l,
          ": planes differ (device ", dev.size(), ", snapshot ", snap.num_planes(), ")");
    for (size_t p = 0; p < want.size(); ++p) {
      const size_t row = sz(want[p].row_bytes), width = sz(want[p].rows) * row;
      if (width > 0)
        CIDER_CUDA_CHECK(op, cudaMemcpy2DAsync(dev[p], sz(held[p].rows) * row, snap.plane(p).data(), width, width,
                                               sz(m.H), cudaMemcpyHostToDevice, st));
    }
  }
  CIDER_CUDA_CHECK(op, cudaStreamSynchronize(st));
  im.slide_base = std::max<int64_t>(base, 0);
  im.kv_end = state.position;
}

void GpuSession::truncate(int64_t position) {
  Impl& im = *impl_;
  check(im.can_truncate(position), ErrorCode::kOutOfRange, "session_truncate", "cannot go back to position ",
        position, ": the bounded sliding layers dropped positions before ", im.slide_base,
        ", and a linear-attention (recurrent) state holds only its latest position (a session can go back to 0)");
  if (position <= 0) {
    position = 0;
    im.slide_base = 0;  // start over
    im.reset_linear_states();
  }
  const int64_t gs = model_->kv.group_size;
  // Per-channel keys: a position inside a block that was quantized brings that block's kept rows back into the
  // residual window (the CPU cache's trim); inside the window itself nothing moves. Bounded sliding layers count in
  // storage rows (slide_base is a multiple of gs).
  if (im.kchan() && position < im.kv_end && position % gs != 0 && position / gs < im.kv_end / gs) {
    const cuda::Exec e = im.exec(im.stream.handle());
    for (int64_t l = 0; l < model_->config.num_layers; ++l)
      if (!model_->config.is_linear_layer(l)) cuda::kv_channel_refill(im.channel_keys_args(l), im.store_pos(l, position), e);
  }
  im.kv_end = std::min(im.kv_end, position);
}

void GpuSession::candidates(const CandidateRequest& request, Candidates& out) { impl_->candidates(request, out); }

void GpuSession::forward_batch(std::span<GpuSession* const> sessions, std::span<const SequenceStep> steps) {
  check(!sessions.empty() && sessions.size() == steps.size(), ErrorCode::kInvalidArgument, kOp,
        "a batch needs one step per session; got ", sessions.size(), " sessions and ", steps.size(), " steps");
  Impl& lead = *sessions[0]->impl_;
  for (size_t i = 0; i < sessions.size(); ++i) {
    const SequenceStep& st = steps[i];
    check(sessions[i]->model_ == sessions[0]->model_, ErrorCode::kInvalidArgument, kOp,
          "the sessions of a batch must share one model; session ", i, " does not");
    check(st.n >= 1 && st.start >= 0 && st.start + st.n <= sessions[0]->model_->ctx, ErrorCode::kInvalidArgument,
          kOp, "batch step ", i, " must have n >= 1 tokens within the context ", sessions[0]->model_->ctx,
          "; got start ", st.start, ", n ", st.n);
    check(st.logits != nullptr || (st.n == 1 && !st.all_logits && steps[0].logits == nullptr),
          ErrorCode::kInvalidArgument, kOp, "batch step ", i, " needs a logits buffer (only a decode batch may keep "
          "every row on the device)");
    check(st.logits == nullptr || steps[0].logits != nullptr, ErrorCode::kInvalidArgument, kOp,
          "a decode batch keeps every row on the device or none; step ", i, " has a logits buffer and step 0 none");
    sessions[i]->impl_->stream.synchronize();  // nothing of a session's own stream may still be running
    sessions[i]->impl_->pending = false;
  }
  lead.batch_.clear();
  for (GpuSession* s : sessions) lead.batch_.push_back(s->impl_.get());
  // One token per sequence (a decode batch): one pass at device positions, replayed from a graph when the batch
  // repeats (decode_batch). Tensor-parallel ranks and models that step on the host run the general pass.
  const GpuModel& m = *sessions[0]->model_;
  bool one_row_each = one_decode_pass(m, static_cast<int64_t>(sessions.size()), lead.chunk);
  for (const SequenceStep& st : steps) one_row_each = one_row_each && st.n == 1;
  check(one_row_each || steps[0].logits != nullptr, ErrorCode::kUnsupported, kOp, "rows kept on the device need a "
        "decode batch that runs as one pass (at most ", lead.chunk, " sessions; no MoE routed on the host, linear "
        "attention or tensor parallelism)");
  try {
    if (one_row_each) {
      const std::vector<Impl*> seqs = lead.batch_;
      lead.skip = sessions[0]->bench_skip;
      lead.decode_batch(seqs, steps, sessions[0]->use_graphs);
      lead.skip = 0;
    } else {
      run_forward(m.config, lead, steps);
    }
  } catch (...) {
    lead.batch_.assign(1, &lead);
    lead.skip = 0;
    // What was enqueued may still touch the other sessions' caches and states: let it finish before their
    // truncate (Model's undo) enqueues on their own streams.
    try {
      lead.stream.synchronize();
    } catch (...) {  // the stream's own error: the one being thrown says enough
    }
    throw;
  }
  lead.batch_.assign(1, &lead);
  lead.words_ = nullptr;
  for (size_t i = 0; i < sessions.size(); ++i) sessions[i]->impl_->kv_end = steps[i].start + steps[i].n;
}

void GpuSession::batch_candidates(std::span<GpuSession* const> sessions, std::span<const CandidateRequest> requests,
                                  std::span<Candidates> out) {
  check(!sessions.empty() && sessions.size() == requests.size() && sessions.size() == out.size(),
        ErrorCode::kInvalidArgument, kOp, "batch candidates need one request and one output per session; got ",
        sessions.size(), " sessions, ", requests.size(), " requests, ", out.size(), " outputs");
  Impl& lead = *sessions[0]->impl_;
  check(static_cast<int64_t>(sessions.size()) <= lead.batch_cap && !lead.batch_copy_, ErrorCode::kInvalidArgument,
        kOp, "batch candidates answer the latest decode batch of these sessions that kept its rows on the device");
  lead.batch_candidates(requests, out);
}

size_t GpuSession::kv_bytes() const {  // the caches and the linear-attention states: the session's memory
  size_t b = 0;
  for (const LayerCache& lc : impl_->caches)
    b += lc.data.bytes() + lc.scales.bytes() + lc.biases.bytes() + lc.residual.bytes() + lc.ocodes.bytes() +
         lc.oindex.bytes() + lc.qstats.bytes();
  for (const LinearState& ls : impl_->lin_states) b += ls.S.bytes() + ls.conv.bytes();
  return b;
}

int64_t GpuSession::prefill_chunk() const { return impl_->chunk; }

int64_t GpuSession::prefill_chunk_for(int64_t ctx) {
  return std::min<int64_t>(env_int("CIDER_PREFILL_CHUNK", static_cast<int>(kDefaultPrefillChunk), 1, 65536, kOp), ctx);
}

int64_t GpuSession::graphs_captured() const { return static_cast<int64_t>(impl_->graphs.size()); }

int64_t GpuSession::batch_graphs_captured() const { return impl_->batch_captures; }
int64_t GpuSession::batch_graphs_updated() const { return impl_->batch_updates; }

void GpuSession::fill_cache_random(int64_t length, uint64_t seed) {
  const ModelConfig& c = model_->config;
  check(length >= 0 && length <= model_->ctx, ErrorCode::kOutOfRange, kOp, "length must be in [0, ctx = ",
        model_->ctx, "]; got ", length);
  // Random (chunk, Hq + 2·Hkv, D) rows in the qkv activation buffer; their key/value heads appended chunk by chunk
  // (a Hadamard cache stores them as they are: random rows need no rotation to be valid cache bytes).
  void* s = impl_->stream.handle();
  const cuda::Exec e = impl_->exec(s);
  const int64_t row = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const int64_t chunk = impl_->chunk;
  cuda::fill_uniform(impl_->qkv.data(), DType::kF32, chunk * row, seed, -2.0f, 2.0f, s);
  // Bounded sliding layers hold the last window − 1 positions (from a multiple of the alignment), as after a run.
  impl_->slide_base = 0;
  if (impl_->slide_cap > 0) {
    const int64_t align = nn::window_align(model_->kv);
    impl_->slide_base = std::max<int64_t>(0, length - (c.sliding_window - 1)) / align * align;
  }
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (int64_t done = impl_->caches[sz(l)].bounded ? impl_->slide_base : 0; done < length && !c.is_linear_layer(l);
         done += chunk) {
      const int64_t n = std::min(chunk, length - done);
      impl_->append_kv(l, impl_->qkv.as<float>() + c.num_heads * c.head_dim, row, n, impl_->store_pos(l, done),
                       nullptr, e);
    }
  impl_->stream.synchronize();
  impl_->kv_end = length;
}

void GpuSession::set_decode_input(int32_t token, int64_t position) {
  check(position >= 0 && position < model_->ctx, ErrorCode::kOutOfRange, kOp, "position must be in [0, ctx = ",
        model_->ctx, "); got ", position);
  check(token >= 0 && token < model_->config.vocab_size, ErrorCode::kOutOfRange, kOp, "token must be in [0, ",
        model_->config.vocab_size, "); got ", token);
  check(impl_->slide_cap == 0 ||
            (position >= impl_->slide_base && position - impl_->slide_base < impl_->slide_cap),
        ErrorCode::kOutOfRange, kOp, "the bounded sliding layers hold positions from ", impl_->slide_base,
        " in ", impl_->slide_cap, " rows: a decode input at position ", position, " does not fit");
  impl_->step_host[0] = token;
  impl_->step_host[1] = static_cast<int32_t>(position);
  impl_->step_host[2] = static_cast<int32_t>(position + 1);
  impl_->step_host[3] = static_cast<int32_t>(position - impl_->slide_base);
  impl_->step_host[4] = static_cast<int32_t>(position - impl_->slide_base + 1);
  impl_->decode_position = position;
}

void GpuSession::enqueue_decode(void* s) {
  impl_->skip = bench_skip;
  impl_->copy_logits = true;
  try {
    impl_->enqueue_decode(s ? s : impl_->stream.handle());
  } catch (...) {
    impl_->skip = 0;
    throw;
  }
  impl_->skip = 0;  // forward() never skips
}

void* GpuSession::stream() const { return impl_->stream.handle(); }

void GpuSession::synchronize() const { impl_->stream.synchronize(); }

// ---- the model's BackendModel / BackendSession (model/backend.h) -------------------------------------------------

namespace {

class CudaSession final : public BackendSession {
 public:
  CudaSession(std::shared_ptr<const GpuModel> m, std::shared_ptr<const std::vector<nn::KVCacheMeta>> formats)
      : model(m), metas(std::move(formats)), gpu(std::move(m)) {}
  size_t kv_bytes() const override { return gpu.kv_bytes(); }
  // Positions past the session's are simply overwritten later; per-channel keys may refill their window.
  void truncate(int64_t position) override { gpu.truncate(position); }
  bool can_truncate(int64_t position) const override { return gpu.can_truncate(position); }
  std::unique_ptr<BackendSession> copy_prefix(int64_t position) const override {
    auto c = std::make_unique<CudaSession>(model, metas);
    c->gpu.use_graphs = gpu.use_graphs;
    c->gpu.copy_prefix_from(gpu, position);
    return c;
  }
  bool snapshot(SessionState& out) const override {
    gpu.snapshot(*metas, out);
    return true;
  }
  void restore(const SessionState& state) override { gpu.restore(*metas, state); }
  std::shared_ptr<const GpuModel> model;
  std::shared_ptr<const std::vector<nn::KVCacheMeta>> metas;  // each layer's cache format (expected_cache_meta)
  GpuSession gpu;
};

class CudaModel final : public BackendModel {
 public:
  CudaModel(std::shared_ptr<const GpuModel> m, std::vector<nn::KVCacheMeta> metas)
      : m_(std::move(m)), metas_(std::make_shared<const std::vector<nn::KVCacheMeta>>(std::move(metas))) {}
  std::unique_ptr<BackendSession> new_session() const override { return std::make_unique<CudaSession>(m_, metas_); }
  void forward(std::span<BackendSession* const> sessions, std::span<const SequenceStep> steps) const override {
    if (sessions.size() == 1) {  // one sequence: decode steps through the graphs
      const SequenceStep& st = steps[0];
      static_cast<CudaSession*>(sessions[0])->gpu.forward(st.tokens, st.n, st.start, st.logits, st.all_logits);
      return;
    }
    std::vector<GpuSession*> gs;
    for (BackendSession* b : sessions) gs.push_back(&static_cast<CudaSession*>(b)->gpu);
    GpuSession::forward_batch(gs, steps);
  }
  bool candidates(BackendSession& s, const CandidateRequest& request, Candidates& out) const override {
    static_cast<CudaSession&>(s).gpu.candidates(request, out);
    return true;
  }
  bool samples_on_device() const override { return true; }
  // A decode batch that runs as one pass at device positions (GpuSession::forward_batch's one_row_each).
  bool samples_batches_on_device(int64_t n) const override {
    return one_decode_pass(*m_, n, GpuSession::prefill_chunk_for(m_->ctx));
  }
  void forward_candidates_batch(std::span<BackendSession* const> sessions, std::span<const SequenceStep> steps,
                                std::span<const CandidateRequest> requests, std::span<Candidates> out) const override {
    std::vector<GpuSession*> gs;
    for (BackendSession* b : sessions) gs.push_back(&static_cast<CudaSession*>(b)->gpu);
    GpuSession::forward_batch(gs, steps);  // rows kept on the device (every logits pointer null)
    GpuSession::batch_candidates(gs, requests, out);
  }
  bool can_copy_sessions() const override { return true; }  // device-to-device copies (GpuSession::copy_prefix_from)
  bool can_snapshot() const override { return true; }       // GpuSession::snapshot / restore, the CPU cache's planes
  int64_t pass_rows() const override { return GpuSession::prefill_chunk_for(m_->ctx); }

 private:
  std::shared_ptr<const GpuModel> m_;
  std::shared_ptr<const std::vector<nn::KVCacheMeta>> metas_;
};

}  // namespace

GpuSession* gpu_session(Session& s) {
  auto* cs = dynamic_cast<CudaSession*>(s.impl().backend.get());
  return cs ? &cs->gpu : nullptr;
}

}  // namespace cider::model::gpu

namespace cider::model {

void require_cuda_device(const char* op) { cuda::require_device(op); }

std::unique_ptr<BackendModel> make_cuda_backend(const Model::Impl& model) {
  const int tp = model.options.tp;
  if (tp <= 1) {
    std::vector<nn::KVCacheMeta> metas;
    for (int64_t l = 0; l < model.config.num_layers; ++l) metas.push_back(expected_cache_meta(model, l));
    return std::make_unique<gpu::CudaModel>(gpu::upload_model(model), std::move(metas));
  }
  // --tp N: ranks on devices 0 … N − 1 of this host, NCCL between them.
  int count = 0;
  CIDER_CUDA_CHECK("tensor_parallel", cudaGetDeviceCount(&count));
  check(tp <= count, ErrorCode::kUnsupported, "tensor_parallel", "--tp ", tp, " needs ", tp,
        " GPUs (one rank each); this host has ", count);
  std::vector<int> devices;
  for (int d = 0; d < tp; ++d) devices.push_back(d);
  return gpu::make_tp_backend(model, devices, gpu::nccl_collectives(devices));
}

}  // namespace cider::model
