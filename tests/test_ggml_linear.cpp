// Native GGUF weights: the integer form of every block format against its decoder (quant/ggml_blocks.h), the
// reference kernel against an independent float64 computation, and every ISA level's kernel against the reference
// with the bound of int8 activations (GgmlLinearArgs), on fresh random blocks, shapes with tails, M = 1 and M > 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/kernel_table.h"
#if defined(__x86_64__)
#include "kernels/x86/x86_kernels.h"
#endif
#include "nn/linear_weights.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"
#include "support/ggml_cases.h"
#include "support/test_support.h"

namespace cider {
namespace {

using quant::GgmlType;

using test::throws_code;

using test::kIntegerTypes;
using test::random_blocks;

// Q3_K re-encoded as Q6_K (quant::repack_q3_k_as_q6_k, the loader's path for Q3_K tensors): every value of every
// block decodes bit for bit the same, over random blocks (every scale, code and high bit) and the extremes.
TEST(GgmlBlocks, Q3_KRepackedAsQ6_KDecodesBitForBit) {
  auto rng = test::make_rng(1109);
  const quant::GgmlBlockFormat& q3 = *quant::ggml_block_format(static_cast<uint32_t>(GgmlType::kQ3_K));
  const quant::GgmlBlockFormat& q6 = *quant::ggml_block_format(static_cast<uint32_t>(GgmlType::kQ6_K));
  std::vector<uint8_t> blocks = random_blocks(rng, GgmlType::kQ3_K, 400);
  for (uint8_t fill : {uint8_t{0x00}, uint8_t{0xFF}}) {  // every scale raw 0 or 63, every code −4 or 3
    std::vector<uint8_t> b(static_cast<size_t>(q3.block_bytes), fill);
    b[108] = 0x00;
    b[109] = 0x3C;  // d = 1.0
    blocks.insert(blocks.end(), b.begin(), b.end());
  }
  const int64_t n = static_cast<int64_t>(blocks.size()) / q3.block_bytes;
  std::vector<uint8_t> six(static_cast<size_t>(q6.block_bytes));
  std::vector<float> a(256), b(256);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = blocks.data() + i * q3.block_bytes;
    quant::repack_q3_k_as_q6_k(src, six.data());
    q3.decode(src, a.data());
    q6.decode(six.data(), b.data());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * 256), 0) << "block " << i;
    EXPECT_EQ(quant::ggml_block_finite(q6, six.data()), quant::ggml_block_finite(q3, src));
  }
}

TEST(GgmlBlocks, IntegerFormEqualsTheDecoder) {
  auto rng = test::make_rng(1101);
  for (GgmlType t : kIntegerTypes) {
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
    SCOPED_TRACE(f.name);
    ASSERT_TRUE(f.integer_form);
    const std::vector<uint8_t> blocks = random_blocks(rng, t, 20);
    std::vector<float> y(static_cast<size_t>(f.block_size));
    for (int i = 0; i < 20; ++i) {
      const uint8_t* b = blocks.data() + i * f.block_bytes;
      f.decode(b, y.data());
      for (int p = 0; p < f.block_size / 32; ++p) {
        int8_t c[32];
        float a[2], o[2];
        quant::ggml_piece(t, b, p, c, a, o);
        for (int e = 0; e < 32; ++e) {
          const double w = static_cast<double>(a[e / 16]) * c[e] + o[e / 16];
          // The decoder rounds its (at most two) float32 operations; the integer form is exact in float64.
          const double tol = 2.0 * 0x1p-24 * (std::fabs(static_cast<double>(a[e / 16]) * c[e]) + std::fabs(o[e / 16]));
          ASSERT_LE(std::fabs(w - y[static_cast<size_t>(32 * p + e)]), tol) << "piece " << p << " element " << e;
        }
      }
    }
  }
  // A block's values are finite exactly when its float16 fields are (the loader's check of native weights).
  for (GgmlType t : kIntegerTypes) {
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
    std::vector<uint8_t> b = random_blocks(rng, t, 1);
    EXPECT_TRUE(quant::ggml_block_finite(f, b.data())) << f.name;
    for (int field : f.f16_fields) {
      if (field < 0) continue;
      for (uint16_t bad : {uint16_t{0x7C00}, uint16_t{0xFE00}}) {  // +inf, a NaN
        std::vector<uint8_t> c = b;
        std::memcpy(c.data() + field, &bad, 2);
        EXPECT_FALSE(quant::ggml_block_finite(f, c.data())) << f.name << " field " << field;
        std::vector<float> y(static_cast<size_t>(f.block_size));
        f.decode(c.data(), y.data());
        bool any = false;
        for (float v : y) any = any || !std::isfinite(v);
        EXPECT_TRUE(any) << f.name;  // and the decoder indeed yields a non-finite value
      }
    }
  }
  int8_t c[32];
  float a[2], o[2];
  const std::vector<uint8_t> q3(110, 0);  // Q3_K: re-encoded as Q6_K by the loader, no integer form of its own
  EXPECT_TRUE(throws_code([&] { quant::ggml_piece(GgmlType::kQ3_K, q3.data(), 0, c, a, o); },
                                ErrorCode::kUnsupported, "integer form"));
  EXPECT_EQ(quant::ggml_block_format(1), nullptr);  // F16 is not a block format
}

