// W8A8 and W4A8 GEMM (M > 1), AVX2. Contract: IntLinearArgs (kernels/kernel_table.h); references:
// ref/w8a8_ref.cpp, ref/w4a8_ref.cpp.
//
// AVX2 has no byte dot product that cannot saturate for int8 × int8, so both operands are widened to int16 and
// multiplied with vpmaddwd (pairs of int16 products summed into int32: exact, no offset correction needed).
// Front: tokens quantized (in parallel) to int8 codes, then widened to int16 [M, Kp]. Per 16-column panel and K
// chunk (one group, or 256 values per channel), the weights are packed once as int16 pairs [chunk/2][16][2] (int4:
// the signed code q) and reused by every token; a 6x16 tile (12 ymm accumulators) runs vpmaddwd with two
// activation codes broadcast. Flush and epilogue as the AVX-512 kernel: C[m, n] += fl(sw[g, n]·float(acc_g)) per
// group, or int32 sums across chunks per channel; y = sx[m]·C + bias.
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

constexpr int kMR = 6;
constexpr int64_t kNR = 16;
constexpr int64_t kChunkPerChannel = 256;

struct Gemm {
  const IntLinearArgs* a;
  bool int4;
  int16_t* xq;  // [M, Kp]
  int64_t Kp;
  float* sx;    // [M]
  int64_t span, chunk;
};

// Packs weight rows n0..n0+15 (past N: the last row), k in [k0, k0 + kc), as int16 pairs [ceil(kc/2)][16][2].
void pack_panel(const Gemm& c, int64_t n0, int64_t k0, int64_t kc, int16_t* out) {
  const IntLinearArgs& a = *c.a;
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t j = 0; j < kNR; ++j) {
    const int64_t n = imin(n0 + j, a.N - 1);
    if (!c.int4) {
      const int8_t* row = static_cast<const int8_t*>(a.w) + n * a.K + k0;
      for (int64_t k = 0; k < kc; ++k) out[(k / 2) * 32 + j * 2 + (k & 1)] = row[k];
    } else {
      const uint8_t* row = static_cast<const uint8_t*>(a.w) + n * (a.K / 2);
      for (int64_t k = 0; k < kc; ++k) {
        const int64_t e = k0 + k;
        const int nib = (e & 1) ? row[e >> 1] >> 4 : row[e >> 1] & 0x0f;
        out[(k / 2) * 32 + j * 2 + (k & 1)] = static_cast<int16_t>(nib - 8);
      }
    }
    if (kc & 1) out[(pairs - 1) * 32 + j * 2 + 1] = 0;
  }
}

template <int MR>
void tile(const int16_t* A, int64_t lda, const int16_t* B, int64_t steps, const float* sw, int64_t cols, float* cf,
          int32_t* ci) {
  __m256i acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_si256();
  for (int64_t s = 0; s < steps; ++s) {
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(B + s * 32));
    const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(B + s * 32 + 16));
    for (int m = 0; m < MR; ++m) {
      int32_t word;
      std::memcpy(&word, A + m * lda + 2 * s, 4);
      const __m256i x = _mm256_set1_epi32(word);
      acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_madd_epi16(b0, x));
      acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_madd_epi16(b1, x));
    }
  }
  if (cf) {
    for (int j = 0; j < 2; ++j) {
      const __m256 s = load8(sw, DType::kF32, j * 8, cols - j * 8);
      for (int m = 0; m < MR; ++m) {
        float* p = cf + m * kNR + j * 8;
        _mm256_store_ps(p, _mm256_add_ps(_mm256_load_ps(p), _mm256_mul_ps(s, _mm256_cvtepi32_ps(acc[m][j]))));
      }
    }
  } else {
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 2; ++j) {
        __m256i* p = reinterpret_cast<__m256i*>(ci + m * kNR + j * 8);
        _mm256_store_si256(p, _mm256_add_epi32(_mm256_load_si256(p), acc[m][j]));
      }
  }
}

template <int MR>
void tile_upto(int mr, const int16_t* A, int64_t lda, const int16_t* B, int64_t steps, const float* sw, int64_t cols,
               float* cf, int32_t* ci) {
  if constexpr (MR > 1) {
    if (mr < MR) return tile_upto<MR - 1>(mr, A, lda, B, steps, sw, cols, cf, ci);
  }
  tile<MR>(A, lda, B, steps, sw, cols, cf, ci);
}

