// The CPU backend (model/backend.h): the ops over the active kernel table (kernels/kernel_table.h) and nn's caches and
// attention; weights used where the loader left them (model/transformer.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/kernel_table.h"
#include "model/activation_stats.h"
#include "model/backend.h"
#include "model/session_state.h"
#include "model/transformer.h"
#include "nn/attention.h"
#include "nn/gated_delta.h"
#include "nn/kv_cache.h"
#include "quant/ggml_blocks.h"

namespace cider::model {

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// cos/sin of position·inv_freq for the n positions [pos0, pos0 + n): (n, D/2) each, times the rope's attention factor
// (YaRN, LongRoPE; 1 otherwise). The angle is the float32 product, as HF computes it, so long positions round the same
// way; cos·factor and sin·factor are evaluated in double and rounded once.
void rope_tables(const std::vector<float>& inv_freq, double factor, int64_t pos0, int64_t n, float* cs, float* sn) {
  const auto half = static_cast<int64_t>(inv_freq.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < half; ++i) {
      if (inv_freq[sz(i)] == 0.0f) {  // a pair that does not rotate (partial rotary: model.h rotary_dim)
        cs[t * half + i] = 1.0f;
        sn[t * half + i] = 0.0f;
        continue;
      }
      const float angle = static_cast<float>(pos0 + t) * inv_freq[sz(i)];
      cs[t * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)) * factor);
      sn[t * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)) * factor);
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
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// PyTorch's softplus (beta 1, threshold 20): log(1 + eˣ), x itself above 20.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// A [1, H, n, D] view of rows stored (n, H, D): strides (n·H·D, D, H·D, 1).
TensorView heads_view(const float* data, int64_t n, int64_t H, int64_t D) {
  TensorView t(data, DType::kF32, {1, H, n, D});
  t.stride[0] = n * H * D;
  t.stride[1] = D;
  t.stride[2] = H * D;
  t.stride[3] = 1;
  return t;
}

// Activations of one pass, allocated on first use and grown only when a larger pass arrives.
struct Scratch {
  int64_t rows = 0;
  std::vector<float> x;          // (rows, hidden) residual stream
  std::vector<float> h;          // (rows, hidden) normed input of a block
  std::vector<float> q;          // (rows, Hq·D)
  std::vector<float> k, v;       // (rows, Hkv·D)
  std::vector<float> att;        // (rows, Hq·D) attention output
  std::vector<float> tmp;        // (rows, hidden) block output
  std::vector<float> gate, up;   // (rows, I)
  std::vector<float> cos_g, sin_g, cos_l, sin_l;  // (rows, D/2) rope tables of the pass (global, local)
  // Mixture-of-experts layers (grown on first use): router logits (rows, E); one expert's rows gathered (m, hidden),
  // its gate/up (m, Ie) and output (m, hidden).
  std::vector<float> router, moe_in, moe_gate, moe_up, moe_out;
  // Gated attention: q_proj's output (rows, 2·Hq·D), split into q and the gates (rows, Hq·D). Linear-attention layers:
  // q|k|v (rows, C) and its convolution, z and the output (rows, Hv·Dv), b/β and a/g (rows, Hv). Grown on first use.
  std::vector<float> qg, attn_gate, la_qkv, la_conv, la_z, la_o, la_b, la_a;

