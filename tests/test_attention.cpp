// Attention over KV caches: against float64 attention on the dequantized cache (tight) and on the original data
// (bounded), masks, GQA, plain caches, the benefit of rotation on outlier channels, and every rejection.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "quant/affine.h"
#include "support/test_support.h"

namespace cider {
namespace {

using kernels::KVTensorView;
using kernels::MaskKind;
using nn::AttentionMask;
using nn::KVCache;
using nn::PlainKVCache;
using nn::PlainKVCacheConfig;
using nn::QuantizedKVCache;
using nn::QuantizedKVCacheConfig;
using nn::RotationKind;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Dims {
  int64_t B, Hkv, rep, L, kL, Dk, Dv;
  int64_t Hq() const { return Hkv * rep; }
};

// A mask as the test holds it: kind, window, and (bool / additive) a tensor with its own shape, broadcast on read.
struct MaskSpec {
  MaskKind kind = MaskKind::kNone;
  int64_t window = 0;
  DType dtype = DType::kBool;
  std::vector<int64_t> shape;  // rank 2..4, aligned right with [B, Hq, L, kL]
  std::vector<uint8_t> bytes;

  AttentionMask view() const {
    AttentionMask m;
    m.kind = kind;
    m.window = window;
    if (!shape.empty()) m.mask = TensorView(bytes.data(), dtype, shape);
    return m;
  }
  // The mask entry for [b, h, i, j] (broadcast).
  double at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t idx4[4] = {b, h, i, j};
    int64_t off = 0, stride = 1;
    const int r = static_cast<int>(shape.size());
    for (int k = r - 1; k >= 0; --k) {
      const int64_t d = shape[static_cast<size_t>(k)];
      off += (d == 1 ? 0 : idx4[4 - r + k]) * stride;
      stride *= d;
    }
    if (dtype == DType::kBool) return bytes[static_cast<size_t>(off)] ? 1.0 : 0.0;
    return load_float(bytes.data(), dtype, off);
  }
};

// Random bool mask of the given shape (each entry visible with probability 0.7).
MaskSpec bool_mask(std::mt19937_64& rng, std::vector<int64_t> shape) {
  MaskSpec m;
  m.kind = MaskKind::kBool;
  m.dtype = DType::kBool;
  m.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : m.shape) n *= d;
  std::bernoulli_distribution vis(0.7);
  for (int64_t i = 0; i < n; ++i) m.bytes.push_back(vis(rng) ? 1 : 0);
  return m;
}

// Random additive mask: N(0, 2²) with about one entry in six −inf.
MaskSpec additive_mask(std::mt19937_64& rng, std::vector<int64_t> shape, DType dt) {
  MaskSpec m;
  m.kind = MaskKind::kAdditive;
  m.dtype = dt;
  m.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : m.shape) n *= d;
  std::vector<float> v = test::randn(rng, static_cast<size_t>(n), 2.0f);
  std::uniform_int_distribution<int> six(0, 5);
  for (float& x : v)
    if (six(rng) == 0) x = -std::numeric_limits<float>::infinity();
  m.bytes = test::to_dtype_bytes(v, dt);
  return m;
}

// Float64 attention: q [B, Hq, L, Dk], k [B, Hkv, kL, Dk], v [B, Hkv, kL, Dv] -> [B, Hq, L, Dv].
// softcap > 0: scores cap·tanh(s/cap) before the mask (Gemma 2).
std::vector<double> ref_attention(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, double scale, const MaskSpec& mask,
                                  double softcap = 0.0) {
  std::vector<double> out(static_cast<size_t>(d.B * d.Hq() * d.L * d.Dv), 0.0);
  std::vector<double> s(static_cast<size_t>(d.kL));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq(); ++h)
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t g = h / d.rep, pos = d.kL - d.L + i;
        const double* qr = &q[static_cast<size_t>(((b * d.Hq() + h) * d.L + i) * d.Dk)];
        double m = -kInf;
        for (int64_t j = 0; j < d.kL; ++j) {
          bool visible = true;
          if (mask.kind == MaskKind::kCausal) visible = j <= pos && (mask.window == 0 || j > pos - mask.window);
          if (mask.kind == MaskKind::kBool) visible = mask.at(b, h, i, j) != 0.0;
          double x = -kInf;
          if (visible) {
            const double* kr = &k[static_cast<size_t>(((b * d.Hkv + g) * d.kL + j) * d.Dk)];
            x = 0.0;
            for (int64_t c = 0; c < d.Dk; ++c) x += qr[c] * kr[c];
            x *= scale;
            if (softcap > 0.0) x = softcap * std::tanh(x / softcap);
            if (mask.kind == MaskKind::kAdditive) x += mask.at(b, h, i, j);
          }
          s[static_cast<size_t>(j)] = x;
          m = std::max(m, x);
        }
        if (m == -kInf) continue;  // sees no key: zeros
        double den = 0.0;
        double* o = &out[static_cast<size_t>(((b * d.Hq() + h) * d.L + i) * d.Dv)];
        for (int64_t j = 0; j < d.kL; ++j) {
          const double p = std::exp(s[static_cast<size_t>(j)] - m);
          den += p;
          const double* vr = &v[static_cast<size_t>(((b * d.Hkv + g) * d.kL + j) * d.Dv)];
          for (int64_t c = 0; c < d.Dv; ++c) o[c] += p * vr[c];
        }
        for (int64_t c = 0; c < d.Dv; ++c) o[c] /= den;
      }
  return out;
}

