// Shared prefixes (nn/kv_cache.h KVSegment, split_front, empty_at, join_snapshot; nn/attention.h segments): a cache
// whose leading positions were split into shared, read-only segments gives, under attention over the segments and
// the cache together, the attention of the same cache never split — the same codes, the float32 sums in another
// order — for plain, per-token and per-channel caches (with outlier channels, symmetric values and the recent block
// read unquantized, the CPU default's options), through chunked appends and decode steps; a second sequence that
// shares a cut of the segments and continues from empty_at equals a copy of the prefix continued the same way; the
// joined snapshot restores to the unsplit cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "support/test_support.h"

namespace cider {
namespace {

using nn::KVCache;
using nn::KVSegment;
using nn::KeyLayout;
using nn::PlainKVCache;
using nn::PlainKVCacheConfig;
using nn::QuantizedKVCache;
using nn::QuantizedKVCacheConfig;
using nn::RotationKind;

constexpr int64_t B = 1, Hkv = 2, Hq = 4, D = 64;

struct Format {
  std::string name;
  bool quantized;
  QuantizedKVCacheConfig q;
  PlainKVCacheConfig p;
  std::unique_ptr<KVCache> make() const {
    if (quantized) return std::make_unique<QuantizedKVCache>(q);
    return std::make_unique<PlainKVCache>(p);
  }
};

std::vector<Format> formats() {
  std::vector<Format> f;
  f.push_back({"bf16", false, {}, PlainKVCacheConfig{DType::kBF16, RotationKind::kNone, 0}});
  f.push_back({"k8v4 token", true,
               QuantizedKVCacheConfig{8, 4, 64, RotationKind::kHadamard, 3, DType::kF16, KeyLayout::kToken}, {}});
  f.push_back({"k4v3 token so4", true,
               QuantizedKVCacheConfig{4, 3, 32, RotationKind::kSO4Full, 5, DType::kBF16, KeyLayout::kToken}, {}});
  f.push_back({"k4v4 channel g32", true,
               QuantizedKVCacheConfig{4, 4, 32, RotationKind::kHadamard, 9, DType::kF32, KeyLayout::kChannel}, {}});
  QuantizedKVCacheConfig d{4, 4, 64, RotationKind::kHadamard, 11, DType::kF16, KeyLayout::kChannel};
  d.key_outliers = 2;
  d.v_symmetric = true;
  d.recent_exact = true;
  f.push_back({"k4v4 channel g64 o2 vsym rx", true, d, {}});
  return f;
}

struct Rows {
  std::vector<float> v;
  int64_t H, n;
  TensorView view() const { return TensorView(v.data(), DType::kF32, {B, H, n, D}); }
};
Rows random_rows(std::mt19937_64& rng, int64_t H, int64_t n) { return {test::randn(rng, size_t(B * H * n * D)), H, n}; }

std::vector<float> attend(const KVCache& cache, const Rows& q, const std::vector<KVSegment>& segs = {}) {
  std::vector<float> out(q.v.size());
  nn::AttentionMask mask;
  mask.kind = kernels::MaskKind::kCausal;
  nn::attention(q.view(), cache, 0.125f, mask, TensorView(out.data(), DType::kF32, {B, Hq, q.n, D}), 0.0f, segs);
  return out;
}

// Every element within tol of the unsplit cache's (NaN fails). Both read the same codes with the same (quantized)
// queries, so the scores are the same; only the float32 order of the softmax sums differs (the parts' merge, the
// kernels' own splits): as in test_attention_x86.cpp, value sums are chains of at most kL + 64 roundings of terms
// bounded by max |v̂| (u = 2^-24), once per side, plus the weights' exp at other maxima (4u each, a factor e^{±8u}):
// tol = (2·(kL + 64) + 16)·u·max |v̂|, with max |v̂| taken as 1.25 × the largest value appended (quantization error
// of the 3- and 4-bit codes stays within a quarter of the group's range).
void expect_close(const std::vector<float>& want, const std::vector<float>& got, int64_t kL, float max_v,
                  const std::string& at) {
  ASSERT_EQ(want.size(), got.size()) << at;
  const double tol = (2.0 * static_cast<double>(kL + 64) + 16.0) * std::ldexp(1.0, -24) * 1.25 * max_v;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << at << ": element " << i << " is " << got[i];
    ASSERT_NEAR(want[i], got[i], tol) << at << ": element " << i;
  }
}

float max_abs(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

int64_t next_chunk(std::mt19937_64& rng, int64_t step) {
  if (step % 5 == 2) return 1 + static_cast<int64_t>(rng() % 200);
  return 1 + static_cast<int64_t>(rng() % 3);
}

// Moves split's stored positions, but for its last incomplete unit, into a new segment.
void split_all(KVCache& split, std::vector<KVSegment>& segs) {
  const int64_t n = split.offset() / split.split_align() * split.split_align();
  if (n == 0) return;
  const int64_t begin = split.start();
  segs.push_back({split.split_front(n), begin, n});
}

// Appends the same rows to both caches (the queries shown to both: outlier channels) and compares attention.
void append_both(KVCache& full, KVCache& split, const std::vector<KVSegment>& segs, std::mt19937_64& rng, int64_t n,
                 float& max_v, const std::string& at) {
  const Rows k = random_rows(rng, Hkv, n), v = random_rows(rng, Hkv, n), q = random_rows(rng, Hq, n);
  max_v = std::max(max_v, max_abs(v.v));
  for (KVCache* c : {&full, &split})
    if (auto* qc = dynamic_cast<QuantizedKVCache*>(c); qc && qc->config().key_outliers > 0) qc->observe_queries(q.view());
  full.update_and_fetch(k.view(), v.view());
  split.update_and_fetch(k.view(), v.view());
  ASSERT_EQ(full.end(), split.end()) << at;
  expect_close(attend(full, q), attend(split, q, segs), full.end(), max_v, at);
}

TEST(KVSegments, AttentionOverSegmentsEqualsTheUnsplitCache) {
  for (const Format& f : formats()) {
    SCOPED_TRACE(f.name);
    auto rng = test::make_rng(7 + f.name.size());
    auto full = f.make(), split = f.make();
    std::vector<KVSegment> segs;
    float max_v = 0.0f;
    for (int64_t step = 0; full->end() < 1500; ++step) {
      append_both(*full, *split, segs, rng, next_chunk(rng, step), max_v, "step " + std::to_string(step));
      if (HasFatalFailure()) return;
      if (step % 9 == 4) split_all(*split, segs);
    }
    ASSERT_GE(segs.size(), 3u);
    EXPECT_EQ(split->start(), segs.back().begin + segs.back().length);
    EXPECT_LT(split->nbytes(), full->nbytes());
    // The joined snapshot holds the unsplit cache: the same plane sizes, and restored, attention reads the same bits
    // (the rows past a per-channel cache's quantized blocks are not meaningful, so the bytes are compared that way).
    const nn::KVCacheSnapshot joined = nn::join_snapshot(segs, *split), whole = full->snapshot();
    ASSERT_EQ(joined.num_planes(), whole.num_planes());
    EXPECT_EQ(joined.length(), whole.length());
    EXPECT_EQ(joined.meta().start, 0);
    for (size_t p = 0; p < whole.num_planes(); ++p) EXPECT_EQ(joined.plane(p).nbytes(), whole.plane(p).nbytes());
    auto a = f.make(), b = f.make();
    a->restore(joined);
    b->restore(whole);
    const Rows q = random_rows(rng, Hq, 5);
    const std::vector<float> oa = attend(*a, q), ob = attend(*b, q);
    EXPECT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)), 0);
  }
}

