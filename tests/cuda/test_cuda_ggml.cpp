// CUDA kernels of native GGUF weights (kernels/cuda/linear_ggml.cu: cuda::ggml_linear, ggml_dequantize_bf16,
// ggml_embed_rows) against the CPU's block decoders (quant/ggml_blocks.h) and a float64 product, for every block
// format with an integer form (support/ggml_cases.h kIntegerTypes), on fresh random blocks (finite f16 scales of
// realistic size), shapes with tails in M, N and K. Outputs are poisoned with NaN (0xFF bytes) before each launch,
// guard bytes on both sides of every output (and behind the workspace: exactly ggml_linear_workspace_bytes are
// passed) must stay untouched, and NaN never passes a comparison.
//
// Tolerances, derived (want = Σ_k x_k·w_k + bias in float64, w_k the decoder's float32 value; u = 2⁻²⁴):
//
// GEMV path (M ≤ kGgmlGemvRows: int8 activations per piece of 32, the integer form, float32 sums) — the CPU kernels'
// bound test::int8_piece_bound (support/ggml_cases.h) with two widenings for the GPU:
//   * quantization: a code rint(x/step) lies within step/2 of x/step when the quotient is exact; a kernel that
//     rounds the step (fl(max/127)), its reciprocal or the quotient moves x/step (|x/step| ≤ 127) by at most
//     127·8u < 2⁻¹⁴ code units and the reconstruction q·step by a relative u, so each x moves by at most
//     step·(1/2 + 2⁻¹⁴) (code_slack 2⁻¹⁴). The bound assumes the offset terms b_h·X_h use the quantized half's sum
//     X_h = step·Σ codes, as the CPU kernels do (dx·Σ codes per piece): then the quantized product is exactly
//     Σ_k w_k·x̂_k and its error Σ_k |w_k|·|x̂_k − x_k|.
//   * float32 order: the GPU sums the pieces' terms in a different order (warp shuffles, split K) from the CPU, so
//     the order term is (P + 32)·2⁻²³ (twice γ_{P+32}, P = K/32 pieces, 32 covering the few roundings inside each
//     piece's term step·(a₀·S₀ + a₁·S₁) and the offsets) times the magnitude of everything summed. That magnitude
//     is Σ|w_k|·(|x_k| + step) (the helper's) plus, for the formats with an offset b (Q4_1, Q5_1, Q4_K, Q5_K), the
//     separate terms a·S and b·X: w = a·c + b gives |a·c| ≤ |w| + |b|, so the terms add at most 2·Σ_h |b_h|·Σ_{k∈h}
//     (|x_k| + step) — added here as (P + 32)·2⁻²³·2·B.
//   The bias is added once (2⁻²³·|bias|, in the helper).
//
// bf16 path (M > kGgmlGemvRows: W decoded to bf16, x rounded to bf16, cuBLASLt with float32 accumulation):
//   * against the float64 product of the same rounded inputs (x̂ = bf16(x), ŵ = bf16(w), products exact in float32):
//     any summation order with adds that may truncate (tensor cores) is within 2u per add, so
//     |gpu − Σ x̂ŵ − bias| ≤ 2(K + 2)·u·Σ|x̂ŵ| + 2u·|Σ x̂ŵ + bias| + u·|bias| (test_cuda_ops' dense_bf16 bound);
//   * against want: bf16 has 8 significant bits, |x − x̂| ≤ 2⁻⁸|x| and |w − ŵ| ≤ 2⁻⁸|w| (u_bf16 = 2⁻⁸; the
//     contract in cuda_ops.h says so too), so |x̂ŵ − xw| ≤ |x||w|·(2·2⁻⁸ + 2⁻¹⁶), plus the float32 accumulation
//     (K + 2)·2⁻²³·Σ|x̂ŵ| ≤ (K + 2)·2⁻²³·(1 + 2⁻⁶)·Σ|xw|, plus 2⁻²³·|bias| for the bias add.
//
// ggml_dequantize_bf16: bit for bit f32_to_bf16(decoder value) (round to nearest even), NaN where the decoder's
// value is NaN. ggml_embed_rows: bit for bit float(decoder value) · scale (one float32 product), an all-NaN row for an
// id outside [0, vocab). Non-finite activations: a NaN or ±inf in a row of x makes every output of that row NaN on
// the GEMV path (the piece's step is NaN), non-finite on the bf16 path (inf·w), and no other row changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/kernel_table.h"
#include "quant/ggml_blocks.h"
#include "support/ggml_cases.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace ggml_bench {  // kernels/cuda/linear_ggml.cu: the decode kernel knob (tests, benchmarks)
void set_ggml_gemv_kernel(int kernel);  // 0 automatic, 1 warp per row, 2 the row kernel where it takes the call
int last_ggml_gemv_kernel();            // the kernel of the latest tile: 1 or 2
}  // namespace ggml_bench
namespace {

using quant::GgmlType;
using test::kIntegerTypes;

constexpr double kU = 0x1p-24;           // float32 unit roundoff
constexpr double kCodeSlack = 0x1p-14;   // see the header: a code's distance past half a step, in steps
constexpr double kOrderTerms = 32.0;     // see the header: (P + 32)·2⁻²³

const quant::GgmlBlockFormat& format_of(GgmlType t) { return *quant::ggml_block_format(static_cast<uint32_t>(t)); }

// A device array of n elements of T with 256 bytes of 0xFF on both sides (data() keeps the allocation's 256-byte
// alignment); poisoned (0xFF: NaN as float, NaN as bf16) when made.
template <typename T>
class Guarded {
 public:
  static constexpr size_t kGuard = 256 / sizeof(T);
  explicit Guarded(size_t n) : n_(n), buf_((2 * kGuard + n) * sizeof(T)) { buf_.fill(0xFF); }
  T* data() const { return buf_.as<T>() + kGuard; }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_) buf_.download(v.data(), n_ * sizeof(T), kGuard * sizeof(T));
    return v;
  }
  // True when every byte outside [data, data + n) is still 0xFF.
  ::testing::AssertionResult guards_intact() const {
    std::vector<uint8_t> all(buf_.bytes());
    buf_.download(all.data(), all.size());
    const size_t lo = kGuard * sizeof(T), hi = (kGuard + n_) * sizeof(T);
    for (size_t i = 0; i < all.size(); ++i)
      if ((i < lo || i >= hi) && all[i] != 0xFF)
        return ::testing::AssertionFailure() << "guard byte " << (i < lo ? "before" : "after") << " the buffer at "
                                             << (i < lo ? static_cast<long long>(i) - static_cast<long long>(lo)
                                                        : static_cast<long long>(i - hi))
                                             << " was written";
    return ::testing::AssertionSuccess();
  }

 private:
  size_t n_;
  DeviceBuffer buf_;
};

