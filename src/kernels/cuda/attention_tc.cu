// cider/kernels/cuda/attention_tc.cu — decode attention over a K4/V3 or K8/V4 g64 cache (f16 scales, D 128/256) on
// the tensor cores (one kernel template on the key/value bit widths; $CIDER_ATTN_TC_K8V4=0 excludes K8V4), and over
// per-channel-key caches K4V4 / K5V4 / K5V5 (the kChan variant, see the comment at the kernel;
// $CIDER_ATTN_TC_KCHAN=0 excludes them).
// Contract: kernels/cuda/cuda_api.h (cuda::attention); chosen by attention.cu (attention_tc.h); design, floors and
// measurements: docs/cuda/attention.md.
//
// Work item: one CTA (4 warps) = (b, KV head g) × one split [c0, c1) of the keys, all R = rep·L ≤ 8 query rows of the
// head (row r: position i = r / rep, head g·rep + r % rep). Each warp walks its own tiles of TK keys (tiles w, w+4, …
// of the split) with its own online softmax and a 3-stage cp.async pipeline into its own shared memory; the 4 warps
// are combined at the end (log-sum-exp), then the split's partial (or the output) is written.
//
// Scores (exact integer dot products on the tensor cores): per row the query is scaled by 2^E (E from the row's
// largest |q|) and rounded to an integer Q with |Q| ≤ 2^21 (error ≤ 2^-22·max|q|, below float32 accumulation noise),
// written as three signed 8-bit digits Q = d2·2^16 + d1·2^8 + d0. With the 4-bit key codes as the u8 A operand
// (M = 16 keys, K = 32 dims) and the digits as the s8 B operand (N = 8 query rows),
//   Z_g = Σ_{k∈g} c_k·Q_k = ((Σ c·d2)·256 + Σ c·d1)·256 + Σ c·d0      (mma.m16n8k32 .u8.s8 → s32, exact: |Z| < 2^31;
//   three independent accumulators, one per digit, for instruction-level parallelism)
//   score = scale · Σ_g ( s_g · 2^-E · Z_g + b_g · Σ_{k∈g} q_k ).
// The k index ↔ dim map is free inside a group: k-step (g, ks), thread tig reads key word w = 8g + 4ks + tig;
// its even nibbles (w & 0x0F0F0F0F) are A's k = 4tig..4tig+3, its odd nibbles k = 16 + 4tig.. — two ops per 8 codes.
// Values (f16 tensor cores, float32 accumulation): out[d] = Σ_t p_t·s_t·c_td + Σ_t p_t·b_t per value group:
//   A = value codes (M = 16 dims, K = 16 keys) as f16 (exact: magic-exponent bit tricks, 3-bit codes unpacked from a
//   24-bit window per thread), B = W = p·s split into f16 hi + lo (≈ 22-bit weights; |W| ≤ |s| ≤ 65504 with f16
//   scales, so no overflow), moved from the score fragment layout to the B layout by movmatrix.trans.
// K8V4: the 8-bit key codes are the u8 A operand as stored (word 8·kstep + tig: k 4tig.., word + 4: k 16 + 4tig..);
// |Z| reaches 64·255·2^21 > 2^31, so C2 and C1·256 + C0 (each < 2^31) are combined in float32. The 4-bit value codes
// (one word = the 8 dims 64gv + 8gid + e of a key) convert per byte pair of two keys with magics 1024 (low nibble) and
// 64 (high nibble); value rows are chunk-swizzled in shared memory.
// Softmax in base 2 (scores pre-multiplied by log2 e, ex2.approx); m/l per thread for its rows 2·tig, 2·tig+1.
// A softcap maps each score (log2 units) to c2·tanhf(score/c2), c2 = cap·log2e, before the mask (attention_tc.h).
// R ≤ 4 rows (one token at GQA rep ≤ 4) take the packed layout instead (kPacked, session 4): 4 rows × (hi, lo) in the
// 8 mma columns, two score chains, one value mma per 16 dims, one row per lane; see the comment at the kernel.
//
// Fixed cost (issue 5): the kernel is launched through pdl::launch and waits (griddepcontrol.wait) before its first
// dependent read; the prologue reads q as float4 straight into registers (warp w: rows w, w + 4), forms max |q|, the
// group sums, E (exponent bits, no frexpf) and Q = rint(q·2^E) (powers of two built from the exponent field, no
// ldexpf) and the digit fragments between lane pairs: one CTA barrier. The warps are combined through their own tile
// areas in fragment order (float4, one barrier). With splits > 1 each CTA writes its partial, counts itself in on a
// per-(b, KV head) counter, and the last CTA of the head merges all splits (log-sum-exp, as attention.cu's
// merge_kernel) and resets the counter — no second kernel (the counters: counter_slabs.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_tc_device.cuh"
#include "kernels/cuda/counter_slabs.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda::detail {

namespace {

constexpr int kTcThreads = 128;
constexpr int kTcWarps = 4;
constexpr int kStages = 3;
constexpr int kRows = 8;  // query rows per CTA (the mma N)

// KB/VB: key/value code bits, K4V3 (the original path), K8V4, K4V4 or (per-channel keys) K5V4. kChan: per-channel keys (layout 1,
// docs/kv_cache.md §2b, blocks of 64 positions), 4-bit codes.
template <int D, int KB, int VB, bool kChan = false>
struct Cfg {
  static_assert((KB == 4 && VB == 3) || (KB == 8 && VB == 4) || (KB == 4 && VB == 4) ||
                    (kChan && KB == 5 && (VB == 4 || VB == 5)),
                "K4V3, K8V4 or K4V4, or K5V4 / K5V5 with per-channel keys");
  static_assert(!kChan || KB == 4 || KB == 5, "per-channel keys: 4- or 5-bit codes");
  // Pipeline stages per warp: K5 per-channel tiles take two (three would leave 2 CTAs per SM at D128 instead of 3).
  static constexpr int kSt = kChan && KB == 5 ? 2 : kStages;
  static constexpr int kG = D / 64;                  // quantization groups per row (keys and values)
  static constexpr int kTK = D == 128 ? 32 : 16;     // keys per warp tile
  static constexpr int kMT = kTK / 16;               // 16-key m-tiles per warp tile
  static constexpr int kBlk = 64;                    // kChan: positions per block of key scales
  static constexpr int kTPB = kBlk / kTK;            // kChan: tiles per block (a warp takes whole blocks)
  static constexpr int kKRowB = D * KB / 8;          // key code bytes per row
  static constexpr int kKRowW = kKRowB / 4;
  static constexpr int kVRowB = D * VB / 8;          // value code bytes per row
  static constexpr int kVRowW = kVRowB / 4;
  static constexpr int kSbB = kG * 2;                // f16 scale (or bias) bytes per row
  static constexpr int kKBytes = kTK * kKRowB;
  static constexpr int kVBytes = kTK * kVRowB;
  static constexpr int kSbBytes = kTK * kSbB;        // one of the per-row scale/bias planes
  static constexpr int kRowPlanes = kChan ? 2 : 4;   // per-row planes in a stage: key and value (kChan: value) s, b
  static constexpr int kKBlkB = kChan ? 2 * D * 2 : 0;  // kChan: the block's key scale row and bias row (f16 [D])
  static constexpr int kStageB = kKBytes + kVBytes + kRowPlanes * kSbBytes + kKBlkB;
  static constexpr int kKSteps = D / 32;             // int8 k-steps of the scores
  // Shared memory: [warps][stages] tiles, then the query digits (kChan: one set per warp, refolded per block), kChan's
  // query rows [8][D] float and per-warp block constants (E, β per row), then the per-row constants.
  static constexpr int kTileArea = kTcWarps * kSt * kStageB;
  static constexpr int kDigitsB = (kChan ? kTcWarps : 1) * kKSteps * 3 * 32 * 8;  // [(warp)][kstep][digit][lane] uint2
  static constexpr int kQRowsB = kChan ? kRows * D * 4 : 0;
  static constexpr int kMaxOut = D / 16;             // kChan: outlier channels per block read (cuda::kchan_tc_format)
  // kChan: per warp and row the block's exponent E and β, then the outlier channels' weights [kMaxOut] (float).
  static constexpr int kBlkConstB = kChan ? kTcWarps * kRows * (8 + 4 * kMaxOut) : 0;
  // qsum [8][G] float, qexp [8] int, the warps' (m, l) [4][8] float2, the merge flag (+ padding).
  static constexpr int kRowConstB = kRows * kG * 4 + kRows * 4 + kTcWarps * kRows * 8 + 16;
  static constexpr int kSmem = kTileArea + kDigitsB + kQRowsB + kBlkConstB + kRowConstB;
  // Epilogue: each warp's accumulators in fragment order [G·4][32] float4 fit its own tile area.
  static constexpr int kWarpRedB = kG * 4 * 32 * 16;
  static_assert(kWarpRedB <= kSt * kStageB, "a warp's accumulators fit its own tile area");
  // In-kernel merge (last CTA of a head): [4 warps][8 rows][D] float sums + the weights [R][splits] in the tile area.
  static constexpr int kMergeRedB = kTcWarps * kRows * D * 4;
  static constexpr int kMaxFoldWeights = (kTileArea - kMergeRedB) / 4;
  static_assert(kMaxFoldWeights >= 1024, "room for the merge weights");
  static_assert(kStageB % 16 == 0 && kDigitsB % 16 == 0, "16-byte aligned areas");
};

struct TcParams : TcCallParams {
  // splits > 1: the per-(b, KV head) arrival counters of the in-kernel merge (zero between launches: the last CTA
  // of a head resets its counter); null: the partials are left for attention.cu's merge kernel.
  unsigned int* counters;
  // 1: *d_length and the first tiles of rows below length − L are read before the PDL wait ($CIDER_ATTN_TC_EARLY=0
  // turns it off for the A/B; read at every call).
  int early_copies;
  // Per-channel keys (kChan): the bf16 residual window [B·Hkv, 64, D] and the rows of key scales per (b, KV head).
  const uint16_t* residual;
  int64_t kblocks;
};




__device__ __forceinline__ void mma_u8s8(int (&c)[4], const uint32_t (&a)[4], uint2 b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p)); }
// Y & mask as f16 pairs: two codes c at bit position `pos` of each half's mantissa (bits 0–9, exponent field 0), i.e.
// the f16 subnormals c·2^(pos − 24), exact; the tensor cores multiply f16 subnormals exactly, so the value mma yields
// 2^(pos − 24)·Σ W·c for the dims stored at that position, and the loop's end scales those accumulator rows by
// 2^(24 − pos) (value_row_scale_log2) — one LOP3 per two codes instead of OR-ing in a magic exponent (a second LOP3:
// one immediate per LOP3) and subtracting it (an HADD2). docs/cuda/attention.md, "Value codes as f16 subnormals".
__device__ __forceinline__ uint32_t code_pair(uint32_t y, uint32_t mask) { return y & mask; }
// log2 of the factor for value-code index e (the dim 8·gid + e of the lane's 8-dim window, the A row gid (e even)
// or gid + 8 (e odd) of m-tile j = e / 2): 24 − the code's bit position in its half (see the P[..] masks below).
template <int VB>
__device__ __forceinline__ int value_row_scale_log2(int e) {
  if constexpr (VB == 5) return 0;  // 5-bit codes enter as exact f16 integers (codes_to_h2), not subnormals
  if constexpr (VB == 4) return (e & 1) ? 20 : 24;  // low nibble at bit 0, high nibble at bit 4
  constexpr int kV3[8] = {24, 21, 18, 24, 21, 17, 22, 19};  // bits 0, 3, 6 (Lw), 0, 3 (L9), 7 (Hw), 2, 5 (H2)
  return kV3[e];
}

