// cider/runtime/engine.h — the server's scheduler: continuous batching over one model, a KV-memory bound, and a cache
// of finished sequences' KV for requests that share a prefix.
//
// One worker thread runs steps. A step:
//   1. admits waiting requests (first come, first served) while the batch has room (max_batch) and the KV memory
//      bound allows: each running sequence reserves the cache bytes of min(prompt + max_tokens, context) positions
//      (model::kv_bytes_at), so the running set never outgrows --kv-memory and nothing has to be preempted; a smaller
//      cache format reserves proportionally less and admits proportionally more sequences;
//   2. builds one batched forward (Model::forward_batch): every decoding sequence contributes its last sampled token
//      (one row), and the remaining row budget of the step (step_tokens) goes to prompt chunks of the sequences still
//      in prefill, oldest first — prefill is interleaved with decode instead of stalling it;
//   3. samples each sequence whose row was its last (penalties, logprobs), streams its text through the stop filter
//      and finishes it on an end token, a stop string, max_tokens, the context's end, or a cancel (a client that went
//      away): its KV is released at once.
// Prefix cache: a finished sequence's session goes into a pool keyed by the tokens it holds (one entry per prefix: an
// entry whose tokens a longer finished session also holds leaves for it, and a session whose tokens an entry holds does
// not join). A new request finds the pooled session with the longest common prefix with its prompt and gets its own
// copy of that prefix (Model::copy_session: only the kept positions, as Session::trim would leave them; every cache
// format, quantized included; a session whose sliding-window layers dropped what that needs, can_truncate false, is a
// miss) — copy on take: the entry stays pooled, most recently used, for the next request — and prefills only the rest;
// at least the prompt's last token is always recomputed (its logits are needed). The copy is the new sequence's
// session, inside its reservation (on CUDA a device-to-device copy of the session's buffers). Where sessions cannot be
// copied (Model::can_copy_sessions false: a tensor-parallel model), or where only the entry's own bytes leaving the pool make room for the request, the request takes the entry out of
// the pool and trims it instead. Pooled sessions count against the KV bound with their real bytes and are evicted least
// recently used first when a reservation needs the room (never the entry a request being admitted copies), or beyond
// prefix_cache_entries. With prompt_cache_dir the pool is also kept on disk (runtime/prompt_cache.h): a session's file
// is written when it joins the pool and deleted when it leaves it, and the files are loaded into the pool at start
// under the same bounds.
//
// Requests are consumed from any thread: Request::wait() returns what the engine produced since the last call.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/generate.h"
#include "model/json_prefix.h"
#include "model/model.h"
#include "model/sampler.h"

