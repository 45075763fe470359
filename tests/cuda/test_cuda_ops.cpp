// The ops of kernels/cuda/cuda_ops.h against plain loops written here (embedding, soft-cap) and dense_bf16 against
// a float64 product of the same bf16-rounded inputs. Every output element is compared with a bound derived from the
// arithmetic (NaN never passes); outputs are poisoned (0xFF bytes = NaN) before each launch and guard regions on both
// sides of every output are checked after it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/model.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2⁻²⁴: float32 unit roundoff

// A device array of n elements of T with kGuard elements of 0xFF bytes on both sides (256 bytes each for float, so
// data() keeps the allocation's 256-byte alignment); `shift` elements more in front misalign data() on purpose.
template <typename T>
class Guarded {
 public:
  static constexpr size_t kGuard = 256 / sizeof(T);
  explicit Guarded(size_t n, size_t shift = 0) : n_(n), front_(kGuard + shift), buf_((front_ + n + kGuard) * sizeof(T)) {
    buf_.fill(0xFF);
  }
  T* data() const { return buf_.as<T>() + front_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& v) {
    ASSERT_EQ(v.size(), n_);
    buf_.upload(v.data(), n_ * sizeof(T), front_ * sizeof(T));
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    buf_.download(v.data(), n_ * sizeof(T), front_ * sizeof(T));
    return v;
  }
  void poison() { buf_.fill(0xFF); }
  // True when every byte outside [data, data + n) is still 0xFF.
  ::testing::AssertionResult guards_intact() const {
    std::vector<uint8_t> all(buf_.bytes());
    buf_.download(all.data(), all.size());
    const size_t lo = front_ * sizeof(T), hi = (front_ + n_) * sizeof(T);
    for (size_t i = 0; i < all.size(); ++i)
      if ((i < lo || i >= hi) && all[i] != 0xFF)
        return ::testing::AssertionFailure() << "guard byte " << (i < lo ? "before" : "after") << " the output at "
                                             << (i < lo ? static_cast<long long>(i) - static_cast<long long>(lo)
                                                        : static_cast<long long>(i - hi))
                                             << " was written";
    return ::testing::AssertionSuccess();
  }

 private:
  size_t n_, front_;
  DeviceBuffer buf_;
};

// |got[i] − want[i]| ≤ tol[i] for every i; NaN in got fails (unless want is NaN too and nan_ok).
::testing::AssertionResult within(const std::vector<float>& got, const std::vector<double>& want,
                                  const std::vector<double>& tol) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (std::isnan(got[i]) || !(err <= tol[i]))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i]
                                           << " (error " << err << " > tolerance " << tol[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

// Expects fn() to throw cider::Error whose message names op.
template <typename Fn>
void expect_error(Fn&& fn, const char* op) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected one from " << op;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
  }
}

struct StreamExec {
  Stream stream;
  Exec exec{stream.handle(), nullptr, 0};
};

// ---- embedding ---------------------------------------------------------------------------------------------------

TEST(CudaOps, EmbedRowsMatchesCpuEveryDtypeAndBadIdsGiveNaN) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(101);
  StreamExec se;
  const int64_t vocab = 37;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t hidden : {1, 7, 64, 129, 4097})
      for (int64_t n : {1, 7, 33}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " hidden " + std::to_string(hidden) + " n " + std::to_string(n));
        const std::vector<uint8_t> table = test::to_dtype_bytes(test::randn(rng, static_cast<size_t>(vocab * hidden)), dt);
        DeviceBuffer d_table = to_device(table.data(), table.size());
        std::vector<int32_t> tokens(static_cast<size_t>(n));
        std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
        for (auto& t : tokens) t = pick(rng);
        if (n > 1) tokens[1] = -1;                                 // out of range below
        if (n > 2) tokens[static_cast<size_t>(n - 1)] = static_cast<int32_t>(vocab);  // and above
        DeviceBuffer d_tokens = to_device(tokens.data(), tokens.size() * sizeof(int32_t));
        Guarded<float> out(static_cast<size_t>(n * hidden));
        const float scale = 7.5f;  // not a power of two: the product really rounds
        embed_rows(d_table.data(), dt, vocab, hidden, d_tokens.as<int32_t>(), n, scale, out.data(), se.exec);
        se.stream.synchronize();
        const std::vector<float> got = out.download();
        EXPECT_TRUE(out.guards_intact());
        for (int64_t r = 0; r < n; ++r) {
          const int32_t t = tokens[static_cast<size_t>(r)];
          for (int64_t i = 0; i < hidden; ++i) {
            const float g = got[static_cast<size_t>(r * hidden + i)];
            if (t < 0 || t >= vocab) {
              ASSERT_TRUE(std::isnan(g)) << "row " << r << " (bad token " << t << ") element " << i << " is " << g;
            } else {
              const float want = load_float(table.data(), dt, t * hidden + i) * scale;  // the CPU engine's arithmetic
              ASSERT_EQ(f32_bits(g), f32_bits(want)) << "row " << r << " element " << i << ": " << g << " vs " << want;
            }
          }
        }
      }
}

// ---- soft-cap ----------------------------------------------------------------------------------------------------

TEST(CudaOps, SoftcapMatchesFloat64) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(106);
  StreamExec se;
  for (float cap : {30.0f, 50.0f})
    for (int64_t count : {1, 7, 33, 129, 4097, 262147})
      for (size_t shift : {size_t{0}, size_t{1}}) {
        SCOPED_TRACE("cap " + std::to_string(cap) + " count " + std::to_string(count));
        const auto n = static_cast<size_t>(count);
        const std::vector<float> x = test::randn(rng, n, 40.0f);
        Guarded<float> d_x(n, shift);
        d_x.upload(x);
        softcap(d_x.data(), count, cap, se.exec);
        se.stream.synchronize();
        const std::vector<float> got = d_x.download();
        EXPECT_TRUE(d_x.guards_intact());
        // x/cap rounds (u relative; tanh' ≤ 1 turns it into ≤ u·|x/cap| absolute), tanhf ≤ 2 ulp, ·cap rounds:
        // ≤ 8u·(|want| + |x|) with room.
        std::vector<double> want(n), tol(n);
        for (size_t i = 0; i < n; ++i) {
          want[i] = static_cast<double>(cap) * std::tanh(static_cast<double>(x[i]) / static_cast<double>(cap));
          tol[i] = 8.0 * kU * (std::abs(want[i]) + std::abs(static_cast<double>(x[i]))) + 1e-37;
        }
        ASSERT_TRUE(within(got, want, tol));
      }
}

