// cider/kernels/cuda/counter_slabs.h — zero-initialized device counters for kernels whose CTAs meet through global
// atomics (attention_tc.cu's in-kernel split merge).
//
// Why not exec.workspace: the model hands every launcher one shared workspace (model/cuda/cuda_backend.cpp), so other launches
// overwrite it between two calls, and a cudaMemsetAsync per call would add a graph node and cut PDL edges. So: a
// static device array per pool, zero at module load; the kernels leave their counters zero again (the last CTA resets
// them). Two launches that run at the same time must not share counters: each (device, stream) gets its own slab of
// kCounterSlab counters (launches on one stream are ordered). A graph must be replayed on the stream it was captured
// on (model/cuda/cuda_backend.cpp and the benchmarks do). When the kCounterSlabs slabs of a pool are handed out, counter_slab
// returns null and the caller takes its path without counters.
#pragma once

namespace cider::cuda::counters {

enum class Pool : int { kAttentionMerge = 0 };
constexpr int kPools = 1;
constexpr int kCounterSlabs = 8;     // (device, stream) pairs per pool
constexpr int kCounterSlab = 4096;   // counters per slab

// Looks up the current device's array once (cudaGetSymbolAddress; counter_slab does it too on first use). For a
// launcher whose first call may come during stream capture, call it beforehand (attention plans with it).
void prepare();

// The slab of `pool` for (current device, stream), handed out on first use; null when the pool is exhausted.
unsigned int* counter_slab(Pool pool, void* stream);

}  // namespace cider::cuda::counters
