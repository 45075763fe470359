// Linear layer over native GGUF weights whose rows are interleaved 8 at a time (quant/ggml_interleave.h: Q4_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), for few activation rows (M < kGgmlGemmFromM: decode and batched decode), AVX2.
// Contract: GgmlLinearArgs with interleaved (kernels/kernel_table.h); reference: ref/ggml_linear_ref.cpp.
//
// Why: over the file's layout (avx2/ggml_linear_gemv.cpp) every 32-weight block of every row pays its own unpacking
// and its own float tail (convert, scale, add: about 23 instructions per block), which leaves these formats
// compute-bound on two AVX2 cores at half the memory's speed. Here a 32-byte register holds 4 codes of each of 8
// rows, so the int32 lanes are the rows: the fifth bits come from one shift and mask of the octet's hb, the float tail
// is paid once per block for 8 rows (about 8 instructions per row-block in all). The K-quants' float tails and scale
// decoding were the same share there (Q4_K 12.8 GB/s of weights per core in the caches, here 24.9; Q6_K 16.3 → 24.7).
//
// Activations: per 32 elements ("piece") step dx = max|x|/127 and codes rint(x/dx), as every native-weight kernel
// (avx2/ggml_linear.cpp); beside them per piece off·Σx (offset formats: Q4_0 8, Q5_0 16) or dx·Σx (formats with a
// minimum).
// The 32-element formats, per octet (block b of 8 rows) and activation row, over its 8 steps j of 4 codes (codes
// 4j … 4j + 3 of every row: the low nibbles of qs vector j for j < 4, the high nibbles of vector j − 4 for j >= 4):
//   u_j = nibbles | ((hb >> j) & 1) << 4         (unsigned codes u = c + off < 2^bits; the fifth bit for Q5_0, Q5_1)
//   s16 += vpmaddubsw(u_j, x[4j … 4j + 3] broadcast to every lane)         (pairs ≤ 2·31·127)
//   summed in int16 over 4 steps (5-bit: 4·7874 < 2^15) or 8 (4-bit: 8·3810), then vpmaddwd by 1 into S (int32);
//   y_l += float(S_l − off·Σx)·(d_l·dx)  [+ m_l·(dx·Σx)]                      (l: the lane, the row)
// The K-quants the same way per piece of 32 (k45_piece, q6k_piece): Q4_K / Q5_K with their 6-bit scales and
// minimums decoded once per octet for the 8 rows, Q6_K with its two int8 scales per piece in the integer sums
// (vpmaddwd). All within the int8-activation bound of GgmlLinearArgs (the float32 sums are over K/32 pieces, as the
// other tiles').
// Work: 16-row chunks over the thread pool; one octet row group × up to 4 (4-bit), 3 (5-bit) or 2 (Q6_K) activation
// rows per tile, the unpacked codes serving every activation row. The K-quant tiles prefetch kOctetsAhead ahead.
#include <cstring>
#include <utility>

#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86::avx2 {