// ---- bad arguments -----------------------------------------------------------------------------------------------

TEST(CudaOps, BadArgumentsAreErrorsNamingTheOp) {
  CIDER_REQUIRE_GPU();
  StreamExec se;
  DeviceBuffer buf(1 << 20);
  auto* f = buf.as<float>();
  auto* i32 = buf.as<int32_t>();
  const Exec& e = se.exec;
  expect_error([&] { embed_rows(f, DType::kI8, 4, 4, i32, 1, 1.0f, f, e); }, "cuda.embed_rows");
  expect_error([&] { embed_rows(f, DType::kF32, 0, 4, i32, 1, 1.0f, f, e); }, "cuda.embed_rows");
  expect_error([&] { embed_rows(f, DType::kF32, 4, 0, i32, 1, 1.0f, f, e); }, "cuda.embed_rows");
  expect_error([&] { embed_rows(f, DType::kF32, 4, 4, i32, -1, 1.0f, f, e); }, "cuda.embed_rows");
  expect_error([&] { embed_rows(nullptr, DType::kF32, 4, 4, i32, 1, 1.0f, f, e); }, "cuda.embed_rows");
  expect_error([&] { softcap(f, 4, 0.0f, e); }, "cuda.softcap");
  expect_error([&] { softcap(f, 4, -30.0f, e); }, "cuda.softcap");
  expect_error([&] { softcap(f, 4, std::numeric_limits<float>::quiet_NaN(), e); }, "cuda.softcap");
  expect_error([&] { softcap(f, -1, 30.0f, e); }, "cuda.softcap");
  se.stream.synchronize();
}

// ---- dense bf16 (cuBLASLt) ---------------------------------------------------------------------------------------

struct DenseCase {
  int64_t M, N, K;
};

// One dense_bf16 call on fresh inputs, checked against the float64 product of the bf16-rounded inputs.
// bias_mode: 0 none, 1 aligned (epilogue), 2 misaligned (the separate bias kernel); out_shift/x_shift misalign those.
void check_dense(StreamExec& se, const DenseCase& c, int bias_mode, size_t out_shift, size_t x_shift,
                 std::mt19937_64& rng) {
  SCOPED_TRACE("M " + std::to_string(c.M) + " N " + std::to_string(c.N) + " K " + std::to_string(c.K) + " bias " +
               std::to_string(bias_mode) + " out_shift " + std::to_string(out_shift) + " x_shift " +
               std::to_string(x_shift));
  const auto M = static_cast<size_t>(c.M), N = static_cast<size_t>(c.N), K = static_cast<size_t>(c.K);
  const std::vector<float> x = test::randn(rng, M * K);
  const std::vector<float> wf = test::randn(rng, N * K, 0.05f);
  const std::vector<float> bias = test::randn(rng, N);
  std::vector<uint16_t> w(N * K);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  Guarded<float> d_x(M * K, x_shift), d_bias(N, bias_mode == 2 ? 1 : 0), d_out(M * N, out_shift);
  Guarded<uint16_t> d_w(N * K);
  d_x.upload(x);
  d_w.upload(w);
  d_bias.upload(bias);
  DeviceBuffer ws(dense_bf16_workspace_bytes(c.M, c.K));
  Exec exec{se.stream.handle(), ws.data(), ws.bytes()};
  dense_bf16(d_x.data(), d_w.data(), bias_mode ? d_bias.data() : nullptr, d_out.data(), c.M, c.N, c.K, exec);
  se.stream.synchronize();
  const std::vector<float> got = d_out.download();
  EXPECT_TRUE(d_out.guards_intact());
  EXPECT_TRUE(d_x.guards_intact());
  // Inputs are rounded to bf16 exactly as the GPU does (f32_to_bf16), so the only error is float32 accumulation:
  // ≤ K·u·Σ|x||w| for any summation order with round-to-nearest; tensor cores may truncate inside their adds, so
  // allow 2u per add, plus the final rounding and the bias addition.
  std::vector<double> want(M * N), tol(M * N);
  std::vector<double> xb(K);
  for (size_t m = 0; m < M; ++m) {
    for (size_t k = 0; k < K; ++k) xb[k] = bf16_to_f32(f32_to_bf16(x[m * K + k]));
    for (size_t n = 0; n < N; ++n) {
      double s = 0.0, s_abs = 0.0;
      const uint16_t* wr = w.data() + n * K;
      for (size_t k = 0; k < K; ++k) {
        const double p = xb[k] * static_cast<double>(bf16_to_f32(wr[k]));
        s += p;
        s_abs += std::abs(p);
      }
      const double b = bias_mode ? static_cast<double>(bias[n]) : 0.0;
      want[m * N + n] = s + b;
      tol[m * N + n] = (2.0 * static_cast<double>(K + 2) * s_abs + 2.0 * std::abs(s + b) + std::abs(b)) * kU + 1e-30;
    }
  }
  ASSERT_TRUE(within(got, want, tol));
}

TEST(CudaOps, DenseBf16MatchesFloat64ProductOfRoundedInputs) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(108);
  StreamExec se;
  const std::vector<DenseCase> cases = {{1, 1, 1},     {1, 7, 33},     {7, 129, 67},     {33, 67, 129},
                                        {1, 4097, 64}, {2, 1024, 4096}, {67, 1000, 4097}, {129, 257, 1}};
  for (const DenseCase& c : cases)
    for (int bias_mode : {0, 1, 2}) check_dense(se, c, bias_mode, 0, 0, rng);
  // Misaligned output / input (other cuBLASLt alignment classes, scalar bf16 conversion).
  check_dense(se, {7, 129, 67}, 1, 1, 1, rng);
  check_dense(se, {3, 64, 256}, 0, 1, 0, rng);
  check_dense(se, {5, 64, 256}, 2, 0, 1, rng);
}