// Every input of one ggml_linear call, on the host.
struct Inputs {
  GgmlType type;
  int64_t M, N, K;
  bool has_bias;
  std::vector<uint8_t> w;   // N rows of row_bytes
  std::vector<float> wf;    // [N, K]: the decoder's values
  std::vector<float> x;     // [M, K]
  std::vector<float> bias;  // [N]
  int64_t row_bytes() const { return quant::ggml_row_bytes(format_of(type), K); }
  std::string describe() const {
    std::ostringstream s;
    s << format_of(type).name << " M" << M << " N" << N << " K" << K << (has_bias ? " bias" : "");
    return s.str();
  }
};

std::vector<float> decode_rows(GgmlType t, const std::vector<uint8_t>& w, int64_t rows, int64_t K) {
  const quant::GgmlBlockFormat& f = format_of(t);
  std::vector<float> out(static_cast<size_t>(rows * K));
  for (int64_t b = 0; b < rows * K / f.block_size; ++b)
    f.decode(w.data() + b * f.block_bytes, out.data() + b * f.block_size);
  return out;
}

Inputs make_inputs(std::mt19937_64& rng, GgmlType t, int64_t M, int64_t N, int64_t K, bool bias) {
  Inputs in{t, M, N, K, bias, {}, {}, {}, {}};
  in.w = test::random_blocks(rng, t, N * K / format_of(t).block_size);
  in.wf = decode_rows(t, in.w, N, K);
  in.x = test::randn(rng, static_cast<size_t>(M * K));
  for (size_t i = 0; i < in.x.size(); i += 37) in.x[i] *= 8.0f;  // a few large activations per piece
  in.bias = test::randn(rng, static_cast<size_t>(N));
  return in;
}

// ggml_linear on the device, on its own stream: the output poisoned and guarded, the workspace exactly
// ggml_linear_workspace_bytes (poisoned, guarded behind).
std::vector<float> run_gpu(const Inputs& in) {
  Stream stream;
  DeviceBuffer d_x = to_device(in.x.data(), in.x.size() * sizeof(float));
  DeviceBuffer d_w = to_device(in.w.data(), in.w.size());
  DeviceBuffer d_bias = to_device(in.bias.data(), in.bias.size() * sizeof(float));
  Guarded<float> out(static_cast<size_t>(in.M * in.N));
  const size_t ws_bytes = ggml_linear_workspace_bytes(in.M, in.N, in.K);
  Guarded<uint8_t> ws(ws_bytes);
  kernels::GgmlLinearArgs a{};
  a.x = d_x.as<float>();
  a.w = d_w.data();
  a.ggml_type = static_cast<uint32_t>(in.type);
  a.row_bytes = in.row_bytes();
  a.bias = in.has_bias ? d_bias.as<float>() : nullptr;
  a.out = out.data();
  a.M = in.M;
  a.N = in.N;
  a.K = in.K;
  ggml_linear(a, Exec{stream.handle(), ws.data(), ws_bytes});
  stream.synchronize();
  EXPECT_TRUE(out.guards_intact()) << "output";
  EXPECT_TRUE(ws.guards_intact()) << "workspace of " << ws_bytes << " bytes";
  return out.download();
}

