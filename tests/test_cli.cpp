// The `cider` binary end to end: every rejected option value gives "cider: error: [op] rule; got value" and exit 2
// (never a crash), usage errors keep CLI11's codes, and on the embedded model cider-tiny the commands agree with
// what transformers produced for it (tests/data/cider_tiny/reference.json: token ids, float32 logits, greedy
// continuations; models/cider-tiny/samples.txt: the greedy text).
//
// The binary: $CIDER_BIN, else CIDER_CLI_PATH (a compile definition, when the build provides it), else `cider` next
// to this test executable (both are built into the build directory's root).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/npy.h"
#include "support/test_support.h"

namespace cider {
namespace {

namespace fs = std::filesystem;

const std::string kSource = CIDER_SOURCE_DIR;
const std::string kTiny = kSource + "/models/cider-tiny";

std::string cider_binary() {
  if (const char* env = std::getenv("CIDER_BIN"); env && *env) return env;
#ifdef CIDER_CLI_PATH
  return CIDER_CLI_PATH;
#else
  return (fs::read_symlink("/proc/self/exe").parent_path() / "cider").string();
#endif
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path scratch_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("cider_test_cli_" + std::to_string(getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

struct CliResult {
  int status = -1;  // exit status; -1 if killed by a signal (a crash)
  std::string out, err;
};

// Runs `cider ARGS` (ARGS already shell-quoted where needed) with `input` on stdin.
CliResult cider(const std::string& args, const std::string& input = "", const std::string& env = "") {
  static int counter = 0;
  const fs::path base = scratch_dir() / ("run" + std::to_string(counter++));
  std::ofstream(base.string() + ".in") << input;
  const std::string cmd = env + " " + quote(cider_binary()) + " " + args + " <" + base.string() + ".in >" +
                          base.string() + ".out 2>" + base.string() + ".err";
  const int rc = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(base.string() + ".out");
  r.err = slurp(base.string() + ".err");
  return r;
}

// "1,2,3" from a JSON array of ids (appends: GCC 12 warns falsely (-Wrestrict) on const char* + std::string).
std::string id_list(const nlohmann::json& ids) {
  std::string s;
  for (const auto& id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id.get<int>());
  }
  return s;
}

nlohmann::json reference() { return nlohmann::json::parse(slurp(kSource + "/tests/data/cider_tiny/reference.json")); }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(cider_binary())) << "the cider binary is not at " << cider_binary()
                                            << " (build the cider_cli target, or set CIDER_BIN)";
  }
};

TEST_F(Cli, EveryInvalidOptionValueIsAnErrorWithItsRuleAndExitTwo) {
  // The values are checked before any model is looked for: -m names nothing here.
  const std::string m = "-m /nonexistent/model ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"generate " + m + "-p x --temperature -0.5", "[sampler] temperature must be a finite number >= 0 (0 = greedy); got -0.5"},
      {"generate " + m + "-p x --top-p 0", "[sampler] top_p must be in (0, 1] (1 = off); got 0"},
      {"generate " + m + "-p x --top-p 1.5", "top_p must be in (0, 1]"},
      {"generate " + m + "-p x --min-p 2", "[sampler] min_p must be in [0, 1] (0 = off); got 2"},
      {"generate " + m + "-p x --top-k -3", "[sampler] top_k must be >= 0 (0 = off); got -3"},
      {"generate " + m + "-p x --repeat-penalty 0", "[sampler] repeat_penalty must be a finite number > 0 (1 = off); got 0"},
      {"generate " + m + "-p x --repeat-last-n -1", "repeat_window must be >= 0"},
      {"generate " + m + "-p x --max-tokens -1", "[options] --max-tokens must be >= 0; got -1"},
      {"generate " + m + "-p x --prefill-chunk 0", "[options] --prefill-chunk must be >= 1; got 0"},
      {"chat " + m + "--prefill-chunk -4", "[options] --prefill-chunk must be >= 1; got -4"},
      {"generate " + m + "-p x --stop ''", "--stop strings must not be empty"},
      {"generate " + m + "-p x --weights w3a8", "weights must be one of f32, bf16, w8a8, w8a8-g64, w8a8-g128, w8a8-g256, w4a8, native, q8_0, q6_k, q5_1, q5_0, q4_k_m, q4_k, q4_1, q4_0; got \"w3a8\""},
      {"generate " + m + "-p x --kv k9v9", "got \"k9v9\""},
      {"generate " + m + "-p x --kv-rotation so5", "kv rotation must be so4-full, so4-fast, hadamard or none; got \"so5\""},
      {"generate " + m + "-p x --kv-group-size 48", "[options] --kv-group-size must be one of 32, 64, 128; got 48"},
      {"generate " + m + "-p x --kv-layout rows", "kv layout must be token or channel; got \"rows\""},
      {"generate " + m + "-p x --threads 0", "[options] --threads must be in [1, "},
      {"generate " + m + "-p x --threads 2147483647", "per CPU this process may use"},
      {"generate -m '' -p x", "[options] -m must name a model directory or .gguf file; got \"\""},
      {"generate " + m + "-p x --ctx -5", "[options] --ctx must be >= 0 (0 = the model's maximum); got -5"},
      {"generate " + m + "-p x --kv k4v4 --kv-outliers 4", "key_outliers needs a quantized cache with key_layout channel"},
      {"generate " + m + "-p x --kv k4v4 --kv-layout channel --kv-outliers 33", "key_outliers must be in [0, 32]; got 33"},
      {"generate " + m + "-p x --kv bf16 --kv-outliers 2", "--kv-outliers refines per-channel keys"},
      {"generate " + m + "-p x --kv-outliers many", "--kv-outliers must be auto or a count in [0, 32]; got \"many\""},
      {"generate " + m + "-p x --kv-values sym", "kv values must be affine or symmetric; got \"sym\""},
      {"generate " + m + "-p x --kv bf16 --kv-values symmetric", "--kv-values symmetric chooses a quantized cache's"},
      {"generate " + m + "-p x --kv-recent bf16", "kv recent must be quantized or exact; got \"bf16\""},
      {"generate " + m + "-p x --kv bf16 --kv-recent exact", "--kv-recent exact reads a quantized cache's recent block"},
      {"generate " + m + "-p x --kv k4v4 --kv-recent exact", "recent exact) extends the per-channel keys' residual"},
      {"generate " + m + "-p x --tp 0", "[options] --tp must be in [1, 8]; got 0"},
      {"generate " + m + "-p x --tp 9", "[options] --tp must be in [1, 8]; got 9"},
      {"generate " + m + "-p x --tp 2", "[options] --tp 2 splits the model over GPUs: it needs --device cuda"},
      {"perplexity " + m + "-f x.txt --tp 2", "--tp 2 splits the model over GPUs: it needs --device cuda"},
      {"chat " + m + "--chat-format jinja", "[chat_format] the chat format must be one of chatml, llama3, gemma, mistral, llama2, raw, phi3; got \"jinja\""},
      {"chat " + m + "--temperature -1", "temperature must be"},
      {"logits " + m + "--tokens 1,x,3 --out o.npy", "--tokens must be comma-separated non-negative integer ids (e.g. 1,2,3); got \"1,x,3\""},
      {"logits " + m + "--tokens 1,,3 --out o.npy", "got \"1,,3\""},
      {"logits " + m + "--tokens -1 --out o.npy", "got \"-1\""},
      {"perplexity " + m + "-f x.txt --ctx 1", "[options] --ctx (the window length) must be >= 2, or 0 for the model's context length; got 1"},
      {"perplexity " + m + "-f x.txt --ctx 8 --stride 9", "[options] --stride must be in [1, --ctx] (0 = --ctx); got 9"},
      {"perplexity " + m + "-f x.txt --ctx 8 --baseline-kv k1v1", "got \"k1v1\""},
      {"perplexity " + m + "-f /nonexistent/text.txt --ctx 8", "[perplexity] cannot read \"/nonexistent/text.txt\": No such file or directory"},
      {"perplexity " + m + "-f / --ctx 8", "[perplexity] cannot read \"/\": it is a directory"},
      {"convert " + m + "-o out --weights q4", "got \"q4\""},
      {"generate " + m + "-p x", "[model] the model path must exist; got \"/nonexistent/model\""},
      {"tokenize " + m + "--text x", "[model] the model path must exist; got \"/nonexistent/model\""},
  };
  for (const auto& [args, want] : cases) {
    const CliResult r = cider(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("cider: error: ", 0), 0u) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << "\nwant: " << want << "\ngot: " << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

TEST_F(Cli, UsageErrorsKeepCli11sExitCodes) {
  for (const char* args : {"generate -m x", "generate -p x --temperature warm", "frobnicate", "logits --tokens 1"}) {
    const CliResult r = cider(args);
    EXPECT_GT(r.status, 2) << args << ": CLI11's own codes are above 100";
    EXPECT_NE(r.err.find("Run with --help"), std::string::npos) << args << "\n" << r.err;
  }
}

TEST_F(Cli, MissingDefaultModelIsNamed) {
  const CliResult r = cider("tokenize --text hi", "", "CIDER_DEFAULT_MODEL=/nonexistent/tiny");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("$CIDER_DEFAULT_MODEL must name an existing model; got \"/nonexistent/tiny\""), std::string::npos)
      << r.err;
  const CliResult ok = cider("tokenize --text hi", "", "CIDER_DEFAULT_MODEL=" + quote(kTiny));
  EXPECT_EQ(ok.status, 0) << ok.err;
}

TEST_F(Cli, TokenizeGivesTheIdsOfHuggingFaceTokenizers) {
  for (const auto& e : reference()) {
    const CliResult r = cider("tokenize -m " + quote(kTiny) + " --text " + quote(e["prompt"].get<std::string>()));
    ASSERT_EQ(r.status, 0) << r.err;
    const std::string want = id_list(e["ids"]);
    EXPECT_EQ(r.out, want + "\n");
  }
}

TEST_F(Cli, LogitsMatchTransformersFloat32) {
  for (const auto& e : reference()) {
    const std::string ids = id_list(e["ids"]);
    const std::string out = (scratch_dir() / "logits.npy").string();
    const CliResult r = cider("logits -m " + quote(kTiny) + " --weights f32 --kv f32 --tokens " + ids + " --out " + quote(out));
    ASSERT_EQ(r.status, 0) << r.err;
    const model::NpyArray a = model::read_npy_f32(out);
    const auto& want = e["logits"];
    ASSERT_EQ(a.shape, (std::vector<int64_t>{static_cast<int64_t>(want.size()), static_cast<int64_t>(want[0].size())}));
    double max_ref = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < want.size(); ++i)
      for (size_t v = 0; v < want[i].size(); ++v) {
        const double w = want[i][v].get<double>(), g = a.data[i * want[i].size() + v];
        ASSERT_FALSE(std::isnan(g));
        max_ref = std::max(max_ref, std::fabs(w));
        max_diff = std::max(max_diff, std::fabs(g - w));
      }
    EXPECT_LE(max_diff, 1e-3 * max_ref);  // the f32 rule
  }
  const CliResult bad = cider("logits -m " + quote(kTiny) + " --tokens 1,2 --out /nonexistent/dir/x.npy");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("/nonexistent/dir/x.npy"), std::string::npos) << bad.err;
  const CliResult big = cider("logits -m " + quote(kTiny) + " --tokens 1,4096 --out x.npy");
  EXPECT_EQ(big.status, 2);
  EXPECT_NE(big.err.find("below the vocabulary size 4096; got 4096"), std::string::npos) << big.err;
}

