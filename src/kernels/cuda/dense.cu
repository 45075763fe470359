// cider/kernels/cuda/dense.cu — the dense bf16 linear layer through cuBLASLt (cuda_ops.h: dense_bf16).
//
//   out[M, N] (f32) = bf16(x)[M, K] · w[N, K]ᵀ (bf16) (+ bias[N]), CUBLAS_COMPUTE_32F.
//
// cuBLASLt is column-major; our row-major matrices are the transposes of column-major ones, so we ask it for
//   outᵀ [N, M] = op(A) · B,  A = w as a column-major K×N matrix (ld K) with op = T, B = bf16(x)ᵀ as K×M (ld K),
//   C = D = outᵀ as N×M (ld N)
// — the "TN" layout, the best-supported one for bf16 tensor-core kernels. The bias is added by the BIAS epilogue
// (a vector over D's rows = output channels) when the bias pointer is 16-byte aligned, else by a tiny kernel after.
//
// x → bf16 is a separate bandwidth-bound kernel writing into exec.workspace, rounding to nearest even exactly as
// core/dtype.h's f32_to_bf16 (so the CPU can reproduce the rounded inputs bit for bit).
//
// dense_bf16_split keeps the activations float32-faithful: x = hi + lo + r with hi = bf16(x), lo = bf16(x − hi),
// |r| ≤ 2⁻⁸·|x − hi| ≤ 2⁻¹⁶·|x| (bf16 keeps 8 significant bits); the rows of hi then lo are one GEMM of 2·rows rows (the weights are read once) into
// a float32 scratch in the workspace, and a small kernel adds the two halves (and the bias) into out. Rows run in
// pieces that fit the workspace.
//
// Host state: one cuBLASLt handle (created once, thread-safe) and a cache of Plans keyed by (M, N, K, bias epilogue,
// alignment classes of w and out): descriptors + the heuristic's first algorithm. Building a Plan is host work only
// (no allocation, no stream work), but it is refused inside a CUDA-graph capture so that nothing unexpected happens
// there: dense_bf16_prepare() or a first call outside the capture builds it.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace cider::cuda {
namespace {

constexpr const char* kOp = "cuda.dense_bf16";
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

size_t round_up_256(size_t v) { return (v + 255) / 256 * 256; }

// The largest power of two ≤ 16 dividing the address (16 = "16-byte aligned or better").
uint32_t alignment_class(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t c = 16;
  while (c > 1 && (a % c) != 0) c /= 2;
  return c;
}

void lt_check(cublasStatus_t st, const char* what) {
  check(st == CUBLAS_STATUS_SUCCESS, ErrorCode::kInternal, kOp, what, " failed: cublasStatus ", static_cast<int>(st));
}

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t handle = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { lt_check(cublasLtCreate(&handle), "cublasLtCreate"); });
  return handle;  // never destroyed: it lives as long as the process (no teardown-order hazards at exit)
}

struct PlanKey {
  int64_t M, N, K;
  bool bias_epilogue;
  uint32_t align_w, align_out;
  bool operator<(const PlanKey& o) const {
    return std::tie(M, N, K, bias_epilogue, align_w, align_out) <
           std::tie(o.M, o.N, o.K, o.bias_epilogue, o.align_w, o.align_out);
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t algo_workspace = 0;
  std::mutex bias_mutex;  // the bias pointer is a descriptor attribute: set + enqueue under this lock
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (cd) cublasLtMatrixLayoutDestroy(cd);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

std::unique_ptr<Plan> build_plan(const PlanKey& k) {
  cublasLtHandle_t handle = lt_handle();
  auto p = std::make_unique<Plan>();
  lt_check(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a), "TRANSA");
  lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b), "TRANSB");
  if (k.bias_epilogue) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = CUDA_R_32F;
    // The heuristic reads the bias pointer's value for its alignment: a stand-in with exactly the 16-byte alignment
    // every call on this plan guarantees (never dereferenced; each call sets its own pointer).
    const void* bias_stand_in = reinterpret_cast<const void*>(uintptr_t{16});
    lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue),
             "EPILOGUE");
    lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
             "BIAS_DATA_TYPE");
    lt_check(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_stand_in,
                                            sizeof bias_stand_in),
             "BIAS_POINTER");
  }
  const auto M = static_cast<uint64_t>(k.M), N = static_cast<uint64_t>(k.N), K = static_cast<uint64_t>(k.K);
  lt_check(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, K, N, static_cast<int64_t>(K)), "layout A");
  lt_check(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, K, M, static_cast<int64_t>(K)), "layout B");
  lt_check(cublasLtMatrixLayoutCreate(&p->cd, CUDA_R_32F, N, M, static_cast<int64_t>(N)), "layout C/D");

  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t max_ws = kLtWorkspaceBytes;
  const uint32_t align_b = 256;  // bf16(x) sits at the start of the 256-byte-aligned workspace
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &k.align_w, sizeof k.align_w);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &k.align_out,
                                       sizeof k.align_out);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &k.align_out,
                                       sizeof k.align_out);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->cd, p->cd, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS) return nullptr;
  p->algo = result.algo;
  p->algo_workspace = result.workspaceSize;
  return p;
}

