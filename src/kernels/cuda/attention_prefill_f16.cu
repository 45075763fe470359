// cider/kernels/cuda/attention_prefill_f16.cu — prefill attention over a K4/V3 or K8/V4 g64 cache, or a per-channel-key
// K4V4 / K5V4 / K5V5 cache (the kChan variant: see the comment at the kernel) (f16 scales,
// D 128/256) with the keys and values dequantized to f16 once per CTA tile and an f16 flash-attention core on the
// tensor cores (mma.sync m16n8k16, f32 accumulation). attention_prefill_tc.cu's prefill path takes it for more than
// 64 query rows per KV head ($CIDER_ATTN_PREFILL_MATH=auto, the default; f16 / exact force one kernel). Contract and
// eligibility: attention_prefill_tc.h; design, numeric contract, floors and measurements: docs/cuda/attention.md
// ("Prefill with f16 tiles").
//
// Numeric contract (what the tests check against a CPU emulation, tests/cuda/test_cuda_attention.cpp):
//   q̃ = fl16(q·2^Eq) per row, Eq chosen so max|q̃| ∈ [2^14, 2^15) (a power of two: no rounding but the f16 one);
//   k̃ = fl16(s·c + b), ṽ = fl16(s·c + b) (one rounding: hfma2 of the exact f16 code with the f16 scale and bias);
//   score (log2 units) = (Σ_d q̃_d·k̃_d)·(scale·log2e·2^-Eq) with f32 accumulation (then, with a softcap,
//   c2·tanhf(score/c2), c2 = cap·log2e); p = ex2(score − m) in f32,
//   rounded to f16 for the P·V product (l sums the f32 p); out = Σ p̃·ṽ / l.
// So the result is the exact attention of the f16-rounded q, k, v up to the f32 sums and p's f16 rounding
// (≤ 2^-11·max|ṽ|); against the exact-score kernel the difference is the f16 rounding of q and k (2^-11 relative:
// ≈ 2^-10·scale·Σ|q||k| in the scores) and of v.
//
// Work item: one CTA (W = 8 or 12 warps: f16_warps_d128) = (b, KV head g) × a block of 16·W query rows (r = i·rep +
// rr as the other kernels: a block is a run of positions, one causal / window key interval) × one split [c0, c1) of
// the keys. Warp w owns rows 16w .. 16w + 15 (the mma M). Key tiles of TK keys (D128: 64; D256: 32 K4V3, 16 K8V4) are copied raw
// (codes + the four f16 planes) by cp.async into 2 stages; the CTA dequantizes each tile once into f16 [TK][D] keys
// and values (16-byte chunks XOR-swizzled by key & 7: ldmatrix conflict-free), double-buffered, so one CTA barrier
// per tile: iteration t copies tile t + 2 (into tile t's raw stage: tile t was dequantized an iteration ago and the
// math reads only f16), dequantizes t + 1 and does the math of tile t.
// Scores: A = q̃ fragments by ldmatrix.x4 from the warp's [16][D + 8] f16 area, B = k̃ by ldmatrix.x4 (keys are the
// n, dims the k: the [key][dim] tile is B's column-major layout). P·V: the score C fragments of two 8-key n-tiles
// are the A fragment of the next mma (packed to f16), B = ṽ by ldmatrix.x4.trans. Online softmax in base 2 (FA2),
// the rescale skipped when no row maximum moved; masks per lane row interval, only tiles on an edge are masked.
// Splits and the partial layout are attention.cu's (as attention_prefill_tc.cu).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/attention_prefill_tc.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_tc_device.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda::detail {

