// AVX-512 (F/BW/VL/DQ + VNNI) attention over the packed KV cache: integer scores, online softmax, float32 value
// sums, split over threads along the key sequence. The design and the accuracy rule are in attention_x86.h; the
// reference is kernels/ref/attention_ref.cpp. Everything here is file-local (see x86_kernels.h for why).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/attention_x86.h"
#include "quant/affine.h"
#include "kernels/x86/avx512/fast_exp.h"

#define CIDER_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")))
#define CIDER_INLINE static inline __attribute__((always_inline)) CIDER_AVX512

namespace cider::kernels::x86::avx512 {

namespace {

using attn::Item;
using attn::kBlockRows;
using attn::kTileRows;
using attn::Plan;

constexpr int kT = kBlockRows;
constexpr int kPrefetchBlocks = 4;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t scale_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }

CIDER_INLINE __mmask16 mask16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u);
}

// 16 values of a float dtype (f32 / f16 / bf16) from p[i..], widened exactly; lanes outside m read as 0.
CIDER_INLINE __m512 load16(const void* p, DType t, int64_t i, __mmask16 m) {
  if (t == DType::kF16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  if (t == DType::kBF16)
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i)), 16));
  return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
}

// tanh(x) within a few ulp (relative): for |x| < 0.625 the odd Taylor polynomial to x^19 (terms shrink by ≈ x²·4/π²,
// so the truncation is below 2^-24 relative there), above it (1 − e)/(1 + e) with e = exp(−2|x|) (exp16; no
// cancellation, 1 − e >= 0.71); the sign of x restored. Large |x| gives e = 0, i.e. exactly ±1.
CIDER_INLINE __m512 tanh16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 x2 = _mm512_mul_ps(ax, ax);
  __m512 p = _mm512_set1_ps(-443861162.0f / 1856156927625.0f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(6404582.0f / 10854718875.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-929569.0f / 638512875.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(21844.0f / 6081075.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1382.0f / 155925.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(62.0f / 2835.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(ax, x2), p, ax);
  const __m512 e = exp16(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 large = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  const __m512 t = _mm512_mask_mov_ps(large, is_small, small);
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
}

// In-register transpose of a 16×16 matrix of 32-bit words: v[j] = row j on entry, v[k] = column k on exit.
CIDER_INLINE void transpose16(__m512i* v) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 4) {  // 32-bit then 64-bit interleaves inside 128-bit lanes
    const __m512i a = _mm512_unpacklo_epi32(v[i], v[i + 1]), b = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    const __m512i c = _mm512_unpacklo_epi32(v[i + 2], v[i + 3]), d = _mm512_unpackhi_epi32(v[i + 2], v[i + 3]);
    t[i] = _mm512_unpacklo_epi64(a, c);      // lane q: column 4q   of rows i..i+3
    t[i + 1] = _mm512_unpackhi_epi64(a, c);  // column 4q + 1
    t[i + 2] = _mm512_unpacklo_epi64(b, d);  // column 4q + 2
    t[i + 3] = _mm512_unpackhi_epi64(b, d);  // column 4q + 3
  }
  for (int c = 0; c < 4; ++c) {  // 128-bit lanes: rows 0-3 | 4-7 then 8-11 | 12-15
    u[c] = _mm512_shuffle_i32x4(t[c], t[4 + c], 0x88);       // col c, c+8 of rows 0-7
    u[4 + c] = _mm512_shuffle_i32x4(t[c], t[4 + c], 0xDD);   // col c+4, c+12 of rows 0-7
    u[8 + c] = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0x88);
    u[12 + c] = _mm512_shuffle_i32x4(t[8 + c], t[12 + c], 0xDD);
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm512_shuffle_i32x4(u[c], u[8 + c], 0x88);            // column c
    v[c + 8] = _mm512_shuffle_i32x4(u[c], u[8 + c], 0xDD);        // column c + 8
    v[c + 4] = _mm512_shuffle_i32x4(u[4 + c], u[12 + c], 0x88);   // column c + 4
    v[c + 12] = _mm512_shuffle_i32x4(u[4 + c], u[12 + c], 0xDD);  // column c + 12
  }
}

// Column g (of G) of a [16, G] row-major block of scales (16·G values of dtype t starting at p), as 16 floats with
// lane j = row j.
CIDER_INLINE __m512 scale_column(const void* p, DType t, int64_t G, int64_t g) {
  if (G == 1) return load16(p, t, 0, 0xffff);
  const __m512i pos = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                          _mm512_set1_epi32(static_cast<int>(G))),
                                       _mm512_set1_epi32(static_cast<int>(g)));
  const __m512i idx = _mm512_and_si512(pos, _mm512_set1_epi32(15));
  const __m512i zv = _mm512_srli_epi32(pos, 4);
  __m512 col = _mm512_setzero_ps();
  for (int64_t z = 0; z < G; ++z) {
    const __mmask16 k = _mm512_cmpeq_epi32_mask(zv, _mm512_set1_epi32(static_cast<int>(z)));
    if (k) col = _mm512_mask_permutexvar_ps(col, k, idx, load16(p, t, 16 * z, 0xffff));
  }
  return col;
}

// All G columns of a [16, G] block of scales: out[g·stride + j] = value (j, g), widened exactly. One 16-bit
// permute per column for f16/bf16 up to G = 4 (two and a blend for G = 8), likewise for f32 up to G = 4.
CIDER_INLINE void scale_columns(const void* p, DType t, int64_t G, float* out, int64_t stride) {
  if (G == 1) {
    _mm512_store_ps(out, load16(p, t, 0, 0xffff));
    return;
  }
  const int Gi = static_cast<int>(G);
  if (t != DType::kF32 && G <= 8) {
    const uint16_t* h = static_cast<const uint16_t*>(p);
    __m512i z[4];
    for (int k = 0; k < 4; ++k) z[k] = k < Gi / 2 ? _mm512_loadu_si512(h + 32 * k) : _mm512_setzero_si512();
    const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                          12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i row_hi = _mm512_sub_epi16(iota, _mm512_set1_epi16(8));  // rows 8..15 counted from 0 (G = 8)
    for (int g = 0; g < Gi; ++g) {
      __m512i w;
      if (G <= 4) {
        const __m512i idx = _mm512_add_epi16(_mm512_mullo_epi16(iota, _mm512_set1_epi16(static_cast<short>(G))),
                                             _mm512_set1_epi16(static_cast<short>(g)));
        w = _mm512_permutex2var_epi16(z[0], idx, z[1]);
      } else {
        const __m512i ia = _mm512_add_epi16(_mm512_slli_epi16(iota, 3), _mm512_set1_epi16(static_cast<short>(g)));
        const __m512i ib = _mm512_add_epi16(_mm512_slli_epi16(row_hi, 3), _mm512_set1_epi16(static_cast<short>(g)));
        w = _mm512_mask_blend_epi16(0xFF00, _mm512_permutex2var_epi16(z[0], ia, z[1]),
                                    _mm512_permutex2var_epi16(z[2], ib, z[3]));
      }
      const __m256i w16 = _mm512_castsi512_si256(w);
      const __m512 f = t == DType::kF16 ? _mm512_cvtph_ps(w16)
                                         : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w16), 16));
      _mm512_store_ps(out + g * stride, f);
    }
    return;
  }
  if (t == DType::kF32 && G <= 4) {
    const float* f = static_cast<const float*>(p);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int g = 0; g < Gi; ++g) {
      __m512 col;
      if (G == 2) {
        const __m512i idx = _mm512_add_epi32(_mm512_slli_epi32(iota, 1), _mm512_set1_epi32(g));
        col = _mm512_permutex2var_ps(_mm512_loadu_ps(f), idx, _mm512_loadu_ps(f + 16));
      } else {
        const __m512i ia = _mm512_add_epi32(_mm512_slli_epi32(iota, 2), _mm512_set1_epi32(g));
        const __m512i ib = _mm512_add_epi32(_mm512_slli_epi32(_mm512_sub_epi32(iota, _mm512_set1_epi32(8)), 2),
                                            _mm512_set1_epi32(g));
        col = _mm512_mask_blend_ps(0xFF00, _mm512_permutex2var_ps(_mm512_loadu_ps(f), ia, _mm512_loadu_ps(f + 16)),
                                   _mm512_permutex2var_ps(_mm512_loadu_ps(f + 32), ib, _mm512_loadu_ps(f + 48)));
      }
      _mm512_store_ps(out + g * stride, col);
    }
    return;
  }
  for (int64_t g = 0; g < G; ++g) _mm512_store_ps(out + g * stride, scale_column(p, t, G, g));
}

