// cider/kernels/cuda/ggml_piece.cuh — the integer form of one 32-element piece of a GGUF block on the device, shared
// by the native-weight kernels (linear_ggml.cu: the warp-per-row GEMV, dequantization, embedding rows;
// linear_ggml_rows.cu: the row kernel that streams whole row segments into shared memory).
//
// A block is pieces of 32 elements, and in piece p element i is w_i = a_h·c_i + b_h (h = i / 16) with an int8 code
// c_i. `Fmt<T>::piece<L>` gives one piece as eight words of four codes (element 4w + k in byte k of word w) and its
// (a, b) pairs: the device twin of quant::ggml_piece, from the same byte layouts (docs/checkpoint_formats.md), read
// through the loader L (LdGlobal: global memory, read-only path; LdShared: a shared-memory copy of the block).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "quant/ggml_blocks.h"

namespace cider::cuda::ggml_device {

using quant::GgmlType;

// ---- loads ---------------------------------------------------------------------------------------------------------
// Blocks are 2-byte aligned at least (every block size is even and a row starts at a multiple of its size); Q4_1,
// Q5_1 (20, 24 bytes) are 4-byte aligned and Q4_K, Q5_K (144, 176 bytes) 16-byte aligned where the rows start at a
// 16-byte boundary (device allocations; rows are whole blocks), which the launcher checks.

// Where a piece's bytes are read from: global memory through the read-only path, or a shared-memory copy (the row
// kernel's slots, linear_ggml_rows.cu). Each loader gives 16-, 32- and 128-bit loads at addresses aligned to them.
struct LdGlobal {
  __device__ static uint32_t u16(const uint8_t* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
  __device__ static uint32_t u32(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }
  __device__ static uint4 u128(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
};
struct LdShared {
  __device__ static uint32_t u16(const uint8_t* p) { return *reinterpret_cast<const unsigned short*>(p); }
  __device__ static uint32_t u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
  __device__ static uint4 u128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }
};

template <class L>
__device__ __forceinline__ uint32_t ld32_a2(const uint8_t* p) {
  return L::u16(p) | (L::u16(p + 2) << 16);
}
template <class L>
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return L::u32(p); }
template <class L>
__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(L::u16(p))));
}
template <class L>
__device__ __forceinline__ void ld128x2(const uint8_t* p, uint32_t (&q)[8]) {
  const uint4 u0 = L::u128(p), u1 = L::u128(p + 16);
  q[0] = u0.x, q[1] = u0.y, q[2] = u0.z, q[3] = u0.w, q[4] = u1.x, q[5] = u1.y, q[6] = u1.z, q[7] = u1.w;
}

// Bits 0..3 of b moved to bit 4 of bytes 0..3 (the fifth code bit of four consecutive Q5_0 / Q5_1 elements).
__device__ __forceinline__ uint32_t spread4(uint32_t b) { return (((b & 0xFu) * 0x00204081u) & 0x01010101u) << 4; }

// ---- the integer form of one piece ---------------------------------------------------------------------------------

struct Piece {
  uint32_t c[8];  // 32 int8 codes, element 4w + k in byte k of c[w]
  float a0, a1;   // the steps of elements 0..15 and 16..31
  float b0, b1;   // their offsets (formats with has_b)
};

template <GgmlType T>
struct Fmt;

// Q8_0, 34 bytes: d f16 | 32 int8 codes.
template <>
struct Fmt<GgmlType::kQ8_0> {
  static constexpr int kBlock = 32, kBytes = 34;
  static constexpr bool kHasB = false;
  template <class L>
  __device__ static void piece(const uint8_t* b, int, Piece& p) {
    p.a0 = p.a1 = f16_at<L>(b);
#pragma unroll
    for (int w = 0; w < 8; ++w) p.c[w] = ld32_a2<L>(b + 2 + 4 * w);
  }
};

