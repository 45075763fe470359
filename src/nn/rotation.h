// cider/nn/rotation.h — rotations of attention heads before quantizing the KV cache: SO(4) block rotations
// (IsoQuant-style decorrelation) and a whole-head randomized Hadamard transform.
//
// SO(4): a head vector of head_dim values is split into head_dim/4 consecutive 4-vectors. Block b is read as the
// quaternion v = (v0, v1, v2, v3) = (w, x, y, z) and rotated by two fixed unit quaternions qL[b], qR[b]:
//   kSO4Full:  v -> qL · v · conj(qR)      (any rotation of R^4: the full SO(4))
//   kSO4Fast:  v -> qL · v                 (a left isoclinic rotation: half the work)
//   kNone:     identity
// Products are Hamilton products, applied in closed form (16 multiply-adds each) — never a dense d×d matrix, so a
// SIMD/CUDA kernel does 16 or 32 FMAs per 4 values in registers. The rotation is orthogonal, so rotating both
// queries and keys leaves q·k unchanged; values rotated on write are rotated back on the attention output.
//
// Hadamard (kHadamard): x -> H·diag(s)·x / √P over blocks of P = the largest power of two dividing D = head_dim —
// the whole head when D is a power of two (64, 128, 256: every model measured), else e.g. 3 blocks of 32 for D = 96,
// 5 of 16 for D = 80. H is the P×P Sylvester–Walsh–Hadamard matrix H[i][j] = (−1)^popcount(i & j), s = D random
// signs ±1. In float32, in this order (kernels must match it bit for bit, and do: tests/test_attention_x86.cpp):
//   1. x[i] ← x[i] · (s[i] · c), c = float32(1/√P)   (s[i]·c is exact; one rounded multiply per value)
//   2. in each block, the fast Walsh–Hadamard transform, stages h = 1, 2, 4, …, P/2; in stage h, for every j with
//      (j & h) == 0: (x[j], x[j+h]) ← (x[j] + x[j+h], x[j] − x[j+h])   — adds and subtracts only, nothing to fuse.
//   The inverse is the transpose diag(s)·H/√P: the same transform (step 2) first, then step 1.
// It spreads an outlier channel over all D channels (SO(4) only over 4), which is what keys with outlier channels
// (Gemma 3's k_norm gains) need; docs/quality.md measures both.
//
// Convention: this is the column form w = M·v. The Python seed applies x @ M (row vectors), i.e. Mᵀ; both are
// rotations, but they are different ones for the same quaternions (see docs/kv_cache.md).
//
// Generator (reproducible from the seed alone, see docs/kv_cache.md):
//   state:    xoshiro256** whose four 64-bit state words are four successive outputs of SplitMix64 started at `seed`.
//   uniform:  u = (next() >> 11) · 2^-53  in [0, 1).
//   normal:   Box–Muller in double on a pair (u1, u2) of consecutive uniforms:
//             r = sqrt(-2 ln(1 - u1)), z0 = r·cos(2π u2), z1 = r·sin(2π u2); both z0 then z1 are used.
//   SO(4), block b = 0, 1, …: qL = four normals (w, x, y, z), then qR = the next four; each divided by its Euclidean
//             norm in double (a zero vector — probability ~2^-106 — is drawn again), then rounded to float32.
//             qR is drawn for every kind, so kSO4Fast uses the same qL as kSO4Full for the same seed.
//   Hadamard, i = 0 … D−1: s[i] = −1 if the top bit of next() is set, else +1 (one output per sign).
// A cache gives keys and values the same seed (nn/kv_cache.h), so with Dk == Dv they get the same rotation — for
// SO(4) the same quaternions, for Hadamard the same signs; independence between keys and values buys nothing
// (they are quantized separately and never mixed before the output is rotated back).
#pragma once

#include <cstdint>
#include <vector>

namespace cider::nn {

// The values are the kernels' `rotation` ints (kernels::KVAppendArgs, the CUDA launchers).
enum class RotationKind : int { kNone = 0, kSO4Fast = 1, kSO4Full = 2, kHadamard = 3 };

const char* rotation_kind_name(RotationKind kind);  // "none", "so4_fast", "so4_full", "hadamard"
bool is_rotation_kind(RotationKind kind);            // one of the four values above

class Rotation {
 public:
  // The identity on vectors of length 0 (placeholder for a cache that has not seen its dimensions yet).
  Rotation() = default;
  // head_dim must be positive, and a multiple of 4 for the SO(4) kinds. Throws cider::Error otherwise
  // (check_head_dim says the same without building the rotation).
  Rotation(int64_t head_dim, RotationKind kind, uint64_t seed);
  static void check_head_dim(int64_t head_dim, RotationKind kind, const char* op);

  int64_t head_dim() const { return head_dim_; }
  RotationKind kind() const { return kind_; }
  uint64_t seed() const { return seed_; }
  // SO(4) kinds: head_dim/4 quaternion blocks; 0 for kNone and kHadamard.
  int64_t num_blocks() const { return is_so4() ? head_dim_ / 4 : 0; }
  bool is_so4() const { return kind_ == RotationKind::kSO4Fast || kind_ == RotationKind::kSO4Full; }
  bool is_identity() const { return kind_ == RotationKind::kNone; }

  // The quaternions, [num_blocks, 4] as (w, x, y, z), float32 unit vectors (up to float32 rounding).
  const std::vector<float>& left() const { return qL_; }
  const std::vector<float>& right() const { return qR_; }
  // kHadamard: the signs s, [head_dim] float32 values ±1 (empty for the other kinds).
  const std::vector<float>& signs() const { return signs_; }
  // What the kernels take (kernels::KVAppendArgs qL/qR): SO(4) the quaternions, Hadamard the signs as qL and no
  // qR, none two nulls.
  const float* kernel_qL() const;
  const float* kernel_qR() const;

  // In place on n_rows contiguous rows of head_dim float32 values: rows = [n_rows, head_dim].
  void apply(float* rows, int64_t n_rows) const;
  // The inverse (the transpose): conj(qL)·w·qR, resp. conj(qL)·w; diag(s)·H·w/√D. Exact up to float32 rounding.
  void apply_inverse(float* rows, int64_t n_rows) const;

  // The rotation as a dense [head_dim, head_dim] row-major matrix M (computed in double from the float32
  // quaternions, resp. from the signs and 1/√P) with rotated = M · v. For tests and documentation only.
  std::vector<double> dense_matrix() const;

  friend bool operator==(const Rotation& a, const Rotation& b) {
    return a.head_dim_ == b.head_dim_ && a.kind_ == b.kind_ && a.seed_ == b.seed_;
  }

 private:
  int64_t head_dim_ = 0;
  RotationKind kind_ = RotationKind::kNone;
  uint64_t seed_ = 0;
  std::vector<float> qL_;  // [num_blocks, 4]
  std::vector<float> qR_;  // [num_blocks, 4]
  std::vector<float> signs_;  // kHadamard: [head_dim]
};

// The name from before the Hadamard kind (every rotation of the cache is a Rotation).
using SO4Rotation = Rotation;

}  // namespace cider::nn
