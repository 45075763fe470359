// cider/kernels/cuda/linear_gemv_rows.cu — decode GEMV for one activation row (M = 1): one warp per weight row (or
// per 2 rows when K is short), int8 dot products with dp4a, no shared-memory ring and no barrier after the
// prologue. Reached through cuda::w8a8_gemv / w4a8_gemv (linear_gemv.cu validates and chooses; the tensor-core tile
// kernel there keeps M = 2 … 16 and serves M = 1 on request: $CIDER_GEMV_KERNEL=tile), and through cuda::moe_gemv
// for a mixture-of-experts layer's slots (launch_experts: a block row per slot, its expert's weights from a table).
//
// Why (docs/cuda/gemv.md, round 6): the tile kernel streams 16-row tiles through a cp.async ring and meets its tile
// group at a barrier per tile; Nsight Compute showed it latency-bound on that per-tile chain (≈ 3 µs per tile per
// block) — W4A8 moved half W8A8's bytes in 90 % of its time, and the model's small GEMVs (N 4096) ran at 1–2 TB/s.
// Here a warp owns whole rows: lane ℓ reads 16-byte chunks ℓ, ℓ + 32, … of its row(s), 8 chunk loads per lane in
// flight per batch (4 KB per warp, 96 KB per SM with 24 warps: 80 registers each, no spills), multiplies them with
// the activation codes from shared memory and reduces across the warp with shuffles. The next batch's loads are
// issued right after a batch is consumed (before the row's reduction and store), and the first batch before the
// programmatic-launch wait. Round 7 (session 4): for per-channel matrices of ≥ 28 MB the batches travel instead by
// bulk copies (TMA) into three warp-private shared-memory slots per warp (16 warps: 192 KB in flight per SM), see
// gemv_rows_kernel's kSlots and the launcher's rule.
//
// Semantics: kernels::IntLinearArgs as the CPU reference evaluates it, as in linear_gemv.cu:
//   * the activation codes and scale are the reference's bit for bit (gemv_device.cuh: IEEE division, rint);
//   * the integer sums are exact (int32; per channel Σ over the whole row ≤ the launcher-checked K bound);
//   * per channel the epilogue is the reference's sequence y = fl(fl(sx · fl(sw · float(acc))) + b): bit-identical;
//   * per group every group's integer sum is formed exactly (the lanes of one group are adjacent: a butterfly over
//     gs / codes-per-chunk lanes) and multiplied by its scale as the reference does, fl(sw_g · float(acc_g)); only the
//     float32 sum over the groups runs in another order (each lane its groups in k order, then a butterfly over the
//     lanes) — within the bound the tests derive, 2·(G+1)·2⁻²⁴·(sx·Σ|t_g| + |b|).
//   * W4: the nibbles enter dp4a unsigned (codes 0..15 as stored, 3 integer ops per 8 codes) and each 32-code chunk
//     subtracts 8·Σ_{k in chunk} xq[k] (precomputed once per block in shared memory): Σ (c − 8)·x exactly.
#include "kernels/cuda/linear_gemv_rows.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv_device.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda::gemv_rows {

