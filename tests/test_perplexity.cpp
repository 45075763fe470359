// Perplexity and KL against fake models: analytic cases (uniform logits give perplexity = vocab; two-token KL in
// closed form), a direct float64 recomputation of the mean NLL, which tokens the windows score, and rejections.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/llama_logits.h"
#include "model/perplexity.h"
#include "support/test_support.h"

namespace cider::model {
namespace {

std::vector<int32_t> iota_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>(i % vocab);
  return t;
}

TEST(Perplexity, UniformLogitsGivePerplexityEqualToTheVocabulary) {
  const int64_t V = 37;
  const auto tokens = iota_tokens(200, V);
  auto uniform = [&](const int32_t*, int64_t n, float* logits) { std::fill(logits, logits + n * V, 0.25f); };
  const PerplexityResult r = evaluate_perplexity(tokens, V, {.ctx = 16}, uniform);
  EXPECT_NEAR(r.ppl, 37.0, 37.0 * 1e-12);
  EXPECT_NEAR(r.nll.se, 0.0, 1e-12);
  EXPECT_EQ(r.windows, 200 / 16);
  EXPECT_EQ(r.tokens_scored, (200 / 16) * 15);
  EXPECT_FALSE(r.has_baseline);
}

// Pseudo-random logits that depend on the window's tokens up to each position (like a causal model).
void hashed_logits(const int32_t* tokens, int64_t n, float* logits, int64_t V, uint64_t salt) {
  uint64_t h = salt;
  for (int64_t i = 0; i < n; ++i) {
    h = (h ^ static_cast<uint64_t>(tokens[i])) * 0x100000001B3ull;
    std::mt19937_64 g(h);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (int64_t v = 0; v < V; ++v) logits[i * V + v] = nd(g);
  }
}

TEST(Perplexity, MeanNllEqualsADirectFloat64Computation) {
  auto rng = test::make_rng(1);
  const int64_t V = 50, n = 301, ctx = 32;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  const uint64_t salt = rng();
  auto model = [&](const int32_t* t, int64_t m, float* l) { hashed_logits(t, m, l, V, salt); };
  const PerplexityResult r = evaluate_perplexity(tokens, V, {.ctx = ctx}, model);
  // Direct: for each window, each scored token, -log softmax in long double.
  long double sum = 0, sum_sq = 0;
  int64_t count = 0;
  std::vector<float> l(static_cast<size_t>(ctx * V));
  for (int64_t start = 0; start + ctx <= n; start += ctx) {
    hashed_logits(tokens.data() + start, ctx, l.data(), V, salt);
    for (int64_t j = 1; j < ctx; ++j) {
      long double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<long double>(l[static_cast<size_t>((j - 1) * V + v)]));
      const long double x = std::log(z) - l[static_cast<size_t>((j - 1) * V + tokens[static_cast<size_t>(start + j)])];
      sum += x, sum_sq += x * x, ++count;
    }
  }
  const double mean = static_cast<double>(sum / count);
  const double sd = std::sqrt(static_cast<double>((sum_sq - count * (sum / count) * (sum / count)) / (count - 1)));
  EXPECT_EQ(r.tokens_scored, count);
  EXPECT_NEAR(r.nll.mean, mean, 1e-12 * mean);
  EXPECT_NEAR(r.ppl, std::exp(mean), 1e-11 * std::exp(mean));
  EXPECT_NEAR(r.nll.se, sd / std::sqrt(static_cast<double>(count)), 1e-9);
  EXPECT_NEAR(r.ppl_stderr, std::exp(mean) * sd / std::sqrt(static_cast<double>(count)), 1e-8);
}

