#include "apps/cli.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "core/thread_pool.h"
#include "model/activation_stats.h"
#include "model/chat_format.h"
#include "model/convert.h"
#include "model/generate.h"
#include "model/gguf.h"
#include "model/npy.h"
#include "model/llama_logits.h"
#include "model/perplexity.h"
#include "model/safetensors.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "nn/kv_cache.h"

namespace cider::apps {

namespace fs = std::filesystem;

namespace {

// A one-line bar on stderr, redrawn in place ("\r") when the whole percentage or the stage changes; a finished
// stage keeps its line.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled) {}
  ~ProgressBar() { finish(); }
  void update(const std::string& stage, int64_t done, int64_t total) {
    if (!enabled_ || total <= 0) return;
    const int pct = static_cast<int>(std::min<int64_t>(100, done * 100 / total));
    if (stage == stage_ && pct == pct_) return;
    if (active_ && stage != stage_) std::fputc('\n', stderr);
    stage_ = stage;
    pct_ = pct;
    constexpr int kWidth = 30;
    const int filled = pct * kWidth / 100;
    std::fprintf(stderr, "\r%-14s [%s%s] %3d%% (%lld/%lld)", stage.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), pct, static_cast<long long>(done),
                 static_cast<long long>(total));
    std::fflush(stderr);
    active_ = true;
  }
  void finish() {
    if (active_) std::fputc('\n', stderr);
    active_ = false;
    stage_.clear();
    pct_ = -1;
  }

 private:
  bool enabled_;
  bool active_ = false;
  std::string stage_;
  int pct_ = -1;
};

bool progress_enabled(const ModelArgs& a) { return a.progress || isatty(STDERR_FILENO) == 1; }

}  // namespace

std::unique_ptr<model::Model> load_model(const ModelArgs& a, const model::ModelOptions& o, const std::string& path) {
  ProgressBar bar(progress_enabled(a));
  auto m = model::Model::load(path, o, [&](const char* stage, int64_t d, int64_t t) { bar.update(stage, d, t); });
  return m;
}

namespace {

void check_prefill_chunk(int64_t chunk) {
  check(chunk >= 1, ErrorCode::kInvalidArgument, "options", "--prefill-chunk must be >= 1; got ", chunk);
}

void check_sampling(const model::SamplerParams& s, int64_t max_tokens) {
  model::validate_sampler_params(s);
  check(max_tokens >= 0, ErrorCode::kInvalidArgument, "options", "--max-tokens must be >= 0; got ", max_tokens);
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

void write_out(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

// The tokenizer alone, without loading weights: tokenizer.json or tokenizer.gguf of a directory, or a .gguf file.
model::Tokenizer load_tokenizer(const std::string& path) {
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / "tokenizer.json"))
      return model::Tokenizer::from_json_file((fs::path(path) / "tokenizer.json").string());
    if (fs::exists(fs::path(path) / "tokenizer.gguf"))
      return model::Tokenizer::from_gguf(*model::GGUFFile::open((fs::path(path) / "tokenizer.gguf").string()));
    fail(ErrorCode::kIo, "tokenize", "the model directory must hold tokenizer.json or tokenizer.gguf; got neither in \"",
         path, "\"");
  }
  return model::Tokenizer::from_gguf(*model::GGUFFile::open(path));
}

}  // namespace

model::ChatFormat chat_format_for(const model::Model& m, const std::string& name) {
  if (!name.empty()) return model::parse_chat_format(name);
  const model::Tokenizer& tok = m.tokenizer();
  return model::default_chat_format(m.config().arch, [&](std::string_view t) { return tok.token_to_id(t) >= 0; });
}

std::string describe(const model::ModelOptions& o) {
  std::string d = std::string("weights ") + model::weight_format_name(o.weights);
  if (!o.imatrix.empty()) d += " (imatrix " + fs::path(o.imatrix).filename().string() + ")";
  if (o.head_weights) d += std::string(", head ") + model::weight_format_name(*o.head_weights);
  d += ", kv " + model::kv_format_name(o.kv);
  if (o.device != model::Device::kCPU) d += std::string(", device ") + model::device_name(o.device);
  if (o.tp > 1) d += ", tp " + std::to_string(o.tp);
  return d;
}

namespace {
// --kv-outliers N: digits (KVSpec::validate checks the range and the layout).
int parse_outlier_count(const std::string& s) {
  const bool digits = !s.empty() && s.size() <= 6 && s.find_first_not_of("0123456789") == std::string::npos;
  check(digits, ErrorCode::kInvalidArgument, "options", "--kv-outliers must be auto or a count in [0, ",
        nn::kMaxKeyOutliers, "]; got \"", s, "\"");
  return std::stoi(s);
}
}  // namespace

