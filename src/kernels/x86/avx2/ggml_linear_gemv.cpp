// Linear layer over native GGUF weights for few activation rows (decode and batched decode, M < kGgmlGemmFromM), AVX2:
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K and Q6_K. The AVX-512 table sends these M here too (but the K-quants'
// own 64-byte GEMV). Contract: GgmlLinearArgs
// (kernels/kernel_table.h); reference: ref/ggml_linear_ref.cpp.
//
// Activations: quantized as every native-weight kernel does (avx2/ggml_linear.cpp): per 32 elements ("piece"),
// step dx = max|x|/127, codes x = rint(x/dx) in [-127, 127]; kept beside them, per piece dx·Σx (formats with a
// minimum: Q4_1, Q5_1, Q4_K, Q5_K) or, per pair of codes, off·(x_2i + x_2i+1) (formats with a constant offset off: Q4_0 8,
// Q5_0 16, Q6_K 32).
// Weights: a block's codes are read unsigned, u = c + off in [0, 2^bits), so one vpmaddubsw(u, x) takes them as they
// are (pairs <= 2·63·127 < 2^15), and the offset comes off exactly in int16:
//   Σ c·x = Σ u·x - off·Σ x   (pairs after the subtraction in [-8128, 16002]: no saturation).
// Per piece the integer dot S (vpmaddwd by 1, or by Q6_K's sub-block scale) is exact; it is scaled in float32:
//   Q8_0 / Q4_0 / Q5_0: y += float(S)·(d·dx)                                      (Q8_0: |c|, sign(x, c): signed codes)
//   Q4_1 / Q5_1: y += float(S)·(d·dx) + m·(dx·X)                                  (X: the piece's sum of codes)
//   Q4_K, Q5_K: y += Σ_j float(S_j)·((d·sc_j)·dx_j) - Σ_j (dmin·m_j)·(dx_j·X_j)     (j: the block's 8 pieces)
//   Q6_K: y += d·Σ_j dx_j·float(Σ_h sc_jh·S_jh)                                     (h: the piece's halves of 16)
//   Q2_K: as Q6_K (codes 0-3, no offset, 4-bit scales), then - Σ_g (dmin·m_g)·(dx·X_g)  (g: the block's 16 groups of
//         16, X_g the sum of a group's codes)
// within the int8-activation bound of GgmlLinearArgs (the float32 sums are over K/32 pieces, as in the tiles).
// Work: weight rows in chunks of kRowsPerChunk over the thread pool. One activation row: kR1 weight rows read
// together (memory-level parallelism); more: 2 weight rows × 4 activation rows, each unpacked block serving all 4.
// The next tile's rows are prefetched line by line while a tile is read (short rows, such as Gemma's 640-wide output
// layer, are too short for the hardware prefetcher's per-row streams).
#include <cstring>

#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"

namespace cider::kernels::x86::avx2 {

namespace {

using quant::GgmlType;

constexpr int64_t kRowsPerChunk = 16;

constexpr int offset_shift(GgmlType t) {  // log2 of the constant offset of the unsigned codes; 0: none
  return t == GgmlType::kQ4_0 ? 3 : t == GgmlType::kQ5_0 ? 4 : t == GgmlType::kQ6_K ? 5 : 0;
}

constexpr int64_t block_bytes_of(GgmlType t) {
  return t == GgmlType::kQ8_0   ? 34
         : t == GgmlType::kQ4_0 ? 18
         : t == GgmlType::kQ5_0 ? 22
         : t == GgmlType::kQ4_1 ? 20
         : t == GgmlType::kQ5_1 ? 24
         : t == GgmlType::kQ4_K ? 144
         : t == GgmlType::kQ5_K ? 176
         : t == GgmlType::kQ2_K ? 84
                                : 210;
}

struct Ctx {
  const GgmlLinearArgs* a;
  const int8_t* xq;    // [M, K] codes
  const float* dx;     // [M, K/32] steps
  const float* xs;     // [M, K/32] dx·Σ codes of the piece (Q4_1, Q5_1, Q4_K, Q5_K); Q2_K: [M, K/16], of each 16 codes
  const int16_t* xo;   // [M, K/2] off·(x_2i + x_2i+1) (Q4_0, Q5_0, Q6_K)
};

static inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

static inline __m256 f16_bcast(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(h)));
}

// Σ u·x - off·Σ x over piece p of activation row m, as 16 int16 pair sums (u unsigned codes).
static inline __m256i offset_pairs(const Ctx& c, __m256i u, int64_t m, int64_t p) {
  const int64_t K = c.a->K;
  return _mm256_sub_epi16(_mm256_maddubs_epi16(u, load32(c.xq + m * K + p * 32)), load32(c.xo + m * (K / 2) + p * 16));
}

// vpshufb patterns: kHalves[j] repeats int16 2j in the low lane and 2j + 1 in the high lane (Q6_K's scales per 16).
struct Shuffles {
  alignas(32) int8_t halves[4][32];
};
constexpr Shuffles make_shuffles() {
  Shuffles t{};
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 32; ++i) t.halves[j][i] = static_cast<int8_t>(4 * j + 2 * (i / 16) + i % 2);
  return t;
}
constexpr Shuffles kShuffles = make_shuffles();
constexpr const int8_t (&kHalves)[4][32] = kShuffles.halves;

