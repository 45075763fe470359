// AVX2 (+FMA, F16C) attention over the packed KV cache: the design of the AVX-512 kernel (attention_x86.h) on
// 8-lane vectors. Keys: each 16-row tile is handled as two 8-row halves, transposed 8×8 as 32-bit words; the int8
// dot products use vpmaddubsw (u8 codes × s8 query, pairs summed in int16: at most 2·63·127 for codes below 64, or
// 4·15·127 when the low- and high-nibble products of 4-bit codes are added first) and vpmaddwd (pairs to int32); 8-bit
// codes are split into their two nibbles (Σ c·q = Σ lo·q + 16·Σ hi·q) so no int16 sum can saturate. The sums are exact,
// so scores equal the AVX-512 kernel's up to float32 rounding. Values: float32 FMAs on codes converted exactly.
// Everything here is file-local (see x86_kernels.h).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/attention_x86.h"
#include "quant/affine.h"
#include "kernels/x86/avx2/fast_exp.h"

#define CIDER_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CIDER_INLINE static inline __attribute__((always_inline)) CIDER_AVX2

namespace cider::kernels::x86::avx2 {

namespace {

using attn::Item;
using attn::kBlockRows;
using attn::kTileRows;
using attn::Plan;

constexpr int kT = kBlockRows;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t scale_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }
static inline float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

CIDER_INLINE __m256i lane_mask(int64_t n) {  // lanes < n all ones
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n < 0 ? 0 : n > 8 ? 8 : n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// 8 values of a float dtype from p[i..], widened exactly.
CIDER_INLINE __m256 load8(const void* p, DType t, int64_t i) {
  if (t == DType::kF16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  if (t == DType::kBF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i))),
        16));
  return _mm256_loadu_ps(static_cast<const float*>(p) + i);
}

CIDER_INLINE float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
CIDER_INLINE float hsum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// tanh(x) within a few ulp: as tanh16 of the AVX-512 kernel (odd Taylor polynomial to x^19 below |x| = 0.625,
// (1 − e)/(1 + e) with e = exp(−2|x|) above, the sign restored).
CIDER_INLINE __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 ax = _mm256_andnot_ps(sign, x);
  const __m256 x2 = _mm256_mul_ps(ax, ax);
  __m256 p = _mm256_set1_ps(-443861162.0f / 1856156927625.0f);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(6404582.0f / 10854718875.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-929569.0f / 638512875.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(21844.0f / 6081075.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1382.0f / 155925.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(62.0f / 2835.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-17.0f / 315.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(ax, x2), p, ax);
  const __m256 e = exp8(_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f)));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 large = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  const __m256 t = _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
  return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

// 8×8 transpose of 32-bit words: v[j] = row j in, v[k] = column k out.
CIDER_INLINE void transpose8(__m256i* v) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);      // col 0 (and 4) of rows i..i+3
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);  // col 1, 5
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);  // col 2, 6
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);  // col 3, 7
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    v[c + 4] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

// Columns of an [8, G] block of scales (8·G values of dtype t at p): out[g·stride + j] = value (j, g).
CIDER_INLINE void scale_columns8(const void* p, DType t, int64_t G, float* out, int64_t stride) {
  if (G == 1) {
    _mm256_store_ps(out, load8(p, t, 0));
    return;
  }
  if (G == 2) {
    const __m256 f0 = load8(p, t, 0), f1 = load8(p, t, 8);
    // shuffle_ps picks rows 0,1,4,5 | 2,3,6,7; permute4x64 restores the row order.
    const __m256 c0 = _mm256_shuffle_ps(f0, f1, 0x88), c1 = _mm256_shuffle_ps(f0, f1, 0xDD);
    _mm256_store_ps(out, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(c0), 0xD8)));
    _mm256_store_ps(out + stride, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(c1), 0xD8)));
    return;
  }
  alignas(32) float tmp[8 * 64];
  for (int64_t k = 0; k < G; ++k) _mm256_store_ps(tmp + 8 * k, load8(p, t, 8 * k));
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                         _mm256_set1_epi32(static_cast<int>(G)));
  for (int64_t g = 0; g < G; ++g) _mm256_store_ps(out + g * stride, _mm256_i32gather_ps(tmp + g, idx, 4));
}

struct Ctx {
  const AttentionArgs* a;
  const Plan* p;
  float* partials;
  int64_t Dk, Dv, Gk, Gv, gk, gv, kb, vb, Rmax;
  int64_t krow_bytes, vrow_bytes;
  int mode;          // key columns: 0 nibbles of 4-bit codes, 1 bytes (codes < 64), 2 nibbles of 8-bit codes
  int64_t Wd;        // 32-bit columns per key row (packed 4-bit, or bytes)
  int64_t gq, Gq;    // the query's quantization groups (attn::query_group_size): dims, count
  int64_t cols_per_group;  // image words per query group
  bool kchan;        // per-channel keys (layout 1): scores per block of gk positions, then the bf16 residual
  int64_t nq;        // kchan: positions [0, nq) quantized, [nq, length) in the residual window
  int64_t nout;      // kchan: outlier channels per block (0: none)
};

struct Scratch {
  int32_t* qimg;     // [Rmax][2 planes][Dk/4] query words (4 int8 each): per row, its high plane, then its low
  float* coef;
  float* bcoef;
  int32_t* lo;
  int32_t* hi;
  int32_t* colbuf;   // [Wd][2][8] (nibble planes) or [Wd][8]
  uint8_t* kbytes;   // widths other than 4 and 8: 8 packed rows' words, transposed (key_columns8_packed)
  uint8_t* kpad;     // [16][krow_bytes]
  uint8_t* kspad;
  uint8_t* kbpad;
  uint8_t* vspad;
  uint8_t* vbpad;
  float* skcol;      // [Gk][8]
  float* bkcol;
  float* sc;         // [Rmax][kT]
  float* m;
  float* l;
  float* acc;        // [Rmax][Dv]
  float* bacc;       // [Rmax][Gv][8]
  float* W;          // [Gv][Rmax][kT]
  float* svcol;      // [Gv][kT]
  float* bvcol;
  uint8_t* vshuf;    // [Dv/8][32]
  int32_t* voff;     // [Dv/8]
  float* qch;        // kchan: [Dk] q ⊙ s of the current block
  float* kscf;       // kchan: [Dk] the current block's key scales as float32
  float* kbif;       // kchan: [Dk] its key biases
  float* kres;       // kchan: [Dk][16] a residual tile, transposed (dims in rows, positions in lanes)
  float* ow;         // kchan, outliers: [Rmax][nout] scale·q[d_o]·step_o of the current block
  float* ob;         // kchan, outliers: [Rmax] −7.5·Σ_o ow (the codes' offset)
  float* ocv;        // kchan, outliers: [nout][16] the tile's refinement codes as floats (positions in lanes)
  bool outliers_on;  // whether scores8 adds the outlier channels' term (a quantized tile of a cache with them)
};