namespace {

constexpr int kF16Stages = 2;

// W: warps per CTA (16 query rows each). The CTA's threads dequantize each tile together, a thread every kKeyStep-th
// key of one chunk column; kKeyStep must be a multiple of 8 so that the column's swizzle (by key & 7) stays fixed.
// kChan: per-channel keys (layout 1, blocks of 64 positions, docs/kv_cache.md §2b), K4V4 or K5V4.
template <int D, int KB, int VB, int W, bool kChan = false>
struct F16Cfg {
  static_assert((KB == 4 && VB == 3) || (KB == 8 && VB == 4) || (kChan && (KB == 4 || KB == 5) && VB == 4) ||
                    (kChan && KB == 5 && VB == 5),
                "K4V3 or K8V4, or K4V4 / K5V4 / K5V5 with per-channel keys");
  static_assert(D == 128 || D == 256, "D 128 or 256");
  static constexpr int kThreads = 32 * W;
  static constexpr int kRowsPerWarp = 16;
  static constexpr int kRowsPerCta = W * kRowsPerWarp;
  static constexpr int kG = D / 64;                       // quantization groups per row
  static constexpr int kTK = D == 128 ? 64 : (KB == 4 ? 32 : 16);
  static constexpr int kNT = kTK / 8;                     // 8-key score n-tiles
  static constexpr int kK16 = kTK / 16;                   // 16-key k-steps of P·V
  static constexpr int kDK = D / 16;                      // 16-dim k-steps of the scores
  static constexpr int kDT = D / 8;                       // 8-dim n-tiles of the output
  static constexpr int kChunks = D / 8;                   // 16-byte f16 chunks per row
  static constexpr int kRowB = kChunks * 16;              // bytes of one f16 row
  static constexpr int kKeyStep = kThreads / kChunks;     // keys between a thread's dequantized chunks
  static_assert(kThreads % kChunks == 0 && kKeyStep % 8 == 0, "a thread's chunk column and swizzle stay fixed");
  static constexpr int kKRowB = D * KB / 8;
  static constexpr int kVRowB = D * VB / 8;
  static constexpr int kSbB = kG * 2;
  static constexpr int kKBytes = kTK * kKRowB;
  static constexpr int kVBytes = kTK * kVRowB;
  static constexpr int kSbBytes = kTK * kSbB;
  static constexpr int kRowPlanes = kChan ? 2 : 4;        // per-row f16 planes: key (not kChan) and value s, b
  static constexpr int kMaxOut = D / 16;                  // kChan: outlier channels per block read (cuda::kchan_tc_format)
  // kChan: the tile's block key scale and bias rows, then its outlier channels' refinement codes [kMaxOut][32].
  static constexpr int kKBlkB = kChan ? 2 * D * 2 + kMaxOut * 32 : 0;
  static constexpr int kStageB = (kKBytes + kVBytes + kRowPlanes * kSbBytes + kKBlkB + 15) / 16 * 16;
  static constexpr int kHalfOff = kF16Stages * kStageB;   // f16 tiles: 2 buffers × (keys [TK][D], values [TK][D])
  static constexpr int kTileH = kTK * kRowB;              // bytes of one f16 [TK][D] tile
  static constexpr int kQS = D + 8;                       // q̃ row stride in halves (16-byte pad: ldmatrix conflict-free)
  static constexpr int kQOff = kHalfOff + 2 * 2 * kTileH;
  static constexpr int kQWarpB = kRowsPerWarp * kQS * 2;
  static constexpr int kRowOff = kQOff + W * kQWarpB;     // Eq per row, int
  static constexpr int kSmem = kRowOff + kRowsPerCta * 4;
  static_assert(kStageB % 16 == 0 && kHalfOff % 16 == 0 && kQOff % 16 == 0, "16-byte areas");
  static_assert(kSmem <= 227 * 1024, "one CTA fits an SM");
};

// Two codes c_lo | c_hi << 16 (each < 1024) dequantized: fl16(s·c + b) for both (the exact f16 codes, then one fused
// multiply-add, one rounding).
__device__ __forceinline__ uint32_t dequant_h2(uint32_t two_codes, __half2 s2, __half2 b2) {
  return h2_bits(__hfma2(bits_h2(codes_to_h2(two_codes)), s2, b2));
}
// 8 codes of 4 bits (word x: dim e at nibble e) → 4 dequantized f16 pairs.
__device__ __forceinline__ uint4 dequant8_u4(uint32_t x, __half2 s2, __half2 b2) {
  const uint32_t xs = x >> 4;
  uint32_t h[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    h[k] = dequant_h2(u4_pair(x, xs, k), s2, b2);
  return make_uint4(h[0], h[1], h[2], h[3]);
}
// 8 codes of 8 bits (words x0, x1: dim e at byte e) → 4 dequantized f16 pairs.
__device__ __forceinline__ uint4 dequant8_u8(uint32_t x0, uint32_t x1, __half2 s2, __half2 b2) {
  return make_uint4(dequant_h2(__byte_perm(x0, 0u, 0x4140u), s2, b2), dequant_h2(__byte_perm(x0, 0u, 0x4342u), s2, b2),
                    dequant_h2(__byte_perm(x1, 0u, 0x4140u), s2, b2), dequant_h2(__byte_perm(x1, 0u, 0x4342u), s2, b2));
}
// 8 codes of 3 bits (24 bits: dim e at bits 3e .. 3e + 2) → 4 dequantized f16 pairs.
__device__ __forceinline__ uint4 dequant8_u3(uint32_t x, __half2 s2, __half2 b2) {
  uint32_t h[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) h[e] = dequant_h2(u3_pair(x, e), s2, b2);
  return make_uint4(h[0], h[1], h[2], h[3]);
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) { return h2_bits(__floats2half2_rn(lo, hi)); }

// kChan: tiles lie inside one block of 64 positions (TK divides 64 and every tile starts at a multiple of TK: a
// window start is rounded down to its block, the rows' masks do the rest); a quantized block's tile is dequantized
// with the block's per-channel scales, k̃ = fl16(s_d·c + b_d), and the window's tile (positions from 64·⌊length/64⌋)
// from its bf16 rows, k̃ = fl16(k) (exact within the f16 range).
template <int D, int KB, int VB, int W, bool kChan>
__global__ void __launch_bounds__(32 * W, 1) attention_prefill_f16_kernel(PrefillParams p) {
  using C = F16Cfg<D, KB, VB, W, kChan>;
  constexpr int G = C::kG, TK = C::kTK, NT = C::kNT;
  constexpr int kThreads = C::kThreads, kRowsPerWarp = C::kRowsPerWarp;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  extern __shared__ float4 f16_smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(f16_smem4);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  __half* qh = reinterpret_cast<__half*>(smem + C::kQOff + warp * C::kQWarpB);  // [16][kQS]
  int* row_e = reinterpret_cast<int*>(smem + C::kRowOff);                       // [rows per CTA]

  const int bg = blockIdx.y, b = bg / p.Hkv, g = bg % p.Hkv;
  const int qblock = p.qblocks - 1 - static_cast<int>(blockIdx.x / static_cast<unsigned>(p.splits));
  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.splits));
  pdl::wait();  // q, the cache and d_length come from earlier kernels
  pdl::launch_dependents();
  int64_t kL = p.kL_bound;
  if (p.d_length) kL = max(static_cast<int64_t>(0), min(static_cast<int64_t>(*p.d_length), p.kL_bound));
  const int R = p.R, rb0 = qblock * C::kRowsPerCta;
  const int rlast = min(rb0 + C::kRowsPerCta, R) - 1;
  int64_t lo = 0, hi = kL;
  if (p.causal) {
    const int64_t pos_first = kL - p.L + rb0 / p.rep, pos_last = kL - p.L + rlast / p.rep;
    hi = min(kL, pos_last + 1);
    if (p.window > 0) lo = max(static_cast<int64_t>(0), pos_first - p.window + 1);
  }
  if constexpr (kChan) lo -= lo % 64;  // tiles inside blocks
  const int64_t full_blocks = kChan ? kL / 64 : 0;  // kChan: blocks [0, full_blocks) are quantized
  const int64_t c0 = max(lo, static_cast<int64_t>(split) * p.chunk);
  const int64_t c1 = min(hi, static_cast<int64_t>(split + 1) * p.chunk);
  const int n_keys = static_cast<int>(max(static_cast<int64_t>(0), c1 - c0));
  const int n_tiles = (n_keys + TK - 1) / TK;
  const int64_t krow0 = static_cast<int64_t>(bg) * p.cap_k;
  const int64_t vrow0 = static_cast<int64_t>(bg) * p.cap_v;

