// The architecture registry (model/arch/arch.h): every name of every entry resolves to that entry, unknown names are
// kUnsupported errors naming the operation, the rule and the name, every entry has its required fields, and the
// GGUF tensor naming per architecture.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "core/error.h"
#include "model/arch/arch.h"

namespace cider::model {
namespace {

void expect_unsupported(const std::function<void()>& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[load_config] ", 0), 0u) << msg;
    for (const std::string& w : words) EXPECT_NE(msg.find(w), std::string::npos) << "'" << w << "' in: " << msg;
  }
}

TEST(ArchRegistry, EveryEntryHasItsRequiredFields) {
  ASSERT_FALSE(all_archs().empty());
  std::set<Architecture> ids;
  std::set<std::string> names;
  for (const ArchSpec* a : all_archs()) {
    ASSERT_NE(a, nullptr);
    ASSERT_NE(a->name, nullptr);
    SCOPED_TRACE(a->name);
    EXPECT_FALSE(std::string(a->name).empty());
    EXPECT_TRUE(ids.insert(a->id).second) << "two entries share one Architecture value";
    EXPECT_TRUE(names.insert(a->name).second) << "two entries share one name";
    EXPECT_FALSE(a->hf_classes.empty());
    EXPECT_FALSE(a->hf_model_types.empty());
    for (auto list : {a->hf_classes, a->hf_model_types, a->gguf_names})
      for (const char* n : list) EXPECT_TRUE(n != nullptr && *n != '\0');
    EXPECT_GT(a->hf.max_position, 0);
    EXPECT_GE(a->hf.head_dim, 0);
    EXPECT_TRUE(a->hf.activation_key != nullptr && a->hf.activation != nullptr);
    EXPECT_GT(a->hf.rope_theta, 0.0);
    EXPECT_GT(a->gguf.rope_theta, 0.0);
    if (a->separate_local_rope) {
      EXPECT_NE(a->hf.local_rope_theta_key, nullptr);
      EXPECT_GT(a->local_rope_theta, 0.0);
    }
    for (const TensorName& t : a->gguf_layer_tensors) EXPECT_TRUE(t.hf != nullptr && t.gguf != nullptr);
    // Exactly one way to choose the chat format.
    EXPECT_NE(a->chat_format.has_value(), a->chat_format_by_vocab != nullptr);
    EXPECT_EQ(&arch_spec(a->id), a);
    EXPECT_STREQ(architecture_name(a->id), a->name);
  }
  for (Architecture id : {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2, Architecture::kQwen3,
                          Architecture::kGemma3, Architecture::kGemma2})
    EXPECT_EQ(ids.count(id), 1u) << static_cast<int>(id);
}

TEST(ArchRegistry, EveryNameResolvesToItsEntry) {
  for (const ArchSpec* a : all_archs()) {
    SCOPED_TRACE(a->name);
    EXPECT_EQ(find_arch_by_name(a->name), a);
    EXPECT_EQ(&arch_by_name(a->name, "meta"), a);
    for (const char* n : a->hf_classes) {
      EXPECT_EQ(find_arch_by_hf_class(n), a) << n;
      EXPECT_EQ(&arch_by_hf_class(n, "config.json"), a) << n;
    }
    for (const char* n : a->hf_model_types) {
      EXPECT_EQ(find_arch_by_model_type(n), a) << n;
      EXPECT_EQ(&arch_by_model_type(n, "config.json"), a) << n;
    }
    for (const char* n : a->gguf_names) {
      EXPECT_EQ(find_arch_by_gguf_name(n), a) << n;
      EXPECT_EQ(&arch_by_gguf_name(n, "m.gguf"), a) << n;
    }
  }
}

TEST(ArchRegistry, KnownNames) {
  EXPECT_EQ(arch_by_hf_class("LlamaForCausalLM", "c").id, Architecture::kLlama);
  EXPECT_EQ(arch_by_hf_class("MistralForCausalLM", "c").id, Architecture::kMistral);
  EXPECT_EQ(arch_by_hf_class("Qwen2ForCausalLM", "c").id, Architecture::kQwen2);
  EXPECT_EQ(arch_by_hf_class("Qwen3ForCausalLM", "c").id, Architecture::kQwen3);
  EXPECT_EQ(arch_by_hf_class("Gemma3ForCausalLM", "c").id, Architecture::kGemma3);
  EXPECT_EQ(arch_by_model_type("gemma3_text", "c").id, Architecture::kGemma3);
  EXPECT_EQ(arch_by_model_type("mistral", "c").id, Architecture::kMistral);
  // llama.cpp stores Mistral models as "llama": the same computation.
  EXPECT_EQ(arch_by_gguf_name("llama", "g").id, Architecture::kLlama);
  EXPECT_EQ(find_arch_by_gguf_name("mistral"), nullptr);
  EXPECT_EQ(arch_by_gguf_name("qwen2", "g").id, Architecture::kQwen2);
  EXPECT_EQ(arch_by_gguf_name("qwen3", "g").id, Architecture::kQwen3);
  EXPECT_EQ(arch_by_gguf_name("gemma3", "g").id, Architecture::kGemma3);
  EXPECT_EQ(arch_by_name("gemma3", "meta").id, Architecture::kGemma3);
  EXPECT_EQ(arch_by_hf_class("Gemma2ForCausalLM", "c").id, Architecture::kGemma2);
  EXPECT_EQ(arch_by_model_type("gemma2", "c").id, Architecture::kGemma2);
  EXPECT_EQ(arch_by_gguf_name("gemma2", "g").id, Architecture::kGemma2);
  EXPECT_EQ(arch_by_name("gemma2", "meta").id, Architecture::kGemma2);
  // Gemma 2's GGUF layer names are Gemma 3's (post_attention_norm; pre_feedforward_layernorm is ffn_norm).
  const ArchSpec& gemma2 = arch_spec(Architecture::kGemma2);
  EXPECT_EQ(gguf_tensor_name(gemma2, "model.layers.1.post_attention_layernorm.weight"),
            "blk.1.post_attention_norm.weight");
  EXPECT_EQ(gguf_tensor_name(gemma2, "model.layers.1.pre_feedforward_layernorm.weight"), "blk.1.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name(gemma2, "model.layers.1.post_feedforward_layernorm.weight"),
            "blk.1.post_ffw_norm.weight");
  EXPECT_FALSE(gemma2.gguf_qk_interleaved);
  EXPECT_FALSE(gemma2.separate_local_rope);
  EXPECT_EQ(arch_chat_format(gemma2, [](std::string_view) { return false; }), ChatFormat::kGemma);
}

TEST(ArchRegistry, UnknownNamesAreClearErrors) {
  EXPECT_EQ(find_arch_by_hf_class("GPT2LMHeadModel"), nullptr);
  EXPECT_EQ(find_arch_by_model_type("gpt2"), nullptr);
  EXPECT_EQ(find_arch_by_gguf_name("phi2"), nullptr);
  EXPECT_EQ(find_arch_by_name("LlamaForCausalLM"), nullptr);  // names of one kind only
  expect_unsupported([] { arch_by_hf_class("GPT2LMHeadModel", "dir/config.json"); },
                     {"dir/config.json", "architecture \"GPT2LMHeadModel\" is not supported", "supported: ",
                      "LlamaForCausalLM", "Gemma3ForCausalLM"});
  expect_unsupported([] { arch_by_model_type("gpt2", "config.json"); },
                     {"model_type \"gpt2\" is not supported", "gemma3_text"});
  expect_unsupported([] { arch_by_gguf_name("phi2", "m.gguf"); },
                     {"m.gguf", "GGUF architecture \"phi2\" is not supported", "llama, qwen2, qwen3, gemma3"});
  expect_unsupported([] { arch_by_name("gpt2", "meta"); },
                     {"architecture \"gpt2\" is not supported", "llama, mistral, qwen2, qwen3, gemma3"});
  expect_unsupported([] { arch_by_name("", "meta"); }, {"architecture \"\" is not supported"});
  try {
    arch_spec(static_cast<Architecture>(99));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("[arch_spec]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
  EXPECT_STREQ(architecture_name(static_cast<Architecture>(99)), "unknown");
}

TEST(ArchRegistry, GgufTensorNames) {
  const ArchSpec& llama = arch_spec(Architecture::kLlama);
  const ArchSpec& gemma = arch_spec(Architecture::kGemma3);
  EXPECT_EQ(gguf_tensor_name(llama, "model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.norm.weight"), "output_norm.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "lm_head.weight"), "output.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.3.self_attn.q_proj.weight"), "blk.3.attn_q.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.12.mlp.down_proj.weight"), "blk.12.ffn_down.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.0.post_attention_layernorm.weight"), "blk.0.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name(gemma, "model.layers.0.post_attention_layernorm.weight"),
            "blk.0.post_attention_norm.weight");
  EXPECT_EQ(gguf_tensor_name(gemma, "model.layers.0.pre_feedforward_layernorm.weight"), "blk.0.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name(gemma, "model.layers.1.post_feedforward_layernorm.weight"), "blk.1.post_ffw_norm.weight");
  EXPECT_EQ(gguf_tensor_name(gemma, "model.layers.1.self_attn.k_norm.weight"), "blk.1.attn_k_norm.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "model.layers.1.unknown.weight"), "model.layers.1.unknown.weight");
  EXPECT_EQ(gguf_tensor_name(llama, "something.else"), "something.else");
  // Only llama.cpp's "llama" conversion interleaves the Q/K rows.
  EXPECT_TRUE(llama.gguf_qk_interleaved);
  for (Architecture a : {Architecture::kQwen2, Architecture::kQwen3, Architecture::kGemma3})
    EXPECT_FALSE(arch_spec(a).gguf_qk_interleaved) << architecture_name(a);
}

TEST(ArchRegistry, Phi3FusedProjectionsAndNames) {
  EXPECT_EQ(arch_by_hf_class("Phi3ForCausalLM", "c").id, Architecture::kPhi3);
  EXPECT_EQ(arch_by_model_type("phi3", "c").id, Architecture::kPhi3);
  EXPECT_EQ(arch_by_gguf_name("phi3", "g").id, Architecture::kPhi3);
  const ArchSpec& phi3 = arch_spec(Architecture::kPhi3);
  EXPECT_FALSE(phi3.gguf_qk_interleaved);  // rotate_half RoPE: llama.cpp keeps the HF row order
  EXPECT_EQ(gguf_tensor_name(phi3, "model.layers.2.self_attn.qkv_proj.weight"), "blk.2.attn_qkv.weight");
  EXPECT_EQ(gguf_tensor_name(phi3, "model.layers.2.mlp.gate_up_proj.weight"), "blk.2.ffn_up.weight");
  ASSERT_EQ(phi3.fused_linears.size(), 2u);
  EXPECT_STREQ(phi3.fused_linears[0].fused, "self_attn.qkv_proj");
  ASSERT_EQ(phi3.fused_linears[0].parts.size(), 3u);
  EXPECT_STREQ(phi3.fused_linears[0].parts[0], "self_attn.q_proj");
  EXPECT_STREQ(phi3.fused_linears[0].parts[2], "self_attn.v_proj");
  EXPECT_STREQ(phi3.fused_linears[1].parts[0], "mlp.gate_proj");  // gate rows first, as Phi3MLP's chunk(2)
  EXPECT_EQ(arch_chat_format(phi3, [](std::string_view) { return false; }), ChatFormat::kPhi3);
  for (const ArchSpec* a : all_archs())
    EXPECT_TRUE(a->id == Architecture::kPhi3 || a->fused_linears.empty()) << a->name;
}

TEST(ArchRegistry, ChatFormats) {
  const auto none = [](std::string_view) { return false; };
  EXPECT_EQ(arch_chat_format(arch_spec(Architecture::kQwen2), none), ChatFormat::kChatML);
  EXPECT_EQ(arch_chat_format(arch_spec(Architecture::kGemma3), none), ChatFormat::kGemma);
  EXPECT_EQ(arch_chat_format(arch_spec(Architecture::kMistral), none), ChatFormat::kMistral);
  EXPECT_EQ(arch_chat_format(arch_spec(Architecture::kLlama), none), ChatFormat::kRaw);
  EXPECT_EQ(arch_chat_format(arch_spec(Architecture::kLlama),
                             [](std::string_view t) { return t == "<|start_header_id|>"; }),
            ChatFormat::kLlama3);
}

}  // namespace
}  // namespace cider::model
