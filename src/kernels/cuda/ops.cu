// cider/kernels/cuda/ops.cu — the transformer ops of cuda_ops.h besides the linear layers and attention: embedding
// lookup, RMSNorm, rotary embedding, GLU gates, residual add, logit soft-cap and greedy argmax.
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
#include "kernels/cuda/glu.cuh"
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

// ---- RMSNorm ---------------------------------------------------------------------------------------------------------

constexpr int kNormThreads = 256;

// Sum over the kGroup threads that share one row: a warp (shuffles) or the whole block (shuffles + shared memory).
// Every thread of the group gets the same value (fixed summation order: deterministic).
template <int kGroup>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if constexpr (kGroup == 32) {
    return v;
  } else {
    static_assert(kGroup == kNormThreads, "a row is reduced by a warp or by the whole block");
    __shared__ float warp_sums[kGroup / 32];
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kGroup / 32; ++w) total += warp_sums[w];
    return total;
  }
}

// kGroup threads per row (32: a warp per row, 8 rows per block, for head_dim-sized rows; 256: a block per row for
// hidden-sized rows). Pass 1 sums squares; pass 2 re-reads x (L1/L2-hot) and writes out. out may equal x: every read
// of pass 1 is complete before the group_sum barrier (__syncthreads or the warp shuffle), and in pass 2 each element
// is read and written by the same thread.
template <int kGroup, bool kVec>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const float* x, const float* __restrict__ w,
                                                                 float offset, int64_t rows, int64_t dim, float eps,
                                                                 float* out) {
  constexpr int kRowsPerBlock = kNormThreads / kGroup;
  const int lane = static_cast<int>(threadIdx.x) % kGroup;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + static_cast<int64_t>(threadIdx.x) / kGroup;
  if (row >= rows) return;  // the whole group leaves together (a group is one warp, or the whole block when rows fit)
  const float* xr = x + row * dim;
  float* orow = out + row * dim;
  float ss = 0.0f;
  if constexpr (kVec) {
    const auto* x4 = reinterpret_cast<const float4*>(xr);
    for (int64_t i = lane; i < dim / 4; i += kGroup) {
      const float4 v = x4[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = lane; i < dim; i += kGroup) ss += xr[i] * xr[i];
  }
  ss = group_sum<kGroup>(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
  if constexpr (kVec) {
    const auto* x4 = reinterpret_cast<const float4*>(xr);
    const auto* w4 = reinterpret_cast<const float4*>(w);
    auto* o4 = reinterpret_cast<float4*>(orow);
    for (int64_t i = lane; i < dim / 4; i += kGroup) {
      const float4 v = x4[i];
      const float4 g = w4[i];
      o4[i] = make_float4((v.x * inv) * (offset + g.x), (v.y * inv) * (offset + g.y), (v.z * inv) * (offset + g.z),
                          (v.w * inv) * (offset + g.w));
    }
  } else {
    for (int64_t i = lane; i < dim; i += kGroup) orow[i] = (xr[i] * inv) * (offset + w[i]);
  }
}

// ---- rotary embedding ------------------------------------------------------------------------------------------------

constexpr int kRopeThreads = 256;
constexpr int64_t kMaxRopeHeadDim = 8192;  // the cos/sin table of one row lives in shared memory (head_dim · 4 bytes)

// One block per token row t of x [n, heads, head_dim]. The cos/sin of position·inv_freq[i] are computed once per row
// (not once per head) into shared memory, as the CPU does: the float32 angle, then cos/sin in double rounded once.
// The rotation's products and sums are rounded separately (__fmul_rn/__fadd_rn: no FMA contraction), exactly the
// CPU's arithmetic.
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(float* __restrict__ x, int64_t heads, int64_t head_dim,
                                                            const float* __restrict__ inv_freq, int64_t pos0,
                                                            const int32_t* __restrict__ d_pos) {
  extern __shared__ float rope_table[];  // cos [half], then sin [half]
  const int64_t half = head_dim / 2;
  const int64_t t = blockIdx.x;
  const int64_t start = d_pos != nullptr ? static_cast<int64_t>(*d_pos) : pos0;
  const float position = static_cast<float>(start + t);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = position * inv_freq[i];
    double s = 0.0, c = 0.0;
    sincos(static_cast<double>(angle), &s, &c);
    rope_table[i] = static_cast<float>(c);
    rope_table[half + i] = static_cast<float>(s);
  }
  __syncthreads();
  float* row = x + t * heads * head_dim;
  for (int64_t p = threadIdx.x; p < heads * half; p += blockDim.x) {
    const int64_t h = p / half, i = p - h * half;
    float* v = row + h * head_dim;
    const float x1 = v[i], x2 = v[i + half];
    const float c = rope_table[i], s = rope_table[half + i];
    v[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    v[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
}

// ---- elementwise -----------------------------------------------------------------------------------------------------

template <GluActivation kAct>
__device__ __forceinline__ float glu_one(float g, float u) {
  if constexpr (kAct == GluActivation::kSiLU) return act::silu(g) * u;
  else return act::gelu_tanh(g) * u;
}

// kVec: count/4 float4s from 16-byte-aligned pointers, then the count%4 tail; else scalar. out may alias gate or up
// (each element is read before it is written, by the same thread).
template <GluActivation kAct, bool kVec>
__global__ void __launch_bounds__(kElementwiseThreads) glu_kernel(const float* gate, const float* up, int64_t count,
                                                                  float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVec) {
    const auto* g4 = reinterpret_cast<const float4*>(gate);
    const auto* u4 = reinterpret_cast<const float4*>(up);
    auto* o4 = reinterpret_cast<float4*>(out);
    for (int64_t i = first; i < count / 4; i += stride) {
      const float4 g = g4[i], u = u4[i];
      o4[i] = make_float4(glu_one<kAct>(g.x, u.x), glu_one<kAct>(g.y, u.y), glu_one<kAct>(g.z, u.z),
                          glu_one<kAct>(g.w, u.w));
    }
    done = count / 4 * 4;
  }
  for (int64_t i = done + first; i < count; i += stride) out[i] = glu_one<kAct>(gate[i], up[i]);
}

template <bool kVec>
__global__ void __launch_bounds__(kElementwiseThreads) add_inplace_kernel(float* x, const float* y, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVec) {
    auto* x4 = reinterpret_cast<float4*>(x);
    const auto* y4 = reinterpret_cast<const float4*>(y);
    for (int64_t i = first; i < count / 4; i += stride) {
      float4 a = x4[i];
      const float4 b = y4[i];
      a.x += b.x;
      a.y += b.y;
      a.z += b.z;
      a.w += b.w;
      x4[i] = a;
    }
    done = count / 4 * 4;
  }
  for (int64_t i = done + first; i < count; i += stride) x[i] += y[i];
}

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

// ---- argmax ----------------------------------------------------------------------------------------------------------
// One thread-block cluster of kArgmaxCluster blocks per row: each block scans a contiguous chunk of the row with
// 16-byte loads (4 in flight per thread), reduces (value, index) pairs in the block, and block 0 of the cluster merges
// the kArgmaxCluster partial results through distributed shared memory. No workspace, no second launch, and a
// 128k-vocab row is read by 8 SMs at once instead of one.
constexpr int kArgmaxCluster = 8;
constexpr int kArgmaxThreads = 512;
constexpr int kArgmaxUnroll = 4;
constexpr int32_t kNoIndex = INT32_MAX;  // "no candidate yet": loses to every non-NaN value

// (v, i) beats (best_v, best_i): larger value, or equal value and lower index. A NaN v never beats anything (both
// comparisons are false), and the running best is never NaN, so NaN never wins.
__device__ __forceinline__ bool beats(float v, int32_t i, float best_v, int32_t best_i) {
  return v > best_v || (v == best_v && i < best_i);
}
__device__ __forceinline__ void consider(float v, int32_t i, float& best_v, int32_t& best_i) {
  if (beats(v, i, best_v, best_i)) {
    best_v = v;
    best_i = i;
  }
}

template <bool kVec>
__global__ void __cluster_dims__(kArgmaxCluster, 1, 1) __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const float* __restrict__ logits, int64_t rows, int64_t vocab, int32_t* __restrict__ out) {
  __shared__ float warp_v[kArgmaxThreads / 32];
  __shared__ int32_t warp_i[kArgmaxThreads / 32];
  __shared__ float block_v;
  __shared__ int32_t block_i;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  // Chunks are whole float4s: begin is a multiple of 4, so a 16-byte-aligned row stays aligned.
  const int64_t chunk = (vocab + kArgmaxCluster * 4 - 1) / (kArgmaxCluster * 4) * 4;
  const int64_t begin = std::min<int64_t>(vocab, rank * chunk);
  const int64_t end = std::min<int64_t>(vocab, begin + chunk);
  // gridDim.y may be smaller than rows (65535 limit): every block of a cluster has the same blockIdx.y, so the loop
  // and the cluster barriers inside it are uniform over the cluster.
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const float* x = logits + row * vocab;
    float best_v = -INFINITY;
    int32_t best_i = kNoIndex;
    if constexpr (kVec) {
      const auto* x4 = reinterpret_cast<const float4*>(x + begin);
      const int64_t n4 = (end - begin) / 4;  // vocab % 4 == 0 on this path, so end - begin is too
      for (int64_t j0 = threadIdx.x; j0 < n4; j0 += kArgmaxUnroll * kArgmaxThreads) {
        float4 v[kArgmaxUnroll];
#pragma unroll
        for (int u = 0; u < kArgmaxUnroll; ++u) {
          const int64_t j = j0 + u * kArgmaxThreads;
          v[u] = j < n4 ? x4[j] : make_float4(quiet_nan(), quiet_nan(), quiet_nan(), quiet_nan());
        }
#pragma unroll
        for (int u = 0; u < kArgmaxUnroll; ++u) {
          const auto base = static_cast<int32_t>(begin + 4 * (j0 + u * kArgmaxThreads));
          consider(v[u].x, base, best_v, best_i);  // NaN padding past n4 never wins
          consider(v[u].y, base + 1, best_v, best_i);
          consider(v[u].z, base + 2, best_v, best_i);
          consider(v[u].w, base + 3, best_v, best_i);
        }
      }
    } else {
      for (int64_t j = begin + threadIdx.x; j < end; j += kArgmaxThreads)
        consider(x[j], static_cast<int32_t>(j), best_v, best_i);
    }
    // The order of merging does not matter: beats() is a total order on the candidates (value, then index).
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float other_v = __shfl_xor_sync(0xffffffffu, best_v, off);
      const int32_t other_i = __shfl_xor_sync(0xffffffffu, best_i, off);
      consider(other_v, other_i, best_v, best_i);
    }
    if (threadIdx.x % 32 == 0) {
      warp_v[threadIdx.x / 32] = best_v;
      warp_i[threadIdx.x / 32] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kArgmaxThreads / 32; ++w) consider(warp_v[w], warp_i[w], best_v, best_i);
      block_v = best_v;
      block_i = best_i;
    }
    cluster.sync();  // every block's (block_v, block_i) is written and visible cluster-wide
    if (rank == 0 && threadIdx.x == 0) {
      for (int r = 1; r < kArgmaxCluster; ++r)
        consider(*cluster.map_shared_rank(&block_v, r), *cluster.map_shared_rank(&block_i, r), best_v, best_i);
      out[row] = best_i == kNoIndex ? 0 : best_i;  // an all-NaN row: index 0, as the CPU's scan would give
    }
    cluster.sync();  // no block overwrites (next row) or releases (exit) its shared memory before block 0 read it
  }
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

