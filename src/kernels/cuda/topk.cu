// cider/kernels/cuda/topk.cu — the top-k candidates of one row of logits, chosen on the device (cuda::topk_logits):
// a decode step copies k (id, logit) pairs to the host instead of the whole vocabulary. Contract: cuda_api.h.
//
// Exactness. Every token becomes one 56-bit integer key
//     key = orderable(logit) << 24 | (2^24 − 1 − id)          (vocab ≤ 2^24, so the id fits in 24 bits)
// where orderable() maps float bits to a uint32 that sorts like the float (sign flipped for positives, all bits for
// negatives) after −0 is folded onto +0 (they compare equal as floats, so they must tie and fall back to the id).
// "Larger key" is then exactly "larger logit, then lower id", keys are unique, and every step below compares keys as
// integers: no arithmetic touches a logit, and the values written out are re-read from the logits by id, so they are
// the input's bits (−0 stays −0). Tokens that cannot be chosen (excluded, −inf, NaN, +inf, past the end) get key 0,
// below every finite logit's key (≥ 2^47).
//
// Selection. One CTA (512 threads) selects the k largest keys of a tile held in registers (8 or 16 keys a thread):
//   k = 1: a block max.
//   k > 1: an MSB-first radix select, 8 bits a pass over the 56-bit key (at most 7 passes, 2–3 on real logits: it
//          stops as soon as the bin holding the k-th key holds exactly the keys still needed). A pass is a 256-bin
//          shared histogram of the keys that match the prefix found so far — warp-aggregated with __match_any_sync,
//          because the top bits of logits (sign, exponent) fall into a handful of bins — and one warp's scan to pick
//          the next digit; the other warps clear the second histogram meanwhile, so a pass costs two barriers.
//   The keys ≥ the threshold found are then compacted into shared memory (ballot + one atomic per warp).
// Pipeline (each launch is one kernel; programmatic dependent launch lets the next one's CTAs start early):
//   1. topk_logits_kernel: ceil(vocab / 4096) CTAs, CTA b over logits [4096·b, 4096·b + 4096): builds the keys
//      (excluded tokens masked through a shared bitmap filled from the excluded list, whose raw logits the CTA owning
//      them copies to excluded_vals), records the smallest NaN/+inf index of its tile and writes its top k keys
//      (0-padded) to the workspace. With vocab ≤ 4096 the one CTA finishes the job itself (one launch in all).
//   2. topk_keys_kernel, only while more than 8192 candidates remain (tiles · k > 8192: vocab 262144 at k 256 needs
//      one such launch, 2^24 at k 256 two): each CTA reduces 8192 candidate keys to its top k.
//   3. topk_keys_kernel<final>: one CTA selects the top k of the ≤ 8192 remaining candidates, orders them (rank of
//      each key among the selected, k ≤ 256), writes ids / vals (vals re-read from the logits) and the −1 / −inf
//      padding, and reduces the per-tile NaN/+inf indices into status.
// Llama-3's 128256 logits: 32 CTAs in stage 1, then the final CTA over 32·k candidates — two launches for every k.
// Why this shape: the tile sizes keep each CTA's selection a few hundred cycles a pass while the candidate count of the
// last step (tiles · k) stays small enough for a single CTA; the status and the per-tile results travel through the
// workspace (no atomics on global memory, nothing to initialise), so every launch is idempotent and a captured graph
// replays without any host-side state.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda {
namespace {

using Key = unsigned long long;  // the overloads of __shfl_xor_sync / atomics take this type

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kLogitsPerThread = 8;
constexpr int64_t kLogitsTile = int64_t{kThreads} * kLogitsPerThread;  // logits per stage-1 CTA
constexpr int kKeysPerThread = 16;
constexpr int64_t kKeysTile = int64_t{kThreads} * kKeysPerThread;  // candidate keys per reducing CTA
constexpr int kBins = 256;
constexpr int kDigitBits = 8;
constexpr int kKeyBits = 56;
constexpr uint32_t kIdMask = 0xFFFFFFu;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int32_t kNoBad = INT32_MAX;  // "no NaN / +inf seen" in the per-tile status slots
constexpr uint32_t kNegInfBits = 0xFF800000u;
constexpr size_t kWorkspaceAlign = 256;
constexpr int kMaxLevels = 4;  // reducing launches between stage 1 and the final one (2 at vocab 2^24, k 256)

static_assert(kThreads >= kTopkMaxK, "the final CTA orders the k selected keys one per thread");
static_assert(kThreads >= 32 + kBins, "warps 1.. clear a histogram while warp 0 scans the other");
static_assert(kLogitsTile % 32 == 0, "the excluded bitmap covers the tile in whole words");

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct __align__(16) Smem {
  int hist[2][kBins];  // first: 16-byte aligned for the scan's int4 reads
  Key sel[kTopkMaxK];  // the selected keys (unordered)
  Key warp_max[kWarps];
  uint32_t excl_bits[kLogitsTile / 32];  // stage 1: bit i set when token begin + i is excluded
  Key prefix;                            // radix select: the digits of the k-th key found so far
  Key thresh;                            // the selected keys are those ≥ thresh (and ≠ 0)
  int need;                              // keys still to take among those matching prefix
  int done;
  int count;  // keys compacted into sel
  int bad;    // smallest NaN / +inf index seen (kNoBad: none)
};

// What every launch of the pipeline gets (one struct, passed by value).
struct TopkArgs {
  const float* logits;
  int64_t vocab;
  const int32_t* excluded;
  int n_excluded;
  int k;
  const Key* in_keys;  // topk_keys_kernel: the candidates [n_in]
  int64_t n_in;
  Key* out_keys;        // non-final launches: [gridDim.x · k], each CTA's top k, 0-padded
  int32_t* tile_bad;    // stage 1 writes [gridDim.x]; the final launch reduces [n_tiles]
  int64_t n_tiles;
  int32_t* ids;
  float* vals;
  float* excluded_vals;
  int32_t* status;
};

__device__ __forceinline__ Key make_key(uint32_t bits, int64_t id) {
  if ((bits << 1) == 0) bits = 0;  // −0 → +0
  const uint32_t ord = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<Key>(ord) << 24) | static_cast<Key>(kIdMask - static_cast<uint32_t>(id));
}

