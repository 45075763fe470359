// cider/kernels/x86/avx2/ggml_pieces.h — the integer form of a GGUF block's pieces (quant/ggml_blocks.h) in AVX2
// registers, shared by the native-weight kernels of the AVX2 and AVX-512 levels (avx2/ggml_linear.cpp,
// avx512/ggml_linear.cpp). Everything here is in an anonymous namespace and `static inline`, so each including file
// compiles its own copy with its own level's flags (docs/x86_kernels.md: no inline function with external linkage
// may be shared between levels).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86 {
namespace {

static inline float f16_load(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// One unpacked piece: 32 int8 codes, the int16 multipliers of vpmaddwd (1, or a K-quant's integer sub-block scale:
// lanes 0-7 for the first half, 8-15 for the second), the float scale av (lanes 0-3 / 4-7 the halves) and the
// offsets b of the halves: w_i = av·mul·c_i + b.
// a0, a1: the halves' whole float scales (av·mul, rounded as the decoder rounds it), for ggml_dequantize; the GEMV
// and GEMM instantiations do not read them, so the compiler drops them there.
struct Piece {
  __m256i c, mul;
  __m256 av;
  float a0, a1, b0, b1;
};

static inline void set_plain(Piece& p, float a, float b) {
  p.mul = _mm256_set1_epi16(1);
  p.av = _mm256_set1_ps(a);
  p.a0 = p.a1 = a;
  p.b0 = p.b1 = b;
}

// 32 codes of a 16-byte nibble array: element i < 16 is the low nibble of byte i, element i + 16 its high nibble.
static inline __m256i nibbles32(const uint8_t* qs) {
  // the 16 bytes in both lanes (one load), the high lane's shifted down by 4 (per dword), then the low nibbles
  const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
}

// 0x10 in byte i where bit i of qh is set.
static inline __m256i bits32(uint32_t qh) {
  const __m256i v = _mm256_set1_epi32(static_cast<int>(qh));
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                        3, 3, 3, 3, 3, 3);
  const __m256i bytes = _mm256_shuffle_epi8(v, pick);  // lanes hold the same 4 bytes: byte i/8 of qh
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// The formats whose rows may come interleaved 8 at a time (quant::ggml_interleavable, GgmlLinearArgs::interleaved).
constexpr bool interleavable(quant::GgmlType t) {
  return t == quant::GgmlType::kQ4_0 || t == quant::GgmlType::kQ4_1 || t == quant::GgmlType::kQ5_0 ||
         t == quant::GgmlType::kQ5_1 || t == quant::GgmlType::kQ4_K || t == quant::GgmlType::kQ5_K ||
         t == quant::GgmlType::kQ6_K;
}

// Block blk of weight row n, whose row starts at `row` in the file's order: that block in place, or, for rows
// interleaved 8 at a time (w: the tensor's first byte, K elements a row), the block read back into tmp.
template <quant::GgmlType kType>
static inline const uint8_t* row_block(const uint8_t* row, int64_t block_bytes, bool interleaved, const void* w,
                                       int64_t K, int64_t n, int64_t blk,
                                       uint8_t (&tmp)[quant::kGgmlInterleavedBlockMax]) {
  if constexpr (interleavable(kType)) {
    if (interleaved) {
      constexpr int64_t kBlock = kType == quant::GgmlType::kQ4_K || kType == quant::GgmlType::kQ5_K ||
                                         kType == quant::GgmlType::kQ6_K
                                     ? 256
                                     : 32;
      quant::ggml_interleaved_block(static_cast<uint32_t>(kType), w, K / kBlock, n, blk, tmp);
      return tmp;
    }
  }
  return row + blk * block_bytes;
}

// Interleaved rows (quant/ggml_interleave.h): the fifth bits of step J (codes 4J … 4J + 3 of 8 rows) at bit 4 of every
// byte, from the octet's hb (bit J of each byte; 16-bit shifts: the bits that cross into the neighbouring byte land
// below or above bit 4 and are masked off).
template <int J>
static inline __m256i fifth_bits(__m256i hb) {
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  if constexpr (J < 4) return _mm256_and_si256(_mm256_slli_epi16(hb, 4 - J), bit4);
  else if constexpr (J == 4) return _mm256_and_si256(hb, bit4);
  else return _mm256_and_si256(_mm256_srli_epi16(hb, J - 4), bit4);
}

// Byte offsets in an octet (quant/ggml_interleave.h) of the 32-element formats: hb (5-bit formats), qs; its size.
constexpr int octet_hb(quant::GgmlType t) {
  return t == quant::GgmlType::kQ4_1 || t == quant::GgmlType::kQ5_1 ? 32 : 16;
}
constexpr bool five_bits(quant::GgmlType t) { return t == quant::GgmlType::kQ5_0 || t == quant::GgmlType::kQ5_1; }
constexpr int octet_qs(quant::GgmlType t) { return octet_hb(t) + (five_bits(t) ? 32 : 0); }
constexpr int64_t octet_bytes(quant::GgmlType t) {  // 8 blocks: the K-quants' 8 × 144, 176, 210
  return t == quant::GgmlType::kQ4_K   ? 1152
         : t == quant::GgmlType::kQ5_K ? 1408
         : t == quant::GgmlType::kQ6_K ? 1680
                                       : octet_qs(t) + 128;
}

// Interleaved Q4_K (quant/ggml_interleave.h): the 6-bit scales of an octet's 8 pieces × 8 rows into sm[0, 64) and
// its minimums into sm[64, 128), byte 8j + l for piece j of row l (16-bit shifts, then byte masks: the bits that cross
// into the neighbouring byte are masked off).
static inline void q4k_octet_scales(const uint8_t* oct, uint8_t* sm) {
  const __m256i m15 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i lo0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + 32));  // pieces 0-3
  const __m256i lo1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + 64));  // pieces 4-7
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + 96));
  auto top = [&](int shift) {  // 2 bits of hi from bit `shift` of each byte, at bits 4-5
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, shift), m3), 4);
  };
  auto* out = reinterpret_cast<__m256i*>(sm);
  _mm256_storeu_si256(out, _mm256_or_si256(_mm256_and_si256(lo0, m15), top(0)));
  _mm256_storeu_si256(out + 1, _mm256_or_si256(_mm256_and_si256(lo1, m15), top(4)));
  _mm256_storeu_si256(out + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo0, 4), m15), top(2)));
  _mm256_storeu_si256(out + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo1, 4), m15), top(6)));
}

