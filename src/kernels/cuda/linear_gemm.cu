// cider/kernels/cuda/linear_gemm.cu — per-token INT8 activation quantization and the prefill W8A8 / W4A8 GEMMs
// on the int8 tensor cores (cuda_api.h; semantics kernels::IntLinearArgs, oracle kernels/ref/w8a8_ref.cpp and
// w4a8_ref.cpp). Design, byte/FLOP floors and predictions: docs/cuda/gemm.md.
//
//   quantize_rows_int8: one block per row; rows of K ≤ 8192 (K % 8 == 0) are loaded once into registers, reduced to
//     max|x| (and "all finite"), then coded; longer rows take two passes (the second re-reads the row from L1/L2).
//     The division x / sx is a multiplication by fl(1/sx) wherever that provably gives the same code (row_scale;
//     8 values at a time without a branch per value, int8_row_quant::codes8_fast).
//     Bit-identical to quant::quantize_int8_row: sx = fl(amax / 127) (1 when 0), q = clamp(rint(fl(x / sx)), ±127),
//     a row holding NaN/inf gets sx = NaN and codes 0.
//   gemm: out[M, N] = epilogue(xq[M, K] · wq[N, K]ᵀ) with mma.sync.m16n8k32 s8·s8→s32, ldmatrix from XOR-swizzled
//     shared tiles filled by a cp.async multi-stage pipeline (BK = 128 k per stage). W4A8 loads the packed nibbles
//     [BN, 64 bytes] per stage and unpacks them into one int8 [BN, 128] tile per k-tile, then runs the same MMAs.
//     Epilogue, exactly the reference's order (each step rounded, never fused):
//       per channel: y = fl(sx · fl(0 + fl(sw[n] · float(acc))))                      (+ bias: fl(y + bias[n]))
//       per group:   s = 0; for g in order: s = fl(s + fl(sw[g, n] · float(acc_g)));  y = fl(sx · s)  (+ bias)
//     The per-group int32 partial is flushed after the k-step that ends each group (groups are multiples of 32).
//   W8A8 and W4A8 run by default on the wgmma kernel of linear_gemm_wgmma.cu (launch_int_gemm picks; this mma.sync
//   kernel stays the fallback — W4A8 groups of 32, unsupported shapes — and the comparison point:
//   CIDER_GEMM_KERNEL=mma).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>
#include <cstdint>
#include <cstring>

#include "core/env.h"
#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/gemm_epilogue.cuh"
#include "kernels/cuda/int8_row_quant.cuh"
#include "kernels/cuda/w4_unpack.cuh"
#include "quant/int4.h"
#include "quant/int8.h"

namespace cider::cuda {

namespace gemm_wgmma {  // linear_gemm_wgmma.cu
bool supported(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq);
void launch(const kernels::IntLinearArgs& a, bool int4, const int8_t* xq, const float* sx, cudaStream_t stream,
            const char* op);
int last_grid();
}  // namespace gemm_wgmma

namespace {

// Which GEMM kernel runs: kAuto picks wgmma (sm_90a, TMA) where gemm_wgmma::supported() holds — K % 16 == 0
// (W4A8: 32), 16-byte aligned operands, not W4A8's groups of 32 — and mma.sync otherwise (other devices). The environment
// variable CIDER_GEMM_KERNEL = mma | wgmma | auto sets the initial choice (read once);
// gemm_bench::set_gemm_kernel overrides it (tests, benchmarks). Forcing wgmma where it is not supported still falls
// back to mma.sync.
enum GemmKernelChoice : int { kGemmAuto = 0, kGemmMmaSync = 1, kGemmWgmma = 2 };
constexpr bool kWgmmaByDefault = true;  // auto → wgmma where supported

std::atomic<int>& gemm_choice() {
  static std::atomic<int> choice{[] {
    const std::string v = env_word("CIDER_GEMM_KERNEL", "auto", {"auto", "mma", "wgmma"}, "cuda.gemm");
    if (v == "mma") return static_cast<int>(kGemmMmaSync);
    if (v == "wgmma") return static_cast<int>(kGemmWgmma);
    return static_cast<int>(kGemmAuto);
  }()};
  return choice;
}
std::atomic<int> g_last_gemm_kernel{0};  // the GemmKernelChoice a launch used (1 or 2), 0 before any

constexpr int kQuantThreads = 256;
constexpr size_t kWorkspaceAlign = 256;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// ---- per-token activation quantization ---------------------------------------------------------------------------

using int8_row_quant::int8_code;
using int8_row_quant::Raw8;
using int8_row_quant::row_scale;
using int8_row_quant::row_sx;
using int8_row_quant::RowScale;

template <typename T>
__device__ __forceinline__ float load_as_float(const T* p, int64_t i);
template <>
__device__ __forceinline__ float load_as_float<float>(const float* p, int64_t i) { return p[i]; }
template <>
__device__ __forceinline__ float load_as_float<__half>(const __half* p, int64_t i) { return __half2float(p[i]); }
template <>
__device__ __forceinline__ float load_as_float<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

// 8 consecutive values starting at element i (16-byte aligned for 16-bit types, 32-byte for float).
template <typename T>
__device__ __forceinline__ void load8(const T* p, int64_t i, float v[8]);
template <>
__device__ __forceinline__ void load8<float>(const float* p, int64_t i, float v[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p + i);
  const float4 b = *reinterpret_cast<const float4*>(p + i + 4);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
template <>
__device__ __forceinline__ void load8<__half>(const __half* p, int64_t i, float v[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p + i);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    __half2 h;
    memcpy(&h, &w[j], 4);
    const float2 f = __half22float2(h);
    v[2 * j] = f.x;
    v[2 * j + 1] = f.y;
  }
}
template <>
__device__ __forceinline__ void load8<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i, float v[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p + i);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // bfloat16 → float32 is exact: the 16 bits become the top half.
    v[2 * j] = __uint_as_float(w[j] << 16);
    v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

// Block-wide max |x| and "all finite" over kQuantThreads threads (max is exact: the order does not matter).
__device__ __forceinline__ void block_amax(float& amax, bool& finite) {
  __shared__ float warp_amax[kQuantThreads / 32];
  __shared__ int warp_finite[kQuantThreads / 32];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const int all_finite_in_warp = __all_sync(0xffffffffu, finite ? 1 : 0);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) {
    warp_amax[warp] = amax;
    warp_finite[warp] = all_finite_in_warp;
  }
  __syncthreads();
  amax = 0.0f;
  finite = true;
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; ++w) {
    amax = fmaxf(amax, warp_amax[w]);
    finite = finite && warp_finite[w] != 0;
  }
}

