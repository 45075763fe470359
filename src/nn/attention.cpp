// Attention over a KV cache: validation, query rotation, the kernel call, inverse value rotation, output store.
#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace cider::nn {

namespace {

constexpr const char* kOp = "attention";

int64_t offset4(const TensorView& t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return a * t.stride_of(0) + b * t.stride_of(1) + c * t.stride_of(2) + d * t.stride_of(3);
}

const char* mask_kind_name(kernels::MaskKind k) {
  switch (k) {
    case kernels::MaskKind::kNone: return "none";
    case kernels::MaskKind::kCausal: return "causal";
    case kernels::MaskKind::kBool: return "bool";
    case kernels::MaskKind::kAdditive: return "additive";
  }
  return "unknown";
}

// Validates the mask against [B, Hq, L, kL] and returns its element strides over those four dims (0 = broadcast).
void mask_strides(const AttentionMask& mask, const int64_t (&target)[4], int64_t (&strides)[4]) {
  using kernels::MaskKind;
  for (int64_t& s : strides) s = 0;
  const MaskKind kind = mask.kind;
  check(kind == MaskKind::kNone || kind == MaskKind::kCausal || kind == MaskKind::kBool || kind == MaskKind::kAdditive,
        ErrorCode::kInvalidArgument, kOp, "mask kind must be none, causal, bool or additive; got ",
        static_cast<int>(kind));
  check(mask.window >= 0, ErrorCode::kInvalidArgument, kOp, "mask window must be >= 0; got ", mask.window);
  check(mask.window == 0 || kind == MaskKind::kCausal, ErrorCode::kInvalidArgument, kOp,
        "a mask window applies only to causal masks; got window ", mask.window, " with a ", mask_kind_name(kind),
        " mask");
  const TensorView& m = mask.mask;
  if (kind == MaskKind::kNone || kind == MaskKind::kCausal) {
    check(m.data == nullptr && m.rank == 0, ErrorCode::kInvalidArgument, kOp, "a ", mask_kind_name(kind),
          " mask takes no mask tensor; got one of shape ", m.shape_string());
    return;
  }
  if (kind == MaskKind::kBool) {
    check_dtype(m, DType::kBool, kOp, "mask");
  } else {
    check_float_dtype(m, kOp, "mask");
  }
  check(m.rank >= 2 && m.rank <= 4, ErrorCode::kShapeMismatch, kOp, "mask rank must be 2 to 4; got ", m.rank,
        " (shape ", m.shape_string(), ")");
  check_cpu(m, kOp, "mask");
  check_not_null(m, kOp, "mask");
  for (int i = 0; i < m.rank; ++i) {
    const int t = 4 - m.rank + i;  // aligned on the right
    const int64_t d = m.dim(i);
    check(d == 1 || d == target[t], ErrorCode::kShapeMismatch, kOp, "mask must broadcast to [B, Hq, L, kL] = (",
          target[0], ", ", target[1], ", ", target[2], ", ", target[3], "); got ", m.shape_string());
    strides[t] = d == 1 ? 0 : m.stride_of(i);
  }
  if (kind == MaskKind::kAdditive) {
    // −inf hides a key; NaN or +inf would poison the softmax of the whole row.
    for (int64_t a = 0; a < target[0]; ++a)
      for (int64_t b = 0; b < target[1]; ++b)
        for (int64_t c = 0; c < target[2]; ++c)
          for (int64_t d = 0; d < target[3]; ++d) {
            const float v =
                load_float(m.data, m.dtype, a * strides[0] + b * strides[1] + c * strides[2] + d * strides[3]);
            check(!std::isnan(v) && v != std::numeric_limits<float>::infinity(), ErrorCode::kInvalidArgument, kOp,
                  "additive mask values must be finite or -inf; got ", v, " at [", a, ", ", b, ", ", c, ", ", d, "]");
          }
  }
}

// The recent block (KVCache::exact_stage): the keys the attention kernel left out (AttentionArgs::exact_block /
// exact_sink), read in bfloat16 and merged into the kernel's output o through its row log-sum-exp lse — the
// kernel table's recent_block (kernel_table.h RecentBlockArgs), over the query heads split across the pool.
void add_recent_block(const KVCache::ExactStage& st, const float* q, int64_t B, int64_t Hq, int64_t Hkv, int64_t L,
                      int64_t kL, int64_t Dk, int64_t Dv, float scale, float softcap, const AttentionMask& mask,
                      const int64_t (&mstride)[4], float* lse, float* o) {
  const int64_t n = st.sink + st.n;
  if (n == 0) return;
  kernels::RecentBlockArgs a{};
  a.q = q;
  a.out = o;
  a.lse = lse;
  a.B = B;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.L = L;
  a.kL = kL;
  a.Dk = Dk;
  a.Dv = Dv;
  a.scale = scale;
  a.softcap = softcap;
  a.mask_kind = mask.kind;
  a.window = mask.window;
  a.mask = mask.mask.data;
  a.mask_dtype = mask.mask.dtype;
  for (int i = 0; i < 4; ++i) a.mask_stride[i] = mstride[i];
  a.keys = st.keys;
  a.values = st.values;
  a.values_exact = st.values_exact;
  a.lo = st.lo;
  a.n = st.n;
  a.block = st.block;
  a.xlo = st.xlo;
  a.vwin = st.vwin;
  a.sink_keys = st.sink_keys;
  a.sink_values = st.sink_values;
  a.sink = st.sink;
  a.sink_rows = st.sink_rows;
  const auto fn = kernels::active_kernels().recent_block;
  const int64_t first = st.sink + kernels::recent_block_start(kL - L, st.block, st.lo) - st.lo;
  // A decode step's part (one row per head, up to a block of positions) is too small to hand to the pool.
  if (L * (n - first) * (Dk + Dv) < (1 << 16)) {
    a.row_begin = 0;
    a.row_end = B * Hq;
    fn(a);
    return;
  }
  default_thread_pool().parallel_for(B * Hq, [&](int64_t begin, int64_t end, int) {
    kernels::RecentBlockArgs part = a;
    part.row_begin = begin;
    part.row_end = end;
    fn(part);
  });
}

// The kernel's arguments shared by the cache's part and a segment's: queries q [B, Hq, L, Dk] (rotated), out
// [B, Hq, L, Dv], and the positions read elsewhere (the recent block, the sink) when stage.block > 0. No mask.
kernels::AttentionArgs kernel_args(const float* q, float* out, int64_t B, int64_t Hq, int64_t L,
                                   const kernels::KVTensorView& keys, const kernels::KVTensorView& values, float scale,
                                   float softcap, const KVCache::ExactStage& stage) {
  kernels::AttentionArgs args{};
  args.q = q;
  args.out = out;
  args.B = B;
  args.Hq = Hq;
  args.L = L;
  args.keys = keys;
  args.values = values;
  args.scale = scale;
  args.softcap = softcap;
  args.mask_kind = kernels::MaskKind::kNone;
  args.mask_dtype = DType::kF32;
  if (stage.block > 0) {  // the kernel takes the positions before the recent block and from the sink on
    args.exact_block = stage.block;
    args.exact_lo = stage.lo;
    args.exact_sink = stage.sink;
  }
  return args;
}

// o, lse [B·Hq, L, ·] ← the softmax-weighted merge of (o, lse) and (oc, lc) over rows [i0, i0 + Lc) of each
// (b, h): two normalised parts of one softmax over disjoint keys, each with its log-sum-exp (−inf: saw no key).
void merge_part(float* o, float* lse, const float* oc, const float* lc, int64_t BH, int64_t L, int64_t i0, int64_t Lc,
                int64_t Dv) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < BH; ++r)
    for (int64_t i = 0; i < Lc; ++i) {
      const float l1 = lse[r * L + i0 + i], l2 = lc[r * Lc + i];
      const float M = std::max(l1, l2);
      if (M == kNegInf) continue;
      const float w1 = l1 == kNegInf ? 0.0f : std::exp(l1 - M), w2 = l2 == kNegInf ? 0.0f : std::exp(l2 - M);
      const float inv = 1.0f / (w1 + w2);
      float* orow = o + (r * L + i0 + i) * Dv;
      const float* crow = oc + (r * Lc + i) * Dv;
      for (int64_t d = 0; d < Dv; ++d) orow[d] = (w1 * orow[d] + w2 * crow[d]) * inv;
      lse[r * L + i0 + i] = M + std::log(w1 + w2);
    }
}

