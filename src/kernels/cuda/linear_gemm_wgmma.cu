// cider/kernels/cuda/linear_gemm_wgmma.cu — the W8A8 prefill GEMM on Hopper's warpgroup tensor-core instructions
// (sm_90a wgmma.mma_async m64nNk32 s8·s8→s32), fed by the bulk tensor copy engine (TMA) through an mbarrier ring.
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
//   Tails: TMA fills rows past M/N and k past K with zeros (they add nothing to the exact integer sums); k32 steps
//   wholly past K are skipped; the epilogue masks rows/columns.
//   Opt-in ($CIDER_GEMM_FUSED_QUANT=1, measured slower: docs/cuda/gemm.md version 4): the CTAs' warps quantize x
//   themselves before the mainloop (see "fused per-token activation quantization" below).
//   Epilogue: the reference's order, every step rounded (as linear_gemm.cu):
//     per channel: y = fl(sx · fl(0 + fl(sw[n] · float(acc))))                              (+ bias)
//     per group:   each group's wgmma chain starts with scale-d = 0 (acc = A·B), and after the group's last k32
//                  step the warpgroup waits for its wgmmas and flushes s = fl(s + fl(sw[g, n] · float(acc_g))).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemm_epilogue.cuh"
#include "kernels/cuda/int8_row_quant.cuh"

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

template <int BN>
struct TileConfig {
  static constexpr int kStages = BN == 256 ? 4 : 6;
  static constexpr int kAStage = kBM * kBK;  // 16 KB
  static constexpr int kBStage = BN * kBK;   // 32 or 16 KB
  static constexpr int kStageBytes = kAStage + kBStage;
  // Epilogue constants of a tile, staged by the consumers with cp.async while the tile's mainloop runs (so the
  // epilogue reads shared memory instead of waiting on global loads): sw [BN] (per channel), bias [BN], sx [kBM]
  // floats; two buffers, by tile parity.
  static constexpr int kEpiFloats = 2 * BN + kBM;
  static constexpr int kEpiBytes = 2 * kEpiFloats * 4;
  // Stages, then 2·kStages mbarriers (in 128 bytes), then the epilogue buffers; + 1024 bytes so the base can be
  // rounded up to the swizzle atom.
  static constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * kStageBytes + 128 + kEpiBytes + 1024;
  static_assert(2 * kStages * 8 <= 128, "barriers fit their 128 bytes");
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

// Multicast variant (cluster of 2): the box lands at the same shared-memory offset in every CTA of cta_mask, and
// each destination's mbarrier at `bar`'s offset receives the box's bytes.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int k, int row,
                                                      uint32_t bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(bar), "h"(cta_mask)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_id_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_count_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster arrives, then waits (release/acquire: orders the mbarrier inits).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrive on the mbarrier at local offset `bar` of CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
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
  // Fused activation quantization (kCluster 1 only; x null = xq and sx were written beforehand by quantize_rows): the
  // CTAs quantize x [M, K] (bf16, f16 or f32 by x_kind; K % 8 == 0, K ≤ 4096, 16-byte aligned) into xq (the memory
  // map_a reads) and sx before their tiles need them. qc = a zeroed counter slab (counter_slabs.h): qc[0] the next row
  // to claim, qc[1] CTAs done, qc[2 + t] rows of M-tile t written; the last CTA leaves them zero again.
  const void* x;
  int8_t* xq;
  float* sx_out;
  unsigned int* qc;
  int x_kind;  // x dtype: 0 bf16, 1 f16, 2 f32
};

// ---- fused per-token activation quantization ----------------------------------------------------------------------
//
// Opt-in (CIDER_GEMM_FUSED_QUANT=1): measured slower than the separate kernel (jobs 35–44: the consumer warps quantize
// before their MMAs and 12 warps per SM cannot hide a row's latency). Before the mainloop the 11 warps of each CTA
// other than warp 0 (whose lane 0 is the TMA producer) take batches of 11 rows of x from a global counter (one atomic
// per CTA and batch), one row per warp, write each row's codes and scale (int8_row_quant.cuh: the reference's bits) and
// count the row in its M-tile's counter after a gpu-scope fence. The producer polls the counter of each tile's M-tile
// until all its rows are there (then a fence: acquire) before its first A copy of the tile. Claiming rows dynamically
// (not by CTA index) means every row is written by a warp that is already running, so no CTA ever waits on a CTA that
// is not resident. Meanwhile the producer has already started the first tile's B (weight) copies. Why fused: the
// separate quantization kernel cost 11.3 µs of the 192.7 µs M2048 K4096 N14336 case (docs/cuda/gemm.md, version 4); the
// attempt did not recover it.

