// CUDA W8A8 / W4A8 decode GEMV (kernels/cuda/linear_gemv.cu) against the CPU reference kernels.
//
// Tolerance, derived: the activation codes and the integer group sums are exact on both sides, and both form the
// same float32 terms t_g = fl(sw_g · float(acc_g)). They differ only in the order of the float32 sum over the G
// groups (any order is within γ_{G-1}·Σ|t_g| of the exact sum) and then round the same two operations (·sx, +bias),
// so |gpu − ref| ≤ 2·(G+1)·u·(sx·Σ|t_g| + |bias|) with u = 2⁻²⁴ (per channel G = 1, and in fact bit-identical).
// A bf16/f16 output rounds each side's float32 value by at most half an ulp of the output dtype, so the outputs may
// differ by one more ulp (when the two float32 values straddle a rounding boundary). NaN never passes, except where
// the reference itself gives NaN (a row of x holding NaN/inf).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/kernel_table.h"
#include "quant/int4.h"
#include "quant/int8.h"
#include "support/scoped_env.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace gemv_bench {
// linear_gemv.cu (tests and benchmarks only)
void set_gemv_tuning(int warps, int blocks_per_sm, int quantize, int ring, int epilogue_prefetch, int split);
void set_gemv_kernel(int kernel);  // 0 automatic, 1 tile, 2 rows (M = 1)
int last_gemv_kernel();            // the kernel of the latest launch
void set_gemv_k_split(int mode);   // 0 automatic, 1 never (rows that do not fit shared memory go in passes)
int last_gemv_k_slices();          // slices of K of the latest tile-kernel call
// linear_gemv_rows.cu: the row kernel's weight loads (0 automatic, 1 registers, 2 / 3 / 6 bulk-copy slots per
// warp) and which ran last (1 registers, 2 bulk copies)
void set_gemv_row_loads(int loads);
int last_gemv_row_loads();
}
namespace {

// Launch knobs (warps per block, blocks per SM, ring 1 = registers, epilogue prefetch 1 = on, warps per tile;
// 0 = automatic) for the scope of one test. g_kernel: 1 the tile kernel, 2 the row kernel; 0 (automatic): an M = 1
// case without tile knobs runs through both kernels (the automatic choice, the row kernel, and the tile kernel).
int g_warps = 0, g_blocks_per_sm = 0, g_ring = 0, g_prefetch = 0, g_split = 0, g_kernel = 0;
struct KernelScope {
  explicit KernelScope(int kernel) { g_kernel = kernel; }
  ~KernelScope() { g_kernel = 0; }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;
};
constexpr int kTileKernel = 1, kRowKernel = 2;
constexpr int kLoadsRegisters = 1, kLoadsBulk = 2, kLoadsBulk2Slots = 2, kLoadsBulk3Slots = 3;
struct TuningScope {
  TuningScope(int warps, int blocks_per_sm, int ring, int prefetch, int split = 0) {
    g_warps = warps, g_blocks_per_sm = blocks_per_sm, g_ring = ring, g_prefetch = prefetch, g_split = split;
  }
  ~TuningScope() { g_warps = 0, g_blocks_per_sm = 0, g_ring = 0, g_prefetch = 0, g_split = 0; }
  TuningScope(const TuningScope&) = delete;
  TuningScope& operator=(const TuningScope&) = delete;
};

constexpr size_t kGuard = 256;  // poisoned bytes on each side of the output
constexpr double kU = 1.0 / 16777216.0;

struct Case {
  bool int4;
  int64_t M, N, K;
  int group_size;
  DType x_dtype, out_dtype;
  bool bias;
  std::string describe() const {
    std::ostringstream s;
    s << (int4 ? "w4a8" : "w8a8") << " M" << M << " N" << N << " K" << K << " gs" << group_size << " x "
      << dtype_name(x_dtype) << " out " << dtype_name(out_dtype) << (bias ? " bias" : "");
    return s.str();
  }
};

// One ulp of a bf16/f16 value of magnitude |v| (0 for f32: no output rounding beyond the float32 bound).
double out_ulp(DType t, double v) {
  if (t == DType::kF32) return 0.0;
  int e = 0;
  std::frexp(std::max(std::fabs(v), 1e-30), &e);  // |v| = f·2^e, f in [0.5, 1): ulp = 2^(e − 1 − mantissa bits)
  if (t == DType::kBF16) return std::ldexp(1.0, std::max(e - 8, -133));
  return std::ldexp(1.0, std::max(e - 11, -24));
}

int weight_code(const Case& c, const uint8_t* w, int64_t n, int64_t k) {
  if (c.int4) return quant::int4_code(w + n * (c.K / 2), k);
  return static_cast<int8_t>(w[n * c.K + k]);
}

int g_last_ws_slices = 1;  // slices of K of run_case's latest workspace call

// Runs one case on the GPU and the reference with the same inputs and checks every output element and the guards.
// x_override: M·K float values to use instead of random ones (special rows).
void run_case(const Case& c, std::mt19937_64& rng, const std::vector<float>* x_override = nullptr) {
  SCOPED_TRACE(c.describe());
  const int64_t M = c.M, N = c.N, K = c.K;
  const int64_t groups = c.group_size == 0 ? 1 : K / c.group_size;
  const int64_t span = K / groups;

  std::vector<float> x = x_override ? *x_override : test::randn(rng, static_cast<size_t>(M * K), 1.5f);
  const std::vector<uint8_t> x_bytes = test::to_dtype_bytes(x, c.x_dtype);
  const size_t w_bytes = static_cast<size_t>(c.int4 ? N * K / 2 : N * K);
  std::vector<uint8_t> w(w_bytes);
  for (auto& b : w) b = static_cast<uint8_t>(rng() & 0xffu);
  if (!c.int4)  // the W8 format never holds -128 (symmetric codes)
    for (auto& b : w) b = b == 0x80 ? 0x81 : b;
  const std::vector<float> scales = test::uniform(rng, static_cast<size_t>(groups * N), 1e-3f, 2e-2f);
  const std::vector<float> bias = test::randn(rng, static_cast<size_t>(N), 2.0f);

  // Reference.
  const size_t out_elem = static_cast<size_t>(dtype_size(c.out_dtype));
  const size_t out_bytes = static_cast<size_t>(M * N) * out_elem;
  std::vector<uint8_t> want_bytes(out_bytes);
  kernels::IntLinearArgs host{x_bytes.data(), c.x_dtype, w.data(), scales.data(), c.bias ? bias.data() : nullptr,
                              want_bytes.data(), c.out_dtype, M, N, K, c.group_size};
  const kernels::KernelTable& ref = kernels::ref_kernels();
  if (c.int4) (M == 1 ? ref.w4a8_gemv : ref.w4a8_gemm)(host);
  else (M == 1 ? ref.w8a8_gemv : ref.w8a8_gemm)(host);

  // GPU, output poisoned (0xFF bytes: NaN in every float dtype) and guarded; twice: activation codes derived in every
  // block (no workspace) and computed once into exec.workspace (poisoned too) by quantize_rows_int8.
  DeviceBuffer d_x = to_device(x_bytes.data(), x_bytes.size());
  DeviceBuffer d_w = to_device(w.data(), w.size());
  DeviceBuffer d_scales = to_device(scales.data(), scales.size() * sizeof(float));
  DeviceBuffer d_bias = to_device(bias.data(), bias.size() * sizeof(float));
  DeviceBuffer d_out(out_bytes + 2 * kGuard);
  DeviceBuffer d_ws(int_linear_workspace_bytes(M, K));
  kernels::IntLinearArgs dev = host;
  dev.x = d_x.data();
  dev.w = d_w.data();
  dev.w_scales = d_scales.as<float>();
  dev.bias = c.bias ? d_bias.as<float>() : nullptr;
  dev.out = static_cast<uint8_t*>(d_out.data()) + kGuard;
  std::vector<std::vector<float>> gots;
  std::vector<std::string> labels;
  const bool tile_knobs = g_warps || g_blocks_per_sm || g_ring || g_prefetch || g_split;
  // (kernel, row loads): an M = 1 case runs the automatic choice (the row kernel: registers for these test sizes,
  // bulk copies only for per-channel matrices of ≥ 28 MB), the tile kernel and the row kernel with bulk copies (3
  // slots per warp); RowKernelShapesAndGroups runs every load variant (automatic, registers, 2 and 3 slots).
  std::vector<std::pair<int, int>> variants = {{g_kernel, 0}};
  if (M == 1 && g_kernel == 0 && !tile_knobs) variants = {{0, 0}, {kTileKernel, 0}, {0, kLoadsBulk3Slots}};
  if (M == 1 && g_kernel == kRowKernel)
    variants = {{kRowKernel, 0}, {kRowKernel, kLoadsRegisters}, {kRowKernel, kLoadsBulk2Slots},
                {kRowKernel, kLoadsBulk3Slots}};
  // Modes: the codes fused in every block, computed once into the workspace, and — where the workspace call sliced K
  // (rows that do not fit shared memory) — the workspace with the rows in several passes instead.
  int ws_slices = 1;
  size_t ws_index = 0, passes_index = 0;
  for (const auto& [kernel, loads] : variants)
  for (int mode = 0; mode < 3; ++mode) {
    const int use_workspace = mode > 0 ? 1 : 0;
    if (mode == 2 && ws_slices == 1) continue;
    const std::string label = std::string(mode == 2 ? "workspace, rows in passes" : use_workspace ? "workspace" : "fused") +
                              (kernel == kTileKernel ? ", tile kernel" : kernel == kRowKernel ? ", row kernel" : "") +
                              (loads == kLoadsRegisters ? ", register loads"
                               : loads >= kLoadsBulk2Slots ? ", bulk loads " + std::to_string(loads) + " slots" : "");
    d_out.fill(0xFF);
    d_ws.fill(0xFF);
    Exec exec{};
    if (use_workspace) {
      exec.workspace = d_ws.data();
      exec.workspace_bytes = d_ws.bytes();
    }
    // quantize 2: the workspace path for every M (the automatic choice takes it for a large x only).
    gemv_bench::set_gemv_tuning(g_warps, g_blocks_per_sm, use_workspace ? 2 : 0, g_ring, g_prefetch, g_split);
    gemv_bench::set_gemv_kernel(kernel);
    gemv_bench::set_gemv_row_loads(loads);
    gemv_bench::set_gemv_k_split(mode == 2 ? 1 : 0);
    if (c.int4) w4a8_gemv(dev, exec);
    else w8a8_gemv(dev, exec);
    gemv_bench::set_gemv_tuning(0, 0, 0, 0, 0, 0);
    gemv_bench::set_gemv_kernel(0);
    gemv_bench::set_gemv_row_loads(0);
    gemv_bench::set_gemv_k_split(0);
    if (mode == 1) {
      ws_slices = gemv_bench::last_gemv_k_slices();
      ws_index = gots.size();
    }
    if (mode == 2) {
      EXPECT_EQ(gemv_bench::last_gemv_k_slices(), 1) << label;
      passes_index = gots.size();
    }
    // Which kernel ran: the row kernel serves M = 1 (K ≤ 65536) unless the tile kernel or its knobs were asked for.
    const int want_kernel = (M == 1 && K <= 65536 && kernel != kTileKernel && (kernel == kRowKernel || !tile_knobs))
                                ? kRowKernel : kTileKernel;
    EXPECT_EQ(gemv_bench::last_gemv_kernel(), want_kernel) << label;
    // And its weight loads: bulk copies when asked for (or automatically per channel) unless the slots and x do not
    // fit shared memory (192 KB of slots + K activation bytes: K ≤ 16384 always fits, K ≥ 40000 never does).
    if (want_kernel == kRowKernel) {
      const int64_t weight_bytes = N * (c.int4 ? K / 2 : K);
      const bool bulk = loads >= kLoadsBulk2Slots || (loads == 0 && c.group_size == 0 && weight_bytes >= (28 << 20));
      if (!bulk || K >= 40000) {
        EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsRegisters) << label;
      } else if (K <= 16384) {
        EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsBulk) << label;
      }
    }
    device_synchronize("test_cuda_gemv");
    std::vector<uint8_t> got_all(d_out.bytes());
    d_out.download(got_all.data(), got_all.size());
    for (size_t i = 0; i < kGuard; ++i) {
      ASSERT_EQ(got_all[i], 0xFF) << "write before the output at byte " << i << " (" << label << ")";
      ASSERT_EQ(got_all[kGuard + out_bytes + i], 0xFF) << "write past the output at byte " << i << " (" << label << ")";
    }
    gots.push_back(test::from_dtype_bytes(got_all.data() + kGuard, c.out_dtype, static_cast<size_t>(M * N)));
    labels.push_back(label);
  }
  const std::vector<float> want = test::from_dtype_bytes(want_bytes.data(), c.out_dtype, static_cast<size_t>(M * N));
  g_last_ws_slices = ws_slices;
  // Per channel the slices' int32 partial sums add exactly: the same bits as the rows in passes.
  if (ws_slices > 1 && c.group_size == 0) {
    EXPECT_EQ(std::memcmp(gots[ws_index].data(), gots[passes_index].data(), gots[ws_index].size() * sizeof(float)), 0)
        << "K in " << ws_slices << " slices against the rows in passes";
  }

  // Per element: the bound above, from the exact codes (quant::quantize_int8_row, as the reference quantizes).
  const size_t x_row_bytes = static_cast<size_t>(K) * static_cast<size_t>(dtype_size(c.x_dtype));
  std::vector<int8_t> xq(static_cast<size_t>(K));
  int failures = 0;
  for (size_t variant = 0; variant < gots.size(); ++variant) {
    const std::vector<float>& got = gots[variant];
    for (int64_t m = 0; m < M; ++m) {
      const float sx = quant::quantize_int8_row(x_bytes.data() + static_cast<size_t>(m) * x_row_bytes, c.x_dtype, K,
                                                xq.data());
      for (int64_t n = 0; n < N; ++n) {
        const size_t i = static_cast<size_t>(m * N + n);
        if (std::isnan(want[i])) {  // the reference's NaN row (x held NaN/inf)
          EXPECT_TRUE(std::isnan(got[i])) << "[" << m << ", " << n << "] want NaN, got " << got[i];
          continue;
        }
        double abs_terms = 0;  // Σ_g |sw_g · acc_g|
        for (int64_t gi = 0; gi < groups; ++gi) {
          int64_t acc = 0;
          for (int64_t k = gi * span; k < (gi + 1) * span; ++k)
            acc += static_cast<int64_t>(xq[static_cast<size_t>(k)]) * weight_code(c, w.data(), n, k);
          const float sw = c.group_size == 0 ? scales[static_cast<size_t>(n)] : scales[static_cast<size_t>(gi * N + n)];
          abs_terms += std::fabs(static_cast<double>(sw) * static_cast<double>(acc));
        }
        const double magnitude = static_cast<double>(sx) * abs_terms * (1 + 4 * kU) +
                                 (c.bias ? std::fabs(static_cast<double>(bias[static_cast<size_t>(n)])) : 0.0);
        double tol = 2.0 * static_cast<double>(groups + 1) * kU * magnitude * 1.01 + 1e-37;
        tol += out_ulp(c.out_dtype, std::max(std::fabs(static_cast<double>(want[i])), std::fabs(static_cast<double>(got[i]))));
        const double diff = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
        if (std::isnan(got[i]) || !(diff <= tol)) {
          if (++failures <= 5)
            ADD_FAILURE() << "[" << m << ", " << n << "] got " << got[i] << ", want " << want[i] << " (diff " << diff
                          << " > tol " << tol << ") (" << labels[variant] << ")";
        }
      }
    }
  }
  EXPECT_EQ(failures, 0) << "elements out of tolerance";
}