// Blocks per SM the one-pass kernel asks registers for: its raw words are kHeld · 8 · sizeof(T) / 4 registers.
template <typename T, int kHeld>
constexpr int held_min_blocks() {
  constexpr int raw_regs = kHeld * 8 * static_cast<int>(sizeof(T)) / 4;
  return raw_regs <= 8 ? 8 : raw_regs <= 16 ? 6 : 4;
}

// One pass (K ≤ 8 · kQuantThreads · kHeld, K % 8 == 0, aligned): each thread loads its kHeld chunks of 8 values once,
// keeps them in registers (raw) through the block reduction, then writes their codes. grid: M blocks.
template <typename T, int kHeld>
__global__ void __launch_bounds__(kQuantThreads, (held_min_blocks<T, kHeld>()))
    quantize_rows_held_kernel(const T* __restrict__ x, int64_t K, int8_t* __restrict__ xq,
                              float* __restrict__ sx_out) {
  // x is the previous kernel's output: wait for it (pdl.cuh), then let the GEMV behind start its weight prologue.
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t m = blockIdx.x;
  const T* row = x + m * K;
  int8_t* qrow = xq + m * K;
  Raw8<T> v[kHeld];
  float amax = 0.0f;
  bool finite = true;
#pragma unroll
  for (int c = 0; c < kHeld; ++c) {
    const int64_t k = 8 * (static_cast<int64_t>(threadIdx.x) + static_cast<int64_t>(c) * kQuantThreads);
    if (k < K) v[c].load(row, k);
  }
#pragma unroll
  for (int c = 0; c < kHeld; ++c) {
    const int64_t k = 8 * (static_cast<int64_t>(threadIdx.x) + static_cast<int64_t>(c) * kQuantThreads);
    if (k < K) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float f = v[c].get(j);
        finite = finite && isfinite(f);
        amax = fmaxf(amax, fabsf(f));
      }
    }
  }
  block_amax(amax, finite);
  const float sx = row_sx(amax, finite);
  if (threadIdx.x == 0) sx_out[m] = sx;
  const RowScale scale = row_scale(sx);
#pragma unroll
  for (int c = 0; c < kHeld; ++c) {
    const int64_t k = 8 * (static_cast<int64_t>(threadIdx.x) + static_cast<int64_t>(c) * kQuantThreads);
    if (k < K) {
      uint2 q = make_uint2(0u, 0u);
      if (finite) {
        float f[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = v[c].get(j);
        bool exact = false;
        q = int8_row_quant::codes8_fast(f, scale, exact);
        if (exact) q = int8_row_quant::codes8_exact(f, sx);
      }
      *reinterpret_cast<uint2*>(qrow + k) = q;
    }
  }
}