// ---- per-channel keys (kChan) ----

// The 8 five-bit codes of dims 8w .. 8w + 7 of a key row (row: its 32-bit words; the codes are bits 40w .. 40w + 39,
// little-endian) as two u8×4 words: even dims (8w, +2, +4, +6) and odd dims (+1, +3, +5, +7). The row's last group
// still reads inside the row (5w / 4 + 1 < D·5/32 for w < D/8).
__device__ __forceinline__ uint64_t five_bits40(const uint32_t* row, int w) {
  const int byte = 5 * w, wi = byte >> 2, sh = 8 * (byte & 3);
  return ((static_cast<uint64_t>(row[wi + 1]) << 32) | row[wi]) >> sh;
}
__device__ __forceinline__ void five_split(const uint32_t* row, int w, uint32_t& even, uint32_t& odd) {
  const uint64_t x = five_bits40(row, w);
  const uint32_t lo = static_cast<uint32_t>(x), hi = static_cast<uint32_t>(x >> 32);  // codes: bits 5j .. 5j + 4
  even = (lo & 0x1Fu) | ((lo >> 2) & 0x1F00u) | ((lo >> 4) & 0x1F0000u) | ((__funnelshift_r(lo, hi, 30) & 0x1Fu) << 24);
  odd = ((lo >> 5) & 0x1Fu) | ((lo >> 7) & 0x1F00u) | ((lo >> 9) & 0x1F0000u) | (((hi >> 3) & 0x1Fu) << 24);
}

// Two floats as three bf16 pairs hi + mid + lo (8 + 8 + 8 significant bits: every float32 exactly, the two
// subtractions are exact), for the window's bf16 mma.
__device__ __forceinline__ void split3_bf16(float x0, float x1, uint32_t (&o)[3]) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const float r0 = x0 - hf.x, r1 = x1 - hf.y;
  const __nv_bfloat162 m = __floats2bfloat162_rn(r0, r1);
  const float2 mf = __bfloat1622float2(m);
  const __nv_bfloat162 l = __floats2bfloat162_rn(r0 - mf.x, r1 - mf.y);
  memcpy(&o[0], &h, 4);
  memcpy(&o[1], &m, 4);
  memcpy(&o[2], &l, 4);
}

// Scores of a tile of the residual window (the newest, unquantized block: bf16 rows, slot = position mod 64) in the
// score fragment layout (log2 units): A = key rows as stored (m16n8k16 bf16, 16 keys × 16 dims, read from global
// memory: the window is one block per head and call), B = the 8 query rows as hi + mid + lo bf16 (three
// accumulators), float32 accumulation. C's lane (gid, tig) holds keys gid, gid + 8 × rows 2tig, 2tig + 1 — the
// unpacked layout; the packed layout (row tig) takes its two values from lane (gid, tig / 2). Keys at or past c1
// read as zeros (their slots are masked anyway).
template <int D, int MT, bool kPacked>
__device__ __forceinline__ void window_scores(const uint16_t* win, int64_t t0, int64_t c1, const float* qrows,
                                              int lane, float scale_log2, float (&sc)[MT][4]) {
  const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int64_t ja = t0 + mt * 16 + gid, jb = ja + 8;
    const uint32_t* ka = reinterpret_cast<const uint32_t*>(win + (ja & 63) * D);
    const uint32_t* kb = reinterpret_cast<const uint32_t*>(win + (jb & 63) * D);
    const bool oka = ja < c1, okb = jb < c1;
    float c[3][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const uint32_t a[4] = {oka ? ka[8 * ks + tig] : 0u, okb ? kb[8 * ks + tig] : 0u,
                             oka ? ka[8 * ks + 4 + tig] : 0u, okb ? kb[8 * ks + 4 + tig] : 0u};
      const float2 q0 = *reinterpret_cast<const float2*>(qrows + gid * D + 16 * ks + 2 * tig);
      const float2 q1 = *reinterpret_cast<const float2*>(qrows + gid * D + 16 * ks + 8 + 2 * tig);
      uint32_t b0[3], b1[3];
      split3_bf16(q0.x, q0.y, b0);
      split3_bf16(q1.x, q1.y, b1);
#pragma unroll
      for (int k = 0; k < 3; ++k) mma_bf16(c[k], a, b0[k], b1[k]);
    }
    float s[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) s[e] = ((c[2][e] + c[1][e]) + c[0][e]) * scale_log2;
    if constexpr (kPacked) {
      const int src = (lane & ~3) | (tig >> 1);
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = __shfl_sync(0xffffffffu, s[e], src);
      sc[mt][0] = (tig & 1) ? v[1] : v[0];
      sc[mt][2] = (tig & 1) ? v[3] : v[2];
      sc[mt][1] = sc[mt][3] = 0.0f;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[mt][e] = s[e];
    }
  }
}

// The fold of a quantized block β of per-channel keys, by one warp for its own tiles: for each query row r < R,
// q'_d = q_d·s_βd (float32), E_r from max |q'| (as the per-token prologue), the digits of Q' = rint(q'·2^E) into
// the warp's digit table (same fragment order as the prologue's, 4-bit key words), and β_r = Σ_d q_d·b_βd. Rows ≥ R
// keep the zeros written at the start. s/b: the block's f16 scale and bias rows in the stage. Then score_j =
// scale·(2^-E·Z_j + β) with Z_j = Σ_d c_jd·Q'_d exact on the integer tensor cores.
// Outlier channels (nout > 0; oidx: the block's channel indices in global memory): lane o < nout takes channel
// d_o, and per row w_ro = q_{d_o}·|s_{d_o}|/15 — a position's refinement code r adds w_ro·(r − 7.5) to its score
// (quant::outlier_refinement): bw[r·kMaxOut + o] = w_ro·scale_log2 for the tiles, and −7.5·Σ_o w_ro goes into β.
template <int D, int KB>
__device__ __forceinline__ void fold_block(const float* qrows, const __half* sblk, const __half* bblk, int R, int lane,
                                           uint2* wdig, int* be, float* bb, int nout, const uint16_t* oidx, float* bw,
                                           float scale_log2) {
  constexpr int kQ4 = D / 128;
  constexpr int kMaxOut = D / 16;
  int od = 0;
  float ostep = 0.0f;
  if (lane < nout) {
    od = __ldg(oidx + lane);
    ostep = fabsf(__half2float(sblk[od])) / 15.0f;
  }
  for (int r = 0; r < R; ++r) {
    float x[kQ4][4];
    float mx = 0.0f, bs = 0.0f;
#pragma unroll
    for (int u = 0; u < kQ4; ++u) {
      const int lq = lane + 32 * u;
      const float4 q = reinterpret_cast<const float4*>(qrows + r * D)[lq];
      const uint2 sw = reinterpret_cast<const uint2*>(sblk)[lq];
      const uint2 bw = reinterpret_cast<const uint2*>(bblk)[lq];
      const float2 s01 = __half22float2(bits_h2(sw.x)), s23 = __half22float2(bits_h2(sw.y));
      const float2 b01 = __half22float2(bits_h2(bw.x)), b23 = __half22float2(bits_h2(bw.y));
      x[u][0] = q.x * s01.x;
      x[u][1] = q.y * s01.y;
      x[u][2] = q.z * s23.x;
      x[u][3] = q.w * s23.y;
      mx = fmaxf(mx, fmaxf(fmaxf(fabsf(x[u][0]), fabsf(x[u][1])), fmaxf(fabsf(x[u][2]), fabsf(x[u][3]))));
      bs = fmaf(q.x, b01.x, fmaf(q.y, b01.y, fmaf(q.z, b23.x, fmaf(q.w, b23.y, bs))));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      bs += __shfl_xor_sync(0xffffffffu, bs, o);
    }
    const int E = q_exponent(mx) - (KB == 5 ? 1 : 0);  // |Q'| < 2^21 (4-bit codes), 2^20 (5-bit: 64·31·|Q'| < 2^31)
    if (nout > 0) {
      const float w = lane < nout ? qrows[r * D + od] * ostep : 0.0f;
      if (lane < nout) bw[r * kMaxOut + lane] = w * scale_log2;
      float ws = w;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(0xffffffffu, ws, o);
      bs -= 7.5f * ws;
    }
    if (lane == 0) {
      be[r] = E;
      bb[r] = bs;
    }
#pragma unroll
    for (int u = 0; u < kQ4; ++u) {
      const int lq = lane + 32 * u;
      uint32_t dg[4][3];
#pragma unroll
      for (int j = 0; j < 4; ++j) q_digits(static_cast<int>(rintf(mul_pow2(x[u][j], E))), dg[j]);
      const int sh = 16 * (lq & 1);  // the prologue's 4-bit fragment order
#pragma unroll
      for (int d = 0; d < 3; ++d) {
        uint32_t fx = (dg[0][d] | (dg[2][d] << 8)) << sh;
        uint32_t fy = (dg[1][d] | (dg[3][d] << 8)) << sh;
        fx |= __shfl_xor_sync(0xffffffffu, fx, 1);
        fy |= __shfl_xor_sync(0xffffffffu, fy, 1);
        if ((lq & 1) == 0) {
          const int w = lq >> 1;
          wdig[((w >> 2) * 3 + d) * 32 + r * 4 + (w & 3)] = make_uint2(fx, fy);
        }
      }
    }
  }
  __syncwarp();
}

// Swizzled position of 16-byte chunk `ch` of a 4-bit value row r (K8V4; V3 rows are stored unswizzled). One read:
// keys r = 2tig(+1, +8, +9) for tig = 0..3, chunks ch = 2gv + (gid >> 2): D256 (8 chunks per 128-byte row) XORs
// with 0, 2, 4, 6 (conflict-free); D128 (4 chunks per 64-byte row) can only spread the 4 keys over 16 banks (2-way).
template <int D>
__device__ __forceinline__ int value4_chunk_pos(int r, int ch) {
  if constexpr (D == 128)
    return ch ^ (((r >> 1) & 1) << 1);
  else
    return ch ^ (((r >> 1) & 3) << 1);
}