// A K-quant block's scales as floats (Q4_K, Q5_K), lane j for piece j: d·sc_j and dmin·m_j.
struct BlockScales {
  __m256 scale, mins;
};

// The 6-bit scales and minimums (bytes 4-15, as scales_mins8 reads them) of kR weight rows' blocks b[r], decoded two
// rows to a register (a 128-bit lane per row), then widened and multiplied by each block's d and dmin.
template <int kR>
static inline void block_scales(const uint8_t* const* b, BlockScales* out) {
  alignas(32) uint8_t bytes[kR + kR % 2][16];
  for (int r = 0; r < kR; r += 2) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[r] + 4));
    const __m128i hi = r + 1 < kR ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[r + 1] + 4)) : lo;
    const __m256i v = _mm256_set_m128i(hi, lo);
    // dwords of a lane: w0 w1 w2; wanted: sc_lo = w0 & 0x3f…, sc_hi = (w2 & 0x0f…) | ((w0 >> 6) & 0x03…) << 4,
    // mn_lo = w1 & 0x3f…, mn_hi = ((w2 >> 4) & 0x0f…) | ((w1 >> 6) & 0x03…) << 4
    const __m256i w0 = _mm256_shuffle_epi32(v, 0x00), w1 = _mm256_shuffle_epi32(v, 0x55), w2 = _mm256_shuffle_epi32(v, 0xAA);
    const __m256i a = _mm256_blend_epi32(w0, w1, 0xCC);  // dwords 0, 1: w0; 2, 3: w1
    const __m256i low6 = _mm256_and_si256(a, _mm256_set1_epi8(0x3f));
    const __m256i top = _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a, 6), _mm256_set1_epi8(0x03)), 4);
    const __m256i low4 = _mm256_and_si256(_mm256_blend_epi32(w2, _mm256_srli_epi32(w2, 4), 0x88), _mm256_set1_epi8(0x0f));
    _mm256_store_si256(reinterpret_cast<__m256i*>(bytes[r]), _mm256_blend_epi32(low6, _mm256_or_si256(low4, top), 0xAA));
  }
  for (int r = 0; r < kR; ++r) {
    const __m256 dm = _mm256_cvtph_ps(_mm_set1_epi32(static_cast<int>(u32_load(b[r]))));  // d, dmin, d, dmin, ...
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes[r]))));
    const __m256 mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes[r] + 8))));
    out[r].scale = _mm256_mul_ps(scf, _mm256_permute_ps(dm, 0x00));
    out[r].mins = _mm256_mul_ps(mnf, _mm256_permute_ps(dm, 0x55));
  }
}

