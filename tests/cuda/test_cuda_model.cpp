// The whole model on the GPU (--device cuda, model/cuda) against the CPU forward on the embedded model cider-tiny
// (Llama shape: hidden 256, 8 layers, 4 query / 2 KV heads of 64, vocab 4096, bf16 checkpoint), and a variant of it
// that switches on every other code path of the shared forward (Gemma's (1 + w) norms, q/k norms, sandwich norms,
// GeGLU, embedding scale, sliding-window layers, final soft-cap) on both engines alike.
//
// Tolerances (reported with RecordProperty and in every failure message):
//   * bf16 weights + bf16 KV: the GPU runs the CPU's computation in float32 except that its bf16 GEMM rounds each
//     linear layer's input to bf16 (cuda_ops.h dense_bf16); that is a bf16-sized perturbation of ~4 activations per
//     layer, the same kind the bf16 KV cache applies to 2 (k and v). So the scale is measured, not guessed:
//     δ_kv = max |CPU(bf16 KV) − CPU(f32 KV)| over all logits, and the GPU must stay within 8·δ_kv + 1e-4·max|logit|
//     (the last term: float32 reassociation when δ_kv is tiny).
//   * quantized (w8a8 / w8a8-g128 / w4a8 + k4v3): one rounding flip in an activation's int8 code or a KV code moves a
//     logit by a quantization step, so the bound is relative to the quantization error itself: with
//     δ_q = CPU(quantized) − CPU(bf16 weights + bf16 KV), the GPU's distance to CPU(quantized) must be at most
//     max |δ_q| (every logit) and at most 1/2 of mean |δ_q| on average (H200 run 1: 0.40 on the Gemma-like variant,
//     whose GeGLU + embedding scale make it far more sensitive than the trained model).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "model/cuda/gpu_model.h"
#include "model/model.h"
#include "model/transformer.h"
#include "support/test_support.h"

namespace cm = cider::model;
using cider::ErrorCode;

namespace {

const std::string kTiny = std::string(CIDER_SOURCE_DIR) + "/models/cider-tiny";

cm::ModelOptions options(const std::string& weights, const std::string& kv, cm::Device device) {
  cm::ModelOptions o;
  o.weights = cm::parse_weight_format(weights);
  o.kv = cm::parse_kv_format(kv);
  // The GPU kernels rotate with SO(4) only: name the rotation rather than take KVOptions' default (which may be one
  // the GPU refuses, e.g. hadamard).
  if (o.kv.quantized) o.kv.rotation = cm::parse_kv_rotation("so4-full");
  o.device = device;
  return o;
}

std::unique_ptr<cm::Model> load(const std::string& weights, const std::string& kv, cm::Device device) {
  return cm::Model::load(kTiny, options(weights, kv, device));
}

// n tokens of real text (the model's own sample file, repeated if short), BOS first.
std::vector<int32_t> text_tokens(const cm::Model& model, size_t n) {
  std::ifstream f(kTiny + "/samples.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<int32_t> ids = model.tokenizer().encode(ss.str(), true);
  EXPECT_GT(ids.size(), 16u);
  std::vector<int32_t> out;
  while (out.size() < n) out.insert(out.end(), ids.begin(), ids.end());
  out.resize(n);
  return out;
}

// All n rows of logits of one forward over the tokens (a fresh session), after a prefix of `prefill` tokens run as
// one call and the rest one token at a time (prefill == n: all at once).
std::vector<float> logits_of(const cm::Model& model, const std::vector<int32_t>& tokens, size_t prefill) {
  const auto V = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> out(tokens.size() * V, std::nanf(""));
  auto s = model.new_session();
  model.forward(*s, tokens.data(), static_cast<int64_t>(prefill), out.data(), true);
  for (size_t i = prefill; i < tokens.size(); ++i) model.forward(*s, &tokens[i], 1, out.data() + i * V, true);
  return out;
}

struct Diff {
  double max_abs = 0, mean_abs = 0, max_ref = 0;
  bool finite = true;
};
Diff diff(const std::vector<float>& got, const std::vector<float>& ref) {
  Diff d;
  EXPECT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) d.finite = false;  // NaN never passes
    const double e = std::fabs(static_cast<double>(got[i]) - ref[i]);
    d.max_abs = std::max(d.max_abs, e);
    d.mean_abs += e;
    d.max_ref = std::max(d.max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  d.mean_abs /= static_cast<double>(std::max<size_t>(1, ref.size()));
  return d;
}
std::string str(const Diff& d) {
  std::ostringstream s;
  s << "max|Δ| " << d.max_abs << ", mean|Δ| " << d.mean_abs << ", max|logit| " << d.max_ref
    << " (max|Δ|/max|logit| " << d.max_abs / std::max(d.max_ref, 1e-30) << ")";
  return s.str();
}

// The bf16 tolerance above, measured on the CPU for these tokens and this (possibly modified) model pair.
double bf16_tolerance(const std::vector<float>& cpu_bf16kv, const std::vector<float>& cpu_f32kv) {
  const Diff d = diff(cpu_bf16kv, cpu_f32kv);
  return 8.0 * d.max_abs + 1e-4 * d.max_ref;
}

int32_t argmax(const float* v, int64_t n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

// Greedy continuation of `prompt` by `steps` tokens.
std::vector<int32_t> greedy(const cm::Model& model, const std::vector<int32_t>& prompt, int steps) {
  const int64_t V = model.config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V));
  auto s = model.new_session();
  model.forward(*s, prompt.data(), static_cast<int64_t>(prompt.size()), logits.data(), false);
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    out.push_back(argmax(logits.data(), V));
    model.forward(*s, &out.back(), 1, logits.data(), false);
  }
  return out;
}

