// cider/kernels/cuda/attention.cu — attention over the (quantized or plain) KV cache on the GPU (cuda::attention).
// Contract: kernels/cuda/cuda_api.h and kernels::AttentionArgs (kernel_table.h); design and floors: docs/cuda/attention.md.
//
// K4V3 / K8V4 g64 f16 caches with D 128/256 take the tensor-core paths instead: attention_tc.cu (decode, rep·L ≤ 8)
// and attention_prefill_tc.cu (prefill, rep·L > 8); plain bf16 / f16 caches with D 128/256 decode (rep·L ≤ 8) on
// attention_decode_plain_tc.cu ($CIDER_ATTN_TC_PLAIN=0: here); make_plan() decides.
// One kernel serves decode and prefill. Work item (one CTA of 128 threads = 4 warps):
//   (b, KV head g) × block of QR query rows × one piece ("split") of the key range.
// The R = rep·L query rows that share KV head g are ordered r = i·rep + rr (i the query position, rr the head within
// the group), so a block holds consecutive positions and its causal / window key range is one interval; the key range
// a block can see is cut into `splits` pieces of `chunk` keys; each piece is walked in tiles of `tile` keys:
//   1. scores: thread t takes key t0 + t, reads its packed row once (codes unpacked in registers, exactly converted to
//      float) and computes all QR dot products against the queries held transposed in shared memory [Dk][QR]:
//        score_r = scale · Σ_g ( s_g · Σ_{k∈g} q_rk·c_k + b_g · Σ_{k∈g} q_rk )      (plain: scale · Σ_k q_rk·k_k)
//      then capped when a softcap is set (score = cap·tanh(score/cap), tanhf), masked entries (causal, window, past
//      the length) are −inf.
//   2. online softmax (float32): one warp per query row updates (m, l), rescales by α = e^{m_old − m_new}, p = e^{s − m}.
//   3. values: warp w takes a quarter of the tile's keys, lane ℓ owns dims [ℓ·Dv/32, (ℓ+1)·Dv/32) (all in one
//      quantization group): acc_rd += (p_r·s_g)·c_d, bias_r += p_r·b_g (plain: acc_rd += p_r·v_d).
// The hot K4/V3 g64 path stages the tile's value rows in shared memory during step 1 (thread t loads value row t
// next to key row t, so all the tile's loads are in flight together). At the end the 4 warps' accumulators are summed;
// with one split the CTA writes out = acc / l, otherwise the partial (m, l, acc) goes to the workspace and
// merge_kernel combines the splits by log-sum-exp. A row that sees no key gets zeros.
//
// Template parameters make the hot configurations compile-time (unrolled extraction with constant shifts, register
// arrays): key/value "kind" = bits (2..8) or −1 f16 / −2 bf16 / −3 f32 plain, 0 = read from the arguments at run time;
// group size, head dims (0 = run time) and QR (query rows per CTA). Every configuration the launcher accepts has the
// run-time instantiation as its fallback, so bits, group size and layout stay plain kernel parameters.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/attention_decode_plain_tc.h"
#include "kernels/cuda/attention_prefill_tc.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMaxDim = 256;
constexpr int kMaxDimPerLane = kMaxDim / 32;
constexpr int kMaxGroups = 8;        // Dk / gs ≤ 256 / 32
constexpr int kTargetCtas = 4 * 132;  // ~4 CTAs per SM of an H200 (132 SMs): the split count aims at this many CTAs
constexpr int64_t kMinChunk = 256;    // keys per split at least (automatic splits)
constexpr int kMaxSplits = 4096;      // kv_splits is clamped to this (the merge keeps one weight per split in smem)

struct KvSide {
  const void* data;
  const void* scales;
  const void* biases;
  DType dtype;  // plain element dtype
  DType sdt;    // scale dtype
  int bits;     // 0 = plain
  int gs;
  int dim;
  int wpr;     // uint32 words per packed row
  int groups;  // dim / gs (quantized)
  int64_t capacity;
  int layout;                // keys: 0 per token, 1 per channel (blocks of gs positions, docs/kv_cache.md §2b)
  int64_t blocks;            // layout 1: scale/bias rows per (b, h)
  const uint16_t* residual;  // layout 1: bfloat16 window [B, H, gs, dim]
};

struct Params {
  const float* q;
  float* out;
  float* part_o;   // [B·Hq·L, splits, Dv]
  float* part_ml;  // [B·Hq·L, splits, 2]
  int Hq, Hkv, L, rep, R;
  int qblocks, splits, tile;
  int64_t chunk, kL_bound;
  const int32_t* d_length;
  KvSide k, v;
  float scale;
  float softcap, inv_softcap;  // softcap > 0: score = softcap·tanh(score·inv_softcap) before the mask; 0 = none
  int causal;
  int64_t window;
};

__device__ __forceinline__ float load_elem(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// A code (< 2^23) to float exactly: 2^23 + c has c in the low mantissa bits; subtracting 2^23 is exact.
__device__ __forceinline__ float code_to_float(uint32_t c) { return __uint_as_float(0x4B000000u | c) - 8388608.0f; }

// Plain dtype of a compile-time kind (−1 f16, −2 bf16, −3 f32), or the run-time one.
template <int KIND>
__device__ __forceinline__ DType plain_dtype(DType runtime) {
  if constexpr (KIND == -1) return DType::kF16;
  if constexpr (KIND == -2) return DType::kBF16;
  if constexpr (KIND == -3) return DType::kF32;
  return runtime;
}

// 8 consecutive f16 / bf16 values of a uint4 as float.
template <int KIND>
__device__ __forceinline__ void unpack8(const uint4& u, float f[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (KIND == -2) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      const __half2 h = *reinterpret_cast<const __half2*>(&w[i]);
      const float2 t = __half22float2(h);
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
}

// dot[r] = Σ_g s_g·Σ_{k∈g} q_rk·c_k + b_g·qsum_rg for key row `row` (quantized keys).
template <int KB, int GS, int DK, int QR>
__device__ __forceinline__ void key_dots_quant(const Params& p, int64_t row, const float* qT, const float* qsum,
                                               float dot[QR]) {
#pragma unroll
  for (int r = 0; r < QR; ++r) dot[r] = 0.0f;
  if constexpr (KB > 0 && GS > 0 && DK > 0) {
    constexpr int kWpr = DK * KB / 32, kG = DK / GS;
    constexpr uint32_t kMask = (1u << KB) - 1u;
    uint32_t w[kWpr];
    const uint32_t* src = static_cast<const uint32_t*>(p.k.data) + row * kWpr;
    if constexpr (kWpr % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kWpr / 4; ++i) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(src) + i);
        w[4 * i] = u.x;
        w[4 * i + 1] = u.y;
        w[4 * i + 2] = u.z;
        w[4 * i + 3] = u.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kWpr; ++i) w[i] = __ldg(src + i);
    }
    float s[kG], b[kG];
#pragma unroll
    for (int gi = 0; gi < kG; ++gi) {
      s[gi] = load_elem(p.k.scales, p.k.sdt, row * kG + gi);
      b[gi] = load_elem(p.k.biases, p.k.sdt, row * kG + gi);
    }
#pragma unroll
    for (int gi = 0; gi < kG; ++gi) {
      float qc[QR];
#pragma unroll
      for (int r = 0; r < QR; ++r) qc[r] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < GS; ++kk) {
        const int k = gi * GS + kk;
        const int bit = k * KB, wi = bit >> 5, sh = bit & 31;
        uint32_t c = w[wi] >> sh;
        if (sh + KB > 32) c |= w[wi + 1] << (32 - sh);
        const float cf = code_to_float(c & kMask);
        const float4* q4 = reinterpret_cast<const float4*>(qT + k * QR);
#pragma unroll
        for (int r4 = 0; r4 < QR / 4; ++r4) {
          const float4 qv = q4[r4];
          qc[4 * r4] = fmaf(qv.x, cf, qc[4 * r4]);
          qc[4 * r4 + 1] = fmaf(qv.y, cf, qc[4 * r4 + 1]);
          qc[4 * r4 + 2] = fmaf(qv.z, cf, qc[4 * r4 + 2]);
          qc[4 * r4 + 3] = fmaf(qv.w, cf, qc[4 * r4 + 3]);
        }
      }
#pragma unroll
      for (int r = 0; r < QR; ++r) dot[r] += s[gi] * qc[r] + b[gi] * qsum[r * kMaxGroups + gi];
    }
  } else {
    const int bits = p.k.bits, gs = p.k.gs, G = p.k.groups;
    const uint32_t mask = (1u << bits) - 1u;
    const uint32_t* src = static_cast<const uint32_t*>(p.k.data) + row * p.k.wpr;
    for (int gi = 0; gi < G; ++gi) {
      float qc[QR];
#pragma unroll
      for (int r = 0; r < QR; ++r) qc[r] = 0.0f;
      for (int kk = 0; kk < gs; ++kk) {
        const int k = gi * gs + kk;
        const int bit = k * bits, wi = bit >> 5, sh = bit & 31;
        uint32_t c = __ldg(src + wi) >> sh;
        if (sh + bits > 32) c |= __ldg(src + wi + 1) << (32 - sh);
        const float cf = code_to_float(c & mask);
        const float4* q4 = reinterpret_cast<const float4*>(qT + k * QR);
#pragma unroll
        for (int r4 = 0; r4 < QR / 4; ++r4) {
          const float4 qv = q4[r4];
          qc[4 * r4] = fmaf(qv.x, cf, qc[4 * r4]);
          qc[4 * r4 + 1] = fmaf(qv.y, cf, qc[4 * r4 + 1]);
          qc[4 * r4 + 2] = fmaf(qv.z, cf, qc[4 * r4 + 2]);
          qc[4 * r4 + 3] = fmaf(qv.w, cf, qc[4 * r4 + 3]);
        }
      }
      const float s = load_elem(p.k.scales, p.k.sdt, row * G + gi);
      const float b = load_elem(p.k.biases, p.k.sdt, row * G + gi);
#pragma unroll
      for (int r = 0; r < QR; ++r) dot[r] += s * qc[r] + b * qsum[r * kMaxGroups + gi];
    }
  }
}