void run_panels(void* ctx, int64_t p0, int64_t p1) {
  const Gemm& c = *static_cast<const Gemm*>(ctx);
  const IntLinearArgs& a = *c.a;
  const bool grouped = a.group_size != 0;
  int16_t* packed = static_cast<int16_t*>(scratch(1, static_cast<size_t>(round_up(c.chunk, 2) * kNR * 2)));
  void* tile_buf = scratch(2, static_cast<size_t>(a.M * kNR * 4));
  float* cf = grouped ? static_cast<float*>(tile_buf) : nullptr;
  int32_t* ci = grouped ? nullptr : static_cast<int32_t*>(tile_buf);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kNR, cols = imin(kNR, a.N - n0);
    std::memset(tile_buf, 0, static_cast<size_t>(a.M * kNR * 4));
    for (int64_t k0 = 0, g = 0; k0 < a.K; k0 += c.chunk, ++g) {
      const int64_t kc = imin(c.chunk, a.K - k0);
      pack_panel(c, n0, k0, kc, packed);
      const float* sw = grouped ? a.w_scales + g * a.N + n0 : nullptr;
      for (int64_t m0 = 0; m0 < a.M; m0 += kMR)
        tile_upto<kMR>(static_cast<int>(imin(kMR, a.M - m0)), c.xq + m0 * c.Kp + k0, c.Kp, packed, (kc + 1) / 2, sw,
                       cols, cf ? cf + m0 * kNR : nullptr, ci ? ci + m0 * kNR : nullptr);
    }
    for (int64_t m = 0; m < a.M; ++m) {
      const __m256 sx = _mm256_set1_ps(c.sx[m]);
      for (int j = 0; j < 2 && j * 8 < cols; ++j) {
        const int64_t n = n0 + j * 8, cn = cols - j * 8;
        __m256 y;
        if (grouped) {
          y = _mm256_mul_ps(sx, _mm256_load_ps(cf + m * kNR + j * 8));
        } else {
          const __m256i t = _mm256_load_si256(reinterpret_cast<const __m256i*>(ci + m * kNR + j * 8));
          y = _mm256_mul_ps(sx, _mm256_mul_ps(load8(a.w_scales, DType::kF32, n, cn), _mm256_cvtepi32_ps(t)));
        }
        if (a.bias) y = _mm256_add_ps(y, load8(a.bias, DType::kF32, n, cn));
        store8(a.out, a.out_dtype, m * a.N + n, y, cn);
      }
    }
  }
}

void quantize_rows(void* ctx, int64_t m0, int64_t m1) {
  const Gemm& c = *static_cast<const Gemm*>(ctx);
  const IntLinearArgs& a = *c.a;
  const int64_t row_bytes = a.K * esize(a.x_dtype);
  int8_t* q8 = static_cast<int8_t*>(scratch(3, static_cast<size_t>(c.Kp)));
  for (int64_t m = m0; m < m1; ++m) {
    c.sx[m] = quantize_row(static_cast<const uint8_t*>(a.x) + m * row_bytes, a.x_dtype, a.K, c.Kp, q8);
    int16_t* dst = c.xq + m * c.Kp;
    for (int64_t k = 0; k < c.Kp; k += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k),
                          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q8 + k))));
  }
}

void int_gemm(const IntLinearArgs& a, bool int4) {
  const int64_t Kp = round_up(a.K, 16);
  uint8_t* front = static_cast<uint8_t*>(scratch(0, static_cast<size_t>(a.M * Kp * 2 + 4 * a.M + 64)));
  Gemm c{&a, int4, reinterpret_cast<int16_t*>(front), Kp, reinterpret_cast<float*>(front + a.M * Kp * 2),
         a.group_size == 0 ? a.K : a.group_size, a.group_size == 0 ? kChunkPerChannel : a.group_size};
  parallel_chunks(a.M, &quantize_rows, &c);
  parallel_chunks((a.N + kNR - 1) / kNR, &run_panels, &c);
}

}  // namespace

void w8a8_gemm(const IntLinearArgs& a) {
  if (a.K == 0 || a.N == 0 || a.M == 0) return ref::w8a8_gemm(a);
  int_gemm(a, false);
}

void w4a8_gemm(const IntLinearArgs& a) {
  if (a.K == 0 || a.N == 0 || a.M == 0) return ref::w4a8_gemm(a);
  int_gemm(a, true);
}

}  // namespace cider::kernels::x86::avx2
