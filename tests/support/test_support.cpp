#include "support/test_support.h"

#include <algorithm>
#include <limits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace cider::test {

const std::string& test_root(const char* compiled_in) {
  static const std::string root = [compiled_in]() -> std::string {
    if (const char* env = std::getenv("CIDER_TEST_ROOT"); env && *env) return env;
    std::error_code ec;
    namespace fs = std::filesystem;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
        if (fs::is_directory(dir / "models" / "cider-tiny", ec)) return dir.string();
        if (dir == dir.root_path()) break;
      }
    }
    return compiled_in ? compiled_in : "";
  }();
  return root;
}

uint64_t test_seed() {
  static const uint64_t seed = [] {
    uint64_t s;
    if (const char* env = std::getenv("CIDER_TEST_SEED")) {
      s = std::strtoull(env, nullptr, 10);
    } else {
      std::random_device rd;
      s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    }
    std::fprintf(stderr, "[cider tests] random seed %llu (replay with CIDER_TEST_SEED=%llu)\n",
                 static_cast<unsigned long long>(s), static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::mt19937_64 make_rng(uint64_t salt) {
  std::seed_seq seq{static_cast<uint32_t>(test_seed()), static_cast<uint32_t>(test_seed() >> 32),
                    static_cast<uint32_t>(salt), static_cast<uint32_t>(salt >> 32)};
  return std::mt19937_64(seq);
}

std::vector<float> randn(std::mt19937_64& rng, size_t n, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> uniform(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> randn_with_outlier_channels(std::mt19937_64& rng, size_t rows, size_t dim, float outlier_scale,
                                               int n_outlier_channels) {
  std::vector<float> v = randn(rng, rows * dim);
  std::vector<size_t> channels;
  std::uniform_int_distribution<size_t> pick(0, dim - 1);
  for (int i = 0; i < n_outlier_channels; ++i) channels.push_back(pick(rng));
  for (size_t r = 0; r < rows; ++r)
    for (size_t c : channels) v[r * dim + c] *= outlier_scale;
  return v;
}

std::vector<uint8_t> to_dtype_bytes(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * static_cast<size_t>(dtype_size(t)));
  for (size_t i = 0; i < v.size(); ++i) store_float(out.data(), t, static_cast<int64_t>(i), v[i]);
  return out;
}

std::vector<float> from_dtype_bytes(const void* p, DType t, size_t n) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = load_float(p, t, static_cast<int64_t>(i));
  return out;
}

GuardedBuffer::GuardedBuffer(size_t nbytes) : bytes_(nbytes + 2 * kGuardBytes, kCanary), n_(nbytes) {}

bool GuardedBuffer::canaries_intact() const {
  for (size_t i = 0; i < kGuardBytes; ++i)
    if (bytes_[i] != kCanary || bytes_[kGuardBytes + n_ + i] != kCanary) return false;
  return true;
}

void GuardedBuffer::fill_inside(uint8_t value) { std::memset(bytes_.data() + kGuardBytes, value, n_); }

template <typename W>
static ::testing::AssertionResult close_impl(const float* got, const W* want, size_t n, double atol, double rtol) {
  for (size_t i = 0; i < n; ++i) {
    double g = got[i], w = static_cast<double>(want[i]);
    double tol = atol + rtol * std::fabs(w);
    if (std::isnan(g) || std::isnan(w) || std::fabs(g - w) > tol) {
      return ::testing::AssertionFailure() << "element " << i << " of " << n << ": got " << g << ", want " << w
                                           << " (|diff| " << std::fabs(g - w) << " > tol " << tol << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult all_close(const float* got, const double* want, size_t n, double atol, double rtol) {
  return close_impl(got, want, n, atol, rtol);
}
::testing::AssertionResult all_close(const float* got, const float* want, size_t n, double atol, double rtol) {
  return close_impl(got, want, n, atol, rtol);
}

bool no_nan(const float* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::isnan(p[i])) return false;
  return true;
}

model::Candidates reference_candidates(const std::vector<float>& logits, const model::CandidateRequest& request) {
  model::Candidates c;
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (c.bad_index < 0 && (std::isnan(x) || x == std::numeric_limits<float>::infinity()))
      c.bad_index = static_cast<int64_t>(i);
    const bool excluded =
        std::binary_search(request.excluded.begin(), request.excluded.end(), static_cast<int32_t>(i));
    if (!excluded && std::isfinite(x)) order.push_back(static_cast<int32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const float x = logits[static_cast<size_t>(a)], y = logits[static_cast<size_t>(b)];
    return x != y ? x > y : a < b;
  });
  for (int64_t j = 0; j < request.k; ++j) {
    const bool has = j < static_cast<int64_t>(order.size());
    c.ids.push_back(has ? order[static_cast<size_t>(j)] : -1);
    c.logits.push_back(has ? logits[static_cast<size_t>(order[static_cast<size_t>(j)])]
                           : -std::numeric_limits<float>::infinity());
  }
  for (int32_t id : request.excluded) c.excluded_logits.push_back(logits[static_cast<size_t>(id)]);
  return c;
}

void expect_same_state(const model::SessionState& a, const model::SessionState& b, const std::string& what,
                       bool linear_contents) {
  ASSERT_EQ(a.position, b.position) << what;
  ASSERT_EQ(a.caches.size(), b.caches.size()) << what;
  for (size_t l = 0; l < a.caches.size(); ++l) {
    const auto &x = a.caches[l], &y = b.caches[l];
    EXPECT_EQ(x.meta().length, y.meta().length) << what << " layer " << l;
    EXPECT_EQ(x.meta().start, y.meta().start) << what << " layer " << l;
    EXPECT_EQ(x.meta().has_dims, y.meta().has_dims) << what << " layer " << l;
    ASSERT_EQ(x.num_planes(), y.num_planes()) << what << " layer " << l;
    for (size_t p = 0; p < x.num_planes(); ++p) {
      ASSERT_EQ(x.plane(p).nbytes(), y.plane(p).nbytes()) << what << " layer " << l << " plane " << p;
      if (x.plane(p).nbytes() == 0) continue;  // an empty plane may have no storage (memcmp needs pointers)
      EXPECT_EQ(std::memcmp(x.plane(p).data(), y.plane(p).data(), x.plane(p).nbytes()), 0)
          << what << " layer " << l << " plane " << p;
    }
  }
  if (!linear_contents) {
    EXPECT_EQ(a.linear.size(), b.linear.size()) << what;
    return;
  }
  ASSERT_EQ(a.linear.size(), b.linear.size()) << what;
  for (size_t l = 0; l < a.linear.size(); ++l) {
    EXPECT_EQ(a.linear[l].pos, b.linear[l].pos) << what << " layer " << l;
    EXPECT_EQ(a.linear[l].S, b.linear[l].S) << what << " layer " << l;
    EXPECT_EQ(a.linear[l].conv, b.linear[l].conv) << what << " layer " << l;
  }
}

}  // namespace cider::test
