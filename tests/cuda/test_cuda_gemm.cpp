// The prefill INT8 GEMMs (cuda::w8a8_gemm, cuda::w4a8_gemm) and per-token activation quantization
// (cuda::quantize_rows_int8) against the CPU reference (kernels::ref_kernels(), quant::quantize_int8_row).
//
// Tolerance of the GEMMs: the integer sums are exact on both sides, so the outputs differ only by float32 rounding
// in the epilogue. Both sides evaluate y = sx · Σ_g fl(sw_g · acc_g) (+ bias) with G products and G − 1 additions,
// one multiply and one bias add, so each is within (G + 3)·u·(sx·Σ_g |sw_g·acc_g| + |bias|) of the exact value
// (u = 2^-24); the bound below doubles that (two computations) and replaces |acc_g| by the Cauchy–Schwarz bound
// ‖xq_g‖·‖wq_g‖. A 16-bit output adds one unit in the last place of the result. The kernel follows the reference's
// order of operations, so in practice the difference is 0.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "kernels/kernel_table.h"
#include "quant/int4.h"
#include "quant/int8.h"
#include "support/scoped_env.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace gemm_bench {  // linear_gemm.cu: the GEMM kernel choice (0 auto, 1 mma.sync, 2 wgmma) and the last one used
void set_gemm_kernel(int choice);
int gemm_kernel_choice();
int last_gemm_kernel();
}  // namespace gemm_bench
namespace {

constexpr int kMmaSync = 1, kWgmma = 2;

// Forces one GEMM kernel for a scope (the default choice is restored after).
class ForceGemmKernel {
 public:
  explicit ForceGemmKernel(int choice) : saved_(gemm_bench::gemm_kernel_choice()) {
    gemm_bench::set_gemm_kernel(choice);
  }
  ~ForceGemmKernel() { gemm_bench::set_gemm_kernel(saved_); }
  ForceGemmKernel(const ForceGemmKernel&) = delete;
  ForceGemmKernel& operator=(const ForceGemmKernel&) = delete;

