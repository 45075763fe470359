#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/kernel_table.h"
#include "model/transformer.h"
#include "model/session_state.h"
#include "nn/kv_cache.h"
#include "runtime/prompt_cache.h"

namespace cider::runtime {

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kOp = "serve";

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Histogram make_histogram(std::vector<double> bounds) {
  Histogram h;
  h.bounds = std::move(bounds);
  h.counts.assign(h.bounds.size() + 1, 0);
  return h;
}

// log-softmax of one row of logits: (max, log Σ exp(z − max)), the kernel table's log_sum_exp (on the x86 levels
// float32 exp summed in float64; docs/benchmarks.md has the per-row time against the float64 loop it replaced).
std::pair<double, double> log_normalizer(const float* z, int64_t n) {
  double mx = 0.0, lse = 0.0;
  kernels::active_kernels().log_sum_exp({z, n, &mx, &lse});
  return {mx, lse};
}

}  // namespace

const std::vector<std::string>& Engine::token_bytes() {
  std::call_once(token_bytes_once_, [&] {
    std::vector<std::string> t(static_cast<size_t>(vocab_));
    // Each token decoded after a plain one, that one's text cut off: the bytes the token adds mid-reply (a
    // SentencePiece "▁word" keeps its space). Special tokens (and ids the tokenizer lacks) stay empty: never allowed.
    std::vector<int32_t> ids = tok_.encode("a", false);
    const std::string base = tok_.decode(ids, true);
    ids.push_back(0);
    const int64_t n = std::min<int64_t>(vocab_, tok_.vocab_size());
    for (int64_t i = 0; i < n; ++i) {
      const auto id = static_cast<int32_t>(i);
      if (tok_.is_special(id)) continue;
      ids.back() = id;
      try {
        const std::string full = tok_.decode(ids, true);
        t[static_cast<size_t>(i)] =
            full.compare(0, base.size(), base) == 0 ? full.substr(base.size()) : tok_.decode({id}, true);
      } catch (const Error&) {  // an id the vocabulary does not use
      }
    }
    // Plain string content: inside any free string value (the recognizer between characters) the token leaves it
    // there — whole UTF-8 characters, no quote, backslash or control character. Decided by the recognizer itself.
    model::JsonPrefix in_string;
    (void)in_string.feed("{\"a\":\"");
    token_plain_.assign(t.size(), 0);
    by_first_byte_.assign(256, {});
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i].empty()) continue;
      model::JsonPrefix p = in_string;
      token_plain_[i] = p.feed(t[i]) && p.in_free_string() ? 1 : 0;
      by_first_byte_[static_cast<uint8_t>(t[i][0])].push_back(static_cast<int32_t>(i));
    }
    token_bytes_ = std::move(t);
  });
  return token_bytes_;
}

int64_t Engine::reusable_prefix(int64_t common, int64_t prompt_len) const {
  int64_t n = std::min(common, prompt_len - 1);
  n -= n % chunk_align_;
  return std::max<int64_t>(n, 0);
}

int64_t kv_bytes_at(const model::Model& m, int64_t positions) {
  return model::kv_cache_bytes(m.config(), m.options().kv, positions, m.options().kv_full_sliding);
}

int64_t kv_bytes_at_shared(const model::Model& m, int64_t positions, int64_t shared) {
  return model::kv_cache_bytes(m.config(), m.options().kv, positions, m.options().kv_full_sliding, shared);
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "none";
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

RequestUpdate Request::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return has_news_; });
  RequestUpdate out;
  if (!has_news_) {
    out.prompt_tokens = pending_.prompt_tokens;
    out.completion_tokens = pending_.completion_tokens;
    out.cached_tokens = pending_.cached_tokens;
    return out;
  }
  out = std::move(pending_);
  pending_ = RequestUpdate{};
  pending_.prompt_tokens = out.prompt_tokens;
  pending_.completion_tokens = out.completion_tokens;
  pending_.cached_tokens = out.cached_tokens;
  pending_.finished = out.finished;
  pending_.reason = out.reason;
  has_news_ = false;
  return out;
}

struct Engine::Sequence {
  std::shared_ptr<Request> req;
  RequestOptions opt;
  std::unique_ptr<model::Session> session;
  int64_t reserve = 0;            // KV bytes reserved while running
  int64_t positions = 0;          // the most it can hold: prompt + max_tokens, within the context
  int64_t prefilled = 0;          // prompt tokens in the session
  int64_t cached = 0;             // of which reused from the pool
  std::vector<int32_t> history;   // prompt + sampled tokens (the repetition penalty's window)
  std::unordered_map<int32_t, int64_t> counts;  // sampled tokens (presence / frequency penalties)
  std::unique_ptr<model::Sampler> sampler;
  std::optional<model::JsonPrefix> json;  // RequestOptions::json: the reply so far
  std::unique_ptr<model::TokenizerTextStream> text;
  std::string emitted;            // text released by the stop filter since the last publish
  std::string all_text;
  model::TextCallback on_text;
  std::unique_ptr<model::StopFilter> filter;
  std::vector<TokenLogprob> logprobs;  // since the last publish
  int64_t generated = 0;
  int32_t pending_token = -1;     // sampled, not yet in the session
  Clock::time_point submitted, last_token;
  bool done = false;
  FinishReason reason = FinishReason::kNone;
  bool pool = false;             // finished: its session joins the prefix pool
  // Admitted with a hit on a device that copies sessions: the pooled entry whose first `cached` positions run()
  // copies into this sequence's session (outside the engine's lock; the entry stays pooled). Null once copied.
  const Pooled* source = nullptr;
  model::SessionState saved;     // with a prompt cache: the session copied to the host, for its file
};