const std::vector<DType>& float_dtypes() {
  static const std::vector<DType> t = {DType::kF32, DType::kBF16, DType::kF16};
  return t;
}

std::vector<int> group_sizes(bool int4, int64_t K) {
  std::vector<int> out;
  for (int gs : int4 ? std::vector<int>{0, 32, 64, 128, 256} : std::vector<int>{0, 64, 128, 256})
    if (gs == 0 || K % gs == 0) out.push_back(gs);
  return out;
}

// Every M/K/N combination of the sweep; scale mode, dtypes and bias rotate so that each appears many times.
void sweep_shapes(bool int4, uint64_t salt) {
  auto rng = test::make_rng(salt);
  int i = 0;
  for (int64_t M : {1, 2, 5, 16})
    for (int64_t K : {64, 128 * 3, 128 * 9, 4096, 4160})
      for (int64_t N : {1, 7, 33, 67, 129, 4097}) {
        if (K == 128 * 9 && N == 4097) continue;  // keeps the CPU reference time down; 4097 is covered by 3 K's
        const std::vector<int> gss = group_sizes(int4, K);
        Case c{int4, M, N, K, gss[static_cast<size_t>(i) % gss.size()], float_dtypes()[static_cast<size_t>(i) % 3],
               float_dtypes()[static_cast<size_t>(i / 3) % 3], i % 2 == 0};
        run_case(c, rng);
        ++i;
        if (::testing::Test::HasFatalFailure()) return;
      }
}