// The merge of the splits of head (b, g) by its last CTA: out_r = Σ_s w_rs·o_rs / Σ_s w_rs·l_rs with
// w_rs = e^{m_rs − M_r} over the splits with l_rs > 0 (zeros when there is none), as attention.cu's merge_kernel.
// (A) warp w: rows w, w + 4 — M_r over the splits, the weights to shared memory [R][splits], L_r; (B) warp w sums the
// splits s ≡ w (mod 4) for all rows, float4 columns lane + 32u, U splits per step (R·U·D/128 float4 loads in flight
// per lane); (C) the 4 warps' sums through shared memory, float4 stores of out. Reads partials with ld.global.cg.
template <int D, int KB>
__device__ __forceinline__ void merge_splits(const TcParams& p, int b, int g, uint8_t* smem, float* lrow) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int kQ4 = D / 128;
  constexpr int U = D == 128 ? 2 : 1;  // splits per step: R·U·D/128 float4 loads per lane in flight (register budget)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int R = p.R, S = p.splits;
  float* mred = reinterpret_cast<float*>(smem);     // [4 warps][8 rows][D]
  float* weight = mred + kTcWarps * kRows * D;      // [R][S]
  auto orow_of = [&](int r) -> int64_t {
    return (static_cast<int64_t>(b) * p.Hq + g * p.rep + r % p.rep) * p.L + r / p.rep;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp + kTcWarps * h;
    if (r >= R) break;
    const float2* ml = reinterpret_cast<const float2*>(p.part_ml) + orow_of(r) * S;
    float M = kNegInf;
    for (int s = lane; s < S; s += 32) {
      const float2 v = __ldcg(ml + s);
      if (v.y > 0.0f) M = fmaxf(M, v.x);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    float L = 0.0f;
    for (int s = lane; s < S; s += 32) {
      const float2 v = __ldcg(ml + s);
      const float wgt = v.y > 0.0f ? ex2((v.x - M) * 1.4426950408889634f) : 0.0f;
      weight[r * S + s] = wgt;
      L += wgt * v.y;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    if (lane == 0) lrow[r] = L;
  }
  __syncthreads();
  float4 acc[kRows][kQ4];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int u = 0; u < kQ4; ++u) acc[r][u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float* po[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) po[r] = p.part_o + orow_of(r < R ? r : 0) * S * D + 4 * lane;
  for (int s0 = warp; s0 < S; s0 += kTcWarps * U) {
    float4 v[U][kRows][kQ4];
    float wg[U][kRows];
#pragma unroll
    for (int uu = 0; uu < U; ++uu) {
      const int s = s0 + kTcWarps * uu;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const bool ok = r < R && s < S;  // an empty split's o is zeros (written), its weight 0
        wg[uu][r] = ok ? weight[r * S + s] : 0.0f;
#pragma unroll
        for (int u = 0; u < kQ4; ++u)
          v[uu][r][u] = ok ? __ldcg(reinterpret_cast<const float4*>(po[r] + static_cast<int64_t>(s) * D + 128 * u))
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int uu = 0; uu < U; ++uu)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int u = 0; u < kQ4; ++u) {
          const float w = wg[uu][r];
          acc[r][u].x += w * v[uu][r][u].x;
          acc[r][u].y += w * v[uu][r][u].y;
          acc[r][u].z += w * v[uu][r][u].z;
          acc[r][u].w += w * v[uu][r][u].w;
        }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r < R) {
#pragma unroll
      for (int u = 0; u < kQ4; ++u)
        reinterpret_cast<float4*>(mred + (warp * kRows + r) * D)[lane + 32 * u] = acc[r][u];
    }
  __syncthreads();
  for (int idx = tid; idx < R * (D / 4); idx += kTcThreads) {
    const int r = idx / (D / 4), c = idx % (D / 4);
    float4 o = reinterpret_cast<const float4*>(mred + r * D)[c];
#pragma unroll
    for (int w = 1; w < kTcWarps; ++w) {
      const float4 t = reinterpret_cast<const float4*>(mred + (w * kRows + r) * D)[c];
      o.x += t.x;
      o.y += t.y;
      o.z += t.z;
      o.w += t.w;
    }
    const float L = lrow[r];
    const float4 res = L > 0.0f ? make_float4(o.x / L, o.y / L, o.z / L, o.w / L) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    reinterpret_cast<float4*>(p.out + orow_of(r) * D)[c] = res;
  }
}

