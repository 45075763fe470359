// Model hyper-parameters from HF config.json, GGUF metadata and cider's own JSON (see config.h).
#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "model/arch/arch.h"
#include "model/gguf.h"
#include "model/json_brief.h"

namespace cider::model {

using json = nlohmann::json;

namespace {

constexpr const char* kOp = "load_config";

json parse_json(std::string_view text, const std::string& source) {
  check_json_nesting(text.data(), text.data() + text.size(), kOp, source);
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  check(!j.is_discarded(), ErrorCode::kCorrupt, kOp, source, " must be valid JSON; got a parse error");
  check(j.is_object(), ErrorCode::kCorrupt, kOp, source, " must hold a JSON object; got ", j.type_name());
  return j;
}

bool has(const json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }
// j[key], or null when absent (for error messages, whose parts are evaluated even when the check passes).
const json& at_or_null(const json& j, const char* key) {
  static const json kNull;
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

int64_t get_int(const json& j, const char* key, const std::string& source) {
  check(has(j, key), ErrorCode::kCorrupt, kOp, source, " must define \"", key, "\"; it is missing");
  const json& v = j.at(key);
  check(v.is_number_integer(), ErrorCode::kCorrupt, kOp, source, ": \"", key, "\" must be an integer; got ",
        brief(v));
  return v.get<int64_t>();
}
int64_t get_int_or(const json& j, const char* key, int64_t fallback, const std::string& source) {
  return has(j, key) ? get_int(j, key, source) : fallback;
}
// An integer in [lo, hi] (checked before any narrowing).
int get_int_in(const json& j, const char* key, int64_t lo, int64_t hi, const std::string& source) {
  const int64_t v = get_int(j, key, source);
  check(v >= lo && v <= hi, ErrorCode::kCorrupt, kOp, source, ": \"", key, "\" must be in [", lo, ", ", hi,
        "]; got ", v);
  return static_cast<int>(v);
}
int get_int_in_or(const json& j, const char* key, int fallback, int64_t lo, int64_t hi, const std::string& source) {
  return has(j, key) ? get_int_in(j, key, lo, hi, source) : fallback;
}
double get_num(const json& j, const char* key, const std::string& source) {
  check(has(j, key), ErrorCode::kCorrupt, kOp, source, " must define \"", key, "\"; it is missing");
  const json& v = j.at(key);
  check(v.is_number(), ErrorCode::kCorrupt, kOp, source, ": \"", key, "\" must be a number; got ", brief(v));
  return v.get<double>();
}
double get_num_or(const json& j, const char* key, double fallback, const std::string& source) {
  return has(j, key) ? get_num(j, key, source) : fallback;
}
bool get_bool_or(const json& j, const char* key, bool fallback, const std::string& source) {
  if (!has(j, key)) return fallback;
  const json& v = j.at(key);
  check(v.is_boolean(), ErrorCode::kCorrupt, kOp, source, ": \"", key, "\" must be true or false; got ", brief(v));
  return v.get<bool>();
}
std::string get_str_or(const json& j, const char* key, const std::string& fallback, const std::string& source) {
  if (!has(j, key)) return fallback;
  const json& v = j.at(key);
  check(v.is_string(), ErrorCode::kCorrupt, kOp, source, ": \"", key, "\" must be a string; got ", brief(v));
  return v.get<std::string>();
}

// eos_token_id: an int or a list of ints.
std::vector<int32_t> token_ids(const json& v, const char* key, const std::string& source) {
  std::vector<int32_t> ids;
  auto one = [&](const json& e) {
    check(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() <= INT32_MAX, ErrorCode::kCorrupt, kOp,
          source, ": \"", key, "\" must hold non-negative token ids; got ", brief(e));
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  };
  if (v.is_array()) {
    for (const json& e : v) one(e);
  } else {
    one(v);
  }
  return ids;
}

DType parse_dtype_name(const std::string& s, const std::string& source) {
  if (s == "bfloat16") return DType::kBF16;
  if (s == "float16") return DType::kF16;
  if (s == "float32") return DType::kF32;
  fail(ErrorCode::kUnsupported, kOp, source, ": dtype must be bfloat16, float16 or float32; got \"", s, "\"");
}

// What a rope entry's defaults depend on beyond the entry: the config's max_position_embeddings, its top-level
// original_max_position_embeddings (0 = none; transformers lets it override the entry's for llama3/yarn/longrope), and
// whether the architecture reads "su" and "yarn" as longrope (Phi3Config does).
struct RopeContext {
  int64_t max_position = 0;
  int64_t original_max_position = 0;
  bool longrope_aliases = false;
};

// A longrope factor list: head_dim/2 positive finite numbers (the length is checked by validate_config).
std::vector<float> factor_list(const json& r, const char* key, const std::string& source) {
  check(has(r, key) && r.at(key).is_array(), ErrorCode::kCorrupt, kOp, source, ": longrope rope scaling needs \"",
        key, "\" as a list of numbers; got ", brief(at_or_null(r, key)));
  std::vector<float> out;
  for (const json& v : r.at(key)) {
    check(v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>()), ErrorCode::kCorrupt, kOp, source,
          ": longrope \"", key, "\" entries must be positive finite numbers; got ", brief(v));
    out.push_back(static_cast<float>(v.get<double>()));
  }
  return out;
}

// YaRN's attention factor (transformers' get_mscale): 0.1·mscale·ln(scale) + 1, or 1 for scale <= 1.
double yarn_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// One rope entry: {rope_type|type, rope_theta?, factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings, beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate,
// short_factor, long_factor}, read as transformers' _compute_*_parameters read them. `theta` is the base when the
// entry does not carry rope_theta.
RopeConfig parse_rope(const json& r, double theta, const RopeContext& rc, const std::string& source) {
  RopeConfig rope;
  rope.theta = theta;
  if (r.is_null()) return rope;
  check(r.is_object(), ErrorCode::kCorrupt, kOp, source, ": rope parameters must be an object; got ", brief(r));
  rope.theta = get_num_or(r, "rope_theta", theta, source);
  std::string type = get_str_or(r, "rope_type", get_str_or(r, "type", "default", source), source);
  if (type == "su" || (rc.longrope_aliases && type == "yarn")) type = "longrope";
  // llama3 / yarn / longrope: the pre-training context (the config's top-level value first, as transformers'
  // standardize_rope_params has it, then the entry's, then max_position_embeddings).
  auto original_max = [&] {
    const int64_t v = rc.original_max_position > 0
                          ? rc.original_max_position
                          : get_int_or(r, "original_max_position_embeddings", rc.max_position, source);
    check(v > 0, ErrorCode::kCorrupt, kOp, source, ": ", type,
          " rope scaling needs original_max_position_embeddings > 0; got ", v);
    return v;
  };
  // factor, or max_position_embeddings / original_max_position_embeddings when absent or null (yarn, longrope).
  auto factor_or_ratio = [&] {
    return has(r, "factor") ? get_num(r, "factor", source)
                            : static_cast<double>(rc.max_position) / static_cast<double>(rope.original_max_position);
  };
  if (type == "default") {
    rope.scaling = RopeScaling::kNone;
  } else if (type == "linear") {
    rope.scaling = RopeScaling::kLinear;
    rope.factor = get_num(r, "factor", source);
  } else if (type == "llama3") {
    rope.scaling = RopeScaling::kLlama3;
    rope.factor = get_num(r, "factor", source);
    rope.low_freq_factor = get_num(r, "low_freq_factor", source);
    rope.high_freq_factor = get_num(r, "high_freq_factor", source);
    rope.original_max_position = original_max();
    check(rope.high_freq_factor > rope.low_freq_factor && rope.low_freq_factor > 0, ErrorCode::kCorrupt, kOp, source,
          ": llama3 rope scaling needs high_freq_factor > low_freq_factor > 0; got ", brief(r));
  } else if (type == "yarn") {
    rope.scaling = RopeScaling::kYarn;
    rope.original_max_position = original_max();
    rope.factor = factor_or_ratio();
    check(rope.factor > 0 && std::isfinite(rope.factor), ErrorCode::kCorrupt, kOp, source,
          ": yarn rope factor must be positive; got ", rope.factor);
    // beta_fast / beta_slow: 32 / 1 when absent or 0 (transformers: `get("beta_fast") or 32`).
    const double bf = get_num_or(r, "beta_fast", 0.0, source), bs = get_num_or(r, "beta_slow", 0.0, source);
    rope.beta_fast = bf != 0.0 ? bf : 32.0;
    rope.beta_slow = bs != 0.0 ? bs : 1.0;
    check(rope.beta_fast > 0 && rope.beta_slow > 0 && std::isfinite(rope.beta_fast) && std::isfinite(rope.beta_slow),
          ErrorCode::kCorrupt, kOp, source, ": yarn beta_fast and beta_slow must be positive; got ", rope.beta_fast,
          " and ", rope.beta_slow);
    rope.truncate = get_bool_or(r, "truncate", true, source);
    if (has(r, "attention_factor")) {
      rope.attention_factor = get_num(r, "attention_factor", source);
    } else {
      const double mscale = get_num_or(r, "mscale", 0.0, source);
      const double mscale_all_dim = get_num_or(r, "mscale_all_dim", 0.0, source);
      rope.attention_factor = mscale != 0.0 && mscale_all_dim != 0.0
                                  ? yarn_mscale(rope.factor, mscale) / yarn_mscale(rope.factor, mscale_all_dim)
                                  : yarn_mscale(rope.factor, 1.0);
    }
  } else if (type == "longrope") {
    rope.scaling = RopeScaling::kLongRope;
    rope.original_max_position = original_max();
    rope.short_factor = factor_list(r, "short_factor", source);
    rope.long_factor = factor_list(r, "long_factor", source);
    rope.factor = factor_or_ratio();
    check(rope.factor > 0 && std::isfinite(rope.factor), ErrorCode::kCorrupt, kOp, source,
          ": longrope rope factor must be positive; got ", rope.factor);
    rope.attention_factor =
        has(r, "attention_factor")
            ? get_num(r, "attention_factor", source)
            : (rope.factor <= 1.0 ? 1.0
                                  : std::sqrt(1.0 + std::log(rope.factor) /
                                                        std::log(static_cast<double>(rope.original_max_position))));
  } else if (type == "dynamic") {
    rope.scaling = RopeScaling::kDynamic;
    rope.factor = get_num(r, "factor", source);
    rope.original_max_position = rc.max_position;
    check(rope.factor >= 1 && std::isfinite(rope.factor), ErrorCode::kCorrupt, kOp, source,
          ": dynamic rope factor must be >= 1; got ", rope.factor);
  } else {
    fail(ErrorCode::kUnsupported, kOp, source,
         ": rope type must be default, linear, llama3, yarn, longrope (su) or dynamic; got \"", type, "\"");
  }
  // partial_rotary_factor (here or at the top level): read by parse_hf_config.
  check(rope.factor > 0 && std::isfinite(rope.factor), ErrorCode::kCorrupt, kOp, source,
        ": rope factor must be positive; got ", rope.factor);
  check(rope.attention_factor > 0 && std::isfinite(rope.attention_factor), ErrorCode::kCorrupt, kOp, source,
        ": rope attention_factor must be positive; got ", rope.attention_factor);
  check(rope.theta > 0 && std::isfinite(rope.theta), ErrorCode::kCorrupt, kOp, source,
        ": rope_theta must be positive; got ", rope.theta);
  return rope;
}

// config.json as an architecture's hooks read it (arch/arch.h).
class JsonSource final : public ConfigSource {
 public:
  JsonSource(const json& j, const std::string& source) : j_(j), source_(source) {}
  const std::string& source() const override { return source_; }
  bool has(const char* key) const override { return model::has(j_, key); }
  int64_t get_int(const char* key) const override { return model::get_int(j_, key, source_); }
  double get_num(const char* key) const override { return model::get_num(j_, key, source_); }
  bool get_bool(const char* key) const override {
    check(has(key), ErrorCode::kCorrupt, kOp, source_, " must define \"", key, "\"; it is missing");
    return model::get_bool_or(j_, key, false, source_);
  }
  std::string brief(const char* key) const override { return detail::concat(model::brief(at_or_null(j_, key))); }
  bool present(const char* key) const override { return j_.is_object() && j_.contains(key); }
  std::vector<int64_t> get_int_list(const char* key) const override {
    const json& v = at_or_null(j_, key);
    check(v.is_array(), ErrorCode::kCorrupt, kOp, source_, ": ", key, " must be a list of integers; got ", model::brief(v));
    std::vector<int64_t> out;
    for (const json& e : v) {
      check(e.is_number_integer(), ErrorCode::kCorrupt, kOp, source_, ": ", key, " must be a list of integers; got ",
            model::brief(v));
      out.push_back(e.get<int64_t>());
    }
    return out;
  }