TEST(CudaGemv, W8A8Shapes) {
  CIDER_REQUIRE_GPU();
  sweep_shapes(false, 501);
}

TEST(CudaGemv, W4A8Shapes) {
  CIDER_REQUIRE_GPU();
  sweep_shapes(true, 502);
}

// Every scale mode × x dtype × out dtype × bias, with one and two column blocks (M ≤ 8, M > 8).
void sweep_modes(bool int4, uint64_t salt) {
  auto rng = test::make_rng(salt);
  const int64_t K = 1024, N = 67;
  for (int64_t M : {3, 12})
    for (int gs : group_sizes(int4, K))
      for (DType xd : float_dtypes())
        for (DType od : float_dtypes())
          for (bool bias : {false, true}) {
            run_case(Case{int4, M, N, K, gs, xd, od, bias}, rng);
            if (::testing::Test::HasFatalFailure()) return;
          }
}

TEST(CudaGemv, W8A8EveryModeAndDtype) {
  CIDER_REQUIRE_GPU();
  sweep_modes(false, 503);
}

TEST(CudaGemv, W4A8EveryModeAndDtype) {
  CIDER_REQUIRE_GPU();
  sweep_modes(true, 504);
}

// Without the epilogue prefetch (scale/bias loaded after the barrier; the default prefetches them one tile ahead)
// over every mode, dtype and bias choice.
TEST(CudaGemv, EveryModeWithoutEpiloguePrefetch) {
  CIDER_REQUIRE_GPU();
  TuningScope scope(0, 0, 0, 2);
  sweep_modes(false, 508);
  sweep_modes(true, 509);
}

