// cider/kernels/cuda/counter_slabs.cu — see counter_slabs.h.
#include "kernels/cuda/counter_slabs.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"

namespace cider::cuda::counters {

namespace {

__device__ unsigned int g_counters[kPools * kCounterSlabs * kCounterSlab];

std::mutex& counter_mutex() {
  static std::mutex mu;
  return mu;
}

// The counter array of device `dev` (looked up once per device). Caller holds counter_mutex().
unsigned int* counter_array(int dev) {
  static std::vector<std::pair<int, unsigned int*>> bases;
  for (const auto& e : bases)
    if (e.first == dev) return e.second;
  void* sym = nullptr;
  CIDER_CUDA_CHECK("cuda.counters", cudaGetSymbolAddress(&sym, g_counters));
  bases.emplace_back(dev, static_cast<unsigned int*>(sym));
  return bases.back().second;
}

}  // namespace

void prepare() {
  int dev = 0;
  CIDER_CUDA_CHECK("cuda.counters", cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(counter_mutex());
  (void)counter_array(dev);
}

unsigned int* counter_slab(Pool pool, void* stream) {
  struct Entry {
    int dev;
    int pool;
    void* stream;
    unsigned int* base;
  };
  static std::vector<Entry> table;
  struct Used {
    int dev;
    int pool;
    int slabs;
  };
  static std::vector<Used> used;
  const int pl = static_cast<int>(pool);
  int dev = 0;
  CIDER_CUDA_CHECK("cuda.counters", cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(counter_mutex());
  for (const Entry& e : table)
    if (e.dev == dev && e.pool == pl && e.stream == stream) return e.base;
  int* n = nullptr;
  for (auto& u : used)
    if (u.dev == dev && u.pool == pl) n = &u.slabs;
  if (n == nullptr) {
    used.push_back({dev, pl, 0});
    n = &used.back().slabs;
  }
  if (*n >= kCounterSlabs) return nullptr;
  unsigned int* base =
      counter_array(dev) + (static_cast<size_t>(pl) * kCounterSlabs + static_cast<size_t>(*n)) * kCounterSlab;
  ++*n;
  table.push_back({dev, pl, stream, base});
  return base;
}

}  // namespace cider::cuda::counters
