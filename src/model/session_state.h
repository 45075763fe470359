// cider/model/session_state.h — a session's state copied to the host (Model::snapshot) and a session rebuilt from one
// (Model::restore_session): what the server's prefix cache writes to disk and reads back (runtime/prompt_cache.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"
#include "nn/kv_cache.h"

namespace cider::model {

// A linear-attention layer's state (model/cpu_backend.cpp LinearState): the recurrent state S (Hv, Dk, Dv) and the
// conv window (K − 1, conv_dim), float32, after `pos` positions; both empty before the layer's first token.
struct LinearStateCopy {
  std::vector<float> S, conv;
  int64_t pos = 0;
};

struct SessionState {
  int64_t position = 0;                     // tokens the session holds
  std::vector<nn::KVCacheSnapshot> caches;  // [num_layers]: a linear-attention layer's holds no dims
  std::vector<LinearStateCopy> linear;      // [num_layers]: empty on attention layers
  int64_t nbytes() const;                   // bytes of the copied data
};

// The metadata of layer `layer`'s cache in a session of `m` that holds positions (dims set; length and start 0):
// restore_session requires a snapshot to carry exactly this apart from its length and start. A linear-attention
// layer's cache has no dims (has_dims false).
nn::KVCacheMeta expected_cache_meta(const Model& m, int64_t layer);
nn::KVCacheMeta expected_cache_meta(const Model::Impl& m, int64_t layer);  // the same, for a backend being made

}  // namespace cider::model
