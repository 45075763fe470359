// The server's scheduler (runtime/engine.h) and protocol (runtime/openai_api.h) on the embedded model cider-tiny:
// a request's tokens equal model::generate's (the `cider generate` loop) alone and inside a batch of 8; prefix-cache
// hits give the tokens of misses; the KV bound limits the running set; a full queue refuses; a cancel frees the
// sequence; stop strings, end tokens and logprobs; the protocol's errors name the field; the prefix cache on disk
// (runtime/prompt_cache.h): a restarted engine hits with the tokens of a miss, the files stay within the pool's bound,
// another cache format's files are ignored, and the reader refuses hostile bytes; copy on take: a session copy holds
// what a trim leaves, requests sent at once all copy a pooled prefix (the entry stays, the memory accounting returns
// to the pool's bytes), and eviction under a small KV bound keeps the hit's entry or takes it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/generate.h"
#include "model/json_prefix.h"
#include "model/model.h"
#include "model/session_state.h"
#include "runtime/engine.h"
#include "runtime/openai_api.h"
#include "runtime/prompt_cache.h"
#include "support/test_support.h"

namespace {

namespace cm = cider::model;
namespace rt = cider::runtime;
using namespace std::chrono_literals;

const cm::Model& tiny() {
  static std::unique_ptr<cm::Model> m = [] {
    cm::ModelOptions o;
    o.kv = cm::default_kv(cm::Device::kCPU);
    return cm::Model::load(cider::test::repo_file("models/cider-tiny"), o);
  }();
  return *m;
}

struct Outcome {
  std::string text;
  std::vector<int32_t> tokens;  // from the logprobs (asked with top_logprobs 0)
  rt::RequestUpdate last;
};

Outcome collect(rt::Request& r) {
  Outcome o;
  for (int i = 0; i < 1800; ++i) {  // at most three minutes (sanitizer builds are slow)
    rt::RequestUpdate u = r.wait(100ms);
    o.text += u.text;
    for (const auto& l : u.logprobs) o.tokens.push_back(l.id);
    if (u.finished) {
      o.last = u;
      return o;
    }
  }
  ADD_FAILURE() << "the request did not finish within a minute";
  return o;
}

rt::RequestOptions request(const std::string& prompt, int64_t max_tokens, double temperature = 0.0, uint64_t seed = 1) {
  rt::RequestOptions o;
  o.prompt = tiny().tokenizer().encode(prompt, true);
  o.max_tokens = max_tokens;
  o.sampling.temperature = temperature;
  o.sampling.top_k = 0;
  o.sampling.top_p = 1.0;
  o.sampling.min_p = 0.0;
  o.sampling.seed = seed;
  o.end_tokens = cm::model_eos_ids(tiny());
  o.top_logprobs = 0;
  return o;
}

std::shared_ptr<rt::Request> submit(rt::Engine& e, rt::RequestOptions o) {
  std::shared_ptr<rt::Request> r;
  EXPECT_EQ(e.submit(std::move(o), r), rt::Engine::Submit::kAccepted);
  return r;
}

// What `cider generate` produces for the same request: model::generate on a fresh session.
std::vector<int32_t> generate_tokens(const rt::RequestOptions& o) {
  auto s = tiny().new_session();
  cm::ModelLogitsSource src(tiny(), *s);
  cm::TokenizerTextStream text(tiny().tokenizer(), o.prompt.back());
  cm::Sampler sampler(o.sampling);
  std::vector<int32_t> history;
  cm::GenerateOptions go;
  go.max_tokens = o.max_tokens;
  go.eos_ids = o.end_tokens;
  go.stop = o.stop;
  return cm::generate(src, text, sampler, history, o.prompt, go).tokens;
}

const std::vector<std::string> kPrompts = {
    "def fibonacci(n):", "import os\nimport sys\n", "The quick brown fox", "class Stack:\n    def __init__(self):",
    "for i in range(10):", "# Read the file\nwith open(", "Once upon a time", "return x +"};

// Logprobs of a decode step that sampled on the device (logprob_from_candidates) against the whole row, as draw()
// computes them: the candidates a device sends (the best k outside the excluded tokens by (logit desc, id asc), -1 /
// -inf past the finite ones; the excluded tokens' raw logits; the row's max and log-sum rounded to float32). The ids
// of the n best exactly; logprobs within the float32 rounding of the log-sum (0.5 ulp <= 6e-8 of its size; the max is
// a logit, exact). Rows with ties, -inf entries, excluded tokens among the best, and a row with fewer finite logits
// than k.
TEST(Engine, LogprobsFromDeviceCandidatesEqualTheWholeRows) {
  auto rng = cider::test::make_rng(23);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const int64_t V = trial % 4 == 3 ? 30 : 1000;
    std::vector<float> z(static_cast<size_t>(V));
    for (float& v : z) v = normal(rng);
    for (int64_t i = 0; i < V; i += 7) z[static_cast<size_t>(i)] = ninf;
    if (trial % 4 == 3)  // fewer finite logits than k
      for (int64_t i = 0; i < V; ++i)
        if (i % 2 == 1) z[static_cast<size_t>(i)] = ninf;
    const auto uV = static_cast<uint64_t>(V);
    for (int t = 0; t < 6; ++t) z[static_cast<size_t>(rng() % uV)] = z[static_cast<size_t>(rng() % uV)];  // ties
    const auto at = [&](int32_t id) { return z[static_cast<size_t>(id)]; };
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return at(a) > at(b); });
    cm::CandidateRequest r;
    r.k = 40;
    r.excluded = {order[0], order[3], order[static_cast<size_t>(V / 2)], 1};
    std::sort(r.excluded.begin(), r.excluded.end());
    r.excluded.erase(std::unique(r.excluded.begin(), r.excluded.end()), r.excluded.end());
    cm::Candidates c;
    for (int32_t id : order)
      if (static_cast<int64_t>(c.ids.size()) < r.k && std::isfinite(at(id)) &&
          !std::binary_search(r.excluded.begin(), r.excluded.end(), id)) {
        c.ids.push_back(id);
        c.logits.push_back(at(id));
      }
    while (static_cast<int64_t>(c.ids.size()) < r.k) c.ids.push_back(-1), c.logits.push_back(ninf);
    for (int32_t id : r.excluded) c.excluded_logits.push_back(at(id));
    const float mx = *std::max_element(z.begin(), z.end());
    double sum = 0.0;
    for (float v : z) sum += std::exp(static_cast<double>(v) - mx);
    const double lse = std::log(sum);
    c.row_max = mx;
    c.row_log_sum = static_cast<float>(lse);
    const double tol = 1e-7 * std::max(1.0, std::abs(lse));
    const int64_t n = 20;
    for (int32_t token : {order[0], order[1], order[5], c.ids[2], r.excluded.back()}) {
      const rt::TokenLogprob lp = rt::logprob_from_candidates(r, c, token, n);
      EXPECT_EQ(lp.id, token);
      const double want = static_cast<double>(at(token)) - mx - lse;
      if (std::isinf(want)) {
        EXPECT_TRUE(std::isinf(lp.logprob) && lp.logprob < 0) << lp.logprob;
      } else {
        EXPECT_NEAR(lp.logprob, want, tol) << "token " << token;
      }
      const size_t finite = static_cast<size_t>(std::count_if(z.begin(), z.end(), [](float v) { return std::isfinite(v); }));
      // The whole row's n best: its finite ones, or as many of the -inf ones as the candidates hold.
      ASSERT_GE(lp.top.size(), std::min<size_t>(static_cast<size_t>(n), finite));
      for (size_t j = 0; j < lp.top.size(); ++j) {
        if (!std::isfinite(at(order[j]))) break;
        EXPECT_EQ(lp.top[j].first, order[j]) << j;
        EXPECT_NEAR(lp.top[j].second, static_cast<double>(at(order[j])) - mx - lse, tol) << j;
      }
    }
  }
}

TEST(Engine, GreedyTokensEqualGenerateAloneAndInABatchOf8) {
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : kPrompts) want.push_back(generate_tokens(request(p, 40)));
  rt::EngineOptions eo;
  eo.max_batch = 8;
  eo.prefix_cache_entries = 0;
  rt::Engine engine(tiny(), eo);
  // Alone.
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const Outcome o = collect(*submit(engine, request(kPrompts[i], 40)));
    EXPECT_EQ(o.tokens, want[i]) << kPrompts[i];
  }
  // All eight at once: one batched forward per step.
  std::vector<std::shared_ptr<rt::Request>> rs;
  for (const auto& p : kPrompts) rs.push_back(submit(engine, request(p, 40)));
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(collect(*rs[i]).tokens, want[i]) << kPrompts[i];
  for (int i = 0; i < 60000 && engine.stats().running != 0; ++i) std::this_thread::sleep_for(1ms);
  const rt::EngineStats st = engine.stats();
  EXPECT_GT(st.batch_size.count, 0u);
  EXPECT_EQ(st.running, 0);
  // The batch held several sequences at once in some step.
  uint64_t multi = 0;
  for (size_t b = 1; b < st.batch_size.counts.size(); ++b) multi += st.batch_size.counts[b];
  EXPECT_GT(multi, 0u);
}

