// The small fused kernels of the CUDA backend (kernels/cuda/model_ops.h).
#include <cuda_bf16.h>
#include <cmath>
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/glu.cuh"
#include "kernels/cuda/hadamard.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/so4_rotation.cuh"
#include "kernels/cuda/model_ops.h"

namespace cider::cuda {

namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}


// ---- per-head preparation (q/k norm + rope + rotation) and the way back --------------------------------------------

constexpr int kHeadWarps = 4;            // rows (one per warp) per CTA
constexpr int64_t kMaxHeadDim = 2048;    // a row of float32 per warp in shared memory: ≤ 32 KB per CTA

// SO(4) rotation (rotation 1 fast, 2 full) of a row in shared memory, by one warp, forward (qL·v[·conj(qR)]) or
// inverse (conj(qL)·w[·qR]): the 4-d blocks are independent, one lane per block.
__device__ void warp_so4(float* row, int64_t D, int rotation, const float* __restrict__ qL,
                         const float* __restrict__ qR, bool inverse, int lane) {
  __syncwarp();
  for (int64_t blk = lane; blk < D / 4; blk += 32) {
    float* v = row + blk * 4;
    float x[4] = {v[0], v[1], v[2], v[3]};
    cuda::so4::rotate_block(x, qL + blk * 4, qR ? qR + blk * 4 : nullptr, rotation, inverse);
    for (int k = 0; k < 4; ++k) v[k] = x[k];
  }
  __syncwarp();
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// cos/sin of row (t, ·) of a head: table row pos0 + t (or *d_pos + t, or d_pos[t·d_pos_stride]), or null when that
// position is outside the table.
__device__ __forceinline__ const float* rope_row(const HeadPrepArgs& a, int64_t t) {
  const int64_t pos = a.d_pos == nullptr      ? a.pos0 + t
                      : a.d_pos_stride > 0 ? static_cast<int64_t>(a.d_pos[t * a.d_pos_stride])
                                           : static_cast<int64_t>(*a.d_pos) + t;
  return pos >= 0 && pos < a.rope_positions ? a.rope_table + pos * a.D : nullptr;
}

// The generic kernel (any even D ≤ kMaxHeadDim): one warp per (token t, head) row, staged in shared memory; heads
// ordered q [0, Hq), k [Hq, Hq + Hkv), v (rotation 3 only) after them.
__global__ void __launch_bounds__(kHeadWarps * 32) prepare_heads_kernel(HeadPrepArgs a, int64_t heads_used) {
  extern __shared__ float head_rows[];  // [kHeadWarps, D]
  cuda::pdl::wait();  // qkv is the previous kernel's output
  cuda::pdl::launch_dependents();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kHeadWarps + warp;
  if (r >= a.n * heads_used) return;  // whole warps leave; only warp-level barriers below
  const int64_t D = a.D, t = r / heads_used, head = r % heads_used;
  const int64_t row_stride = (a.Hq + a.gate_heads + 2 * a.Hkv) * D;
  // q, k, v heads are consecutive within a token's row, except for gated attention's gate heads between q and k
  float* g = a.qkv + t * row_stride + (head < a.Hq ? head : head + a.gate_heads) * D;
  float* row = head_rows + static_cast<int64_t>(warp) * D;
  for (int64_t i = lane; i < D; i += 32) row[i] = g[i];
  __syncwarp();
  const bool is_q = head < a.Hq, is_k = !is_q && head < a.Hq + a.Hkv;
  if (is_q || is_k) {
    const float* nw = is_q ? a.q_norm : a.k_norm;
    if (nw != nullptr) {  // rms_norm over the head (ops.cu's arithmetic: (x·inv)·(offset + w))
      float ss = 0.0f;
      for (int64_t i = lane; i < D; i += 32) ss = __fmaf_rn(row[i], row[i], ss);
      ss = warp_sum(ss);
      const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + a.eps);
      for (int64_t i = lane; i < D; i += 32) row[i] = __fmul_rn(__fmul_rn(row[i], inv), a.norm_offset + nw[i]);
      __syncwarp();
    }
    // rope (products and sums rounded separately, as the CPU forward)
    const int64_t half = D / 2;
    const float* cs = rope_row(a, t);
    for (int64_t i = lane; i < half; i += 32) {
      const float c = cs != nullptr ? cs[i] : __int_as_float(0x7fffffff);
      const float s = cs != nullptr ? cs[half + i] : __int_as_float(0x7fffffff);
      const float x1 = row[i], x2 = row[i + half];
      row[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
      row[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    }
    __syncwarp();
  }
  if (a.rotation == 3 && (a.rotate_qk || !(is_q || is_k))) {
    cuda::warp_hadamard(row, a.qL, D, false, lane);
  } else if (a.rotation != 0 && is_q && a.rotate_qk) {
    warp_so4(row, D, a.rotation, a.qL, a.qR, false, lane);
  }
  __syncwarp();
  if (is_q) {
    float* q = a.q_out + (a.q_head_major ? (head * a.n + t) * D : (t * a.Hq + head) * D);
    for (int64_t i = lane; i < D; i += 32) q[i] = row[i];
  } else {
    for (int64_t i = lane; i < D; i += 32) g[i] = row[i];
  }
}

__global__ void __launch_bounds__(kHeadWarps * 32) finish_heads_kernel(const float* __restrict__ in, bool head_major,
                                                                        int64_t n, int64_t Hq, int64_t D, int rotation,
                                                                        const float* __restrict__ qL,
                                                                        const float* __restrict__ qR,
                                                                        float* __restrict__ out) {
  extern __shared__ float head_rows[];  // [kHeadWarps, D]
  cuda::pdl::wait();  // in is attention's output
  cuda::pdl::launch_dependents();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kHeadWarps + warp;  // (t, h) in token-major order
  if (r >= n * Hq) return;
  const int64_t t = r / Hq, h = r % Hq;
  const float* src = in + (head_major ? (h * n + t) * D : r * D);
  float* row = head_rows + static_cast<int64_t>(warp) * D;
  for (int64_t i = lane; i < D; i += 32) row[i] = src[i];
  if (rotation == 3) {
    cuda::warp_hadamard(row, qL, D, true, lane);
  } else if (rotation != 0) {
    warp_so4(row, D, rotation, qL, qR, true, lane);
  }
  __syncwarp();
  for (int64_t i = lane; i < D; i += 32) out[r * D + i] = row[i];
}

// ---- the register kernels of the head dims 64, 128, 256 (D = 32·V) --------------------------------------------------
//
// Lane ℓ of the row's warp holds the elements ℓ + 32k, k < V, in v[k] (not 4 consecutive ones as float4 loads would
// give: this layout keeps every result bit-identical to the shared-memory kernels above at no cost in traffic, since a
// warp's access for each k is 128 contiguous bytes, one fully used line):
//   * the RMS sum is each lane's FMA chain over k (the generic kernel's strided loop) then the same xor butterfly;
//   * a rotary pair (i, i + D/2) is (v[k], v[k + V/2]) of the same lane;
//   * the Hadamard butterfly of stage h pairs element i with i ^ h: for h < 32 that is lane ℓ ^ h at the same k (a
//     shuffle), for h = 32m it is k ^ m in the same lane; the stages run in warp_fwht's order h = 1, 2, …, D/2 with
//     the same adds and subtracts, so the FWHT gives the same bits with no shared memory and no __syncwarp;
//   * only the SO(4) rotation (4 consecutive elements per block, i.e. 4 lanes) goes through shared memory.

template <int V>
__device__ __forceinline__ void load_row(const float* __restrict__ src, float (&v)[V], int lane) {
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = src[lane + 32 * k];
}

template <int V>
__device__ __forceinline__ void store_row(float* __restrict__ dst, const float (&v)[V], int lane) {
#pragma unroll
  for (int k = 0; k < V; ++k) dst[lane + 32 * k] = v[k];
}

// The unnormalized FWHT of the whole row (Hadamard block P = D = 32·V), warp_fwht's stages and arithmetic: pair
// (j, j + h) becomes (a + b, a − b) with a = element j (the lower one), b = element j + h.
template <int V>
__device__ __forceinline__ void fwht_regs(float (&v)[V], int lane) {
#pragma unroll
  for (int h = 1; h < 32; h *= 2) {
    const bool upper = (lane & h) != 0;  // this lane holds b of every pair of the stage
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float other = __shfl_xor_sync(0xffffffffu, v[k], h);
      v[k] = upper ? __fsub_rn(other, v[k]) : __fadd_rn(v[k], other);
    }
  }
#pragma unroll
  for (int m = 1; m < V; m *= 2) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      if ((k & m) == 0) {
        const float lo = v[k], hi = v[k + m];
        v[k] = __fadd_rn(lo, hi);
        v[k + m] = __fsub_rn(lo, hi);
      }
    }
  }
}

