// KV caches: growth in 256-position steps, stored contents, trim, snapshot/restore, nbytes, rejections.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "kernels/kernel_table.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "quant/affine.h"
#include "quant/kv_stats.h"
#include "support/test_support.h"

namespace cider {
namespace {

using kernels::KVTensorView;
using nn::KVCacheSnapshot;
using nn::PlainKVCache;
using nn::PlainKVCacheConfig;
using nn::QuantizedKVCache;
using nn::QuantizedKVCacheConfig;
using nn::Rotation;
using nn::RotationKind;
using nn::KeyLayout;
using nn::KVSpec;
using nn::SO4Rotation;

// A random [B, H, n, D] input in a float dtype; `f` holds the values as stored (rounded to the dtype).
struct Input {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  std::vector<float> f;
  TensorView view() const { return TensorView(bytes.data(), dtype, shape); }
  const float* row(int64_t b, int64_t h, int64_t t) const {
    return f.data() + ((b * shape[1] + h) * shape[2] + t) * shape[3];
  }
};

Input make_input(std::mt19937_64& rng, DType dt, int64_t B, int64_t H, int64_t n, int64_t D, float sigma = 1.0f) {
  Input x{dt, {B, H, n, D}, {}, {}};
  std::vector<float> v = test::randn(rng, static_cast<size_t>(B * H * n * D), sigma);
  x.bytes = test::to_dtype_bytes(v, dt);
  x.f = test::from_dtype_bytes(x.bytes.data(), dt, v.size());
  return x;
}

int64_t esize(DType t) { return dtype_size(t); }

// Bytes of position t of (b, h) in a view: codes then scales then biases (quantized) or the values (plain).
std::vector<uint8_t> row_bytes(const KVTensorView& v, int64_t b, int64_t h, int64_t t) {
  const int64_t r = (b * v.H + h) * v.capacity + t;
  std::vector<uint8_t> out;
  auto append = [&](const void* base, int64_t nbytes) {
    const uint8_t* p = static_cast<const uint8_t*>(base) + r * nbytes;
    out.insert(out.end(), p, p + nbytes);
  };
  if (v.bits == 0) {
    append(v.data, v.dim * esize(v.dtype));
  } else {
    append(v.data, quant::packed_words(v.dim, v.bits) * 4);
    append(v.scales, v.dim / v.group_size * esize(v.scale_dtype));
    append(v.biases, v.dim / v.group_size * esize(v.scale_dtype));
  }
  return out;
}

// All valid positions [0, length) of a view, concatenated.
std::vector<uint8_t> valid_bytes(const KVTensorView& v) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < v.B; ++b)
    for (int64_t h = 0; h < v.H; ++h)
      for (int64_t t = 0; t < v.length; ++t) {
        std::vector<uint8_t> r = row_bytes(v, b, h, t);
        out.insert(out.end(), r.begin(), r.end());
      }
  return out;
}

// What a quantized cache must store for one input row: affine_quantize_row of the rotated float32 row.
std::vector<uint8_t> expected_quantized_row(const float* x, int64_t D, const SO4Rotation& rot, int bits, int gs,
                                            DType sd) {
  std::vector<float> r(x, x + D);
  rot.apply(r.data(), 1);
  std::vector<uint32_t> words(static_cast<size_t>(quant::packed_words(D, bits)));
  std::vector<uint8_t> scales(static_cast<size_t>(D / gs * esize(sd))), biases(scales.size());
  quant::affine_quantize_row(r.data(), D, gs, bits, words.data(), scales.data(), biases.data(), sd);
  std::vector<uint8_t> out(words.size() * 4);
  std::memcpy(out.data(), words.data(), out.size());
  out.insert(out.end(), scales.begin(), scales.end());
  out.insert(out.end(), biases.begin(), biases.end());
  return out;
}

std::vector<uint8_t> expected_plain_row(const float* x, int64_t D, const SO4Rotation& rot, DType dt) {
  std::vector<float> r(x, x + D);
  rot.apply(r.data(), 1);
  return test::to_dtype_bytes(r, dt);
}

// Checks positions [t0, t0 + n) of a quantized cache hold the quantized rotated rows of `keys` / `values`.
void expect_quantized_rows(const QuantizedKVCache& c, const Input& keys, const Input& values, int64_t t0) {
  const QuantizedKVCacheConfig& cfg = c.config();
  const SO4Rotation krot(keys.shape[3], cfg.rotation, cfg.seed), vrot(values.shape[3], cfg.rotation, cfg.seed);
  const KVTensorView kv = c.keys(), vv = c.values();
  for (int64_t b = 0; b < keys.shape[0]; ++b)
    for (int64_t h = 0; h < keys.shape[1]; ++h)
      for (int64_t i = 0; i < keys.shape[2]; ++i) {
        ASSERT_EQ(row_bytes(kv, b, h, t0 + i), expected_quantized_row(keys.row(b, h, i), keys.shape[3], krot,
                                                                      cfg.k_bits, cfg.group_size, cfg.scale_dtype))
            << "key b " << b << " h " << h << " t " << t0 + i;
        ASSERT_EQ(row_bytes(vv, b, h, t0 + i), expected_quantized_row(values.row(b, h, i), values.shape[3], vrot,
                                                                      cfg.v_bits, cfg.group_size, cfg.scale_dtype))
            << "value b " << b << " h " << h << " t " << t0 + i;
      }
}

// Bytes of storage a quantized cache must hold, from the layout in docs/kv_cache.md.
int64_t quantized_nbytes(int64_t B, int64_t H, int64_t cap, int64_t Dk, int64_t Dv, int kb, int vb, int gs, DType sd) {
  const int64_t per_pos = Dk * kb / 8 + 2 * (Dk / gs) * esize(sd) + Dv * vb / 8 + 2 * (Dv / gs) * esize(sd);
  return B * H * cap * per_pos;
}

void expect_error(const std::function<void()>& f, ErrorCode code, const std::string& op, const std::string& value) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing " << op << " and " << value;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find("[" + op + "]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(value), std::string::npos) << e.what();
  }
}

TEST(KVCache, NewCacheIsEmpty) {
  QuantizedKVCache c;
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(c.offset(), 0);
  EXPECT_EQ(c.capacity(), 0);
  EXPECT_EQ(c.nbytes(), 0);
  EXPECT_EQ(c.keys().length, 0);
  EXPECT_EQ(c.config().k_bits, 8);  // the default K8/V4, g64, Hadamard (docs/quality.md)
  EXPECT_EQ(c.config().v_bits, 4);
  EXPECT_EQ(c.config().group_size, 64);
  EXPECT_EQ(c.config().rotation, RotationKind::kHadamard);
  EXPECT_EQ(c.config().scale_dtype, DType::kF16);
}

// Appends 1, 255, 1, 300, 0, 211: capacity 256, 256, 512, 768, 768, 768; every earlier position keeps its exact
// codes, scales and biases across each reallocation; each new position holds the quantized rotated input.
TEST(KVCache, GrowsInStepsOf256AndKeepsContents) {
  auto rng = test::make_rng(10);
  const int64_t B = 2, H = 3, Dk = 64, Dv = 128;
  QuantizedKVCacheConfig cfg;
  cfg.seed = rng();
  QuantizedKVCache c(cfg);
  const int64_t appends[] = {1, 255, 1, 300, 0, 211};
  const int64_t caps[] = {256, 256, 512, 768, 768, 768};
  int64_t offset = 0;
  for (size_t s = 0; s < std::size(appends); ++s) {
    const std::vector<uint8_t> before_k = valid_bytes(c.keys()), before_v = valid_bytes(c.values());
    const KVTensorView old_view = c.keys();
    Input k = make_input(rng, DType::kF32, B, H, appends[s], Dk),
          v = make_input(rng, DType::kF32, B, H, appends[s], Dv);
    auto [kv, vv] = c.update_and_fetch(k.view(), v.view());
    offset += appends[s];
    ASSERT_EQ(c.offset(), offset);
    ASSERT_EQ(c.capacity(), caps[s]) << "after append " << s;
    ASSERT_EQ(kv.length, offset);
    ASSERT_EQ(vv.length, offset);
    ASSERT_EQ(kv.capacity, caps[s]);
    EXPECT_FALSE(c.empty());
    if (s > 0 && caps[s] == caps[s - 1]) {
      EXPECT_EQ(kv.data, old_view.data) << "an append that fits must not reallocate";
    }
    // The old positions are unchanged.
    KVTensorView kcut = kv, vcut = vv;
    kcut.length = vcut.length = offset - appends[s];
    EXPECT_EQ(valid_bytes(kcut), before_k) << "append " << s;
    EXPECT_EQ(valid_bytes(vcut), before_v) << "append " << s;
    expect_quantized_rows(c, k, v, offset - appends[s]);
    EXPECT_EQ(c.nbytes(), quantized_nbytes(B, H, caps[s], Dk, Dv, 8, 4, 64, DType::kF16));  // the default config
  }
}

// One appended chunk larger than a step: capacity rounds the total up (1 + 600 = 601 -> 768).
TEST(KVCache, LargeAppendRoundsCapacityUp) {
  auto rng = test::make_rng(11);
  QuantizedKVCache c;
  Input k1 = make_input(rng, DType::kF32, 1, 1, 1, 64), v1 = make_input(rng, DType::kF32, 1, 1, 1, 64);
  c.update_and_fetch(k1.view(), v1.view());
  Input k = make_input(rng, DType::kF32, 1, 1, 600, 64), v = make_input(rng, DType::kF32, 1, 1, 600, 64);
  c.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(c.capacity(), 768);
  EXPECT_EQ(c.offset(), 601);
  expect_quantized_rows(c, k1, v1, 0);
  expect_quantized_rows(c, k, v, 1);
}

// Stored codes equal affine_quantize_row of the rotated input, for every input dtype mix, rotation kind, bit width,
// group size and scale dtype.
TEST(KVCache, StoresQuantizedRotatedRows) {
  auto rng = test::make_rng(12);
  struct Case {
    DType kd, vd;
    int kb, vb, gs;
    RotationKind rot;
    DType sd;
    int64_t Dk, Dv;
  };
  const Case cases[] = {
      {DType::kF32, DType::kF32, 4, 3, 64, RotationKind::kSO4Full, DType::kF16, 128, 128},
      {DType::kF16, DType::kBF16, 4, 3, 64, RotationKind::kSO4Fast, DType::kF16, 64, 256},
      {DType::kBF16, DType::kF16, 8, 2, 32, RotationKind::kNone, DType::kBF16, 96, 32},
      {DType::kF16, DType::kF32, 5, 6, 128, RotationKind::kSO4Full, DType::kF32, 256, 128},
      {DType::kBF16, DType::kBF16, 3, 4, 32, RotationKind::kSO4Full, DType::kF16, 160, 64},
      {DType::kBF16, DType::kF16, 4, 3, 64, RotationKind::kHadamard, DType::kF16, 256, 256},
      {DType::kF32, DType::kBF16, 8, 4, 32, RotationKind::kHadamard, DType::kBF16, 64, 128},
      {DType::kF16, DType::kF32, 2, 8, 128, RotationKind::kHadamard, DType::kF32, 128, 512},
      {DType::kF32, DType::kF16, 4, 4, 32, RotationKind::kHadamard, DType::kF16, 96, 160},  // blocks of 32
  };
  for (const Case& cs : cases) {
    QuantizedKVCacheConfig cfg{cs.kb, cs.vb, cs.gs, cs.rot, rng(), cs.sd};
    QuantizedKVCache c(cfg);
    Input k = make_input(rng, cs.kd, 2, 2, 7, cs.Dk, 2.0f), v = make_input(rng, cs.vd, 2, 2, 7, cs.Dv, 0.5f);
    auto [kv, vv] = c.update_and_fetch(k.view(), v.view());
    EXPECT_EQ(kv.bits, cs.kb);
    EXPECT_EQ(vv.bits, cs.vb);
    EXPECT_EQ(kv.dim, cs.Dk);
    EXPECT_EQ(vv.dim, cs.Dv);
    EXPECT_EQ(kv.dtype, DType::kU32);
    EXPECT_EQ(kv.scale_dtype, cs.sd);
    EXPECT_EQ(kv.group_size, cs.gs);
    EXPECT_EQ(c.key_rotation(), SO4Rotation(cs.Dk, cs.rot, cfg.seed));
    EXPECT_EQ(c.value_rotation(), SO4Rotation(cs.Dv, cs.rot, cfg.seed));
    expect_quantized_rows(c, k, v, 0);
    // Sanity of the orientation: dequantizing the stored row and rotating back gives the input within the
    // quantization step (|error| <= scale/2 per value, plus scale-dtype rounding), so nothing is transposed.
    std::vector<float> deq(static_cast<size_t>(cs.Dk));
    double max_step = 0.0;
    for (int64_t d = 0; d < cs.Dk; ++d) {
      const float s = load_float(kv.scales, cs.sd, d / cs.gs), bias = load_float(kv.biases, cs.sd, d / cs.gs);
      deq[static_cast<size_t>(d)] =
          static_cast<float>(quant::unpack_code(static_cast<const uint32_t*>(kv.data), d, cs.kb)) * s + bias;
      max_step = std::max(max_step, std::fabs(static_cast<double>(s)));
    }
    c.key_rotation().apply_inverse(deq.data(), 1);
    double err2 = 0.0;
    for (int64_t d = 0; d < cs.Dk; ++d) err2 += std::pow(deq[static_cast<size_t>(d)] - k.row(0, 0, 0)[d], 2);
    // Rotation preserves the error norm: ‖err‖ ≤ sqrt(Dk)·(step/2 + rounding of the bias).
    EXPECT_LE(std::sqrt(err2), std::sqrt(static_cast<double>(cs.Dk)) * (0.5 * max_step + 0.02)) << cs.Dk;
  }
}

