// AVX2 rotate + quantize + store of new KV rows, bit-identical to kernels/ref/kv_append_ref.cpp — the arithmetic
// argument of avx512/kv_append_avx512.cpp on 8 lanes. Blocks are deinterleaved 8 at a time with a 4×4 transpose in
// each 128-bit lane, so lane order is blocks 0,2,4,6 | 1,3,5,7 — the quaternions are deinterleaved the same way, and
// the transpose is its own inverse. Hadamard (rotation 3): as in the AVX-512 kernel, stages h = 1, 2, 4 inside a
// vector, h ≥ 8 between vectors.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/attention_x86.h"
#include "kernels/x86/avx2/hadamard.h"
#include "quant/affine.h"

#define CIDER_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CIDER_INLINE static inline __attribute__((always_inline)) CIDER_AVX2

namespace cider::kernels::x86::avx2 {

namespace {

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

CIDER_INLINE void load_row(const KVAppendArgs& a, int64_t i, float* row) {
  const int64_t D = a.dim;
  const uint8_t* base = static_cast<const uint8_t*>(a.src);
  if (a.src_elem_stride == 1) {
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) {
      __m256 v;
      if (a.src_dtype == DType::kF32) {
        v = _mm256_loadu_ps(reinterpret_cast<const float*>(base) + i * a.src_row_stride + d);
      } else {
        const __m128i h =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(base) + i * a.src_row_stride + d));
        v = a.src_dtype == DType::kF16 ? _mm256_cvtph_ps(h)
                                       : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      }
      _mm256_storeu_ps(row + d, v);
    }
    if (d == D) return;
  }
  for (int64_t d = 0; d < D; ++d) {
    const int64_t e = i * a.src_row_stride + d * a.src_elem_stride;
    if (a.src_dtype == DType::kF32) row[d] = reinterpret_cast<const float*>(base)[e];
    else if (a.src_dtype == DType::kF16) row[d] = _cvtsh_ss(reinterpret_cast<const uint16_t*>(base)[e]);
    else row[d] = bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(base)[e]);
  }
}

// p·q lane-wise, in nn/rotation.cpp's order of operations.
CIDER_INLINE void qmul8(const __m256* p, const __m256* q, __m256* o) {
  o[0] = _mm256_sub_ps(_mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(p[0], q[0]), _mm256_mul_ps(p[1], q[1])),
                                     _mm256_mul_ps(p[2], q[2])),
                       _mm256_mul_ps(p[3], q[3]));
  o[1] = _mm256_sub_ps(_mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p[0], q[1]), _mm256_mul_ps(p[1], q[0])),
                                     _mm256_mul_ps(p[2], q[3])),
                       _mm256_mul_ps(p[3], q[2]));
  o[2] = _mm256_add_ps(_mm256_add_ps(_mm256_sub_ps(_mm256_mul_ps(p[0], q[2]), _mm256_mul_ps(p[1], q[3])),
                                     _mm256_mul_ps(p[2], q[0])),
                       _mm256_mul_ps(p[3], q[1]));
  o[3] = _mm256_add_ps(_mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(p[0], q[3]), _mm256_mul_ps(p[1], q[2])),
                                     _mm256_mul_ps(p[2], q[1])),
                       _mm256_mul_ps(p[3], q[0]));
}

// 4×4 transposes inside each 128-bit lane: 8 blocks (32 floats) <-> components w, x, y, z (lanes = blocks 0,2,4,6 |
// 1,3,5,7). Its own inverse.
CIDER_INLINE void transpose44(const __m256* v, __m256* c) {
  const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
  const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
  c[0] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
  c[1] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
  c[2] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
  c[3] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
}

// Loads 8 blocks (32 floats; blocks past nb read as 0) and returns their components.
CIDER_INLINE void load_blocks(const float* p, int64_t nb, __m256* c) {
  __m256 v[4];
  for (int k = 0; k < 4; ++k) {
    const int64_t n = nb * 4 - 8 * k;
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 0 ? 0 : n > 8 ? 8 : n)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    v[k] = _mm256_maskload_ps(p + 8 * k, m);
  }
  transpose44(v, c);
}

