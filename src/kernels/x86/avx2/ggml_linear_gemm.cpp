// Linear layer over native GGUF weights, AVX2, for M >= kGemmFromM activation rows (batched decode, prefill): the
// AVX-512 panel kernel's design (avx512/ggml_linear.cpp) with the AVX2 level's integer dot product. Contract:
// GgmlLinearArgs (kernels/kernel_table.h); reference: ref/ggml_linear_ref.cpp.
//
// Activations: quantized exactly as the AVX2 GEMV path does (avx2/ggml_linear.cpp: per 32 elements, step
// dx = max|x|/127, codes rint(x/dx)), padded with zeros to Kp (K rounded up to 32), with dx·Σ codes per piece and
// the integer Σ codes per half-piece.
// Weights: every block unpacked to its integer form w_i = a_h·c_i + b (avx2/ggml_pieces.h) once per K chunk of kKC
// and 16-row pair, packed as codes [2 blocks of 8 rows][k/4][8 rows][4 bytes] with per piece the 16 rows' scales a
// (per half for Q6_K) and offsets b: unsigned u = c + off (Q4_0 8, Q5_0 16, Q6_K 32, the others 0) for every format
// but Q8_0, whose codes stay signed. A tile, 16 weight rows (2 × 8 lanes) × kT (tile_rows) activation rows: per piece and half,
// for each 4 codes vpmaddubsw(u, x) (pairs <= 2·63·127), summed in int16 over as many groups of 4 as cannot
// saturate (8 for 4-bit codes, 4 for 5-bit, 2 for 6-bit), vpmaddwd by 1, and off·Σx taken off the int32 sums; Q8_0:
// vpmaddubsw(|c|, sign(x, c)) + vpmaddwd per 4 codes. The int32 lanes hold Σ c·x of their row exactly; then
// y += float(S)·(a·dx) and, with offsets, y += b·(dx·Σx):
//   y = Σ_pieces (a_h·dx)·S_h + b·X + bias, within the int8-activation bound of GgmlLinearArgs.
// Interleaved rows (GgmlLinearArgs::interleaved) are packed straight from their octets, already [4 codes][8 rows].
// Loops: threads split N in 16-row pairs (x86::parallel_chunks); each thread takes its rows in blocks whose M × block
// outputs fit in L2, runs K chunks over a block, packs each pair of it into its scratch (stays in L1) and sweeps every
// activation tile over it. Per output the float sums are the same, in the same order, whatever the blocking.
#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx2/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86::avx2 {