TEST(Engine, SampledTokensDependOnTheSeedOnlyNotOnTheBatch) {
  rt::EngineOptions eo;
  eo.prefix_cache_entries = 0;
  rt::Engine engine(tiny(), eo);
  const Outcome alone = collect(*submit(engine, request("def parse(text):", 32, 0.9, 77)));
  std::vector<std::shared_ptr<rt::Request>> rs;
  for (int i = 0; i < 6; ++i) rs.push_back(submit(engine, request(kPrompts[static_cast<size_t>(i)], 32, 0.9, 5)));
  auto again = submit(engine, request("def parse(text):", 32, 0.9, 77));
  for (auto& r : rs) (void)collect(*r);
  EXPECT_EQ(collect(*again).tokens, alone.tokens);
  EXPECT_EQ(alone.tokens, generate_tokens(request("def parse(text):", 32, 0.9, 77)));
}

// A prompt of several key blocks: a repeat and an extension reuse the pooled prefix (down to a block boundary for the
// default per-channel keys: trimming into a quantized block would round its keys again) and produce the tokens of a
// fresh run, bit for bit: the reused blocks were completed by a prompt chunk, as a fresh run completes them.
TEST(Engine, PrefixCacheHitsGiveTheTokensOfMisses) {
  std::string p = "import numpy as np\n\n";
  for (int i = 0; i < 12; ++i) p += "def f" + std::to_string(i) + "(x):\n    return np.sum(x * " + std::to_string(i) + ")\n\n";
  const auto n = static_cast<int64_t>(request(p, 1).prompt.size());
  ASSERT_GT(n, 150);
  const int64_t block = tiny().options().kv.group_size;
  ASSERT_EQ(tiny().options().kv.key_layout, cider::nn::KeyLayout::kChannel);
  rt::EngineOptions eo;
  rt::Engine engine(tiny(), eo);
  const Outcome miss = collect(*submit(engine, request(p, 24)));
  EXPECT_EQ(miss.last.cached_tokens, 0);
  EXPECT_EQ(miss.tokens, generate_tokens(request(p, 24)));
  const Outcome hit = collect(*submit(engine, request(p, 24)));
  EXPECT_EQ(hit.last.cached_tokens, (n - 1) / block * block);
  EXPECT_EQ(hit.tokens, miss.tokens);
  // The prompt extended: the shared blocks are reused, the tokens are those of a fresh run.
  const std::string longer = p + "def total(xs):\n    return sum(f0(x) for x in xs)\n";
  const Outcome ext = collect(*submit(engine, request(longer, 24)));
  EXPECT_GE(ext.last.cached_tokens, block);
  EXPECT_EQ(ext.last.cached_tokens % block, 0);
  EXPECT_EQ(ext.tokens, generate_tokens(request(longer, 24)));
  // A short common prefix (the BOS and a few tokens) does not take the pooled session away.
  const Outcome other = collect(*submit(engine, request("import os", 8)));
  EXPECT_EQ(other.last.cached_tokens, 0);
  const Outcome again = collect(*submit(engine, request(p, 24)));
  EXPECT_GT(again.last.cached_tokens, 0);
  EXPECT_EQ(again.tokens, miss.tokens);
  EXPECT_GT(engine.stats().cached_prompt_tokens, 0u);
}

// With a per-token cache any prefix is reusable (no blocks): a hit trims the pooled session to the common prefix.
TEST(Engine, PrefixCacheWithPerTokenKeysReusesAnyPrefix) {
  cm::ModelOptions o;
  o.kv = cm::parse_kv_format("k8v4");
  auto model = cm::Model::load(cider::test::repo_file("models/cider-tiny"), o);
  rt::Engine engine(*model, rt::EngineOptions{});
  const std::string p = "import numpy as np\n\ndef normalize(x):\n    \"\"\"Scale x to unit norm.\"\"\"\n";
  auto r = request(p, 16);
  const auto n = static_cast<int64_t>(r.prompt.size());
  std::shared_ptr<rt::Request> h;
  ASSERT_EQ(engine.submit(r, h), rt::Engine::Submit::kAccepted);
  const Outcome miss = collect(*h);
  ASSERT_EQ(engine.submit(r, h), rt::Engine::Submit::kAccepted);
  const Outcome hit = collect(*h);
  EXPECT_EQ(hit.last.cached_tokens, n - 1);
  EXPECT_EQ(hit.tokens, miss.tokens);
}

TEST(Engine, TheKvBoundLimitsTheRunningSequences) {
  // A per-token cache (no fixed bf16 windows): the default cache's windows (the keys' residual block, the values'
  // window and the sink, per layer and head) are a large share of cider-tiny's cache at these lengths, and the bound
  // is about growth.
  cm::ModelOptions o;
  o.kv = cm::parse_kv_format("k8v4");
  const auto model = cm::Model::load(cider::test::repo_file("models/cider-tiny"), o);
  const auto prompt = static_cast<int64_t>(request(kPrompts[0], 1).prompt.size());
  const int64_t per = rt::kv_bytes_at(*model, prompt + 200), big = rt::kv_bytes_at(*model, prompt + 1000);
  ASSERT_GT(big, 2 * per);
  rt::EngineOptions eo;
  eo.max_batch = 8;
  eo.kv_memory = 2 * per + (std::min(3 * per, big) - 2 * per) / 2;  // room for two reservations, not for a third
                                                                   // nor for one of 1000 tokens
  eo.prefix_cache_entries = 0;
  rt::Engine engine(*model, eo);
  std::vector<std::shared_ptr<rt::Request>> rs;
  for (int i = 0; i < 7; ++i) rs.push_back(submit(engine, request(kPrompts[0], 200)));
  int64_t most = 0;
  bool all_done = false;
  // Until everything ran (a few seconds; much longer under sanitizers), at most three minutes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  while (!all_done && std::chrono::steady_clock::now() < deadline) {
    const rt::EngineStats st = engine.stats();
    most = std::max(most, st.running);
    EXPECT_LE(st.kv_bytes_reserved, eo.kv_memory);
    all_done = st.running == 0 && st.waiting == 0;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(all_done);
  EXPECT_EQ(most, 2);
  for (auto& r : rs) EXPECT_EQ(collect(*r).last.reason, rt::FinishReason::kLength);
  // A request whose reservation alone exceeds the bound is refused at once, naming the numbers.
  std::shared_ptr<rt::Request> r;
  try {
    (void)engine.submit(request(kPrompts[0], 1000), r);
    ADD_FAILURE() << "no error";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), cider::ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("KV memory"), std::string::npos) << e.what();
  }
}

TEST(Engine, AFullQueueRefusesAndACancelFreesTheSequence) {
  rt::EngineOptions eo;
  eo.max_batch = 1;
  eo.max_waiting = 0;
  eo.prefix_cache_entries = 0;
  rt::Engine engine(tiny(), eo);
  auto a = submit(engine, request(kPrompts[1], 900));
  // Wait until a runs, then b is refused: no room in the batch, none in the queue.
  for (int i = 0; i < 60000 && engine.stats().running == 0; ++i) std::this_thread::sleep_for(1ms);
  std::shared_ptr<rt::Request> b;
  EXPECT_EQ(engine.submit(request(kPrompts[2], 4), b), rt::Engine::Submit::kBusy);
  EXPECT_EQ(b, nullptr);
  a->cancel();
  const Outcome o = collect(*a);
  EXPECT_EQ(o.last.reason, rt::FinishReason::kCancelled);
  EXPECT_LT(o.last.completion_tokens, 900);
  for (int i = 0; i < 60000 && engine.stats().running != 0; ++i) std::this_thread::sleep_for(1ms);
  const rt::EngineStats st = engine.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.kv_bytes_in_use, 0);  // no prefix cache: nothing kept
  EXPECT_EQ(st.requests_cancelled, 1u);
  EXPECT_EQ(st.requests_refused, 1u);
  // drain(): refuses new requests afterwards.
  EXPECT_TRUE(engine.drain(1s));
  EXPECT_EQ(engine.submit(request(kPrompts[2], 4), b), rt::Engine::Submit::kDraining);
}

