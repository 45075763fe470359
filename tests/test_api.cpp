// The C++ facade (include/cider/cider.hpp) against the engine it wraps: generation on cider-tiny equals transformers'
// greedy tokens, decode equals model::Model::forward, the sampler, cache, attention and linear layers equal the nn /
// model classes bit for bit, and errors are cider::Error naming the operation.
#include "cider/cider.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/sampler.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "nn/linear.h"
#include "quant/affine.h"
#include "support/test_support.h"

namespace {

const std::string kSource = CIDER_SOURCE_DIR;
const std::string kTiny = kSource + "/models/cider-tiny";

template <typename F>
void expect_error(F&& f, cider::ErrorCode code, const std::string& op, const std::string& value) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << op;
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    const std::string msg = e.what();
    if (!op.empty()) {
      EXPECT_NE(msg.find("[" + op + "]"), std::string::npos) << msg;
    }
    EXPECT_NE(msg.find(value), std::string::npos) << msg;
  }
}

TEST(Api, GreedyGenerationEqualsTransformersOnCiderTiny) {
  std::ifstream f(kSource + "/tests/data/cider_tiny/reference.json");
  std::stringstream text;
  text << f.rdbuf();
  const nlohmann::json ref = nlohmann::json::parse(text.str());
  cider::ModelOptions o;
  o.weights = "f32";
  o.kv.format = "f32";
  const cider::Model model = cider::Model::load(kTiny, o);
  const cider::ModelInfo info = model.info();
  EXPECT_EQ(info.vocab_size, 4096);
  EXPECT_EQ(info.eos_ids, (std::vector<int32_t>{1}));
  EXPECT_EQ(info.kv, "f32");
  for (const auto& e : ref) {
    const std::string prompt = e["prompt"].get<std::string>();
    const std::vector<int32_t> ids = e["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> full = e["greedy"].get<std::vector<int32_t>>();
    const std::vector<int32_t> want(full.begin() + static_cast<std::ptrdiff_t>(ids.size()), full.end());
    EXPECT_EQ(model.tokenize(prompt), ids);
    cider::Session s = model.new_session();
    cider::GenerateConfig g;
    g.sampler.temperature = 0.0;
    g.max_tokens = static_cast<int64_t>(want.size());
    std::string streamed;
    const cider::Generation r = s.generate(prompt, g, [&](std::string_view piece) { streamed += piece; });
    EXPECT_EQ(r.tokens, want);
    EXPECT_EQ(r.text, model.detokenize(want, true));
    EXPECT_EQ(streamed, r.text);
    EXPECT_EQ(r.reason, cider::StopReason::kMaxTokens);
    EXPECT_STREQ(cider::stop_reason_name(r.reason), "max tokens");
    EXPECT_TRUE(r.last_token_pending);
    EXPECT_EQ(r.prompt_tokens, static_cast<int64_t>(ids.size()));
    EXPECT_EQ(s.position(), static_cast<int64_t>(full.size()) - 1);
    EXPECT_GT(s.kv_bytes(), 0u);
  }
}

// decode() == model::Model::forward; a generation continued token by token through decode() and a Sampler gives
// the tokens of one generate() call (the session's history feeds the repetition penalty the same way).
TEST(Api, DecodeEqualsForwardAndGenerateEqualsTheManualLoop) {
  const cider::Model model = cider::Model::load(kTiny);
  cider::model::ModelOptions mo;
  mo.kv = cider::model::default_kv(cider::model::Device::kCPU);  // what the facade's default KVSpec means
  const auto ref = cider::model::Model::load(kTiny, mo);
  cider::Session s = model.new_session();
  auto rs = ref->new_session();
  const std::vector<int32_t> prompt = s.tokenize("Once upon a time");
  const std::vector<float> got = s.decode(prompt);
  std::vector<float> want(got.size());
  ref->forward(*rs, prompt.data(), static_cast<int64_t>(prompt.size()), want.data(), false);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  // All rows (the LM head over every row may round differently from the last row alone: compare like with like).
  std::vector<float> rows(prompt.size() * 4096), want_rows(rows.size());
  EXPECT_EQ(s.trim(static_cast<int64_t>(prompt.size())), static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(s.position(), 0);
  s.decode(prompt, rows, true);
  auto rs2 = ref->new_session();
  ref->forward(*rs2, prompt.data(), static_cast<int64_t>(prompt.size()), want_rows.data(), true);
  EXPECT_EQ(0, std::memcmp(rows.data(), want_rows.data(), rows.size() * sizeof(float)));

  cider::GenerateConfig g;
  g.sampler.seed = 1234;
  g.sampler.repeat_penalty = 1.2;
  g.max_tokens = 12;
  cider::Session a = model.new_session();
  const cider::Generation r = a.generate(std::span<const int32_t>(prompt), g);
  ASSERT_EQ(r.tokens.size(), 12u);

  cider::Session b = model.new_session();
  cider::Sampler sampler(g.sampler);
  std::vector<int32_t> history = prompt;
  std::vector<float> logits = b.decode(prompt);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 12; ++i) {
    const int32_t t = sampler.sample(logits, history);
    tokens.push_back(t);
    history.push_back(t);
    if (i < 11) logits = b.decode(std::span<const int32_t>(&t, 1));
  }
  EXPECT_EQ(tokens, r.tokens);
}

TEST(Api, ErrorsAreCiderErrorsNamingTheOperation) {
  cider::ModelOptions o;
  o.weights = "w3a8";
  expect_error([&] { (void)cider::Model::load(kTiny, o); }, cider::ErrorCode::kInvalidArgument, "cider::Model::load",
               "w3a8");
  o = {};
  o.kv.group_size = 48;
  expect_error([&] { (void)cider::Model::load(kTiny, o); }, cider::ErrorCode::kInvalidArgument, "cider::Model::load",
               "got 48");
  o = {};
  o.ctx = 4;
  const cider::Model model = cider::Model::load(kTiny, o);
  cider::Session s = model.new_session();
  const std::vector<int32_t> five = {0, 1, 2, 3, 4};
  expect_error([&] { (void)s.decode(five); }, cider::ErrorCode::kOutOfRange, "cider::Session::decode",
               "0 + 5 tokens");
  expect_error([&] { (void)s.decode(std::vector<int32_t>{7, -3}); }, cider::ErrorCode::kOutOfRange,
               "cider::Session::decode", "got -3 at index 1");
  expect_error([&] { (void)s.decode(std::vector<int32_t>{}); }, cider::ErrorCode::kInvalidArgument,
               "cider::Session::decode", "got 0");
  std::vector<float> small(10);
  expect_error([&] { s.decode(std::vector<int32_t>{7}, small); }, cider::ErrorCode::kInvalidArgument,
               "cider::Session::decode", "got 10");
  EXPECT_EQ(s.position(), 0);
  expect_error([&] { (void)s.generate("a long prompt that does not fit in four tokens of context"); },
               cider::ErrorCode::kOutOfRange, "cider::Session::generate", "context");
  EXPECT_EQ(s.position(), 0);
  cider::SamplerConfig sc;
  sc.top_p = 0.0;
  expect_error([&] { cider::Sampler bad(sc); }, cider::ErrorCode::kInvalidArgument, "cider::Sampler", "top_p");
  cider::KVSpec spec;
  spec.format = "k7v4";
  expect_error([&] { cider::KVCache c(spec); }, cider::ErrorCode::kInvalidArgument, "cider::KVCache", "k7v4");
  spec = {};
  spec.rotation = "spin";
  expect_error([&] { cider::KVCache c(spec); }, cider::ErrorCode::kInvalidArgument, "cider::KVCache", "spin");
  spec = {};
  spec.key_layout = "rows";
  expect_error([&] { cider::KVCache c(spec); }, cider::ErrorCode::kInvalidArgument, "cider::KVCache", "rows");
  spec.format = "bf16";
  spec.key_layout = "channel";
  expect_error([&] { cider::KVCache c(spec); }, cider::ErrorCode::kInvalidArgument, "cider::KVCache", "key_layout");
  // The one error type: the engine's own errors are cider::Error too.
  EXPECT_THROW(s.detokenize(std::vector<int32_t>{99999}), cider::Error);
  EXPECT_STREQ(cider::error_code_name(cider::ErrorCode::kOutOfRange), "out of range");
}

TEST(Api, SamplerEqualsModelSampler) {
  auto rng = cider::test::make_rng(901);
  cider::SamplerConfig c;
  c.seed = rng();
  c.top_k = 20;
  c.repeat_penalty = 1.1;
  cider::Sampler s(c);
  cider::model::SamplerParams p;
  p.seed = c.seed;
  p.top_k = 20;
  p.repeat_penalty = 1.1;
  cider::model::Sampler ref(p);
  std::vector<int32_t> history;
  for (int i = 0; i < 40; ++i) {
    const std::vector<float> logits = cider::test::randn(rng, 200, 2.0f);
    const int32_t t = s.sample(logits, history);
    EXPECT_EQ(t, ref.sample(logits.data(), 200, history));
    history.push_back(t);
  }
}

TEST(Api, KVCacheAndAttentionEqualTheNnClasses) {
  auto rng = cider::test::make_rng(902);
  const int64_t B = 1, Hq = 4, Hkv = 2, D = 64, T = 70, L = 2;
  std::vector<float> k = cider::test::randn(rng, B * Hkv * T * D), v = cider::test::randn(rng, B * Hkv * T * D),
                     q = cider::test::randn(rng, B * Hq * L * D);
  for (const char* format : {"k8v4", "k4v3", "k4v4c", "bf16"}) {  // k4v4c: k4v4 with key_layout "channel"
    SCOPED_TRACE(format);
    const bool kchan = std::string(format) == "k4v4c";
    cider::KVSpec spec;
    spec.format = kchan ? "k4v4" : format;
    if (kchan) spec.key_layout = "channel";
    cider::KVCache cache(spec);
    cache.append({k.data(), {B, Hkv, T, D}}, {v.data(), {B, Hkv, T, D}});
    EXPECT_EQ(cache.offset(), T);
    const bool quantized = std::string(format) != "bf16";
    EXPECT_EQ(cache.quantized(), quantized);
    std::unique_ptr<cider::nn::KVCache> ref;
    if (quantized) {
      cider::nn::QuantizedKVCacheConfig qc;
      qc.k_bits = format[1] - '0';
      qc.v_bits = format[3] - '0';
      if (kchan) qc.key_layout = cider::nn::KeyLayout::kChannel;
      ref = std::make_unique<cider::nn::QuantizedKVCache>(qc);
    } else {
      cider::nn::PlainKVCacheConfig pc;
      pc.dtype = cider::DType::kBF16;
      ref = std::make_unique<cider::nn::PlainKVCache>(pc);
    }
    ref->update_and_fetch(cider::TensorView(k.data(), cider::DType::kF32, {B, Hkv, T, D}),
                          cider::TensorView(v.data(), cider::DType::kF32, {B, Hkv, T, D}));
    EXPECT_EQ(cache.nbytes(), static_cast<size_t>(ref->nbytes()));
    std::vector<float> out(B * Hq * L * D), want(out.size());
    cider::attention({q.data(), {B, Hq, L, D}}, cache, 0.125f, {}, {out.data(), {B, Hq, L, D}});
    cider::nn::AttentionMask m;
    m.kind = cider::kernels::MaskKind::kCausal;
    cider::nn::attention(cider::TensorView(q.data(), cider::DType::kF32, {B, Hq, L, D}), *ref, 0.125f, m,
                         cider::TensorView(want.data(), cider::DType::kF32, {B, Hq, L, D}));
    EXPECT_EQ(0, std::memcmp(out.data(), want.data(), out.size() * sizeof(float)));

    const cider::KVSnapshot snap = cache.snapshot();
    EXPECT_EQ(cache.trim(1000), T);
    cache.restore(snap);
    EXPECT_EQ(cache.offset(), T);
    std::vector<float> out2(out.size());
    cider::attention({q.data(), {B, Hq, L, D}}, cache, 0.125f, {}, {out2.data(), {B, Hq, L, D}});
    EXPECT_EQ(out2, out);
  }
  cider::KVCache cache;
  std::vector<float> bad(4, std::numeric_limits<float>::infinity());
  expect_error([&] { cache.append({bad.data(), {1, 1, 1, 4}}, {bad.data(), {1, 1, 1, 4}}); },
               cider::ErrorCode::kInvalidArgument, "cider::KVCache::append", "finite");
  std::vector<float> out(4);
  cider::AttentionMask needs_tensor;
  needs_tensor.kind = cider::MaskKind::kBool;
  expect_error([&] { cider::attention({out.data(), {1, 1, 1, 4}}, cache, 1.0f, needs_tensor, {out.data(), {1, 1, 1, 4}}); },
               cider::ErrorCode::kInvalidArgument, "cider::attention", "mask.mask");
}

TEST(Api, LinearEqualsTheNnLayers) {
  auto rng = cider::test::make_rng(903);
  const int64_t N = 40, K = 128, M = 3;
  std::vector<float> w = cider::test::randn(rng, N * K), x = cider::test::randn(rng, M * K),
                     bias = cider::test::randn(rng, N);
  const cider::TensorView wv(w.data(), cider::DType::kF32, {N, K}), bv(bias.data(), cider::DType::kF32, {N}),
      xv(x.data(), cider::DType::kF32, {M, K});
  for (auto format : {cider::LinearFormat::kW8A8, cider::LinearFormat::kW4A8}) {
    const cider::Linear layer = cider::Linear::from_float(format, {w.data(), {N, K}}, cider::TensorRef(bias.data(), {N}), 64);
    EXPECT_EQ(layer.format(), format);
    EXPECT_EQ(layer.in_features(), K);
    EXPECT_EQ(layer.out_features(), N);
    EXPECT_EQ(layer.group_size(), 64);
    std::vector<float> out(M * N), want(M * N);
    layer.forward({x.data(), {M, K}}, {out.data(), {M, N}});
    if (format == cider::LinearFormat::kW8A8) {
      const auto ref = cider::nn::Int8Linear::from_float(wv, &bv, 64);
      ref.forward(xv, cider::TensorView(want.data(), cider::DType::kF32, {M, N}));
      EXPECT_EQ(layer.nbytes(), ref.nbytes());
    } else {
      const auto ref = cider::nn::Int4Linear::from_float(wv, &bv, 64);
      ref.forward(xv, cider::TensorView(want.data(), cider::DType::kF32, {M, N}));
      EXPECT_EQ(layer.nbytes(), ref.nbytes());
    }
    EXPECT_EQ(out, want);
  }
  expect_error([&] { (void)cider::Linear::from_float(cider::LinearFormat::kW8A8, {w.data(), {N, K}}, {}, 48); },
               cider::ErrorCode::kInvalidArgument, "", "48");
  std::vector<float> out(M * N), x_wide(M * (K + 1), 0.5f);  // an input of the wrong width (its own buffer)
  const cider::Linear layer = cider::Linear::from_float(cider::LinearFormat::kW8A8, {w.data(), {N, K}});
  expect_error([&] { layer.forward({x_wide.data(), {M, K + 1}}, {out.data(), {M, N}}); },
               cider::ErrorCode::kShapeMismatch, "", "129");
}

}  // namespace