TEST(CudaOps, DenseBf16InCudaGraphAfterPrepareAndRefusesUnpreparedCapture) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(109);
  StreamExec se;
  auto stream = static_cast<cudaStream_t>(se.stream.handle());
  // Shapes no other test uses, so that nothing is cached yet. Thread-local capture mode, as bench_graph uses.
  const int64_t M = 3, N = 331, K = 259;
  dense_bf16_prepare(M, N, K);
  const std::vector<float> x = test::randn(rng, static_cast<size_t>(M * K));
  std::vector<uint16_t> w(static_cast<size_t>(N * K));
  const std::vector<float> wf = test::randn(rng, w.size(), 0.05f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  const std::vector<float> bias = test::randn(rng, static_cast<size_t>(N));
  DeviceBuffer d_x = to_device(x.data(), x.size() * 4), d_w = to_device(w.data(), w.size() * 2),
               d_bias = to_device(bias.data(), bias.size() * 4);
  Guarded<float> d_out(static_cast<size_t>(M * N));
  DeviceBuffer ws(dense_bf16_workspace_bytes(M, K));
  const Exec exec{se.stream.handle(), ws.data(), ws.bytes()};

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  dense_bf16(d_x.as<float>(), d_w.data(), d_bias.as<float>(), d_out.data(), M, N, K, exec);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t instance = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&instance, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep) {
    d_out.poison();
    ASSERT_EQ(cudaGraphLaunch(instance, stream), cudaSuccess);
    se.stream.synchronize();
    const std::vector<float> got = d_out.download();
    EXPECT_TRUE(d_out.guards_intact());
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = bias[static_cast<size_t>(n)], s_abs = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = static_cast<double>(bf16_to_f32(f32_to_bf16(x[static_cast<size_t>(m * K + k)]))) *
                           static_cast<double>(bf16_to_f32(w[static_cast<size_t>(n * K + k)]));
          s += p;
          s_abs += std::abs(p);
        }
        const float g = got[static_cast<size_t>(m * N + n)];
        ASSERT_FALSE(std::isnan(g)) << m << ", " << n;
        ASSERT_LE(std::abs(static_cast<double>(g) - s),
                  (2.0 * static_cast<double>(K + 2) * s_abs + 3.0 * std::abs(s) + 10.0) * kU)
            << m << ", " << n;
      }
  }
  cudaGraphExecDestroy(instance);
  cudaGraphDestroy(graph);

  // A shape never prepared nor run: refused inside a capture, with nothing enqueued (the capture stays valid).
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  expect_error([&] { dense_bf16(d_x.as<float>(), d_w.data(), nullptr, d_out.data(), M, N - 2, K, exec); },
               "cuda.dense_bf16");
  cudaGraph_t empty = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &empty), cudaSuccess);
  if (empty) cudaGraphDestroy(empty);
}

TEST(CudaOps, DenseBf16BadArgumentsAreErrors) {
  CIDER_REQUIRE_GPU();
  StreamExec se;
  DeviceBuffer buf(1 << 20);
  auto* f = buf.as<float>();
  DeviceBuffer ws(dense_bf16_workspace_bytes(4, 64));
  const Exec ok{se.stream.handle(), ws.data(), ws.bytes()};
  const Exec small{se.stream.handle(), ws.data(), ws.bytes() - 1};
  const Exec none{se.stream.handle(), nullptr, 0};
  const Exec odd{se.stream.handle(), static_cast<char*>(ws.data()) + 16, ws.bytes() - 16};
  expect_error([&] { dense_bf16(f, f, nullptr, f, -1, 8, 64, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, f, nullptr, f, 4, 0, 64, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, f, nullptr, f, 4, 8, 0, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(nullptr, f, nullptr, f, 4, 8, 64, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, nullptr, nullptr, f, 4, 8, 64, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, f, nullptr, nullptr, 4, 8, 64, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, f, nullptr, f, 4, 8, 64, small); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, f, nullptr, f, 4, 8, 64, none); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, f, nullptr, f, 4, 8, 64, odd); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16(f, reinterpret_cast<const char*>(f) + 1, nullptr, f, 4, 8, 64, ok); },
               "cuda.dense_bf16");
  expect_error([&] { dense_bf16_prepare(4, 0, 64); }, "cuda.dense_bf16");
  EXPECT_NO_THROW(dense_bf16(f, f, nullptr, f, 0, 8, 64, none));  // M = 0: nothing to do
  se.stream.synchronize();
}

// ---- dense bf16 with float32-faithful activations (dense_bf16_split) ---------------------------------------------

