// cider/kernels/cuda/attention_decode_plain_tc.cu — decode attention over a PLAIN bf16 or f16 KV cache (no
// quantization) on the tensor cores; $CIDER_ATTN_TC_PLAIN=0 runs the general CUDA-core kernel instead.
// Contract: kernels/cuda/cuda_api.h (cuda::attention); chosen by attention.cu (attention_decode_plain_tc.h); design
// and measurements: docs/cuda/attention.md ("Plain-cache tensor-core decode").
//
// Why a kernel of its own: a plain cache is pure streaming — 4·D bytes per key and KV head (K + V), 128 MiB at B1
// Hq32 Hkv8 D128 L32768 — so the target is HBM bandwidth (PyTorch's bf16 SDPA: ≈ 38 µs there, ≈ 3.5 TB/s). The
// general kernel forms the scores on the CUDA cores one key per thread (72–86 µs). Here the arithmetic is on the
// tensor cores and every byte crosses HBM → shared memory once, by cp.async, and shared memory → registers once, by
// ldmatrix.
//
// Work item: one CTA (4 warps) = (b, KV head g) × one split [c0, c1) of the keys, all R = rep·L ≤ 8 query rows of the
// head (row r: position i = r / rep, head g·rep + r % rep), as attention_tc.cu. Each warp walks its own tiles of
// TK = 16 keys (tiles w, w + 4, … of the split) through a 3-stage cp.async pipeline in its own shared memory with its
// own online softmax: no CTA barrier until the epilogue. A stage is the tile's 16 key rows and 16 value rows as
// stored (D·2 bytes each), 16-byte chunks XOR-swizzled by row & 7 so that the 8 rows of an ldmatrix hit 8 different
// bank groups. D128: 8 KB per stage, 96 KB per CTA, 2 CTAs per SM; D256: 16 KB per stage, 192 KB, 1 CTA per SM —
// either way 128 KB of copies in flight per SM (2 stages ahead × 8 KB × 8 warps, or × 16 KB × 4 warps), which is what
// Little's law asks of ≈ 4 TB/s at ≈ 1 µs of loaded HBM latency (≈ 30 KB per SM) with room to spare.
// Splits: one wave of resident CTAs (occupancy × SMs / (B·Hkv), at least one tile per warp; $CIDER_ATTN_TC_WAVES
// multiplies it), the visible interval cut by split_range (attention_tc.h) in quanta of 4·16 keys — the device length
// (decode graphs) and windows keep every CTA busy. Partials go to attention.cu's merge4_kernel.
//
// Scores: S^T (16 keys × 8 rows) = K_tile (16 keys × D) · Q^T, mma.m16n8k16 with A = the key rows straight from the
// stage (ldmatrix.x4, row-major: the cache's own layout is the A layout) and B = the query rows, N = 8 = the ≤ 8 rows of
// the head (rows ≥ R are zeros and masked). The queries are rounded ONCE to the cache's 16-bit type (bf16 for bf16
// caches — PyTorch's bf16 SDPA does the same — f16 for f16 caches, there after a per-row power-of-two scale 2^E with
// max|q|·2^E ∈ [2^13, 2^14), so neither overflow nor needless subnormals; 2^-E goes into the score factor) and held as
// B fragments in registers for the whole split: lane (gid, tig) loads row gid's dims 16ks + 2tig.. and + 8 directly.
// float32 accumulation. C: lane (gid, tig) has keys gid, gid + 8 × rows 2tig, 2tig + 1 (attention_tc.cu's layout).
// The score factor (scale·log2e·2^-E), the softcap c2·tanhf(s2/c2) (log2 units, attention_tc.h) and the mask (per-row
// [vis_lo, vis_hi) exactly as attention_tc.cu) follow.
// Softmax: base 2 (ex2.approx), float32 m / l per lane for its rows 2tig, 2tig + 1, the maximum over the 8 gid lanes;
// the accumulators are rescaled only when some row's maximum moved.
// Values: O^T (16 dims × 8 rows) += V_tile^T (16 dims × 16 keys) · P (16 keys × 8 rows): A = the value rows by
// ldmatrix.x4.trans (the stored [key][dim] tile read transposed), B = p rounded to the cache's type (bf16 / f16,
// p ≤ 1: relative error ≤ 2^-8 / 2^-11), moved from the score C layout to the B layout by movmatrix.trans (as
// attention_tc.cu's W). l sums the ROUNDED p, so the output is an exact convex combination of the value rows with the
// rounded weights (the error bound of the tests: tests/cuda/test_cuda_attention.cpp, PlainTensorCoreDecode*).
// Epilogue: each warp's l over its gid lanes, its accumulators to its own stage area as [8 rows][D + 4] float (padded:
// the stores are conflict-free), (m, l) per row; one barrier; then float4 columns of the log-sum-exp combination of
// the 4 warps go to out (one split) or to the partials (m in natural-log units, l), as attention_tc.cu.
// Early tile copies (before griddepcontrol.wait) under the same contract and switch as attention_tc.cu
// ($CIDER_ATTN_TC_EARLY): *d_length and rows below length − L are not written by the previous kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/attention_decode_plain_tc.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_tc_device.cuh"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda::detail {

