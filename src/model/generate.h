// cider/model/generate.h — the generation loop: prefill the prompt, then sample and decode one token at a time,
// streaming text through a callback, until EOS, a stop string, the token limit or the end of the context.
//
// The loop talks to two small interfaces so that it can be tested without a model:
//   LogitsSource   — appends tokens to a sequence and returns the logits of the last one (a Model + Session);
//   TextStream     — turns token ids into text incrementally (Tokenizer::StreamDecoder).
// ModelLogitsSource and TokenizerTextStream (below, header-only) bind them to the real Model and Tokenizer.
//
// Stop strings: the text is checked after every token; output is held back while its end could still be the start
// of a stop string, and once a stop string appears, generation ends and neither it nor anything after it is emitted.
// EOS tokens end generation and are never emitted as text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace cider::model {

class LogitsSource {
 public:
  virtual ~LogitsSource() = default;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t context_length() const = 0;
  virtual int64_t position() const = 0;  // tokens appended so far
  // Appends tokens[0, n) and writes the logits of the last one: last_logits[vocab_size()].
  virtual void forward(const int32_t* tokens, int64_t n, float* last_logits) = 0;
  // Appends tokens[0, n) like forward() but leaves the last logits where they were computed and answers the sampler's
  // request instead (model/sampler.h: the top-k candidates). false: this source has no such device (nothing was
  // appended); the caller then uses forward().
  virtual bool forward_candidates(const int32_t* /*tokens*/, int64_t /*n*/, const CandidateRequest& /*request*/,
                                  Candidates& /*out*/) {
    return false;
  }
  virtual size_t kv_bytes() const { return 0; }
  virtual size_t weight_bytes() const { return 0; }
};

class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string push(int32_t id) = 0;  // complete UTF-8 text made available by this token (maybe empty)
  virtual std::string flush() = 0;           // whatever is held back
};

struct GenerateOptions {
  int64_t max_tokens = 256;          // >= 0: tokens to sample at most (0: prefill only)
  std::vector<std::string> stop;     // stop strings (non-empty each)
  std::vector<int32_t> eos_ids;      // tokens that end generation
  // >= 1: the prompt goes through forward() in pieces of at most this many tokens (the CPU model runs 256 rows at a
  // time inside one call, the CUDA session up to $CIDER_PREFILL_CHUNK = 2048: larger GEMMs; docs/cuda/model.md).
  int64_t prefill_chunk = 2048;
};

enum class StopReason { kEos, kStopString, kMaxTokens, kContextFull };
const char* stop_reason_name(StopReason r);  // "eos", "stop string", "max tokens", "context full"

struct GenerationStats {
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0.0;
  int64_t generated_tokens = 0;      // tokens sampled, the EOS included
  double generation_seconds = 0.0;   // from the end of the prefill to the last sampled token
  int64_t peak_rss_bytes = -1;       // VmHWM of this process; -1 when unknown
  size_t kv_bytes = 0;
  size_t weight_bytes = 0;
  double prompt_tokens_per_second() const;
  double generation_tokens_per_second() const;
  // One line: "prompt 12 tokens (345.6 tok/s) | generated 64 tokens (23.4 tok/s) | peak RSS 512.3 MiB | KV 1.2 MiB
  // | weights 250.0 MiB".
  std::string line() const;
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // every sampled token, in order (an EOS included)
  std::string text;             // everything emitted through the callback, concatenated
  StopReason reason = StopReason::kMaxTokens;
  // True when the last sampled token was not appended to the source (generation ended on it): a conversation that
  // goes on must append it (unless it is an EOS it replaces by its own end-of-turn text).
  bool last_token_pending = false;
  GenerationStats stats;
};

using TextCallback = std::function<void(std::string_view piece)>;