// Switches cider-tiny (loaded, before any session) into a Gemma-3-like variant so every branch of the forward runs:
// (1 + w) norms, q/k norms (the first D values of the layer's attention norm), sandwich norms (its norms reused),
// GeGLU, √hidden embedding scale, sliding-window layers (odd layers, window 24, the local rope table), final soft-cap.
// Legal: the model object is not const, only the accessor is. The GPU model must be uploaded afterwards.
void make_variant(cm::Model& model) {
  auto& impl = const_cast<cm::Model::Impl&>(model.impl());
  cm::ModelConfig& c = impl.config;
  c.norm_weight_offset = 1.0f;
  c.qk_norm = true;
  c.sandwich_norms = true;
  c.activation = cm::Activation::kGeluTanh;
  c.embed_scale = 16.0f;
  c.sliding_window = 24;
  for (size_t l = 0; l < c.layer_sliding.size(); ++l) c.layer_sliding[l] = l % 2 == 1 ? 1 : 0;
  c.final_logit_softcap = 30.0f;
  cm::RopeConfig local;
  local.theta = 1000.0;  // a different local base
  impl.inv_freq_local = cm::rope_inv_freq(local, c.head_dim);
  for (cm::LayerWeights& L : impl.w.layers) {
    L.q_norm = {"q_norm", L.attn_norm.w, c.head_dim};
    L.k_norm = {"k_norm", L.mlp_norm.w, c.head_dim};
    L.post_attn_norm = L.mlp_norm;
    L.post_mlp_norm = L.attn_norm;
  }
  impl.gpu.reset();
  if (model.options().device == cm::Device::kCUDA) impl.gpu = cm::gpu::upload_model(impl);
}

}  // namespace

// ---- options and errors ------------------------------------------------------------------------------------------

