// The attention and kv_append entries of every ISA level this machine runs (kernels_for_isa), against the reference.
//
// Attention, per output element, two checks (kernel level, in the cache's rotated space):
//  1. TIGHT, against float64 attention over the dequantized cache (k̂ = c·s + b, v̂ likewise, from the stored
//     codes and the stored scale/bias) with the queries the fast kernels actually use: q̃ = step·Q, the 16-bit
//     quantization per key group (two int8 planes) documented in kernels/x86/attention_x86.h (rewritten here from
//     that text). Only float32 rounding separates the two; the tolerance is its worst case (u = 2^-24):
//       scores: per group float(I) (I = Σ Q·c, exact in int32; one rounding), ·s, ·coef, + b·bcoef (coef =
//       scale·step, bcoef = coef·ΣQ) are a few roundings of terms bounded by
//       A_rj = scale·Σ_g step_g(|s_jg·I_rjg| + |b_jg·ΣQ_rg|), so |Δscore| ≤ ε_r = (2·Gk + 8)·u·A_r;
//       a score error ε (and 4u for exp) moves each softmax weight by a factor within e^{±(ε + 4u)}, so the output
//       moves by at most (e^{2(ε + 4u)} − 1)·max_j |v̂_jd|; the value sums are float32 chains of at most kL + 64
//       roundings of terms bounded by M1_d = max_j (|s_jg·c_jd| + |b_jg|), i.e. (kL + 64)·u·M1_d.
//  2. BOUNDED, against the reference kernel (exact float32 queries): the query quantization moves score r, j by
//     δ_rj = scale·|Σ_k (q_k − q̃_k)·k̂_jk| (computed here in float64), hence the output by at most
//     (e^{2δ_r} − 1)·max_j |v̂_jd|; plus the float32 tolerance of both kernels.
// Sizes: L ∈ {1, 2, 7}, kL ∈ {1, 7, 67, 300, 4097}, D ∈ {64, 128, 256}, GQA 1/2/4/8, every mask kind, bit widths
// 2..8 for keys and values, group sizes 32/64/128, scale dtypes f16/bf16/f32, forced key-range splits (the
// log-sum-exp merge), snapshot views (capacity = length: the padded last tile). Outputs are NaN-filled,
// canary-guarded; NaN never passes. Plain caches take the reference path (checked bit for bit).
//
// kv_append: every level produces exactly the reference's bytes (codes, scales, biases; plain values), over
// rotations none/fast/full, widths, group sizes, scale and source dtypes, strided sources, and edge values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "kernels/kernel_table.h"
#include "kernels/x86/attention_x86.h"
#include "kernels/x86/x86_kernels.h"
#include "nn/kv_cache.h"
#include "nn/rotation.h"
#include "quant/affine.h"
#include "support/scoped_env.h"
#include "support/test_support.h"

namespace cider {
namespace {

using kernels::AttentionArgs;
using kernels::KVAppendArgs;
using kernels::KVTensorView;
using kernels::MaskKind;
using nn::QuantizedKVCache;
using nn::QuantizedKVCacheConfig;
using nn::RotationKind;

constexpr double kU = 0x1p-24;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<IsaLevel> fast_levels() {
  std::vector<IsaLevel> out;
  for (IsaLevel l : supported_isas())
    if (l != IsaLevel::kRef) out.insert(out.begin(), l);  // highest level first
  return out;
}

// ---- the test's own view of the cache and of the query quantization -------------------------------------------

// Codes, scale and bias of every valid row of a quantized view, as doubles.
struct Deq {
  int64_t B, H, n, D, G, gs;
  std::vector<double> val;  // [B, H, n, D] c·s + b
  std::vector<double> code; // [B, H, n, D]
  std::vector<double> s, b; // [B, H, n, G]
  size_t at(int64_t bb, int64_t h, int64_t j) const { return static_cast<size_t>((bb * H + h) * n + j); }
};

Deq dequantize(const KVTensorView& v) {
  Deq d{v.B, v.H, v.length, v.dim, v.dim / v.group_size, v.group_size, {}, {}, {}, {}};
  const size_t rows = static_cast<size_t>(v.B * v.H * v.length);
  d.val.resize(rows * static_cast<size_t>(v.dim));
  d.code.resize(d.val.size());
  d.s.resize(rows * static_cast<size_t>(d.G));
  d.b.resize(d.s.size());
  for (int64_t bb = 0; bb < v.B; ++bb)
    for (int64_t h = 0; h < v.H; ++h)
      for (int64_t j = 0; j < v.length; ++j) {
        const int64_t r = (bb * v.H + h) * v.capacity + j;
        const size_t o = d.at(bb, h, j);
        const uint32_t* words = static_cast<const uint32_t*>(v.data) + r * quant::packed_words(v.dim, v.bits);
        for (int64_t g = 0; g < d.G; ++g) {
          d.s[o * static_cast<size_t>(d.G) + static_cast<size_t>(g)] = load_float(v.scales, v.scale_dtype, r * d.G + g);
          d.b[o * static_cast<size_t>(d.G) + static_cast<size_t>(g)] =
              v.symmetric ? -std::ldexp(d.s[o * static_cast<size_t>(d.G) + static_cast<size_t>(g)], v.bits - 1)
                          : load_float(v.biases, v.scale_dtype, r * d.G + g);
        }
        for (int64_t k = 0; k < v.dim; ++k) {
          const double c = quant::unpack_code(words, k, v.bits);
          const size_t g = o * static_cast<size_t>(d.G) + static_cast<size_t>(k / v.group_size);
          d.code[o * static_cast<size_t>(v.dim) + static_cast<size_t>(k)] = c;
          d.val[o * static_cast<size_t>(v.dim) + static_cast<size_t>(k)] = c * d.s[g] + d.b[g];
        }
      }
  return d;
}

// The query quantization of attention_x86.h, from its text: per group of gs, s = max|q|/127, inv = 1/s (float32),
// Q = clamp(rint(q·(256·inv)), −32512, 32512) (the product rounded to float32); the kernels use the integers Q (as
// the planes qh = (Q + 128) >> 8, ql = Q − 256·qh) and the step s/256, i.e. q̃ = (s/256)·Q.
struct QuantQ {
  std::vector<double> qt;   // q̃
  std::vector<int> qi;      // Q
  std::vector<double> sq;   // per group: the step s/256
};
QuantQ quantize_queries(const std::vector<float>& q, int64_t D, int gs) {
  QuantQ o{std::vector<double>(q.size()), std::vector<int>(q.size()), std::vector<double>(q.size() / static_cast<size_t>(gs))};
  for (size_t g = 0; g < q.size() / static_cast<size_t>(gs); ++g) {
    float amax = 0.0f;
    for (int k = 0; k < gs; ++k) amax = std::max(amax, std::fabs(q[g * static_cast<size_t>(gs) + static_cast<size_t>(k)]));
    const float s = amax / 127.0f, s2 = s / 256.0f, inv = s > 0.0f ? 1.0f / s : 0.0f, inv2 = 256.0f * inv;
    o.sq[g] = s2;
    for (int k = 0; k < gs; ++k) {
      const size_t i = g * static_cast<size_t>(gs) + static_cast<size_t>(k);
      const float prod = q[i] * inv2;  // rounded to float32 first, as the kernels do
      const float Q = s > 0.0f ? std::min(32512.0f, std::max(-32512.0f, std::nearbyint(prod))) : 0.0f;
      o.qi[i] = static_cast<int>(Q);
      o.qt[i] = static_cast<double>(s2) * o.qi[i];
    }
  }
  (void)D;
  return o;
}

// ---- masks ---------------------------------------------------------------------------------------------------

struct Mask {
  MaskKind kind = MaskKind::kNone;
  int64_t window = 0;
  DType dtype = DType::kBool;
  std::vector<uint8_t> bytes;
  int64_t stride[4] = {0, 0, 0, 0};  // over [B, Hq, L, kL]
  // Visible (and additive value) of [b, h, i, j] for a query row at absolute position pos.
  bool visible(int64_t b, int64_t h, int64_t i, int64_t j, int64_t pos, double* add) const {
    *add = 0.0;
    const int64_t off = b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
    switch (kind) {
      case MaskKind::kNone: return true;
      case MaskKind::kCausal: return j <= pos && (window == 0 || j > pos - window);
      case MaskKind::kBool: return bytes[static_cast<size_t>(off)] != 0;
      case MaskKind::kAdditive: {
        const double v = load_float(bytes.data(), dtype, off);
        *add = v;
        return v != -kInf;
      }
    }
    return true;
  }
};

// A random mask of `kind` over [B, Hq, L, kL] with some dimensions broadcast (stride 0).
Mask make_mask(std::mt19937_64& rng, MaskKind kind, int64_t B, int64_t Hq, int64_t L, int64_t kL, DType dt) {
  Mask m;
  m.kind = kind;
  if (kind == MaskKind::kCausal) {
    m.window = rng() % 2 ? 0 : 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(kL + 3));
    return m;
  }
  if (kind == MaskKind::kNone) return m;
  // Shape [B or 1, Hq or 1, L, kL] (row-major), broadcast dims get stride 0.
  const bool bb = rng() % 2, bh = rng() % 2;
  const int64_t nb = bb ? B : 1, nh = bh ? Hq : 1;
  m.stride[3] = 1;
  m.stride[2] = kL;
  m.stride[1] = bh ? L * kL : 0;
  m.stride[0] = bb ? nh * L * kL : 0;
  const size_t n = static_cast<size_t>(nb * nh * L * kL);
  if (kind == MaskKind::kBool) {
    m.dtype = DType::kBool;
    std::bernoulli_distribution vis(0.7);
    for (size_t i = 0; i < n; ++i) m.bytes.push_back(vis(rng) ? 1 : 0);
  } else {
    m.dtype = dt;
    std::vector<float> v = test::randn(rng, n, 2.0f);
    std::uniform_int_distribution<int> six(0, 5);
    for (float& x : v)
      if (six(rng) == 0) x = -std::numeric_limits<float>::infinity();
    m.bytes = test::to_dtype_bytes(v, dt);
  }
  return m;
}

// ---- float64 attention and the tolerances ------------------------------------------------------------------

// The softcap (AttentionArgs::softcap > 0): s -> cap·tanh(s/cap), before the mask. It is 1-Lipschitz, so a score
// error passes through unchanged; evaluating it in float32 adds at most (3|s| + 16·cap)·u: the argument s·(1/cap)
// or s/cap (two roundings, relative), tanh within a few ulp (the kernels' vector tanh: at most 2.6·u·|tanh|
// measured against float64 over [−30, 30] in steps of 1e-6; std::tanh about 1 ulp), and the product by cap.
double capped(double s, double cap) { return cap > 0.0 ? cap * std::tanh(s / cap) : s; }
double cap_error(double s, double cap) { return cap > 0.0 ? (3.0 * std::fabs(s) + 16.0 * cap) * kU : 0.0; }

struct Shape {
  int64_t B, Hkv, rep, L, kL, Dk, Dv;
  int64_t Hq() const { return Hkv * rep; }
};

// out[b, h, i, d] = Σ_j softmax(scale·q·k̂_j + mask)·v̂_jd in float64, plus per element the bounds of the header:
// tol_fast (check 1) and qdelta_term = (e^{2δ_r} − 1)·max_j|v̂_jd| (check 2).
struct F64Result {
  std::vector<double> out_qt;     // with q̃
  std::vector<double> tol_fast;   // float32 tolerance of the fast kernel against out_qt
  std::vector<double> tol_ref;    // float32 tolerance of the reference kernel (exact q) against attention with q
  std::vector<double> qdelta;     // (e^{2δ_r} − 1)·max_j |v̂_jd|
};

F64Result f64_attention(const Shape& s, const std::vector<float>& q, const QuantQ& qq, const Deq& K, const Deq& V,
                        double scale, const Mask& mask, double softcap) {
  const int64_t Hq = s.Hq();
  const size_t n_out = static_cast<size_t>(s.B * Hq * s.L * s.Dv);
  F64Result r{std::vector<double>(n_out, 0.0), std::vector<double>(n_out, 0.0), std::vector<double>(n_out, 0.0),
              std::vector<double>(n_out, 0.0)};
  std::vector<double> sc(static_cast<size_t>(s.kL));
  std::vector<char> vis(static_cast<size_t>(s.kL));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < s.L; ++i) {
        const int64_t g = h / s.rep, pos = s.kL - s.L + i;
        const size_t qo = static_cast<size_t>(((b * Hq + h) * s.L + i) * s.Dk);
        double m = -kInf, eps_fast = 0.0, eps_ref = 0.0, delta = 0.0;
        for (int64_t j = 0; j < s.kL; ++j) {
          double add;
          vis[static_cast<size_t>(j)] = mask.visible(b, h, i, j, pos, &add);
          if (!vis[static_cast<size_t>(j)]) continue;
          const size_t ko = K.at(b, g, j);
          double dot = 0.0, dq = 0.0, A = 0.0, Aref = 0.0;
          for (int64_t gi = 0; gi < K.G; ++gi) {
            double I = 0.0, qs = 0.0, aq = 0.0, acs = 0.0;
            for (int64_t k = gi * K.gs; k < (gi + 1) * K.gs; ++k) {
              const size_t kk = ko * static_cast<size_t>(s.Dk) + static_cast<size_t>(k);
              dot += qq.qt[qo + static_cast<size_t>(k)] * K.val[kk];
              dq += (q[qo + static_cast<size_t>(k)] - qq.qt[qo + static_cast<size_t>(k)]) * K.val[kk];
              I += qq.qi[qo + static_cast<size_t>(k)] * K.code[kk];
              qs += qq.qi[qo + static_cast<size_t>(k)];
              aq += std::fabs(q[qo + static_cast<size_t>(k)]);
              acs += std::fabs(q[qo + static_cast<size_t>(k)] * K.code[kk]);
            }
            const double sg = K.s[ko * static_cast<size_t>(K.G) + static_cast<size_t>(gi)];
            const double bg = K.b[ko * static_cast<size_t>(K.G) + static_cast<size_t>(gi)];
            A += qq.sq[(qo + static_cast<size_t>(gi * K.gs)) / static_cast<size_t>(K.gs)] *
                 (std::fabs(sg * I) + std::fabs(bg * qs));
            Aref += std::fabs(sg) * acs + std::fabs(bg) * aq;
          }
          const double raw = scale * dot;
          double x = capped(raw, softcap) + add;
          sc[static_cast<size_t>(j)] = x;
          m = std::max(m, x);
          const double ecap = cap_error(raw, softcap);
          eps_fast = std::max(eps_fast, (2.0 * static_cast<double>(K.G) + 8.0) * kU * scale * A + ecap);
          // The reference sums gs products per group, then G group terms: (gs + G + 4)·u of the magnitudes.
          eps_ref = std::max(eps_ref, (static_cast<double>(K.gs + K.G) + 6.0) * kU * scale * Aref + ecap);
          delta = std::max(delta, scale * std::fabs(dq));
        }
        if (m == -kInf) continue;  // sees nothing: zeros, tolerance 0
        double den = 0.0;
        const size_t oo = static_cast<size_t>(((b * Hq + h) * s.L + i) * s.Dv);
        std::vector<double> vmax(static_cast<size_t>(s.Dv), 0.0), m1(static_cast<size_t>(s.Dv), 0.0);
        for (int64_t j = 0; j < s.kL; ++j) {
          if (!vis[static_cast<size_t>(j)]) continue;
          const double p = std::exp(sc[static_cast<size_t>(j)] - m);
          den += p;
          const size_t vo = V.at(b, g, j);
          for (int64_t d = 0; d < s.Dv; ++d) {
            const size_t vv = vo * static_cast<size_t>(s.Dv) + static_cast<size_t>(d);
            const size_t gi = vo * static_cast<size_t>(V.G) + static_cast<size_t>(d / V.gs);
            r.out_qt[oo + static_cast<size_t>(d)] += p * V.val[vv];
            vmax[static_cast<size_t>(d)] = std::max(vmax[static_cast<size_t>(d)], std::fabs(V.val[vv]));
            m1[static_cast<size_t>(d)] =
                std::max(m1[static_cast<size_t>(d)], std::fabs(V.s[gi] * V.code[vv]) + std::fabs(V.b[gi]));
          }
        }
        const double chain = (static_cast<double>(s.kL) + 64.0) * kU;
        for (int64_t d = 0; d < s.Dv; ++d) {
          const size_t o = oo + static_cast<size_t>(d);
          r.out_qt[o] /= den;
          r.tol_fast[o] = chain * m1[static_cast<size_t>(d)] +
                          std::expm1(2.0 * (eps_fast + 4.0 * kU)) * vmax[static_cast<size_t>(d)] + 1e-30;
          r.tol_ref[o] = chain * m1[static_cast<size_t>(d)] +
                         std::expm1(2.0 * (eps_ref + 4.0 * kU)) * vmax[static_cast<size_t>(d)] + 1e-30;
          r.qdelta[o] = std::expm1(2.0 * delta) * vmax[static_cast<size_t>(d)];
        }
      }
  return r;
}

