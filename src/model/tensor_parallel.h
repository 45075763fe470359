// cider/model/tensor_parallel.h — what a tensor-parallel rank holds of a model (`--tp N`, Megatron-style): the rule
// for splitting a loaded model over N ranks, written once, device-free (the CUDA backend uploads each rank's share;
// tests check the split on the CPU).
//
// Per layer, rank r of N holds:
//   attention  q|k|v column-parallel: query heads [r·Hq/N, (r+1)·Hq/N) (gated attention: their gate rows too) and
//              KV heads [r·Hkv/N, (r+1)·Hkv/N) — whole GQA groups, so each rank attends over its own heads with its
//              own KV cache of Hkv/N heads; o row-parallel: the matching Hq·D/N input columns, its bias on rank 0 only
//   MLP        gate|up column-parallel (intermediate rows [r·I/N, (r+1)·I/N)), down row-parallel (those columns)
//   MoE        the router replicated; every expert (and the shared expert) split like the MLP, its gate replicated
//   head       output rows (vocabulary) [v0, v1) of tp_range(vocab, r, N); the ranks' logits side by side are the
//              model's. The embedding is replicated (a gather of the rows a pass needs).
// After o and after down (or the experts) each rank holds a partial sum of the layer's output: one all-reduce per
// attention block and one per MLP block makes it whole (model/cuda/collective.h), so the residual stream, the norms
// and everything between are computed identically on every rank.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "model/model.h"
#include "model/transformer.h"

namespace cider::model {

// [begin, end) of rank r's share of n items split as evenly as possible over `size` ranks (the first n % size ranks
// take one more).
std::pair<int64_t, int64_t> tp_range(int64_t n, int rank, int size);

// cider::Error (kUnsupported / kInvalidArgument) naming the rule when `size` ranks cannot split this model in this
// weight format: size in [1, kMaxTensorParallel]; the query and KV heads, the intermediate sizes (MLP, experts,
// shared expert) divisible by size; per-group int weights: each rank's share of a row-parallel layer's inputs (o:
// Hq·D/size, down: I/size) a whole number of groups; GGUF block weights: of blocks; no linear-attention (hybrid)
// layers and no whole-projection q/k norms (their statistics span every head).
void check_tensor_parallel(const ModelConfig& c, WeightFormat weights, int size);

constexpr int kMaxTensorParallel = 8;

// Rank `rank`'s view of the model's shape: Hq, Hkv, the intermediate sizes divided by size; everything else as c.
ModelConfig tp_shard_config(const ModelConfig& c, int size);

// A share of a linear layer: the descriptor points into the source layer's tensors (row shares are contiguous) or
// into the copies held here (column shares, per-group scales of row shares). Not copyable: `linear` points into it.
struct LinearShare {
  Linear linear;
  std::vector<uint8_t> w;
  std::vector<float> scales;
  LinearShare() = default;
  LinearShare(LinearShare&&) = default;
  LinearShare& operator=(LinearShare&&) = default;
  LinearShare(const LinearShare&) = delete;
  LinearShare& operator=(const LinearShare&) = delete;
};

// Output rows [r0, r1) of L (column parallelism): y[:, r0:r1] of the whole layer, bias included. Every weight kind.
LinearShare share_rows(const Linear& L, int64_t r0, int64_t r1);
// Input columns [k0, k1) of L (row parallelism): x[:, k0:k1]·W[:, k0:k1]ᵀ, plus the bias when with_bias (give it to
// one rank). Per-group int weights need k0, k1 on group boundaries, int4 even ones, GGUF block weights block
// boundaries: cider::Error (kInvalidArgument) otherwise.
LinearShare share_cols(const Linear& L, int64_t k0, int64_t k1, bool with_bias);
// Rows [r0, r1) of each part of a layer whose output is parts side by side (gated attention's q_proj: queries, then
// as many gate rows): part_rows rows per part.
LinearShare share_rows_of_parts(const Linear& L, int64_t part_rows, int64_t r0, int64_t r1);

}  // namespace cider::model