// Two passes (any K): pass 1 reduces max|x| and "all finite", pass 2 re-reads the row (L1/L2) and writes the codes.
// grid: M blocks. vec8: K % 8 == 0 and x, xq aligned for 8-element accesses.
template <typename T, bool kVec8>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(const T* __restrict__ x, int64_t K,
                                                                       int8_t* __restrict__ xq,
                                                                       float* __restrict__ sx_out) {
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t m = blockIdx.x;
  const T* row = x + m * K;
  int8_t* qrow = xq + m * K;

  float amax = 0.0f;
  bool finite = true;
  if constexpr (kVec8) {
    for (int64_t k = 8 * static_cast<int64_t>(threadIdx.x); k < K; k += 8 * kQuantThreads) {
      float v[8];
      load8<T>(row, k, v);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        finite = finite && isfinite(v[j]);
        amax = fmaxf(amax, fabsf(v[j]));
      }
    }
  } else {
    for (int64_t k = threadIdx.x; k < K; k += kQuantThreads) {
      const float v = load_as_float<T>(row, k);
      finite = finite && isfinite(v);
      amax = fmaxf(amax, fabsf(v));
    }
  }
  block_amax(amax, finite);
  const float sx = row_sx(amax, finite);
  if (threadIdx.x == 0) sx_out[m] = sx;
  if (!finite) {
    for (int64_t k = threadIdx.x; k < K; k += kQuantThreads) qrow[k] = 0;
    return;
  }
  const RowScale scale = row_scale(sx);
  if constexpr (kVec8) {
    for (int64_t k = 8 * static_cast<int64_t>(threadIdx.x); k < K; k += 8 * kQuantThreads) {
      float v[8];
      load8<T>(row, k, v);
      bool exact = false;
      uint2 q = int8_row_quant::codes8_fast(v, scale, exact);
      if (exact) q = int8_row_quant::codes8_exact(v, sx);
      *reinterpret_cast<uint2*>(qrow + k) = q;
    }
  } else {
    for (int64_t k = threadIdx.x; k < K; k += kQuantThreads)
      qrow[k] = static_cast<int8_t>(int8_code(load_as_float<T>(row, k), scale));
  }
}

template <typename T>
void launch_quantize(const void* x, int64_t M, int64_t K, int8_t* xq, float* sx, cudaStream_t stream) {
  const bool vec8 = K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 32 == 0 && reinterpret_cast<uintptr_t>(xq) % 8 == 0;
  const dim3 grid(static_cast<unsigned>(M));
  const auto* xt = static_cast<const T*>(x);
  constexpr int64_t kChunk = 8 * kQuantThreads;  // values per held register set
  if (vec8 && K <= kChunk)
    (void)cuda::pdl::launch(quantize_rows_held_kernel<T, 1>, grid, dim3(kQuantThreads), 0, stream, xt, K, xq, sx);
  else if (vec8 && K <= 2 * kChunk)
    (void)cuda::pdl::launch(quantize_rows_held_kernel<T, 2>, grid, dim3(kQuantThreads), 0, stream, xt, K, xq, sx);
  else if (vec8 && K <= 4 * kChunk)
    (void)cuda::pdl::launch(quantize_rows_held_kernel<T, 4>, grid, dim3(kQuantThreads), 0, stream, xt, K, xq, sx);
  else if (vec8)
    (void)cuda::pdl::launch(quantize_rows_kernel<T, true>, grid, dim3(kQuantThreads), 0, stream, xt, K, xq, sx);
  else
    (void)cuda::pdl::launch(quantize_rows_kernel<T, false>, grid, dim3(kQuantThreads), 0, stream, xt, K, xq, sx);
}

void quantize_rows_unchecked(const void* x, DType x_dtype, int64_t M, int64_t K, int8_t* xq, float* sx,
                             cudaStream_t stream) {
  switch (x_dtype) {
    case DType::kF32: launch_quantize<float>(x, M, K, xq, sx, stream); break;
    case DType::kF16: launch_quantize<__half>(x, M, K, xq, sx, stream); break;
    default: launch_quantize<__nv_bfloat16>(x, M, K, xq, sx, stream); break;
  }
}

bool is_activation_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// ---- the int8 tensor-core GEMM -------------------------------------------------------------------------------------

