// The GGUF block formats (quant/ggml_blocks.h): dequantization, one block at a time, and the integer form.
//
// A tensor is numel / block_size blocks stored back to back (rows of ne[0] elements, ne[0] a multiple of the block
// size, so blocks never straddle rows). All scales are IEEE f16 (little-endian) converted exactly to float32; every
// formula below is evaluated in float32 in the order written, one rounding per operation (the build uses
// -ffp-contract=off, so nothing is fused): this is the order gguf-py's numpy reference uses, and our results
// match it bit for bit.
#include "quant/ggml_blocks.h"

#include <cstring>

#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace cider::quant {

namespace {

inline float f16_at(const uint8_t* p) {
  return f16_to_f32(static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8)));
}

// --- 32-element blocks -------------------------------------------------------------------------------------------

// Q8_0, 34 bytes: d f16 | 32 x int8 q.   y = q * d
void deq_q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
}

// Element i < 16 sits in the low nibble of byte i of the 16 code bytes, element i + 16 in its high nibble.
inline int nibble32(const uint8_t* qs, int i) { return i < 16 ? (qs[i] & 0x0F) : (qs[i - 16] >> 4); }

// Q4_0, 18 bytes: d f16 | 16 code bytes.   y = d * (q - 8)
void deq_q4_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(nibble32(b + 2, i) - 8);
}

// Q4_1, 20 bytes: d f16 | m f16 | 16 code bytes.   y = d * q + m
void deq_q4_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(nibble32(b + 4, i)) + m;
}

inline uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// Q5_0, 22 bytes: d f16 | qh u32 (bit i = bit 4 of element i) | 16 code bytes (low 4 bits, as Q4_0).
// y = d * (q - 16)
void deq_q5_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const uint32_t qh = u32_at(b + 2);
  for (int i = 0; i < 32; ++i) {
    const int q = nibble32(b + 6, i) | static_cast<int>(((qh >> i) & 1u) << 4);
    y[i] = d * static_cast<float>(q - 16);
  }
}

// Q5_1, 24 bytes: d f16 | m f16 | qh u32 | 16 code bytes.   y = d * q + m
void deq_q5_1(const uint8_t* b, float* y) {
  const float d = f16_at(b), m = f16_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  for (int i = 0; i < 32; ++i) {
    const int q = nibble32(b + 8, i) | static_cast<int>(((qh >> i) & 1u) << 4);
    y[i] = d * static_cast<float>(q) + m;
  }
}

// --- 256-element super-blocks (K-quants) -------------------------------------------------------------------------

// The 2-bit code of element e in Q2_K / Q3_K: the 256 elements form two halves of 128; in half h, element
// 32*s + l (s = 0..3, l = 0..31) is bits [2s, 2s+2) of code byte 32*h + l.
inline int code2(const uint8_t* qs, int e) {
  const int h = e / 128, r = e % 128;
  return (qs[32 * h + r % 32] >> (2 * (r / 32))) & 3;
}

// Q2_K, 84 bytes: scales[16] (byte j: low nibble = scale, high nibble = min of sub-block j of 16 elements)
// | qs[64] | d f16 | dmin f16.   y = (d * scale_j) * q - (dmin * min_j)
void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(sc[j] & 0x0F);
    const float ml = dmin * static_cast<float>(sc[j] >> 4);
    for (int i = 16 * j; i < 16 * j + 16; ++i) y[i] = dl * static_cast<float>(code2(qs, i)) - ml;
  }
}

// Q3_K, 110 bytes: hmask[32] | qs[64] | scales[12] | d f16.
// 16 six-bit scales (one per 16 elements), stored as: low 4 bits of scale j in byte j (j < 8, low nibble) or byte
// j - 8 (j >= 8, high nibble); high 2 bits in byte 8 + j % 4, bits [2*(j/4), 2*(j/4)+2). Signed: s = raw - 32.
// Element e: 2-bit low part as Q2_K; bit e/32 of hmask[e % 32] set means "no offset", clear means subtract 4.
// y = (d * s_j) * q
void deq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = f16_at(b + 108);
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (sc[j] & 0x0F) : (sc[j - 8] >> 4);
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    const float dl = d * static_cast<float>((lo | (hi << 4)) - 32);
    for (int e = 16 * j; e < 16 * j + 16; ++e) {
      const int high = (hm[e % 32] >> (e / 32)) & 1;
      const int q = code2(qs, e) - (high ? 0 : 4);
      y[e] = dl * static_cast<float>(q);
    }
  }
}

// The 4-bit code of element e in Q4_K / Q5_K: chunk c = e / 64 uses code bytes [32c, 32c + 32); its first 32
// elements are the low nibbles, the next 32 the high nibbles.
inline int code4(const uint8_t* qs, int e) {
  const int c = e / 64, r = e % 64;
  return (qs[32 * c + r % 32] >> (4 * (r / 32))) & 0x0F;
}