 private:
  const json& j_;
  const std::string& source_;
};

// GGUF metadata under "<arch>.", as an architecture's hooks read it.
class GgufSource final : public ConfigSource {
 public:
  GgufSource(const GGUFFile& g, const std::string& prefix, const std::string& source)
      : g_(g), prefix_(prefix), source_(source) {}
  const std::string& source() const override { return source_; }
  bool has(const char* key) const override { return g_.has(prefix_ + key); }
  int64_t get_int(const char* key) const override { return g_.get_int(prefix_ + key); }
  double get_num(const char* key) const override { return g_.get_float(prefix_ + key); }
  bool get_bool(const char* key) const override { return g_.get_int(prefix_ + key) != 0; }
  std::string brief(const char* key) const override {
    const auto it = g_.metadata().find(prefix_ + key);
    if (it == g_.metadata().end()) return "null";
    std::string out;
    for (const GGUFScalar& v : it->second.values) {
      if (!out.empty()) out += ", ";
      std::visit([&](const auto& x) { out += detail::concat(x); }, v);
    }
    if (!it->second.is_array) return out;
    std::string list = "[";
    list += out;
    list += ']';
    return list;
  }

 private:
  const GGUFFile& g_;
  const std::string& prefix_;
  const std::string& source_;
};

const ArchSpec& detect_arch(const json& j, const std::string& source) {
  if (has(j, "architectures")) {
    const json& a = j.at("architectures");
    check(a.is_array() && !a.empty() && a[0].is_string(), ErrorCode::kCorrupt, kOp, source,
          ": \"architectures\" must be a non-empty list of strings; got ", brief(a));
    return arch_by_hf_class(a[0].get<std::string>(), source);
  }
  const std::string name = get_str_or(j, "model_type", "", source);
  check(!name.empty(), ErrorCode::kCorrupt, kOp, source,
        " must define \"architectures\" or \"model_type\"; neither is present");
  return arch_by_model_type(name, source);
}

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim, int64_t ctx, int64_t rotary_dim) {
  if (rotary_dim > 0 && rotary_dim < head_dim) {  // partial: the rotary dims' frequencies, then 0 (not rotated)
    std::vector<float> inv = rope_inv_freq(rope, rotary_dim, ctx);
    inv.resize(static_cast<size_t>(head_dim / 2), 0.0f);
    return inv;
  }
  const int64_t half = head_dim / 2;
  const auto dim = static_cast<double>(head_dim);
  std::vector<float> inv(static_cast<size_t>(half));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  double base = rope.theta;
  if (rope.scaling == RopeScaling::kDynamic && ctx > rope.original_max_position) {
    // transformers' _compute_dynamic_ntk_parameters at seq_len = ctx.
    const double max_pos = static_cast<double>(rope.original_max_position);
    base *= std::pow(rope.factor * static_cast<double>(ctx) / max_pos - (rope.factor - 1.0), dim / (dim - 2.0));
  }
  // YaRN's correction band [low, high] in dimensions (transformers' find_correction_range).
  double yarn_low = 0, yarn_high = 0;
  if (rope.scaling == RopeScaling::kYarn) {
    const double orig = static_cast<double>(rope.original_max_position);
    auto correction_dim = [&](double rotations) {
      return dim * std::log(orig / (rotations * kTwoPi)) / (2.0 * std::log(rope.theta));
    };
    yarn_low = correction_dim(rope.beta_fast);
    yarn_high = correction_dim(rope.beta_slow);
    if (rope.truncate) {
      yarn_low = std::floor(yarn_low);
      yarn_high = std::ceil(yarn_high);
    }
    yarn_low = std::max(yarn_low, 0.0);
    yarn_high = std::min(yarn_high, dim - 1.0);
    if (yarn_low == yarn_high) yarn_high += 0.001;  // transformers: prevents a division by zero
  }
  const std::vector<float>* ext = nullptr;  // longrope's divisors for this context
  if (rope.scaling == RopeScaling::kLongRope)
    ext = ctx > rope.original_max_position ? &rope.long_factor : &rope.short_factor;
  if (ext != nullptr)
    check(static_cast<int64_t>(ext->size()) == half, ErrorCode::kInvalidArgument, "rope_inv_freq",
          "longrope factors must have head_dim/2 = ", half, " entries; got ", ext->size());
  for (int64_t i = 0; i < half; ++i) {
    // HF: 1 / theta^(2i / head_dim), in float32.
    double f = 1.0 / std::pow(base, static_cast<double>(2 * i) / dim);
    f = static_cast<float>(f);
    switch (rope.scaling) {
      case RopeScaling::kNone:
      case RopeScaling::kDynamic: break;
      case RopeScaling::kLinear: f = f / rope.factor; break;
      case RopeScaling::kLlama3: {
        // Wavelengths longer than the pre-training context / low_freq_factor are slowed down by `factor`, shorter
        // than context / high_freq_factor kept, and the band between interpolated smoothly.
        const double old_ctx = static_cast<double>(rope.original_max_position);
        const double low_wavelen = old_ctx / rope.low_freq_factor;
        const double high_wavelen = old_ctx / rope.high_freq_factor;
        const double wavelen = kTwoPi / f;
        if (wavelen > low_wavelen) {
          f = f / rope.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth =
              (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
          f = (1.0 - smooth) * f / rope.factor + smooth * f;
        }
        break;
      }
      case RopeScaling::kYarn: {
        // Dimensions below the band keep their frequency (extrapolation), above it are divided by `factor`
        // (interpolation), a linear ramp between.
        const double ramp = std::clamp((static_cast<double>(i) - yarn_low) / (yarn_high - yarn_low), 0.0, 1.0);
        const double keep = 1.0 - ramp;
        f = (f / rope.factor) * (1.0 - keep) + f * keep;
        break;
      }
      case RopeScaling::kLongRope: f = f / static_cast<double>((*ext)[static_cast<size_t>(i)]); break;
    }
    if (!rope.freq_factors.empty()) f = f / static_cast<double>(rope.freq_factors[static_cast<size_t>(i)]);
    inv[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return inv;
}

const ConfigKeys kHfConfigKeys{"",
                               "vocab_size",
                               "hidden_size",
                               "intermediate_size",
                               "num_hidden_layers",
                               "num_attention_heads",
                               "num_key_value_heads",
                               "head_dim",
                               "max_position_embeddings",
                               "rms_norm_eps",
                               "rope_theta",
                               "rope_scaling.factor"};
const ConfigKeys kCiderConfigKeys{"",         "vocab_size", "hidden_size",  "intermediate_size", "num_layers",
                                  "num_heads", "num_kv_heads", "head_dim", "max_position",      "rms_norm_eps",
                                  "rope.theta", "rope.factor"};
ConfigKeys gguf_config_keys(const std::string& arch) {
  return ConfigKeys{arch + ".",
                    "vocab_size",
                    "embedding_length",
                    "feed_forward_length",
                    "block_count",
                    "attention.head_count",
                    "attention.head_count_kv",
                    "attention.key_length",
                    "context_length",
                    "attention.layer_norm_rms_epsilon",
                    "rope.freq_base",
                    "rope.scaling.factor"};
}

void check_config_sizes(const ModelConfig& c, const std::string& source, const ConfigKeys& keys) {
  auto in_range = [&](int64_t v, int64_t hi, const std::string& key) {
    check(v > 0 && v <= hi, ErrorCode::kCorrupt, kOp, source, ": ", keys.prefix, key, " must be in [1, ", hi,
          "]; got ", v);
  };
  in_range(c.vocab_size, limits::kMaxDim, keys.vocab_size);
  in_range(c.hidden_size, limits::kMaxDim, keys.hidden_size);
  in_range(c.intermediate_size, limits::kMaxDim, keys.intermediate_size);
  in_range(c.num_layers, limits::kMaxLayers, keys.num_layers);
  in_range(c.num_heads, limits::kMaxHeads, keys.num_heads);
  in_range(c.num_kv_heads, limits::kMaxHeads, keys.num_kv_heads);
  in_range(c.head_dim, limits::kMaxHeadDim, keys.head_dim);
  in_range(c.max_position, std::numeric_limits<int32_t>::max(), keys.max_position);
  // Both factors are bounded above, so the products cannot wrap.
  for (auto [heads, key] : {std::pair{c.num_heads, keys.num_heads}, std::pair{c.num_kv_heads, keys.num_kv_heads}})
    check(heads * c.head_dim <= limits::kMaxDim, ErrorCode::kCorrupt, kOp, source, ": ", keys.prefix, key, " × ",
          keys.prefix, keys.head_dim, " must be <= ", limits::kMaxDim, "; got ", heads, " × ", c.head_dim, " = ",
          heads * c.head_dim);
}

void validate_config(const ModelConfig& c, const std::string& source) {
  validate_config(c, source, kHfConfigKeys);
}

void validate_config(const ModelConfig& c, const std::string& source, const ConfigKeys& keys) {
  check_config_sizes(c, source, keys);
  check(c.num_heads % c.num_kv_heads == 0, ErrorCode::kCorrupt, kOp, source, ": ", keys.prefix, keys.num_heads,
        " must be a multiple of ", keys.prefix, keys.num_kv_heads, " = ", c.num_kv_heads, "; got ", c.num_heads);
  check(c.head_dim % 2 == 0, ErrorCode::kCorrupt, kOp, source, ": ", keys.prefix, keys.head_dim,
        " must be even (RoPE pairs); got ", c.head_dim);
  check(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps), ErrorCode::kCorrupt, kOp, source, ": ", keys.prefix,
        keys.rms_norm_eps, " must be positive and finite; got ", c.rms_norm_eps);
  for (const RopeConfig* r : {&c.rope, &c.rope_local}) {
    const char* which = r == &c.rope ? "" : " (local layers)";
    check(r->theta > 0 && std::isfinite(r->theta), ErrorCode::kCorrupt, kOp, source, ": ", keys.prefix,
          keys.rope_theta, which, " must be positive and finite; got ", r->theta);
    check(r->factor > 0 && std::isfinite(r->factor), ErrorCode::kCorrupt, kOp, source, ": ", keys.prefix,
          keys.rope_factor, which, " must be positive and finite; got ", r->factor);
    if (r->scaling == RopeScaling::kLlama3)
      check(std::isfinite(r->high_freq_factor) && r->high_freq_factor > r->low_freq_factor &&
                r->low_freq_factor > 0 && r->original_max_position > 0,
            ErrorCode::kCorrupt, kOp, source,
            ": llama3 rope scaling needs finite high_freq_factor > low_freq_factor > 0 and "
            "original_max_position_embeddings > 0; got ",
            r->high_freq_factor, ", ", r->low_freq_factor, ", ", r->original_max_position);
    for (float f : r->freq_factors)
      check(f > 0 && std::isfinite(f), ErrorCode::kCorrupt, kOp, source,
            ": rope frequency factors must be positive and finite; got ", f);
    check(r->attention_factor > 0 && std::isfinite(r->attention_factor), ErrorCode::kCorrupt, kOp, source,
          ": the rope attention factor", which, " must be positive and finite; got ", r->attention_factor);
    if (r->scaling == RopeScaling::kYarn || r->scaling == RopeScaling::kLongRope ||
        r->scaling == RopeScaling::kDynamic)
      check(r->original_max_position > 0, ErrorCode::kCorrupt, kOp, source,
            ": yarn, longrope and dynamic rope scaling need original_max_position_embeddings > 0; got ",
            r->original_max_position);
    if (r->scaling == RopeScaling::kYarn)
      check(r->beta_fast > 0 && r->beta_slow > 0 && std::isfinite(r->beta_fast) && std::isfinite(r->beta_slow),
            ErrorCode::kCorrupt, kOp, source, ": yarn beta_fast and beta_slow must be positive and finite; got ",
            r->beta_fast, " and ", r->beta_slow);
    if (r->scaling == RopeScaling::kDynamic)
      check(r->factor >= 1, ErrorCode::kCorrupt, kOp, source, ": dynamic rope factor must be >= 1; got ", r->factor);
    if (r->scaling == RopeScaling::kLongRope)
      for (const std::vector<float>* list : {&r->short_factor, &r->long_factor}) {
        check(static_cast<int64_t>(list->size()) == c.rope_dim() / 2, ErrorCode::kCorrupt, kOp, source,
              ": longrope ", list == &r->short_factor ? "short_factor" : "long_factor",
              " must have one entry per rotary pair (", c.rope_dim() / 2, "); got ", list->size());
        for (float f : *list)
          check(f > 0 && std::isfinite(f), ErrorCode::kCorrupt, kOp, source,
                ": longrope factors must be positive and finite; got ", f);
      }
  }
  check(c.rotary_dim == 0 || (c.rotary_dim >= 2 && c.rotary_dim % 2 == 0 && c.rotary_dim < c.head_dim),
        ErrorCode::kCorrupt, kOp, source, ": the rotary dims must be even and in [2, head_dim = ", c.head_dim,
        "), or all of head_dim; got ", c.rotary_dim);
  check(std::isfinite(c.embed_scale) && c.embed_scale > 0, ErrorCode::kCorrupt, kOp, source,
        ": the embedding scale must be positive and finite; got ", c.embed_scale);
  check(std::isfinite(c.norm_weight_offset), ErrorCode::kCorrupt, kOp, source,
        ": the norm weight offset must be finite; got ", c.norm_weight_offset);
  check(static_cast<int64_t>(c.layer_sliding.size()) == c.num_layers, ErrorCode::kCorrupt, kOp, source,
        ": layer types must list one entry per layer (", c.num_layers, "); got ", c.layer_sliding.size());
  bool any_sliding = false;
  for (uint8_t s : c.layer_sliding) any_sliding |= s != 0;
  check(!any_sliding || c.sliding_window > 0, ErrorCode::kCorrupt, kOp, source,
        ": sliding-window layers need a positive sliding_window; got ", c.sliding_window);
  check(c.layer_moe.empty() || static_cast<int64_t>(c.layer_moe.size()) == c.num_layers, ErrorCode::kCorrupt, kOp,
        source, ": the mixture-of-experts layer table must list one entry per layer (", c.num_layers, "); got ",
        c.layer_moe.size());
  if (!c.layer_moe.empty()) {
    check(c.num_experts >= 1 && c.num_experts <= limits::kMaxExperts, ErrorCode::kCorrupt, kOp, source,
          ": the number of experts must be in [1, ", limits::kMaxExperts, "]; got ", c.num_experts);
    check(c.experts_per_token >= 1 && c.experts_per_token <= c.num_experts, ErrorCode::kCorrupt, kOp, source,
          ": num_experts_per_tok must be in [1, the number of experts = ", c.num_experts, "]; got ",
          c.experts_per_token);
    check(c.expert_intermediate_size >= 1 && c.expert_intermediate_size <= limits::kMaxDim, ErrorCode::kCorrupt, kOp,
          source, ": the experts' intermediate size must be in [1, ", limits::kMaxDim, "]; got ",
          c.expert_intermediate_size);
  }
  check(c.layer_linear.empty() || static_cast<int64_t>(c.layer_linear.size()) == c.num_layers, ErrorCode::kCorrupt,
        kOp, source, ": the linear-attention layer table must list one entry per layer (", c.num_layers, "); got ",
        c.layer_linear.size());
  if (c.has_linear_layers()) {
    const ModelConfig::LinearAttention& la = c.linear_attn;
    check(la.num_k_heads > 0 && la.num_v_heads > 0 && la.k_head_dim > 0 && la.v_head_dim > 0 && la.conv_kernel > 0,
          ErrorCode::kUnsupported, kOp, source, ": linear_attention layers need the gated DeltaNet geometry "
          "(linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, "
          "linear_conv_kernel_dim), which this architecture does not read");
    check(la.num_k_heads <= limits::kMaxHeads && la.num_v_heads <= limits::kMaxHeads &&
              la.k_head_dim <= limits::kMaxHeadDim && la.v_head_dim <= limits::kMaxHeadDim && la.conv_kernel <= 64,
          ErrorCode::kCorrupt, kOp, source, ": the linear-attention geometry must stay within ", limits::kMaxHeads,
          " heads of ", limits::kMaxHeadDim, " dims and a kernel of 64; got ", la.num_k_heads, "/", la.num_v_heads,
          " heads of ", la.k_head_dim, "/", la.v_head_dim, ", kernel ", la.conv_kernel);
    check(la.num_v_heads % la.num_k_heads == 0, ErrorCode::kCorrupt, kOp, source,
          ": the value heads of the linear-attention layers must be a multiple of their key heads; got ",
          la.num_v_heads, " and ", la.num_k_heads);
  }
  check(c.shared_expert_intermediate_size == 0 || !c.layer_moe.empty(), ErrorCode::kCorrupt, kOp, source,
        ": a shared expert needs mixture-of-experts layers");
  check(std::isfinite(c.attn_scale) && c.attn_scale > 0, ErrorCode::kCorrupt, kOp, source,
        ": the attention scale must be positive and finite; got ", c.attn_scale);
  check(std::isfinite(c.final_logit_softcap) && c.final_logit_softcap >= 0, ErrorCode::kCorrupt, kOp, source,
        ": final_logit_softcapping must be positive and finite, or absent; got ", c.final_logit_softcap);
  check(std::isfinite(c.clip_qkv) && c.clip_qkv >= 0, ErrorCode::kCorrupt, kOp, source,
        ": clip_qkv must be positive and finite, or absent; got ", c.clip_qkv);
  check(!c.qk_norm_full || c.qk_norm, ErrorCode::kInternal, kOp, source, ": whole-row q/k norms need qk_norm");
  check(std::isfinite(c.attn_logit_softcap) && c.attn_logit_softcap >= 0, ErrorCode::kCorrupt, kOp, source,
        ": attn_logit_softcapping must be positive and finite, or absent; got ", c.attn_logit_softcap);
  for (const RopeConfig* r : {&c.rope, &c.rope_local})
    check(r->freq_factors.empty() || static_cast<int64_t>(r->freq_factors.size()) == c.head_dim / 2,
          ErrorCode::kCorrupt, kOp, source, ": rope frequency factors must have head_dim/2 = ", c.head_dim / 2,
          " entries; got ", r->freq_factors.size());
  for (int32_t id : c.eos_token_ids)
    check(id >= 0 && id < c.vocab_size, ErrorCode::kCorrupt, kOp, source, ": eos_token_id must be in [0, ",
          keys.prefix, keys.vocab_size, " = ", c.vocab_size, "); got ", id);
  check(c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size, ErrorCode::kCorrupt, kOp, source, ": bos_token_id must be < ", keys.prefix,
        keys.vocab_size, " = ", c.vocab_size, "; got ", c.bos_token_id);
}

ModelConfig parse_hf_config(std::string_view json_text, const std::string& source) {
  const json j = parse_json(json_text, source);
  const JsonSource src(j, source);
  ModelConfig c;
  const ArchSpec& arch = detect_arch(j, source);
  const HfRules& rules = arch.hf;
  c.arch = arch.id;
  check(!has(j, "text_config") && !has(j, "vision_config"), ErrorCode::kUnsupported, kOp, source,
        ": multimodal configs (text_config/vision_config) are not supported; use the text-only model");

  c.vocab_size = get_int(j, "vocab_size", source);
  c.hidden_size = get_int(j, "hidden_size", source);
  c.intermediate_size = get_int(j, "intermediate_size", source);
  c.num_layers = get_int(j, "num_hidden_layers", source);
  c.num_heads = get_int(j, "num_attention_heads", source);
  check(c.num_heads > 0, ErrorCode::kCorrupt, kOp, source, ": num_attention_heads must be positive; got ",
        c.num_heads);
  c.num_kv_heads = get_int_or(j, "num_key_value_heads", c.num_heads, source);
  // Defaults as HF's config classes have them.
  c.head_dim = get_int_or(j, "head_dim", rules.head_dim > 0 ? rules.head_dim : c.hidden_size / c.num_heads, source);
  c.max_position = get_int_or(j, "max_position_embeddings", rules.max_position, source);
  c.rms_norm_eps = get_num_or(j, "rms_norm_eps", 1e-6, source);
  if (has(j, "bos_token_id")) {
    auto ids = token_ids(j.at("bos_token_id"), "bos_token_id", source);
    c.bos_token_id = ids.empty() ? -1 : ids[0];
  }
  if (has(j, "eos_token_id")) c.eos_token_ids = token_ids(j.at("eos_token_id"), "eos_token_id", source);
  c.tie_word_embeddings = get_bool_or(j, "tie_word_embeddings", rules.tie_word_embeddings, source);
  c.dtype = parse_dtype_name(get_str_or(j, "dtype", get_str_or(j, "torch_dtype", "bfloat16", source), source),
                             source);

  const std::string act = get_str_or(j, rules.activation_key, rules.activation, source);
  if (act == "silu" || act == "swish") {
    c.activation = Activation::kSiLU;
  } else if (act == "gelu_pytorch_tanh") {
    c.activation = Activation::kGeluTanh;
  } else {
    fail(ErrorCode::kUnsupported, kOp, source, ": activation must be silu or gelu_pytorch_tanh; got \"", act, "\"");
  }

  c.qkv_bias = c.o_bias = get_bool_or(j, "attention_bias", false, source);
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  if (rules.config) rules.config(src, c);

  // RoPE. New style: rope_parameters (flat, or per layer type). Old style: rope_theta + rope_scaling (+ the sliding
  // layers' own base for architectures that have one).
  RopeContext rc;
  rc.max_position = c.max_position;
  rc.original_max_position = get_int_or(j, "original_max_position_embeddings", rules.original_max_position, source);
  rc.longrope_aliases = rules.longrope_aliases;
  auto local_rope = [&] {
    return arch.separate_local_rope
               ? parse_rope(json(), get_num_or(j, rules.local_rope_theta_key, arch.local_rope_theta, source), rc,
                            source)
               : c.rope;
  };
  if (has(j, "rope_parameters")) {
    const json& rp = j.at("rope_parameters");
    check(rp.is_object(), ErrorCode::kCorrupt, kOp, source, ": rope_parameters must be an object; got ", brief(rp));
    if (rp.contains("full_attention") || rp.contains("sliding_attention")) {
      // Per layer type, transformers ignores the top-level original_max_position_embeddings.
      RopeContext nested = rc;
      nested.original_max_position = 0;
      c.rope = parse_rope(rp.value("full_attention", json()), rules.rope_theta, nested, source);
      c.rope_local = parse_rope(rp.value("sliding_attention", json()), 10000.0, nested, source);
    } else {
      c.rope = parse_rope(rp, get_num_or(j, "rope_theta", rules.rope_theta, source), rc, source);
      c.rope_local = local_rope();
    }
  } else {
    c.rope = parse_rope(j.value("rope_scaling", json()), get_num_or(j, "rope_theta", rules.rope_theta, source), rc,
                        source);
    c.rope_local = local_rope();
  }
  // Partial rotary: at the top level (old style, Phi3Config) or inside rope_parameters (new style).
  const json* prf_src = has(j, "partial_rotary_factor") ? &j : nullptr;
  if (!prf_src && has(j, "rope_parameters") && j.at("rope_parameters").is_object() &&
      has(j.at("rope_parameters"), "partial_rotary_factor"))
    prf_src = &j.at("rope_parameters");
  if (prf_src || rules.partial_rotary_factor != 1.0) {
    const double p = prf_src ? get_num(*prf_src, "partial_rotary_factor", source) : rules.partial_rotary_factor;
    check(p > 0 && p <= 1, ErrorCode::kCorrupt, kOp, source, ": partial_rotary_factor must be in (0, 1]; got ", p);
    const auto r = static_cast<int64_t>(static_cast<double>(c.head_dim) * p);  // transformers: int(head_dim · p)
    check(r >= 2 && r % 2 == 0, ErrorCode::kUnsupported, kOp, source,
          ": partial_rotary_factor × head_dim must give an even number of rotary dims >= 2; got ", p, " × ",
          c.head_dim, " = ", r);
    c.rotary_dim = r == c.head_dim ? 0 : r;
  }

  // Which layers use a sliding window (the table is allocated from num_hidden_layers: checked first).
  check_config_sizes(c, source, kHfConfigKeys);
  c.layer_sliding.assign(static_cast<size_t>(c.num_layers), 0);
  const int64_t window = get_int_or(j, "sliding_window", 0, source);
  check(window >= 0, ErrorCode::kCorrupt, kOp, source, ": sliding_window must be >= 0 (0 or null = none); got ", window);
  if (has(j, "layer_types")) {
    const json& lt = j.at("layer_types");
    check(lt.is_array() && static_cast<int64_t>(lt.size()) == c.num_layers, ErrorCode::kCorrupt, kOp, source,
          ": layer_types must be a list of num_hidden_layers = ", c.num_layers, " entries; got ", brief(lt));
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : detail::concat(brief(lt[i]));
      check(t == "full_attention" || t == "sliding_attention" || t == "linear_attention", ErrorCode::kUnsupported,
            kOp, source, ": layer_types entries must be full_attention, sliding_attention or linear_attention; got \"",
            t, "\" at layer ", i);
      c.layer_sliding[i] = t == "sliding_attention";
      if (t == "linear_attention") {
        c.layer_linear.resize(lt.size(), 0);
        c.layer_linear[i] = 1;
      }
    }
  } else if (rules.sliding_layers) {
    rules.sliding_layers(src, window, c);
  }
  bool any_sliding = false;
  for (uint8_t s : c.layer_sliding) any_sliding |= s != 0;
  c.sliding_window = any_sliding ? window : 0;
  validate_config(c, source, kHfConfigKeys);
  return c;
}

void apply_generation_config(ModelConfig& config, std::string_view json_text, const std::string& source) {
  const json j = parse_json(json_text, source);
  if (has(j, "eos_token_id")) config.eos_token_ids = token_ids(j.at("eos_token_id"), "eos_token_id", source);
  if (has(j, "bos_token_id")) {
    auto ids = token_ids(j.at("bos_token_id"), "bos_token_id", source);
    if (!ids.empty()) config.bos_token_id = ids[0];
  }
  for (int32_t id : config.eos_token_ids)
    check(id < config.vocab_size, ErrorCode::kCorrupt, kOp, source, ": eos_token_id must be < vocab_size ",
          config.vocab_size, "; got ", id);
  check(config.bos_token_id < config.vocab_size, ErrorCode::kCorrupt, kOp, source,
        ": bos_token_id must be < vocab_size ", config.vocab_size, "; got ", config.bos_token_id);
}


ModelConfig load_hf_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ModelConfig c = parse_hf_config(read_text_input(path, kOp), path);
  const std::string gen = dir + "/generation_config.json";
  std::ifstream probe(gen);
  if (probe) apply_generation_config(c, read_text_input(gen, kOp), gen);
  return c;
}

// ---- GGUF ----------------------------------------------------------------------------------------------------

ModelConfig config_from_gguf(const GGUFFile& g) {
  const std::string source = g.path();
  const std::string arch = g.get_string("general.architecture");
  const std::string p = arch + ".";
  const int64_t experts = g.has(p + "expert_count") ? g.get_int(p + "expert_count") : 0;
  const ArchSpec* specp = find_arch_by_gguf_name(arch);
  if (experts > 0)  // an architecture whose MoE variant llama.cpp stores under another's name (Mixtral as llama)
    for (const ArchSpec* a : all_archs())
      for (const char* n : a->gguf_moe_names)
        if (arch == n) specp = a;
  const ArchSpec& spec = specp ? *specp : arch_by_gguf_name(arch, source);
  check(experts == 0 || spec.moe.router != nullptr, ErrorCode::kUnsupported, kOp, source, ": ", p,
        "expert_count = ", experts, ": mixture-of-experts ", arch, " GGUF files are not supported");
  ModelConfig c;
  c.arch = spec.id;
  const GgufSource src(g, p, source);
  auto geti = [&](const std::string& k) { return g.get_int(p + k); };
  auto geti_or = [&](const std::string& k, int64_t d) { return g.has(p + k) ? g.get_int(p + k) : d; };
  auto getf_or = [&](const std::string& k, double d) { return g.has(p + k) ? g.get_float(p + k) : d; };

  c.hidden_size = geti("embedding_length");
  c.num_layers = geti("block_count");
  c.intermediate_size = geti("feed_forward_length");
  c.num_heads = geti("attention.head_count");
  check(c.num_heads > 0, ErrorCode::kCorrupt, kOp, source, ": ", p, "attention.head_count must be positive; got ",
        c.num_heads);
  c.num_kv_heads = geti_or("attention.head_count_kv", c.num_heads);
  c.head_dim = geti_or("attention.key_length", c.hidden_size / c.num_heads);
  const int64_t v_len = geti_or("attention.value_length", c.head_dim);
  check(v_len == c.head_dim, ErrorCode::kUnsupported, kOp, source,
        ": value head size must equal the key head size ", c.head_dim, "; got ", v_len);
  c.max_position = geti("context_length");
  c.rms_norm_eps = getf_or("attention.layer_norm_rms_epsilon", 1e-6);
  if (g.has(p + "vocab_size")) {
    c.vocab_size = geti("vocab_size");
  } else if (g.has("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(g.get_string_array("tokenizer.ggml.tokens").size());
  } else if (const GGUFTensor* t = g.find("token_embd.weight"); t && t->shape.size() == 2) {
    c.vocab_size = t->shape[0];
  }
  // Token ids: range-checked before narrowing (validate_config then checks them against the vocabulary).
  auto token_id = [&](const char* key) {
    const int64_t v = g.get_int(key);
    check(v >= 0 && v <= limits::kMaxTokenId, ErrorCode::kCorrupt, kOp, source, ": ", key,
          " must be a token id in [0, ", limits::kMaxTokenId, "]; got ", v);
    return static_cast<int32_t>(v);
  };
  if (g.has("tokenizer.ggml.bos_token_id")) c.bos_token_id = token_id("tokenizer.ggml.bos_token_id");
  if (g.has("tokenizer.ggml.eos_token_id")) c.eos_token_ids.push_back(token_id("tokenizer.ggml.eos_token_id"));
  if (g.has("tokenizer.ggml.eot_token_id")) {
    const auto eot = token_id("tokenizer.ggml.eot_token_id");
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), eot) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(eot);
  }
  c.dtype = DType::kF32;  // GGUF tensors are dequantized to float32 (F16/BF16 ones are exact in it)
  c.tie_word_embeddings = g.find("output.weight") == nullptr;

