// OLMoE (OlmoeForCausalLM, model_type olmoe; GGUF "olmoe"): Llama attention with q/k RMSNorms over the whole
// projections (q_norm of hidden_size = Hq·D values, k_norm of Hkv·D: ModelConfig::qk_norm_full), optional clip_qkv
// (q, k after their norms, and v clamped to ±clip), and mixture-of-experts MLPs on every layer (num_experts, top
// num_experts_per_tok, the kept probabilities renormalised only when norm_topk_prob — false by default and in the
// released model). No chat format of its own: ChatML is the fallback (the instruct models carry a template).
// GGUF (llama.cpp's converter): experts as 3-D ffn_*_exps, attention.clamp_kqv for clip_qkv; llama.cpp never
// renormalises OLMoE's kept probabilities.
#include <cmath>

#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"OlmoeForCausalLM"};
constexpr const char* kModelTypes[] = {"olmoe"};
constexpr const char* kGgufNames[] = {"olmoe"};

void clip(const ConfigSource& src, const char* key, ModelConfig& c) {
  if (!src.has(key)) return;
  const double v = src.get_num(key);
  check(v > 0 && std::isfinite(v), ErrorCode::kCorrupt, kConfigOp, src.source(), ": ", key,
        " must be positive and finite, or null; got ", v);
  c.clip_qkv = static_cast<float>(v);
}

void hf_config(const ConfigSource& src, ModelConfig& c) {
  c.qk_norm = c.qk_norm_full = true;
  c.rms_norm_eps = src.get_num_or("rms_norm_eps", 1e-5);  // OlmoeConfig's default
  moe_config(src, "num_experts", nullptr, c);
  c.norm_topk_prob = src.get_bool_or("norm_topk_prob", false);
  clip(src, "clip_qkv", c);
}

void gguf_config(const ConfigSource& src, ModelConfig& c) {
  c.qk_norm = c.qk_norm_full = true;
  c.norm_topk_prob = false;
  clip(src, "attention.clamp_kqv", c);
}

}  // namespace

extern const ArchSpec kOlmoeArch;
constinit const ArchSpec kOlmoeArch{
    .id = Architecture::kOlmoe,
    .name = "olmoe",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 4096, .config = hf_config},
    .gguf = {.config = gguf_config},
    .moe = {.router = "mlp.gate", .experts = "mlp.experts.", .gate = "gate_proj", .up = "up_proj",
            .down = "down_proj"},
    .chat_format = ChatFormat::kChatML,
};

}  // namespace cider::model