// Q4_0, 18 bytes: d f16 | 16 bytes (element i < 16 the low nibble of byte i, i + 16 its high nibble); c = q − 8.
template <>
struct Fmt<GgmlType::kQ4_0> {
  static constexpr int kBlock = 32, kBytes = 18;
  static constexpr bool kHasB = false;
  template <class L>
  __device__ static void piece(const uint8_t* b, int, Piece& p) {
    p.a0 = p.a1 = f16_at<L>(b);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t q = ld32_a2<L>(b + 2 + 4 * w);
      p.c[w] = __vsub4(q & 0x0F0F0F0Fu, 0x08080808u);
      p.c[w + 4] = __vsub4((q >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    }
  }
};

// Q4_1, 20 bytes: d f16 | m f16 | 16 bytes as Q4_0; c = q, b = m.
template <>
struct Fmt<GgmlType::kQ4_1> {
  static constexpr int kBlock = 32, kBytes = 20;
  static constexpr bool kHasB = true;
  template <class L>
  __device__ static void piece(const uint8_t* b, int, Piece& p) {
    p.a0 = p.a1 = f16_at<L>(b);
    p.b0 = p.b1 = f16_at<L>(b + 2);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t q = ld32<L>(b + 4 + 4 * w);
      p.c[w] = q & 0x0F0F0F0Fu;
      p.c[w + 4] = (q >> 4) & 0x0F0F0F0Fu;
    }
  }
};

// Q5_0, 22 bytes: d f16 | qh u32 (bit i = bit 4 of element i) | 16 bytes as Q4_0; c = q − 16.
template <>
struct Fmt<GgmlType::kQ5_0> {
  static constexpr int kBlock = 32, kBytes = 22;
  static constexpr bool kHasB = false;
  template <class L>
  __device__ static void piece(const uint8_t* b, int, Piece& p) {
    p.a0 = p.a1 = f16_at<L>(b);
    const uint32_t qh = ld32_a2<L>(b + 2);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t q = ld32_a2<L>(b + 6 + 4 * w);
      p.c[w] = __vsub4((q & 0x0F0F0F0Fu) | spread4(qh >> (4 * w)), 0x10101010u);
      p.c[w + 4] = __vsub4(((q >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (4 * w + 16)), 0x10101010u);
    }
  }
};

// Q5_1, 24 bytes: d f16 | m f16 | qh u32 | 16 bytes; c = q, b = m.
template <>
struct Fmt<GgmlType::kQ5_1> {
  static constexpr int kBlock = 32, kBytes = 24;
  static constexpr bool kHasB = true;
  template <class L>
  __device__ static void piece(const uint8_t* b, int, Piece& p) {
    p.a0 = p.a1 = f16_at<L>(b);
    p.b0 = p.b1 = f16_at<L>(b + 2);
    const uint32_t qh = ld32<L>(b + 4);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t q = ld32<L>(b + 8 + 4 * w);
      p.c[w] = (q & 0x0F0F0F0Fu) | spread4(qh >> (4 * w));
      p.c[w + 4] = ((q >> 4) & 0x0F0F0F0Fu) | spread4(qh >> (4 * w + 16));
    }
  }
};

// The 6-bit scale and min of sub-block j of Q4_K / Q5_K from their 12 bytes s (quant/ggml_blocks.cpp scale_min_k4),
// read as three words.
template <class L>
__device__ __forceinline__ void scale_min_k4(const uint8_t* s, int j, int& sc, int& mn) {
  const uint32_t w0 = ld32<L>(s), w1 = ld32<L>(s + 4), w2 = ld32<L>(s + 8);
  auto byte = [&](int i) -> int {
    const uint32_t w = i < 4 ? w0 : i < 8 ? w1 : w2;
    return static_cast<int>((w >> (8 * (i % 4))) & 0xFFu);
  };
  if (j < 4) {
    sc = byte(j) & 63;
    mn = byte(j + 4) & 63;
  } else {
    sc = (byte(j + 4) & 0x0F) | ((byte(j - 4) >> 6) << 4);
    mn = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
  }
}