namespace {

constexpr int kPtThreads = 128;
constexpr int kPtWarps = 4;
constexpr int kPtRows = 8;    // query rows per CTA (the mma N)
constexpr int kPtTK = 16;     // keys per warp tile (one mma M)
constexpr int kPtStages = 3;  // cp.async stages per warp

template <int D>
struct PtCfg {
  static constexpr int kRowB = D * 2;               // bytes per key (value) row
  static constexpr int kRowCh = kRowB / 16;         // 16-byte chunks per row
  static constexpr int kTileB = kPtTK * kRowB;      // the key (value) rows of a tile
  static constexpr int kStageB = 2 * kTileB;        // keys, then values
  static constexpr int kWarpB = kPtStages * kStageB;
  static constexpr int kTileArea = kPtWarps * kWarpB;
  static constexpr int kSmem = kTileArea + kPtWarps * kPtRows * 8;  // + (m, l) per warp and row
  static constexpr int kKSteps = D / 16;            // 16-dim k-steps of the scores = 16-dim m-tiles of the values
  static constexpr int kCopies = kTileB / 16 / 32;  // 16-byte copies per lane per tile and side
  static constexpr int kRedStride = D + 4;          // floats per row of a warp's epilogue area
  static_assert(kRowCh >= 8 && kRowCh % 8 == 0, "the swizzle permutes 8 chunks inside a row");
  static_assert(kPtRows * kRedStride * 4 <= kWarpB, "a warp's accumulators fit its own tile area");
  static_assert(kTileB % (16 * 32) == 0, "whole copy slots per lane");
  static_assert(kSmem <= 227 * 1024, "one CTA fits an SM");
};

struct PlainTcParams : TcCallParams {
  // 1: *d_length and the first tiles of rows below length − L are read before the PDL wait ($CIDER_ATTN_TC_EARLY).
  int early_copies;
};

// Two floats as a packed pair of the cache's 16-bit type (x0 in the low half), rounded to nearest even.
template <bool kF16>
__device__ __forceinline__ uint32_t pack2(float x0, float x1) {
  if constexpr (kF16) {
    return h2_bits(__floats2half2_rn(x0, x1));
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
  }
}
// The two values of a packed pair as floats (exact).
template <bool kF16>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  if constexpr (kF16) {
    return __half22float2(bits_h2(u));
  } else {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
  }
}
template <bool kF16>
__device__ __forceinline__ void mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kF16)
    mma_f16(c, a, b0, b1);
  else
    mma_bf16(c, a, b0, b1);
}

