// cider/kernels/cuda/attention_prefill_tc.cu — prefill attention (rep·L > 8 query rows per KV head) over a K4/V3 or
// K8/V4 g64 cache (f16 scales, D 128/256) on the tensor cores: one kernel template on (D, key bits, value bits).
// Contract: kernels/cuda/cuda_api.h (cuda::attention); chosen by attention.cu (attention_prefill_tc.h); design,
// floors and measurements: docs/cuda/attention.md ("Prefill on the tensor cores").
//
// Work item: one CTA (4 warps) = (b, KV head g) × a block of 64 query rows × one split [c0, c1) of the keys. The
// R = rep·L rows of a KV head are ordered r = i·rep + rr (position i, head g·rep + rr) as in the other kernels, so a
// block is a run of positions and its causal / window key range is one interval. Warp w owns rows 16w .. 16w + 15
// of the block (the mma M). The CTA walks the keys in tiles of TK (64 for D128, 16 for D256) through a 3-stage cp.async
// buffer shared by the 4 warps; the CTA unpacks each tile's value codes once into
// shared memory as f16 [TK][D] (exact: magic-exponent bit tricks; 16-byte chunks XOR-swizzled by key & 7 for
// ldmatrix), double-buffered, so one CTA barrier per tile suffices: iteration t copies tile t + 2, unpacks tile t + 1
// and does the math of tile t. Every warp whose rows see some key of the tile computes:
//
// Scores (exact integer dot products, as attention_tc.cu): per row the query is scaled by 2^E (E from the row's
// max |q|), rounded to an integer Q with |Q| ≤ 2^21 and written as three signed 8-bit digits Q = d2·2^16 + d1·2^8 + d0.
// The digits are the s8 A operand (M = 16 query rows, K = 32 dims), the key codes the u8 B operand (K = 32 dims,
// N = 8 keys): mma.m16n8k32 .s8.u8 → s32, three accumulators per (8 keys, group), combined exactly
//   Z_g = (C2·256 + C1)·256 + C0 (K4: |Z| < 2^31);  K8: C2·65536 + (C1·256 + C0) in float32 (|Z| up to 2^35),
//   score·log2e = scale·log2e · Σ_g ( s_g·2^-E·Z_g + b_g·Σ_{k∈g} q_k ).
// K4: the dim ↔ k map is free inside a group: k-step kk, lane tig reads key word w = 4kk + tig (dims 8w .. 8w + 7);
// its even nibbles are B's k = 4tig.., its odd nibbles k = 16 + 4tig.. (two ops per 8 codes); the query fragment is
// built to match (byte_perm of the digits of dims 8w, 8w+2, .. and 8w+1, 8w+3, ..). K8: the codes as stored.
// The query digits live per warp in shared memory ([3][16 rows][D + pad] bytes); D128 keeps the fragments in
// registers (48), D256 rebuilds them from shared memory per use (its 128 accumulator registers leave no room).
// Softmax in base 2 per row (rows gid and gid + 8 of the lane's C fragment: max over the quad by two shuffles),
// ex2.approx, online (FA2): the rescale is skipped when no row's maximum moved.
// A softcap maps each score (log2 units) to c2·tanhf(score/c2), c2 = cap·log2e, before the mask.
// Values: out[d] = Σ_t p_t·s_t·c_td + Σ_t p_t·b_t per value group. The score C fragments of two 8-key n-tiles are the
// A fragment (16 rows × 16 keys) of the f16 mma without any data movement; A = W_g = p·s_g (value scale of the key)
// split into f16 hi + lo (≈ 22-bit weights; |W| ≤ |s| ≤ 65504), B = the f16 value codes (16 keys × 8 dims) by
// ldmatrix.x4.trans from the unpacked tile; mma.m16n8k16 f16 → f32. The bias sums Σ p·b_g on the CUDA cores.
// Masking: each lane's two rows have their visible interval; a tile outside the warp's union is skipped, a tile
// inside the intersection needs no mask, only the others (the causal diagonal, window edges, tails) are masked.
// Splits (plan: when B·Hkv·query blocks does not fill the SMs, e.g. a few new tokens against a long cache): every
// CTA writes its rows' partial (unnormalized o, m in natural-log units, l; zeros / (−inf, 0) when it saw nothing) in
// attention.cu's layout and attention.cu's merge kernel combines them. Blocks are launched heaviest first (the last
// query blocks of a causal prefill see the most keys).
// The small helpers below (cp.async, the query exponent and digits, the key-chunk swizzle) are the same as
// attention_tc.cu's.
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