// One dense_bf16_split call on fresh, unrounded float32 inputs, against the float64 product of x itself (not of its
// bf16 rounding) with the bf16 weights. x = hi + lo + r with |r| ≤ 2⁻¹⁶·|x| (lo is the bf16 rounding of x − hi), so
// the representation costs at most 2⁻¹⁶·Σ|x·w|; the GEMM's float32 sums of hi·w and lo·w at most 2·(K + 2)·u each
// (as check_dense allows tensor cores), the halves' and the bias's additions an ulp each. piece_rows > 0 sizes the
// workspace for pieces of that many rows (the launcher then loops over them).
void check_dense_split(StreamExec& se, const DenseCase& c, bool with_bias, int64_t piece_rows, std::mt19937_64& rng) {
  SCOPED_TRACE("M " + std::to_string(c.M) + " N " + std::to_string(c.N) + " K " + std::to_string(c.K) + " bias " +
               std::to_string(with_bias) + " piece rows " + std::to_string(piece_rows));
  const auto M = static_cast<size_t>(c.M), N = static_cast<size_t>(c.N), K = static_cast<size_t>(c.K);
  std::vector<float> x = test::randn(rng, M * K);
  for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e-3f;  // small and large values in one row
  const std::vector<float> wf = test::randn(rng, N * K, 0.05f);
  const std::vector<float> bias = test::randn(rng, N);
  std::vector<uint16_t> w(N * K);
  for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  Guarded<float> d_x(M * K), d_bias(N), d_out(M * N);
  Guarded<uint16_t> d_w(N * K);
  d_x.upload(x);
  d_w.upload(w);
  d_bias.upload(bias);
  DeviceBuffer ws(dense_bf16_split_workspace_bytes(piece_rows > 0 ? piece_rows : c.M, c.N, c.K));
  Exec exec{se.stream.handle(), ws.data(), ws.bytes()};
  dense_bf16_split(d_x.data(), d_w.data(), with_bias ? d_bias.data() : nullptr, d_out.data(), c.M, c.N, c.K, exec);
  se.stream.synchronize();
  const std::vector<float> got = d_out.download();
  EXPECT_TRUE(d_out.guards_intact());
  EXPECT_TRUE(d_x.guards_intact());
  std::vector<double> want(M * N), tol(M * N);
  for (size_t m = 0; m < M; ++m)
    for (size_t n = 0; n < N; ++n) {
      double s = 0.0, s_abs = 0.0;
      for (size_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(x[m * K + k]) * static_cast<double>(bf16_to_f32(w[n * K + k]));
        s += p;
        s_abs += std::abs(p);
      }
      const double b = with_bias ? static_cast<double>(bias[n]) : 0.0;
      want[m * N + n] = s + b;
      tol[m * N + n] = (std::ldexp(1.0, -16) + 2.0 * static_cast<double>(2 * K + 5) * kU) * s_abs +
                       3.0 * std::abs(s + b) * kU + std::abs(b) * kU + 1e-30;
    }
  ASSERT_TRUE(within(got, want, tol));
}

TEST(CudaOps, DenseBf16SplitMatchesFloat64ProductOfUnroundedInputs) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(110);
  StreamExec se;
  const std::vector<DenseCase> cases = {{1, 1, 1}, {1, 64, 64}, {7, 129, 67}, {300, 256, 128}, {33, 1000, 2048},
                                        {2, 4097, 64}};
  for (const DenseCase& c : cases)
    for (bool with_bias : {false, true}) check_dense_split(se, c, with_bias, 0, rng);
  // Workspaces for pieces of 1 and 3 rows: the rows run in several GEMMs (the last one shorter).
  check_dense_split(se, {7, 129, 67}, true, 3, rng);
  check_dense_split(se, {5, 64, 256}, false, 1, rng);
  check_dense_split(se, {300, 256, 128}, true, 64, rng);
}

TEST(CudaOps, DenseBf16SplitBadArgumentsAreErrors) {
  CIDER_REQUIRE_GPU();
  StreamExec se;
  DeviceBuffer buf(1 << 20);
  auto* f = buf.as<float>();
  DeviceBuffer ws(dense_bf16_split_workspace_bytes(4, 8, 64));
  const size_t one_row = dense_bf16_split_workspace_bytes(1, 8, 64);
  const Exec ok{se.stream.handle(), ws.data(), ws.bytes()};
  const Exec row{se.stream.handle(), ws.data(), one_row};
  const Exec small{se.stream.handle(), ws.data(), one_row - 1};  // less than one row's worth
  const Exec odd{se.stream.handle(), static_cast<char*>(ws.data()) + 16, ws.bytes() - 16};
  expect_error([&] { dense_bf16_split(f, f, nullptr, f, -1, 8, 64, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16_split(f, f, nullptr, f, 4, 0, 64, ok); }, "cuda.dense_bf16");
  expect_error([&] { dense_bf16_split(nullptr, f, nullptr, f, 4, 8, 64, ok); }, "cuda.dense_bf16_split");
  expect_error([&] { dense_bf16_split(f, f, nullptr, f, 4, 8, 64, small); }, "cuda.dense_bf16_split");
  expect_error([&] { dense_bf16_split(f, f, nullptr, f, 4, 8, 64, odd); }, "cuda.dense_bf16_split");
  EXPECT_NO_THROW(dense_bf16_split(f, f, nullptr, f, 4, 8, 64, ok));
  EXPECT_NO_THROW(dense_bf16_split(f, f, nullptr, f, 4, 8, 64, row));  // 4 rows in pieces of one
  EXPECT_NO_THROW(dense_bf16_split(f, f, nullptr, f, 0, 8, 64, small));  // M = 0: nothing to do
  se.stream.synchronize();
}


// ---- top-k of the logits (topk.cu) -------------------------------------------------------------------------------

// topk_logits's outputs (or the CPU's).
struct TopkOut {
  std::vector<int32_t> ids;
  std::vector<float> vals;
  std::vector<float> excluded_vals;
  int32_t status = -1;
};

// The CPU reference: status = the first NaN / +inf index; the excluded tokens' raw logits; the other tokens with a
// finite logit ordered by (value descending, id ascending) — float comparisons only, so −0 ties with +0 — the first k
// of them, then id −1 / value −inf.
TopkOut topk_reference(const std::vector<float>& logits, const std::vector<int32_t>& excluded, int64_t k) {
  TopkOut r;
  const size_t vocab = logits.size();
  for (size_t i = 0; i < vocab; ++i)
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity()) {
      r.status = static_cast<int32_t>(i);
      break;
    }
  std::vector<uint8_t> is_excluded(vocab, 0);
  for (int32_t e : excluded) {
    is_excluded[static_cast<size_t>(e)] = 1;
    r.excluded_vals.push_back(logits[static_cast<size_t>(e)]);
  }
  std::vector<int32_t> cand;
  for (size_t i = 0; i < vocab; ++i)
    if (!is_excluded[i] && std::isfinite(logits[i])) cand.push_back(static_cast<int32_t>(i));
  const size_t take = std::min(cand.size(), static_cast<size_t>(k));
  std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(take), cand.end(),
                    [&](int32_t a, int32_t b) {
                      const float va = logits[static_cast<size_t>(a)], vb = logits[static_cast<size_t>(b)];
                      return va > vb || (va == vb && a < b);
                    });
  for (size_t i = 0; i < static_cast<size_t>(k); ++i) {
    if (i < take) {
      r.ids.push_back(cand[i]);
      r.vals.push_back(logits[static_cast<size_t>(cand[i])]);
    } else {
      r.ids.push_back(-1);
      r.vals.push_back(-std::numeric_limits<float>::infinity());
    }
  }
  return r;
}

