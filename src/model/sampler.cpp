#include "model/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace cider::model {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Higher probability first; equal probabilities: lower id first. A strict weak order, so every filter that keeps
// "the first n" keeps the same tokens whatever the sort algorithm.
struct MoreProbable {
  bool operator()(const TokenProb& a, const TokenProb& b) const {
    return a.p != b.p ? a.p > b.p : a.id < b.id;
  }
};

}  // namespace

SamplerRng::SamplerRng(uint64_t seed) {
  uint64_t state = seed;
  for (auto& w : s_) w = splitmix64(state);
}

uint64_t SamplerRng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double SamplerRng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

void validate_sampler_params(const SamplerParams& p) {
  // Each rule is written so that NaN fails it.
  check(p.temperature >= 0.0 && std::isfinite(p.temperature), ErrorCode::kInvalidArgument, "sampler",
        "temperature must be a finite number >= 0 (0 = greedy); got ", p.temperature);
  check(p.top_k >= 0, ErrorCode::kInvalidArgument, "sampler", "top_k must be >= 0 (0 = off); got ", p.top_k);
  check(p.top_p > 0.0 && p.top_p <= 1.0, ErrorCode::kInvalidArgument, "sampler",
        "top_p must be in (0, 1] (1 = off); got ", p.top_p);
  check(p.min_p >= 0.0 && p.min_p <= 1.0, ErrorCode::kInvalidArgument, "sampler",
        "min_p must be in [0, 1] (0 = off); got ", p.min_p);
  check(p.repeat_penalty > 0.0 && std::isfinite(p.repeat_penalty), ErrorCode::kInvalidArgument, "sampler",
        "repeat_penalty must be a finite number > 0 (1 = off); got ", p.repeat_penalty);
  check(p.repeat_window >= 0, ErrorCode::kInvalidArgument, "sampler",
        "repeat_window must be >= 0 (0 = the whole history); got ", p.repeat_window);
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {
  validate_sampler_params(params);
}

// A non-empty row whose every logit is finite or -inf: a branch-free scan on the bits (NaN: |bits| above +inf's;
// +inf itself), which the compiler vectorizes, then the first offender for the message.
void Sampler::distribution_check(const float* logits, int64_t vocab) {
  check(vocab > 0 && logits != nullptr, ErrorCode::kInvalidArgument, "sample",
        "need a non-empty row of logits; got vocab ", vocab);
  uint32_t bad = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(logits[i]);
    bad |= static_cast<uint32_t>((b & 0x7fffffffu) > 0x7f800000u) | static_cast<uint32_t>(b == 0x7f800000u);
  }
  if (bad != 0)
    for (int64_t i = 0; i < vocab; ++i)
      check(!std::isnan(logits[i]) && logits[i] != std::numeric_limits<float>::infinity(),
            ErrorCode::kInvalidArgument, "sample", "logits must be finite or -inf; got ", logits[i], " at token ", i);
}