model::ModelOptions model_options(const ModelArgs& a) {
  model::ModelOptions o;
  o.device = model::parse_device(a.device);
  o.kernel_layout = !a.no_repack;
  if (a.weights.empty()) {  // from the path as given (no existence check here: the options are checked first)
    const char* env = std::getenv("CIDER_DEFAULT_MODEL");
    o.weights = model::default_weights(!a.model.empty() ? a.model : env != nullptr ? env : "", o.device);
  } else {
    o.weights = model::parse_weight_format(a.weights);
  }
  // No --kv: the engine's default for the device; an explicit --kv takes KVSpec's defaults (hadamard, token).
  o.kv = a.kv.empty() ? model::default_kv(o.device) : model::parse_kv_format(a.kv);
  check(nn::is_kv_group_size(a.kv_group_size), ErrorCode::kInvalidArgument,
        "options", "--kv-group-size must be one of 32, 64, 128; got ", a.kv_group_size);
  if (o.kv.quantized) {  // a plain cache is neither rotated nor grouped
    if (!a.kv_rotation.empty()) o.kv.rotation = model::parse_kv_rotation(a.kv_rotation);
    if (!a.kv_layout.empty()) o.kv.key_layout = nn::parse_key_layout(a.kv_layout);
    if (!a.kv_values.empty()) o.kv.v_symmetric = nn::parse_value_codes(a.kv_values);
    if (!a.kv_recent.empty())
      o.kv.recent_exact = nn::parse_recent(a.kv_recent);
    else if (o.kv.key_layout != nn::KeyLayout::kChannel)
      o.kv.recent_exact = false;  // keys per position (the default's turned to token): no residual windows
    if (a.kv_group_size_given || !a.kv.empty()) o.kv.group_size = a.kv_group_size;  // else the default cache's
    o.kv.group_size_auto = !a.kv_group_size_given;
    if (a.kv_outliers == "auto") {
      o.kv.key_outliers = 0;
      o.kv.key_outliers_auto = true;
    } else if (!a.kv_outliers.empty()) {
      o.kv.key_outliers = parse_outlier_count(a.kv_outliers);
      o.kv.key_outliers_auto = false;
    } else if (!a.kv.empty()) {  // an explicit --kv: none unless asked for
      o.kv.key_outliers_auto = false;
    }
    o.kv.validate("options");  // --kv-outliers: a count in range, with per-channel keys
    // The engine's default only when nothing of the cache was chosen (then Model::load may adapt it to the model).
    o.kv.device_default = a.kv.empty() && a.kv_rotation.empty() && a.kv_layout.empty() && a.kv_outliers.empty() &&
                          a.kv_values.empty() && a.kv_recent.empty() &&
                          !a.kv_group_size_given;
  } else {
    check(a.kv_outliers.empty() || a.kv_outliers == "0", ErrorCode::kInvalidArgument, "options",
          "--kv-outliers refines per-channel keys of a quantized cache; a plain KV cache (--kv ", a.kv,
          ") has none: it must be 0; got ", a.kv_outliers);
    check(a.kv_recent.empty() || !nn::parse_recent(a.kv_recent), ErrorCode::kInvalidArgument, "options",
          "--kv-recent exact reads a quantized cache's recent block unquantized; a plain KV cache (--kv ", a.kv,
          ") is read as it is stored");
    check(a.kv_values.empty() || !nn::parse_value_codes(a.kv_values), ErrorCode::kInvalidArgument, "options",
          "--kv-values symmetric chooses a quantized cache's value codes; a plain KV cache (--kv ", a.kv,
          ") stores its values as they are");
    if (!a.kv_rotation.empty()) (void)model::parse_kv_rotation(a.kv_rotation);  // still a valid name
    if (!a.kv_layout.empty())
      check(nn::parse_key_layout(a.kv_layout) == nn::KeyLayout::kToken, ErrorCode::kInvalidArgument, "options",
            "a plain KV cache (--kv ", a.kv, ") stores keys per position: --kv-layout must be token; got ",
            a.kv_layout);
  }
  check(a.ctx >= 0, ErrorCode::kInvalidArgument, "options", "--ctx must be >= 0 (0 = the model's maximum); got ",
        a.ctx);
  if (a.threads_given) {
    const int hi = max_num_threads();
    check(a.threads >= 1 && a.threads <= hi, ErrorCode::kInvalidArgument, "options", "--threads must be in [1, ", hi,
          "] (at most ", limits::kThreadsPerCpu, " per CPU this process may use: ", available_cpus(), "); got ",
          a.threads);
    set_num_threads(a.threads);
  }
  o.ctx = a.ctx;
  o.kv_full_sliding = a.kv_full_sliding;
  o.imatrix = a.imatrix;
  if (!a.head_weights.empty()) o.head_weights = model::parse_weight_format(a.head_weights);
  check(a.tp >= 1 && a.tp <= model::kMaxTensorParallel, ErrorCode::kInvalidArgument, "options", "--tp must be in [1, ",
        model::kMaxTensorParallel, "]; got ", a.tp);
  check(a.tp == 1 || o.device == model::Device::kCUDA, ErrorCode::kInvalidArgument, "options", "--tp ", a.tp,
        " splits the model over GPUs: it needs --device cuda");
  o.tp = a.tp;
  return o;
}

std::string resolve_model_path(const ModelArgs& a) {
  check(!a.model_given || !a.model.empty(), ErrorCode::kInvalidArgument, "options",
        "-m must name a model directory or .gguf file; got \"\" (leave -m out for the embedded model)");
  return resolve_model_path(a.model);
}