// Ids exactly, values (and excluded values) bit for bit, status exactly.
void expect_topk_equal(const TopkOut& got, const TopkOut& want) {
  ASSERT_EQ(got.ids.size(), want.ids.size());
  ASSERT_EQ(got.vals.size(), want.vals.size());
  EXPECT_EQ(got.status, want.status);
  for (size_t i = 0; i < want.ids.size(); ++i) {
    ASSERT_EQ(got.ids[i], want.ids[i]) << "slot " << i << " (value " << got.vals[i] << ", want " << want.vals[i]
                                       << ")";
    ASSERT_EQ(f32_bits(got.vals[i]), f32_bits(want.vals[i]))
        << "slot " << i << " id " << want.ids[i] << ": " << got.vals[i] << " vs " << want.vals[i];
  }
  ASSERT_EQ(got.excluded_vals.size(), want.excluded_vals.size());
  for (size_t j = 0; j < want.excluded_vals.size(); ++j)
    ASSERT_EQ(f32_bits(got.excluded_vals[j]), f32_bits(want.excluded_vals[j])) << "excluded slot " << j;
}

// The device buffers of one topk_logits call: guarded outputs and inputs, a workspace of exactly
// topk_workspace_bytes.
struct TopkDevice {
  TopkDevice(const std::vector<float>& logits, const std::vector<int32_t>& excluded, int64_t k_, size_t shift = 0)
      : vocab(static_cast<int64_t>(logits.size())),
        n_excluded(static_cast<int64_t>(excluded.size())),
        k(k_),
        d_logits(logits.size(), shift),
        d_excluded(excluded.size()),
        d_ids(static_cast<size_t>(k_)),
        d_status(1),
        d_vals(static_cast<size_t>(k_)),
        d_excluded_vals(excluded.size()),
        ws(topk_workspace_bytes(vocab, k_)) {
    d_logits.upload(logits);
    if (!excluded.empty()) d_excluded.upload(excluded);
  }
  // Outputs and workspace poisoned (the result must not depend on what the workspace held).
  void poison(uint8_t ws_byte) {
    d_ids.poison();
    d_vals.poison();
    d_excluded_vals.poison();
    d_status.poison();
    ws.fill(ws_byte);
  }
  void launch(void* stream) {
    const Exec exec{stream, ws.data(), ws.bytes()};
    const bool any = n_excluded > 0;  // with none, the excluded pointers may be null
    topk_logits(d_logits.data(), vocab, any ? d_excluded.data() : nullptr, n_excluded, k, d_ids.data(),
                d_vals.data(), any ? d_excluded_vals.data() : nullptr, d_status.data(), exec);
  }
  TopkOut download() const {
    TopkOut r;
    r.ids = d_ids.download();
    r.vals = d_vals.download();
    r.excluded_vals = d_excluded_vals.download();
    r.status = d_status.download()[0];
    return r;
  }
  void expect_guards() const {
    EXPECT_TRUE(d_ids.guards_intact());
    EXPECT_TRUE(d_vals.guards_intact());
    EXPECT_TRUE(d_excluded_vals.guards_intact());
    EXPECT_TRUE(d_status.guards_intact());
    EXPECT_TRUE(d_logits.guards_intact());
    EXPECT_TRUE(d_excluded.guards_intact());
  }

  int64_t vocab, n_excluded, k;
  Guarded<float> d_logits;
  Guarded<int32_t> d_excluded, d_ids, d_status;
  Guarded<float> d_vals, d_excluded_vals;
  DeviceBuffer ws;
};

// One call on poisoned outputs and workspace, checked against the CPU (and the logits left as they were).
void check_topk(StreamExec& se, const std::vector<float>& logits, const std::vector<int32_t>& excluded, int64_t k,
                size_t shift = 0) {
  SCOPED_TRACE("vocab " + std::to_string(logits.size()) + " k " + std::to_string(k) + " n_excluded " +
               std::to_string(excluded.size()) + " shift " + std::to_string(shift));
  TopkDevice dev(logits, excluded, k, shift);
  dev.poison(0xA5);
  dev.launch(se.stream.handle());
  se.stream.synchronize();
  dev.expect_guards();
  const std::vector<float> after = dev.d_logits.download();
  ASSERT_EQ(std::memcmp(after.data(), logits.data(), logits.size() * sizeof(float)), 0) << "the logits were written";
  expect_topk_equal(dev.download(), topk_reference(logits, excluded, k));
}

// Sorted unique ids: the top `n_top` tokens of the reference order, then 0 and vocab − 1 (n ≥ 3), then random ones.
std::vector<int32_t> make_excluded(const std::vector<float>& logits, int64_t n, int64_t n_top, std::mt19937_64& rng) {
  const auto vocab = static_cast<int64_t>(logits.size());
  n = std::min(n, vocab);
  std::vector<uint8_t> taken(static_cast<size_t>(vocab), 0);
  std::vector<int32_t> ex;
  auto add = [&](int32_t id) {
    if (static_cast<int64_t>(ex.size()) < n && id >= 0 && !taken[static_cast<size_t>(id)]) {
      taken[static_cast<size_t>(id)] = 1;
      ex.push_back(id);
    }
  };
  for (int32_t id : topk_reference(logits, {}, std::max<int64_t>(1, std::min(n_top, n))).ids) add(id);
  if (n >= 3) {
    add(0);
    add(static_cast<int32_t>(vocab - 1));
  }
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
  while (static_cast<int64_t>(ex.size()) < n) add(pick(rng));
  std::sort(ex.begin(), ex.end());
  return ex;
}