namespace {

using namespace gemv_device;

// Warps per block: 24 with the weights in registers (80 registers each: the register file), 16 with three bulk-copy
// slots per warp (the same 192 KB of shared memory as 24 warps × 2 slots, and room for three batches' scales).
constexpr int kLoadsPerLane = 8;  // 16-byte weight chunks in flight per lane per batch (all its rows together)
__host__ __device__ constexpr int warps_for(int slots) { return slots == 3 ? 16 : 24; }
// Bytes of one batch (= one slot): kLoadsPerLane 16-byte chunks per lane, 32 lanes, whatever the rows per task.
constexpr int kBatchBytes = kLoadsPerLane * 32 * 16;

struct RowsParams {
  const void* x;
  DType x_dtype;
  const int8_t* xq;  // codes quantized beforehand (workspace) [K], or null: quantize in every block
  const float* sx;   // their scale [1] (with xq)
  const void* w;     // [N, K] int8, or [N, K/2] packed nibbles
  const float* w_scales;  // [N] per channel, [K/gs, N] per group
  const float* bias;      // [N] or null
  void* out;
  DType out_dtype;
  int N, K;
  // Mixture-of-experts slots (launch_experts), else null: block row y (blockIdx.y) is slot y, whose weights and scales
  // are table[sel[y]] (w / w_scales unused), x its row y / x_div (float32 rows of K) and out its row y (N floats).
  const MoeExpertWeights* table;
  const int32_t* sel;
  int x_div;
};

// d = c + Σ_4 bytes a (unsigned) · b (signed): W4 nibble codes as stored times activation codes.
__device__ __forceinline__ int dp4a_u8s8(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Σ over one 16-byte weight chunk of code × activation code, exactly (int32). W8: 16 signed codes against xa. W4: 32
// nibbles; word i = codes 8i … 8i + 7 (unit i), low nibbles the even elements, high nibbles the odd ones; the x unit is
// [evens | odds]: xa = (e0, o0, e1, o1), xb = (e2, o2, e3, o3); the nibbles enter unsigned and xsum8 = 8·Σ x over the
// chunk turns Σ c·x into Σ (c − 8)·x.
template <bool kInt4>
__device__ __forceinline__ int32_t chunk_dot(uint4 wq, uint4 xa, uint4 xb, int32_t xsum8) {
  int32_t a = 0;
  if constexpr (kInt4) {
    a = dp4a_u8s8(wq.x & 0x0f0f0f0fu, xa.x, a), a = dp4a_u8s8((wq.x >> 4) & 0x0f0f0f0fu, xa.y, a);
    a = dp4a_u8s8(wq.y & 0x0f0f0f0fu, xa.z, a), a = dp4a_u8s8((wq.y >> 4) & 0x0f0f0f0fu, xa.w, a);
    a = dp4a_u8s8(wq.z & 0x0f0f0f0fu, xb.x, a), a = dp4a_u8s8((wq.z >> 4) & 0x0f0f0f0fu, xb.y, a);
    a = dp4a_u8s8(wq.w & 0x0f0f0f0fu, xb.z, a), a = dp4a_u8s8((wq.w >> 4) & 0x0f0f0f0fu, xb.w, a);
    a -= xsum8;
  } else {
    (void)xb, (void)xsum8;
    a = __dp4a(static_cast<int>(wq.x), static_cast<int>(xa.x), a);
    a = __dp4a(static_cast<int>(wq.y), static_cast<int>(xa.y), a);
    a = __dp4a(static_cast<int>(wq.z), static_cast<int>(xa.z), a);
    a = __dp4a(static_cast<int>(wq.w), static_cast<int>(xa.w), a);
  }
  return a;
}

// Shared memory: the K activation codes (W4: every unit of 8 stored as [x0 x2 x4 x6 | x1 x3 x5 x7], the order the
// unpacked nibble words come in), then for W4 the int32 sums Σ xq of each 32-code chunk.
__host__ __device__ constexpr int xq_bytes(int K) { return (K + 15) / 16 * 16; }
__host__ __device__ constexpr int smem_bytes(bool int4, int K) { return xq_bytes(K) + (int4 ? 4 * (K / 32) : 0); }

// Activation codes of x (one row) into shared memory, as quant::quantize_int8_row; whole block, ends with a barrier.
// kHeldUnits > 0 (the 16-warp bulk-copy kernels, with 128 registers free here, and whose L1 is mostly shared memory
// so a second read of x would go to L2): when x has at most kHeldUnits units of 8 per thread, one pass — the thread's
// units stay in registers between the max and the codes. Otherwise two passes over x.
// x0: the row's first element in p.x (a slot's row for the experts' launches, else 0).
template <bool kInt4, int kThreads, int kHeldUnits>
__device__ void quantize_row_to_shared(const RowsParams& p, int64_t x0, int8_t* xq, int32_t* chunk_sums,
                                       uint32_t* amax_warp, float* sx_out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int units = p.K / 8;  // K is a multiple of 16
  if (p.xq != nullptr) {      // quantized beforehand (quantize_rows_int8): copy, W4 reordered per unit
    for (int u = static_cast<int>(threadIdx.x); u < units; u += kThreads) {
      *reinterpret_cast<uint2*>(xq + 8 * u) = unit_codes_from_k_order<kInt4>(*reinterpret_cast<const uint2*>(p.xq + 8 * u));
    }
    if (threadIdx.x == 0) *sx_out = p.sx[0];
  } else {
    const bool held = kHeldUnits > 0 && units <= kHeldUnits * kThreads;
    float xv[kHeldUnits > 0 ? kHeldUnits : 1][8];
    // Pass 1: max |x| as the bits of |x| (non-negative floats order like their bits; NaN/inf are ≥ 0x7f800000).
    uint32_t amax_bits = 0;
    if (held) {
#pragma unroll
      for (int j = 0; j < (kHeldUnits > 0 ? kHeldUnits : 1); ++j) {
        const int u = static_cast<int>(threadIdx.x) + j * kThreads;
#pragma unroll
        for (int i = 0; i < 8; ++i) xv[j][i] = 0.0f;
        if (u < units) load_x8(p.x, p.x_dtype, x0 + 8 * static_cast<int64_t>(u), xv[j]);
#pragma unroll
        for (int i = 0; i < 8; ++i) amax_bits = max(amax_bits, __float_as_uint(xv[j][i]) & 0x7fffffffu);
      }
    }
    for (int u = static_cast<int>(threadIdx.x); !held && u < units; u += kThreads) {
      float v[8];
      load_x8(p.x, p.x_dtype, x0 + 8 * static_cast<int64_t>(u), v);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax_bits = max(amax_bits, __float_as_uint(v[i]) & 0x7fffffffu);
    }
    amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
    if (lane == 0) amax_warp[warp] = amax_bits;
    __syncthreads();
    if (warp == 0) {
      const uint32_t m = __reduce_max_sync(0xffffffffu, lane < kThreads / 32 ? amax_warp[lane] : 0u);
      if (lane == 0) *sx_out = row_scale_from_amax_bits(m);  // NaN when the row holds a NaN or ±inf: codes 0
    }
    __syncthreads();
    // Pass 2: the codes (from the registers, or x read again from L1/L2).
    const float s = *sx_out;
    const bool finite = !isnan(s);
    for (int u = static_cast<int>(threadIdx.x), j = 0; u < units; u += kThreads, ++j) {
      float v[8];
      if (held) {
#pragma unroll
        for (int jj = 0; jj < (kHeldUnits > 0 ? kHeldUnits : 1); ++jj)
          if (jj == j) {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = xv[jj][i];
          }
      } else {
        load_x8(p.x, p.x_dtype, x0 + 8 * static_cast<int64_t>(u), v);
      }
      uint32_t c[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = finite ? int8_code(v[i], s) : 0u;
      *reinterpret_cast<uint2*>(xq + 8 * u) = pack_unit_codes<kInt4>(c);
    }
  }
  __syncthreads();
  if constexpr (kInt4) {  // Σ xq per 32-code chunk (exact: |Σ| ≤ 32·127); any byte order gives the same sum
    for (int c = static_cast<int>(threadIdx.x); c < p.K / 32; c += kThreads) {
      const uint4 a = reinterpret_cast<const uint4*>(xq + 32 * c)[0];
      const uint4 b = reinterpret_cast<const uint4*>(xq + 32 * c)[1];
      int s = 0;
      s = __dp4a(static_cast<int>(a.x), 0x01010101, s), s = __dp4a(static_cast<int>(a.y), 0x01010101, s);
      s = __dp4a(static_cast<int>(a.z), 0x01010101, s), s = __dp4a(static_cast<int>(a.w), 0x01010101, s);
      s = __dp4a(static_cast<int>(b.x), 0x01010101, s), s = __dp4a(static_cast<int>(b.y), 0x01010101, s);
      s = __dp4a(static_cast<int>(b.z), 0x01010101, s), s = __dp4a(static_cast<int>(b.w), 0x01010101, s);
      chunk_sums[c] = s;
    }
    __syncthreads();
  }
}

// kInt4: W4A8 else W8A8. kGroup: 0 (per channel) or the group size. kR: weight rows per warp task (1 or 2: short
// rows go two to a task so that a batch still holds kLoadsPerLane chunks per lane). kSlots: where a batch waits —
// 0: in registers (plain 16-byte loads, one batch in flight per warp); 2: in two warp-private shared-memory slots
// filled by bulk copies (lane 0 issues one cp.async.bulk per row segment; the row segment of a batch, kU chunk steps,
// is contiguous in global memory), so each warp keeps two batches in flight without holding them in registers.
template <bool kInt4, int kGroup, int kR, int kSlots>
__global__ void __launch_bounds__(warps_for(kSlots) * 32, 1) gemv_rows_kernel(const RowsParams p) {
  constexpr int kWarps = warps_for(kSlots);
  constexpr int kU = kLoadsPerLane / kR;  // chunks per row and lane in one batch
  constexpr int kCodes = kInt4 ? 32 : 16;  // weight codes in a 16-byte chunk
  constexpr int kSegBytes = kU * 32 * 16;  // one row's bytes of a batch
  constexpr int kPhases = kSlots > 0 ? kSlots : 1;  // batches in flight per warp
  // Lanes that share one scale group in a batch step (chunks ℓ + 32j of lanes ℓ side by side are consecutive k).
  constexpr int kLanesPerGroup = kGroup == 0 ? 1 : kGroup / kCodes;
  static_assert(kGroup == 0 || (kGroup % kCodes == 0 && kLanesPerGroup <= 32), "group sizes 32 (W4) … 256");
  // Dynamic shared memory: [kWarps][kSlots] slots of kBatchBytes (bulk path), then the activation codes and W4's
  // chunk sums.
  extern __shared__ __align__(128) int8_t rows_smem[];
  __shared__ uint32_t amax_warp[32];
  __shared__ float sx_shared;
  __shared__ uint64_t slot_bar[kSlots > 0 ? kWarps * kSlots : 1];
  int8_t* xq = rows_smem + kWarps * kSlots * kBatchBytes;
  int32_t* chunk_sums = reinterpret_cast<int32_t*>(xq + xq_bytes(p.K));

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int chunks = p.K / kCodes;              // 16-byte chunks per weight row
  const int lane_chunks = (chunks + 31) / 32;   // chunk steps per lane and row (the last may be partial)
  const int batches = (lane_chunks + kU - 1) / kU;
  // This block's rows: a balanced contiguous range (every SM streams the same bytes); warp w takes the tasks
  // (kR consecutive rows) w, w + kWarps, …
  const int row_begin = static_cast<int>(static_cast<int64_t>(p.N) * blockIdx.x / gridDim.x);
  const int row_end = static_cast<int>(static_cast<int64_t>(p.N) * (blockIdx.x + 1) / gridDim.x);
  const int tasks = (row_end - row_begin + kR - 1) / kR;
  const int my_tasks = warp < tasks ? (tasks - warp + kWarps - 1) / kWarps : 0;
  const int iters = my_tasks * batches;  // warp-uniform
  const int64_t row_bytes = kInt4 ? p.K / 2 : p.K;
  const uint8_t* w = static_cast<const uint8_t*>(p.w);
  const float* w_scales = p.w_scales;
  int64_t x0 = 0, out0 = 0;  // this block's activation row and output row (experts' slots)
  if (p.table != nullptr) {
    // The slot's expert was chosen by the previous kernel (moe_route): wait for it before the first weight load.
    cuda::pdl::wait();
    const int slot = static_cast<int>(blockIdx.y);
    const MoeExpertWeights e = p.table[p.sel[slot]];
    w = static_cast<const uint8_t*>(e.w);
    w_scales = e.scales;
    x0 = static_cast<int64_t>(slot / p.x_div) * p.K;
    out0 = static_cast<int64_t>(slot) * p.N;
  }
  uint8_t* my_slots = reinterpret_cast<uint8_t*>(rows_smem) + warp * kSlots * kBatchBytes;
  uint64_t* my_bars = slot_bar + (kSlots > 0 ? warp * kSlots : 0);

  uint4 wv[kSlots > 0 ? 1 : kR][kSlots > 0 ? 1 : kU];  // register path: the batch in flight, chunk u of row r
  float gscale[kPhases][kGroup ? kR : 1][kGroup ? kU : 1];  // the group scales of each batch in flight
  float ep_scale[kPhases][kR], ep_bias[kPhases][kR];  // epilogue operands, loaded with a task's last batch

  int load_t = 0, load_b = 0;  // task and batch of the next issue
  // Issue the next batch into phase ph (a compile-time constant after unrolling: register arrays stay registers).
  auto issue = [&](int ph) {
    const int row0 = row_begin + (warp + load_t * kWarps) * kR;
    if constexpr (kSlots > 0) {
      if (lane == 0) {  // row0 < row_end for every issued task; a second row may lie past the block's range
        const int64_t seg0 = static_cast<int64_t>(load_b) * kSegBytes;
        const uint32_t len = static_cast<uint32_t>(min(static_cast<int64_t>(kSegBytes), row_bytes - seg0));
        const int rows = min(kR, row_end - row0);
        fence_proxy_async();
        mbar_expect_tx(my_bars + ph, len * static_cast<uint32_t>(rows));
        for (int r = 0; r < rows; ++r)
          bulk_load(my_slots + ph * kBatchBytes + r * kSegBytes, w + static_cast<int64_t>(row0 + r) * row_bytes + seg0,
                    len, my_bars + ph);
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int row = row0 + r;
      const bool row_ok = row < row_end;
      const uint8_t* wr = w + static_cast<int64_t>(row_ok ? row : 0) * row_bytes;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = lane + 32 * (load_b * kU + u);
        const bool ok = row_ok && c < chunks;
        if constexpr (kSlots == 0) wv[r][u] = ok ? load_stream16(wr + 16 * static_cast<int64_t>(c)) : make_uint4(0, 0, 0, 0);
        if constexpr (kGroup != 0)
          gscale[ph][r][u] = ok ? __ldg(w_scales + static_cast<int64_t>(c / kLanesPerGroup) * p.N + row) : 0.0f;
      }
      if (load_b == batches - 1) {
        ep_scale[ph][r] = 0.0f, ep_bias[ph][r] = 0.0f;
        if (row_ok) {
          if constexpr (kGroup == 0) ep_scale[ph][r] = __ldg(w_scales + row);
          if (p.bias != nullptr) ep_bias[ph][r] = __ldg(p.bias + row);
        }
      }
    }
    if (++load_b == batches) load_b = 0, ++load_t;
  };

  if constexpr (kSlots > 0) {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) mbar_init(my_bars + s);
      mbar_init_fence();
    }
    __syncwarp();
  }
  // Prologue: the first batches read only immutable data (weights, scales, bias), so they go out before the wait for
  // the previous kernel (kernels/cuda/pdl.cuh); then x, which that kernel writes.
#pragma unroll
  for (int ph = 0; ph < kPhases; ++ph)
    if (ph < iters) issue(ph);
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  quantize_row_to_shared<kInt4, kWarps * 32, (kSlots == 3 ? 4 : 0)>(p, x0, xq, chunk_sums, amax_warp, &sx_shared);
  const float sx = sx_shared;

  int32_t acc[kR];  // per channel: this lane's exact integer sum per row
  float fsum[kR];   // per group: this lane's Σ fl(sw_g · float(acc_g)) per row (group-leading lanes only)
#pragma unroll
  for (int r = 0; r < kR; ++r) acc[r] = 0, fsum[r] = 0.0f;
  int use_t = 0, use_b = 0;
  auto consume = [&](int ph, uint32_t parity) {
    const uint8_t* slot = my_slots + ph * kBatchBytes;
    if constexpr (kSlots > 0) mbar_wait(my_bars + ph, parity);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = lane + 32 * (use_b * kU + u);
      const bool c_ok = c < chunks;  // lanes past the row end contribute zero (their x is zero too)
      uint4 xa = make_uint4(0, 0, 0, 0), xb = make_uint4(0, 0, 0, 0);
      int32_t xsum8 = 0;
      if (c_ok) {
        xa = reinterpret_cast<const uint4*>(xq + kCodes * c)[0];
        if constexpr (kInt4) {
          xb = reinterpret_cast<const uint4*>(xq + kCodes * c)[1];
          xsum8 = 8 * chunk_sums[c];
        }
      }
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        uint4 wq;
        if constexpr (kSlots > 0) {
          // Bytes of the slot past a short last segment or a missing second row are stale: masked here.
          const int row = row_begin + (warp + use_t * kWarps) * kR + r;
          wq = (c_ok && row < row_end)
                   ? *reinterpret_cast<const uint4*>(slot + r * kSegBytes + (u * 32 + lane) * 16)
                   : make_uint4(0, 0, 0, 0);
        } else {
          wq = wv[r][u];
        }
        int32_t a = chunk_dot<kInt4>(wq, xa, xb, xsum8);
        if constexpr (kGroup == 0) {
          acc[r] += a;
        } else {
          // The group's exact sum over its adjacent lanes, then the reference's term on the group's first lane.
#pragma unroll
          for (int o = 1; o < kLanesPerGroup; o *= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
          if ((lane & (kLanesPerGroup - 1)) == 0 && c_ok)
            fsum[r] = __fadd_rn(fsum[r], __fmul_rn(gscale[ph][r][u], __int2float_rn(a)));
        }
      }
    }
    if (use_b == batches - 1) {
      // Rows of the task: warp sums, then lane r finishes row r (operands loaded with this batch).
      const int row0 = row_begin + (warp + use_t * kWarps) * kR;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float y;
        if constexpr (kGroup == 0) {
          const int32_t total = __reduce_add_sync(0xffffffffu, acc[r]);
          y = __fmul_rn(sx, __fmul_rn(ep_scale[ph][r], __int2float_rn(total)));
        } else {
          float s = fsum[r];
#pragma unroll
          for (int o = 16; o > 0; o /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
          y = __fmul_rn(sx, s);
        }
        if (p.bias != nullptr) y = __fadd_rn(y, ep_bias[ph][r]);
        if (lane == r && row0 + r < row_end) store_out(p.out, p.out_dtype, out0 + row0 + r, y);
        acc[r] = 0, fsum[r] = 0.0f;
      }
    }
    if (++use_b == batches) use_b = 0, ++use_t;
    if constexpr (kSlots > 0) __syncwarp();  // every lane is done with the slot before lane 0 refills it
  };