constexpr int kQuantHeldChunks = 16;

__device__ __forceinline__ unsigned int ld_relaxed_gpu(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_relaxed_gpu_add(unsigned int* p, unsigned int v) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ unsigned int atom_acq_rel_gpu_add(unsigned int* p, unsigned int v) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
// Orders this thread's generic-proxy global accesses with async-proxy (TMA) accesses of the same memory.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

using int8_row_quant::Raw8;
using int8_row_quant::RawLoad;

// max over 8 values of their absolute values' bit patterns, folded into m (per 16-bit half for bf16 / f16). For
// non-negative floats the bit patterns order like the values, and NaN / inf patterns lie above every finite one, so
// one integer max gives both max |x| and "all finite" — exactly, branch-free.
template <typename T>
__device__ __forceinline__ uint32_t abs_bits_max(const Raw8<T>& v, uint32_t m) {
  if constexpr (sizeof(T) == 4) {
    const uint32_t b[8] = {v.w[0].x, v.w[0].y, v.w[0].z, v.w[0].w, v.w[1].x, v.w[1].y, v.w[1].z, v.w[1].w};
#pragma unroll
    for (int j = 0; j < 8; ++j) m = max(m, b[j] & 0x7fffffffu);
  } else {
    const uint32_t b[4] = {v.w[0].x, v.w[0].y, v.w[0].z, v.w[0].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) m = __vmaxu2(m, b[j] & 0x7fff7fffu);
  }
  return m;
}

// max |x| and "all finite" from the warp's combined abs_bits_max.
template <typename T>
__device__ __forceinline__ void amax_from_bits(uint32_t m, float& amax, bool& finite) {
  if constexpr (sizeof(T) == 4) {
    finite = m < 0x7f800000u;
    amax = __uint_as_float(m);
  } else {
    const uint32_t h = max(m & 0xffffu, m >> 16);
    if constexpr (std::is_same_v<T, __half>) {
      finite = h < 0x7c00u;
      amax = __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
    } else {
      finite = h < 0x7f80u;
      amax = __uint_as_float(h << 16);
    }
  }
}

// One warp quantizes row m of x (K ≤ 8 · 32 · kQuantHeldChunks) with the reference's arithmetic: max |x| and "all
// finite" over the row, sx, then the codes. Two passes over the row: the first holds all 16 chunk loads per lane in
// flight at once (64 registers for bf16/f16; f32 in two rounds of 8) and keeps only the max; the second reads the row
// again (L1/L2) 4 chunks at a time in a loop that is not unrolled. Why: each warp quantizes only 1–2 rows, so a fully
// unrolled row (≈ 1 900 instructions per dtype, job 38) ran cold from the instruction cache (Nsight, job 39: "no
// instruction" the first stall of the quantizer code), and a branch per value (job 37) made each row one dependent
// chain; the codes are branch-free (codes8_fast).
template <typename T>
__device__ void quantize_row_warp(const Params& p, int64_t m, int lane) {
  const int64_t K = p.K;
  const T* row = static_cast<const T*>(p.x) + m * K;
  int8_t* qrow = p.xq + m * K;
  uint32_t bits[2] = {0u, 0u};  // two independent max chains
  // f32 in two rounds of 8 chunks (64 registers each; all 16 at once spilled).
  constexpr int kRound = sizeof(T) == 4 ? kQuantHeldChunks / 2 : kQuantHeldChunks;
#pragma unroll 1
  for (int c0 = 0; c0 < kQuantHeldChunks && 8 * 32 * c0 < K; c0 += kRound) {
    Raw8<T> v[kRound];
#pragma unroll
    for (int c = 0; c < kRound; ++c) {
      const int64_t k = 8 * (lane + 32 * (c0 + c));
      if (k < K) v[c].template load<RawLoad::kNonCoherent>(row, k);
    }
#pragma unroll
    for (int c = 0; c < kRound; ++c)
      if (8 * (lane + 32 * (c0 + c)) < K) bits[c & 1] = abs_bits_max(v[c], bits[c & 1]);
  }
  uint32_t mbits = sizeof(T) == 4 ? max(bits[0], bits[1]) : __vmaxu2(bits[0], bits[1]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const uint32_t o = __shfl_xor_sync(0xffffffffu, mbits, off);
    mbits = sizeof(T) == 4 ? max(mbits, o) : __vmaxu2(mbits, o);
  }
  float amax;
  bool finite;
  amax_from_bits<T>(mbits, amax, finite);
  const float sx = int8_row_quant::row_sx(amax, finite);
  const int8_row_quant::RowScale scale = int8_row_quant::row_scale(sx);
  if (lane == 0) p.sx_out[m] = sx;
  uint32_t exact_chunks = 0;  // chunks whose codes need the division (rare: values next to a rounding boundary)
  constexpr int kStep = 4;    // chunks per step of the second pass
#pragma unroll 1
  for (int c0 = 0; c0 < kQuantHeldChunks && 8 * 32 * c0 < K; c0 += kStep) {
    Raw8<T> v[kStep];
#pragma unroll
    for (int c = 0; c < kStep; ++c) {
      const int64_t k = 8 * (lane + 32 * (c0 + c));
      if (k < K) v[c].template load<RawLoad::kLastUse>(row, k);
    }
#pragma unroll
    for (int c = 0; c < kStep; ++c) {
      const int64_t k = 8 * (lane + 32 * (c0 + c));
      if (k < K) {
        float f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = v[c].get(j);
        bool exact = false;
        uint2 q = int8_row_quant::codes8_fast(f, scale, exact);
        if (!finite) q = make_uint2(0u, 0u);  // a row holding NaN/inf: sx = NaN, codes 0 (as the reference)
        exact_chunks |= (exact && finite ? 1u : 0u) << (c0 + c);
        *reinterpret_cast<uint2*>(qrow + k) = q;
      }
    }
  }
  // Rewrite the flagged chunks with the division (program order: these stores land after the fast ones).
  while (exact_chunks != 0u) {
    const int c = __ffs(exact_chunks) - 1;
    exact_chunks &= exact_chunks - 1u;
    const int64_t k = 8 * (lane + 32 * c);
    Raw8<T> again;
    again.template load<RawLoad::kLastUse>(row, k);
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = again.get(j);
    *reinterpret_cast<uint2*>(qrow + k) = int8_row_quant::codes8_exact(f, scale.sx);
  }
}

constexpr int kQuantWarps = kThreads / 32 - 1;  // warps 1 … 11 quantize; warp 0 holds the TMA producer

// The quantizer warps of a CTA: one thread claims a batch of kQuantWarps consecutive rows from the global counter
// (one atomic per CTA and batch: no contention on the counter), warp w takes row first + w. Each written row is
// published to the producers: every lane's stores, the proxy fence (TMA reads them through the async proxy), a
// gpu-scope fence, then the M-tile's count (relaxed add after the fence: a release pattern). batch_first is a
// two-slot ring: slot i & 1 is rewritten two batches later, after every quantizer passed the barrier in between.
template <typename T>
__device__ void quantize_rows_fused(const Params& p, int qwarp, int lane, unsigned int (&batch_first)[2]) {
  for (int i = 0;; ++i) {
    if (qwarp == 0 && lane == 0) batch_first[i & 1] = atomicAdd(p.qc, static_cast<unsigned int>(kQuantWarps));
    asm volatile("bar.sync 2, %0;\n" ::"n"(kQuantWarps * 32) : "memory");
    const unsigned int first = batch_first[i & 1];
    if (static_cast<int64_t>(first) >= p.M) break;
    const unsigned int row = first + static_cast<unsigned int>(qwarp);
    if (static_cast<int64_t>(row) < p.M) {
      quantize_row_warp<T>(p, static_cast<int64_t>(row), lane);
      fence_proxy_async_global();
      fence_acq_rel_gpu();
      __syncwarp();
      if (lane == 0) red_relaxed_gpu_add(p.qc + 2 + row / kBM, 1u);
    }
  }
}

// Producer: waits until every row of the M-tile at m0 is written, then makes them visible to its TMA copies.
__device__ __forceinline__ void wait_rows_quantized(const Params& p, int64_t m0) {
  if (m0 >= p.M) return;
  const unsigned int need = static_cast<unsigned int>(min(static_cast<int64_t>(kBM), p.M - m0));
  const unsigned int* count = p.qc + 2 + m0 / kBM;
  // Relaxed polling (an acquire load would invalidate the SM's L1 at every poll), then one fence: acquire pattern.
  while (ld_relaxed_gpu(count) < need) __nanosleep(64);
  fence_acq_rel_gpu();
  fence_proxy_async_global();
}

// kGroupSteps: 0 per channel, else group_size / 32 (2, 4 or 8: groups of 64, 128, 256).
// kCluster 2 (opt-in, see launch()): CTA pairs of a cluster take vertically adjacent tiles of one
// N-tile; each CTA loads its own A tile and half of the shared B tile, multicast into both CTAs' shared memory, so
// the L2 → SM traffic per k-tile drops from 48 KB to 32 KB per CTA (BN 256). A stage is refilled only when the
// consumers of both CTAs have released it (empty barriers count 16 arrivals, half of them remote).
template <int BN, int kGroupSteps, int kCluster, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_int8_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const Params p) {
  using Cfg = TileConfig<BN>;
  constexpr bool kGrouped = kGroupSteps > 0;
  static_assert(kCluster == 1 || kCluster == 2, "clusters of 1 or 2 CTAs");
  static_assert(kGroupSteps == 0 || kGroupSteps == 2 || kGroupSteps == 4 || kGroupSteps == 8, "group steps");
  constexpr int kStages = Cfg::kStages;
  constexpr int kAcc = BN / 2;   // int32 accumulators per consumer thread: 64 × BN over 128 threads
  constexpr int kCols = BN / 4;  // output columns per consumer thread: 8j + 2·(lane % 4) + {0, 1}, j < BN/8
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // stage s: A at base + s·kStageBytes, then B
  const uint32_t bars = base + static_cast<uint32_t>(kStages * Cfg::kStageBytes);
  // Epilogue buffer b (tile parity): sw [BN], bias [BN], sx [kBM] floats.
  float* const epi_base = reinterpret_cast<float*>(smem_raw + (bars + 128u - smem_addr(smem_raw)));
  auto full_bar = [&](int s) { return bars + 8u * static_cast<uint32_t>(s); };
  auto empty_bar = [&](int s) { return bars + 8u * static_cast<uint32_t>(kStages + s); };

  const int64_t M = p.M, N = p.N, K = p.K;
  // Persistent grid: CTA b takes tiles b, b + gridDim.x, ... In tile order 16 M-tiles run down each column of
  // N-tiles (grouped raster, as the mma.sync kernel), so the CTAs working at one time share W tiles in L2.
  constexpr int kGroupM = 16;
  // A work unit is one tile (kCluster 1) or a pair of vertically adjacent tiles, one per CTA of the cluster.
  constexpr int kGroupUnits = kGroupM / kCluster;
  const uint32_t rank = kCluster == 2 ? cluster_ctarank() : 0u;
  const int64_t m_tiles = (M + kBM - 1) / kBM, n_tiles = (N + BN - 1) / BN;
  const int64_t m_units = (m_tiles + kCluster - 1) / kCluster, units = m_units * n_tiles;
  const int64_t first_unit = kCluster == 2 ? static_cast<int64_t>(cluster_id_x()) : static_cast<int64_t>(blockIdx.x);
  const int64_t unit_stride =
      kCluster == 2 ? static_cast<int64_t>(cluster_count_x()) : static_cast<int64_t>(gridDim.x);
  auto tile_origin = [&](int64_t unit, int64_t& m0, int64_t& n0) {
    const int64_t per_group = kGroupUnits * n_tiles;
    const int64_t first_m = unit / per_group * kGroupUnits;
    const int64_t group_m = min(static_cast<int64_t>(kGroupUnits), m_units - first_m);
    const int64_t in_group = unit % per_group;
    // The second CTA of a pair may start past M (odd m_tiles): TMA then reads zeros and the epilogue stores nothing.
    m0 = ((first_m + in_group % group_m) * kCluster + rank) * kBM;
    n0 = in_group / group_m * BN;
  };

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
  const int k_steps_total = static_cast<int>(K / kStepK);

  // Fused quantization: the warps of this CTA that have left the row queue (all but warp 0).
  __shared__ unsigned int quantizers_done;
  __shared__ unsigned int batch_first[2];
  const bool fused = kCluster == 1 && p.x != nullptr;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), kConsumerWarps * kCluster);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    quantizers_done = 0;
  }
  // The peer CTA's copies and arrivals target these barriers: both CTAs initialize theirs before either starts.
  if constexpr (kCluster == 2) cluster_sync();
  else __syncthreads();

  // Fused quantization: lane 0 of warp 0 starts the first tile's weight copies (they do not depend on x) into the
  // first stages; every other warp quantizes rows. Stages [0, prefetched) then only lack their A copy.
  int prefetched = 0;
  if (fused) {
    if (warp == 0) {
      if (lane == 0 && first_unit < units) {
        int64_t m0, n0;
        tile_origin(first_unit, m0, n0);
        prefetched = min(kStages, k_tiles);
        for (int kt = 0; kt < prefetched; ++kt) {
          const uint32_t stage = base + static_cast<uint32_t>(kt * Cfg::kStageBytes);
          mbar_arrive_expect_tx(full_bar(kt), static_cast<uint32_t>(Cfg::kStageBytes));
          tma_load_2d(stage + Cfg::kAStage, &map_b, kt * kBK, static_cast<int>(n0), full_bar(kt));
        }
      }
    } else {
      if (p.x_kind == 0) quantize_rows_fused<__nv_bfloat16>(p, warp - 1, lane, batch_first);
      else if (p.x_kind == 1) quantize_rows_fused<__half>(p, warp - 1, lane, batch_first);
      else quantize_rows_fused<float>(p, warp - 1, lane, batch_first);
      if (lane == 0) atomicAdd(&quantizers_done, 1u);
    }
  }
  // Releases stage s: this CTA's empty barrier, and with clusters the peer's too (its producer multicasts into it).
  auto release_stage = [&](int s) {
    if constexpr (kCluster == 2) {
      mbar_arrive_cluster(empty_bar(s), 0);
      mbar_arrive_cluster(empty_bar(s), 1);
    } else {
      mbar_arrive(empty_bar(s));
    }
  };

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
        if (fused) wait_rows_quantized(p, m0);
        for (int kt = 0; kt < k_tiles; ++kt, ++it) {
          const int s = static_cast<int>(it % kStages);
          const uint32_t a_dst = base + static_cast<uint32_t>(s * Cfg::kStageBytes);
          if (it < prefetched) {  // the first tile's first stages: B is on its way, the barrier expects A too
            tma_load_2d(a_dst, &map_a, kt * kBK, static_cast<int>(m0), full_bar(s));
            continue;
          }
          // Reuse of stage s waits for the consumers' release of k-tile it − kStages (completion it/kStages − 1).
          if (it >= kStages) mbar_wait(empty_bar(s), static_cast<uint32_t>((it / kStages + 1) & 1));
          mbar_arrive_expect_tx(full_bar(s), static_cast<uint32_t>(Cfg::kStageBytes));
          tma_load_2d(a_dst, &map_a, kt * kBK, static_cast<int>(m0), full_bar(s));
          if constexpr (kCluster == 2) {
            // B rows n0 + rank·BN/2 .. + BN/2 − 1 into both CTAs (the peer loads the other half).
            const uint32_t half = rank * static_cast<uint32_t>(BN / 2 * kBK);
            tma_load_2d_multicast(a_dst + Cfg::kAStage + half, &map_b, kt * kBK,
                                  static_cast<int>(n0) + static_cast<int>(rank) * (BN / 2), full_bar(s), 0x3);
          } else {
            tma_load_2d(a_dst + Cfg::kAStage, &map_b, kt * kBK, static_cast<int>(n0), full_bar(s));
          }
        }
      }
      if (fused) {
        // This CTA is done with the counters once its quantizer warps have left the queue (their last claim has
        // returned) and this thread has made its last wait. The last CTA to get here resets the slab to zero for
        // the next launch on this stream (every other CTA has made its last access before counting itself in).
        while (*static_cast<volatile unsigned int*>(&quantizers_done) < static_cast<unsigned int>(kQuantWarps))
          __nanosleep(32);
        if (atom_acq_rel_gpu_add(p.qc + 1, 1u) == gridDim.x - 1) {
          const int64_t m_tiles_all = (M + kBM - 1) / kBM;
          for (int64_t t = 0; t < m_tiles_all + 2; ++t) p.qc[t] = 0u;
        }
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
      // barrier that precedes the previous tile's epilogue, so no reader remains. With the fused quantization they are
      // copied once the tile's first k-tile has arrived: sx of the tile's rows is written by other warps, and the
      // producer's wait for those rows (acquire) precedes its arrival on that full barrier (release), which this
      // thread's wait acquires. The copies land while the mainloop runs.
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
      auto load_group_scales = [&](int64_t g) {
#pragma unroll
        for (int j = 0; j < (kGrouped ? BN / 8 : 0); ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t n = col0 + 8 * j + e;
            sw_cur[2 * j + e] = n < N ? __ldg(p.sw + g * N + n) : 0.0f;
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

      if (fused) {
        // The first k-tile's arrival (waited for again, at no cost, inside the loop), then the constants.
        mbar_wait(full_bar(static_cast<int>(it % kStages)), static_cast<uint32_t>((it / kStages) & 1));
      }
      stage_constants();
      for (int kt = 0; kt < k_tiles; ++kt, ++it) {
        const int s = static_cast<int>(it % kStages);
        mbar_wait(full_bar(s), static_cast<uint32_t>((it / kStages) & 1));
        const uint32_t stage = base + static_cast<uint32_t>(s * Cfg::kStageBytes);
        const uint64_t desc_a = sw128_desc(stage + a_rows), desc_b = sw128_desc(stage + Cfg::kAStage);
        wgmma_fence();
        // All 4 k32 steps run without a branch between the chained wgmmas (a branch makes ptxas serialize them):
        // k past K reads TMA's zeros. Group boundaries are static (kGroupSteps 2: after steps 1 and 3; 4: after
        // step 3; 8: after step 3 of odd k-tiles), so only scale-d varies at run time.
#pragma unroll
        for (int ks = 0; ks < kStepsPerTile; ++ks) {
          // k32 step ks: +32 bytes on both start addresses (+2 in the descriptors' 16-byte units).
          const uint64_t da = desc_a + static_cast<uint64_t>(2 * ks), db = desc_b + static_cast<uint64_t>(2 * ks);
          // Per group: the first step of a group starts a fresh partial (scale-d 0: acc = A·B).
          int scale_d = 1;
          if constexpr (kGrouped) {
            if (ks % kGroupSteps == 0) scale_d = (kGroupSteps == 8 && (kt & 1) != 0) ? 1 : 0;
          }
          if constexpr (BN == 256) wgmma_m64n256k32(acc, da, db, scale_d);
          else wgmma_m64n128k32(acc, da, db, scale_d);
          if constexpr (kGroupSteps == 2) {
            if (ks == 1) {
              // Group of steps 0-1 ends (the k-tile started inside K and K % 64 == 0, so it is a real group).
              wgmma_commit();
              wgmma_wait<0>();
              fence_registers(acc);
              flush_group((static_cast<int64_t>(kt) * kStepsPerTile + 1) / kGroupSteps);
              fence_registers(acc);
              wgmma_fence();
            }
          }
        }
        wgmma_commit();
        if constexpr (kGrouped) {
          wgmma_wait<0>();
          fence_registers(acc);
          // Release stage s (its wgmmas are done), then flush a group that ends with step 3 of this k-tile and
          // lies inside K (with group 64 the k-tile's second half may be past K).
          __syncwarp();
          if (lane == 0) release_stage(s);
          const int last_step = kt * kStepsPerTile + 3;
          if ((kGroupSteps != 8 || (kt & 1) != 0) && last_step < k_steps_total) flush_group(last_step / kGroupSteps);
          fence_registers(acc);
        } else {
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
  // No CTA of a pair may exit while its peer can still arrive on its barriers (every thread of both CTAs gets here).
  if constexpr (kCluster == 2) {
    __syncwarp();
    cluster_sync();
  }
}

// ---- host: tensor maps and launch -----------------------------------------------------------------------------------

std::atomic<int> g_last_grid{0};  // CTAs of the last launch (bench notes: a short cluster grid shows here)

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

// [rows, K] int8, K-contiguous, box [box_rows, 128 bytes] with the 128-byte swizzle; out-of-bounds reads are zeros.
void encode_operand_map(CUtensorMap* map, const void* base, int64_t rows, int64_t K, int box_rows, const char* op) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(K), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(K)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                                    box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  check(r == CUDA_SUCCESS, ErrorCode::kInternal, op, "cuTensorMapEncodeTiled failed with CUresult ",
        static_cast<int>(r), " (rows ", rows, ", K ", K, ")");
}

template <int BN, int kGroupSteps, int kCluster, typename OutT>
void launch_config(const CUtensorMap& map_a, const void* w, const Params& p, cudaStream_t stream, const char* op) {
  using Cfg = TileConfig<BN>;
  CUtensorMap map_b;
  encode_operand_map(&map_b, w, p.N, p.K, BN / kCluster, op);  // clusters: each CTA loads half of the B tile
  auto kernel = wgmma_int8_gemm_kernel<BN, kGroupSteps, kCluster, OutT>;
  CIDER_CUDA_CHECK(op, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(Cfg::kSmemBytes)));
  const int sms = device_info().sm_count;
  const int64_t units = ((p.M + kBM * kCluster - 1) / (kBM * kCluster)) * ((p.N + BN - 1) / BN);
  if constexpr (kCluster == 1) {
    // Persistent: one CTA per SM at most (each takes 192 KB of shared memory), looping over the tiles.
    const int64_t grid = std::min<int64_t>(units, sms);
    g_last_grid.store(static_cast<int>(grid), std::memory_order_relaxed);
    kernel<<<static_cast<unsigned>(grid), kThreads, Cfg::kSmemBytes, stream>>>(map_a, map_b, p);
  } else {
    cudaLaunchConfig_t config{};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.stream = stream;
    config.attrs = attr;
    config.numAttrs = 1;
    // Persistent clusters: as many as fit at once (GPCs with an odd number of SMs leave one idle), queried once.
    static const int max_clusters = [&] {
      cudaLaunchConfig_t q = config;
      q.gridDim = dim3(static_cast<unsigned>(sms / kCluster * kCluster));
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &q) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        n = sms / kCluster;
      }
      return n;
    }();
    // CIDER_GEMM_CLUSTERS (experiment, docs/cuda/switches.md): a fixed number of clusters instead of the query's.
    static const int forced = env_int("CIDER_GEMM_CLUSTERS", 0, 0, 4096, op);
    const int64_t clusters = std::min<int64_t>(units, forced > 0 ? forced : max_clusters);
    g_last_grid.store(static_cast<int>(clusters * kCluster), std::memory_order_relaxed);
    config.gridDim = dim3(static_cast<unsigned>(clusters * kCluster));
    CIDER_CUDA_CHECK(op, cudaLaunchKernelEx(&config, kernel, map_a, map_b, p));
  }
  check_last_launch(op);
}

