// The model-level C API (include/cider/cider.h: cider_model_*, cider_session_*, cider_decode, cider_sample,
// cider_tokenize, cider_detokenize) on the embedded model cider-tiny, driven as a C caller would: logits equal
// model::Model::forward bit for bit, tokens equal model::Sampler's and the tokenizer's, and every failure returns
// the right status with a message naming the C function and the value.
#include "cider/cider.h"

#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "model/model.h"
#include "model/sampler.h"
#include "support/test_support.h"

namespace {

const std::string kTiny = std::string(CIDER_SOURCE_DIR) + "/models/cider-tiny";

void expect_failure(cider_status st, cider_status want, const std::string& op, const std::string& value) {
  EXPECT_EQ(st, want) << cider_last_error();
  const std::string msg = cider_last_error();
  EXPECT_NE(msg.find("[" + op + "]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(value), std::string::npos) << msg;
}

// A loaded model, freed at the end of the test.
struct ModelHandle {
  cider_model* m = nullptr;
  explicit ModelHandle(const cider_model_options* o = nullptr) {
    EXPECT_EQ(cider_model_load(kTiny.c_str(), o, &m), CIDER_OK) << cider_last_error();
  }
  ~ModelHandle() { cider_model_free(m); }
};

struct SessionHandle {
  cider_session* s = nullptr;
  explicit SessionHandle(const cider_model* m) {
    EXPECT_EQ(cider_session_create(m, &s), CIDER_OK) << cider_last_error();
  }
  ~SessionHandle() { cider_session_free(s); }
};

std::vector<int32_t> tokenize(const cider_model* m, const std::string& text, int add_special = 1) {
  int64_t n = 0;
  const cider_status st = cider_tokenize(m, text.data(), text.size(), add_special, nullptr, 0, &n);
  EXPECT_EQ(st, n == 0 ? CIDER_OK : CIDER_ERR_OUT_OF_RANGE);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  int64_t n2 = -1;
  EXPECT_EQ(cider_tokenize(m, text.data(), text.size(), add_special, ids.data(), n, &n2), CIDER_OK)
      << cider_last_error();
  EXPECT_EQ(n2, n);
  return ids;
}

TEST(CApiModel, InfoDescribesCiderTiny) {
  cider_model_options o = cider_model_options_default();
  o.weights = "f32";
  o.kv = "f32";
  o.ctx = 512;
  ModelHandle h(&o);
  ASSERT_NE(h.m, nullptr);
  cider_model_info info{};
  ASSERT_EQ(cider_model_info_get(h.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_EQ(info.vocab_size, 4096);
  EXPECT_EQ(info.context_length, 512);
  EXPECT_EQ(info.hidden_size, 256);
  EXPECT_EQ(info.num_layers, 8);
  EXPECT_EQ(info.num_heads, 4);
  EXPECT_EQ(info.num_kv_heads, 2);
  EXPECT_EQ(info.head_dim, 64);
  EXPECT_EQ(info.bos_id, 0);
  ASSERT_EQ(info.num_eos, 1);
  EXPECT_EQ(info.eos_ids[0], 1);
  EXPECT_GT(info.weight_bytes, 0u);
  EXPECT_STREQ(info.architecture, "llama");
  EXPECT_STREQ(info.weights, "f32");
  EXPECT_STREQ(info.kv, "f32");
  EXPECT_STREQ(info.device, "cpu");

  // Heads of 128: the default cache takes blocks of 128 positions; kv_group_size 64 or an explicit kv, their own.
  {
    const std::string d128 = cider::test::repo_file("tests/data/gguf_d128/model.gguf");
    using Case = std::tuple<int, const char*, const char*>;
    for (const auto& [gs, kv, want] : {Case{0, nullptr, "k4v4/hadamard/g128/kchan/o4/vsym/rx"},
                                       Case{64, nullptr, "k4v4/hadamard/g64/kchan/o4/vsym/rx"},
                                       Case{0, "k4v4", "k4v4/hadamard/g64"}}) {
      cider_model_options d = cider_model_options_default();
      d.kv_group_size = gs;
      d.kv = kv;
      cider_model* m = nullptr;
      ASSERT_EQ(cider_model_load(d128.c_str(), &d, &m), CIDER_OK) << cider_last_error();
      cider_model_info i;
      ASSERT_EQ(cider_model_info_get(m, &i), CIDER_OK) << cider_last_error();
      EXPECT_STREQ(i.kv, want) << gs;
      cider_model_free(m);
    }
  }

  cider_model_options tok = cider_model_options_default();
  tok.kv = "k4v4";
  tok.kv_layout = "token";
  ModelHandle t(&tok);
  ASSERT_EQ(cider_model_info_get(t.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64");

  cider_model_options out = cider_model_options_default();  // per-channel keys with 2 outlier channels per block
  out.kv = "k4v4";
  out.kv_layout = "channel";
  out.kv_outliers = 2;
  ModelHandle o2(&out);
  ASSERT_EQ(cider_model_info_get(o2.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64/kchan/o2");

  out.kv_outliers = -1;  // automatic: head_dim 64 / 32
  ModelHandle oa(&out);
  ASSERT_EQ(cider_model_info_get(oa.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64/kchan/o2");
  out.kv_outliers = 0;  // an explicit format: none
  ModelHandle o0(&out);
  ASSERT_EQ(cider_model_info_get(o0.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64/kchan");

  out.kv_values = "symmetric";  // symmetric values on an explicit format
  ModelHandle os(&out);
  ASSERT_EQ(cider_model_info_get(os.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64/kchan/vsym");
  out.kv_values = "sym";
  cider_model* bad = nullptr;
  EXPECT_EQ(cider_model_load(kTiny.c_str(), &out, &bad), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("kv values must be affine or symmetric"), std::string::npos)
      << cider_last_error();
  out.kv_values = nullptr;
  out.kv_recent = "exact";  // the recent block read unquantized, on an explicit per-channel format
  ModelHandle orx(&out);
  ASSERT_EQ(cider_model_info_get(orx.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64/kchan/rx");
  out.kv_recent = "always";
  EXPECT_EQ(cider_model_load(kTiny.c_str(), &out, &bad), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("kv recent must be quantized or exact"), std::string::npos)
      << cider_last_error();
  out.kv_recent = nullptr;
  // imatrix reaches the loader: with bf16 weights it has nothing to fit; a file that is not there is named.
  out.imatrix = "/nonexistent/imx.safetensors";
  EXPECT_EQ(cider_model_load(kTiny.c_str(), &out, &bad), CIDER_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cider_last_error()).find("--imatrix weights the fits of a requantizing block format"),
            std::string::npos) << cider_last_error();
  out.weights = "q4_0";
  EXPECT_NE(cider_model_load(kTiny.c_str(), &out, &bad), CIDER_OK);
  EXPECT_NE(std::string(cider_last_error()).find("/nonexistent/imx.safetensors"), std::string::npos)
      << cider_last_error();
  out.weights = nullptr;
  out.imatrix = nullptr;

  // The defaults: bf16 weights, on the CPU k5v4 with per-channel keys, head_dim/32 = 2 outlier channels and symmetric
  // values
  ModelHandle d;
  ASSERT_EQ(cider_model_info_get(d.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.weights, "bf16");
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64/kchan/o2/vsym/rx");
  cider_model_options token = cider_model_options_default();  // the default cache with per-token keys: no outliers
  token.kv_layout = "token";
  ModelHandle dt(&token);
  ASSERT_EQ(cider_model_info_get(dt.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64/vsym");
  token.kv_values = "affine";
  ModelHandle da(&token);
  ASSERT_EQ(cider_model_info_get(da.m, &info), CIDER_OK) << cider_last_error();
  EXPECT_STREQ(info.kv, "k4v4/hadamard/g64");
  EXPECT_EQ(info.context_length, 1024);  // the model's maximum
}

// cider_decode gives exactly the logits of model::Model::forward: last rows and all rows, over two calls (the
// second continues the first), for the default formats and a quantized W8A8 model.
TEST(CApiModel, DecodeEqualsModelForwardBitForBit) {
  for (const char* weights : {"bf16", "w8a8"}) {
    SCOPED_TRACE(weights);
    cider_model_options o = cider_model_options_default();
    o.weights = weights;
    ModelHandle h(&o);
    SessionHandle s(h.m);

    cider::model::ModelOptions mo;
    mo.weights = cider::model::parse_weight_format(weights);
    mo.kv = cider::model::default_kv(cider::model::Device::kCPU);  // what the C API's default means
    const auto ref = cider::model::Model::load(kTiny, mo);
    auto rs = ref->new_session();
    const int64_t V = ref->config().vocab_size;

    const std::vector<int32_t> prompt = tokenize(h.m, "The Python interpreter reads");
    ASSERT_GE(prompt.size(), 3u);
    const auto n = static_cast<int64_t>(prompt.size());
    std::vector<float> got(static_cast<size_t>(n * V)), want(static_cast<size_t>(n * V));
    ASSERT_EQ(cider_decode(s.s, prompt.data(), n, got.data(), got.size(), 1), CIDER_OK) << cider_last_error();
    ref->forward(*rs, prompt.data(), n, want.data(), true);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));

    const int32_t next[2] = {100, 200};
    std::vector<float> g1(static_cast<size_t>(V)), w1(static_cast<size_t>(V));
    ASSERT_EQ(cider_decode(s.s, next, 2, g1.data(), g1.size(), 0), CIDER_OK) << cider_last_error();
    ref->forward(*rs, next, 2, w1.data(), false);
    EXPECT_EQ(0, std::memcmp(g1.data(), w1.data(), g1.size() * sizeof(float)));

    int64_t pos = -1;
    ASSERT_EQ(cider_session_position(s.s, &pos), CIDER_OK);
    EXPECT_EQ(pos, n + 2);
    size_t kv = 0;
    ASSERT_EQ(cider_session_kv_bytes(s.s, &kv), CIDER_OK);
    EXPECT_EQ(kv, rs->kv_bytes());

    // trim + decode again: the same logits as the first time.
    int64_t removed = -1;
    ASSERT_EQ(cider_session_trim(s.s, 2, &removed), CIDER_OK);
    EXPECT_EQ(removed, 2);
    std::vector<float> g2(static_cast<size_t>(V));
    ASSERT_EQ(cider_decode(s.s, next, 2, g2.data(), g2.size(), 0), CIDER_OK) << cider_last_error();
    EXPECT_EQ(0, std::memcmp(g2.data(), w1.data(), g2.size() * sizeof(float)));
  }
}

TEST(CApiModel, SessionOutlivesItsModel) {
  cider_session* s = nullptr;
  {
    ModelHandle h;
    ASSERT_EQ(cider_session_create(h.m, &s), CIDER_OK) << cider_last_error();
  }
  const int32_t tok[1] = {0};
  std::vector<float> logits(4096);
  EXPECT_EQ(cider_decode(s, tok, 1, logits.data(), logits.size(), 0), CIDER_OK) << cider_last_error();
  cider_session_free(s);
}

// cider_sample draws the tokens of model::Sampler with the same parameters (one seeded sequence per sampler).
TEST(CApiModel, SampleEqualsModelSampler) {
  auto rng = cider::test::make_rng(811);
  const int64_t V = 300;
  cider_sampler_params p = cider_sampler_params_default();
  EXPECT_EQ(p.temperature, 0.8);
  EXPECT_EQ(p.top_k, 40);
  p.seed = rng();
  p.repeat_penalty = 1.3;
  cider_sampler* cs = nullptr;
  ASSERT_EQ(cider_sampler_create(&p, &cs), CIDER_OK) << cider_last_error();
  cider::model::SamplerParams mp;
  mp.temperature = p.temperature;
  mp.top_k = p.top_k;
  mp.top_p = p.top_p;
  mp.min_p = p.min_p;
  mp.repeat_penalty = p.repeat_penalty;
  mp.repeat_window = p.repeat_window;
  mp.seed = p.seed;
  cider::model::Sampler ref(mp);
  std::vector<int32_t> history;
  for (int step = 0; step < 50; ++step) {
    const std::vector<float> logits = cider::test::randn(rng, static_cast<size_t>(V), 2.0f);
    int32_t got = -1;
    ASSERT_EQ(cider_sample(cs, logits.data(), V, history.data(), static_cast<int64_t>(history.size()), &got),
              CIDER_OK)
        << cider_last_error();
    EXPECT_EQ(got, ref.sample(logits.data(), V, history)) << "step " << step;
    history.push_back(got);
  }
  cider_sampler_free(cs);
}

TEST(CApiModel, TokenizeAndDetokenizeRoundTrip) {
  ModelHandle h;
  const auto ref = cider::model::Model::load(kTiny, {});
  const std::string text = "Hello world: the C API speaks UTF-8 — ünïcödé too.";
  const std::vector<int32_t> ids = tokenize(h.m, text);
  EXPECT_EQ(ids, ref->tokenizer().encode(text, true));
  EXPECT_EQ(tokenize(h.m, text, 0), ref->tokenizer().encode(text, false));
  EXPECT_EQ(tokenize(h.m, ""), ref->tokenizer().encode("", true));

  size_t len = 0;
  EXPECT_EQ(cider_detokenize(h.m, ids.data(), static_cast<int64_t>(ids.size()), 1, nullptr, 0, &len),
            CIDER_ERR_OUT_OF_RANGE);
  std::vector<char> buf(len + 1, 'x');
  size_t len2 = 0;
  ASSERT_EQ(cider_detokenize(h.m, ids.data(), static_cast<int64_t>(ids.size()), 1, buf.data(), buf.size(), &len2),
            CIDER_OK)
      << cider_last_error();
  EXPECT_EQ(len2, len);
  EXPECT_EQ(std::string(buf.data()), ref->tokenizer().decode(ids, true));
  EXPECT_EQ(std::string(buf.data()), text);
  ASSERT_EQ(cider_detokenize(h.m, ids.data(), static_cast<int64_t>(ids.size()), 0, buf.data(), buf.size(), &len2),
            CIDER_ERR_OUT_OF_RANGE);  // the BOS text makes it longer than the buffer
  std::vector<char> big(len2 + 1);
  ASSERT_EQ(cider_detokenize(h.m, ids.data(), static_cast<int64_t>(ids.size()), 0, big.data(), big.size(), &len2),
            CIDER_OK);
  EXPECT_EQ(std::string(big.data()), ref->tokenizer().decode(ids, false));
}

TEST(CApiModel, LoadErrorsNameTheFunctionAndTheValue) {
  cider_model* m = reinterpret_cast<cider_model*>(&m);
  expect_failure(cider_model_load(nullptr, nullptr, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load",
                 "path must not be NULL");
  EXPECT_EQ(m, nullptr);
  expect_failure(cider_model_load(kTiny.c_str(), nullptr, nullptr), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load",
                 "out");
  cider_model_options o = cider_model_options_default();
  o.weights = "w3a8";
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "w3a8");
  o = cider_model_options_default();
  o.kv = "k9v4";
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "k9v4");
  o = cider_model_options_default();
  o.kv_rotation = "spin";
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "spin");
  o = cider_model_options_default();
  o.kv = "bf16";
  o.kv_rotation = "hadamard";
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load",
                 "hadamard");
  o = cider_model_options_default();
  o.kv_layout = "rows";
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "rows");
  o = cider_model_options_default();
  o.kv = "bf16";
  o.kv_layout = "channel";
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load",
                 "key_layout");
  o = cider_model_options_default();
  o.kv = "k4v4";
  o.kv_outliers = 4;  // per-token keys: nothing to refine
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load",
                 "key_layout channel");
  o = cider_model_options_default();
  o.kv_outliers = -2;
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load",
                 "kv.key_outliers must be -1 (automatic), 0 (the default's) or a count; got -2");
  o = cider_model_options_default();
  o.kv_group_size = 48;
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "got 48");
  o = cider_model_options_default();
  o.ctx = -5;
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "got -5");
  o = cider_model_options_default();
  o.device = "tpu";
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "tpu");
  o = cider_model_options_default();
  o.threads = -1;
  expect_failure(cider_model_load(kTiny.c_str(), &o, &m), CIDER_ERR_INVALID_ARGUMENT, "cider_model_load", "got -1");
  const std::string missing = kTiny + "-does-not-exist";
  EXPECT_NE(cider_model_load(missing.c_str(), nullptr, &m), CIDER_OK);
  EXPECT_NE(std::string(cider_last_error()).find("does-not-exist"), std::string::npos) << cider_last_error();
  EXPECT_EQ(m, nullptr);
  cider_model_info info{};
  expect_failure(cider_model_info_get(nullptr, &info), CIDER_ERR_INVALID_ARGUMENT, "cider_model_info_get",
                 "model must not be NULL");
  cider_session* s = nullptr;
  expect_failure(cider_session_create(nullptr, &s), CIDER_ERR_INVALID_ARGUMENT, "cider_session_create",
                 "model must not be NULL");
  cider_model_free(nullptr);
  cider_session_free(nullptr);
  cider_sampler_free(nullptr);
}

TEST(CApiModel, DecodeErrorsLeaveTheSessionUnchanged) {
  cider_model_options o = cider_model_options_default();
  o.ctx = 8;
  ModelHandle h(&o);
  SessionHandle s(h.m);
  std::vector<float> logits(4096 * 9);
  const int32_t toks[9] = {0, 5, 6, 7, 8, 9, 10, 11, 12};
  expect_failure(cider_decode(s.s, toks, 0, logits.data(), logits.size(), 0), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_decode", "got 0");
  expect_failure(cider_decode(s.s, nullptr, 1, logits.data(), logits.size(), 0), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_decode", "tokens must not be NULL");
  expect_failure(cider_decode(s.s, toks, 1, nullptr, 0, 0), CIDER_ERR_INVALID_ARGUMENT, "cider_decode",
                 "logits must not be NULL");
  expect_failure(cider_decode(s.s, toks, 9, logits.data(), logits.size(), 0), CIDER_ERR_OUT_OF_RANGE, "cider_decode",
                 "0 + 9 tokens");
  const int32_t bad[2] = {3, 4096};
  expect_failure(cider_decode(s.s, bad, 2, logits.data(), logits.size(), 0), CIDER_ERR_OUT_OF_RANGE, "cider_decode",
                 "got 4096 at index 1");
  expect_failure(cider_decode(s.s, toks, 2, logits.data(), 4096, 1), CIDER_ERR_INVALID_ARGUMENT, "cider_decode",
                 "got 4096");
  expect_failure(cider_decode(nullptr, toks, 1, logits.data(), logits.size(), 0), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_decode", "session must not be NULL");
  int64_t pos = -1;
  ASSERT_EQ(cider_session_position(s.s, &pos), CIDER_OK);
  EXPECT_EQ(pos, 0);
  ASSERT_EQ(cider_decode(s.s, toks, 8, logits.data(), logits.size(), 0), CIDER_OK) << cider_last_error();
  expect_failure(cider_decode(s.s, toks, 1, logits.data(), logits.size(), 0), CIDER_ERR_OUT_OF_RANGE, "cider_decode",
                 "8 + 1 tokens");
  ASSERT_EQ(cider_session_position(s.s, &pos), CIDER_OK);
  EXPECT_EQ(pos, 8);
  expect_failure(cider_session_trim(s.s, -1, nullptr), CIDER_ERR_INVALID_ARGUMENT, "cider_session_trim", "got -1");
  int64_t removed = -1;
  ASSERT_EQ(cider_session_trim(s.s, 100, &removed), CIDER_OK);
  EXPECT_EQ(removed, 8);
  expect_failure(cider_session_position(s.s, nullptr), CIDER_ERR_INVALID_ARGUMENT, "cider_session_position",
                 "position");
  expect_failure(cider_session_kv_bytes(nullptr, nullptr), CIDER_ERR_INVALID_ARGUMENT, "cider_session_kv_bytes",
                 "session must not be NULL");
}

TEST(CApiModel, SampleAndTokenizerErrors) {
  cider_sampler_params p = cider_sampler_params_default();
  p.temperature = -1.0;
  cider_sampler* cs = nullptr;
  expect_failure(cider_sampler_create(&p, &cs), CIDER_ERR_INVALID_ARGUMENT, "cider_sampler_create", "-1");
  expect_failure(cider_sampler_create(nullptr, &cs), CIDER_ERR_INVALID_ARGUMENT, "cider_sampler_create",
                 "params must not be NULL");
  p = cider_sampler_params_default();
  ASSERT_EQ(cider_sampler_create(&p, &cs), CIDER_OK);
  std::vector<float> logits(10, 0.0f);
  int32_t tok = -1;
  expect_failure(cider_sample(cs, logits.data(), 0, nullptr, 0, &tok), CIDER_ERR_INVALID_ARGUMENT, "cider_sample",
                 "got 0");
  expect_failure(cider_sample(cs, nullptr, 10, nullptr, 0, &tok), CIDER_ERR_INVALID_ARGUMENT, "cider_sample",
                 "logits must not be NULL");
  expect_failure(cider_sample(cs, logits.data(), 10, nullptr, 0, nullptr), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_sample", "token_out");
  expect_failure(cider_sample(cs, logits.data(), 10, nullptr, 3, &tok), CIDER_ERR_INVALID_ARGUMENT, "cider_sample",
                 "history must not be NULL");
  const int32_t hist[2] = {1, 12};
  expect_failure(cider_sample(cs, logits.data(), 10, hist, 2, &tok), CIDER_ERR_OUT_OF_RANGE, "cider_sample",
                 "got 12 at index 1");
  logits[3] = std::numeric_limits<float>::quiet_NaN();
  expect_failure(cider_sample(cs, logits.data(), 10, nullptr, 0, &tok), CIDER_ERR_INVALID_ARGUMENT, "cider_sample",
                 "at token 3");
  expect_failure(cider_sample(nullptr, logits.data(), 10, nullptr, 0, &tok), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_sample", "sampler must not be NULL");
  cider_sampler_free(cs);

  ModelHandle h;
  int64_t n = -1;
  expect_failure(cider_tokenize(h.m, "Hello", 5, 1, nullptr, 0, &n), CIDER_ERR_OUT_OF_RANGE, "cider_tokenize",
                 "capacity 0");
  EXPECT_GT(n, 0);
  int32_t ids[1];
  expect_failure(cider_tokenize(h.m, nullptr, 3, 1, ids, 1, &n), CIDER_ERR_INVALID_ARGUMENT, "cider_tokenize",
                 "text must not be NULL");
  expect_failure(cider_tokenize(h.m, "a", 1, 1, nullptr, 4, &n), CIDER_ERR_INVALID_ARGUMENT, "cider_tokenize",
                 "tokens must not be NULL");
  expect_failure(cider_tokenize(h.m, "\xff\xfe", 2, 1, ids, 1, &n), CIDER_ERR_INVALID_ARGUMENT, "cider_tokenize",
                 "UTF-8");
  expect_failure(cider_tokenize(nullptr, "a", 1, 1, ids, 1, &n), CIDER_ERR_INVALID_ARGUMENT, "cider_tokenize",
                 "model must not be NULL");
  const int32_t bad[2] = {5, 99999};
  char text[64];
  size_t len = 0;
  expect_failure(cider_detokenize(h.m, bad, 2, 0, text, sizeof text, &len), CIDER_ERR_OUT_OF_RANGE,
                 "cider_detokenize", "got 99999");
  expect_failure(cider_detokenize(h.m, bad, -1, 0, text, sizeof text, &len), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_detokenize", "got -1");
  expect_failure(cider_detokenize(h.m, bad, 1, 0, text, sizeof text, nullptr), CIDER_ERR_INVALID_ARGUMENT,
                 "cider_detokenize", "text_len");
}

}  // namespace