// K4V3: 4 (D128) / 3 (D256) CTAs per SM as before; K8V4: 87 / 94 KB of shared memory, so 2 CTAs per SM.
// kPacked (R ≤ 4 query rows, e.g. one decode token at GQA rep 4): the 8 mma columns carry 4 rows × 2, so nothing is
// padding. Scores: chain X has columns (2r, 2r + 1) = (digit 2, digit 1) of row r, chain Y (digit 0, 0) — two chains
// instead of three, and lane (gid, tig) gets Z of row tig for its keys in its own registers: Z = (X0·256 + X1)·256 +
// Y0, the same exact integer as the 3-chain form. Values: the B operand's columns (2r, 2r + 1) carry W = p·s of row r
// as f16 hi and lo (the same two f16 numbers the 3-chain path splits W into), so one mma per (m-tile, value group,
// 16 dims) instead of two, and the row's output is acc[hi column] + acc[lo column], summed in the lane at the end.
// Every lane works on one row (tig): half the score, softmax and W conversion work of the unpacked layout, whose lanes
// 2tig, 2tig + 1 ≥ R hold padding rows. Before the epilogue the packed state is moved by shuffles into the unpacked
// layout (lane (gid, tig) rows 2tig, 2tig + 1), so the warp combine, the partials and the merge are shared.
//
// kChan (per-channel keys, blocks of 64 positions, docs/kv_cache.md §2b): a warp takes whole blocks (block w + 4k of
// the split, its TPB tiles in a row), and at a block's first tile folds the block's key scales into its own copy of
// the query digits (fold_block: Q' = rint(q ⊙ s_β · 2^E)) and β = Σ q·b_β, so the integer tile scoring is the
// per-token one with unit scales: score = scale·(2^-E·Z + β). The block of the residual window (positions from
// 64·⌊length/64⌋ on, bf16) is scored by window_scores. Values as for the per-token caches.
template <int D, int KB, int VB, bool kPacked, bool kChan>
__global__ void __launch_bounds__(kTcThreads, kChan ? (D == 128 ? 3 : 2) : (KB == 8 ? 2 : (D == 128 ? 4 : 3)))
    attention_tc_kernel(TcParams p) {
  using C = Cfg<D, KB, VB, kChan>;
  constexpr int G = C::kG, TK = C::kTK, MT = C::kMT, TPB = C::kTPB;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  extern __shared__ float4 tc_smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(tc_smem4);
  uint2* qdig = reinterpret_cast<uint2*>(smem + C::kTileArea);  // [kstep][3][32] (kChan: [warp][kstep][3][32])
  float* qrows = reinterpret_cast<float*>(smem + C::kTileArea + C::kDigitsB);                  // kChan: [8][D]
  int* blk_e = reinterpret_cast<int*>(smem + C::kTileArea + C::kDigitsB + C::kQRowsB);         // kChan: [warp][8]
  float* blk_b = reinterpret_cast<float*>(blk_e + (kChan ? kTcWarps * kRows : 0));             // kChan: [warp][8]
  float* blk_w = blk_b + (kChan ? kTcWarps * kRows : 0);  // kChan: [warp][8][kMaxOut] outlier weights
  float* qsum = reinterpret_cast<float*>(smem + C::kTileArea + C::kDigitsB + C::kQRowsB + C::kBlkConstB);  // [8][G]
  int* qexp = reinterpret_cast<int*>(qsum + kRows * G);                     // [8]
  float2* wml = reinterpret_cast<float2*>(qexp + kRows);                    // [4 warps][8 rows] (m, l)
  int* merge_flag = reinterpret_cast<int*>(wml + kTcWarps * kRows);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int bg = blockIdx.y, b = bg / p.Hkv, g = bg % p.Hkv;
  uint2* wdig = qdig + (kChan ? warp * C::kKSteps * 3 * 32 : 0);  // this warp's digit table
  const int split = blockIdx.x;
  // PDL: the queries and the cache rows the previous kernel appended are read only after the wait. With
  // p.early_copies (cuda.attention's contract: the kernel just before it in the stream writes neither *d_length nor
  // the cache rows below length − L) the length and the first tiles of rows below length − L are fetched before it,
  // so their HBM latency overlaps the previous kernel's tail (docs/cuda/attention.md, "Early tile copies").
  // Without early copies the wait comes first, as before the contract: nothing is read before it.
  if (p.early_copies == 0) {
    pdl::wait();
    pdl::launch_dependents();
  }
  int64_t kL = p.kL_bound;
  if (p.d_length) kL = max(static_cast<int64_t>(0), min(static_cast<int64_t>(*p.d_length), p.kL_bound));
  const int R = p.R;
  // Visible key interval of the block (union over its rows) and of this split.
  const KeyInterval vis = visible_keys(kL, p.L, p.rep, 0, R - 1, p.causal != 0, p.window);
  int64_t lo = vis.lo;
  const int64_t hi = vis.hi;
  if constexpr (kChan) lo -= lo % C::kBlk;  // whole blocks (keys before the window are masked per row)
  // The visible interval spread over all splits (split_range: a device length below the planned bound, or a window,
  // keeps every CTA busy), in whole tiles per warp (kChan: whole blocks).
  const SplitRange sr = split_range(lo, hi, split, p.splits, kTcWarps * (kChan ? C::kBlk : TK));
  const int64_t c0 = sr.c0, c1 = sr.c1;
  const int64_t n_keys = max(static_cast<int64_t>(0), c1 - c0);
  const int n_tiles = static_cast<int>((n_keys + TK - 1) / TK);
  // The warp's i-th tile, as a tile index of the split: tiles w, w + 4, … (kChan: blocks w, w + 4, …, each its TPB
  // tiles in a row).
  auto tile_of = [&](int i) -> int {
    if constexpr (kChan)
      return ((i / TPB) * kTcWarps + warp) * TPB + i % TPB;
    else
      return warp + i * kTcWarps;
  };
  int my_tiles;
  if constexpr (kChan) {
    const int nb = (n_tiles + TPB - 1) / TPB;  // blocks of the split (the last may be partial)
    const int mb = nb > warp ? (nb - warp + kTcWarps - 1) / kTcWarps : 0;
    my_tiles = mb * TPB;
    if (mb > 0 && (nb - 1) % kTcWarps == warp) my_tiles -= nb * TPB - n_tiles;
  } else {
    my_tiles = n_tiles > warp ? (n_tiles - warp + kTcWarps - 1) / kTcWarps : 0;
  }
  const int64_t full_blocks = kChan ? kL / C::kBlk : 0;  // kChan: blocks [0, full_blocks) are quantized

  const int64_t krow0 = static_cast<int64_t>(bg) * p.cap_k;
  const int64_t vrow0 = static_cast<int64_t>(bg) * p.cap_v;
  uint8_t* wbase = smem + warp * C::kSt * C::kStageB;

  // Issue the copies of this warp's i-th tile into stage i % C::kSt (zero-filled past c1), then commit a group.
  // Every lane copies fixed slots of a tile (16-byte chunks c = lane + 32u of the key and value rows, 4-byte words
  // of the scale/bias planes): per tile only the base pointers and the row bound change.
  constexpr int kKChunks = C::kKBytes / 16, kKRowCh = C::kKRowB / 16;
  constexpr int kVChunks = C::kVBytes / 16, kVRowCh = C::kVRowB / 16;
  constexpr int kSbWords = C::kSbBytes / 4, kSbRowW = C::kSbB / 4;
  static_assert(kKChunks % 32 == 0 && kVChunks % 32 == 0 && kSbWords % 32 == 0, "whole copy slots per lane");
  auto issue = [&](int i) {
    if (i < my_tiles) {
      const int64_t t0 = c0 + static_cast<int64_t>(tile_of(i)) * TK;
      const int nvalid = static_cast<int>(min(static_cast<int64_t>(TK), c1 - t0));
      uint8_t* st = wbase + (i % C::kSt) * C::kStageB;
      const uint8_t* kt = p.kc + (krow0 + t0) * C::kKRowB;
      const uint8_t* vt = p.vc + (vrow0 + t0) * C::kVRowB;
#pragma unroll
      for (int u = 0; u < kKChunks / 32; ++u) {
        const int c = lane + 32 * u, r = c / kKRowCh, ch = c % kKRowCh;
        const bool ok = r < nvalid;
        cp_async16(st + r * C::kKRowB + key_chunk_pos<D, KB>(r, ch) * 16, ok ? kt + c * 16 : kt, ok);
      }
#pragma unroll
      for (int u = 0; u < kVChunks / 32; ++u) {
        const int c = lane + 32 * u;
        const bool ok = c / kVRowCh < nvalid;
        int dst = c * 16;  // V3: 48/96-byte rows stored as they are
        if constexpr (VB == 4) dst = (c / kVRowCh) * C::kVRowB + value4_chunk_pos<D>(c / kVRowCh, c % kVRowCh) * 16;
        cp_async16(st + C::kKBytes + dst, ok ? vt + c * 16 : vt, ok);
      }
      // Per-row planes: key scales, key biases (per-token keys only), value scales, value biases.
      const uint8_t* const sbt[4] = {p.ks + (krow0 + t0) * C::kSbB, p.kb + (krow0 + t0) * C::kSbB,
                                     p.vs + (vrow0 + t0) * C::kSbB, p.vb + (vrow0 + t0) * C::kSbB};
#pragma unroll
      for (int pl = 0; pl < C::kRowPlanes; ++pl)
#pragma unroll
        for (int u = 0; u < kSbWords / 32; ++u) {
          const int wd = lane + 32 * u;
          const bool ok = wd / kSbRowW < nvalid;
          const uint8_t* src = sbt[pl + 4 - C::kRowPlanes];
          cp_async4(st + C::kKBytes + C::kVBytes + pl * C::kSbBytes + wd * 4, ok ? src + wd * 4 : src, ok);
        }
      if constexpr (kChan) {
        // A quantized block's first tile also brings the block's key scale and bias rows (f16 [D] each).
        const int64_t blk = t0 / C::kBlk;
        if (i % TPB == 0 && blk < full_blocks) {
          constexpr int kCh = D * 2 / 16;  // 16-byte chunks per row
          const int64_t off = (static_cast<int64_t>(bg) * p.kblocks + blk) * D * 2;
#pragma unroll
          for (int u = 0; u < 2 * kCh / 32; ++u) {
            const int c = lane + 32 * u, pl = c / kCh, ch = c % kCh;
            cp_async16(st + C::kKBytes + C::kVBytes + C::kRowPlanes * C::kSbBytes + pl * D * 2 + ch * 16,
                       (pl ? p.kb : p.ks) + off + ch * 16, true);
          }
          // Outlier channels: their codes and indices, read by the block's fold, on their way to L1.
          if (p.outliers > 0) {
            const int64_t ob = static_cast<int64_t>(bg) * p.kblocks + blk;
            if (lane < (p.outliers * 32 + 127) / 128)
              prefetch_l1(p.ocodes + ob * p.outliers * 32 + 128 * lane);
            else if (lane == 31)
              prefetch_l1(p.oindex + ob * p.outliers);
          }
        }
      }
    }
    cp_commit();
  };

  // Start the first tiles' copies before the query preparation — before the PDL wait when every row they read is
  // below kL − L (written before the previous kernel ran), else after it.
  // kChan: the whole block of those tiles must lie below length − L (the append completing a block writes its
  // codes and scales).
  const int64_t early_end =
      kChan ? c0 + (static_cast<int64_t>(tile_of(C::kSt - 2)) / TPB + 1) * C::kBlk
            : c0 + static_cast<int64_t>(tile_of(C::kSt - 2) + 1) * TK;
  const bool early = p.early_copies != 0 && early_end <= kL - p.L;
  if (early) {
#pragma unroll
    for (int i = 0; i < C::kSt - 1; ++i) issue(i);
  }
  // The next kernel may start its own prologue now (it waits for this grid's completion before touching anything).
  if (p.early_copies != 0) {
    pdl::wait();
    pdl::launch_dependents();
  }
  if (!early) {
#pragma unroll
    for (int i = 0; i < C::kSt - 1; ++i) issue(i);
  }

  // ---- queries: warp w prepares rows w and w + 4 straight from global memory (float4 per lane: dims 4·lane'..+3,
  // lane' = lane + 32u): max |q| and the group sums by shuffles, the exponent E, the integers Q = rint(q·2^E) and
  // their digit fragments, assembled between lane pairs; one CTA barrier publishes them. ----
  constexpr int kQ4 = D / 128;  // float4 per lane per row
  if constexpr (kChan) {
    // Per-channel keys: the rows go to shared memory (zeros past R) for the folds and the window, and the warps'
    // digit tables start at zero (rows ≥ R stay zero).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp + kTcWarps * h;
      float4 v[kQ4];
      load_q_row<D>(p.q, b, g, p.Hq, p.L, p.rep, r, R, lane, v);
#pragma unroll
      for (int u = 0; u < kQ4; ++u) reinterpret_cast<float4*>(qrows + r * D)[lane + 32 * u] = v[u];
    }
    for (int idx = tid; idx < kTcWarps * C::kKSteps * 3 * 32; idx += kTcThreads) qdig[idx] = make_uint2(0u, 0u);
    if (tid < kTcWarps * kRows) {
      blk_e[tid] = 0;
      blk_b[tid] = 0.0f;
    }
    for (int idx = tid; idx < kTcWarps * kRows * C::kMaxOut; idx += kTcThreads) blk_w[idx] = 0.0f;
  } else {
      float4 qv[2][kQ4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      load_q_row<D>(p.q, b, g, p.Hq, p.L, p.rep, warp + kTcWarps * h, R, lane, qv[h]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp + kTcWarps * h;
      float mx = 0.0f;
#pragma unroll
      for (int u = 0; u < kQ4; ++u) {
        const float4 v = qv[h][u];
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        // Group sums: lanes 0–15 hold group 2u, lanes 16–31 group 2u + 1 (64 dims = 16 lanes × 4).
        float gs = (v.x + v.y) + (v.z + v.w);
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) gs += __shfl_xor_sync(0xffffffffu, gs, o);
        if ((lane & 15) == 0) qsum[r * G + 2 * u + (lane >> 4)] = gs;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const int E = q_exponent(mx);  // max |q|·2^E < 2^21 (as frexpf: mx < 2^(21 − E))
      if (lane == 0) qexp[r] = E;
#pragma unroll
      for (int u = 0; u < kQ4; ++u) {
        const int lq = lane + 32 * u;  // float4 index in the row: dims 4lq .. 4lq + 3
        const float4 v = qv[h][u];
        const float x[4] = {v.x, v.y, v.z, v.w};
        uint32_t dg[4][3];  // [j][digit] bytes of dims 4lq + j
#pragma unroll
        for (int j = 0; j < 4; ++j) q_digits(static_cast<int>(rintf(mul_pow2(x[j], E))), dg[j]);  // |Q| ≤ 2^21
        if constexpr (KB == 4) {
          // Key word w = lq >> 1 holds dims 8w..8w+7 (nibble 2i + half = dim 8w + 2i + half): fragment (kstep =
          // w >> 2, t = w & 3) of row r has byte i of .x (half 0) / .y (half 1). This lane has i = 2(lq & 1) + (j >> 1),
          // half = j & 1; its partner lq ^ 1 (lane ^ 1) the other two bytes of each.
          const int sh = 16 * (lq & 1);
#pragma unroll
          for (int d = 0; d < 3; ++d) {
            uint32_t fx = (dg[0][d] | (dg[2][d] << 8)) << sh;
            uint32_t fy = (dg[1][d] | (dg[3][d] << 8)) << sh;
            fx |= __shfl_xor_sync(0xffffffffu, fx, 1);
            fy |= __shfl_xor_sync(0xffffffffu, fy, 1);
            if ((lq & 1) == 0) {
              const int w = lq >> 1;
              qdig[((w >> 2) * 3 + d) * 32 + r * 4 + (w & 3)] = make_uint2(fx, fy);
            }
          }
        } else {
          // 8-bit keys: dim = 32·kstep + 16·half + 4t + i, so this lane's 4 dims are word (kstep = lq >> 3,
          // half = (lq >> 2) & 1, t = lq & 3) of row r's fragment, bytes i = j; the partner lane ^ 4 has the other half.
#pragma unroll
          for (int d = 0; d < 3; ++d) {
            const uint32_t mine = dg[0][d] | (dg[1][d] << 8) | (dg[2][d] << 16) | (dg[3][d] << 24);
            const uint32_t other = __shfl_xor_sync(0xffffffffu, mine, 4);
            if (((lq >> 2) & 1) == 0) qdig[((lq >> 3) * 3 + d) * 32 + r * 4 + (lq & 3)] = make_uint2(mine, other);
          }
        }
      }
    }
  }
  __syncthreads();

  // Per-thread constants for its rows r0 = 2·tig, r1 = 2·tig + 1 (packed: the one row tig, in slot 0; slot 1 unused
  // until the epilogue, which always sees the unpacked layout).
  const int rr[2] = {2 * tig, 2 * tig + 1};                // the epilogue's rows (unpacked layout)
  const int crow[2] = {kPacked ? tig : rr[0], rr[1]};       // the tile loop's rows
  float zmul[2], bq[G][2];
  int vis_lo[2], vis_hi[2];  // visible keys of rows r0, r1 as [lo, hi) relative to c0 (0 ≤ · ≤ c1 − c0)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = crow[h];
    if constexpr (!kChan) {
      zmul[h] = mul_pow2(p.scale_log2, -qexp[r]);  // = ldexpf(scale_log2, −E)
#pragma unroll
      for (int gi = 0; gi < G; ++gi) bq[gi][h] = qsum[r * G + gi] * p.scale_log2;
    }
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
  constexpr bool kDigitRegs = false;
  uint2 qreg[kDigitRegs ? C::kKSteps : 1][3];
  if constexpr (kDigitRegs) {
#pragma unroll
    for (int ks = 0; ks < C::kKSteps; ++ks)
#pragma unroll
      for (int d = 0; d < 3; ++d) qreg[ks][d] = qdig[(ks * 3 + d) * 32 + lane];
  }
  auto digits = [&](int kstep, int d) -> uint2 {
    if constexpr (kDigitRegs)
      return qreg[kstep][d];
    else
      return wdig[(kstep * 3 + d) * 32 + lane];
  };
  // Packed B fragments: column n = gid is row gid >> 1, digit 2 (X) / 0 (Y) for even gid, digit 1 (X) / zero (Y) for
  // odd gid; the fragment of row r at lane slot r·4 + tig of the digit table.
  const int pk_lane = (gid >> 1) * 4 + tig, pk_dx = (gid & 1) ? 1 : 2;
  const uint32_t pk_ymask = (gid & 1) ? 0u : 0xffffffffu;
  auto digits_x = [&](int kstep) -> uint2 { return wdig[(kstep * 3 + pk_dx) * 32 + pk_lane]; };
  auto digits_y = [&](int kstep) -> uint2 {
    const uint2 v = wdig[(kstep * 3) * 32 + pk_lane];
    return make_uint2(v.x & pk_ymask, v.y & pk_ymask);
  };

  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.0f, 0.0f};
  float bacc[G][2];
  float acc[G][4][4];
