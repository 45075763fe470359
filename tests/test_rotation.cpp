// KV rotations: SO(4) blocks and the whole-head randomized Hadamard transform — orthogonality, inverse, closed form ==
// dense matrix, reproducible generator, rejected head dims.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "nn/rotation.h"
#include "support/test_support.h"

namespace cider {
namespace {

using nn::RotationKind;
using nn::Rotation;
using nn::SO4Rotation;

const std::vector<int64_t>& head_dims() {
  static const std::vector<int64_t> dims = {4, 12, 36, 64, 128, 256};
  return dims;
}
const RotationKind kRotatingKinds[] = {RotationKind::kSO4Fast, RotationKind::kSO4Full};

double dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

std::string label(int64_t d, RotationKind k) { return "head_dim " + std::to_string(d) + " " + rotation_kind_name(k); }

TEST(Rotation, QuaternionsAreUnit) {
  for (int64_t d : head_dims()) {
    SO4Rotation rot(d, RotationKind::kSO4Full, test::make_rng(1)());
    ASSERT_EQ(rot.num_blocks(), d / 4);
    for (const auto* q : {&rot.left(), &rot.right()}) {
      ASSERT_EQ(q->size(), static_cast<size_t>(d));
      for (int64_t b = 0; b < d / 4; ++b) {
        const float* p = q->data() + b * 4;
        EXPECT_NEAR(dot(p, p, 4), 1.0, 1e-6) << label(d, rot.kind()) << " block " << b;
      }
    }
  }
}

TEST(Rotation, PreservesNorms) {
  auto rng = test::make_rng(2);
  for (int64_t d : head_dims())
    for (RotationKind kind : kRotatingKinds) {
      SO4Rotation rot(d, kind, rng());
      const int64_t rows = 9;
      std::vector<float> v = test::randn(rng, static_cast<size_t>(rows * d), 3.0f);
      std::vector<float> w = v;
      rot.apply(w.data(), rows);
      for (int64_t r = 0; r < rows; ++r) {
        const double n0 = dot(&v[static_cast<size_t>(r * d)], &v[static_cast<size_t>(r * d)], d);
        const double n1 = dot(&w[static_cast<size_t>(r * d)], &w[static_cast<size_t>(r * d)], d);
        EXPECT_NEAR(std::sqrt(n1), std::sqrt(n0), 1e-5 * std::sqrt(n0)) << label(d, kind) << " row " << r;
      }
      // A real rotation, not the identity: the rotated rows differ from the input (skipped for a single block,
      // whose random quaternion may be close to 1 with small but non-negligible probability).
      if (d < 12) continue;
      double moved = 0.0;
      for (size_t i = 0; i < v.size(); ++i) moved += std::fabs(static_cast<double>(w[i]) - v[i]);
      EXPECT_GT(moved, 0.1 * static_cast<double>(v.size())) << label(d, kind);
    }
}

TEST(Rotation, InverseUndoesApply) {
  auto rng = test::make_rng(3);
  for (int64_t d : head_dims())
    for (RotationKind kind : kRotatingKinds) {
      SO4Rotation rot(d, kind, rng());
      const int64_t rows = 5;
      std::vector<float> v = test::randn(rng, static_cast<size_t>(rows * d));
      std::vector<float> w = v;
      rot.apply(w.data(), rows);
      rot.apply_inverse(w.data(), rows);
      EXPECT_TRUE(test::all_close(w.data(), v.data(), v.size(), 2e-6, 2e-6)) << label(d, kind);
      // And the other order: R R⁻¹ = I.
      w = v;
      rot.apply_inverse(w.data(), rows);
      rot.apply(w.data(), rows);
      EXPECT_TRUE(test::all_close(w.data(), v.data(), v.size(), 2e-6, 2e-6)) << label(d, kind);
    }
}

TEST(Rotation, DenseMatrixIsOrthogonalAndBlockDiagonal) {
  for (int64_t d : head_dims())
    for (RotationKind kind : kRotatingKinds) {
      SO4Rotation rot(d, kind, test::make_rng(4)());
      const std::vector<double> m = rot.dense_matrix();
      ASSERT_EQ(m.size(), static_cast<size_t>(d * d));
      double worst = 0.0;
      for (int64_t i = 0; i < d; ++i)
        for (int64_t j = 0; j < d; ++j) {
          double s = 0.0;  // (Mᵀ M)[i, j]
          for (int64_t k = 0; k < d; ++k) s += m[static_cast<size_t>(k * d + i)] * m[static_cast<size_t>(k * d + j)];
          worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
          if (i / 4 != j / 4) {
            ASSERT_EQ(m[static_cast<size_t>(i * d + j)], 0.0) << label(d, kind);
          }
        }
      EXPECT_LT(worst, 1e-6) << label(d, kind);
      // det of each 4×4 block is +1 (a rotation, not a reflection): check with the first block.
      double a[4][4];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) a[i][j] = m[static_cast<size_t>(i * d + j)];
      double det = 1.0;
      for (int c = 0; c < 4; ++c) {
        int p = c;
        for (int r = c + 1; r < 4; ++r)
          if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
        if (p != c) {
          for (int j = 0; j < 4; ++j) std::swap(a[p][j], a[c][j]);
          det = -det;
        }
        det *= a[c][c];
        for (int r = c + 1; r < 4; ++r) {
          const double f = a[r][c] / a[c][c];
          for (int j = c; j < 4; ++j) a[r][j] -= f * a[c][j];
        }
      }
      EXPECT_NEAR(det, 1.0, 1e-6) << label(d, kind);
    }
}

TEST(Rotation, ClosedFormMatchesDenseMatrix) {
  auto rng = test::make_rng(5);
  for (int64_t d : head_dims())
    for (RotationKind kind : kRotatingKinds) {
      SO4Rotation rot(d, kind, rng());
      const std::vector<double> m = rot.dense_matrix();
      const int64_t rows = 4;
      std::vector<float> v = test::randn(rng, static_cast<size_t>(rows * d));
      std::vector<float> w = v;
      rot.apply(w.data(), rows);
      std::vector<double> want(v.size()), want_inv(v.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < d; ++i) {
          double s = 0.0, t = 0.0;
          for (int64_t k = 0; k < d; ++k) {
            s += m[static_cast<size_t>(i * d + k)] * v[static_cast<size_t>(r * d + k)];  // M v
            t += m[static_cast<size_t>(k * d + i)] * v[static_cast<size_t>(r * d + k)];  // Mᵀ v
          }
          want[static_cast<size_t>(r * d + i)] = s;
          want_inv[static_cast<size_t>(r * d + i)] = t;
        }
      EXPECT_TRUE(test::all_close(w.data(), want.data(), w.size(), 3e-6, 3e-6)) << label(d, kind);
      w = v;
      rot.apply_inverse(w.data(), rows);
      EXPECT_TRUE(test::all_close(w.data(), want_inv.data(), w.size(), 3e-6, 3e-6)) << label(d, kind);
    }
}

// The full kind is the sandwich qL·v·conj(qR), the fast kind the left product qL·v: checked on one block against
// quaternion products written out in double.
TEST(Rotation, KindsFollowTheirQuaternionFormulas) {
  auto rng = test::make_rng(6);
  const uint64_t seed = rng();
  SO4Rotation full(8, RotationKind::kSO4Full, seed), fast(8, RotationKind::kSO4Fast, seed);
  EXPECT_EQ(full.left(), fast.left());  // the same draws for the same seed
  auto ham = [](const double* p, const double* q, double* o) {
    o[0] = p[0] * q[0] - p[1] * q[1] - p[2] * q[2] - p[3] * q[3];
    o[1] = p[0] * q[1] + p[1] * q[0] + p[2] * q[3] - p[3] * q[2];
    o[2] = p[0] * q[2] - p[1] * q[3] + p[2] * q[0] + p[3] * q[1];
    o[3] = p[0] * q[3] + p[1] * q[2] - p[2] * q[1] + p[3] * q[0];
  };
  std::vector<float> v = test::randn(rng, 8);
  std::vector<float> wf = v, wl = v;
  full.apply(wf.data(), 1);
  fast.apply(wl.data(), 1);
  for (int b = 0; b < 2; ++b) {
    double l[4], rc[4], x[4], t[4], o[4];
    for (int i = 0; i < 4; ++i) {
      l[i] = full.left()[static_cast<size_t>(b * 4 + i)];
      rc[i] = (i == 0 ? 1.0 : -1.0) * full.right()[static_cast<size_t>(b * 4 + i)];
      x[i] = v[static_cast<size_t>(b * 4 + i)];
    }
    ham(l, x, t);
    ham(t, rc, o);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(wl[static_cast<size_t>(b * 4 + i)], t[i], 1e-5) << "fast block " << b;
      EXPECT_NEAR(wf[static_cast<size_t>(b * 4 + i)], o[i], 1e-5) << "full block " << b;
    }
  }
  // The two kinds are different rotations (qR is not the identity).
  double diff = 0.0;
  for (size_t i = 0; i < v.size(); ++i) diff += std::fabs(wf[i] - wl[i]);
  EXPECT_GT(diff, 1e-3);
}

