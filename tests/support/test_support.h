// Shared test helpers: fresh seeded randomness, canary-guarded output buffers, element-wise comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "model/sampler.h"
#include "model/session_state.h"

namespace cider::test {

// The directory the tests read the repository's data from (models/cider-tiny, tests/data): $CIDER_TEST_ROOT when set;
// else the nearest directory at or above the test executable's folder (/proc/self/exe) that holds models/cider-tiny
// (so a build or a packed .gpu/bin/ copied to another machine finds the checkout, or the data packed beside it);
// else `compiled_in` (the source directory at build time). Decided once per process.
const std::string& test_root(const char* compiled_in);

// root/rel for a repository-relative path, e.g. repo_file("models/cider-tiny").
#ifdef CIDER_SOURCE_DIR
inline std::string repo_file(const std::string& rel) { return test_root(CIDER_SOURCE_DIR) + "/" + rel; }
#else
inline std::string repo_file(const std::string& rel) { return test_root("") + "/" + rel; }
#endif

// The seed for this test process: $CIDER_TEST_SEED if set, otherwise fresh from std::random_device.
// Printed once so a failure can be replayed.
uint64_t test_seed();

// A generator seeded from test_seed() and a per-call salt (so each test draws fresh, independent data).
std::mt19937_64 make_rng(uint64_t salt = 0);

// n values ~ N(0, sigma²) as float32.
std::vector<float> randn(std::mt19937_64& rng, size_t n, float sigma = 1.0f);
// n values ~ U[lo, hi).
std::vector<float> uniform(std::mt19937_64& rng, size_t n, float lo, float hi);

// Rows of `dim` values ~ N(0,1) where a few fixed channels are scaled by `outlier_scale` (as real K caches have).
std::vector<float> randn_with_outlier_channels(std::mt19937_64& rng, size_t rows, size_t dim, float outlier_scale,
                                               int n_outlier_channels);

// Converts float32 values to a float dtype's storage bytes (rounding), and back.
std::vector<uint8_t> to_dtype_bytes(const std::vector<float>& v, DType t);
std::vector<float> from_dtype_bytes(const void* p, DType t, size_t n);

// An output buffer with canary bytes on both sides; verify() checks the canaries are untouched.
class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 256;
  static constexpr uint8_t kCanary = 0xA5;
  explicit GuardedBuffer(size_t nbytes);
  void* data() { return bytes_.data() + kGuardBytes; }
  template <typename T>
  T* as() { return reinterpret_cast<T*>(data()); }
  size_t nbytes() const { return n_; }
  // True when no byte outside [data, data + nbytes) was written. Fill the inside with `fill` first if wanted.
  bool canaries_intact() const;
  void fill_inside(uint8_t value);

 private:
  std::vector<uint8_t> bytes_;
  size_t n_;
};

// Fails the test (with the index) at the first element where |got - want| > atol + rtol*|want| or got is NaN.
::testing::AssertionResult all_close(const float* got, const double* want, size_t n, double atol, double rtol = 0.0);
::testing::AssertionResult all_close(const float* got, const float* want, size_t n, double atol, double rtol = 0.0);
// True when no element is NaN.
bool no_nan(const float* p, size_t n);

// Shapes with tails, the sizes every kernel test sweeps.
inline const std::vector<int64_t>& tail_sizes() {
  static const std::vector<int64_t> sizes = {1, 7, 33, 67, 129};
  return sizes;
}

// What a device answers to a sampler's request (the contract of kernels/cuda/topk.cu), written plainly: the excluded
// tokens' raw logits; of the others, the finite ones by (logit desc, id asc), the first k, padded with -1 / -inf; the
// first NaN/+inf index.
model::Candidates reference_candidates(const std::vector<float>& logits, const model::CandidateRequest& request);

// Success when fn() throws cider::Error with this code and a message containing `needle`.
template <typename Fn>
::testing::AssertionResult throws_code(Fn fn, ErrorCode code, const std::string& needle) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.code() != code) return ::testing::AssertionFailure() << "wrong code: " << e.what();
    if (std::string(e.what()).find(needle) == std::string::npos)
      return ::testing::AssertionFailure() << "message '" << e.what() << "' lacks '" << needle << "'";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// Two session states hold the same positions and bytes, layer by layer and plane by plane (metadata length, start,
// dims); the linear-attention states' count, and with linear_contents their positions and values too.
void expect_same_state(const model::SessionState& a, const model::SessionState& b, const std::string& what,
                       bool linear_contents);

}  // namespace cider::test
