// cider/kernels/x86/amx/tile_config.h — the AMX tile configuration (palette 1) and its load into the calling thread's
// tile state, shared by the AMX kernels (amx/int_gemm.cpp, amx/ggml_linear_bf16.cpp, amx/attention_prefill_bf16.cpp). In an anonymous namespace and `static inline`: each including file keeps its own copy
// (docs/x86_kernels.md).
#pragma once

#include <cstdint>

namespace cider::kernels::x86::amx {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of each tile
  uint8_t rows[16] = {};
};

// Not _tile_loadconfig: GCC 12's operand for it covers the first 8 bytes only, so the stores to the rest of the
// configuration could be dropped as dead (an unconfigured tile then raises SIGILL); this operand is all 64 bytes.
static inline void load_tile_config(const TileConfig& cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(cfg)); }

// Every tile 16 rows × 64 bytes (the configuration all three kernels use).
static inline void load_uniform_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  load_tile_config(cfg);
}

}  // namespace
}  // namespace cider::kernels::x86::amx
