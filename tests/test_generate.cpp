// The generation loop against scripted fakes of the model (LogitsSource) and of the detokenizer (TextStream): EOS,
// stop strings (never printed, text held back only while it could still be one), max tokens, context limits, chunked
// prefill, streaming, determinism per seed, statistics, and every rejection.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/generate.h"
#include "support/test_support.h"

namespace cider::model {
namespace {

// A "model" whose logits at position p put a large value on script[p] (greedy then follows the script), or, in
// random mode, fresh pseudo-random logits derived from the position.
class ScriptedSource : public LogitsSource {
 public:
  ScriptedSource(int64_t vocab, int64_t ctx, std::vector<int32_t> script) : vocab_(vocab), ctx_(ctx), script_(std::move(script)) {}
  int64_t vocab_size() const override { return vocab_; }
  int64_t context_length() const override { return ctx_; }
  int64_t position() const override { return pos_; }
  void forward(const int32_t* tokens, int64_t n, float* last) override {
    EXPECT_LE(pos_ + n, ctx_) << "forward past the context";
    chunks.push_back(n);
    seen.insert(seen.end(), tokens, tokens + n);
    pos_ += n;
    for (int64_t v = 0; v < vocab_; ++v) last[v] = random_ ? static_cast<float>((pos_ * 7919 + v * 104729) % 1000) / 300.0f : 0.0f;
    if (!random_) {
      const size_t i = static_cast<size_t>(pos_ - 1);
      last[i < script_.size() ? script_[i] : 0] = 10.0f;
    }
  }
  size_t kv_bytes() const override { return 1234; }
  size_t weight_bytes() const override { return 5678; }
  void set_random(bool r) { random_ = r; }

  std::vector<int64_t> chunks;
  std::vector<int32_t> seen;

 private:
  int64_t vocab_, ctx_, pos_ = 0;
  std::vector<int32_t> script_;  // script_[p]: the token greedy picks after position p is filled
  bool random_ = false;
};

// Token id -> text piece; ids listed in `held` produce nothing until the next token or flush (like a UTF-8 lead
// byte waiting for its continuation).
class TableText : public TextStream {
 public:
  explicit TableText(std::map<int32_t, std::string> table, std::vector<int32_t> held = {})
      : table_(std::move(table)), held_ids_(std::move(held)) {}
  std::string push(int32_t id) override {
    held_ += table_.at(id);
    if (std::find(held_ids_.begin(), held_ids_.end(), id) != held_ids_.end()) return "";
    std::string out;
    out.swap(held_);
    return out;
  }
  std::string flush() override {
    std::string out;
    out.swap(held_);
    return out;
  }

