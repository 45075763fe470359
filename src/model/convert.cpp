// cider-format writer (see convert.h).
#include "model/convert.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "quant/ggml_blocks.h"

namespace cider::model {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOp = "convert";

// Native GGUF blocks (N rows of row-bytes each, in the engine's row order) as the U8 tensor `name` (N, row bytes),
// their type recorded in `ggml_types` (the metadata entry of that name: {"<tensor>": "Q4_K", ...}).
void add_blocks(SafetensorsWriter& w, nlohmann::json& ggml_types, const std::string& name, uint32_t type, int64_t N,
                int64_t K, const void* blocks) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(type);
  check(f != nullptr, ErrorCode::kInternal, kOp, name, ": ggml type ", type, " is not a block format");
  w.add(name, DType::kU8, {N, quant::ggml_row_bytes(*f, K)}, blocks);
  ggml_types[name] = f->name;
}

void add_linear(SafetensorsWriter& w, nlohmann::json& ggml_types, const Linear& L) {
  if (L.kind == Linear::Kind::kGgml) {
    check(!L.interleaved, ErrorCode::kInternal, kOp, L.name, ": rows in the CPU kernels' order (load with kernel_layout off)");
    add_blocks(w, ggml_types, L.name + ".gblocks", L.ggml_type, L.N, L.K, L.w);
  } else if (L.kind == Linear::Kind::kDense) {
    w.add(L.name + ".weight", L.w_dtype, {L.N, L.K}, L.w);
  } else {
    const bool int8 = L.kind == Linear::Kind::kInt8;
    w.add(L.name + ".qweight", int8 ? DType::kI8 : DType::kU8, {L.N, int8 ? L.K : L.K / 2}, L.w);
    if (L.group_size == 0) {
      w.add(L.name + ".wscales", DType::kF32, {L.N}, L.scales);
    } else {
      w.add(L.name + ".wscales", DType::kF32, {L.K / L.group_size, L.N}, L.scales);
    }
  }
  if (L.bias) w.add(L.name + ".bias", DType::kF32, {L.N}, L.bias);
}

void add_norm(SafetensorsWriter& w, const NormWeight& n) {
  if (n.w) w.add(n.name, DType::kF32, {n.dim}, n.w);
}

// ---- a tensor-less GGUF carrying the tokenizer metadata of a GGUF source ----
void put_u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& b, const std::string& s) {
  put_u64(b, s.size());
  b += s;
}
void put_scalar(std::string& b, uint32_t type, const GGUFScalar& s) {
  auto as_u = [&]() -> uint64_t {
    if (auto* u = std::get_if<uint64_t>(&s)) return *u;
    if (auto* i = std::get_if<int64_t>(&s)) return static_cast<uint64_t>(*i);
    if (auto* f = std::get_if<bool>(&s)) return *f ? 1 : 0;
    return 0;
  };
  auto as_d = [&]() -> double {
    if (auto* d = std::get_if<double>(&s)) return *d;
    return static_cast<double>(as_u());
  };
  switch (type) {
    case 0: case 1: case 7: b.push_back(static_cast<char>(as_u() & 0xff)); break;
    case 2: case 3: { const auto v = static_cast<uint16_t>(as_u()); b.append(reinterpret_cast<const char*>(&v), 2); break; }
    case 4: case 5: put_u32(b, static_cast<uint32_t>(as_u())); break;
    case 6: { const auto f = static_cast<float>(as_d()); b.append(reinterpret_cast<const char*>(&f), 4); break; }
    case 8: put_str(b, std::get<std::string>(s)); break;
    case 10: case 11: put_u64(b, as_u()); break;
    case 12: { const double d = as_d(); b.append(reinterpret_cast<const char*>(&d), 8); break; }
    default: fail(ErrorCode::kUnsupported, kOp, "cannot write GGUF value type ", type);
  }
}

void write_tokenizer_gguf(const GGUFFile& g, const std::string& path) {
  std::vector<std::pair<std::string, const GGUFValue*>> kv;
  for (const auto& [k, v] : g.metadata())
    if (k.rfind("tokenizer.", 0) == 0 || k == "general.architecture") kv.emplace_back(k, &v);
  std::string b = "GGUF";
  put_u32(b, 3);
  put_u64(b, 0);  // tensors
  put_u64(b, kv.size());
  for (const auto& [k, v] : kv) {
    put_str(b, k);
    if (v->is_array) {
      put_u32(b, 9);
      put_u32(b, v->type);
      put_u64(b, v->values.size());
      for (const GGUFScalar& s : v->values) put_scalar(b, v->type, s);
    } else {
      put_u32(b, v->type);
      put_scalar(b, v->type, v->values.at(0));
    }
  }
  AtomicFile out(path, kOp);
  out.write(b.data(), b.size());
  out.commit();
}

}  // namespace