// The queries' attention over one shared segment (every position visible: the queries come after it), merged into
// (o, lse): the kernel over the segment's codes (its sink, at position 0, left to add_recent_block), in chunks of at
// most the segment's length of query rows (the kernels' rows sit at positions they hold).
void add_segment(const KVSegment& g, const float* q, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t Dk,
                 int64_t Dv, float scale, float softcap, float* o, float* lse) {
  const kernels::KVTensorView keys = g.keys(), values = g.values();
  const KVCache::ExactStage sink = g.sink();
  const AttentionMask none;
  const int64_t no_stride[4] = {0, 0, 0, 0};
  const int64_t BH = B * Hq;
  for (int64_t i0 = 0; i0 < L; i0 += g.length) {
    const int64_t Lc = std::min(g.length, L - i0);
    std::vector<float> qc, oc(static_cast<size_t>(BH * Lc * Dv)), lc(static_cast<size_t>(BH * Lc));
    if (Lc < L) {  // a chunk of the rows: its queries contiguous (a decode step's one chunk is all of them)
      qc.resize(static_cast<size_t>(BH * Lc * Dk));
      for (int64_t r = 0; r < BH; ++r)
        std::memcpy(qc.data() + r * Lc * Dk, q + (r * L + i0) * Dk, static_cast<size_t>(Lc * Dk) * sizeof(float));
    }
    const float* qp = Lc < L ? qc.data() : q;
    kernels::AttentionArgs args = kernel_args(qp, oc.data(), B, Hq, Lc, keys, values, scale, softcap, sink);
    args.lse = lc.data();
    kernels::active_kernels().attention(args);
    if (sink.block > 0)
      add_recent_block(sink, qp, B, Hq, Hkv, Lc, g.length, Dk, Dv, scale, softcap, none, no_stride, lc.data(),
                       oc.data());
    merge_part(o, lse, oc.data(), lc.data(), BH, L, i0, Lc, Dv);
  }
}

}  // namespace