// The state as arrays (the seeds' `state`): the snapshot's planes are the nn snapshot's bytes with the documented
// dtypes and shapes, from_state rebuilds a cache that attends identically, and every wrong array is named.
TEST(Api, KVSnapshotPlanesAndFromStateRoundTrip) {
  auto rng = cider::test::make_rng(903);
  const int64_t B = 2, Hq = 4, Hkv = 2, Dk = 64, Dv = 32, T = 77, L = 3;
  std::vector<float> k = cider::test::randn(rng, B * Hkv * T * Dk), v = cider::test::randn(rng, B * Hkv * T * Dv),
                     q = cider::test::randn(rng, B * Hq * L * Dk);
  for (const char* layout : {"token", "channel", ""}) {
    SCOPED_TRACE(layout);
    cider::KVSpec spec;
    spec.format = *layout ? "k4v3" : "f16";
    spec.key_layout = layout;
    spec.group_size = *layout ? 32 : 0;
    spec.scale_dtype = cider::DType::kBF16;
    spec.seed = 5;
    cider::KVCache cache(spec);
    const cider::KVSpec filled = cache.spec();
    EXPECT_EQ(filled.format, spec.format);
    EXPECT_EQ(filled.rotation, *layout ? "hadamard" : "none");
    EXPECT_EQ(filled.key_layout, *layout ? layout : "token");
    EXPECT_EQ(filled.seed, 5u);
    cache.append({k.data(), {B, Hkv, T, Dk}}, {v.data(), {B, Hkv, T, Dv}});
    const cider::KVSnapshot snap = cache.snapshot();
    const size_t planes = std::string(layout) == "channel" ? 7 : *layout ? 6 : 2;
    ASSERT_EQ(snap.num_planes(), planes);
    std::vector<cider::TensorRef> refs;
    for (size_t i = 0; i < planes; ++i) refs.push_back(snap.plane(i));
    if (*layout) {
      EXPECT_EQ(refs[0].dtype, cider::DType::kU32);
      EXPECT_EQ(refs[0].shape, (std::vector<int64_t>{B, Hkv, T, Dk * 4 / 32}));
      EXPECT_EQ(refs[3].shape, (std::vector<int64_t>{B, Hkv, T, Dv * 3 / 32}));
      EXPECT_EQ(refs[4].dtype, cider::DType::kBF16);
      EXPECT_EQ(refs[4].shape, (std::vector<int64_t>{B, Hkv, T, Dv / 32}));
      if (planes == 7) {
        EXPECT_EQ(refs[1].shape, (std::vector<int64_t>{B, Hkv, 3, Dk}));  // ceil(77 / 32) blocks
        EXPECT_EQ(refs[6].shape, (std::vector<int64_t>{B, Hkv, 32, Dk}));
      } else {
        EXPECT_EQ(refs[1].shape, (std::vector<int64_t>{B, Hkv, T, Dk / 32}));
      }
    } else {
      EXPECT_EQ(refs[1].dtype, cider::DType::kF16);
      EXPECT_EQ(refs[1].shape, (std::vector<int64_t>{B, Hkv, T, Dv}));
    }
    const cider::KVSnapshot back = cider::KVSnapshot::from_state(snap.spec(), refs);
    cider::KVCache other(snap.spec());
    other.restore(back);
    EXPECT_EQ(other.offset(), T);
    std::vector<float> a(B * Hq * L * Dv), b(a.size());
    cider::attention({q.data(), {B, Hq, L, Dk}}, cache, 0.125f, {}, {a.data(), {B, Hq, L, Dv}});
    cider::attention({q.data(), {B, Hq, L, Dk}}, other, 0.125f, {}, {b.data(), {B, Hq, L, Dv}});
    EXPECT_EQ(a, b);
    for (size_t i = 0; i < planes; ++i) {
      const cider::TensorRef p = back.plane(i);
      size_t n = 1;
      for (int64_t d : p.shape) n *= static_cast<size_t>(d);
      n *= (p.dtype == cider::DType::kU32 ? 4 : 2);
      EXPECT_EQ(0, std::memcmp(p.data, refs[i].data, n)) << "plane " << i;
    }
    // Every array is checked against the layout the others imply.
    std::vector<cider::TensorRef> bad = refs;
    bad.back().shape[1] += 1;  // its heads disagree with array 0's
    expect_error([&] { (void)cider::KVSnapshot::from_state(snap.spec(), bad); }, cider::ErrorCode::kShapeMismatch,
                 "cider::KVSnapshot::from_state", "got");
    bad = refs;
    bad[0].dtype = cider::DType::kF32;
    expect_error([&] { (void)cider::KVSnapshot::from_state(snap.spec(), bad); }, cider::ErrorCode::kShapeMismatch,
                 "cider::KVSnapshot::from_state", "array 0");
    bad.pop_back();
    expect_error([&] { (void)cider::KVSnapshot::from_state(snap.spec(), bad); }, cider::ErrorCode::kInvalidArgument,
                 "cider::KVSnapshot::from_state", std::to_string(planes - 1));
    expect_error([&] { (void)snap.plane(planes); }, cider::ErrorCode::kOutOfRange, "cider::KVSnapshot::plane",
                 std::to_string(planes));
  }
  EXPECT_EQ(cider::KVSnapshot::from_state(cider::KVSpec{}, {}).length(), 0);  // an empty state
}

