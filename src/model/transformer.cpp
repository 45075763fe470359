// The forward pass of every supported architecture (see transformer.h for the computation).
#include "model/transformer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/kernel_table.h"
#include "nn/attention.h"

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

namespace {

// cos/sin of position·inv_freq for the n positions [pos0, pos0 + n): (n, D/2) each. The angle is the float32
// product, as HF computes it, so long positions round the same way.
void rope_tables(const std::vector<float>& inv_freq, int64_t pos0, int64_t n, float* cs, float* sn) {
  const auto half = static_cast<int64_t>(inv_freq.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos0 + t) * inv_freq[static_cast<size_t>(i)];
      cs[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sn[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
}

// Rotates n rows of H heads of D values in place: (x1, x2) = (v[i], v[i + D/2]) → (x1·c − x2·s, x2·c + x1·s).
void apply_rope(float* v, int64_t n, int64_t H, int64_t D, const float* cs, const float* sn) {
  const int64_t half = D / 2;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < H; ++h) {
      float* row = v + (t * H + h) * D;
      const float* c = cs + t * half;
      const float* s = sn + t * half;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = row[i], x2 = row[i + half];
        row[i] = x1 * c[i] - x2 * s[i];
        row[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }
// GELU, tanh approximation (PyTorch's approximate="tanh").
float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

// A [1, H, n, D] view of rows stored (n, H, D): strides (n·H·D, D, H·D, 1).
TensorView heads_view(const float* data, int64_t n, int64_t H, int64_t D) {
  TensorView t(data, DType::kF32, {1, H, n, D});
  t.stride[0] = n * H * D;
  t.stride[1] = D;
  t.stride[2] = H * D;
  t.stride[3] = 1;
  return t;
}

}  // namespace

// ---- sessions ------------------------------------------------------------------------------------------------

void Session::Impl::reserve(int64_t n_rows) {
  if (n_rows <= rows) return;
  const ModelConfig& c = model->config;
  auto grow = [&](std::vector<float>& b, int64_t width) { b.assign(static_cast<size_t>(n_rows * width), 0.0f); };
  grow(x, c.hidden_size);
  grow(h, c.hidden_size);
  grow(q, c.num_heads * c.head_dim);
  grow(k, c.num_kv_heads * c.head_dim);
  grow(v, c.num_kv_heads * c.head_dim);
  grow(att, c.num_heads * c.head_dim);
  grow(tmp, c.hidden_size);
  grow(gate, c.intermediate_size);
  grow(up, c.intermediate_size);
  for (auto* b : {&cos_g, &sin_g, &cos_l, &sin_l}) grow(*b, c.head_dim / 2);
  rows = n_rows;
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
    qc.seed = seed;
    return std::make_unique<nn::QuantizedKVCache>(qc);
  }
  nn::PlainKVCacheConfig pc;
  pc.dtype = kv.plain_dtype;
  pc.rotation = nn::RotationKind::kNone;
  pc.seed = seed;
  return std::make_unique<nn::PlainKVCache>(pc);
}

void Model::Impl::forward(Session::Impl& s, const int32_t* tokens, int64_t n, float* logits, bool all_logits) const {
  const ModelConfig& c = config;
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads, I = c.intermediate_size;
  const int64_t V = c.vocab_size;
  const Weights& W = w;
  const int64_t start = s.position;

  for (int64_t done = 0; done < n; done += kMaxChunk) {
    const int64_t m = std::min(kMaxChunk, n - done);
    const int32_t* tok = tokens + done;
    const int64_t pos0 = start + done;
    s.reserve(m);
    float* x = s.x.data();

    // Embedding lookup (kept float), times Gemma's √hidden.
    for (int64_t t = 0; t < m; ++t) {
      const int64_t row = tok[t];
      for (int64_t i = 0; i < H; ++i)
        x[t * H + i] = load_float(W.embed, W.embed_dtype, row * H + i) * c.embed_scale;
    }
    rope_tables(inv_freq, pos0, m, s.cos_g.data(), s.sin_g.data());
    rope_tables(inv_freq_local, pos0, m, s.cos_l.data(), s.sin_l.data());

    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& L = W.layers[static_cast<size_t>(l)];
      const bool sliding = c.layer_sliding[static_cast<size_t>(l)] != 0;
      nn::KVCache& cache = *s.caches[static_cast<size_t>(l)];

      // ---- attention block ----
      rms_norm(x, L.attn_norm.w, c.norm_weight_offset, m, H, c.rms_norm_eps, s.h.data());
      L.q.forward(s.h.data(), m, s.q.data());
      L.k.forward(s.h.data(), m, s.k.data());
      L.v.forward(s.h.data(), m, s.v.data());
      if (c.qk_norm) {
        rms_norm(s.q.data(), L.q_norm.w, c.norm_weight_offset, m * Hq, D, c.rms_norm_eps, s.q.data());
        rms_norm(s.k.data(), L.k_norm.w, c.norm_weight_offset, m * Hkv, D, c.rms_norm_eps, s.k.data());
      }
      const float* cs = sliding ? s.cos_l.data() : s.cos_g.data();
      const float* sn = sliding ? s.sin_l.data() : s.sin_g.data();
      apply_rope(s.q.data(), m, Hq, D, cs, sn);
      apply_rope(s.k.data(), m, Hkv, D, cs, sn);
      cache.update_and_fetch(heads_view(s.k.data(), m, Hkv, D), heads_view(s.v.data(), m, Hkv, D));
      nn::AttentionMask mask;
      mask.kind = kernels::MaskKind::kCausal;
      mask.window = sliding ? c.sliding_window : 0;
      nn::attention(heads_view(s.q.data(), m, Hq, D), cache, c.attn_scale, mask, heads_view(s.att.data(), m, Hq, D));
      L.o.forward(s.att.data(), m, s.tmp.data());
      if (c.sandwich_norms)
        rms_norm(s.tmp.data(), L.post_attn_norm.w, c.norm_weight_offset, m, H, c.rms_norm_eps, s.tmp.data());
      for (int64_t i = 0; i < m * H; ++i) x[i] += s.tmp[static_cast<size_t>(i)];

      // ---- MLP block ----
      rms_norm(x, L.mlp_norm.w, c.norm_weight_offset, m, H, c.rms_norm_eps, s.h.data());
      L.gate.forward(s.h.data(), m, s.gate.data());
      L.up.forward(s.h.data(), m, s.up.data());
      float* g = s.gate.data();
      const float* u = s.up.data();
      // Element-wise, so split over the pool when large (a prefill chunk: m·I of 10⁶ and more; the scalar tanh/exp
      // on one thread was ≈ 31% of a 2-thread prefill, docs/benchmarks.md); the same function per element either way.
      const bool silu_act = c.activation == Activation::kSiLU;
      auto glu_range = [&](int64_t b, int64_t e) {
        if (silu_act) {
          for (int64_t i = b; i < e; ++i) g[i] = silu(g[i]) * u[i];
        } else {
          for (int64_t i = b; i < e; ++i) g[i] = gelu_tanh(g[i]) * u[i];
        }
      };
      if (m * I >= (int64_t{1} << 16)) {
        default_thread_pool().parallel_for(m * I, [&](int64_t b, int64_t e, int) { glu_range(b, e); });
      } else {
        glu_range(0, m * I);
      }
      L.down.forward(g, m, s.tmp.data());
      if (c.sandwich_norms)
        rms_norm(s.tmp.data(), L.post_mlp_norm.w, c.norm_weight_offset, m, H, c.rms_norm_eps, s.tmp.data());
      for (int64_t i = 0; i < m * H; ++i) x[i] += s.tmp[static_cast<size_t>(i)];
    }

    // ---- head: every row of the chunk, or only the last row of the last chunk ----
    const bool last_chunk = done + m == n;
    if (!all_logits && !last_chunk) continue;
    const int64_t first_row = all_logits ? 0 : m - 1;
    const int64_t n_rows = m - first_row;
    rms_norm(x + first_row * H, W.final_norm.w, c.norm_weight_offset, n_rows, H, c.rms_norm_eps, s.h.data());
    float* out = all_logits ? logits + done * V : logits;
    W.lm_head.forward(s.h.data(), n_rows, out);
    if (c.final_logit_softcap > 0.0f) {
      const float cap = c.final_logit_softcap;
      for (int64_t i = 0; i < n_rows * V; ++i) out[i] = cap * std::tanh(out[i] / cap);
    }
  }
  s.position = start + n;
}

}  // namespace cider::model
