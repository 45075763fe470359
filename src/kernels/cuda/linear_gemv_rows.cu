// cider/kernels/cuda/linear_gemv_rows.cu — decode GEMV for one activation row (M = 1): warps stream whole weight
// rows (each warp an equal share of the block's rows × chunk steps), int8 dot products with dp4a, no shared-memory
// ring and one block barrier after the prologue. Reached through cuda::w8a8_gemv / w4a8_gemv (linear_gemv.cu
// validates and chooses; the tensor-core tile kernel there keeps M = 2 … 16 and serves M = 1 on request:
// $CIDER_GEMV_KERNEL=tile).
//
// Why (docs/cuda/gemv.md, round 6): the tile kernel streams 16-row tiles through a cp.async ring and meets its tile
// group at a barrier per tile; Nsight Compute showed it latency-bound on that per-tile chain (≈ 3 µs per tile per
// block) — W4A8 moved half W8A8's bytes in 90 % of its time, and the model's small GEMVs (N 4096) ran at 1–2 TB/s.
// Here lane ℓ of a warp reads 16-byte chunks ℓ, ℓ + 32, … of a row, 8 chunk loads per lane in flight per batch
// (4 KB per warp, 96 KB per SM with 24 warps: 80 registers each), multiplies them with the activation codes from
// shared memory and reduces across the warp with shuffles. The next batch's loads are issued right after a batch is
// consumed (per channel before the rows it ends are reduced and stored), and the first batch before the
// programmatic-launch wait.
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

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv_device.cuh"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda::gemv_rows {

namespace {

using namespace gemv_device;

constexpr int kWarps = 24;  // ≤ 32: warp 0 reduces the per-warp maxima
constexpr int kThreads = kWarps * 32;
constexpr int kLoadsPerLane = 8;  // 16-byte weight chunks in flight per lane per batch (all its rows together)

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
};

