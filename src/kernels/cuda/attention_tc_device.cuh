// cider/kernels/cuda/attention_tc_device.cuh — device helpers shared by the tensor-core attention kernels
// (attention_tc.cu: decode, attention_prefill_tc.cu / attention_prefill_f16.cu: prefill): cp.async with zero-fill,
// the exact power-of-two arithmetic and signed 8-bit digits of the integer query form, ex2, the f16 and bf16 mma,
// movmatrix, f16x2 bit casts and the key-tile swizzle; for the prefill kernels and the plain-cache decode kernel
// (attention_decode_plain_tc.cu) ldmatrix, code unpacking and the key intervals of a row and of a warp. All inline; the kernels' designs are in their files' top comments and docs/cuda/attention.md.
#pragma once

#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <cstring>

namespace cider::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  const int n = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The attention logit softcap in the kernels' log2 units (TcCallParams::softcap_log2 = cap·log2e, inv = its
// reciprocal): s2 → cap2·tanh(s2·inv), tanhf (a few ulp; the fast tanh.approx would cost 2^-11 relative).
__device__ __forceinline__ float capped_score(float s2, float cap2, float inv_cap2) {
  return cap2 * tanhf(s2 * inv_cap2);
}

// 2^e as a float, −126 ≤ e ≤ 127 (normal): the exponent field directly.
__device__ __forceinline__ float pow2f(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }
// x·2^e with the result of ldexpf(x, e) for −252 ≤ e ≤ 254: the multiplications by powers of two that cannot round
// come first (x·2^127 when e > 127; x·2^(e+126) when e < −126, exact for the normal x used here), the one that may
// round (an underflow into the subnormals) last, so the result is rounded once, as ldexpf's.
__device__ __forceinline__ float mul_pow2(float x, int e) {
  if (e > 127) {
    x *= pow2f(127);
    e -= 127;
  } else if (e < -126) {
    x *= pow2f(e + 126);
    e = -126;
  }
  return x * pow2f(e);
}
// E with max|q|·2^E < 2^21 (frexpf(mx) = f·2^k, f ∈ [0.5, 1): E = 21 − k), 0 for mx = 0. The exponent field gives
// k for normal mx; a subnormal mx = m·2^-149 (m < 2^23) has k = 32 − clz(m) − 149.
__device__ __forceinline__ int q_exponent(float mx) {
  if (!(mx > 0.0f)) return 0;
  const uint32_t u = __float_as_uint(mx);
  const int ef = static_cast<int>(u >> 23);
  const int k = ef != 0 ? ef - 126 : -117 - __clz(static_cast<int>(u));
  return 21 - k;
}
// Q = d2·2^16 + d1·2^8 + d0 with signed 8-bit digits (|Q| ≤ 2^21): digit `which` as a byte.
__device__ __forceinline__ void q_digits(int Q, uint32_t (&dig)[3]) {
  const int d0 = ((Q + 128) & 255) - 128;
  const int q1 = (Q - d0) >> 8;
  const int d1 = ((q1 + 128) & 255) - 128;
  const int d2 = (q1 - d1) >> 8;
  dig[0] = static_cast<uint32_t>(d0) & 255u;
  dig[1] = static_cast<uint32_t>(d1) & 255u;
  dig[2] = static_cast<uint32_t>(d2) & 255u;
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The bf16 mma (attention_tc.cu's residual-window scores, attention_decode_plain_tc.cu) and the 8×8 b16 transpose
// between lanes (the score fragment → the value mma's B operand).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ __half2 bits_h2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}

// Swizzled position of 16-byte chunk `ch` of key row r in a tile (conflict-free 4-byte reads by the mma lanes: the
// 8 rows gid = 0..7 of one read hit 8 different chunk columns of the 32 banks).
template <int D, int KB>
__device__ __forceinline__ int key_chunk_pos(int r, int ch) {
  if constexpr (KB == 5)
    return ch;  // 80/160-byte rows (5-bit per-channel keys, read as unaligned 40-bit groups): not swizzled
  else if constexpr (KB == 4 && D == 128)
    return ch ^ ((r >> 1) & 3);  // 64-byte rows: rows r, r+2 share a 128-byte bank line
  else
    return ch ^ (r & 7);         // K4 D256 (128 B), K8 D128 (128 B), K8 D256 (256 B): 8 rows, 8 chunk columns
}

// Query row r of KV head g (position r / rep, head g·rep + r % rep) of q [B, Hq, L, D] as D/128 float4 per lane
// (elements 4·(lane + 32u) …), zeros for r ≥ R.
template <int D>
__device__ __forceinline__ void load_q_row(const float* q, int b, int g, int Hq, int L, int rep, int r, int R, int lane,
                                           float4 (&v)[D / 128]) {
  if (r < R) {
    const int i = r / rep, hq = g * rep + r % rep;
    const float4* src = reinterpret_cast<const float4*>(q + ((static_cast<int64_t>(b) * Hq + hq) * L + i) * D);
#pragma unroll
    for (int u = 0; u < D / 128; ++u) v[u] = src[lane + 32 * u];
  } else {
#pragma unroll
    for (int u = 0; u < D / 128; ++u) v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// ---- shared by the two prefill kernels (attention_prefill_tc.cu, attention_prefill_f16.cu) and the plain-cache
// decode kernel (attention_decode_plain_tc.cu: ldmatrix) ----

// ldmatrix at a shared-memory address, not transposed and transposed.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two codes c_lo | c_hi << 16 (each < 1024) as an exact f16 pair: (1024 + c) − 1024.
__device__ __forceinline__ uint32_t codes_to_h2(uint32_t two_codes) {
  return h2_bits(__hsub2(bits_h2(two_codes | 0x64006400u), bits_h2(0x64006400u)));
}
// Codes of dims 2k, 2k + 1 (k < 4) of a word of 4-bit codes x (dim e at nibble e; xs = x >> 4) as c_lo | c_hi << 16.
__device__ __forceinline__ uint32_t u4_pair(uint32_t x, uint32_t xs, int k) {
  return __byte_perm(x, xs, static_cast<uint32_t>(k | ((4 + k) << 8))) & 0x000F000Fu;
}
// Codes of dims 2e, 2e + 1 (e < 4) of 24 bits of 3-bit codes x (dim j at bits 3j … 3j + 2) as c_lo | c_hi << 16.
__device__ __forceinline__ uint32_t u3_pair(uint32_t x, int e) {
  const uint32_t y = x >> (6 * e);
  return (y & 7u) | ((y << 13) & 0x70000u);
}

// Row r's visible keys [vlo, vhi) relative to c0, within [0, n_keys] (empty for r ≥ R).
template <typename Params>
__device__ __forceinline__ void prefill_row_keys(const Params& p, int64_t kL, int64_t c0, int64_t c1, int n_keys,
                                                 int r, int& vlo, int& vhi) {
  int64_t lo_h = c0, hi_h = c1;
  if (r >= p.R) {
    hi_h = c0;
  } else if (p.causal) {
    const int64_t pos = kL - p.L + r / p.rep;
    hi_h = min(c1, pos + 1);
    if (p.window > 0) lo_h = max(c0, pos - p.window + 1);
  }
  vlo = static_cast<int>(min(static_cast<int64_t>(n_keys), max(static_cast<int64_t>(0), lo_h - c0)));
  vhi = static_cast<int>(min(static_cast<int64_t>(n_keys), max(static_cast<int64_t>(0), hi_h - c0)));
  if (vhi < vlo) vhi = vlo;
}

// The warp's union [ulo, uhi) of its lanes' two row intervals (tiles outside it are skipped) and their intersection
// [ilo, ihi) (tiles inside it need no mask).
__device__ __forceinline__ void warp_key_bounds(const int (&vlo)[2], const int (&vhi)[2], int& ulo, int& uhi, int& ilo,
                                                int& ihi) {
  ulo = INT_MAX;
  uhi = 0;
  ilo = 0;
  ihi = INT_MAX;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (vhi[h] > vlo[h]) {
      ulo = min(ulo, vlo[h]);
      uhi = max(uhi, vhi[h]);
    }
    ilo = max(ilo, vlo[h]);
    ihi = min(ihi, vhi[h]);
  }
  ulo = __reduce_min_sync(0xffffffffu, ulo);
  uhi = __reduce_max_sync(0xffffffffu, uhi);
  ilo = __reduce_max_sync(0xffffffffu, ilo);
  ihi = __reduce_min_sync(0xffffffffu, ihi);
}

}  // namespace cider::cuda::detail