// x[i] ← x[i]·(s[i]·c): warp_sign_scale's arithmetic.
template <int V>
__device__ __forceinline__ void sign_scale_regs(float (&v)[V], const float* __restrict__ signs, int lane) {
  const float c = cuda::hadamard_scale(32 * V);
#pragma unroll
  for (int k = 0; k < V; ++k) v[k] = __fmul_rn(v[k], __fmul_rn(signs[lane + 32 * k], c));
}

// SO(4) of a register row through this warp's shared-memory row (warp_so4 syncs the warp on entry and exit).
template <int V>
__device__ __forceinline__ void so4_regs(float (&v)[V], float* row, int rotation, const float* qL, const float* qR,
                                         bool inverse, int lane) {
  store_row<V>(row, v, lane);
  warp_so4(row, 32 * V, rotation, qL, qR, inverse, lane);
  load_row<V>(row, v, lane);
}

template <int V>
__global__ void __launch_bounds__(kHeadWarps * 32) prepare_heads_regs_kernel(HeadPrepArgs a, int64_t heads_used) {
  static_assert(V % 2 == 0, "rotary pairs must fall in one lane: D/2 a multiple of 32");
  constexpr int D = 32 * V, kHalf = V / 2;
  __shared__ float so4_rows[kHeadWarps][D];  // rotation 1/2 of q rows only
  cuda::pdl::wait();  // qkv is the previous kernel's output
  cuda::pdl::launch_dependents();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kHeadWarps + warp;
  if (r >= a.n * heads_used) return;  // whole warps leave; only warp-level sync below
  const int64_t t = r / heads_used, head = r % heads_used;
  float* g = a.qkv + t * (a.Hq + a.gate_heads + 2 * a.Hkv) * D + (head < a.Hq ? head : head + a.gate_heads) * D;
  const bool is_q = head < a.Hq, is_k = !is_q && head < a.Hq + a.Hkv;
  float v[V];
  load_row<V>(g, v, lane);
  if (is_q || is_k) {
    const float* nw = is_q ? a.q_norm : a.k_norm;
    const float* cs = rope_row(a, t);
    float c[kHalf], s[kHalf];
#pragma unroll
    for (int k = 0; k < kHalf; ++k) {  // issued before the norm's arithmetic: independent of it
      c[k] = cs != nullptr ? cs[lane + 32 * k] : __int_as_float(0x7fffffff);
      s[k] = cs != nullptr ? cs[D / 2 + lane + 32 * k] : __int_as_float(0x7fffffff);
    }
    if (nw != nullptr) {
      float w[V];
      load_row<V>(nw, w, lane);
      float ss = 0.0f;
#pragma unroll
      for (int k = 0; k < V; ++k) ss = __fmaf_rn(v[k], v[k], ss);
      ss = warp_sum(ss);
      const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + a.eps);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = __fmul_rn(__fmul_rn(v[k], inv), a.norm_offset + w[k]);
    }
#pragma unroll
    for (int k = 0; k < kHalf; ++k) {
      const float x1 = v[k], x2 = v[k + kHalf];
      v[k] = __fsub_rn(__fmul_rn(x1, c[k]), __fmul_rn(x2, s[k]));
      v[k + kHalf] = __fadd_rn(__fmul_rn(x2, c[k]), __fmul_rn(x1, s[k]));
    }
  }
  if (a.rotation == 3 && (a.rotate_qk || !(is_q || is_k))) {
    sign_scale_regs<V>(v, a.qL, lane);
    fwht_regs<V>(v, lane);
  } else if (a.rotation != 0 && is_q && a.rotate_qk) {
    so4_regs<V>(v, so4_rows[warp], a.rotation, a.qL, a.qR, false, lane);
  }
  if (is_q) {
    store_row<V>(a.q_out + (a.q_head_major ? (head * a.n + t) * D : (t * a.Hq + head) * D), v, lane);
  } else {
    store_row<V>(g, v, lane);
  }
}

