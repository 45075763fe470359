// AVX-512 rotate + quantize + store of new KV rows, bit-identical to kernels/ref/kv_append_ref.cpp.
//
// Why the bytes match: every float operation of the reference is done with the same IEEE operation in the same
// order, lane-wise — the Hamilton products as separate multiplies, adds and subtracts (no FMA; conj(qR) is applied
// as products with exactly negated components, which round identically), the group minimum/maximum (exact in any
// order; the sign of a zero extreme cannot change any output, see docs/kv_cache.md), the per-group scale/bias
// arithmetic in scalar float32 as quant::affine_quantize_group writes it, and the codes as rint((w − bias) / scale)
// with a true division and round-to-nearest-even, clamped to [0, 2^bits − 1]. f16 stores use the F16C conversion
// (IEEE round to nearest even, like cider::f32_to_f16); bf16 stores use the same bit arithmetic as f32_to_bf16.
// Layout: 16 quaternion blocks (64 values) per step, deinterleaved into w/x/y/z vectors (lanes = blocks).
// Hadamard (rotation 3): the same multiplies x·(s·c) and the same butterfly adds/subtracts as hadamard_row of the
// reference; a stage's pairs are independent, so doing them 16 at a time changes no result. Stages h = 1, 2, 4, 8
// pair lanes of one vector (a permute, then sum in the lower lane, difference in the upper); h ≥ 16 pair vectors.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/attention_x86.h"
#include "kernels/x86/avx512/hadamard.h"
#include "quant/affine.h"

#define CIDER_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define CIDER_INLINE static inline __attribute__((always_inline)) CIDER_AVX512

namespace cider::kernels::x86::avx512 {

namespace {

CIDER_INLINE float f16_bits_to_f32(uint16_t h) { return _cvtsh_ss(h); }
CIDER_INLINE uint16_t f32_to_f16_bits(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
// cider::f32_to_bf16's arithmetic: round to nearest even, NaN made quiet.
CIDER_INLINE uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
CIDER_INLINE float bf16_bits_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Row i of the source as float32 into row[0, D).
CIDER_INLINE void load_row(const KVAppendArgs& a, int64_t i, float* row) {
  const int64_t D = a.dim;
  const uint8_t* base = static_cast<const uint8_t*>(a.src);
  if (a.src_elem_stride == 1) {
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 m = D - d >= 16 ? __mmask16(0xffff) : __mmask16((1u << (D - d)) - 1u);
      __m512 v;
      if (a.src_dtype == DType::kF32) {
        v = _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(base) + i * a.src_row_stride + d);
      } else {
        const __m256i h = _mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(base) + i * a.src_row_stride + d);
        v = a.src_dtype == DType::kF16 ? _mm512_cvtph_ps(h)
                                       : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      }
      _mm512_mask_storeu_ps(row + d, m, v);
    }
    return;
  }
  for (int64_t d = 0; d < D; ++d) {
    const int64_t e = i * a.src_row_stride + d * a.src_elem_stride;
    if (a.src_dtype == DType::kF32) row[d] = reinterpret_cast<const float*>(base)[e];
    else if (a.src_dtype == DType::kF16) row[d] = f16_bits_to_f32(reinterpret_cast<const uint16_t*>(base)[e]);
    else row[d] = bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(base)[e]);
  }
}

// p·q lane-wise (16 quaternions), in nn/rotation.cpp's order of operations.
CIDER_INLINE void qmul16(const __m512* p, const __m512* q, __m512* o) {
  o[0] = _mm512_sub_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_mul_ps(p[0], q[0]), _mm512_mul_ps(p[1], q[1])),
                                     _mm512_mul_ps(p[2], q[2])),
                       _mm512_mul_ps(p[3], q[3]));
  o[1] = _mm512_sub_ps(_mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p[0], q[1]), _mm512_mul_ps(p[1], q[0])),
                                     _mm512_mul_ps(p[2], q[3])),
                       _mm512_mul_ps(p[3], q[2]));
  o[2] = _mm512_add_ps(_mm512_add_ps(_mm512_sub_ps(_mm512_mul_ps(p[0], q[2]), _mm512_mul_ps(p[1], q[3])),
                                     _mm512_mul_ps(p[2], q[0])),
                       _mm512_mul_ps(p[3], q[1]));
  o[3] = _mm512_add_ps(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(p[0], q[3]), _mm512_mul_ps(p[1], q[2])),
                                     _mm512_mul_ps(p[2], q[1])),
                       _mm512_mul_ps(p[3], q[0]));
}