#pragma unroll
  for (int gi = 0; gi < G; ++gi) {
    bacc[gi][0] = bacc[gi][1] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[gi][j][e] = 0.0f;
  }

  // kChan: the current block's 2^-E·scale and β·scale for the lane's rows (set by each block's fold), and the
  // outlier channels' refinement codes of the lane's keys: creg[o] nibble k = position gid + 8k of the block.
  float zc[2] = {0.0f, 0.0f}, bc[2] = {0.0f, 0.0f};
  uint32_t creg[kChan ? C::kMaxOut : 1];
#pragma unroll
  for (int o = 0; o < (kChan ? C::kMaxOut : 1); ++o) creg[o] = 0u;

  for (int i = 0; i < my_tiles; ++i) {
    issue(i + C::kSt - 1);
    cp_wait<C::kSt - 1>();
    __syncwarp();
    const uint8_t* st = wbase + (i % C::kSt) * C::kStageB;
    const uint32_t* sk = reinterpret_cast<const uint32_t*>(st);
    const uint32_t* sv = reinterpret_cast<const uint32_t*>(st + C::kKBytes);
    const __half* sb0 = reinterpret_cast<const __half*>(st + C::kKBytes + C::kVBytes);  // the per-row planes
    const __half* sks = sb0;            // per-token keys only
    const __half* skb = sb0 + TK * G;   // per-token keys only
    const __half* svs = sb0 + (C::kRowPlanes - 2) * TK * G;
    const __half* svb = svs + TK * G;
    const int tl = tile_of(i);
    const int64_t t0 = c0 + static_cast<int64_t>(tl) * TK;
    const bool win = kChan && t0 >= full_blocks * C::kBlk;  // kChan: a tile of the residual window
    if constexpr (kChan) {
      if (!win && i % TPB == 0) {
        const __half* sblk = sb0 + C::kRowPlanes * TK * G;  // the block's key scale row, then its bias row
        const int64_t ob = static_cast<int64_t>(bg) * p.kblocks + t0 / C::kBlk;
        fold_block<D, KB>(qrows, sblk, sblk + D, R, lane, wdig, blk_e + warp * kRows, blk_b + warp * kRows,
                          p.outliers, p.oindex + ob * p.outliers, blk_w + warp * kRows * C::kMaxOut, p.scale_log2);
        if (p.outliers > 0) {
          // Code row o (32 bytes, position t at byte t/2, nibble t%2): the lane's positions gid + 8k are byte
          // (gid >> 1) of word k, nibble gid & 1.
          const uint4* crow4 = reinterpret_cast<const uint4*>(p.ocodes + ob * p.outliers * 32);
          const int sh = 8 * (gid >> 1) + 4 * (gid & 1);
#pragma unroll
          for (int o = 0; o < C::kMaxOut; ++o) {
            if (o < p.outliers) {
              const uint4 w0 = __ldg(crow4 + 2 * o), w1 = __ldg(crow4 + 2 * o + 1);
              const uint32_t wk[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
              uint32_t v = 0;
#pragma unroll
              for (int k = 0; k < 8; ++k) v |= ((wk[k] >> sh) & 15u) << (4 * k);
              creg[o] = v;
            }
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          zc[h] = mul_pow2(p.scale_log2, -blk_e[warp * kRows + crow[h]]);
          bc[h] = blk_b[warp * kRows + crow[h]] * p.scale_log2;
        }
      }
    }

    // ---- scores: sc[mt][e], e = (key gid, r0), (gid, r1), (gid+8, r0), (gid+8, r1), log2 units ----
    float sc[MT][4];
    if (win) {
      window_scores<D, MT, kPacked>(p.residual + static_cast<int64_t>(bg) * C::kBlk * D, t0, c1, qrows, lane,
                                    p.scale_log2, sc);
    } else {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int ra = mt * 16 + gid, rb = ra + 8;
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[mt][e] = kChan ? bc[e & 1] : 0.0f;
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
        uint32_t A[2][4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          if constexpr (KB == 4) {
            const int ch = 2 * gi + ks;  // 16-byte chunk = words 8gi + 4ks .. + 3
            const uint32_t wa = sk[ra * C::kKRowW + key_chunk_pos<D, KB>(ra, ch) * 4 + tig];
            const uint32_t wb = sk[rb * C::kKRowW + key_chunk_pos<D, KB>(rb, ch) * 4 + tig];
            A[ks][0] = wa & 0x0F0F0F0Fu;
            A[ks][1] = wb & 0x0F0F0F0Fu;
            A[ks][2] = (wa >> 4) & 0x0F0F0F0Fu;
            A[ks][3] = (wb >> 4) & 0x0F0F0F0Fu;
          } else if constexpr (KB == 5) {
            // 5-bit codes (per-channel keys): the 8 codes of dims 8w .. 8w + 7 (w = 8gi + 4ks + tig, as the 4-bit
            // path's word) are the 40 bits from byte 5w of the row; even dims → A's k = 4tig.., odd → 16 + 4tig..,
            // so the digit tables are the 4-bit path's.
            const int w = 8 * gi + 4 * ks + tig;
            five_split(sk + ra * C::kKRowW, w, A[ks][0], A[ks][2]);
            five_split(sk + rb * C::kKRowW, w, A[ks][1], A[ks][3]);
          } else {
            // 8-bit codes are the u8 operand as they are: chunk 4gi + 2ks holds dims 64gi + 32ks + 0..15 (k 4tig..),
            // the next chunk dims + 16..31 (k 16 + 4tig..).
            const int ch = 4 * gi + 2 * ks;
            A[ks][0] = sk[ra * C::kKRowW + key_chunk_pos<D, KB>(ra, ch) * 4 + tig];
            A[ks][1] = sk[rb * C::kKRowW + key_chunk_pos<D, KB>(rb, ch) * 4 + tig];
            A[ks][2] = sk[ra * C::kKRowW + key_chunk_pos<D, KB>(ra, ch + 1) * 4 + tig];
            A[ks][3] = sk[rb * C::kKRowW + key_chunk_pos<D, KB>(rb, ch + 1) * 4 + tig];
          }
        }
        // Three independent 2-deep chains (one per digit), combined as Z = (C2·256 + C1)·256 + C0: exact, since
        // every partial sum Σ c·(Q − d0) and Z itself stay below 2^31 in magnitude.
        int z[4] = {0, 0, 0, 0}, z1[4] = {0, 0, 0, 0}, z0[4] = {0, 0, 0, 0};
        if constexpr (kPacked) {
          // Chain X = (C2, C1) and chain Y = (C0, 0) in columns (2·tig, 2·tig + 1): the lane's row tig, keys ra / rb.
          int zx[4] = {0, 0, 0, 0}, zy[4] = {0, 0, 0, 0};
          mma_u8s8(zx, A[0], digits_x(2 * gi));
          mma_u8s8(zy, A[0], digits_y(2 * gi));
          mma_u8s8(zx, A[1], digits_x(2 * gi + 1));
          mma_u8s8(zy, A[1], digits_y(2 * gi + 1));
          z[0] = zx[0], z1[0] = zx[1], z0[0] = zy[0];  // key ra
          z[2] = zx[2], z1[2] = zx[3], z0[2] = zy[2];  // key rb
        } else {
          mma_u8s8(z, A[0], digits(2 * gi, 2));
          mma_u8s8(z1, A[0], digits(2 * gi, 1));
          mma_u8s8(z0, A[0], digits(2 * gi, 0));
          mma_u8s8(z, A[1], digits(2 * gi + 1, 2));
          mma_u8s8(z1, A[1], digits(2 * gi + 1, 1));
          mma_u8s8(z0, A[1], digits(2 * gi + 1, 0));
        }
        if constexpr (KB != 8) {  // K5: |Q| < 2^20 (fold_block), so 64·31·|Q| < 2^31 too
#pragma unroll
          for (int e = 0; e < 4; ++e) z[e] = (z[e] * 256 + z1[e]) * 256 + z0[e];
        }
        // 8-bit codes: |Z| ≤ 64·255·2^21 ≈ 2^35 does not fit an int32, but C1·256 + C0 does (|·| < 64·255·2^15 =
        // 2^29) and C2 alone does; they are combined in float32 (one rounding, 2^-24 relative).
        auto zf = [&](int e) -> float {
          if constexpr (KB != 8)
            return static_cast<float>(z[e]);
          else
            return fmaf(static_cast<float>(z[e]), 65536.0f, static_cast<float>(z1[e] * 256 + z0[e]));
        };
        if constexpr (kChan) {
          sc[mt][0] += zc[0] * zf(0);
          sc[mt][2] += zc[0] * zf(2);
          if constexpr (!kPacked) {
            sc[mt][1] += zc[1] * zf(1);
            sc[mt][3] += zc[1] * zf(3);
          }
        } else {
          const float sa = __half2float(sks[ra * G + gi]), sb = __half2float(sks[rb * G + gi]);
          const float ba = __half2float(skb[ra * G + gi]), bb = __half2float(skb[rb * G + gi]);
          sc[mt][0] += sa * (zmul[0] * zf(0)) + ba * bq[gi][0];
          sc[mt][2] += sb * (zmul[0] * zf(2)) + bb * bq[gi][0];
          if constexpr (!kPacked) {
            sc[mt][1] += sa * (zmul[1] * zf(1)) + ba * bq[gi][1];
            sc[mt][3] += sb * (zmul[1] * zf(3)) + bb * bq[gi][1];
          }
        }
      }
    }
      if constexpr (kChan) {
        if (p.outliers > 0) {  // Σ_o w_ro·r_o(key) (the −7.5 offset is in β)
          const int kk = (i % TPB) * (TK / 8);
          const float* w0 = blk_w + (warp * kRows + crow[0]) * C::kMaxOut;
          const float* w1 = blk_w + (warp * kRows + crow[1]) * C::kMaxOut;
#pragma unroll
          for (int o = 0; o < C::kMaxOut; ++o) {
            if (o < p.outliers) {
              const float a0 = w0[o], a1 = w1[o];
#pragma unroll
              for (int mt = 0; mt < MT; ++mt) {
                const float ca = static_cast<float>((creg[o] >> (4 * (kk + 2 * mt))) & 15u);
                const float cb = static_cast<float>((creg[o] >> (4 * (kk + 2 * mt + 1))) & 15u);
                sc[mt][0] = fmaf(a0, ca, sc[mt][0]);
                sc[mt][2] = fmaf(a0, cb, sc[mt][2]);
                if constexpr (!kPacked) {
                  sc[mt][1] = fmaf(a1, ca, sc[mt][1]);
                  sc[mt][3] = fmaf(a1, cb, sc[mt][3]);
                }
              }
            }
          }
        }
      }
    }  // scores
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int ra = mt * 16 + gid;
      if (p.softcap_log2 > 0.0f) {  // before the mask; slots of invisible keys are overwritten below
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[mt][e] = capped_score(sc[mt][e], p.softcap_log2, p.inv_softcap_log2);
      }
      const int ja = tl * TK + ra, jb = ja + 8;  // key index − c0
      sc[mt][0] = (ja >= vis_lo[0] && ja < vis_hi[0]) ? sc[mt][0] : kNegInf;
      sc[mt][2] = (jb >= vis_lo[0] && jb < vis_hi[0]) ? sc[mt][2] : kNegInf;
      if constexpr (kPacked) {
        sc[mt][1] = sc[mt][3] = kNegInf;  // unused slots (row slot 1)
      } else {
        sc[mt][1] = (ja >= vis_lo[1] && ja < vis_hi[1]) ? sc[mt][1] : kNegInf;
        sc[mt][3] = (jb >= vis_lo[1] && jb < vis_hi[1]) ? sc[mt][3] : kNegInf;
      }
    }

    // ---- online softmax (rows r0, r1; max over the warp's gid lanes) ----
    constexpr int kH = kPacked ? 1 : 2;  // row slots per lane
    float mnew[2] = {0.0f, 0.0f}, alpha[2] = {1.0f, 1.0f};
