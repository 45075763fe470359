// cider/kernels/cuda/cuda_ops.h — the embedding lookup and logit soft-cap (kernels/cuda/ops.cu) and the dense bf16
// linear layer through cuBLASLt (kernels/cuda/dense.cu): what the CUDA backend needs besides the quantized linear
// layers and attention of cuda_api.h and the fused per-layer kernels of model_ops.h. Same conventions as cuda_api.h: device pointers, asynchronous on
// exec.stream, no allocation, no synchronization (graph-capturable), cider::Error on bad arguments.
// Activations are float32 [rows, dim] row-major; the semantics follow the CPU engine (model/cpu_backend.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/cuda_api.h"

namespace cider::cuda {

// out[i, :] = embed[tokens[i], :] · scale, embed [vocab, hidden] in f32/f16/bf16. A token id outside [0, vocab) makes
// the row NaN (the host validates ids before upload; this is a second line of defence, never a silent wrong row).
void embed_rows(const void* embed, DType embed_dtype, int64_t vocab, int64_t hidden, const int32_t* tokens, int64_t n,
                float scale, float* out, const Exec& exec);

// x[i] = cap · tanh(x[i] / cap) (Gemma's final logit soft-cap).
void softcap(float* x, int64_t count, float cap, const Exec& exec);

// ---- dense bf16 linear (cuBLASLt) ----------------------------------------------------------------------------------
// out[M, N] (float32) = x[M, K] (float32, rounded to bf16 in exec.workspace) · w[N, K]ᵀ (bf16) (+ bias[N] float32),
// float32 accumulation. The bf16 baseline path of the GPU engine, and the model's LM head in bf16 weight mode.
// Workspace: the bf16 copy of x (2·M·K bytes, rounded up to 256) + a fixed 32 MiB for cuBLASLt.
// The cuBLASLt handle and, per (M, N, K) and pointer-alignment class, the matmul descriptors and the chosen algorithm
// are created on first use and cached (thread-safe). Creating them inside a CUDA-graph capture is refused
// (cider::Error kUnsupported): make the first call per shape outside a capture, or call dense_bf16_prepare(M, N, K)
// first (it prepares the 16-byte-aligned cases, with and without bias, which is what DeviceBuffers give).
size_t dense_bf16_workspace_bytes(int64_t M, int64_t K);
void dense_bf16_prepare(int64_t M, int64_t N, int64_t K);
void dense_bf16(const float* x, const void* w_bf16, const float* bias, float* out, int64_t M, int64_t N, int64_t K,
                const Exec& exec);

// The same product with float32-faithful activations (the hybrid models' dense layers, whose gated DeltaNet
// amplifies bf16-sized input errors): x = hi + lo + r, hi = bf16(x), lo = bf16(x − hi), |r| ≤ 2⁻¹⁶·|x| (bf16 alone: 2⁻⁸), and
// out = (w·hi + w·lo) + bias — the 2·M rows of hi then lo as one cuBLASLt GEMM (the weights are read once) into a
// float32 scratch, then a kernel adds the halves. exec.workspace holds pieces of P rows:
// dense_bf16_split_workspace_bytes(P, N, K) = round_up_256(4·P·K) + round_up_256(8·P·N) + 32 MiB; the rows run in
// pieces of the largest P that fits (at least one row must: kInvalidArgument otherwise). Plans as dense_bf16's
// (per 2·P rows; built outside a capture).
size_t dense_bf16_split_workspace_bytes(int64_t M, int64_t N, int64_t K);
void dense_bf16_split(const float* x, const void* w_bf16, const float* bias, float* out, int64_t M, int64_t N,
                      int64_t K, const Exec& exec);

}  // namespace cider::cuda