 private:
  int saved_;
};

// The kernel a forced launch must have used: wgmma exists only for sm_90 devices, and W4A8 takes it with K % 32 == 0
// and groups other than 32 (the shapes here keep the other conditions: K % 16 == 0, aligned buffers).
int expected_kernel(int forced, bool int4, int group_size, int64_t K) {
  if (forced == kMmaSync || device_info().cc_major != 9) return kMmaSync;
  if (int4 && (group_size == 32 || K % 32 != 0)) return kMmaSync;
  return forced;
}

constexpr size_t kGuard = 256;  // bytes poisoned on each side of an output (keeps the output 256-byte aligned)
constexpr uint8_t kPoison = 0xFF;

struct GemmCase {
  bool int4 = false;
  int64_t M = 1, N = 1, K = 32;
  int group_size = 0;
  DType x_dtype = DType::kBF16;
  DType out_dtype = DType::kF32;
  bool bias = true;
  int nan_row = -1;  // a row of x given a NaN (its outputs must be NaN), -1 = none
  int forced = 0;    // the GEMM kernel the test forced (kMmaSync / kWgmma), checked after the launch; 0 = any
};

std::string describe(const GemmCase& c) {
  return std::string(c.forced == kWgmma     ? "[wgmma] "
                     : c.forced == kMmaSync ? "[mma.sync] "
                                            : "") +
         std::string(c.int4 ? "w4a8" : "w8a8") + " M" + std::to_string(c.M) + " N" + std::to_string(c.N) + " K" +
         std::to_string(c.K) + " gs" + std::to_string(c.group_size) + " x " + dtype_name(c.x_dtype) + " out " +
         dtype_name(c.out_dtype) + (c.bias ? " bias" : "");
}

// Relative size of one unit in the last place of a value rounded to the output dtype (0 for float32).
double out_ulp_rel(DType t) {
  switch (t) {
    case DType::kBF16: return std::ldexp(1.0, -7);
    case DType::kF16: return std::ldexp(1.0, -10);
    default: return 0.0;
  }
}

void run_gemm_case(const GemmCase& c, uint64_t salt) {
  SCOPED_TRACE(describe(c));
  auto rng = test::make_rng(salt);
  const int64_t M = c.M, N = c.N, K = c.K;
  const int64_t span = c.group_size == 0 ? K : c.group_size, G = K / span;

  // Inputs: x ~ N(0, 1) with a few large values (so rows have distinct scales), int8 codes in [-127, 127] or
  // random packed nibbles, positive and negative weight scales.
  std::vector<float> xf = test::randn(rng, static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) xf[static_cast<size_t>(m * K + (m * 37) % K)] *= 8.0f;
  if (c.nan_row >= 0 && c.nan_row < M) xf[static_cast<size_t>(c.nan_row * K + K / 2)] = std::nanf("");
  const std::vector<uint8_t> xb = test::to_dtype_bytes(xf, c.x_dtype);
  const int64_t w_row_bytes = c.int4 ? K / 2 : K;
  std::vector<uint8_t> wb(static_cast<size_t>(N * w_row_bytes));
  {
    std::uniform_int_distribution<int> code(-127, 127), byte(0, 255);
    for (auto& b : wb) b = c.int4 ? static_cast<uint8_t>(byte(rng)) : static_cast<uint8_t>(static_cast<int8_t>(code(rng)));
  }
  std::vector<float> sw = test::uniform(rng, static_cast<size_t>(G * N), 0.001f, 0.02f);
  for (size_t i = 0; i < sw.size(); i += 7) sw[i] = -sw[i];
  std::vector<float> bias = c.bias ? test::randn(rng, static_cast<size_t>(N)) : std::vector<float>{};

  // Reference.
  const size_t osize = static_cast<size_t>(dtype_size(c.out_dtype));
  const size_t out_bytes = static_cast<size_t>(M * N) * osize;
  std::vector<uint8_t> ref_out(out_bytes);
  kernels::IntLinearArgs ra{};
  ra.x = xb.data();
  ra.x_dtype = c.x_dtype;
  ra.w = wb.data();
  ra.w_scales = sw.data();
  ra.bias = c.bias ? bias.data() : nullptr;
  ra.out = ref_out.data();
  ra.out_dtype = c.out_dtype;
  ra.M = M;
  ra.N = N;
  ra.K = K;
  ra.group_size = c.group_size;
  if (c.int4) kernels::ref_kernels().w4a8_gemm(ra);
  else kernels::ref_kernels().w8a8_gemm(ra);
  const std::vector<float> want = test::from_dtype_bytes(ref_out.data(), c.out_dtype, static_cast<size_t>(M * N));

  // Device.
  DeviceBuffer dx = to_device(xb.data(), xb.size());
  DeviceBuffer dw = to_device(wb.data(), wb.size());
  DeviceBuffer dsw = to_device(sw.data(), sw.size() * sizeof(float));
  DeviceBuffer dbias = c.bias ? to_device(bias.data(), bias.size() * sizeof(float)) : DeviceBuffer();
  DeviceBuffer dout(out_bytes + 2 * kGuard);
  dout.fill(kPoison);  // NaN for every float dtype
  DeviceBuffer ws(int_linear_workspace_bytes(M, K));
  Exec exec;
  exec.workspace = ws.data();
  exec.workspace_bytes = ws.bytes();
  kernels::IntLinearArgs da = ra;
  da.x = dx.data();
  da.w = dw.data();
  da.w_scales = dsw.as<float>();
  da.bias = c.bias ? dbias.as<float>() : nullptr;
  da.out = dout.as<uint8_t>() + kGuard;
  if (c.int4) w4a8_gemm(da, exec);
  else w8a8_gemm(da, exec);
  device_synchronize("test_cuda_gemm");
  if (c.forced != 0) {
    ASSERT_EQ(gemm_bench::last_gemm_kernel(), expected_kernel(c.forced, c.int4, c.group_size, c.K)) << "kernel used";
  }
  std::vector<uint8_t> got_bytes(dout.bytes());
  dout.download(got_bytes.data(), got_bytes.size());
  for (size_t i = 0; i < kGuard; ++i) {
    ASSERT_EQ(got_bytes[i], kPoison) << "write before the output at byte " << i;
    ASSERT_EQ(got_bytes[kGuard + out_bytes + i], kPoison) << "write after the output at byte " << i;
  }
  const std::vector<float> got =
      test::from_dtype_bytes(got_bytes.data() + kGuard, c.out_dtype, static_cast<size_t>(M * N));

  // Error bound per element from the host quantization (the same function the reference uses).
  std::vector<int8_t> xq(static_cast<size_t>(M * K));
  std::vector<float> sx(static_cast<size_t>(M));
  const size_t x_row_bytes = static_cast<size_t>(K) * static_cast<size_t>(dtype_size(c.x_dtype));
  for (int64_t m = 0; m < M; ++m)
    sx[static_cast<size_t>(m)] = quant::quantize_int8_row(xb.data() + static_cast<size_t>(m) * x_row_bytes,
                                                          c.x_dtype, K, xq.data() + m * K);
  std::vector<double> x_norm(static_cast<size_t>(M * G)), w_norm(static_cast<size_t>(N * G));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      double s = 0;
      for (int64_t k = g * span; k < (g + 1) * span; ++k) s += std::pow(static_cast<double>(xq[static_cast<size_t>(m * K + k)]), 2);
      x_norm[static_cast<size_t>(m * G + g)] = std::sqrt(s);
    }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      double s = 0;
      for (int64_t k = g * span; k < (g + 1) * span; ++k) {
        const double q = c.int4 ? quant::int4_code(wb.data() + n * w_row_bytes, k)
                                : static_cast<int8_t>(wb[static_cast<size_t>(n * K + k)]);
        s += q * q;
      }
      w_norm[static_cast<size_t>(n * G + g)] = std::sqrt(s);
    }
  const double u = std::ldexp(1.0, -24), rel = out_ulp_rel(c.out_dtype);
  const double sub = c.out_dtype == DType::kF16 ? std::ldexp(1.0, -24) : 0.0;  // f16 subnormal spacing
  int64_t bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const size_t i = static_cast<size_t>(m * N + n);
      if (std::isnan(want[i])) {
        if (!std::isnan(got[i]) && ++bad <= 5)
          ADD_FAILURE() << "[" << m << ", " << n << "] want NaN (row with NaN input), got " << got[i];
        continue;
      }
      double mag = 0;
      for (int64_t g = 0; g < G; ++g)
        mag += std::fabs(static_cast<double>(sw[static_cast<size_t>(c.group_size == 0 ? n : g * N + n)])) *
               x_norm[static_cast<size_t>(m * G + g)] * w_norm[static_cast<size_t>(n * G + g)];
      mag = std::fabs(static_cast<double>(sx[static_cast<size_t>(m)])) * mag +
            (c.bias ? std::fabs(static_cast<double>(bias[static_cast<size_t>(n)])) : 0.0);
      const double tol = 2.0 * static_cast<double>(G + 3) * u * mag + rel * std::fabs(static_cast<double>(want[i])) + sub;
      const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
      if ((std::isnan(got[i]) || !(err <= tol)) && ++bad <= 5)
        ADD_FAILURE() << "[" << m << ", " << n << "] got " << got[i] << ", want " << want[i] << " (error " << err
                      << ", tolerance " << tol << ")";
    }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

