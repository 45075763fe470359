// Shared bits of the peer harnesses (bench/peers/*.cpp): random fill, timing, and the JSON line that
// tools/bench_peers.sh reads — the same fields as `cider bench --json`. These harnesses are cider's own code; they
// are compiled OUTSIDE the repository against the peers (tools/bench_peers.sh) and never built by CMake.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace peers {

inline void fill_random(void* dst, size_t n, uint64_t seed) {
  uint8_t* p = static_cast<uint8_t*>(dst);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const uint64_t v = s * 0x2545F4914F6CDD1Dull;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(i * 131 + seed);
}

// Copies needed so `count` copies of `bytes` hold at least pool_mb MiB.
inline size_t copies_for(size_t bytes, long pool_mb) {
  const size_t want = static_cast<size_t>(pool_mb) << 20;
  return std::max<size_t>(1, (want + bytes - 1) / bytes);
}

inline std::vector<double> time_calls(int reps, const std::function<void(int)>& call) {
  call(0);
  std::vector<double> ms;
  for (int i = 1; i <= reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call(i);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return ms;
}

inline void print_json(const char* engine, const std::string& name, const std::string& kernel, int threads, long M,
                       long N, long K, const std::vector<double>& ms, double bytes, const std::string& note) {
  std::vector<double> s = ms;
  std::sort(s.begin(), s.end());
  const double best = s.front(), med = s[s.size() / 2], worst = s.back();
  std::printf("{\"engine\": \"%s\", \"case\": \"%s\", \"kernel\": \"%s\", \"threads\": %d, \"M\": %ld, \"N\": %ld, "
              "\"K\": %ld, \"best_ms\": %.4f, \"median_ms\": %.4f, \"max_ms\": %.4f, \"calls\": %zu, \"gbps\": %.2f, "
              "\"gops\": %.1f, \"note\": \"%s\"}\n",
              engine, name.c_str(), kernel.c_str(), threads, M, N, K, best, med, worst, ms.size(),
              bytes / (best * 1e-3) / 1e9, 2.0 * M * N * K / (best * 1e-3) / 1e9, note.c_str());
  std::fflush(stdout);
}

// Arguments: --filter TEXT --reps N --pool-mb N --threads N
struct Options {
  std::string filter;
  int reps = 20, threads = 2;
  long pool_mb = 1024;
  static Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--filter") o.filter = v;
      else if (k == "--reps") o.reps = std::stoi(v);
      else if (k == "--pool-mb") o.pool_mb = std::stol(v);
      else if (k == "--threads") o.threads = std::stoi(v);
    }
    return o;
  }
  // True when `name` contains one of the comma-separated parts of the filter (or the filter is empty).
  bool wants(const std::string& name) const {
    if (filter.empty()) return true;
    size_t start = 0;
    while (start <= filter.size()) {
      const size_t end = std::min(filter.find(',', start), filter.size());
      const std::string part = filter.substr(start, end - start);
      if (!part.empty() && name.find(part) != std::string::npos) return true;
      start = end + 1;
    }
    return false;
  }
};

}  // namespace peers