// D128: 2 CTAs per SM (96 KB of stages each); D256: 1 (192 KB).
template <int D, bool kF16>
__global__ void __launch_bounds__(kPtThreads, D == 128 ? 2 : 1) attention_plain_tc_kernel(PlainTcParams p) {
  using C = PtCfg<D>;
  constexpr int KS = C::kKSteps, TK = kPtTK, kSt = kPtStages;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  extern __shared__ float4 pt_smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(pt_smem4);
  float2* wml = reinterpret_cast<float2*>(smem + C::kTileArea);  // [4 warps][8 rows] (m, l)

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int bg = blockIdx.y, b = bg / p.Hkv, g = bg % p.Hkv;
  const int split = blockIdx.x;
  // PDL as attention_tc.cu: without early copies nothing is read before the wait.
  if (p.early_copies == 0) {
    pdl::wait();
    pdl::launch_dependents();
  }
  int64_t kL = p.kL_bound;
  if (p.d_length) kL = max(static_cast<int64_t>(0), min(static_cast<int64_t>(*p.d_length), p.kL_bound));
  const int R = p.R;
  // Visible key interval of the block (union over its rows) and of this split.
  const KeyInterval vis = visible_keys(kL, p.L, p.rep, 0, R - 1, p.causal != 0, p.window);
  const SplitRange sr = split_range(vis.lo, vis.hi, split, p.splits, kPtWarps * TK);
  const int64_t c0 = sr.c0, c1 = sr.c1;
  const int64_t n_keys = max(static_cast<int64_t>(0), c1 - c0);
  const int n_tiles = static_cast<int>((n_keys + TK - 1) / TK);
  const int my_tiles = n_tiles > warp ? (n_tiles - warp + kPtWarps - 1) / kPtWarps : 0;
  auto tile_of = [&](int i) -> int { return warp + i * kPtWarps; };

  const int64_t krow0 = static_cast<int64_t>(bg) * p.cap_k;
  const int64_t vrow0 = static_cast<int64_t>(bg) * p.cap_v;
  uint8_t* wbase = smem + warp * C::kWarpB;
  const uint32_t wbase_s = smem_addr(wbase);

  // Copies of this warp's i-th tile into stage i % kSt (rows past c1 zero-filled, nothing read), then a commit.
  // Lane chunk c = lane + 32u of the tile: row c / kRowCh, chunk c % kRowCh, stored at chunk (c % kRowCh) ^ (row & 7).
  auto issue = [&](int i) {
    if (i < my_tiles) {
      const int64_t t0 = c0 + static_cast<int64_t>(tile_of(i)) * TK;
      const int nvalid = static_cast<int>(min(static_cast<int64_t>(TK), c1 - t0));
      uint8_t* st = wbase + (i % kSt) * C::kStageB;
      const uint8_t* kt = p.kc + (krow0 + t0) * C::kRowB;
      const uint8_t* vt = p.vc + (vrow0 + t0) * C::kRowB;
#pragma unroll
      for (int u = 0; u < C::kCopies; ++u) {
        const int c = lane + 32 * u, r = c / C::kRowCh, ch = c % C::kRowCh;
        const bool ok = r < nvalid;
        const int off = r * C::kRowB + ((ch ^ (r & 7)) << 4);
        cp_async16(st + off, ok ? kt + c * 16 : kt, ok);
        cp_async16(st + C::kTileB + off, ok ? vt + c * 16 : vt, ok);
      }
    }
    cp_commit();
  };

  // The first tiles' copies before the PDL wait when every row they read lies below kL − L.
  const int64_t early_end = c0 + static_cast<int64_t>(tile_of(kSt - 2) + 1) * TK;
  const bool early = p.early_copies != 0 && early_end <= kL - p.L;
  if (early) {
#pragma unroll
    for (int i = 0; i < kSt - 1; ++i) issue(i);
  }
  if (p.early_copies != 0) {
    pdl::wait();
    pdl::launch_dependents();
  }
  if (!early) {
#pragma unroll
    for (int i = 0; i < kSt - 1; ++i) issue(i);
  }

  // ---- queries: lane (gid, tig) holds row gid's B fragments (dims 16ks + 2tig, +1 and 16ks + 8 + 2tig, +1) as packed
  // 16-bit pairs for the whole split; zeros for rows ≥ R. f16: the row scaled by 2^E first (its max over the 4 tig
  // lanes that hold the row). ----
  uint32_t qb[KS][2];
  int qe = 0;
  {
    float2 x[KS][2];
    if (gid < R) {
      const int i = gid / p.rep, hq = g * p.rep + gid % p.rep;
      const float* src = p.q + ((static_cast<int64_t>(b) * p.Hq + hq) * p.L + i) * D + 2 * tig;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        x[ks][0] = *reinterpret_cast<const float2*>(src + 16 * ks);
        x[ks][1] = *reinterpret_cast<const float2*>(src + 16 * ks + 8);
      }
    } else {
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) x[ks][0] = x[ks][1] = make_float2(0.0f, 0.0f);
    }
    if constexpr (kF16) {
      float mx = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int h = 0; h < 2; ++h) mx = fmaxf(mx, fmaxf(fabsf(x[ks][h].x), fabsf(x[ks][h].y)));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      qe = q_exponent(mx) - 7;  // max|q|·2^E < 2^14 (q_exponent: < 2^21), ≥ 2^13 for mx > 0
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int h = 0; h < 2; ++h) x[ks][h] = make_float2(mul_pow2(x[ks][h].x, qe), mul_pow2(x[ks][h].y, qe));
    }
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      qb[ks][0] = pack2<kF16>(x[ks][0].x, x[ks][0].y);
      qb[ks][1] = pack2<kF16>(x[ks][1].x, x[ks][1].y);
    }
  }

  // Per-lane constants of its score rows 2tig + h: the factor scale·log2e·2^-E (E from the row's lanes 4r..4r + 3)
  // and the visible keys [vis_lo, vis_hi) relative to c0 (attention_tc.cu's rule).
  float zmul[2];
  int vis_lo[2], vis_hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = 2 * tig + h;
    const int er = __shfl_sync(0xffffffffu, qe, 4 * r);
    zmul[h] = kF16 ? mul_pow2(p.scale_log2, -er) : p.scale_log2;
    int64_t lo_h = c0, hi_h = c1;
    if (r >= R) {
      hi_h = c0;
    } else if (p.causal) {
      const int64_t pos = kL - p.L + r / p.rep;
      hi_h = min(c1, pos + 1);
      if (p.window > 0) lo_h = max(c0, pos - p.window + 1);
    }
    vis_lo[h] = static_cast<int>(max(static_cast<int64_t>(0), lo_h - c0));
    vis_hi[h] = static_cast<int>(max(static_cast<int64_t>(0), hi_h - c0));
  }

  // ldmatrix lane addresses inside a stage. Keys (A, not transposed): matrix m = lane >> 3 is (keys + 8·(m & 1),
  // dims + 8·(m >> 1)) = a0a1, a2a3, a4a5, a6a7; row lane & 7. Values (A = V^T, transposed): matrix m is (keys
  // + 8·(m >> 1), dims + 8·(m & 1)), so that lane (gid, tig) gets V[key 2tig(+1) (+8)][dim gid (+8)].
  const int k_row = (lane & 7) + ((lane >> 3) & 1) * 8, k_half = lane >> 4;
  const int v_row = (lane & 7) + (lane >> 4) * 8, v_half = (lane >> 3) & 1;
  const uint32_t k_base = static_cast<uint32_t>(k_row * C::kRowB);
  const uint32_t v_base = static_cast<uint32_t>(C::kTileB + v_row * C::kRowB);

  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.0f, 0.0f};
  float acc[KS][4];  // dims 16j + gid (e < 2) / + 8 (e ≥ 2) × rows 2tig + (e & 1)
