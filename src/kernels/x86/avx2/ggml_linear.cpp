// Linear layer over native GGUF weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K), AVX2. Contract:
// GgmlLinearArgs (kernels/kernel_table.h); reference: ref/ggml_linear_ref.cpp (float64 over the dequantized rows).
//
// Activations: each row of x is quantized once per 32 elements ("piece") to int8 with step dx = max|x|/127 of the
// piece (rint, as the W8A8 kernels do); the sums of its codes over each half-piece of 16 are kept, times dx.
// Weights: each piece of a block is read in its integer form (quant/ggml_blocks.h): w_i = a_h·c_i + b_h with int8
// codes c and one (a, b) per half-piece h. One piece's dot product is then exact in integers,
//   vpmaddubsw(|c|, sign(x, c)) (pairs <= 2·128·127 < 2^15: no saturation), vpmaddwd by 1 → int32 lanes 0..3 for
//   the first 16 elements, 4..7 for the last 16,
// and y = Σ_pieces dx·(Σ_h a_h·S_h + b_h·X_h) + bias in float32 (S_h the integer dots, X_h the activation code sums).
// Codes are unpacked with byte shuffles and masks for every format but Q5_K, whose pieces come from
// quant::ggml_piece (scalar). Work: rows of w in chunks over the thread pool; x rows in tiles of 4, so one unpacked
// piece serves 4 activation rows; 16 weight rows are read together for one activation row (memory-level parallelism).
// Fewer than 16 rows of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K or Q6_K go to avx2/ggml_linear_gemv.cpp (unsigned codes,
// about 1.4-1.8× this file's tiles at M = 1); 16 rows and more to avx2/ggml_linear_gemm.cpp. Rows interleaved 8 at a
// time (GgmlLinearArgs::interleaved): fewer than 16 activation rows to avx2/ggml_linear_gemv_x8.cpp; the panel GEMM
// and ggml_dequantize read each block back in the file's layout (quant::ggml_interleaved_block).
#include <cstring>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86::avx2 {

namespace {

constexpr int kTile = 4;       // activation rows per pass over a weight row
constexpr int64_t kRowsPerChunk = 16;

struct Ctx {
  const GgmlLinearArgs* a;
  quant::GgmlType type;
  int block_size, block_bytes;
  const int8_t* xq;   // [M, K] codes
  const float* dx;    // [M, K/32] steps
  const float* xs;    // [M, K/32, 2] dx · (sum of the codes of each half-piece)
};

// R weight rows × T activation rows from (n0, m0): R concurrent weight streams (memory-level parallelism for the
// GEMV, as the W8A8 kernels read 8 rows together), T activation rows sharing each unpacked piece (the GEMM).
template <quant::GgmlType kType, int R, int T>
void tile(const Ctx& c, int64_t n0, int nr, int64_t m0, int mt) {
  constexpr int kPieces = pieces_of(kType);
  const GgmlLinearArgs& a = *c.a;
  const int64_t P = a.K / 32, blocks = a.K / c.block_size;
  const uint8_t* w[R];
  for (int r = 0; r < R; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (n0 + (r < nr ? r : nr - 1)) * a.row_bytes;
  __m256 acc[R][T];
  float accb[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      accb[r][t] = 0.0f;
    }
  Piece pc[8];
  const uint8_t* pf = static_cast<const uint8_t*>(a.w) + (n0 + R) * a.row_bytes;
  const uint8_t* const pf_end = pf + R * a.row_bytes;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    for (int r = 0; r < R; ++r) {
      // The R rows of a tile are contiguous, and so are the next tile's: while this tile is read, the next one is
      // fetched line by line, as many bytes per block read as the block holds (one tile ahead; short rows, such as
      // a 640-wide output layer, are too short for the hardware prefetcher's per-row streams).
      for (int off = 0; off < c.block_bytes && pf < pf_end; off += 64, pf += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T0);
      unpack_block<kType>(w[r] + blk * c.block_bytes, pc);
      for (int j = 0; j < kPieces; ++j) {
        const int64_t piece = blk * kPieces + j;
        const __m256i ac = _mm256_abs_epi8(pc[j].c);
        for (int t = 0; t < T; ++t) {
          if (t >= mt) break;
          const int64_t m = m0 + t;
          const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xq + m * a.K + piece * 32));
          const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ac, _mm256_sign_epi8(xv, pc[j].c)), pc[j].mul);
          const __m256 scale = _mm256_mul_ps(pc[j].av, _mm256_set1_ps(c.dx[m * P + piece]));
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale, acc[r][t]);
          if constexpr (has_b(kType)) {
            const float* xs = c.xs + (m * P + piece) * 2;
            accb[r][t] += pc[j].b0 * xs[0] + pc[j].b1 * xs[1];
          }
        }
      }
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < mt; ++t)
      a.out[(m0 + t) * a.N + n0 + r] = hsum_ps(acc[r][t]) + accb[r][t] + (a.bias ? a.bias[n0 + r] : 0.0f);
}

