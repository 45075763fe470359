// Sliding-window KV caches (nn/kv_cache.h, config window > 0): a cache that drops positions older than its window
// gives the attention of a full cache masked by the same window, bit for bit (plain, per-token and per-channel keys:
// positions drop in multiples of 16 and of the group size, so the kernels see the same tiles and blocks), through
// chunked appends, decode steps, trims across the drop boundary and snapshot/restore; its storage stops at
// window_capacity and kv_cache_bytes says so.
#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "support/test_support.h"

namespace cider {
namespace {

using nn::KVCache;
using nn::KeyLayout;
using nn::PlainKVCache;
using nn::PlainKVCacheConfig;
using nn::QuantizedKVCache;
using nn::QuantizedKVCacheConfig;
using nn::RotationKind;

constexpr int64_t B = 1, Hkv = 2, Hq = 4, D = 64;

// One cache format, built twice: full (window 0) and windowed.
struct Format {
  std::string name;
  bool quantized;
  QuantizedKVCacheConfig q;
  PlainKVCacheConfig p;
  std::unique_ptr<KVCache> make(int64_t window) const {
    if (quantized) {
      QuantizedKVCacheConfig c = q;
      c.window = window;
      return std::make_unique<QuantizedKVCache>(c);
    }
    PlainKVCacheConfig c = p;
    c.window = window;
    return std::make_unique<PlainKVCache>(c);
  }
  nn::KVSpec spec() const { return quantized ? q.spec() : p.spec(); }
};

std::vector<Format> formats() {
  std::vector<Format> f;
  f.push_back({"f32", false, {}, PlainKVCacheConfig{DType::kF32, RotationKind::kNone, 0}});
  f.push_back({"bf16", false, {}, PlainKVCacheConfig{DType::kBF16, RotationKind::kNone, 0}});
  f.push_back({"k8v4 token", true,
               QuantizedKVCacheConfig{8, 4, 64, RotationKind::kHadamard, 3, DType::kF16, KeyLayout::kToken}, {}});
  f.push_back({"k4v3 token so4", true,
               QuantizedKVCacheConfig{4, 3, 32, RotationKind::kSO4Full, 5, DType::kBF16, KeyLayout::kToken}, {}});
  f.push_back({"k5v5 channel g64", true,
               QuantizedKVCacheConfig{5, 5, 64, RotationKind::kHadamard, 7, DType::kF16, KeyLayout::kChannel}, {}});
  f.push_back({"k4v4 channel g32", true,
               QuantizedKVCacheConfig{4, 4, 32, RotationKind::kHadamard, 9, DType::kF32, KeyLayout::kChannel}, {}});
  return f;
}

// A random [1, H, n, D] float32 tensor.
struct Rows {
  std::vector<float> v;
  int64_t H, n;
  TensorView view() const { return TensorView(v.data(), DType::kF32, {B, H, n, D}); }
};
Rows random_rows(std::mt19937_64& rng, int64_t H, int64_t n) { return {test::randn(rng, size_t(B * H * n * D)), H, n}; }

// attention(q over the last L positions of `cache`, causal, window W) as float32 [B, Hq, L, D].
std::vector<float> attend(const KVCache& cache, const Rows& q, int64_t window) {
  std::vector<float> out(q.v.size());
  nn::AttentionMask mask;
  mask.kind = kernels::MaskKind::kCausal;
  mask.window = window;
  nn::attention(q.view(), cache, 0.125f, mask, TensorView(out.data(), DType::kF32, {B, Hq, q.n, D}));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The chunk sizes of a long run: prompt-like chunks (up to 256 rows, the model's pass) and decode steps.
int64_t next_chunk(std::mt19937_64& rng, int64_t step) {
  if (step % 7 == 3) return 256;
  if (step % 3 == 0) return 1 + static_cast<int64_t>(rng() % 256);
  return 1 + static_cast<int64_t>(rng() % 4);
}

// Appends the same rows to both caches and compares attention over the new rows.
void append_both(KVCache& full, KVCache& win, std::mt19937_64& rng, int64_t n, int64_t window, const std::string& at) {
  const Rows k = random_rows(rng, Hkv, n), v = random_rows(rng, Hkv, n), q = random_rows(rng, Hq, n);
  full.update_and_fetch(k.view(), v.view());
  win.update_and_fetch(k.view(), v.view());
  ASSERT_EQ(full.end(), win.end()) << at;
  ASSERT_TRUE(same_bits(attend(full, q, window), attend(win, q, window))) << at << ": attention differs";
}

// The x86 kernels may split a key range over threads, capped by the stored tiles (kernels/x86/attention_x86.h):
// two threads and two KV heads give whole items, so the full and the windowed cache sum in the same order.
struct TwoThreads {
  int saved = num_threads();
  TwoThreads() { set_num_threads(2); }
  ~TwoThreads() { set_num_threads(saved); }
};

TEST(KVWindow, EqualsTheFullCacheMaskedByTheWindow) {
  TwoThreads threads;
  for (const Format& f : formats())
    for (int64_t window : {int64_t{16}, int64_t{37}, int64_t{300}}) {
      SCOPED_TRACE(f.name + ", window " + std::to_string(window));
      auto rng = test::make_rng(static_cast<uint64_t>(window) * 31 + f.name.size());
      auto full = f.make(0), win = f.make(window);
      const int64_t align = nn::window_align(f.spec());
      const int64_t bound = nn::window_capacity(window, align, KVCache::kWindowSlack);
      int64_t dropped_before = 0, drops = 0;
      for (int64_t step = 0; full->end() < 6 * bound; ++step) {
        append_both(*full, *win, rng, next_chunk(rng, step), window, "step " + std::to_string(step));
        if (HasFatalFailure()) return;
        ASSERT_EQ(win->start() % align, 0);
        ASSERT_LE(win->capacity(), bound);  // appends of at most kWindowSlack rows stay within the bound
        ASSERT_GE(win->offset(), std::min(win->end(), window - 1 + 1));  // the window of the last query is kept
        ASSERT_EQ(win->nbytes(), nn::kv_cache_bytes(f.spec(), B, Hkv, D, D, win->end(), window));
        drops += win->start() != dropped_before;
        dropped_before = win->start();
      }
      EXPECT_GE(drops, 4);  // the run went through several drops
      EXPECT_EQ(full->start(), 0);
      EXPECT_GT(full->nbytes(), 4 * win->nbytes());
    }
}

// trim() back to where the next query's window is still stored works (and later appends match the full cache);
// further back it throws, naming the rule and the positions, and changes nothing.
TEST(KVWindow, TrimAcrossTheDropBoundary) {
  TwoThreads threads;
  for (const Format& f : formats()) {
    SCOPED_TRACE(f.name);
    const int64_t window = 40;
    auto rng = test::make_rng(77 + f.name.size());
    auto full = f.make(0), win = f.make(window);
    int64_t step = 0;
    while (win->start() == 0 || win->offset() < window + 100) {
      append_both(*full, *win, rng, next_chunk(rng, step++), window, "fill");
      if (HasFatalFailure()) return;
    }
    // As far back as allowed: offset − (W − 1) positions, which for per-channel keys lands inside a quantized block.
    const int64_t most = win->offset() - (window - 1);
    EXPECT_TRUE(win->can_trim(most));
    EXPECT_FALSE(win->can_trim(most + 1));
    const int64_t start = win->start(), offset = win->offset();
    try {
      win->trim(most + 1);
      ADD_FAILURE() << "trim past the window must throw";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
      EXPECT_NE(std::string(e.what()).find("[kv_cache_trim]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("already dropped"), std::string::npos) << e.what();
    }
    EXPECT_EQ(win->start(), start);
    EXPECT_EQ(win->offset(), offset);
    EXPECT_EQ(win->trim(most), most);
    EXPECT_EQ(full->trim(most), most);
    for (int i = 0; i < 12; ++i) {
      append_both(*full, *win, rng, next_chunk(rng, step++), window, "after trim " + std::to_string(i));
      if (HasFatalFailure()) return;
    }
    // A small trim inside the slack, then more decode steps and a chunk that drops again.
    EXPECT_EQ(win->trim(3), 3);
    EXPECT_EQ(full->trim(3), 3);
    for (int64_t n : {int64_t{1}, int64_t{1}, int64_t{256}, int64_t{256}, int64_t{1}}) {
      append_both(*full, *win, rng, n, window, "after the small trim");
      if (HasFatalFailure()) return;
    }
  }
}

// A snapshot carries window and start; restoring it (into a cache made with another window, or none) continues
// exactly as the original does.
TEST(KVWindow, SnapshotAndRestoreAcrossTheWrap) {
  TwoThreads threads;
  for (const Format& f : formats()) {
    SCOPED_TRACE(f.name);
    const int64_t window = 33;
    auto rng = test::make_rng(91 + f.name.size());
    auto full = f.make(0), win = f.make(window);
    int64_t step = 0;
    while (win->start() == 0) {
      append_both(*full, *win, rng, next_chunk(rng, step++), window, "fill");
      if (HasFatalFailure()) return;
    }
    const nn::KVCacheSnapshot snap = win->snapshot();
    EXPECT_EQ(snap.meta().window, window);
    EXPECT_EQ(snap.meta().start, win->start());
    EXPECT_EQ(snap.length(), win->offset());
    auto restored = f.make(0);
    restored->restore(snap);
    EXPECT_EQ(restored->window(), window);
    EXPECT_EQ(restored->start(), win->start());
    EXPECT_EQ(restored->end(), full->end());
    // The original goes on; then the restored copy replays the same rows from the snapshot's point.
    auto full2 = f.make(0);
    full2->restore(full->snapshot());
    std::mt19937_64 rng2 = rng;
    for (int i = 0; i < 10; ++i) {
      append_both(*full, *win, rng, next_chunk(rng, step + i), window, "original");
      append_both(*full2, *restored, rng2, next_chunk(rng2, step + i), window, "restored");
      if (HasFatalFailure()) return;
    }
    EXPECT_EQ(win->start(), restored->start());
    EXPECT_EQ(win->offset(), restored->offset());
  }
}

// An append larger than the slack grows the storage as far as it needs (never drops what its queries see).
TEST(KVWindow, AppendLargerThanTheSlack) {
  TwoThreads threads;
  const Format f = formats()[2];
  const int64_t window = 50;
  auto rng = test::make_rng(5);
  auto full = f.make(0), win = f.make(window);
  for (int64_t n : {int64_t{200}, int64_t{700}, int64_t{1}, int64_t{900}, int64_t{3}, int64_t{256}}) {
    append_both(*full, *win, rng, n, window, "n " + std::to_string(n));
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(win->start(), 0);
}

// kv_cache_bytes with a window: the plain formula until the bound, then the bound.
TEST(KVWindow, BytesStopAtTheBound) {
  const nn::KVSpec s = QuantizedKVCacheConfig{5, 5, 64, RotationKind::kHadamard, 0, DType::kF16, KeyLayout::kChannel}.spec();
  EXPECT_EQ(nn::window_align(s), 64);
  EXPECT_EQ(nn::window_align(PlainKVCacheConfig{}.spec()), KVCache::kWindowAlign);
  const int64_t bound = nn::window_capacity(512, 64, 256);
  EXPECT_EQ(bound, 1024);  // 511 + 63 + 256 = 830, rounded up to 256
  EXPECT_EQ(nn::window_capacity(512, 16, 256), 1024);
  EXPECT_EQ(nn::window_capacity(16, 16, 256), 512);
  EXPECT_EQ(nn::kv_cache_bytes(s, 1, 1, 256, 256, 300, 512), nn::kv_cache_bytes(s, 1, 1, 256, 256, 300));
  EXPECT_EQ(nn::kv_cache_bytes(s, 1, 1, 256, 256, 32768, 512), nn::kv_cache_bytes(s, 1, 1, 256, 256, bound));
  EXPECT_LT(nn::kv_cache_bytes(s, 1, 1, 256, 256, 32768, 512) * 28, nn::kv_cache_bytes(s, 1, 1, 256, 256, 32768));
  EXPECT_THROW(nn::kv_cache_bytes(s, 1, 1, 256, 256, 10, -1), Error);
  EXPECT_THROW(nn::window_capacity(0, 16, 256), Error);
}

TEST(KVWindow, Rejections) {
  auto expect_error = [](const std::function<void()>& fn, ErrorCode code, const std::string& text) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  PlainKVCacheConfig bad{DType::kF32, RotationKind::kNone, 0, -1};
  expect_error([&] { PlainKVCache c(bad); }, ErrorCode::kInvalidArgument, "window must be >= 0");
  QuantizedKVCacheConfig qbad;
  qbad.window = -5;
  expect_error([&] { QuantizedKVCache c(qbad); }, ErrorCode::kInvalidArgument, "window must be >= 0");

  // Attention over a cache that dropped positions needs a causal mask whose window it holds.
  const Format f = formats()[0];
  auto rng = test::make_rng(8);
  auto win = f.make(20);
  while (win->start() == 0) {
    const Rows k = random_rows(rng, Hkv, 256), v = random_rows(rng, Hkv, 256);
    win->update_and_fetch(k.view(), v.view());
  }
  const Rows q = random_rows(rng, Hq, 4);
  expect_error([&] { attend(*win, q, 0); }, ErrorCode::kInvalidArgument, "needs a causal mask with a window");
  expect_error([&] { attend(*win, q, 21); }, ErrorCode::kInvalidArgument, "of at most 20");
  EXPECT_NO_THROW(attend(*win, q, 20));
  EXPECT_NO_THROW(attend(*win, q, 7));

  // A snapshot's metadata: start not a multiple of the alignment (a start without a window is the rest of a cache
  // split into shared segments: test_kv_segments.cpp).
  nn::KVCacheMeta m = win->snapshot().meta();
  m.start += 3;
  expect_error([&] { nn::KVCacheSnapshot s(m, {}); }, ErrorCode::kInvalidArgument, "in multiples of 16");
}

}  // namespace
}  // namespace cider