void rms_norm(const float* x, const float* w, float offset, int64_t rows, int64_t dim, float eps, float* out,
              const Exec& exec) {
  constexpr const char* kOp = "cuda.rms_norm";
  check(rows >= 0, ErrorCode::kInvalidArgument, kOp, "rows must be >= 0; got ", rows);
  check(dim >= 1, ErrorCode::kInvalidArgument, kOp, "dim must be >= 1; got ", dim);
  check(eps >= 0.0f, ErrorCode::kInvalidArgument, kOp, "eps must be >= 0; got ", eps);
  if (rows == 0) return;
  check(x != nullptr && w != nullptr && out != nullptr, ErrorCode::kInvalidArgument, kOp,
        "x, w and out must be non-null");
  const bool vec = dim % 4 == 0 && aligned16(x) && aligned16(w) && aligned16(out);
  cudaStream_t s = stream_of(exec);
  if (dim <= 1024) {  // a warp per row: head_dim-sized rows (q/k norms) and small hidden sizes
    constexpr int kRowsPerBlock = kNormThreads / 32;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    check(blocks <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "too many rows; got ", rows);
    const dim3 grid(static_cast<unsigned>(blocks));
    if (vec) rms_norm_kernel<32, true><<<grid, kNormThreads, 0, s>>>(x, w, offset, rows, dim, eps, out);
    else rms_norm_kernel<32, false><<<grid, kNormThreads, 0, s>>>(x, w, offset, rows, dim, eps, out);
  } else {  // a block per row
    check(rows <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "too many rows; got ", rows);
    const dim3 grid(static_cast<unsigned>(rows));
    if (vec) rms_norm_kernel<kNormThreads, true><<<grid, kNormThreads, 0, s>>>(x, w, offset, rows, dim, eps, out);
    else rms_norm_kernel<kNormThreads, false><<<grid, kNormThreads, 0, s>>>(x, w, offset, rows, dim, eps, out);
  }
  check_last_launch(kOp);
}

