// cider/kernels/cuda/cuda_ops.h — the remaining ops of a transformer layer on the GPU (kernels/cuda/ops.cu) and the
// dense bf16 linear layer through cuBLASLt (kernels/cuda/dense.cu): what model/cuda needs besides the quantized
// linear layers and attention of cuda_api.h. Same conventions as cuda_api.h: device pointers, asynchronous on
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

// out = x / sqrt(mean(x²) + eps) · (offset + w) per row of `dim` (float32 sums); out may equal x. w [dim] float32.
void rms_norm(const float* x, const float* w, float offset, int64_t rows, int64_t dim, float eps, float* out,
              const Exec& exec);

// Rotary embedding, HF rotate_half convention, in place on x [n, heads, head_dim] (pairs (i, i + head_dim/2)):
// row t of the chunk sits at position pos0 + t, where pos0 = *d_pos when d_pos is not null (CUDA-graph decode), else
// the host value. angle = position · inv_freq[i], inv_freq device [head_dim/2], cos/sin in float32.
void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const float* inv_freq, int64_t pos0,
          const int32_t* d_pos, const Exec& exec);

enum class GluActivation : int { kSiLU = 0, kGeluTanh = 1 };
// out[i] = act(gate[i]) · up[i] over `count` elements (out may equal gate or up).
void glu(const float* gate, const float* up, int64_t count, GluActivation act, float* out, const Exec& exec);

// x[i] += y[i] over `count` elements.
void add_inplace(float* x, const float* y, int64_t count, const Exec& exec);

// x[i] = cap · tanh(x[i] / cap) (Gemma's final logit soft-cap).
void softcap(float* x, int64_t count, float cap, const Exec& exec);

// out[r] = index of the largest logit of row r (the lowest index among equals; NaN never wins).
void argmax_rows(const float* logits, int64_t rows, int64_t vocab, int32_t* out, const Exec& exec);

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

}  // namespace cider::cuda