// Interleaved Q6_K (quant/ggml_interleave.h): the unsigned codes u = c + 32 of piece j = 4H + i of an octet's 8 rows,
// step v (codes 4v … 4v + 3): ql's nibble | qh's two bits at bits 4-5 (16-bit shifts, then byte masks).
template <int J>
static inline __m256i q6k_octet_codes(const uint8_t* oct, int v) {
  constexpr int H = J / 4, I = J % 4;
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + 144 + 256 * (2 * H + I % 2) + 32 * v));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(oct + 1168 + 256 * H + 32 * v));
  const __m256i lo = _mm256_and_si256(I < 2 ? q : _mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F));
  const __m256i hi = I < 3 ? _mm256_slli_epi16(h, 4 - 2 * I) : _mm256_srli_epi16(h, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
}

// 8 bytes as int32 lanes, as float.
static inline __m256 u8x8_ps(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

static inline uint32_t u32_load(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block (the packing of quant/ggml_blocks.cpp).
static inline void scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// All 8 scales (bytes 0-7) and minimums (bytes 8-15) of a Q4_K / Q5_K block from its 12 packed bytes s, scale_min's
// rule for the 8 at once: j < 4 in the low 6 bits of bytes j / j + 4; j >= 4: 4 low bits from byte j + 4, 2 high bits
// from the top of byte j - 4 / j.
static inline __m128i scales_mins8(const uint8_t* s) {
  uint32_t w[3];
  std::memcpy(w, s, 12);
  const uint32_t sc_lo = w[0] & 0x3f3f3f3fu, mn_lo = w[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4);
  return _mm_set_epi32(static_cast<int>(mn_hi), static_cast<int>(mn_lo), static_cast<int>(sc_hi),
                       static_cast<int>(sc_lo));
}

// All pieces of one block into p[] (1 for the 32-element formats, 8 for the K-quants); a template on the format,
// so each kernel instantiation keeps its pieces in registers.
template <quant::GgmlType kType>
static inline void unpack_block(const uint8_t* b, Piece* p) {
  using quant::GgmlType;
  constexpr quant::GgmlType t = kType;
  switch (t) {
    case GgmlType::kQ8_0:
      p[0].c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
      set_plain(p[0], f16_load(b), 0.0f);
      return;
    case GgmlType::kQ4_0:
      p[0].c = _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8));
      set_plain(p[0], f16_load(b), 0.0f);
      return;
    case GgmlType::kQ4_1:
      p[0].c = nibbles32(b + 4);
      set_plain(p[0], f16_load(b), f16_load(b + 2));
      return;
    case GgmlType::kQ5_0:
      p[0].c = _mm256_sub_epi8(_mm256_or_si256(nibbles32(b + 6), bits32(u32_load(b + 2))), _mm256_set1_epi8(16));
      set_plain(p[0], f16_load(b), 0.0f);
      return;
    case GgmlType::kQ5_1:
      p[0].c = _mm256_or_si256(nibbles32(b + 8), bits32(u32_load(b + 4)));
      set_plain(p[0], f16_load(b), f16_load(b + 2));
      return;
    case GgmlType::kQ4_K: {
      const float d = f16_load(b), dmin = f16_load(b + 2);
      const __m256i m4 = _mm256_set1_epi8(0x0F);
      for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
        p[2 * c].c = _mm256_and_si256(q, m4);
        p[2 * c + 1].c = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      }
      const __m256 dv = _mm256_set1_ps(d);
      for (int j = 0; j < 8; ++j) {  // the 6-bit scale goes into vpmaddwd, d into av
        int sc, mn;
        scale_min(b + 4, j, &sc, &mn);
        p[j].mul = _mm256_set1_epi16(static_cast<int16_t>(sc));
        p[j].av = dv;
        p[j].a0 = p[j].a1 = d * static_cast<float>(sc);
        p[j].b0 = p[j].b1 = -(dmin * static_cast<float>(mn));
      }
      return;
    }
    case GgmlType::kQ2_K: {
      // scales[16] (low nibble: scale, high: min of each 16) | qs[64] | d | dmin; piece 4h + s: bits [2s, 2s + 2)
      // of qs[32h + i].
      const float d = f16_load(b + 80), dmin = f16_load(b + 82);
      const __m256i m2 = _mm256_set1_epi8(3);
      for (int h = 0; h < 2; ++h) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * h));
        for (int s = 0; s < 4; ++s) p[4 * h + s].c = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m2);
      }
      const __m256 dv = _mm256_set1_ps(d);
      for (int j = 0; j < 8; ++j) {  // the 4-bit scale of each 16 goes into vpmaddwd, d into av
        const int s0 = b[2 * j] & 0x0F, s1 = b[2 * j + 1] & 0x0F;
        p[j].mul = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(s1)), _mm_set1_epi16(static_cast<int16_t>(s0)));
        p[j].av = dv;
        p[j].a0 = d * static_cast<float>(s0);
        p[j].a1 = d * static_cast<float>(s1);
        p[j].b0 = -(dmin * static_cast<float>(b[2 * j] >> 4));
        p[j].b1 = -(dmin * static_cast<float>(b[2 * j + 1] >> 4));
      }
      return;
    }
    case GgmlType::kQ6_K: {
      const float d = f16_load(b + 208);
      const uint8_t* sc = b + 192;
      const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
        const __m256i lo[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
        for (int j = 0; j < 4; ++j) {
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), m2);
          p[4 * h + j].c = _mm256_sub_epi8(_mm256_or_si256(lo[j], _mm256_slli_epi16(hi, 4)), off);
        }
      }
      const __m256 dv = _mm256_set1_ps(d);
      for (int j = 0; j < 8; ++j) {  // the int8 scale of each 16 goes into vpmaddwd, d into av
        p[j].mul = _mm256_set_m128i(_mm_set1_epi16(static_cast<int8_t>(sc[2 * j + 1])),
                                    _mm_set1_epi16(static_cast<int8_t>(sc[2 * j])));
        p[j].av = dv;
        p[j].a0 = d * static_cast<float>(static_cast<int8_t>(sc[2 * j]));
        p[j].a1 = d * static_cast<float>(static_cast<int8_t>(sc[2 * j + 1]));
        p[j].b0 = p[j].b1 = 0.0f;
      }
      return;
    }
    default: {  // Q5_K: the scalar integer form
      alignas(32) int8_t c[32];
      float a[2], o[2];
      for (int j = 0; j < 8; ++j) {
        quant::ggml_piece(t, b, j, c, a, o);
        p[j].c = _mm256_load_si256(reinterpret_cast<const __m256i*>(c));
        p[j].mul = _mm256_set1_epi16(1);
        p[j].av = _mm256_set_m128(_mm_set1_ps(a[1]), _mm_set1_ps(a[0]));
        p[j].a0 = a[0];
        p[j].a1 = a[1];
        p[j].b0 = o[0];
        p[j].b1 = o[1];
      }
      return;
    }
  }
}