// The greedy continuation transformers wrote to samples.txt for a prompt.
std::string transformers_greedy_text(const std::string& prompt) {
  const std::string s = slurp(kTiny + "/samples.txt");
  const std::string head = "--- '" + prompt + "' (greedy)\n<|begin_of_text|>" + prompt;
  const size_t b = s.find(head);
  if (b == std::string::npos) return "<missing>";
  const size_t start = b + head.size();
  return s.substr(start, s.find("\n--- ", start) - start);
}

TEST_F(Cli, GreedyGenerationEqualsTransformers) {
  const auto ref = reference();
  const std::string prompt = ref[0]["prompt"];
  const size_t n_new = ref[0]["greedy"].size() - ref[0]["ids"].size();
  const std::string want = transformers_greedy_text(prompt);
  // Also with the prompt fed one token per forward pass (--prefill-chunk 1): the same text.
  for (const char* extra : {"", " --no-stream", " --prefill-chunk 1"}) {
    const CliResult r = cider("generate -m " + quote(kTiny) + " --weights f32 --kv f32 --temperature 0 --max-tokens " +
                              std::to_string(n_new) + " -p " + quote(prompt) + extra);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, want + "\n");
    for (const char* part : {"load ", "prompt 4 tokens", "generated 24 tokens", "tok/s", "peak RSS", "KV ",
                             "weights f32, kv f32", "stop: max tokens"})
      EXPECT_NE(r.err.find(part), std::string::npos) << part << "\n" << r.err;
  }
  // A stop string: the text up to its first occurrence, without it.
  const std::string stop = " the interpreter";
  const CliResult s = cider("generate -m " + quote(kTiny) + " --weights f32 --kv f32 --temperature 0 --max-tokens " +
                            std::to_string(n_new) + " -p " + quote(prompt) + " --stop " + quote(stop) + " --stop zzzz");
  ASSERT_EQ(s.status, 0) << s.err;
  ASSERT_NE(want.find(stop), std::string::npos);
  EXPECT_EQ(s.out, want.substr(0, want.find(stop)) + "\n");
  EXPECT_NE(s.err.find("stop: stop string"), std::string::npos) << s.err;
}

