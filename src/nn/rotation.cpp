// Rotations of the KV cache: the seeded generator, the SO(4) closed-form Hamilton products and the randomized
// Hadamard transform (whose arithmetic lives in kernels/ref so the cache and the reference kernel share it).
#include "nn/rotation.h"

#include <cmath>

#include "core/error.h"
#include "kernels/kernel_table.h"
#include "kernels/ref/ref_kernels.h"

namespace cider::nn {

const char* rotation_kind_name(RotationKind kind) {
  switch (kind) {
    case RotationKind::kNone: return "none";
    case RotationKind::kSO4Fast: return "so4_fast";
    case RotationKind::kSO4Full: return "so4_full";
    case RotationKind::kHadamard: return "hadamard";
  }
  return "unknown";
}

bool is_rotation_kind(RotationKind kind) {
  return kind == RotationKind::kNone || kind == RotationKind::kSO4Fast || kind == RotationKind::kSO4Full ||
         kind == RotationKind::kHadamard;
}

namespace {

// SplitMix64 (Steele, Lea, Flood 2014): used only to expand the 64-bit seed into xoshiro's 256-bit state.
uint64_t splitmix64_next(uint64_t& x) {
  x += 0x9e3779b97f4a7c15ull;
  uint64_t z = x;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** 1.0 (Blackman, Vigna 2018).
class Xoshiro256ss {
 public:
  explicit Xoshiro256ss(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& w : s_) w = splitmix64_next(sm);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5u, 7) * 9u;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // 53 random bits as a double in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

constexpr double kTwoPi = 6.283185307179586476925286766559;

// Box–Muller on two consecutive uniforms; 1 - u1 lies in (0, 1], so the logarithm is finite.
void normal_pair(Xoshiro256ss& rng, double* z0, double* z1) {
  const double u1 = rng.uniform();
  const double u2 = rng.uniform();
  const double r = std::sqrt(-2.0 * std::log(1.0 - u1));
  *z0 = r * std::cos(kTwoPi * u2);
  *z1 = r * std::sin(kTwoPi * u2);
}

// A uniformly distributed unit quaternion: four standard normals normalised in double, rounded to float32.
void random_unit_quaternion(Xoshiro256ss& rng, float* q) {
  for (;;) {
    double v[4];
    normal_pair(rng, &v[0], &v[1]);
    normal_pair(rng, &v[2], &v[3]);
    const double norm = std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2] + v[3] * v[3]);
    if (norm == 0.0) continue;
    for (int i = 0; i < 4; ++i) q[i] = static_cast<float>(v[i] / norm);
    return;
  }
}

// Hamilton product out = p·q of quaternions (w, x, y, z): 16 multiplies, 12 adds. out may alias neither input.
inline void qmul(const float* p, const float* q, float* out) {
  out[0] = p[0] * q[0] - p[1] * q[1] - p[2] * q[2] - p[3] * q[3];
  out[1] = p[0] * q[1] + p[1] * q[0] + p[2] * q[3] - p[3] * q[2];
  out[2] = p[0] * q[2] - p[1] * q[3] + p[2] * q[0] + p[3] * q[1];
  out[3] = p[0] * q[3] + p[1] * q[2] - p[2] * q[1] + p[3] * q[0];
}

inline void qconj(const float* q, float* out) {
  out[0] = q[0];
  out[1] = -q[1];
  out[2] = -q[2];
  out[3] = -q[3];
}

}  // namespace

void Rotation::check_head_dim(int64_t head_dim, RotationKind kind, const char* op) {
  check(is_rotation_kind(kind), ErrorCode::kInvalidArgument, op,
        "rotation kind must be none, so4_fast, so4_full or hadamard; got ", static_cast<int>(kind));
  check(head_dim > 0, ErrorCode::kInvalidArgument, op, "head_dim must be positive; got ", head_dim);
  if (kind == RotationKind::kSO4Fast || kind == RotationKind::kSO4Full)
    check(head_dim % 4 == 0, ErrorCode::kInvalidArgument, op, "head_dim must be a multiple of 4 (4-d blocks) for the ",
          rotation_kind_name(kind), " rotation; got ", head_dim);
}

Rotation::Rotation(int64_t head_dim, RotationKind kind, uint64_t seed) : head_dim_(head_dim), kind_(kind), seed_(seed) {
  check_head_dim(head_dim, kind, "rotation");
  if (kind == RotationKind::kNone) return;
  Xoshiro256ss rng(seed);
  if (kind == RotationKind::kHadamard) {
    signs_.resize(static_cast<size_t>(head_dim));
    for (float& s : signs_) s = (rng.next() >> 63) ? -1.0f : 1.0f;
    return;
  }
  const int64_t blocks = head_dim / 4;
  qL_.resize(static_cast<size_t>(blocks * 4));
  qR_.resize(static_cast<size_t>(blocks * 4));
  for (int64_t b = 0; b < blocks; ++b) {
    random_unit_quaternion(rng, &qL_[static_cast<size_t>(b * 4)]);
    random_unit_quaternion(rng, &qR_[static_cast<size_t>(b * 4)]);
  }
}