size_t carve(const Ctx& c, Scratch* s, uint8_t* base) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    uint8_t* p = base ? base + off : nullptr;
    off += (bytes + 63) / 64 * 64;
    return p;
  };
  const size_t R = static_cast<size_t>(c.Rmax), Gk = static_cast<size_t>(c.Gk), Gv = static_cast<size_t>(c.Gv);
  const size_t Dk = static_cast<size_t>(c.Dk), Dv = static_cast<size_t>(c.Dv), T = kT;
  s->qimg = reinterpret_cast<int32_t*>(take(static_cast<size_t>(c.Dk) * 2 * R));
  s->coef = reinterpret_cast<float*>(take(R * Gk * 4));
  s->bcoef = reinterpret_cast<float*>(take(R * Gk * 4));
  s->lo = reinterpret_cast<int32_t*>(take(R * 4));
  s->hi = reinterpret_cast<int32_t*>(take(R * 4));
  s->colbuf = reinterpret_cast<int32_t*>(take(static_cast<size_t>(c.Wd) * 2 * 32));
  s->kbytes = take(16 * Dk + 64);
  s->kpad = take(16 * static_cast<size_t>(c.krow_bytes) + 64);
  s->kspad = take(16 * Gk * 4);
  s->kbpad = take(16 * Gk * 4);
  s->vspad = take(16 * Gv * 4);
  s->vbpad = take(16 * Gv * 4);
  s->skcol = reinterpret_cast<float*>(take(Gk * 32));
  s->bkcol = reinterpret_cast<float*>(take(Gk * 32));
  s->sc = reinterpret_cast<float*>(take(R * T * 4));
  s->m = reinterpret_cast<float*>(take(R * 4));
  s->l = reinterpret_cast<float*>(take(R * 4));
  s->acc = reinterpret_cast<float*>(take(R * Dv * 4));
  s->bacc = reinterpret_cast<float*>(take(R * Gv * 32));
  s->W = reinterpret_cast<float*>(take(Gv * R * T * 4));
  s->svcol = reinterpret_cast<float*>(take(Gv * T * 4));
  s->bvcol = reinterpret_cast<float*>(take(Gv * T * 4));
  s->vshuf = take(Dv / 8 * 32);
  s->voff = reinterpret_cast<int32_t*>(take(Dv / 8 * 4));
  s->qch = reinterpret_cast<float*>(take(Dk * 4));
  s->kscf = reinterpret_cast<float*>(take(Dk * 4));
  s->kbif = reinterpret_cast<float*>(take(Dk * 4));
  s->kres = reinterpret_cast<float*>(take(Dk * 16 * 4));
  const size_t no = static_cast<size_t>(c.nout);
  s->ow = reinterpret_cast<float*>(take(R * no * 4 + 4));
  s->ob = reinterpret_cast<float*>(take(R * 4));
  s->ocv = reinterpret_cast<float*>(take(no * 64 + 4));
  s->outliers_on = false;
  return off;
}

// ---- keys --------------------------------------------------------------------------------------------------------

// Keys of a width other than 4 and 8 (2, 3, 5 or 6 bits) into the byte columns of key_columns8's mode 1 (colbuf[k·8]:
// the codes of dims 4k .. 4k + 3 of 8 rows, one per byte): the 8 packed rows are transposed as they are (rows in
// lanes; Dk·bits/32 words per row), then column word k is cut out of every lane's bit stream — the 4·bits-bit field at
// bit 4·bits·k, in one word or across two — and spread into four bytes with shifts and masks. (Unpacking each row to
// bytes first cost about one operation per code, plus transposing the Dk/4 unpacked words.) `words` is scratch for
// Dk·bits/32 vectors.
template <int BITS>
CIDER_INLINE void key_columns8_packed(const uint8_t* rows, int64_t row_bytes, int64_t Dk, __m256i* words,
                                      int32_t* colbuf) {
  const int64_t nw = Dk * BITS / 32;
  for (int64_t cb = 0; cb < nw; cb += 8) {
    const int64_t nc = imin(8, nw - cb);
    const __m256i m = lane_mask(nc);
    __m256i v[8];
    for (int j = 0; j < 8; ++j)
      v[j] = _mm256_maskload_epi32(reinterpret_cast<const int*>(rows + j * row_bytes + cb * 4), m);
    transpose8(v);
    for (int64_t k = 0; k < nc; ++k) _mm256_store_si256(words + cb + k, v[k]);
  }
  constexpr int kMask = (1 << BITS) - 1;
  const __m256i m0 = _mm256_set1_epi32(kMask), m1 = _mm256_set1_epi32(kMask << 8),
                m2 = _mm256_set1_epi32(kMask << 16), m3 = _mm256_set1_epi32(kMask << 24);
  for (int64_t k = 0; k < Dk / 4; ++k) {
    const int64_t bit = 4 * BITS * k, w = bit / 32;
    const int sh = static_cast<int>(bit % 32);
    __m256i f = _mm256_srl_epi32(_mm256_load_si256(words + w), _mm_cvtsi32_si128(sh));
    if (sh + 4 * BITS > 32)
      f = _mm256_or_si256(f, _mm256_sll_epi32(_mm256_load_si256(words + w + 1), _mm_cvtsi32_si128(32 - sh)));
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(f, m0),  // code 4k + i moves from bit i·BITS to bit 8i
                                       _mm256_and_si256(_mm256_slli_epi32(f, 8 - BITS), m1));
    const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(f, 16 - 2 * BITS), m2),
                                       _mm256_and_si256(_mm256_slli_epi32(f, 24 - 3 * BITS), m3));
    _mm256_store_si256(reinterpret_cast<__m256i*>(colbuf + k * 8), _mm256_or_si256(lo, hi));
  }
}