// Logits that reveal which targets were scored: token ids are absolute positions (vocab >= length), and row j of a
// window puts logit a(t) on t = tokens[j] + 1, the next token, so the NLL of scoring target t is
// log(V − 1 + e^a(t)) − a(t), different for every t.
struct Revealing {
  int64_t V;
  std::vector<std::pair<int32_t, int64_t>> calls;  // (first token, length)
  static double a(int64_t t) { return 0.01 * static_cast<double>(t); }
  void operator()(const int32_t* tokens, int64_t n, float* logits) {
    calls.push_back({tokens[0], n});
    std::fill(logits, logits + n * V, 0.0f);
    for (int64_t j = 0; j < n; ++j)
      if (tokens[j] + 1 < V) logits[j * V + tokens[j] + 1] = static_cast<float>(a(tokens[j] + 1));
  }
  double nll(int64_t t) const {
    const double at = static_cast<float>(a(t));
    return std::log(static_cast<double>(V - 1) + std::exp(at)) - at;
  }
};

TEST(Perplexity, WindowsScoreEveryTokenOnceWithAStrideAndAllButTheFirstWithout) {
  const int64_t V = 120, n = 103, ctx = 20;
  const auto tokens = iota_tokens(n, V);
  for (int64_t stride : {int64_t{0}, int64_t{20}, int64_t{7}, int64_t{1}}) {
    Revealing model{V, {}};
    const PerplexityResult r =
        evaluate_perplexity(tokens, V, {.ctx = ctx, .stride = stride},
                            [&](const int32_t* t, int64_t m, float* l) { model(t, m, l); });
    const int64_t s = stride == 0 ? ctx : stride;
    std::set<int64_t> want;  // the targets the definition scores
    int64_t windows = 0;
    for (int64_t start = 0; start + ctx <= n; start += s, ++windows) {
      ASSERT_LT(static_cast<size_t>(windows), model.calls.size());
      EXPECT_EQ(model.calls[static_cast<size_t>(windows)], (std::pair<int32_t, int64_t>{static_cast<int32_t>(start), ctx}));
      for (int64_t t = start + 1; t < start + ctx; ++t) want.insert(t);
    }
    if (s < ctx) {  // every token from 1 to the end of the last window, once
      EXPECT_EQ(static_cast<int64_t>(want.size()), (windows - 1) * s + ctx - 1);
    } else {        // window starts are never scored
      for (int64_t start = 0; start + ctx <= n; start += s) EXPECT_EQ(want.count(start), 0u);
    }
    double sum = 0.0;
    for (int64_t t : want) sum += model.nll(t);
    EXPECT_EQ(r.windows, windows) << "stride " << stride;
    EXPECT_EQ(r.tokens_scored, static_cast<int64_t>(want.size())) << "stride " << stride;
    EXPECT_NEAR(r.nll.mean, sum / static_cast<double>(want.size()), 1e-12) << "stride " << stride;
  }
}