// 64 values (16 blocks of 4, blocks past `nb` zero) <-> four vectors of components (lanes = blocks).
CIDER_INLINE void deinterleave(const float* p, int64_t nb, __m512* c) {
  __m512 v[4];
  for (int k = 0; k < 4; ++k) {
    const int64_t n = nb * 4 - 16 * k;  // valid floats in vector k
    const __mmask16 m = n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
    v[k] = _mm512_maskz_loadu_ps(m, p + 16 * k);
  }
  const __m512i wx = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i yz = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const __m512 a_wx = _mm512_permutex2var_ps(v[0], wx, v[1]), a_yz = _mm512_permutex2var_ps(v[0], yz, v[1]);
  const __m512 b_wx = _mm512_permutex2var_ps(v[2], wx, v[3]), b_yz = _mm512_permutex2var_ps(v[2], yz, v[3]);
  c[0] = _mm512_permutex2var_ps(a_wx, lo, b_wx);
  c[1] = _mm512_permutex2var_ps(a_wx, hi, b_wx);
  c[2] = _mm512_permutex2var_ps(a_yz, lo, b_yz);
  c[3] = _mm512_permutex2var_ps(a_yz, hi, b_yz);
}

CIDER_INLINE void interleave(const __m512* c, int64_t nb, float* p) {
  // [w0 x0 w1 x1 .. w7 x7], [y0 z0 .. y7 z7] for blocks 0-7, then 8-15; then 4 blocks per output vector.
  const __m512i pair_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i pair_hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512 wx0 = _mm512_permutex2var_ps(c[0], pair_lo, c[1]), yz0 = _mm512_permutex2var_ps(c[2], pair_lo, c[3]);
  const __m512 wx1 = _mm512_permutex2var_ps(c[0], pair_hi, c[1]), yz1 = _mm512_permutex2var_ps(c[2], pair_hi, c[3]);
  const __m512i q_lo = _mm512_setr_epi32(0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23);
  const __m512i q_hi = _mm512_setr_epi32(8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31);
  const __m512 v[4] = {_mm512_permutex2var_ps(wx0, q_lo, yz0), _mm512_permutex2var_ps(wx0, q_hi, yz0),
                       _mm512_permutex2var_ps(wx1, q_lo, yz1), _mm512_permutex2var_ps(wx1, q_hi, yz1)};
  for (int k = 0; k < 4; ++k) {
    const int64_t n = nb * 4 - 16 * k;
    const __mmask16 m = n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
    _mm512_mask_storeu_ps(p + 16 * k, m, v[k]);
  }
}

// Rotates row[0, D) in place, 16 blocks at a time (a masked tail when D is not a multiple of 64). ql/qr hold the
// quaternion components deinterleaved per chunk of 16 blocks ([D/64 chunks][4][16]; qr already conjugated).
CIDER_INLINE void rotate_row(const KVAppendArgs& a, const float* ql, const float* qr, float* row) {
  const int64_t D = a.dim;
  for (int64_t d0 = 0, ch = 0; d0 < D; d0 += 64, ++ch) {
    const int64_t nb = (D - d0) >= 64 ? 16 : (D - d0) / 4;
    __m512 v[4], l[4], r[4], t[4];
    deinterleave(row + d0, nb, v);
    for (int k = 0; k < 4; ++k) l[k] = _mm512_load_ps(ql + (ch * 4 + k) * 16);
    qmul16(l, v, t);  // qL·v
    if (a.rotation == 2) {
      for (int k = 0; k < 4; ++k) r[k] = _mm512_load_ps(qr + (ch * 4 + k) * 16);
      qmul16(t, r, v);  // (qL·v)·conj(qR)
      interleave(v, nb, row + d0);
    } else {
      interleave(t, nb, row + d0);
    }
  }
}

