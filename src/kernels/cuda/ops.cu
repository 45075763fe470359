// cider/kernels/cuda/ops.cu — the ops of cuda_ops.h besides the dense linear layer: embedding lookup and the logit
// soft-cap (the fused per-layer kernels are kernels/cuda/model_ops.cu).
//
// All of them are memory-bound: the design goal is one pass over the data with 16-byte loads where the layout allows
// it (pointer 16-byte aligned and the row length a multiple of 4 floats; otherwise a scalar path of the same maths),
// no shared-memory round trips beyond the reductions, and no work that scales with more than the bytes moved.
// Semantics follow model/cpu_backend.cpp (the CPU backend) operation for operation.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace cg = cooperative_groups;

namespace cider::cuda {
namespace {

cudaStream_t stream_of(const Exec& exec) { return static_cast<cudaStream_t>(exec.stream); }

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Elementwise kernels: grid-stride loops over a grid of at most kMaxElementwiseBlocks blocks (132 SMs × 16 resident
// blocks of 256 threads is ~2100; 4096 keeps every SM busy and the tail short).
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxElementwiseBlocks = 4096;
unsigned elementwise_blocks(int64_t items) {
  const int64_t blocks = (items + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxElementwiseBlocks));
}

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// ---- embedding -------------------------------------------------------------------------------------------------------

__device__ __forceinline__ float load_as_float(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_as_float(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load_as_float(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

// One block per token row (grid.x = n): out[row, :] = embed[token, :] · scale, or NaN for a bad token id.
template <typename T>
__global__ void __launch_bounds__(256) embed_rows_kernel(const T* __restrict__ embed, int64_t vocab, int64_t hidden,
                                                         const int32_t* __restrict__ tokens, float scale,
                                                         float* __restrict__ out) {
  const int64_t row = blockIdx.x;
  const int32_t token = tokens[row];
  float* o = out + row * hidden;
  if (token < 0 || token >= vocab) {
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = quiet_nan();
    return;
  }
  const T* e = embed + static_cast<int64_t>(token) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = load_as_float(e, i) * scale;
}

// ---- elementwise -----------------------------------------------------------------------------------------------------

template <bool kVec>
__global__ void __launch_bounds__(kElementwiseThreads) softcap_kernel(float* __restrict__ x, int64_t count, float cap) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVec) {
    auto* x4 = reinterpret_cast<float4*>(x);
    for (int64_t i = first; i < count / 4; i += stride) {
      float4 a = x4[i];
      a.x = cap * tanhf(a.x / cap);
      a.y = cap * tanhf(a.y / cap);
      a.z = cap * tanhf(a.z / cap);
      a.w = cap * tanhf(a.w / cap);
      x4[i] = a;
    }
    done = count / 4 * 4;
  }
  for (int64_t i = done + first; i < count; i += stride) x[i] = cap * tanhf(x[i] / cap);
}

}  // namespace

// ---- launchers -------------------------------------------------------------------------------------------------------

void embed_rows(const void* embed, DType embed_dtype, int64_t vocab, int64_t hidden, const int32_t* tokens, int64_t n,
                float scale, float* out, const Exec& exec) {
  constexpr const char* kOp = "cuda.embed_rows";
  check(embed_dtype == DType::kF32 || embed_dtype == DType::kF16 || embed_dtype == DType::kBF16,
        ErrorCode::kInvalidArgument, kOp, "embed dtype must be f32, f16 or bf16; got ", dtype_name(embed_dtype));
  check(vocab >= 1 && vocab <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "vocab must be in [1, 2^31); got ", vocab);
  check(hidden >= 1, ErrorCode::kInvalidArgument, kOp, "hidden must be >= 1; got ", hidden);
  check(n >= 0 && n <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "n must be in [0, 2^31); got ", n);
  if (n == 0) return;
  check(embed != nullptr && tokens != nullptr && out != nullptr, ErrorCode::kInvalidArgument, kOp,
        "embed, tokens and out must be non-null");
  const dim3 grid(static_cast<unsigned>(n));
  const int threads = hidden >= 256 ? 256 : 128;
  switch (embed_dtype) {
    case DType::kF32:
      embed_rows_kernel<<<grid, threads, 0, stream_of(exec)>>>(static_cast<const float*>(embed), vocab, hidden,
                                                                tokens, scale, out);
      break;
    case DType::kF16:
      embed_rows_kernel<<<grid, threads, 0, stream_of(exec)>>>(static_cast<const __half*>(embed), vocab, hidden,
                                                                tokens, scale, out);
      break;
    default:
      embed_rows_kernel<<<grid, threads, 0, stream_of(exec)>>>(static_cast<const __nv_bfloat16*>(embed), vocab,
                                                                hidden, tokens, scale, out);
      break;
  }
  check_last_launch(kOp);
}

void softcap(float* x, int64_t count, float cap, const Exec& exec) {
  constexpr const char* kOp = "cuda.softcap";
  check(count >= 0, ErrorCode::kInvalidArgument, kOp, "count must be >= 0; got ", count);
  check(cap > 0.0f && cap < INFINITY, ErrorCode::kInvalidArgument, kOp, "cap must be finite and > 0; got ", cap);
  if (count == 0) return;
  check(x != nullptr, ErrorCode::kInvalidArgument, kOp, "x must be non-null");
  const bool vec = aligned16(x);
  const unsigned blocks = elementwise_blocks(vec ? (count + 3) / 4 : count);
  if (vec) softcap_kernel<true><<<blocks, kElementwiseThreads, 0, stream_of(exec)>>>(x, count, cap);
  else softcap_kernel<false><<<blocks, kElementwiseThreads, 0, stream_of(exec)>>>(x, count, cap);
  check_last_launch(kOp);
}

}  // namespace cider::cuda
