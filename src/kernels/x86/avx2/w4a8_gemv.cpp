// W4A8 GEMV (M = 1), AVX2. Contract: IntLinearArgs (kernels/kernel_table.h); reference: ref/w4a8_ref.cpp.
//
// One 32-byte vector holds 64 codes; `and 0x0f` gives the even elements and `shift right 4, and 0x0f` the odd ones
// as unsigned bytes q + 8 in 0..15, multiplied by the signed activation codes with vpmaddubsw (pairs ≤ 2·15·127, the
// two products' int16 sum ≤ 7620: no saturation), widened by vpmaddwd. The activations are permuted once per token
// to [even 32 | odd 32] per 64 so 32-bit lane j covers elements 8j..8j+7; a group of 32 is half a vector.
//   acc_g = Σ_{k∈g} (q + 8)·x − 8·Σ_{k∈g} x        (int32, exact)
// Float epilogue as the reference: y = sx · Σ_g fl(sw_g · float(acc_g)) + bias.
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

void block(const Gemv4& c, int64_t n0) {
  const IntLinearArgs& a = *c.a;
  const int64_t rows = imin(kRows, a.N - n0), row_bytes = a.K / 2;
  const uint8_t* w[kRows];
  for (int r = 0; r < kRows; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (n0 + imin(r, rows - 1)) * row_bytes;
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 sum = _mm256_setzero_ps();
  __m256i acc[kRows];
  int64_t g = 0;
  for (int64_t ch = 0; ch < c.chunks; ++ch) {
    if (ch % c.chunks_per_flush == 0)
      for (int r = 0; r < kRows; ++r) acc[r] = _mm256_setzero_si256();
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xp + ch * kChunk));
    const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.xp + ch * kChunk + 32));
    const int64_t b = ch * 32;
    alignas(32) uint8_t tail[32];
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* src = w[r] + b;
      if (b + 32 > row_bytes) {
        std::memset(tail, 0, 32);
        std::memcpy(tail, src, static_cast<size_t>(row_bytes - b));
        src = tail;
      }
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
      const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_and_si256(v, low4), xe),
                                         _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), xo));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p, ones));
    }
    if ((ch + 1) % c.chunks_per_flush != 0 && ch + 1 != c.chunks) continue;
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
      const __m256 sw = load8(a.w_scales, DType::kF32, a.group_size == 0 ? n0 : g * a.N + n0, rows);
      sum = _mm256_add_ps(sum, _mm256_mul_ps(sw, _mm256_cvtepi32_ps(t)));
    }
  }
  __m256 y = _mm256_mul_ps(_mm256_set1_ps(c.sx), sum);
  if (a.bias) y = _mm256_add_ps(y, load8(a.bias, DType::kF32, n0, rows));
  store8(a.out, a.out_dtype, n0, y, rows);
}

void run_blocks(void* ctx, int64_t b0, int64_t b1) {
  const Gemv4& c = *static_cast<const Gemv4*>(ctx);
  for (int64_t b = b0; b < b1; ++b) block(c, b * kRows);
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
  parallel_chunks((a.N + kRows - 1) / kRows, &run_blocks, &c);
}

}  // namespace cider::kernels::x86::avx2
