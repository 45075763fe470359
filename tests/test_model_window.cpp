// Sliding-window layers keep only their window (nn/kv_cache.h; the default): over a sequence many windows long, a
// model's logits equal those of the same model keeping every position (ModelOptions::kv_full_sliding), bit for bit
// (float32 and bfloat16 caches, and per-token / per-channel quantized ones: the caches drop in multiples of the
// kernels' tiles and blocks; one thread, so the x86 kernels never split a key range differently); Session::trim goes
// back while the window is still held and refuses (cider::Error, nothing changed) beyond; trimming to 0 starts over;
// kv_bytes is bounded and equals model::kv_cache_bytes.
//
// Models: the gemma3 (sliding window 8, two sliding layers of three) and mistral (window 16, every layer sliding)
// fixtures of tests/data/hf_fixtures, copied with max_position_embeddings raised to 4096 (random weights: the RoPE
// tables are computed for any position).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "support/test_support.h"

namespace cm = cider::model;
namespace fs = std::filesystem;

namespace {

const std::string kFixtures = std::string(CIDER_SOURCE_DIR) + "/tests/data/hf_fixtures/";

// The fixture with a longer context, in a temporary directory removed at the end.
struct LongFixture {
  fs::path dir;
  explicit LongFixture(const std::string& name) {
    dir = fs::temp_directory_path() / ("cider_window_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(kFixtures + name)) fs::copy(e.path(), dir / e.path().filename());
    auto j = nlohmann::json::parse(cider::read_text_input((dir / "config.json").string(), "test"));
    j["max_position_embeddings"] = 4096;
    std::ofstream(dir / "config.json") << j.dump(2);
  }
  ~LongFixture() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

cm::ModelOptions options(const char* kv, bool full, int group = 32, const char* layout = "token") {
  cm::ModelOptions o;
  o.weights = cm::WeightFormat::kF32;
  o.kv = cm::parse_kv_format(kv);
  if (o.kv.quantized) {
    o.kv.group_size = group;
    o.kv.key_layout = cider::nn::parse_key_layout(layout);
  }
  o.ctx = 4096;
  o.kv_full_sliding = full;
  return o;
}

struct OneThread {
  int saved = cider::num_threads();
  OneThread() { cider::set_num_threads(1); }
  ~OneThread() { cider::set_num_threads(saved); }
};

// Runs tokens [from, to) through both sessions (all logits) and checks they agree bit for bit.
void run_both(const cm::Model& bounded, cm::Session& sb, const cm::Model& full, cm::Session& sf,
              const std::vector<int32_t>& tokens, int64_t n, const std::string& at) {
  const int64_t V = bounded.config().vocab_size, p = sb.position();
  ASSERT_EQ(p, sf.position()) << at;
  std::vector<float> lb(static_cast<size_t>(n * V)), lf(lb.size());
  bounded.forward(sb, tokens.data() + p, n, lb.data(), true);
  full.forward(sf, tokens.data() + p, n, lf.data(), true);
  ASSERT_EQ(std::memcmp(lb.data(), lf.data(), lb.size() * sizeof(float)), 0)
      << at << ": logits of positions [" << p << ", " << p + n << ") differ";
}

struct Case {
  const char* fixture;
  const char* kv;
  const char* layout;
};

class ModelWindow : public ::testing::TestWithParam<Case> {};

TEST_P(ModelWindow, BoundedCacheGivesTheFullCachesLogits) {
  OneThread one;
  const Case c = GetParam();
  LongFixture fx(c.fixture);
  auto bounded = cm::Model::load(fx.dir.string(), options(c.kv, false, 32, c.layout));
  auto full = cm::Model::load(fx.dir.string(), options(c.kv, true, 32, c.layout));
  const cm::ModelConfig& cfg = bounded->config();
  ASSERT_GT(cfg.sliding_window, 0);
  const int64_t W = cfg.sliding_window;
  auto rng = cider::test::make_rng(17);
  std::vector<int32_t> tokens(2600);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(cfg.vocab_size));

  auto sb = bounded->new_session(), sf = full->new_session();
  // A long prompt (passes of 256 rows), decode steps, another chunk: more than four times the bounded storage.
  run_both(*bounded, *sb, *full, *sf, tokens, 700, "prompt");
  for (int i = 0; i < 300; ++i) {
    run_both(*bounded, *sb, *full, *sf, tokens, 1, "decode " + std::to_string(i));
    if (HasFatalFailure()) return;
  }
  run_both(*bounded, *sb, *full, *sf, tokens, 517, "second chunk");
  for (int i = 0; i < 40; ++i) {
    run_both(*bounded, *sb, *full, *sf, tokens, 1, "decode after the chunk " + std::to_string(i));
    if (HasFatalFailure()) return;
  }
  // Memory: bounded, and what model::kv_cache_bytes says (the full session's too).
  const int64_t pos = sb->position();
  EXPECT_EQ(static_cast<int64_t>(sb->kv_bytes()), cm::kv_cache_bytes(cfg, bounded->options().kv, pos, false));
  EXPECT_EQ(static_cast<int64_t>(sf->kv_bytes()), cm::kv_cache_bytes(cfg, full->options().kv, pos, true));
  EXPECT_LT(sb->kv_bytes(), sf->kv_bytes());

  // Trims: a few positions back works (the window is still held) and decoding goes on identically.
  EXPECT_TRUE(sb->can_truncate(pos - 3));
  EXPECT_EQ(sb->trim(3), 3);
  EXPECT_EQ(sf->trim(3), 3);
  for (int i = 0; i < 5; ++i) run_both(*bounded, *sb, *full, *sf, tokens, 1, "after trim");
  // Far back: refused, nothing changed.
  const int64_t now = sb->position();
  EXPECT_FALSE(sb->can_truncate(now - 1000));
  EXPECT_TRUE(sf->can_truncate(now - 1000));
  try {
    sb->trim(1000);
    ADD_FAILURE() << "a trim past the window must throw";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), cider::ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("[session_trim]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("window " + std::to_string(W)), std::string::npos) << e.what();
  }
  EXPECT_EQ(sb->position(), now);
  run_both(*bounded, *sb, *full, *sf, tokens, 1, "after the refused trim");
  // Back to 0 always works: the session starts over.
  EXPECT_TRUE(sb->can_truncate(0));
  EXPECT_EQ(sb->trim(sb->position()), now + 1);
  EXPECT_EQ(sf->trim(sf->position()), now + 1);
  run_both(*bounded, *sb, *full, *sf, tokens, 300, "after the reset");
  run_both(*bounded, *sb, *full, *sf, tokens, 1, "decode after the reset");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelWindow,
                         ::testing::Values(Case{"gemma3", "f32", "token"}, Case{"mistral", "f32", "token"},
                                           Case{"gemma3", "bf16", "token"}, Case{"gemma3", "k8v4", "token"},
                                           Case{"gemma3", "k5v5", "channel"}),
                         [](const auto& p) {
                           return std::string(p.param.fixture) + "_" + p.param.kv + "_" + p.param.layout;
                         });

// A full-cache model (kv_full_sliding) trims anywhere; the default bounds kv bytes at any context.
TEST(ModelWindowBytes, BoundedAtLongContexts) {
  LongFixture fx("gemma3");
  auto m = cm::Model::load(fx.dir.string(), options("bf16", false));
  const cm::ModelConfig& c = m->config();
  const cm::KVOptions& kv = m->options().kv;
  // Two sliding layers stop at the bound; the global layer grows.
  EXPECT_EQ(cm::kv_cache_bytes(c, kv, 4096, false),
            cm::kv_cache_bytes(c, kv, 4096, true) / 3 + 2 * (cm::kv_cache_bytes(c, kv, 512, true) / 3));
  EXPECT_EQ(cm::kv_cache_bytes(c, kv, 100, false), cm::kv_cache_bytes(c, kv, 100, true));
}

}  // namespace
