// Sampler: every filter keeps exactly the tokens its definition keeps (against a float64 reference written from the
// definitions in sampler.h, sorting the whole vocabulary), draws follow the exact probabilities (chi-square over many
// draws), the same seed gives the same tokens, and every invalid parameter or input is rejected.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/sampler.h"
#include "support/test_support.h"

namespace cider::model {
namespace {

// The definition, step by step, with a full sort: probabilities of every token of the vocabulary (0 when filtered).
std::vector<double> reference_probs(const std::vector<float>& logits, const SamplerParams& p,
                                    const std::vector<int32_t>& history) {
  const size_t V = logits.size();
  std::vector<double> z(logits.begin(), logits.end());
  const size_t start = (p.repeat_window == 0 || history.size() <= static_cast<size_t>(p.repeat_window))
                           ? 0
                           : history.size() - static_cast<size_t>(p.repeat_window);
  std::vector<bool> penalised(V, false);
  for (size_t i = start; i < history.size(); ++i) penalised[static_cast<size_t>(history[i])] = true;
  for (size_t i = 0; i < V; ++i)
    if (penalised[i]) z[i] = z[i] > 0 ? z[i] / p.repeat_penalty : z[i] * p.repeat_penalty;
  std::vector<double> prob(V, 0.0);
  if (p.temperature == 0.0) {
    size_t best = 0;
    for (size_t i = 1; i < V; ++i)
      if (z[i] > z[best]) best = i;
    prob[best] = 1.0;
    return prob;
  }
  double mx = -INFINITY;
  for (size_t i = 0; i < V; ++i) mx = std::max(mx, z[i] / p.temperature);
  double sum = 0.0;
  for (size_t i = 0; i < V; ++i) sum += (prob[i] = std::isinf(z[i]) ? 0.0 : std::exp(z[i] / p.temperature - mx));
  for (auto& x : prob) x /= sum;
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return prob[a] != prob[b] ? prob[a] > prob[b] : a < b; });
  size_t n = 0;
  while (n < V && prob[order[n]] > 0) ++n;  // the possible tokens
  if (p.top_k > 0) n = std::min(n, static_cast<size_t>(p.top_k));
  double kept = 0.0;
  for (size_t i = 0; i < n; ++i) kept += prob[order[i]];
  if (p.top_p < 1.0) {
    double cum = 0.0;
    size_t m = 0;
    while (m < n) {
      cum += prob[order[m++]] / kept;
      if (cum >= p.top_p) break;
    }
    n = m;
  }
  const double pmax = prob[order[0]];
  size_t m = 0;
  while (m < n && prob[order[m]] >= p.min_p * pmax) ++m;
  n = m;
  std::vector<double> out(V, 0.0);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += prob[order[i]];
  for (size_t i = 0; i < n; ++i) out[order[i]] = prob[order[i]] / total;
  return out;
}

std::vector<double> dense(const std::vector<TokenProb>& dist, size_t V) {
  std::vector<double> out(V, 0.0);
  for (const auto& c : dist) out[static_cast<size_t>(c.id)] = c.p;
  return out;
}

TEST(Sampler, FiltersKeepExactlyTheTokensOfTheirDefinitions) {
  auto rng = test::make_rng(1);
  const size_t V = 1000;
  const std::vector<float> logits = test::randn(rng, V, 3.0f);
  std::vector<int32_t> history;
  for (int i = 0; i < 40; ++i) history.push_back(static_cast<int32_t>(rng() % V));
  int cases = 0;
  for (double temperature : {0.0, 0.5, 1.0, 2.0})
    for (int64_t top_k : {0, 1, 5, 50, 2000})
      for (double top_p : {1.0, 0.9, 0.5, 1e-6})
        for (double min_p : {0.0, 0.05, 0.3, 1.0})
          for (double penalty : {1.0, 1.3}) {
            SamplerParams p;
            p.temperature = temperature, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
            p.repeat_penalty = penalty, p.repeat_window = 16;
            const std::vector<TokenProb> got = Sampler(p).distribution(logits.data(), static_cast<int64_t>(V), history);
            const std::vector<double> want = reference_probs(logits, p, history);
            const std::vector<double> have = dense(got, V);
            for (size_t i = 0; i < V; ++i) {
              ASSERT_EQ(have[i] > 0, want[i] > 0) << "token " << i << " T=" << temperature << " k=" << top_k
                                                  << " p=" << top_p << " min_p=" << min_p << " pen=" << penalty;
              ASSERT_NEAR(have[i], want[i], 1e-12) << "token " << i;
            }
            for (size_t i = 1; i < got.size(); ++i) ASSERT_GE(got[i - 1].p, got[i].p);  // descending
            ++cases;
          }
  EXPECT_EQ(cases, 4 * 5 * 4 * 4 * 2);
}