TEST(Rotation, DotProductsUnchangedWhenBothRotated) {
  auto rng = test::make_rng(7);
  for (int64_t d : head_dims())
    for (RotationKind kind : kRotatingKinds) {
      SO4Rotation rot(d, kind, rng());
      std::vector<float> q = test::randn(rng, static_cast<size_t>(d));
      std::vector<float> k = test::randn_with_outlier_channels(rng, 1, static_cast<size_t>(d), 20.0f, 2);
      const double before = dot(q.data(), k.data(), d);
      rot.apply(q.data(), 1);
      rot.apply(k.data(), 1);
      const double scale = std::sqrt(dot(q.data(), q.data(), d) * dot(k.data(), k.data(), d));
      EXPECT_NEAR(dot(q.data(), k.data(), d), before, 2e-6 * scale) << label(d, kind);
    }
}

TEST(Rotation, SameSeedSameRotationDifferentSeedsDiffer) {
  auto rng = test::make_rng(8);
  for (int64_t d : head_dims()) {
    const uint64_t seed = rng();
    SO4Rotation a(d, RotationKind::kSO4Full, seed), b(d, RotationKind::kSO4Full, seed);
    SO4Rotation c(d, RotationKind::kSO4Full, seed + 1);
    EXPECT_EQ(a.left(), b.left());
    EXPECT_EQ(a.right(), b.right());
    EXPECT_TRUE(a == b);
    EXPECT_NE(a.left(), c.left());
    EXPECT_NE(a.right(), c.right());
    // A longer head extends a shorter one with the same seed (blocks are drawn in order).
    SO4Rotation longer(d + 8, RotationKind::kSO4Full, seed);
    EXPECT_TRUE(std::equal(a.left().begin(), a.left().end(), longer.left().begin()));
  }
}

