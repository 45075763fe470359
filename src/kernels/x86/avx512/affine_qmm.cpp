// MLX affine quantized matmul, AVX-512: transpose = true (w [N, K·bits/32], the layout of MLX linear layers) with
// 4 or 8 bits. Every other case (2, 3, 5, 6 bits; transpose = false) calls ref::affine_qmm — a documented per-case
// fallback of this table entry (kernels/kernel_table.cpp). Contract: AffineQmmArgs; reference:
// ref/affine_qmm_ref.cpp.
//
// Per output channel n and group g: s_g·(Σ_{k∈g} x_k·q_k) + b_g·(Σ_{k∈g} x_k), the codes never expanded to a float
// matrix. The codes are widened to float32 16 at a time (4 bits: bytes → dwords, low and high nibbles separately, the
// activations permuted once to [even 16 | odd 16] per 32 so lanes line up; 8 bits: bytes → dwords), multiplied by
// x with FMA into a per-group vector that is scaled by s_g into the row's accumulator; Σx per group is computed once
// per token. Only the order of float additions and the FMA roundings differ from the reference.
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int kMR = 4;  // tokens sharing one decode of the codes

struct Qmm {
  const AffineQmmArgs* a;
  const float* xs;    // [M, K] float32, permuted per 32 for 4 bits
  const float* xsum;  // [M, G] Σ_{k∈g} x
  int64_t G;
};

static inline float load1(const void* p, DType t, int64_t i) { return _mm512_cvtss_f32(load16(p, t, i, 1)); }

// Dot products of one row of codes with MR token rows, group by group.
template <int MR>
void row(const Qmm& c, int64_t n, int64_t m0) {
  const AffineQmmArgs& a = *c.a;
  const int gs = a.group_size;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(a.w + n * (a.K * a.bits / 32));
  __m512 acc[MR];
  float tail[MR];
  for (int m = 0; m < MR; ++m) {
    acc[m] = _mm512_setzero_ps();
    tail[m] = 0.0f;
  }
  const __m512i low4 = _mm512_set1_epi32(0x0f);
  for (int64_t g = 0; g < c.G; ++g) {
    __m512 dot[MR];
    for (int m = 0; m < MR; ++m) dot[m] = _mm512_setzero_ps();
    const int64_t k0 = g * gs;
    if (a.bits == 4) {
      for (int64_t k = k0; k < k0 + gs; k += 32) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2)));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, low4));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
        for (int m = 0; m < MR; ++m) {
          const float* x = c.xs + (m0 + m) * a.K + k;
          dot[m] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x), dot[m]);
          dot[m] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), dot[m]);
        }
      }
    } else {
      for (int64_t k = k0; k < k0 + gs; k += 16) {
        const __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k))));
        for (int m = 0; m < MR; ++m) dot[m] = _mm512_fmadd_ps(q, _mm512_loadu_ps(c.xs + (m0 + m) * a.K + k), dot[m]);
      }
    }
    const float s = load1(a.scales, a.scale_dtype, n * c.G + g), bb = load1(a.biases, a.scale_dtype, n * c.G + g);
    const __m512 vs = _mm512_set1_ps(s);
    for (int m = 0; m < MR; ++m) {
      acc[m] = _mm512_fmadd_ps(vs, dot[m], acc[m]);
      tail[m] += bb * c.xsum[(m0 + m) * c.G + g];
    }
  }
  for (int m = 0; m < MR; ++m)
    store16(a.out, a.out_dtype, (m0 + m) * a.N + n, _mm512_set1_ps(_mm512_reduce_add_ps(acc[m]) + tail[m]), 1);
}

void rows(void* ctx, int64_t n0, int64_t n1) {
  const Qmm& c = *static_cast<const Qmm*>(ctx);
  const int64_t M = c.a->M;
  for (int64_t m0 = 0; m0 < M; m0 += kMR) {
    const int64_t mr = imin(kMR, M - m0);
    for (int64_t n = n0; n < n1; ++n) {
      switch (mr) {
        case 4: row<4>(c, n, m0); break;
        case 3: row<3>(c, n, m0); break;
        case 2: row<2>(c, n, m0); break;
        default: row<1>(c, n, m0); break;
      }
    }
  }
}

void prepare(void* ctx, int64_t m0, int64_t m1) {
  const Qmm& c = *static_cast<const Qmm*>(ctx);
  const AffineQmmArgs& a = *c.a;
  float* xs = const_cast<float*>(c.xs);
  float* xsum = const_cast<float*>(c.xsum);
  for (int64_t m = m0; m < m1; ++m) {
    float* dst = xs + m * a.K;
    for (int64_t k = 0; k < a.K; k += 16) _mm512_storeu_ps(dst + k, load16(a.x, a.x_dtype, m * a.K + k, 0xffff));
    for (int64_t g = 0; g < c.G; ++g) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t k = g * a.group_size; k < (g + 1) * a.group_size; k += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(dst + k));
      xsum[m * c.G + g] = _mm512_reduce_add_ps(s);
    }
    if (a.bits == 4) {  // [even 16 | odd 16] per 32 values
      const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
      const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
      for (int64_t k = 0; k < a.K; k += 32) {
        const __m512 v0 = _mm512_loadu_ps(dst + k), v1 = _mm512_loadu_ps(dst + k + 16);
        _mm512_storeu_ps(dst + k, _mm512_permutex2var_ps(v0, even, v1));
        _mm512_storeu_ps(dst + k + 16, _mm512_permutex2var_ps(v0, odd, v1));
      }
    }
  }
}

}  // namespace

void affine_qmm(const AffineQmmArgs& a) {
  if (!a.transpose || (a.bits != 4 && a.bits != 8) || a.M == 0 || a.N == 0 || a.K == 0) return ref::affine_qmm(a);
  // K is a multiple of the group size (32, 64 or 128), hence of 32.
  const int64_t G = a.K / a.group_size;
  float* buf = static_cast<float*>(scratch(0, static_cast<size_t>(a.M * a.K + a.M * G) * 4));
  Qmm c{&a, buf, buf + a.M * a.K, G};
  parallel_chunks(a.M, &prepare, &c);
  parallel_chunks(a.N, &rows, &c);
}

}  // namespace cider::kernels::x86::avx512
