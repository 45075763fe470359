// `cider demo`: for each KV-cache configuration, the bytes per token and the attention error against float64
// attention on random data with outlier key channels. The main job until the engine lands.
#pragma once

#include <cstdint>

namespace cider::apps {

struct DemoOptions {
  int64_t heads_q = 32, heads_kv = 8, head_dim = 128;
  int64_t tokens = 2048;   // cached positions
  int64_t queries = 4;     // query rows (the last positions, causal)
  int outlier_channels = 4;
  float outlier_scale = 10.0f;
  int group_size = 64;
  uint64_t seed = 0;
};

int run_demo(const DemoOptions& options);

}  // namespace cider::apps
