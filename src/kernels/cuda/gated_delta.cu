// The kernels of the hybrid models' layers (kernels/cuda/gated_delta.h): a gated DeltaNet layer's gates, causal conv,
// q/k normalisation, recurrence and gated output norm, and gated attention's sigmoid gate.
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/glu.cuh"

namespace cider::cuda {

namespace {

constexpr int kThreads = 256;               // elementwise kernels and the warp-per-row kernels' blocks
constexpr int kWarps = kThreads / 32;       // rows per block of a warp-per-row kernel
constexpr int64_t kMaxConvKernel = 64;      // ModelConfig's limit on linear_conv_kernel_dim

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride loops cover the rest
}

// Blocks of kWarps warps for `rows` warp-rows (the launchers check rows against the grid limit first).
unsigned warp_grid(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// PyTorch's softplus (beta 1, threshold 20): y itself above 20, else log(1 + eʸ).
__device__ __forceinline__ float softplus(float y) { return y > 20.0f ? y : log1pf(expf(y)); }

// The warp of the grid this thread belongs to, and its lane (blocks are whole warps).
__device__ __forceinline__ int64_t grid_warp() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
}
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// ---- β and g: one warp per (row t, value head h) -------------------------------------------------------------------
// x (n, H); wb, wa (Hv, H); beta, g (n, Hv). Lane ℓ sums the products of elements ℓ + 32i (one FMA chain per dot
// product), then the xor butterfly; lane 0 writes.
__global__ void __launch_bounds__(kThreads) gdn_gates_kernel(const float* __restrict__ x, int64_t n, int64_t H,
                                                             const float* __restrict__ wb,
                                                             const float* __restrict__ wa,
                                                             const float* __restrict__ A_log,
                                                             const float* __restrict__ dt_bias, int64_t Hv,
                                                             float* __restrict__ beta, float* __restrict__ g) {
  const int64_t r = grid_warp();  // = t·Hv + h, the output index
  const int lane = lane_id();
  if (r >= n * Hv) return;  // whole warps leave: the butterfly below has every lane of the warps that stay
  const int64_t t = r / Hv, h = r % Hv;
  const float* xr = x + t * H;
  const float* br = wb + h * H;
  const float* ar = wa + h * H;
  float sb = 0.0f, sa = 0.0f;
  for (int64_t i = lane; i < H; i += 32) {
    const float xi = xr[i];
    sb = __fmaf_rn(xi, br[i], sb);
    sa = __fmaf_rn(xi, ar[i], sa);
  }
  sb = warp_sum(sb);
  sa = warp_sum(sa);
  if (lane == 0) {
    beta[r] = sigmoid(sb);
    g[r] = -expf(A_log[h]) * softplus(sa + dt_bias[h]);
  }
}

// ---- the causal depthwise conv + SiLU ------------------------------------------------------------------------------
// One thread per output (t, c), grid-stride. Window row t + j (j < K) is raw row t + j − (K − 1): a negative one is
// row K − 1 + (t + j − (K − 1)) of the state. The sum runs over j ascending (the reference's order).
__global__ void __launch_bounds__(kThreads) conv1d_silu_kernel(const float* __restrict__ x, int64_t x_stride,
                                                               int64_t n, int64_t C, const float* __restrict__ w,
                                                               int64_t K, const float* __restrict__ state,
                                                               float* __restrict__ out, int64_t out_stride) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n * C; e += stride) {
    const int64_t t = e / C, c = e % C;
    const float* wc = w + c * K;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t raw = t + j - (K - 1);
      const float xv = raw < 0 ? state[(K - 1 + raw) * C + c] : x[raw * x_stride + c];
      acc = __fmaf_rn(wc[j], xv, acc);
    }
    out[t * out_stride + c] = act::silu(acc);
  }
}

// The new window: state row i (i < K − 1) = window row n + i, i.e. raw row n + i − (K − 1), or, while that is negative
// (n < K − 1), old state row n + i. One thread per channel walks i ascending, so each old row it reads (n + i > i) is
// still unwritten. Runs after conv1d_silu_kernel, which reads the old state.
__global__ void __launch_bounds__(kThreads) conv_state_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n,
                                                              int64_t C, int64_t K, float* state) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += stride)
    for (int64_t i = 0; i < K - 1; ++i) {
      const int64_t raw = n + i - (K - 1);
      state[i * C + c] = raw < 0 ? state[(K - 1 + raw) * C + c] : x[raw * x_stride + c];
    }
}