  c.rope.theta = getf_or("rope.freq_base", spec.gguf.rope_theta);
  if (g.has(p + "rope.dimension_count")) {
    // Partial rotary (rotate_half over the first rd dims, as HF): read where llama.cpp's converter keeps the
    // checkpoint's q/k rows; an architecture whose rows it interleaved for adjacent-pair RoPE is refused.
    const int64_t rd = geti("rope.dimension_count");
    check(rd == c.head_dim || (rd > 0 && rd < c.head_dim && !spec.gguf_qk_interleaved), ErrorCode::kUnsupported, kOp,
          source, ": partial rotary embeddings are not supported for ", arch,
          " GGUF files: rope.dimension_count must equal head_dim ", c.head_dim, "; got ", rd);
    if (rd < c.head_dim) c.rotary_dim = rd;
  }
  // llama.cpp's rope keys: the pre-training context (yarn; Phi-3's longrope, whose factor tensors the loader reads)
  // and an attention factor multiplying cos/sin for every scaling type.
  c.rope.original_max_position = geti_or("rope.scaling.original_context_length", c.max_position);
  const double attn_factor = getf_or("rope.scaling.attn_factor", 1.0);
  c.rope.attention_factor = attn_factor;
  if (g.has(p + "rope.scaling.type")) {
    const std::string t = g.get_string(p + "rope.scaling.type");
    if (t == "linear") {
      c.rope.scaling = RopeScaling::kLinear;
      c.rope.factor = g.get_float(p + "rope.scaling.factor");
    } else if (t == "yarn") {
      // The converter writes HF's factor, original_max_position_embeddings and (when set) beta_fast, beta_slow and
      // attention_factor; yarn_log_multiplier is mscale_all_dim (llama.cpp's rule, mscale 1).
      c.rope.scaling = RopeScaling::kYarn;
      c.rope.factor = g.get_float(p + "rope.scaling.factor");
      check(c.rope.factor > 0 && std::isfinite(c.rope.factor), ErrorCode::kCorrupt, kOp, source, ": ", p,
            "rope.scaling.factor must be positive and finite; got ", c.rope.factor);
      c.rope.beta_fast = getf_or("rope.scaling.yarn_beta_fast", 32.0);
      c.rope.beta_slow = getf_or("rope.scaling.yarn_beta_slow", 1.0);
      const double log_mul = getf_or("rope.scaling.yarn_log_multiplier", 0.0);
      const double yarn_factor =
          g.has(p + "rope.scaling.yarn_attn_factor")
              ? g.get_float(p + "rope.scaling.yarn_attn_factor")
              : (log_mul != 0.0 ? yarn_mscale(c.rope.factor, 1.0) / yarn_mscale(c.rope.factor, log_mul)
                                : yarn_mscale(c.rope.factor, 1.0));
      c.rope.attention_factor = yarn_factor * attn_factor;
    } else if (t == "longrope") {
      c.rope.scaling = RopeScaling::kLongRope;  // the loader fills the factors from rope_factors_long/short
    } else if (t != "none") {
      fail(ErrorCode::kUnsupported, kOp, source, ": rope scaling type must be none, linear, yarn or longrope; got \"",
           t, "\"");
    }
  }
  c.rope_local = c.rope;
  if (spec.separate_local_rope) {
    c.rope_local = RopeConfig{};
    c.rope_local.theta = spec.local_rope_theta;
  }
  const ConfigKeys keys = gguf_config_keys(arch);
  check_config_sizes(c, source, keys);  // before the per-layer table below is allocated from block_count
  c.layer_sliding.assign(static_cast<size_t>(c.num_layers), 0);
  c.attn_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  if (experts > 0) {  // llama.cpp's MoE: the kept probabilities renormalised (its norm_w = true for these)
    c.num_experts = experts;
    c.experts_per_token = geti("expert_used_count");
    c.expert_intermediate_size = geti_or("expert_feed_forward_length", c.intermediate_size);
    c.norm_topk_prob = true;
    // A layer has experts when it has a router (a file may keep dense layers between, as Qwen3-MoE's
    // decoder_sparse_step makes them).
    c.layer_moe.assign(static_cast<size_t>(c.num_layers), 0);
    for (int64_t l = 0; l < c.num_layers; ++l)
      c.layer_moe[static_cast<size_t>(l)] = g.find("blk." + std::to_string(l) + ".ffn_gate_inp.weight") != nullptr;
  }
  // Linear-attention (recurrent) layers: those with a state decay tensor (llama.cpp's ssm_a).
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (g.find("blk." + std::to_string(l) + ".ssm_a") != nullptr) {
      c.layer_linear.resize(static_cast<size_t>(c.num_layers), 0);
      c.layer_linear[static_cast<size_t>(l)] = 1;
    }
  if (spec.gguf.config) spec.gguf.config(src, c);
  validate_config(c, source, keys);
  return c;
}