// BOS per window: every window is BOS + ctx − 1 text tokens; with the default stride every text token is scored
// exactly once (the first of a window predicted from BOS alone), with a stride only the ones no window scored before.
TEST(Perplexity, BosPerWindowStartsEveryWindowWithBosAndScoresEveryTextTokenOnce) {
  const int64_t V = 130, n = 100, ctx = 20;
  const int32_t bos = 120;  // outside the text's ids 0..99: the Revealing model scores targets by id
  const auto tokens = iota_tokens(n, V);
  for (int64_t stride : {int64_t{0}, int64_t{19}, int64_t{7}, int64_t{1}}) {
    SCOPED_TRACE(::testing::Message() << "stride " << stride);
    Revealing model{V, {}};
    std::vector<std::vector<int32_t>> seen;
    const PerplexityResult r = evaluate_perplexity(tokens, V, {.ctx = ctx, .stride = stride, .bos = bos},
                                                   [&](const int32_t* t, int64_t m, float* l) {
                                                     seen.emplace_back(t, t + m);
                                                     model(t, m, l);
                                                   });
    const int64_t s = stride == 0 ? ctx - 1 : stride;
    // Text index (= id) scored → whether it was predicted from the BOS row (window offset 1) or from its predecessor.
    std::map<int64_t, bool> want;
    int64_t windows = 0;
    for (int64_t start = 0; start + ctx - 1 <= n; start += s, ++windows) {
      ASSERT_LT(static_cast<size_t>(windows), seen.size());
      const std::vector<int32_t>& w = seen[static_cast<size_t>(windows)];
      ASSERT_EQ(static_cast<int64_t>(w.size()), ctx);
      EXPECT_EQ(w[0], bos);
      for (int64_t j = 1; j < ctx; ++j) EXPECT_EQ(w[static_cast<size_t>(j)], start + j - 1);
      const int64_t first = windows == 0 ? 1 : std::max<int64_t>(1, ctx - s);
      for (int64_t off = first; off < ctx; ++off) EXPECT_TRUE(want.emplace(start + off - 1, off == 1).second);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), windows);
    // Every text token from 0 to the end of the last window, once.
    EXPECT_EQ(static_cast<int64_t>(want.size()), (windows - 1) * s + ctx - 1);
    EXPECT_EQ(want.begin()->first, 0);
    EXPECT_EQ(want.rbegin()->first, (windows - 1) * s + ctx - 2);
    double sum = 0.0;
    const double from_bos = std::log(static_cast<double>(V - 1) + std::exp(static_cast<double>(static_cast<float>(
                                         Revealing::a(bos + 1)))));  // the BOS row hints bos + 1, never a target
    for (const auto& [t, bos_row] : want) sum += bos_row ? from_bos : model.nll(t);
    EXPECT_EQ(r.windows, windows);
    EXPECT_EQ(r.tokens_scored, static_cast<int64_t>(want.size()));
    EXPECT_NEAR(r.nll.mean, sum / static_cast<double>(want.size()), 1e-12);
    EXPECT_TRUE(r.bos_per_window);
    EXPECT_EQ(r.stride, s);
    EXPECT_NE(r.report().find("each BOS + 19 text tokens, advancing " + std::to_string(s) + " text tokens"),
              std::string::npos)
        << r.report();
  }
}

// llama-perplexity's windows: non-overlapping chunks of ctx tokens of the stream (BOS first), the first token of
// each replaced by BOS, offsets ctx/2 + 1 … ctx − 1 scored (llama.cpp's tools/perplexity: first = n_ctx/2, rows
// first … n_ctx − 2 predicting the next token).
TEST(Perplexity, LlamaWindowsCutAndScoreAsLlamaPerplexity) {
  const int64_t V = 130, n = 107, ctx = 20;
  const int32_t bos = 120;
  const auto tokens = iota_tokens(n, V);
  Revealing model{V, {}};
  std::vector<std::vector<int32_t>> seen;
  const PerplexityResult r = evaluate_perplexity(tokens, V, {.ctx = ctx, .bos = bos, .llama_windows = true},
                                                 [&](const int32_t* t, int64_t m, float* l) {
                                                   seen.emplace_back(t, t + m);
                                                   model(t, m, l);
                                                 });
  ASSERT_EQ(seen.size(), 5u);  // 107 / 20
  double sum = 0.0;
  for (int64_t w = 0; w < 5; ++w) {
    const auto& win = seen[static_cast<size_t>(w)];
    EXPECT_EQ(win[0], bos);
    for (int64_t j = 1; j < ctx; ++j) EXPECT_EQ(win[static_cast<size_t>(j)], w * ctx + j);
    for (int64_t off = ctx / 2 + 1; off < ctx; ++off) sum += model.nll(w * ctx + off);
  }
  EXPECT_EQ(r.windows, 5);
  EXPECT_EQ(r.tokens_scored, 5 * (ctx - ctx / 2 - 1));
  EXPECT_NEAR(r.nll.mean, sum / static_cast<double>(r.tokens_scored), 1e-12);
  EXPECT_TRUE(r.llama_windows);
  EXPECT_NE(r.report().find("as llama-perplexity cuts them"), std::string::npos) << r.report();
  auto zeros = [](const int32_t*, int64_t m, float* l) { std::fill(l, l + m * V, 0.0f); };
  EXPECT_THROW(evaluate_perplexity(tokens, V, {.ctx = ctx, .stride = 5, .bos = bos, .llama_windows = true}, zeros),
               cider::Error);
}

