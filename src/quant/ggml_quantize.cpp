// cider's encoder into the GGUF block formats (quant/ggml_quantize.h). Byte layouts: the decoders in ggml_blocks.cpp
// (each writer below is the inverse of the decoder of its type).
#include "quant/ggml_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"

namespace cider::quant {

namespace {

constexpr const char* kOp = "ggml_quantize_row";

inline float round_f16(float v) { return f16_to_f32(f32_to_f16(v)); }

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

inline void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

inline int clamp_code(float v, int lo, int hi) {
  const float r = std::rint(v);
  return r < static_cast<float>(lo) ? lo : (r > static_cast<float>(hi) ? hi : static_cast<int>(r));
}

// How a fitted scale is stored: f16 (the 32-blocks), or not rounded here (a K-quant sub-block: coded later).
enum class ScaleRounding { kF16, kNone };

inline float store_rounded(float v, ScaleRounding r) { return r == ScaleRounding::kF16 ? round_f16(v) : v; }

// Symmetric fit y = d·q, q ∈ [lo, hi], of x[0 .. n) minimising Σ w_i (x_i − y_i)² (w: the importance weights, all
// positive; nullptr = all 1): writes the codes, returns d (0 for an all-zero group).
float fit_symmetric(const float* x, const float* w, int n, int lo, int hi, ScaleRounding rounding, int* q) {
  float ext = 0.0f;  // the value of largest magnitude, signed
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(ext)) ext = x[i];
  if (ext == 0.0f) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return 0.0f;
  }
  int cand[256];
  double best_err = std::numeric_limits<double>::infinity();
  float best_d = 0.0f;
  for (int end = 0; end < 2; ++end) {  // the extreme value at code lo (end 0) or hi (end 1)
    const float code_end = static_cast<float>(end == 0 ? lo : hi);
    for (int k = 0; k <= 20; ++k) {  // stretch: the extreme at code_end − 1.5 … + 0.5 codes, the plain rule first
      const int step = k <= 10 ? (k % 2 ? -(k + 1) / 2 : k / 2) : -(k - 5);  // 0, -1, 1, -2, 2, …, 5, -6 … -15
      const float target = code_end + (code_end < 0 ? -0.1f : 0.1f) * static_cast<float>(step);
      if (target == 0.0f || (target < 0) != (code_end < 0)) continue;
      float d = ext / target;
      double sxq = 0.0, sqq = 0.0;
      for (int i = 0; i < n; ++i) {
        cand[i] = clamp_code(x[i] / d, lo, hi);
        const double wi = w ? w[i] : 1.0;
        sxq += wi * x[i] * cand[i];
        sqq += wi * cand[i] * cand[i];
      }
      if (sqq > 0.0) d = static_cast<float>(sxq / sqq);  // least squares for these codes
      d = store_rounded(d, rounding);
      if (d == 0.0f || !std::isfinite(d)) continue;
      double err = 0.0;
      for (int i = 0; i < n; ++i) {
        cand[i] = clamp_code(x[i] / d, lo, hi);
        const double e = static_cast<double>(x[i]) - static_cast<double>(d * static_cast<float>(cand[i]));
        err += (w ? w[i] : 1.0) * e * e;
      }
      if (err < best_err) {
        best_err = err;
        best_d = d;
        std::memcpy(q, cand, sizeof(int) * static_cast<size_t>(n));
      }
    }
  }
  if (best_d == 0.0f)
    for (int i = 0; i < n; ++i) q[i] = 0;
  return best_d;
}

