// Linear layer over native GGUF weights for few activation rows (decode and batched decode, M < kFromM of
// avx512/ggml_linear.cpp), AVX-512 VNNI: Q4_K, Q5_K and Q6_K, the formats that carry most of a Q4_K_M / Q5_K_M
// file's bytes. The others take the AVX2 level's kernels (Q8_0 there is faster than with 64-byte vectors over its
// 34-byte blocks: 1.95-2.02 against 2.29-2.98 ms at K 4096 × N 14336, 2 threads, 2026-12-05). Contract: GgmlLinearArgs (kernels/kernel_table.h);
// reference: ref/ggml_linear_ref.cpp.
//
// Activations: quantized as every native-weight kernel does (avx2/ggml_linear.cpp, bit for bit the same codes and
// steps): per 32 elements ("piece"), step dx = max|x|/127, codes x = rint(x/dx) in [-127, 127]. One 64-byte vector of
// weight codes holds two pieces, 16 int32 lanes of vpdpbusd (u unsigned codes × x signed codes, 4 products a lane),
// lanes 0-7 the first piece, 8-15 the second; the activation codes are stored in the order the weight vectors hold
// the pieces (Q4_K, Q5_K: a block's pieces 0,2 | 1,3 | 4,6 | 5,7, the low and high nibbles of two 32-byte groups;
// Q6_K: in order). Kept beside the codes, per row: per block, dx of each piece then dx·Σx of each (Q4_K, Q5_K);
// −32·Σ of every 4 codes, the accumulator's start, and dx of each lane (Q6_K: u = c + 32).
// Per vector the integer sums S (exact) are scaled per lane in float32:
//   Q4_K, Q5_K: y += Σ_lanes float(S)·(d·sc_j·dx_j) − Σ_j (dmin·m_j)·(dx_j·X_j)   (j: the lane's piece)
//   Q6_K:       y += Σ_lanes float(S)·(d·sc_jh·dx_j)                          (h: the lane's half of 16)
// within the int8-activation bound of GgmlLinearArgs (float32 sums of K/32 pieces, as in the other kernels).
// Work: weight rows in chunks of kRowsPerChunk over the thread pool. One activation row: kR1 weight rows read
// together (memory-level parallelism); more: 2 weight rows × up to 4 activation rows, each unpacked vector serving
// all of them. The next tile's rows are prefetched line by line while a tile is read.

#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"

namespace cider::kernels::x86::avx512 {

namespace {

using quant::GgmlType;

constexpr int64_t kRowsPerChunk = 16;

constexpr int64_t block_bytes_of(GgmlType t) {
  return t == GgmlType::kQ4_K ? 144 : t == GgmlType::kQ5_K ? 176 : 210;
}
constexpr bool has_mins(GgmlType t) { return t == GgmlType::kQ4_K || t == GgmlType::kQ5_K; }

struct Ctx {
  const GgmlLinearArgs* a;
  const int8_t* xq;    // [M, K] codes, in the weight vectors' piece order
  const float* dxs;    // [M, K/256, 16] per block: dx of its 8 pieces, then dx·Σ codes of each (Q4_K, Q5_K)
  const int32_t* xo;   // [M, K/4] −32·Σ of each 4 codes (Q6_K)
  const float* dxv;    // [M, K/4] the step of each lane's piece (Q6_K)
};

static inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }

// vpermps indices: lanes 0-7 take element a, 8-15 element b (Q4_K / Q5_K: the vector's pieces, of a block's 8
// scales), and lane l takes element 4v + l/4 (Q6_K: vector v's scales per 16 codes, of a block's 16).
static inline __m512i pair_index(int a, int b) {
  return _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(a), _mm512_set1_epi32(b));
}
static inline __m512i quarter_index(int v) {
  return _mm512_add_epi32(_mm512_set1_epi32(4 * v),
                          _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2));
}

