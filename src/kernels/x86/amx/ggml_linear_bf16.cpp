// Linear layer over native GGUF weights for M >= 16 activation rows (prefill) on AMX-BF16 tiles: the avx512 table's
// ggml_linear where the CPU has AMX-TILE + AMX-BF16 + AVX512-BF16 and the OS grants the tile state
// (kernels/kernel_table.cpp; CIDER_NO_AMX=1 turns it off). Fewer rows, or a shape the fast path does not take, go to
// avx512::ggml_linear (the GEMV kernels and the errors). Contract: GgmlLinearArgs (kernels/kernel_table.h);
// reference: ref/ggml_linear_ref.cpp. Compiled with the avx512 flags plus -mamx-tile -mamx-bf16 -mavx512bf16.
//
// Why bfloat16 and not int8 tiles: a GGUF block carries a scale per 32 codes (per 16 for Q6_K) and the int8
// activations one per 32 too, so an int8 tile's exact int32 sums must be scaled in float32 after every 32 codes
// (16 products per output per piece): that epilogue, not the tile multiply, bounded the AMX-INT8 kernel. Here
// both sides are rounded to bfloat16 once — each weight decoded to its float value w = a·c + b (the block's integer
// form, avx2/ggml_pieces.h) and rounded, each activation rounded — and the tiles accumulate in float32 over all of
// K with no epilogue. Error per output: |Σ bf(x)·bf(w) − Σ x·w| <= Σ|x·w|·(2⁻⁷ + 2⁻¹⁶) from the two roundings
// (bfloat16 keeps 8 significant bits: 2⁻⁸ each), plus float32 sums of K products: tests/support/ggml_cases.h
// bf16_product_bound. In the worst case about twice the int8 bound of GgmlLinearArgs (127·2⁻⁷ against 1/2 of a
// step per element); measured on a real model it is 22× closer to the float product than the int8 path
// (docs/quality.md, "Native GGUF weights"). An |x| above bfloat16's largest finite value
// (3.39e38) rounds to infinity.
//
// Layout (the weights are the A operand, so they are packed without a transpose: a 16-row A tile is 16 weight rows
// × 32 K elements, 64 bytes a row):
//   activations: bf16 in the B-tile layout, per 32 K elements and 16 rows m one 1 KiB tile [16 kk][16 m][2]
//                (element k = 2·kk + e), [Kp/32 steps][Mp/16 blocks], rows past M zero — a 16 × 16 dword transpose
//                of each 16 rows × 32 elements, once per call;
//   weights:     per K chunk of kKC and pair of 16-row tiles (32 rows), [kc/32 steps][2 tiles][16 rows][32] bf16,
//                decoded once per weight and call;
//   C tiles:     16 weight rows × 16 activation rows, float32, kept over a K chunk in tiles 0-3 (2 weight tiles × 2
//                activation tiles), added to the pair's accumulators [32 n][Mp] between chunks and transposed into
//                out [M, N] (with the bias) after the last.
// Loops: threads split N in chunks of 32 rows (x86::parallel_chunks); each thread takes its rows in blocks whose
// M × block accumulators fit in L2 (kBlockOut), runs the K chunks over a block, packs each pair of it (stays in L1)
// and sweeps every 32 activation rows over it. Tiles: 0-3 C, 4-5 A (weights), 6-7 B (activations), all 16 × 64 B.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/x86/amx/tile_config.h"
#include "kernels/x86/avx2/ggml_pieces.h"
#include "kernels/x86/avx512/simd.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

namespace cider::kernels::x86::amx {

using avx512::imin;
using avx512::mask16;
using avx512::round_up;

namespace {

constexpr int64_t kFromM = 16;            // fewer activation rows: avx512::ggml_linear (GEMV-shaped kernels)
constexpr int64_t kKC = 512;              // K chunk (a multiple of 256): a packed pair is 32 KiB, in L1
constexpr int64_t kRowsPerChunk = 32;     // thread split of N: whole pairs
constexpr int64_t kBlockOut = 256 << 10;  // bytes of accumulators a thread keeps in L2 over the K chunks
constexpr int64_t kBlockN = 1024;         // at most this many N rows per block
constexpr int64_t kTile = 1024;           // bytes of one 16 × 64 B tile

struct Ctx {
  const GgmlLinearArgs* a;
  int block_size, block_bytes;
  int64_t Kp, Mp;    // K (whole blocks, so whole steps of 32); M rounded up to 16
  uint8_t* xb;       // [Kp/32][Mp/16] B tiles of the activations
};

__attribute__((target("amx-tile"))) void release() { _tile_release(); }

// Activation rows in blocks [b0, b1) of 16: each step's 16 rows × 32 elements as bf16 pairs, transposed into the
// B-tile layout (rows past M: zeros).
void pack_activations(void* vctx, int64_t b0, int64_t b1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  const GgmlLinearArgs& a = *c.a;
  uint8_t* xb = c.xb;
  const int64_t blocks = c.Mp / 16;
  for (int64_t blk = b0; blk < b1; ++blk)
    for (int64_t s = 0; s < c.Kp / 32; ++s) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t m = blk * 16 + i;
        if (m < a.M) {
          const float* x = a.x + m * a.K + s * 32;
          r[i] = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
        } else {
          r[i] = _mm512_setzero_si512();
        }
      }
      avx512::transpose16x16(r);
      uint8_t* dst = xb + (s * blocks + blk) * kTile;
      for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(reinterpret_cast<void*>(dst + kk * 64), r[kk]);
    }
}