constexpr int kBK = 128;           // k values per pipeline stage (= bytes of one int8 tile row)
constexpr int kStepK = 32;         // k per mma.m16n8k32
constexpr int kStepsPerTile = kBK / kStepK;
constexpr int kThreads = 256;      // 8 warps

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global → shared; src_bytes 0 fills the 16 bytes with zeros (tails in M, N and K).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// D = A·B + D for one 16×8 tile over 32 k: a[4] (row-major A fragment), b[2] (column-major B fragment).
__device__ __forceinline__ void mma_s8(int32_t d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Byte offset of 16-byte chunk `chunk` (0..7) of row `row` in a [rows, 128-byte] tile. The chunk index is XORed
// with row % 8, so the 8 rows one ldmatrix phase reads (same logical chunk) land on 8 different bank groups.
__device__ __forceinline__ int swz(int row, int chunk) { return row * kBK + ((chunk ^ (row & 7)) << 4); }

using gemm_epilogue::small_int_to_float;
using gemm_epilogue::store_one;
using gemm_epilogue::store_two;

struct GemmParams {
  const int8_t* xq;   // [M, K] int8
  const float* sx;    // [M]
  const void* w;      // int8 [N, K] or packed int4 [N, K/2]
  const float* sw;    // [N] or [K/gs, N]
  const float* bias;  // [N] or null
  void* out;          // [M, N]
  int64_t M, N, K;
  int group_steps;    // per group: group_size / 32 (a power of two); 0 = per channel
  int paired_store;   // N even and out aligned to two elements
};

// Tile BM × BN × 128 per CTA, 8 warps as WARPS_M × WARPS_N, STAGES-deep cp.async pipeline.
template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool kInt4, bool kGrouped>
struct GemmConfig {
  static_assert(WARPS_M * WARPS_N * 32 == kThreads, "8 warps");
  static constexpr int kWM = BM / WARPS_M, kWN = BN / WARPS_N;  // warp tile
  static constexpr int kMT = kWM / 16, kNT = kWN / 8;            // mma tiles per warp
  static_assert(kWM % 16 == 0 && kWN % 16 == 0, "warp tile");
  static constexpr int kBRowBytes = kInt4 ? kBK / 2 : kBK;      // bytes of one weight row per stage
  static constexpr int kAStage = BM * kBK, kBStage = BN * kBRowBytes;
  static constexpr int kUnpacked = kInt4 ? BN * kBK : 0;         // the int8 weight tile W4A8 unpacks into
  static constexpr size_t kSmemBytes = static_cast<size_t>(STAGES) * (kAStage + kBStage) + kUnpacked;
};

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool kInt4, bool kGrouped, typename OutT>
__global__ void __launch_bounds__(kThreads, 1) int8_gemm_kernel(const GemmParams p) {
  using Cfg = GemmConfig<BM, BN, WARPS_M, WARPS_N, STAGES, kInt4, kGrouped>;
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* a_smem = smem;                                 // STAGES × [BM, 128]  swizzled
  uint8_t* b_smem = smem + STAGES * Cfg::kAStage;         // STAGES × [BN, 128] swizzled, or [BN, 64] packed
  uint8_t* b_unpacked = b_smem + STAGES * Cfg::kBStage;   // W4A8: [BN, 128] swizzled

  const int64_t M = p.M, N = p.N, K = p.K;
  // Grouped raster: 16 M-tiles share each run of N-tiles, so a wave reuses the A rows and every W tile from L2.
  constexpr int kGroupM = 16;
  const int64_t m_tiles = (M + BM - 1) / BM, n_tiles = (N + BN - 1) / BN;
  const int64_t tile = blockIdx.x;
  const int64_t per_group = kGroupM * n_tiles;
  const int64_t first_m = tile / per_group * kGroupM;
  const int64_t group_m = min(static_cast<int64_t>(kGroupM), m_tiles - first_m);
  const int64_t in_group = tile % per_group;
  const int64_t m0 = (first_m + in_group % group_m) * BM;
  const int64_t n0 = in_group / group_m * BN;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WARPS_N, warp_n = warp % WARPS_N;
  const int k_tiles = static_cast<int>((K + kBK - 1) / kBK);
  const int k_steps_total = static_cast<int>(K / kStepK);

  const int8_t* __restrict__ xq = p.xq;
  const uint8_t* __restrict__ w = static_cast<const uint8_t*>(p.w);
  const int64_t w_row_bytes = kInt4 ? K / 2 : K;

  // One k-tile into stage `stage`: A [BM, 128] and B [BN, 128] (or packed [BN, 64]) as 16-byte chunks.
  auto load_tile = [&](int stage, int kt) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBK;
    const uint32_t a_base = smem_addr(a_smem + stage * Cfg::kAStage);
#pragma unroll
    for (int i = 0; i < BM * 8 / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c >> 3, chunk = c & 7;
      const int64_t gm = m0 + row, gk = k0 + chunk * 16;
      const bool ok = gm < M && gk < K;
      const int8_t* src = ok ? xq + gm * K + gk : xq;
      cp_async_16(a_base + static_cast<uint32_t>(swz(row, chunk)), src, ok ? 16 : 0);
    }
    const uint32_t b_base = smem_addr(b_smem + stage * Cfg::kBStage);
    constexpr int kChunksPerRow = Cfg::kBRowBytes / 16;
#pragma unroll
    for (int i = 0; i < BN * kChunksPerRow / kThreads; ++i) {
      const int c = tid + i * kThreads;
      const int row = c / kChunksPerRow, chunk = c % kChunksPerRow;
      const int64_t gn = n0 + row;
      const int64_t gbyte = (kInt4 ? k0 / 2 : k0) + chunk * 16;  // a packed chunk holds 32 k values
      const bool ok = gn < N && gbyte < w_row_bytes;
      const uint8_t* src = ok ? w + gn * w_row_bytes + gbyte : w;
      const uint32_t off = kInt4 ? static_cast<uint32_t>(row * Cfg::kBRowBytes + chunk * 16)
                                 : static_cast<uint32_t>(swz(row, chunk));
      cp_async_16(b_base + off, src, ok ? 16 : 0);
    }
  };

  int32_t acc[kMT][kNT][4];
  float facc[kGrouped ? kMT : 1][kGrouped ? kNT : 1][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0;
  if constexpr (kGrouped) {
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) facc[i][j][c] = 0.0f;
  }

  // This thread's output columns: n0 + warp_n·WN + j·8 + 2·(lane%4) + {0, 1}.
  const int64_t col0 = n0 + warp_n * Cfg::kWN + 2 * (lane & 3);
  // Per group: the scales of the group being accumulated, loaded one group ahead.
  float sw_cur[kGrouped ? kNT : 1][2];
  auto load_group_scales = [&](int64_t g) {
#pragma unroll
    for (int j = 0; j < (kGrouped ? kNT : 1); ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t n = col0 + j * 8 + e;
        sw_cur[j][e] = n < N ? __ldg(p.sw + g * N + n) : 0.0f;
      }
  };
  if constexpr (kGrouped) load_group_scales(0);

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_tile(s, s);
    cp_async_commit();
  }

  // ldmatrix lane roles: lane l addresses row (l % 8) of 8×16-byte matrix l / 8.
  const int lrow = lane & 7, lmat = lane >> 3;

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage kt landed for every thread; every warp is done with k-tile kt-1
    {
      const int next = kt + STAGES - 1;
      if (next < k_tiles) load_tile(next % STAGES, next);
      cp_async_commit();
    }
    const int stage = kt % STAGES;
    const uint8_t* a_tile = a_smem + stage * Cfg::kAStage;
    const uint8_t* b_tile;
    if constexpr (kInt4) {
      // Unpack [BN, 64] packed bytes → [BN, 128] int8 (swizzled like the W8A8 tile): byte i holds k = 2i (low
      // nibble) and 2i + 1 (high); code = nibble − 8.
      const uint8_t* packed = b_smem + stage * Cfg::kBStage;
#pragma unroll
      for (int i = 0; i < BN * 4 / kThreads; ++i) {
        const int c = tid + i * kThreads;
        const int row = c >> 2, chunk = c & 3;  // packed chunk: 16 bytes = 32 k values
        const uint4 src = *reinterpret_cast<const uint4*>(packed + row * (kBK / 2) + chunk * 16);
        const uint32_t words[4] = {src.x, src.y, src.z, src.w};
        uint32_t q[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) unpack_w4_word(words[j], q[2 * j], q[2 * j + 1]);  // k 8j+0..3, 8j+4..7
        *reinterpret_cast<uint4*>(b_unpacked + swz(row, 2 * chunk)) = make_uint4(q[0], q[1], q[2], q[3]);
        *reinterpret_cast<uint4*>(b_unpacked + swz(row, 2 * chunk + 1)) = make_uint4(q[4], q[5], q[6], q[7]);
      }
      __syncthreads();
      b_tile = b_unpacked;
    } else {
      b_tile = b_smem + stage * Cfg::kBStage;
    }

