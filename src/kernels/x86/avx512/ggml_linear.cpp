// Linear layer over native GGUF weights, AVX-512 VNNI, for M >= kFromM activation rows (prefill); fewer rows go to
// avx512/ggml_linear_gemv.cpp (Q4_K, Q5_K, Q6_K) or the AVX2 kernel (avx2/ggml_linear.cpp). Contract: GgmlLinearArgs (kernels/kernel_table.h); reference:
// ref/ggml_linear_ref.cpp.
//
// Activations: as the AVX2 kernel, each row quantized per 32 elements ("piece") to int8 with step dx = max|x|/127 of
// the piece (quantize_row: bit for bit the AVX2 kernel's codes and steps), padded with zeros to Kp (K rounded up to
// 32): the codes, dx, −128·Σ codes per 16 and per 32, and dx·Σ codes per piece (the offsets' term), stored chunk-major
// (a K chunk's rows contiguous: rows Kp apart would alias in L1 and L2).
// Weights: every block unpacked to its integer form w_i = a_h·c_i + b_h (quant/ggml_blocks.h; the AVX2 kernel's
// unpacking: avx2/ggml_pieces.h) and packed once per K chunk of kKC and pair of 16-row
// blocks (32 rows) into the layout [k/4][16 rows][4 bytes] of u = c + 128 (unsigned), with per piece the 16 rows'
// scales a (per half for Q6_K) and offsets b: the unpacking is paid once per weight, not per activation row.
// A tile, 32 weight rows (2 × 16 lanes) × kT activation rows: per piece and half, vpdpbusd of the u vectors with the
// activation's 4 codes broadcast, from the accumulator −128·Σx (so the int32 lane is exactly Σ c·x of its row), then
// one float step per 16-row vector and activation row, y += float(S)·(a·dx), and for offset formats y += b·(dx·Σx):
//   y = Σ_pieces (a_h·dx)·S_h + b·X + bias, within the int8-activation bound of GgmlLinearArgs.
// Loops: threads split N in chunks of 32 rows (x86::parallel_chunks); each thread takes its rows in blocks whose
// M × block outputs fit in L2 (kBlockOut), runs K chunks over a block, packs each 32-row pair of it into its scratch
// (stays in L1) and sweeps every activation tile over it, adding the 16-lane sums to the worker's contiguous
// accumulators [pair][M][32] (output rows N apart would alias), copied out with the bias after the block's last K
// chunk. Per output the float sums are the same, in the same order, whatever the blocking.
#include <algorithm>
#include <cstring>

#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86::avx512 {