double want_of(const Inputs& in, int64_t m, int64_t n) {
  double s = in.has_bias ? static_cast<double>(in.bias[static_cast<size_t>(n)]) : 0.0;
  const float* x = in.x.data() + m * in.K;
  const float* w = in.wf.data() + n * in.K;
  for (int64_t k = 0; k < in.K; ++k) s += static_cast<double>(x[k]) * w[k];
  return s;
}

// Σ_h |b_h|·Σ_{k∈h}(|x_k| + step) over the half-pieces of row n and activation row m (the offset terms' magnitude;
// 0 for the formats without an offset). b: [N, K/16] the integer form's offsets.
double offset_magnitude(const Inputs& in, const std::vector<float>& b, int64_t m, int64_t n) {
  double total = 0.0;
  const float* x = in.x.data() + m * in.K;
  for (int64_t p = 0; p < in.K / 32; ++p) {
    double amax = 0.0;
    for (int64_t e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(static_cast<double>(x[p * 32 + e])));
    const double step = amax / 127.0;
    for (int h = 0; h < 2; ++h) {
      const double bh = std::fabs(static_cast<double>(b[static_cast<size_t>(n * (in.K / 16) + 2 * p + h)]));
      if (bh == 0.0) continue;
      double sx = 0.0;
      for (int64_t e = 16 * h; e < 16 * h + 16; ++e) sx += std::fabs(static_cast<double>(x[p * 32 + e])) + step;
      total += bh * sx;
    }
  }
  return total;
}

std::vector<float> offsets_of(const Inputs& in) {
  const quant::GgmlBlockFormat& f = format_of(in.type);
  std::vector<float> out(static_cast<size_t>(in.N * (in.K / 16)));
  const int64_t pieces = f.block_size / 32;
  for (int64_t n = 0; n < in.N; ++n)
    for (int64_t blk = 0; blk < in.K / f.block_size; ++blk) {
      const uint8_t* block = in.w.data() + n * in.row_bytes() + blk * f.block_bytes;
      for (int64_t p = 0; p < pieces; ++p) {
        int8_t c[32];
        float a[2], b[2];
        quant::ggml_piece(in.type, block, static_cast<int>(p), c, a, b);
        const size_t at = static_cast<size_t>(n * (in.K / 16) + 2 * (blk * pieces + p));
        out[at] = b[0];
        out[at + 1] = b[1];
      }
    }
  return out;
}