std::vector<TokenProb> Sampler::distribution(const float* logits, int64_t vocab,
                                             std::span<const int32_t> history) const {
  distribution_check(logits, vocab);
  constexpr float kInf = std::numeric_limits<float>::infinity();

  if (params_.temperature == 0.0 && (params_.repeat_penalty == 1.0 || history.empty())) {
    // Plain greedy: the first of the equal maxima among the finite logits.
    int64_t argmax = -1;
    float max_x = 0.0f;
    for (int64_t i = 0; i < vocab; ++i) {
      const float x = logits[i];
      if (x != -kInf && (argmax < 0 || x > max_x)) argmax = i, max_x = x;
    }
    check(argmax >= 0, ErrorCode::kInvalidArgument, "sample", "at least one logit must be finite; got all -inf over ",
          vocab, " tokens");
    return {{static_cast<int32_t>(argmax), 1.0}};
  }

  if (params_.temperature == 0.0 || params_.top_k > 0) {
    // Greedy with a penalty (k = 1) or top-k: the candidates a device would send (candidate_request's semantics,
    // without the device's limits), found in one pass with a bounded heap, then the same finishing as for a device.
    CandidateRequest request = candidate_request_unbounded(vocab, history);
    request.k = std::min(request.k, vocab);  // no more than the vocabulary can be kept (and top_k may be huge)
    Candidates c;
    c.ids.reserve(static_cast<size_t>(request.k));
    // heap: the k best (logit desc, id asc) seen so far, the worst on top.
    std::vector<std::pair<float, int32_t>> heap;
    heap.reserve(static_cast<size_t>(request.k) + 1);
    const auto better = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    // Tokens come in index order, so a token whose logit equals the heap's worst never beats it (the worst has the
    // lower id): once the heap is full, only logits above its worst get in — one comparison per token for the rest.
    // Before that, the bar is −inf (skipped, as it must be). distribution_check has refused NaN.
    float bar = -kInf;
    int64_t i = 0;
    for (size_t ex = 0; ex <= request.excluded.size(); ++ex) {
      const int64_t end = std::min<int64_t>(ex < request.excluded.size() ? request.excluded[ex] : vocab, vocab);  // ascending
      for (; i < end; ++i) {
        const float x = logits[i];
        if (x <= bar) continue;
        const std::pair<float, int32_t> e{x, static_cast<int32_t>(i)};
        if (static_cast<int64_t>(heap.size()) < request.k) {
          heap.push_back(e);
          std::push_heap(heap.begin(), heap.end(), better);
        } else {
          std::pop_heap(heap.begin(), heap.end(), better);
          heap.back() = e;
          std::push_heap(heap.begin(), heap.end(), better);
        }
        if (static_cast<int64_t>(heap.size()) == request.k) bar = heap.front().first;
      }
      i = end + 1;  // the excluded token
    }
    std::sort_heap(heap.begin(), heap.end(), better);  // best first
    for (const auto& [x, id] : heap) {
      c.ids.push_back(id);
      c.logits.push_back(x);
    }
    c.ids.resize(static_cast<size_t>(request.k), -1);
    c.logits.resize(static_cast<size_t>(request.k), -kInf);
    for (int32_t id : request.excluded) c.excluded_logits.push_back(logits[id]);
    return distribution_from_candidates(request, c, vocab);
  }

  // Top-k off: every possible token (Sampler::nucleus), sorted in full.
  Nucleus n;
  nucleus(logits, vocab, history, n);
  if (n.sorted < n.keep)
    std::sort(n.cand.begin() + static_cast<std::ptrdiff_t>(n.sorted),
              n.cand.begin() + static_cast<std::ptrdiff_t>(n.keep), MoreProbable{});
  n.cand.resize(n.keep);
  for (auto& c : n.cand) c.p /= n.sum;
  return std::move(n.cand);
}

// Steps 1 and 3, 5, 6 with top-k off: the softmax over every possible token (float64, the penalties applied), the
// min-p cut, and top-p's prefix found by sorting lazily (the nucleus is usually a few dozen tokens out of 10^5).
// cand[0, sorted) is in descending order; the survivors are cand[0, keep) (keep <= sorted when top-p cut, else all);
// sum: their probability mass, summed in index order (before any sorting) when all survive, in descending order
// over the prefix when top-p cut — the same value for distribution() and the lazy draw of sample().
void Sampler::nucleus(const float* logits, int64_t vocab, std::span<const int32_t> history, Nucleus& n) const {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  // The penalised ids (sorted), met in index order below: penalty then temperature, in float64.
  std::vector<int32_t> penalised_ids;
  if (params_.repeat_penalty != 1.0 && !history.empty())
    penalised_ids = candidate_request_unbounded(vocab, history).excluded;
  n.cand.clear();  // the caller's buffer: its capacity is kept from call to call
  n.sorted = 0;
  std::vector<TokenProb>& cand = n.cand;
  cand.reserve(static_cast<size_t>(vocab));
  double zmax = kNegInf;
  size_t next = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    double s = logits[i];
    if (next < penalised_ids.size() && penalised_ids[next] == i) {
      s = penalised(s);
      ++next;
    }
    if (s == kNegInf) continue;
    cand.push_back({static_cast<int32_t>(i), s / params_.temperature});
    zmax = std::max(zmax, s / params_.temperature);
  }
  check(!cand.empty(), ErrorCode::kInvalidArgument, "sample", "at least one logit must be finite; got all -inf over ",
        vocab, " tokens");
  double sum = 0.0;
  for (auto& c : cand) sum += (c.p = std::exp(c.p - zmax));
  for (auto& c : cand) c.p /= sum;

  // min-p keeps a prefix of the descending order, and so does top-p; the result is the shorter of the two. Tokens
  // below the min-p threshold all lie after the min-p cut, so dropping them first cannot change where top-p cuts
  // inside the kept part — and it spares sorting most of the vocabulary.
  if (params_.min_p > 0.0) {
    double pmax = 0.0;
    for (const auto& c : cand) pmax = std::max(pmax, c.p);
    const double threshold = params_.min_p * pmax;
    std::erase_if(cand, [&](const TokenProb& c) { return c.p < threshold; });
  }

  n.keep = cand.size();
  if (params_.top_p < 1.0) {
    double cum = 0.0;
    n.keep = 0;
    while (n.keep < cand.size()) {
      if (n.keep == n.sorted) n.sorted = sort_more(cand, n.sorted, cand.size());
      cum += cand[n.keep++].p;
      if (cum >= params_.top_p) break;
    }
    n.sum = 0.0;
    for (size_t i = 0; i < n.keep; ++i) n.sum += cand[i].p;
  } else {
    n.sum = 0.0;
    for (const auto& c : cand) n.sum += c.p;
  }
}