  void reserve(const ModelConfig& c, int64_t n_rows) {
    if (n_rows <= rows) return;
    auto grow = [&](std::vector<float>& b, int64_t width) { b.assign(sz(n_rows * width), 0.0f); };
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
};

// A linear-attention layer's state for one sequence (ModelConfig::LinearAttention): the recurrent state (Hv, Dk, Dv)
// and the conv window (K − 1, C) of the last raw q|k|v rows, after `pos` positions. Allocated on first use.
struct LinearState {
  std::vector<float> S, conv;
  int64_t pos = 0;
  void reset() {
    std::fill(S.begin(), S.end(), 0.0f);
    std::fill(conv.begin(), conv.end(), 0.0f);
    pos = 0;
  }
};

class CpuSession final : public BackendSession {
 public:
  CpuSession(const Model::Impl& m) : model(m) {
    // Linear-attention layers keep a state instead of a cache (their cache stays empty).
    for (int64_t l = 0; l < m.config.num_layers; ++l) caches.push_back(m.make_cache(l));
    linear.resize(static_cast<size_t>(m.config.num_layers));
    segs.resize(static_cast<size_t>(m.config.num_layers));
  }
  // The caches, their shared segments and the linear-attention states: what this session keeps alive.
  size_t kv_bytes() const override {
    size_t b = 0;
    for (const auto& c : caches) b += static_cast<size_t>(c->nbytes());
    for (const auto& layer : segs)
      for (const nn::KVSegment& g : layer) b += static_cast<size_t>(g.nbytes());
    for (const LinearState& st : linear) b += (st.S.size() + st.conv.size()) * sizeof(float);
    return b;
  }
  // Each segment once: every split makes its own snapshot (copies of a session share them, not its layers).
  void shared_kv(std::vector<SharedKvBlock>& out) const override {
    for (const auto& layer : segs)
      for (const nn::KVSegment& g : layer) out.push_back({g.id(), static_cast<size_t>(g.nbytes())});
  }
  // Sliding-window caches that dropped positions go back only while the new end's window is still stored; a
  // recurrent state only to where it is (it holds no earlier states); position 0 starts everything over. Layers with
  // shared segments go back anywhere (truncate cuts the segments or joins them).
  bool can_truncate(int64_t position) const override {
    if (position <= 0) return true;
    for (size_t l = 0; l < caches.size(); ++l)
      if (segs[l].empty() && caches[l]->end() > position && !caches[l]->can_trim(caches[l]->end() - position))
        return false;
    for (size_t l = 0; l < linear.size(); ++l)
      if (model.config.is_linear_layer(static_cast<int64_t>(l)) && linear[l].pos != position) return false;
    return true;
  }
  void truncate(int64_t position) override {
    if (position <= 0) {  // a cache that dropped or shared positions starts over; the others keep their storage
      for (size_t l = 0; l < caches.size(); ++l)
        if (caches[l]->start() > 0) caches[l] = model.make_cache(static_cast<int64_t>(l));
      for (auto& layer : segs) layer.clear();
      for (LinearState& st : linear) st.reset();
      position = 0;
    }
    check(can_truncate(position), ErrorCode::kOutOfRange, "session_truncate",
          "caches or recurrent states cannot go back to position ", position,
          " (sliding-window caches dropped positions; a linear-attention state holds only its latest position)");
    for (size_t l = 0; l < caches.size(); ++l) {
      if (position < caches[l]->start() && !segs[l].empty()) {
        back_into_segments(l, position);
        continue;
      }
      if (caches[l]->end() > position) caches[l]->trim(caches[l]->end() - position);
    }
  }
  // Joined: what the caches hold with their segments (nn::join_snapshot), as if never shared.
  bool snapshot(SessionState& out) const override {
    out.caches.clear();
    out.linear.clear();
    for (size_t l = 0; l < caches.size(); ++l)
      out.caches.push_back(segs[l].empty() ? caches[l]->snapshot() : nn::join_snapshot(segs[l], *caches[l]));
    for (const LinearState& st : linear) out.linear.push_back({st.S, st.conv, st.pos});
    return true;
  }
  // The first `position` positions (Model::copy_session checked can_truncate): the shared segments up to position
  // (the copy holds them too, not a copy of them), and each cache's kept rows after them copied once
  // (nn::KVCache::copy_prefix, a trim's semantics); the recurrent states as they are (they are at `position`).
  std::unique_ptr<BackendSession> copy_prefix(int64_t position) const override {
    auto c = std::make_unique<CpuSession>(model);
    position = std::max<int64_t>(position, 0);
    for (size_t l = 0; l < caches.size(); ++l) {
      const nn::KVCache& own = *caches[l];
      if (!segs[l].empty() && position >= own.start()) {
        c->segs[l] = segs[l];
        c->caches[l] = own.copy_prefix(std::min(position, own.end()));
      } else if (!segs[l].empty()) {  // within the segments: a cut of them, or their positions joined and copied
        c->segs[l] = segs[l];
        c->caches[l] = own.copy_prefix(own.start());
        c->back_into_segments(l, position);
      } else if (!own.empty() && (position > 0 || own.start() == 0)) {
        // as truncate(0), a cache that dropped positions starts over at 0
        c->caches[l] = own.copy_prefix(std::min(position, own.end()));
      }
    }
    c->linear = linear;
    if (position == 0)
      for (LinearState& st : c->linear) st.reset();
    return c;
  }
  // Every layer whose cache has no sliding window: its stored positions up to the last complete block (of
  // split_align) move into a new shared segment.
  void share() override {
    for (size_t l = 0; l < caches.size(); ++l) {
      nn::KVCache& c = *caches[l];
      if (c.empty() || c.window() != 0) continue;
      const int64_t n = c.offset() / c.split_align() * c.split_align(), begin = c.start();
      if (n > 0) segs[l].push_back({c.split_front(n), begin, n});
    }
  }
  // Model::restore_session checked the state against this model: attention layers' caches take its snapshots (a
  // layer's cache without dims stays fresh), linear-attention layers its states.
  void restore(const SessionState& state) override {
    for (size_t l = 0; l < caches.size(); ++l) {
      if (state.caches[l].meta().has_dims) {
        segs[l].clear();
        caches[l]->restore(state.caches[l]);
      }
      const LinearStateCopy& st = state.linear[l];
      linear[l].S = st.S;
      linear[l].conv = st.conv;
      linear[l].pos = st.pos;
    }
  }