// Symmetric values (QuantizedKVCacheConfig::v_symmetric): each value row is symmetric_quantize_row of the rotated row
// (codes and one step per group, no biases: the view says symmetric and has none), keys as before; nbytes drops the
// value biases exactly (and equals kv_cache_bytes); the format's name and bits say so; a snapshot carries it, with an
// empty bias plane, and a restored cache continues byte for byte; with per-channel keys and outlier channels too.
TEST(KVCache, SymmetricValuesStoreStepsWithoutBiases) {
  auto rng = test::make_rng(16);
  for (const bool channel : {false, true}) {
    QuantizedKVCacheConfig cfg{4, 4, 64, RotationKind::kHadamard, rng(), DType::kF16};
    cfg.v_symmetric = true;
    if (channel) {
      cfg.key_layout = nn::KeyLayout::kChannel;
      cfg.key_outliers = 2;
    }
    const int64_t B = 2, H = 2, n = 70, Dk = 128, Dv = 64;
    QuantizedKVCache c(cfg);
    const Input k = make_input(rng, DType::kF32, B, H, n, Dk), v = make_input(rng, DType::kBF16, B, H, n, Dv, 0.5f);
    c.update_and_fetch(k.view(), v.view());
    const KVTensorView vv = c.values();
    EXPECT_TRUE(vv.symmetric);
    EXPECT_EQ(vv.biases, nullptr);
    EXPECT_FALSE(c.keys().symmetric);
    const SO4Rotation vrot(Dv, cfg.rotation, cfg.seed);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < n; ++t) {
          std::vector<float> r(v.row(b, h, t), v.row(b, h, t) + Dv);
          vrot.apply(r.data(), 1);
          std::vector<uint32_t> words(static_cast<size_t>(quant::packed_words(Dv, 4)));
          std::vector<uint8_t> steps(static_cast<size_t>(Dv / 64 * 2));
          quant::symmetric_quantize_row(r.data(), Dv, 64, 4, words.data(), steps.data(), DType::kF16);
          const int64_t row = (b * H + h) * vv.capacity + t;
          ASSERT_EQ(0, std::memcmp(static_cast<const uint32_t*>(vv.data) + row * quant::packed_words(Dv, 4),
                                   words.data(), words.size() * 4)) << "codes b " << b << " h " << h << " t " << t;
          ASSERT_EQ(0, std::memcmp(static_cast<const uint8_t*>(vv.scales) + row * steps.size(), steps.data(),
                                   steps.size())) << "steps b " << b << " h " << h << " t " << t;
          // Dequantized through the implied bias: within half a step of the rotated row, or one step where the code
          // is clamped at the top (a value near −edge: the codes reach 2^(bits−1) − 1 steps above 0, edge itself −8).
          const float d = load_float(vv.scales, DType::kF16, row);
          for (int64_t i = 0; i < Dv; ++i) {
            const uint32_t code = quant::unpack_code(words.data(), i, 4);
            const float x = static_cast<float>(code) * d + quant::symmetric_bias(d, 4);
            const float bound = (code == 15 ? 1.0f : 0.5f) * std::fabs(d) * 1.01f + 1e-6f;
            ASSERT_LE(std::fabs(x - r[static_cast<size_t>(i)]), bound) << i << " code " << code;
          }
        }
    nn::KVSpec spec = cfg.spec();
    EXPECT_NE(spec.name().find("/vsym"), std::string::npos) << spec.name();
    QuantizedKVCacheConfig affine = cfg;
    affine.v_symmetric = false;
    QuantizedKVCache a(affine);
    a.update_and_fetch(k.view(), v.view());
    EXPECT_EQ(a.nbytes() - c.nbytes(), B * H * c.capacity() * (Dv / 64) * 2);
    EXPECT_EQ(c.nbytes(), nn::kv_cache_bytes(spec, B, H, Dk, Dv, n));
    EXPECT_DOUBLE_EQ(affine.spec().bits_per_value(Dk) - spec.bits_per_value(Dk), 0.125);
    const nn::KVCacheSnapshot snap = c.snapshot();
    EXPECT_TRUE(snap.meta().v_symmetric);
    EXPECT_EQ(snap.plane(5).nbytes(), 0u);
    EXPECT_TRUE(snap.values().symmetric);
    QuantizedKVCache r(QuantizedKVCacheConfig{});
    r.restore(snap);
    EXPECT_TRUE(r.config().v_symmetric);
    const Input k2 = make_input(rng, DType::kF32, B, H, 9, Dk), v2 = make_input(rng, DType::kF32, B, H, 9, Dv);
    c.update_and_fetch(k2.view(), v2.view());
    r.update_and_fetch(k2.view(), v2.view());
    // Past a 256-position step (the storage grows, copying the empty bias rows too), then a prefix copy and a trim.
    const Input k3 = make_input(rng, DType::kF32, B, H, 300, Dk), v3 = make_input(rng, DType::kF32, B, H, 300, Dv);
    c.update_and_fetch(k3.view(), v3.view());
    r.update_and_fetch(k3.view(), v3.view());
    const std::unique_ptr<nn::KVCache> prefix = c.copy_prefix(200);
    c.trim(c.offset() - 200);
    r.trim(r.offset() - 200);
    const nn::KVCacheSnapshot sc = c.snapshot(), sr = r.snapshot(), sp = prefix->snapshot();
    ASSERT_EQ(sc.num_planes(), sr.num_planes());
    for (size_t p = 0; p < sc.num_planes(); ++p) {
      ASSERT_EQ(sc.plane(p).nbytes(), sr.plane(p).nbytes()) << "plane " << p;
      ASSERT_EQ(sc.plane(p).nbytes(), sp.plane(p).nbytes()) << "plane " << p;
      if (sc.plane(p).nbytes() == 0) continue;  // the value biases: no buffer to compare
      ASSERT_EQ(0, std::memcmp(sc.plane(p).data(), sr.plane(p).data(), sc.plane(p).nbytes())) << "plane " << p;
      ASSERT_EQ(0, std::memcmp(sc.plane(p).data(), sp.plane(p).data(), sc.plane(p).nbytes())) << "prefix plane " << p;
    }
  }
  // A sliding-window cache with symmetric values drops positions in bulk (the empty bias plane included).
  QuantizedKVCacheConfig wcfg{4, 4, 64, RotationKind::kHadamard, rng(), DType::kF16};
  wcfg.v_symmetric = true;
  wcfg.window = 100;
  QuantizedKVCache w(wcfg);
  for (int i = 0; i < 6; ++i) {
    const Input kw = make_input(rng, DType::kF32, 1, 2, 200, 64), vw = make_input(rng, DType::kF32, 1, 2, 200, 64);
    w.update_and_fetch(kw.view(), vw.view());
  }
  EXPECT_GT(w.start(), 0);
  EXPECT_TRUE(w.values().symmetric);
  nn::KVSpec plain = nn::parse_kv_spec("bf16");
  plain.v_symmetric = true;
  expect_error([&] { plain.validate("test"); }, ErrorCode::kInvalidArgument, "test", "symmetric values");
  EXPECT_TRUE(nn::parse_value_codes("symmetric"));
  EXPECT_FALSE(nn::parse_value_codes("affine"));
  expect_error([] { nn::parse_value_codes("sym"); }, ErrorCode::kInvalidArgument, "parse_kv_values", "sym");
}

// Keys and values given as transposed views of [B, n, H, D] projections (non-contiguous strides).
TEST(KVCache, AcceptsStridedInputs) {
  auto rng = test::make_rng(13);
  const int64_t B = 2, H = 4, n = 5, D = 64;
  std::vector<float> proj = test::randn(rng, static_cast<size_t>(B * n * H * D));
  TensorView strided(proj.data(), DType::kF32, {B, H, n, D});
  strided.stride = {n * H * D, D, H * D, 1, 0, 0, 0, 0};
  Input contiguous{DType::kF32, {B, H, n, D}, {}, {}};
  contiguous.f.resize(proj.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t d = 0; d < D; ++d)
          contiguous.f[static_cast<size_t>(((b * H + h) * n + t) * D + d)] =
              proj[static_cast<size_t>(((b * n + t) * H + h) * D + d)];
  QuantizedKVCache c;
  c.update_and_fetch(strided, strided);
  expect_quantized_rows(c, contiguous, contiguous, 0);
}

TEST(KVCache, TrimThenAppendOverwrites) {
  auto rng = test::make_rng(14);
  QuantizedKVCacheConfig cfg;
  cfg.seed = rng();
  QuantizedKVCache c(cfg);
  Input k = make_input(rng, DType::kF16, 1, 2, 10, 64), v = make_input(rng, DType::kF16, 1, 2, 10, 64);
  c.update_and_fetch(k.view(), v.view());
  KVTensorView kept = c.keys();
  kept.length = 7;
  const std::vector<uint8_t> first7 = valid_bytes(kept);
  EXPECT_EQ(c.trim(3), 3);
  EXPECT_EQ(c.offset(), 7);
  EXPECT_EQ(c.keys().length, 7);
  EXPECT_EQ(c.capacity(), 256);
  Input k2 = make_input(rng, DType::kF16, 1, 2, 5, 64), v2 = make_input(rng, DType::kF16, 1, 2, 5, 64);
  auto [kv, vv] = c.update_and_fetch(k2.view(), v2.view());
  EXPECT_EQ(kv.length, 12);
  kept = kv;
  kept.length = 7;
  EXPECT_EQ(valid_bytes(kept), first7);
  expect_quantized_rows(c, k2, v2, 7);
}

TEST(KVCache, TrimMoreThanOffsetRemovesAll) {
  auto rng = test::make_rng(15);
  QuantizedKVCache c;
  EXPECT_EQ(c.trim(5), 0);  // nothing to trim yet
  Input k = make_input(rng, DType::kF32, 1, 1, 7, 64), v = make_input(rng, DType::kF32, 1, 1, 7, 64);
  c.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(c.trim(0), 0);
  EXPECT_EQ(c.trim(100), 7);
  EXPECT_EQ(c.offset(), 0);
  EXPECT_FALSE(c.empty());  // the dims stay fixed
  EXPECT_EQ(c.capacity(), 256);
  Input k2 = make_input(rng, DType::kF32, 1, 1, 3, 64), v2 = make_input(rng, DType::kF32, 1, 1, 3, 64);
  c.update_and_fetch(k2.view(), v2.view());
  EXPECT_EQ(c.offset(), 3);
  expect_quantized_rows(c, k2, v2, 0);
}

// A snapshot is unaffected by later trims, overwrites and growth; restoring it (into a differently configured cache)
// takes its configuration and contents, and appending afterwards works.
TEST(KVCache, SnapshotIsImmutableAndRestores) {
  auto rng = test::make_rng(16);
  QuantizedKVCacheConfig cfg{4, 2, 32, RotationKind::kSO4Fast, rng(), DType::kBF16};
  QuantizedKVCache c(cfg);
  const int64_t B = 1, H = 2, Dk = 64, Dv = 96;
  Input k = make_input(rng, DType::kBF16, B, H, 300, Dk), v = make_input(rng, DType::kF32, B, H, 300, Dv);
  c.update_and_fetch(k.view(), v.view());
  const KVCacheSnapshot snap = c.snapshot();
  const KVCacheSnapshot copy = snap;  // copies share the data
  const std::vector<uint8_t> snap_k = valid_bytes(snap.keys()), snap_v = valid_bytes(snap.values());
  EXPECT_EQ(snap_k, valid_bytes(c.keys()));
  EXPECT_EQ(snap_v, valid_bytes(c.values()));
  EXPECT_EQ(snap.length(), 300);
  EXPECT_EQ(snap.meta().k_bits, 4);
  EXPECT_EQ(snap.meta().v_bits, 2);
  EXPECT_EQ(snap.meta().group_size, 32);
  EXPECT_EQ(snap.meta().rotation, RotationKind::kSO4Fast);
  EXPECT_EQ(snap.meta().seed, cfg.seed);
  EXPECT_EQ(snap.meta().scale_dtype, DType::kBF16);
  EXPECT_EQ(snap.meta().Dk, Dk);
  EXPECT_EQ(snap.meta().Dv, Dv);
  EXPECT_EQ(snap.nbytes(), quantized_nbytes(B, H, 300, Dk, Dv, 4, 2, 32, DType::kBF16));

  // Trim, overwrite positions 250..349, then grow past 512.
  c.trim(50);
  Input k2 = make_input(rng, DType::kF32, B, H, 100, Dk), v2 = make_input(rng, DType::kF32, B, H, 100, Dv);
  c.update_and_fetch(k2.view(), v2.view());
  Input k3 = make_input(rng, DType::kF32, B, H, 400, Dk), v3 = make_input(rng, DType::kF32, B, H, 400, Dv);
  c.update_and_fetch(k3.view(), v3.view());
  EXPECT_EQ(c.capacity(), 768);
  EXPECT_EQ(valid_bytes(snap.keys()), snap_k);
  EXPECT_EQ(valid_bytes(snap.values()), snap_v);
  EXPECT_EQ(valid_bytes(copy.keys()), snap_k);
  EXPECT_EQ(snap.length(), 300);

  // Restore into a cache with another configuration: it takes the snapshot's.
  QuantizedKVCache other(QuantizedKVCacheConfig{8, 8, 128, RotationKind::kNone, 0, DType::kF32});
  other.restore(snap);
  EXPECT_EQ(other.offset(), 300);
  EXPECT_EQ(other.capacity(), 512);
  EXPECT_EQ(other.config().k_bits, 4);
  EXPECT_EQ(other.config().v_bits, 2);
  EXPECT_EQ(other.config().group_size, 32);
  EXPECT_EQ(other.config().rotation, RotationKind::kSO4Fast);
  EXPECT_EQ(other.config().seed, cfg.seed);
  EXPECT_EQ(other.config().scale_dtype, DType::kBF16);
  EXPECT_EQ(other.key_rotation(), c.key_rotation());
  EXPECT_EQ(valid_bytes(other.keys()), snap_k);
  EXPECT_EQ(valid_bytes(other.values()), snap_v);
  Input k4 = make_input(rng, DType::kF16, B, H, 220, Dk), v4 = make_input(rng, DType::kF16, B, H, 220, Dv);
  other.update_and_fetch(k4.view(), v4.view());
  EXPECT_EQ(other.offset(), 520);
  EXPECT_EQ(other.capacity(), 768);
  expect_quantized_rows(other, k, v, 0);
  expect_quantized_rows(other, k4, v4, 300);
  EXPECT_EQ(valid_bytes(snap.keys()), snap_k);  // writes into the restored cache do not reach the snapshot

  // Restoring into the original cache rolls it back.
  c.restore(snap);
  EXPECT_EQ(c.offset(), 300);
  EXPECT_EQ(valid_bytes(c.keys()), snap_k);
  EXPECT_EQ(valid_bytes(c.values()), snap_v);
}