// dot[r] = Σ_k q_rk·k_k for a plain key row.
template <int KK, int DK, int QR>
__device__ __forceinline__ void key_dots_plain(const Params& p, int64_t row, const float* qT, float dot[QR]) {
#pragma unroll
  for (int r = 0; r < QR; ++r) dot[r] = 0.0f;
  auto fma_elem = [&](int k, float kv) {
    const float4* q4 = reinterpret_cast<const float4*>(qT + k * QR);
#pragma unroll
    for (int r4 = 0; r4 < QR / 4; ++r4) {
      const float4 qv = q4[r4];
      dot[4 * r4] = fmaf(qv.x, kv, dot[4 * r4]);
      dot[4 * r4 + 1] = fmaf(qv.y, kv, dot[4 * r4 + 1]);
      dot[4 * r4 + 2] = fmaf(qv.z, kv, dot[4 * r4 + 2]);
      dot[4 * r4 + 3] = fmaf(qv.w, kv, dot[4 * r4 + 3]);
    }
  };
  if constexpr ((KK == -1 || KK == -2) && DK > 0) {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p.k.data) + row * DK);
#pragma unroll 4
    for (int c = 0; c < DK / 8; ++c) {
      float f[8];
      unpack8<KK>(__ldg(src + c), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) fma_elem(c * 8 + e, f[e]);
    }
  } else {
    const DType dt = plain_dtype<KK>(p.k.dtype);
    const int D = DK > 0 ? DK : p.k.dim;
    for (int k = 0; k < D; ++k) fma_elem(k, load_elem(p.k.data, dt, row * D + k));
  }
}

// Per-channel keys, a row of a quantized block: dot[r] = β_r + Σ_k qs_rk·c_k, where qs (shared [Dk][QR]) holds the
// queries with the block's per-channel scales folded in (q_rk·s_k) and β_r = Σ_k q_rk·b_k.
template <int KB, int DK, int QR>
__device__ __forceinline__ void key_dots_channel(const Params& p, int64_t row, const float* qs, const float* beta,
                                                 float dot[QR]) {
#pragma unroll
  for (int r = 0; r < QR; ++r) dot[r] = beta[r];
  auto fma_code = [&](int k, uint32_t c) {
    const float cf = code_to_float(c);
    const float4* q4 = reinterpret_cast<const float4*>(qs + k * QR);
#pragma unroll
    for (int r4 = 0; r4 < QR / 4; ++r4) {
      const float4 qv = q4[r4];
      dot[4 * r4] = fmaf(qv.x, cf, dot[4 * r4]);
      dot[4 * r4 + 1] = fmaf(qv.y, cf, dot[4 * r4 + 1]);
      dot[4 * r4 + 2] = fmaf(qv.z, cf, dot[4 * r4 + 2]);
      dot[4 * r4 + 3] = fmaf(qv.w, cf, dot[4 * r4 + 3]);
    }
  };
  if constexpr (KB > 0 && DK > 0) {
    // The row's words in registers (uint4 loads), codes extracted with constant shifts.
    constexpr int kWpr = DK * KB / 32;
    constexpr uint32_t kMask = (1u << KB) - 1u;
    static_assert(kWpr % 4 == 0, "whole uint4 rows");
    uint32_t w[kWpr];
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(p.k.data) + row * kWpr);
#pragma unroll
    for (int i = 0; i < kWpr / 4; ++i) {
      const uint4 u = __ldg(src + i);
      w[4 * i] = u.x;
      w[4 * i + 1] = u.y;
      w[4 * i + 2] = u.z;
      w[4 * i + 3] = u.w;
    }
#pragma unroll
    for (int k = 0; k < DK; ++k) {
      const int bit = k * KB, wi = bit >> 5, sh = bit & 31;
      uint32_t c = w[wi] >> sh;
      if (sh + KB > 32) c |= w[wi + 1] << (32 - sh);
      fma_code(k, c & kMask);
    }
  } else {
    const int bits = p.k.bits, D = p.k.dim, wpr = p.k.wpr;
    const uint32_t mask = (1u << bits) - 1u;
    const uint32_t* src = static_cast<const uint32_t*>(p.k.data) + row * wpr;
    for (int k = 0; k < D; ++k) {
      const int bit = k * bits, wi = bit >> 5, sh = bit & 31;
      uint32_t c = __ldg(src + wi) >> sh;
      if (sh + bits > 32) c |= __ldg(src + wi + 1) << (32 - sh);
      fma_code(k, c & mask);
    }
  }
}