TEST_F(Cli, SampledGenerationIsReproducibleFromItsSeed) {
  const std::string args = "generate -m " + quote(kTiny) + " --max-tokens 20 -p " + quote("A fortune: ");
  const CliResult a = cider(args + " --seed 1234"), b = cider(args + " --seed 1234");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("seed 1234"), std::string::npos) << a.err;
  // Without --seed a fresh seed is drawn and printed; rerunning with it gives the same text.
  const CliResult c = cider(args);
  ASSERT_EQ(c.status, 0) << c.err;
  const size_t at = c.err.find("seed ");
  ASSERT_NE(at, std::string::npos) << c.err;
  const std::string seed = c.err.substr(at + 5, c.err.find_first_not_of("0123456789", at + 5) - (at + 5));
  EXPECT_EQ(cider(args + " --seed " + seed).out, c.out);
}

TEST_F(Cli, PromptLongerThanTheContextIsRejectedBeforeGenerating) {
  const CliResult r = cider("generate -m " + quote(kTiny) + " --ctx 3 -p " + quote("The Python interpreter"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("cider: error: [generate] the prompt (4 tokens, after 0 already in the context) must fit the "
                       "context of 3 tokens; got 4 tokens"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty());
}

// -log softmax(row)[target] in double from transformers' logits.
double reference_nll(const nlohmann::json& e, size_t row, int target) {
  const auto& l = e["logits"][row];
  double mx = -INFINITY;
  for (const auto& x : l) mx = std::max(mx, x.get<double>());
  double z = 0.0;
  for (const auto& x : l) z += std::exp(x.get<double>() - mx);
  return mx + std::log(z) - l[static_cast<size_t>(target)].get<double>();
}

double number_after(const std::string& s, const std::string& key) {
  const size_t at = s.find(key);
  return at == std::string::npos ? NAN : std::strtod(s.c_str() + at + key.size(), nullptr);
}

TEST_F(Cli, PerplexityEqualsTheOneOfTransformersLogits) {
  const auto e = reference()[1];  // "A fortune: " — BOS + 6 tokens; the file holds exactly the prompt
  const std::string file = (scratch_dir() / "fortune.txt").string();
  std::ofstream(file) << e["prompt"].get<std::string>();
  const size_t n = e["ids"].size();
  double nll = 0.0;
  for (size_t t = 1; t < n; ++t) nll += reference_nll(e, t - 1, e["ids"][t].get<int>());
  const double want = std::exp(nll / static_cast<double>(n - 1));
  const CliResult r = cider("perplexity -m " + quote(kTiny) + " --weights f32 --kv f32 -f " + quote(file) + " --ctx " +
                            std::to_string(n));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NEAR(number_after(r.out, "perplexity: "), want, 1e-3 * want) << r.out;
  EXPECT_NE(r.out.find("(" + std::to_string(n - 1) + " tokens scored in 1 windows"), std::string::npos) << r.out;

  const CliResult shorter = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) + " --ctx 64");
  EXPECT_EQ(shorter.status, 2);
  EXPECT_NE(shorter.err.find("the text must have at least ctx - 1 = 63 tokens after BOS; got " +
                             std::to_string(n - 1) + " tokens"),
            std::string::npos)
      << shorter.err;
}

// cider-tiny's tokenizer adds BOS, so every window is BOS + ctx − 1 text tokens (llama.cpp's perplexity does the same):
// a text of at least 3·31 text tokens at --ctx 32 gives 3+ windows of 31 scored tokens each, and the output says so.
TEST_F(Cli, PerplexityStartsEveryWindowWithBos) {
  const std::string file = (scratch_dir() / "bos_windows.txt").string();
  std::ofstream(file) << slurp(kTiny + "/README.md").substr(0, 700);
  const CliResult count = cider("tokenize -m " + quote(kTiny) + " -f " + quote(file) + " --no-special --count");
  ASSERT_EQ(count.status, 0) << count.err;
  const long text_tokens = std::strtol(count.out.c_str(), nullptr, 10);
  ASSERT_GE(text_tokens, 3 * 31) << count.out;
  const long windows = text_tokens / 31;
  const CliResult r = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) + " --ctx 32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("windows: " + std::to_string(windows) +
                       " of 32 tokens, each BOS + 31 text tokens, advancing 31 text tokens"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(" + std::to_string(windows * 31) + " tokens scored in " + std::to_string(windows) +
                       " windows"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(std::to_string(text_tokens) + " text tokens | ctx 32 stride 31"), std::string::npos) << r.out;
  // A stride counts text tokens, at most ctx − 1.
  const CliResult bad = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) + " --ctx 32 --stride 32");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--stride must be in [1, 31] text tokens"), std::string::npos) << bad.err;
}

// --llama-logits: llama.cpp's saved log-probabilities as the baseline (model/llama_logits.h; reading and the KL are
// tested in test_perplexity.cpp). Here what the command checks before it evaluates anything: the file, its windows,
// vocabulary and tokens against cider's, and the options it excludes.
TEST_F(Cli, PerplexityAgainstLlamaLogitsChecksTheFileAgainstTheModel) {
  const std::string text = (scratch_dir() / "llama_text.txt").string();
  std::ofstream(text) << slurp(kTiny + "/README.md").substr(0, 400);
  // A file of one 8-token window whose tokens are all 5 (cider's start with BOS) and whose rows are flat.
  auto write = [](const std::string& path, int32_t ctx, int32_t vocab) {
    std::ofstream out(path, std::ios::binary);
    out.write("_logits_", 8);
    const int32_t head[3] = {ctx, vocab, 1};
    out.write(reinterpret_cast<const char*>(head), sizeof head);
    const std::vector<int32_t> tokens(static_cast<size_t>(ctx), 5);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    const int32_t rows = ctx - 1 - ctx / 2, nv = 2 * ((vocab + 1) / 2) + 4;
    std::vector<uint16_t> row(static_cast<size_t>(nv), 0);
    const float scale = 0.0f, min_log_prob = -std::log(static_cast<float>(vocab));
    std::memcpy(row.data(), &scale, 4);
    std::memcpy(row.data() + 2, &min_log_prob, 4);
    for (int32_t r = 0; r < rows; ++r)
      out.write(reinterpret_cast<const char*>(row.data()), static_cast<std::streamsize>(row.size() * 2));
  };
  const std::string good_vocab = (scratch_dir() / "llama_4096.bin").string(), small = (scratch_dir() / "llama_10.bin").string();
  write(good_vocab, 8, 4096);
  write(small, 8, 10);
  const std::string m = "-m " + quote(kTiny) + " -f " + quote(text) + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {m + "--llama-logits /nonexistent/base.bin", "[llama_logits] cannot open \"/nonexistent/base.bin\""},
      {m + "--llama-logits " + quote(text), "must start with \"_logits_\""},
      {m + "--llama-logits " + quote(good_vocab) + " --baseline-kv bf16", "--llama-logits is the baseline"},
      {m + "--llama-logits " + quote(good_vocab) + " --ctx 16", "--ctx must be 8"},
      {m + "--llama-logits " + quote(small), "must be the model's 4096; got 10"},
      {m + "--llama-logits " + quote(good_vocab), "cider's tokens must be llama.cpp's: token 0 is "},
  };
  for (const auto& [args, want] : cases) {
    const CliResult r = cider("perplexity " + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << "\nwant: " << want << "\ngot: " << r.err;
  }
}

