// Every compiled x86 kernel level (avx2, avx512 — each one this machine supports) against the reference kernels, on
// fresh random inputs with odd sizes, every output element, canary-guarded outputs; plus the ISA selection rules.
//
// Tolerances come from the arithmetic of each contract:
//  * W8A8 / W4A8: the activation codes and integer sums are exact in both kernels (a wrong code or a lost product
//    shifts an output by at least sx·sw, far beyond the bound), so only the float epilogue rounds:
//    |y − y_exact| ≤ (G + 3)·u·S + u·|y|, S = sx·Σ_g |sw_g·acc_g|, u = 2^-24, for each kernel, so the two differ by
//    at most twice that, plus one rounding to the output dtype each (half an ulp of f16/bf16).
//  * dense GEMM: any order of K products and sums (FMA or not) is within (K + 1)·u·Σ_k |x_k·w_k| of the exact
//    value; twice that between two kernels, plus the bias addition.
//  * affine (MLX) matmul: s·Σ x·q + b·Σ x per group, any order: (K + G + 4)·u·T with
//    T = Σ_g (|s_g|·Σ_{k∈g} |x_k·q_k| + |b_g|·Σ_{k∈g} |x_k|); twice that, plus the output rounding.
// A NaN output passes only where the reference's is NaN too (a token holding NaN/inf).
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/thread_pool.h"
#include "kernels/kernel_table.h"
#include "kernels/x86/x86_kernels.h"
#include "quant/affine.h"
#include "quant/int4.h"
#include "quant/int8.h"
#include "support/test_support.h"

namespace cider {
namespace {

constexpr double kU = 0x1p-24;

double out_rel(DType t) { return t == DType::kF16 ? 0x1p-11 : t == DType::kBF16 ? 0x1p-8 : 0.0; }
double out_abs(DType t) { return t == DType::kF16 ? 0x1p-24 : t == DType::kBF16 ? 0x1p-133 : 0.0; }

// The fast tables this machine can run (every compiled level above ref).
// When the avx512 table runs its GEMM on AMX tiles, the AVX-512 VNNI GEMM is tested too, as table "avx512-vnni".
std::vector<const kernels::KernelTable*> fast_tables() {
  std::vector<const kernels::KernelTable*> out;
  for (IsaLevel l : supported_isas())
    if (l != IsaLevel::kRef) out.push_back(&kernels::kernels_for_isa(l));
  if (detected_isa() == IsaLevel::kAvx512 &&
      kernels::kernels_for_isa(IsaLevel::kAvx512).w8a8_gemm != &kernels::x86::avx512::w8a8_gemm) {
    static const kernels::KernelTable vnni = [] {
      kernels::KernelTable t = kernels::kernels_for_isa(IsaLevel::kAvx512);
      t.name = "avx512-vnni";
      t.w8a8_gemm = &kernels::x86::avx512::w8a8_gemm;
      t.w4a8_gemm = &kernels::x86::avx512::w4a8_gemm;
      return t;
    }();
    out.push_back(&vnni);
  }
  return out;
}

// got vs want element by element: |got − want| ≤ tol[i] + out_rel·|want| + out_abs; NaN only where want is NaN.
::testing::AssertionResult matches(const std::vector<float>& got, const std::vector<float>& want,
                                   const std::vector<double>& tol, DType out_dtype) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isnan(w)) {
      if (!std::isnan(g)) return ::testing::AssertionFailure() << "element " << i << ": got " << g << ", want NaN";
      continue;
    }
    const double bound = tol[i] + 2.0 * out_rel(out_dtype) * std::fabs(w) + 2.0 * out_abs(out_dtype);
    if (std::isnan(g) || !(std::fabs(g - w) <= bound))
      return ::testing::AssertionFailure() << "element " << i << " of " << got.size() << ": got " << g << ", want "
                                           << w << " (|diff| " << std::fabs(g - w) << " > " << bound << ")";
  }
  return ::testing::AssertionSuccess();
}

// Runs fn(out) on a canary-guarded [n] buffer of out_dtype pre-filled with NaN bytes; returns the values.
template <typename Fn>
std::vector<float> guarded(size_t n, DType out_dtype, Fn fn) {
  test::GuardedBuffer out(n * static_cast<size_t>(dtype_size(out_dtype)));
  out.fill_inside(0xFF);
  fn(out.data());
  EXPECT_TRUE(out.canaries_intact()) << "a kernel wrote outside its output";
  return test::from_dtype_bytes(out.data(), out_dtype, n);
}