// Per-channel keys, a row of the residual window (bfloat16, slot `slot` of (b, g)'s window): dot[r] = Σ_k q_rk·k_k.
template <int DK, int QR>
__device__ __forceinline__ void key_dots_window(const Params& p, int64_t bg, int64_t slot, const float* qT,
                                                float dot[QR]) {
#pragma unroll
  for (int r = 0; r < QR; ++r) dot[r] = 0.0f;
  const int D = DK > 0 ? DK : p.k.dim;
  const uint4* src = reinterpret_cast<const uint4*>(p.k.residual + (bg * p.k.gs + slot) * D);
  for (int c = 0; c < D / 8; ++c) {
    float f[8];
    unpack8<-2>(__ldg(src + c), f);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float4* q4 = reinterpret_cast<const float4*>(qT + (c * 8 + e) * QR);
#pragma unroll
      for (int r4 = 0; r4 < QR / 4; ++r4) {
        const float4 qv = q4[r4];
        dot[4 * r4] = fmaf(qv.x, f[e], dot[4 * r4]);
        dot[4 * r4 + 1] = fmaf(qv.y, f[e], dot[4 * r4 + 1]);
        dot[4 * r4 + 2] = fmaf(qv.z, f[e], dot[4 * r4 + 2]);
        dot[4 * r4 + 3] = fmaf(qv.w, f[e], dot[4 * r4 + 3]);
      }
    }
  }
}

template <int KK, int VK, int GS, int DK, int DV, int QR, bool STAGE_V>
__global__ void __launch_bounds__(kThreads) attention_kernel(Params p) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int Dk = DK > 0 ? DK : p.k.dim;
  const int Dv = DV > 0 ? DV : p.v.dim;
  const int dpt = Dv / 32;  // value dims per lane (1, 2, 4 or 8)
  const int tile = p.tile;
  const bool kquant = KK > 0 || (KK == 0 && p.k.bits > 0);
  const bool vquant = VK > 0 || (VK == 0 && p.v.bits > 0);

  float* qT = smem;                        // [Dk][QR] queries, transposed
  float* qsum = qT + Dk * QR;              // [QR][kMaxGroups] Σ_{k∈g} q_rk
  float* sc = qsum + QR * kMaxGroups;      // [QR][tile] scores, then p
  float* row_m = sc + QR * tile;           // [QR]
  float* row_l = row_m + QR;               // [QR]
  float* row_alpha = row_l + QR;           // [QR]
  float* tail = row_alpha + 2 * QR;        // staged values during the loop; [warps][QR][Dv] partial sums after it
  const bool kchan = p.k.layout == 1;
  float* qs = tail + kWarps * QR * Dv;     // per-channel keys: [2][Dk][QR] queries · the tile's two block scales
  float* beta = qs + 2 * Dk * QR;          // per-channel keys: [2][QR] Σ_k q_rk·b_k of the tile's two blocks

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bg = blockIdx.z, b = bg / p.Hkv, g = bg % p.Hkv;
  const int qb = blockIdx.x / p.splits, split = blockIdx.x % p.splits;
  pdl::wait();  // PDL: q, the cache and d_length are read after the previous kernel has completed
  pdl::launch_dependents();
  int64_t kL = p.kL_bound;
  if (p.d_length) kL = max(static_cast<int64_t>(0), min(static_cast<int64_t>(*p.d_length), p.kL_bound));

  // Rows of this block: rg = qb·QR + r over the R = rep·L rows of (b, g); position i = rg / rep.
  const int rg0 = qb * QR;
  const int nrows = min(QR, p.R - rg0);
  const int64_t pos_first = kL - p.L + rg0 / p.rep;
  const int64_t pos_last = kL - p.L + (rg0 + nrows - 1) / p.rep;
  int64_t lo = 0, hi = kL;
  if (p.causal) {
    hi = min(kL, pos_last + 1);
    if (p.window > 0) lo = max(static_cast<int64_t>(0), pos_first - p.window + 1);
  }
  // With a device length (a decode graph planned for a bound) the block's visible interval is spread over all splits
  // (attention_tc.h's split_range), so the splits past the real length do not sit idle; otherwise the plan's pieces
  // of ceil(length / splits) keys. Why not split_range always: job 63 measured the plain bf16 D128 L32768 row 11 %
  // slower with it (80.6 vs 72.8 us; ptxas allocated the kernel differently), at either quantum (job 64).
  detail::SplitRange sr;
  if (p.d_length != nullptr) {
    sr = detail::split_range(lo, hi, split, p.splits, 1);
  } else {
    sr.c0 = max(lo, static_cast<int64_t>(split) * p.chunk);
    sr.c1 = min(hi, static_cast<int64_t>(split + 1) * p.chunk);
  }
  const int64_t c0 = sr.c0, c1 = sr.c1;

  // ---- queries → shared memory (transposed), group sums ----
  for (int idx = tid; idx < QR * Dk; idx += kThreads) {
    const int r = idx / Dk, k = idx % Dk;
    float v = 0.0f;
    if (r < nrows) {
      const int rg = rg0 + r, i = rg / p.rep, hq = g * p.rep + rg % p.rep;
      v = p.q[((static_cast<int64_t>(b) * p.Hq + hq) * p.L + i) * Dk + k];
    }
    qT[k * QR + r] = v;
  }
  if (tid < QR) {
    row_m[tid] = kNegInf;
    row_l[tid] = 0.0f;
    row_alpha[tid] = 1.0f;
  }
  __syncthreads();
  if (kquant && !kchan) {
    const int kgs = GS > 0 ? GS : p.k.gs;
    const int G = Dk / kgs;
    for (int idx = tid; idx < QR * G; idx += kThreads) {
      const int r = idx / G, gi = idx % G;
      float s = 0.0f;
      for (int k = gi * kgs; k < (gi + 1) * kgs; ++k) s += qT[k * QR + r];
      qsum[r * kMaxGroups + gi] = s;
    }
  }
  __syncthreads();

  float acc[QR][kMaxDimPerLane];
  float bacc[QR];