  // Raw copies of tile t into stage t % 2 (rows past c1 zero-filled: code 0, scale 0, bias 0 → k̃ = ṽ = 0), one
  // commit group (an empty one past the last tile keeps the count uniform for cp_wait).
  constexpr int kSbRowW = C::kSbB / 4;
  auto issue = [&](int t) {
    if (t >= n_tiles) {
      cp_commit();
      return;
    }
    const int64_t t0 = c0 + static_cast<int64_t>(t) * TK;
    const int nvalid = static_cast<int>(min(static_cast<int64_t>(TK), c1 - t0));
    uint8_t* st = smem + (t % kF16Stages) * C::kStageB;
    const uint8_t* kt = p.kc + (krow0 + t0) * C::kKRowB;
    const uint8_t* vt = p.vc + (vrow0 + t0) * C::kVRowB;
#pragma unroll
    for (int c = tid; c < C::kKBytes / 16; c += kThreads) {
      const bool ok = c / (C::kKRowB / 16) < nvalid;
      cp_async16(st + c * 16, ok ? kt + c * 16 : kt, ok);
    }
#pragma unroll
    for (int c = tid; c < C::kVBytes / 16; c += kThreads) {
      const bool ok = c / (C::kVRowB / 16) < nvalid;
      cp_async16(st + C::kKBytes + c * 16, ok ? vt + c * 16 : vt, ok);
    }
    const uint8_t* const sbt[4] = {p.ks + (krow0 + t0) * C::kSbB, p.kb + (krow0 + t0) * C::kSbB,
                                   p.vs + (vrow0 + t0) * C::kSbB, p.vb + (vrow0 + t0) * C::kSbB};
#pragma unroll
    for (int pl = 0; pl < C::kRowPlanes; ++pl)
#pragma unroll
      for (int w = tid; w < C::kSbBytes / 4; w += kThreads) {
        const bool ok = w / kSbRowW < nvalid;
        const uint8_t* src = sbt[pl + 4 - C::kRowPlanes];
        cp_async4(st + C::kKBytes + C::kVBytes + pl * C::kSbBytes + w * 4, ok ? src + w * 4 : src, ok);
      }
    if constexpr (kChan) {
      // The tile's block: its key scale row and bias row (f16 [D] each), when it is quantized.
      const int64_t blk = t0 / 64;
      if (blk < full_blocks) {
        const int64_t off = (static_cast<int64_t>(bg) * p.kblocks + blk) * D * 2;
        for (int c = tid; c < D / 4; c += kThreads) {  // 16-byte chunks: D / 8 per row, two rows
          const int pl = c / (D / 8), ch = c % (D / 8);
          cp_async16(st + C::kKBytes + C::kVBytes + C::kRowPlanes * C::kSbBytes + pl * D * 2 + ch * 16,
                     (pl ? p.kb : p.ks) + off + ch * 16, true);
        }
        const int64_t ooff = (static_cast<int64_t>(bg) * p.kblocks + blk) * p.outliers * 32;
        for (int c = tid; c < p.outliers * 2; c += kThreads)  // outlier codes: 32 bytes per channel
          cp_async16(st + C::kKBytes + C::kVBytes + C::kRowPlanes * C::kSbBytes + 4 * D + c * 16, p.ocodes + ooff + c * 16,
                     true);
      }
    }
    cp_commit();
  };
  if (n_tiles > 0) {
    issue(0);
    issue(1);
  }