// d = c + Σ_4 bytes a (unsigned) · b (signed): W4 nibble codes as stored times activation codes.
__device__ __forceinline__ int dp4a_u8s8(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Shared memory: the K activation codes (W4: every unit of 8 stored as [x0 x2 x4 x6 | x1 x3 x5 x7], the order the
// unpacked nibble words come in), then for W4 the int32 sums Σ xq of each 32-code chunk.
__host__ __device__ constexpr int xq_bytes(int K) { return (K + 15) / 16 * 16; }
__host__ __device__ constexpr int smem_bytes(bool int4, int K) { return xq_bytes(K) + (int4 ? 4 * (K / 32) : 0); }

// Activation codes of x (one row) into shared memory, as quant::quantize_int8_row; whole block, ends with a barrier.
template <bool kInt4>
__device__ void quantize_row_to_shared(const RowsParams& p, int8_t* xq, int32_t* chunk_sums, uint32_t* amax_warp,
                                       float* sx_out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int units = p.K / 8;  // K is a multiple of 16
  if (p.xq != nullptr) {      // quantized beforehand (quantize_rows_int8): copy, W4 reordered per unit
    for (int u = static_cast<int>(threadIdx.x); u < units; u += kThreads) {
      uint2 v = *reinterpret_cast<const uint2*>(p.xq + 8 * u);
      if constexpr (kInt4) {
        const uint32_t lo = v.x, hi = v.y;
        v.x = __byte_perm(lo, hi, 0x6420);
        v.y = __byte_perm(lo, hi, 0x7531);
      }
      *reinterpret_cast<uint2*>(xq + 8 * u) = v;
    }
    if (threadIdx.x == 0) *sx_out = p.sx[0];
  } else {
    // Pass 1: max |x| as the bits of |x| (non-negative floats order like their bits; NaN/inf are ≥ 0x7f800000).
    uint32_t amax_bits = 0;
    for (int u = static_cast<int>(threadIdx.x); u < units; u += kThreads) {
      float v[8];
      load_x8(p.x, p.x_dtype, 8 * static_cast<int64_t>(u), v);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax_bits = max(amax_bits, __float_as_uint(v[i]) & 0x7fffffffu);
    }
    amax_bits = __reduce_max_sync(0xffffffffu, amax_bits);
    if (lane == 0) amax_warp[warp] = amax_bits;
    __syncthreads();
    if (warp == 0) {
      const uint32_t m = __reduce_max_sync(0xffffffffu, lane < kWarps ? amax_warp[lane] : 0u);
      if (lane == 0) {
        float s;
        if (m >= 0x7f800000u) {
          s = __uint_as_float(0x7fc00000u);  // NaN or ±inf in the row: NaN scale, codes 0 (as the reference)
        } else {
          s = __fdiv_rn(__uint_as_float(m), 127.0f);
          if (s == 0.0f) s = 1.0f;
        }
        *sx_out = s;
      }
    }
    __syncthreads();
    // Pass 2: the codes (x read again, from L1/L2).
    const float s = *sx_out;
    const bool finite = !isnan(s);
    for (int u = static_cast<int>(threadIdx.x); u < units; u += kThreads) {
      float v[8];
      load_x8(p.x, p.x_dtype, 8 * static_cast<int64_t>(u), v);
      uint32_t c[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = finite ? int8_code(v[i], s) : 0u;
      uint2 packed;
      if constexpr (kInt4) {
        packed.x = c[0] | (c[2] << 8) | (c[4] << 16) | (c[6] << 24);
        packed.y = c[1] | (c[3] << 8) | (c[5] << 16) | (c[7] << 24);
      } else {
        packed.x = c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
        packed.y = c[4] | (c[5] << 8) | (c[6] << 16) | (c[7] << 24);
      }
      *reinterpret_cast<uint2*>(xq + 8 * u) = packed;
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

// kInt4: W4A8 else W8A8. kGroup: 0 (per channel) or the group size.
//
// Work split: a "step" is one 16-byte chunk per lane of one row (row i, step j reads chunks ℓ + 32j): a row has
// lc = ⌈chunks / 32⌉ steps. The block's rows × lc steps, in row-major order, are cut into kWarps equal contiguous
// ranges (±1 step), so every warp streams the same bytes (job 12: with whole rows per warp, 108.6 rows per block
// over 24 warps left half the warps idle for the last round, and W4 K4096's 2-row tasks a third of the time).
// A warp walks its range in batches of kLoadsPerLane steps; a batch may end one row and begin the next. A row
// entirely inside one range is finished by its warp; a row cut by a range boundary leaves its pieces (warp sums) in
// shared memory and is finished after the block barrier by one thread, which adds the pieces in k order (the same
// order every run).
template <bool kInt4, int kGroup>
__global__ void __launch_bounds__(kThreads, 1) gemv_rows_kernel(const RowsParams p) {
  constexpr int kB = kLoadsPerLane;        // steps per batch
  constexpr int kCodes = kInt4 ? 32 : 16;  // weight codes in a 16-byte chunk
  // Lanes that share one scale group in a step (chunks ℓ + 32j of lanes ℓ side by side are consecutive k).
  constexpr int kLanesPerGroup = kGroup == 0 ? 1 : kGroup / kCodes;
  static_assert(kGroup == 0 || (kGroup % kCodes == 0 && kLanesPerGroup <= 32), "group sizes 32 (W4) … 256");
  extern __shared__ __align__(16) int8_t xq[];
  __shared__ uint32_t amax_warp[kWarps];
  __shared__ float sx_shared;
  __shared__ int32_t piece_row[kWarps][2];   // a warp's cut rows: [0] its first piece, [1] its last; -1 = none
  __shared__ uint32_t piece_val[kWarps][2];  // their warp sums (int32, or float32 bits per group)
  int32_t* chunk_sums = reinterpret_cast<int32_t*>(xq + xq_bytes(p.K));

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int chunks = p.K / kCodes;  // 16-byte chunks per weight row
  const int lc = (chunks + 31) / 32;  // steps per row
  const int row_begin = static_cast<int>(static_cast<int64_t>(p.N) * blockIdx.x / gridDim.x);
  const int row_end = static_cast<int>(static_cast<int64_t>(p.N) * (blockIdx.x + 1) / gridDim.x);
  const int total = (row_end - row_begin) * lc;  // < 2^31: the launcher bounds N·lc per block
  auto range_start = [&](int w) { return static_cast<int>(static_cast<int64_t>(total) * w / kWarps); };
  const int s0 = range_start(warp), s1 = range_start(warp + 1);
  const int64_t row_bytes = kInt4 ? p.K / 2 : p.K;
  const uint8_t* w = static_cast<const uint8_t*>(p.w);
  if (threadIdx.x < 2 * kWarps) (&piece_row[0][0])[threadIdx.x] = -1;  // barrier: in quantize_row_to_shared

  // Cut rows: thread t of warp 0 (1 ≤ t < kWarps) finishes the row that range boundary t falls inside, if boundary
  // t is the first one inside it; its epilogue operands are loaded now, ahead of everything.
  int cut_row = -1;
  float cut_scale = 0.0f, cut_bias = 0.0f;
  if (warp == 0 && lane >= 1 && lane < kWarps) {
    const int b = range_start(lane), r = b / lc;
    if (b < total && b % lc != 0 && range_start(lane - 1) <= r * lc) {
      cut_row = r;
      if constexpr (kGroup == 0) cut_scale = __ldg(p.w_scales + row_begin + r);
      if (p.bias != nullptr) cut_bias = __ldg(p.bias + row_begin + r);
    }
  }

  uint4 wv[kB];                          // the batch in flight: step u's chunk
  float gscale[kGroup ? kB : 1];         // its group scale (per group)
  int load_s = s0, load_row = s0 / lc, load_j = s0 % lc;  // the next step to load (row local to the block)
  auto issue = [&]() {
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const bool live = load_s + u < s1;
      const int c = lane + 32 * load_j;
      const bool ok = live && c < chunks;
      const int row = row_begin + load_row;
      wv[u] = ok ? load_stream16(w + static_cast<int64_t>(row) * row_bytes + 16 * static_cast<int64_t>(c))
                 : make_uint4(0, 0, 0, 0);
      if constexpr (kGroup != 0)
        gscale[u] = ok ? __ldg(p.w_scales + static_cast<int64_t>(c / kLanesPerGroup) * p.N + row) : 0.0f;
      if (live && ++load_j == lc) load_j = 0, ++load_row;
    }
    load_s += kB;
  };

  // Prologue: the first batch reads only immutable data (weights, scales, bias), so it goes out before the wait for
  // the previous kernel (kernels/cuda/pdl.cuh); then x, which that kernel writes.
  if (s0 < s1) issue();
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  quantize_row_to_shared<kInt4>(p, xq, chunk_sums, amax_warp, &sx_shared);
  const float sx = sx_shared;

  // y = sx·(sw·float(acc)) per channel or sx·s per group, + bias, rounded to out's dtype.
  auto finish = [&](int row, int32_t acc, float s, float scale, float bias) {
    float y = kGroup == 0 ? __fmul_rn(sx, __fmul_rn(scale, __int2float_rn(acc))) : __fmul_rn(sx, s);
    if (p.bias != nullptr) y = __fadd_rn(y, bias);
    store_out(p.out, p.out_dtype, row, y);
  };

  int use_row = s0 / lc, use_j = s0 % lc;
  int piece_j0 = use_j;     // first step of the current piece (0 unless it is the range's first piece)
  bool first_piece = true;  // the current piece is the range's first
  int32_t pacc = 0;         // per channel: this lane's sum over the piece
  float pf = 0.0f;          // per group: this lane's Σ fl(sw_g · float(acc_g)) over the piece (group leaders)
  for (int s = s0; s < s1; s += kB) {
    // Step values of the batch (this frees the batch registers for the next one).
    int32_t val[kB];
    float fval[kGroup ? kB : 1];
    {
      int row = use_row, j = use_j;
#pragma unroll
      for (int u = 0; u < kB; ++u) {
        const bool live = s + u < s1;
        const int c = lane + 32 * j;
        const bool c_ok = live && c < chunks;  // past the row end: zero weights, zero x
        uint4 xa = make_uint4(0, 0, 0, 0), xb = make_uint4(0, 0, 0, 0);
        int32_t xsum8 = 0;
        if (c_ok) {
          xa = reinterpret_cast<const uint4*>(xq + kCodes * c)[0];
          if constexpr (kInt4) {
            xb = reinterpret_cast<const uint4*>(xq + kCodes * c)[1];
            xsum8 = 8 * chunk_sums[c];
          }
        }
        const uint4 wq = wv[u];
        int32_t a = 0;
        if constexpr (kInt4) {
          // Word i = codes 8i … 8i + 7 (unit i): low nibbles the even elements, high nibbles the odd ones; the x unit
          // is [evens | odds]: xa = (e0, o0, e1, o1), xb = (e2, o2, e3, o3).
          a = dp4a_u8s8(wq.x & 0x0f0f0f0fu, xa.x, a), a = dp4a_u8s8((wq.x >> 4) & 0x0f0f0f0fu, xa.y, a);
          a = dp4a_u8s8(wq.y & 0x0f0f0f0fu, xa.z, a), a = dp4a_u8s8((wq.y >> 4) & 0x0f0f0f0fu, xa.w, a);
          a = dp4a_u8s8(wq.z & 0x0f0f0f0fu, xb.x, a), a = dp4a_u8s8((wq.z >> 4) & 0x0f0f0f0fu, xb.y, a);
          a = dp4a_u8s8(wq.w & 0x0f0f0f0fu, xb.z, a), a = dp4a_u8s8((wq.w >> 4) & 0x0f0f0f0fu, xb.w, a);
          a -= xsum8;  // Σ (c − 8)·x over the chunk
        } else {
          a = __dp4a(static_cast<int>(wq.x), static_cast<int>(xa.x), a);
          a = __dp4a(static_cast<int>(wq.y), static_cast<int>(xa.y), a);
          a = __dp4a(static_cast<int>(wq.z), static_cast<int>(xa.z), a);
          a = __dp4a(static_cast<int>(wq.w), static_cast<int>(xa.w), a);
        }
        if constexpr (kGroup == 0) {
          val[u] = a;
        } else {
          // The group's exact sum over its adjacent lanes, then the reference's term on the group's first lane.
#pragma unroll
          for (int o = 1; o < kLanesPerGroup; o *= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
          fval[u] = ((lane & (kLanesPerGroup - 1)) == 0 && c_ok) ? __fmul_rn(gscale[u], __int2float_rn(a)) : 0.0f;
          val[u] = 0;
        }
        if (live && ++j == lc) j = 0, ++row;
      }
    }
    // The next batch flies while this one's rows are closed (per channel; per group the batch's step values and the
    // next batch's scales would not fit the 80 registers together, so it is issued after the closes).
    if constexpr (kGroup == 0)
      if (s + kB < s1) issue();
    // Pieces: add the steps in k order; a piece ends at its row's last step or at the range's end.
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      if (s + u < s1) {  // warp-uniform
        if constexpr (kGroup == 0) pacc += val[u];
        else pf = __fadd_rn(pf, fval[u]);
        const bool row_ends = use_j == lc - 1;
        if (row_ends || s + u == s1 - 1) {
          int32_t total_acc = 0;
          float total_f = 0.0f;
          if constexpr (kGroup == 0) {
            total_acc = __reduce_add_sync(0xffffffffu, pacc);
          } else {
            total_f = pf;
#pragma unroll
            for (int o = 16; o > 0; o /= 2) total_f = __fadd_rn(total_f, __shfl_xor_sync(0xffffffffu, total_f, o));
          }
          if (lane == 0) {
            const int row = row_begin + use_row;
            if (piece_j0 == 0 && row_ends) {  // the whole row: finish it here
              const float scale = kGroup == 0 ? __ldg(p.w_scales + row) : 0.0f;
              const float bias = p.bias != nullptr ? __ldg(p.bias + row) : 0.0f;
              finish(row, total_acc, total_f, scale, bias);
            } else {  // a piece of a cut row: the range's first piece → slot 0, its last → slot 1
              const int slot = first_piece ? 0 : 1;
              piece_row[warp][slot] = use_row;
              piece_val[warp][slot] = kGroup == 0 ? static_cast<uint32_t>(total_acc) : __float_as_uint(total_f);
            }
          }
          pacc = 0, pf = 0.0f, piece_j0 = 0, first_piece = false;
        }
        if (++use_j == lc) use_j = 0, ++use_row;
      }
    }
    if constexpr (kGroup != 0)
      if (s + kB < s1) issue();
  }

  __syncthreads();  // every piece is in shared memory
  if (cut_row >= 0) {
    // Warps lane − 1, lane, … hold the pieces of cut_row in k order (boundary lane − 1 is at or before the row's
    // start; empty ranges hold nothing).
    int32_t acc = 0;
    float sum = 0.0f;
    const int row_last_step = (cut_row + 1) * lc;
    for (int v = lane - 1; v < kWarps && range_start(v) < row_last_step; ++v) {
      if (range_start(v) == range_start(v + 1)) continue;
      const int slot = piece_row[v][0] == cut_row ? 0 : 1;
      if constexpr (kGroup == 0) acc += static_cast<int32_t>(piece_val[v][slot]);
      else sum = __fadd_rn(sum, __uint_as_float(piece_val[v][slot]));
    }
    finish(row_begin + cut_row, acc, sum, cut_scale, cut_bias);
  }
}

using KernelFn = void (*)(RowsParams);

KernelFn pick(bool int4, int group_size) {
  if (int4) {
    switch (group_size) {
      case 0: return gemv_rows_kernel<true, 0>;
      case 32: return gemv_rows_kernel<true, 32>;
      case 64: return gemv_rows_kernel<true, 64>;
      case 128: return gemv_rows_kernel<true, 128>;
      default: return gemv_rows_kernel<true, 256>;
    }
  }
  switch (group_size) {
    case 0: return gemv_rows_kernel<false, 0>;
    case 64: return gemv_rows_kernel<false, 64>;
    case 128: return gemv_rows_kernel<false, 128>;
    default: return gemv_rows_kernel<false, 256>;
  }
}

}  // namespace

void launch(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq, const float* sx, void* stream,
            const char* op) {
  check(supports(a.M, a.K), ErrorCode::kInvalidArgument, op, "the row kernel takes M = 1 and K <= ", kMaxK,
        "; got M ", a.M, ", K ", a.K);
  const int K = static_cast<int>(a.K);
  const KernelFn kernel = pick(int4, a.group_size);
  const int smem = smem_bytes(int4, K);
  CIDER_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // One 768-thread block per SM (80 registers each: the register file), rows split evenly between the blocks. The
  // kernel counts a block's steps (rows × ⌈K / codes per chunk / 32⌉) in int: N ≤ 2^30 (checked by the caller) and
  // K ≤ 65536 keep them below 2^30 / 132 · 128 < 2^31.
  const int grid = static_cast<int>(std::min<int64_t>(device_info().sm_count, a.N));
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
  p.K = K;
  CIDER_CUDA_CHECK(op, cuda::pdl::launch(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads),
                                        static_cast<size_t>(smem), static_cast<cudaStream_t>(stream), p));
  check_last_launch(op);
}

}  // namespace cider::cuda::gemv_rows