TEST(KVCache, SnapshotOfEmptyCacheRestoresEmpty) {
  auto rng = test::make_rng(17);
  QuantizedKVCache fresh;
  const KVCacheSnapshot snap = fresh.snapshot();
  EXPECT_FALSE(snap.meta().has_dims);
  EXPECT_EQ(snap.nbytes(), 0);
  QuantizedKVCache c;
  Input k = make_input(rng, DType::kF32, 1, 1, 3, 64), v = make_input(rng, DType::kF32, 1, 1, 3, 64);
  c.update_and_fetch(k.view(), v.view());
  c.restore(snap);
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(c.offset(), 0);
  EXPECT_EQ(c.nbytes(), 0);
  // New dims are accepted after restoring an empty snapshot.
  Input k2 = make_input(rng, DType::kF32, 2, 1, 3, 128), v2 = make_input(rng, DType::kF32, 2, 1, 3, 64);
  c.update_and_fetch(k2.view(), v2.view());
  expect_quantized_rows(c, k2, v2, 0);
}

// nbytes = all allocated storage, from the documented layout: e.g. the default K8/V4, group 64, float16 scales,
// D 128 is (128 + 8) + (64 + 8) = 208 bytes per position per KV head.
TEST(KVCache, NbytesMatchesLayout) {
  auto rng = test::make_rng(18);
  {
    QuantizedKVCache c;
    Input k = make_input(rng, DType::kF16, 1, 8, 1, 128), v = make_input(rng, DType::kF16, 1, 8, 1, 128);
    c.update_and_fetch(k.view(), v.view());
    EXPECT_EQ(c.nbytes(), 8 * 256 * 208);
  }
  struct Case {
    int kb, vb, gs;
    DType sd;
    int64_t B, H, n, Dk, Dv;
  };
  const Case cases[] = {{4, 3, 64, DType::kF16, 2, 3, 257, 128, 64},
                        {8, 2, 32, DType::kF32, 1, 1, 5, 32, 96},
                        {6, 5, 128, DType::kBF16, 1, 2, 700, 256, 128}};
  for (const Case& cs : cases) {
    QuantizedKVCache c(QuantizedKVCacheConfig{cs.kb, cs.vb, cs.gs, RotationKind::kSO4Full, 1, cs.sd});
    Input k = make_input(rng, DType::kF32, cs.B, cs.H, cs.n, cs.Dk),
          v = make_input(rng, DType::kF32, cs.B, cs.H, cs.n, cs.Dv);
    c.update_and_fetch(k.view(), v.view());
    const int64_t cap = (cs.n + 255) / 256 * 256;
    EXPECT_EQ(c.capacity(), cap);
    EXPECT_EQ(c.nbytes(), quantized_nbytes(cs.B, cs.H, cap, cs.Dk, cs.Dv, cs.kb, cs.vb, cs.gs, cs.sd));
    c.trim(3);  // trimming frees nothing
    EXPECT_EQ(c.nbytes(), quantized_nbytes(cs.B, cs.H, cap, cs.Dk, cs.Dv, cs.kb, cs.vb, cs.gs, cs.sd));
  }
  for (DType dt : {DType::kF16, DType::kBF16, DType::kF32}) {
    PlainKVCache p(PlainKVCacheConfig{dt, RotationKind::kNone, 0});
    Input k = make_input(rng, DType::kF32, 2, 2, 300, 64), v = make_input(rng, DType::kF32, 2, 2, 300, 32);
    p.update_and_fetch(k.view(), v.view());
    EXPECT_EQ(p.nbytes(), 2 * 2 * 512 * (64 + 32) * dtype_size(dt));
  }
}

TEST(KVCache, PlainCacheStoresRoundedRotatedRows) {
  auto rng = test::make_rng(19);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (RotationKind rot : {RotationKind::kNone, RotationKind::kSO4Full}) {
      const uint64_t seed = rng();
      PlainKVCache c(PlainKVCacheConfig{dt, rot, seed});
      EXPECT_FALSE(c.is_quantized());
      Input k = make_input(rng, DType::kBF16, 2, 2, 9, 36), v = make_input(rng, DType::kF32, 2, 2, 9, 20);
      Input k2 = make_input(rng, DType::kF16, 2, 2, 250, 36), v2 = make_input(rng, DType::kF16, 2, 2, 250, 20);
      c.update_and_fetch(k.view(), v.view());
      auto [kv, vv] = c.update_and_fetch(k2.view(), v2.view());
      EXPECT_EQ(kv.bits, 0);
      EXPECT_EQ(kv.dtype, dt);
      EXPECT_EQ(c.capacity(), 512);
      const SO4Rotation krot(36, rot, seed), vrot(20, rot, seed);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t t = 0; t < 9; ++t) {
            ASSERT_EQ(row_bytes(kv, b, h, t), expected_plain_row(k.row(b, h, t), 36, krot, dt));
            ASSERT_EQ(row_bytes(vv, b, h, t), expected_plain_row(v.row(b, h, t), 20, vrot, dt));
          }
          for (int64_t t = 0; t < 250; ++t) {
            ASSERT_EQ(row_bytes(kv, b, h, 9 + t), expected_plain_row(k2.row(b, h, t), 36, krot, dt));
            ASSERT_EQ(row_bytes(vv, b, h, 9 + t), expected_plain_row(v2.row(b, h, t), 20, vrot, dt));
          }
        }
      if (dt == DType::kF32 && rot == RotationKind::kNone) {
        // float32 without rotation stores the input exactly.
        EXPECT_EQ(load_float(kv.data, dt, 5), k.f[5]);
      }
      // Snapshot / restore through the same interface.
      const KVCacheSnapshot snap = c.snapshot();
      c.trim(100);
      PlainKVCache other;
      other.restore(snap);
      EXPECT_EQ(other.config().dtype, dt);
      EXPECT_EQ(other.offset(), 259);
      EXPECT_EQ(valid_bytes(other.keys()), valid_bytes(snap.keys()));
      EXPECT_EQ(valid_bytes(other.values()), valid_bytes(snap.values()));
    }
}

// The Hadamard rotation through snapshot / restore: the restored cache takes the kind and the seed from the
// snapshot, so rows appended after the restore are rotated with the same signs as the ones before; a plain cache
// stores the rotated rows rounded.
TEST(KVCache, HadamardSurvivesSnapshotAndRestore) {
  auto rng = test::make_rng(31);
  QuantizedKVCacheConfig cfg{8, 4, 64, RotationKind::kHadamard, rng(), DType::kF16};
  QuantizedKVCache c(cfg);
  const int64_t B = 1, H = 2, Dk = 256, Dv = 128;
  Input k = make_input(rng, DType::kBF16, B, H, 40, Dk, 3.0f), v = make_input(rng, DType::kF32, B, H, 40, Dv);
  c.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(c.key_rotation().kind(), RotationKind::kHadamard);
  EXPECT_EQ(c.key_rotation().signs(), Rotation(Dk, RotationKind::kHadamard, cfg.seed).signs());
  const KVCacheSnapshot snap = c.snapshot();
  EXPECT_EQ(snap.meta().rotation, RotationKind::kHadamard);
  EXPECT_EQ(snap.meta().seed, cfg.seed);

  QuantizedKVCache other(QuantizedKVCacheConfig{4, 3, 32, RotationKind::kSO4Full, cfg.seed + 1, DType::kBF16});
  other.restore(snap);
  EXPECT_EQ(other.config().rotation, RotationKind::kHadamard);
  EXPECT_EQ(other.config().seed, cfg.seed);
  EXPECT_EQ(other.key_rotation(), c.key_rotation());
  EXPECT_EQ(other.value_rotation(), c.value_rotation());
  EXPECT_EQ(other.key_rotation().signs(), c.key_rotation().signs());
  EXPECT_EQ(valid_bytes(other.keys()), valid_bytes(snap.keys()));
  Input k2 = make_input(rng, DType::kF16, B, H, 9, Dk), v2 = make_input(rng, DType::kF16, B, H, 9, Dv);
  other.update_and_fetch(k2.view(), v2.view());
  expect_quantized_rows(other, k, v, 0);
  expect_quantized_rows(other, k2, v2, 40);

  for (DType dt : {DType::kF32, DType::kBF16}) {
    PlainKVCache p(PlainKVCacheConfig{dt, RotationKind::kHadamard, 5});
    p.update_and_fetch(k.view(), v.view());
    const Rotation krot(Dk, RotationKind::kHadamard, 5), vrot(Dv, RotationKind::kHadamard, 5);
    for (int64_t t = 0; t < 40; ++t) {
      ASSERT_EQ(row_bytes(p.keys(), 0, 1, t), expected_plain_row(k.row(0, 1, t), Dk, krot, dt)) << t;
      ASSERT_EQ(row_bytes(p.values(), 0, 1, t), expected_plain_row(v.row(0, 1, t), Dv, vrot, dt)) << t;
    }
    PlainKVCache restored;
    restored.restore(p.snapshot());
    EXPECT_EQ(restored.config().rotation, RotationKind::kHadamard);
    EXPECT_EQ(restored.key_rotation(), krot);
  }
}

// ---- rejections: one per rule, each naming the op and the offending value ----

TEST(KVCache, RejectsBadKBits) {
  expect_error(
      [] {
        QuantizedKVCache c(QuantizedKVCacheConfig{7, 3, 64, RotationKind::kSO4Full, 0, DType::kF16});
      },
      ErrorCode::kInvalidArgument, "quantized_kv_cache", "k_bits must be one of 2, 3, 4, 5, 6, 8; got 7");
}

TEST(KVCache, RejectsBadVBits) {
  expect_error(
      [] {
        QuantizedKVCache c(QuantizedKVCacheConfig{4, 1, 64, RotationKind::kSO4Full, 0, DType::kF16});
      },
      ErrorCode::kInvalidArgument, "quantized_kv_cache", "v_bits must be one of 2, 3, 4, 5, 6, 8; got 1");
}

TEST(KVCache, RejectsBadGroupSize) {
  expect_error(
      [] {
        QuantizedKVCache c(QuantizedKVCacheConfig{4, 3, 48, RotationKind::kSO4Full, 0, DType::kF16});
      },
      ErrorCode::kInvalidArgument, "quantized_kv_cache", "got 48");
}

TEST(KVCache, RejectsBadScaleDtype) {
  expect_error(
      [] {
        QuantizedKVCache c(QuantizedKVCacheConfig{4, 3, 64, RotationKind::kSO4Full, 0, DType::kI8});
      },
      ErrorCode::kInvalidArgument, "quantized_kv_cache", "got int8");
}

TEST(KVCache, RejectsBadPlainDtype) {
  expect_error(
      [] {
        PlainKVCache c(PlainKVCacheConfig{DType::kU32, RotationKind::kNone, 0});
      },
      ErrorCode::kInvalidArgument, "plain_kv_cache", "got uint32");
}

TEST(KVCache, RejectsGroupSizeNotDividingHeadDim) {
  std::vector<float> k(1 * 1 * 2 * 96), v(1 * 1 * 2 * 64);
  QuantizedKVCache c;  // group 64
  expect_error(
      [&] {
        c.update_and_fetch(TensorView(k.data(), DType::kF32, {1, 1, 2, 96}),
                           TensorView(v.data(), DType::kF32, {1, 1, 2, 64}));
      },
      ErrorCode::kShapeMismatch, "kv_cache_update", "the key head dim must be a multiple of group_size 64; got 96");
  EXPECT_TRUE(c.empty());  // nothing changed
  expect_error(
      [&] {
        c.update_and_fetch(TensorView(v.data(), DType::kF32, {1, 1, 2, 64}),
                           TensorView(k.data(), DType::kF32, {1, 1, 2, 96}));
      },
      ErrorCode::kShapeMismatch, "kv_cache_update", "the value head dim must be a multiple of group_size 64; got 96");
}

TEST(KVCache, RejectsPlainRotatedHeadDimNotMultipleOfFour) {
  std::vector<float> k(10), v(8);
  PlainKVCache c(PlainKVCacheConfig{DType::kF32, RotationKind::kSO4Full, 0});
  expect_error(
      [&] {
        c.update_and_fetch(TensorView(k.data(), DType::kF32, {1, 1, 1, 10}),
                           TensorView(v.data(), DType::kF32, {1, 1, 1, 8}));
      },
      ErrorCode::kShapeMismatch, "kv_cache_update", "got 10");
}

TEST(KVCache, RejectsMismatchedLaterAppend) {
  auto rng = test::make_rng(20);
  QuantizedKVCache c;
  Input k = make_input(rng, DType::kF32, 1, 2, 3, 64), v = make_input(rng, DType::kF32, 1, 2, 3, 64);
  c.update_and_fetch(k.view(), v.view());
  Input kh = make_input(rng, DType::kF32, 1, 4, 3, 64), vh = make_input(rng, DType::kF32, 1, 4, 3, 64);
  expect_error([&] { c.update_and_fetch(kh.view(), vh.view()); }, ErrorCode::kShapeMismatch, "kv_cache_update",
               "got keys (1, 4, 3, 64)");
  Input kd = make_input(rng, DType::kF32, 1, 2, 3, 128);
  expect_error([&] { c.update_and_fetch(kd.view(), v.view()); }, ErrorCode::kShapeMismatch, "kv_cache_update",
               "Dk must match the cache's 64; got 128");
  Input vd = make_input(rng, DType::kF32, 1, 2, 3, 128);
  expect_error([&] { c.update_and_fetch(k.view(), vd.view()); }, ErrorCode::kShapeMismatch, "kv_cache_update",
               "Dv must match the cache's 64; got 128");
  EXPECT_EQ(c.offset(), 3);
}