// ---- l2norm of the q and k heads: one warp per (row t, head), heads [0, Hk) q, [Hk, 2·Hk) k --------------------------
// Each lane reads back only the elements it summed, so the row needs no barrier between the sum and the writes.
__global__ void __launch_bounds__(kThreads) l2norm_qk_kernel(float* __restrict__ x, int64_t n, int64_t row_stride,
                                                             int64_t Hk, int64_t Dk, float q_scale) {
  const int64_t r = grid_warp();
  const int lane = lane_id();
  if (r >= n * 2 * Hk) return;
  const int64_t t = r / (2 * Hk), head = r % (2 * Hk);
  float* p = x + t * row_stride + head * Dk;
  float ss = 0.0f;
  for (int64_t i = lane; i < Dk; i += 32) ss = __fmaf_rn(p[i], p[i], ss);
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss + 1e-6f);
  const float scale = head < Hk ? q_scale : 1.0f;
  for (int64_t i = lane; i < Dk; i += 32) p[i] = __fmul_rn(__fmul_rn(p[i], inv), scale);
}

// ---- the gated delta rule: one block per value head h, thread j < Dv owns column j of S ----------------------------
// Shared memory: S [Dk, Dv] (element (i, j) at i·Dv + j: a warp's 32 columns of one row are 32 consecutive words, one
// per bank), then q and k of the current token [Dk] each. A thread touches only its own column of S, so S needs no
// barrier; q and k do (loaded by all threads, read by all).
__device__ __forceinline__ void load_state_column(float* S, const float* __restrict__ Sg, int dk, int dv, int j) {
  for (int i = 0; i < dk; ++i) S[i * dv + j] = Sg[static_cast<int64_t>(i) * dv + j];
}

__device__ __forceinline__ void store_state_column(const float* S, float* __restrict__ Sg, int dk, int dv, int j) {
  for (int i = 0; i < dk; ++i) Sg[static_cast<int64_t>(i) * dv + j] = S[i * dv + j];
}

// One token on column j: S[:, j] ·= decay; δ = (v_j − Σ_i S[i, j]·k_i)·β; S[:, j] += k·δ; returns Σ_i S[i, j]·q_i —
// nn::gated_delta_rule's loops, sums over i ascending.
__device__ __forceinline__ float delta_step(float* S, const float* qs, const float* ks, int dk, int dv, int j,
                                            float decay, float beta, float v) {
  float kv = 0.0f;
  for (int i = 0; i < dk; ++i) {
    const float s = __fmul_rn(S[i * dv + j], decay);
    S[i * dv + j] = s;
    kv = __fmaf_rn(s, ks[i], kv);
  }
  const float delta = __fmul_rn(__fsub_rn(v, kv), beta);
  float o = 0.0f;
  for (int i = 0; i < dk; ++i) {
    const float s = __fmaf_rn(ks[i], delta, S[i * dv + j]);
    S[i * dv + j] = s;
    o = __fmaf_rn(s, qs[i], o);
  }
  return o;
}

__global__ void __launch_bounds__(kGatedDeltaMaxDv) gated_delta_kernel(GatedDeltaArgs a) {
  extern __shared__ float gd_smem[];
  const int dk = static_cast<int>(a.Dk), dv = static_cast<int>(a.Dv);
  float* S = gd_smem;                                  // [Dk, Dv]
  float* qs = gd_smem + static_cast<int64_t>(dk) * dv;  // [Dk]
  float* ks = qs + dk;                                 // [Dk]
  const int64_t h = blockIdx.x, kh = a.v_tiled ? h % a.Hk : h / (a.Hv / a.Hk);
  const int j = static_cast<int>(threadIdx.x);
  const bool owns_column = j < dv;  // the block is rounded up to whole warps
  float* Sg = a.state + h * a.Dk * a.Dv;
  if (owns_column) load_state_column(S, Sg, dk, dv, j);
  for (int64_t t = 0; t < a.n; ++t) {
    __syncthreads();  // every thread is done with the previous token's q and k
    const float* qt = a.q + t * a.row_stride + kh * a.Dk;
    const float* kt = a.k + t * a.row_stride + kh * a.Dk;
    for (int i = j; i < dk; i += static_cast<int>(blockDim.x)) {
      qs[i] = qt[i];
      ks[i] = kt[i];
    }
    __syncthreads();
    if (owns_column) {
      const float decay = expf(a.g[t * a.Hv + h]);
      const float beta = a.beta[t * a.Hv + h];
      const float v = a.v[t * a.row_stride + h * a.Dv + j];
      a.out[t * a.Hv * a.Dv + h * a.Dv + j] = delta_step(S, qs, ks, dk, dv, j, decay, beta, v);
    }
  }
  if (owns_column) store_state_column(S, Sg, dk, dv, j);
}