struct Case {
  GgmlType type;
  int64_t M, N, K;
  bool bias;
  bool interleaved = false;  // the rows 8 at a time (quant/ggml_interleave.h), as the AVX2 level loads them
};

// Whether table t multiplies M activation rows on AMX-BF16 tiles (bfloat16 products, not int8 activations).
bool takes_bf16_tiles(const kernels::KernelTable& t, int64_t M) {
#if defined(__x86_64__)
  return t.ggml_linear == &kernels::x86::amx::ggml_linear_bf16 && M >= 16;
#else
  (void)t;
  (void)M;
  return false;
#endif
}

// The reference's output and the float64 pieces of the bound, computed independently of the kernels.
void run_case(std::mt19937_64& rng, const Case& cs, const std::vector<const kernels::KernelTable*>& tables) {
  const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(cs.type));
  const int64_t row_bytes = quant::ggml_row_bytes(f, cs.K);
  const std::vector<uint8_t> w = random_blocks(rng, cs.type, cs.N * cs.K / f.block_size);
  std::vector<float> x = test::randn(rng, static_cast<size_t>(cs.M * cs.K));
  for (size_t i = 0; i < x.size(); i += 37) x[i] *= 8.0f;  // a few large activations per piece
  std::vector<float> bias = test::randn(rng, static_cast<size_t>(cs.N));
  std::vector<float> wf(static_cast<size_t>(cs.N * cs.K));
  for (int64_t b = 0; b < cs.N * cs.K / f.block_size; ++b) f.decode(w.data() + b * f.block_bytes, wf.data() + b * f.block_size);

  std::vector<uint8_t> wi;  // interleaved
  if (cs.interleaved) {
    wi.resize(w.size());
    quant::ggml_interleave_rows(static_cast<uint32_t>(cs.type), w.data(), cs.N, cs.K, wi.data());
  }

  kernels::GgmlLinearArgs a{};
  a.x = x.data();
  a.w = cs.interleaved ? wi.data() : w.data();
  a.interleaved = cs.interleaved;
  a.ggml_type = static_cast<uint32_t>(cs.type);
  a.row_bytes = row_bytes;
  a.bias = cs.bias ? bias.data() : nullptr;
  a.M = cs.M;
  a.N = cs.N;
  a.K = cs.K;
  std::vector<float> ref(static_cast<size_t>(cs.M * cs.N));
  a.out = ref.data();
  kernels::ref_kernels().ggml_linear(a);
  for (int64_t m = 0; m < cs.M; ++m)
    for (int64_t n = 0; n < cs.N; ++n) {
      double want = cs.bias ? bias[static_cast<size_t>(n)] : 0.0;
      for (int64_t k = 0; k < cs.K; ++k) want += static_cast<double>(x[static_cast<size_t>(m * cs.K + k)]) * wf[static_cast<size_t>(n * cs.K + k)];
      ASSERT_EQ(ref[static_cast<size_t>(m * cs.N + n)], static_cast<float>(want));
    }

  for (const kernels::KernelTable* t : tables) {
    SCOPED_TRACE(t->name);
    std::vector<float> got(ref.size(), std::nanf(""));
    a.out = got.data();
    t->ggml_linear(a);
    const bool bf16 = takes_bf16_tiles(*t, cs.M);
    for (int64_t m = 0; m < cs.M; ++m)
      for (int64_t n = 0; n < cs.N; ++n) {
        // The int8 activation bound (support/ggml_cases.h: half a step per x, float32 sums of the pieces, bias), or
        // for the AMX-BF16 kernel the bound of bfloat16 products summed in float32.
        const double bias_abs = cs.bias ? std::fabs(bias[static_cast<size_t>(n)]) : 0.0;
        const double tol = bf16 ? test::bf16_product_bound(x.data() + m * cs.K, wf.data() + n * cs.K, cs.K, bias_abs)
                                : test::int8_piece_bound(x.data() + m * cs.K, wf.data() + n * cs.K, cs.K, bias_abs);
        const float g = got[static_cast<size_t>(m * cs.N + n)];
        ASSERT_FALSE(std::isnan(g)) << "m " << m << " n " << n;
        ASSERT_LE(std::fabs(static_cast<double>(g) - ref[static_cast<size_t>(m * cs.N + n)]), tol)
            << "m " << m << " n " << n << " type " << f.name;
      }
  }
}

