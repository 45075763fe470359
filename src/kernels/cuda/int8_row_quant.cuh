// cider/kernels/cuda/int8_row_quant.cuh — the per-token int8 activation code of quant::quantize_int8_row on the
// device, shared by the separate quantization kernel (linear_gemm.cu) and the wgmma GEMM's fused quantization
// (linear_gemm_wgmma.cu): sx = fl(amax / 127) (1 when 0, NaN when a value is not finite), q = clamp(rint(fl(x / sx)),
// ±127), bit-identical to the reference.
#pragma once

#include <cuda_runtime.h>

namespace cider::cuda::int8_row_quant {

// The reference's int8_code: clamp(rint(v / sx), -127, 127) with an IEEE division.
__device__ __forceinline__ int int8_code(float v, float sx) {
  const float r = fminf(fmaxf(rintf(__fdiv_rn(v, sx)), -127.0f), 127.0f);
  return static_cast<int>(r);
}

// Codes of a row with scale sx, through a multiplication by r = fl(1 / sx) where that provably gives the same code
// as the reference's IEEE division: |fl(v·r) − v/sx| ≤ (2⁻²⁴ + 2⁻²⁴ + 2⁻⁴⁸)·|v/sx| ≤ 1.6e-5 for |v/sx| ≤ 127.01
// and |fl(v/sx) − v/sx| ≤ 2⁻²⁴·127.01 < 7.6e-6, so rint() of the two can differ only when t = fl(v·r) lies within
// 2.4e-5 of a half-integer; those (and rows whose sx makes r subnormal or infinite) take the division.
struct RowScale {
  float sx, r;
  bool fast;  // sx in [1e-37, 1e37]: r normal and finite, |v·r| ≤ 127.01
};
__device__ __forceinline__ RowScale row_scale(float sx) {
  return RowScale{sx, __frcp_rn(sx), sx >= 1e-37f && sx <= 1e37f};
}
__device__ __forceinline__ int int8_code(float v, const RowScale& s) {
  if (s.fast) {
    const float t = __fmul_rn(v, s.r);
    const float frac = t - floorf(t);  // exact: |t| < 2²³
    if (fabsf(frac - 0.5f) > 4e-5f) return static_cast<int>(fminf(fmaxf(rintf(t), -127.0f), 127.0f));
  }
  return int8_code(v, s.sx);
}

// Scale of a row from its max |x| (NaN when a value is not finite, 1 when all are zero), as the reference.
__device__ __forceinline__ float row_sx(float amax, bool finite) {
  if (!finite) return __int_as_float(0x7fc00000);  // quiet NaN
  const float sx = __fdiv_rn(amax, 127.0f);
  return sx == 0.0f ? 1.0f : sx;
}

}  // namespace cider::cuda::int8_row_quant