// The quaternions of the call, deinterleaved once; conj(qR) = (r0, −r1, −r2, −r3) by exact negation.
CIDER_INLINE void prepare_quaternions(const KVAppendArgs& a, float* ql, float* qr) {
  for (int64_t d0 = 0, ch = 0; d0 < a.dim; d0 += 64, ++ch) {
    const int64_t nb = (a.dim - d0) >= 64 ? 16 : (a.dim - d0) / 4;
    __m512 c[4];
    deinterleave(a.qL + d0, nb, c);
    for (int k = 0; k < 4; ++k) _mm512_store_ps(ql + (ch * 4 + k) * 16, c[k]);
    if (a.rotation == 2) {
      deinterleave(a.qR + d0, nb, c);
      for (int k = 0; k < 4; ++k)
        _mm512_store_ps(qr + (ch * 4 + k) * 16, k == 0 ? c[k] : _mm512_sub_ps(_mm512_setzero_ps(), c[k]));
    }
  }
}

// One group: the scale/bias arithmetic of quant::affine_quantize_group (scalar float32), codes in SIMD.
CIDER_INLINE void quantize_group(const float* w, int gs, int bits, uint8_t* codes, float* scale_out,
                                 float* bias_out) {
  __m512 mn = _mm512_loadu_ps(w), mx = mn;
  for (int k = 16; k < gs; k += 16) {
    mn = _mm512_min_ps(mn, _mm512_loadu_ps(w + k));
    mx = _mm512_max_ps(mx, _mm512_loadu_ps(w + k));
  }
  const float lo = _mm512_reduce_min_ps(mn), hi = _mm512_reduce_max_ps(mx);
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const bool neg = __builtin_fabsf(lo) > __builtin_fabsf(hi);
  const float range = (hi - lo) / n_bins;
  float scale = range < eps ? eps : range;  // std::max(range, eps)
  scale = neg ? scale : -scale;
  const float edge = neg ? lo : hi;
  const float q0 = __builtin_rintf(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  const __m512 vb = _mm512_set1_ps(bias), vs = _mm512_set1_ps(scale), vn = _mm512_set1_ps(n_bins);
  for (int k = 0; k < gs; k += 16) {
    __m512 q = _mm512_div_ps(_mm512_sub_ps(_mm512_loadu_ps(w + k), vb), vs);
    q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(q, _mm512_setzero_ps()), vn);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
  }
  *scale_out = scale;
  *bias_out = bias;
}

// One group of symmetric codes: quant::symmetric_step (the scalar rule), codes in SIMD. Returns the stored step.
CIDER_INLINE float quantize_group_symmetric(const float* w, int gs, int bits, DType t, uint8_t* codes) {
  const float half = static_cast<float>(1 << (bits - 1)), top = static_cast<float>((1 << bits) - 1);
  const float d = quant::symmetric_step(w, gs, bits, t);
  if (d == 0.0f) {
    std::memset(codes, 1 << (bits - 1), static_cast<size_t>(gs));
    return d;
  }
  const __m512 vd = _mm512_set1_ps(d), vh = _mm512_set1_ps(half), vt = _mm512_set1_ps(top);
  for (int k = 0; k < gs; k += 16) {
    __m512 q = _mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(w + k), vd),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(q, vh), _mm512_setzero_ps()), vt);  // max(NaN, 0) = 0
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + k), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
  }
  return d;
}

