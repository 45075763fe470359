// Reference W4A8 linear: packed int4 weights [N, K/2] × int8 per-token activations, int32 sums, float32 epilogue.
//
// Exact evaluation order (fast kernels are compared against it with a tolerance, but this is the definition):
//   sx, xq   = quant::quantize_int8_row(x[m, :])             (NaN sx for a row with NaN/inf: the output row is NaN)
//   acc_g    = Σ_{k∈g} xq[k]·wq[n,k],  wq = nibble − 8        int32, exact (per channel: one group of K)
//   y        = sx · Σ_g fl(sw_g · float(acc_g))               float32, groups in order
//   out[m,n] = round_to(out_dtype, y + bias[n])
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
#include "quant/int4.h"
#include "quant/int8.h"

namespace cider::kernels::ref {

namespace {

// Σ xq[k]·wq[k0 + k] for k < n, reading codes k0.. of one packed weight row.
int32_t dot_i8_i4(const int8_t* xq, const uint8_t* wrow, int64_t k0, int64_t n) {
  int32_t acc = 0;
  for (int64_t k = 0; k < n; ++k) acc += static_cast<int32_t>(xq[k]) * quant::int4_code(wrow, k0 + k);
  return acc;
}

void w4a8_linear(const IntLinearArgs& a) {
  CIDER_DEBUG_ASSERT(a.K % 2 == 0);
  CIDER_DEBUG_ASSERT(a.group_size >= 0 && (a.group_size == 0 || a.K % a.group_size == 0));
  CIDER_DEBUG_ASSERT(a.group_size > 0 || a.K <= quant::kInt4MaxAccumK);
  const int64_t span = a.group_size == 0 ? a.K : a.group_size;  // K values sharing one weight scale
  const int64_t groups = a.K == 0 ? 0 : a.K / span;
  const int64_t x_row_bytes = a.K * dtype_size(a.x_dtype);
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  std::vector<int8_t> xq(static_cast<size_t>(a.K));

  for (int64_t m = 0; m < a.M; ++m) {
    const float sx = quant::quantize_int8_row(static_cast<const uint8_t*>(a.x) + m * x_row_bytes, a.x_dtype, a.K,
                                              xq.data());
    for (int64_t n = 0; n < a.N; ++n) {
      const uint8_t* wrow = w + n * (a.K / 2);
      float sum = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const int32_t acc = dot_i8_i4(xq.data() + g * span, wrow, g * span, span);
        const float sw = a.group_size == 0 ? a.w_scales[n] : a.w_scales[g * a.N + n];
        sum += sw * static_cast<float>(acc);
      }
      float y = sx * sum;
      if (a.bias) y += a.bias[n];
      store_float(a.out, a.out_dtype, m * a.N + n, y);
    }
  }
}

}  // namespace

void w4a8_gemm(const IntLinearArgs& a) { w4a8_linear(a); }

void w4a8_gemv(const IntLinearArgs& a) {
  CIDER_DEBUG_ASSERT(a.M == 1);
  w4a8_linear(a);
}

}  // namespace cider::kernels::ref