// Rows that pin the activation quantization: NaN / inf rows (NaN outputs), an all-zero row (sx = 1, out = bias),
// a row whose scale is exactly 1 with values at k + 0.5 (rint's ties to even), a row of one huge and tiny values.
TEST(CudaGemv, SpecialActivationRows) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(505);
  const int64_t M = 6, K = 512, N = 33;
  std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
  auto row = [&](int64_t m) { return x.begin() + m * K; };
  row(1)[17] = INFINITY;
  std::fill(row(2), row(2) + K, 0.0f);
  for (int64_t k = 0; k < K; ++k) row(3)[k] = static_cast<float>(k % 120) - 59.5f;  // ties at ±0.5 … ±59.5
  row(3)[5] = 127.0f;                                                              // sx = 127 / 127 = 1
  row(4)[300] = NAN;
  for (int64_t k = 0; k < K; ++k) row(5)[k] = 1e-3f * static_cast<float>((k * 37) % 11 - 5);
  row(5)[7] = 3e4f;
  for (bool int4 : {false, true})
    for (int gs : {0, 64})
      for (DType xd : float_dtypes()) run_case(Case{int4, M, N, K, gs, xd, DType::kF32, true}, rng, &x);
}

// K large enough that 16 quantized rows do not fit shared memory: the launcher runs the rows in several passes (the
// fused codes; with the workspace and a float32 output it slices K instead, as KInSlices checks).
TEST(CudaGemv, RowsInSeveralPasses) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(506);
  for (bool int4 : {false, true})
    for (int gs : {0, 128}) run_case(Case{int4, 16, 33, 8192, gs, DType::kBF16, DType::kF32, true}, rng);
  run_case(Case{false, 9, 7, 24576, 0, DType::kF32, DType::kBF16, false}, rng);
}