TEST(Sampler, FilterBoundariesByHand) {
  // Probabilities proportional to 8, 4, 2, 1, 1 (logits = ln of them): exact sums decide every boundary.
  const std::vector<float> logits = {std::log(1.0f), std::log(8.0f), std::log(2.0f), std::log(4.0f), std::log(1.0f)};
  SamplerParams p;
  p.temperature = 1.0, p.top_k = 0, p.min_p = 0.0;
  auto ids = [&](const SamplerParams& q) {
    std::vector<int32_t> out;
    for (const auto& c : Sampler(q).distribution(logits.data(), 5, {})) out.push_back(c.id);
    return out;
  };
  p.top_p = 0.49;  // 8/16 reaches it: the top token alone
  EXPECT_EQ(ids(p), (std::vector<int32_t>{1}));
  p.top_p = 0.51;  // needs 12/16
  EXPECT_EQ(ids(p), (std::vector<int32_t>{1, 3}));
  p.top_p = 0.8;  // needs 14/16
  EXPECT_EQ(ids(p), (std::vector<int32_t>{1, 3, 2}));
  p.top_p = 1.0, p.top_k = 4;  // the two tokens of probability 1/16 tie: the lower id stays
  EXPECT_EQ(ids(p), (std::vector<int32_t>{1, 3, 2, 0}));
  p.top_k = 0, p.min_p = 0.24;  // threshold 0.24 × 8/16 = 0.12: 2/16 stays, the 1/16 ones go
  EXPECT_EQ(ids(p), (std::vector<int32_t>{1, 3, 2}));
  p.min_p = 0.26;  // threshold 0.13: 2/16 goes too
  EXPECT_EQ(ids(p), (std::vector<int32_t>{1, 3}));
  p.min_p = 1.0;
  EXPECT_EQ(ids(p), (std::vector<int32_t>{1}));
}

TEST(Sampler, GreedyPicksTheLargestLogitLowestIdOnTiesAndNeverDraws) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f};
  SamplerParams p;
  p.temperature = 0.0;
  Sampler s(p);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(logits.data(), 4, {}), 1);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOnceWithinTheWindow) {
  // Greedy makes the effect visible as a change of winner.
  SamplerParams p;
  p.temperature = 0.0, p.repeat_penalty = 2.0, p.repeat_window = 0;
  const std::vector<float> pos = {2.0f, 1.5f};
  const std::vector<int32_t> h0 = {0, 0, 0};  // penalised once: 2/2 = 1 < 1.5 (three times would be 0.25 too)
  EXPECT_EQ(Sampler(p).sample(pos.data(), 2, h0), 1);
  const std::vector<float> neg = {-1.0f, -1.5f};
  const std::vector<int32_t> h1 = {0};  // -1 * 2 = -2 < -1.5
  EXPECT_EQ(Sampler(p).sample(neg.data(), 2, h1), 1);
  // Window 2: only the last two history tokens count, so token 0 (earlier) keeps its logit.
  p.repeat_window = 2;
  const std::vector<int32_t> h2 = {0, 1, 1};
  EXPECT_EQ(Sampler(p).sample(pos.data(), 2, h2), 0);
  // Exactly once: penalty 1.6 with token 0 repeated: 2/1.6 = 1.25 < 1.5 → 1; if applied twice it would not matter,
  // so check the probabilities at temperature 1 instead: p0/p1 = exp(1.25 - 1.5).
  p.temperature = 1.0, p.top_k = 0, p.top_p = 1.0, p.min_p = 0.0, p.repeat_penalty = 1.6, p.repeat_window = 0;
  const std::vector<TokenProb> d = Sampler(p).distribution(pos.data(), 2, h0);
  const std::vector<double> dd = dense(d, 2);
  EXPECT_NEAR(dd[0] / dd[1], std::exp(2.0 / 1.6 - 1.5), 1e-12);
}