// Q4_K, 144 bytes: d f16 | dmin f16 | scales[12] | qs[128].   y = (d * sc_j) * q - (dmin * m_j), j = e / 32
void deq_q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    scale_min_k4(s, j, &sc, &mn);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
    for (int e = 32 * j; e < 32 * j + 32; ++e) y[e] = dl * static_cast<float>(code4(qs, e)) - ml;
  }
}

// Q5_K, 176 bytes: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]. Bit 4 of element e is bit e/32 of qh[e % 32].
// y = (d * sc_j) * q - (dmin * m_j)
void deq_q5_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    scale_min_k4(s, j, &sc, &mn);
    const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
    for (int e = 32 * j; e < 32 * j + 32; ++e) {
      const int q = code4(qs, e) | (((qh[e % 32] >> (e / 32)) & 1) << 4);
      y[e] = dl * static_cast<float>(q) - ml;
    }
  }
}

// Q6_K, 210 bytes: ql[128] | qh[64] | scales[16] int8 | d f16. Two halves of 128 elements; in half h, element r:
// low 4 bits = nibble r / 64 (low, high) of ql[64h + r % 64]; high 2 bits = bits [2*(r/32), +2) of qh[32h + r % 32].
// y = (d * scale_{e/16}) * (q - 32)
void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const uint8_t* sc = b + 192;
  const float d = f16_at(b + 208);
  for (int j = 0; j < 16; ++j) {
    const float dl = d * static_cast<float>(static_cast<int8_t>(sc[j]));
    for (int e = 16 * j; e < 16 * j + 16; ++e) {
      const int h = e / 128, r = e % 128;
      const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
      const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
      y[e] = dl * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
}

// --- the integer form (one piece of 32 elements) -------------------------------------------------------------------

void piece_q8_0(const uint8_t* b, int, int8_t* c, float* a, float* o) {
  a[0] = a[1] = f16_at(b);
  o[0] = o[1] = 0.0f;
  for (int i = 0; i < 32; ++i) c[i] = static_cast<int8_t>(b[2 + i]);
}

void piece_q4_0(const uint8_t* b, int, int8_t* c, float* a, float* o) {
  a[0] = a[1] = f16_at(b);
  o[0] = o[1] = 0.0f;
  for (int i = 0; i < 32; ++i) c[i] = static_cast<int8_t>(nibble32(b + 2, i) - 8);
}

void piece_q4_1(const uint8_t* b, int, int8_t* c, float* a, float* o) {
  a[0] = a[1] = f16_at(b);
  o[0] = o[1] = f16_at(b + 2);
  for (int i = 0; i < 32; ++i) c[i] = static_cast<int8_t>(nibble32(b + 4, i));
}

void piece_q5_0(const uint8_t* b, int, int8_t* c, float* a, float* o) {
  a[0] = a[1] = f16_at(b);
  o[0] = o[1] = 0.0f;
  const uint32_t qh = u32_at(b + 2);
  for (int i = 0; i < 32; ++i)
    c[i] = static_cast<int8_t>((nibble32(b + 6, i) | static_cast<int>(((qh >> i) & 1u) << 4)) - 16);
}

void piece_q5_1(const uint8_t* b, int, int8_t* c, float* a, float* o) {
  a[0] = a[1] = f16_at(b);
  o[0] = o[1] = f16_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  for (int i = 0; i < 32; ++i)
    c[i] = static_cast<int8_t>(nibble32(b + 8, i) | static_cast<int>(((qh >> i) & 1u) << 4));
}

void piece_q4_k(const uint8_t* b, int j, int8_t* c, float* a, float* o) {
  int sc, mn;
  scale_min_k4(b + 4, j, &sc, &mn);
  a[0] = a[1] = f16_at(b) * static_cast<float>(sc);
  o[0] = o[1] = -(f16_at(b + 2) * static_cast<float>(mn));
  for (int i = 0; i < 32; ++i) c[i] = static_cast<int8_t>(code4(b + 16, 32 * j + i));
}

void piece_q5_k(const uint8_t* b, int j, int8_t* c, float* a, float* o) {
  int sc, mn;
  scale_min_k4(b + 4, j, &sc, &mn);
  a[0] = a[1] = f16_at(b) * static_cast<float>(sc);
  o[0] = o[1] = -(f16_at(b + 2) * static_cast<float>(mn));
  const uint8_t* qh = b + 16;
  for (int i = 0; i < 32; ++i) {
    const int e = 32 * j + i;
    c[i] = static_cast<int8_t>(code4(b + 48, e) | (((qh[e % 32] >> (e / 32)) & 1) << 4));
  }
}

// Q2_K piece p: sub-blocks 2p and 2p + 1 (a scale and a min per 16 elements), codes q in [0, 3].
void piece_q2_k(const uint8_t* b, int p, int8_t* c, float* a, float* o) {
  const uint8_t* sc = b;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int h = 0; h < 2; ++h) {
    a[h] = d * static_cast<float>(sc[2 * p + h] & 0x0F);
    o[h] = -(dmin * static_cast<float>(sc[2 * p + h] >> 4));
  }
  for (int i = 0; i < 32; ++i) c[i] = static_cast<int8_t>(code2(b + 16, 32 * p + i));
}

