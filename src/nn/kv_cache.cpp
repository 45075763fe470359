// KV caches: shared storage mechanics (growth in 256-position steps, trim, snapshot/restore) and the two row formats.
#include "nn/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/affine.h"
#include "quant/kv_stats.h"

namespace cider::nn {

namespace {

constexpr size_t kQuantizedPlanes = 6;  // key codes, scales, biases; value codes, scales, biases
constexpr size_t kChannelPlanes = 7;    // the same, keys per channel, plus the residual window
constexpr size_t kResidualPlane = 6;
constexpr size_t kOutlierPlanes = 10;    // per-channel keys with outlier channels: also these three
constexpr size_t kOutlierCodesPlane = 7;
constexpr size_t kOutlierIndexPlane = 8;
constexpr size_t kQueryStatsPlane = 9;
constexpr size_t kPlainPlanes = 2;      // keys, values

int64_t round_up(int64_t n, int64_t step) { return (n + step - 1) / step * step; }

bool channel_keys(const KVCacheMeta& m) { return m.quantized && m.key_layout == KeyLayout::kChannel; }
// The values' window (recent_exact): the plane after the per-channel keys' planes; then the sink's keys and values.
size_t value_window_plane(const KVCacheMeta& m) { return m.key_outliers > 0 ? kOutlierPlanes : kChannelPlanes; }
size_t plane_count(const KVCacheMeta& m) {
  if (!m.quantized) return kPlainPlanes;
  if (!channel_keys(m)) return kQuantizedPlanes;
  return value_window_plane(m) + (m.recent_exact ? 3 : 0);
}

// The shape of each plane, in the plane order documented at KVCacheSnapshot.
std::vector<detail::PlaneShape> plane_shapes(const KVCacheMeta& m) {
  using detail::PlaneShape;
  if (m.quantized) {
    const int64_t ss = dtype_size(m.scale_dtype), gs = m.group_size;
    std::vector<PlaneShape> p = {{quant::packed_words(m.Dk, m.k_bits) * 4, 1, 0}, {(m.Dk / gs) * ss, 1, 0},
                                 {(m.Dk / gs) * ss, 1, 0},
                                 {quant::packed_words(m.Dv, m.v_bits) * 4, 1, 0}, {(m.Dv / gs) * ss, 1, 0},
                                 {m.v_symmetric ? 0 : (m.Dv / gs) * ss, 1, 0}};  // symmetric values: no biases
    if (channel_keys(m)) {
      p[1] = p[2] = {m.Dk * ss, gs, 0};                               // one [Dk] row per block of gs positions
      p.push_back({m.Dk * static_cast<int64_t>(sizeof(uint16_t)), 0, gs});  // residual window, bfloat16
      if (const int64_t n = m.key_outliers; n > 0) {
        p.push_back({n * gs / 2, gs, 0});                                  // refinement codes per block
        p.push_back({n * static_cast<int64_t>(sizeof(uint16_t)), gs, 0});  // outlier channel indices per block
        p.push_back({m.Dk + 1, 0, gs});  // per window position: Σ q² per channel (quant/kv_stats.h), count
      }
      if (m.recent_exact) {
        p.push_back({m.Dv * static_cast<int64_t>(sizeof(uint16_t)), 0, value_window_rows(gs)});  // values' window
        const int64_t ns = sink_rows(m.group_size);
        p.push_back({m.Dk * static_cast<int64_t>(sizeof(uint16_t)), 0, ns});  // the sink positions' keys, bfloat16
        p.push_back({m.Dv * static_cast<int64_t>(sizeof(uint16_t)), 0, ns});  // the sink positions' values, bfloat16
      }
    }
    return p;
  }
  const int64_t es = dtype_size(m.dtype);
  return {{m.Dk * es, 1, 0}, {m.Dv * es, 1, 0}};
}

// KVCache::split_align of a cache of this metadata.
int64_t split_unit(const KVCacheMeta& m) { return channel_keys(m) ? m.group_size : 1; }

// Everything a snapshot or restore must hold for the metadata to describe a cache.
void check_meta(const KVCacheMeta& m, const char* op) {
  m.spec().validate(op);
  if (!m.has_dims) {
    check(m.length == 0, ErrorCode::kInvalidArgument, op, "a cache without dims must have length 0; got ", m.length);
    return;
  }
  check(m.B > 0 && m.H > 0, ErrorCode::kShapeMismatch, op, "B and H must be positive; got (", m.B, ", ", m.H, ")");
  m.spec().validate_head_dims(m.Dk, m.Dv, op);
  check(m.length >= 0, ErrorCode::kInvalidArgument, op, "length must be >= 0; got ", m.length);
  check(m.window >= 0 && m.start >= 0, ErrorCode::kInvalidArgument, op, "window and start must be >= 0; got window ",
        m.window, ", start ", m.start);
  if (m.window > 0) {
    check(m.start % window_align(m.spec()) == 0, ErrorCode::kInvalidArgument, op,
          "a sliding-window cache drops positions in multiples of ", window_align(m.spec()), " (",
          KVCache::kWindowAlign, ", or the group size for per-channel keys); got start ", m.start);
  } else {  // the rest of a cache split into shared segments (KVCache::split_front)
    check(m.start % split_unit(m) == 0, ErrorCode::kInvalidArgument, op,
          "a cache split into shared segments starts at a multiple of ", split_unit(m),
          " (the group size for per-channel keys); got start ", m.start);
  }
}

void check_window(int64_t window, const char* op) {
  check(window >= 0, ErrorCode::kInvalidArgument, op, "window must be >= 0 (0: keep every position); got ", window);
}

// The keys or the values view of storage whose planes follow the KVCacheSnapshot order.
// `planes` is empty (a cache without dims: null pointers) or holds one pointer per plane.
kernels::KVTensorView make_view(const KVCacheMeta& m, bool keys, const std::vector<const void*>& planes,
                                int64_t capacity) {
  const bool have = planes.size() == plane_count(m);
  kernels::KVTensorView v{};
  v.B = m.B;
  v.H = m.H;
  v.length = m.length;
  v.capacity = capacity;
  v.dim = keys ? m.Dk : m.Dv;
  if (m.quantized) {
    const size_t first = keys ? 0 : 3;
    v.data = have ? planes[first] : nullptr;
    v.scales = have ? planes[first + 1] : nullptr;
    v.biases = have ? planes[first + 2] : nullptr;
    v.dtype = DType::kU32;
    v.scale_dtype = m.scale_dtype;
    v.bits = keys ? m.k_bits : m.v_bits;
    v.group_size = m.group_size;
    if (!keys && m.v_symmetric) {
      v.biases = nullptr;
      v.symmetric = true;
    }
    if (keys && channel_keys(m)) {
      v.layout = 1;
      v.blocks = plane_shapes(m)[1].rows(capacity);
      v.residual = have ? planes[kResidualPlane] : nullptr;
      if (m.key_outliers > 0) {
        v.outliers = m.key_outliers;
        v.outlier_codes = have ? planes[kOutlierCodesPlane] : nullptr;
        v.outlier_index = have ? planes[kOutlierIndexPlane] : nullptr;
      }
    }
  } else {
    v.data = have ? planes[keys ? 0 : 1] : nullptr;
    v.scales = nullptr;
    v.biases = nullptr;
    v.dtype = m.dtype;
    v.scale_dtype = m.dtype;
    v.bits = 0;
    v.group_size = 0;
  }
  return v;
}

// The inputs of an append: rank 4, float, on the CPU, keys and values agreeing on B, H and n.
void check_append_inputs(const TensorView& keys, const TensorView& values, const char* op) {
  check_rank(keys, 4, op, "keys");
  check_rank(values, 4, op, "values");
  check_float_dtype(keys, op, "keys");
  check_float_dtype(values, op, "values");
  check_cpu(keys, op, "keys");
  check_cpu(values, op, "values");
  check(keys.dim(0) == values.dim(0) && keys.dim(1) == values.dim(1) && keys.dim(2) == values.dim(2),
        ErrorCode::kShapeMismatch, op, "keys [B, H, n, Dk] and values [B, H, n, Dv] must agree on B, H and n; got ",
        keys.shape_string(), " and ", values.shape_string());
  if (keys.numel() > 0) check_not_null(keys, op, "keys");
  if (values.numel() > 0) check_not_null(values, op, "values");
}

// Calls fn(value, b, h, t, d) for every element of a [B, H, n, D] input (any strides, any float dtype).
template <typename F>
void for_each_input(const TensorView& x, const F& fn) {
  for (int64_t b = 0; b < x.dim(0); ++b)
    for (int64_t h = 0; h < x.dim(1); ++h)
      for (int64_t t = 0; t < x.dim(2); ++t)
        for (int64_t d = 0; d < x.dim(3); ++d)
          fn(load_float(x.data, x.dtype,
                        b * x.stride_of(0) + h * x.stride_of(1) + t * x.stride_of(2) + d * x.stride_of(3)),
             b, h, t, d);
}

// The quantizer needs finite values (a NaN would become code 0 under a garbage scale): checked before any write.
void check_finite(const TensorView& x, const char* op, const char* what) {
  for_each_input(x, [&](float v, int64_t b, int64_t h, int64_t t, int64_t d) {
    check(std::isfinite(v), ErrorCode::kInvalidArgument, op, what, " must be finite; got ", v, " at [", b, ", ", h,
          ", ", t, ", ", d, "]");
  });
}

// Per-channel keys with float16 scales: a block's bias is one of its values and its scale at most the range over
// 2^bits − 1, so every key within ±65504 keeps them finite; checked before anything is written.
void check_f16_range(const TensorView& x, const char* op) {
  for_each_input(x, [&](float v, int64_t b, int64_t h, int64_t t, int64_t d) {
    check(std::fabs(v) <= 65504.0f, ErrorCode::kOutOfRange, op, "keys at [", b, ", ", h, ", ", t, ", ", d,
          "] need a float16 scale or bias beyond its range of 65504 (per-channel keys); got ", v,
          ": use a bfloat16 or float32 scale dtype for such values");
  });
}

// After an append, before the offset moves: rows [start, start + n) of plane p must be finite. A float16 scale or
// bias (quantized caches) or a float16 value (plain f16 caches) of a finite input overflows to infinity beyond
// 65504; that is an error naming where and what to do, never a NaN in the attention output. On failure every plane's
// rows [start, start + n) are zeroed (the kernels read whole tiles past the offset with weight 0, and 0 · inf would
// be NaN), so the cache is exactly as it was for its user: same offset, same results.
void check_stored_finite(detail::KVStore& store, size_t plane, int64_t row_elems, DType dt, int64_t start, int64_t n,
                         const std::vector<detail::PlaneShape>& shapes, const char* op, const char* what,
                         const char* stored) {
  // float32 and bfloat16 hold every finite float32 input; a plane of empty rows (symmetric values' biases) holds none
  if (dt != DType::kF16 || n == 0 || shapes[plane].row_bytes == 0) return;
  for (int64_t b = 0; b < store.B(); ++b)
    for (int64_t h = 0; h < store.H(); ++h) {
      const int64_t at = find_nonfinite(store.row(plane, b, h, start), dt, n * row_elems);
      if (at < 0) continue;
      for (size_t p = 0; p < shapes.size(); ++p)
        for (int64_t bb = 0; bb < store.B() && shapes[p].per == 1 && shapes[p].row_bytes > 0; ++bb)
          for (int64_t hh = 0; hh < store.H(); ++hh)
            std::memset(store.row(p, bb, hh, start), 0, static_cast<size_t>(n * shapes[p].row_bytes));
      fail(ErrorCode::kOutOfRange, op, what, " at [", b, ", ", h, ", ", at / row_elems,
           "] (batch, head, position of the append) need a float16 ", stored,
           " beyond its range of 65504 (values too large after rotation); got infinity: use a bfloat16 or float32 ",
           stored, " dtype for such values");
    }
}

// Fixes the dims on the first append or checks a later append against them.
void check_append_dims(const detail::KVStore& store, int64_t Dk, int64_t Dv, const TensorView& keys,
                       const TensorView& values, const char* op) {
  if (!store.has_dims()) {
    check(keys.dim(0) > 0 && keys.dim(1) > 0, ErrorCode::kShapeMismatch, op, "B and H must be positive; got keys ",
          keys.shape_string());
    return;
  }
  check(keys.dim(0) == store.B() && keys.dim(1) == store.H(), ErrorCode::kShapeMismatch, op,
        "B and H must match the cache's (", store.B(), ", ", store.H(), "); got keys ", keys.shape_string());
  check(keys.dim(3) == Dk, ErrorCode::kShapeMismatch, op, "Dk must match the cache's ", Dk, "; got ", keys.dim(3));
  check(values.dim(3) == Dv, ErrorCode::kShapeMismatch, op, "Dv must match the cache's ", Dv, "; got ", values.dim(3));
}

// Rotates and stores x[b, h, 0 : n, :] (any strides, any float dtype) at positions [t_dst, t_dst + n) of (b, h)
// through the kernel table's kv_append entry (one pass: read as float32, rotate in float32, quantize or round).
// `dst`, `scales`, `biases` point at row t_dst of the (b, h) planes; bits == 0 stores plain values in `dtype`,
// otherwise `dtype` is the scale dtype.
void append_rows(const TensorView& x, int64_t b, int64_t h, const Rotation& rot, void* dst, void* scales,
                 void* biases, DType dtype, int bits, int group_size, bool symmetric = false) {
  kernels::KVAppendArgs a{};
  a.src = static_cast<const uint8_t*>(x.data) + (b * x.stride_of(0) + h * x.stride_of(1)) * dtype_size(x.dtype);
  a.src_dtype = x.dtype;
  a.src_row_stride = x.stride_of(2);
  a.src_elem_stride = x.stride_of(3);
  a.n = x.dim(2);
  a.dim = x.dim(3);
  a.rotation = static_cast<int>(rot.kind());
  a.qL = rot.kernel_qL();  // SO(4): quaternions; Hadamard: the signs
  a.qR = rot.kernel_qR();
  a.dst = dst;
  a.scales = scales;
  a.biases = biases;
  a.dst_dtype = dtype;
  a.bits = bits;
  a.group_size = group_size;
  a.symmetric = symmetric;
  kernels::active_kernels().kv_append(a);
}

}  // namespace

int64_t window_align(const KVSpec& spec) {
  const int64_t a = KVCache::kWindowAlign;
  return spec.quantized && spec.key_layout == KeyLayout::kChannel ? std::max<int64_t>(a, spec.group_size) : a;
}

int64_t window_capacity(int64_t window, int64_t align, int64_t max_append) {
  check(window >= 1 && align >= 1 && max_append >= 1, ErrorCode::kInvalidArgument, "window_capacity",
        "window, align and max_append must be >= 1; got ", window, ", ", align, ", ", max_append);
  return round_up(window - 1 + align - 1 + max_append, KVCache::kStep);
}

int64_t kv_cache_bytes(const KVSpec& spec, int64_t B, int64_t H, int64_t Dk, int64_t Dv, int64_t positions,
                       int64_t window) {
  const char* op = "kv_cache_bytes";
  spec.validate(op);
  spec.validate_head_dims(Dk, Dv, op);
  check(B >= 1 && H >= 1 && positions >= 0 && window >= 0, ErrorCode::kInvalidArgument, op,
        "B, H must be >= 1 and positions, window >= 0; got ", B, ", ", H, ", ", positions, ", ", window);
  if (positions == 0) return 0;
  KVCacheMeta m;
  m.quantized = spec.quantized;
  m.k_bits = spec.k_bits;
  m.v_bits = spec.v_bits;
  m.group_size = spec.group_size;
  m.scale_dtype = spec.scale_dtype;
  m.dtype = spec.plain_dtype;
  m.key_layout = spec.key_layout;
  m.key_outliers = spec.key_outliers;
  m.v_symmetric = spec.v_symmetric;
  m.recent_exact = spec.recent_exact;
  m.Dk = Dk;
  m.Dv = Dv;
  int64_t cap = round_up(positions, KVCache::kStep);
  if (window > 0) cap = std::min(cap, window_capacity(window, window_align(spec), KVCache::kWindowSlack));
  return detail::planes_bytes(plane_shapes(m), B, H, cap);
}

KVSpec KVCacheMeta::spec() const {
  KVSpec k;
  k.quantized = quantized;
  k.k_bits = k_bits;
  k.v_bits = v_bits;
  k.group_size = group_size;
  k.rotation = rotation;
  k.scale_dtype = scale_dtype;
  k.plain_dtype = dtype;
  k.key_layout = quantized ? key_layout : KeyLayout::kToken;
  k.key_outliers = quantized ? key_outliers : 0;
  k.v_symmetric = quantized && v_symmetric;
  k.recent_exact = quantized && recent_exact;
  return k;
}

KVSpec QuantizedKVCacheConfig::spec() const {
  KVSpec k;
  k.quantized = true;
  k.k_bits = k_bits;
  k.v_bits = v_bits;
  k.group_size = group_size;
  k.rotation = rotation;
  k.scale_dtype = scale_dtype;
  k.key_layout = key_layout;
  k.key_outliers = key_outliers;
  k.v_symmetric = v_symmetric;
  k.recent_exact = recent_exact;
  return k;
}

KVSpec PlainKVCacheConfig::spec() const {
  KVSpec k;
  k.quantized = false;
  k.rotation = rotation;
  k.plain_dtype = dtype;
  return k;
}

std::vector<KVPlaneRows> kv_snapshot_planes(const KVCacheMeta& meta, int64_t positions) {
  check(positions >= 0, ErrorCode::kInvalidArgument, "kv_snapshot_planes", "positions must be >= 0; got ", positions);
  std::vector<KVPlaneRows> out;
  if (!meta.has_dims) return out;
  for (const detail::PlaneShape& s : plane_shapes(meta)) out.push_back({s.row_bytes, s.rows(positions)});
  return out;
}

// ---- KVCacheSnapshot ----------------------------------------------------------------------------------------------

KVCacheSnapshot::KVCacheSnapshot(const KVCacheMeta& meta, std::vector<Buffer> planes) : meta_(meta) {
  const char* op = "kv_cache_snapshot";
  check_meta(meta, op);
  if (!meta.has_dims) {
    check(planes.empty(), ErrorCode::kInvalidArgument, op, "a snapshot without dims holds no planes; got ",
          planes.size());
  } else {
    const std::vector<detail::PlaneShape> shapes = plane_shapes(meta);
    check(planes.size() == shapes.size(), ErrorCode::kInvalidArgument, op, "expected ", shapes.size(),
          " planes; got ", planes.size());
    for (size_t p = 0; p < shapes.size(); ++p) {
      const int64_t want = meta.B * meta.H * shapes[p].rows(meta.length) * shapes[p].row_bytes;
      check(static_cast<int64_t>(planes[p].nbytes()) == want, ErrorCode::kCorrupt, op, "plane ", p, " must hold ", want,
            " bytes; got ", planes[p].nbytes());
    }
  }
  planes_ = std::make_shared<const std::vector<Buffer>>(std::move(planes));
}

int64_t KVCacheSnapshot::nbytes() const {
  int64_t n = 0;
  for (size_t p = 0; p < num_planes(); ++p) n += static_cast<int64_t>(plane(p).nbytes());
  return n;
}

static std::vector<const void*> snapshot_pointers(const KVCacheSnapshot& s) {
  std::vector<const void*> ptrs;
  for (size_t p = 0; p < s.num_planes(); ++p) ptrs.push_back(s.plane(p).data());
  return ptrs;
}

kernels::KVTensorView KVCacheSnapshot::keys() const {
  return make_view(meta_, true, snapshot_pointers(*this), meta_.length);
}

kernels::KVTensorView KVCacheSnapshot::values() const {
  return make_view(meta_, false, snapshot_pointers(*this), meta_.length);
}

// ---- KVSegment and shared prefixes ----------------------------------------------------------------------------------

int64_t KVCache::split_align() const { return split_unit(meta()); }

kernels::KVTensorView KVSegment::keys() const {
  kernels::KVTensorView v = snapshot.keys();
  v.length = length;
  return v;
}

kernels::KVTensorView KVSegment::values() const {
  kernels::KVTensorView v = snapshot.values();
  v.length = length;
  return v;
}

KVCache::ExactStage KVSegment::sink() const {
  KVCache::ExactStage s;
  const KVCacheMeta& m = snapshot.meta();
  if (begin != 0 || length == 0 || !channel_keys(m) || !m.recent_exact) return s;
  const size_t vw = value_window_plane(m);
  s.sink_keys = snapshot.plane(vw + 1).as<uint16_t>();
  s.sink_values = snapshot.plane(vw + 2).as<uint16_t>();
  s.sink_rows = sink_rows(m.group_size);
  s.sink = std::min<int64_t>(s.sink_rows, length);
  s.block = s.lo = s.xlo = length;  // no recent block: n 0, and no value read as appended
  s.vwin = value_window_rows(m.group_size);
  return s;
}

const void* KVSegment::id() const { return snapshot.data_id(); }

KVSegment KVSegment::cut(int64_t n) const {
  const int64_t unit = split_unit(snapshot.meta());
  check(n >= 0 && n <= length && n % unit == 0, ErrorCode::kOutOfRange, "kv_segment_cut",
        "a segment of ", length, " positions is cut at a multiple of ", unit,
        " (the group size for per-channel keys) within it; got ", n);
  return {snapshot, begin, n};
}

namespace {
// The format and dims a segment and the cache it continues must share (attention reads them with one rotation).
void check_same_format(const KVCacheMeta& a, const KVCacheMeta& b, const char* op) {
  check(a.spec().name() == b.spec().name() && a.seed == b.seed && a.B == b.B && a.H == b.H && a.Dk == b.Dk &&
            a.Dv == b.Dv,
        ErrorCode::kInvalidArgument, op, "a shared segment must have its cache's format and dims: segment ",
        a.spec().name(), " seed ", a.seed, " [", a.B, ", ", a.H, "] Dk ", a.Dk, " Dv ", a.Dv, ", cache ",
        b.spec().name(), " seed ", b.seed, " [", b.B, ", ", b.H, "] Dk ", b.Dk, " Dv ", b.Dv);
}
}  // namespace

void check_segments(const std::vector<KVSegment>& segments, const KVCache& rest, const char* op) {
  const KVCacheMeta rm = rest.meta();
  check(rm.has_dims && rm.window == 0, ErrorCode::kInvalidArgument, op,
        "shared segments continue a cache with dims and no sliding window; got ", rm.has_dims ? "window " : "no dims",
        rm.has_dims ? rm.window : 0);
  int64_t pos = 0;
  for (const KVSegment& g : segments) {
    check(g.begin == pos && g.length > 0 && g.length <= g.snapshot.length(), ErrorCode::kInvalidArgument, op,
          "segments must be contiguous from position 0, each within its snapshot: expected one at ", pos,
          "; got [", g.begin, ", ", g.begin + g.length, ") of a snapshot of ", g.snapshot.length());
    check_same_format(g.snapshot.meta(), rm, op);
    pos += g.length;
  }
  check(pos == rm.start, ErrorCode::kInvalidArgument, op, "the segments end at ", pos,
        "; the cache they continue starts at ", rm.start);
}

KVCacheSnapshot join_snapshot(const std::vector<KVSegment>& segments, const KVCache& rest) {
  const char* op = "kv_cache_join";
  check_segments(segments, rest, op);
  const KVCacheSnapshot tail = rest.snapshot();
  KVCacheMeta m = tail.meta();
  m.start = 0;
  m.length = tail.length() + rest.start();
  const std::vector<detail::PlaneShape> shapes = plane_shapes(m);
  const bool sink = channel_keys(m) && m.recent_exact && !segments.empty();
  const size_t first_sink = sink ? value_window_plane(m) + 1 : shapes.size();
  std::vector<Buffer> planes;
  const int64_t heads = m.B * m.H;
  for (size_t p = 0; p < shapes.size(); ++p) {
    const detail::PlaneShape& s = shapes[p];
    Buffer out(static_cast<size_t>(heads * s.rows(m.length) * s.row_bytes));
    uint8_t* dst = out.as<uint8_t>();
    if (s.row_bytes > 0 && s.per == 0) {  // fixed rows: the sink's from the first segment, the rest the cache's
      const KVCacheSnapshot& from = p >= first_sink ? segments.front().snapshot : tail;
      if (from.length() > 0) std::memcpy(dst, from.plane(p).data(), out.nbytes());
    } else if (s.row_bytes > 0) {
      const int64_t drows = s.rows(m.length);
      int64_t at = 0;  // rows written per head
      auto append = [&](const KVCacheSnapshot& src, int64_t positions) {
        const int64_t rows = s.rows(positions), srows = s.rows(src.length());
        if (rows == 0) return;  // an empty part (a cache with no positions past its start) has no buffer
        for (int64_t bh = 0; bh < heads; ++bh)
          std::memcpy(dst + (bh * drows + at) * s.row_bytes, src.plane(p).as<uint8_t>() + bh * srows * s.row_bytes,
                      static_cast<size_t>(rows * s.row_bytes));
        at += rows;
      };
      for (const KVSegment& g : segments) append(g.snapshot, g.length);
      append(tail, tail.length());
    }
    planes.push_back(std::move(out));
  }
  return KVCacheSnapshot(m, std::move(planes));
}

// ---- KVStore ------------------------------------------------------------------------------------------------------

namespace detail {

void KVStore::reset(int64_t B, int64_t H, std::vector<PlaneShape> shapes) {
  B_ = B;
  H_ = H;
  offset_ = 0;
  capacity_ = 0;
  shapes_ = std::move(shapes);
  planes_.clear();
  planes_.resize(shapes_.size());
}

void KVStore::clear() {
  B_ = H_ = offset_ = capacity_ = 0;
  shapes_.clear();
  planes_.clear();
}

uint8_t* KVStore::row(size_t p, int64_t b, int64_t h, int64_t t) const {
  return planes_[p].as<uint8_t>() + ((b * H_ + h) * shapes_[p].rows(capacity_) + t) * shapes_[p].row_bytes;
}

std::vector<const void*> KVStore::plane_pointers() const {
  std::vector<const void*> ptrs;
  for (const Buffer& b : planes_) ptrs.push_back(b.data());
  return ptrs;
}

int64_t planes_bytes(const std::vector<PlaneShape>& shapes, int64_t B, int64_t H, int64_t capacity) {
  int64_t n = 0;
  for (const PlaneShape& s : shapes) n += B * H * s.rows(capacity) * s.row_bytes;
  return n;
}

int64_t KVStore::nbytes() const { return planes_bytes(shapes_, B_, H_, capacity_); }

namespace {
// Copies the first `rows` rows of each (b, h) from a plane of src_rows rows per head to one of dst_rows.
void copy_head_rows(uint8_t* dst, int64_t dst_rows, const uint8_t* src, int64_t src_rows, int64_t rows,
                    int64_t row_bytes, int64_t heads) {
  if (rows <= 0 || row_bytes == 0) return;  // a plane of empty rows (symmetric values' biases) has no buffer
  for (int64_t bh = 0; bh < heads; ++bh)
    std::memcpy(dst + bh * dst_rows * row_bytes, src + bh * src_rows * row_bytes, static_cast<size_t>(rows * row_bytes));
}
}  // namespace

// Grows every plane to round_up(offset + n, kStep) positions, copying the valid rows [0, offset) of each (b, h);
// the new buffers are allocated before anything changes, so a failed allocation leaves the cache as it was.
void KVStore::reserve_append(int64_t n) {
  if (offset_ + n <= capacity_) return;
  reserve(round_up(offset_ + n, KVCache::kStep));
}

void KVStore::reserve(int64_t new_cap) {
  if (new_cap <= capacity_) return;
  std::vector<Buffer> grown;
  grown.reserve(planes_.size());
  for (size_t p = 0; p < planes_.size(); ++p) {
    const PlaneShape& s = shapes_[p];
    Buffer nb(static_cast<size_t>(B_ * H_ * s.rows(new_cap) * s.row_bytes));
    copy_head_rows(nb.as<uint8_t>(), s.rows(new_cap), planes_[p].as<uint8_t>(), s.rows(capacity_), s.rows(offset_),
                   s.row_bytes, B_ * H_);
    grown.push_back(std::move(nb));
  }
  planes_ = std::move(grown);
  capacity_ = new_cap;
}

void KVStore::drop_front(int64_t d) {
  if (d <= 0) return;
  for (size_t p = 0; p < planes_.size(); ++p) {
    const PlaneShape& s = shapes_[p];
    if (s.per == 0 || s.row_bytes == 0) continue;  // fixed rows (the residual window): not per position; empty rows
    const int64_t skip = d / s.per, keep = s.rows(offset_) - skip, rows = s.rows(capacity_);
    if (keep <= 0) continue;
    for (int64_t bh = 0; bh < B_ * H_; ++bh) {
      uint8_t* head = planes_[p].as<uint8_t>() + bh * rows * s.row_bytes;
      std::memmove(head, head + skip * s.row_bytes, static_cast<size_t>(keep * s.row_bytes));
    }
  }
  offset_ -= d;
}

std::vector<Buffer> KVStore::copy_valid(int64_t length) const {
  if (length < 0) length = offset_;
  std::vector<Buffer> out;
  for (size_t p = 0; p < planes_.size(); ++p) {
    const PlaneShape& s = shapes_[p];
    Buffer b(static_cast<size_t>(B_ * H_ * s.rows(length) * s.row_bytes));
    copy_head_rows(b.as<uint8_t>(), s.rows(length), planes_[p].as<uint8_t>(), s.rows(capacity_), s.rows(length),
                   s.row_bytes, B_ * H_);
    out.push_back(std::move(b));
  }
  return out;
}

KVStore KVStore::copy_suffix(int64_t from) const {
  KVStore out;
  out.B_ = B_;
  out.H_ = H_;
  out.shapes_ = shapes_;
  out.offset_ = offset_ - from;
  out.capacity_ = round_up(out.offset_, KVCache::kStep);
  for (size_t p = 0; p < planes_.size(); ++p) {
    const PlaneShape& s = shapes_[p];
    const int64_t skip = s.per == 0 ? 0 : from / s.per;  // fixed rows stay whole
    Buffer nb(static_cast<size_t>(B_ * H_ * s.rows(out.capacity_) * s.row_bytes));
    copy_head_rows(nb.as<uint8_t>(), s.rows(out.capacity_), planes_[p].as<uint8_t>() + skip * s.row_bytes,
                   s.rows(capacity_), s.per == 0 ? s.rows(out.offset_) : s.rows(offset_) - skip, s.row_bytes,
                   B_ * H_);
    out.planes_.push_back(std::move(nb));
  }
  return out;
}

void KVStore::load(const std::vector<const void*>& planes, int64_t length) {
  const int64_t cap = round_up(length, KVCache::kStep);
  std::vector<Buffer> fresh;
  for (size_t p = 0; p < shapes_.size(); ++p) {
    const PlaneShape& s = shapes_[p];
    Buffer nb(static_cast<size_t>(B_ * H_ * s.rows(cap) * s.row_bytes));
    copy_head_rows(nb.as<uint8_t>(), s.rows(cap), static_cast<const uint8_t*>(planes[p]), s.rows(length),
                   s.rows(length), s.row_bytes, B_ * H_);
    fresh.push_back(std::move(nb));
  }
  planes_ = std::move(fresh);
  capacity_ = cap;
  offset_ = length;
}

KVStore KVStore::copy_prefix(int64_t length) const {
  check(length >= 0 && length <= offset_, ErrorCode::kOutOfRange, "kv_cache_copy", "length must be in [0, ", offset_,
        "] (the stored positions); got ", length);
  KVStore out;
  out.B_ = B_;
  out.H_ = H_;
  out.shapes_ = shapes_;
  out.capacity_ = round_up(length, KVCache::kStep);
  out.offset_ = length;
  for (size_t p = 0; p < planes_.size(); ++p) {
    const PlaneShape& s = shapes_[p];
    Buffer nb(static_cast<size_t>(B_ * H_ * s.rows(out.capacity_) * s.row_bytes));
    copy_head_rows(nb.as<uint8_t>(), s.rows(out.capacity_), planes_[p].as<uint8_t>(), s.rows(capacity_),
                   s.rows(length), s.row_bytes, B_ * H_);
    out.planes_.push_back(std::move(nb));
  }
  return out;
}

}  // namespace detail

// ---- shared cache operations ----------------------------------------------------------------------------------------

namespace {

int64_t trim_store(const KVCache& cache, detail::KVStore& store, int64_t n) {
  check(n >= 0, ErrorCode::kInvalidArgument, "kv_cache_trim", "n must be >= 0; got ", n);
  check(cache.can_trim(n), ErrorCode::kOutOfRange, "kv_cache_trim", "a sliding-window cache (window ",
        cache.window(), ") that dropped positions [0, ", cache.start(), ") keeps the ", cache.window() - 1,
        " positions before its end for the next query; trimming ", n, " of its positions [", cache.start(), ", ",
        cache.end(), ") would need position ", cache.end() - n - cache.window() + 1, ", already dropped");
  const int64_t removed = n < store.offset() ? n : store.offset();
  store.set_offset(store.offset() - removed);
  return removed;
}

// copy_prefix(end)'s rule: the positions a trim back to `end` keeps, and what the next query needs, are stored.
void check_copy_prefix(const KVCache& cache, int64_t end) {
  check(end >= cache.start() && end <= cache.end() && cache.can_trim(cache.end() - end), ErrorCode::kOutOfRange,
        "kv_cache_copy", "a copy ends within the stored positions [", cache.start(), ", ", cache.end(),
        "], and a sliding-window cache (window ", cache.window(), ") that dropped positions keeps the ",
        cache.window() - 1, " before the copy's end; got end ", end);
}

KVCacheSnapshot snapshot_store(const KVCacheMeta& meta, const detail::KVStore& store) {
  if (!store.has_dims()) return KVCacheSnapshot(meta, {});
  return KVCacheSnapshot(meta, store.copy_valid());
}

// Sliding-window caches, before an append of n positions that does not fit the storage: when growing would pass the
// bound (window_capacity), drops the positions the next query no longer sees (all but the last W − 1, in multiples
// of align) and sets the storage to the bound; an append larger than the slack grows it further (reserve_append).
// Returns the positions dropped.
int64_t make_room(detail::KVStore& store, int64_t window, int64_t align, int64_t n) {
  if (window <= 0 || store.offset() + n <= store.capacity()) return 0;
  const int64_t bound = window_capacity(window, align, KVCache::kWindowSlack);
  if (round_up(store.offset() + n, KVCache::kStep) <= bound) return 0;  // the usual growth stays within the bound
  int64_t d = std::max<int64_t>(0, store.offset() - (window - 1));
  d -= d % align;
  store.reserve(bound);  // allocated before anything moves: a failure leaves the cache as it was
  store.drop_front(d);
  return d;
}

// Builds the storage a snapshot describes (into a fresh store, so a failure leaves the cache untouched).
detail::KVStore store_from_snapshot(const KVCacheSnapshot& s) {
  detail::KVStore store;
  const KVCacheMeta& m = s.meta();
  if (!m.has_dims) return store;
  store.reset(m.B, m.H, plane_shapes(m));
  std::vector<const void*> src;
  for (size_t p = 0; p < s.num_planes(); ++p) src.push_back(s.plane(p).data());
  store.load(src, m.length);
  return store;
}

// The rotations a cache with these dims uses (identity placeholders before the dims are known).
std::pair<Rotation, Rotation> make_rotations(const KVCacheMeta& m) {
  if (!m.has_dims) return {};
  return {Rotation(m.Dk, m.spec().key_rotation(), m.seed), Rotation(m.Dv, m.rotation, m.seed)};
}

}  // namespace

// ---- QuantizedKVCache -----------------------------------------------------------------------------------------------

QuantizedKVCache::QuantizedKVCache(const QuantizedKVCacheConfig& config) : config_(config) {
  config.spec().validate("quantized_kv_cache");
  check_window(config.window, "quantized_kv_cache");
}

KVCacheMeta QuantizedKVCache::meta() const {
  KVCacheMeta m;
  m.quantized = true;
  m.k_bits = config_.k_bits;
  m.v_bits = config_.v_bits;
  m.group_size = config_.group_size;
  m.scale_dtype = config_.scale_dtype;
  m.rotation = config_.rotation;
  m.seed = config_.seed;
  m.has_dims = store_.has_dims();
  m.B = store_.B();
  m.H = store_.H();
  m.Dk = Dk_;
  m.Dv = Dv_;
  m.length = store_.offset();
  m.key_layout = config_.key_layout;
  m.key_outliers = config_.key_outliers;
  m.v_symmetric = config_.v_symmetric;
  m.recent_exact = config_.recent_exact;
  m.window = config_.window;
  m.start = start_;
  return m;
}

kernels::KVTensorView QuantizedKVCache::keys() const {
  return make_view(meta(), true, store_.plane_pointers(), store_.capacity());
}

kernels::KVTensorView QuantizedKVCache::values() const {
  return make_view(meta(), false, store_.plane_pointers(), store_.capacity());
}

std::pair<kernels::KVTensorView, kernels::KVTensorView> QuantizedKVCache::update_and_fetch(const TensorView& keys,
                                                                                           const TensorView& values) {
  const char* op = "kv_cache_update";
  check_append_inputs(keys, values, op);
  check_append_dims(store_, Dk_, Dv_, keys, values, op);
  check_finite(keys, op, "keys");
  check_finite(values, op, "values");
  if (!pending_q_.empty())  // the observed queries: those of these keys' positions
    check(keys.dim(0) == pending_B_ && pending_Hq_ % keys.dim(1) == 0 && keys.dim(3) == pending_D_ &&
              keys.dim(2) == pending_rows_,
          ErrorCode::kShapeMismatch, op, "the observed queries [", pending_B_, ", ", pending_Hq_, ", ", pending_rows_,
          ", ", pending_D_, "] must match the keys ", keys.shape_string(),
          " (same B, positions and head dim, query heads a multiple of KV heads)");
  if (!pending_q_.empty())  // the statistics count them in one byte (quant/kv_stats.h)
    check(pending_Hq_ / keys.dim(1) <= 255, ErrorCode::kShapeMismatch, op,
          "outlier channels take at most 255 query heads per KV head; got ", pending_Hq_, " over ", keys.dim(1));
  if (!store_.has_dims()) {
    // First append: the dims become part of the cache (validated against the format before anything changes).
    KVCacheMeta m = meta();
    m.has_dims = true;
    m.B = keys.dim(0);
    m.H = keys.dim(1);
    m.Dk = keys.dim(3);
    m.Dv = values.dim(3);
    m.spec().validate_head_dims(m.Dk, m.Dv, op);
    auto rots = make_rotations(m);
    store_.reset(m.B, m.H, plane_shapes(m));
    Dk_ = m.Dk;
    Dv_ = m.Dv;
    key_rot_ = std::move(rots.first);
    value_rot_ = std::move(rots.second);
  }
  const int64_t n = keys.dim(2);
  const int gs = config_.group_size;
  const DType sd = config_.scale_dtype;
  const bool channel = config_.key_layout == KeyLayout::kChannel;
  if (channel && sd == DType::kF16) check_f16_range(keys, op);  // block scales are written later: check now
  start_ += make_room(store_, config_.window, window_align(config_.spec()), n);
  const int64_t start = store_.offset();
  store_.reserve_append(n);
  for (int64_t b = 0; b < store_.B() && n > 0; ++b)
    for (int64_t h = 0; h < store_.H(); ++h) {
      // Planes 0..2: key codes, scales, biases; 3..5: the same for values (see KVCacheSnapshot).
      if (!channel)
        append_rows(keys, b, h, key_rot_, store_.row(0, b, h, start), store_.row(1, b, h, start),
                    store_.row(2, b, h, start), sd, config_.k_bits, gs);
      append_rows(values, b, h, value_rot_, store_.row(3, b, h, start), store_.row(4, b, h, start),
                  config_.v_symmetric ? nullptr : store_.row(5, b, h, start), sd, config_.v_bits, gs,
                  config_.v_symmetric);
    }
  const std::vector<detail::PlaneShape> shapes = plane_shapes(meta());
  for (size_t p : {1, 2, 4, 5})
    if (p > 3 || !channel)
      check_stored_finite(store_, p, (p < 3 ? Dk_ : Dv_) / gs, sd, start, n, shapes, op, p < 3 ? "keys" : "values",
                          p % 3 == 1 ? "scale" : "bias");
  // The observed queries per KV head and position: [B, H, n, Dk + 1], Σ over the head's group (empty: none shown).
  std::vector<float> qstats;
  if (!pending_q_.empty() && n > 0 && config_.key_outliers > 0) {
    const int64_t rep = pending_Hq_ / store_.H(), W = Dk_ + 1;
    qstats.assign(static_cast<size_t>(store_.B() * store_.H() * n * W), 0.0f);
    for (int64_t b = 0; b < store_.B(); ++b)
      for (int64_t hq = 0; hq < pending_Hq_; ++hq) {
        const std::vector<float>& src = pending_q_[static_cast<size_t>(b * pending_Hq_ + hq)];
        float* dst = qstats.data() + (b * store_.H() + hq / rep) * n * W;
        for (int64_t i = 0; i < n * W; ++i) dst[i] += src[static_cast<size_t>(i)];
      }
  }
  pending_q_.clear();
  pending_rows_ = 0;
  if (config_.recent_exact) build_stage(start, &keys, &values);  // before the residual windows change
  if (channel) append_channel_keys(keys, start, qstats);  // nothing can fail from here on
  store_.set_offset(start + n);
  if (config_.recent_exact) {  // from the stage's appended rows: the values' window and the sink
    const int64_t end = start + n, V = value_window_rows(gs), nw = end / V * V, ns = sink_held();
    const size_t vw = value_window_plane(meta());
    for (int64_t b = 0; b < store_.B(); ++b)
      for (int64_t h = 0; h < store_.H(); ++h) {
        const int64_t bh = b * store_.H() + h;
        if (end > nw)  // the run of end's window, as appended (the stage's exact rows start at or before nw)
          std::memcpy(store_.row(vw, b, h, 0), stage_x_.data() + (bh * stage_n_ + (nw - stage_lo_)) * Dv_,
                      static_cast<size_t>((end - nw) * Dv_) * sizeof(uint16_t));
        if (start < ns) {  // the sink positions [start, min(end, ns)): the stage starts at 0
          const int64_t m = std::min<int64_t>(end, ns) - start;
          std::memcpy(store_.row(vw + 1, b, h, start), stage_k_.data() + (bh * stage_n_ + start) * Dk_,
                      static_cast<size_t>(m * Dk_) * sizeof(uint16_t));
          std::memcpy(store_.row(vw + 2, b, h, start), stage_x_.data() + (bh * stage_n_ + start) * Dv_,
                      static_cast<size_t>(m * Dv_) * sizeof(uint16_t));
        }
      }
  }
  return {this->keys(), this->values()};
}

void QuantizedKVCache::observe_queries(const TensorView& q) {
  const char* op = "kv_cache_observe_queries";
  if (config_.key_outliers == 0) return;
  check_rank(q, 4, op, "queries");
  check_float_dtype(q, op, "queries");
  check_cpu(q, op, "queries");
  if (q.numel() == 0) return;
  check_not_null(q, op, "queries");
  const int64_t B = q.dim(0), Hq = q.dim(1), m = q.dim(2), D = q.dim(3);
  if (store_.has_dims())
    check(B == store_.B() && Hq % store_.H() == 0 && D == Dk_, ErrorCode::kShapeMismatch, op,
          "queries [B, Hq, n, Dk] must have the cache's B ", store_.B(), ", head dim ", Dk_,
          " and a multiple of its ", store_.H(), " KV heads; got ", q.shape_string());
  if (pending_q_.empty()) {
    pending_B_ = B;
    pending_Hq_ = Hq;
    pending_D_ = D;
    pending_rows_ = 0;
    pending_q_.assign(static_cast<size_t>(B * Hq), {});
  }
  check(B == pending_B_ && Hq == pending_Hq_ && D == pending_D_, ErrorCode::kShapeMismatch, op,
        "queries must keep their shape [", pending_B_, ", ", pending_Hq_, ", n, ", pending_D_, "] until the append; got ",
        q.shape_string());
  // Per (b, query head) and position: q² per channel, then 1 (a row with a non-finite element says nothing about the
  // keys' channels: zeros, count 0).
  std::vector<float> row(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      std::vector<float>& dst = pending_q_[static_cast<size_t>(b * Hq + h)];
      dst.reserve(dst.size() + static_cast<size_t>(m * (D + 1)));
      for (int64_t t = 0; t < m; ++t) {
        const int64_t base = b * q.stride_of(0) + h * q.stride_of(1) + t * q.stride_of(2);
        if (q.dtype == DType::kF32 && q.stride_of(3) == 1) {
          std::memcpy(row.data(), static_cast<const float*>(q.data) + base, static_cast<size_t>(D) * sizeof(float));
        } else {
          for (int64_t d = 0; d < D; ++d) row[static_cast<size_t>(d)] = load_float(q.data, q.dtype, base + d * q.stride_of(3));
        }
        bool finite = true;
        for (float x : row) finite &= std::isfinite(x);
        const size_t at = dst.size();
        dst.resize(at + static_cast<size_t>(D) + 1);
        float* o = dst.data() + at;
        for (int64_t d = 0; d < D; ++d) o[d] = finite ? row[static_cast<size_t>(d)] * row[static_cast<size_t>(d)] : 0.0f;
        o[D] = finite ? 1.0f : 0.0f;
      }
    }
  pending_rows_ += m;
}

// Per-channel keys: positions [start, start + n) go to the residual window in runs that end where a block fills;
// each filled block is quantized per channel into its codes and its scale/bias row.
// With outlier channels, each position's query statistics (qstats [B, H, n, Dk + 1], or zeros when empty) go to the
// same row of plane 9.
void QuantizedKVCache::append_channel_keys(const TensorView& keys, int64_t start, const std::vector<float>& qstats) {
  const int64_t gs = config_.group_size, n = keys.dim(2), W = Dk_ + 1;
  for (int64_t done = 0; done < n;) {
    const int64_t pos = start + done, r = pos % gs, run = std::min(n - done, gs - r);
    TensorView part = keys;  // positions [done, done + run) of the append
    part.data = static_cast<uint8_t*>(keys.data) + done * keys.stride_of(2) * dtype_size(keys.dtype);
    part.shape[2] = run;
    for (int64_t b = 0; b < store_.B(); ++b)
      for (int64_t h = 0; h < store_.H(); ++h) {
        append_rows(part, b, h, key_rot_, store_.row(kResidualPlane, b, h, r), nullptr, nullptr, DType::kBF16, 0, 0);
        if (config_.key_outliers > 0) {  // one byte per channel (a ranking's weights), the count as it is
          uint8_t* st = store_.row(kQueryStatsPlane, b, h, r);
          if (qstats.empty()) {
            std::memset(st, 0, static_cast<size_t>(run * W));
          } else {
            const float* src = qstats.data() + ((b * store_.H() + h) * n + done) * W;
            for (int64_t t = 0; t < run; ++t, src += W, st += W) {  // Dk_ channel statistics, then the count
              for (int64_t d = 0; d < Dk_; ++d) st[d] = quant::kv_stat_encode(src[d]);
              st[Dk_] = static_cast<uint8_t>(src[Dk_]);
            }
          }
        }
        if (r + run == gs) quantize_block(b, h, pos / gs);
      }
    done += run;
  }
}

// The recent block read unquantized: the stage becomes positions [lo, end + n), lo = ⌊end/gs⌋·gs — end's block, then
// the n rows of keys / values when given (an append of positions [end, end + n)), in bfloat16: keys as the keys'
// residual window stores them; values (rotated) twice: as their codes read (c·s + b; the sink's as appended), and, from
// xlo = ⌊end/V⌋·V on (every window a query of this append can read), as appended — the values' window's rows, then
// the new ones. The coded values the stage held for [lo, end) are taken again when it still has them (a decode step
// reads its block again).
void QuantizedKVCache::build_stage(int64_t end, const TensorView* keys, const TensorView* values) {
  const int64_t gs = config_.group_size, V = value_window_rows(gs), lo = end / gs * gs, xlo = end / V * V,
                keep = end - lo, n = keys ? keys->dim(2) : 0, rows = keep + n, ns = sink_held();
  const size_t vw = value_window_plane(meta());
  const int64_t reuse_from =
      stage_n_ > 0 && stage_start_ == start_ && stage_lo_ <= lo && stage_lo_ + stage_n_ == end ? lo - stage_lo_ : -1;
  const int64_t old_n = stage_n_;
  const bool reuse = reuse_from >= 0 && keep > 0;
  if (reuse) stage_v_.swap(stage_v_prev_);  // the old rows stay in stage_v_prev_ while stage_v_ is refilled
  resize_stage(static_cast<size_t>(store_.B() * store_.H() * rows));
  for (int64_t b = 0; b < store_.B(); ++b)
    for (int64_t h = 0; h < store_.H(); ++h) {
      const int64_t bh = b * store_.H() + h;
      uint16_t* sk = stage_k_.data() + bh * rows * Dk_;
      uint16_t* sv = stage_v_.data() + bh * rows * Dv_;
      uint16_t* sx = stage_x_.data() + bh * rows * Dv_;
      if (keep > 0) {
        std::memcpy(sk, store_.row(kResidualPlane, b, h, 0), static_cast<size_t>(keep * Dk_) * sizeof(uint16_t));
        if (reuse) {
          std::memcpy(sv, stage_v_prev_.data() + (bh * old_n + reuse_from) * Dv_,
                      static_cast<size_t>(keep * Dv_) * sizeof(uint16_t));
        } else {
          const int64_t m = std::clamp<int64_t>(ns - lo, 0, keep);  // kept sink rows
          if (m > 0) std::memcpy(sv, store_.row(vw + 2, b, h, lo), static_cast<size_t>(m * Dv_) * sizeof(uint16_t));
          dequantize_values(b, h, lo + m, keep - m, sv + m * Dv_);
        }
        if (end > xlo)
          std::memcpy(sx + (xlo - lo) * Dv_, store_.row(vw, b, h, 0), static_cast<size_t>((end - xlo) * Dv_) * sizeof(uint16_t));
      }
      if (n > 0) {
        append_rows(*keys, b, h, key_rot_, sk + keep * Dk_, nullptr, nullptr, DType::kBF16, 0, 0);
        append_rows(*values, b, h, value_rot_, sx + keep * Dv_, nullptr, nullptr, DType::kBF16, 0, 0);
        const int64_t m = std::clamp<int64_t>(ns - end, 0, n);  // new sink rows: as appended
        if (m > 0) std::memcpy(sv + keep * Dv_, sx + keep * Dv_, static_cast<size_t>(m * Dv_) * sizeof(uint16_t));
        dequantize_values(b, h, end + m, n - m, sv + (keep + m) * Dv_);
      }
    }
  stage_lo_ = lo;
  stage_n_ = rows;
  stage_start_ = start_;
  stage_xlo_ = xlo;
  const size_t nv = stage_v_.size();
  if (stage_v_prev_.capacity() > 2 * nv + 4096) std::vector<uint16_t>().swap(stage_v_prev_);  // a prompt chunk's
}

// count rows of values from storage position pos, as attention reads their codes (rotated space, c·s + b, or
// c·d − 2^(bits−1)·d when symmetric), rounded to bfloat16.
void QuantizedKVCache::dequantize_values(int64_t b, int64_t h, int64_t pos, int64_t count, uint16_t* out) const {
  const int64_t gs = config_.group_size;
  const int bits = config_.v_bits;
  for (int64_t t = 0; t < count; ++t) {
    const auto* codes = reinterpret_cast<const uint32_t*>(store_.row(3, b, h, pos + t));
    const void* sc = store_.row(4, b, h, pos + t);
    const void* bi = config_.v_symmetric ? nullptr : store_.row(5, b, h, pos + t);
    for (int64_t g = 0; g < Dv_ / gs; ++g) {
      const float step = load_float(sc, config_.scale_dtype, g);
      const float bias = bi ? load_float(bi, config_.scale_dtype, g) : quant::symmetric_bias(step, bits);
      for (int64_t d = g * gs; d < (g + 1) * gs; ++d)
        out[t * Dv_ + d] = f32_to_bf16(static_cast<float>(quant::unpack_code(codes, d, bits)) * step + bias);
    }
  }
}

// The stage's buffers for `rows` rows: a prompt chunk's stage is released when a decode step needs a block's worth (the
// stage stays until the next append, so a chunk-sized one would otherwise be held for the whole session).
void QuantizedKVCache::resize_stage(size_t rows) {
  const size_t nk = rows * static_cast<size_t>(Dk_), nv = rows * static_cast<size_t>(Dv_);
  if (stage_k_.capacity() > 2 * nk + 4096) std::vector<uint16_t>().swap(stage_k_);
  if (stage_v_.capacity() > 2 * nv + 4096) std::vector<uint16_t>().swap(stage_v_);
  if (stage_x_.capacity() > 2 * nv + 4096) std::vector<uint16_t>().swap(stage_x_);
  // Every row attention reads is written by build_stage (of stage_x_, those from stage_xlo_ on): no zero fill.
  stage_k_.resize(nk);
  stage_v_.resize(nv);
  stage_x_.resize(nv);
}

// After trim, restore or copy_prefix: the stage is the incomplete block, from the residual windows.
void QuantizedKVCache::stage_from_residual() {
  stage_k_.clear();
  stage_v_.clear();
  stage_x_.clear();
  stage_lo_ = stage_n_ = stage_start_ = stage_xlo_ = 0;
  if (config_.recent_exact && store_.has_dims()) build_stage(store_.offset(), nullptr, nullptr);
}

KVCache::ExactStage QuantizedKVCache::exact_stage() const {
  if (!config_.recent_exact || !store_.has_dims()) return {};
  ExactStage s;
  s.keys = stage_k_.data();
  s.values = stage_v_.data();
  s.values_exact = stage_x_.data();
  s.xlo = stage_xlo_;
  s.vwin = value_window_rows(config_.group_size);
  s.lo = stage_lo_;
  s.n = stage_n_;
  s.block = config_.group_size;
  if (sink_held() > 0 && store_.offset() > 0) {
    const size_t vr = value_window_plane(meta());
    s.sink_keys = reinterpret_cast<const uint16_t*>(store_.row(vr + 1, 0, 0, 0));
    s.sink_values = reinterpret_cast<const uint16_t*>(store_.row(vr + 2, 0, 0, 0));
    s.sink_rows = sink_rows(config_.group_size);
    s.sink = std::min<int64_t>(s.sink_rows, store_.offset());
  }
  return s;
}

int64_t QuantizedKVCache::sink_held() const {
  return config_.recent_exact && start_ == 0 ? sink_rows(config_.group_size) : 0;
}

void QuantizedKVCache::quantize_block(int64_t b, int64_t h, int64_t block) {
  const int64_t gs = config_.group_size;
  std::vector<float> rows(static_cast<size_t>(gs * Dk_));
  const auto* res = reinterpret_cast<const uint16_t*>(store_.row(kResidualPlane, b, h, 0));
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = bf16_to_f32(res[i]);
  if (const int64_t ns = sink_held(); block == 0 && ns > 0 && ns < gs) {
    // The sink positions are read from their own bfloat16 rows, never from these codes: their keys (the first
    // position's often far outside the others' range) must not set the block's channel ranges. They are quantized as
    // copies of the first position after them.
    for (int64_t t = 0; t < ns; ++t)
      std::copy_n(rows.begin() + ns * Dk_, Dk_, rows.begin() + t * Dk_);
  }
  quant::affine_quantize_columns(rows.data(), Dk_, gs, Dk_, config_.k_bits,
                                 reinterpret_cast<uint32_t*>(store_.row(0, b, h, block * gs)),
                                 quant::packed_words(Dk_, config_.k_bits), store_.row(1, b, h, block),
                                 store_.row(2, b, h, block), config_.scale_dtype);
  if (config_.key_outliers > 0) refine_outliers(b, h, block, rows);
}

// The block's outlier channels: the key_outliers channels with the largest range × RMS of the block's own queries
// (range alone when none was shown; ties to the lower channel), in ascending order, each refined by 4 bits.
void QuantizedKVCache::refine_outliers(int64_t b, int64_t h, int64_t block, const std::vector<float>& rows) {
  const int64_t gs = config_.group_size, D = Dk_, n = config_.key_outliers;
  const DType sd = config_.scale_dtype;
  std::vector<double> st(static_cast<size_t>(D + 1), 0.0);  // Σ over the block's positions, in position order
  for (int64_t t = 0; t < gs; ++t) {
    const uint8_t* row = store_.row(kQueryStatsPlane, b, h, t);
    for (int64_t d = 0; d < D; ++d) st[static_cast<size_t>(d)] += quant::kv_stat_decode(row[d]);
    st[static_cast<size_t>(D)] += row[D];
  }
  const double count = st[static_cast<size_t>(D)];
  // Each channel's range over the block's positions, position by position (rows are [gs, D]: the row order reads
  // them contiguously; per channel the same sequence of min / max as a column walk).
  std::vector<float> lo(rows.begin(), rows.begin() + D), hi = lo;
  for (int64_t t = 1; t < gs; ++t) {
    const float* r = rows.data() + t * D;
    for (int64_t d = 0; d < D; ++d) {
      lo[static_cast<size_t>(d)] = std::min(lo[static_cast<size_t>(d)], r[d]);
      hi[static_cast<size_t>(d)] = std::max(hi[static_cast<size_t>(d)], r[d]);
    }
  }
  std::vector<std::pair<double, int64_t>> score(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    const double w = count > 0.0 ? std::sqrt(st[static_cast<size_t>(d)] / count) : 1.0;
    score[static_cast<size_t>(d)] = {
        -(static_cast<double>(hi[static_cast<size_t>(d)]) - lo[static_cast<size_t>(d)]) * w, d};
  }
  std::partial_sort(score.begin(), score.begin() + n, score.end());
  std::vector<int64_t> chosen;
  for (int64_t o = 0; o < n; ++o) chosen.push_back(score[static_cast<size_t>(o)].second);
  std::sort(chosen.begin(), chosen.end());
  auto* index = reinterpret_cast<uint16_t*>(store_.row(kOutlierIndexPlane, b, h, block));
  uint8_t* codes = store_.row(kOutlierCodesPlane, b, h, block);
  std::memset(codes, 0, static_cast<size_t>(n * gs / 2));
  const void* sc = store_.row(1, b, h, block);
  const void* bi = store_.row(2, b, h, block);
  for (int64_t o = 0; o < n; ++o) {
    const int64_t d = chosen[static_cast<size_t>(o)];
    index[o] = static_cast<uint16_t>(d);
    const float scale = load_float(sc, sd, d), bias = load_float(bi, sd, d);
    const float step = quant::outlier_step(scale);
    for (int64_t t = 0; t < gs; ++t) {
      const auto* crow = reinterpret_cast<const uint32_t*>(store_.row(0, b, h, block * gs + t));
      // The coarse value as attention reads it (c·s + b in float32; kernels/kernel_table.h), then the residual.
      const float base = static_cast<float>(quant::unpack_code(crow, d, config_.k_bits)) * scale + bias;
      const uint32_t r = quant::outlier_code(rows[static_cast<size_t>(t * D + d)] - base, step);
      codes[o * gs / 2 + t / 2] |= static_cast<uint8_t>(r << (4 * (t % 2)));
    }
  }
}

int64_t QuantizedKVCache::trim(int64_t n) {
  const int64_t removed = trim_channel(n);
  stage_from_residual();
  return removed;
}

int64_t QuantizedKVCache::trim_channel(int64_t n) {
  const int64_t old = store_.offset(), removed = trim_store(*this, store_, n);
  if (config_.key_layout != KeyLayout::kChannel || removed == 0) return removed;
  const int64_t gs = config_.group_size, now = old - removed;
  if (config_.recent_exact) {
    // Back into an earlier run of the values' window: its kept positions return to it as their codes read (the
    // sink's as appended).
    const int64_t V = value_window_rows(gs), nw = now / V * V, ns = sink_held();
    const size_t vw = value_window_plane(meta());
    if (nw != old / V * V && now > nw)
      for (int64_t b = 0; b < store_.B(); ++b)
        for (int64_t h = 0; h < store_.H(); ++h) {
          auto* win = reinterpret_cast<uint16_t*>(store_.row(vw, b, h, 0));
          const int64_t m = std::clamp<int64_t>(ns - nw, 0, now - nw);
          if (m > 0) std::memcpy(win, store_.row(vw + 2, b, h, nw), static_cast<size_t>(m * Dv_) * sizeof(uint16_t));
          dequantize_values(b, h, nw + m, now - nw - m, win + m * Dv_);
        }
  }
  // Back into a quantized block: its kept positions return to the residual window, dequantized (bfloat16).
  const int64_t block = now / gs, kept = now % gs;
  if (block == old / gs || kept == 0) return removed;
  const int64_t nout = config_.key_outliers;
  for (int64_t b = 0; b < store_.B(); ++b)
    for (int64_t h = 0; h < store_.H(); ++h) {
      const void* sc = store_.row(1, b, h, block);
      const void* bi = store_.row(2, b, h, block);
      auto* res = reinterpret_cast<uint16_t*>(store_.row(kResidualPlane, b, h, 0));
      std::vector<float> row(static_cast<size_t>(Dk_));
      for (int64_t t = 0; t < kept; ++t) {
        const auto* codes = reinterpret_cast<const uint32_t*>(store_.row(0, b, h, block * gs + t));
        for (int64_t d = 0; d < Dk_; ++d)
          row[static_cast<size_t>(d)] = quant::affine_dequantize_value(
              quant::unpack_code(codes, d, config_.k_bits), load_float(sc, config_.scale_dtype, d),
              load_float(bi, config_.scale_dtype, d), config_.scale_dtype);
        if (nout > 0) {  // the outlier channels' refinement
          const auto* index = reinterpret_cast<const uint16_t*>(store_.row(kOutlierIndexPlane, b, h, block));
          const uint8_t* oc = store_.row(kOutlierCodesPlane, b, h, block);
          for (int64_t o = 0; o < nout; ++o) {  // as attention reads them: c·s + b in float32, refined
            const int64_t d = index[o];
            const uint32_t r = (oc[o * gs / 2 + t / 2] >> (4 * (t % 2))) & 15u;
            const float scale = load_float(sc, config_.scale_dtype, d);
            row[static_cast<size_t>(d)] = static_cast<float>(quant::unpack_code(codes, d, config_.k_bits)) * scale +
                                          load_float(bi, config_.scale_dtype, d) + quant::outlier_refinement(r, scale);
          }
        }
        for (int64_t d = 0; d < Dk_; ++d) res[t * Dk_ + d] = f32_to_bf16(row[static_cast<size_t>(d)]);
      }
      // Their queries were not kept with the block: none recorded for them.
      if (nout > 0)
        std::memset(store_.row(kQueryStatsPlane, b, h, 0), 0, static_cast<size_t>(kept * (Dk_ + 1)));
    }
  if (block == 0 && sink_held() > 0) {  // the sink's key codes are stand-ins: its keys as appended
    const int64_t m = std::min(kept, sink_held());
    for (int64_t b = 0; b < store_.B(); ++b)
      for (int64_t h = 0; h < store_.H(); ++h)
        std::memcpy(store_.row(kResidualPlane, b, h, 0), store_.row(value_window_plane(meta()) + 1, b, h, 0),
                    static_cast<size_t>(m * Dk_) * sizeof(uint16_t));
  }
  return removed;
}

KVCacheSnapshot QuantizedKVCache::snapshot() const { return snapshot_store(meta(), store_); }

void QuantizedKVCache::restore(const KVCacheSnapshot& snapshot) {
  const char* op = "kv_cache_restore";
  const KVCacheMeta& m = snapshot.meta();
  check(m.quantized, ErrorCode::kInvalidArgument, op,
        "a quantized cache restores only a quantized snapshot; got a plain one (dtype ", dtype_name(m.dtype), ")");
  check_meta(m, op);
  detail::KVStore fresh = store_from_snapshot(snapshot);
  auto rots = make_rotations(m);
  config_.k_bits = m.k_bits;
  config_.v_bits = m.v_bits;
  config_.group_size = m.group_size;
  config_.scale_dtype = m.scale_dtype;
  config_.rotation = m.rotation;
  config_.seed = m.seed;
  config_.key_layout = m.key_layout;
  config_.key_outliers = m.key_outliers;
  config_.v_symmetric = m.v_symmetric;
  config_.recent_exact = m.recent_exact;
  config_.window = m.window;
  start_ = m.start;
  Dk_ = m.Dk;
  Dv_ = m.Dv;
  key_rot_ = std::move(rots.first);
  value_rot_ = std::move(rots.second);
  store_ = std::move(fresh);
  stage_from_residual();
}

// Per-channel keys: the rows up to the end of the block `end` falls in (or all of them), then this cache's trim
// semantics on the copy — a cut inside a quantized block returns its kept positions to the residual window exactly as
// trim() does here. The fixed planes (residual window, its query statistics) are copied whole, as trim() keeps them.
std::unique_ptr<KVCache> QuantizedKVCache::copy_prefix(int64_t end) const {
  check_copy_prefix(*this, end);
  auto c = std::make_unique<QuantizedKVCache>(config_);
  if (!store_.has_dims()) return c;
  const int64_t kept = end - start_;
  int64_t rows = kept;
  if (config_.key_layout == KeyLayout::kChannel)
    rows = std::min(store_.offset(), round_up(kept, config_.group_size));
  c->Dk_ = Dk_;
  c->Dv_ = Dv_;
  c->key_rot_ = key_rot_;
  c->value_rot_ = value_rot_;
  c->start_ = start_;
  c->store_ = store_.copy_prefix(rows);
  c->trim(rows - kept);
  c->stage_from_residual();
  return c;
}

namespace {
void check_split(const KVCache& c, int64_t n, const char* op) {
  check(!c.empty(), ErrorCode::kInvalidArgument, op, "the cache has no dims yet (nothing appended)");
  check(c.window() == 0, ErrorCode::kUnsupported, op,
        "a sliding-window cache (window ", c.window(), ") is not split into shared segments");
  check(n >= 0 && n <= c.offset() && n % c.split_align() == 0, ErrorCode::kOutOfRange, op,
        "n must be a multiple of ", c.split_align(), " (the group size for per-channel keys) in [0, ", c.offset(),
        "] (the stored positions); got ", n);
}
// split_front's common part: the snapshot of positions [0, n) (start 0) and the store of the rest, both copied before
// anything changes (a failed allocation leaves the cache as it was).
KVCacheSnapshot split_store(KVCacheMeta m, detail::KVStore& store, int64_t n) {
  m.length = n;
  m.start = 0;
  KVCacheSnapshot snap(m, store.copy_valid(n));
  store = store.copy_suffix(n);
  return snap;
}
void check_empty_at(const KVCache& c, int64_t position, const char* op) {
  check(!c.empty(), ErrorCode::kInvalidArgument, op, "the cache has no dims yet (nothing appended)");
  check(c.window() == 0, ErrorCode::kUnsupported, op,
        "a sliding-window cache (window ", c.window(), ") does not start past position 0");
  check(position >= 0 && position % c.split_align() == 0, ErrorCode::kOutOfRange, op,
        "the position must be a multiple of ", c.split_align(), " (the group size for per-channel keys) and >= 0; got ",
        position);
}
}  // namespace

KVCacheSnapshot QuantizedKVCache::split_front(int64_t n) {
  check_split(*this, n, "kv_cache_split");
  KVCacheSnapshot snap = split_store(meta(), store_, n);
  start_ += n;
  stage_from_residual();
  return snap;
}

// A copy holding nothing (copy_prefix at its start), moved to `position`.
std::unique_ptr<KVCache> QuantizedKVCache::empty_at(int64_t position) const {
  check_empty_at(*this, position, "kv_cache_empty_at");
  auto c = copy_prefix(start_);
  static_cast<QuantizedKVCache&>(*c).start_ = position;
  return c;
}

// ---- PlainKVCache ---------------------------------------------------------------------------------------------------

PlainKVCache::PlainKVCache(const PlainKVCacheConfig& config) : config_(config) {
  config.spec().validate("plain_kv_cache");
  check_window(config.window, "plain_kv_cache");
}

KVCacheMeta PlainKVCache::meta() const {
  KVCacheMeta m;
  m.quantized = false;
  m.dtype = config_.dtype;
  m.rotation = config_.rotation;
  m.seed = config_.seed;
  m.has_dims = store_.has_dims();
  m.B = store_.B();
  m.H = store_.H();
  m.Dk = Dk_;
  m.Dv = Dv_;
  m.length = store_.offset();
  m.window = config_.window;
  m.start = start_;
  return m;
}

kernels::KVTensorView PlainKVCache::keys() const {
  return make_view(meta(), true, store_.plane_pointers(), store_.capacity());
}

kernels::KVTensorView PlainKVCache::values() const {
  return make_view(meta(), false, store_.plane_pointers(), store_.capacity());
}

std::pair<kernels::KVTensorView, kernels::KVTensorView> PlainKVCache::update_and_fetch(const TensorView& keys,
                                                                                       const TensorView& values) {
  const char* op = "kv_cache_update";
  check_append_inputs(keys, values, op);
  check_append_dims(store_, Dk_, Dv_, keys, values, op);
  check_finite(keys, op, "keys");
  check_finite(values, op, "values");
  if (!store_.has_dims()) {
    KVCacheMeta m = meta();
    m.has_dims = true;
    m.B = keys.dim(0);
    m.H = keys.dim(1);
    m.Dk = keys.dim(3);
    m.Dv = values.dim(3);
    m.spec().validate_head_dims(m.Dk, m.Dv, op);
    auto rots = make_rotations(m);
    store_.reset(m.B, m.H, plane_shapes(m));
    Dk_ = m.Dk;
    Dv_ = m.Dv;
    key_rot_ = std::move(rots.first);
    value_rot_ = std::move(rots.second);
  }
  start_ += make_room(store_, config_.window, window_align(config_.spec()), keys.dim(2));
  const int64_t n = keys.dim(2), start = store_.offset();
  store_.reserve_append(n);
  const DType dt = config_.dtype;
  for (int64_t b = 0; b < store_.B() && n > 0; ++b)
    for (int64_t h = 0; h < store_.H(); ++h) {
      append_rows(keys, b, h, key_rot_, store_.row(0, b, h, start), nullptr, nullptr, dt, 0, 0);
      append_rows(values, b, h, value_rot_, store_.row(1, b, h, start), nullptr, nullptr, dt, 0, 0);
    }
  const std::vector<detail::PlaneShape> shapes = plane_shapes(meta());
  check_stored_finite(store_, 0, Dk_, dt, start, n, shapes, op, "keys", "value");
  check_stored_finite(store_, 1, Dv_, dt, start, n, shapes, op, "values", "value");
  store_.set_offset(start + n);
  return {this->keys(), this->values()};
}

int64_t PlainKVCache::trim(int64_t n) { return trim_store(*this, store_, n); }

KVCacheSnapshot PlainKVCache::snapshot() const { return snapshot_store(meta(), store_); }

void PlainKVCache::restore(const KVCacheSnapshot& snapshot) {
  const char* op = "kv_cache_restore";
  const KVCacheMeta& m = snapshot.meta();
  check(!m.quantized, ErrorCode::kInvalidArgument, op,
        "a plain cache restores only a plain snapshot; got a quantized one (k_bits ", m.k_bits, ")");
  check_meta(m, op);
  detail::KVStore fresh = store_from_snapshot(snapshot);
  auto rots = make_rotations(m);
  config_.dtype = m.dtype;
  config_.rotation = m.rotation;
  config_.seed = m.seed;
  config_.window = m.window;
  start_ = m.start;
  Dk_ = m.Dk;
  Dv_ = m.Dv;
  key_rot_ = std::move(rots.first);
  value_rot_ = std::move(rots.second);
  store_ = std::move(fresh);
}

std::unique_ptr<KVCache> PlainKVCache::copy_prefix(int64_t end) const {
  check_copy_prefix(*this, end);
  auto c = std::make_unique<PlainKVCache>(config_);
  if (!store_.has_dims()) return c;
  c->Dk_ = Dk_;
  c->Dv_ = Dv_;
  c->key_rot_ = key_rot_;
  c->value_rot_ = value_rot_;
  c->start_ = start_;
  c->store_ = store_.copy_prefix(end - start_);
  return c;
}

KVCacheSnapshot PlainKVCache::split_front(int64_t n) {
  check_split(*this, n, "kv_cache_split");
  KVCacheSnapshot snap = split_store(meta(), store_, n);
  start_ += n;
  return snap;
}

std::unique_ptr<KVCache> PlainKVCache::empty_at(int64_t position) const {
  check_empty_at(*this, position, "kv_cache_empty_at");
  auto c = copy_prefix(start_);
  static_cast<PlainKVCache&>(*c).start_ = position;
  return c;
}

}  // namespace cider::nn
