// The model engine on tiny random models generated here: every architecture against an independent float64
// reference forward written in this file (straight from the architectures' definitions: no caches, no chunks, full
// attention matrices), the int8/int4 paths against the same reference on their own dequantized weights, MLX and GGUF
// sources, convert round trips, sessions, and every rejection.
//
// Models are written as HF directories (config.json + model.safetensors) into a temporary folder and loaded with
// Model::load; no tokenizer.json is written, so these tests need no tokenizer.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/activation_stats.h"
#include "model/config.h"
#include "model/convert.h"
#include "model/loader.h"
#include "model/model.h"
#include "model/npy.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "kernels/kernel_table.h"
#include "quant/affine.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"
#include "support/ggml_cases.h"
#include "support/test_support.h"

namespace cm = cider::model;
namespace fs = std::filesystem;
using cider::DType;
using cider::ErrorCode;
using json = nlohmann::json;

namespace {

// ---- temporary directories ---------------------------------------------------------------------------------------

fs::path temp_root() {
  static const fs::path root = [] {
    fs::path p = fs::temp_directory_path() / ("cider_test_model_" + std::to_string(::getpid()));
    fs::remove_all(p);
    fs::create_directories(p);
    return p;
  }();
  return root;
}
std::string fresh_dir(const std::string& name) {
  static int counter = 0;
  fs::path p = temp_root() / (name + "_" + std::to_string(counter++));
  fs::create_directories(p);
  return p.string();
}
struct CleanUp : ::testing::Environment {
  void TearDown() override { fs::remove_all(temp_root()); }
};
const auto* const kCleanUp = ::testing::AddGlobalTestEnvironment(new CleanUp);

// ---- random models -------------------------------------------------------------------------------------------------

struct Spec {
  std::string cls = "LlamaForCausalLM";
  int64_t V = 97, H = 64, I = 128, L = 2, Hq = 4, Hkv = 2, D = 16, max_pos = 512;
  bool tie = false, qkv_bias = false, o_bias = false, qk_norm = false, gemma = false;
  double theta = 10000.0, theta_local = 10000.0;
  json rope_scaling;                 // null or {"rope_type": "llama3", ...}
  int64_t window = 0;                // sliding window (Mistral: all layers; Gemma: sliding layers)
  std::vector<int> sliding;          // per layer (Gemma)
  double qpas = 0;                   // Gemma query_pre_attn_scalar (0 = head_dim)
  double softcap = 0;                // Gemma final_logit_softcapping
  double attn_softcap = 0;           // Gemma 2 attn_logit_softcapping (scores cap·tanh(s/cap) before the mask)
  double eps = 1e-6;
  DType dtype = DType::kF32;
};

using TensorMap = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

// Weights as float32 values already rounded to the checkpoint dtype (so the reference sees what is stored).
TensorMap random_weights(const Spec& s, uint64_t salt) {
  auto rng = cider::test::make_rng(salt);
  TensorMap m;
  auto add = [&](const std::string& n, std::vector<int64_t> shape, float sigma, float centre = 0.0f) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    auto v = cider::test::randn(rng, static_cast<size_t>(numel), sigma);
    for (float& x : v) x = cider::round_to(s.dtype, x + centre);
    m[n] = {shape, v};
  };
  const float nc = s.gemma ? 0.0f : 1.0f;  // Gemma norms multiply by (1 + w)
  auto lin = [&](const std::string& n, int64_t N, int64_t K) {
    add(n + ".weight", {N, K}, 1.5f / std::sqrt(static_cast<float>(K)));
  };
  add("model.embed_tokens.weight", {s.V, s.H}, 1.0f);
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {s.H}, 0.2f, nc);
    lin(p + "self_attn.q_proj", s.Hq * s.D, s.H);
    lin(p + "self_attn.k_proj", s.Hkv * s.D, s.H);
    lin(p + "self_attn.v_proj", s.Hkv * s.D, s.H);
    lin(p + "self_attn.o_proj", s.H, s.Hq * s.D);
    if (s.qkv_bias)
      for (const char* x : {"q", "k", "v"})
        add(p + "self_attn." + x + "_proj.bias", {(x[0] == 'q' ? s.Hq : s.Hkv) * s.D}, 0.2f);
    if (s.o_bias) add(p + "self_attn.o_proj.bias", {s.H}, 0.2f);
    if (s.qk_norm) {
      add(p + "self_attn.q_norm.weight", {s.D}, 0.2f, nc);
      add(p + "self_attn.k_norm.weight", {s.D}, 0.2f, nc);
    }
    add(p + "post_attention_layernorm.weight", {s.H}, 0.2f, nc);
    if (s.gemma) {
      add(p + "pre_feedforward_layernorm.weight", {s.H}, 0.2f, nc);
      add(p + "post_feedforward_layernorm.weight", {s.H}, 0.2f, nc);
    }
    lin(p + "mlp.gate_proj", s.I, s.H);
    lin(p + "mlp.up_proj", s.I, s.H);
    lin(p + "mlp.down_proj", s.H, s.I);
  }
  add("model.norm.weight", {s.H}, 0.2f, nc);
  if (!s.tie) lin("lm_head", s.V, s.H);
  return m;
}

json hf_config(const Spec& s) {
  json c;
  c["architectures"] = {s.cls};
  c["vocab_size"] = s.V;
  c["hidden_size"] = s.H;
  c["intermediate_size"] = s.I;
  c["num_hidden_layers"] = s.L;
  c["num_attention_heads"] = s.Hq;
  c["num_key_value_heads"] = s.Hkv;
  c["head_dim"] = s.D;
  c["max_position_embeddings"] = s.max_pos;
  c["rms_norm_eps"] = s.eps;
  c["tie_word_embeddings"] = s.tie;
  c["torch_dtype"] = s.dtype == DType::kF32 ? "float32" : (s.dtype == DType::kF16 ? "float16" : "bfloat16");
  c["rope_theta"] = s.theta;
  c["rope_scaling"] = s.rope_scaling;
  c["bos_token_id"] = 1;
  c["eos_token_id"] = 2;
  if (s.cls == "LlamaForCausalLM" || s.cls == "Qwen3ForCausalLM") c["attention_bias"] = s.o_bias;
  if (s.cls == "MistralForCausalLM") c["sliding_window"] = s.window > 0 ? json(s.window) : json();
  if (s.gemma) {
    c["hidden_activation"] = "gelu_pytorch_tanh";
    c["rope_local_base_freq"] = s.theta_local;
    c["sliding_window"] = s.window;
    json lt = json::array();
    for (int v : s.sliding) lt.push_back(v ? "sliding_attention" : "full_attention");
    c["layer_types"] = lt;
    c["query_pre_attn_scalar"] = s.qpas > 0 ? s.qpas : static_cast<double>(s.D);
    c["final_logit_softcapping"] = s.softcap > 0 ? json(s.softcap) : json();
    c["attn_logit_softcapping"] = s.attn_softcap > 0 ? json(s.attn_softcap) : json();
  } else {
    c["hidden_act"] = "silu";
  }
  return c;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Writes an HF directory: config.json + model.safetensors with tensors in `dtype`.
void write_hf(const std::string& dir, const Spec& s, const TensorMap& m, const json& config) {
  cm::SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> keep;
  for (const auto& [name, t] : m) {
    keep.push_back(cider::test::to_dtype_bytes(t.second, s.dtype));
    w.add(name, s.dtype, t.first, keep.back().data());
  }
  w.write(dir + "/model.safetensors");
  write_text(dir + "/config.json", config.dump(1));
}

std::string write_model(const Spec& s, const TensorMap& m, const std::string& name = "model") {
  const std::string dir = fresh_dir(name);
  write_hf(dir, s, m, hf_config(s));
  return dir;
}

// ---- the float64 reference -----------------------------------------------------------------------------------------

using Vec = std::vector<double>;

Vec linear_ref(const TensorMap& m, const std::string& p, const Vec& x, int64_t T, int64_t K) {
  const auto& w = m.at(p + ".weight");
  const int64_t N = w.first[0];
  Vec y(static_cast<size_t>(T * N), 0.0);
  const auto b = m.find(p + ".bias");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = b != m.end() ? b->second.second[static_cast<size_t>(n)] : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += x[static_cast<size_t>(t * K + k)] * w.second[static_cast<size_t>(n * K + k)];
      y[static_cast<size_t>(t * N + n)] = acc;
    }
  return y;
}

void rms_ref(Vec& x, int64_t rows, int64_t dim, const std::vector<float>& w, double offset, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += x[static_cast<size_t>(r * dim + i)] * x[static_cast<size_t>(r * dim + i)];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) x[static_cast<size_t>(r * dim + i)] *= inv * (offset + w[static_cast<size_t>(i)]);
  }
}

// HF's inverse frequencies, float64, from the definitions (default, linear, llama3).
std::vector<double> inv_freq_ref(double theta, const json& scaling, int64_t D) {
  std::vector<double> f(static_cast<size_t>(D / 2));
  const double pi = std::acos(-1.0);
  for (int64_t i = 0; i < D / 2; ++i) {
    double v = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    if (!scaling.is_null()) {
      const std::string type = scaling.at("rope_type");
      const double factor = scaling.at("factor");
      if (type == "linear") v /= factor;
      if (type == "llama3") {
        const double lo = scaling.at("low_freq_factor"), hi = scaling.at("high_freq_factor");
        const double old = scaling.at("original_max_position_embeddings");
        const double wl = 2 * pi / v;
        if (wl > old / lo) {
          v /= factor;
        } else if (wl >= old / hi) {
          const double sm = (old / wl - lo) / (hi - lo);
          v = (1 - sm) * v / factor + sm * v;
        }
      }
    }
    f[static_cast<size_t>(i)] = v;
  }
  return f;
}

// Logits (T, V) of the whole sequence, computed in float64 from the model's definition.
Vec reference_logits(const Spec& s, const TensorMap& m, const std::vector<int32_t>& tok) {
  const auto T = static_cast<int64_t>(tok.size());
  const int64_t H = s.H, D = s.D;
  const double off = s.gemma ? 1.0 : 0.0;
  const double escale = s.gemma ? cider::round_to(s.dtype, static_cast<float>(std::sqrt(static_cast<double>(H)))) : 1.0;
  const auto& emb = m.at("model.embed_tokens.weight").second;
  Vec x(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) x[static_cast<size_t>(t * H + i)] = emb[static_cast<size_t>(tok[static_cast<size_t>(t)] * H + i)] * escale;
  const double scale = 1.0 / std::sqrt(s.gemma && s.qpas > 0 ? s.qpas : static_cast<double>(D));
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const bool sliding = s.gemma ? s.sliding[static_cast<size_t>(l)] != 0 : s.window > 0;
    const std::vector<double> inv = sliding && s.gemma ? inv_freq_ref(s.theta_local, json(), D)
                                                       : inv_freq_ref(s.theta, s.rope_scaling, D);
    Vec h = x;
    rms_ref(h, T, H, m.at(p + "input_layernorm.weight").second, off, s.eps);
    Vec q = linear_ref(m, p + "self_attn.q_proj", h, T, H);
    Vec k = linear_ref(m, p + "self_attn.k_proj", h, T, H);
    Vec v = linear_ref(m, p + "self_attn.v_proj", h, T, H);
    if (s.qk_norm) {
      rms_ref(q, T * s.Hq, D, m.at(p + "self_attn.q_norm.weight").second, off, s.eps);
      rms_ref(k, T * s.Hkv, D, m.at(p + "self_attn.k_norm.weight").second, off, s.eps);
    }
    auto rope = [&](Vec& a, int64_t heads) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t hh = 0; hh < heads; ++hh)
          for (int64_t i = 0; i < D / 2; ++i) {
            const double ang = static_cast<double>(t) * inv[static_cast<size_t>(i)];
            double& x1 = a[static_cast<size_t>((t * heads + hh) * D + i)];
            double& x2 = a[static_cast<size_t>((t * heads + hh) * D + i + D / 2)];
            const double n1 = x1 * std::cos(ang) - x2 * std::sin(ang), n2 = x2 * std::cos(ang) + x1 * std::sin(ang);
            x1 = n1;
            x2 = n2;
          }
    };
    rope(q, s.Hq);
    rope(k, s.Hkv);
    Vec att(static_cast<size_t>(T * s.Hq * D), 0.0);
    for (int64_t hh = 0; hh < s.Hq; ++hh) {
      const int64_t kvh = hh / (s.Hq / s.Hkv);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> sc(static_cast<size_t>(i + 1), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          if (sliding && j <= i - s.window) continue;
          double d = 0;
          for (int64_t e = 0; e < D; ++e)
            d += q[static_cast<size_t>((i * s.Hq + hh) * D + e)] * k[static_cast<size_t>((j * s.Hkv + kvh) * D + e)];
          sc[static_cast<size_t>(j)] = d * scale;
          if (s.attn_softcap > 0) sc[static_cast<size_t>(j)] = s.attn_softcap * std::tanh(d * scale / s.attn_softcap);
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        double z = 0;
        for (double& e : sc) z += (e = std::exp(e - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < D; ++e)
            att[static_cast<size_t>((i * s.Hq + hh) * D + e)] +=
                sc[static_cast<size_t>(j)] / z * v[static_cast<size_t>((j * s.Hkv + kvh) * D + e)];
      }
    }
    Vec o = linear_ref(m, p + "self_attn.o_proj", att, T, s.Hq * D);
    if (s.gemma) rms_ref(o, T, H, m.at(p + "post_attention_layernorm.weight").second, off, s.eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    h = x;
    rms_ref(h, T, H, m.at(p + (s.gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight")).second,
            off, s.eps);
    Vec g = linear_ref(m, p + "mlp.gate_proj", h, T, H);
    Vec u = linear_ref(m, p + "mlp.up_proj", h, T, H);
    for (size_t i = 0; i < g.size(); ++i) {
      const double a = g[i];
      const double act = s.gemma ? 0.5 * a * (1 + std::tanh(std::sqrt(2 / std::acos(-1.0)) * (a + 0.044715 * a * a * a)))
                                 : a / (1 + std::exp(-a));
      g[i] = act * u[i];
    }
    Vec d = linear_ref(m, p + "mlp.down_proj", g, T, s.I);
    if (s.gemma) rms_ref(d, T, H, m.at(p + "post_feedforward_layernorm.weight").second, off, s.eps);
    for (size_t i = 0; i < x.size(); ++i) x[i] += d[i];
  }
  rms_ref(x, T, H, m.at("model.norm.weight").second, off, s.eps);
  TensorMap head;
  head["lm_head.weight"] = m.count("lm_head.weight") ? m.at("lm_head.weight") : m.at("model.embed_tokens.weight");
  Vec out = linear_ref(head, "lm_head", x, T, H);
  if (s.softcap > 0)
    for (double& e : out) e = s.softcap * std::tanh(e / s.softcap);
  return out;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t V, uint64_t salt) {
  auto rng = cider::test::make_rng(salt);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  return t;
}

cm::ModelOptions opts(const char* weights = "f32", const char* kv = "f32") {
  cm::ModelOptions o;
  o.weights = cm::parse_weight_format(weights);
  o.kv = cm::parse_kv_format(kv);
  return o;
}

std::vector<float> run(const cm::Model& model, const std::vector<int32_t>& tok) {
  auto s = model.new_session();
  std::vector<float> out(tok.size() * static_cast<size_t>(model.config().vocab_size));
  model.forward(*s, tok.data(), static_cast<int64_t>(tok.size()), out.data(), true);
  return out;
}

// max |got − want| ≤ rel · max |want|, NaN failing.
::testing::AssertionResult close_rel(const std::vector<float>& got, const Vec& want, double rel) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  double mx = 0, worst = 0;
  size_t at = 0;
  for (double w : want) mx = std::max(mx, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]);
    if (std::isnan(got[i])) return ::testing::AssertionFailure() << "NaN at " << i;
    if (d > worst) {
      worst = d;
      at = i;
    }
  }
  if (worst <= rel * mx) return ::testing::AssertionSuccess() << worst / mx;
  return ::testing::AssertionFailure() << "max |diff| " << worst << " at " << at << " (got " << got[at] << ", want "
                                       << want[at] << ") > " << rel << " * max |want| " << mx;
}

// Relative RMS difference ‖got − want‖ / ‖want‖.
double rel_rms(const std::vector<float>& got, const Vec& want) {
  double d = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    d += (got[i] - want[i]) * (got[i] - want[i]);
    w += want[i] * want[i];
  }
  return std::sqrt(d / w);
}

