// log-sum-exp of a row, reference (kernel_table.h LogSumExpArgs): the max, then Σ exp(z − max) in float64 in index
// order.
#include <cmath>
#include <limits>

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::ref {

void log_sum_exp(const LogSumExpArgs& a) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double mx = -kInf;
  bool nan = false;
  for (int64_t i = 0; i < a.n; ++i) {
    const double x = a.z[i];
    nan = nan || std::isnan(x);
    mx = std::max(mx, x);
  }
  *a.max = mx;
  if (nan || mx == kInf) {
    *a.lse = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  if (mx == -kInf) {  // every entry −inf: the log of an empty sum
    *a.lse = -kInf;
    return;
  }
  double s = 0.0;
  for (int64_t i = 0; i < a.n; ++i) s += std::exp(static_cast<double>(a.z[i]) - mx);
  *a.lse = std::log(s);
}

}  // namespace cider::kernels::ref