// Everything one work item needs, carved from the thread's scratch.
struct Ctx {
  const AttentionArgs* a;
  const Plan* p;
  float* partials;
  // dims
  int64_t Dk, Dv, Gk, Gv, gk, gv, kb, vb, Rmax;
  int64_t krow_bytes, vrow_bytes;  // packed bytes per cached row
  bool nib;                        // 4-bit keys: nibble columns
  int64_t Wd;                      // 32-bit columns per key row in the tile representation
  int64_t ncolimg;                 // query images: 2·Wd (nibbles) or Wd (bytes)
  int64_t gq, Gq;                  // the query's quantization groups (attn::query_group_size): dims, count
  int64_t cols_per_group;          // image words per query group
  bool float_scores;               // CIDER_ATTN_SCORES=f32: float32 FMA scores on unpacked codes (measurement)
  bool kchan;                      // per-channel keys (layout 1): scores per block of gk positions, then residual
  int64_t nq;                      // kchan: positions [0, nq) quantized, [nq, length) in the bf16 residual window
  int64_t nout;                    // kchan: outlier channels per block (0: none)
};

struct Scratch {
  int32_t* qimg;     // [Rmax][2 planes][ncolimg] query words (4 int8 each): per row, its high plane, then its low
  float* coef;       // [Rmax][Gk] scale·sq
  float* bcoef;      // [Rmax][Gk] scale·sq·Σqi
  int32_t* lo;       // [Rmax] visible key range of each row
  int32_t* hi;
  int32_t* colbuf;   // [ncolimg][16]
  uint8_t* kbytes;   // widths other than 4 and 8: the tile's packed words, transposed (key_columns_packed)
  uint8_t* kpad;     // [16][krow_bytes] a tile past the capacity, zero padded
  uint8_t* kspad;    // [16][Gk] scales (4-byte room each)
  uint8_t* kbpad;
  uint8_t* vspad;    // [16][Gv]
  uint8_t* vbpad;
  float* skcol;      // [Gk][16]
  float* bkcol;
  float* sc;         // [Rmax][kT] scores, then p
  float* m;          // [Rmax]
  float* l;          // [Rmax]
  float* acc;        // [Rmax][Dv]
  float* bacc;       // [Rmax][Gv][16]
  float* W;          // [Gv][Rmax][kT] p·s
  float* svcol;      // [Gv][kT]
  float* bvcol;      // [Gv][kT]
  uint8_t* vshuf;    // [Dv/16][64] byte shuffles for the value code unpack
  int32_t* voff;     // [Dv/16] byte offset of each 16-code chunk's 16-byte window in a row
  float* qf;         // [Rmax][Dk] the float32 query rows (float-score variant)
  float* qch;        // kchan: [Dk] q ⊙ s of the current block
  float* kscf;       // kchan: [Dk] the current block's key scales as float32
  float* kbif;       // kchan: [Dk] its key biases
  float* kres;       // kchan: [Dk][16] a residual tile, transposed (dims in rows, positions in lanes)
  float* ow;         // kchan, outliers: [Rmax][nout] scale·q[d_o]·step_o of the current block
  float* ob;         // kchan, outliers: [Rmax] −7.5·Σ_o ow (the codes' offset)
  float* ocv;        // kchan, outliers: [nout][16] the tile's refinement codes as floats (positions in lanes)
  bool outliers_on;  // whether tile_scores_store adds the outlier channels' term (quantized tiles of such a cache)
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
  s->qimg = reinterpret_cast<int32_t*>(take(static_cast<size_t>(c.ncolimg) * 2 * R * 4));
  s->coef = reinterpret_cast<float*>(take(R * Gk * 4));
  s->bcoef = reinterpret_cast<float*>(take(R * Gk * 4));
  s->lo = reinterpret_cast<int32_t*>(take(R * 4));
  s->hi = reinterpret_cast<int32_t*>(take(R * 4));
  s->colbuf = reinterpret_cast<int32_t*>(take(static_cast<size_t>(c.ncolimg) * 64));
  s->kbytes = take(16 * Dk + 64);
  s->kpad = take(16 * static_cast<size_t>(c.krow_bytes) + 64);
  s->kspad = take(16 * Gk * 4);
  s->kbpad = take(16 * Gk * 4);
  s->vspad = take(16 * Gv * 4);
  s->vbpad = take(16 * Gv * 4);
  s->skcol = reinterpret_cast<float*>(take(Gk * 64));
  s->bkcol = reinterpret_cast<float*>(take(Gk * 64));
  s->sc = reinterpret_cast<float*>(take(R * T * 4));
  s->m = reinterpret_cast<float*>(take(R * 4));
  s->l = reinterpret_cast<float*>(take(R * 4));
  s->acc = reinterpret_cast<float*>(take(R * Dv * 4));
  s->bacc = reinterpret_cast<float*>(take(R * Gv * 64));
  s->W = reinterpret_cast<float*>(take(Gv * R * T * 4));
  s->svcol = reinterpret_cast<float*>(take(Gv * T * 4));
  s->bvcol = reinterpret_cast<float*>(take(Gv * T * 4));
  s->vshuf = take(Dv / 16 * 64);
  s->voff = reinterpret_cast<int32_t*>(take(Dv / 16 * 4));
  s->qf = reinterpret_cast<float*>(take(R * Dk * 4));
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

// ---- keys ------------------------------------------------------------------------------------------------------

// The first nc <= 8 words of the 16 rows of a tile (row j at rows + j·row_bytes) as columns: out[k] = word k of every
// row (rows in lanes). Each vector holds rows j and j + 8 (a 256-bit half each), so the 8×8 transposes of both halves
// run side by side: 16 interleaves and 8 two-source permutes, where the 16×16 transpose takes 64 shuffles — the
// last chunk of a row's words (D 128 at 5 bits: 20 words = 16 + 4; D 64 at 4 bits: 8) is this one.
CIDER_INLINE void transpose16x8(const uint8_t* rows, int64_t row_bytes, int64_t nc, __m512i* out) {
  const __mmask8 m = static_cast<__mmask8>((1u << nc) - 1u);
  __m512i v[8], t[8];
  for (int j = 0; j < 8; ++j)
    v[j] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi32(m, rows + j * row_bytes)),
                              _mm256_maskz_loadu_epi32(m, rows + (j + 8) * row_bytes), 1);
  for (int i = 0; i < 8; i += 4) {  // lane q of t[i + c]: word c (q even) or 4 + c (q odd) of 4 rows
    const __m512i a = _mm512_unpacklo_epi32(v[i], v[i + 1]), b = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    const __m512i c = _mm512_unpacklo_epi32(v[i + 2], v[i + 3]), d = _mm512_unpackhi_epi32(v[i + 2], v[i + 3]);
    t[i] = _mm512_unpacklo_epi64(a, c);
    t[i + 1] = _mm512_unpackhi_epi64(a, c);
    t[i + 2] = _mm512_unpacklo_epi64(b, d);
    t[i + 3] = _mm512_unpackhi_epi64(b, d);
  }
  // word c: lanes 0 of t[c] (rows 0-3) and t[4 + c] (rows 4-7), then lanes 2 (rows 8-11, 12-15); word 4 + c: lanes 1, 3
  const __m512i even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int c = 0; c < 4; ++c) {
    out[c] = _mm512_permutex2var_epi64(t[c], even, t[4 + c]);
    out[4 + c] = _mm512_permutex2var_epi64(t[c], odd, t[4 + c]);
  }
}