#pragma unroll
    for (int h = 0; h < kH; ++h) {
      float tmax = kNegInf;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) tmax = fmaxf(tmax, fmaxf(sc[mt][h], sc[mt][2 + h]));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 4));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 8));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
      const float mn = fmaxf(m_run[h], tmax);
      const float mu = mn == kNegInf ? 0.0f : mn;  // nothing visible yet: p = 0, α irrelevant (acc = 0)
      alpha[h] = ex2(m_run[h] - mu);
      m_run[h] = mn;
      mnew[h] = mu;
    }
    // Rescale only when some row's maximum moved (after the first tiles it rarely does).
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
      if constexpr (kPacked) {  // every accumulator of the lane belongs to its row
#pragma unroll
        for (int gi = 0; gi < G; ++gi) {
          bacc[gi][0] *= alpha[0];
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[gi][j][e] *= alpha[0];
        }
      } else {
#pragma unroll
        for (int gi = 0; gi < G; ++gi)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            bacc[gi][h] *= alpha[h];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              acc[gi][j][h] *= alpha[h];
              acc[gi][j][2 + h] *= alpha[h];
            }
          }
      }
      l_run[0] *= alpha[0];
      l_run[1] *= alpha[1];
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int ra = mt * 16 + gid, rb = ra + 8;
      float pr[4];
      if constexpr (kPacked) {
        pr[0] = ex2(sc[mt][0] - mnew[0]), pr[2] = ex2(sc[mt][2] - mnew[0]);
        pr[1] = pr[3] = 0.0f;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) pr[e] = ex2(sc[mt][e] - mnew[e & 1]);
      }
      l_run[0] += pr[0] + pr[2];
      l_run[1] += pr[1] + pr[3];

      // Value code windows: keys kk = 2tig, 2tig+1, 2tig+8, 2tig+9 of this m-tile.
      const int kk[4] = {mt * 16 + 2 * tig, mt * 16 + 2 * tig + 1, mt * 16 + 2 * tig + 8, mt * 16 + 2 * tig + 9};
#pragma unroll
      for (int gv = 0; gv < G; ++gv) {
        // W = p·s as f16 hi + lo, rows of key ra / rb, then transposed to the B layout (keys × query rows).
        const float sva = __half2float(svs[ra * G + gv]), svb_ = __half2float(svs[rb * G + gv]);
        const float bva = __half2float(svb[ra * G + gv]), bvb = __half2float(svb[rb * G + gv]);
        bacc[gv][0] += pr[0] * bva + pr[2] * bvb;
        uint32_t b0h, b1h, b0l = 0, b1l = 0;
        if constexpr (kPacked) {
          // Columns (2·tig, 2·tig + 1) = (hi, lo) of W for the lane's row, keys ra (b0) and rb (b1).
          const float wa = pr[0] * sva, wb = pr[2] * svb_;
          const __half ha = __float2half_rn(wa), hb = __float2half_rn(wb);
          const __half la = __float2half_rn(wa - __half2float(ha)), lb = __float2half_rn(wb - __half2float(hb));
          b0h = movmatrix_t(h2_bits(__halves2half2(ha, la)));
          b1h = movmatrix_t(h2_bits(__halves2half2(hb, lb)));
        } else {
          bacc[gv][1] += pr[1] * bva + pr[3] * bvb;
          const float wa0 = pr[0] * sva, wa1 = pr[1] * sva, wb0 = pr[2] * svb_, wb1 = pr[3] * svb_;
          const __half2 ha = __floats2half2_rn(wa0, wa1), hb = __floats2half2_rn(wb0, wb1);
          const float2 fa = __half22float2(ha), fb = __half22float2(hb);
          const __half2 la = __floats2half2_rn(wa0 - fa.x, wa1 - fa.y), lb = __floats2half2_rn(wb0 - fb.x, wb1 - fb.y);
          b0h = movmatrix_t(h2_bits(ha)), b1h = movmatrix_t(h2_bits(hb));
          b0l = movmatrix_t(h2_bits(la)), b1l = movmatrix_t(h2_bits(lb));
        }

        // A: codes of dims 64gv + 8gid + e (e = 0..7) for the four keys, as f16 pairs (key 2tig, 2tig+1) etc.
        uint32_t P[2][8];
        if constexpr (VB == 5) {
          // 5-bit values (per-channel-key caches): the 8 codes of dims 64gv + 8gid + e are the 40 bits from byte
          // 5·(8gv + gid) of each key's row; code e of keys (a, b) as the exact f16 pair (c_a, c_b).
          const int w5 = 8 * gv + gid;
          uint64_t X[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) X[k] = five_bits40(sv + kk[k] * C::kVRowW, w5);
#pragma unroll
          for (int pp = 0; pp < 2; ++pp)
#pragma unroll
            for (int e = 0; e < 8; ++e)
              P[pp][e] = codes_to_h2(static_cast<uint32_t>((X[2 * pp] >> (5 * e)) & 31u) |
                                     (static_cast<uint32_t>((X[2 * pp + 1] >> (5 * e)) & 31u) << 16));
        } else if constexpr (VB == 4) {
          // 4-bit: the 8 codes are word 8gv + gid of the key's row (nibble e = dim 64gv + 8gid + e). Per byte k of
          // the two keys' words, lanes (key a, key b) = byte k; its low nibble (code 2k) and its high nibble (code
          // 2k+1) as f16 subnormals (code_pair).
          const int ch = 2 * gv + (gid >> 2), wi = gid & 3;
          uint32_t X[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) X[k] = sv[kk[k] * C::kVRowW + value4_chunk_pos<D>(kk[k], ch) * 4 + wi];
#pragma unroll
          for (int pp = 0; pp < 2; ++pp)
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const uint32_t Bk = __byte_perm(X[2 * pp], X[2 * pp + 1], 0x4400u + 0x1100u * k + 0x11u * k);
              P[pp][2 * k] = code_pair(Bk, 0x000F000Fu);  // bit 0: c·2^-24
              P[pp][2 * k + 1] = code_pair(Bk, 0x00F000F0u);  // bit 4: c·2^-20
            }
        } else {
        const int bit = 192 * gv + 24 * gid, wo = bit >> 5, sh = bit & 31;
        const int wo1 = min(wo + 1, C::kVRowW - 1);
        uint32_t X[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          X[k] = __funnelshift_r(sv[kk[k] * C::kVRowW + wo], sv[kk[k] * C::kVRowW + wo1], sh);
#pragma unroll
        for (int pp = 0; pp < 2; ++pp) {
          const uint32_t xa = X[2 * pp], xb = X[2 * pp + 1];
          const uint32_t Lw = __byte_perm(xa, xb, 0x5410);  // bits 0-15 of each key's window
          const uint32_t L9 = Lw >> 9;
          const uint32_t Hw = __byte_perm(xa, xb, 0x6521);  // bits 8-23
          const uint32_t H2 = __byte_perm(xa, xb, 0x7632);  // bits 16-31
          P[pp][0] = code_pair(Lw, 0x00070007u);  // bits 0-2: c·2^-24
          P[pp][1] = code_pair(Lw, 0x00380038u);  // bits 3-5: c·2^-21
          P[pp][2] = code_pair(Lw, 0x01C001C0u);  // bits 6-8: c·2^-18
          P[pp][3] = code_pair(L9, 0x00070007u);  // bits 9-11: c·2^-24
          P[pp][4] = code_pair(L9, 0x00380038u);  // bits 12-14: c·2^-21
          P[pp][5] = code_pair(Hw, 0x03800380u);  // bits 15-17 (H bits 7-9): c·2^-17
          P[pp][6] = code_pair(H2, 0x001C001Cu);  // bits 18-20 (H2 bits 2-4): c·2^-22
          P[pp][7] = code_pair(H2, 0x00E000E0u);  // bits 21-23 (H2 bits 5-7): c·2^-19
        }
        }  // VB == 3
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t a[4] = {P[0][2 * j], P[0][2 * j + 1], P[1][2 * j], P[1][2 * j + 1]};
          mma_f16(acc[gv][j], a, b0h, b1h);
          if constexpr (!kPacked) mma_f16(acc[gv][j], a, b0l, b1l);
        }
      }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  cp_wait<0>();
  __syncwarp();  // every lane's copies have landed and every lane is done with the stages: the area is free

  // The value codes entered the mma as f16 subnormals c·2^(pos − 24) (code_pair): scale each accumulator row back by
  // the power of two of its dim's bit position (exact). acc[gv][j][0..1] is A row gid (code index 2j), [2..3] row
  // gid + 8 (2j + 1), in both layouts.
