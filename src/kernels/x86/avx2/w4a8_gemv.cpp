// W4A8 GEMV (M = 1), AVX2. Contract: IntLinearArgs (kernels/kernel_table.h); reference: ref/w4a8_ref.cpp.
//
// One 32-byte vector holds 64 codes; `and 0x0f` gives the even elements and `shift right 4, and 0x0f` the odd ones
// as unsigned bytes q + 8 in 0..15, multiplied by the signed activation codes with vpmaddubsw (pairs ≤ 2·15·127, the
// two products' int16 sum ≤ 7620: no saturation), widened by vpmaddwd. The activations are permuted once per token
// to [even 32 | odd 32] per 64 so 32-bit lane j covers elements 8j..8j+7; a group of 32 is half a vector.
//   acc_g = Σ_{k∈g} (q + 8)·x − 8·Σ_{k∈g} x        (int32, exact)
// Float epilogue as the reference: y = sx · Σ_g fl(sw_g · float(acc_g)) + bias.
// Rows go in page blocks of 8·P rows read in P passes (P = rows per 4 KiB page), as in avx512/w4a8_gemv.cpp.
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

constexpr int kRows = 8;
constexpr int64_t kChunk = 64;  // codes per 32-byte vector

struct Gemv4 {
  const IntLinearArgs* a;
  const int8_t* xp;     // [Kp], per 64: [even 32 | odd 32], zero past K
  const int32_t* corr;  // [G] 8·Σ_{k∈g} x, mod 2^32
  float sx;
  int64_t span, G, chunks, chunks_per_flush;
  bool half_groups;  // span 32: two groups per chunk
};

constexpr int64_t kMaxPasses = 8;  // page blocks: at most 8 rows per 4 KiB page (rows of ≥ 512 bytes)

// sx · Σ_g fl(sw_g · float(acc_g)) for the rows base + j·stride (lane j < rows ≤ 8; lanes past `rows` repeat the
// last row and are not meant to be stored).
__m256 rows_sum(const Gemv4& c, int64_t base, int64_t stride, int64_t rows) {
  const IntLinearArgs& a = *c.a;
  const int64_t row_bytes = a.K / 2, full = row_bytes / 32;  // chunk `full` (if < chunks) is the row's tail
  const uint8_t* w[kRows];
  for (int r = 0; r < kRows; ++r)
    w[r] = static_cast<const uint8_t*>(a.w) + (base + imin(r, rows - 1) * stride) * row_bytes;
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 sum = _mm256_setzero_ps();
  int64_t g = 0;
  for (int64_t f0 = 0; f0 < c.chunks; f0 += c.chunks_per_flush) {
    const int64_t f1 = imin(f0 + c.chunks_per_flush, c.chunks), e = imin(f1, full);
    __m256i acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_si256();
    for (int64_t ch = f0; ch < e; ++ch) {
      const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xp + ch * kChunk));
      const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xp + ch * kChunk + 32));
      const int64_t b = ch * 32;
      for (int r = 0; r < kRows; ++r) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + b));
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, low4), xe),
                                           _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), xo));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, ones));
      }
    }
    if (f1 > full) {  // the row's last, partial vector: bytes past the row read as 0 and meet activation codes 0
      const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xp + full * kChunk));
      const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xp + full * kChunk + 32));
      const int64_t b = full * 32;
      alignas(32) uint8_t tail[32];
      for (int r = 0; r < kRows; ++r) {
        std::memset(tail, 0, 32);
        std::memcpy(tail, w[r] + b, static_cast<size_t>(row_bytes - b));
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, low4), xe),
                                           _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), xo));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, ones));
      }
    }
    __m256i lo, hi, tot[2];
    reduce8_halves(acc, &lo, &hi);
    int n_groups = 1;
    if (c.half_groups) {
      tot[0] = lo;
      tot[1] = hi;
      n_groups = 2;
    } else {
      tot[0] = _mm256_add_epi32(lo, hi);
    }
    for (int i = 0; i < n_groups && g < c.G; ++i, ++g) {
      const __m256i t = _mm256_sub_epi32(tot[i], _mm256_set1_epi32(c.corr[g]));
      const float* sg = a.w_scales + (a.group_size == 0 ? base : g * a.N + base);
      __m256 sw;
      if (stride == 1) {
        sw = load8(sg, DType::kF32, 0, rows);
      } else {
        alignas(32) float t8[kRows];
        for (int r = 0; r < kRows; ++r) t8[r] = sg[imin(r, rows - 1) * stride];
        sw = _mm256_load_ps(t8);
      }
      sum = _mm256_add_ps(sum, _mm256_mul_ps(sw, _mm256_cvtepi32_ps(t)));
    }
  }
  return _mm256_mul_ps(_mm256_set1_ps(c.sx), sum);
}