// ---- quantize_rows_int8: bit-identical to quant::quantize_int8_row -------------------------------------------------

TEST(CudaGemm, QuantizeRowsBitExact) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(11);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t M : {1, 7, 33})
      for (int64_t K : {1, 7, 33, 96, 2048, 4096, 4160, 8200}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " M" + std::to_string(M) + " K" + std::to_string(K));
        std::vector<float> xf = test::randn(rng, static_cast<size_t>(M * K));
        // Row 0: max 127 (so sx = 1) and values exactly halfway between codes (rint ties to even); then an
        // all-zero row, a row with inf, tiny values.
        for (int64_t k = 0; k < K; ++k) xf[static_cast<size_t>(k)] = static_cast<float>(k % 11) - 5.0f + 0.5f;
        xf[0] = 127.0f;
        if (M > 1) std::fill(xf.begin() + K, xf.begin() + 2 * K, 0.0f);
        if (M > 2) xf[static_cast<size_t>(2 * K + K / 3)] = INFINITY;
        if (M > 3)
          for (int64_t k = 0; k < K; ++k) xf[static_cast<size_t>(3 * K + k)] *= 1e-6f;
        // Row 4: max 3 (sx = fl(3/127), not a power of two) and values within a few ulps of (n + ½)·sx, so x / sx
        // lands next to a rounding boundary: the kernel's multiply-by-reciprocal shortcut must defer to the division.
        if (M > 4)
          for (int64_t k = 0; k < K; ++k) {
            float v = (static_cast<float>(k % 200) - 100.0f + 0.5f) * (3.0f / 127.0f);
            for (int64_t u = 0; u < k % 5; ++u) v = std::nextafter(v, (k % 2) != 0 ? INFINITY : -INFINITY);
            xf[static_cast<size_t>(4 * K + k)] = k == 0 ? 3.0f : v;
          }
        const std::vector<uint8_t> xb = test::to_dtype_bytes(xf, dt);
        const size_t row_bytes = static_cast<size_t>(K) * static_cast<size_t>(dtype_size(dt));
        std::vector<int8_t> want_q(static_cast<size_t>(M * K));
        std::vector<float> want_s(static_cast<size_t>(M));
        for (int64_t m = 0; m < M; ++m)
          want_s[static_cast<size_t>(m)] =
              quant::quantize_int8_row(xb.data() + static_cast<size_t>(m) * row_bytes, dt, K, want_q.data() + m * K);

        DeviceBuffer dx = to_device(xb.data(), xb.size());
        DeviceBuffer dq(static_cast<size_t>(M * K) + 2 * kGuard), ds(static_cast<size_t>(M) * 4 + 2 * kGuard);
        dq.fill(0x5A);
        ds.fill(0x5A);
        quantize_rows_int8(dx.data(), dt, M, K, dq.as<int8_t>() + kGuard,
                           reinterpret_cast<float*>(ds.as<uint8_t>() + kGuard), Exec{});
        device_synchronize("test_cuda_gemm");
        std::vector<uint8_t> q(dq.bytes()), s(ds.bytes());
        dq.download(q.data(), q.size());
        ds.download(s.data(), s.size());
        for (size_t i = 0; i < kGuard; ++i) {
          ASSERT_EQ(q[i], 0x5A);
          ASSERT_EQ(q[kGuard + static_cast<size_t>(M * K) + i], 0x5A);
          ASSERT_EQ(s[i], 0x5A);
          ASSERT_EQ(s[kGuard + static_cast<size_t>(M) * 4 + i], 0x5A);
        }
        ASSERT_EQ(0, std::memcmp(q.data() + kGuard, want_q.data(), want_q.size())) << "codes differ";
        for (int64_t m = 0; m < M; ++m) {
          float got_s;
          std::memcpy(&got_s, s.data() + kGuard + 4 * m, 4);
          const float ws = want_s[static_cast<size_t>(m)];
          if (std::isnan(ws)) EXPECT_TRUE(std::isnan(got_s)) << "row " << m;
          else EXPECT_EQ(f32_bits(got_s), f32_bits(ws)) << "row " << m << ": got " << got_s << ", want " << ws;
        }
      }
}