  // Batch i sits in phase i % kPhases; its slot's barrier completes its (i / kPhases)-th phase.
  for (int it0 = 0; it0 < iters; it0 += kPhases) {
    const uint32_t parity = static_cast<uint32_t>(it0 / kPhases) & 1u;
#pragma unroll
    for (int ph = 0; ph < kPhases; ++ph) {
      const int it = it0 + ph;
      if (it < iters) {
        consume(ph, parity);
        if (it + kPhases < iters) issue(ph);  // the registers / slot of the batch just consumed take a later one
      }
    }
  }
}

using KernelFn = void (*)(RowsParams);

int g_rows_per_task = 0;  // gemv_bench::set_gemv_rows_per_task: 0 automatic, else 1 or 2
// gemv_bench::set_gemv_row_loads: 0 automatic, 1 registers, 2 / 3 bulk copies with that many slots per warp.
int g_row_loads_knob = 0;
int g_last_row_loads = 0;  // gemv_bench::last_gemv_row_loads: the weight loads of the latest launch (1 or 2)
constexpr int64_t kBulkMinWeightBytes = int64_t{28} << 20;  // per-channel weights take bulk copies from this size
constexpr int kLoadsRegisters = 1, kLoadsBulk = 2;

template <bool kInt4, int kGroup, int kSlots>
KernelFn pick_rows(int rows_per_task) {
  if (rows_per_task == 2) return gemv_rows_kernel<kInt4, kGroup, 2, kSlots>;
  return gemv_rows_kernel<kInt4, kGroup, 1, kSlots>;
}