// cider fit: the KV column is what a real run reports once it has used that many positions (the same plane rule),
// the cache the run would use is starred, a budget too small fits nothing, and bad budgets are named.
TEST_F(Cli, FitSizesTheKvCacheAsARunAllocatesIt) {
  const std::string prompt = slurp(kTiny + "/README.md").substr(0, 2500);
  const CliResult count = cider("tokenize -m " + quote(kTiny) + " --text " + quote(prompt) + " --count");
  ASSERT_EQ(count.status, 0) << count.err;
  const long positions = std::strtol(count.out.c_str(), nullptr, 10) + 7;  // prompt + 7 of 8 new tokens fed back
  const CliResult g = cider("generate -m " + quote(kTiny) + " --kv k8v4 --temperature 0 --max-tokens 8 -p " +
                            quote(prompt));
  ASSERT_EQ(g.status, 0) << g.err;
  const size_t at = g.err.find("| KV ");
  ASSERT_NE(at, std::string::npos) << g.err;
  const std::string kv = g.err.substr(at + 5, g.err.find(" |", at + 5) - at - 5);
  const CliResult f = cider("fit -m " + quote(kTiny) + " --kv k8v4 --ctx " + std::to_string(positions));
  ASSERT_EQ(f.status, 0) << f.err;
  const size_t row = f.out.find("k8v4/hadamard/g64 *");
  ASSERT_NE(row, std::string::npos) << f.out;
  const std::string line = f.out.substr(row, f.out.find('\n', row) - row);
  EXPECT_NE(line.find(" " + kv + " "), std::string::npos) << "generate: KV " << kv << "\nfit: " << line;
  for (const char* other : {"bf16 ", "k5v5/hadamard/g64/kchan", "k4v4/hadamard/g64/kchan", "k4v3/so4-full/g64"})
    EXPECT_NE(f.out.find(other), std::string::npos) << other << "\n" << f.out;
  const CliResult small = cider("fit -m " + quote(kTiny) + " --memory 1M");
  ASSERT_EQ(small.status, 0) << small.err;
  EXPECT_NE(small.out.find("does not fit"), std::string::npos) << small.out;
  const CliResult big = cider("fit -m " + quote(kTiny) + " --memory 1GiB");
  ASSERT_EQ(big.status, 0) << big.err;
  EXPECT_NE(big.out.find("(the model's maximum)"), std::string::npos) << big.out;
  const CliResult bad = cider("fit -m " + quote(kTiny) + " --memory 8X");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.err.find("--memory must be a positive byte count such as 8G, 512MiB, 4000MB or 3000000000; got \"8X\""),
            std::string::npos)
      << bad.err;
}

// tokenize -f FILE equals --text with the file's contents; --count prints how many; exactly one input.
TEST_F(Cli, TokenizeReadsAFileAndCounts) {
  const std::string text = slurp(kTiny + "/README.md").substr(0, 400);
  const std::string file = (scratch_dir() / "tokenize_me.txt").string();
  std::ofstream(file) << text;
  const CliResult a = cider("tokenize -m " + quote(kTiny) + " -f " + quote(file));
  const CliResult b = cider("tokenize -m " + quote(kTiny) + " --text " + quote(text));
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  const CliResult c = cider("tokenize -m " + quote(kTiny) + " -f " + quote(file) + " --count");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(c.out, std::to_string(std::count(a.out.begin(), a.out.end(), ',') + 1) + "\n");
  const CliResult both = cider("tokenize -m " + quote(kTiny) + " -f " + quote(file) + " --text x");
  EXPECT_EQ(both.status, 2);
  EXPECT_NE(both.err.find("tokenize needs exactly one of --text and -f/--file; got both"), std::string::npos)
      << both.err;
  const CliResult neither = cider("tokenize -m " + quote(kTiny));
  EXPECT_EQ(neither.status, 2);
  EXPECT_NE(neither.err.find("got neither"), std::string::npos) << neither.err;
}

TEST_F(Cli, PerplexityAgainstABaselineReportsKlAndTopOne) {
  // About 150 tokens of the model's README: four windows of 32.
  const std::string file = (scratch_dir() / "readme_head.txt").string();
  std::ofstream(file) << slurp(kTiny + "/README.md").substr(0, 600);
  // The same configuration as its own baseline: zero divergence, full agreement.
  const CliResult same = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) +
                               " --ctx 32 --weights bf16 --kv bf16 --baseline-weights bf16 --baseline-kv bf16");
  ASSERT_EQ(same.status, 0) << same.err;
  EXPECT_EQ(number_after(same.out, "mean KL(baseline || tested): "), 0.0) << same.out;
  EXPECT_NE(same.out.find("top-1 agreement: 100.00%"), std::string::npos) << same.out;
  EXPECT_EQ(number_after(same.out, "baseline perplexity: "), number_after(same.out, "\nperplexity: ")) << same.out;
  // A 3-bit key / 2-bit value cache against bf16: a positive divergence.
  const CliResult low = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) +
                              " --ctx 32 --kv k3v2 --baseline-kv bf16");
  ASSERT_EQ(low.status, 0) << low.err;
  EXPECT_GT(number_after(low.out, "mean KL(baseline || tested): "), 0.0) << low.out;
  EXPECT_NE(low.out.find("baseline: weights bf16, kv bf16"), std::string::npos) << low.out;
}

TEST_F(Cli, HadamardKvRotationIsAccepted) {
  const std::string file = (scratch_dir() / "readme_hadamard.txt").string();
  std::ofstream(file) << slurp(kTiny + "/README.md").substr(0, 300);
  // cider-tiny's head_dim 64 is a power of two: the cache rotates with one 64-point Hadamard transform per head.
  const CliResult r = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) +
                            " --ctx 32 --kv k8v4 --kv-rotation hadamard --kv-group-size 32 --baseline-kv bf16");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_GT(number_after(r.out, "mean KL(baseline || tested): "), 0.0) << r.out;
  // 8-bit keys and 4-bit values: close to the bf16 baseline (the same command without rotation gives ~0.01).
  EXPECT_LT(number_after(r.out, "mean KL(baseline || tested): "), 0.05) << r.out;
  const CliResult g = cider("generate -m " + quote(kTiny) + " --kv k4v4 --kv-rotation hadamard --temperature 0 "
                            "--max-tokens 4 -p hello");
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_NE(g.err.find("kv k4v4/hadamard/g64"), std::string::npos) << g.err;
  // Per-channel keys, alone and with 4 outlier channels per block (chosen by the queries the model observes): an
  // 80-token window (two quantized blocks of 32 positions, 16 in the bf16 window), and generation names the layout.
  for (const auto& [extra, name] : {std::pair<std::string, std::string>{"", "kchan"}, {" --kv-outliers 4", "kchan/o4"},
                                    {" --kv-outliers auto", "kchan/o2"},
                                    {" --kv-outliers auto --kv-values symmetric", "kchan/o2/vsym"},
                                    {" --kv-outliers auto --kv-values symmetric --kv-recent exact", "kchan/o2/vsym/rx"}}) {
    const CliResult c = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) +
                              " --ctx 80 --kv k4v4 --kv-layout channel --kv-group-size 32" + extra + " --baseline-kv bf16");
    ASSERT_EQ(c.status, 0) << c.err;
    EXPECT_GT(number_after(c.out, "mean KL(baseline || tested): "), 0.0) << c.out;
    EXPECT_LT(number_after(c.out, "mean KL(baseline || tested): "), 0.05) << c.out;
    const CliResult gc = cider("generate -m " + quote(kTiny) + " --kv k4v4 --kv-layout channel" + extra +
                               " --temperature 0 --max-tokens 4 -p hello");
    ASSERT_EQ(gc.status, 0) << gc.err;
    EXPECT_NE(gc.err.find("kv k4v4/hadamard/g64/" + name), std::string::npos) << gc.err;
  }
}