// The architectures, each with what distinguishes it.
std::vector<std::pair<std::string, Spec>> arch_specs() {
  std::vector<std::pair<std::string, Spec>> v;
  Spec llama;  // GQA 4:2, llama3 rope scaling with a short original context so every band is used
  llama.rope_scaling = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 16}};
  llama.o_bias = llama.qkv_bias = true;  // attention_bias
  v.emplace_back("llama", llama);
  Spec mistral;
  mistral.cls = "MistralForCausalLM";
  mistral.Hkv = 1;
  mistral.window = 5;
  v.emplace_back("mistral", mistral);
  Spec qwen2;
  qwen2.cls = "Qwen2ForCausalLM";
  qwen2.qkv_bias = true;
  qwen2.tie = true;
  qwen2.theta = 1e6;
  v.emplace_back("qwen2", qwen2);
  Spec qwen3;
  qwen3.cls = "Qwen3ForCausalLM";
  qwen3.qk_norm = true;
  qwen3.D = 32;  // Hq·D = 128 ≠ hidden 64
  v.emplace_back("qwen3", qwen3);
  Spec gemma;
  gemma.cls = "Gemma3ForCausalLM";
  gemma.gemma = gemma.qk_norm = gemma.tie = true;
  gemma.L = 3;
  gemma.Hq = 2;
  gemma.Hkv = 1;
  gemma.D = 32;
  gemma.window = 4;
  gemma.sliding = {1, 0, 1};
  gemma.theta = 1e6;
  gemma.qpas = 20;
  gemma.softcap = 6;
  gemma.rope_scaling = {{"rope_type", "linear"}, {"factor", 2.0}};
  v.emplace_back("gemma3", gemma);
  Spec gemma2;  // Gemma 3 without q/k norms, one RoPE, softcapped attention scores (appended: indices above stay)
  gemma2.cls = "Gemma2ForCausalLM";
  gemma2.gemma = gemma2.tie = true;
  gemma2.L = 3;
  gemma2.Hq = 4;
  gemma2.Hkv = 2;
  gemma2.D = 32;
  gemma2.window = 4;
  gemma2.sliding = {1, 0, 1};
  gemma2.qpas = 20;
  gemma2.softcap = 6;
  gemma2.attn_softcap = 1.5;  // scores of these weights reach several units: it bites
  v.emplace_back("gemma2", gemma2);
  return v;
}

// ---- tests ---------------------------------------------------------------------------------------------------------

TEST(ModelReference, F32MatchesFloat64ReferenceForEveryArchitecture) {
  uint64_t salt = 100;
  for (const auto& [name, spec] : arch_specs()) {
    SCOPED_TRACE(name);
    const TensorMap m = random_weights(spec, ++salt);
    const std::string dir = write_model(spec, m, name);
    auto model = cm::Model::load(dir, opts("f32", "f32"));
    const auto tok = random_tokens(23, spec.V, ++salt);
    const Vec ref = reference_logits(spec, m, tok);
    EXPECT_TRUE(close_rel(run(*model, tok), ref, 1e-4));

    // The same positions through a prefill of 9 tokens then single-token decode steps (GEMV paths, cache growth).
    auto s = model->new_session();
    const int64_t V = spec.V;
    std::vector<float> got(tok.size() * static_cast<size_t>(V));
    model->forward(*s, tok.data(), 9, got.data(), true);
    for (size_t t = 9; t < tok.size(); ++t) model->forward(*s, &tok[t], 1, got.data() + t * static_cast<size_t>(V), false);
    EXPECT_EQ(s->position(), static_cast<int64_t>(tok.size()));
    EXPECT_TRUE(close_rel(got, ref, 1e-4));
  }
}

TEST(ModelReference, HalfPrecisionCheckpointsAndBf16WeightsInPlace) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    Spec spec = arch_specs()[0].second;
    spec.dtype = dt;
    const TensorMap m = random_weights(spec, 7 + static_cast<uint64_t>(dt));
    const std::string dir = write_model(spec, m, "half");
    const auto tok = random_tokens(17, spec.V, 8);
    const Vec ref = reference_logits(spec, m, tok);
    // f32 weights from a half checkpoint: the stored values exactly, so reference tolerance.
    EXPECT_TRUE(close_rel(run(*cm::Model::load(dir, opts("f32", "f32")), tok), ref, 1e-4)) << cider::dtype_name(dt);
    auto bf = cm::Model::load(dir, opts("bf16", "f32"));
    if (dt == DType::kBF16) {
      // bf16 weights of a bf16 checkpoint are used in place: the exact values, and no owned copy of them.
      EXPECT_TRUE(close_rel(run(*bf, tok), ref, 1e-4));
      const cm::Linear& q = bf->impl().w.layers[0].q;
      for (const cider::Tensor& t : bf->impl().w.owned) {
        const auto* b = static_cast<const uint8_t*>(t.buffer.data());
        EXPECT_FALSE(q.w >= b && q.w < b + t.buffer.nbytes()) << "q_proj was copied";
      }
    } else {
      EXPECT_LT(rel_rms(run(*bf, tok), ref), 0.02);
    }
  }
}

TEST(ModelReference, LongPrefillIsSplitIntoChunks) {
  Spec spec = arch_specs()[1].second;  // Mistral: the sliding window crosses chunk borders too
  spec.window = 40;
  const TensorMap m = random_weights(spec, 31);
  const std::string dir = write_model(spec, m, "long");
  auto model = cm::Model::load(dir, opts("f32", "f32"));
  const auto tok = random_tokens(cm::kMaxChunk + 45, spec.V, 32);
  EXPECT_TRUE(close_rel(run(*model, tok), reference_logits(spec, m, tok), 1e-4));
  // Only the last row when all_logits is false.
  auto s = model->new_session();
  std::vector<float> last(static_cast<size_t>(spec.V));
  model->forward(*s, tok.data(), static_cast<int64_t>(tok.size()), last.data(), false);
  const auto all = run(*model, tok);
  // (The head runs as a GEMV on one row instead of a GEMM: a fast kernel may sum in another order.)
  EXPECT_TRUE(cider::test::all_close(last.data(), all.data() + all.size() - last.size(), last.size(), 1e-5, 1e-5));
}

// Model::forward_batch: sequences of different lengths and positions in one forward give each sequence what its own
// forward gives (the per-row ops run over every row at once, attention per session), for every architecture; a
// prompt longer than a pass shares passes with the others. Batched rows may take another kernel path than a single
// row (GEMM instead of GEMV), so the comparison allows float32 rounding; the f32 run is also held to the reference.
TEST(ModelBatch, BatchedSequencesMatchTheirOwnForward) {
  uint64_t salt = 900;
  for (const auto& [name, spec] : arch_specs()) {
    const TensorMap m = random_weights(spec, ++salt);
    const std::string dir = write_model(spec, m, "batch_" + name);
    // A quantized cache where the head fits a group of 32 (qwen3, gemma3), else bf16.
    const char* second_kv = spec.D % 32 == 0 ? "k8v4" : "bf16";
    for (const auto& [w, kv] : {std::pair{"f32", "f32"}, std::pair{"w8a8", second_kv}}) {
      cm::ModelOptions o = opts(w, kv);
      o.kv.group_size = 32;
      auto model = cm::Model::load(dir, o);
      const auto V = static_cast<size_t>(spec.V);
      const std::vector<std::vector<int32_t>> prompts = {random_tokens(30, spec.V, ++salt),
                                                         random_tokens(7, spec.V, ++salt),
                                                         random_tokens(12, spec.V, ++salt),
                                                         random_tokens(cm::kMaxChunk + 20, spec.V, ++salt)};
      // Prompts 1 and 2 end in the first pass with only their last rows wanted, apart (rows 36 and 48): the head
      // takes them in one call after gathering them (Backend gather_rows).
      const std::vector<bool> all = {true, false, false, true};
      constexpr size_t kSeqs = 4;
      // Alone: each prompt, then one more token.
      std::vector<std::vector<float>> want(kSeqs), want_next(kSeqs);
      const std::vector<int32_t> next = {1, 2, 3, 4};
      for (size_t i = 0; i < kSeqs; ++i) {
        auto s = model->new_session();
        want[i].resize((all[i] ? prompts[i].size() : 1) * V);
        model->forward(*s, prompts[i].data(), static_cast<int64_t>(prompts[i].size()), want[i].data(), all[i]);
        want_next[i].resize(V);
        model->forward(*s, &next[i], 1, want_next[i].data(), false);
      }
      if (std::string(w) == "f32") {
        EXPECT_TRUE(close_rel(want[0], reference_logits(spec, m, prompts[0]), 1e-4)) << name;
      }
      // Batched: the prompts in one call, then the next tokens in one call (a decode batch).
      std::vector<std::unique_ptr<cm::Session>> ss;
      for (size_t i = 0; i < kSeqs; ++i) ss.push_back(model->new_session());
      std::vector<std::vector<float>> got(kSeqs), got_next(kSeqs);
      std::vector<cm::Model::BatchItem> items;
      for (size_t i = 0; i < kSeqs; ++i) {
        got[i].resize(want[i].size());
        items.push_back({ss[i].get(), prompts[i].data(), static_cast<int64_t>(prompts[i].size()), got[i].data(), all[i]});
      }
      model->forward_batch(items);
      items.clear();
      for (size_t i = 0; i < kSeqs; ++i) {
        EXPECT_EQ(ss[i]->position(), static_cast<int64_t>(prompts[i].size()));
        got_next[i].resize(V);
        items.push_back({ss[i].get(), &next[i], 1, got_next[i].data(), false});
      }
      model->forward_batch(items);
      for (size_t i = 0; i < kSeqs; ++i) {
        if (std::string(w) == "f32") {  // float32 sums in another order: relative to the largest logit
          EXPECT_TRUE(close_rel(got[i], Vec(want[i].begin(), want[i].end()), 1e-5)) << name << " prompt " << i;
          EXPECT_TRUE(close_rel(got_next[i], Vec(want_next[i].begin(), want_next[i].end()), 1e-5))
              << name << " next token " << i;
        } else {
          // Int8 activations and a quantized cache round each row to a grid: a float32 rounding difference from
          // another kernel path can move a value across a rounding boundary (one int8 step is 1/127 of a row's
          // largest value), which later layers carry. So the same computation within a few such steps, not bits.
          EXPECT_LT(rel_rms(got[i], Vec(want[i].begin(), want[i].end())), 0.03) << name << " prompt " << i;
          EXPECT_LT(rel_rms(got_next[i], Vec(want_next[i].begin(), want_next[i].end())), 0.03)
              << name << " next token " << i;
        }
      }
    }
  }
}

TEST(ModelBatch, RejectionsLeaveEverySessionUnchanged) {
  const Spec spec = arch_specs()[0].second;
  const TensorMap m = random_weights(spec, 950);
  const std::string dir = write_model(spec, m, "batch_reject");
  auto model = cm::Model::load(dir, opts("f32", "f32"));
  auto other = cm::Model::load(dir, opts("f32", "f32"));
  auto a = model->new_session(), b = model->new_session(), foreign = other->new_session();
  const auto tok = random_tokens(5, spec.V, 951);
  std::vector<float> out(5 * static_cast<size_t>(spec.V));
  auto expect_rejected = [&](std::vector<cm::Model::BatchItem> items, const char* what) {
    try {
      model->forward_batch(items);
      ADD_FAILURE() << "no error: " << what;
    } catch (const cider::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("forward"), std::string::npos) << e.what();
    }
    EXPECT_EQ(a->position(), 0) << what;
    EXPECT_EQ(b->position(), 0) << what;
    EXPECT_EQ(a->kv_bytes(), b->kv_bytes()) << what;
  };
  expect_rejected({}, "empty batch");
  expect_rejected({{a.get(), tok.data(), 5, out.data(), false}, {a.get(), tok.data(), 5, out.data(), false}},
                  "a session twice");
  expect_rejected({{a.get(), tok.data(), 5, out.data(), false}, {foreign.get(), tok.data(), 5, out.data(), false}},
                  "another model's session");
  expect_rejected({{a.get(), tok.data(), 5, out.data(), false}, {nullptr, tok.data(), 5, out.data(), false}},
                  "no session");
  const std::vector<int32_t> bad = {1, 2, static_cast<int32_t>(spec.V)};
  try {
    model->forward_batch(std::vector<cm::Model::BatchItem>{{a.get(), tok.data(), 5, out.data(), false},
                                                           {b.get(), bad.data(), 3, out.data(), false}});
    ADD_FAILURE() << "no error for a token id past the vocabulary";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange) << e.what();
  }
  EXPECT_EQ(a->position(), 0);
  EXPECT_EQ(b->position(), 0);
}

// The weights an int or block layer really holds, dequantized: codes × scales, or each block by its format's decoder.
std::vector<float> dequantize_linear(const cm::Linear& L) {
  std::vector<float> w(static_cast<size_t>(L.N * L.K));
  if (L.kind == cm::Linear::Kind::kGgml) {
    const cider::quant::GgmlBlockFormat& f = *cider::quant::ggml_block_format(L.ggml_type);
    const int64_t B = L.K / f.block_size;
    uint8_t tmp[cider::quant::kGgmlInterleavedBlockMax];
    for (int64_t i = 0; i < L.N * B; ++i) {
      const uint8_t* blk = static_cast<const uint8_t*>(L.w) + i * f.block_bytes;
      if (L.interleaved) {  // rows in the CPU kernels' order (quant/ggml_interleave.h): the block read back
        cider::quant::ggml_interleaved_block(L.ggml_type, L.w, B, i / B, i % B, tmp);
        blk = tmp;
      }
      f.decode(blk, w.data() + i * f.block_size);
    }
    return w;
  }
  for (int64_t n = 0; n < L.N; ++n)
    for (int64_t k = 0; k < L.K; ++k) {
      int q;
      if (L.kind == cm::Linear::Kind::kInt8) {
        q = static_cast<const int8_t*>(L.w)[n * L.K + k];
      } else {
        const uint8_t byte = static_cast<const uint8_t*>(L.w)[n * (L.K / 2) + k / 2];
        q = ((k & 1) ? (byte >> 4) : (byte & 0xf)) - 8;
      }
      const float sc = L.group_size == 0 ? L.scales[n] : L.scales[(k / L.group_size) * L.N + n];
      w[static_cast<size_t>(n * L.K + k)] = static_cast<float>(q) * sc;
    }
  return w;
}

// Σ_n (w − ŵ)_n H (w − ŵ)_nᵀ: layer L's expected squared output error on inputs of second moments H (K × K), against
// its original weights (N × K).
double second_moment_error(const cm::Linear& L, const std::vector<float>& orig, const std::vector<float>& H) {
  const std::vector<float> w = dequantize_linear(L);
  double e = 0.0;
  std::vector<double> d(static_cast<size_t>(L.K));
  for (int64_t n = 0; n < L.N; ++n) {
    for (int64_t k = 0; k < L.K; ++k)
      d[static_cast<size_t>(k)] = orig[static_cast<size_t>(n * L.K + k)] - w[static_cast<size_t>(n * L.K + k)];
    for (int64_t i = 0; i < L.K; ++i) {
      double r = 0.0;
      for (int64_t j = 0; j < L.K; ++j) r += H[static_cast<size_t>(i * L.K + j)] * d[static_cast<size_t>(j)];
      e += d[static_cast<size_t>(i)] * r;
    }
  }
  return e;
}

// Each of `stats` recorded over one run of `tok` through the float32 model at dir.
void record_stats(const std::string& dir, const std::vector<int32_t>& tok,
                  std::initializer_list<cm::ActivationStats*> stats) {
  auto model = cm::Model::load(dir, opts("f32", "f32"));
  for (cm::ActivationStats* st : stats) {
    model->record_activations(st);
    (void)run(*model, tok);
  }
  model->record_activations(nullptr);
}

TEST(ModelReference, IntWeightsComputeWithTheirOwnDequantizedWeights) {
  // The reference runs on the dequantized int8/int4 weights the model holds, so the only difference left is the
  // per-token int8 activation quantization (step max|x|/127, about 0.7% RMS of a Gaussian row per input, which
  // these random networks amplify about 4x: 0.03 measured): a wiring error (transposed scales, nibble order, wrong
  // group) would show up as an O(1) difference instead. Bound 0.06.
  for (const auto& [name, spec] : arch_specs()) {
    const TensorMap m = random_weights(spec, 55);
    const std::string dir = write_model(spec, m, "int_" + name);
    const auto tok = random_tokens(19, spec.V, 56);
    for (const char* fmt : {"w8a8", "w8a8-g64", "w4a8"}) {
      SCOPED_TRACE(name + " " + fmt);
      auto model = cm::Model::load(dir, opts(fmt, "f32"));
      const cm::Weights& W = model->impl().w;
      TensorMap dq = m;
      for (const cm::LayerWeights& L : W.layers)
        for (const cm::Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
          ASSERT_NE(x->kind, cm::Linear::Kind::kDense);
          EXPECT_EQ(x->group_size, cm::weight_format_info(cm::parse_weight_format(fmt)).group_size);
          dq[x->name + ".weight"].second = dequantize_linear(*x);
        }
      dq["lm_head.weight"] = {{spec.V, spec.H}, dequantize_linear(W.lm_head)};
      const Vec ref = reference_logits(spec, dq, tok);
      const double r = rel_rms(run(*model, tok), ref);
      EXPECT_LT(r, 0.06) << "relative RMS vs the dequantized-weight reference";
      // And the quantized model stays near the float one.
      EXPECT_LT(rel_rms(run(*model, tok), reference_logits(spec, m, tok)), std::string(fmt) == "w4a8" ? 0.8 : 0.1);
    }
  }
}