// ---- RMSNorm(o)·w·silu(z): one warp per (row t, value head h) -------------------------------------------------------
__global__ void __launch_bounds__(kThreads) gated_rms_norm_kernel(float* __restrict__ o, int64_t n, int64_t Hv,
                                                                  int64_t Dv, const float* __restrict__ z,
                                                                  int64_t z_stride, const float* __restrict__ w,
                                                                  float eps) {
  const int64_t r = grid_warp();  // = t·Hv + h: o's rows of Dv are consecutive
  const int lane = lane_id();
  if (r >= n * Hv) return;
  const int64_t t = r / Hv, h = r % Hv;
  float* p = o + r * Dv;
  const float* zp = z + t * z_stride + h * Dv;
  float ss = 0.0f;
  for (int64_t i = lane; i < Dv; i += 32) ss = __fmaf_rn(p[i], p[i], ss);
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(Dv) + eps);
  for (int64_t i = lane; i < Dv; i += 32)
    p[i] = __fmul_rn(__fmul_rn(__fmul_rn(p[i], inv), w[i]), act::silu(zp[i]));
}

// ---- gated attention: x ·= sigmoid(gate) ---------------------------------------------------------------------------
__global__ void __launch_bounds__(kThreads) sigmoid_gate_kernel(float* __restrict__ x, int64_t n, int64_t width,
                                                                const float* __restrict__ gate, int64_t gate_stride) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n * width; e += stride) {
    const int64_t t = e / width, i = e % width;
    x[e] = __fmul_rn(x[e], sigmoid(gate[t * gate_stride + i]));
  }
}

// Warp-per-row kernels: n·rows_per_token warps must fit the grid's x dimension.
void check_warp_rows(int64_t rows, const char* op) {
  check(rows <= int64_t{0x7fffffff} * kWarps, ErrorCode::kOutOfRange, op,
        "rows × heads must fit a grid of 2^31 − 1 blocks of ", kWarps, " warps; got ", rows);
}

}  // namespace

void gdn_gates(const float* x, int64_t n, int64_t H, const float* wb, const float* wa, const float* A_log,
               const float* dt_bias, int64_t Hv, float* beta, float* g, void* stream) {
  constexpr const char* op = "cuda.gdn_gates";
  check(n >= 0 && H >= 1 && Hv >= 1, ErrorCode::kShapeMismatch, op, "n >= 0, H >= 1 and Hv >= 1; got n ", n, ", H ",
        H, ", Hv ", Hv);
  if (n == 0) return;
  check(x && wb && wa && A_log && dt_bias && beta && g, ErrorCode::kInvalidArgument, op,
        "x, the b/a weights, A_log, dt_bias, beta and g must be device pointers, not null");
  check_warp_rows(n * Hv, op);
  gdn_gates_kernel<<<warp_grid(n * Hv), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, H, wb, wa, A_log,
                                                                                         dt_bias, Hv, beta, g);
  check_last_launch(op);
}

void causal_conv1d_silu(const float* x, int64_t x_stride, int64_t n, int64_t C, const float* w, int64_t K,
                        float* state, float* out, int64_t out_stride, void* stream) {
  constexpr const char* op = "cuda.causal_conv1d_silu";
  check(n >= 0 && C >= 1, ErrorCode::kShapeMismatch, op, "n >= 0 and C >= 1; got n ", n, ", C ", C);
  check(K >= 1 && K <= kMaxConvKernel, ErrorCode::kUnsupported, op, "the conv kernel must have 1 to ", kMaxConvKernel,
        " taps; got ", K);
  check(x_stride >= C && out_stride >= C, ErrorCode::kShapeMismatch, op,
        "the row strides must be at least C = ", C, "; got x_stride ", x_stride, ", out_stride ", out_stride);
  if (n == 0) return;
  check(x && w && out && (state || K == 1), ErrorCode::kInvalidArgument, op,
        "x, w, out and (K > 1) the state must be device pointers, not null");
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  conv1d_silu_kernel<<<grid_for(n * C), kThreads, 0, s>>>(x, x_stride, n, C, w, K, state, out, out_stride);
  check_last_launch(op);
  if (K == 1) return;  // no window to keep
  conv_state_kernel<<<grid_for(C), kThreads, 0, s>>>(x, x_stride, n, C, K, state);
  check_last_launch(op);
}

void l2norm_qk(float* x, int64_t n, int64_t row_stride, int64_t Hk, int64_t Dk, float q_scale, void* stream) {
  constexpr const char* op = "cuda.l2norm_qk";
  check(n >= 0 && Hk >= 1 && Dk >= 1 && row_stride >= 2 * Hk * Dk, ErrorCode::kShapeMismatch, op,
        "n >= 0, Hk, Dk >= 1 and a row stride of at least 2·Hk·Dk; got n ", n, ", Hk ", Hk, ", Dk ", Dk,
        ", row_stride ", row_stride);
  if (n == 0) return;
  check(x != nullptr, ErrorCode::kInvalidArgument, op, "x must be a device pointer, not null");
  check_warp_rows(n * 2 * Hk, op);
  l2norm_qk_kernel<<<warp_grid(n * 2 * Hk), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, row_stride, Hk,
                                                                                             Dk, q_scale);
  check_last_launch(op);
}