// Piece j's (a, b) of a Q4_K / Q5_K block: a = d·sc_j, b = −(dmin·m_j) (d, dmin the f16 fields at bytes 0 and 2).
template <class L>
__device__ __forceinline__ void k4_steps(const uint8_t* b, int j, Piece& p) {
  int sc, mn;
  scale_min_k4<L>(b + 4, j, sc, mn);
  p.a0 = p.a1 = __fmul_rn(f16_at<L>(b), static_cast<float>(sc));
  p.b0 = p.b1 = -__fmul_rn(f16_at<L>(b + 2), static_cast<float>(mn));
}

// Q4_K, 144 bytes: d f16 | dmin f16 | scales[12] | qs[128]; piece j: bytes [32·(j/2), +32) of qs, nibble j % 2;
// a = d·sc_j, b = −(dmin·m_j).
template <>
struct Fmt<GgmlType::kQ4_K> {
  static constexpr int kBlock = 256, kBytes = 144;
  static constexpr bool kHasB = true;
  template <class L>
  __device__ static void piece(const uint8_t* b, int j, Piece& p) {
    k4_steps<L>(b, j, p);
    uint32_t q[8];
    ld128x2<L>(b + 16 + 32 * (j / 2), q);
    const int s = 4 * (j % 2);
#pragma unroll
    for (int w = 0; w < 8; ++w) p.c[w] = (q[w] >> s) & 0x0F0F0F0Fu;
  }
};

// Q5_K, 176 bytes: d f16 | dmin f16 | scales[12] | qh[32] | qs[128]; as Q4_K, bit 4 of element 32j + i is bit j of
// qh[i].
template <>
struct Fmt<GgmlType::kQ5_K> {
  static constexpr int kBlock = 256, kBytes = 176;
  static constexpr bool kHasB = true;
  template <class L>
  __device__ static void piece(const uint8_t* b, int j, Piece& p) {
    k4_steps<L>(b, j, p);
    uint32_t q[8], h[8];
    ld128x2<L>(b + 48 + 32 * (j / 2), q);
    ld128x2<L>(b + 16, h);
    const int s = 4 * (j % 2);
#pragma unroll
    for (int w = 0; w < 8; ++w) p.c[w] = ((q[w] >> s) & 0x0F0F0F0Fu) | (((h[w] >> j) & 0x01010101u) << 4);
  }
};

// Q6_K, 210 bytes: ql[128] | qh[64] | scales[16] int8 | d f16; piece p (half hh = p/4, quarter r = p%4): low bits
// nibble r/2 of ql[64·hh + 32·(r%2) + i], high bits [2r, 2r+2) of qh[32·hh + i]; c = q − 32, a_h = d·sc[2p + h].
template <>
struct Fmt<GgmlType::kQ6_K> {
  static constexpr int kBlock = 256, kBytes = 210;
  static constexpr bool kHasB = false;
  template <class L>
  __device__ static void piece(const uint8_t* b, int pc, Piece& p) {
    const int hh = pc / 4, r = pc % 4;
    const float d = f16_at<L>(b + 208);
    const uint32_t sc = L::u16(b + 192 + 2 * pc);
    p.a0 = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc & 0xFFu)));
    p.a1 = __fmul_rn(d, static_cast<float>(static_cast<int8_t>(sc >> 8)));
    const uint8_t* ql = b + 64 * hh + 32 * (r % 2);
    const uint8_t* qh = b + 128 + 32 * hh;
    const int sl = 4 * (r / 2), sh = 2 * r;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const uint32_t lo = (ld32_a2<L>(ql + 4 * w) >> sl) & 0x0F0F0F0Fu;
      const uint32_t hi = ((ld32_a2<L>(qh + 4 * w) >> sh) & 0x03030303u) << 4;
      p.c[w] = __vsub4(lo | hi, 0x20202020u);
    }
  }
};

