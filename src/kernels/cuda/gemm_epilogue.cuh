// cider/kernels/cuda/gemm_epilogue.cuh — device helpers of the int8 GEMM epilogues (linear_gemm.cu: mma.sync,
// linear_gemm_wgmma.cu: wgmma): exact small-integer → float conversion and the output stores per dtype.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cider::cuda::gemm_epilogue {

// |acc| < 2^22 → float exactly, with an integer add and a float subtract (both full rate, unlike I2F): the bits of
// 2^23 + 2^22 + acc are a float whose value minus 1.5·2^23 is acc. Group partials: |acc| ≤ 256·127·127 < 2^22.
__device__ __forceinline__ float small_int_to_float(int32_t acc) {
  return __fsub_rn(__int_as_float(0x4B400000 + acc), 12582912.0f);
}

template <typename OutT>
__device__ __forceinline__ void store_one(OutT* out, int64_t i, float v);
template <>
__device__ __forceinline__ void store_one<float>(float* out, int64_t i, float v) { out[i] = v; }
template <>
__device__ __forceinline__ void store_one<__nv_bfloat16>(__nv_bfloat16* out, int64_t i, float v) {
  out[i] = __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ void store_one<__half>(__half* out, int64_t i, float v) { out[i] = __float2half_rn(v); }

// Two adjacent outputs (i even, the pointer aligned to two elements).
template <typename OutT>
__device__ __forceinline__ void store_two(OutT* out, int64_t i, float v0, float v1);
template <>
__device__ __forceinline__ void store_two<float>(float* out, int64_t i, float v0, float v1) {
  *reinterpret_cast<float2*>(out + i) = make_float2(v0, v1);
}
template <>
__device__ __forceinline__ void store_two<__nv_bfloat16>(__nv_bfloat16* out, int64_t i, float v0, float v1) {
  __nv_bfloat162 h;
  h.x = __float2bfloat16_rn(v0);
  h.y = __float2bfloat16_rn(v1);
  *reinterpret_cast<__nv_bfloat162*>(out + i) = h;
}
template <>
__device__ __forceinline__ void store_two<__half>(__half* out, int64_t i, float v0, float v1) {
  __half2 h;
  h.x = __float2half_rn(v0);
  h.y = __float2half_rn(v1);
  *reinterpret_cast<__half2*>(out + i) = h;
}

}  // namespace cider::cuda::gemm_epilogue
