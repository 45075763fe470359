// cider/quant/ggml_blocks.h — the quantized block formats of GGUF files (ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the
// K-quants Q2_K … Q6_K): their geometry, their dequantization (the reference: plain scalar C++, one block at a time,
// one float32 rounding per operation in the order written, bit for bit gguf-py's numpy reference), and the integer
// form the native-weight kernels multiply (kernels/kernel_table.h, GgmlLinearArgs).
//
// Integer form: a block is read as pieces of 32 consecutive elements; in piece p, element i (0..31) is
//   w_i = a[i / 16] · c_i + b[i / 16],   c_i an int8 (|c_i| <= 128), a and b float32,
// so a kernel can dot the codes with int8 activations exactly in integers and apply a and b per half-piece:
// Σ_i w_i·x_i = Σ_h a_h·Σ_{i∈h} c_i·x_i + b_h·Σ_{i∈h} x_i.
//   Q8_0  c = q,         a = d,              b = 0
//   Q4_0  c = q − 8,     a = d,              b = 0          Q4_1  c = q, a = d, b = m
//   Q5_0  c = q − 16,    a = d,              b = 0          Q5_1  c = q, a = d, b = m
//   Q4_K  c = q,         a = d·sc_j,         b = −dmin·m_j  (j = the piece: one scale/min per 32 elements)
//   Q5_K  as Q4_K with 5-bit q
//   Q6_K  c = q − 32,    a = d·sc_{16-group}, b = 0        (a scale per 16 elements: both halves differ)
//   Q2_K  c = q (2 bits), a = d·sc_{16-group}, b = −dmin·m_{16-group}  (a scale and a min per 16 elements)
// Q3_K has no integer form here: its blocks are re-encoded exactly as Q6_K blocks (repack_q3_k_as_q6_k) by the loader.
// Block layouts (byte offsets) are tabulated in docs/checkpoint_formats.md.
#pragma once

#include <cstdint>

namespace cider::quant {

// ggml type ids of the block formats (the values in GGUF files).
enum class GgmlType : uint32_t {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
};

using GgmlBlockDecoder = void (*)(const uint8_t* block, float* out);  // block_size floats

struct GgmlBlockFormat {
  GgmlType type;
  const char* name;     // "Q4_K"
  int block_size;       // elements per block: 32, or 256 for the K-quants
  int block_bytes;
  GgmlBlockDecoder decode;
  bool integer_form;    // ggml_piece supports it (the native kernels can multiply it)
  // Byte offsets of the block's float16 fields (scales d, dmin, m; -1 = none). Every other field is an integer code
  // or scale, so a block's values are finite exactly when these are (ggml_block_finite).
  int f16_fields[2];
};

// Whether every float16 field of the block is finite (so every value it decodes to is).
bool ggml_block_finite(const GgmlBlockFormat& f, const uint8_t* block);

// nullptr for a type id that is not one of the block formats above (F32/F16/BF16 included).
const GgmlBlockFormat* ggml_block_format(uint32_t type);

// Piece p (0 .. block_size/32 − 1) of one block in integer form (see above). The type must have integer_form.
void ggml_piece(GgmlType type, const uint8_t* block, int piece, int8_t c[32], float a[2], float b[2]);

// One Q3_K block (110 bytes) re-encoded as a Q6_K block (210 bytes), value for value: both decode element e of
// sub-block j as (d·s_j)·q in float32, Q3_K with its signed 6-bit scale s_j = raw − 32 ∈ [−32, 31] and 3-bit code
// q ∈ [−4, 3], Q6_K with an int8 scale and a 6-bit code minus 32 — so d is copied, s_j becomes the int8 scale and
// q + 32 the 6-bit code, and every value (and every piece's integer form) is bit for bit the same. Q3_K weights
// thereby run on the Q6_K kernels (1.9× their bytes; bf16 would be 4.7×).
void repack_q3_k_as_q6_k(const uint8_t* q3, uint8_t* q6);

// Scale and min of sub-block j (0..7, 32 elements each) of Q4_K / Q5_K from their 12 packed bytes: six bits each;
// j < 4: scale = bits 0-5 of byte j, min = bits 0-5 of byte j + 4; j >= 4: the low four bits come from byte j + 4
// (scale: low nibble, min: high nibble) and the high two bits from bits 6-7 of byte j - 4 (scale) / byte j (min).
inline void scale_min_k4(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The inverse: the 12 packed bytes s from the 8 scales and minimums (each in [0, 63]).
inline void pack_scale_min_k4(const int sc[8], const int mn[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
  }
}

// Bytes of one row of k elements (k a multiple of the block size).
inline int64_t ggml_row_bytes(const GgmlBlockFormat& f, int64_t k) { return k / f.block_size * f.block_bytes; }

}  // namespace cider::quant
