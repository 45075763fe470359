// Mixture-of-experts decode rows with device-side routing (kernels/cuda/moe.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/int8_row_quant.cuh"
#include "kernels/cuda/moe.h"

namespace cider::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// ---- routing: one block per row ----
// logits[e] = h·router[e] (a warp per expert, lanes over H, butterfly sum), then thread 0 runs route_experts' rule
// sequentially: softmax with the max subtracted, sum in index order, K passes of "largest not yet chosen" (strict >,
// so ties keep the lower index), renormalised by the kept sum; then the K choices sorted by expert index.
__global__ void moe_route_kernel(const float* __restrict__ h, int64_t H, const float* __restrict__ router, int E,
                                 int K, bool normalize, const float* __restrict__ shared_gate, int32_t* __restrict__ sel,
                                 float* __restrict__ w, float* __restrict__ w_shared) {
  __shared__ float p[kMoeMaxExperts];
  __shared__ float gate_logit;
  const int64_t r = blockIdx.x;
  const float* x = h + r * H;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int e = warp; e < E + (shared_gate ? 1 : 0); e += kWarps) {
    const float* wr = e < E ? router + static_cast<int64_t>(e) * H : shared_gate;
    float acc = 0.0f;
    for (int64_t i = lane; i < H; i += 32) acc = fmaf(x[i], wr[i], acc);
    acc = warp_sum(acc);
    if (lane == 0) {
      if (e < E) p[e] = acc;
      else gate_logit = acc;
    }
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float zmax = p[0];
  for (int e = 1; e < E; ++e) zmax = fmaxf(zmax, p[e]);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) {
    p[e] = expf(p[e] - zmax);
    sum += p[e];
  }
  for (int e = 0; e < E; ++e) p[e] = __fdiv_rn(p[e], sum);
  int32_t ch[kMoeMaxTopK];
  float cw[kMoeMaxTopK];
  float kept = 0.0f;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken = taken || ch[j] == e;
      if (taken) continue;
      if (best < 0 || p[e] > p[best]) best = e;
    }
    ch[k] = best;
    cw[k] = p[best];
    kept += cw[k];
  }
  if (normalize)
    for (int k = 0; k < K; ++k) cw[k] = __fdiv_rn(cw[k], kept);
  for (int k = 1; k < K; ++k)  // insertion sort by expert index
    for (int j = k; j > 0 && ch[j - 1] > ch[j]; --j) {
      const int32_t ti = ch[j];
      ch[j] = ch[j - 1];
      ch[j - 1] = ti;
      const float tw = cw[j];
      cw[j] = cw[j - 1];
      cw[j - 1] = tw;
    }
  for (int k = 0; k < K; ++k) {
    sel[r * K + k] = ch[k];
    w[r * K + k] = cw[k];
  }
  if (shared_gate) w_shared[r] = __fdiv_rn(1.0f, 1.0f + expf(-gate_logit));
}

// ---- activation codes: one block per row ----
__global__ void moe_quantize_kernel(const float* __restrict__ x, int64_t K, int8_t* __restrict__ codes,
                                    float* __restrict__ sx_out) {
  __shared__ float red[kWarps];
  __shared__ int bad[kWarps];
  const int64_t r = blockIdx.x;
  const float* row = x + r * K;
  float amax = 0.0f;
  int nonfinite = 0;
  for (int64_t i = threadIdx.x; i < K; i += blockDim.x) {
    const float v = row[i];
    nonfinite |= !isfinite(v);
    amax = fmaxf(amax, fabsf(v));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, off));
    nonfinite |= __shfl_xor_sync(kFull, nonfinite, off);
  }
  if (threadIdx.x % 32 == 0) {
    red[threadIdx.x / 32] = amax;
    bad[threadIdx.x / 32] = nonfinite;
  }
  __syncthreads();
  amax = 0.0f;
  nonfinite = 0;
  for (int i = 0; i < kWarps; ++i) {
    amax = fmaxf(amax, red[i]);
    nonfinite |= bad[i];
  }
  const float sx = int8_row_quant::row_sx(amax, nonfinite == 0);
  for (int64_t i = threadIdx.x; i < K; i += blockDim.x)
    codes[r * K + i] = nonfinite ? int8_t{0} : static_cast<int8_t>(int8_row_quant::int8_code(row[i], sx));
  if (threadIdx.x == 0) sx_out[r] = sx;
}