// llama.cpp's saved log-probabilities (model/llama_logits.h), written here by llama-perplexity's rule: per scored
// row, max/min logit (min clamped to max − 16), scale = (max − min)/65535, codes round((logit − min)/scale) above min
// and 0 at or below it, min_log_prob = min − max − log Σ exp(logit − max).
struct LlamaFile {
  int64_t ctx, vocab, chunks;
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // per chunk [ctx, vocab]
  std::string write(const std::string& name) const {
    const std::string path = (std::filesystem::temp_directory_path() /
                              (name + "_" + std::to_string(::getpid()) + ".bin")).string();
    std::ofstream out(path, std::ios::binary);
    out.write("_logits_", 8);
    const int32_t head[3] = {static_cast<int32_t>(ctx), static_cast<int32_t>(vocab), static_cast<int32_t>(chunks)};
    out.write(reinterpret_cast<const char*>(head), sizeof head);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    const int64_t nv = 2 * ((vocab + 1) / 2) + 4;
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
        const float* l = logits[static_cast<size_t>(c)].data() + j * vocab;
        float mx = l[0], mn = l[0];
        for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, l[v]), mn = std::min(mn, l[v]);
        mn = std::max(mn, mx - 16.0f);
        double sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(l[v] - mx));
        const float scale = (mx - mn) / 65535.0f, min_log_prob = mn - mx - static_cast<float>(std::log(sum));
        std::vector<uint16_t> row(static_cast<size_t>(nv), 0);
        std::memcpy(row.data(), &scale, 4);
        std::memcpy(row.data() + 2, &min_log_prob, 4);
        for (int64_t v = 0; v < vocab; ++v)
          if (scale > 0.0f && l[v] > mn) row[static_cast<size_t>(4 + v)] = static_cast<uint16_t>(std::lround((l[v] - mn) / scale));
        out.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size() * 2));
      }
    return path;
  }
};

LlamaFile random_llama_file(int64_t ctx, int64_t vocab, int64_t chunks, uint64_t seed) {
  auto rng = test::make_rng(seed);
  LlamaFile f{ctx, vocab, chunks, {}, {}};
  for (int64_t i = 0; i < ctx * chunks; ++i) f.tokens.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<float> l(static_cast<size_t>(ctx * vocab));
    for (float& x : l) x = static_cast<float>(static_cast<double>(rng() % 20001) / 1000.0 - 10.0);  // [-10, 10]
    f.logits.push_back(std::move(l));
  }
  return f;
}

// The decoded rows are the log-softmax of the written logits within half a code step (llama.cpp's resolution; the
// logits span 20 > 16 nats, so the clamp 16 nats below the top is exercised: entries below it decode to the clamp's
// log-probability); unsaved rows are 0; the float32 sums allow 1e-5 relative.
TEST(LlamaLogits, ReadsLlamaPerplexityFilesWithinHalfACodeStep) {
  const LlamaFile f = random_llama_file(12, 37, 3, 2201);  // odd vocabulary: one padding code per row
  const std::string path = f.write("cider_llama_logits_read");
  LlamaLogitsFile file(path);
  EXPECT_EQ(file.n_ctx(), 12);
  EXPECT_EQ(file.n_vocab(), 37);
  EXPECT_EQ(file.n_chunk(), 3);
  EXPECT_EQ(file.tokens(), f.tokens);
  std::vector<float> got(12 * 37);
  std::vector<double> exact(37);
  for (int64_t c = 0; c < 3; ++c) {
    file.read_chunk(c, got.data());
    for (int64_t j = 0; j < 12; ++j) {
      const float* g = got.data() + j * 37;
      if (j < 6 || j > 10) {
        for (int64_t v = 0; v < 37; ++v) EXPECT_EQ(g[v], 0.0f);
        continue;
      }
      const float* l = f.logits[static_cast<size_t>(c)].data() + j * 37;
      log_softmax(l, 37, exact.data());
      const float top = *std::max_element(l, l + 37), low = std::max(*std::min_element(l, l + 37), top - 16.0f);
      const double step = (top - low) / 65535.0, lse = l[0] - exact[0];  // logit − log p
      for (int64_t v = 0; v < 37; ++v)  // at or below the clamp: the clamp's log-probability
        EXPECT_NEAR(g[v], std::max(l[v], low) - lse, step / 2 + 1e-5 * (1.0 + std::fabs(lse)))
            << "chunk " << c << " row " << j << " entry " << v;
    }
  }
  EXPECT_TRUE(test::throws_code([&] { file.read_chunk(3, got.data()); }, ErrorCode::kInvalidArgument, "in order"));
  LlamaLogitsFile again(path);
  EXPECT_TRUE(test::throws_code([&] { again.read_chunk(1, got.data()); }, ErrorCode::kInvalidArgument, "in order"));
  std::filesystem::remove(path);
}