// The cache's contents as float64 [B, H, length, dim] in the ORIGINAL space: code·scale + bias from the stored
// (rounded) scale and bias, exactly as the kernel's algebra, then rotated back with the dense matrix (Mᵀ x).
std::vector<double> dequantized(const KVTensorView& v, const nn::SO4Rotation& rot) {
  const int64_t D = v.dim;
  std::vector<double> out(static_cast<size_t>(v.B * v.H * v.length * D));
  const std::vector<double> M = rot.dense_matrix();
  std::vector<double> row(static_cast<size_t>(D));
  for (int64_t b = 0; b < v.B; ++b)
    for (int64_t h = 0; h < v.H; ++h)
      for (int64_t t = 0; t < v.length; ++t) {
        const int64_t r = (b * v.H + h) * v.capacity + t;
        const int64_t nq = v.layout == 1 ? v.length / v.group_size * v.group_size : 0;
        for (int64_t d = 0; d < D; ++d) {
          if (v.bits == 0) {
            row[static_cast<size_t>(d)] = load_float(v.data, v.dtype, r * D + d);
          } else if (v.layout == 1 && t >= nq) {  // per-channel keys: the bfloat16 residual window
            row[static_cast<size_t>(d)] =
                load_float(v.residual, DType::kBF16, ((b * v.H + h) * v.group_size + t - nq) * D + d);
          } else if (v.layout == 1) {  // per-channel keys: scale and bias of (block, channel)
            const uint32_t* words = static_cast<const uint32_t*>(v.data) + r * quant::packed_words(D, v.bits);
            const int64_t sr = ((b * v.H + h) * v.blocks + t / v.group_size) * D + d;
            row[static_cast<size_t>(d)] = static_cast<double>(quant::unpack_code(words, d, v.bits)) *
                                              load_float(v.scales, v.scale_dtype, sr) +
                                          load_float(v.biases, v.scale_dtype, sr);
          } else {
            const int64_t groups = D / v.group_size;
            const uint32_t* words = static_cast<const uint32_t*>(v.data) + r * quant::packed_words(D, v.bits);
            const double s = load_float(v.scales, v.scale_dtype, r * groups + d / v.group_size);
            const double bias = load_float(v.biases, v.scale_dtype, r * groups + d / v.group_size);
            row[static_cast<size_t>(d)] = static_cast<double>(quant::unpack_code(words, d, v.bits)) * s + bias;
          }
        }
        double* dst = &out[static_cast<size_t>(((b * v.H + h) * v.length + t) * D)];
        for (int64_t i = 0; i < D; ++i) {
          double x = 0.0;
          for (int64_t k = 0; k < D; ++k) x += M[static_cast<size_t>(k * D + i)] * row[static_cast<size_t>(k)];
          dst[i] = x;
        }
      }
  return out;
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Appends [B, H, kL, D] keys/values in two chunks (crossing a step boundary when kL > 256).
void fill_cache(KVCache& cache, const Dims& d, const std::vector<float>& k, const std::vector<float>& v) {
  const int64_t first = d.kL > 1 ? d.kL / 3 + 1 : d.kL;
  for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, first}, {first, d.kL - first}}) {
    if (n == 0) continue;
    std::vector<float> kc(static_cast<size_t>(d.B * d.Hkv * n * d.Dk)), vc(static_cast<size_t>(d.B * d.Hkv * n * d.Dv));
    for (int64_t bh = 0; bh < d.B * d.Hkv; ++bh)
      for (int64_t t = 0; t < n; ++t) {
        std::copy_n(&k[static_cast<size_t>((bh * d.kL + t0 + t) * d.Dk)], d.Dk,
                    &kc[static_cast<size_t>((bh * n + t) * d.Dk)]);
        std::copy_n(&v[static_cast<size_t>((bh * d.kL + t0 + t) * d.Dv)], d.Dv,
                    &vc[static_cast<size_t>((bh * n + t) * d.Dv)]);
      }
    cache.update_and_fetch(TensorView(kc.data(), DType::kF32, {d.B, d.Hkv, n, d.Dk}),
                           TensorView(vc.data(), DType::kF32, {d.B, d.Hkv, n, d.Dv}));
  }
}

// Runs nn::attention into a canary-guarded float32 output (pre-filled with NaN bytes so an unwritten element fails).
std::vector<float> run_attention(const Dims& d, const std::vector<float>& q, const KVCache& cache, float scale,
                                 const MaskSpec& mask, float softcap = 0.0f) {
  const size_t n = static_cast<size_t>(d.B * d.Hq() * d.L * d.Dv);
  test::GuardedBuffer buf(n * sizeof(float));
  buf.fill_inside(0xFF);
  nn::attention(TensorView(q.data(), DType::kF32, {d.B, d.Hq(), d.L, d.Dk}), cache, scale, mask.view(),
                TensorView(buf.data(), DType::kF32, {d.B, d.Hq(), d.L, d.Dv}), softcap);
  EXPECT_TRUE(buf.canaries_intact());
  EXPECT_TRUE(test::no_nan(buf.as<float>(), n));
  return std::vector<float>(buf.as<float>(), buf.as<float>() + n);
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0.0, n = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    n += want[i] * want[i];
  }
  return std::sqrt(e / std::max(n, 1e-300));
}

std::string describe(const Dims& d, const QuantizedKVCacheConfig& c, const MaskSpec& m) {
  char s[256];
  std::snprintf(s, sizeof s, "B%lld Hkv%lld rep%lld L%lld kL%lld Dk%lld Dv%lld K%d V%d g%d %s %s mask%d win%lld",
                static_cast<long long>(d.B), static_cast<long long>(d.Hkv), static_cast<long long>(d.rep),
                static_cast<long long>(d.L), static_cast<long long>(d.kL), static_cast<long long>(d.Dk),
                static_cast<long long>(d.Dv), c.k_bits, c.v_bits, c.group_size, nn::rotation_kind_name(c.rotation),
                dtype_name(c.scale_dtype), static_cast<int>(m.kind), static_cast<long long>(m.window));
  return std::string(s) + (c.key_layout == nn::KeyLayout::kChannel ? " kchan" : "");
}