// ---- W8A8 / W4A8 ---------------------------------------------------------------------------------------------

struct IntCase {
  bool int4;
  int64_t M, N, K;
  int gs;
  DType x_dtype, out_dtype;
  bool bias;
  bool nan_token;  // token 0 holds a NaN (M > 1) — its output row must be NaN
};

std::string describe(const IntCase& c) {
  std::ostringstream s;
  s << (c.int4 ? "W4A8" : "W8A8") << " M " << c.M << " N " << c.N << " K " << c.K << " gs " << c.gs << " x "
    << dtype_name(c.x_dtype) << " out " << dtype_name(c.out_dtype) << (c.bias ? " bias" : "")
    << (c.nan_token ? " nan-token" : "");
  return s.str();
}

void check_int_case(const IntCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(describe(c));
  const int64_t M = c.M, N = c.N, K = c.K;
  std::vector<float> xv = test::randn(rng, static_cast<size_t>(M * K));
  std::uniform_real_distribution<float> expo(-6.0f, 6.0f);
  for (int64_t m = 0; m < M; ++m) {
    const float mag = std::exp2(expo(rng));
    for (int64_t k = 0; k < K; ++k) xv[static_cast<size_t>(m * K + k)] *= mag;
  }
  if (c.nan_token) xv[static_cast<size_t>(K / 2)] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<uint8_t> x = test::to_dtype_bytes(xv, c.x_dtype);
  const std::vector<float> wf = test::randn(rng, static_cast<size_t>(N * K), 0.05f);
  const TensorView wview(wf.data(), DType::kF32, {N, K});
  quant::Int8Weights w8;
  quant::Int4Weights w4;
  if (c.int4) w4 = quant::quantize_int4_weights(wview, c.gs);
  else w8 = quant::quantize_int8_weights(wview, c.gs);
  const float* scales = c.int4 ? w4.scales.ptr<float>() : w8.scales.ptr<float>();
  const std::vector<float> bias = test::randn(rng, static_cast<size_t>(N));

  kernels::IntLinearArgs a{};
  a.x = x.data();
  a.x_dtype = c.x_dtype;
  a.w = c.int4 ? static_cast<const void*>(w4.packed.ptr<uint8_t>()) : w8.q.ptr<int8_t>();
  a.w_scales = scales;
  a.bias = c.bias ? bias.data() : nullptr;
  a.out_dtype = c.out_dtype;
  a.M = M;
  a.N = N;
  a.K = K;
  a.group_size = c.gs;
  auto entry = [&](const kernels::KernelTable& t) {
    return M == 1 ? (c.int4 ? t.w4a8_gemv : t.w8a8_gemv) : (c.int4 ? t.w4a8_gemm : t.w8a8_gemm);
  };
  const size_t n_out = static_cast<size_t>(M * N);
  const std::vector<float> want = guarded(n_out, c.out_dtype, [&](void* out) {
    a.out = out;
    entry(kernels::ref_kernels())(a);
  });

  // The epilogue bound from the exact integer sums (codes from the library's per-token quantizer, the definition).
  const int64_t span = c.gs == 0 ? K : c.gs, G = K / span;
  std::vector<double> tol(n_out);
  std::vector<int8_t> xq(static_cast<size_t>(K));
  const int64_t row_bytes = K * dtype_size(c.x_dtype);
  for (int64_t m = 0; m < M; ++m) {
    const double sx = quant::quantize_int8_row(x.data() + m * row_bytes, c.x_dtype, K, xq.data());
    for (int64_t n = 0; n < N; ++n) {
      double S = 0.0;
      for (int64_t g = 0; g < G; ++g) {
        int64_t acc = 0;
        for (int64_t k = g * span; k < (g + 1) * span; ++k) {
          const int wq = c.int4 ? quant::int4_code(w4.packed.ptr<uint8_t>() + n * (K / 2), k)
                                : w8.q.ptr<int8_t>()[n * K + k];
          acc += static_cast<int64_t>(xq[static_cast<size_t>(k)]) * wq;
        }
        S += std::fabs(static_cast<double>(scales[c.gs == 0 ? n : g * N + n]) * static_cast<double>(acc));
      }
      S *= std::isnan(sx) ? 0.0 : sx;
      const double y = std::fabs(want[static_cast<size_t>(m * N + n)]);
      tol[static_cast<size_t>(m * N + n)] = 2.0 * ((static_cast<double>(G) + 3.0) * kU * S + kU * y) * (1.0 + 1e-6);
    }
  }
  for (const kernels::KernelTable* t : fast_tables()) {
    SCOPED_TRACE(t->name);
    const std::vector<float> got = guarded(n_out, c.out_dtype, [&](void* out) {
      a.out = out;
      entry(*t)(a);
    });
    EXPECT_TRUE(matches(got, want, tol, c.out_dtype));
  }
}