template <int V>
__global__ void __launch_bounds__(kHeadWarps * 32) finish_heads_regs_kernel(const float* __restrict__ in,
                                                                             bool head_major, int64_t n, int64_t Hq,
                                                                             int rotation,
                                                                             const float* __restrict__ qL,
                                                                             const float* __restrict__ qR,
                                                                             float* __restrict__ out) {
  constexpr int D = 32 * V;
  __shared__ float so4_rows[kHeadWarps][D];  // rotation 1/2 only
  cuda::pdl::wait();  // in is attention's output
  cuda::pdl::launch_dependents();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kHeadWarps + warp;  // (t, h) in token-major order
  if (r >= n * Hq) return;
  const int64_t t = r / Hq, h = r % Hq;
  float v[V];
  load_row<V>(in + (head_major ? (h * n + t) * D : r * D), v, lane);
  if (rotation == 3) {  // the inverse: FWHT, then signs and scale (warp_hadamard's order)
    fwht_regs<V>(v, lane);
    sign_scale_regs<V>(v, qL, lane);
  } else if (rotation != 0) {
    so4_regs<V>(v, so4_rows[warp], rotation, qL, qR, true, lane);
  }
  store_row<V>(out + r * D, v, lane);
}

// ---- residual add + RMSNorm ----------------------------------------------------------------------------------------