// Transposes 8 rows (row j at rows + j·row_bytes, Wd words) into columns: mode 0/2 store the low and high nibble
// planes of each word (colbuf[(2k + h)·8]), mode 1 the bytes (colbuf[k·8]).
CIDER_INLINE void key_columns8(const uint8_t* rows, int64_t row_bytes, int64_t Wd, int mode, int32_t* colbuf) {
  const __m256i low4 = _mm256_set1_epi32(0x0F0F0F0F);
  for (int64_t cb = 0; cb < Wd; cb += 8) {
    const int64_t nc = imin(8, Wd - cb);
    const __m256i m = lane_mask(nc);
    __m256i v[8];
    for (int j = 0; j < 8; ++j)
      v[j] = _mm256_maskload_epi32(reinterpret_cast<const int*>(rows + j * row_bytes + cb * 4), m);
    transpose8(v);
    for (int64_t k = 0; k < nc; ++k) {
      if (mode == 1) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(colbuf + (cb + k) * 8), v[k]);
      } else {
        _mm256_store_si256(reinterpret_cast<__m256i*>(colbuf + (2 * (cb + k)) * 8), _mm256_and_si256(v[k], low4));
        _mm256_store_si256(reinterpret_cast<__m256i*>(colbuf + (2 * (cb + k) + 1) * 8),
                           _mm256_and_si256(_mm256_srli_epi32(v[k], 4), low4));
      }
    }
  }
}

template <int NR>
CIDER_INLINE void tile_scores8(const Ctx& c, const Scratch& s, int64_t r0, __m256* sc) {
  for (int r = 0; r < NR; ++r) sc[r] = _mm256_setzero_ps();
  const int64_t W = c.Dk / 4;  // query words per plane
  const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  for (int64_t g = 0; g < c.Gq; ++g) {
    __m256i acch[NR], accl[NR];  // high- and low-plane sums
    for (int r = 0; r < NR; ++r) acch[r] = accl[r] = _mm256_setzero_si256();
    const int64_t k0 = g * c.cols_per_group, k1 = k0 + c.cols_per_group;
    for (int64_t k = k0; k < k1; ++k) {
      if (c.mode == 0) {  // 4-bit: even dims in the low nibbles, odd dims in the high nibbles
        const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.colbuf + (2 * k) * 8));
        const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.colbuf + (2 * k + 1) * 8));
        for (int r = 0; r < NR; ++r) {
          const int32_t* q = s.qimg + (r0 + r) * 2 * W + 2 * k;  // the row's high plane; its low plane W words on
          const __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(q[0])),
                                              _mm256_maddubs_epi16(hi, _mm256_set1_epi32(q[1])));
          const __m256i pl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(q[W])),
                                              _mm256_maddubs_epi16(hi, _mm256_set1_epi32(q[W + 1])));
          acch[r] = _mm256_add_epi32(acch[r], _mm256_madd_epi16(ph, ones));
          accl[r] = _mm256_add_epi32(accl[r], _mm256_madd_epi16(pl, ones));
        }
      } else if (c.mode == 1) {  // bytes below 64
        const __m256i cv = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.colbuf + k * 8));
        for (int r = 0; r < NR; ++r) {
          const int32_t* q = s.qimg + (r0 + r) * 2 * W + k;
          acch[r] = _mm256_add_epi32(acch[r], _mm256_madd_epi16(_mm256_maddubs_epi16(cv, _mm256_set1_epi32(q[0])), ones));
          accl[r] =
              _mm256_add_epi32(accl[r], _mm256_madd_epi16(_mm256_maddubs_epi16(cv, _mm256_set1_epi32(q[W])), ones));
        }
      } else {  // 8-bit: c = lo + 16·hi, both nibbles against the same query bytes
        const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.colbuf + (2 * k) * 8));
        const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.colbuf + (2 * k + 1) * 8));
        for (int r = 0; r < NR; ++r) {
          const int32_t* q = s.qimg + (r0 + r) * 2 * W + k;
          const __m256i qh = _mm256_set1_epi32(q[0]), ql = _mm256_set1_epi32(q[W]);
          acch[r] = _mm256_add_epi32(acch[r], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, qh), ones),
                                                               _mm256_madd_epi16(_mm256_maddubs_epi16(hi, qh), sixteen)));
          accl[r] = _mm256_add_epi32(accl[r], _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, ql), ones),
                                                               _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ql), sixteen)));
        }
      }
    }
    __m256i acc[NR];  // Σ Q·c = 256·(high) + (low), exact in int32
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_add_epi32(_mm256_slli_epi32(acch[r], 8), accl[r]);
    const __m256 S = _mm256_load_ps(s.skcol + g * 8), B = _mm256_load_ps(s.bkcol + g * 8);
    for (int r = 0; r < NR; ++r) {
      const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r]), S);
      sc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(s.coef[(r0 + r) * c.Gq + g]), sc[r]);
      sc[r] = _mm256_fmadd_ps(B, _mm256_set1_ps(s.bcoef[(r0 + r) * c.Gq + g]), sc[r]);
    }
  }
}