namespace {

constexpr int64_t kFromM = 16;        // fewer activation rows: the AVX2 kernel (GEMV-shaped)
constexpr int kT = 4;                  // activation rows per tile (× 32 weight rows)
constexpr int64_t kKC = 512;           // K chunk (a multiple of 256): a packed 32-row pair stays in L1
constexpr int64_t kPC = kKC / 32;      // pieces per K chunk
constexpr int64_t kRowsPerChunk = 32;  // thread split of N: whole 32-row pairs
constexpr int64_t kBlockOut = 256 << 10;  // bytes of output rows a thread keeps in L2 over the K chunks (M × block)
constexpr int64_t kBlockN = 1024;         // at most this many N rows per block

// Packed bytes per piece of a 32-row pair: u of both 16-row blocks, [k/4][16][4]; the scales a per half; b (per
// half for Q2_K).
constexpr int64_t piece_bytes(quant::GgmlType t) { return 1024 + 128 * halves_of(t) + 128 * b_halves_of(t); }

struct Ctx {
  const GgmlLinearArgs* a;
  int block_size, block_bytes;
  int64_t Kp, Mp;
  int8_t* xq;     // [Kp/kKC chunks][Mp][kKC] codes
  int32_t* xc16;  // [chunks][Mp][kPC][2] −128·Σ of each 16 codes
  int32_t* xc32;  // [chunks][Mp][kPC] −128·Σ of each piece's codes
  float* dx;      // [chunks][Mp][kPC] steps
  float* xsum;    // [chunks][Mp][kPC] dx·Σ of each piece's codes
  float* xsum16;  // [chunks][Mp][kPC][2] dx·Σ of each 16 codes (offsets per half: Q2_K)
};

// Activation rows [m0, m1): codes, steps and sums (rows past M and elements past K: zeros).
void quantize_rows(void* vctx, int64_t m0, int64_t m1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  const GgmlLinearArgs& a = *c.a;
  const int64_t P = a.K / 32, Pp = c.Kp / 32;
  for (int64_t m = m0; m < m1; ++m) {
    const int64_t valid = m < a.M ? P : 0;
    for (int64_t p = 0; p < Pp; ++p) {
      int8_t* q = c.xq + (p / kPC * c.Mp + m) * kKC + p % kPC * 32;
      float step = 0.0f;
      int s0 = 0, s1 = 0;
      if (p < valid) {
        step = quantize_piece32(a.x + m * a.K + p * 32, q, &s0, &s1);
      } else {
        std::memset(q, 0, 32);
      }
      const int64_t i = (p / kPC * c.Mp + m) * kPC + p % kPC;
      c.xc16[i * 2] = -128 * s0;
      c.xc16[i * 2 + 1] = -128 * s1;
      c.xc32[i] = -128 * (s0 + s1);
      c.dx[i] = step;
      c.xsum[i] = step * static_cast<float>(s0 + s1);
      c.xsum16[i * 2] = step * static_cast<float>(s0);
      c.xsum16[i * 2 + 1] = step * static_cast<float>(s1);
    }
  }
}

// Packs weight rows n0 .. n0 + 31 (rows past nv repeat row nv − 1), elements [k0, k0 + kc) (past K: zeros).
template <quant::GgmlType kType>
void pack_pair(const Ctx& c, int64_t n0, int nv, int64_t k0, int64_t kc, uint8_t* dst) {
  constexpr int kPieces = pieces_of(kType), kH = halves_of(kType);
  constexpr int64_t PB = piece_bytes(kType);
  const GgmlLinearArgs& a = *c.a;
  const int64_t kend = imin(k0 + kc, a.K);
  const int64_t valid = kend > k0 ? (kend - k0) / 32 : 0;
  if (valid < kc / 32) std::memset(dst + valid * PB, 0, static_cast<size_t>((kc / 32 - valid) * PB));
  Piece pc[8];
  alignas(32) uint32_t u[8];
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int r = 0; r < 32; ++r) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + (n0 + (r < nv ? r : nv - 1)) * a.row_bytes;
    const int cb = r / 16, lane = r % 16;
    {  // the row's bytes of the next K chunk, fetched while this chunk is multiplied (32 short row streams)
      const int64_t nb = imin(k0 + 2 * kc, a.K) / c.block_size, b_next = imin(k0 + kc, a.K) / c.block_size;
      for (int64_t off = b_next * c.block_bytes; off < nb * c.block_bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + off), _MM_HINT_T1);
    }
    for (int64_t b0 = 0; b0 < valid; b0 += kPieces) {
      uint8_t tmp[quant::kGgmlInterleavedBlockMax];  // an interleaved row's block, back in the file's layout
      unpack_block<kType>(row_block<kType>(w, c.block_bytes, a.interleaved, a.w, a.K, n0 + (r < nv ? r : nv - 1),
                                           (k0 + b0 * 32) / c.block_size, tmp), pc);
      for (int j = 0; j < kPieces; ++j) {
        uint8_t* pp = dst + (b0 + j) * PB;
        _mm256_store_si256(reinterpret_cast<__m256i*>(u), _mm256_xor_si256(pc[j].c, flip));
        for (int e = 0; e < 8; ++e) std::memcpy(pp + cb * 512 + e * 64 + lane * 4, &u[e], 4);
        float* ws = reinterpret_cast<float*>(pp + 1024) + cb * 16 + lane;
        ws[0] = pc[j].a0;
        if constexpr (kH == 2) ws[32] = pc[j].a1;
        if constexpr (has_b(kType)) {
          float* bs = reinterpret_cast<float*>(pp + 1024 + 128 * kH) + cb * 16 + lane;
          bs[0] = pc[j].b0;
          if constexpr (b_per_half(kType)) bs[32] = pc[j].b1;
        }
      }
    }
  }
}