constexpr int kResidualThreads = 512;

// Sum over the block (fixed order: deterministic); every thread gets the total. `scratch` [32] shared.
__device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  __syncthreads();  // the previous use of scratch is complete
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) total += scratch[w];
  return total;
}

// The generic kernel (any H), one CTA per row. Every element is read back only by the thread that wrote it (same
// index loop), so x and h need no barrier besides the reductions'.
__global__ void __launch_bounds__(kResidualThreads) residual_norm_kernel(float* __restrict__ x,
                                                                          const float* __restrict__ t,
                                                                          const float* __restrict__ post_w,
                                                                          const float* __restrict__ w, float offset,
                                                                          int64_t H, float eps,
                                                                          float* __restrict__ h) {
  __shared__ float scratch[32];
  cuda::pdl::wait();  // x and t come from earlier kernels
  cuda::pdl::launch_dependents();
  const int64_t row = blockIdx.x;
  float* xr = x + row * H;
  float* hr = h + row * H;
  if (t != nullptr) {
    const float* tr = t + row * H;
    float inv_t = 1.0f;
    if (post_w != nullptr) {
      float ss = 0.0f;
      for (int64_t i = threadIdx.x; i < H; i += blockDim.x) ss = __fmaf_rn(tr[i], tr[i], ss);
      ss = block_sum(ss, scratch);
      inv_t = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
    }
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float add = post_w != nullptr ? __fmul_rn(__fmul_rn(tr[i], inv_t), offset + post_w[i]) : tr[i];
      xr[i] = __fadd_rn(xr[i], add);
    }
  }
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) ss = __fmaf_rn(xr[i], xr[i], ss);
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) hr[i] = __fmul_rn(__fmul_rn(xr[i], inv), offset + w[i]);
}

// The register kernel, H ≤ kResidualThreads·E: thread j owns elements j + 512·e (e < E) — the generic kernel's index
// loop, so every per-thread FMA chain, block_sum and output has the same bits — and loads x, t, post_w and w for all
// of them at once (independent loads, one round trip instead of four dependent passes over the row).
template <int E>
__global__ void __launch_bounds__(kResidualThreads) residual_norm_regs_kernel(float* __restrict__ x,
                                                                               const float* __restrict__ t,
                                                                               const float* __restrict__ post_w,
                                                                               const float* __restrict__ w,
                                                                               float offset, int64_t H, float eps,
                                                                               float* __restrict__ h) {
  __shared__ float scratch[32];
  cuda::pdl::wait();  // x and t come from earlier kernels
  cuda::pdl::launch_dependents();
  const int64_t row = blockIdx.x;
  const int j = static_cast<int>(threadIdx.x);
  float* xr = x + row * H;
  float* hr = h + row * H;
  const float* tr = t != nullptr ? t + row * H : nullptr;
  float xv[E], tv[E], pv[E], wv[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t i = j + static_cast<int64_t>(kResidualThreads) * e;
    const bool in = i < H;
    xv[e] = in ? xr[i] : 0.0f;
    tv[e] = in && tr != nullptr ? tr[i] : 0.0f;
    pv[e] = in && tr != nullptr && post_w != nullptr ? post_w[i] : 0.0f;
    wv[e] = in ? w[i] : 0.0f;
  }
  if (tr != nullptr) {
    float inv_t = 1.0f;
    if (post_w != nullptr) {
      float ss = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (j + static_cast<int64_t>(kResidualThreads) * e < H) ss = __fmaf_rn(tv[e], tv[e], ss);
      ss = block_sum(ss, scratch);
      inv_t = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int64_t i = j + static_cast<int64_t>(kResidualThreads) * e;
      const float add = post_w != nullptr ? __fmul_rn(__fmul_rn(tv[e], inv_t), offset + pv[e]) : tv[e];
      xv[e] = __fadd_rn(xv[e], add);
      if (i < H) xr[i] = xv[e];
    }
  }
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (j + static_cast<int64_t>(kResidualThreads) * e < H) ss = __fmaf_rn(xv[e], xv[e], ss);
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(H) + eps);
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int64_t i = j + static_cast<int64_t>(kResidualThreads) * e;
    if (i < H) hr[i] = __fmul_rn(__fmul_rn(xv[e], inv), offset + wv[e]);
  }
}