struct Engine::Pooled {
  std::unique_ptr<model::Session> session;
  std::vector<int32_t> tokens;  // what the session holds, position by position
  uint64_t last_used = 0;
  std::string file;             // its prompt cache file ("": none)
};

Engine::Engine(const model::Model& model, const EngineOptions& options)
    : model_(model), options_(options), tok_(model.tokenizer()), vocab_(model.config().vocab_size) {
  check(options_.max_batch >= 1 && options_.max_batch <= 1024, ErrorCode::kInvalidArgument, kOp,
        "max_batch must be in [1, 1024]; got ", options_.max_batch);
  check(options_.max_waiting >= 0, ErrorCode::kInvalidArgument, kOp, "max_waiting must be >= 0; got ",
        options_.max_waiting);
  check(options_.step_tokens >= 0, ErrorCode::kInvalidArgument, kOp, "step_tokens must be >= 0 (0: one pass); got ",
        options_.step_tokens);
  check(options_.prefix_cache_entries >= 0, ErrorCode::kInvalidArgument, kOp,
        "prefix_cache_entries must be >= 0; got ", options_.prefix_cache_entries);
  check(options_.kv_memory >= 0, ErrorCode::kInvalidArgument, kOp, "kv_memory must be >= 0; got ",
        options_.kv_memory);
  if (options_.kv_memory == 0) options_.kv_memory = options_.max_batch * kv_bytes_at(model_, model_.context_length());
  stats_.kv_memory = options_.kv_memory;
  const nn::KVSpec& kv = model_.options().kv;
  chunk_align_ = kv.quantized && kv.key_layout == nn::KeyLayout::kChannel ? kv.group_size : 1;
  stats_.ttft = make_histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  stats_.itl = make_histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
  stats_.batch_size = make_histogram({1, 2, 4, 8, 16, 32, 64, 128});
  stats_.step_forward = make_histogram({0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1});
  stats_.step_host = make_histogram({0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1});
  if (!options_.prompt_cache_dir.empty()) load_prompt_cache();
  worker_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  store_.reset();  // writes what is queued
}

void Engine::load_prompt_cache() {
  check(options_.prefix_cache_entries > 0, ErrorCode::kInvalidArgument, kOp,
        "a prompt cache directory needs a prefix cache (prefix_cache_entries > 0); got ",
        options_.prefix_cache_entries);
  check(model_.can_snapshot(), ErrorCode::kUnsupported, kOp, "a prompt cache directory needs sessions the host can "
        "copy (the cpu's, or one GPU's); these on the ", model::device_name(model_.options().device), " device cannot be");
  if (!options_.warn)
    options_.warn = [](const std::string& m) { std::fprintf(stderr, "cider: warning: %s\n", m.c_str()); };
  const uint64_t identity = options_.model_identity != 0 ? options_.model_identity : model_identity(model_, "");
  store_ = std::make_unique<PromptCacheStore>(model_, options_.prompt_cache_dir, identity, options_.warn);
  // Newest first, under the live pool's bounds: at most prefix_cache_entries, and their bytes within kv_memory.
  std::vector<std::unique_ptr<Pooled>> loaded;
  int64_t bytes = 0;
  stats_.prompt_cache_loaded = store_->load([&](PromptCacheStore::Loaded& e) {
    const auto b = static_cast<int64_t>(e.session->kv_bytes());
    if (static_cast<int64_t>(loaded.size()) >= options_.prefix_cache_entries || bytes + b > options_.kv_memory)
      return false;
    auto p = std::make_unique<Pooled>();
    p->session = std::move(e.session);
    p->tokens = std::move(e.tokens);
    p->file = e.name;
    loaded.push_back(std::move(p));
    bytes += b;
    return true;
  });
  for (auto it = loaded.rbegin(); it != loaded.rend(); ++it) {  // the oldest is the least recently used
    (*it)->last_used = ++pool_clock_;
    pool_.push_back(std::move(*it));
  }
}

void Engine::flush_prompt_cache() {
  if (store_) store_->flush();
}

Engine::PoolIt Engine::drop_pooled_locked(PoolIt it) {
  if (store_ && !(*it)->file.empty()) store_->remove((*it)->file);
  return pool_.erase(it);
}

Engine::Pooled* Engine::covering_locked(const std::vector<int32_t>& tokens, int64_t n) const {
  for (const auto& p : pool_)
    if (static_cast<int64_t>(p->tokens.size()) >= n &&
        std::equal(tokens.begin(), tokens.begin() + n, p->tokens.begin()) && p->session->can_truncate(n))
      return p.get();
  return nullptr;
}