void piece_q6_k(const uint8_t* b, int p, int8_t* c, float* a, float* o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const uint8_t* sc = b + 192;
  const float d = f16_at(b + 208);
  for (int h = 0; h < 2; ++h) a[h] = d * static_cast<float>(static_cast<int8_t>(sc[2 * p + h]));
  o[0] = o[1] = 0.0f;
  for (int i = 0; i < 32; ++i) {
    const int e = 32 * p + i, hh = e / 128, r = e % 128;
    const int lo = (ql[64 * hh + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int hi = (qh[32 * hh + r % 32] >> (2 * (r / 32))) & 3;
    c[i] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
}

using PieceFn = void (*)(const uint8_t*, int, int8_t*, float*, float*);

struct Entry {
  GgmlBlockFormat format;
  PieceFn piece;
};

constexpr Entry kFormats[] = {
    {{GgmlType::kQ4_0, "Q4_0", 32, 18, deq_q4_0, true, {0, -1}}, piece_q4_0},
    {{GgmlType::kQ4_1, "Q4_1", 32, 20, deq_q4_1, true, {0, 2}}, piece_q4_1},
    {{GgmlType::kQ5_0, "Q5_0", 32, 22, deq_q5_0, true, {0, -1}}, piece_q5_0},
    {{GgmlType::kQ5_1, "Q5_1", 32, 24, deq_q5_1, true, {0, 2}}, piece_q5_1},
    {{GgmlType::kQ8_0, "Q8_0", 32, 34, deq_q8_0, true, {0, -1}}, piece_q8_0},
    {{GgmlType::kQ2_K, "Q2_K", 256, 84, deq_q2_k, true, {80, 82}}, piece_q2_k},
    {{GgmlType::kQ3_K, "Q3_K", 256, 110, deq_q3_k, false, {108, -1}}, nullptr},
    {{GgmlType::kQ4_K, "Q4_K", 256, 144, deq_q4_k, true, {0, 2}}, piece_q4_k},
    {{GgmlType::kQ5_K, "Q5_K", 256, 176, deq_q5_k, true, {0, 2}}, piece_q5_k},
    {{GgmlType::kQ6_K, "Q6_K", 256, 210, deq_q6_k, true, {208, -1}}, piece_q6_k},
};

const Entry* entry(uint32_t type) {
  for (const Entry& e : kFormats)
    if (static_cast<uint32_t>(e.format.type) == type) return &e;
  return nullptr;
}

}  // namespace

void repack_q3_k_as_q6_k(const uint8_t* q3, uint8_t* q6) {
  const uint8_t* hm = q3;
  const uint8_t* qs = q3 + 32;
  const uint8_t* sc = q3 + 96;
  uint8_t* ql = q6;
  uint8_t* qh = q6 + 128;
  uint8_t* s6 = q6 + 192;
  std::memset(q6, 0, 192);
  for (int j = 0; j < 16; ++j) {  // deq_q3_k's scale, then deq_q6_k's layout (see both above)
    const int lo = j < 8 ? (sc[j] & 0x0F) : (sc[j - 8] >> 4);
    const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
    s6[j] = static_cast<uint8_t>(static_cast<int8_t>((lo | (hi << 4)) - 32));
  }
  for (int e = 0; e < 256; ++e) {
    const int high = (hm[e % 32] >> (e / 32)) & 1;
    const int q = code2(qs, e) - (high ? 0 : 4) + 32;  // in [28, 35]
    const int h = e / 128, r = e % 128;
    ql[64 * h + r % 64] |= static_cast<uint8_t>((q & 0x0F) << (4 * (r / 64)));
    qh[32 * h + r % 32] |= static_cast<uint8_t>((q >> 4) << (2 * (r / 32)));
  }
  std::memcpy(q6 + 208, q3 + 108, 2);  // d (float16)
}

const GgmlBlockFormat* ggml_block_format(uint32_t type) {
  const Entry* e = entry(type);
  return e ? &e->format : nullptr;
}

bool ggml_block_finite(const GgmlBlockFormat& f, const uint8_t* block) {
  for (int off : f.f16_fields) {
    if (off < 0) continue;
    const uint16_t h = static_cast<uint16_t>(block[off] | (block[off + 1] << 8));
    if ((h & 0x7C00u) == 0x7C00u) return false;  // exponent all ones: infinity or NaN
  }
  return true;
}

void ggml_piece(GgmlType type, const uint8_t* block, int piece, int8_t c[32], float a[2], float b[2]) {
  const Entry* e = entry(static_cast<uint32_t>(type));
  check(e != nullptr && e->piece != nullptr, ErrorCode::kUnsupported, "ggml_piece",
        "the type must have an integer form (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q4_K, Q5_K, Q6_K); got ",
        e ? e->format.name : "an unknown type id ", e ? "" : std::to_string(static_cast<uint32_t>(type)));
  check(piece >= 0 && piece < e->format.block_size / 32, ErrorCode::kOutOfRange, "ggml_piece", "piece must be in [0, ",
        e->format.block_size / 32, "); got ", piece);
  e->piece(block, piece, c, a, b);
}

}  // namespace cider::quant