template <int kSlots>
KernelFn pick(bool int4, int group_size, int rows_per_task) {
  if (int4) {
    switch (group_size) {
      case 0: return pick_rows<true, 0, kSlots>(rows_per_task);
      case 32: return pick_rows<true, 32, kSlots>(rows_per_task);
      case 64: return pick_rows<true, 64, kSlots>(rows_per_task);
      case 128: return pick_rows<true, 128, kSlots>(rows_per_task);
      default: return pick_rows<true, 256, kSlots>(rows_per_task);
    }
  }
  switch (group_size) {
    case 0: return pick_rows<false, 0, kSlots>(rows_per_task);
    case 64: return pick_rows<false, 64, kSlots>(rows_per_task);
    case 128: return pick_rows<false, 128, kSlots>(rows_per_task);
    default: return pick_rows<false, 256, kSlots>(rows_per_task);
  }
}

// Weight loads asked for: the bench/test knob, else $CIDER_GEMV_ROW_LOADS ("registers" or "bulk", read at every call:
// the A/B switch), else 0 (automatic).
int requested_row_loads(const char* op) {
  if (g_row_loads_knob != 0) return g_row_loads_knob == 1 ? kLoadsRegisters : kLoadsBulk;
  const std::string v = env_word("CIDER_GEMV_ROW_LOADS", "", {"registers", "bulk"}, op);
  return v.empty() ? 0 : (v == "bulk" ? kLoadsBulk : kLoadsRegisters);
}

}  // namespace

