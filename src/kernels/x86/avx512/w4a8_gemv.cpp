// W4A8 GEMV (M = 1), AVX-512 VNNI. Contract: IntLinearArgs (kernels/kernel_table.h); reference: ref/w4a8_ref.cpp.
//
// Weights stay packed uint8 [N, K/2] (docs/formats.md: element 2i in the low nibble, stored code = q + 8). One
// 64-byte vector holds 128 codes; `and 0x0f` gives the even elements and `shift right 4, and 0x0f` the odd ones, as
// unsigned bytes 0..15 that vpdpbusd multiplies by the signed activation codes. The activations are therefore
// permuted once per token into [even 64 | odd 64] per 128 elements, so 32-bit lane j of both products covers
// elements 8j..8j+7 of the chunk. The stored codes are q + 8, so
//   acc_g = Σ_{k∈g} (q + 8)·x − 8·Σ_{k∈g} x      (int32, exact; 8·Σx per group computed once per token).
// Groups of 32 / 64 elements are quarters / halves of a vector (lanes 4L..4L+3 / 8L..8L+7), which the transposed
// reduction of 16 channels yields directly; 128 is one vector, 256 two. The float epilogue is the reference's:
// y = sx · Σ_g fl(sw_g · float(acc_g)) + bias, groups in order.
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int kRows = 16;         // output channels per block
constexpr int64_t kChunk = 128;   // codes per 64-byte vector
constexpr int64_t kPrefetchBytes = 512;  // software prefetch distance along each of the 16 row streams

struct Gemv4 {
  const IntLinearArgs* a;
  const int8_t* xp;     // [Kp] activation codes, per 128: [even 64 | odd 64], zero past K
  const int32_t* corr;  // [G] 8·Σ_{k∈g} xq, mod 2^32
  float sx;
  int64_t span, G, chunks;
  int64_t chunks_per_flush;  // 1 for span ≤ 128, span/128 otherwise (all chunks per channel)
  int groups_per_chunk;      // 4 (span 32), 2 (64), 1 (≥ 128)
};

void block(const Gemv4& c, int64_t n0) {
  const IntLinearArgs& a = *c.a;
  const int64_t rows = imin(kRows, a.N - n0), row_bytes = a.K / 2;
  const __mmask16 rmask = mask16(rows);
  const uint8_t* w[kRows];
  for (int r = 0; r < kRows; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (n0 + imin(r, rows - 1)) * row_bytes;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 sum = _mm512_setzero_ps();
  __m512i acc[kRows];
  int64_t g = 0;  // next group to flush
  for (int64_t ch = 0; ch < c.chunks; ++ch) {
    if (ch % c.chunks_per_flush == 0)
      for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_si512();
    const __m512i xe = _mm512_loadu_si512(c.xp + ch * kChunk), xo = _mm512_loadu_si512(c.xp + ch * kChunk + 64);
    const int64_t b = ch * 64;
    // Prefetch kPrefetchBytes ahead on each row; past the row's end, the same offset in the next block's row.
    const int64_t pf_skip = kPrefetchBytes + (b + kPrefetchBytes >= row_bytes ? (kRows - 1) * row_bytes : 0);
    if (b + 64 <= row_bytes) {
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + b + pf_skip), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(w[r] + b);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(v, low4), xe);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), xo);
      }
    } else {  // tail: bytes past the row read as 0 and meet activation codes 0
      const __mmask64 m = mask64(row_bytes - b);
      for (int r = 0; r < kRows; ++r) {
        const __m512i v = _mm512_maskz_loadu_epi8(m, w[r] + b);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(v, low4), xe);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), xo);
      }
    }
    if ((ch + 1) % c.chunks_per_flush != 0 && ch + 1 != c.chunks) continue;
    __m512i q[4], tot[4];
    reduce16_quarters(acc, q);
    int n_groups;
    if (c.groups_per_chunk == 4) {
      for (int i = 0; i < 4; ++i) tot[i] = q[i];
      n_groups = 4;
    } else if (c.groups_per_chunk == 2) {
      tot[0] = _mm512_add_epi32(q[0], q[1]);
      tot[1] = _mm512_add_epi32(q[2], q[3]);
      n_groups = 2;
    } else {
      tot[0] = _mm512_add_epi32(_mm512_add_epi32(q[0], q[1]), _mm512_add_epi32(q[2], q[3]));
      n_groups = 1;
    }
    for (int i = 0; i < n_groups && g < c.G; ++i, ++g) {
      const __m512i t = _mm512_sub_epi32(tot[i], _mm512_set1_epi32(c.corr[g]));
      const __m512 sw = _mm512_maskz_loadu_ps(rmask, a.w_scales + (a.group_size == 0 ? n0 : g * a.N + n0));
      sum = _mm512_add_ps(sum, _mm512_mul_ps(sw, _mm512_cvtepi32_ps(t)));
    }
  }
  __m512 y = _mm512_mul_ps(_mm512_set1_ps(c.sx), sum);
  if (a.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(rmask, a.bias + n0));
  store16(a.out, a.out_dtype, n0, y, rmask);
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
    for (int64_t j = 0; j < 64; ++j) {
      xp[ch * kChunk + j] = xq[ch * kChunk + 2 * j];
      xp[ch * kChunk + 64 + j] = xq[ch * kChunk + 2 * j + 1];
    }
  Gemv4 c{&a, xp, corr, sx, span, G, Kp / kChunk, 1, 1};
  if (a.group_size == 0) {
    c.chunks_per_flush = c.chunks;
  } else {
    c.chunks_per_flush = span > kChunk ? span / kChunk : 1;
    c.groups_per_chunk = span < kChunk ? static_cast<int>(kChunk / span) : 1;
  }
  parallel_chunks((a.N + kRows - 1) / kRows, &run_blocks, &c);
}

}  // namespace cider::kernels::x86::avx512
