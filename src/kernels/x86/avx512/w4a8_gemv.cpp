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
//
// Memory order (the kernel streams its weights from DRAM, and is bound by that, not by the unpacking: from L2 it
// runs ≈ 3.5× faster): output rows go in "page blocks" of 16·P rows, P = rows per 4 KiB page (2 at K 4096), read
// as P passes of 16 rows P apart, so every page is read front to back as one stream (see `pass`). Rows after the
// last whole page block go in plain blocks of 16 adjacent rows. The hot loop addresses its 16 rows from 4 base
// pointers plus the stride and keeps the 16 accumulators in registers (asm helpers: GCC 12 otherwise copies them).
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int kRows = 16;         // output channels per block
constexpr int64_t kChunk = 128;   // codes per 64-byte vector
constexpr int64_t kPrefetchBytes = 512;  // software prefetch distance along each of the 16 row streams
constexpr int64_t kMaxPasses = 8;        // page blocks: at most 8 rows per 4 KiB page (rows of ≥ 512 bytes)

struct Gemv4 {
  const IntLinearArgs* a;
  const int8_t* xp;     // [Kp] activation codes, per 128: [even 64 | odd 64], zero past K
  const int32_t* corr;  // [G] 8·Σ_{k∈g} xq, mod 2^32
  float sx;
  int64_t span, G, chunks;
  int64_t chunks_per_flush;  // 1 for span ≤ 128, span/128 otherwise (all chunks per channel)
  int groups_per_chunk;      // 4 (span 32), 2 (64), 1 (≥ 128)
};

// One span of codes [ch0, ch1) chunks of the 16 rows into acc (added). Full 64-byte vectors only; a fixed-count
// loop with nothing else in it, so the 16 accumulators, the two activation vectors and the mask stay in registers.
static inline void span_full(__m512i acc[kRows], const uint8_t* const w[kRows], const int8_t* xp, int64_t ch0,
                             int64_t ch1, int64_t row_bytes) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  for (int64_t ch = ch0; ch < ch1; ++ch) {
    const __m512i xe = _mm512_loadu_si512(xp + ch * kChunk), xo = _mm512_loadu_si512(xp + ch * kChunk + 64);
    const int64_t b = ch * 64;
    // Prefetch kPrefetchBytes ahead on each row; past the row's end, the same offset in the next block's row.
    const int64_t pf = b + kPrefetchBytes + (b + kPrefetchBytes >= row_bytes ? (kRows - 1) * row_bytes : 0);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + pf), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(w[r] + b);
      acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(v, low4), xe);
      acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), xo);
    }
  }
}

// GCC 12 copies every vpdpbusd accumulator to a fresh register around each call of the intrinsic and turns 16 row
// addresses into 16 induction variables (spilled); these asm helpers keep the accumulator in place and the row
// addresses as base + stride·{1,2} (the weights are read-only during the call: no memory operand needed).
static inline void dpbusd(__m512i& acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
}
static inline __m512i load_at(const uint8_t* p) {
  __m512i v;
  asm("vmovdqu64 (%1), %0" : "=v"(v) : "r"(p));
  return v;
}
static inline __m512i load_at1(const uint8_t* p, int64_t i) {
  __m512i v;
  asm("vmovdqu64 (%1,%2,1), %0" : "=v"(v) : "r"(p), "r"(i));
  return v;
}
static inline __m512i load_at2(const uint8_t* p, int64_t i) {
  __m512i v;
  asm("vmovdqu64 (%1,%2,2), %0" : "=v"(v) : "r"(p), "r"(i));
  return v;
}

// span_full for 16 rows at a constant stride S (row j at w0 + j·S), all present: the rows are addressed from four
// base pointers with the stride in registers (no per-row pointers to spill), and each vector is loaded once.
// Prefetch kPrefetchBytes ahead on each row; where that passes the row's end (offset rs), `pf_extra` more bytes:
// 0 when the next pass reads the following row (see `pass`), else the distance to the row the next block reads.
static inline void span_fast(__m512i acc[kRows], const uint8_t* w0, int64_t S, int64_t rs, const int8_t* xp,
                             int64_t ch0, int64_t ch1, int64_t pf_extra) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int64_t S3 = 3 * S;
  __m512i a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5], a6 = acc[6], a7 = acc[7];
  __m512i a8 = acc[8], a9 = acc[9], a10 = acc[10], a11 = acc[11], a12 = acc[12], a13 = acc[13], a14 = acc[14],
          a15 = acc[15];
  for (int64_t ch = ch0; ch < ch1; ++ch) {
    const __m512i xe = _mm512_loadu_si512(xp + ch * kChunk), xo = _mm512_loadu_si512(xp + ch * kChunk + 64);
    const int64_t b = ch * 64;
    const uint8_t* p0 = w0 + b;
    const uint8_t* p4 = p0 + 4 * S;
    const uint8_t* p8 = p0 + 8 * S;
    const uint8_t* p12 = p4 + 8 * S;
    const int64_t pf = kPrefetchBytes + (b + kPrefetchBytes >= rs ? pf_extra : 0);
#define CIDER_W4_ROW(A, LOAD)                                       \
  {                                                                 \
    const __m512i v = LOAD;                                         \
    dpbusd(A, _mm512_and_si512(v, low4), xe);                       \
    dpbusd(A, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), xo); \
  }
