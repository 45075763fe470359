// cider/kernels/cuda/linear_ggml.cu — linear layers over native GGUF weights (cuda_api.h "Native GGUF weights"):
// the blocks of a GGUF file (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K) multiplied as they are.
//
// Every kernel reads a block through its integer form (ggml_piece.cuh, the device twin of quant::ggml_piece).
//
// Phases and their kernels:
//   quantize_pieces  x [M, K] f32 → xq [M, K] int8, dx [M, P] f32, xs [M, P] float2 (P = K/32): one warp per piece,
//                    dx = max|x|/127 (1 for an all-zero piece, NaN for a non-finite one), xq = rint(x / dx), and
//                    xs = dx·(Σ codes of each half-piece) — the CPU kernels' activations (avx2/ggml_linear.cpp).
//   gemv<T, MT>      out [MT, N]: one warp per weight row, its lanes over the row's pieces (each piece's bytes read
//                    once, for all MT activation rows), per piece and row S_h = Σ_{i∈h} c_i·xq_i by dp4a (exact in
//                    int32) and acc += dx·(a₀·S₀ + a₁·S₁) + (b₀·X₀ + b₁·X₁) in float32; a warp sum, then + bias.
//                    The general decode kernel; where the rows are 16-byte multiples and the tile fits shared memory
//                    the row kernel (linear_ggml_rows.cu) runs instead, with the same terms from shared memory.
//   dequantize_bf16  one thread per piece: a_h·c_i (+ b_h) with one rounding per operation, never fused (the
//                    decoder's float32 values bit for bit), rounded to bf16; the prefill path (M > kGgmlGemvRows)
//                    multiplies those rows with dense_bf16 (cuBLASLt), at most kDequantBytes of them per pass.
//   embed_rows       one CTA per token, one thread per piece: the decoded row times the embedding scale.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/ggml_piece.cuh"
#include "kernels/cuda/linear_ggml_rows.h"
#include "kernels/cuda/pdl.cuh"
#include "core/env.h"
#include "kernels/cuda/int8_row_quant.cuh"
#include "quant/ggml_blocks.h"