template <int NR>
CIDER_INLINE void store_scores8(const Ctx& c, const Scratch& s, const Item& it, int64_t r0, int64_t j0, int64_t jt,
                                __m256* sc) {
  const AttentionArgs& a = *c.a;
  const __m256i jv = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(j0)));
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  const bool capped = a.softcap > 0.0f;
  const __m256 cap = _mm256_set1_ps(a.softcap), inv_cap = _mm256_set1_ps(capped ? 1.0f / a.softcap : 0.0f);
  for (int r = 0; r < NR; ++r) {
    // visible: lo <= j < hi
    const __m256i vis = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(s.lo[r0 + r]), jv),
                                            _mm256_cmpgt_epi32(_mm256_set1_epi32(s.hi[r0 + r]), jv));
    __m256 v = sc[r];
    if (capped) v = _mm256_mul_ps(cap, tanh8(_mm256_mul_ps(v, inv_cap)));  // softcap, before the mask
    if ((a.mask_kind == MaskKind::kBool || a.mask_kind == MaskKind::kAdditive) && !_mm256_testz_si256(vis, vis)) {
      alignas(32) float mv[8] = {};
      const int n = static_cast<int>(imin(8, a.keys.length - j0));
      if (n > 0) attn::fetch_mask(a, it, r0 + r, j0, n, mv);
      v = _mm256_add_ps(v, _mm256_load_ps(mv));
    }
    v = _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(vis));
    _mm256_store_ps(s.sc + (r0 + r) * kT + jt, v);
  }
}

template <int NR>
CIDER_INLINE void scores8(const Ctx& c, const Scratch& s, const Item& it, int64_t r0, int64_t j0, int64_t jt) {
  __m256 sc[NR];
  tile_scores8<NR>(c, s, r0, sc);
  if (s.outliers_on)  // outlier channels: Σ_o ow[r, o]·code_o (each code vector loaded once for the NR rows)
    for (int64_t o = 0; o < c.nout; ++o) {
      const __m256 cv = _mm256_load_ps(s.ocv + o * 16 + (j0 & 15));
      for (int r = 0; r < NR; ++r) sc[r] = _mm256_fmadd_ps(_mm256_set1_ps(s.ow[(r0 + r) * c.nout + o]), cv, sc[r]);
    }
  store_scores8<NR>(c, s, it, r0, j0, jt, sc);
}

// ---- values ------------------------------------------------------------------------------------------------------

// kNib4 (4-bit values): each 16 dims from their 8 bytes, the even dims (low nibbles) into the first vector and the odd
// dims (high nibbles) into the second — one zero-extension, an and, a shift and two conversions per 16 codes, where
// the per-8 shuffle/shift/mask path takes eight operations — so s.acc holds every 16 dims as [even | odd]
// (nib4_acc_index; the partial result is written back in dim order).
enum class VKind { kBytes, kLut8, kMaskCvt, kNib4 };

// Where dim d of a row sits in s.acc with 4-bit values: within its block of 16, the even dims first.
CIDER_INLINE int64_t nib4_acc_index(int64_t d) {
  const int64_t i = d & 15;
  return (d - i) + ((i & 1) ? 8 + i / 2 : i / 2);
}

template <VKind VK>
CIDER_INLINE __m256 decode8(const uint8_t* p, __m256i shuf, __m256i shift, __m256 tab, __m256i lowmask) {
  if constexpr (VK == VKind::kBytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else {
    const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i x = _mm256_srlv_epi32(_mm256_shuffle_epi8(w, shuf), shift);
    if constexpr (VK == VKind::kLut8) return _mm256_permutevar8x32_ps(tab, x);  // index bits 2:0
    return _mm256_cvtepi32_ps(_mm256_and_si256(x, lowmask));
  }
}

template <int NR, int NP, VKind VK>
CIDER_INLINE void value_rows(const Ctx& c, const Scratch& s, const uint8_t* rows, int64_t nrows, int64_t r0,
                             int64_t d0) {
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i shift =
      _mm256_and_si256(_mm256_mullo_epi32(iota, _mm256_set1_epi32(static_cast<int>(c.vb))), _mm256_set1_epi32(7));
  const __m256i lowmask = _mm256_set1_epi32((1 << c.vb) - 1);
  const __m256 tab = _mm256_cvtepi32_ps(_mm256_and_si256(iota, lowmask));
  __m256i shuf[NP];
  int64_t off[NP];
  for (int q = 0; q < NP; ++q) {
    const int64_t ci = d0 / 8 + q;
    shuf[q] = _mm256_load_si256(reinterpret_cast<const __m256i*>(s.vshuf + ci * 32));
    off[q] = VK == VKind::kBytes ? ci * 8 : s.voff[ci];
  }
  __m256 acc[NR][NP];
  // The part's 8·NP dims (16 or 32, from a multiple of 8·NP) lie in one value group (gv >= 32): one weight per row.
  const float* w = s.W + ((d0 / c.gv) * c.Rmax + r0) * kT;
  for (int r = 0; r < NR; ++r)
    for (int q = 0; q < NP; ++q) acc[r][q] = _mm256_load_ps(s.acc + (r0 + r) * c.Dv + d0 + 8 * q);
  for (int64_t j = 0; j < nrows; ++j) {
    const uint8_t* row = rows + j * c.vrow_bytes;
    __m256 cf[NP];
    if constexpr (VK == VKind::kNib4) {
      static_assert(NP % 2 == 0, "4-bit values come 16 dims at a time");
      for (int q = 0; q < NP; q += 2) {  // dims d0 + 8q .. + 15: bytes (d0 + 8q)/2 .. + 7
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + (d0 + 8 * q) / 2)));
        cf[q] = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));  // even dims
        cf[q + 1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));                 // odd dims
      }
    } else {
      for (int q = 0; q < NP; ++q) cf[q] = decode8<VK>(row + off[q], shuf[q], shift, tab, lowmask);
    }
    for (int r = 0; r < NR; ++r) {
      const __m256 wv = _mm256_broadcast_ss(w + r * kT + j);
      for (int q = 0; q < NP; ++q) acc[r][q] = _mm256_fmadd_ps(cf[q], wv, acc[r][q]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int q = 0; q < NP; ++q) _mm256_store_ps(s.acc + (r0 + r) * c.Dv + d0 + 8 * q, acc[r][q]);
}

template <int NR, VKind VK>
CIDER_INLINE void value_rows_all_dims(const Ctx& c, const Scratch& s, const uint8_t* rows, int64_t nrows,
                                      int64_t r0) {
  constexpr int NP = NR >= 4 ? 2 : 4;  // NR·NP <= 8 accumulators of 16 registers
  int64_t d0 = 0;
  for (; d0 + 8 * NP <= c.Dv; d0 += 8 * NP) value_rows<NR, NP, VK>(c, s, rows, nrows, r0, d0);
  for (; d0 + 16 <= c.Dv; d0 += 16) value_rows<NR, 2, VK>(c, s, rows, nrows, r0, d0);
}