// Every level this machine runs; where the avx512 table multiplies on AMX tiles, its VNNI kernel too ("avx512-vnni").
std::vector<const kernels::KernelTable*> all_tables() {
  std::vector<const kernels::KernelTable*> out;
  for (IsaLevel l : supported_isas()) out.push_back(&kernels::kernels_for_isa(l));
#if defined(__x86_64__)
  if (detected_isa() == IsaLevel::kAvx512 &&
      kernels::kernels_for_isa(IsaLevel::kAvx512).ggml_linear != &kernels::x86::avx512::ggml_linear) {
    static const kernels::KernelTable vnni = [] {
      kernels::KernelTable t = kernels::kernels_for_isa(IsaLevel::kAvx512);
      t.name = "avx512-vnni";
      t.ggml_linear = &kernels::x86::avx512::ggml_linear;
      return t;
    }();
    out.push_back(&vnni);
  }
#endif
  return out;
}

TEST(GgmlLinear, EveryLevelMatchesTheReferenceWithinTheInt8ActivationBound) {
  auto rng = test::make_rng(1102);
  const auto tables = all_tables();
  for (GgmlType t : kIntegerTypes) {
    const int64_t bs = quant::ggml_block_format(static_cast<uint32_t>(t))->block_size;
    SCOPED_TRACE(quant::ggml_block_format(static_cast<uint32_t>(t))->name);
    for (const Case& c : {Case{t, 1, 13, bs, true}, Case{t, 1, 37, 3 * bs, false}, Case{t, 3, 9, 2 * bs, true},
                          Case{t, 6, 17, bs, false}, Case{t, 1, 1, 4 * bs, true}, Case{t, 1, 70, 5 * bs, false}, Case{t, 5, 11, 2 * bs, true}, Case{t, 15, 9, bs, false}})
      run_case(rng, c, tables);
  }
}

// Rows interleaved 8 at a time (the AVX2 level's layout for Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K): the reference reads
// them back exactly (its output equals the float64 sum over the decoded rows, asserted in run_case), every level's
// kernel within the int8 activation bound: the interleaved GEMV's tiles of 1-4 (Q6_K: 1-2) activation rows and their
// tails (M < 16), the panel GEMM packing the octets (M >= 16), K of one block and with tails of a 512-element chunk.
TEST(GgmlLinear, InterleavedRowsMatchTheReferenceWithinTheInt8ActivationBound) {
  auto rng = test::make_rng(1109);
  const auto tables = all_tables();
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    SCOPED_TRACE(quant::ggml_block_format(static_cast<uint32_t>(t))->name);
    for (const Case& c : {Case{t, 1, 8, 32, true, true}, Case{t, 1, 24, 640, false, true},
                          Case{t, 2, 16, 96, true, true}, Case{t, 3, 40, 64, false, true},
                          Case{t, 4, 8, 160, true, true}, Case{t, 5, 16, 32, false, true},
                          Case{t, 7, 32, 96, true, true}, Case{t, 15, 8, 64, false, true},
                          Case{t, 16, 24, 544, true, true}, Case{t, 33, 136, 96, false, true}})
      run_case(rng, c, tables);
  }
  // Q4_K, Q5_K, Q6_K (256-element blocks): one block, K past a 512-element chunk of the GEMM (768, 1280), every
  // tile of 1-4 activation rows and their tails, M >= 16
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(quant::ggml_block_format(static_cast<uint32_t>(t))->name);
    for (const Case& c : {Case{t, 1, 8, 256, true, true}, Case{t, 1, 24, 1280, false, true},
                          Case{t, 2, 16, 512, true, true}, Case{t, 3, 40, 256, false, true},
                          Case{t, 4, 8, 768, true, true}, Case{t, 5, 16, 256, false, true},
                          Case{t, 7, 32, 512, true, true}, Case{t, 15, 8, 256, false, true},
                          Case{t, 16, 24, 768, true, true}, Case{t, 33, 136, 1280, false, true}})
      run_case(rng, c, tables);
  }
}