void attention(const TensorView& queries, const KVCache& cache, float scale, const AttentionMask& mask,
               const TensorView& out, float softcap, const std::vector<KVSegment>& segments) {
  // ---- validation ----
  check_rank(queries, 4, kOp, "queries");
  check_float_dtype(queries, kOp, "queries");
  check_cpu(queries, kOp, "queries");
  check(!cache.empty() && cache.offset() > 0, ErrorCode::kInvalidArgument, kOp,
        "the cache must hold at least one position; got length ", cache.offset());
  const kernels::KVTensorView keys = cache.keys(), values = cache.values();
  const int64_t B = queries.dim(0), Hq = queries.dim(1), L = queries.dim(2), Dk = queries.dim(3);
  const int64_t Hkv = keys.H, kL = keys.length, Dv = values.dim;
  check(B == keys.B, ErrorCode::kShapeMismatch, kOp, "queries batch must match the cache's B = ", keys.B, "; got ", B);
  check(Hq >= Hkv && Hq % Hkv == 0, ErrorCode::kShapeMismatch, kOp,
        "query heads must be a positive multiple of the cache's KV heads ", Hkv, "; got ", Hq);
  check(Dk == keys.dim, ErrorCode::kShapeMismatch, kOp, "queries head dim must match the cache's Dk = ", keys.dim,
        "; got ", Dk);
  check(L <= kL, ErrorCode::kOutOfRange, kOp, "query length must be <= the cache length ", kL, "; got ", L);
  // A cache that continues shared segments (its start() > 0 without a window) is read with them, under a causal mask
  // without a window (or none): the queries come after the segments and see all of them.
  const bool shared = !segments.empty() || (cache.start() > 0 && cache.window() == 0);
  if (shared) {
    check_segments(segments, cache, kOp);
    check((mask.kind == kernels::MaskKind::kCausal && mask.window == 0) || mask.kind == kernels::MaskKind::kNone,
          ErrorCode::kInvalidArgument, kOp,
          "attention over shared segments takes a causal mask without a window, or none; got mask kind ",
          mask_kind_name(mask.kind), ", window ", mask.window);
  }
  // A sliding-window cache that dropped positions serves only queries that cannot see them: a causal mask whose window
  // is at most the cache's, over queries whose window starts within the storage.
  check(shared || cache.start() == 0 || (mask.kind == kernels::MaskKind::kCausal && mask.window > 0 &&
                                         mask.window <= cache.window() && kL - L >= mask.window - 1),
        ErrorCode::kInvalidArgument, kOp, "a sliding-window cache (window ", cache.window(), ", positions [0, ",
        cache.start(), ") dropped) needs a causal mask with a window of at most ", cache.window(),
        " over queries whose window it still holds; got mask kind ", static_cast<int>(mask.kind), ", window ",
        mask.window, ", ", L, " queries over ", kL, " stored positions");
  check(std::isfinite(scale), ErrorCode::kInvalidArgument, kOp, "scale must be finite; got ", scale);
  check(std::isfinite(softcap) && softcap >= 0.0f, ErrorCode::kInvalidArgument, kOp,
        "softcap must be finite and >= 0 (0 = none); got ", softcap);
  const int64_t target[4] = {B, Hq, L, kL};
  int64_t mstride[4];
  mask_strides(mask, target, mstride);
  check_rank(out, 4, kOp, "out");
  check_float_dtype(out, kOp, "out");
  check_cpu(out, kOp, "out");
  check(out.dim(0) == B && out.dim(1) == Hq && out.dim(2) == L && out.dim(3) == Dv, ErrorCode::kShapeMismatch, kOp,
        "out must have shape [B, Hq, L, Dv] = ", shape_string({B, Hq, L, Dv}), "; got ", out.shape_string());
  if (L == 0) return;
  check_not_null(queries, kOp, "queries");
  check_not_null(out, kOp, "out");

  // ---- queries -> contiguous float32 [B, Hq, L, Dk] in the cache's rotated key space ----
  std::vector<float> q(static_cast<size_t>(B * Hq * L * Dk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < Dk; ++d)
          q[static_cast<size_t>(((b * Hq + h) * L + i) * Dk + d)] =
              load_float(queries.data, queries.dtype, offset4(queries, b, h, i, d));
  cache.key_rotation().apply(q.data(), B * Hq * L);

  // ---- the kernel: float32 [B, Hq, L, Dv] in the rotated value space ----
  std::vector<float> o(static_cast<size_t>(B * Hq * L * Dv));
  // (the recent block read unquantized: the kernel takes the positions before it)
  const KVCache::ExactStage stage = cache.exact_stage();
  kernels::AttentionArgs args = kernel_args(q.data(), o.data(), B, Hq, L, keys, values, scale, softcap, stage);
  args.mask_kind = mask.kind;
  args.window = mask.window;
  args.mask = mask.mask.data;
  args.mask_dtype = mask.mask.dtype;
  for (int i = 0; i < 4; ++i) args.mask_stride[i] = mstride[i];
  std::vector<float> lse;
  if (stage.block > 0 || !segments.empty()) {
    lse.resize(static_cast<size_t>(B * Hq * L));
    args.lse = lse.data();
  }
  kernels::active_kernels().attention(args);
  if (stage.block > 0)
    add_recent_block(stage, q.data(), B, Hq, Hkv, L, kL, Dk, Dv, scale, softcap, mask, mstride, lse.data(), o.data());
  for (const KVSegment& g : segments)  // the shared prefix's parts, merged by their log-sum-exp
    add_segment(g, q.data(), B, Hq, Hkv, L, Dk, Dv, scale, softcap, o.data(), lse.data());

  // ---- back to the original value space, stored in out's dtype ----
  cache.value_rotation().apply_inverse(o.data(), B * Hq * L);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t d = 0; d < Dv; ++d)
          store_float(out.data, out.dtype, offset4(out, b, h, i, d),
                      o[static_cast<size_t>(((b * Hq + h) * L + i) * Dv + d)]);
}

}  // namespace cider::nn
