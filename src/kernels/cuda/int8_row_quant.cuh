// cider/kernels/cuda/int8_row_quant.cuh — the per-token int8 activation code of quant::quantize_int8_row on the
// device, used by the quantization kernel (linear_gemm.cu) and the GEMV kernels (gemv_device.cuh): sx = fl(amax / 127) (1 when 0, NaN when a value is not finite), q = clamp(rint(fl(x / sx)),
// ±127), bit-identical to the reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace cider::cuda::int8_row_quant {

// 8 consecutive values of x as loaded (16 bytes of bf16/f16, 32 of f32): the quantization kernels keep these raw
// words in registers (4 per 8 bf16 values instead of 8 floats) between the row's max and its codes.
template <typename T>
struct Raw8 {
  uint4 w[sizeof(T) == 4 ? 2 : 1];
  __device__ __forceinline__ void load(const T* p, int64_t i) {
    const auto* src = reinterpret_cast<const uint4*>(p + i);
#pragma unroll
    for (int h = 0; h < (sizeof(T) == 4 ? 2 : 1); ++h) w[h] = src[h];
  }
  __device__ __forceinline__ float get(int j) const {
    if constexpr (sizeof(T) == 4) {
      const uint4& u = w[j / 4];
      const uint32_t b = (j % 4) == 0 ? u.x : (j % 4) == 1 ? u.y : (j % 4) == 2 ? u.z : u.w;
      return __uint_as_float(b);
    } else {
      const uint32_t b = (j / 2) == 0 ? w[0].x : (j / 2) == 1 ? w[0].y : (j / 2) == 2 ? w[0].z : w[0].w;
      const uint16_t h = static_cast<uint16_t>((j % 2) == 0 ? (b & 0xffffu) : (b >> 16));
      if constexpr (std::is_same_v<T, __half>) return __half2float(__ushort_as_half(h));
      else return __uint_as_float(static_cast<uint32_t>(h) << 16);  // bfloat16 → float32 is exact
    }
  }
};

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

// Codes of 8 values through the reciprocal, branch-free (so the 8 — and a caller's chunks — run side by side):
// q = rint(fl(v·r)) is the reference's code when fl(v·r) lies farther than 2.4e-5 from a half-integer (see above),
// i.e. when |fl(v·r) − q| < 0.5 − 4e-5 (0.49996f keeps a 3.99e-5 margin); then |fl(v·r)| ≤ 127.01 gives
// q ∈ [−127, 127] without a clamp. Returns the packed codes; `exact` is set when any value (or the scale: s.fast
// false) needs the reference's division instead (codes8_exact).
__device__ __forceinline__ uint2 codes8_fast(const float (&v)[8], const RowScale& s, bool& exact) {
  uint32_t packed[2] = {0u, 0u};
  bool near = !s.fast;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float t = __fmul_rn(v[j], s.r);
    const float q = rintf(t);
    near = near || !(fabsf(__fsub_rn(t, q)) < 0.49996f);
    packed[j / 4] |= (static_cast<uint32_t>(static_cast<int>(q)) & 0xffu) << (8 * (j % 4));
  }
  exact = near;
  return make_uint2(packed[0], packed[1]);
}
// The reference's codes of 8 values (IEEE division), for the chunks codes8_fast flags.
__device__ __forceinline__ uint2 codes8_exact(const float (&v)[8], float sx) {
  uint32_t packed[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) packed[j / 4] |= (static_cast<uint32_t>(int8_code(v[j], sx)) & 0xffu) << (8 * (j % 4));
  return make_uint2(packed[0], packed[1]);
}

// Scale of a row from its max |x| (NaN when a value is not finite, 1 when all are zero), as the reference.
__device__ __forceinline__ float row_sx(float amax, bool finite) {
  if (!finite) return __int_as_float(0x7fc00000);  // quiet NaN
  const float sx = __fdiv_rn(amax, 127.0f);
  return sx == 0.0f ? 1.0f : sx;
}

}  // namespace cider::cuda::int8_row_quant
