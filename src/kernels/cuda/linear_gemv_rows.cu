// cider/kernels/cuda/linear_gemv_rows.cu — decode GEMV for one activation row (M = 1): one warp per weight row (or
// per 2 rows when K is short), int8 dot products with dp4a, no shared-memory ring and no barrier after the
// prologue. Reached through cuda::w8a8_gemv / w4a8_gemv (linear_gemv.cu validates and chooses; the tensor-core tile
// kernel there keeps M = 2 … 16 and serves M = 1 on request: $CIDER_GEMV_KERNEL=tile).
//
// Why (docs/cuda/gemv.md, round 6): the tile kernel streams 16-row tiles through a cp.async ring and meets its tile
// group at a barrier per tile; Nsight Compute showed it latency-bound on that per-tile chain (≈ 3 µs per tile per
// block) — W4A8 moved half W8A8's bytes in 90 % of its time, and the model's small GEMVs (N 4096) ran at 1–2 TB/s.
// Here a warp owns whole rows: lane ℓ reads 16-byte chunks ℓ, ℓ + 32, … of its row(s), 8 chunk loads per lane in
// flight per batch (4 KB per warp, 96 KB per SM with 24 warps: 80 registers each, no spills), multiplies them with the activation codes from
// shared memory and reduces across the warp with shuffles. The next batch's loads are issued right after a batch is
// consumed (before the row's reduction and store), and the first batch before the programmatic-launch wait.
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

// kInt4: W4A8 else W8A8. kGroup: 0 (per channel) or the group size. kR: weight rows per warp task (1 or 2: short
// rows go two to a task so that a batch still holds kLoadsPerLane chunk loads per lane).
template <bool kInt4, int kGroup, int kR>
__global__ void __launch_bounds__(kThreads, 1) gemv_rows_kernel(const RowsParams p) {
  constexpr int kU = kLoadsPerLane / kR;  // chunks per row and lane in one batch
  constexpr int kCodes = kInt4 ? 32 : 16;  // weight codes in a 16-byte chunk
  // Lanes that share one scale group in a batch step (chunks ℓ + 32j of lanes ℓ side by side are consecutive k).
  constexpr int kLanesPerGroup = kGroup == 0 ? 1 : kGroup / kCodes;
  static_assert(kGroup == 0 || (kGroup % kCodes == 0 && kLanesPerGroup <= 32), "group sizes 32 (W4) … 256");
  extern __shared__ __align__(16) int8_t xq[];
  __shared__ uint32_t amax_warp[kWarps];
  __shared__ float sx_shared;
  int32_t* chunk_sums = reinterpret_cast<int32_t*>(xq + xq_bytes(p.K));

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int chunks = p.K / kCodes;              // 16-byte chunks per weight row
  const int lane_chunks = (chunks + 31) / 32;   // chunk steps per lane and row (the last may be partial)
  const int batches = (lane_chunks + kU - 1) / kU;
  // This block's rows: a balanced contiguous range (every SM streams the same bytes); warp w takes the tasks
  // (kR consecutive rows) w, w + 32, …
  const int row_begin = static_cast<int>(static_cast<int64_t>(p.N) * blockIdx.x / gridDim.x);
  const int row_end = static_cast<int>(static_cast<int64_t>(p.N) * (blockIdx.x + 1) / gridDim.x);
  const int tasks = (row_end - row_begin + kR - 1) / kR;
  const int my_tasks = warp < tasks ? (tasks - warp + kWarps - 1) / kWarps : 0;
  const int iters = my_tasks * batches;  // warp-uniform
  const int64_t row_bytes = kInt4 ? p.K / 2 : p.K;
  const uint8_t* w = static_cast<const uint8_t*>(p.w);

  uint4 wv[kR][kU];                           // the batch in flight: chunk u of row r
  float gscale[kGroup ? kR : 1][kGroup ? kU : 1];  // its group scales (per group)
  float ep_scale[kR], ep_bias[kR];            // epilogue operands of the task's rows, loaded with its last batch

  int load_t = 0, load_b = 0;  // task and batch of the next issue
  auto issue = [&]() {
    const int row0 = row_begin + (warp + load_t * kWarps) * kR;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int row = row0 + r;
      const bool row_ok = row < row_end;
      const uint8_t* wr = w + static_cast<int64_t>(row_ok ? row : 0) * row_bytes;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = lane + 32 * (load_b * kU + u);
        const bool ok = row_ok && c < chunks;
        wv[r][u] = ok ? load_stream16(wr + 16 * static_cast<int64_t>(c)) : make_uint4(0, 0, 0, 0);
        if constexpr (kGroup != 0)
          gscale[r][u] = ok ? __ldg(p.w_scales + static_cast<int64_t>(c / kLanesPerGroup) * p.N + row) : 0.0f;
      }
      if (load_b == batches - 1) {
        ep_scale[r] = 0.0f, ep_bias[r] = 0.0f;
        if (row_ok) {
          if constexpr (kGroup == 0) ep_scale[r] = __ldg(p.w_scales + row);
          if (p.bias != nullptr) ep_bias[r] = __ldg(p.bias + row);
        }
      }
    }
    if (++load_b == batches) load_b = 0, ++load_t;
  };

  // Prologue: the first batch reads only immutable data (weights, scales, bias), so it goes out before the wait for
  // the previous kernel (kernels/cuda/pdl.cuh); then x, which that kernel writes.
  if (iters > 0) issue();
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  quantize_row_to_shared<kInt4>(p, xq, chunk_sums, amax_warp, &sx_shared);
  const float sx = sx_shared;

  int32_t acc[kR];  // per channel: this lane's exact integer sum per row
  float fsum[kR];   // per group: this lane's Σ fl(sw_g · float(acc_g)) per row (group-leading lanes only)