__device__ __forceinline__ int32_t key_id(Key key) {
  return static_cast<int32_t>(kIdMask - static_cast<uint32_t>(key & kIdMask));
}

// Everything the selection expects in shared memory before its first barrier (the caller's barrier publishes it).
__device__ __forceinline__ void init_smem(Smem& sm, int k) {
  if (threadIdx.x < kBins) sm.hist[0][threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    sm.prefix = 0;
    sm.thresh = 0;
    sm.need = k;
    sm.done = 0;
    sm.count = 0;
    sm.bad = kNoBad;
  }
}

// Selects the min(k, #nonzero) largest nonzero keys of the tile (keys[] of every thread) into sm.sel[0, sm.count),
// unordered. Precondition: init_smem, then a barrier. Ends with a barrier.
template <int kR>
__device__ void select_top(const Key (&keys)[kR], int k, Smem& sm) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  Key thresh;
  if (k == 1) {
    Key m = 0;
#pragma unroll
    for (int j = 0; j < kR; ++j) m = keys[j] > m ? keys[j] : m;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const Key o = __shfl_xor_sync(0xffffffffu, m, off);
      m = o > m ? o : m;
    }
    if (lane == 0) sm.warp_max[warp] = m;
    __syncthreads();
    m = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = sm.warp_max[w] > m ? sm.warp_max[w] : m;
    thresh = m;  // 0 when nothing qualifies: the compaction below takes only nonzero keys
  } else {
    int buf = 0;
    for (int shift = kKeyBits - kDigitBits;; shift -= kDigitBits) {
      const Key hi = sm.prefix >> (shift + kDigitBits);
      int* hist = sm.hist[buf];
#pragma unroll
      for (int j = 0; j < kR; ++j) {
        const Key key = keys[j];
        const bool active = key != 0 && (key >> (shift + kDigitBits)) == hi;
        const unsigned digit = active ? static_cast<unsigned>(key >> shift) & (kBins - 1) : unsigned{kBins};
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        if (active && lane == __ffs(static_cast<int>(peers)) - 1) atomicAdd(&hist[digit], __popc(peers));
      }
      __syncthreads();
      if (warp == 0) {
        // Lane l owns digits 255 − 8l − j, j = 0..7 (descending), so the lanes' running sums count keys from the top.
        const int4 lo4 = *reinterpret_cast<const int4*>(&hist[kBins - 8 * lane - 8]);
        const int4 hi4 = *reinterpret_cast<const int4*>(&hist[kBins - 8 * lane - 4]);
        const int c[8] = {hi4.w, hi4.z, hi4.y, hi4.x, lo4.w, lo4.z, lo4.y, lo4.x};
        int lsum = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) lsum += c[j];
        int incl = lsum;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const int t = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += t;
        }
        const int total = __shfl_sync(0xffffffffu, incl, 31);
        const int excl = incl - lsum;
        const int need = sm.need;
        const Key prefix = sm.prefix;
        __syncwarp();
        if (total <= need) {
          // No more matching keys than needed (only possible in the first pass: fewer than k nonzero keys): take all.
          if (lane == 0) {
            sm.thresh = prefix;
            sm.done = 1;
          }
        } else if (excl < need && need <= incl) {  // the one lane whose digits hold the k-th key
          int digit = -1, above = 0, cnt = 0, run = excl;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            if (digit < 0 && run + c[j] >= need) {
              digit = kBins - 1 - 8 * lane - j;
              above = run;
              cnt = c[j];
            }
            run += c[j];
          }
          const Key p = prefix | (static_cast<Key>(digit) << shift);
          const int rest = need - above;
          sm.prefix = p;
          sm.need = rest;
          // Every key matching p is wanted: the selection is all keys ≥ p. (Keys are unique, so at shift 0 this
          // always holds; the test keeps the loop finite regardless.)
          if (cnt == rest || shift == 0) {
            sm.thresh = p;
            sm.done = 1;
          }
        }
      } else if (threadIdx.x - 32 < static_cast<unsigned>(kBins)) {
        sm.hist[buf ^ 1][threadIdx.x - 32] = 0;  // the next pass's histogram
      }
      __syncthreads();
      if (sm.done) break;  // uniform: read after the barrier, written only before it
      buf ^= 1;
    }
    thresh = sm.thresh;
  }
  // Compaction: one atomic per warp and key slot.
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    const bool take = keys[j] != 0 && keys[j] >= thresh;
    const unsigned ballot = __ballot_sync(0xffffffffu, take);
    int base = 0;
    if (lane == 0 && ballot != 0) base = atomicAdd(&sm.count, __popc(ballot));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (take) {
      const int slot = base + __popc(ballot & ((1u << lane) - 1u));
      if (slot < k) sm.sel[slot] = keys[j];
    }
  }
  __syncthreads();
}