// Words cb .. cb + nc − 1 (nc <= 16) of the 16 rows of a tile as columns (v[k] = word cb + k of every row).
CIDER_INLINE void tile_columns(const uint8_t* rows, int64_t row_bytes, int64_t cb, int64_t nc, __m512i* v) {
  if (nc <= 8) {
    transpose16x8(rows + cb * 4, row_bytes, nc, v);
    return;
  }
  const __mmask16 m = mask16(nc);
  for (int j = 0; j < 16; ++j) v[j] = _mm512_maskz_loadu_epi32(m, rows + j * row_bytes + cb * 4);
  transpose16(v);
}

// Keys of a width other than 4 and 8 (2, 3, 5 or 6 bits) into the byte layout of key_columns below (colbuf[k]: the
// codes of dims 4k .. 4k + 3 of every row, one per byte): the tile's packed rows are transposed as they are (rows in
// lanes; Dk·bits/32 words per row), then column word k is cut out of every lane's bit stream — the 4·bits-bit field at
// bit 4·bits·k, in one word or across two — and spread into four bytes with three shifts and masks. Where the rows were
// unpacked to bytes first (one pdep per eight codes), the tile cost 16·Dk/8 pdeps, loads and stores and then twice
// the transposes: this takes Dk·bits/32 words through the transposes and about nine vector operations per
// 64 codes. `words` is scratch for Dk·bits/32 vectors.
template <int BITS>
CIDER_INLINE void key_columns_packed(const uint8_t* rows, int64_t row_bytes, int64_t Dk, __m512i* words,
                                     int32_t* colbuf) {
  const int64_t nw = Dk * BITS / 32;
  for (int64_t cb = 0; cb < nw; cb += 16) {
    const int64_t nc = imin(16, nw - cb);
    __m512i v[16];
    tile_columns(rows, row_bytes, cb, nc, v);
    for (int64_t k = 0; k < nc; ++k) _mm512_store_si512(words + cb + k, v[k]);
  }
  constexpr int kMask = (1 << BITS) - 1;
  const __m512i m0 = _mm512_set1_epi32(kMask), m1 = _mm512_set1_epi32(kMask << 8),
                m2 = _mm512_set1_epi32(kMask << 16), m3 = _mm512_set1_epi32(kMask << 24);
  for (int64_t k = 0; k < Dk / 4; ++k) {
    const int64_t bit = 4 * BITS * k, w = bit / 32;
    const int sh = static_cast<int>(bit % 32);
    __m512i f = _mm512_srl_epi32(_mm512_load_si512(words + w), _mm_cvtsi32_si128(sh));
    if (sh + 4 * BITS > 32)
      f = _mm512_or_si512(f, _mm512_sll_epi32(_mm512_load_si512(words + w + 1), _mm_cvtsi32_si128(32 - sh)));
    __m512i out = _mm512_and_si512(f, m0);  // code 4k + i moves from bit i·BITS to bit 8i: A | (B & C) = 0xF8
    out = _mm512_ternarylogic_epi32(out, _mm512_slli_epi32(f, 8 - BITS), m1, 0xF8);
    out = _mm512_ternarylogic_epi32(out, _mm512_slli_epi32(f, 16 - 2 * BITS), m2, 0xF8);
    out = _mm512_ternarylogic_epi32(out, _mm512_slli_epi32(f, 24 - 3 * BITS), m3, 0xF8);
    _mm512_store_si512(colbuf + k * 16, out);
  }
}

// Transposes the 16 rows of a tile (row j at rows + j·row_bytes, Wd 32-bit words each) into column vectors:
// nibbles: colbuf[2k] = low nibbles of word k of every row, colbuf[2k + 1] = high nibbles; bytes: colbuf[k].
CIDER_INLINE void key_columns(const uint8_t* rows, int64_t row_bytes, int64_t Wd, bool nib, int32_t* colbuf) {
  const __m512i low4 = _mm512_set1_epi32(0x0F0F0F0F);
  for (int64_t cb = 0; cb < Wd; cb += 16) {
    const int64_t nc = imin(16, Wd - cb);
    __m512i v[16];
    tile_columns(rows, row_bytes, cb, nc, v);
    for (int64_t k = 0; k < nc; ++k) {
      if (nib) {
        _mm512_store_si512(colbuf + (2 * (cb + k)) * 16, _mm512_and_si512(v[k], low4));
        _mm512_store_si512(colbuf + (2 * (cb + k) + 1) * 16, _mm512_and_si512(_mm512_srli_epi32(v[k], 4), low4));
      } else {
        _mm512_store_si512(colbuf + (cb + k) * 16, v[k]);
      }
    }
  }
}

