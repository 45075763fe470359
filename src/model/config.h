// cider/model/config.h — reading a model's hyper-parameters (ModelConfig, model/model.h) from every format cider
// loads, and writing them back for cider-converted models.
//
//   * Hugging Face config.json, old style (rope_theta, rope_scaling {rope_type|type: default, linear, llama3},
//     torch_dtype) and new style (rope_parameters — flat, or keyed by layer type for Gemma 3 —, dtype, layer_types),
//     plus generation_config.json (eos_token_id: int or list; it overrides config.json's).
//   * GGUF metadata: general.architecture (llama, qwen2, qwen3, gemma3) and the "<arch>.*" keys.
// The architecture comes from the registry (model/arch/arch.h): these readers read the keys every architecture shares
// and leave the rest (defaults, flags, sliding layers) to the architecture's rules.
//   * cider's own JSON (config_to_json / config_from_json), stored in converted files.
// Every unsupported value (architecture, rope type, activation, attention softcapping, …) is a cider::Error
// (kUnsupported) naming it; a missing or malformed required key is kCorrupt naming the key and the file.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "model/model.h"

namespace cider::model {

class GGUFFile;

// Parses the text of a config.json. `source` names the file in errors. Validates the geometry (positive sizes,
// heads divisible by KV heads, layer types of the right length, …).
ModelConfig parse_hf_config(std::string_view json_text, const std::string& source);
// Applies a generation_config.json: its eos_token_id (int or list) and bos_token_id replace the config's.
void apply_generation_config(ModelConfig& config, std::string_view json_text, const std::string& source);
// config.json (required) and generation_config.json (optional) of a directory.
ModelConfig load_hf_config(const std::string& dir);

// From GGUF metadata. The caller adds what lives in tensors (tied embeddings, llama3 rope factors).
ModelConfig config_from_gguf(const GGUFFile& gguf);

// The names a format gives the geometry keys, so an error names the key the user can find in the file
// ("num_hidden_layers" in config.json, "gemma3.block_count" in a GGUF file, "num_layers" in cider's JSON).
struct ConfigKeys {
  std::string prefix;  // GGUF: "<arch>."
  const char* vocab_size;
  const char* hidden_size;
  const char* intermediate_size;
  const char* num_layers;
  const char* num_heads;
  const char* num_kv_heads;
  const char* head_dim;
  const char* max_position;
  const char* rms_norm_eps;
  const char* rope_theta;
  const char* rope_factor;
};
extern const ConfigKeys kHfConfigKeys;
extern const ConfigKeys kCiderConfigKeys;
ConfigKeys gguf_config_keys(const std::string& arch);

// Every size within its limit (core/limits.h): called as soon as the sizes are read, before anything is allocated
// from them (per-layer tables), and again by validate_config.
void check_config_sizes(const ModelConfig& c, const std::string& source, const ConfigKeys& keys);

// Checks the invariants every loader relies on (sizes within limits, GQA ratio, layer_sliding length, finite rope
// and scales, token ids below the vocabulary …); kCorrupt naming `source` and the key (as `keys` spells it) otherwise.
void validate_config(const ModelConfig& c, const std::string& source, const ConfigKeys& keys);
void validate_config(const ModelConfig& c, const std::string& source);  // with the HF key names

// cider's JSON form of a ModelConfig (every field), round-tripping exactly (floats as their decimal with enough digits).
std::string config_to_json(const ModelConfig& c);
ModelConfig config_from_json(std::string_view json_text, const std::string& source);

// MLX affine quantization of a checkpoint (config.json "quantization", or "quantization_config").
struct MlxQuantParams {
  int group_size = 64;
  int bits = 4;
};
struct MlxQuantization {
  bool present = false;
  MlxQuantParams defaults;
  // Per-module overrides keyed by module path ("model.layers.3.mlp.down_proj"): params, or nullopt = not quantized.
  std::map<std::string, std::optional<MlxQuantParams>> overrides;
  // The params of a module (the override if listed, else the defaults).
  std::optional<MlxQuantParams> params_for(const std::string& module) const;
};
MlxQuantization parse_mlx_quantization(std::string_view config_json_text, const std::string& source);

}  // namespace cider::model
