// The randomized Hadamard rotation of one row on 8-lane vectors (nn/rotation.h kind 3), bit-identical to
// kernels::ref::hadamard_row: the same multiplies x·(s·c) and the same butterfly adds/subtracts in the same order
// per element — a stage's pairs are independent, so doing them 8 at a time changes no result. Stages h = 1, 2, 4
// pair lanes of one vector (a permute, then the sum in the lower lane, the difference in the upper); h ≥ 8 pair
// vectors. Compiled with the avx2 flags only (`static inline`, one private copy per file: x86_kernels.h's rule);
// used by kv_append_avx2.cpp and hadamard_rows_avx2.cpp.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx2 {

#define CIDER_HADAMARD_AVX2 static inline __attribute__((always_inline, target("avx2,fma")))

// One butterfly stage inside a vector: p holds each lane's partner x[j ^ h]; lanes set in `upper` (j & h) get
// p − v = x[j − h] − x[j], the others v + p = x[j] + x[j + h] — the reference's a − b and a + b.
template <int upper>
CIDER_HADAMARD_AVX2 __m256 hadamard_butterfly8(__m256 v, __m256 p) {
  return _mm256_blend_ps(_mm256_add_ps(v, p), _mm256_sub_ps(p, v), upper);
}

// The stages h = 1, 2, 4 of the 8 values of a vector.
CIDER_HADAMARD_AVX2 __m256 hadamard_in_vector(__m256 v) {
  v = hadamard_butterfly8<0xAA>(v, _mm256_permute_ps(v, 0xB1));          // h = 1: lanes 1,0,3,2 in each 128 bits
  v = hadamard_butterfly8<0xCC>(v, _mm256_permute_ps(v, 0x4E));          // h = 2: lanes 2,3,0,1
  return hadamard_butterfly8<0xF0>(v, _mm256_permute2f128_ps(v, v, 0x01));  // h = 4: the two halves swapped
}

// row[0, D) in place: forward H·diag(s)·row/√P, inverse diag(s)·H·row/√P, blocks of P = ref::hadamard_block(D)
// (blocks shorter than a vector take the reference).
CIDER_HADAMARD_AVX2 void hadamard_row(const float* signs, int64_t D, float* row, bool inverse) {
  const int64_t P = D & -D;  // ref::hadamard_block, computed here (x86_kernels.h: no shared inline helpers)
  if (P < 8) {
    ref::hadamard_row(row, signs, D, inverse);
    return;
  }
  const __m256 c = _mm256_set1_ps(static_cast<float>(1.0 / std::sqrt(static_cast<double>(P))));
  for (int64_t d = 0; d < D; d += 8) {
    __m256 v = _mm256_loadu_ps(row + d);
    if (!inverse) v = _mm256_mul_ps(v, _mm256_mul_ps(_mm256_loadu_ps(signs + d), c));
    _mm256_storeu_ps(row + d, hadamard_in_vector(v));
  }
  for (int64_t h = 8; h < P; h *= 2)
    for (int64_t i = 0; i < D; i += 2 * h)  // blocks of 2h tile the blocks of P
      for (int64_t j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(row + j), b = _mm256_loadu_ps(row + j + h);
        _mm256_storeu_ps(row + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(row + j + h, _mm256_sub_ps(a, b));
      }
  if (inverse)
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(row + d, _mm256_mul_ps(_mm256_loadu_ps(row + d), _mm256_mul_ps(_mm256_loadu_ps(signs + d), c)));
}

#undef CIDER_HADAMARD_AVX2

}  // namespace cider::kernels::x86::avx2