Engine::Submit Engine::submit(RequestOptions o, std::shared_ptr<Request>& out) {
  const int64_t ctx = model_.context_length();
  const int64_t n = static_cast<int64_t>(o.prompt.size());
  check(n >= 1, ErrorCode::kInvalidArgument, kOp, "the prompt must have at least one token; got 0");
  for (int32_t id : o.prompt)
    check(id >= 0 && id < vocab_, ErrorCode::kInvalidArgument, kOp, "prompt token ids must be in [0, ", vocab_,
          "); got ", id);
  check(n < ctx, ErrorCode::kOutOfRange, kOp, "the prompt must leave room for a reply in the context of ", ctx,
        " tokens; got ", n, " prompt tokens");
  check(o.max_tokens >= 1, ErrorCode::kInvalidArgument, kOp, "max_tokens must be >= 1; got ", o.max_tokens);
  for (const auto& s : o.stop)
    check(!s.empty(), ErrorCode::kInvalidArgument, kOp, "stop strings must not be empty; got \"\"");
  check(o.presence_penalty >= -2.0 && o.presence_penalty <= 2.0, ErrorCode::kInvalidArgument, kOp,
        "presence_penalty must be in [-2, 2]; got ", o.presence_penalty);
  check(o.frequency_penalty >= -2.0 && o.frequency_penalty <= 2.0, ErrorCode::kInvalidArgument, kOp,
        "frequency_penalty must be in [-2, 2]; got ", o.frequency_penalty);
  for (const auto& [id, bias] : o.logit_bias)
    check(id >= 0 && id < vocab_ && std::isfinite(bias), ErrorCode::kInvalidArgument, kOp,
          "logit_bias needs token ids in [0, ", vocab_, ") and finite biases; got ", id, ": ", bias);
  check(o.top_logprobs >= -1 && o.top_logprobs <= 20, ErrorCode::kInvalidArgument, kOp,
        "top_logprobs must be in [0, 20]; got ", o.top_logprobs);
  model::validate_sampler_params(o.sampling);
  const int64_t positions = std::min(ctx, n + o.max_tokens);
  const int64_t reserve = kv_bytes_at(model_, positions);
  check(reserve <= options_.kv_memory, ErrorCode::kOutOfRange, kOp, "the prompt (", n, " tokens) and max_tokens (",
        o.max_tokens, ") need ", reserve, " bytes of KV cache, more than the server's KV memory of ",
        options_.kv_memory, " bytes; send a shorter prompt or a smaller max_tokens");

  auto s = std::make_unique<Sequence>();
  s->req = std::make_shared<Request>();
  s->reserve = reserve;
  s->positions = positions;
  s->submitted = Clock::now();
  s->sampler = std::make_unique<model::Sampler>(o.sampling);
  if (o.json) {
    (void)token_bytes();         // built once, before any draw reads it
    s->json.emplace(o.json.get());  // the schema stays with the sequence's options (moved below, not copied)
  }
  s->text = std::make_unique<model::TokenizerTextStream>(tok_, o.context_token >= 0 ? o.context_token : o.prompt.back());
  s->history = o.prompt;
  s->opt = std::move(o);
  Sequence* sp = s.get();
  s->on_text = [sp](std::string_view piece) { sp->emitted.append(piece); };
  s->filter = std::make_unique<model::StopFilter>(sp->opt.stop, sp->on_text, sp->all_text);
  s->req->pending_.prompt_tokens = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stop_) return Submit::kDraining;
    if (static_cast<int64_t>(waiting_.size()) >= options_.max_waiting &&
        running_count_ + static_cast<int64_t>(waiting_.size()) >= options_.max_batch) {
      ++stats_.requests_refused;
      return Submit::kBusy;
    }
    out = s->req;
    waiting_.push_back(std::move(s));
  }
  cv_.notify_all();
  return Submit::kAccepted;
}

void Engine::cancel_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    cancel_all_ = true;
    for (auto& w : waiting_) w->req->cancel();
  }
  cv_.notify_all();
}

bool Engine::drain(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  return cv_.wait_for(lock, timeout, [&] { return waiting_.empty() && running_count_ == 0; });
}