std::string resolve_model_path(const std::string& given) {
  if (!given.empty()) {
    check(fs::exists(given), ErrorCode::kIo, "model", "the model path must exist; got \"", given, "\"");
    return given;
  }
  std::vector<std::string> tried;
  if (const char* env = std::getenv("CIDER_DEFAULT_MODEL"); env != nullptr && *env != '\0') {
    check(fs::exists(env), ErrorCode::kIo, "model", "$CIDER_DEFAULT_MODEL must name an existing model; got \"", env,
          "\"");
    return env;
  }
  tried.push_back("$CIDER_DEFAULT_MODEL (unset)");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path p = (exe.parent_path() / ".." / "models" / "cider-tiny").lexically_normal();
    if (fs::exists(p / "config.json")) return p.string();
    tried.push_back(p.string());
  }
  // This file's own path, as the compiler saw it (absolute under CMake): the source tree's copy of the model.
  const fs::path src = (fs::path(__FILE__).parent_path().parent_path() / "models" / "cider-tiny").lexically_normal();
  if (fs::exists(src / "config.json")) return src.string();
  tried.push_back(src.string());
  std::string where;
  for (const auto& t : tried) {
    if (!where.empty()) where += ", ";
    where += t;
  }
  fail(ErrorCode::kIo, "model", "no -m given and the embedded default model cider-tiny was not found (looked in ",
       where, "); pass -m PATH or set CIDER_DEFAULT_MODEL");
}

std::vector<int32_t> parse_token_list(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    const std::string item = s.substr(i, j - i);
    size_t used = 0;
    long long v = -1;
    bool ok = !item.empty() && item.find_first_not_of("0123456789 ") == std::string::npos;
    if (ok) {
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        ok = false;
      }
    }
    check(ok && v >= 0 && v <= INT32_MAX, ErrorCode::kInvalidArgument, "options",
          "--tokens must be comma-separated non-negative integer ids (e.g. 1,2,3); got \"", s, "\" (item \"", item,
          "\")");
    ids.push_back(static_cast<int32_t>(v));
    i = j + 1;
  }
  return ids;
}

int run_generate(GenerateArgs a) {
  const model::ModelOptions opts = model_options(a.m);
  check_sampling(a.sampling, a.max_tokens);
  check_prefill_chunk(a.prefill_chunk);
  for (const auto& s : a.stop)
    check(!s.empty(), ErrorCode::kInvalidArgument, "options", "--stop strings must not be empty; got \"\"");
  if (!a.seed_given) a.sampling.seed = fresh_seed();
  const std::string path = resolve_model_path(a.m);
  const auto t_load = std::chrono::steady_clock::now();
  auto model = load_model(a.m, opts, path);  // read, and convert to --weights
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const model::Tokenizer& tok = model->tokenizer();
  const std::vector<int32_t> prompt = tok.encode(a.prompt, /*add_special=*/true);

  auto session = model->new_session();
  model::ModelLogitsSource source(*model, *session);
  model::TokenizerTextStream text(tok, prompt.empty() ? -1 : prompt.back());
  model::Sampler sampler(a.sampling);
  model::GenerateOptions go;
  go.max_tokens = a.max_tokens;
  go.prefill_chunk = a.prefill_chunk;
  go.stop = a.stop;
  go.eos_ids = model::model_eos_ids(*model);
  std::vector<int32_t> history;
  if (a.echo) write_out(a.prompt);
  model::TextCallback stream;
  if (!a.no_stream) stream = [](std::string_view piece) { write_out(piece); };
  const model::GenerationResult r = model::generate(source, text, sampler, history, prompt, go, stream);
  if (a.no_stream) write_out(r.text);
  write_out("\n");
  char load[48];
  std::snprintf(load, sizeof load, "load %.2f s | ", load_seconds);
  std::string line = load + r.stats.line() + " | " + describe(model->options()) + " | stop: " +
                     model::stop_reason_name(r.reason);
  if (a.sampling.temperature > 0) line += " | seed " + std::to_string(a.sampling.seed);
  std::fprintf(stderr, "%s\n", line.c_str());
  return 0;
}

