// W8A8 and W4A8 GEMM (M > 1), AVX-512 VNNI. Contract: IntLinearArgs (kernels/kernel_table.h); references:
// ref/w8a8_ref.cpp, ref/w4a8_ref.cpp.
//
// Front: every token is quantized (in parallel over rows) to int8 codes xq [M, Kp] (zero past K) with its scale
// sx[m], and offset·Σ_{k∈g} xq per (token, group) is kept for the unsigned/signed correction (below).
// Main loop, per thread over 64-column panels of the output:
//   for each K chunk (one group, or 256 values per channel): the chunk of 64 weight rows is packed into
//   [chunk/4][64 columns][4 bytes] as UNSIGNED bytes — int8: w + 128 (xor 0x80); int4: the stored nibble q + 8 —
//   so one 64-byte vector holds 4 consecutive k of 16 columns. A 6x64 tile (24 zmm accumulators) then runs
//   vpdpbusd(acc, packed weights, 4 activation codes broadcast): Σ (w + off)·x, and off·Σx is subtracted
//   (the accumulators start at −off·Σ_{k∈g} x). Exact int32 (wrapping, with an exact result).
//   Per group, the tile is flushed in the reference's float order: C[m, n] += fl(sw[g, n] · float(acc_g));
//   per channel, the int32 sums are added across chunks and converted once at the end.
// Epilogue: y = sx[m] · C[m, n] + bias[n] (per channel: sx[m] · fl(sw[n] · float(acc)) + bias[n]), stored in
// out_dtype. The packing is done once per panel and chunk and reused by all M rows, so its cost is ~1/M of the
// arithmetic.
#include <cstring>

#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int kMR = 6;              // tokens per tile (the tile function names its 6 rows)
constexpr int64_t kNR = 64;         // output channels per panel (4 zmm)
constexpr int64_t kChunkPerChannel = 256;

struct Gemm {
  const IntLinearArgs* a;
  bool int4;
  int8_t* xq;     // [M, Kp], written by the front
  int64_t Kp;
  float* sx;      // [M]
  int32_t* corr;  // [M, G] off·Σ_{k∈g} xq, mod 2^32
  int64_t span, G, chunk;
  const int8_t* zero_row;  // [Kp] zeros: the A rows of a tile past M
};

// Packs weight rows n0..n0+63 (rows past N repeat row N-1), k in [k0, k0 + kc), into out [kc4/4][64][4] unsigned
// bytes, kc4 = kc rounded up to 64 (bytes past K: 0x80 for int8, 0 for int4; they meet activation codes 0).
void pack_panel(const Gemm& c, int64_t n0, int64_t k0, int64_t kc, uint8_t* out) {
  const IntLinearArgs& a = *c.a;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = 0; j < kNR / 16; ++j) {
    const uint8_t* rows[16];
    for (int r = 0; r < 16; ++r) {
      const int64_t n = imin(n0 + j * 16 + r, a.N - 1);
      rows[r] = static_cast<const uint8_t*>(a.w) + n * (c.int4 ? a.K / 2 : a.K);
    }
    for (int64_t kb = 0; kb < kc; kb += 64) {
      const int64_t k = k0 + kb;
      __m512i v[16];
      if (!c.int4) {
        const __mmask64 m = mask64(a.K - k);
        for (int r = 0; r < 16; ++r) v[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, rows[r] + k), flip);
      } else {
        const __mmask32 m = static_cast<__mmask32>(mask64(a.K / 2 - k / 2));
        for (int r = 0; r < 16; ++r) {
          // 32 packed bytes → 64 codes in element order: u16 lane i = (byte & 0xf) | (byte >> 4) << 8.
          const __m512i t = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, rows[r] + k / 2));
          v[r] = _mm512_or_si512(_mm512_and_si512(t, _mm512_set1_epi16(0x000f)),
                                 _mm512_and_si512(_mm512_slli_epi16(t, 4), _mm512_set1_epi16(0x0f00)));
        }
      }
      transpose16x16(v);  // v[i] = bytes 4i..4i+3 of the 16 rows
      for (int i = 0; i < 16; ++i) _mm512_store_si512(out + ((kb / 4 + i) * kNR + j * 16) * 4, v[i]);
    }
  }
}

static inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Flushes one row of the tile: group mode (cf): C[0..64) += sw · float(acc); channel mode: C_int[0..64) += acc.
static inline void flush_row(__m512i c0, __m512i c1, __m512i c2, __m512i c3, const __m512* sw, float* cf, int32_t* ci) {
  const __m512i c[4] = {c0, c1, c2, c3};
  for (int j = 0; j < 4; ++j) {
    if (cf) {
      float* p = cf + j * 16;
      _mm512_store_ps(p, _mm512_add_ps(_mm512_load_ps(p), _mm512_mul_ps(sw[j], _mm512_cvtepi32_ps(c[j]))));
    } else {
      int32_t* p = ci + j * 16;
      _mm512_store_si512(p, _mm512_add_epi32(_mm512_load_si512(p), c[j]));
    }
  }
}