TEST_F(Cli, ChatKeepsTheConversationAndResetStartsOver) {
  const std::string args = "chat -m " + quote(kTiny) + " --temperature 0 --max-tokens 8 --weights f32 --kv f32";
  const CliResult r = cider(args, "The Python interpreter\n/reset\nThe Python interpreter\nand then\n/exit\nnever read\n");
  ASSERT_EQ(r.status, 0) << r.err;
  // Each reply ends with a newline; replies may contain newlines, so compare whole replies.
  const CliResult one = cider(args, "The Python interpreter\n");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_FALSE(one.out.empty());
  EXPECT_EQ(r.out.substr(0, 2 * one.out.size()), one.out + one.out) << "a reset conversation answers as a new one";
  EXPECT_GT(r.out.size(), 2 * one.out.size()) << "the third message got a reply";
  const CliResult fmt = cider(args + " --chat-format chatml --stats", "hi\n");
  EXPECT_EQ(fmt.status, 0) << fmt.err;
  EXPECT_NE(fmt.err.find("generated"), std::string::npos) << fmt.err;
}

TEST_F(Cli, ConvertThenGenerateFromTheConvertedModelAndInspectIt) {
  const fs::path out = scratch_dir() / "tiny-w8a8";
  fs::remove_all(out);
  const CliResult c = cider("convert -m " + quote(kTiny) + " -o " + quote(out.string()) + " --weights w8a8");
  ASSERT_EQ(c.status, 0) << c.err;
  const CliResult again = cider("convert -m " + quote(kTiny) + " -o " + quote(out.string()) + " --weights w8a8");
  EXPECT_EQ(again.status, 2);
  EXPECT_NE(again.err.find("must not exist yet"), std::string::npos) << again.err;
  const CliResult g = cider("generate -m " + quote(out.string()) + " --weights w8a8 --temperature 0 --max-tokens 5 -p hello");
  EXPECT_EQ(g.status, 0) << g.err;
  EXPECT_FALSE(g.out.empty());
  const CliResult i = cider("inspect -m " + quote(kTiny));
  ASSERT_EQ(i.status, 0) << i.err;
  for (const char* part : {"architecture: llama", "vocab 4096", "layers 8", "kv heads 2", "head_dim 64",
                           "tensors in the files: ", "BF16", "weights in memory: bf16",
                           "kv cache: k4v4/hadamard/g64/kchan/o2/vsym/rx"})
    EXPECT_NE(i.out.find(part), std::string::npos) << part << "\n" << i.out;
  // The default cache with per-token keys has no outlier channels; with per-channel keys, as many as asked.
  for (const auto& [extra, kv] : {std::pair<std::string, std::string>{" --kv-layout token", "k4v4/hadamard/g64/vsym\n"},
                                  {" --kv-outliers 0", "k4v4/hadamard/g64/kchan/vsym/rx\n"},
                                  {" --kv-outliers 3", "k4v4/hadamard/g64/kchan/o3/vsym/rx\n"},
                                  {" --kv-values affine", "k4v4/hadamard/g64/kchan/o2/rx\n"},
                                  {" --kv-recent quantized", "k4v4/hadamard/g64/kchan/o2/vsym\n"}}) {
    const CliResult d = cider("inspect -m " + quote(kTiny) + extra);
    ASSERT_EQ(d.status, 0) << d.err;
    EXPECT_NE(d.out.find("kv cache: " + kv), std::string::npos) << extra << "\n" << d.out;
  }
  // Heads of 128: the default cache's blocks of 128 positions (64 is what 128 falls back to for cider-tiny's 64); an
  // explicit --kv or --kv-group-size takes its own.
  const std::string d128 = kSource + "/tests/data/gguf_d128/model.gguf";
  for (const auto& [extra, kv] : {std::pair<std::string, std::string>{"", "k4v4/hadamard/g128/kchan/o4/vsym/rx\n"},
                                  {" --kv-group-size 64", "k4v4/hadamard/g64/kchan/o4/vsym/rx\n"},
                                  {" --kv-layout token", "k4v4/hadamard/g128/vsym\n"},
                                  {" --kv k4v4", "k4v4/hadamard/g64\n"}}) {
    const CliResult d = cider("inspect -m " + quote(d128) + extra);
    ASSERT_EQ(d.status, 0) << d.err;
    EXPECT_NE(d.out.find("kv cache: " + kv), std::string::npos) << extra << "\n" << d.out;
  }
  // `fit` shows each other format as its --kv gives it (group 64), the chosen one as chosen; with --kv-group-size all
  // at that group.
  const CliResult f = cider("fit -m " + quote(d128));
  ASSERT_EQ(f.status, 0) << f.err;
  for (const char* row : {"k4v4/hadamard/g128/kchan/o4/vsym/rx *", "k4v3/so4-full/g64 ", "k8v4/hadamard/g64 "})
    EXPECT_NE(f.out.find(row), std::string::npos) << row << "\n" << f.out;
  const CliResult f128 = cider("fit -m " + quote(d128) + " --kv-group-size 128");
  ASSERT_EQ(f128.status, 0) << f128.err;
  EXPECT_NE(f128.out.find("k4v3/so4-full/g128 "), std::string::npos) << f128.out;
}