constexpr int kPfThreads = 128;
constexpr int kPfWarps = 4;
constexpr int kRowsPerWarp = 16;                         // the mma M
constexpr int kRowsPerCta = kPfWarps * kRowsPerWarp;     // 64 query rows per CTA
constexpr int kPfStages = 3;  // raw tiles in flight / in use: t (scores), t + 1 (unpack), t + 2 (copy)
constexpr int64_t kMinSplitKeys = 512;                   // automatic splits: at least this many keys each

template <int D, int KB, int VB>
struct PfCfg {
  static_assert((KB == 4 && VB == 3) || (KB == 8 && VB == 4), "K4V3 or K8V4");
  static_assert(D == 128 || D == 256, "D 128 or 256");
  static constexpr int kG = D / 64;                 // quantization groups per row
  // Keys per tile: D256 holds 128 accumulator registers per lane, so its score tile is 16 keys (32 spill).
  static constexpr int kTK = D == 128 ? 64 : 16;
  static constexpr int kNT = kTK / 8;               // 8-key score n-tiles per tile
  static constexpr int kK16 = kTK / 16;             // 16-key k-steps of P·V per tile
  static constexpr int kKSteps = D / 32;            // 32-dim k-steps of the scores
  static constexpr int kDT = D / 8;                 // 8-dim n-tiles of the output
  static constexpr int kKRowB = D * KB / 8;
  static constexpr int kKRowW = kKRowB / 4;
  static constexpr int kVRowB = D * VB / 8;
  static constexpr int kSbB = kG * 2;               // f16 scales (or biases) per row
  static constexpr int kKBytes = kTK * kKRowB;
  static constexpr int kVBytes = kTK * kVRowB;
  static constexpr int kSbBytes = kTK * kSbB;
  static constexpr int kStageB = kKBytes + kVBytes + 4 * kSbBytes;
  static constexpr int kVhOff = kPfStages * kStageB;  // unpacked values, 2 buffers of [TK][D] f16 (swizzled)
  static constexpr int kVhBytes = kTK * D * 2;
  // Query digits per warp [3][16][kQS] bytes; the row pad makes the fragment reads conflict-free (K4: 8-byte reads,
  // rows 32 bytes apart mod 128; K8: 4-byte reads, rows 16 bytes apart).
  static constexpr int kQS = D + (KB == 4 ? 32 : 16);
  static constexpr int kQWarpB = 3 * kRowsPerWarp * kQS;
  static constexpr int kQOff = kVhOff + 2 * kVhBytes;
  static constexpr int kRowOff = kQOff + kPfWarps * kQWarpB;          // E [64] int, then group sums [64][G] float
  static constexpr int kSmem = kRowOff + kRowsPerCta * 4 + kRowsPerCta * kG * 4;
  static constexpr bool kQRegs = D == 128;  // query fragments in registers (D128; D256 rebuilds them per use)
  static_assert(kStageB % 16 == 0 && kKBytes % 16 == 0 && kVBytes % 16 == 0 && kQOff % 16 == 0, "16-byte areas");
};



// D (16×8 s32) += A (16×32 s8: query digits) · B (32×8 u8: key codes).
__device__ __forceinline__ void mma_s8u8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// W (float) as f16 hi + lo pairs.
__device__ __forceinline__ void split_hi_lo(float w0, float w1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(w0, w1);
  const float2 f = __half22float2(h);
  hi = h2_bits(h);
  lo = h2_bits(__floats2half2_rn(w0 - f.x, w1 - f.y));
}