// The down projection's K (14 336) at 8 and 16 rows: the codes of all rows do not fit shared memory, so with the
// workspace K goes in slices (partial sums carried in the float32 output) — every scale mode against the reference,
// per channel bit for bit the rows-in-passes result (run_case); a bf16 output runs the rows in passes.
TEST(CudaGemv, KInSlices) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(510);
  for (bool int4 : {false, true})
    for (int gs : int4 ? std::vector<int>{0, 32, 64, 256} : std::vector<int>{0, 64, 256}) {
      run_case(Case{int4, 16, 97, 14336, gs, DType::kF32, DType::kF32, true}, rng);
      EXPECT_GT(g_last_ws_slices, 1) << (int4 ? "w4a8" : "w8a8") << " gs " << gs;
    }
  run_case(Case{true, 8, 4097, 14336, 64, DType::kBF16, DType::kF32, false}, rng);
  EXPECT_GT(g_last_ws_slices, 1);
  run_case(Case{false, 16, 33, 14336, 0, DType::kF32, DType::kBF16, true}, rng);
  EXPECT_EQ(g_last_ws_slices, 1);
}

// W4 groups of 64 through the tile kernel: with the cp.async ring two groups per chunk of 128 k (16-byte loads, one
// mma per group), with the register ring one group per chunk (8-byte loads). K with a half chunk at the end (64,
// 4160 = 32.5 chunks), whole chunks, the down projection's K in slices, M across both column blocks, N tails, every
// dtype.
TEST(CudaGemv, W4Groups64BothRings) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(511);
  for (int ring : {0, 1}) {
    SCOPED_TRACE(ring == 0 ? "cp.async ring, two groups per chunk" : "register ring, a group per chunk");
    TuningScope scope(0, 0, ring, 0);
    int i = 0;
    for (int64_t M : {1, 4, 8, 9, 16})
      for (int64_t K : {64, 192, 4096, 4160})
        for (int64_t N : {67, 4129}) {
          run_case(Case{true, M, N, K, 64, float_dtypes()[static_cast<size_t>(i) % 3],
                        float_dtypes()[static_cast<size_t>(i / 3) % 3], i % 2 == 0}, rng);
          ++i;
          if (::testing::Test::HasFatalFailure()) return;
        }
    if (ring == 0) {
      run_case(Case{true, 16, 97, 14336, 64, DType::kBF16, DType::kF32, true}, rng);
      EXPECT_GT(g_last_ws_slices, 1);
    }
  }
}

