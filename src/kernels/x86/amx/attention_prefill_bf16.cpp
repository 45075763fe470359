// Attention over a packed KV cache with per-channel keys, for prefill (L >= kFromL query rows), on AMX-BF16 tiles:
// the avx512 table's attention where the CPU has AMX-BF16 + AVX512-BF16 and the OS grants the tile state
// (kernels/kernel_table.cpp; CIDER_NO_AMX=1 turns it off). Anything else — decode, per-position keys, bool/additive
// masks, a softcap, shapes below — goes to avx512::attention. Contract: AttentionArgs (kernels/kernel_table.h);
// reference: kernels/ref/attention_ref.cpp. Compiled with the avx512 flags plus -mamx-tile -mamx-bf16 -mavx512bf16.
//
// The algebra is the AVX-512 kernel's (attention_x86.h), with tiles for its two dot products:
//   scores: key block β (group_size positions, per-channel scale s and bias b) gives
//           score_rj = scale·(Σ_d (q_rd·s_βd)·c_jd + Σ_d q_rd·b_βd) (+ the outlier channels' refinement),
//           the codes c exact in bfloat16 (integers below 256) and the folded query q' = q ⊙ s_β split into two
//           bfloat16 parts, hi = bf16(q'), lo = bf16(q' − hi): two tdpbf16ps per tile, so q' keeps about 16 bits
//           (|q' − hi − lo| <= 2⁻¹⁶|q'|) and the float32 sums are the only other error. The residual window
//           (bfloat16 rows) is multiplied as stored, with the unfolded query's two parts.
//   values: o_r = Σ_j p_rj·(c_jd·s_jg + b_jg) / l_r with per-position scales: the weights w_rjg = p_rj·s_jg split
//           into two bfloat16 parts as the queries (2⁻¹⁶) times the exact codes on tiles, the bias part Σ_j p_rj·b_jg
//           in float32.
// Online softmax per key block in float32 (exp16), as the AVX-512 kernel. Error: 2⁻¹⁶ relative in q' and in w (the
// AVX-512 kernel's queries: about 2⁻¹⁶ of a group's max) and float32 sums (tests/test_attention_x86.cpp, tol_amx).
//
// Work items: (b, KV head g, query rows [i0, i0 + lb) of every query head of g, piece of the key range), lb as large
// as kMaxRows allows (R = rep·lb rows share every unpacked key and value block), merged by log-sum-exp
// (attn::merge_partials). Per item and key block: the codes unpacked (pdep) into B tiles, the query rows folded into
// A tiles, QKᵀ into C tiles stored as float scores [Rp][kMaxBlock], the softmax update, the weights into A tiles per
// value group, and O += W·codes with the C tiles loaded from and stored to the rows' float32 accumulators.
// Tiles: all 16 rows × 64 B; 0-3 C, 4-5 A, 6-7 B.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/amx/tile_config.h"
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/attention_x86.h"
#include "kernels/x86/avx512/fast_exp.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/affine.h"

namespace cider::kernels::x86::amx {

namespace {

constexpr int64_t kFromL = 16;       // fewer query rows: avx512::attention
constexpr int64_t kMaxRows = 512;    // R = rep·lb query rows per item at most
constexpr int64_t kMaxBlock = 128;   // key block (the per-channel group size) at most
constexpr int64_t kMaxDim = 256;
constexpr int64_t kTile = 1024;

using avx512::imin;
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t rup(int64_t v, int64_t m) { return avx512::round_up(v, m); }

// The dim codes of a packed row (bits per code, little-endian bit stream) as bytes.
__attribute__((target("bmi2"))) static inline void unpack_codes(const uint8_t* row, int64_t dim, int bits, uint8_t* dst) {
  if (bits == 8) {
    std::memcpy(dst, row, static_cast<size_t>(dim));
    return;
  }
  const uint64_t mask = 0x0101010101010101ull * ((uint64_t{1} << bits) - 1u);
  const int64_t groups = dim / 8, row_bytes = dim * bits / 8;
  const int64_t fast = imin(groups, (row_bytes - 8) / bits + 1);  // groups whose 8-byte load stays in the row
  for (int64_t i = 0; i < fast; ++i) {
    uint64_t w;
    std::memcpy(&w, row + i * bits, 8);
    const uint64_t v = _pdep_u64(w, mask);
    std::memcpy(dst + 8 * i, &v, 8);
  }
  for (int64_t i = fast; i < groups; ++i) {  // the last ones: their bits bytes only
    uint64_t w = 0;
    for (int k = 0; k < bits; ++k) w |= static_cast<uint64_t>(row[i * bits + k]) << (8 * k);
    const uint64_t v = _pdep_u64(w, mask);
    std::memcpy(dst + 8 * i, &v, 8);
  }
}

// 32 bytes (codes) -> 32 bfloat16, exact.
static inline __m512i codes_bf16(const uint8_t* c) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16));
  return reinterpret_cast<__m512i>(
      _mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo))));
}

