// The gated delta rule, reference (kernel_table.h GatedDeltaKernelArgs): plain float32 loops in the order the
// formula reads — decay S, δ from Sᵀk summed over i ascending, the rank-one update, o = Sᵀq summed over i ascending.
#include <cmath>
#include <vector>

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::ref {

void gated_delta(const GatedDeltaKernelArgs& a) {
  const int64_t Dk = a.Dk, Dv = a.Dv, r = a.Hv / a.Hk;
  std::vector<float> delta(static_cast<size_t>(Dv));
  for (int64_t h = a.h0; h < a.h1; ++h) {
    float* S = a.state + h * Dk * Dv;  // (Dk, Dv)
    const int64_t kh = a.v_tiled ? h % a.Hk : h / r;
    for (int64_t t = 0; t < a.n; ++t) {
      const float* q = a.q + (t * a.Hk + kh) * Dk;
      const float* k = a.k + (t * a.Hk + kh) * Dk;
      const float* v = a.v + t * a.v_stride + h * Dv;
      const float decay = std::exp(a.g[t * a.Hv + h]);
      const float beta = a.beta[t * a.Hv + h];
      for (int64_t i = 0; i < Dk * Dv; ++i) S[i] *= decay;
      for (int64_t j = 0; j < Dv; ++j) delta[static_cast<size_t>(j)] = 0.0f;
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) delta[static_cast<size_t>(j)] += S[i * Dv + j] * k[i];
      for (int64_t j = 0; j < Dv; ++j) delta[static_cast<size_t>(j)] = (v[j] - delta[static_cast<size_t>(j)]) * beta;
      float* o = a.out + t * a.Hv * Dv + h * Dv;
      for (int64_t j = 0; j < Dv; ++j) o[j] = 0.0f;
      for (int64_t i = 0; i < Dk; ++i)
        for (int64_t j = 0; j < Dv; ++j) {
          S[i * Dv + j] += k[i] * delta[static_cast<size_t>(j)];
          o[j] += S[i * Dv + j] * q[i];
        }
    }
  }
}

}  // namespace cider::kernels::ref
