// Model configs: HF config.json in both styles for every architecture, generation_config.json, the MLX quantization
// entry, RoPE frequencies against their float64 definitions, cider's JSON round trip, and every rejection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// Gemma 2: the defaults of Gemma2Config where a key is absent (softcaps 50 / 30, even layers sliding, head_dim 256),
// null softcaps as none, query_pre_attn_scalar, and what is refused.
TEST(Config, Gemma2DefaultsNullsAndRejections) {
  json g = base("Gemma2ForCausalLM");
  g["hidden_size"] = 2304;
  g["sliding_window"] = 4096;
  g["query_pre_attn_scalar"] = 144;
  g["torch_dtype"] = "bfloat16";
  const cm::ModelConfig c = parse(g);
  EXPECT_EQ(c.arch, cm::Architecture::kGemma2);
  EXPECT_EQ(c.activation, cm::Activation::kGeluTanh);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.sandwich_norms && c.tie_word_embeddings);
  EXPECT_EQ(c.norm_weight_offset, 1.0f);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.embed_scale, cider::round_to(cider::DType::kBF16, std::sqrt(2304.0f)));
  EXPECT_EQ(c.layer_sliding, (std::vector<uint8_t>{1, 0, 1, 0}));
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.attn_logit_softcap, 50.0f);
  EXPECT_EQ(c.final_logit_softcap, 30.0f);
  EXPECT_EQ(c.attn_scale, static_cast<float>(1.0 / 12.0));
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope_local.theta, 10000.0);

  json n = g;
  n["attn_logit_softcapping"] = nullptr;
  n["final_logit_softcapping"] = 12.5;
  n["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "full_attention"};
  const cm::ModelConfig cn = parse(n);
  EXPECT_EQ(cn.attn_logit_softcap, 0.0f);
  EXPECT_EQ(cn.final_logit_softcap, 12.5f);
  EXPECT_EQ(cn.layer_sliding, (std::vector<uint8_t>{0, 1, 0, 0}));
  json mt = g;
  mt.erase("architectures");
  mt["model_type"] = "gemma2";
  EXPECT_EQ(parse(mt).arch, cm::Architecture::kGemma2);

  // The stored (cider) config keeps the attention softcap; one without the key reads as none.
  const std::string text = cm::config_to_json(c);
  EXPECT_EQ(cm::config_from_json(text, "meta").attn_logit_softcap, 50.0f);
  EXPECT_EQ(cm::config_to_json(cm::config_from_json(text, "meta")), text);
  json stored = json::parse(cm::config_to_json(cn));
  EXPECT_FALSE(stored.contains("attn_logit_softcap"));
  EXPECT_EQ(cm::config_from_json(stored.dump(), "meta").attn_logit_softcap, 0.0f);
  stored["attn_logit_softcap"] = "-1";
  try {
    cm::config_from_json(stored.dump(), "meta");
    ADD_FAILURE() << "a negative stored softcap was accepted";
  } catch (const cider::Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn_logit_softcapping must be positive and finite"), std::string::npos)
        << e.what();
  }

  for (const json& bad : {json(0.0), json(-50.0), json("50")}) {
    json b = g;
    b["attn_logit_softcapping"] = bad;
    expect_error(b, ErrorCode::kCorrupt, "attn_logit_softcapping");
  }
  json fb = g;
  fb["final_logit_softcapping"] = 0.0;
  expect_error(fb, ErrorCode::kCorrupt, "final_logit_softcapping must be a positive number or null; got 0");
  json bi = g;
  bi["use_bidirectional_attention"] = true;
  expect_error(bi, ErrorCode::kUnsupported, "use_bidirectional_attention");
  json nw = g;
  nw.erase("sliding_window");
  expect_error(nw, ErrorCode::kCorrupt, "sliding-window layers need a positive sliding_window");
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
  const std::vector<float> got = cm::rope_inv_freq(r, D, 8192);
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
  const std::vector<float> l = cm::rope_inv_freq(lin, 64, 8192);
  for (int64_t i = 0; i < 32; ++i)
    EXPECT_NEAR(l[static_cast<size_t>(i)], std::pow(10000.0, -static_cast<double>(2 * i) / 64) / 8.0,
                2e-7 * l[static_cast<size_t>(i)]);
}

// The unscaled frequency theta^(−2i/D), rounded to float32 as HF's table is (the scalings start from it).
double plain_freq(double theta, int64_t i, int64_t D) {
  return static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D)));
}