TEST(KVCache, RejectsKeysValuesLengthMismatch) {
  auto rng = test::make_rng(21);
  QuantizedKVCache c;
  Input k = make_input(rng, DType::kF32, 1, 2, 3, 64), v = make_input(rng, DType::kF32, 1, 2, 4, 64);
  expect_error([&] { c.update_and_fetch(k.view(), v.view()); }, ErrorCode::kShapeMismatch, "kv_cache_update",
               "(1, 2, 4, 64)");
}

TEST(KVCache, RejectsWrongRank) {
  std::vector<float> k(64 * 3);
  QuantizedKVCache c;
  TensorView k3(k.data(), DType::kF32, {1, 3, 64});
  expect_error([&] { c.update_and_fetch(k3, k3); }, ErrorCode::kShapeMismatch, "kv_cache_update", "(1, 3, 64)");
}

TEST(KVCache, RejectsNonFloatInput) {
  std::vector<int8_t> k(64);
  std::vector<float> v(64);
  QuantizedKVCache c;
  expect_error(
      [&] {
        c.update_and_fetch(TensorView(k.data(), DType::kI8, {1, 1, 1, 64}),
                           TensorView(v.data(), DType::kF32, {1, 1, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "kv_cache_update", "int8");
}

TEST(KVCache, RejectsNonFiniteInput) {
  std::vector<float> k(64, 1.0f), v(64, 1.0f);
  k[17] = std::nanf("");
  QuantizedKVCache c;
  expect_error(
      [&] {
        c.update_and_fetch(TensorView(k.data(), DType::kF32, {1, 1, 1, 64}),
                           TensorView(v.data(), DType::kF32, {1, 1, 1, 64}));
      },
      ErrorCode::kInvalidArgument, "kv_cache_update", "at [0, 0, 0, 17]");
  EXPECT_TRUE(c.empty());
}

TEST(KVCache, RejectsNegativeTrim) {
  QuantizedKVCache c;
  expect_error([&] { c.trim(-2); }, ErrorCode::kInvalidArgument, "kv_cache_trim", "got -2");
}

TEST(KVCache, RejectsRestoringOtherKindOfSnapshot) {
  auto rng = test::make_rng(22);
  PlainKVCache p;
  Input k = make_input(rng, DType::kF32, 1, 1, 2, 64), v = make_input(rng, DType::kF32, 1, 1, 2, 64);
  p.update_and_fetch(k.view(), v.view());
  QuantizedKVCache q;
  expect_error([&] { q.restore(p.snapshot()); }, ErrorCode::kInvalidArgument, "kv_cache_restore", "got a plain one");
  expect_error([&] { p.restore(q.snapshot()); }, ErrorCode::kInvalidArgument, "kv_cache_restore",
               "got a quantized one");
}

TEST(KVCache, RejectsSnapshotWithWrongPlaneSize) {
  nn::KVCacheMeta m;
  m.quantized = false;
  m.dtype = DType::kF32;
  m.has_dims = true;
  m.B = 1;
  m.H = 1;
  m.Dk = m.Dv = 4;
  m.length = 2;
  std::vector<Buffer> planes;
  planes.emplace_back(32);
  planes.emplace_back(31);
  expect_error([&] { KVCacheSnapshot s(m, std::move(planes)); }, ErrorCode::kCorrupt, "kv_cache_snapshot", "got 31");
}


// ---- per-channel keys (KeyLayout::kChannel) ------------------------------------------------------------------------

QuantizedKVCacheConfig channel_config(uint64_t seed, int kb = 4, int vb = 4, int gs = 64, DType sd = DType::kF16) {
  return QuantizedKVCacheConfig{kb, vb, gs, RotationKind::kHadamard, seed, sd, nn::KeyLayout::kChannel};
}

// The keys of a per-channel view, valid positions only, in a layout-independent form: codes and (block) scale and
// bias per quantized element, the bf16 bits per residual element.
struct ChannelKeys {
  std::vector<uint32_t> codes;      // [B, H, nq, D]
  std::vector<float> scales, biases;  // [B, H, nq/gs, D]
  std::vector<uint16_t> residual;   // [B, H, length - nq, D]
  bool operator==(const ChannelKeys& o) const {
    return codes == o.codes && scales == o.scales && biases == o.biases && residual == o.residual;
  }
};
ChannelKeys channel_keys(const KVTensorView& v) {
  ChannelKeys out;
  const int64_t gs = v.group_size, nq = v.length / gs * gs, D = v.dim;
  EXPECT_EQ(v.layout, 1);
  for (int64_t b = 0; b < v.B; ++b)
    for (int64_t h = 0; h < v.H; ++h) {
      for (int64_t t = 0; t < nq; ++t) {
        const uint32_t* w =
            static_cast<const uint32_t*>(v.data) + ((b * v.H + h) * v.capacity + t) * quant::packed_words(D, v.bits);
        for (int64_t d = 0; d < D; ++d) out.codes.push_back(quant::unpack_code(w, d, v.bits));
      }
      for (int64_t blk = 0; blk < nq / gs; ++blk)
        for (int64_t d = 0; d < D; ++d) {
          out.scales.push_back(load_float(v.scales, v.scale_dtype, ((b * v.H + h) * v.blocks + blk) * D + d));
          out.biases.push_back(load_float(v.biases, v.scale_dtype, ((b * v.H + h) * v.blocks + blk) * D + d));
        }
      for (int64_t t = nq; t < v.length; ++t)
        for (int64_t d = 0; d < D; ++d)
          out.residual.push_back(static_cast<const uint16_t*>(v.residual)[((b * v.H + h) * gs + t - nq) * D + d]);
    }
  return out;
}

// Positions [t0, t0 + n) of x as a new input of the same dtype.
Input positions(const Input& x, int64_t t0, int64_t n) {
  Input y{x.dtype, {x.shape[0], x.shape[1], n, x.shape[3]}, {}, {}};
  const int64_t D = x.shape[3], es = esize(x.dtype);
  for (int64_t bh = 0; bh < x.shape[0] * x.shape[1]; ++bh) {
    const uint8_t* src = x.bytes.data() + ((bh * x.shape[2] + t0) * D) * es;
    y.bytes.insert(y.bytes.end(), src, src + n * D * es);
    const float* fs = x.f.data() + (bh * x.shape[2] + t0) * D;
    y.f.insert(y.f.end(), fs, fs + n * D);
  }
  return y;
}

// Keys go unrotated into the bf16 residual window and, per full block, are quantized per channel: each channel's
// gs values by affine_quantize_group (MLX's arithmetic), the codes packed per position. Values as in token layout.
TEST(KVCacheChannel, StoresBlocksPerChannelAndTheRestInTheResidualWindow) {
  auto rng = test::make_rng(40);
  for (DType sd : {DType::kF16, DType::kBF16, DType::kF32}) {
    const int gs = sd == DType::kF32 ? 32 : 64, kb = sd == DType::kBF16 ? 3 : 4;
    QuantizedKVCache c(channel_config(rng(), kb, 4, gs, sd));
    const int64_t B = 2, H = 3, D = 64, n = 150;
    Input k = make_input(rng, DType::kF32, B, H, n, D), v = make_input(rng, DType::kF32, B, H, n, D);
    for (auto [t0, m] : {std::pair<int64_t, int64_t>{0, 37}, {37, 90}, {127, 23}})
      c.update_and_fetch(positions(k, t0, m).view(), positions(v, t0, m).view());
    const KVTensorView kv = c.keys();
    ASSERT_EQ(kv.layout, 1);
    EXPECT_EQ(kv.blocks, c.capacity() / gs);
    EXPECT_EQ(c.key_rotation().kind(), RotationKind::kNone);
    EXPECT_EQ(c.value_rotation().kind(), RotationKind::kHadamard);
    const ChannelKeys got = channel_keys(kv);
    ChannelKeys want;
    const int64_t nq = n / gs * gs;
    std::vector<float> col(static_cast<size_t>(gs));
    std::vector<uint8_t> codes(static_cast<size_t>(gs));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<uint32_t> block_codes(static_cast<size_t>(nq * D));
        for (int64_t blk = 0; blk < nq / gs; ++blk)
          for (int64_t d = 0; d < D; ++d) {
            for (int64_t t = 0; t < gs; ++t)
              col[static_cast<size_t>(t)] = round_to(DType::kBF16, k.row(b, h, blk * gs + t)[d]);  // via the window
            float sc, bi;
            quant::affine_quantize_group(col.data(), gs, kb, codes.data(), &sc, &bi);
            for (int64_t t = 0; t < gs; ++t) block_codes[static_cast<size_t>((blk * gs + t) * D + d)] = codes[static_cast<size_t>(t)];
            want.scales.push_back(round_to(sd, sc));
            want.biases.push_back(round_to(sd, bi));
          }
        want.codes.insert(want.codes.end(), block_codes.begin(), block_codes.end());
        for (int64_t t = nq; t < n; ++t)
          for (int64_t d = 0; d < D; ++d) want.residual.push_back(f32_to_bf16(k.row(b, h, t)[d]));
      }
    // Scales and biases are emitted block by block per (b, h): reorder want's to [B, H, blocks, D] (already so).
    EXPECT_EQ(got.codes, want.codes) << dtype_name(sd);
    EXPECT_EQ(got.scales, want.scales) << dtype_name(sd);
    EXPECT_EQ(got.biases, want.biases) << dtype_name(sd);
    EXPECT_EQ(got.residual, want.residual) << dtype_name(sd);
    // Values: per token, rotated, exactly as a token-layout cache stores them.
    QuantizedKVCacheConfig tok = c.config();
    tok.key_layout = nn::KeyLayout::kToken;
    QuantizedKVCache t(tok);
    t.update_and_fetch(k.view(), v.view());
    EXPECT_EQ(valid_bytes(c.values()), valid_bytes(t.values())) << dtype_name(sd);
  }
}

// trim inside the residual window keeps everything else; trim back into a quantized block puts its kept positions
// into the window as bf16 of their dequantized values, so the cache equals one built by appending exactly those
// values (then appends continue identically).
TEST(KVCacheChannel, TrimIntoTheWindowAndAcrossABlockBoundary) {
  auto rng = test::make_rng(41);
  const int64_t B = 1, H = 2, D = 128;  // group 64
  const QuantizedKVCacheConfig cfg = channel_config(rng());
  QuantizedKVCache c(cfg);
  Input k = make_input(rng, DType::kF32, B, H, 150, D), v = make_input(rng, DType::kF32, B, H, 150, D);
  c.update_and_fetch(k.view(), v.view());
  const ChannelKeys before = channel_keys(c.keys());
  EXPECT_EQ(c.trim(10), 10);  // 140: still blocks 0, 1 and 12 residual positions
  ChannelKeys after = channel_keys(c.keys());
  EXPECT_EQ(after.codes, before.codes);
  EXPECT_EQ(after.scales, before.scales);
  EXPECT_EQ(std::vector<uint16_t>(before.residual.begin(), before.residual.begin() + 12 * D),
            std::vector<uint16_t>(after.residual.begin(), after.residual.begin() + 12 * D));  // head 0
  EXPECT_EQ(c.trim(20), 20);  // 120: block 1 (64..127) reopens with 56 positions
  const KVTensorView kv = c.keys();
  EXPECT_EQ(kv.length, 120);
  // The reference: positions 0..63 as given, 64..119 the dequantized block-1 values (bf16), then the same appends.
  Input k2 = k;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 64; t < 120; ++t)
      for (int64_t d = 0; d < D; ++d) {
        const size_t bi = static_cast<size_t>((h * 2 + 1) * D + d);  // block 1 of head h in before.scales
        const float deq = quant::affine_dequantize_value(before.codes[static_cast<size_t>((h * 128 + t) * D + d)],
                                                         before.scales[bi], before.biases[bi], cfg.scale_dtype);
        k2.f[static_cast<size_t>((h * 150 + t) * D + d)] = round_to(DType::kBF16, deq);
      }
  k2.bytes = test::to_dtype_bytes(k2.f, DType::kF32);
  QuantizedKVCache fresh(cfg);
  fresh.update_and_fetch(positions(k2, 0, 120).view(), positions(v, 0, 120).view());
  EXPECT_TRUE(channel_keys(kv) == channel_keys(fresh.keys()));
  Input k3 = make_input(rng, DType::kF32, B, H, 40, D), v3 = make_input(rng, DType::kF32, B, H, 40, D);
  c.update_and_fetch(k3.view(), v3.view());
  fresh.update_and_fetch(k3.view(), v3.view());
  EXPECT_EQ(c.offset(), 160);
  EXPECT_TRUE(channel_keys(c.keys()) == channel_keys(fresh.keys()));
  EXPECT_EQ(valid_bytes(c.values()), valid_bytes(fresh.values()));
  // Trimming everything, then appending, starts a new first block.
  EXPECT_EQ(c.trim(1000), 160);
  c.update_and_fetch(positions(k, 0, 70).view(), positions(v, 0, 70).view());
  QuantizedKVCache fresh2(cfg);
  fresh2.update_and_fetch(positions(k, 0, 70).view(), positions(v, 0, 70).view());
  EXPECT_TRUE(channel_keys(c.keys()) == channel_keys(fresh2.keys()));
}

// Snapshots hold the block rows and the residual window; restoring (into a token-layout cache) takes the layout, and
// both caches continue identically.
// kv_cache_bytes (what `cider fit` sizes with) equals nbytes() of real caches filled to the same positions: token
// and channel layouts, every scale dtype, plain caches, across the 256-position growth steps; bad specs are refused.
TEST(KVCacheBytes, EqualsNbytesOfFilledCaches) {
  auto rng = test::make_rng(44);
  const int64_t B = 1, H = 2, D = 64;
  for (int64_t n : {int64_t{1}, int64_t{63}, int64_t{64}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{700}}) {
    SCOPED_TRACE(::testing::Message() << "positions " << n);
    Input k = make_input(rng, DType::kF32, B, H, n, D), v = make_input(rng, DType::kF32, B, H, n, D);
    for (DType sd : {DType::kF16, DType::kBF16, DType::kF32})
      for (KeyLayout layout : {KeyLayout::kToken, KeyLayout::kChannel}) {
        QuantizedKVCacheConfig cfg{5, 3, 32, RotationKind::kHadamard, 1, sd, layout};
        QuantizedKVCache c(cfg);
        c.update_and_fetch(k.view(), v.view());
        EXPECT_EQ(nn::kv_cache_bytes(cfg.spec(), B, H, D, D, n), c.nbytes()) << cfg.spec().name();
      }
    PlainKVCache p(PlainKVCacheConfig{DType::kBF16, RotationKind::kNone, 0});
    p.update_and_fetch(k.view(), v.view());
    EXPECT_EQ(nn::kv_cache_bytes(PlainKVCacheConfig{DType::kBF16, RotationKind::kNone, 0}.spec(), B, H, D, D, n),
              p.nbytes());
  }
  EXPECT_EQ(nn::kv_cache_bytes(QuantizedKVCacheConfig{}.spec(), 1, 8, 128, 128, 0), 0);
  KVSpec bad = QuantizedKVCacheConfig{}.spec();
  bad.group_size = 48;
  EXPECT_THROW(nn::kv_cache_bytes(bad, 1, 8, 128, 128, 10), Error);
  EXPECT_THROW(nn::kv_cache_bytes(QuantizedKVCacheConfig{}.spec(), 1, 8, 100, 128, 10), Error);  // 100 % 64
}

TEST(KVCacheChannel, SnapshotRestoresLayoutBlocksAndWindow) {
  auto rng = test::make_rng(42);
  const QuantizedKVCacheConfig cfg = channel_config(rng(), 4, 3, 32, DType::kBF16);
  QuantizedKVCache c(cfg);
  Input k = make_input(rng, DType::kF16, 2, 1, 301, 64), v = make_input(rng, DType::kF16, 2, 1, 301, 64);
  c.update_and_fetch(k.view(), v.view());
  const KVCacheSnapshot snap = c.snapshot();
  EXPECT_EQ(snap.meta().key_layout, nn::KeyLayout::kChannel);
  EXPECT_EQ(snap.num_planes(), 7u);
  EXPECT_EQ(snap.plane(1).nbytes(), static_cast<size_t>(2 * 10 * 64 * 2));  // ceil(301/32) block rows of [64] bf16
  EXPECT_EQ(snap.plane(6).nbytes(), static_cast<size_t>(2 * 32 * 64 * 2));  // the window, gs rows
  EXPECT_TRUE(channel_keys(snap.keys()) == channel_keys(c.keys()));
  EXPECT_EQ(valid_bytes(snap.values()), valid_bytes(c.values()));
  QuantizedKVCache r;  // token layout, k8v4
  r.restore(snap);
  EXPECT_EQ(r.config().key_layout, nn::KeyLayout::kChannel);
  EXPECT_EQ(r.offset(), 301);
  EXPECT_TRUE(channel_keys(r.keys()) == channel_keys(c.keys()));
  Input k2 = make_input(rng, DType::kF16, 2, 1, 50, 64), v2 = make_input(rng, DType::kF16, 2, 1, 50, 64);
  c.update_and_fetch(k2.view(), v2.view());
  r.update_and_fetch(k2.view(), v2.view());
  EXPECT_TRUE(channel_keys(r.keys()) == channel_keys(c.keys()));
  EXPECT_TRUE(channel_keys(snap.keys()) != channel_keys(c.keys()));  // the snapshot did not move
  EXPECT_EQ(snap.length(), 301);
}

TEST(KVCacheChannel, NbytesCountsBlockRowsAndTheWindow) {
  auto rng = test::make_rng(43);
  QuantizedKVCache c(channel_config(rng()));
  Input k = make_input(rng, DType::kF32, 1, 8, 300, 128), v = make_input(rng, DType::kF32, 1, 8, 300, 128);
  c.update_and_fetch(k.view(), v.view());
  // capacity 512: key codes 512·64 B, key scales + biases 8 blocks · 128 · 2 B · 2, values 512·(64 + 2·2·2) B,
  // window 64·128·2 B; per KV head.
  EXPECT_EQ(c.nbytes(), 8 * (512 * 64 + 8 * 128 * 2 * 2 + 512 * (64 + 8) + 64 * 128 * 2));
  EXPECT_DOUBLE_EQ(c.config().spec().bits_per_value(), 4.5);
}

TEST(KVCacheChannel, Rejections) {
  auto rng = test::make_rng(44);
  nn::KVSpec plain = nn::parse_kv_spec("bf16");
  plain.key_layout = nn::KeyLayout::kChannel;
  expect_error([&] { plain.validate("op"); }, ErrorCode::kInvalidArgument, "op", "channel key layout");
  expect_error([] { nn::parse_key_layout("rows"); }, ErrorCode::kInvalidArgument, "parse_kv_layout", "\"rows\"");
  // float16 scales cannot hold a bias beyond 65504: refused before anything is written.
  QuantizedKVCache c(channel_config(rng()));
  Input k = make_input(rng, DType::kF32, 1, 1, 3, 64), v = make_input(rng, DType::kF32, 1, 1, 3, 64);
  c.update_and_fetch(k.view(), v.view());
  const ChannelKeys before = channel_keys(c.keys());
  Input big = make_input(rng, DType::kF32, 1, 1, 2, 64);
  big.f[5] = 70000.0f;
  big.bytes = test::to_dtype_bytes(big.f, DType::kF32);
  expect_error([&] { c.update_and_fetch(big.view(), positions(v, 0, 2).view()); }, ErrorCode::kOutOfRange,
               "kv_cache_update", "65504");
  EXPECT_EQ(c.offset(), 3);
  EXPECT_TRUE(channel_keys(c.keys()) == before);
}


// ---- outlier key channels (key_outliers > 0) -------------------------------------------------------------------------

QuantizedKVCacheConfig outlier_config(uint64_t seed, int n, int kb = 4, int gs = 64) {
  QuantizedKVCacheConfig c = channel_config(seed, kb, 4, gs);
  c.key_outliers = n;
  return c;
}

// Key (b, h, t, d) of a per-channel view with outlier channels, as the contract reads it (float64 of the stored parts):
// c·s + b (+ (|s|/15)·(r − 7.5) on the block's outlier channels), or the residual's bf16 value.
double channel_key(const KVTensorView& v, int64_t b, int64_t h, int64_t t, int64_t d, bool* refined = nullptr) {
  const int64_t gs = v.group_size, nq = v.length / gs * gs, D = v.dim;
  if (refined) *refined = false;
  if (t >= nq) return load_float(v.residual, DType::kBF16, ((b * v.H + h) * gs + t - nq) * D + d);
  const uint32_t* w =
      static_cast<const uint32_t*>(v.data) + ((b * v.H + h) * v.capacity + t) * quant::packed_words(D, v.bits);
  const int64_t brow = (b * v.H + h) * v.blocks + t / gs;
  const double sc = load_float(v.scales, v.scale_dtype, brow * D + d);
  double k = quant::unpack_code(w, d, v.bits) * sc + load_float(v.biases, v.scale_dtype, brow * D + d);
  for (int64_t o = 0; o < v.outliers; ++o)
    if (static_cast<const uint16_t*>(v.outlier_index)[brow * v.outliers + o] == d) {
      const uint8_t byte = static_cast<const uint8_t*>(v.outlier_codes)[brow * v.outliers * gs / 2 + o * gs / 2 + (t % gs) / 2];
      k += quant::outlier_refinement((byte >> (4 * (t % 2))) & 15u, static_cast<float>(sc));
      if (refined) *refined = true;
    }
  return k;
}

// Queries [B, Hq, n, D] loud on channels 3, 17 and 33 (×20), and a view of positions [t0, t0 + m) of them.
std::vector<float> loud_queries(std::mt19937_64& rng, int64_t B, int64_t Hq, int64_t n, int64_t D) {
  std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * n * D));
  for (size_t i = 0; i < q.size(); ++i)
    if (const int64_t d = static_cast<int64_t>(i) % D; d == 3 || d == 17 || d == 33) q[i] *= 20.0f;
  return q;
}
TensorView query_rows(const std::vector<float>& q, int64_t B, int64_t Hq, int64_t n, int64_t D, int64_t t0, int64_t m) {
  TensorView v(q.data() + t0 * D, DType::kF32, {B, Hq, m, D});
  v.stride = {Hq * n * D, n * D, D, 1};
  return v;
}