template <int D, int KB, int VB>
__global__ void __launch_bounds__(kPfThreads, 2)
    attention_prefill_tc_kernel(PrefillParams p) {
  using C = PfCfg<D, KB, VB>;
  constexpr int G = C::kG, TK = C::kTK, NT = C::kNT;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  extern __shared__ float4 pf_smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(pf_smem4);
  uint8_t* qd = smem + C::kQOff + (threadIdx.x >> 5) * C::kQWarpB;
  int* row_e = reinterpret_cast<int*>(smem + C::kRowOff);          // [64]
  float* row_sum = reinterpret_cast<float*>(row_e + kRowsPerCta);  // [64][G]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int bg = blockIdx.y, b = bg / p.Hkv, g = bg % p.Hkv;
  const int qblock = p.qblocks - 1 - static_cast<int>(blockIdx.x / static_cast<unsigned>(p.splits));
  const int split = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.splits));
  pdl::wait();  // q, the cache and d_length come from earlier kernels
  pdl::launch_dependents();
  int64_t kL = p.kL_bound;
  if (p.d_length) kL = max(static_cast<int64_t>(0), min(static_cast<int64_t>(*p.d_length), p.kL_bound));
  const int R = p.R, rb0 = qblock * kRowsPerCta;
  const int rlast = min(rb0 + kRowsPerCta, R) - 1;
  // Keys the block can see (union over its rows), cut to this split.
  int64_t lo = 0, hi = kL;
  if (p.causal) {
    const int64_t pos_first = kL - p.L + rb0 / p.rep, pos_last = kL - p.L + rlast / p.rep;
    hi = min(kL, pos_last + 1);
    if (p.window > 0) lo = max(static_cast<int64_t>(0), pos_first - p.window + 1);
  }
  const int64_t c0 = max(lo, static_cast<int64_t>(split) * p.chunk);
  const int64_t c1 = min(hi, static_cast<int64_t>(split + 1) * p.chunk);
  const int n_keys = static_cast<int>(max(static_cast<int64_t>(0), c1 - c0));
  const int n_tiles = (n_keys + TK - 1) / TK;

  const int64_t krow0 = static_cast<int64_t>(bg) * p.cap_k;
  const int64_t vrow0 = static_cast<int64_t>(bg) * p.cap_v;

  // Copies of tile t into stage t % 2 (rows past c1 zero-filled: finite codes and zero scales), one commit group.
  constexpr int kKRowCh = C::kKRowB / 16, kVRowCh = C::kVRowB / 16, kSbRowW = C::kSbB / 4;
  auto issue = [&](int t) {
    if (t >= n_tiles) {
      cp_commit();  // an empty group keeps the group count uniform for cp_wait
      return;
    }
    const int64_t t0 = c0 + static_cast<int64_t>(t) * TK;
    const int nvalid = static_cast<int>(min(static_cast<int64_t>(TK), c1 - t0));
    uint8_t* st = smem + (t % kPfStages) * C::kStageB;
    const uint8_t* kt = p.kc + (krow0 + t0) * C::kKRowB;
    const uint8_t* vt = p.vc + (vrow0 + t0) * C::kVRowB;
#pragma unroll
    for (int c = tid; c < C::kKBytes / 16; c += kPfThreads) {
      const int r = c / kKRowCh, ch = c % kKRowCh;
      const bool ok = r < nvalid;
      cp_async16(st + r * C::kKRowB + key_chunk_pos<D, KB>(r, ch) * 16, ok ? kt + c * 16 : kt, ok);
    }
#pragma unroll
    for (int c = tid; c < C::kVBytes / 16; c += kPfThreads) {
      const bool ok = c / kVRowCh < nvalid;
      cp_async16(st + C::kKBytes + c * 16, ok ? vt + c * 16 : vt, ok);
    }
    const uint8_t* const sbt[4] = {p.ks + (krow0 + t0) * C::kSbB, p.kb + (krow0 + t0) * C::kSbB,
                                   p.vs + (vrow0 + t0) * C::kSbB, p.vb + (vrow0 + t0) * C::kSbB};
#pragma unroll
    for (int pl = 0; pl < 4; ++pl)
#pragma unroll
      for (int w = tid; w < C::kSbBytes / 4; w += kPfThreads) {
        const bool ok = w / kSbRowW < nvalid;
        cp_async4(st + C::kKBytes + C::kVBytes + pl * C::kSbBytes + w * 4, ok ? sbt[pl] + w * 4 : sbt[pl], ok);
      }
    cp_commit();
  };
  if (n_tiles > 0) {
    issue(0);
    issue(1);
  }

  // ---- queries: warp w prepares its 16 rows (float4 per lane): max |q| and the group sums by shuffles, E, the
  // digits of Q = rint(q·2^E) as bytes in natural dim order to its shared area ----
  constexpr int kQ4 = D / 128;
  constexpr int kBatch = 8;  // rows whose loads are in flight together (one latency per batch, not per row)