namespace {

// Activation rows per tile (× 16 weight rows): 3 (3 × 2 int16 sums, 3 × 2 float sums, 2 weight and 1 activation
// registers), 2 for Q4_K (measured: its single int16 stage per piece leaves the float tail the larger share).
template <quant::GgmlType kType>
constexpr int tile_rows() { return kType == quant::GgmlType::kQ4_K ? 2 : 3; }
constexpr int kMRound = 6;  // activation rows are padded to a multiple of every tile_rows()
constexpr int64_t kKC = 512;           // K chunk (a multiple of 256): a packed pair stays in L1
constexpr int64_t kPC = kKC / 32;      // pieces per K chunk
constexpr int64_t kPairRows = 16;      // thread split of N: whole pairs
constexpr int64_t kBlockOut = 256 << 10;  // bytes of output rows a thread keeps in L2 over the K chunks (M × block)
constexpr int64_t kBlockN = 1024;         // at most this many N rows per block

// Every format but Q8_0 is packed as unsigned codes u = c + off (off: Q4_0 8, Q5_0 16, Q6_K 32, else 0; u < 2^bits).
constexpr bool unsigned_codes(quant::GgmlType t) { return t != quant::GgmlType::kQ8_0; }
constexpr int offset_of(quant::GgmlType t) {
  return t == quant::GgmlType::kQ4_0 ? 8 : t == quant::GgmlType::kQ5_0 ? 16 : t == quant::GgmlType::kQ6_K ? 32 : 0;
}
// 4-code groups whose vpmaddubsw pairs (|pair| <= 2·umax·127) can be summed in int16 before vpmaddwd: 8 for 4-bit
// codes (8·3810 < 2^15), 4 for 5-bit (4·7874), 2 for 6-bit (2·16002).
constexpr int int16_groups(quant::GgmlType t) {
  using quant::GgmlType;
  return t == GgmlType::kQ6_K ? 2 : t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1 || t == GgmlType::kQ5_K ? 4 : 8;
}
// Packed bytes per piece of a pair: the codes of both 8-row blocks [2][8][8][4]; the scales a per half; b (per half
// for Q2_K).
constexpr int64_t piece_bytes(quant::GgmlType t) { return 512 + 64 * halves_of(t) + 64 * b_halves_of(t); }

struct Ctx {
  const GgmlLinearArgs* a;
  int block_size, block_bytes;
  int64_t Kp, Mp;
  // Chunk-major, so that what a K chunk's tiles read is contiguous (rows Kp apart would alias in L1 and L2):
  int8_t* xq;   // [Kp/kKC chunks][Mp][kKC] codes
  float* dx;    // [chunks][Mp][kPC] steps
  float* xsum;  // [chunks][Mp][kPC] dx·Σ of each piece's codes
  float* xsum16;  // [chunks][Mp][kPC][2] dx·Σ of each 16 codes (offsets per half: Q2_K)
  int32_t* xh;  // [chunks][Mp][kPC][2] Σ of each half-piece's codes
};

// Activation rows [m0, m1): codes, steps and sums (rows past M and elements past K: zeros).
void quantize_rows(void* vctx, int64_t m0, int64_t m1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  const GgmlLinearArgs& a = *c.a;
  const int64_t Kp = c.Kp, P = a.K / 32, Pp = Kp / 32;
  for (int64_t m = m0; m < m1; ++m) {
    int8_t* row = c.xq + m * kKC;  // piece p at row + (p·32/kKC)·Mp·kKC + p·32 % kKC
    const int64_t valid = m < a.M ? P : 0;
    for (int64_t p = 0; p < Pp; ++p) {
      int8_t* q = row + (p * 32 / kKC) * c.Mp * kKC + p * 32 % kKC;
      float step = 0.0f;
      int s0 = 0, s1 = 0;
      if (p < valid) {
        step = quantize_piece32(a.x + m * a.K + p * 32, q, &s0, &s1);
      } else {
        std::memset(q, 0, 32);
      }
      const int64_t i = (p / kPC * c.Mp + m) * kPC + p % kPC;
      c.dx[i] = step;
      c.xsum[i] = step * static_cast<float>(s0 + s1);
      c.xsum16[i * 2] = step * static_cast<float>(s0);
      c.xsum16[i * 2 + 1] = step * static_cast<float>(s1);
      c.xh[i * 2] = s0;
      c.xh[i * 2 + 1] = s1;
    }
  }
}

// The 8 × 8 transpose of 32-bit elements: r[i] holds row i's dwords 0..7; afterwards r[e] holds dword e of rows 0..7.
static inline void transpose8x8_epi32(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);  // per 128-bit lane: r2i[0] r2i+1[0] r2i[1] r2i+1[1]
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);  // rows 4i..4i+3, dword 0 (lane 0) and 4 (lane 1)
    u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);      // dwords 1, 5
    u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);  // dwords 2, 6
    u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);  // dwords 3, 7
  }
  for (int e = 0; e < 4; ++e) {
    r[e] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x20);
    r[e + 4] = _mm256_permute2x128_si256(u[e], u[4 + e], 0x31);
  }
}

