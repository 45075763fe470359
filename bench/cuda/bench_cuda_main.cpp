// cuda_bench: runs the registered CUDA benchmark cases (bench/cuda/*.cpp) and prints a table; --json FILE writes the
// results for tools/gpu/compare.py, which puts them beside tools/gpu/peers.py's peer figures.
//   cuda_bench [--area A[,B…]] [--variants all|skip|only] [--filter SUBSTRING] [--json FILE] [--list]
//   --filter '=NAME': that case only; --area: only the cases of those areas (attention, gemm, linear, model, ops);
//   --variants: with or without the "v:" rows (the A/B of the environment switches). The last two let a GPU job run
//   the cases in parts that each fit one command.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "bench/cuda/bench_cuda.h"
#include "core/error.h"
#include "kernels/cuda/cuda_api.h"

namespace cider::bench {

std::vector<BenchCase>& registry() {
  static std::vector<BenchCase> r;
  return r;
}

Registrar::Registrar(const char* name, const char* area, BenchFn fn) {
  registry().push_back({name, area, std::move(fn)});
}

static void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ErrorCode::kInternal, "cuda_bench", what, ": ", cudaGetErrorString(e));
}

double bench_graph(const std::function<void(void* stream)>& fn, void* stream_handle, int reps, int samples) {
  auto stream = static_cast<cudaStream_t>(stream_handle);
  for (int i = 0; i < 3; ++i) fn(stream);  // warm-up: module load, first-touch
  ck(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph = nullptr;
  ck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
  for (int i = 0; i < reps; ++i) fn(stream);
  ck(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  ck(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  ck(cudaGraphLaunch(exec, stream), "launch");
  ck(cudaStreamSynchronize(stream), "first replay");
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) {
    ck(cudaEventRecord(a, stream), "record");
    ck(cudaGraphLaunch(exec, stream), "launch");
    ck(cudaEventRecord(b, stream), "record");
    ck(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms * 1e-3 / reps);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace cider::bench

int main(int argc, char** argv) {
  using namespace cider;
  std::string filter, json_path, variants = "all";
  std::vector<std::string> areas;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--filter" && i + 1 < argc) filter = argv[++i];
    else if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    else if (a == "--area" && i + 1 < argc) {
      const std::string arg = argv[++i];
      for (size_t start = 0; start <= arg.size();) {
        const size_t comma = std::min(arg.find(',', start), arg.size());
        if (comma > start) areas.push_back(arg.substr(start, comma - start));
        start = comma + 1;
      }
    }
    else if (a == "--variants" && i + 1 < argc) variants = argv[++i];
    else if (a == "--list") list = true;
    else {
      std::fprintf(stderr, "cuda_bench: error: unknown argument '%s' (use --area A,B, --variants all|skip|only, --filter S, --json FILE, --list)\n", a.c_str());
      return 2;
    }
  }
  auto& cases = bench::registry();
  std::sort(cases.begin(), cases.end(), [](auto& x, auto& y) { return x.area != y.area ? x.area < y.area : x.name < y.name; });
  if (variants != "all" && variants != "skip" && variants != "only") {
    std::fprintf(stderr, "cuda_bench: error: --variants takes all, skip or only, not '%s'\n", variants.c_str());
    return 2;
  }
  if (!areas.empty() || variants != "all") {
    std::vector<bench::BenchCase> kept;
    for (auto& c : cases) {
      const bool variant = c.name.find(" v:") != std::string::npos;
      if (!areas.empty() && std::find(areas.begin(), areas.end(), c.area) == areas.end()) continue;
      if ((variants == "skip" && variant) || (variants == "only" && !variant)) continue;
      kept.push_back(c);
    }
    if (kept.empty()) {
      std::string listed;
      for (const auto& x : areas) {
        if (!listed.empty()) listed += ',';
        listed += x;
      }
      std::fprintf(stderr, "cuda_bench: error: no case matches --area '%s' --variants %s\n", listed.c_str(),
                   variants.c_str());
      return 2;
    }
    cases = std::move(kept);
  }
  if (list) {
    for (auto& c : cases) std::printf("%-10s %s\n", c.area.c_str(), c.name.c_str());
    return 0;
  }
  std::string why;
  if (!cuda::device_available(&why)) {
    std::fprintf(stderr, "cuda_bench: error: no GPU for the CUDA backend: %s\n", why.c_str());
    return 1;
  }
  std::printf("device: %s, %d SMs\n", cuda::device_info().name.c_str(), cuda::device_info().sm_count);
  std::printf("%-10s %-52s %10s %9s %9s  %s\n", "area", "case", "us", "TB/s", "TOP/s", "peer / note");
  std::string json = "{\n";
  bool first = true;
  int failures = 0;
  for (auto& c : cases) {
    if (!filter.empty() && filter[0] == '=') {  // one case by its whole name (a substring also matches its v: rows)
      if (c.name != filter.substr(1)) continue;
    } else if (!filter.empty() && c.name.find(filter) == std::string::npos && c.area.find(filter) == std::string::npos) {
      continue;
    }
    try {
      bench::BenchResult r = c.fn();
      const double tbps = r.bytes > 0 ? r.bytes / r.seconds / 1e12 : 0;
      const double tops = r.flops > 0 ? r.flops / r.seconds / 1e12 : 0;
      std::printf("%-10s %-52s %10.2f %9.2f %9.1f  %s%s%s\n", c.area.c_str(), c.name.c_str(), r.seconds * 1e6, tbps, tops,
                  r.peer.c_str(), r.note.empty() ? "" : "  ", r.note.c_str());
      std::fflush(stdout);
      char buf[1024];
      std::snprintf(buf, sizeof buf, "%s \"%s\": {\"area\": \"%s\", \"s\": %.9g, \"bytes\": %.6g, \"flops\": %.6g, \"peer\": \"%s\", \"note\": \"%s\"}",
                    first ? "" : ",\n", c.name.c_str(), c.area.c_str(), r.seconds, r.bytes, r.flops, r.peer.c_str(), r.note.c_str());
      json += buf;
      first = false;
    } catch (const std::exception& e) {
      ++failures;
      std::printf("%-10s %-52s FAILED: %s\n", c.area.c_str(), c.name.c_str(), e.what());
    }
  }
  json += "\n}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return failures ? 1 : 0;
}
