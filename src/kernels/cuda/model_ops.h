// cider/kernels/cuda/model_ops.h — the small fused kernels of the CUDA backend (model/cuda/cuda_backend.cpp): the fused per-head
// preparation of q/k/v (norm + rope + rotation in one launch), the attention output's way back (transpose + inverse
// rotation), the residual add fused with the next RMSNorm, the GLU over the fused gate|up output, and random fills
// for the benchmark's in-memory weights.
// Asynchronous on `stream` (cudaStream_t), no allocation, no synchronization (graph-capturable). Every kernel follows
// the CPU backend (model/cpu_backend.cpp) operation for operation; the arithmetic is the one of kernels/cuda/ops.cu
// (rms_norm, rope, glu), kv_append.cu (SO(4) blocks, every multiply and add rounded) and hadamard.cuh.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace cider::cuda {

// The fused q|k|v projection's output qkv [n, Hq + 2·Hkv, D] float32 (token-major; q heads, then k, then v; gated
// attention: the gate heads between q and k, HeadPrepArgs::gate_heads) is made
// ready for the cache and attention in one launch, one warp per (token, head) row:
//   q and k heads: [rms_norm with q_norm / k_norm (when not null): (x·inv)·(norm_offset + w)], rope at position
//                  p = pos0 + t (*d_pos + t when d_pos is not null; rotate_half pairs (i, i + D/2), products and sums
//                  rounded separately) with cos/sin read from row p of rope_table (model/cuda/cuda_backend.h rope_table: the float32
//                  angle fl(p·inv_freq[i]), cos/sin in double rounded once, computed on the host as the CPU forward
//                  does); a position outside [0, rope_positions) turns the row into NaN (never a read past the table);
//   rotation 3 (Hadamard, `signs` [D]): q, k and v heads rotated forward (the CPU cache's bytes once kv_append stores
//                  them with rotation 0);
//   rotation 1/2 (SO(4), qL/qR [D/4, 4]): q heads rotated forward (kv_append rotates k and v itself).
// q heads are written to q_out as (n, Hq, D) or, q_head_major, (Hq, n, D) (attention's prefill layout); k and v heads
// in place in qkv (kv_append reads them with the row stride (Hq + gate_heads + 2·Hkv)·D).
struct HeadPrepArgs {
  float* qkv;
  int64_t n, Hq, Hkv, D;
  const float* q_norm;  // [D] or null
  const float* k_norm;  // [D] or null
  float norm_offset, eps;
  const float* rope_table;  // [rope_positions, D]: row p = cos [D/2] then sin [D/2]
  int64_t rope_positions;
  int64_t pos0;
  // Positions on the device: row t at *d_pos + t (one sequence), or, with d_pos_stride > 0, at d_pos[t·d_pos_stride]
  // (a decode batch: each row a sequence of its own). Null: pos0 + t.
  const int32_t* d_pos;
  int rotation;     // 0 none, 1 so4 fast, 2 so4 full, 3 hadamard
  const float* qL;  // rotation 1/2: quaternions; rotation 3: the signs [D]
  const float* qR;  // rotation 2
  float* q_out;
  bool q_head_major;
  // false for per-channel keys (stored unrotated): q and k heads are left unrotated, only v heads take rotation 3.
  bool rotate_qk = true;
  // Gated attention (ModelConfig::attn_output_gate): 0, or Hq gate heads between the q heads and the k heads of every
  // row — qkv [n, Hq + gate_heads + 2·Hkv, D] ([q | gates | k | v], the fused projection of q_proj's queries then
  // gates, k and v); the gates are left as they are (finish's sigmoid_gate_rows reads them).
  int64_t gate_heads = 0;
  int64_t d_pos_stride = 0;
};
// OLMoE's attention inputs (ModelConfig::qk_norm_full, clip_qkv), before prepare_heads: in each of n rows of qkv
// (stride floats apart) one RMSNorm over the whole q (q_len values from 0, weights q_norm [q_len]; skipped when null)
// and over the whole k (k_len values from k_col, weights k_norm), y = x / sqrt(mean x² + eps) · (offset + w); then,
// when clip > 0, q, k and the v_len values after k clamped to ±clip. Float32 sums in another order than the CPU's
// rms_norm (reassociation only). PDL launch.
void qkv_norm_clip_rows(float* qkv, int64_t n, int64_t stride, int64_t q_len, int64_t k_col, int64_t k_len,
                        int64_t v_len, const float* q_norm, const float* k_norm, float offset, float eps, float clip,
                        void* stream);

// Head dims 64, 128 and 256 run a kernel that keeps each row in registers (lane ℓ owns elements ℓ + 32k); others a
// kernel that stages rows in shared memory. Both give the same bits. Launched with PDL (kernels/cuda/pdl.cuh).
void prepare_heads(const HeadPrepArgs& a, void* stream);

// Attention output → the o projection's input: row (t, h) of `in` ((n, Hq, D), or (Hq, n, D) when in_head_major) is
// rotated back from the cache's value space (rotation 1/2: conj(qL)·w[·qR]; 3: inverse Hadamard; 0: unchanged) and
// written to out (n, Hq, D). in and out must not overlap.
void finish_heads(const float* in, bool in_head_major, int64_t n, int64_t Hq, int64_t D, int rotation,
                  const float* qL, const float* qR, float* out, void* stream);

// The residual stream between two sublayers, one CTA per row of hidden values:
//   t' = post_w ? rms_norm(t)·(offset + post_w) : t        (Gemma 3's post-attention / post-MLP norm)
//   x += t'                                                  (skipped when t is null: the first layer)
//   h = rms_norm(x)·(offset + w)                             (the next sublayer's input norm, or the final norm)
// x [rows, H] updated in place, h [rows, H] written; t may be the o/down projection output.
// H ≤ 8192: every element stays in registers (thread j of 512 owns j + 512·e), one load phase, two block sums; larger
// H: a kernel that re-reads the row per pass. Same arithmetic and summation order in both (bit-identical). PDL launch.
void residual_norm(float* x, const float* t, const float* post_w, const float* w, float offset, int64_t rows,
                   int64_t H, float eps, float* h, void* stream);

// out [n, I] = act(gu[t, i]) · gu[t, I + i] over the fused gate|up output gu [n, 2·I]; act 0 SiLU, 1 GELU (tanh).
void glu_rows(const float* gu, int64_t n, int64_t I, int act, float* out, void* stream);

// Mixture-of-experts row movement (float32 rows of H values): gather_rows dst[i, :] = src[idx[i], :] for i < m;
// scatter_add_rows dst[idx[i], :] += w[i]·src[i, :] for i < m (the idx of one call distinct, so no two threads add
// to one element). idx and w on the device. Plain launches (no PDL).
void gather_rows(const float* src, const int32_t* idx, int64_t m, int64_t H, float* dst, void* stream);
void scatter_add_rows(const float* src, const int32_t* idx, const float* w, int64_t m, int64_t H, float* dst,
                      void* stream);

// count values uniform in [lo, hi) from a counter hash of (seed, index), stored as dtype (f32 or bf16).
void fill_uniform(void* out, DType dtype, int64_t count, uint64_t seed, float lo, float hi, void* stream);
// count bytes: int8 codes uniform in [-127, 127] (as_int8) or any byte (packed int4 pairs).
void fill_random_bytes(void* out, int64_t count, uint64_t seed, bool as_int8, void* stream);

}  // namespace cider::cuda
