// cider/kernels/cuda/attention_prefill_tc.h — the tensor-core PREFILL path of cuda::attention
// (attention_prefill_tc.cu), used by attention.cu for K4V3 and K8V4 g64 caches with f16 scales, Dk = Dv = 128 or 256,
// masks none / causal (any window), MORE than 8 query rows per KV head (rep·L > 8: the decode tensor-core path
// attention_tc.h takes rep·L ≤ 8), 16-byte aligned q / out / codes. $CIDER_ATTN_PREFILL_TC=0 turns it off (read at
// every call, so tests and benchmarks can compare it with the general CUDA-core kernel of attention.cu). Two kernels
// serve it (prefill_math_f16 below): attention_prefill_f16.cu (default) and attention_prefill_tc.cu (exact scores).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/kernel_table.h"

namespace cider::cuda::detail {

struct PrefillTcPlan {
  bool f16 = true;    // the f16-tile kernel (attention_prefill_f16.cu), else the exact-score kernel
  int qblocks = 1;    // blocks of query rows (64 exact, 128 f16) per (b, KV head)
  int splits = 1;     // pieces of the key range (merged by attention.cu's merge kernel when > 1)
  int64_t chunk = 0;  // keys per split (a multiple of the key tile)
  size_t smem = 0;    // dynamic shared memory per CTA
};

// Which kernel of the path runs: $CIDER_ATTN_PREFILL_MATH (read at every call) = f16 (keys and values dequantized to
// f16 tiles, an f16 flash-attention core; attention_prefill_f16.cu), exact (scores exact up to the query's 2^-22
// rounding; attention_prefill_tc.cu) or auto (default): f16 when a KV head has more than 64 query rows (rep·L > 64),
// else exact (a few rows against a long cache: one 64-row CTA per head and split, faster there, job 47). Anything
// else is an error naming the variable. Per-channel keys (K4V4) always take the f16 kernel (the exact-score kernel
// does not read them).
bool prefill_math_f16(const kernels::AttentionArgs& a);

// The f16 kernel's tile, occupancy and shared memory for an eligible call (attention_prefill_f16.cu).
struct PrefillF16Shape {
  int tile_keys = 64;
  int ctas_per_sm = 1;
  int rows_per_cta = 128;
  size_t smem = 0;
};
PrefillF16Shape prefill_f16_shape(const kernels::AttentionArgs& a);
void prefill_f16_launch(const kernels::AttentionArgs& a, const PrefillTcPlan& plan, const int32_t* d_length,
                        float* part_o, float* part_ml, void* stream);

// The parameter block of both prefill kernels: the fields of every tensor-core attention kernel (filled by
// attention_tc.h's fill_tc_params) and the blocks of query rows per (b, KV head).
struct PrefillParams : TcCallParams {
  int qblocks;
  // Per-channel keys (the f16 kernel only): the bf16 residual window [B·Hkv, 64, D] and the key scale rows per head.
  const uint16_t* residual;
  int64_t kblocks;
};

// True when the prefill tensor-core path takes these (already validated) arguments.
bool prefill_tc_eligible(const kernels::AttentionArgs& a);
PrefillTcPlan prefill_tc_plan(const kernels::AttentionArgs& a);
// Launches the kernel (through pdl::launch). splits == 1: writes out directly; otherwise every CTA writes its rows'
// partials in attention.cu's workspace layout, [B·Hq·L, splits, Dv] (o, unnormalized) and [B·Hq·L, splits, 2]
// (m in natural-log units, l), and the caller launches the merge.
void prefill_tc_launch(const kernels::AttentionArgs& a, const PrefillTcPlan& plan, const int32_t* d_length,
                       float* part_o, float* part_ml, void* stream);

}  // namespace cider::cuda::detail
