// cider — the command-line tool. Today: `cider demo`. The engine issue adds generate, chat, perplexity, logits,
// tokenize, convert and bench.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "apps/demo.h"
#include "cider/cider.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"cider: low-bit LLM inference (core library demo)"};
  app.set_version_flag("--version", std::string(cider_version()));
  app.require_subcommand(1);

  cider::apps::DemoOptions demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "KV-cache configurations: bytes per token and attention error on random data with outlier channels");
  demo_cmd->add_option("--heads-q", demo.heads_q, "query heads")->check(CLI::Range(1, 1024));
  demo_cmd->add_option("--heads-kv", demo.heads_kv, "key/value heads (divides --heads-q)")->check(CLI::Range(1, 1024));
  demo_cmd->add_option("--head-dim", demo.head_dim, "head dimension (a multiple of the group size)")
      ->check(CLI::Range(4, 1024));
  demo_cmd->add_option("--tokens", demo.tokens, "cached positions")->check(CLI::Range(1, 1 << 20));
  demo_cmd->add_option("--queries", demo.queries, "query rows (the last positions)")->check(CLI::Range(1, 1 << 20));
  demo_cmd->add_option("--outliers", demo.outlier_channels, "outlier key channels")->check(CLI::Range(0, 1024));
  demo_cmd->add_option("--outlier-scale", demo.outlier_scale, "scale of the outlier channels");
  demo_cmd->add_option("--group-size", demo.group_size, "quantization group size")
      ->check(CLI::IsMember({32, 64, 128}));
  demo_cmd->add_option("--seed", demo.seed, "random seed");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*demo_cmd) return cider::apps::run_demo(demo);
  } catch (const cider::Error& e) {
    std::fprintf(stderr, "cider: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
