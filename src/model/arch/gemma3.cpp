// Gemma 3 text models (Gemma3ForCausalLM, model_type gemma3_text; GGUF "gemma3"): q/k RMSNorm, sandwich norms
// (post-attention, pre- and post-feedforward), (1 + w) RMSNorm, GeGLU, embeddings × √hidden, its own query scale,
// optional final logit softcapping, and 5 sliding-window layers (own RoPE base) per global layer. Gemma chat format.
#include <cmath>

#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"Gemma3ForCausalLM"};
constexpr const char* kModelTypes[] = {"gemma3_text"};
constexpr const char* kGgufNames[] = {"gemma3"};

// The norm after attention is post_attention_norm (the pre-MLP norm is pre_feedforward_layernorm → ffn_norm).
constexpr TensorName kGgufLayerTensors[] = {{"post_attention_layernorm.weight", "post_attention_norm.weight"}};

void sandwich_layout(ModelConfig& c) {
  c.qk_norm = true;
  c.sandwich_norms = true;
}

// Every `pattern`-th layer is global, the others slide.
void sliding_pattern(int64_t pattern, const ConfigSource& src, ModelConfig& c) {
  check(pattern > 0, ErrorCode::kCorrupt, kConfigOp, src.source(), ": sliding_window_pattern must be positive; got ",
        pattern);
  for (int64_t i = 0; i < c.num_layers; ++i) c.layer_sliding[static_cast<size_t>(i)] = (i + 1) % pattern != 0;
}

void hf_config(const ConfigSource& src, ModelConfig& c) {
  sandwich_layout(c);
  c.norm_weight_offset = 1.0f;
  c.embed_scale = round_to(c.dtype, static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size))));
  // Gemma 3 configs carry null; Gemma3Attention (and llama.cpp's Gemma 3) never applies a value, so one is refused as
  // ambiguous rather than applied or ignored (cider's attention does cap scores: Gemma 2, ModelConfig).
  check(!src.has("attn_logit_softcapping"), ErrorCode::kUnsupported, kConfigOp, src.source(),
        ": attn_logit_softcapping must be null for Gemma 3 (its attention does not apply it); got ",
        src.brief("attn_logit_softcapping"));
  c.final_logit_softcap = static_cast<float>(src.get_num_or("final_logit_softcapping", 0.0));
  const double qpas = src.get_num_or("query_pre_attn_scalar", 256.0);
  check(qpas > 0, ErrorCode::kCorrupt, kConfigOp, src.source(), ": query_pre_attn_scalar must be positive; got ",
        qpas);
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(qpas));
}

void hf_sliding_layers(const ConfigSource& src, int64_t, ModelConfig& c) {
  sliding_pattern(src.get_int_or("sliding_window_pattern", 6), src, c);
}

// llama.cpp's Gemma 3: its converter stored 1 + w in the norms; local layers use base 10000 without scaling; every
// 6th layer is global unless sliding_window_pattern says otherwise.
void gguf_config(const ConfigSource& src, ModelConfig& c) {
  sandwich_layout(c);
  c.norm_weight_offset = 0.0f;
  c.activation = Activation::kGeluTanh;
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
  c.sliding_window = src.get_int("attention.sliding_window");
  sliding_pattern(src.get_int_or("attention.sliding_window_pattern", 6), src, c);
  c.final_logit_softcap = static_cast<float>(src.get_num_or("final_logit_softcapping", 0.0));
  check(!src.has("attn_logit_softcapping"), ErrorCode::kUnsupported, kConfigOp, src.source(),
        ": attn_logit_softcapping is not used by Gemma 3 (llama.cpp ignores it); got ",
        src.brief("attn_logit_softcapping"));
  // Queries are scaled by query_pre_attn_scalar^−½: head_dim for every size but 27B, where it is hidden/heads
  // (llama.cpp hard-codes the same rule, keyed on the 62-layer 27B model).
  double qscale_dim = static_cast<double>(c.head_dim);
  if (c.num_layers == 62) qscale_dim = static_cast<double>(c.hidden_size / c.num_heads);
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(qscale_dim));
}

}  // namespace

extern const ArchSpec kGemma3Arch;
constinit const ArchSpec kGemma3Arch{
    .id = Architecture::kGemma3,
    .name = "gemma3",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.head_dim = 256,
           .max_position = 131072,
           .tie_word_embeddings = true,
           .activation_key = "hidden_activation",
           .activation = "gelu_pytorch_tanh",
           .rope_theta = 1000000.0,
           .local_rope_theta_key = "rope_local_base_freq",
           .config = hf_config,
           .sliding_layers = hf_sliding_layers},
    .gguf = {.rope_theta = 1000000.0, .config = gguf_config},
    .separate_local_rope = true,
    .local_rope_theta = 10000.0,
    .gguf_layer_tensors = kGgufLayerTensors,
    .chat_format = ChatFormat::kGemma,
};

}  // namespace cider::model
