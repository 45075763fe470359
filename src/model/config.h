// cider/model/config.h — reading a model's hyper-parameters (ModelConfig, model/model.h) from every format cider
// loads, and writing them back for cider-converted models.
//
//   * Hugging Face config.json, old style (rope_theta, rope_scaling {rope_type|type: default, linear, llama3},
//     torch_dtype) and new style (rope_parameters — flat, or keyed by layer type for Gemma 3 —, dtype, layer_types),
//     plus generation_config.json (eos_token_id: int or list; it overrides config.json's).
//   * GGUF metadata: general.architecture (llama, qwen2, qwen3, gemma3) and the "<arch>.*" keys.
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

// Checks the invariants every loader relies on (positive sizes, GQA ratio, layer_sliding length, …); kCorrupt naming
// `source` otherwise.
void validate_config(const ModelConfig& c, const std::string& source);

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

// Reads a whole text file (kIo naming the path if it cannot).
std::string read_text_file(const std::string& path);

}  // namespace cider::model
