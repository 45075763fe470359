// Fuzz harness: the input as the text of a config file -> parse_hf_config (config.json), parse_mlx_quantization,
// config_from_json (cider's own format, stored in converted models) and apply_generation_config on a valid config,
// each in its own try. A config that parses must round-trip through config_to_json / config_from_json.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_common.h"
#include "model/config.h"

namespace {

using cider::model::ModelConfig;

using cider::fuzz::require;

void round_trip(const ModelConfig& c) {
  cider::fuzz::expect_success("config_from_json(config_to_json(c)) of a parsed config", [&] {
    const std::string j = cider::model::config_to_json(c);
    const ModelConfig back = cider::model::config_from_json(j, "round trip");
    require(cider::model::config_to_json(back) == j, "config_to_json(config_from_json(j)) == j");
  });
}

// A valid Hugging Face config (cider-tiny's geometry, inline so the harness needs no files).
const ModelConfig& base_config() {
  static const ModelConfig c = cider::model::parse_hf_config(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 256,
    "intermediate_size": 768, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 64, "max_position_embeddings": 1024, "rms_norm_eps": 1e-05, "bos_token_id": 0, "eos_token_id": 1,
    "hidden_act": "silu", "tie_word_embeddings": true, "dtype": "bfloat16",
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})",
                                                               "base config");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  std::optional<ModelConfig> hf;
  cider::fuzz::expect_errors([&] { hf = cider::model::parse_hf_config(text, "config.json"); });
  if (hf) round_trip(*hf);

  cider::fuzz::expect_errors([&] {
    const cider::model::MlxQuantization q = cider::model::parse_mlx_quantization(text, "config.json");
    (void)q.params_for("model.layers.0.mlp.down_proj");
    for (const auto& [module, params] : q.overrides) {
      const auto p = q.params_for(module);
      require(p.has_value() == params.has_value(), "params_for(an override) is that override");
    }
  });

  std::optional<ModelConfig> own;
  cider::fuzz::expect_errors([&] { own = cider::model::config_from_json(text, "metadata config"); });
  if (own) round_trip(*own);

  ModelConfig c = base_config();
  bool applied = false;
  cider::fuzz::expect_errors([&] {
    cider::model::apply_generation_config(c, text, "generation_config.json");
    applied = true;
  });
  // load_hf_config returns the config as apply_generation_config left it: it must still pass validate_config, which
  // "checks the invariants every loader relies on".
  if (applied)
    cider::fuzz::expect_success("validate_config after apply_generation_config",
                                [&] { cider::model::validate_config(c, "generation_config.json"); });
  return 0;
}