TEST(Engine, StopStringsEndTokensAndLogprobs) {
  rt::Engine engine(tiny(), rt::EngineOptions{});
  const Outcome full = collect(*submit(engine, request(kPrompts[0], 40)));
  ASSERT_GT(full.text.size(), 12u);
  // A stop string from the middle of the greedy text: the text ends right before it.
  const std::string stop = full.text.substr(full.text.size() / 2, 4);
  auto o = request(kPrompts[0], 40);
  o.stop = {stop};
  const Outcome cut = collect(*submit(engine, o));
  EXPECT_EQ(cut.last.reason, rt::FinishReason::kStop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  // The third greedy token as an end token: two tokens of text, then stop (the end token counted, not emitted).
  ASSERT_GE(full.tokens.size(), 3u);
  o = request(kPrompts[0], 40);
  o.end_tokens = {full.tokens[2]};
  if (full.tokens[0] != full.tokens[2] && full.tokens[1] != full.tokens[2]) {
    const Outcome e = collect(*submit(engine, o));
    EXPECT_EQ(e.last.reason, rt::FinishReason::kStop);
    EXPECT_EQ(e.last.completion_tokens, 3);
    EXPECT_EQ(e.text, tiny().tokenizer().decode({full.tokens[0], full.tokens[1]}, true));
  }
  // Logprobs: greedy picks the most probable token, log-probabilities are <= 0 and descending.
  o = request(kPrompts[3], 12);
  o.top_logprobs = 5;
  auto r = submit(engine, o);
  std::vector<rt::TokenLogprob> lps;
  for (int i = 0; i < 1800; ++i) {
    auto u = r->wait(100ms);
    for (auto& l : u.logprobs) lps.push_back(l);
    if (u.finished) break;
  }
  ASSERT_EQ(lps.size(), 12u);
  for (const auto& l : lps) {
    ASSERT_EQ(l.top.size(), 5u);
    EXPECT_EQ(l.top[0].first, l.id);
    EXPECT_DOUBLE_EQ(l.top[0].second, l.logprob);
    EXPECT_LE(l.logprob, 0.0);
    for (size_t k = 1; k < 5; ++k) EXPECT_LE(l.top[k].second, l.top[k - 1].second);
    double mass = 0.0;
    for (const auto& t : l.top) mass += std::exp(t.second);
    EXPECT_LE(mass, 1.0 + 1e-9);
  }
  const std::string m = engine.metrics_text();
  for (const char* name : {"cider_requests_total{outcome=\"finished\"}", "cider_generation_tokens_total",
                           "cider_time_to_first_token_seconds_bucket{le=\"+Inf\"}",
                           "cider_inter_token_latency_seconds_count", "cider_kv_bytes_in_use",
                           "cider_step_forward_seconds_bucket{le=\"+Inf\"}", "cider_step_host_seconds_count"})
    EXPECT_NE(m.find(name), std::string::npos) << name;
}

// response_format json_object (RequestOptions::json = JsonSchema::any_object()): every reply is a prefix of a JSON object text, whole and
// parsed by nlohmann when it ends with "stop"; the sequence ends the moment the object closes (a bias toward '{' and
// '}' makes that "{}" in two tokens); the logprobs stay the model's own (the sampled token's logprob is finite).
TEST(Engine, JsonObjectRepliesAreJsonObjects) {
  rt::Engine engine(tiny(), rt::EngineOptions{});
  const cm::Tokenizer& tok = tiny().tokenizer();
  int stopped = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    auto o = request(kPrompts[seed % kPrompts.size()], 48, 0.9, seed);
    o.json = cm::JsonSchema::any_object();
    const Outcome r = collect(*submit(engine, o));
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + r.text);
    cm::JsonPrefix p;
    EXPECT_TRUE(p.feed(r.text));
    if (r.last.reason == rt::FinishReason::kStop) {
      ++stopped;
      EXPECT_TRUE(p.complete());
      ASSERT_TRUE(nlohmann::json::accept(r.text));
      EXPECT_TRUE(nlohmann::json::parse(r.text).is_object());
    } else {
      EXPECT_EQ(r.last.reason, rt::FinishReason::kLength);
      EXPECT_FALSE(p.complete());
      EXPECT_EQ(r.last.completion_tokens, 48);
    }
  }
  // Closed as soon as possible: '{' and '}' favoured, the whole reply is the empty object in two tokens.
  const std::vector<int32_t> open = tok.encode("{", false), close = tok.encode("}", false);
  ASSERT_EQ(open.size(), 1u);
  ASSERT_EQ(close.size(), 1u);
  auto o = request(kPrompts[0], 40, 0.0);
  o.json = cm::JsonSchema::any_object();
  o.logit_bias = {{open[0], 60.0f}, {close[0], 50.0f}};
  const Outcome r = collect(*submit(engine, o));
  EXPECT_EQ(r.text, "{}");
  EXPECT_EQ(r.last.reason, rt::FinishReason::kStop);
  EXPECT_EQ(r.last.completion_tokens, 2);
  ASSERT_EQ(r.tokens.size(), 2u);
  EXPECT_EQ(r.tokens[0], open[0]);
  // Without the constraint the same bias gives '{' then '{' again (the larger bias), so the constraint decided.
  o.json = nullptr;
  o.max_tokens = 2;
  EXPECT_EQ(collect(*submit(engine, o)).text, "{{");
  RecordProperty("json_replies_completed", stopped);
  // A schema (response_format json_schema): the replies that close are objects with exactly its required keys' types.
  const auto schema = cm::JsonSchema::compile(nlohmann::json::parse(
      R"({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"], "additionalProperties": false})"));
  int closed = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto q = request(kPrompts[seed % kPrompts.size()], 48, 0.9, seed);
    q.json = schema;
    const Outcome a = collect(*submit(engine, q));
    SCOPED_TRACE("schema, seed " + std::to_string(seed) + ": " + a.text);
    cm::JsonPrefix p(schema.get());
    EXPECT_TRUE(p.feed(a.text));
    if (a.last.reason != rt::FinishReason::kStop) continue;
    ++closed;
    const nlohmann::json v = nlohmann::json::parse(a.text);
    ASSERT_TRUE(v.is_object());
    EXPECT_EQ(v.size(), 2u);
    EXPECT_TRUE(v.at("ok").is_boolean());
    EXPECT_TRUE(v.at("n").is_number_integer());
  }
  EXPECT_GT(closed, 0);
}

