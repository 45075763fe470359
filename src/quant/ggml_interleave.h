// cider/quant/ggml_interleave.h — GGUF weight rows of the 32-element formats with an offset or a minimum (Q4_0, Q4_1,
// Q5_0, Q5_1) rearranged 8 rows at a time, so that one 32-byte register holds 4 codes of each of 8 rows and a kernel's
// 32-bit lanes are the rows (kernels/x86/avx2/ggml_linear_gemv_x8.cpp): the same bytes and values as the file's
// blocks, in another order. The CPU loads such tensors this way where its kernel table asks for it
// (KernelTable::ggml_interleave); everything that writes weights out (cider convert) writes the file's order back.
//
// A tensor of N rows (N a multiple of 8) and B = K/32 blocks per row is N/8 groups of B "octets"; octet (g, b) holds
// block b of rows 8g … 8g + 7 in 8 × block_bytes bytes, at byte (g·B + b)·8·block_bytes (so each group of 8 rows
// keeps its byte range: a tensor is interleaved group by group):
//   [0, 16)          d of rows 0..7 (float16)
//   [16, 32)         m of rows 0..7 (float16; Q4_1, Q5_1 only)
//   then 32 bytes    hb (Q5_0, Q5_1 only): bit j of byte 4l + i = bit 4j + i of row l's qh, the fifth bit of code
//                    4j + i (so shifting hb by j and masking bit 4 of every byte gives 4 codes' fifth bits per row)
//   then 128 bytes   qs: 4 vectors of 32 bytes; dword l of vector v = row l's qs bytes [4v, 4v + 4) (low nibbles:
//                    codes 4v … 4v + 3; high nibbles: codes 16 + 4v … 16 + 4v + 3)
#pragma once

#include <cstdint>

namespace cider::quant {

constexpr int64_t kGgmlInterleaveRows = 8;

// Whether rows of this ggml type can be interleaved (Q4_0, Q4_1, Q5_0, Q5_1).
bool ggml_interleavable(uint32_t type);

// src: N rows of K/32 blocks in the file's order; dst (the same size, not overlapping): interleaved as above.
// Checks the type, N (a positive multiple of 8) and K (a positive multiple of 32).
void ggml_interleave_rows(uint32_t type, const void* src, int64_t N, int64_t K, void* dst);
// The inverse: interleaved rows back to the file's order.
void ggml_deinterleave_rows(uint32_t type, const void* src, int64_t N, int64_t K, void* dst);
// Block b of row n of an interleaved tensor w (blocks_per_row = K/32), written in the file's layout to out
// (block_bytes bytes). No checks: callers hold a checked tensor.
void ggml_interleaved_block(uint32_t type, const void* w, int64_t blocks_per_row, int64_t n, int64_t b, uint8_t* out);

}  // namespace cider::quant