// The block formats cider requantizes into (--weights q8_0, q6_k, q5_1, q4_k_m, q4_k, q4_0): every linear layer holds
// the format's GGUF type (the K-quants where K is a multiple of 256, else the format's fallback; a mix's v/down
// projections their own; the head Q8_0), and the
// model computes with exactly those blocks: the reference on the blocks' decoded weights differs only by the int8
// activations per 32 of the native kernels (where the level multiplies prefill in int8: 0.007-0.031 measured on
// AVX-512, the same amplification as the per-token case above; bound 0.06), where a wrong type, byte order or row
// would be O(1); the model stays near the float one (bounds as w8a8 / w4a8 above).
TEST(ModelReference, BlockFormatsComputeWithTheirOwnDecodedWeights) {
  auto decoded = [](const cm::Linear& L) {
    const cider::quant::GgmlBlockFormat& f = *cider::quant::ggml_block_format(L.ggml_type);
    std::vector<float> w(static_cast<size_t>(L.N * L.K));
    const uint8_t* b = static_cast<const uint8_t*>(L.w);
    std::vector<uint8_t> file_order;  // rows the CPU interleaved for its kernels, back in the file's order
    if (L.interleaved) {
      file_order.resize(static_cast<size_t>(L.N * cider::quant::ggml_row_bytes(f, L.K)));
      cider::quant::ggml_deinterleave_rows(L.ggml_type, b, L.N, L.K, file_order.data());
      b = file_order.data();
    }
    for (int64_t i = 0; i < L.N * L.K / f.block_size; ++i) f.decode(b + i * f.block_bytes, w.data() + i * f.block_size);
    return w;
  };
  std::vector<std::pair<std::string, Spec>> specs = {arch_specs()[0], arch_specs()[4]};
  Spec wide = arch_specs()[0].second;  // K = 256 and 512: the K-quants themselves
  wide.H = 256;
  wide.I = 512;
  wide.D = 64;
  specs.emplace_back("llama_k256", wide);
  for (const auto& [name, spec] : specs) {
    const TensorMap m = random_weights(spec, 57);
    const std::string dir = write_model(spec, m, "blocks_" + name);
    const auto tok = random_tokens(19, spec.V, 58);
    for (const char* fmt : {"q8_0", "q6_k", "q5_1", "q4_k_m", "q4_k", "q4_0"}) {
      SCOPED_TRACE(name + " " + fmt);
      const cm::WeightFormatInfo& info = cm::weight_format_info(cm::parse_weight_format(fmt));
      auto model = cm::Model::load(dir, opts(fmt, "f32"));
      const cm::Weights& W = model->impl().w;
      TensorMap dq = m;
      for (const cm::LayerWeights& L : W.layers)
        for (const cm::Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
          ASSERT_EQ(x->kind, cm::Linear::Kind::kGgml) << x->name;
          const bool sens = info.ggml_sensitive != 0 && cm::is_sensitive_layer(x->name);
          EXPECT_EQ(x->ggml_type, x->K % 256 == 0 ? (sens ? info.ggml_sensitive : info.ggml_body)
                                                  : (sens ? info.ggml_sensitive_fallback : info.ggml_fallback))
              << x->name;
          dq[x->name + ".weight"].second = decoded(*x);
        }
      ASSERT_EQ(W.lm_head.kind, cm::Linear::Kind::kGgml);
      EXPECT_EQ(W.lm_head.ggml_type, static_cast<uint32_t>(cider::quant::GgmlType::kQ8_0));
      dq["lm_head.weight"] = {{spec.V, spec.H}, decoded(W.lm_head)};
      const std::vector<float> got = run(*model, tok);
      EXPECT_LT(rel_rms(got, reference_logits(spec, dq, tok)), 0.06) << "against the decoded blocks";
      EXPECT_LT(rel_rms(got, reference_logits(spec, m, tok)), std::string(fmt) == "q8_0" ? 0.1 : 0.8);
    }
  }
  // K must be a multiple of 32 (every block type's size): refused by name.
  Spec odd = arch_specs()[0].second;
  odd.H = 48;
  odd.D = 12;
  const std::string odd_dir = write_model(odd, random_weights(odd, 59), "blocks_odd");
  try {
    cm::Model::load(odd_dir, opts("q4_0", "f32"));
    ADD_FAILURE() << "loaded K = 48 as q4_0";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("not a multiple of the 32 weights of a Q4_0 block"), std::string::npos)
        << e.what();
  }
}

// Layer 0's attention input in float64: the embedding rows of `tok`, rms-normed (T × H).
Vec layer0_input_ref(const Spec& spec, const TensorMap& m, const std::vector<int32_t>& tok) {
  const auto T = static_cast<int64_t>(tok.size());
  Vec h(static_cast<size_t>(T * spec.H));
  const auto& emb = m.at("model.embed_tokens.weight").second;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < spec.H; ++i)
      h[static_cast<size_t>(t * spec.H + i)] = emb[static_cast<size_t>(tok[static_cast<size_t>(t)] * spec.H + i)];
  rms_ref(h, T, spec.H, m.at("model.layers.0.input_layernorm.weight").second, 0.0, spec.eps);
  return h;
}

// `cider imatrix`'s statistics and `--imatrix`: recorded inputs are each linear layer's (layer 0's q/k/v input the
// reference's normed embedding rows), the file round-trips, and a requantizing format fitted with them has a lower
// importance-weighted error than the plain fit; a file of another model, or with a format that fits nothing, is
// refused by name.
// Where the CPU level asks for it (KernelTable::ggml_interleave: AVX2), the layers of the interleavable block formats
// (Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K) with N a multiple of 8 are loaded with their rows interleaved 8 at a time; the model
// computes the same logits as with the file's order (the same int8 activations; the kernels' float sums in another
// order: 1e-5 relative), and `cider convert` writes the file's order (the blocks equal a load without the layout);
// a converted directory's mapped blocks are interleaved in place and compute exactly as the requantized model.
TEST(ModelReference, InterleavedRowsComputeAsTheFileOrder) {
  Spec spec = arch_specs()[0].second;  // K = 256 and 512: the K-quants too
  spec.H = 256;
  spec.I = 512;
  spec.D = 64;
  const TensorMap m = random_weights(spec, 71);
  const std::string dir = write_model(spec, m, "interleaved_rows");
  const auto tok = random_tokens(19, spec.V, 72);
  const bool asks = cider::kernels::active_kernels().ggml_interleave;
  for (const char* fmt : {"q4_0", "q5_1", "q4_k", "q6_k"}) {
    SCOPED_TRACE(fmt);
    auto a = cm::Model::load(dir, opts(fmt, "f32"));
    cm::ModelOptions o = opts(fmt, "f32");
    o.kernel_layout = false;
    auto b = cm::Model::load(dir, o);
    int interleaved = 0;
    for (size_t l = 0; l < a->impl().w.layers.size(); ++l) {
      const cm::LayerWeights& La = a->impl().w.layers[l];
      const cm::LayerWeights& Lb = b->impl().w.layers[l];
      const cm::Linear* xa[] = {&La.q, &La.k, &La.v, &La.o, &La.gate, &La.up, &La.down};
      const cm::Linear* xb[] = {&Lb.q, &Lb.k, &Lb.v, &Lb.o, &Lb.gate, &Lb.up, &Lb.down};
      for (size_t i = 0; i < 7; ++i) {
        const cm::Linear& A = *xa[i];
        const cm::Linear& B = *xb[i];
        EXPECT_FALSE(B.interleaved);
        const bool want = asks && cider::quant::ggml_interleavable(A.ggml_type) && A.N % 8 == 0;
        EXPECT_EQ(A.interleaved, want) << A.name;
        if (!A.interleaved) continue;
        ++interleaved;
        const auto bytes = static_cast<size_t>(A.N * cider::quant::ggml_row_bytes(*cider::quant::ggml_block_format(A.ggml_type), A.K));
        std::vector<uint8_t> back(bytes);
        cider::quant::ggml_deinterleave_rows(A.ggml_type, A.w, A.N, A.K, back.data());
        EXPECT_EQ(std::memcmp(back.data(), B.w, bytes), 0) << A.name;
      }
    }
    if (asks) {
      EXPECT_GT(interleaved, 0);
    }
    const std::vector<float> yb = run(*b, tok);
    EXPECT_LT(rel_rms(run(*a, tok), Vec(yb.begin(), yb.end())), 1e-4);
    // convert writes the file's order: loading the directory with the layout off gives b's bytes
    const std::string out = fresh_dir(std::string("interleaved_convert_") + fmt);
    std::filesystem::remove_all(out);
    cm::convert_model(dir, out, cm::parse_weight_format(fmt), {});
    cm::ModelOptions oc = opts(fmt, "f32");
    oc.kernel_layout = false;
    auto c = cm::Model::load(out, oc);
    const cm::Linear& Cq = c->impl().w.layers[0].q;
    const cm::Linear& Bq = b->impl().w.layers[0].q;
    ASSERT_EQ(Cq.ggml_type, Bq.ggml_type);
    EXPECT_EQ(std::memcmp(Cq.w, Bq.w, static_cast<size_t>(Bq.N * cider::quant::ggml_row_bytes(
                                             *cider::quant::ggml_block_format(Bq.ggml_type), Bq.K))), 0);
    // the directory's mapped blocks interleaved in place (its pages made the process's own): a's logits exactly
    auto d = cm::Model::load(out, opts(fmt, "f32"));
    EXPECT_EQ(d->impl().w.layers[0].q.interleaved, a->impl().w.layers[0].q.interleaved);
    EXPECT_EQ(run(*d, tok), run(*a, tok));
  }
}

TEST(ModelReference, ActivationStatsWeightTheBlockFits) {
  Spec spec = arch_specs()[0].second;  // K = 256 and 512: the K-quants themselves
  spec.H = 256;
  spec.I = 512;
  spec.D = 64;
  const TensorMap m = random_weights(spec, 71);
  const std::string dir = write_model(spec, m, "imatrix");
  const auto tok = random_tokens(23, spec.V, 72);
  const auto T = static_cast<int64_t>(tok.size());
  cm::ActivationStats stats;
  {
    auto model = cm::Model::load(dir, opts("f32", "f32"));
    model->record_activations(&stats);
    (void)run(*model, tok);
    model->record_activations(nullptr);
    (void)run(*model, tok);  // not recorded
  }
  const std::string q0 = "model.layers.0.self_attn.q_proj";
  for (int64_t l = 0; l < spec.L; ++l)
    for (const char* mod : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
      EXPECT_EQ(stats.rows("model.layers." + std::to_string(l) + "." + mod), T) << l << " " << mod;
  {  // layer 0's q input: rmsnorm(embedding rows), mean square per channel
    const Vec h = layer0_input_ref(spec, m, tok);
    const std::vector<float> got = stats.mean_square(q0);
    ASSERT_EQ(static_cast<int64_t>(got.size()), spec.H);
    for (int64_t i = 0; i < spec.H; ++i) {
      double want = 0.0;
      for (int64_t t = 0; t < T; ++t) want += h[static_cast<size_t>(t * spec.H + i)] * h[static_cast<size_t>(t * spec.H + i)];
      want /= static_cast<double>(T);
      EXPECT_NEAR(got[static_cast<size_t>(i)], want, 1e-4 * want + 1e-12) << "channel " << i;  // float32 norm
    }
    EXPECT_EQ(stats.mean_square("model.layers.0.self_attn.k_proj"), got);  // q, k, v: the same input
  }
  const std::string file = fresh_dir("imatrix_file") + "/imatrix.safetensors";
  stats.write(file, T, "tokens");
  const cm::Importance imp = cm::read_importance(file);
  ASSERT_EQ(imp.layers.size(), stats.layers().size());
  EXPECT_FALSE(imp.gguf_names);
  for (const auto& [name, v] : imp.layers) EXPECT_EQ(v, stats.mean_square(name)) << name;

  // q4_k with the file: each layer's importance-weighted error below the plain fit's, summed over the layers.
  auto weighted_error = [&](const cm::Model& model) {
    double e = 0.0;
    for (const cm::LayerWeights& L : model.impl().w.layers)
      for (const cm::Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
        const std::vector<float> w = dequantize_linear(*x);
        const std::vector<float>& ms = imp.layers.at(x->name);
        const auto& orig = m.at(x->name + ".weight").second;
        for (int64_t n = 0; n < x->N; ++n)
          for (int64_t k = 0; k < x->K; ++k) {
            const double d = orig[static_cast<size_t>(n * x->K + k)] - w[static_cast<size_t>(n * x->K + k)];
            e += ms[static_cast<size_t>(k)] * d * d;
          }
      }
    return e;
  };
  cm::ModelOptions o = opts("q4_k", "f32");
  const double plain = weighted_error(*cm::Model::load(dir, o));
  o.imatrix = file;
  auto fitted = cm::Model::load(dir, o);
  const double with = weighted_error(*fitted);
  EXPECT_LT(with, plain);
  std::printf("q4_k importance-weighted error with --imatrix: %.3f of the plain fit's\n", with / plain);
  EXPECT_LT(rel_rms(run(*fitted, tok), reference_logits(spec, m, tok)), 0.8);

  auto refused = [&](const cm::ModelOptions& bad, ErrorCode code, const std::string& what) {
    EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::Model::load(dir, bad); }, code, what)) << bad.imatrix;
  };
  cm::ActivationStats other;  // another model's q_proj: other input channels
  std::vector<float> row(static_cast<size_t>(spec.H / 2), 1.0f);
  other.add(q0, row.data(), 1, spec.H / 2);
  const std::string other_file = fresh_dir("imatrix_other") + "/other.safetensors";
  other.write(other_file, 1, "x");
  cm::ModelOptions bad = opts("q4_k_m", "f32");
  bad.imatrix = other_file;
  refused(bad, ErrorCode::kShapeMismatch, "holds 128 input channels for " + q0 + ", which has K = 256");
  cm::ActivationStats elsewhere;  // no layer of this model
  elsewhere.add("encoder.block.0.proj", row.data(), 1, spec.H / 2);
  const std::string elsewhere_file = fresh_dir("imatrix_elsewhere") + "/e.safetensors";
  elsewhere.write(elsewhere_file, 1, "x");
  bad.imatrix = elsewhere_file;
  refused(bad, ErrorCode::kInvalidArgument, "names none of the linear layers");
  cm::ModelOptions dense = opts("bf16", "f32");
  dense.imatrix = file;
  refused(dense, ErrorCode::kInvalidArgument, "--imatrix weights the fits of a requantizing block format");
  // Not an importance file; a negative mean square.
  const std::string not_imx = fresh_dir("imatrix_bad") + "/bad.safetensors";
  {
    cm::SafetensorsWriter w;
    const float v[2] = {1.0f, -2.0f};
    w.add(q0 + ".act_sq", cider::DType::kF32, {2}, v);
    w.set_metadata("format", "cider");
    w.write(not_imx);
  }
  EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::read_importance(not_imx); }, ErrorCode::kCorrupt,
                                       "format = \"cider-imatrix\""));  // a cider model, not an importance file
  {
    cm::SafetensorsWriter w;
    const float v[2] = {1.0f, -2.0f};
    w.add(q0 + ".act_sq", cider::DType::kF32, {2}, v);
    w.set_metadata("format", "cider-imatrix");
    w.set_metadata("version", "1");
    w.write(not_imx);
  }
  EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::read_importance(not_imx); }, ErrorCode::kCorrupt,
                                       "got -2 at channel 1"));  // a negative mean square
}

