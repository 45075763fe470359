// Qwen3-Next (Qwen3NextForCausalLM, model_type qwen3_next): a hybrid of gated DeltaNet linear-attention layers and
// gated full-attention layers (layer_types; three linear layers to one full in the released models), with mixture-of-
// experts MLPs that add a shared expert behind a sigmoid gate.
//   full attention   q_proj = each head's query | gate (2·head_dim rows per head), q/k RMSNorm per head, partial
//                    rotary (partial_rotary_factor, 0.25 by default), output · sigmoid(gate) before o_proj
//   linear attention linear_attn.in_proj_qkvz / in_proj_ba, rows grouped per key head (q, k, the v and z of its value
//                    heads; b, a); the loader regroups them into the engine's q | k | v, z, b and a layers
//                    (model/transformer.h), conv1d (depthwise, kernel linear_conv_kernel_dim), A_log, dt_bias, and the
//                    gated output norm (weight w, not 1 + w)
//   MLP              layers l with (l + 1) % decoder_sparse_step == 0 that mlp_only_layers does not list: MoE of
//                    num_experts (top num_experts_per_tok, renormalised when norm_topk_prob) + the shared expert;
//                    dense MLPs of intermediate_size elsewhere
// Every other RMSNorm multiplies by (1 + w). ChatML.
// GGUF "qwen3next" (llama.cpp's converter): the norms stored as 1 + w (so no offset), in_proj_qkvz already regrouped
// into attn_qkv (q | k | v) and attn_gate (z), ssm_ba as the checkpoint's in_proj_ba, ssm_a = −exp(A_log) (the
// loader takes its log back), ssm_dt.bias, ssm_conv1d (C, K), the geometry in ssm.* keys, the rotary dims in
// rope.dimension_count, experts 3-D and the shared expert as *_shexp; the linear layers are those with ssm_a.
#include "core/error.h"
#include "core/limits.h"
#include "model/arch/arch.h"