  const Model::Impl& model;
  std::vector<std::unique_ptr<nn::KVCache>> caches;  // (layer)
  std::vector<std::vector<nn::KVSegment>> segs;      // (layer): shared positions [0, caches[l]->start())
  std::vector<LinearState> linear;                   // (layer): used by linear-attention layers
  Scratch scratch;                                    // used when this session leads a pass

 private:
  // Layer l back to `position` < its cache's start: the segments cut there and an empty cache at it where position
  // is a multiple of the blocks; else everything joined into one cache again, trimmed to it.
  void back_into_segments(size_t l, int64_t position) {
    nn::KVCache& own = *caches[l];
    if (position % own.split_align() == 0) {
      std::vector<nn::KVSegment> kept;
      for (const nn::KVSegment& g : segs[l])
        if (g.begin < position) kept.push_back(g.cut(std::min(g.length, position - g.begin)));
      caches[l] = own.empty_at(position);
      segs[l] = std::move(kept);
      return;
    }
    const nn::KVCacheSnapshot joined = nn::join_snapshot(segs[l], own);
    auto fresh = model.make_cache(static_cast<int64_t>(l));
    fresh->restore(joined);
    fresh->trim(fresh->end() - position);
    caches[l] = std::move(fresh);
    segs[l].clear();
  }
};

// A pass's rows of at most kMaxChunk: a prefill longer than that runs chunk by chunk.
constexpr int64_t kCpuPassRows = kMaxChunk;

class CpuBackend final : public PassBackend {
 public:
  CpuBackend(const Model::Impl& m, std::span<BackendSession* const> sessions, Scratch& scratch)
      : m_(m), c_(m.config), sessions_(sessions), s_(scratch) {}

  int64_t max_pass_rows() const override { return kCpuPassRows; }

