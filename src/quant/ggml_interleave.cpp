#include "quant/ggml_interleave.h"

#include <cstring>

#include "core/error.h"
#include "quant/ggml_blocks.h"

namespace cider::quant {

namespace {

// Where a block's fields are in the file's layout and in an octet (ggml_interleave.h).
struct Shape {
  int block_bytes;
  bool min, five;  // a float16 minimum m (Q4_1, Q5_1); a fifth bit per code (Q5_0, Q5_1)
  int qh, qs;      // offsets in a block
  int hb, oqs;     // offsets in an octet
};

Shape shape_of(uint32_t type) {
  Shape s{};
  const auto t = static_cast<GgmlType>(type);
  s.min = t == GgmlType::kQ4_1 || t == GgmlType::kQ5_1;
  s.five = t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1;
  s.qh = s.min ? 4 : 2;
  s.qs = s.qh + (s.five ? 4 : 0);
  s.block_bytes = s.qs + 16;
  s.hb = s.min ? 32 : 16;
  s.oqs = s.hb + (s.five ? 32 : 0);
  return s;
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Octet o from the 8 blocks blk[l] (rows 0..7).
void put_octet(const Shape& s, const uint8_t* const* blk, uint8_t* o) {
  std::memset(o, 0, static_cast<size_t>(8 * s.block_bytes));
  for (int l = 0; l < 8; ++l) {
    std::memcpy(o + 2 * l, blk[l], 2);
    if (s.min) std::memcpy(o + 16 + 2 * l, blk[l] + 2, 2);
    if (s.five) {
      const uint32_t qh = u32_at(blk[l] + s.qh);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 8; ++j) o[s.hb + 4 * l + i] |= static_cast<uint8_t>(((qh >> (4 * j + i)) & 1u) << j);
    }
    for (int v = 0; v < 4; ++v) std::memcpy(o + s.oqs + 32 * v + 4 * l, blk[l] + s.qs + 4 * v, 4);
  }
}

// kSpread[b]: bit j of b moved to bit 4j (the fifth bits of one hb byte back to their places in qh, shifted by i).
struct SpreadTable {
  uint32_t v[256];
};
constexpr SpreadTable make_spread() {
  SpreadTable t{};
  for (uint32_t b = 0; b < 256; ++b)
    for (int j = 0; j < 8; ++j) t.v[b] |= ((b >> j) & 1u) << (4 * j);
  return t;
}
constexpr SpreadTable kSpread = make_spread();

// Row l's block from octet o (the kernels' panel packing reads every block of a prefill through this: no bit loops).
void get_block(const Shape& s, const uint8_t* o, int l, uint8_t* out) {
  std::memcpy(out, o + 2 * l, 2);
  if (s.min) std::memcpy(out + 2, o + 16 + 2 * l, 2);
  if (s.five) {
    const uint8_t* h = o + s.hb + 4 * l;
    const uint32_t qh = kSpread.v[h[0]] | kSpread.v[h[1]] << 1 | kSpread.v[h[2]] << 2 | kSpread.v[h[3]] << 3;
    std::memcpy(out + s.qh, &qh, 4);
  }
  for (int v = 0; v < 4; ++v) std::memcpy(out + s.qs + 4 * v, o + s.oqs + 32 * v + 4 * l, 4);
}

// Q4_K and Q5_K (kFive: a qh [32] between the scales and the nibbles of a block; in an octet 8 qh vectors before qs).
void put_octet_k45(const uint8_t* const* blk, uint8_t* o, bool five) {
  const int bqs = five ? 48 : 16, oqs = five ? 384 : 128;
  std::memset(o, 0, static_cast<size_t>(8 * (five ? 176 : 144)));
  for (int l = 0; l < 8; ++l) {
    std::memcpy(o + 2 * l, blk[l], 2);
    std::memcpy(o + 16 + 2 * l, blk[l] + 2, 2);
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      scale_min_k4(blk[l] + 4, j, &sc, &mn);
      o[32 + 8 * j + l] = static_cast<uint8_t>((sc & 15) | (mn & 15) << 4);
      o[96 + 8 * (j % 4) + l] |= static_cast<uint8_t>(((sc >> 4) | (mn >> 4) << 2) << (4 * (j / 4)));
    }
    if (five)
      for (int v = 0; v < 8; ++v) std::memcpy(o + 128 + 32 * v + 4 * l, blk[l] + 16 + 4 * v, 4);
    for (int v = 0; v < 32; ++v) std::memcpy(o + oqs + 32 * v + 4 * l, blk[l] + bqs + 4 * v, 4);
  }
}

void get_block_k45(const uint8_t* o, int l, uint8_t* out, bool five) {
  const int bqs = five ? 48 : 16, oqs = five ? 384 : 128;
  std::memcpy(out, o + 2 * l, 2);
  std::memcpy(out + 2, o + 16 + 2 * l, 2);
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    const int lo = o[32 + 8 * j + l], hi = o[96 + 8 * (j % 4) + l] >> (4 * (j / 4));
    sc[j] = (lo & 15) | (hi & 3) << 4;
    mn[j] = lo >> 4 | ((hi >> 2) & 3) << 4;
  }
  pack_scale_min_k4(sc, mn, out + 4);
  if (five)
    for (int v = 0; v < 8; ++v) std::memcpy(out + 16 + 4 * v, o + 128 + 32 * v + 4 * l, 4);
  for (int v = 0; v < 32; ++v) std::memcpy(out + bqs + 4 * v, o + oqs + 32 * v + 4 * l, 4);
}