#define CIDER_W4_PF4(P)                                    \
  {                                                        \
    const char* q = reinterpret_cast<const char*>(P) + pf; \
    _mm_prefetch(q, _MM_HINT_T0);                          \
    _mm_prefetch(q + S, _MM_HINT_T0);                      \
    _mm_prefetch(q + 2 * S, _MM_HINT_T0);                  \
    _mm_prefetch(q + S3, _MM_HINT_T0);                     \
  }
    CIDER_W4_PF4(p0)
    CIDER_W4_ROW(a0, load_at(p0))
    CIDER_W4_ROW(a1, load_at1(p0, S))
    CIDER_W4_ROW(a2, load_at2(p0, S))
    CIDER_W4_ROW(a3, load_at1(p0, S3))
    CIDER_W4_PF4(p4)
    CIDER_W4_ROW(a4, load_at(p4))
    CIDER_W4_ROW(a5, load_at1(p4, S))
    CIDER_W4_ROW(a6, load_at2(p4, S))
    CIDER_W4_ROW(a7, load_at1(p4, S3))
    CIDER_W4_PF4(p8)
    CIDER_W4_ROW(a8, load_at(p8))
    CIDER_W4_ROW(a9, load_at1(p8, S))
    CIDER_W4_ROW(a10, load_at2(p8, S))
    CIDER_W4_ROW(a11, load_at1(p8, S3))
    CIDER_W4_PF4(p12)
    CIDER_W4_ROW(a12, load_at(p12))
    CIDER_W4_ROW(a13, load_at1(p12, S))
    CIDER_W4_ROW(a14, load_at2(p12, S))
    CIDER_W4_ROW(a15, load_at1(p12, S3))
#undef CIDER_W4_PF4
#undef CIDER_W4_ROW
  }
  acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3, acc[4] = a4, acc[5] = a5, acc[6] = a6, acc[7] = a7;
  acc[8] = a8, acc[9] = a9, acc[10] = a10, acc[11] = a11, acc[12] = a12, acc[13] = a13, acc[14] = a14, acc[15] = a15;
}

// The last, partial vector of each row (K not a multiple of 128): bytes past the row read as 0 and meet activation
// codes 0.
static inline void chunk_tail(__m512i acc[kRows], const uint8_t* const w[kRows], const int8_t* xp, int64_t ch,
                              int64_t row_bytes) {
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i xe = _mm512_loadu_si512(xp + ch * kChunk), xo = _mm512_loadu_si512(xp + ch * kChunk + 64);
  const int64_t b = ch * 64;
  const __mmask64 m = mask64(row_bytes - b);
  for (int r = 0; r < kRows; ++r) {
    const __m512i v = _mm512_maskz_loadu_epi8(m, w[r] + b);
    acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(v, low4), xe);
    acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), xo);
  }
}

// Sums of one flush span's groups, reduced: adds Σ_g fl(sw_g · float(acc_g − corr_g)) into `sum`, groups in order.
// sw_g of lane j is read at scales[g-offset + j·stride] (stride 1: one load; else a gather).
static inline void flush(const Gemv4& c, __m512i acc[kRows], int64_t& g, __m512& sum, const float* scales,
                         int64_t stride, __mmask16 rmask) {
  const IntLinearArgs& a = *c.a;
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
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(static_cast<int32_t>(stride)));
  for (int i = 0; i < n_groups && g < c.G; ++i, ++g) {
    const __m512i t = _mm512_sub_epi32(tot[i], _mm512_set1_epi32(c.corr[g]));
    const float* sg = scales + (a.group_size == 0 ? 0 : g * a.N);
    const __m512 sw = stride == 1 ? _mm512_maskz_loadu_ps(rmask, sg) : _mm512_i32gather_ps(idx, sg, 4);
    sum = _mm512_add_ps(sum, _mm512_mul_ps(sw, _mm512_cvtepi32_ps(t)));
  }
}