// The tight check: the kernel's float32 result equals float64 attention over the dequantized cache up to float32
// accumulation error. Scores carry a relative error of about Dk·2^-24 (score magnitudes here are O(few)); outputs
// are convex combinations of values, so errors scale with max|v|: 1e-4·max|v| leaves a wide margin.
// The bounded check: against float64 attention over the original data the error is the quantization error, at most
// max_j ‖v̂_j − v_j‖ (values) plus (e^{2δ} − 1)·max_j ‖v_j‖ with δ = max |ŝ − s| the score perturbation (keys), per
// output row in the Euclidean norm.
void check_case(const Dims& d, const QuantizedKVCacheConfig& cfg, const MaskSpec& mask, std::mt19937_64& rng) {
  const std::string what = describe(d, cfg, mask);
  QuantizedKVCache cache(cfg);
  const std::vector<float> k = test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dk));
  const std::vector<float> v = test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dv));
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(d.B * d.Hq() * d.L * d.Dk));
  fill_cache(cache, d, k, v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.Dk));
  const std::vector<float> got = run_attention(d, q, cache, scale, mask);

  const std::vector<double> kq = dequantized(cache.keys(), cache.key_rotation());
  const std::vector<double> vq = dequantized(cache.values(), cache.value_rotation());
  const std::vector<double> qd = to_double(q);
  const std::vector<double> want_deq = ref_attention(d, qd, kq, vq, scale, mask);
  EXPECT_TRUE(test::all_close(got.data(), want_deq.data(), got.size(), 1e-4 * max_abs(vq))) << what;

  // Bounded error against the original data.
  const std::vector<double> kd = to_double(k), vd = to_double(v);
  const std::vector<double> want = ref_attention(d, qd, kd, vd, scale, mask);
  double v_err = 0.0, v_norm = 0.0, delta = 0.0;
  for (int64_t r = 0; r < d.B * d.Hkv * d.kL; ++r) {
    double e = 0.0, n = 0.0;
    for (int64_t c = 0; c < d.Dv; ++c) {
      const size_t i = static_cast<size_t>(r * d.Dv + c);
      e += (vq[i] - vd[i]) * (vq[i] - vd[i]);
      n += vd[i] * vd[i];
    }
    v_err = std::max(v_err, std::sqrt(e));
    v_norm = std::max(v_norm, std::sqrt(n));
  }
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq(); ++h)
      for (int64_t i = 0; i < d.L; ++i)
        for (int64_t j = 0; j < d.kL; ++j) {
          double ds = 0.0;
          const size_t qo = static_cast<size_t>(((b * d.Hq() + h) * d.L + i) * d.Dk);
          const size_t ko = static_cast<size_t>(((b * d.Hkv + h / d.rep) * d.kL + j) * d.Dk);
          for (int64_t c = 0; c < d.Dk; ++c)
            ds += qd[qo + static_cast<size_t>(c)] * (kq[ko + static_cast<size_t>(c)] - kd[ko + static_cast<size_t>(c)]);
          delta = std::max(delta, std::fabs(ds) * scale);
        }
  const double bound = v_err + (std::exp(2.0 * delta) - 1.0) * v_norm;
  for (int64_t r = 0; r < d.B * d.Hq() * d.L; ++r) {
    double e = 0.0;
    for (int64_t c = 0; c < d.Dv; ++c) {
      const size_t i = static_cast<size_t>(r * d.Dv + c);
      e += (got[i] - want[i]) * (got[i] - want[i]);
    }
    ASSERT_LE(std::sqrt(e), bound * 1.001 + 1e-5) << what << " row " << r;
  }
  // And the typical error is far below that worst case: the relative quantization noise of b-bit codes, about
  // 2^-b (measured: 0.15–0.22 for K4/V3, 0.45 for K3/V2, 0.04 for K6/V5), with a 3× margin. Not at 2 bits: there the
  // noise is of the order of the signal (per-channel K2/V2 reached 0.85 on one seed, against 3·2^-2 = 0.75), and
  // only the worst-case bound above holds.
  const int min_bits = std::min(cfg.k_bits, cfg.v_bits);
  if (min_bits >= 3) {
    EXPECT_LT(rel_error(got, want), 3.0 * std::ldexp(1.0, -min_bits)) << what;
  }
}

// The sweep: every (L, kL) pair with L <= kL, cycling head dims, GQA ratios, batch sizes, masks and cache configs.
TEST(Attention, MatchesFloat64OnDequantizedAndOriginalData) {
  auto rng = test::make_rng(100);
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1},   {1, 7},   {7, 7},   {1, 67},  {7, 67},
                                                 {33, 67}, {1, 300}, {7, 300}, {33, 300}};
  const int64_t dims[] = {64, 128, 256};
  const int64_t reps[] = {1, 2, 4};
  const QuantizedKVCacheConfig cfgs[] = {
      {4, 3, 64, RotationKind::kSO4Full, 0, DType::kF16}, {4, 3, 32, RotationKind::kSO4Fast, 0, DType::kBF16},
      {3, 2, 128, RotationKind::kNone, 0, DType::kF32},   {8, 4, 64, RotationKind::kSO4Full, 0, DType::kF16},
      {6, 5, 32, RotationKind::kSO4Full, 0, DType::kF32},
  };
  int idx = 0;
  for (auto [L, kL] : lengths)
    for (int variant = 0; variant < 2; ++variant, ++idx) {
      Dims d{1 + idx % 2, idx % 3 == 2 ? 2 : 1, reps[idx % 3], L, kL, dims[idx % 3], dims[(idx + variant) % 3]};
      QuantizedKVCacheConfig cfg = cfgs[idx % 5];
      cfg.seed = rng();
      cfg.group_size = static_cast<int>(std::min<int64_t>(cfg.group_size, std::min(d.Dk, d.Dv)));
      MaskSpec mask;
      switch (idx % 5) {
        case 0: break;
        case 1: mask.kind = MaskKind::kCausal; break;
        case 2:
          mask.kind = MaskKind::kCausal;
          mask.window = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(kL));
          break;
        case 3: mask = bool_mask(rng, {d.L, d.kL}); break;
        case 4: mask = additive_mask(rng, {1, d.Hq(), d.L, d.kL}, DType::kF32); break;
      }
      check_case(d, cfg, mask, rng);
    }
}