// Weight rows n0 .. n0 + 31 (rows past nv repeat row nv − 1), elements [k0, k0 + kc), decoded and rounded to bf16
// into [kc/32][2 tiles][16 rows][32]; the rows' next chunk is prefetched into L2.
template <quant::GgmlType kType>
void pack_weights(const Ctx& c, int64_t n0, int nv, int64_t k0, int64_t kc, uint8_t* dst) {
  constexpr int kPieces = pieces_of(kType);
  const GgmlLinearArgs& a = *c.a;
  const int64_t steps = kc / 32;
  for (int r = 0; r < 32; ++r) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + (n0 + (r < nv ? r : nv - 1)) * a.row_bytes;
    {
      const int64_t nb = imin(k0 + 2 * kc, a.K) / c.block_size, b_next = imin(k0 + kc, a.K) / c.block_size;
      for (int64_t off = b_next * c.block_bytes; off < nb * c.block_bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + off), _MM_HINT_T1);
    }
    uint8_t* row = dst + (r / 16) * kTile + (r % 16) * 64;
    for (int64_t s0 = 0; s0 < steps; s0 += kPieces) {
      Piece pc[8];
      uint8_t tmp[quant::kGgmlInterleavedBlockMax];  // an interleaved row's block, back in the file's layout
      unpack_block<kType>(row_block<kType>(w, c.block_bytes, a.interleaved, a.w, a.K, n0 + (r < nv ? r : nv - 1),
                                           (k0 + s0 * 32) / c.block_size, tmp), pc);
      for (int j = 0; j < kPieces; ++j) {
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(pc[j].c)));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(pc[j].c, 1)));
        const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(hi, _mm512_set1_ps(pc[j].a1), _mm512_set1_ps(pc[j].b1)),
                                               _mm512_fmadd_ps(lo, _mm512_set1_ps(pc[j].a0), _mm512_set1_ps(pc[j].b0)));
        _mm512_store_si512(reinterpret_cast<void*>(row + (s0 + j) * 2 * kTile), reinterpret_cast<__m512i>(v));
      }
    }
  }
}

// C tiles of weight tile w and activation tile b: tmm(2w + b) for the 2 × 2 sweep.
// A packed pair × activation rows [m0, m0 + 16·nb) (nb 1 or 2), over `steps` steps from step s0 (the chunk's first):
// adds to the pair's accumulators acc [32][Mp] (first chunk: writes them).
template <int kNb>
__attribute__((target("amx-tile,amx-bf16"))) void sweep(const Ctx& c, const uint8_t* pk, int64_t steps, int64_t s0,
                                                        int64_t m0, float* acc, bool first) {
  const int64_t blocks = c.Mp / 16, stride = c.Mp * 4;
  float* c00 = acc + m0;           // weight tile 0 (rows 0-15), activation tile 0
  float* c10 = acc + 16 * c.Mp + m0;  // weight tile 1 (rows 16-31)
  if (first) {
    _tile_zero(0);
    _tile_zero(2);
    if constexpr (kNb == 2) {
      _tile_zero(1);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, c00, stride);
    _tile_loadd(2, c10, stride);
    if constexpr (kNb == 2) {
      _tile_loadd(1, c00 + 16, stride);
      _tile_loadd(3, c10 + 16, stride);
    }
  }
  const uint8_t* xb = c.xb + (s0 * blocks + m0 / 16) * kTile;
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, pk + s * 2 * kTile, 64);
    _tile_loadd(5, pk + s * 2 * kTile + kTile, 64);
    _tile_loadd(6, xb + s * blocks * kTile, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if constexpr (kNb == 2) {
      _tile_loadd(7, xb + s * blocks * kTile + kTile, 64);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c00, stride);
  _tile_stored(2, c10, stride);
  if constexpr (kNb == 2) {
    _tile_stored(1, c00 + 16, stride);
    _tile_stored(3, c10 + 16, stride);
  }
}