  void begin_pass(std::span<const PassSegment> segments, const int32_t* tokens) override {
    segments_ = segments;
    tokens_ = tokens;
    rows_ = 0;
    for (const PassSegment& g : segments) rows_ += g.n;
    s_.reserve(c_, rows_);
    const int64_t half = c_.head_dim / 2;
    for (const PassSegment& g : segments) {
      rope_tables(m_.inv_freq, c_.rope.attention_factor, g.pos0, g.n, s_.cos_g.data() + g.row0 * half,
                  s_.sin_g.data() + g.row0 * half);
      rope_tables(m_.inv_freq_local, c_.rope_local.attention_factor, g.pos0, g.n, s_.cos_l.data() + g.row0 * half,
                  s_.sin_l.data() + g.row0 * half);
    }
  }

  void embed() override {
    const int64_t H = c_.hidden_size;
    float* x = s_.x.data();
    if (m_.w.embed_ggml_type != 0) {  // native GGUF blocks: decode the token's row, then scale
      const quant::GgmlBlockFormat& f = *quant::ggml_block_format(m_.w.embed_ggml_type);
      const int64_t rb = quant::ggml_row_bytes(f, H);
      for (int64_t t = 0; t < rows_; ++t) {
        const uint8_t* src = static_cast<const uint8_t*>(m_.w.embed) + tokens_[t] * rb;
        for (int64_t b = 0; b < H / f.block_size; ++b) f.decode(src + b * f.block_bytes, x + t * H + b * f.block_size);
        for (int64_t i = 0; i < H; ++i) x[t * H + i] *= c_.embed_scale;
      }
      return;
    }
    for (int64_t t = 0; t < rows_; ++t) {
      const int64_t row = tokens_[t];
      for (int64_t i = 0; i < H; ++i) x[t * H + i] = load_float(m_.w.embed, m_.w.embed_dtype, row * H + i) * c_.embed_scale;
    }
  }

  void residual_norm(bool add, int64_t layer, NormSlot post, int64_t next_layer, NormSlot next) override {
    const int64_t H = c_.hidden_size, n = rows_;
    float* x = s_.x.data();
    float* t = s_.tmp.data();
    if (add) {
      if (post != NormSlot::kNone) rms_norm(t, norm(layer, post), c_.norm_weight_offset, n, H, c_.rms_norm_eps, t);
      for (int64_t i = 0; i < n * H; ++i) x[i] += t[i];
    }
    rms_norm(x, norm(next_layer, next), c_.norm_weight_offset, n, H, c_.rms_norm_eps, s_.h.data());
    // The LM head's input is every row's final norm (the pass reads logits of only some of them)
    if (next == NormSlot::kFinal && m_.activation_stats != nullptr) m_.activation_stats->add("lm_head", s_.h.data(), n, H);
  }

  void linear(int64_t layer, LinearSlot slot) override {
    const LayerWeights& L = m_.w.layers[sz(layer)];
    const int64_t n = rows_;
    switch (slot) {
      case LinearSlot::kQKV:
        if (c_.attn_output_gate) {  // q_proj: the queries then the gates (loader.cpp row_gather)
          const int64_t QD = c_.num_heads * c_.head_dim;
          s_.qg.resize(sz(n * 2 * QD));
          s_.attn_gate.resize(sz(n * QD));
          run(L.q, s_.h.data(), n, s_.qg.data());
          for (int64_t r = 0; r < n; ++r) {
            std::copy_n(s_.qg.data() + r * 2 * QD, QD, s_.q.data() + r * QD);
            std::copy_n(s_.qg.data() + r * 2 * QD + QD, QD, s_.attn_gate.data() + r * QD);
          }
        } else {
          run(L.q, s_.h.data(), n, s_.q.data());
        }
        run(L.k, s_.h.data(), n, s_.k.data());
        run(L.v, s_.h.data(), n, s_.v.data());
        break;
      case LinearSlot::kO: run(L.o, s_.att.data(), n, s_.tmp.data()); break;
      case LinearSlot::kGateUp:
        run(L.gate, s_.h.data(), n, s_.gate.data());
        run(L.up, s_.h.data(), n, s_.up.data());
        break;
      case LinearSlot::kDown: run(L.down, s_.gate.data(), n, s_.tmp.data()); break;
    }
  }