// pack_pair for rows interleaved 8 at a time (quant/ggml_interleave.h; N a multiple of 8, so the pair's second 8 rows
// are all valid or all past N): an octet's qs vectors already hold [4 codes][8 rows], the packed order, so each piece
// is the nibbles and fifth bits of 4 vectors stored as they come (no transpose), the 8 rows' d (and m) one conversion.
template <quant::GgmlType kType>
void pack_pair_octets(const Ctx& c, int64_t n0, int nv, int64_t k0, int64_t valid, uint8_t* dst) {
  constexpr int64_t PB = piece_bytes(kType), OB = octet_bytes(kType);
  const GgmlLinearArgs& a = *c.a;
  const int64_t B = a.K / 32;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int cb = 0; cb < 2; ++cb) {
    const int64_t g = (n0 + (cb * 8 < nv ? cb * 8 : 0)) / 8;  // past N: the first 8 rows again (never stored)
    const uint8_t* oct = static_cast<const uint8_t*>(a.w) + (g * B + k0 / 32) * OB;
    for (int64_t p = 0; p < valid; ++p, oct += OB) {
      uint8_t* pp = dst + p * PB;
      [[maybe_unused]] __m256i hb = _mm256_setzero_si256();
      if constexpr (five_bits(kType)) hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + octet_hb(kType)));
      auto put = [&]<int V>() {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + octet_qs(kType) + 32 * V));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (five_bits(kType)) {
          lo = _mm256_or_si256(lo, fifth_bits<V>(hb));
          hi = _mm256_or_si256(hi, fifth_bits<V + 4>(hb));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(pp + cb * 256 + V * 32), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(pp + cb * 256 + (V + 4) * 32), hi);
      };
      put.template operator()<0>();
      put.template operator()<1>();
      put.template operator()<2>();
      put.template operator()<3>();
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(oct));
      _mm256_storeu_ps(reinterpret_cast<float*>(pp + 512) + cb * 8, _mm256_cvtph_ps(d));
      if constexpr (has_b(kType)) {
        const __m128i m = _mm_loadu_si128(reinterpret_cast<const __m128i*>(oct + 16));
        _mm256_storeu_ps(reinterpret_cast<float*>(pp + 512 + 64 * halves_of(kType)) + cb * 8, _mm256_cvtph_ps(m));
      }
    }
  }
}

// pack_pair for Q4_K / Q5_K (kFive) rows interleaved 8 at a time: piece j of a block is the low (j even) or high
// (j odd) nibbles of the octet's qs vectors 8(j / 2) … + 7, already [4 codes][8 rows] (Q5_K: | bit j of the step's qh
// vector, at bit 4); a = d·sc_j and b = −(dmin·mn_j) of the 8 rows from the octet's scales (the integer form's roundings:
// avx2/ggml_pieces.h unpack_block).
template <bool kFive>
void pack_pair_octets_k45(const Ctx& c, int64_t n0, int nv, int64_t k0, int64_t valid, uint8_t* dst) {
  constexpr int64_t PB = piece_bytes(quant::GgmlType::kQ4_K), kQs = kFive ? 384 : 128;
  constexpr int64_t kOB = octet_bytes(kFive ? quant::GgmlType::kQ5_K : quant::GgmlType::kQ4_K);
  const GgmlLinearArgs& a = *c.a;
  const int64_t B = a.K / 256;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int cb = 0; cb < 2; ++cb) {
    const int64_t g = (n0 + (cb * 8 < nv ? cb * 8 : 0)) / 8;  // past N: the first 8 rows again (never stored)
    for (int64_t b0 = 0; b0 < valid; b0 += 8) {  // k0 is a multiple of 256 (kKC): whole blocks
      const uint8_t* oct = static_cast<const uint8_t*>(a.w) + (g * B + (k0 / 32 + b0) / 8) * kOB;
      alignas(32) uint8_t sm[128];
      q4k_octet_scales(oct, sm);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct)));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct + 16)));
      [&]<int... J>(std::integer_sequence<int, J...>) {
        auto piece = [&]<int kJ>() {
          uint8_t* pp = dst + (b0 + kJ) * PB;
          const uint8_t* qv = oct + kQs + 256 * (kJ / 2);
          for (int v = 0; v < 8; ++v) {
            const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qv + 32 * v));
            __m256i u = _mm256_and_si256(kJ % 2 ? _mm256_srli_epi16(w, 4) : w, m4);
            if constexpr (kFive)
              u = _mm256_or_si256(
                  u, fifth_bits<kJ>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + 128 + 32 * v))));
            _mm256_store_si256(reinterpret_cast<__m256i*>(pp + cb * 256 + v * 32), u);
          }
          _mm256_storeu_ps(reinterpret_cast<float*>(pp + 512) + cb * 8, _mm256_mul_ps(d, u8x8_ps(sm + 8 * kJ)));
          _mm256_storeu_ps(reinterpret_cast<float*>(pp + 576) + cb * 8,
                           _mm256_xor_ps(_mm256_mul_ps(dmin, u8x8_ps(sm + 64 + 8 * kJ)), sign));
        };
        (piece.template operator()<J>(), ...);
      }(std::make_integer_sequence<int, 8>{});
    }
  }
}

