// cider/model/cuda/model_kernels.h — the few small kernels the GPU model needs besides kernels/cuda: moving attention
// heads between token-major and head-major order, and random fills for the benchmark's in-memory weights.
// Asynchronous on `stream` (cudaStream_t), no allocation, no synchronization (graph-capturable).
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace cider::model::gpu {

// in [a, b, D] → out [b, a, D] (float32): prefill queries (m, Hq, D) → (Hq, m, D) for attention, and back.
void transpose_heads(const float* in, float* out, int64_t a, int64_t b, int64_t D, void* stream);

// count values uniform in [lo, hi) from a counter hash of (seed, index), stored as dtype (f32 or bf16).
void fill_uniform(void* out, DType dtype, int64_t count, uint64_t seed, float lo, float hi, void* stream);
// count bytes: int8 codes uniform in [-127, 127] (as_int8) or any byte (packed int4 pairs).
void fill_random_bytes(void* out, int64_t count, uint64_t seed, bool as_int8, void* stream);

}  // namespace cider::model::gpu