namespace cider::cuda {

namespace {

using quant::GgmlType;
using namespace ggml_device;

constexpr int kGemvWarps = 4;      // weight rows per CTA (one per warp)
constexpr int kMaxTileRows = 8;    // activation rows per pass over the weights
static_assert(kMaxTileRows == ggml_rows::kMaxTile, "the row kernel takes the same tiles");
constexpr int kQuantWarps = 8;     // pieces per CTA of the activation quantization
constexpr int kPieceThreads = 256; // threads per CTA of the dequantization (one piece each)
// The prefill path decodes at most this many bytes of bf16 rows at a time (a multiple of 256 rows; whole N when it
// fits), so a session's workspace stays bounded for any layer (Llama-3-8B's head: 128 256 × 4096 would be 1 GiB).
constexpr size_t kDequantBytes = size_t{32} << 20;

size_t round_up_256(size_t v) { return (v + 255) / 256 * 256; }

// ---- kernels -------------------------------------------------------------------------------------------------------

// One warp per piece of 32 activations (lane = element).
__global__ void __launch_bounds__(kQuantWarps * 32) quantize_pieces_kernel(const float* __restrict__ x, int64_t M,
                                                                            int64_t K, int8_t* __restrict__ xq,
                                                                            float* __restrict__ dx,
                                                                            float2* __restrict__ xs) {
  // The row kernel behind may start now (its prologue reads only weights); it waits for this grid before reading xq.
  cuda::pdl::launch_dependents();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t P = K / 32;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kQuantWarps + static_cast<int>(threadIdx.x) / 32;
  if (g >= M * P) return;  // whole warps
  const int64_t m = g / P, p = g % P;
  const float v = x[m * K + p * 32 + lane];
  const float a = fabsf(v);
  const bool bad = __any_sync(0xffffffffu, !(a <= 3.402823466e38f));  // NaN or infinity in the piece
  float amax = a;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  float sx = __fdiv_rn(amax, 127.0f);
  if (sx == 0.0f) sx = 1.0f;
  if (bad) sx = __int_as_float(0x7fc00000);
  const int q = bad ? 0 : int8_row_quant::int8_code(v, sx);
  xq[m * K + p * 32 + lane] = static_cast<int8_t>(q);
  int s = q;  // sums within each half-warp: the two half-pieces
#pragma unroll
  for (int o = 8; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int s1 = __shfl_sync(0xffffffffu, s, 16);
  if (lane == 0) {
    dx[g] = sx;
    xs[g] = make_float2(__fmul_rn(sx, static_cast<float>(s)), __fmul_rn(sx, static_cast<float>(s1)));
  }
}

// out[m, n] for MT activation rows (xq, dx, xs and out already at the tile's first row). One warp per weight row.
template <GgmlType T, int MT>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                                                                int64_t N, int64_t K, const int8_t* __restrict__ xq,
                                                                const float* __restrict__ dx,
                                                                const float2* __restrict__ xs,
                                                                const float* __restrict__ bias,
                                                                float* __restrict__ out) {
  constexpr int kPieces = pieces_per_block<T>();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + static_cast<int>(threadIdx.x) / 32;
  if (n >= N) return;  // whole warps; no barrier below
  const int64_t P = K / 32;
  const uint8_t* row = w + n * row_bytes;
  float acc[MT];
#pragma unroll
  for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
#pragma unroll 2
  for (int64_t p = lane; p < P; p += 32) {
    Piece pc;
    Fmt<T>::template piece<LdGlobal>(row + (p / kPieces) * Fmt<T>::kBytes, static_cast<int>(p % kPieces), pc);
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] += piece_term<T>(pc, xq + m * K + p * 32, dx[m * P + p], xs + m * P + p);
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float v = acc[m];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) out[m * N + n] = bias != nullptr ? v + bias[n] : v;
  }
}

// One thread per piece of rows × K weights → bf16.
template <GgmlType T>
__global__ void __launch_bounds__(kPieceThreads) dequantize_bf16_kernel(const uint8_t* __restrict__ w,
                                                                         int64_t row_bytes, int64_t rows, int64_t K,
                                                                         __nv_bfloat16* __restrict__ out) {
  constexpr int kPieces = pieces_per_block<T>();
  const int64_t P = K / 32;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kPieceThreads + threadIdx.x;
  if (g >= rows * P) return;
  const int64_t r = g / P, p = g % P;
  Piece pc;
  Fmt<T>::template piece<LdGlobal>(w + r * row_bytes + (p / kPieces) * Fmt<T>::kBytes, static_cast<int>(p % kPieces), pc);
  auto* o = reinterpret_cast<uint4*>(out + r * K + p * 32);
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // 8 values per 16-byte store
    uint32_t packed[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int e = 8 * q + 2 * h;
      const __nv_bfloat16 lo = __float2bfloat16_rn(piece_value<T>(pc, e / 4, e % 4));
      const __nv_bfloat16 hi = __float2bfloat16_rn(piece_value<T>(pc, (e + 1) / 4, (e + 1) % 4));
      packed[h] = static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
    }
    o[q] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}

// One CTA per token, one thread per piece of its row.
template <GgmlType T>
__global__ void __launch_bounds__(kPieceThreads) embed_rows_kernel(const uint8_t* __restrict__ w, int64_t row_bytes,
                                                                    int64_t vocab, int64_t K,
                                                                    const int32_t* __restrict__ tokens, float scale,
                                                                    float* __restrict__ out) {
  constexpr int kPieces = pieces_per_block<T>();
  const int64_t P = K / 32;
  const int32_t token = tokens[blockIdx.x];
  float* o = out + static_cast<int64_t>(blockIdx.x) * K;
  for (int64_t p = threadIdx.x; p < P; p += blockDim.x) {
    if (token < 0 || token >= vocab) {
      for (int e = 0; e < 32; ++e) o[p * 32 + e] = __int_as_float(0x7fc00000);
      continue;
    }
    Piece pc;
    Fmt<T>::template piece<LdGlobal>(w + token * row_bytes + (p / kPieces) * Fmt<T>::kBytes, static_cast<int>(p % kPieces), pc);
#pragma unroll
    for (int e = 0; e < 32; ++e) o[p * 32 + e] = __fmul_rn(piece_value<T>(pc, e / 4, e % 4), scale);
  }
}

