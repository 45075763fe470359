// Model configs: HF config.json in both styles for every architecture, generation_config.json, the MLX quantization
// entry, RoPE frequencies against their float64 definitions, cider's JSON round trip, and every rejection.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/config.h"

namespace cm = cider::model;
using cider::ErrorCode;
using json = nlohmann::json;

namespace {

json base(const char* arch) {
  return json{{"architectures", {arch}},     {"vocab_size", 1000},   {"hidden_size", 256},
              {"intermediate_size", 512},     {"num_hidden_layers", 4}, {"num_attention_heads", 8},
              {"num_key_value_heads", 2},     {"max_position_embeddings", 4096}};
}

cm::ModelConfig parse(const json& j) { return cm::parse_hf_config(j.dump(), "config.json"); }

void expect_error(const json& j, ErrorCode code, const std::string& word) {
  try {
    parse(j);
    ADD_FAILURE() << "no error for " << j.dump();
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[load_config]"), std::string::npos) << e.what();
  }
}

TEST(Config, LlamaOldStyleWithLlama3Scaling) {
  json j = base("LlamaForCausalLM");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  j["torch_dtype"] = "bfloat16";
  j["tie_word_embeddings"] = true;
  j["eos_token_id"] = json::array({128001, 128008});
  j["vocab_size"] = 128256;
  const cm::ModelConfig c = parse(j);
  EXPECT_EQ(c.arch, cm::Architecture::kLlama);
  EXPECT_EQ(c.head_dim, 32);  // hidden / heads
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kLlama3);
  EXPECT_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_EQ(c.dtype, cider::DType::kBF16);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{128001, 128008}));
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(32.0f));
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.sliding_window, 0);
}

TEST(Config, NewStyleRopeParametersAndDtype) {
  json j = base("LlamaForCausalLM");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1234.0}};
  j["dtype"] = "float16";
  const cm::ModelConfig c = parse(j);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kLinear);
  EXPECT_EQ(c.rope.theta, 1234.0);
  EXPECT_EQ(c.dtype, cider::DType::kF16);
  // Old-style "type" instead of "rope_type" too.
  json k = base("LlamaForCausalLM");
  k["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  EXPECT_EQ(parse(k).rope.factor, 4.0);
}

TEST(Config, FamiliesSetTheirFlags) {
  json q2 = base("Qwen2ForCausalLM");
  q2["sliding_window"] = 4096;
  q2["use_sliding_window"] = false;
  const cm::ModelConfig c2 = parse(q2);
  EXPECT_TRUE(c2.qkv_bias);
  EXPECT_FALSE(c2.o_bias);
  EXPECT_EQ(c2.sliding_window, 0);  // use_sliding_window false
  q2["use_sliding_window"] = true;
  q2["max_window_layers"] = 2;
  const cm::ModelConfig c2w = parse(q2);
  EXPECT_EQ(c2w.layer_sliding, (std::vector<uint8_t>{0, 0, 1, 1}));

  json q3 = base("Qwen3ForCausalLM");
  q3["head_dim"] = 128;
  const cm::ModelConfig c3 = parse(q3);
  EXPECT_TRUE(c3.qk_norm);
  EXPECT_EQ(c3.head_dim, 128);
  EXPECT_FLOAT_EQ(c3.attn_scale, 1.0f / std::sqrt(128.0f));

  json mi = base("MistralForCausalLM");
  mi["sliding_window"] = 1024;
  const cm::ModelConfig cmi = parse(mi);
  EXPECT_EQ(cmi.sliding_window, 1024);
  EXPECT_EQ(cmi.layer_sliding, (std::vector<uint8_t>{1, 1, 1, 1}));
  mi["sliding_window"] = nullptr;
  EXPECT_EQ(parse(mi).sliding_window, 0);

  json ll = base("LlamaForCausalLM");
  ll["attention_bias"] = true;
  ll["mlp_bias"] = true;
  const cm::ModelConfig cl = parse(ll);
  EXPECT_TRUE(cl.qkv_bias && cl.o_bias && cl.mlp_bias);
}