TEST(CudaOps, TopkMatchesCpuForEveryVocabAndK) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(110);
  StreamExec se;
  for (int64_t vocab : {1, 7, 33, 1000, 4096, 4097, 128256, 262144})
    for (int64_t k : {1, 2, 40, 64, 256}) {
      const std::vector<float> logits = test::randn(rng, static_cast<size_t>(vocab), 4.0f);
      check_topk(se, logits, {}, k, vocab % 3 == 1 ? 1 : 0);  // some logits misaligned on purpose
    }
  // Logits shaped like a real head's: a large negative mass, a few high tokens.
  std::vector<float> llama = test::randn(rng, 128256, 2.0f);
  for (float& v : llama) v -= 8.0f;
  for (int i = 0; i < 50; ++i) llama[static_cast<size_t>(rng() % llama.size())] += 20.0f;
  for (int64_t k : {1, 40, 256}) check_topk(se, llama, {}, k);
}

TEST(CudaOps, TopkOnTheLegacyDefaultStream) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(111);
  const std::vector<float> logits = test::randn(rng, 128256);
  TopkDevice dev(logits, {}, 40);
  dev.poison(0x00);
  dev.launch(nullptr);
  device_synchronize("test");
  dev.expect_guards();
  expect_topk_equal(dev.download(), topk_reference(logits, {}, 40));
}

TEST(CudaOps, TopkLargeVocabulariesTakeExtraReductionLaunches) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(112);
  StreamExec se;
  // 2^22 + 5 tokens at k 256: 1025 tiles → 262400 candidates → 33 CTAs → 8448 → 2 CTAs → 512 → final (two
  // reducing launches, both workspace buffers in turn); 2^24 the largest vocabulary allowed.
  for (int64_t vocab : {(int64_t{1} << 22) + 5, int64_t{1} << 24}) {
    const std::vector<float> logits = test::randn(rng, static_cast<size_t>(vocab), 4.0f);
    for (int64_t k : {1, 40, 256}) check_topk(se, logits, {}, k);
    check_topk(se, logits, make_excluded(logits, 1024, 300, rng), 256);
  }
}

TEST(CudaOps, TopkTiesGoToTheLowestIds) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(113);
  StreamExec se;
  for (int64_t vocab : {1000, 4097, 128256, 262144}) {
    // A few distinct values (steps of 0.5), −0 and +0 mixed: long runs of equal logits everywhere.
    std::vector<float> logits = test::randn(rng, static_cast<size_t>(vocab), 2.0f);
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = std::nearbyint(logits[i] * 2.0f) / 2.0f;
      if (logits[i] == 0.0f) logits[i] = i % 2 ? -0.0f : 0.0f;
    }
    for (int64_t k : {1, 2, 40, 256}) check_topk(se, logits, {}, k);
    // Capped at 1: ~16% of the tokens share the top value, spread over every tile.
    for (float& v : logits) v = std::min(v, 1.0f);
    for (int64_t k : {1, 40, 256}) check_topk(se, logits, {}, k);
    check_topk(se, logits, make_excluded(logits, 64, 10, rng), 40);
  }
  // All equal: ids 0, 1, 2, …; all zeros of both signs: the same, each value with its own sign bit.
  check_topk(se, std::vector<float>(128256, 1.0f), {}, 256);
  std::vector<float> zeros(9000, 0.0f);
  for (size_t i = 0; i < zeros.size(); i += 3) zeros[i] = -0.0f;
  for (int64_t k : {1, 40, 256}) check_topk(se, zeros, {}, k);
}

TEST(CudaOps, TopkNeverChoosesNegativeInfinity) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(114);
  StreamExec se;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t vocab : {7, 4097, 128256}) {
    // 90% −inf.
    std::vector<float> logits = test::randn(rng, static_cast<size_t>(vocab), 3.0f);
    for (float& v : logits)
      if (rng() % 10 != 0) v = ninf;
    for (int64_t k : {1, 40, 256}) check_topk(se, logits, {}, k);
    // All −inf: nothing qualifies, status −1.
    for (int64_t k : {1, 256}) check_topk(se, std::vector<float>(static_cast<size_t>(vocab), ninf), {}, k);
  }
  // Three finite tokens (one of them at each end) and k 40: three, then padding.
  std::vector<float> three(128256, ninf);
  three[0] = -1.0f;
  three[70000] = 2.5f;
  three[128255] = -1.0f;
  check_topk(se, three, {}, 40);
  // The extreme finite values rank as floats do (−FLT_MAX still qualifies; ±denormals order around ±0).
  std::vector<float> extremes(4097, ninf);
  const float specials[] = {std::numeric_limits<float>::max(),  std::numeric_limits<float>::lowest(),
                            std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),  -std::numeric_limits<float>::min(),
                            0.0f, -0.0f, 1.0f, -1.0f};
  for (size_t i = 0; i < std::size(specials); ++i) {
    extremes[(i * 409 + 3) % extremes.size()] = specials[i];
    extremes[(i * 97 + 4000) % extremes.size()] = specials[i];  // each twice: ties
  }
  for (int64_t k : {1, 2, 40}) check_topk(se, extremes, {}, k);
  std::vector<float> big(128256, ninf);
  for (size_t i = 0; i < std::size(specials); ++i) big[(i * 12007 + 11) % big.size()] = specials[i];
  check_topk(se, big, {}, 64);
}