#pragma unroll 1
  for (int j0 = 0; j0 < kRowsPerWarp; j0 += kBatch) {
    float4 qv[kBatch][kQ4];
#pragma unroll
    for (int jj = 0; jj < kBatch; ++jj) {
      load_q_row<D>(p.q, b, g, p.Hq, p.L, p.rep, rb0 + warp * kRowsPerWarp + j0 + jj, R, lane, qv[jj]);
    }
#pragma unroll
    for (int jj = 0; jj < kBatch; ++jj) {
      const int j = j0 + jj, rw = warp * kRowsPerWarp + j;
      float mx = 0.0f;
#pragma unroll
      for (int u = 0; u < kQ4; ++u) {
        const float4 v = qv[jj][u];
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        float gs = (v.x + v.y) + (v.z + v.w);  // lanes 0–15: group 2u, lanes 16–31: group 2u + 1
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) gs += __shfl_xor_sync(0xffffffffu, gs, o);
        if ((lane & 15) == 0) row_sum[rw * G + 2 * u + (lane >> 4)] = gs;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const int E = q_exponent(mx);
      if (lane == 0) row_e[rw] = E;
#pragma unroll
      for (int u = 0; u < kQ4; ++u) {
        const int lq = lane + 32 * u;  // dims 4lq .. 4lq + 3
        const float x[4] = {qv[jj][u].x, qv[jj][u].y, qv[jj][u].z, qv[jj][u].w};
        uint32_t dg[4][3];
#pragma unroll
        for (int e = 0; e < 4; ++e) q_digits(static_cast<int>(rintf(mul_pow2(x[e], E))), dg[e]);
#pragma unroll
        for (int d = 0; d < 3; ++d)
          reinterpret_cast<uint32_t*>(qd + (d * kRowsPerWarp + j) * C::kQS)[lq] =
              dg[0][d] | (dg[1][d] << 8) | (dg[2][d] << 16) | (dg[3][d] << 24);
      }
    }
  }
  __syncwarp();

  // The A fragment (rows gid, gid + 8 of the warp; k-step kk; digit d) in the key operand's k order.
  auto qfrag = [&](int kk, int d, uint32_t (&a)[4]) {
    const uint8_t* r0 = qd + (d * kRowsPerWarp + gid) * C::kQS;
    const uint8_t* r1 = r0 + 8 * C::kQS;
    if constexpr (KB == 4) {
      const int w = 4 * kk + tig;  // key word: dims 8w .. 8w + 7
      const uint2 x0 = *reinterpret_cast<const uint2*>(r0 + 8 * w);
      const uint2 x1 = *reinterpret_cast<const uint2*>(r1 + 8 * w);
      a[0] = __byte_perm(x0.x, x0.y, 0x6420);  // dims 8w + 0, 2, 4, 6 (the even nibbles)
      a[1] = __byte_perm(x1.x, x1.y, 0x6420);
      a[2] = __byte_perm(x0.x, x0.y, 0x7531);  // dims 8w + 1, 3, 5, 7 (the odd nibbles)
      a[3] = __byte_perm(x1.x, x1.y, 0x7531);
    } else {
      const uint32_t* w0 = reinterpret_cast<const uint32_t*>(r0);
      const uint32_t* w1 = reinterpret_cast<const uint32_t*>(r1);
      a[0] = w0[8 * kk + tig];  // dims 32kk + 4tig ..
      a[1] = w1[8 * kk + tig];
      a[2] = w0[8 * kk + 4 + tig];  // dims 32kk + 16 + 4tig ..
      a[3] = w1[8 * kk + 4 + tig];
    }
  };
  uint32_t qa[C::kQRegs ? C::kKSteps : 1][3][4];
  if constexpr (C::kQRegs) {
#pragma unroll
    for (int kk = 0; kk < C::kKSteps; ++kk)
#pragma unroll
      for (int d = 0; d < 3; ++d) qfrag(kk, d, qa[kk][d]);
  }

  // This lane's rows h = 0 (gid), 1 (gid + 8): score constants and visible keys [vlo, vhi) relative to c0.
  float zmul[2], bq[G][2];
  int vlo[2], vhi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rw = warp * kRowsPerWarp + gid + 8 * h, r = rb0 + rw;
    zmul[h] = mul_pow2(p.scale_log2, -row_e[rw]);
#pragma unroll
    for (int gi = 0; gi < G; ++gi) bq[gi][h] = row_sum[rw * G + gi] * p.scale_log2;
    prefill_row_keys(p, kL, c0, c1, n_keys, r, vlo[h], vhi[h]);
  }
  int ulo, uhi, ilo, ihi;
  warp_key_bounds(vlo, vhi, ulo, uhi, ilo, ihi);

  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.0f, 0.0f};
  float bacc[G][2];
  float acc[C::kDT][4];
#pragma unroll
  for (int gi = 0; gi < G; ++gi) bacc[gi][0] = bacc[gi][1] = 0.0f;