TEST(CudaModelOptions, DeviceNamesParse) {
  EXPECT_EQ(cm::parse_device("cpu"), cm::Device::kCPU);
  EXPECT_EQ(cm::parse_device("cuda"), cm::Device::kCUDA);
  EXPECT_STREQ(cm::device_name(cm::Device::kCUDA), "cuda");
  for (const char* bad : {"gpu", "CUDA", "", "cuda:0"}) {
    try {
      cm::parse_device(bad);
      ADD_FAILURE() << "accepted --device \"" << bad << "\"";
    } catch (const cider::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("cpu or cuda"), std::string::npos) << e.what();
    }
  }
}

// Without a usable GPU, --device cuda is a clear error from Model::load (never a silent CPU run).
TEST(CudaModelOptions, CudaWithoutGpuFails) {
  std::string why;
  if (cider::cuda::device_available(&why)) GTEST_SKIP() << "a GPU is present: the no-GPU error path cannot run";
  try {
    load("bf16", "bf16", cm::Device::kCUDA);
    ADD_FAILURE() << "loaded a model for --device cuda without a GPU";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("model.device"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("GPU"), std::string::npos) << e.what();
  }
}

TEST(CudaModel, UnsupportedOptionsFail) {
  CIDER_REQUIRE_GPU();
  try {
    load("f32", "bf16", cm::Device::kCUDA);
    ADD_FAILURE() << "--weights f32 accepted on the GPU";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
  }
}

// ---- against the CPU ---------------------------------------------------------------------------------------------

// 600 tokens: crosses the GPU's 512-token prefill chunk and the CPU's 256-token one.
TEST(CudaModel, Bf16LogitsMatchCpu) {
  CIDER_REQUIRE_GPU();
  auto cpu = load("bf16", "bf16", cm::Device::kCPU);
  auto cpu32 = load("bf16", "f32", cm::Device::kCPU);
  auto gpu = load("bf16", "bf16", cm::Device::kCUDA);
  const std::vector<int32_t> tokens = text_tokens(*cpu, 600);
  const std::vector<float> ref = logits_of(*cpu, tokens, tokens.size());
  const double tol = bf16_tolerance(ref, logits_of(*cpu32, tokens, tokens.size()));
  const Diff d = diff(logits_of(*gpu, tokens, tokens.size()), ref);
  RecordProperty("bf16_gpu_vs_cpu", str(d));
  RecordProperty("bf16_tolerance", std::to_string(tol));
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_abs, tol) << str(d) << "; tolerance " << tol;
}

TEST(CudaModel, Bf16GreedyContinuationMatchesCpu) {
  CIDER_REQUIRE_GPU();
  auto cpu = load("bf16", "bf16", cm::Device::kCPU);
  auto gpu = load("bf16", "bf16", cm::Device::kCUDA);
  const std::vector<int32_t> prompt = cpu->tokenizer().encode("The Python interpreter", true);
  EXPECT_EQ(greedy(*gpu, prompt, 16), greedy(*cpu, prompt, 16));
}

TEST(CudaModel, QuantizedLogitsMatchCpu) {
  CIDER_REQUIRE_GPU();
  auto base = load("bf16", "bf16", cm::Device::kCPU);
  const std::vector<int32_t> tokens = text_tokens(*base, 300);
  const std::vector<float> base_logits = logits_of(*base, tokens, 200);
  for (const char* w : {"w8a8", "w8a8-g128", "w4a8"}) {
    SCOPED_TRACE(w);
    auto cpu = load(w, "k4v3", cm::Device::kCPU);
    auto gpu = load(w, "k4v3", cm::Device::kCUDA);
    // Prefill 200 then decode 100: both the GEMM and the GEMV paths.
    const std::vector<float> ref = logits_of(*cpu, tokens, 200);
    const Diff dq = diff(ref, base_logits);
    const Diff d = diff(logits_of(*gpu, tokens, 200), ref);
    RecordProperty(std::string(w) + "_k4v3_gpu_vs_cpu", str(d));
    RecordProperty(std::string(w) + "_k4v3_quantization_error", str(dq));
    EXPECT_TRUE(d.finite);
    EXPECT_LE(d.max_abs, dq.max_abs) << "GPU vs CPU " << str(d) << "; CPU quantized vs bf16 " << str(dq);
    EXPECT_LE(d.mean_abs, 0.5 * dq.mean_abs) << "GPU vs CPU " << str(d) << "; CPU quantized vs bf16 " << str(dq);
  }
}