// ---- GEMMs ---------------------------------------------------------------------------------------------------------

// Every M × N × K of the sweep, per channel, bf16 in / f32 out: tails in all three dimensions.
void shape_sweep(bool int4, int forced) {
  const ForceGemmKernel force(forced);
  uint64_t salt = (int4 ? 2000 : 1000) + 500 * static_cast<uint64_t>(forced - 1);
  for (int64_t M : {1, 7, 33, 129, 300})
    for (int64_t N : {1, 7, 67, 129, 4097})
      for (int64_t K : {96, 4096, 4160}) {
        GemmCase c;
        c.forced = forced;
        c.int4 = int4;
        c.M = M;
        c.N = N;
        c.K = K;
        c.bias = (M + N) % 2 == 0;
        run_gemm_case(c, ++salt);
        if (::testing::Test::HasFailure()) return;
      }
}
TEST(CudaGemm, W8A8ShapeSweep) {  // the mma.sync fallback
  CIDER_REQUIRE_GPU();
  shape_sweep(false, kMmaSync);
}
TEST(CudaGemm, W4A8ShapeSweep) {
  CIDER_REQUIRE_GPU();
  shape_sweep(true, kMmaSync);
}
// The wgmma kernel: tails in M (1, 7, 33, 129, 300 against 128-row tiles), N (against 128/256-column tiles) and
// K (96 < one 128-k stage, 4160 = 32.5 stages; 4096 wraps the 4-6 stage ring many times).
TEST(CudaGemm, WgmmaShapeSweep) {
  CIDER_REQUIRE_GPU();
  shape_sweep(false, kWgmma);
}
// W4A8 on the wgmma kernel: the packed tile unpacked in shared memory by the producer warpgroup's warps 1-3.
TEST(CudaGemm, WgmmaW4ShapeSweep) {
  CIDER_REQUIRE_GPU();
  shape_sweep(true, kWgmma);
}

