// The gated DeltaNet's sequence mixing (nn/gated_delta.h).
#include "nn/gated_delta.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/kernel_table.h"

namespace cider::nn {

namespace {

size_t sz(int64_t n) { return static_cast<size_t>(n); }

float silu(float x) { return x / (1.0f + std::exp(-x)); }

// x / √(Σx² + 1e-6) into out, in float32 with the sum accumulated in double (FLA's l2norm, as transformers has it).
void l2norm(const float* x, int64_t d, float scale, float* out) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const auto inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
  for (int64_t i = 0; i < d; ++i) out[i] = x[i] * inv * scale;
}

}  // namespace

void causal_conv1d_silu(const float* x, int64_t x_stride, int64_t n, int64_t C, const float* w, int64_t K,
                        float* state, float* out) {
  const int64_t S = K - 1;
  // The window: the state's S rows, then the n new rows.
  std::vector<float> win(sz((S + n) * C));
  if (S > 0) std::memcpy(win.data(), state, sz(S * C) * sizeof(float));
  for (int64_t t = 0; t < n; ++t) std::memcpy(win.data() + (S + t) * C, x + t * x_stride, sz(C) * sizeof(float));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < K; ++j) acc += static_cast<double>(w[c * K + j]) * win[sz((t + j) * C + c)];
      out[t * C + c] = silu(static_cast<float>(acc));
    }
  if (S > 0) std::memcpy(state, win.data() + n * C, sz(S * C) * sizeof(float));
}

void gated_delta_rule(const GatedDeltaArgs& a) {
  const int64_t n = a.n, Hk = a.Hk, Hv = a.Hv, Dk = a.Dk, Dv = a.Dv;
  const float qscale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dk)));
  // Normalised queries and keys of every token and key head: (n, Hk, Dk) each.
  std::vector<float> qn(sz(n * Hk * Dk)), kn(sz(n * Hk * Dk));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < Hk; ++h) {
      l2norm(a.q + t * a.row_stride + h * Dk, Dk, qscale, qn.data() + (t * Hk + h) * Dk);
      l2norm(a.k + t * a.row_stride + h * Dk, Dk, 1.0f, kn.data() + (t * Hk + h) * Dk);
    }
  kernels::GatedDeltaKernelArgs ka{};
  ka.q = qn.data();
  ka.k = kn.data();
  ka.v = a.v;
  ka.v_stride = a.row_stride;
  ka.g = a.g;
  ka.beta = a.beta;
  ka.state = a.state;
  ka.out = a.out;
  ka.n = n;
  ka.Hk = Hk;
  ka.Hv = Hv;
  ka.Dk = Dk;
  ka.Dv = Dv;
  ka.v_tiled = a.v_tiled;
  const kernels::KernelTable& table = kernels::active_kernels();
  auto heads = [&](int64_t h0, int64_t h1) {
    kernels::GatedDeltaKernelArgs part = ka;
    part.h0 = h0;
    part.h1 = h1;
    table.gated_delta(part);
  };
  // One value head's recurrence is sequential in t; heads are independent.
  if (Hv > 1 && n * Dk * Dv * Hv >= (int64_t{1} << 18)) {
    default_thread_pool().parallel_for(Hv, [&](int64_t b, int64_t e, int) { heads(b, e); });
  } else {
    heads(0, Hv);
  }
}

}  // namespace cider::nn