// One block of one weight row against kT activation rows from m0, into acc[t] (bs: the block's scales, Q4_K / Q5_K).
template <GgmlType kType, int kT>
static inline void block_dot(const Ctx& c, const uint8_t* b, int64_t blk, int64_t m0, const BlockScales& bs,
                             __m256* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t K = c.a->K, P = K / 32;
  if constexpr (kType == GgmlType::kQ8_0) {
    const __m256 d = f16_bcast(b);
    const __m256i w = load32(b + 2), aw = _mm256_abs_epi8(w);
    for (int t = 0; t < kT; ++t) {
      const __m256i x = load32(c.xq + (m0 + t) * K + blk * 32);
      const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(c.dx[(m0 + t) * P + blk])), acc[t]);
    }
  } else if constexpr (kType == GgmlType::kQ4_0 || kType == GgmlType::kQ5_0 || kType == GgmlType::kQ4_1 ||
                       kType == GgmlType::kQ5_1) {  // d, [m (Q4_1, Q5_1)], [qh (Q5_0, Q5_1)], nibbles
    constexpr bool kMin = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;
    constexpr bool kFive = kType == GgmlType::kQ5_0 || kType == GgmlType::kQ5_1;
    constexpr int kQh = kMin ? 4 : 2, kQs = kQh + (kFive ? 4 : 0);
    const __m256 d = f16_bcast(b);
    __m256i u = nibbles32(b + kQs);
    if constexpr (kFive) u = _mm256_or_si256(u, bits32(u32_load(b + kQh)));
    for (int t = 0; t < kT; ++t) {
      const int64_t p = (m0 + t) * P + blk;
      // offset formats: Σ u·x − off·Σx in int16 pairs; formats with a minimum: Σ u·x, and m·dx·X below
      const __m256i pairs = kMin ? _mm256_maddubs_epi16(u, load32(c.xq + (m0 + t) * K + blk * 32))
                                 : offset_pairs(c, u, m0 + t, blk);
      const __m256i s = _mm256_madd_epi16(pairs, ones);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(c.dx[p])), acc[t]);
      if constexpr (kMin)  // the minimum's m·dx·X, into lane 0 (the tile adds the lanes)
        acc[t] = _mm256_fmadd_ps(f16_bcast(b + 2), _mm256_blend_ps(_mm256_setzero_ps(), _mm256_set1_ps(c.xs[p]), 1),
                                 acc[t]);
    }
  } else if constexpr (kType == GgmlType::kQ4_K || kType == GgmlType::kQ5_K) {
    // bs: d·sc_j and dmin·m_j of this block (block_scales, lane j: piece j)
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const int64_t p0 = blk * 8;
    alignas(32) float f[kT][8];  // per activation row: d·sc_j·dx_j, broadcast per piece
    for (int t = 0; t < kT; ++t)
      _mm256_store_ps(f[t], _mm256_mul_ps(bs.scale, _mm256_loadu_ps(c.dx + (m0 + t) * P + p0)));
    constexpr int kQs = kType == GgmlType::kQ4_K ? 16 : 48;  // Q5_K: qh [32] before the nibbles
    for (int q = 0; q < 4; ++q) {
      const __m256i v = load32(b + kQs + 32 * q);
      __m256i u[2] = {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
      if constexpr (kType == GgmlType::kQ5_K) {  // bit 4 of piece j's element i: bit j of qh[i]
        const __m256i qh = load32(b + 16), one = _mm256_set1_epi8(1);
        for (int h = 0; h < 2; ++h)
          u[h] = _mm256_or_si256(u[h], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * q + h), one), 4));
      }
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * q + h;
        for (int t = 0; t < kT; ++t) {
          const int64_t m = m0 + t;
          const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(u[h], load32(c.xq + m * K + (p0 + j) * 32)), ones);
          acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(&f[t][j]), acc[t]);
        }
      }
    }
    for (int t = 0; t < kT; ++t)  // the minimums' lanes are the block's pieces; the final sum adds the lanes
      acc[t] = _mm256_fnmadd_ps(bs.mins, _mm256_loadu_ps(c.xs + (m0 + t) * P + p0), acc[t]);
  } else if constexpr (kType == GgmlType::kQ2_K) {  // scales [16] (low nibble scale, high min), qs [64], d, dmin
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i lo4 = _mm_and_si128(sc, _mm_set1_epi8(0x0F));
    const __m128i sa = _mm_cvtepu8_epi16(lo4), sb = _mm_cvtepu8_epi16(_mm_srli_si128(lo4, 8));
    const __m256i scv[2] = {_mm256_set_m128i(sa, sa), _mm256_set_m128i(sb, sb)};
    const __m256i m2 = _mm256_set1_epi8(3);
    const int64_t p0 = blk * 8;
    __m256 blockacc[kT];
    for (int t = 0; t < kT; ++t) blockacc[t] = _mm256_setzero_ps();
    for (int h = 0; h < 2; ++h) {
      const __m256i v = load32(b + 16 + 32 * h);
      for (int j = 0; j < 4; ++j) {  // piece 4h + j: bits [2j, 2j + 2) of qs[32h + i]; groups 8h + 2j, 8h + 2j + 1
        const __m256i u = _mm256_and_si256(_mm256_srli_epi16(v, 2 * j), m2);
        const __m256i scj = _mm256_shuffle_epi8(scv[h], load32(kHalves[j]));
        const int64_t p = p0 + 4 * h + j;
        for (int t = 0; t < kT; ++t) {
          const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(u, load32(c.xq + (m0 + t) * K + p * 32)), scj);
          blockacc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(c.dx[(m0 + t) * P + p]), blockacc[t]);
        }
      }
    }
    const __m256 d = f16_bcast(b + 80), dmin = f16_bcast(b + 82);
    const __m128i mn = _mm_srli_epi16(_mm_andnot_si128(_mm_set1_epi8(0x0F), sc), 4);  // the 16 minimums
    const __m256 mins0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)), dmin);
    const __m256 mins1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8))), dmin);
    for (int t = 0; t < kT; ++t) {
      const float* xs = c.xs + (m0 + t) * 2 * P + blk * 16;
      acc[t] = _mm256_fmadd_ps(blockacc[t], d, acc[t]);
      acc[t] = _mm256_fnmadd_ps(mins0, _mm256_loadu_ps(xs), acc[t]);
      acc[t] = _mm256_fnmadd_ps(mins1, _mm256_loadu_ps(xs + 8), acc[t]);
    }
  } else {  // Q6_K: ql [128], qh [64], int8 scales [16], d
    static_assert(kType == GgmlType::kQ6_K);
    const uint8_t* sc = b + 192;
    const __m128i sa = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
    const __m128i sb = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8)));
    const __m256i scv[2] = {_mm256_set_m128i(sa, sa), _mm256_set_m128i(sb, sb)};
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    const int64_t p0 = blk * 8;
    __m256 blockacc[kT];
    for (int t = 0; t < kT; ++t) blockacc[t] = _mm256_setzero_ps();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(b + 64 * h), ql1 = load32(b + 64 * h + 32), qh = load32(b + 128 + 32 * h);
      const __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
      for (int j = 0; j < 4; ++j) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), m2);
        const __m256i u = _mm256_or_si256(lo[j], _mm256_slli_epi16(hi, 4));
        const __m256i scj = _mm256_shuffle_epi8(scv[h], load32(kHalves[j]));
        const int64_t p = p0 + 4 * h + j;
        for (int t = 0; t < kT; ++t) {
          const __m256i s = _mm256_madd_epi16(offset_pairs(c, u, m0 + t, p), scj);
          blockacc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(c.dx[(m0 + t) * P + p]), blockacc[t]);
        }
      }
    }
    const __m256 d = f16_bcast(b + 208);
    for (int t = 0; t < kT; ++t) acc[t] = _mm256_fmadd_ps(blockacc[t], d, acc[t]);
  }
}