// Q2_K, 84 bytes: scales[16] (low nibble: the scale, high nibble: the min of each 16 elements) | qs[64] | d f16 |
// dmin f16; piece p (half hh = p/4, s = p%4): bits [2s, 2s+2) of qs[32·hh + i]; c = q, a_h = d·(sc[2p+h] & 15),
// b_h = −(dmin·(sc[2p+h] >> 4)). 2-byte loads only (84-byte blocks).
template <>
struct Fmt<GgmlType::kQ2_K> {
  static constexpr int kBlock = 256, kBytes = 84;
  static constexpr bool kHasB = true;
  template <class L>
  __device__ static void piece(const uint8_t* b, int pc, Piece& p) {
    const float d = f16_at<L>(b + 80), dmin = f16_at<L>(b + 82);
    const uint32_t sc = L::u16(b + 2 * pc);  // scales byte 2p (low), 2p + 1 (high)
    p.a0 = __fmul_rn(d, static_cast<float>(sc & 0x0Fu));
    p.a1 = __fmul_rn(d, static_cast<float>((sc >> 8) & 0x0Fu));
    p.b0 = -__fmul_rn(dmin, static_cast<float>((sc >> 4) & 0x0Fu));
    p.b1 = -__fmul_rn(dmin, static_cast<float>((sc >> 12) & 0x0Fu));
    const uint8_t* qs = b + 16 + 32 * (pc / 4);
    const int sh = 2 * (pc % 4);
#pragma unroll
    for (int w = 0; w < 8; ++w) p.c[w] = (ld32_a2<L>(qs + 4 * w) >> sh) & 0x03030303u;
  }
};

template <GgmlType T>
constexpr int pieces_per_block() {
  return Fmt<T>::kBlock / 32;
}

// Element 4w + k of a piece as float32: a_h·c (+ b_h), one rounding each (the decoder's order).
template <GgmlType T>
__device__ __forceinline__ float piece_value(const Piece& p, int w, int k) {
  const float c = static_cast<float>(static_cast<int8_t>((p.c[w] >> (8 * k)) & 0xFFu));
  const bool first = w < 4;
  const float v = __fmul_rn(first ? p.a0 : p.a1, c);
  if constexpr (Fmt<T>::kHasB) return __fadd_rn(v, first ? p.b0 : p.b1);
  return v;
}

// One piece's term for one activation row, as the CPU kernels form it: S_h = Σ_{i∈h} c_i·xq_i (eight dp4a, exact in
// int32) and dx·(a₀·S₀ + a₁·S₁), plus b₀·X₀ + b₁·X₁ for the formats with an offset (xs = (X₀, X₁), the half-pieces'
// dx·Σ codes). xq: the piece's 32 activation codes, 16-byte aligned (global or shared memory).
template <GgmlType T>
__device__ __forceinline__ float piece_term(const Piece& pc, const int8_t* xq, float dx, const float2* xs) {
  const auto* xv = reinterpret_cast<const int4*>(xq);
  const int4 x0 = xv[0], x1 = xv[1];
  int s0 = __dp4a(static_cast<int>(pc.c[0]), x0.x, 0);
  s0 = __dp4a(static_cast<int>(pc.c[1]), x0.y, s0);
  s0 = __dp4a(static_cast<int>(pc.c[2]), x0.z, s0);
  s0 = __dp4a(static_cast<int>(pc.c[3]), x0.w, s0);
  int s1 = __dp4a(static_cast<int>(pc.c[4]), x1.x, 0);
  s1 = __dp4a(static_cast<int>(pc.c[5]), x1.y, s1);
  s1 = __dp4a(static_cast<int>(pc.c[6]), x1.z, s1);
  s1 = __dp4a(static_cast<int>(pc.c[7]), x1.w, s1);
  float t = dx * (pc.a0 * static_cast<float>(s0) + pc.a1 * static_cast<float>(s1));
  if constexpr (Fmt<T>::kHasB) {
    const float2 h = *xs;
    t += pc.b0 * h.x + pc.b1 * h.y;
  }
  return t;
}

}  // namespace cider::cuda::ggml_device