// ---- cider JSON ------------------------------------------------------------------------------------------------

namespace {
json rope_to_json(const RopeConfig& r) {
  json j;
  j["theta"] = fmt_double(r.theta);
  j["scaling"] = static_cast<int>(r.scaling);
  j["factor"] = fmt_double(r.factor);
  j["low_freq_factor"] = fmt_double(r.low_freq_factor);
  j["high_freq_factor"] = fmt_double(r.high_freq_factor);
  j["original_max_position"] = r.original_max_position;
  auto list = [](const std::vector<float>& v) {
    json a = json::array();
    for (float f : v) a.push_back(fmt_double(f));
    return a;
  };
  j["freq_factors"] = list(r.freq_factors);
  // Written by every cider since yarn/longrope/dynamic were added; optional when read (older files lack them).
  j["attention_factor"] = fmt_double(r.attention_factor);
  j["beta_fast"] = fmt_double(r.beta_fast);
  j["beta_slow"] = fmt_double(r.beta_slow);
  j["truncate"] = r.truncate;
  j["short_factor"] = list(r.short_factor);
  j["long_factor"] = list(r.long_factor);
  return j;
}
double num_from_str(const json& j, const char* key, const std::string& source) {
  check(j.contains(key) && j.at(key).is_string(), ErrorCode::kCorrupt, kOp, source, ": \"", key,
        "\" must be a decimal string");
  const std::string s = j.at(key).get<std::string>();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  check(end && *end == '\0' && !s.empty(), ErrorCode::kCorrupt, kOp, source, ": \"", key,
        "\" must be a decimal number; got \"", s, "\"");
  return v;
}
RopeConfig rope_from_json(const json& j, const std::string& source) {
  check(j.is_object(), ErrorCode::kCorrupt, kOp, source, ": rope must be an object");
  RopeConfig r;
  r.theta = num_from_str(j, "theta", source);
  const int64_t s = get_int(j, "scaling", source);
  check(s >= 0 && s <= static_cast<int64_t>(RopeScaling::kDynamic), ErrorCode::kCorrupt, kOp, source,
        ": rope scaling must be in [0, ", static_cast<int>(RopeScaling::kDynamic), "]; got ", s);
  r.scaling = static_cast<RopeScaling>(s);
  r.factor = num_from_str(j, "factor", source);
  r.low_freq_factor = num_from_str(j, "low_freq_factor", source);
  r.high_freq_factor = num_from_str(j, "high_freq_factor", source);
  r.original_max_position = get_int(j, "original_max_position", source);
  check(j.contains("freq_factors") && j.at("freq_factors").is_array(), ErrorCode::kCorrupt, kOp, source,
        ": rope freq_factors must be a list");
  auto read_list = [&](const char* key, std::vector<float>& out) {
    check(j.at(key).is_array(), ErrorCode::kCorrupt, kOp, source, ": rope ", key, " must be a list");
    for (const json& f : j.at(key)) {
      json one = {{"v", f}};
      out.push_back(static_cast<float>(num_from_str(one, "v", source)));
    }
  };
  read_list("freq_factors", r.freq_factors);
  if (j.contains("attention_factor")) r.attention_factor = num_from_str(j, "attention_factor", source);
  if (j.contains("beta_fast")) r.beta_fast = num_from_str(j, "beta_fast", source);
  if (j.contains("beta_slow")) r.beta_slow = num_from_str(j, "beta_slow", source);
  r.truncate = get_bool_or(j, "truncate", true, source);
  if (j.contains("short_factor")) read_list("short_factor", r.short_factor);
  if (j.contains("long_factor")) read_list("long_factor", r.long_factor);
  return r;
}
}  // namespace