// A non-final CTA: its top k keys (0-padded) to out_keys [blockIdx.x · k, + k).
__device__ __forceinline__ void emit_keys(const TopkArgs& a, const Smem& sm) {
  const int c = min(sm.count, a.k);
  Key* __restrict__ out = a.out_keys + static_cast<int64_t>(blockIdx.x) * a.k;
  for (int s = static_cast<int>(threadIdx.x); s < a.k; s += kThreads) out[s] = s < c ? sm.sel[s] : Key{0};
}

// The final CTA: orders the selected keys, writes ids / vals / padding and the status.
__device__ __forceinline__ void finish(const TopkArgs& a, const Smem& sm) {
  const int c = min(sm.count, a.k);
  const int t = static_cast<int>(threadIdx.x);
  if (t < c) {
    const Key mine = sm.sel[t];
    const int32_t id = key_id(mine);
    const float v = a.logits[id];  // the input's bits, issued before the ranking loop
    int rank = 0;
#pragma unroll 8
    for (int j = 0; j < c; ++j) rank += sm.sel[j] > mine ? 1 : 0;
    a.ids[rank] = id;
    a.vals[rank] = v;
  } else if (t < a.k) {
    a.ids[t] = -1;
    a.vals[t] = __uint_as_float(kNegInfBits);
  }
  if (t == 0) a.status[0] = sm.bad == kNoBad ? -1 : sm.bad;
}

