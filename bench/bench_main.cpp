// cider_bench: the `cider bench` subcommand as a standalone program (same options), for benchmarking scripts.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "apps/bench.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"cider_bench: time cider's kernels (same as `cider bench`)"};
  app.require_subcommand(1);  // usage: cider_bench bench [options], exactly as `cider bench [options]`
  cider::apps::BenchOptions options;
  cider::apps::add_bench_command(app, options);
  CLI11_PARSE(app, argc, argv);
  try {
    return cider::apps::run_bench(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cider_bench: error: %s\n", e.what());
    return 2;
  }
}