std::string config_to_json(const ModelConfig& c) {
  json j;
  j["arch"] = architecture_name(c.arch);
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_layers"] = c.num_layers;
  j["num_heads"] = c.num_heads;
  j["num_kv_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position"] = c.max_position;
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_ids"] = c.eos_token_ids;
  j["rms_norm_eps"] = fmt_double(c.rms_norm_eps);
  j["norm_weight_offset"] = fmt_double(c.norm_weight_offset);
  j["qkv_bias"] = c.qkv_bias;
  j["o_bias"] = c.o_bias;
  j["mlp_bias"] = c.mlp_bias;
  j["qk_norm"] = c.qk_norm;
  j["sandwich_norms"] = c.sandwich_norms;
  j["activation"] = c.activation == Activation::kSiLU ? "silu" : "gelu_tanh";
  j["attn_scale"] = fmt_double(c.attn_scale);
  j["embed_scale"] = fmt_double(c.embed_scale);
  j["final_logit_softcap"] = fmt_double(c.final_logit_softcap);
  if (c.attn_logit_softcap > 0) j["attn_logit_softcap"] = fmt_double(c.attn_logit_softcap);  // absent: 0
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["rope"] = rope_to_json(c.rope);
  j["rope_local"] = rope_to_json(c.rope_local);
  j["sliding_window"] = c.sliding_window;
  std::vector<int> ls(c.layer_sliding.begin(), c.layer_sliding.end());
  j["layer_sliding"] = ls;
  j["dtype"] = dtype_name(c.dtype);
  if (c.rotary_dim > 0) j["rotary_dim"] = c.rotary_dim;
  if (c.attn_output_gate) j["attn_output_gate"] = true;
  if (c.qk_norm_full) j["qk_norm_full"] = true;
  if (c.clip_qkv > 0) j["clip_qkv"] = fmt_double(c.clip_qkv);
  if (c.has_linear_layers()) {
    const ModelConfig::LinearAttention& la = c.linear_attn;
    j["linear_attention"] = {{"num_k_heads", la.num_k_heads}, {"num_v_heads", la.num_v_heads},
                             {"k_head_dim", la.k_head_dim},   {"v_head_dim", la.v_head_dim},
                             {"conv_kernel", la.conv_kernel}};
    if (la.v_tiled) j["linear_attention"]["v_tiled"] = true;
    j["layer_linear"] = std::vector<int>(c.layer_linear.begin(), c.layer_linear.end());
  }
  if (c.shared_expert_intermediate_size > 0) j["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  if (!c.layer_moe.empty()) {
    j["num_experts"] = c.num_experts;
    j["experts_per_token"] = c.experts_per_token;
    j["expert_intermediate_size"] = c.expert_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["layer_moe"] = std::vector<int>(c.layer_moe.begin(), c.layer_moe.end());
  }
  return j.dump(1);
}

