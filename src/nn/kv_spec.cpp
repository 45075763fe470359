// The KV cache format and its rules (nn/kv_spec.h).
#include "nn/kv_spec.h"

#include <algorithm>

#include "core/error.h"
#include "quant/affine.h"

namespace cider::nn {

int auto_key_outliers(int64_t Dk) {
  return static_cast<int>(std::clamp<int64_t>(Dk / 32, 1, std::min<int64_t>(kMaxKeyOutliers, std::max<int64_t>(1, Dk / 2))));
}

bool is_kv_bits(int bits) { return quant::is_affine_bits(bits); }
bool is_kv_group_size(int group_size) { return quant::is_affine_group_size(group_size); }

void KVSpec::validate(const char* op) const {
  if (quantized) {
    check(is_kv_bits(k_bits), ErrorCode::kInvalidArgument, op, "k_bits must be one of 2, 3, 4, 5, 6, 8; got ", k_bits);
    check(is_kv_bits(v_bits), ErrorCode::kInvalidArgument, op, "v_bits must be one of 2, 3, 4, 5, 6, 8; got ", v_bits);
    check(is_kv_group_size(group_size), ErrorCode::kInvalidArgument, op, "group_size must be one of 32, 64, 128; got ",
          group_size);
    check(is_float_dtype(scale_dtype), ErrorCode::kInvalidArgument, op,
          "scale_dtype must be float32, float16 or bfloat16; got ", dtype_name(scale_dtype));
  } else {
    check(is_float_dtype(plain_dtype), ErrorCode::kInvalidArgument, op,
          "a plain cache's dtype must be float32, float16 or bfloat16; got ", dtype_name(plain_dtype));
  }
  check(is_rotation_kind(rotation), ErrorCode::kInvalidArgument, op,
        "rotation must be none, so4-fast, so4-full or hadamard; got ", static_cast<int>(rotation));
  check(key_layout == KeyLayout::kToken || key_layout == KeyLayout::kChannel, ErrorCode::kInvalidArgument, op,
        "key_layout must be token or channel; got ", static_cast<int>(key_layout));
  check(quantized || key_layout == KeyLayout::kToken, ErrorCode::kInvalidArgument, op,
        "the channel key layout is a quantized layout; a plain cache (", dtype_name(plain_dtype),
        ") stores keys per position (key_layout token)");
  check(key_outliers >= 0 && key_outliers <= kMaxKeyOutliers, ErrorCode::kInvalidArgument, op,
        "key_outliers must be in [0, ", kMaxKeyOutliers, "]; got ", key_outliers);
  check(key_outliers == 0 || (quantized && key_layout == KeyLayout::kChannel), ErrorCode::kInvalidArgument, op,
        "outlier key channels refine per-channel keys: key_outliers needs a quantized cache with key_layout channel; "
        "got key_outliers ", key_outliers, " with ", quantized ? "key_layout token" : "a plain cache");
  check(!recent_exact || (quantized && key_layout == KeyLayout::kChannel), ErrorCode::kInvalidArgument, op,
        "the recent block read unquantized (recent exact) extends the per-channel keys' residual window: it needs a "
        "quantized cache with key_layout channel; got ", quantized ? "key_layout token" : "a plain cache");
  check(!v_symmetric || quantized, ErrorCode::kInvalidArgument, op,
        "symmetric values are a quantized cache's codes; a plain cache (", dtype_name(plain_dtype),
        ") stores its values as they are");
}

double KVSpec::bits_per_value(int64_t Dk) const {
  if (!quantized) return 8.0 * static_cast<double>(dtype_size(plain_dtype));
  // f16/bf16 scale + bias per group: 32 bits per group_size values (64 for f32), for keys in either layout.
  const double side = 2.0 * 8.0 * static_cast<double>(dtype_size(scale_dtype)) / group_size;
  double bits = (k_bits + v_bits) / 2.0 + side;
  if (v_symmetric) bits -= side / 4.0;  // the value groups' bias: a quarter of the (key + value) side bits
  if (key_outliers > 0) {
    check(Dk > 0, ErrorCode::kInvalidArgument, "kv_bits_per_value",
          "outlier key channels cost bits per key head dim: pass Dk (> 0); got ", Dk);
    bits += key_outliers * (4.0 + 16.0 / group_size) / static_cast<double>(Dk) / 2.0;
  }
  return bits;
}

void KVSpec::validate_head_dims(int64_t Dk, int64_t Dv, const char* op) const {
  check(Dk > 0, ErrorCode::kShapeMismatch, op, "the key head dim must be positive; got ", Dk);
  check(Dv > 0, ErrorCode::kShapeMismatch, op, "the value head dim must be positive; got ", Dv);
  if (quantized) {
    check(Dk % group_size == 0, ErrorCode::kShapeMismatch, op, "the key head dim must be a multiple of group_size ",
          group_size, "; got ", Dk);
    check(Dv % group_size == 0, ErrorCode::kShapeMismatch, op, "the value head dim must be a multiple of group_size ",
          group_size, "; got ", Dv);
  }
  check(key_outliers <= Dk / 2, ErrorCode::kShapeMismatch, op,
        "outlier key channels must be at most half of the key head dim ", Dk, "; got ", key_outliers);
  if (rotation == RotationKind::kSO4Fast || rotation == RotationKind::kSO4Full) {
    check(Dk % 4 == 0, ErrorCode::kShapeMismatch, op, "the key head dim must be a multiple of 4 for the ",
          rotation_name(rotation), " rotation; got ", Dk);
    check(Dv % 4 == 0, ErrorCode::kShapeMismatch, op, "the value head dim must be a multiple of 4 for the ",
          rotation_name(rotation), " rotation; got ", Dv);
  }
}

std::string KVSpec::name() const {
  std::string s;  // built by appends: GCC 12 warns falsely (-Wrestrict) on "k" + std::string
  if (!quantized) {
    s = plain_dtype == DType::kBF16 ? "bf16" : (plain_dtype == DType::kF16 ? "f16" : "f32");
    if (rotation != RotationKind::kNone) {
      s += '/';
      s += rotation_name(rotation);
    }
    return s;
  }
  s += 'k';
  s += std::to_string(k_bits);
  s += 'v';
  s += std::to_string(v_bits);
  s += '/';
  s += rotation_name(rotation);
  s += "/g";
  s += std::to_string(group_size);
  if (key_layout == KeyLayout::kChannel) s += "/kchan";
  if (key_outliers > 0) {
    s += "/o";
    s += std::to_string(key_outliers);
  }
  if (v_symmetric) s += "/vsym";
  if (recent_exact) s += "/rx";
  return s;
}

KVSpec parse_kv_spec(std::string_view s) {
  KVSpec kv;
  if (s == "bf16" || s == "f16" || s == "f32") {
    kv.quantized = false;
    kv.rotation = RotationKind::kNone;
    kv.plain_dtype = s == "bf16" ? DType::kBF16 : (s == "f16" ? DType::kF16 : DType::kF32);
    return kv;
  }
  // k<bits>v<bits>, one digit each.
  const bool shape_ok = s.size() == 4 && s[0] == 'k' && s[2] == 'v' && s[1] >= '0' && s[1] <= '9' && s[3] >= '0' &&
                        s[3] <= '9';
  check(shape_ok && is_kv_bits(s[1] - '0') && is_kv_bits(s[3] - '0'), ErrorCode::kInvalidArgument, "parse_kv_format",
        "kv must be bf16, f16, f32 or k<bits>v<bits> with bits in 2, 3, 4, 5, 6, 8 (e.g. k4v3); got \"", s, "\"");
  kv.k_bits = s[1] - '0';
  kv.v_bits = s[3] - '0';
  return kv;
}

namespace {
struct RotationName {
  RotationKind kind;
  const char* name;
};
constexpr RotationName kRotationNames[] = {{RotationKind::kSO4Full, "so4-full"},
                                           {RotationKind::kSO4Fast, "so4-fast"},
                                           {RotationKind::kHadamard, "hadamard"},
                                           {RotationKind::kNone, "none"}};
}  // namespace

RotationKind parse_rotation(std::string_view s) {
  for (const RotationName& r : kRotationNames)
    if (s == r.name) return r.kind;
  fail(ErrorCode::kInvalidArgument, "parse_kv_rotation",
       "kv rotation must be so4-full, so4-fast, hadamard or none; got \"", s, "\"");
}

bool parse_value_codes(std::string_view s) {
  if (s == "affine") return false;
  if (s == "symmetric") return true;
  fail(ErrorCode::kInvalidArgument, "parse_kv_values", "kv values must be affine or symmetric; got \"", s, "\"");
}

const char* value_codes_name(bool symmetric) { return symmetric ? "symmetric" : "affine"; }

bool parse_recent(std::string_view s) {
  if (s == "quantized") return false;
  if (s == "exact") return true;
  fail(ErrorCode::kInvalidArgument, "parse_kv_recent", "kv recent must be quantized or exact; got \"", s, "\"");
}

const char* recent_name(bool exact) { return exact ? "exact" : "quantized"; }

KeyLayout parse_key_layout(std::string_view s) {
  if (s == "token") return KeyLayout::kToken;
  if (s == "channel") return KeyLayout::kChannel;
  fail(ErrorCode::kInvalidArgument, "parse_kv_layout", "kv layout must be token or channel; got \"", s, "\"");
}

const char* key_layout_name(KeyLayout layout) {
  return layout == KeyLayout::kChannel ? "channel" : layout == KeyLayout::kToken ? "token" : "unknown";
}

const char* rotation_name(RotationKind kind) {
  for (const RotationName& r : kRotationNames)
    if (kind == r.kind) return r.name;
  return "unknown";
}

int64_t sink_rows(int64_t group_size) { return std::min<int64_t>(kSinkPositions, group_size); }
int64_t value_window_rows(int64_t group_size) { return std::min<int64_t>(kValueWindowPositions, group_size); }
static_assert(kSinkPositions <= kValueWindowPositions && kValueWindowPositions <= 32,
              "the sink fits in the values' window, which divides every block (32, 64 or 128)");

}  // namespace cider::nn