// Chunks of kRowsPerChunk weight rows: 8 rows at a time for one activation row, 2 × 4 otherwise.
template <quant::GgmlType kType>
void rows_of(const Ctx& c, int64_t c0, int64_t c1) {
  const GgmlLinearArgs& a = *c.a;
  const int64_t n_end = imin(c1 * kRowsPerChunk, a.N);
  if (a.M == 1) {
    for (int64_t n0 = c0 * kRowsPerChunk; n0 < n_end; n0 += 16)
      tile<kType, 16, 1>(c, n0, static_cast<int>(imin(16, n_end - n0)), 0, 1);
    return;
  }
  for (int64_t n0 = c0 * kRowsPerChunk; n0 < n_end; n0 += 2)
    for (int64_t m0 = 0; m0 < a.M; m0 += kTile)
      tile<kType, 2, kTile>(c, n0, static_cast<int>(imin(2, n_end - n0)), m0, static_cast<int>(imin(kTile, a.M - m0)));
}

void rows(void* vctx, int64_t c0, int64_t c1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  with_block_format(c.type, [&]<quant::GgmlType T>() { rows_of<T>(c, c0, c1); });  // ggml_linear sends only these
}

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
  [[maybe_unused]] uint8_t tmp[32];  // an interleaved row's block, back in the file's layout (block_bytes <= 24 there)
  for (int64_t r = 0; r < a.rows; ++r) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + r * a.row_bytes;
    float* out = a.out + r * a.K;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const uint8_t* b = w + blk * block_bytes;
      if constexpr (interleavable(kType)) {
        if (a.interleaved) {
          quant::ggml_interleaved_block(a.ggml_type, a.w, blocks, a.row0 + r, blk, tmp);
          b = tmp;
        }
      }
      unpack_block<kType>(b, pc);
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
  if (ggml_linear_gemv_takes(a.ggml_type)) return ggml_linear_gemv(a);
  const int64_t P = a.K / 32;
  int8_t* xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(a.M * a.K)));
  float* dx = static_cast<float*>(scratch(1, static_cast<size_t>(a.M * P) * sizeof(float)));
  float* xs = static_cast<float*>(scratch(2, static_cast<size_t>(a.M * P * 2) * sizeof(float)));
  for (int64_t m = 0; m < a.M; ++m) {
    for (int64_t p = 0; p < P; ++p) {
      const float* x = a.x + m * a.K + p * 32;
      int8_t* q = xq + m * a.K + p * 32;
      int s0 = 0, s1 = 0;
      const float step = quantize_piece32(x, q, &s0, &s1);  // max|x|/127; codes rint(x/step)
      dx[m * P + p] = step;
      xs[(m * P + p) * 2] = step * static_cast<float>(s0);
      xs[(m * P + p) * 2 + 1] = step * static_cast<float>(s1);
    }
  }
  Ctx c{&a, f->type, f->block_size, f->block_bytes, xq, dx, xs};
  parallel_chunks((a.N + kRowsPerChunk - 1) / kRowsPerChunk, &rows, &c);
}

}  // namespace cider::kernels::x86::avx2
