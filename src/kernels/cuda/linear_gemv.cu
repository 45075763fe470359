// cider/kernels/cuda/linear_gemv.cu — W8A8 and W4A8 GEMV for decode (M = 1 … 16): cuda::w8a8_gemv, cuda::w4a8_gemv.
//
// Semantics: kernels::IntLinearArgs (kernel_table.h), reproduced as the CPU reference evaluates it
// (kernels/ref/w8a8_ref.cpp, w4a8_ref.cpp, quant::quantize_int8_row):
//   sx[m] = max|x[m,:]| / 127 (1 if 0; NaN if the row holds NaN/inf, codes 0), xq = clamp(rint(x / sx), ±127)
//   acc_g = Σ_{k∈g} xq·wq (int32, exact),  y = sx · Σ_g fl(sw_g · float(acc_g)),  out = round(y + bias)
// The activation codes are bit-identical to the reference (IEEE division, round-half-even); the integer sums are
// exact; per channel the epilogue is the reference's own sequence of float32 roundings (bit-identical output). Per
// group the float32 sum over groups runs in another order (each warp sums its groups in order, then the warps are
// added in order), which differs from the reference by float32 rounding only (docs/cuda/gemv.md gives the bound).
//
// Design (docs/cuda/gemv.md):
//   * The activation quantization is fused: each block (persistent, looping over 16-row tiles of W) quantizes the
//     M rows of x once into shared memory (two passes over x from L2: max, then codes), after issuing its first
//     batch of weight loads so that HBM is busy meanwhile.
//   * Tile = 16 weight rows × all of K. The 8 warps of a block split K: "units" (a chunk of 64/128 k per channel,
//     or one whole scale group per group) go round-robin to the warps, so a group is never split between warps.
//   * Tensor cores (mma.sync m16n8k32 s8·s8→s32): A = 16 weight rows, B = xq columns m (n8 = 8 activation rows, two
//     of them for M > 8). Each thread loads its A values with one 16-byte load per row (8/4 bytes for W4 groups of
//     64/32); the k order inside an mma is free as long as A and B agree, so thread (g, tig) owns the contiguous
//     k-range [chunk + tig·span/4, +span/4) of rows g and g + 8 and reads the same k-range of xq row m = g.
//   * W4: nibbles unpacked to int8 words in registers ((w & 0x0F0F0F0F) → even elements, (w >> 4) & … → odd),
//     code − 8 bytewise (per group); per channel the codes enter the mma unsigned (mma .u8.s8) and 8·Σ_k xq is
//     subtracted once per output; shared memory holds xq with each 8-value unit stored as [evens | odds] to match.
//   * Epilogue: warp partials through shared memory, summed in warp order, scale/bias, one store per output.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
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
#include "kernels/cuda/linear_gemv_rows.h"
#include "kernels/cuda/pdl.cuh"
#include "quant/int4.h"
#include "quant/int8.h"