#pragma unroll
  for (int r = 0; r < QR; ++r) {
    bacc[r] = 0.0f;
#pragma unroll
    for (int dd = 0; dd < kMaxDimPerLane; ++dd) acc[r][dd] = 0.0f;
  }
  const int d0 = lane * dpt;
  const int64_t kv_row0 = static_cast<int64_t>(bg) * p.k.capacity;  // row (b, g, 0) of the keys
  const int64_t vv_row0 = static_cast<int64_t>(bg) * p.v.capacity;
  const int vgs = GS > 0 ? GS : p.v.gs;
  const int vgroup = vquant ? d0 / vgs : 0;
  const int vG = vquant ? Dv / vgs : 0;

  // Per-channel keys: complete blocks [0, full_blocks) are quantized, later positions sit in the residual window; a
  // tile covers at most two blocks (the plan's tile is ≤ 2·gs), whose scales are folded into two query copies.
  const int64_t kgs_c = kchan ? p.k.gs : 1;
  const int64_t full_blocks = kchan ? kL / kgs_c : 0;
  int n_here = 0;
  int64_t first_block = 0;  // per-channel keys: the block of the tile's first key
  for (int64_t t0 = c0; t0 < c1; t0 += n_here) {
    n_here = static_cast<int>(min(static_cast<int64_t>(tile), c1 - t0));
    if (kchan) {
      first_block = t0 / kgs_c;
      n_here = static_cast<int>(min(static_cast<int64_t>(n_here), (first_block + 2) * kgs_c - t0));
      const int nb = static_cast<int>(min(static_cast<int64_t>(2), (t0 + n_here - 1) / kgs_c - first_block + 1));
      for (int bi = 0; bi < nb; ++bi) {
        const int64_t block = first_block + bi;
        if (block >= full_blocks) break;  // window rows: scored with the plain queries
        const int64_t srow = (static_cast<int64_t>(bg) * p.k.blocks + block) * Dk;
        float* qsb = qs + bi * Dk * QR;
        for (int idx = tid; idx < Dk * QR; idx += kThreads)
          qsb[idx] = qT[idx] * load_elem(p.k.scales, p.k.sdt, srow + idx / QR);
        for (int r = warp; r < QR; r += kWarps) {
          float acc_b = 0.0f;
          for (int k = lane; k < Dk; k += 32) acc_b = fmaf(qT[k * QR + r], load_elem(p.k.biases, p.k.sdt, srow + k), acc_b);
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) acc_b += __shfl_xor_sync(0xffffffffu, acc_b, o);
          if (lane == 0) beta[bi * QR + r] = acc_b;
        }
      }
      __syncthreads();
    }
    // ---- 1. scores (and the value rows staged next to the key rows) ----
    if (tid < tile) {
      float dot[QR];
      const int64_t j = t0 + tid;
      if (tid < n_here) {
        if constexpr (STAGE_V) {
          // Value row j: its packed words and its scale/bias, to shared memory for step 3.
          constexpr int kVw = DV * VK / 32, kVG = DV / GS;
          static_assert(kVw % 4 == 0, "staged value rows are whole uint4s");
          const uint4* vsrc = reinterpret_cast<const uint4*>(static_cast<const uint32_t*>(p.v.data) +
                                                             (vv_row0 + j) * kVw);
          uint4 vbuf[kVw / 4];
#pragma unroll
          for (int i = 0; i < kVw / 4; ++i) vbuf[i] = __ldg(vsrc + i);
          float vsb[2 * kVG];
#pragma unroll
          for (int gi = 0; gi < kVG; ++gi) {
            vsb[2 * gi] = load_elem(p.v.scales, p.v.sdt, (vv_row0 + j) * kVG + gi);
            vsb[2 * gi + 1] = load_elem(p.v.biases, p.v.sdt, (vv_row0 + j) * kVG + gi);
          }
          if (kquant)
            key_dots_quant<KK, GS, DK, QR>(p, kv_row0 + j, qT, qsum, dot);
          else
            key_dots_plain<KK, DK, QR>(p, kv_row0 + j, qT, dot);
          uint4* vdst = reinterpret_cast<uint4*>(tail) + tid * (kVw / 4);
#pragma unroll
          for (int i = 0; i < kVw / 4; ++i) vdst[i] = vbuf[i];
          float* sb = tail + tile * kVw + tid * 2 * kVG;
#pragma unroll
          for (int i = 0; i < 2 * kVG; ++i) sb[i] = vsb[i];
        } else {
          if (kchan) {
            const int64_t block = j / kgs_c;
            const int bi = static_cast<int>(block - first_block);
            if (block < full_blocks)
              key_dots_channel<KK, DK, QR>(p, kv_row0 + j, qs + bi * Dk * QR, beta + bi * QR, dot);
            else
              key_dots_window<DK, QR>(p, bg, j % kgs_c, qT, dot);
          } else if (kquant) {
            key_dots_quant<KK, GS, DK, QR>(p, kv_row0 + j, qT, qsum, dot);
          } else {
            key_dots_plain<KK, DK, QR>(p, kv_row0 + j, qT, dot);
          }
        }
#pragma unroll
        for (int r = 0; r < QR; ++r) {
          bool visible = r < nrows;
          if (p.causal) {
            const int64_t pos = kL - p.L + (rg0 + r) / p.rep;
            visible = visible && j <= pos && (p.window == 0 || j > pos - p.window);
          }
          float s = p.scale * dot[r];
          if (p.softcap > 0.0f) s = p.softcap * tanhf(s * p.inv_softcap);
          sc[r * tile + tid] = visible ? s : kNegInf;
        }
      } else {
#pragma unroll
        for (int r = 0; r < QR; ++r) sc[r * tile + tid] = kNegInf;
      }
    }
    __syncthreads();
    // ---- 2. online softmax, one warp per row ----
    for (int r = warp; r < QR; r += kWarps) {
      float* s = sc + r * tile;
      float tmax = kNegInf;
      for (int jj = lane; jj < tile; jj += 32) tmax = fmaxf(tmax, s[jj]);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float m_old = row_m[r];
      const float m_new = fmaxf(m_old, tmax);
      float sum = 0.0f;
      float alpha = 1.0f;
      if (m_new == kNegInf) {
        for (int jj = lane; jj < tile; jj += 32) s[jj] = 0.0f;
      } else {
        alpha = expf(m_old - m_new);  // 0 when m_old = −inf
        for (int jj = lane; jj < tile; jj += 32) {
          const float e = expf(s[jj] - m_new);  // 0 for masked keys
          s[jj] = e;
          sum += e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();
      if (lane == 0) {
        row_m[r] = m_new;
        row_l[r] = row_l[r] * alpha + sum;
        row_alpha[r] = alpha;
      }
    }
    __syncthreads();
    // ---- 3. values: warp w takes keys [w·tile/4, (w+1)·tile/4) of the tile ----
#pragma unroll
    for (int r = 0; r < QR; ++r) {
      const float a = row_alpha[r];
      bacc[r] *= a;
#pragma unroll
      for (int dd = 0; dd < kMaxDimPerLane; ++dd) acc[r][dd] *= a;
    }
    const int kpw = tile / kWarps;
    const int jj_end = min(n_here, (warp + 1) * kpw);
    if (vquant) {
      const int vbits = VK > 0 ? VK : p.v.bits;
      const int vwpr = VK > 0 && DV > 0 ? DV * VK / 32 : p.v.wpr;
      const uint32_t vmask = (1u << vbits) - 1u;
      const int bit0 = d0 * vbits, wi = bit0 >> 5, sh = bit0 & 31;
      const bool has_hi = wi + 1 < vwpr;
#pragma unroll 4
      for (int jj = warp * kpw; jj < jj_end; ++jj) {
        uint32_t wlo, whi;
        float s, bv;
        if constexpr (STAGE_V) {
          const uint32_t* vw = reinterpret_cast<const uint32_t*>(tail) + jj * vwpr;
          wlo = vw[wi];
          whi = has_hi ? vw[wi + 1] : 0u;
          const float* sb = tail + tile * vwpr + jj * 2 * vG;
          s = sb[2 * vgroup];
          bv = sb[2 * vgroup + 1];
        } else {
          const int64_t row = vv_row0 + t0 + jj;
          const uint32_t* vw = static_cast<const uint32_t*>(p.v.data) + row * vwpr;
          wlo = __ldg(vw + wi);
          whi = has_hi ? __ldg(vw + wi + 1) : 0u;
          s = load_elem(p.v.scales, p.v.sdt, row * vG + vgroup);
          bv = load_elem(p.v.biases, p.v.sdt, row * vG + vgroup);
        }
        const uint64_t win = ((static_cast<uint64_t>(whi) << 32) | wlo) >> sh;
        float c[kMaxDimPerLane];
#pragma unroll
        for (int dd = 0; dd < kMaxDimPerLane; ++dd)
          c[dd] = dd < dpt ? code_to_float(static_cast<uint32_t>(win >> (dd * vbits)) & vmask) : 0.0f;
#pragma unroll
        for (int r = 0; r < QR; ++r) {
          const float pr = sc[r * tile + jj];
          const float ps = pr * s;
          bacc[r] = fmaf(pr, bv, bacc[r]);
#pragma unroll
          for (int dd = 0; dd < kMaxDimPerLane; ++dd)
            if (dd < dpt) acc[r][dd] = fmaf(ps, c[dd], acc[r][dd]);
        }
      }
    } else {
      const DType vdt = plain_dtype<VK>(p.v.dtype);
#pragma unroll 4
      for (int jj = warp * kpw; jj < jj_end; ++jj) {
        const int64_t row = vv_row0 + t0 + jj;
        float v[kMaxDimPerLane];
#pragma unroll
        for (int dd = 0; dd < kMaxDimPerLane; ++dd)
          v[dd] = dd < dpt ? load_elem(p.v.data, vdt, row * Dv + d0 + dd) : 0.0f;
#pragma unroll
        for (int r = 0; r < QR; ++r) {
          const float pr = sc[r * tile + jj];
#pragma unroll
          for (int dd = 0; dd < kMaxDimPerLane; ++dd)
            if (dd < dpt) acc[r][dd] = fmaf(pr, v[dd], acc[r][dd]);
        }
      }
    }
    __syncthreads();  // sc and the staged rows are rewritten by the next tile
  }

  // ---- sum the warps' partial accumulators, then write out or the split partial ----
  float* red = tail;  // [warps][QR][Dv]
#pragma unroll
  for (int r = 0; r < QR; ++r)
#pragma unroll
    for (int dd = 0; dd < kMaxDimPerLane; ++dd)
      if (dd < dpt) red[(warp * QR + r) * Dv + d0 + dd] = acc[r][dd] + bacc[r];
  __syncthreads();
  for (int idx = tid; idx < QR * Dv; idx += kThreads) {
    const int r = idx / Dv, d = idx % Dv;
    if (r >= nrows) continue;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += red[(w * QR + r) * Dv + d];
    const int rg = rg0 + r, i = rg / p.rep, hq = g * p.rep + rg % p.rep;
    const int64_t orow = (static_cast<int64_t>(b) * p.Hq + hq) * p.L + i;
    if (p.splits == 1) {
      const float l = row_l[r];
      p.out[orow * Dv + d] = l > 0.0f ? o / l : 0.0f;
    } else {
      p.part_o[(orow * p.splits + split) * Dv + d] = o;
      if (d == 0) {
        p.part_ml[(orow * p.splits + split) * 2] = row_m[r];
        p.part_ml[(orow * p.splits + split) * 2 + 1] = row_l[r];
      }
    }
  }
}

