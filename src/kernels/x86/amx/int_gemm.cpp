// W8A8 and W4A8 GEMM (M > 1) on AMX-INT8 tiles, used by the avx512 table when the CPU has AMX-TILE + AMX-INT8 and
// the OS grants the tile state (kernels/kernel_table.cpp; CIDER_NO_AMX=1 turns it off). Contract: IntLinearArgs;
// references: ref/w8a8_ref.cpp, ref/w4a8_ref.cpp. Compiled with the avx512 flags plus -mamx-tile -mamx-int8.
//
// Front as the AVX-512 VNNI GEMM: tokens quantized in parallel to int8 codes xq [Mp, Kp] (rows past M and codes
// past K zero). Per 64-column panel, the weights of the whole K are packed once as SIGNED bytes in the AMX B-tile
// layout [Kp/4][64 columns][4] (int4: the signed code q), reused by every token. tdpbssd multiplies signed by
// signed bytes, so no offset correction is needed. Per 32 tokens x 32 columns, four 16x16 int32 C tiles accumulate
// over K (per channel) or over one group, then are stored and flushed exactly as the VNNI kernel does:
// C[m, n] += fl(sw[g, n]·float(acc_g)) per group, int32 sums per channel; y = sx[m]·C + bias (per channel:
// sx·fl(sw·float(acc)) + bias). Group sizes must be multiples of 64 (int4 group 32 uses the VNNI kernel).
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include "kernels/x86/amx/tile_config.h"
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::amx {

using avx512::imin;
using avx512::mask16;
using avx512::mask64;
using avx512::round_up;

namespace {

constexpr int64_t kNR = 64;  // columns per panel
constexpr int64_t kMB = 32;  // tokens per tile block (two 16-row A tiles)

struct Gemm {
  const IntLinearArgs* a;
  bool int4;
  int8_t* xq;  // [Mp, Kp]
  int64_t Mp, Kp;
  float* sx;   // [M]
  int64_t span;
};

// Packs weight rows n0..n0+63 (past N: the last row), all of K, as signed bytes [Kp/4][64][4].
void pack_panel(const Gemm& c, int64_t n0, int8_t* out) {
  const IntLinearArgs& a = *c.a;
  for (int64_t j = 0; j < kNR / 16; ++j) {
    const uint8_t* rows[16];
    for (int r = 0; r < 16; ++r) {
      const int64_t n = imin(n0 + j * 16 + r, a.N - 1);
      rows[r] = static_cast<const uint8_t*>(a.w) + n * (c.int4 ? a.K / 2 : a.K);
    }
    for (int64_t k = 0; k < c.Kp; k += 64) {
      __m512i v[16];
      if (!c.int4) {
        const __mmask64 m = mask64(a.K - k);
        for (int r = 0; r < 16; ++r) v[r] = _mm512_maskz_loadu_epi8(m, rows[r] + k);
      } else {
        const __mmask32 m = static_cast<__mmask32>(mask64(a.K / 2 - k / 2));
        const __m512i eight = _mm512_set1_epi8(8);
        const __mmask64 valid = mask64(a.K - k);
        for (int r = 0; r < 16; ++r) {
          const __m512i t = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, rows[r] + k / 2));
          const __m512i nib = _mm512_or_si512(_mm512_and_si512(t, _mm512_set1_epi16(0x000f)),
                                              _mm512_and_si512(_mm512_slli_epi16(t, 4), _mm512_set1_epi16(0x0f00)));
          v[r] = _mm512_maskz_sub_epi8(valid, nib, eight);  // q = nibble − 8; 0 past K
        }
      }
      avx512::transpose16x16(v);
      for (int i = 0; i < 16; ++i) _mm512_store_si512(out + ((k / 4 + i) * kNR + j * 16) * 4, v[i]);
    }
  }
}

// C tile (16 x 16 int32, row stride 64 B) flushed into the float tile cf (row stride kNR floats): += sw·float(acc).
void flush_group(const int32_t* t, const float* sw, __mmask16 cm, float* cf) {
  const __m512 s = _mm512_maskz_loadu_ps(cm, sw);
  for (int r = 0; r < 16; ++r) {
    float* p = cf + r * kNR;
    _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_load_si512(t + r * 16)))));
  }
}

