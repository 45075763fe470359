// `cider bench`: times each x86 kernel entry on the shapes of the performance issue and prints a table (or JSON
// lines with --json). GEMV weights rotate over distinct random copies that together exceed the last-level cache,
// so every call streams its weights from DRAM as real decoding does; a STREAM-style read of the same pool size gives
// the machine's bandwidth in the same run. Speed claims compare runs made side by side: tools/bench_peers.sh.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace cider::apps {

struct BenchOptions {
  std::string isa;            // ref, avx2, avx512; empty = the active level (CIDER_ISA or the machine's highest)
  int threads = 0;            // 0 = the default pool ($CIDER_NUM_THREADS or all cores)
  int reps = 20;              // timed calls per case (after one warm-up call); best, median and max are reported
  int64_t pool_mb = 1024;     // bytes of distinct weight copies each streaming case cycles through
  std::string filter;         // run only cases whose name contains this (comma-separated alternatives)
  bool json = false;          // one JSON object per line instead of the table
  bool list = false;          // print the case names only
};

// Registers the `bench` subcommand and its options on `app`, writing into `options`. Returns the subcommand.
CLI::App* add_bench_command(CLI::App& app, BenchOptions& options);

// Runs the selected cases; returns the process exit status.
int run_bench(const BenchOptions& options);

}  // namespace cider::apps