// Stage 1 (or the whole job when gridDim.x == 1 and kFinal): tile blockIdx.x of the logits.
template <bool kFinal>
__global__ void __launch_bounds__(kThreads) topk_logits_kernel(const TopkArgs a) {
  __shared__ Smem sm;
  pdl::wait();  // the logits and the excluded list come from earlier work on the stream
  pdl::launch_dependents();
  const float* __restrict__ logits = a.logits;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kLogitsTile;
  const int64_t end = min(a.vocab, begin + kLogitsTile);
  uint32_t bits[kLogitsPerThread];
#pragma unroll
  for (int j = 0; j < kLogitsPerThread; ++j) {
    const int64_t i = begin + j * kThreads + tid;
    bits[j] = i < end ? __float_as_uint(logits[i]) : kNegInfBits;  // past the end: −inf, never chosen nor bad
  }
  init_smem(sm, a.k);
  if (tid < kLogitsTile / 32) sm.excl_bits[tid] = 0;
  __syncthreads();
  if (a.n_excluded > 0) {
    // The tile's excluded tokens: mark them, copy their raw logits. Ids outside [0, vocab) break the contract; the
    // first / last CTA still writes NaN for them so that every excluded_vals slot is written.
    const int32_t* __restrict__ excluded = a.excluded;
    const bool first = blockIdx.x == 0, last = blockIdx.x == gridDim.x - 1;
    for (int j = tid; j < a.n_excluded; j += kThreads) {
      const int64_t id = excluded[j];
      if (id >= begin && id < end) {
        const auto off = static_cast<uint32_t>(id - begin);
        atomicOr(&sm.excl_bits[off >> 5], 1u << (off & 31u));
        a.excluded_vals[j] = logits[id];
      } else if ((first && id < 0) || (last && id >= a.vocab)) {
        a.excluded_vals[j] = __uint_as_float(0x7fc00000u);
      }
    }
    __syncthreads();
  }
  Key keys[kLogitsPerThread];
  int bad = kNoBad;
#pragma unroll
  for (int j = 0; j < kLogitsPerThread; ++j) {
    const int off = j * kThreads + tid;
    const uint32_t b = bits[j];
    const bool nonfinite = (b & 0x7F800000u) == 0x7F800000u;
    if (nonfinite && b != kNegInfBits) bad = min(bad, static_cast<int>(begin + off));  // NaN or +inf
    const bool excl = a.n_excluded > 0 && ((sm.excl_bits[off >> 5] >> (off & 31)) & 1u) != 0;
    keys[j] = (nonfinite || excl) ? Key{0} : make_key(b, begin + off);
  }
  bad = __reduce_min_sync(0xffffffffu, bad);
  if ((tid & 31) == 0 && bad != kNoBad) atomicMin(&sm.bad, bad);  // published by select_top's barriers
  select_top(keys, a.k, sm);
  if constexpr (kFinal) {
    finish(a, sm);
  } else {
    emit_keys(a, sm);
    if (tid == 0) a.tile_bad[blockIdx.x] = sm.bad;
  }
}

// Reduction (and final) launches: tile blockIdx.x of the candidate keys.
template <bool kFinal>
__global__ void __launch_bounds__(kThreads) topk_keys_kernel(const TopkArgs a) {
  __shared__ Smem sm;
  pdl::wait();  // the candidates are the previous launch's output
  pdl::launch_dependents();
  const Key* __restrict__ in = a.in_keys;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kKeysTile;
  const int64_t end = min(a.n_in, begin + kKeysTile);
  Key keys[kKeysPerThread];
#pragma unroll
  for (int j = 0; j < kKeysPerThread; ++j) {
    const int64_t i = begin + j * kThreads + tid;
    keys[j] = i < end ? in[i] : Key{0};
  }
  int bad = kNoBad;
  if constexpr (kFinal) {
    for (int64_t i = tid; i < a.n_tiles; i += kThreads) bad = min(bad, a.tile_bad[i]);
    bad = __reduce_min_sync(0xffffffffu, bad);
  }
  init_smem(sm, a.k);
  __syncthreads();
  if constexpr (kFinal) {
    if ((tid & 31) == 0 && bad != kNoBad) atomicMin(&sm.bad, bad);  // published by select_top's barriers
  }
  select_top(keys, a.k, sm);
  if constexpr (kFinal) finish(a, sm);
  else emit_keys(a, sm);
}