// One tile: a packed 32-row pair × kT activation rows from m0, over `pieces` pieces from element k0; adds the sums
// to the pair's accumulators acc [M][32] (first chunk: writes them).
template <quant::GgmlType kType>
void tile(const Ctx& c, const uint8_t* pk, int64_t pieces, int64_t k0, int64_t m0, float* acc, bool first) {
  constexpr int kH = halves_of(kType), kDw = 8 / kH;
  constexpr int64_t PB = piece_bytes(kType);
  const GgmlLinearArgs& a = *c.a;
  const int64_t s0 = (k0 / kKC * c.Mp + m0) * kPC;  // row m0's piece scalars of this chunk (row m0 + t: + t·kPC)
  __m512 af[2][kT];
  for (int t = 0; t < kT; ++t) af[0][t] = af[1][t] = _mm512_setzero_ps();
  const int8_t* xq = c.xq + k0 / kKC * c.Mp * kKC + m0 * kKC;
  for (int64_t p = 0; p < pieces; ++p) {
    const uint8_t* pp = pk + p * PB;
    const int64_t g = s0 + p;
    for (int h = 0; h < kH; ++h) {
      __m512i ai[2][kT];
      for (int t = 0; t < kT; ++t) {
        const int32_t init = kH == 2 ? c.xc16[(g + t * kPC) * 2 + h] : c.xc32[g + t * kPC];
        ai[0][t] = ai[1][t] = _mm512_set1_epi32(init);
      }
      for (int e = 0; e < kDw; ++e) {
        const int dw = h * kDw + e;
        const __m512i w0 = _mm512_load_si512(reinterpret_cast<const void*>(pp + dw * 64));
        const __m512i w1 = _mm512_load_si512(reinterpret_cast<const void*>(pp + 512 + dw * 64));
        for (int t = 0; t < kT; ++t) {
          int32_t xd;
          std::memcpy(&xd, xq + t * kKC + p * 32 + dw * 4, 4);
          const __m512i xb = _mm512_set1_epi32(xd);
          ai[0][t] = _mm512_dpbusd_epi32(ai[0][t], w0, xb);
          ai[1][t] = _mm512_dpbusd_epi32(ai[1][t], w1, xb);
        }
      }
      const __m512 ws0 = _mm512_load_ps(reinterpret_cast<const float*>(pp + 1024 + h * 128));
      const __m512 ws1 = _mm512_load_ps(reinterpret_cast<const float*>(pp + 1024 + h * 128 + 64));
      for (int t = 0; t < kT; ++t) {
        const __m512 d = _mm512_set1_ps(c.dx[g + t * kPC]);
        af[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[0][t]), _mm512_mul_ps(ws0, d), af[0][t]);
        af[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[1][t]), _mm512_mul_ps(ws1, d), af[1][t]);
      }
    }
    // b·Σx: b of rows 0-15 (b0) and 16-31 (b1), per piece, or per half with Q2_K (X then each 16 codes' sum).
    for (int h = 0; h < b_halves_of(kType); ++h) {
      const __m512 b0 = _mm512_load_ps(reinterpret_cast<const float*>(pp + 1024 + 128 * kH + 128 * h));
      const __m512 b1 = _mm512_load_ps(reinterpret_cast<const float*>(pp + 1024 + 128 * kH + 128 * h + 64));
      for (int t = 0; t < kT; ++t) {
        const __m512 X = _mm512_set1_ps(b_per_half(kType) ? c.xsum16[(g + t * kPC) * 2 + h] : c.xsum[g + t * kPC]);
        af[0][t] = _mm512_fmadd_ps(b0, X, af[0][t]);
        af[1][t] = _mm512_fmadd_ps(b1, X, af[1][t]);
      }
    }
  }
  const int mt = static_cast<int>(imin(kT, a.M - m0));
  for (int t = 0; t < mt; ++t)
    for (int cb = 0; cb < 2; ++cb) {
      float* o = acc + (m0 + t) * 32 + cb * 16;
      _mm512_store_ps(o, first ? af[cb][t] : _mm512_add_ps(_mm512_load_ps(o), af[cb][t]));
    }
}