// `cider imatrix --hessian`: each layer's mean of x xᵀ (layer 0's q input against the reference's normed embedding
// rows, every element), shared by the layers fed the same input (q/k/v, gate/up) and not by the others; the file
// round-trips; a requantizing format coded with GPTQ's error feedback has a lower output error Σ (w − ŵ) H (w − ŵ)ᵀ
// than with the diagonal alone; a share naming no layer is refused.
TEST(ModelReference, SecondMomentsGiveGptqCoding) {
  Spec spec = arch_specs()[0].second;
  spec.H = 256;
  spec.I = 512;
  spec.D = 64;
  const TensorMap m = random_weights(spec, 73);
  const std::string dir = write_model(spec, m, "imatrix_h");
  const auto tok = random_tokens(29, spec.V, 74);
  const auto T = static_cast<int64_t>(tok.size());
  cm::ActivationStats full, diag, capped;
  full.set_second_moments(spec.I);
  capped.set_second_moments(spec.I - 1);  // down_proj (K = I) keeps the diagonal alone
  record_stats(dir, tok, {&full, &diag, &capped});
  EXPECT_EQ(full.second_moment_layers(), 7 * spec.L + 1);  // and the LM head's input (K = H)
  EXPECT_EQ(capped.second_moment_layers(), 6 * spec.L + 1);
  EXPECT_EQ(diag.second_moment_layers(), 0);
  const std::string full_file = fresh_dir("imatrix_h_full") + "/full.safetensors";
  const std::string diag_file = fresh_dir("imatrix_h_diag") + "/diag.safetensors";
  full.write(full_file, T, "tokens");
  diag.write(diag_file, T, "tokens");
  const cm::Importance imp = cm::read_importance(full_file);
  EXPECT_TRUE(cm::read_importance(diag_file).second_moments.empty());
  ASSERT_EQ(imp.second_moments.size(), imp.layers.size());  // every layer has one
  const std::string l0 = "model.layers.0.";
  const auto& q = imp.second_moments.at(l0 + "self_attn.q_proj");
  EXPECT_EQ(q, imp.second_moments.at(l0 + "self_attn.k_proj"));  // the same matrix, not a copy
  EXPECT_EQ(q, imp.second_moments.at(l0 + "self_attn.v_proj"));
  EXPECT_EQ(imp.second_moments.at(l0 + "mlp.gate_proj"), imp.second_moments.at(l0 + "mlp.up_proj"));
  EXPECT_NE(q, imp.second_moments.at(l0 + "mlp.gate_proj"));
  EXPECT_NE(q, imp.second_moments.at(l0 + "self_attn.o_proj"));
  EXPECT_NE(q, imp.second_moments.at("model.layers.1.self_attn.q_proj"));
  {  // layer 0's q input: rmsnorm(embedding rows); mean of x xᵀ, float32 norm and float sums
    const Vec h = layer0_input_ref(spec, m, tok);
    ASSERT_EQ(static_cast<int64_t>(q->size()), spec.H * spec.H);
    for (int64_t i = 0; i < spec.H; ++i)
      for (int64_t j = 0; j < spec.H; ++j) {
        double want = 0.0, scale = 0.0;
        for (int64_t t = 0; t < T; ++t) {
          const double a = h[static_cast<size_t>(t * spec.H + i)], b = h[static_cast<size_t>(t * spec.H + j)];
          want += a * b;
          scale += std::fabs(a * b);
        }
        ASSERT_NEAR((*q)[static_cast<size_t>(i * spec.H + j)], want / static_cast<double>(T),
                    1e-4 * scale / static_cast<double>(T) + 1e-12)
            << "(" << i << ", " << j << ")";
      }
    const std::vector<float>& ms = imp.layers.at(l0 + "self_attn.q_proj");
    for (int64_t i = 0; i < spec.H; ++i)
      EXPECT_NEAR((*q)[static_cast<size_t>(i * spec.H + i)], ms[static_cast<size_t>(i)], 1e-5 * ms[static_cast<size_t>(i)]);
  }
  // Summed over the layers: the expected squared output error on the calibration inputs.
  auto output_error = [&](const cm::Model& model) {
    double e = 0.0;
    for (const cm::LayerWeights& L : model.impl().w.layers)
      for (const cm::Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
        e += second_moment_error(*x, m.at(x->name + ".weight").second, *imp.second_moments.at(x->name));
    return e;
  };
  cm::ModelOptions o = opts("q4_k_m", "f32");
  o.imatrix = diag_file;
  const double with_diag = output_error(*cm::Model::load(dir, o));
  o.imatrix = full_file;
  auto gptq = cm::Model::load(dir, o);
  const double with_gptq = output_error(*gptq);
  EXPECT_LT(with_gptq, 0.9 * with_diag);
  std::printf("q4_k_m output error with second moments (GPTQ): %.3f of the diagonal fit's\n", with_gptq / with_diag);
  EXPECT_LT(rel_rms(run(*gptq, tok), reference_logits(spec, m, tok)), 0.8);

  // Second moments that no input could give (indefinite: 1 on the diagonal, 2 elsewhere): refused naming the layer.
  const std::string indefinite = fresh_dir("imatrix_h_indef") + "/indefinite.safetensors";
  {
    const auto k = static_cast<size_t>(spec.H);
    std::vector<float> ms(k, 1.0f), h(k * k, 2.0f);
    for (size_t i = 0; i < k; ++i) h[i * k + i] = 1.0f;
    cm::SafetensorsWriter w;
    w.add(l0 + "self_attn.q_proj.act_sq", cider::DType::kF32, {spec.H}, ms.data());
    w.add(l0 + "self_attn.q_proj.hessian", cider::DType::kF32, {spec.H, spec.H}, h.data());
    w.set_metadata("format", "cider-imatrix");
    w.set_metadata("version", "1");
    w.write(indefinite);
    o.imatrix = indefinite;
    EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::Model::load(dir, o); }, ErrorCode::kCorrupt,
                                         "second moments of " + l0 + "self_attn.q_proj"));
    EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::Model::load(dir, o); }, ErrorCode::kCorrupt,
                                         "not positive definite"));
  }
  // A share that names no layer with second moments.
  const std::string bad = fresh_dir("imatrix_h_bad") + "/bad.safetensors";
  {
    cm::SafetensorsWriter w;
    const float v[2] = {1.0f, 2.0f};
    w.add(l0 + "self_attn.q_proj.act_sq", cider::DType::kF32, {2}, v);
    w.set_metadata("format", "cider-imatrix");
    w.set_metadata("version", "1");
    w.set_metadata("hessian_of_" + l0 + "self_attn.q_proj", "nowhere");
    w.write(bad);
  }
  EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::read_importance(bad); }, ErrorCode::kCorrupt,
                                       "must name a layer with second moments of the same K; got 'nowhere'"));
}

// The LM head's input (every row's final norm) is recorded too; with its second moments, a tied head is GPTQ-coded
// apart from the embedding in the --head-weights type while the lookup keeps the source's rows; without them, one
// tensor in that type serves both, as a GGUF file's does. A cider file keeps the head apart.
TEST(ModelReference, TiedHeadWithSecondMomentsIsCodedApart) {
  Spec spec = arch_specs()[2].second;  // Qwen2, tied
  ASSERT_TRUE(spec.tie);
  spec.H = 256;
  spec.I = 512;
  spec.D = 64;
  const TensorMap m = random_weights(spec, 91);
  const std::string dir = write_model(spec, m, "head_apart");
  const auto tok = random_tokens(33, spec.V, 92);
  cm::ActivationStats full, diag;
  full.set_second_moments(spec.I);
  record_stats(dir, tok, {&full, &diag});
  const std::string full_file = fresh_dir("head_apart_full") + "/full.safetensors";
  const std::string diag_file = fresh_dir("head_apart_diag") + "/diag.safetensors";
  full.write(full_file, static_cast<int64_t>(tok.size()), "tokens");
  diag.write(diag_file, static_cast<int64_t>(tok.size()), "tokens");
  const cm::Importance imp = cm::read_importance(full_file);
  ASSERT_EQ(imp.second_moments.count("lm_head"), 1u);
  const std::vector<float>& H = *imp.second_moments.at("lm_head");
  const std::vector<float>& ms = imp.layers.at("lm_head");
  ASSERT_EQ(static_cast<int64_t>(ms.size()), spec.H);
  ASSERT_EQ(static_cast<int64_t>(H.size()), spec.H * spec.H);
  for (int64_t i = 0; i < spec.H; ++i) {  // one set of rows: the diagonal is the mean square
    ASSERT_GT(ms[static_cast<size_t>(i)], 0.0f);
    EXPECT_NEAR(H[static_cast<size_t>(i * spec.H + i)], ms[static_cast<size_t>(i)], 1e-5 * ms[static_cast<size_t>(i)]);
  }

  const auto& emb = m.at("model.embed_tokens.weight").second;
  // The head's expected squared output error on the calibration inputs.
  auto head_error = [&](const cm::Linear& L) { return second_moment_error(L, emb, H); };
  const uint32_t q50 = static_cast<uint32_t>(cider::quant::GgmlType::kQ5_0);
  cm::ModelOptions o = opts("q4_k_m", "f32");
  o.head_weights = cm::WeightFormat::kQ5_0;
  o.imatrix = diag_file;
  auto tied = cm::Model::load(dir, o);
  {  // no second moments: the embedding in Q5_0 blocks is the head too
    const cm::Weights& w = tied->impl().w;
    EXPECT_TRUE(w.head_is_embedding);
    EXPECT_EQ(w.embed_ggml_type, q50);
    EXPECT_EQ(w.lm_head.ggml_type, q50);
    EXPECT_EQ(w.lm_head.w, w.embed);
  }
  o.imatrix = full_file;
  auto apart = cm::Model::load(dir, o);
  const cm::Weights& w = apart->impl().w;
  EXPECT_FALSE(w.head_is_embedding);
  EXPECT_EQ(w.lm_head.kind, cm::Linear::Kind::kGgml);
  EXPECT_EQ(w.lm_head.ggml_type, q50);
  ASSERT_EQ(w.embed_ggml_type, 0u);  // the float rows, as the checkpoint has them (bf16 at worst)
  for (int64_t i = 0; i < spec.V * spec.H; ++i) {
    const float want = emb[static_cast<size_t>(i)];
    ASSERT_NEAR(cider::load_float(w.embed, w.embed_dtype, i), want, std::ldexp(std::fabs(want), -8)) << i;
  }
  const double e_tied = head_error(tied->impl().w.lm_head), e_apart = head_error(w.lm_head);
  std::printf("Q5_0 head output error, GPTQ-coded apart: %.3f of the tied diagonal fit's\n", e_apart / e_tied);
  EXPECT_LT(e_apart, 0.9 * e_tied);
  const Vec ref = reference_logits(spec, m, tok);
  const std::vector<float> got = run(*apart, tok);
  EXPECT_LT(rel_rms(got, ref), 0.8);
  // The float rows added, the Q5_0 bytes the same (once the embedding's, now the head's).
  EXPECT_EQ(w.nbytes, tied->impl().w.nbytes + static_cast<size_t>(spec.V * spec.H) * cider::dtype_size(w.embed_dtype));
  {  // converted: the head stays apart, and the directory loads to the same logits
    const std::string out = temp_root().string() + "/head_apart_cider";
    std::filesystem::remove_all(out);
    cm::convert_model(dir, out, cm::WeightFormat::kQ4_K_M, {}, full_file, cm::WeightFormat::kQ5_0);
    auto c = cm::Model::load(out, opts("q4_k_m", "f32"));
    EXPECT_FALSE(c->impl().w.head_is_embedding);
    EXPECT_EQ(c->impl().w.lm_head.ggml_type, q50);
    EXPECT_EQ(run(*c, tok), got);
    cm::ModelOptions oc = opts("q4_k_m", "f32");
    oc.head_weights = cm::WeightFormat::kQ5_0;
    EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::Model::load(out, oc); }, ErrorCode::kInvalidArgument,
                                         "--head-weights applies when converting"));
  }
  // Refusals: a format that requantizes nothing, a mix as the head's type, blocks that do not divide K.
  cm::ModelOptions bad = opts("bf16", "f32");
  bad.head_weights = cm::WeightFormat::kQ5_0;
  EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::Model::load(dir, bad); }, ErrorCode::kInvalidArgument,
                                       "--head-weights sets the LM head's block type of a requantizing format"));
  bad = opts("q4_0", "f32");
  bad.head_weights = cm::WeightFormat::kQ4_K_M;
  EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::Model::load(dir, bad); }, ErrorCode::kInvalidArgument,
                                       "--head-weights must name one block type"));
  Spec narrow = arch_specs()[2].second;
  narrow.H = 96;
  const std::string ndir = write_model(narrow, random_weights(narrow, 93), "head_apart_narrow");
  bad = opts("q4_0", "f32");
  bad.head_weights = cm::WeightFormat::kQ4_K;
  EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::Model::load(ndir, bad); }, ErrorCode::kUnsupported,
                                       "--head-weights Q4_K needs the hidden size to be a multiple of its 256"));
}

TEST(ModelReference, QuantizedKvCacheStaysClose) {
  Spec spec = arch_specs()[3].second;  // Qwen3, head_dim 32
  const TensorMap m = random_weights(spec, 61);
  const std::string dir = write_model(spec, m, "kv");
  const auto tok = random_tokens(30, spec.V, 62);
  const Vec ref = reference_logits(spec, m, tok);
  for (const char* kv : {"k8v8", "k4v3", "bf16", "f16"}) {
    for (const char* rot : {"so4-full", "so4-fast", "none"}) {
      cm::ModelOptions o = opts("f32", kv);
      o.kv.group_size = 32;
      if (o.kv.quantized) o.kv.rotation = cm::parse_kv_rotation(rot);
      auto model = cm::Model::load(dir, o);
      const double r = rel_rms(run(*model, tok), ref);
      const double bound = std::string(kv) == "k4v3" ? 0.4 : (std::string(kv) == "k8v8" ? 0.03 : 0.01);
      EXPECT_LT(r, bound) << kv << " " << rot;
      auto s = model->new_session();
      std::vector<float> out(static_cast<size_t>(spec.V));
      model->forward(*s, tok.data(), 5, out.data(), false);
      EXPECT_GT(s->kv_bytes(), 0u);
    }
  }
  // The quantized cache takes about a quarter of a bf16 one (same capacity).
  auto kbytes = [&](const char* kv) {
    cm::ModelOptions o = opts("f32", kv);
    o.kv.group_size = 32;
    auto model = cm::Model::load(dir, o);
    auto s = model->new_session();
    std::vector<float> out(static_cast<size_t>(spec.V));
    model->forward(*s, tok.data(), 5, out.data(), false);
    return s->kv_bytes();
  };
  EXPECT_LT(kbytes("k4v3") * 3, kbytes("bf16"));
}

// ---- MLX ----------------------------------------------------------------------------------------------------------

TEST(ModelMlx, LoadsAffineQuantizedDirectoryWithOverrides) {
  Spec spec = arch_specs()[0].second;
  spec.dtype = DType::kBF16;
  const TensorMap m = random_weights(spec, 71);
  // Quantize like mlx-lm: every linear and the embedding, 4 bits / group 32; one layer overridden to 8 bits /
  // group 64; one left float by an override of false.
  const std::string dir = fresh_dir("mlx");
  cm::SafetensorsWriter w;
  std::vector<std::vector<uint8_t>> keep;
  std::vector<cider::Tensor> tkeep;
  TensorMap deq = m;  // the weights MLX would compute with
  json q = {{"group_size", 32}, {"bits", 4}, {"mode", "affine"}};
  q["model.layers.1.mlp.down_proj"] = {{"group_size", 64}, {"bits", 8}};
  q["model.layers.0.self_attn.o_proj"] = false;
  for (const auto& [name, t] : m) {
    const bool matrix = t.first.size() == 2 && name != "model.layers.0.self_attn.o_proj.weight";
    auto bytes = cider::test::to_dtype_bytes(t.second, spec.dtype);
    if (!matrix) {
      keep.push_back(std::move(bytes));
      w.add(name, spec.dtype, t.first, keep.back().data());
      continue;
    }
    const std::string prefix = name.substr(0, name.size() - 7);
    const int gs = prefix == "model.layers.1.mlp.down_proj" ? 64 : 32, bits = gs == 64 ? 8 : 4;
    keep.push_back(std::move(bytes));
    auto aq = cider::quant::affine_quantize(cider::TensorView(keep.back().data(), spec.dtype, t.first), gs, bits);
    cider::Tensor d = cider::quant::affine_dequantize(aq.packed.view(), aq.scales.view(), aq.biases.view(), gs, bits,
                                                      DType::kF32);
    deq[name].second.assign(d.ptr<float>(), d.ptr<float>() + d.numel());
    tkeep.push_back(std::move(aq.packed));
    w.add(prefix + ".weight", DType::kU32, tkeep.back().shape, tkeep.back().buffer.data());
    tkeep.push_back(std::move(aq.scales));
    w.add(prefix + ".scales", spec.dtype, tkeep.back().shape, tkeep.back().buffer.data());
    tkeep.push_back(std::move(aq.biases));
    w.add(prefix + ".biases", spec.dtype, tkeep.back().shape, tkeep.back().buffer.data());
  }
  w.set_metadata("format", "mlx");
  w.write(dir + "/model.safetensors");
  json cfg = hf_config(spec);
  cfg["quantization"] = q;
  write_text(dir + "/config.json", cfg.dump());

  const auto tok = random_tokens(21, spec.V, 72);
  const Vec ref = reference_logits(spec, deq, tok);
  auto f32 = cm::Model::load(dir, opts("f32", "f32"));
  EXPECT_EQ(f32->impl().source, "mlx");
  EXPECT_TRUE(close_rel(run(*f32, tok), ref, 1e-4));
  for (const char* fmt : {"bf16", "w8a8", "w4a8"}) {
    auto model = cm::Model::load(dir, opts(fmt, "f32"));
    EXPECT_LT(rel_rms(run(*model, tok), ref), std::string(fmt) == "w4a8" ? 0.5 : 0.1) << fmt;
  }
  // w4a8 keeps MLX's finer group of 32 where it has one.
  auto w4 = cm::Model::load(dir, opts("w4a8", "f32"));
  EXPECT_EQ(w4->impl().w.layers[0].q.group_size, 32);

  // A scales tensor whose shape disagrees with the configured group size is named.
  cfg["quantization"]["group_size"] = 64;
  write_text(dir + "/config.json", cfg.dump());
  try {
    cm::Model::load(dir, opts("f32", "f32"));
    ADD_FAILURE() << "no error";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kShapeMismatch);
    EXPECT_NE(std::string(e.what()).find(".scales"), std::string::npos) << e.what();
  }
}