TEST(Engine, SubmitRefusesBadRequestsNamingTheValue) {
  rt::Engine engine(tiny(), rt::EngineOptions{});
  std::shared_ptr<rt::Request> r;
  const auto refused = [&](rt::RequestOptions o, const std::string& needle) {
    try {
      (void)engine.submit(std::move(o), r);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const cider::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto o = request("x", 4);
  o.max_tokens = 0;
  refused(o, "max_tokens must be >= 1; got 0");
  o = request("x", 4);
  o.prompt.assign(static_cast<size_t>(tiny().context_length()), 5);
  refused(o, "got 1024 prompt tokens");
  o = request("x", 4);
  o.prompt.push_back(static_cast<int32_t>(tiny().config().vocab_size));
  refused(o, "prompt token ids must be in");
  o = request("x", 4);
  o.presence_penalty = 3.0;
  refused(o, "presence_penalty must be in [-2, 2]; got 3");
  o = request("x", 4);
  o.stop = {""};
  refused(o, "stop strings must not be empty");
}

TEST(OpenAIApi, ParsesRequestsAndNamesTheBadField) {
  const rt::OpenAIApi api(tiny(), "cider-tiny", cm::ChatFormat::kRaw);
  const rt::ApiRequest c = api.parse(R"({"prompt": "def f(x):", "max_tokens": 7, "temperature": 0, "stop": "\n",
                                         "seed": 3, "unknown_field": [1, 2]})",
                                     rt::Endpoint::kCompletions);
  EXPECT_EQ(c.options.max_tokens, 7);
  EXPECT_EQ(c.options.sampling.temperature, 0.0);
  EXPECT_EQ(c.options.sampling.seed, 3u);
  EXPECT_EQ(c.options.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(c.options.prompt, tiny().tokenizer().encode("def f(x):", true));
  const rt::ApiRequest d = api.parse(R"({"prompt": [5, 6, 7]})", rt::Endpoint::kCompletions);
  EXPECT_EQ(d.options.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(d.options.max_tokens, 16);  // OpenAI's default for completions
  const rt::ApiRequest ch = api.parse(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true,
                                          "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true}})",
                                      rt::Endpoint::kChat);
  EXPECT_EQ(ch.options.top_logprobs, 2);
  EXPECT_TRUE(ch.stream && ch.include_usage);
  EXPECT_EQ(ch.options.max_tokens, tiny().context_length() - static_cast<int64_t>(ch.options.prompt.size()));

  const auto bad = [&](const std::string& body, rt::Endpoint ep, const std::string& needle) {
    try {
      (void)api.parse(body, ep);
      ADD_FAILURE() << "no error for " << body;
    } catch (const rt::ApiError& e) {
      EXPECT_EQ(e.status(), 400);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(e.body().find("invalid_request_error"), std::string::npos);
    }
  };
  const auto C = rt::Endpoint::kCompletions;
  bad("{not json", C, "must be JSON");
  bad("[1, 2]", C, "must be a JSON object");
  bad(R"({"prompt": "x", "temperature": "hot"})", C, "'temperature' must be a number; got \"hot\"");
  bad(R"({"prompt": "x", "temperature": 3})", C, "'temperature' must be in [0, 2]; got 3");
  bad(R"({"prompt": "x", "max_tokens": -1})", C, "'max_tokens' must be in [1,");
  bad(R"({"prompt": "x", "stop": 5})", C, "'stop' must be a string or a list");
  bad(R"({"prompt": "x", "n": 2})", C, "'n' must be 1");
  bad(R"({"prompt": "x", "logit_bias": {"abc": 1}})", C, "'logit_bias' keys must be token ids");
  bad(R"({"prompt": {"a": 1}})", C, "'prompt' must be a string");
  bad(R"({"max_tokens": 3})", C, "'prompt' is required");
  bad(R"({"messages": []})", rt::Endpoint::kChat, "'messages' must be a non-empty list");
  bad(R"({"messages": [{"role": "robot", "content": "x"}]})", rt::Endpoint::kChat, "'messages[0].role' must be");
  bad(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", rt::Endpoint::kChat,
      "'tools[0]' must be {\"type\": \"function\"");
  std::string long_prompt;
  for (int i = 0; i < 3000; ++i) long_prompt += "word ";
  bad(R"({"prompt": ")" + long_prompt + "\"}", C, "the context is 1024 tokens");
}

// The model's own chat template: read from tokenizer_config.json by the loader, rendered by the protocol layer as
// transformers renders it (the prompt encoded without adding special tokens: the template writes them), with the
// request's chat_template_kwargs; a template that raises is a 400 carrying its message.
TEST(OpenAIApi, ChatPromptsFromTheModelsTemplate) {
  namespace fs = std::filesystem;
  const fs::path src = cider::test::repo_file("models/cider-tiny");
  const fs::path dir = fs::temp_directory_path() / ("cider_tiny_template_" + std::to_string(cider::test::test_seed()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"})
    fs::copy_file(src / f, dir / f);
  const std::string tmpl =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
      "You are helpful.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}, "chat_template": ")" << tmpl << "\"}";
  auto model = cm::Model::load(dir.string(), cm::ModelOptions{});
  fs::remove_all(dir);
  ASSERT_FALSE(model->chat_template().empty());
  EXPECT_EQ(model->eos_token(), "<|end_of_text|>");
  EXPECT_EQ(model->bos_token(), "<|begin_of_text|>");
  const rt::OpenAIApi api(*model, "t", cm::ChatFormat::kRaw, cm::ChatTemplate(model->chat_template()));
  const rt::ApiRequest r = api.parse(R"({"messages": [{"role": "user", "content": "Hi"}]})", rt::Endpoint::kChat);
  EXPECT_EQ(r.options.prompt, model->tokenizer().encode("<|im_start|>system\nYou are helpful.<|im_end|>\n"
                                                        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
                                                        false));
  const rt::OpenAIApi kw(*model, "t", cm::ChatFormat::kRaw,
                         cm::ChatTemplate("{{ greeting }}{% for m in messages %}{{ m.content }}{% endfor %}"));
  EXPECT_EQ(kw.parse(R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"greeting": "Hello "}})",
                     rt::Endpoint::kChat)
                .options.prompt,
            model->tokenizer().encode("Hello hi", false));
  const rt::OpenAIApi raising(*model, "t", cm::ChatFormat::kRaw,
                              cm::ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}"));
  try {
    (void)raising.parse(R"({"messages": [{"role": "user", "content": "hi"}]})", rt::Endpoint::kChat);
    ADD_FAILURE() << "no error";
  } catch (const rt::ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos) << e.what();
  }
}

}  // namespace

// tests/data/hf_fixtures/gemma3 (window 8 on two of three layers) copied with a 4096-token context and cider-tiny's
// tokenizer (whose 4096 tokens cover its 512), float32 weights and cache.
static std::unique_ptr<cm::Model> window_model() {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("cider_engine_window_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(cider::test::repo_file("tests/data/hf_fixtures/gemma3")))
    fs::copy(e.path(), dir / e.path().filename());
  fs::copy(cider::test::repo_file("models/cider-tiny/tokenizer.json"), dir / "tokenizer.json");
  {
    std::ifstream in(dir / "config.json");
    std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string key = "\"max_position_embeddings\": ";
    const size_t at = cfg.find(key);
    EXPECT_NE(at, std::string::npos);
    if (at != std::string::npos)
      cfg.replace(at + key.size(), cfg.find_first_of(",\n}", at + key.size()) - (at + key.size()), "4096");
    std::ofstream(dir / "config.json") << cfg;
  }
  cm::ModelOptions mo;
  mo.weights = cm::WeightFormat::kF32;
  mo.kv = cm::parse_kv_format("f32");
  auto model = cm::Model::load(dir.string(), mo);
  fs::remove_all(dir);
  return model;
}

// A model whose sliding-window layers keep only their window (window_model): a pooled session that dropped the
// positions a shorter shared prefix needs is a miss (its tokens those of a fresh run), one extended by the new prompt
// is a hit.
TEST(Engine, APooledSessionWhoseWindowDroppedThePrefixIsAMiss) {
  auto model = window_model();
  ASSERT_EQ(model->config().sliding_window, 8);
  auto req = [](std::vector<int32_t> prompt) {
    rt::RequestOptions o;
    o.prompt = std::move(prompt);
    o.max_tokens = 4;
    o.sampling.temperature = 0.0;
    o.top_logprobs = 0;
    return o;
  };
  auto fresh = [&](const rt::RequestOptions& o) {
    auto s = model->new_session();
    const int64_t V = model->config().vocab_size;
    std::vector<float> logits(static_cast<size_t>(V));
    model->forward(*s, o.prompt.data(), static_cast<int64_t>(o.prompt.size()), logits.data(), false);
    std::vector<int32_t> out;
    for (int64_t i = 0; i < o.max_tokens; ++i) {
      out.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      model->forward(*s, &out.back(), 1, logits.data(), false);
    }
    return out;
  };
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 700; ++i) long_prompt.push_back(3 + (i * 37) % 500);
  rt::EngineOptions eo;
  rt::Engine engine(*model, eo);
  const Outcome first = collect(*submit(engine, req(long_prompt)));
  EXPECT_EQ(first.tokens, fresh(req(long_prompt)));
  // Shares 100 tokens, but the pooled session's sliding layers kept only the last few hundred positions: a miss.
  std::vector<int32_t> diverging(long_prompt.begin(), long_prompt.begin() + 100);
  for (int i = 0; i < 50; ++i) diverging.push_back(3 + (i * 11) % 500);
  const Outcome miss = collect(*submit(engine, req(diverging)));
  EXPECT_EQ(miss.last.cached_tokens, 0);
  EXPECT_EQ(miss.tokens, fresh(req(diverging)));
  // The long prompt extended: its whole prompt is reusable (a trim of the few generated positions at most).
  std::vector<int32_t> extended = long_prompt;
  for (int i = 0; i < 20; ++i) extended.push_back(3 + (i * 13) % 500);
  const Outcome hit = collect(*submit(engine, req(extended)));
  EXPECT_GE(hit.last.cached_tokens, 690);
  EXPECT_EQ(hit.tokens, fresh(req(extended)));
}

// ---- the prefix cache on disk (runtime/prompt_cache.h) ------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("cider_engine_" + tag + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::vector<std::string> cache_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Warnings collected from any thread (the store's writer thread warns too).
struct Warnings {
  std::mutex mu;
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      lines.push_back(m);
    };
  }
};

std::string code_prompt() {
  std::string p = "import numpy as np\n\n";
  for (int i = 0; i < 12; ++i) p += "def f" + std::to_string(i) + "(x):\n    return np.sum(x * " + std::to_string(i) + ")\n\n";
  return p;
}