// The launch variants the benchmarks compare (8 warps per block with per-channel scales, one block per SM, the
// register ring, no epilogue prefetch) compute the same results: a few shapes with tails through each.
TEST(CudaGemv, LaunchVariants) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(507);
  for (const auto& [warps, blocks_per_sm, ring, prefetch] : std::vector<std::tuple<int, int, int, int>>{
           {8, 0, 0, 0}, {8, 1, 0, 0}, {16, 0, 1, 0}, {8, 2, 1, 0}, {0, 0, 0, 2}, {8, 0, 0, 2}, {0, 0, 1, 2}}) {
    TuningScope scope(warps, blocks_per_sm, ring, prefetch);
    for (bool int4 : {false, true})
      for (int64_t M : {1, 11})
        for (int gs : {0, 128}) {
          run_case(Case{int4, M, 4097, 4224, gs, DType::kF32, DType::kF32, true}, rng);  // 4224 = 33 · 128
          if (::testing::Test::HasFatalFailure()) return;
        }
  }
}

// Tile groups of 1, 2 and 4 warps (each group streams its own tiles and combines behind its own barrier) against
// the reference: every format, M across both column blocks, tails in N (4129 = 258·16 + 1) and K, with and without
// the epilogue prefetch, and more tiles than groups (N 4129: 259 tiles) as well as fewer (N 67: 5 tiles).
TEST(CudaGemv, TileGroupsOfOneTwoFourWarps) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(509);
  for (int split : {1, 2, 4})
    for (int prefetch : {0, 2}) {
      TuningScope scope(0, 0, 0, prefetch, split);
      for (bool int4 : {false, true})
        for (int64_t M : {1, 9, 16})
          for (const auto& [gs, K] : std::vector<std::pair<int, int64_t>>{{0, 2080}, {32, 2080}, {64, 2112}, {128, 4224}}) {
            if (gs == 32 && !int4) continue;  // W8 groups are 64/128/256
            for (int64_t N : {67, 4129}) {
              if (prefetch == 2 && N == 67) continue;
              run_case(Case{int4, M, N, K, gs, DType::kF32, DType::kF32, M != 9}, rng);
              if (::testing::Test::HasFatalFailure()) return;
            }
          }
    }
}

