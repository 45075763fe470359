// cider/kernels/cuda/linear_ggml_rows.cu — decode GEMV over native GGUF blocks (M = 1 … 8 activation rows per
// launch): whole row segments streamed into shared memory by bulk copies, the pieces decoded from there.
//
// Why (docs/benchmarks.md, native weights on the H200): the warp-per-row kernel of linear_ggml.cu reads each piece
// straight from global memory — a lane's piece is 18–34 bytes in word loads plus its block's scale words, one row
// per warp and a CTA of 4 warps per 4 rows — and streamed Q4_K at 2.06 TB/s, half the read roof. Here the bytes
// travel the way the W4A8 row kernel's do (linear_gemv_rows.cu): one CTA per SM over a balanced contiguous range of
// weight rows, 16 warps, each warp with two 4 KB shared-memory slots that lane 0 fills with one cp.async.bulk per row
// segment (completion counted on an mbarrier per slot), so two segments per warp are in flight while the lanes
// decode a third's pieces from shared memory.
//
// Phases of one CTA (shapes: K = 32·P, a segment = whole blocks, ≤ 4 KB, 16-byte multiple):
//   prologue   barriers initialised, the warp's first two segments requested (weights only: before the PDL wait);
//   activations  after the wait: the tile's xq [MT, K] int8, xs [MT, P] float2, dx [MT, P] f32 copied from the
//              workspace (quantize_pieces of linear_ggml.cu) into shared memory, rows past the call's zero;
//   segments   per warp, rows w, w + 16, … of the CTA's range, each row's segments in order: wait on the slot's
//              barrier, lane ℓ takes pieces ℓ, ℓ + 32, … of the segment (ggml_piece.cuh from shared memory), per
//              activation row S_h = Σ c·xq by dp4a and acc += dx·(a₀·S₀ + a₁·S₁) + b₀·X₀ + b₁·X₁ (the warp-per-row
//              kernel's arithmetic, term for term), then the slot is refilled with the segment two ahead;
//   row end    after a row's last segment: a butterfly sum over the lanes, lane 0 adds the bias and stores.
// The float32 sums run in another order than the CPU's (pieces by lane, then the butterfly): the same bound as the
// warp-per-row kernel (tests/cuda/test_cuda_ggml.cpp).
#include "kernels/cuda/linear_ggml_rows.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv_device.cuh"
#include "kernels/cuda/ggml_piece.cuh"
#include "kernels/cuda/pdl.cuh"