// One pass of a page block: the 16 rows n0 + p + P·j (j = 0..15), all present, row stride S = P·rs. Returns
// sx · Σ_g … per lane (lane j = row n0 + p + P·j).
//
// Why passes: a row of K/2 bytes is shorter than a 4 KiB page when K < 8192 (2 KiB at K 4096), and reading 16
// adjacent rows side by side runs 2 (or P) streams through each page, which the hardware L2 prefetcher follows
// worse than one stream per page (the INT8 kernel's rows are whole pages at K 4096). A page block of 16·P rows is
// read as P passes over rows p, p + P, p + 2P, …: pass p reads part p of every page, pass p + 1 the next part, so
// every page is read front to back, and the row prefetch running past a row's end lands in the next pass's row.
__m512 pass(const Gemv4& c, int64_t n0, int64_t p, int64_t P) {
  const IntLinearArgs& a = *c.a;
  const int64_t rs = a.K / 2, S = P * rs;
  const uint8_t* w0 = static_cast<const uint8_t*>(a.w) + (n0 + p) * rs;
  const int64_t full = rs / 64;
  // Past the row's end: pass p < P−1 → the next row (pass p + 1's), else the next page block's row of pass 0.
  const int64_t pf_extra = p + 1 < P ? 0 : (kRows * P - P) * rs;
  __m512 sum = _mm512_setzero_ps();
  int64_t g = 0;
  for (int64_t f0 = 0; f0 < c.chunks; f0 += c.chunks_per_flush) {
    const int64_t f1 = imin(f0 + c.chunks_per_flush, c.chunks);
    __m512i acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_si512();
    span_fast(acc, w0, S, rs, c.xp, f0, imin(f1, full), pf_extra);
    if (f1 > full) {
      const uint8_t* w[kRows];
      for (int r = 0; r < kRows; ++r) w[r] = w0 + r * S;
      chunk_tail(acc, w, c.xp, full, rs);
    }
    flush(c, acc, g, sum, a.w_scales + n0 + p, P, mask16(kRows));
  }
  return _mm512_mul_ps(_mm512_set1_ps(c.sx), sum);
}

// A page block: 16·P rows from n0 (all present), P passes, then bias and store in row order.
void page_block(const Gemv4& c, int64_t n0, int64_t P) {
  const IntLinearArgs& a = *c.a;
  alignas(64) float ybuf[kRows * kMaxPasses];
  const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32(static_cast<int32_t>(P)));
  for (int64_t p = 0; p < P; ++p) _mm512_i32scatter_ps(ybuf + p, idx, pass(c, n0, p, P), 4);
  for (int64_t v = 0; v < P; ++v) {
    __m512 y = _mm512_load_ps(ybuf + kRows * v);
    if (a.bias) y = _mm512_add_ps(y, _mm512_loadu_ps(a.bias + n0 + kRows * v));
    store16(a.out, a.out_dtype, n0 + kRows * v, y, mask16(kRows));
  }
}

// Block of 16 adjacent output channels (the rows past N repeat the last one and are not stored), for the rows after
// the last whole page block: per flush span (all chunks per channel; span/128 chunks for groups ≥ 128; one chunk
// for groups 32 / 64), accumulate, reduce the 16 rows in one transposed tree, apply the groups' corrections and
// scales in order.
void block(const Gemv4& c, int64_t n0) {
  const IntLinearArgs& a = *c.a;
  const int64_t rows = imin(kRows, a.N - n0), row_bytes = a.K / 2;
  const __mmask16 rmask = mask16(rows);
  const uint8_t* w[kRows];
  for (int r = 0; r < kRows; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (n0 + imin(r, rows - 1)) * row_bytes;
  const int64_t full = row_bytes / 64;  // chunks read as whole vectors; chunk `full` (if < chunks) is the tail
  __m512 sum = _mm512_setzero_ps();
  int64_t g = 0;  // next group to flush
  for (int64_t f0 = 0; f0 < c.chunks; f0 += c.chunks_per_flush) {
    const int64_t f1 = imin(f0 + c.chunks_per_flush, c.chunks);
    __m512i acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_si512();
    span_full(acc, w, c.xp, f0, imin(f1, full), row_bytes);
    if (f1 > full) chunk_tail(acc, w, c.xp, full, row_bytes);
    flush(c, acc, g, sum, a.w_scales + n0, 1, rmask);
  }
  __m512 y = _mm512_mul_ps(_mm512_set1_ps(c.sx), sum);
  if (a.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(rmask, a.bias + n0));
  store16(a.out, a.out_dtype, n0, y, rmask);
}

// Work units: page blocks of 16·P rows over the first N_pages = floor(N / 16P)·16P rows, then 16-row blocks.
struct Units {
  const Gemv4* c;
  int64_t P, page_blocks, pages_end;
};

void run_blocks(void* ctx, int64_t u0, int64_t u1) {
  const Units& u = *static_cast<const Units*>(ctx);
  for (int64_t i = u0; i < u1; ++i) {
    if (i < u.page_blocks) {
      page_block(*u.c, i * kRows * u.P, u.P);
    } else {
      block(*u.c, u.pages_end + (i - u.page_blocks) * kRows);
    }
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
  // Passes per page block: rows per 4 KiB page (1 for rows of ≥ 2 KiB + 1 byte, at most 8). Any P gives the same
  // result; this one reads each page front to back.
  const int64_t rs = a.K / 2;
  int64_t P = rs >= 4096 ? 1 : 4096 / rs;
  P = P > kMaxPasses ? kMaxPasses : P;
  Units u{&c, P, a.N / (kRows * P), 0};
  u.pages_end = u.page_blocks * kRows * P;
  parallel_chunks(u.page_blocks + (a.N - u.pages_end + kRows - 1) / kRows, &run_blocks, &u);
}

}  // namespace cider::kernels::x86::avx512