// Weight rows [n0, n0 + nr) × activation rows [m0, m0 + kT) (nr <= kR; missing weight rows repeat the last one and
// are not stored). The kR rows are contiguous, and so are the next kR: per block step, the share (kR blocks' bytes)
// of a later tile is prefetched line by line — for the K-quants two tiles ahead into L2 (their blocks take longer to
// compute: Q4_K K4096 × N14336 on the AVX-512 VM 2.14 → 1.64–1.68 ms, 2026-12-05), for the 32-element formats the
// next tile into L1 (two ahead measured no faster there).
template <GgmlType kType, int kR, int kT>
void tile(const Ctx& c, int64_t n0, int nr, int64_t m0) {
  constexpr int64_t bb = block_bytes_of(kType), kLines = (kR * bb + 63) / 64 + 1;
  const GgmlLinearArgs& a = *c.a;
  const int64_t blocks = a.row_bytes / bb;
  const uint8_t* w[kR];
  for (int r = 0; r < kR; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (n0 + (r < nr ? r : nr - 1)) * a.row_bytes;
  __m256 acc[kR][kT];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < kT; ++t) acc[r][t] = _mm256_setzero_ps();
  constexpr bool kQuantK = bb >= 144 || kType == GgmlType::kQ2_K;  // the K-quants
  const uint8_t* pf = static_cast<const uint8_t*>(a.w) + (n0 + (kQuantK ? 2 : 1) * kR) * a.row_bytes;  // never read
  for (int64_t blk = 0; blk < blocks; ++blk, pf += kR * bb) {
    for (int64_t l = 0; l < kLines; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * l), kQuantK ? _MM_HINT_T1 : _MM_HINT_T0);
    BlockScales sc[kR];
    if constexpr (kType == GgmlType::kQ4_K || kType == GgmlType::kQ5_K) {
      const uint8_t* b[kR];
      for (int r = 0; r < kR; ++r) b[r] = w[r] + blk * bb;
      block_scales<kR>(b, sc);
    }
    for (int r = 0; r < kR; ++r) block_dot<kType, kT>(c, w[r] + blk * bb, blk, m0, sc[r], acc[r]);
  }
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < kT; ++t)
      a.out[(m0 + t) * a.N + n0 + r] = hsum_ps(acc[r][t]) + (a.bias ? a.bias[n0 + r] : 0.0f);
}

