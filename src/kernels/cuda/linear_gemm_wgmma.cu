// cider/kernels/cuda/linear_gemm_wgmma.cu — the W8A8 and W4A8 prefill GEMMs on Hopper's warpgroup tensor-core
// instructions (sm_90a wgmma.mma_async m64nNk32 s8·s8→s32), fed by the bulk tensor copy engine (TMA) through an
// mbarrier ring.
// Called by linear_gemm.cu (launch_int_gemm), which keeps the mma.sync kernel as the fallback and comparison point.
// Design, floors and predictions: docs/cuda/gemm.md ("version 2: wgmma").
//
//   CTA tile 128 × BN (BN 256 per channel where the grid fills the GPU, else 128; 128 per group), k-tile 128 bytes;
//   a persistent grid (≤ one CTA per SM) walks the tiles, the ring of stages running on across tile boundaries.
//   384 threads: warpgroup 0 = producer (one thread issues the TMA copies; the warpgroup gives registers back with
//   setmaxnreg), warpgroups 1 and 2 = consumers, each owns 64 rows × BN columns of the tile (BN/2 int32
//   accumulators per thread) and issues 4 wgmma (k32 each) per k-tile.
//   Shared memory per stage: A [128 rows, 128 bytes] and B [BN rows, 128 bytes], written by TMA with the 128-byte
//   swizzle (16-byte chunk c of row r lands at chunk c ^ (r % 8); stage bases 1024-byte aligned), which is the
//   canonical K-major SW128 layout the wgmma matrix descriptors describe: 8-row core groups 1024 bytes apart
//   (stride byte offset), the k32 step = +32 bytes on the start address.
//   Pipeline: full[s] (TMA transaction bytes) and empty[s] (one arrival per consumer warp, 8) mbarriers per stage.
//   W4A8: TMA brings the packed weight tile [BN, 64 bytes] (no swizzle) into a third part of the stage and completes
//   loaded[s]; warps 1-3 of the producer warpgroup unpack it into the stage's swizzled int8 B tile (w4_unpack.cuh),
//   fence it for the async proxy and arrive on full[s] (which also counts A's bytes): 5 stages of 40 KB.
//   Tails: TMA fills rows past M/N and k past K with zeros (they add nothing to the exact integer sums); k32 steps
//   wholly past K are skipped; the epilogue masks rows/columns.
//   Epilogue: the reference's order, every step rounded (as linear_gemm.cu):
//     per channel: y = fl(sx · fl(0 + fl(sw[n] · float(acc))))                              (+ bias)
//     per group:   each group's wgmma chain starts with scale-d = 0 (acc = A·B), and after the group's last k32
//                  step the warpgroup waits for its wgmmas and flushes s = fl(s + fl(sw[g, n] · float(acc_g))).
//                  A thread's group scales come one group ahead, in 8-byte loads of its column pairs.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm_epilogue.cuh"
#include "kernels/cuda/w4_unpack.cuh"

namespace cider::cuda::gemm_wgmma {

namespace {

constexpr int kBM = 128;             // 2 consumer warpgroups × 64 rows
constexpr int kBK = 128;             // k per stage = bytes of one swizzled row
constexpr int kStepK = 32;           // k per wgmma
constexpr int kStepsPerTile = kBK / kStepK;
constexpr int kThreads = 384;        // 3 warpgroups
constexpr int kConsumerWarps = 8;    // arrivals per empty barrier
constexpr int kProducerRegs = 40;    // setmaxnreg: 128·40 + 256·232 ≤ 65536
constexpr int kConsumerRegs = 232;
constexpr int kUnpackWarps = 3;      // W4A8: warps 1-3 of the producer warpgroup

template <int BN, bool kInt4>
struct TileConfig {
  static constexpr int kStages = kInt4 ? 5 : BN == 256 ? 4 : 6;
  static constexpr int kAStage = kBM * kBK;                 // 16 KB
  static constexpr int kBStage = BN * kBK;                  // 32 or 16 KB
  static constexpr int kPStage = kInt4 ? BN * kBK / 2 : 0;  // W4A8: the packed tile TMA brings, [BN, 64 bytes]
  static constexpr int kStageBytes = kAStage + kBStage + kPStage;
  // Epilogue constants of a tile, staged by the consumers with cp.async while the tile's mainloop runs (so the
  // epilogue reads shared memory instead of waiting on global loads): sw [BN] (per channel), bias [BN], sx [kBM]
  // floats; two buffers, by tile parity.
  static constexpr int kEpiFloats = 2 * BN + kBM;
  static constexpr int kEpiBytes = 2 * kEpiFloats * 4;
  // Stages, then 3·kStages mbarriers (full, empty, loaded; in kBarBytes), then the epilogue buffers; + 1024 bytes
  // so the base can be rounded up to the swizzle atom.
  static constexpr int kBarBytes = 256;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes + kBarBytes + kEpiBytes + 1024;
  static_assert(3 * kStages * 8 <= kBarBytes, "barriers fit their bytes");
  static_assert(kStageBytes % 1024 == 0, "stage bases stay 1024-byte aligned");
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier and TMA ------------------------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (done == 0);
}

// 2-D tile copy global → shared (box of the tensor map at coordinates {k, row}); completes on `bar` with the box's
// bytes (out-of-bounds elements are written as zeros and counted too).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int k, int row, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(bar)
      : "memory");
}