// Pins the generator: the first quaternion for seed 0 as computed by an independent implementation of the
// documented algorithm (SplitMix64 → xoshiro256** → Box–Muller, Python floats). If this changes, caches written by
// other implementations would no longer decode.
TEST(Rotation, GeneratorIsPinned) {
  SO4Rotation rot(4, RotationKind::kSO4Full, 0);
  const float want_l[4] = {-0.0132252574f, -0.945559442f, -0.281535357f, 0.162727565f};
  const float want_r[4] = {0.840539694f, -0.00132857647f, -0.528210521f, -0.120353147f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(rot.left()[static_cast<size_t>(i)], want_l[i], 1e-6f) << i;
    EXPECT_NEAR(rot.right()[static_cast<size_t>(i)], want_r[i], 1e-6f) << i;
  }
}

TEST(Rotation, NoneIsIdentity) {
  auto rng = test::make_rng(9);
  SO4Rotation rot(10, RotationKind::kNone, 3);
  std::vector<float> v = test::randn(rng, 20), w = v;
  rot.apply(w.data(), 2);
  EXPECT_EQ(v, w);
  rot.apply_inverse(w.data(), 2);
  EXPECT_EQ(v, w);
  EXPECT_TRUE(rot.is_identity());
}

TEST(Rotation, RejectsHeadDimNotMultipleOfFour) {
  try {
    SO4Rotation rot(10, RotationKind::kSO4Full, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("[rotation]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("got 10"), std::string::npos) << e.what();
  }
}

TEST(Rotation, RejectsNonPositiveHeadDim) {
  try {
    SO4Rotation rot(0, RotationKind::kSO4Fast, 0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[rotation]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("got 0"), std::string::npos) << e.what();
  }
}

// ---- Hadamard ------------------------------------------------------------------------------------------------------

const int64_t kHadamardDims[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

std::string hlabel(int64_t d) { return "hadamard head_dim " + std::to_string(d); }

TEST(RotationHadamard, SignsArePlusMinusOneAndReproducible) {
  for (int64_t d : kHadamardDims) {
    const Rotation a(d, RotationKind::kHadamard, 11), b(d, RotationKind::kHadamard, 11);
    const Rotation c(d, RotationKind::kHadamard, 12);
    ASSERT_EQ(a.signs().size(), static_cast<size_t>(d)) << hlabel(d);
    for (float s : a.signs()) ASSERT_TRUE(s == 1.0f || s == -1.0f) << hlabel(d);
    EXPECT_EQ(a.signs(), b.signs()) << hlabel(d);
    if (d >= 64) {
      EXPECT_NE(a.signs(), c.signs()) << hlabel(d);
      // Both signs occur (a fair coin per channel: 64 equal draws has probability 2^-63).
      EXPECT_NE(std::count(a.signs().begin(), a.signs().end(), 1.0f), d) << hlabel(d);
    }
    EXPECT_TRUE(a.left().empty() && a.right().empty());
    EXPECT_EQ(a.num_blocks(), 0);
    EXPECT_EQ(a.kernel_qL(), a.signs().data());
    EXPECT_EQ(a.kernel_qR(), nullptr);
    // A longer head extends a shorter one with the same seed (one generator output per sign, in order).
    const Rotation longer(2 * d, RotationKind::kHadamard, 11);
    EXPECT_TRUE(std::equal(a.signs().begin(), a.signs().end(), longer.signs().begin())) << hlabel(d);
  }
}

// Pins the sign generator: s[i] = −1 iff the top bit of the i-th xoshiro256** output (seed 0) is set. The outputs'
// top bits were computed by an independent implementation of the documented generator (Python integers).
TEST(RotationHadamard, GeneratorIsPinned) {
  const Rotation rot(16, RotationKind::kHadamard, 0);
  const float want[16] = {-1.0f, -1.0f, 1.0f, 1.0f, -1.0f, -1.0f, 1.0f, -1.0f, -1.0f, -1.0f, 1.0f, 1.0f, 1.0f, -1.0f, 1.0f, 1.0f};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(rot.signs()[static_cast<size_t>(i)], want[i]) << i;
}

TEST(RotationHadamard, PreservesNormsAndInverseUndoesApply) {
  auto rng = test::make_rng(21);
  for (int64_t d : kHadamardDims) {
    const Rotation rot(d, RotationKind::kHadamard, rng());
    const int64_t rows = 7;
    std::vector<float> v = test::randn_with_outlier_channels(rng, static_cast<size_t>(rows), static_cast<size_t>(d),
                                                             30.0f, d >= 8 ? 3 : 1);
    std::vector<float> w = v;
    rot.apply(w.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* a = &v[static_cast<size_t>(r * d)];
      const float* b = &w[static_cast<size_t>(r * d)];
      const double n0 = std::sqrt(dot(a, a, d)), n1 = std::sqrt(dot(b, b, d));
      // log2(D) butterfly stages and one multiply, each rounding by ≤ 2^-24 relative: well under 1e-5 for D ≤ 512.
      EXPECT_NEAR(n1, n0, 1e-5 * n0) << hlabel(d) << " row " << r;
    }
    std::vector<float> back = w;
    rot.apply_inverse(back.data(), rows);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < v.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(back[i]) - v[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(v[i])));
    }
    // Each output is a float32 sum of D terms of size ≤ max|v|/√D, then a second such sum: error ≲ 2·log2(D)·ε·max|v|.
    EXPECT_LE(worst, 2e-6 * scale * std::max<double>(1.0, std::log2(static_cast<double>(d)))) << hlabel(d);
    // And R R⁻¹ = I.
    back = v;
    rot.apply_inverse(back.data(), rows);
    rot.apply(back.data(), rows);
    double worst2 = 0.0;
    for (size_t i = 0; i < v.size(); ++i) worst2 = std::max(worst2, std::fabs(static_cast<double>(back[i]) - v[i]));
    EXPECT_LE(worst2, 2e-6 * scale * std::max<double>(1.0, std::log2(static_cast<double>(d)))) << hlabel(d);
    // Not the identity, and it spreads: an outlier channel's energy ends up on every channel.
    if (d >= 16) {
      std::vector<float> e(static_cast<size_t>(d), 0.0f);
      e[3] = 1.0f;
      rot.apply(e.data(), 1);
      for (float x : e) EXPECT_NEAR(std::fabs(x), 1.0 / std::sqrt(static_cast<double>(d)), 1e-7) << hlabel(d);
      EXPECT_EQ(d & (d - 1), 0);  // (the list holds powers of two: one block over the whole head)
    }
  }
}

TEST(RotationHadamard, DenseMatrixIsOrthogonalAndMatchesTheTransform) {
  auto rng = test::make_rng(22);
  for (int64_t d : kHadamardDims) {
    if (d > 256) continue;  // the O(D³) check of MᵀM; 512 is covered by the other tests
    const Rotation rot(d, RotationKind::kHadamard, rng());
    const std::vector<double> m = rot.dense_matrix();
    ASSERT_EQ(m.size(), static_cast<size_t>(d * d));
    double worst = 0.0;
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) {
        double s = 0.0;  // (Mᵀ M)[i, j]
        for (int64_t k = 0; k < d; ++k) s += m[static_cast<size_t>(k * d + i)] * m[static_cast<size_t>(k * d + j)];
        worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LT(worst, 1e-12) << hlabel(d);
    // The explicit matrix: H[i][j] = (−1)^popcount(i & j), built here by Sylvester's recursion, times diag(s)/√D.
    std::vector<double> h(static_cast<size_t>(d * d));
    h[0] = 1.0;
    for (int64_t n = 1; n < d; n *= 2)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const double x = h[static_cast<size_t>(i * d + j)];
          h[static_cast<size_t>(i * d + j + n)] = x;
          h[static_cast<size_t>((i + n) * d + j)] = x;
          h[static_cast<size_t>((i + n) * d + j + n)] = -x;
        }
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j)
        ASSERT_EQ(m[static_cast<size_t>(i * d + j)],
                  h[static_cast<size_t>(i * d + j)] * rot.signs()[static_cast<size_t>(j)] /
                      std::sqrt(static_cast<double>(d)))
            << hlabel(d) << " (" << i << ", " << j << ")";
    // The fast transform equals M·v (in double) within float32 rounding, forward and inverse (Mᵀ·v).
    const int64_t rows = 3;
    std::vector<float> v = test::randn(rng, static_cast<size_t>(rows * d), 2.0f);
    std::vector<float> fwd = v, inv = v;
    rot.apply(fwd.data(), rows);
    rot.apply_inverse(inv.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = &v[static_cast<size_t>(r * d)];
      const double norm = std::sqrt(dot(x, x, d));
      for (int64_t i = 0; i < d; ++i) {
        double want = 0.0, want_t = 0.0;
        for (int64_t j = 0; j < d; ++j) {
          want += m[static_cast<size_t>(i * d + j)] * x[j];
          want_t += m[static_cast<size_t>(j * d + i)] * x[j];
        }
        EXPECT_NEAR(fwd[static_cast<size_t>(r * d + i)], want, 1e-6 * norm) << hlabel(d) << " row " << r << " i " << i;
        EXPECT_NEAR(inv[static_cast<size_t>(r * d + i)], want_t, 1e-6 * norm) << hlabel(d) << " inverse row " << r;
      }
    }
  }
}

