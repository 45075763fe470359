// cider/bench/cuda — the CUDA benchmark program (cuda_bench). Each area registers its cases from its own file:
//   CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336", "linear") { ... return BenchResult{...}; }
// Timing: bench_graph() captures `reps` back-to-back launches in a CUDA graph and returns the median seconds per
// launch over several replays (launch overhead excluded, as tools/gpu/peers.py measures the peers).
// Inputs: fresh random bytes, several copies rotated where a working set would otherwise sit in the 60 MB L2.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace cider::bench {

struct BenchResult {
  double seconds = 0;   // median per call
  double bytes = 0;     // minimum device-memory bytes per call (0 = not given)
  double flops = 0;     // operations per call (0 = not given)
  std::string peer;     // the tools/gpu/peers.py row this case is compared with ("" = none)
  std::string note;     // free text (e.g. the variant)
};

using BenchFn = std::function<BenchResult()>;
struct BenchCase {
  std::string name, area;
  BenchFn fn;
};
std::vector<BenchCase>& registry();
struct Registrar {
  Registrar(const char* name, const char* area, BenchFn fn);
};

// Median seconds per call of fn (enqueued on `stream`, a cudaStream_t) captured `reps` times in one graph.
double bench_graph(const std::function<void(void* stream)>& fn, void* stream, int reps = 20, int samples = 15);

}  // namespace cider::bench

#define CIDER_CUDA_BENCH_CAT2(a, b) a##b
#define CIDER_CUDA_BENCH_CAT(a, b) CIDER_CUDA_BENCH_CAT2(a, b)
#define CIDER_CUDA_BENCH(name, area)                                                               \
  static ::cider::bench::BenchResult CIDER_CUDA_BENCH_CAT(cider_bench_fn_, __LINE__)();           \
  static ::cider::bench::Registrar CIDER_CUDA_BENCH_CAT(cider_bench_reg_, __LINE__)(               \
      name, area, &CIDER_CUDA_BENCH_CAT(cider_bench_fn_, __LINE__));                               \
  static ::cider::bench::BenchResult CIDER_CUDA_BENCH_CAT(cider_bench_fn_, __LINE__)()
