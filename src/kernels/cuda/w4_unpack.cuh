// cider/kernels/cuda/w4_unpack.cuh — packed W4 weight bytes → int8 codes, the one rule the prefill GEMM kernels
// (linear_gemm.cu's mma.sync tile, linear_gemm_wgmma.cu's unpacking warps) share. Layout (kernels::IntLinearArgs):
// byte i of a row holds k = 2i in its low nibble and k = 2i + 1 in its high nibble, code = nibble − 8.
#pragma once

#include <cstdint>

namespace cider::cuda {

// One packed word (k 0..7 of 8 consecutive values) → two int8x4 words in k order: q0 = k 0..3, q1 = k 4..7.
// nibble + 0x78 stays below 0x100 (no carry between bytes) and ^ 0x80 maps it to the byte of nibble − 8:
// 0..7 → 0xF8..0xFF, 8..15 → 0x00..0x07.
__device__ __forceinline__ void unpack_w4_word(uint32_t w, uint32_t& q0, uint32_t& q1) {
  const uint32_t lo = ((w & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u;         // k 0, 2, 4, 6
  const uint32_t hi = (((w >> 4) & 0x0f0f0f0fu) + 0x78787878u) ^ 0x80808080u;  // k 1, 3, 5, 7
  q0 = __byte_perm(lo, hi, 0x5140);
  q1 = __byte_perm(lo, hi, 0x7362);
}

}  // namespace cider::cuda