// pack_pair for Q6_K rows interleaved 8 at a time: the unsigned codes of piece j (q6k_octet_codes) stored as they
// come; a = d·sc per half of the 8 rows (the integer form's rounding: avx2/ggml_pieces.h unpack_block).
void pack_pair_octets_q6k(const Ctx& c, int64_t n0, int nv, int64_t k0, int64_t valid, uint8_t* dst) {
  constexpr int64_t PB = piece_bytes(quant::GgmlType::kQ6_K);
  const GgmlLinearArgs& a = *c.a;
  const int64_t B = a.K / 256;
  for (int cb = 0; cb < 2; ++cb) {
    const int64_t g = (n0 + (cb * 8 < nv ? cb * 8 : 0)) / 8;  // past N: the first 8 rows again (never stored)
    for (int64_t b0 = 0; b0 < valid; b0 += 8) {  // k0 is a multiple of 256 (kKC): whole blocks
      const uint8_t* oct =
          static_cast<const uint8_t*>(a.w) + (g * B + (k0 / 32 + b0) / 8) * octet_bytes(quant::GgmlType::kQ6_K);
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct)));
      [&]<int... J>(std::integer_sequence<int, J...>) {
        auto piece = [&]<int kJ>() {
          uint8_t* pp = dst + (b0 + kJ) * PB;
          for (int v = 0; v < 8; ++v)
            _mm256_store_si256(reinterpret_cast<__m256i*>(pp + cb * 256 + v * 32), q6k_octet_codes<kJ>(oct, v));
          // dword l: row l's two int8 scales as int16 (low: half 0, high: half 1)
          const __m256i sc =
              _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(oct + 16 + 16 * kJ)));
          const __m256 a0 = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(sc, 16), 16));
          const __m256 a1 = _mm256_cvtepi32_ps(_mm256_srai_epi32(sc, 16));
          _mm256_storeu_ps(reinterpret_cast<float*>(pp + 512) + cb * 8, _mm256_mul_ps(d, a0));
          _mm256_storeu_ps(reinterpret_cast<float*>(pp + 576) + cb * 8, _mm256_mul_ps(d, a1));
        };
        (piece.template operator()<J>(), ...);
      }(std::make_integer_sequence<int, 8>{});
    }
  }
}

