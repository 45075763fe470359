// Gated activation of the MLP, reference (kernel_table.h GluArgs): act(x)·u in float64 with the formulas as written
// (std::tanh / std::exp on doubles), rounded once to float32; infinities take act's limits.
#include <cmath>
#include <limits>

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::ref {

namespace {

double act(double x, GluActivation a) {
  if (std::isinf(x)) return x > 0.0 ? x : -0.0;  // the limits; x/(1 + e^−x) and 0.5·x·(1 + tanh) give ∞/∞, ∞·0
  if (a == GluActivation::kSiLU) return x / (1.0 + std::exp(-x));
  const double sqrt_2_over_pi = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(sqrt_2_over_pi * (x + 0.044715 * x * x * x)));
}

}  // namespace

void glu(const GluArgs& a) {
  for (int64_t i = 0; i < a.count; ++i)
    a.g[i] = static_cast<float>(act(static_cast<double>(a.g[i]), a.act) * static_cast<double>(a.u[i]));
}

}  // namespace cider::kernels::ref