namespace {

// Picks and launches the kernel for p (N, K and the pointers set): grid (grid_x, grid_y) blocks, rows split evenly
// between the grid_x blocks of a block row (one weight matrix: an expert's for the slots).
void launch_rows(RowsParams p, bool int4, int group_size, int grid_x, int grid_y, void* stream, const char* op) {
  const int K = p.K;
  // Rows per warp task: a batch holds kLoadsPerLane chunks per lane, so rows of ≤ 4 chunk steps per lane go two to a
  // task (W8 K ≤ 2048, W4 K ≤ 4096).
  const int lane_chunks = (K / (int4 ? 32 : 16) + 31) / 32;
  const int rows_per_task = g_rows_per_task > 0 ? g_rows_per_task : (lane_chunks <= kLoadsPerLane / 2 ? 2 : 1);
  // Weight loads: bulk copies into shared-memory slots (16 warps × 3 slots × 4 KB = 192 KB in flight per SM instead
  // of the 96 KB that fit in registers) for per-channel weight matrices of ≥ 28 MB, whenever the slots and the
  // activation row fit the block's shared memory (K up to ≈ 30k); smaller or per-group matrices, larger K, or
  // registers asked for: plain loads into registers. Jobs 18–19 (docs/cuda/gemv.md, round 7): bulk copies were
  // 2–8 % faster on the per-channel matrices of 29–235 MB, 0–7 % slower on those of 8–25 MB and 6–13 % slower per
  // group (W4 g64).
  const int loads_asked = requested_row_loads(op);
  const int64_t weight_bytes = static_cast<int64_t>(p.N) * (int4 ? K / 2 : K);
  const bool bulk_wanted =
      loads_asked == kLoadsBulk || (loads_asked == 0 && group_size == 0 && weight_bytes >= kBulkMinWeightBytes);
  const int slots = g_row_loads_knob == 2 ? 2 : 3;  // the bench knob may ask for 24 warps × 2 slots
  KernelFn kernel = slots == 2 ? pick<2>(int4, group_size, rows_per_task) : pick<3>(int4, group_size, rows_per_task);
  int warps = warps_for(slots);
  int smem = warps * slots * kBatchBytes + smem_bytes(int4, K);
  cudaFuncAttributes attr{};
  CIDER_CUDA_CHECK(op, cudaFuncGetAttributes(&attr, kernel));
  const bool bulk_fits =
      static_cast<int64_t>(smem) + static_cast<int64_t>(attr.sharedSizeBytes) <= device_info().max_shared_per_block_optin;
  const int loads = (bulk_wanted && bulk_fits) ? kLoadsBulk : kLoadsRegisters;
  if (loads == kLoadsRegisters) {
    kernel = pick<0>(int4, group_size, rows_per_task);
    warps = warps_for(0);
    smem = smem_bytes(int4, K);
  }
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<size_t>(smem), op);
  CIDER_CUDA_CHECK(op, cuda::pdl::launch(kernel, dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)),
                                        dim3(static_cast<unsigned>(warps * 32)), static_cast<size_t>(smem),
                                        static_cast<cudaStream_t>(stream), p));
  check_last_launch(op);
  g_last_row_loads = loads;
}

}  // namespace