void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const float* inv_freq, int64_t pos0,
          const int32_t* d_pos, const Exec& exec) {
  constexpr const char* kOp = "cuda.rope";
  check(n >= 0 && n <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "n must be in [0, 2^31); got ", n);
  check(heads >= 1, ErrorCode::kInvalidArgument, kOp, "heads must be >= 1; got ", heads);
  check(head_dim >= 2 && head_dim % 2 == 0 && head_dim <= kMaxRopeHeadDim, ErrorCode::kInvalidArgument, kOp,
        "head_dim must be even and in [2, ", kMaxRopeHeadDim, "]; got ", head_dim);
  check(d_pos != nullptr || pos0 >= 0, ErrorCode::kInvalidArgument, kOp, "pos0 must be >= 0; got ", pos0);
  if (n == 0) return;
  check(x != nullptr && inv_freq != nullptr, ErrorCode::kInvalidArgument, kOp, "x and inv_freq must be non-null");
  const size_t table_bytes = static_cast<size_t>(head_dim) * sizeof(float);
  rope_kernel<<<dim3(static_cast<unsigned>(n)), kRopeThreads, table_bytes, stream_of(exec)>>>(x, heads, head_dim,
                                                                                               inv_freq, pos0, d_pos);
  check_last_launch(kOp);
}

