// Mixtral (MixtralForCausalLM, model_type mixtral): Mistral's attention with a mixture-of-experts MLP in every layer
// — a router over num_local_experts SwiGLU experts (w1 gate, w3 up, w2 down), the num_experts_per_tok largest
// softmax probabilities kept and renormalised. Also defines moe_config, the MoE keys shared with Qwen3-MoE.
// llama.cpp stores Mixtral GGUFs as "llama" with expert_count > 0 (q/k rows interleaved as for Llama), the experts as
// 3-D ffn_{gate,up,down}_exps tensors.
#include "core/error.h"
#include "core/limits.h"
#include "model/arch/arch.h"

namespace cider::model {

void moe_config(const ConfigSource& src, const char* experts_key, const char* intermediate_key, ModelConfig& c) {
  // The per-layer table is sized from num_hidden_layers: bounded here, before validate_config sees it.
  check(c.num_layers > 0 && c.num_layers <= limits::kMaxLayers, ErrorCode::kCorrupt, kConfigOp, src.source(),
        ": num_hidden_layers must be in [1, ", limits::kMaxLayers, "]; got ", c.num_layers);
  const char* other = std::string_view(experts_key) == "num_experts" ? "num_local_experts" : "num_experts";
  c.num_experts = src.has(experts_key) ? src.get_int(experts_key) : src.get_int(other);
  c.experts_per_token = src.get_int("num_experts_per_tok");
  c.expert_intermediate_size = intermediate_key ? src.get_int_or(intermediate_key, c.intermediate_size)
                                                : c.intermediate_size;
  c.norm_topk_prob = src.get_bool_or("norm_topk_prob", true);
  c.layer_moe.assign(static_cast<size_t>(c.num_layers), 1);
}

namespace {

constexpr const char* kHfClasses[] = {"MixtralForCausalLM"};
constexpr const char* kModelTypes[] = {"mixtral"};
constexpr const char* kGgufMoeNames[] = {"llama"};

void hf_config(const ConfigSource& src, ModelConfig& c) {
  c.qkv_bias = c.o_bias = false;
  moe_config(src, "num_local_experts", nullptr, c);
  c.norm_topk_prob = true;  // Mixtral always renormalises the kept probabilities
}

void hf_sliding_layers(const ConfigSource&, int64_t window, ModelConfig& c) {
  for (auto& s : c.layer_sliding) s = window > 0;
}

}  // namespace

extern const ArchSpec kMixtralArch;
constinit const ArchSpec kMixtralArch{
    .id = Architecture::kMixtral,
    .name = "mixtral",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .hf = {.max_position = 131072, .rope_theta = 1000000.0, .config = hf_config, .sliding_layers = hf_sliding_layers},
    .gguf_qk_interleaved = true,
    .moe = {.router = "block_sparse_moe.gate", .experts = "block_sparse_moe.experts.", .gate = "w1", .up = "w3",
            .down = "w2"},
    .gguf_moe_names = kGgufMoeNames,
    .chat_format = ChatFormat::kMistral,
};

}  // namespace cider::model