// Per-channel keys (KeyLayout::kChannel): the same two checks, over lengths that end inside the residual window,
// exactly on a block boundary and past several blocks, appended in two chunks that cross block boundaries.
TEST(Attention, PerChannelKeysMatchFloat64OnDequantizedAndOriginalData) {
  auto rng = test::make_rng(107);
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1},   {1, 31},  {5, 32},  {1, 64},  {7, 100},
                                                 {33, 128}, {1, 300}, {9, 300}, {64, 257}, {1, 520}};
  const int64_t dims[] = {64, 128, 256};
  const int64_t reps[] = {1, 2, 4};
  using nn::KeyLayout;
  const QuantizedKVCacheConfig cfgs[] = {
      {4, 4, 64, RotationKind::kHadamard, 0, DType::kF16, KeyLayout::kChannel},
      {4, 3, 32, RotationKind::kNone, 0, DType::kBF16, KeyLayout::kChannel},
      {2, 2, 128, RotationKind::kSO4Full, 0, DType::kF32, KeyLayout::kChannel},
      {8, 4, 64, RotationKind::kHadamard, 0, DType::kF16, KeyLayout::kChannel},
      {3, 5, 32, RotationKind::kSO4Fast, 0, DType::kF16, KeyLayout::kChannel},
  };
  int idx = 0;
  for (auto [L, kL] : lengths)
    for (int variant = 0; variant < 2; ++variant, ++idx) {
      Dims d{1 + idx % 2, idx % 3 == 2 ? 2 : 1, reps[idx % 3], L, kL, dims[idx % 3], dims[(idx + variant) % 3]};
      QuantizedKVCacheConfig cfg = cfgs[idx % 5];
      cfg.seed = rng();
      cfg.group_size = static_cast<int>(std::min<int64_t>(cfg.group_size, std::min(d.Dk, d.Dv)));
      MaskSpec mask;
      switch (idx % 4) {
        case 0: mask.kind = MaskKind::kCausal; break;
        case 1:
          mask.kind = MaskKind::kCausal;
          mask.window = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(kL));
          break;
        case 2: mask = bool_mask(rng, {d.L, d.kL}); break;
        case 3: mask = additive_mask(rng, {1, d.Hq(), d.L, d.kL}, DType::kF32); break;
      }
      check_case(d, cfg, mask, rng);
    }
}

TEST(Attention, CausalWithAndWithoutWindow) {
  auto rng = test::make_rng(101);
  for (int64_t window : {0, 1, 5, 40, 400}) {
    Dims d{2, 2, 2, 33, 67, 128, 64};
    QuantizedKVCacheConfig cfg;
    cfg.seed = rng();
    MaskSpec mask;
    mask.kind = MaskKind::kCausal;
    mask.window = window;
    check_case(d, cfg, mask, rng);
  }
}

TEST(Attention, BoolMasksWithBroadcasting) {
  auto rng = test::make_rng(102);
  Dims d{2, 2, 2, 7, 67, 64, 64};
  const std::vector<std::vector<int64_t>> shapes = {{7, 67}, {1, 7, 67}, {4, 7, 67}, {2, 1, 7, 67}, {2, 4, 1, 67}};
  for (const auto& shape : shapes) {
    QuantizedKVCacheConfig cfg;
    cfg.seed = rng();
    check_case(d, cfg, bool_mask(rng, shape), rng);
  }
}

TEST(Attention, AdditiveMasksInEveryFloatDtype) {
  auto rng = test::make_rng(103);
  Dims d{1, 2, 4, 7, 300, 128, 128};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    QuantizedKVCacheConfig cfg;
    cfg.seed = rng();
    check_case(d, cfg, additive_mask(rng, {d.L, d.kL}, dt), rng);
  }
}

// The fast x86 kernels score per-channel keys with each block's q' = float32(q ⊙ s) quantized to 16 bits
// (kernels/x86/attention_x86.h: one group of the whole head up to 256 dims, else of group_size; s = max|q'|/127,
// Q = rint(q'·(256/s)), q̃' = (s/256)·Q), where the reference kernel uses q itself. That moves the score of a
// quantized position j by scale·Σ_d (q'_d − q̃'_d)·c_jd (c the stored codes): the largest such change over every
// query row and position, in float64 (0 for other layouts, whose query is rotated first and not replicated here;
// the kernel-level bounds of test_attention_x86 cover them).
double channel_query_delta(const Dims& d, const std::vector<float>& q, const KVTensorView& kv, float scale) {
  if (kv.layout != 1 || kv.bits == 0) return 0.0;
  const int64_t gs = kv.group_size, nq = kv.length / gs * gs, gq = d.Dk <= 256 ? d.Dk : gs;
  double delta = 0.0;
  std::vector<float> qp(static_cast<size_t>(d.Dk));
  std::vector<double> err(static_cast<size_t>(d.Dk));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t hq = 0; hq < d.Hq(); ++hq)
      for (int64_t i = 0; i < d.L; ++i) {
        const int64_t g = hq / d.rep;
        const float* qr = q.data() + ((b * d.Hq() + hq) * d.L + i) * d.Dk;
        for (int64_t blk = 0; blk < nq / gs; ++blk) {
          const int64_t sr = ((b * kv.H + g) * kv.blocks + blk) * d.Dk;
          for (int64_t k = 0; k < d.Dk; ++k)
            qp[static_cast<size_t>(k)] = qr[k] * static_cast<float>(load_float(kv.scales, kv.scale_dtype, sr + k));
          for (int64_t g0 = 0; g0 < d.Dk; g0 += gq) {
            float amax = 0.0f;
            for (int64_t k = g0; k < g0 + gq; ++k) amax = std::max(amax, std::fabs(qp[static_cast<size_t>(k)]));
            const float st = amax / 127.0f, inv2 = 256.0f * (st > 0.0f ? 1.0f / st : 0.0f);
            for (int64_t k = g0; k < g0 + gq; ++k) {
              const float x = qp[static_cast<size_t>(k)];
              const double qt = st > 0.0f ? static_cast<double>(st / 256.0f) * std::nearbyint(x * inv2) : 0.0;
              err[static_cast<size_t>(k)] = static_cast<double>(x) - qt;
            }
          }
          for (int64_t j = blk * gs; j < (blk + 1) * gs; ++j) {
            const uint32_t* words = static_cast<const uint32_t*>(kv.data) +
                                    ((b * kv.H + g) * kv.capacity + j) * quant::packed_words(d.Dk, kv.bits);
            double sum = 0.0;
            for (int64_t k = 0; k < d.Dk; ++k)
              sum += err[static_cast<size_t>(k)] * static_cast<double>(quant::unpack_code(words, k, kv.bits));
            delta = std::max(delta, static_cast<double>(scale) * std::fabs(sum));
          }
        }
      }
  return delta;
}