// The interleaved layout holds the file's blocks: back to the file's order byte for byte, any block read back alone;
// the formats without it and N that is not a multiple of 8 are refused, and so is a kernel call with them.
TEST(GgmlLinear, InterleavedRowsHoldTheFileBlocks) {
  auto rng = test::make_rng(1110);
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                     GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    const auto type = static_cast<uint32_t>(t);
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(type);
    SCOPED_TRACE(f.name);
    const int64_t N = 24, K = 3 * f.block_size, B = K / f.block_size;
    std::vector<uint8_t> w = random_blocks(rng, t, N * B);
    if (t == GgmlType::kQ4_K || t == GgmlType::kQ5_K)  // a block with every scale and minimum at 63 (all 6 bits set)
      std::memset(w.data() + 5 * f.block_bytes + 4, 0xFF, 12);
    std::vector<uint8_t> wi(w.size()), back(w.size(), 0xAB);
    quant::ggml_interleave_rows(type, w.data(), N, K, wi.data());
    EXPECT_NE(wi, w);
    quant::ggml_deinterleave_rows(type, wi.data(), N, K, back.data());
    EXPECT_EQ(back, w);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t b = 0; b < B; ++b) {
        uint8_t blk[quant::kGgmlInterleavedBlockMax];
        ASSERT_LE(f.block_bytes, quant::kGgmlInterleavedBlockMax);
        quant::ggml_interleaved_block(type, wi.data(), B, n, b, blk);
        ASSERT_EQ(std::memcmp(blk, w.data() + (n * B + b) * f.block_bytes, static_cast<size_t>(f.block_bytes)), 0)
            << "row " << n << " block " << b;
      }
    // the dequantized rows equal the decoder's from any row on (every level)
    for (const kernels::KernelTable* tab : all_tables()) {
      SCOPED_TRACE(tab->name);
      std::vector<float> got(static_cast<size_t>(5 * K), std::nanf("")), want(got.size());
      kernels::GgmlDequantArgs d{wi.data(), type, quant::ggml_row_bytes(f, K), 5, K, got.data()};
      d.interleaved = true;
      d.row0 = 11;
      tab->ggml_dequantize(d);
      for (int64_t i = 0; i < 5 * B; ++i)
        f.decode(w.data() + (11 * B + i) * f.block_bytes, want.data() + i * f.block_size);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
  }
  const std::vector<uint8_t> q8(34 * 8), q4(18 * 12);
  std::vector<uint8_t> out(q8.size());
  EXPECT_TRUE(throws_code([&] { quant::ggml_interleave_rows(8, q8.data(), 8, 32, out.data()); },
                          ErrorCode::kUnsupported, "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K"));
  EXPECT_TRUE(throws_code([&] { quant::ggml_interleave_rows(2, q4.data(), 12, 32, out.data()); },
                          ErrorCode::kInvalidArgument, "multiple of it; got 12"));
  EXPECT_TRUE(throws_code([&] { quant::ggml_interleave_rows(12, q8.data(), 8, 128, out.data()); },
                          ErrorCode::kInvalidArgument, "Q4_K block size 256; got 128"));
  std::vector<float> x(32, 1.0f), y(12);
  kernels::GgmlLinearArgs a{x.data(), q4.data(), 2, 18, nullptr, y.data(), 1, 12, 32};
  a.interleaved = true;
  for (const kernels::KernelTable* tab : all_tables())
    EXPECT_TRUE(throws_code([&] { tab->ggml_linear(a); }, ErrorCode::kShapeMismatch, "groups of 8; got 12 rows"))
        << tab->name;
}