// A second sequence sharing the first `p` positions: the segments cut at p and a cache from empty_at(p), fed what a
// copy of the prefix (copy_prefix) is fed.
TEST(KVSegments, ACutOfTheSegmentsContinuesLikeACopyOfThePrefix) {
  for (const Format& f : formats()) {
    SCOPED_TRACE(f.name);
    auto rng = test::make_rng(19 + f.name.size());
    auto first = f.make();
    std::vector<KVSegment> segs;
    const Rows k = random_rows(rng, Hkv, 700), v = random_rows(rng, Hkv, 700);
    float max_v = max_abs(v.v);
    first->update_and_fetch(k.view(), v.view());
    split_all(*first, segs);
    const int64_t align = first->split_align();
    for (int64_t p : {align, 256 / align * align, 640 / align * align}) {
      SCOPED_TRACE("shared prefix " + std::to_string(p));
      std::vector<KVSegment> shared;
      for (const KVSegment& g : segs)
        if (g.begin < p) shared.push_back(g.cut(std::min(g.length, p - g.begin)));
      auto own = first->empty_at(p);
      auto copy = nn::join_snapshot(segs, *first);
      auto ref = f.make();
      ref->restore(copy);
      ref->trim(ref->end() - p);
      EXPECT_EQ(own->end(), p);
      EXPECT_EQ(own->offset(), 0);
      for (int64_t step = 0; step < 12; ++step) {
        const int64_t n = next_chunk(rng, step);
        const Rows k2 = random_rows(rng, Hkv, n), v2 = random_rows(rng, Hkv, n), q = random_rows(rng, Hq, n);
        max_v = std::max(max_v, max_abs(v2.v));
        ref->update_and_fetch(k2.view(), v2.view());
        own->update_and_fetch(k2.view(), v2.view());
        expect_close(attend(*ref, q), attend(*own, q, shared), ref->end(), max_v, "step " + std::to_string(step));
        if (HasFatalFailure()) return;
      }
    }
    // The first sequence is unchanged by the second's cuts (the segments are read-only and shared).
    EXPECT_EQ(segs.front().snapshot.data_id(), segs.front().cut(align).id());
  }
}