#pragma unroll
  for (int gv = 0; gv < G; ++gv)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[gv][j][e] *= pow2f(value_row_scale_log2<VB>(2 * j + (e >> 1)));

  if constexpr (kPacked) {
    // Packed → unpacked layout: lane (gid, tig) takes rows 2·tig + h from lane (gid, 2·tig + h) (rows 4–7, tig ≥ 2,
    // are empty: R ≤ 4); each accumulator is its hi column plus its lo column.
    const bool has_rows = tig < 2;
    const int src[2] = {(lane & ~3) | ((2 * tig) & 3), (lane & ~3) | ((2 * tig + 1) & 3)};
    const float m_p = m_run[0], l_p = l_run[0];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m = __shfl_sync(0xffffffffu, m_p, src[h]), l = __shfl_sync(0xffffffffu, l_p, src[h]);
      m_run[h] = has_rows ? m : kNegInf;
      l_run[h] = has_rows ? l : 0.0f;
    }
#pragma unroll
    for (int gv = 0; gv < G; ++gv) {
      const float b_p = bacc[gv][0];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float bsh = __shfl_sync(0xffffffffu, b_p, src[h]);
        bacc[gv][h] = has_rows ? bsh : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // (hi + lo) of dim gid and of dim gid + 8
        const float dim_a = acc[gv][j][0] + acc[gv][j][1], dim_b = acc[gv][j][2] + acc[gv][j][3];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float a0 = __shfl_sync(0xffffffffu, dim_a, src[h]), a1 = __shfl_sync(0xffffffffu, dim_b, src[h]);
          acc[gv][j][h] = has_rows ? a0 : 0.0f;
          acc[gv][j][2 + h] = has_rows ? a1 : 0.0f;
        }
      }
    }
  }

  // ---- combine the warps (log-sum-exp): l and the bias sums over the gid lanes by shuffles; each warp stores its
  // accumulators (+ bias sums) in fragment order [G·4][32] float4 into its OWN tile area (no barrier before) and
  // (m, l) of its rows; one barrier; thread (warp, lane) then combines fragment slots k4 = warp, warp + 4, … of the
  // 4 warps for its rows 2tig, 2tig + 1 and writes dims d, d + 1 (float2) of each. ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], o);
#pragma unroll
    for (int gi = 0; gi < G; ++gi)
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) bacc[gi][h] += __shfl_xor_sync(0xffffffffu, bacc[gi][h], o);
  }
  {
    float4* wred = reinterpret_cast<float4*>(wbase);
#pragma unroll
    for (int gv = 0; gv < G; ++gv)
#pragma unroll
      for (int j = 0; j < 4; ++j)  // (dim d, row r0), (d, r1), (d + 1, r0), (d + 1, r1)
        wred[(gv * 4 + j) * 32 + lane] = make_float4(acc[gv][j][0] + bacc[gv][0], acc[gv][j][1] + bacc[gv][1],
                                                     acc[gv][j][2] + bacc[gv][0], acc[gv][j][3] + bacc[gv][1]);
    if (gid == 0) {
      wml[warp * kRows + rr[0]] = make_float2(m_run[0], l_run[0]);
      wml[warp * kRows + rr[1]] = make_float2(m_run[1], l_run[1]);
    }
  }
  __syncthreads();
  float fw[kTcWarps][2], lsum[2], mrow[2];
  int64_t orow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float2 ml[kTcWarps];
    float M = kNegInf;
#pragma unroll
    for (int w = 0; w < kTcWarps; ++w) {
      ml[w] = wml[w * kRows + rr[h]];
      if (ml[w].y > 0.0f) M = fmaxf(M, ml[w].x);
    }
    float l = 0.0f;
#pragma unroll
    for (int w = 0; w < kTcWarps; ++w) {
      fw[w][h] = ml[w].y > 0.0f ? ex2(ml[w].x - M) : 0.0f;  // a warp that saw no key counts 0 (M = −inf: all 0)
      l += fw[w][h] * ml[w].y;
    }
    lsum[h] = l;
    mrow[h] = M;
    const int r = rr[h], ih = r / p.rep, hq = g * p.rep + r % p.rep;
    orow[h] = (static_cast<int64_t>(b) * p.Hq + hq) * p.L + ih;
  }
#pragma unroll
  for (int k4 = warp; k4 < G * 4; k4 += kTcWarps) {
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kTcWarps; ++w) {
      const float4 v = reinterpret_cast<const float4*>(smem + w * C::kSt * C::kStageB)[k4 * 32 + lane];
      o.x += fw[w][0] * v.x;
      o.y += fw[w][1] * v.y;
      o.z += fw[w][0] * v.z;
      o.w += fw[w][1] * v.w;
    }
    const int d = 64 * (k4 >> 2) + 8 * gid + 2 * (k4 & 3);
    const float oh[2][2] = {{o.x, o.z}, {o.y, o.w}};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (rr[h] >= R) continue;
      if (p.splits == 1) {
        const float l = lsum[h];
        *reinterpret_cast<float2*>(p.out + orow[h] * D + d) =
            make_float2(l > 0.0f ? oh[h][0] / l : 0.0f, l > 0.0f ? oh[h][1] / l : 0.0f);
      } else {
        *reinterpret_cast<float2*>(p.part_o + (orow[h] * p.splits + split) * D + d) = make_float2(oh[h][0], oh[h][1]);
      }
    }
  }
  if (p.splits == 1) return;
  if (warp == 0 && gid == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (rr[h] < R)
        reinterpret_cast<float2*>(p.part_ml)[orow[h] * p.splits + split] =
            make_float2(mrow[h] == kNegInf ? mrow[h] : mrow[h] * 0.69314718055994531f, lsum[h]);  // log2 → ln
  }
  if (p.counters == nullptr) return;  // attention.cu's merge kernel combines the splits

  // ---- in-kernel merge: the last CTA of head (b, g) to finish combines all its splits. Every CTA fences its
  // partial, then one thread counts it in; the CTA that sees count = splits − 1 resets the counter to 0 (the next
  // launch, or graph replay, starts from zero) and merges. ----
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned int prev = atomicAdd(p.counters + bg, 1u);
    const int last = prev == static_cast<unsigned int>(p.splits - 1) ? 1 : 0;
    if (last) atomicExch(p.counters + bg, 0u);
    *merge_flag = last;
  }
  __syncthreads();
  if (*merge_flag == 0) return;
  __threadfence();  // the other CTAs' partials (fenced before their count) are read below through L2 (ld.cg)
  merge_splits<D, KB>(p, b, g, smem, qsum);
}

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }

// Lets the kernel have its shared memory on the current GPU; returns the resident CTAs per SM (the same on every GPU
// of the host).
template <int D, int KB, int VB, bool kPacked, bool kChan>
int tc_ctas_per_sm() {
  using C = Cfg<D, KB, VB, kChan>;
  const void* fn = reinterpret_cast<const void*>(&attention_tc_kernel<D, KB, VB, kPacked, kChan>);
  allow_dynamic_smem(fn, C::kSmem, "cuda.attention");
  static int n = [fn] {
    int blocks = 0;
    CIDER_CUDA_CHECK("cuda.attention",
                     cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kTcThreads, C::kSmem));
    return std::max(blocks, 1);
  }();
  return n;
}

bool tc_enabled() {
  static const bool on = env_flag("CIDER_ATTN_TC", true, "cuda.attention");
  return on;
}

// K8V4 on the tensor-core path: on by default since the H200 job of 2026-11-30 00:25 (tests + memcheck pass, 27.4 µs at
// B1 D128 L32768 vs 257 µs on the CUDA-core kernel: docs/cuda/attention.md); $CIDER_ATTN_TC_K8V4=0 turns it off (read at
// every call, so a test can set it).
bool tc_k8v4_enabled() { return env_flag("CIDER_ATTN_TC_K8V4", true, "cuda.attention"); }

// The packed layout for R ≤ 4 query rows (attention_tc_kernel's kPacked): on unless $CIDER_ATTN_TC_PACKED=0 (read at
// every call: tests run both layouts, the bench A/Bs them).
bool tc_packed_enabled() { return env_flag("CIDER_ATTN_TC_PACKED", true, "cuda.attention"); }

// Per-channel keys (K4V4, blocks of 64) on the tensor cores: on unless $CIDER_ATTN_TC_KCHAN=0 (read at every call:
// tests and the bench run the CUDA-core kernel beside it).
bool tc_kchan_enabled() { return env_flag("CIDER_ATTN_TC_KCHAN", true, "cuda.attention"); }

// In-kernel merge ("fold"): only with $CIDER_ATTN_TC_FOLD=1 (read at every call: tests and bench A/B it). Measured on
// the H200 (2026-11-30, docs/cuda/attention.md): the fold is SLOWER than the separate merge kernel (K4V3 B1 L32768
// 27.2 vs 25.1 µs, Hq64 L8192 19.4 vs 14.5 µs: one CTA per head merging every split serially is a longer tail than a
// parallel merge launch), so the partials go to attention.cu's merge kernel by default.
bool tc_fold_enabled() { return env_flag("CIDER_ATTN_TC_FOLD", false, "cuda.attention"); }

// The arrival counters of the in-kernel merge: counters::Pool::kAttentionMerge (counter_slabs.h says why they are a
// static device array and how launches on different streams keep apart); a 9th stream, or B·Hkv > kCounterSlab,
// falls back to the merge kernel.
constexpr int64_t kFoldMaxBytes = 256 * 1024;  // partial bytes one merging CTA may read (see tc_plan)

}  // namespace