// Every branch of the forward (see make_variant), bf16 and a rotated quantized cache (so4-fast here).
TEST(CudaModel, GemmaLikeVariantMatchesCpu) {
  CIDER_REQUIRE_GPU();
  auto cpu = load("bf16", "bf16", cm::Device::kCPU);
  auto cpu32 = load("bf16", "f32", cm::Device::kCPU);
  auto gpu = load("bf16", "bf16", cm::Device::kCUDA);
  for (cm::Model* m : {cpu.get(), cpu32.get(), gpu.get()}) make_variant(*m);
  const std::vector<int32_t> tokens = text_tokens(*cpu, 120);
  const std::vector<float> ref = logits_of(*cpu, tokens, 80);
  const double tol = bf16_tolerance(ref, logits_of(*cpu32, tokens, 80));
  const Diff d = diff(logits_of(*gpu, tokens, 80), ref);
  RecordProperty("variant_bf16_gpu_vs_cpu", str(d));
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_abs, tol) << str(d) << "; tolerance " << tol;

  cm::ModelOptions q = options("w8a8", "k4v3", cm::Device::kCPU);
  q.kv.rotation = cm::parse_kv_rotation("so4-fast");
  auto cpu_q = cm::Model::load(kTiny, q);
  q.device = cm::Device::kCUDA;
  auto gpu_q = cm::Model::load(kTiny, q);
  for (cm::Model* m : {cpu_q.get(), gpu_q.get()}) make_variant(*m);
  const std::vector<float> ref_q = logits_of(*cpu_q, tokens, 80);
  const Diff dq = diff(ref_q, ref);
  const Diff d2 = diff(logits_of(*gpu_q, tokens, 80), ref_q);
  RecordProperty("variant_w8a8_k4v3_fast_gpu_vs_cpu", str(d2));
  EXPECT_TRUE(d2.finite);
  EXPECT_LE(d2.max_abs, dq.max_abs) << str(d2) << "; quantization error " << str(dq);
  EXPECT_LE(d2.mean_abs, 0.5 * dq.mean_abs) << str(d2) << "; quantization error " << str(dq);
}

// ---- GPU-internal consistency ------------------------------------------------------------------------------------

// Prefill 250 then 60 decode steps (crossing the 256-position graph bucket) against all 310 at once.
TEST(CudaModel, PrefillThenDecodeEqualsAllAtOnce) {
  CIDER_REQUIRE_GPU();
  auto cpu = load("bf16", "bf16", cm::Device::kCPU);
  auto cpu32 = load("bf16", "f32", cm::Device::kCPU);
  auto gpu = load("bf16", "bf16", cm::Device::kCUDA);
  const std::vector<int32_t> tokens = text_tokens(*cpu, 310);
  const double tol = bf16_tolerance(logits_of(*cpu, tokens, 310), logits_of(*cpu32, tokens, 310));
  const std::vector<float> all = logits_of(*gpu, tokens, 310);
  const Diff d = diff(logits_of(*gpu, tokens, 250), all);
  RecordProperty("gpu_prefill_decode_vs_all_at_once", str(d));
  EXPECT_TRUE(d.finite);
  EXPECT_LE(d.max_abs, tol) << str(d) << "; tolerance " << tol;

  auto gq = load("w8a8", "k4v3", cm::Device::kCUDA);
  auto cq = load("w8a8", "k4v3", cm::Device::kCPU);
  const std::vector<float> all_q = logits_of(*gq, tokens, 310);
  const Diff dq = diff(logits_of(*cq, tokens, 310), logits_of(*cpu, tokens, 310));
  const Diff d2 = diff(logits_of(*gq, tokens, 250), all_q);
  RecordProperty("gpu_w8a8_k4v3_prefill_decode_vs_all_at_once", str(d2));
  EXPECT_TRUE(d2.finite);
  EXPECT_LE(d2.max_abs, dq.max_abs) << str(d2) << "; quantization error " << str(dq);
}