// ---- running a kernel ----------------------------------------------------------------------------------------

struct Problem {
  Shape s;
  QuantizedKVCacheConfig cfg;
  Mask mask;
  int kv_splits = 0;
  bool snapshot = false;
  bool float_scores = false;  // the AVX-512 float32-score variant (CIDER_ATTN_SCORES=f32): exact queries
  float softcap = 0.0f;       // > 0: scores capped to softcap·tanh(s/softcap) before the mask
};

std::string describe(const Problem& p) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "B%lld Hkv%lld rep%lld L%lld kL%lld Dk%lld Dv%lld K%d V%d g%d %s mask%d win%lld splits%d snap%d cap%g",
                static_cast<long long>(p.s.B), static_cast<long long>(p.s.Hkv), static_cast<long long>(p.s.rep),
                static_cast<long long>(p.s.L), static_cast<long long>(p.s.kL), static_cast<long long>(p.s.Dk),
                static_cast<long long>(p.s.Dv), p.cfg.k_bits, p.cfg.v_bits, p.cfg.group_size,
                dtype_name(p.cfg.scale_dtype), static_cast<int>(p.mask.kind), static_cast<long long>(p.mask.window),
                p.kv_splits, p.snapshot ? 1 : 0, static_cast<double>(p.softcap));
  return buf;
}

// The kernel arguments of a case (out is set by run()).
AttentionArgs attention_args(const Shape& s, const std::vector<float>& q, const KVTensorView& kv,
                             const KVTensorView& vv, float scale, const Mask& mask, int kv_splits,
                             float softcap = 0.0f) {
  AttentionArgs args{};
  args.q = q.data();
  args.B = s.B;
  args.Hq = s.Hq();
  args.L = s.L;
  args.keys = kv;
  args.values = vv;
  args.scale = scale;
  args.softcap = softcap;
  args.mask_kind = mask.kind;
  args.window = mask.window;
  args.mask = mask.bytes.empty() ? nullptr : mask.bytes.data();
  args.mask_dtype = mask.dtype;
  for (int i = 0; i < 4; ++i) args.mask_stride[i] = mask.stride[i];
  args.kv_splits = kv_splits;
  return args;
}

// Runs `fn` into a NaN-filled, canary-guarded buffer and returns the output.
std::vector<float> run(void (*fn)(const AttentionArgs&), AttentionArgs args, size_t n) {
  test::GuardedBuffer buf(n * sizeof(float));
  buf.fill_inside(0xFF);
  args.out = buf.as<float>();
  fn(args);
  EXPECT_TRUE(buf.canaries_intact());
  return std::vector<float>(buf.as<float>(), buf.as<float>() + n);
}