// ---- the slots' GEMVs: one warp per output row of one slot ----
// Each lane takes 16-byte chunks of the weight row: 8 bf16, 16 int8 or 32 int4 values, chunk c = it·32 + lane. With
// group weights, a group of G values spans G/V consecutive lanes' chunks (V values per chunk): those lanes first add
// their int32 dots (exact), then the segment's first lane adds sw·acc_g to its float partial.
template <MoeWeightKind kKind>
__global__ void moe_gemv_kernel(MoeGemvArgs a) {
  constexpr int V = kKind == MoeWeightKind::kBF16 ? 8 : kKind == MoeWeightKind::kInt8 ? 16 : 32;
  const int64_t s = blockIdx.y;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= a.N) return;
  const MoeExpertWeights ew = a.table[a.sel[s]];
  const int64_t row = s / a.x_div;
  const int64_t chunks = a.K / V;
  float part = 0.0f;
  if constexpr (kKind == MoeWeightKind::kBF16) {
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(ew.w) + n * a.K);
    const float4* xr = reinterpret_cast<const float4*>(a.x + row * a.K);
    for (int64_t c = lane; c < chunks; c += 32) {
      const uint4 u = __ldg(wr + c);
      const float4 x0 = xr[2 * c], x1 = xr[2 * c + 1];
      const uint32_t q[4] = {u.x, u.y, u.z, u.w};
      const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t b = (j % 2) == 0 ? (q[j / 2] << 16) : (q[j / 2] & 0xffff0000u);
        part = fmaf(xs[j], __uint_as_float(b), part);
      }
    }
    part = warp_sum(part);
    if (lane == 0) a.out[s * a.N + n] = part;
  } else {
    const int64_t row_bytes = kKind == MoeWeightKind::kInt8 ? a.K : a.K / 2;
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(ew.w) + n * row_bytes);
    const int8_t* xq = a.xq + row * a.K;
    const int seg = a.group_size == 0 ? 32 : a.group_size / V;  // lanes per group (per channel: the whole warp)
    int32_t acc_all = 0;
    for (int64_t c0 = 0; c0 < chunks; c0 += 32) {
      const int64_t c = c0 + lane;
      int32_t d = 0;
      if (c < chunks) {
        const uint4 u = __ldg(wr + c);
        const uint32_t q[4] = {u.x, u.y, u.z, u.w};
        if constexpr (kKind == MoeWeightKind::kInt8) {
          const int4 xv = *reinterpret_cast<const int4*>(xq + c * 16);
          d = __dp4a(static_cast<int>(q[0]), xv.x, d);
          d = __dp4a(static_cast<int>(q[1]), xv.y, d);
          d = __dp4a(static_cast<int>(q[2]), xv.z, d);
          d = __dp4a(static_cast<int>(q[3]), xv.w, d);
        } else {
          // 32 nibbles: byte i holds elements 2i (low) and 2i + 1 (high), each q + 8.
          const int4 xa = *reinterpret_cast<const int4*>(xq + c * 32);
          const int4 xb = *reinterpret_cast<const int4*>(xq + c * 32 + 16);
          const int xs[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t b = q[j];  // bytes 4j … 4j + 3: elements 8j … 8j + 7
            uint32_t lo = 0, hi = 0;  // elements 8j … 8j + 3 and 8j + 4 … 8j + 7 as signed bytes
#pragma unroll
            for (int t = 0; t < 2; ++t) {
              const uint32_t by0 = (b >> (16 * t)) & 0xffu, by1 = (b >> (16 * t + 8)) & 0xffu;
              const uint32_t e0 = static_cast<uint8_t>(static_cast<int>(by0 & 0xfu) - 8);
              const uint32_t e1 = static_cast<uint8_t>(static_cast<int>(by0 >> 4) - 8);
              const uint32_t e2 = static_cast<uint8_t>(static_cast<int>(by1 & 0xfu) - 8);
              const uint32_t e3 = static_cast<uint8_t>(static_cast<int>(by1 >> 4) - 8);
              const uint32_t packed = e0 | (e1 << 8) | (e2 << 16) | (e3 << 24);
              if (t == 0) lo = packed;
              else hi = packed;
            }
            d = __dp4a(static_cast<int>(lo), xs[2 * j], d);
            d = __dp4a(static_cast<int>(hi), xs[2 * j + 1], d);
          }
        }
      }
      if (a.group_size == 0) {
        acc_all += d;
      } else {
        for (int off = 1; off < seg; off <<= 1) d += __shfl_xor_sync(kFull, d, off);
        if (lane % seg == 0 && c < chunks) {
          const int64_t g = c * V / a.group_size;
          part = fmaf(ew.scales[g * a.N + n], static_cast<float>(d), part);
        }
      }
    }
    float y;
    if (a.group_size == 0) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc_all += __shfl_xor_sync(kFull, acc_all, off);
      y = a.sx[row] * (ew.scales[n] * static_cast<float>(acc_all));
    } else {
      y = a.sx[row] * warp_sum(part);
    }
    if (lane == 0) a.out[s * a.N + n] = y;
  }
}

__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ w, int64_t n, int K,
                                   int64_t H, const float* __restrict__ ys, const float* __restrict__ w_shared,
                                   float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * H; i += stride) {
    const int64_t r = i / H, d = i % H;
    float t = 0.0f;
    for (int k = 0; k < K; ++k) t = __fadd_rn(t, __fmul_rn(y[(r * K + k) * H + d], w[r * K + k]));
    if (ys) t = __fadd_rn(t, __fmul_rn(ys[i], w_shared[r]));
    out[i] = t;
  }
}

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace

