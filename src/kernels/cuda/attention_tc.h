// cider/kernels/cuda/attention_tc.h — the tensor-core decode path of cuda::attention (attention_tc.cu), used by
// attention.cu for K4/V3 and K8/V4 g64 caches ($CIDER_ATTN_TC_K8V4=0 excludes K8V4) and for per-channel-key caches
// K4V4 / K5V4 / K5V5 in blocks of 64 with at most Dk/16 outlier channels ($CIDER_ATTN_TC_KCHAN=0 excludes them), with f16
// scales, Dk = Dv = 128 or 256, at most 8 query rows per KV head (rep·L ≤ 8: decode) and 16-byte aligned q / out.
// Everything else runs the general CUDA-core kernel of attention.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_api.h"
#include "kernels/kernel_table.h"

namespace cider::cuda::detail {

struct TcPlan {
  int splits = 1;
  int64_t chunk = 0;  // keys per split for keys.length (it fixes `splits`; the kernel re-cuts the visible keys)
  size_t smem = 0;    // dynamic shared memory per CTA
  bool fold = false;  // splits > 1 merged inside the kernel (last CTA per head); $CIDER_ATTN_TC_FOLD=0 turns it off
  bool packed = false;  // R = rep·L ≤ 4: 4 rows × (hi, lo) in the mma columns; $CIDER_ATTN_TC_PACKED=0 turns it off
};

// True when the tensor-core path takes these (already validated) arguments; $CIDER_ATTN_TC=0 turns it off (read once);
// $CIDER_ATTN_TC_K8V4=1 admits K8V4 (read at every call).
bool tc_eligible(const kernels::AttentionArgs& a);
TcPlan tc_plan(const kernels::AttentionArgs& a);
// The layout of the latest tc_launch (tests): 1 the three-chain layout, 2 packed (R ≤ 4); 0 before any launch.
int tc_last_layout();
// Launches the split kernel (through pdl::launch): splits == 1 writes out directly, otherwise every CTA writes its
// partial [B·Hq·L, splits, Dv] (o) and [B·Hq·L, splits, 2] (m in natural-log units, l) to the workspace and, when
// plan.fold, the last CTA of each (b, KV head) merges them into out. Returns true when attention.cu's merge kernel
// must still combine the partials (splits > 1 without the fold).
bool tc_launch(const kernels::AttentionArgs& a, const TcPlan& plan, const int32_t* d_length, float* part_o,
               float* part_ml, void* stream);

// Streaming multiprocessors of the current device (read once), for the wave arithmetic of the kernels' plans.
int sm_count();

#if defined(__CUDACC__)
#define CIDER_HOST_DEVICE __host__ __device__
#else
#define CIDER_HOST_DEVICE
#endif

// The keys [c0, c1) of split `split` (of `splits`) inside the interval [lo, hi) a block of query rows can see: the
// interval is cut into `splits` pieces of the same length, rounded up to `quantum` keys (c0 ≥ c1: an empty split).
// Why from the interval and not from the plan's chunk: the plan is made for keys.length, which with a device length
// (d_length, a decode graph) is only a bound — up to twice the real length in the model's buckets — and with a
// window only part of [0, length) is visible. Pieces of the planned size would leave the splits past the real length
// or outside the window empty and give the others all the work; pieces of the visible interval keep every CTA of the
// grid busy. Plain integer arithmetic, the same on host (tests) and device.
struct SplitRange {
  int64_t c0, c1;
};
// Lengths are below 2^31 (cuda.attention checks keys.length), so the share is formed in 32-bit unsigned arithmetic:
// a 64-bit division is a call on the GPU and cost the D256 kernel a register spill.
CIDER_HOST_DEVICE inline SplitRange split_range(int64_t lo, int64_t hi, int split, int splits, int quantum) {
  const uint32_t span = hi > lo ? static_cast<uint32_t>(hi - lo) : 0u;
  uint32_t chunk = (span + static_cast<uint32_t>(splits) - 1u) / static_cast<uint32_t>(splits);
  chunk = (chunk + static_cast<uint32_t>(quantum) - 1u) / static_cast<uint32_t>(quantum) * static_cast<uint32_t>(quantum);
  const int64_t c0 = lo + static_cast<int64_t>(split) * chunk;
  const int64_t c1 = c0 + chunk < hi ? c0 + chunk : hi;
  return {c0, c1 > c0 ? c1 : c0};
}

// The keys [lo, hi) that the query rows rf … rl of one (b, KV head) can see, row r at position kL − L + r / rep:
// with a causal mask keys up to the last row's position, from `window` (> 0) keys before the first row's on; without
// one all of [0, kL). The union over the rows; each row's own limits are applied to the scores.
struct KeyInterval {
  int64_t lo, hi;
};
CIDER_HOST_DEVICE inline KeyInterval visible_keys(int64_t kL, int64_t L, int rep, int rf, int rl, bool causal,
                                                  int64_t window) {
  if (!causal) return {0, kL};
  const int64_t first = kL - L + rf / rep, last = kL - L + rl / rep;
  const int64_t lo = window > 0 && first - window + 1 > 0 ? first - window + 1 : 0;
  return {lo, last + 1 < kL ? last + 1 : kL};
}

// The fields every tensor-core attention kernel's parameter block shares (attention_tc.cu's TcParams,
// attention_prefill_tc.h's PrefillParams derive from it): pointers into the cache, head counts, the split, bounds and
// the mask.
struct TcCallParams {
  const float* q;
  float* out;
  float* part_o;
  float* part_ml;
  const uint8_t* kc;
  const uint8_t* vc;
  const uint8_t* ks;
  const uint8_t* kb;
  const uint8_t* vs;
  const uint8_t* vb;
  int Hq, Hkv, L, rep, R, splits;
  int64_t chunk, kL_bound, cap_k, cap_v;
  const int32_t* d_length;
  float scale_log2;  // scale · log2(e)
  // Softcap in the kernels' log2 units: cap·tanh(s/cap)·log2e = c2·tanh(s2/c2) with s2 = s·log2e, c2 = cap·log2e.
  float softcap_log2;      // cap · log2(e); 0 = none
  float inv_softcap_log2;  // 1 / softcap_log2 (0 when none)
  int causal;
  int64_t window;
  // Per-channel keys with outlier channels (KVTensorView::outliers > 0): per block, `outliers` channel indices
  // (uint16, ascending) and their 4-bit refinement codes (uint8 [outliers][32]: blocks of 64 positions).
  int outliers;
  const uint8_t* ocodes;
  const uint16_t* oindex;
};

inline void fill_tc_params(TcCallParams& p, const kernels::AttentionArgs& a, const int32_t* d_length, float* part_o,
                           float* part_ml, int splits, int64_t chunk) {
  p.q = a.q;
  p.out = a.out;
  p.part_o = part_o;
  p.part_ml = part_ml;
  p.kc = static_cast<const uint8_t*>(a.keys.data);
  p.vc = static_cast<const uint8_t*>(a.values.data);
  p.ks = static_cast<const uint8_t*>(a.keys.scales);
  p.kb = static_cast<const uint8_t*>(a.keys.biases);
  p.vs = static_cast<const uint8_t*>(a.values.scales);
  p.vb = static_cast<const uint8_t*>(a.values.biases);
  p.Hq = static_cast<int>(a.Hq);
  p.Hkv = static_cast<int>(a.keys.H);
  p.L = static_cast<int>(a.L);
  p.rep = static_cast<int>(a.Hq / a.keys.H);
  p.R = p.rep * p.L;
  p.splits = splits;
  p.chunk = chunk;
  p.kL_bound = a.keys.length;
  p.cap_k = a.keys.capacity;
  p.cap_v = a.values.capacity;
  p.d_length = d_length;
  p.scale_log2 = a.scale * 1.4426950408889634f;  // · log2(e): the kernels' softmax is in base 2
  p.softcap_log2 = a.softcap > 0.0f ? a.softcap * 1.4426950408889634f : 0.0f;
  p.inv_softcap_log2 = a.softcap > 0.0f ? 1.0f / p.softcap_log2 : 0.0f;
  p.causal = a.mask_kind == kernels::MaskKind::kCausal ? 1 : 0;
  p.window = a.window;
  p.outliers = a.keys.layout == 1 ? a.keys.outliers : 0;
  p.ocodes = static_cast<const uint8_t*>(a.keys.outlier_codes);
  p.oindex = static_cast<const uint16_t*>(a.keys.outlier_index);
}

// Both views of a per-channel-key cache in a format the tensor-core kernels read (cuda::kchan_tc_format), with their
// outlier planes where it has any: the format part of tc_eligible and prefill_tc_eligible.
bool kchan_tc_views(const kernels::KVTensorView& K, const kernels::KVTensorView& V);

}  // namespace cider::cuda::detail