struct Ctx {
  const AttentionArgs* a;
  const attn::Plan* p;
  int64_t Dk, Dv, gk, gv, Gv, nq, nout, Rp;
  float* partials;
};

// Per-thread scratch, carved from attn::thread_scratch.
struct Scratch {
  uint16_t* qhi;   // [Rp/16][Dk/32] A tiles of the folded query, high part
  uint16_t* qlo;   // the low part
  uint16_t* kb;    // [Dk/32][kMaxBlock/16] B tiles of the key codes
  uint16_t* vb;    // [kMaxBlock/32][Dv/16] B tiles of the value codes
  uint16_t* w;     // [Gv][Rp/16][kMaxBlock/32][2] A tiles of the weights: high part, low part
  float* S;        // [Rp][kMaxBlock] scores, then p
  float* O;        // [Rp][Dv] value sums (codes part)
  float* bacc;     // [Rp][Gv] bias part
  float* qb;       // [Rp] Σ q·b of the block
  float* ow;       // [Rp][outliers] outlier weights; then their offsets at owo
  float* owo;      // [Rp]
  float* m;        // [Rp]
  float* l;        // [Rp]
  int32_t* lo;     // [Rp]
  int32_t* hi;     // [Rp]
  float* vs;       // [Gv][kMaxBlock] value scales of the block
  float* vbias;    // [Gv][kMaxBlock]
  uint8_t* codes;  // [kMaxBlock][kMaxDim] unpacked codes
  float* qf;       // [kMaxDim] one folded query row
  float* oc;       // [outliers][kMaxBlock] the block's refinement codes
};

size_t carve(const Ctx& c, Scratch* s, uint8_t* base) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    uint8_t* p = base ? base + off : nullptr;
    off += (bytes + 63) / 64 * 64;
    return p;
  };
  const int64_t Rp = c.Rp, nout = std::max<int64_t>(c.nout, 1);
  s->qhi = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(Rp * c.Dk) * 2));
  s->qlo = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(Rp * c.Dk) * 2));
  s->kb = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(kMaxBlock * c.Dk) * 2));
  s->vb = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(kMaxBlock * c.Dv) * 2));
  s->w = reinterpret_cast<uint16_t*>(take(static_cast<size_t>(c.Gv * Rp * kMaxBlock) * 4));
  s->S = reinterpret_cast<float*>(take(static_cast<size_t>(Rp * kMaxBlock) * 4));
  s->O = reinterpret_cast<float*>(take(static_cast<size_t>(Rp * c.Dv) * 4));
  s->bacc = reinterpret_cast<float*>(take(static_cast<size_t>(Rp * c.Gv) * 4));
  s->qb = reinterpret_cast<float*>(take(static_cast<size_t>(Rp) * 4));
  s->ow = reinterpret_cast<float*>(take(static_cast<size_t>(Rp * nout) * 4));
  s->owo = reinterpret_cast<float*>(take(static_cast<size_t>(Rp) * 4));
  s->m = reinterpret_cast<float*>(take(static_cast<size_t>(Rp) * 4));
  s->l = reinterpret_cast<float*>(take(static_cast<size_t>(Rp) * 4));
  s->lo = reinterpret_cast<int32_t*>(take(static_cast<size_t>(Rp) * 4));
  s->hi = reinterpret_cast<int32_t*>(take(static_cast<size_t>(Rp) * 4));
  s->vs = reinterpret_cast<float*>(take(static_cast<size_t>(kMaxBlock * c.Gv) * 4));
  s->vbias = reinterpret_cast<float*>(take(static_cast<size_t>(kMaxBlock * c.Gv) * 4));
  s->codes = take(static_cast<size_t>(kMaxBlock * kMaxDim));
  s->qf = reinterpret_cast<float*>(take(static_cast<size_t>(kMaxDim) * 4));
  s->oc = reinterpret_cast<float*>(take(static_cast<size_t>(nout * kMaxBlock) * 4));
  return off;
}