  // ---- queries: warp w writes q̃ of its 16 rows (float4 per lane) and each row's Eq ----
  constexpr int kQ4 = D / 128;
  constexpr int kBatch = 8;
#pragma unroll 1
  for (int j0 = 0; j0 < kRowsPerWarp; j0 += kBatch) {
    float4 qv[kBatch][kQ4];
#pragma unroll
    for (int jj = 0; jj < kBatch; ++jj)
      load_q_row<D>(p.q, b, g, p.Hq, p.L, p.rep, rb0 + warp * kRowsPerWarp + j0 + jj, R, lane, qv[jj]);
#pragma unroll
    for (int jj = 0; jj < kBatch; ++jj) {
      const int j = j0 + jj;
      float mx = 0.0f;
#pragma unroll
      for (int u = 0; u < kQ4; ++u) {
        const float4 v = qv[jj][u];
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // max|q|·2^Eq ∈ [2^14, 2^15): q_exponent gives the exponent for [2^20, 2^21).
      const int E = mx > 0.0f ? q_exponent(mx) - 6 : 0;
      if (lane == 0) row_e[warp * kRowsPerWarp + j] = E;
#pragma unroll
      for (int u = 0; u < kQ4; ++u) {
        const float4 v = qv[jj][u];
        const uint2 h = make_uint2(pack_h2(mul_pow2(v.x, E), mul_pow2(v.y, E)),
                                   pack_h2(mul_pow2(v.z, E), mul_pow2(v.w, E)));
        *reinterpret_cast<uint2*>(qh + j * C::kQS + 4 * (lane + 32 * u)) = h;
      }
    }
  }
  __syncwarp();

  // This lane's rows h = 0 (gid), 1 (gid + 8): the score factor (never 0, so that −inf·zmul stays −inf; a factor
  // below 2^-126 only arises for |q| < 2^-100, whose scores round to 0 either way) and the visible keys [vlo, vhi)
  // relative to c0.
  float zmul[2];
  int vlo[2], vhi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rw = warp * kRowsPerWarp + gid + 8 * h, r = rb0 + rw;
    zmul[h] = fmaxf(mul_pow2(p.scale_log2, -row_e[rw]), 1.17549435e-38f);
    prefill_row_keys(p, kL, c0, c1, n_keys, r, vlo[h], vhi[h]);
  }
  int ulo, uhi, ilo, ihi;
  warp_key_bounds(vlo, vhi, ulo, uhi, ilo, ihi);

  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.0f, 0.0f};
  float acc[C::kDT][4];
