// The C++ facade's building blocks (include/cider/cider.hpp): TensorRef, the KV cache and attention over it
// (nn::QuantizedKVCache / nn::PlainKVCache, nn::attention) and the W8A8 / W4A8 linear layers (nn::Int8Linear /
// nn::Int4Linear), as the C API wraps them (capi_kv.cpp, capi_linear.cpp).
#include <cmath>
#include <cstring>
#include <string>
#include <variant>

#include "capi/api_internal.h"
#include "capi/capi_internal.h"
#include "model/model.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "nn/linear.h"
#include "nn/quantized_matmul.h"
#include "quant/affine.h"

namespace cider {

TensorView api::to_view(const TensorRef& t, const char* op, const char* what, bool input, bool allow_neg_inf) {
  check(t.shape.size() <= CIDER_MAX_RANK, ErrorCode::kInvalidArgument, op, what, " rank must be in 0..",
        CIDER_MAX_RANK, "; got ", t.shape.size());
  cider_tensor c{};
  c.data = t.data;
  c.dtype = static_cast<int32_t>(t.dtype);
  c.rank = static_cast<int32_t>(t.shape.size());
  for (size_t i = 0; i < t.shape.size(); ++i) c.shape[i] = t.shape[i];
  return input ? capi::to_input_view(&c, op, what, allow_neg_inf) : capi::to_view(&c, op, what);
}

// ---- MLX-compatible affine quantization ----
void affine_quantize(const TensorRef& w, int group_size, int bits, const TensorRef& packed, const TensorRef& scales,
                     const TensorRef& biases) {
  constexpr const char* op = "cider::affine_quantize";
  quant::affine_quantize(api::to_view(w, op, "w", true), group_size, bits, api::to_view(packed, op, "packed"),
                         api::to_view(scales, op, "scales"), api::to_view(biases, op, "biases"));
}

void affine_dequantize(const TensorRef& packed, const TensorRef& scales, const TensorRef& biases, int group_size,
                       int bits, const TensorRef& out) {
  constexpr const char* op = "cider::affine_dequantize";
  quant::affine_dequantize(api::to_view(packed, op, "packed"), api::to_view(scales, op, "scales", true),
                           api::to_view(biases, op, "biases", true), group_size, bits, api::to_view(out, op, "out"));
}

void quantized_matmul(const TensorRef& x, const TensorRef& w, const TensorRef& scales, const TensorRef& biases,
                      bool transpose, int group_size, int bits, const TensorRef& out) {
  constexpr const char* op = "cider::quantized_matmul";
  nn::quantized_matmul(api::to_view(x, op, "x", true), api::to_view(w, op, "w"),
                       api::to_view(scales, op, "scales", true), api::to_view(biases, op, "biases", true), transpose,
                       group_size, bits, api::to_view(out, op, "out"));
}

// ---- KVSnapshot ----
struct KVSnapshot::Impl {
  nn::KVCacheSnapshot snapshot;
};

namespace {

const char* plain_format(DType t) {
  switch (t) {
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    default: return "f32";
  }
}

KVSpec public_spec(const nn::KVCacheMeta& m) {
  KVSpec s;
  if (m.quantized) {
    s.format = "k";  // appended piece by piece: GCC 12 warns (-Wrestrict) about "k" + std::to_string(...)
    s.format += std::to_string(m.k_bits);
    s.format += 'v';
    s.format += std::to_string(m.v_bits);
  } else {
    s.format = plain_format(m.dtype);
  }
  s.rotation = nn::rotation_name(m.rotation);
  s.group_size = m.quantized ? m.group_size : 0;
  s.key_layout = nn::key_layout_name(m.key_layout);
  s.values = m.quantized ? nn::value_codes_name(m.v_symmetric) : "";
  s.recent = m.quantized && m.key_layout == nn::KeyLayout::kChannel ? nn::recent_name(m.recent_exact) : "";
  s.seed = m.seed;
  s.scale_dtype = m.scale_dtype;
  return s;
}

// The arrays of a cache state with these dims (KVSnapshot::plane documents them), in plane order.
struct PlaneLayout {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape;
};

std::vector<PlaneLayout> plane_layouts(const nn::KVCacheMeta& m) {
  if (!m.has_dims) return {};
  const int64_t B = m.B, H = m.H, L = m.length;
  if (!m.quantized) return {{"keys", m.dtype, {B, H, L, m.Dk}}, {"values", m.dtype, {B, H, L, m.Dv}}};
  const int64_t gs = m.group_size;
  std::vector<PlaneLayout> p = {{"key codes", DType::kU32, {B, H, L, m.Dk * m.k_bits / 32}},
                                {"key scales", m.scale_dtype, {B, H, L, m.Dk / gs}},
                                {"key biases", m.scale_dtype, {B, H, L, m.Dk / gs}},
                                {"value codes", DType::kU32, {B, H, L, m.Dv * m.v_bits / 32}},
                                {"value scales", m.scale_dtype, {B, H, L, m.Dv / gs}},
                                {"value biases", m.scale_dtype, {B, H, L, m.v_symmetric ? 0 : m.Dv / gs}}};
  if (m.key_layout == nn::KeyLayout::kChannel) {
    p[1].shape = p[2].shape = {B, H, (L + gs - 1) / gs, m.Dk};
    p.push_back({"residual window", DType::kBF16, {B, H, L > 0 ? gs : 0, m.Dk}});
    if (m.recent_exact) {
      p.push_back({"values' window", DType::kBF16, {B, H, L > 0 ? nn::value_window_rows(gs) : 0, m.Dv}});
      const int64_t ns = nn::sink_rows(gs);
      p.push_back({"sink keys", DType::kBF16, {B, H, L > 0 ? ns : 0, m.Dk}});
      p.push_back({"sink values", DType::kBF16, {B, H, L > 0 ? ns : 0, m.Dv}});
    }
  }
  return p;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string t = "[";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + "]";
}

}  // namespace

KVSnapshot::KVSnapshot() : impl_(std::make_unique<Impl>()) {}
KVSnapshot::KVSnapshot(const KVSnapshot& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
KVSnapshot& KVSnapshot::operator=(const KVSnapshot& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}
KVSnapshot::~KVSnapshot() = default;
int64_t KVSnapshot::length() const { return impl_->snapshot.length(); }
KVSpec KVSnapshot::spec() const { return public_spec(impl_->snapshot.meta()); }
size_t KVSnapshot::num_planes() const { return impl_->snapshot.num_planes(); }
TensorRef KVSnapshot::plane(size_t i) const {
  const nn::KVCacheSnapshot& s = impl_->snapshot;
  check(i < s.num_planes(), ErrorCode::kOutOfRange, "cider::KVSnapshot::plane", "i must be below num_planes() = ",
        s.num_planes(), "; got ", i);
  PlaneLayout l = plane_layouts(s.meta())[i];
  return TensorRef(s.plane(i).data(), l.dtype, std::move(l.shape));
}

// ---- KVCache ----
struct KVCache::Impl {
  std::unique_ptr<nn::KVCache> cache;
};

namespace {

std::unique_ptr<nn::KVCache> make_cache(const KVSpec& spec, const char* op) {
  const std::string format = spec.format.empty() ? "k8v4" : spec.format;  // a standalone cache's default
  const model::KVOptions kv = api::named(op, "format", [&] { return model::parse_kv_format(format); });
  nn::RotationKind rotation = kv.quantized ? nn::RotationKind::kHadamard : nn::RotationKind::kNone;
  if (!spec.rotation.empty())
    rotation = api::named(op, "rotation", [&] { return model::parse_kv_rotation(spec.rotation); });
  const int gs = spec.group_size;
  check(gs == 0 || gs == 32 || gs == 64 || gs == 128, ErrorCode::kInvalidArgument, op,
        "group_size must be 0 (64), 32, 64 or 128; got ", gs);
  check(is_float_dtype(spec.scale_dtype), ErrorCode::kInvalidArgument, op,
        "scale_dtype must be DType::kF32, kF16 or kBF16; got ", static_cast<int>(spec.scale_dtype));
  check(spec.key_outliers == 0, ErrorCode::kInvalidArgument, op,
        "outlier key channels are chosen by the queries a model shows its caches: a standalone KV cache has none "
        "(key_outliers must be 0; got ", spec.key_outliers, ")");
  if (kv.quantized) {
    nn::QuantizedKVCacheConfig c;
    c.k_bits = kv.k_bits;
    c.v_bits = kv.v_bits;
    c.group_size = gs == 0 ? 64 : gs;
    c.rotation = rotation;
    c.seed = spec.seed;
    c.scale_dtype = spec.scale_dtype;
    if (!spec.key_layout.empty())
      c.key_layout = api::named(op, "key_layout", [&] { return nn::parse_key_layout(spec.key_layout); });
    if (!spec.values.empty()) c.v_symmetric = api::named(op, "values", [&] { return nn::parse_value_codes(spec.values); });
    if (!spec.recent.empty()) c.recent_exact = api::named(op, "recent", [&] { return nn::parse_recent(spec.recent); });
    return std::make_unique<nn::QuantizedKVCache>(c);
  }
  check(spec.key_layout.empty() || spec.key_layout == "token", ErrorCode::kInvalidArgument, op,
        "a plain KV cache (format \"", spec.format, "\") stores keys per position: key_layout must be \"\" or "
        "\"token\"; got \"", spec.key_layout, "\"");
  check(spec.recent.empty() || spec.recent == "quantized", ErrorCode::kInvalidArgument, op, "a plain KV cache (format \"",
        spec.format, "\") is read as it is stored: recent must be \"\" or \"quantized\"; got \"", spec.recent, "\"");
  check(spec.values.empty() || spec.values == "affine", ErrorCode::kInvalidArgument, op, "a plain KV cache (format \"",
        spec.format, "\") stores its values as they are: values must be \"\" or \"affine\"; got \"", spec.values, "\"");
  nn::PlainKVCacheConfig c;
  c.dtype = kv.plain_dtype;
  c.rotation = rotation;
  c.seed = spec.seed;
  return std::make_unique<nn::PlainKVCache>(c);
}

nn::KVCache& cache_of(const std::unique_ptr<KVCache::Impl>& impl, const char* op) {
  check(impl != nullptr && impl->cache != nullptr, ErrorCode::kInvalidArgument, op, "the cache was moved from");
  return *impl->cache;
}

}  // namespace

KVCache::KVCache(const KVSpec& spec) : impl_(std::make_unique<Impl>(Impl{make_cache(spec, "cider::KVCache")})) {}
KVCache::KVCache(KVCache&&) noexcept = default;
KVCache& KVCache::operator=(KVCache&&) noexcept = default;
KVCache::~KVCache() = default;

void KVCache::append(const TensorRef& keys, const TensorRef& values) {
  constexpr const char* op = "cider::KVCache::append";
  nn::KVCache& c = cache_of(impl_, op);
  c.update_and_fetch(api::to_view(keys, op, "keys", true), api::to_view(values, op, "values", true));
}
int64_t KVCache::offset() const { return cache_of(impl_, "cider::KVCache::offset").offset(); }
int64_t KVCache::trim(int64_t n) {
  constexpr const char* op = "cider::KVCache::trim";
  nn::KVCache& c = cache_of(impl_, op);
  check(n >= 0, ErrorCode::kInvalidArgument, op, "n must be >= 0; got ", n);
  return c.trim(n);
}
size_t KVCache::nbytes() const { return static_cast<size_t>(cache_of(impl_, "cider::KVCache::nbytes").nbytes()); }
bool KVCache::quantized() const { return cache_of(impl_, "cider::KVCache::quantized").is_quantized(); }
KVSnapshot KVCache::snapshot() const {
  KVSnapshot s;
  s.impl_->snapshot = cache_of(impl_, "cider::KVCache::snapshot").snapshot();
  return s;
}
void KVCache::restore(const KVSnapshot& snapshot) {
  constexpr const char* op = "cider::KVCache::restore";
  nn::KVCache& c = cache_of(impl_, op);
  c.restore(snapshot.impl_->snapshot);
}

KVSpec KVCache::spec() const { return public_spec(cache_of(impl_, "cider::KVCache::spec").meta()); }

KVSnapshot KVSnapshot::from_state(const KVSpec& spec, const std::vector<TensorRef>& planes) {
  constexpr const char* op = "cider::KVSnapshot::from_state";
  nn::KVCacheMeta meta = make_cache(spec, op)->meta();  // the configuration, validated; no dims yet
  KVSnapshot out;
  if (planes.empty()) {
    out.impl_->snapshot = nn::KVCacheSnapshot(meta, {});
    return out;
  }
  const size_t want = !meta.quantized ? 2 : meta.key_layout == nn::KeyLayout::kChannel ? 7 : 6;
  check(planes.size() == want, ErrorCode::kInvalidArgument, op, "a ", spec.format.empty() ? "k8v4" : spec.format,
        meta.key_layout == nn::KeyLayout::kChannel ? " cache with per-channel keys" : " cache", " has ", want,
        " arrays (or none: empty); got ", planes.size());
  for (size_t i = 0; i < planes.size(); ++i)
    check(planes[i].shape.size() == 4, ErrorCode::kShapeMismatch, op, "array ", i, " must have 4 dimensions; got ",
          shape_text(planes[i].shape));
  // Dimensions and length from the arrays; every array is then checked against the layout they imply.
  const auto& s0 = planes[0].shape;
  meta.has_dims = true;
  meta.B = s0[0];
  meta.H = s0[1];
  meta.length = s0[2];
  if (!meta.quantized) {
    meta.Dk = s0[3];
    meta.Dv = planes[1].shape[3];
  } else {
    meta.Dk = meta.key_layout == nn::KeyLayout::kChannel ? planes[1].shape[3] : planes[1].shape[3] * meta.group_size;
    meta.Dv = planes[4].shape[3] * meta.group_size;
  }
  check(meta.B > 0 && meta.H > 0 && meta.length >= 0, ErrorCode::kShapeMismatch, op,
        "array 0 must be [B, H, length, ·] with B, H > 0; got ", shape_text(s0));
  meta.spec().validate_head_dims(meta.Dk, meta.Dv, op);
  const std::vector<PlaneLayout> layouts = plane_layouts(meta);
  std::vector<Buffer> buffers;
  for (size_t i = 0; i < planes.size(); ++i) {
    const PlaneLayout& l = layouts[i];
    check(planes[i].dtype == l.dtype && planes[i].shape == l.shape, ErrorCode::kShapeMismatch, op, "array ", i, " (",
          l.name, ") must be ", dtype_name(l.dtype), " ", shape_text(l.shape), " for B = ", meta.B, ", H = ", meta.H,
          ", length = ", meta.length, ", key dim ", meta.Dk, ", value dim ", meta.Dv, "; got ",
          dtype_name(planes[i].dtype), " ", shape_text(planes[i].shape));
    const TensorView v = api::to_view(planes[i], op, l.name);
    Buffer b(static_cast<size_t>(v.numel() * dtype_size(v.dtype)));
    if (b.nbytes() > 0) std::memcpy(b.data(), v.data, b.nbytes());
    buffers.push_back(std::move(b));
  }
  out.impl_->snapshot = nn::KVCacheSnapshot(meta, std::move(buffers));
  return out;
}

void attention(const TensorRef& queries, const KVCache& cache, float scale, const AttentionMask& mask,
               const TensorRef& out) {
  constexpr const char* op = "cider::attention";
  const nn::KVCache& c = cache_of(cache.impl_, op);
  const int kind = static_cast<int>(mask.kind);
  check(kind >= 0 && kind <= 3, ErrorCode::kInvalidArgument, op,
        "mask.kind must be kNone, kCausal, kBool or kAdditive; got ", kind);
  const bool needs_mask = mask.kind == MaskKind::kBool || mask.kind == MaskKind::kAdditive;
  check(needs_mask == mask.mask.has_value(), ErrorCode::kInvalidArgument, op,
        "mask.mask must be given exactly when mask.kind is kBool or kAdditive; got kind ", kind, " and ",
        mask.mask ? "a mask" : "none");
  check(std::isfinite(scale), ErrorCode::kInvalidArgument, op, "scale must be finite; got ", scale);
  nn::AttentionMask m;
  m.kind = static_cast<kernels::MaskKind>(kind);
  m.window = mask.window;
  if (mask.mask) m.mask = api::to_view(*mask.mask, op, "mask", true, mask.kind == MaskKind::kAdditive);
  nn::attention(api::to_view(queries, op, "queries", true), c, scale, m, api::to_view(out, op, "out"));
}

// ---- Linear ----
struct Linear::Impl {
  LinearFormat format;
  std::variant<nn::Int8Linear, nn::Int4Linear> layer;
};

namespace {

void check_format(LinearFormat f, const char* op) {
  check(f == LinearFormat::kW8A8 || f == LinearFormat::kW4A8, ErrorCode::kInvalidArgument, op,
        "format must be LinearFormat::kW8A8 or kW4A8; got ", static_cast<int>(f));
}

std::optional<float> clip_of(std::optional<float> clip, const char* op) {
  check(!clip || !std::isnan(*clip), ErrorCode::kInvalidArgument, op,
        "clip_percentile must be a number in (0, 100] or none; got NaN");
  return clip;
}

const Linear::Impl& layer_of(const std::unique_ptr<Linear::Impl>& impl, const char* op) {
  check(impl != nullptr, ErrorCode::kInvalidArgument, op, "the layer was moved from");
  return *impl;
}

}  // namespace

Linear::Linear(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Linear::Linear(Linear&&) noexcept = default;
Linear& Linear::operator=(Linear&&) noexcept = default;
Linear::~Linear() = default;

Linear Linear::from_float(LinearFormat format, const TensorRef& w, const std::optional<TensorRef>& bias,
                          int group_size, std::optional<float> clip_percentile) {
  constexpr const char* op = "cider::Linear::from_float";
  check_format(format, op);
  const TensorView wv = api::to_view(w, op, "w", true);
  std::optional<TensorView> bv;
  if (bias) bv = api::to_view(*bias, op, "bias", true);
  const TensorView* bp = bv ? &*bv : nullptr;
  const std::optional<float> clip = clip_of(clip_percentile, op);
  if (format == LinearFormat::kW8A8)
    return Linear(std::make_unique<Impl>(Impl{format, nn::Int8Linear::from_float(wv, bp, group_size, clip)}));
  return Linear(std::make_unique<Impl>(Impl{format, nn::Int4Linear::from_float(wv, bp, group_size, clip)}));
}

Linear Linear::from_mlx(LinearFormat format, const TensorRef& packed, const TensorRef& scales, const TensorRef& biases,
                        int mlx_group_size, int mlx_bits, const std::optional<TensorRef>& bias,
                        std::optional<int> target_group_size, std::optional<float> clip_percentile) {
  constexpr const char* op = "cider::Linear::from_mlx";
  check_format(format, op);
  const TensorView pv = api::to_view(packed, op, "packed"), sv = api::to_view(scales, op, "scales", true),
                   bsv = api::to_view(biases, op, "biases", true);
  std::optional<TensorView> bv;
  if (bias) bv = api::to_view(*bias, op, "bias", true);
  const TensorView* bp = bv ? &*bv : nullptr;
  const std::optional<float> clip = clip_of(clip_percentile, op);
  if (format == LinearFormat::kW8A8)
    return Linear(std::make_unique<Impl>(Impl{
        format, nn::Int8Linear::from_mlx_affine(pv, sv, bsv, mlx_group_size, mlx_bits, bp, target_group_size, clip)}));
  return Linear(std::make_unique<Impl>(Impl{
      format, nn::Int4Linear::from_mlx_affine(pv, sv, bsv, mlx_group_size, mlx_bits, bp, target_group_size, clip)}));
}

void Linear::forward(const TensorRef& x, const TensorRef& out) const {
  constexpr const char* op = "cider::Linear::forward";
  const Impl& l = layer_of(impl_, op);
  const TensorView xv = api::to_view(x, op, "x", true), ov = api::to_view(out, op, "out");
  std::visit([&](const auto& layer) { layer.forward(xv, ov); }, l.layer);
}

LinearFormat Linear::format() const { return layer_of(impl_, "cider::Linear::format").format; }
int64_t Linear::in_features() const {
  return std::visit([](const auto& l) { return l.in_features(); }, layer_of(impl_, "cider::Linear::in_features").layer);
}
int64_t Linear::out_features() const {
  return std::visit([](const auto& l) { return l.out_features(); },
                    layer_of(impl_, "cider::Linear::out_features").layer);
}
int Linear::group_size() const {
  return std::visit([](const auto& l) { return l.group_size(); }, layer_of(impl_, "cider::Linear::group_size").layer);
}
size_t Linear::nbytes() const {
  return std::visit([](const auto& l) { return l.nbytes(); }, layer_of(impl_, "cider::Linear::nbytes").layer);
}

}  // namespace cider