// observe (outlier key channels): before each append, the queries of its positions, with loud channels (every 7th
// from 3, ×8) so that the channels chosen differ from the range's.
void fill(nn::KVCache& cache, const Shape& s, std::mt19937_64& rng, bool observe = false) {
  // Two appends (the second crossing a 256-position step when kL > 256).
  const int64_t first = s.kL > 1 ? s.kL / 3 + 1 : s.kL;
  for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, first}, {first, s.kL - first}}) {
    (void)t0;
    if (n == 0) continue;
    if (observe) {
      std::vector<float> oq = test::randn(rng, static_cast<size_t>(s.B * s.Hq() * n * s.Dk));
      for (size_t i = 0; i < oq.size(); ++i)
        if ((i % static_cast<size_t>(s.Dk)) % 7 == 3) oq[i] *= 8.0f;
      static_cast<QuantizedKVCache&>(cache).observe_queries(TensorView(oq.data(), DType::kF32, {s.B, s.Hq(), n, s.Dk}));
    }
    const std::vector<float> k = test::randn(rng, static_cast<size_t>(s.B * s.Hkv * n * s.Dk));
    const std::vector<float> v = test::randn(rng, static_cast<size_t>(s.B * s.Hkv * n * s.Dv));
    cache.update_and_fetch(TensorView(k.data(), DType::kF32, {s.B, s.Hkv, n, s.Dk}),
                           TensorView(v.data(), DType::kF32, {s.B, s.Hkv, n, s.Dv}));
  }
}

void check_problem(const Problem& p, std::mt19937_64& rng) {
  const Shape& s = p.s;
  const std::string what = describe(p);
  QuantizedKVCache cache(p.cfg);
  fill(cache, s, rng);
  nn::KVCacheSnapshot snap;
  KVTensorView kv = cache.keys(), vv = cache.values();
  if (p.snapshot) {
    snap = cache.snapshot();
    kv = snap.keys();
    vv = snap.values();
  }
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(s.B * s.Hq() * s.L * s.Dk));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.Dk));
  const AttentionArgs args = attention_args(s, q, kv, vv, scale, p.mask, p.kv_splits, p.softcap);
  const size_t n = static_cast<size_t>(s.B * s.Hq() * s.L * s.Dv);

  const std::vector<float> ref = run(kernels::ref_kernels().attention, args, n);
  ASSERT_TRUE(test::no_nan(ref.data(), n)) << what;
  const Deq K = dequantize(kv), V = dequantize(vv);
  QuantQ qq = quantize_queries(q, s.Dk, p.cfg.group_size);
  if (p.float_scores) qq.qt.assign(q.begin(), q.end());  // exact queries: the tight check uses them
  const F64Result want = f64_attention(s, q, qq, K, V, scale, p.mask, p.softcap);
  for (IsaLevel level : fast_levels()) {
    if (p.float_scores && level != IsaLevel::kAvx512) continue;
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    const std::vector<float> got = run(t.attention, args, n);
    for (size_t i = 0; i < n; ++i) {
      // The float-score variant has the reference's score arithmetic (tolerance tol_ref, no query quantization).
      const double tight = p.float_scores ? want.tol_ref[i] : want.tol_fast[i];
      const double vs_ref = p.float_scores ? 2.0 * want.tol_ref[i] : want.tol_fast[i] + want.tol_ref[i] + want.qdelta[i];
      ASSERT_FALSE(std::isnan(got[i])) << t.name << " " << what << " element " << i;
      ASSERT_LE(std::fabs(got[i] - want.out_qt[i]), tight)
          << t.name << " (tight, vs float64 with q̃) " << what << " element " << i << " got " << got[i] << " want "
          << want.out_qt[i];
      ASSERT_LE(std::fabs(got[i] - ref[i]), vs_ref)
          << t.name << " (vs the reference kernel) " << what << " element " << i << " got " << got[i] << " ref "
          << ref[i];
    }
  }
}

const QuantizedKVCacheConfig kConfigs[] = {
    {8, 4, 64, RotationKind::kHadamard, 0, DType::kF16},  // the default K8/V4 with the Hadamard rotation
    {4, 3, 64, RotationKind::kSO4Full, 0, DType::kF16},   // K4/V3, the default before K8/V4
    {8, 8, 32, RotationKind::kSO4Fast, 0, DType::kBF16},  // K8/V8
    {4, 4, 128, RotationKind::kNone, 0, DType::kF32},     // K4/V4
    {3, 2, 64, RotationKind::kSO4Full, 0, DType::kF16},   // other widths: unpacked keys, 2-bit values
    {6, 5, 32, RotationKind::kSO4Full, 0, DType::kF16},
    {2, 6, 64, RotationKind::kNone, 0, DType::kBF16},
    {5, 8, 128, RotationKind::kSO4Fast, 0, DType::kF16},
    {4, 3, 32, RotationKind::kSO4Full, 0, DType::kF32},   // f32 scales, up to 8 groups per row
};

// The sweep over sizes, GQA, masks and formats (each case draws fresh data).
TEST(AttentionX86, EveryLevelMatchesReferenceOverSizesMasksAndFormats) {
  auto rng = test::make_rng(400);
  const int64_t Ls[] = {1, 2, 7};
  const int64_t kLs[] = {1, 7, 67, 300, 4097};
  const int64_t Ds[] = {64, 128, 256};
  const int64_t reps[] = {1, 2, 4, 8};
  const MaskKind kinds[] = {MaskKind::kNone, MaskKind::kCausal, MaskKind::kBool, MaskKind::kAdditive,
                            MaskKind::kCausal};
  int idx = 0;
  for (int64_t kL : kLs)
    for (int64_t L : Ls) {
      if (L > kL) continue;
      for (int variant = 0; variant < (kL == 4097 ? 2 : 4); ++variant, ++idx) {
        Problem p;
        const int64_t Dk = Ds[(idx + variant) % 3], Dv = Ds[(idx / 3 + 2 * variant) % 3];
        p.s = Shape{1 + idx % 2, 1 + (idx / 2) % 3, reps[idx % 4], L, kL, Dk, Dv};
        if (kL == 4097) p.s.B = 1;
        p.cfg = kConfigs[static_cast<size_t>(idx) % std::size(kConfigs)];
        p.cfg.seed = rng();
        p.cfg.group_size = static_cast<int>(std::min<int64_t>(p.cfg.group_size, std::min(Dk, Dv)));
        const DType mdt = idx % 3 == 0 ? DType::kF32 : idx % 3 == 1 ? DType::kF16 : DType::kBF16;
        p.mask = make_mask(rng, kinds[idx % 5], p.s.B, p.s.Hq(), L, kL, mdt);
        p.kv_splits = idx % 4 == 3 ? 1 + static_cast<int>(rng() % 5) : 0;
        p.snapshot = idx % 5 == 2;
        check_problem(p, rng);
        if (HasFatalFailure()) return;
      }
    }
}

// Symmetric values (QuantizedKVCacheConfig::v_symmetric: a step per group, bias −2^(bits−1)·step, no bias plane):
// every level against float64 and the reference, per-token keys, over value widths, group sizes, scale dtypes,
// masks, splits and snapshots.
TEST(AttentionX86, SymmetricValuesEveryLevelMatchesReference) {
  auto rng = test::make_rng(402);
  const QuantizedKVCacheConfig cfgs[] = {
      {4, 4, 64, RotationKind::kHadamard, 0, DType::kF16},  {8, 3, 32, RotationKind::kSO4Full, 0, DType::kBF16},
      {4, 2, 128, RotationKind::kNone, 0, DType::kF32},     {5, 8, 64, RotationKind::kHadamard, 0, DType::kF16},
      {3, 5, 32, RotationKind::kSO4Fast, 0, DType::kF16},   {6, 6, 64, RotationKind::kHadamard, 0, DType::kBF16},
  };
  const MaskKind kinds[] = {MaskKind::kCausal, MaskKind::kNone, MaskKind::kBool, MaskKind::kAdditive};
  int idx = 0;
  for (int64_t kL : {1, 67, 300, 1100})
    for (int64_t L : {1, 3}) {
      Problem p;
      const int64_t D = idx % 3 == 0 ? 128 : idx % 3 == 1 ? 64 : 256;
      p.s = Shape{1 + idx % 2, 1 + idx % 3, int64_t{1} << (idx % 4), L, kL, D, idx % 2 ? D : 128};
      p.cfg = cfgs[static_cast<size_t>(idx) % std::size(cfgs)];
      p.cfg.v_symmetric = true;
      p.cfg.seed = rng();
      p.cfg.group_size = static_cast<int>(std::min<int64_t>(p.cfg.group_size, std::min(p.s.Dk, p.s.Dv)));
      p.mask = make_mask(rng, kinds[idx % 4], p.s.B, p.s.Hq(), L, kL, DType::kF32);
      p.kv_splits = idx % 3 == 2 ? 1 + static_cast<int>(rng() % 4) : 0;
      p.snapshot = idx % 4 == 1;
      check_problem(p, rng);
      if (HasFatalFailure()) return;
      ++idx;
    }
}

// Decode shapes of real models (all query heads of a KV head at once) with splits forced over the range.
TEST(AttentionX86, DecodeGqaWithSplitsAndWindows) {
  auto rng = test::make_rng(401);
  for (int splits : {1, 2, 3, 7}) {
    Problem p;
    p.s = Shape{1, 2, 4, 1, 1000 + splits * 37, 128, 128};
    p.cfg.seed = rng();
    p.mask.kind = MaskKind::kCausal;
    p.mask.window = splits == 3 ? 300 : 0;
    p.kv_splits = splits;
    check_problem(p, rng);
  }
}

// Prefill-like: many query rows (several query blocks, causal skip of tiles above the diagonal).
TEST(AttentionX86, PrefillBlocksCausal) {
  auto rng = test::make_rng(402);
  for (int64_t rep : {1, 4}) {
    Problem p;
    p.s = Shape{1, 2, rep, 130, 300, 64, 128};
    p.cfg.seed = rng();
    p.mask.kind = MaskKind::kCausal;
    p.mask.window = rep == 4 ? 45 : 0;
    check_problem(p, rng);
  }
}

