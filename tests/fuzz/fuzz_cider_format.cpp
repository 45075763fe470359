// Fuzz harness: cider's converted-model directory (model/convert.h) and, through the same machinery, a Hugging Face
// directory: a fuzzed config drives Model::load over a tiny directory written per execution.
//
// Input: 4 bytes of flags, then 0x00-separated parts: <config JSON> 0x00 <weights> 0x00 <version> 0x00 <values>.
//   byte 0 (mode):   bit 0  HF directory (config.json = the config text) instead of cider (metadata "config")
//                    bit 1  run a 2-token forward pass when the load succeeds
//                    bit 2  cider: leave out the "config" metadata key
//                    bit 3  cider: leave out the "weights" metadata key
//                    bit 4  cider: leave out the "version" metadata key
//                    bit 5  plain KV cache in bf16 instead of f32
//                    bit 6  tensor values from <values> (NaN, inf, huge; cycled) instead of small constants
//                    bit 7  dense tensors in bf16 instead of f32
//   byte 1 (target): which tensor a perturbation applies to (index mod the tensor count)
//   byte 2 (kind):   the perturbation: 0 none, 1 drop the tensor, 2 add an unexpected tensor, 3 last dimension + 1,
//                    4 first dimension - 1, 5 dtype I32 (F32's size), 6 rank + 1, 7 rank - 1, 8 dtype F16; else none
//   byte 3 (seed):   the start of the value pattern
// The weights text (default "f32") is the metadata "weights" and, if it parses as a format, the format loaded with;
// the version text (default "1") is the metadata "version".
// The tensors follow the config as parsed by config_from_json (cider) or parse_hf_config (HF), so the loader's
// checks after the config are reached; configs too large for a tiny model (> kMaxElements weights) get no tensors,
// and the load must then fail with a cider::Error.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace {

using cider::DType;
using cider::model::ModelConfig;
using cider::model::WeightFormat;

constexpr double kMaxElements = 1 << 16;  // keeps an execution with a forward pass within a few ms

