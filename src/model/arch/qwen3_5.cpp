// Qwen3.5 text models (Qwen3_5ForCausalLM, model_type qwen3_5_text): Qwen3-Next's hybrid of gated DeltaNet and gated
// full-attention layers (arch/qwen3_next.cpp) with dense MLPs, and the DeltaNet input projections stored separately
// (linear_attn.in_proj_qkv = q | k | v, in_proj_z, in_proj_b, in_proj_a: the engine's own layout). The released
// checkpoints are vision-language models (Qwen3_5ForConditionalGeneration, text_config): only the text-only class is
// read. ChatML.
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"Qwen3_5ForCausalLM"};
constexpr const char* kModelTypes[] = {"qwen3_5_text"};

}  // namespace

extern const ArchSpec kQwen35Arch;
constinit const ArchSpec kQwen35Arch{
    .id = Architecture::kQwen35,
    .name = "qwen3_5",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .hf = {.max_position = 32768, .partial_rotary_factor = 0.25, .config = hybrid_config},
    .chat_format = ChatFormat::kChatML,
};

}  // namespace cider::model