// Every scale mode × x dtype × out dtype on tiles with tails (129 crosses the 128-row/column tile; K not a whole
// number of 128-k pipeline stages where the group size allows it).
void mode_sweep(bool int4, int forced) {
  const ForceGemmKernel force(forced);
  uint64_t salt = (int4 ? 4000 : 3000) + 500 * static_cast<uint64_t>(forced - 1);
  const std::vector<int> groups = int4 ? std::vector<int>{0, 32, 64, 128, 256} : std::vector<int>{0, 64, 128, 256};
  for (int gs : groups)
    for (DType xd : {DType::kF32, DType::kF16, DType::kBF16})
      for (DType od : {DType::kF32, DType::kF16, DType::kBF16}) {
        GemmCase c;
        c.forced = forced;
        c.int4 = int4;
        c.M = 129;
        c.N = 131;
        c.K = gs == 0 ? 32 * 39 : gs <= 64 ? 64 * 19 : gs * 5;
        c.group_size = gs;
        c.x_dtype = xd;
        c.out_dtype = od;
        c.bias = od != DType::kF16;
        c.nan_row = 77;
        run_gemm_case(c, ++salt);
        if (::testing::Test::HasFailure()) return;
      }
  // Large N and deep K per group mode.
  for (int gs : groups) {
    GemmCase c;
    c.forced = forced;
    c.int4 = int4;
    c.M = 129;
    c.N = 4097;
    c.K = gs == 0 || gs == 64 ? 4160 : 4096;
    c.group_size = gs;
    run_gemm_case(c, ++salt);
    if (::testing::Test::HasFailure()) return;
  }
}
TEST(CudaGemm, W8A8ScaleModesAndDtypes) {  // the mma.sync fallback
  CIDER_REQUIRE_GPU();
  mode_sweep(false, kMmaSync);
}
TEST(CudaGemm, W4A8ScaleModesAndDtypes) {
  CIDER_REQUIRE_GPU();
  mode_sweep(true, kMmaSync);
}
// The wgmma kernel in every scale mode (per channel; groups 64, 128, 256 with K not a whole number of 128-k
// stages where the group allows), x and out dtype, NaN rows, bias.
TEST(CudaGemm, WgmmaScaleModesAndDtypes) {
  CIDER_REQUIRE_GPU();
  mode_sweep(false, kWgmma);
}
// W4A8 likewise (groups of 32 fall back to mma.sync, which the kernel check after each launch confirms).
TEST(CudaGemm, WgmmaW4ScaleModesAndDtypes) {
  CIDER_REQUIRE_GPU();
  mode_sweep(true, kWgmma);
}

// A grid of exactly 3·SMs 128×256 tiles (6·SMs 128×128 ones): the launcher then takes the wide per-channel
// configuration, which the shapes above (small grids) do not reach.
TEST(CudaGemm, WideTileConfiguration) {
  CIDER_REQUIRE_GPU();
  const int64_t sms = device_info().sm_count;
  uint64_t salt = 5000;
  for (bool int4 : {false, true})
    for (DType od : {DType::kF32, DType::kBF16}) {
      const ForceGemmKernel force(kMmaSync);
      GemmCase c;
      c.forced = kMmaSync;
      c.int4 = int4;
      c.M = 300;
      c.N = sms * 256 - 5;
      c.K = 96;
      c.out_dtype = od;
      c.nan_row = 290;
      run_gemm_case(c, ++salt);
      if (HasFailure()) return;
    }
}

// The wgmma kernel's 128×256 configuration (grids of whole waves of wide tiles), shallow and deep in K (1088 =
// 8.5 stages wraps its 4-stage ring twice), with M and N tails.
void wide_sweep(int forced) {
  const int64_t sms = device_info().sm_count;
  uint64_t salt = 5500 + 100 * static_cast<uint64_t>(forced - kWgmma);
  const ForceGemmKernel force(forced);
  for (DType od : {DType::kF32, DType::kBF16, DType::kF16}) {
    GemmCase c;
    c.forced = forced;
    c.M = 300;
    c.N = sms * 256 - 5;
    c.K = 96;
    c.out_dtype = od;
    c.nan_row = 290;
    run_gemm_case(c, ++salt);
    if (::testing::Test::HasFailure()) return;
  }
  GemmCase deep;
  deep.forced = forced;
  deep.M = 33;
  deep.N = sms * 256 - 3;
  deep.K = 1088;
  deep.out_dtype = DType::kBF16;
  deep.nan_row = 31;
  run_gemm_case(deep, ++salt);
}
TEST(CudaGemm, WgmmaWideTileConfiguration) {
  CIDER_REQUIRE_GPU();
  wide_sweep(kWgmma);
}

