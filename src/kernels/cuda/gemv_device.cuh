// cider/kernels/cuda/gemv_device.cuh — device helpers shared by the two decode GEMV kernels (linear_gemv.cu: tiles of
// 16 weight rows on the tensor cores; linear_gemv_rows.cu: one warp per weight row with dp4a) and the native-weight
// row kernel (linear_ggml_rows.cu): streaming weight loads, x element loads, the reference's int8 activation code,
// output stores, bulk copies into shared memory completed on an mbarrier.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/int8_row_quant.cuh"

namespace cider::cuda::gemv_device {

// Streamed weights: read once, keep them out of L1, let L2 fetch whole 256-byte lines (rows are contiguous).
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 load_stream8(const void* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t load_stream4(const void* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// Eight consecutive x values (element e0, a multiple of 8; the row start 16-byte aligned) as float32, exactly.
__device__ __forceinline__ void load_x8(const void* x, DType t, int64_t e0, float* v) {
  if (t == DType::kF32) {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + e0);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(x) + e0 + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(x) + e0);
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = words[i] & 0xffffu, hi = words[i] >> 16;
    if (t == DType::kBF16) {
      v[2 * i] = __uint_as_float(lo << 16);
      v[2 * i + 1] = __uint_as_float(hi << 16);
    } else {
      v[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(lo)));
      v[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(hi)));
    }
  }
}

__device__ __forceinline__ void store_out(void* out, DType t, int64_t i, float v) {
  if (t == DType::kF32) {
    static_cast<float*>(out)[i] = v;
  } else if (t == DType::kBF16) {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<__half*>(out)[i] = __float2half_rn(v);
  }
}

// quant::quantize_int8_row's code (int8_row_quant.cuh: clamp(rint(v / sx), -127, 127), IEEE division) as a byte.
__device__ __forceinline__ uint32_t int8_code(float v, float sx) {
  return static_cast<uint32_t>(int8_row_quant::int8_code(v, sx)) & 0xffu;
}

// The row's scale from max |x| given as the bits of |x| (non-negative floats order like their bits; a NaN or ±inf
// in the row gives bits ≥ 0x7f800000): the reference's rule, int8_row_quant::row_sx.
__device__ __forceinline__ float row_scale_from_amax_bits(uint32_t amax_bits) {
  return int8_row_quant::row_sx(__uint_as_float(amax_bits), amax_bits < 0x7f800000u);
}

// Eight activation codes (bytes c[0..7] of x values 8u .. 8u + 7) as the GEMV kernels keep them in shared memory:
// W8 in k order, W4 as [x0 x2 x4 x6 | x1 x3 x5 x7] — the order in which a weight word's unpacked nibbles come.
template <bool kInt4>
__device__ __forceinline__ uint2 pack_unit_codes(const uint32_t (&c)[8]) {
  if constexpr (kInt4)
    return make_uint2(c[0] | (c[2] << 8) | (c[4] << 16) | (c[6] << 24), c[1] | (c[3] << 8) | (c[5] << 16) | (c[7] << 24));
  else
    return make_uint2(c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24), c[4] | (c[5] << 8) | (c[6] << 16) | (c[7] << 24));
}
// The same layout from eight codes quantized beforehand in k order (quantize_rows_int8's workspace).
template <bool kInt4>
__device__ __forceinline__ uint2 unit_codes_from_k_order(uint2 v) {
  if constexpr (kInt4) return make_uint2(__byte_perm(v.x, v.y, 0x6420), __byte_perm(v.x, v.y, 0x7531));
  else return v;
}

// ---- bulk copies (TMA) into warp-private shared-memory slots, completion counted on an mbarrier per slot ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {  // one arrival per phase: the issuing lane's expect_tx
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {  // the initialised barriers visible to the async (TMA) proxy
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst (both 16-byte aligned); completes on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// The slot's earlier generic reads (all lanes, ordered by __syncwarp) before the async proxy overwrites it.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

}  // namespace cider::cuda::gemv_device