// One activation row: kR1 weight rows together; more: 2 weight rows × up to 4 activation rows.
constexpr int kR1 = 4;

template <GgmlType kType>
void rows_of(const Ctx& c, int64_t c0, int64_t c1) {
  const GgmlLinearArgs& a = *c.a;
  const int64_t n_end = imin(c1 * kRowsPerChunk, a.N);
  if (a.M == 1) {
    for (int64_t n0 = c0 * kRowsPerChunk; n0 < n_end; n0 += kR1)
      tile<kType, kR1, 1>(c, n0, static_cast<int>(imin(kR1, n_end - n0)), 0);
    return;
  }
  for (int64_t n0 = c0 * kRowsPerChunk; n0 < n_end; n0 += 2) {
    const int nr = static_cast<int>(imin(2, n_end - n0));
    int64_t m0 = 0;
    for (; m0 + 4 <= a.M; m0 += 4) tile<kType, 2, 4>(c, n0, nr, m0);
    switch (a.M - m0) {
      case 3: tile<kType, 2, 3>(c, n0, nr, m0); break;
      case 2: tile<kType, 2, 2>(c, n0, nr, m0); break;
      case 1: tile<kType, 2, 1>(c, n0, nr, m0); break;
      default: break;
    }
  }
}

void rows(void* vctx, int64_t c0, int64_t c1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  switch (static_cast<GgmlType>(c.a->ggml_type)) {
    case GgmlType::kQ8_0: return rows_of<GgmlType::kQ8_0>(c, c0, c1);
    case GgmlType::kQ4_0: return rows_of<GgmlType::kQ4_0>(c, c0, c1);
    case GgmlType::kQ5_0: return rows_of<GgmlType::kQ5_0>(c, c0, c1);
    case GgmlType::kQ4_1: return rows_of<GgmlType::kQ4_1>(c, c0, c1);
    case GgmlType::kQ5_1: return rows_of<GgmlType::kQ5_1>(c, c0, c1);
    case GgmlType::kQ2_K: return rows_of<GgmlType::kQ2_K>(c, c0, c1);
    case GgmlType::kQ4_K: return rows_of<GgmlType::kQ4_K>(c, c0, c1);
    case GgmlType::kQ5_K: return rows_of<GgmlType::kQ5_K>(c, c0, c1);
    default: return rows_of<GgmlType::kQ6_K>(c, c0, c1);  // ggml_linear_gemv_takes: nothing else
  }
}

}  // namespace