struct GenTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// The tensors a directory for config `c` holds when loaded as `format` (names as in model/loader.cpp).
std::vector<GenTensor> tensors_for(const ModelConfig& c, WeightFormat format, bool cider_dir, DType dense) {
  std::vector<GenTensor> t;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const bool int_format = format != WeightFormat::kF32 && format != WeightFormat::kBF16;
  const bool int4 = format == WeightFormat::kW4A8;
  int format_group = 0;
  switch (format) {
    case WeightFormat::kW8A8G64: format_group = 64; break;
    case WeightFormat::kW8A8G128: format_group = 128; break;
    case WeightFormat::kW8A8G256: format_group = 256; break;
    case WeightFormat::kW4A8: format_group = 64; break;
    default: break;
  }
  auto linear = [&](const std::string& mod, int64_t N, int64_t K, bool bias) {
    if (cider_dir && int_format) {
      t.push_back({mod + ".qweight", int4 ? DType::kU8 : DType::kI8, {N, int4 ? K / 2 : K}});
      // W4A8 files may keep a finer (or coarser) int4 group than 64 (from MLX sources): the first that divides K.
      int group = format_group;
      if (int4)
        for (int g : {64, 32, 128, 256})
          if (K % g == 0) {
            group = g;
            break;
          }
      if (group > 0 && K % group == 0) {
        t.push_back({mod + ".wscales", DType::kF32, {K / group, N}});
      } else {
        t.push_back({mod + ".wscales", DType::kF32, {N}});
      }
    } else {
      t.push_back({mod + ".weight", dense, {N, K}});
    }
    if (bias) t.push_back({mod + ".bias", cider_dir ? DType::kF32 : dense, {N}});
  };
  const DType norm_dtype = cider_dir ? DType::kF32 : dense;
  auto norm = [&](const std::string& name, int64_t dim) { t.push_back({name, norm_dtype, {dim}}); };

  t.push_back({"model.embed_tokens.weight", dense, {V, H}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm.weight", H);
    linear(p + "self_attn.q_proj", c.num_heads * D, H, c.qkv_bias);
    linear(p + "self_attn.k_proj", c.num_kv_heads * D, H, c.qkv_bias);
    linear(p + "self_attn.v_proj", c.num_kv_heads * D, H, c.qkv_bias);
    linear(p + "self_attn.o_proj", H, c.num_heads * D, c.o_bias);
    if (c.qk_norm) {
      norm(p + "self_attn.q_norm.weight", D);
      norm(p + "self_attn.k_norm.weight", D);
    }
    if (c.sandwich_norms) {
      norm(p + "post_attention_layernorm.weight", H);
      norm(p + "pre_feedforward_layernorm.weight", H);
      norm(p + "post_feedforward_layernorm.weight", H);
    } else {
      norm(p + "post_attention_layernorm.weight", H);
    }
    linear(p + "mlp.gate_proj", I, H, c.mlp_bias);
    linear(p + "mlp.up_proj", I, H, c.mlp_bias);
    linear(p + "mlp.down_proj", H, I, c.mlp_bias);
  }
  norm("model.norm.weight", H);
  // The LM head: absent when tied, except in a cider int-format file (which stores the quantized copy).
  if (!c.tie_word_embeddings || (cider_dir && int_format)) linear("lm_head", V, H, false);
  return t;
}

// Weight elements of config c, in double (no overflow); negative sizes count as too large.
double element_count(const ModelConfig& c) {
  for (int64_t v : {c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads,
                    c.head_dim})
    if (v < 0) return kMaxElements * 2;
  const double H = static_cast<double>(c.hidden_size), D = static_cast<double>(c.head_dim);
  const double per_layer = 2 * H * static_cast<double>(c.num_heads) * D +
                           2 * H * static_cast<double>(c.num_kv_heads) * D +
                           3 * H * static_cast<double>(c.intermediate_size) + 6 * H + 2 * D;
  return 2 * static_cast<double>(c.vocab_size) * H + static_cast<double>(c.num_layers) * per_layer + H;
}

// Element count of a shape (0 when any dimension is 0 or negative).
size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= d > 0 ? static_cast<size_t>(d) : 0;
  return n;
}