__attribute__((target("amx-tile"))) void release() { _tile_release(); }

static inline const float* query_row(const Ctx& c, const attn::Item& it, int64_t r) {
  const AttentionArgs& a = *c.a;
  const int64_t hq = it.g * c.p->rep + r / it.nl, i = it.i0 + r % it.nl;
  return a.q + ((it.b * a.Hq + hq) * a.L + i) * c.Dk;
}

// Key positions [j0, j0 + nk) (nk <= kMaxBlock) into B tiles [Dk/32 steps][nkp/16 tiles] of [16 dim pairs][16 keys][2]
// bfloat16: the codes (quantized block) or the stored bfloat16 rows (residual window); keys past nk are zero.
void key_tiles(const Ctx& c, Scratch& s, const attn::Item& it, int64_t j0, int64_t nk, bool residual) {
  const KVTensorView& K = c.a->keys;
  const int64_t Dk = c.Dk, nkp = rup(nk, 32), ntile = nkp / 16;
  for (int64_t t = 0; t < ntile; ++t)
    for (int64_t st = 0; st < Dk / 32; ++st) {
      __m512i r[16];
      for (int j = 0; j < 16; ++j) {
        const int64_t jj = t * 16 + j;
        if (jj >= nk) {
          r[j] = _mm512_setzero_si512();
        } else if (residual) {
          const uint16_t* row = static_cast<const uint16_t*>(K.residual) +
                                ((it.b * K.H + it.g) * K.group_size + (j0 + jj - c.nq)) * Dk;
          r[j] = _mm512_loadu_si512(row + st * 32);
        } else {
          r[j] = codes_bf16(s.codes + jj * kMaxDim + st * 32);
        }
      }
      avx512::transpose16x16(r);  // r[pair]: 16 keys × (dims 2·pair, 2·pair + 1)
      uint16_t* dst = s.kb + (st * (kMaxBlock / 16) + t) * (kTile / 2);
      for (int k = 0; k < 16; ++k) _mm512_store_si512(dst + k * 32, r[k]);
    }
}