#pragma unroll
  for (int j = 0; j < KS; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  for (int i = 0; i < my_tiles; ++i) {
    issue(i + kSt - 1);
    cp_wait<kSt - 1>();
    __syncwarp();
    const uint32_t st = wbase_s + static_cast<uint32_t>((i % kSt) * C::kStageB);

    // ---- scores: sc[e] = (key gid, row 2tig), (gid, 2tig + 1), (gid + 8, 2tig), (gid + 8, 2tig + 1) ----
    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, st + k_base + static_cast<uint32_t>(((2 * ks + k_half) ^ (k_row & 7)) << 4));
      mma16<kF16>(sc, a, qb[ks][0], qb[ks][1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[e] *= zmul[e & 1];
    if (p.softcap_log2 > 0.0f) {  // before the mask; slots of invisible keys are overwritten below
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[e] = capped_score(sc[e], p.softcap_log2, p.inv_softcap_log2);
    }
    const int ja = tile_of(i) * TK + gid, jb = ja + 8;  // key index − c0
    sc[0] = (ja >= vis_lo[0] && ja < vis_hi[0]) ? sc[0] : kNegInf;
    sc[1] = (ja >= vis_lo[1] && ja < vis_hi[1]) ? sc[1] : kNegInf;
    sc[2] = (jb >= vis_lo[0] && jb < vis_hi[0]) ? sc[2] : kNegInf;
    sc[3] = (jb >= vis_lo[1] && jb < vis_hi[1]) ? sc[3] : kNegInf;

    // ---- online softmax (rows 2tig, 2tig + 1; maximum over the 8 gid lanes) ----
    float mnew[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tmax = fmaxf(sc[h], sc[2 + h]);
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 4));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 8));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
      const float mn = fmaxf(m_run[h], tmax);
      const float mu = mn == kNegInf ? 0.0f : mn;  // nothing visible yet: p = 0, α irrelevant (acc = 0)
      alpha[h] = ex2(m_run[h] - mu);
      m_run[h] = mn;
      mnew[h] = mu;
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < KS; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] *= alpha[e & 1];
      l_run[0] *= alpha[0];
      l_run[1] *= alpha[1];
    }
    // p rounded to the cache's type; l sums the rounded values (the weights the value mma uses).
    const uint32_t pa = pack2<kF16>(ex2(sc[0] - mnew[0]), ex2(sc[1] - mnew[1]));  // key gid: rows 2tig, 2tig + 1
    const uint32_t pb = pack2<kF16>(ex2(sc[2] - mnew[0]), ex2(sc[3] - mnew[1]));  // key gid + 8
    {
      const float2 fa = unpack2<kF16>(pa), fb = unpack2<kF16>(pb);
      l_run[0] += fa.x + fb.x;
      l_run[1] += fa.y + fb.y;
    }
    // B (16 keys × 8 rows): b0 = P[keys 2tig, 2tig + 1][row gid], b1 = keys + 8 — the 8×8 transposes of pa, pb.
    const uint32_t b0 = movmatrix_t(pa), b1 = movmatrix_t(pb);

    // ---- values: acc[j] (dims 16j..16j + 15 × rows) += V^T · P ----
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, st + v_base + static_cast<uint32_t>(((2 * j + v_half) ^ (v_row & 7)) << 4));
      mma16<kF16>(acc[j], a, b0, b1);
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  cp_wait<0>();
  __syncwarp();  // every lane's copies have landed and every lane is done with the stages: the area is free

  // ---- combine the warps (log-sum-exp) and write ----
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], o);
  {
    float* red = reinterpret_cast<float*>(wbase);  // [8 rows][D + 4]
#pragma unroll
    for (int j = 0; j < KS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(2 * tig + (e & 1)) * C::kRedStride + 16 * j + gid + 8 * (e >> 1)] = acc[j][e];
    if (gid == 0) {
      wml[warp * kPtRows + 2 * tig] = make_float2(m_run[0], l_run[0]);
      wml[warp * kPtRows + 2 * tig + 1] = make_float2(m_run[1], l_run[1]);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < R * (D / 4); idx += kPtThreads) {
    const int r = idx / (D / 4), c = idx % (D / 4);
    float2 ml[kPtWarps];
    float M = kNegInf;
#pragma unroll
    for (int w = 0; w < kPtWarps; ++w) {
      ml[w] = wml[w * kPtRows + r];
      if (ml[w].y > 0.0f) M = fmaxf(M, ml[w].x);
    }
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kPtWarps; ++w) {
      const float fw = ml[w].y > 0.0f ? ex2(ml[w].x - M) : 0.0f;  // a warp that saw no key counts 0
      l += fw * ml[w].y;
      const float4 v = reinterpret_cast<const float4*>(
          reinterpret_cast<const float*>(smem + w * C::kWarpB) + r * C::kRedStride)[c];
      o.x += fw * v.x;
      o.y += fw * v.y;
      o.z += fw * v.z;
      o.w += fw * v.w;
    }
    const int64_t orow = (static_cast<int64_t>(b) * p.Hq + g * p.rep + r % p.rep) * p.L + r / p.rep;
    if (p.splits == 1) {
      const float4 res = l > 0.0f ? make_float4(o.x / l, o.y / l, o.z / l, o.w / l)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      reinterpret_cast<float4*>(p.out + orow * D)[c] = res;
    } else {
      reinterpret_cast<float4*>(p.part_o + (orow * p.splits + split) * D)[c] = o;
      if (c == 0)
        reinterpret_cast<float2*>(p.part_ml)[orow * p.splits + split] =
            make_float2(M == kNegInf ? M : M * 0.69314718055994531f, l);  // log2 → ln
    }
  }
}