// Scores of NR query rows r0 .. r0 + NR − 1 for the 16 rows of the current tile (columns already in colbuf).
template <int NR>
CIDER_INLINE void tile_scores(const Ctx& c, const Scratch& s, int64_t r0, __m512* sc) {
  for (int r = 0; r < NR; ++r) sc[r] = _mm512_setzero_ps();
  const int64_t W = c.ncolimg;
  for (int64_t g = 0; g < c.Gq; ++g) {
    __m512i acch[NR], accl[NR];  // high- and low-plane sums
    for (int r = 0; r < NR; ++r) acch[r] = accl[r] = _mm512_setzero_si512();
    const int64_t k0 = g * c.cols_per_group, k1 = k0 + c.cols_per_group;
    if (c.nib) {
      for (int64_t k = k0; k < k1; ++k) {
        const __m512i lo = _mm512_load_si512(s.colbuf + (2 * k) * 16);
        const __m512i hi = _mm512_load_si512(s.colbuf + (2 * k + 1) * 16);
        for (int r = 0; r < NR; ++r) {
          const int32_t* qh = s.qimg + (r0 + r) * 2 * W + 2 * k;  // the row's high plane; its low plane W words on
          acch[r] = _mm512_dpbusd_epi32(acch[r], lo, _mm512_set1_epi32(qh[0]));
          accl[r] = _mm512_dpbusd_epi32(accl[r], lo, _mm512_set1_epi32(qh[W]));
          acch[r] = _mm512_dpbusd_epi32(acch[r], hi, _mm512_set1_epi32(qh[1]));
          accl[r] = _mm512_dpbusd_epi32(accl[r], hi, _mm512_set1_epi32(qh[W + 1]));
        }
      }
    } else {
      for (int64_t k = k0; k < k1; ++k) {
        const __m512i cv = _mm512_load_si512(s.colbuf + k * 16);
        for (int r = 0; r < NR; ++r) {
          const int32_t* qh = s.qimg + (r0 + r) * 2 * W + k;
          acch[r] = _mm512_dpbusd_epi32(acch[r], cv, _mm512_set1_epi32(qh[0]));
          accl[r] = _mm512_dpbusd_epi32(accl[r], cv, _mm512_set1_epi32(qh[W]));
        }
      }
    }
    __m512i acc[NR];  // Σ Q·c = 256·(high) + (low), exact in int32
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_add_epi32(_mm512_slli_epi32(acch[r], 8), accl[r]);
    const __m512 S = _mm512_load_ps(s.skcol + g * 16), B = _mm512_load_ps(s.bkcol + g * 16);
    for (int r = 0; r < NR; ++r) {
      const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), S);
      sc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(s.coef[(r0 + r) * c.Gq + g]), sc[r]);
      sc[r] = _mm512_fmadd_ps(B, _mm512_set1_ps(s.bcoef[(r0 + r) * c.Gq + g]), sc[r]);
    }
  }
}

// The float32 variant (CIDER_ATTN_SCORES=f32, kept to measure the integer path against): each code of the
// transposed words becomes a float (shift, and, convert) and meets the exact query value with an FMA — the
// reference's algebra, score = scale·Σ_g (s·Σ q·c + b·Σ q), without query quantization.
template <int NR>
CIDER_INLINE void tile_scores_f32(const Ctx& c, const Scratch& s, int64_t r0, __m512* sc) {
  for (int r = 0; r < NR; ++r) sc[r] = _mm512_setzero_ps();
  const __m512i byte = _mm512_set1_epi32(0xFF);
  for (int64_t g = 0; g < c.Gq; ++g) {
    __m512 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
    const int64_t k0 = g * c.cols_per_group, k1 = k0 + c.cols_per_group;
    for (int64_t k = k0; k < k1; ++k) {
      const int planes = c.nib ? 2 : 1;
      for (int h = 0; h < planes; ++h) {
        const __m512i w = _mm512_load_si512(s.colbuf + (planes * k + h) * 16);
        for (int t = 0; t < 4; ++t) {
          const __m512 cf = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(w, 8 * t), byte));
          const int64_t dim = c.nib ? 8 * k + 2 * t + h : 4 * k + t;
          for (int r = 0; r < NR; ++r) acc[r] = _mm512_fmadd_ps(cf, _mm512_set1_ps(s.qf[(r0 + r) * c.Dk + dim]), acc[r]);
        }
      }
    }
    const __m512 S = _mm512_load_ps(s.skcol + g * 16), B = _mm512_load_ps(s.bkcol + g * 16);
    for (int r = 0; r < NR; ++r) {
      const __m512 t = _mm512_mul_ps(acc[r], S);
      sc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(s.coef[(r0 + r) * c.Gq + g]), sc[r]);
      sc[r] = _mm512_fmadd_ps(B, _mm512_set1_ps(s.bcoef[(r0 + r) * c.Gq + g]), sc[r]);
    }
  }
}

// Applies the softcap (a.softcap > 0), then the visible range / masks of rows r0.. to the 16 scores of tile j0 and
// stores them at sc[r][jt..].
template <int NR>
CIDER_INLINE void store_scores(const Ctx& c, const Scratch& s, const Item& it, int64_t r0, int64_t j0, int64_t jt,
                               __m512* sc) {
  const AttentionArgs& a = *c.a;
  const __m512i jv = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                      _mm512_set1_epi32(static_cast<int>(j0)));
  const bool capped = a.softcap > 0.0f;
  const __m512 cap = _mm512_set1_ps(a.softcap), inv_cap = _mm512_set1_ps(capped ? 1.0f / a.softcap : 0.0f);
  for (int r = 0; r < NR; ++r) {
    const __mmask16 vis = _mm512_cmpge_epi32_mask(jv, _mm512_set1_epi32(s.lo[r0 + r])) &
                          _mm512_cmplt_epi32_mask(jv, _mm512_set1_epi32(s.hi[r0 + r]));
    __m512 v = sc[r];
    if (capped) v = _mm512_mul_ps(cap, tanh16(_mm512_mul_ps(v, inv_cap)));  // softcap, before the mask
    if ((a.mask_kind == MaskKind::kBool || a.mask_kind == MaskKind::kAdditive) && vis) {
      alignas(64) float mv[16] = {};
      const int n = static_cast<int>(imin(16, a.keys.length - j0));
      attn::fetch_mask(a, it, r0 + r, j0, n, mv);
      v = _mm512_add_ps(v, _mm512_load_ps(mv));  // 0 or −inf for bool masks
    }
    v = _mm512_mask_mov_ps(_mm512_set1_ps(-__builtin_inff()), vis, v);
    _mm512_store_ps(s.sc + (r0 + r) * kT + jt, v);
  }
}

template <int NR>
CIDER_INLINE void tile_scores_store(const Ctx& c, const Scratch& s, const Item& it, int64_t r0, int64_t j0,
                                    int64_t jt) {
  __m512 sc[NR];
  if (c.float_scores) tile_scores_f32<NR>(c, s, r0, sc);
  else tile_scores<NR>(c, s, r0, sc);
  if (s.outliers_on)  // outlier channels: Σ_o ow[r, o]·code_o (each code vector loaded once for the NR rows)
    for (int64_t o = 0; o < c.nout; ++o) {
      const __m512 cv = _mm512_load_ps(s.ocv + o * 16);
      for (int r = 0; r < NR; ++r) sc[r] = _mm512_fmadd_ps(_mm512_set1_ps(s.ow[(r0 + r) * c.nout + o]), cv, sc[r]);
    }
  store_scores<NR>(c, s, it, r0, j0, jt, sc);
}

// ---- values ----------------------------------------------------------------------------------------------------

// How 16 value codes become floats: 8-bit codes are bytes; other widths take each code's 16-bit window of the bit
// stream with a byte shuffle of a 16-byte load, shift it into place, then look the low bits up in a table of floats
// (vpermps reads index bits 3:0, vpermt2ps bits 4:0, so codes of up to 4 resp. 5 bits need no mask) or mask and
// convert (6 bits).
// kNib4 (4-bit values): each 32 dims from their 16 bytes, the even dims (low nibbles) into the first vector and the
// odd dims (high nibbles) into the second — one zero-extension, an and, a shift and two conversions per 32 codes,
// where the shuffle/shift/lookup path takes six operations and two broadcast loads — so s.acc holds every 32 dims as
// [even | odd] (nib4_acc_index; the partial result is written back in dim order).
enum class VKind { kBytes, kLut16, kLut32, kMaskCvt, kNib4 };