#pragma unroll
  for (int dt = 0; dt < C::kDT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;

  // Value unpack of tile t (raw stage t % 3) into f16 buffer t % 2, by the whole CTA: (key, 64-dim group) units.
  auto unpack = [&](int t) {
    const uint8_t* st = smem + (t % kPfStages) * C::kStageB;
    __half* vh = reinterpret_cast<__half*>(smem + C::kVhOff + (t % 2) * C::kVhBytes);
#pragma unroll
    for (int u = tid; u < TK * G; u += kPfThreads) {
      const int ukey = u / G, upart = u % G;  // key, value group (64 dims = 8 chunks of 8 f16)
      const uint8_t* vraw = st + C::kKBytes + ukey * C::kVRowB;
      uint4* vrow = reinterpret_cast<uint4*>(vh + ukey * D);
      if constexpr (VB == 3) {
        uint32_t w[7];
#pragma unroll
        for (int i = 0; i < 6; ++i) w[i] = reinterpret_cast<const uint32_t*>(vraw)[6 * upart + i];
        w[6] = 0;
#pragma unroll
        for (int jc = 0; jc < 8; ++jc) {
          const int bit = 24 * jc;  // dims 8jc .. 8jc + 7 of the group: bits bit .. bit + 23
          const uint32_t x = __funnelshift_r(w[bit >> 5], w[(bit >> 5) + 1], bit & 31);
          uint32_t h2[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            h2[e] = codes_to_h2(u3_pair(x, e));
          }
          const int chunk = upart * 8 + jc;
          vrow[chunk ^ (ukey & 7)] = make_uint4(h2[0], h2[1], h2[2], h2[3]);
        }
      } else {
        const uint4 wa = reinterpret_cast<const uint4*>(vraw)[2 * upart];
        const uint4 wb = reinterpret_cast<const uint4*>(vraw)[2 * upart + 1];
        const uint32_t w[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
#pragma unroll
        for (int jc = 0; jc < 8; ++jc) {  // word jc: dims 8jc + e at nibble e
          const uint32_t x = w[jc], xs = x >> 4;
          uint32_t h2[4];
#pragma unroll
          for (int k = 0; k < 4; ++k)  // byte k: dims 2k (low nibble), 2k + 1 (high nibble)
            h2[k] = codes_to_h2(u4_pair(x, xs, k));
          const int chunk = upart * 8 + jc;
          vrow[chunk ^ (ukey & 7)] = make_uint4(h2[0], h2[1], h2[2], h2[3]);
        }
      }
    }
  };
  // Prologue of the pipeline: tile 0 landed (tile 1 may still be in flight), unpacked into buffer 0.
  if (n_tiles > 0) {
    cp_wait<1>();
    __syncthreads();
    unpack(0);
  }

  // One CTA barrier per tile. Iteration t: tile t + 1 has landed (own copies) → barrier (every thread's copies of
  // t + 1 and unpack of t are visible; every warp is done with tile t − 1: its raw stage (t + 2) % 3 and its f16
  // buffer (t + 1) % 2 are free) → copy t + 2 → unpack t + 1 → scores and P·V of tile t.
  for (int t = 0; t < n_tiles; ++t) {
    cp_wait<0>();
    __syncthreads();
    issue(t + 2);
    if (t + 1 < n_tiles) unpack(t + 1);
    const uint8_t* st = smem + (t % kPfStages) * C::kStageB;
    const __half* vh = reinterpret_cast<const __half*>(smem + C::kVhOff + (t % 2) * C::kVhBytes);

    const int t0 = t * TK;  // relative to c0
    if (t0 >= uhi || t0 + TK <= ulo) continue;  // no row of this warp sees a key of the tile
    const bool need_mask = !(t0 >= ilo && t0 + TK <= ihi);
    const uint32_t* sk = reinterpret_cast<const uint32_t*>(st);
    const __half* sks = reinterpret_cast<const __half*>(st + C::kKBytes + C::kVBytes);
    const __half* skb = sks + TK * G;
    const __half* svs = skb + TK * G;
    const __half* svb = svs + TK * G;

    // ---- scores sc[nt][e]: e = (row gid, key 8nt + 2tig), (gid, +1), (gid + 8, 2tig), (gid + 8, +1); log2 units ----
    float sc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int kr = nt * 8 + gid;       // the key row this lane reads for B
      const int ka = nt * 8 + 2 * tig;   // the keys of this lane's C elements: ka, ka + 1
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = 0.0f;
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
        int z2[4] = {0, 0, 0, 0}, z1[4] = {0, 0, 0, 0}, z0[4] = {0, 0, 0, 0};
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          const int kk = 2 * gi + ks;
          uint32_t b0, b1;
          if constexpr (KB == 4) {
            const uint32_t wk = sk[kr * C::kKRowW + key_chunk_pos<D, KB>(kr, kk) * 4 + tig];
            b0 = wk & 0x0F0F0F0Fu;
            b1 = (wk >> 4) & 0x0F0F0F0Fu;
          } else {
            b0 = sk[kr * C::kKRowW + key_chunk_pos<D, KB>(kr, 2 * kk) * 4 + tig];
            b1 = sk[kr * C::kKRowW + key_chunk_pos<D, KB>(kr, 2 * kk + 1) * 4 + tig];
          }
          if constexpr (C::kQRegs) {
            mma_s8u8(z2, qa[kk][2], b0, b1);
            mma_s8u8(z1, qa[kk][1], b0, b1);
            mma_s8u8(z0, qa[kk][0], b0, b1);
          } else {
            uint32_t a[4];
            qfrag(kk, 2, a);
            mma_s8u8(z2, a, b0, b1);
            qfrag(kk, 1, a);
            mma_s8u8(z1, a, b0, b1);
            qfrag(kk, 0, a);
            mma_s8u8(z0, a, b0, b1);
          }
        }
        float zf[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if constexpr (KB == 4)
            zf[e] = static_cast<float>((z2[e] * 256 + z1[e]) * 256 + z0[e]);  // exact: |·| < 2^31
          else
            zf[e] = fmaf(static_cast<float>(z2[e]), 65536.0f, static_cast<float>(z1[e] * 256 + z0[e]));
        }
        const float s0 = __half2float(sks[ka * G + gi]), s1 = __half2float(sks[(ka + 1) * G + gi]);
        const float k0 = __half2float(skb[ka * G + gi]), k1 = __half2float(skb[(ka + 1) * G + gi]);
        sc[nt][0] += s0 * (zmul[0] * zf[0]) + k0 * bq[gi][0];
        sc[nt][1] += s1 * (zmul[0] * zf[1]) + k1 * bq[gi][0];
        sc[nt][2] += s0 * (zmul[1] * zf[2]) + k0 * bq[gi][1];
        sc[nt][3] += s1 * (zmul[1] * zf[3]) + k1 * bq[gi][1];
      }
    }
    if (p.softcap_log2 > 0.0f) {  // the softcap, before the mask
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = capped_score(sc[nt][e], p.softcap_log2, p.inv_softcap_log2);
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

    // ---- online softmax (rows gid, gid + 8; max over the quad) ----
    float mnew[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tmax = kNegInf;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) tmax = fmaxf(tmax, fmaxf(sc[nt][2 * h], sc[nt][2 * h + 1]));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
      const float mn = fmaxf(m_run[h], tmax);
      const float mu = mn == kNegInf ? 0.0f : mn;  // nothing visible yet: p = 0 (acc is still 0)
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
#pragma unroll
      for (int gi = 0; gi < G; ++gi) {
        bacc[gi][0] *= alpha[0];
        bacc[gi][1] *= alpha[1];
      }
      l_run[0] *= alpha[0];
      l_run[1] *= alpha[1];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[nt][e] = ex2(sc[nt][e] - mnew[e >> 1]);
      l_run[0] += sc[nt][0] + sc[nt][1];
      l_run[1] += sc[nt][2] + sc[nt][3];
    }

    // ---- values: per 16 keys, per value group, A = W = p·s (hi, lo), B = f16 codes by ldmatrix.trans ----