bool aligned(const void* ptr, uintptr_t n) { return (reinterpret_cast<uintptr_t>(ptr) % n) == 0; }

// Lets the kernel have its shared memory on the current GPU; returns the resident CTAs per SM.
template <int D, bool kF16>
int plain_ctas_per_sm() {
  const void* fn = reinterpret_cast<const void*>(&attention_plain_tc_kernel<D, kF16>);
  allow_dynamic_smem(fn, PtCfg<D>::kSmem, "cuda.attention");
  static int n = [fn] {
    int blocks = 0;
    CIDER_CUDA_CHECK("cuda.attention",
                     cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kPtThreads, PtCfg<D>::kSmem));
    return std::max(blocks, 1);
  }();
  return n;
}

int plain_ctas_per_sm(int64_t D, bool f16) {
  if (D == 128) return f16 ? plain_ctas_per_sm<128, true>() : plain_ctas_per_sm<128, false>();
  return f16 ? plain_ctas_per_sm<256, true>() : plain_ctas_per_sm<256, false>();
}

}  // namespace

bool plain_tc_eligible(const kernels::AttentionArgs& a) {
  // $CIDER_ATTN_TC=0 turns every tensor-core decode path off (read once, as attention_tc.cu); $CIDER_ATTN_TC_PLAIN=0
  // this one (read at every call: the tests and the bench run the general kernel beside it).
  static const bool tc_on = env_flag("CIDER_ATTN_TC", true, "cuda.attention");
  if (!tc_on || !env_flag("CIDER_ATTN_TC_PLAIN", true, "cuda.attention")) return false;
  const auto& K = a.keys;
  const auto& V = a.values;
  const bool dtype = (K.dtype == DType::kBF16 || K.dtype == DType::kF16) && V.dtype == K.dtype;
  return K.bits == 0 && V.bits == 0 && K.layout == 0 && V.layout == 0 && dtype && K.dim == V.dim &&
         (K.dim == 128 || K.dim == 256) && a.Hq / K.H * a.L <= kPtRows && aligned(a.q, 16) && aligned(a.out, 16) &&
         aligned(K.data, 16) && aligned(V.data, 16);
}