template <int NR>
CIDER_INLINE void values(const Ctx& c, const Scratch& s, const uint8_t* rows, int64_t nrows, int64_t r0) {
  if (c.vb == 8) value_rows_all_dims<NR, VKind::kBytes>(c, s, rows, nrows, r0);
  else if (c.vb == 4) value_rows_all_dims<NR, VKind::kNib4>(c, s, rows, nrows, r0);
  else if (c.vb <= 3) value_rows_all_dims<NR, VKind::kLut8>(c, s, rows, nrows, r0);
  else value_rows_all_dims<NR, VKind::kMaskCvt>(c, s, rows, nrows, r0);
}

template <typename F>
CIDER_INLINE void for_row_blocks(int64_t R, const F& f) {
  int64_t r0 = 0;
  for (; r0 + 4 <= R; r0 += 4) f.template run<4>(r0);
  if (r0 + 2 <= R) {
    f.template run<2>(r0);
    r0 += 2;
  }
  if (r0 < R) f.template run<1>(r0);
}

struct ScoreRows {
  const Ctx& c;
  const Scratch& s;
  const Item& it;
  int64_t j0, jt;
  template <int NR>
  CIDER_AVX2 void run(int64_t r0) const { scores8<NR>(c, s, it, r0, j0, jt); }
};

struct ValueRows {
  const Ctx& c;
  const Scratch& s;
  const uint8_t* rows;
  int64_t nrows;
  template <int NR>
  CIDER_AVX2 void run(int64_t r0) const { values<NR>(c, s, rows, nrows, r0); }
};

CIDER_AVX2 const uint8_t* tile_scales(const KVTensorView& v, const void* plane, int64_t b, int64_t h, int64_t j0,
                                      uint8_t* pad) {
  const int64_t G = v.dim / v.group_size, es = scale_bytes(v.scale_dtype);
  const uint8_t* src = static_cast<const uint8_t*>(plane) + ((b * v.H + h) * v.capacity + j0) * G * es;
  if (j0 + kTileRows <= v.capacity) return src;
  std::memset(pad, 0, static_cast<size_t>(kTileRows * G * es));
  std::memcpy(pad, src, static_cast<size_t>((v.capacity - j0) * G * es));
  return pad;
}

// The query quantization of attention_x86.h on 8 lanes: Q = rint(q·inv2) (round to nearest even) clamped, then
// split into its two int8 planes with integer shifts. Groups of 32, 64 or 128.
CIDER_INLINE __m256i pack_bytes32(__m256i a, __m256i b, __m256i c, __m256i d) {  // int32 in [−128, 127] → bytes
  const __m256i ab = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
  const __m256i cd = _mm256_permute4x64_epi64(_mm256_packs_epi32(c, d), 0xD8);
  return _mm256_permute4x64_epi64(_mm256_packs_epi16(ab, cd), 0xD8);
}

// The query quantization for one group of gs values x[0, gs) (gs a multiple of 32) whose largest |x| is amax,
// written straight into the row's two image planes in the key tiles' column order (mode 0, 4-bit keys: word 2k holds
// the bytes of dims 8k, 8k+2, 8k+4, 8k+6, word 2k + 1 the odd dims; otherwise word k holds dims 4k .. 4k+3). The
// clamp to ±32512 never binds (attention_x86.h), so none is applied. Sets *step = s/256 and returns ΣQ (all zero for
// an all-zero group).
CIDER_INLINE int32_t quantize_group_image(const float* x, int64_t gs, float amax, bool nib, int32_t* img_h,
                                          int32_t* img_l, float* step) {
  const float s = amax / 127.0f;
  *step = s / 256.0f;
  if (!(s > 0.0f)) {
    std::memset(img_h, 0, static_cast<size_t>(gs));
    std::memset(img_l, 0, static_cast<size_t>(gs));
    return 0;
  }
  const float inv = 1.0f / s;
  const __m256 iv2 = _mm256_set1_ps(256.0f * inv);
  const __m256i half = _mm256_set1_epi32(128);
  const __m256i evens_odds = _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15, 0, 2, 4, 6, 1, 3,
                                              5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  __m256i sum = _mm256_setzero_si256();
  for (int64_t k = 0; k < gs; k += 32) {
    __m256i h[4], l[4];
    for (int u = 0; u < 4; ++u) {
      // cvtps rounds to nearest even (the default MXCSR mode the kernels run under)
      const __m256i Q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * u), iv2));
      h[u] = _mm256_srai_epi32(_mm256_add_epi32(Q, half), 8);
      l[u] = _mm256_sub_epi32(Q, _mm256_slli_epi32(h[u], 8));
      sum = _mm256_add_epi32(sum, Q);
    }
    __m256i hb = pack_bytes32(h[0], h[1], h[2], h[3]), lb = pack_bytes32(l[0], l[1], l[2], l[3]);
    if (nib) {
      hb = _mm256_shuffle_epi8(hb, evens_odds);
      lb = _mm256_shuffle_epi8(lb, evens_odds);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(img_h + k / 4), hb);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(img_l + k / 4), lb);
  }
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

CIDER_AVX2 const float* query_row(const Ctx& c, const Item& it, int64_t r) {
  const AttentionArgs& a = *c.a;
  const int64_t hq = it.g * c.p->rep + r / it.nl, i = it.i0 + r % it.nl;
  return a.q + ((it.b * a.Hq + hq) * a.L + i) * c.Dk;
}

// Per-token keys: the query image of row r (its high plane, then its low plane, Dk/4 words each) and its per-group
// factors, coef = scale·step and bcoef = scale·step·ΣQ (the bias term).
CIDER_AVX2 void prepare_query_row(const Ctx& c, Scratch& s, int64_t r, const float* q) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const float scale = c.a->scale;
  const int64_t W = c.Dk / 4;
  int32_t* img = s.qimg + r * 2 * W;
  for (int64_t g = 0; g < c.Gq; ++g) {
    const float* x = q + g * c.gq;
    __m256 mx = _mm256_setzero_ps();
    for (int64_t k = 0; k < c.gq; k += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    float step;
    const int32_t qsum =
        quantize_group_image(x, c.gq, hmax8(mx), c.mode == 0, img + g * c.gq / 4, img + W + g * c.gq / 4, &step);
    s.coef[r * c.Gq + g] = scale * step;
    s.bcoef[r * c.Gq + g] = scale * step * static_cast<float>(qsum);
  }
}

