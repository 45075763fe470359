// cider/model/transformer.h — the engine's internals: weights of a decoder-only transformer in cider's formats, the
// per-session state (KV caches + scratch), and the forward pass shared by every supported architecture.
//
// One computation covers Llama, Mistral, Qwen2, Qwen3 and Gemma 3; ModelConfig's flags select the differences
// (q/k/v biases, q/k norms, Gemma's sandwich norms and (1 + w) RMSNorm, GeGLU, embedding scale, sliding layers).
// Per layer, for the n tokens of a chunk (x: (n, hidden), the residual stream):
//   h = rmsnorm(x, attn_norm)
//   q = h·Wqᵀ (+bq) (n, Hq·D);  k = h·Wkᵀ (+bk), v = h·Wvᵀ (+bv) (n, Hkv·D)
//   q, k = rmsnorm per head (qk_norm);  q, k = rope(q, k)            (HF rotate_half: pairs (i, i + D/2))
//   cache.append(k, v);  a = attention(q, cache, causal [+ window])    (GQA, nn::attention)
//   a = a·Woᵀ (+bo);  a = rmsnorm(a, post_attn_norm) (Gemma);  x += a
//   h = rmsnorm(x, mlp_norm);  m = down(act(gate(h)) ⊙ up(h));  m = rmsnorm(m, post_mlp_norm) (Gemma);  x += m
// then logits = rmsnorm(x, final_norm)·W_headᵀ (Gemma: cap·tanh(logits/cap) when a final softcap is set).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/model.h"
#include "nn/kv_cache.h"
#include "nn/linear_weights.h"

namespace cider::model {

class BackendModel;    // model/backend.h: the weights on a device and the forward there
class BackendSession;  // model/backend.h: a session's KV caches on that device

// A loaded linear layer: its weights' descriptor (nn/linear_weights.h) and its module path. The data pointers point
// either into a memory-mapped checkpoint (used in place) or into tensors owned by the Weights that hold this layer.
struct Linear : nn::LinearWeights {
  using Kind = nn::WeightKind;
  std::string name;  // module path, HF naming ("model.layers.0.self_attn.q_proj")
};

// An RMSNorm weight, float32.
struct NormWeight {
  std::string name;
  const float* w = nullptr;  // (dim)
  int64_t dim = 0;
};

struct LayerWeights {
  NormWeight attn_norm;        // (hidden)  input_layernorm
  Linear q, k, v, o;           // q (Hq·D, hidden), k and v (Hkv·D, hidden), o (hidden, Hq·D)
  NormWeight q_norm, k_norm;   // (D) qk_norm only
  NormWeight post_attn_norm;   // (hidden)  Gemma 3 only: post_attention_layernorm, on the attention output
  NormWeight mlp_norm;         // (hidden)  Llama's post_attention_layernorm / Gemma's pre_feedforward_layernorm
  NormWeight post_mlp_norm;    // (hidden)  Gemma 3 only: post_feedforward_layernorm
  Linear gate, up, down;       // gate and up (I, hidden), down (hidden, I)
  // Mixture-of-experts layers (ModelConfig::is_moe_layer) instead of gate/up/down: the router (num_experts, hidden),
  // held float32, and each expert's gate and up (Ie, hidden), down (hidden, Ie), Ie = expert_intermediate_size.
  Linear router;
  struct Expert {
    Linear gate, up, down;
  };
  std::vector<Expert> experts;
  // A shared expert (ModelConfig::shared_expert_intermediate_size > 0): gate/up (Is, hidden), down (hidden, Is), and
  // its gate (1, hidden), float32.
  Expert shared;
  Linear shared_gate;
  // Gated DeltaNet layers (ModelConfig::is_linear_layer), instead of q/k/v/o; Hk, Hv heads of Dk, Dv
  // (ModelConfig::LinearAttention):
  Linear lin_qkv;             // (2·Hk·Dk + Hv·Dv, hidden): q | k | v, each head-major
  Linear lin_z;               // (Hv·Dv, hidden): the output gate
  Linear lin_b, lin_a;        // (Hv, hidden) each, float32: β = sigmoid(h·b), decay g = −exp(A_log)·softplus(h·a + dt_bias)
  Linear lin_out;             // (hidden, Hv·Dv)
  const float* conv_w = nullptr;  // (2·Hk·Dk + Hv·Dv, conv_kernel) depthwise causal kernel, float32
  const float* A_log = nullptr;   // (Hv)
  const float* dt_bias = nullptr; // (Hv)
  NormWeight lin_norm;            // (Dv): RMSNorm of each value head's output, times w (no offset), then · silu(z)
};

struct Weights {
  std::string embed_name;
  const void* embed = nullptr;  // (vocab, hidden) in embed_dtype (f32, f16 or bf16), kept float; or, with
                                // embed_ggml_type (--weights native), vocab rows of that GGUF block format
  DType embed_dtype = DType::kF32;
  uint32_t embed_ggml_type = 0;  // 0: a float embedding
  std::vector<LayerWeights> layers;  // (layer)
  NormWeight final_norm;             // (hidden)
  Linear lm_head;                    // (vocab, hidden); with tied embeddings: the embedding itself (dense formats)
                                     // or a quantized copy of it (int formats)
  bool head_is_embedding = false;    // lm_head.w == embed (nothing separate to store)