TEST(RotationHadamard, DotProductsUnchangedWhenBothRotated) {
  auto rng = test::make_rng(23);
  for (int64_t d : {int64_t{64}, int64_t{128}, int64_t{256}}) {
    const Rotation rot(d, RotationKind::kHadamard, rng());
    for (int trial = 0; trial < 5; ++trial) {
      std::vector<float> q = test::randn(rng, static_cast<size_t>(d));
      std::vector<float> k = test::randn_with_outlier_channels(rng, 1, static_cast<size_t>(d), 20.0f, 2);
      const double before = dot(q.data(), k.data(), d);
      rot.apply(q.data(), 1);
      rot.apply(k.data(), 1);
      const double scale = std::sqrt(dot(q.data(), q.data(), d) * dot(k.data(), k.data(), d));
      EXPECT_NEAR(dot(q.data(), k.data(), d), before, 4e-6 * scale) << hlabel(d);
    }
  }
}

// Head dims that are not powers of two: blocks of their largest power-of-two divisor (96 → 3 × 32, 80 → 5 × 16),
// each block its own Hadamard transform with its part of the signs; nothing crosses a block boundary.
TEST(RotationHadamard, OtherHeadDimsUseBlocksOfTheirLargestPowerOfTwoDivisor) {
  auto rng = test::make_rng(24);
  const std::pair<int64_t, int64_t> dims_and_blocks[] = {{96, 32}, {80, 16}, {160, 32}, {12, 4}, {6, 2}, {3, 1}};
  for (auto [d, p] : dims_and_blocks) {
    const Rotation rot(d, RotationKind::kHadamard, rng());
    std::vector<float> v = test::randn(rng, static_cast<size_t>(d)), w = v;
    rot.apply(w.data(), 1);
    for (int64_t b = 0; b < d; b += p) {
      // The block alone through a P-dim rotation with the same signs gives the same values.
      std::vector<float> block(v.begin() + b, v.begin() + b + p);
      const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p)));
      for (int64_t i = 0; i < p; ++i) block[static_cast<size_t>(i)] *= rot.signs()[static_cast<size_t>(b + i)] * c;
      for (int64_t h = 1; h < p; h *= 2)
        for (int64_t i = 0; i < p; i += 2 * h)
          for (int64_t j = i; j < i + h; ++j) {
            const float x = block[static_cast<size_t>(j)], y = block[static_cast<size_t>(j + h)];
            block[static_cast<size_t>(j)] = x + y;
            block[static_cast<size_t>(j + h)] = x - y;
          }
      for (int64_t i = 0; i < p; ++i)
        ASSERT_EQ(w[static_cast<size_t>(b + i)], block[static_cast<size_t>(i)]) << hlabel(d) << " block " << b;
    }
    const std::vector<double> m = rot.dense_matrix();
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j)
        if (i / p != j / p) {
          ASSERT_EQ(m[static_cast<size_t>(i * d + j)], 0.0) << hlabel(d);
        }
  }
}

TEST(RotationHadamard, RejectsBadHeadDimAndKind) {
  for (int64_t d : {int64_t{0}, int64_t{-64}}) {
    try {
      const Rotation rot(d, RotationKind::kHadamard, 0);
      ADD_FAILURE() << "expected an error for " << d;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("[rotation] head_dim must be positive; got " + std::to_string(d)),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_THROW(Rotation(64, static_cast<RotationKind>(4), 0), Error);
  EXPECT_STREQ(rotation_kind_name(RotationKind::kHadamard), "hadamard");
  EXPECT_EQ(static_cast<int>(RotationKind::kHadamard), 3);  // the kernels' and the CUDA backend's int
}

}  // namespace
}  // namespace cider