namespace cider::runtime {

// KV bytes of one sequence of `positions` positions with this model's cache format (all layers; sliding-window layers
// bounded by their window: model::kv_cache_bytes).
int64_t kv_bytes_at(const model::Model& m, int64_t positions);
// What a session that shares positions [0, shared) of its layers without a sliding window (Model::share_session)
// holds of its own at `positions`: a request that shares a pooled prefix reserves this.
int64_t kv_bytes_at_shared(const model::Model& m, int64_t positions, int64_t shared);

struct RequestOptions {
  std::vector<int32_t> prompt;  // at least one token, all in the vocabulary, fitting the context
  model::SamplerParams sampling;
  int64_t max_tokens = 16;             // >= 1: tokens to sample at most (the context's end stops earlier)
  std::vector<std::string> stop;       // stop strings (non-empty each)
  std::vector<int32_t> end_tokens;     // tokens that end the sequence (EOS, end of turn); never emitted as text
  double presence_penalty = 0.0;       // OpenAI: logit −= presence·[count > 0] − frequency·count over the
  double frequency_penalty = 0.0;      // tokens sampled so far; each in [−2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits of these ids before sampling
  int top_logprobs = -1;               // −1: no logprobs; 0…20: the sampled token's and this many alternatives
  int32_t context_token = -1;          // decoded before the first sampled token (a SentencePiece "▁word" keeps its
                                       // space); by default the prompt's last token
  // Constrained decoding (model/json_prefix.h): the reply is one JSON object (JsonSchema::any_object()) or one that
  // the schema allows, ending (kStop) when it closes; special tokens are never sampled. Null: free text.
  std::shared_ptr<const model::JsonSchema> json;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // OpenAI's: "stop", "length"; "cancelled", "error"

struct TokenLogprob {
  int32_t id = 0;
  double logprob = 0.0;
  std::vector<std::pair<int32_t, double>> top;  // the most probable tokens, descending (ties: lower id)
};

// A drawn token's logprob and the n most probable tokens of a row that the device answered with candidates
// (Model::forward_batch_candidates: the best request.k tokens outside request.excluded, the excluded tokens' own
// logits, the row's normalizer): what the whole row gives, provided request.k >= n — the excluded tokens and the
// candidates together hold the row's n best and the drawn token.
TokenLogprob logprob_from_candidates(const model::CandidateRequest& request, const model::Candidates& c, int32_t token,
                                     int64_t n);

// What a request produced since the previous wait().
struct RequestUpdate {
  std::string text;
  std::vector<TokenLogprob> logprobs;  // one per sampled token (when asked for), the end token included
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string error;              // kError: the message
  int64_t prompt_tokens = 0;      // set on every update
  int64_t completion_tokens = 0;  // tokens sampled so far (an end token included, as OpenAI counts it)
  int64_t cached_tokens = 0;      // prompt tokens taken from the prefix cache
};

class Engine;
class PromptCacheStore;  // runtime/prompt_cache.h

class Request {
 public:
  // Blocks until there is something new (or `timeout` passes: then an empty update with finished = false).
  RequestUpdate wait(std::chrono::milliseconds timeout);
  // The client went away: the engine drops the sequence at its next step and frees its KV.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  friend class Engine;
  std::mutex mu_;
  std::condition_variable cv_;
  RequestUpdate pending_;
  bool has_news_ = false;
  std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
  int64_t max_batch = 8;             // sequences decoded together at most
  int64_t kv_memory = 0;             // bytes of KV for running and pooled sequences; 0: max_batch full contexts
  int64_t max_waiting = 64;          // requests queued beyond the batch; more are refused (Submit::kBusy)
  int64_t step_tokens = 0;           // rows of one batched forward (decode rows first, then prompt chunks), at most
                                     // Model::pass_rows(); 0: Model::pass_rows()
  int64_t prefix_cache_entries = 16; // finished sequences kept for prefix reuse; 0: no prefix cache
  // Hits of at least KVCache::kStep positions share the entry's blocks (Model::share_session) instead of copying
  // them; false: every hit copies (for comparisons).
  bool share_prefixes = true;
  // The prefix cache kept in this directory across restarts (runtime/prompt_cache.h); "": in memory only. Needs
  // prefix_cache_entries > 0 and a model whose sessions the host can copy (Model::can_snapshot: the CPU, or one GPU).
  std::string prompt_cache_dir;
  uint64_t model_identity = 0;       // what its files must carry (runtime::model_identity); 0: the model's, files left out
  std::function<void(const std::string&)> warn;  // a file ignored or not written; default: a line on stderr
};

// Counters and gauges for /metrics (Prometheus text: Engine::metrics_text).
struct Histogram {
  std::vector<double> bounds;     // upper bounds, ascending (+Inf implicit)
  std::vector<uint64_t> counts;   // per bound, not cumulative; counts[bounds.size()] = above the last
  double sum = 0.0;
  uint64_t count = 0;
  void observe(double v);
};

struct EngineStats {
  uint64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0, requests_refused = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0, cached_prompt_tokens = 0, steps = 0;
  uint64_t prefix_cache_hits = 0;  // finished requests with cached prompt tokens
  int64_t running = 0, waiting = 0, last_batch = 0, pooled = 0;
  int64_t kv_bytes_in_use = 0;    // allocated by running and pooled sessions
  int64_t kv_bytes_reserved = 0;  // reserved by running sequences + held by pooled ones (the bound's left side)
  int64_t kv_bytes_pooled = 0;    // held by the prefix pool's entries (shared blocks held by running sequences too)
  int64_t kv_bytes_shared = 0;    // of which shared prefix blocks (Model::share_session), each counted once
  int64_t kv_memory = 0;
  int64_t prompt_cache_loaded = 0;  // entries loaded from prompt_cache_dir at start
  Histogram ttft, itl, batch_size;
  Histogram step_forward, step_host;  // a step's model forward, and the rest of it (draws, stop strings, publishing)
};

class Engine {
 public:
  Engine(const model::Model& model, const EngineOptions& options);
  ~Engine();  // stops the worker; unfinished requests end with FinishReason::kCancelled
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  enum class Submit { kAccepted, kBusy, kDraining };
  // Validates (cider::Error: kInvalidArgument for a bad option, kOutOfRange for a prompt + reservation that can never
  // fit the context or the KV bound, naming the numbers), then queues. kBusy: max_waiting requests already wait;
  // kDraining: drain() was called. `out` is set only when accepted.
  Submit submit(RequestOptions options, std::shared_ptr<Request>& out);
  // Stops accepting and waits until nothing runs or waits (or `timeout` passes); returns true when idle.
  bool drain(std::chrono::milliseconds timeout);
  // Cancels every running and waiting request (they finish with FinishReason::kCancelled at the next step).
  void cancel_all();