namespace cider::model {

void hybrid_config(const ConfigSource& src, ModelConfig& c) {
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.norm_weight_offset = 1.0f;
  ModelConfig::LinearAttention& la = c.linear_attn;
  la.num_k_heads = src.get_int("linear_num_key_heads");
  la.num_v_heads = src.get_int("linear_num_value_heads");
  la.k_head_dim = src.get_int("linear_key_head_dim");
  la.v_head_dim = src.get_int("linear_value_head_dim");
  la.conv_kernel = src.get_int_or("linear_conv_kernel_dim", 4);
  auto in = [&](int64_t v, int64_t lo, int64_t hi, const char* key) {
    check(v >= lo && v <= hi, ErrorCode::kCorrupt, kConfigOp, src.source(), ": ", key, " must be in [", lo, ", ",
          hi, "]; got ", v);
  };
  in(la.num_k_heads, 1, limits::kMaxHeads, "linear_num_key_heads");
  in(la.num_v_heads, 1, limits::kMaxHeads, "linear_num_value_heads");
  in(la.k_head_dim, 1, limits::kMaxHeadDim, "linear_key_head_dim");
  in(la.v_head_dim, 1, limits::kMaxHeadDim, "linear_value_head_dim");
  in(la.conv_kernel, 1, 64, "linear_conv_kernel_dim");
  check(la.num_v_heads % la.num_k_heads == 0, ErrorCode::kCorrupt, kConfigOp, src.source(),
        ": linear_num_value_heads must be a multiple of linear_num_key_heads (each key head serves whole value "
        "heads); got ", la.num_v_heads, " and ", la.num_k_heads);
}

// GGUF metadata (config.cpp has marked the linear layers and read the experts): the geometry from the ssm.* keys.
void hybrid_gguf_config(const ConfigSource& src, ModelConfig& c) {
  c.qk_norm = true;
  c.attn_output_gate = true;
  c.norm_weight_offset = 0.0f;  // stored as 1 + w
  ModelConfig::LinearAttention& la = c.linear_attn;
  la.num_k_heads = src.get_int("ssm.group_count");
  la.num_v_heads = src.get_int("ssm.time_step_rank");
  la.k_head_dim = src.get_int("ssm.state_size");
  la.conv_kernel = src.get_int("ssm.conv_kernel");
  const int64_t inner = src.get_int("ssm.inner_size");
  check(la.num_v_heads > 0 && inner > 0 && inner % la.num_v_heads == 0, ErrorCode::kCorrupt, kConfigOp,
        src.source(), ": ssm.inner_size must be a positive multiple of ssm.time_step_rank (the value heads); got ",
        inner, " and ", la.num_v_heads);
  la.v_head_dim = inner / la.num_v_heads;
}

namespace {

constexpr const char* kHfClasses[] = {"Qwen3NextForCausalLM"};
constexpr const char* kModelTypes[] = {"qwen3_next"};

void hf_config(const ConfigSource& src, ModelConfig& c) {
  hybrid_config(src, c);
  if (src.get_int_or("num_experts", 0) <= 0) return;  // a dense Qwen3-Next
  moe_config(src, "num_experts", "moe_intermediate_size", c);
  c.norm_topk_prob = src.get_bool_or("norm_topk_prob", true);  // Qwen3NextConfig's default
  c.shared_expert_intermediate_size = src.get_int_or("shared_expert_intermediate_size", 0);
  check(c.shared_expert_intermediate_size >= 0 && c.shared_expert_intermediate_size <= limits::kMaxDim,
        ErrorCode::kCorrupt, kConfigOp, src.source(), ": shared_expert_intermediate_size must be in [0, ",
        limits::kMaxDim, "]; got ", c.shared_expert_intermediate_size);
  const int64_t step = src.get_int_or("decoder_sparse_step", 1);
  check(step >= 1, ErrorCode::kCorrupt, kConfigOp, src.source(), ": decoder_sparse_step must be >= 1; got ", step);
  for (int64_t l = 0; l < c.num_layers; ++l) c.layer_moe[static_cast<size_t>(l)] = (l + 1) % step == 0;
  if (src.has("mlp_only_layers"))
    for (int64_t l : src.get_int_list("mlp_only_layers")) {
      check(l >= 0 && l < c.num_layers, ErrorCode::kCorrupt, kConfigOp, src.source(),
            ": mlp_only_layers entries must be layer indices in [0, ", c.num_layers, "); got ", l);
      c.layer_moe[static_cast<size_t>(l)] = 0;
    }
}

void gguf_config(const ConfigSource& src, ModelConfig& c) {
  hybrid_gguf_config(src, c);
  c.shared_expert_intermediate_size = src.get_int_or("expert_shared_feed_forward_length", 0);
}

constexpr const char* kGgufNames[] = {"qwen3next"};
constexpr TensorName kGgufLayerTensors[] = {
    {"linear_attn.in_proj_qkv.weight", "attn_qkv.weight"},
    {"linear_attn.in_proj_z.weight", "attn_gate.weight"},
    {"linear_attn.in_proj_ba.weight", "ssm_ba.weight"},
    {"linear_attn.A_log", "ssm_a"},
    {"linear_attn.dt_bias", "ssm_dt.bias"},
    {"linear_attn.conv1d.weight", "ssm_conv1d.weight"},
    {"linear_attn.norm.weight", "ssm_norm.weight"},
    {"linear_attn.out_proj.weight", "ssm_out.weight"},
    {"post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
};

}  // namespace

extern const ArchSpec kQwen3NextArch;
constinit const ArchSpec kQwen3NextArch{
    .id = Architecture::kQwen3Next,
    .name = "qwen3_next",
    .hf_classes = kHfClasses,
    .hf_model_types = kModelTypes,
    .gguf_names = kGgufNames,
    .hf = {.max_position = 32768, .partial_rotary_factor = 0.25, .config = hf_config},
    .gguf = {.config = gguf_config},
    .gguf_layer_tensors = kGgufLayerTensors,
    .moe = {.router = "mlp.gate", .experts = "mlp.experts.", .gate = "gate_proj", .up = "up_proj",
            .down = "down_proj"},
    .chat_format = ChatFormat::kChatML,
};

}  // namespace cider::model