void glu(const float* gate, const float* up, int64_t count, GluActivation act, float* out, const Exec& exec) {
  constexpr const char* kOp = "cuda.glu";
  check(act == GluActivation::kSiLU || act == GluActivation::kGeluTanh, ErrorCode::kInvalidArgument, kOp,
        "activation must be kSiLU or kGeluTanh; got ", static_cast<int>(act));
  check(count >= 0, ErrorCode::kInvalidArgument, kOp, "count must be >= 0; got ", count);
  if (count == 0) return;
  check(gate != nullptr && up != nullptr && out != nullptr, ErrorCode::kInvalidArgument, kOp,
        "gate, up and out must be non-null");
  const bool vec = aligned16(gate) && aligned16(up) && aligned16(out);
  const unsigned blocks = elementwise_blocks(vec ? (count + 3) / 4 : count);
  cudaStream_t s = stream_of(exec);
  if (act == GluActivation::kSiLU) {
    if (vec) glu_kernel<GluActivation::kSiLU, true><<<blocks, kElementwiseThreads, 0, s>>>(gate, up, count, out);
    else glu_kernel<GluActivation::kSiLU, false><<<blocks, kElementwiseThreads, 0, s>>>(gate, up, count, out);
  } else {
    if (vec) glu_kernel<GluActivation::kGeluTanh, true><<<blocks, kElementwiseThreads, 0, s>>>(gate, up, count, out);
    else glu_kernel<GluActivation::kGeluTanh, false><<<blocks, kElementwiseThreads, 0, s>>>(gate, up, count, out);
  }
  check_last_launch(kOp);
}

void add_inplace(float* x, const float* y, int64_t count, const Exec& exec) {
  constexpr const char* kOp = "cuda.add_inplace";
  check(count >= 0, ErrorCode::kInvalidArgument, kOp, "count must be >= 0; got ", count);
  if (count == 0) return;
  check(x != nullptr && y != nullptr, ErrorCode::kInvalidArgument, kOp, "x and y must be non-null");
  const bool vec = aligned16(x) && aligned16(y);
  const unsigned blocks = elementwise_blocks(vec ? (count + 3) / 4 : count);
  if (vec) add_inplace_kernel<true><<<blocks, kElementwiseThreads, 0, stream_of(exec)>>>(x, y, count);
  else add_inplace_kernel<false><<<blocks, kElementwiseThreads, 0, stream_of(exec)>>>(x, y, count);
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

void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, const Exec& exec) {
  constexpr const char* kOp = "cuda.argmax_rows";
  check(rows >= 0, ErrorCode::kInvalidArgument, kOp, "rows must be >= 0; got ", rows);
  check(vocab >= 1 && vocab <= (int64_t{1} << 30), ErrorCode::kInvalidArgument, kOp,
        "vocab must be in [1, 2^30]; got ", vocab);
  if (rows == 0) return;
  check(logits != nullptr && out != nullptr, ErrorCode::kInvalidArgument, kOp, "logits and out must be non-null");
  const dim3 grid(kArgmaxCluster, static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  if (vocab % 4 == 0 && aligned16(logits))
    argmax_rows_kernel<true><<<grid, kArgmaxThreads, 0, stream_of(exec)>>>(logits, rows, vocab, out);
  else
    argmax_rows_kernel<false><<<grid, kArgmaxThreads, 0, stream_of(exec)>>>(logits, rows, vocab, out);
  check_last_launch(kOp);
}

}  // namespace cider::cuda