  std::map<std::string, int> format_counts;              // --weights native: linear layers per format kept
  std::vector<std::shared_ptr<const void>> keep_alive;  // memory maps the pointers above point into
  std::deque<Tensor> owned;                             // converted / dequantized tensors
  size_t nbytes = 0;                                    // every weight byte the model uses (mapped or owned)
};

struct Model::Impl {
  ModelConfig config;
  ModelOptions options;
  std::optional<Tokenizer> tokenizer;
  std::string tokenizer_error;  // why there is none
  // The model's own prompt template (Jinja): chat_template of tokenizer_config.json or chat_template.jinja beside it,
  // or the GGUF key tokenizer.chat_template; empty when the model has none. bos_token / eos_token: the strings the
  // template sees (tokenizer_config.json's, else the tokenizer's BOS and first EOS).
  std::string chat_template, bos_token, eos_token;
  std::string source;           // "hf", "mlx", "gguf", "cider"
  int64_t ctx = 0;
  Weights w;
  std::vector<float> inv_freq;        // (D/2) full-attention layers
  std::vector<float> inv_freq_local;  // (D/2) sliding-window layers
  std::shared_ptr<const BackendModel> backend;  // options.device's: where Model::forward runs (make_backend)
  ActivationStats* activation_stats = nullptr;  // Model::record_activations: the CPU backend adds linear inputs

  // Layer `layer`'s CPU cache in the configured format, its rotation seeded with the layer index; a sliding-window
  // cache (window sliding_cache_window(layer)) on sliding layers.
  std::unique_ptr<nn::KVCache> make_cache(int64_t layer) const;
  // The window a layer's cache keeps: sliding_window on sliding layers, 0 (every position) on the others or with
  // options.kv_full_sliding.
  int64_t sliding_cache_window(int64_t layer) const;
};

// The CPU backend's rows per pass: a prefill longer than kMaxChunk is processed chunk by chunk (the causal cache makes
// that exact).
constexpr int64_t kMaxChunk = 256;
static_assert(kMaxChunk <= nn::KVCache::kWindowSlack, "a pass must fit a sliding-window cache's slack (nn/kv_cache.h)");

struct Session::Impl {
  const Model::Impl* model = nullptr;
  std::shared_ptr<const BackendModel> backend_model;  // keeps the backend alive as long as the session
  std::unique_ptr<BackendSession> backend;            // the KV caches, on the model's device
  int64_t position = 0;
  ~Impl();
};

// Mixture-of-experts routing of n rows (both backends): logits (n, E) → softmax in float32 → the K most probable
// experts of each row (ties: the lower index), their probabilities renormalised to sum 1 when `normalize`.
// chosen/weight (n, K): row r's k-th expert and its weight, experts in decreasing probability.
void route_experts(const float* logits, int64_t n, int64_t E, int64_t K, bool normalize, int32_t* chosen,
                   float* weight);

// Applies RMSNorm to `rows` rows of `dim` values: out = x / sqrt(mean(x²) + eps) · (offset + w), in float32 with
// the mean accumulated in double. out may equal x.
void rms_norm(const float* x, const float* w, float offset, int64_t rows, int64_t dim, double eps, float* out);

}  // namespace cider::model