void moe_route(const float* h, int64_t n, int64_t H, const float* router, int64_t E, int64_t K, bool normalize,
               const float* shared_gate, int32_t* sel, float* w, float* w_shared, void* stream) {
  constexpr const char* op = "cuda.moe_route";
  check(n >= 0 && n <= 65535 && H >= 1, ErrorCode::kShapeMismatch, op, "rows must be in [0, 65535] and H >= 1; got ",
        n, ", ", H);
  check(E >= 1 && E <= kMoeMaxExperts && K >= 1 && K <= kMoeMaxTopK && K <= E, ErrorCode::kShapeMismatch, op,
        "experts must be in [1, ", kMoeMaxExperts, "] and experts per token in [1, min(", kMoeMaxTopK,
        ", experts)]; got ", E, " and ", K);
  check(shared_gate == nullptr || w_shared != nullptr, ErrorCode::kInvalidArgument, op,
        "a shared expert's gate needs w_shared");
  if (n == 0) return;
  moe_route_kernel<<<static_cast<unsigned>(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      h, H, router, static_cast<int>(E), static_cast<int>(K), normalize, shared_gate, sel, w, w_shared);
  check_last_launch(op);
}

void moe_quantize_rows(const float* x, int64_t rows, int64_t K, int8_t* codes, float* sx, void* stream) {
  constexpr const char* op = "cuda.moe_quantize_rows";
  check(rows >= 0 && rows <= 65535 && K >= 1, ErrorCode::kShapeMismatch, op,
        "rows must be in [0, 65535] and K >= 1; got ", rows, ", ", K);
  if (rows == 0) return;
  moe_quantize_kernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, K, codes,
                                                                                                       sx);
  check_last_launch(op);
}

void moe_gemv(const MoeGemvArgs& a, void* stream) {
  constexpr const char* op = "cuda.moe_gemv";
  check(a.N >= 1 && a.K >= 32 && a.K % 32 == 0, ErrorCode::kShapeMismatch, op,
        "N >= 1 and K a positive multiple of 32; got N ", a.N, ", K ", a.K);
  check(a.slots >= 0 && a.slots <= 65535 && a.x_div >= 1, ErrorCode::kShapeMismatch, op,
        "slots must be in [0, 65535] and x_div >= 1; got ", a.slots, ", ", a.x_div);
  const bool int_kind = a.kind != MoeWeightKind::kBF16;
  const int V = a.kind == MoeWeightKind::kInt8 ? 16 : 32;
  check(!int_kind || a.group_size == 0 ||
            (a.group_size % V == 0 && a.group_size / V <= 32 && ((a.group_size / V) & (a.group_size / V - 1)) == 0 &&
             a.K % a.group_size == 0),
        ErrorCode::kShapeMismatch, op, "group_size must be 0 or a power-of-two multiple of ", V,
        " values dividing K; got ", a.group_size, " (K ", a.K, ")");
  check(a.table && a.sel && a.out && (int_kind ? (a.xq && a.sx) : a.x != nullptr), ErrorCode::kInvalidArgument, op,
        "table, sel, out and the activations must be set");
  if (a.slots == 0) return;
  const dim3 grid(static_cast<unsigned>((a.N + kWarps - 1) / kWarps), static_cast<unsigned>(a.slots));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (a.kind) {
    case MoeWeightKind::kBF16: moe_gemv_kernel<MoeWeightKind::kBF16><<<grid, kThreads, 0, s>>>(a); break;
    case MoeWeightKind::kInt8: moe_gemv_kernel<MoeWeightKind::kInt8><<<grid, kThreads, 0, s>>>(a); break;
    case MoeWeightKind::kInt4: moe_gemv_kernel<MoeWeightKind::kInt4><<<grid, kThreads, 0, s>>>(a); break;
  }
  check_last_launch(op);
}

void moe_combine(const float* y, const float* w, int64_t n, int64_t K, int64_t H, const float* ys,
                 const float* w_shared, float* out, void* stream) {
  constexpr const char* op = "cuda.moe_combine";
  check(n >= 0 && K >= 1 && K <= kMoeMaxTopK && H >= 1, ErrorCode::kShapeMismatch, op,
        "n >= 0, K in [1, ", kMoeMaxTopK, "], H >= 1; got ", n, ", ", K, ", ", H);
  check(ys == nullptr || w_shared != nullptr, ErrorCode::kInvalidArgument, op, "a shared expert's rows need weights");
  if (n == 0) return;
  moe_combine_kernel<<<grid_for(n * H), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      y, w, n, static_cast<int>(K), H, ys, w_shared, out);
  check_last_launch(op);
}

}  // namespace cider::cuda
