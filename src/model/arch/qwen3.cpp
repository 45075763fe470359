// Qwen3 (Qwen3ForCausalLM; GGUF "qwen3"): Llama with RMSNorm over each query/key head, Qwen2's sliding windows, ChatML.
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"Qwen3ForCausalLM"};
constexpr const char* kModelTypes[] = {"qwen3"};
constexpr const char* kGgufNames[] = {"qwen3"};

void qk_norm(const ConfigSource&, ModelConfig& c) { c.qk_norm = true; }

}  // namespace

extern const ArchSpec kQwen3Arch;
constinit const ArchSpec kQwen3Arch{
    .id = Architecture::kQwen3,
    .name = "qwen3",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 32768, .config = qk_norm, .sliding_layers = qwen2_sliding_layers},
    .gguf = {.config = qk_norm},
    .chat_format = ChatFormat::kChatML,
};

}  // namespace cider::model