// ---- host side -----------------------------------------------------------------------------------------------------

cudaStream_t stream_of(const Exec& e) { return static_cast<cudaStream_t>(e.stream); }

// Calls f(std::integral_constant-like tag) for the format: Tag<T>{}. False for a type without an integer form.
template <GgmlType T>
struct Tag {
  static constexpr GgmlType value = T;
};
template <class F>
bool with_type(uint32_t type, F&& f) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kQ8_0: f(Tag<GgmlType::kQ8_0>{}); return true;
    case GgmlType::kQ4_0: f(Tag<GgmlType::kQ4_0>{}); return true;
    case GgmlType::kQ4_1: f(Tag<GgmlType::kQ4_1>{}); return true;
    case GgmlType::kQ5_0: f(Tag<GgmlType::kQ5_0>{}); return true;
    case GgmlType::kQ5_1: f(Tag<GgmlType::kQ5_1>{}); return true;
    case GgmlType::kQ2_K: f(Tag<GgmlType::kQ2_K>{}); return true;
    case GgmlType::kQ4_K: f(Tag<GgmlType::kQ4_K>{}); return true;
    case GgmlType::kQ5_K: f(Tag<GgmlType::kQ5_K>{}); return true;
    case GgmlType::kQ6_K: f(Tag<GgmlType::kQ6_K>{}); return true;
    default: return false;
  }
}

// The block format of `type` with K a multiple of its block size; the row size in bytes.
int64_t checked_row_bytes(const char* op, uint32_t type, int64_t K) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(type);
  check(f != nullptr && f->integer_form, ErrorCode::kUnsupported, op,
        "the weight type must be a GGUF block format with CUDA kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, "
        "Q6_K); got ", f ? f->name : "type id ", f ? "" : std::to_string(type));
  check(K >= 0 && K % f->block_size == 0, ErrorCode::kShapeMismatch, op, "K must be a non-negative multiple of the ",
        f->name, " block size ", f->block_size, "; got ", K);
  return quant::ggml_row_bytes(*f, K);
}

// The alignment the piece loads assume (see "loads" above).
void check_alignment(const char* op, const void* w, uint32_t type) {
  const auto a = reinterpret_cast<uintptr_t>(w);
  const GgmlType t = static_cast<GgmlType>(type);
  const uintptr_t need = (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K) ? 16
                         : (t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1) ? 4 : 2;
  check(a % need == 0, ErrorCode::kInvalidArgument, op, "the weights must be ", need, "-byte aligned for ",
        quant::ggml_block_format(type)->name, "; got address ", a);
}

unsigned grid_of(const char* op, int64_t items, int64_t per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  check(blocks <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "too many blocks for one grid: ", blocks);
  return static_cast<unsigned>(blocks);
}

struct GemvWorkspace {
  int8_t* xq;
  float* dx;
  float2* xs;
};
size_t gemv_workspace_bytes(int64_t M, int64_t K) {
  const size_t mp = static_cast<size_t>(M) * static_cast<size_t>(K / 32);
  return round_up_256(static_cast<size_t>(M * K)) + round_up_256(mp * sizeof(float)) + round_up_256(mp * sizeof(float2));
}
GemvWorkspace gemv_workspace(void* ws, int64_t M, int64_t K) {
  auto* b = static_cast<uint8_t*>(ws);
  const size_t mp = static_cast<size_t>(M) * static_cast<size_t>(K / 32);
  GemvWorkspace g{};
  g.xq = reinterpret_cast<int8_t*>(b);
  b += round_up_256(static_cast<size_t>(M * K));
  g.dx = reinterpret_cast<float*>(b);
  b += round_up_256(mp * sizeof(float));
  g.xs = reinterpret_cast<float2*>(b);
  return g;
}