// `cider imatrix` writes activation statistics of a calibration text; `--imatrix` fits a requantizing format with
// them, when loading and when converting (the converted directory then computes as the direct load does); misuse is
// refused by name.
TEST_F(Cli, ImatrixCalibratesTheBlockFits) {
  const std::string text = kSource + "/docs/kv_cache.md";
  const fs::path imx = scratch_dir() / "tiny-imatrix.safetensors";
  fs::remove(imx);
  const CliResult c = cider("imatrix -m " + quote(kTiny) + " -f " + quote(text) + " -o " + quote(imx.string()) +
                            " --ctx 64 --chunks 3");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.err.find("57 linear layers, 3 windows of 64 tokens (192 tokens"), std::string::npos) << c.err;
  const std::string gen = " --temperature 0 --max-tokens 12 -p " + quote("The cache");
  const std::string with_imx = " --imatrix " + quote(imx.string());
  const CliResult direct = cider("generate -m " + quote(kTiny) + " --weights q4_k" + with_imx + gen);
  ASSERT_EQ(direct.status, 0) << direct.err;
  const fs::path head = scratch_dir() / "head.txt";  // a few windows
  {
    std::ifstream in(text);
    std::string part(2000, '\0');
    in.read(part.data(), static_cast<std::streamsize>(part.size()));
    std::ofstream(head) << part.substr(0, static_cast<size_t>(in.gcount()));
  }
  const CliResult ppl = cider("perplexity -m " + quote(kTiny) + " -f " + quote(head.string()) +
                              " --ctx 64 --weights q4_k" + with_imx + " --baseline-weights bf16");
  ASSERT_EQ(ppl.status, 0) << ppl.err;  // the baseline loads bf16 without the file
  EXPECT_NE(ppl.out.find("tested: weights q4_k (imatrix tiny-imatrix.safetensors)"), std::string::npos) << ppl.out;
  EXPECT_FALSE(direct.out.empty());
  const fs::path conv = scratch_dir() / "tiny-q4k-imatrix";
  fs::remove_all(conv);
  const CliResult cv = cider("convert -m " + quote(kTiny) + " -o " + quote(conv.string()) + " --weights q4_k" + with_imx);
  ASSERT_EQ(cv.status, 0) << cv.err;
  const CliResult from_dir = cider("generate -m " + quote(conv.string()) + gen);
  ASSERT_EQ(from_dir.status, 0) << from_dir.err;
  EXPECT_EQ(from_dir.out, direct.out);
  // With second moments (GPTQ's error feedback): the converted directory again computes as the direct load does.
  const fs::path imx_h = scratch_dir() / "tiny-imatrix-h.safetensors";
  fs::remove(imx_h);
  const CliResult ch = cider("imatrix -m " + quote(kTiny) + " -f " + quote(text) + " -o " + quote(imx_h.string()) +
                             " --ctx 64 --chunks 3 --hessian");
  ASSERT_EQ(ch.status, 0) << ch.err;
  EXPECT_NE(ch.err.find("57 linear layers, 57 with second moments (K <= 4096)"), std::string::npos) << ch.err;
  const std::string with_h = " --imatrix " + quote(imx_h.string());
  const CliResult direct_h = cider("generate -m " + quote(kTiny) + " --weights q4_k" + with_h + gen);
  ASSERT_EQ(direct_h.status, 0) << direct_h.err;
  const fs::path conv_h = scratch_dir() / "tiny-q4k-imatrix-h";
  fs::remove_all(conv_h);
  ASSERT_EQ(cider("convert -m " + quote(kTiny) + " -o " + quote(conv_h.string()) + " --weights q4_k" + with_h).status, 0);
  const CliResult from_dir_h = cider("generate -m " + quote(conv_h.string()) + gen);
  ASSERT_EQ(from_dir_h.status, 0) << from_dir_h.err;
  EXPECT_EQ(from_dir_h.out, direct_h.out);
  EXPECT_FALSE(direct_h.out.empty());
  // A Q5_0 head, GPTQ-coded apart from the (tied) embedding: converted, it computes as the direct load does.
  const std::string head_q5 = " --weights q4_k --head-weights q5_0" + with_h;
  const CliResult direct_q5 = cider("generate -m " + quote(kTiny) + head_q5 + gen);
  ASSERT_EQ(direct_q5.status, 0) << direct_q5.err;
  EXPECT_NE(direct_q5.err.find("weights q4_k (imatrix tiny-imatrix-h.safetensors), head q5_0"), std::string::npos)
      << direct_q5.err;
  const fs::path conv_q5 = scratch_dir() / "tiny-q4k-head-q5";
  fs::remove_all(conv_q5);
  ASSERT_EQ(cider("convert -m " + quote(kTiny) + " -o " + quote(conv_q5.string()) + head_q5).status, 0);
  const CliResult from_dir_q5 = cider("generate -m " + quote(conv_q5.string()) + gen);
  ASSERT_EQ(from_dir_q5.status, 0) << from_dir_q5.err;
  EXPECT_EQ(from_dir_q5.out, direct_q5.out);
  const CliResult bad_head = cider("generate -m " + quote(kTiny) + " --weights q4_k --head-weights q9" + gen);
  EXPECT_EQ(bad_head.status, 2);
  EXPECT_NE(bad_head.err.find("weights must be one of"), std::string::npos) << bad_head.err;
  const CliResult dense = cider("generate -m " + quote(kTiny) + " --weights bf16" + with_imx + gen);
  EXPECT_EQ(dense.status, 2);
  EXPECT_NE(dense.err.find("--imatrix weights the fits of a requantizing block format"), std::string::npos) << dense.err;
  const CliResult stored = cider("generate -m " + quote(conv.string()) + with_imx + gen);
  EXPECT_EQ(stored.status, 2);
  EXPECT_NE(stored.err.find("--imatrix applies when converting"), std::string::npos) << stored.err;
  const CliResult over = cider("imatrix -m " + quote(kTiny) + " -f " + quote(text) + " -o " + quote(text));
  EXPECT_EQ(over.status, 2);
  EXPECT_NE(over.err.find("[imatrix]"), std::string::npos) << over.err;
  const fs::path short_text = scratch_dir() / "short.txt";
  std::ofstream(short_text) << "A few words only.";
  const CliResult small = cider("imatrix -m " + quote(kTiny) + " -f " + quote(short_text.string()) + " -o " +
                                quote(imx.string()) + " --ctx 64");
  EXPECT_EQ(small.status, 2);
  EXPECT_NE(small.err.find("at least one window of"), std::string::npos) << small.err;
}

