// Reference dense linear: out = x @ wᵀ + bias with float32 accumulation. See DenseGemmArgs.
#include <vector>

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::ref {

void dense_gemm(const DenseGemmArgs& a) {
  std::vector<float> wrow(static_cast<size_t>(a.K));
  for (int64_t n = 0; n < a.N; ++n) {
    for (int64_t k = 0; k < a.K; ++k) wrow[static_cast<size_t>(k)] = load_float(a.w, a.w_dtype, n * a.K + k);
    const float b = a.bias ? a.bias[n] : 0.0f;
    for (int64_t m = 0; m < a.M; ++m) {
      const float* x = a.x + m * a.K;
      float acc = 0.0f;
      for (int64_t k = 0; k < a.K; ++k) acc += x[k] * wrow[static_cast<size_t>(k)];
      a.out[m * a.N + n] = acc + b;
    }
  }
}

}  // namespace cider::kernels::ref
