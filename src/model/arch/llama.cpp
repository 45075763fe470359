// Llama (LlamaForCausalLM; GGUF "llama", which llama.cpp also uses for Mistral models): the common rules of ArchSpec
// plus mlp_bias, and a chat format that depends on the generation (Llama 2 or 3, or a fine-tune's own markers).
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"LlamaForCausalLM"};
constexpr const char* kModelTypes[] = {"llama"};
constexpr const char* kGgufNames[] = {"llama"};

void hf_config(const ConfigSource& src, ModelConfig& c) { c.mlp_bias = src.get_bool_or("mlp_bias", false); }

// Llama-architecture checkpoints differ by generation, so the vocabulary decides.
ChatFormat chat_format_by_vocab(const HasTokenFn& has_token) {
  if (has_token("<|start_header_id|>")) return ChatFormat::kLlama3;
  if (has_token("<|im_start|>")) return ChatFormat::kChatML;
  if (has_token("<s>") && has_token("</s>")) return ChatFormat::kLlama2;
  return ChatFormat::kRaw;
}

}  // namespace

extern const ArchSpec kLlamaArch;
constinit const ArchSpec kLlamaArch{
    .id = Architecture::kLlama,
    .name = "llama",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 2048, .config = hf_config},
    .gguf_qk_interleaved = true,
    .chat_format_by_vocab = chat_format_by_vocab,
};

}  // namespace cider::model