// Per-channel keys: the query images of all R rows against block `blk`, each in one pass: q' = q ⊙ s_blk (float32)
// with its largest |q'| per group, the bias term scale·Σ q·b_blk in bcoef[r, 0] (the key "scale" columns are then 1
// and the "bias" columns 1 for group 0, 0 otherwise), and with outlier channels their weights, whose offset joins the
// bias term.
CIDER_AVX2 void prepare_block(const Ctx& c, Scratch& s, const Item& it, int64_t blk) {
  const KVTensorView& K = c.a->keys;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const float scale = c.a->scale;
  // Locals: the stores below go through may_alias vector types, which would make every field be read again.
  const int64_t Dk = c.Dk, Gq = c.Gq, gq = c.gq, W = Dk / 4, srow = ((it.b * K.H + it.g) * K.blocks + blk) * Dk;
  const bool nib = c.mode == 0, outliers = c.nout > 0;
  float* const qch = s.qch;
  float* const kscf = s.kscf;
  float* const kbif = s.kbif;
  if (outliers) attn::outlier_weights(*c.a, *c.p, it, blk, s.ow, s.ob);
  for (int64_t d = 0; d < Dk; d += 8) {  // the block's scales and biases widened once for the R rows
    _mm256_store_ps(kscf + d, load8(K.scales, K.scale_dtype, srow + d));
    _mm256_store_ps(kbif + d, load8(K.biases, K.scale_dtype, srow + d));
  }
  for (int64_t r = 0; r < it.R; ++r) {
    const float* q = query_row(c, it, r);
    int32_t* img = s.qimg + r * 2 * W;
    float* coef = s.coef + r * Gq;
    float* bcoef = s.bcoef + r * Gq;
    __m256 bt = _mm256_setzero_ps();
    for (int64_t g = 0; g < Gq; ++g) {
      __m256 mx = _mm256_setzero_ps();
      for (int64_t d = g * gq; d < (g + 1) * gq; d += 8) {
        const __m256 qv = _mm256_loadu_ps(q + d);
        const __m256 qs = _mm256_mul_ps(qv, _mm256_load_ps(kscf + d));
        _mm256_store_ps(qch + d, qs);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, qs));
        bt = _mm256_fmadd_ps(qv, _mm256_load_ps(kbif + d), bt);
      }
      float step;
      quantize_group_image(qch + g * gq, gq, hmax8(mx), nib, img + g * gq / 4, img + W + g * gq / 4, &step);
      coef[g] = scale * step;
      bcoef[g] = 0.0f;
    }
    bcoef[0] = scale * hsum8(bt) + (outliers ? s.ob[r] : 0.0f);
  }
}

// Outlier channels: the refinement codes of a quantized 16-position tile from j0 (inside one block) as floats,
// ocv[o][16] (positions in lanes); scores8 adds Σ_o ow[r, o]·code_o to each row's scores (the offset is in
// bcoef[r, 0]).
CIDER_AVX2 void outlier_tile(const Ctx& c, Scratch& s, const Item& it, int64_t j0) {
  const KVTensorView& K = c.a->keys;
  const int64_t gs = c.gk, blk = j0 / gs, p = j0 % gs;
  const uint8_t* codes = static_cast<const uint8_t*>(K.outlier_codes) +
                         ((it.b * K.H + it.g) * K.blocks + blk) * c.nout * gs / 2 + p / 2;
  for (int64_t o = 0; o < c.nout; ++o) {  // 8 bytes = 16 nibbles, even positions low
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + o * gs / 2));
    const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
    const __m128i nib = _mm_unpacklo_epi8(lo, hi);  // 16 codes in position order
    _mm256_store_ps(s.ocv + o * 16, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib)));
    _mm256_store_ps(s.ocv + o * 16 + 8, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nib, 8))));
  }
}

// Per-channel keys: the scores of a 16-position tile of the bfloat16 residual window, in float32 (exact queries).
CIDER_AVX2 void residual_tile(const Ctx& c, Scratch& s, const Item& it, int64_t j0, int64_t jt) {
  const AttentionArgs& a = *c.a;
  const KVTensorView& K = a.keys;
  const int64_t Dk = c.Dk;
  const uint16_t* res = static_cast<const uint16_t*>(K.residual) + ((it.b * K.H + it.g) * K.group_size + (j0 - c.nq)) * Dk;
  for (int64_t j = 0; j < kTileRows; ++j)  // rows j0 - nq + j < group_size: always inside the window
    for (int64_t d = 0; d < Dk; ++d) s.kres[d * 16 + j] = bf16_value(res[j * Dk + d]);
  const __m256 sv = _mm256_set1_ps(a.scale);
  for (int h = 0; h < 2; ++h)
    for (int64_t r = 0; r < it.R; ++r) {
      const float* q = query_row(c, it, r);
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      int64_t d = 0;
      for (; d + 2 <= Dk; d += 2) {
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_load_ps(s.kres + d * 16 + 8 * h), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(q[d + 1]), _mm256_load_ps(s.kres + (d + 1) * 16 + 8 * h), acc1);
      }
      for (; d < Dk; ++d) acc0 = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_load_ps(s.kres + d * 16 + 8 * h), acc0);
      __m256 sc[1] = {_mm256_mul_ps(_mm256_add_ps(acc0, acc1), sv)};
      store_scores8<1>(c, s, it, r, j0 + 8 * h, jt + 8 * h, sc);
    }
}

