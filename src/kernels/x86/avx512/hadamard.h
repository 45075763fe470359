// The randomized Hadamard rotation of one row on 16-lane vectors (nn/rotation.h kind 3), bit-identical to
// kernels::ref::hadamard_row: the same multiplies x·(s·c) and the same butterfly adds/subtracts in the same order
// per element — a stage's pairs are independent, so doing them 16 at a time changes no result. Stages h = 1, 2, 4, 8
// pair lanes of one vector (a permute, then the sum in the lower lane, the difference in the upper); h ≥ 16 pair
// vectors. Compiled with the avx512 flags only (`static inline`, one private copy per file: x86_kernels.h's rule);
// used by kv_append_avx512.cpp and hadamard_rows_avx512.cpp.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels::x86::avx512 {

#define CIDER_HADAMARD_AVX512 static inline __attribute__((always_inline, target("avx512f,avx512dq,avx2,fma")))

// One butterfly stage inside a vector: p holds each lane's partner x[j ^ h]; lanes in `upper` (j & h set) get
// x[j − h] − x[j] = p − v, the others x[j] + x[j + h] = v + p — the reference's a − b and a + b.
CIDER_HADAMARD_AVX512 __m512 hadamard_butterfly16(__m512 v, __m512 p, __mmask16 upper) {
  return _mm512_mask_blend_ps(upper, _mm512_add_ps(v, p), _mm512_sub_ps(p, v));
}

// The stages h = 1 … 8 of the 16 values of a vector.
CIDER_HADAMARD_AVX512 __m512 hadamard_in_vector(__m512 v) {
  v = hadamard_butterfly16(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);        // h = 1: lanes 1,0,3,2 in each 128 bits
  v = hadamard_butterfly16(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);        // h = 2: lanes 2,3,0,1
  v = hadamard_butterfly16(v, _mm512_shuffle_f32x4(v, v, 0xB1), 0xF0F0);  // h = 4: 128-bit lanes 1,0,3,2
  return hadamard_butterfly16(v, _mm512_shuffle_f32x4(v, v, 0x4E), 0xFF00);  // h = 8: 128-bit lanes 2,3,0,1
}

// row[0, D) in place: forward H·diag(s)·row/√P, inverse diag(s)·H·row/√P, blocks of P = ref::hadamard_block(D)
// (blocks shorter than a vector take the reference).
CIDER_HADAMARD_AVX512 void hadamard_row(const float* signs, int64_t D, float* row, bool inverse) {
  const int64_t P = D & -D;  // ref::hadamard_block, computed here (x86_kernels.h: no shared inline helpers)
  if (P < 16) {
    ref::hadamard_row(row, signs, D, inverse);
    return;
  }
  const __m512 c = _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(static_cast<double>(P))));
  for (int64_t d = 0; d < D; d += 16) {
    __m512 v = _mm512_loadu_ps(row + d);
    if (!inverse) v = _mm512_mul_ps(v, _mm512_mul_ps(_mm512_loadu_ps(signs + d), c));
    _mm512_storeu_ps(row + d, hadamard_in_vector(v));
  }
  for (int64_t h = 16; h < P; h *= 2)
    for (int64_t i = 0; i < D; i += 2 * h)  // blocks of 2h tile the blocks of P
      for (int64_t j = i; j < i + h; j += 16) {
        const __m512 a = _mm512_loadu_ps(row + j), b = _mm512_loadu_ps(row + j + h);
        _mm512_storeu_ps(row + j, _mm512_add_ps(a, b));
        _mm512_storeu_ps(row + j + h, _mm512_sub_ps(a, b));
      }
  if (inverse)
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(row + d, _mm512_mul_ps(_mm512_loadu_ps(row + d), _mm512_mul_ps(_mm512_loadu_ps(signs + d), c)));
}

#undef CIDER_HADAMARD_AVX512

}  // namespace cider::kernels::x86::avx512