// The pair's accumulators [32 n][Mp] into out [M, N] rows n0 .. n0 + 31 (those below N), with the bias.
void store_pair(const Ctx& c, const float* acc, int64_t n0) {
  const GgmlLinearArgs& a = *c.a;
  for (int cb = 0; cb < 2; ++cb) {
    const __mmask16 mk = mask16(a.N - n0 - cb * 16);
    if (!mk) continue;
    const __m512 bias = a.bias ? _mm512_maskz_loadu_ps(mk, a.bias + n0 + cb * 16) : _mm512_setzero_ps();
    for (int64_t m0 = 0; m0 < a.M; m0 += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(acc + (cb * 16 + i) * c.Mp + m0);
      avx512::transpose16x16(r);  // r[j]: activation row m0 + j, weight rows n0 + cb·16 + 0..15
      for (int j = 0; j < 16 && m0 + j < a.M; ++j)
        _mm512_mask_storeu_ps(a.out + (m0 + j) * a.N + n0 + cb * 16, mk, _mm512_add_ps(_mm512_castsi512_ps(r[j]), bias));
    }
  }
}

template <quant::GgmlType kType>
void rows_of(const Ctx& c, int64_t c0, int64_t c1) {
  const GgmlLinearArgs& a = *c.a;
  const int64_t n_begin = c0 * kRowsPerChunk, n_end = imin(c1 * kRowsPerChunk, a.N);
  uint8_t* pk = static_cast<uint8_t*>(scratch(3, static_cast<size_t>(kKC / 32 * 2 * kTile)));
  const int64_t nb = std::max<int64_t>(32, imin(kBlockN, kBlockOut / (c.Mp * 4) / 32 * 32));
  float* acc = static_cast<float*>(scratch(2, static_cast<size_t>(nb * c.Mp) * sizeof(float)));
  for (int64_t b0 = n_begin; b0 < n_end; b0 += nb) {
    const int64_t b1 = imin(b0 + nb, n_end);
    for (int64_t k0 = 0; k0 < c.Kp; k0 += kKC) {
      const int64_t kc = imin(kKC, c.Kp - k0);
      for (int64_t n0 = b0; n0 < b1; n0 += 32) {
        pack_weights<kType>(c, n0, static_cast<int>(imin(32, n_end - n0)), k0, kc, pk);
        // the tile loads read what the plain stores of the pack wrote (GCC's tile macros are asm without memory
        // operands: the empty asm's "memory" clobber orders them)
        __asm__ volatile("" ::: "memory");
        float* pa = acc + (n0 - b0) * c.Mp;
        int64_t m0 = 0;
        for (; m0 + 32 <= c.Mp; m0 += 32) sweep<2>(c, pk, kc / 32, k0 / 32, m0, pa, k0 == 0);
        if (m0 < c.Mp) sweep<1>(c, pk, kc / 32, k0 / 32, m0, pa, k0 == 0);
        __asm__ volatile("" ::: "memory");
      }
    }
    for (int64_t n0 = b0; n0 < b1; n0 += 32) store_pair(c, acc + (n0 - b0) * c.Mp, n0);
  }
}

void rows(void* vctx, int64_t c0, int64_t c1) {
  const Ctx& c = *static_cast<const Ctx*>(vctx);
  load_uniform_config();  // per worker: the tile configuration is thread state
  with_block_format(static_cast<quant::GgmlType>(c.a->ggml_type), [&]<quant::GgmlType T>() { rows_of<T>(c, c0, c1); });
  release();
}

}  // namespace

void ggml_linear_bf16(const GgmlLinearArgs& a) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(a.ggml_type);
  const bool fast = f != nullptr && f->integer_form && a.K > 0 && a.K % f->block_size == 0 &&
                    a.row_bytes == quant::ggml_row_bytes(*f, a.K) && a.N > 0 && a.M >= kFromM &&
                    with_block_format(static_cast<quant::GgmlType>(f->type), []<quant::GgmlType>() {}) &&
                    (!a.interleaved || (quant::ggml_interleavable(a.ggml_type) && a.N % quant::kGgmlInterleaveRows == 0));
  if (!fast) return avx512::ggml_linear(a);  // GEMV shapes, the errors and empty problems
  Ctx c{};
  c.a = &a;
  c.block_size = f->block_size;
  c.block_bytes = f->block_bytes;
  c.Kp = a.K;  // whole blocks: whole steps of 32
  c.Mp = round_up(a.M, 16);
  // The caller's scratch (the workers read it); slots 2 and 3 are each worker's accumulators and pack.
  c.xb = static_cast<uint8_t*>(scratch(0, static_cast<size_t>(c.Kp / 32 * c.Mp / 16 * kTile)));
  parallel_chunks(c.Mp / 16, &pack_activations, &c);
  parallel_chunks((a.N + kRowsPerChunk - 1) / kRowsPerChunk, &rows, &c);
}

}  // namespace cider::kernels::x86::amx