TEST(LlamaLogits, RejectsBadMagicSizesTokensAndScales) {
  const LlamaFile f = random_llama_file(8, 10, 2, 2202);
  const std::string path = f.write("cider_llama_logits_bad");
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto with = [&](const std::string& b) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  std::string b = bytes;
  b[0] = 'x';
  with(b);
  EXPECT_TRUE(test::throws_code([&] { LlamaLogitsFile{path}; }, ErrorCode::kCorrupt, "_logits_"));
  with(bytes.substr(0, bytes.size() - 2));
  EXPECT_TRUE(test::throws_code([&] { LlamaLogitsFile{path}; }, ErrorCode::kCorrupt, "bytes"));
  b = bytes;
  const int32_t huge = 1 << 30;
  std::memcpy(b.data() + 8, &huge, 4);  // n_ctx
  with(b);
  EXPECT_TRUE(test::throws_code([&] { LlamaLogitsFile{path}; }, ErrorCode::kCorrupt, "n_ctx"));
  b = bytes;
  const int32_t bad_token = 10;
  std::memcpy(b.data() + 20 + 4 * 3, &bad_token, 4);
  with(b);
  EXPECT_TRUE(test::throws_code([&] { LlamaLogitsFile{path}; }, ErrorCode::kCorrupt, "token ids"));
  b = bytes;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(b.data() + 20 + 16 * 4, &nan, 4);  // the first saved row's scale
  with(b);
  LlamaLogitsFile file(path);
  std::vector<float> out(8 * 10);
  EXPECT_TRUE(test::throws_code([&] { file.read_chunk(0, out.data()); }, ErrorCode::kCorrupt, "scale"));
  std::filesystem::remove(path);
  EXPECT_TRUE(test::throws_code([&] { LlamaLogitsFile{path}; }, ErrorCode::kIo, "cannot open"));
}

// A log-probability baseline (PerplexityOptions::baseline_log_probs): rows used as they are, the KL over entries
// above −16 nats only, the baseline NLL −log p(target); here against a direct float64 computation.
TEST(Perplexity, LogProbabilityBaselineAsLlamaPerplexityComputesIt) {
  const int64_t V = 23, ctx = 10, chunks = 3;
  const LlamaFile f = random_llama_file(ctx, V, chunks, 2203);
  const std::string path = f.write("cider_llama_logits_kl");
  LlamaLogitsFile file(path);
  const LlamaFile t = random_llama_file(ctx, V, chunks, 2204);  // the tested model's logits
  int64_t tc = 0, bc = 0;
  const PerplexityResult r = evaluate_perplexity(
      f.tokens, V, {.ctx = ctx, .bos = -1, .llama_windows = true, .baseline_log_probs = true},
      [&](const int32_t*, int64_t n, float* l) {
        const auto& src = t.logits[static_cast<size_t>(tc++)];
        std::copy(src.begin(), src.begin() + n * V, l);
      },
      [&](const int32_t*, int64_t, float* l) { file.read_chunk(bc++, l); });
  LlamaLogitsFile again(path);
  std::vector<float> base(static_cast<size_t>(ctx * V));
  std::vector<double> lp(static_cast<size_t>(V));
  double kl = 0.0, nll_base = 0.0;
  int64_t n = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    again.read_chunk(c, base.data());
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      log_softmax(t.logits[static_cast<size_t>(c)].data() + j * V, V, lp.data());
      for (int64_t v = 0; v < V; ++v) {
        const double lb = base[static_cast<size_t>(j * V + v)];
        if (lb > -16.0) kl += std::exp(lb) * (lb - lp[static_cast<size_t>(v)]);
      }
      nll_base -= base[static_cast<size_t>(j * V + f.tokens[static_cast<size_t>(c * ctx + j + 1)])];
      ++n;
    }
  }
  EXPECT_EQ(r.tokens_scored, n);
  EXPECT_NEAR(r.kl.mean, kl / static_cast<double>(n), 1e-12);
  EXPECT_NEAR(r.base_nll.mean, nll_base / static_cast<double>(n), 1e-12);
  EXPECT_GT(r.kl.mean, 0.0);
  std::filesystem::remove(path);
}