TEST(Config, Gemma3OldAndNewStyle) {
  // Old style: sliding_window_pattern, rope_local_base_freq, rope_scaling for the global layers.
  json g = base("Gemma3ForCausalLM");
  g["num_hidden_layers"] = 12;
  g["head_dim"] = 256;
  g["hidden_size"] = 1152;
  g["sliding_window"] = 512;
  g["sliding_window_pattern"] = 6;
  g["rope_theta"] = 1000000.0;
  g["rope_local_base_freq"] = 10000.0;
  g["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  g["query_pre_attn_scalar"] = 256;
  g["final_logit_softcapping"] = nullptr;
  g["attn_logit_softcapping"] = nullptr;
  g["torch_dtype"] = "bfloat16";
  const cm::ModelConfig c = parse(g);
  EXPECT_EQ(c.arch, cm::Architecture::kGemma3);
  EXPECT_EQ(c.activation, cm::Activation::kGeluTanh);
  EXPECT_TRUE(c.qk_norm && c.sandwich_norms && c.tie_word_embeddings);
  EXPECT_EQ(c.norm_weight_offset, 1.0f);
  EXPECT_EQ(c.embed_scale, cider::round_to(cider::DType::kBF16, std::sqrt(1152.0f)));
  EXPECT_EQ(c.sliding_window, 512);
  std::vector<uint8_t> want(12, 1);
  want[5] = want[11] = 0;
  EXPECT_EQ(c.layer_sliding, want);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kLinear);
  EXPECT_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope_local.theta, 10000.0);
  EXPECT_EQ(c.rope_local.scaling, cm::RopeScaling::kNone);
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / 16.0f);
  EXPECT_EQ(c.final_logit_softcap, 0.0f);

  // New style: rope_parameters per layer type, layer_types.
  json n = base("Gemma3ForCausalLM");
  n["num_hidden_layers"] = 3;
  n["sliding_window"] = 16;
  n["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention"};
  n["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  n["final_logit_softcapping"] = 30.0;
  const cm::ModelConfig cn = parse(n);
  EXPECT_EQ(cn.layer_sliding, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(cn.rope.theta, 1e6);
  EXPECT_EQ(cn.rope_local.theta, 1e4);
  EXPECT_EQ(cn.final_logit_softcap, 30.0f);
  // model_type alone identifies the architecture too.
  json mt = n;
  mt.erase("architectures");
  mt["model_type"] = "gemma3_text";
  EXPECT_EQ(parse(mt).arch, cm::Architecture::kGemma3);
}

TEST(Config, GenerationConfigOverridesEos) {
  cm::ModelConfig c = parse(base("Qwen2ForCausalLM"));
  cm::apply_generation_config(c, R"({"eos_token_id": 7, "bos_token_id": 3})", "generation_config.json");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{7}));
  EXPECT_EQ(c.bos_token_id, 3);
  cm::apply_generation_config(c, R"({"eos_token_id": [5, 6]})", "generation_config.json");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_THROW(cm::apply_generation_config(c, R"({"eos_token_id": "x"})", "g"), cider::Error);
  EXPECT_THROW(cm::apply_generation_config(c, R"({"eos_token_id": 5000})", "g"), cider::Error);
  EXPECT_THROW(cm::apply_generation_config(c, "{", "g"), cider::Error);
}

TEST(Config, RopeFrequenciesMatchTheirDefinitions) {
  const double pi = std::acos(-1.0);
  cm::RopeConfig r;
  r.theta = 500000.0;
  r.scaling = cm::RopeScaling::kLlama3;
  r.factor = 8.0;
  r.low_freq_factor = 1.0;
  r.high_freq_factor = 4.0;
  r.original_max_position = 8192;
  const int64_t D = 128;
  const std::vector<float> got = cm::rope_inv_freq(r, D);
  int low = 0, mid = 0, high = 0;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double base = std::pow(500000.0, -2.0 * static_cast<double>(i) / D);
    const double wavelen = 2 * pi / base;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = base;
      ++high;
    } else if (wavelen > 8192.0 / 1.0) {
      want = base / 8.0;
      ++low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1 - smooth) * base / 8.0 + smooth * base;
      ++mid;
    }
    EXPECT_NEAR(got[static_cast<size_t>(i)], want, 2e-7 * want) << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
  cm::RopeConfig lin;
  lin.theta = 10000.0;
  lin.scaling = cm::RopeScaling::kLinear;
  lin.factor = 4.0;
  lin.freq_factors.assign(32, 2.0f);
  const std::vector<float> l = cm::rope_inv_freq(lin, 64);
  for (int64_t i = 0; i < 32; ++i)
    EXPECT_NEAR(l[static_cast<size_t>(i)], std::pow(10000.0, -static_cast<double>(2 * i) / 64) / 8.0,
                2e-7 * l[static_cast<size_t>(i)]);
}