// Where dim d of a row sits in s.acc with 4-bit values: within its block of 32, the even dims first.
CIDER_INLINE int64_t nib4_acc_index(int64_t d) {
  const int64_t i = d & 31;
  return (d - i) + ((i & 1) ? 16 + i / 2 : i / 2);
}

template <VKind VK>
CIDER_INLINE __m512 decode16(const uint8_t* p, __m512i shuf, __m512i shift, __m512 tab0, __m512 tab1,
                             __m512i lowmask) {
  if constexpr (VK == VKind::kBytes) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  } else {
    const __m512i w = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i x = _mm512_srlv_epi32(_mm512_shuffle_epi8(w, shuf), shift);
    if constexpr (VK == VKind::kLut16) return _mm512_permutexvar_ps(x, tab0);
    if constexpr (VK == VKind::kLut32) return _mm512_permutex2var_ps(tab0, x, tab1);
    return _mm512_cvtepi32_ps(_mm512_and_si512(x, lowmask));
  }
}

// acc[r][d0 .. d0 + 16·NP) += Σ_j W[g][r][j] · code[j][d] for rows j of the block, query rows r0 .. r0 + NR − 1.
template <int NR, int NP, VKind VK>
CIDER_INLINE void value_rows(const Ctx& c, const Scratch& s, const uint8_t* rows, int64_t nrows, int64_t r0,
                             int64_t d0) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i shift =
      _mm512_and_si512(_mm512_mullo_epi32(iota, _mm512_set1_epi32(static_cast<int>(c.vb))), _mm512_set1_epi32(7));
  const __m512i lowmask = _mm512_set1_epi32((1 << c.vb) - 1);
  const __m512 tab0 = _mm512_cvtepi32_ps(_mm512_and_si512(iota, lowmask));
  const __m512 tab1 = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_add_epi32(iota, _mm512_set1_epi32(16)), lowmask));
  __m512i shuf[NP];
  int64_t off[NP];
  for (int q = 0; q < NP; ++q) {
    const int64_t ci = d0 / 16 + q;
    shuf[q] = _mm512_load_si512(s.vshuf + ci * 64);
    off[q] = VK == VKind::kBytes ? ci * 16 : s.voff[ci];
  }
  __m512 acc[NR][NP];
  constexpr int NH = (NP + 1) / 2;  // 32-dim halves of the part: each lies in one value group (gv >= 32)
  const float* w[NH];
  for (int h = 0; h < NH; ++h) w[h] = s.W + (((d0 + 32 * h) / c.gv) * c.Rmax + r0) * kT;
  for (int r = 0; r < NR; ++r)
    for (int q = 0; q < NP; ++q) acc[r][q] = _mm512_load_ps(s.acc + (r0 + r) * c.Dv + d0 + 16 * q);
  const int64_t rb = c.vrow_bytes;
  for (int64_t j = 0; j < nrows; ++j) {
    const uint8_t* row = rows + j * rb;
    __m512 cf[NP];
    if constexpr (VK == VKind::kNib4) {
      static_assert(NP % 2 == 0, "4-bit values come 32 dims at a time");
      for (int q = 0; q < NP; q += 2) {  // dims d0 + 16q .. + 31: bytes (d0 + 16q)/2 .. + 15
        const __m512i b =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + (d0 + 16 * q) / 2)));
        cf[q] = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));  // even dims
        cf[q + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));                 // odd dims
      }
    } else {
      for (int q = 0; q < NP; ++q) cf[q] = decode16<VK>(row + off[q], shuf[q], shift, tab0, tab1, lowmask);
    }
    for (int r = 0; r < NR; ++r) {
      __m512 wv[NH];
      for (int h = 0; h < NH; ++h) wv[h] = _mm512_set1_ps(w[h][r * kT + j]);
      for (int q = 0; q < NP; ++q) acc[r][q] = _mm512_fmadd_ps(cf[q], wv[q / 2], acc[r][q]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int q = 0; q < NP; ++q) _mm512_store_ps(s.acc + (r0 + r) * c.Dv + d0 + 16 * q, acc[r][q]);
}

template <int NR, VKind VK>
CIDER_INLINE void value_rows_all_dims(const Ctx& c, const Scratch& s, const uint8_t* rows, int64_t nrows,
                                      int64_t r0) {
  // Accumulators in registers: NR·NP <= 16.
  constexpr int NP = NR >= 8 ? 2 : 4;
  int64_t d0 = 0;
  for (; d0 + 16 * NP <= c.Dv; d0 += 16 * NP) value_rows<NR, NP, VK>(c, s, rows, nrows, r0, d0);
  for (; d0 + 32 <= c.Dv; d0 += 32) value_rows<NR, 2, VK>(c, s, rows, nrows, r0, d0);
}

template <int NR>
CIDER_INLINE void value_rows_dispatch(const Ctx& c, const Scratch& s, const uint8_t* rows, int64_t nrows,
                                      int64_t r0) {
  if (c.vb == 8) value_rows_all_dims<NR, VKind::kBytes>(c, s, rows, nrows, r0);
  else if (c.vb == 4) value_rows_all_dims<NR, VKind::kNib4>(c, s, rows, nrows, r0);
  else if (c.vb <= 3) value_rows_all_dims<NR, VKind::kLut16>(c, s, rows, nrows, r0);
  else if (c.vb == 5) value_rows_all_dims<NR, VKind::kLut32>(c, s, rows, nrows, r0);
  else value_rows_all_dims<NR, VKind::kMaskCvt>(c, s, rows, nrows, r0);
}

// ---- one work item -----------------------------------------------------------------------------------------------

// Runs f.run<NR>(r0) over the query rows in sub-blocks of 8, then 4, 2, 1 (functors, not lambdas: a lambda would
// not inherit the target attribute).
template <typename F>
CIDER_INLINE void for_row_blocks(int64_t R, const F& f) {
  int64_t r0 = 0;
  for (; r0 + 8 <= R; r0 += 8) f.template run<8>(r0);
  if (r0 + 4 <= R) {
    f.template run<4>(r0);
    r0 += 4;
  }
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
  CIDER_AVX512 void run(int64_t r0) const { tile_scores_store<NR>(c, s, it, r0, j0, jt); }
};

struct ValueRows {
  const Ctx& c;
  const Scratch& s;
  const uint8_t* rows;
  int64_t nrows;
  template <int NR>
  CIDER_AVX512 void run(int64_t r0) const { value_rows_dispatch<NR>(c, s, rows, nrows, r0); }
};

// Pointer to the [16, G] scales (or biases) of rows j0.. of (b, h), or a zero-padded copy when the tile runs past
// the storage's capacity.
CIDER_AVX512 const uint8_t* tile_scales(const KVTensorView& v, const void* plane, int64_t b, int64_t h, int64_t j0,
                                        uint8_t* pad) {
  const int64_t G = v.dim / v.group_size, es = scale_bytes(v.scale_dtype);
  const uint8_t* src = static_cast<const uint8_t*>(plane) + ((b * v.H + h) * v.capacity + j0) * G * es;
  if (j0 + kTileRows <= v.capacity) return src;
  const int64_t n = v.capacity - j0;
  std::memset(pad, 0, static_cast<size_t>(kTileRows * G * es));
  std::memcpy(pad, src, static_cast<size_t>(n * G * es));
  return pad;
}