const float* Rotation::kernel_qL() const {
  if (kind_ == RotationKind::kHadamard) return signs_.data();
  return is_so4() ? qL_.data() : nullptr;
}

const float* Rotation::kernel_qR() const { return is_so4() ? qR_.data() : nullptr; }

void Rotation::apply(float* rows, int64_t n_rows) const {
  if (kind_ == RotationKind::kNone) return;
  if (kind_ == RotationKind::kHadamard) {
    kernels::active_kernels().hadamard_rows({rows, n_rows, head_dim_, signs_.data(), false});
    return;
  }
  const int64_t blocks = head_dim_ / 4;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      float* v = rows + r * head_dim_ + b * 4;
      const float* l = &qL_[static_cast<size_t>(b * 4)];
      float t[4];
      qmul(l, v, t);  // qL·v
      if (kind_ == RotationKind::kSO4Full) {
        float rc[4];
        qconj(&qR_[static_cast<size_t>(b * 4)], rc);
        qmul(t, rc, v);  // (qL·v)·conj(qR)
      } else {
        for (int i = 0; i < 4; ++i) v[i] = t[i];
      }
    }
  }
}

void Rotation::apply_inverse(float* rows, int64_t n_rows) const {
  if (kind_ == RotationKind::kNone) return;
  if (kind_ == RotationKind::kHadamard) {
    kernels::active_kernels().hadamard_rows({rows, n_rows, head_dim_, signs_.data(), true});
    return;
  }
  const int64_t blocks = head_dim_ / 4;
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      float* w = rows + r * head_dim_ + b * 4;
      float lc[4];
      qconj(&qL_[static_cast<size_t>(b * 4)], lc);
      float t[4];
      qmul(lc, w, t);  // conj(qL)·w
      if (kind_ == RotationKind::kSO4Full) {
        qmul(t, &qR_[static_cast<size_t>(b * 4)], w);  // (conj(qL)·w)·qR
      } else {
        for (int i = 0; i < 4; ++i) w[i] = t[i];
      }
    }
  }
}

std::vector<double> Rotation::dense_matrix() const {
  const int64_t d = head_dim_;
  std::vector<double> m(static_cast<size_t>(d * d), 0.0);
  auto at = [&](int64_t i, int64_t j) -> double& { return m[static_cast<size_t>(i * d + j)]; };
  if (kind_ == RotationKind::kNone) {
    for (int64_t i = 0; i < d; ++i) at(i, i) = 1.0;
    return m;
  }
  if (kind_ == RotationKind::kHadamard) {
    // Block-diagonal, blocks of P: M[i][j] = (−1)^popcount(i & j) · s[j] / √P when i and j are in the same block
    // (Sylvester's H times diag(s); within a block i & j sees only the in-block bits, as i, j ≡ i mod P, j mod P).
    const int64_t P = kernels::ref::hadamard_block(d);
    const double c = 1.0 / std::sqrt(static_cast<double>(P));
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = i / P * P; j < i / P * P + P; ++j)
        at(i, j) = (__builtin_popcountll(static_cast<unsigned long long>(i & j & (P - 1))) & 1 ? -c : c) *
                   signs_[static_cast<size_t>(j)];
    return m;
  }
  for (int64_t b = 0; b < d / 4; ++b) {
    const float* l = &qL_[static_cast<size_t>(b * 4)];
    const float* r = &qR_[static_cast<size_t>(b * 4)];
    const double w = l[0], x = l[1], y = l[2], z = l[3];
    // Left multiplication by qL: (qL·v) = Lm v.
    const double Lm[4][4] = {{w, -x, -y, -z}, {x, w, -z, y}, {y, z, w, -x}, {z, -y, x, w}};
    // Right multiplication by conj(qR): (v·conj(qR)) = Rm v; the identity for kSO4Fast.
    double Rm[4][4] = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}};
    if (kind_ == RotationKind::kSO4Full) {
      const double a = r[0], bx = r[1], c = r[2], e = r[3];
      const double full[4][4] = {{a, bx, c, e}, {-bx, a, -e, c}, {-c, e, a, -bx}, {-e, -c, bx, a}};
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) Rm[i][j] = full[i][j];
    }
    // The two multiplications commute (associativity), so M = Lm·Rm.
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        double s = 0.0;
        for (int k = 0; k < 4; ++k) s += Lm[i][k] * Rm[k][j];
        at(b * 4 + i, b * 4 + j) = s;
      }
  }
  return m;
}

}  // namespace cider::nn