// The scales of kR weight rows' blocks (Q4_K, Q5_K) unpacked together, one 128-bit lane per row: S[r] = [d·sc_0 …
// d·sc_7 | dmin·m_0 … dmin·m_7] of the block at b[r] (the 6-bit fields of bytes 4-15, as scales_mins8 reads them;
// the same float32 products as scaling each row alone).
template <int kR>
static inline void block_scales(const uint8_t* const* b, __m512* S) {
  static_assert(kR >= 1 && kR <= 4);
  __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0] + 4)));
  if constexpr (kR > 1) v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[1] + 4)), 1);
  if constexpr (kR > 2) v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[2] + 4)), 2);
  if constexpr (kR > 3) v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[3] + 4)), 3);
  // dwords of a lane: w0 w1 w2 (bytes 4-15 of the block); wanted: sc_lo = w0 & 0x3f…, sc_hi = (w2 & 0x0f…) |
  // ((w0 >> 6) & 0x03…) << 4, mn_lo = w1 & 0x3f…, mn_hi = ((w2 >> 4) & 0x0f…) | ((w1 >> 6) & 0x03…) << 4
  const __m512i w0 = _mm512_shuffle_epi32(v, _MM_PERM_AAAA), w1 = _mm512_shuffle_epi32(v, _MM_PERM_BBBB),
                w2 = _mm512_shuffle_epi32(v, _MM_PERM_CCCC);
  const __m512i a = _mm512_mask_blend_epi32(0xCCCC, w0, w1);  // dwords 0, 1: w0; 2, 3: w1
  const __m512i lo = _mm512_and_si512(a, _mm512_set1_epi8(0x3f));
  const __m512i top = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a, 6), _mm512_set1_epi8(0x03)), 4);
  const __m512i low4 =
      _mm512_and_si512(_mm512_mask_blend_epi32(0x8888, w2, _mm512_srli_epi32(w2, 4)), _mm512_set1_epi8(0x0f));
  const __m512i sm = _mm512_mask_blend_epi32(0xAAAA, lo, _mm512_or_si512(low4, top));
  alignas(64) uint8_t bytes[64];
  _mm512_store_si512(bytes, sm);
  const __m512i half = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  for (int r = 0; r < kR; ++r) {
    const __m512 dm = _mm512_permutexvar_ps(half, _mm512_cvtph_ps(_mm256_set1_epi32(static_cast<int>(u32_load(b[r])))));
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes + 16 * r))));
    S[r] = _mm512_mul_ps(f, dm);  // d·sc_j | dmin·m_j
  }
}

