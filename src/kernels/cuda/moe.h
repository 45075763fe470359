// cider/kernels/cuda/moe.h — a mixture-of-experts layer's decode rows on the GPU with the routing on the device, so
// that the step needs no host round trip and fits a CUDA graph (model/cuda/cuda_backend.cpp moe; prefill passes keep
// the host routing that groups rows by expert). For n rows (a decode batch), K experts per row, E experts:
//   moe_route         router logits h·W_rᵀ (n, E), softmax, the K largest (ties: the lower index), renormalised when
//                     asked — route_experts' rule (model/transformer.h) — and each row's choices sorted by expert
//                     index (the CPU's order of adds); with a shared expert, its weight sigmoid(h·w_sg) per row
//   moe_quantize_rows the int kernels' per-row int8 activation codes (quant::quantize_int8_row, bit-identical)
//   moe_gemv          slot s = (row r, k): out[s] = x[s / x_div] · W_{sel[s]}ᵀ, the expert's weights found through a
//                     device table (one entry per expert), so one launch covers every slot whatever was chosen
//   moe_combine       t[r] = Σ_k w[r, k]·y[r·K + k] in k order (= expert order), + w_s[r]·ys[r] (the shared expert)
// Conventions as model_ops.h: device pointers, float32 rows, asynchronous on `stream` (cudaStream_t), no allocation,
// no synchronization (graph-capturable), plain launches; argument errors are cider::Error naming "cuda.moe_*".
// Arithmetic: int dot products exact in int32 per weight group (segments of lanes reduce a group's codes before its
// scale), float32 sums of the groups' products reassociated by the warp's reduction; dense bf16 weights multiply the
// float32 activations exactly widened. So results equal the GEMV kernels' within float32 reassociation
// (tests/cuda/test_cuda_moe.cpp).
#pragma once

#include <cstdint>

namespace cider::cuda {

constexpr int64_t kMoeMaxExperts = 1024;  // moe_route keeps a row's logits in shared memory
constexpr int64_t kMoeMaxTopK = 32;

// h (n, H) float32; router (E, H) float32; shared_gate (H) float32 or null. sel (n, K) int32 and w (n, K) float32;
// w_shared (n) when shared_gate is set. One block per row.
void moe_route(const float* h, int64_t n, int64_t H, const float* router, int64_t E, int64_t K, bool normalize,
               const float* shared_gate, int32_t* sel, float* w, float* w_shared, void* stream);

// x (rows, K) float32 → codes (rows, K) int8 and scales sx (rows) float32, quant::quantize_int8_row's rule.
void moe_quantize_rows(const float* x, int64_t rows, int64_t K, int8_t* codes, float* sx, void* stream);

// One expert's weights, as GpuLinear holds them: w dense bf16 [N, K], int8 [N, K] or int4 uint8 [N, K/2] (element 2i
// in the low nibble, q + 8); scales float32 [N] (group_size 0) or [K/group_size, N]; no bias.
struct MoeExpertWeights {
  const void* w = nullptr;
  const float* scales = nullptr;
};
enum class MoeWeightKind : int { kBF16 = 0, kInt8 = 1, kInt4 = 2 };
struct MoeGemvArgs {
  const MoeExpertWeights* table = nullptr;  // device: one entry per expert
  MoeWeightKind kind = MoeWeightKind::kBF16;
  int64_t N = 0, K = 0;   // K a multiple of 32
  int group_size = 0;     // int kinds: 0, or 32 … 256 (a multiple of a lane's chunk: 16 int8 / 32 int4 values)
  const float* x = nullptr;       // bf16 kind: (rows, K) float32
  const int8_t* xq = nullptr;     // int kinds: (rows, K) codes and their scales (moe_quantize_rows)
  const float* sx = nullptr;
  int64_t x_div = 1;              // slot s reads activation row s / x_div
  const int32_t* sel = nullptr;   // (slots): each slot's expert
  int64_t slots = 0;
  float* out = nullptr;           // (slots, N)
};
void moe_gemv(const MoeGemvArgs& a, void* stream);

// out (n, H) = Σ_k w[r·K + k]·y[r·K + k] (k ascending; each product and add rounded, as the CPU's t += w·y), then
// + w_shared[r]·ys[r] when ys is set. y (n·K, H), ys (n, H).
void moe_combine(const float* y, const float* w, int64_t n, int64_t K, int64_t H, const float* ys,
                 const float* w_shared, float* out, void* stream);

}  // namespace cider::cuda