// Emits decoded text while keeping back whatever could still become a stop string (the rule of the header comment;
// generate() and the server's scheduler both use it). `stops`, `out` and `all` must outlive the filter.
class StopFilter {
 public:
  StopFilter(const std::vector<std::string>& stops, const TextCallback& out, std::string& all)
      : stops_(stops), out_(out), all_(all) {}
  // Adds text; returns true when a stop string has appeared (the text before it has then been emitted, the rest is
  // dropped).
  bool add(const std::string& piece);
  void finish();  // emits what is held back

 private:
  void emit(const std::string& s);
  const std::vector<std::string>& stops_;
  const TextCallback& out_;
  std::string& all_;
  std::string pending_;
};

// Appends `prompt` (at least one token) to `source`, then samples up to options.max_tokens tokens. `history` holds
// the tokens already in the source (for the repetition penalty) and is extended with the prompt and every sampled
// token. Throws cider::Error before touching the source if the prompt is empty or does not fit the context
// (kOutOfRange: position + prompt length > context length), or if an option is invalid.
GenerationResult generate(LogitsSource& source, TextStream& text, Sampler& sampler, std::vector<int32_t>& history,
                          std::span<const int32_t> prompt, const GenerateOptions& options,
                          const TextCallback& on_text = {});

// Peak resident set size of this process (VmHWM of /proc/self/status), in bytes; -1 if unavailable.
int64_t peak_rss_bytes();
int64_t resident_bytes();  // resident set size now (VmRSS), in bytes; -1 if unavailable

// Human-readable bytes: "512 B", "1.5 KiB", "250.0 MiB", "3.21 GiB".
std::string format_bytes(double bytes);

// --- Bindings to the real Model and Tokenizer (header-only, so code that uses only the loop needs no model) ---
// generate.cpp hides them: seeing the only implementations of the interfaces, the compiler would devirtualize the
// loop's calls speculatively into them and tie the loop (and its tests) to the model engine at link time.
#ifndef CIDER_GENERATE_LOOP_ONLY

class ModelLogitsSource : public LogitsSource {
 public:
  ModelLogitsSource(const Model& model, Session& session) : model_(model), session_(session) {}
  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int64_t context_length() const override { return model_.context_length(); }
  int64_t position() const override { return session_.position(); }
  void forward(const int32_t* tokens, int64_t n, float* last_logits) override {
    model_.forward(session_, tokens, n, last_logits, /*all_logits=*/false);
  }
  bool forward_candidates(const int32_t* tokens, int64_t n, const CandidateRequest& request,
                          Candidates& out) override {
    return model_.forward_candidates(session_, tokens, n, request, out);
  }
  size_t kv_bytes() const override { return session_.kv_bytes(); }
  size_t weight_bytes() const override { return model_.weight_bytes(); }

 private:
  const Model& model_;
  Session& session_;
};

// Streams text with special tokens skipped. `context` (optional) is decoded first and its text discarded, so that
// the first generated token is decoded as a continuation (a SentencePiece "▁word" keeps its space).
class TokenizerTextStream : public TextStream {
 public:
  explicit TokenizerTextStream(const Tokenizer& tok, int32_t context = -1) : decoder_(tok, true) {
    if (context >= 0 && !tok.is_special(context)) (void)decoder_.push(context);
  }
  std::string push(int32_t id) override { return decoder_.push(id); }
  std::string flush() override { return decoder_.flush(); }

 private:
  Tokenizer::StreamDecoder decoder_;
};

// The EOS ids of a model: the config's (generation_config.json / GGUF) and the tokenizer's, without repeats.
inline std::vector<int32_t> model_eos_ids(const Model& model) {
  std::vector<int32_t> ids = model.config().eos_token_ids;
  for (int32_t id : model.tokenizer().eos_ids()) {
    bool seen = false;
    for (int32_t x : ids) seen = seen || x == id;
    if (!seen) ids.push_back(id);
  }
  return ids;
}

#endif  // CIDER_GENERATE_LOOP_ONLY

}  // namespace cider::model