namespace cider::cuda {

namespace {

using namespace gemv_device;

constexpr int kTileRows = 16;              // weight rows per tile (the mma's M)
constexpr int kMaxRows = 16;               // activation rows (decode batch) per launch
constexpr int kMaxXqBytes = 96 * 1024;     // shared memory for the quantized activations (M rows × stride)
// Above this many bytes of x per launch, the codes are computed once (workspace) rather than in every block.
constexpr int64_t kFusedQuantizeMaxBytes = 64 * 1024;

// ---- device helpers (more in gemv_device.cuh) -------------------------------------------------------------------

// kWords 32-bit words (4, 2 or 1: a 16-, 8- or 4-byte load) from p into w[0..kWords).
template <int kWords>
__device__ __forceinline__ void load_words(const void* p, uint32_t* w) {
  if constexpr (kWords == 4) {
    const uint4 v = load_stream16(p);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (kWords == 2) {
    const uint2 v = load_stream8(p);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = load_stream4(p);
  }
}

// Asynchronous copy of kBytes (16, 8 or 4) global → shared, zero-filled when !ok (nothing is read then), in the
// calling thread's current cp.async group. 16 bytes bypass L1 (.cg) and let L2 fetch whole 256-byte lines.
template <int kBytes>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, bool ok) {
  const int src_bytes = ok ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(kBytes), "r"(src_bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most kPending of this thread's most recent cp.async groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// kWords 32-bit words from shared memory (16-, 8- or 4-byte aligned as the width requires).
template <int kWords>
__device__ __forceinline__ void load_shared_words(const int8_t* p, uint32_t* w) {
  if constexpr (kWords % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kWords; i += 4) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i / 4];
      w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
    }
  } else if constexpr (kWords == 2) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}

// D += A·B, A 16×32 s8 (rows g, g+8 / k halves), B 32×8 s8, D 16×8 s32 (PTX m16n8k32 fragment layout).
__device__ __forceinline__ void mma_s8(int32_t* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D += A · B with A unsigned: the W4 per-channel kernel's nibble codes 0..15 as stored (no − 8 per byte).
__device__ __forceinline__ void mma_u8s8(int32_t* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four nibbles 0..15 (one per byte) → int8 code − 8 per byte, without carries between bytes:
// (v | 0x80) − 8 stays in 0x78..0x87, and ^ 0x80 turns that into the two's complement of v − 8.
__device__ __forceinline__ uint32_t nibbles_to_s8(uint32_t v) {
  return ((v | 0x80808080u) - 0x08080808u) ^ 0x80808080u;
}




struct GemvParams {
  const void* x;
  DType x_dtype;
  const int8_t* xq;  // quantized activations [M, K] in global memory (workspace), or null: quantize in the kernel
  const float* sx;   // their scales [M] (with xq)
  const void* w;
  const float* w_scales;
  const float* bias;
  void* out;
  DType out_dtype;
  int M;  // rows of x in this launch, 1..16
  int N, K;
  int group_size;   // 0 = per channel
  int xq_stride;    // bytes between xq rows in shared memory
  int prefetch_epilogue;  // 1: load w_scales[n] / bias[n] one tile ahead (see the kernel)
  // A slice of K (the launcher's K split, when 16 rows of xq do not fit shared memory): K is the slice's length, w,
  // w_scales and xq point at its start, w_row_bytes / xq_row are the whole rows' (K's without a split). The partial sums
  // of the slices before come in through part_in, those up to this one go out through part_out ([M, N] int32 per
  // channel, float32 per group, in the float32 output buffer itself: each element read and written by one thread);
  // only the last slice (part_out null) writes the output.
  int64_t w_row_bytes;
  int64_t xq_row;
  const void* part_in;
  void* part_out;
};

// kInt4: W4A8 (packed nibbles) else W8A8. kLoadBytes: bytes of one weight row a thread loads per chunk (16, or 8/4
// for W4 groups of 64/32). kColBlocks: n8 blocks of activation rows (1: M ≤ 8, 2: M ≤ 16). kPerGroup: group scales.
// kGpc: scale groups per chunk — 1, or 2 for W4 groups of 64 with 16-byte loads ("wide" loads: a chunk of 128 k
// holds two groups, threads tig 0–1 in the first, 2–3 in the second; each mma step runs once per group with the B
// words of the other group's threads zeroed, so every int32 sum stays within one group).
template <bool kInt4, int kLoadBytes, int kColBlocks, bool kPerGroup, int kGpc = 1>
struct GemvConfig {
  static constexpr int kLoadWords = kLoadBytes / 4;
  // k values a thread covers per chunk and row, and k values of a chunk (4 threads of a quad side by side).
  static constexpr int kThreadK = kInt4 ? 2 * kLoadBytes : kLoadBytes;
  static constexpr int kChunkK = 4 * kThreadK;
  static constexpr int kSteps = kThreadK / 8;          // mma k32 steps per chunk (8 k per thread per step)
  static constexpr int kXqWords = kThreadK / 4;        // xq words a thread reads per chunk and column block
  // Ring depth: chunk loads a thread keeps in flight (one ring slot is being consumed). 16-byte loads: 8 slots =
  // 2 rows × 112 bytes in flight per thread; narrower loads (W4 groups of 64 / 32) take more slots. Two column
  // blocks (M > 8) take fewer, so that 16 rows of xq + the ring fit the 227 KB of shared memory (cp.async ring) and
  // the register ring its 128 registers.
  static constexpr int kRing = kGpc > 1 ? (kColBlocks == 2 ? 4 : 6)
                               : kLoadBytes == 16 ? (kColBlocks == 2 ? 6 : 8)
                               : (kLoadBytes == 8 ? (kColBlocks == 2 ? 8 : 12) : (kColBlocks == 2 ? 12 : 16));
};

// Shared-memory bytes of the cp.async ring (weights [kRing][2 rows][threads] × kLoadBytes, then group scales
// [kRing][2][threads] floats), behind the xq rows.
template <bool kInt4, int kLoadBytes, int kColBlocks, bool kPerGroup, int kWarps, int kGpc = 1>
constexpr int ring_smem_bytes() {
  using C = GemvConfig<kInt4, kLoadBytes, kColBlocks, kPerGroup, kGpc>;
  return C::kRing * 2 * kWarps * 32 * (kLoadBytes + (kPerGroup ? 4 * kGpc : 0));
}

// Quantizes rows [0, M) of x into xq (shared, row stride p.xq_stride; W4 units of 8 stored as [evens | odds]) and
// sx (shared). Whole block; ends with __syncthreads. Rows go four at a time, their loads issued together: each pass
// costs one round trip to L2 per four rows (row by row took one per row: 17% slower at M 16, K 14336 on the H100,
// docs/cuda/gemv.md).
template <bool kInt4, int kWarps>
__device__ void quantize_x_to_shared(const GemvParams& p, int8_t* xq, float* sx, uint32_t (*amax_partial)[kWarps]) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kRowsAtOnce = 4;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int units = p.K / 8;  // K is a multiple of 16
  const int64_t x_row_elems = p.K;
  // Pass 1: max |x| per row, as the bits of |x| (non-negative floats order like their bits; NaN/inf are ≥ 0x7f800000).
  for (int m0 = 0; m0 < p.M; m0 += kRowsAtOnce) {
    uint32_t amax_bits[kRowsAtOnce] = {};
    for (int u = static_cast<int>(threadIdx.x); u < units; u += kThreads) {
      float v[kRowsAtOnce][8];
#pragma unroll
      for (int r = 0; r < kRowsAtOnce; ++r)
        if (m0 + r < p.M) load_x8(p.x, p.x_dtype, (m0 + r) * x_row_elems + 8 * u, v[r]);
#pragma unroll
      for (int r = 0; r < kRowsAtOnce; ++r)
        if (m0 + r < p.M) {
#pragma unroll
          for (int i = 0; i < 8; ++i) amax_bits[r] = max(amax_bits[r], __float_as_uint(v[r][i]) & 0x7fffffffu);
        }
    }
#pragma unroll
    for (int r = 0; r < kRowsAtOnce; ++r) {
      const uint32_t a = __reduce_max_sync(0xffffffffu, amax_bits[r]);
      if (lane == 0 && m0 + r < p.M) amax_partial[m0 + r][warp] = a;
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < p.M) {
    uint32_t amax_bits = 0;
    for (int w = 0; w < kWarps; ++w) amax_bits = max(amax_bits, amax_partial[threadIdx.x][w]);
    sx[threadIdx.x] = row_scale_from_amax_bits(amax_bits);  // NaN when the row holds a NaN or ±inf: codes 0
  }
  __syncthreads();
  // Pass 2: codes (x is read again, from L1/L2).
  for (int m0 = 0; m0 < p.M; m0 += kRowsAtOnce) {
    for (int u = static_cast<int>(threadIdx.x); u < units; u += kThreads) {
      float v[kRowsAtOnce][8];
#pragma unroll
      for (int r = 0; r < kRowsAtOnce; ++r)
        if (m0 + r < p.M) load_x8(p.x, p.x_dtype, (m0 + r) * x_row_elems + 8 * u, v[r]);
#pragma unroll
      for (int r = 0; r < kRowsAtOnce; ++r) {
        if (m0 + r >= p.M) continue;
        const float s = sx[m0 + r];
        const bool finite = !isnan(s);
        uint32_t c[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) c[i] = finite ? int8_code(v[r][i], s) : 0u;
        *reinterpret_cast<uint2*>(xq + (m0 + r) * p.xq_stride + 8 * u) = pack_unit_codes<kInt4>(c);
      }
    }
  }
  __syncthreads();
}

// Copies activations quantized beforehand (quantize_rows_int8 into the workspace: xq [M, K] plain k order, sx [M])
// into shared memory in the kernel's layout (W4: each unit of 8 as [evens | odds]). Whole block; ends with a barrier.
// The rows' pieces of 16 codes go as one flat list, four 16-byte loads in flight per thread (a decode batch of 16 rows
// of K 4096 in two round trips to L2; row by row it took 16). Workspace rows (xq_row = K) and
// slices (k0 a multiple of 256) start 16-byte aligned; xq_stride is a multiple of 16 (xq_stride_bytes).
template <bool kInt4, int kWarps>
__device__ void copy_xq_to_shared(const GemvParams& p, int8_t* xq, float* sx) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kInFlight = 4;
  const int pieces = p.K / 16;  // K is a multiple of 16
  const int total = p.M * pieces;
  for (int base = static_cast<int>(threadIdx.x); base < total; base += kThreads * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int i = base + j * kThreads;
      if (i < total) {
        const int m = i / pieces, q = i - m * pieces;
        v[j] = *reinterpret_cast<const uint4*>(p.xq + static_cast<int64_t>(m) * p.xq_row + 16 * q);
      }
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int i = base + j * kThreads;
      if (i < total) {
        const int m = i / pieces, q = i - m * pieces;
        const uint2 lo = unit_codes_from_k_order<kInt4>(make_uint2(v[j].x, v[j].y));
        const uint2 hi = unit_codes_from_k_order<kInt4>(make_uint2(v[j].z, v[j].w));
        *reinterpret_cast<uint4*>(xq + m * p.xq_stride + 16 * q) = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
    }
  }
  if (static_cast<int>(threadIdx.x) < p.M) sx[threadIdx.x] = p.sx[threadIdx.x];
  __syncthreads();
}

// Σ_k xq[m][k] for the rows m < M (exact in int32: |Σ| ≤ 127·K), from the codes in shared memory (any k order).
// The W4 per-channel kernel multiplies the nibble codes c as stored and subtracts 8·Σ x once per output:
// Σ (c − 8)·x = Σ c·x − 8·Σ x, both exact (|Σ c·x| ≤ 15·127·K < 2^31 for every K that fits shared memory).
// partial: [kMaxRows][kWarps] scratch. Whole block; two barriers.
template <int kWarps>
__device__ void sum_xq_rows(const GemvParams& p, const int8_t* xq, int32_t (*partial)[kWarps], int32_t* xsum) {
  constexpr int kThreads = kWarps * 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int words = p.K / 4;
  for (int m = 0; m < p.M; ++m) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(xq + m * p.xq_stride);
    int sum = 0;
    for (int i = static_cast<int>(threadIdx.x); i < words; i += kThreads)
      sum = __dp4a(static_cast<int>(row[i]), 0x01010101, sum);  // Σ of 4 signed bytes
    sum = __reduce_add_sync(0xffffffffu, sum);
    if (lane == 0) partial[m][warp] = sum;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < p.M) {
    int sum = 0;
    for (int w = 0; w < kWarps; ++w) sum += partial[threadIdx.x][w];
    xsum[threadIdx.x] = sum;
  }
  __syncthreads();
}

// One persistent block streams the tiles blockIdx.x, blockIdx.x + gridDim.x, … Each warp walks its chunks of those
// tiles as one flat sequence of steps (max_chunks steps per tile, the same count in every warp) through a ring of
// kRing register slots: step s is consumed kRing steps after its load was issued, and the slot is refilled at once
// with step s + kRing, so the loads of the next tile are in flight while a tile's partials are combined.
//
// kAsync: the ring lives in shared memory, filled by cp.async (one commit group per step, wait_group kRing − 1
// before a slot is read: groups complete in order, so exactly the slot's own loads are waited for). Otherwise it lives
// in registers (plain loads): simpler, but the compiler tracks the ring's loads with a handful of scoreboards, so
// reading one slot can wait for loads issued after it (measured 2026-11-29: slower than batches, see gemv.md).
//
// kSplit: warps per tile. The block's kWarps / kSplit tile groups stream their own tiles (group j of block b takes
// tiles j·grid + b, then every grid·groups: the first tiles land on different SMs), split each tile's K among their
// kSplit warps and combine behind a group barrier (kSplit = kWarps: the whole block, as before; 1: no barrier beyond
// the warp; else a named barrier per group). Fewer warps per tile = fewer, smaller barriers per byte streamed.
template <int kSplit, int kWarps>
__device__ __forceinline__ void tile_group_sync(int group) {
  if constexpr (kSplit == kWarps) {
    __syncthreads();
  } else if constexpr (kSplit == 1) {
    __syncwarp();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(group + 1), "r"(kSplit * 32) : "memory");  // id 0 is __syncthreads'
  }
}