// Every plane of two caches' snapshots byte for byte.
void expect_same_planes(const nn::KVCacheSnapshot& a, const nn::KVCacheSnapshot& b, const std::string& what) {
  ASSERT_EQ(a.num_planes(), b.num_planes()) << what;
  for (size_t p = 0; p < a.num_planes(); ++p) {
    ASSERT_EQ(a.plane(p).nbytes(), b.plane(p).nbytes()) << what << ", plane " << p;
    EXPECT_EQ(std::memcmp(a.plane(p).data(), b.plane(p).data(), a.plane(p).nbytes()), 0) << what << ", plane " << p;
  }
}

// Each block refines the channels with the largest range × RMS of its own positions' queries (shown before the
// append, over the KV head's group of query heads), ascending; a refined value lies within half a refinement step
// (|s|/30) of the key, where its coarse residual is within the ±|s|/2 the refinement covers. The choice does not
// depend on how the positions were split into appends (and observe_queries calls).
TEST(KVCacheChannel, OutlierChannelsRefineTheChannelsTheQueriesWeigh) {
  auto rng = test::make_rng(45);
  const int64_t B = 2, H = 2, rep = 2, Hq = H * rep, D = 64, gs = 64, n = 150, nout = 6;
  const QuantizedKVCacheConfig cfg = outlier_config(rng(), static_cast<int>(nout));
  QuantizedKVCache c(cfg), whole(cfg);
  Input k = make_input(rng, DType::kF32, B, H, n, D), v = make_input(rng, DType::kF32, B, H, n, D);
  for (int64_t i = 0; i < B * H * n; ++i)  // a few wide channels, so that range alone would pick them
    for (int64_t d : {5, 9, 40}) k.f[static_cast<size_t>(i * D + d)] *= 6.0f;
  k.bytes = test::to_dtype_bytes(k.f, DType::kF32);
  // Queries loud on other channels: range × query RMS picks those over the wide ones.
  const std::vector<float> q = loud_queries(rng, B, Hq, n, D);
  c.observe_queries(query_rows(q, B, Hq, n, D, 0, 10));  // two calls for the first append, before the storage exists
  c.observe_queries(query_rows(q, B, Hq, n, D, 10, 20));
  c.update_and_fetch(positions(k, 0, 30).view(), positions(v, 0, 30).view());
  c.observe_queries(query_rows(q, B, Hq, n, D, 30, n - 30));  // blocks 0 and 1 fill in this append
  c.update_and_fetch(positions(k, 30, n - 30).view(), positions(v, 30, n - 30).view());
  whole.observe_queries(query_rows(q, B, Hq, n, D, 0, n));
  whole.update_and_fetch(k.view(), v.view());
  expect_same_planes(c.snapshot(), whole.snapshot(), "appends of 30 + 120 against one of 150");
  const KVTensorView kv = c.keys();
  ASSERT_EQ(kv.outliers, nout);
  int loud_chosen = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t blk = 0; blk < n / gs; ++blk) {
        // The block's queries as the cache keeps them: per position, Σ q² over the group's heads (float32, in head
        // order) rounded to bfloat16; then summed over the positions.
        std::vector<double> q2(static_cast<size_t>(D), 0.0);
        for (int64_t t = blk * gs; t < (blk + 1) * gs; ++t)
          for (int64_t d = 0; d < D; ++d) {
            float sum = 0.0f;
            for (int64_t hq = h * rep; hq < (h + 1) * rep; ++hq) {
              const float x = q[static_cast<size_t>(((b * Hq + hq) * n + t) * D + d)];
              sum += x * x;
            }
            q2[static_cast<size_t>(d)] += bf16_to_f32(f32_to_bf16(sum));
          }
        std::vector<std::pair<double, int64_t>> score;
        for (int64_t d = 0; d < D; ++d) {
          double lo = 1e30, hi = -1e30;
          for (int64_t t = blk * gs; t < (blk + 1) * gs; ++t) {
            const double x = bf16_to_f32(f32_to_bf16(k.row(b, h, t)[d]));
            lo = std::min(lo, x);
            hi = std::max(hi, x);
          }
          score.emplace_back(-(hi - lo) * std::sqrt(q2[static_cast<size_t>(d)] / static_cast<double>(rep * gs)), d);
        }
        std::sort(score.begin(), score.end());
        std::vector<int64_t> want;
        for (int64_t o = 0; o < nout; ++o) want.push_back(score[static_cast<size_t>(o)].second);
        std::sort(want.begin(), want.end());
        const auto* index = static_cast<const uint16_t*>(kv.outlier_index) + ((b * H + h) * kv.blocks + blk) * nout;
        EXPECT_EQ(std::vector<int64_t>(index, index + nout), want) << "b " << b << " h " << h << " block " << blk;
        for (int64_t o = 0; o < nout; ++o) loud_chosen += index[o] == 3 || index[o] == 17 || index[o] == 33;
        int refined_count = 0;
        for (int64_t t = blk * gs; t < (blk + 1) * gs; ++t)
          for (int64_t d = 0; d < D; ++d) {
            bool refined = false;
            const double got = channel_key(kv, b, h, t, d, &refined);
            if (!refined) continue;
            ++refined_count;
            // The coarse value's residual is within ±|s|/2 but where MLX's affine grid (its edge value exact) leaves
            // the block's far end past it; the 16 refinement levels cover ±|s|/2 in steps of |s|/15.
            const double x = bf16_to_f32(f32_to_bf16(k.row(b, h, t)[d]));
            const int64_t brow = (b * H + h) * kv.blocks + blk;
            const double sc = load_float(kv.scales, kv.scale_dtype, brow * D + d);
            const uint32_t* w =
                static_cast<const uint32_t*>(kv.data) + ((b * H + h) * kv.capacity + t) * quant::packed_words(D, kv.bits);
            const double res = x - (quant::unpack_code(w, d, kv.bits) * sc + load_float(kv.biases, kv.scale_dtype, brow * D + d));
            const double bound = std::fabs(sc) / 30.0 + std::max(0.0, std::fabs(res) - std::fabs(sc) / 2.0) +
                                 0x1p-20 * (std::fabs(x) + std::fabs(sc)) + 1e-7;
            ASSERT_LE(std::fabs(got - x), bound) << "b " << b << " h " << h << " t " << t << " d " << d << " residual "
                                                 << res << " step " << sc;
          }
        EXPECT_EQ(refined_count, nout * gs);
      }
  EXPECT_EQ(loud_chosen, 3 * B * H * (n / gs)) << "the loud query channels are refined in every block";
  // Without queries the choice is by range: the wide channels.
  QuantizedKVCache blind(cfg);
  blind.update_and_fetch(k.view(), v.view());
  const auto* index = static_cast<const uint16_t*>(blind.keys().outlier_index);
  int wide = 0;
  for (int64_t o = 0; o < nout; ++o) wide += index[o] == 5 || index[o] == 9 || index[o] == 40;
  EXPECT_EQ(wide, 3);
}