  void prepare_heads(int64_t layer) override {
    const int64_t D = c_.head_dim, Hq = c_.num_heads, Hkv = c_.num_kv_heads, n = rows_;
    const LayerWeights& L = m_.w.layers[sz(layer)];
    if (c_.qk_norm && c_.qk_norm_full) {  // OLMoE: one norm over each row's whole q and k
      rms_norm(s_.q.data(), L.q_norm.w, c_.norm_weight_offset, n, Hq * D, c_.rms_norm_eps, s_.q.data());
      rms_norm(s_.k.data(), L.k_norm.w, c_.norm_weight_offset, n, Hkv * D, c_.rms_norm_eps, s_.k.data());
    } else if (c_.qk_norm) {
      rms_norm(s_.q.data(), L.q_norm.w, c_.norm_weight_offset, n * Hq, D, c_.rms_norm_eps, s_.q.data());
      rms_norm(s_.k.data(), L.k_norm.w, c_.norm_weight_offset, n * Hkv, D, c_.rms_norm_eps, s_.k.data());
    }
    if (c_.clip_qkv > 0.0f) {
      const float cl = c_.clip_qkv;
      for (std::vector<float>* b : {&s_.q, &s_.k, &s_.v}) {
        const int64_t count = n * (b == &s_.q ? Hq : Hkv) * D;
        for (int64_t i = 0; i < count; ++i) (*b)[sz(i)] = std::clamp((*b)[sz(i)], -cl, cl);
      }
    }
    const bool sliding = c_.layer_sliding[sz(layer)] != 0;
    const float* cs = sliding ? s_.cos_l.data() : s_.cos_g.data();
    const float* sn = sliding ? s_.sin_l.data() : s_.sin_g.data();
    apply_rope(s_.q.data(), n, Hq, D, cs, sn);
    apply_rope(s_.k.data(), n, Hkv, D, cs, sn);
    // The rotation is the caches' (nn::QuantizedKVCache rotates on append, nn::attention the queries).
  }

  void kv_append(int64_t layer) override {
    const int64_t D = c_.head_dim, Hkv = c_.num_kv_heads, Hq = c_.num_heads;
    for (const PassSegment& g : segments_) {
      // Outlier key channels are chosen by the queries of the block's positions: this pass's queries (after RoPE, the
      // keys' space), those of the positions appended next, are shown to the cache before the append.
      // (key_outliers > 0 is a quantized cache's option: KVSpec::validate.)
      if (m_.options.kv.key_outliers > 0)
        static_cast<nn::QuantizedKVCache&>(cache(g.seq, layer))
            .observe_queries(heads_view(s_.q.data() + g.row0 * Hq * D, g.n, Hq, D));
      cache(g.seq, layer).update_and_fetch(heads_view(s_.k.data() + g.row0 * Hkv * D, g.n, Hkv, D),
                                           heads_view(s_.v.data() + g.row0 * Hkv * D, g.n, Hkv, D));
    }
  }

  void attention(int64_t layer) override {
    const int64_t D = c_.head_dim, Hq = c_.num_heads;
    nn::AttentionMask mask;
    mask.kind = kernels::MaskKind::kCausal;
    mask.window = c_.layer_sliding[sz(layer)] != 0 ? c_.sliding_window : 0;
    for (const PassSegment& g : segments_)
      nn::attention(heads_view(s_.q.data() + g.row0 * Hq * D, g.n, Hq, D), cache(g.seq, layer), c_.attn_scale, mask,
                    heads_view(s_.att.data() + g.row0 * Hq * D, g.n, Hq, D), c_.attn_logit_softcap,
                    static_cast<CpuSession*>(sessions_[sz(g.seq)])->segs[sz(layer)]);
  }