template <bool kInt4, int kLoadBytes, int kColBlocks, bool kPerGroup, int kWarps, bool kAsync, int kSplit, int kGpc = 1>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps) int_gemv_kernel(const GemvParams p) {
  using C = GemvConfig<kInt4, kLoadBytes, kColBlocks, kPerGroup, kGpc>;
  static_assert(kWarps % kSplit == 0 && (kSplit == 1 || kWarps / kSplit <= 15), "tile groups: named barriers 1..15");
  static_assert(kGpc == 1 || (kInt4 && kPerGroup && kLoadBytes == 16 && kAsync && 4 % kGpc == 0),
                "groups per chunk: W4 groups with 16-byte loads through the cp.async ring");
  constexpr int kThreads = kWarps * 32;
  constexpr int kGroups = kWarps / kSplit;
  constexpr int kGroupThreads = kSplit * 32;
  extern __shared__ __align__(16) int8_t xq[];  // [M][xq_stride], then the cp.async ring (kAsync)
  __shared__ float sx[kMaxRows];
  __shared__ uint32_t amax_partial[kMaxRows][kWarps];
  // W4 per channel: nibble codes enter the mma unsigned; Σ_k xq[m][k] per row corrects the sums (sum_xq_rows).
  constexpr bool kUnsignedNibbles = kInt4 && !kPerGroup;
  __shared__ int32_t xsum[kUnsignedNibbles ? kMaxRows : 1];
  // Warp partial results, double-buffered by tile parity (one barrier per tile):
  // [parity][warp][column block][fragment element][lane] (int32 per channel, float32 bits per group).
  __shared__ uint32_t partial[2][kWarps][kColBlocks][4][32];

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, tig = lane % 4;  // mma fragment coordinates: row group, thread in group
  const int group = warp / kSplit, wig = warp % kSplit;  // tile group, warp in the group
  const int gthread = static_cast<int>(threadIdx.x) - group * kGroupThreads;
  const int tiles = (p.N + kTileRows - 1) / kTileRows;
  const int grid = static_cast<int>(gridDim.x), block = static_cast<int>(blockIdx.x);
  const int tgrid = grid * kGroups, tfirst = group * grid + block;  // my group's tiles: tfirst + it · tgrid
  const int my_tiles = tfirst < tiles ? (tiles - tfirst + tgrid - 1) / tgrid : 0;
  const int64_t w_row_bytes = p.w_row_bytes;

  // Work split of one tile between the group's warps: units round-robin (unit u → warp u % kSplit), chunks per unit.
  // A unit is one scale group (kGpc 1), or one chunk of kGpc groups; per channel one chunk.
  const int chunks_per_unit = kPerGroup && kGpc == 1 ? p.group_size / C::kChunkK : 1;  // 1, 2, 4 or 8
  const int cpu_shift = __ffs(chunks_per_unit) - 1;
  const int units = kPerGroup && kGpc == 1 ? p.K / p.group_size : (p.K + C::kChunkK - 1) / C::kChunkK;
  const int n_groups = kPerGroup ? p.K / p.group_size : 0;
  const int my_units = wig < units ? (units - wig + kSplit - 1) / kSplit : 0;
  const int my_chunks = my_units * chunks_per_unit;
  const int max_chunks = ((units + kSplit - 1) / kSplit) * chunks_per_unit;  // same in every warp: uniform loops
  const int total_steps = my_tiles * max_chunks;                             // same in every thread of the group

  // Register ring: weight words of rows g and g + 8 per slot, and the group scales of rows g, g + 8 for slots whose
  // chunk closes a group. cp.async ring: slot (b, row) of this thread at ring_w + ((b·2 + row)·threads + tid) · bytes
  // (consecutive threads on consecutive addresses: no bank conflicts), scales likewise at ring_s.
  uint32_t wr[kAsync ? 1 : C::kRing][2][C::kLoadWords];
  float sw[kPerGroup && !kAsync ? C::kRing : 1][2];
  const uint32_t ring_w = smem_u32(xq) + static_cast<uint32_t>(p.M * p.xq_stride);
  const uint32_t ring_s = ring_w + static_cast<uint32_t>(C::kRing * 2 * kThreads * kLoadBytes);
  auto w_slot = [&](int b, int row) {
    return ring_w + static_cast<uint32_t>(((b * 2 + row) * kThreads + static_cast<int>(threadIdx.x)) * kLoadBytes);
  };
  auto s_slot = [&](int b, int row, int j) {  // j: the chunk's group (kGpc > 1)
    return ring_s + static_cast<uint32_t>((((b * 2 + row) * kGpc + j) * kThreads + static_cast<int>(threadIdx.x)) * 4);
  };

  // Load cursor (tile iteration, chunk index q) and consume cursor.
  int load_it = 0, load_q = 0;
  int use_it = 0, use_q = 0;

  // Issues the loads of the load cursor's step into slot b (zeros where there is nothing to load), then advances.
  auto issue = [&](int b) {
    const int q = load_q;
    const int row0 = (tfirst + load_it * tgrid) * kTileRows;
    const int unit = wig + kSplit * (q >> cpu_shift);
    const int chunk = unit * chunks_per_unit + (q & (chunks_per_unit - 1));
    const int k = chunk * C::kChunkK + tig * C::kThreadK;  // first k of my piece
    const bool live = load_it < my_tiles && q < my_chunks;
    const bool k_ok = live && k < p.K;
    const bool row_lo_ok = row0 + g < p.N, row_hi_ok = row0 + g + 8 < p.N;
    const int8_t* w_lo = static_cast<const int8_t*>(p.w) + static_cast<int64_t>(row0 + g) * w_row_bytes +
                         (kInt4 ? k / 2 : k);
    const bool closes_group = live && (q & (chunks_per_unit - 1)) == chunks_per_unit - 1;
    if constexpr (kAsync) {
      // Pointers stay inside the weights when nothing is read (src-size 0 reads no byte, but keep them valid).
      cp_async<kLoadBytes>(w_slot(b, 0), k_ok && row_lo_ok ? w_lo : p.w, k_ok && row_lo_ok);
      cp_async<kLoadBytes>(w_slot(b, 1), k_ok && row_hi_ok ? w_lo + 8 * w_row_bytes : p.w, k_ok && row_hi_ok);
      if constexpr (kPerGroup) {
#pragma unroll
        for (int j = 0; j < kGpc; ++j) {
          const int grp = unit * kGpc + j;  // kGpc 1: the unit is the group
          const bool ok = closes_group && grp < n_groups;
          const float* s = p.w_scales + static_cast<int64_t>(grp) * p.N + row0 + g;
          cp_async<4>(s_slot(b, 0, j), ok && row_lo_ok ? s : p.w_scales, ok && row_lo_ok);
          cp_async<4>(s_slot(b, 1, j), ok && row_hi_ok ? s + 8 : p.w_scales, ok && row_hi_ok);
        }
      }
      cp_async_commit();  // one group per step, empty or not: wait_group counts steps
    } else {
#pragma unroll
      for (int i = 0; i < C::kLoadWords; ++i) wr[b][0][i] = 0, wr[b][1][i] = 0;
      if (k_ok && row_lo_ok) load_words<C::kLoadWords>(w_lo, wr[b][0]);
      if (k_ok && row_hi_ok) load_words<C::kLoadWords>(w_lo + 8 * w_row_bytes, wr[b][1]);
      if constexpr (kPerGroup) {
        sw[b][0] = 0.0f, sw[b][1] = 0.0f;
        if (closes_group) {
          const float* s = p.w_scales + static_cast<int64_t>(unit) * p.N + row0 + g;
          if (row_lo_ok) sw[b][0] = __ldg(s);
          if (row_hi_ok) sw[b][1] = __ldg(s + 8);
        }
      }
    }
    if (++load_q == max_chunks) load_q = 0, ++load_it;
  };

  int32_t acc[kGpc][kColBlocks][4] = {};  // integer sums of the current group(s) (per channel: of all my chunks of the tile)
  float fsum[kColBlocks][4] = {};    // per group: Σ over my groups of fl(sw · float(acc))
  int parity = 0;

  // Epilogue operands (w_scales[n] per channel, bias[n]) of the output row this thread finishes, loaded one tile
  // ahead when p.prefetch_epilogue: otherwise the epilogue threads load them after the tile's barrier, from HBM
  // behind the weight stream (microseconds), and every warp waits for them at the next tile's barrier.
  // Output o = m·16 + r of a tile is finished by group thread o mod kGroupThreads, pass o / kGroupThreads.
  constexpr int kEpPasses = (kTileRows * 8 * kColBlocks + kGroupThreads - 1) / kGroupThreads;
  float ep_scale[kEpPasses] = {}, ep_bias[kEpPasses] = {};
  auto prefetch_epilogue = [&](int it) {
    if (!p.prefetch_epilogue || it >= my_tiles) return;
#pragma unroll
    for (int j = 0; j < kEpPasses; ++j) {
      const int o = gthread + j * kGroupThreads;
      const int n = (tfirst + it * tgrid) * kTileRows + o % kTileRows;
      if (o < kTileRows * p.M && n < p.N) {
        if constexpr (!kPerGroup) ep_scale[j] = __ldg(p.w_scales + n);
        if (p.bias) ep_bias[j] = __ldg(p.bias + n);
      }
    }
  };

  // Prologue: fill the ring, then (while those loads are in flight) the activation codes, once per block.
#pragma unroll
  for (int b = 0; b < C::kRing; ++b) issue(b);
  prefetch_epilogue(0);
  // Everything above read only the weights, their scales and the bias (immutable); x (and xq) come from the previous
  // kernel: with PDL this kernel may have started before it finished (kernels/cuda/pdl.cuh).
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  if (p.xq != nullptr) {
    copy_xq_to_shared<kInt4, kWarps>(p, xq, sx);  // (a plain copy: it does not touch the cp.async groups)
  } else {
    quantize_x_to_shared<kInt4, kWarps>(p, xq, sx, amax_partial);
  }
  if constexpr (kUnsignedNibbles) sum_xq_rows<kWarps>(p, xq, reinterpret_cast<int32_t(*)[kWarps]>(amax_partial), xsum);

  for (int s0 = 0; s0 < total_steps; s0 += C::kRing) {
#pragma unroll
    for (int b = 0; b < C::kRing; ++b) {
      if (s0 + b < total_steps) {  // group-uniform
        const int q = use_q;
        // This step's slot: wait for its cp.async group (the kRing − 1 younger ones may still fly), read it back.
        uint32_t slot_w[2][C::kLoadWords];
        float slot_s[2][kGpc] = {};
        if constexpr (kAsync) {
          cp_async_wait<C::kRing - 1>();
#pragma unroll
          for (int row = 0; row < 2; ++row) {
            const int8_t* wp = xq + (w_slot(b, row) - smem_u32(xq));
            load_shared_words<C::kLoadWords>(wp, slot_w[row]);
            if constexpr (kPerGroup) {
#pragma unroll
              for (int j = 0; j < kGpc; ++j)
                slot_s[row][j] = *reinterpret_cast<const float*>(xq + (s_slot(b, row, j) - smem_u32(xq)));
            }
          }
        } else {
#pragma unroll
          for (int row = 0; row < 2; ++row) {
#pragma unroll
            for (int i = 0; i < C::kLoadWords; ++i) slot_w[row][i] = wr[b][row][i];
            if constexpr (kPerGroup) slot_s[row][0] = sw[b][row];
          }
        }
        if (q < my_chunks) {  // warp-uniform: mma.sync runs warp-wide, only the data is predicated
          const int unit = wig + kSplit * (q >> cpu_shift);
          const int chunk = unit * chunks_per_unit + (q & (chunks_per_unit - 1));
          const int k = chunk * C::kChunkK + tig * C::kThreadK;
          // False for some lanes of a tail chunk: B is zeroed there (W4 zero words unpack to -8, so B matters).
          const bool k_ok = k < p.K;
          // A words, in k order of my piece: W8 = the loaded words; W4 = per loaded word [evens, odds].
          uint32_t a_lo[2 * C::kSteps], a_hi[2 * C::kSteps];
#pragma unroll
          for (int i = 0; i < C::kLoadWords; ++i) {
            if constexpr (kUnsignedNibbles) {  // the codes as stored: 3 ops per word instead of 7
              a_lo[2 * i] = slot_w[0][i] & 0x0f0f0f0fu;
              a_lo[2 * i + 1] = (slot_w[0][i] >> 4) & 0x0f0f0f0fu;
              a_hi[2 * i] = slot_w[1][i] & 0x0f0f0f0fu;
              a_hi[2 * i + 1] = (slot_w[1][i] >> 4) & 0x0f0f0f0fu;
            } else if constexpr (kInt4) {
              a_lo[2 * i] = nibbles_to_s8(slot_w[0][i] & 0x0f0f0f0fu);
              a_lo[2 * i + 1] = nibbles_to_s8((slot_w[0][i] >> 4) & 0x0f0f0f0fu);
              a_hi[2 * i] = nibbles_to_s8(slot_w[1][i] & 0x0f0f0f0fu);
              a_hi[2 * i + 1] = nibbles_to_s8((slot_w[1][i] >> 4) & 0x0f0f0f0fu);
            } else {
              a_lo[i] = slot_w[0][i];
              a_hi[i] = slot_w[1][i];
            }
          }
#pragma unroll
          for (int cb = 0; cb < kColBlocks; ++cb) {
            const int m = cb * 8 + g;
            uint32_t xw[C::kXqWords];
            if (k_ok && m < p.M) {
              load_shared_words<C::kXqWords>(xq + m * p.xq_stride + k, xw);
            } else {
#pragma unroll
              for (int i = 0; i < C::kXqWords; ++i) xw[i] = 0;
            }
#pragma unroll
            for (int s = 0; s < C::kSteps; ++s) {
              if constexpr (kUnsignedNibbles) {
                mma_u8s8(acc[0][cb], a_lo[2 * s], a_hi[2 * s], a_lo[2 * s + 1], a_hi[2 * s + 1], xw[2 * s],
                         xw[2 * s + 1]);
              } else if constexpr (kGpc == 1) {
                mma_s8(acc[0][cb], a_lo[2 * s], a_hi[2 * s], a_lo[2 * s + 1], a_hi[2 * s + 1], xw[2 * s], xw[2 * s + 1]);
              } else {
#pragma unroll
                for (int j = 0; j < kGpc; ++j) {  // group j: the k of threads tig / (4 / kGpc) == j only
                  const bool mine = tig / (4 / kGpc) == j;
                  mma_s8(acc[j][cb], a_lo[2 * s], a_hi[2 * s], a_lo[2 * s + 1], a_hi[2 * s + 1], mine ? xw[2 * s] : 0u,
                         mine ? xw[2 * s + 1] : 0u);
                }
              }
            }
          }
          if constexpr (kPerGroup) {
            if ((q & (chunks_per_unit - 1)) == chunks_per_unit - 1) {  // my group ends: fold it as the reference does
#pragma unroll
              for (int cb = 0; cb < kColBlocks; ++cb) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
#pragma unroll
                  for (int j = 0; j < kGpc; ++j) {  // the chunk's groups in k order
                    const float scale = slot_s[e / 2][j];  // fragment elements 0, 1: row g; 2, 3: row g + 8
                    fsum[cb][e] = __fadd_rn(fsum[cb][e], __fmul_rn(scale, __int2float_rn(acc[j][cb][e])));
                    acc[j][cb][e] = 0;
                  }
                }
              }
            }
          }
        }
        issue(b);  // refill the slot just consumed: step s + kRing
        if (q == max_chunks - 1) {
          // The tile is done in every warp of the group after this barrier: combine the partials; group thread
          // o = m·16 + r (in kEpPasses passes) finishes output (m, row0 + r).
#pragma unroll
          for (int cb = 0; cb < kColBlocks; ++cb) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              partial[parity][warp][cb][e][lane] =
                  kPerGroup ? __float_as_uint(fsum[cb][e]) : static_cast<uint32_t>(acc[0][cb][e]);
#pragma unroll
              for (int j = 0; j < kGpc; ++j) acc[j][cb][e] = 0;
              fsum[cb][e] = 0.0f;
            }
          }
          tile_group_sync<kSplit, kWarps>(group);
          const int row0 = (tfirst + use_it * tgrid) * kTileRows;
          const int w0 = group * kSplit;
#pragma unroll
          for (int j = 0; j < kEpPasses; ++j) {
            const int o = gthread + j * kGroupThreads;
            const int m = o / kTileRows, r = o % kTileRows;
            const int n = row0 + r;
            if (o < kTileRows * p.M && n < p.N) {
              // Fragment position of (row r, column m): D element c0/c1 = (row g, col 2·tig + 0/1), c2/c3 = row g + 8.
              const int cb = m / 8, col = m % 8;
              const int e = (r >= 8 ? 2 : 0) + col % 2;
              const int src_lane = (r % 8) * 4 + col / 2;
              float y;
              const int64_t at = static_cast<int64_t>(m) * p.N + n;
              if constexpr (kPerGroup) {
                float s = p.part_in ? static_cast<const float*>(p.part_in)[at] : 0.0f;  // the slices before
#pragma unroll
                for (int w = 0; w < kSplit; ++w)
                  s = __fadd_rn(s, __uint_as_float(partial[parity][w0 + w][cb][e][src_lane]));
                if (p.part_out) {
                  static_cast<float*>(p.part_out)[at] = s;
                  continue;
                }
                y = __fmul_rn(sx[m], s);
              } else {
                int32_t a = p.part_in ? static_cast<const int32_t*>(p.part_in)[at] : 0;  // exact: int32 sums
#pragma unroll
                for (int w = 0; w < kSplit; ++w) a += static_cast<int32_t>(partial[parity][w0 + w][cb][e][src_lane]);
                if constexpr (kUnsignedNibbles) a -= 8 * xsum[m];  // Σ (c − 8)·x, exactly the reference's sum
                if (p.part_out) {
                  static_cast<int32_t*>(p.part_out)[at] = a;
                  continue;
                }
                const float scale = p.prefetch_epilogue ? ep_scale[j] : p.w_scales[n];
                y = __fmul_rn(sx[m], __fmul_rn(scale, __int2float_rn(a)));
              }
              if (p.bias) y = __fadd_rn(y, p.prefetch_epilogue ? ep_bias[j] : p.bias[n]);
              store_out(p.out, p.out_dtype, at, y);
            }
          }
          // No second barrier: the next tile writes the other parity; this one is rewritten two tiles later, after
          // the next tile's group barrier, which every thread of the group reaches only when done reading it here.
          parity ^= 1;
          prefetch_epilogue(use_it + 1);
        }
        if (++use_q == max_chunks) use_q = 0, ++use_it;
      }
    }
  }
  // The last kRing groups copied nothing (or zeros) but still write shared memory: let them land before exit.
  if constexpr (kAsync) cp_async_wait<0>();
}