// Waits until the finished requests' sessions joined the pool (the end of the engine's step: their reservations
// released under the same lock, so nothing is reserved beyond the pool's bytes), then for their files.
void settle(rt::Engine& e, int64_t pooled) {
  const auto busy = [&] {
    const rt::EngineStats st = e.stats();
    return st.pooled < pooled || st.running != 0 || st.kv_bytes_reserved != st.kv_bytes_pooled;
  };
  for (int i = 0; i < 60000 && busy(); ++i) std::this_thread::sleep_for(1ms);
  e.flush_prompt_cache();
}

}  // namespace

// Pooled sessions are written as they join the pool; a new engine on the same directory loads them, and a repeated
// prompt hits them with the tokens of the first engine's miss (bit for bit: the blocks were completed by a prompt
// chunk). A hit copies the entry, which stays with its file; the files never outnumber prefix_cache_entries; a smaller
// bound at start loads the newest and deletes the rest.
TEST(EnginePromptCache, ARestartedEngineHitsWithTheTokensOfAMiss) {
  TempDir dir("prompt_cache");
  Warnings warnings;
  const std::string p = code_prompt();
  const auto n = static_cast<int64_t>(request(p, 1).prompt.size());
  const int64_t block = tiny().options().kv.group_size;
  rt::EngineOptions eo;
  eo.prompt_cache_dir = dir.path.string();
  eo.warn = warnings.sink();
  Outcome miss;
  {
    rt::Engine engine(tiny(), eo);
    EXPECT_EQ(engine.stats().prompt_cache_loaded, 0);
    miss = collect(*submit(engine, request(p, 24)));
    EXPECT_EQ(miss.last.cached_tokens, 0);
    settle(engine, 1);
    EXPECT_EQ(cache_files(dir.path).size(), 1u);
  }
  EXPECT_EQ(miss.tokens, generate_tokens(request(p, 24)));
  std::vector<std::string> before = cache_files(dir.path);
  {
    rt::Engine engine(tiny(), eo);
    EXPECT_EQ(engine.stats().prompt_cache_loaded, 1);
    EXPECT_EQ(engine.stats().pooled, 1);
    const Outcome hit = collect(*submit(engine, request(p, 24)));
    EXPECT_EQ(hit.last.cached_tokens, (n - 1) / block * block);
    EXPECT_EQ(hit.tokens, miss.tokens);
    settle(engine, 1);
    // Copied, not taken: the entry stayed in the pool, so its file stays; the finished request held the same tokens,
    // so it did not join the pool beside it (one entry per prefix) and wrote no file.
    EXPECT_EQ(engine.stats().pooled, 1);
    EXPECT_EQ(cache_files(dir.path), before);
    // More distinct prompts than entries: the files follow the pool.
    eo.prefix_cache_entries = 2;
  }
  {
    rt::Engine engine(tiny(), eo);  // prefix_cache_entries 2
    EXPECT_EQ(engine.stats().prompt_cache_loaded, 1);
    for (size_t i = 0; i < 4; ++i) (void)collect(*submit(engine, request(kPrompts[i] + p, 4)));
    settle(engine, 2);
    EXPECT_EQ(engine.stats().pooled, 2);
    EXPECT_EQ(cache_files(dir.path).size(), 2u);
  }
  eo.prefix_cache_entries = 1;
  {
    rt::Engine engine(tiny(), eo);
    EXPECT_EQ(engine.stats().prompt_cache_loaded, 1);
    EXPECT_EQ(cache_files(dir.path).size(), 1u);  // the older one deleted
    // The newest was kPrompts[3]'s.
    const Outcome again = collect(*submit(engine, request(kPrompts[3] + p, 4)));
    EXPECT_GT(again.last.cached_tokens, 0);
  }
  std::lock_guard<std::mutex> lock(warnings.mu);
  EXPECT_TRUE(warnings.lines.empty()) << warnings.lines.front();
}

// Files of another cache format (the identity covers it), junk under an entry's name and leftover temporary files:
// each ignored file gets one warning naming it and its reason and stays (the temporary one is removed); nothing is
// loaded from them.
TEST(EnginePromptCache, FilesOfAnotherFormatOrCorruptAreIgnoredWithAWarning) {
  TempDir dir("prompt_cache_foreign");
  Warnings warnings;
  rt::EngineOptions eo;
  eo.prompt_cache_dir = dir.path.string();
  eo.warn = warnings.sink();
  {
    rt::Engine engine(tiny(), eo);
    (void)collect(*submit(engine, request(code_prompt(), 4)));
    settle(engine, 1);
  }
  const std::vector<std::string> written = cache_files(dir.path);
  ASSERT_EQ(written.size(), 1u);
  std::ofstream(dir.path / "00000000000000aa.cpc") << "not a cache file at all";
  std::ofstream(dir.path / "00000000000000ab.cpc.Xy12Zq") << "an interrupted write";
  cm::ModelOptions o;
  o.kv = cm::parse_kv_format("k8v4");
  auto other = cm::Model::load(cider::test::repo_file("models/cider-tiny"), o);
  {
    rt::Engine engine(*other, eo);
    EXPECT_EQ(engine.stats().prompt_cache_loaded, 0);
    EXPECT_EQ(engine.stats().pooled, 0);
    const Outcome r = collect(*submit(engine, request(code_prompt(), 4)));
    EXPECT_EQ(r.last.cached_tokens, 0);
  }
  std::lock_guard<std::mutex> lock(warnings.mu);
  ASSERT_EQ(warnings.lines.size(), 2u);
  bool magic = false, model = false;
  for (const std::string& w : warnings.lines) {
    magic = magic || (w.find("00000000000000aa.cpc") != std::string::npos && w.find("magic") != std::string::npos);
    model = model || (w.find(written[0]) != std::string::npos && w.find("another model") != std::string::npos);
  }
  EXPECT_TRUE(magic && model) << warnings.lines[0] << "\n" << warnings.lines[1];
  const std::vector<std::string> left = cache_files(dir.path);
  EXPECT_EQ(std::count(left.begin(), left.end(), written[0]), 1);  // another model's: kept
  EXPECT_EQ(std::count(left.begin(), left.end(), "00000000000000ab.cpc.Xy12Zq"), 0);
}

