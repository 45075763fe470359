// The `cider` subcommands other than `demo`: generate, chat, tokenize, logits, perplexity, convert, inspect.
//
// Every command validates all of its option values first (so a typo fails at once, before a model is loaded), then
// loads the model and runs. Errors are cider::Error; main() prints them as "cider: error: <message>" and exits 2.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/chat_format.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/sampler.h"

namespace cider::apps {

// Options every model command shares.
struct ModelArgs {
  std::string model;               // -m; empty = the embedded default model
  bool model_given = false;        // -m was on the command line (then it must not be empty)
  std::string weights;             // --weights ("": model::default_weights)
  std::string kv;                  // --kv; "" = model::default_kv(device) (docs/quality.md)
  std::string kv_rotation;         // "" = the default's (hadamard; an explicit --kv: hadamard)
  std::string kv_layout;           // "" = the default's (an explicit --kv: token)
  std::string kv_values;           // --kv-values: affine or symmetric; "" = the default's (affine)
  std::string kv_recent;           // --kv-recent: quantized or exact; "" = the default's
  std::string kv_outliers;         // --kv-outliers: a count or "auto"; "" = the default's (an explicit --kv: 0)
  int kv_group_size = 64;
  bool kv_group_size_given = false;  // else the default cache's (128 on the cpu) or, with --kv, 64 (32 where 64
                                     // does not divide head_dim)
  bool kv_full_sliding = false;    // --kv-full-sliding: sliding-window layers keep every position
  int threads = 0;                 // --threads (applied only when threads_given)
  bool threads_given = false;
  int64_t ctx = 0;                 // --ctx; 0 = the model's maximum (capped by the engine)
  std::string device = "cpu";      // --device: cpu or cuda
  int tp = 1;                      // --tp: tensor-parallel GPUs (model/tensor_parallel.h)
  bool progress = false;           // --progress: draw bars even when stderr is not a terminal
  std::string imatrix;             // --imatrix: an importance file (`cider imatrix`) for a requantizing --weights
  std::string head_weights;        // --head-weights: the LM head's block type of a requantizing --weights
  bool no_repack = false;          // --no-repack: native weights in the file's row order (ModelOptions::kernel_layout)
};

// Checks every value and turns them into engine options (cider::Error naming the option otherwise); applies
// --threads.
model::ModelOptions model_options(const ModelArgs& a);

// Loads the model at `path` with a progress bar on stderr (when a terminal or --progress).
std::unique_ptr<model::Model> load_model(const ModelArgs& a, const model::ModelOptions& o, const std::string& path);
// The chat format: `name` when given (cider::Error for an unknown one), else the model family's.
model::ChatFormat chat_format_for(const model::Model& m, const std::string& name);
// "weights bf16[ (imatrix FILE)][, head q5_0], kv k5v4/hadamard/g64/kchan/o8[, device cuda]".
std::string describe(const model::ModelOptions& o);

// The model directory to use: -m if given, else $CIDER_DEFAULT_MODEL, else <dir of the cider binary>/../models/
// cider-tiny, else <source dir>/models/cider-tiny; a cider::Error (kIo) listing where it looked if none exists.
std::string resolve_model_path(const std::string& given);
// The same for a command's options; -m given as "" is an error (not the embedded model).
struct ModelArgs;
std::string resolve_model_path(const ModelArgs& a);

struct GenerateArgs {
  ModelArgs m;
  std::string prompt;
  int64_t max_tokens = 256;
  model::SamplerParams sampling;
  bool seed_given = false;
  std::vector<std::string> stop;
  bool no_stream = false;
  bool echo = false;  // print the prompt before the continuation
  int64_t prefill_chunk = model::GenerateOptions{}.prefill_chunk;  // prompt tokens per forward pass
};
int run_generate(GenerateArgs a);

struct ChatArgs {
  ModelArgs m;
  std::string chat_format;  // empty = chosen from the architecture and vocabulary
  std::string system;
  int64_t max_tokens = 512;
  model::SamplerParams sampling;
  bool seed_given = false;
  bool stats = false;
  int64_t prefill_chunk = model::GenerateOptions{}.prefill_chunk;  // prompt tokens per forward pass
};
int run_chat(ChatArgs a);

struct TokenizeArgs {
  ModelArgs m;
  std::string text;  // exactly one of text and file
  std::string file;
  bool text_given = false;
  bool no_special = false;
  bool count = false;  // print the number of tokens only
};
int run_tokenize(const TokenizeArgs& a);

struct LogitsArgs {
  ModelArgs m;
  std::string tokens;  // "1,2,3"
  std::string out;
};
int run_logits(const LogitsArgs& a);
std::vector<int32_t> parse_token_list(const std::string& s);  // "1,2,3" → ids; cider::Error otherwise

struct PerplexityArgs {
  ModelArgs m;  // m.ctx is the window length
  std::string file;
  int64_t stride = 0;
  bool llama_windows = false;  // --llama-windows: llama-perplexity's windows (model/perplexity.h)
  std::string baseline_weights, baseline_kv;  // either given → a baseline (the other defaults to the tested one)
  std::string llama_logits;  // --llama-logits: llama.cpp's saved log-probabilities as the baseline (llama windows)
};
int run_perplexity(PerplexityArgs a);

// `cider imatrix`: each linear layer's mean squared input per channel over the windows of a calibration text
// (model/activation_stats.h), written to `out` for `--imatrix`.
struct ImatrixArgs {
  ModelArgs m;  // m.ctx: the window length (default 512)
  std::string file;
  std::string out;
  int64_t chunks = 0;  // windows at most; 0 = every whole window of the text
  bool hessian = false;  // also each layer's mean of x xᵀ (GPTQ's error feedback)
  int64_t hessian_max_k = 4096;  // ... for the layers whose K is at most this
};
int run_imatrix(ImatrixArgs a);

struct ConvertArgs {
  ModelArgs m;
  std::string out;
};
int run_convert(const ConvertArgs& a);

struct InspectArgs {
  ModelArgs m;
};
int run_inspect(const InspectArgs& a);

struct FitArgs {
  ModelArgs m;
  std::string memory;  // a byte count ("8G", "512MiB", "3000000000"); empty: no budget
};
// `cider fit`: the memory of a CPU run — the loaded model (measured: resident after loading and the peak of loading),
// the activations of a pass and the KV cache at --ctx for every cache format side by side, the run's peak (the larger
// of the loading peak and loaded + activations + KV), and with --memory the largest context each format fits in it.
int run_fit(const FitArgs& a);
// "8G", "8GiB", "512M", "1.5G", "3000000000", "4000MB": K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB
// powers of 1000; cider::Error (kInvalidArgument, op "options") naming `what` otherwise.
int64_t parse_byte_count(const std::string& s, const char* what);

}  // namespace cider::apps