int run_chat(ChatArgs a) {
  const model::ModelOptions opts = model_options(a.m);
  check_sampling(a.sampling, a.max_tokens);
  check_prefill_chunk(a.prefill_chunk);
  if (!a.chat_format.empty()) (void)model::parse_chat_format(a.chat_format);
  if (!a.seed_given) a.sampling.seed = fresh_seed();
  const std::string path = resolve_model_path(a.m);
  auto model = load_model(a.m, opts, path);
  const model::Tokenizer& tok = model->tokenizer();
  const model::ChatFormat format = chat_format_for(*model, a.chat_format);

  model::GenerateOptions go;
  go.max_tokens = a.max_tokens;
  go.prefill_chunk = a.prefill_chunk;
  go.eos_ids = model::model_eos_ids(*model);
  for (const auto& t : model::chat_end_tokens(format))
    if (const int32_t id = tok.token_to_id(t); id >= 0) go.eos_ids.push_back(id);

  const bool interactive = isatty(STDIN_FILENO) == 1;
  if (interactive)
    std::fprintf(stderr, "cider chat: %s format, %s; /reset starts over, /exit quits\n", model::chat_format_name(format),
                 describe(opts).c_str());
  auto session = model->new_session();
  model::Sampler sampler(a.sampling);
  std::vector<int32_t> history;
  bool first_turn = true;
  int32_t pending = -1;  // the last reply's final token, sampled but not yet in the session
  std::string line;
  while (true) {
    if (interactive) write_out("> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit") break;
    if (line == "/reset") {
      session = model->new_session();
      history.clear();
      first_turn = true;
      pending = -1;
      continue;
    }
    if (line.empty()) continue;
    // Only the new turn goes through the model: the previous reply's end, then the user's turn up to the
    // assistant's header. The first turn gets BOS from encode.
    const std::string turn_text =
        (first_turn ? std::string() : model::chat_reply_end(format)) + model::chat_user_turn(format, line, a.system, first_turn);
    std::vector<int32_t> turn;
    if (pending >= 0) turn.push_back(pending);
    std::vector<int32_t> enc;
    try {
      enc = tok.encode(turn_text, /*add_special=*/first_turn);
    } catch (const Error& e) {
      // One bad line (e.g. invalid UTF-8) is refused; the conversation goes on.
      std::fprintf(stderr, "cider: error: %s; the line was not sent\n", e.what());
      continue;
    }
    turn.insert(turn.end(), enc.begin(), enc.end());
    model::ModelLogitsSource source(*model, *session);
    model::TokenizerTextStream text(tok, turn.empty() ? -1 : turn.back());
    model::GenerationResult r;
    try {
      r = model::generate(source, text, sampler, history, turn, go, [](std::string_view p) { write_out(p); });
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kOutOfRange) throw;
      // The conversation no longer fits: say so and keep the session usable (nothing was run).
      std::fprintf(stderr, "cider: error: %s; type /reset to start a new conversation\n", e.what());
      continue;
    }
    write_out("\n");
    first_turn = false;
    // An EOS is replaced by the format's own reply end on the next turn; any other final token must go in.
    pending = (r.last_token_pending && r.reason != model::StopReason::kEos) ? r.tokens.back() : -1;
    if (a.stats) std::fprintf(stderr, "%s | stop: %s\n", r.stats.line().c_str(), model::stop_reason_name(r.reason));
  }
  return 0;
}

int run_tokenize(const TokenizeArgs& a) {
  check(a.text_given != !a.file.empty(), ErrorCode::kInvalidArgument, "options",
        "tokenize needs exactly one of --text and -f/--file; got ",
        a.text_given ? "both" : "neither");
  const std::string text = a.text_given ? a.text : read_text_input(a.file, "tokenize");
  const std::string path = resolve_model_path(a.m);
  const model::Tokenizer tok = load_tokenizer(path);
  const std::vector<int32_t> ids = tok.encode(text, /*add_special=*/!a.no_special);
  if (a.count) {
    write_out(std::to_string(ids.size()) + "\n");
    return 0;
  }
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  write_out(out + "\n");
  return 0;
}

int run_logits(const LogitsArgs& a) {
  const model::ModelOptions opts = model_options(a.m);
  const std::vector<int32_t> ids = parse_token_list(a.tokens);
  check(!a.out.empty(), ErrorCode::kInvalidArgument, "options", "--out must name the .npy file to write; got \"\"");
  const std::string path = resolve_model_path(a.m);
  check_output_path(a.out, {path}, "logits", "--out");  // before the model loads: a bad path fails at once
  auto model = load_model(a.m, opts, path);
  const int64_t vocab = model->config().vocab_size, n = static_cast<int64_t>(ids.size());
  for (int32_t id : ids)
    check(id < vocab, ErrorCode::kInvalidArgument, "logits", "--tokens ids must be below the vocabulary size ", vocab,
          "; got ", id);
  check(n <= model->context_length(), ErrorCode::kOutOfRange, "logits", "--tokens must fit the context of ",
        model->context_length(), " tokens; got ", n, " tokens");
  std::vector<float> logits(static_cast<size_t>(n * vocab));
  auto session = model->new_session();
  model->forward(*session, ids.data(), n, logits.data(), /*all_logits=*/true);
  model::write_npy_f32(a.out, logits.data(), {n, vocab});
  std::fprintf(stderr, "wrote %s: float32 [%lld, %lld] (%s)\n", a.out.c_str(), static_cast<long long>(n),
               static_cast<long long>(vocab), describe(opts).c_str());
  return 0;
}