// Load-only roof for a shape's weight bytes: the same 16-byte streaming loads over `bytes` (a multiple of 16), no
// arithmetic; 4 blocks of 512 threads per SM, 8 loads in flight per thread. For gemv_bench only.
__global__ void __launch_bounds__(512, 4) stream_read_kernel(const uint4* p, int64_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n16; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = load_stream16(p + i + j * stride);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = load_stream16(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; (almost) never stores
}

// ---- host side -------------------------------------------------------------------------------------------------

using KernelFn = void (*)(GemvParams);

// Bytes between xq rows in shared memory: K rounded up to 128 plus a pad that keeps the rows g, g + 1, … read in one
// shared-memory phase on different banks (W4 16-byte loads read 16 of every 32 bytes; the others read 4·span/4).
int xq_stride_bytes(bool int4, int load_bytes, int64_t K) {
  const int64_t base = (K + 127) / 128 * 128;
  const int xq_bytes_per_thread = int4 ? 2 * load_bytes : load_bytes;
  const int pad = (int4 && load_bytes == 16) ? 16 : 4 * std::min(xq_bytes_per_thread, 16);
  return static_cast<int>(base + pad);
}

// Launch knobs that the benchmarks vary (gemv_bench::set_gemv_tuning); 0 = the launcher's own choice.
struct GemvTuning {
  int warps = 0;          // 8 or 16 warps per block (8: per-channel scales only)
  int blocks_per_sm = 0;  // cap on resident blocks per SM
  int quantize = 0;       // 1: in every block (fused), 2: once into exec.workspace when it is large enough
  int ring = 0;           // 1: register ring (plain loads), 2 (automatic): cp.async ring in shared memory
  int epilogue_prefetch = 0;  // 0 (automatic) / 1: load the epilogue's scale/bias one tile ahead; 2: after the barrier
  int split = 0;          // warps per tile with 16 warps and the cp.async ring: 1, 2, 4 or 16 (0: automatic)
  int kernel = 0;         // 1: the tile kernel, 2: the row kernel (M = 1 only); 0: automatic
  int k_split = 0;        // 1: never split K (rows that do not fit go in several passes); 0: automatic
};
GemvTuning g_tuning;
int g_last_kernel = 0;  // the kernel of the latest launch (1 tile, 2 rows): gemv_bench::last_gemv_kernel
int g_last_k_slices = 1;  // slices of K of the latest tile-kernel call: gemv_bench::last_gemv_k_slices

// One instantiation and the shared memory it needs beyond the xq rows (its cp.async ring).
struct KernelChoice {
  KernelFn fn;
  int ring_bytes;
};

template <bool kInt4, int kLoadBytes, bool kPerGroup, int kWarps, bool kAsync, int kSplit, int kGpc = 1>
KernelChoice pick_rows(int M) {
  if (M <= 8)
    return {int_gemv_kernel<kInt4, kLoadBytes, 1, kPerGroup, kWarps, kAsync, kSplit, kGpc>,
            kAsync ? ring_smem_bytes<kInt4, kLoadBytes, 1, kPerGroup, kWarps, kGpc>() : 0};
  return {int_gemv_kernel<kInt4, kLoadBytes, 2, kPerGroup, kWarps, kAsync, kSplit, kGpc>,
          kAsync ? ring_smem_bytes<kInt4, kLoadBytes, 2, kPerGroup, kWarps, kGpc>() : 0};
}

// 16 warps per block: tile groups of 1, 2, 4 or 16 warps with the cp.async ring; the register ring keeps 16.
template <bool kAsync, bool kInt4, int kLoadBytes, bool kPerGroup, int kGpc = 1>
KernelChoice pick16(int M, int split) {
  if constexpr (kAsync) {
    if (split == 1) return pick_rows<kInt4, kLoadBytes, kPerGroup, 16, true, 1, kGpc>(M);
    if (split == 2) return pick_rows<kInt4, kLoadBytes, kPerGroup, 16, true, 2, kGpc>(M);
    if (split == 4) return pick_rows<kInt4, kLoadBytes, kPerGroup, 16, true, 4, kGpc>(M);
  }
  return pick_rows<kInt4, kLoadBytes, kPerGroup, 16, kAsync, 16, kGpc>(M);
}

// gpc: scale groups per chunk (2: W4 groups of 64 with 16-byte loads; the cp.async ring only).
template <bool kAsync>
KernelChoice select_ring(bool int4, int load_bytes, int M, bool per_group, int warps, int split, int gpc) {
  if (!per_group && warps == 8)
    return int4 ? pick_rows<true, 16, false, 8, kAsync, 8>(M) : pick_rows<false, 16, false, 8, kAsync, 8>(M);
  if (!int4) return per_group ? pick16<kAsync, false, 16, true>(M, split) : pick16<kAsync, false, 16, false>(M, split);
  if (!per_group) return pick16<kAsync, true, 16, false>(M, split);
  if constexpr (kAsync) {  // groups of 64 always two per chunk here
    if (gpc == 2) return pick16<true, true, 16, true, 2>(M, split);
  } else {
    if (load_bytes == 8) return pick16<false, true, 8, true>(M, split);
  }
  if (load_bytes == 16) return pick16<kAsync, true, 16, true>(M, split);
  return pick16<kAsync, true, 4, true>(M, split);
}

// The instantiation for (int4, load width, M, per group, warps, ring kind, warps per tile, groups per chunk); 8 warps
// exist for per-channel scales only and always share a tile; so do 16 warps with the register ring.
KernelChoice select_kernel(bool int4, int load_bytes, int M, bool per_group, int warps, bool async_ring, int split,
                           int gpc) {
  return async_ring ? select_ring<true>(int4, load_bytes, M, per_group, warps, split, gpc)
                    : select_ring<false>(int4, load_bytes, M, per_group, warps, split, gpc);
}

// Warps per tile for a 16-warp block (docs/cuda/gemv.md, round 4): the bench/test knob, else $CIDER_GEMV_SPLIT
// (1, 2, 4 or 16: an A/B switch read at every call), else 4 — measured on the H200 (job 6) the fastest or within 1%
// of it in every benchmarked shape: M 1/4/16, N 4096/14336/28672, per channel and groups 32/128, W8 and W4.
int choose_split(int knob, const char* op) {
  if (knob > 0) return knob;
  return std::stoi(env_word("CIDER_GEMV_SPLIT", "4", {"1", "2", "4", "16"}, op));
}

// Which kernel serves an M = 1 call: the bench/test knob, else $CIDER_GEMV_KERNEL ("tile" or "rows", an A/B switch
// read at every call), else the tile kernel when one of its own launch knobs is set (those tests and benchmark rows
// are about it), else the row kernel (docs/cuda/gemv.md, round 6).
constexpr int kKernelTile = 1, kKernelRows = 2;
int choose_kernel(const GemvTuning& t, const char* op) {
  if (t.kernel > 0) return t.kernel;
  if (const std::string v = env_word("CIDER_GEMV_KERNEL", "", {"tile", "rows"}, op); !v.empty())
    return v == "tile" ? kKernelTile : kKernelRows;
  const bool tile_knobs = t.warps || t.blocks_per_sm || t.ring || t.epilogue_prefetch || t.split;
  return tile_knobs ? kKernelTile : kKernelRows;
}

void launch_int_gemv(const kernels::IntLinearArgs& a, bool int4, const Exec& exec, const char* op) {
  check(a.M >= 1 && a.M <= kMaxRows, ErrorCode::kInvalidArgument, op,
        "M (activation rows) must be 1..16 for the decode GEMV (use the GEMM for more); got ", a.M);
  check(a.N >= 1, ErrorCode::kShapeMismatch, op, "N (output channels) must be >= 1; got ", a.N);
  const int k_multiple = int4 ? 32 : 16;  // whole 16-byte weight pieces per row
  check(a.K >= k_multiple && a.K % k_multiple == 0, ErrorCode::kShapeMismatch, op, "K must be a positive multiple of ",
        k_multiple, " (16-byte weight rows); got ", a.K);
  check(a.N <= INT32_MAX / 2 && a.K <= INT32_MAX / 2, ErrorCode::kShapeMismatch, op,
        "N and K must fit the kernel's 32-bit indexing; got N ", a.N, ", K ", a.K);
  check(a.x_dtype == DType::kF32 || a.x_dtype == DType::kF16 || a.x_dtype == DType::kBF16, ErrorCode::kInvalidArgument,
        op, "x dtype must be f32, f16 or bf16; got ", dtype_name(a.x_dtype));
  check(a.out_dtype == DType::kF32 || a.out_dtype == DType::kF16 || a.out_dtype == DType::kBF16,
        ErrorCode::kInvalidArgument, op, "out dtype must be f32, f16 or bf16; got ", dtype_name(a.out_dtype));
  const bool gs_ok = int4 ? quant::is_int4_group_size(a.group_size) : quant::is_int8_group_size(a.group_size);
  check(gs_ok, ErrorCode::kInvalidArgument, op, "group_size must be 0 (per channel), ", int4 ? "32, " : "",
        "64, 128 or 256; got ", a.group_size);
  check(a.group_size == 0 || a.K % a.group_size == 0, ErrorCode::kShapeMismatch, op,
        "K must be a multiple of group_size ", a.group_size, "; got ", a.K);
  const int64_t max_accum_k = int4 ? quant::kInt4MaxAccumK : quant::kInt8MaxAccumK;
  check(a.group_size > 0 || a.K <= max_accum_k, ErrorCode::kShapeMismatch, op,
        "per-channel K must be <= ", max_accum_k, " (int32 sums); got ", a.K);
  check(a.x && a.w && a.w_scales && a.out, ErrorCode::kInvalidArgument, op,
        "x, w, w_scales and out must be device pointers, not null");
  check(reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0,
        ErrorCode::kInvalidArgument, op, "x and w must be 16-byte aligned (vector loads)");

  // Weight bytes each thread loads per row and chunk: a chunk (4 threads side by side) holds one group, or (W4
  // groups of 64 with the cp.async ring) two groups, each thread's 16 bytes inside one of them: 16-byte loads
  // instead of 8 (H100, 2026-12-06: W4A8 g64 K4096 N14336 M16 29.0 → 26.3 µs, M8 27.3 → 23.1, M4 25.2 → 21.5).
  const GemvTuning tuning = g_tuning;
  const bool async_ring = tuning.ring != 1;
  int load_bytes = 16, gpc = 1;
  if (int4 && a.group_size > 0 && a.group_size < 128) load_bytes = a.group_size / 8;  // 64 → 8, 32 → 4
  if (int4 && a.group_size == 64 && async_ring) load_bytes = 16, gpc = 2;
  const int stride = xq_stride_bytes(int4, load_bytes, a.K);
  check(stride <= kMaxXqBytes, ErrorCode::kUnsupported, op, "K must be <= ", kMaxXqBytes - 128,
        " (one quantized activation row in shared memory); got ", a.K);
  require_device(op);
  const DeviceInfo& dev = device_info();
  // Activation codes: every block derives them itself (fused; nothing extra to launch), or, when x is large (every
  // block would re-read and re-divide all of it) and the caller gave a workspace, one quantize_rows_int8 launch
  // writes them once and every block copies them from L2.
  const int64_t x_row_bytes = a.K * dtype_size(a.x_dtype);
  const bool workspace_ok = exec.workspace != nullptr &&
                            exec.workspace_bytes >= int_linear_workspace_bytes(a.M, a.K) &&
                            reinterpret_cast<uintptr_t>(exec.workspace) % 256 == 0;
  bool use_workspace = workspace_ok && a.M * x_row_bytes > kFusedQuantizeMaxBytes;
  if (tuning.quantize == 1) use_workspace = false;
  if (tuning.quantize == 2) use_workspace = workspace_ok;
  const int8_t* ws_xq = nullptr;
  const float* ws_sx = nullptr;
  auto stream = static_cast<cudaStream_t>(exec.stream);
  if (use_workspace) {
    auto* xq = static_cast<int8_t*>(exec.workspace);
    auto* sx = reinterpret_cast<float*>(static_cast<uint8_t*>(exec.workspace) +
                                        (static_cast<size_t>(a.M * a.K) + 255) / 256 * 256);
    quantize_rows_int8(a.x, a.x_dtype, a.M, a.K, xq, sx, exec);
    ws_xq = xq;
    ws_sx = sx;
  }

  // One activation row: the warp-per-row kernel (linear_gemv_rows.cu), unless the tile kernel is asked for.
  if (gemv_rows::supports(a.M, a.K) && choose_kernel(tuning, op) == kKernelRows) {
    gemv_rows::launch(a, int4, ws_xq, ws_sx, exec.stream, op);
    g_last_kernel = kKernelRows;
    return;
  }

  const int warps = (tuning.warps == 8 && a.group_size == 0) ? 8 : 16;
  // Warps per tile (16-warp blocks with the cp.async ring; others: the whole block).
  const int split = warps == 16 && async_ring ? choose_split(tuning.split, op) : warps;
  // Rows per launch: as many as shared memory holds beside the static arrays and the ring (all 16 for K up to ~5k,
  // else the rows go in several passes of at most 8).
  auto xq_rows_that_fit = [&](int rows, int row_stride) {
    const KernelChoice kc = select_kernel(int4, load_bytes, rows, a.group_size > 0, warps, async_ring, split, gpc);
    cudaFuncAttributes attr{};
    CIDER_CUDA_CHECK(op, cudaFuncGetAttributes(&attr, kc.fn));
    const int64_t budget = static_cast<int64_t>(dev.max_shared_per_block_optin) -
                           static_cast<int64_t>(attr.sharedSizeBytes) - kc.ring_bytes;
    return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(budget, kMaxXqBytes) / row_stride));
  };
  int rows_per_launch = static_cast<int>(std::min<int64_t>(a.M, kMaxRows));
  // When the rows' codes do not fit shared memory (the down projection: K 14 336 holds 6 rows), K goes in slices
  // that let every row fit (each slice streams its part of the weights once) — with the codes in the workspace (whole
  // rows quantized once) and a float32 output to carry the partial sums; else the rows go in several passes.
  int64_t k_slice = a.K;
  int xq_stride = stride;
  if (xq_rows_that_fit(rows_per_launch, stride) < rows_per_launch && rows_per_launch > 1 && use_workspace &&
      a.out_dtype == DType::kF32 && tuning.k_split != 1) {
    const int64_t unit = std::max<int64_t>(256, a.group_size);  // whole chunks and groups (group sizes divide 256)
    for (int parts = 2; parts <= 16; ++parts) {
      const int64_t kp = ((a.K + parts - 1) / parts + unit - 1) / unit * unit;
      const int st = xq_stride_bytes(int4, load_bytes, kp);
      if (kp < a.K && xq_rows_that_fit(rows_per_launch, st) >= rows_per_launch) {
        k_slice = kp;
        xq_stride = st;
        break;
      }
    }
  }
  if (k_slice == a.K && xq_rows_that_fit(rows_per_launch, stride) < rows_per_launch)
    rows_per_launch = std::min(8, xq_rows_that_fit(8, stride));
  check(rows_per_launch >= 1, ErrorCode::kUnsupported, op,
        "K is too large for one quantized activation row in shared memory beside the load ring; got ", a.K);
  g_last_kernel = kKernelTile;
  g_last_k_slices = static_cast<int>((a.K + k_slice - 1) / k_slice);
  const int tiles = static_cast<int>((a.N + kTileRows - 1) / kTileRows);
  const int64_t out_row_bytes = a.N * dtype_size(a.out_dtype);

  for (int64_t m0 = 0; m0 < a.M; m0 += rows_per_launch)
  for (int64_t k0 = 0; k0 < a.K; k0 += k_slice) {
    const int rows = static_cast<int>(std::min<int64_t>(rows_per_launch, a.M - m0));
    const int64_t klen = std::min(k_slice, a.K - k0);
    const bool first = k0 == 0, last = k0 + klen == a.K;
    const KernelChoice kc = select_kernel(int4, load_bytes, rows, a.group_size > 0, warps, async_ring, split, gpc);
    const KernelFn kernel = kc.fn;
    const size_t smem = static_cast<size_t>(rows) * static_cast<size_t>(xq_stride) + static_cast<size_t>(kc.ring_bytes);
    allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, op);
    int blocks_per_sm = 0;
    CIDER_CUDA_CHECK(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, warps * 32, smem));
    blocks_per_sm = std::max(blocks_per_sm, 1);
    // Every block quantizes all of x when fused: for a large x, fewer blocks re-read it (one per SM).
    if (!use_workspace && static_cast<int64_t>(rows) * x_row_bytes > kFusedQuantizeMaxBytes) blocks_per_sm = 1;
    if (tuning.blocks_per_sm > 0) blocks_per_sm = std::min(blocks_per_sm, tuning.blocks_per_sm);
    const int grid = std::min(tiles, dev.sm_count * blocks_per_sm);

    GemvParams p{};
    p.x = static_cast<const uint8_t*>(a.x) + m0 * x_row_bytes;
    p.x_dtype = a.x_dtype;
    p.xq = use_workspace ? ws_xq + m0 * a.K + k0 : nullptr;
    p.sx = use_workspace ? ws_sx + m0 : nullptr;
    p.w = static_cast<const uint8_t*>(a.w) + (int4 ? k0 / 2 : k0);
    p.w_scales = a.group_size > 0 ? a.w_scales + (k0 / a.group_size) * a.N : a.w_scales;
    p.bias = a.bias;
    p.out = static_cast<uint8_t*>(a.out) + m0 * out_row_bytes;
    p.out_dtype = a.out_dtype;
    p.M = rows;
    p.N = static_cast<int>(a.N);
    p.K = static_cast<int>(klen);
    p.group_size = a.group_size;
    p.xq_stride = xq_stride;
    p.w_row_bytes = int4 ? a.K / 2 : a.K;
    p.xq_row = a.K;
    p.part_in = first ? nullptr : p.out;
    p.part_out = last ? nullptr : p.out;
    p.prefetch_epilogue = tuning.epilogue_prefetch == 2 ? 0 : 1;  // prefetch measured faster everywhere (docs/cuda/gemv.md)
    CIDER_CUDA_CHECK(op, cuda::pdl::launch(kernel, dim3(static_cast<unsigned>(grid)), dim3(static_cast<unsigned>(warps * 32)),
                                          smem, stream, p));
    check_last_launch(op);
  }
}

}  // namespace