// Affine fit y = d·q + m, q ∈ [0, qmax], of x[0 .. n) minimising Σ w_i (x_i − y_i)² (w as fit_symmetric's); m ≤ 0
// when min_le_zero. Writes the codes, d and m (both rounded to f16 when `rounding` says so).
void fit_affine(const float* x, const float* w, int n, int qmax, bool min_le_zero, ScaleRounding rounding, int* q,
                float* d_out, float* m_out) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  if (min_le_zero) mn = std::min(mn, 0.0f);
  if (mx == mn) {  // constant (or, with m ≤ 0, all zero): d = 0, m = the value
    for (int i = 0; i < n; ++i) q[i] = 0;
    *d_out = 0.0f;
    *m_out = store_rounded(mn, rounding);
    return;
  }
  int cand[256];
  double best_err = std::numeric_limits<double>::infinity();
  *d_out = 0.0f;
  *m_out = store_rounded(mn, rounding);
  for (int i = 0; i < n; ++i) q[i] = 0;
  const float range = mx - mn;
  for (int start = -2; start <= 2; ++start) {
    float d = range / (static_cast<float>(qmax) + 0.5f * static_cast<float>(start));
    float m = mn;
    for (int iter = 0; iter < 4; ++iter) {
      const float ds = store_rounded(d, rounding), ms = store_rounded(m, rounding);
      if (!(ds > 0.0f) || !std::isfinite(ds) || !std::isfinite(ms)) break;
      double err = 0.0, sw = 0.0, sq = 0.0, sqq = 0.0, sx = 0.0, sxq = 0.0;
      for (int i = 0; i < n; ++i) {
        cand[i] = clamp_code((x[i] - ms) / ds, 0, qmax);
        const double c = cand[i], wi = w ? w[i] : 1.0;
        const double e = static_cast<double>(x[i]) - static_cast<double>(ds * static_cast<float>(cand[i]) + ms);
        err += wi * e * e;
        sw += wi;
        sq += wi * c;
        sqq += wi * c * c;
        sx += wi * x[i];
        sxq += wi * x[i] * c;
      }
      if (err < best_err) {
        best_err = err;
        *d_out = ds;
        *m_out = ms;
        std::memcpy(q, cand, sizeof(int) * static_cast<size_t>(n));
      }
      // Weighted least squares (d, m) for these codes; with m ≤ 0 required and violated, m = 0 and d alone.
      const double det = sw * sqq - sq * sq;
      if (det <= 0.0) break;
      double dn = (sw * sxq - sx * sq) / det;
      double mnew = (sx - dn * sq) / sw;
      if (min_le_zero && mnew > 0.0) {
        mnew = 0.0;
        dn = sqq > 0.0 ? sxq / sqq : 0.0;
      }
      d = static_cast<float>(dn);
      m = static_cast<float>(mnew);
    }
  }
}

// Element i < 16 in the low nibble of byte i, element i + 16 in its high nibble (ggml_blocks.cpp nibble32).
void put_nibbles32(const int* q, uint8_t* qs) {
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>((q[i] & 0x0F) | ((q[i + 16] & 0x0F) << 4));
}

// Code writers: a block's codes q (Q8_0's signed, the others' as stored: 0 … 2^bits − 1) into block b, its scales
// untouched — the inverse of each decoder's code fields.
void codes_q8_0(const int* q, uint8_t* b) {
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q[i]));
}

void codes_q4_0(const int* q, uint8_t* b) { put_nibbles32(q, b + 2); }

// 5-bit codes: their fifth bits as a u32 at p, their low nibbles after it.
void put_codes5(const int* q, uint8_t* p) {
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>((q[i] >> 4) & 1) << i;
  put_u32(p, qh);
  put_nibbles32(q, p + 4);
}

void codes_q5_0(const int* q, uint8_t* b) { put_codes5(q, b + 2); }

void codes_q4_1(const int* q, uint8_t* b) { put_nibbles32(q, b + 4); }

void codes_q5_1(const int* q, uint8_t* b) { put_codes5(q, b + 4); }

void codes_q4_k(const int* q, uint8_t* b) {
  uint8_t* qs = b + 16;  // chunk c of 64: bytes [32c, 32c + 32), low nibbles the first 32 elements
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<uint8_t>((q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4));
}

void codes_q6_k(const int* q, uint8_t* b) {
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  std::memset(b, 0, 192);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = e % 128;
    ql[64 * h + r % 64] = static_cast<uint8_t>(ql[64 * h + r % 64] | ((q[e] & 0x0F) << (4 * (r / 64))));
    qh[32 * h + r % 32] = static_cast<uint8_t>(qh[32 * h + r % 32] | (((q[e] >> 4) & 3) << (2 * (r / 32))));
  }
}

