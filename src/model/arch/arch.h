// cider/model/arch/arch.h — the architecture registry: everything cider knows about one model family, in one place.
//
// Each supported architecture is one file in src/model/arch/ defining one ArchSpec (its names in every format, the
// rules that turn its config into ModelConfig flags, its GGUF tensor naming, its default chat format), listed once in
// registry.cpp. The generic readers (config.cpp, loader.cpp, chat_format.cpp) read what every architecture shares and
// ask the spec for the rest; none of them branches on the architecture.
//
// ArchSpec's defaults are the Llama family's rules, so an architecture that is "Llama plus differences" sets only its
// names and what differs; the members without a default (id, name, HF names, hf) must be set (-Wextra warns when one
// is left out). The hooks are plain function pointers (nullptr = nothing beyond the common rules), so every spec is a
// constant (constinit) initialised before any code runs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/chat_format.h"
#include "model/model.h"

namespace cider::model {

// The operation named by errors of config reading, including the registry lookups below.
inline constexpr const char* kConfigOp = "load_config";

// Read access to one config source for an architecture's hooks: config.json (keys as written) or GGUF metadata (keys
// under "<general.architecture>.", added by the source). Getters check the value's type; their errors name the key
// and the file.
class ConfigSource {
 public:
  virtual ~ConfigSource() = default;
  virtual const std::string& source() const = 0;        // the file, for error messages
  virtual bool has(const char* key) const = 0;          // present (and, in JSON, not null)
  virtual int64_t get_int(const char* key) const = 0;   // required
  virtual double get_num(const char* key) const = 0;    // required; any number
  virtual bool get_bool(const char* key) const = 0;     // required
  virtual std::string brief(const char* key) const = 0;  // the value as an error message quotes it ("null" if absent)
  // Written in the source at all, null included (config.json: a key set to null is present but not has(); HF config
  // classes give an absent key its default and a null one None). GGUF metadata has no null: as has().
  virtual bool present(const char* key) const { return has(key); }
  // A list of integers (required); sources without lists (GGUF metadata here) fail with kUnsupported.
  virtual std::vector<int64_t> get_int_list(const char* key) const;
  int64_t get_int_or(const char* key, int64_t fallback) const { return has(key) ? get_int(key) : fallback; }
  double get_num_or(const char* key, double fallback) const { return has(key) ? get_num(key) : fallback; }
  bool get_bool_or(const char* key, bool fallback) const { return has(key) ? get_bool(key) : fallback; }
};

// Sets the architecture's flags on a config whose common keys are read (see HfRules / GgufRules for when).
using ConfigHook = void (*)(const ConfigSource& src, ModelConfig& c);
// Marks config.json's sliding-window layers (c.layer_sliding, all 0 on entry) when it has no layer_types; `window` is
// its sliding_window (0 when absent).
using SlidingLayersHook = void (*)(const ConfigSource& src, int64_t window, ModelConfig& c);
using HasTokenFn = std::function<bool(std::string_view)>;

// config.json. The generic reader reads the geometry, eos/bos, dtype, the activation (activation_key, default
// `activation`), attention_bias (q/k/v/o biases), the query scale head_dim^−½, then calls `config`; then the RoPE
// (rope_theta defaulting to `rope_theta`) and sliding_window, layer_types or else `sliding_layers`.
struct HfRules {
  int64_t head_dim = 0;      // head_dim when absent; 0 = hidden_size / num_attention_heads
  int64_t max_position = 0;  // max_position_embeddings when absent (required: as the HF config class has it)
  bool tie_word_embeddings = false;
  const char* activation_key = "hidden_act";
  const char* activation = "silu";
  double rope_theta = 10000.0;
  // ArchSpec::separate_local_rope: the key of the sliding layers' RoPE base (default ArchSpec::local_rope_theta).
  const char* local_rope_theta_key = nullptr;
  // original_max_position_embeddings when config.json has none at the top level (Phi3Config: 4096); 0 = none. A
  // top-level value overrides the rope entry's for llama3 / yarn / longrope, as transformers does.
  int64_t original_max_position = 0;
  bool longrope_aliases = false;  // rope types "su" and "yarn" mean longrope (Phi3Config)
  double partial_rotary_factor = 1.0;  // when config.json has none (Qwen3NextConfig: 0.25)
  ConfigHook config = nullptr;
  SlidingLayersHook sliding_layers = nullptr;  // nullptr: no sliding layers without layer_types
};

// GGUF metadata ("<arch>.*" keys). The generic reader reads the geometry, token ids, the RoPE (rope.freq_base
// defaulting to `rope_theta`), sets the query scale head_dim^−½ and no sliding layers, then calls `config`.
struct GgufRules {
  double rope_theta = 10000.0;
  ConfigHook config = nullptr;
};

// One per-layer tensor of the GGUF naming: "model.layers.N.<hf>" is "blk.N.<gguf>".
struct TensorName {
  const char* hf;
  const char* gguf;
};

// Mixture-of-experts tensor names under "model.layers.N.": the router "<router>.weight" and expert e's
// "<experts><e>.<gate|up|down>.weight" (nullptr router: a dense architecture).
struct MoeNames {
  const char* router = nullptr;
  const char* experts = nullptr;
  const char* gate = nullptr;
  const char* up = nullptr;
  const char* down = nullptr;
};

// config.json keys of a mixture-of-experts architecture, read by moe_config (registry.cpp) into ModelConfig.
void moe_config(const ConfigSource& src, const char* experts_key, const char* intermediate_key, ModelConfig& c);

// A checkpoint projection holding several of the engine's linear layers stacked by output rows (Phi-3's
// "self_attn.qkv_proj" = q | k | v, "mlp.gate_up_proj" = gate | up): the loader splits it into views of whole rows, so
// every weight format (float, MLX, GGUF blocks) splits without re-encoding. Module names under "model.layers.N.";
// a file that stores the parts themselves (cider-converted, some GGUF files) is read as it is.
struct FusedLinear {
  const char* fused;
  std::span<const char* const> parts;  // the engine's modules in row order ("self_attn.q_proj", ...)
};

struct ArchSpec {
  Architecture id;
  const char* name;  // cider's name: messages, `cider info`, the config stored in converted files
  std::span<const char* const> hf_classes;      // config.json "architectures"[0]
  std::span<const char* const> hf_model_types;  // config.json "model_type" (used when "architectures" is absent)
  std::span<const char* const> gguf_names = {};  // general.architecture values read as this one (may be none)
  HfRules hf;
  GgufRules gguf = {};
  // Sliding-window layers have their own RoPE: unscaled, base local_rope_theta (HfRules::local_rope_theta_key in
  // config.json); GGUF rope_freqs apply to the full layers only. Otherwise both kinds of layer share one RoPE.
  bool separate_local_rope = false;
  double local_rope_theta = 10000.0;
  // GGUF per-layer tensor names that differ from kCommonGgufLayerTensors (searched first).
  std::span<const TensorName> gguf_layer_tensors = {};
  // llama.cpp's converter interleaved each head's halves in the rows of attn_q / attn_k (for its adjacent-pair
  // RoPE); the loader undoes it.
  bool gguf_qk_interleaved = false;
  std::span<const FusedLinear> fused_linears = {};
  MoeNames moe = {};
  // general.architecture values read as this architecture when the GGUF file has experts (<arch>.expert_count > 0):
  // llama.cpp stores Mixtral as "llama".
  std::span<const char* const> gguf_moe_names = {};
  // The default chat format; when unset, chat_format_by_vocab decides from the tokenizer's vocabulary.
  std::optional<ChatFormat> chat_format = std::nullopt;
  ChatFormat (*chat_format_by_vocab)(const HasTokenFn& has_token) = nullptr;
};

// The per-layer GGUF tensor names shared by every architecture (llama.cpp's names for the Llama layout).
extern const std::span<const TensorName> kCommonGgufLayerTensors;

// Every registered architecture, in registry order.
std::span<const ArchSpec* const> all_archs();

// The spec of an Architecture value; kInternal for a value without one.
const ArchSpec& arch_spec(Architecture a);

// Lookups by name; nullptr when no architecture has it.
const ArchSpec* find_arch_by_name(std::string_view name);
const ArchSpec* find_arch_by_hf_class(std::string_view hf_class);
const ArchSpec* find_arch_by_model_type(std::string_view model_type);
const ArchSpec* find_arch_by_gguf_name(std::string_view gguf_name);

// The same, failing with kUnsupported ("[load_config] <source>: architecture "X" is not supported; supported: ...",
// listing the names of that kind) when no architecture has the name.
const ArchSpec& arch_by_name(std::string_view name, const std::string& source);
const ArchSpec& arch_by_hf_class(std::string_view hf_class, const std::string& source);
const ArchSpec& arch_by_model_type(std::string_view model_type, const std::string& source);
const ArchSpec& arch_by_gguf_name(std::string_view gguf_name, const std::string& source);

// GGUF name of an HF-named tensor ("model.layers.3.self_attn.q_proj.weight" → "blk.3.attn_q.weight"); names without
// a GGUF counterpart are returned unchanged.
std::string gguf_tensor_name(const ArchSpec& spec, const std::string& hf);

// The default chat format of an architecture (chat_format, or chat_format_by_vocab).
ChatFormat arch_chat_format(const ArchSpec& spec, const HasTokenFn& has_token);

// Rules shared by several architectures, defined in the file of the architecture that introduced them.
// Qwen3-Next's hybrid layers (Qwen3.5 too): the gated DeltaNet geometry (linear_num_key_heads, linear_num_value_heads,
// linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim), gated attention, q/k norms and (1 + w) norms.
// Which layers are linear comes from layer_types (config.cpp).
void hybrid_config(const ConfigSource& src, ModelConfig& c);
// The same from GGUF metadata (the ssm.* keys; arch/qwen3_next.cpp), for "qwen3next" and "qwen35".
void hybrid_gguf_config(const ConfigSource& src, ModelConfig& c);
// Qwen2's sliding layers: use_sliding_window and a positive window make layers max_window_layers.. sliding.
void qwen2_sliding_layers(const ConfigSource& src, int64_t window, ModelConfig& c);

}  // namespace cider::model