// 4-byte asynchronous copy global → shared; src_bytes 0 writes a zero instead (a tail past M or N: src stays a valid
// address and is not read).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Barrier 1 over the two consumer warpgroups only (the producer warpgroup never reaches it).
__device__ __forceinline__ void consumer_bar_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }


// ---- wgmma -----------------------------------------------------------------------------------------------------------

// Matrix descriptor of a K-major operand in the 128-byte-swizzled layout: start address >> 4 (bits 0-13), leading
// byte offset (unused for swizzled K-major; 1), stride byte offset 1024 >> 4 (8-row core groups, bits 32-45),
// base offset 0 (atoms 1024-byte aligned), swizzle mode 1 = 128 B (bits 62-63).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_byte_addr) {
  return static_cast<uint64_t>((smem_byte_addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the asynchronous wgmma boundary.
template <int R>
__device__ __forceinline__ void fence_registers(int32_t (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// D[64, 256] (+)= A[64, 32] · B[256, 32]ᵀ, A and B K-major in shared memory (descriptors); scale_d 0 → D = A·B.
__device__ __forceinline__ void wgmma_m64n256k32(int32_t (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63]),
        "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]),
        "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]),
        "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]),
        "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]),
        "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]),
        "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]),
        "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]),
        "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64, 128] (+)= A[64, 32] · B[128, 32]ᵀ, A and B K-major in shared memory (descriptors); scale_d 0 → D = A·B.
__device__ __forceinline__ void wgmma_m64n128k32(int32_t (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
        "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
        "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
        "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]),
        "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]),
        "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]),
        "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

using gemm_epilogue::small_int_to_float;
using gemm_epilogue::store_one;
using gemm_epilogue::store_two;

struct Params {
  const float* sx;    // [M]
  const float* sw;    // [N] or [K/gs, N]
  const float* bias;  // [N] or null
  void* out;          // [M, N]
  int64_t M, N, K;
  int group_steps;    // per group: group_size / 32 (a power of two); 0 = per channel
  int paired_store;   // N even and out aligned to two elements
  int paired_scales;  // per group: N even and sw aligned to 8 bytes (a thread's two adjacent scales in one load)
};

// kGroupSteps: 0 per channel, else group_size / 32 (2, 4 or 8: groups of 64, 128, 256). kInt4: map_b describes
// the packed W4 weights [N, K/2] (box [BN rows, 64 bytes], no swizzle), unpacked in shared memory.
template <int BN, int kGroupSteps, bool kInt4, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_int8_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const Params p) {
  using Cfg = TileConfig<BN, kInt4>;
  constexpr bool kGrouped = kGroupSteps > 0;
  static_assert(kGroupSteps == 0 || kGroupSteps == 2 || kGroupSteps == 4 || kGroupSteps == 8, "group steps");
  constexpr int kStages = Cfg::kStages;
  constexpr int kAcc = BN / 2;   // int32 accumulators per consumer thread: 64 × BN over 128 threads
  constexpr int kCols = BN / 4;  // output columns per consumer thread: 8j + 2·(lane % 4) + {0, 1}, j < BN/8
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // stage s: A at base + s·kStageBytes, then B
  const uint32_t bars = base + static_cast<uint32_t>(kStages * Cfg::kStageBytes);
  // Epilogue buffer b (tile parity): sw [BN], bias [BN], sx [kBM] floats.
  float* const epi_base = reinterpret_cast<float*>(smem_raw + (bars + Cfg::kBarBytes - smem_addr(smem_raw)));
  auto full_bar = [&](int s) { return bars + 8u * static_cast<uint32_t>(s); };
  auto empty_bar = [&](int s) { return bars + 8u * static_cast<uint32_t>(kStages + s); };
  auto loaded_bar = [&](int s) { return bars + 8u * static_cast<uint32_t>(2 * kStages + s); };  // W4A8

  const int64_t M = p.M, N = p.N, K = p.K;
  // Persistent grid: CTA b takes tiles b, b + gridDim.x, ... In tile order 16 M-tiles run down each column of
  // N-tiles (grouped raster, as the mma.sync kernel), so the CTAs working at one time share W tiles in L2.
  constexpr int kGroupM = 16;
  const int64_t m_tiles = (M + kBM - 1) / kBM, n_tiles = (N + BN - 1) / BN;
  const int64_t units = m_tiles * n_tiles;
  const int64_t first_unit = static_cast<int64_t>(blockIdx.x);
  const int64_t unit_stride = static_cast<int64_t>(gridDim.x);
  auto tile_origin = [&](int64_t unit, int64_t& m0, int64_t& n0) {
    const int64_t per_group = kGroupM * n_tiles;
    const int64_t first_m = unit / per_group * kGroupM;
    const int64_t group_m = min(static_cast<int64_t>(kGroupM), m_tiles - first_m);
    const int64_t in_group = unit % per_group;
    m0 = (first_m + in_group % group_m) * kBM;
    n0 = in_group / group_m * BN;
  };

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
  const int k_steps_total = static_cast<int>(K / kStepK);
  // k-tiles this CTA runs over all its tiles (the ring positions 0 … my_k_tiles − 1).
  const int64_t my_k_tiles =
      (first_unit < units ? (units - first_unit + unit_stride - 1) / unit_stride : 0) * static_cast<int64_t>(k_tiles);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      // W4A8: full[s] also waits for the unpacking warps' arrivals (A's bytes still complete on it).
      mbar_init(full_bar(s), kInt4 ? 1 + kUnpackWarps : 1);
      mbar_init(empty_bar(s), kConsumerWarps);
      if (kInt4) mbar_init(loaded_bar(s), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  auto release_stage = [&](int s) { mbar_arrive(empty_bar(s)); };

  // The ring position runs on across tiles: k-tile number `it` (counted over all of this CTA's tiles) uses stage
  // it % kStages, and its full/empty barriers complete for the (it / kStages)-th time.
  if (wg == 0) {
    // Producer warpgroup: one thread streams k-tiles into the ring (running ahead into the next tile while the
    // consumers are in their epilogue).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (warp == 0 && lane == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
      int64_t it = 0;
      for (int64_t tile = first_unit; tile < units; tile += unit_stride) {
        int64_t m0, n0;
        tile_origin(tile, m0, n0);
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = static_cast<int>(it % kStages);
          const uint32_t a_dst = base + static_cast<uint32_t>(s * Cfg::kStageBytes);
          // Reuse of stage s waits for the consumers' release of k-tile it − kStages (completion it/kStages − 1).
          if (it >= kStages) mbar_wait(empty_bar(s), static_cast<uint32_t>((it / kStages + 1) & 1));
          if constexpr (kInt4) {
            mbar_arrive_expect_tx(full_bar(s), static_cast<uint32_t>(Cfg::kAStage));
            tma_load_2d(a_dst, &map_a, kt * kBK, static_cast<int>(m0), full_bar(s));
            mbar_arrive_expect_tx(loaded_bar(s), static_cast<uint32_t>(Cfg::kPStage));
            tma_load_2d(a_dst + Cfg::kAStage + Cfg::kBStage, &map_b, kt * (kBK / 2), static_cast<int>(n0),
                        loaded_bar(s));
          } else {
            mbar_arrive_expect_tx(full_bar(s), static_cast<uint32_t>(Cfg::kStageBytes));
            tma_load_2d(a_dst, &map_a, kt * kBK, static_cast<int>(m0), full_bar(s));
            tma_load_2d(a_dst + Cfg::kAStage, &map_b, kt * kBK, static_cast<int>(n0), full_bar(s));
          }
        }
      }
    } else if (kInt4 && warp >= 1 && warp <= kUnpackWarps) {
      // Unpacking warps: packed [BN, 64 bytes] of stage s → the stage's int8 B tile [BN, 128 bytes] in the 128-byte
      // swizzle TMA would have written (16-byte chunk c of row r at chunk c ^ (r % 8)). Item i: row i / 8, packed
      // bytes 8·(i % 8) … + 7 → k 16·(i % 8) … + 15 = chunk i % 8. The stage's B part is free: TMA refilled the
      // packed part only after the consumers released the stage.
      const int ut = tid - 32;  // 0 … 32·kUnpackWarps − 1
      uint8_t* const smem_base = smem_raw + (base - smem_addr(smem_raw));
      for (int64_t it = 0; it < my_k_tiles; ++it) {
        const int s = static_cast<int>(it % kStages);
        mbar_wait(loaded_bar(s), static_cast<uint32_t>((it / kStages) & 1));
        uint8_t* const b_tile = smem_base + s * Cfg::kStageBytes + Cfg::kAStage;
        const uint8_t* const packed = b_tile + Cfg::kBStage;
        for (int i = ut; i < BN * 8; i += 32 * kUnpackWarps) {
          const int row = i >> 3, chunk = i & 7;
          const uint2 w = *reinterpret_cast<const uint2*>(packed + row * (kBK / 2) + chunk * 8);
          uint4 q;
          unpack_w4_word(w.x, q.x, q.y);
          unpack_w4_word(w.y, q.z, q.w);
          *reinterpret_cast<uint4*>(b_tile + row * kBK + ((chunk ^ (row & 7)) << 4)) = q;
        }
        // The generic-proxy writes become visible to wgmma (async proxy) before the consumers are told.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(full_bar(s));
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
    const int cw = wg - 1;         // consumer warpgroup: tile rows 64·cw .. 64·cw + 63
    const int wq = warp & 3;       // warp within the warpgroup: 16 rows each
    const uint32_t a_rows = static_cast<uint32_t>(cw * 64 * kBK);  // this warpgroup's 64 rows (8 KB, aligned)
    const int ct = tid - 128;                                       // consumer thread 0 … 255
    int64_t it = 0;
    int parity = 0;
    for (int64_t tile = first_unit; tile < units; tile += unit_stride, parity ^= 1) {
      int64_t m0, n0;
      tile_origin(tile, m0, n0);
      // This tile's epilogue constants go to buffer `parity` (waited for, by every consumer, just before the
      // epilogue). The buffer was last read in the epilogue two tiles back, which every consumer left before the
      // barrier that precedes the previous tile's epilogue, so no reader remains. The copies land while the mainloop
      // runs.
      float* const epi = epi_base + parity * Cfg::kEpiFloats;
      auto stage_constants = [&]() {
        for (int i = ct; i < Cfg::kEpiFloats; i += 256) {
          const float* src = p.sx;
          bool ok = false;
          if (i < BN) {
            ok = !kGrouped && n0 + i < N;
            src = p.sw + (ok ? n0 + i : 0);
          } else if (i < 2 * BN) {
            ok = p.bias != nullptr && n0 + (i - BN) < N;
            src = ok ? p.bias + n0 + (i - BN) : p.sx;
          } else {
            ok = m0 + (i - 2 * BN) < M;
            src = p.sx + (ok ? m0 + (i - 2 * BN) : 0);
          }
          cp_async_4(smem_addr(epi + i), src, ok ? 4u : 0u);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
      };
      int32_t acc[kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0;
      float facc[kGrouped ? kAcc : 1];
#pragma unroll
      for (int i = 0; i < (kGrouped ? kAcc : 1); ++i) facc[i] = 0.0f;

      const int64_t col0 = n0 + 2 * (lane & 3);
      // Per group: the scales of the group being accumulated (this thread's kCols columns), loaded one group ahead.
      float sw_cur[kGrouped ? kCols : 1];
      // A tile inside N with paired_scales takes each column pair (8j + 2·(lane % 4) + {0, 1}, even) in one
      // 8-byte load.
      const bool pair_loads = p.paired_scales && n0 + BN <= N;
      auto load_group_scales = [&](int64_t g) {
        const float* const row = p.sw + g * N;
        if (pair_loads) {
#pragma unroll
          for (int j = 0; j < (kGrouped ? BN / 8 : 0); ++j) {
            const float2 v = __ldg(reinterpret_cast<const float2*>(row + col0 + 8 * j));
            sw_cur[2 * j] = v.x;
            sw_cur[2 * j + 1] = v.y;
          }
        } else {
#pragma unroll
          for (int j = 0; j < (kGrouped ? BN / 8 : 0); ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int64_t n = col0 + 8 * j + e;
              sw_cur[2 * j + e] = n < N ? __ldg(row + n) : 0.0f;
            }
        }
      };
      if constexpr (kGrouped) load_group_scales(0);

      // Per group: s = fl(s + fl(sw[g, n] · float(acc_g))) for the group g that just ended (groups in order), then
      // the next group's scales.
      auto flush_group = [&](int64_t g) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float part = __fmul_rn(sw_cur[2 * j + (c & 1)], small_int_to_float(acc[4 * j + c]));
            facc[4 * j + c] = __fadd_rn(facc[4 * j + c], part);
          }
        if ((g + 1) * kGroupSteps < k_steps_total) load_group_scales(g + 1);
      };

      stage_constants();
      // k32 step ks of the stage: +32 bytes on both start addresses (+2 in the descriptors' 16-byte units).
      auto issue_step = [&](uint64_t desc_a, uint64_t desc_b, int ks, int scale_d) {
        const uint64_t da = desc_a + static_cast<uint64_t>(2 * ks), db = desc_b + static_cast<uint64_t>(2 * ks);
        if constexpr (BN == 256) wgmma_m64n256k32(acc, da, db, scale_d);
        else wgmma_m64n128k32(acc, da, db, scale_d);
      };
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = static_cast<int>(it % kStages);
        mbar_wait(full_bar(s), static_cast<uint32_t>((it / kStages) & 1));
        const uint32_t stage = base + static_cast<uint32_t>(s * Cfg::kStageBytes);
        const uint64_t desc_a = sw128_desc(stage + a_rows), desc_b = sw128_desc(stage + Cfg::kAStage);
        // All k32 steps of a block run without a branch between the chained wgmmas (a branch makes ptxas serialize
        // them): k past K reads TMA's zeros. Group boundaries are static, so only scale-d varies at run time.
        if constexpr (kGroupSteps == 2) {
          // Two groups per k-tile: steps 0-1 and 2-3, each a block. The first lies inside K (the k-tile started
          // inside K and K % 64 == 0); the second may lie past it (then its zeros are not flushed).
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            wgmma_fence();
            issue_step(desc_a, desc_b, 2 * half, 0);
            issue_step(desc_a, desc_b, 2 * half + 1, 1);
            wgmma_commit();
            wgmma_wait<0>();
            fence_registers(acc);
            if (half == 1) {
              __syncwarp();
              if (lane == 0) release_stage(s);
            }
            const int last_step = kt * kStepsPerTile + 2 * half + 1;
            if (last_step < k_steps_total) flush_group(last_step / kGroupSteps);
            fence_registers(acc);
          }
        } else if constexpr (kGrouped) {
          // Groups of 128 (one per k-tile) or 256 (the odd k-tile of a pair continues the even one's sums).
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < kStepsPerTile; ++ks)
            issue_step(desc_a, desc_b, ks, ks == 0 && (kGroupSteps == 4 || (kt & 1) == 0) ? 0 : 1);
          wgmma_commit();
          wgmma_wait<0>();
          fence_registers(acc);
          // Release stage s (its wgmmas are done), then flush a group that ends with step 3 of this k-tile and
          // lies inside K.
          __syncwarp();
          if (lane == 0) release_stage(s);
          const int last_step = kt * kStepsPerTile + 3;
          if ((kGroupSteps != 8 || (kt & 1) != 0) && last_step < k_steps_total) flush_group(last_step / kGroupSteps);
          fence_registers(acc);
        } else {
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < kStepsPerTile; ++ks) issue_step(desc_a, desc_b, ks, 1);
          wgmma_commit();
          // Keep this k-tile's wgmmas in flight; the previous k-tile's have finished reading their stage.
          wgmma_wait<1>();
          __syncwarp();
          if (kt > 0 && lane == 0) release_stage(static_cast<int>((it - 1) % kStages));
        }
      }
      wgmma_wait<0>();
      fence_registers(acc);
      if constexpr (!kGrouped) {
        // The tile's last k-tile has been read: release its stage (the producer may be filling the next tile).
        __syncwarp();
        if (lane == 0) release_stage(static_cast<int>((it - 1) % kStages));
      }

      // Epilogue: thread holds rows r = 16·wq + lane/4 (+8) of the warpgroup's 64 and columns
      // 8j + 2·(lane%4) + {0,1}: acc[4j + 2h + e] is row r + 8h, column 8j + 2·(lane%4) + e.
      // The tile's constants: this thread's cp.async copies landed, then every consumer's (barrier 1).
      cp_async_wait_all();
      consumer_bar_sync();
      const float* const epi_sw = epi;
      const float* const epi_bias = epi + BN;
      OutT* out = static_cast<OutT*>(p.out);
      const int r_tile = cw * 64 + wq * 16 + (lane >> 2);  // row within the tile (h = 0)
      const int c_tile = 2 * (lane & 3);                    // column within each group of 8 (e = 0)
      const int64_t row0 = m0 + r_tile;
      const bool has_bias = p.bias != nullptr;
      const float sx_row[2] = {epi[2 * BN + r_tile], epi[2 * BN + r_tile + 8]};
      // The value of accumulator i (column 8j + c_tile + e, row r + 8h) in the reference's order.
      auto value = [&](int j, int h, int e) {
        const int i = 4 * j + 2 * h + e;
        float sum;
        if constexpr (kGrouped) sum = facc[i];
        else sum = __fadd_rn(0.0f, __fmul_rn(epi_sw[8 * j + c_tile + e], __int2float_rn(acc[i])));
        float v = __fmul_rn(sx_row[h], sum);
        if (has_bias) v = __fadd_rn(v, epi_bias[8 * j + c_tile + e]);
        return v;
      };
      if (m0 + kBM <= M && n0 + BN <= N && p.paired_store) {
        // Interior tile (every tile when M % 128 == 0 and N % BN == 0): no bounds checks.
        OutT* const o = out + row0 * N + n0 + c_tile;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) store_two<OutT>(o, 8 * h * N + 8 * j, value(j, h, 0), value(j, h, 1));
      } else {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int64_t n = n0 + 8 * j + c_tile;
          if (n >= N) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t m = row0 + 8 * h;
            if (m >= M) continue;
            const float y0 = value(j, h, 0), y1 = value(j, h, 1);
            if (p.paired_store && n + 1 < N) {
              store_two<OutT>(out, m * N + n, y0, y1);
            } else {
              store_one<OutT>(out, m * N + n, y0);
              if (n + 1 < N) store_one<OutT>(out, m * N + n + 1, y1);
            }
          }
        }
      }
    }
  }
}