// The decode kernels: the row kernel (linear_ggml_rows.cu: bulk copies of row segments into shared memory) wherever
// it takes the call (16-byte rows, the activation tile fits shared memory), else the warp-per-row gemv_kernel above.
// $CIDER_GGML_GEMV (or the bench/test knob) chooses: `rows` the row kernel where it takes the call, `warp` the
// warp-per-row kernel everywhere. The default is `warp` until the row kernel has passed its GPU tests (not yet run:
// no device could be started when it was written, 2026-12-05).
constexpr int kGemvAuto = 0, kGemvWarpPerRow = 1, kGemvRowKernel = 2;
int g_gemv_kernel_knob = kGemvAuto;  // ggml_bench::set_ggml_gemv_kernel
int g_last_gemv_kernel = 0;          // ggml_bench::last_ggml_gemv_kernel: the kernel of the latest tile
int requested_gemv_kernel(const char* op) {
  if (g_gemv_kernel_knob != kGemvAuto) return g_gemv_kernel_knob;
  const std::string v = env_word("CIDER_GGML_GEMV", "warp", {"rows", "warp"}, op);
  return v == "rows" ? kGemvRowKernel : kGemvWarpPerRow;
}

template <GgmlType T, int MT>
void launch_gemv(const kernels::GgmlLinearArgs& a, int64_t m0, const GemvWorkspace& g, cudaStream_t s) {
  const int64_t P = a.K / 32;
  gemv_kernel<T, MT><<<grid_of("cuda.ggml_linear", a.N, kGemvWarps), kGemvWarps * 32, 0, s>>>(
      static_cast<const uint8_t*>(a.w), a.row_bytes, a.N, a.K, g.xq + m0 * a.K, g.dx + m0 * P, g.xs + m0 * P, a.bias,
      a.out + m0 * a.N);
}

template <GgmlType T>
void gemv_tile(const kernels::GgmlLinearArgs& a, int64_t m0, int mt, const GemvWorkspace& g, cudaStream_t s) {
  switch (mt) {
    case 1: launch_gemv<T, 1>(a, m0, g, s); break;
    case 2: launch_gemv<T, 2>(a, m0, g, s); break;
    case 3: launch_gemv<T, 3>(a, m0, g, s); break;
    case 4: launch_gemv<T, 4>(a, m0, g, s); break;
    case 5: launch_gemv<T, 5>(a, m0, g, s); break;
    case 6: launch_gemv<T, 6>(a, m0, g, s); break;
    case 7: launch_gemv<T, 7>(a, m0, g, s); break;
    default: launch_gemv<T, 8>(a, m0, g, s); break;
  }
}

}  // namespace

namespace {
// Weight rows decoded per pass of the prefill path: all N when N·K·2 ≤ kDequantBytes, else a multiple of 256.
int64_t dequant_rows(int64_t N, int64_t K) {
  const auto per_row = static_cast<size_t>(K) * 2;
  if (static_cast<size_t>(N) * per_row <= kDequantBytes) return N;
  return std::max<int64_t>(256, static_cast<int64_t>(kDequantBytes / per_row) / 256 * 256);
}
}  // namespace

size_t ggml_linear_workspace_bytes(int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0) return 0;
  if (M <= kGgmlGemvRows) return gemv_workspace_bytes(M, K);
  const int64_t rows = dequant_rows(N, K);
  const size_t staged = rows < N ? round_up_256(static_cast<size_t>(M) * static_cast<size_t>(rows) * sizeof(float)) : 0;
  return round_up_256(static_cast<size_t>(rows) * static_cast<size_t>(K) * 2) + staged + dense_bf16_workspace_bytes(M, K);
}