#pragma unroll
  for (int dt = 0; dt < C::kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;

  // Dequantization of tile t (raw stage t % 2) into f16 buffer t % 2 by the whole CTA: 16-byte output chunks (8 dims
  // of one key, inside one 64-dim group). Thread → chunk column ch = tid % kChunks (fixed) and keys tid / kChunks +
  // i·kKeyStep, so the column, its group, its swizzled position and the V3 bit offset are per-thread constants.
  const int dq_ch = tid % C::kChunks, dq_key0 = tid / C::kChunks, dq_grp = dq_ch / 8;
  const int dq_col = dq_ch ^ (dq_key0 & 7);  // key & 7 is the same for all of the thread's keys (kKeyStep % 8 == 0)
  auto dequant_tile = [&](int t) {
    const uint8_t* st = smem + (t % kF16Stages) * C::kStageB;
    const __half* sb0 = reinterpret_cast<const __half*>(st + C::kKBytes + C::kVBytes);
    const __half* sks = sb0 + dq_grp;
    const __half* skb = sks + TK * G;
    const __half* svs = sb0 + (C::kRowPlanes - 2) * TK * G + dq_grp;
    const __half* svb = svs + TK * G;
    uint4* kh = reinterpret_cast<uint4*>(smem + C::kHalfOff + (t % 2) * 2 * C::kTileH) + dq_col;
    uint4* vh = reinterpret_cast<uint4*>(smem + C::kHalfOff + (t % 2) * 2 * C::kTileH + C::kTileH) + dq_col;
    const uint32_t* kw = reinterpret_cast<const uint32_t*>(st) + dq_ch * (KB == 4 ? 1 : 2);
    // kChan: this thread's 8 dims' scale and bias pairs of the tile's block, or the window's bf16 rows.
    const int64_t t0a = c0 + static_cast<int64_t>(t) * TK;
    const bool win = kChan && t0a >= full_blocks * 64;
    uint4 cs = make_uint4(0u, 0u, 0u, 0u), cb = cs;
    // Outlier channels among this thread's 8 dims: bit e of omask for dim 8ch + e, its channel slot o in bits 5e ..
    // 5e + 4 of oslot; their codes in the stage (ocode: [o][32], position j at byte j/2, nibble j%2).
    uint32_t omask = 0;
    uint64_t oslot = 0;
    const uint8_t* ocode = nullptr;
    if constexpr (kChan) {
      if (!win) {
        const uint4* blk = reinterpret_cast<const uint4*>(sb0 + C::kRowPlanes * TK * G);
        cs = blk[dq_ch];
        cb = blk[D / 8 + dq_ch];
        if (p.outliers > 0) {
          const uint16_t* oi = p.oindex + (static_cast<int64_t>(bg) * p.kblocks + t0a / 64) * p.outliers;
          for (int o = 0; o < p.outliers; ++o) {
            const int d = __ldg(oi + o);
            if ((d >> 3) == dq_ch) {
              omask |= 1u << (d & 7);
              oslot |= static_cast<uint64_t>(o) << (5 * (d & 7));
            }
          }
          ocode = reinterpret_cast<const uint8_t*>(sb0 + C::kRowPlanes * TK * G) + 4 * D;
        }
      }
    }
#pragma unroll
    for (int key = dq_key0; key < TK; key += C::kKeyStep) {
      if constexpr (kChan) {
        const uint32_t* w = kw + key * (C::kKRowB / 4);
        if (win) {
          // A window row: 8 bf16 of dims 8ch .. 8ch + 7 from global memory (zeros past c1), to f16.
          const int64_t j = t0a + key;
          uint4 x = make_uint4(0u, 0u, 0u, 0u);
          if (j < c1) x = *reinterpret_cast<const uint4*>(p.residual + (static_cast<int64_t>(bg) * 64 + (j & 63)) * D + 8 * dq_ch);
          const uint32_t xw[4] = {x.x, x.y, x.z, x.w};
          uint32_t h[4];
#pragma unroll
          for (int k = 0; k < 4; ++k)
            h[k] = pack_h2(__uint_as_float(xw[k] << 16), __uint_as_float(xw[k] & 0xffff0000u));
          kh[key * C::kChunks] = make_uint4(h[0], h[1], h[2], h[3]);
        } else {
          const uint32_t sw[4] = {cs.x, cs.y, cs.z, cs.w}, bw[4] = {cb.x, cb.y, cb.z, cb.w};
          uint32_t pair[4];  // codes of dims 8ch + 2k, + 1 as c_lo | c_hi << 16
          if constexpr (KB == 5) {
            // 40 bits from byte 5ch of the row (two words; the row's last chunk still reads inside it)
            const uint32_t* rw = reinterpret_cast<const uint32_t*>(st + key * C::kKRowB);
            const int byte = 5 * dq_ch, wi = byte >> 2, sh = 8 * (byte & 3);
            const uint64_t x = ((static_cast<uint64_t>(rw[wi + 1]) << 32) | rw[wi]) >> sh;
#pragma unroll
            for (int k = 0; k < 4; ++k)
              pair[k] = static_cast<uint32_t>((x >> (10 * k)) & 31u) | (static_cast<uint32_t>((x >> (10 * k + 5)) & 31u) << 16);
          } else {
            const uint32_t x = w[0], xs = x >> 4;
#pragma unroll
            for (int k = 0; k < 4; ++k) pair[k] = u4_pair(x, xs, k);
          }
          uint32_t h[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) h[k] = dequant_h2(pair[k], bits_h2(sw[k]), bits_h2(bw[k]));
          if (omask != 0) {
            // An outlier channel: k̃ = fl16(fl16(s·c + b) + (|s|/15)·(r − 7.5)) (quant::outlier_refinement).
            const int j = static_cast<int>(t0a & 63) + key;  // the key's position in its block
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              if ((omask >> e) & 1u) {
                const int o = static_cast<int>((oslot >> (5 * e)) & 31u);
                const float r = static_cast<float>((ocode[o * 32 + j / 2] >> (4 * (j & 1))) & 15u);
                const float sd = __half2float(__ushort_as_half(static_cast<unsigned short>(sw[e >> 1] >> (16 * (e & 1)))));
                const float kv = __half2float(__ushort_as_half(static_cast<unsigned short>(h[e >> 1] >> (16 * (e & 1)))));
                const uint32_t nh = __half_as_ushort(__float2half_rn(kv + (fabsf(sd) / 15.0f) * (r - 7.5f)));
                h[e >> 1] = (e & 1) ? ((h[e >> 1] & 0xffffu) | (nh << 16)) : ((h[e >> 1] & 0xffff0000u) | nh);
              }
            }
          }
          kh[key * C::kChunks] = make_uint4(h[0], h[1], h[2], h[3]);
        }
      } else {
        const __half2 s2 = __half2half2(sks[key * G]), b2 = __half2half2(skb[key * G]);
        const uint32_t* w = kw + key * (C::kKRowB / 4);
        kh[key * C::kChunks] = KB == 4 ? dequant8_u4(w[0], s2, b2) : dequant8_u8(w[0], w[1], s2, b2);
      }
      {
        const __half2 s2 = __half2half2(svs[key * G]), b2 = __half2half2(svb[key * G]);
        const uint32_t* vw = reinterpret_cast<const uint32_t*>(st + C::kKBytes + key * C::kVRowB);
        if constexpr (VB == 5) {
          // 40 bits from byte 5ch of the row (the row's last chunk still reads inside it)
          const int byte = 5 * dq_ch, wi = byte >> 2, sh = 8 * (byte & 3);
          const uint64_t x = ((static_cast<uint64_t>(vw[wi + 1]) << 32) | vw[wi]) >> sh;
          uint32_t h[4];
#pragma unroll
          for (int k = 0; k < 4; ++k)
            h[k] = dequant_h2(static_cast<uint32_t>((x >> (10 * k)) & 31u) |
                                  (static_cast<uint32_t>((x >> (10 * k + 5)) & 31u) << 16),
                              s2, b2);
          vh[key * C::kChunks] = make_uint4(h[0], h[1], h[2], h[3]);
        } else if constexpr (VB == 4) {
          vh[key * C::kChunks] = dequant8_u4(vw[dq_ch], s2, b2);
        } else {
          const int bit = 24 * dq_ch;  // dims 8ch .. 8ch + 7: bits bit .. bit + 23 of the row
          const int w0 = bit >> 5, sh = bit & 31;
          const uint32_t hiw = sh > 8 ? vw[w0 + 1] : 0u;  // the next word only when the 24 bits cross into it
          vh[key * C::kChunks] = dequant8_u3(__funnelshift_r(vw[w0], hiw, sh), s2, b2);
        }
      }
    }
  };
  if (n_tiles > 0) {
    cp_wait<1>();
    __syncthreads();
    dequant_tile(0);
  }

  // Per-lane ldmatrix address terms, fixed across tiles (bytes). q̃ (A): rows lr + 8·(lm & 1), dims 8·(lm >> 1),
  // + 32 bytes per 16-dim step. k̃ (B, non-transposed): keys 8·np + lr + 8·(lm >> 1), chunk 2kd + (lm & 1) swizzled
  // by key & 7 = lr, which only touches the chunk's low 3 bits: ((2·(kd & 3) + (lm & 1)) ^ lr) + 8·(kd >> 2).
  // ṽ (B, transposed): keys 16·k16 + 8·(lm & 1) + lr, chunk nd + (lm >> 1): ((nd & 7) + (lm >> 1)) ^ lr + 8·(nd >> 3).
  const int lm = lane >> 3, lr = lane & 7;
  const uint32_t q_addr = smem_addr(qh) + static_cast<uint32_t>(((lr + 8 * (lm & 1)) * C::kQS + 8 * (lm >> 1)) * 2);
  uint32_t k_off[4], v_off[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    k_off[j] = static_cast<uint32_t>((lr + 8 * (lm >> 1)) * C::kRowB + (((2 * j + (lm & 1)) ^ lr) * 16));
    v_off[j] = static_cast<uint32_t>((lr + 8 * (lm & 1)) * C::kRowB + (((2 * j + (lm >> 1)) ^ lr) * 16));
  }
  const uint32_t half_base = smem_addr(smem + C::kHalfOff);

  for (int t = 0; t < n_tiles; ++t) {
    cp_wait<0>();
    __syncthreads();  // tile t + 1 landed; tile t dequantized; every warp is done with tile t − 1
    issue(t + 2);
    if (t + 1 < n_tiles) dequant_tile(t + 1);
    const int t0 = t * TK;
    if (t0 >= uhi || t0 + TK <= ulo) continue;
    const bool need_mask = !(t0 >= ilo && t0 + TK <= ihi);
    const uint32_t kb = half_base + static_cast<uint32_t>((t % 2) * 2 * C::kTileH);
    const uint32_t vb = kb + C::kTileH;

    // ---- raw scores sc[nt][e] (q̃·k̃): e = (row gid, key 8nt + 2tig), (gid, +1), (gid + 8, 2tig), (gid + 8, +1) ----
    float sc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = 0.0f;
#pragma unroll
    for (int kd = 0; kd < C::kDK; ++kd) {
      uint32_t a[4];
      ldmatrix_x4(a, q_addr + 32 * kd);
#pragma unroll
      for (int np = 0; np < NT; np += 2) {
        uint32_t bk[4];  // matrices: (nt, lo dims), (nt, hi dims), (nt + 1, lo), (nt + 1, hi)
        ldmatrix_x4(bk, kb + k_off[kd & 3] + 128 * (kd >> 2) + 8 * np * C::kRowB);
        mma_f16(sc[np], a, bk[0], bk[1]);
        mma_f16(sc[np + 1], a, bk[2], bk[3]);
      }
    }
    // The softcap acts on the scores in log2 units (raw·zmul), before the mask; the softmax then takes them as they
    // are (factor 1).
    float zm[2] = {zmul[0], zmul[1]};
    if (p.softcap_log2 > 0.0f) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sc[nt][e] = capped_score(sc[nt][e] * zmul[e >> 1], p.softcap_log2, p.inv_softcap_log2);
      zm[0] = zm[1] = 1.0f;
    }
    if (need_mask) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = t0 + nt * 8 + 2 * tig + (e & 1), h = e >> 1;
          if (!(j >= vlo[h] && j < vhi[h])) sc[nt][e] = kNegInf;
        }
    }

    // ---- online softmax in log2 units: score = raw·zm (zm > 0, so the row maximum scales too) ----
    float mnew[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tmax = kNegInf;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) tmax = fmaxf(tmax, fmaxf(sc[nt][2 * h], sc[nt][2 * h + 1]));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
      const float mn = fmaxf(m_run[h], tmax * zm[h]);
      const float mu = mn == kNegInf ? 0.0f : mn;
      alpha[h] = ex2(m_run[h] - mu);
      m_run[h] = mn;
      mnew[h] = mu;
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int dt = 0; dt < C::kDT; ++dt) {
        acc[dt][0] *= alpha[0];
        acc[dt][1] *= alpha[0];
        acc[dt][2] *= alpha[1];
        acc[dt][3] *= alpha[1];
      }
      l_run[0] *= alpha[0];
      l_run[1] *= alpha[1];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = ex2(fmaf(sc[nt][e], zm[e >> 1], -mnew[e >> 1]));
      l_run[0] += sc[nt][0] + sc[nt][1];
      l_run[1] += sc[nt][2] + sc[nt][3];
    }

    // ---- P·V: A = p̃ of 16 keys (two n-tiles), B = ṽ (16 keys × 8 dims) by ldmatrix.trans ----