// ---- host: tensor maps and launch -----------------------------------------------------------------------------------

std::atomic<int> g_last_grid{0};  // CTAs of the last launch (bench notes)

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled through the runtime (no -lcuda); null when the driver lacks it.
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = []() -> EncodeTiledFn {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess || f == nullptr) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// [rows, row_bytes] bytes, row-contiguous, box [box_rows, box_bytes]; out-of-bounds reads are zeros. int8 operands:
// box_bytes 128 with the 128-byte swizzle; packed W4: 64 bytes, no swizzle (unpacked in shared memory).
void encode_operand_map(CUtensorMap* map, const void* base, int64_t rows, int64_t row_bytes, int box_rows,
                        int box_bytes, bool swizzle, const char* op) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_bytes), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                                    box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r == CUDA_SUCCESS, ErrorCode::kInternal, op, "cuTensorMapEncodeTiled failed with CUresult ",
        static_cast<int>(r), " (rows ", rows, ", row bytes ", row_bytes, ")");
}

template <int BN, int kGroupSteps, bool kInt4, typename OutT>
void launch_config(const CUtensorMap& map_a, const void* w, const Params& p, cudaStream_t stream, const char* op) {
  using Cfg = TileConfig<BN, kInt4>;
  CUtensorMap map_b;
  if (kInt4) encode_operand_map(&map_b, w, p.N, p.K / 2, BN, kBK / 2, false, op);
  else encode_operand_map(&map_b, w, p.N, p.K, BN, kBK, true, op);
  auto kernel = wgmma_int8_gemm_kernel<BN, kGroupSteps, kInt4, OutT>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<size_t>(Cfg::kSmemBytes), op);
  const int sms = device_info().sm_count;
  const int64_t units = ((p.M + kBM - 1) / kBM) * ((p.N + BN - 1) / BN);
  // Persistent: one CTA per SM at most (each takes 192 KB of shared memory), looping over the tiles.
  const int64_t grid = std::min<int64_t>(units, sms);
  g_last_grid.store(static_cast<int>(grid), std::memory_order_relaxed);
  kernel<<<static_cast<unsigned>(grid), kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b, p);
  check_last_launch(op);
}