// Checks every output of a run against want with the tolerance of the path M takes (the header). Rows listed in
// bad_rows held a NaN/inf activation: NaN (GEMV path) or non-finite (bf16 path) in every column.
void check_outputs(const Inputs& in, const std::vector<float>& got, const std::set<int64_t>& bad_rows = {}) {
  const bool gemv = in.M <= kGgmlGemvRows;
  const std::vector<float> offsets = gemv ? offsets_of(in) : std::vector<float>{};
  const double P = static_cast<double>(in.K / 32);
  int failures = 0;
  std::vector<double> xb(static_cast<size_t>(in.K));
  for (int64_t m = 0; m < in.M; ++m) {
    const bool bad = bad_rows.count(m) != 0;
    if (!gemv && !bad)
      for (int64_t k = 0; k < in.K; ++k)
        xb[static_cast<size_t>(k)] = bf16_to_f32(f32_to_bf16(in.x[static_cast<size_t>(m * in.K + k)]));
    for (int64_t n = 0; n < in.N; ++n) {
      const float g = got[static_cast<size_t>(m * in.N + n)];
      if (bad) {
        const bool ok = gemv ? std::isnan(g) : !std::isfinite(g);
        if (!ok && ++failures <= 5)
          ADD_FAILURE() << "[" << m << ", " << n << "] row with a non-finite activation gave " << g << " (want "
                        << (gemv ? "NaN" : "non-finite") << ")";
        continue;
      }
      const double want = want_of(in, m, n);
      const double bias_abs = in.has_bias ? std::fabs(static_cast<double>(in.bias[static_cast<size_t>(n)])) : 0.0;
      double tol = 0.0, tol_rounded = -1.0, want_rounded = 0.0;
      if (gemv) {
        tol = test::int8_piece_bound(in.x.data() + m * in.K, in.wf.data() + n * in.K, in.K, bias_abs, kOrderTerms,
                                     kCodeSlack) +
              (P + kOrderTerms) * 0x1p-23 * 2.0 * offset_magnitude(in, offsets, m, n);
      } else {
        double mag = 0.0, mag_rounded = 0.0, s_rounded = 0.0;
        const float* w = in.wf.data() + n * in.K;
        for (int64_t k = 0; k < in.K; ++k) {
          const double xk = in.x[static_cast<size_t>(m * in.K + k)], wk = w[k];
          const double p = xb[static_cast<size_t>(k)] * static_cast<double>(bf16_to_f32(f32_to_bf16(w[k])));
          mag += std::fabs(xk * wk);
          mag_rounded += std::fabs(p);
          s_rounded += p;
        }
        const double b = in.has_bias ? static_cast<double>(in.bias[static_cast<size_t>(n)]) : 0.0;
        want_rounded = s_rounded + b;
        tol_rounded =
            (2.0 * static_cast<double>(in.K + 2) * mag_rounded + 2.0 * std::fabs(want_rounded) + bias_abs) * kU + 1e-30;
        tol = mag * (2.0 * 0x1p-8 + 0x1p-16) + static_cast<double>(in.K + 2) * 0x1p-23 * (1.0 + 0x1p-6) * mag +
              0x1p-23 * bias_abs + 1e-30;
      }
      const double err = std::fabs(static_cast<double>(g) - want);
      if (std::isnan(g) || !(err <= tol)) {
        if (++failures <= 5)
          ADD_FAILURE() << "[" << m << ", " << n << "] got " << g << ", want " << want << " (error " << err
                        << " > tolerance " << tol << ")";
        continue;
      }
      if (tol_rounded >= 0.0) {  // bf16 path: the product of the bf16-rounded inputs too
        const double err_r = std::fabs(static_cast<double>(g) - want_rounded);
        if (!(err_r <= tol_rounded) && ++failures <= 5)
          ADD_FAILURE() << "[" << m << ", " << n << "] got " << g << ", the bf16-rounded inputs' product "
                        << want_rounded << " (error " << err_r << " > tolerance " << tol_rounded << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << "elements out of tolerance (" << in.describe() << ")";
}

void run_case(std::mt19937_64& rng, GgmlType t, int64_t M, int64_t N, int64_t K, bool bias) {
  const Inputs in = make_inputs(rng, t, M, N, K, bias);
  SCOPED_TRACE(in.describe());
  check_outputs(in, run_gpu(in));
}

// K: one block, several blocks, and (for the 32-element formats) K not a multiple of 256.
std::vector<int64_t> k_sizes(GgmlType t) {
  if (format_of(t).block_size == 32) return {32, 640, 2080};
  return {256, 768, 4096};
}

// ---- GEMV path ---------------------------------------------------------------------------------------------------

TEST(CudaGgml, GemvMatchesTheReferenceWithinTheInt8Bound) {
  CIDER_REQUIRE_GPU();
  static_assert(kGgmlGemvRows == 16, "the M lists below straddle kGgmlGemvRows = 16");
  auto rng = test::make_rng(1201);
  int i = 0;
  for (GgmlType t : kIntegerTypes)
    for (int64_t K : k_sizes(t))
      for (int64_t M : {1, 2, 3, 5, 8, 9, 16})
        for (int64_t N : {1, 7, 37, 130}) {
          run_case(rng, t, M, N, K, i++ % 2 == 0);
          if (::testing::Test::HasFailure()) return;
        }
}

// Wider N (more rows than one block of the grid takes) at a model-like K, M = 1 and M = 16.
TEST(CudaGgml, GemvWiderShapes) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(1202);
  for (GgmlType t : kIntegerTypes) {
    const int64_t K = format_of(t).block_size == 32 ? 4128 : 4096;  // 4128 = 129·32
    for (int64_t M : {1, 16}) {
      run_case(rng, t, M, 515, K, M == 1);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The two decode kernels on the same calls: the row kernel (linear_ggml_rows.cu: rows of 16-byte multiples, here every
// format at these K, each row several segments with a short last one — Q4_0 2, Q8_0 3, Q4_K 2, Q5_K 3, Q6_K 4 —
// tiles of 1, 2, 4 and 8 rows, M 3, 5, 11 padded, N from one row to more than 16 rows per SM) and the warp-per-row
// kernel, which the automatic choice now keeps only for other rows; each run checks which kernel ran.
TEST(CudaGgml, RowKernelAndWarpKernelMatchTheReference) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(1205);
  struct Shape {
    int64_t M, N;
  };
  const Shape shapes[] = {{1, 1}, {1, 37}, {1, 2200}, {2, 37}, {3, 130}, {5, 37}, {5, 2200}, {8, 130}, {11, 37},
                          {16, 130}};
  for (int kernel : {2, 1}) {
    ggml_bench::set_ggml_gemv_kernel(kernel);
    for (GgmlType t : kIntegerTypes) {
      const int64_t K = format_of(t).block_size == 32 ? 8192 : 14336;
      for (const Shape& sh : shapes) {
        if (kernel == 1 && sh.N > 130) continue;  // the warp kernel's wide shapes: GemvWiderShapes
        const Inputs in = make_inputs(rng, t, sh.M, sh.N, K, sh.N % 2 == 1);
        SCOPED_TRACE(in.describe() + (kernel == 2 ? " row kernel" : " warp per row"));
        check_outputs(in, run_gpu(in));
        EXPECT_EQ(ggml_bench::last_ggml_gemv_kernel(), kernel);
        if (::testing::Test::HasFailure()) break;
      }
      if (::testing::Test::HasFailure()) break;
    }
    ggml_bench::set_ggml_gemv_kernel(0);
    if (::testing::Test::HasFailure()) return;
  }
}

// ---- bf16 path (M > kGgmlGemvRows) -------------------------------------------------------------------------------

TEST(CudaGgml, PrefillBf16PathMatchesTheReference) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(1203);
  for (GgmlType t : kIntegerTypes) {
    const std::vector<int64_t> ks = k_sizes(t);
    run_case(rng, t, kGgmlGemvRows + 1, 130, ks[2], true);
    run_case(rng, t, 40, 37, ks[0], false);
    run_case(rng, t, 129, 67, ks[1], true);
    if (::testing::Test::HasFailure()) return;
  }
  // More rows than one pass decodes (linear_ggml.cu kDequantBytes, 32 MiB: 4096 rows of K 4096): two passes, the
  // second of 256 rows, their outputs staged and copied into their columns.
  run_case(rng, GgmlType::kQ4_K, kGgmlGemvRows + 1, 4352, 4096, true);
  run_case(rng, GgmlType::kQ6_K, 20, 4352, 4096, false);
}

// ---- non-finite activations --------------------------------------------------------------------------------------

TEST(CudaGgml, NonFiniteActivationsStayInTheirRow) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(1204);
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ8_0, GgmlType::kQ4_1})
    for (int64_t M : {int64_t{5}, kGgmlGemvRows, int64_t{20}}) {
      const int64_t K = 2 * format_of(t).block_size;
      Inputs in = make_inputs(rng, t, M, 37, K, true);
      SCOPED_TRACE(in.describe());
      in.x[static_cast<size_t>(1 * K + 40)] = std::nanf("");
      in.x[static_cast<size_t>(3 * K + 3)] = INFINITY;
      in.x[static_cast<size_t>(4 * K + K - 1)] = -INFINITY;
      check_outputs(in, run_gpu(in), {1, 3, 4});
      if (::testing::Test::HasFailure()) return;
    }
}

// ---- ggml_dequantize_bf16 ----------------------------------------------------------------------------------------

void check_dequantize(GgmlType t, const std::vector<uint8_t>& w, int64_t rows, int64_t K) {
  const std::vector<float> want = decode_rows(t, w, rows, K);
  Stream stream;
  DeviceBuffer d_w = to_device(w.data(), w.size());
  Guarded<uint16_t> out(static_cast<size_t>(rows * K));
  ggml_dequantize_bf16(d_w.data(), static_cast<uint32_t>(t), rows, K, out.data(), Exec{stream.handle(), nullptr, 0});
  stream.synchronize();
  EXPECT_TRUE(out.guards_intact());
  const std::vector<uint16_t> got = out.download();
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isnan(want[i]) ? std::isnan(bf16_to_f32(got[i])) : got[i] == f32_to_bf16(want[i]);
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << "row " << static_cast<int64_t>(i) / K << " element " << static_cast<int64_t>(i) % K
                    << ": got bf16 0x" << std::hex << got[i] << ", want 0x" << f32_to_bf16(want[i]) << std::dec
                    << " (decoder value " << want[i] << ")";
  }
  EXPECT_EQ(failures, 0);
}