void w8a8_gemv(const kernels::IntLinearArgs& args, const Exec& exec) {
  launch_int_gemv(args, /*int4=*/false, exec, "cuda.w8a8_gemv");
}

void w4a8_gemv(const kernels::IntLinearArgs& args, const Exec& exec) {
  launch_int_gemv(args, /*int4=*/true, exec, "cuda.w4a8_gemv");
}

namespace gemv_bench {
// For bench/cuda/bench_gemv.cpp and tests/cuda/test_cuda_gemv.cpp only (not part of cuda_api.h).
// Launch knobs for the following w8a8_gemv / w4a8_gemv calls (0 = automatic): warps per block 8 or 16, a cap on
// blocks per SM, quantize 1 = fused in every block, 2 = once into exec.workspace; ring 1 = registers, 2 = cp.async;
// epilogue_prefetch 1 = the epilogue's per-row operands loaded one tile ahead; split = warps per tile (1, 2, 4, 16) for
// 16-warp blocks with the cp.async ring.
void set_gemv_tuning(int warps, int blocks_per_sm, int quantize, int ring, int epilogue_prefetch, int split) {
  check(split == 0 || split == 1 || split == 2 || split == 4 || split == 16, ErrorCode::kInvalidArgument,
        "cuda.gemv_bench.set_gemv_tuning", "split (warps per tile) must be 0, 1, 2, 4 or 16; got ", split);
  g_tuning.warps = warps;
  g_tuning.blocks_per_sm = blocks_per_sm;
  g_tuning.quantize = quantize;
  g_tuning.ring = ring;
  g_tuning.epilogue_prefetch = epilogue_prefetch;
  g_tuning.split = split;
}
// Kernel for the following M = 1 calls: 0 automatic, 1 the tile kernel, 2 the row kernel.
void set_gemv_kernel(int kernel) {
  check(kernel >= 0 && kernel <= 2, ErrorCode::kInvalidArgument, "cuda.gemv_bench.set_gemv_kernel",
        "kernel must be 0 (automatic), 1 (tile) or 2 (rows); got ", kernel);
  g_tuning.kernel = kernel;
}
int last_gemv_kernel() { return g_last_kernel; }
// K in slices when the rows' codes do not fit shared memory: 0 automatic, 1 never (the rows in several passes).
void set_gemv_k_split(int mode) {
  check(mode == 0 || mode == 1, ErrorCode::kInvalidArgument, "cuda.gemv_bench.set_gemv_k_split",
        "mode must be 0 (automatic) or 1 (never); got ", mode);
  g_tuning.k_split = mode;
}
int last_gemv_k_slices() { return g_last_k_slices; }
// Reads `bytes` (a multiple of 16, 16-byte aligned) with the GEMV's streaming loads and nothing else: the
// achievable read roof for a weight matrix of that size. sink: one device uint32 (written almost never).
void stream_read(const void* p, size_t bytes, void* sink, void* stream) {
  constexpr const char* kOp = "cuda.gemv_bench.stream_read";
  check(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0, ErrorCode::kInvalidArgument, kOp,
        "bytes and address must be multiples of 16; got ", bytes);
  const int grid = device_info().sm_count * 4;
  stream_read_kernel<<<grid, 512, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(p), static_cast<int64_t>(bytes / 16), static_cast<uint32_t*>(sink));
  check_last_launch(kOp);
}
}  // namespace gemv_bench

}  // namespace cider::cuda