TEST(Config, CiderJsonRoundTrip) {
  json g = base("Gemma3ForCausalLM");
  g["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  g["sliding_window"] = 33;
  g["final_logit_softcapping"] = 3.3;
  g["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  g["eos_token_id"] = {1, 106};
  cm::ModelConfig c = parse(g);
  c.rope.freq_factors = {1.5f, 0.1f};
  c.rope.freq_factors.resize(static_cast<size_t>(c.head_dim / 2), 1.0f);
  const std::string text = cm::config_to_json(c);
  const cm::ModelConfig back = cm::config_from_json(text, "meta");
  EXPECT_EQ(cm::config_to_json(back), text);
  EXPECT_EQ(back.attn_scale, c.attn_scale);
  EXPECT_EQ(back.embed_scale, c.embed_scale);
  EXPECT_EQ(back.rope.freq_factors, c.rope.freq_factors);
  EXPECT_EQ(back.layer_sliding, c.layer_sliding);
  EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
  EXPECT_THROW(cm::config_from_json("{\"arch\": \"gpt2\"}", "meta"), cider::Error);
  EXPECT_THROW(cm::config_from_json("[]", "meta"), cider::Error);
}

TEST(Config, MlxQuantization) {
  json j = base("LlamaForCausalLM");
  j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"model.layers.0.mlp.down_proj", {{"bits", 8}}},
                       {"lm_head", false}};
  const cm::MlxQuantization q = cm::parse_mlx_quantization(j.dump(), "config.json");
  EXPECT_TRUE(q.present);
  EXPECT_EQ(q.params_for("model.layers.1.mlp.up_proj")->bits, 4);
  EXPECT_EQ(q.params_for("model.layers.0.mlp.down_proj")->bits, 8);
  EXPECT_EQ(q.params_for("model.layers.0.mlp.down_proj")->group_size, 64);
  EXPECT_FALSE(q.params_for("lm_head").has_value());
  EXPECT_FALSE(cm::parse_mlx_quantization(base("LlamaForCausalLM").dump(), "c").present);
  json bad = base("LlamaForCausalLM");
  bad["quantization"] = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}};
  EXPECT_THROW(cm::parse_mlx_quantization(bad.dump(), "c"), cider::Error);
  bad["quantization_config"] = {{"quant_method", "gptq"}};
  bad.erase("quantization");
  try {
    cm::parse_mlx_quantization(bad.dump(), "c");
    ADD_FAILURE();
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("gptq"), std::string::npos);
  }
}

TEST(Config, Rejections) {
  json j = base("GPT2LMHeadModel");
  expect_error(j, ErrorCode::kUnsupported, "GPT2LMHeadModel");
  j = base("Gemma3ForConditionalGeneration");
  expect_error(j, ErrorCode::kUnsupported, "Gemma3ForConditionalGeneration");
  j = base("LlamaForCausalLM");
  j.erase("architectures");
  expect_error(j, ErrorCode::kCorrupt, "model_type");
  j = base("LlamaForCausalLM");
  j.erase("hidden_size");
  expect_error(j, ErrorCode::kCorrupt, "hidden_size");
  j = base("LlamaForCausalLM");
  j["hidden_size"] = "256";
  expect_error(j, ErrorCode::kCorrupt, "hidden_size");
  j = base("LlamaForCausalLM");
  j["num_key_value_heads"] = 3;
  expect_error(j, ErrorCode::kCorrupt, "num_key_value_heads");
  j = base("LlamaForCausalLM");
  j["num_hidden_layers"] = 0;
  expect_error(j, ErrorCode::kCorrupt, "num_hidden_layers");
  j = base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error(j, ErrorCode::kUnsupported, "yarn");
  j = base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error(j, ErrorCode::kCorrupt, "low_freq_factor");
  j = base("LlamaForCausalLM");
  j["hidden_act"] = "relu";
  expect_error(j, ErrorCode::kUnsupported, "relu");
  j = base("LlamaForCausalLM");
  j["torch_dtype"] = "float8_e4m3fn";
  expect_error(j, ErrorCode::kUnsupported, "float8_e4m3fn");
  j = base("LlamaForCausalLM");
  j["partial_rotary_factor"] = 0.5;
  expect_error(j, ErrorCode::kUnsupported, "partial_rotary_factor");
  j = base("Gemma3ForCausalLM");
  j["attn_logit_softcapping"] = 50.0;
  expect_error(j, ErrorCode::kUnsupported, "attn_logit_softcapping");
  j = base("Gemma3ForCausalLM");
  j["layer_types"] = {"sliding_attention"};
  expect_error(j, ErrorCode::kCorrupt, "layer_types");
  j = base("Gemma3ForCausalLM");
  j["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
  expect_error(j, ErrorCode::kUnsupported, "chunked_attention");
  j = base("Gemma3ForCausalLM");
  j["sliding_window"] = 0;
  expect_error(j, ErrorCode::kCorrupt, "sliding_window");
  j = base("LlamaForCausalLM");
  j["eos_token_id"] = 1000;
  expect_error(j, ErrorCode::kCorrupt, "eos_token_id");
  j = base("LlamaForCausalLM");
  j["head_dim"] = 31;
  expect_error(j, ErrorCode::kCorrupt, "head_dim");
  for (const char* text : {"", "{", "[1, 2]", "{\"architectures\": [\"LlamaForCausalLM\"],}"}) {
    try {
      cm::parse_hf_config(text, "config.json");
      ADD_FAILURE() << text;
    } catch (const cider::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(cm::load_hf_config("/nonexistent/dir"), cider::Error);
}

}  // namespace