void convert_model(const std::string& in, const std::string& out_dir, WeightFormat format, const ProgressFn& progress,
                   const std::string& imatrix, std::optional<WeightFormat> head_weights) {
  std::error_code ec;
  check(!out_dir.empty(), ErrorCode::kInvalidArgument, kOp, "the output directory must be named");
  check(!fs::exists(out_dir, ec), ErrorCode::kInvalidArgument, kOp, "the output directory must not exist yet; got '",
        out_dir, "'");
  ModelOptions opts;
  opts.weights = format;
  opts.imatrix = imatrix;
  opts.head_weights = head_weights;
  opts.kv = parse_kv_format("bf16");  // no cache is built; a plain one puts no constraint on head_dim
  opts.kernel_layout = false;          // the blocks written out in the file's order
  const std::unique_ptr<Model> model = Model::load(in, opts, progress);
  const Model::Impl& m = model->impl();
  const Weights& W = m.w;

  SafetensorsWriter w;
  nlohmann::json ggml_types = nlohmann::json::object();  // --weights native: every ".gblocks" tensor's block type
  if (W.embed_ggml_type != 0) {  // native: the embedding in its blocks (a tied head reads them: not written again)
    add_blocks(w, ggml_types, W.embed_name.substr(0, W.embed_name.rfind(".weight")) + ".gblocks", W.embed_ggml_type,
               m.config.vocab_size, m.config.hidden_size, W.embed);
  } else {
    w.add(W.embed_name, W.embed_dtype, {m.config.vocab_size, m.config.hidden_size}, W.embed);
  }
  for (const LayerWeights& L : W.layers) {
    add_norm(w, L.attn_norm);
    if (L.conv_w != nullptr) {  // a gated DeltaNet layer, in the engine's layout (Qwen3.5's names)
      const ModelConfig::LinearAttention& la = m.config.linear_attn;
      const std::string p = L.lin_qkv.name.substr(0, L.lin_qkv.name.rfind("in_proj_qkv"));
      for (const Linear* x : {&L.lin_qkv, &L.lin_z, &L.lin_b, &L.lin_a, &L.lin_out}) add_linear(w, ggml_types, *x);
      w.add(p + "conv1d.weight", DType::kF32, {la.conv_dim(), 1, la.conv_kernel}, L.conv_w);
      w.add(p + "A_log", DType::kF32, {la.num_v_heads}, L.A_log);
      w.add(p + "dt_bias", DType::kF32, {la.num_v_heads}, L.dt_bias);
      add_norm(w, L.lin_norm);
    } else {
      for (const Linear* x : {&L.q, &L.k, &L.v, &L.o}) add_linear(w, ggml_types, *x);
    }
    add_norm(w, L.q_norm);
    add_norm(w, L.k_norm);
    add_norm(w, L.post_attn_norm);
    add_norm(w, L.mlp_norm);
    add_norm(w, L.post_mlp_norm);
    if (L.experts.empty()) {
      for (const Linear* x : {&L.gate, &L.up, &L.down}) add_linear(w, ggml_types, *x);
    } else {  // a mixture-of-experts layer: the float32 router and every expert, under the checkpoint's names
      add_linear(w, ggml_types, L.router);
      for (const LayerWeights::Expert& e : L.experts)
        for (const Linear* x : {&e.gate, &e.up, &e.down}) add_linear(w, ggml_types, *x);
      if (L.shared_gate.w != nullptr)
        for (const Linear* x : {&L.shared.gate, &L.shared.up, &L.shared.down, &L.shared_gate})
          add_linear(w, ggml_types, *x);
    }
  }
  add_norm(w, W.final_norm);
  if (!W.head_is_embedding) add_linear(w, ggml_types, W.lm_head);
  w.set_metadata("format", "cider");
  w.set_metadata("version", "1");
  w.set_metadata("weights", weight_format_name(format));
  if (weight_format_info(format).kind == WeightKind::kGgml) w.set_metadata("ggml_types", ggml_types.dump());
  w.set_metadata("config", config_to_json(m.config));
  w.set_metadata("source", m.source);

  // A fresh temporary directory beside the output (never an existing one: nothing of the user's is removed).
  std::string tmp_name = out_dir + ".tmp-XXXXXX";
  check(::mkdtemp(tmp_name.data()) != nullptr, ErrorCode::kIo, kOp, "cannot create a temporary directory beside '",
        out_dir, "': ", std::strerror(errno));
  const std::string tmp = tmp_name;
  try {
    if (progress) progress("write", 0, 1);
    w.write(tmp + "/model.safetensors");
    if (fs::is_directory(in)) {
      for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                            "special_tokens_map.json", "chat_template.jinja", "tokenizer.gguf"}) {
        const fs::path src = fs::path(in) / f;
        if (fs::exists(src)) {
          fs::copy_file(src, fs::path(tmp) / f, ec);
          check(!ec, ErrorCode::kIo, kOp, "cannot copy '", src.string(), "' to '", (fs::path(tmp) / f).string(),
                "': ", ec.message());
        }
      }
    } else if (auto g = GGUFFile::open(in); g->has("tokenizer.ggml.tokens")) {
      write_tokenizer_gguf(*g, tmp + "/tokenizer.gguf");
    }
    fs::rename(tmp, out_dir, ec);
    check(!ec, ErrorCode::kIo, kOp, "cannot rename '", tmp, "' to '", out_dir, "': ", ec.message());
    if (progress) progress("write", 1, 1);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace cider::model
