// MLX affine quantized matmul, AVX2 + FMA: transpose = true with 4 or 8 bits, as the AVX-512 kernel 8 lanes wide
// (4 bits: activations permuted to [even 8 | odd 8] per 16). Every other case calls ref::affine_qmm — a documented
// per-case fallback of this table entry (kernels/kernel_table.cpp). Contract: AffineQmmArgs; reference:
// ref/affine_qmm_ref.cpp.
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

constexpr int kMR = 4;

struct Qmm {
  const AffineQmmArgs* a;
  float* xs;    // [M, K] float32 (4 bits: permuted per 16)
  float* xsum;  // [M, G]
  int64_t G;
};

static inline float load1(const void* p, DType t, int64_t i) { return _mm256_cvtss_f32(load8(p, t, i, 1)); }

template <int MR>
void row(const Qmm& c, int64_t n, int64_t m0) {
  const AffineQmmArgs& a = *c.a;
  const int gs = a.group_size;
  const uint8_t* w = reinterpret_cast<const uint8_t*>(a.w + n * (a.K * a.bits / 32));
  __m256 acc[MR];
  float tail[MR];
  for (int m = 0; m < MR; ++m) {
    acc[m] = _mm256_setzero_ps();
    tail[m] = 0.0f;
  }
  const __m256i low4 = _mm256_set1_epi32(0x0f);
  for (int64_t g = 0; g < c.G; ++g) {
    __m256 dot[MR];
    for (int m = 0; m < MR; ++m) dot[m] = _mm256_setzero_ps();
    const int64_t k0 = g * gs;
    if (a.bits == 4) {
      for (int64_t k = k0; k < k0 + gs; k += 16) {
        int64_t word;
        std::memcpy(&word, w + k / 2, 8);
        const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(word));
        const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(b, low4));
        const __m256 hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
        for (int m = 0; m < MR; ++m) {
          const float* x = c.xs + (m0 + m) * a.K + k;
          dot[m] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x), dot[m]);
          dot[m] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + 8), dot[m]);
        }
      }
    } else {
      for (int64_t k = k0; k < k0 + gs; k += 8) {
        int64_t word;
        std::memcpy(&word, w + k, 8);
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(word)));
        for (int m = 0; m < MR; ++m) dot[m] = _mm256_fmadd_ps(q, _mm256_loadu_ps(c.xs + (m0 + m) * a.K + k), dot[m]);
      }
    }
    const __m256 vs = _mm256_set1_ps(load1(a.scales, a.scale_dtype, n * c.G + g));
    const float bb = load1(a.biases, a.scale_dtype, n * c.G + g);
    for (int m = 0; m < MR; ++m) {
      acc[m] = _mm256_fmadd_ps(vs, dot[m], acc[m]);
      tail[m] += bb * c.xsum[(m0 + m) * c.G + g];
    }
  }
  for (int m = 0; m < MR; ++m)
    store8(a.out, a.out_dtype, (m0 + m) * a.N + n, _mm256_set1_ps(hsum_ps(acc[m]) + tail[m]), 1);
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
  for (int64_t m = m0; m < m1; ++m) {
    float* dst = c.xs + m * a.K;
    for (int64_t k = 0; k < a.K; k += 8) _mm256_storeu_ps(dst + k, load8(a.x, a.x_dtype, m * a.K + k, 8));
    for (int64_t g = 0; g < c.G; ++g) {
      __m256 s = _mm256_setzero_ps();
      for (int64_t k = g * a.group_size; k < (g + 1) * a.group_size; k += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(dst + k));
      c.xsum[m * c.G + g] = hsum_ps(s);
    }
    if (a.bits == 4) {  // [even 8 | odd 8] per 16 values
      alignas(32) float t[16];
      for (int64_t k = 0; k < a.K; k += 16) {
        for (int j = 0; j < 8; ++j) {
          t[j] = dst[k + 2 * j];
          t[8 + j] = dst[k + 2 * j + 1];
        }
        std::memcpy(dst + k, t, sizeof t);
      }
    }
  }
}

}  // namespace

void affine_qmm(const AffineQmmArgs& a) {
  if (!a.transpose || (a.bits != 4 && a.bits != 8) || a.M == 0 || a.N == 0 || a.K == 0) return ref::affine_qmm(a);
  const int64_t G = a.K / a.group_size;
  float* buf = static_cast<float*>(scratch(0, static_cast<size_t>(a.M * a.K + a.M * G) * 4));
  Qmm c{&a, buf, buf + a.M * a.K, G};
  parallel_chunks(a.M, &prepare, &c);
  parallel_chunks(a.N, &rows, &c);
}

}  // namespace cider::kernels::x86::avx2