TEST(CudaGgml, DequantizeBf16EqualsTheDecoderRounded) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(1205);
  for (GgmlType t : kIntegerTypes) {
    const quant::GgmlBlockFormat& f = format_of(t);
    for (int64_t K : k_sizes(t))
      for (int64_t rows : {1, 7, 33, 130}) {
        SCOPED_TRACE(std::string(f.name) + " rows " + std::to_string(rows) + " K " + std::to_string(K));
        check_dequantize(t, test::random_blocks(rng, t, rows * K / f.block_size), rows, K);
        if (::testing::Test::HasFailure()) return;
      }
    // A block with a non-finite float16 field (+inf, a NaN): the decoder's NaNs stay NaN, its infinities and every
    // finite value round as the others.
    const int64_t rows = 3, K = 2 * f.block_size;
    for (int field : f.f16_fields) {
      if (field < 0) continue;
      for (uint16_t bad : {uint16_t{0x7C00}, uint16_t{0xFE00}}) {
        std::vector<uint8_t> w = test::random_blocks(rng, t, rows * K / f.block_size);
        std::memcpy(w.data() + 3 * f.block_bytes + field, &bad, 2);  // row 1's second block (row 1, block 1)
        SCOPED_TRACE(std::string(f.name) + " field at byte " + std::to_string(field) +
                     (bad == 0x7C00 ? " = +inf" : " = NaN"));
        check_dequantize(t, w, rows, K);
      }
    }
  }
}