void launch(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq, const float* sx, void* stream,
            const char* op) {
  check(supports(a.M, a.K), ErrorCode::kInvalidArgument, op, "the row kernel takes M = 1 and K <= ", kMaxK,
        "; got M ", a.M, ", K ", a.K);
  RowsParams p{};
  p.x = a.x;
  p.x_dtype = a.x_dtype;
  p.xq = xq;
  p.sx = sx;
  p.w = a.w;
  p.w_scales = a.w_scales;
  p.bias = a.bias;
  p.out = a.out;
  p.out_dtype = a.out_dtype;
  p.N = static_cast<int>(a.N);
  p.K = static_cast<int>(a.K);
  // One block per SM, rows split evenly between the blocks.
  const int grid = static_cast<int>(std::min<int64_t>(device_info().sm_count, a.N));
  launch_rows(p, int4, a.group_size, grid, 1, stream, op);
}

void launch_experts(const MoeExpertWeights* table, const int32_t* sel, int64_t slots, int64_t x_div, bool int4,
                    int group_size, int64_t N, int64_t K, const float* x, float* out, void* stream, const char* op) {
  check(K <= kMaxK && slots >= 1 && slots <= 65535 && x_div >= 1, ErrorCode::kInvalidArgument, op,
        "the experts' row kernel takes K <= ", kMaxK, ", slots in [1, 65535] and x_div >= 1; got K ", K, ", ", slots,
        " slots, x_div ", x_div);
  RowsParams p{};
  p.x = x;
  p.x_dtype = DType::kF32;
  p.out = out;
  p.out_dtype = DType::kF32;
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.table = table;
  p.sel = sel;
  p.x_div = static_cast<int>(x_div);
  // About one block per SM in all: the SMs shared between the slots (at least one block per slot).
  const int64_t per_slot = std::max<int64_t>(1, device_info().sm_count / slots);
  launch_rows(p, int4, group_size, static_cast<int>(std::min<int64_t>(per_slot, N)), static_cast<int>(slots), stream,
              op);
}

}  // namespace cider::cuda::gemv_rows