 private:
  std::map<int32_t, std::string> table_;
  std::vector<int32_t> held_ids_;
  std::string held_;
};

SamplerParams greedy() {
  SamplerParams p;
  p.temperature = 0.0;
  return p;
}

const std::map<int32_t, std::string> kPieces = {{0, "<eos>"}, {1, "Hel"}, {2, "lo"}, {3, " wor"}, {4, "ld"},
                                                {5, "!"},     {6, " a"},  {7, "b"},   {8, "c"},    {9, "\xC3"}};

struct Outcome {
  GenerationResult r;
  std::vector<std::string> pieces;  // what the callback received, in order
};

Outcome run(ScriptedSource& src, TextStream& text, const std::vector<int32_t>& prompt, const GenerateOptions& o,
        SamplerParams sp = greedy(), std::vector<int32_t>* history_out = nullptr) {
  Sampler s(sp);
  std::vector<int32_t> history;
  Outcome out;
  out.r = generate(src, text, s, history, prompt, o, [&](std::string_view p) { out.pieces.emplace_back(p); });
  if (history_out) *history_out = history;
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x;
  return s;
}

TEST(Generate, StopsAtEosWithoutPrintingItAndLeavesItPending) {
  // prompt of 3 tokens; the script says what follows position 2, 3, ...
  ScriptedSource src(10, 64, {7, 7, 1, 2, 3, 4, 0, 5, 5});
  TableText text(kPieces);
  GenerateOptions o;
  o.eos_ids = {0};
  std::vector<int32_t> history;
  const Outcome out = run(src, text, {6, 7, 8}, o, greedy(), &history);
  EXPECT_EQ(out.r.tokens, (std::vector<int32_t>{1, 2, 3, 4, 0}));
  EXPECT_EQ(out.r.reason, StopReason::kEos);
  EXPECT_EQ(out.r.text, "Hello world");
  EXPECT_EQ(join(out.pieces), out.r.text);
  EXPECT_TRUE(out.r.last_token_pending);
  EXPECT_EQ(src.position(), 3 + 4);  // the EOS was never fed back
  EXPECT_EQ(history, (std::vector<int32_t>{6, 7, 8, 1, 2, 3, 4, 0}));
  EXPECT_EQ(src.seen, (std::vector<int32_t>{6, 7, 8, 1, 2, 3, 4}));
}

TEST(Generate, MaxTokensEndsGenerationAndZeroOnlyPrefills) {
  ScriptedSource src(10, 64, {1, 2, 3, 4, 5, 6, 7, 8});
  TableText text(kPieces);
  GenerateOptions o;
  o.max_tokens = 3;
  const Outcome out = run(src, text, {5}, o);
  EXPECT_EQ(out.r.tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(out.r.reason, StopReason::kMaxTokens);
  EXPECT_EQ(out.r.text, "Hello wor");
  EXPECT_TRUE(out.r.last_token_pending);
  EXPECT_EQ(src.position(), 3);

  ScriptedSource src0(10, 64, {1});
  o.max_tokens = 0;
  const Outcome none = run(src0, text, {5, 6}, o);
  EXPECT_TRUE(none.r.tokens.empty());
  EXPECT_EQ(none.r.text, "");
  EXPECT_EQ(src0.position(), 2);
  EXPECT_EQ(none.r.stats.prompt_tokens, 2);
}

TEST(Generate, StopStringEndsGenerationAndIsNeverPrinted) {
  // "Hello world!" — the stop string " wo" spans the tokens " wor": everything before it is printed, nothing after.
  for (const auto& [stop, want] : std::vector<std::pair<std::string, std::string>>{
           {" wo", "Hello"}, {"lo w", "Hel"}, {"d!", "Hello worl"}, {"Hello", ""}, {"!", "Hello world"}}) {
    ScriptedSource src(10, 64, {1, 2, 3, 4, 5, 6, 6, 6});
    TableText text(kPieces);
    GenerateOptions o;
    o.stop = {"zzz", stop};
    const Outcome out = run(src, text, {8}, o);
    EXPECT_EQ(out.r.reason, StopReason::kStopString) << stop;
    EXPECT_EQ(out.r.text, want) << stop;
    EXPECT_EQ(join(out.pieces), want) << stop;
  }
}

TEST(Generate, EarliestStopStringWinsAndNearMissesAreReleased) {
  ScriptedSource src(10, 64, {1, 2, 3, 4, 5, 6, 7, 8});
  TableText text(kPieces);
  GenerateOptions o;
  o.stop = {"ld!", "o w", "wx"};
  EXPECT_EQ(run(src, text, {8}, o).r.text, "Hell");

  // "lo wx" never completes: held text is released when it stops matching and at the end.
  ScriptedSource src2(10, 64, {1, 2, 3, 4, 5});
  GenerateOptions o2;
  o2.stop = {"lo wx", "!!"};
  o2.max_tokens = 5;
  const Outcome out = run(src2, text, {8}, o2);
  EXPECT_EQ(out.r.reason, StopReason::kMaxTokens);
  EXPECT_EQ(out.r.text, "Hello world!");
  EXPECT_EQ(join(out.pieces), "Hello world!");
}

TEST(Generate, TextIsStreamedAsItIsGeneratedNotAtTheEnd) {
  ScriptedSource src(10, 64, {1, 2, 3, 4, 5});
  TableText text(kPieces);
  GenerateOptions o;
  o.max_tokens = 5;
  Sampler s(greedy());
  std::vector<int32_t> history;
  std::vector<int64_t> position_at_piece;
  generate(src, text, s, history, std::vector<int32_t>{8}, o,
           [&](std::string_view) { position_at_piece.push_back(src.position()); });
  // One piece per token, each delivered before the token is fed back to the model.
  EXPECT_EQ(position_at_piece, (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

TEST(Generate, HeldBytesAreFlushedAtTheEnd) {
  // Token 9 is an incomplete UTF-8 lead byte; its text comes out only at flush.
  ScriptedSource src(10, 64, {1, 9});
  TableText text(kPieces, {9});
  GenerateOptions o;
  o.max_tokens = 2;
  const Outcome out = run(src, text, {8}, o);
  EXPECT_EQ(out.r.text, "Hel\xC3");
  EXPECT_EQ(out.pieces.size(), 2u);
}

TEST(Generate, LongPromptsArePrefilledInChunks) {
  std::vector<int32_t> prompt(1000);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i % 10);
  ScriptedSource src(10, 2048, std::vector<int32_t>(1100, 3));
  TableText text(kPieces);
  GenerateOptions o;
  o.max_tokens = 3;
  o.prefill_chunk = 256;
  const Outcome out = run(src, text, prompt, o);
  EXPECT_EQ(src.chunks, (std::vector<int64_t>{256, 256, 256, 232, 1, 1}));
  EXPECT_EQ(std::vector<int32_t>(src.seen.begin(), src.seen.begin() + 1000), prompt);
  EXPECT_EQ(out.r.stats.prompt_tokens, 1000);
}

TEST(Generate, StopsWhenTheContextIsFull) {
  ScriptedSource src(10, 10, std::vector<int32_t>(20, 7));
  TableText text(kPieces);
  GenerateOptions o;
  o.max_tokens = 100;
  const Outcome out = run(src, text, {1, 2, 3, 4, 5}, o);
  // Positions 5..9 are filled by the first five sampled tokens; the sixth is sampled from position 9's logits but has
  // no room.
  EXPECT_EQ(out.r.tokens.size(), 6u);
  EXPECT_EQ(out.r.reason, StopReason::kContextFull);
  EXPECT_TRUE(out.r.last_token_pending);
  EXPECT_EQ(src.position(), 10);

  // A prompt of exactly the context still yields one token.
  ScriptedSource full(10, 4, std::vector<int32_t>(20, 7));
  const Outcome one = run(full, text, {1, 2, 3, 4}, o);
  EXPECT_EQ(one.r.tokens, (std::vector<int32_t>{7}));
  EXPECT_EQ(one.r.reason, StopReason::kContextFull);
}

TEST(Generate, PromptLongerThanTheContextIsRejectedBeforeRunning) {
  ScriptedSource src(10, 8, {});
  TableText text(kPieces);
  try {
    run(src, text, std::vector<int32_t>(9, 1), GenerateOptions{});
    FAIL() << "accepted a 9-token prompt in an 8-token context";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    const std::string m = e.what();
    EXPECT_NE(m.find("[generate]"), std::string::npos) << m;
    EXPECT_NE(m.find("context of 8 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("got 9"), std::string::npos) << m;
  }
  EXPECT_TRUE(src.chunks.empty());  // nothing ran
}

TEST(Generate, RejectsInvalidOptionsAndPrompts) {
  TableText text(kPieces);
  auto rejects = [&](const std::vector<int32_t>& prompt, const GenerateOptions& o, const std::string& what) {
    ScriptedSource src(10, 64, {1});
    try {
      run(src, text, prompt, o);
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_TRUE(src.chunks.empty()) << what;
  };
  rejects({}, GenerateOptions{}, "at least one token");
  rejects({1, 10}, GenerateOptions{}, "got 10");
  rejects({1, -1}, GenerateOptions{}, "got -1");
  GenerateOptions o;
  o.max_tokens = -1;
  rejects({1}, o, "max_tokens");
  o = {};
  o.prefill_chunk = 0;
  rejects({1}, o, "prefill_chunk");
  o = {};
  o.stop = {"ok", ""};
  rejects({1}, o, "stop strings");
}

TEST(Generate, RepetitionPenaltySeesThePromptAndEarlierTurns) {
  // Constant logits except token 3, the favourite; the prompt contains 3, so a penalty of 2 makes token 0 win.
  class Flat : public ScriptedSource {
   public:
    Flat() : ScriptedSource(5, 64, {}) {}
    void forward(const int32_t* t, int64_t n, float* last) override {
      ScriptedSource::forward(t, n, last);
      for (int v = 0; v < 5; ++v) last[v] = v == 3 ? 1.5f : 1.0f;
    }
  };
  TableText text({{0, "a"}, {1, "b"}, {2, "c"}, {3, "d"}, {4, "e"}});
  GenerateOptions o;
  o.max_tokens = 1;
  SamplerParams p = greedy();
  Flat a;
  EXPECT_EQ(run(a, text, {3}, o, p).r.tokens, (std::vector<int32_t>{3}));
  p.repeat_penalty = 2.0;
  Flat b;
  EXPECT_EQ(run(b, text, {3}, o, p).r.tokens, (std::vector<int32_t>{0}));
  // A second turn in the same history: token 3 from the first turn's prompt is still penalised, and so are this
  // turn's prompt (1) and the first turn's answer (0), so the first unpenalised token, 2, wins.
  Flat c;
  Sampler s(p);
  std::vector<int32_t> history;
  generate(c, text, s, history, std::vector<int32_t>{3}, o);
  const GenerationResult second = generate(c, text, s, history, std::vector<int32_t>{1}, o);
  EXPECT_EQ(second.tokens, (std::vector<int32_t>{2}));
  EXPECT_EQ(history, (std::vector<int32_t>{3, 0, 1, 2}));
}

TEST(Generate, SameSeedSameTokens) {
  TableText text({{0, "a"}, {1, "b"}, {2, "c"}, {3, "d"}, {4, "e"}, {5, "f"}, {6, "g"}, {7, "h"}});
  GenerateOptions o;
  o.max_tokens = 40;
  SamplerParams p;
  p.temperature = 1.5, p.top_k = 0, p.top_p = 1.0, p.min_p = 0.0;
  p.seed = test::test_seed();
  auto tokens = [&](uint64_t seed) {
    ScriptedSource src(8, 64, {});
    src.set_random(true);
    SamplerParams q = p;
    q.seed = seed;
    return run(src, text, {1}, o, q).r.tokens;
  };
  EXPECT_EQ(tokens(p.seed), tokens(p.seed));
  EXPECT_NE(tokens(p.seed), tokens(p.seed + 1));  // 40 draws from 8 spread-out tokens: equal by chance ~ never
}

// A source with a "device": forward_candidates answers the sampler's request from the same logits (the contract of
// kernels/cuda/topk.cu, written plainly), so generation must give the tokens of the logits path, and use the device
// whenever the request allows it.
class DeviceSource : public ScriptedSource {
 public:
  using ScriptedSource::ScriptedSource;
  bool forward_candidates(const int32_t* tokens, int64_t n, const CandidateRequest& r, Candidates& c) override {
    std::vector<float> logits(static_cast<size_t>(vocab_size()));
    forward(tokens, n, logits.data());
    ++device_calls;
    c = test::reference_candidates(logits, r);
    return true;
  }
  int device_calls = 0;
};

TEST(Generate, DeviceCandidatesGiveTheTokensOfTheLogitsPath) {
  TableText text({{0, "a"}, {1, "b"}, {2, "c"}, {3, "d"}, {4, "e"}, {5, "f"}, {6, "g"}, {7, "h"}});
  GenerateOptions o;
  o.max_tokens = 40;
  o.prefill_chunk = 2;
  std::vector<SamplerParams> settings(4);
  settings[0].temperature = 0.0;                                  // greedy: k = 1
  settings[1].seed = 11;                                          // the defaults: T 0.8, top-k 40, top-p, min-p
  settings[2].repeat_penalty = 1.3, settings[2].seed = 12;        // penalised tokens ranked on the host
  settings[3].top_k = 0, settings[3].seed = 13;                   // top-k off: the full logits are needed
  for (size_t i = 0; i < settings.size(); ++i) {
    ScriptedSource plain(8, 64, {});
    DeviceSource device(8, 64, {});
    plain.set_random(true);
    device.set_random(true);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
    const std::vector<int32_t> a = run(plain, text, prompt, o, settings[i]).r.tokens;
    const std::vector<int32_t> b = run(device, text, prompt, o, settings[i]).r.tokens;
    EXPECT_EQ(a, b) << "settings " << i;
    EXPECT_EQ(device.seen, plain.seen) << "settings " << i;  // the same tokens reached the model, in the same order
    // Every draw came from the device (the last prompt chunk, then each generated token but the last), except
    // with top-k off.
    EXPECT_EQ(device.device_calls, i == 3 ? 0 : static_cast<int>(o.max_tokens)) << "settings " << i;
  }
}

TEST(Generate, StatsCountTokensAndReportMemory) {
  ScriptedSource src(10, 64, {1, 2, 3, 4, 5});
  TableText text(kPieces);
  GenerateOptions o;
  o.max_tokens = 4;
  const Outcome out = run(src, text, {8, 8}, o);
  const GenerationStats& s = out.r.stats;
  EXPECT_EQ(s.prompt_tokens, 2);
  EXPECT_EQ(s.generated_tokens, 4);
  EXPECT_EQ(s.kv_bytes, 1234u);
  EXPECT_EQ(s.weight_bytes, 5678u);
  EXPECT_GT(s.peak_rss_bytes, 1 << 20);  // a running test binary holds more than a MiB
  EXPECT_GE(s.prompt_seconds, 0.0);
  EXPECT_GE(s.generation_seconds, 0.0);
  const std::string line = s.line();
  for (const char* part : {"prompt 2 tokens", "generated 4 tokens", "tok/s", "peak RSS", "KV 1.2 KiB", "weights 5.5 KiB"})
    EXPECT_NE(line.find(part), std::string::npos) << line;
}

TEST(Generate, FormatBytesPicksTheUnit) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(3.0 * 1024 * 1024), "3.0 MiB");
  EXPECT_EQ(format_bytes(2.5 * 1024 * 1024 * 1024), "2.50 GiB");
}

// End to end through the real engine and tokenizer on the embedded model, against transformers' greedy tokens
// (tests/data/cider_tiny/reference.json, float32).
TEST(GenerateWithModel, GreedyTokensEqualTransformersOnCiderTiny) {
  const std::string src = CIDER_SOURCE_DIR;
  std::ifstream f(src + "/tests/data/cider_tiny/reference.json");
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json ref = nlohmann::json::parse(text.str());
  ModelOptions mo;
  mo.weights = WeightFormat::kF32;
  mo.kv = parse_kv_format("f32");
  const auto model = Model::load(src + "/models/cider-tiny", mo);
  EXPECT_EQ(model_eos_ids(*model), (std::vector<int32_t>{1}));  // config.json eos_token_id
  for (const auto& e : ref) {
    const std::vector<int32_t> ids = e["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> full = e["greedy"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want(full.begin() + static_cast<std::ptrdiff_t>(ids.size()), full.end());
    EXPECT_EQ(model->tokenizer().encode(e["prompt"].get<std::string>()), ids);
    for (int64_t chunk : {int64_t{512}, int64_t{1}, int64_t{3}}) {  // one forward, or the prompt in pieces
      auto session = model->new_session();
      ModelLogitsSource source(*model, *session);
      TokenizerTextStream stream(model->tokenizer(), ids.back());
      Sampler sampler(greedy());
      std::vector<int32_t> history;
      GenerateOptions o;
      o.max_tokens = static_cast<int64_t>(want.size());
      o.prefill_chunk = chunk;
      const GenerationResult r = generate(source, stream, sampler, history, ids, o);
      EXPECT_EQ(r.tokens, want) << "prefill chunk " << chunk;
      EXPECT_EQ(r.text, model->tokenizer().decode(want, true)) << "prefill chunk " << chunk;
      EXPECT_EQ(session->position(), static_cast<int64_t>(full.size()) - 1);
      EXPECT_GT(r.stats.kv_bytes, 0u);
      EXPECT_EQ(r.stats.weight_bytes, model->weight_bytes());
    }
  }
}

}  // namespace
}  // namespace cider::model