// The reader on hostile bytes: a good file round-trips (the session continues as the original); every truncation,
// a flipped byte anywhere, a wrong magic, version or identity, and fields rewritten with a valid checksum (a position
// past the context, a layer count, a seed, a length, a plane size, a token id, an outlier channel index) are each
// refused with their reason, without a crash or an allocation of what they claim.
TEST(EnginePromptCache, TheReaderRefusesHostileBytes) {
  const cm::Model& m = tiny();
  const uint64_t id = rt::model_identity(m, "");
  const std::vector<int32_t> tokens = request(code_prompt(), 1).prompt;
  const auto n = static_cast<int64_t>(tokens.size());
  ASSERT_GT(n, 128);  // complete key blocks, with outlier channels
  ASSERT_GT(m.options().kv.key_outliers, 0);
  const int64_t V = m.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V)), again(static_cast<size_t>(V));
  auto s = m.new_session();
  m.forward(*s, tokens.data(), n, logits.data(), false);
  const std::string good = rt::encode_entry(tokens, m.snapshot(*s), id, 7);
  ASSERT_LE(static_cast<int64_t>(good.size()), rt::max_file_bytes(m));

  std::vector<int32_t> got;
  std::unique_ptr<cm::Session> restored;
  ASSERT_EQ(rt::decode_entry(good, m, id, got, restored), "");
  EXPECT_EQ(got, tokens);
  ASSERT_EQ(restored->position(), n);
  const int32_t next = 42;
  m.forward(*s, &next, 1, logits.data(), false);
  m.forward(*restored, &next, 1, again.data(), false);
  EXPECT_EQ(std::memcmp(logits.data(), again.data(), logits.size() * sizeof(float)), 0);

  const auto refused = [&](const std::string& bytes, const std::string& words, const std::string& what) {
    got.clear();
    restored.reset();
    const std::string r = rt::decode_entry(bytes, m, id, got, restored);
    EXPECT_NE(r.find(words), std::string::npos) << what << ": " << r;
    EXPECT_EQ(restored, nullptr) << what;
  };
  for (size_t len : {size_t{0}, size_t{5}, size_t{8}, size_t{47}, size_t{48}, size_t{60}, good.size() / 2,
                     good.size() - 1})
    refused(good.substr(0, len), len < 8 ? "magic" : "truncated", "truncated to " + std::to_string(len));
  refused(good + 'x', "trailing", "one byte more");
  for (size_t at = rt::kHeaderBytes; at < good.size(); at += 997) {
    std::string b = good;
    b[at] = static_cast<char>(b[at] ^ 0x10);
    refused(b, "checksum", "byte " + std::to_string(at) + " flipped");
  }
  const auto flipped = [&](size_t at) {
    std::string b = good;
    b[at] = static_cast<char>(b[at] ^ 0x01);
    return b;
  };
  refused(flipped(0), "magic", "magic");
  refused(flipped(8), "version", "version");
  refused(flipped(16), "another model", "identity");
  refused(flipped(24), "truncated", "payload size");
  refused(flipped(32), "checksum", "checksum");
  EXPECT_NE(rt::decode_entry(good, m, id + 1, got, restored).find("another model"), std::string::npos);

  // Fields rewritten and the checksum recomputed: what a bug or a forger could write.
  const auto reseal = [](std::string b) {
    const uint64_t c = rt::fnv1a64(b.data() + rt::kHeaderBytes, b.size() - rt::kHeaderBytes);
    std::memcpy(b.data() + 32, &c, 8);
    return b;
  };
  const auto set = [&](size_t at, auto v) {
    std::string b = good;
    std::memcpy(b.data() + at, &v, sizeof v);
    return reseal(b);
  };
  const auto read64 = [&](size_t at) {
    int64_t v = 0;
    std::memcpy(&v, good.data() + at, 8);
    return v;
  };
  // Payload offsets (runtime/prompt_cache.h): position, tokens, layer count, then layer 0's cache.
  const size_t tokens_at = rt::kHeaderBytes + 8, layers_at = tokens_at + 4 * static_cast<size_t>(n);
  const size_t layer0 = layers_at + 8, seed_at = layer0 + 2 + 8 * 4, length_at = seed_at + 8 + 4 * 8;
  const size_t planes_at = seed_at + 8 + 7 * 8, plane0_at = planes_at + 8;
  ASSERT_EQ(read64(layers_at), m.config().num_layers);
  ASSERT_EQ(read64(length_at), n);
  refused(set(rt::kHeaderBytes, int64_t{1} << 40), "position must be in", "position past the context");
  refused(set(tokens_at, static_cast<int32_t>(V)), "token ids", "token id");
  refused(set(layers_at, int64_t{3}), "layers", "layer count");
  refused(set(seed_at, uint64_t{12345}), "format differs", "seed");
  refused(set(length_at, n - 1), "positions", "length");
  refused(set(planes_at, int64_t{1000}), "planes", "plane count");
  refused(set(plane0_at, int64_t{1} << 50), "claims", "plane size");
  {  // plane 0 four bytes short, its size field agreeing: the snapshot's own check against the metadata
    std::string b = good;
    const int64_t size = read64(plane0_at) - 4;
    std::memcpy(b.data() + plane0_at, &size, 8);
    b.erase(plane0_at + 8, 4);
    const uint64_t payload = b.size() - rt::kHeaderBytes;
    std::memcpy(b.data() + 24, &payload, 8);
    refused(reseal(b), "plane 0 must hold", "plane 0 short");
  }
  // Plane 8, the outlier channel indices (uint16, ascending, < Dk): block 0's first one past the row.
  size_t at = plane0_at;
  for (int p = 0; p < 8; ++p) at += 8 + static_cast<size_t>(read64(at));
  refused(set(at + 8, static_cast<uint16_t>(m.config().head_dim)), "outlier channel", "outlier index");
}

// A sliding-window session (window_model: its caches dropped old positions) comes back whole: the restored session
// continues with the original's logits.
TEST(EnginePromptCache, ASlidingWindowSessionComesBackWhole) {
  auto model = window_model();
  const uint64_t id = rt::model_identity(*model, "");
  std::vector<int32_t> tokens;
  for (int i = 0; i < 700; ++i) tokens.push_back(3 + (i * 37) % 500);
  const auto V = static_cast<size_t>(model->config().vocab_size);
  std::vector<float> a(V), b(V);
  auto s = model->new_session();
  model->forward(*s, tokens.data(), static_cast<int64_t>(tokens.size()), a.data(), false);
  const cm::SessionState st = model->snapshot(*s);
  bool dropped = false;
  for (const auto& c : st.caches) dropped = dropped || c.meta().start > 0;
  ASSERT_TRUE(dropped);
  std::vector<int32_t> got;
  std::unique_ptr<cm::Session> restored;
  ASSERT_EQ(rt::decode_entry(rt::encode_entry(tokens, st, id, 1), *model, id, got, restored), "");
  for (int32_t t : {5, 77, 300, 12}) {
    model->forward(*s, &t, 1, a.data(), false);
    model->forward(*restored, &t, 1, b.data(), false);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), V * sizeof(float)), 0) << t;
  }
}

// ---- the prefix cache shared between running sequences (copy on take) ------------------------------------------

namespace {

// Model::copy_session(s, n) holds what s holds after trim(s.position() − n), bit for bit, and leaves s as it was; the
// copy and the trimmed session continue with the same logits. Cut inside the residual window, at a block boundary
// and inside a quantized block (per-channel keys with outlier channels: the cider-tiny default), with per-token keys,
// and on a model whose sliding-window caches dropped positions.
void check_copies(const cm::Model& m, const std::vector<int32_t>& tokens, const std::vector<int64_t>& cuts,
                  const std::string& what) {
  ASSERT_TRUE(m.can_copy_sessions());
  const auto V = static_cast<size_t>(m.config().vocab_size);
  std::vector<float> a(V), b(V);
  auto s = m.new_session();
  m.forward(*s, tokens.data(), static_cast<int64_t>(tokens.size()), a.data(), false);
  const cm::SessionState before = m.snapshot(*s);
  for (int64_t cut : cuts) {
    const std::string at = what + " cut " + std::to_string(cut);
    ASSERT_TRUE(s->can_truncate(cut)) << at;
    auto copy = m.copy_session(*s, cut);
    EXPECT_EQ(copy->position(), cut) << at;
    cider::test::expect_same_state(m.snapshot(*s), before, at + " (the original)", /*linear_contents=*/false);
    auto trimmed = m.restore_session(before);
    trimmed->trim(trimmed->position() - cut);
    cider::test::expect_same_state(m.snapshot(*copy), m.snapshot(*trimmed), at, /*linear_contents=*/false);
    for (int32_t t : {5, 77, 300}) {
      m.forward(*copy, &t, 1, a.data(), false);
      m.forward(*trimmed, &t, 1, b.data(), false);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), V * sizeof(float)), 0) << at << " token " << t;
    }
  }
}

}  // namespace

TEST(EngineSessionCopy, ACopyHoldsWhatATrimLeaves) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 300; ++i) tokens.push_back(3 + (i * 37) % 500);
  const int64_t block = tiny().options().kv.group_size;
  ASSERT_EQ(tiny().options().kv.key_layout, cider::nn::KeyLayout::kChannel);
  ASSERT_GT(tiny().options().kv.key_outliers, 0);
  check_copies(tiny(), tokens, {299, 4 * block, 2 * block, block + 17, 20, 0}, "per-channel keys");
  cm::ModelOptions o;
  o.kv = cm::parse_kv_format("k8v4");
  auto per_token = cm::Model::load(cider::test::repo_file("models/cider-tiny"), o);
  check_copies(*per_token, tokens, {299, 150, 1}, "per-token keys");
  auto window = window_model();
  std::vector<int32_t> long_tokens;
  for (int i = 0; i < 700; ++i) long_tokens.push_back(3 + (i * 37) % 500);
  check_copies(*window, long_tokens, {700, 699, 695}, "sliding window");
  // Further back than the window reaches: refused, naming the rule and the value.
  auto s = window->new_session();
  std::vector<float> logits(static_cast<size_t>(window->config().vocab_size));
  window->forward(*s, long_tokens.data(), 700, logits.data(), false);
  ASSERT_FALSE(s->can_truncate(100));
  try {
    (void)window->copy_session(*s, 100);
    ADD_FAILURE() << "no error";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), cider::ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("got 100"), std::string::npos) << e.what();
  }
}

namespace {

size_t shared_bytes(const cm::Session& s) {
  std::vector<cm::SharedKvBlock> blocks;
  s.shared_kv(blocks);
  size_t b = 0;
  for (const auto& k : blocks) b += k.bytes;
  return b;
}

// max |a − b| over the logits as a fraction of a's spread (max − min). Shared and unshared sessions read the same
// codes; only attention's float32 sums run in another order (relative ~1e-7 per layer), which the layers carry to the
// logits: measured at most 3.5e-5 of the spread on cider-tiny (2026-12-06), bounded here at 2e-4 — a segment read
// wrongly (or missed) moves the logits by a sizeable part of it.
float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0.0f, lo = a[0], hi = a[0];
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));  // NaN: the comparison below fails
    if (std::isnan(b[i])) return b[i];
    lo = std::min(lo, a[i]);
    hi = std::max(hi, a[i]);
  }
  return d / (hi - lo);
}