const DType kFloats[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(KernelsX86, W8A8EveryLevelMatchesReference) {
  auto rng = test::make_rng(401);
  int i = 0;
  for (int64_t M : {1, 2, 7, 33})
    for (int gs : {0, 64, 128, 256})
      for (int64_t N : {1, 7, 33, 67, 129}) {
        const std::vector<int64_t> Ks = gs == 0 ? std::vector<int64_t>{1, 7, 33, 67, 129, 4097}
                                                : std::vector<int64_t>{gs, 3 * gs, 4096 + gs};
        for (int64_t K : Ks) {
          if (M * N * K > 4'000'000) continue;  // keeps the reference's time small
          ++i;
          check_int_case({false, M, N, K, gs, kFloats[i % 3], kFloats[(i / 3) % 3], i % 2 == 0, M > 1 && i % 5 == 0},
                         rng);
        }
      }
}

TEST(KernelsX86, W4A8EveryLevelMatchesReference) {
  auto rng = test::make_rng(402);
  int i = 0;
  for (int64_t M : {1, 2, 7, 33})
    for (int gs : {0, 32, 64, 128, 256})
      for (int64_t N : {1, 7, 33, 67, 129}) {
        const std::vector<int64_t> Ks = gs == 0 ? std::vector<int64_t>{2, 8, 34, 66, 130, 4098}
                                                : std::vector<int64_t>{gs, 3 * gs, 4096 + gs};
        for (int64_t K : Ks) {
          if (M * N * K > 4'000'000) continue;
          ++i;
          check_int_case({true, M, N, K, gs, kFloats[i % 3], kFloats[(i / 3) % 3], i % 2 == 1, M > 1 && i % 5 == 0},
                         rng);
        }
      }
}

// The W4A8 GEMV's row orders: page blocks of 16·P rows read in P passes (P = rows per 4 KiB page, up to 8) and
// plain 16-row blocks for the rows after them, with row tails (K not a multiple of 128) in both. K = 32·odd gives
// rows of 16·odd bytes (P = 8 for 96 and 480, 7 for 1056), 4096 P = 2, 4160 P = 1 with a tail; N 4097 = whole page
// blocks plus one row.
TEST(KernelsX86, W4A8GemvRowOrdersMatchReference) {
  auto rng = test::make_rng(404);
  int i = 0;
  for (int gs : {0, 32, 64, 128, 256})
    for (int64_t K : {96, 480, 1056, 4096, 4160})
      for (int64_t N : {1, 7, 33, 67, 129, 4097}) {
        if (gs != 0 && K % gs != 0) continue;
        if (N * K > 4096 * 4160 / 2 && gs != 0 && gs != 128) continue;  // the reference's time: groups 0 and 128 only
        ++i;
        check_int_case({true, 1, N, K, gs, kFloats[i % 3], kFloats[(i / 3) % 3], i % 2 == 1, false}, rng);
      }
}

TEST(KernelsX86, IntKernelsSplitOverAnyThreadCount) {
  auto rng = test::make_rng(403);
  const int before = num_threads();
  for (int threads : {1, 3}) {
    set_num_threads(threads);
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    for (bool int4 : {false, true}) {
      check_int_case({int4, 1, 333, 4096, 128, DType::kF32, DType::kF32, true, false}, rng);
      check_int_case({int4, 9, 333, 512, 0, DType::kBF16, DType::kF32, false, false}, rng);
    }
    check_int_case({true, 1, 333, 2048, 64, DType::kF32, DType::kBF16, true, false}, rng);  // W4A8 page blocks, P 4
  }
  set_num_threads(before);
}

// ---- dense GEMM ----------------------------------------------------------------------------------------------

TEST(KernelsX86, DenseGemmEveryLevelMatchesReference) {
  auto rng = test::make_rng(404);
  int i = 0;
  for (int64_t M : {1, 2, 7, 33})
    for (int64_t N : {1, 7, 33, 67, 129})
      for (int64_t K : {1, 7, 33, 67, 129, 4097}) {
        if (M * N * K > 4'000'000) continue;
        const DType wt = kFloats[i++ % 3];
        const bool with_bias = i % 2 == 0;
        SCOPED_TRACE(::testing::Message() << "dense M " << M << " N " << N << " K " << K << " w " << dtype_name(wt)
                                          << (with_bias ? " bias" : ""));
        const std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
        const std::vector<uint8_t> w = test::to_dtype_bytes(test::randn(rng, static_cast<size_t>(N * K)), wt);
        const std::vector<float> wv = test::from_dtype_bytes(w.data(), wt, static_cast<size_t>(N * K));
        const std::vector<float> bias = test::randn(rng, static_cast<size_t>(N));
        kernels::DenseGemmArgs a{x.data(), w.data(), wt, with_bias ? bias.data() : nullptr, nullptr, M, N, K};
        const size_t n_out = static_cast<size_t>(M * N);
        const std::vector<float> want = guarded(n_out, DType::kF32, [&](void* out) {
          a.out = static_cast<float*>(out);
          kernels::ref_kernels().dense_gemm(a);
        });
        std::vector<double> tol(n_out);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double s = 0.0;
            for (int64_t k = 0; k < K; ++k)
              s += std::fabs(static_cast<double>(x[static_cast<size_t>(m * K + k)]) * wv[static_cast<size_t>(n * K + k)]);
            const double y = std::fabs(want[static_cast<size_t>(m * N + n)]);
            tol[static_cast<size_t>(m * N + n)] = (2.0 * (static_cast<double>(K) + 1.0) * kU * s + 2.0 * kU * y) * (1.0 + 1e-6);
          }
        for (const kernels::KernelTable* t : fast_tables()) {
          SCOPED_TRACE(t->name);
          const std::vector<float> got = guarded(n_out, DType::kF32, [&](void* out) {
            a.out = static_cast<float*>(out);
            t->dense_gemm(a);
          });
          EXPECT_TRUE(matches(got, want, tol, DType::kF32));
        }
      }
}