#pragma unroll
    for (int k16 = 0; k16 < C::kK16; ++k16) {
      const float* p0 = sc[2 * k16];
      const float* p1 = sc[2 * k16 + 1];
      const uint32_t a[4] = {pack_h2(p0[0], p0[1]), pack_h2(p0[2], p0[3]), pack_h2(p1[0], p1[1]),
                             pack_h2(p1[2], p1[3])};
#pragma unroll
      for (int nd = 0; nd < C::kDT; nd += 2) {
        uint32_t bv[4];  // matrices: (keys lo, dims nd), (keys hi, nd), (lo, nd + 1), (hi, nd + 1)
        ldmatrix_x4_trans(bv, vb + v_off[(nd & 7) >> 1] + 128 * (nd >> 3) + 16 * k16 * C::kRowB);
        mma_f16(acc[nd], a, bv[0], bv[1]);
        mma_f16(acc[nd + 1], a, bv[2], bv[3]);
      }
    }
  }
  cp_wait<0>();

  // ---- epilogue: l over the quad; rows gid, gid + 8; dims 8dt + 2tig, + 1 ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = rb0 + warp * kRowsPerWarp + gid + 8 * h;
    if (r >= R) continue;
    const int i = r / p.rep, hq = g * p.rep + r % p.rep;
    const int64_t orow = (static_cast<int64_t>(b) * p.Hq + hq) * p.L + i;
    const float l = l_run[h];
    if (p.splits == 1) {
      float* dst = p.out + orow * D + 2 * tig;
#pragma unroll
      for (int dt = 0; dt < C::kDT; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8) =
            l > 0.0f ? make_float2(acc[dt][2 * h] / l, acc[dt][2 * h + 1] / l) : make_float2(0.f, 0.f);
    } else {
      float* dst = p.part_o + (orow * p.splits + split) * D + 2 * tig;
#pragma unroll
      for (int dt = 0; dt < C::kDT; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(acc[dt][2 * h], acc[dt][2 * h + 1]);
      if (tig == 0)
        reinterpret_cast<float2*>(p.part_ml)[orow * p.splits + split] =
            make_float2(m_run[h] == kNegInf ? m_run[h] : m_run[h] * 0.69314718055994531f, l);  // log2 → ln
    }
  }
}

