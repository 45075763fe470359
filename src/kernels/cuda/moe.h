// cider/kernels/cuda/moe.h — a mixture-of-experts layer's decode rows on the GPU with the routing on the device, so
// that the step needs no host round trip and fits a CUDA graph (model/cuda/cuda_backend.cpp moe; prefill passes keep
// the host routing that groups rows by expert). For n rows (a decode batch), K experts per row, E experts:
//   moe_route         router logits h·W_rᵀ (n, E), softmax, the K largest (ties: the lower index), renormalised when
//                     asked — route_experts' rule (model/transformer.h) — and each row's choices sorted by expert
//                     index (the CPU's order of adds); with a shared expert, its weight sigmoid(h·w_sg) per row
//   moe_gemv          slot s = (row r, k): out[s] = x[s / x_div] · W_{sel[s]}ᵀ, the expert's weights found through a
//                     device table (one entry per expert), so one launch covers every slot whatever was chosen. Int
//                     weights run the dense decode GEMV's row kernel (linear_gemv_rows.cu: its load pipeline, its
//                     fused activation quantization), a block row per slot; bf16 weights a warp per output row here
//   moe_combine       t[r] = Σ_k w[r, k]·y[r·K + k] in k order (= expert order), + w_s[r]·ys[r] (the shared expert)
// Conventions as model_ops.h: device pointers, float32 rows, asynchronous on `stream` (cudaStream_t), no allocation,
// no synchronization (graph-capturable), PDL launches (pdl.cuh; the bf16 GEMV a plain one); argument errors are
// cider::Error naming "cuda.moe_*".
// Arithmetic: int weights as cuda::w8a8_gemv / w4a8_gemv for one row (activation codes bit-identical to
// quant::quantize_int8_row, int dot products exact in int32 per weight group, per channel the reference's epilogue,
// per group the float32 sum over groups reassociated); dense bf16 weights multiply the float32 activations exactly
// widened. So results equal the GEMV kernels' within float32 reassociation (tests/cuda/test_cuda_moe.cpp).
#pragma once

#include <cstdint>

namespace cider::cuda {

constexpr int64_t kMoeMaxExperts = 1024;  // moe_route keeps a row's logits in shared memory
constexpr int64_t kMoeMaxTopK = 32;

// h (n, H) float32; router (E, H) float32; shared_gate (H) float32 or null. sel (n, K) int32 and w (n, K) float32;
// w_shared (n) when shared_gate is set. One block per row.
void moe_route(const float* h, int64_t n, int64_t H, const float* router, int64_t E, int64_t K, bool normalize,
               const float* shared_gate, int32_t* sel, float* w, float* w_shared, void* stream);

// One expert's weights, as GpuLinear holds them: w dense bf16 [N, K], int8 [N, K] or int4 uint8 [N, K/2] (element 2i
// in the low nibble, q + 8); scales float32 [N] (group_size 0) or [K/group_size, N]; no bias.
struct MoeExpertWeights {
  const void* w = nullptr;
  const float* scales = nullptr;
};
enum class MoeWeightKind : int { kBF16 = 0, kInt8 = 1, kInt4 = 2 };
// The weights moe_gemv takes: K a positive multiple of 32; int8 per channel (group_size 0) or per group of 64, 128
// or 256; int4 per channel or per group of 32 … 256; bf16 without groups. The one rule (moe_gemv checks it, the
// CUDA backend routes a model's MoE layers on the device only when every expert passes it).
bool moe_gemv_supports(MoeWeightKind kind, int64_t K, int group_size);
struct MoeGemvArgs {
  const MoeExpertWeights* table = nullptr;  // device: one entry per expert
  MoeWeightKind kind = MoeWeightKind::kBF16;
  int64_t N = 0, K = 0;   // moe_gemv_supports
  int group_size = 0;
  const float* x = nullptr;       // (rows, K) float32 activations
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