  // nn::attention wrote (rows, Hq, D), rotated back; gated attention multiplies it by sigmoid(gate).
  void finish_heads(int64_t) override {
    if (!c_.attn_output_gate) return;
    const int64_t count = rows_ * c_.num_heads * c_.head_dim;
    for (int64_t i = 0; i < count; ++i) s_.att[sz(i)] *= sigmoid(s_.attn_gate[sz(i)]);
  }

  void linear_attention(int64_t layer) override {
    const LayerWeights& L = m_.w.layers[sz(layer)];
    const ModelConfig::LinearAttention& la = c_.linear_attn;
    const int64_t n = rows_, C = la.conv_dim(), V = la.value_dim(), Hv = la.num_v_heads, Dv = la.v_head_dim;
    const int64_t KD = la.key_dim(), K = la.conv_kernel;
    for (auto* b : {&s_.la_qkv, &s_.la_conv}) b->resize(sz(n * C));
    for (auto* b : {&s_.la_z, &s_.la_o}) b->resize(sz(n * V));
    for (auto* b : {&s_.la_b, &s_.la_a}) b->resize(sz(n * Hv));
    run(L.lin_qkv, s_.h.data(), n, s_.la_qkv.data());
    run(L.lin_z, s_.h.data(), n, s_.la_z.data());
    run(L.lin_b, s_.h.data(), n, s_.la_b.data());
    run(L.lin_a, s_.h.data(), n, s_.la_a.data());
    // β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias), in place.
    for (int64_t r = 0; r < n; ++r)
      for (int64_t h = 0; h < Hv; ++h) {
        float& b = s_.la_b[sz(r * Hv + h)];
        float& a = s_.la_a[sz(r * Hv + h)];
        b = sigmoid(b);
        a = -std::exp(L.A_log[h]) * softplus(a + L.dt_bias[h]);
      }
    for (const PassSegment& g : segments_) {
      LinearState& st = static_cast<CpuSession*>(sessions_[sz(g.seq)])->linear[sz(layer)];
      if (st.S.empty()) {
        st.S.assign(sz(Hv * la.k_head_dim * Dv), 0.0f);
        st.conv.assign(sz((K - 1) * C), 0.0f);
      }
      check(st.pos == g.pos0, ErrorCode::kInternal, "forward", "layer ", layer, "'s recurrent state is at position ",
            st.pos, ", the pass at ", g.pos0);
      float* conv = s_.la_conv.data() + g.row0 * C;
      nn::causal_conv1d_silu(s_.la_qkv.data() + g.row0 * C, C, g.n, C, L.conv_w, K, st.conv.data(), conv);
      nn::GatedDeltaArgs a;
      a.n = g.n;
      a.Hk = la.num_k_heads;
      a.Hv = Hv;
      a.Dk = la.k_head_dim;
      a.Dv = Dv;
      a.q = conv;
      a.k = conv + KD;
      a.v = conv + 2 * KD;
      a.row_stride = C;
      a.g = s_.la_a.data() + g.row0 * Hv;
      a.beta = s_.la_b.data() + g.row0 * Hv;
      a.state = st.S.data();
      a.out = s_.la_o.data() + g.row0 * V;
      a.v_tiled = la.v_tiled;
      nn::gated_delta_rule(a);
      st.pos = g.pos0 + g.n;
    }
    // RMSNorm of each value head's output times w (no offset), times silu(z); then out_proj.
    float* o = s_.la_o.data();
    rms_norm(o, L.lin_norm.w, 0.0f, n * Hv, Dv, c_.rms_norm_eps, o);
    for (int64_t i = 0; i < n * V; ++i) o[i] *= silu(s_.la_z[sz(i)]);
    run(L.lin_out, o, n, s_.tmp.data());
  }

  void glu() override { glu_rows(s_.gate.data(), s_.up.data(), rows_ * c_.intermediate_size); }