void enc_q8_0(const float* x, const float*, uint8_t* b) {  // the plain rule: its error is below bf16's
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = round_f16(amax / 127.0f);
  put_f16(b, d);
  int q[32];
  for (int i = 0; i < 32; ++i) q[i] = d == 0.0f ? 0 : clamp_code(x[i] / d, -128, 127);
  codes_q8_0(q, b);
}

void enc_q4_0(const float* x, const float* w, uint8_t* b) {
  int q[32];
  const float d = fit_symmetric(x, w, 32, -8, 7, ScaleRounding::kF16, q);
  put_f16(b, d);
  for (int& v : q) v += 8;
  codes_q4_0(q, b);
}

void enc_q5_0(const float* x, const float* w, uint8_t* b) {
  int q[32];
  const float d = fit_symmetric(x, w, 32, -16, 15, ScaleRounding::kF16, q);
  put_f16(b, d);
  for (int& v : q) v += 16;
  codes_q5_0(q, b);
}

void enc_q4_1(const float* x, const float* w, uint8_t* b) {
  int q[32];
  float d, m;
  fit_affine(x, w, 32, 15, false, ScaleRounding::kF16, q, &d, &m);
  put_f16(b, d);
  put_f16(b + 2, m);
  codes_q4_1(q, b);
}

void enc_q5_1(const float* x, const float* w, uint8_t* b) {
  int q[32];
  float d, m;
  fit_affine(x, w, 32, 31, false, ScaleRounding::kF16, q, &d, &m);
  put_f16(b, d);
  put_f16(b + 2, m);
  codes_q5_1(q, b);
}

// Q4_K: 8 sub-blocks of 32, y = (d·sc_j)·q − (dmin·mn_j), sc_j, mn_j ∈ [0, 63], q ∈ [0, 15].
void enc_q4_k(const float* x, const float* w, uint8_t* b) {
  float s[8], mneg[8];
  int q[256];
  for (int j = 0; j < 8; ++j) {
    float d, m;
    fit_affine(x + 32 * j, w ? w + 32 * j : nullptr, 32, 15, true, ScaleRounding::kNone, q + 32 * j, &d, &m);
    s[j] = std::max(d, 0.0f);
    mneg[j] = std::max(-m, 0.0f);
  }
  const float smax = *std::max_element(s, s + 8), mmax = *std::max_element(mneg, mneg + 8);
  const float d = round_f16(smax / 63.0f), dmin = round_f16(mmax / 63.0f);
  int sc[8], mc[8];
  for (int j = 0; j < 8; ++j) {
    // The 6-bit codes of the sub-block's scale and min: the nearest ones; with importance weights, the pair among
    // them and their neighbours whose re-rounded codes give the least weighted error. (Without, the nearest: a block
    // already on the grid must come back as it was, and the search measured no better on Gemma 3 270M.)
    const int sc0 = d > 0.0f ? clamp_code(s[j] / d, 0, 63) : 0;
    const int mc0 = dmin > 0.0f ? clamp_code(mneg[j] / dmin, 0, 63) : 0;
    const int reach = w != nullptr ? 1 : 0;
    double best = std::numeric_limits<double>::infinity();
    sc[j] = sc0;
    mc[j] = mc0;
    for (int a = std::max(sc0 - reach, 0); a <= std::min(sc0 + reach, 63); ++a)
      for (int c = std::max(mc0 - reach, 0); c <= std::min(mc0 + reach, 63); ++c) {
        const float dl = d * static_cast<float>(a), ml = dmin * static_cast<float>(c);  // as the decoder
        double err = 0.0;
        for (int e = 32 * j; e < 32 * j + 32; ++e) {
          const int qe = dl > 0.0f ? clamp_code((x[e] + ml) / dl, 0, 15) : 0;
          const double r = static_cast<double>(x[e]) - static_cast<double>(dl * static_cast<float>(qe) - ml);
          err += (w ? w[e] : 1.0) * r * r;
        }
        if (err < best) {
          best = err;
          sc[j] = a;
          mc[j] = c;
        }
      }
    const float dl = d * static_cast<float>(sc[j]), ml = dmin * static_cast<float>(mc[j]);
    for (int e = 32 * j; e < 32 * j + 32; ++e) q[e] = dl > 0.0f ? clamp_code((x[e] + ml) / dl, 0, 15) : 0;
  }
  put_f16(b, d);
  put_f16(b + 2, dmin);
  pack_scale_min_k4(sc, mc, b + 4);
  codes_q4_k(q, b);
}