// Prefill shapes (M >= 16: the AVX-512 level's tiled VNNI kernel; the other levels run their own path): M with
// tails of the 4-row activation tiles, N with tails of the 4-row weight groups and past a 128-row panel, K with
// tails of the 512-element K chunk and of 64-element steps (an odd count of 32-element blocks), a NaN activation.
TEST(GgmlLinear, PrefillShapesMatchTheReferenceWithinTheInt8ActivationBound) {
  auto rng = test::make_rng(1105);
  const auto tables = all_tables();
  for (GgmlType t : kIntegerTypes) {
    const int64_t bs = quant::ggml_block_format(static_cast<uint32_t>(t))->block_size;
    SCOPED_TRACE(quant::ggml_block_format(static_cast<uint32_t>(t))->name);
    const int64_t k_tail = bs == 32 ? 17 * 32 : 3 * bs;  // 544 or 768: a second, partial K chunk
    for (const Case& c : {Case{t, 16, 13, bs, true}, Case{t, 17, 37, k_tail, false}, Case{t, 33, 5, 2 * bs, true},
                          Case{t, 64, 133, k_tail, true}, Case{t, 17, 4, bs == 32 ? 3 * 32 : bs, false}})
      run_case(rng, c, tables);
  }
}

// Enough activation rows that a worker's output rows are cut into several blocks (each block's M × rows outputs are
// kept in L2 over the K chunks: 260 rows give blocks of 224), over two K chunks: each block's accumulators are
// copied out (with the bias) after its own last chunk, not another block's.
TEST(GgmlLinear, PrefillSeveralOutputBlocksPerWorkerMatchTheReference) {
  auto rng = test::make_rng(1107);
  const auto tables = all_tables();
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ8_0}) {
    const int64_t bs = quant::ggml_block_format(static_cast<uint32_t>(t))->block_size;
    SCOPED_TRACE(quant::ggml_block_format(static_cast<uint32_t>(t))->name);
    run_case(rng, Case{t, 260, 520, bs == 32 ? 23 * 32 : 3 * bs, true}, tables);
  }
}

#if defined(__x86_64__)
// The AMX-BF16 kernel against what it claims to compute: each activation rounded to bfloat16, each weight's integer
// form a·c + b (one float32 fma, quant::ggml_piece) rounded to bfloat16, the products summed in float32 — so only
// the order of K float32 additions may differ: (K + 2)·2⁻²⁴·Σ|products| (M with a tail of the 32-row sweep and of the
// 16-row tiles, K over two chunks, N past a 32-row pair, every format).
TEST(GgmlLinear, AmxBf16TilesEqualBfloat16ProductsSummedInFloat32) {
  if (!cpu_features().amx_bf16 || !cpu_features().avx512bf16 ||
      kernels::kernels_for_isa(IsaLevel::kAvx512).ggml_linear != &kernels::x86::amx::ggml_linear_bf16)
    GTEST_SKIP() << "no AMX-BF16 tiles here";
  auto rng = test::make_rng(1108);
  const auto round_bf16 = [](float v) { return bf16_to_f32(f32_to_bf16(v)); };
  for (GgmlType t : kIntegerTypes) {
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
    SCOPED_TRACE(f.name);
    for (const int64_t M : {37, 16, 64}) {
      const int64_t N = 70, K = f.block_size == 32 ? 23 * 32 : 3 * 256;
      const std::vector<uint8_t> w = random_blocks(rng, t, N * K / f.block_size);
      const std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
      const std::vector<float> bias = test::randn(rng, static_cast<size_t>(N));
      std::vector<float> wb(static_cast<size_t>(N * K));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t p = 0; p < K / 32; ++p) {
          const uint8_t* blk = w.data() + (n * K + p * 32) / f.block_size * f.block_bytes;
          int8_t c[32];
          float sa[2], so[2];
          quant::ggml_piece(t, blk, static_cast<int>(p % (f.block_size / 32)), c, sa, so);
          for (int e = 0; e < 32; ++e)
            wb[static_cast<size_t>(n * K + p * 32 + e)] = round_bf16(std::fma(static_cast<float>(c[e]), sa[e / 16], so[e / 16]));
        }
      std::vector<float> got(static_cast<size_t>(M * N), std::nanf(""));
      kernels::GgmlLinearArgs a{};
      a.x = x.data();
      a.w = w.data();
      a.ggml_type = static_cast<uint32_t>(t);
      a.row_bytes = quant::ggml_row_bytes(f, K);
      a.bias = bias.data();
      a.M = M;
      a.N = N;
      a.K = K;
      a.out = got.data();
      kernels::x86::amx::ggml_linear_bf16(a);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double want = 0.0, mag = 0.0;
          for (int64_t k = 0; k < K; ++k) {
            const double pr = static_cast<double>(round_bf16(x[static_cast<size_t>(m * K + k)])) * wb[static_cast<size_t>(n * K + k)];
            want += pr;
            mag += std::fabs(pr);
          }
          const double b = bias[static_cast<size_t>(n)];
          const double tol = static_cast<double>(K + 2) * 0x1p-24 * mag + 0x1p-24 * (std::fabs(want) + std::fabs(b));
          const float g = got[static_cast<size_t>(m * N + n)];
          ASSERT_TRUE(std::isfinite(g)) << "m " << m << " n " << n;
          ASSERT_LE(std::fabs(static_cast<double>(g) - (want + b)), tol) << "m " << m << " n " << n;
        }
    }
  }
}
#endif

