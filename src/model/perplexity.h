// cider/model/perplexity.h — perplexity of a token stream, and the divergence of one model configuration from a
// baseline configuration (the fidelity measure of low-bit weights and KV caches).
//
// Windows, two forms (each window is evaluated from an empty context; logit row j of a window predicts its token j + 1):
//   * BOS per window (options.bos >= 0; what `cider perplexity` does for a model whose tokenizer adds BOS, as
//     llama.cpp's perplexity does): `tokens` is the text without BOS; window w is BOS followed by the text tokens
//     [w·stride, w·stride + ctx − 1), stride counted in text tokens (default ctx − 1, at most ctx − 1). Scored: in the
//     first window offsets 1 … ctx−1 (every text token, the first one predicted from BOS alone); in later windows the
//     text tokens no earlier window scored, offsets max(1, ctx − stride) … ctx−1. With the default stride every text
//     token of the whole windows is scored exactly once.
//   * plain (options.bos < 0: a model without BOS): the tokens are cut into windows of `ctx` tokens starting at 0,
//     stride, 2·stride, … (stride = ctx by default, i.e. non-overlapping). Scored: in the first window the tokens
//     1 … ctx−1; in each later window only the tokens no earlier window scored, i.e. offsets max(1, ctx − stride) …
//     ctx−1. So with stride = ctx every token but the first of each window is scored once; with stride < ctx every
//     token from 1 to the end of the last window is scored once, each with at least ctx − stride tokens of context.
// Only whole windows are evaluated.
//
// Per scored token, in float64 from log-softmax of the float32 logits:
//   NLL      −log p_test(target)
//   KL       KL(P_base ‖ P_test) = Σ_v p_base(v) · (log p_base(v) − log p_test(v))   (nats; how much the tested
//            configuration loses against the baseline, weighted by where the baseline puts its mass)
//   top-1    argmax p_test == argmax p_base (ties: lowest id)
// Reported: perplexity exp(mean NLL) ± exp(mean NLL)·SE(NLL) (delta method; SE = sample standard deviation / √n,
// treating tokens as independent, which understates it somewhat for correlated text), mean KL ± SE, top-1 agreement.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace cider::model {

struct PerplexityOptions {
  int64_t ctx = 512;   // >= 2: tokens per window
  int64_t stride = 0;  // 0 = the default (ctx, or ctx − 1 with BOS per window); else 1 <= stride <= that default
  int32_t bos = -1;    // >= 0: every window starts with this token (see above)
  // llama.cpp's windows instead (llama-perplexity's, for numbers comparable with its "Final estimate"): `tokens` is
  // the text tokenized with its special tokens (BOS first), cut into non-overlapping windows of ctx tokens; the first
  // token of each window is replaced by `bos` (when >= 0) and only offsets ctx/2 + 1 … ctx − 1 are scored (row j
  // predicts token j + 1 for j in [ctx/2, ctx − 1)). stride must be 0.
  bool llama_windows = false;
  // The baseline evaluator gives log-probabilities, not logits (llama.cpp's saved ones: model/llama_logits.h): its
  // rows are used as they are, and the KL sums only the entries above −16 nats, as llama-perplexity's KL does (its
  // file keeps 16 nats below the top).
  bool baseline_log_probs = false;
};

// Evaluates one window from an empty context: tokens[0, n) → logits[n, vocab] (float32, row-major).
using WindowEvaluator = std::function<void(const int32_t* tokens, int64_t n, float* logits)>;
using PerplexityProgress = std::function<void(int64_t windows_done, int64_t windows_total)>;

struct PerplexityStats {
  double mean = 0.0, se = 0.0;  // mean of the per-token values and its standard error
};

struct PerplexityResult {
  int64_t windows = 0;
  int64_t tokens_scored = 0;
  PerplexityStats nll;        // nats/token
  double ppl = 0.0, ppl_stderr = 0.0;
  bool has_baseline = false;
  PerplexityStats base_nll;
  double base_ppl = 0.0, base_ppl_stderr = 0.0;
  PerplexityStats kl;         // KL(P_base ‖ P_test), nats/token
  PerplexityStats top1;       // agreement as a fraction in [0, 1]
  // KL by position of the predicted token in its window: [1, 512), [512, 1024), [1024, 2048), [2048, 4096),
  // [4096, ctx) (ranges the windows reach; reported when ctx > 512) — a cache whose error grows with length shows.
  std::vector<int64_t> kl_range_starts;  // each range is [start, next start or ctx)
  std::vector<PerplexityStats> kl_by_range;
  std::vector<int64_t> kl_range_tokens;
  int64_t ctx = 0;
  int64_t stride = 0;          // the stride used (text tokens with BOS per window)
  bool bos_per_window = false;
  bool llama_windows = false;
  std::string windows_line() const;  // how the windows were formed, one line
  std::string report() const;  // the lines `cider perplexity` prints
};

// Throws cider::Error (kInvalidArgument, op "perplexity") for ctx < 2, a stride outside [0, the default], fewer tokens
// than one window needs (ctx, or ctx − 1 after BOS), a token id (or bos) outside [0, vocab), or a non-finite logit
// (naming the window and row).
PerplexityResult evaluate_perplexity(std::span<const int32_t> tokens, int64_t vocab, const PerplexityOptions& options,
                                     const WindowEvaluator& test, const WindowEvaluator& baseline = {},
                                     const PerplexityProgress& progress = {});

class Tokenizer;
class Model;

// Evaluates a window with `model` from a fresh session, every row's logits (what cider perplexity measures).
WindowEvaluator window_evaluator(const Model& model);

// The BOS rule of `cider perplexity` and cider::perplexity: a tokenizer that starts a text with BOS gets BOS at the
// start of every window (as llama.cpp's perplexity does), the text tokens going in without it. Returns the BOS id to
// put in PerplexityOptions::bos, or -1 (then the text is tokenized with its special tokens). Whether it adds BOS is
// asked of a one-letter text.
int32_t bos_per_window(const Tokenizer& tokenizer);

// log-softmax in float64: out[i] = x[i] − log Σ exp(x).
void log_softmax(const float* logits, int64_t n, double* out);
// KL(P_base ‖ P_test) in nats from two rows of logits.
double kl_divergence(const float* base_logits, const float* test_logits, int64_t n);

}  // namespace cider::model