// Model::share_session(s) then copy_session(s, n): the copy shares s's complete blocks (held once: the same blocks,
// its own bytes only what follows them and its sliding layers) and continues as a plain copy of the trimmed session
// does — the same codes, attention's float32 sums in another order, so the logits agree (max_diff) and the greedy
// token is the same; s continues as before; a copy's snapshot (joined) restores a session that continues
// like it.
void check_shared_copies(const cm::Model& m, const std::vector<int32_t>& tokens, const std::vector<int64_t>& cuts,
                         const std::string& what) {
  const auto V = static_cast<size_t>(m.config().vocab_size);
  std::vector<float> a(V), b(V), c(V);
  auto s = m.new_session();
  m.forward(*s, tokens.data(), static_cast<int64_t>(tokens.size()), a.data(), false);
  const cm::SessionState before = m.snapshot(*s);
  const size_t unshared = s->kv_bytes();
  m.share_session(*s);
  EXPECT_GT(shared_bytes(*s), 0u) << what;
  auto again = m.restore_session(before);
  for (int32_t t : {9, 41}) {  // s reads what it read before sharing
    m.forward(*s, &t, 1, a.data(), false);
    m.forward(*again, &t, 1, b.data(), false);
    EXPECT_LE(max_diff(a, b), 2e-4f) << what << " (the shared session)";
    EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin());
  }
  s = m.restore_session(before);
  m.share_session(*s);
  for (int64_t cut : cuts) {
    const std::string at = what + " cut " + std::to_string(cut);
    auto copy = m.copy_session(*s, cut);
    EXPECT_EQ(copy->position(), cut) << at;
    auto trimmed = m.restore_session(before);
    trimmed->trim(trimmed->position() - cut);
    // Held once: the copy's shared blocks are s's, and its own bytes are a fraction of a plain copy's.
    std::vector<cm::SharedKvBlock> mine, theirs;
    copy->shared_kv(mine);
    s->shared_kv(theirs);
    for (const auto& k : mine)
      EXPECT_TRUE(std::any_of(theirs.begin(), theirs.end(), [&](const auto& t) { return t.id == k.id; })) << at;
    if (cut >= 256) {
      EXPECT_GT(shared_bytes(*copy), 0u) << at;
      EXPECT_LT(copy->kv_bytes() - shared_bytes(*copy), trimmed->kv_bytes()) << at;
    }
    for (int32_t t : {5, 77, 300}) {
      m.forward(*copy, &t, 1, a.data(), false);
      m.forward(*trimmed, &t, 1, b.data(), false);
      EXPECT_LE(max_diff(a, b), 2e-4f) << at << " token " << t;
      EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(), std::max_element(b.begin(), b.end()) - b.begin())
          << at;
    }
    auto restored = m.restore_session(m.snapshot(*copy));
    EXPECT_EQ(restored->position(), copy->position()) << at;
    EXPECT_EQ(shared_bytes(*restored), 0u) << at;
    const int32_t t = 123;
    m.forward(*copy, &t, 1, a.data(), false);
    m.forward(*restored, &t, 1, c.data(), false);
    EXPECT_LE(max_diff(a, c), 2e-4f) << at << " (restored from the joined snapshot)";
  }
  EXPECT_GE(unshared, 1u);
}

}  // namespace

TEST(EngineSessionCopy, SharedPrefixIsHeldOnceAndReadsLikeACopy) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 700; ++i) tokens.push_back(3 + (i * 37) % 500);
  const int64_t block = tiny().options().kv.group_size;
  check_shared_copies(tiny(), tokens, {699, 4 * block, 2 * block, block + 17, 20, 0}, "per-channel keys");
  cm::ModelOptions o;
  o.kv = cm::parse_kv_format("k8v4");
  auto per_token = cm::Model::load(cider::test::repo_file("models/cider-tiny"), o);
  check_shared_copies(*per_token, tokens, {699, 300, 1}, "per-token keys");
  auto window = window_model();  // its sliding layers are copied, its global ones shared
  check_shared_copies(*window, tokens, {700, 699, 695}, "sliding window");
}

namespace {

// What a request reuses of a pooled entry holding `pooled` tokens (Engine::reusable_prefix with per-channel keys).
int64_t expected_reuse(const std::vector<int32_t>& pooled, const std::vector<int32_t>& prompt) {
  size_t k = 0;
  while (k < pooled.size() && k < prompt.size() && pooled[k] == prompt[k]) ++k;
  const int64_t block = tiny().options().kv.group_size;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(k), static_cast<int64_t>(prompt.size()) - 1);
  return n / block * block;
}

// The tokens a finished request's session holds: the prompt and the sampled tokens but the last (never fed).
std::vector<int32_t> held_tokens(const rt::RequestOptions& r, const Outcome& o) {
  std::vector<int32_t> t = r.prompt;
  t.insert(t.end(), o.tokens.begin(), o.tokens.end() - 1);
  return t;
}

// The requests' tokens from an engine without a prefix cache, submitted at once.
std::vector<std::vector<int32_t>> tokens_without_prefix_cache(const std::vector<rt::RequestOptions>& reqs) {
  rt::EngineOptions off;
  off.prefix_cache_entries = 0;
  rt::Engine engine(tiny(), off);
  std::vector<std::shared_ptr<rt::Request>> rs;
  for (const auto& r : reqs) rs.push_back(submit(engine, r));
  std::vector<std::vector<int32_t>> want;
  for (auto& r : rs) want.push_back(collect(*r).tokens);
  return want;
}

const std::vector<std::string> kSuffixes = {"def g(y):\n    return y\n", "class Point:\n    x = 0\n",
                                            "for i in range(3):\n    print(i)\n", "# the end\nimport sys\n"};

}  // namespace

// A pooled prompt P, then four requests P + different suffixes submitted at once: each copies the pooled prefix
// (cached_tokens the reusable prefix), their greedy tokens equal those of an engine without a prefix cache, and the
// entry stays (five entries afterwards; a take would leave four). Memory: while they run the reservations and the pool
// stay within the bound and the entry's bytes stay pooled; afterwards nothing is reserved and the pool holds the
// entry's bytes plus the four finished sessions', each what a session of its length holds.
TEST(Engine, ConcurrentRequestsSharingAPooledPrefixEachGetACopy) {
  const std::string p = code_prompt();
  std::vector<rt::RequestOptions> reqs;
  for (const auto& x : kSuffixes) reqs.push_back(request(p + x, 12));
  const std::vector<std::vector<int32_t>> want = tokens_without_prefix_cache(reqs);
  rt::EngineOptions eo;
  eo.max_batch = 8;
  rt::Engine engine(tiny(), eo);
  const rt::RequestOptions warm = request(p, 8);
  const Outcome first = collect(*submit(engine, warm));
  settle(engine, 1);
  const rt::EngineStats base = engine.stats();
  ASSERT_EQ(base.pooled, 1);
  EXPECT_EQ(base.kv_bytes_reserved, base.kv_bytes_pooled);  // nothing running
  EXPECT_EQ(base.kv_bytes_pooled, rt::kv_bytes_at(tiny(), static_cast<int64_t>(held_tokens(warm, first).size())));
  std::vector<std::shared_ptr<rt::Request>> rs;
  for (const auto& r : reqs) rs.push_back(submit(engine, r));
  // Invariants while they run (sampled, no timing asserted).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  for (rt::EngineStats st = engine.stats(); (st.running != 0 || st.waiting != 0) &&
                                            std::chrono::steady_clock::now() < deadline; st = engine.stats()) {
    EXPECT_LE(st.kv_bytes_reserved, st.kv_memory);
    EXPECT_GE(st.kv_bytes_pooled, base.kv_bytes_pooled);  // the entry never left the pool
    std::this_thread::sleep_for(1ms);
  }
  int64_t finished_bytes = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    const Outcome o = collect(*rs[i]);
    EXPECT_GT(o.last.cached_tokens, 0) << kSuffixes[i];
    EXPECT_EQ(o.last.cached_tokens, expected_reuse(held_tokens(warm, first), reqs[i].prompt)) << kSuffixes[i];
    EXPECT_EQ(o.tokens, want[i]) << kSuffixes[i];
    finished_bytes += rt::kv_bytes_at(tiny(), static_cast<int64_t>(held_tokens(reqs[i], o).size()));
  }
  settle(engine, 5);
  const rt::EngineStats st = engine.stats();
  EXPECT_EQ(st.pooled, 5);
  EXPECT_EQ(st.prefix_cache_hits, 4u);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.kv_bytes_reserved, st.kv_bytes_pooled);  // the reservations returned to the baseline's 0
  EXPECT_EQ(st.kv_bytes_in_use, st.kv_bytes_pooled);
  EXPECT_EQ(st.kv_bytes_pooled, base.kv_bytes_pooled + finished_bytes);
  // The entry is still there: the warm-up prompt again hits it (its whole prompt, to a block boundary) with the
  // first run's tokens, and joins nothing (the entry holds its tokens).
  const Outcome again = collect(*submit(engine, warm));
  EXPECT_EQ(again.last.cached_tokens, expected_reuse(held_tokens(warm, first), warm.prompt));
  EXPECT_EQ(again.tokens, first.tokens);
  settle(engine, 5);
  EXPECT_EQ(engine.stats().pooled, 5);
  const std::string metrics = engine.metrics_text();
  EXPECT_NE(metrics.find("cider_prefix_cache_hits_total 5\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("cider_prefix_cache_bytes " + std::to_string(engine.stats().kv_bytes_pooled) + "\n"),
            std::string::npos);
}