// Packs n codes (n·bits a multiple of 32) into the little-endian bit stream of MLX's format.
CIDER_INLINE void pack(const uint8_t* codes, int n, int bits, uint32_t* words) {
  if (bits == 8) {
    std::memcpy(words, codes, static_cast<size_t>(n));
    return;
  }
  if (bits == 4) {
    for (int k = 0; k < n; k += 16) {
      const __m512i c = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k)));
      const __m512i c2 = _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k + 8)));
      // byte i = code 2i | code 2i+1 << 4: pairs of qwords combined, then truncated to bytes.
      const __m512i even = _mm512_permutex2var_epi64(c, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), c2);
      const __m512i odd = _mm512_permutex2var_epi64(c, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), c2);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(reinterpret_cast<uint8_t*>(words) + k / 2),
                       _mm512_cvtepi64_epi8(_mm512_or_si512(even, _mm512_slli_epi64(odd, 4))));
    }
    return;
  }
  // Other widths: a 64-bit accumulator (each group of 32 codes fills bits whole words).
  for (int k0 = 0; k0 < n; k0 += 32) {
    uint64_t acc = 0;
    int filled = 0;
    uint32_t* out = words + k0 * bits / 32;
    for (int k = 0; k < 32; ++k) {
      acc |= static_cast<uint64_t>(codes[k0 + k]) << filled;
      filled += bits;
      if (filled >= 32) {
        *out++ = static_cast<uint32_t>(acc);
        acc >>= 32;
        filled -= 32;
      }
    }
  }
}

CIDER_INLINE void store_scale(void* p, DType t, int64_t i, float v) {
  if (t == DType::kF32) static_cast<float*>(p)[i] = v;
  else if (t == DType::kF16) static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v);
  else static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
}

CIDER_AVX512 void append_rows(const KVAppendArgs& a, float* row, float* ql, float* qr) {
  const int64_t D = a.dim;
  const int64_t words = a.bits ? D * a.bits / 32 : 0, groups = a.bits ? D / a.group_size : 0;
  const int ss = a.dst_dtype == DType::kF32 ? 4 : 2;
  alignas(64) uint8_t codes[128];
  for (int64_t i = 0; i < a.n; ++i) {
    load_row(a, i, row);
    if (a.rotation == 3) hadamard_row(a.qL, D, row, false);  // qL = the signs (avx512/hadamard.h)
    else if (a.rotation != 0) rotate_row(a, ql, qr, row);
    if (a.bits == 0) {
      for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 m = D - d >= 16 ? __mmask16(0xffff) : __mmask16((1u << (D - d)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(m, row + d);
        if (a.dst_dtype == DType::kF32) {
          _mm512_mask_storeu_ps(static_cast<float*>(a.dst) + i * D + d, m, v);
        } else if (a.dst_dtype == DType::kF16) {
          _mm256_mask_storeu_epi16(static_cast<uint16_t*>(a.dst) + i * D + d, m,
                                   _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else {
          for (int64_t k = d; k < D && k < d + 16; ++k)
            static_cast<uint16_t*>(a.dst)[i * D + k] = f32_to_bf16_bits(row[k]);
        }
      }
      continue;
    }
    uint32_t* dst = static_cast<uint32_t*>(a.dst) + i * words;
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* scales = static_cast<uint8_t*>(a.scales) + i * groups * ss;
      if (a.symmetric) {
        const float d = quantize_group_symmetric(row + g * a.group_size, a.group_size, a.bits, a.dst_dtype, codes);
        pack(codes, a.group_size, a.bits, dst + g * a.group_size * a.bits / 32);
        store_scale(scales, a.dst_dtype, g, d);
        continue;
      }
      float s, b;
      quantize_group(row + g * a.group_size, a.group_size, a.bits, codes, &s, &b);
      pack(codes, a.group_size, a.bits, dst + g * a.group_size * a.bits / 32);
      store_scale(scales, a.dst_dtype, g, s);
      store_scale(static_cast<uint8_t*>(a.biases) + i * groups * ss, a.dst_dtype, g, b);
    }
  }
}

}  // namespace

void kv_append(const KVAppendArgs& a) {
  if (a.n <= 0) return;
  // Scratch: the row (padded to whole 64-value chunks) and the quaternions as [chunks][4][16] for qL and qR.
  const int64_t chunks = (a.dim + 63) / 64;
  float* row = static_cast<float*>(attn::thread_scratch(static_cast<size_t>(chunks * 64 * 3) * sizeof(float)));
  float* ql = row + chunks * 64;
  float* qr = ql + chunks * 64;
  if (a.rotation == 1 || a.rotation == 2) prepare_quaternions(a, ql, qr);
  append_rows(a, row, ql, qr);
}

}  // namespace cider::kernels::x86::avx512