// Prefetches rows j0 .. j0 + 15 of (b, g): key and value codes, scales and biases (into L1/L2).
CIDER_INLINE void prefetch_range(const void* base, int64_t bytes) {
  const char* p = static_cast<const char*>(base);
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

CIDER_AVX512 void prefetch_tile(const Ctx& c, const Item& it, int64_t j0) {
  const KVTensorView& K = c.a->keys;
  const KVTensorView& V = c.a->values;
  const int64_t kr = (it.b * K.H + it.g) * K.capacity + j0, vr = (it.b * V.H + it.g) * V.capacity + j0;
  prefetch_range(static_cast<const uint8_t*>(K.data) + kr * c.krow_bytes, kTileRows * c.krow_bytes);
  prefetch_range(static_cast<const uint8_t*>(V.data) + vr * c.vrow_bytes, kTileRows * c.vrow_bytes);
  const int64_t kes = scale_bytes(K.scale_dtype) * c.Gk, ves = scale_bytes(V.scale_dtype) * c.Gv;
  if (c.kchan) {  // per-channel keys: the block's scale and bias rows [Dk] and its outlier planes, once per block
    if (j0 % c.gk == 0 && j0 < c.nq) {
      const int64_t blk = (it.b * K.H + it.g) * K.blocks + j0 / c.gk, row = scale_bytes(K.scale_dtype) * c.Dk;
      prefetch_range(static_cast<const uint8_t*>(K.scales) + blk * row, row);
      prefetch_range(static_cast<const uint8_t*>(K.biases) + blk * row, row);
      if (c.nout > 0) prefetch_range(static_cast<const uint8_t*>(K.outlier_codes) + blk * c.nout * c.gk / 2,
                                     c.nout * c.gk / 2);
    }
  } else {
    prefetch_range(static_cast<const uint8_t*>(K.scales) + kr * kes, kTileRows * kes);
    prefetch_range(static_cast<const uint8_t*>(K.biases) + kr * kes, kTileRows * kes);
  }
  prefetch_range(static_cast<const uint8_t*>(V.scales) + vr * ves, kTileRows * ves);
  if (V.biases != nullptr) prefetch_range(static_cast<const uint8_t*>(V.biases) + vr * ves, kTileRows * ves);
}

// The query quantization of attention_x86.h for one group of gs values x[0, gs) (gs a multiple of 16) whose largest
// |x| is amax, written straight into the row's two image planes in the key tiles' column order (4-bit keys: word 2k
// holds the bytes of dims 8k, 8k+2, 8k+4, 8k+6, word 2k + 1 the odd dims; 8-bit and other widths: word k holds dims
// 4k .. 4k+3): Q = rint(x·(256·inv)) split as qh = (Q + 128) >> 8, ql = Q − 256·qh with integer shifts. The clamp to
// ±32512 never binds (attention_x86.h), so none is applied. Sets *step = s/256 and returns ΣQ (all zero for an
// all-zero group).
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
  const __m512 iv2 = _mm512_set1_ps(256.0f * inv);
  const __m512i half = _mm512_set1_epi32(128);
  const __m128i order = nib ? _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15)
                            : _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i sum = _mm512_setzero_si512();
  for (int64_t k = 0; k < gs; k += 16) {
    const __m512i Q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), iv2),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i h = _mm512_srai_epi32(_mm512_add_epi32(Q, half), 8);
    const __m512i l = _mm512_sub_epi32(Q, _mm512_slli_epi32(h, 8));
    sum = _mm512_add_epi32(sum, Q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(img_h + k / 4), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(h), order));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(img_l + k / 4), _mm_shuffle_epi8(_mm512_cvtepi32_epi8(l), order));
  }
  return _mm512_reduce_add_epi32(sum);
}

CIDER_AVX512 const float* query_row(const Ctx& c, const Item& it, int64_t r) {
  const AttentionArgs& a = *c.a;
  const int64_t hq = it.g * c.p->rep + r / it.nl, i = it.i0 + r % it.nl;
  return a.q + ((it.b * a.Hq + hq) * a.L + i) * c.Dk;
}

// Per-token keys: the query image of row r and its per-group factors, coef = scale·step and bcoef = scale·step·ΣQ
// (the bias term).
CIDER_AVX512 void prepare_query_row(const Ctx& c, Scratch& s, int64_t r, const float* q) {
  const float scale = c.a->scale;
  int32_t* img = s.qimg + r * 2 * c.ncolimg;  // its high plane, then its low plane
  for (int64_t g = 0; g < c.Gq; ++g) {
    const float* x = q + g * c.gq;
    __m512 mx = _mm512_setzero_ps();
    for (int64_t k = 0; k < c.gq; k += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
    float step;
    const int32_t qsum = quantize_group_image(x, c.gq, _mm512_reduce_max_ps(mx), c.nib, img + g * c.gq / 4,
                                              img + c.ncolimg + g * c.gq / 4, &step);
    s.coef[r * c.Gq + g] = scale * step;
    s.bcoef[r * c.Gq + g] = scale * step * static_cast<float>(qsum);
  }
}

// Per-channel keys: the query images of all R rows against block `blk`, each in one pass: q' = q ⊙ s_blk (float32)
// with its largest |q'| per group, the bias term scale·Σ q·b_blk in bcoef[r, 0] (the key "scale" columns are then 1
// and the "bias" columns 1 for group 0, 0 otherwise), and with outlier channels their weights, whose offset joins the
// bias term.
CIDER_AVX512 void prepare_block(const Ctx& c, Scratch& s, const Item& it, int64_t blk) {
  const KVTensorView& K = c.a->keys;
  const float scale = c.a->scale;
  // Locals: the stores below go through may_alias vector types, which would make every field be read again.
  const int64_t Dk = c.Dk, Gq = c.Gq, gq = c.gq, W = c.ncolimg, srow = ((it.b * K.H + it.g) * K.blocks + blk) * Dk;
  const bool nib = c.nib, outliers = c.nout > 0;
  float* const qch = s.qch;
  float* const kscf = s.kscf;
  float* const kbif = s.kbif;
  if (outliers) attn::outlier_weights(*c.a, *c.p, it, blk, s.ow, s.ob);
  for (int64_t d = 0; d < Dk; d += 16) {  // the block's scales and biases widened once for the R rows
    _mm512_store_ps(kscf + d, load16(K.scales, K.scale_dtype, srow + d, 0xffff));
    _mm512_store_ps(kbif + d, load16(K.biases, K.scale_dtype, srow + d, 0xffff));
  }
  for (int64_t r = 0; r < it.R; ++r) {
    const float* q = query_row(c, it, r);
    int32_t* img = s.qimg + r * 2 * W;
    float* coef = s.coef + r * Gq;
    float* bcoef = s.bcoef + r * Gq;
    __m512 bt = _mm512_setzero_ps();
    for (int64_t g = 0; g < Gq; ++g) {
      __m512 mx = _mm512_setzero_ps();
      for (int64_t d = g * gq; d < (g + 1) * gq; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        const __m512 qs = _mm512_mul_ps(qv, _mm512_load_ps(kscf + d));
        _mm512_store_ps(qch + d, qs);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(qs));
        bt = _mm512_fmadd_ps(qv, _mm512_load_ps(kbif + d), bt);
      }
      float step;
      quantize_group_image(qch + g * gq, gq, _mm512_reduce_max_ps(mx), nib, img + g * gq / 4, img + W + g * gq / 4,
                           &step);
      coef[g] = scale * step;
      bcoef[g] = 0.0f;
    }
    bcoef[0] = scale * _mm512_reduce_add_ps(bt) + (outliers ? s.ob[r] : 0.0f);
  }
}

