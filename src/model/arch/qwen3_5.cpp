// Qwen3.5 text models (Qwen3_5ForCausalLM, model_type qwen3_5_text): Qwen3-Next's hybrid of gated DeltaNet and gated
// full-attention layers (arch/qwen3_next.cpp) with dense MLPs, and the DeltaNet input projections stored separately
// (linear_attn.in_proj_qkv = q | k | v, in_proj_z, in_proj_b, in_proj_a: the engine's own layout). The released
// checkpoints are vision-language models (Qwen3_5ForConditionalGeneration, text_config): only the text-only class is
// read. ChatML.
// GGUF "qwen35" (llama.cpp's converter, Qwen3_5TextModel): Qwen3-Next's GGUF layout (arch/qwen3_next.cpp: norms
// stored as 1 + w, ssm_a = −exp(A_log), ssm_dt.bias, ssm_conv1d (C, K), the ssm.* geometry, the rotary dims in
// rope.dimension_count) with the parts stored themselves (attn_qkv, attn_gate, ssm_beta, ssm_alpha), and, when value
// heads outnumber key heads, every value-head tensor (the v rows of attn_qkv and of the conv, attn_gate, ssm_beta,
// ssm_alpha, ssm_a, ssm_dt, ssm_out's columns) in llama.cpp's "tiled" order: value head j·Hk + i is key head i's
// j-th. The engine runs that order as stored (LinearAttention::v_tiled). rope.dimension_sections (interleaved
// MRoPE) is not read: with text positions, equal in every section, it rotates as plain RoPE over the rotary dims.
#include "model/arch/arch.h"

namespace cider::model {

namespace {

constexpr const char* kHfClasses[] = {"Qwen3_5ForCausalLM"};
constexpr const char* kModelTypes[] = {"qwen3_5_text"};

void gguf_config(const ConfigSource& src, ModelConfig& c) {
  hybrid_gguf_config(src, c);
  c.linear_attn.v_tiled = c.linear_attn.num_v_heads != c.linear_attn.num_k_heads;
}

constexpr const char* kGgufNames[] = {"qwen35"};
constexpr TensorName kGgufLayerTensors[] = {
    {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
    {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
    {"linear_attn.in_proj_b.weight", "ssm_beta.weight"},
    {"linear_attn.in_proj_a.weight", "ssm_alpha.weight"},
    {"linear_attn.A_log", "ssm_a"},
    {"linear_attn.dt_bias", "ssm_dt.bias"},
    {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
    {"linear_attn.norm.weight", "ssm_norm.weight"},
    {"linear_attn.out_proj.weight", "ssm_out.weight"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
};

}  // namespace

extern const ArchSpec kQwen35Arch;
constinit const ArchSpec kQwen35Arch{
    .id = Architecture::kQwen35,
    .name = "qwen3_5",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 32768, .partial_rotary_factor = 0.25, .config = hybrid_config},
    .gguf = {.config = gguf_config},
    .gguf_layer_tensors = kGgufLayerTensors,
    .chat_format = ChatFormat::kChatML,
};

}  // namespace cider::model
