// The architecture registry (see arch.h): the table of every ArchSpec, lookups, and the GGUF tensor naming.
#include <string>

#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {

// One line per architecture (each defined in its own file in this folder).
extern const ArchSpec kLlamaArch, kMistralArch, kQwen2Arch, kQwen3Arch, kGemma3Arch;
extern const ArchSpec kGemma2Arch;
extern const ArchSpec kMixtralArch, kQwen3MoeArch;
extern const ArchSpec kPhi3Arch;
extern const ArchSpec kQwen3NextArch, kQwen35Arch;
extern const ArchSpec kOlmoeArch;

std::vector<int64_t> ConfigSource::get_int_list(const char* key) const {
  fail(ErrorCode::kUnsupported, kConfigOp, source(), ": the list ", key, " cannot be read from this source");
}

namespace {

constexpr const ArchSpec* kArchs[] = {&kLlamaArch,    &kMistralArch,   &kQwen2Arch,  &kQwen3Arch,
                                       &kGemma3Arch,   &kGemma2Arch,    &kMixtralArch, &kQwen3MoeArch,
                                       &kPhi3Arch,     &kQwen3NextArch, &kQwen35Arch,  &kOlmoeArch};

constexpr TensorName kCommonLayerTensors[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},       {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.weight", "attn_k.weight"},       {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.weight", "attn_v.weight"},       {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},  {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},  {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},        {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    // Mixture of experts: the router and the 3-D expert tensors (loader.cpp expert_slice names them so).
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.experts.gate_proj.weight", "ffn_gate_exps.weight"},
    {"mlp.experts.up_proj.weight", "ffn_up_exps.weight"},
    {"mlp.experts.down_proj.weight", "ffn_down_exps.weight"},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"block_sparse_moe.experts.w1.weight", "ffn_gate_exps.weight"},
    {"block_sparse_moe.experts.w3.weight", "ffn_up_exps.weight"},
    {"block_sparse_moe.experts.w2.weight", "ffn_down_exps.weight"},
};

using Names = std::span<const char* const>;

const ArchSpec* find_by(std::string_view name, Names ArchSpec::*names) {
  for (const ArchSpec* a : kArchs)
    for (const char* n : a->*names)
      if (name == n) return a;
  return nullptr;
}

// "A, B, C": every name of one kind, in registry order.
std::string list_names(Names ArchSpec::*names) {
  std::string out;
  for (const ArchSpec* a : kArchs)
    for (const char* n : a->*names) {
      if (!out.empty()) out += ", ";
      out += n;
    }
  return out;
}

const ArchSpec& found_or_fail(const ArchSpec* a, const char* what, std::string_view name, const std::string& supported,
                              const std::string& source) {
  if (!a)
    fail(ErrorCode::kUnsupported, kConfigOp, source, ": ", what, " \"", name, "\" is not supported; supported: ",
         supported);
  return *a;
}

}  // namespace

const std::span<const TensorName> kCommonGgufLayerTensors{kCommonLayerTensors};

std::span<const ArchSpec* const> all_archs() { return kArchs; }

const ArchSpec& arch_spec(Architecture a) {
  for (const ArchSpec* s : kArchs)
    if (s->id == a) return *s;
  fail(ErrorCode::kInternal, "arch_spec", "every Architecture value must have a registry entry; got ",
       static_cast<int>(a));
}

const char* architecture_name(Architecture a) {
  for (const ArchSpec* s : kArchs)
    if (s->id == a) return s->name;
  return "unknown";
}

const ArchSpec* find_arch_by_name(std::string_view name) {
  for (const ArchSpec* a : kArchs)
    if (name == a->name) return a;
  return nullptr;
}
const ArchSpec* find_arch_by_hf_class(std::string_view hf_class) { return find_by(hf_class, &ArchSpec::hf_classes); }
const ArchSpec* find_arch_by_model_type(std::string_view model_type) {
  return find_by(model_type, &ArchSpec::hf_model_types);
}
const ArchSpec* find_arch_by_gguf_name(std::string_view gguf_name) {
  return find_by(gguf_name, &ArchSpec::gguf_names);
}

const ArchSpec& arch_by_name(std::string_view name, const std::string& source) {
  std::string supported;
  for (const ArchSpec* a : kArchs) {
    if (!supported.empty()) supported += ", ";
    supported += a->name;
  }
  return found_or_fail(find_arch_by_name(name), "architecture", name, supported, source);
}
const ArchSpec& arch_by_hf_class(std::string_view hf_class, const std::string& source) {
  const ArchSpec* a = find_arch_by_hf_class(hf_class);
  return found_or_fail(a, "architecture", hf_class, a ? "" : list_names(&ArchSpec::hf_classes), source);
}
const ArchSpec& arch_by_model_type(std::string_view model_type, const std::string& source) {
  const ArchSpec* a = find_arch_by_model_type(model_type);
  return found_or_fail(a, "model_type", model_type, a ? "" : list_names(&ArchSpec::hf_model_types), source);
}
const ArchSpec& arch_by_gguf_name(std::string_view gguf_name, const std::string& source) {
  const ArchSpec* a = find_arch_by_gguf_name(gguf_name);
  return found_or_fail(a, "GGUF architecture", gguf_name, a ? "" : list_names(&ArchSpec::gguf_names), source);
}

std::string gguf_tensor_name(const ArchSpec& spec, const std::string& hf) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string pre = "model.layers.";
  if (hf.rfind(pre, 0) != 0) return hf;
  const size_t dot = hf.find('.', pre.size());
  const std::string idx = hf.substr(pre.size(), dot - pre.size());
  const std::string rest = hf.substr(dot + 1);
  for (std::span<const TensorName> table : {spec.gguf_layer_tensors, kCommonGgufLayerTensors})
    for (const TensorName& t : table)
      if (rest == t.hf) {
        std::string out = "blk.";
        out += idx;
        out += '.';
        out += t.gguf;
        return out;
      }
  return hf;
}

ChatFormat arch_chat_format(const ArchSpec& spec, const HasTokenFn& has_token) {
  if (spec.chat_format) return *spec.chat_format;
  check(spec.chat_format_by_vocab != nullptr, ErrorCode::kInternal, "chat_format", "architecture ", spec.name,
        " must name a chat format or a rule choosing one; it has neither");
  return spec.chat_format_by_vocab(has_token);
}

}  // namespace cider::model
