// cider/nn/rotation.h — SO(4) block rotations of attention heads (IsoQuant-style decorrelation before quantizing).
//
// A head vector of head_dim values is split into head_dim/4 consecutive 4-vectors. Block b is read as the quaternion
// v = (v0, v1, v2, v3) = (w, x, y, z) and rotated by two fixed unit quaternions qL[b], qR[b]:
//   kSO4Full:  v -> qL · v · conj(qR)      (any rotation of R^4: the full SO(4))
//   kSO4Fast:  v -> qL · v                 (a left isoclinic rotation: half the work)
//   kNone:     identity
// Products are Hamilton products, applied in closed form (16 multiply-adds each) — never a dense d×d matrix, so a
// SIMD/CUDA kernel does 16 or 32 FMAs per 4 values in registers. The rotation is orthogonal, so rotating both
// queries and keys leaves q·k unchanged; values rotated on write are rotated back on the attention output.
//
// Convention: this is the column form w = M·v. The Python seed applies x @ M (row vectors), i.e. Mᵀ; both are
// rotations, but they are different ones for the same quaternions (see docs/kv_cache.md).
//
// Quaternion generator (reproducible from the seed alone, see docs/kv_cache.md):
//   state:    xoshiro256** whose four 64-bit state words are four successive outputs of SplitMix64 started at `seed`.
//   uniform:  u = (next() >> 11) · 2^-53  in [0, 1).
//   normal:   Box–Muller in double on a pair (u1, u2) of consecutive uniforms:
//             r = sqrt(-2 ln(1 - u1)), z0 = r·cos(2π u2), z1 = r·sin(2π u2); both z0 then z1 are used.
//   block b = 0, 1, …: qL = four normals (w, x, y, z), then qR = the next four; each divided by its Euclidean norm in
//             double (a zero vector — probability ~2^-106 — is drawn again), then rounded to float32.
//   qR is drawn for every kind, so kSO4Fast uses the same qL as kSO4Full for the same seed.
#pragma once

#include <cstdint>
#include <vector>

namespace cider::nn {

enum class RotationKind : int { kNone = 0, kSO4Fast = 1, kSO4Full = 2 };

const char* rotation_kind_name(RotationKind kind);  // "none", "so4_fast", "so4_full"

class SO4Rotation {
 public:
  // The identity on vectors of length 0 (placeholder for a cache that has not seen its dimensions yet).
  SO4Rotation() = default;
  // head_dim must be positive; a multiple of 4 unless kind is kNone. Throws cider::Error otherwise.
  SO4Rotation(int64_t head_dim, RotationKind kind, uint64_t seed);

  int64_t head_dim() const { return head_dim_; }
  RotationKind kind() const { return kind_; }
  uint64_t seed() const { return seed_; }
  int64_t num_blocks() const { return kind_ == RotationKind::kNone ? 0 : head_dim_ / 4; }
  bool is_identity() const { return kind_ == RotationKind::kNone; }

  // The quaternions, [num_blocks, 4] as (w, x, y, z), float32 unit vectors (up to float32 rounding).
  const std::vector<float>& left() const { return qL_; }
  const std::vector<float>& right() const { return qR_; }

  // In place on n_rows contiguous rows of head_dim float32 values: rows = [n_rows, head_dim].
  void apply(float* rows, int64_t n_rows) const;
  // The exact inverse (the transpose): conj(qL)·w·qR, resp. conj(qL)·w.
  void apply_inverse(float* rows, int64_t n_rows) const;

  // The rotation as a dense [head_dim, head_dim] row-major matrix M (computed in double from the float32
  // quaternions) with rotated = M · v. For tests and documentation only.
  std::vector<double> dense_matrix() const;

  friend bool operator==(const SO4Rotation& a, const SO4Rotation& b) {
    return a.head_dim_ == b.head_dim_ && a.kind_ == b.kind_ && a.seed_ == b.seed_;
  }

 private:
  int64_t head_dim_ = 0;
  RotationKind kind_ = RotationKind::kNone;
  uint64_t seed_ = 0;
  std::vector<float> qL_;  // [num_blocks, 4]
  std::vector<float> qR_;  // [num_blocks, 4]
};

}  // namespace cider::nn