// ---- GLU over the fused gate|up rows -------------------------------------------------------------------------------

__device__ __forceinline__ float glu_one(float g, float u, int act) { return act::glu(g, u, act); }

// One CTA per row of qkv: the whole-row norms, then the clamps (qkv_norm_clip_rows). Each element is rewritten by
// the thread that read it, so the norms need no barrier besides the reductions'.
__global__ void __launch_bounds__(kResidualThreads)
    qkv_norm_clip_kernel(float* __restrict__ qkv, int64_t stride, int64_t q_len, int64_t k_col, int64_t k_len,
                         int64_t v_len, const float* __restrict__ q_norm, const float* __restrict__ k_norm, float offset,
                         float eps, float clip) {
  __shared__ float scratch[32];
  cuda::pdl::wait();  // qkv comes from the projection
  cuda::pdl::launch_dependents();
  float* row = qkv + static_cast<int64_t>(blockIdx.x) * stride;
  auto norm = [&](float* seg, int64_t len, const float* w) {
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) ss = __fmaf_rn(seg[i], seg[i], ss);
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(len) + eps);
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) seg[i] = __fmul_rn(__fmul_rn(seg[i], inv), offset + w[i]);
  };
  if (q_norm != nullptr) norm(row, q_len, q_norm);
  if (k_norm != nullptr) norm(row + k_col, k_len, k_norm);
  if (clip > 0.0f) {
    for (int64_t i = threadIdx.x; i < q_len; i += blockDim.x) row[i] = fminf(fmaxf(row[i], -clip), clip);
    for (int64_t i = threadIdx.x; i < k_len + v_len; i += blockDim.x)
      row[k_col + i] = fminf(fmaxf(row[k_col + i], -clip), clip);
  }
}

// kVec: I % 4 == 0 (rows of float4; the buffers are 256-byte aligned), else scalar. Grid-stride over n·I(/4).
template <bool kVec>
__global__ void glu_rows_kernel(const float* __restrict__ gu, int64_t n, int64_t I, int act, float* __restrict__ out) {
  cuda::pdl::wait();  // gu is the gate|up projection's output
  cuda::pdl::launch_dependents();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (kVec) {
    const int64_t I4 = I / 4;
    const auto* g4 = reinterpret_cast<const float4*>(gu);
    auto* o4 = reinterpret_cast<float4*>(out);
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n * I4; k += stride) {
      const int64_t t = k / I4, i = k % I4;
      const float4 g = g4[t * 2 * I4 + i], u = g4[t * 2 * I4 + I4 + i];
      o4[k] = make_float4(glu_one(g.x, u.x, act), glu_one(g.y, u.y, act), glu_one(g.z, u.z, act),
                          glu_one(g.w, u.w, act));
    }
  } else {
    for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n * I; k += stride) {
      const int64_t t = k / I, i = k % I;
      out[k] = glu_one(gu[t * 2 * I + i], gu[t * 2 * I + I + i], act);
    }
  }
}

__global__ void gather_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ idx, int64_t m,
                                   int64_t H, float* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < m * H; k += stride) {
    const int64_t i = k / H, d = k % H;
    dst[k] = src[static_cast<int64_t>(idx[i]) * H + d];
  }
}