// Attention logit softcapping (Gemma 2) through nn::attention, whichever kernel table is active: float64 attention
// with s -> cap·tanh(s/cap) before the mask over the stored (dequantized) cache, for a plain float32 cache, the default
// K8/V4 Hadamard cache and per-channel keys, with caps that bite hard (0.5), moderately (3) and barely (50), causal
// (windowed) and additive masks (an additive −inf still hides a key: the mask comes after the cap). The cap is
// 1-Lipschitz and evaluated within a few float32 ulp of cap, so the tight 1e-4·max|v| of check_case holds, plus for
// per-channel keys the fast kernels' query quantization (channel_query_delta: a score change δ moves the output by at
// most (e^{2δ} − 1)·max|v|); without the cap the outputs differ by far more (asserted, so the comparison is not
// vacuous).
TEST(Attention, SoftcapMatchesFloat64) {
  auto rng = test::make_rng(108);
  const Dims d{2, 2, 2, 7, 300, 64, 64};
  const std::vector<float> k = test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dk));
  const std::vector<float> v = test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dv));
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(d.B * d.Hq() * d.L * d.Dk), 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.Dk));
  std::vector<std::unique_ptr<KVCache>> caches;
  caches.push_back(std::make_unique<PlainKVCache>(PlainKVCacheConfig{DType::kF32, RotationKind::kSO4Full, rng()}));
  QuantizedKVCacheConfig tok;
  tok.seed = rng();
  caches.push_back(std::make_unique<QuantizedKVCache>(tok));
  QuantizedKVCacheConfig chan{4, 4, 64, RotationKind::kHadamard, rng(), DType::kF16, nn::KeyLayout::kChannel};
  caches.push_back(std::make_unique<QuantizedKVCache>(chan));
  MaskSpec causal;
  causal.kind = MaskKind::kCausal;
  causal.window = 100;
  const MaskSpec additive = additive_mask(rng, {1, d.Hq(), d.L, d.kL}, DType::kF32);
  for (const auto& cache : caches) {
    fill_cache(*cache, d, k, v);
    const std::vector<double> kq = dequantized(cache->keys(), cache->key_rotation());
    const std::vector<double> vq = dequantized(cache->values(), cache->value_rotation());
    for (const MaskSpec* mask : std::initializer_list<const MaskSpec*>{&causal, &additive})
      for (float cap : {0.5f, 3.0f, 50.0f}) {
        const std::string what = "cache layout " + std::to_string(cache->keys().layout) + " bits " +
                                 std::to_string(cache->keys().bits) + " mask " +
                                 std::to_string(static_cast<int>(mask->kind)) + " cap " + std::to_string(cap);
        const std::vector<float> got = run_attention(d, q, *cache, scale, *mask, cap);
        const std::vector<double> want = ref_attention(d, to_double(q), kq, vq, scale, *mask, cap);
        const double qdelta = channel_query_delta(d, q, cache->keys(), scale);  // the cap is 1-Lipschitz
        EXPECT_TRUE(test::all_close(got.data(), want.data(), got.size(),
                                    (1e-4 + std::expm1(2.0 * qdelta)) * max_abs(vq)))
            << what << " (query quantization δ " << qdelta << ")";
        if (cap < 1.0f) {
          const std::vector<double> uncapped = ref_attention(d, to_double(q), kq, vq, scale, *mask);
          double diff = 0.0;
          for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::fabs(got[i] - uncapped[i]));
          EXPECT_GT(diff, 0.1 * max_abs(vq)) << what;
        }
      }
  }
  // softcap 0 is exactly the uncapped call.
  const std::vector<float> a = run_attention(d, q, *caches[1], scale, causal);
  const std::vector<float> b = run_attention(d, q, *caches[1], scale, causal, 0.0f);
  EXPECT_EQ(a, b);
}