// Q6_K: 16 sub-blocks of 16, y = (d·sc_j)·(q − 32), sc_j int8, q − 32 ∈ [−32, 31].
void enc_q6_k(const float* x, const float* w, uint8_t* b) {
  float s[16];
  int q[256];
  float smax = 0.0f;
  for (int j = 0; j < 16; ++j) {
    s[j] = fit_symmetric(x + 16 * j, w ? w + 16 * j : nullptr, 16, -32, 31, ScaleRounding::kNone, q + 16 * j);
    smax = std::max(smax, std::fabs(s[j]));
  }
  const float d = round_f16(smax / 127.0f);
  int sc[16];
  for (int j = 0; j < 16; ++j) {
    // The int8 code of the sub-block's scale: the nearest; with importance weights, the one among it and its
    // neighbours whose re-rounded codes give the least weighted error (as Q4_K's).
    const int sc0 = d > 0.0f ? clamp_code(s[j] / d, -128, 127) : 0;
    const int reach = w != nullptr ? 1 : 0;
    double best = std::numeric_limits<double>::infinity();
    sc[j] = sc0;
    for (int a = std::max(sc0 - reach, -128); a <= std::min(sc0 + reach, 127); ++a) {
      const float dl = d * static_cast<float>(a);
      double err = 0.0;
      for (int e = 16 * j; e < 16 * j + 16; ++e) {
        const int qe = dl != 0.0f ? clamp_code(x[e] / dl, -32, 31) : 0;
        const double r = static_cast<double>(x[e]) - static_cast<double>(dl * static_cast<float>(qe));
        err += (w ? w[e] : 1.0) * r * r;
      }
      if (err < best) {
        best = err;
        sc[j] = a;
      }
    }
    const float dl = d * static_cast<float>(sc[j]);
    for (int e = 16 * j; e < 16 * j + 16; ++e) q[e] = dl != 0.0f ? clamp_code(x[e] / dl, -32, 31) + 32 : 32;
  }
  codes_q6_k(q, b);
  for (int j = 0; j < 16; ++j) b[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(sc[j]));
  put_f16(b + 208, d);
}

using Encoder = void (*)(const float* x, const float* w, uint8_t* out);
using CodeWriter = void (*)(const int* q, uint8_t* out);

// One writable type: its encoder, its code writer, the range [c_lo, c_hi] of its integer-form codes and their offset
// from the stored ones (c = q − bias, quant/ggml_blocks.h).
struct Codec {
  Encoder enc;
  CodeWriter codes;
  int c_lo, c_hi, bias;
};

const Codec* codec(GgmlType t) {
  static const Codec q8_0{enc_q8_0, codes_q8_0, -128, 127, 0}, q4_0{enc_q4_0, codes_q4_0, -8, 7, 8},
      q5_0{enc_q5_0, codes_q5_0, -16, 15, 16}, q4_1{enc_q4_1, codes_q4_1, 0, 15, 0},
      q5_1{enc_q5_1, codes_q5_1, 0, 31, 0}, q4_k{enc_q4_k, codes_q4_k, 0, 15, 0},
      q6_k{enc_q6_k, codes_q6_k, -32, 31, 32};
  switch (t) {
    case GgmlType::kQ8_0: return &q8_0;
    case GgmlType::kQ4_0: return &q4_0;
    case GgmlType::kQ4_1: return &q4_1;
    case GgmlType::kQ5_0: return &q5_0;
    case GgmlType::kQ5_1: return &q5_1;
    case GgmlType::kQ4_K: return &q4_k;
    case GgmlType::kQ6_K: return &q6_k;
    default: return nullptr;
  }
}