namespace {

using quant::GgmlType;

constexpr int64_t kRowsPerChunk = 16;
// The K-quant tiles prefetch the octet this many ahead of the one they read (a group's octets, and the next group's,
// are contiguous). On the 2-core AVX2 VM 2, 4, 8 and 16 ahead and none were within its round-to-round noise for
// K4096 × N14336 (2026-12-07); 8 is the one measured end to end.
constexpr int64_t kOctetsAhead = 8;

template <GgmlType kType>
struct Octet {
  static constexpr bool kMin = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;
  static constexpr bool kFive = five_bits(kType);
  static constexpr int kOff = kType == GgmlType::kQ4_0 ? 8 : kType == GgmlType::kQ5_0 ? 16 : 0;
  static constexpr int kHb = octet_hb(kType);            // hb's offset (5-bit formats)
  static constexpr int kQs = octet_qs(kType);            // qs's offset
  static constexpr int64_t kBytes = octet_bytes(kType);  // 8 blocks
  static constexpr int kGroup = kFive ? 4 : 8;           // steps summed in int16
  // activation rows per tile (registers)
  static constexpr int kMaxT = kType == GgmlType::kQ6_K ? 2 : kFive || kType == GgmlType::kQ5_K ? 3 : 4;
};

struct Ctx {
  const GgmlLinearArgs* a;
  const int8_t* xq;    // [M, K] codes
  const float* dx;     // [M, P] steps
  const int32_t* xo;   // [M, P] off·Σ codes of the piece (offset formats); Q6_K: its half sums, int16 pairs
  const float* xs;     // [M, P] dx·Σ codes of the piece (formats with a minimum)
};

static inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Steps v and v + 4 (vector v of qs) of one octet against kT activation rows: adds vpmaddubsw pairs into s16[t].
template <GgmlType kType, int kT, int V>
static inline void steps(const uint8_t* oct, __m256i hb, const int8_t* const* x, __m256i* s16) {
  using O = Octet<kType>;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i q = load32(oct + O::kQs + 32 * V);
  __m256i u0 = _mm256_and_si256(q, m4), u1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
  if constexpr (O::kFive) {
    u0 = _mm256_or_si256(u0, fifth_bits<V>(hb));
    u1 = _mm256_or_si256(u1, fifth_bits<V + 4>(hb));
  }
  for (int t = 0; t < kT; ++t) {  // codes 4V … 4V + 3 (low nibbles) and 16 + 4V … (high), the same 4 of each row
    int32_t x0, x1;
    std::memcpy(&x0, x[t] + 4 * V, 4);
    std::memcpy(&x1, x[t] + 16 + 4 * V, 4);
    s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(u0, _mm256_set1_epi32(x0)));
    s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(u1, _mm256_set1_epi32(x1)));
  }
}

// Rows 8g … 8g + 7 × activation rows [m0, m0 + kT).
template <GgmlType kType, int kT>
void tile(const Ctx& c, int64_t g, int64_t m0) {
  using O = Octet<kType>;
  const GgmlLinearArgs& a = *c.a;
  const int64_t K = a.K, P = K / 32;
  const uint8_t* oct = static_cast<const uint8_t*>(a.w) + g * P * O::kBytes;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kT];
  for (int t = 0; t < kT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t p = 0; p < P; ++p, oct += O::kBytes) {
    const __m256i hb = O::kFive ? load32(oct + O::kHb) : _mm256_setzero_si256();
    const int8_t* x[kT];
    for (int t = 0; t < kT; ++t) x[t] = c.xq + (m0 + t) * K + p * 32;
    __m256i s32[kT], s16[kT];
    for (int t = 0; t < kT; ++t) s16[t] = _mm256_setzero_si256();
    steps<kType, kT, 0>(oct, hb, x, s16);
    steps<kType, kT, 1>(oct, hb, x, s16);
    if constexpr (O::kGroup == 4) {  // 4 steps summed in int16: into int32 before the next 4
      for (int t = 0; t < kT; ++t) {
        s32[t] = _mm256_madd_epi16(s16[t], ones);
        s16[t] = _mm256_setzero_si256();
      }
    }
    steps<kType, kT, 2>(oct, hb, x, s16);
    steps<kType, kT, 3>(oct, hb, x, s16);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct)));
    for (int t = 0; t < kT; ++t) {
      __m256i s = _mm256_madd_epi16(s16[t], ones);
      if constexpr (O::kGroup == 4) s = _mm256_add_epi32(s, s32[t]);
      const int64_t i = (m0 + t) * P + p;
      if constexpr (O::kOff != 0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(c.xo[i]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(c.dx[i])), acc[t]);
      if constexpr (O::kMin)
        acc[t] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct + 16))),
                                 _mm256_set1_ps(c.xs[i]), acc[t]);
    }
  }
  for (int t = 0; t < kT; ++t) {
    __m256 y = acc[t];
    if (a.bias) y = _mm256_add_ps(y, _mm256_loadu_ps(a.bias + 8 * g));
    _mm256_storeu_ps(a.out + (m0 + t) * a.N + 8 * g, y);
  }
}