#pragma unroll
    for (int s = 0; s < kStepsPerTile; ++s) {
      uint32_t a_frag[kMT][4];
      uint32_t b_frag[kNT][2];
#pragma unroll
      for (int i = 0; i < kMT; ++i) {
        // matrices: 0 rows 0-7 k 0-15, 1 rows 8-15 k 0-15, 2 rows 0-7 k 16-31, 3 rows 8-15 k 16-31
        const int row = warp_m * Cfg::kWM + i * 16 + lrow + (lmat & 1) * 8;
        const int chunk = 2 * s + (lmat >> 1);
        ldmatrix_x4(smem_addr(a_tile + swz(row, chunk)), a_frag[i][0], a_frag[i][1], a_frag[i][2], a_frag[i][3]);
      }
#pragma unroll
      for (int j = 0; j < kNT; j += 2) {
        // matrices: 0 n 0-7 k 0-15, 1 n 0-7 k 16-31, 2 n 8-15 k 0-15, 3 n 8-15 k 16-31
        const int row = warp_n * Cfg::kWN + j * 8 + lrow + (lmat >> 1) * 8;
        const int chunk = 2 * s + (lmat & 1);
        ldmatrix_x4(smem_addr(b_tile + swz(row, chunk)), b_frag[j][0], b_frag[j][1], b_frag[j + 1][0],
                    b_frag[j + 1][1]);
      }
#pragma unroll
      for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int j = 0; j < kNT; ++j) mma_s8(acc[i][j], a_frag[i], b_frag[j]);

      if constexpr (kGrouped) {
        const int step = kt * kStepsPerTile + s;  // global k-step just accumulated
        if (step < k_steps_total && ((step + 1) & (p.group_steps - 1)) == 0) {
          // Group g = step / group_steps ends here: s += fl(sw[g, n] · float(acc_g)), in group order.
#pragma unroll
          for (int i = 0; i < kMT; ++i)
#pragma unroll
            for (int j = 0; j < kNT; ++j)
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const float part = __fmul_rn(sw_cur[j][c & 1], small_int_to_float(acc[i][j][c]));
                facc[i][j][c] = __fadd_rn(facc[i][j][c], part);
                acc[i][j][c] = 0;
              }
          const int64_t next_group = (step + 1) / p.group_steps;
          if (next_group * p.group_steps < k_steps_total) load_group_scales(next_group);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing real is in flight (the trailing groups are empty), but leave no copy pending

  // Epilogue: thread holds rows g, g+8 of each 16-row tile and columns 2t, 2t+1 of each 8-column tile.
  OutT* out = static_cast<OutT*>(p.out);
  float sw_col[kNT][2], bias_col[kNT][2];
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int64_t n = col0 + j * 8 + e;
      sw_col[j][e] = (!kGrouped && n < N) ? __ldg(p.sw + n) : 0.0f;
      bias_col[j][e] = (p.bias != nullptr && n < N) ? __ldg(p.bias + n) : 0.0f;
    }
  const bool has_bias = p.bias != nullptr;
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t m = m0 + warp_m * Cfg::kWM + i * 16 + (lane >> 2) + h * 8;
      if (m >= M) continue;
      const float sxm = __ldg(p.sx + m);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        float y[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = h * 2 + e;
          float sum;
          if constexpr (kGrouped) {
            sum = facc[i][j][c];
          } else {
            sum = __fadd_rn(0.0f, __fmul_rn(sw_col[j][e], __int2float_rn(acc[i][j][c])));
          }
          float v = __fmul_rn(sxm, sum);
          if (has_bias) v = __fadd_rn(v, bias_col[j][e]);
          y[e] = v;
        }
        const int64_t n = col0 + j * 8;
        if (p.paired_store && n + 1 < N) {
          store_two<OutT>(out, m * N + n, y[0], y[1]);
        } else {
          if (n < N) store_one<OutT>(out, m * N + n, y[0]);
          if (n + 1 < N) store_one<OutT>(out, m * N + n + 1, y[1]);
        }
      }
    }
}

