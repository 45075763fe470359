// Reference rotate + quantize + append of KV rows. See KVAppendArgs in kernels/kernel_table.h.
//
// Row by row: read as float32, rotate — each 4-d block with the Hamilton products of nn/rotation.cpp (same
// multiplies, same order of additions, no fused multiply-add: the build uses -ffp-contract=off), or the whole row
// with the randomized Hadamard transform (hadamard_row below) — then quant::affine_quantize_row (quantized; or
// quant::symmetric_quantize_row for symmetric codes) or round
// to the storage dtype (plain). This is exactly the arithmetic the KV cache used before the append became a kernel
// entry; tests/test_kv_cache.cpp pins it against Rotation::apply + affine_quantize_row.
#include <cmath>
#include <vector>

#include "kernels/ref/ref_kernels.h"
#include "quant/affine.h"

namespace cider::kernels::ref {

namespace {

// out = p·q (Hamilton product of (w, x, y, z) quaternions), written as nn/rotation.cpp writes it.
inline void qmul(const float* p, const float* q, float* out) {
  out[0] = p[0] * q[0] - p[1] * q[1] - p[2] * q[2] - p[3] * q[3];
  out[1] = p[0] * q[1] + p[1] * q[0] + p[2] * q[3] - p[3] * q[2];
  out[2] = p[0] * q[2] - p[1] * q[3] + p[2] * q[0] + p[3] * q[1];
  out[3] = p[0] * q[3] + p[1] * q[2] - p[2] * q[1] + p[3] * q[0];
}

// The fast Walsh–Hadamard transform, unnormalized: stages h = 1, 2, …, D/2; in each, the pairs (j, j + h) with
// (j & h) == 0 become (sum, difference). Every output is the same sequence of float32 adds whatever order the
// independent pairs of a stage are visited in, which is what lets SIMD kernels match it bit for bit.
void fwht(float* x, int64_t D) {
  for (int64_t h = 1; h < D; h *= 2)
    for (int64_t i = 0; i < D; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

}  // namespace

void hadamard_row(float* x, const float* signs, int64_t D, bool inverse) {
  // Blocks of P = the largest power of two dividing D (D itself when D is a power of two).
  const int64_t P = hadamard_block(D);
  // c = float32(1/√P): exact when P is a power of 4 (16, 64, 256); s[i]·c is exact (a sign flip).
  const float c = static_cast<float>(1.0 / std::sqrt(static_cast<double>(P)));
  if (inverse)
    for (int64_t b = 0; b < D; b += P) fwht(x + b, P);
  for (int64_t i = 0; i < D; ++i) x[i] = x[i] * (signs[i] * c);
  if (!inverse)
    for (int64_t b = 0; b < D; b += P) fwht(x + b, P);
}

void hadamard_rows(const HadamardRowsArgs& a) {
  for (int64_t r = 0; r < a.n; ++r) hadamard_row(a.rows + r * a.dim, a.signs, a.dim, a.inverse);
}

void kv_append(const KVAppendArgs& a) {
  const int64_t D = a.dim;
  std::vector<float> row(static_cast<size_t>(D));
  const int64_t groups = a.bits ? D / a.group_size : 0;
  const int64_t words = a.bits ? quant::packed_words(D, a.bits) : 0;
  const int ss = dtype_size(a.dst_dtype);
  for (int64_t i = 0; i < a.n; ++i) {
    for (int64_t d = 0; d < D; ++d)
      row[static_cast<size_t>(d)] = load_float(a.src, a.src_dtype, i * a.src_row_stride + d * a.src_elem_stride);
    if (a.rotation == 3) {
      hadamard_row(row.data(), a.qL, D, false);  // qL = the signs [D]
    } else if (a.rotation != 0) {
      for (int64_t b = 0; b < D / 4; ++b) {
        float* v = &row[static_cast<size_t>(b * 4)];
        float t[4];
        qmul(a.qL + b * 4, v, t);  // qL·v
        if (a.rotation == 2) {
          const float* r = a.qR + b * 4;
          const float rc[4] = {r[0], -r[1], -r[2], -r[3]};  // conj(qR)
          qmul(t, rc, v);                                    // (qL·v)·conj(qR)
        } else {
          for (int k = 0; k < 4; ++k) v[k] = t[k];
        }
      }
    }
    if (a.bits == 0) {
      for (int64_t d = 0; d < D; ++d) store_float(a.dst, a.dst_dtype, i * D + d, row[static_cast<size_t>(d)]);
    } else if (a.symmetric) {
      quant::symmetric_quantize_row(row.data(), D, a.group_size, a.bits, static_cast<uint32_t*>(a.dst) + i * words,
                                    static_cast<uint8_t*>(a.scales) + i * groups * ss, a.dst_dtype);
    } else {
      quant::affine_quantize_row(row.data(), D, a.group_size, a.bits, static_cast<uint32_t*>(a.dst) + i * words,
                                 static_cast<uint8_t*>(a.scales) + i * groups * ss,
                                 static_cast<uint8_t*>(a.biases) + i * groups * ss, a.dst_dtype);
    }
  }
}

}  // namespace cider::kernels::ref