int run_perplexity(PerplexityArgs a) {
  const model::ModelOptions opts = model_options(a.m);
  check(a.m.ctx == 0 || a.m.ctx >= 2, ErrorCode::kInvalidArgument, "options",
        "--ctx (the window length) must be >= 2, or 0 for the model's context length; got ", a.m.ctx);
  check(a.stride >= 0 && (a.m.ctx == 0 || a.stride <= a.m.ctx), ErrorCode::kInvalidArgument, "options",
        "--stride must be in [1, --ctx] (0 = --ctx); got ", a.stride);
  const bool with_llama = !a.llama_logits.empty();
  check(!with_llama || (a.baseline_weights.empty() && a.baseline_kv.empty()), ErrorCode::kInvalidArgument, "options",
        "--llama-logits is the baseline: it excludes --baseline-weights and --baseline-kv");
  if (with_llama) a.llama_windows = true;
  std::unique_ptr<model::LlamaLogitsFile> llama;  // read before the model loads: a bad file fails at once
  if (with_llama) {
    llama = std::make_unique<model::LlamaLogitsFile>(a.llama_logits);
    check(a.m.ctx == 0 || a.m.ctx == llama->n_ctx(), ErrorCode::kInvalidArgument, "options", "--ctx must be ",
          llama->n_ctx(), " (the windows of ", a.llama_logits, ") or 0; got ", a.m.ctx);
    a.m.ctx = llama->n_ctx();
  }
  const bool with_baseline = !a.baseline_weights.empty() || !a.baseline_kv.empty();
  model::ModelOptions base_opts = opts;
  if (with_baseline) {
    ModelArgs b = a.m;
    b.threads_given = false;
    if (!a.baseline_weights.empty()) {  // its own weights: --imatrix is the tested format's
      b.weights = a.baseline_weights;
      b.imatrix.clear();
      b.head_weights.clear();
    }
    if (!a.baseline_kv.empty()) {  // its own cache: the tested cache's layout and rotation do not carry over
      b.kv = a.baseline_kv;
      b.kv_layout.clear();
      b.kv_rotation.clear();
      b.kv_outliers.clear();
      b.kv_values.clear();
      b.kv_recent.clear();
    }
    base_opts = model_options(b);
  }
  const std::string text = read_text_input(a.file, "perplexity");
  const std::string path = resolve_model_path(a.m);
  auto model = load_model(a.m, opts, path);
  std::unique_ptr<model::Model> base;
  if (with_baseline) base = load_model(a.m, base_opts, path);
  const model::Tokenizer& tok = model->tokenizer();
  const int32_t bos = model::bos_per_window(tok);  // BOS opens every window (model/perplexity.h)
  const bool bos_per_window = bos >= 0 && !a.llama_windows;
  check(!a.llama_windows || a.stride == 0, ErrorCode::kInvalidArgument, "options",
        "--llama-windows cuts non-overlapping windows: --stride must be 0; got ", a.stride);
  std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/!bos_per_window);
  model::WindowEvaluator llama_baseline;
  if (with_llama) {  // the same windows: llama.cpp's tokens are cider's, and as many windows as it saved
    check(llama->n_vocab() == model->config().vocab_size, ErrorCode::kInvalidArgument, "perplexity",
          "the vocabulary of ", a.llama_logits, " must be the model's ", model->config().vocab_size, "; got ",
          llama->n_vocab());
    const std::vector<int32_t>& lt = llama->tokens();
    check(tokens.size() >= lt.size(), ErrorCode::kInvalidArgument, "perplexity", "the text must give the ",
          lt.size(), " tokens of ", a.llama_logits, "; got ", tokens.size());
    for (size_t i = 0; i < lt.size(); ++i)
      check(tokens[i] == lt[i], ErrorCode::kInvalidArgument, "perplexity", "cider's tokens must be llama.cpp's: token ",
            i, " is ", tokens[i], " here and ", lt[i], " in ", a.llama_logits);
    tokens.resize(lt.size());
    llama_baseline = [&llama, chunk = int64_t{0}](const int32_t*, int64_t, float* logits) mutable {
      llama->read_chunk(chunk++, logits);
    };
  }

  ProgressBar bar(progress_enabled(a.m));
  model::PerplexityOptions po;
  po.ctx = a.m.ctx > 0 ? a.m.ctx : model->context_length();  // --ctx 0: the model's context length
  po.bos = bos;
  po.llama_windows = a.llama_windows;
  po.baseline_log_probs = with_llama;
  const int64_t max_stride = bos_per_window ? po.ctx - 1 : po.ctx;
  check(a.stride <= max_stride, ErrorCode::kInvalidArgument, "options", "--stride must be in [1, ", max_stride,
        bos_per_window ? "] text tokens (--ctx - 1: every window starts with BOS); got " : "] (0 = --ctx); got ",
        a.stride);
  po.stride = a.stride;
  const model::PerplexityResult r = model::evaluate_perplexity(
      tokens, model->config().vocab_size, po, model::window_evaluator(*model),
      with_llama ? llama_baseline : with_baseline ? model::window_evaluator(*base) : model::WindowEvaluator{},
      [&](int64_t d, int64_t t) { bar.update("perplexity", d, t); });
  bar.finish();
  std::string head = "model " + path + " | " + std::to_string(tokens.size()) +
                     (bos_per_window ? " text tokens" : " tokens") + " | ctx " + std::to_string(po.ctx) + " stride " +
                     std::to_string(r.stride) +
                     " | tested: " + describe(opts);
  if (with_baseline) head += " | baseline: " + describe(base_opts);
  if (with_llama) head += " | baseline: llama.cpp's log-probabilities from " + a.llama_logits;
  write_out(head + "\n" + r.report());
  return 0;
}