// C tiles 0 .. kN−1 += A tiles 4 and 5 (the two bfloat16 parts of the left operand) times the kN B tiles at b,
// b + kTile/2, … (loaded into tiles 6 and 7 in turn): the inner step of qk_tiles and pv_tiles.
template <int kN>
__attribute__((target("amx-tile,amx-bf16"), always_inline)) inline void dp_two_parts(const uint16_t* b) {
  _tile_loadd(6, b, 64);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(0, 5, 6);
  if constexpr (kN > 1) {
    _tile_loadd(7, b + kTile / 2, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(1, 5, 7);
  }
  if constexpr (kN > 2) {
    _tile_loadd(6, b + kTile, 64);
    _tile_dpbf16ps(2, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
  }
  if constexpr (kN > 3) {
    _tile_loadd(7, b + 3 * kTile / 2, 64);
    _tile_dpbf16ps(3, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
}

template <int kN>
__attribute__((target("amx-tile,amx-bf16"))) void qk_tiles(const Ctx& c, Scratch& s, int64_t G, int64_t t0) {
  const int64_t steps = c.Dk / 32;
  _tile_zero(0);
  if constexpr (kN > 1) _tile_zero(1);
  if constexpr (kN > 2) _tile_zero(2);
  if constexpr (kN > 3) _tile_zero(3);
  for (int64_t st = 0; st < steps; ++st) {
    _tile_loadd(4, s.qhi + (G * steps + st) * (kTile / 2), 64);
    _tile_loadd(5, s.qlo + (G * steps + st) * (kTile / 2), 64);
    dp_two_parts<kN>(s.kb + (st * (kMaxBlock / 16) + t0) * (kTile / 2));
  }
  float* S = s.S + G * 16 * kMaxBlock + t0 * 16;
  _tile_stored(0, S, kMaxBlock * 4);
  if constexpr (kN > 1) _tile_stored(1, S + 16, kMaxBlock * 4);
  if constexpr (kN > 2) _tile_stored(2, S + 32, kMaxBlock * 4);
  if constexpr (kN > 3) _tile_stored(3, S + 48, kMaxBlock * 4);
}

// O[16 rows of group G][dims of tiles dt .. dt + kN) += W_g · value codes, over ksteps steps of 32 keys.
template <int kN>
__attribute__((target("amx-tile,amx-bf16"))) void pv_tiles(const Ctx& c, Scratch& s, int64_t G, int64_t dt,
                                                           int64_t g, int64_t ksteps) {
  const int64_t Dv = c.Dv, stride = Dv * 4;
  float* O = s.O + G * 16 * Dv + dt * 16;
  _tile_loadd(0, O, stride);
  if constexpr (kN > 1) _tile_loadd(1, O + 16, stride);
  if constexpr (kN > 2) _tile_loadd(2, O + 32, stride);
  if constexpr (kN > 3) _tile_loadd(3, O + 48, stride);
  const int64_t Rg = c.Rp / 16;
  for (int64_t ks = 0; ks < ksteps; ++ks) {
    const uint16_t* wt = s.w + (((g * Rg + G) * (kMaxBlock / 32) + ks) * 2) * (kTile / 2);
    _tile_loadd(4, wt, 64);
    _tile_loadd(5, wt + kTile / 2, 64);
    dp_two_parts<kN>(s.vb + (ks * (Dv / 16) + dt) * (kTile / 2));
  }
  _tile_stored(0, O, stride);
  if constexpr (kN > 1) _tile_stored(1, O + 16, stride);
  if constexpr (kN > 2) _tile_stored(2, O + 32, stride);
  if constexpr (kN > 3) _tile_stored(3, O + 48, stride);
}

void run_item(const Ctx& c, Scratch& s, int64_t index) {
  const AttentionArgs& a = *c.a;
  const attn::Item it = attn::item_of(a, *c.p, index);
  const KVTensorView& K = a.keys;
  const KVTensorView& V = a.values;
  const int64_t R = it.R, Rp = rup(R, 16), Dk = c.Dk, Dv = c.Dv, Gv = c.Gv, gk = c.gk;
  const float neg_inf = -__builtin_inff();
  for (int64_t r = 0; r < Rp; ++r) {
    int64_t lo = 0, hi = 0;
    if (r < R) attn::row_range(a, it, r, &lo, &hi);
    s.lo[r] = static_cast<int32_t>(lo);
    s.hi[r] = static_cast<int32_t>(hi);
    s.m[r] = neg_inf;
    s.l[r] = 0.0f;
  }
  std::memset(s.O, 0, static_cast<size_t>(Rp * Dv) * 4);
  std::memset(s.bacc, 0, static_cast<size_t>(Rp * Gv) * 4);
  const int64_t kcap_row = Dk * K.bits / 8, vrow = Dv * V.bits / 8;
  const uint8_t* kcodes = static_cast<const uint8_t*>(K.data) + (it.b * K.H + it.g) * K.capacity * kcap_row;
  const uint8_t* vcodes = static_cast<const uint8_t*>(V.data) + (it.b * V.H + it.g) * V.capacity * vrow;
  const int64_t Rg = Rp / 16;

  for (int64_t j0 = it.klo / gk * gk; it.khi > it.klo && j0 < it.khi; j0 += gk) {
    const bool residual = j0 >= c.nq;
    const int64_t nk = imin(j0 + gk, K.length) - j0, nkp = rup(nk, 32), blk = j0 / gk;
    // ---- keys: codes into B tiles; queries folded into A tiles (hi, lo), Σ q·b, outlier weights ----
    if (!residual)
      for (int64_t j = 0; j < nk; ++j) unpack_codes(kcodes + (j0 + j) * kcap_row, Dk, K.bits, s.codes + j * kMaxDim);
    key_tiles(c, s, it, j0, nk, residual);
    const int64_t sbase = ((it.b * K.H + it.g) * K.blocks + blk) * Dk;  // the block's scale / bias rows
    if (!residual && c.nout > 0) attn::outlier_weights(a, *c.p, it, blk, s.ow, s.owo);
    for (int64_t r = 0; r < Rp; ++r) {
      float* qf = s.qf;
      if (r < R) {
        const float* q = query_row(c, it, r);
        __m512 bsum = _mm512_setzero_ps();
        for (int64_t d = 0; d < Dk; d += 16) {
          const __m512 qv = _mm512_loadu_ps(q + d);
          if (residual) {
            _mm512_store_ps(qf + d, qv);
          } else {
            _mm512_store_ps(qf + d, _mm512_mul_ps(qv, avx512::load16(K.scales, K.scale_dtype, sbase + d, 0xFFFF)));
            bsum = _mm512_fmadd_ps(qv, avx512::load16(K.biases, K.scale_dtype, sbase + d, 0xFFFF), bsum);
          }
        }
        s.qb[r] = residual ? 0.0f : _mm512_reduce_add_ps(bsum);
      } else {
        std::memset(qf, 0, static_cast<size_t>(Dk) * 4);
        s.qb[r] = 0.0f;
      }
      const int64_t G = r / 16, rr = r % 16;
      for (int64_t st = 0; st < Dk / 32; ++st) {
        const __m512 x0 = _mm512_load_ps(qf + st * 32), x1 = _mm512_load_ps(qf + st * 32 + 16);
        const __m512bh h = _mm512_cvtne2ps_pbh(x1, x0);
        const __m512i hv = reinterpret_cast<__m512i>(h);
        // the high part widened back (bf16 -> f32 is a shift), the remainders rounded again
        const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hv)), 16));
        const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hv, 1)), 16));
        const __m512bh lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, h1), _mm512_sub_ps(x0, h0));
        const int64_t off = ((G * (Dk / 32) + st) * 16 + rr) * 32;
        _mm512_store_si512(s.qhi + off, hv);
        _mm512_store_si512(s.qlo + off, reinterpret_cast<__m512i>(lo));
      }
    }
    // ---- QKᵀ: 16 query rows × up to 4 key tiles at a time ----
    const int64_t ktiles = nkp / 16;
    for (int64_t G = 0; G < Rg; ++G)
      for (int64_t t0 = 0; t0 < ktiles; t0 += 4) {
        switch (imin(4, ktiles - t0)) {
          case 4: qk_tiles<4>(c, s, G, t0); break;
          case 3: qk_tiles<3>(c, s, G, t0); break;
          case 2: qk_tiles<2>(c, s, G, t0); break;
          default: qk_tiles<1>(c, s, G, t0); break;
        }
      }
    // ---- scores, mask, online softmax; p into S ----
    const uint8_t* ocodes = nullptr;
    if (!residual && c.nout > 0)
      ocodes = static_cast<const uint8_t*>(K.outlier_codes) + ((it.b * K.H + it.g) * K.blocks + blk) * c.nout * gk / 2;
    if (ocodes)  // the refinement codes of the block's positions as floats, [outlier][position] (0 past nk)
      for (int64_t o = 0; o < c.nout; ++o)
        for (int64_t p = 0; p < nkp; ++p) {
          const uint8_t byte = p < nk ? ocodes[o * gk / 2 + p / 2] : 0;
          s.oc[o * kMaxBlock + p] = static_cast<float>((p & 1) ? byte >> 4 : byte & 15);
        }
    bool any = false;
    for (int64_t r = 0; r < R; ++r) {
      float* srow = s.S + r * kMaxBlock;
      const int64_t lo = imax(s.lo[r], j0) - j0, hi = imin(s.hi[r], j0 + nk) - j0;  // visible keys of the block
      if (hi <= lo) {
        std::memset(srow, 0, static_cast<size_t>(nkp) * 4);
        continue;
      }
      const __m512 sc = _mm512_set1_ps(a.scale), qb = _mm512_set1_ps(a.scale * s.qb[r]);
      __m512 mx = _mm512_set1_ps(neg_inf);
      for (int64_t v = 0; v < nkp; v += 16) {
        __m512 x = _mm512_fmadd_ps(_mm512_load_ps(srow + v), sc, qb);
        if (ocodes) {  // offset + Σ_o ow[o]·r_o (the refinement of the outlier channels, attn::outlier_weights)
          const float* ow = s.ow + r * c.nout;
          __m512 add = _mm512_set1_ps(s.owo[r]);
          for (int64_t o = 0; o < c.nout; ++o)
            add = _mm512_fmadd_ps(_mm512_set1_ps(ow[o]), _mm512_load_ps(s.oc + o * kMaxBlock + v), add);
          x = _mm512_add_ps(x, add);
        }
        const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(v)),
                                             _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
        const __mmask16 vis = _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(static_cast<int>(lo))) &
                              _mm512_cmplt_epi32_mask(idx, _mm512_set1_epi32(static_cast<int>(hi)));
        x = _mm512_mask_mov_ps(_mm512_set1_ps(neg_inf), vis, x);
        _mm512_store_ps(srow + v, x);
        mx = _mm512_max_ps(mx, x);
      }
      const float mb = _mm512_reduce_max_ps(mx);
      const float m_new = mb > s.m[r] ? mb : s.m[r];
      any = true;
      if (m_new != s.m[r]) {
        const float alpha = _mm512_cvtss_f32(avx512::exp16(_mm512_set1_ps(s.m[r] - m_new)));  // 0 when m was −inf
        const __m512 av = _mm512_set1_ps(alpha);
        for (int64_t d = 0; d < Dv; d += 16)
          _mm512_store_ps(s.O + r * Dv + d, _mm512_mul_ps(av, _mm512_load_ps(s.O + r * Dv + d)));
        for (int64_t g = 0; g < Gv; ++g) s.bacc[r * Gv + g] *= alpha;
        s.l[r] *= alpha;
        s.m[r] = m_new;
      }
      const __m512 mv = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int64_t v = 0; v < nkp; v += 16) {
        const __m512 pv = avx512::exp16(_mm512_sub_ps(_mm512_load_ps(srow + v), mv));  // exp(−inf) = 0
        _mm512_store_ps(srow + v, pv);
        sum = _mm512_add_ps(sum, pv);
      }
      s.l[r] += _mm512_reduce_add_ps(sum);
    }
    if (!any) continue;
    // ---- values: codes into B tiles [nkp/32 steps][Dv/16 tiles] of [16 key pairs][16 dims][2]; scales ----
    for (int64_t j = 0; j < nkp; ++j) {
      if (j < nk) {
        unpack_codes(vcodes + (j0 + j) * vrow, Dv, V.bits, s.codes + j * kMaxDim);
        const int64_t sr = ((it.b * V.H + it.g) * V.capacity + j0 + j) * Gv;
        for (int64_t g = 0; g < Gv; ++g) {
          s.vs[g * kMaxBlock + j] = load_float(V.scales, V.scale_dtype, sr + g);
          s.vbias[g * kMaxBlock + j] = V.symmetric ? quant::symmetric_bias(s.vs[g * kMaxBlock + j], V.bits)
                                                   : load_float(V.biases, V.scale_dtype, sr + g);
        }
      } else {
        std::memset(s.codes + j * kMaxDim, 0, static_cast<size_t>(Dv));
        for (int64_t g = 0; g < Gv; ++g) s.vs[g * kMaxBlock + j] = s.vbias[g * kMaxBlock + j] = 0.0f;
      }
    }
    alignas(64) uint16_t inter_idx[32];
    for (int k = 0; k < 16; ++k) {
      inter_idx[2 * k] = static_cast<uint16_t>(k);
      inter_idx[2 * k + 1] = static_cast<uint16_t>(16 + k);
    }
    const __m512i inter = _mm512_load_si512(inter_idx);
    for (int64_t ks = 0; ks < nkp / 32; ++ks)
      for (int64_t dt = 0; dt < Dv / 16; ++dt) {
        uint16_t* dst = s.vb + (ks * (Dv / 16) + dt) * (kTile / 2);
        for (int kk = 0; kk < 16; ++kk) {
          const uint8_t* e = s.codes + (ks * 32 + 2 * kk) * kMaxDim + dt * 16;
          const __m512 fe = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e))));
          const __m512 fo =
              _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(e + kMaxDim))));
          // [e0..e15, o0..o15] -> e0 o0 e1 o1 ...
          const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(fo, fe));
          _mm512_store_si512(dst + kk * 32, _mm512_permutexvar_epi16(inter, both));
        }
      }
    // ---- weights w = p·s per value group into A tiles; the bias part Σ p·b ----
    for (int64_t r = 0; r < Rp; ++r) {
      const float* prow = s.S + r * kMaxBlock;
      const int64_t G = r / 16, rr = r % 16;
      for (int64_t g = 0; g < Gv; ++g) {
        __m512 bsum = _mm512_setzero_ps();
        for (int64_t ks = 0; ks < nkp / 32; ++ks) {
          const float* sv = s.vs + g * kMaxBlock + ks * 32;
          const float* bv = s.vbias + g * kMaxBlock + ks * 32;
          __m512 p0 = _mm512_setzero_ps(), p1 = _mm512_setzero_ps();
          if (r < R) {
            p0 = _mm512_load_ps(prow + ks * 32);
            p1 = _mm512_load_ps(prow + ks * 32 + 16);
          }
          const __m512 w0 = _mm512_mul_ps(p0, _mm512_load_ps(sv)), w1 = _mm512_mul_ps(p1, _mm512_load_ps(sv + 16));
          const __m512i wh = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w1, w0));
          const __m512 h0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(wh)), 16));
          const __m512 h1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(wh, 1)), 16));
          const __m512bh wl = _mm512_cvtne2ps_pbh(_mm512_sub_ps(w1, h1), _mm512_sub_ps(w0, h0));
          uint16_t* wt = s.w + (((g * Rg + G) * (kMaxBlock / 32) + ks) * 2) * (kTile / 2) + rr * 32;
          _mm512_store_si512(wt, wh);
          _mm512_store_si512(wt + kTile / 2, reinterpret_cast<__m512i>(wl));
          bsum = _mm512_fmadd_ps(p1, _mm512_load_ps(bv + 16), _mm512_fmadd_ps(p0, _mm512_load_ps(bv), bsum));
        }
        s.bacc[r * Gv + g] += _mm512_reduce_add_ps(bsum);
      }
    }
    // ---- O += W·codes: 16 rows × up to 4 dim tiles (of one value group) at a time ----
    const int64_t per = imin(4, c.gv / 16);
    for (int64_t G = 0; G < Rg; ++G)
      for (int64_t dt = 0; dt < Dv / 16; dt += per) {
        const int64_t g = dt * 16 / c.gv;
        switch (per) {
          case 4: pv_tiles<4>(c, s, G, dt, g, nkp / 32); break;
          default: pv_tiles<2>(c, s, G, dt, g, nkp / 32); break;
        }
      }
  }

  float* out = c.partials + index * c.p->partial_floats;
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * (2 + Dv);
    o[0] = s.m[r];
    o[1] = s.l[r];
    for (int64_t d = 0; d < Dv; ++d) o[2 + d] = s.O[r * Dv + d] + s.bacc[r * Gv + d / c.gv];
  }
}

