// Phi-3 / Phi-3.5 (Phi3ForCausalLM, model_type phi3; GGUF "phi3"): Llama without biases, with fused projections
// (self_attn.qkv_proj = q | k | v rows, mlp.gate_up_proj = gate | up rows; GGUF attn_qkv / ffn_up) that the loader
// splits into the engine's layers, LongRoPE scaling (rope type longrope, or su / yarn, which Phi3Config reads as
// longrope; the pre-training context from the top-level original_max_position_embeddings, 4096 by default), and
// sliding_window, when set, on every layer (transformers' Phi3Model masks every layer with it). Phi-3 chat format.
//
// GGUF: llama.cpp's converter keeps the fused tensors, writes LongRoPE's factors as the tensors rope_factors_long /
// rope_factors_short and its attention factor as rope.scaling.attn_factor (read by the loader and config.cpp), and
// does not interleave q/k rows (Phi-3 uses the rotate_half RoPE). llama.cpp itself currently ignores the sliding
// window of Phi-3 GGUF files; cider applies it, as transformers does with the same model.
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"Phi3ForCausalLM"};
constexpr const char* kModelTypes[] = {"phi3"};
constexpr const char* kGgufNames[] = {"phi3"};

constexpr const char* kQkvParts[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"};
constexpr const char* kGateUpParts[] = {"mlp.gate_proj", "mlp.up_proj"};
constexpr FusedLinear kFused[] = {{"self_attn.qkv_proj", kQkvParts}, {"mlp.gate_up_proj", kGateUpParts}};

constexpr TensorName kGgufLayerTensors[] = {
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"},
};

// Phi3Config has no bias options: never any bias. Its rms_norm_eps defaults to 1e-5.
void hf_config(const ConfigSource& src, ModelConfig& c) {
  c.qkv_bias = c.o_bias = c.mlp_bias = false;
  c.rms_norm_eps = src.get_num_or("rms_norm_eps", 1e-5);
}

void sliding_every_layer(const ConfigSource&, int64_t window, ModelConfig& c) {
  for (auto& s : c.layer_sliding) s = window > 0;
}

// attention.sliding_window: 0 or absent = none (llama.cpp's converter writes 0 for Phi-4).
void gguf_config(const ConfigSource& src, ModelConfig& c) {
  const int64_t window = src.get_int_or("attention.sliding_window", 0);
  if (window <= 0) return;
  c.sliding_window = window;
  for (auto& s : c.layer_sliding) s = 1;
}

}  // namespace

extern const ArchSpec kPhi3Arch;
constinit const ArchSpec kPhi3Arch{
    .id = Architecture::kPhi3,
    .name = "phi3",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 4096,
           .original_max_position = 4096,
           .longrope_aliases = true,
           .config = hf_config,
           .sliding_layers = sliding_every_layer},
    .gguf = {.config = gguf_config},
    .gguf_layer_tensors = kGgufLayerTensors,
    .fused_linears = kFused,
    .chat_format = ChatFormat::kPhi3,
};

}  // namespace cider::model