// Decode by graph replay against the same launches enqueued directly: the same kernels with the same arguments, so
// the logits must be identical bit for bit (a kernel whose result depends on scheduling would show here).
TEST(CudaModel, GraphReplayEqualsDirectLaunches) {
  CIDER_REQUIRE_GPU();
  for (const char* kv : {"bf16", "k4v3"}) {
    SCOPED_TRACE(kv);
    auto gpu = load("w8a8", kv, cm::Device::kCUDA);
    const std::vector<int32_t> tokens = text_tokens(*gpu, 300);
    const auto V = static_cast<size_t>(gpu->config().vocab_size);
    auto run = [&](bool graphs, int64_t* captured) {
      auto s = gpu->new_session();
      s->impl().gpu->use_graphs = graphs;
      std::vector<float> out((tokens.size() - 200) * V, std::nanf(""));
      std::vector<float> scratch(V);
      gpu->forward(*s, tokens.data(), 200, scratch.data(), false);
      for (size_t i = 200; i < tokens.size(); ++i) gpu->forward(*s, &tokens[i], 1, out.data() + (i - 200) * V, false);
      *captured = s->impl().gpu->graphs_captured();
      return out;
    };
    int64_t with = 0, without = 0;
    const std::vector<float> a = run(true, &with), b = run(false, &without);
    EXPECT_EQ(with, 2);  // KV bounds 256 and 512 (positions 200 … 299)
    EXPECT_EQ(without, 0);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(diff(a, b).finite);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << str(diff(a, b));
  }
}

// A trimmed session continues exactly like the untrimmed one did (the device cache rows are overwritten in place),
// and kv_bytes reports the planes allocated once for the whole context.
TEST(CudaModel, TrimAndKvBytes) {
  CIDER_REQUIRE_GPU();
  auto gpu = load("bf16", "k4v3", cm::Device::kCUDA);
  const cm::ModelConfig& c = gpu->config();
  const std::vector<int32_t> tokens = text_tokens(*gpu, 40);
  const auto V = static_cast<size_t>(c.vocab_size);
  auto s = gpu->new_session();
  std::vector<float> first(10 * V), again(10 * V), scratch(V);
  gpu->forward(*s, tokens.data(), 30, scratch.data(), false);
  for (size_t i = 30; i < 40; ++i) gpu->forward(*s, &tokens[i], 1, first.data() + (i - 30) * V, false);
  EXPECT_EQ(s->trim(10), 10);
  EXPECT_EQ(s->position(), 30);
  for (size_t i = 30; i < 40; ++i) gpu->forward(*s, &tokens[i], 1, again.data() + (i - 30) * V, false);
  EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0) << str(diff(again, first));
  // k4v3, group 64, f16 scales: per position and KV head D·(4 + 3)/8 code bytes + 4 · (D/64) · 2 scale/bias bytes.
  const auto per_row = static_cast<size_t>(c.head_dim * 7 / 8 + 4 * (c.head_dim / 64) * 2);
  EXPECT_EQ(s->kv_bytes(), per_row * static_cast<size_t>(c.num_layers * c.num_kv_heads * gpu->context_length()));
  // Positions past the context are refused before anything runs.
  std::vector<int32_t> many(static_cast<size_t>(gpu->context_length()), 1);
  try {
    gpu->forward(*s, many.data(), static_cast<int64_t>(many.size()), scratch.data(), false);
    ADD_FAILURE() << "forward past the context accepted";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
  }
  EXPECT_EQ(s->position(), 30);
}