// Chi-square statistic of observed counts against expected probabilities; tokens with zero probability must never
// be drawn at all.
void expect_draws_follow(Sampler& s, const std::vector<float>& logits, const std::vector<int32_t>& history,
                         const std::vector<double>& want, int draws) {
  std::vector<int64_t> count(want.size(), 0);
  for (int i = 0; i < draws; ++i) count[static_cast<size_t>(s.sample(logits.data(), static_cast<int64_t>(logits.size()), history))]++;
  double chi2 = 0.0;
  int df = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == 0.0) {
      ASSERT_EQ(count[i], 0) << "token " << i << " has probability 0 but was drawn";
      continue;
    }
    const double e = want[i] * draws;
    chi2 += (static_cast<double>(count[i]) - e) * (static_cast<double>(count[i]) - e) / e;
    ++df;
  }
  if (df == 0) {
    // The filters left one token (random logits can put the runner-up below min-p or top-p's cut): every draw must
    // be that token. The unfiltered case of the test always keeps 39 tokens, so the chi-square check always runs.
    const auto only = std::find_if(want.begin(), want.end(), [](double w) { return w > 0.0; });
    ASSERT_NE(only, want.end()) << "no token has a positive probability";
    EXPECT_EQ(count[static_cast<size_t>(only - want.begin())], draws);
    return;
  }
  ASSERT_GE(df, 1);
  // Fixed and generous: ten standard deviations of the chi-square distribution above its mean. A correct sampler
  // fails this with probability far below 1e-9; an off-by-one filter or a biased draw fails it every time.
  const double limit = df + 10.0 * std::sqrt(2.0 * df);
  EXPECT_LT(chi2, limit) << "df " << df;
}

TEST(Sampler, DrawsFollowTheExactProbabilitiesChiSquare) {
  auto rng = test::make_rng(2);
  const size_t V = 40;
  std::vector<float> logits = test::randn(rng, V, 1.5f);
  logits[7] = -std::numeric_limits<float>::infinity();  // impossible: never drawn
  const std::vector<int32_t> history = {1, 2, 3, 3, 9};
  struct Case { double t; int64_t k; double top_p, min_p, pen; };
  for (const Case& c : {Case{1.0, 0, 1.0, 0.0, 1.0}, Case{0.7, 20, 0.9, 0.02, 1.3}, Case{1.5, 0, 0.8, 0.0, 1.0},
                        Case{1.0, 8, 1.0, 0.1, 0.8}}) {
    SamplerParams p;
    p.temperature = c.t, p.top_k = c.k, p.top_p = c.top_p, p.min_p = c.min_p, p.repeat_penalty = c.pen;
    p.seed = rng();
    Sampler s(p);
    expect_draws_follow(s, logits, history, reference_probs(logits, p, history), 200000);
  }
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  auto rng = test::make_rng(3);
  const std::vector<float> logits = test::randn(rng, 500, 1.0f);
  SamplerParams p;
  p.temperature = 1.0, p.top_k = 0, p.top_p = 1.0, p.min_p = 0.0;
  p.seed = rng();
  auto run = [&](uint64_t seed) {
    SamplerParams q = p;
    q.seed = seed;
    Sampler s(q);
    std::vector<int32_t> out;
    for (int i = 0; i < 200; ++i) out.push_back(s.sample(logits.data(), 500, {}));
    return out;
  };
  EXPECT_EQ(run(p.seed), run(p.seed));
  // Near-uniform over 500 tokens: 200 equal draws by chance has probability ~ (1/100)^200.
  EXPECT_NE(run(p.seed), run(p.seed + 1));
}