// Trim back into a block puts its kept positions, refined, into the residual window; a snapshot carries the
// outlier planes and the residual positions' query statistics, so a restored cache continues byte for byte as the
// original. A trim that keeps whole blocks (within the residual window, or to a block boundary, as the server's
// prefix cache and speculative decoding do) leaves a cache that continues byte for byte as one that never held the
// trimmed positions.
TEST(KVCacheChannel, OutlierChannelsSurviveTrimSnapshotAndRestore) {
  auto rng = test::make_rng(46);
  const int64_t B = 1, H = 2, D = 128, gs = 32, n = 200;
  const QuantizedKVCacheConfig cfg = outlier_config(rng(), 8, 3, static_cast<int>(gs));
  QuantizedKVCache a(cfg);
  Input k = make_input(rng, DType::kF32, B, H, n, D), v = make_input(rng, DType::kF32, B, H, n, D);
  const std::vector<float> q = loud_queries(rng, B, H, n, D);
  auto feed = [&](QuantizedKVCache& c, int64_t t0, int64_t m) {
    c.observe_queries(query_rows(q, B, H, n, D, t0, m));
    c.update_and_fetch(positions(k, t0, m).view(), positions(v, t0, m).view());
  };
  feed(a, 0, 100);
  // Trim 100 → 70: block 2 (64..95) keeps 6 positions, which return to the window refined.
  // What trim writes back (bfloat16): an outlier channel's value as attention reads it (float32 c·s + b, refined),
  // the other channels as the per-channel layout always did (MLX's dequantization, quant::affine_dequantize_value).
  const KVTensorView before = a.keys();
  std::vector<double> kept;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 64; t < 70; ++t)
      for (int64_t d = 0; d < D; ++d) {
        bool refined = false;
        const double exact = channel_key(before, 0, h, t, d, &refined);
        const uint32_t* w = static_cast<const uint32_t*>(before.data) +
                            (h * before.capacity + t) * quant::packed_words(D, before.bits);
        const int64_t brow = h * before.blocks + t / gs;
        const float sc = load_float(before.scales, before.scale_dtype, brow * D + d);
        const float bi = load_float(before.biases, before.scale_dtype, brow * D + d);
        const uint32_t code = quant::unpack_code(w, d, before.bits);
        float val = quant::affine_dequantize_value(code, sc, bi, before.scale_dtype);
        if (refined) {
          const float coarse = static_cast<float>(code) * sc + bi;
          val = coarse + static_cast<float>(exact - (static_cast<double>(code) * sc + bi));  // + the refinement
        }
        kept.push_back(bf16_to_f32(f32_to_bf16(val)));
      }
  a.trim(30);
  const KVTensorView after = a.keys();
  size_t i = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 64; t < 70; ++t)
      for (int64_t d = 0; d < D; ++d, ++i)
        ASSERT_EQ(channel_key(after, 0, h, t, d), kept[i]) << "h " << h << " t " << t << " d " << d;
  // Snapshot, restore into another cache, and continue both the same way.
  const nn::KVCacheSnapshot snap = a.snapshot();
  EXPECT_EQ(snap.num_planes(), 10u);
  EXPECT_EQ(snap.meta().key_outliers, 8);
  QuantizedKVCache b(channel_config(rng()));
  b.restore(snap);
  EXPECT_EQ(b.config().key_outliers, 8);
  for (QuantizedKVCache* c : {&a, &b}) feed(*c, 70, n - 70);
  expect_same_planes(a.snapshot(), b.snapshot(), "the original and the restored cache");
  // Trims that keep whole blocks: to 98 (within the window) and to 64 (a block boundary), then on to n, against
  // caches that were only ever given those positions.
  for (const int64_t keep : {98, 64}) {
    QuantizedKVCache trimmed(cfg), fresh(cfg);
    feed(trimmed, 0, 100);
    trimmed.trim(100 - keep);
    feed(trimmed, keep, n - keep);
    feed(fresh, 0, keep);
    feed(fresh, keep, n - keep);
    expect_same_planes(trimmed.snapshot(), fresh.snapshot(), "trimmed to " + std::to_string(keep) + " and continued");
  }
  // nbytes: the outlier planes counted (codes n·gs/2 and indices 2n bytes per block, the statistics of gs positions,
  // a byte per channel and the count).
  QuantizedKVCache plain_chan(channel_config(rng(), 3, 4, static_cast<int>(gs)));
  plain_chan.update_and_fetch(k.view(), v.view());
  EXPECT_EQ(a.nbytes() - plain_chan.nbytes(), B * H * ((a.capacity() / gs) * (8 * gs / 2 + 8 * 2) + gs * (D + 1)));
  EXPECT_EQ(nn::kv_cache_bytes(a.config().spec(), B, H, D, D, n), a.nbytes());
  EXPECT_NEAR(a.config().spec().bits_per_value(D), (3 + 4) / 2.0 + 32.0 / gs + 8 * (4.0 + 16.0 / gs) / D / 2.0, 1e-12);
}

// The statistics' one-byte code (quant/kv_stats.h): 0 for 0, non-finite-free; every positive float32 in the grid's
// range decodes within 2^(1/8) of itself (the grid's half step in log2, measured in float64 against log2), codes are
// monotone in s, each grid point encodes to itself, and the ends clamp (below 2^-32: 0; from 2^31.875: 255).
TEST(KVCacheChannel, QueryStatisticCodeIsAQuarterOctaveGrid) {
  auto rng = test::make_rng(48);
  EXPECT_EQ(quant::kv_stat_encode(0.0f), 0);
  EXPECT_EQ(quant::kv_stat_decode(0), 0.0f);
  EXPECT_EQ(quant::kv_stat_encode(0x1p-40f), 0);
  EXPECT_EQ(quant::kv_stat_encode(0x1p40f), 255);
  EXPECT_EQ(quant::kv_stat_encode(INFINITY), 255);
  for (int c = 1; c < 256; ++c) {
    const float g = quant::kv_stat_decode(static_cast<uint8_t>(c));
    ASSERT_NEAR(std::log2(static_cast<double>(g)), (c - 128) / 4.0, 1e-6) << c;
    ASSERT_EQ(quant::kv_stat_encode(g), c) << c;
  }
  std::uniform_real_distribution<double> e(-31.8, 31.8);
  for (int i = 0; i < 200000; ++i) {
    const float s = static_cast<float>(std::exp2(e(rng)));
    const float back = quant::kv_stat_decode(quant::kv_stat_encode(s));
    const double err = std::fabs(std::log2(static_cast<double>(back)) - std::log2(static_cast<double>(s)));
    ASSERT_LE(err, 0.125 + 1e-6) << s;
    const float t = std::nextafter(s, INFINITY);
    ASSERT_LE(quant::kv_stat_encode(s), quant::kv_stat_encode(t)) << s;
  }
}

TEST(KVCacheChannel, OutlierChannelRejections) {
  auto rng = test::make_rng(47);
  nn::KVSpec token = nn::parse_kv_spec("k4v4");
  token.key_outliers = 4;
  expect_error([&] { token.validate("op"); }, ErrorCode::kInvalidArgument, "op", "key_layout channel");
  nn::KVSpec many = outlier_config(0, 33).spec();
  expect_error([&] { many.validate("op"); }, ErrorCode::kInvalidArgument, "op", "[0, 32]");
  expect_error([&] { (void)outlier_config(0, 4).spec().bits_per_value(); }, ErrorCode::kInvalidArgument,
               "kv_bits_per_value", "Dk");
  // More outlier channels than half the head: refused at the first append, nothing stored.
  QuantizedKVCache c(outlier_config(rng(), 20, 4, 32));
  Input k = make_input(rng, DType::kF32, 1, 1, 3, 32), v = make_input(rng, DType::kF32, 1, 1, 3, 32);
  expect_error([&] { c.update_and_fetch(k.view(), v.view()); }, ErrorCode::kShapeMismatch, "kv_cache_update",
               "half of the key head dim");
  EXPECT_TRUE(c.empty());
  // Queries that do not fit the keys.
  QuantizedKVCache d(outlier_config(rng(), 4));
  std::vector<float> q = test::randn(rng, 3 * 64);
  d.observe_queries(TensorView(q.data(), DType::kF32, {1, 3, 1, 64}));
  Input k2 = make_input(rng, DType::kF32, 1, 2, 3, 64), v2 = make_input(rng, DType::kF32, 1, 2, 3, 64);
  expect_error([&] { d.update_and_fetch(k2.view(), v2.view()); }, ErrorCode::kShapeMismatch, "kv_cache_update",
               "observed queries");
  EXPECT_TRUE(d.empty());
  QuantizedKVCache f(outlier_config(rng(), 4));  // queries of 2 positions, keys of 3
  std::vector<float> q2 = test::randn(rng, 2 * 2 * 64);
  f.observe_queries(TensorView(q2.data(), DType::kF32, {1, 2, 2, 64}));
  expect_error([&] { f.update_and_fetch(k2.view(), v2.view()); }, ErrorCode::kShapeMismatch, "kv_cache_update",
               "the observed queries [1, 2, 2, 64] must match the keys (1, 2, 3, 64)");
  QuantizedKVCache e(outlier_config(rng(), 4));
  e.update_and_fetch(k2.view(), v2.view());
  expect_error([&] { e.observe_queries(TensorView(q.data(), DType::kF32, {1, 3, 1, 64})); },
               ErrorCode::kShapeMismatch, "kv_cache_observe_queries", "multiple of its 2 KV heads");
}


// ---- the recent block read unquantized (KVSpec::recent_exact) --------------------------------------------------------

QuantizedKVCacheConfig recent_config(uint64_t seed, int kb, int vb, int gs, int outliers = 0, bool sym = false) {
  QuantizedKVCacheConfig c = channel_config(seed, kb, vb, gs);
  c.key_outliers = outliers;
  c.v_symmetric = sym;
  c.recent_exact = true;
  return c;
}

// Value (b, h, t, d) of a quantized view as attention reads it (rotated space): c·s + b, or c·d − 2^(bits−1)·d.
float value_at(const KVTensorView& v, int64_t b, int64_t h, int64_t t, int64_t d) {
  const int64_t row = (b * v.H + h) * v.capacity + t, G = v.dim / v.group_size;
  const uint32_t* w = static_cast<const uint32_t*>(v.data) + row * quant::packed_words(v.dim, v.bits);
  const float step = load_float(v.scales, v.scale_dtype, row * G + d / v.group_size);
  const float bias = v.symmetric ? quant::symmetric_bias(step, v.bits)
                                 : load_float(v.biases, v.scale_dtype, row * G + d / v.group_size);
  return static_cast<float>(quant::unpack_code(w, d, v.bits)) * step + bias;
}

