// cider/quant/gptq.h — the factor GPTQ's error feedback uses (quant/ggml_quantize.h, ggml_quantize_row_gptq).
//
// For a layer y = W·x whose inputs have the second moment H = E[x xᵀ] (K × K, from a calibration text:
// model/activation_stats.h), quantizing row w to ŵ costs E[((w − ŵ)·x)²] = (w − ŵ) H (w − ŵ)ᵀ. GPTQ codes the K
// weights of a row in order; after coding weight j with error δ, the choice of the remaining weights that minimises
// that cost moves them by −δ · H⁻¹[j, j+1 …) / H⁻¹[j, j] of the inverse restricted to the columns from j on, which is
// row j of U divided by U[j, j], U the upper Cholesky factor of H⁻¹ (H⁻¹ = Uᵀ U). So one factor per layer serves
// every row.
//
// Computed in float64: H + λ·mean(diag H)·I (λ = damp; a channel whose mean square is 0 gets diagonal 1 first) is
// reversed (P H P, P the exchange matrix), factored as L Lᵀ, and U = P L⁻¹ P (a triangular inverse, no general one).
#pragma once

#include <cstdint>
#include <vector>

namespace cider::quant {

// U (K × K, row-major, zero below the diagonal) for the symmetric positive semi-definite H (K × K, row-major; only
// its upper triangle is read). cider::Error (kInvalidArgument) when a value is not finite, a diagonal value is
// negative, or the damped matrix is not positive definite (naming the column), or damp is not in (0, 1].
std::vector<float> gptq_factor(const float* H, int64_t K, double damp = 0.01);

}  // namespace cider::quant