// Rows that see no key (bool mask all false, additive mask all −inf) are zeros; the other rows are unaffected.
TEST(Attention, FullyMaskedRowsAreZero) {
  auto rng = test::make_rng(104);
  Dims d{1, 1, 2, 4, 7, 64, 64};
  QuantizedKVCacheConfig cfg;
  cfg.seed = rng();
  QuantizedKVCache cache(cfg);
  const std::vector<float> k = test::randn(rng, static_cast<size_t>(d.kL * d.Dk)),
                           v = test::randn(rng, static_cast<size_t>(d.kL * d.Dv));
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(d.Hq() * d.L * d.Dk));
  fill_cache(cache, d, k, v);
  const std::vector<double> kq = dequantized(cache.keys(), cache.key_rotation());
  const std::vector<double> vq = dequantized(cache.values(), cache.value_rotation());
  for (int kind = 0; kind < 2; ++kind) {
    MaskSpec mask =
        kind == 0 ? bool_mask(rng, {d.Hq(), d.L, d.kL}) : additive_mask(rng, {d.Hq(), d.L, d.kL}, DType::kF32);
    // Head 1, row 2 sees nothing; head 0, row 0 sees only key 3.
    for (int64_t j = 0; j < d.kL; ++j) {
      const size_t hidden = static_cast<size_t>((1 * d.L + 2) * d.kL + j), single = static_cast<size_t>(j);
      if (kind == 0) {
        mask.bytes[hidden] = 0;
        mask.bytes[single] = j == 3 ? 1 : 0;
      } else {
        const float neg = -std::numeric_limits<float>::infinity();
        std::memcpy(&mask.bytes[hidden * 4], &neg, 4);
        const float val = j == 3 ? 0.5f : neg;
        std::memcpy(&mask.bytes[single * 4], &val, 4);
      }
    }
    const std::vector<float> got = run_attention(d, q, cache, 0.125f, mask);
    for (int64_t c = 0; c < d.Dv; ++c) {
      EXPECT_EQ(got[static_cast<size_t>((1 * d.L + 2) * d.Dv + c)], 0.0f) << c;
      EXPECT_NEAR(got[static_cast<size_t>(c)], vq[static_cast<size_t>(3 * d.Dv + c)], 1e-5) << c;  // the only key
    }
    const std::vector<double> want = ref_attention(d, to_double(q), kq, vq, 0.125, mask);
    EXPECT_TRUE(test::all_close(got.data(), want.data(), got.size(), 1e-4 * max_abs(vq)));
  }
}

// The plain cache through the same entry: float32 storage matches float64 attention tightly; float16 / bfloat16
// storage within their rounding (relative 2^-11 / 2^-8 of each value, a convex combination of which is the output).
TEST(Attention, PlainCacheMatchesFloat64) {
  auto rng = test::make_rng(105);
  struct Case {
    DType dt;
    RotationKind rot;
    Dims d;
    double rtol;
  };
  const Case cases[] = {{DType::kF32, RotationKind::kNone, {2, 2, 2, 7, 300, 128, 64}, 0.0},
                        {DType::kF32, RotationKind::kSO4Full, {1, 1, 4, 33, 67, 36, 12}, 0.0},
                        {DType::kF16, RotationKind::kNone, {1, 2, 1, 1, 7, 256, 256}, 1.0 / 2048},
                        {DType::kBF16, RotationKind::kSO4Fast, {2, 1, 2, 7, 67, 64, 128}, 1.0 / 256}};
  for (const Case& cs : cases) {
    const Dims& d = cs.d;
    PlainKVCache cache(PlainKVCacheConfig{cs.dt, cs.rot, rng()});
    const std::vector<float> k = test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dk));
    const std::vector<float> v = test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dv));
    const std::vector<float> q = test::randn(rng, static_cast<size_t>(d.B * d.Hq() * d.L * d.Dk));
    fill_cache(cache, d, k, v);
    MaskSpec mask;
    mask.kind = MaskKind::kCausal;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d.Dk));
    const std::vector<float> got = run_attention(d, q, cache, scale, mask);
    // Exact storage: compare with the stored values (what the kernel sees) and with the original data.
    const std::vector<double> want_stored =
        ref_attention(d, to_double(q), dequantized(cache.keys(), cache.key_rotation()),
                      dequantized(cache.values(), cache.value_rotation()), scale, mask);
    EXPECT_TRUE(test::all_close(got.data(), want_stored.data(), got.size(), 1e-4 * max_abs(to_double(v))))
        << dtype_name(cs.dt);
    const std::vector<double> want = ref_attention(d, to_double(q), to_double(k), to_double(v), scale, mask);
    // Rounding each stored value to rtol (half an ulp, relative) moves every value by <= rtol·max|v| and every score
    // by <= δ = scale·max‖q‖·rtol·max‖k‖, which moves the softmax weights by <= e^{2δ} − 1 in the 1-norm; plus a
    // float32 accumulation margin.
    auto max_row_norm = [](const std::vector<float>& x, int64_t dim) {
      double m = 0.0;
      for (size_t r = 0; r < x.size() / static_cast<size_t>(dim); ++r) {
        double n = 0.0;
        for (int64_t c = 0; c < dim; ++c) n += std::pow(x[r * static_cast<size_t>(dim) + static_cast<size_t>(c)], 2);
        m = std::max(m, std::sqrt(n));
      }
      return m;
    };
    const double delta = scale * max_row_norm(q, d.Dk) * cs.rtol * max_row_norm(k, d.Dk);
    const double vmax = max_abs(to_double(v));
    const double tol = (cs.rtol + std::exp(2.0 * delta) - 1.0) * vmax + 2e-5 * vmax;
    EXPECT_TRUE(test::all_close(got.data(), want.data(), got.size(), tol)) << dtype_name(cs.dt);
  }
}