// ---- per-channel keys (layout 1) ------------------------------------------------------------------------------
// The fast kernels fold a block's key scales into the query, q' = float32(q ⊙ s_blk), quantize q' as one group of
// the whole head (Dk <= 256; else per group of gs dims) exactly as above (q̃' = step·Q, replicated here by quantize_queries) and add the block's bias term q·b_blk;
// residual positions are scored in float32 with exact queries. So, as for per-token keys, two checks:
//  1. TIGHT, against float64 attention with those scores (Σ_k q̃'_k·c_jk + Σ_k q_k·b_k; residual: q·k): only float32
//     rounding separates them, |Δscore| ≤ scale·(Dk + 2·Gq + 8)·u·(Σ_k |q̃'_k·c_jk| + Σ_k |q_k·b_k|) (residual:
//     scale·(Dk + 4)·u·Σ_k |q_k·k_jk|), and outputs as in check 1 above.
//  2. BOUNDED, against the reference kernel (exact queries, a float32 row k = c·s + b then a dot, tolerance
//     scale·(Dk + 8)·u·Σ_k |q_k|·(|c_jk·s_k| + |b_k|)): plus the query quantization's effect (e^{2δ} − 1)·max_j|v̂_jd|,
//     δ = max_j scale·|Σ_k (q'_k − q̃'_k)·c_jk| computed here in float64.
struct ChannelCase {
  Shape s;
  QuantizedKVCacheConfig cfg;
  Mask mask;
  int kv_splits = 0;
  bool snapshot = false;
  float softcap = 0.0f;
  bool observe = false;  // outlier channels: show the cache each append's queries (else chosen by range alone)
  bool expect_amx = false;  // the AMX-BF16 prefill kernel must take these arguments
};

void check_channel_case(const ChannelCase& p, std::mt19937_64& rng) {
  const Shape& s = p.s;
  char what[220];
  std::snprintf(what, sizeof what,
                "kchan B%lld Hkv%lld rep%lld L%lld kL%lld Dk%lld Dv%lld K%d V%d g%d mask%d splits%d cap%g",
                static_cast<long long>(s.B), static_cast<long long>(s.Hkv), static_cast<long long>(s.rep),
                static_cast<long long>(s.L), static_cast<long long>(s.kL), static_cast<long long>(s.Dk),
                static_cast<long long>(s.Dv), p.cfg.k_bits, p.cfg.v_bits, p.cfg.group_size,
                static_cast<int>(p.mask.kind), p.kv_splits, static_cast<double>(p.softcap));
  QuantizedKVCache cache(p.cfg);
  fill(cache, s, rng, p.observe);
  nn::KVCacheSnapshot snap;
  KVTensorView kv = cache.keys(), vv = cache.values();
  if (p.snapshot) {
    snap = cache.snapshot();
    kv = snap.keys();
    vv = snap.values();
  }
  ASSERT_EQ(kv.layout, 1);
  ASSERT_EQ(kv.outliers, p.cfg.key_outliers);
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(s.B * s.Hq() * s.L * s.Dk));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.Dk));
  const AttentionArgs args = attention_args(s, q, kv, vv, scale, p.mask, p.kv_splits, p.softcap);
  const size_t n = static_cast<size_t>(s.B * s.Hq() * s.L * s.Dv);
  const std::vector<float> ref = run(kernels::ref_kernels().attention, args, n);
  ASSERT_TRUE(test::no_nan(ref.data(), n)) << what;

  // The keys as float64: value, and per element |c·s| and |b| (quantized) or the residual value.
  const int64_t gs = kv.group_size, nq = kv.length / gs * gs, Gk = s.Dk / gs;
  // the query groups of attention_x86.h: the whole head (Dk <= 256), else gs
  const int64_t gq = s.Dk <= 256 ? s.Dk : gs, Gq = s.Dk / gq;
  const size_t nk = static_cast<size_t>(s.B * s.Hkv * s.kL * s.Dk);
  std::vector<double> kval(nk), kcode(nk), ks(nk), kb(nk), kref(nk, 0.0), kom(nk, 0.0);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hkv; ++h)
      for (int64_t j = 0; j < s.kL; ++j)
        for (int64_t d = 0; d < s.Dk; ++d) {
          const size_t o = static_cast<size_t>(((b * s.Hkv + h) * s.kL + j) * s.Dk + d);
          if (j >= nq) {
            kval[o] = load_float(kv.residual, DType::kBF16, ((b * kv.H + h) * gs + j - nq) * s.Dk + d);
            continue;
          }
          const uint32_t* words = static_cast<const uint32_t*>(kv.data) +
                                  ((b * kv.H + h) * kv.capacity + j) * quant::packed_words(s.Dk, kv.bits);
          const int64_t sr = ((b * kv.H + h) * kv.blocks + j / gs) * s.Dk + d;
          kcode[o] = quant::unpack_code(words, d, kv.bits);
          ks[o] = load_float(kv.scales, kv.scale_dtype, sr);
          kb[o] = load_float(kv.biases, kv.scale_dtype, sr);
          kval[o] = kcode[o] * ks[o] + kb[o];
        }
  // Outlier channels: the refinement (|s|/15)·(r − 7.5) of each block's chosen channels (kref), and the magnitude the
  // fast kernels' float32 sum of it goes through, |s|/15·(r + 7.5) (its −7.5·Σ offset, its Σ code terms: kom).
  for (int64_t b = 0; b < s.B && kv.outliers > 0; ++b)
    for (int64_t h = 0; h < s.Hkv; ++h)
      for (int64_t blk = 0; blk < nq / gs; ++blk) {
        const int64_t brow = (b * kv.H + h) * kv.blocks + blk, no = kv.outliers;
        const auto* index = static_cast<const uint16_t*>(kv.outlier_index) + brow * no;
        const uint8_t* oc = static_cast<const uint8_t*>(kv.outlier_codes) + brow * no * gs / 2;
        for (int64_t o = 0; o < no; ++o) {
          const int64_t d = index[o];
          ASSERT_TRUE(d < s.Dk && (o == 0 || index[o - 1] < d)) << "outlier channels must ascend within Dk";
          for (int64_t t = 0; t < gs; ++t) {
            const int64_t j = blk * gs + t;
            const size_t e = static_cast<size_t>(((b * s.Hkv + h) * s.kL + j) * s.Dk + d);
            const uint32_t r = (oc[o * gs / 2 + t / 2] >> (4 * (t % 2))) & 15u;
            const double step = static_cast<double>(quant::outlier_step(static_cast<float>(ks[e])));
            kref[e] = step * (static_cast<double>(r) - 7.5);
            kom[e] = step * (static_cast<double>(r) + 7.5);
            kval[e] += kref[e];
          }
        }
      }
  const Deq V = dequantize(vv);
  // want_e: exact queries (for the reference), want_f: the fast kernels' scores.
  std::vector<double> want_e(n, 0.0), want_f(n, 0.0), tol_fast(n, 0.0), tol_ref(n, 0.0), qdelta(n, 0.0), tol_amx(n, 0.0);
  std::vector<double> sce(static_cast<size_t>(s.kL)), scf(static_cast<size_t>(s.kL));
  std::vector<char> vis(static_cast<size_t>(s.kL));
  std::vector<float> qp(static_cast<size_t>(s.Dk));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t hq = 0; hq < s.Hq(); ++hq)
      for (int64_t i = 0; i < s.L; ++i) {
        const int64_t g = hq / s.rep, pos = s.kL - s.L + i;
        const float* qr = q.data() + ((b * s.Hq() + hq) * s.L + i) * s.Dk;
        double me = -kInf, mf = -kInf, eps_fast = 0.0, eps_ref = 0.0, delta = 0.0, eps_amx = 0.0;
        QuantQ qq;
        int64_t qq_block = -1;
        for (int64_t j = 0; j < s.kL; ++j) {
          double add;
          vis[static_cast<size_t>(j)] = p.mask.visible(b, hq, i, j, pos, &add);
          if (!vis[static_cast<size_t>(j)]) continue;
          const size_t ko = static_cast<size_t>(((b * s.Hkv + g) * s.kL + j) * s.Dk);
          double de = 0.0, df = 0.0, ef = 0.0, er = 0.0;
          if (j >= nq) {
            for (int64_t d = 0; d < s.Dk; ++d) {
              de += qr[d] * kval[ko + static_cast<size_t>(d)];
              er += std::fabs(qr[d] * kval[ko + static_cast<size_t>(d)]);
            }
            df = de;
            // AMX-BF16 prefill: the query split into two bfloat16 parts (|q − hi − lo| <= 2⁻¹⁶|q|), float32 sums
            eps_amx = std::max(eps_amx, (0x1p-16 + static_cast<double>(s.Dk + 16) * kU) * er);
            ef = static_cast<double>(s.Dk + 4) * kU * er;
            er *= static_cast<double>(s.Dk + 4) * kU;
          } else {
            if (j / gs != qq_block) {  // the kernel's q' and its quantization for this block
              qq_block = j / gs;
              for (int64_t d = 0; d < s.Dk; ++d)
                qp[static_cast<size_t>(d)] = qr[d] * static_cast<float>(ks[ko + static_cast<size_t>(d)]);
              qq = quantize_queries(qp, s.Dk, static_cast<int>(gq));
            }
            double magf = 0.0, mage = 0.0, dq = 0.0;
            for (int64_t d = 0; d < s.Dk; ++d) {
              const size_t o = ko + static_cast<size_t>(d);
              de += qr[d] * kval[o];
              df += qq.qt[static_cast<size_t>(d)] * kcode[o] + qr[d] * kb[o] + qr[d] * kref[o];
              dq += (qp[static_cast<size_t>(d)] - qq.qt[static_cast<size_t>(d)]) * kcode[o];
              magf += std::fabs(qq.qt[static_cast<size_t>(d)] * kcode[o]) + std::fabs(qr[d] * kb[o]) +
                      std::fabs(qr[d]) * kom[o];
              mage += std::fabs(qr[d] * ks[o] * kcode[o]) + std::fabs(qr[d] * kb[o]) + std::fabs(qr[d]) * kom[o];
            }
            ef = static_cast<double>(s.Dk + 2 * Gq + 8 + 2 * p.cfg.key_outliers) * kU * magf;
            // AMX-BF16 prefill: q' = q ⊙ s split into two bfloat16 parts times exact codes, the bias and outlier
            // terms in float32
            eps_amx = std::max(eps_amx, (0x1p-16 + static_cast<double>(s.Dk + 2 * Gk + 16 + 2 * p.cfg.key_outliers) * kU) * mage);
            er = static_cast<double>(s.Dk + 8) * kU * mage;
            delta = std::max(delta, scale * std::fabs(dq));
          }
          sce[static_cast<size_t>(j)] = capped(scale * de, p.softcap) + add;
          scf[static_cast<size_t>(j)] = capped(scale * df, p.softcap) + add;
          me = std::max(me, sce[static_cast<size_t>(j)]);
          mf = std::max(mf, scf[static_cast<size_t>(j)]);
          eps_fast = std::max(eps_fast, scale * ef + cap_error(scale * df, p.softcap));
          eps_ref = std::max(eps_ref, scale * er + cap_error(scale * de, p.softcap));
        }
        if (me == -kInf) continue;
        double dene = 0.0, denf = 0.0;
        const size_t oo = static_cast<size_t>(((b * s.Hq() + hq) * s.L + i) * s.Dv);
        std::vector<double> vmax(static_cast<size_t>(s.Dv), 0.0), m1(static_cast<size_t>(s.Dv), 0.0),
            wabs(static_cast<size_t>(s.Dv), 0.0);
        for (int64_t j = 0; j < s.kL; ++j) {
          if (!vis[static_cast<size_t>(j)]) continue;
          const double pe = std::exp(sce[static_cast<size_t>(j)] - me), pf = std::exp(scf[static_cast<size_t>(j)] - mf);
          dene += pe;
          denf += pf;
          const size_t vo = V.at(b, g, j);
          for (int64_t d = 0; d < s.Dv; ++d) {
            const size_t vi = vo * static_cast<size_t>(s.Dv) + static_cast<size_t>(d);
            const size_t gi = vo * static_cast<size_t>(V.G) + static_cast<size_t>(d / V.gs);
            want_e[oo + static_cast<size_t>(d)] += pe * V.val[vi];
            want_f[oo + static_cast<size_t>(d)] += pf * V.val[vi];
            vmax[static_cast<size_t>(d)] = std::max(vmax[static_cast<size_t>(d)], std::fabs(V.val[vi]));
            m1[static_cast<size_t>(d)] =
                std::max(m1[static_cast<size_t>(d)], std::fabs(V.s[gi] * V.code[vi]) + std::fabs(V.b[gi]));
            wabs[static_cast<size_t>(d)] += pe * std::fabs(V.s[gi] * V.code[vi]);
          }
        }
        const double chain = (static_cast<double>(s.kL) + 64.0) * kU;
        for (int64_t d = 0; d < s.Dv; ++d) {
          const size_t o = oo + static_cast<size_t>(d);
          want_e[o] /= dene;
          want_f[o] /= denf;
          tol_fast[o] = chain * m1[static_cast<size_t>(d)] +
                        std::expm1(2.0 * (eps_fast + 4.0 * kU)) * vmax[static_cast<size_t>(d)] + 1e-30;
          tol_ref[o] = chain * m1[static_cast<size_t>(d)] +
                       std::expm1(2.0 * (eps_ref + 4.0 * kU)) * vmax[static_cast<size_t>(d)] + 1e-30;
          qdelta[o] = std::expm1(2.0 * delta) * vmax[static_cast<size_t>(d)];
          // the weights p·s in two bfloat16 parts (2⁻¹⁶, after the product's float32 rounding): Σ_j p_j·|s_j·c_jd| / Σ p_j
          // times that (the softmax weights' own error is the exponential term)
          tol_amx[o] = chain * m1[static_cast<size_t>(d)] + (0x1p-16 + 4.0 * kU) * wabs[static_cast<size_t>(d)] / dene +
                       std::expm1(2.0 * (scale * eps_amx + 4.0 * kU)) * vmax[static_cast<size_t>(d)] + 1e-30;
        }
      }
  for (size_t k = 0; k < n; ++k)
    ASSERT_LE(std::fabs(ref[k] - want_e[k]), tol_ref[k]) << "reference " << what << " element " << k;
  for (IsaLevel level : fast_levels()) {
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    const std::vector<float> got = run(t.attention, args, n);
#if defined(__x86_64__)
    if (p.expect_amx && t.attention == &kernels::x86::amx::attention_bf16) {
      ASSERT_TRUE(kernels::x86::amx::attention_bf16_takes(args)) << what;
    }
    if (t.attention == &kernels::x86::amx::attention_bf16 && kernels::x86::amx::attention_bf16_takes(args)) {
      for (size_t k = 0; k < n; ++k) {  // bfloat16 tiles: bounded against float64 with the exact queries
        ASSERT_FALSE(std::isnan(got[k])) << t.name << " " << what << " element " << k;
        ASSERT_LE(std::fabs(got[k] - want_e[k]), tol_amx[k])
            << t.name << " (AMX-BF16, vs float64) " << what << " element " << k << " got " << got[k] << " want "
            << want_e[k];
      }
      continue;
    }
#endif
    for (size_t k = 0; k < n; ++k) {
      ASSERT_FALSE(std::isnan(got[k])) << t.name << " " << what << " element " << k;
      ASSERT_LE(std::fabs(got[k] - want_f[k]), tol_fast[k])
          << t.name << " (tight, vs float64 with q̃') " << what << " element " << k << " got " << got[k] << " want "
          << want_f[k];
      ASSERT_LE(std::fabs(got[k] - ref[k]), tol_fast[k] + tol_ref[k] + qdelta[k])
          << t.name << " (vs the reference kernel) " << what << " element " << k;
    }
  }
}