// ---- affine (MLX) quantized matmul ---------------------------------------------------------------------------

TEST(KernelsX86, AffineQmmEveryLevelMatchesReference) {
  auto rng = test::make_rng(405);
  int i = 0;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int gs : {32, 64, 128})
      for (bool transpose : {true, false})
        for (int64_t M : {1, 2, 7, 33}) {
          ++i;
          const int64_t N = transpose ? std::vector<int64_t>{1, 7, 33, 67, 129}[static_cast<size_t>(i % 5)]
                                      : gs * (1 + i % 3);
          const int64_t K = transpose ? gs * (1 + i % 5) + (i % 2 ? 4096 / gs * gs : 0) : 67;
          if (M * N * K > 4'000'000) continue;
          const DType st = kFloats[i % 3], xt = kFloats[(i / 3) % 3];
          SCOPED_TRACE(::testing::Message() << "affine bits " << bits << " gs " << gs << " transpose " << transpose
                                            << " M " << M << " N " << N << " K " << K << " scales "
                                            << dtype_name(st) << " x " << dtype_name(xt));
          const int64_t rows = transpose ? N : K, cols = transpose ? K : N;
          const std::vector<uint8_t> wsrc = test::to_dtype_bytes(test::randn(rng, static_cast<size_t>(rows * cols)), st);
          quant::AffineQuantized q = quant::affine_quantize(TensorView(wsrc.data(), st, {rows, cols}), gs, bits);
          const std::vector<uint8_t> x = test::to_dtype_bytes(test::randn(rng, static_cast<size_t>(M * K)), xt);
          const DType ot = promote_float(xt, st);
          kernels::AffineQmmArgs a{x.data(), xt, q.packed.ptr<uint32_t>(), q.scales.buffer.data(),
                                   q.biases.buffer.data(), st, nullptr, ot, M, N, K, gs, bits, transpose};
          const size_t n_out = static_cast<size_t>(M * N);
          const std::vector<float> want = guarded(n_out, ot, [&](void* out) {
            a.out = out;
            kernels::ref_kernels().affine_qmm(a);
          });
          // T per output, from the codes, scales and biases.
          const std::vector<float> xv = test::from_dtype_bytes(x.data(), xt, static_cast<size_t>(M * K));
          const int64_t words = quant::packed_words(cols, bits), groups = cols / gs;
          std::vector<double> tol(n_out);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double T = 0.0;
              for (int64_t k = 0; k < K; ++k) {
                const int64_t r = transpose ? n : k, col = transpose ? k : n;
                const double s = load_float(a.scales, st, r * groups + col / gs);
                const double b = load_float(a.biases, st, r * groups + col / gs);
                const double code = quant::unpack_code(a.w + r * words, col, bits);
                const double xk = std::fabs(xv[static_cast<size_t>(m * K + k)]);
                T += std::fabs(s) * xk * code + std::fabs(b) * xk;
              }
              const double G = static_cast<double>(K / gs);
              const double y = std::fabs(want[static_cast<size_t>(m * N + n)]);
              tol[static_cast<size_t>(m * N + n)] =
                  (2.0 * (static_cast<double>(K) + G + 4.0) * kU * T + 2.0 * kU * y) * (1.0 + 1e-6);
            }
          for (const kernels::KernelTable* t : fast_tables()) {
            SCOPED_TRACE(t->name);
            const std::vector<float> got = guarded(n_out, ot, [&](void* out) {
              a.out = out;
              t->affine_qmm(a);
            });
            EXPECT_TRUE(matches(got, want, tol, ot));
          }
        }
}