double wave_efficiency(int64_t tiles, int sms) {
  const int64_t waves = (tiles + sms - 1) / sms;
  return static_cast<double>(tiles) / static_cast<double>(waves * sms);
}

template <typename OutT>
void launch_out(const CUtensorMap& map_a, const void* w, const Params& p, bool variant, cudaStream_t stream,
                const char* op) {
  switch (p.group_steps) {  // groups of 64, 128, 256 (the validated int8 group sizes)
    case 2:
      variant ? launch_config<128, 2, 2, OutT>(map_a, w, p, stream, op)
              : launch_config<128, 2, 1, OutT>(map_a, w, p, stream, op);
      return;
    case 4:
      variant ? launch_config<128, 4, 2, OutT>(map_a, w, p, stream, op)
              : launch_config<128, 4, 1, OutT>(map_a, w, p, stream, op);
      return;
    case 8:
      variant ? launch_config<128, 8, 2, OutT>(map_a, w, p, stream, op)
              : launch_config<128, 8, 1, OutT>(map_a, w, p, stream, op);
      return;
    default: break;
  }
  // 128 × 256 tiles do the work of two 128 × 128 ones with half the A traffic per MAC; take them unless the grid
  // then fills the GPU clearly worse (M512 N4096: 64 wide tiles on 132 SMs vs 128 narrow ones).
  const int sms = device_info().sm_count;
  const int64_t m_tiles = (p.M + kBM - 1) / kBM;
  const int64_t wide = m_tiles * ((p.N + 255) / 256), narrow = m_tiles * ((p.N + 127) / 128);
  const bool use_wide = 1.15 * wave_efficiency(wide, sms) >= wave_efficiency(narrow, sms);
  if (variant) {
    if (use_wide) launch_config<256, 0, 2, OutT>(map_a, w, p, stream, op);
    else launch_config<128, 0, 2, OutT>(map_a, w, p, stream, op);
  } else {
    if (use_wide) launch_config<256, 0, 1, OutT>(map_a, w, p, stream, op);
    else launch_config<128, 0, 1, OutT>(map_a, w, p, stream, op);
  }
}

}  // namespace