TEST(AttentionX86, PerChannelKeysEveryLevelMatchesReference) {
  auto rng = test::make_rng(410);
  const int64_t Ls[] = {1, 3, 20};
  const int64_t kLs[] = {1, 31, 64, 100, 300, 1100};
  const int64_t Ds[] = {64, 128, 256};
  const int64_t reps[] = {1, 2, 4, 8};
  const MaskKind kinds[] = {MaskKind::kNone, MaskKind::kCausal, MaskKind::kBool, MaskKind::kAdditive};
  const QuantizedKVCacheConfig cfgs[] = {
      {4, 4, 64, RotationKind::kHadamard, 0, DType::kF16, nn::KeyLayout::kChannel},
      {4, 3, 32, RotationKind::kNone, 0, DType::kBF16, nn::KeyLayout::kChannel},
      {8, 4, 128, RotationKind::kHadamard, 0, DType::kF32, nn::KeyLayout::kChannel},
      {3, 2, 64, RotationKind::kSO4Full, 0, DType::kF16, nn::KeyLayout::kChannel},
      {2, 8, 32, RotationKind::kNone, 0, DType::kF16, nn::KeyLayout::kChannel},
  };
  int idx = 0;
  for (int64_t kL : kLs)
    for (int64_t L : Ls) {
      if (L > kL) continue;
      for (int variant = 0; variant < 2; ++variant, ++idx) {
        ChannelCase p;
        const int64_t Dk = Ds[(idx + variant) % 3], Dv = Ds[(idx / 3 + 2 * variant) % 3];
        p.s = Shape{1 + idx % 2, 1 + (idx / 2) % 2, reps[idx % 4], L, kL, Dk, Dv};
        p.cfg = cfgs[static_cast<size_t>(idx) % std::size(cfgs)];
        p.cfg.seed = rng();
        p.cfg.group_size = static_cast<int>(std::min<int64_t>(p.cfg.group_size, std::min(Dk, Dv)));
        p.mask = make_mask(rng, kinds[idx % 4], p.s.B, p.s.Hq(), L, kL, DType::kF32);
        p.kv_splits = idx % 3 == 2 ? 1 + static_cast<int>(rng() % 5) : 0;
        p.snapshot = idx % 4 == 1;
        check_channel_case(p, rng);
        if (HasFatalFailure()) return;
      }
    }
}

// Outlier key channels (QuantizedKVCacheConfig::key_outliers): every level against float64 (the refinement in the
// keys' values, and in the fast kernels' float32 score term) and the reference, over outlier counts from 1 to 32,
// chosen by range alone or after queries were observed, block sizes 32/64/128, widths, masks, splits, snapshots,
// softcaps, lengths inside a block, at its end and in the residual window.
TEST(AttentionX86, PerChannelKeysWithOutlierChannelsEveryLevelMatchesReference) {
  auto rng = test::make_rng(411);
  const int64_t kLs[] = {1, 64, 100, 300, 1100};
  const int64_t Ls[] = {1, 5, 33};
  const MaskKind kinds[] = {MaskKind::kCausal, MaskKind::kNone, MaskKind::kAdditive, MaskKind::kBool};
  const QuantizedKVCacheConfig cfgs[] = {
      {4, 4, 64, RotationKind::kHadamard, 0, DType::kF16, nn::KeyLayout::kChannel, 8},
      {4, 3, 32, RotationKind::kNone, 0, DType::kBF16, nn::KeyLayout::kChannel, 1},
      {3, 4, 128, RotationKind::kHadamard, 0, DType::kF32, nn::KeyLayout::kChannel, 32},
      {5, 5, 64, RotationKind::kHadamard, 0, DType::kF16, nn::KeyLayout::kChannel, 4},
      {2, 2, 32, RotationKind::kNone, 0, DType::kF16, nn::KeyLayout::kChannel, 16},
  };
  int idx = 0;
  for (int64_t kL : kLs)
    for (int64_t L : Ls) {
      if (L > kL) continue;
      ChannelCase p;
      const int64_t Dk = idx % 3 == 0 ? 256 : idx % 3 == 1 ? 64 : 128, Dv = idx % 2 ? 128 : 64;
      p.s = Shape{1 + idx % 2, 1 + (idx / 2) % 2, int64_t{1} << (idx % 4), L, kL, Dk, Dv};
      p.cfg = cfgs[static_cast<size_t>(idx) % std::size(cfgs)];
      p.cfg.seed = rng();
      p.cfg.group_size = static_cast<int>(std::min<int64_t>(p.cfg.group_size, std::min(Dk, Dv)));
      p.cfg.key_outliers = static_cast<int>(std::min<int64_t>(p.cfg.key_outliers, Dk / 2));
      p.mask = make_mask(rng, kinds[idx % 4], p.s.B, p.s.Hq(), L, kL, DType::kF32);
      p.kv_splits = idx % 3 == 2 ? 1 + static_cast<int>(rng() % 5) : 0;
      p.snapshot = idx % 4 == 1;
      p.observe = idx % 2 == 0;
      p.softcap = idx % 5 == 4 ? 2.0f : 0.0f;
      p.cfg.v_symmetric = idx % 3 == 1;  // symmetric values beside the outlier channels (a 4.4-bit cache)
      check_channel_case(p, rng);
      if (HasFatalFailure()) return;
      ++idx;
    }
}