// Q4_K / Q5_K (kFive), piece J of block blk of rows 8g … 8g + 7 (octet oct) × activation rows [m0, m0 + kT): the 8
// steps of 4 codes (the low or high nibbles of qs vectors 8(J / 2) … + 7; Q5_K: | bit J of the qh vector of the step,
// at bit 4) summed in int16 (4-bit: 8·3810 < 2^15; 5-bit: 4 steps at a time, 4·7874), and
//   y_l += float(S_l)·((d_l·sc_Jl)·dx_J) − (dmin_l·mn_Jl)·(dx_J·X_J)
// (sm: the octet's scales and minimums, q4k_octet_scales).
template <bool kFive, int kT, int J>
static inline void k45_piece(const Ctx& c, const uint8_t* oct, int64_t blk, int64_t m0, const uint8_t* sm, __m256 d,
                             __m256 dmin, __m256* acc) {
  const int64_t K = c.a->K, P = K / 32;
  const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
  const uint8_t* qv = oct + (kFive ? 384 : 128) + 256 * (J / 2);
  __m256i s16[kT], s32[kT];
  for (int t = 0; t < kT; ++t) s16[t] = s32[t] = _mm256_setzero_si256();
  for (int v = 0; v < 8; ++v) {
    const __m256i q = load32(qv + 32 * v);
    __m256i u = _mm256_and_si256(J % 2 ? _mm256_srli_epi16(q, 4) : q, m4);
    if constexpr (kFive) u = _mm256_or_si256(u, fifth_bits<J>(load32(oct + 128 + 32 * v)));
    for (int t = 0; t < kT; ++t) {
      int32_t x0;
      std::memcpy(&x0, c.xq + (m0 + t) * K + blk * 256 + 32 * J + 4 * v, 4);
      s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(u, _mm256_set1_epi32(x0)));
    }
    if constexpr (kFive) {
      if (v == 3)
        for (int t = 0; t < kT; ++t) {
          s32[t] = _mm256_madd_epi16(s16[t], ones);
          s16[t] = _mm256_setzero_si256();
        }
    }
  }
  const __m256 sc = _mm256_mul_ps(d, u8x8_ps(sm + 8 * J)), mn = _mm256_mul_ps(dmin, u8x8_ps(sm + 64 + 8 * J));
  for (int t = 0; t < kT; ++t) {
    const int64_t i = (m0 + t) * P + blk * 8 + J;
    __m256i S = _mm256_madd_epi16(s16[t], ones);
    if constexpr (kFive) S = _mm256_add_epi32(S, s32[t]);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(sc, _mm256_set1_ps(c.dx[i])), acc[t]);
    acc[t] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(c.xs[i]), acc[t]);
  }
}

// Q4_K / Q5_K, rows 8g … 8g + 7 × activation rows [m0, m0 + kT): per octet (block b of the 8 rows) its scales and
// minimums decoded once (q4k_octet_scales), then its 8 pieces (k45_piece).
template <bool kFive, int kT>
void tile_k45(const Ctx& c, int64_t g, int64_t m0) {
  constexpr int64_t kOB = octet_bytes(kFive ? GgmlType::kQ5_K : GgmlType::kQ4_K);
  const GgmlLinearArgs& a = *c.a;
  const int64_t B = a.K / 256;
  const uint8_t* oct = static_cast<const uint8_t*>(a.w) + g * B * kOB;
  __m256 acc[kT];
  for (int t = 0; t < kT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < B; ++blk, oct += kOB) {
    for (int64_t l = 0; l < (kOB + 63) / 64; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(oct + kOctetsAhead * kOB + 64 * l), _MM_HINT_T0);
    alignas(32) uint8_t sm[128];
    q4k_octet_scales(oct, sm);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct)));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct + 16)));
    [&]<int... J>(std::integer_sequence<int, J...>) {
      (k45_piece<kFive, kT, J>(c, oct, blk, m0, sm, d, dmin, acc), ...);
    }(std::make_integer_sequence<int, 8>{});
  }
  for (int t = 0; t < kT; ++t) {
    __m256 y = acc[t];
    if (a.bias) y = _mm256_add_ps(y, _mm256_loadu_ps(a.bias + 8 * g));
    _mm256_storeu_ps(a.out + (m0 + t) * a.N + 8 * g, y);
  }
}