void run_panels(void* ctx, int64_t p0, int64_t p1) {
  const Gemm& c = *static_cast<const Gemm*>(ctx);
  const IntLinearArgs& a = *c.a;
  const bool grouped = a.group_size != 0;
  load_uniform_config();  // tmm0-3: C (16 x 16 int32), tmm4-5: A (16 x 64 B), tmm6-7: B (16 x 64 B)
  int8_t* packed = static_cast<int8_t*>(scratch(1, static_cast<size_t>(c.Kp * kNR)));
  void* tile_buf = scratch(2, static_cast<size_t>(c.Mp * kNR * 4));
  alignas(64) int32_t tmp[4][16 * 16];
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kNR, cols = imin(kNR, a.N - n0);
    pack_panel(c, n0, packed);
    __asm__ volatile("" ::: "memory");  // the pack's stores before the tile loads
    std::memset(tile_buf, 0, static_cast<size_t>(c.Mp * kNR * 4));
    for (int64_t m0 = 0; m0 < c.Mp; m0 += kMB) {
      const int8_t* A0 = c.xq + m0 * c.Kp;
      const int8_t* A1 = A0 + 16 * c.Kp;
      for (int64_t nh = 0; nh < kNR; nh += 32) {
        if (nh >= cols) break;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t k = 0; k < c.Kp; k += 64) {
          _tile_loadd(4, A0 + k, c.Kp);
          _tile_loadd(5, A1 + k, c.Kp);
          _tile_loadd(6, packed + (k / 4) * kNR * 4 + nh * 4, kNR * 4);
          _tile_loadd(7, packed + (k / 4) * kNR * 4 + (nh + 16) * 4, kNR * 4);
          _tile_dpbssd(0, 4, 6);
          _tile_dpbssd(1, 4, 7);
          _tile_dpbssd(2, 5, 6);
          _tile_dpbssd(3, 5, 7);
          if (grouped && (k + 64) % c.span == 0) {
            const int64_t g = k / c.span;
            _tile_stored(0, tmp[0], 64);
            _tile_stored(1, tmp[1], 64);
            _tile_stored(2, tmp[2], 64);
            _tile_stored(3, tmp[3], 64);
            __asm__ volatile("" ::: "memory");  // GCC's tile macros have no memory operands: the stores before the loads
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            float* cf = static_cast<float*>(tile_buf) + m0 * kNR + nh;
            const float* sw = a.w_scales + g * a.N + n0 + nh;
            const __mmask16 c0 = mask16(cols - nh), c1 = mask16(cols - nh - 16);
            flush_group(tmp[0], sw, c0, cf);
            flush_group(tmp[1], sw + 16, c1, cf + 16);
            flush_group(tmp[2], sw, c0, cf + 16 * kNR);
            flush_group(tmp[3], sw + 16, c1, cf + 16 * kNR + 16);
          }
        }
        if (!grouped) {
          int32_t* ci = static_cast<int32_t*>(tile_buf) + m0 * kNR + nh;
          _tile_stored(0, ci, kNR * 4);
          _tile_stored(1, ci + 16, kNR * 4);
          _tile_stored(2, ci + 16 * kNR, kNR * 4);
          _tile_stored(3, ci + 16 * kNR + 16, kNR * 4);
          __asm__ volatile("" ::: "memory");
        }
      }
    }
    for (int64_t m = 0; m < a.M; ++m) {
      const __m512 sx = _mm512_set1_ps(c.sx[m]);
      for (int j = 0; j < 4 && j * 16 < cols; ++j) {
        const int64_t n = n0 + j * 16;
        const __mmask16 cm = mask16(cols - j * 16);
        __m512 y;
        if (grouped) {
          y = _mm512_mul_ps(sx, _mm512_load_ps(static_cast<float*>(tile_buf) + m * kNR + j * 16));
        } else {
          const __m512i t = _mm512_load_si512(static_cast<int32_t*>(tile_buf) + m * kNR + j * 16);
          y = _mm512_mul_ps(sx, _mm512_mul_ps(_mm512_maskz_loadu_ps(cm, a.w_scales + n), _mm512_cvtepi32_ps(t)));
        }
        if (a.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(cm, a.bias + n));
        avx512::store16(a.out, a.out_dtype, m * a.N + n, y, cm);
      }
    }
  }
  _tile_release();
}

void quantize_rows(void* ctx, int64_t m0, int64_t m1) {
  const Gemm& c = *static_cast<const Gemm*>(ctx);
  const IntLinearArgs& a = *c.a;
  const int64_t row_bytes = a.K * (a.x_dtype == DType::kF32 ? 4 : 2);
  for (int64_t m = m0; m < m1; ++m)
    c.sx[m] = avx512::quantize_row(static_cast<const uint8_t*>(a.x) + m * row_bytes, a.x_dtype, a.K, c.Kp,
                                   c.xq + m * c.Kp);
}

void int_gemm(const IntLinearArgs& a, bool int4) {
  const int64_t Kp = round_up(a.K, 64), Mp = round_up(a.M, kMB);
  uint8_t* front = static_cast<uint8_t*>(scratch(0, static_cast<size_t>(Mp * Kp + 4 * a.M)));
  Gemm c{&a, int4, reinterpret_cast<int8_t*>(front), Mp, Kp, reinterpret_cast<float*>(front + Mp * Kp),
         a.group_size == 0 ? a.K : a.group_size};
  std::memset(front + a.M * Kp, 0, static_cast<size_t>((Mp - a.M) * Kp));  // padding tokens: codes 0
  parallel_chunks(a.M, &quantize_rows, &c);
  parallel_chunks((a.N + kNR - 1) / kNR, &run_panels, &c);
}

}  // namespace

bool request_tile_permission() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

bool handles(const IntLinearArgs& a) {
  return a.M > 1 && a.N > 0 && a.K > 0 && (a.group_size == 0 || a.group_size % 64 == 0);
}

void w8a8_gemm(const IntLinearArgs& a) {
  if (!handles(a)) return avx512::w8a8_gemm(a);
  int_gemm(a, false);
}

void w4a8_gemm(const IntLinearArgs& a) {
  if (!handles(a)) return avx512::w4a8_gemm(a);
  int_gemm(a, true);
}

}  // namespace cider::kernels::x86::amx