#pragma unroll
    for (int k16 = 0; k16 < C::kK16; ++k16) {
      const int ka = k16 * 16 + 2 * tig;  // keys ka, ka + 1 (n-tile 2k16), ka + 8, ka + 9 (n-tile 2k16 + 1)
      const float* p0 = sc[2 * k16];
      const float* p1 = sc[2 * k16 + 1];
#pragma unroll
      for (int gv = 0; gv < G; ++gv) {
        const float s0 = __half2float(svs[ka * G + gv]), s1 = __half2float(svs[(ka + 1) * G + gv]);
        const float s8 = __half2float(svs[(ka + 8) * G + gv]), s9 = __half2float(svs[(ka + 9) * G + gv]);
        const float v0 = __half2float(svb[ka * G + gv]), v1 = __half2float(svb[(ka + 1) * G + gv]);
        const float v8 = __half2float(svb[(ka + 8) * G + gv]), v9 = __half2float(svb[(ka + 9) * G + gv]);
        bacc[gv][0] += (p0[0] * v0 + p0[1] * v1) + (p1[0] * v8 + p1[1] * v9);
        bacc[gv][1] += (p0[2] * v0 + p0[3] * v1) + (p1[2] * v8 + p1[3] * v9);
        uint32_t ahi[4], alo[4];
        split_hi_lo(p0[0] * s0, p0[1] * s1, ahi[0], alo[0]);  // row gid, keys ka, ka + 1
        split_hi_lo(p0[2] * s0, p0[3] * s1, ahi[1], alo[1]);  // row gid + 8
        split_hi_lo(p1[0] * s8, p1[1] * s9, ahi[2], alo[2]);  // row gid, keys ka + 8, ka + 9
        split_hi_lo(p1[2] * s8, p1[3] * s9, ahi[3], alo[3]);  // row gid + 8
        // ldmatrix: lane → matrix m = lane >> 3 (keys + 8·(m & 1), dims + 8·(m >> 1)), row lane & 7.
        const int m = lane >> 3, kr = k16 * 16 + (m & 1) * 8 + (lane & 7);
        const uint8_t* vrow = reinterpret_cast<const uint8_t*>(vh + kr * D);
#pragma unroll
        for (int nd = 0; nd < 8; nd += 2) {
          const int chunk = gv * 8 + nd + (m >> 1);
          uint32_t bf[4];
          ldmatrix_x4_trans(bf, smem_addr(vrow + (chunk ^ (kr & 7)) * 16));
          mma_f16(acc[gv * 8 + nd], ahi, bf[0], bf[1]);
          mma_f16(acc[gv * 8 + nd], alo, bf[0], bf[1]);
          mma_f16(acc[gv * 8 + nd + 1], ahi, bf[2], bf[3]);
          mma_f16(acc[gv * 8 + nd + 1], alo, bf[2], bf[3]);
        }
      }
    }
  }
  cp_wait<0>();  // nothing is left in flight at exit

  // ---- epilogue: l and the bias sums over the quad; rows gid, gid + 8; dims 8dt + 2tig, + 1 ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