template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, bool kInt4, bool kGrouped, typename OutT>
void launch_gemm_config(const GemmParams& p, cudaStream_t stream, const char* op) {
  using Cfg = GemmConfig<BM, BN, WARPS_M, WARPS_N, STAGES, kInt4, kGrouped>;
  auto kernel = int8_gemm_kernel<BM, BN, WARPS_M, WARPS_N, STAGES, kInt4, kGrouped, OutT>;
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<size_t>(Cfg::kSmemBytes), op);
  const int64_t tiles = ((p.M + BM - 1) / BM) * ((p.N + BN - 1) / BN);
  check(tiles <= INT32_MAX, ErrorCode::kOutOfRange, op, "too many output tiles; got ", tiles);
  kernel<<<static_cast<unsigned>(tiles), kThreads, Cfg::kSmemBytes, stream>>>(p);
  check_last_launch(op);
}

// Fraction of the SM slots the last wave of `tiles` CTAs (one per SM) keeps busy overall.
double wave_efficiency(int64_t tiles, int sms) {
  const int64_t waves = (tiles + sms - 1) / sms;
  return static_cast<double>(tiles) / static_cast<double>(waves * sms);
}

// Config choice: per channel, 128×256 CTA tiles (warp tile 64×64) when the grid fills the GPU well, else 128×128
// (warp tile 64×32). Per group always 128×128: the float partial sums double the accumulator registers.
template <bool kInt4, typename OutT>
void launch_gemm_out(const GemmParams& p, cudaStream_t stream, const char* op) {
  if (p.group_steps > 0) {
    launch_gemm_config<128, 128, 2, 4, 4, kInt4, true, OutT>(p, stream, op);
    return;
  }
  const int sms = device_info().sm_count;
  const int64_t m_tiles = (p.M + 127) / 128;
  const int64_t tiles_wide = m_tiles * ((p.N + 255) / 256), tiles_narrow = m_tiles * ((p.N + 127) / 128);
  // A 128×256 tile does the work of two 128×128 ones with fewer shared-memory reads per MMA (~1.15× the rate).
  if (1.15 * wave_efficiency(tiles_wide, sms) >= wave_efficiency(tiles_narrow, sms))
    launch_gemm_config<128, 256, 2, 4, 4, kInt4, false, OutT>(p, stream, op);
  else
    launch_gemm_config<128, 128, 2, 4, 4, kInt4, false, OutT>(p, stream, op);
}