TEST(Perplexity, KlDivergenceInClosedFormAndItsDirection) {
  // base p = (1/2, 1/2), test q = (3/4, 1/4): KL(p‖q) = ½ln(½/¾) + ½ln(½/¼) = ½ln(4/3); KL(q‖p) = ¾ln(3/2) + ¼ln(1/2).
  const float base[2] = {0.0f, 0.0f};
  const float tst[2] = {std::log(3.0f), 0.0f};
  const double l3 = static_cast<double>(std::log(3.0f));  // the float logit, exactly
  const double q0 = std::exp(l3) / (std::exp(l3) + 1.0), q1 = 1.0 - q0;
  EXPECT_NEAR(kl_divergence(base, tst, 2), 0.5 * std::log(0.5 / q0) + 0.5 * std::log(0.5 / q1), 1e-15);
  EXPECT_NEAR(kl_divergence(base, tst, 2), 0.5 * std::log(4.0 / 3.0), 1e-7);
  EXPECT_NEAR(kl_divergence(tst, base, 2), 0.75 * std::log(1.5) + 0.25 * std::log(0.5), 1e-7);
  EXPECT_EQ(kl_divergence(tst, tst, 2), 0.0);

  // Through evaluate_perplexity: every scored row has these logits; the top-1 of test (token 0) equals the base's
  // (0, the lowest id of a tie) in the first case and not in the second.
  const auto tokens = iota_tokens(10, 2);
  auto rows = [](const float* r) {
    return [r](const int32_t*, int64_t n, float* l) {
      for (int64_t i = 0; i < n; ++i) l[2 * i] = r[0], l[2 * i + 1] = r[1];
    };
  };
  PerplexityResult r = evaluate_perplexity(tokens, 2, {.ctx = 5}, rows(tst), rows(base));
  ASSERT_TRUE(r.has_baseline);
  EXPECT_NEAR(r.kl.mean, 0.5 * std::log(0.5 / q0) + 0.5 * std::log(0.5 / q1), 1e-15);
  EXPECT_NEAR(r.kl.se, 0.0, 1e-15);
  EXPECT_EQ(r.top1.mean, 1.0);
  EXPECT_NEAR(r.base_ppl, 2.0, 1e-12);
  const float flipped[2] = {0.0f, std::log(3.0f)};
  r = evaluate_perplexity(tokens, 2, {.ctx = 5}, rows(flipped), rows(base));
  EXPECT_EQ(r.top1.mean, 0.0);
  r = evaluate_perplexity(tokens, 2, {.ctx = 5}, rows(tst), rows(tst));
  EXPECT_EQ(r.kl.mean, 0.0);
  EXPECT_EQ(r.top1.mean, 1.0);
  EXPECT_EQ(r.ppl, r.base_ppl);
  const std::string rep = r.report();
  for (const char* part : {"perplexity:", "baseline perplexity:", "mean KL(baseline || tested)", "top-1 agreement: 100.00%"})
    EXPECT_NE(rep.find(part), std::string::npos) << rep;
}