int sm_count() {
  static int n = [] {
    int dev = 0, sms = 0;
    CIDER_CUDA_CHECK("cuda.attention", cudaGetDevice(&dev));
    CIDER_CUDA_CHECK("cuda.attention", cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return std::max(sms, 1);
  }();
  return n;
}

bool kchan_tc_views(const kernels::KVTensorView& K, const kernels::KVTensorView& V) {
  return K.layout == 1 && V.layout == 0 && V.group_size == K.group_size && V.scale_dtype == K.scale_dtype &&
         V.dim == K.dim && kchan_tc_format(K.bits, V.bits, K.group_size, K.scale_dtype, K.dim, K.outliers) &&
         (K.outliers == 0 || (aligned(K.outlier_codes, 16) && K.outlier_index != nullptr));
}

bool tc_eligible(const kernels::AttentionArgs& a) {
  if (!tc_enabled()) return false;
  const auto& K = a.keys;
  const auto& V = a.values;
  const int64_t rep = a.Hq / K.H;
  const bool k4v3 = K.bits == 4 && V.bits == 3;
  const bool k8v4 = K.bits == 8 && V.bits == 4;
  if (K.layout == 1) {
    // Per-channel keys in a format the kernel reads (kchan_tc_views), at most 8 query rows.
    return tc_kchan_enabled() && kchan_tc_views(K, V) && rep * a.L <= kRows && aligned(a.q, 16) &&
           aligned(a.out, 16) && aligned(K.data, 16) && aligned(V.data, 16) && aligned(K.scales, 16) &&
           aligned(K.biases, 16) && aligned(V.scales, 4) && aligned(V.biases, 4) && aligned(K.residual, 16);
  }
  if ((!k4v3 && !k8v4) || K.layout != 0 || V.layout != 0) return false;
  return K.group_size == 64 && V.group_size == 64 && K.dim == V.dim &&
         (K.dim == 128 || K.dim == 256) && K.scale_dtype == DType::kF16 && V.scale_dtype == DType::kF16 &&
         rep * a.L <= kRows && aligned(a.q, 16) && aligned(a.out, 16) && aligned(K.data, 16) &&
         aligned(V.data, 16) && aligned(K.scales, 4) &&
         aligned(K.biases, 4) && aligned(V.scales, 4) && aligned(V.biases, 4) && (k4v3 || tc_k8v4_enabled());
}

namespace {
template <int D, int KB, int VB, bool kChan = false>
void plan_config(bool packed, int& tk, int& per_sm, size_t& smem, int& max_fold_weights) {
  using C = Cfg<D, KB, VB, kChan>;
  tk = kChan ? C::kBlk : C::kTK;  // the split quantum is 4 of these: one tile (kChan: one block) per warp
  per_sm = packed ? tc_ctas_per_sm<D, KB, VB, true, kChan>() : tc_ctas_per_sm<D, KB, VB, false, kChan>();
  smem = static_cast<size_t>(C::kSmem);
  max_fold_weights = C::kMaxFoldWeights;
}
}  // namespace

TcPlan tc_plan(const kernels::AttentionArgs& a) {
  TcPlan pl;
  const bool d128 = a.keys.dim == 128, k8 = a.keys.bits == 8;
  int tk = 0, per_sm = 1, max_w = 0;
  pl.packed = a.Hq / a.keys.H * a.L <= 4 && tc_packed_enabled();
  const bool pk = pl.packed;
  if (a.keys.layout == 1 && a.keys.bits == 5 && a.values.bits == 5)
    d128 ? plan_config<128, 5, 5, true>(pk, tk, per_sm, pl.smem, max_w)
         : plan_config<256, 5, 5, true>(pk, tk, per_sm, pl.smem, max_w);
  else if (a.keys.layout == 1 && a.keys.bits == 5)
    d128 ? plan_config<128, 5, 4, true>(pk, tk, per_sm, pl.smem, max_w)
         : plan_config<256, 5, 4, true>(pk, tk, per_sm, pl.smem, max_w);
  else if (a.keys.layout == 1)
    d128 ? plan_config<128, 4, 4, true>(pk, tk, per_sm, pl.smem, max_w)
         : plan_config<256, 4, 4, true>(pk, tk, per_sm, pl.smem, max_w);
  else if (k8)
    d128 ? plan_config<128, 8, 4>(pk, tk, per_sm, pl.smem, max_w)
         : plan_config<256, 8, 4>(pk, tk, per_sm, pl.smem, max_w);
  else
    d128 ? plan_config<128, 4, 3>(pk, tk, per_sm, pl.smem, max_w)
         : plan_config<256, 4, 3>(pk, tk, per_sm, pl.smem, max_w);
  // $CIDER_ATTN_TC_WAVES (bench variants): CTAs = waves × resident CTAs (default 1: one wave, no tail).
  static const int waves = env_int("CIDER_ATTN_TC_WAVES", 1, 1, 16, "cuda.attention");
  // Split rule: as many splits as one wave of resident CTAs holds (waves × CTAs/SM × SMs / (B·Hkv)), but never
  // less than one tile per warp (4 warps × TK keys per split). Why not fewer, longer splits at short caches: all CTAs
  // of the wave run their prologue at the same time (it is a latency chain, not a throughput cost), while every extra
  // tile per warp adds a full tile latency (≈ 2.5–3 µs measured: 3.2 µs per tile round); the merge's cost grows with
  // the splits (R·splits·D·4 bytes read by the head's last CTA, ≈ 1–2 µs at 64 splits) but stays below one round.
  const int64_t slots = static_cast<int64_t>(per_sm) * sm_count() * waves;
  const int64_t bh = a.B * a.keys.H, kL = a.keys.length;
  const int64_t quantum = static_cast<int64_t>(kTcWarps) * tk;  // one tile per warp
  int64_t splits = a.kv_splits > 0 ? std::min(a.kv_splits, 4096) : std::max<int64_t>(1, slots / bh);
  splits = std::min(splits, std::max<int64_t>(1, (kL + quantum - 1) / quantum));
  // The chunk fixes the split count here; the kernel cuts the keys it can actually see (the device length, the
  // window) into that many pieces itself (split_range), so a bound above the real length leaves no split idle.
  int64_t chunk = (kL + splits - 1) / splits;
  chunk = (chunk + quantum - 1) / quantum * quantum;
  pl.chunk = chunk;
  pl.splits = static_cast<int>((kL + chunk - 1) / chunk);
  // Fold only while the head's last CTA reads at most kFoldMaxBytes of partials (one SM pulls ≈ 100 GB/s from L2:
  // ≤ ≈ 2.5 µs); past that the merge kernel, which spreads the rows over B·Hq·L CTAs, is faster (B1 Hq16 Hkv2 D256
  // L65536: 198 splits × 8 rows × 1 KB = 1.6 MB per head, two heads).
  const int64_t R = a.Hq / a.keys.H * a.L;
  const int64_t fold_bytes = R * pl.splits * a.values.dim * static_cast<int64_t>(sizeof(float));
  pl.fold = pl.splits > 1 && R * pl.splits <= max_w && fold_bytes <= kFoldMaxBytes && bh <= counters::kCounterSlab &&
            tc_fold_enabled();
  if (pl.fold) counters::prepare();
  return pl;
}

namespace {
template <int D, int KB, int VB, bool kChan = false>
cudaError_t launch_config(bool packed, dim3 grid, const TcParams& p, cudaStream_t s) {
  constexpr int smem = Cfg<D, KB, VB, kChan>::kSmem;
  if (packed) {
    (void)tc_ctas_per_sm<D, KB, VB, true, kChan>();
    return pdl::launch(attention_tc_kernel<D, KB, VB, true, kChan>, grid, dim3(kTcThreads), smem, s, p);
  }
  (void)tc_ctas_per_sm<D, KB, VB, false, kChan>();
  return pdl::launch(attention_tc_kernel<D, KB, VB, false, kChan>, grid, dim3(kTcThreads), smem, s, p);
}
}  // namespace

namespace {
int g_tc_last_layout = 0;
}  // namespace
int tc_last_layout() { return g_tc_last_layout; }

bool tc_launch(const kernels::AttentionArgs& a, const TcPlan& pl, const int32_t* d_length, float* part_o,
               float* part_ml, void* stream) {
  TcParams p{};
  fill_tc_params(p, a, d_length, part_o, part_ml, pl.splits, pl.chunk);
  p.counters = pl.fold ? counters::counter_slab(counters::Pool::kAttentionMerge, stream) : nullptr;
  p.early_copies = env_flag("CIDER_ATTN_TC_EARLY", true, "cuda.attention") ? 1 : 0;
  p.residual = static_cast<const uint16_t*>(a.keys.residual);
  p.kblocks = a.keys.blocks;
  const dim3 grid(static_cast<unsigned>(pl.splits), static_cast<unsigned>(a.B * a.keys.H));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // tc_ctas_per_sm sets the shared-memory attribute before the first launch.
  cudaError_t err;
  const bool pk = pl.packed;
  if (a.keys.layout == 1 && a.keys.bits == 5 && a.values.bits == 5)
    err = a.keys.dim == 128 ? launch_config<128, 5, 5, true>(pk, grid, p, s)
                            : launch_config<256, 5, 5, true>(pk, grid, p, s);
  else if (a.keys.layout == 1 && a.keys.bits == 5)
    err = a.keys.dim == 128 ? launch_config<128, 5, 4, true>(pk, grid, p, s)
                            : launch_config<256, 5, 4, true>(pk, grid, p, s);
  else if (a.keys.layout == 1)
    err = a.keys.dim == 128 ? launch_config<128, 4, 4, true>(pk, grid, p, s)
                            : launch_config<256, 4, 4, true>(pk, grid, p, s);
  else if (a.keys.bits == 8)
    err = a.keys.dim == 128 ? launch_config<128, 8, 4>(pk, grid, p, s) : launch_config<256, 8, 4>(pk, grid, p, s);
  else
    err = a.keys.dim == 128 ? launch_config<128, 4, 3>(pk, grid, p, s) : launch_config<256, 4, 3>(pk, grid, p, s);
  CIDER_CUDA_CHECK("cuda.attention", err);
  g_tc_last_layout = pl.packed ? 2 : 1;
  return pl.splits > 1 && p.counters == nullptr;
}

}  // namespace cider::cuda::detail

namespace cider::cuda {

bool kchan_tc_format(int k_bits, int v_bits, int64_t group_size, DType scale_dtype, int64_t head_dim, int64_t outliers) {
  return (k_bits == 4 || k_bits == 5) && (v_bits == 4 || (v_bits == 5 && k_bits == 5)) && group_size == 64 &&
         scale_dtype == DType::kF16 && (head_dim == 128 || head_dim == 256) && outliers >= 0 &&
         outliers <= head_dim / 16;  // the kernels' kMaxOut: twice nn::auto_key_outliers' head_dim/32
}

}  // namespace cider::cuda
