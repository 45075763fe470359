// GPTQ's factor (quant/gptq.h).
#include "quant/gptq.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"

namespace cider::quant {

namespace {

// Σ a[i]·b[i], i < n, with four running sums (so the compiler can vectorize it).
double dot(const double* a, const double* b, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) s[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace

std::vector<float> gptq_factor(const float* H, int64_t K, double damp) {
  constexpr const char* op = "gptq_factor";
  check(K > 0, ErrorCode::kInvalidArgument, op, "K must be > 0; got ", K);
  check(damp > 0.0 && damp <= 1.0, ErrorCode::kInvalidArgument, op, "damp must be in (0, 1]; got ", damp);
  const auto k = static_cast<size_t>(K);
  // A = P (H + λ·mean(diag)·I) P, lower triangle, row-major: A[i][j] = H[K−1−i][K−1−j], j <= i.
  double mean_diag = 0.0;
  for (int64_t i = 0; i < K; ++i) {
    const float d = H[i * K + i];
    check(std::isfinite(d) && d >= 0.0f, ErrorCode::kInvalidArgument, op, "diagonal value ", i, " is ", d,
          "; a second moment's diagonal must be finite and >= 0");
    mean_diag += d == 0.0f ? 1.0 : d;
  }
  mean_diag /= static_cast<double>(K);
  std::vector<double> L(k * k, 0.0);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      const int64_t hi = K - 1 - i, hj = K - 1 - j;  // hi <= hj: the upper triangle of H
      const float v = H[hi * K + hj];
      check(std::isfinite(v), ErrorCode::kInvalidArgument, op, "value (", hi, ", ", hj, ") is ", v,
            "; every value must be finite");
      double a = v;
      if (i == j) a = (v == 0.0f ? 1.0 : a) + damp * mean_diag;
      L[static_cast<size_t>(i) * k + static_cast<size_t>(j)] = a;
    }
  // Both triangular steps go by groups of kGroup rows: the rows before the group are final, so each is read once for
  // the whole group (the rows of a group split over the thread pool), then the group's own rows one after another.
  constexpr int64_t kGroup = 16;
  ThreadPool& pool = default_thread_pool();
  // Cholesky in place, row by row: L[i][j] = (A[i][j] − Σ_{t<j} L[i][t] L[j][t]) / L[j][j].
  for (int64_t i0 = 0; i0 < K; i0 += kGroup) {
    const int64_t i1 = std::min(i0 + kGroup, K);
    pool.parallel_for(i1 - i0, [&](int64_t b0, int64_t b1, int) {
      for (int64_t j = 0; j < i0; ++j) {
        const double* lj = L.data() + static_cast<size_t>(j) * k;
        for (int64_t i = i0 + b0; i < i0 + b1; ++i) {
          double* li = L.data() + static_cast<size_t>(i) * k;
          li[j] = (li[j] - dot(li, lj, j)) / lj[j];
        }
      }
    });
    for (int64_t i = i0; i < i1; ++i) {
      double* li = L.data() + static_cast<size_t>(i) * k;
      for (int64_t j = i0; j < i; ++j) {
        const double* lj = L.data() + static_cast<size_t>(j) * k;
        li[j] = (li[j] - dot(li, lj, j)) / lj[j];
      }
      const double d = li[i] - dot(li, li, i);
      check(d > 0.0 && std::isfinite(d), ErrorCode::kInvalidArgument, op, "the damped matrix is not positive "
            "definite at column ", K - 1 - i, " (pivot ", d, ")");
      li[i] = std::sqrt(d);
    }
  }
  // M = L⁻¹ (lower), row by row: M[i][j] = −(Σ_{j<=t<i} L[i][t] M[t][j]) / L[i][i], M[i][i] = 1 / L[i][i]; the sums
  // of row i gather in R's row i as Σ_t L[i][t]·M[t][0 … t].
  std::vector<double> M(k * k, 0.0), R(static_cast<size_t>(kGroup) * k);
  for (int64_t i0 = 0; i0 < K; i0 += kGroup) {
    const int64_t i1 = std::min(i0 + kGroup, K);
    std::fill(R.begin(), R.end(), 0.0);
    auto gather = [&](int64_t i, int64_t t) {  // R[i − i0][0 … t] += L[i][t] · M[t][0 … t]
      const double lt = L[static_cast<size_t>(i) * k + static_cast<size_t>(t)];
      const double* mt = M.data() + static_cast<size_t>(t) * k;
      double* r = R.data() + static_cast<size_t>(i - i0) * k;
      for (int64_t j = 0; j <= t; ++j) r[j] += lt * mt[j];
    };
    pool.parallel_for(i1 - i0, [&](int64_t b0, int64_t b1, int) {
      for (int64_t t = 0; t < i0; ++t)
        for (int64_t i = i0 + b0; i < i0 + b1; ++i) gather(i, t);
    });
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t t = i0; t < i; ++t) gather(i, t);
      const double lii = L[static_cast<size_t>(i) * k + static_cast<size_t>(i)];
      const double* r = R.data() + static_cast<size_t>(i - i0) * k;
      double* mi = M.data() + static_cast<size_t>(i) * k;
      for (int64_t j = 0; j < i; ++j) mi[j] = -r[j] / lii;
      mi[i] = 1.0 / lii;
    }
  }
  // U = P M P: U[i][j] = M[K−1−i][K−1−j], upper.
  std::vector<float> U(k * k, 0.0f);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = i; j < K; ++j)
      U[static_cast<size_t>(i) * k + static_cast<size_t>(j)] =
          static_cast<float>(M[static_cast<size_t>(K - 1 - i) * k + static_cast<size_t>(K - 1 - j)]);
  return U;
}

}  // namespace cider::quant