// A GGUF file converted with --weights native keeps its blocks: the directory then defaults to native (as the file
// does), and logits and greedy text are byte for byte the file's. A directory that is not a native cider model refuses
// native (a Hugging Face one has no blocks).
TEST_F(Cli, ConvertNativeKeepsTheGgufBlocksAndTheirLogits) {
  const std::string gguf = kSource + "/tests/data/gguf_d128/model.gguf";
  const fs::path out = scratch_dir() / "d128-native";
  fs::remove_all(out);
  const CliResult c = cider("convert -m " + quote(gguf) + " -o " + quote(out.string()) + " --weights native");
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_NE(c.err.find("weights native"), std::string::npos) << c.err;
  const std::string ids = "1,17,400,2000,5,9,33,1024,7,3,250,11,12,13,14,15,16,18,19,20";
  const std::string a = (scratch_dir() / "d128-gguf.npy").string(), b = (scratch_dir() / "d128-cider.npy").string();
  const CliResult la = cider("logits -m " + quote(gguf) + " --tokens " + ids + " --out " + quote(a));
  const CliResult lb = cider("logits -m " + quote(out.string()) + " --tokens " + ids + " --out " + quote(b));
  ASSERT_EQ(la.status, 0) << la.err;
  ASSERT_EQ(lb.status, 0) << lb.err;
  EXPECT_NE(lb.err.find("weights native"), std::string::npos) << "the default for a native directory\n" << lb.err;
  EXPECT_EQ(slurp(a), slurp(b)) << "logits must be byte for byte equal";
  {  // --no-repack: the file's row order (the AVX2 level otherwise interleaves its Q4_K / Q6_K rows): the same int8
     // products, float sums in another order
    const std::string fo = (scratch_dir() / "d128-file-order.npy").string();
    const CliResult lc = cider("logits -m " + quote(gguf) + " --no-repack --tokens " + ids + " --out " + quote(fo));
    ASSERT_EQ(lc.status, 0) << lc.err;
    const model::NpyArray x = model::read_npy_f32(a), y = model::read_npy_f32(fo);
    ASSERT_EQ(x.shape, y.shape);
    double max_ref = 0.0, max_diff = 0.0;
    for (size_t i = 0; i < x.data.size(); ++i) {
      ASSERT_FALSE(std::isnan(y.data[i]));
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(x.data[i])));
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(y.data[i]) - x.data[i]));
    }
    EXPECT_LE(max_diff, 1e-4 * max_ref);
  }
  const std::string gen = " --temperature 0 --max-tokens 8 -p hello";
  const CliResult ga = cider("generate -m " + quote(gguf) + gen), gb = cider("generate -m " + quote(out.string()) + gen);
  ASSERT_EQ(ga.status, 0) << ga.err;
  ASSERT_EQ(gb.status, 0) << gb.err;
  EXPECT_EQ(ga.out, gb.out);
  const CliResult i = cider("inspect -m " + quote(out.string()));
  ASSERT_EQ(i.status, 0) << i.err;
  EXPECT_NE(i.out.find("weights in memory: native, 1.4 MiB (linear layers: Q4_K x12, Q6_K x3; embedding in its blocks)"),
            std::string::npos) << i.out;
  const CliResult hf = cider("convert -m " + quote(kTiny) + " -o " + quote((scratch_dir() / "tiny-native").string()) +
                             " --weights native");
  EXPECT_EQ(hf.status, 2);
  EXPECT_NE(hf.err.find("not a cider model converted with --weights native"), std::string::npos) << hf.err;
  EXPECT_FALSE(fs::exists(scratch_dir() / "tiny-native"));
}

// ---- Hostile inputs (issue 19): each reproducer of the fuzzing report fails with its rule, exit 2, quickly --------

// A copy of cider-tiny whose config.json is `config` (the weights and tokenizer linked, not copied).
fs::path tiny_with_config(const std::string& name, const std::string& config) {
  const fs::path dir = scratch_dir() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"model.safetensors", "tokenizer.json"}) fs::create_symlink(fs::path(kTiny) / f, dir / f);
  std::ofstream(dir / "config.json") << config;
  return dir;
}

nlohmann::json tiny_config() { return nlohmann::json::parse(slurp(kTiny + "/config.json")); }

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;  // ASan reserves terabytes of address space: no ulimit -v under it
#else
constexpr bool kAsan = false;
#endif

// Runs a command that must be rejected: exit 2, the rule in the message, within 3 s and (outside ASan) within 1 GiB
// of address space (an allocation beyond it would end as "out of memory", not with the rule).
void expect_rejected(const std::string& args, const std::string& want, const std::string& input = "") {
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult r = cider(args, input, kAsan ? "" : "ulimit -v 1048576;");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status, 2) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << args << "\nwant: " << want << "\ngot: " << r.err;
  EXPECT_LT(s, 3.0) << args;
}

TEST_F(Cli, HostileConfigsAreRejectedWithTheirKeyBeforeAnythingIsAllocated) {
  const std::string gen = " -p x --max-tokens 2";
  // 1. Qwen2 sliding layers with a negative max_window_layers: was a heap write before layer_sliding.
  auto c = tiny_config();
  c["architectures"] = {"Qwen2ForCausalLM"};
  c["use_sliding_window"] = true;
  c["sliding_window"] = 16;
  c["max_window_layers"] = -5;
  expect_rejected("generate -m " + quote(tiny_with_config("negwin", c.dump()).string()) + gen,
                  "max_window_layers must be >= 0 (the first layer with a sliding window); got -5");
  // 2. heads × head_dim wrapping to 0 in int64.
  c = tiny_config();
  c["num_attention_heads"] = int64_t{1} << 62;
  c["num_key_value_heads"] = int64_t{1} << 62;
  c["head_dim"] = 4;
  expect_rejected("generate -m " + quote(tiny_with_config("wrap", c.dump()).string()) + gen,
                  "num_attention_heads must be in [1, 4096]; got 4611686018427387904");
  // 3. Deep nesting, in a key nobody reads.
  std::string deep = tiny_config().dump();
  deep.pop_back();
  deep += ", \"junk\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_rejected("generate -m " + quote(tiny_with_config("deep", deep).string()) + gen,
                  "must nest JSON arrays and objects at most 128 levels deep");
  // 8. A huge layer count: rejected before the per-layer table (was 2 GB and 11-19 s).
  c = tiny_config();
  c["num_hidden_layers"] = 2147483647;
  expect_rejected("generate -m " + quote(tiny_with_config("layers", c.dump()).string()) + gen,
                  "num_hidden_layers must be in [1, 1024]; got 2147483647");
  // 9. Rope theta 0 / negative (NaN and inf are not JSON numbers; cider's own format is tested in test_config).
  for (double theta : {0.0, -1.0}) {
    c = tiny_config();
    c["rope_parameters"]["rope_theta"] = theta;
    expect_rejected("generate -m " + quote(tiny_with_config("theta", c.dump()).string()) + gen,
                    "rope_theta must be positive");
  }
}

