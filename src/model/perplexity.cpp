#include "model/perplexity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "model/tokenizer.h"

namespace cider::model {

namespace {

// Running mean and sum of squared deviations of a per-token quantity (Welford's update: no cancellation, so a
// constant quantity has a standard error of exactly 0).
struct Accumulator {
  double mean = 0.0, m2 = 0.0;
  int64_t n = 0;
  void add(double x) {
    ++n;
    const double d = x - mean;
    mean += d / static_cast<double>(n);
    m2 += d * (x - mean);
  }
  PerplexityStats stats() const {
    PerplexityStats s;
    s.mean = mean;
    if (n > 1) s.se = std::sqrt(m2 / static_cast<double>(n - 1) / static_cast<double>(n));
    return s;
  }
};

int64_t argmax(const double* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

void check_finite(const float* row, int64_t vocab, int64_t window, int64_t pos, const char* which) {
  for (int64_t v = 0; v < vocab; ++v)
    check(std::isfinite(row[v]), ErrorCode::kInvalidArgument, "perplexity", "the ", which,
          " model's logits must be finite; got ", row[v], " in window ", window, ", position ", pos, ", token ", v);
}

}  // namespace

void log_softmax(const float* logits, int64_t n, double* out) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

double kl_divergence(const float* base_logits, const float* test_logits, int64_t n) {
  std::vector<double> lb(static_cast<size_t>(n)), lt(static_cast<size_t>(n));
  log_softmax(base_logits, n, lb.data());
  log_softmax(test_logits, n, lt.data());
  double kl = 0.0;
  for (int64_t i = 0; i < n; ++i) kl += std::exp(lb[static_cast<size_t>(i)]) * (lb[static_cast<size_t>(i)] - lt[static_cast<size_t>(i)]);
  return kl;
}

PerplexityResult evaluate_perplexity(std::span<const int32_t> tokens, int64_t vocab, const PerplexityOptions& o,
                                     const WindowEvaluator& test, const WindowEvaluator& baseline,
                                     const PerplexityProgress& progress) {
  check(o.ctx >= 2, ErrorCode::kInvalidArgument, "perplexity", "ctx must be >= 2 tokens; got ", o.ctx);
  const bool llama = o.llama_windows;
  const bool with_bos = o.bos >= 0 && !llama;
  const int64_t per_window = with_bos ? o.ctx - 1 : o.ctx;  // tokens of `tokens` in one window
  if (llama) {
    check(o.stride == 0, ErrorCode::kInvalidArgument, "perplexity",
          "llama.cpp's windows do not overlap: stride must be 0 (= ctx); got ", o.stride);
  } else if (with_bos) {
    check(o.stride >= 0 && o.stride <= per_window, ErrorCode::kInvalidArgument, "perplexity",
          "stride must be in [1, ctx - 1 = ", per_window, "] text tokens with BOS per window (0 = ctx - 1); got ",
          o.stride);
  } else {
    check(o.stride >= 0 && o.stride <= o.ctx, ErrorCode::kInvalidArgument, "perplexity",
          "stride must be in [1, ctx = ", o.ctx, "] (0 = ctx); got ", o.stride);
  }
  check(vocab > 0, ErrorCode::kInvalidArgument, "perplexity", "vocab must be > 0; got ", vocab);
  check(o.bos < vocab, ErrorCode::kInvalidArgument, "perplexity", "bos must be in [0, ", vocab, "); got ", o.bos);
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  if (with_bos) {
    check(n_tokens >= per_window, ErrorCode::kInvalidArgument, "perplexity", "the text must have at least ctx - 1 = ",
          per_window, " tokens after BOS; got ", n_tokens, " tokens");
  } else {
    check(n_tokens >= o.ctx, ErrorCode::kInvalidArgument, "perplexity", "the text must have at least ctx = ", o.ctx,
          " tokens; got ", n_tokens, " tokens");
  }
  for (int64_t i = 0; i < n_tokens; ++i)
    check(tokens[static_cast<size_t>(i)] >= 0 && tokens[static_cast<size_t>(i)] < vocab, ErrorCode::kInvalidArgument,
          "perplexity", "token ids must be in [0, ", vocab, "); got ", tokens[static_cast<size_t>(i)], " at ", i);
  check(static_cast<bool>(test), ErrorCode::kInvalidArgument, "perplexity", "need a model to evaluate; got none");

  const int64_t ctx = o.ctx, stride = o.stride == 0 ? per_window : o.stride;
  const int64_t n_windows = llama ? n_tokens / ctx : (n_tokens - per_window) / stride + 1;
  std::vector<int32_t> llama_window(llama ? static_cast<size_t>(ctx) : 0);  // the window with BOS first
  std::vector<int32_t> bos_window(with_bos ? static_cast<size_t>(ctx) : 0);  // BOS + the window's text tokens
  const size_t row = static_cast<size_t>(vocab);
  std::vector<float> logits(static_cast<size_t>(ctx) * row), base_logits(baseline ? logits.size() : 0);
  std::vector<double> lp(row), lb(row);

  Accumulator nll, base_nll, kl, top1;
  std::vector<int64_t> starts = {1};
  for (int64_t b = 512; b < ctx; b *= 2) starts.push_back(b);
  if (starts.size() > 5) starts.resize(5);  // [1, 512), [512, 1024), [1024, 2048), [2048, 4096), [4096, ctx)
  std::vector<Accumulator> kl_ranges(starts.size());
  for (int64_t w = 0; w < n_windows; ++w) {
    const int32_t* win = tokens.data() + w * stride;
    if (with_bos) {
      bos_window[0] = o.bos;
      std::copy(win, win + per_window, bos_window.begin() + 1);
      win = bos_window.data();
    } else if (llama) {
      std::copy(win, win + ctx, llama_window.begin());
      if (o.bos >= 0) llama_window[0] = o.bos;
      win = llama_window.data();
    }
    test(win, ctx, logits.data());
    if (baseline) baseline(win, ctx, base_logits.data());
    // Row j predicts token j + 1; score only tokens no earlier window scored.
    const int64_t first = llama ? ctx / 2 + 1 : w == 0 ? 1 : std::max<int64_t>(1, ctx - stride);
    for (int64_t t = first; t < ctx; ++t) {
      const float* r = logits.data() + static_cast<size_t>(t - 1) * row;
      check_finite(r, vocab, w, t - 1, "tested");
      log_softmax(r, vocab, lp.data());
      const size_t target = static_cast<size_t>(win[t]);
      nll.add(-lp[target]);
      if (!baseline) continue;
      const float* b = base_logits.data() + static_cast<size_t>(t - 1) * row;
      check_finite(b, vocab, w, t - 1, "baseline");
      if (o.baseline_log_probs) {
        for (size_t v = 0; v < row; ++v) lb[v] = b[v];
      } else {
        log_softmax(b, vocab, lb.data());
      }
      base_nll.add(-lb[target]);
      double k = 0.0;
      for (size_t v = 0; v < row; ++v)
        if (!o.baseline_log_probs || lb[v] > -16.0) k += std::exp(lb[v]) * (lb[v] - lp[v]);
      kl.add(k);
      size_t range = 0;
      while (range + 1 < starts.size() && t >= starts[range + 1]) ++range;
      kl_ranges[range].add(k);
      top1.add(argmax(lp.data(), vocab) == argmax(lb.data(), vocab) ? 1.0 : 0.0);
    }
    if (progress) progress(w + 1, n_windows);
  }

  PerplexityResult r;
  r.windows = n_windows;
  r.tokens_scored = nll.n;
  r.nll = nll.stats();
  r.ppl = std::exp(r.nll.mean);
  r.ppl_stderr = r.ppl * r.nll.se;
  r.has_baseline = static_cast<bool>(baseline);
  if (r.has_baseline) {
    r.base_nll = base_nll.stats();
    r.base_ppl = std::exp(r.base_nll.mean);
    r.base_ppl_stderr = r.base_ppl * r.base_nll.se;
    r.kl = kl.stats();
    r.top1 = top1.stats();
    r.kl_range_starts = starts;
    for (const Accumulator& a : kl_ranges) {
      r.kl_by_range.push_back(a.stats());
      r.kl_range_tokens.push_back(a.n);
    }
  }
  r.ctx = ctx;
  r.stride = stride;
  r.bos_per_window = with_bos;
  r.llama_windows = llama;
  return r;
}

std::string PerplexityResult::windows_line() const {
  char buf[320];
  if (llama_windows) {
    std::snprintf(buf, sizeof buf,
                  "windows: %lld of %lld tokens as llama-perplexity cuts them (non-overlapping, the first token "
                  "replaced by BOS), offsets %lld to %lld scored; every window starts from an empty cache\n",
                  static_cast<long long>(windows), static_cast<long long>(ctx), static_cast<long long>(ctx / 2 + 1),
                  static_cast<long long>(ctx - 1));
  } else if (bos_per_window) {
    std::snprintf(buf, sizeof buf,
                  "windows: %lld of %lld tokens, each BOS + %lld text tokens, advancing %lld text tokens; every "
                  "window starts from an empty cache\n",
                  static_cast<long long>(windows), static_cast<long long>(ctx), static_cast<long long>(ctx - 1),
                  static_cast<long long>(stride));
  } else {
    std::snprintf(buf, sizeof buf,
                  "windows: %lld of %lld tokens cut from the token stream (no BOS added), advancing "
                  "%lld tokens; every window starts from an empty cache\n",
                  static_cast<long long>(windows), static_cast<long long>(ctx), static_cast<long long>(stride));
  }
  return buf;
}

std::string PerplexityResult::report() const {
  char buf[512];
  std::string s = windows_line();
  std::snprintf(buf, sizeof buf, "perplexity: %.4f ± %.4f (%lld tokens scored in %lld windows; mean NLL %.5f nats)\n",
                ppl, ppl_stderr, static_cast<long long>(tokens_scored), static_cast<long long>(windows), nll.mean);
  s += buf;
  if (has_baseline) {
    std::snprintf(buf, sizeof buf, "baseline perplexity: %.4f ± %.4f\n", base_ppl, base_ppl_stderr);
    s += buf;
    std::snprintf(buf, sizeof buf, "mean KL(baseline || tested): %.6f ± %.6f nats/token\n", kl.mean, kl.se);
    s += buf;
    std::snprintf(buf, sizeof buf, "top-1 agreement: %.2f%% ± %.2f%%\n", 100.0 * top1.mean, 100.0 * top1.se);
    s += buf;
    if (kl_range_starts.size() > 1) {
      s += "KL by position:";
      for (size_t i = 0; i < kl_range_starts.size(); ++i) {
        const int64_t end = i + 1 < kl_range_starts.size() ? kl_range_starts[i + 1] : ctx;
        std::snprintf(buf, sizeof buf, "%s [%lld, %lld) %.6f ± %.6f (%lld)", i ? " |" : "",
                      static_cast<long long>(kl_range_starts[i]), static_cast<long long>(end), kl_by_range[i].mean,
                      kl_by_range[i].se, static_cast<long long>(kl_range_tokens[i]));
        s += buf;
      }
      s += "\n";
    }
  }
  return s;
}

int32_t bos_per_window(const Tokenizer& tok) {
  if (tok.bos_id() < 0) return -1;
  const std::vector<int32_t> with = tok.encode("a", /*add_special=*/true);
  const bool adds = !with.empty() && with[0] == tok.bos_id() && with.size() > tok.encode("a", false).size();
  return adds ? tok.bos_id() : -1;
}

WindowEvaluator window_evaluator(const Model& model) {
  return [&model](const int32_t* tokens, int64_t n, float* logits) {
    auto s = model.new_session();
    model.forward(*s, tokens, n, logits, /*all_logits=*/true);
  };
}

}  // namespace cider::model