int64_t Engine::pool_bytes_locked(const Pooled* except, int64_t* shared_bytes) const {
  std::vector<model::SharedKvBlock> shared = running_shared_, mine;
  int64_t b = 0;
  for (const auto& p : pool_) {
    if (p.get() == except) continue;
    mine.clear();
    p->session->shared_kv(mine);
    b += static_cast<int64_t>(p->session->kv_bytes());
    for (const model::SharedKvBlock& k : mine) {
      b -= static_cast<int64_t>(k.bytes);
      shared.push_back(k);
    }
  }
  std::sort(shared.begin(), shared.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  int64_t sb = 0;
  for (size_t i = 0; i < shared.size(); ++i)
    if (i == 0 || shared[i].id != shared[i - 1].id) sb += static_cast<int64_t>(shared[i].bytes);
  if (shared_bytes) *shared_bytes = sb;
  return b + sb;
}

void Engine::admit_locked(std::vector<std::unique_ptr<Sequence>>& admitted) {
  // The pooled entries this round's hits copy (run() copies them after the lock is released, before anything else
  // changes the pool): not evicted, nor taken, in this round.
  std::vector<const Pooled*> sources;
  const auto is_source = [&](const Pooled* p) { return std::find(sources.begin(), sources.end(), p) != sources.end(); };
  const bool copies = model_.can_copy_sessions();
  while (!waiting_.empty() && running_count_ + static_cast<int64_t>(admitted.size()) < options_.max_batch) {
    Sequence& s = *waiting_.front();
    if (s.req->cancelled()) {
      admitted.push_back(std::move(waiting_.front()));  // finished as cancelled by the worker
      waiting_.pop_front();
      continue;
    }
    // The pooled session sharing the longest reusable prefix with the prompt (reusable_prefix: short of the prompt's
    // last token, on a block boundary for per-channel keys); a match shorter than kMinReuse is not worth a copy (or,
    // where sessions cannot be copied, taking a pooled session away from the requests that may share more of it):
    // every prompt shares its BOS.
    const auto& prompt = s.opt.prompt;
    Pooled* src = nullptr;
    int64_t best_len = 0;
    for (const auto& p : pool_) {
      const auto& t = p->tokens;
      const size_t lim = std::min(t.size(), prompt.size());
      size_t k = 0;
      while (k < lim && t[k] == prompt[k]) ++k;
      const int64_t len = reusable_prefix(static_cast<int64_t>(k), static_cast<int64_t>(prompt.size()));
      // A session whose sliding-window layers dropped what going back to len needs is a miss.
      if (len >= kMinReuse && len > best_len && p->session->can_truncate(len)) {
        best_len = len;
        src = p.get();
      }
    }
    // Room under the KV bound for the request's reservation (a copy is its session, counted there like any
    // sequence's; a copy shares the pooled session's blocks of the layers without a sliding window — counted once,
    // with the pool — so it reserves only the positions after them there): evict pooled sessions, least recently
    // used first, but not the one it hits nor this round's sources.
    // A hit of at least one storage step (KVCache::kStep positions; a shorter prefix shared saves no storage: a
    // cache's storage grows by that step) shares the entry's complete blocks: they become shared segments when it is
    // first copied so (Model::share_session: one copy of them, then none per request), and the request reserves
    // only the positions after them in those layers. An entry never hit so keeps its one cache.
    bool shares = src && copies && model_.can_share_sessions() && options_.share_prefixes &&
                  best_len >= nn::KVCache::kStep;
    if (shares) {
      try {
        model_.share_session(*src->session);
      } catch (const std::exception&) {  // (memory) the entry stays as it was, whole: this hit copies
        shares = false;
      }
    }
    const int64_t reserve = shares ? kv_bytes_at_shared(model_, s.positions, best_len) : s.reserve;
    const auto fits = [&](int64_t pooled) { return reserved_ + reserve + pooled <= options_.kv_memory; };
    int64_t pool_bytes = pool_bytes_locked();
    while (!fits(pool_bytes)) {
      auto lru = pool_.end();
      for (auto it = pool_.begin(); it != pool_.end(); ++it)
        if (it->get() != src && !is_source(it->get()) && (lru == pool_.end() || (*it)->last_used < (*lru)->last_used))
          lru = it;
      if (lru == pool_.end()) break;
      drop_pooled_locked(lru);
      pool_bytes = pool_bytes_locked();
    }
    // Take the hit's session out of the pool instead of copying it where sessions cannot be copied (the CUDA device),
    // or where only its own bytes leaving the pool make room for the request (not when this round copies it).
    const bool take = src && (!copies || !fits(pool_bytes)) && !is_source(src);
    // A taken session keeps its whole reservation (its shared blocks, also counted with the pool while others hold
    // them, are within it: counted twice at worst, never missed).
    if (take) {
      if (s.reserve + reserved_ + pool_bytes_locked(src) > options_.kv_memory) break;  // not now: wait for one to end
    } else if (!fits(pool_bytes)) {
      break;  // not now: wait for a running sequence to finish
    }
    if (!take) s.reserve = reserve;
    if (take) {
      // Out of the pool, so off the disk (it comes back, longer, when the request ends).
      auto it = std::find_if(pool_.begin(), pool_.end(), [&](const auto& p) { return p.get() == src; });
      s.session = std::move((*it)->session);
      drop_pooled_locked(it);
      s.session->trim(s.session->position() - best_len);
      s.prefilled = s.cached = best_len;
    } else if (src) {
      // Copy on take: the entry stays pooled, most recently used; run() copies its prefix into the new session.
      src->last_used = ++pool_clock_;
      sources.push_back(src);
      s.source = src;
      s.prefilled = s.cached = best_len;
    } else {
      s.session = model_.new_session();
    }
    reserved_ += s.reserve;
    admitted.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

// The admitted hits' copies of their pooled prefixes (Model::copy_session: only the kept positions, on the session's
// device), outside the engine's lock: nothing changes the pool between admit_locked() and this (the worker alone
// evicts and pools). A copy that fails (memory) makes the request a miss.
void Engine::copy_sources() {
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (!s.source) continue;
    try {
      s.session = model_.copy_session(*s.source->session, s.cached);
    } catch (const std::exception&) {
      s.session = model_.new_session();
      s.prefilled = s.cached = 0;
      // A miss holds its whole prefix: back to the full reservation (a shared hit reserved only its own positions).
      const int64_t full = kv_bytes_at(model_, s.positions);
      std::lock_guard<std::mutex> lock(mu_);
      reserved_ += full - s.reserve;
      s.reserve = full;
    }
    s.source = nullptr;
  }
}

// A request that never ran ends as cancelled.
void Engine::end_unstarted(Request& r) {
  std::lock_guard<std::mutex> rl(r.mu_);
  r.pending_.finished = true;
  r.pending_.reason = FinishReason::kCancelled;
  r.has_news_ = true;
  r.cv_.notify_all();
}

// Moves what the sequence produced since the last publish into its request's pending update (the request's mutex
// held); returns whether there was anything.
bool Engine::publish_locked(Sequence& s) {
  RequestUpdate& u = s.req->pending_;
  const bool news = !s.emitted.empty() || !s.logprobs.empty();
  u.text += s.emitted;
  for (auto& l : s.logprobs) u.logprobs.push_back(std::move(l));
  u.completion_tokens = s.generated;
  u.cached_tokens = s.cached;
  s.emitted.clear();
  s.logprobs.clear();
  return news;
}

void Engine::run() {
  while (true) {
    {
      std::vector<std::unique_ptr<Sequence>> admitted;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !running_.empty() || !waiting_.empty(); });
      if (stop_) break;
      admit_locked(admitted);
      for (auto& s : admitted) {
        if (s->req->cancelled() && !s->session && !s->source) {  // cancelled while waiting
          ++stats_.requests_cancelled;
          end_unstarted(*s->req);
          continue;
        }
        running_.push_back(std::move(s));
      }
      running_count_ = static_cast<int64_t>(running_.size());
      if (cancel_all_)
        for (auto& r : running_) r->req->cancel();
      if (running_.empty()) {
        cv_.notify_all();  // drain() waits for this
        if (!waiting_.empty()) cv_.wait_for(lock, std::chrono::milliseconds(5));  // blocked by the KV bound
        continue;
      }
    }
    copy_sources();
    step();
  }
  // Stopped: everything unfinished ends as cancelled.
  for (auto& s : running_) finish(*s, FinishReason::kCancelled, "");
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : waiting_) end_unstarted(*s->req);
  waiting_.clear();
}