#pragma unroll
  for (int r = 0; r < kR; ++r) acc[r] = 0, fsum[r] = 0.0f;
  int use_t = 0, use_b = 0;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = lane + 32 * (use_b * kU + u);
      const bool c_ok = c < chunks;  // lanes past the row end hold zero weights; their x is zero too
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
        const uint4 wq = wv[r][u];
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
          acc[r] += a;
        } else {
          // The group's exact sum over its adjacent lanes, then the reference's term on the group's first lane.
#pragma unroll
          for (int o = 1; o < kLanesPerGroup; o *= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
          if ((lane & (kLanesPerGroup - 1)) == 0 && c_ok)
            fsum[r] = __fadd_rn(fsum[r], __fmul_rn(gscale[r][u], __int2float_rn(a)));
        }
      }
    }
    const bool task_done = use_b == batches - 1;
    if (task_done) {
      // Rows of the task: warp sums, then lane r finishes row r (operands loaded with this batch).
      const int row0 = row_begin + (warp + use_t * kWarps) * kR;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float y;
        if constexpr (kGroup == 0) {
          const int32_t total = __reduce_add_sync(0xffffffffu, acc[r]);
          y = __fmul_rn(sx, __fmul_rn(ep_scale[r], __int2float_rn(total)));
        } else {
          float s = fsum[r];
#pragma unroll
          for (int o = 16; o > 0; o /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
          y = __fmul_rn(sx, s);
        }
        if (p.bias != nullptr) y = __fadd_rn(y, ep_bias[r]);
        if (lane == r && row0 + r < row_end) store_out(p.out, p.out_dtype, row0 + r, y);
        acc[r] = 0, fsum[r] = 0.0f;
      }
    }
    if (++use_b == batches) use_b = 0, ++use_t;
    if (it + 1 < iters) issue();  // the registers of the batch just consumed take the next one
  }
}

using KernelFn = void (*)(RowsParams);

int g_rows_per_task = 0;  // gemv_bench::set_gemv_rows_per_task: 0 automatic, else 1 or 2

template <bool kInt4, int kGroup>
KernelFn pick_rows(int rows_per_task) {
  if (rows_per_task == 2) return gemv_rows_kernel<kInt4, kGroup, 2>;
  return gemv_rows_kernel<kInt4, kGroup, 1>;
}

KernelFn pick(bool int4, int group_size, int rows_per_task) {
  if (int4) {
    switch (group_size) {
      case 0: return pick_rows<true, 0>(rows_per_task);
      case 32: return pick_rows<true, 32>(rows_per_task);
      case 64: return pick_rows<true, 64>(rows_per_task);
      case 128: return pick_rows<true, 128>(rows_per_task);
      default: return pick_rows<true, 256>(rows_per_task);
    }
  }
  switch (group_size) {
    case 0: return pick_rows<false, 0>(rows_per_task);
    case 64: return pick_rows<false, 64>(rows_per_task);
    case 128: return pick_rows<false, 128>(rows_per_task);
    default: return pick_rows<false, 256>(rows_per_task);
  }
}

}  // namespace

void launch(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq, const float* sx, void* stream,
            const char* op) {
  check(supports(a.M, a.K), ErrorCode::kInvalidArgument, op, "the row kernel takes M = 1 and K <= ", kMaxK,
        "; got M ", a.M, ", K ", a.K);
  const int K = static_cast<int>(a.K);
  // Rows per warp task: a batch holds kLoadsPerLane chunks per lane, so rows of ≤ 4 chunk steps per lane go two to a
  // task (W8 K ≤ 2048, W4 K ≤ 4096).
  const int lane_chunks = (K / (int4 ? 32 : 16) + 31) / 32;
  const int rows_per_task = g_rows_per_task > 0 ? g_rows_per_task : (lane_chunks <= kLoadsPerLane / 2 ? 2 : 1);
  const KernelFn kernel = pick(int4, a.group_size, rows_per_task);
  const int smem = smem_bytes(int4, K);
  CIDER_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  // One 768-thread block per SM (80 registers each: the register file), rows split evenly between the blocks.
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

namespace cider::cuda::gemv_bench {
// For bench/cuda/bench_gemv.cpp and tests only: weight rows per warp task of the row kernel for the following calls
// (0: the launcher's rule, 2 when a row has ≤ 4 chunk steps per lane; 1 or 2 forces it).
void set_gemv_rows_per_task(int rows) {
  check(rows >= 0 && rows <= 2, ErrorCode::kInvalidArgument, "cuda.gemv_bench.set_gemv_rows_per_task",
        "rows per task must be 0 (automatic), 1 or 2; got ", rows);
  gemv_rows::g_rows_per_task = rows;
}
}  // namespace cider::cuda::gemv_bench