template <quant::GgmlType kType>
void rows_of(const Ctx& c, int64_t c0, int64_t c1) {
  const GgmlLinearArgs& a = *c.a;
  const int64_t n_begin = c0 * kRowsPerChunk, n_end = imin(c1 * kRowsPerChunk, a.N);
  uint8_t* pk = static_cast<uint8_t*>(scratch(3, static_cast<size_t>(kKC / 32 * piece_bytes(kType))));
  // Blocks of nb rows: the block's M × nb outputs stay in L2 over the K chunks (each K chunk's activations are
  // read from L3 once per block, then from L2 for the block's other pairs).
  const int64_t nb = std::max<int64_t>(32, imin(kBlockN, kBlockOut / (a.M * 4) / 32 * 32));
  float* acc = static_cast<float*>(scratch(2, static_cast<size_t>(nb * c.Mp) * sizeof(float)));
  for (int64_t b0 = n_begin; b0 < n_end; b0 += nb) {
    const int64_t b1 = imin(b0 + nb, n_end);
    for (int64_t k0 = 0; k0 < c.Kp; k0 += kKC) {
      const int64_t kc = imin(kKC, c.Kp - k0);
      for (int64_t n0 = b0; n0 < b1; n0 += 32) {
        const int nv = static_cast<int>(imin(32, n_end - n0));
        pack_pair<kType>(c, n0, nv, k0, kc, pk);
        for (int64_t m0 = 0; m0 < a.M; m0 += kT) tile<kType>(c, pk, kc / 32, k0, m0, acc + (n0 - b0) * c.Mp, k0 == 0);
      }
    }
    for (int64_t n0 = b0; n0 < b1; n0 += 32) {
      const __mmask16 mk[2] = {mask16(n_end - n0), mask16(n_end - n0 - 16)};
      const float* pa = acc + (n0 - b0) * c.Mp;
      for (int cb = 0; cb < 2; ++cb) {
        if (!mk[cb]) continue;
        const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mk[cb], a.bias + n0 + cb * 16) : _mm512_setzero_ps();
        for (int64_t m = 0; m < a.M; ++m)
          _mm512_mask_storeu_ps(a.out + m * a.N + n0 + cb * 16, mk[cb], _mm512_add_ps(_mm512_load_ps(pa + m * 32 + cb * 16), bias));
      }
    }
  }
}

void rows(void* vctx, int64_t c0, int64_t c1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  // ggml_linear sends only these formats
  with_block_format(static_cast<quant::GgmlType>(c.a->ggml_type), [&]<quant::GgmlType T>() { rows_of<T>(c, c0, c1); });
}

}  // namespace

void ggml_linear(const GgmlLinearArgs& a) {
  // Interleaved rows: fewer than 16 activation rows, or a format or N that cannot be interleaved (the reference's
  // errors), go to the AVX2 entry; the panels below read the blocks back in the file's layout
  if (a.interleaved && (a.M < kFromM || !quant::ggml_interleavable(a.ggml_type) ||
                        a.N % quant::kGgmlInterleaveRows != 0))
    return avx2::ggml_linear(a);
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(a.ggml_type);
  const bool fast = f != nullptr && f->integer_form && a.K > 0 && a.K % f->block_size == 0 &&
                    a.row_bytes == quant::ggml_row_bytes(*f, a.K) && a.N > 0;
  if (fast && a.M > 0 && a.M < kFromM && ggml_linear_gemv_takes(a.ggml_type)) return ggml_linear_gemv(a);
  if (!fast || a.M < kFromM) return avx2::ggml_linear(a);  // also the errors and empty problems
  Ctx c{};
  c.a = &a;
  c.block_size = f->block_size;
  c.block_bytes = f->block_bytes;
  c.Kp = round_up(a.K, 32);  // K is a whole number of blocks (checked above)
  c.Mp = round_up(a.M, kT);
  // The caller's scratch (the workers read it): codes in slot 0, the rest in slot 1; slot 3 is each worker's pack.
  const int64_t Pp = round_up(c.Kp, kKC) / 32;  // pieces, whole chunks
  c.xq = static_cast<int8_t*>(scratch(0, static_cast<size_t>(c.Mp * Pp * 32)));
  int32_t* rest = static_cast<int32_t*>(scratch(1, static_cast<size_t>(c.Mp * Pp * 7) * 4));
  c.xc16 = rest;
  c.xc32 = rest + c.Mp * Pp * 2;
  c.dx = reinterpret_cast<float*>(rest + c.Mp * Pp * 3);
  c.xsum = reinterpret_cast<float*>(rest + c.Mp * Pp * 4);
  c.xsum16 = reinterpret_cast<float*>(rest + c.Mp * Pp * 5);
  parallel_chunks(c.Mp, &quantize_rows, &c);
  parallel_chunks((a.N + kRowsPerChunk - 1) / kRowsPerChunk, &rows, &c);
}


}  // namespace cider::kernels::x86::avx512