void Engine::finish(Sequence& s, FinishReason reason, const std::string& error) {
  if (s.done) return;
  s.done = true;
  s.reason = reason;
  {
    // No longer counted as running, and counted as finished, before the client hears of the end: a client that sends
    // its next request (or reads /metrics) the moment its stream ends sees the room and the counts (the sequence
    // leaves running_, and its session goes to the prefix pool, at the end of the step).
    std::lock_guard<std::mutex> lock(mu_);
    --running_count_;
    switch (reason) {
      case FinishReason::kCancelled: ++stats_.requests_cancelled; break;
      case FinishReason::kError: ++stats_.requests_failed; break;
      default: ++stats_.requests_finished; break;
    }
    stats_.prompt_tokens += s.opt.prompt.size();
    stats_.cached_prompt_tokens += static_cast<uint64_t>(s.cached);
    if (s.cached > 0) ++stats_.prefix_cache_hits;
    stats_.generated_tokens += static_cast<uint64_t>(s.generated);
  }
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) s.filter->finish();
  {
    std::lock_guard<std::mutex> rl(s.req->mu_);
    (void)publish_locked(s);
    RequestUpdate& u = s.req->pending_;
    u.finished = true;
    u.reason = reason;
    u.error = error;
    s.req->has_news_ = true;
  }
  s.req->cv_.notify_all();
}

// Penalties, logprobs and the draw for a sequence whose forward row was its last: the sequence's own state only
// (its sampler, history and counts), so that the sequences of a step draw in parallel.
void Engine::draw(Sequence& s, const float* logits, Draw& out) const {
  const float* z = logits;
  std::vector<float> penalised;
  if (!s.opt.logit_bias.empty() ||
      ((s.opt.presence_penalty != 0.0 || s.opt.frequency_penalty != 0.0) && !s.counts.empty())) {
    penalised.assign(logits, logits + vocab_);
    for (const auto& [id, bias] : s.opt.logit_bias) penalised[static_cast<size_t>(id)] += bias;
    for (const auto& [id, count] : s.counts)
      penalised[static_cast<size_t>(id)] -= static_cast<float>(s.opt.presence_penalty +
                                                               s.opt.frequency_penalty * static_cast<double>(count));
    z = penalised.data();
  }
  // JSON constrained decoding: every token whose bytes cannot continue the reply as a JSON object, the special and
  // end tokens among them, gets −inf for the draw (the logprobs below stay the model's own distribution).
  // Only the tokens whose first byte the recognizer takes are looked at (few outside strings); inside a free string
  // plain text tokens pass without a copy of the state.
  std::vector<float> allowed;
  if (s.json) {
    const float kNegInf = -std::numeric_limits<float>::infinity();
    allowed.assign(static_cast<size_t>(vocab_), kNegInf);
    const bool free_string = s.json->in_free_string();
    for (int b = 0; b < 256; ++b) {
      model::JsonPrefix first = *s.json;
      if (!first.feed(static_cast<uint8_t>(b))) continue;
      for (int32_t id : by_first_byte_[static_cast<size_t>(b)]) {
        const auto i = static_cast<size_t>(id);
        if (!(free_string && token_plain_[i])) {
          model::JsonPrefix p = *s.json;
          if (!p.feed(token_bytes_[i])) continue;
        }
        allowed[i] = z[i];
      }
    }
    for (int32_t id : s.opt.end_tokens)
      if (id >= 0 && id < vocab_) allowed[static_cast<size_t>(id)] = kNegInf;
  }
  try {
    out.token = s.sampler->sample(s.json ? allowed.data() : z, vocab_, s.history);
  } catch (const std::exception& e) {
    out.error = e.what();
    return;
  }
  out.has_logprob = s.opt.top_logprobs >= 0;
  if (out.has_logprob) {
    // The model's distribution (after the OpenAI penalties, before temperature and truncation), as OpenAI reports.
    const auto [mx, lse] = log_normalizer(z, vocab_);
    TokenLogprob& lp = out.logprob;
    lp.id = out.token;
    lp.logprob = static_cast<double>(z[out.token]) - mx - lse;
    // The top k (logit desc, id asc) in one pass with a small sorted list (k <= 20).
    const size_t k = static_cast<size_t>(std::min<int64_t>(s.opt.top_logprobs, vocab_));
    std::vector<int32_t> top;
    top.reserve(k + 1);
    const auto before = [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
    // In index order a token equal to the list's last never goes before it: once the list is full, only logits above
    // its last get in (one comparison per token for the rest). NaN never passes the bar, as it never passed before().
    float bar = -std::numeric_limits<float>::infinity();  // read once the list is full
    for (int32_t i = 0; i < static_cast<int32_t>(vocab_) && k > 0; ++i) {
      if (top.size() == k && !(z[i] > bar)) continue;
      top.insert(std::upper_bound(top.begin(), top.end(), i, before), i);
      if (top.size() > k) top.pop_back();
      if (top.size() == k) bar = z[top.back()];
    }
    for (int32_t id : top) lp.top.emplace_back(id, static_cast<double>(z[id]) - mx - lse);
  }
}

model::CandidateRequest Engine::device_request(const Sequence& s, int64_t* sampler_k) const {
  if (s.json || !s.opt.logit_bias.empty() ||
      ((s.opt.presence_penalty != 0.0 || s.opt.frequency_penalty != 0.0) && !s.counts.empty()))
    return {};
  model::CandidateRequest r = s.sampler->candidate_request(vocab_, s.history);
  if (r.k < 1) return {};
  *sampler_k = r.k;
  r.k = std::max<int64_t>(r.k, s.opt.top_logprobs);
  if (r.k > std::min<int64_t>(model::kDeviceTopkMax, vocab_)) return {};
  return r;
}

void Engine::draw_candidates(Sequence& s, const model::CandidateRequest& request, int64_t sampler_k,
                             const model::Candidates& c, Draw& out) const {
  // The sampler's own request asks for its k (top_k, or 1 when greedy): the device's first k answer it exactly.
  model::CandidateRequest mine = request;
  mine.k = sampler_k;
  model::Candidates first = c;
  first.ids.resize(static_cast<size_t>(mine.k));
  first.logits.resize(static_cast<size_t>(mine.k));
  try {
    out.token = s.sampler->sample_candidates(mine, first, vocab_);
  } catch (const std::exception& e) {
    out.error = e.what();
    return;
  }
  out.has_logprob = s.opt.top_logprobs >= 0;
  // The raw row's distribution: no OpenAI penalties or bias on this path (device_request).
  if (out.has_logprob) out.logprob = logprob_from_candidates(request, c, out.token, s.opt.top_logprobs);
}

TokenLogprob logprob_from_candidates(const model::CandidateRequest& request, const model::Candidates& c, int32_t token,
                                     int64_t n) {
  // The candidates and the excluded tokens by (logit desc, id asc): the row's best tokens, the first n of them.
  std::vector<std::pair<float, int32_t>> best;
  for (size_t i = 0; i < c.ids.size(); ++i)
    if (c.ids[i] >= 0) best.emplace_back(c.logits[i], c.ids[i]);
  for (size_t i = 0; i < request.excluded.size(); ++i) best.emplace_back(c.excluded_logits[i], request.excluded[i]);
  std::sort(best.begin(), best.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const double mx = c.row_max, lse = c.row_log_sum;
  TokenLogprob lp;
  lp.id = token;
  lp.logprob = -std::numeric_limits<double>::infinity();
  for (const auto& [z, id] : best)
    if (id == token) lp.logprob = static_cast<double>(z) - mx - lse;
  const size_t k = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(n, 0)), best.size());
  for (size_t i = 0; i < k; ++i) lp.top.emplace_back(best[i].second, static_cast<double>(best[i].first) - mx - lse);
  return lp;
}