// Prefill over per-channel keys where the avx512 table runs it on AMX-BF16 tiles (amx/attention_prefill_bf16.cpp):
// the bound of check_channel_case's tol_amx (two-part bfloat16 queries, bfloat16 value weights) over query rows of
// one and several items (rep·L past 512 rows), key lengths inside a block, at its end and with a residual window,
// the default cache (k5v4, 4 outlier channels) and other widths and groups, GQA up to 8, causal masks with and
// without a window, forced splits, snapshots; every case must take the tiles.
TEST(AttentionX86, PrefillOnAmxBf16TilesMatchesFloat64) {
  bool has512 = false;
  for (IsaLevel l : fast_levels()) has512 = has512 || l == IsaLevel::kAvx512;
  if (!has512 || kernels::kernels_for_isa(IsaLevel::kAvx512).attention != &kernels::x86::amx::attention_bf16)
    GTEST_SKIP() << "no AMX-BF16 attention here";
  auto rng = test::make_rng(412);
  const QuantizedKVCacheConfig cfgs[] = {
      {5, 4, 64, RotationKind::kHadamard, 0, DType::kF16, nn::KeyLayout::kChannel, 4},
      {4, 4, 32, RotationKind::kNone, 0, DType::kBF16, nn::KeyLayout::kChannel, 0},
      {8, 3, 128, RotationKind::kHadamard, 0, DType::kF32, nn::KeyLayout::kChannel, 2},
      {3, 8, 64, RotationKind::kNone, 0, DType::kF16, nn::KeyLayout::kChannel, 8},
  };
  struct Dims { int64_t L, kL, rep, Dk, Dv; };
  const Dims dims[] = {{16, 16, 1, 128, 128}, {37, 300, 7, 128, 128}, {20, 64, 2, 256, 256}, {100, 1100, 8, 128, 64},
                       {33, 97, 4, 64, 128}, {64, 640, 1, 256, 128}, {16, 4097, 4, 128, 128}};
  int idx = 0;
  for (const Dims& d : dims)
    for (int variant = 0; variant < 2; ++variant, ++idx) {
      ChannelCase p;
      p.s = Shape{1 + variant, 1 + idx % 2, d.rep, d.L, d.kL, d.Dk, d.Dv};
      p.cfg = cfgs[static_cast<size_t>(idx) % std::size(cfgs)];
      p.cfg.seed = rng();
      p.cfg.group_size = static_cast<int>(std::min<int64_t>(p.cfg.group_size, std::min(d.Dk, d.Dv)));
      p.mask = make_mask(rng, variant == 0 ? MaskKind::kCausal : MaskKind::kNone, p.s.B, p.s.Hq(), d.L, d.kL,
                         DType::kF32);
      p.expect_amx = true;
      p.kv_splits = idx % 3 == 1 ? 1 + static_cast<int>(rng() % 4) : 0;
      p.snapshot = idx % 5 == 3;
      p.observe = idx % 2 == 0;
      p.cfg.v_symmetric = idx % 4 == 2;
      check_channel_case(p, rng);
      if (HasFatalFailure()) return;
    }
}

// The float32-score variant of the AVX-512 kernel (CIDER_ATTN_SCORES=f32, kept for the measurement in
// docs/benchmarks.md): the reference's score algebra with exact queries, over formats and shapes.
TEST(AttentionX86, Avx512FloatScoreVariant) {
  bool has512 = false;
  for (IsaLevel l : fast_levels()) has512 = has512 || l == IsaLevel::kAvx512;
  if (!has512) GTEST_SKIP() << "no AVX-512 on this machine";
  auto rng = test::make_rng(406);
  const test::ScopedEnv f32_scores("CIDER_ATTN_SCORES", "f32");
  int idx = 0;
  for (const QuantizedKVCacheConfig& base : kConfigs) {
    Problem p;
    p.s = Shape{1, 2, idx % 2 ? 4 : 1, idx % 3 == 0 ? 7 : 1, 300 + 37 * idx, idx % 2 ? 128 : 64, 128};
    p.cfg = base;
    p.cfg.seed = rng();
    p.cfg.group_size = static_cast<int>(std::min<int64_t>(p.cfg.group_size, 64));
    p.mask = make_mask(rng, idx % 2 ? MaskKind::kCausal : MaskKind::kAdditive, 1, p.s.Hq(), p.s.L, p.s.kL,
                       DType::kF32);
    p.kv_splits = idx % 3;
    p.float_scores = true;
    check_problem(p, rng);
    ++idx;
    if (HasFatalFailure()) break;
  }
}

// Attention logit softcapping (Gemma 2: s -> cap·tanh(s/cap) before the mask): every level against float64 and the
// reference (both checks of check_problem / check_channel_case, the cap in the float64 scores and its evaluation error
// in the tolerances), over caps that bite hard (0.5: most scores, N(0, 1) here, are squeezed), moderately (2) and
// barely (50); every mask kind, formats, forced splits, snapshots, decode and prefill shapes, per-channel keys and
// the AVX-512 float-score variant.
TEST(AttentionX86, SoftcapEveryLevelMatchesReference) {
  auto rng = test::make_rng(407);
  const MaskKind kinds[] = {MaskKind::kNone, MaskKind::kCausal, MaskKind::kBool, MaskKind::kAdditive};
  int idx = 0;
  for (float cap : {0.5f, 2.0f, 50.0f})
    for (int64_t kL : {7, 300, 1100})
      for (int variant = 0; variant < 3; ++variant, ++idx) {
        Problem p;
        const int64_t L = variant == 0 ? 1 : variant == 1 ? std::min<int64_t>(kL, 7) : std::min<int64_t>(kL, 130);
        const int64_t Dk = idx % 2 ? 128 : 64, Dv = idx % 3 ? 128 : 256;
        p.s = Shape{1 + idx % 2, 2, int64_t{1} << (L > 7 ? idx % 3 : idx % 4), L, kL, Dk, Dv};
        p.cfg = kConfigs[static_cast<size_t>(idx) % std::size(kConfigs)];
        p.cfg.seed = rng();
        p.cfg.group_size = static_cast<int>(std::min<int64_t>(p.cfg.group_size, std::min(Dk, Dv)));
        p.mask = make_mask(rng, kinds[idx % 4], p.s.B, p.s.Hq(), L, kL, idx % 2 ? DType::kF16 : DType::kF32);
        p.kv_splits = idx % 3 == 1 ? 3 : 0;
        p.snapshot = idx % 5 == 3;
        p.softcap = cap;
        check_problem(p, rng);
        if (HasFatalFailure()) return;
      }
  const QuantizedKVCacheConfig chan[] = {
      {4, 4, 64, RotationKind::kHadamard, 0, DType::kF16, nn::KeyLayout::kChannel},
      {8, 4, 32, RotationKind::kNone, 0, DType::kBF16, nn::KeyLayout::kChannel},
  };
  for (float cap : {0.5f, 2.0f, 50.0f})
    for (int64_t kL : {31, 300}) {
      ChannelCase p;
      p.s = Shape{1, 2, 4, kL == 31 ? 3 : 20, kL, 128, 128};
      p.cfg = chan[static_cast<size_t>(idx++) % std::size(chan)];
      p.cfg.seed = rng();
      p.mask = make_mask(rng, idx % 2 ? MaskKind::kCausal : MaskKind::kAdditive, 1, p.s.Hq(), p.s.L, kL, DType::kF32);
      p.kv_splits = idx % 3;
      p.softcap = cap;
      check_channel_case(p, rng);
      if (HasFatalFailure()) return;
    }
  bool has512 = false;
  for (IsaLevel l : fast_levels()) has512 = has512 || l == IsaLevel::kAvx512;
  if (!has512) return;
  const test::ScopedEnv f32_scores("CIDER_ATTN_SCORES", "f32");
  for (float cap : {0.5f, 50.0f}) {
    Problem p;
    p.s = Shape{1, 2, 4, 7, 333, 128, 128};
    p.cfg = kConfigs[0];
    p.cfg.seed = rng();
    p.mask = make_mask(rng, MaskKind::kCausal, 1, p.s.Hq(), p.s.L, p.s.kL, DType::kF32);
    p.float_scores = true;
    p.softcap = cap;
    check_problem(p, rng);
    if (HasFatalFailure()) return;
  }
}

