// W8A8 GEMV (M = 1), AVX2. Contract: IntLinearArgs (kernels/kernel_table.h); reference: ref/w8a8_ref.cpp.
//
// vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16 with saturation. With |x| as the unsigned
// operand and sign(x)·w as the signed one, each pair is at most 2·127·127 = 32258 < 32767, so nothing saturates
// and Σ |x|·(sign(x)·w) = Σ x·w exactly; vpmaddwd by 1 then widens to int32. 8 output channels are read together,
// their int32 vectors reduced in one transposed hadd tree per group, and the float epilogue is the reference's:
// y = sx · Σ_g fl(sw_g · float(acc_g)) + bias.
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

constexpr int kRows = 8;
constexpr int64_t kVec = 32;

struct Gemv8 {
  const IntLinearArgs* a;
  const int8_t* xq;  // [Kp], zero past K
  float sx;
  int64_t span, G;
};

void block(const Gemv8& c, int64_t n0) {
  const IntLinearArgs& a = *c.a;
  const int64_t rows = imin(kRows, a.N - n0);
  const int8_t* w[kRows];
  for (int r = 0; r < kRows; ++r) w[r] = static_cast<const int8_t*>(a.w) + (n0 + imin(r, rows - 1)) * a.K;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t g = 0; g < c.G; ++g) {
    const int64_t k0 = g * c.span, k1 = k0 + c.span;
    __m256i acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_si256();
    for (int64_t k = k0; k < k1; k += kVec) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xq + k));
      const __m256i ax = _mm256_abs_epi8(xv);
      const bool full = k + kVec <= k1;
      alignas(32) int8_t tail[kRows][kVec];
      for (int r = 0; r < kRows; ++r) {
        const int8_t* src = w[r] + k;
        if (!full) {  // per-channel tail: zero-padded copy (activation codes past K are 0 too)
          std::memset(tail[r], 0, kVec);
          std::memcpy(tail[r], src, static_cast<size_t>(k1 - k));
          src = tail[r];
        }
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xv)), ones));
      }
    }
    __m256i lo, hi;
    reduce8_halves(acc, &lo, &hi);
    const __m256 sw = load8(a.w_scales, DType::kF32, a.group_size == 0 ? n0 : g * a.N + n0, rows);
    sum = _mm256_add_ps(sum, _mm256_mul_ps(sw, _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi))));
  }
  __m256 y = _mm256_mul_ps(_mm256_set1_ps(c.sx), sum);
  if (a.bias) y = _mm256_add_ps(y, load8(a.bias, DType::kF32, n0, rows));
  store8(a.out, a.out_dtype, n0, y, rows);
}

void run_blocks(void* ctx, int64_t b0, int64_t b1) {
  const Gemv8& c = *static_cast<const Gemv8*>(ctx);
  for (int64_t b = b0; b < b1; ++b) block(c, b * kRows);
}

}  // namespace

void w8a8_gemv(const IntLinearArgs& a) {
  if (a.K == 0 || a.N == 0) return ref::w8a8_gemv(a);
  const int64_t Kp = round_up(a.K, kVec);
  const int64_t span = a.group_size == 0 ? a.K : a.group_size;
  int8_t* xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(Kp)));
  Gemv8 c{&a, xq, quantize_row(a.x, a.x_dtype, a.K, Kp, xq), span, a.K / span};
  parallel_chunks((a.N + kRows - 1) / kRows, &run_blocks, &c);
}

}  // namespace cider::kernels::x86::avx2