// Q6_K (quant/ggml_interleave.h): ql [128], qh [64], int8 scales [16], d in a block.
void put_octet_q6k(const uint8_t* const* blk, uint8_t* o) {
  for (int l = 0; l < 8; ++l) {
    std::memcpy(o + 2 * l, blk[l] + 208, 2);
    for (int j = 0; j < 8; ++j)
      for (int h = 0; h < 2; ++h) o[16 + 16 * j + 2 * l + h] = blk[l][192 + 2 * j + h];
    for (int v = 0; v < 32; ++v) std::memcpy(o + 144 + 32 * v + 4 * l, blk[l] + 4 * v, 4);
    for (int v = 0; v < 16; ++v) std::memcpy(o + 1168 + 32 * v + 4 * l, blk[l] + 128 + 4 * v, 4);
  }
}

void get_block_q6k(const uint8_t* o, int l, uint8_t* out) {
  std::memcpy(out + 208, o + 2 * l, 2);
  for (int j = 0; j < 8; ++j)
    for (int h = 0; h < 2; ++h) out[192 + 2 * j + h] = o[16 + 16 * j + 2 * l + h];
  for (int v = 0; v < 32; ++v) std::memcpy(out + 4 * v, o + 144 + 32 * v + 4 * l, 4);
  for (int v = 0; v < 16; ++v) std::memcpy(out + 128 + 4 * v, o + 1168 + 32 * v + 4 * l, 4);
}

bool is_q4k(uint32_t type) { return static_cast<GgmlType>(type) == GgmlType::kQ4_K; }
bool is_q5k(uint32_t type) { return static_cast<GgmlType>(type) == GgmlType::kQ5_K; }
bool is_q6k(uint32_t type) { return static_cast<GgmlType>(type) == GgmlType::kQ6_K; }
int64_t block_bytes_of(uint32_t type) {
  return is_q4k(type) ? 144 : is_q5k(type) ? 176 : is_q6k(type) ? 210 : shape_of(type).block_bytes;
}

// The format's block size after checking the type, N (a positive multiple of 8) and K (a positive multiple of it).
int64_t checked(const char* op, uint32_t type, int64_t N, int64_t K) {
  check(ggml_interleavable(type), ErrorCode::kUnsupported, op,
        "rows interleave for Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K; got ggml type ", type);
  check(N > 0 && N % kGgmlInterleaveRows == 0, ErrorCode::kInvalidArgument, op, "interleaved rows come in groups of ",
        kGgmlInterleaveRows, ": N must be a positive multiple of it; got ", N);
  const quant::GgmlBlockFormat* f = ggml_block_format(type);
  check(K > 0 && K % f->block_size == 0, ErrorCode::kInvalidArgument, op, "K must be a positive multiple of the ",
        f->name, " block size ", f->block_size, "; got ", K);
  check(f->block_bytes == block_bytes_of(type), ErrorCode::kInternal, op,
        "block layout of type ", type);
  return f->block_size;
}

// Octet o from the 8 blocks blk[l], and row l's block back from octet o, for any interleavable format.
void put(uint32_t type, const uint8_t* const* blk, uint8_t* o) {
  if (is_q4k(type) || is_q5k(type)) return put_octet_k45(blk, o, is_q5k(type));
  if (is_q6k(type)) return put_octet_q6k(blk, o);
  put_octet(shape_of(type), blk, o);
}
void get(uint32_t type, const uint8_t* o, int l, uint8_t* out) {
  if (is_q4k(type) || is_q5k(type)) return get_block_k45(o, l, out, is_q5k(type));
  if (is_q6k(type)) return get_block_q6k(o, l, out);
  get_block(shape_of(type), o, l, out);
}

}  // namespace

bool ggml_interleavable(uint32_t type) {
  const auto t = static_cast<GgmlType>(type);
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ5_0 || t == GgmlType::kQ5_1 ||
         t == GgmlType::kQ4_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K;
}

void ggml_interleave_rows(uint32_t type, const void* src, int64_t N, int64_t K, void* dst) {
  const int64_t B = K / checked("ggml_interleave_rows", type, N, K), bb = ggml_block_format(type)->block_bytes;
  const int64_t rb = B * bb;
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = 0; g < N / 8; ++g)
    for (int64_t b = 0; b < B; ++b) {
      const uint8_t* blk[8];
      for (int l = 0; l < 8; ++l) blk[l] = in + (8 * g + l) * rb + b * bb;
      put(type, blk, out + (g * B + b) * 8 * bb);
    }
}

void ggml_deinterleave_rows(uint32_t type, const void* src, int64_t N, int64_t K, void* dst) {
  const int64_t B = K / checked("ggml_deinterleave_rows", type, N, K), bb = ggml_block_format(type)->block_bytes;
  const int64_t rb = B * bb;
  const auto* in = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t g = 0; g < N / 8; ++g)
    for (int64_t b = 0; b < B; ++b)
      for (int l = 0; l < 8; ++l) get(type, in + (g * B + b) * 8 * bb, l, out + (8 * g + l) * rb + b * bb);
}

void ggml_interleaved_block(uint32_t type, const void* w, int64_t blocks_per_row, int64_t n, int64_t b, uint8_t* out) {
  const int64_t bb = block_bytes_of(type);
  const auto* octet = static_cast<const uint8_t*>(w) + ((n / 8) * blocks_per_row + b) * 8 * bb;
  get(type, octet, static_cast<int>(n % 8), out);
}

}  // namespace cider::quant
