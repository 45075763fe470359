// cider — the command-line tool: generate, chat, tokenize, logits, perplexity, convert, inspect, fit (apps/cli.h), the
// kernel benchmark (apps/bench.h) and the KV-cache demo. CLI11 parses; usage errors keep CLI11's exit codes, every other error is printed as
// "cider: error: <message>" with exit status 2.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <new>

#include "apps/bench.h"
#include "apps/cli.h"
#include "apps/demo.h"
#include "apps/serve.h"
#include "cider/cider.h"
#include "core/error.h"

namespace {

using cider::apps::ModelArgs;

// The options of every model command. Values are checked by the commands (one rule each, one message each).
struct ModelOptionHandles {
  CLI::Option* model = nullptr;
  CLI::Option* group = nullptr;
  CLI::Option* threads = nullptr;
  // The "given" flags of the options whose absence means a default chosen later.
  void apply(ModelArgs& m) const {
    m.model_given = model->count() > 0;
    m.kv_group_size_given = group->count() > 0;
    m.threads_given = threads->count() > 0;
  }
};

ModelOptionHandles add_model_options(CLI::App* c, ModelArgs& m) {
  ModelOptionHandles h;
  h.model = c->add_option("-m,--model", m.model, "model directory (Hugging Face, MLX, cider) or .gguf file; default: the "
                                       "embedded cider-tiny");
  c->add_option("--weights", m.weights, std::string("linear weights: ").append(cider::model::weight_format_names())
                                             .append("; default: native for a .gguf file or a directory converted with "
                                                     "--weights native, else bf16"));
  c->add_option("--kv", m.kv,
                "KV cache: bf16, f16, f32 or k<bits>v<bits> (k8v8, k5v4, k4v4, k4v3, ...); default: per-channel keys "
                "with head_dim/32 outlier key channels, on cpu k4v4 with symmetric values and --kv-recent exact, on "
                "cuda k5v4 (docs/quality.md)");
  c->add_option("--kv-rotation", m.kv_rotation,
                "rotation of a quantized KV cache: so4-full, so4-fast, hadamard, none (default hadamard; with "
                "per-channel keys it rotates the values)");
  c->add_option("--kv-layout", m.kv_layout,
                "key layout of a quantized KV cache: token (groups along the head) or channel (per channel over "
                "blocks of group-size positions, the newest block kept in bf16); default: the default cache's, "
                "token with an explicit --kv");
  c->add_option("--kv-outliers", m.kv_outliers,
                "with per-channel keys: this many channels per block and KV head (those the queries weigh most) get "
                "4 more bits: a count (0 = none) or auto (head_dim/32); default: the default cache's (auto), 0 "
                "with an explicit --kv (docs/quality.md)");
  c->add_option("--kv-values", m.kv_values,
                "value codes of a quantized KV cache: affine (a scale and a bias per group) or symmetric (a step per "
                "group, no bias: 0.25 bits per value less at group 64, llama.cpp's q4_0 kind; cpu only); default: "
                "symmetric for the default cache on cpu, affine otherwise");
  c->add_option("--kv-recent", m.kv_recent,
                "with per-channel keys: quantized, or exact (each query reads its own block of group-size positions "
                "unquantized, keys and values in bfloat16: the same result however a prompt is split into chunks; "
                "cpu only); default: the default cache's");
  h.group = c->add_option("--kv-group-size", m.kv_group_size,
                          "quantization group of a quantized KV cache: 32, 64, 128 (per-channel keys: blocks of "
                          "that many positions); default: 128 for the cpu's default cache, else 64 (the largest of "
                          "128/64/32 dividing head_dim where the default does not)");
  c->add_flag("--kv-full-sliding", m.kv_full_sliding,
              "sliding-window layers keep every position in the KV cache (default: only their window)");
  c->add_option("--ctx", m.ctx, "context length in tokens (0 = the model's maximum)");
  c->add_option("--imatrix", m.imatrix,
                "an importance file from `cider imatrix`: a requantizing --weights (q4_k_m, q4_0, ...) fits each "
                "block to the error weighted by its inputs' mean squares");
  c->add_option("--head-weights", m.head_weights,
                "the LM head's block type with a requantizing --weights: q8_0 (the default), q6_k, q5_1, q5_0, q4_k, "
                "q4_1 or q4_0; with an --imatrix holding second moments (--hessian) a tied head is GPTQ-coded apart "
                "from the embedding");
  c->add_flag("--no-repack", m.no_repack,
              "keep native GGUF weights in the file's row order on the cpu: the file is mapped as it is (the fastest "
              "load) instead of rearranging the Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K rows for the AVX2 kernels, which costs "
              "a copy of those tensors at load (a 7B: about 10 s on a 2-core VM) and decodes 10-30% faster "
              "(docs/benchmarks.md); llama.cpp's --no-repack");
  c->add_option("--device", m.device, "where the model runs: cpu or cuda (a CUDA build and an sm_90 GPU)")
      ->capture_default_str();
  c->add_option("--tp", m.tp,
                "tensor parallelism: split the model over this many GPUs of the host (--device cuda; NCCL)")
      ->capture_default_str();
  c->add_flag("--progress", m.progress, "draw progress bars even when stderr is not a terminal");
  h.threads = c->add_option("--threads", m.threads,
                            "worker threads, at most 4 per CPU (default: $CIDER_NUM_THREADS or all CPUs)");
  return h;
}

struct SamplingOptions {
  CLI::Option* seed = nullptr;
};

SamplingOptions add_sampling_options(CLI::App* c, cider::model::SamplerParams& s, int64_t& max_tokens) {
  c->add_option("--max-tokens", max_tokens, "tokens to generate at most")->capture_default_str();
  c->add_option("--temperature", s.temperature, "sampling temperature (0 = greedy)")->capture_default_str();
  c->add_option("--top-k", s.top_k, "keep the k most probable tokens (0 = off)")->capture_default_str();
  c->add_option("--top-p", s.top_p, "nucleus: keep the most probable tokens up to this mass (1 = off)")
      ->capture_default_str();
  c->add_option("--min-p", s.min_p, "drop tokens below min-p x the top probability (0 = off)")->capture_default_str();
  c->add_option("--repeat-penalty", s.repeat_penalty, "penalty on recently seen tokens (1 = off)")
      ->capture_default_str();
  c->add_option("--repeat-last-n", s.repeat_window, "how many recent tokens the penalty sees (0 = all)")
      ->capture_default_str();
  SamplingOptions o;
  o.seed = c->add_option("--seed", s.seed, "random seed in [0, 2^64) (default: a fresh one, printed with the stats)")
               ->check(CLI::Validator(
                   [](std::string& v) {
                     const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
                     const bool fits = v.size() < 20 || (v.size() == 20 && v <= "18446744073709551615");
                     return digits && fits ? std::string()
                                           : "must be an integer in [0, 2^64 - 1]; got " + v;
                   },
                   "SEED"));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cider: run language models in low-bit precision on x86 CPUs"};
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

  cider::apps::GenerateArgs gen;
  CLI::App* gen_cmd = app.add_subcommand("generate", "continue a prompt, streaming the text");
  const ModelOptionHandles gen_threads = add_model_options(gen_cmd, gen.m);
  gen_cmd->add_option("-p,--prompt", gen.prompt, "the prompt text")->required();
  const SamplingOptions gen_sampling = add_sampling_options(gen_cmd, gen.sampling, gen.max_tokens);
  gen_cmd->add_option("--stop", gen.stop, "stop when the text contains this string (repeatable; not printed)");
  gen_cmd->add_flag("--no-stream", gen.no_stream, "print the text at the end instead of token by token");
  gen_cmd->add_flag("--echo", gen.echo, "print the prompt before the continuation");
  gen_cmd->add_option("--prefill-chunk", gen.prefill_chunk,
                      "prompt tokens per forward pass (the CPU runs 256 at a time inside, CUDA $CIDER_PREFILL_CHUNK)")
      ->capture_default_str();

  cider::apps::ChatArgs chat;
  CLI::App* chat_cmd = app.add_subcommand("chat", "chat on stdin, one message per line (/reset, /exit)");
  const ModelOptionHandles chat_threads = add_model_options(chat_cmd, chat.m);
  const SamplingOptions chat_sampling = add_sampling_options(chat_cmd, chat.sampling, chat.max_tokens);
  chat_cmd->add_option("--chat-format", chat.chat_format,
                       "chatml, llama3, gemma, mistral, llama2, phi3 or raw (default: from the model)");
  chat_cmd->add_option("--system", chat.system, "system message");
  chat_cmd->add_flag("--stats", chat.stats, "print the statistics line after each reply");
  chat_cmd->add_option("--prefill-chunk", chat.prefill_chunk,
                       "prompt tokens per forward pass (the CPU runs 256 at a time inside, CUDA $CIDER_PREFILL_CHUNK)")
      ->capture_default_str();

  cider::apps::TokenizeArgs tokz;
  CLI::App* tok_cmd = app.add_subcommand("tokenize", "print the token ids of a text (comma-separated)");
  CLI::Option* tok_model =
      tok_cmd->add_option("-m,--model", tokz.m.model, "model directory or .gguf file (default: the embedded model)");
  CLI::Option* tok_text = tok_cmd->add_option("--text", tokz.text, "the text");
  tok_cmd->add_option("-f,--file", tokz.file, "a text file (instead of --text)");
  tok_cmd->add_flag("--no-special", tokz.no_special, "do not add special tokens (BOS)");
  tok_cmd->add_flag("--count", tokz.count, "print only the number of tokens");

  cider::apps::LogitsArgs logits;
  CLI::App* logits_cmd = app.add_subcommand("logits", "write the logits of every position as a float32 .npy file");
  const ModelOptionHandles logits_threads = add_model_options(logits_cmd, logits.m);
  logits_cmd->add_option("--tokens", logits.tokens, "token ids, comma-separated (e.g. 1,2,3)")->required();
  logits_cmd->add_option("--out", logits.out, "output .npy file ([n_tokens, vocab])")->required();

  cider::apps::PerplexityArgs ppl;
  CLI::App* ppl_cmd = app.add_subcommand(
      "perplexity", "perplexity of a text file; with a baseline configuration also mean KL and top-1 agreement");
  const ModelOptionHandles ppl_threads = add_model_options(ppl_cmd, ppl.m);
  ppl_cmd->add_option("-f,--file", ppl.file, "text file")->required();
  ppl_cmd->add_flag("--llama-windows", ppl.llama_windows,
                    "cut the windows as llama.cpp's llama-perplexity does (non-overlapping, BOS replacing the first "
                    "token, the second half scored): numbers comparable with its Final estimate");
  ppl_cmd->add_option("--stride", ppl.stride,
                      "window stride in tokens (default: non-overlapping windows; counted in text tokens, at most "
                      "--ctx - 1, when every window starts with BOS)");
  ppl_cmd->add_option("--baseline-weights", ppl.baseline_weights, "weights of the baseline configuration");
  ppl_cmd->add_option("--baseline-kv", ppl.baseline_kv, "KV cache of the baseline configuration");
  ppl_cmd->add_option("--llama-logits", ppl.llama_logits,
                      "the baseline is llama.cpp: the file `llama-perplexity --kl-divergence-base FILE` wrote on the "
                      "same text and model (implies --llama-windows; --ctx 0 takes the file's; its tokens must be "
                      "cider's)");

  cider::apps::ConvertArgs conv;
  CLI::App* conv_cmd = app.add_subcommand("convert", "write the model in cider's format with --weights");
  const ModelOptionHandles conv_threads = add_model_options(conv_cmd, conv.m);
  conv_cmd->add_option("-o,--out", conv.out, "output directory (must not exist)")->required();

  cider::apps::ImatrixArgs imx;
  CLI::App* imx_cmd = app.add_subcommand(
      "imatrix", "activation statistics of a calibration text: each linear layer's mean squared input per channel, "
                 "for --imatrix (activation-aware block fits)");
  const ModelOptionHandles imx_threads = add_model_options(imx_cmd, imx.m);
  imx_cmd->add_option("-f,--file", imx.file, "calibration text (not the text you will evaluate on)")->required();
  imx_cmd->add_option("-o,--out", imx.out, "output file (safetensors)")->required();
  imx_cmd->add_option("--chunks", imx.chunks, "windows of --ctx tokens at most (0: every whole window)")
      ->capture_default_str();
  imx_cmd->add_flag("--hessian", imx.hessian,
                    "also each layer's input second moments (K x K): a requantizing --weights then codes with GPTQ's "
                    "error feedback");
  imx_cmd->add_option("--hessian-max-k", imx.hessian_max_k,
                      "second moments only for layers with at most this many input channels (each costs K^2 floats, "
                      "and O(K^3) when loading); wider layers keep the diagonal")
      ->capture_default_str();

  cider::apps::InspectArgs insp;
  CLI::App* insp_cmd = app.add_subcommand("inspect", "configuration, tensors, formats and bytes of a model");
  const ModelOptionHandles insp_threads = add_model_options(insp_cmd, insp.m);

  cider::apps::FitArgs fit;
  CLI::App* fit_cmd = app.add_subcommand(
      "fit", "memory of a CPU run: the loaded model, activations and the KV cache at --ctx for every cache format; "
             "with --memory the largest context each fits");
  const ModelOptionHandles fit_threads = add_model_options(fit_cmd, fit.m);
  fit_cmd->add_option("--memory", fit.memory, "a memory budget: 8G, 512MiB, 4000MB or bytes");

  cider::apps::ServeArgs serve;
  CLI::App* serve_cmd = app.add_subcommand(
      "serve", "an OpenAI-compatible HTTP server with continuous batching and a prefix cache (docs/serve.md)");
  const ModelOptionHandles serve_threads = add_model_options(serve_cmd, serve.m);
  serve_cmd->add_option("--host", serve.host, "address to listen on")->capture_default_str();
  serve_cmd->add_option("--port", serve.port, "port (0: any free port, printed)")->capture_default_str();
  serve_cmd->add_option("--max-batch", serve.max_batch, "sequences decoded together at most")->capture_default_str();
  serve_cmd->add_option("--kv-memory", serve.kv_memory,
                        "KV cache bytes for running and prefix-cached sequences (8G, 512MiB, ...); admission reserves "
                        "each request's prompt + max_tokens; default: max-batch full contexts");
  serve_cmd->add_option("--max-waiting", serve.max_waiting, "requests queued beyond the batch; more get 429")
      ->capture_default_str();
  serve_cmd->add_option("--prefix-cache", serve.prefix_cache,
                        "finished sequences whose KV is kept for requests sharing a prefix (0: off)")
      ->capture_default_str();
  serve_cmd->add_flag("--no-prefix-sharing", serve.no_prefix_sharing,
                      "copy a reused prefix into each request instead of sharing its blocks (memory comparisons)");
  serve_cmd->add_option("--prompt-cache", serve.prompt_cache,
                        "a directory that keeps the prefix cache across restarts: one file per cached sequence, "
                        "loaded at start (CPU device)");
  serve_cmd->add_option("--step-tokens", serve.step_tokens,
                        "rows per batched forward: decode rows first, then prompt chunks (at most one pass of the "
                        "model; 0: one pass: 256 rows on the CPU, the prefill chunk on CUDA, 2048)")
      ->capture_default_str();
  serve_cmd->add_option("--api-key", serve.api_key, "require 'Authorization: Bearer KEY' on /v1/ (or $CIDER_API_KEY)");
  serve_cmd->add_option("--chat-format", serve.chat_format,
                        "a built-in chat format instead of the model's template: chatml, llama3, gemma, mistral, llama2, "
                        "phi3 or raw");
  serve_cmd->add_option("--chat-template", serve.chat_template,
                        "a Jinja chat template file to render chat prompts with (default: the model's own)");
  serve_cmd->add_option("--model-name", serve.model_name, "the model id the API reports (default: the file name)");
  serve_cmd->add_option("--max-body", serve.max_body, "request body limit in bytes (413 above)")->capture_default_str();
  serve_cmd->add_option("--drain-seconds", serve.drain_seconds,
                        "on SIGINT/SIGTERM, how long running requests may finish")
      ->capture_default_str();

  cider::apps::BenchOptions bench;
  CLI::App* bench_cmd = cider::apps::add_bench_command(app, bench);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*demo_cmd) return cider::apps::run_demo(demo);
    if (*bench_cmd) return cider::apps::run_bench(bench);
    if (*gen_cmd) {
      gen_threads.apply(gen.m);
      gen.seed_given = gen_sampling.seed->count() > 0;
      return cider::apps::run_generate(gen);
    }
    if (*chat_cmd) {
      chat_threads.apply(chat.m);
      chat.seed_given = chat_sampling.seed->count() > 0;
      return cider::apps::run_chat(chat);
    }
    if (*tok_cmd) {
      tokz.m.model_given = tok_model->count() > 0;
      tokz.text_given = tok_text->count() > 0;
      return cider::apps::run_tokenize(tokz);
    }
    if (*logits_cmd) {
      logits_threads.apply(logits.m);
      return cider::apps::run_logits(logits);
    }
    if (*ppl_cmd) {
      ppl_threads.apply(ppl.m);
      return cider::apps::run_perplexity(ppl);
    }
    if (*conv_cmd) {
      conv_threads.apply(conv.m);
      return cider::apps::run_convert(conv);
    }
    if (*imx_cmd) {
      imx_threads.apply(imx.m);
      return cider::apps::run_imatrix(imx);
    }
    if (*fit_cmd) {
      fit_threads.apply(fit.m);
      return cider::apps::run_fit(fit);
    }
    if (*serve_cmd) {
      serve_threads.apply(serve.m);
      return cider::apps::run_serve(serve);
    }
    if (*insp_cmd) {
      insp_threads.apply(insp.m);
      return cider::apps::run_inspect(insp);
    }
  } catch (const cider::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "cider: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "cider: error: out of memory: an allocation failed (std::bad_alloc); the model, --ctx or the input "
                 "needs more memory than this machine gives the process\n");
    return 2;
  } catch (const std::exception& e) {  // still a message and a status, never a crash
    std::fflush(stdout);
    std::fprintf(stderr, "cider: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