// One block of one weight row against kT activation rows from m0: acc[t] the per-lane float sums, accm[t] (lanes
// 8-15) the minimums' per-piece terms (Q4_K, Q5_K: S the block's scales, block_scales).
template <GgmlType kType, int kT>
static inline void block_dot(const Ctx& c, const uint8_t* b, int64_t blk, int64_t m0, __m512 S, __m512* acc,
                             __m512* accm) {
  if constexpr (has_mins(kType)) {
    constexpr int kQs = kType == GgmlType::kQ4_K ? 16 : 48;  // Q5_K: qh [32] before the nibbles
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i q0 = load64(b + kQs), q1 = load64(b + kQs + 64);
    // u[v]: pieces (0,2), (1,3), (4,6), (5,7)
    __m512i u[4] = {_mm512_and_si512(q0, m4), _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), _mm512_and_si512(q1, m4),
                    _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4)};
    if constexpr (kType == GgmlType::kQ5_K) {  // bit 4 of piece j's element i: bit j of qh[i]
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);  // bits j, j+2
      const __m512i b4 = _mm512_set1_epi8(0x10);
      // vpternlogd 0xF8: a | (b & c)
      u[0] = _mm512_ternarylogic_epi32(u[0], _mm512_slli_epi16(qh2, 4), b4, 0xF8);
      u[1] = _mm512_ternarylogic_epi32(u[1], _mm512_slli_epi16(qh2, 3), b4, 0xF8);
      u[2] = _mm512_ternarylogic_epi32(u[2], qh2, b4, 0xF8);
      u[3] = _mm512_ternarylogic_epi32(u[3], _mm512_srli_epi16(qh2, 1), b4, 0xF8);
    }
    const __m512i idx[4] = {pair_index(0, 2), pair_index(1, 3), pair_index(4, 6), pair_index(5, 7)};
    const int64_t blocks = c.a->K / 256;
    for (int t = 0; t < kT; ++t) {
      const int64_t m = m0 + t;
      const __m512 dxs = _mm512_loadu_ps(c.dxs + (m * blocks + blk) * 16);  // dx_j | dx_j·X_j
      const __m512 sdx = _mm512_mul_ps(S, dxs);                              // lanes 0-7: d·sc_j·dx_j
      const int8_t* x = c.xq + m * c.a->K + blk * 256;
      for (int v = 0; v < 4; ++v) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[v], load64(x + 64 * v));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(idx[v], sdx), acc[t]);
      }
      accm[t] = _mm512_mask3_fnmadd_ps(S, dxs, accm[t], 0xFF00);  // lanes 8-15: −= (dmin·m_j)·(dx_j·X_j)
    }
  } else {  // Q6_K: ql [128], qh [64], int8 scales [16], d
    static_assert(kType == GgmlType::kQ6_K);
    const __m512 scz = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)))),
        _mm512_set1_ps(f16_load(b + 208)));  // d·sc per 16 codes
    const __m512i m4 = _mm512_set1_epi8(0x0F), b45 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = load64(b + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      // pieces (4h, 4h+1): low nibbles of ql | bits 0-1 (and 2-3) of qh at 4-5; (4h+2, 4h+3): high nibbles | bits 4-5
      // (and 6-7). vpternlogd 0xEA: (a & b) | c.
      const __m512i u[2] = {
          _mm512_ternarylogic_epi32(ql, m4, _mm512_and_si512(_mm512_slli_epi16(qh2, 4), b45), 0xEA),
          _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m4, _mm512_and_si512(qh2, b45), 0xEA)};
      for (int e = 0; e < 2; ++e) {
        const int v = 2 * h + e;
        const __m512 sc = _mm512_permutexvar_ps(quarter_index(v), scz);
        for (int t = 0; t < kT; ++t) {
          const int64_t o = (m0 + t) * c.a->K + blk * 256 + 64 * v;
          const __m512i s = _mm512_dpbusd_epi32(load64(c.xo + o / 4), u[e], load64(c.xq + o));
          acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, _mm512_loadu_ps(c.dxv + o / 4)), acc[t]);
        }
      }
    }
  }
}

// Weight rows [n0, n0 + nr) × activation rows [m0, m0 + kT) (nr <= kR; missing weight rows repeat the last one and
// are not stored). The kR rows are contiguous, and so are the next kR: per step, the share of the tile two ahead is
// prefetched line by line into L2 (one tile ahead into L1 before: Q4_K K4096 × N14336 1.82–1.97 → 1.53–1.60 ms on the
// AVX-512 VM, 2 threads, 2026-12-05).
template <GgmlType kType, int kR, int kT>
void tile(const Ctx& c, int64_t n0, int nr, int64_t m0) {
  constexpr int64_t bb = block_bytes_of(kType), kLines = (kR * bb + 63) / 64 + 1;
  const GgmlLinearArgs& a = *c.a;
  const int64_t blocks = a.row_bytes / bb;
  const uint8_t* w[kR];
  for (int r = 0; r < kR; ++r) w[r] = static_cast<const uint8_t*>(a.w) + (n0 + (r < nr ? r : nr - 1)) * a.row_bytes;
  __m512 acc[kR][kT], accm[kR][kT];
  for (int r = 0; r < kR; ++r)
    for (int t = 0; t < kT; ++t) {
      acc[r][t] = _mm512_setzero_ps();
      accm[r][t] = _mm512_setzero_ps();
    }
  const uint8_t* pf = static_cast<const uint8_t*>(a.w) + (n0 + 2 * kR) * a.row_bytes;  // never dereferenced
  for (int64_t blk = 0; blk < blocks; ++blk, pf += kR * bb) {
    for (int64_t l = 0; l < kLines; ++l) _mm_prefetch(reinterpret_cast<const char*>(pf + 64 * l), _MM_HINT_T1);
    __m512 S[kR];
    if constexpr (has_mins(kType)) {
      const uint8_t* b[kR];
      for (int r = 0; r < kR; ++r) b[r] = w[r] + blk * bb;
      block_scales<kR>(b, S);
    } else {
      for (int r = 0; r < kR; ++r) S[r] = _mm512_setzero_ps();
    }
    for (int r = 0; r < kR; ++r) block_dot<kType, kT>(c, w[r] + blk * bb, blk, m0, S[r], acc[r], accm[r]);
  }
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < kT; ++t)
      a.out[(m0 + t) * a.N + n0 + r] =
          _mm512_reduce_add_ps(acc[r][t]) + (has_mins(kType) ? _mm512_reduce_add_ps(accm[r][t]) : 0.0f) + (a.bias ? a.bias[n0 + r] : 0.0f);
}