// out[row] = Σ_s e^{m_s − M}·o_s / Σ_s e^{m_s − M}·l_s over the splits with l_s > 0 (zeros when there is none).
// One CTA per output row, every step parallel over the splits (the first version looped over them in each thread:
// ~14 µs for 32 rows × 64 splits, latency-bound): (1) M by a block max, (2) the weights to shared memory and L by a
// block sum, (3) thread (group, column) sums its splits s ≡ group (mod groups) over VEC-wide columns of o (float4
// when the workspace allows), then the groups' sums are added in shared memory.
// Shared memory (dynamic): [splits] weights, then [kThreads·4] group partial sums.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // red is free (an earlier reduction's readers are done)
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// The merge for any Dv (the fallback of merge4_kernel: Dv % 4 != 0, Dv > 4 · kThreads or unaligned partials), by
// block reductions: the splits' max, then the weights and their sum, then the weighted sums.
__global__ void __launch_bounds__(kThreads) merge_kernel(const float* part_o, const float* part_ml, float* out,
                                                         int splits, int Dv) {
  extern __shared__ float merge_smem[];
  __shared__ float red[kWarps];
  float* weight = merge_smem;           // [splits]
  float* partial = merge_smem + splits;  // [kThreads]
  const int tid = threadIdx.x;
  const int64_t row = blockIdx.x;
  pdl::wait();  // the partials are the previous kernel's output
  pdl::launch_dependents();
  const float* ml = part_ml + row * splits * 2;
  float m = -std::numeric_limits<float>::infinity();
  for (int s = tid; s < splits; s += kThreads)
    if (ml[2 * s + 1] > 0.0f) m = fmaxf(m, ml[2 * s]);
  const float M = block_reduce(m, true, red);
  float l = 0.0f;
  for (int s = tid; s < splits; s += kThreads) {
    const float w = (ml[2 * s + 1] > 0.0f) ? expf(ml[2 * s] - M) : 0.0f;
    weight[s] = w;
    l += w * ml[2 * s + 1];
  }
  const float L = block_reduce(l, false, red);  // its barriers also publish weight[]
  const int cols = Dv;
  const int groups = max(1, kThreads / cols);
  const int col = tid % cols, grp = tid / cols;
  if (cols <= kThreads) {
    if (grp < groups) {
      float acc = 0.0f;
      const float* base = part_o + row * static_cast<int64_t>(splits) * Dv + col;
#pragma unroll 4
      for (int s = grp; s < splits; s += groups) {
        const float w = weight[s];
        if (w == 0.0f) continue;  // an empty split (its o is zeros, never read as garbage)
        acc += w * base[static_cast<int64_t>(s) * Dv];
      }
      partial[tid] = acc;
    }
    __syncthreads();
    if (tid < cols) {
      float o = 0.0f;
      for (int gi = 0; gi < groups; ++gi) o += partial[gi * cols + tid];
      out[row * Dv + tid] = L > 0.0f ? o / L : 0.0f;
    }
  } else {  // Dv > kThreads: one column per thread at a time, splits in sequence
    for (int d = tid; d < Dv; d += kThreads) {
      float o = 0.0f;
      for (int s = 0; s < splits; ++s)
        if (weight[s] != 0.0f) o += weight[s] * part_o[(row * splits + s) * Dv + d];
      out[row * Dv + d] = L > 0.0f ? o / L : 0.0f;
    }
  }
}