__global__ void scatter_add_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ idx,
                                        const float* __restrict__ w, int64_t m, int64_t H, float* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < m * H; k += stride) {
    const int64_t i = k / H, d = k % H;
    float* o = dst + static_cast<int64_t>(idx[i]) * H + d;
    *o = __fadd_rn(*o, __fmul_rn(src[k], w[i]));  // the CPU's dst += src·w, unfused
  }
}

// SplitMix64 finalizer of (seed, index): independent 64-bit values per element, reproducible from the seed.
__device__ uint64_t hash64(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_kernel(void* out, bool bf16, int64_t count, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(hash64(seed, static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    const float v = lo + (hi - lo) * u;
    if (bf16) {
      static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(out)[i] = v;
    }
  }
}

__global__ void fill_bytes_kernel(uint8_t* out, int64_t count, uint64_t seed, bool as_int8) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = hash64(seed, static_cast<uint64_t>(i));
    out[i] = as_int8 ? static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(r % 255u) - 127))
                     : static_cast<uint8_t>(r >> 56);
  }
}

}  // namespace


void prepare_heads(const HeadPrepArgs& a, void* stream) {
  constexpr const char* op = "cuda.prepare_heads";
  check(a.n >= 0 && a.Hq >= 1 && a.Hkv >= 1, ErrorCode::kShapeMismatch, op, "n >= 0, Hq, Hkv >= 1; got ", a.n, ", ",
        a.Hq, ", ", a.Hkv);
  check(a.D >= 2 && a.D % 2 == 0 && a.D <= kMaxHeadDim, ErrorCode::kShapeMismatch, op,
        "head_dim must be even and in [2, ", kMaxHeadDim, "]; got ", a.D);
  check(a.rotation >= 0 && a.rotation <= 3, ErrorCode::kInvalidArgument, op, "rotation must be 0..3; got ",
        a.rotation);
  check(a.rotation == 0 || a.qL != nullptr, ErrorCode::kInvalidArgument, op, "rotation ", a.rotation, " needs qL");
  check(a.rotation != 2 || a.qR != nullptr, ErrorCode::kInvalidArgument, op, "rotation 2 needs qR");
  check(a.rotation != 1 && a.rotation != 2 ? true : a.D % 4 == 0, ErrorCode::kShapeMismatch, op,
        "an SO(4) rotation needs head_dim % 4 == 0; got ", a.D);
  check(a.gate_heads == 0 || a.gate_heads == a.Hq, ErrorCode::kShapeMismatch, op,
        "gate_heads must be 0 or Hq (one gate per query head); got ", a.gate_heads, " with Hq ", a.Hq);
  check(a.rope_table != nullptr && a.rope_positions >= 1, ErrorCode::kInvalidArgument, op,
        "a rope table of at least one position is needed; got ", a.rope_positions, " positions");
  check(a.d_pos != nullptr || (a.pos0 >= 0 && a.pos0 + a.n <= a.rope_positions), ErrorCode::kOutOfRange, op,
        "positions [pos0, pos0 + n) must lie in the rope table [0, ", a.rope_positions, "); got pos0 ", a.pos0,
        ", n ", a.n);
  if (a.n == 0) return;
  const int64_t heads_used = a.Hq + a.Hkv + (a.rotation == 3 ? a.Hkv : 0);
  const int64_t blocks = (a.n * heads_used + kHeadWarps - 1) / kHeadWarps;
  check(blocks <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "n·heads must fit a grid; got ", a.n * heads_used);
  const dim3 grid(static_cast<unsigned>(blocks)), block(kHeadWarps * 32);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (a.D) {
    case 64: CIDER_CUDA_CHECK(op, cuda::pdl::launch(prepare_heads_regs_kernel<2>, grid, block, 0, s, a, heads_used)); break;
    case 128: CIDER_CUDA_CHECK(op, cuda::pdl::launch(prepare_heads_regs_kernel<4>, grid, block, 0, s, a, heads_used)); break;
    case 256: CIDER_CUDA_CHECK(op, cuda::pdl::launch(prepare_heads_regs_kernel<8>, grid, block, 0, s, a, heads_used)); break;
    default: {
      const size_t smem = static_cast<size_t>(kHeadWarps * a.D) * sizeof(float);
      CIDER_CUDA_CHECK(op, cuda::pdl::launch(prepare_heads_kernel, grid, block, smem, s, a, heads_used));
    }
  }
  cuda::check_last_launch(op);
}