TEST(KVSegments, Rejections) {
  auto rng = test::make_rng(3);
  QuantizedKVCacheConfig chan{4, 4, 32, RotationKind::kHadamard, 1, DType::kF16, KeyLayout::kChannel};
  QuantizedKVCache c(chan);
  EXPECT_THROW(c.split_front(0), Error);  // no dims yet
  const Rows k = random_rows(rng, Hkv, 100), v = random_rows(rng, Hkv, 100), q = random_rows(rng, Hq, 4);
  c.update_and_fetch(k.view(), v.view());
  EXPECT_THROW(c.split_front(48), Error);   // not a multiple of the group size
  EXPECT_THROW(c.split_front(128), Error);  // more than stored
  EXPECT_THROW(c.empty_at(40), Error);
  std::vector<KVSegment> segs;
  segs.push_back({c.split_front(64), 0, 64});
  EXPECT_THROW(segs[0].cut(16), Error);
  EXPECT_THROW(attend(c, q), Error);  // the segments are needed
  std::vector<KVSegment> gap = {segs[0].cut(32)};
  EXPECT_THROW(attend(c, q, gap), Error);  // they end before the cache starts
  std::vector<float> out(q.v.size());
  nn::AttentionMask windowed;
  windowed.kind = kernels::MaskKind::kCausal;
  windowed.window = 8;
  EXPECT_THROW(nn::attention(q.view(), c, 0.125f, windowed, TensorView(out.data(), DType::kF32, {B, Hq, 4, D}), 0.0f,
                             segs),
               Error);
  QuantizedKVCache other({4, 4, 32, RotationKind::kHadamard, 2, DType::kF16, KeyLayout::kChannel});  // another seed
  other.update_and_fetch(k.view(), v.view());
  auto rest = other.empty_at(64);
  const Rows k1 = random_rows(rng, Hkv, 4), v1 = random_rows(rng, Hkv, 4);
  rest->update_and_fetch(k1.view(), v1.view());
  EXPECT_THROW(attend(*rest, q, segs), Error);
  QuantizedKVCacheConfig slide = chan;
  slide.window = 64;
  QuantizedKVCache w(slide);
  w.update_and_fetch(k.view(), v.view());
  EXPECT_THROW(w.split_front(32), Error);
  EXPECT_THROW(w.empty_at(32), Error);
  // The rest of a split per-channel cache starts at a multiple of the group size.
  nn::KVCacheMeta m = rest->meta();
  EXPECT_EQ(m.start, 64);
  m.start = 40;
  try {
    nn::KVCacheSnapshot s(m, {});
    ADD_FAILURE() << "a start of 40 with blocks of 32 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("starts at a multiple of 32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cider