int run_imatrix(ImatrixArgs a) {
  if (a.m.ctx == 0) a.m.ctx = 512;
  check(a.m.ctx >= 2, ErrorCode::kInvalidArgument, "options", "--ctx (the window length) must be >= 2; got ", a.m.ctx);
  check(a.chunks >= 0, ErrorCode::kInvalidArgument, "options", "--chunks must be >= 0 (0: every whole window); got ",
        a.chunks);
  check(a.m.device == "cpu", ErrorCode::kInvalidArgument, "options",
        "cider imatrix records activations on the CPU: --device must be cpu; got ", a.m.device);
  const model::ModelOptions opts = model_options(a.m);
  const std::string path = resolve_model_path(a.m);
  check_output_path(a.out, {path, a.file}, "imatrix", "-o");  // before the model loads: a bad path fails at once
  const std::string text = read_text_input(a.file, "imatrix");
  auto model = load_model(a.m, opts, path);
  const model::Tokenizer& tok = model->tokenizer();
  const int32_t bos = model::bos_per_window(tok);  // as perplexity's windows: BOS, then ctx − 1 text tokens
  const std::vector<int32_t> tokens = tok.encode(text, /*add_special=*/bos < 0);
  const int64_t per = bos >= 0 ? a.m.ctx - 1 : a.m.ctx;
  int64_t windows = static_cast<int64_t>(tokens.size()) / per;
  if (a.chunks > 0) windows = std::min(windows, a.chunks);
  check(windows >= 1, ErrorCode::kInvalidArgument, "imatrix", "the text must give at least one window of ", per,
        " tokens (--ctx ", a.m.ctx, bos >= 0 ? ", BOS first" : "", "); got ", tokens.size(), " tokens");
  model::ActivationStats stats;
  check(a.hessian_max_k >= 1, ErrorCode::kInvalidArgument, "options", "--hessian-max-k must be >= 1; got ",
        a.hessian_max_k);
  stats.set_second_moments(a.hessian ? a.hessian_max_k : 0);
  model->record_activations(&stats);
  ProgressBar bar(progress_enabled(a.m));
  std::vector<float> logits(static_cast<size_t>(model->config().vocab_size));
  std::vector<int32_t> window;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    window.clear();
    if (bos >= 0) window.push_back(bos);
    window.insert(window.end(), tokens.begin() + w * per, tokens.begin() + (w + 1) * per);
    auto session = model->new_session();
    model->forward(*session, window.data(), static_cast<int64_t>(window.size()), logits.data(), false);
    bar.update("imatrix", w + 1, windows);
  }
  bar.finish();
  model->record_activations(nullptr);
  const int64_t n_tokens = windows * a.m.ctx;
  stats.write(a.out, n_tokens, fs::path(a.file).filename().string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string moments;
  if (a.hessian)
    moments = ", " + std::to_string(stats.second_moment_layers()) + " with second moments (K <= " +
              std::to_string(a.hessian_max_k) + ")";
  std::fprintf(stderr, "wrote %s: %zu linear layers%s, %lld windows of %lld tokens (%lld tokens, %.1f s) from %s\n",
               a.out.c_str(), stats.layers().size(), moments.c_str(), static_cast<long long>(windows),
               static_cast<long long>(a.m.ctx), static_cast<long long>(n_tokens), secs, a.file.c_str());
  return 0;
}

int run_convert(const ConvertArgs& a) {
  // convert writes a converted format: without --weights, bf16 (--weights native keeps a GGUF file's blocks).
  const model::WeightFormat format = model::parse_weight_format(a.m.weights.empty() ? "bf16" : a.m.weights);
  check(!a.out.empty(), ErrorCode::kInvalidArgument, "options", "-o must name the output directory; got \"\"");
  check(!fs::exists(a.out), ErrorCode::kInvalidArgument, "convert", "the output directory must not exist yet; got \"",
        a.out, "\"");
  if (a.m.threads_given) (void)model_options(a.m);
  const std::string path = resolve_model_path(a.m);
  ProgressBar bar(progress_enabled(a.m));
  std::optional<model::WeightFormat> head;
  if (!a.m.head_weights.empty()) head = model::parse_weight_format(a.m.head_weights);
  model::convert_model(path, a.out, format, [&](const char* stage, int64_t d, int64_t t) { bar.update(stage, d, t); },
                       a.m.imatrix, head);
  bar.finish();
  std::fprintf(stderr, "wrote %s (weights %s, from %s)\n", a.out.c_str(), model::weight_format_name(format), path.c_str());
  return 0;
}