// 8 adjacent output channels from n0 (the rows after the last whole page block).
void block(const Gemv4& c, int64_t n0) {
  const IntLinearArgs& a = *c.a;
  const int64_t rows = imin(kRows, a.N - n0);
  __m256 y = rows_sum(c, n0, 1, rows);
  if (a.bias) y = _mm256_add_ps(y, load8(a.bias, DType::kF32, n0, rows));
  store8(a.out, a.out_dtype, n0, y, rows);
}

// A page block of 8·P rows from n0, all present, read in P passes of the 8 rows p, p + P, … (as the AVX-512
// kernel: every 4 KiB page is read front to back; docs/x86_kernels.md, "W4A8 GEMV page blocks").
void page_block(const Gemv4& c, int64_t n0, int64_t P) {
  const IntLinearArgs& a = *c.a;
  alignas(32) float ybuf[kRows * kMaxPasses], t8[kRows];
  for (int64_t p = 0; p < P; ++p) {
    _mm256_store_ps(t8, rows_sum(c, n0 + p, P, kRows));
    for (int r = 0; r < kRows; ++r) ybuf[p + r * P] = t8[r];
  }
  for (int64_t v = 0; v < P; ++v) {
    __m256 y = _mm256_load_ps(ybuf + kRows * v);
    if (a.bias) y = _mm256_add_ps(y, load8(a.bias, DType::kF32, n0 + kRows * v, kRows));
    store8(a.out, a.out_dtype, n0 + kRows * v, y, kRows);
  }
}

struct Units {
  const Gemv4* c;
  int64_t P, page_blocks, pages_end;
};

void run_blocks(void* ctx, int64_t u0, int64_t u1) {
  const Units& u = *static_cast<const Units*>(ctx);
  for (int64_t i = u0; i < u1; ++i) {
    if (i < u.page_blocks) page_block(*u.c, i * kRows * u.P, u.P);
    else block(*u.c, u.pages_end + (i - u.page_blocks) * kRows);
  }
}

}  // namespace

void w4a8_gemv(const IntLinearArgs& a) {
  if (a.K == 0 || a.N == 0) return ref::w4a8_gemv(a);
  const int64_t Kp = round_up(a.K, kChunk);
  const int64_t span = a.group_size == 0 ? a.K : a.group_size, G = a.K / span;
  int8_t* xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(2 * Kp + 4 * G)));
  int8_t* xp = xq + Kp;
  int32_t* corr = reinterpret_cast<int32_t*>(xp + Kp);
  const float sx = quantize_row(a.x, a.x_dtype, a.K, Kp, xq);
  for (int64_t g = 0; g < G; ++g)
    corr[g] = static_cast<int32_t>(static_cast<uint32_t>(8 * sum_i8(xq + g * span, span)));
  for (int64_t ch = 0; ch < Kp / kChunk; ++ch)
    for (int64_t j = 0; j < 32; ++j) {
      xp[ch * kChunk + j] = xq[ch * kChunk + 2 * j];
      xp[ch * kChunk + 32 + j] = xq[ch * kChunk + 2 * j + 1];
    }
  Gemv4 c{&a, xp, corr, sx, span, G, Kp / kChunk, 1, false};
  if (a.group_size == 0) c.chunks_per_flush = c.chunks;
  else if (span > kChunk) c.chunks_per_flush = span / kChunk;
  c.half_groups = span == 32;
  const int64_t rs = a.K / 2;
  int64_t P = rs >= 4096 ? 1 : 4096 / rs;  // rows per 4 KiB page, 1..8
  P = P > kMaxPasses ? kMaxPasses : P;
  Units u{&c, P, a.N / (kRows * P), 0};
  u.pages_end = u.page_blocks * kRows * P;
  parallel_chunks(u.page_blocks + (a.N - u.pages_end + kRows - 1) / kRows, &run_blocks, &u);
}

}  // namespace cider::kernels::x86::avx2