// The row kernel (M = 1, linear_gemv_rows.cu) over K with tails around its batch (8 chunk steps per lane: W8 4096 k,
// W4 8192 k per row and batch) and its two-rows-per-task switch (W8 K ≤ 2048, W4 K ≤ 4096), N from 1 to more rows
// than blocks, every scale mode (all group sizes at K 2048 and 8192), up to its K limit 65536.
TEST(CudaGemv, RowKernelShapesAndGroups) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(512);
  const KernelScope scope(kRowKernel);
  int i = 0;
  for (bool int4 : {false, true})
    for (int64_t K : {32, 64, 2048, 2080, 4096, 4128, 8192, 8224, 14336, 20480, 65536})
      for (int64_t N : {1, 7, 133, 4097}) {
        if (K > 8224 && N > 133) continue;  // keeps the CPU reference time down
        const std::vector<int> gss = group_sizes(int4, K);
        run_case(Case{int4, 1, N, K, gss[static_cast<size_t>(i) % gss.size()], float_dtypes()[static_cast<size_t>(i) % 3],
                      float_dtypes()[static_cast<size_t>(i / 3) % 3], i % 2 == 0},
                 rng);
        ++i;
        if (::testing::Test::HasFatalFailure()) return;
      }
  for (bool int4 : {false, true})
    for (int64_t K : {2048, 8192})
      for (int gs : group_sizes(int4, K)) {
        run_case(Case{int4, 1, 133, K, gs, DType::kBF16, DType::kBF16, true}, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
  // Past the row kernel's K limit (65536) an M = 1 call runs the tile kernel even when the row kernel is asked for
  // (run_case checks which kernel ran) and still matches the reference.
  run_case(Case{false, 1, 33, 65536 + 16, 0, DType::kF32, DType::kF32, true}, rng);
  run_case(Case{true, 1, 33, 65536 + 64, 0, DType::kF32, DType::kBF16, false}, rng);
}

// $CIDER_GEMV_KERNEL: "tile" sends M = 1 to the tile kernel, "rows" (the default) to the row kernel; M > 1 and
// K > 65536 always run the tile kernel; any other value is an error naming the op and the variable.
TEST(CudaGemv, KernelEnvironmentSwitch) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer x(size_t{1} << 20), w(size_t{1} << 25), s(size_t{1} << 16), out(size_t{1} << 16);
  x.fill(0);
  w.fill(0);
  s.fill(0);
  auto run = [&](int64_t M, int64_t K, int64_t N = 64) {
    const kernels::IntLinearArgs a{x.data(), DType::kF32, w.data(), s.as<float>(), nullptr, out.data(),
                                   DType::kF32, M, N, K, 0};
    w8a8_gemv(a, Exec{});
    device_synchronize("test_cuda_gemv");
    return gemv_bench::last_gemv_kernel();
  };
  EXPECT_EQ(run(1, 256), kRowKernel);
  EXPECT_EQ(run(2, 256), kTileKernel);
  EXPECT_EQ(run(1, 65536 + 16), kTileKernel);
  {
    const test::ScopedEnv env("CIDER_GEMV_KERNEL", "tile");
    EXPECT_EQ(run(1, 256), kTileKernel);
  }
  {
    const test::ScopedEnv env("CIDER_GEMV_KERNEL", "rows");
    EXPECT_EQ(run(1, 256), kRowKernel);
    EXPECT_EQ(run(3, 256), kTileKernel);
  }
  // $CIDER_GEMV_ROW_LOADS: "registers" / "bulk" choose the row kernel's weight loads. The default is bulk copies for
  // per-channel matrices of ≥ 28 MB (7200 × 4096 int8 here) where the slots fit shared memory, registers otherwise;
  // past the fit (K 65536) registers run even when bulk is asked for.
  EXPECT_EQ(run(1, 256), kRowKernel);
  EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsRegisters);
  EXPECT_EQ(run(1, 4096, 7200), kRowKernel);
  EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsBulk);
  EXPECT_EQ(run(1, 65536), kRowKernel);
  EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsRegisters);
  {
    const test::ScopedEnv env("CIDER_GEMV_ROW_LOADS", "registers");
    EXPECT_EQ(run(1, 4096, 7200), kRowKernel);
    EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsRegisters);
  }
  {
    const test::ScopedEnv env("CIDER_GEMV_ROW_LOADS", "bulk");
    EXPECT_EQ(run(1, 256), kRowKernel);
    EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsBulk);
    EXPECT_EQ(run(1, 65536), kRowKernel);
    EXPECT_EQ(gemv_bench::last_gemv_row_loads(), kLoadsRegisters);
  }
  {
    const test::ScopedEnv env("CIDER_GEMV_ROW_LOADS", "dma");
    try {
      run(1, 256);
      ADD_FAILURE() << "CIDER_GEMV_ROW_LOADS=dma was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda.w8a8_gemv"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("CIDER_GEMV_ROW_LOADS"), std::string::npos) << e.what();
    }
  }
  const test::ScopedEnv env("CIDER_GEMV_KERNEL", "warp");
  try {
    run(1, 256);
    ADD_FAILURE() << "CIDER_GEMV_KERNEL=warp was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda.w8a8_gemv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CIDER_GEMV_KERNEL"), std::string::npos) << e.what();
  }
}