void ggml_linear(const kernels::GgmlLinearArgs& a, const Exec& exec) {
  constexpr const char* op = "cuda.ggml_linear";
  const int64_t rb = checked_row_bytes(op, a.ggml_type, a.K);
  check(a.row_bytes == rb, ErrorCode::kShapeMismatch, op, "row_bytes must be ", rb, " for K = ", a.K, "; got ",
        a.row_bytes);
  check(a.M >= 0 && a.N >= 0, ErrorCode::kShapeMismatch, op, "M and N must be >= 0; got M = ", a.M, ", N = ", a.N);
  if (a.M == 0 || a.N == 0) return;
  check(a.K > 0, ErrorCode::kShapeMismatch, op, "K must be > 0 when M and N are; got ", a.K);
  check(a.x != nullptr && a.w != nullptr && a.out != nullptr, ErrorCode::kInvalidArgument, op,
        "x, w and out must not be null");
  check_alignment(op, a.w, a.ggml_type);
  const size_t need = ggml_linear_workspace_bytes(a.M, a.N, a.K);
  check(exec.workspace != nullptr && exec.workspace_bytes >= need, ErrorCode::kInvalidArgument, op,
        "the workspace must hold ", need, " bytes for M = ", a.M, ", N = ", a.N, ", K = ", a.K, "; got ",
        exec.workspace_bytes);
  const cudaStream_t s = stream_of(exec);
  if (a.M > kGgmlGemvRows) {
    // Prefill: rows decoded to bf16, then the dense GEMM over them; past kDequantBytes in passes of `rows` weight
    // rows, each pass's [M, rows] outputs staged and copied into their columns of out.
    const int64_t rows = dequant_rows(a.N, a.K);
    auto* ws = static_cast<uint8_t*>(exec.workspace);
    auto* wb = reinterpret_cast<uint16_t*>(ws);
    size_t used = round_up_256(static_cast<size_t>(rows) * static_cast<size_t>(a.K) * 2);
    float* staged = nullptr;
    if (rows < a.N) {
      staged = reinterpret_cast<float*>(ws + used);
      used += round_up_256(static_cast<size_t>(a.M) * static_cast<size_t>(rows) * sizeof(float));
    }
    Exec rest = exec;
    rest.workspace = ws + used;
    rest.workspace_bytes = exec.workspace_bytes - used;
    for (int64_t n0 = 0; n0 < a.N; n0 += rows) {
      const int64_t nr = std::min(rows, a.N - n0);
      ggml_dequantize_bf16(static_cast<const uint8_t*>(a.w) + n0 * a.row_bytes, a.ggml_type, nr, a.K, wb, exec);
      const float* bias = a.bias != nullptr ? a.bias + n0 : nullptr;
      if (staged == nullptr) {
        dense_bf16(a.x, wb, bias, a.out, a.M, nr, a.K, rest);
        continue;
      }
      dense_bf16(a.x, wb, bias, staged, a.M, nr, a.K, rest);
      CIDER_CUDA_CHECK(op, cudaMemcpy2DAsync(a.out + n0, static_cast<size_t>(a.N) * sizeof(float), staged,
                                             static_cast<size_t>(nr) * sizeof(float),
                                             static_cast<size_t>(nr) * sizeof(float), static_cast<size_t>(a.M),
                                             cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  const GemvWorkspace g = gemv_workspace(exec.workspace, a.M, a.K);
  quantize_pieces_kernel<<<grid_of(op, a.M * (a.K / 32), kQuantWarps), kQuantWarps * 32, 0, s>>>(a.x, a.M, a.K, g.xq,
                                                                                                    g.dx, g.xs);
  check_last_launch(op);
  const int asked = requested_gemv_kernel(op);
  with_type(a.ggml_type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    for (int64_t m0 = 0; m0 < a.M;) {
      int rows = static_cast<int>(a.M - m0 < kMaxTileRows ? a.M - m0 : kMaxTileRows);
      const int tile = asked == kGemvWarpPerRow ? 0 : ggml_rows::tile_for(a, rows);
      if (tile > 0) {
        rows = std::min(rows, tile);  // a tile smaller than the rows where shared memory limits it
        ggml_rows::launch(a, m0, rows, tile, g.xq, g.dx, g.xs, s, op);
        g_last_gemv_kernel = kGemvRowKernel;
      } else {
        gemv_tile<T>(a, m0, rows, g, s);
        g_last_gemv_kernel = kGemvWarpPerRow;
      }
      m0 += rows;
    }
  });
  check_last_launch(op);
}

void ggml_dequantize_bf16(const void* w, uint32_t ggml_type, int64_t rows, int64_t K, uint16_t* out,
                          const Exec& exec) {
  constexpr const char* op = "cuda.ggml_dequantize_bf16";
  const int64_t rb = checked_row_bytes(op, ggml_type, K);
  check(rows >= 0, ErrorCode::kShapeMismatch, op, "rows must be >= 0; got ", rows);
  if (rows == 0 || K == 0) return;
  check(w != nullptr && out != nullptr, ErrorCode::kInvalidArgument, op, "w and out must not be null");
  check_alignment(op, w, ggml_type);
  check(reinterpret_cast<uintptr_t>(out) % 16 == 0, ErrorCode::kInvalidArgument, op,
        "out must be 16-byte aligned; got address ", reinterpret_cast<uintptr_t>(out));
  const unsigned grid = grid_of(op, rows * (K / 32), kPieceThreads);
  with_type(ggml_type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    dequantize_bf16_kernel<T><<<grid, kPieceThreads, 0, stream_of(exec)>>>(
        static_cast<const uint8_t*>(w), rb, rows, K, reinterpret_cast<__nv_bfloat16*>(out));
  });
  check_last_launch(op);
}

void ggml_embed_rows(const void* w, uint32_t ggml_type, int64_t vocab, int64_t K, const int32_t* tokens, int64_t n,
                     float scale, float* out, const Exec& exec) {
  constexpr const char* op = "cuda.ggml_embed_rows";
  const int64_t rb = checked_row_bytes(op, ggml_type, K);
  check(vocab >= 1 && vocab <= INT32_MAX, ErrorCode::kInvalidArgument, op, "vocab must be in [1, 2^31); got ", vocab);
  check(K >= 1, ErrorCode::kShapeMismatch, op, "K must be >= 1; got ", K);
  check(n >= 0 && n <= INT32_MAX, ErrorCode::kInvalidArgument, op, "n must be in [0, 2^31); got ", n);
  if (n == 0) return;
  check(w != nullptr && tokens != nullptr && out != nullptr, ErrorCode::kInvalidArgument, op,
        "w, tokens and out must not be null");
  check_alignment(op, w, ggml_type);
  const int64_t P = K / 32;
  const int threads = P >= 128 ? 128 : 32;
  with_type(ggml_type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    embed_rows_kernel<T><<<static_cast<unsigned>(n), threads, 0, stream_of(exec)>>>(
        static_cast<const uint8_t*>(w), rb, vocab, K, tokens, scale, out);
  });
  check_last_launch(op);
}

}  // namespace cider::cuda

namespace cider::cuda::ggml_bench {
// For bench/cuda/bench_gemv.cpp and tests only: the decode kernel of the following ggml_linear calls (0 automatic,
// 1 the warp-per-row kernel, 2 the row kernel where it takes the call), and which one ran the latest tile (1 or 2).
void set_ggml_gemv_kernel(int kernel) {
  check(kernel >= 0 && kernel <= 2, ErrorCode::kInvalidArgument, "cuda.ggml_bench.set_ggml_gemv_kernel",
        "the kernel must be 0 (automatic), 1 (warp per row) or 2 (row kernel); got ", kernel);
  g_gemv_kernel_knob = kernel;
}
int last_ggml_gemv_kernel() { return g_last_gemv_kernel; }
}  // namespace cider::cuda::ggml_bench