CIDER_INLINE void store_blocks(const __m256* c, int64_t nb, float* p) {
  __m256 v[4];
  transpose44(c, v);
  for (int k = 0; k < 4; ++k) {
    const int64_t n = nb * 4 - 8 * k;
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 0 ? 0 : n > 8 ? 8 : n)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(p + 8 * k, m, v[k]);
  }
}

CIDER_INLINE void rotate_row(const KVAppendArgs& a, const float* ql, const float* qr, float* row) {
  for (int64_t d0 = 0, ch = 0; d0 < a.dim; d0 += 32, ++ch) {
    const int64_t nb = (a.dim - d0) >= 32 ? 8 : (a.dim - d0) / 4;
    __m256 v[4], l[4], r[4], t[4];
    load_blocks(row + d0, nb, v);
    for (int k = 0; k < 4; ++k) l[k] = _mm256_load_ps(ql + (ch * 4 + k) * 8);
    qmul8(l, v, t);  // qL·v
    if (a.rotation == 2) {
      for (int k = 0; k < 4; ++k) r[k] = _mm256_load_ps(qr + (ch * 4 + k) * 8);
      qmul8(t, r, v);  // (qL·v)·conj(qR)
      store_blocks(v, nb, row + d0);
    } else {
      store_blocks(t, nb, row + d0);
    }
  }
}

CIDER_INLINE void prepare_quaternions(const KVAppendArgs& a, float* ql, float* qr) {
  for (int64_t d0 = 0, ch = 0; d0 < a.dim; d0 += 32, ++ch) {
    const int64_t nb = (a.dim - d0) >= 32 ? 8 : (a.dim - d0) / 4;
    __m256 c[4];
    load_blocks(a.qL + d0, nb, c);
    for (int k = 0; k < 4; ++k) _mm256_store_ps(ql + (ch * 4 + k) * 8, c[k]);
    if (a.rotation == 2) {
      load_blocks(a.qR + d0, nb, c);
      for (int k = 0; k < 4; ++k)
        _mm256_store_ps(qr + (ch * 4 + k) * 8, k == 0 ? c[k] : _mm256_sub_ps(_mm256_setzero_ps(), c[k]));
    }
  }
}

CIDER_INLINE float hmin8(__m256 v) {
  __m128 m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_min_ps(m, _mm_movehl_ps(m, m));
  m = _mm_min_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
CIDER_INLINE float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// One group: quant::affine_quantize_group's scale/bias arithmetic (scalar float32), codes 8 lanes at a time.
CIDER_INLINE void quantize_group(const float* w, int gs, int bits, uint8_t* codes, float* scale_out,
                                 float* bias_out) {
  __m256 mn = _mm256_loadu_ps(w), mx = mn;
  for (int k = 8; k < gs; k += 8) {
    mn = _mm256_min_ps(mn, _mm256_loadu_ps(w + k));
    mx = _mm256_max_ps(mx, _mm256_loadu_ps(w + k));
  }
  const float lo = hmin8(mn), hi = hmax8(mx);
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const bool neg = __builtin_fabsf(lo) > __builtin_fabsf(hi);
  const float range = (hi - lo) / n_bins;
  float scale = range < eps ? eps : range;
  scale = neg ? scale : -scale;
  const float edge = neg ? lo : hi;
  const float q0 = __builtin_rintf(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  const __m256 vb = _mm256_set1_ps(bias), vs = _mm256_set1_ps(scale), vn = _mm256_set1_ps(n_bins);
  for (int k = 0; k < gs; k += 32) {
    __m256i c[4];
    for (int u = 0; u < 4; ++u) {
      __m256 q = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(w + k + 8 * u), vb), vs);
      q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), vn);
      c[u] = _mm256_cvttps_epi32(q);
    }
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
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
  const __m256 vd = _mm256_set1_ps(d), vh = _mm256_set1_ps(half), vt = _mm256_set1_ps(top);
  for (int k = 0; k < gs; k += 32) {
    __m256i c[4];
    for (int u = 0; u < 4; ++u) {
      __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(w + k + 8 * u), vd),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      q = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(q, vh), _mm256_setzero_ps()), vt);  // max(NaN, 0) = 0
      c[u] = _mm256_cvttps_epi32(q);
    }
    const __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + k),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  return d;
}

