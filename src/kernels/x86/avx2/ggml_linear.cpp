// Linear layer over native GGUF weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K), AVX2: the entry that
// picks the kernel, and ggml_dequantize. Contract: GgmlLinearArgs / GgmlDequantArgs (kernels/kernel_table.h);
// reference: ref/ggml_linear_ref.cpp (float64 over the dequantized rows).
//
// Every kernel quantizes the activations per 32 elements ("piece") to int8, step dx = max|x|/127 (rint, as the W8A8
// kernels do), and multiplies a block's integer form (quant/ggml_blocks.h) exactly in integers, scaling per piece in
// float32. Fewer than 16 activation rows go to avx2/ggml_linear_gemv.cpp (every format, the file's row order) or, for
// rows interleaved 8 at a time (GgmlLinearArgs::interleaved), to avx2/ggml_linear_gemv_x8.cpp; 16 rows and more to
// the panel GEMM, avx2/ggml_linear_gemm.cpp, which packs interleaved octets as they come. ggml_dequantize: each block
// (an interleaved one read back in the file's layout, quant::ggml_interleaved_block) unpacked to its integer form
// (codes, a scale and an offset per 16, avx2/ggml_pieces.h), then a·c (+ b) in the decoder's rounding order: the
// decoder's values bit for bit.
#include <cstring>

#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86::avx2 {

namespace {

// A format with an integer form and rows of whole blocks; anything else (an empty K included) goes to the
// reference, which reports the shapes it cannot take.
static inline bool fast_case(const quant::GgmlBlockFormat* f, int64_t K, int64_t row_bytes) {
  return f != nullptr && f->integer_form && K > 0 && K % f->block_size == 0 && row_bytes == quant::ggml_row_bytes(*f, K);
}

// Rows to float32 from the integer form: w = a_h·c (+ b_h where the format has offsets), the decoder's roundings
// in the decoder's order, so the result is the reference's bit for bit.
template <quant::GgmlType kType>
void dequantize_rows(const GgmlDequantArgs& a, int block_size, int block_bytes) {
  constexpr int kPieces = pieces_of(kType);
  const int64_t blocks = a.K / block_size;
  Piece pc[8];
  uint8_t tmp[quant::kGgmlInterleavedBlockMax];  // an interleaved row's block, back in the file's layout
  for (int64_t r = 0; r < a.rows; ++r) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + r * a.row_bytes;
    float* out = a.out + r * a.K;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      unpack_block<kType>(row_block<kType>(w, block_bytes, a.interleaved, a.w, a.K, a.row0 + r, blk, tmp), pc);
      for (int j = 0; j < kPieces; ++j) {
        float* o = out + (blk * kPieces + j) * 32;
        const __m128i c[2] = {_mm256_castsi256_si128(pc[j].c), _mm256_extracti128_si256(pc[j].c, 1)};
        for (int h = 0; h < 2; ++h) {
          const __m256i c16 = _mm256_cvtepi8_epi16(c[h]);
          const __m256 av = _mm256_set1_ps(h == 0 ? pc[j].a0 : pc[j].a1);
          const __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(c16));
          const __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(c16, 1));
          __m256 y0 = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), av), y1 = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), av);
          if constexpr (has_b(kType)) {
            const __m256 bv = _mm256_set1_ps(h == 0 ? pc[j].b0 : pc[j].b1);
            y0 = _mm256_add_ps(y0, bv);
            y1 = _mm256_add_ps(y1, bv);
          }
          _mm256_storeu_ps(o + 16 * h, y0);
          _mm256_storeu_ps(o + 16 * h + 8, y1);
        }
      }
    }
  }
}

}  // namespace

void ggml_dequantize(const GgmlDequantArgs& a) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(a.ggml_type);
  if (!fast_case(f, a.K, a.row_bytes) || a.rows == 0 || (a.interleaved && !quant::ggml_interleavable(a.ggml_type)))
    return ref::ggml_dequantize(a);
  const int bs = f->block_size, bb = f->block_bytes;
  if (!with_block_format(f->type, [&]<quant::GgmlType T>() { dequantize_rows<T>(a, bs, bb); })) ref::ggml_dequantize(a);
}

void ggml_linear(const GgmlLinearArgs& a) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(a.ggml_type);
  if (!fast_case(f, a.K, a.row_bytes) || a.N == 0 || a.M == 0) return ref::ggml_linear(a);
  if (a.interleaved) {  // the reference reports a format or N that cannot be interleaved
    if (!quant::ggml_interleavable(a.ggml_type) || a.N % quant::kGgmlInterleaveRows != 0) return ref::ggml_linear(a);
    return a.M >= kGgmlGemmFromM ? ggml_linear_gemm(a) : ggml_linear_gemv_x8(a);
  }
  if (a.M >= kGgmlGemmFromM) return ggml_linear_gemm(a);  // weights unpacked once per panel, not per 4 rows
  check(ggml_linear_gemv_takes(a.ggml_type), ErrorCode::kInternal, "ggml_linear", "no AVX2 GEMV for ggml type ",
        a.ggml_type);
  ggml_linear_gemv(a);
}

}  // namespace cider::kernels::x86::avx2