// The drawn token into the sequence: streamed through the stop filter, or the end of the sequence.
void Engine::accept(Sequence& s, Draw& d, Clock::time_point now) {
  if (!d.error.empty()) return finish(s, FinishReason::kError, d.error);
  const int32_t token = d.token;
  if (d.has_logprob) s.logprobs.push_back(std::move(d.logprob));
  ++s.generated;
  s.history.push_back(token);
  ++s.counts[token];
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s.generated == 1)
      stats_.ttft.observe(seconds_between(s.submitted, now));
    else
      stats_.itl.observe(seconds_between(s.last_token, now));
  }
  s.last_token = now;

  const auto end = [&](FinishReason reason, bool by_string) {
    if (!by_string && s.filter->add(s.text->flush())) reason = FinishReason::kStop;
    finish(s, reason, "");
  };
  if (std::find(s.opt.end_tokens.begin(), s.opt.end_tokens.end(), token) != s.opt.end_tokens.end())
    return end(FinishReason::kStop, false);
  if (s.filter->add(s.text->push(token))) return end(FinishReason::kStop, true);
  if (s.json) {  // the draw allowed only tokens that continue the object
    (void)s.json->feed(token_bytes_[static_cast<size_t>(token)]);
    if (s.json->complete()) return end(FinishReason::kStop, false);
  }
  if (s.generated >= s.opt.max_tokens || s.session->position() >= model_.context_length())
    return end(FinishReason::kLength, false);
  s.pending_token = token;
}