// ---- ggml_embed_rows ---------------------------------------------------------------------------------------------

TEST(CudaGgml, EmbedRowsEqualTheDecoderTimesScale) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(1206);
  const int64_t vocab = 50;
  const float scale = 25.3f;  // not a power of two: the product really rounds
  for (GgmlType t : kIntegerTypes) {
    const quant::GgmlBlockFormat& f = format_of(t);
    const int64_t bs = f.block_size;
    for (int64_t K : {bs, 3 * bs, bs == 32 ? int64_t{2080} : int64_t{4096}}) {
      SCOPED_TRACE(std::string(f.name) + " K " + std::to_string(K));
      const std::vector<uint8_t> w = test::random_blocks(rng, t, vocab * K / f.block_size);
      const std::vector<float> table = decode_rows(t, w, vocab, K);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
      std::vector<int32_t> tokens(11);
      for (auto& id : tokens) id = pick(rng);
      tokens[0] = static_cast<int32_t>(vocab - 1);  // the last id
      tokens[2] = -1;                               // out of range below
      tokens[5] = 0;
      tokens[7] = static_cast<int32_t>(vocab);      // out of range above
      tokens[10] = static_cast<int32_t>(vocab - 1);
      const auto n = static_cast<int64_t>(tokens.size());
      Stream stream;
      DeviceBuffer d_w = to_device(w.data(), w.size());
      DeviceBuffer d_tokens = to_device(tokens.data(), tokens.size() * sizeof(int32_t));
      Guarded<float> out(static_cast<size_t>(n * K));
      ggml_embed_rows(d_w.data(), static_cast<uint32_t>(t), vocab, K, d_tokens.as<int32_t>(), n, scale, out.data(),
                      Exec{stream.handle(), nullptr, 0});
      stream.synchronize();
      EXPECT_TRUE(out.guards_intact());
      const std::vector<float> got = out.download();
      for (int64_t r = 0; r < n; ++r) {
        const int32_t id = tokens[static_cast<size_t>(r)];
        for (int64_t k = 0; k < K; ++k) {
          const float g = got[static_cast<size_t>(r * K + k)];
          if (id < 0 || id >= vocab) {
            ASSERT_TRUE(std::isnan(g)) << "row " << r << " (bad id " << id << ") element " << k << " is " << g;
          } else {
            const float want = table[static_cast<size_t>(id * K + k)] * scale;  // float32, one rounding
            ASSERT_EQ(f32_bits(g), f32_bits(want)) << "row " << r << " (id " << id << ") element " << k << ": " << g
                                                   << " vs " << want;
          }
        }
      }
    }
  }
}

// ---- argument errors ---------------------------------------------------------------------------------------------

// Expects fn() to throw cider::Error whose message names op and holds the offending value: one of `values` (a type
// may be named by its id or its format's name; an empty list: no value to look for, e.g. a null pointer).
void expect_error(const std::function<void()>& fn, const char* op, const std::vector<std::string>& values,
                  const char* what) {
  try {
    fn();
    ADD_FAILURE() << op << ": no error for " << what;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(op), std::string::npos) << what << ": " << msg;
    bool found = values.empty();
    for (const std::string& v : values) found = found || msg.find(v) != std::string::npos;
    EXPECT_TRUE(found) << what << ": the message does not hold " << (values.empty() ? "" : values[0]) << ": " << msg;
  }
}