int run_inspect(const InspectArgs& a) {
  const model::ModelOptions opts = model_options(a.m);
  const std::string path = resolve_model_path(a.m);
  // The files' own tensor directory: how many tensors, in which stored formats, how many bytes.
  std::map<std::string, std::pair<int64_t, size_t>> by_format;  // format -> (count, bytes)
  int64_t n_tensors = 0;
  if (fs::is_directory(path)) {
    const model::SafetensorsSet set = model::SafetensorsSet::open_dir(path);
    for (const auto& name : set.names()) {
      const model::StTensor* t = set.find(name);
      auto& e = by_format[model::safetensors_dtype_name(t->dtype)];
      e.first++, e.second += t->nbytes, n_tensors++;
    }
  } else {
    const auto g = model::GGUFFile::open(path);
    for (const auto& t : g->tensors()) {
      auto& e = by_format[model::ggml_type_name(t.type)];
      e.first++, e.second += t.nbytes, n_tensors++;
    }
  }
  auto model = load_model(a.m, opts, path);
  const model::ModelConfig& c = model->config();
  std::ostringstream o;
  o << "model: " << path << "\n"
    << "architecture: " << model::architecture_name(c.arch) << "\n"
    << "vocab " << c.vocab_size << ", hidden " << c.hidden_size << ", intermediate " << c.intermediate_size
    << ", layers " << c.num_layers << ", heads " << c.num_heads << ", kv heads " << c.num_kv_heads << ", head_dim "
    << c.head_dim << ", max position " << c.max_position << "\n";
  if (!c.layer_moe.empty()) {
    int64_t moe_layers = 0;
    for (uint8_t m : c.layer_moe) moe_layers += m;
    o << "experts: " << c.num_experts << " of intermediate " << c.expert_intermediate_size << ", "
      << c.experts_per_token << " per token" << (c.norm_topk_prob ? " (weights renormalised)" : "") << ", on "
      << moe_layers << " of " << c.num_layers << " layers";
    if (c.shared_expert_intermediate_size > 0) o << ", plus a shared expert of " << c.shared_expert_intermediate_size;
    o << "\n";
  }
  if (c.has_linear_layers()) {
    int64_t linear = 0;
    for (uint8_t v : c.layer_linear) linear += v;
    const model::ModelConfig::LinearAttention& la = c.linear_attn;
    o << "linear attention (gated DeltaNet): " << linear << " of " << c.num_layers << " layers, " << la.num_k_heads
      << " key heads of " << la.k_head_dim << ", " << la.num_v_heads << " value heads of " << la.v_head_dim
      << ", conv " << la.conv_kernel << "; state " << la.state_bytes() << " bytes per layer and sequence\n";
  }
  if (c.attn_output_gate) o << "attention output gated (sigmoid)\n";
  if (c.rotary_dim > 0) o << "rotary dims " << c.rotary_dim << " of " << c.head_dim << "\n";
  o << "bos " << c.bos_token_id << ", eos [";
  for (size_t i = 0; i < c.eos_token_ids.size(); ++i) o << (i ? ", " : "") << c.eos_token_ids[i];
  o << "]\n" << "tensors in the files: " << n_tensors << " (";
  bool first = true;
  for (const auto& [fmt, e] : by_format) {
    o << (first ? "" : ", ") << fmt << " x" << e.first << " " << model::format_bytes(static_cast<double>(e.second));
    first = false;
  }
  o << ")\n"
    << "weights in memory: " << model::weight_format_name(opts.weights) << ", "
    << model::format_bytes(static_cast<double>(model->weight_bytes()));
  if (!model->impl().w.format_counts.empty()) {  // --weights native: the linear layers per format kept
    o << " (linear layers:";
    bool f = true;
    for (const auto& [fmt, n] : model->impl().w.format_counts) {
      o << (f ? " " : ", ") << fmt << " x" << n;
      f = false;
    }
    o << (model->impl().w.embed_ggml_type != 0 ? "; embedding in its blocks)" : "; embedding bf16)");
  }
  o << "\n"
    << "kv cache: " << model::kv_format_name(model->options().kv) << "\n"
    << "context: " << model->context_length() << " tokens\n";
  write_out(o.str());
  return 0;
}

int64_t parse_byte_count(const std::string& s, const char* what) {
  size_t used = 0;
  double v = -1.0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = s.substr(used);
  const std::map<std::string, double> units = {
      {"", 1.0},           {"B", 1.0},          {"K", 1024.0},         {"KiB", 1024.0},       {"KB", 1e3},
      {"M", 1048576.0},    {"MiB", 1048576.0},  {"MB", 1e6},           {"G", 1073741824.0},   {"GiB", 1073741824.0},
      {"GB", 1e9},         {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12}};
  const auto u = units.find(unit);
  const bool ok = used > 0 && std::isfinite(v) && v > 0.0 && u != units.end() && v * u->second < 9.0e18 &&
                  s.find_first_of("eExXpP") == std::string::npos && s[0] != '+' && !std::isspace(static_cast<unsigned char>(s[0]));
  check(ok, ErrorCode::kInvalidArgument, "options", what,
        " must be a positive byte count such as 8G, 512MiB, 4000MB or 3000000000; got \"", s, "\"");
  return static_cast<int64_t>(v * u->second);
}

namespace {

// The float32 activations of one CPU pass of `rows` rows (model/cpu_backend.cpp Scratch: x, h, tmp; q, att; k, v;
// gate, up; four rope tables of D/2) plus one row of logits (generation keeps the last row).
int64_t cpu_activation_bytes(const model::ModelConfig& c, int64_t rows) {
  const int64_t per_row = 3 * c.hidden_size + 2 * c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim +
                          2 * c.intermediate_size + 2 * c.head_dim;
  return static_cast<int64_t>(sizeof(float)) * (rows * per_row + c.vocab_size);
}

}  // namespace