void finish_heads(const float* in, bool in_head_major, int64_t n, int64_t Hq, int64_t D, int rotation,
                  const float* qL, const float* qR, float* out, void* stream) {
  constexpr const char* op = "cuda.finish_heads";
  check(n >= 0 && Hq >= 1 && D >= 1 && D <= kMaxHeadDim, ErrorCode::kShapeMismatch, op,
        "n >= 0, Hq >= 1, head_dim in [1, ", kMaxHeadDim, "]; got ", n, ", ", Hq, ", ", D);
  check(rotation >= 0 && rotation <= 3, ErrorCode::kInvalidArgument, op, "rotation must be 0..3; got ", rotation);
  check(rotation == 0 || qL != nullptr, ErrorCode::kInvalidArgument, op, "rotation ", rotation, " needs qL");
  check(rotation != 2 || qR != nullptr, ErrorCode::kInvalidArgument, op, "rotation 2 needs qR");
  check(rotation != 1 && rotation != 2 ? true : D % 4 == 0, ErrorCode::kShapeMismatch, op,
        "an SO(4) rotation needs head_dim % 4 == 0; got ", D);
  if (n == 0) return;
  const int64_t blocks = (n * Hq + kHeadWarps - 1) / kHeadWarps;
  check(blocks <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "n·Hq must fit a grid; got ", n * Hq);
  const dim3 grid(static_cast<unsigned>(blocks)), block(kHeadWarps * 32);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (D) {
    case 64:
      CIDER_CUDA_CHECK(op, cuda::pdl::launch(finish_heads_regs_kernel<2>, grid, block, 0, s, in, in_head_major, n, Hq,
                                             rotation, qL, qR, out));
      break;
    case 128:
      CIDER_CUDA_CHECK(op, cuda::pdl::launch(finish_heads_regs_kernel<4>, grid, block, 0, s, in, in_head_major, n, Hq,
                                             rotation, qL, qR, out));
      break;
    case 256:
      CIDER_CUDA_CHECK(op, cuda::pdl::launch(finish_heads_regs_kernel<8>, grid, block, 0, s, in, in_head_major, n, Hq,
                                             rotation, qL, qR, out));
      break;
    default: {
      const size_t smem = static_cast<size_t>(kHeadWarps * D) * sizeof(float);
      CIDER_CUDA_CHECK(op, cuda::pdl::launch(finish_heads_kernel, grid, block, smem, s, in, in_head_major, n, Hq, D,
                                             rotation, qL, qR, out));
    }
  }
  cuda::check_last_launch(op);
}

void residual_norm(float* x, const float* t, const float* post_w, const float* w, float offset, int64_t rows,
                   int64_t H, float eps, float* h, void* stream) {
  constexpr const char* op = "cuda.residual_norm";
  check(rows >= 0 && H >= 1, ErrorCode::kShapeMismatch, op, "rows >= 0, H >= 1; got ", rows, ", ", H);
  check(rows <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "rows must fit a grid; got ", rows);
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows)), block(kResidualThreads);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  auto run = [&](auto kernel) {
    CIDER_CUDA_CHECK(op, cuda::pdl::launch(kernel, grid, block, 0, s, x, t, post_w, w, offset, H, eps, h));
  };
  // Elements per thread: the smallest power of two covering H (decode's H = 4096: 8 per thread).
  if (H <= kResidualThreads) run(residual_norm_regs_kernel<1>);
  else if (H <= 2 * kResidualThreads) run(residual_norm_regs_kernel<2>);
  else if (H <= 4 * kResidualThreads) run(residual_norm_regs_kernel<4>);
  else if (H <= 8 * kResidualThreads) run(residual_norm_regs_kernel<8>);
  else if (H <= 16 * kResidualThreads) run(residual_norm_regs_kernel<16>);
  else run(residual_norm_kernel);
  cuda::check_last_launch(op);
}

void gather_rows(const float* src, const int32_t* idx, int64_t m, int64_t H, float* dst, void* stream) {
  constexpr const char* op = "cuda.gather_rows";
  check(m >= 0 && H >= 1, ErrorCode::kShapeMismatch, op, "m >= 0, H >= 1; got ", m, ", ", H);
  if (m == 0) return;
  gather_rows_kernel<<<grid_for(m * H), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, idx, m, H, dst);
  cuda::check_last_launch(op);
}