TEST_F(Cli, HostileOptionsAndPathsAreRejected) {
  const std::string tiny = " -m " + quote(kTiny);
  // 4. Threads: bounded (was: spawning until the process table was full).
  expect_rejected("generate" + tiny + " -p x --threads 2147483647", "--threads must be in [1, ");
  expect_rejected("generate" + tiny + " -p x --threads 9999", "per CPU this process may use");
  // 5. logits --out: never a device, FIFO, symlink or one of the model's files.
  const std::string ok = "logits" + tiny + " --tokens 1,2 --out ";
  expect_rejected(ok + "/dev/full", "--out must be a new path or a regular file, which cider replaces; got \"/dev/full\", which is a character device");
  const fs::path fifo = scratch_dir() / "fifo";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_rejected(ok + quote(fifo.string()), "which is a FIFO");
  const fs::path link = scratch_dir() / "link.npy";
  fs::remove(link);
  fs::create_symlink(scratch_dir() / "target.npy", link);
  expect_rejected(ok + quote(link.string()), "got a symbolic link");
  EXPECT_FALSE(fs::exists(scratch_dir() / "target.npy"));
  const auto size_before = fs::file_size(fs::path(kTiny) / "model.safetensors");
  expect_rejected(ok + quote(kTiny + "/model.safetensors"), "--out must not be one of the inputs");
  EXPECT_EQ(fs::file_size(fs::path(kTiny) / "model.safetensors"), size_before);
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
  // A regular file is replaced whole, and no temporary file is left beside it.
  const fs::path out = scratch_dir() / "replace" / "l.npy";
  fs::create_directories(out.parent_path());
  std::ofstream(out) << "old";
  const CliResult w = cider(ok + quote(out.string()));
  ASSERT_EQ(w.status, 0) << w.err;
  EXPECT_EQ(model::read_npy_f32(out.string()).shape, (std::vector<int64_t>{2, 4096}));
  EXPECT_EQ(std::distance(fs::directory_iterator(out.parent_path()), fs::directory_iterator()), 1);
  // 8. Text inputs are bounded: /dev/zero never ends.
  expect_rejected("perplexity" + tiny + " -f /dev/zero --ctx 64", "must hold at most 268435456 bytes");
  // 9. -m '' is not the embedded model; a negative or too large seed is not wrapped.
  expect_rejected("generate -m '' -p x", "-m must name a model directory or .gguf file; got \"\"");
  for (const char* seed : {"-1", "18446744073709551616"}) {
    const CliResult r = cider("generate" + tiny + " -p x --seed " + seed);
    EXPECT_GT(r.status, 2) << seed;
    EXPECT_NE(r.err.find("--seed: must be an integer in [0, 2^64 - 1]; got "), std::string::npos) << r.err;
  }
}

TEST_F(Cli, DocumentedDefaultsWorkAndOneBadChatLineDoesNotEndTheChat) {
  // 10. --ctx 0 means the model's context for perplexity too.
  const std::string file = (scratch_dir() / "long.txt").string();
  std::ofstream(file) << slurp(kTiny + "/README.md") << slurp(kTiny + "/README.md") << slurp(kTiny + "/README.md");
  const CliResult p = cider("perplexity -m " + quote(kTiny) + " -f " + quote(file) + " --ctx 0");
  if (p.status == 2) {
    EXPECT_NE(p.err.find("the text must have at least ctx - 1 = 1023 tokens after BOS"), std::string::npos) << p.err;
  } else {
    EXPECT_EQ(p.status, 0) << p.err;
    EXPECT_NE(p.out.find("ctx 1024 stride 1023"), std::string::npos) << p.out;
  }
  // 10. inspect on head_dim 32 (the default group 64 does not divide it): the cache gets group 32.
  const CliResult i = cider("inspect -m " + quote(kSource + "/tests/data/hf_fixtures/qwen3"));
  ASSERT_EQ(i.status, 0) << i.err;
  EXPECT_NE(i.out.find("kv cache: k4v4/hadamard/g32/kchan/o1"), std::string::npos) << i.out;  // 32 / 32 outliers
  const CliResult g64 = cider("inspect -m " + quote(kSource + "/tests/data/hf_fixtures/qwen3") + " --kv-group-size 64");
  EXPECT_EQ(g64.status, 2);
  EXPECT_NE(g64.err.find("the key head dim must be a multiple of group_size 64; got 32"), std::string::npos)
      << g64.err;
  // 10. One invalid UTF-8 line is refused; the next one is answered.
  const std::string args = "chat -m " + quote(kTiny) + " --temperature 0 --max-tokens 4 --weights f32 --kv f32";
  const CliResult r = cider(args, "bad \xff\xfe line\nThe Python interpreter\n");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("the line was not sent"), std::string::npos) << r.err;
  EXPECT_FALSE(r.out.empty());
}

TEST_F(Cli, RunningOutOfMemoryIsAMessageNotACrash) {
  // 10. std::bad_alloc: a 200 MB text (sparse: zeros) read under a 150 MB address-space limit.
  if (kAsan) GTEST_SKIP() << "ASan needs far more address space than the limit";
  const fs::path big = scratch_dir() / "sparse.txt";
  { std::ofstream(big) << ""; }
  fs::resize_file(big, 200u << 20);
  const CliResult r = cider("perplexity -m " + quote(kTiny) + " -f " + quote(big.string()) + " --ctx 64", "",
                            "ulimit -v 153600;");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("cider: error: out of memory: an allocation failed (std::bad_alloc)"), std::string::npos)
      << r.err;
  fs::remove(big);
}

TEST_F(Cli, AFullDiskIsReportedAsSuchAndLeavesNothingBehind) {
  // 10. A 64 KiB tmpfs (needs root and mount; skipped elsewhere): the write fails with the system's reason, naming
  // the output, and no partial or temporary file remains.
  const fs::path mnt = scratch_dir() / "tinyfs";
  fs::create_directories(mnt);
  if (std::system(("mount -t tmpfs -o size=64k tmpfs " + quote(mnt.string()) + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (not root?)";
  const CliResult c = cider("convert -m " + quote(kTiny) + " -o " + quote((mnt / "conv").string()) + " --weights w8a8");
  const CliResult l = cider("logits -m " + quote(kTiny) + " --tokens 1,2,3,4,5,6,7,8 --out " + quote((mnt / "l.npy").string()));
  const auto left = std::distance(fs::directory_iterator(mnt), fs::directory_iterator());
  EXPECT_EQ(std::system(("umount " + quote(mnt.string())).c_str()), 0);
  EXPECT_EQ(c.status, 2) << c.err;
  EXPECT_NE(c.err.find("No space left on device"), std::string::npos) << c.err;
  EXPECT_NE(c.err.find("conv.tmp-"), std::string::npos) << c.err;
  EXPECT_EQ(l.status, 2) << l.err;
  EXPECT_NE(l.err.find("[write_npy] cannot write \"" + (mnt / "l.npy").string()), std::string::npos) << l.err;
  EXPECT_NE(l.err.find("No space left on device"), std::string::npos) << l.err;
  EXPECT_EQ(left, 0) << "no partial output, no temporary file";
}

TEST_F(Cli, BenchAttentionTakesTheAttentionBenchmarksOptions) {
  const CliResult h = cider("bench attention --help");
  ASSERT_EQ(h.status, 0) << h.err;
  for (const char* part : {"usage: cider bench attention", "--ctx", "--dims", "--json", "--cputime"})
    EXPECT_NE(h.out.find(part), std::string::npos) << part << "\n" << h.out;
  const CliResult r = cider("bench attention --ctx 256 --dims 64 --hq 4 --hkv 2 --reps 1 --mode hot --no-nn --no-append --json");
  ASSERT_EQ(r.status, 0) << r.err;
  std::istringstream lines(r.out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("case").get<std::string>(), "decode_hq4_hkv2_d64_ctx256");
    EXPECT_GT(j.at("best_ms").get<double>(), 0.0);
  }
  EXPECT_GE(n, 1);
  const CliResult bad = cider("bench attention --no-such-option");
  EXPECT_EQ(bad.status, 2);
  EXPECT_NE(bad.out.find("usage: cider bench attention"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace cider