ModelConfig config_from_json(std::string_view json_text, const std::string& source) {
  const json j = parse_json(json_text, source);
  ModelConfig c;
  c.arch = arch_by_name(get_str_or(j, "arch", "", source), source).id;
  c.vocab_size = get_int(j, "vocab_size", source);
  c.hidden_size = get_int(j, "hidden_size", source);
  c.intermediate_size = get_int(j, "intermediate_size", source);
  c.num_layers = get_int(j, "num_layers", source);
  c.num_heads = get_int(j, "num_heads", source);
  c.num_kv_heads = get_int(j, "num_kv_heads", source);
  c.head_dim = get_int(j, "head_dim", source);
  c.max_position = get_int(j, "max_position", source);
  c.bos_token_id = static_cast<int32_t>(get_int(j, "bos_token_id", source));
  check(j.contains("eos_token_ids"), ErrorCode::kCorrupt, kOp, source, " must define eos_token_ids");
  c.eos_token_ids = j.at("eos_token_ids").empty() ? std::vector<int32_t>{}
                                                   : token_ids(j.at("eos_token_ids"), "eos_token_ids", source);
  c.rms_norm_eps = num_from_str(j, "rms_norm_eps", source);
  c.norm_weight_offset = static_cast<float>(num_from_str(j, "norm_weight_offset", source));
  c.qkv_bias = get_bool_or(j, "qkv_bias", false, source);
  c.o_bias = get_bool_or(j, "o_bias", false, source);
  c.mlp_bias = get_bool_or(j, "mlp_bias", false, source);
  c.qk_norm = get_bool_or(j, "qk_norm", false, source);
  c.sandwich_norms = get_bool_or(j, "sandwich_norms", false, source);
  const std::string act = get_str_or(j, "activation", "", source);
  check(act == "silu" || act == "gelu_tanh", ErrorCode::kCorrupt, kOp, source,
        ": activation must be silu or gelu_tanh; got \"", act, "\"");
  c.activation = act == "silu" ? Activation::kSiLU : Activation::kGeluTanh;
  c.attn_scale = static_cast<float>(num_from_str(j, "attn_scale", source));
  c.embed_scale = static_cast<float>(num_from_str(j, "embed_scale", source));
  c.final_logit_softcap = static_cast<float>(num_from_str(j, "final_logit_softcap", source));
  if (j.contains("attn_logit_softcap"))
    c.attn_logit_softcap = static_cast<float>(num_from_str(j, "attn_logit_softcap", source));
  c.tie_word_embeddings = get_bool_or(j, "tie_word_embeddings", false, source);
  check(j.contains("rope") && j.contains("rope_local"), ErrorCode::kCorrupt, kOp, source,
        " must define rope and rope_local");
  c.rope = rope_from_json(j.at("rope"), source);
  c.rope_local = rope_from_json(j.at("rope_local"), source);
  c.sliding_window = get_int(j, "sliding_window", source);
  check(j.contains("layer_sliding") && j.at("layer_sliding").is_array(), ErrorCode::kCorrupt, kOp, source,
        " must define layer_sliding as a list");
  check_config_sizes(c, source, kCiderConfigKeys);
  for (const json& s : j.at("layer_sliding")) {
    check(s.is_number_integer(), ErrorCode::kCorrupt, kOp, source, ": layer_sliding entries must be 0 or 1");
    c.layer_sliding.push_back(s.get<int>() != 0);
  }
  const std::string dt = get_str_or(j, "dtype", "", source);
  if (dt == "float32") c.dtype = DType::kF32;
  else if (dt == "float16") c.dtype = DType::kF16;
  else if (dt == "bfloat16") c.dtype = DType::kBF16;
  else fail(ErrorCode::kCorrupt, kOp, source, ": dtype must be float32, float16 or bfloat16; got \"", dt, "\"");
  c.rotary_dim = get_int_or(j, "rotary_dim", 0, source);
  if (has(j, "layer_moe")) {
    check(j.at("layer_moe").is_array() && static_cast<int64_t>(j.at("layer_moe").size()) == c.num_layers,
          ErrorCode::kCorrupt, kOp, source, ": layer_moe must list num_layers = ", c.num_layers, " entries");
    for (const json& s : j.at("layer_moe")) {
      check(s.is_number_integer(), ErrorCode::kCorrupt, kOp, source, ": layer_moe entries must be 0 or 1");
      c.layer_moe.push_back(s.get<int>() != 0);
    }
    c.num_experts = get_int(j, "num_experts", source);
    c.experts_per_token = get_int(j, "experts_per_token", source);
    c.expert_intermediate_size = get_int(j, "expert_intermediate_size", source);
    c.norm_topk_prob = get_bool_or(j, "norm_topk_prob", true, source);
  }
  c.attn_output_gate = get_bool_or(j, "attn_output_gate", false, source);
  c.qk_norm_full = get_bool_or(j, "qk_norm_full", false, source);
  if (j.contains("clip_qkv")) c.clip_qkv = static_cast<float>(num_from_str(j, "clip_qkv", source));
  c.shared_expert_intermediate_size = get_int_or(j, "shared_expert_intermediate_size", 0, source);
  if (has(j, "layer_linear")) {
    check(j.at("layer_linear").is_array() && static_cast<int64_t>(j.at("layer_linear").size()) == c.num_layers,
          ErrorCode::kCorrupt, kOp, source, ": layer_linear must list num_layers = ", c.num_layers, " entries");
    for (const json& s : j.at("layer_linear")) {
      check(s.is_number_integer(), ErrorCode::kCorrupt, kOp, source, ": layer_linear entries must be 0 or 1");
      c.layer_linear.push_back(s.get<int>() != 0);
    }
    check(has(j, "linear_attention") && j.at("linear_attention").is_object(), ErrorCode::kCorrupt, kOp, source,
          " must define linear_attention (an object) with layer_linear");
    const json& la = j.at("linear_attention");
    c.linear_attn.num_k_heads = get_int(la, "num_k_heads", source);
    c.linear_attn.num_v_heads = get_int(la, "num_v_heads", source);
    c.linear_attn.k_head_dim = get_int(la, "k_head_dim", source);
    c.linear_attn.v_head_dim = get_int(la, "v_head_dim", source);
    c.linear_attn.conv_kernel = get_int(la, "conv_kernel", source);
    c.linear_attn.v_tiled = get_bool_or(la, "v_tiled", false, source);
  }
  validate_config(c, source, kCiderConfigKeys);
  return c;
}