bool ggml_linear_gemv_takes(uint32_t ggml_type) {
  const auto t = static_cast<GgmlType>(ggml_type);
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(ggml_type);
  return (t == GgmlType::kQ8_0 || t == GgmlType::kQ4_0 || t == GgmlType::kQ5_0 || t == GgmlType::kQ4_1 ||
          t == GgmlType::kQ5_1 || t == GgmlType::kQ2_K ||
          t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K) &&
         f != nullptr && f->block_bytes == block_bytes_of(t);  // the format table's layout is the one read here
}

void ggml_linear_gemv(const GgmlLinearArgs& a) {
  const auto type = static_cast<GgmlType>(a.ggml_type);
  const int64_t P = a.K / 32, MP = a.M * P;
  int8_t* xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(a.M * a.K)));
  float* dx = static_cast<float*>(scratch(1, static_cast<size_t>(MP) * sizeof(float)));
  float* xs = static_cast<float*>(scratch(2, static_cast<size_t>(2 * MP) * sizeof(float)));
  int16_t* xo = static_cast<int16_t*>(scratch(3, static_cast<size_t>(MP) * 16 * sizeof(int16_t)));
  const int shift = offset_shift(type);
  const __m256i ones8 = _mm256_set1_epi8(1);
  for (int64_t mp = 0; mp < MP; ++mp) {  // piece mp: row mp / P (rows of x are K long, as the codes)
    int8_t* q = xq + mp * 32;
    int s0 = 0, s1 = 0;
    dx[mp] = quantize_piece32(a.x + mp * 32, q, &s0, &s1);  // max|x|/127; codes rint(x/step)
    if (shift > 0) {  // off·(x_2i + x_2i+1)
      const __m256i pairs = _mm256_maddubs_epi16(ones8, load32(q));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xo + mp * 16), _mm256_sll_epi16(pairs, _mm_cvtsi32_si128(shift)));
    } else if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ4_1 ||
               type == GgmlType::kQ5_1) {  // the minimums' dx·Σx
      xs[mp] = dx[mp] * static_cast<float>(s0 + s1);
    } else if (type == GgmlType::kQ2_K) {  // the minimums' dx·Σx per 16
      xs[2 * mp] = dx[mp] * static_cast<float>(s0);
      xs[2 * mp + 1] = dx[mp] * static_cast<float>(s1);
    }
  }
  Ctx c{&a, xq, dx, xs, xo};
  parallel_chunks((a.N + kRowsPerChunk - 1) / kRowsPerChunk, &rows, &c);
}

}  // namespace cider::kernels::x86::avx2