  void moe(int64_t layer) override {
    const LayerWeights& L = m_.w.layers[sz(layer)];
    const int64_t n = rows_, H = c_.hidden_size, E = c_.num_experts, K = c_.experts_per_token;
    const int64_t Ie = c_.expert_intermediate_size;
    // ---- router: logits (n, E) → softmax in float32 → top K per row (ties: the lower index) ----
    s_.router.resize(sz(n * E));
    run(L.router, s_.h.data(), n, s_.router.data());
    std::vector<int32_t> chosen(sz(n * K));
    std::vector<float> weight(sz(n * K));
    route_experts(s_.router.data(), n, E, K, c_.norm_topk_prob, chosen.data(), weight.data());
    std::vector<std::vector<int64_t>> rows_of(sz(E));  // (expert) → slots r·K + k routed to it, rows ascending
    for (int64_t i = 0; i < n * K; ++i) rows_of[sz(chosen[sz(i)])].push_back(i);
    // ---- experts in index order, each over the rows routed to it (a decode row: K small GEMVs; a prefill chunk:
    // one GEMM per expert over its gathered rows) ----
    float* t = s_.tmp.data();
    std::fill(t, t + n * H, 0.0f);
    for (int64_t e = 0; e < E; ++e) {
      const std::vector<int64_t>& slots = rows_of[sz(e)];
      if (slots.empty()) continue;
      const auto m = static_cast<int64_t>(slots.size());
      s_.moe_in.resize(sz(m * H));
      s_.moe_gate.resize(sz(m * Ie));
      s_.moe_up.resize(sz(m * Ie));
      s_.moe_out.resize(sz(m * H));
      for (int64_t i = 0; i < m; ++i)
        std::copy_n(s_.h.data() + (slots[sz(i)] / K) * H, H, s_.moe_in.data() + i * H);
      const LayerWeights::Expert& x = L.experts[sz(e)];
      run(x.gate, s_.moe_in.data(), m, s_.moe_gate.data());
      run(x.up, s_.moe_in.data(), m, s_.moe_up.data());
      glu_rows(s_.moe_gate.data(), s_.moe_up.data(), m * Ie);
      run(x.down, s_.moe_gate.data(), m, s_.moe_out.data());
      for (int64_t i = 0; i < m; ++i) {
        const float wgt = weight[sz(slots[sz(i)])];
        float* dst = t + (slots[sz(i)] / K) * H;
        const float* src = s_.moe_out.data() + i * H;
        for (int64_t d = 0; d < H; ++d) dst[d] += src[d] * wgt;
      }
    }
    // ---- the shared expert (Qwen3-Next): every row, times sigmoid(h·w_sg) ----
    if (c_.shared_expert_intermediate_size > 0) {
      const int64_t Is = c_.shared_expert_intermediate_size;
      s_.moe_gate.resize(sz(n * Is));
      s_.moe_up.resize(sz(n * Is));
      s_.moe_out.resize(sz(n * H));
      std::vector<float> sg(sz(n));
      run(L.shared_gate, s_.h.data(), n, sg.data());
      run(L.shared.gate, s_.h.data(), n, s_.moe_gate.data());
      run(L.shared.up, s_.h.data(), n, s_.moe_up.data());
      glu_rows(s_.moe_gate.data(), s_.moe_up.data(), n * Is);
      run(L.shared.down, s_.moe_gate.data(), n, s_.moe_out.data());
      for (int64_t r = 0; r < n; ++r) {
        const float gw = sigmoid(sg[sz(r)]);
        for (int64_t d = 0; d < H; ++d) t[r * H + d] += gw * s_.moe_out[sz(r * H + d)];
      }
    }
  }

  // y (n, L.N) = L(x (n, L.K)); with Model::record_activations on, x's rows first go into the statistics.
  void run(const Linear& L, const float* x, int64_t n, float* y) const {
    if (m_.activation_stats != nullptr) m_.activation_stats->add(L.name, x, n, L.K);
    L.forward(x, n, y);
  }