// Interior tiles: the wgmma epilogue has a branch-free path for tiles wholly inside M and N when N is even (paired
// stores), which the sweeps above (odd N) never take. M 256 / 300 (a full 128-row tile, then a tail), N even in 128-
// and 256-column tiles (N = 132·256 takes the wide tile), every scale mode × out dtype, bias on and off.
void interior_sweep(int forced, bool int4) {
  const ForceGemmKernel force(forced);
  const int64_t sms = device_info().sm_count;
  uint64_t salt = (int4 ? 7300 : 7000) + 100 * static_cast<uint64_t>(forced - kWgmma);
  for (int gs : {0, 64, 128, 256})
    for (DType od : {DType::kF32, DType::kF16, DType::kBF16})
      for (bool bias : {false, true}) {
        GemmCase c;
        c.forced = forced;
        c.int4 = int4;
        c.M = bias ? 300 : 256;
        c.N = gs == 0 && od == DType::kBF16 ? sms * 256 : 1024;
        c.K = gs == 0 ? 192 : 2 * gs;
        c.group_size = gs;
        c.out_dtype = od;
        c.bias = bias;
        c.nan_row = 200;
        run_gemm_case(c, ++salt);
        if (::testing::Test::HasFailure()) return;
      }
}
TEST(CudaGemm, WgmmaInteriorTiles) {
  CIDER_REQUIRE_GPU();
  interior_sweep(kWgmma, false);
  if (!HasFailure()) interior_sweep(kWgmma, true);
}

// Grouped scales with several tiles per CTA (the persistent grid: 3 row tiles × 2·SMs + 1 column tiles of 128): the
// ring, the consumer warpgroups' turn-taking and W4A8's unpacking warps run on across tiles. K = 3 groups (with
// groups of 64 the last k-tile's second half lies past K), W8A8 and W4A8, interior tiles (N even) and a tail.
TEST(CudaGemm, WgmmaGroupsManyTilesPerCta) {
  CIDER_REQUIRE_GPU();
  const ForceGemmKernel force(kWgmma);
  const int64_t sms = device_info().sm_count;
  uint64_t salt = 7600;
  for (bool int4 : {false, true})
    for (int gs : {0, 64, 128, 256}) {
      GemmCase c;
      c.forced = kWgmma;
      c.int4 = int4;
      c.M = 300;
      c.N = sms * 256 + (gs == 128 ? 6 : 5);
      c.K = gs == 0 ? 352 : 3 * gs;
      c.group_size = gs;
      c.out_dtype = DType::kBF16;
      c.nan_row = 257;
      run_gemm_case(c, ++salt);
      if (HasFailure()) return;
    }
}

// ---- errors ---------------------------------------------------------------------------------------------------------

template <typename F>
void expect_error(F&& f, ErrorCode code, const char* op, const char* what) {
  try {
    f();
    ADD_FAILURE() << what << ": no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << what << ": " << e.what();
  }
}