int last_grid() { return g_last_grid.load(std::memory_order_relaxed); }

// Whether the wgmma kernel can run this GEMM: int8 weights (W4A8 stays on mma.sync), an sm_90 device, the driver's
// tensor-map encoder, per channel or groups of 64/128/256, K a multiple of 16 (TMA row strides), 16-byte aligned
// operands.
bool supported(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq) {
  if (int4) return false;
  if (device_info().cc_major != 9) return false;
  if (encode_tiled() == nullptr) return false;
  const bool groups_ok = a.group_size == 0 || a.group_size == 64 || a.group_size == 128 || a.group_size == 256;
  return groups_ok && a.N <= INT32_MAX && a.K % 16 == 0 && reinterpret_cast<uintptr_t>(a.w) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(xq) % 16 == 0;
}

// Whether the kernel can quantize x itself (on top of supported()): bf16, f16 or f32 x, K % 8 == 0 and x 16-byte
// aligned (16-byte row loads), K ≤ 4096 (a row in one warp's registers), xq 8-byte aligned, every M-tile's counter in
// one slab, M < 2^31 (rows as unsigned claims).
bool fused_quantize_supported(const kernels::IntLinearArgs& a, const int8_t* xq, int slab_counters) {
  const int64_t m_tiles = (a.M + kBM - 1) / kBM;
  return (a.x_dtype == DType::kBF16 || a.x_dtype == DType::kF16 || a.x_dtype == DType::kF32) && a.K % 8 == 0 &&
         a.K <= 8 * 32 * kQuantHeldChunks &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(xq) % 8 == 0 &&
         m_tiles + 2 <= slab_counters && a.M < (int64_t{1} << 31);
}