struct Job {
  Ctx c;
  size_t scratch_bytes;
};

void item_entry(void* ctx, int64_t index) {
  const Job& job = *static_cast<const Job*>(ctx);
  Scratch s;
  carve(job.c, &s, static_cast<uint8_t*>(attn::thread_scratch(job.scratch_bytes)));
  load_uniform_config();  // the tile configuration is thread state; released after the item
  __asm__ volatile("" ::: "memory");
  run_item(job.c, s, index);
  __asm__ volatile("" ::: "memory");
  release();
}

}  // namespace

bool attention_bf16_takes(const AttentionArgs& a) {
  const KVTensorView& K = a.keys;
  const KVTensorView& V = a.values;
  return a.L >= kFromL && attn::fast_path_supported(a) && K.layout == 1 && V.layout == 0 &&
         (a.mask_kind == MaskKind::kNone || a.mask_kind == MaskKind::kCausal) && a.softcap == 0.0f &&
         K.dim % 32 == 0 && V.dim % 32 == 0 && K.dim <= kMaxDim && V.dim <= kMaxDim && K.bits <= 8 &&
         V.bits <= 8 && K.group_size <= kMaxBlock && (V.group_size == 32 || V.group_size % 64 == 0) &&
         a.Hq / K.H <= kMaxRows;
}

void attention_bf16(const AttentionArgs& a) {
  if (!attention_bf16_takes(a)) return avx512::attention(a);
  Job job{};
  Ctx& c = job.c;
  c.a = &a;
  // Items of up to kMaxRows query rows: every unpacked key and value block serves all of them.
  const attn::Plan plan = attn::make_plan(a, 0, kMaxRows);
  c.p = &plan;
  c.Dk = a.keys.dim;
  c.Dv = a.values.dim;
  c.gk = a.keys.group_size;
  c.gv = a.values.group_size;
  c.Gv = c.Dv / c.gv;
  c.nq = a.keys.length / c.gk * c.gk;
  c.nout = a.keys.outliers;
  c.Rp = rup(plan.max_rows, 16);
  Scratch probe;
  job.scratch_bytes = carve(c, &probe, nullptr);
  c.partials = attn::partial_buffer(static_cast<size_t>(plan.items * plan.partial_floats));
  attn::run_items(plan.items, &item_entry, &job);
  attn::merge_partials(a, plan, c.partials);
}

}  // namespace cider::kernels::x86::amx
