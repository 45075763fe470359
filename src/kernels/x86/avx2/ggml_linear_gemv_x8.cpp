// Linear layer over native GGUF weights whose rows are interleaved 8 at a time (quant/ggml_interleave.h: Q4_0, Q4_1,
// Q5_0, Q5_1), for few activation rows (M < kGgmlGemmFromM: decode and batched decode), AVX2. Contract:
// GgmlLinearArgs with interleaved (kernels/kernel_table.h); reference: ref/ggml_linear_ref.cpp.
//
// Why: over the file's layout (avx2/ggml_linear_gemv.cpp) every 32-weight block of every row pays its own unpacking
// and its own float tail (convert, scale, add: about 23 instructions per block), which leaves these formats
// compute-bound on two AVX2 cores at half the memory's speed. Here a 32-byte register holds 4 codes of each of 8
// rows, so the int32 lanes are the rows: the fifth bits come from one shift and mask of the octet's hb, the float tail
// is paid once per block for 8 rows (about 8 instructions per row-block in all).
//
// Activations: per 32 elements ("piece") step dx = max|x|/127 and codes rint(x/dx), as every native-weight kernel
// (avx2/ggml_linear.cpp); beside them per piece off·Σx (offset formats: Q4_0 8, Q5_0 16) or dx·Σx (formats with a
// minimum).
// Per octet (block b of 8 rows) and activation row, over its 8 steps j of 4 codes (codes 4j … 4j + 3 of every row:
// the low nibbles of qs vector j for j < 4, the high nibbles of vector j − 4 for j >= 4):
//   u_j = nibbles | ((hb >> j) & 1) << 4         (unsigned codes u = c + off < 2^bits; the fifth bit for Q5_0, Q5_1)
//   s16 += vpmaddubsw(u_j, x[4j … 4j + 3] broadcast to every lane)         (pairs ≤ 2·31·127)
//   summed in int16 over 4 steps (5-bit: 4·7874 < 2^15) or 8 (4-bit: 8·3810), then vpmaddwd by 1 into S (int32);
//   y_l += float(S_l − off·Σx)·(d_l·dx)  [+ m_l·(dx·Σx)]                      (l: the lane, the row)
// within the int8-activation bound of GgmlLinearArgs (the float32 sums are over K/32 pieces, as the other tiles').
// Work: 16-row chunks over the thread pool; one octet row group × up to 4 (4-bit) or 3 (5-bit) activation rows per
// tile, the unpacked codes serving every activation row.
#include <cstring>

#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86::avx2 {

namespace {

using quant::GgmlType;

constexpr int64_t kRowsPerChunk = 16;

template <GgmlType kType>
struct Octet {
  static constexpr bool kMin = kType == GgmlType::kQ4_1 || kType == GgmlType::kQ5_1;
  static constexpr bool kFive = five_bits(kType);
  static constexpr int kOff = kType == GgmlType::kQ4_0 ? 8 : kType == GgmlType::kQ5_0 ? 16 : 0;
  static constexpr int kHb = octet_hb(kType);            // hb's offset (5-bit formats)
  static constexpr int kQs = octet_qs(kType);            // qs's offset
  static constexpr int64_t kBytes = octet_bytes(kType);  // 8 blocks
  static constexpr int kGroup = kFive ? 4 : 8;           // steps summed in int16
  static constexpr int kMaxT = kFive ? 3 : 4;            // activation rows per tile (registers)
};

struct Ctx {
  const GgmlLinearArgs* a;
  const int8_t* xq;    // [M, K] codes
  const float* dx;     // [M, P] steps
  const int32_t* xo;   // [M, P] off·Σ codes of the piece (offset formats)
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

template <GgmlType kType>
void rows_of(const Ctx& c, int64_t c0, int64_t c1) {
  constexpr int kMaxT = Octet<kType>::kMaxT;
  const GgmlLinearArgs& a = *c.a;
  const int64_t g_end = imin(c1 * kRowsPerChunk, a.N) / 8;
  for (int64_t g = c0 * kRowsPerChunk / 8; g < g_end; ++g) {
    int64_t m0 = 0;
    for (; m0 + kMaxT <= a.M; m0 += kMaxT) tile<kType, kMaxT>(c, g, m0);
    switch (a.M - m0) {
      case 3: if constexpr (kMaxT > 3) tile<kType, 3>(c, g, m0); break;
      case 2: tile<kType, 2>(c, g, m0); break;
      case 1: tile<kType, 1>(c, g, m0); break;
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
    xo[mp] = off * (s0 + s1);
    xs[mp] = dx[mp] * static_cast<float>(s0 + s1);
  }
  Ctx c{&a, xq, dx, xo, xs};
  parallel_chunks((a.N + kRowsPerChunk - 1) / kRowsPerChunk, &rows, &c);
}

}  // namespace cider::kernels::x86::avx2