// One 6 x 64 tile over `steps` groups of 4 k (rows m >= mr read `zero_row` and are not flushed). The 24
// accumulators are named variables so the compiler keeps them in registers. Group mode (cf != nullptr): the
// accumulators start at −corr (the off·Σx correction) and are flushed as C[m] += sw · float(acc); channel mode:
// added to the int32 tile ci.
void tile(int mr, const int8_t* A, int64_t lda, const int8_t* zero_row, const uint8_t* B, int64_t steps,
          const int32_t* corr, int64_t corr_stride, const float* sw, const __mmask16* cmask, float* cf, int32_t* ci) {
  const int8_t* a0 = A;
  const int8_t* a1 = mr > 1 ? A + lda : zero_row;
  const int8_t* a2 = mr > 2 ? A + 2 * lda : zero_row;
  const int8_t* a3 = mr > 3 ? A + 3 * lda : zero_row;
  const int8_t* a4 = mr > 4 ? A + 4 * lda : zero_row;
  const int8_t* a5 = mr > 5 ? A + 5 * lda : zero_row;
#define CIDER_INIT_ROW(m)                                                                                \
  const __m512i i##m = (cf && m < mr) ? _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(corr[m * corr_stride])) \
                                     : _mm512_setzero_si512();                                                  \
  __m512i c##m##0 = i##m, c##m##1 = i##m, c##m##2 = i##m, c##m##3 = i##m;
  CIDER_INIT_ROW(0)
  CIDER_INIT_ROW(1)
  CIDER_INIT_ROW(2)
  CIDER_INIT_ROW(3)
  CIDER_INIT_ROW(4)
  CIDER_INIT_ROW(5)
#undef CIDER_INIT_ROW
  for (int64_t s = 0; s < steps; ++s) {
    const uint8_t* b = B + s * 256;
    const __m512i b0 = _mm512_load_si512(b), b1 = _mm512_load_si512(b + 64);
    const __m512i b2 = _mm512_load_si512(b + 128), b3 = _mm512_load_si512(b + 192);
#define CIDER_ROW(m)                                                \
  {                                                                 \
    const __m512i x = _mm512_set1_epi32(load_i32(a##m + 4 * s));    \
    c##m##0 = _mm512_dpbusd_epi32(c##m##0, b0, x);                  \
    c##m##1 = _mm512_dpbusd_epi32(c##m##1, b1, x);                  \
    c##m##2 = _mm512_dpbusd_epi32(c##m##2, b2, x);                  \
    c##m##3 = _mm512_dpbusd_epi32(c##m##3, b3, x);                  \
  }
    CIDER_ROW(0)
    CIDER_ROW(1)
    CIDER_ROW(2)
    CIDER_ROW(3)
    CIDER_ROW(4)
    CIDER_ROW(5)
#undef CIDER_ROW
  }
  __m512 s[4];
  if (cf)
    for (int j = 0; j < 4; ++j) s[j] = _mm512_maskz_loadu_ps(cmask[j], sw + j * 16);
  flush_row(c00, c01, c02, c03, s, cf, ci);
  if (mr > 1) flush_row(c10, c11, c12, c13, s, cf ? cf + kNR : nullptr, ci ? ci + kNR : nullptr);
  if (mr > 2) flush_row(c20, c21, c22, c23, s, cf ? cf + 2 * kNR : nullptr, ci ? ci + 2 * kNR : nullptr);
  if (mr > 3) flush_row(c30, c31, c32, c33, s, cf ? cf + 3 * kNR : nullptr, ci ? ci + 3 * kNR : nullptr);
  if (mr > 4) flush_row(c40, c41, c42, c43, s, cf ? cf + 4 * kNR : nullptr, ci ? ci + 4 * kNR : nullptr);
  if (mr > 5) flush_row(c50, c51, c52, c53, s, cf ? cf + 5 * kNR : nullptr, ci ? ci + 5 * kNR : nullptr);
}

void run_panels(void* ctx, int64_t p0, int64_t p1) {
  const Gemm& c = *static_cast<const Gemm*>(ctx);
  const IntLinearArgs& a = *c.a;
  const bool grouped = a.group_size != 0;
  uint8_t* packed = static_cast<uint8_t*>(scratch(1, static_cast<size_t>(round_up(c.chunk, 64) * kNR)));
  void* tile_buf = scratch(2, static_cast<size_t>(a.M * kNR * 4));
  float* cf = grouped ? static_cast<float*>(tile_buf) : nullptr;
  int32_t* ci = grouped ? nullptr : static_cast<int32_t*>(tile_buf);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kNR, cols = imin(kNR, a.N - n0);
    __mmask16 cmask[4];
    for (int j = 0; j < 4; ++j) cmask[j] = mask16(cols - j * 16);
    std::memset(tile_buf, 0, static_cast<size_t>(a.M * kNR * 4));
    for (int64_t k0 = 0, g = 0; k0 < a.K; k0 += c.chunk, ++g) {
      const int64_t kc = imin(c.chunk, a.K - k0);
      pack_panel(c, n0, k0, kc, packed);
      const int64_t steps = (kc + 3) / 4;
      const float* sw = grouped ? a.w_scales + g * a.N + n0 : nullptr;
      for (int64_t m0 = 0; m0 < a.M; m0 += kMR) {
        const int mr = static_cast<int>(imin(kMR, a.M - m0));
        tile(mr, c.xq + m0 * c.Kp + k0, c.Kp, c.zero_row, packed, steps, grouped ? c.corr + m0 * c.G + g : nullptr,
             c.G, sw, cmask, cf ? cf + m0 * kNR : nullptr, ci ? ci + m0 * kNR : nullptr);
      }
    }
    for (int64_t m = 0; m < a.M; ++m) {
      const __m512 sx = _mm512_set1_ps(c.sx[m]);
      for (int j = 0; j < 4 && j * 16 < cols; ++j) {
        const int64_t n = n0 + j * 16;
        __m512 y;
        if (grouped) {
          y = _mm512_mul_ps(sx, _mm512_load_ps(cf + m * kNR + j * 16));
        } else {
          const __m512i t = _mm512_sub_epi32(_mm512_load_si512(ci + m * kNR + j * 16), _mm512_set1_epi32(c.corr[m]));
          y = _mm512_mul_ps(sx, _mm512_mul_ps(_mm512_maskz_loadu_ps(cmask[j], a.w_scales + n), _mm512_cvtepi32_ps(t)));
        }
        if (a.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(cmask[j], a.bias + n));
        store16(a.out, a.out_dtype, m * a.N + n, y, cmask[j]);
      }
    }
  }
}

void quantize_rows(void* ctx, int64_t m0, int64_t m1) {
  const Gemm& c = *static_cast<const Gemm*>(ctx);
  const IntLinearArgs& a = *c.a;
  const int64_t row_bytes = a.K * (a.x_dtype == DType::kF32 ? 4 : 2);
  const int32_t off = c.int4 ? 8 : 128;
  for (int64_t m = m0; m < m1; ++m) {
    int8_t* q = c.xq + m * c.Kp;
    c.sx[m] = quantize_row(static_cast<const uint8_t*>(a.x) + m * row_bytes, a.x_dtype, a.K, c.Kp, q);
    for (int64_t g = 0; g < c.G; ++g)
      c.corr[m * c.G + g] =
          static_cast<int32_t>(static_cast<uint32_t>(off * sum_i8(q + g * c.span, c.span)));
  }
}

void int_gemm(const IntLinearArgs& a, bool int4) {
  const int64_t Kp = round_up(a.K, 64);
  const int64_t span = a.group_size == 0 ? a.K : a.group_size, G = a.K / span;
  const int64_t front_bytes = a.M * Kp + 4 * a.M + 4 * a.M * G;
  uint8_t* front = static_cast<uint8_t*>(scratch(0, static_cast<size_t>(round_up(front_bytes, 64) + Kp)));
  int8_t* zero_row = reinterpret_cast<int8_t*>(front + round_up(front_bytes, 64));
  for (int64_t k = 0; k < Kp; k += 64) _mm512_store_si512(zero_row + k, _mm512_setzero_si512());
  Gemm c{&a, int4, reinterpret_cast<int8_t*>(front), Kp, reinterpret_cast<float*>(front + a.M * Kp),
         reinterpret_cast<int32_t*>(front + a.M * Kp + 4 * a.M), span, G,
         a.group_size == 0 ? kChunkPerChannel : a.group_size, zero_row};
  parallel_chunks(a.M, &quantize_rows, &c);
  parallel_chunks((a.N + kNR - 1) / kNR, &run_panels, &c);
}

}  // namespace

void w8a8_gemm(const IntLinearArgs& a) {
  if (a.K == 0 || a.N == 0 || a.M == 0) return ref::w8a8_gemm(a);
  int_gemm(a, false);
}

void w4a8_gemm(const IntLinearArgs& a) {
  if (a.K == 0 || a.N == 0 || a.M == 0) return ref::w4a8_gemm(a);
  int_gemm(a, true);
}

}  // namespace cider::kernels::x86::avx512