std::mutex g_plans_mutex;
std::map<PlanKey, std::unique_ptr<Plan>>& plans() {
  static auto* m = new std::map<PlanKey, std::unique_ptr<Plan>>();  // leaked on purpose, like the handle
  return *m;
}

// The cached plan for key; built when missing (allow_build) — null when cuBLASLt has no algorithm for it.
Plan* find_or_build(const PlanKey& key, bool allow_build) {
  std::lock_guard<std::mutex> lock(g_plans_mutex);
  auto& m = plans();
  if (auto it = m.find(key); it != m.end()) return it->second.get();
  check(allow_build, ErrorCode::kUnsupported, kOp,
        "the first call for a shape must be made outside a CUDA-graph capture (or call dense_bf16_prepare(M, N, K) "
        "first); got M ", key.M, ", N ", key.N, ", K ", key.K, " with bias epilogue ", key.bias_epilogue,
        ", alignment of w ", key.align_w, ", of out ", key.align_out);
  auto plan = build_plan(key);
  Plan* raw = plan.get();
  m.emplace(key, std::move(plan));  // a null plan is cached too: "no algorithm" is not retried every call
  return raw;
}

// bf16 rounding of core/dtype.h's f32_to_bf16, bit for bit (NaN stays a quiet NaN, ties to even).
__device__ __forceinline__ uint32_t bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// x [count] f32 → dst [count] bf16. kVec: x 16-byte aligned (dst is the 256-aligned workspace): 16-byte loads,
// 8-byte stores, then the count % 4 tail.
template <bool kVec>
__global__ void __launch_bounds__(kThreads) to_bf16_kernel(const float* __restrict__ x, int64_t count,
                                                           uint16_t* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVec) {
    const auto* x4 = reinterpret_cast<const float4*>(x);
    auto* d2 = reinterpret_cast<uint2*>(dst);
    for (int64_t i = first; i < count / 4; i += stride) {
      const float4 v = x4[i];
      d2[i] = make_uint2(bf16_bits(v.x) | (bf16_bits(v.y) << 16), bf16_bits(v.z) | (bf16_bits(v.w) << 16));
    }
    done = count / 4 * 4;
  }
  for (int64_t i = done + first; i < count; i += stride) dst[i] = static_cast<uint16_t>(bf16_bits(x[i]));
}

// x [count] f32 → hi [count] = bf16(x), lo [count] = bf16(x − float(hi)) (the subtraction is exact: hi is x rounded).
__global__ void __launch_bounds__(kThreads) to_bf16_split_kernel(const float* __restrict__ x, int64_t count,
                                                                 uint16_t* __restrict__ hi,
                                                                 uint16_t* __restrict__ lo) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float v = x[i];
    const uint32_t h = bf16_bits(v);
    hi[i] = static_cast<uint16_t>(h);
    lo[i] = static_cast<uint16_t>(bf16_bits(__fsub_rn(v, __uint_as_float(h << 16))));
  }
}

// out[m, n] = d[m, n] + d[P + m, n] (+ bias[n]) for m < P: the two halves of a split GEMM's 2·P rows.
__global__ void __launch_bounds__(kThreads) add_halves_kernel(const float* __restrict__ d, int64_t P, int64_t N,
                                                              const float* __restrict__ bias,
                                                              float* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < P * N; i += stride) {
    const float v = __fadd_rn(d[i], d[P * N + i]);
    out[i] = bias != nullptr ? __fadd_rn(v, bias[i % N]) : v;
  }
}

// out[m, n] += bias[n] — only when the bias pointer is not 16-byte aligned (the epilogue handles the rest).
__global__ void __launch_bounds__(kThreads) add_bias_kernel(float* __restrict__ out, const float* __restrict__ bias,
                                                            int64_t M, int64_t N) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += stride)
    out[i] += bias[i % N];
}