void Engine::step() {
  // Rows of this step: decode rows first, then prompt chunks in admission order.
  struct Item {
    Sequence* s;
    const int32_t* tokens;
    int64_t n;
    bool last;  // its logits feed a draw
  };
  std::vector<Item> items;
  int64_t decode_rows = 0;
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.req->cancelled()) continue;
    if (s.prefilled == static_cast<int64_t>(s.opt.prompt.size())) {
      items.push_back({&s, &s.pending_token, 1, true});
      ++decode_rows;
    }
  }
  // Prompt chunks end on multiples of chunk_align_ (absolute positions) or at the prompt's end: a cache with
  // per-channel key blocks then sees every block completed inside one chunk, as a request alone would. And the step
  // stays within one pass of the model (Model::pass_rows()), so no chunk is split between passes. Together: a
  // sequence's numbers do not depend on what else runs. (With more than pass_rows - chunk_align_ sequences decoding,
  // prompts wait for rows.)
  const int64_t pass = model_.pass_rows();
  int64_t budget = (options_.step_tokens > 0 ? std::min(options_.step_tokens, pass) : pass) - decode_rows;
  for (auto& sp : running_) {
    Sequence& s = *sp;
    const int64_t len = static_cast<int64_t>(s.opt.prompt.size());
    const int64_t rest = len - s.prefilled;
    if (s.req->cancelled() || rest == 0 || budget <= 0) continue;
    int64_t end = s.prefilled + std::min(rest, budget);
    if (end < len) end -= end % chunk_align_;
    if (end <= s.prefilled) continue;  // less than one block of room left in this step
    const int64_t n = end - s.prefilled;
    budget -= n;
    items.push_back({&s, s.opt.prompt.data() + s.prefilled, n, end == len});
  }
  std::vector<std::vector<float>>& logits = logits_;  // one row per item, kept across steps
  if (logits.size() < items.size()) logits.resize(items.size());
  std::vector<model::Model::BatchItem> batch;
  for (size_t i = 0; i < items.size(); ++i) {
    logits[i].resize(static_cast<size_t>(vocab_));
    batch.push_back({items[i].s->session.get(), items[i].tokens, items[i].n, logits[i].data(), false});
  }
  // A step of decode rows only samples on the device where every sequence's settings allow it (device_request):
  // k candidates and the row's normalizer cross to the host instead of the vocabulary.
  std::vector<model::CandidateRequest> requests;
  std::vector<int64_t> sampler_k(items.size());
  if (!items.empty() && decode_rows == static_cast<int64_t>(items.size()) && model_.samples_on_device()) {
    for (const Item& it : items) {
      requests.push_back(device_request(*it.s, &sampler_k[requests.size()]));
      if (requests.back().k < 1) {
        requests.clear();
        break;
      }
    }
  }
  std::vector<model::Candidates> answers(requests.size());
  bool on_device = false;
  std::string error;
  const Clock::time_point t0 = Clock::now();
  if (!batch.empty()) {
    try {
      on_device = !requests.empty() && model_.forward_batch_candidates(batch, requests, answers);
      if (!on_device) model_.forward_batch(batch);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const Clock::time_point t1 = Clock::now();
  // The draws of the step's sequences in parallel (each touches its own sequence only; a vocabulary-wide softmax per
  // sequence is most of a decode step's host work), then their effects in order.
  std::vector<size_t> drawing;
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence& s = *items[i].s;
    if (!error.empty()) {
      finish(s, FinishReason::kError, error);
      continue;
    }
    if (items[i].tokens != &s.pending_token) s.prefilled += items[i].n;
    if (items[i].last) drawing.push_back(i);
  }
  std::vector<Draw> draws(drawing.size());
  if (on_device) {  // a few dozen candidates each: cheaper here than waking the pool
    for (size_t j = 0; j < drawing.size(); ++j)
      draw_candidates(*items[drawing[j]].s, requests[drawing[j]], sampler_k[drawing[j]], answers[drawing[j]], draws[j]);
  } else {
    default_thread_pool().parallel_for(static_cast<int64_t>(drawing.size()), [&](int64_t b, int64_t e, int) {
      for (int64_t j = b; j < e; ++j)
        draw(*items[drawing[static_cast<size_t>(j)]].s, logits[drawing[static_cast<size_t>(j)]].data(),
             draws[static_cast<size_t>(j)]);
    });
  }
  for (size_t j = 0; j < drawing.size(); ++j) accept(*items[drawing[j]].s, draws[j], t1);
  for (auto& sp : running_)
    if (sp->req->cancelled()) finish(*sp, FinishReason::kCancelled, "");
  // The finished sessions that join the prefix pool: not one whose tokens a pooled entry already holds (that entry,
  // able to go back to them, becomes the most recently used instead). With a prompt cache each is copied to the host
  // for its file here, outside the engine's lock (the writer thread writes it).
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& sp : running_) {
      Sequence& s = *sp;
      s.pool = s.done && options_.prefix_cache_entries > 0 && s.session && s.reason != FinishReason::kError &&
               s.session->position() > 0;
      if (!s.pool) continue;
      if (Pooled* c = covering_locked(s.history, s.session->position())) {
        c->last_used = ++pool_clock_;
        s.pool = false;
      }
    }
  }
  for (auto& sp : running_)
    if (sp->pool && store_) sp->saved = model_.snapshot(*sp->session);

  // Publish, release the finished ones (into the prefix pool), update the statistics.
  for (auto& sp : running_) {
    Sequence& s = *sp;
    if (s.done) continue;  // finish() published it
    std::lock_guard<std::mutex> rl(s.req->mu_);
    if (publish_locked(s)) {
      s.req->has_news_ = true;
      s.req->cv_.notify_all();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.last_batch = static_cast<int64_t>(items.size());
  if (!items.empty()) {
    stats_.batch_size.observe(static_cast<double>(items.size()));
    stats_.step_forward.observe(seconds_between(t0, t1));
    stats_.step_host.observe(seconds_between(t1, Clock::now()));
  }
  running_bytes_ = 0;
  running_shared_.clear();
  for (auto it = running_.begin(); it != running_.end();) {
    Sequence& s = **it;
    if (!s.done) {
      std::vector<model::SharedKvBlock> mine;
      s.session->shared_kv(mine);
      running_bytes_ += static_cast<int64_t>(s.session->kv_bytes());
      for (const model::SharedKvBlock& k : mine) running_bytes_ -= static_cast<int64_t>(k.bytes);
      running_shared_.insert(running_shared_.end(), mine.begin(), mine.end());
      ++it;
      continue;
    }
    reserved_ -= s.reserve;
    // Into the prefix pool: the tokens the session holds (the prompt, then the sampled tokens that went in). One
    // entry per prefix: an entry holding the same tokens or more (another sequence of this step's) keeps them, and
    // entries holding a prefix of them that the new session can go back to leave (the longer one is kept).
    const int64_t n = s.session ? s.session->position() : 0;
    if (s.pool) {
      if (Pooled* c = covering_locked(s.history, n)) {
        c->last_used = ++pool_clock_;
        s.pool = false;
      }
    }
    if (s.pool) {
      for (auto pit = pool_.begin(); pit != pool_.end();) {
        const auto& t = (*pit)->tokens;
        if (static_cast<int64_t>(t.size()) < n && std::equal(t.begin(), t.end(), s.history.begin()) &&
            s.session->can_truncate(static_cast<int64_t>(t.size())))
          pit = drop_pooled_locked(pit);
        else
          ++pit;
      }
      // Room first (s.pool implies a bound of at least 1): the least recently used entries leave before the new one
      // is queued for the disk, so that the directory never holds more files than the bound, not even between the
      // store's two jobs.
      while (static_cast<int64_t>(pool_.size()) >= options_.prefix_cache_entries) {
        auto lru = std::min_element(pool_.begin(), pool_.end(),
                                    [](const auto& a, const auto& b) { return a->last_used < b->last_used; });
        drop_pooled_locked(lru);
      }
      auto p = std::make_unique<Pooled>();
      p->tokens = s.history;
      p->tokens.resize(static_cast<size_t>(n));
      p->session = std::move(s.session);
      p->last_used = ++pool_clock_;
      if (store_) p->file = store_->write(p->tokens, std::move(s.saved));
      pool_.push_back(std::move(p));
    }
    it = running_.erase(it);
  }
  running_count_ = static_cast<int64_t>(running_.size());
  if (running_.empty()) cv_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats st = stats_;
  st.running = running_count_;
  st.waiting = static_cast<int64_t>(waiting_.size());
  st.pooled = static_cast<int64_t>(pool_.size());
  const int64_t pooled = pool_bytes_locked(nullptr, &st.kv_bytes_shared);
  st.kv_bytes_pooled = pooled;
  st.kv_bytes_in_use = running_bytes_ + pooled;
  st.kv_bytes_reserved = reserved_ + pooled;
  return st;
}

std::string Engine::metrics_text() const {
  const EngineStats st = stats();
  std::ostringstream o;
  const auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    o << "# HELP cider_" << name << ' ' << help << "\n# TYPE cider_" << name << ' ' << type << "\ncider_" << name << ' '
      << value << '\n';
  };
  const auto histogram = [&](const char* name, const char* help, const Histogram& h) {
    o << "# HELP cider_" << name << ' ' << help << "\n# TYPE cider_" << name << " histogram\n";
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      o << "cider_" << name << "_bucket{le=\"" << h.bounds[i] << "\"} " << cum << '\n';
    }
    o << "cider_" << name << "_bucket{le=\"+Inf\"} " << h.count << '\n';
    o << "cider_" << name << "_sum " << h.sum << "\ncider_" << name << "_count " << h.count << '\n';
  };
  o << "# HELP cider_requests_total Requests by outcome.\n# TYPE cider_requests_total counter\n";
  o << "cider_requests_total{outcome=\"finished\"} " << st.requests_finished << '\n';
  o << "cider_requests_total{outcome=\"cancelled\"} " << st.requests_cancelled << '\n';
  o << "cider_requests_total{outcome=\"failed\"} " << st.requests_failed << '\n';
  o << "cider_requests_total{outcome=\"refused\"} " << st.requests_refused << '\n';
  metric("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", st.prompt_tokens);
  metric("prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prefix cache.", st.cached_prompt_tokens);
  metric("prefix_cache_hits_total", "counter", "Finished requests that reused a pooled prefix.", st.prefix_cache_hits);
  metric("generation_tokens_total", "counter", "Tokens sampled.", st.generated_tokens);
  metric("steps_total", "counter", "Batched forward steps.", st.steps);
  metric("requests_running", "gauge", "Sequences in the batch.", st.running);
  metric("requests_waiting", "gauge", "Requests queued for admission.", st.waiting);
  metric("batch_size", "gauge", "Sequences in the last step.", st.last_batch);
  metric("prefix_cache_entries", "gauge", "Finished sequences kept for prefix reuse.", st.pooled);
  metric("prefix_cache_bytes", "gauge", "KV bytes held by the prefix cache's entries.", st.kv_bytes_pooled);
  metric("kv_shared_bytes", "gauge",
         "KV bytes of shared prefix blocks, held once by the pooled and running sequences that share them.",
         st.kv_bytes_shared);
  metric("kv_bytes_in_use", "gauge", "KV cache bytes allocated by running and pooled sequences.", st.kv_bytes_in_use);
  metric("kv_bytes_reserved", "gauge", "KV bytes reserved by running sequences plus those of pooled ones.",
         st.kv_bytes_reserved);
  metric("kv_memory_bytes", "gauge", "The KV memory bound (--kv-memory).", st.kv_memory);
  histogram("time_to_first_token_seconds", "From submission to the first sampled token.", st.ttft);
  histogram("inter_token_latency_seconds", "Between consecutive sampled tokens of a sequence.", st.itl);
  histogram("step_batch_size", "Sequences per batched forward step.", st.batch_size);
  histogram("step_forward_seconds", "A step's batched model forward (logits on the host).", st.step_forward);
  histogram("step_host_seconds", "A step's host work after the forward: draws, stop strings, publishing.", st.step_host);
  return o.str();
}

}  // namespace cider::runtime
