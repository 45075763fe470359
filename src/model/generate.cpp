#define CIDER_GENERATE_LOOP_ONLY  // see generate.h
#include "model/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace cider::model {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

bool StopFilter::add(const std::string& piece) {
  pending_ += piece;
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    emit(pending_.substr(0, first));
    pending_.clear();
    return true;
  }
  // Hold the longest tail of pending_ that is a proper prefix of some stop string. A stop string begins with a
  // UTF-8 lead byte, so the split never cuts a character.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  emit(pending_.substr(0, pending_.size() - hold));
  pending_.erase(0, pending_.size() - hold);
  return false;
}

void StopFilter::finish() {
  emit(pending_);
  pending_.clear();
}

void StopFilter::emit(const std::string& s) {
  if (s.empty()) return;
  all_ += s;
  if (out_) out_(s);
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kEos: return "eos";
    case StopReason::kStopString: return "stop string";
    case StopReason::kMaxTokens: return "max tokens";
    case StopReason::kContextFull: return "context full";
  }
  return "unknown";
}

double GenerationStats::prompt_tokens_per_second() const {
  return prompt_seconds > 0 ? static_cast<double>(prompt_tokens) / prompt_seconds : 0.0;
}
double GenerationStats::generation_tokens_per_second() const {
  return generation_seconds > 0 ? static_cast<double>(generated_tokens) / generation_seconds : 0.0;
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes < 1024.0) {
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  } else if (bytes < 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  } else if (bytes < 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  } else {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  }
  return buf;
}

std::string GenerationStats::line() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "prompt %lld tokens (%.1f tok/s) | generated %lld tokens (%.1f tok/s)",
                static_cast<long long>(prompt_tokens), prompt_tokens_per_second(),
                static_cast<long long>(generated_tokens), generation_tokens_per_second());
  std::string s = buf;
  s += " | peak RSS " + (peak_rss_bytes >= 0 ? format_bytes(static_cast<double>(peak_rss_bytes)) : std::string("?"));
  s += " | KV " + format_bytes(static_cast<double>(kv_bytes));
  s += " | weights " + format_bytes(static_cast<double>(weight_bytes));
  return s;
}

namespace {
// A "Key:  N kB" line of /proc/self/status in bytes, or -1.
int64_t proc_status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream in(line.substr(key.size()));
    int64_t kib = -1;
    std::string unit;
    if (in >> kib >> unit && unit == "kB") return kib * 1024;
    return -1;
  }
  return -1;
}
}  // namespace

int64_t peak_rss_bytes() { return proc_status_bytes("VmHWM:"); }
int64_t resident_bytes() { return proc_status_bytes("VmRSS:"); }

GenerationResult generate(LogitsSource& source, TextStream& text, Sampler& sampler, std::vector<int32_t>& history,
                          std::span<const int32_t> prompt, const GenerateOptions& options,
                          const TextCallback& on_text) {
  check(options.max_tokens >= 0, ErrorCode::kInvalidArgument, "generate", "max_tokens must be >= 0; got ",
        options.max_tokens);
  check(options.prefill_chunk >= 1, ErrorCode::kInvalidArgument, "generate", "prefill_chunk must be >= 1; got ",
        options.prefill_chunk);
  for (const auto& s : options.stop)
    check(!s.empty(), ErrorCode::kInvalidArgument, "generate", "stop strings must not be empty; got \"\"");
  check(!prompt.empty(), ErrorCode::kInvalidArgument, "generate", "the prompt must have at least one token; got 0");
  const int64_t vocab = source.vocab_size();
  const int64_t ctx = source.context_length();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  check(source.position() + n_prompt <= ctx, ErrorCode::kOutOfRange, "generate", "the prompt (", n_prompt,
        " tokens, after ", source.position(), " already in the context) must fit the context of ", ctx,
        " tokens; got ", source.position() + n_prompt, " tokens");
  for (int32_t id : prompt)
    check(id >= 0 && id < vocab, ErrorCode::kInvalidArgument, "generate", "prompt token ids must be in [0, ", vocab,
          "); got ", id);

  GenerationResult result;
  std::vector<float> logits(static_cast<size_t>(vocab));
  // The forward call whose logits the next draw uses: where the source keeps the logits on a device and the
  // sampler's settings allow it, the device answers with the top-k candidates (the same token: model/sampler.h);
  // otherwise the whole row comes back.
  CandidateRequest request;
  Candidates candidates;
  bool from_candidates = false;
  auto forward_for_draw = [&](const int32_t* tokens, int64_t n) {
    request = sampler.candidate_request(vocab, history);
    from_candidates = request.k > 0 && source.forward_candidates(tokens, n, request, candidates);
    if (!from_candidates) source.forward(tokens, n, logits.data());
  };

  const auto t_prefill = Clock::now();
  const size_t history_before = history.size();
  history.insert(history.end(), prompt.begin(), prompt.end());  // the next draw's history
  try {
    for (int64_t i = 0; i < n_prompt; i += options.prefill_chunk) {
      const int64_t n = std::min(options.prefill_chunk, n_prompt - i);
      if (i + n < n_prompt) source.forward(prompt.data() + i, n, logits.data());
      else forward_for_draw(prompt.data() + i, n);
    }
  } catch (...) {
    history.resize(history_before);
    throw;
  }
  result.stats.prompt_tokens = n_prompt;
  result.stats.prompt_seconds = seconds_since(t_prefill);

  const auto t_gen = Clock::now();
  StopFilter filter(options.stop, on_text, result.text);
  bool stopped_by_string = false;
  result.reason = StopReason::kMaxTokens;
  for (int64_t step = 0; step < options.max_tokens; ++step) {
    const int32_t token = from_candidates ? sampler.sample_candidates(request, candidates, vocab)
                                          : sampler.sample(logits.data(), vocab, history);
    result.tokens.push_back(token);
    history.push_back(token);
    result.last_token_pending = true;
    if (std::find(options.eos_ids.begin(), options.eos_ids.end(), token) != options.eos_ids.end()) {
      result.reason = StopReason::kEos;
      break;
    }
    if (filter.add(text.push(token))) {
      stopped_by_string = true;
      result.reason = StopReason::kStopString;
      break;
    }
    if (step + 1 == options.max_tokens) break;
    if (source.position() >= ctx) {
      result.reason = StopReason::kContextFull;
      break;
    }
    forward_for_draw(&token, 1);
    result.last_token_pending = false;
  }
  if (!stopped_by_string) {
    if (filter.add(text.flush()))
      result.reason = StopReason::kStopString;
    else
      filter.finish();
  }
  result.stats.generated_tokens = static_cast<int64_t>(result.tokens.size());
  result.stats.generation_seconds = seconds_since(t_gen);
  result.stats.peak_rss_bytes = peak_rss_bytes();
  result.stats.kv_bytes = source.kv_bytes();
  result.stats.weight_bytes = source.weight_bytes();
  return result;
}

}  // namespace cider::model
