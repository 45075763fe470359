// Dense float linear (f32 / f16 / bf16 weights, f32 activations), AVX2 + FMA + F16C. Contract: DenseGemmArgs;
// reference: ref/dense_gemm_ref.cpp. As the AVX-512 kernel, 8 lanes wide: weights widened exactly, float32 FMA.
//   M = 1: 8 weight rows streamed together, reduced in one transposed hadd tree.
//   M > 1: 16-column panels of K chunks widened into [k][16] once, 6x16 FMA tiles (12 ymm accumulators).
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

constexpr int kRows = 8;
constexpr int kMR = 6;
constexpr int64_t kNR = 16;
constexpr int64_t kKc = 256;

void gemv_blocks(void* ctx, int64_t b0, int64_t b1) {
  const DenseGemmArgs& a = *static_cast<const DenseGemmArgs*>(ctx);
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t n0 = b * kRows, rows = imin(kRows, a.N - n0);
    int64_t off[kRows];
    for (int r = 0; r < kRows; ++r) off[r] = (n0 + imin(r, rows - 1)) * a.K;
    __m256 acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= a.K; k += 8) {
      const __m256 xv = _mm256_loadu_ps(a.x + k);
      for (int r = 0; r < kRows; ++r) acc[r] = _mm256_fmadd_ps(load8(a.w, a.w_dtype, off[r] + k, 8), xv, acc[r]);
    }
    if (k < a.K) {
      const __m256 xv = load8(a.x, DType::kF32, k, a.K - k);
      for (int r = 0; r < kRows; ++r) acc[r] = _mm256_fmadd_ps(load8(a.w, a.w_dtype, off[r] + k, a.K - k), xv, acc[r]);
    }
    __m256 y = reduce8_ps(acc);
    if (a.bias) y = _mm256_add_ps(y, load8(a.bias, DType::kF32, n0, rows));
    store8(a.out, DType::kF32, n0, y, rows);
  }
}

template <int MR>
void tile(const float* A, int64_t lda, const float* B, int64_t kc, float* C) {
  __m256 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(B + k * kNR), b1 = _mm256_load_ps(B + k * kNR + 8);
    for (int m = 0; m < MR; ++m) {
      const __m256 x = _mm256_broadcast_ss(A + m * lda + k);
      acc[m][0] = _mm256_fmadd_ps(x, b0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(x, b1, acc[m][1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    float* c = C + m * kNR;
    _mm256_store_ps(c, _mm256_add_ps(_mm256_load_ps(c), acc[m][0]));
    _mm256_store_ps(c + 8, _mm256_add_ps(_mm256_load_ps(c + 8), acc[m][1]));
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
  alignas(32) float row[kKc];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kNR, cols = imin(kNR, a.N - n0);
    std::memset(C, 0, static_cast<size_t>(a.M * kNR * 4));
    for (int64_t k0 = 0; k0 < a.K; k0 += kKc) {
      const int64_t kc = imin(kKc, a.K - k0);
      for (int64_t j = 0; j < kNR; ++j) {  // widen one weight row, then scatter it into column j
        const int64_t off = imin(n0 + j, a.N - 1) * a.K + k0;
        for (int64_t k = 0; k < kc; k += 8) _mm256_store_ps(row + k, load8(a.w, a.w_dtype, off + k, kc - k));
        for (int64_t k = 0; k < kc; ++k) packed[k * kNR + j] = row[k];
      }
      for (int64_t m0 = 0; m0 < a.M; m0 += kMR)
        tile_upto<kMR>(static_cast<int>(imin(kMR, a.M - m0)), a.x + m0 * a.K + k0, a.K, packed, kc, C + m0 * kNR);
    }
    for (int64_t m = 0; m < a.M; ++m)
      for (int j = 0; j < 2 && j * 8 < cols; ++j) {
        __m256 y = _mm256_load_ps(C + m * kNR + j * 8);
        if (a.bias) y = _mm256_add_ps(y, load8(a.bias, DType::kF32, n0 + j * 8, cols - j * 8));
        store8(a.out, DType::kF32, m * a.N + n0 + j * 8, y, cols - j * 8);
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

}  // namespace cider::kernels::x86::avx2