int run_fit(const FitArgs& a) {
  const model::ModelOptions opts = model_options(a.m);
  check(opts.device == model::Device::kCPU, ErrorCode::kUnsupported, "fit",
        "fit sizes CPU runs (host memory); --device cuda is not covered yet; got --device ", a.m.device);
  const int64_t budget = a.memory.empty() ? 0 : parse_byte_count(a.memory, "--memory");
  const std::string path = resolve_model_path(a.m);
  auto model = load_model(a.m, opts, path);
  const int64_t loaded = model::resident_bytes();  // the model as a run holds it: weights, tokenizer, runtime
  // Loading can pass through more than it keeps (a GGUF file's blocks and their converted copies): the run's peak is at
  // least this process's peak so far.
  const int64_t load_peak = model::peak_rss_bytes();
  check(loaded > 0 && load_peak > 0, ErrorCode::kUnsupported, "fit",
        "needs /proc/self/status (VmRSS, VmHWM) to measure the loaded model");
  const model::ModelConfig& c = model->config();
  const int64_t max_ctx = c.max_position;  // the model's own limit (--ctx only picks the context to size)
  const int64_t ctx = a.m.ctx > 0 ? a.m.ctx : max_ctx;
  const int64_t act = cpu_activation_bytes(c, std::min<int64_t>(model::kMaxChunk, ctx));
  const model::KVOptions chosen = model->options().kv;
  // The formats side by side: the one asked for (or the default), the seeds' cache and the common ones.
  struct Row {
    std::string name;
    model::KVOptions kv;
  };
  std::vector<Row> rows;
  // outliers: head_dim/32 outlier key channels (per-channel keys); symmetric: symmetric values
  auto add = [&](const std::string& format, const char* layout, const char* rotation, bool outliers = false,
                 bool symmetric = false) {
    model::KVOptions kv = model::parse_kv_format(format);
    if (kv.quantized) {
      // each row as its --kv gives it: the group asked for, else the explicit formats' 64 (32 where 64 does not
      // divide the head)
      kv.group_size = chosen.quantized && a.m.kv_group_size_given ? chosen.group_size : (c.head_dim % 64 == 0 ? 64 : 32);
      if (layout != nullptr) kv.key_layout = nn::parse_key_layout(layout);
      if (rotation != nullptr) kv.rotation = model::parse_kv_rotation(rotation);
      if (outliers) kv.key_outliers = nn::auto_key_outliers(c.head_dim);
      kv.v_symmetric = symmetric;
    }
    const std::string name = model::kv_format_name(kv);
    for (const Row& r : rows)
      if (r.name == name) return;
    rows.push_back({name, kv});
  };
  rows.push_back({model::kv_format_name(chosen), chosen});
  add("bf16", nullptr, nullptr);
  add("k8v8", "token", "hadamard");
  add("k8v4", "token", "hadamard");
  add("k5v5", "channel", "hadamard");
  add("k4v4", "channel", "hadamard");
  add("k4v4", "channel", "hadamard", true, true);  // the fewest bits within KL 0.02 on the real models measured
  add("k4v3", "token", "so4-full");
  auto kv_total = [&](const model::KVOptions& kv, int64_t positions) {
    return model::kv_cache_bytes(c, kv, positions, opts.kv_full_sliding);
  };
  std::ostringstream o;
  o << "model: " << path << " | " << model::architecture_name(c.arch) << ", " << c.num_layers << " layers, "
    << c.num_kv_heads << " KV heads x head_dim " << c.head_dim << ", context up to " << max_ctx << "\n"
    << "loaded (weights " << model::weight_format_name(opts.weights) << " "
    << model::format_bytes(static_cast<double>(model->weight_bytes())) << ", tokenizer, runtime): "
    << model::format_bytes(static_cast<double>(loaded)) << " resident after loading, "
    << model::format_bytes(static_cast<double>(load_peak)) << " at the peak of loading (measured)\n"
    << "activations: " << model::format_bytes(static_cast<double>(act)) << " (passes of "
    << std::min<int64_t>(model::kMaxChunk, ctx) << " rows, float32, and a row of logits)\n";
  if (budget > 0) o << "memory budget: " << model::format_bytes(static_cast<double>(budget)) << "\n";
  char buf[256];
  int name_width = 34;  // the longest name (and the chosen row's " *") sets the first column
  for (const Row& r : rows) name_width = std::max(name_width, static_cast<int>(r.name.size()) + 2);
  std::snprintf(buf, sizeof buf, "%-*s %9s %12s %14s %14s%s\n", name_width, "KV cache", "bits/val", "per position",
                ("KV at " + std::to_string(ctx)).c_str(), "total", budget > 0 ? "   largest context in budget" : "");
  o << buf;
  for (const Row& r : rows) {
    const int64_t kv = kv_total(r.kv, ctx), total = std::max(load_peak, loaded + act + kv);
    const double per_pos = static_cast<double>(kv_total(r.kv, 1 << 20)) / static_cast<double>(1 << 20);
    std::string fits;
    if (budget > 0) {
      // The largest n <= max_ctx with loaded + act(n) + kv(n) <= budget (monotone in n: binary search).
      auto need = [&](int64_t n) {
        return std::max(load_peak,
                        loaded + cpu_activation_bytes(c, std::min<int64_t>(model::kMaxChunk, n)) + kv_total(r.kv, n));
      };
      int64_t lo = 0, hi = max_ctx;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (need(mid) <= budget) lo = mid; else hi = mid - 1;
      }
      fits = lo == 0 ? "   does not fit" : "   " + std::to_string(lo) + (lo == max_ctx ? " (the model's maximum)" : "");
    }
    const double bits =
        r.kv.quantized ? r.kv.bits_per_value(c.head_dim) : 8.0 * static_cast<double>(dtype_size(r.kv.plain_dtype));
    std::snprintf(buf, sizeof buf, "%-*s %9.2f %12s %14s %14s%s\n", name_width,
                  (r.name + (&r == &rows[0] ? " *" : "")).c_str(), bits,
                  model::format_bytes(per_pos).c_str(), model::format_bytes(static_cast<double>(kv)).c_str(),
                  model::format_bytes(static_cast<double>(total)).c_str(), fits.c_str());
    o << buf;
  }
  o << "* the cache this run would use (--kv, or the default). KV grows as positions are used (256 at a time); "
       "\"total\" is the run's peak: the larger of the loading peak and what it holds once --ctx positions are "
       "used.\n";
  write_out(o.str());
  return 0;
}

}  // namespace cider::apps