// The launches for (vocab, k) and the workspace layout: [tile_bad: tiles int32][A: tiles·k keys][B: level 0's output].
struct Plan {
  int64_t tiles = 0;  // stage-1 CTAs
  int levels = 0;     // reducing launches
  int64_t level_ctas[kMaxLevels] = {};
  int64_t level_in[kMaxLevels] = {};
  int64_t final_in = 0;  // candidates of the final launch (tiles > 1)
  size_t bad_bytes = 0, a_bytes = 0, b_bytes = 0;
  size_t total() const { return bad_bytes + a_bytes + b_bytes; }
};

Plan make_plan(int64_t vocab, int64_t k) {
  Plan p;
  p.tiles = (vocab + kLogitsTile - 1) / kLogitsTile;
  p.bad_bytes = round_up(static_cast<size_t>(p.tiles) * sizeof(int32_t), kWorkspaceAlign);
  if (p.tiles == 1) return p;  // one launch, nothing else in the workspace
  int64_t n = p.tiles * k;
  p.a_bytes = round_up(static_cast<size_t>(n) * sizeof(Key), kWorkspaceAlign);
  while (n > kKeysTile) {
    CIDER_DEBUG_ASSERT(p.levels < kMaxLevels);
    const int64_t ctas = (n + kKeysTile - 1) / kKeysTile;
    p.level_ctas[p.levels] = ctas;
    p.level_in[p.levels] = n;
    ++p.levels;
    n = ctas * k;  // ≤ n / 16: k ≤ 256 and each CTA reduces 8192 keys
  }
  p.final_in = n;
  // Level i writes B when i is even, A when odd (A holds stage 1's output, larger than any later level's).
  if (p.levels > 0) p.b_bytes = round_up(static_cast<size_t>(p.level_ctas[0] * k) * sizeof(Key), kWorkspaceAlign);
  return p;
}

void check_sizes(int64_t vocab, int64_t k, const char* op) {
  check(k >= 1 && k <= kTopkMaxK, ErrorCode::kInvalidArgument, op, "k must be in [1, ", kTopkMaxK, "]; got ", k);
  check(vocab >= 1 && vocab <= kMaxVocab, ErrorCode::kInvalidArgument, op, "vocab must be in [1, 2^24]; got ",
        vocab);
}

// One CTA per row: max, then Σ expf(z − max) in float64 (a thread's terms, then the warps', then the block's).
__global__ void __launch_bounds__(kThreads) log_normalizers_kernel(const float* logits, int64_t vocab, float* out) {
  const float* z = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  __shared__ float wmax[kWarps];
  __shared__ double wsum[kWarps];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  pdl::wait();  // the logits come from earlier work on the stream
  float m = -INFINITY;
  bool bad = false;  // NaN or +inf
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = z[i];
    bad = bad || v != v || v == INFINITY;
    m = fmaxf(m, v);
  }
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const bool any_bad = __syncthreads_or(bad) != 0;
  if (lane == 0) wmax[warp] = m;
  __syncthreads();
  m = wmax[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, wmax[w]);
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) s += static_cast<double>(expf(z[i] - m));
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) wsum[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kWarps; ++w) t += wsum[w];
    out[2 * blockIdx.x] = any_bad ? NAN : m;
    out[2 * blockIdx.x + 1] = any_bad || m == -INFINITY ? NAN : static_cast<float>(log(t));
  }
}

}  // namespace

void log_normalizers(const float* logits, int64_t n, int64_t vocab, float* out, const Exec& exec) {
  constexpr const char* kOp = "cuda.log_normalizers";
  require_device(kOp);
  check(n >= 1 && n <= INT_MAX, ErrorCode::kInvalidArgument, kOp, "n must be in [1, 2^31 - 1]; got ", n);
  check(vocab >= 1 && vocab <= INT_MAX, ErrorCode::kInvalidArgument, kOp, "vocab must be in [1, 2^31 - 1]; got ",
        vocab);
  check(logits != nullptr && out != nullptr, ErrorCode::kInvalidArgument, kOp,
        "logits and out must be device pointers, not null");
  CIDER_CUDA_CHECK(kOp, pdl::launch(log_normalizers_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                    static_cast<cudaStream_t>(exec.stream), logits, vocab, out));
  check_last_launch(kOp);
}

