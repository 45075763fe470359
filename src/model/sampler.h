// cider/model/sampler.h — choosing the next token from a row of logits: greedy, or sampling with temperature,
// top-k, top-p, min-p and a repetition penalty, reproducible from a seed.
//
// The pipeline, in this order (each step in float64 on a copy of the logits):
//   1. repetition penalty (Hugging Face semantics): for every distinct token among the last `repeat_window` tokens
//      of the history, a positive logit is divided by `repeat_penalty` and a negative one multiplied by it;
//   2. temperature == 0: greedy — the largest logit wins (ties: the lowest id); nothing below applies;
//   3. temperature > 0: softmax(logits / temperature) over the tokens with a finite logit;
//   4. top-k (k > 0): keep the k most probable tokens (ties at the boundary: the lower ids). These are the k largest
//      penalised logits (ties: the lower ids), and the softmax of step 3 is taken over them alone — the same
//      probabilities as renormalising the full softmax over them, computed from the k logits only, so that a device
//      that sends just its top-k candidates (Sampler::candidate_request / sample_candidates) gives the same tokens;
//   5. top-p (p < 1): in descending probability, keep the shortest prefix whose probability sum reaches top_p
//      (the probabilities of step 4, renormalised over its survivors);
//   6. min-p (m > 0): keep the tokens whose probability is at least m × the largest probability;
//   7. draw from the survivors, renormalised.
// "Descending probability" always breaks ties by the lower id, so every step is deterministic.
//
// The random generator (documented so a draw can be reproduced from the seed alone, in any language):
//   xoshiro256** whose four state words are the first four outputs of SplitMix64 started at `seed`;
//   u = (next() >> 11) · 2^-53, uniform in [0, 1); the drawn token is the first survivor (in descending
//   probability) whose cumulative probability exceeds u.
// One draw uses exactly one next(), greedy none.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace cider::model {

struct SamplerParams {
  double temperature = 0.8;     // >= 0; 0 = greedy
  int64_t top_k = 40;           // >= 0; 0 = off
  double top_p = 0.95;          // (0, 1]; 1 = off
  double min_p = 0.05;          // [0, 1]; 0 = off
  double repeat_penalty = 1.0;  // > 0; 1 = off (> 1 discourages repeats)
  int64_t repeat_window = 64;   // >= 0: how many of the most recent history tokens are penalised; 0 = all of them
  uint64_t seed = 0;
};

// Throws cider::Error (kInvalidArgument, op "sampler") naming the first parameter outside its range and its value.
void validate_sampler_params(const SamplerParams& p);

// xoshiro256** seeded through SplitMix64 (see the header comment).
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

struct TokenProb {
  int32_t id;
  double p;
};

// Sampling where the logits are (a GPU): the device ranks the logits and sends the candidates of the top-k step,
// the host finishes the pipeline. The device's limits (kernels/cuda: topk_logits) bound what it may be asked.
constexpr int64_t kDeviceTopkMax = 256;
constexpr int64_t kDeviceExcludedMax = 1024;

struct CandidateRequest {
  int64_t k = 0;                   // candidates wanted; 0: these settings need the full logits
  std::vector<int32_t> excluded;   // sorted, unique: the repetition-penalised tokens the host ranks itself
};

struct Candidates {
  std::vector<int32_t> ids;            // [k]: the other tokens with a finite logit, (logit desc, id asc); -1 = none
  std::vector<float> logits;           // [k]: their logits
  std::vector<float> excluded_logits;  // [request.excluded.size()]: the raw logits of the excluded tokens
  int64_t bad_index = -1;              // the first token whose logit is NaN or +inf, or -1
  // The row's log-softmax normalizer where the device sent it (Model::forward_batch_candidates; NaN otherwise):
  // log p(t) = logit(t) − row_max − row_log_sum over the raw logits.
  float row_max = std::numeric_limits<float>::quiet_NaN();
  float row_log_sum = std::numeric_limits<float>::quiet_NaN();
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);  // validates

  // The distribution the next draw would use: the survivors of steps 1–6 in descending probability (ties: lower id
  // first), probabilities summing to 1. Greedy: the one winning token with p = 1.
  // logits: [vocab] float32 (NaN or +inf is an error; -inf marks an impossible token, at least one must be finite).
  // history: the tokens so far (prompt and generated), oldest first; ids must lie in [0, vocab).
  std::vector<TokenProb> distribution(const float* logits, int64_t vocab, std::span<const int32_t> history) const;

  // Draws the next token (advances the generator unless greedy).
  int32_t sample(const float* logits, int64_t vocab, std::span<const int32_t> history);

  // What a device must send for the next draw given this history: k = 1 when greedy, top_k when 1 ≤ top_k ≤
  // kDeviceTopkMax, with the penalised tokens excluded (at most kDeviceExcludedMax); k = 0 when these settings need
  // the full logits (top_k off or larger, or more penalised tokens). History ids must lie in [0, vocab).
  CandidateRequest candidate_request(int64_t vocab, std::span<const int32_t> history) const;
  // distribution() and sample() from a device's answer to candidate_request(vocab, history): the same distribution
  // and the same token as from the full row of logits (the tests check this on random rows with ties, -inf and
  // penalties), and the same errors for NaN/+inf or all -inf logits.
  std::vector<TokenProb> distribution_from_candidates(const CandidateRequest& request, const Candidates& candidates,
                                                      int64_t vocab) const;
  int32_t sample_candidates(const CandidateRequest& request, const Candidates& candidates, int64_t vocab);

  const SamplerParams& params() const { return params_; }

 private:
  struct Scored {
    int32_t id;
    double z;  // the penalised logit
  };
  // Steps 3–6 over the top-k tokens `top` (sorted by z desc, id asc; at most top_k of them, non-empty).
  std::vector<TokenProb> finish_top_k(const std::vector<Scored>& top) const;
  double penalised(double z) const { return z > 0.0 ? z / params_.repeat_penalty : z * params_.repeat_penalty; }
  // candidate_request without the device's limits (k = top_k of any size; any number of penalised tokens): what
  // distribution() itself ranks on the full row for greedy-with-penalty and top-k.
  CandidateRequest candidate_request_unbounded(int64_t vocab, std::span<const int32_t> history) const;
  int32_t draw(const std::vector<TokenProb>& dist);
  static void distribution_check(const float* logits, int64_t vocab);
  // Top-k off: the candidates after min-p and top-p (sampler.cpp); cand[0, sorted) in descending order, the survivors
  // cand[0, keep), their mass `sum` (not yet renormalised).
  struct Nucleus {
    std::vector<TokenProb> cand;
    size_t sorted = 0;
    size_t keep = 0;
    double sum = 1.0;
  };
  void nucleus(const float* logits, int64_t vocab, std::span<const int32_t> history, Nucleus& out) const;
  static size_t sort_more(std::vector<TokenProb>& cand, size_t sorted, size_t end);

  SamplerParams params_;
  SamplerRng rng_;
};

}  // namespace cider::model