// The merge for float4 columns (Dv % 4 == 0, 16-byte aligned partials), one round trip: CTA (row, column block) of
// 128 threads = kMergeCols float4 columns × split groups; thread (column c, group sg) takes the splits s ≡ sg (mod
// groups) and loads up to kMergeChunk of them at once (m, l and the float4 of o), folding each chunk into a running
// (m, l, acc) with online rescaling — no block-wide max before the loads, so every global load of the CTA is in flight
// together. The groups of a column are then combined through shared memory by log-sum-exp, the same formula:
// out = Σ_s e^{m_s − M}·o_s / Σ_s e^{m_s − M}·l_s over the splits with l_s > 0, zeros when there is none.
// Session 3's block-reduction merge for float4 columns (removed; git has it) made ≈ 4 dependent round trips (block max,
// block sum, then the sums): ≈ 4.4 µs of the 22.9 µs of K4V3 B1 L32768 (job 20).
constexpr int kMergeCols = 32;   // float4 columns per CTA (128 dims)
constexpr int kMergeChunk = 16;  // splits per thread loaded at once
__global__ void __launch_bounds__(kThreads) merge4_kernel(const float* part_o, const float* part_ml, float* out,
                                                          int splits, int Dv) {
  __shared__ float4 red_acc[kThreads];
  __shared__ float2 red_ml[kThreads];
  const int tid = threadIdx.x;
  const int cols = Dv / 4;
  const int cpc = min(cols, kMergeCols);  // columns of this CTA's width
  const int groups = kThreads / cpc;
  const int c = blockIdx.y * cpc + tid % cpc, sg = tid / cpc;
  const bool active = sg < groups && c < cols;
  const int64_t row = blockIdx.x;
  pdl::wait();  // the partials are the previous kernel's output
  pdl::launch_dependents();
  const float2* ml = reinterpret_cast<const float2*>(part_ml) + row * splits;
  const float4* po = reinterpret_cast<const float4*>(part_o + row * static_cast<int64_t>(splits) * Dv) + c;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m_run = kNegInf, l_run = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (active) {
    for (int s0 = sg; s0 < splits; s0 += groups * kMergeChunk) {
      float2 v[kMergeChunk];
      float4 o[kMergeChunk];
#pragma unroll
      for (int k = 0; k < kMergeChunk; ++k) {
        const int s = s0 + k * groups;
        v[k] = s < splits ? ml[s] : make_float2(kNegInf, 0.0f);
        o[k] = (s < splits && v[k].y > 0.0f) ? po[static_cast<int64_t>(s) * cols] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
      float mc = m_run;
#pragma unroll
      for (int k = 0; k < kMergeChunk; ++k)
        if (v[k].y > 0.0f) mc = fmaxf(mc, v[k].x);
      if (mc == kNegInf) continue;  // nothing visible so far
      const float alpha = m_run == kNegInf ? 0.0f : expf(m_run - mc);
      acc.x *= alpha, acc.y *= alpha, acc.z *= alpha, acc.w *= alpha;
      l_run *= alpha;
#pragma unroll
      for (int k = 0; k < kMergeChunk; ++k) {
        const float w = v[k].y > 0.0f ? expf(v[k].x - mc) : 0.0f;
        acc.x += w * o[k].x, acc.y += w * o[k].y, acc.z += w * o[k].z, acc.w += w * o[k].w;
        l_run += w * v[k].y;
      }
      m_run = mc;
    }
  }
  red_acc[tid] = acc;
  red_ml[tid] = make_float2(m_run, l_run);
  __syncthreads();
  if (!active || sg != 0) return;
  float M = kNegInf;
  for (int g = 0; g < groups; ++g) {
    const float2 t = red_ml[g * cpc + tid];
    if (t.y > 0.0f) M = fmaxf(M, t.x);
  }
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float L = 0.0f;
  if (M != kNegInf) {
    for (int g = 0; g < groups; ++g) {
      const float2 t = red_ml[g * cpc + tid];
      if (!(t.y > 0.0f)) continue;
      const float w = expf(t.x - M);
      const float4 a = red_acc[g * cpc + tid];
      o.x += w * a.x, o.y += w * a.y, o.z += w * a.z, o.w += w * a.w;
      L += w * t.y;
    }
  }
  const float4 res = L > 0.0f ? make_float4(o.x / L, o.y / L, o.z / L, o.w / L) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  reinterpret_cast<float4*>(out + row * Dv)[c] = res;
}

// Launches the merge of `splits` partials per output row (attention's workspace layout).
void launch_merge(const float* part_o, const float* part_ml, float* out, int64_t rows, int splits, int Dv,
                  cudaStream_t stream) {
  const bool vec = Dv % 4 == 0 && Dv / 4 <= kThreads && (reinterpret_cast<uintptr_t>(part_o) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
  cudaError_t err;
  if (vec) {
    const int cols = Dv / 4, cpc = std::min(cols, kMergeCols);
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((cols + cpc - 1) / cpc));
    err = pdl::launch(merge4_kernel, grid, dim3(kThreads), 0, stream, part_o, part_ml, out, splits, Dv);
  } else {
    const size_t smem = (static_cast<size_t>(splits) + kThreads) * sizeof(float);
    err = pdl::launch(merge_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), smem, stream, part_o, part_ml,
                      out, splits, Dv);
  }
  CIDER_CUDA_CHECK("cuda.attention", err);
}

// ---- host side ----

struct Plan {
  bool tc = false;  // the tensor-core decode path (attention_tc.cu) runs it
  detail::TcPlan tcp;
  bool plain_tc = false;  // the plain bf16/f16 tensor-core decode path (attention_decode_plain_tc.cu) runs it
  detail::PlainTcPlan ptp;
  bool prefill_tc = false;  // the tensor-core prefill path (attention_prefill_tc.cu) runs it
  detail::PrefillTcPlan pfp;
  int QR = 8;
  int qblocks = 1, splits = 1, tile = 128;
  int64_t chunk = 0;
  int kernel = 0;  // which instantiation (see launch_attention)
  size_t smem = 0;
  size_t workspace = 0;
};

enum KernelId : int {
  kRuntime = 0,
  kK4V3G64D128 = 1,
  kK4V3G64D256 = 2,
  kBf16D128 = 3,
  kBf16D256 = 4,
  kF16D128 = 5,
  kK4V4G64D128Chan = 6,  // per-channel keys
  kK5V5G64D128Chan = 7,
};

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool is_affine_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

void validate_side(const char* op, const char* name, const kernels::KVTensorView& v) {
  check(v.data != nullptr, ErrorCode::kInvalidArgument, op, name, " data must not be null");
  check(v.dim == 32 || v.dim == 64 || v.dim == 128 || v.dim == 256, ErrorCode::kUnsupported, op, name,
        " head dim must be 32, 64, 128 or 256; got ", v.dim);
  if (v.bits == 0) {
    check(is_float(v.dtype), ErrorCode::kInvalidArgument, op, "plain ", name, " must be f32, f16 or bf16; got ",
          dtype_name(v.dtype));
    check((reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(dtype_size(v.dtype))) == 0,
          ErrorCode::kInvalidArgument, op, name, " data must be aligned to its element size");
    return;
  }
  check(is_affine_bits(v.bits), ErrorCode::kInvalidArgument, op, name,
        " bits must be 0 (plain), 2, 3, 4, 5, 6 or 8; got ", v.bits);
  check(v.dtype == DType::kU32, ErrorCode::kInvalidArgument, op, "quantized ", name, " codes must be u32; got ",
        dtype_name(v.dtype));
  check(is_float(v.scale_dtype), ErrorCode::kInvalidArgument, op, name, " scale dtype must be f32, f16 or bf16; got ",
        dtype_name(v.scale_dtype));
  check(v.group_size == 32 || v.group_size == 64 || v.group_size == 128, ErrorCode::kInvalidArgument, op, name,
        " group_size must be 32, 64 or 128; got ", v.group_size);
  check(v.dim % v.group_size == 0, ErrorCode::kShapeMismatch, op, name, " dim must be a multiple of group_size ",
        v.group_size, "; got ", v.dim);
  check(v.scales != nullptr && v.biases != nullptr, ErrorCode::kInvalidArgument, op, name,
        " scales and biases must not be null");
  check((reinterpret_cast<uintptr_t>(v.data) & 3u) == 0, ErrorCode::kInvalidArgument, op, name,
        " codes must be 4-byte aligned");
}