TEST(CudaOps, TopkStatusIsTheFirstNaNOrPositiveInfinity) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(115);
  StreamExec se;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float neg_nan = bits_f32(0xFFFFFFFFu);  // sign set, every payload bit
  const float snan = bits_f32(0x7F800001u);     // signalling NaN bits
  for (int64_t vocab : {7, 4097, 128256, 262144}) {
    const std::vector<float> base = test::randn(rng, static_cast<size_t>(vocab), 4.0f);
    const auto at = [&](int64_t i) { return static_cast<size_t>(std::min(i, vocab - 1)); };
    std::vector<float> logits = base;
    logits[at(100000)] = nan;
    logits[at(77000)] = inf;
    for (int64_t k : {1, 40, 256}) check_topk(se, logits, {}, k);
    logits[at(4096)] = neg_nan;  // the first index of the second tile
    logits[at(3)] = snan;
    check_topk(se, logits, {}, 40);
    // The smallest bad index is excluded: still the status, and its raw bits are copied out.
    logits[at(1)] = inf;
    std::vector<int32_t> excluded = {static_cast<int32_t>(at(1)), static_cast<int32_t>(at(3))};
    excluded.erase(std::unique(excluded.begin(), excluded.end()), excluded.end());
    check_topk(se, logits, excluded, 40);
    // Only at the very end.
    logits = base;
    logits[static_cast<size_t>(vocab - 1)] = inf;
    check_topk(se, logits, {}, 256);
  }
}

TEST(CudaOps, TopkExcludedTokensAreNeverChosenAndCopiedOut) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(116);
  StreamExec se;
  for (int64_t vocab : {33, 1000, 4097, 128256, 262144})
    for (int64_t n : {0, 1, 64, 1024})
      for (int64_t k : {1, 40, 256}) {
        std::vector<float> logits = test::randn(rng, static_cast<size_t>(vocab), 4.0f);
        const std::vector<int32_t> excluded = make_excluded(logits, n, n == 1 ? 1 : n / 2, rng);
        if (excluded.size() > 2) {  // excluded tokens may hold anything: their raw logits are copied
          logits[static_cast<size_t>(excluded[1])] = -std::numeric_limits<float>::infinity();
          logits[static_cast<size_t>(excluded[2])] = -0.0f;
        }
        check_topk(se, logits, excluded, k);
      }
  // Every token excluded: only padding.
  std::vector<int32_t> all(7);
  for (int32_t i = 0; i < 7; ++i) all[static_cast<size_t>(i)] = i;
  check_topk(se, test::randn(rng, 7), all, 4);
  std::vector<int32_t> all_tile(1024);
  for (int32_t i = 0; i < 1024; ++i) all_tile[static_cast<size_t>(i)] = 4096 + i;  // a quarter of one tile
  check_topk(se, test::randn(rng, 128256), all_tile, 256);
}

// Expects an Error naming cuda.topk_logits (or `op`) and containing `rule`.
template <typename Fn>
void expect_topk_error(Fn&& fn, const char* rule, const char* op = "cuda.topk_logits") {
  try {
    fn();
    ADD_FAILURE() << "no error thrown; expected [" << op << "] " << rule;
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::string("[") + op + "]"), std::string::npos) << what;
    EXPECT_NE(what.find(rule), std::string::npos) << what;
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
  }
}

TEST(CudaOps, TopkBadArgumentsAreErrorsBeforeAnyLaunch) {
  CIDER_REQUIRE_GPU();
  StreamExec se;
  auto stream = static_cast<cudaStream_t>(se.stream.handle());
  DeviceBuffer buf(1 << 20);
  auto* f = buf.as<float>();                  // logits: floats [0, 65536)
  auto* i32 = buf.as<int32_t>() + 70000;      // ids / excluded
  auto* fo = buf.as<float>() + 80000;         // vals
  auto* st = buf.as<int32_t>() + 90000;       // status
  auto* ex = buf.as<int32_t>() + 100000;      // an excluded list (never read: n_excluded 0)
  DeviceBuffer ws(topk_workspace_bytes(1 << 16, 256));
  const Exec ok{se.stream.handle(), ws.data(), ws.bytes()};
  const size_t need = topk_workspace_bytes(1000, 40);
  ASSERT_GE(ws.bytes(), need);
  const Exec small{se.stream.handle(), ws.data(), need - 1};
  const Exec none{se.stream.handle(), nullptr, 0};
  const Exec odd{se.stream.handle(), static_cast<char*>(ws.data()) + 16, ws.bytes() - 16};

  constexpr const char* kNull = "logits, ids, vals and status must be device pointers, not null";

  // Inside a capture: an error must leave nothing enqueued (the captured graph stays empty).
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 0, i32, f, nullptr, i32, ok); },
                    "k must be in [1, 256]; got 0");
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 257, i32, f, nullptr, i32, ok); },
                    "k must be in [1, 256]; got 257");
  expect_topk_error([&] { topk_logits(f, 1000, i32, 1025, 40, i32, f, f, i32, ok); },
                    "n_excluded must be in [0, 1024]; got 1025");
  expect_topk_error([&] { topk_logits(f, 1000, i32, -1, 40, i32, f, f, i32, ok); },
                    "n_excluded must be in [0, 1024]; got -1");
  expect_topk_error([&] { topk_logits(f, 0, nullptr, 0, 40, i32, f, nullptr, i32, ok); },
                    "vocab must be in [1, 2^24]; got 0");
  expect_topk_error([&] { topk_logits(f, (int64_t{1} << 24) + 1, nullptr, 0, 40, i32, f, nullptr, i32, ok); },
                    "vocab must be in [1, 2^24]; got 16777217");
  expect_topk_error([&] { topk_logits(nullptr, 1000, nullptr, 0, 40, i32, f, nullptr, i32, ok); }, kNull);
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 40, nullptr, f, nullptr, i32, ok); }, kNull);
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 40, i32, nullptr, nullptr, i32, ok); }, kNull);
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 40, i32, f, nullptr, nullptr, ok); }, kNull);
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 1, 40, i32, f, f, i32, ok); },
                    "when n_excluded > 0; got n_excluded 1");
  expect_topk_error([&] { topk_logits(f, 1000, i32, 1, 40, i32, f, nullptr, i32, ok); },
                    "when n_excluded > 0; got n_excluded 1");
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 40, i32, f, nullptr, i32, small); },
                    "exec.workspace must hold topk_workspace_bytes(vocab, k)");
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 40, i32, f, nullptr, i32, none); },
                    "exec.workspace must hold topk_workspace_bytes(vocab, k)");
  expect_topk_error([&] { topk_logits(f, 1000, nullptr, 0, 40, i32, f, nullptr, i32, odd); },
                    "exec.workspace must be 256-byte aligned");
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_NE(graph, nullptr);
  size_t nodes = 1;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &nodes), cudaSuccess);
  EXPECT_EQ(nodes, 0u) << "a failed call enqueued work";
  cudaGraphDestroy(graph);

  expect_topk_error([] { (void)topk_workspace_bytes(0, 1); }, "vocab must be in [1, 2^24]; got 0",
                    "cuda.topk_workspace_bytes");
  expect_topk_error([] { (void)topk_workspace_bytes(100, 0); }, "k must be in [1, 256]; got 0",
                    "cuda.topk_workspace_bytes");
  // The smallest valid call still works on the same stream afterwards; the largest k and n_excluded are accepted.
  EXPECT_NO_THROW(topk_logits(f, 1, nullptr, 0, 1, i32, fo, nullptr, st, ok));
  EXPECT_NO_THROW(topk_logits(f, 1 << 16, ex, 0, 256, i32, fo, nullptr, st, ok));
  se.stream.synchronize();
}