// The softcap changes the result (so the test above tests something): with cap 0.5 the reference's output differs
// from the uncapped one by far more than the tolerances, and cap·tanh(s/cap) with cap = 1e30 (the identity to
// float32 precision at these scores) reproduces the uncapped output within rounding.
TEST(AttentionX86, SoftcapChangesScoresAsDefined) {
  auto rng = test::make_rng(408);
  const Shape s{1, 1, 2, 3, 50, 64, 64};
  QuantizedKVCacheConfig cfg;
  cfg.seed = rng();
  QuantizedKVCache cache(cfg);
  fill(cache, s, rng);
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(s.Hq() * s.L * s.Dk), 3.0f);
  const size_t n = static_cast<size_t>(s.Hq() * s.L * s.Dv);
  const float scale = 0.125f;
  Mask causal;
  causal.kind = MaskKind::kCausal;
  const std::vector<float> plain =
      run(kernels::ref_kernels().attention, attention_args(s, q, cache.keys(), cache.values(), scale, causal, 0), n);
  const std::vector<float> huge = run(kernels::ref_kernels().attention,
                                      attention_args(s, q, cache.keys(), cache.values(), scale, causal, 0, 1e30f), n);
  const std::vector<float> tight = run(kernels::ref_kernels().attention,
                                       attention_args(s, q, cache.keys(), cache.values(), scale, causal, 0, 0.5f), n);
  double diff_huge = 0.0, diff_tight = 0.0;
  for (size_t i = 0; i < n; ++i) {
    diff_huge = std::max(diff_huge, static_cast<double>(std::fabs(huge[i] - plain[i])));
    diff_tight = std::max(diff_tight, static_cast<double>(std::fabs(tight[i] - plain[i])));
  }
  EXPECT_LT(diff_huge, 1e-5);
  EXPECT_GT(diff_tight, 0.05);
}

// Rows that see no key are zeros; a row that sees one key returns that key's value.
TEST(AttentionX86, FullyMaskedRowsAreZero) {
  auto rng = test::make_rng(403);
  const Shape s{1, 1, 2, 3, 40, 64, 64};
  QuantizedKVCacheConfig cfg;
  cfg.seed = rng();
  QuantizedKVCache cache(cfg);
  fill(cache, s, rng);
  std::vector<uint8_t> mask(static_cast<size_t>(s.Hq() * s.L * s.kL), 1);
  for (int64_t j = 0; j < s.kL; ++j) {
    mask[static_cast<size_t>((1 * s.L + 2) * s.kL + j)] = 0;            // head 1, row 2: nothing
    mask[static_cast<size_t>(j)] = j == 17 ? 1 : 0;                    // head 0, row 0: key 17 only
  }
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(s.Hq() * s.L * s.Dk));
  AttentionArgs args{};
  args.q = q.data();
  args.B = 1;
  args.Hq = s.Hq();
  args.L = s.L;
  args.keys = cache.keys();
  args.values = cache.values();
  args.scale = 0.125f;
  args.mask_kind = MaskKind::kBool;
  args.mask = mask.data();
  args.mask_dtype = DType::kBool;
  args.mask_stride[0] = 0;
  args.mask_stride[1] = s.L * s.kL;
  args.mask_stride[2] = s.kL;
  args.mask_stride[3] = 1;
  const Deq V = dequantize(cache.values());
  const size_t n = static_cast<size_t>(s.Hq() * s.L * s.Dv);
  for (IsaLevel level : fast_levels()) {
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    for (int splits : {0, 2}) {
      args.kv_splits = splits;
      const std::vector<float> got = run(t.attention, args, n);
      for (int64_t d = 0; d < s.Dv; ++d) {
        EXPECT_EQ(got[static_cast<size_t>((1 * s.L + 2) * s.Dv + d)], 0.0f) << t.name;
        EXPECT_NEAR(got[static_cast<size_t>(d)], V.val[static_cast<size_t>(17 * s.Dv + d)],
                    1e-6 * (1.0 + std::fabs(V.val[static_cast<size_t>(17 * s.Dv + d)])))
            << t.name;
      }
    }
  }
}

// Plain caches go to the reference kernel: the same bits.
TEST(AttentionX86, PlainCachesTakeTheReferencePath) {
  auto rng = test::make_rng(404);
  const Shape s{1, 2, 2, 3, 77, 64, 64};
  nn::PlainKVCache cache(nn::PlainKVCacheConfig{DType::kF16, RotationKind::kNone, 0});
  fill(cache, s, rng);
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(s.Hq() * s.L * s.Dk));
  AttentionArgs args{};
  args.q = q.data();
  args.B = 1;
  args.Hq = s.Hq();
  args.L = s.L;
  args.keys = cache.keys();
  args.values = cache.values();
  args.scale = 0.125f;
  args.mask_kind = MaskKind::kCausal;
  const size_t n = static_cast<size_t>(s.Hq() * s.L * s.Dv);
  const std::vector<float> ref = run(kernels::ref_kernels().attention, args, n);
  for (IsaLevel level : fast_levels()) {
    const kernels::KernelTable& t = kernels::kernels_for_isa(level);
    EXPECT_EQ(run(t.attention, args, n), ref) << t.name;
  }
}

// ---- kv_append ---------------------------------------------------------------------------------------------------

struct AppendCase {
  int64_t n, dim;
  int rotation, bits, gs;
  DType src_dtype, dst_dtype;
  int64_t elem_stride;
};

// Source rows with edge cases: an all-zero group, a constant group, tiny and large magnitudes, exact ties.
std::vector<float> append_source(std::mt19937_64& rng, int64_t rows, int64_t dim, int gs) {
  std::vector<float> x = test::randn(rng, static_cast<size_t>(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* row = &x[static_cast<size_t>(r * dim)];
    switch (r % 6) {
      case 1: std::fill(row, row + gs, 0.0f); break;
      case 2: std::fill(row, row + gs, 0.75f); break;
      case 3: for (int64_t d = 0; d < dim; ++d) row[d] *= 1e-30f; break;
      case 4: for (int64_t d = 0; d < dim; ++d) row[d] *= 3e4f; break;
      case 5: for (int64_t d = 0; d < dim; ++d) row[d] = static_cast<float>(static_cast<int>(row[d] * 4.0f)) * 0.5f; break;
      default: break;
    }
  }
  return x;
}

// Symmetric codes (a.symmetric): no biases pointer, and the bytes are codes then steps.
std::vector<uint8_t> run_append(void (*fn)(const KVAppendArgs&), KVAppendArgs a, size_t code_bytes,
                                size_t scale_bytes) {
  test::GuardedBuffer codes(code_bytes), scales(scale_bytes ? scale_bytes : 1), biases(scale_bytes ? scale_bytes : 1);
  codes.fill_inside(0x5A);
  scales.fill_inside(0x5A);
  biases.fill_inside(0x5A);
  a.dst = codes.data();
  a.scales = scale_bytes ? scales.data() : nullptr;
  a.biases = scale_bytes && !a.symmetric ? biases.data() : nullptr;
  fn(a);
  EXPECT_TRUE(codes.canaries_intact() && scales.canaries_intact() && biases.canaries_intact());
  std::vector<uint8_t> out(codes.as<uint8_t>(), codes.as<uint8_t>() + code_bytes);
  if (scale_bytes) {
    out.insert(out.end(), scales.as<uint8_t>(), scales.as<uint8_t>() + scale_bytes);
    if (!a.symmetric) out.insert(out.end(), biases.as<uint8_t>(), biases.as<uint8_t>() + scale_bytes);
  }
  return out;
}

// Symmetric value codes (KVAppendArgs::symmetric): every level gives the reference's bytes, and the reference is the
// rotation followed by quant::symmetric_quantize_row; over widths, dims, group sizes, rotations (Hadamard included),
// source and scale dtypes, strided sources and the edge rows of append_source (zeros, constants, 1e-30 and 3e4
// scales, ties).
TEST(KVAppendX86, SymmetricEveryLevelIsBitIdenticalToReference) {
  auto rng = test::make_rng(406);
  const DType src_types[] = {DType::kF32, DType::kF16, DType::kBF16};
  const DType scale_types[] = {DType::kF16, DType::kBF16, DType::kF32};
  int idx = 0;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int64_t dim : {32, 64, 96, 128, 256})
      for (int rotation : {0, 2, 3}) {
        if (rotation == 3 && (dim & (dim - 1)) != 0) continue;  // Hadamard: powers of two here
        ++idx;
        const int64_t n = idx % 3 == 0 ? 1 : (idx % 3 == 1 ? 6 : 32);
        int gs = static_cast<int>(std::min<int64_t>(dim, 32 << (idx % 3)));
        if (dim % gs) gs = 32;
        const int64_t stride = idx % 4 == 1 ? 3 : 1;
        const DType sdt = src_types[idx % 3], ddt = scale_types[(idx / 3) % 3];
        const std::vector<float> x = append_source(rng, n, dim * stride, gs);
        const std::vector<uint8_t> src = test::to_dtype_bytes(x, sdt);
        const nn::SO4Rotation so4(dim, rotation == 3 ? RotationKind::kNone : static_cast<RotationKind>(rotation), rng());
        std::vector<float> signs(static_cast<size_t>(dim));
        for (float& v : signs) v = rng() % 2 ? 1.0f : -1.0f;
        KVAppendArgs a{};
        a.src = src.data();
        a.src_dtype = sdt;
        a.src_elem_stride = stride;
        a.src_row_stride = dim * stride;
        a.n = n;
        a.dim = dim;
        a.rotation = rotation;
        a.qL = rotation == 3 ? signs.data() : rotation ? so4.left().data() : nullptr;
        a.qR = rotation == 2 ? so4.right().data() : nullptr;
        a.dst_dtype = ddt;
        a.bits = bits;
        a.group_size = gs;
        a.symmetric = true;
        const size_t code_bytes = static_cast<size_t>(n * quant::packed_words(dim, bits) * 4);
        const size_t scale_bytes = static_cast<size_t>(n * (dim / gs) * dtype_size(ddt));
        const std::vector<uint8_t> want = run_append(kernels::ref_kernels().kv_append, a, code_bytes, scale_bytes);
        // The reference: the rows rotated as the plain (bits 0) append rotates them, then symmetric_quantize_row.
        KVAppendArgs plain = a;
        plain.bits = 0;
        plain.symmetric = false;
        plain.dst_dtype = DType::kF32;
        const std::vector<uint8_t> rot = run_append(kernels::ref_kernels().kv_append, plain,
                                                    static_cast<size_t>(n * dim * 4), 0);
        std::vector<uint8_t> legacy(code_bytes + scale_bytes);
        for (int64_t r = 0; r < n; ++r)
          quant::symmetric_quantize_row(reinterpret_cast<const float*>(rot.data()) + r * dim, dim, gs, bits,
                                        reinterpret_cast<uint32_t*>(legacy.data()) + r * quant::packed_words(dim, bits),
                                        legacy.data() + code_bytes + r * (dim / gs) * dtype_size(ddt), ddt);
        ASSERT_EQ(want, legacy) << "reference vs rotation + symmetric_quantize_row: bits " << bits << " dim " << dim;
        for (IsaLevel level : fast_levels()) {
          const kernels::KernelTable& t = kernels::kernels_for_isa(level);
          ASSERT_EQ(run_append(t.kv_append, a, code_bytes, scale_bytes), want)
              << t.name << " symmetric bits " << bits << " dim " << dim << " gs " << gs << " rotation " << rotation
              << " n " << n << " src " << dtype_name(sdt) << " dst " << dtype_name(ddt) << " stride " << stride;
        }
      }
}