// YaRN as transformers' _compute_yarn_parameters writes it, in double.
std::vector<double> yarn_ref(double theta, double factor, double orig, double beta_fast, double beta_slow,
                             bool truncate, int64_t D) {
  const double pi = std::acos(-1.0);
  const auto dim = static_cast<double>(D);
  auto corr = [&](double rot) { return dim * std::log(orig / (rot * 2 * pi)) / (2 * std::log(theta)); };
  double low = corr(beta_fast), high = corr(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(D - 1));
  if (low == high) high += 0.001;
  std::vector<double> out;
  for (int64_t i = 0; i < D / 2; ++i) {
    const double ramp = std::min(1.0, std::max(0.0, (static_cast<double>(i) - low) / (high - low)));
    const double extrapolation = 1.0 - ramp;
    const double f = plain_freq(theta, i, D);
    out.push_back(f / factor * (1 - extrapolation) + f * extrapolation);
  }
  return out;
}

void expect_freqs(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 2.5e-7 * want[i]) << what << " frequency " << i;  // float32 rounding, twice at most
}

TEST(Config, YarnFrequenciesAndAttentionFactor) {
  json j = base("Qwen3ForCausalLM");  // head_dim 32
  j["rope_theta"] = 1000000.0;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 1024}};
  cm::ModelConfig c = parse(j);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kYarn);
  EXPECT_EQ(c.rope.original_max_position, 1024);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  const auto want = yarn_ref(1e6, 4.0, 1024, 32, 1, true, 32);
  expect_freqs(cm::rope_inv_freq(c.rope, 32, 4096), want, "yarn");
  // Some frequencies kept, some divided by the factor, some between: all three regions are exercised.
  int kept = 0, divided = 0;
  for (int64_t i = 0; i < 16; ++i) {
    const double f = plain_freq(1e6, i, 32), w = want[static_cast<size_t>(i)];
    kept += w == f;
    divided += std::fabs(w - f / 4) < 1e-12 * f;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_LT(kept + divided, 16);

  // Own betas, no truncation, mscale / mscale_all_dim; factor from max_position / original when absent.
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 512}, {"beta_fast", 8.0},
                       {"beta_slow", 0.5}, {"truncate", false}, {"mscale", 1.0}, {"mscale_all_dim", 0.5}};
  c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);  // 4096 / 512
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, (0.1 * std::log(8.0) + 1) / (0.05 * std::log(8.0) + 1));
  expect_freqs(cm::rope_inv_freq(c.rope, 32, 4096), yarn_ref(1e6, 8.0, 512, 8, 0.5, false, 32), "yarn untruncated");
  j["rope_scaling"]["attention_factor"] = 0.75;
  EXPECT_EQ(parse(j).rope.attention_factor, 0.75);
  // beta 0 reads as the default (transformers: `get("beta_fast") or 32`).
  j["rope_scaling"]["beta_fast"] = 0;
  EXPECT_EQ(parse(j).rope.beta_fast, 32.0);
}

TEST(Config, LongRopeFactorsByContextAndAttentionFactor) {
  json j = base("Phi3ForCausalLM");  // head_dim 32
  std::vector<double> shortf, longf;
  for (int i = 0; i < 16; ++i) {
    shortf.push_back(1.0 + 0.1 * i);
    longf.push_back(2.0 + 0.25 * i);
  }
  j["original_max_position_embeddings"] = 1024;
  j["rope_scaling"] = {{"type", "longrope"}, {"short_factor", shortf}, {"long_factor", longf}};
  cm::ModelConfig c = parse(j);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kLongRope);
  EXPECT_EQ(c.rope.original_max_position, 1024);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(1024.0)));  // factor 4096/1024
  std::vector<double> want_short, want_long;
  for (int64_t i = 0; i < 16; ++i) {
    want_short.push_back(plain_freq(10000.0, i, 32) / shortf[static_cast<size_t>(i)]);
    want_long.push_back(plain_freq(10000.0, i, 32) / longf[static_cast<size_t>(i)]);
  }
  expect_freqs(cm::rope_inv_freq(c.rope, 32, 1024), want_short, "longrope at the original context");
  expect_freqs(cm::rope_inv_freq(c.rope, 32, 1025), want_long, "longrope past the original context");
  // The config's own attention_factor wins; "su" is longrope; Phi-3 reads "yarn" as longrope too.
  j["rope_scaling"]["attention_factor"] = 1.25;
  j["rope_scaling"]["type"] = "su";
  c = parse(j);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kLongRope);
  EXPECT_EQ(c.rope.attention_factor, 1.25);
  j["rope_scaling"]["type"] = "yarn";
  EXPECT_EQ(parse(j).rope.scaling, cm::RopeScaling::kLongRope);
  // Without the top-level key Phi3Config's default (4096) applies, over the entry's own value; factor 1: no scaling
  // of the attention.
  j.erase("original_max_position_embeddings");
  j["rope_scaling"].erase("attention_factor");
  j["rope_scaling"]["type"] = "longrope";
  j["rope_scaling"]["original_max_position_embeddings"] = 2048;
  c = parse(j);
  EXPECT_EQ(c.rope.original_max_position, 4096);
  EXPECT_EQ(c.rope.attention_factor, 1.0);
  // Another architecture with "yarn" gets YaRN, and takes the entry's value.
  json q = base("Qwen3ForCausalLM");
  q["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 2048}};
  c = parse(q);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kYarn);
  EXPECT_EQ(c.rope.original_max_position, 2048);
}

