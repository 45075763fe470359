// cider/kernels/cuda/gated_delta.h — the kernels of the hybrid models' layers on the GPU (Qwen3-Next, Qwen3.5;
// model/cuda/cuda_backend.cpp linear_attention, finish_heads, docs/engine.md "Hybrid models"): a gated DeltaNet layer
// step by step as CpuBackend::linear_attention and nn/gated_delta.h (the reference) compute it, and gated attention's
// output gate.
//
// A gated DeltaNet layer over n rows (Hk key heads of Dk, Hv value heads of Dv, C = 2·Hk·Dk + Hv·Dv conv channels):
//   gdn_gates           β = sigmoid(h·w_b), g = −exp(A_log)·softplus(h·w_a + dt_bias)      (n, Hv) each, float32
//   causal_conv1d_silu  q|k|v (n, C) through the depthwise causal conv of K taps and SiLU, with the sequence's window
//                       of its last K − 1 raw rows (updated)
//   l2norm_qk           q and k heads of the conv output normalised in place (q also × 1/√Dk)
//   gated_delta_rule    the recurrence over one sequence's tokens on its state S (Hv, Dk, Dv) float32
//   gated_rms_norm      o = RMSNorm(o)·w·silu(z) per value head
// and for gated attention:
//   sigmoid_gate_rows   x ·= sigmoid(gate) elementwise
//
// Conventions as model_ops.h: device pointers, float32 rows, asynchronous on `stream` (cudaStream_t), no allocation,
// no synchronization (graph-capturable); plain launches (no PDL). Arguments a caller could get wrong are checked with
// cider::check ("[cuda.<op>] rule; got value"). The arithmetic is float32 with each reference sum's order kept
// (FMA chains over the index, warp butterflies for row sums); the CPU accumulates some sums in double, so results
// agree within float32 rounding, not bit for bit (tests/cuda/test_cuda_gated_delta.cpp derives the bounds).
#pragma once

#include <cstdint>

namespace cider::cuda {

// One warp per (row t, value head h), H ≥ 1:
//   b = x[t]·wb[h], a = x[t]·wa[h]   (x (n, H); wb, wa (Hv, H) float32, the CPU's weights as they are)
//   beta[t, h] = 1 / (1 + exp(−b)),  g[t, h] = −exp(A_log[h]) · softplus(a + dt_bias[h])
// softplus(y) = y above 20, else log1p(exp(y)) (PyTorch's threshold). beta and g are (n, Hv).
void gdn_gates(const float* x, int64_t n, int64_t H, const float* wb, const float* wa, const float* A_log,
               const float* dt_bias, int64_t Hv, float* beta, float* g, void* stream);

// nn::causal_conv1d_silu on the device: out[t, c] = silu(Σ_j w[c, j] · win[t + j][c]) for t < n, c < C, where the
// window win is the K − 1 rows of `state` ((K − 1, C), the sequence's previous raw rows; zeros at its start) followed by
// the n rows of x (row stride x_stride ≥ C); then `state` becomes the window's last K − 1 rows (rows n … n + K − 2).
// w (C, K) float32; out (n, C) with row stride out_stride ≥ C, not overlapping x or state. 1 ≤ K ≤ 64.
// Two launches: the outputs (one thread per (t, c)), then the state (one thread per channel).
void causal_conv1d_silu(const float* x, int64_t x_stride, int64_t n, int64_t C, const float* w, int64_t K,
                        float* state, float* out, int64_t out_stride, void* stream);

// In place over n rows of row_stride floats: the first Hk heads of Dk (q) and the next Hk (k) each become
// x / √(Σx² + 1e-6), q heads then times q_scale (the caller passes 1/√Dk as the CPU rounds it). One warp per head.
void l2norm_qk(float* x, int64_t n, int64_t row_stride, int64_t Hk, int64_t Dk, float q_scale, void* stream);

// The gated delta rule over n tokens of one sequence (nn::gated_delta_rule after its l2norm, which l2norm_qk did):
// per value head h (key head h / (Hv / Hk), or h % Hk when v_tiled) and token t in order, on
// S = state + h·Dk·Dv ((Dk, Dv) float32):
//   S ·= exp(g[t, h]);  δ = (v_t − Sᵀk_t)·β[t, h];  S += k_t δᵀ;  out[t, h·Dv + j] = (Sᵀq_t)_j
// q, k: row t's Hk heads of Dk at q + t·row_stride (k likewise); v: row t's Hv heads of Dv at v + t·row_stride;
// g, beta (n, Hv); out (n, Hv·Dv). One block per value head, one thread per column j of S, S in shared memory
// (gated_delta_smem_bytes; loaded from `state` before the first token and written back after the last).
struct GatedDeltaArgs {
  int64_t n = 0, Hk = 0, Hv = 0, Dk = 0, Dv = 0;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t row_stride = 0;
  const float* g = nullptr;
  const float* beta = nullptr;
  float* state = nullptr;
  float* out = nullptr;
  bool v_tiled = false;  // ModelConfig::LinearAttention::v_tiled
};
// Shapes the recurrence kernel runs: Dv ≤ kGatedDeltaMaxDv (one thread per column) and the state plus q and k of one
// token within the device's opt-in shared memory per block. cider::Error (kUnsupported, naming the op, the rule and
// the values) otherwise — model loading calls it so that a model it cannot run is refused before any upload.
constexpr int64_t kGatedDeltaMaxDv = 1024;
size_t gated_delta_smem_bytes(int64_t Dk, int64_t Dv);  // (Dk·Dv + 2·Dk)·4
void check_gated_delta_shape(int64_t Dk, int64_t Dv, const char* op);
void gated_delta_rule(const GatedDeltaArgs& a, void* stream);

// o (n, Hv·Dv) in place: each value head's row o_h = (o_h · inv) · w · silu(z_h), inv = 1/√(Σ o_h²/Dv + eps) — the CPU's
// rms_norm with offset 0 then · silu(z). z: row t's Hv heads of Dv at z + t·z_stride; w (Dv). One warp per (t, h).
void gated_rms_norm(float* o, int64_t n, int64_t Hv, int64_t Dv, const float* z, int64_t z_stride, const float* w,
                    float eps, void* stream);

// x[t, i] ·= sigmoid(gate[t·gate_stride + i]) for t < n, i < width; x (n, width) contiguous (gated attention's output
// before o_proj, its gates the q projection's second half).
void sigmoid_gate_rows(float* x, int64_t n, int64_t width, const float* gate, int64_t gate_stride, void* stream);

}  // namespace cider::cuda