#pragma unroll
    for (int gi = 0; gi < G; ++gi) {
      bacc[gi][h] += __shfl_xor_sync(0xffffffffu, bacc[gi][h], 1);
      bacc[gi][h] += __shfl_xor_sync(0xffffffffu, bacc[gi][h], 2);
    }
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
      for (int dt = 0; dt < C::kDT; ++dt) {
        const float bs = bacc[dt / 8][h];
        // l > 0: divide (as the other kernels); l = 0: the row saw nothing, zeros.
        *reinterpret_cast<float2*>(dst + dt * 8) =
            l > 0.0f ? make_float2((acc[dt][2 * h] + bs) / l, (acc[dt][2 * h + 1] + bs) / l) : make_float2(0.f, 0.f);
      }
    } else {
      float* dst = p.part_o + (orow * p.splits + split) * D + 2 * tig;
#pragma unroll
      for (int dt = 0; dt < C::kDT; ++dt) {
        const float bs = bacc[dt / 8][h];
        *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(acc[dt][2 * h] + bs, acc[dt][2 * h + 1] + bs);
      }
      if (tig == 0)
        reinterpret_cast<float2*>(p.part_ml)[orow * p.splits + split] =
            make_float2(m_run[h] == kNegInf ? m_run[h] : m_run[h] * 0.69314718055994531f, l);  // log2 → ln
    }
  }
}

bool aligned(const void* ptr, uintptr_t n) { return (reinterpret_cast<uintptr_t>(ptr) % n) == 0; }

// Lets the kernel have its shared memory on the current GPU; returns the resident CTAs per SM (the same on every GPU
// of the host).
template <int D, int KB, int VB>
int ctas_per_sm() {
  const void* fn = reinterpret_cast<const void*>(&attention_prefill_tc_kernel<D, KB, VB>);
  constexpr int smem = PfCfg<D, KB, VB>::kSmem;
  allow_dynamic_smem(fn, smem, "cuda.attention");
  static int n = [fn] {
    int blocks = 0;
    CIDER_CUDA_CHECK("cuda.attention", cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kPfThreads, smem));
    return std::max(blocks, 1);
  }();
  return n;
}

// Calls f.template operator()<D, KB, VB>() for the configuration of a.
template <typename F>
auto dispatch(const kernels::AttentionArgs& a, F&& f) {
  const bool d128 = a.keys.dim == 128, k8 = a.keys.bits == 8;
  if (d128) return k8 ? f.template operator()<128, 8, 4>() : f.template operator()<128, 4, 3>();
  return k8 ? f.template operator()<256, 8, 4>() : f.template operator()<256, 4, 3>();
}

}  // namespace

bool prefill_tc_eligible(const kernels::AttentionArgs& a) {
  if (!env_flag("CIDER_ATTN_PREFILL_TC", true, "cuda.attention")) return false;
  const auto& K = a.keys;
  const auto& V = a.values;
  const bool k4v3 = K.bits == 4 && V.bits == 3;
  const bool k8v4 = K.bits == 8 && V.bits == 4;
  const int64_t rep = a.Hq / K.H;
  if (K.layout == 1) {
    // Per-channel keys (the f16 kernel) in a format the tensor-core kernels read (kchan_tc_views);
    // $CIDER_ATTN_TC_KCHAN=0 turns it off with the decode path.
    return env_flag("CIDER_ATTN_TC_KCHAN", true, "cuda.attention") && kchan_tc_views(K, V) &&
           (a.mask_kind == kernels::MaskKind::kNone || a.mask_kind == kernels::MaskKind::kCausal) && rep * a.L > 8 &&
           rep * a.L <= (int64_t{1} << 30) && aligned(a.q, 16) && aligned(a.out, 16) && aligned(K.data, 16) &&
           aligned(V.data, 16) && aligned(K.scales, 16) && aligned(K.biases, 16) && aligned(V.scales, 4) &&
           aligned(V.biases, 4) && aligned(K.residual, 16);
  }
  if ((!k4v3 && !k8v4) || K.layout != 0 || V.layout != 0) return false;
  return K.group_size == 64 && V.group_size == 64 && K.dim == V.dim && (K.dim == 128 || K.dim == 256) &&
         K.scale_dtype == DType::kF16 && V.scale_dtype == DType::kF16 &&
         (a.mask_kind == kernels::MaskKind::kNone || a.mask_kind == kernels::MaskKind::kCausal) && rep * a.L > 8 &&
         rep * a.L <= (int64_t{1} << 30) && aligned(a.q, 16) && aligned(a.out, 16) && aligned(K.data, 16) &&
         aligned(V.data, 16) && aligned(K.scales, 4) && aligned(K.biases, 4) && aligned(V.scales, 4) &&
         aligned(V.biases, 4);
}