// With top-k off, sample() sorts only as far as its walk goes (chunks of 256, doubling); the token must be the one a
// draw over the fully sorted distribution() picks with the same uniform number, also when the walk passes several
// chunks (a flat row of 5000 tokens) and with min-p, top-p and a penalty.
TEST(Sampler, LazyDrawEqualsTheDrawOverTheFullDistribution) {
  auto rng = test::make_rng(11);
  const int64_t V = 5000;
  const std::vector<int32_t> history = {4, 8, 15, 16, 23, 42};
  struct Case { double t, top_p, min_p, pen; float sigma; };
  for (const Case& c : {Case{1.0, 1.0, 0.0, 1.0, 0.05f}, Case{1.0, 1.0, 0.0, 1.0, 3.0f}, Case{0.8, 0.95, 0.0, 1.2, 0.5f},
                        Case{1.3, 1.0, 0.01, 1.0, 1.0f}, Case{2.0, 0.5, 0.0, 1.0, 0.05f}}) {
    SamplerParams p;
    p.temperature = c.t, p.top_k = 0, p.top_p = c.top_p, p.min_p = c.min_p, p.repeat_penalty = c.pen;
    p.seed = rng();
    Sampler lazy(p), full(p);
    SamplerRng u_rng(p.seed);
    for (int step = 0; step < 200; ++step) {
      std::vector<float> logits = test::randn(rng, static_cast<size_t>(V), c.sigma);
      logits[static_cast<size_t>(step % V)] = -std::numeric_limits<float>::infinity();
      const std::vector<TokenProb> dist = full.distribution(logits.data(), V, history);
      const double u = u_rng.uniform();
      int32_t want = dist.back().id;
      double cum = 0.0;
      for (const auto& t : dist) {
        cum += t.p;
        if (u < cum) {
          want = t.id;
          break;
        }
      }
      ASSERT_EQ(lazy.sample(logits.data(), V, history), want) << "case t=" << c.t << " top_p=" << c.top_p << " step " << step;
    }
  }
}

TEST(Sampler, UniformDrawsLieInTheUnitIntervalAndAreEvenlySpread) {
  SamplerRng r(test::test_seed());
  const int n = 100000;
  std::vector<int> bins(10, 0);
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    bins[static_cast<size_t>(u * 10)]++;
  }
  double chi2 = 0.0;
  for (int b : bins) chi2 += (b - n / 10.0) * (b - n / 10.0) / (n / 10.0);
  EXPECT_LT(chi2, 9 + 10 * std::sqrt(18.0));
}