// Packs weight rows n0 .. n0 + 15 (rows past nv repeat row nv − 1), elements [k0, k0 + kc) (past K: zeros): each row's
// pieces unpacked into a row-major buffer, then every 8 rows × 8 dwords of a piece transposed into [8 dwords][8 rows].
template <quant::GgmlType kType>
void pack_pair(const Ctx& c, int64_t n0, int nv, int64_t k0, int64_t kc, uint8_t* dst) {
  constexpr int kPieces = pieces_of(kType), kH = halves_of(kType);
  constexpr int64_t PB = piece_bytes(kType);
  const GgmlLinearArgs& a = *c.a;
  const int64_t kend = std::min(k0 + kc, a.K);
  const int64_t valid = kend > k0 ? (kend - k0) / 32 : 0;
  if (valid < kc / 32) std::memset(dst + valid * PB, 0, static_cast<size_t>((kc / 32 - valid) * PB));
  if constexpr (kType == quant::GgmlType::kQ4_K || kType == quant::GgmlType::kQ5_K) {
    if (a.interleaved) return pack_pair_octets_k45<kType == quant::GgmlType::kQ5_K>(c, n0, nv, k0, valid, dst);
  } else if constexpr (kType == quant::GgmlType::kQ6_K) {
    if (a.interleaved) return pack_pair_octets_q6k(c, n0, nv, k0, valid, dst);
  } else if constexpr (interleavable(kType)) {
    if (a.interleaved) return pack_pair_octets<kType>(c, n0, nv, k0, valid, dst);
  }
  Piece pc[8];
  alignas(32) uint8_t rows[16][kPC][32];  // u = c + off of each row's pieces
  for (int r = 0; r < 16; ++r) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + (n0 + (r < nv ? r : nv - 1)) * a.row_bytes;
    const int cb = r / 8, lane = r % 8;
    {  // the row's bytes of the next K chunk, fetched while this chunk is multiplied
      const int64_t nb = std::min(k0 + 2 * kc, a.K) / c.block_size, b_next = std::min(k0 + kc, a.K) / c.block_size;
      for (int64_t off = b_next * c.block_bytes; off < nb * c.block_bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + off), _MM_HINT_T1);
    }
    for (int64_t b0 = 0; b0 < valid; b0 += kPieces) {
      const int64_t blk = (k0 + b0 * 32) / c.block_size;
      unpack_block<kType>(w + blk * c.block_bytes, pc);
      for (int j = 0; j < kPieces; ++j) {
        uint8_t* pp = dst + (b0 + j) * PB;
        _mm256_store_si256(reinterpret_cast<__m256i*>(rows[r][b0 + j]),
                           _mm256_add_epi8(pc[j].c, _mm256_set1_epi8(static_cast<char>(offset_of(kType)))));
        float* ws = reinterpret_cast<float*>(pp + 512) + cb * 8 + lane;
        ws[0] = pc[j].a0;
        if constexpr (kH == 2) ws[16] = pc[j].a1;
        if constexpr (has_b(kType)) {
          float* bs = reinterpret_cast<float*>(pp + 512 + 64 * kH) + cb * 8 + lane;
          bs[0] = pc[j].b0;
          if constexpr (b_per_half(kType)) bs[16] = pc[j].b1;
        }
      }
    }
  }
  for (int64_t p = 0; p < valid; ++p)
    for (int cb = 0; cb < 2; ++cb) {
      __m256i v[8];
      for (int i = 0; i < 8; ++i) v[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(rows[cb * 8 + i][p]));
      transpose8x8_epi32(v);
      for (int e = 0; e < 8; ++e) _mm256_store_si256(reinterpret_cast<__m256i*>(dst + p * PB + cb * 256 + e * 32), v[e]);
    }
}

// An empty asm on an accumulator: the compiler may not reassociate the sums across it. Without it GCC computes every
// product of a piece first and sums them as a tree, spilling most of them to the stack.
static inline void keep_order(__m256i& v) { __asm__("" : "+x"(v)); }

// Σ c·x over each 4 codes into int32 lanes: vpmaddubsw(|c|, sign(x, c)) (pairs <= 2·128·127 < 2^15), vpmaddwd by 1.
static inline __m256i dot4(__m256i abs_c, __m256i c, __m256i x, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_c, _mm256_sign_epi8(x, c)), ones);
}