// $CIDER_GEMV_SPLIT: the whole-block split (16) still matches the reference; a value that is not a split is an error
// naming the op and the rule.
TEST(CudaGemv, SplitEnvironmentSwitch) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(511);
  {
    const test::ScopedEnv env("CIDER_GEMV_SPLIT", "16");
    run_case(Case{true, 1, 4129, 2112, 64, DType::kF32, DType::kF32, true}, rng);
    run_case(Case{false, 3, 4129, 2080, 0, DType::kF32, DType::kF32, true}, rng);
  }
  const test::ScopedEnv env("CIDER_GEMV_SPLIT", "3");
  DeviceBuffer x(size_t{1} << 16), w(size_t{1} << 20), s(size_t{1} << 16), out(size_t{1} << 16);
  // M = 2: the tile kernel (M = 1 runs the row kernel, which has no tile groups to split).
  const kernels::IntLinearArgs a{x.data(), DType::kF32, w.data(), s.as<float>(), nullptr, out.data(),
                                 DType::kF32, 2, 64, 256, 0};
  try {
    w8a8_gemv(a, Exec{});
    ADD_FAILURE() << "CIDER_GEMV_SPLIT=3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda.w8a8_gemv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CIDER_GEMV_SPLIT"), std::string::npos) << e.what();
  }
}

// The launcher's validation: each bad argument is a cider::Error naming the op.
TEST(CudaGemv, RejectsBadArguments) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer x(size_t{1} << 20), w(size_t{1} << 20), s(size_t{1} << 16), out(size_t{1} << 16);
  for (bool int4 : {false, true}) {
    const char* op = int4 ? "cuda.w4a8_gemv" : "cuda.w8a8_gemv";
    const kernels::IntLinearArgs good{x.data(), DType::kF32, w.data(), s.as<float>(), nullptr, out.data(),
                                      DType::kF32, 2, 64, 256, 0};
    auto launch = [&](const kernels::IntLinearArgs& a) { int4 ? w4a8_gemv(a, Exec{}) : w8a8_gemv(a, Exec{}); };
    EXPECT_NO_THROW(launch(good));
    device_synchronize("test_cuda_gemv");
    auto expect_error = [&](const std::function<void(kernels::IntLinearArgs&)>& edit, const char* what) {
      kernels::IntLinearArgs a = good;
      edit(a);
      try {
        launch(a);
        ADD_FAILURE() << op << ": no error for " << what;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << what << ": " << e.what();
      }
    };
    expect_error([](auto& a) { a.M = 0; }, "M = 0");
    expect_error([](auto& a) { a.M = 17; }, "M = 17");
    expect_error([](auto& a) { a.N = 0; }, "N = 0");
    expect_error([&](auto& a) { a.K = int4 ? 48 : 40; }, "K not a multiple of the 16-byte row piece");
    expect_error([](auto& a) { a.x_dtype = DType::kI8; }, "int8 x");
    expect_error([](auto& a) { a.out_dtype = DType::kI32; }, "int32 out");
    expect_error([&](auto& a) { a.group_size = int4 ? 96 : 32; }, "bad group size");
    expect_error([](auto& a) { a.K = 192, a.group_size = 128; }, "K not a multiple of the group size");
    expect_error([&](auto& a) { a.K = int4 ? 2113952 : 133152; }, "per-channel K beyond exact int32 sums");
    expect_error([](auto& a) { a.K = 131072, a.group_size = 128; }, "K beyond shared memory");
    expect_error([](auto& a) { a.w = nullptr; }, "null w");
    expect_error([](auto& a) { a.w_scales = nullptr; }, "null scales");
    expect_error([](auto& a) { a.x = static_cast<const uint8_t*>(a.x) + 4; }, "misaligned x");
  }
}

}  // namespace
}  // namespace cider::cuda