void validate(const char* op, const kernels::AttentionArgs& a) {
  check(a.q != nullptr && a.out != nullptr, ErrorCode::kInvalidArgument, op, "q and out must not be null");
  check(a.B >= 1 && a.Hq >= 1 && a.L >= 1, ErrorCode::kShapeMismatch, op, "B, Hq, L must be >= 1; got ", a.B, ", ",
        a.Hq, ", ", a.L);
  check(a.mask_kind == kernels::MaskKind::kNone || a.mask_kind == kernels::MaskKind::kCausal,
        ErrorCode::kUnsupported, op, "mask kind must be none or causal (bool and additive masks are not implemented "
        "on the GPU); got ", static_cast<int>(a.mask_kind));
  check(a.window >= 0, ErrorCode::kInvalidArgument, op, "window must be >= 0; got ", a.window);
  check(std::isfinite(a.softcap) && a.softcap >= 0.0f, ErrorCode::kInvalidArgument, op,
        "softcap must be finite and >= 0 (0 = none); got ", a.softcap);
  const kernels::KVTensorView& K = a.keys;
  const kernels::KVTensorView& V = a.values;
  check(K.B == a.B && V.B == a.B, ErrorCode::kShapeMismatch, op, "keys and values must have batch ", a.B, "; got ",
        K.B, " and ", V.B);
  check(K.H >= 1 && V.H == K.H && a.Hq % K.H == 0, ErrorCode::kShapeMismatch, op,
        "Hq must be a multiple of the KV heads and keys/values must agree; got Hq ", a.Hq, ", keys H ", K.H,
        ", values H ", V.H);
  check(K.length >= 1 && V.length == K.length, ErrorCode::kShapeMismatch, op,
        "keys and values need the same length >= 1; got ", K.length, " and ", V.length);
  check(K.length <= K.capacity && V.length <= V.capacity, ErrorCode::kShapeMismatch, op,
        "length must not exceed capacity; got ", K.length, " > ", K.capacity, " or ", V.capacity);
  validate_side(op, "keys", K);
  validate_side(op, "values", V);
  check(V.layout == 0 && (K.layout == 0 || K.layout == 1), ErrorCode::kInvalidArgument, op,
        "key layout must be 0 (per token) or 1 (per channel) and value layout 0; got ", K.layout, " and ", V.layout);
  if (K.layout == 1) {
    check(K.bits > 0, ErrorCode::kInvalidArgument, op, "per-channel keys must be quantized; got bits 0");
    check(K.outliers >= 0 && K.outliers <= std::min<int64_t>(32, K.dim), ErrorCode::kInvalidArgument, op,
          "outlier channels per block must be in [0, min(32, dim)]; got ", K.outliers);
    check(K.outliers == 0 || (K.outlier_codes != nullptr && K.outlier_index != nullptr), ErrorCode::kInvalidArgument,
          op, "outlier channels need outlier_codes and outlier_index");
    check(K.residual != nullptr && (reinterpret_cast<uintptr_t>(K.residual) & 15u) == 0, ErrorCode::kInvalidArgument,
          op, "per-channel keys need a 16-byte aligned residual window");
    check(K.blocks >= K.length / K.group_size, ErrorCode::kShapeMismatch, op, "per-channel keys need ",
          K.length / K.group_size, " blocks of scales for length ", K.length, "; got ", K.blocks);
  }
  check(a.kv_splits >= 0, ErrorCode::kInvalidArgument, op, "kv_splits must be >= 0; got ", a.kv_splits);
  check(a.B * K.H <= 65535, ErrorCode::kOutOfRange, op, "B·Hkv must be <= 65535; got ", a.B * K.H);
}

bool is_k4v3g64(const kernels::AttentionArgs& a, int64_t D) {
  const auto& K = a.keys;
  const auto& V = a.values;
  return K.bits == 4 && V.bits == 3 && K.group_size == 64 && V.group_size == 64 && K.dim == D && V.dim == D &&
         aligned16(K.data) && aligned16(V.data);
}
bool is_plain(const kernels::AttentionArgs& a, DType t, int64_t D) {
  const auto& K = a.keys;
  const auto& V = a.values;
  return K.bits == 0 && V.bits == 0 && K.dtype == t && V.dtype == t && K.dim == D && V.dim == D &&
         aligned16(K.data) && aligned16(V.data);
}

size_t partial_bytes(const kernels::AttentionArgs& a, int splits) {
  const size_t rows = static_cast<size_t>(a.B * a.Hq * a.L) * static_cast<size_t>(splits);
  const size_t o_bytes = (rows * static_cast<size_t>(a.values.dim) * sizeof(float) + 255) / 256 * 256;
  return o_bytes + rows * 2 * sizeof(float);
}

Plan make_plan(const kernels::AttentionArgs& a) {
  Plan pl;
  if (detail::tc_eligible(a)) {
    pl.tc = true;
    pl.tcp = detail::tc_plan(a);
    pl.splits = pl.tcp.splits;
    pl.chunk = pl.tcp.chunk;
    pl.workspace = pl.splits > 1 ? partial_bytes(a, pl.splits) : 0;
    return pl;
  }
  if (detail::plain_tc_eligible(a)) {
    pl.plain_tc = true;
    pl.ptp = detail::plain_tc_plan(a);
    pl.splits = pl.ptp.splits;
    pl.chunk = pl.ptp.chunk;
    pl.workspace = pl.splits > 1 ? partial_bytes(a, pl.splits) : 0;
    return pl;
  }
  if (detail::prefill_tc_eligible(a)) {
    pl.prefill_tc = true;
    pl.pfp = detail::prefill_tc_plan(a);
    pl.qblocks = pl.pfp.qblocks;
    pl.splits = pl.pfp.splits;
    pl.chunk = pl.pfp.chunk;
    pl.workspace = pl.splits > 1 ? partial_bytes(a, pl.splits) : 0;
    return pl;
  }
  const int64_t Dk = a.keys.dim, Dv = a.values.dim, rep = a.Hq / a.keys.H, R = rep * a.L;
  const bool kchan = a.keys.layout == 1;
  const bool chan_g64_d128 = kchan && a.keys.group_size == 64 && a.values.group_size == 64 && Dk == 128 && Dv == 128;
  if (chan_g64_d128 && a.keys.bits == 4 && a.values.bits == 4)
    pl.kernel = kK4V4G64D128Chan;
  else if (chan_g64_d128 && a.keys.bits == 5 && a.values.bits == 5)
    pl.kernel = kK5V5G64D128Chan;
  else if (kchan)
    pl.kernel = kRuntime;
  else if (is_k4v3g64(a, 128))
    pl.kernel = kK4V3G64D128;
  else if (is_k4v3g64(a, 256))
    pl.kernel = kK4V3G64D256;
  else if (is_plain(a, DType::kBF16, 128))
    pl.kernel = kBf16D128;
  else if (is_plain(a, DType::kBF16, 256))
    pl.kernel = kBf16D256;
  else if (is_plain(a, DType::kF16, 128))
    pl.kernel = kF16D128;
  else
    pl.kernel = kRuntime;
  pl.QR = (pl.kernel != kRuntime && R <= 4) || (kchan && Dk + Dv > 256) ? 4 : 8;  // kchan: 48 KB of smem
  pl.tile = kchan ? std::min(128, 2 * a.keys.group_size) : 128;  // a tile covers at most two key blocks
  pl.qblocks = static_cast<int>((R + pl.QR - 1) / pl.QR);
  const int64_t kL = a.keys.length;
  int64_t splits;
  if (a.kv_splits > 0) {
    splits = std::min<int64_t>(std::min(a.kv_splits, kMaxSplits), kL);
  } else {
    // Per-channel keys: splits down to one tile (2 blocks) each, so short caches spread over more CTAs: the kernel is
    // latency-bound (ncu, 2026-12-02, K4V4 B1 D128 32k: 24% achieved occupancy, L1TEX waits half the stall cycles).
    // Llama-3-8B shapes, w8a8 k5v5: 165 → 193 tokens/s at 1k, 116 at 32k either way; twice the target CTAs on top
    // gave 109 at 32k, so the target stays.
    const int64_t target = kTargetCtas;
    const int64_t min_chunk = kchan ? pl.tile : kMinChunk;
    const int64_t base = a.B * a.keys.H * pl.qblocks;
    splits = std::max<int64_t>(1, (target + base - 1) / base);
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, (kL + min_chunk - 1) / min_chunk));
  }
  pl.chunk = (kL + splits - 1) / splits;
  pl.splits = static_cast<int>((kL + pl.chunk - 1) / pl.chunk);
  size_t tail = static_cast<size_t>(kWarps) * pl.QR * Dv;  // floats
  if (pl.kernel == kK4V3G64D128 || pl.kernel == kK4V3G64D256) {
    const size_t staged = static_cast<size_t>(pl.tile) * (Dv * 3 / 32 + 2 * Dv / 64);
    tail = std::max(tail, staged);
  }
  if (kchan) tail += 2 * (static_cast<size_t>(Dk) * pl.QR + pl.QR);  // two blocks' folded queries and β
  pl.smem = (static_cast<size_t>(Dk) * pl.QR + pl.QR * kMaxGroups + static_cast<size_t>(pl.QR) * pl.tile +
             4 * pl.QR + tail) * sizeof(float);
  if (pl.splits > 1) pl.workspace = partial_bytes(a, pl.splits);
  return pl;
}