// Q6_K, piece J of block blk of rows 8g … 8g + 7 (octet oct) × activation rows [m0, m0 + kT): the 8 steps of 4
// unsigned codes u = c + 32 (q6k_octet_codes) summed in int16 two at a time (2·16002 < 2^15), each pair of steps by
// vpmaddwd with its half's scale into I (int32: Σ_h sc_h·Σ u·x), the offset taken off as 32·Σ_h sc_h·X_h (one vpmaddwd
// of the scale pairs by the piece's two half sums X_h), then
//   y_l += float(I_l − 32·Σ_h sc_hl·X_h)·(d_l·dx_J)
template <int kT, int J>
static inline void q6k_piece(const Ctx& c, const uint8_t* oct, int64_t blk, int64_t m0, __m256 d, __m256* acc) {
  const int64_t K = c.a->K, P = K / 32;
  // dword l: row l's scales of the piece's halves (int16 pairs); each half's scale in both int16 of dword l
  const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct + 16 + 16 * J)));
  const __m256i dup[2] = {
      _mm256_shuffle_epi8(sc, _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4,
                                               5, 8, 9, 8, 9, 12, 13, 12, 13)),
      _mm256_shuffle_epi8(sc, _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7,
                                               6, 7, 10, 11, 10, 11, 14, 15, 14, 15))};
  __m256i I[kT];
  for (int t = 0; t < kT; ++t) I[t] = _mm256_setzero_si256();
  for (int v0 = 0; v0 < 8; v0 += 2) {
    __m256i s16[kT];
    for (int t = 0; t < kT; ++t) s16[t] = _mm256_setzero_si256();
    for (int v = v0; v < v0 + 2; ++v) {
      const __m256i u = q6k_octet_codes<J>(oct, v);
      for (int t = 0; t < kT; ++t) {
        int32_t x0;
        std::memcpy(&x0, c.xq + (m0 + t) * K + blk * 256 + 32 * J + 4 * v, 4);
        s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(u, _mm256_set1_epi32(x0)));
      }
    }
    for (int t = 0; t < kT; ++t) I[t] = _mm256_add_epi32(I[t], _mm256_madd_epi16(s16[t], dup[v0 / 4]));
  }
  for (int t = 0; t < kT; ++t) {
    const int64_t i = (m0 + t) * P + blk * 8 + J;
    const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc, _mm256_set1_epi32(c.xo[i])), 5);
    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(I[t], off)), _mm256_mul_ps(d, _mm256_set1_ps(c.dx[i])),
                             acc[t]);
  }
}

template <int kT>
void tile_q6k(const Ctx& c, int64_t g, int64_t m0) {
  const GgmlLinearArgs& a = *c.a;
  const int64_t B = a.K / 256;
  constexpr int64_t kOB = octet_bytes(GgmlType::kQ6_K);
  const uint8_t* oct = static_cast<const uint8_t*>(a.w) + g * B * kOB;
  __m256 acc[kT];
  for (int t = 0; t < kT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t blk = 0; blk < B; ++blk, oct += kOB) {
    for (int64_t l = 0; l < (kOB + 63) / 64; ++l)
      _mm_prefetch(reinterpret_cast<const char*>(oct + kOctetsAhead * kOB + 64 * l), _MM_HINT_T0);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct)));
    [&]<int... J>(std::integer_sequence<int, J...>) {
      (q6k_piece<kT, J>(c, oct, blk, m0, d, acc), ...);
    }(std::make_integer_sequence<int, 8>{});
  }
  for (int t = 0; t < kT; ++t) {
    __m256 y = acc[t];
    if (a.bias) y = _mm256_add_ps(y, _mm256_loadu_ps(a.bias + 8 * g));
    _mm256_storeu_ps(a.out + (m0 + t) * a.N + 8 * g, y);
  }
}