// MLX's little-endian bit stream, each group of 32 codes filling `bits` whole words.
CIDER_INLINE void pack(const uint8_t* codes, int n, int bits, uint32_t* words) {
  if (bits == 8) {
    std::memcpy(words, codes, static_cast<size_t>(n));
    return;
  }
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

CIDER_INLINE void store_value(void* p, DType t, int64_t i, float v) {
  if (t == DType::kF32) static_cast<float*>(p)[i] = v;
  else if (t == DType::kF16) static_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v);
  else static_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
}

CIDER_AVX2 void append_rows(const KVAppendArgs& a, float* row, const float* ql, const float* qr) {
  const int64_t D = a.dim;
  const int64_t words = a.bits ? D * a.bits / 32 : 0, groups = a.bits ? D / a.group_size : 0;
  const int ss = a.dst_dtype == DType::kF32 ? 4 : 2;
  alignas(32) uint8_t codes[128];
  for (int64_t i = 0; i < a.n; ++i) {
    load_row(a, i, row);
    if (a.rotation == 3) hadamard_row(a.qL, D, row, false);  // qL = the signs (avx2/hadamard.h)
    else if (a.rotation != 0) rotate_row(a, ql, qr, row);
    if (a.bits == 0) {
      int64_t d = 0;
      if (a.dst_dtype == DType::kF32) {
        for (; d + 8 <= D; d += 8) _mm256_storeu_ps(static_cast<float*>(a.dst) + i * D + d, _mm256_loadu_ps(row + d));
      } else if (a.dst_dtype == DType::kF16) {
        for (; d + 8 <= D; d += 8)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(a.dst) + i * D + d),
                           _mm256_cvtps_ph(_mm256_loadu_ps(row + d), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      for (; d < D; ++d) store_value(a.dst, a.dst_dtype, i * D + d, row[d]);
      continue;
    }
    uint32_t* dst = static_cast<uint32_t*>(a.dst) + i * words;
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* scales = static_cast<uint8_t*>(a.scales) + i * groups * ss;
      if (a.symmetric) {
        const float d = quantize_group_symmetric(row + g * a.group_size, a.group_size, a.bits, a.dst_dtype, codes);
        pack(codes, a.group_size, a.bits, dst + g * a.group_size * a.bits / 32);
        store_value(scales, a.dst_dtype, g, d);
        continue;
      }
      float s, b;
      quantize_group(row + g * a.group_size, a.group_size, a.bits, codes, &s, &b);
      pack(codes, a.group_size, a.bits, dst + g * a.group_size * a.bits / 32);
      store_value(scales, a.dst_dtype, g, s);
      store_value(static_cast<uint8_t*>(a.biases) + i * groups * ss, a.dst_dtype, g, b);
    }
  }
}

}  // namespace

void kv_append(const KVAppendArgs& a) {
  if (a.n <= 0) return;
  const int64_t chunks = (a.dim + 31) / 32;
  float* row = static_cast<float*>(attn::thread_scratch(static_cast<size_t>(chunks * 32 * 3) * sizeof(float)));
  float* ql = row + chunks * 32;
  float* qr = ql + chunks * 32;
  if (a.rotation == 1 || a.rotation == 2) prepare_quaternions(a, ql, qr);
  append_rows(a, row, ql, qr);
}

}  // namespace cider::kernels::x86::avx2