namespace cider::cuda::ggml_rows {

namespace {

using namespace ggml_device;
using gemv_device::bulk_load;
using gemv_device::fence_proxy_async;
using gemv_device::mbar_expect_tx;
using gemv_device::mbar_init;
using gemv_device::mbar_init_fence;
using gemv_device::mbar_wait;

constexpr int kWarps = 16;        // warps per CTA (one CTA per SM)
constexpr int kSlots = 2;         // shared-memory slots per warp: segments in flight beside the one decoded
constexpr int kSlotBytes = 4096;  // one slot; a segment is the most whole blocks of a 16-byte multiple that fit

struct Params {
  const uint8_t* w;  // N rows of row_bytes
  int64_t row_bytes;
  int N, K;
  int rows;          // activation rows of the tile that exist (≤ MT); the others are zeros and not stored
  int seg_bytes;     // bytes of a full segment (a multiple of lcm(block bytes, 16))
  const int8_t* xq;  // [rows, K] of the tile
  const float* dx;   // [rows, P]
  const float2* xs;  // [rows, P]
  const float* bias; // [N] or null
  float* out;        // [rows, N] of the tile
};

// Shared memory of a CTA: the slots, then xq [MT][K], xs [MT][P] float2, dx [MT][P] f32.
__host__ __device__ constexpr int64_t slots_bytes() { return int64_t{kWarps} * kSlots * kSlotBytes; }
__host__ __device__ constexpr int64_t smem_bytes(int mt, int64_t K) {
  return slots_bytes() + mt * K + mt * (K / 32) * 12;
}

template <GgmlType T, int MT>
__global__ void __launch_bounds__(kWarps * 32, 1) ggml_rows_kernel(const Params p) {
  constexpr int kPieces = pieces_per_block<T>();
  constexpr int kBytes = Fmt<T>::kBytes;
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bars[kWarps * kSlots];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int K = p.K, P = K / 32;
  int8_t* xq = reinterpret_cast<int8_t*>(smem + slots_bytes());
  float2* xs = reinterpret_cast<float2*>(xq + static_cast<int64_t>(MT) * K);  // MT·K: a multiple of 32 bytes
  float* dx = reinterpret_cast<float*>(xs + MT * P);
  uint8_t* my_slots = smem + static_cast<int64_t>(warp) * kSlots * kSlotBytes;
  uint64_t* my_bars = bars + warp * kSlots;

  // This CTA's rows: a balanced contiguous range; warp w takes rows row_begin + w, + kWarps, …
  const int row_begin = static_cast<int>(static_cast<int64_t>(p.N) * blockIdx.x / gridDim.x);
  const int row_end = static_cast<int>(static_cast<int64_t>(p.N) * (blockIdx.x + 1) / gridDim.x);
  const int my_rows = warp < row_end - row_begin ? (row_end - row_begin - warp + kWarps - 1) / kWarps : 0;
  const int segs = static_cast<int>((p.row_bytes + p.seg_bytes - 1) / p.seg_bytes);  // per row
  const int iters = my_rows * segs;  // warp-uniform

  // Segment `it` of this warp into slot it % kSlots (lane 0 only).
  auto issue = [&](int it) {
    const int row = row_begin + warp + (it / segs) * kWarps;
    const int64_t off = static_cast<int64_t>(it % segs) * p.seg_bytes;
    const uint32_t len = static_cast<uint32_t>(min(static_cast<int64_t>(p.seg_bytes), p.row_bytes - off));
    uint64_t* bar = my_bars + it % kSlots;
    fence_proxy_async();  // the slot's earlier reads (ordered by __syncwarp) before the copy overwrites it
    mbar_expect_tx(bar, len);
    bulk_load(my_slots + (it % kSlots) * kSlotBytes, p.w + static_cast<int64_t>(row) * p.row_bytes + off, len, bar);
  };

  if (lane == 0) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) mbar_init(my_bars + s);
    mbar_init_fence();
#pragma unroll
    for (int s = 0; s < kSlots; ++s)
      if (s < iters) issue(s);
  }
  __syncwarp();
  cuda::pdl::wait();  // the activations were written by the previous kernel
  cuda::pdl::launch_dependents();

  // The tile's activations into shared memory (16-byte units of xq, then the per-piece terms); missing rows zero.
  {
    const int xq_units = MT * K / 16;
    for (int u = static_cast<int>(threadIdx.x); u < xq_units; u += kWarps * 32) {
      const int m = u / (K / 16);
      reinterpret_cast<uint4*>(xq)[u] =
          m < p.rows ? reinterpret_cast<const uint4*>(p.xq)[u] : make_uint4(0, 0, 0, 0);
    }
    for (int i = static_cast<int>(threadIdx.x); i < MT * P; i += kWarps * 32) {
      const bool ok = i / P < p.rows;
      xs[i] = ok ? p.xs[i] : make_float2(0.0f, 0.0f);
      dx[i] = ok ? p.dx[i] : 0.0f;
    }
  }
  __syncthreads();

  float acc[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
  for (int it = 0; it < iters; ++it) {
    const int slot = it % kSlots;
    const int seg = it % segs;
    const int row = row_begin + warp + (it / segs) * kWarps;
    const int64_t off = static_cast<int64_t>(seg) * p.seg_bytes;
    const int len = static_cast<int>(min(static_cast<int64_t>(p.seg_bytes), p.row_bytes - off));
    const int pieces = len / kBytes * kPieces;
    const int p0 = static_cast<int>(off / kBytes) * kPieces;  // the segment's first piece in the row
    const uint8_t* s = my_slots + slot * kSlotBytes;
    mbar_wait(my_bars + slot, static_cast<uint32_t>(it / kSlots) & 1u);
    for (int q = lane; q < pieces; q += 32) {
      Piece pc;
      Fmt<T>::template piece<LdShared>(s + (q / kPieces) * kBytes, q % kPieces, pc);
      const int pg = p0 + q;
#pragma unroll
      for (int m = 0; m < MT; ++m)
        acc[m] += piece_term<T>(pc, xq + static_cast<int64_t>(m) * K + pg * 32, dx[m * P + pg], xs + m * P + pg);
    }
    __syncwarp();  // every lane is done with the slot before lane 0 refills it
    if (lane == 0 && it + kSlots < iters) issue(it + kSlots);
    if (seg == segs - 1) {
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float v = acc[m];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && m < p.rows)
          p.out[static_cast<int64_t>(m) * p.N + row] = p.bias != nullptr ? v + __ldg(p.bias + row) : v;
        acc[m] = 0.0f;
      }
    }
  }
}