void scatter_add_rows(const float* src, const int32_t* idx, const float* w, int64_t m, int64_t H, float* dst,
                      void* stream) {
  constexpr const char* op = "cuda.scatter_add_rows";
  check(m >= 0 && H >= 1, ErrorCode::kShapeMismatch, op, "m >= 0, H >= 1; got ", m, ", ", H);
  if (m == 0) return;
  scatter_add_rows_kernel<<<grid_for(m * H), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, idx, w, m, H,
                                                                                               dst);
  cuda::check_last_launch(op);
}

void qkv_norm_clip_rows(float* qkv, int64_t n, int64_t stride, int64_t q_len, int64_t k_col, int64_t k_len,
                        int64_t v_len, const float* q_norm, const float* k_norm, float offset, float eps, float clip,
                        void* stream) {
  constexpr const char* op = "cuda.qkv_norm_clip_rows";
  check(n >= 0 && n <= 65535 * 1024 && q_len >= 1 && k_len >= 1 && v_len >= 0 && k_col >= q_len &&
            k_col + k_len + v_len <= stride,
        ErrorCode::kShapeMismatch, op, "rows must hold q [0, q_len), then k [k_col, k_col + k_len) and v after it "
        "within the stride; got n ", n, ", stride ", stride, ", q_len ", q_len, ", k_col ", k_col, ", k_len ", k_len,
        ", v_len ", v_len);
  check(std::isfinite(clip) && clip >= 0.0f && std::isfinite(eps) && eps > 0.0f, ErrorCode::kInvalidArgument, op,
        "clip must be finite and >= 0 and eps finite and > 0; got ", clip, ", ", eps);
  if (n == 0) return;
  CIDER_CUDA_CHECK(op, cuda::pdl::launch(qkv_norm_clip_kernel, dim3(static_cast<unsigned>(n)), dim3(kResidualThreads),
                                        0, static_cast<cudaStream_t>(stream), qkv, stride, q_len, k_col, k_len, v_len,
                                        q_norm, k_norm, offset, eps, clip));
  cuda::check_last_launch(op);
}

void glu_rows(const float* gu, int64_t n, int64_t I, int act, float* out, void* stream) {
  constexpr const char* op = "cuda.glu_rows";
  check(n >= 0 && I >= 1, ErrorCode::kShapeMismatch, op, "n >= 0, I >= 1; got ", n, ", ", I);
  check(act == 0 || act == 1, ErrorCode::kInvalidArgument, op, "act must be 0 (SiLU) or 1 (GELU tanh); got ", act);
  if (n == 0) return;
  const bool vec = I % 4 == 0 && (reinterpret_cast<uintptr_t>(gu) & 15u) == 0 &&
                   (reinterpret_cast<uintptr_t>(out) & 15u) == 0;
  const int64_t items = vec ? n * I / 4 : n * I;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 grid(grid_for(items)), block(kThreads);
  if (vec) CIDER_CUDA_CHECK(op, cuda::pdl::launch(glu_rows_kernel<true>, grid, block, 0, s, gu, n, I, act, out));
  else CIDER_CUDA_CHECK(op, cuda::pdl::launch(glu_rows_kernel<false>, grid, block, 0, s, gu, n, I, act, out));
  cuda::check_last_launch(op);
}

void fill_uniform(void* out, DType dtype, int64_t count, uint64_t seed, float lo, float hi, void* stream) {
  constexpr const char* op = "cuda.fill_uniform";
  check(dtype == DType::kF32 || dtype == DType::kBF16, ErrorCode::kInvalidArgument, op,
        "dtype must be f32 or bf16; got ", dtype_name(dtype));
  if (count <= 0) return;
  fill_uniform_kernel<<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      out, dtype == DType::kBF16, count, seed, lo, hi);
  cuda::check_last_launch(op);
}

void fill_random_bytes(void* out, int64_t count, uint64_t seed, bool as_int8, void* stream) {
  constexpr const char* op = "cuda.fill_random_bytes";
  if (count <= 0) return;
  fill_bytes_kernel<<<grid_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint8_t*>(out), count, seed, as_int8);
  cuda::check_last_launch(op);
}

}  // namespace cider::cuda