// A pooled prefix longer than a storage step, then four requests that extend it, submitted at once: each shares the
// entry's blocks (Model::share_session: held once) instead of copying them — cached_tokens the reusable prefix,
// greedy tokens those of an engine without a prefix cache — and the pool afterwards holds less than the four copies
// would: the entry's blocks once, each finished session its own positions (kv_bytes_at_shared) — by at least half
// of what the four shares save by that formula (the entry's split costs its segments' fixed planes and a storage
// step of its own: on cider-tiny's small heads these are a large part).
TEST(Engine, ConcurrentRequestsShareALongPooledPrefixOnce) {
  std::string p = "import numpy as np\n\n";
  for (int i = 0; i < 40; ++i) p += "def g" + std::to_string(i) + "(x):\n    return np.mean(x - " + std::to_string(i) + ")\n\n";
  std::vector<rt::RequestOptions> reqs;
  for (const auto& x : kSuffixes) reqs.push_back(request(p + x, 12));
  const std::vector<std::vector<int32_t>> want = tokens_without_prefix_cache(reqs);
  rt::EngineOptions eo;
  eo.max_batch = 8;
  rt::Engine engine(tiny(), eo);
  const rt::RequestOptions warm = request(p, 8);
  ASSERT_GE(warm.prompt.size(), 2u * static_cast<size_t>(cider::nn::KVCache::kStep));
  const Outcome first = collect(*submit(engine, warm));
  settle(engine, 1);
  const rt::EngineStats base = engine.stats();
  std::vector<std::shared_ptr<rt::Request>> rs;
  for (const auto& r : reqs) rs.push_back(submit(engine, r));
  int64_t copies_bytes = base.kv_bytes_pooled, saved = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    const Outcome o = collect(*rs[i]);
    const int64_t reuse = expected_reuse(held_tokens(warm, first), reqs[i].prompt);
    EXPECT_EQ(o.last.cached_tokens, reuse) << kSuffixes[i];
    EXPECT_GE(reuse, cider::nn::KVCache::kStep);
    EXPECT_EQ(o.tokens, want[i]) << kSuffixes[i];
    const auto held = static_cast<int64_t>(held_tokens(reqs[i], o).size());
    copies_bytes += rt::kv_bytes_at(tiny(), held);
    saved += rt::kv_bytes_at(tiny(), held) - rt::kv_bytes_at_shared(tiny(), held, reuse);
  }
  settle(engine, 5);
  const rt::EngineStats st = engine.stats();
  EXPECT_EQ(st.pooled, 5);
  EXPECT_EQ(st.prefix_cache_hits, 4u);
  EXPECT_GT(saved, copies_bytes / 4);
  EXPECT_LE(st.kv_bytes_pooled, copies_bytes - saved / 2) << "copies would hold " << copies_bytes << ", the shares save "
                                                          << saved << " by the formula";
  EXPECT_EQ(st.kv_bytes_in_use, st.kv_bytes_pooled);
  EXPECT_GT(st.kv_bytes_shared, 0);
  EXPECT_LT(st.kv_bytes_shared, st.kv_bytes_pooled);
  EXPECT_NE(engine.metrics_text().find("cider_kv_shared_bytes " + std::to_string(st.kv_bytes_shared) + "\n"),
            std::string::npos);
  // share_prefixes off (--no-prefix-sharing): the hit copies, nothing is shared, the same tokens.
  rt::EngineOptions copies = eo;
  copies.share_prefixes = false;
  rt::Engine copying(tiny(), copies);
  (void)collect(*submit(copying, warm));
  settle(copying, 1);
  const Outcome o = collect(*submit(copying, reqs[0]));
  EXPECT_GT(o.last.cached_tokens, 0);
  EXPECT_EQ(o.tokens, want[0]);
  settle(copying, 2);
  EXPECT_EQ(copying.stats().kv_bytes_shared, 0);
}

// Under a small KV bound: an unrelated least recently used entry is evicted to make room for a copy (the hit's entry
// stays); when only the hit's own entry leaving makes room, the request takes it (today's take: cached_tokens as a
// copy's, the entry gone, the tokens of a miss). The reservations and the pool never pass the bound.
TEST(Engine, EvictionUnderASmallKvMemoryKeepsTheHitsEntryOrTakesIt) {
  const std::string p = code_prompt();
  std::string other = "Once upon a time there was a parser.\n";
  for (int i = 0; i < 10; ++i) other += "It read line " + std::to_string(i) + " and wrote it down again.\n";
  const rt::RequestOptions a = request(other, 8), warm = request(p, 8), r = request(p + kSuffixes[0], 8);
  ASSERT_GT(a.prompt.size(), 130u);
  const auto bytes_of = [](const rt::RequestOptions& q, const Outcome& o) {
    return rt::kv_bytes_at(tiny(), static_cast<int64_t>(held_tokens(q, o).size()));
  };
  const int64_t reserve_r = rt::kv_bytes_at(tiny(), static_cast<int64_t>(r.prompt.size()) + r.max_tokens);
  std::vector<int32_t> want;
  {
    rt::EngineOptions off;
    off.prefix_cache_entries = 0;
    rt::Engine engine(tiny(), off);
    want = collect(*submit(engine, r)).tokens;
  }
  for (const bool room_for_the_entry : {true, false}) {
    SCOPED_TRACE(room_for_the_entry ? "evicts the other entry, copies" : "takes the entry");
    // Sizes from a first run (the sessions' bytes follow their lengths).
    int64_t bytes_a = 0, bytes_e = 0;
    {
      rt::Engine probe(tiny(), rt::EngineOptions{});
      bytes_a = bytes_of(a, collect(*submit(probe, a)));
      bytes_e = bytes_of(warm, collect(*submit(probe, warm)));
    }
    rt::EngineOptions eo;
    eo.kv_memory = reserve_r + (room_for_the_entry ? bytes_e : bytes_e - 1);
    const int64_t reserve_warm = rt::kv_bytes_at(tiny(), static_cast<int64_t>(warm.prompt.size()) + warm.max_tokens);
    rt::Engine engine(tiny(), eo);
    (void)collect(*submit(engine, a));
    settle(engine, 1);
    const Outcome first = collect(*submit(engine, warm));
    // The other entry stays while the warm-up's reservation fits beside it.
    const int64_t both = reserve_warm + bytes_a <= eo.kv_memory ? 2 : 1;
    settle(engine, both);
    EXPECT_EQ(engine.stats().pooled, both);
    if (room_for_the_entry) {
      EXPECT_EQ(both, 2);  // so that this case evicts it for the copy
    }
    const int64_t pooled_before = engine.stats().kv_bytes_pooled;
    EXPECT_LE(pooled_before, eo.kv_memory);
    const Outcome hit = collect(*submit(engine, r));
    EXPECT_EQ(hit.last.cached_tokens, expected_reuse(held_tokens(warm, first), r.prompt));
    EXPECT_GT(hit.last.cached_tokens, 0);
    EXPECT_EQ(hit.tokens, want);
    settle(engine, room_for_the_entry ? 2 : 1);
    const rt::EngineStats st = engine.stats();
    EXPECT_LE(st.kv_bytes_reserved, eo.kv_memory);
    if (room_for_the_entry) {
      EXPECT_EQ(st.pooled, 2);  // the entry and the finished request's session; the other one evicted
      EXPECT_EQ(st.kv_bytes_pooled, bytes_e + bytes_of(r, hit));
    } else {
      EXPECT_EQ(st.pooled, 1);  // taken: only the finished request's session
      EXPECT_EQ(st.kv_bytes_pooled, bytes_of(r, hit));
    }
    // The other prompt's entry is gone: a miss.
    EXPECT_EQ(collect(*submit(engine, a)).last.cached_tokens, 0);
  }
}
