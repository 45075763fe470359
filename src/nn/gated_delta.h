// cider/nn/gated_delta.h — the gated DeltaNet's sequence mixing (Qwen3-Next, Qwen3.5 linear-attention layers), plain
// float32 code: the reference, and the CPU path.
//
// Per value head h (Hv heads of Dv; its key head h / (Hv / Hk) of Hk heads of Dk, or h % Hk with v_tiled), per token
// t in order:
//   q, k  = l2norm(q_t), l2norm(k_t) (x / √(Σx² + 1e-6)), q /= √Dk
//   S     = S · exp(g_t[h])                                   S: the state, (Dk, Dv) float32
//   δ     = (v_t − Sᵀk) · β_t[h]
//   S     = S + k δᵀ
//   o_t   = Sᵀq
// as transformers' torch_recurrent_gated_delta_rule (its chunked form computes the same values).
#pragma once

#include <cstdint>

namespace cider::nn {

// Causal depthwise convolution of n rows of C channels (row stride x_stride) with kernel w (C, K), then SiLU:
// out[t][c] = silu(Σ_j w[c][j] · x[t − (K − 1) + j][c]), where rows before the first come from `state` ((K − 1, C),
// the previous call's last raw rows, zeros at the start) and are replaced by this call's last K − 1 raw rows.
// out (n, C) must not alias x.
void causal_conv1d_silu(const float* x, int64_t x_stride, int64_t n, int64_t C, const float* w, int64_t K,
                        float* state, float* out);

struct GatedDeltaArgs {
  int64_t n = 0;                     // tokens
  int64_t Hk = 0, Hv = 0, Dk = 0, Dv = 0;
  const float* q = nullptr;          // row t: Hk heads of Dk at q + t·row_stride
  const float* k = nullptr;          // the same layout
  const float* v = nullptr;          // row t: Hv heads of Dv at v + t·row_stride
  int64_t row_stride = 0;
  const float* g = nullptr;          // (n, Hv) log decay (<= 0)
  const float* beta = nullptr;       // (n, Hv)
  float* state = nullptr;            // (Hv, Dk, Dv), updated
  float* out = nullptr;              // (n, Hv·Dv)
  bool v_tiled = false;              // ModelConfig::LinearAttention::v_tiled
};
// Runs the recurrence over the n tokens: q and k normalised here, then the kernel table's gated_delta (kernels/ref
// the reference, kernels/x86/avx2 the AVX2/AVX-512 levels), value heads split over the default thread pool when the
// work is large.
void gated_delta_rule(const GatedDeltaArgs& a);

}  // namespace cider::nn