// ---- GGUF ---------------------------------------------------------------------------------------------------------

// A minimal GGUF v3 writer (metadata: strings, u32, f32; tensors F32/F16), enough to build test files.
struct GgufWriter {
  std::string kv;
  uint64_t n_kv = 0;
  struct T {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t type;
    std::string bytes;
  };
  std::vector<T> tensors;
  static void u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
  static void u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
  static void str(std::string& b, const std::string& s) {
    u64(b, s.size());
    b += s;
  }
  void set_str(const std::string& k, const std::string& v) {
    str(kv, k);
    u32(kv, 8);
    str(kv, v);
    ++n_kv;
  }
  void set_u32(const std::string& k, uint32_t v) {
    str(kv, k);
    u32(kv, 4);
    u32(kv, v);
    ++n_kv;
  }
  void set_f32(const std::string& k, float v) {
    str(kv, k);
    u32(kv, 6);
    kv.append(reinterpret_cast<const char*>(&v), 4);
    ++n_kv;
  }
  // Q8_0: blocks of 32 values along a row, each an f16 scale d = max|x|/127 and 32 int8 codes x/d (ggml's layout).
  static std::string q8_0(const std::vector<float>& v) {
    std::string b;
    for (size_t i = 0; i < v.size(); i += 32) {
      float mx = 0;
      for (size_t j = 0; j < 32; ++j) mx = std::max(mx, std::fabs(v[i + j]));
      const uint16_t dh = cider::f32_to_f16(mx / 127.0f);
      const float d = cider::f16_to_f32(dh);
      b.append(reinterpret_cast<const char*>(&dh), 2);
      for (size_t j = 0; j < 32; ++j) {
        const float q = d == 0 ? 0.0f : std::nearbyint(v[i + j] / d);
        b.push_back(static_cast<char>(static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, q)))));
      }
    }
    return b;
  }
  static std::vector<float> q8_0_roundtrip(const std::vector<float>& v) {
    const std::string b = q8_0(v);
    std::vector<float> out(v.size());
    for (size_t blk = 0; blk < v.size() / 32; ++blk) {
      uint16_t dh;
      std::memcpy(&dh, b.data() + blk * 34, 2);
      for (size_t j = 0; j < 32; ++j)
        out[blk * 32 + j] = cider::f16_to_f32(dh) * static_cast<float>(static_cast<int8_t>(b[blk * 34 + 2 + j]));
    }
    return out;
  }
  void add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v, bool f16, bool q8 = false) {
    T t{name, shape, q8 ? 8u : (f16 ? 1u : 0u), {}};
    if (q8) {
      t.bytes = q8_0(v);
    } else if (f16) {
      for (float x : v) {
        const uint16_t h = cider::f32_to_f16(x);
        t.bytes.append(reinterpret_cast<const char*>(&h), 2);
      }
    } else {
      t.bytes.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    }
    tensors.push_back(t);
  }
  void write(const std::string& path) const {
    std::string b = "GGUF";
    u32(b, 3);
    u64(b, tensors.size());
    u64(b, n_kv);
    b += kv;
    uint64_t off = 0;
    std::vector<uint64_t> offs;
    for (const T& t : tensors) {
      str(b, t.name);
      u32(b, static_cast<uint32_t>(t.shape.size()));
      for (size_t i = t.shape.size(); i-- > 0;) u64(b, static_cast<uint64_t>(t.shape[i]));  // ne[0] fastest
      u32(b, t.type);
      u64(b, off);
      offs.push_back(off);
      off += (t.bytes.size() + 31) / 32 * 32;
    }
    b.append((32 - b.size() % 32) % 32, '\0');
    for (const T& t : tensors) {
      b += t.bytes;
      b.append((32 - t.bytes.size() % 32) % 32, '\0');
    }
    std::ofstream(path, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
  }
};

// llama.cpp's importance file (`llama-imatrix`'s GGUF: "<gguf weight>.in_sum2" and ".counts") weights the fits as
// cider's own file with the same means does, block for block; a GGUF that is not an imatrix is refused by name.
TEST(ModelReference, LlamaCppImatrixFilesWeightTheFitsAsCidersDo) {
  Spec spec = arch_specs()[0].second;  // llama
  spec.H = 256;
  spec.I = 512;
  spec.D = 64;
  const TensorMap m = random_weights(spec, 73);
  const std::string dir = write_model(spec, m, "llama_imatrix");
  cm::ActivationStats stats;
  {
    auto model = cm::Model::load(dir, opts("f32", "f32"));
    model->record_activations(&stats);
    (void)run(*model, random_tokens(17, spec.V, 74));
  }
  const std::string ours = fresh_dir("llama_imx_ours") + "/imx.safetensors";
  stats.write(ours, 17, "tokens");
  const std::map<std::string, std::string> gguf_of = {
      {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  GgufWriter g;
  g.set_str("general.type", "imatrix");
  for (const std::string& name : stats.layers()) {
    std::string gname = "output.weight";  // the LM head (llama-imatrix --process-output)
    if (name != "lm_head") {
      const size_t at = name.find('.', std::string("model.layers.").size());
      const std::string layer = name.substr(std::string("model.layers.").size(), at - std::string("model.layers.").size());
      gname = "blk." + layer + "." + gguf_of.at(name.substr(at + 1)) + ".weight";
    }
    std::vector<float> sums = stats.mean_square(name);
    for (float& v : sums) v *= 4.0f;  // 4 rows: the mean comes back exactly
    // llama-imatrix writes one matrix's entries 1-D (trailing dimensions of 1 dropped); the 2-D form is read too
    const auto K = static_cast<int64_t>(sums.size());
    g.add(gname + ".in_sum2", name.find("q_proj") != std::string::npos ? std::vector<int64_t>{1, K}
                                                                        : std::vector<int64_t>{K}, sums, false);
    g.add(gname + ".counts", {1}, {4.0f}, false);
  }
  g.add("blk.0.ffn_gate_exps.weight.in_sum2", {2, 8}, std::vector<float>(16, 1.0f), false);  // experts: not used
  g.add("blk.0.ffn_gate_exps.weight.counts", {2, 1}, {1.0f, 1.0f}, false);
  const std::string theirs = fresh_dir("llama_imx_theirs") + "/imatrix.gguf";
  g.write(theirs);
  const cm::Importance read = cm::read_importance(theirs);
  EXPECT_TRUE(read.gguf_names);
  EXPECT_EQ(read.layers.size(), stats.layers().size());
  EXPECT_EQ(read.layers.count("blk.0.ffn_gate_exps.weight"), 0u);
  auto blocks = [&](const std::string& file) {
    cm::ModelOptions o = opts("q4_k_m", "f32");
    o.imatrix = file;
    auto model = cm::Model::load(dir, o);
    std::vector<std::vector<uint8_t>> out;
    for (const cm::LayerWeights& L : model->impl().w.layers)
      for (const cm::Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
        const cider::quant::GgmlBlockFormat& f = *cider::quant::ggml_block_format(x->ggml_type);
        const auto* b = static_cast<const uint8_t*>(x->w);
        out.emplace_back(b, b + x->N * cider::quant::ggml_row_bytes(f, x->K));
      }
    return out;
  };
  const auto a = blocks(ours), b = blocks(theirs), plain = blocks("");
  EXPECT_EQ(a, b);
  EXPECT_NE(a, plain);
  GgufWriter not_imx;
  not_imx.set_str("general.type", "model");
  not_imx.add("blk.0.attn_q.weight.in_sum2", {1, 4}, {1, 1, 1, 1}, false);
  const std::string model_file = fresh_dir("llama_imx_model") + "/m.gguf";
  not_imx.write(model_file);
  EXPECT_TRUE(cider::test::throws_code([&] { (void)cm::read_importance(model_file); }, ErrorCode::kCorrupt,
                                       "general.type = \"imatrix\"; got \"model\""));
}

// HF → GGUF the way llama.cpp's converter does it, including the llama-arch Q/K row permutation (within each head,
// HF row h·D/2 + i goes to row 2i + h) and Gemma's 1 + w norms.
// q8: linear weights as Q8_0 blocks (else F32, attn_v F16); q8_embed: the embedding too (else F16).
// raw: the linear weights' bytes instead (raw(rows, cols): blocks of ggml type raw_type), m giving only their shapes.
std::string write_gguf(const Spec& s, const TensorMap& m, const std::string& arch, bool q8 = false,
                       bool q8_embed = false,
                       const std::function<std::string(const std::string&, int64_t, int64_t)>& raw = {},
                       uint32_t raw_type = 0) {
  GgufWriter g;
  g.set_str("general.architecture", arch);
  const std::string p = arch + ".";
  g.set_u32(p + "context_length", static_cast<uint32_t>(s.max_pos));
  g.set_u32(p + "embedding_length", static_cast<uint32_t>(s.H));
  g.set_u32(p + "block_count", static_cast<uint32_t>(s.L));
  g.set_u32(p + "feed_forward_length", static_cast<uint32_t>(s.I));
  g.set_u32(p + "attention.head_count", static_cast<uint32_t>(s.Hq));
  g.set_u32(p + "attention.head_count_kv", static_cast<uint32_t>(s.Hkv));
  g.set_u32(p + "attention.key_length", static_cast<uint32_t>(s.D));
  g.set_u32(p + "attention.value_length", static_cast<uint32_t>(s.D));
  g.set_f32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(s.eps));
  g.set_f32(p + "rope.freq_base", static_cast<float>(s.theta));
  if (s.gemma) g.set_u32(p + "attention.sliding_window", static_cast<uint32_t>(s.window));
  if (arch == "gemma2" && s.attn_softcap > 0) g.set_f32(p + "attn_logit_softcapping", static_cast<float>(s.attn_softcap));
  if (arch == "gemma2" && s.softcap > 0) g.set_f32(p + "final_logit_softcapping", static_cast<float>(s.softcap));
  auto put = [&](const std::string& gname, const std::string& hf, bool f16 = false) {
    if (!m.count(hf)) return;  // lets a test leave a tensor out
    auto t = m.at(hf);
    if (raw && t.first.size() == 2 && gname != "token_embd.weight") {
      g.tensors.push_back({gname, t.first, raw_type, raw(gname, t.first[0], t.first[1])});
      return;
    }
    if (arch == "llama" && (hf.find("q_proj") != std::string::npos || hf.find("k_proj") != std::string::npos)) {
      const int64_t heads = hf.find("q_proj") != std::string::npos ? s.Hq : s.Hkv, K = t.first[1];
      std::vector<float> out(t.second.size());
      for (int64_t hd = 0; hd < heads; ++hd)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t i = 0; i < s.D / 2; ++i)
            std::memcpy(&out[static_cast<size_t>((hd * s.D + 2 * i + h) * K)],
                        &t.second[static_cast<size_t>((hd * s.D + h * s.D / 2 + i) * K)], static_cast<size_t>(K) * 4);
      t.second = out;
    }
    if (s.gemma && hf.find("norm") != std::string::npos)
      for (float& x : t.second) x += 1.0f;
    const bool linear = t.first.size() == 2 && gname != "token_embd.weight";
    g.add(gname, t.first, t.second, f16, (q8 && linear) || (q8_embed && gname == "token_embd.weight"));
  };
  put("token_embd.weight", "model.embed_tokens.weight", true);
  put("output_norm.weight", "model.norm.weight");
  if (!s.tie) put("output.weight", "lm_head.weight");
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string hp = "model.layers." + std::to_string(l) + ".", gp = "blk." + std::to_string(l) + ".";
    put(gp + "attn_norm.weight", hp + "input_layernorm.weight");
    put(gp + "attn_q.weight", hp + "self_attn.q_proj.weight");
    put(gp + "attn_k.weight", hp + "self_attn.k_proj.weight");
    put(gp + "attn_v.weight", hp + "self_attn.v_proj.weight", true);
    put(gp + "attn_output.weight", hp + "self_attn.o_proj.weight");
    if (s.qk_norm) {
      put(gp + "attn_q_norm.weight", hp + "self_attn.q_norm.weight");
      put(gp + "attn_k_norm.weight", hp + "self_attn.k_norm.weight");
    }
    if (s.gemma) {
      put(gp + "post_attention_norm.weight", hp + "post_attention_layernorm.weight");
      put(gp + "ffn_norm.weight", hp + "pre_feedforward_layernorm.weight");
      put(gp + "post_ffw_norm.weight", hp + "post_feedforward_layernorm.weight");
    } else {
      put(gp + "ffn_norm.weight", hp + "post_attention_layernorm.weight");
    }
    put(gp + "ffn_gate.weight", hp + "mlp.gate_proj.weight");
    put(gp + "ffn_up.weight", hp + "mlp.up_proj.weight");
    put(gp + "ffn_down.weight", hp + "mlp.down_proj.weight");
  }
  const std::string path = fresh_dir("gguf") + "/model.gguf";
  g.write(path);
  return path;
}

// Values exactly representable in f16 (the GGUF writer stores some tensors as F16).
TensorMap f16_exact(TensorMap m) {
  for (auto& [n, t] : m)
    for (float& x : t.second) x = cider::round_to(DType::kF16, x);
  return m;
}

TEST(ModelGguf, LlamaUndoesTheQKPermutation) {
  Spec spec;  // llama GQA 4:2, no scaling, no biases
  const TensorMap m = f16_exact(random_weights(spec, 81));
  const std::string path = write_gguf(spec, m, "llama");
  const auto tok = random_tokens(20, spec.V, 82);
  auto model = cm::Model::load(path, opts("f32", "f32"));
  EXPECT_EQ(model->impl().source, "gguf");
  EXPECT_TRUE(close_rel(run(*model, tok), reference_logits(spec, m, tok), 1e-4));
  auto q8 = cm::Model::load(path, opts("w8a8", "f32"));
  EXPECT_LT(rel_rms(run(*q8, tok), reference_logits(spec, m, tok)), 0.1);
}

TEST(ModelGguf, Q8_0TensorsDequantizeThenConvert) {
  // Linear weights stored as Q8_0 (row blocks of 32, permuted Q/K rows included); the reference uses the values the
  // blocks hold (Q8_0 of Q8_0-rounded values is exact, so rounding first gives the stored values in HF order).
  Spec spec;
  TensorMap m = f16_exact(random_weights(spec, 85));
  for (auto& [name, t] : m)
    if (t.first.size() == 2 && name != "model.embed_tokens.weight") t.second = GgufWriter::q8_0_roundtrip(t.second);
  const std::string path = write_gguf(spec, m, "llama", /*q8=*/true);
  const auto tok = random_tokens(20, spec.V, 86);
  const Vec ref = reference_logits(spec, m, tok);
  EXPECT_TRUE(close_rel(run(*cm::Model::load(path, opts("f32", "f32")), tok), ref, 1e-4));
  EXPECT_TRUE(close_rel(run(*cm::Model::load(path, opts("bf16", "f32")), tok), ref, 0.05));
  // GGUF → cider: the converted model computes exactly what the GGUF one does.
  const std::string out = temp_root().string() + "/converted_gguf";
  cm::convert_model(path, out, cm::WeightFormat::kW8A8);
  const auto a = run(*cm::Model::load(path, opts("w8a8", "f32")), tok);
  const auto b = run(*cm::Model::load(out, opts("w8a8", "f32")), tok);
  EXPECT_TRUE(cider::test::all_close(b.data(), a.data(), a.size(), 0.0));
}