// ---- MLX quantization -------------------------------------------------------------------------------------------

std::optional<MlxQuantParams> MlxQuantization::params_for(const std::string& module) const {
  auto it = overrides.find(module);
  if (it != overrides.end()) return it->second;
  return defaults;
}

MlxQuantization parse_mlx_quantization(std::string_view config_json_text, const std::string& source) {
  const json j = parse_json(config_json_text, source);
  MlxQuantization q;
  const char* key = has(j, "quantization") ? "quantization" : (has(j, "quantization_config") ? "quantization_config"
                                                                                             : nullptr);
  if (!key) return q;
  const json& qj = j.at(key);
  check(qj.is_object(), ErrorCode::kCorrupt, kOp, source, ": \"", key, "\" must be an object; got ", brief(qj));
  // HF-style quantization configs (GPTQ, AWQ, bitsandbytes, fp8 …) carry quant_method; MLX's never do.
  check(!has(qj, "quant_method"), ErrorCode::kUnsupported, kOp, source, ": quantization method \"",
        brief(at_or_null(qj, "quant_method")), "\" is not supported; only MLX affine quantization is");
  const std::string mode = get_str_or(qj, "mode", "affine", source);
  check(mode == "affine", ErrorCode::kUnsupported, kOp, source,
        ": MLX quantization mode must be affine; got \"", mode, "\"");
  q.present = true;
  // MLX: bits 2..8, group sizes 32/64/128 (the loader names the supported set); wider values are never narrowed.
  q.defaults.group_size = get_int_in(qj, "group_size", 1, 1 << 16, source);
  q.defaults.bits = get_int_in(qj, "bits", 1, 32, source);
  for (auto it = qj.begin(); it != qj.end(); ++it) {
    const std::string& k = it.key();
    if (k == "group_size" || k == "bits" || k == "mode") continue;
    const json& v = it.value();
    if (v.is_boolean()) {
      if (!v.get<bool>()) q.overrides[k] = std::nullopt;
      else q.overrides[k] = q.defaults;
    } else if (v.is_object()) {
      const std::string m = get_str_or(v, "mode", "affine", source);
      check(m == "affine", ErrorCode::kUnsupported, kOp, source, ": MLX quantization mode of ", k,
            " must be affine; got \"", m, "\"");
      MlxQuantParams p;
      p.group_size = get_int_in_or(v, "group_size", q.defaults.group_size, 1, 1 << 16, source);
      p.bits = get_int_in_or(v, "bits", q.defaults.bits, 1, 32, source);
      q.overrides[k] = p;
    } else {
      fail(ErrorCode::kCorrupt, kOp, source, ": quantization override \"", k,
           "\" must be an object or a boolean; got ", brief(v));
    }
  }
  return q;
}

}  // namespace cider::model