// ---- ISA selection ---------------------------------------------------------------------------------------------

using test::throws_code;

TEST(CpuFeatures, ResolveIsaHonoursLowerRequestsAndRejectsHigherOnes) {
  EXPECT_EQ(resolve_isa(nullptr, IsaLevel::kAvx512), IsaLevel::kAvx512);
  EXPECT_EQ(resolve_isa("", IsaLevel::kAvx2), IsaLevel::kAvx2);
  EXPECT_EQ(resolve_isa("ref", IsaLevel::kAvx512), IsaLevel::kRef);
  EXPECT_EQ(resolve_isa("avx2", IsaLevel::kAvx512), IsaLevel::kAvx2);
  EXPECT_EQ(resolve_isa("avx512", IsaLevel::kAvx512), IsaLevel::kAvx512);
  EXPECT_TRUE(throws_code([] { resolve_isa("avx512", IsaLevel::kAvx2); }, ErrorCode::kUnsupported,
                          "[cpu_features] CIDER_ISA=avx512 is above this machine's highest level avx2"));
  EXPECT_TRUE(throws_code([] { resolve_isa("avx2", IsaLevel::kRef); }, ErrorCode::kUnsupported, "highest level ref"));
  EXPECT_TRUE(throws_code([] { resolve_isa("avx1024", IsaLevel::kAvx512); }, ErrorCode::kInvalidArgument,
                          "must be ref, avx2 or avx512; got 'avx1024'"));
}

TEST(CpuFeatures, EnvironmentSelectsTheLevel) {
  const char* saved = std::getenv("CIDER_ISA");
  const std::string keep = saved ? saved : "";
  ::setenv("CIDER_ISA", "ref", 1);
  EXPECT_EQ(selected_isa(), IsaLevel::kRef);
  ::setenv("CIDER_ISA", "AVX2", 1);  // names are lower case
  EXPECT_TRUE(throws_code([] { selected_isa(); }, ErrorCode::kInvalidArgument, "got 'AVX2'"));
  ::unsetenv("CIDER_ISA");
  EXPECT_EQ(selected_isa(), detected_isa());
  if (saved) ::setenv("CIDER_ISA", keep.c_str(), 1);
}

TEST(CpuFeatures, LevelsAreConsistentWithTheFlags) {
  const CpuFeatures& f = cpu_features();
  const IsaLevel l = detected_isa();
  if (l >= IsaLevel::kAvx2) {
    EXPECT_TRUE(f.avx2 && f.fma && f.f16c && f.os_avx);
  }
  if (l >= IsaLevel::kAvx512) {
    EXPECT_TRUE(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni && f.os_avx512);
  }
  std::fprintf(stderr, "[cider tests] detected ISA level %s; tables tested:", isa_name(l));
  for (const kernels::KernelTable* t : fast_tables()) std::fprintf(stderr, " %s", t->name);
  std::fprintf(stderr, "\n");
  EXPECT_EQ(std::string(kernels::kernels_for_isa(IsaLevel::kRef).name), "ref");
  for (IsaLevel s : supported_isas()) EXPECT_EQ(std::string(kernels::kernels_for_isa(s).name), isa_name(s));
  std::fprintf(stderr, "[cider tests] AMX-INT8 %s\n", f.amx_int8 && f.os_amx ? "present (avx512 GEMM on AMX tiles)" : "absent");
  if (l != IsaLevel::kAvx512) {
    EXPECT_TRUE(throws_code([] { kernels::kernels_for_isa(IsaLevel::kAvx512); }, ErrorCode::kUnsupported, "above"));
  }
}

}  // namespace
}  // namespace cider