constexpr int kR1 = 4;    // weight rows read together for one activation row

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
    case GgmlType::kQ4_K: return rows_of<GgmlType::kQ4_K>(c, c0, c1);
    case GgmlType::kQ5_K: return rows_of<GgmlType::kQ5_K>(c, c0, c1);
    default: return rows_of<GgmlType::kQ6_K>(c, c0, c1);  // ggml_linear_gemv_takes: nothing else
  }
}

}  // namespace

bool ggml_linear_gemv_takes(uint32_t ggml_type) {
  const auto t = static_cast<GgmlType>(ggml_type);
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(ggml_type);
  return (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K) &&
         f != nullptr && f->block_bytes == block_bytes_of(t);  // the format table's layout is the one read here
}

void ggml_linear_gemv(const GgmlLinearArgs& a) {
  const auto type = static_cast<GgmlType>(a.ggml_type);
  const int64_t P = a.K / 32;  // K: whole blocks of 256
  int8_t* xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(a.M * a.K)));
  float* dxs = static_cast<float*>(scratch(1, static_cast<size_t>(a.M * P * 2) * sizeof(float)));  // [M·P/8][16]
  int32_t* xo = static_cast<int32_t*>(scratch(3, static_cast<size_t>(a.M * a.K / 4) * 8));  // then dxv, as long
  float* dxv = reinterpret_cast<float*>(xo + a.M * a.K / 4);
  const bool mins = has_mins(type);
  for (int64_t mp = 0; mp < a.M * P; ++mp) {  // piece mp: row mp / P (rows of x are K long, as the codes)
    // Q4_K / Q5_K: piece j of a block sits at slot j with 1 <-> 2 and 5 <-> 6 swapped (the vectors' pieces).
    const int64_t j = mp % 8, slot = mins ? mp - j + (j == 1 ? 2 : j == 2 ? 1 : j == 5 ? 6 : j == 6 ? 5 : j) : mp;
    int8_t* q = xq + slot * 32;
    int s0 = 0, s1 = 0;
    const float step = quantize_piece32(a.x + mp * 32, q, &s0, &s1);  // max|x|/127; codes rint(x/step)
    if (mins) {  // block mp / 8 (P is a multiple of 8): dx of its pieces, then dx·Σ codes
      dxs[(mp / 8) * 16 + mp % 8] = step;
      dxs[(mp / 8) * 16 + 8 + mp % 8] = step * static_cast<float>(s0 + s1);
    } else {
      for (int l = 0; l < 8; ++l) {
        xo[slot * 8 + l] = -32 * (q[4 * l] + q[4 * l + 1] + q[4 * l + 2] + q[4 * l + 3]);
        dxv[slot * 8 + l] = step;
      }
    }
  }
  Ctx c{&a, xq, dxs, xo, dxv};
  parallel_chunks((a.N + kRowsPerChunk - 1) / kRowsPerChunk, &rows, &c);
}

}  // namespace cider::kernels::x86::avx512