namespace cider::cuda::gemv_bench {
// For bench/cuda/bench_gemv.cpp and tests only: weight rows per warp task of the row kernel for the following calls
// (0: the launcher's rule, 2 when a row has ≤ 4 chunk steps per lane; 1 or 2 forces it).
void set_gemv_rows_per_task(int rows) {
  check(rows >= 0 && rows <= 2, ErrorCode::kInvalidArgument, "cuda.gemv_bench.set_gemv_rows_per_task",
        "rows per task must be 0 (automatic), 1 or 2; got ", rows);
  gemv_rows::g_rows_per_task = rows;
}
// Weight loads of the row kernel for the following calls: 0 automatic (bulk copies for per-channel matrices of
// ≥ 28 MB, else registers), 1 registers, 2 / 3 bulk copies with that many slots per warp for any weights (registers
// anyway when the slots do not fit); last_gemv_row_loads says which ran (1 registers or 2 bulk).
void set_gemv_row_loads(int loads) {
  check(loads >= 0 && loads <= 3, ErrorCode::kInvalidArgument, "cuda.gemv_bench.set_gemv_row_loads",
        "row loads must be 0 (automatic), 1 (registers) or the bulk-copy slots per warp 2 or 3; got ", loads);
  gemv_rows::g_row_loads_knob = loads;
}
int last_gemv_row_loads() { return gemv_rows::g_last_row_loads; }
}  // namespace cider::cuda::gemv_bench