void fill(std::vector<uint8_t>& bytes, DType dtype, bool from_input, uint8_t seed, std::string_view src) {
  const size_t esize = static_cast<size_t>(cider::dtype_size(dtype));
  const size_t n = bytes.size() / esize;
  for (size_t i = 0; i < n; ++i) {
    uint8_t* p = bytes.data() + i * esize;
    if (from_input && !src.empty()) {
      for (size_t k = 0; k < esize; ++k) p[k] = static_cast<uint8_t>(src[(i * esize + k) % src.size()]);
      continue;
    }
    const float v = 0.02f * static_cast<float>(static_cast<int>((i * 37u + seed) % 101u) - 50);
    switch (dtype) {
      case DType::kF32: std::memcpy(p, &v, 4); break;
      case DType::kBF16: {
        const uint16_t h = cider::f32_to_bf16(v);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::kI8:
      case DType::kU8: p[0] = static_cast<uint8_t>(i * 13u + seed); break;
      default: std::memset(p, 0, esize); break;
    }
  }
}

void perturb(std::vector<GenTensor>& t, uint8_t target, uint8_t kind) {
  if (t.empty()) return;
  const size_t k = target % t.size();
  switch (kind) {
    case 1: t.erase(t.begin() + static_cast<std::ptrdiff_t>(k)); break;
    case 2: t.push_back({"model.layers.0.self_attn.extra.weight", DType::kF32, {2, 2}}); break;
    case 3: if (!t[k].shape.empty()) ++t[k].shape.back(); break;
    case 4: if (!t[k].shape.empty() && t[k].shape[0] > 0) --t[k].shape[0]; break;
    case 5: if (t[k].dtype == DType::kF32) t[k].dtype = DType::kI32; break;
    case 6: t[k].shape.push_back(1); break;
    case 7: if (!t[k].shape.empty()) t[k].shape.pop_back(); break;
    case 8: t[k].dtype = DType::kF16; break;
    default: break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t mode = data[0], target = data[1], kind = data[2], seed = data[3];
  const bool hf = (mode & 0x01) != 0;
  const bool forward = (mode & 0x02) != 0;
  const bool from_input = (mode & 0x40) != 0;
  const DType dense = (mode & 0x80) != 0 ? DType::kBF16 : DType::kF32;
  const cider::fuzz::Parts p = cider::fuzz::split_nul(data + 4, size - 4, 4);
  const std::string config_text(p.parts[0]);
  const std::string weights = p.present >= 2 ? std::string(p.parts[1]) : "f32";
  const std::string version = p.present >= 3 ? std::string(p.parts[2]) : "1";

  WeightFormat format = WeightFormat::kF32;
  cider::fuzz::expect_errors([&] { format = cider::model::parse_weight_format(weights); });

  // The config as the loader will read it (if it can): it shapes the tensors written.
  std::optional<ModelConfig> config;
  cider::fuzz::expect_errors([&] {
    config = hf ? cider::model::parse_hf_config(config_text, "config.json")
                : cider::model::config_from_json(config_text, "metadata config");
  });
  std::vector<GenTensor> gen;
  if (config && element_count(*config) <= kMaxElements) gen = tensors_for(*config, format, !hf, dense);
  perturb(gen, target, kind);

  std::vector<std::vector<uint8_t>> storage;
  storage.reserve(gen.size());
  const std::string_view values = p.parts[3];
  cider::model::SafetensorsWriter w;
  bool written = true;
  cider::fuzz::expect_errors([&] {
    written = false;
    for (const GenTensor& g : gen) {
      storage.emplace_back(numel(g.shape) * static_cast<size_t>(cider::dtype_size(g.dtype)));
      fill(storage.back(), g.dtype, from_input, seed, values);
      w.add(g.name, g.dtype, g.shape, storage.back().data());
    }
    if (!hf) {
      w.set_metadata("format", "cider");
      if (!(mode & 0x04)) w.set_metadata("config", config_text);
      if (!(mode & 0x08)) w.set_metadata("weights", weights);
      if (!(mode & 0x10)) w.set_metadata("version", version);
      w.set_metadata("source", "hf");
    }
    const std::string dir = cider::fuzz::scratch_dir() + "/model";
    std::filesystem::create_directories(dir);
    std::error_code ec;
    if (hf) {
      cider::fuzz::write_file(dir + "/config.json", config_text);
    } else {
      std::filesystem::remove(dir + "/config.json", ec);
    }
    w.write(dir + "/model.safetensors");  // a cider::Error for metadata that is not valid UTF-8
    written = true;
  });
  if (!written) return 0;

  cider::model::ModelOptions opts;
  opts.weights = format;
  opts.kv = cider::model::parse_kv_format((mode & 0x20) ? "bf16" : "f32");
  if (config && config->max_position > 0) opts.ctx = std::min<int64_t>(config->max_position, 8);
  std::unique_ptr<cider::model::Model> model;
  cider::fuzz::expect_errors([&] { model = cider::model::Model::load(cider::fuzz::scratch_dir() + "/model", opts); });
  if (!model) return 0;
  if (gen.empty() || element_count(model->config()) > kMaxElements) {
    std::fprintf(stderr, "fuzz_cider_format: a model loaded without its tensors\n");
    std::abort();
  }
  if (forward) {
    cider::fuzz::expect_errors([&] {
      const int64_t V = model->config().vocab_size;
      auto s = model->new_session();
      const int32_t tokens[2] = {0, static_cast<int32_t>(std::min<int64_t>(V - 1, seed))};
      const int64_t n = std::min<int64_t>(2, model->context_length());
      std::vector<float> logits(static_cast<size_t>(V * n));
      model->forward(*s, tokens, n, logits.data(), true);
      s->trim(1);
    });
  }
  return 0;
}