CIDER_AVX2 void run_item(const Ctx& c, Scratch& s, int64_t index) {
  const AttentionArgs& a = *c.a;
  const Item it = attn::item_of(a, *c.p, index);
  const KVTensorView& K = a.keys;
  const KVTensorView& V = a.values;
  const int64_t R = it.R, Dk = c.Dk, Dv = c.Dv, Gk = c.Gk, Gv = c.Gv, Rmax = c.Rmax;
  const float neg_inf = -__builtin_inff();

  for (int64_t r = 0; r < R; ++r) {
    if (!c.kchan) prepare_query_row(c, s, r, query_row(c, it, r));
    int64_t lo, hi;
    attn::row_range(a, it, r, &lo, &hi);
    s.lo[r] = static_cast<int32_t>(lo);
    s.hi[r] = static_cast<int32_t>(hi);
    s.m[r] = neg_inf;
    s.l[r] = 0.0f;
  }
  std::memset(s.acc, 0, static_cast<size_t>(R * Dv) * 4);
  std::memset(s.bacc, 0, static_cast<size_t>(R * Gv) * 32);

  const uint8_t* kcodes = static_cast<const uint8_t*>(K.data) + (it.b * K.H + it.g) * K.capacity * c.krow_bytes;
  const uint8_t* vcodes = static_cast<const uint8_t*>(V.data) + (it.b * V.H + it.g) * V.capacity * c.vrow_bytes;
  int64_t cur_block = -1;  // kchan: the block the query images were prepared for
  if (c.kchan)
    for (int64_t g = 0; g < Gk; ++g) {  // unit key "scales", and the bias term added once (group 0)
      _mm256_store_ps(s.skcol + g * 8, _mm256_set1_ps(1.0f));
      _mm256_store_ps(s.bkcol + g * 8, _mm256_set1_ps(g == 0 ? 1.0f : 0.0f));
    }

  for (int64_t jb = it.klo / kTileRows * kTileRows; it.khi > it.klo && jb < it.khi; jb += kT) {
    const int64_t je = imin(jb + kT, it.khi), ntiles = (je - jb + kTileRows - 1) / kTileRows;
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t j0 = jb + t * kTileRows;
      if (c.kchan) {
        if (j0 >= c.nq) {
          s.outliers_on = false;
          residual_tile(c, s, it, j0, t * kTileRows);
          continue;
        }
        if (j0 / c.gk != cur_block) {
          cur_block = j0 / c.gk;
          prepare_block(c, s, it, cur_block);
        }
        if (c.nout > 0) {
          outlier_tile(c, s, it, j0);
          s.outliers_on = true;
        }
      }
      const uint8_t* rows = kcodes + j0 * c.krow_bytes;
      if (j0 + kTileRows > K.capacity) {
        std::memset(s.kpad, 0, static_cast<size_t>(kTileRows * c.krow_bytes));
        std::memcpy(s.kpad, rows, static_cast<size_t>((K.capacity - j0) * c.krow_bytes));
        rows = s.kpad;
      }
      const int64_t row_bytes = c.krow_bytes;
      auto* words = reinterpret_cast<__m256i*>(s.kbytes);
      const uint8_t* ks = c.kchan ? nullptr : tile_scales(K, K.scales, it.b, it.g, j0, s.kspad);
      const uint8_t* kbi = c.kchan ? nullptr : tile_scales(K, K.biases, it.b, it.g, j0, s.kbpad);
      const int64_t kes = scale_bytes(K.scale_dtype) * Gk;
      for (int h = 0; h < 2; ++h) {  // two halves of 8 rows
        const uint8_t* half = rows + 8 * h * row_bytes;
        switch (c.kb) {
          case 2: key_columns8_packed<2>(half, row_bytes, Dk, words, s.colbuf); break;
          case 3: key_columns8_packed<3>(half, row_bytes, Dk, words, s.colbuf); break;
          case 5: key_columns8_packed<5>(half, row_bytes, Dk, words, s.colbuf); break;
          case 6: key_columns8_packed<6>(half, row_bytes, Dk, words, s.colbuf); break;
          default: key_columns8(half, row_bytes, c.Wd, c.mode, s.colbuf);  // 4 and 8 bits
        }
        if (!c.kchan) {
          scale_columns8(ks + 8 * h * kes, K.scale_dtype, Gk, s.skcol, 8);
          scale_columns8(kbi + 8 * h * kes, K.scale_dtype, Gk, s.bkcol, 8);
        }
        for_row_blocks(R, ScoreRows{c, s, it, j0 + 8 * h, t * kTileRows + 8 * h});
      }
    }
    bool any = false;
    const int64_t nv = 2 * ntiles;
    for (int64_t r = 0; r < R; ++r) {
      float* srow = s.sc + r * kT;
      __m256 mx = _mm256_set1_ps(neg_inf);
      for (int64_t t = 0; t < nv; ++t) mx = _mm256_max_ps(mx, _mm256_load_ps(srow + t * 8));
      const float mb = hmax8(mx);
      const float m_new = mb > s.m[r] ? mb : s.m[r];
      if (m_new == neg_inf) {
        for (int64_t t = 0; t < nv; ++t) _mm256_store_ps(srow + t * 8, _mm256_setzero_ps());
        continue;
      }
      any = true;
      if (m_new != s.m[r]) {
        const float alpha = _mm256_cvtss_f32(exp8(_mm256_set1_ps(s.m[r] - m_new)));
        const __m256 av = _mm256_set1_ps(alpha);
        for (int64_t d = 0; d < Dv; d += 8)
          _mm256_store_ps(s.acc + r * Dv + d, _mm256_mul_ps(av, _mm256_load_ps(s.acc + r * Dv + d)));
        for (int64_t g = 0; g < Gv; ++g)
          _mm256_store_ps(s.bacc + (r * Gv + g) * 8, _mm256_mul_ps(av, _mm256_load_ps(s.bacc + (r * Gv + g) * 8)));
        s.l[r] *= alpha;
        s.m[r] = m_new;
      }
      const __m256 mv = _mm256_set1_ps(m_new);
      __m256 sum = _mm256_setzero_ps();
      for (int64_t t = 0; t < nv; ++t) {
        const __m256 pv = exp8(_mm256_sub_ps(_mm256_load_ps(srow + t * 8), mv));
        _mm256_store_ps(srow + t * 8, pv);
        sum = _mm256_add_ps(sum, pv);
      }
      s.l[r] += hsum8(sum);
    }
    if (!any) continue;
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t j0 = jb + t * kTileRows;
      const uint8_t* vs = tile_scales(V, V.scales, it.b, it.g, j0, s.vspad);
      const uint8_t* vbi = V.symmetric ? nullptr : tile_scales(V, V.biases, it.b, it.g, j0, s.vbpad);
      const int64_t ves = scale_bytes(V.scale_dtype) * Gv;
      const __m256 nh = _mm256_set1_ps(-static_cast<float>(1 << (V.bits - 1)));
      for (int h = 0; h < 2; ++h) {
        scale_columns8(vs + 8 * h * ves, V.scale_dtype, Gv, s.svcol + t * 16 + 8 * h, kT);
        if (vbi == nullptr) {  // symmetric codes: bias −2^(bits−1)·scale (exact)
          for (int64_t g = 0; g < Gv; ++g)
            _mm256_store_ps(s.bvcol + g * kT + t * 16 + 8 * h,
                            _mm256_mul_ps(nh, _mm256_load_ps(s.svcol + g * kT + t * 16 + 8 * h)));
        } else {
          scale_columns8(vbi + 8 * h * ves, V.scale_dtype, Gv, s.bvcol + t * 16 + 8 * h, kT);
        }
      }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t g = 0; g < Gv; ++g) {
        __m256 bsum = _mm256_load_ps(s.bacc + (r * Gv + g) * 8);
        for (int64_t t = 0; t < nv; ++t) {
          const __m256 pv = _mm256_load_ps(s.sc + r * kT + t * 8);
          bsum = _mm256_fmadd_ps(pv, _mm256_load_ps(s.bvcol + g * kT + t * 8), bsum);
          _mm256_store_ps(s.W + (g * Rmax + r) * kT + t * 8, _mm256_mul_ps(pv, _mm256_load_ps(s.svcol + g * kT + t * 8)));
        }
        _mm256_store_ps(s.bacc + (r * Gv + g) * 8, bsum);
      }
    for_row_blocks(R, ValueRows{c, s, vcodes + jb * c.vrow_bytes, je - jb});
  }

  float* out = c.partials + index * c.p->partial_floats;
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * (2 + Dv);
    o[0] = s.m[r];
    o[1] = s.l[r];
    for (int64_t g = 0; g < Gv; ++g) {
      const float bias = hsum8(_mm256_load_ps(s.bacc + (r * Gv + g) * 8));
      if (c.vb == 4) {  // s.acc in the [even | odd] order of VKind::kNib4
        for (int64_t d = g * c.gv; d < (g + 1) * c.gv; ++d) o[2 + d] = s.acc[r * Dv + nib4_acc_index(d)] + bias;
      } else {
        for (int64_t d = g * c.gv; d < (g + 1) * c.gv; ++d) o[2 + d] = s.acc[r * Dv + d] + bias;
      }
    }
  }
}

