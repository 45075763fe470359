// cider/quant/ggml_quantize.h — cider's encoder into the GGUF block formats (quant/ggml_blocks.h), so float, MLX and
// GGUF sources alike can be requantized into the blocks the native-weight kernels multiply (--weights q8_0, q4_k…).
//
// Each block (or sub-block) is fitted by least squares, not by its largest value alone:
//   symmetric  (Q8_0, Q4_0, Q5_0, Q6_K's 16-wide sub-blocks): y = d·q, q ∈ [lo, hi]. Candidate steps map the
//              largest-magnitude value to either end of the range, stretched by up to ±1.5 codes; for each, the codes
//              are rounded, d is refitted (Σxq / Σq²), rounded to the format's f16 (or int8 sub-scale), the codes
//              rounded again, and the candidate with the least Σ(x − y)² (y decoded exactly as the decoder does)
//              wins. Q8_0 takes d = max|x| / 127 alone (its rounding error is already below bf16's).
//   affine     (Q4_1, Q5_1, Q4_K's 32-wide sub-blocks): y = d·q + m, q ∈ [0, 2^b − 1]; from a few starting steps
//              around (max − min) / (2^b − 1), alternating code rounding and the 2 × 2 least-squares fit of (d, m);
//              Q4_K requires m ≤ 0 (its min is subtracted as dmin·m_j, m_j ≥ 0).
//   K-quants   the sub-blocks' fitted scales (and mins) are then coded in 6 bits (Q4_K) or int8 (Q6_K) against the
//              super-block's f16 scale(s), and the codes are rounded once more against the coded scales.
// So a block that already lies on its format's grid with an end code in use (any block ggml or cider wrote, since
// both put the largest value at an end) is re-encoded to the same values: requantizing a Q8_0 tensor into Q8_0 is
// lossless.
#pragma once

#include <cstdint>

#include "quant/ggml_blocks.h"

namespace cider::quant {

// Whether ggml_quantize_row can write type t: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K.
bool ggml_can_quantize(GgmlType t);

// Encodes x[0 .. n) as n / block_size blocks of type t at out (ggml_row_bytes bytes). n must be a multiple of the
// block size and every value finite with magnitude below 65504 · the format's largest code (the f16 scale's range);
// otherwise cider::Error naming the value.
// importance (optional, n values, finite and >= 0): the fits minimise Σ importance_i (x_i − y_i)² instead of the plain
// squared error — with importance_i the mean square of the activation that multiplies weight i (an activation-aware
// "importance matrix" diagonal, model/activation_stats.h), the expected squared error of the layer's output. A block
// whose importances are all 0 gets its plain fit; Q8_0 always takes its plain rule.
void ggml_quantize_row(GgmlType t, const float* x, int64_t n, uint8_t* out, const float* importance = nullptr);

// As ggml_quantize_row, with the error feedback of GPTQ (Frantar et al., 2022): the row is coded column by column,
// and each column's rounding error is spread over the columns not yet coded so as to minimise the layer's output
// error E‖(w − ŵ)·x‖² under the inputs' second moment H = E[x xᵀ] (quant/gptq.h), not each weight's own error.
// U: the upper Cholesky factor of the damped H⁻¹ (n × n, row-major; gptq_factor). Each block's scales are fitted
// (weighted by importance, as ggml_quantize_row's) when the coding reaches it, to its values as the earlier columns'
// errors have left them; its codes are then rounded one by one on that grid. x is the scratch row: overwritten.
void ggml_quantize_row_gptq(GgmlType t, float* x, int64_t n, const float* U, uint8_t* out,
                            const float* importance = nullptr);

}  // namespace cider::quant
