// Dense float linear (f32 / f16 / bf16 weights, f32 activations), AVX-512. Contract: DenseGemmArgs
// (kernels/kernel_table.h); reference: ref/dense_gemm_ref.cpp.
//
// Weights are widened to float32 exactly (f16 by vcvtph2ps, bf16 by a 16-bit shift) and multiplied in float32 with
// FMA, so the only differences from the reference are the order of the K additions and the fused roundings — both
// inside the (K + 1)·u·Σ|x·w| bound the tests use. bf16 weights do not use vdpbf16ps: it would round the float32
// activations to bfloat16, which the contract (x float32) does not allow.
//   M = 1: 16 weight rows are streamed together, one FMA accumulator each, reduced in one transposed tree.
//   M > 1: 32-column panels of K-chunks are widened and transposed once into [k][32] and reused by every row;
//          a 12x32 tile (24 zmm accumulators) runs FMA with the activation broadcast from memory.
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int kRows = 16;
constexpr int kMR = 12;
constexpr int64_t kNR = 32;
constexpr int64_t kKc = 256;

void gemv_blocks(void* ctx, int64_t b0, int64_t b1) {
  const DenseGemmArgs& a = *static_cast<const DenseGemmArgs*>(ctx);
  const int64_t esize = a.w_dtype == DType::kF32 ? 4 : 2;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n0 = b * kRows, rows = imin(kRows, a.N - n0);
    const uint8_t* w[kRows];
    for (int r = 0; r < kRows; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (n0 + imin(r, rows - 1)) * a.K * esize;
    __m512 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < a.K; k += 16) {
      const __mmask16 m = mask16(a.K - k);
      const __m512 xv = _mm512_maskz_loadu_ps(m, a.x + k);
      for (int r = 0; r < kRows; ++r) acc[r] = _mm512_fmadd_ps(load16(w[r], a.w_dtype, k, m), xv, acc[r]);
    }
    const __mmask16 rmask = mask16(rows);
    __m512 y = reduce16_ps(acc);
    if (a.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(rmask, a.bias + n0));
    _mm512_mask_storeu_ps(a.out + n0, rmask, y);
  }
}

// Widens and transposes weight rows n0..n0+31 (rows past N repeat the last), k in [k0, k0 + kc), into out[kc][32].
void pack(const DenseGemmArgs& a, int64_t n0, int64_t k0, int64_t kc, float* out) {
  for (int64_t j = 0; j < kNR / 16; ++j) {
    int64_t rows[16];
    for (int r = 0; r < 16; ++r) rows[r] = imin(n0 + j * 16 + r, a.N - 1) * a.K;
    for (int64_t kb = 0; kb < kc; kb += 16) {
      const __mmask16 m = mask16(kc - kb);
      __m512i v[16];
      for (int r = 0; r < 16; ++r) v[r] = _mm512_castps_si512(load16(a.w, a.w_dtype, rows[r] + k0 + kb, m));
      transpose16x16(v);
      for (int i = 0; i < 16 && kb + i < kc; ++i) _mm512_store_si512(out + (kb + i) * kNR + j * 16, v[i]);
    }
  }
}

template <int MR>
void tile(const float* A, int64_t lda, const float* B, int64_t kc, float* C) {
  __m512 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(B + k * kNR), b1 = _mm512_load_ps(B + k * kNR + 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 x = _mm512_set1_ps(A[m * lda + k]);
      acc[m][0] = _mm512_fmadd_ps(x, b0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(x, b1, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    float* c = C + m * kNR;
    _mm512_store_ps(c, _mm512_add_ps(_mm512_load_ps(c), acc[m][0]));
    _mm512_store_ps(c + 16, _mm512_add_ps(_mm512_load_ps(c + 16), acc[m][1]));
  }
}

template <int MR>
void tile_upto(int mr, const float* A, int64_t lda, const float* B, int64_t kc, float* C) {
  if constexpr (MR > 1) {
    if (mr < MR) return tile_upto<MR - 1>(mr, A, lda, B, kc, C);
  }
  tile<MR>(A, lda, B, kc, C);
}

void gemm_panels(void* ctx, int64_t p0, int64_t p1) {
  const DenseGemmArgs& a = *static_cast<const DenseGemmArgs*>(ctx);
  float* packed = static_cast<float*>(scratch(1, static_cast<size_t>(kKc * kNR * 4)));
  float* C = static_cast<float*>(scratch(2, static_cast<size_t>(a.M * kNR * 4)));
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kNR, cols = imin(kNR, a.N - n0);
    for (int64_t i = 0; i < a.M * kNR; i += 16) _mm512_store_ps(C + i, _mm512_setzero_ps());
    for (int64_t k0 = 0; k0 < a.K; k0 += kKc) {
      const int64_t kc = imin(kKc, a.K - k0);
      pack(a, n0, k0, kc, packed);
      for (int64_t m0 = 0; m0 < a.M; m0 += kMR)
        tile_upto<kMR>(static_cast<int>(imin(kMR, a.M - m0)), a.x + m0 * a.K + k0, a.K, packed, kc, C + m0 * kNR);
    }
    for (int64_t m = 0; m < a.M; ++m)
      for (int j = 0; j < 2 && j * 16 < cols; ++j) {
        const __mmask16 cm = mask16(cols - j * 16);
        __m512 y = _mm512_load_ps(C + m * kNR + j * 16);
        if (a.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(cm, a.bias + n0 + j * 16));
        _mm512_mask_storeu_ps(a.out + m * a.N + n0 + j * 16, cm, y);
      }
  }
}

}  // namespace

void dense_gemm(const DenseGemmArgs& a) {
  if (a.M == 0 || a.N == 0) return;
  if (a.K == 0) return ref::dense_gemm(a);
  if (a.M == 1) {
    parallel_chunks((a.N + kRows - 1) / kRows, &gemv_blocks, const_cast<DenseGemmArgs*>(&a));
  } else {
    parallel_chunks((a.N + kNR - 1) / kNR, &gemm_panels, const_cast<DenseGemmArgs*>(&a));
  }
}

}  // namespace cider::kernels::x86::avx512