double wave_efficiency(int64_t tiles, int sms) {
  const int64_t waves = (tiles + sms - 1) / sms;
  return static_cast<double>(tiles) / static_cast<double>(waves * sms);
}

template <typename OutT>
void launch_out(const CUtensorMap& map_a, const void* w, bool int4, const Params& p, cudaStream_t stream,
                const char* op) {
  if (int4) {  // 128-column tiles only (a wide tile's int8 and packed parts would leave 3 stages)
    switch (p.group_steps) {
      case 2: launch_config<128, 2, true, OutT>(map_a, w, p, stream, op); return;
      case 4: launch_config<128, 4, true, OutT>(map_a, w, p, stream, op); return;
      case 8: launch_config<128, 8, true, OutT>(map_a, w, p, stream, op); return;
      default: launch_config<128, 0, true, OutT>(map_a, w, p, stream, op); return;
    }
  }
  switch (p.group_steps) {  // groups of 64, 128, 256 (the validated int8 group sizes)
    case 2: launch_config<128, 2, false, OutT>(map_a, w, p, stream, op); return;
    case 4: launch_config<128, 4, false, OutT>(map_a, w, p, stream, op); return;
    case 8: launch_config<128, 8, false, OutT>(map_a, w, p, stream, op); return;
    default: break;
  }
  // 128 × 256 tiles do the work of two 128 × 128 ones with half the A traffic per MAC; take them unless the grid
  // then fills the GPU clearly worse (M512 N4096: 64 wide tiles on 132 SMs vs 128 narrow ones).
  const int sms = device_info().sm_count;
  const int64_t m_tiles = (p.M + kBM - 1) / kBM;
  const int64_t wide = m_tiles * ((p.N + 255) / 256), narrow = m_tiles * ((p.N + 127) / 128);
  const bool use_wide = 1.15 * wave_efficiency(wide, sms) >= wave_efficiency(narrow, sms);
  if (use_wide) launch_config<256, 0, false, OutT>(map_a, w, p, stream, op);
  else launch_config<128, 0, false, OutT>(map_a, w, p, stream, op);
}

}  // namespace