// One tile: a packed pair × kT activation rows from m0, over `pieces` pieces from element k0; adds the sums to the
// pair's accumulators acc [M][16] (first chunk: writes them).
// Not inlined: inlined into rows_of, GCC's register allocation of the loop varies with the unit's other code (Q4_K
// measured 10% slower).
template <quant::GgmlType kType>
__attribute__((noinline)) void tile(const Ctx& c, const uint8_t* pk, int64_t pieces, int64_t k0, int64_t m0, float* acc, bool first) {
  constexpr int kH = halves_of(kType), kDw = 8 / kH, kT = tile_rows<kType>();
  constexpr int64_t PB = piece_bytes(kType);
  const GgmlLinearArgs& a = *c.a;
  const int64_t s0 = (k0 / kKC * c.Mp + m0) * kPC;  // row m0's piece scalars of this chunk
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 af[2][kT];
  for (int t = 0; t < kT; ++t) af[0][t] = af[1][t] = _mm256_setzero_ps();
  const int8_t* xq = c.xq + k0 / kKC * c.Mp * kKC + m0 * kKC;
  for (int64_t p = 0; p < pieces; ++p) {
    const uint8_t* pp = pk + p * PB;
    const int64_t g = s0 + p;  // + t·kPC for row m0 + t
    for (int h = 0; h < kH; ++h) {
      __m256i ai[2][kT];
      for (int t = 0; t < kT; ++t) ai[0][t] = ai[1][t] = _mm256_setzero_si256();
      if constexpr (unsigned_codes(kType)) {
        // vpmaddubsw(u, x) on the unsigned codes, kG groups summed in int16, then vpmaddwd by 1; the offset comes
        // off the int32 sums exactly: Σ c·x = Σ u·x − off·Σ x.
        constexpr int kG = int16_groups(kType) < kDw ? int16_groups(kType) : kDw;
        for (int e0 = 0; e0 < kDw; e0 += kG) {
          __m256i s16[2][kT];
          for (int t = 0; t < kT; ++t) s16[0][t] = s16[1][t] = _mm256_setzero_si256();
          for (int e = e0; e < e0 + kG; ++e) {
            const int dw = h * kDw + e;
            const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pp + dw * 32));
            const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pp + 256 + dw * 32));
            for (int t = 0; t < kT; ++t) {
              int32_t xd;
              std::memcpy(&xd, xq + t * kKC + p * 32 + dw * 4, 4);
              const __m256i xb = _mm256_set1_epi32(xd);
              s16[0][t] = _mm256_add_epi16(s16[0][t], _mm256_maddubs_epi16(w0, xb));
              s16[1][t] = _mm256_add_epi16(s16[1][t], _mm256_maddubs_epi16(w1, xb));
              if (e + 1 < e0 + kG) {
                keep_order(s16[0][t]);
                keep_order(s16[1][t]);
              }
            }
          }
          for (int t = 0; t < kT; ++t) {
            ai[0][t] = _mm256_add_epi32(ai[0][t], _mm256_madd_epi16(s16[0][t], ones));
            ai[1][t] = _mm256_add_epi32(ai[1][t], _mm256_madd_epi16(s16[1][t], ones));
          }
        }
        if constexpr (offset_of(kType) != 0)
          for (int t = 0; t < kT; ++t) {
            const int32_t* xh = c.xh + (g + t * kPC) * 2;
            const __m256i o = _mm256_set1_epi32(offset_of(kType) * (kH == 2 ? xh[h] : xh[0] + xh[1]));
            ai[0][t] = _mm256_sub_epi32(ai[0][t], o);
            ai[1][t] = _mm256_sub_epi32(ai[1][t], o);
          }
      } else {
        for (int e = 0; e < kDw; ++e) {
          const int dw = h * kDw + e;
          const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pp + dw * 32));
          const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(pp + 256 + dw * 32));
          const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
          for (int t = 0; t < kT; ++t) {
            int32_t xd;
            std::memcpy(&xd, xq + t * kKC + p * 32 + dw * 4, 4);
            const __m256i xb = _mm256_set1_epi32(xd);
            ai[0][t] = _mm256_add_epi32(ai[0][t], dot4(a0, w0, xb, ones));
            ai[1][t] = _mm256_add_epi32(ai[1][t], dot4(a1, w1, xb, ones));
          }
        }
      }
      const __m256 ws0 = _mm256_load_ps(reinterpret_cast<const float*>(pp + 512 + h * 64));
      const __m256 ws1 = _mm256_load_ps(reinterpret_cast<const float*>(pp + 512 + h * 64 + 32));
      for (int t = 0; t < kT; ++t) {
        const __m256 d = _mm256_set1_ps(c.dx[g + t * kPC]);
        af[0][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[0][t]), _mm256_mul_ps(ws0, d), af[0][t]);
        af[1][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai[1][t]), _mm256_mul_ps(ws1, d), af[1][t]);
      }
    }
    // b·Σx: b of rows 0-7 (b0) and 8-15 (b1), per piece, or per half with Q2_K (X then each 16 codes' sum).
    for (int h = 0; h < b_halves_of(kType); ++h) {
      const __m256 b0 = _mm256_load_ps(reinterpret_cast<const float*>(pp + 512 + 64 * kH + 64 * h));
      const __m256 b1 = _mm256_load_ps(reinterpret_cast<const float*>(pp + 512 + 64 * kH + 64 * h + 32));
      for (int t = 0; t < kT; ++t) {
        const __m256 X = _mm256_set1_ps(b_per_half(kType) ? c.xsum16[(g + t * kPC) * 2 + h] : c.xsum[g + t * kPC]);
        af[0][t] = _mm256_fmadd_ps(b0, X, af[0][t]);
        af[1][t] = _mm256_fmadd_ps(b1, X, af[1][t]);
      }
    }
  }
  const int mt = static_cast<int>(std::min<int64_t>(kT, a.M - m0));
  for (int t = 0; t < mt; ++t)
    for (int cb = 0; cb < 2; ++cb) {
      float* o = acc + (m0 + t) * 16 + cb * 8;
      _mm256_store_ps(o, first ? af[cb][t] : _mm256_add_ps(_mm256_load_ps(o), af[cb][t]));
    }
}