// A NaN or infinite activation makes its row's outputs non-finite (the reference: NaN or ±inf; the int8 kernels:
// NaN), never another row's.
TEST(GgmlLinear, PrefillNonFiniteActivationStaysInItsRow) {
  auto rng = test::make_rng(1106);
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ8_0}) {
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
    const int64_t M = 17, N = 9, K = 2 * f.block_size;
    const std::vector<uint8_t> w = random_blocks(rng, t, N * K / f.block_size);
    std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
    x[static_cast<size_t>(5 * K + 40)] = std::nanf("");
    x[static_cast<size_t>(9 * K + 3)] = INFINITY;
    kernels::GgmlLinearArgs a{};
    a.x = x.data();
    a.w = w.data();
    a.ggml_type = static_cast<uint32_t>(t);
    a.row_bytes = quant::ggml_row_bytes(f, K);
    a.M = M;
    a.N = N;
    a.K = K;
    for (const kernels::KernelTable* tb : all_tables()) {
      std::vector<float> got(static_cast<size_t>(M * N), 0.0f);
      a.out = got.data();
      tb->ggml_linear(a);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          EXPECT_EQ(!std::isfinite(got[static_cast<size_t>(m * N + n)]), m == 5 || m == 9)
              << tb->name << " " << f.name << " m " << m << " n " << n;
    }
  }
}

// The rows as float32 (the layers' prefill path): every level equals the block decoder bit for bit.
TEST(GgmlLinear, DequantizeEqualsTheDecoderBitForBit) {
  auto rng = test::make_rng(1104);
  for (GgmlType t : kIntegerTypes) {
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
    SCOPED_TRACE(f.name);
    const int64_t rows = 7, K = 3 * f.block_size, rb = quant::ggml_row_bytes(f, K);
    const std::vector<uint8_t> w = random_blocks(rng, t, rows * K / f.block_size);
    std::vector<float> want(static_cast<size_t>(rows * K));
    for (int64_t b = 0; b < rows * K / f.block_size; ++b) f.decode(w.data() + b * f.block_bytes, want.data() + b * f.block_size);
    for (const kernels::KernelTable* tb : all_tables()) {
      std::vector<float> got(want.size(), std::nanf(""));
      kernels::GgmlDequantArgs a{w.data(), static_cast<uint32_t>(t), rb, rows, K, got.data()};
      tb->ggml_dequantize(a);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float))) << tb->name;
    }
  }
}