// Pieces per block, and whether any format piece has a nonzero b (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K).
constexpr int pieces_of(quant::GgmlType t) {
  return t == quant::GgmlType::kQ2_K || t == quant::GgmlType::kQ4_K || t == quant::GgmlType::kQ5_K ||
                 t == quant::GgmlType::kQ6_K
             ? 8
             : 1;
}
constexpr bool has_b(quant::GgmlType t) {
  return t == quant::GgmlType::kQ4_1 || t == quant::GgmlType::kQ5_1 || t == quant::GgmlType::kQ2_K ||
         t == quant::GgmlType::kQ4_K || t == quant::GgmlType::kQ5_K;
}
// Whether a piece's two halves have scales of their own (a0 ≠ a1: Q2_K, Q6_K) and offsets of their own (Q2_K); the
// packed GEMMs (avx2/ggml_linear_gemm.cpp, avx512/ggml_linear.cpp) keep halves_of(t) scales and b_halves_of(t)
// offsets per piece.
constexpr bool a_per_half(quant::GgmlType t) { return t == quant::GgmlType::kQ2_K || t == quant::GgmlType::kQ6_K; }
constexpr bool b_per_half(quant::GgmlType t) { return t == quant::GgmlType::kQ2_K; }
constexpr int halves_of(quant::GgmlType t) { return a_per_half(t) ? 2 : 1; }
constexpr int b_halves_of(quant::GgmlType t) { return has_b(t) ? (b_per_half(t) ? 2 : 1) : 0; }

// The kernels' per-format instantiation: f.template operator()<T>() for the formats unpack_block reads; false (f not
// called) for any other type.
template <class F>
static inline bool with_block_format(quant::GgmlType t, F&& f) {
  using quant::GgmlType;
  switch (t) {
    case GgmlType::kQ8_0: f.template operator()<GgmlType::kQ8_0>(); return true;
    case GgmlType::kQ4_0: f.template operator()<GgmlType::kQ4_0>(); return true;
    case GgmlType::kQ4_1: f.template operator()<GgmlType::kQ4_1>(); return true;
    case GgmlType::kQ5_0: f.template operator()<GgmlType::kQ5_0>(); return true;
    case GgmlType::kQ5_1: f.template operator()<GgmlType::kQ5_1>(); return true;
    case GgmlType::kQ2_K: f.template operator()<GgmlType::kQ2_K>(); return true;
    case GgmlType::kQ4_K: f.template operator()<GgmlType::kQ4_K>(); return true;
    case GgmlType::kQ5_K: f.template operator()<GgmlType::kQ5_K>(); return true;
    case GgmlType::kQ6_K: f.template operator()<GgmlType::kQ6_K>(); return true;
    default: return false;
  }
}


}  // namespace
}  // namespace cider::kernels::x86