unsigned blocks_for(int64_t items) {
  return static_cast<unsigned>(std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

void check_shape(int64_t M, int64_t N, int64_t K) {
  check(M >= 0 && M <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "M must be in [0, 2^31); got ", M);
  check(N >= 1 && N <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "N must be in [1, 2^31); got ", N);
  check(K >= 1 && K <= INT32_MAX, ErrorCode::kInvalidArgument, kOp, "K must be in [1, 2^31); got ", K);
}

}  // namespace

size_t dense_bf16_workspace_bytes(int64_t M, int64_t K) {
  check(M >= 0 && K >= 0, ErrorCode::kInvalidArgument, "cuda.dense_bf16_workspace_bytes",
        "M and K must be >= 0; got ", M, ", ", K);
  return round_up_256(static_cast<size_t>(M) * static_cast<size_t>(K) * 2) + kLtWorkspaceBytes;
}

void dense_bf16_prepare(int64_t M, int64_t N, int64_t K) {
  check_shape(M, N, K);
  if (M == 0) return;
  require_device(kOp);
  for (bool bias_epilogue : {false, true}) find_or_build(PlanKey{M, N, K, bias_epilogue, 16, 16}, true);
}

size_t dense_bf16_split_workspace_bytes(int64_t M, int64_t N, int64_t K) {
  check(M >= 0 && N >= 0 && K >= 0, ErrorCode::kInvalidArgument, "cuda.dense_bf16_split_workspace_bytes",
        "M, N and K must be >= 0; got ", M, ", ", N, ", ", K);
  const auto m = static_cast<size_t>(M), n = static_cast<size_t>(N), k = static_cast<size_t>(K);
  return round_up_256(m * k * 4) + round_up_256(m * n * 8) + kLtWorkspaceBytes;
}

void dense_bf16_split(const float* x, const void* w_bf16, const float* bias, float* out, int64_t M, int64_t N,
                      int64_t K, const Exec& exec) {
  constexpr const char* op = "cuda.dense_bf16_split";
  check_shape(M, N, K);
  check(M <= INT32_MAX / 2, ErrorCode::kInvalidArgument, op, "M must be below 2^30 (the GEMM runs 2·M rows); got ",
        M);
  if (M == 0) return;
  check(x != nullptr && w_bf16 != nullptr && out != nullptr, ErrorCode::kInvalidArgument, op,
        "x, w and out must be non-null");
  const size_t one_row = dense_bf16_split_workspace_bytes(1, N, K);
  check(exec.workspace != nullptr && exec.workspace_bytes >= one_row, ErrorCode::kInvalidArgument, op,
        "exec.workspace must hold at least dense_bf16_split_workspace_bytes(1, N, K) = ", one_row, " bytes; got ",
        exec.workspace_bytes, exec.workspace == nullptr ? " (null)" : "");
  check(reinterpret_cast<uintptr_t>(exec.workspace) % 256 == 0, ErrorCode::kInvalidArgument, op,
        "exec.workspace must be 256-byte aligned");
  check((reinterpret_cast<uintptr_t>(w_bf16) & 1u) == 0 && (reinterpret_cast<uintptr_t>(out) & 3u) == 0 &&
            (reinterpret_cast<uintptr_t>(x) & 3u) == 0 && (reinterpret_cast<uintptr_t>(bias) & 3u) == 0,
        ErrorCode::kInvalidArgument, op, "w must be 2-byte aligned, x, out and bias 4-byte aligned");
  // Rows per piece: the most whose hi|lo rows, 2·P float32 output rows and cuBLASLt's workspace fit.
  const size_t per_row = static_cast<size_t>(K) * 4 + static_cast<size_t>(N) * 8;
  // P rows take P·per_row bytes, up to 2·255 of round-ups, and cuBLASLt's; one row always fits (checked above).
  int64_t P = std::clamp<int64_t>(static_cast<int64_t>((exec.workspace_bytes - kLtWorkspaceBytes) / per_row), 1, M);
  while (P > 1 && dense_bf16_split_workspace_bytes(P, N, K) > exec.workspace_bytes) --P;

  auto stream = static_cast<cudaStream_t>(exec.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CIDER_CUDA_CHECK(op, cudaStreamIsCapturing(stream, &capture));
  for (int64_t m0 = 0; m0 < M; m0 += P) {
    const int64_t p = std::min(P, M - m0);
    auto* hi = static_cast<uint16_t*>(exec.workspace);  // [2p, K] bf16: the hi rows, then the lo rows
    uint16_t* lo = hi + p * K;
    auto* d = reinterpret_cast<float*>(static_cast<char*>(exec.workspace) +
                                       round_up_256(static_cast<size_t>(p * K) * 4));  // [2p, N] float32
    void* lt_workspace = reinterpret_cast<char*>(d) + round_up_256(static_cast<size_t>(p * N) * 8);
    const PlanKey key{2 * p, N, K, false, alignment_class(w_bf16), alignment_class(d)};
    Plan* plan = find_or_build(key, capture == cudaStreamCaptureStatusNone);
    check(plan != nullptr, ErrorCode::kUnsupported, op, "cuBLASLt has no bf16 algorithm for M ", 2 * p, ", N ", N,
          ", K ", K, " (alignment of w ", key.align_w, ")");
    to_bf16_split_kernel<<<blocks_for(p * K), kThreads, 0, stream>>>(x + m0 * K, p * K, hi, lo);
    check_last_launch(op);
    const float alpha = 1.0f, beta = 0.0f;
    {
      std::lock_guard<std::mutex> lock(plan->bias_mutex);
      lt_check(cublasLtMatmul(lt_handle(), plan->desc, &alpha, w_bf16, plan->a, hi, plan->b, &beta, d, plan->cd, d,
                              plan->cd, &plan->algo, lt_workspace, kLtWorkspaceBytes, stream),
               "cublasLtMatmul");
    }
    add_halves_kernel<<<blocks_for(p * N), kThreads, 0, stream>>>(d, p, N, bias, out + m0 * N);
    check_last_launch(op);
  }
}

void dense_bf16(const float* x, const void* w_bf16, const float* bias, float* out, int64_t M, int64_t N, int64_t K,
                const Exec& exec) {
  check_shape(M, N, K);
  if (M == 0) return;
  check(x != nullptr && w_bf16 != nullptr && out != nullptr, ErrorCode::kInvalidArgument, kOp,
        "x, w and out must be non-null");
  const size_t need = dense_bf16_workspace_bytes(M, K);
  check(exec.workspace != nullptr && exec.workspace_bytes >= need, ErrorCode::kInvalidArgument, kOp,
        "exec.workspace must hold dense_bf16_workspace_bytes(M, K) = ", need, " bytes; got ", exec.workspace_bytes,
        exec.workspace == nullptr ? " (null)" : "");
  check(reinterpret_cast<uintptr_t>(exec.workspace) % 256 == 0, ErrorCode::kInvalidArgument, kOp,
        "exec.workspace must be 256-byte aligned");
  check((reinterpret_cast<uintptr_t>(w_bf16) & 1u) == 0 && (reinterpret_cast<uintptr_t>(out) & 3u) == 0 &&
            (reinterpret_cast<uintptr_t>(x) & 3u) == 0 && (reinterpret_cast<uintptr_t>(bias) & 3u) == 0,
        ErrorCode::kInvalidArgument, kOp, "w must be 2-byte aligned, x, out and bias 4-byte aligned");

  auto stream = static_cast<cudaStream_t>(exec.stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CIDER_CUDA_CHECK(kOp, cudaStreamIsCapturing(stream, &capture));
  const bool bias_epilogue = bias != nullptr && alignment_class(bias) == 16;
  const PlanKey key{M, N, K, bias_epilogue, alignment_class(w_bf16), alignment_class(out)};
  Plan* plan = find_or_build(key, capture == cudaStreamCaptureStatusNone);
  check(plan != nullptr, ErrorCode::kUnsupported, kOp, "cuBLASLt has no bf16 algorithm for M ", M, ", N ", N, ", K ",
        K, " (alignment of w ", key.align_w, ", of out ", key.align_out, ")");

  auto* x_bf16 = static_cast<uint16_t*>(exec.workspace);
  void* lt_workspace = static_cast<char*>(exec.workspace) + round_up_256(static_cast<size_t>(M * K) * 2);
  const int64_t count = M * K;
  if (alignment_class(x) == 16)
    to_bf16_kernel<true><<<blocks_for((count + 3) / 4), kThreads, 0, stream>>>(x, count, x_bf16);
  else
    to_bf16_kernel<false><<<blocks_for(count), kThreads, 0, stream>>>(x, count, x_bf16);
  check_last_launch(kOp);

  const float alpha = 1.0f, beta = 0.0f;
  {
    std::lock_guard<std::mutex> lock(plan->bias_mutex);
    if (bias_epilogue)
      lt_check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
               "BIAS_POINTER");
    lt_check(cublasLtMatmul(lt_handle(), plan->desc, &alpha, w_bf16, plan->a, x_bf16, plan->b, &beta, out, plan->cd,
                            out, plan->cd, &plan->algo, lt_workspace, kLtWorkspaceBytes, stream),
             "cublasLtMatmul");
  }
  if (bias != nullptr && !bias_epilogue) {
    add_bias_kernel<<<blocks_for(M * N), kThreads, 0, stream>>>(out, bias, M, N);
    check_last_launch(kOp);
  }
}

}  // namespace cider::cuda