bool prefill_math_f16(const kernels::AttentionArgs& a) {
  const std::string m = env_word("CIDER_ATTN_PREFILL_MATH", "auto", {"auto", "f16", "exact"}, "cuda.attention");
  if (a.keys.layout == 1) return true;  // per-channel keys: the f16 kernel only
  if (m != "auto") return m == "f16";
  return a.Hq / a.keys.H * a.L > 64;
}

PrefillTcPlan prefill_tc_plan(const kernels::AttentionArgs& a) {
  PrefillTcPlan pl;
  int tk = 64, per_sm = 1, rows_per_cta = kRowsPerCta;
  pl.f16 = prefill_math_f16(a);
  if (pl.f16) {
    const PrefillF16Shape s = prefill_f16_shape(a);
    tk = s.tile_keys;
    per_sm = s.ctas_per_sm;
    rows_per_cta = s.rows_per_cta;
    pl.smem = s.smem;
  } else {
    dispatch(a, [&]<int D, int KB, int VB>() {
      tk = PfCfg<D, KB, VB>::kTK;
      per_sm = ctas_per_sm<D, KB, VB>();
      pl.smem = static_cast<size_t>(PfCfg<D, KB, VB>::kSmem);
      return 0;
    });
  }
  const int64_t R = a.Hq / a.keys.H * a.L;
  pl.qblocks = static_cast<int>((R + rows_per_cta - 1) / rows_per_cta);
  const int64_t kL = a.keys.length;
  // Splits: forced by kv_splits, else only when the (b, KV head, query block) CTAs do not fill one wave of resident
  // CTAs, and never below kMinSplitKeys keys per split (a split's fixed cost: the query preparation, one partial).
  const int64_t base = a.B * a.keys.H * pl.qblocks;
  const int64_t slots = static_cast<int64_t>(per_sm) * sm_count();
  int64_t splits;
  if (a.kv_splits > 0) {
    splits = std::min(a.kv_splits, 4096);
  } else {
    splits = base >= slots ? 1 : (slots + base - 1) / base;
    splits = std::min(splits, std::max<int64_t>(1, (kL + kMinSplitKeys - 1) / kMinSplitKeys));
  }
  splits = std::max<int64_t>(1, std::min(splits, (kL + tk - 1) / tk));
  int64_t chunk = (kL + splits - 1) / splits;
  chunk = (chunk + tk - 1) / tk * tk;
  pl.chunk = chunk;
  pl.splits = static_cast<int>((kL + chunk - 1) / chunk);
  return pl;
}

void prefill_tc_launch(const kernels::AttentionArgs& a, const PrefillTcPlan& pl, const int32_t* d_length,
                       float* part_o, float* part_ml, void* stream) {
  if (pl.f16) {
    prefill_f16_launch(a, pl, d_length, part_o, part_ml, stream);
    return;
  }
  PrefillParams p{};
  fill_tc_params(p, a, d_length, part_o, part_ml, pl.splits, pl.chunk);
  p.qblocks = pl.qblocks;
  check(static_cast<int64_t>(pl.qblocks) * pl.splits <= 0x7fffffffLL, ErrorCode::kOutOfRange, "cuda.attention",
        "too many query blocks × splits: ", static_cast<int64_t>(pl.qblocks) * pl.splits);
  const dim3 grid(static_cast<unsigned>(pl.qblocks * pl.splits), static_cast<unsigned>(a.B * a.keys.H));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const cudaError_t err = dispatch(a, [&]<int D, int KB, int VB>() {
    (void)ctas_per_sm<D, KB, VB>();  // the shared-memory attribute before the first launch
    return pdl::launch(attention_prefill_tc_kernel<D, KB, VB>, grid, dim3(kPfThreads),
                       static_cast<size_t>(PfCfg<D, KB, VB>::kSmem), s, p);
  });
  CIDER_CUDA_CHECK("cuda.attention", err);
}

}  // namespace cider::cuda::detail