TEST(Config, DynamicNtkBaseFromTheContext) {
  json j = base("LlamaForCausalLM");  // max_position_embeddings 4096, head_dim 32
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  const cm::ModelConfig c = parse(j);
  EXPECT_EQ(c.rope.scaling, cm::RopeScaling::kDynamic);
  EXPECT_EQ(c.rope.attention_factor, 1.0);
  std::vector<double> plain, scaled;
  const double base8k = 10000.0 * std::pow(2.0 * 8192 / 4096 - 1.0, 32.0 / 30.0);
  for (int64_t i = 0; i < 16; ++i) {
    plain.push_back(plain_freq(10000.0, i, 32));
    scaled.push_back(plain_freq(base8k, i, 32));
  }
  expect_freqs(cm::rope_inv_freq(c.rope, 32, 4096), plain, "dynamic within max_position_embeddings");
  expect_freqs(cm::rope_inv_freq(c.rope, 32, 8192), scaled, "dynamic at twice max_position_embeddings");
}

TEST(Config, CiderJsonRoundTripOfScaledRope) {
  json j = base("Phi3ForCausalLM");
  j["original_max_position_embeddings"] = 1024;
  j["rope_scaling"] = {{"type", "longrope"},
                       {"short_factor", std::vector<double>(16, 1.5)},
                       {"long_factor", std::vector<double>(16, 3.25)}};
  for (const json& rope : {j["rope_scaling"], json{{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 8.0},
                                                   {"truncate", false}, {"attention_factor", 1.5}}}) {
    j["rope_scaling"] = rope;
    if (rope.contains("rope_type")) j["architectures"] = {"Qwen3ForCausalLM"};
    const cm::ModelConfig c = parse(j);
    const std::string text = cm::config_to_json(c);
    const cm::ModelConfig back = cm::config_from_json(text, "meta");
    EXPECT_EQ(cm::config_to_json(back), text);
    EXPECT_EQ(back.rope.scaling, c.rope.scaling);
    EXPECT_EQ(back.rope.attention_factor, c.rope.attention_factor);
    EXPECT_EQ(back.rope.long_factor, c.rope.long_factor);
    EXPECT_EQ(back.rope.short_factor, c.rope.short_factor);
    EXPECT_EQ(back.rope.truncate, c.rope.truncate);
    EXPECT_EQ(cm::rope_inv_freq(back.rope, 32, 4096), cm::rope_inv_freq(c.rope, 32, 4096));
  }
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
  j["rope_scaling"] = {{"rope_type", "mrope"}, {"factor", 4.0}};
  expect_error(j, ErrorCode::kUnsupported, "mrope");
  j = base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", -4.0}};
  expect_error(j, ErrorCode::kCorrupt, "yarn rope factor must be positive; got -4");
  j = base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 0.0}};
  expect_error(j, ErrorCode::kCorrupt, "attention_factor must be positive; got 0");
  j = base("LlamaForCausalLM");
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 0.5}};
  expect_error(j, ErrorCode::kCorrupt, "dynamic rope factor must be >= 1; got 0.5");
  j = base("LlamaForCausalLM");  // head_dim 32: 16 factors each
  j["rope_scaling"] = {{"rope_type", "longrope"},
                       {"short_factor", std::vector<double>(16, 1.0)},
                       {"long_factor", std::vector<double>(15, 1.0)}};
  expect_error(j, ErrorCode::kCorrupt, "long_factor must have one entry per rotary pair (16); got 15");
  j["rope_scaling"]["long_factor"] = std::vector<double>(16, 1.0);
  j["rope_scaling"]["short_factor"][3] = -1.0;
  expect_error(j, ErrorCode::kCorrupt, "\"short_factor\" entries must be positive finite numbers; got -1");
  j["rope_scaling"].erase("short_factor");
  expect_error(j, ErrorCode::kCorrupt, "needs \"short_factor\" as a list of numbers");
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
  j["partial_rotary_factor"] = 1.25;  // partial rotary is read (0.5 loads: test_model_hf phi4_mini); above 1 is not
  expect_error(j, ErrorCode::kCorrupt, "partial_rotary_factor must be in (0, 1]; got 1.25");
  j["partial_rotary_factor"] = 0.5;
  EXPECT_EQ(cm::parse_hf_config(j.dump(), "config.json").rotary_dim, 16);
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
