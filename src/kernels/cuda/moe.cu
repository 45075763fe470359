// Mixture-of-experts decode rows with device-side routing (kernels/cuda/moe.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/linear_gemv_rows.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/pdl.cuh"
#include "quant/int4.h"
#include "quant/int8.h"

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
  cuda::pdl::wait();  // h comes from the residual norm
  cuda::pdl::launch_dependents();
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

// ---- bf16 experts' GEMVs: one warp per output row of one slot ----
// Each lane takes 16-byte chunks of the weight row (8 bf16 values), chunk c = it·32 + lane; butterfly sum.
__global__ void moe_gemv_bf16_kernel(MoeGemvArgs a) {
  const int64_t s = blockIdx.y;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= a.N) return;
  const MoeExpertWeights ew = a.table[a.sel[s]];
  const int64_t row = s / a.x_div;
  const int64_t chunks = a.K / 8;
  float part = 0.0f;
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
}

__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ w, int64_t n, int K,
                                   int64_t H, const float* __restrict__ ys, const float* __restrict__ w_shared,
                                   float* __restrict__ out) {
  cuda::pdl::wait();  // y from the down GEMV (w and w_shared from moe_route, ys from the shared expert)
  cuda::pdl::launch_dependents();
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
  CIDER_CUDA_CHECK(op, pdl::launch(moe_route_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0,
                                   static_cast<cudaStream_t>(stream), h, H, router, static_cast<int>(E),
                                   static_cast<int>(K), normalize, shared_gate, sel, w, w_shared));
  check_last_launch(op);
}

bool moe_gemv_supports(MoeWeightKind kind, int64_t K, int group_size) {
  if (K < 32 || K % 32 != 0) return false;
  switch (kind) {
    case MoeWeightKind::kBF16: return group_size == 0;
    case MoeWeightKind::kInt8: return quant::is_int8_group_size(group_size) && (group_size == 0 || K % group_size == 0);
    case MoeWeightKind::kInt4: return quant::is_int4_group_size(group_size) && (group_size == 0 || K % group_size == 0);
  }
  return false;
}

void moe_gemv(const MoeGemvArgs& a, void* stream) {
  constexpr const char* op = "cuda.moe_gemv";
  check(a.N >= 1 && a.N <= (int64_t{1} << 30) && moe_gemv_supports(a.kind, a.K, a.group_size) &&
            a.K <= gemv_rows::kMaxK,
        ErrorCode::kShapeMismatch, op, "N in [1, 2^30], K a multiple of 32 in [32, ", gemv_rows::kMaxK,
        "], group size 0 (bf16, int8, int4), 64/128/256 (int8) or 32/64/128/256 (int4) dividing K; got N ", a.N,
        ", K ", a.K, ", group size ", a.group_size, ", kind ", static_cast<int>(a.kind));
  check(a.slots >= 0 && a.slots <= 65535 && a.x_div >= 1, ErrorCode::kShapeMismatch, op,
        "slots must be in [0, 65535] and x_div >= 1; got ", a.slots, ", ", a.x_div);
  check(a.table && a.sel && a.out && a.x, ErrorCode::kInvalidArgument, op,
        "table, sel, out and the activations x must be set");
  if (a.slots == 0) return;
  if (a.kind != MoeWeightKind::kBF16) {
    gemv_rows::launch_experts(a.table, a.sel, a.slots, a.x_div, a.kind == MoeWeightKind::kInt4, a.group_size, a.N,
                              a.K, a.x, a.out, stream, op);
    return;
  }
  const dim3 grid(static_cast<unsigned>((a.N + kWarps - 1) / kWarps), static_cast<unsigned>(a.slots));
  moe_gemv_bf16_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  check_last_launch(op);
}

void moe_combine(const float* y, const float* w, int64_t n, int64_t K, int64_t H, const float* ys,
                 const float* w_shared, float* out, void* stream) {
  constexpr const char* op = "cuda.moe_combine";
  check(n >= 0 && K >= 1 && K <= kMoeMaxTopK && H >= 1, ErrorCode::kShapeMismatch, op,
        "n >= 0, K in [1, ", kMoeMaxTopK, "], H >= 1; got ", n, ", ", K, ", ", H);
  check(ys == nullptr || w_shared != nullptr, ErrorCode::kInvalidArgument, op, "a shared expert's rows need weights");
  if (n == 0) return;
  CIDER_CUDA_CHECK(op, pdl::launch(moe_combine_kernel, dim3(grid_for(n * H)), dim3(kThreads), 0,
                                   static_cast<cudaStream_t>(stream), y, w, n, static_cast<int>(K), H, ys, w_shared,
                                   out));
  check_last_launch(op);
}

}  // namespace cider::cuda