// D128 CTA size: 12 warps (192 query rows: a third more warps per SM to hide the mma and softmax latencies, each
// tile's dequantization shared by 12 warps; job 48: 652 vs 748 µs at L4096) when the (b, KV head, query block) CTAs
// make at least two waves, else 8 (128 rows: more CTAs for a short prompt or one 512-row chunk of a long one; job 48:
// L512 33.4 vs 36.8 µs, and the model's chunked prefill was faster with 8). $CIDER_ATTN_PREFILL_F16_WARPS (read at
// every call) = auto (default) | 8 | 12. D256 always runs 8 (its 32-chunk rows with 384 threads would move a thread's
// swizzle from key to key).
int f16_warps_d128(const kernels::AttentionArgs& a) {
  const std::string w = env_word("CIDER_ATTN_PREFILL_F16_WARPS", "auto", {"auto", "8", "12"}, "cuda.attention");
  if (w != "auto") return w == "12" ? 12 : 8;
  const int64_t R = a.Hq / a.keys.H * a.L;
  const int64_t ctas12 = a.B * a.keys.H * ((R + 191) / 192);
  return ctas12 >= 2 * static_cast<int64_t>(sm_count()) ? 12 : 8;
}

// Calls f.template operator()<D, KB, VB, W>() for the configuration of a (eligible: prefill_tc_eligible).
template <typename F>
auto dispatch_f16(const kernels::AttentionArgs& a, F&& f) {
  const bool d128 = a.keys.dim == 128, k8 = a.keys.bits == 8;
  if (a.keys.layout == 1 && a.keys.bits == 5 && a.values.bits == 5) {  // per-channel keys: K5V5
    if (!d128) return f.template operator()<256, 5, 5, 8, true>();
    return f16_warps_d128(a) == 12 ? f.template operator()<128, 5, 5, 12, true>()
                                   : f.template operator()<128, 5, 5, 8, true>();
  }
  if (a.keys.layout == 1 && a.keys.bits == 5) {  // per-channel keys: K5V4
    if (!d128) return f.template operator()<256, 5, 4, 8, true>();
    return f16_warps_d128(a) == 12 ? f.template operator()<128, 5, 4, 12, true>()
                                   : f.template operator()<128, 5, 4, 8, true>();
  }
  if (a.keys.layout == 1) {  // per-channel keys: K4V4
    if (!d128) return f.template operator()<256, 4, 4, 8, true>();
    return f16_warps_d128(a) == 12 ? f.template operator()<128, 4, 4, 12, true>()
                                   : f.template operator()<128, 4, 4, 8, true>();
  }
  if (d128) {
    if (f16_warps_d128(a) == 12)
      return k8 ? f.template operator()<128, 8, 4, 12, false>() : f.template operator()<128, 4, 3, 12, false>();
    return k8 ? f.template operator()<128, 8, 4, 8, false>() : f.template operator()<128, 4, 3, 8, false>();
  }
  return k8 ? f.template operator()<256, 8, 4, 8, false>() : f.template operator()<256, 4, 3, 8, false>();
}