// The facade's affine quantization is quant::affine_quantize's, and quantized_matmul nn's, bit for bit.
TEST(Api, AffineQuantizationEqualsTheQuantLayer) {
  auto rng = cider::test::make_rng(904);
  const int64_t N = 5, K = 192;
  std::vector<float> w = cider::test::randn(rng, N * K), x = cider::test::randn(rng, 3 * K);
  std::vector<uint32_t> packed(N * K * 4 / 32);
  std::vector<float> scales(N * K / 64), biases(scales.size()), deq(N * K), y(3 * N);
  cider::affine_quantize({w.data(), {N, K}}, 64, 4, {packed.data(), cider::DType::kU32, {N, K * 4 / 32}},
                         {scales.data(), {N, K / 64}}, {biases.data(), {N, K / 64}});
  const cider::Tensor ref = cider::quant::affine_quantize(cider::TensorView(w.data(), cider::DType::kF32, {N, K}), 64, 4)
                                .packed;
  EXPECT_EQ(0, std::memcmp(packed.data(), ref.buffer.data(), packed.size() * 4));
  cider::affine_dequantize({packed.data(), cider::DType::kU32, {N, K * 4 / 32}}, {scales.data(), {N, K / 64}},
                           {biases.data(), {N, K / 64}}, 64, 4, {deq.data(), {N, K}});
  const cider::Tensor ref_deq = cider::quant::affine_dequantize(
      cider::TensorView(packed.data(), cider::DType::kU32, {N, K * 4 / 32}),
      cider::TensorView(scales.data(), cider::DType::kF32, {N, K / 64}),
      cider::TensorView(biases.data(), cider::DType::kF32, {N, K / 64}), 64, 4, cider::DType::kF32);
  EXPECT_EQ(0, std::memcmp(deq.data(), ref_deq.buffer.data(), deq.size() * 4));
  cider::quantized_matmul({x.data(), {3, K}}, {packed.data(), cider::DType::kU32, {N, K * 4 / 32}},
                          {scales.data(), {N, K / 64}}, {biases.data(), {N, K / 64}}, true, 64, 4, {y.data(), {3, N}});
  for (int64_t m = 0; m < 3; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double want = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < K; ++kk) {
        want += static_cast<double>(x[m * K + kk]) * deq[n * K + kk];
        mag += std::fabs(static_cast<double>(x[m * K + kk]) * deq[n * K + kk]);
      }
      EXPECT_LE(std::fabs(y[m * N + n] - want), (K + 2) * 1.2e-7 * mag * 2);  // float32 sums of q·s + b
    }
  expect_error([&] { cider::affine_quantize({w.data(), {N, K}}, 48, 4, {packed.data(), cider::DType::kU32, {N, 24}},
                                            {scales.data(), {N, 4}}, {biases.data(), {N, 4}}); },
               cider::ErrorCode::kInvalidArgument, "affine_quantize", "48");
}