void expect_rejected(const SamplerParams& p, const std::string& what) {
  try {
    Sampler s(p);
    ADD_FAILURE() << "accepted invalid " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("[sampler]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(Sampler, RejectsEveryParameterOutsideItsRange) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  SamplerParams p;
  for (double t : {-0.1, nan, inf}) { p = {}; p.temperature = t; expect_rejected(p, "temperature"); }
  p = {}; p.top_k = -1; expect_rejected(p, "top_k");
  for (double v : {0.0, -0.5, 1.01, nan}) { p = {}; p.top_p = v; expect_rejected(p, "top_p"); }
  for (double v : {-0.01, 1.5, nan}) { p = {}; p.min_p = v; expect_rejected(p, "min_p"); }
  for (double v : {0.0, -1.0, nan, inf}) { p = {}; p.repeat_penalty = v; expect_rejected(p, "repeat_penalty"); }
  p = {}; p.repeat_window = -1; expect_rejected(p, "repeat_window");
}

TEST(Sampler, RejectsBadLogitsAndHistory) {
  Sampler s(SamplerParams{});
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  auto rejects = [&](const std::vector<float>& l, const std::vector<int32_t>& h, int64_t vocab, const char* what) {
    try {
      s.sample(l.data(), vocab, h);
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[sample]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  rejects({0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f}, {}, 3, "nan");
  rejects({0.0f, inf, 1.0f}, {}, 3, "inf");
  rejects({-inf, -inf, -inf}, {}, 3, "all -inf");
  rejects(logits, {}, 0, "vocab 0");
  SamplerParams pen;
  pen.repeat_penalty = 1.2;
  Sampler sp(pen);
  try {
    sp.sample(logits.data(), 3, std::vector<int32_t>{0, 3});
    ADD_FAILURE() << "accepted a history id outside the vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("got 3"), std::string::npos) << e.what();
  }
}


// The greedy fast path (temperature 0, no repetition penalty: one pass over the floats) picks what the general path
// picks (penalty on, but with a history whose logits are 0, so the penalty changes nothing) over random rows with
// ties, -inf entries and large vocabularies, and rejects the same bad rows with the same messages.
TEST(Sampler, GreedyFastPathAgreesWithTheGeneralPathAndRejectsTheSameRows) {
  auto rng = test::make_rng(77);
  std::uniform_int_distribution<int> level(-6, 6), pick(0, 9);
  const float ninf = -std::numeric_limits<float>::infinity();
  SamplerParams fast_p, slow_p;
  fast_p.temperature = slow_p.temperature = 0.0;
  slow_p.repeat_penalty = 1.5;
  Sampler fast(fast_p), slow(slow_p);
  for (int64_t vocab : {1, 2, 7, 1000, 262144}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> logits(static_cast<size_t>(vocab) + 1);  // one extra slot: the history's zero logit
      for (auto& x : logits) x = pick(rng) == 0 ? ninf : 0.25f * static_cast<float>(level(rng));  // many ties
      logits[static_cast<size_t>(vocab)] = 0.0f;
      if (logits[0] == ninf) logits[0] = -1.5f;  // at least one finite logit (all -inf is rejected: below)
      const std::vector<int32_t> history = {static_cast<int32_t>(vocab)};  // penalising 0 changes nothing
      const int32_t a = fast.sample(logits.data(), vocab, history);  // penalty 1: fast path even with a history
      const int32_t b = slow.sample(logits.data(), vocab + 1, history);
      // b may only differ by picking the appended zero, which exists only in the slow row: compare the argmax.
      int32_t want = -1;
      for (int64_t i = 0; i < vocab; ++i) {
        const float x = logits[static_cast<size_t>(i)];
        if (x != ninf && (want < 0 || x > logits[static_cast<size_t>(want)])) want = static_cast<int32_t>(i);
      }
      ASSERT_EQ(a, want) << "vocab " << vocab << " trial " << trial;
      if (logits[static_cast<size_t>(want)] > 0.0f) {
        ASSERT_EQ(b, want) << "vocab " << vocab << " trial " << trial;
      }
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  auto rejects = [&](const std::vector<float>& l, const char* what) {
    try {
      fast.sample(l.data(), static_cast<int64_t>(l.size()), {});
      ADD_FAILURE() << "greedy accepted " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[sample]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  rejects({0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f}, "nan");
  rejects({0.0f, inf, 1.0f}, "inf");
  rejects({ninf, ninf, ninf}, "all -inf");
}

// ---- sampling from a device's candidates -------------------------------------------------------------------------

// The device path gives the same distribution, bit for bit, and the same draws as the full row, over random rows
// with many ties, -inf entries, penalties (window 8 / whole history) and every filter; the request asks for the
// full logits exactly when the device cannot answer.
TEST(Sampler, CandidatesFromADeviceGiveTheSameDistributionAndTokens) {
  auto rng = test::make_rng(91);
  std::uniform_int_distribution<int> level(-40, 40), pick(0, 19);
  const float ninf = -std::numeric_limits<float>::infinity();
  int compared = 0;
  for (int64_t vocab : {1, 3, 50, 1000, 5000})
    for (double temperature : {0.0, 0.7, 1.5})
      for (int64_t top_k : {1, 5, 40, 256})
        for (double penalty : {1.0, 1.3})
          for (int64_t window : {0, 8}) {
            SamplerParams p;
            p.temperature = temperature, p.top_k = top_k, p.top_p = 0.9, p.min_p = 0.02;
            p.repeat_penalty = penalty, p.repeat_window = window, p.seed = 5;
            Sampler full(p), device(p);
            std::vector<int32_t> history;
            for (int i = 0; i < 30; ++i) history.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
            for (int step = 0; step < 6; ++step) {
              std::vector<float> logits(static_cast<size_t>(vocab));
              for (auto& x : logits) x = pick(rng) == 0 ? ninf : 0.125f * static_cast<float>(level(rng));  // ties
              logits[rng() % logits.size()] = 2.0f;  // at least one finite logit
              const CandidateRequest r = device.candidate_request(vocab, history);
              ASSERT_EQ(r.k, temperature == 0.0 ? 1 : top_k);
              ASSERT_TRUE(std::is_sorted(r.excluded.begin(), r.excluded.end()));
              ASSERT_EQ(r.excluded.empty(), penalty == 1.0);
              const Candidates c = test::reference_candidates(logits, r);
              const std::vector<TokenProb> a = full.distribution(logits.data(), vocab, history);
              const std::vector<TokenProb> b = device.distribution_from_candidates(r, c, vocab);
              ASSERT_EQ(a.size(), b.size()) << "vocab " << vocab << " T " << temperature << " k " << top_k;
              for (size_t i = 0; i < a.size(); ++i) {
                ASSERT_EQ(a[i].id, b[i].id) << i;
                ASSERT_EQ(a[i].p, b[i].p) << i;  // bit for bit
              }
              const int32_t ta = full.sample(logits.data(), vocab, history);
              const int32_t tb = device.sample_candidates(r, c, vocab);
              ASSERT_EQ(ta, tb);
              history.push_back(ta);
              ++compared;
            }
          }
  EXPECT_EQ(compared, 5 * 3 * 4 * 2 * 2 * 6);
}

TEST(Sampler, CandidateRequestFallsBackToTheFullLogitsWhereTheDeviceCannotAnswer) {
  SamplerParams p;
  p.top_k = 0;  // top-k off: the softmax needs every logit
  EXPECT_EQ(Sampler(p).candidate_request(100, {}).k, 0);
  p.top_k = kDeviceTopkMax + 1;
  EXPECT_EQ(Sampler(p).candidate_request(100, {}).k, 0);
  p.top_k = kDeviceTopkMax;
  EXPECT_EQ(Sampler(p).candidate_request(100, {}).k, kDeviceTopkMax);
  p.top_k = 40, p.repeat_penalty = 1.1, p.repeat_window = 0;
  std::vector<int32_t> history;
  for (int32_t i = 0; i < kDeviceExcludedMax; ++i) history.push_back(i);
  EXPECT_EQ(Sampler(p).candidate_request(5000, history).k, 40);
  history.push_back(static_cast<int32_t>(kDeviceExcludedMax));  // one penalised token too many
  EXPECT_EQ(Sampler(p).candidate_request(5000, history).k, 0);
  history.push_back(5000);
  EXPECT_THROW((void)Sampler(p).candidate_request(5000, history), Error);  // an id outside the vocabulary
}

TEST(Sampler, CandidatesWithBadLogitsAreRejectedLikeTheFullRow) {
  SamplerParams p;
  p.repeat_penalty = 1.2;
  Sampler s(p);
  const std::vector<int32_t> history = {2};
  const float inf = std::numeric_limits<float>::infinity();
  auto rejects = [&](const std::vector<float>& logits, const char* what) {
    const CandidateRequest r = s.candidate_request(static_cast<int64_t>(logits.size()), history);
    const Candidates c = test::reference_candidates(logits, r);
    try {
      (void)s.distribution_from_candidates(r, c, static_cast<int64_t>(logits.size()));
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[sample]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  rejects({0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f}, "at token 1");
  rejects({0.0f, 1.0f, inf}, "at token 2");  // the excluded (penalised) token
  rejects({-inf, -inf, -inf}, "all -inf");
  CandidateRequest r = s.candidate_request(3, history);
  Candidates c = test::reference_candidates({0.0f, 1.0f, 2.0f}, r);
  c.ids.pop_back();  // an answer of the wrong size
  EXPECT_THROW((void)s.distribution_from_candidates(r, c, 3), Error);
}

}  // namespace
}  // namespace cider::model