size_t gated_delta_smem_bytes(int64_t Dk, int64_t Dv) {
  return static_cast<size_t>(Dk * Dv + 2 * Dk) * sizeof(float);
}

void check_gated_delta_shape(int64_t Dk, int64_t Dv, const char* op) {
  check(Dk >= 1 && Dv >= 1 && Dk <= 65536 && Dv <= kGatedDeltaMaxDv, ErrorCode::kUnsupported, op,
        "the CUDA gated delta rule runs one thread per state column: value heads of 1 to ", kGatedDeltaMaxDv,
        " dims, key heads of 1 to 65536; got k_head_dim ", Dk, ", v_head_dim ", Dv);
  const auto limit = static_cast<size_t>(device_info().max_shared_per_block_optin);
  const size_t need = gated_delta_smem_bytes(Dk, Dv);
  check(need <= limit, ErrorCode::kUnsupported, op,
        "the CUDA gated delta rule keeps a value head's float32 state and one token's q and k in shared memory: "
        "(k_head_dim·v_head_dim + 2·k_head_dim)·4 bytes must be at most the device's ", limit,
        " per block; got k_head_dim ", Dk, ", v_head_dim ", Dv, " (", need, " bytes)");
}

void gated_delta_rule(const GatedDeltaArgs& a, void* stream) {
  constexpr const char* op = "cuda.gated_delta_rule";
  check(a.n >= 0 && a.Hk >= 1 && a.Hv >= 1 && a.Hv % a.Hk == 0, ErrorCode::kShapeMismatch, op,
        "n >= 0 and Hv a positive multiple of Hk >= 1 (each key head serves Hv / Hk value heads); got n ", a.n,
        ", Hk ", a.Hk, ", Hv ", a.Hv);
  check_gated_delta_shape(a.Dk, a.Dv, op);
  check(a.row_stride >= a.Hk * a.Dk && a.row_stride >= a.Hv * a.Dv, ErrorCode::kShapeMismatch, op,
        "the row stride must hold Hk·Dk = ", a.Hk * a.Dk, " and Hv·Dv = ", a.Hv * a.Dv, " values; got ",
        a.row_stride);
  check(a.Hv <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "Hv must fit a grid; got ", a.Hv);
  if (a.n == 0) return;
  check(a.q && a.k && a.v && a.g && a.beta && a.state && a.out, ErrorCode::kInvalidArgument, op,
        "q, k, v, g, beta, state and out must be device pointers, not null");
  const size_t smem = gated_delta_smem_bytes(a.Dk, a.Dv);
  allow_dynamic_smem(reinterpret_cast<const void*>(&gated_delta_kernel), smem, op);
  const auto threads = static_cast<unsigned>((a.Dv + 31) / 32 * 32);
  gated_delta_kernel<<<static_cast<unsigned>(a.Hv), threads, smem, static_cast<cudaStream_t>(stream)>>>(a);
  check_last_launch(op);
}

void gated_rms_norm(float* o, int64_t n, int64_t Hv, int64_t Dv, const float* z, int64_t z_stride, const float* w,
                    float eps, void* stream) {
  constexpr const char* op = "cuda.gated_rms_norm";
  check(n >= 0 && Hv >= 1 && Dv >= 1 && z_stride >= Hv * Dv, ErrorCode::kShapeMismatch, op,
        "n >= 0, Hv, Dv >= 1 and a z row stride of at least Hv·Dv; got n ", n, ", Hv ", Hv, ", Dv ", Dv,
        ", z_stride ", z_stride);
  if (n == 0) return;
  check(o && z && w, ErrorCode::kInvalidArgument, op, "o, z and w must be device pointers, not null");
  check_warp_rows(n * Hv, op);
  gated_rms_norm_kernel<<<warp_grid(n * Hv), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(o, n, Hv, Dv, z,
                                                                                              z_stride, w, eps);
  check_last_launch(op);
}

void sigmoid_gate_rows(float* x, int64_t n, int64_t width, const float* gate, int64_t gate_stride, void* stream) {
  constexpr const char* op = "cuda.sigmoid_gate_rows";
  check(n >= 0 && width >= 1 && gate_stride >= width, ErrorCode::kShapeMismatch, op,
        "n >= 0, width >= 1 and a gate row stride of at least the width; got n ", n, ", width ", width,
        ", gate_stride ", gate_stride);
  if (n == 0) return;
  check(x && gate, ErrorCode::kInvalidArgument, op, "x and gate must be device pointers, not null");
  sigmoid_gate_kernel<<<grid_for(n * width), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, width, gate,
                                                                                              gate_stride);
  check_last_launch(op);
}

}  // namespace cider::cuda