// Outputs in float16 / bfloat16 are the float32 result rounded once; queries may be half precision and strided.
TEST(Attention, HalfPrecisionQueriesAndOutputs) {
  auto rng = test::make_rng(106);
  Dims d{1, 2, 2, 7, 67, 64, 128};
  QuantizedKVCacheConfig cfg;
  cfg.seed = rng();
  QuantizedKVCache cache(cfg);
  fill_cache(cache, d, test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dk)),
             test::randn(rng, static_cast<size_t>(d.B * d.Hkv * d.kL * d.Dv)));
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(d.B * d.Hq() * d.L * d.Dk));
  MaskSpec causal;
  causal.kind = MaskKind::kCausal;
  const std::vector<float> ref = run_attention(d, q, cache, 0.125f, causal);
  for (DType qt : {DType::kF16, DType::kBF16}) {
    const std::vector<uint8_t> qb = test::to_dtype_bytes(q, qt);
    const std::vector<float> qr = test::from_dtype_bytes(qb.data(), qt, q.size());
    const std::vector<float> want = run_attention(d, qr, cache, 0.125f, causal);  // float32 queries of equal value
    for (DType ot : {DType::kF32, DType::kF16, DType::kBF16}) {
      const size_t n = static_cast<size_t>(d.B * d.Hq() * d.L * d.Dv);
      test::GuardedBuffer out(n * static_cast<size_t>(dtype_size(ot)));
      nn::attention(TensorView(qb.data(), qt, {d.B, d.Hq(), d.L, d.Dk}), cache, 0.125f, causal.view(),
                    TensorView(out.data(), ot, {d.B, d.Hq(), d.L, d.Dv}));
      ASSERT_TRUE(out.canaries_intact());
      const std::vector<float> got = test::from_dtype_bytes(out.data(), ot, n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], round_to(ot, want[i])) << i;
    }
  }
  // Queries given as a transposed view of a [B, L, Hq, Dk] projection.
  std::vector<float> proj(q.size());
  for (int64_t h = 0; h < d.Hq(); ++h)
    for (int64_t i = 0; i < d.L; ++i)
      std::copy_n(&q[static_cast<size_t>((h * d.L + i) * d.Dk)], d.Dk,
                  &proj[static_cast<size_t>((i * d.Hq() + h) * d.Dk)]);
  TensorView qs(proj.data(), DType::kF32, {d.B, d.Hq(), d.L, d.Dk});
  qs.stride = {d.L * d.Hq() * d.Dk, d.Dk, d.Hq() * d.Dk, 1, 0, 0, 0, 0};
  std::vector<float> out(ref.size());
  nn::attention(qs, cache, 0.125f, causal.view(), TensorView(out.data(), DType::kF32, {d.B, d.Hq(), d.L, d.Dv}));
  EXPECT_EQ(out, ref);
}

// Mean over heads of the per-head relative error of attention over a K3/V3 g64 cache with the given rotation.
double outlier_error(const Dims& d, const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, const std::vector<double>& want, float scale, RotationKind rot,
                     uint64_t seed) {
  QuantizedKVCache cache(QuantizedKVCacheConfig{3, 3, 64, rot, seed, DType::kF16});
  fill_cache(cache, d, k, v);
  MaskSpec causal;
  causal.kind = MaskKind::kCausal;
  const std::vector<float> got = run_attention(d, q, cache, scale, causal);
  const size_t n = static_cast<size_t>(d.L * d.Dv);
  double mean = 0.0;
  for (int64_t h = 0; h < d.Hq(); ++h) {
    const auto off = static_cast<std::ptrdiff_t>(static_cast<size_t>(h) * n);
    mean += rel_error(std::vector<float>(got.begin() + off, got.begin() + off + static_cast<std::ptrdiff_t>(n)),
                      std::vector<double>(want.begin() + off, want.begin() + off + static_cast<std::ptrdiff_t>(n))) /
            static_cast<double>(d.Hq());
  }
  return mean;
}

// Keys and values with outlier channels (test::randn_with_outlier_channels), 3-bit codes, group 64.
//
// What we measured (docs/kv_cache.md has the table): an SO(4) block rotation only spreads an outlier over the 4
// channels of its own block, while the step of all 64 values of a group is set by the group's min–max range. For
// moderate outliers (4σ, 2 of 128 channels) so4_full lowers the attention error by about 6% on average (per-draw
// ratio 0.86–1.01 over 30 draws); for large ones (8σ and up) it gives no gain or a loss (ratio 0.95–1.2). So the
// test asserts the gain where it exists — on the mean over 16 independent draws of 16 heads each (over 150 runs of 8
// draws the ratio was 0.94 ± 0.016, never above 0.976; 16 draws put the 0.99 limit about 4 standard deviations
// away) — and prints the large-outlier ratio for the record.
TEST(Attention, So4FullBeatsNoRotationOnModerateOutlierChannels) {
  const Dims d{1, 16, 1, 8, 256, 128, 128};
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.Dk));
  MaskSpec causal;
  causal.kind = MaskKind::kCausal;
  for (const float outlier_scale : {4.0f, 12.0f}) {
    auto rng = test::make_rng(outlier_scale == 4.0f ? 107 : 108);
    const int draws = outlier_scale == 4.0f ? 16 : 2;
    double err_none = 0.0, err_full = 0.0;
    for (int draw = 0; draw < draws; ++draw) {
      const size_t rows = static_cast<size_t>(d.B * d.Hkv * d.kL);
      const std::vector<float> k =
          test::randn_with_outlier_channels(rng, rows, static_cast<size_t>(d.Dk), outlier_scale, 2);
      const std::vector<float> v =
          test::randn_with_outlier_channels(rng, rows, static_cast<size_t>(d.Dv), outlier_scale, 2);
      const std::vector<float> q = test::randn(rng, static_cast<size_t>(d.B * d.Hq() * d.L * d.Dk));
      const std::vector<double> want = ref_attention(d, to_double(q), to_double(k), to_double(v), scale, causal);
      err_none += outlier_error(d, q, k, v, want, scale, RotationKind::kNone, 0) / draws;
      err_full += outlier_error(d, q, k, v, want, scale, RotationKind::kSO4Full, rng()) / draws;
    }
    std::printf(
        "[attention, outliers %.0fσ on 2 of 128 channels, K3/V3 g64] mean relative error: none %.4f, "
        "so4_full %.4f (ratio %.3f)\n",
        static_cast<double>(outlier_scale), err_none, err_full, err_full / err_none);
    RecordProperty(outlier_scale == 4.0f ? "ratio_moderate" : "ratio_large", std::to_string(err_full / err_none));
    if (outlier_scale == 4.0f) {
      EXPECT_LT(err_full, 0.99 * err_none);
    }
  }
}