TEST(CudaGgml, BadArgumentsAreErrorsNamingTheOp) {
  CIDER_REQUIRE_GPU();
  Stream stream;
  DeviceBuffer buf(size_t{1} << 20);
  // Enough for every shape below (both paths).
  DeviceBuffer ws(std::max(ggml_linear_workspace_bytes(kGgmlGemvRows + 1, 64, 4096),
                           ggml_linear_workspace_bytes(kGgmlGemvRows, 64, 4096)));
  const Exec exec{stream.handle(), ws.data(), ws.bytes()};
  const Exec no_ws{stream.handle(), nullptr, 0};
  auto* f = buf.as<float>();

  // ggml_linear: Q4_K, M 2, N 4, K 256 (row 144 bytes).
  {
    const char* op = "cuda.ggml_linear";
    kernels::GgmlLinearArgs good{};
    good.x = f;
    good.w = buf.data();
    good.ggml_type = static_cast<uint32_t>(GgmlType::kQ4_K);
    good.row_bytes = 144;
    good.bias = nullptr;
    good.out = f + 4096;
    good.M = 2;
    good.N = 4;
    good.K = 256;
    EXPECT_NO_THROW(ggml_linear(good, exec));
    stream.synchronize();
    auto bad = [&](const std::function<void(kernels::GgmlLinearArgs&)>& edit, const std::vector<std::string>& value,
                   const char* what, const Exec& e) {
      kernels::GgmlLinearArgs a = good;
      edit(a);
      expect_error([&] { ggml_linear(a, e); }, op, value, what);
    };
    for (int64_t M : {int64_t{2}, kGgmlGemvRows + 1}) {  // both paths validate
      SCOPED_TRACE("M " + std::to_string(M));
      auto with_m = [&](const std::function<void(kernels::GgmlLinearArgs&)>& edit) {
        return [=](kernels::GgmlLinearArgs& a) {
          a.M = M;
          edit(a);
        };
      };
      bad(with_m([](auto& a) { a.ggml_type = 11; }), {"11", "Q3_K"}, "Q3_K (no integer form)", exec);
      bad(with_m([](auto& a) { a.ggml_type = 1; }), {"1"}, "F16 (not a block format)", exec);
      bad(with_m([](auto& a) { a.K = 128; a.row_bytes = 72; }), {"128"}, "K not a multiple of 256 (Q4_K)", exec);
      bad(with_m([](auto& a) {
            a.ggml_type = static_cast<uint32_t>(GgmlType::kQ8_0);
            a.K = 100;
            a.row_bytes = 34 * 4;
          }),
          {"100"}, "K not a multiple of 32 (Q8_0)", exec);
      bad(with_m([](auto& a) { a.row_bytes = 143; }), {"143"}, "row_bytes not the format's", exec);
      bad(with_m([](auto& a) { a.N = -1; }), {"-1"}, "N < 0", exec);
      bad(with_m([](auto& a) { a.K = -256; }), {"-256"}, "K < 0", exec);
      bad(with_m([](auto& a) { a.x = nullptr; }), {}, "null x", exec);
      bad(with_m([](auto& a) { a.w = nullptr; }), {}, "null w", exec);
      bad(with_m([](auto& a) { a.out = nullptr; }), {}, "null out", exec);
    }
    bad([](auto& a) { a.M = -1; }, {"-1"}, "M < 0", exec);
    // Workspace one byte short of ggml_linear_workspace_bytes (each path that needs one), and none at all.
    for (int64_t M : {int64_t{2}, kGgmlGemvRows + 1}) {
      const size_t need = ggml_linear_workspace_bytes(M, good.N, good.K);
      if (need == 0) continue;
      SCOPED_TRACE("M " + std::to_string(M) + " needs " + std::to_string(need) + " workspace bytes");
      bad([M](auto& a) { a.M = M; }, {std::to_string(need - 1)}, "workspace one byte short",
          Exec{stream.handle(), ws.data(), need - 1});
      bad([M](auto& a) { a.M = M; }, {}, "no workspace", no_ws);
    }
  }

  // ggml_dequantize_bf16: Q4_K, 4 rows of 256.
  {
    const char* op = "cuda.ggml_dequantize_bf16";
    auto* o = buf.as<uint16_t>() + 65536;
    const uint32_t q4k = static_cast<uint32_t>(GgmlType::kQ4_K);
    EXPECT_NO_THROW(ggml_dequantize_bf16(buf.data(), q4k, 4, 256, o, no_ws));
    stream.synchronize();
    expect_error([&] { ggml_dequantize_bf16(buf.data(), 11, 4, 256, o, no_ws); }, op, {"11", "Q3_K"}, "Q3_K");
    expect_error([&] { ggml_dequantize_bf16(buf.data(), 1, 4, 256, o, no_ws); }, op, {"1"}, "F16");
    expect_error([&] { ggml_dequantize_bf16(buf.data(), q4k, 4, 128, o, no_ws); }, op, {"128"}, "K not a multiple");
    expect_error([&] { ggml_dequantize_bf16(buf.data(), q4k, -1, 256, o, no_ws); }, op, {"-1"}, "rows < 0");
    expect_error([&] { ggml_dequantize_bf16(buf.data(), q4k, 4, -256, o, no_ws); }, op, {"-256"}, "K < 0");
    expect_error([&] { ggml_dequantize_bf16(nullptr, q4k, 4, 256, o, no_ws); }, op, {}, "null w");
    expect_error([&] { ggml_dequantize_bf16(buf.data(), q4k, 4, 256, nullptr, no_ws); }, op, {}, "null out");
  }

  // ggml_embed_rows: Q8_0, vocab 8, K 64, 2 tokens (ids 0, zero bytes).
  {
    const char* op = "cuda.ggml_embed_rows";
    DeviceBuffer tokens(2 * sizeof(int32_t));
    tokens.fill(0);
    const auto* ids = tokens.as<int32_t>();
    const uint32_t q80 = static_cast<uint32_t>(GgmlType::kQ8_0), q4k = static_cast<uint32_t>(GgmlType::kQ4_K);
    float* o = f + 65536;
    EXPECT_NO_THROW(ggml_embed_rows(buf.data(), q80, 8, 64, ids, 2, 1.0f, o, no_ws));
    stream.synchronize();
    expect_error([&] { ggml_embed_rows(buf.data(), 11, 8, 256, ids, 2, 1.0f, o, no_ws); }, op, {"11", "Q3_K"}, "Q3_K");
    expect_error([&] { ggml_embed_rows(buf.data(), 1, 8, 64, ids, 2, 1.0f, o, no_ws); }, op, {"1"}, "F16");
    expect_error([&] { ggml_embed_rows(buf.data(), q4k, 8, 128, ids, 2, 1.0f, o, no_ws); }, op, {"128"},
                 "K not a multiple of 256 (Q4_K)");
    expect_error([&] { ggml_embed_rows(buf.data(), q80, 8, 48, ids, 2, 1.0f, o, no_ws); }, op, {"48"},
                 "K not a multiple of 32 (Q8_0)");
    expect_error([&] { ggml_embed_rows(buf.data(), q80, -1, 64, ids, 2, 1.0f, o, no_ws); }, op, {"-1"}, "vocab < 0");
    expect_error([&] { ggml_embed_rows(buf.data(), q80, 8, -64, ids, 2, 1.0f, o, no_ws); }, op, {"-64"}, "K < 0");
    expect_error([&] { ggml_embed_rows(buf.data(), q80, 8, 64, ids, -1, 1.0f, o, no_ws); }, op, {"-1"}, "n < 0");
    expect_error([&] { ggml_embed_rows(nullptr, q80, 8, 64, ids, 2, 1.0f, o, no_ws); }, op, {}, "null w");
    expect_error([&] { ggml_embed_rows(buf.data(), q80, 8, 64, nullptr, 2, 1.0f, o, no_ws); }, op, {}, "null tokens");
    expect_error([&] { ggml_embed_rows(buf.data(), q80, 8, 64, ids, 2, 1.0f, nullptr, no_ws); }, op, {}, "null out");
  }
  stream.synchronize();
}