size_t topk_workspace_bytes(int64_t vocab, int64_t k) {
  check_sizes(vocab, k, "cuda.topk_workspace_bytes");
  return make_plan(vocab, k).total();
}

void topk_logits(const float* logits, int64_t vocab, const int32_t* excluded, int64_t n_excluded, int64_t k,
                 int32_t* ids, float* vals, float* excluded_vals, int32_t* status, const Exec& exec) {
  constexpr const char* kOp = "cuda.topk_logits";
  require_device(kOp);
  check(k >= 1 && k <= kTopkMaxK, ErrorCode::kInvalidArgument, kOp, "k must be in [1, ", kTopkMaxK, "]; got ", k);
  check(n_excluded >= 0 && n_excluded <= kTopkMaxExcluded, ErrorCode::kInvalidArgument, kOp,
        "n_excluded must be in [0, ", kTopkMaxExcluded, "]; got ", n_excluded);
  check_sizes(vocab, k, kOp);
  check(logits != nullptr && ids != nullptr && vals != nullptr && status != nullptr, ErrorCode::kInvalidArgument,
        kOp, "logits, ids, vals and status must be device pointers, not null");
  check(n_excluded == 0 || (excluded != nullptr && excluded_vals != nullptr), ErrorCode::kInvalidArgument, kOp,
        "excluded and excluded_vals must be device pointers, not null, when n_excluded > 0; got n_excluded ",
        n_excluded);
  const Plan plan = make_plan(vocab, k);
  const size_t need = plan.total();
  check(exec.workspace != nullptr && exec.workspace_bytes >= need, ErrorCode::kInvalidArgument, kOp,
        "exec.workspace must hold topk_workspace_bytes(vocab, k) = ", need, " bytes; got ", exec.workspace_bytes);
  check(reinterpret_cast<uintptr_t>(exec.workspace) % kWorkspaceAlign == 0, ErrorCode::kInvalidArgument, kOp,
        "exec.workspace must be 256-byte aligned; got address ", exec.workspace);

  auto* ws = static_cast<uint8_t*>(exec.workspace);
  auto* tile_bad = reinterpret_cast<int32_t*>(ws);
  auto* buf_a = reinterpret_cast<Key*>(ws + plan.bad_bytes);
  auto* buf_b = reinterpret_cast<Key*>(ws + plan.bad_bytes + plan.a_bytes);
  auto stream = static_cast<cudaStream_t>(exec.stream);

  TopkArgs a{};
  a.logits = logits;
  a.vocab = vocab;
  a.excluded = excluded;
  a.n_excluded = static_cast<int>(n_excluded);
  a.k = static_cast<int>(k);
  a.tile_bad = tile_bad;
  a.n_tiles = plan.tiles;
  a.ids = ids;
  a.vals = vals;
  a.excluded_vals = excluded_vals;
  a.status = status;
  const dim3 block(kThreads);
  if (plan.tiles == 1) {
    CIDER_CUDA_CHECK(kOp, pdl::launch(topk_logits_kernel<true>, dim3(1), block, 0, stream, a));
    check_last_launch(kOp);
    return;
  }
  a.out_keys = buf_a;
  CIDER_CUDA_CHECK(kOp, pdl::launch(topk_logits_kernel<false>, dim3(static_cast<unsigned>(plan.tiles)), block, 0,
                                    stream, a));
  const Key* in = buf_a;
  for (int level = 0; level < plan.levels; ++level) {
    a.in_keys = in;
    a.n_in = plan.level_in[level];
    a.out_keys = level % 2 == 0 ? buf_b : buf_a;
    CIDER_CUDA_CHECK(kOp, pdl::launch(topk_keys_kernel<false>, dim3(static_cast<unsigned>(plan.level_ctas[level])),
                                      block, 0, stream, a));
    in = a.out_keys;
  }
  a.in_keys = in;
  a.n_in = plan.final_in;
  a.out_keys = nullptr;
  CIDER_CUDA_CHECK(kOp, pdl::launch(topk_keys_kernel<true>, dim3(1), block, 0, stream, a));
  check_last_launch(kOp);
}

}  // namespace cider::cuda