// Sorts the next chunk of cand[sorted, end) into place (at least 256, doubling); returns the new sorted length.
size_t Sampler::sort_more(std::vector<TokenProb>& cand, size_t sorted, size_t end) {
  const size_t next = std::min(end, std::max<size_t>(256, 2 * sorted));
  std::partial_sort(cand.begin() + static_cast<std::ptrdiff_t>(sorted), cand.begin() + static_cast<std::ptrdiff_t>(next),
                    cand.begin() + static_cast<std::ptrdiff_t>(end), MoreProbable{});
  return next;
}

std::vector<TokenProb> Sampler::finish_top_k(const std::vector<Scored>& top) const {
  // top[0] has the largest z: exp(z/T − z0/T) ≤ 1, summed in the order of top.
  std::vector<TokenProb> cand(top.size());
  const double m = top.front().z / params_.temperature;
  double sum = 0.0;
  for (size_t i = 0; i < top.size(); ++i) {
    cand[i] = {top[i].id, std::exp(top[i].z / params_.temperature - m)};
    sum += cand[i].p;
  }
  for (auto& c : cand) c.p /= sum;
  // min-p and top-p each keep a prefix of this (descending) order; the result is the shorter prefix.
  size_t keep = cand.size();
  if (params_.min_p > 0.0) {
    const double threshold = params_.min_p * cand.front().p;
    size_t n = 0;
    while (n < keep && cand[n].p >= threshold) ++n;
    keep = n;
  }
  if (params_.top_p < 1.0) {
    double cum = 0.0;
    size_t n = 0;
    while (n < keep) {
      cum += cand[n++].p;
      if (cum >= params_.top_p) break;
    }
    keep = n;
  }
  cand.resize(keep);
  sum = 0.0;
  for (const auto& c : cand) sum += c.p;
  for (auto& c : cand) c.p /= sum;
  return cand;
}

CandidateRequest Sampler::candidate_request_unbounded(int64_t vocab, std::span<const int32_t> history) const {
  CandidateRequest r;
  r.k = params_.temperature == 0.0 ? 1 : params_.top_k;
  if (params_.repeat_penalty == 1.0 || history.empty()) return r;
  const size_t window = params_.repeat_window == 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(params_.repeat_window));
  r.excluded.assign(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  std::sort(r.excluded.begin(), r.excluded.end());
  r.excluded.erase(std::unique(r.excluded.begin(), r.excluded.end()), r.excluded.end());  // each token once
  for (int32_t id : r.excluded)
    check(id >= 0 && id < vocab, ErrorCode::kInvalidArgument, "sample", "history token ids must be in [0, ", vocab,
          "); got ", id);
  return r;
}

CandidateRequest Sampler::candidate_request(int64_t vocab, std::span<const int32_t> history) const {
  CandidateRequest r = candidate_request_unbounded(vocab, history);
  if (r.k < 1 || r.k > kDeviceTopkMax || static_cast<int64_t>(r.excluded.size()) > kDeviceExcludedMax) return {};
  return r;
}

