// cider/nn/quantized_matmul.h — x @ dequant(w)ᵀ (or x @ dequant(w)) over MLX affine-quantized weights, with
// MLX's shapes and broadcasting (docs/formats.md), computed group by group by the active kernel table.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace cider::nn {

// x: [..., M, K] float32/float16/bfloat16 (rank >= 1).
// transpose = true:  w [..., N, K·bits/32] uint32, scales/biases [..., N, K/gs].
// transpose = false: w [..., K, N·bits/32] uint32, scales/biases [..., K, N/gs].
// A 2-D w is shared by every row of x; otherwise the leading (batch) dimensions of x and w broadcast (NumPy rules).
// out: the broadcast batch shape + [M, N] (for a 2-D w: x's shape with the last dimension N), dtype any float
// (MLX's is the promotion of x's and scales' dtypes, see quantized_matmul_output_dtype).
void quantized_matmul(const TensorView& x, const TensorView& w, const TensorView& scales, const TensorView& biases,
                      bool transpose, int group_size, int bits, const TensorView& out);

std::vector<int64_t> quantized_matmul_output_shape(const TensorView& x, const TensorView& w, bool transpose,
                                                   int bits);
DType quantized_matmul_output_dtype(const TensorView& x, const TensorView& scales);

}  // namespace cider::nn