TEST(CudaOps, TopkInACudaGraphReplaysWithFreshInputs) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(117);
  StreamExec se;
  auto stream = static_cast<cudaStream_t>(se.stream.handle());
  // 128256 / k 40: stage 1 + final; 262144 / k 256: one reducing launch between; 1000: a single launch.
  struct GraphCase {
    int64_t vocab, k, n_ex;
  };
  for (const GraphCase& c : {GraphCase{128256, 40, 64}, GraphCase{262144, 256, 1024}, GraphCase{1000, 2, 5}}) {
    const int64_t vocab = c.vocab, k = c.k;
    SCOPED_TRACE("vocab " + std::to_string(vocab) + " k " + std::to_string(k));
    std::vector<float> logits = test::randn(rng, static_cast<size_t>(vocab), 4.0f);
    const std::vector<int32_t> excluded = make_excluded(logits, c.n_ex, 8, rng);
    TopkDevice dev(logits, excluded, k);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    dev.launch(se.stream.handle());
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    cudaGraphExec_t instance = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&instance, graph, 0), cudaSuccess);
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE("replay " + std::to_string(rep));
      if (rep == 2) {  // new logits (a NaN among them) in the same buffer: the replay must see them
        logits = test::randn(rng, static_cast<size_t>(vocab), 4.0f);
        logits[static_cast<size_t>(vocab / 2)] = std::numeric_limits<float>::quiet_NaN();
        dev.d_logits.upload(logits);
      }
      dev.poison(rep == 1 ? 0x00 : 0xFF);
      ASSERT_EQ(cudaGraphLaunch(instance, stream), cudaSuccess);
      se.stream.synchronize();
      dev.expect_guards();
      expect_topk_equal(dev.download(), topk_reference(logits, excluded, k));
    }
    cudaGraphExecDestroy(instance);
    cudaGraphDestroy(graph);
  }
}

// ---- log normalizers (topk.cu) ----------------------------------------------------------------------------------

// log_normalizers against float64 on the host: the max exactly; log Σ exp(z − max) within 2e-6 — each term is
// expf(fl(z − max)), whose rounding (the subtraction's 2^-24·|z − max| and expf's ≤ 2 ulp) perturbs the sum by at most
// ~4e-7 relative where the terms that matter are (|z − max| ≤ 16), and the float32 result adds ≤ 0.5 ulp of a value
// below 16 (4.8e-7). Rows of several vocabularies with tails, −inf entries, one row of NaN and one of +inf (NaN out),
// one all −inf (max −inf, sum NaN).
TEST(CudaOps, LogNormalizersMatchFloat64) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(117);
  StreamExec se;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t vocab : {1, 7, 513, 4097, 128256}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    const int64_t n = 6;
    std::vector<float> rows = test::randn(rng, static_cast<size_t>(n * vocab), 5.0f);
    for (int64_t i = 0; i < vocab; i += 3) rows[static_cast<size_t>(i)] = ninf;  // row 0: a third −inf
    rows[static_cast<size_t>(2 * vocab + vocab / 2)] = std::numeric_limits<float>::quiet_NaN();  // row 2
    rows[static_cast<size_t>(3 * vocab + vocab - 1)] = std::numeric_limits<float>::infinity();   // row 3
    for (int64_t i = 0; i < vocab; ++i) rows[static_cast<size_t>(4 * vocab + i)] = ninf;        // row 4
    Guarded<float> d_rows(rows.size()), d_out(static_cast<size_t>(2 * n));
    d_rows.upload(rows);
    d_out.poison();
    log_normalizers(d_rows.data(), n, vocab, d_out.data(), se.exec);
    se.stream.synchronize();
    EXPECT_TRUE(d_out.guards_intact());
    const std::vector<float> out = d_out.download();
    for (int64_t r = 0; r < n; ++r) {
      const float* z = rows.data() + r * vocab;
      float mx = ninf;
      bool bad = false;
      for (int64_t i = 0; i < vocab; ++i) {
        bad = bad || std::isnan(z[i]) || z[i] == std::numeric_limits<float>::infinity();
        mx = std::max(mx, z[i]);
      }
      const float got_max = out[static_cast<size_t>(2 * r)], got_lse = out[static_cast<size_t>(2 * r + 1)];
      if (bad) {
        EXPECT_TRUE(std::isnan(got_max) && std::isnan(got_lse)) << "row " << r;
        continue;
      }
      EXPECT_EQ(got_max, mx) << "row " << r;
      if (mx == ninf) {
        EXPECT_TRUE(std::isnan(got_lse)) << "row " << r;
        continue;
      }
      double sum = 0.0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(z[i]) - mx);
      EXPECT_NEAR(got_lse, std::log(sum), 2e-6) << "row " << r;
      EXPECT_FALSE(std::isnan(got_lse)) << "row " << r;
    }
  }
  expect_error([&] { log_normalizers(nullptr, 1, 4, nullptr, se.exec); }, "cuda.log_normalizers");
}

}  // namespace
}  // namespace cider::cuda