KvSide side_of(const kernels::KVTensorView& v) {
  KvSide s{};
  s.data = v.data;
  s.scales = v.scales;
  s.biases = v.biases;
  s.dtype = v.dtype;
  s.sdt = v.scale_dtype;
  s.bits = v.bits;
  s.gs = v.bits ? v.group_size : 0;
  s.dim = static_cast<int>(v.dim);
  s.wpr = v.bits ? static_cast<int>(v.dim * v.bits / 32) : 0;
  s.groups = v.bits ? static_cast<int>(v.dim / v.group_size) : 0;
  s.capacity = v.capacity;
  s.layout = v.layout;
  s.blocks = v.blocks;
  s.residual = static_cast<const uint16_t*>(v.residual);
  return s;
}

template <int KK, int VK, int GS, int DK, int DV, bool STAGE_V>
void launch_qr(const Plan& pl, const Params& p, dim3 grid, cudaStream_t stream) {
  const dim3 block(kThreads);
  auto* const kernel = pl.QR == 4 ? attention_kernel<KK, VK, GS, DK, DV, 4, STAGE_V>
                                  : attention_kernel<KK, VK, GS, DK, DV, 8, STAGE_V>;
  const cudaError_t err = pdl::launch(kernel, grid, block, pl.smem, stream, p);
  CIDER_CUDA_CHECK("cuda.attention", err);
}

}  // namespace

size_t attention_workspace_bytes(const kernels::AttentionArgs& args) {
  validate("cuda.attention", args);
  return make_plan(args).workspace;
}

void attention(const kernels::AttentionArgs& a, const int32_t* d_length, const Exec& exec) {
  const char* op = "cuda.attention";
  validate(op, a);
  check(a.keys.length <= 0x7fffffffLL, ErrorCode::kOutOfRange, op,
        "keys.length must be below 2^31 (the kernels' key positions and split shares are 32-bit); got ", a.keys.length);
  const Plan pl = make_plan(a);
  // Outlier key channels are read by the tensor-core kernels only (attention_tc.h, attention_prefill_tc.h).
  check(a.keys.outliers == 0 || pl.tc || pl.prefill_tc, ErrorCode::kUnsupported, op,
        "outlier key channels run on the tensor-core kernels only: K4V4, K5V4 or K5V5 in blocks of 64 with f16 "
        "scales, Dk = Dv = 128 or 256, at most Dk/16 = ", a.keys.dim / 16, " channels, masks none or causal; got k",
        a.keys.bits, "v", a.values.bits, ", group ", a.keys.group_size, ", ", dtype_name(a.keys.scale_dtype),
        " scales, Dk ", a.keys.dim, ", ", a.keys.outliers, " channels ($CIDER_ATTN_TC_KCHAN=0 turns those kernels off)");
  check(exec.workspace_bytes >= pl.workspace && (pl.workspace == 0 || exec.workspace != nullptr),
        ErrorCode::kInvalidArgument, op, "workspace must hold attention_workspace_bytes = ", pl.workspace,
        " bytes; got ", exec.workspace_bytes);
  check(pl.tc || pl.plain_tc || pl.prefill_tc || pl.smem <= 48 * 1024, ErrorCode::kInternal, op, "shared memory plan exceeds 48 KB: ", pl.smem);
  check(static_cast<int64_t>(pl.qblocks) * pl.splits <= 0x7fffffffLL, ErrorCode::kOutOfRange, op,
        "too many query blocks × splits: ", static_cast<int64_t>(pl.qblocks) * pl.splits);

  Params p{};
  p.q = a.q;
  p.out = a.out;
  const int64_t out_rows = a.B * a.Hq * a.L;
  if (pl.splits > 1) {
    p.part_o = static_cast<float*>(exec.workspace);
    const size_t o_bytes = (static_cast<size_t>(out_rows) * pl.splits * a.values.dim * sizeof(float) + 255) / 256 * 256;
    p.part_ml = reinterpret_cast<float*>(static_cast<uint8_t*>(exec.workspace) + o_bytes);
  }
  p.Hq = static_cast<int>(a.Hq);
  p.Hkv = static_cast<int>(a.keys.H);
  p.L = static_cast<int>(a.L);
  p.rep = static_cast<int>(a.Hq / a.keys.H);
  p.R = p.rep * p.L;
  p.qblocks = pl.qblocks;
  p.splits = pl.splits;
  p.tile = pl.tile;
  p.chunk = pl.chunk;
  p.kL_bound = a.keys.length;
  p.d_length = d_length;
  p.k = side_of(a.keys);
  p.v = side_of(a.values);
  p.scale = a.scale;
  p.softcap = a.softcap;
  p.inv_softcap = a.softcap > 0.0f ? 1.0f / a.softcap : 0.0f;
  p.causal = a.mask_kind == kernels::MaskKind::kCausal ? 1 : 0;
  p.window = a.window;

  cudaStream_t stream = static_cast<cudaStream_t>(exec.stream);
  if (pl.tc) {
    const bool merge = detail::tc_launch(a, pl.tcp, d_length, p.part_o, p.part_ml, exec.stream);
    check_last_launch(op);
    if (merge) {
      launch_merge(p.part_o, p.part_ml, a.out, out_rows, pl.splits, static_cast<int>(a.values.dim), stream);
      check_last_launch(op);
    }
    return;
  }
  if (pl.plain_tc || pl.prefill_tc) {
    if (pl.plain_tc)
      detail::plain_tc_launch(a, pl.ptp, d_length, p.part_o, p.part_ml, exec.stream);
    else
      detail::prefill_tc_launch(a, pl.pfp, d_length, p.part_o, p.part_ml, exec.stream);
    check_last_launch(op);
    if (pl.splits > 1) {
      launch_merge(p.part_o, p.part_ml, a.out, out_rows, pl.splits, static_cast<int>(a.values.dim), stream);
      check_last_launch(op);
    }
    return;
  }
  const dim3 grid(static_cast<unsigned>(pl.qblocks * pl.splits), 1, static_cast<unsigned>(a.B * a.keys.H));
  switch (pl.kernel) {
    case kK4V3G64D128: launch_qr<4, 3, 64, 128, 128, true>(pl, p, grid, stream); break;
    case kK4V3G64D256: launch_qr<4, 3, 64, 256, 256, true>(pl, p, grid, stream); break;
    case kBf16D128: launch_qr<-2, -2, 0, 128, 128, false>(pl, p, grid, stream); break;
    case kBf16D256: launch_qr<-2, -2, 0, 256, 256, false>(pl, p, grid, stream); break;
    case kF16D128: launch_qr<-1, -1, 0, 128, 128, false>(pl, p, grid, stream); break;
    case kK4V4G64D128Chan: launch_qr<4, 4, 64, 128, 128, false>(pl, p, grid, stream); break;
    case kK5V5G64D128Chan: launch_qr<5, 5, 64, 128, 128, false>(pl, p, grid, stream); break;
    default: launch_qr<0, 0, 0, 0, 0, false>(pl, p, grid, stream); break;
  }
  check_last_launch(op);
  if (pl.splits > 1) {
    launch_merge(p.part_o, p.part_ml, a.out, out_rows, pl.splits, static_cast<int>(a.values.dim), stream);
    check_last_launch(op);
  }
}

}  // namespace cider::cuda