TEST(CudaGemm, RejectsBadArguments) {
  CIDER_REQUIRE_GPU();
  const int64_t M = 4, N = 8, K = 256;
  DeviceBuffer x(static_cast<size_t>(M * K) * 4), w(static_cast<size_t>(N * K)), sw(static_cast<size_t>(N * K) * 4),
      out(static_cast<size_t>(M * N) * 4), ws(int_linear_workspace_bytes(M, K));
  kernels::IntLinearArgs good{};
  good.x = x.data();
  good.x_dtype = DType::kF32;
  good.w = w.data();
  good.w_scales = sw.as<float>();
  good.bias = nullptr;
  good.out = out.data();
  good.out_dtype = DType::kF32;
  good.M = M;
  good.N = N;
  good.K = K;
  good.group_size = 0;
  Exec exec;
  exec.workspace = ws.data();
  exec.workspace_bytes = ws.bytes();

  for (bool int4 : {false, true}) {
    const char* op = int4 ? "cuda.w4a8_gemm" : "cuda.w8a8_gemm";
    auto launch = [&](kernels::IntLinearArgs a, Exec e) {
      if (int4) w4a8_gemm(a, e);
      else w8a8_gemm(a, e);
    };
    // The good arguments run (and so every rejection below is due to the one change).
    launch(good, exec);
    device_synchronize("test");
    auto bad = [&](auto change, ErrorCode code, const char* what) {
      kernels::IntLinearArgs a = good;
      Exec e = exec;
      change(a, e);
      expect_error([&] { launch(a, e); }, code, op, what);
    };
    using A = kernels::IntLinearArgs;
    bad([](A& a, Exec&) { a.x_dtype = DType::kI8; }, ErrorCode::kInvalidArgument, "x_dtype int8");
    bad([](A& a, Exec&) { a.out_dtype = DType::kI32; }, ErrorCode::kInvalidArgument, "out_dtype int32");
    bad([](A& a, Exec&) { a.K = 48; }, ErrorCode::kShapeMismatch, "K not a multiple of 32");
    bad([](A& a, Exec&) { a.K = 0; }, ErrorCode::kShapeMismatch, "K = 0");
    bad([](A& a, Exec&) { a.M = 0; }, ErrorCode::kShapeMismatch, "M = 0");
    bad([](A& a, Exec&) { a.N = 0; }, ErrorCode::kShapeMismatch, "N = 0");
    bad([](A& a, Exec&) { a.group_size = 48; }, ErrorCode::kInvalidArgument, "group_size 48");
    bad([](A& a, Exec&) { a.group_size = 128; a.K = 192; }, ErrorCode::kShapeMismatch, "K not a multiple of gs");
    if (!int4) bad([](A& a, Exec&) { a.group_size = 32; }, ErrorCode::kInvalidArgument, "int8 group_size 32");
    const int64_t k_limit = int4 ? quant::kInt4MaxAccumK : quant::kInt8MaxAccumK;
    bad([&](A& a, Exec&) { a.K = 32 * ((k_limit + 64) / 32); a.M = 1; a.N = 1; }, ErrorCode::kOutOfRange,
        "per-channel K past the int32 limit");
    bad([](A& a, Exec&) { a.w = nullptr; }, ErrorCode::kInvalidArgument, "null w");
    bad([](A& a, Exec&) { a.x = nullptr; }, ErrorCode::kInvalidArgument, "null x");
    bad([](A& a, Exec&) { a.w_scales = nullptr; }, ErrorCode::kInvalidArgument, "null w_scales");
    bad([](A& a, Exec&) { a.out = nullptr; }, ErrorCode::kInvalidArgument, "null out");
    bad([](A& a, Exec&) { a.w = static_cast<const uint8_t*>(a.w) + 8; }, ErrorCode::kInvalidArgument,
        "misaligned w");
    bad([](A&, Exec& e) { e.workspace_bytes -= 1; }, ErrorCode::kInvalidArgument, "workspace too small");
    bad([](A&, Exec& e) { e.workspace = nullptr; }, ErrorCode::kInvalidArgument, "no workspace");
  }
  expect_error([&] { quantize_rows_int8(x.data(), DType::kI32, M, K, ws.as<int8_t>(), sw.as<float>(), Exec{}); },
               ErrorCode::kInvalidArgument, "cuda.quantize_rows_int8", "quantize x_dtype int32");
  expect_error([&] { quantize_rows_int8(x.data(), DType::kF32, 0, K, ws.as<int8_t>(), sw.as<float>(), Exec{}); },
               ErrorCode::kShapeMismatch, "cuda.quantize_rows_int8", "quantize M = 0");
  expect_error([&] { quantize_rows_int8(nullptr, DType::kF32, M, K, ws.as<int8_t>(), sw.as<float>(), Exec{}); },
               ErrorCode::kInvalidArgument, "cuda.quantize_rows_int8", "quantize null x");
}

TEST(CudaGemm, WorkspaceSize) {
  CIDER_REQUIRE_GPU();
  // xq [M, K] then sx [M], each rounded up to 256 bytes.
  EXPECT_EQ(int_linear_workspace_bytes(1, 32), 256u + 256u);
  EXPECT_EQ(int_linear_workspace_bytes(2048, 4096), 2048u * 4096u + 8192u);
  EXPECT_EQ(int_linear_workspace_bytes(300, 4160), ((300u * 4160u + 255u) / 256u) * 256u + 1280u);
}

}  // namespace
}  // namespace cider::cuda