std::vector<TokenProb> Sampler::distribution_from_candidates(const CandidateRequest& request,
                                                             const Candidates& candidates, int64_t vocab) const {
  check(request.k >= 1 && candidates.ids.size() == static_cast<size_t>(request.k) &&
            candidates.logits.size() == candidates.ids.size() &&
            candidates.excluded_logits.size() == request.excluded.size(),
        ErrorCode::kInvalidArgument, "sample", "the candidates must answer the request: k ", request.k, " ids ",
        candidates.ids.size(), ", excluded ", request.excluded.size(), " logits ", candidates.excluded_logits.size());
  check(candidates.bad_index < 0, ErrorCode::kInvalidArgument, "sample", "logits must be finite or -inf; got NaN or +inf at token ",
        candidates.bad_index);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  // The exact top-k of all tokens lies among the device's top-k of the others and the excluded ones.
  std::vector<Scored> top;
  top.reserve(candidates.ids.size() + request.excluded.size());
  for (size_t i = 0; i < candidates.ids.size(); ++i) {
    const int32_t id = candidates.ids[i];
    if (id < 0) continue;  // fewer finite tokens than k
    check(id < vocab && std::isfinite(candidates.logits[i]), ErrorCode::kInvalidArgument, "sample",
          "a candidate must be a token in [0, ", vocab, ") with a finite logit; got ", id, " (", candidates.logits[i],
          ")");
    top.push_back({id, static_cast<double>(candidates.logits[i])});
  }
  for (size_t j = 0; j < request.excluded.size(); ++j) {
    const float x = candidates.excluded_logits[j];
    check(!std::isnan(x) && x != std::numeric_limits<float>::infinity(), ErrorCode::kInvalidArgument, "sample",
          "logits must be finite or -inf; got ", x, " at token ", request.excluded[j]);
    if (static_cast<double>(x) == kNegInf) continue;
    top.push_back({request.excluded[j], penalised(static_cast<double>(x))});
  }
  check(!top.empty(), ErrorCode::kInvalidArgument, "sample", "at least one logit must be finite; got all -inf over ",
        vocab, " tokens");
  std::sort(top.begin(), top.end(), [](const Scored& a, const Scored& b) { return a.z != b.z ? a.z > b.z : a.id < b.id; });
  if (params_.temperature == 0.0) return {{top.front().id, 1.0}};
  top.resize(std::min(top.size(), static_cast<size_t>(params_.top_k)));
  return finish_top_k(top);
}

int32_t Sampler::draw(const std::vector<TokenProb>& dist) {
  if (params_.temperature == 0.0) return dist.front().id;
  const double u = rng_.uniform();
  double cum = 0.0;
  for (const auto& c : dist) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return dist.back().id;  // u within rounding of 1
}

int32_t Sampler::sample(const float* logits, int64_t vocab, std::span<const int32_t> history) {
  if (params_.temperature == 0.0 || params_.top_k > 0) return draw(distribution(logits, vocab, history));
  // Top-k off: the draw walks the survivors in descending probability, sorting only as far as it walks (usually the
  // first chunk) instead of the whole vocabulary: the same order, the same sums, so the same token as
  // draw(distribution(...)). distribution() checks the logits first.
  distribution_check(logits, vocab);
  thread_local Nucleus n;  // a vocabulary-sized buffer, reused from token to token
  nucleus(logits, vocab, history, n);
  const double u = rng_.uniform();
  double cum = 0.0;
  for (size_t i = 0; i < n.keep; ++i) {
    if (i == n.sorted) n.sorted = sort_more(n.cand, n.sorted, n.keep);
    cum += n.cand[i].p / n.sum;
    if (u < cum) return n.cand[i].id;
  }
  // u within rounding of 1: the last survivor in descending order.
  return std::max_element(n.cand.begin(), n.cand.begin() + static_cast<std::ptrdiff_t>(n.keep), MoreProbable{})->id;
}

int32_t Sampler::sample_candidates(const CandidateRequest& request, const Candidates& candidates, int64_t vocab) {
  return draw(distribution_from_candidates(request, candidates, vocab));
}

}  // namespace cider::model
