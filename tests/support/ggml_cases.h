// Shared helpers of the native GGUF weight tests (tests/test_ggml_linear.cpp, tests/cuda/test_cuda_ggml.cpp): the
// block formats with an integer form, random blocks with realistic float16 scales, and the per-output error bound of
// int8 activations per piece of 32 (kernels::GgmlLinearArgs).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/ggml_blocks.h"

namespace cider::test {

// The block formats the native kernels multiply (quant::GgmlBlockFormat::integer_form).
inline const quant::GgmlType kIntegerTypes[] = {quant::GgmlType::kQ8_0, quant::GgmlType::kQ4_0,
                                                quant::GgmlType::kQ4_1, quant::GgmlType::kQ5_0,
                                                quant::GgmlType::kQ5_1, quant::GgmlType::kQ2_K,
                                                quant::GgmlType::kQ4_K, quant::GgmlType::kQ5_K,
                                                quant::GgmlType::kQ6_K};

inline void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Random bytes with every f16 scale field replaced by a finite value of a realistic size (random bytes would give
// infinities and NaNs, which real files do not hold).
inline std::vector<uint8_t> random_blocks(std::mt19937_64& rng, quant::GgmlType t, int64_t blocks) {
  using quant::GgmlType;
  const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
  std::vector<uint8_t> out(static_cast<size_t>(blocks * f.block_bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> d(0.001f, 0.05f), m(-0.05f, 0.05f);
  for (auto& b : out) b = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = out.data() + i * f.block_bytes;
    switch (t) {
      case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ5_0: put_f16(b, d(rng)); break;
      case GgmlType::kQ4_1: case GgmlType::kQ5_1: put_f16(b, d(rng)); put_f16(b + 2, m(rng)); break;
      case GgmlType::kQ4_K: case GgmlType::kQ5_K: put_f16(b, d(rng) / 16); put_f16(b + 2, d(rng) / 16); break;
      case GgmlType::kQ6_K: put_f16(b + 208, d(rng) / 64); break;
      case GgmlType::kQ2_K: put_f16(b + 80, d(rng) / 8); put_f16(b + 82, d(rng) / 8); break;
      case GgmlType::kQ3_K: put_f16(b + 108, d(rng) / 64); break;
      default: break;
    }
  }
  return out;
}

// The tolerance of one output of an int8-activation kernel against the float64 reference: x_row [K] the activations,
// w_row [K] the weight row as the block decoder gives it, bias_abs |bias[n]| (0 without a bias).
// Int8 activations: each x moves by at most half its piece's step max|x_piece|/127, so the output moves by
// Σ_k |w_k|·step/2; float32 sums of P = K/32 pieces (each a product of a rounded scale and an exact integer dot, plus
// the b term) add (P + order_terms)·2⁻²³·Σ_k |w_k|·(|x_k| + step); the bias is added once (2⁻²³·|bias|).
// order_terms 16 is the CPU kernels' bound. code_slack: how far past half a step a code may land (0 for a code
// rint(x/step) whose quotient is exact; a kernel whose x/step is itself rounded passes its relative error · 127),
// which widens the first term to Σ_k |w_k|·step·(1/2 + code_slack).
inline double int8_piece_bound(const float* x_row, const float* w_row, int64_t K, double bias_abs,
                               double order_terms = 16.0, double code_slack = 0.0) {
  double quant_err = 0.0, mag = 0.0;
  for (int64_t p = 0; p < K / 32; ++p) {
    double amax = 0.0, wsum = 0.0, mag_p = 0.0;
    for (int64_t e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(static_cast<double>(x_row[p * 32 + e])));
    const double step = amax / 127.0;
    for (int64_t e = 0; e < 32; ++e) {
      const double wk = std::fabs(static_cast<double>(w_row[p * 32 + e]));
      wsum += wk;
      mag_p += wk * (std::fabs(static_cast<double>(x_row[p * 32 + e])) + step);
    }
    quant_err += code_slack == 0.0 ? wsum * step / 2.0 : wsum * step * (0.5 + code_slack);
    mag += mag_p;
  }
  return quant_err + (static_cast<double>(K / 32) + order_terms) * 0x1p-23 * mag + 0x1p-23 * bias_abs;
}

// The tolerance of one output of a kernel that rounds both x and w to bfloat16 (8 significant bits, unit roundoff
// 2⁻⁸ each: 8 significant bits) and sums the K products in float32 (amx::ggml_linear_bf16): |bf(x)·bf(w) − x·w| <=
// |x·w|·(2⁻⁷ + 2⁻¹⁶)
// per product, K float32 roundings of partial sums bounded by Σ|x·w|·(1 + 2⁻⁷), the bias once.
inline double bf16_product_bound(const float* x_row, const float* w_row, int64_t K, double bias_abs) {
  double mag = 0.0;
  for (int64_t k = 0; k < K; ++k) mag += std::fabs(static_cast<double>(x_row[k]) * w_row[k]);
  return mag * (0x1p-7 + 0x1p-16 + static_cast<double>(K + 2) * 0x1p-24 * (1.0 + 0x1p-7)) + 0x1p-23 * bias_abs;
}

}  // namespace cider::test