// Lets the kernel have its shared memory on the current GPU; returns the resident CTAs per SM (the same on every GPU
// of the host).
template <int D, int KB, int VB, int W, bool kChan>
int f16_ctas_per_sm() {
  const void* fn = reinterpret_cast<const void*>(&attention_prefill_f16_kernel<D, KB, VB, W, kChan>);
  constexpr int smem = F16Cfg<D, KB, VB, W, kChan>::kSmem;
  allow_dynamic_smem(fn, smem, "cuda.attention");
  static int n = [fn] {
    int blocks = 0;
    CIDER_CUDA_CHECK("cuda.attention", cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, 32 * W, smem));
    return std::max(blocks, 1);
  }();
  return n;
}

}  // namespace

PrefillF16Shape prefill_f16_shape(const kernels::AttentionArgs& a) {
  PrefillF16Shape s;
  dispatch_f16(a, [&]<int D, int KB, int VB, int W, bool kChan>() {
    using C = F16Cfg<D, KB, VB, W, kChan>;
    s.tile_keys = C::kTK;
    s.ctas_per_sm = f16_ctas_per_sm<D, KB, VB, W, kChan>();
    s.rows_per_cta = C::kRowsPerCta;
    s.smem = static_cast<size_t>(C::kSmem);
    return 0;
  });
  return s;
}

void prefill_f16_launch(const kernels::AttentionArgs& a, const PrefillTcPlan& pl, const int32_t* d_length,
                        float* part_o, float* part_ml, void* stream) {
  PrefillParams p{};
  fill_tc_params(p, a, d_length, part_o, part_ml, pl.splits, pl.chunk);
  p.qblocks = pl.qblocks;
  p.residual = static_cast<const uint16_t*>(a.keys.residual);
  p.kblocks = a.keys.blocks;
  check(static_cast<int64_t>(pl.qblocks) * pl.splits <= 0x7fffffffLL, ErrorCode::kOutOfRange, "cuda.attention",
        "too many query blocks × splits: ", static_cast<int64_t>(pl.qblocks) * pl.splits);
  const dim3 grid(static_cast<unsigned>(pl.qblocks * pl.splits), static_cast<unsigned>(a.B * a.keys.H));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const cudaError_t err = dispatch_f16(a, [&]<int D, int KB, int VB, int W, bool kChan>() {
    (void)f16_ctas_per_sm<D, KB, VB, W, kChan>();
    return pdl::launch(attention_prefill_f16_kernel<D, KB, VB, W, kChan>, grid, dim3(32 * W),
                       static_cast<size_t>(F16Cfg<D, KB, VB, W, kChan>::kSmem), s, p);
  });
  CIDER_CUDA_CHECK("cuda.attention", err);
}

}  // namespace cider::cuda::detail