// Outlier channels: the refinement codes of a quantized 16-position tile from j0 (inside one block) as floats,
// ocv[o][16] (positions in lanes); tile_scores_store adds Σ_o ow[r, o]·code_o to each row's scores (the offset is in
// bcoef[r, 0]).
CIDER_AVX512 void outlier_tile(const Ctx& c, Scratch& s, const Item& it, int64_t j0) {
  const KVTensorView& K = c.a->keys;
  const int64_t gs = c.gk, blk = j0 / gs, p = j0 % gs;
  const uint8_t* codes = static_cast<const uint8_t*>(K.outlier_codes) +
                         ((it.b * K.H + it.g) * K.blocks + blk) * c.nout * gs / 2 + p / 2;
  for (int64_t o = 0; o < c.nout; ++o) {  // 8 bytes = 16 nibbles, even positions low
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + o * gs / 2));
    const __m128i lo = _mm_and_si128(bytes, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
    _mm512_store_ps(s.ocv + o * 16, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi))));
  }
}

// Per-channel keys: the scores of a 16-position tile of the bfloat16 residual window, in float32 (exact queries).
CIDER_AVX512 void residual_tile(const Ctx& c, Scratch& s, const Item& it, int64_t j0, int64_t jt) {
  const AttentionArgs& a = *c.a;
  const KVTensorView& K = a.keys;
  const int64_t Dk = c.Dk;
  const uint16_t* res =
      static_cast<const uint16_t*>(K.residual) + ((it.b * K.H + it.g) * K.group_size + (j0 - c.nq)) * Dk;
  for (int64_t j = 0; j < kTileRows; ++j)  // rows j0 - nq + j < group_size: always inside the window
    for (int64_t d = 0; d < Dk; ++d) {
      const uint32_t u = static_cast<uint32_t>(res[j * Dk + d]) << 16;
      std::memcpy(s.kres + d * 16 + j, &u, 4);
    }
  for (int64_t r = 0; r < it.R; ++r) {
    const float* q = query_row(c, it, r);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t d = 0;
    for (; d + 2 <= Dk; d += 2) {
      acc0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_load_ps(s.kres + d * 16), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_set1_ps(q[d + 1]), _mm512_load_ps(s.kres + (d + 1) * 16), acc1);
    }
    for (; d < Dk; ++d) acc0 = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_load_ps(s.kres + d * 16), acc0);
    __m512 sc[1] = {_mm512_mul_ps(_mm512_add_ps(acc0, acc1), _mm512_set1_ps(a.scale))};
    store_scores<1>(c, s, it, r, j0, jt, sc);
  }
}