void validate_int_linear(const kernels::IntLinearArgs& a, bool int4, const Exec& exec, const char* op) {
  require_device(op);
  check(a.M >= 1 && a.N >= 1, ErrorCode::kShapeMismatch, op, "M and N must be at least 1; got M ", a.M, ", N ",
        a.N);
  check(a.M <= INT32_MAX, ErrorCode::kOutOfRange, op, "M must be at most 2^31 - 1; got ", a.M);
  check(a.K >= 32 && a.K % 32 == 0, ErrorCode::kShapeMismatch, op, "K must be a positive multiple of 32; got ",
        a.K);
  check(is_activation_dtype(a.x_dtype), ErrorCode::kInvalidArgument, op, "x_dtype must be f32, f16 or bf16; got ",
        dtype_name(a.x_dtype));
  check(is_activation_dtype(a.out_dtype), ErrorCode::kInvalidArgument, op,
        "out_dtype must be f32, f16 or bf16; got ", dtype_name(a.out_dtype));
  if (int4) {
    check(quant::is_int4_group_size(a.group_size), ErrorCode::kInvalidArgument, op,
          "group_size must be 0 (per channel), 32, 64, 128 or 256; got ", a.group_size);
    check(a.group_size > 0 || a.K <= quant::kInt4MaxAccumK, ErrorCode::kOutOfRange, op,
          "per-channel K must be at most ", quant::kInt4MaxAccumK, " (int32 sums); got ", a.K);
  } else {
    check(quant::is_int8_group_size(a.group_size), ErrorCode::kInvalidArgument, op,
          "group_size must be 0 (per channel), 64, 128 or 256; got ", a.group_size);
    check(a.group_size > 0 || a.K <= quant::kInt8MaxAccumK, ErrorCode::kOutOfRange, op,
          "per-channel K must be at most ", quant::kInt8MaxAccumK, " (int32 sums); got ", a.K);
  }
  check(a.group_size == 0 || a.K % a.group_size == 0, ErrorCode::kShapeMismatch, op,
        "K must be a multiple of group_size ", a.group_size, "; got ", a.K);
  check(a.x != nullptr && a.w != nullptr && a.w_scales != nullptr && a.out != nullptr, ErrorCode::kInvalidArgument,
        op, "x, w, w_scales and out must be device pointers, not null");
  check(reinterpret_cast<uintptr_t>(a.w) % 16 == 0, ErrorCode::kInvalidArgument, op,
        "w must be 16-byte aligned (cp.async); got address ", a.w);
  const size_t need = int_linear_workspace_bytes(a.M, a.K);
  check(exec.workspace != nullptr && exec.workspace_bytes >= need, ErrorCode::kInvalidArgument, op,
        "exec.workspace must hold int_linear_workspace_bytes(M, K) = ", need, " bytes; got ", exec.workspace_bytes);
  check(reinterpret_cast<uintptr_t>(exec.workspace) % kWorkspaceAlign == 0, ErrorCode::kInvalidArgument, op,
        "exec.workspace must be 256-byte aligned; got address ", exec.workspace);
}

// The GEMM on already-quantized activations (xq [M, K], sx [M]); arguments validated by the caller.
void launch_int_gemm(const kernels::IntLinearArgs& a, const int8_t* xq, const float* sx, bool int4,
                     cudaStream_t stream, const char* op) {
  const int choice = gemm_choice().load(std::memory_order_relaxed);
  const bool want_wgmma = choice == kGemmWgmma || (choice == kGemmAuto && kWgmmaByDefault);
  if (want_wgmma && gemm_wgmma::supported(a, int4, xq)) {
    gemm_wgmma::launch(a, int4, xq, sx, stream, op);
    g_last_gemm_kernel.store(kGemmWgmma, std::memory_order_relaxed);
    return;
  }
  g_last_gemm_kernel.store(kGemmMmaSync, std::memory_order_relaxed);
  GemmParams p{};
  p.xq = xq;
  p.sx = sx;
  p.w = a.w;
  p.sw = a.w_scales;
  p.bias = a.bias;
  p.out = a.out;
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.group_steps = a.group_size / kStepK;
  const size_t out_elem = static_cast<size_t>(dtype_size(a.out_dtype));
  p.paired_store = (a.N % 2 == 0 && reinterpret_cast<uintptr_t>(a.out) % (2 * out_elem) == 0) ? 1 : 0;

  switch (a.out_dtype) {
    case DType::kF32:
      int4 ? launch_gemm_out<true, float>(p, stream, op) : launch_gemm_out<false, float>(p, stream, op);
      break;
    case DType::kF16:
      int4 ? launch_gemm_out<true, __half>(p, stream, op) : launch_gemm_out<false, __half>(p, stream, op);
      break;
    default:
      int4 ? launch_gemm_out<true, __nv_bfloat16>(p, stream, op)
           : launch_gemm_out<false, __nv_bfloat16>(p, stream, op);
      break;
  }
}