PlainTcPlan plain_tc_plan(const kernels::AttentionArgs& a) {
  PlainTcPlan pl;
  const bool f16 = a.keys.dtype == DType::kF16;
  const int per_sm = plain_ctas_per_sm(a.keys.dim, f16);
  pl.smem = static_cast<size_t>(a.keys.dim == 128 ? PtCfg<128>::kSmem : PtCfg<256>::kSmem);
  // The split rule of attention_tc.cu's tc_plan: one wave of resident CTAs ($CIDER_ATTN_TC_WAVES more), at least one
  // tile per warp per split; the kernel re-cuts the visible interval into that many pieces (split_range).
  static const int waves = env_int("CIDER_ATTN_TC_WAVES", 1, 1, 16, "cuda.attention");
  const int64_t slots = static_cast<int64_t>(per_sm) * sm_count() * waves;
  const int64_t bh = a.B * a.keys.H, kL = a.keys.length;
  const int64_t quantum = static_cast<int64_t>(kPtWarps) * kPtTK;
  int64_t splits = a.kv_splits > 0 ? std::min(a.kv_splits, 4096) : std::max<int64_t>(1, slots / bh);
  splits = std::min(splits, std::max<int64_t>(1, (kL + quantum - 1) / quantum));
  int64_t chunk = (kL + splits - 1) / splits;
  chunk = (chunk + quantum - 1) / quantum * quantum;
  pl.chunk = chunk;
  pl.splits = static_cast<int>((kL + chunk - 1) / chunk);
  return pl;
}

void plain_tc_launch(const kernels::AttentionArgs& a, const PlainTcPlan& pl, const int32_t* d_length,
                     float* part_o, float* part_ml, void* stream) {
  PlainTcParams p{};
  fill_tc_params(p, a, d_length, part_o, part_ml, pl.splits, pl.chunk);
  p.early_copies = env_flag("CIDER_ATTN_TC_EARLY", true, "cuda.attention") ? 1 : 0;
  const dim3 grid(static_cast<unsigned>(pl.splits), static_cast<unsigned>(a.B * a.keys.H));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool f16 = a.keys.dtype == DType::kF16;
  (void)plain_ctas_per_sm(a.keys.dim, f16);  // sets the shared-memory attribute before the first launch
  cudaError_t err;
  if (a.keys.dim == 128)
    err = f16 ? pdl::launch(attention_plain_tc_kernel<128, true>, grid, dim3(kPtThreads), PtCfg<128>::kSmem, s, p)
              : pdl::launch(attention_plain_tc_kernel<128, false>, grid, dim3(kPtThreads), PtCfg<128>::kSmem, s, p);
  else
    err = f16 ? pdl::launch(attention_plain_tc_kernel<256, true>, grid, dim3(kPtThreads), PtCfg<256>::kSmem, s, p)
              : pdl::launch(attention_plain_tc_kernel<256, false>, grid, dim3(kPtThreads), PtCfg<256>::kSmem, s, p);
  CIDER_CUDA_CHECK("cuda.attention", err);
}

}  // namespace cider::cuda::detail