TEST(GgmlLinear, ShapesThatBreakTheFormatAreErrors) {
  std::vector<uint8_t> w(144);
  std::vector<float> x(128), out(1);
  kernels::GgmlLinearArgs a{};
  a.x = x.data();
  a.w = w.data();
  a.ggml_type = static_cast<uint32_t>(GgmlType::kQ4_K);
  a.row_bytes = 144;
  a.out = out.data();
  a.M = 1;
  a.N = 1;
  a.K = 128;  // not a multiple of 256
  for (const kernels::KernelTable* t : all_tables())
    EXPECT_TRUE(throws_code([&] { t->ggml_linear(a); }, ErrorCode::kShapeMismatch, "multiple")) << t->name;
  a.K = 256;
  a.ggml_type = 1;  // F16: not a block format
  EXPECT_TRUE(throws_code([&] { kernels::ref_kernels().ggml_linear(a); }, ErrorCode::kUnsupported, "block"));
}

}  // namespace
}  // namespace cider

namespace cider {
namespace {

// The layer: LinearWeights with native blocks. One activation row takes the int8 block kernel; 16 or more take the
// float32 path (rows decoded, dense GEMM), bounded by float32 rounding alone: (K + 2)·2⁻²⁴·Σ|x·w| per output, unless
// the active level's ggml_linear takes prefill too (KernelTable::ggml_linear_prefill: avx512, avx2), then the int8 bound.
TEST(GgmlLinear, LayerForwardMatchesTheReferenceOnBothPaths) {
  auto rng = test::make_rng(1103);
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kQ5_0}) {
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
    SCOPED_TRACE(f.name);
    const int64_t N = 300, K = 2 * f.block_size;  // N > the 256-row chunk of the float path: a tail chunk too
    const std::vector<uint8_t> w = random_blocks(rng, t, N * K / f.block_size);
    std::vector<float> wf(static_cast<size_t>(N * K));
    for (int64_t b = 0; b < N * K / f.block_size; ++b) f.decode(w.data() + b * f.block_bytes, wf.data() + b * f.block_size);
    const std::vector<float> bias = test::randn(rng, static_cast<size_t>(N));
    nn::LinearWeights L;
    L.kind = nn::WeightKind::kGgml;
    L.N = N;
    L.K = K;
    L.w = w.data();
    L.w_dtype = DType::kU8;
    L.ggml_type = static_cast<uint32_t>(t);
    L.bias = bias.data();
    EXPECT_EQ(L.nbytes(), static_cast<size_t>(N * quant::ggml_row_bytes(f, K) + N * 4));
    for (int64_t M : {1, 16, 37}) {
      const std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
      std::vector<float> got(static_cast<size_t>(M * N), std::nanf(""));
      L.forward(x.data(), M, got.data());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double want = bias[static_cast<size_t>(n)], mag = std::fabs(bias[static_cast<size_t>(n)]), qerr = 0.0;
          for (int64_t p = 0; p < K / 32; ++p) {
            double amax = 0.0, wsum = 0.0;
            for (int64_t e = 0; e < 32; ++e)
              amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(m * K + p * 32 + e)])));
            for (int64_t e = 0; e < 32; ++e) {
              const int64_t k = p * 32 + e;
              const double xv = x[static_cast<size_t>(m * K + k)], wv = wf[static_cast<size_t>(n * K + k)];
              want += xv * wv;
              mag += std::fabs(xv * wv) + std::fabs(wv) * amax / 127.0;
              wsum += std::fabs(wv);
            }
            qerr += wsum * amax / 127.0 / 2.0;
          }
          // The int8 block kernel (M = 1, and M >= 16 where the active level's ggml_linear takes prefill, avx512):
          // int8 activations (the kernel test's bound); else (M >= 16, dequantize + dense GEMM) float32 only.
          const bool int8 = M == 1 || kernels::active_kernels().ggml_linear_prefill;
          const double tol = (int8 ? qerr : 0.0) + (static_cast<double>(K) + 32.0) * 0x1p-23 * mag;
          const float g = got[static_cast<size_t>(m * N + n)];
          ASSERT_FALSE(std::isnan(g));
          ASSERT_LE(std::fabs(g - want), tol) << "M " << M << " m " << m << " n " << n;
        }
    }
  }
}

}  // namespace
}  // namespace cider
