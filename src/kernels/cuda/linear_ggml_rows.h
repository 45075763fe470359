// cider/kernels/cuda/linear_ggml_rows.h — the row kernel of native GGUF weights for decode (linear_ggml_rows.cu),
// reached only through cuda::ggml_linear (linear_ggml.cu validates the arguments, quantizes the activations and picks
// this kernel or its warp-per-row GEMV).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kernel_table.h"

namespace cider::cuda::ggml_rows {

// Activation rows one launch multiplies at most (a tile of ggml_linear's M ≤ kGgmlGemvRows rows).
constexpr int kMaxTile = 8;

// The rows of a tile this kernel runs as one launch for `rows` (1 … kMaxTile) activation rows of this call, or 0 when
// it does not take the call: the weights must be 16-byte aligned with whole rows a multiple of 16 bytes (bulk
// copies), and the activation tile must fit shared memory beside the copy slots. The result is one of 1, 2, 4, 8:
// the smallest ≥ rows (padded rows are zeros) when it fits, else the largest that fits (the caller launches
// min(rows, tile) rows and goes on with the rest).
int tile_for(const kernels::GgmlLinearArgs& a, int rows);

// out rows [m0, m0 + rows) (rows ≤ tile) of a (pieces of the activations quantized beforehand: xq [M, K] int8, dx [M, K/32],
// xs [M, K/32] float2, as linear_ggml.cu's quantize_pieces writes them), as one launch of the tile size `tile`
// (tile_for's answer for these rows). Launched with programmatic dependent launch (kernels/cuda/pdl.cuh): the first
// weight segments are requested before the wait for the kernel that wrote the activations.
void launch(const kernels::GgmlLinearArgs& a, int64_t m0, int rows, int tile, const int8_t* xq, const float* dx,
            const float2* xs, cudaStream_t stream, const char* op);

}  // namespace cider::cuda::ggml_rows