  // g[i] = act(g[i])·u[i] for i < count: the kernel table's glu (x86: vectorized x·σ(z) on float32 exp).
  void glu_rows(float* g, const float* u, int64_t count) const {
    const kernels::KernelTable& kt = kernels::active_kernels();
    const kernels::GluActivation act =
        c_.activation == Activation::kSiLU ? kernels::GluActivation::kSiLU : kernels::GluActivation::kGeluTanh;
    // Element-wise, so split over the pool when large (a prefill chunk: rows·I of 10⁶ and more); the same function per
    // element either way.
    if (count >= (int64_t{1} << 16)) {
      default_thread_pool().parallel_for(count, [&](int64_t b, int64_t e, int) { kt.glu({g + b, u + b, e - b, act}); });
    } else {
      kt.glu({g, u, count, act});
    }
  }

  void gather_rows(std::span<const int64_t> rows) override {
    const auto H = static_cast<size_t>(c_.hidden_size);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i] != static_cast<int64_t>(i))
        std::memcpy(s_.h.data() + i * H, s_.h.data() + static_cast<size_t>(rows[i]) * H, H * sizeof(float));
  }
  void logits(int64_t first, int64_t rows, float* dst) override {
    check(dst != nullptr, ErrorCode::kInternal, "forward", "the CPU backend writes logits to the host");
    m_.w.lm_head.forward(s_.h.data() + first * c_.hidden_size, rows, dst);
    if (c_.final_logit_softcap > 0.0f) {
      const float cap = c_.final_logit_softcap;
      for (int64_t i = 0; i < rows * c_.vocab_size; ++i) dst[i] = cap * std::tanh(dst[i] / cap);
    }
  }

  void end_forward() override {}

 private:
  const float* norm(int64_t layer, NormSlot slot) const {
    if (slot == NormSlot::kFinal) return m_.w.final_norm.w;
    const LayerWeights& L = m_.w.layers[sz(layer)];
    switch (slot) {
      case NormSlot::kAttn: return L.attn_norm.w;
      case NormSlot::kPostAttn: return L.post_attn_norm.w;
      case NormSlot::kMlp: return L.mlp_norm.w;
      case NormSlot::kPostMlp: return L.post_mlp_norm.w;
      default: fail(ErrorCode::kInternal, "forward", "no norm weight for slot ", static_cast<int>(slot));
    }
  }
  nn::KVCache& cache(int64_t seq, int64_t layer) const {
    return *static_cast<CpuSession*>(sessions_[sz(seq)])->caches[sz(layer)];
  }

  const Model::Impl& m_;
  const ModelConfig& c_;
  std::span<BackendSession* const> sessions_;
  Scratch& s_;
  std::span<const PassSegment> segments_;
  const int32_t* tokens_ = nullptr;
  int64_t rows_ = 0;
};

class CpuModel final : public BackendModel {
 public:
  explicit CpuModel(const Model::Impl& m) : m_(m) {}
  std::unique_ptr<BackendSession> new_session() const override { return std::make_unique<CpuSession>(m_); }
  bool can_snapshot() const override { return true; }
  bool can_copy_sessions() const override { return true; }
  bool can_share_sessions() const override { return true; }
  int64_t pass_rows() const override { return kCpuPassRows; }
  void forward(std::span<BackendSession* const> sessions, std::span<const SequenceStep> steps) const override {
    CpuBackend b(m_, sessions, static_cast<CpuSession*>(sessions[0])->scratch);
    run_forward(m_.config, b, steps);
  }

 private:
  const Model::Impl& m_;
};

}  // namespace

std::unique_ptr<BackendModel> make_cpu_backend(const Model::Impl& model) { return std::make_unique<CpuModel>(model); }

}  // namespace cider::model