// The checks both row encoders share; returns the type's format and codec.
std::pair<const GgmlBlockFormat*, const Codec*> checked_row(const char* op, GgmlType t, const float* x, int64_t n,
                                                            const float* importance) {
  const GgmlBlockFormat* f = ggml_block_format(static_cast<uint32_t>(t));
  const Codec* c = codec(t);
  check(f != nullptr && c != nullptr, ErrorCode::kUnsupported, op, "no encoder for ggml type id ",
        static_cast<uint32_t>(t));
  check(n % f->block_size == 0, ErrorCode::kShapeMismatch, op, f->name, " needs a row length that is a multiple of ",
        f->block_size, "; got ", n);
  // The f16 scale must hold max|x| / (largest code): |x| up to 65504 · 7 for Q4_0, say; a tighter common bound.
  constexpr float kLimit = 65504.0f * 7.0f;
  for (int64_t i = 0; i < n; ++i)
    check(std::isfinite(x[i]) && std::fabs(x[i]) < kLimit, ErrorCode::kInvalidArgument, op, f->name, ": value ", i,
          " is ", x[i], "; every value must be finite and below ", kLimit, " in magnitude");
  if (importance != nullptr)
    for (int64_t i = 0; i < n; ++i)
      check(std::isfinite(importance[i]) && importance[i] >= 0.0f, ErrorCode::kInvalidArgument, op, f->name,
            ": importance ", i, " is ", importance[i], "; every importance must be finite and >= 0");
  return {f, c};
}

// The importances of one block, or nullptr when there are none or all are 0 (inputs never seen: the plain fit).
const float* block_importance(const float* importance, int64_t first, int size) {
  if (importance == nullptr) return nullptr;
  double sw = 0.0;
  for (int i = 0; i < size; ++i) sw += importance[first + i];
  return sw > 0.0 ? importance + first : nullptr;
}

}  // namespace

bool ggml_can_quantize(GgmlType t) { return codec(t) != nullptr; }

void ggml_quantize_row(GgmlType t, const float* x, int64_t n, uint8_t* out, const float* importance) {
  const auto [f, c] = checked_row(kOp, t, x, n, importance);
  for (int64_t blk = 0; blk < n / f->block_size; ++blk)
    c->enc(x + blk * f->block_size, block_importance(importance, blk * f->block_size, f->block_size),
           out + blk * f->block_bytes);
}

void ggml_quantize_row_gptq(GgmlType t, float* x, int64_t n, const float* U, uint8_t* out, const float* importance) {
  constexpr const char* op = "ggml_quantize_row_gptq";
  const auto [f, c] = checked_row(op, t, x, n, importance);
  const int B = f->block_size;
  int q[256];
  float a_e[256], b_e[256];
  for (int64_t blk = 0; blk < n / B; ++blk) {
    const int64_t s = blk * B;
    uint8_t* ob = out + blk * f->block_bytes;
    // The block's scales: fitted to its values as the earlier columns' errors have left them.
    c->enc(x + s, block_importance(importance, s, B), ob);
    for (int p = 0; p < B / 32; ++p) {
      int8_t code[32];
      float a[2], b[2];
      ggml_piece(t, ob, p, code, a, b);
      for (int i = 0; i < 32; ++i) {
        a_e[32 * p + i] = a[i / 16];
        b_e[32 * p + i] = b[i / 16];
      }
    }
    // Column by column: the code nearest the current value on the block's grid, and its error, divided by the
    // factor's diagonal, taken out of the columns not yet coded (x[j+1 …) −= e · U[j, j+1 …)).
    for (int i = 0; i < B; ++i) {
      const int64_t j = s + i;
      const int code = a_e[i] != 0.0f ? clamp_code((x[j] - b_e[i]) / a_e[i], c->c_lo, c->c_hi)
                                      : std::clamp(0, c->c_lo, c->c_hi);
      q[i] = code + c->bias;
      const float y = a_e[i] * static_cast<float>(code) + b_e[i];
      const float* u = U + j * n;
      const float e = (x[j] - y) / u[j];
      for (int64_t k = j + 1; k < n; ++k) x[k] -= e * u[k];
    }
    c->codes(q, ob);
  }
}

}  // namespace cider::quant
