// W8A8 GEMV (M = 1), AVX-512 VNNI. Contract: IntLinearArgs (kernels/kernel_table.h); reference: ref/w8a8_ref.cpp.
//
// Weights stay in their row-major int8 [N, K] layout (docs/formats.md). vpdpbusd multiplies unsigned by signed
// bytes, so the weight bytes are flipped to w + 128 (one xor per vector) and the activation codes stay signed:
//   Σ_k (w + 128)·x = Σ_k w·x + 128·Σ_k x,   so   acc_g = Σ_{k∈g} (w + 128)·x − 128·Σ_{k∈g} x,
// with the 128·Σx of each group computed once per token at the front. int32 arithmetic wraps, and the exact sum
// fits in int32 (the layer's K limits), so acc_g is exact. Blocks of 16 output channels are read together (16 row
// streams), each group's 16 int32 vectors are reduced in one transposed tree, and the float epilogue runs in the
// reference's order: y = sx · Σ_g fl(sw_g · float(acc_g)) + bias — the same float operations as ref::w8a8_gemv.
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int kRows = 16;       // output channels per block
constexpr int64_t kVec = 64;    // int8 codes per vector
constexpr int64_t kPrefetchBytes = 512;  // software prefetch distance along each of the 16 row streams

struct Gemv8 {
  const IntLinearArgs* a;
  const int8_t* xq;     // [Kp] activation codes, zero past K
  const int32_t* corr;  // [G] 128·Σ_{k∈g} xq, mod 2^32
  float sx;
  int64_t span, G;
};

void block(const Gemv8& c, int64_t n0) {
  const IntLinearArgs& a = *c.a;
  const int64_t rows = imin(kRows, a.N - n0);
  const __mmask16 rmask = mask16(rows);
  const int8_t* w[kRows];
  for (int r = 0; r < kRows; ++r) w[r] = static_cast<const int8_t*>(a.w) + (n0 + imin(r, rows - 1)) * a.K;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t g = 0; g < c.G; ++g) {
    const int64_t k0 = g * c.span, k1 = k0 + c.span;
    __m512i acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_si512();
    int64_t k = k0;
    for (; k + kVec <= k1; k += kVec) {
      const __m512i xv = _mm512_loadu_si512(c.xq + k);
      // Prefetch kPrefetchBytes ahead on each row; past the row's end, the same offset in the next block's row.
      const int64_t pf_skip = kPrefetchBytes + (k + kPrefetchBytes >= a.K ? (kRows - 1) * a.K : 0);
      for (int r = 0; r < kRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + k + pf_skip), _MM_HINT_T0);
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_xor_si512(_mm512_loadu_si512(w[r] + k), flip), xv);
      }
    }
    if (k < k1) {  // per-channel tail: bytes past K read as 0 (flipped to 128) meet activation codes 0
      const __mmask64 m = mask64(k1 - k);
      const __m512i xv = _mm512_loadu_si512(c.xq + k);
      for (int r = 0; r < kRows; ++r)
        acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w[r] + k), flip), xv);
    }
    __m512i q[4];
    reduce16_quarters(acc, q);
    const __m512i total = _mm512_sub_epi32(_mm512_add_epi32(_mm512_add_epi32(q[0], q[1]), _mm512_add_epi32(q[2], q[3])),
                                           _mm512_set1_epi32(c.corr[g]));
    const __m512 sw = _mm512_maskz_loadu_ps(rmask, a.w_scales + (a.group_size == 0 ? n0 : g * a.N + n0));
    sum = _mm512_add_ps(sum, _mm512_mul_ps(sw, _mm512_cvtepi32_ps(total)));
  }
  __m512 y = _mm512_mul_ps(_mm512_set1_ps(c.sx), sum);
  if (a.bias) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(rmask, a.bias + n0));
  store16(a.out, a.out_dtype, n0, y, rmask);
}

void run_blocks(void* ctx, int64_t b0, int64_t b1) {
  const Gemv8& c = *static_cast<const Gemv8*>(ctx);
  for (int64_t b = b0; b < b1; ++b) block(c, b * kRows);
}

}  // namespace

void w8a8_gemv(const IntLinearArgs& a) {
  if (a.K == 0 || a.N == 0) return ref::w8a8_gemv(a);
  const int64_t Kp = round_up(a.K, kVec);
  const int64_t span = a.group_size == 0 ? a.K : a.group_size, G = a.K / span;
  int8_t* xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(Kp + 4 * G)));
  int32_t* corr = reinterpret_cast<int32_t*>(xq + Kp);
  const float sx = quantize_row(a.x, a.x_dtype, a.K, Kp, xq);
  for (int64_t g = 0; g < G; ++g)
    corr[g] = static_cast<int32_t>(static_cast<uint32_t>(128 * sum_i8(xq + g * span, span)));
  Gemv8 c{&a, xq, corr, sx, span, G};
  parallel_chunks((a.N + kRows - 1) / kRows, &run_blocks, &c);
}

}  // namespace cider::kernels::x86::avx512
