// Mistral (MistralForCausalLM): Llama without biases, with one sliding window on every layer. llama.cpp stores Mistral
// GGUFs as "llama" (the same computation), so GGUF files load as Llama.
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"MistralForCausalLM"};
constexpr const char* kModelTypes[] = {"mistral"};

// MistralConfig has no attention_bias: never any bias.
void hf_config(const ConfigSource&, ModelConfig& c) { c.qkv_bias = c.o_bias = false; }

void hf_sliding_layers(const ConfigSource&, int64_t window, ModelConfig& c) {
  for (auto& s : c.layer_sliding) s = window > 0;
}

}  // namespace

extern const ArchSpec kMistralArch;
constinit const ArchSpec kMistralArch{
    .id = Architecture::kMistral,
    .name = "mistral",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .hf = {.max_position = 32768, .config = hf_config, .sliding_layers = hf_sliding_layers},
    .gguf_qk_interleaved = true,
    .chat_format = ChatFormat::kMistral,
};

}  // namespace cider::model