// Chat prompts in the model's format, stop tokens that end generation as EOS does, and perplexity through the facade.
TEST(Api, ChatPromptStopTokensAndPerplexity) {
  const cider::Model model = cider::Model::load(kTiny);
  EXPECT_EQ(model.chat_format(), "raw");  // cider-tiny is a base model
  EXPECT_TRUE(model.chat_end_tokens().empty());
  const std::string prompt = model.chat_prompt({{"system", "Be brief."}, {"user", "Hello"}});
  EXPECT_NE(prompt.find("Hello"), std::string::npos);
  expect_error([&] { (void)model.chat_prompt({{"assistant", "x"}}); }, cider::ErrorCode::kInvalidArgument,
               "cider::Model::chat_prompt", "assistant");
  cider::GenerateConfig g;
  g.sampler.temperature = 0.0;
  g.max_tokens = 8;
  cider::Session s = model.new_session();
  const cider::Generation free_run = s.generate("The Python interpreter", g);
  ASSERT_GE(free_run.tokens.size(), 3u);
  g.stop_tokens = {free_run.tokens[2]};
  cider::Session s2 = model.new_session();
  const cider::Generation stopped = s2.generate("The Python interpreter", g);
  EXPECT_EQ(stopped.reason, cider::StopReason::kEos);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + 3));
  g.stop_tokens = {99999};
  expect_error([&] { (void)model.new_session().generate("x", g); }, cider::ErrorCode::kOutOfRange,
               "cider::Session::generate", "99999");

  std::string text;
  for (int i = 0; i < 40; ++i) text += "The Python interpreter reads a program and runs it line by line. ";
  cider::ModelOptions bo;
  bo.kv.format = "bf16";
  const cider::Model base = cider::Model::load(kTiny, bo);
  const cider::PerplexityReport r = cider::perplexity(model, text, {.ctx = 64}, &base);
  EXPECT_TRUE(r.has_baseline);
  EXPECT_GE(r.windows, 5);
  EXPECT_GT(r.ppl, 1.0);
  EXPECT_GE(r.kl, 0.0);
  EXPECT_GT(r.top1, 0.5);
  EXPECT_NE(r.report.find("KL"), std::string::npos);
  const cider::PerplexityReport alone = cider::perplexity(model, text, {.ctx = 64});
  EXPECT_FALSE(alone.has_baseline);
  EXPECT_EQ(alone.ppl, r.ppl);  // the tested model's windows are the same with or without a baseline
  expect_error([&] { (void)cider::perplexity(model, text, {.ctx = 1}); }, cider::ErrorCode::kInvalidArgument,
               "cider::perplexity", "ctx");
}