void int_gemm(const kernels::IntLinearArgs& a, bool int4, const Exec& exec, const char* op) {
  validate_int_linear(a, int4, exec, op);
  auto stream = static_cast<cudaStream_t>(exec.stream);
  auto* xq = static_cast<int8_t*>(exec.workspace);
  auto* sx = reinterpret_cast<float*>(static_cast<uint8_t*>(exec.workspace) +
                                      round_up(static_cast<size_t>(a.M * a.K), kWorkspaceAlign));
  quantize_rows_unchecked(a.x, a.x_dtype, a.M, a.K, xq, sx, stream);
  check_last_launch(op);
  launch_int_gemm(a, xq, sx, int4, stream, op);
}

}  // namespace

size_t int_linear_workspace_bytes(int64_t M, int64_t K) {
  check(M >= 0 && K >= 0, ErrorCode::kShapeMismatch, "cuda.int_linear_workspace_bytes",
        "M and K must not be negative; got M ", M, ", K ", K);
  // xq [M, K] int8, then sx [M] float32, each 256-byte aligned.
  return round_up(static_cast<size_t>(M) * static_cast<size_t>(K), kWorkspaceAlign) +
         round_up(static_cast<size_t>(M) * sizeof(float), kWorkspaceAlign);
}

void quantize_rows_int8(const void* x, DType x_dtype, int64_t M, int64_t K, int8_t* xq, float* sx, const Exec& exec) {
  constexpr const char* kOp = "cuda.quantize_rows_int8";
  require_device(kOp);
  check(M >= 1 && K >= 1, ErrorCode::kShapeMismatch, kOp, "M and K must be at least 1; got M ", M, ", K ", K);
  check(M <= INT32_MAX, ErrorCode::kOutOfRange, kOp, "M must be at most 2^31 - 1; got ", M);
  check(is_activation_dtype(x_dtype), ErrorCode::kInvalidArgument, kOp, "x_dtype must be f32, f16 or bf16; got ",
        dtype_name(x_dtype));
  check(x != nullptr && xq != nullptr && sx != nullptr, ErrorCode::kInvalidArgument, kOp,
        "x, xq and sx must be device pointers, not null");
  quantize_rows_unchecked(x, x_dtype, M, K, xq, sx, static_cast<cudaStream_t>(exec.stream));
  check_last_launch(kOp);
}

void w8a8_gemm(const kernels::IntLinearArgs& args, const Exec& exec) {
  int_gemm(args, false, exec, "cuda.w8a8_gemm");
}

void w4a8_gemm(const kernels::IntLinearArgs& args, const Exec& exec) {
  int_gemm(args, true, exec, "cuda.w4a8_gemm");
}

namespace gemm_bench {
// For bench/cuda/bench_gemm.cpp only (not part of cuda_api.h): the GEMM alone, on activations quantized
// beforehand into exec.workspace by quantize_rows_int8 (xq at offset 0, sx after round_up(M·K, 256) bytes).
void int8_gemm_prequantized(const kernels::IntLinearArgs& args, bool int4, const Exec& exec) {
  const char* op = int4 ? "cuda.w4a8_gemm" : "cuda.w8a8_gemm";
  validate_int_linear(args, int4, exec, op);
  const auto* xq = static_cast<const int8_t*>(exec.workspace);
  const auto* sx = reinterpret_cast<const float*>(static_cast<const uint8_t*>(exec.workspace) +
                                                  round_up(static_cast<size_t>(args.M * args.K), kWorkspaceAlign));
  launch_int_gemm(args, xq, sx, int4, static_cast<cudaStream_t>(exec.stream), op);
}
// 0 = auto (wgmma where supported), 1 = force mma.sync, 2 = force wgmma where supported (else mma.sync).
void set_gemm_kernel(int choice) {
  check(choice >= kGemmAuto && choice <= kGemmWgmma, ErrorCode::kInvalidArgument, "cuda.set_gemm_kernel",
        "choice must be 0 (auto), 1 (mma.sync) or 2 (wgmma); got ", choice);
  gemm_choice().store(choice, std::memory_order_relaxed);
}
int gemm_kernel_choice() { return gemm_choice().load(std::memory_order_relaxed); }
// The kernel the last GEMM launch used: 1 = mma.sync, 2 = wgmma (0 before any launch).
int last_gemm_kernel() { return g_last_gemm_kernel.load(std::memory_order_relaxed); }
// CTAs in the grid of the last wgmma launch (0 before any).
int last_gemm_grid() { return gemm_wgmma::last_grid(); }
}  // namespace gemm_bench

}  // namespace cider::cuda