// The stage's rows against what they must hold, for positions [lo, lo + n): keys the input's, bf16-rounded, or, for
// positions taken back from a quantized block (t < quantized_end), its dequantized codes in bfloat16; values as their
// codes read (c·s + b), bf16-rounded; values_exact, from xlo = ⌊first/V⌋·V on (first: the first position appended
// last, or the length after a trim, restore or copy), the input's (rotated then bf16-rounded: within one bfloat16 step
// of the float32 rotation), or for positions taken back from an earlier run of V (t < quantized_end) their codes. The
// sink's positions (t < sink) hold both as appended.
void expect_stage(const QuantizedKVCache& c, const Input& k, const Input& v, int64_t lo, int64_t n,
                  int64_t quantized_end, const std::string& what, int64_t sink, int64_t first) {
  const auto st = c.exact_stage();
  ASSERT_EQ(st.block, c.config().group_size) << what;
  ASSERT_EQ(st.lo, lo) << what;
  ASSERT_EQ(st.n, n) << what;
  ASSERT_EQ(st.lo + st.n, c.offset()) << what;
  ASSERT_EQ(st.vwin, nn::value_window_rows(st.block)) << what;
  ASSERT_EQ(st.xlo, first / st.vwin * st.vwin) << what;
  const KVTensorView kv = c.keys(), vv = c.values();
  const int64_t B = k.shape[0], H = k.shape[1], Dk = k.shape[3], Dv = v.shape[3];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = lo + j;
        const bool in_sink = t < sink, dequantized = t < quantized_end && !in_sink;
        const uint16_t* sk = st.keys + ((b * H + h) * n + j) * Dk;
        const uint16_t* sv = st.values + ((b * H + h) * n + j) * Dv;
        const uint16_t* sx = st.values_exact + ((b * H + h) * n + j) * Dv;
        std::vector<float> rv(v.row(b, h, t), v.row(b, h, t) + Dv);
        c.value_rotation().apply(rv.data(), 1);
        for (int64_t d = 0; d < Dk; ++d) {
          const uint16_t want = dequantized ? f32_to_bf16(static_cast<float>(channel_key(kv, b, h, t, d)))
                                            : f32_to_bf16(k.row(b, h, t)[d]);
          ASSERT_EQ(sk[d], want) << what << " key b" << b << " h" << h << " t" << t << " d" << d;
        }
        for (int64_t d = 0; d < Dv; ++d) {
          const uint16_t coded = f32_to_bf16(value_at(vv, b, h, t, d));
          const float want = rv[static_cast<size_t>(d)], tol = std::ldexp(std::fabs(want), -8) + 1e-6f;
          if (in_sink) {
            ASSERT_LE(std::fabs(bf16_to_f32(sv[d]) - want), tol) << what << " sink value t" << t << " d" << d;
          } else {
            ASSERT_EQ(sv[d], coded) << what << " value t" << t << " d" << d;
          }
          if (t < st.xlo) continue;
          if (dequantized) {
            ASSERT_EQ(sx[d], coded) << what << " window value t" << t << " d" << d;
          } else {
            ASSERT_LE(std::fabs(bf16_to_f32(sx[d]) - want), tol)
                << what << " window value b" << b << " h" << h << " t" << t << " d" << d;
          }
        }
      }
}

// The stage follows appends (from the first append's block), and trim / snapshot-restore / copy_prefix leave it at
// the incomplete block, rebuilt from the keys' residual window, the value codes, the values' window and the sink.
TEST(KVCacheRecent, StageFollowsAppendsTrimRestoreAndCopies) {
  auto rng = test::make_rng(61);
  const int64_t B = 2, H = 2, Dk = 64, Dv = 32, gs = 32;
  QuantizedKVCache c(recent_config(rng(), 4, 3, gs, 2, true));
  const Input k = make_input(rng, DType::kF32, B, H, 70, Dk), v = make_input(rng, DType::kF32, B, H, 70, Dv);
  c.update_and_fetch(positions(k, 0, 40).view(), positions(v, 0, 40).view());
  const int64_t ns = nn::sink_rows(gs);
  ASSERT_LT(ns, gs);
  expect_stage(c, k, v, 0, 40, 0, "after 40", ns, 0);
  c.update_and_fetch(positions(k, 40, 30).view(), positions(v, 40, 30).view());
  expect_stage(c, k, v, 32, 38, 0, "after 70", ns, 40);  // [32, 40) from the windows, then the new rows
  const KVCacheSnapshot snap = c.snapshot();
  ASSERT_EQ(snap.num_planes(), 13u);  // 10 with outlier channels, the values' window, the sink's keys and values
  EXPECT_EQ(snap.plane(10).nbytes(), static_cast<size_t>(B * H * nn::value_window_rows(gs) * Dv * 2));
  EXPECT_EQ(snap.plane(11).nbytes(), static_cast<size_t>(B * H * ns * Dk * 2));
  EXPECT_EQ(snap.plane(12).nbytes(), static_cast<size_t>(B * H * ns * Dv * 2));
  {  // the sink as appended: keys bf16-rounded, values rotated then rounded
    const auto st = c.exact_stage();
    ASSERT_EQ(st.sink, ns);
    ASSERT_EQ(st.sink_rows, ns);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < ns; ++t) {
          std::vector<float> rv(v.row(b, h, t), v.row(b, h, t) + Dv);
          c.value_rotation().apply(rv.data(), 1);
          for (int64_t d = 0; d < Dk; ++d)
            ASSERT_EQ(st.sink_keys[((b * H + h) * ns + t) * Dk + d], f32_to_bf16(k.row(b, h, t)[d]));
          for (int64_t d = 0; d < Dv; ++d) {
            const float got = bf16_to_f32(st.sink_values[((b * H + h) * ns + t) * Dv + d]), want = rv[static_cast<size_t>(d)];
            ASSERT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -8) + 1e-6f);
          }
        }
  }
  QuantizedKVCache r(recent_config(0, 8, 8, 32));
  r.restore(snap);
  expect_stage(r, k, v, 64, 6, 0, "restored", ns, 70);
  EXPECT_EQ(r.exact_stage().n, 6);
  EXPECT_EQ(r.exact_stage().sink, ns);
  EXPECT_TRUE(std::equal(r.exact_stage().sink_keys, r.exact_stage().sink_keys + B * H * ns * Dk, c.exact_stage().sink_keys));
  c.trim(10);  // back into block [32, 64): its 28 kept positions dequantized into both windows
  expect_stage(c, k, v, 32, 28, 64, "trimmed to 60", ns, 60);
  auto p = c.copy_prefix(50);
  expect_stage(static_cast<QuantizedKVCache&>(*p), k, v, 32, 18, 64, "copy_prefix(50)", ns, 50);
  // Back into the first block: the sink's positions return as appended (their codes are stand-ins), the rest dequantized.
  auto first = c.copy_prefix(ns + 5);
  expect_stage(static_cast<QuantizedKVCache&>(*first), k, v, 0, ns + 5, gs, "copy_prefix(ns + 5)", ns, ns + 5);
  EXPECT_EQ(static_cast<QuantizedKVCache&>(*first).exact_stage().sink, ns);
  auto inside = c.copy_prefix(ns - 3);
  expect_stage(static_cast<QuantizedKVCache&>(*inside), k, v, 0, ns - 3, gs, "copy_prefix(ns - 3)", ns, ns - 3);
  EXPECT_EQ(static_cast<QuantizedKVCache&>(*inside).exact_stage().sink, ns - 3);
  // The next append starts the stage at the incomplete block again: the rows trim() wrote to the windows (as they
  // were: the block quantized again when it fills does not change them), then the new ones.
  const auto before = c.exact_stage();
  const std::vector<uint16_t> sk(before.keys, before.keys + B * H * 28 * Dk), sv(before.values, before.values + B * H * 28 * Dv);
  c.update_and_fetch(positions(k, 60, 10).view(), positions(v, 60, 10).view());
  const auto st = c.exact_stage();
  ASSERT_EQ(st.lo, 32);
  ASSERT_EQ(st.n, 38);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    ASSERT_TRUE(std::equal(sk.begin() + bh * 28 * Dk, sk.begin() + (bh + 1) * 28 * Dk, st.keys + bh * 38 * Dk));
    ASSERT_TRUE(std::equal(sv.begin() + bh * 28 * Dv, sv.begin() + (bh + 1) * 28 * Dv, st.values + bh * 38 * Dv));
    for (int64_t j = 28; j < 38; ++j)
      for (int64_t d = 0; d < Dk; ++d)
        ASSERT_EQ(st.keys[(bh * 38 + j) * Dk + d], f32_to_bf16(k.row(bh / H, bh % H, 32 + j)[d]));
  }
  // Blocks of 64 (values' runs of 32 inside them), one position at a time: each decode step takes the coded values
  // the step before staged, and must hold the same rows as a stage built afresh; then a trim back into an earlier run
  // of the same block returns its kept values from their codes.
  const int64_t g2 = 64, D2 = 64, n2 = 150;
  ASSERT_LT(nn::value_window_rows(g2), g2);
  const Input k2 = make_input(rng, DType::kF32, B, H, n2, D2), v2 = make_input(rng, DType::kF32, B, H, n2, D2);
  QuantizedKVCache d(recent_config(rng(), 4, 4, static_cast<int>(g2), 2, true));
  d.update_and_fetch(positions(k2, 0, 5).view(), positions(v2, 0, 5).view());
  for (int64_t t = 5; t < n2; ++t) {
    d.update_and_fetch(positions(k2, t, 1).view(), positions(v2, t, 1).view());
    expect_stage(d, k2, v2, t / g2 * g2, t + 1 - t / g2 * g2, 0, "decode step " + std::to_string(t), ns, t);
  }
  d.trim(n2 - 100);  // from [128, 150) back to 100: keys of [64, 100) and the values of [96, 100) from codes
  expect_stage(d, k2, v2, 64, 36, 128, "decode, trimmed to 100", ns, 100);
  d.trim(100 - 90);  // back within the run [64, 96): the values' window refilled from codes again
  expect_stage(d, k2, v2, 64, 26, 128, "decode, trimmed to 90", ns, 90);
}

// The first block's channel ranges leave the sink out: its positions are read from bfloat16, so a first key far outside
// the others' range (as a BOS key often is) must not widen the steps of the block's other positions. Each channel's
// stored step is that of its positions [ns, gs): (hi − lo)/15, widened by at most 7.5/7 where the quantizer puts zero
// on the grid (quant/affine.cpp), and float16 rounding (with the sink in the range it would be ≈ 80/15, about 14× as
// large); those positions come back within one step (half a step, a whole one at a clamped end) plus the bias's
// float16 rounding (2⁻¹¹·max(|lo|, |hi|)).
TEST(KVCacheRecent, FirstBlockRangesLeaveTheSinkOut) {
  auto rng = test::make_rng(65);
  const int64_t D = 64, gs = 32, ns = nn::sink_rows(gs), n = 40;
  ASSERT_LT(ns, gs);
  QuantizedKVCache c(recent_config(rng(), 4, 4, gs));
  Input k = make_input(rng, DType::kF32, 1, 1, n, D), v = make_input(rng, DType::kF32, 1, 1, n, D);
  for (int64_t d = 0; d < D; ++d) k.f[static_cast<size_t>(d)] = d % 2 ? 40.0f : -40.0f;  // position 0: far outside
  k.bytes = test::to_dtype_bytes(k.f, DType::kF32);
  c.update_and_fetch(k.view(), v.view());
  const KVTensorView kv = c.keys();
  for (int64_t d = 0; d < D; ++d) {
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t t = ns; t < gs; ++t) {
      const double x = bf16_to_f32(f32_to_bf16(k.row(0, 0, t)[d]));
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const double step = std::fabs(load_float(kv.scales, kv.scale_dtype, d));  // block 0's row
    ASSERT_LE(step, (hi - lo) / 15.0 * (7.5 / 7.0) * (1.0 + 0x1p-10)) << "d " << d;
    const double tol = step * (1.0 + 0x1p-10) + std::max(std::fabs(lo), std::fabs(hi)) * 0x1p-11;
    for (int64_t t = ns; t < gs; ++t)
      ASSERT_LE(std::fabs(channel_key(kv, 0, 0, t, d) - bf16_to_f32(f32_to_bf16(k.row(0, 0, t)[d]))), tol)
          << "t " << t << " d " << d;
  }
}

// What a query reads depends on its position only: a prompt appended at once, in chunks or one position at a time
// gives the same attention output per position (the quantized blocks are the same bytes and the recent block is read
// from bfloat16 either way), up to the kernels' own arithmetic, which differs between a prefill (several rows, maybe
// the AMX-BF16 tiles) and a decode step: scores within δ = scale·2⁻¹⁵·Σ_d |q_d|·max_j |k_jd| (the queries' 16-bit
// rounding or two bfloat16 parts, 2⁻¹⁶ relative, times codes spanning the channel's range, 2·max|k|), so outputs within
// expm1(2δ)·max|v| plus float32 summation, 4·(kL + 64)·2⁻²⁴·max|v|. Without recent_exact the chunkings differ by
// more than ten times that (a check that the comparison can fail).
TEST(KVCacheRecent, AttentionIsTheSameHoweverThePromptIsSplit) {
  auto rng = test::make_rng(62);
  const int64_t B = 1, H = 2, rep = 2, Hq = H * rep, D = 64, n = 600;  // past a 48-window cache's storage
  const Input k = make_input(rng, DType::kF32, B, H, n, D), v = make_input(rng, DType::kF32, B, H, n, D);
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * n * D));
  std::vector<double> kmax(static_cast<size_t>(D), 0.0);  // max_j |k_jd|
  for (size_t r = 0; r < k.f.size() / D; ++r)
    for (int64_t d = 0; d < D; ++d)
      kmax[static_cast<size_t>(d)] = std::max(kmax[static_cast<size_t>(d)], std::fabs(static_cast<double>(k.f[r * D + d])));
  double qk = 0.0;  // max over query rows of Σ_d |q_d|·max_j |k_jd|
  for (size_t r = 0; r < q.size() / D; ++r) {
    double sum = 0.0;
    for (int64_t d = 0; d < D; ++d) sum += std::fabs(static_cast<double>(q[r * D + d])) * kmax[static_cast<size_t>(d)];
    qk = std::max(qk, sum);
  }
  const double delta = 0.125 * 0x1p-15 * qk;
  std::vector<int64_t> mixed = {7, 100, 43, 150, 150, 150}, blocks(9, 64);
  blocks.push_back(24);
  const std::vector<std::vector<int64_t>> splits = {{256, 256, 88}, blocks, std::vector<int64_t>(300, 2), mixed,
                                                    std::vector<int64_t>(600, 1)};
  for (int variant = 0; variant < 4; ++variant) {
    double tol = 0.0;  // from the largest stored value (rotated space), set with the first chunking's cache
    QuantizedKVCacheConfig cfg = variant == 0 ? recent_config(rng(), 4, 4, 32)
                                 : variant == 1 ? recent_config(rng(), 3, 3, 64, 2, true)
                                                : recent_config(rng(), 4, 4, 32);
    if (variant == 2) cfg.recent_exact = false;  // the control
    if (variant == 3) cfg.window = 48;           // a sliding-window cache: the first block is dropped on the way
    bool dropped = false;
    std::vector<std::vector<float>> outs;
    for (const auto& sp : splits) {
      QuantizedKVCache c(cfg);
      std::vector<float> out(static_cast<size_t>(B * Hq * n * D), 0.0f);
      int64_t t0 = 0;
      for (int64_t m : sp) {
        if (cfg.key_outliers > 0) c.observe_queries(query_rows(q, B, Hq, n, D, t0, m));
        c.update_and_fetch(positions(k, t0, m).view(), positions(v, t0, m).view());
        if (c.start() > 0) {
          dropped = true;
          EXPECT_EQ(c.exact_stage().sink, 0) << "a window that dropped the first block reads it no more";
        }
        std::vector<float> o(static_cast<size_t>(B * Hq * m * D));
        nn::AttentionMask mask;
        mask.kind = kernels::MaskKind::kCausal;
        mask.window = cfg.window;
        nn::attention(query_rows(q, B, Hq, n, D, t0, m), c, 0.125f, mask, TensorView(o.data(), DType::kF32, {B, Hq, m, D}));
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t i = 0; i < m; ++i)
            std::copy_n(o.data() + (h * m + i) * D, D, out.data() + (h * n + t0 + i) * D);
        t0 += m;
      }
      if (tol == 0.0) {
        const KVTensorView vv = c.values();
        double vmax = 0.0;
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < vv.length; ++t)
            for (int64_t d = 0; d < D; ++d) vmax = std::max(vmax, std::fabs(static_cast<double>(value_at(vv, 0, h, t, d))));
        tol = (std::expm1(2.0 * delta) + 4.0 * static_cast<double>(n + 64) * 0x1p-24) * vmax;
      }
      outs.push_back(std::move(out));
    }
    double worst = 0.0;
    for (size_t s = 1; s < outs.size(); ++s)
      for (size_t e = 0; e < outs[0].size(); ++e) {
        ASSERT_FALSE(std::isnan(outs[s][e]));
        worst = std::max(worst, static_cast<double>(std::fabs(outs[s][e] - outs[0][e])));
      }
    std::printf("[ recent ] variant %d: largest difference %.3g, bound %.3g\n", variant, worst, tol);
    EXPECT_EQ(dropped, variant == 3);
    if (variant != 2) {
      EXPECT_LE(worst, tol) << "variant " << variant;
    } else {
      EXPECT_GT(worst, 10.0 * tol) << "without recent_exact the chunkings must differ";
    }
  }
}

