// Qwen2 (Qwen2ForCausalLM; GGUF "qwen2"): Llama with q/k/v biases always (never o/mlp biases), sliding windows from
// max_window_layers on when use_sliding_window, ChatML.
#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {

void qwen2_sliding_layers(const ConfigSource& src, int64_t window, ModelConfig& c) {
  if (!src.get_bool_or("use_sliding_window", false) || window <= 0) return;
  const int64_t first = src.get_int_or("max_window_layers", c.num_layers);
  check(first >= 0, ErrorCode::kCorrupt, kConfigOp, src.source(),
        ": max_window_layers must be >= 0 (the first layer with a sliding window); got ", first);
  for (int64_t i = first; i < c.num_layers; ++i) c.layer_sliding[static_cast<size_t>(i)] = 1;
}

namespace {

constexpr const char* kHfClasses[] = {"Qwen2ForCausalLM"};
constexpr const char* kModelTypes[] = {"qwen2"};
constexpr const char* kGgufNames[] = {"qwen2"};

void qkv_bias_only(const ConfigSource&, ModelConfig& c) {
  c.qkv_bias = true;
  c.o_bias = false;
}

}  // namespace

extern const ArchSpec kQwen2Arch;
constinit const ArchSpec kQwen2Arch{
    .id = Architecture::kQwen2,
    .name = "qwen2",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 32768, .config = qkv_bias_only, .sliding_layers = qwen2_sliding_layers},
    .gguf = {.config = qkv_bias_only},
    .chat_format = ChatFormat::kChatML,
};

}  // namespace cider::model
