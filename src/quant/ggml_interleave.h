// cider/quant/ggml_interleave.h — GGUF weight rows of Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K rearranged 8 rows
// at a time, so that one 32-byte register holds 4 codes of each of 8 rows and a kernel's 32-bit lanes are the rows
// (kernels/x86/avx2/ggml_linear_gemv_x8.cpp): the same bytes and values as the file's blocks, in another order. The
// CPU loads such tensors this way where its kernel table asks for it (KernelTable::ggml_interleave); everything that
// writes weights out (cider convert) writes the file's order back.
//
// A tensor of N rows (N a multiple of 8) and B = K/block_size blocks per row is N/8 groups of B "octets"; octet (g, b)
// holds block b of rows 8g … 8g + 7 in 8 × block_bytes bytes, at byte (g·B + b)·8·block_bytes (so each group of 8
// rows keeps its byte range: a tensor is interleaved group by group).
// The 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1):
//   [0, 16)          d of rows 0..7 (float16)
//   [16, 32)         m of rows 0..7 (float16; Q4_1, Q5_1 only)
//   then 32 bytes    hb (Q5_0, Q5_1 only): bit j of byte 4l + i = bit 4j + i of row l's qh, the fifth bit of code
//                    4j + i (so shifting hb by j and masking bit 4 of every byte gives 4 codes' fifth bits per row)
//   then 128 bytes   qs: 4 vectors of 32 bytes; dword l of vector v = row l's qs bytes [4v, 4v + 4) (low nibbles:
//                    codes 4v … 4v + 3; high nibbles: codes 16 + 4v … 16 + 4v + 3)
// Q4_K (256 elements, 8 pieces j of 32, each with a 6-bit scale sc_j and minimum mn_j; 1152 bytes):
//   [0, 16)          d of rows 0..7 (float16)
//   [16, 32)         dmin of rows 0..7 (float16)
//   [32, 96)         byte 8j + l: the low 4 bits of row l's sc_j (bits 0-3) and of its mn_j (bits 4-7)
//   [96, 128)        byte 96 + 8(j % 4) + l, bits 4(j / 4) … + 3: the high 2 bits of row l's sc_j (bits 0-1) and of
//                    its mn_j (bits 2-3)
//   [128, 1152)      qs: 32 vectors of 32 bytes; dword l of vector 8c + v = row l's qs bytes [32c + 4v, 32c + 4v + 4)
//                    (low nibbles: codes 4v … 4v + 3 of piece 2c; high nibbles: the same of piece 2c + 1)
// Q5_K (1408 bytes): as Q4_K, with 256 bytes of qh between the scales and qs (qs at [384, 1408)):
//   [128, 384)       qh: 8 vectors; dword l of vector v = row l's qh bytes [4v, 4v + 4) (bit j: the fifth bit of
//                    piece j's codes 4v … 4v + 3)
// Q6_K (256 elements, 8 pieces j = 4H + i of 32, an int8 scale per 16; 1680 bytes):
//   [0, 16)          d of rows 0..7 (float16)
//   [16, 144)        byte 16 + 16j + 2l + h: row l's scale of half h of piece j (the file's scales[2j + h])
//   [144, 1168)      ql: 32 vectors; dword l of vector 8c + v = row l's ql bytes [32c + 4v, 32c + 4v + 4) (piece
//                    4H + i, codes 4v … 4v + 3: the low nibbles of chunk c = 2H + i % 2 for i < 2, the high ones
//                    for i >= 2)
//   [1168, 1680)     qh: 16 vectors; dword l of vector 8H + v = row l's qh bytes [32H + 4v, 32H + 4v + 4) (bits
//                    2i, 2i + 1: the top two bits of piece 4H + i's codes 4v … 4v + 3)
#pragma once

#include <cstdint>

namespace cider::quant {

constexpr int64_t kGgmlInterleaveRows = 8;
// A buffer this large holds one block of any format that interleaves (ggml_interleaved_block's out).
constexpr int kGgmlInterleavedBlockMax = 210;

// Whether rows of this ggml type can be interleaved (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
bool ggml_interleavable(uint32_t type);

// src: N rows of K/32 blocks in the file's order; dst (the same size, not overlapping): interleaved as above.
// Checks the type, N (a positive multiple of 8) and K (a positive multiple of the block size).
void ggml_interleave_rows(uint32_t type, const void* src, int64_t N, int64_t K, void* dst);
// The inverse: interleaved rows back to the file's order.
void ggml_deinterleave_rows(uint32_t type, const void* src, int64_t N, int64_t K, void* dst);
// Block b of row n of an interleaved tensor w (blocks_per_row = K/block_size), written in the file's layout to out
// (block_bytes bytes, at most kGgmlInterleavedBlockMax). No checks: callers hold a checked tensor.
void ggml_interleaved_block(uint32_t type, const void* w, int64_t blocks_per_row, int64_t n, int64_t b, uint8_t* out);

}  // namespace cider::quant