// Q3_K linear weights (random blocks) under --weights native: re-encoded as Q6_K blocks at load
// (quant::repack_q3_k_as_q6_k, bit for bit the same values: test_ggml_linear.cpp), so the model computes exactly what
// the same file with those Q6_K blocks computes, and what its Q3_K blocks dequantized to float32 compute within the
// int8-activation bound of the native test below; `cider inspect`'s counts say "Q3_K as Q6_K".
TEST(ModelGguf, NativeRunsQ3_KAsQ6_KBitForBit) {
  Spec spec;
  spec.H = 256;
  spec.I = 512;
  spec.D = 64;
  const TensorMap m = f16_exact(random_weights(spec, 91));
  std::map<std::string, std::string> q3;  // per tensor, its random Q3_K blocks
  auto rng = cider::test::make_rng(92);
  const auto q3_blocks = [&](const std::string& name, int64_t rows, int64_t cols) {
    const std::vector<uint8_t> b = cider::test::random_blocks(rng, cider::quant::GgmlType::kQ3_K, rows * cols / 256);
    return q3[name] = std::string(b.begin(), b.end());
  };
  const auto q6_blocks = [&](const std::string& name, int64_t, int64_t) {
    const std::string& src = q3.at(name);
    std::string out(src.size() / 110 * 210, '\0');
    for (size_t i = 0; i < src.size() / 110; ++i)
      cider::quant::repack_q3_k_as_q6_k(reinterpret_cast<const uint8_t*>(src.data()) + i * 110,
                                        reinterpret_cast<uint8_t*>(out.data()) + i * 210);
    return out;
  };
  const std::string a = write_gguf(spec, m, "llama", false, false, q3_blocks, 11u);  // Q3_K
  const std::string b = write_gguf(spec, m, "llama", false, false, q6_blocks, 14u);  // the same as Q6_K
  const auto tok = random_tokens(24, spec.V, 93);
  auto native = cm::Model::load(a, opts("native", "f32"));
  const cm::Weights& w = native->impl().w;
  EXPECT_EQ(w.layers[0].q.kind, cm::Linear::Kind::kGgml);
  EXPECT_EQ(w.layers[0].q.ggml_type, 14u);  // Q6_K
  EXPECT_EQ(w.format_counts.at("Q3_K as Q6_K"), 7 * spec.L + (spec.tie ? 0 : 1));
  const std::vector<float> got = run(*native, tok);
  const std::vector<float> same = run(*cm::Model::load(b, opts("native", "f32")), tok);
  ASSERT_EQ(got.size(), same.size());
  EXPECT_EQ(std::memcmp(got.data(), same.data(), got.size() * sizeof(float)), 0);
  const std::vector<float> f32 = run(*cm::Model::load(a, opts("f32", "f32")), tok);
  const double bound = cider::kernels::active_kernels().ggml_linear_prefill ? 0.06 : 0.015;
  EXPECT_LT(rel_rms(got, Vec(f32.begin(), f32.end())), bound);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
}

// Q2_K linear weights (random blocks) under --weights native: kept as Q2_K blocks (a scale and a min per 16 weights,
// quant/ggml_blocks.h's integer form), and the model computes what the blocks dequantized to float32 compute within
// the int8-activation bound of the Q3_K test above; `cider inspect`'s counts say "Q2_K".
TEST(ModelGguf, NativeKeepsQ2_KBlocks) {
  Spec spec;
  spec.H = 256;
  spec.I = 512;
  spec.D = 64;
  const TensorMap m = f16_exact(random_weights(spec, 94));
  auto rng = cider::test::make_rng(95);
  // Random blocks with the minimums a quantizer would give: m ≈ 1.5·sc and dmin = d, so each group of 16 spans
  // d·sc·{−1.5, −0.5, 0.5, 1.5} around zero, as real weights do. (With random minimums every group carries a large
  // offset of one sign; outputs then cancel in sums far larger than themselves, and the model amplifies the int8
  // activation rounding by seed up to an RMS error above 1 at position 0.) Over 200 seeds on the AVX-512 + AMX VM
  // (2026-12-06): at most 0.004 (prefill) and 0.010 (one token at a time).
  const auto q2_blocks = [&](const std::string&, int64_t rows, int64_t cols) {
    std::vector<uint8_t> b = cider::test::random_blocks(rng, cider::quant::GgmlType::kQ2_K, rows * cols / 256);
    for (size_t blk = 0; blk < b.size() / 84; ++blk) {
      uint8_t* q = b.data() + blk * 84;
      for (int j = 0; j < 16; ++j) {
        const int sc = q[j] & 0x0F;
        q[j] = static_cast<uint8_t>(sc | (std::min(15, (3 * sc + 1) / 2) << 4));
      }
      q[82] = q[80];  // dmin = d
      q[83] = q[81];
    }
    return std::string(b.begin(), b.end());
  };
  const std::string path = write_gguf(spec, m, "llama", false, false, q2_blocks, 10u);  // Q2_K
  const auto tok = random_tokens(24, spec.V, 96);
  auto native = cm::Model::load(path, opts("native", "f32"));
  const cm::Weights& w = native->impl().w;
  EXPECT_EQ(w.layers[0].q.kind, cm::Linear::Kind::kGgml);
  EXPECT_EQ(w.layers[0].q.ggml_type, 10u);
  EXPECT_EQ(w.format_counts.at("Q2_K"), 7 * spec.L + (spec.tie ? 0 : 1));
  const std::vector<float> got = run(*native, tok);
  const std::vector<float> f32 = run(*cm::Model::load(path, opts("f32", "f32")), tok);
  const double bound = cider::kernels::active_kernels().ggml_linear_prefill ? 0.06 : 0.015;
  EXPECT_LT(rel_rms(got, Vec(f32.begin(), f32.end())), bound);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  // One token at a time (the GEMV path): the same bound against the float32 model's last row.
  auto s = native->new_session();
  std::vector<float> row(static_cast<size_t>(spec.V));
  for (size_t i = 0; i < tok.size(); ++i) native->forward(*s, &tok[i], 1, row.data(), false);
  const Vec last(f32.end() - spec.V, f32.end());
  EXPECT_LT(rel_rms(std::vector<float>(row.begin(), row.end()), last), bound);
}

// --weights native keeps the Q8_0 blocks of the linear layers (q/k rows un-permuted block row by block row), falls
// back to bf16 for the F16 embedding, and computes the reference's logits. A 24-token prompt is prefill (M >= 16): on a
// level whose ggml_linear takes prefill (KernelTable::ggml_linear_prefill: avx512, avx2) every matmul uses int8 activations
// per 32 (step max|x|/127: an RMS error of about 0.5 % of each activation piece, which this random 2-layer model amplifies to a
// logit RMS of 0.022–0.028 over seeds 1–10, hence 0.06); elsewhere the blocks are decoded to float32 rows (0.004–0.007
// from the f16 embedding and float32 sums, hence 0.015). A wrong q/k row order gives errors of order 1.
TEST(ModelGguf, NativeKeepsQ8_0BlocksAndMatchesTheReference) {
  Spec spec;
  TensorMap m = f16_exact(random_weights(spec, 87));
  for (auto& [name, t] : m)
    if (t.first.size() == 2 && name != "model.embed_tokens.weight") t.second = GgufWriter::q8_0_roundtrip(t.second);
  const std::string path = write_gguf(spec, m, "llama", /*q8=*/true);
  const auto tok = random_tokens(24, spec.V, 88);
  const Vec ref = reference_logits(spec, m, tok);
  auto native = cm::Model::load(path, opts("native", "f32"));
  const cm::Weights& w = native->impl().w;
  EXPECT_EQ(w.layers[0].q.kind, cm::Linear::Kind::kGgml);
  EXPECT_EQ(w.layers[0].q.ggml_type, 8u);  // Q8_0
  EXPECT_EQ(w.embed_ggml_type, 0u);        // F16 in the file: no integer form, kept as bf16
  EXPECT_EQ(w.format_counts.at("Q8_0"), 7 * spec.L + (spec.tie ? 0 : 1));
  const std::vector<float> got = run(*native, tok);
  const double bound = cider::kernels::active_kernels().ggml_linear_prefill ? 0.06 : 0.015;
  EXPECT_LT(rel_rms(got, ref), bound);
  // The q/k row order is right: the same file through f32 (dequantized, un-permuted as floats) agrees as closely.
  const std::vector<float> f32 = run(*cm::Model::load(path, opts("f32", "f32")), tok);
  EXPECT_LT(rel_rms(got, Vec(f32.begin(), f32.end())), bound);
  // The default weights: native for a GGUF file on either device, bf16 for a directory.
  EXPECT_EQ(cm::default_weights(path, cm::Device::kCPU), cm::WeightFormat::kNative);
  EXPECT_EQ(cm::default_weights(path, cm::Device::kCUDA), cm::WeightFormat::kNative);
  EXPECT_EQ(cm::default_weights(std::string(CIDER_SOURCE_DIR) + "/models/cider-tiny", cm::Device::kCPU),
            cm::WeightFormat::kBF16);
  // A directory has no blocks to keep.
  try {
    cm::Model::load(std::string(CIDER_SOURCE_DIR) + "/models/cider-tiny", opts("native", "f32"));
    ADD_FAILURE() << "native from a directory loaded";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("GGUF"), std::string::npos) << e.what();
  }
}

TEST(ModelGguf, Gemma3NormsAndLayerPattern) {
  Spec spec = arch_specs()[4].second;
  // llama.cpp's Gemma 3: every layer sliding except each 6th, local base 10000, q scale head_dim^-1/2, no softcap
  // or rope scaling metadata.
  spec.L = 2;
  spec.sliding = {1, 1};
  spec.qpas = 0;
  spec.softcap = 0;
  spec.rope_scaling = json();
  const TensorMap m = f16_exact(random_weights(spec, 91));
  const std::string path = write_gguf(spec, m, "gemma3");
  const auto tok = random_tokens(20, spec.V, 92);
  auto model = cm::Model::load(path, opts("f32", "f32"));
  EXPECT_EQ(model->config().norm_weight_offset, 0.0f);
  // The stored norms are 1 + w rounded to float32: compare with a relative tolerance that allows for it.
  EXPECT_TRUE(close_rel(run(*model, tok), reference_logits(spec, m, tok), 1e-4));
}

TEST(ModelGguf, Gemma2SoftcapsAndLayerPattern) {
  Spec spec;
  for (const auto& [name, sp] : arch_specs())
    if (name == "gemma2") spec = sp;
  // llama.cpp's Gemma 2: even layers sliding (pattern 2), q scale head_dim^-1/2, norms stored as 1 + w, both softcaps
  // read from the metadata.
  spec.qpas = 0;
  const TensorMap m = f16_exact(random_weights(spec, 95));
  const std::string path = write_gguf(spec, m, "gemma2");
  const auto tok = random_tokens(20, spec.V, 96);
  auto model = cm::Model::load(path, opts("f32", "f32"));
  EXPECT_EQ(model->config().arch, cm::Architecture::kGemma2);
  EXPECT_EQ(model->config().layer_sliding, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(model->config().attn_logit_softcap, 1.5f);
  EXPECT_EQ(model->config().final_logit_softcap, 6.0f);
  EXPECT_TRUE(close_rel(run(*model, tok), reference_logits(spec, m, tok), 1e-4));
  // Without the metadata keys: llama.cpp's defaults, 50 and 30.
  spec.attn_softcap = spec.softcap = 0;
  auto defaults = cm::Model::load(write_gguf(spec, m, "gemma2"), opts("f32", "f32"));
  EXPECT_EQ(defaults->config().attn_logit_softcap, 50.0f);
  EXPECT_EQ(defaults->config().final_logit_softcap, 30.0f);
}

TEST(ModelGguf, RejectsUnsupportedArchitectureAndMissingTensor) {
  Spec spec;
  const TensorMap m = f16_exact(random_weights(spec, 93));
  const std::string p1 = write_gguf(spec, m, "phi2");
  try {
    cm::Model::load(p1, opts());
    ADD_FAILURE();
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("phi2"), std::string::npos) << e.what();
  }
  TensorMap less = m;
  less.erase("model.layers.1.mlp.up_proj.weight");
  try {
    cm::Model::load(write_gguf(spec, less, "llama"), opts());
    ADD_FAILURE();
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
    EXPECT_NE(std::string(e.what()).find("blk.1.ffn_up.weight"), std::string::npos) << e.what();
  }
}

// ---- convert ------------------------------------------------------------------------------------------------------

bool same_bytes(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

TEST(ModelConvert, RoundTripLoadsBitwiseIdenticalWeightsWithoutRequantizing) {
  uint64_t salt = 200;
  for (const auto& [name, spec] : arch_specs()) {
    const TensorMap m = random_weights(spec, ++salt);
    const std::string dir = write_model(spec, m, "conv_" + name);
    const auto tok = random_tokens(13, spec.V, ++salt);
    for (const char* fmt : {"f32", "bf16", "w8a8", "w8a8-g64", "w4a8", "q4_k"}) {
      SCOPED_TRACE(name + " " + fmt);
      const std::string out = temp_root().string() + "/converted_" + name + "_" + fmt;
      std::vector<int64_t> seen;
      cm::convert_model(dir, out, cm::parse_weight_format(fmt), [&](const char*, int64_t d, int64_t) { seen.push_back(d); });
      EXPECT_FALSE(seen.empty());
      auto a = cm::Model::load(dir, opts(fmt, "f32"));
      auto b = cm::Model::load(out, opts(fmt, "f32"));
      EXPECT_EQ(b->impl().source, "cider");
      const cm::Weights& A = a->impl().w;
      const cm::Weights& B = b->impl().w;
      ASSERT_EQ(A.layers.size(), B.layers.size());
      auto same_linear = [&](const cm::Linear& x, const cm::Linear& y) {
        EXPECT_EQ(x.kind, y.kind) << x.name;
        EXPECT_EQ(x.group_size, y.group_size) << x.name;
        EXPECT_EQ(x.ggml_type, y.ggml_type) << x.name;
        const size_t wb = x.kind == cm::Linear::Kind::kDense ? static_cast<size_t>(x.N * x.K * cider::dtype_size(x.w_dtype))
                          : x.kind == cm::Linear::Kind::kInt8 ? static_cast<size_t>(x.N * x.K)
                          : x.kind == cm::Linear::Kind::kGgml
                              ? static_cast<size_t>(x.N * cider::quant::ggml_row_bytes(*cider::quant::ggml_block_format(x.ggml_type), x.K))
                              : static_cast<size_t>(x.N * x.K / 2);
        EXPECT_TRUE(same_bytes(x.w, y.w, wb)) << x.name;
        if (x.scales) {
          const size_t ns = static_cast<size_t>(x.group_size == 0 ? x.N : x.K / x.group_size * x.N);
          EXPECT_TRUE(same_bytes(x.scales, y.scales, ns * 4)) << x.name;
        }
        EXPECT_EQ(x.bias == nullptr, y.bias == nullptr);
        if (x.bias) {
          EXPECT_TRUE(same_bytes(x.bias, y.bias, static_cast<size_t>(x.N) * 4)) << x.name;
        }
      };
      for (size_t l = 0; l < A.layers.size(); ++l)
        for (auto mem : {&cm::LayerWeights::q, &cm::LayerWeights::k, &cm::LayerWeights::v, &cm::LayerWeights::o,
                         &cm::LayerWeights::gate, &cm::LayerWeights::up, &cm::LayerWeights::down})
          same_linear(A.layers[l].*mem, B.layers[l].*mem);
      same_linear(A.lm_head, B.lm_head);
      EXPECT_EQ(A.embed_dtype, B.embed_dtype);
      EXPECT_TRUE(same_bytes(A.embed, B.embed, static_cast<size_t>(spec.V * spec.H * cider::dtype_size(A.embed_dtype))));
      EXPECT_EQ(a->weight_bytes(), b->weight_bytes());
      EXPECT_EQ(cm::config_to_json(a->config()), cm::config_to_json(b->config()));
      const auto la = run(*a, tok), lb = run(*b, tok);
      EXPECT_TRUE(cider::test::all_close(lb.data(), la.data(), la.size(), 0.0)) << "logits must be identical";
      // A converted model loads only in its own format (nothing is requantized behind the user's back).
      const char* other = std::string(fmt) == "w4a8" ? "w8a8" : "w4a8";
      try {
        cm::Model::load(out, opts(other, "f32"));
        ADD_FAILURE() << "loaded a " << fmt << " model as " << other;
      } catch (const cider::Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(fmt), std::string::npos) << e.what();
      }
    }
  }
}

