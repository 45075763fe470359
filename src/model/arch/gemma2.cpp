// Gemma 2 (Gemma2ForCausalLM, model_type gemma2; GGUF "gemma2"): Gemma 3 without the q/k norms. Sandwich norms
// (post-attention, pre- and post-feedforward), (1 + w) RMSNorm, GeGLU, embeddings × √hidden, queries scaled by
// query_pre_attn_scalar^−½, attention logit softcapping (scores cap·tanh(s/cap) before the mask, 50 in the released
// models) and final logit softcapping (30), even layers (0, 2, …) sliding-window and odd layers global, one RoPE for
// both. Gemma chat format.
#include <cmath>

#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"Gemma2ForCausalLM"};
constexpr const char* kModelTypes[] = {"gemma2"};
constexpr const char* kGgufNames[] = {"gemma2"};

// The norm after attention is post_attention_norm (the pre-MLP norm is pre_feedforward_layernorm → ffn_norm).
constexpr TensorName kGgufLayerTensors[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"}};

// Gemma2Config's defaults when a softcap key is absent; null means none (HF: `if softcap is not None`).
constexpr double kDefaultAttnSoftcap = 50.0;
constexpr double kDefaultFinalSoftcap = 30.0;

// A softcapping key of config.json: its value (> 0), 0 when null, the HF default when absent.
float hf_softcap(const ConfigSource& src, const char* key, double fallback) {
  if (!src.present(key)) return static_cast<float>(fallback);
  if (!src.has(key)) return 0.0f;  // null: no capping
  const double v = src.get_num(key);
  check(std::isfinite(v) && v > 0, ErrorCode::kCorrupt, kConfigOp, src.source(), ": ", key,
        " must be a positive number or null; got ", src.brief(key));
  return static_cast<float>(v);
}

void hf_config(const ConfigSource& src, ModelConfig& c) {
  c.sandwich_norms = true;
  c.norm_weight_offset = 1.0f;
  // HF multiplies by the normalizer as a tensor of the embedding's dtype: √hidden rounded to it.
  c.embed_scale = round_to(c.dtype, static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))));
  c.attn_logit_softcap = hf_softcap(src, "attn_logit_softcapping", kDefaultAttnSoftcap);
  c.final_logit_softcap = hf_softcap(src, "final_logit_softcapping", kDefaultFinalSoftcap);
  const double qpas = src.get_num_or("query_pre_attn_scalar", 256.0);
  check(std::isfinite(qpas) && qpas > 0, ErrorCode::kCorrupt, kConfigOp, src.source(),
        ": query_pre_attn_scalar must be positive; got ", qpas);
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
  check(!src.get_bool_or("use_bidirectional_attention", false), ErrorCode::kUnsupported, kConfigOp, src.source(),
        ": use_bidirectional_attention (non-causal Gemma 2) is not supported; got true");
}

// Without layer_types: Gemma2Config marks layer i sliding when (i + 1) % 2 != 0, i.e. the even layers.
void hf_sliding_layers(const ConfigSource&, int64_t, ModelConfig& c) {
  for (int64_t i = 0; i < c.num_layers; ++i) c.layer_sliding[static_cast<size_t>(i)] = i % 2 == 0;
}

// llama.cpp's Gemma 2 (src/models/gemma2.cpp): its converter stored 1 + w in the norms; sliding_window 4096,
// attn_logit_softcapping 50 and final_logit_softcapping 30 when absent; layer i slides when i % pattern < pattern − 1
// (attention.sliding_window_pattern, default 2: the even layers); queries scaled by head_dim^−½, or (hidden/heads)^−½
// for the 46-layer 27B model (query_pre_attn_scalar = 144 there; llama.cpp keys the rule on the layer count).
void gguf_config(const ConfigSource& src, ModelConfig& c) {
  c.sandwich_norms = true;
  c.norm_weight_offset = 0.0f;
  c.activation = Activation::kGeluTanh;
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  c.sliding_window = src.get_int_or("attention.sliding_window", 4096);
  const int64_t pattern = src.get_int_or("attention.sliding_window_pattern", 2);
  check(pattern > 0, ErrorCode::kCorrupt, kConfigOp, src.source(),
        ": attention.sliding_window_pattern must be positive; got ", pattern);
  for (int64_t i = 0; i < c.num_layers; ++i) c.layer_sliding[static_cast<size_t>(i)] = i % pattern < pattern - 1;
  c.attn_logit_softcap = static_cast<float>(src.get_num_or("attn_logit_softcapping", kDefaultAttnSoftcap));
  c.final_logit_softcap = static_cast<float>(src.get_num_or("final_logit_softcapping", kDefaultFinalSoftcap));
  check(c.attn_logit_softcap > 0 && c.final_logit_softcap > 0, ErrorCode::kCorrupt, kConfigOp, src.source(),
        ": Gemma 2 softcapping values must be positive; got attn_logit_softcapping ", c.attn_logit_softcap,
        ", final_logit_softcapping ", c.final_logit_softcap);
  if (src.has("rope.freq_base_swa")) {
    const double base_swa = src.get_num("rope.freq_base_swa");
    check(static_cast<float>(base_swa) == static_cast<float>(c.rope.theta), ErrorCode::kUnsupported, kConfigOp,
          src.source(), ": Gemma 2 uses one RoPE base for both kinds of layer; got rope.freq_base_swa ", base_swa,
          " and rope.freq_base ", c.rope.theta);
  }
  double qscale_dim = static_cast<double>(c.head_dim);
  if (c.num_layers == 46) qscale_dim = static_cast<double>(c.hidden_size / c.num_heads);
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(qscale_dim));
}

}  // namespace

extern const ArchSpec kGemma2Arch;
constinit const ArchSpec kGemma2Arch{
    .id = Architecture::kGemma2,
    .name = "gemma2",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.head_dim = 256,
           .max_position = 8192,
           .tie_word_embeddings = true,
           .activation_key = "hidden_activation",
           .activation = "gelu_pytorch_tanh",
           .rope_theta = 10000.0,
           .config = hf_config,
           .sliding_layers = hf_sliding_layers},
    .gguf = {.rope_theta = 10000.0, .config = gguf_config},
    .gguf_layer_tensors = kGgufLayerTensors,
    .chat_format = ChatFormat::kGemma,
};

}  // namespace cider::model