int last_grid() { return g_last_grid.load(std::memory_order_relaxed); }

// Whether the wgmma kernel can run this GEMM: an sm_90 device, the driver's tensor-map encoder, per channel or
// groups of 64/128/256 (W4A8's groups of 32 stay on mma.sync), K a multiple of 16 (TMA row strides; W4A8: 32, the
// packed rows' 16 bytes), 16-byte aligned operands.
bool supported(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq) {
  if (device_info().cc_major != 9) return false;
  if (encode_tiled() == nullptr) return false;
  const bool groups_ok = a.group_size == 0 || a.group_size == 64 || a.group_size == 128 || a.group_size == 256;
  return groups_ok && a.N <= INT32_MAX && a.K % (int4 ? 32 : 16) == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(xq) % 16 == 0;
}

// out = epilogue(xq · wᵀ) with the wgmma kernel; arguments validated by the caller and supported() true.
void launch(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq, const float* sx, cudaStream_t stream,
            const char* op) {
  Params p{};
  p.sx = sx;
  p.sw = a.w_scales;
  p.bias = a.bias;
  p.out = a.out;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.group_steps = a.group_size / kStepK;
  const size_t out_elem = static_cast<size_t>(dtype_size(a.out_dtype));
  p.paired_store = (a.N % 2 == 0 && reinterpret_cast<uintptr_t>(a.out) % (2 * out_elem) == 0) ? 1 : 0;
  p.paired_scales = (a.N % 2 == 0 && reinterpret_cast<uintptr_t>(a.w_scales) % 8 == 0) ? 1 : 0;

  CUtensorMap map_a;
  encode_operand_map(&map_a, xq, a.M, a.K, kBM, kBK, true, op);
  switch (a.out_dtype) {
    case DType::kF32: launch_out<float>(map_a, a.w, int4, p, stream, op); break;
    case DType::kF16: launch_out<__half>(map_a, a.w, int4, p, stream, op); break;
    default: launch_out<__nv_bfloat16>(map_a, a.w, int4, p, stream, op); break;
  }
}

}  // namespace cider::cuda::gemm_wgmma