// KL by position: rows predicting tokens at positions >= 700 differ from the baseline (the KL of the closed-form case
// above), earlier rows do not; the ranges [1, 512), [512, 1024), [1024, 2048) of a 1500-token window show exactly that.
TEST(Perplexity, KlByPositionRanges) {
  const float base[2] = {0.0f, 0.0f};
  const float tst[2] = {std::log(3.0f), 0.0f};
  const double want = kl_divergence(base, tst, 2);
  const int64_t ctx = 1500;
  const auto tokens = iota_tokens(ctx, 2);
  auto late_differs = [&](const int32_t*, int64_t n, float* l) {
    for (int64_t i = 0; i < n; ++i) {
      const float* r = i + 1 >= 700 ? tst : base;  // row i predicts position i + 1
      l[2 * i] = r[0], l[2 * i + 1] = r[1];
    }
  };
  auto same = [&](const int32_t*, int64_t n, float* l) {
    for (int64_t i = 0; i < 2 * n; ++i) l[i] = 0.0f;
  };
  const PerplexityResult r = evaluate_perplexity(tokens, 2, {.ctx = ctx}, late_differs, same);
  ASSERT_EQ(r.kl_range_starts, (std::vector<int64_t>{1, 512, 1024}));
  EXPECT_EQ(r.kl_range_tokens, (std::vector<int64_t>{511, 512, 476}));
  EXPECT_EQ(r.kl_by_range[0].mean, 0.0);
  EXPECT_NEAR(r.kl_by_range[1].mean, want * (1024 - 700) / 512.0, 1e-12);
  EXPECT_NEAR(r.kl_by_range[2].mean, want, 1e-12);
  EXPECT_NE(r.report().find("KL by position: [1, 512) 0.000000"), std::string::npos) << r.report();
  EXPECT_NE(r.report().find("[1024, 1500)"), std::string::npos) << r.report();
  // A 512-token window has one range: no line.
  const PerplexityResult short_run = evaluate_perplexity(iota_tokens(512, 2), 2, {.ctx = 512}, late_differs, same);
  EXPECT_EQ(short_run.report().find("KL by position"), std::string::npos);
}

TEST(Perplexity, ProgressCountsWindows) {
  const auto tokens = iota_tokens(50, 10);
  std::vector<std::pair<int64_t, int64_t>> seen;
  evaluate_perplexity(tokens, 10, {.ctx = 10}, [](const int32_t*, int64_t n, float* l) { std::fill(l, l + n * 10, 0.0f); },
                      {}, [&](int64_t d, int64_t t) { seen.push_back({d, t}); });
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}}));
}

TEST(Perplexity, RejectsBadWindowsShortTextsBadIdsAndNonFiniteLogits) {
  const auto tokens = iota_tokens(20, 10);
  auto zeros = [](const int32_t*, int64_t n, float* l) { std::fill(l, l + n * 10, 0.0f); };
  auto rejects = [&](std::span<const int32_t> t, PerplexityOptions o, const WindowEvaluator& m, const std::string& what) {
    try {
      evaluate_perplexity(t, 10, o, m);
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("[perplexity]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  rejects(tokens, {.ctx = 1}, zeros, "got 1");
  rejects(tokens, {.ctx = 8, .stride = 9}, zeros, "got 9");
  rejects(tokens, {.ctx = 8, .stride = -1}, zeros, "got -1");
  rejects(tokens, {.ctx = 21}, zeros, "got 20 tokens");
  std::vector<int32_t> bad = tokens;
  bad[5] = 10;
  rejects(bad, {.ctx = 8}, zeros, "got 10 at 5");
  rejects(tokens, {.ctx = 8}, [](const int32_t*, int64_t n, float* l) {
    std::fill(l, l + n * 10, 0.0f);
    l[3 * 10 + 4] = std::numeric_limits<float>::quiet_NaN();
  }, "position 3");
  rejects(tokens, {.ctx = 8}, WindowEvaluator{}, "need a model");
  // BOS per window: the stride counts text tokens (at most ctx − 1), a window needs ctx − 1 of them, bos < vocab.
  rejects(tokens, {.ctx = 8, .stride = 8, .bos = 0}, zeros, "ctx - 1 = 7] text tokens");
  rejects(tokens, {.ctx = 22, .bos = 0}, zeros, "at least ctx - 1 = 21 tokens after BOS; got 20");
  rejects(tokens, {.ctx = 8, .bos = 10}, zeros, "bos must be in [0, 10); got 10");
}

}  // namespace
}  // namespace cider::model