// Null pointers are errors only where their size is non-zero (the rule above): an empty call is a no-op.
TEST(CudaGgml, EmptyCallsAcceptNullPointers) {
  CIDER_REQUIRE_GPU();
  Stream stream;
  const Exec no_ws{stream.handle(), nullptr, 0};
  DeviceBuffer buf(size_t{1} << 16);
  kernels::GgmlLinearArgs a{};
  a.ggml_type = static_cast<uint32_t>(GgmlType::kQ4_K);
  a.row_bytes = 144;
  a.K = 256;
  a.M = 0;  // no activation rows: x and out empty
  a.N = 4;
  a.w = buf.data();
  EXPECT_NO_THROW(ggml_linear(a, no_ws)) << "M = 0";
  a.M = 2;  // no output columns: w and out empty
  a.N = 0;
  a.w = nullptr;
  a.x = buf.as<float>();
  DeviceBuffer ws(ggml_linear_workspace_bytes(2, 0, 256));
  EXPECT_NO_THROW(ggml_linear(a, Exec{stream.handle(), ws.data(), ws.bytes()})) << "N = 0";
  EXPECT_NO_THROW(ggml_dequantize_bf16(nullptr, static_cast<uint32_t>(GgmlType::kQ4_K), 0, 256, nullptr, no_ws))
      << "rows = 0";
  EXPECT_NO_THROW(ggml_embed_rows(buf.data(), static_cast<uint32_t>(GgmlType::kQ8_0), 8, 64, nullptr, 0, 1.0f,
                                  nullptr, no_ws))
      << "n = 0";
  stream.synchronize();
}

}  // namespace
}  // namespace cider::cuda