// out = epilogue(xq · wᵀ) with the wgmma kernel; arguments validated by the caller and supported() true.
// cluster: the 2-CTA multicast variant (opt-in: tested, measured slower; docs/cuda/gemm.md), per channel and per
// group; returns it.
// fused_counters (non-null only without clusters, for bf16/f16 x with K % 8 == 0 and x 16-byte aligned: see
// fused_quantize_supported): the kernel quantizes a.x into xq / sx itself, with that zeroed counter slab.
bool launch(const kernels::IntLinearArgs& a, int8_t* xq, float* sx, bool cluster, unsigned int* fused_counters,
            cudaStream_t stream, const char* op) {
  Params p{};
  p.sx = sx;
  if (fused_counters != nullptr && !cluster) {
    p.x = a.x;
    p.x_kind = a.x_dtype == DType::kBF16 ? 0 : a.x_dtype == DType::kF16 ? 1 : 2;
    p.xq = xq;
    p.sx_out = sx;
    p.qc = fused_counters;
  }
  p.sw = a.w_scales;
  p.bias = a.bias;
  p.out = a.out;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.group_steps = a.group_size / kStepK;
  const size_t out_elem = static_cast<size_t>(dtype_size(a.out_dtype));
  p.paired_store = (a.N % 2 == 0 && reinterpret_cast<uintptr_t>(a.out) % (2 * out_elem) == 0) ? 1 : 0;
  CUtensorMap map_a;
  encode_operand_map(&map_a, xq, a.M, a.K, kBM, op);
  switch (a.out_dtype) {
    case DType::kF32: launch_out<float>(map_a, a.w, p, cluster, stream, op); break;
    case DType::kF16: launch_out<__half>(map_a, a.w, p, cluster, stream, op); break;
    default: launch_out<__nv_bfloat16>(map_a, a.w, p, cluster, stream, op); break;
  }
  return cluster;
}

}  // namespace cider::cuda::gemm_wgmma