TEST(ModelConvert, FailureLeavesNothingAndExistingOutputIsRefused) {
  Spec spec;
  TensorMap m = random_weights(spec, 301);
  const std::string good = write_model(spec, m, "conv_src");
  const std::string out = temp_root().string() + "/conv_out_exists";
  fs::create_directories(out);
  try {
    cm::convert_model(good, out, cm::WeightFormat::kW8A8);
    ADD_FAILURE();
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  m.erase("model.layers.0.mlp.up_proj.weight");
  const std::string bad = write_model(spec, m, "conv_bad");
  const std::string out2 = temp_root().string() + "/conv_out_new";
  EXPECT_THROW(cm::convert_model(bad, out2, cm::WeightFormat::kW8A8), cider::Error);
  EXPECT_FALSE(fs::exists(out2));
  for (const auto& e : fs::directory_iterator(temp_root()))
    EXPECT_EQ(e.path().filename().string().find("conv_out_new"), std::string::npos) << e.path();
}

// ---- convert --weights native -----------------------------------------------------------------------------------

void expect_load_error(const std::string& path, const cm::ModelOptions& o, ErrorCode code,
                       std::vector<std::string> words);

// Logits of `tok` fed one token at a time (the decode kernels), after a prefill of the first `prefill` tokens.
std::vector<float> run_steps(const cm::Model& model, const std::vector<int32_t>& tok, size_t prefill) {
  const auto V = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> out(tok.size() * V);
  auto s = model.new_session();
  model.forward(*s, tok.data(), static_cast<int64_t>(prefill), out.data(), true);
  for (size_t i = prefill; i < tok.size(); ++i) model.forward(*s, &tok[i], 1, out.data() + i * V, true);
  return out;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A GGUF file converted with --weights native and loaded back (weights native) holds the same weights as the file
// loaded natively — every linear layer's kind, block type and bytes, the embedding's, the tied head's, the counts per
// format — and computes bit for bit the same logits, prefill and decode. Returns the converted directory.
std::string expect_native_round_trip(const std::string& gguf, const std::string& name, int64_t V) {
  const std::string out = temp_root().string() + "/" + name;
  cm::convert_model(gguf, out, cm::WeightFormat::kNative);
  auto a = cm::Model::load(gguf, opts("native", "f32"));
  auto b = cm::Model::load(out, opts("native", "f32"));
  EXPECT_EQ(b->impl().source, "cider");
  const cm::Weights& A = a->impl().w;
  const cm::Weights& B = b->impl().w;
  const int64_t H = a->config().hidden_size;
  auto same_linear = [&](const cm::Linear& x, const cm::Linear& y) {
    EXPECT_EQ(x.kind, y.kind) << x.name;
    EXPECT_EQ(x.ggml_type, y.ggml_type) << x.name;
    EXPECT_EQ(x.w_dtype, y.w_dtype) << x.name;
    EXPECT_TRUE(x.kind == cm::Linear::Kind::kGgml || x.kind == cm::Linear::Kind::kDense) << x.name;
    ASSERT_EQ(x.nbytes(), y.nbytes()) << x.name;
    const size_t wb = x.nbytes() - (x.bias ? static_cast<size_t>(x.N) * 4 : 0);  // no scales in these kinds
    EXPECT_TRUE(same_bytes(x.w, y.w, wb)) << x.name;
  };
  EXPECT_EQ(A.layers.size(), B.layers.size());
  for (size_t l = 0; l < std::min(A.layers.size(), B.layers.size()); ++l)
    for (auto mem : {&cm::LayerWeights::q, &cm::LayerWeights::k, &cm::LayerWeights::v, &cm::LayerWeights::o,
                     &cm::LayerWeights::gate, &cm::LayerWeights::up, &cm::LayerWeights::down})
      same_linear(A.layers[l].*mem, B.layers[l].*mem);
  same_linear(A.lm_head, B.lm_head);
  EXPECT_EQ(A.head_is_embedding, B.head_is_embedding);
  if (B.head_is_embedding) {  // the tied head reads the embedding: not stored twice
    EXPECT_EQ(B.lm_head.w, B.embed);
  }
  EXPECT_EQ(A.embed_ggml_type, B.embed_ggml_type);
  EXPECT_EQ(A.embed_dtype, B.embed_dtype);
  const size_t eb = A.embed_ggml_type != 0
                        ? static_cast<size_t>(V * cider::quant::ggml_row_bytes(
                                                      *cider::quant::ggml_block_format(A.embed_ggml_type), H))
                        : static_cast<size_t>(V * H * cider::dtype_size(A.embed_dtype));
  EXPECT_TRUE(same_bytes(A.embed, B.embed, eb));
  EXPECT_EQ(A.format_counts, B.format_counts);
  EXPECT_EQ(a->weight_bytes(), b->weight_bytes());
  EXPECT_EQ(cm::config_to_json(a->config()), cm::config_to_json(b->config()));
  const auto tok = random_tokens(28, V, 1101);
  EXPECT_TRUE(same_floats(run(*a, tok), run(*b, tok))) << "prefill logits must be bit for bit equal";
  EXPECT_TRUE(same_floats(run_steps(*a, tok, 20), run_steps(*b, tok, 20))) << "decode logits must be bit for bit equal";
  // The metadata names every block tensor's type; the directory defaults to native and loads only as native.
  const auto st = cm::SafetensorsFile::open(out + "/model.safetensors");
  EXPECT_EQ(st->metadata().at("weights"), "native");
  const json types = json::parse(st->metadata().at("ggml_types"));
  size_t blocks = 0, heads = 0;
  for (const cm::StTensor& t : st->tensors()) {
    const bool gb = t.name.size() > 8 && t.name.compare(t.name.size() - 8, 8, ".gblocks") == 0;
    blocks += gb;
    if (gb) {
      EXPECT_TRUE(types.contains(t.name)) << t.name;
    }
    heads += t.name.rfind("lm_head.", 0) == 0;
  }
  EXPECT_EQ(types.size(), blocks);
  EXPECT_EQ(heads, A.head_is_embedding ? 0u : 1u);
  EXPECT_EQ(cm::default_weights(out, cm::Device::kCPU), cm::WeightFormat::kNative);
  expect_load_error(out, opts("bf16", "f32"), ErrorCode::kInvalidArgument, {"converted to native"});
  return out;
}

TEST(ModelConvert, NativeWritesTheBlocksUnchangedAndLoadsThemBitForBit) {
  {  // Q8_0 linear layers (llama: q/k rows un-permuted at load), an F16 v_proj and embedding kept as bf16
    SCOPED_TRACE("q8_0");
    Spec spec;
    const TensorMap m = f16_exact(random_weights(spec, 1101));
    const std::string dir = expect_native_round_trip(write_gguf(spec, m, "llama", /*q8=*/true), "native_q8", spec.V);
    const auto st = cm::SafetensorsFile::open(dir + "/model.safetensors");
    const json types = json::parse(st->metadata().at("ggml_types"));
    EXPECT_EQ(types.size(), static_cast<size_t>(7 * spec.L + 1));
    EXPECT_EQ(types.at("model.layers.0.self_attn.q_proj.gblocks").get<std::string>(), "Q8_0");
    EXPECT_EQ(types.at("lm_head.gblocks").get<std::string>(), "Q8_0");
    ASSERT_NE(st->find("model.embed_tokens.weight"), nullptr);  // F16 in the GGUF: bf16, as native loads it
    EXPECT_EQ(st->find("model.embed_tokens.weight")->dtype, DType::kBF16);
  }
  {  // no block types with kernels (F32 and F16 tensors): every layer bf16 ".weight", ggml_types empty
    SCOPED_TRACE("f32");
    Spec spec;
    const TensorMap m = f16_exact(random_weights(spec, 1104));
    const std::string dir = expect_native_round_trip(write_gguf(spec, m, "llama"), "native_f32", spec.V);
    EXPECT_EQ(cm::SafetensorsFile::open(dir + "/model.safetensors")->metadata().at("ggml_types"), "{}");
  }
  {  // tied, the embedding in Q8_0 blocks: the head reads them, from the GGUF file and from the cider directory
    SCOPED_TRACE("q8_0 tied");
    Spec spec;
    spec.tie = true;
    const TensorMap m = f16_exact(random_weights(spec, 1102));
    const std::string gguf = write_gguf(spec, m, "llama", /*q8=*/true, /*q8_embed=*/true);
    expect_native_round_trip(gguf, "native_q8_tied", spec.V);
    auto b = cm::Model::load(temp_root().string() + "/native_q8_tied", opts("native", "f32"));
    EXPECT_EQ(b->impl().w.embed_ggml_type, 8u);
    EXPECT_EQ(b->impl().w.lm_head.kind, cm::Linear::Kind::kGgml);
  }
  {  // the committed K-quant fixture: Q4_K and Q6_K blocks, the embedding in its blocks, an untied head
    SCOPED_TRACE("gguf_d128");
    expect_native_round_trip(cider::test::repo_file("tests/data/gguf_d128/model.gguf"), "native_d128", 2048);
    auto b = cm::Model::load(temp_root().string() + "/native_d128", opts("native", "f32"));
    EXPECT_EQ(b->impl().w.format_counts.at("Q4_K"), 12);
    EXPECT_EQ(b->impl().w.format_counts.at("Q6_K"), 3);
    EXPECT_EQ(b->impl().w.embed_ggml_type, 12u);
  }
}

// The contents of a safetensors file, to edit and write again (the corrupt native directories below).
struct StContents {
  struct T {
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::map<std::string, T> tensors;
  std::map<std::string, std::string> metadata;
};
// A fresh directory holding `dir`'s model.safetensors with `edit` applied.
std::string edited_copy(const std::string& dir, const std::string& name, const std::function<void(StContents&)>& edit) {
  StContents c;
  {
    const auto f = cm::SafetensorsFile::open(dir + "/model.safetensors");
    for (const cm::StTensor& t : f->tensors())
      c.tensors[t.name] = {t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)};
    c.metadata = f->metadata();
  }
  edit(c);
  cm::SafetensorsWriter w;
  for (const auto& [n, t] : c.tensors) w.add(n, t.dtype, t.shape, t.bytes.data());
  for (const auto& [k, v] : c.metadata) w.set_metadata(k, v);
  const std::string out = fresh_dir(name);
  w.write(out + "/model.safetensors");
  return out;
}

TEST(ModelConvert, NativeBlocksWithAWrongTypeOrSizeAreCorrupt) {
  Spec spec;
  const TensorMap m = f16_exact(random_weights(spec, 1103));
  const std::string dir = temp_root().string() + "/native_corrupt_src";
  cm::convert_model(write_gguf(spec, m, "llama", /*q8=*/true), dir, cm::WeightFormat::kNative);
  const std::string q = "model.layers.0.self_attn.q_proj.gblocks";  // Q8_0, (64, 68): K = 64 is two blocks a row
  auto with_types = [&](const std::function<void(json&)>& f) {
    return [f](StContents& c) {
      json t = json::parse(c.metadata.at("ggml_types"));
      f(t);
      c.metadata["ggml_types"] = t.dump();
    };
  };
  const cm::ModelOptions o = opts("native", "f32");
  ASSERT_NO_THROW(cm::Model::load(edited_copy(dir, "nc_same", [](StContents&) {}), o));  // the copy itself loads
  expect_load_error(edited_copy(dir, "nc_missing", with_types([&](json& t) { t.erase(q); })), o, ErrorCode::kCorrupt,
                    {"nc_missing", q, "ggml_types", "no entry"});
  expect_load_error(edited_copy(dir, "nc_unknown", with_types([&](json& t) { t[q] = "Q9_9"; })), o,
                    ErrorCode::kCorrupt, {q, "\"Q9_9\""});
  expect_load_error(edited_copy(dir, "nc_nokernel", with_types([&](json& t) { t[q] = "Q3_K"; })), o,
                    ErrorCode::kCorrupt, {q, "\"Q3_K\""});
  // A type whose rows have another size (Q4_0: 2 × 18 bytes a row), and the tensor's bytes cut by a row.
  expect_load_error(edited_copy(dir, "nc_size", with_types([&](json& t) { t[q] = "Q4_0"; })), o, ErrorCode::kCorrupt,
                    {q, "must be U8 of shape (64, 36)", "got U8 of shape (64, 68), 4352 bytes"});
  expect_load_error(edited_copy(dir, "nc_short",
                                [&](StContents& c) {
                                  StContents::T& t = c.tensors.at(q);
                                  t.shape = {63, 68};
                                  t.bytes.resize(63 * 68);
                                }),
                    o, ErrorCode::kCorrupt, {q, "must be U8 of shape (64, 68)", "got U8 of shape (63, 68), 4284 bytes"});
  expect_load_error(edited_copy(dir, "nc_dtype", [&](StContents& c) { c.tensors.at(q).dtype = DType::kI8; }), o,
                    ErrorCode::kCorrupt, {q, "got I8"});
  // A non-finite block scale (Q8_0's d: the block's first two bytes), as for a GGUF file's blocks.
  expect_load_error(edited_copy(dir, "nc_nan",
                                [&](StContents& c) {
                                  std::string& b = c.tensors.at(q).bytes;
                                  b[68 * 3 + 34] = '\xff';
                                  b[68 * 3 + 35] = '\x7f';
                                }),
                    o, ErrorCode::kCorrupt, {q, "must hold finite values", "at row 3 column 32"});
  // ggml_types itself: an object of strings naming tensors of the file.
  expect_load_error(edited_copy(dir, "nc_notobj", [](StContents& c) { c.metadata["ggml_types"] = "[1, 2]"; }), o,
                    ErrorCode::kCorrupt, {"ggml_types must be a JSON object"});
  expect_load_error(edited_copy(dir, "nc_number", with_types([&](json& t) { t[q] = 8; })), o, ErrorCode::kCorrupt,
                    {q, "must be a block type name", "got 8"});
  expect_load_error(edited_copy(dir, "nc_extra", with_types([](json& t) { t["model.layers.9.mlp.up_proj.gblocks"] = "Q8_0"; })),
                    o, ErrorCode::kCorrupt, {"model.layers.9.mlp.up_proj.gblocks", "does not hold"});
  // A cider directory converted to another format loads only as that, and defaults to bf16.
  const std::string bf16 = edited_copy(dir, "nc_bf16", [](StContents& c) { c.metadata["weights"] = "bf16"; });
  expect_load_error(bf16, o, ErrorCode::kInvalidArgument, {"converted to bf16"});
  EXPECT_EQ(cm::default_weights(bf16, cm::Device::kCPU), cm::WeightFormat::kBF16);
}

// ---- sessions -----------------------------------------------------------------------------------------------------

TEST(ModelSession, TrimAndContextLimit) {
  Spec spec = arch_specs()[0].second;
  spec.max_pos = 64;
  const TensorMap m = random_weights(spec, 401);
  const std::string dir = write_model(spec, m, "sess");
  cm::ModelOptions o = opts("f32", "f32");
  o.ctx = 24;
  auto model = cm::Model::load(dir, o);
  EXPECT_EQ(model->context_length(), 24);
  const auto tok = random_tokens(24, spec.V, 402);
  const auto full = run(*model, tok);
  const auto V = static_cast<size_t>(spec.V);

  // Trim (speculative rollback) then continue with other tokens, then the original ones again.
  auto s = model->new_session();
  std::vector<float> out(tok.size() * V);
  model->forward(*s, tok.data(), 20, out.data(), true);
  EXPECT_EQ(s->trim(5), 5);
  EXPECT_EQ(s->position(), 15);
  std::vector<int32_t> other = {3, 4, 5};
  std::vector<float> tmp(3 * V);
  model->forward(*s, other.data(), 3, tmp.data(), true);
  EXPECT_EQ(s->trim(3), 3);
  model->forward(*s, tok.data() + 15, 9, out.data() + 15 * V, true);
  EXPECT_TRUE(cider::test::all_close(out.data(), full.data(), full.size(), 1e-5, 1e-5));
  EXPECT_EQ(s->trim(100), 24);
  EXPECT_EQ(s->position(), 0);

  // Past the context: kOutOfRange, and the session is untouched.
  auto s2 = model->new_session();
  model->forward(*s2, tok.data(), 20, out.data(), true);
  const size_t kv = s2->kv_bytes();
  try {
    model->forward(*s2, tok.data(), 5, tmp.data(), true);
    ADD_FAILURE() << "no error";
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("context length 24"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s2->position(), 20);
  EXPECT_EQ(s2->kv_bytes(), kv);
  model->forward(*s2, tok.data() + 20, 4, out.data() + 20 * V, true);
  EXPECT_TRUE(cider::test::all_close(out.data() + 20 * V, full.data() + 20 * V, 4 * V, 1e-5, 1e-5));

  // Bad calls.
  const int32_t bad_tok[1] = {static_cast<int32_t>(spec.V)};
  EXPECT_THROW(model->forward(*model->new_session(), bad_tok, 1, tmp.data(), false), cider::Error);
  EXPECT_THROW(model->forward(*model->new_session(), tok.data(), 0, tmp.data(), false), cider::Error);
  EXPECT_THROW(model->forward(*model->new_session(), tok.data(), 1, nullptr, false), cider::Error);
  auto other_model = cm::Model::load(dir, o);
  auto foreign = other_model->new_session();
  EXPECT_THROW(model->forward(*foreign, tok.data(), 1, tmp.data(), false), cider::Error);
  EXPECT_THROW(s->trim(-1), cider::Error);
}

// ---- loading details and rejections -------------------------------------------------------------------------------

void expect_load_error(const std::string& path, const cm::ModelOptions& o, ErrorCode code,
                       std::vector<std::string> words) {
  try {
    cm::Model::load(path, o);
    ADD_FAILURE() << "no error for " << path;
  } catch (const cider::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

TEST(ModelLoad, WeightBytesProgressAndTiedHead) {
  Spec spec = arch_specs()[2].second;  // Qwen2, tied
  const TensorMap m = random_weights(spec, 501);
  const std::string dir = write_model(spec, m, "bytes");
  std::vector<std::pair<int64_t, int64_t>> prog;
  auto f32 = cm::Model::load(dir, opts("f32"), [&](const char*, int64_t d, int64_t t) { prog.emplace_back(d, t); });
  ASSERT_FALSE(prog.empty());
  for (size_t i = 0; i < prog.size(); ++i) EXPECT_EQ(prog[i].first, static_cast<int64_t>(i + 1));
  EXPECT_EQ(prog.back().first, prog.back().second);
  // Tied + dense: the head is the embedding itself.
  EXPECT_TRUE(f32->impl().w.head_is_embedding);
  EXPECT_EQ(f32->impl().w.lm_head.w, f32->impl().w.embed);
  auto bf = cm::Model::load(dir, opts("bf16"));
  auto w8 = cm::Model::load(dir, opts("w8a8"));
  auto w4 = cm::Model::load(dir, opts("w4a8"));
  // Tied + int: a quantized copy of the embedding.
  EXPECT_EQ(w8->impl().w.lm_head.kind, cm::Linear::Kind::kInt8);
  EXPECT_GT(f32->weight_bytes(), bf->weight_bytes());
  EXPECT_GT(f32->weight_bytes(), w8->weight_bytes());
  EXPECT_GT(w8->weight_bytes(), w4->weight_bytes());
  EXPECT_THROW(f32->tokenizer(), cider::Error);  // no tokenizer.json in these directories
}

TEST(ModelLoad, ShardedDirectoryWithIndex) {
  Spec spec;
  const TensorMap m = random_weights(spec, 511);
  const std::string dir = fresh_dir("sharded");
  json index;
  cm::SafetensorsWriter a, b;
  std::vector<std::vector<uint8_t>> keep;
  int i = 0;
  for (const auto& [name, t] : m) {
    keep.push_back(cider::test::to_dtype_bytes(t.second, spec.dtype));
    const bool first = i++ % 2 == 0;
    (first ? a : b).add(name, spec.dtype, t.first, keep.back().data());
    index["weight_map"][name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  a.write(dir + "/model-00001-of-00002.safetensors");
  b.write(dir + "/model-00002-of-00002.safetensors");
  write_text(dir + "/model.safetensors.index.json", index.dump());
  write_text(dir + "/config.json", hf_config(spec).dump());
  write_text(dir + "/generation_config.json", R"({"eos_token_id": [2, 7], "bos_token_id": 1})");
  auto model = cm::Model::load(dir, opts());
  EXPECT_EQ(model->config().eos_token_ids, (std::vector<int32_t>{2, 7}));
  const auto tok = random_tokens(9, spec.V, 512);
  EXPECT_TRUE(close_rel(run(*model, tok), reference_logits(spec, m, tok), 1e-4));
}

TEST(ModelLoad, Rejections) {
  Spec spec;
  const TensorMap m = random_weights(spec, 601);
  const cm::ModelOptions o = opts();

  // Unknown architecture.
  {
    const std::string dir = write_model(spec, m, "rej_arch");
    json c = hf_config(spec);
    c["architectures"] = {"FalconForCausalLM"};
    write_text(dir + "/config.json", c.dump());
    expect_load_error(dir, o, ErrorCode::kUnsupported, {"FalconForCausalLM"});
  }
  // Missing tensor.
  {
    TensorMap less = m;
    less.erase("model.layers.1.self_attn.k_proj.weight");
    expect_load_error(write_model(spec, less, "rej_missing"), o, ErrorCode::kCorrupt,
                      {"model.layers.1.self_attn.k_proj.weight", "missing"});
  }
  // Wrong shape.
  {
    TensorMap bad = m;
    bad["model.layers.0.mlp.up_proj.weight"].first = {spec.I / 2, spec.H * 2};
    expect_load_error(write_model(spec, bad, "rej_shape"), o, ErrorCode::kShapeMismatch,
                      {"model.layers.0.mlp.up_proj.weight", "(128, 64)", "(64, 128)"});
  }
  // Wrong dtype (an integer tensor where a float weight belongs).
  {
    const std::string dir = fresh_dir("rej_dtype");
    cm::SafetensorsWriter w;
    std::vector<std::vector<uint8_t>> keep;
    for (const auto& [name, t] : m) {
      if (name == "model.norm.weight") {
        keep.emplace_back(t.second.size() * 4, 0);
        w.add(name, DType::kI32, t.first, keep.back().data());
      } else {
        keep.push_back(cider::test::to_dtype_bytes(t.second, spec.dtype));
        w.add(name, spec.dtype, t.first, keep.back().data());
      }
    }
    w.write(dir + "/model.safetensors");
    write_text(dir + "/config.json", hf_config(spec).dump());
    expect_load_error(dir, o, ErrorCode::kCorrupt, {"model.norm.weight", "F32, F16 or BF16", "I32"});
  }
  // A tensor the config does not declare (a bias with attention_bias false).
  {
    TensorMap more = m;
    more["model.layers.0.self_attn.q_proj.bias"] = {{spec.Hq * spec.D}, std::vector<float>(static_cast<size_t>(spec.Hq * spec.D), 0.5f)};
    expect_load_error(write_model(spec, more, "rej_extra"), o, ErrorCode::kCorrupt,
                      {"unexpected tensor", "model.layers.0.self_attn.q_proj.bias"});
  }
  // Corrupt / missing config.json, missing path, a plain file that is not GGUF.
  {
    const std::string dir = write_model(spec, m, "rej_cfg");
    write_text(dir + "/config.json", "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": ");
    expect_load_error(dir, o, ErrorCode::kCorrupt, {"config.json", "valid JSON"});
    write_text(dir + "/config.json", hf_config(spec).dump().replace(0, 1, "["));
    expect_load_error(dir, o, ErrorCode::kCorrupt, {"config.json"});
    fs::remove(dir + "/config.json");
    expect_load_error(dir, o, ErrorCode::kIo, {"config.json"});
    expect_load_error(dir + "/nope", o, ErrorCode::kIo, {"does not exist"});
    expect_load_error(dir + "/model.safetensors", o, ErrorCode::kUnsupported, {"GGUF"});
  }
  // Options that do not fit the model.
  {
    const std::string dir = write_model(spec, m, "rej_opts");
    cm::ModelOptions big = o;
    big.ctx = spec.max_pos + 1;
    expect_load_error(dir, big, ErrorCode::kOutOfRange, {"ctx", "513"});
    cm::ModelOptions neg = o;
    neg.ctx = -1;
    expect_load_error(dir, neg, ErrorCode::kInvalidArgument, {"ctx"});
    expect_load_error(dir, opts("f32", "k4v3"), ErrorCode::kShapeMismatch, {"head dim", "group_size 64", "16"});
    cm::ModelOptions badkv = opts("f32", "k4v3");
    badkv.kv.group_size = 48;
    expect_load_error(dir, badkv, ErrorCode::kInvalidArgument, {"group_size", "48"});
  }
  // w4a8 needs K to be a multiple of its group (64).
  {
    Spec odd = spec;
    odd.H = 96;
    odd.I = 160;
    const TensorMap mo = random_weights(odd, 602);
    expect_load_error(write_model(odd, mo, "rej_group"), opts("w4a8"), ErrorCode::kUnsupported, {"group size 64", "96"});
  }
}

TEST(ModelOptions, ParsingAndNames) {
  EXPECT_EQ(cm::parse_weight_format("w8a8-g128"), cm::WeightFormat::kW8A8G128);
  for (const char* f : {"f32", "bf16", "w8a8", "w8a8-g64", "w8a8-g128", "w8a8-g256", "w4a8"})
    EXPECT_STREQ(cm::weight_format_name(cm::parse_weight_format(f)), f);
  for (const char* bad : {"", "w8a8-g32", "int8", "BF16", "w4a8-g64"}) {
    try {
      cm::parse_weight_format(bad);
      ADD_FAILURE() << bad;
    } catch (const cider::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("\"") + bad + "\""), std::string::npos) << e.what();
    }
  }
  const cm::KVOptions kv = cm::parse_kv_format("k3v2");
  EXPECT_TRUE(kv.quantized);
  EXPECT_EQ(kv.k_bits, 3);
  EXPECT_EQ(kv.v_bits, 2);
  EXPECT_EQ(cm::kv_format_name(cm::parse_kv_format("k4v3")), "k4v3/hadamard/g64");  // the default rotation
  EXPECT_EQ(cm::kv_format_name(cm::KVOptions{}), "k8v4/hadamard/g64");              // the default cache
  EXPECT_EQ(cm::kv_format_name(cm::parse_kv_format("f16")), "f16");
  EXPECT_FALSE(cm::parse_kv_format("bf16").quantized);
  for (const char* bad : {"k7v3", "k4v1", "k4v33", "q4v3", "fp16", "", "k4"})
    EXPECT_THROW(cm::parse_kv_format(bad), cider::Error) << bad;
  EXPECT_EQ(cm::parse_kv_rotation("so4-fast"), cider::nn::RotationKind::kSO4Fast);
  EXPECT_EQ(cm::parse_kv_rotation("none"), cider::nn::RotationKind::kNone);
  EXPECT_THROW(cm::parse_kv_rotation("so4"), cider::Error);
}

TEST(ModelNpy, WritesNumpyFilesAtomically) {
  const std::string dir = fresh_dir("npy");
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 1e-7f, -1e30f};
  cm::write_npy_f32(dir + "/a.npy", v.data(), {2, 3});
  const cm::NpyArray a = cm::read_npy_f32(dir + "/a.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data, v);
  EXPECT_FALSE(fs::exists(dir + "/a.npy.tmp"));
  // Header: magic, version 1.0, data 64-byte aligned, the dict NumPy writes.
  std::ifstream in(dir + "/a.npy", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.substr(1, 5), "NUMPY");
  EXPECT_EQ((bytes.size() - v.size() * 4) % 64, 0u);
  EXPECT_NE(bytes.find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"), std::string::npos);
  cm::write_npy_f32(dir + "/b.npy", v.data(), {6});
  EXPECT_EQ(cm::read_npy_f32(dir + "/b.npy").shape, (std::vector<int64_t>{6}));
  EXPECT_THROW(cm::write_npy_f32(dir + "/missing/c.npy", v.data(), {6}), cider::Error);
  EXPECT_THROW(cm::write_npy_f32(dir + "/d.npy", v.data(), {-1}), cider::Error);
  write_text(dir + "/bad.npy", "not numpy");
  EXPECT_THROW(cm::read_npy_f32(dir + "/bad.npy"), cider::Error);
}

}  // namespace

// ---- hostile files (issue 19) --------------------------------------------------------------------------------------

namespace {

// GgufWriter plus the string/int arrays a tokenizer needs.
void gguf_array(GgufWriter& g, const std::string& key, uint32_t type, const std::vector<std::string>& strings,
                const std::vector<int32_t>& ints) {
  GgufWriter::str(g.kv, key);
  GgufWriter::u32(g.kv, 9);
  GgufWriter::u32(g.kv, type);
  if (type == 8) {
    GgufWriter::u64(g.kv, strings.size());
    for (const auto& s : strings) GgufWriter::str(g.kv, s);
  } else {
    GgufWriter::u64(g.kv, ints.size());
    for (int32_t v : ints) GgufWriter::u32(g.kv, static_cast<uint32_t>(v));
  }
  ++g.n_kv;
}

// The geometry keys of a small llama GGUF without tensors (enough for config_from_gguf).
GgufWriter gguf_geometry(uint32_t blocks) {
  GgufWriter g;
  g.set_str("general.architecture", "llama");
  g.set_u32("llama.context_length", 512);
  g.set_u32("llama.embedding_length", 64);
  g.set_u32("llama.block_count", blocks);
  g.set_u32("llama.feed_forward_length", 128);
  g.set_u32("llama.attention.head_count", 4);
  g.set_u32("llama.vocab_size", 97);
  return g;
}

}  // namespace

TEST(ModelHostile, NonFiniteWeightsAreRejectedAtLoadForEveryWeightFormat) {
  Spec spec;
  for (const float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    for (const char* tensor : {"model.layers.1.mlp.up_proj.weight", "model.embed_tokens.weight", "model.norm.weight"}) {
      TensorMap m = random_weights(spec, 1901);
      m.at(tensor).second[5] = bad;
      const std::string dir = write_model(spec, m, "nan");
      for (const char* w : {"f32", "bf16", "w8a8", "w4a8"})
        expect_load_error(dir, opts(w), ErrorCode::kCorrupt, {tensor, "must hold finite values", "at flat index 5"});
    }
    // GGUF (F32 tensors) alike.
    TensorMap m = f16_exact(random_weights(spec, 1902));
    m.at("model.layers.0.self_attn.o_proj.weight").second[7] = bad;
    expect_load_error(write_gguf(spec, m, "llama"), opts("bf16"), ErrorCode::kCorrupt,
                      {"blk.0.attn_output.weight", "must hold finite values"});
  }
}

TEST(ModelHostile, GgufSizesAreCheckedBeforeAllocation) {
  // block_count 2^32 - 1: was 4 GB of per-layer table before the rejection.
  const std::string dir = fresh_dir("gguf_hostile");
  GgufWriter g = gguf_geometry(0xffffffffu);
  g.write(dir + "/blocks.gguf");
  const auto t0 = std::chrono::steady_clock::now();
  expect_load_error(dir + "/blocks.gguf", opts(), ErrorCode::kCorrupt,
                    {"llama.block_count must be in [1, 1024]; got 4294967295"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  // rope.scaling.factor -1 and inf.
  for (const float factor : {-1.0f, INFINITY}) {
    GgufWriter r = gguf_geometry(2);
    r.set_str("llama.rope.scaling.type", "linear");
    r.set_f32("llama.rope.scaling.factor", factor);
    r.write(dir + "/rope.gguf");
    expect_load_error(dir + "/rope.gguf", opts(), ErrorCode::kCorrupt,
                      {"llama.rope.scaling.factor must be positive and finite"});
  }
}

TEST(ModelHostile, GgufTokenizerMustNameEveryRowOfTheVocabulary) {
  Spec spec;  // V = 97
  const TensorMap m = f16_exact(random_weights(spec, 1903));
  // A GGUF whose tokenizer has 50 tokens for a 97-row vocabulary (llama.cpp requires one token per row).
  GgufWriter g;
  g.set_str("tokenizer.ggml.model", "gpt2");
  std::vector<std::string> tokens;
  for (int i = 0; i < 50; ++i) tokens.push_back(std::string(1, 't').append(std::to_string(i)));
  gguf_array(g, "tokenizer.ggml.tokens", 8, tokens, {});
  gguf_array(g, "tokenizer.ggml.merges", 8, {}, {});
  const std::string tok_path = fresh_dir("gguf_tok") + "/model.gguf";
  GgufWriter full = g;
  full.set_str("general.architecture", "llama");
  full.set_u32("llama.context_length", static_cast<uint32_t>(spec.max_pos));
  full.set_u32("llama.embedding_length", static_cast<uint32_t>(spec.H));
  full.set_u32("llama.block_count", static_cast<uint32_t>(spec.L));
  full.set_u32("llama.feed_forward_length", static_cast<uint32_t>(spec.I));
  full.set_u32("llama.attention.head_count", static_cast<uint32_t>(spec.Hq));
  full.set_u32("llama.attention.head_count_kv", static_cast<uint32_t>(spec.Hkv));
  full.set_u32("llama.vocab_size", static_cast<uint32_t>(spec.V));
  full.add("token_embd.weight", {spec.V, spec.H}, m.at("model.embed_tokens.weight").second, true);
  full.write(tok_path);
  const auto t0 = std::chrono::steady_clock::now();
  expect_load_error(tok_path, opts(), ErrorCode::kCorrupt,
                    {"tokenizer.ggml.tokens must name every token the model can produce (vocab_size 97); got 50"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}