template <quant::GgmlType kType>
void rows_of(const Ctx& c, int64_t c0, int64_t c1) {
  const GgmlLinearArgs& a = *c.a;
  const int64_t n_begin = c0 * kPairRows, n_end = std::min(c1 * kPairRows, a.N);
  uint8_t* pk = static_cast<uint8_t*>(scratch(3, static_cast<size_t>(kKC / 32 * piece_bytes(kType))));
  // Blocks of nb rows: the block's M × nb outputs stay in L2 over the K chunks, in the worker's accumulators
  // [pair][M][16] (contiguous: output rows N apart would alias in L1 and L2), copied out after the last chunk.
  const int64_t nb = std::max<int64_t>(kPairRows, std::min(kBlockN, kBlockOut / (a.M * 4) / kPairRows * kPairRows));
  float* acc = static_cast<float*>(scratch(2, static_cast<size_t>(nb * c.Mp) * sizeof(float)));
  for (int64_t b0 = n_begin; b0 < n_end; b0 += nb) {
    const int64_t b1 = std::min(b0 + nb, n_end);
    for (int64_t k0 = 0; k0 < c.Kp; k0 += kKC) {
      const int64_t kc = std::min(kKC, c.Kp - k0);
      for (int64_t n0 = b0; n0 < b1; n0 += kPairRows) {
        const int nv = static_cast<int>(std::min(kPairRows, n_end - n0));
        float* pa = acc + (n0 - b0) * c.Mp;
        pack_pair<kType>(c, n0, nv, k0, kc, pk);
        for (int64_t m0 = 0; m0 < a.M; m0 += tile_rows<kType>()) tile<kType>(c, pk, kc / 32, k0, m0, pa, k0 == 0);
      }
    }
    for (int64_t n0 = b0; n0 < b1; n0 += kPairRows) {
      const int64_t nv = std::min(kPairRows, n_end - n0);
      const float* pa = acc + (n0 - b0) * c.Mp;
      for (int64_t m = 0; m < a.M; ++m)
        for (int64_t l = 0; l < nv; ++l) a.out[m * a.N + n0 + l] = pa[m * 16 + l] + (a.bias ? a.bias[n0 + l] : 0.0f);
    }
  }
}

void rows(void* vctx, int64_t c0, int64_t c1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  // ggml_linear sends only these formats
  with_block_format(static_cast<quant::GgmlType>(c.a->ggml_type), [&]<quant::GgmlType T>() { rows_of<T>(c, c0, c1); });
}

}  // namespace

// The caller (ggml_linear) has checked the format and the shapes.
void ggml_linear_gemm(const GgmlLinearArgs& a) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(a.ggml_type);
  Ctx c{};
  c.a = &a;
  c.block_size = f->block_size;
  c.block_bytes = f->block_bytes;
  c.Kp = (a.K + 31) / 32 * 32;  // K is a whole number of blocks (ggml_linear checks it): 32-element formats need no padding
  c.Mp = (a.M + kMRound - 1) / kMRound * kMRound;
  // The caller's scratch (the workers read it): codes in slot 0, steps and sums in slot 1; slot 3 is each worker's
  // pack.
  c.xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(c.Mp * ((c.Kp + kKC - 1) / kKC * kKC))));
  const int64_t Pp = (c.Kp + kKC - 1) / kKC * kPC;  // pieces, whole chunks
  float* rest = static_cast<float*>(scratch(1, static_cast<size_t>(c.Mp * Pp * 6) * 4));
  c.dx = rest;
  c.xsum = rest + c.Mp * Pp;
  c.xh = reinterpret_cast<int32_t*>(rest + 2 * c.Mp * Pp);
  c.xsum16 = rest + 4 * c.Mp * Pp;
  parallel_chunks(c.Mp, &quantize_rows, &c);
  parallel_chunks((a.N + kPairRows - 1) / kPairRows, &rows, &c);
}

}  // namespace cider::kernels::x86::avx2