// nn::attention with the recent block against float64 on what the cache holds: for a query at t, the sink's keys and
// values j < ns from its bfloat16 copy, [ns, e(t)) from the quantized planes (c·s + b), [e(t), t] from the stage (its
// values as appended from ⌊t/V⌋·V on, as coded before); the output rotated back. Within the kernels' score error on the quantized part (as above: δ =
// scale·2⁻¹⁵·Σ_d |q_d|·max_j |k_jd|), float32 sums and the float32 inverse rotation. Reading the sink from its codes
// instead must miss that bound (the check can fail).
TEST(KVCacheRecent, AttentionEqualsFloat64OnTheStoredParts) {
  auto rng = test::make_rng(64);
  const int64_t B = 1, H = 2, rep = 2, Hq = H * rep, D = 64, gs = 64, n0 = 70, L = 30, kL = n0 + L;
  QuantizedKVCache c(recent_config(rng(), 4, 2, gs));  // 2-bit values: their codes far from the values as appended
  const int64_t V = nn::value_window_rows(gs);  // 32: queries from 96 on read [64, 96) from codes, [96, t] as appended
  ASSERT_LT(V, gs);
  const Input k = make_input(rng, DType::kF32, B, H, kL, D), v = make_input(rng, DType::kF32, B, H, kL, D);
  c.update_and_fetch(positions(k, 0, n0).view(), positions(v, 0, n0).view());
  c.update_and_fetch(positions(k, n0, L).view(), positions(v, n0, L).view());
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * L * D));
  std::vector<float> out(static_cast<size_t>(B * Hq * L * D));
  nn::AttentionMask mask;
  mask.kind = kernels::MaskKind::kCausal;
  const float scale = 0.125f;
  nn::attention(TensorView(q.data(), DType::kF32, {B, Hq, L, D}), c, scale, mask,
                TensorView(out.data(), DType::kF32, {B, Hq, L, D}));
  const auto st = c.exact_stage();
  const int64_t ns = nn::sink_rows(gs);
  ASSERT_EQ(st.sink, ns);
  ASSERT_EQ(st.lo, 64);
  const KVTensorView kv = c.keys(), vv = c.values();
  std::vector<double> kmax(static_cast<size_t>(D), 0.0);
  double vmax = 0.0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < kL; ++t)
      for (int64_t d = 0; d < D; ++d) {
        kmax[static_cast<size_t>(d)] = std::max(kmax[static_cast<size_t>(d)], std::fabs(static_cast<double>(k.row(0, h, t)[d])) * 1.1);
        vmax = std::max(vmax, std::fabs(static_cast<double>(v.row(0, h, t)[d])) * std::sqrt(static_cast<double>(D)));
      }
  int misses_with_codes = 0;
  for (int sink_from_codes = 0; sink_from_codes < 2; ++sink_from_codes)
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t h = hq / rep, t = n0 + i, e = std::max(t / gs * gs, st.lo);
        const float* qr = q.data() + (hq * L + i) * D;
        std::vector<double> sc(static_cast<size_t>(t + 1)), orot(static_cast<size_t>(D), 0.0);
        std::vector<std::vector<double>> vals(static_cast<size_t>(t + 1), std::vector<double>(static_cast<size_t>(D)));
        double m = -INFINITY, qk = 0.0;
        for (int64_t d = 0; d < D; ++d) qk += std::fabs(static_cast<double>(qr[d])) * kmax[static_cast<size_t>(d)];
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            double kd, vd;
            if (j < ns && !sink_from_codes) {
              kd = bf16_to_f32(st.sink_keys[(h * ns + j) * D + d]);
              vd = bf16_to_f32(st.sink_values[(h * ns + j) * D + d]);
            } else if (j < e) {
              kd = channel_key(kv, 0, h, j, d);
              vd = value_at(vv, 0, h, j, d);
            } else {
              kd = bf16_to_f32(st.keys[(h * st.n + j - st.lo) * D + d]);
              vd = bf16_to_f32((j >= std::max(t / V * V, st.xlo) ? st.values_exact : st.values)[(h * st.n + j - st.lo) * D + d]);
            }
            dot += qr[d] * kd;
            vals[static_cast<size_t>(j)][static_cast<size_t>(d)] = vd;
          }
          sc[static_cast<size_t>(j)] = scale * dot;
          m = std::max(m, sc[static_cast<size_t>(j)]);
        }
        double den = 0.0;
        for (int64_t j = 0; j <= t; ++j) {
          const double p = std::exp(sc[static_cast<size_t>(j)] - m);
          den += p;
          for (int64_t d = 0; d < D; ++d) orot[static_cast<size_t>(d)] += p * vals[static_cast<size_t>(j)][static_cast<size_t>(d)];
        }
        std::vector<float> back(static_cast<size_t>(D));
        for (int64_t d = 0; d < D; ++d) back[static_cast<size_t>(d)] = static_cast<float>(orot[static_cast<size_t>(d)] / den);
        c.value_rotation().apply_inverse(back.data(), 1);
        const double delta = scale * 0x1p-15 * qk + scale * static_cast<double>(D + 8) * 0x1p-24 * qk;
        const double tol = (std::expm1(2.0 * delta) + 8.0 * static_cast<double>(kL + 64 + D) * 0x1p-24) * vmax;
        for (int64_t d = 0; d < D; ++d) {
          const double got = out[static_cast<size_t>((hq * L + i) * D + d)], want = back[static_cast<size_t>(d)];
          if (!sink_from_codes) {
            ASSERT_LE(std::fabs(got - want), tol) << "hq " << hq << " t " << t << " d " << d;
          } else if (std::fabs(got - want) > tol) {
            ++misses_with_codes;
          }
        }
      }
  EXPECT_GT(misses_with_codes, 0) << "the sink read from its codes must differ from what attention reads";
}

// The kernels' side of it (AttentionArgs::exact_block / exact_lo / exact_sink / lse) at every level: the same output as
// an equivalent bool mask (visible iff sink <= j <= t and j < max(⌊t/block⌋·block, lo)), and the row log-sum-exp against float64
// on the stored keys: within the scores' error — float32 sums of Dk + 8 products (2⁻²⁴ each, relative to Σ|q·k|),
// plus, on the integer paths, the queries' 16-bit rounding (|q − q̃| <= max|q|·2⁻¹⁶ per element).
TEST(KVCacheRecent, KernelsReadOnlyBeforeTheRecentBlockAndReturnTheLogSumExp) {
  auto rng = test::make_rng(63);
  const int64_t B = 1, H = 2, rep = 4, Hq = H * rep, Dk = 128, Dv = 64, kL = 300, L = 20, gs = 64;
  QuantizedKVCache c(recent_config(rng(), 4, 4, gs, 2, true));
  const Input k = make_input(rng, DType::kF32, B, H, kL, Dk), v = make_input(rng, DType::kF32, B, H, kL, Dv);
  c.update_and_fetch(k.view(), v.view());
  const std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * L * Dk));
  const KVTensorView kv = c.keys(), vv = c.values();
  const float scale = 0.09f;
  double vmax = 0.0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < kL; ++t)
      for (int64_t d = 0; d < Dv; ++d) vmax = std::max(vmax, std::fabs(static_cast<double>(value_at(vv, 0, h, t, d))));
  std::vector<const kernels::KernelTable*> tables = {&kernels::ref_kernels()};
  for (IsaLevel l : {IsaLevel::kAvx2, IsaLevel::kAvx512})
    if (static_cast<int>(l) <= static_cast<int>(detected_isa())) tables.push_back(&kernels::kernels_for_isa(l));
  for (auto [lo, sink] : {std::pair<int64_t, int64_t>{0, 0}, {256, 0}, {290, 64}, {0, 64}, {290, 16}, {0, 5}}) {
    auto e_of = [&](int64_t t) { return std::max(t / gs * gs, lo); };
    std::vector<uint8_t> vis(static_cast<size_t>(L * kL));
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < kL; ++j)
        vis[static_cast<size_t>(i * kL + j)] = j <= kL - L + i && j >= sink && j < e_of(kL - L + i);
    // float64 log-sum-exp and its tolerance per row
    std::vector<double> want(static_cast<size_t>(Hq * L)), tol(static_cast<size_t>(Hq * L));
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t i = 0; i < L; ++i) {
        const float* qr = q.data() + (hq * L + i) * Dk;
        double qmax = 0.0;
        for (int64_t d = 0; d < Dk; ++d) qmax = std::max(qmax, std::fabs(static_cast<double>(qr[d])));
        std::vector<double> sc;
        double err = 0.0;
        for (int64_t j = 0; j < kL; ++j) {
          if (!vis[static_cast<size_t>(i * kL + j)]) continue;
          double dot = 0.0, mag = 0.0, kabs = 0.0;
          for (int64_t d = 0; d < Dk; ++d) {
            const double kd = channel_key(kv, 0, hq / rep, j, d);
            dot += qr[d] * kd;
            mag += std::fabs(qr[d] * kd);
            kabs += std::fabs(kd);
          }
          sc.push_back(scale * dot);
          err = std::max(err, scale * (static_cast<double>(Dk + 8) * 0x1p-24 * mag + qmax * 0x1p-16 * kabs));
        }
        double m = -INFINITY, sum = 0.0;
        for (double x : sc) m = std::max(m, x);
        for (double x : sc) sum += std::exp(x - m);
        want[static_cast<size_t>(hq * L + i)] = sc.empty() ? -INFINITY : m + std::log(sum);
        tol[static_cast<size_t>(hq * L + i)] = 2.0 * err + static_cast<double>(kL + 8) * 0x1p-23;
      }
    for (const kernels::KernelTable* t : tables) {
      kernels::AttentionArgs a{};
      a.q = q.data();
      a.B = B;
      a.Hq = Hq;
      a.L = L;
      a.keys = kv;
      a.values = vv;
      a.scale = scale;
      a.mask_kind = kernels::MaskKind::kCausal;
      std::vector<float> o1(static_cast<size_t>(Hq * L * Dv), NAN), o2 = o1, lse(static_cast<size_t>(Hq * L), NAN);
      a.exact_block = gs;
      a.exact_lo = lo;
      a.exact_sink = sink;
      a.lse = lse.data();
      a.out = o1.data();
      t->attention(a);
      a.exact_block = 0;
      a.exact_lo = 0;
      a.exact_sink = 0;
      a.lse = nullptr;
      a.mask_kind = kernels::MaskKind::kBool;
      a.mask = vis.data();
      a.mask_dtype = DType::kBool;
      a.mask_stride[0] = a.mask_stride[1] = 0;
      a.mask_stride[2] = kL;
      a.mask_stride[3] = 1;
      a.out = o2.data();
      t->attention(a);
      for (size_t e = 0; e < o1.size(); ++e) {
        ASSERT_FALSE(std::isnan(o1[e])) << t->name << " lo " << lo << " element " << e;
        ASSERT_LE(std::fabs(o1[e] - o2[e]), 4.0 * (kL + 64) * 0x1p-24 * vmax) << t->name << " lo " << lo << " element " << e;
      }
      for (size_t r = 0; r < lse.size(); ++r) {
        if (std::isinf(want[r])) {
          ASSERT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << t->name << " lo " << lo << " row " << r;
          continue;
        }
        ASSERT_LE(std::fabs(lse[r] - want[r]), tol[r]) << t->name << " lo " << lo << " row " << r;
      }
    }
  }
}

}  // namespace
}  // namespace cider