CIDER_AVX512 void run_item(const Ctx& c, Scratch& s, int64_t index) {
  const AttentionArgs& a = *c.a;
  const Item it = attn::item_of(a, *c.p, index);
  const KVTensorView& K = a.keys;
  const KVTensorView& V = a.values;
  const int64_t R = it.R, Rmax = c.Rmax, Dk = c.Dk, Dv = c.Dv, Gk = c.Gk, Gv = c.Gv;
  const float neg_inf = -__builtin_inff();

  // ---- queries: int8 per key group, word images, coefficients, visible ranges ----
  for (int64_t r = 0; r < R; ++r) {
    const float* q = query_row(c, it, r);
    if (!c.kchan) prepare_query_row(c, s, r, q);
    if (c.float_scores) {
      for (int64_t g = 0; g < Gk; ++g) {
        float sum = 0.0f;
        for (int64_t k = g * c.gk; k < (g + 1) * c.gk; ++k) sum += q[k];
        s.coef[r * Gk + g] = a.scale;
        s.bcoef[r * Gk + g] = a.scale * sum;
      }
      std::memcpy(s.qf + r * Dk, q, static_cast<size_t>(Dk) * 4);
    }
    int64_t lo, hi;
    attn::row_range(a, it, r, &lo, &hi);
    s.lo[r] = static_cast<int32_t>(lo);
    s.hi[r] = static_cast<int32_t>(hi);
    s.m[r] = neg_inf;
    s.l[r] = 0.0f;
  }
  std::memset(s.acc, 0, static_cast<size_t>(R * Dv) * 4);
  std::memset(s.bacc, 0, static_cast<size_t>(R * Gv) * 64);

  const uint8_t* kcodes = static_cast<const uint8_t*>(K.data) + (it.b * K.H + it.g) * K.capacity * c.krow_bytes;
  const uint8_t* vcodes = static_cast<const uint8_t*>(V.data) + (it.b * V.H + it.g) * V.capacity * c.vrow_bytes;
  int64_t cur_block = -1;  // kchan: the block the query images were prepared for
  if (c.kchan)
    for (int64_t g = 0; g < Gk; ++g) {  // unit key "scales", and the bias term added once (group 0)
      _mm512_store_ps(s.skcol + g * 16, _mm512_set1_ps(1.0f));
      _mm512_store_ps(s.bkcol + g * 16, _mm512_set1_ps(g == 0 ? 1.0f : 0.0f));
    }

  for (int64_t jb = it.klo / kTileRows * kTileRows; it.khi > it.klo && jb < it.khi; jb += kT) {
    const int64_t je = imin(jb + kT, it.khi), ntiles = (je - jb + kTileRows - 1) / kTileRows;
    // ---- scores of the block ----
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t j0 = jb + t * kTileRows;
      // Prefetch the same tile kPrefetchBlocks blocks ahead (keys, values, their scales): a decode step streams the
      // cache once, and the hardware prefetchers alone leave a thread latency-bound (measured in docs/benchmarks.md:
      // 4 blocks = 512 rows ahead was best of 0, 1, 2, 4, 8).
      if (j0 + kPrefetchBlocks * kT + kTileRows <= imin(it.khi + kTileRows, K.capacity))
        prefetch_tile(c, it, j0 + kPrefetchBlocks * kT);
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
        const int64_t n = K.capacity - j0;
        std::memset(s.kpad, 0, static_cast<size_t>(kTileRows * c.krow_bytes));
        std::memcpy(s.kpad, rows, static_cast<size_t>(n * c.krow_bytes));
        rows = s.kpad;
      }
      auto* words = reinterpret_cast<__m512i*>(s.kbytes);
      switch (c.kb) {
        case 2: key_columns_packed<2>(rows, c.krow_bytes, Dk, words, s.colbuf); break;
        case 3: key_columns_packed<3>(rows, c.krow_bytes, Dk, words, s.colbuf); break;
        case 5: key_columns_packed<5>(rows, c.krow_bytes, Dk, words, s.colbuf); break;
        case 6: key_columns_packed<6>(rows, c.krow_bytes, Dk, words, s.colbuf); break;
        default: key_columns(rows, c.krow_bytes, c.Wd, c.nib, s.colbuf);  // 4 and 8 bits
      }
      if (!c.kchan) {
        const uint8_t* ks = tile_scales(K, K.scales, it.b, it.g, j0, s.kspad);
        const uint8_t* kbi = tile_scales(K, K.biases, it.b, it.g, j0, s.kbpad);
        scale_columns(ks, K.scale_dtype, Gk, s.skcol, 16);
        scale_columns(kbi, K.scale_dtype, Gk, s.bkcol, 16);
      }
      for_row_blocks(R, ScoreRows{c, s, it, j0, t * kTileRows});
    }
    // ---- online softmax: new maxima, rescale, p = exp(s − m) ----
    bool any = false;
    const int64_t nv = ntiles;  // vectors of 16 scores
    for (int64_t r = 0; r < R; ++r) {
      float* srow = s.sc + r * kT;
      __m512 mx = _mm512_set1_ps(neg_inf);
      for (int64_t t = 0; t < nv; ++t) mx = _mm512_max_ps(mx, _mm512_load_ps(srow + t * 16));
      const float mb = _mm512_reduce_max_ps(mx);
      const float m_new = mb > s.m[r] ? mb : s.m[r];
      if (m_new == neg_inf) {  // nothing visible yet: p = 0
        for (int64_t t = 0; t < nv; ++t) _mm512_store_ps(srow + t * 16, _mm512_setzero_ps());
        continue;
      }
      any = true;
      if (m_new != s.m[r]) {
        const float alpha = _mm512_cvtss_f32(exp16(_mm512_set1_ps(s.m[r] - m_new)));  // 0 when m was −inf
        const __m512 av = _mm512_set1_ps(alpha);
        for (int64_t d = 0; d < Dv; d += 16)
          _mm512_store_ps(s.acc + r * Dv + d, _mm512_mul_ps(av, _mm512_load_ps(s.acc + r * Dv + d)));
        for (int64_t g = 0; g < Gv; ++g)
          _mm512_store_ps(s.bacc + (r * Gv + g) * 16, _mm512_mul_ps(av, _mm512_load_ps(s.bacc + (r * Gv + g) * 16)));
        s.l[r] *= alpha;
        s.m[r] = m_new;
      }
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t t = 0; t < nv; ++t) {
        const __m512 pv = exp16(_mm512_sub_ps(_mm512_load_ps(srow + t * 16), mv));
        _mm512_store_ps(srow + t * 16, pv);
        sum = _mm512_add_ps(sum, pv);
      }
      s.l[r] += _mm512_reduce_add_ps(sum);
    }
    if (!any) continue;
    // ---- values: scale / bias columns, weights p·s, bias sums Σ p·b ----
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t j0 = jb + t * kTileRows;
      const uint8_t* vs = tile_scales(V, V.scales, it.b, it.g, j0, s.vspad);
      scale_columns(vs, V.scale_dtype, Gv, s.svcol + t * 16, kT);
      if (V.symmetric) {  // symmetric codes: bias −2^(bits−1)·scale (exact)
        const __m512 nh = _mm512_set1_ps(-static_cast<float>(1 << (V.bits - 1)));
        for (int64_t g = 0; g < Gv; ++g)
          _mm512_store_ps(s.bvcol + g * kT + t * 16, _mm512_mul_ps(nh, _mm512_load_ps(s.svcol + g * kT + t * 16)));
      } else {
        scale_columns(tile_scales(V, V.biases, it.b, it.g, j0, s.vbpad), V.scale_dtype, Gv, s.bvcol + t * 16, kT);
      }
    }
    for (int64_t r = 0; r < R; ++r)
      for (int64_t g = 0; g < Gv; ++g) {
        __m512 bsum = _mm512_load_ps(s.bacc + (r * Gv + g) * 16);
        for (int64_t t = 0; t < ntiles; ++t) {
          const __m512 pv = _mm512_load_ps(s.sc + r * kT + t * 16);
          bsum = _mm512_fmadd_ps(pv, _mm512_load_ps(s.bvcol + g * kT + t * 16), bsum);
          _mm512_store_ps(s.W + (g * Rmax + r) * kT + t * 16, _mm512_mul_ps(pv, _mm512_load_ps(s.svcol + g * kT + t * 16)));
        }
        _mm512_store_ps(s.bacc + (r * Gv + g) * 16, bsum);
      }
    const uint8_t* vrows = vcodes + jb * c.vrow_bytes;
    const int64_t nrows = je - jb;
    for_row_blocks(R, ValueRows{c, s, vrows, nrows});
  }

  // ---- partial result: [m, l, acc + bias part] per row ----
  float* out = c.partials + index * c.p->partial_floats;
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * (2 + Dv);
    o[0] = s.m[r];
    o[1] = s.l[r];
    for (int64_t g = 0; g < Gv; ++g) {
      const float bias = _mm512_reduce_add_ps(_mm512_load_ps(s.bacc + (r * Gv + g) * 16));
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


CIDER_AVX512 void item_entry(void* ctx, int64_t index) {
  const Job& job = *static_cast<const Job*>(ctx);
  Scratch s;
  carve(job.c, &s, static_cast<uint8_t*>(attn::thread_scratch(job.scratch_bytes)));
  // Value-code unpack tables (byte windows of each 16-code chunk), per call.
  const Ctx& c = job.c;
  for (int64_t ci = 0; ci < c.Dv / 16; ++ci) {
    const int64_t start = ci * 2 * c.vb;  // byte offset of the chunk in the row (16 codes = 2·bits bytes)
    const int64_t off = c.vrow_bytes >= 16 ? imin(start, c.vrow_bytes - 16) : 0;
    s.voff[ci] = static_cast<int32_t>(off);
    for (int lane = 0; lane < 4; ++lane)
      for (int m = 0; m < 4; ++m) {
        const int64_t l = 4 * lane + m, byte = (l * c.vb) / 8 + (start - off);
        uint8_t* d = s.vshuf + ci * 64 + lane * 16 + m * 4;
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
    ref::attention(a);  // plain caches: the reference (documented in attention_x86.h)
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
  c.nib = c.kb == 4;
  c.Wd = c.nib ? c.Dk / 8 : c.Dk / 4;
  c.ncolimg = c.nib ? 2 * c.Wd : c.Wd;
  c.gq = attn::query_group_size(a);
  c.Gq = c.Dk / c.gq;
  c.cols_per_group = c.nib ? c.gq / 8 : c.gq / 4;
  c.kchan = a.keys.layout == 1;
  c.nq = c.kchan ? a.keys.length / c.gk * c.gk : 0;
  c.nout = c.kchan ? a.keys.outliers : 0;
  c.float_scores = attn::float_scores_requested() && !c.kchan;  // the variant exists for per-token keys only
  Scratch probe;
  job.scratch_bytes = carve(c, &probe, nullptr);
  c.partials = attn::partial_buffer(static_cast<size_t>(plan.items * plan.partial_floats));
  attn::run_items(plan.items, &item_entry, &job);
  attn::merge_partials(a, plan, c.partials);
}

}  // namespace cider::kernels::x86::avx512