TEST(KVAppendX86, EveryLevelIsBitIdenticalToReference) {
  auto rng = test::make_rng(405);
  const int bits_list[] = {2, 3, 4, 5, 6, 8, 0};
  const int64_t dims[] = {32, 64, 96, 128, 256};
  const DType src_types[] = {DType::kF32, DType::kF16, DType::kBF16};
  const DType scale_types[] = {DType::kF16, DType::kBF16, DType::kF32};
  int idx = 0;
  for (int bits : bits_list)
    for (int64_t dim : dims)
      for (int rotation : {0, 1, 2}) {
        ++idx;
        AppendCase c{1 + static_cast<int64_t>(idx % 3 == 0 ? 0 : (idx % 3 == 1 ? 6 : 32)), dim, rotation, bits,
                     bits ? static_cast<int>(std::min<int64_t>(dim, 32 << (idx % 3))) : 0, src_types[idx % 3],
                     scale_types[(idx / 3) % 3], idx % 4 == 1 ? 3 : 1};
        if (bits && dim % c.gs) c.gs = 32;
        const std::vector<float> x = append_source(rng, c.n, c.dim * c.elem_stride, c.gs ? c.gs : 32);
        const std::vector<uint8_t> src = test::to_dtype_bytes(x, c.src_dtype);
        const nn::SO4Rotation rot(dim, static_cast<RotationKind>(rotation), rng());
        KVAppendArgs a{};
        a.src = src.data();
        a.src_dtype = c.src_dtype;
        a.src_elem_stride = c.elem_stride;
        a.src_row_stride = c.dim * c.elem_stride;
        a.n = c.n;
        a.dim = c.dim;
        a.rotation = rotation;
        a.qL = rotation ? rot.left().data() : nullptr;
        a.qR = rotation ? rot.right().data() : nullptr;
        a.dst_dtype = c.dst_dtype;
        a.bits = bits;
        a.group_size = c.gs;
        const size_t code_bytes = static_cast<size_t>(bits ? c.n * quant::packed_words(dim, bits) * 4
                                                            : c.n * dim * dtype_size(c.dst_dtype));
        const size_t scale_bytes = bits ? static_cast<size_t>(c.n * (dim / c.gs) * dtype_size(c.dst_dtype)) : 0;
        const std::vector<uint8_t> want = run_append(kernels::ref_kernels().kv_append, a, code_bytes, scale_bytes);
        // The reference is today's cache arithmetic: SO4Rotation::apply, then affine_quantize_row / rounding.
        std::vector<uint8_t> legacy;
        {
          std::vector<float> rows(static_cast<size_t>(c.n * dim));
          for (int64_t r = 0; r < c.n; ++r)
            for (int64_t d = 0; d < dim; ++d)
              rows[static_cast<size_t>(r * dim + d)] =
                  load_float(src.data(), c.src_dtype, r * a.src_row_stride + d * a.src_elem_stride);
          rot.apply(rows.data(), c.n);
          std::vector<uint8_t> codes(code_bytes), sc(scale_bytes), bi(scale_bytes);
          for (int64_t r = 0; r < c.n; ++r) {
            if (bits) {
              quant::affine_quantize_row(&rows[static_cast<size_t>(r * dim)], dim, c.gs, bits,
                                         reinterpret_cast<uint32_t*>(codes.data()) + r * quant::packed_words(dim, bits),
                                         sc.data() + r * (dim / c.gs) * dtype_size(c.dst_dtype),
                                         bi.data() + r * (dim / c.gs) * dtype_size(c.dst_dtype), c.dst_dtype);
            } else {
              for (int64_t d = 0; d < dim; ++d) store_float(codes.data(), c.dst_dtype, r * dim + d, rows[static_cast<size_t>(r * dim + d)]);
            }
          }
          legacy = codes;
          legacy.insert(legacy.end(), sc.begin(), sc.end());
          legacy.insert(legacy.end(), bi.begin(), bi.end());
        }
        ASSERT_EQ(want, legacy) << "reference vs SO4Rotation + affine_quantize_row: bits " << bits << " dim " << dim;
        for (IsaLevel level : fast_levels()) {
          const kernels::KernelTable& t = kernels::kernels_for_isa(level);
          ASSERT_EQ(run_append(t.kv_append, a, code_bytes, scale_bytes), want)
              << t.name << " bits " << bits << " dim " << dim << " gs " << c.gs << " rotation " << rotation << " n "
              << c.n << " src " << dtype_name(c.src_dtype) << " dst " << dtype_name(c.dst_dtype) << " stride "
              << c.elem_stride;
        }
      }
}

// The Hadamard rotation (3, qL = the signs): every level gives the reference's bytes, and the reference is
// Rotation::apply followed by affine_quantize_row / rounding. Powers of two from 1 (plain) or 32 (quantized) to 512
// and other dims (blocks of 8, 16, 32), so the in-vector stages, the between-vector stages, several blocks per row
// and the short-block fallback all run.
TEST(KVAppendX86, HadamardEveryLevelIsBitIdenticalToReference) {
  auto rng = test::make_rng(406);
  const DType src_types[] = {DType::kF32, DType::kF16, DType::kBF16};
  const DType dst_types[] = {DType::kF16, DType::kBF16, DType::kF32};
  int idx = 0;
  for (int bits : {0, 2, 3, 4, 5, 6, 8})
    for (int64_t dim : {1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 256, 512}) {
      if (bits && dim % 32) continue;
      ++idx;
      int gs = bits ? static_cast<int>(std::min<int64_t>(dim, 32 << (idx % 3))) : 0;
      if (bits && dim % gs) gs = 32;
      const int64_t n = idx % 3 == 0 ? 1 : (idx % 3 == 1 ? 7 : 33);
      const int64_t stride = idx % 4 == 1 ? 3 : 1;
      const DType src_dtype = src_types[idx % 3], dst_dtype = dst_types[(idx / 3) % 3];
      std::vector<float> x = append_source(rng, n, dim * stride, gs ? gs : static_cast<int>(std::min<int64_t>(dim, 32)));
      // Finite inputs only (the cache rejects others): the ×3e4 rows would overflow float16 to ±inf, and NaNs that a
      // transform over the whole row then makes may differ in sign between levels (payloads are not specified).
      for (float& v : x) v = std::clamp(v, -6e4f, 6e4f);
      const std::vector<uint8_t> src = test::to_dtype_bytes(x, src_dtype);
      const nn::Rotation rot(dim, RotationKind::kHadamard, rng());
      KVAppendArgs a{};
      a.src = src.data();
      a.src_dtype = src_dtype;
      a.src_elem_stride = stride;
      a.src_row_stride = dim * stride;
      a.n = n;
      a.dim = dim;
      a.rotation = 3;
      a.qL = rot.kernel_qL();
      a.qR = rot.kernel_qR();
      a.dst_dtype = dst_dtype;
      a.bits = bits;
      a.group_size = gs;
      const size_t code_bytes =
          static_cast<size_t>(bits ? n * quant::packed_words(dim, bits) * 4 : n * dim * dtype_size(dst_dtype));
      const size_t scale_bytes = bits ? static_cast<size_t>(n * (dim / gs) * dtype_size(dst_dtype)) : 0;
      const std::vector<uint8_t> want = run_append(kernels::ref_kernels().kv_append, a, code_bytes, scale_bytes);
      std::vector<uint8_t> legacy;
      {
        std::vector<float> rows(static_cast<size_t>(n * dim));
        for (int64_t r = 0; r < n; ++r)
          for (int64_t d = 0; d < dim; ++d)
            rows[static_cast<size_t>(r * dim + d)] = load_float(src.data(), src_dtype, r * a.src_row_stride + d * stride);
        rot.apply(rows.data(), n);
        std::vector<uint8_t> codes(code_bytes), sc(scale_bytes), bi(scale_bytes);
        for (int64_t r = 0; r < n; ++r) {
          if (bits) {
            quant::affine_quantize_row(&rows[static_cast<size_t>(r * dim)], dim, gs, bits,
                                       reinterpret_cast<uint32_t*>(codes.data()) + r * quant::packed_words(dim, bits),
                                       sc.data() + r * (dim / gs) * dtype_size(dst_dtype),
                                       bi.data() + r * (dim / gs) * dtype_size(dst_dtype), dst_dtype);
          } else {
            for (int64_t d = 0; d < dim; ++d)
              store_float(codes.data(), dst_dtype, r * dim + d, rows[static_cast<size_t>(r * dim + d)]);
          }
        }
        legacy = codes;
        legacy.insert(legacy.end(), sc.begin(), sc.end());
        legacy.insert(legacy.end(), bi.begin(), bi.end());
      }
      ASSERT_EQ(want, legacy) << "reference vs Rotation::apply + quantize: bits " << bits << " dim " << dim;
      for (IsaLevel level : fast_levels()) {
        const kernels::KernelTable& t = kernels::kernels_for_isa(level);
        ASSERT_EQ(run_append(t.kv_append, a, code_bytes, scale_bytes), want)
            << t.name << " hadamard bits " << bits << " dim " << dim << " gs " << gs << " n " << n << " src "
            << dtype_name(src_dtype) << " dst " << dtype_name(dst_dtype) << " stride " << stride;
      }
    }
}

}  // namespace
}  // namespace cider
