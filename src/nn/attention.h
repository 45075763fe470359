// cider/nn/attention.h — scaled dot-product attention of queries over a KV cache (quantized or plain).
//
//   out[b, h, i, :] = Σ_j softmax_j(cap(scale · q[b, h, i, :]·k[b, h/(Hq/Hkv), j, :]) + mask) · v[b, h/(Hq/Hkv), j, :]
//   (cap(s) = s, or softcap·tanh(s / softcap) when a softcap is given)
//
// The cache stores rotated keys R_k·k and values R_v·v (nn/rotation.h). Since R_k is orthogonal, q·k = (R_k q)·(R_k k),
// so the queries are rotated with the cache's key rotation; the weighted sum of rotated values is R_v·(Σ p·v), so the
// result is rotated back with R_vᵀ. The kernel (kernels::active_kernels().attention) works on the packed codes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/kernel_table.h"
#include "nn/kv_cache.h"

namespace cider::nn {

struct AttentionMask {
  kernels::MaskKind kind = kernels::MaskKind::kNone;
  // kCausal only: 0 = no window; w > 0 = key j visible to the query at position p iff p − w < j <= p.
  int64_t window = 0;
  // kBool (dtype bool: visible where nonzero) or kAdditive (float32/float16/bfloat16: added to the scaled scores;
  // −inf hides a key): rank 2 to 4, broadcastable to [B, Hq, L, kL] (dims aligned on the right, each 1 or equal;
  // any strides). Empty (data null, rank 0) for kNone and kCausal.
  TensorView mask;
};

// queries [B, Hq, L, Dk] float32/float16/bfloat16 (any strides), Hq a multiple of the cache's Hkv, L <= cache length
// (query row i sits at stored position kL − L + i, kL = cache.offset(); a sliding-window cache that dropped positions
// needs a causal mask with a window of at most its own, nn/kv_cache.h); out [B, Hq, L, Dv] float32/float16/
// bfloat16 (any strides), written in full. Accumulation and softmax in float32. softcap > 0 caps the scores before
// the mask (Gemma 2's attention logit softcapping): s = scale·q·k becomes softcap·tanh(s / softcap); 0 = none; it
// must be finite and >= 0. Throws cider::Error on bad arguments.
//
// segments: a shared prefix (nn::KVSegment), positions [0, cache.start()) of a cache that split_front moved them out
// of (contiguous, the cache's format: check_segments); the queries, after them, see every segment position, so the
// mask must be causal without a window (or none; kBool/kAdditive masks cover the cache's positions only). Each
// segment's part is merged with the cache's by their log-sum-exp: the result is attention over the whole sequence
// (the float32 sums in another order). A cache with start() > 0 and no window needs its segments.
void attention(const TensorView& queries, const KVCache& cache, float scale, const AttentionMask& mask,
               const TensorView& out, float softcap = 0.0f, const std::vector<KVSegment>& segments = {});

}  // namespace cider::nn
