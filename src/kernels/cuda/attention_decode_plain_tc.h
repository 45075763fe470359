// cider/kernels/cuda/attention_decode_plain_tc.h — the tensor-core decode path of cuda::attention for PLAIN caches
// (attention_decode_plain_tc.cu): keys and values stored as bf16 or f16 (bits 0, the same dtype on both sides,
// per-token layout), Dk = Dv = 128 or 256, at most 8 query rows per KV head (rep·L ≤ 8: decode), masks none or causal
// (any window), any softcap, host or device length, 16-byte aligned q / out / cache. $CIDER_ATTN_TC_PLAIN=0 (read at
// every call) and $CIDER_ATTN_TC=0 turn it off; everything else runs the general CUDA-core kernel of attention.cu.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_table.h"

namespace cider::cuda::detail {

struct PlainTcPlan {
  int splits = 1;
  int64_t chunk = 0;  // keys per split for keys.length (it fixes `splits`; the kernel re-cuts the visible keys)
  size_t smem = 0;    // dynamic shared memory per CTA
};

// True when the plain-cache tensor-core decode kernel takes these (already validated) arguments.
bool plain_tc_eligible(const kernels::AttentionArgs& a);
PlainTcPlan plain_tc_plan(const kernels::AttentionArgs& a);
// Launches the split kernel (through pdl::launch): splits == 1 writes out directly, otherwise every CTA writes its
// partial [B·Hq·L, splits, Dv] (o, unnormalized) and [B·Hq·L, splits, 2] (m in natural-log units, l) to the
// workspace, and the caller launches attention.cu's merge (the layout of attention_tc.h's tc_launch).
void plain_tc_launch(const kernels::AttentionArgs& a, const PlainTcPlan& plan, const int32_t* d_length,
                     float* part_o, float* part_ml, void* stream);

}  // namespace cider::cuda::detail