// ---- rejections: one per rule, each naming the op and the offending value ----

struct Fixture {
  QuantizedKVCache cache;
  std::vector<float> q, out;
  Fixture() {
    auto rng = test::make_rng(200);
    Dims d{1, 2, 1, 1, 7, 64, 64};
    fill_cache(cache, d, test::randn(rng, 2 * 7 * 64), test::randn(rng, 2 * 7 * 64));
    q.resize(2 * 64 * 64);
    out.resize(2 * 64 * 64);
  }
  TensorView qv(std::vector<int64_t> shape, DType dt = DType::kF32) { return TensorView(q.data(), dt, shape); }
  TensorView ov(std::vector<int64_t> shape, DType dt = DType::kF32) { return TensorView(out.data(), dt, shape); }
};

void expect_attention_error(const std::function<void()>& f, ErrorCode code, const std::string& value) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing " << value;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find("[attention]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(value), std::string::npos) << e.what();
  }
}

TEST(Attention, RejectsQueriesOfWrongRank) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({2, 1, 64}), f.cache, 1.0f, {}, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kShapeMismatch, "(2, 1, 64)");
}

TEST(Attention, RejectsNonFloatQueries) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}, DType::kI32), f.cache, 1.0f, {}, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "int32");
}

TEST(Attention, RejectsEmptyCache) {
  Fixture f;
  QuantizedKVCache empty;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), empty, 1.0f, {}, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "got length 0");
}

TEST(Attention, RejectsBatchMismatch) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({2, 2, 1, 64}), f.cache, 1.0f, {}, f.ov({2, 2, 1, 64}));
      },
      ErrorCode::kShapeMismatch, "B = 1; got 2");
}

TEST(Attention, RejectsHeadsNotMultipleOfKVHeads) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 3, 1, 64}), f.cache, 1.0f, {}, f.ov({1, 3, 1, 64}));
      },
      ErrorCode::kShapeMismatch, "KV heads 2; got 3");
}

TEST(Attention, RejectsHeadDimMismatch) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 32}), f.cache, 1.0f, {}, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kShapeMismatch, "Dk = 64; got 32");
}

TEST(Attention, RejectsQueriesLongerThanCache) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 8, 64}), f.cache, 1.0f, {}, f.ov({1, 2, 8, 64}));
      },
      ErrorCode::kOutOfRange, "cache length 7; got 8");
}

TEST(Attention, RejectsNonFiniteScale) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, std::nanf(""), {}, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "scale must be finite; got nan");
}

TEST(Attention, RejectsNegativeOrNonFiniteSoftcap) {
  Fixture f;
  for (float cap : {-1.0f, std::nanf(""), std::numeric_limits<float>::infinity()})
    expect_attention_error(
        [&] {
          nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, {}, f.ov({1, 2, 1, 64}), cap);
        },
        ErrorCode::kInvalidArgument, "softcap must be finite and >= 0 (0 = none); got ");
}

TEST(Attention, RejectsNegativeWindow) {
  Fixture f;
  AttentionMask m{MaskKind::kCausal, -3, {}};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "window must be >= 0; got -3");
}

TEST(Attention, RejectsWindowOnNonCausalMask) {
  Fixture f;
  AttentionMask m{MaskKind::kNone, 4, {}};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "got window 4 with a none mask");
}

TEST(Attention, RejectsMaskTensorForCausal) {
  Fixture f;
  std::vector<uint8_t> mb(7, 1);
  AttentionMask m{MaskKind::kCausal, 0, TensorView(mb.data(), DType::kBool, {1, 7})};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "got one of shape (1, 7)");
}

TEST(Attention, RejectsBoolMaskOfWrongDtype) {
  Fixture f;
  std::vector<float> mb(7, 1.0f);
  AttentionMask m{MaskKind::kBool, 0, TensorView(mb.data(), DType::kF32, {1, 7})};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "mask must have dtype bool; got float32");
}

TEST(Attention, RejectsAdditiveMaskOfWrongDtype) {
  Fixture f;
  std::vector<int32_t> mb(7, 0);
  AttentionMask m{MaskKind::kAdditive, 0, TensorView(mb.data(), DType::kI32, {1, 7})};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "got int32");
}

TEST(Attention, RejectsMaskOfWrongRank) {
  Fixture f;
  std::vector<uint8_t> mb(7, 1);
  AttentionMask m{MaskKind::kBool, 0, TensorView(mb.data(), DType::kBool, {7})};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kShapeMismatch, "mask rank must be 2 to 4; got 1");
}

TEST(Attention, RejectsMaskNotBroadcastable) {
  Fixture f;
  std::vector<uint8_t> mb(3 * 7, 1);
  AttentionMask m{MaskKind::kBool, 0, TensorView(mb.data(), DType::kBool, {3, 1, 7})};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kShapeMismatch, "got (3, 1, 7)");
}

TEST(Attention, RejectsNaNInAdditiveMask) {
  Fixture f;
  std::vector<float> mb(7, 0.0f);
  mb[5] = std::nanf("");
  AttentionMask m{MaskKind::kAdditive, 0, TensorView(mb.data(), DType::kF32, {1, 7})};
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, m, f.ov({1, 2, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "got nan at [0, 0, 0, 5]");
}

TEST(Attention, RejectsOutputOfWrongShape) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, {}, f.ov({1, 2, 1, 32}));
      },
      ErrorCode::kShapeMismatch, "got (1, 2, 1, 32)");
}

TEST(Attention, RejectsNonFloatOutput) {
  Fixture f;
  expect_attention_error(
      [&] {
        nn::attention(f.qv({1, 2, 1, 64}), f.cache, 1.0f, {}, f.ov({1, 2, 1, 64}, DType::kU32));
      },
      ErrorCode::kInvalidArgument, "out must have dtype float32, float16 or bfloat16; got uint32");
}

}  // namespace
}  // namespace cider