struct Job {
  Ctx c;
  size_t scratch_bytes;
};

CIDER_AVX2 void item_entry(void* ctx, int64_t index) {
  const Job& job = *static_cast<const Job*>(ctx);
  Scratch s;
  carve(job.c, &s, static_cast<uint8_t*>(attn::thread_scratch(job.scratch_bytes)));
  const Ctx& c = job.c;
  // 8-code chunks: code l of the chunk has its 16-bit window at byte (l·bits)/8 of the chunk, inside a 16-byte load
  // at voff (moved back from the row end when needed).
  for (int64_t ci = 0; ci < c.Dv / 8; ++ci) {
    const int64_t start = ci * c.vb;  // 8 codes = bits bytes
    const int64_t off = c.vrow_bytes >= 16 ? imin(start, c.vrow_bytes - 16) : 0;
    s.voff[ci] = static_cast<int32_t>(off);
    for (int lane = 0; lane < 2; ++lane)
      for (int m = 0; m < 4; ++m) {
        const int64_t l = 4 * lane + m, byte = (l * c.vb) / 8 + (start - off);
        uint8_t* d = s.vshuf + ci * 32 + lane * 16 + m * 4;
        d[0] = byte <= 15 ? static_cast<uint8_t>(byte) : 0x80;
        d[1] = byte + 1 <= 15 ? static_cast<uint8_t>(byte + 1) : 0x80;
        d[2] = 0x80;
        d[3] = 0x80;
      }
  }
  run_item(c, s, index);
}

}  // namespace

void attention(const AttentionArgs& a) {
  if (!attn::fast_path_supported(a)) {
    ref::attention(a);  // plain caches (documented in attention_x86.h)
    return;
  }
  Job job{};
  Ctx& c = job.c;
  c.a = &a;
  const Plan plan = attn::make_plan(a, 0);
  c.p = &plan;
  c.Dk = a.keys.dim;
  c.Dv = a.values.dim;
  c.gk = a.keys.group_size;
  c.gv = a.values.group_size;
  c.Gk = c.Dk / c.gk;
  c.Gv = c.Dv / c.gv;
  c.kb = a.keys.bits;
  c.vb = a.values.bits;
  c.Rmax = plan.max_rows;
  c.krow_bytes = c.Dk * c.kb / 8;
  c.vrow_bytes = c.Dv * c.vb / 8;
  c.mode = c.kb == 4 ? 0 : c.kb == 8 ? 2 : 1;
  c.Wd = c.kb == 4 ? c.Dk / 8 : c.Dk / 4;
  c.gq = attn::query_group_size(a);
  c.Gq = c.Dk / c.gq;
  c.cols_per_group = c.kb == 4 ? c.gq / 8 : c.gq / 4;
  c.kchan = a.keys.layout == 1;
  c.nq = c.kchan ? a.keys.length / c.gk * c.gk : 0;
  c.nout = c.kchan ? a.keys.outliers : 0;
  Scratch probe;
  job.scratch_bytes = carve(c, &probe, nullptr);
  c.partials = attn::partial_buffer(static_cast<size_t>(plan.items * plan.partial_floats));
  attn::run_items(plan.items, &item_entry, &job);
  attn::merge_partials(a, plan, c.partials);
}


}  // namespace cider::kernels::x86::avx2