template <GgmlType kType>
void rows_of(const Ctx& c, int64_t c0, int64_t c1) {
  constexpr int kMaxT = Octet<kType>::kMaxT;
  const GgmlLinearArgs& a = *c.a;
  const int64_t g_end = imin(c1 * kRowsPerChunk, a.N) / 8;
  for (int64_t g = c0 * kRowsPerChunk / 8; g < g_end; ++g) {
    auto run = [&]<int kT>(int64_t m0) {
      if constexpr (kType == GgmlType::kQ4_K || kType == GgmlType::kQ5_K)
        tile_k45<kType == GgmlType::kQ5_K, kT>(c, g, m0);
      else if constexpr (kType == GgmlType::kQ6_K) tile_q6k<kT>(c, g, m0);
      else tile<kType, kT>(c, g, m0);
    };
    int64_t m0 = 0;
    for (; m0 + kMaxT <= a.M; m0 += kMaxT) run.template operator()<kMaxT>(m0);
    switch (a.M - m0) {
      case 3: if constexpr (kMaxT > 3) run.template operator()<3>(m0); break;
      case 2: run.template operator()<2>(m0); break;
      case 1: run.template operator()<1>(m0); break;
      default: break;
    }
  }
}

void rows(void* vctx, int64_t c0, int64_t c1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  switch (static_cast<GgmlType>(c.a->ggml_type)) {
    case GgmlType::kQ4_0: return rows_of<GgmlType::kQ4_0>(c, c0, c1);
    case GgmlType::kQ4_1: return rows_of<GgmlType::kQ4_1>(c, c0, c1);
    case GgmlType::kQ5_0: return rows_of<GgmlType::kQ5_0>(c, c0, c1);
    case GgmlType::kQ4_K: return rows_of<GgmlType::kQ4_K>(c, c0, c1);
    case GgmlType::kQ5_K: return rows_of<GgmlType::kQ5_K>(c, c0, c1);
    case GgmlType::kQ6_K: return rows_of<GgmlType::kQ6_K>(c, c0, c1);
    default: return rows_of<GgmlType::kQ5_1>(c, c0, c1);  // ggml_linear_gemv_x8's caller: nothing else
  }
}

}  // namespace

void ggml_linear_gemv_x8(const GgmlLinearArgs& a) {
  const auto type = static_cast<GgmlType>(a.ggml_type);
  const int64_t P = a.K / 32, MP = a.M * P;
  int8_t* xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(a.M * a.K)));
  float* dx = static_cast<float*>(scratch(1, static_cast<size_t>(MP) * sizeof(float)));
  float* xs = static_cast<float*>(scratch(2, static_cast<size_t>(MP) * sizeof(float)));
  int32_t* xo = static_cast<int32_t*>(scratch(3, static_cast<size_t>(MP) * sizeof(int32_t)));
  const int off = type == GgmlType::kQ4_0 ? 8 : type == GgmlType::kQ5_0 ? 16 : 0;
  for (int64_t mp = 0; mp < MP; ++mp) {  // piece mp: row mp / P (rows of x are K long, as the codes)
    int s0 = 0, s1 = 0;
    dx[mp] = quantize_piece32(a.x + mp * 32, xq + mp * 32, &s0, &s1);  // max|x|/127; codes rint(x/step)
    // Q6_K: the two half sums as int16 pairs (|X_h| <= 16·127); the offset formats: off·Σx
    const uint32_t halves = static_cast<uint32_t>(s1) << 16 | (static_cast<uint32_t>(s0) & 0xFFFFu);
    xo[mp] = type == GgmlType::kQ6_K ? static_cast<int32_t>(halves) : off * (s0 + s1);
    xs[mp] = dx[mp] * static_cast<float>(s0 + s1);
  }
  Ctx c{&a, xq, dx, xo, xs};
  parallel_chunks((a.N + kRowsPerChunk - 1) / kRowsPerChunk, &rows, &c);
}

}  // namespace cider::kernels::x86::avx2
