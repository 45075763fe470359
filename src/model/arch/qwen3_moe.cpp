// Qwen3-MoE (Qwen3MoeForCausalLM, model_type qwen3_moe): Qwen3's attention (q/k norms) with mixture-of-experts MLPs
// of moe_intermediate_size on the layers l with (l + 1) % decoder_sparse_step == 0 (dense MLPs elsewhere); the kept
// router probabilities are renormalised only when norm_topk_prob. ChatML.
// GGUF "qwen3moe" (llama.cpp: experts on every layer, the kept probabilities always renormalised) stores the experts
// as 3-D ffn_{gate,up,down}_exps tensors.
#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"Qwen3MoeForCausalLM"};
constexpr const char* kModelTypes[] = {"qwen3_moe"};
constexpr const char* kGgufNames[] = {"qwen3moe"};

void qk_norm(const ConfigSource&, ModelConfig& c) { c.qk_norm = true; }

void hf_config(const ConfigSource& src, ModelConfig& c) {
  c.qk_norm = true;
  moe_config(src, "num_experts", "moe_intermediate_size", c);
  c.norm_topk_prob = src.get_bool_or("norm_topk_prob", false);  // Qwen3MoeConfig's default
  const int64_t step = src.get_int_or("decoder_sparse_step", 1);
  check(step >= 1, ErrorCode::kCorrupt, kConfigOp, src.source(), ": decoder_sparse_step must be >= 1; got ", step);
  // mlp_only_layers lists dense layers by index; cider reads the empty list only (every released Qwen3-MoE).
  check(!src.has("mlp_only_layers") || src.brief("mlp_only_layers") == "[]", ErrorCode::kUnsupported, kConfigOp,
        src.source(), ": mlp_only_layers must be empty; got ", src.brief("mlp_only_layers"));
  for (int64_t l = 0; l < c.num_layers; ++l) c.layer_moe[static_cast<size_t>(l)] = (l + 1) % step == 0;
}

}  // namespace

extern const ArchSpec kQwen3MoeArch;
constinit const ArchSpec kQwen3MoeArch{
    .id = Architecture::kQwen3Moe,
    .name = "qwen3_moe",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 32768, .config = hf_config, .sliding_layers = qwen2_sliding_layers},
    .gguf = {.config = qk_norm},
    .moe = {.router = "mlp.gate", .experts = "mlp.experts.", .gate = "gate_proj", .up = "up_proj",
            .down = "down_proj"},
    .chat_format = ChatFormat::kChatML,
};

}  // namespace cider::model