  // Waits until every prompt cache file queued so far is written or deleted (a no-op without prompt_cache_dir).
  void flush_prompt_cache();

  const model::Model& model() const { return model_; }
  const EngineOptions& options() const { return options_; }
  EngineStats stats() const;
  std::string metrics_text() const;  // Prometheus exposition format, names prefixed "cider_"

 private:
  struct Sequence;
  struct Pooled;
  void load_prompt_cache();
  // Erases it, deleting its file; returns the next entry.
  using PoolIt = std::vector<std::unique_ptr<Pooled>>::iterator;
  PoolIt drop_pooled_locked(PoolIt it);
  // A pooled entry whose tokens start with tokens[0, n) and whose session can go back to n; null if none.
  Pooled* covering_locked(const std::vector<int32_t>& tokens, int64_t n) const;
  // Admitted hits' copies of their entries' prefixes, outside the lock, before the step (a failed copy: a miss).
  void copy_sources();
  void run();
  void admit_locked(std::vector<std::unique_ptr<Sequence>>& admitted);
  void step();
  void finish(Sequence& s, FinishReason reason, const std::string& error);
  static void end_unstarted(Request& r);
  static bool publish_locked(Sequence& s);
  struct Draw {
    int32_t token = -1;
    std::string error;  // the sampler refused the row (NaN logits)
    bool has_logprob = false;
    TokenLogprob logprob;
  };
  void draw(Sequence& s, const float* logits, Draw& out) const;
  // Sampling on the device (Model::forward_batch_candidates): the request a sequence would send — its sampler's
  // candidate request, k raised to top_logprobs so the reported alternatives are among the candidates — or k 0 when
  // its settings need the whole row (logit_bias, presence/frequency penalties once it has tokens, a JSON format, a
  // sampler without top_k); *sampler_k: the sampler's own k. draw_candidates is draw() from the device's answer:
  // the same token and logprobs.
  model::CandidateRequest device_request(const Sequence& s, int64_t* sampler_k) const;
  void draw_candidates(Sequence& s, const model::CandidateRequest& request, int64_t sampler_k,
                       const model::Candidates& c, Draw& out) const;
  void accept(Sequence& s, Draw& d, std::chrono::steady_clock::time_point now);
  // Bytes the prefix pool holds alive: each pooled session's own, and once each, the shared blocks (Model::
  // share_session) that pooled or running sessions hold — without `except`'s share (what its leaving frees).
  // shared_bytes: those shared blocks' bytes.
  int64_t pool_bytes_locked(const Pooled* except = nullptr, int64_t* shared_bytes = nullptr) const;
  // Positions of a pooled session a prompt can reuse given their common prefix: short of the prompt's last token, and
  // down to a multiple of chunk_align_ (per-channel keys: trimming into a quantized block would round its keys again).
  // chunk_align_: the per-channel key block (the cache's group size), else 1.
  int64_t reusable_prefix(int64_t common, int64_t prompt_len) const;

  static constexpr int64_t kMinReuse = 16;  // shorter reusable prefixes are a miss

  const model::Model& model_;
  EngineOptions options_;
  const model::Tokenizer& tok_;
  int64_t vocab_ = 0;
  // Constrained decoding (RequestOptions::json): the bytes each token adds to a reply (decoded after a plain context
  // token), the special tokens empty, and whether they are plain string content (whole UTF-8 characters without
  // '"', '\\' or control characters); built once, at the first such request.
  std::once_flag token_bytes_once_;
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> token_plain_;
  std::vector<std::vector<int32_t>> by_first_byte_;  // the tokens with bytes, by their first byte
  const std::vector<std::string>& token_bytes();

  mutable std::mutex mu_;  // waiting_, pool_, stats_, draining_, stop_, reserved_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // the worker's only
  std::vector<std::unique_ptr<Pooled>> pool_;
  int64_t reserved_ = 0;  // reservations of running sequences
  int64_t running_count_ = 0;
  int64_t running_bytes_ = 0;  // the running sessions' own bytes (their shared blocks: running_shared_)
  std::vector<model::SharedKvBlock> running_shared_;
  uint64_t pool_clock_ = 0;
  bool draining_ = false;
  bool cancel_all_ = false;
  bool stop_ = false;
  EngineStats stats_;
  int64_t chunk_align_ = 1;
  std::vector<std::vector<float>> logits_;  // the worker's logits rows, kept across steps
  std::unique_ptr<PromptCacheStore> store_;       // prompt_cache_dir's files; null without
  std::thread worker_;
};

}  // namespace cider::runtime