using KernelFn = void (*)(Params);

template <GgmlType T>
KernelFn pick_tile(int tile) {
  switch (tile) {
    case 1: return ggml_rows_kernel<T, 1>;
    case 2: return ggml_rows_kernel<T, 2>;
    case 4: return ggml_rows_kernel<T, 4>;
    default: return ggml_rows_kernel<T, 8>;
  }
}

KernelFn pick(uint32_t type, int tile) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ8_0: return pick_tile<GgmlType::kQ8_0>(tile);
    case GgmlType::kQ4_0: return pick_tile<GgmlType::kQ4_0>(tile);
    case GgmlType::kQ4_1: return pick_tile<GgmlType::kQ4_1>(tile);
    case GgmlType::kQ5_0: return pick_tile<GgmlType::kQ5_0>(tile);
    case GgmlType::kQ5_1: return pick_tile<GgmlType::kQ5_1>(tile);
    case GgmlType::kQ2_K: return pick_tile<GgmlType::kQ2_K>(tile);
    case GgmlType::kQ4_K: return pick_tile<GgmlType::kQ4_K>(tile);
    case GgmlType::kQ5_K: return pick_tile<GgmlType::kQ5_K>(tile);
    case GgmlType::kQ6_K: return pick_tile<GgmlType::kQ6_K>(tile);
    default: return nullptr;
  }
}

// Bytes of a full segment: the most bytes ≤ kSlotBytes that are whole blocks and a multiple of 16.
int segment_bytes(int block_bytes) {
  int unit = block_bytes;
  while (unit % 16 != 0) unit += block_bytes;  // lcm(block_bytes, 16)
  return kSlotBytes / unit * unit;
}

}  // namespace

int tile_for(const kernels::GgmlLinearArgs& a, int rows) {
  if (rows < 1 || rows > kMaxTile || a.N < 1 || a.K < 32) return 0;
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(a.ggml_type);
  if (f == nullptr || pick(a.ggml_type, 1) == nullptr) return 0;
  if (reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || a.row_bytes % 16 != 0 || a.N > INT32_MAX || a.K > INT32_MAX)
    return 0;
  if (segment_bytes(static_cast<int>(f->block_bytes)) == 0) return 0;  // a block group larger than a slot
  const int64_t limit = device_info().max_shared_per_block_optin;
  auto fits = [&](int t) { return smem_bytes(t, a.K) + static_cast<int64_t>(sizeof(uint64_t)) * kWarps * kSlots <= limit; };
  int tile = rows == 1 ? 1 : rows == 2 ? 2 : rows <= 4 ? 4 : 8;
  while (tile > 1 && !fits(tile)) tile /= 2;
  return fits(tile) ? tile : 0;
}

void launch(const kernels::GgmlLinearArgs& a, int64_t m0, int rows, int tile, const int8_t* xq, const float* dx,
            const float2* xs, cudaStream_t stream, const char* op) {
  // The caller took `tile` from tile_for for these rows (format, alignment and shared memory checked there).
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(a.ggml_type);
  check(f != nullptr && (tile == 1 || tile == 2 || tile == 4 || tile == 8) && rows >= 1 && rows <= tile,
        ErrorCode::kInvalidArgument, op, "the native row kernel takes 1 to tile rows, tile 1, 2, 4 or 8; got ", rows,
        " rows, tile ", tile);
  const int64_t P = a.K / 32;
  Params p{};
  p.w = static_cast<const uint8_t*>(a.w);
  p.row_bytes = a.row_bytes;
  p.N = static_cast<int>(a.N);
  p.K = static_cast<int>(a.K);
  p.rows = rows;
  p.seg_bytes = segment_bytes(static_cast<int>(f->block_bytes));
  p.xq = xq + m0 * a.K;
  p.dx = dx + m0 * P;
  p.xs = xs + m0 * P;
  p.bias = a.bias;
  p.out = a.out + m0 * a.N;
  const KernelFn kernel = pick(a.ggml_type, tile);
  const size_t smem = static_cast<size_t>(smem_bytes(tile, a.K));
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem, op);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(device_info().sm_count, a.N));
  CIDER_CUDA_CHECK(op, cuda::pdl::launch(kernel, dim3(grid), dim3(kWarps * 32), smem, stream, p));
  check_last_launch(op);
}

}  // namespace cider::cuda::ggml_rows
