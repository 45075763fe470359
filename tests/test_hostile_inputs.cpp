// Hostile inputs (issue 19) at the library level: one regression test per reproducer of the fuzzing report that is
// not a CLI invocation (those are in test_cli.cpp: Cli.Hostile*; model files in test_model.cpp: ModelHostile.*).
// Each must end in a cider::Error naming the operation, the rule and the value — never a crash, a huge allocation or
// a silent NaN.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cider/cider.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "support/test_support.h"

namespace cider {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

template <typename F>
void expect_error(F&& f, ErrorCode code, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "expected cider::Error " << error_code_name(code);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << w << "\n" << e.what();
  }
}

fs::path scratch() {
  static const fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("cider_hostile_" + std::to_string(getpid()));
    fs::create_directories(p);
    return p;
  }();
  return d;
}
struct CleanUp : ::testing::Environment {
  void TearDown() override { fs::remove_all(scratch()); }
};
const auto* const kCleanUp = ::testing::AddGlobalTestEnvironment(new CleanUp);

std::string deep(int levels) { return std::string(static_cast<size_t>(levels), '[') + std::string(static_cast<size_t>(levels), ']'); }

// ---- 3. nesting --------------------------------------------------------------------------------------------------

TEST(HostileJson, NestingDepthIsMeasuredWithoutRecursionAndSkipsStrings) {
  const std::string a = R"({"a": [1, {"b": "[[[[{{{{"}], "c": "\"[" })";
  EXPECT_EQ(json_nesting_depth(a.data(), a.data() + a.size(), 1000), 3);
  const std::string d = deep(1'000'000);
  EXPECT_EQ(json_nesting_depth(d.data(), d.data() + d.size(), limits::kMaxJsonDepth), limits::kMaxJsonDepth + 1);
  const std::string ok = deep(limits::kMaxJsonDepth);
  EXPECT_NO_THROW(check_json_nesting(ok.data(), ok.data() + ok.size(), "t", "x"));
  const std::string bad = deep(limits::kMaxJsonDepth + 1);
  expect_error([&] { check_json_nesting(bad.data(), bad.data() + bad.size(), "t", "x"); }, ErrorCode::kCorrupt,
               {"[t] x must nest JSON arrays and objects at most 128 levels deep"});
}

TEST(HostileJson, EveryParserRejectsDeepNestingBeforeParsing) {
  const std::string d = deep(100'000);
  // tokenizer.json
  expect_error([&] { model::Tokenizer::from_json("{\"model\": " + d + "}"); }, ErrorCode::kCorrupt,
               {"tokenizer.json must nest JSON"});
  // config.json, in a key that is never read
  expect_error([&] { model::parse_hf_config("{\"junk\": " + d + "}", "config.json"); }, ErrorCode::kCorrupt,
               {"config.json must nest JSON"});
  // cider's own config and the MLX quantization entry
  expect_error([&] { model::config_from_json("{\"a\": " + d + "}", "cider.json"); }, ErrorCode::kCorrupt,
               {"cider.json must nest JSON"});
  expect_error([&] { model::parse_mlx_quantization("{\"a\": " + d + "}", "mlx.json"); }, ErrorCode::kCorrupt,
               {"mlx.json must nest JSON"});
  // a safetensors header
  const std::string header = "{\"__metadata__\": {\"x\": " + d + "}}";
  const fs::path st = scratch() / "deep.safetensors";
  {
    std::ofstream f(st, std::ios::binary);
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
  }
  expect_error([&] { model::SafetensorsFile::open(st.string()); }, ErrorCode::kCorrupt, {"the header must nest JSON"});
  // an index file
  const fs::path dir = scratch() / "deep_index";
  fs::create_directories(dir);
  std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": " << d << "}";
  expect_error([&] { model::SafetensorsSet::open_dir(dir.string()); }, ErrorCode::kCorrupt,
               {"model.safetensors.index.json' must nest JSON"});
}

// ---- 8. allocations from ids ----------------------------------------------------------------------------------------

TEST(HostileTokenizer, HugeTokenIdsAreRejectedBeforeTheIdTableGrows) {
  const std::string base = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "added_tokens": [)";
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { model::Tokenizer::from_json(base + R"({"id": 400000000, "content": "<x>"}]})"); },
               ErrorCode::kCorrupt, {"added_tokens[].id must be a token id in [0, 16777215]; got 400000000"});
  expect_error([&] { model::Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 3000000000}, "merges": []}})"); },
               ErrorCode::kCorrupt, {"model.vocab value must be a token id in [0, 16777215]; got 3000000000"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

// ---- 9. values accepted without validation --------------------------------------------------------------------------

json hf_base() {
  return json{{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 100},       {"hidden_size", 64},
              {"intermediate_size", 128},               {"num_hidden_layers", 2}, {"num_attention_heads", 4},
              {"num_key_value_heads", 2},               {"max_position_embeddings", 512}};
}

TEST(HostileConfig, CiderFormatValuesAreValidatedLikeEveryOtherFormat) {
  const std::string good = model::config_to_json(model::parse_hf_config(hf_base().dump(), "config.json"));
  EXPECT_NO_THROW(model::config_from_json(good, "cider"));
  struct Case {
    const char* path;  // "rope.theta" etc.
    const char* value;
    const char* word;
  };
  for (const Case& c : {Case{"theta", "nan", "rope.theta must be positive and finite; got nan"},
                        Case{"theta", "0", "rope.theta must be positive and finite; got 0"},
                        Case{"theta", "-1", "rope.theta must be positive and finite; got -1"},
                        Case{"theta", "inf", "rope.theta must be positive and finite; got inf"},
                        Case{"factor", "nan", "rope.factor must be positive and finite"}}) {
    json j = json::parse(good);
    j["rope"][c.path] = c.value;
    expect_error([&] { model::config_from_json(j.dump(), "cider"); }, ErrorCode::kCorrupt, {c.word});
  }
  for (const char* key : {"embed_scale", "norm_weight_offset", "attn_scale", "final_logit_softcap"}) {
    json j = json::parse(good);
    j[key] = "nan";
    expect_error([&] { model::config_from_json(j.dump(), "cider"); }, ErrorCode::kCorrupt, {"finite", "nan"});
  }
  json j = json::parse(good);
  j["num_layers"] = 2000000000;
  expect_error([&] { model::config_from_json(j.dump(), "cider"); }, ErrorCode::kCorrupt,
               {"num_layers must be in [1, 1024]; got 2000000000"});
}

TEST(HostileConfig, HfRopeFactorAndTokenIdsAreValidated) {
  json j = hf_base();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -1.0}};
  expect_error([&] { model::parse_hf_config(j.dump(), "config.json"); }, ErrorCode::kCorrupt,
               {"rope factor must be positive; got -1"});
  j = hf_base();
  j["bos_token_id"] = 100;
  expect_error([&] { model::parse_hf_config(j.dump(), "config.json"); }, ErrorCode::kCorrupt,
               {"bos_token_id must be < vocab_size = 100; got 100"});
  j = hf_base();
  j["sliding_window"] = -3;
  expect_error([&] { model::parse_hf_config(j.dump(), "config.json"); }, ErrorCode::kCorrupt,
               {"sliding_window must be >= 0"});
}

TEST(HostileConfig, MlxBitsAndGroupSizeAreNotNarrowed) {
  const int64_t big = (int64_t{1} << 32) + 64;
  json j = hf_base();
  j["quantization"] = {{"group_size", big}, {"bits", 4}};
  expect_error([&] { model::parse_mlx_quantization(j.dump(), "config.json"); }, ErrorCode::kCorrupt,
               {"\"group_size\" must be in [1, 65536]; got 4294967360"});
  j["quantization"] = {{"group_size", 64}, {"bits", (int64_t{1} << 32) + 4}};
  expect_error([&] { model::parse_mlx_quantization(j.dump(), "config.json"); }, ErrorCode::kCorrupt,
               {"\"bits\" must be in [1, 32]; got 4294967300"});
  j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"model.layers.0.mlp", {{"bits", -8}}}};
  expect_error([&] { model::parse_mlx_quantization(j.dump(), "config.json"); }, ErrorCode::kCorrupt,
               {"\"bits\" must be in [1, 32]; got -8"});
}

// ---- 4. threads --------------------------------------------------------------------------------------------------

TEST(HostileThreads, ThreadCountIsBounded) {
  EXPECT_GE(max_num_threads(), 1);
  EXPECT_LE(max_num_threads(), limits::kMaxThreadsAbsolute);
  EXPECT_EQ(max_num_threads(), std::min(limits::kMaxThreadsAbsolute, limits::kThreadsPerCpu * available_cpus()));
  const int before = num_threads();
  expect_error([] { set_num_threads(max_num_threads() + 1); }, ErrorCode::kInvalidArgument,
               {"[set_num_threads] the number of threads must be in [1, "});
  expect_error([] { set_num_threads(std::numeric_limits<int>::max()); }, ErrorCode::kInvalidArgument,
               {"per CPU this process may use"});
  EXPECT_EQ(num_threads(), before) << "a refused count leaves the pool as it was";
}

// ---- 5. output paths and 10. write errors ------------------------------------------------------------------------

TEST(HostileFiles, OutputPathsMustBeNewOrRegularAndNotAnInput) {
  const fs::path dir = scratch() / "out";
  fs::create_directories(dir);
  EXPECT_NO_THROW(check_output_path((dir / "new.npy").string(), {}, "op", "--out"));
  std::ofstream(dir / "regular.npy") << "x";
  EXPECT_NO_THROW(check_output_path((dir / "regular.npy").string(), {}, "op", "--out"));
  expect_error([] { check_output_path("/dev/null", {}, "op", "--out"); }, ErrorCode::kInvalidArgument,
               {"[op] --out must be a new path or a regular file", "a character device"});
  expect_error([&] { check_output_path(dir.string(), {}, "op", "--out"); }, ErrorCode::kInvalidArgument,
               {"a directory"});
  fs::create_symlink(dir / "regular.npy", dir / "link.npy");
  expect_error([&] { check_output_path((dir / "link.npy").string(), {}, "op", "--out"); }, ErrorCode::kInvalidArgument,
               {"symbolic link"});
  const fs::path model = scratch() / "model";
  fs::create_directories(model);
  std::ofstream(model / "weights.bin") << "w";
  fs::create_hard_link(model / "weights.bin", dir / "alias.bin");
  expect_error([&] { check_output_path((dir / "alias.bin").string(), {model.string()}, "op", "--out"); },
               ErrorCode::kInvalidArgument, {"must not be one of the inputs", "weights.bin"});
  expect_error([&] { check_output_path((model / "weights.bin").string(), {(model / "weights.bin").string()}, "op", "--out"); },
               ErrorCode::kInvalidArgument, {"must not be one of the inputs"});
  expect_error([] { check_output_path("", {}, "op", "--out"); }, ErrorCode::kInvalidArgument, {"must name a file"});
}

TEST(HostileFiles, AtomicFileReportsTheSystemsReasonAndLeavesNothingBehind) {
  const fs::path dir = scratch() / "atomic";
  fs::create_directories(dir);
  {
    AtomicFile f((dir / "a.bin").string(), "op");
    f.write("hello", 5);
    f.commit();
  }
  std::ifstream in(dir / "a.bin");
  std::string s;
  in >> s;
  EXPECT_EQ(s, "hello");
  // Not committed: no file, no temporary.
  { AtomicFile f((dir / "b.bin").string(), "op"); f.write("x", 1); }
  EXPECT_FALSE(fs::exists(dir / "b.bin"));
  // The rename fails (the target is a non-empty directory): the message has the reason, the temporary is gone.
  fs::create_directories(dir / "c.bin" / "inside");
  expect_error([&] {
    AtomicFile f((dir / "c.bin").string(), "op");
    f.write("x", 1);
    f.commit();
  }, ErrorCode::kIo, {"[op] cannot rename the temporary file over", "c.bin", "directory"});
  // A directory that does not exist: the reason, not "Success".
  expect_error([&] { AtomicFile f((dir / "no" / "such" / "d.bin").string(), "op"); }, ErrorCode::kIo,
               {"cannot create a temporary file beside", "No such file or directory"});
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(n, 1) << "only a.bin";
}

TEST(HostileFiles, TextInputsAreBounded) {
  const fs::path p = scratch() / "text.txt";
  std::ofstream(p) << std::string(1000, 'a');
  EXPECT_EQ(read_text_input(p.string(), "op", 1000).size(), 1000u);
  expect_error([&] { read_text_input(p.string(), "op", 999); }, ErrorCode::kOutOfRange,
               {"must hold at most 999 bytes; got 1000"});
  expect_error([] { read_text_input("/dev/zero", "op", 1 << 20); }, ErrorCode::kOutOfRange,
               {"\"/dev/zero\" must hold at most 1048576 bytes"});
  expect_error([] { read_text_input("/", "op"); }, ErrorCode::kIo, {"it is a directory"});
  expect_error([] { read_text_input("/nonexistent/x", "op"); }, ErrorCode::kIo, {"No such file or directory"});
}

// ---- 7. the quantized cache and large finite values -----------------------------------------------------------------

// keys = values = [1, 1, 1, 64] from -a to +a (rotation none: the stored bias is -a).
std::vector<float> ramp(float a) {
  std::vector<float> v(64);
  for (int i = 0; i < 64; ++i) v[static_cast<size_t>(i)] = -a + 2.0f * a * static_cast<float>(i) / 63.0f;
  return v;
}

TEST(HostileKvCache, Float16ScalesThatWouldOverflowAreAnErrorAtTheBoundary) {
  nn::QuantizedKVCacheConfig qc;
  qc.k_bits = qc.v_bits = 4;
  qc.rotation = nn::RotationKind::kNone;
  qc.scale_dtype = DType::kF16;
  nn::QuantizedKVCache cache(qc);
  std::vector<float> ok = ramp(65000.0f), big = ramp(70000.0f);
  const TensorView okv(ok.data(), DType::kF32, {1, 1, 1, 64}), bigv(big.data(), DType::kF32, {1, 1, 1, 64});
  ASSERT_NO_THROW(cache.update_and_fetch(okv, okv));
  EXPECT_EQ(cache.offset(), 1);
  expect_error([&] { cache.update_and_fetch(bigv, okv); }, ErrorCode::kOutOfRange,
               {"[kv_cache_update] keys at [0, 0, 0]", "float16 bias beyond its range of 65504",
                "use a bfloat16 or float32 bias dtype"});
  expect_error([&] { cache.update_and_fetch(okv, bigv); }, ErrorCode::kOutOfRange, {"values at [0, 0, 0]"});
  EXPECT_EQ(cache.offset(), 1) << "a refused append leaves the cache as it was";
  // Attention over what was kept stays finite.
  std::vector<float> q(64, 1e-3f), out(64);
  nn::attention(TensorView(q.data(), DType::kF32, {1, 1, 1, 64}), cache, 0.125f, {},
                TensorView(out.data(), DType::kF32, {1, 1, 1, 64}));
  EXPECT_TRUE(test::no_nan(out.data(), out.size()));
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
  // bfloat16 and float32 scales hold the same values.
  for (DType sd : {DType::kBF16, DType::kF32}) {
    qc.scale_dtype = sd;
    nn::QuantizedKVCache wide(qc);
    EXPECT_NO_THROW(wide.update_and_fetch(bigv, bigv)) << dtype_name(sd);
  }
}

TEST(HostileKvCache, PlainFloat16CacheRejectsOverflowAndNaN) {
  nn::PlainKVCacheConfig pc;
  pc.dtype = DType::kF16;
  nn::PlainKVCache cache(pc);
  std::vector<float> big = ramp(70000.0f), nan(64, std::nanf(""));
  const TensorView bigv(big.data(), DType::kF32, {1, 1, 1, 64}), nanv(nan.data(), DType::kF32, {1, 1, 1, 64});
  expect_error([&] { cache.update_and_fetch(bigv, bigv); }, ErrorCode::kOutOfRange, {"float16 value beyond its range"});
  expect_error([&] { cache.update_and_fetch(nanv, nanv); }, ErrorCode::kInvalidArgument, {"keys must be finite"});
  EXPECT_EQ(cache.offset(), 0);
  pc.dtype = DType::kBF16;
  nn::PlainKVCache wide(pc);
  EXPECT_NO_THROW(wide.update_and_fetch(bigv, bigv));
}

// ---- 6. and 9. the C API --------------------------------------------------------------------------------------------

cider_tensor desc(void* data, cider_dtype dt, std::vector<int64_t> shape) {
  cider_tensor t{};
  t.data = data;
  t.dtype = dt;
  t.rank = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

TEST(HostileCApi, NaNInputsAndOutOfRangeConfigAreRejected) {
  cider_kv_config cfg = cider_kv_config_default();
  cfg.quantized = 2;
  cider_kv_cache* cache = nullptr;
  EXPECT_EQ(cider_kv_cache_create(&cfg, &cache), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("config->quantized must be 0 (plain) or 1 (quantized); got 2"),
            std::string::npos)
      << cider_last_error();
  cfg = cider_kv_config_default();
  ASSERT_EQ(cider_kv_cache_create(&cfg, &cache), CIDER_OK) << cider_last_error();
  std::vector<float> kv(2 * 8 * 64, 0.5f), q(4 * 8 * 64, 0.25f), out(4 * 8 * 64);
  cider_tensor k = desc(kv.data(), CIDER_F32, {1, 2, 8, 64});
  ASSERT_EQ(cider_kv_cache_append(cache, &k, &k), CIDER_OK) << cider_last_error();
  cider_tensor qt = desc(q.data(), CIDER_F32, {1, 4, 8, 64}), ot = desc(out.data(), CIDER_F32, {1, 4, 8, 64});
  ASSERT_EQ(cider_attention(&qt, cache, 0.125f, 1, 0, nullptr, &ot), CIDER_OK) << cider_last_error();
  q[77] = std::nanf("");
  EXPECT_EQ(cider_attention(&qt, cache, 0.125f, 1, 0, nullptr, &ot), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("[cider_attention] queries must hold finite values; got nan at flat index 77"),
            std::string::npos)
      << cider_last_error();
  q[77] = 0.25f;
  EXPECT_EQ(cider_attention(&qt, cache, std::nanf(""), 1, 0, nullptr, &ot), CIDER_ERR_INVALID_ARGUMENT);
  // Additive masks may hide keys with -inf, never NaN.
  std::vector<float> mask(8 * 8, 0.0f);
  mask[1] = -INFINITY;
  cider_tensor mt = desc(mask.data(), CIDER_F32, {8, 8});
  EXPECT_EQ(cider_attention(&qt, cache, 0.125f, 3, 0, &mt, &ot), CIDER_OK) << cider_last_error();
  mask[2] = std::nanf("");
  EXPECT_EQ(cider_attention(&qt, cache, 0.125f, 3, 0, &mt, &ot), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("mask must hold finite values or -inf"), std::string::npos);
  // Sizes whose product overflows are refused before any pointer arithmetic.
  cider_tensor huge = desc(q.data(), CIDER_F32, {int64_t{1} << 40, int64_t{1} << 40, 1, 64});
  EXPECT_EQ(cider_attention(&huge, cache, 0.125f, 1, 0, nullptr, &ot), CIDER_ERR_OUT_OF_RANGE);
  EXPECT_NE(std::string(cider_last_error()).find("overflows 64-bit arithmetic"), std::string::npos)
      << cider_last_error();
  cider_kv_cache_free(cache);

  std::vector<float> w(64 * 64, 0.1f);
  std::vector<int8_t> qw(64 * 64);
  std::vector<float> sc(64);
  cider_tensor wt = desc(w.data(), CIDER_F32, {64, 64}), qwt = desc(qw.data(), CIDER_I8, {64, 64}),
               st = desc(sc.data(), CIDER_F32, {64});
  EXPECT_EQ(cider_int8_quantize_weights(&wt, 0, std::nanf(""), &qwt, &st), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("clip_percentile must be a number"), std::string::npos)
      << cider_last_error();
  w[3] = INFINITY;
  EXPECT_EQ(cider_int8_quantize_weights(&wt, 0, 0.0f, &qwt, &st), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("w must hold finite values; got inf at flat index 3"),
            std::string::npos)
      << cider_last_error();
}

}  // namespace
}  // namespace cider
