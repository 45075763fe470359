// Checkpoint → Weights: source detection, name mapping, validation against the config, conversion to the requested
// weight format (see loader.h).
#include "model/loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "core/thread_pool.h"
#include "model/activation_stats.h"
#include "model/arch/arch.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "quant/affine.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"
#include "quant/ggml_quantize.h"
#include "quant/gptq.h"
#include "quant/int4.h"
#include "quant/int8.h"

namespace cider::model {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOp = "load";

enum class SourceKind { kHF, kMLX, kGGUF, kCider };

// A float tensor ready to use: a view (into a mapping, or into `temp` when it had to be materialised).
struct FloatRef {
  TensorView view;
  std::optional<Tensor> temp;
};

bool aligned_for(const void* p, DType t) { return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(dtype_size(t)) == 0; }

std::string shape_str(const std::vector<int64_t>& s) { return shape_string(s); }

// Rows of a llama-arch attn_q / attn_k weight (or bias) as llama.cpp's converter stored them: within each head of D
// rows, row 2i + h holds HF row h·D/2 + i (h ∈ {0, 1}). Undoes that in place on (heads·D, cols) float32 data.
void unpermute_gguf_heads(float* data, int64_t heads, int64_t D, int64_t cols) {
  const int64_t half = D / 2;
  std::vector<float> tmp(static_cast<size_t>(D * cols));
  for (int64_t hd = 0; hd < heads; ++hd) {
    float* head = data + hd * D * cols;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < half; ++i)
        std::memcpy(tmp.data() + (h * half + i) * cols, head + (2 * i + h) * cols, static_cast<size_t>(cols) * 4);
    std::memcpy(head, tmp.data(), tmp.size() * 4);
  }
}

// The block format named `name` ("Q4_K", as quant::GgmlBlockFormat::name spells it); nullptr for any other name.
const quant::GgmlBlockFormat* ggml_block_format_named(const std::string& name) {
  for (uint32_t id = 0; id < 64; ++id)  // ggml's type ids are small (the block formats' are below 16)
    if (const quant::GgmlBlockFormat* f = quant::ggml_block_format(id); f != nullptr && name == f->name) return f;
  return nullptr;
}

// A native cider file's metadata entry "ggml_types": a JSON object {"<tensor>.gblocks": "<block type>"}. Each key must
// name a tensor of the file; the types are checked where the tensors are read (Builder::cider_blocks).
std::map<std::string, std::string> parse_ggml_types(const std::string& text, const SafetensorsSet& set,
                                                    const std::string& path) {
  check_json_nesting(text.data(), text.data() + text.size(), kOp, path + " (metadata ggml_types)");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  check(!j.is_discarded() && j.is_object(), ErrorCode::kCorrupt, kOp, path,
        ": metadata ggml_types must be a JSON object {tensor: block type}; got '", text.substr(0, 80), "'");
  std::map<std::string, std::string> types;
  for (auto it = j.begin(); it != j.end(); ++it) {
    check(it.value().is_string(), ErrorCode::kCorrupt, kOp, path, ": metadata ggml_types['", it.key(),
          "'] must be a block type name such as \"Q4_K\"; got ", it.value().dump());
    check(set.find(it.key()) != nullptr, ErrorCode::kCorrupt, kOp, path, ": metadata ggml_types names tensor '",
          it.key(), "', which the file does not hold");
    types[it.key()] = it.value().get<std::string>();
  }
  return types;
}

class Builder {
 public:
  Builder(SourceKind kind, const ModelConfig& config, WeightFormat format, const std::string& where)
      : kind_(kind), c_(config), arch_(arch_spec(config.arch)), format_(format), where_(where) {}

  SourceKind kind_;
  const ModelConfig& c_;
  const ArchSpec& arch_;
  WeightFormat format_;
  std::string where_;
  std::shared_ptr<const SafetensorsSet> st_;
  std::shared_ptr<const GGUFFile> gguf_;
  MlxQuantization mlx_;
  std::string cider_format_;  // the weight format a cider file was converted to
  std::map<std::string, std::string> ggml_types_;  // a native cider file's "<module>.gblocks" -> "Q4_K" (ggml_types)
  std::set<std::string> used_;
  Weights* w_ = nullptr;
  const Importance* importance_ = nullptr;  // --imatrix: module → mean squared input per channel
  // A tied LM head coded apart from the embedding (GPTQ fits the head's rows to its inputs, not to the lookup)
  bool head_apart_ = false;
  uint32_t head_type_ = 0;  // --head-weights: the LM head's block type; 0: the format's
  int64_t importance_used_ = 0;             // layers whose fits it weighted
  // GPTQ's factor of the last second-moment matrix used (layers that share one come one after another: q, k, v)
  const void* gptq_of_ = nullptr;
  std::vector<float> gptq_factor_;

  // ---- raw lookups (names as in the file) ----
  const StTensor* st(const std::string& name) const { return st_ ? st_->find(name) : nullptr; }
  bool exists(const std::string& hf) const {
    if (kind_ == SourceKind::kGGUF) return gguf_->find(gguf_tensor_name(arch_, hf)) != nullptr;
    return st(hf) != nullptr;
  }
  std::string file_name(const std::string& hf) const {
    return kind_ == SourceKind::kGGUF ? gguf_tensor_name(arch_, hf) : hf;
  }

  [[noreturn]] void missing(const std::string& hf) const {
    fail(ErrorCode::kCorrupt, kOp, where_, ": tensor '", file_name(hf), "' is missing (required by the ",
         arch_.name, " config)");
  }
  void check_shape(const std::string& name, const std::vector<int64_t>& got, const std::vector<int64_t>& want) const {
    check(got == want, ErrorCode::kShapeMismatch, kOp, where_, ": tensor '", name, "' must have shape ",
          shape_str(want), " for this config; got ", shape_str(got));
  }

  // ---- fused projections (ArchSpec::fused_linears) ----
  // Output rows of one of the engine's per-layer linear modules.
  int64_t module_rows(std::string_view m) const {
    auto ends = [&](std::string_view suffix) {
      return m.size() >= suffix.size() && m.substr(m.size() - suffix.size()) == suffix;
    };
    if (ends("q_proj")) return c_.num_heads * c_.head_dim;
    if (ends("k_proj") || ends("v_proj")) return c_.num_kv_heads * c_.head_dim;
    if (ends("gate_proj") || ends("up_proj")) return c_.intermediate_size;
    fail(ErrorCode::kInternal, kOp, "a fused projection's part must be q/k/v_proj or gate/up_proj; got ", m);
  }
  // Rows [row0, row0 + rows) of the fused tensor `hf` (total rows in all).
  struct FusedSlice {
    std::string hf;
    int64_t row0 = 0, rows = 0, total = 0;
    std::vector<int64_t> file_shape;  // the file's shape when it is not (total, K): GGUF experts' (E, N, K)
  };
  // GGUF mixture-of-experts files hold each kind of expert matrix of a layer as one 3-D tensor (E, N, K)
  // ("blk.L.ffn_gate_exps.weight"): expert e's "model.layers.L.<experts>e.<part>.weight" is its rows [e·N, (e+1)·N).
  std::optional<FusedSlice> expert_slice(const std::string& hf) const {
    const MoeNames& n = arch_.moe;
    const std::string pre = "model.layers.";
    if (kind_ != SourceKind::kGGUF || n.router == nullptr || hf.rfind(pre, 0) != 0) return std::nullopt;
    const size_t dot = hf.find('.', pre.size());
    if (dot == std::string::npos) return std::nullopt;
    const std::string layer = hf.substr(0, dot + 1), rest = hf.substr(dot + 1), ex = n.experts;
    if (rest.rfind(ex, 0) != 0) return std::nullopt;
    const size_t edot = rest.find('.', ex.size());
    if (edot == std::string::npos) return std::nullopt;
    const int64_t e = std::stoll(rest.substr(ex.size(), edot - ex.size()));
    const std::string part = rest.substr(edot + 1);  // "<gate|up|down>.weight"
    const bool down = part.rfind(std::string(n.down) + ".", 0) == 0;
    const int64_t N = down ? c_.hidden_size : c_.expert_intermediate_size;
    const int64_t K = down ? c_.expert_intermediate_size : c_.hidden_size;
    FusedSlice fs;
    fs.hf = layer + ex + part;  // "model.layers.L.mlp.experts.gate_proj.weight" → gguf_tensor_name
    fs.row0 = e * N;
    fs.rows = N;
    fs.total = c_.num_experts * N;
    fs.file_shape = {c_.num_experts, N, K};
    return fs;
  }
  // `hf` (a part's tensor "model.layers.3.self_attn.k_proj.weight", or module "model.layers.3.self_attn.k_proj") as
  // rows of the fused tensor the file holds in its place; nullopt when the file has no such fused projection (the part
  // is then read under its own name, as cider-converted files and some GGUF files store it).
  std::optional<FusedSlice> fused_slice(const std::string& hf) const {
    if (std::optional<FusedSlice> es = expert_slice(hf)) return es;
    const std::string pre = "model.layers.";
    if (arch_.fused_linears.empty() || hf.rfind(pre, 0) != 0) return std::nullopt;
    const size_t dot = hf.find('.', pre.size());
    if (dot == std::string::npos) return std::nullopt;
    const std::string layer = hf.substr(0, dot + 1), rest = hf.substr(dot + 1);
    for (const FusedLinear& f : arch_.fused_linears) {
      FusedSlice fs;
      std::string suffix;
      bool found = false;
      for (const char* part : f.parts) {
        const std::string_view ps = part;
        if (!found && rest.rfind(ps, 0) == 0 && (rest.size() == ps.size() || rest[ps.size()] == '.')) {
          found = true;
          suffix = rest.substr(ps.size());
          fs.row0 = fs.total;
          fs.rows = module_rows(ps);
        }
        fs.total += module_rows(ps);
      }
      if (!found) continue;
      if (!exists(layer + f.fused + ".weight")) return std::nullopt;
      fs.hf = layer + f.fused + suffix;
      return fs;
    }
    return std::nullopt;
  }
  // Rows [row0, row0 + n) of a contiguous row-major view.
  static TensorView view_rows(const TensorView& v, int64_t row0, int64_t n) {
    std::vector<int64_t> shape = v.shape_vector();
    const int64_t row_elems = v.numel() / shape[0];
    shape[0] = n;
    return TensorView(static_cast<const uint8_t*>(v.data) + row0 * row_elems * static_cast<int64_t>(dtype_size(v.dtype)),
                      v.dtype, shape);
  }

  // An MLX-quantized module (prefix.scales present, or its fused projection's)?
  bool is_mlx_quantized(const std::string& prefix) const {
    const std::optional<FusedSlice> fs = fused_slice(prefix);
    return kind_ == SourceKind::kMLX && st((fs ? fs->hf : prefix) + ".scales") != nullptr;
  }

  struct MlxTriple {
    TensorView packed, scales, biases;
    MlxQuantParams p;
  };
  MlxTriple mlx_triple(const std::string& prefix, int64_t N, int64_t K) {
    if (const std::optional<FusedSlice> fs = fused_slice(prefix)) {
      MlxTriple m = mlx_triple(fs->hf, fs->total, K);
      for (TensorView* v : {&m.packed, &m.scales, &m.biases}) *v = view_rows(*v, fs->row0, fs->rows);
      return m;
    }
    const std::string wn = prefix + ".weight", sn = prefix + ".scales", bn = prefix + ".biases";
    const StTensor* w = st(wn);
    const StTensor* s = st(sn);
    const StTensor* b = st(bn);
    if (!w) missing(wn);
    if (!b) missing(bn);
    const std::optional<MlxQuantParams> p = mlx_.params_for(prefix);
    check(p.has_value(), ErrorCode::kCorrupt, kOp, where_, ": '", sn,
          "' exists but the quantization config marks ", prefix, " as not quantized");
    check(quant::is_affine_bits(p->bits) && quant::is_affine_group_size(p->group_size), ErrorCode::kUnsupported,
          kOp, where_, ": MLX quantization of ", prefix, " must use bits 2-8 and group 32/64/128; got bits ", p->bits,
          ", group ", p->group_size);
    check(K % p->group_size == 0, ErrorCode::kShapeMismatch, kOp, where_, ": ", prefix, " has K = ", K,
          ", not a multiple of its MLX group size ", p->group_size);
    check(w->dtype == DType::kU32, ErrorCode::kCorrupt, kOp, where_, ": tensor '", wn,
          "' must be U32 (MLX packed codes); got ", safetensors_dtype_name(w->dtype));
    check(is_float_dtype(s->dtype) && b->dtype == s->dtype, ErrorCode::kCorrupt, kOp, where_, ": tensors '", sn,
          "' and '", bn, "' must share one float dtype; got ", safetensors_dtype_name(s->dtype), " and ",
          safetensors_dtype_name(b->dtype));
    check_shape(wn, w->shape, {N, quant::packed_words(K, p->bits)});
    check_shape(sn, s->shape, {N, K / p->group_size});
    check_shape(bn, b->shape, {N, K / p->group_size});
    for (const auto& n : {wn, sn, bn}) used_.insert(n);
    return {aligned_view(*w), aligned_view(*s), aligned_view(*b), *p};
  }

  // A mapped safetensors tensor as a view, copied to owned memory if its start is misaligned for its dtype.
  TensorView aligned_view(const StTensor& t) {
    if (aligned_for(t.data, t.dtype)) return t.view();
    Tensor& copy = w_->owned.emplace_back(t.dtype, t.shape);
    std::memcpy(copy.buffer.data(), t.data, t.nbytes);
    return copy.view();
  }

  // A float tensor (f32/f16/bf16) of the given HF name and shape, in place where possible; every value finite (a
  // NaN or infinity in a weight is a corrupt file for every --weights format, never silently wrong logits).
  FloatRef fetch_float(const std::string& hf, const std::vector<int64_t>& shape) {
    // Rows regrouped (row_gather) and/or reordered (partial rotary) come from the file's tensor in one gather.
    const std::optional<RowGather> g = row_gather(hf);
    std::vector<int64_t> file_shape = shape;
    if (g) file_shape[0] = g->total;
    const std::string& name = g ? g->src : hf;
    FloatRef r = fetch_float_any(name, file_shape);
    check_finite_weights(r.view.data, r.view.dtype, r.view.numel(), file_name(name));
    if (g || rotary_reordered(hf)) r = gather_rows(r, engine_row_order(hf, shape[0]));
    return r;
  }

  // ---- rows regrouped at load (gated attention, Qwen3-Next's DeltaNet projections) ----
  // The engine's tensor `hf` as rows `rows` of the checkpoint's tensor `src` (total rows).
  struct RowGather {
    std::string src;
    int64_t total = 0;
    std::vector<int64_t> rows;
  };
  std::optional<RowGather> row_gather(const std::string& hf) const {
    if (kind_ == SourceKind::kCider) return std::nullopt;  // stored in the engine's layout already
    auto ends = [&](std::string_view suffix) {
      return hf.size() >= suffix.size() && hf.compare(hf.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    RowGather g;
    // Gated attention: q_proj holds each head's query then its gate (2·D rows per head) → all queries, then all gates.
    if (c_.attn_output_gate && (ends("self_attn.q_proj.weight") || ends("self_attn.q_proj.bias"))) {
      const int64_t D = c_.head_dim, Hq = c_.num_heads;
      g.src = hf;
      g.total = 2 * Hq * D;
      for (int64_t part = 0; part < 2; ++part)
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t d = 0; d < D; ++d) g.rows.push_back(h * 2 * D + part * D + d);
      return g;
    }
    // Qwen3-Next: in_proj_qkvz groups rows per key head h: q_h (Dk), k_h (Dk), then the v (r·Dv) and z (r·Dv) of its
    // r = Hv/Hk value heads; in_proj_ba: b then a of those value heads (2·r rows per key head).
    const bool qkv = ends("linear_attn.in_proj_qkv.weight"), z = ends("linear_attn.in_proj_z.weight");
    const bool b = ends("linear_attn.in_proj_b.weight"), a = ends("linear_attn.in_proj_a.weight");
    if (!(qkv || z || b || a)) return std::nullopt;
    const std::string base = hf.substr(0, hf.rfind("in_proj_"));
    const std::string fused = base + ((qkv || z) ? "in_proj_qkvz.weight" : "in_proj_ba.weight");
    if (!exists(fused)) return std::nullopt;  // the parts are stored themselves (Qwen3.5)
    const ModelConfig::LinearAttention& la = c_.linear_attn;
    const int64_t Hk = la.num_k_heads, Dk = la.k_head_dim, Dv = la.v_head_dim, r = la.num_v_heads / Hk;
    g.src = fused;
    if (qkv || z) {
      const int64_t G = 2 * Dk + 2 * r * Dv;
      g.total = Hk * G;
      if (qkv) {
        for (int64_t part = 0; part < 2; ++part)  // q, k
          for (int64_t h = 0; h < Hk; ++h)
            for (int64_t d = 0; d < Dk; ++d) g.rows.push_back(h * G + part * Dk + d);
        for (int64_t h = 0; h < Hk; ++h)
          for (int64_t j = 0; j < r * Dv; ++j) g.rows.push_back(h * G + 2 * Dk + j);
      } else {
        for (int64_t h = 0; h < Hk; ++h)
          for (int64_t j = 0; j < r * Dv; ++j) g.rows.push_back(h * G + 2 * Dk + r * Dv + j);
      }
    } else {
      g.total = 2 * la.num_v_heads;
      for (int64_t h = 0; h < Hk; ++h)
        for (int64_t i = 0; i < r; ++i) g.rows.push_back(h * 2 * r + (a ? r : 0) + i);
    }
    return g;
  }
  // For each of the engine's N rows of `hf` (a weight's output rows, or a norm's / bias's values), the file's row it
  // comes from: row_gather's regrouping, then the partial-rotary order of the query/key heads (rotary_order; a gated
  // q_proj's gates keep theirs: they multiply the attention output, in v's order). fetch_float gathers float data by
  // it, native_blocks whole rows of blocks.
  std::vector<int64_t> engine_row_order(const std::string& hf, int64_t N) const {
    std::vector<int64_t> rows(static_cast<size_t>(N));
    const std::optional<RowGather> g = row_gather(hf);
    check(!g || static_cast<int64_t>(g->rows.size()) == N, ErrorCode::kInternal, kOp, where_, ": ", hf, " gathers ",
          g ? g->rows.size() : 0, " rows for ", N);
    for (int64_t i = 0; i < N; ++i) rows[static_cast<size_t>(i)] = g ? g->rows[static_cast<size_t>(i)] : i;
    if (!rotary_reordered(hf)) return rows;
    const int64_t D = c_.head_dim, heads = N / D;
    const int64_t rotated = c_.attn_output_gate && heads == 2 * c_.num_heads ? c_.num_heads : heads;
    const std::vector<int64_t> order = rotary_order();
    std::vector<int64_t> out(rows);
    for (int64_t h = 0; h < rotated; ++h)
      for (int64_t p = 0; p < D; ++p)
        out[static_cast<size_t>(h * D + p)] = rows[static_cast<size_t>(h * D + order[static_cast<size_t>(p)])];
    return out;
  }

  // Rows `rows` of a float tensor (rank 1 or 2), as float32.
  static FloatRef gather_rows(const FloatRef& r, const std::vector<int64_t>& rows) {
    const int64_t per = r.view.rank == 2 ? r.view.dim(1) : 1;
    std::vector<int64_t> shape = r.view.shape_vector();
    shape[0] = static_cast<int64_t>(rows.size());
    Tensor out(DType::kF32, shape);
    float* o = out.ptr<float>();
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t k = 0; k < per; ++k)
        o[static_cast<int64_t>(i) * per + k] = load_float(r.view.data, r.view.dtype, rows[i] * per + k);
    FloatRef f;
    f.temp = std::move(out);
    f.view = f.temp->view();
    return f;
  }

  // ---- partial rotary (ModelConfig::rotary_dim) ----
  // The q/k head dims in the engine's order: the checkpoint's dim order[p] at position p — rotary pairs
  // (i, i + R/2) moved to (i, i + D/2), the unrotated dims after each half. q·k is the same in any one order of both.
  std::vector<int64_t> rotary_order() const {
    const int64_t D = c_.head_dim, R = c_.rope_dim(), rest = D / 2 - R / 2;
    std::vector<int64_t> order;
    for (int64_t i = 0; i < R / 2; ++i) order.push_back(i);
    for (int64_t i = 0; i < rest; ++i) order.push_back(R + i);
    for (int64_t i = R / 2; i < R; ++i) order.push_back(i);
    for (int64_t i = 0; i < rest; ++i) order.push_back(R + rest + i);
    return order;
  }
  // Tensors laid out per q/k head dim: reordered when only part of each head rotates, except in cider-converted files
  // (stored in the engine's order already).
  bool rotary_reordered(const std::string& hf) const {
    if (c_.rope_dim() == c_.head_dim || kind_ == SourceKind::kCider) return false;
    for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_proj.bias",
                          "self_attn.k_proj.bias", "self_attn.q_norm.weight", "self_attn.k_norm.weight"}) {
      const std::string_view suffix = s;
      if (hf.size() >= suffix.size() && hf.compare(hf.size() - suffix.size(), suffix.size(), suffix) == 0) return true;
    }
    return false;
  }
  void check_finite_weights(const void* data, DType dtype, int64_t n, const std::string& name) const {
    const int64_t bad = find_nonfinite(data, dtype, n);
    check(bad < 0, ErrorCode::kCorrupt, kOp, where_, ": tensor '", name, "' must hold finite values; got ",
          bad < 0 ? 0.0f : load_float(data, dtype, bad), " at flat index ", bad);
  }

  FloatRef fetch_float_any(const std::string& hf, const std::vector<int64_t>& shape) {
    const std::optional<FusedSlice> fs = fused_slice(hf);
    std::vector<int64_t> file_shape = shape;  // a fused tensor: all its parts' rows
    if (fs) file_shape[0] = fs->total;
    if (fs && !fs->file_shape.empty()) file_shape = fs->file_shape;
    if (kind_ == SourceKind::kGGUF) {
      const std::string gn = gguf_tensor_name(arch_, fs ? fs->hf : hf);
      const GGUFTensor* t = gguf_->find(gn);
      if (!t) missing(hf);
      check_shape(gn, t->shape, file_shape);
      used_.insert(gn);
      GGUFTensor part;  // a fused tensor's rows: whole rows of whole blocks, decoded like any tensor
      if (fs) {
        part = *t;
        const size_t row_bytes = t->nbytes / static_cast<size_t>(fs->total);
        part.shape = {fs->rows, shape.back()};
        part.data += static_cast<size_t>(fs->row0) * row_bytes;
        part.nbytes = static_cast<size_t>(fs->rows) * row_bytes;
        t = &part;
      }
      const bool permuted = arch_.gguf_qk_interleaved &&
                            (hf.find("self_attn.q_proj.") != std::string::npos ||
                             hf.find("self_attn.k_proj.") != std::string::npos);
      const auto type = static_cast<GGMLType>(t->type);
      if (!permuted && (type == GGMLType::kF32 || type == GGMLType::kF16 || type == GGMLType::kBF16)) {
        const DType dt = type == GGMLType::kF32 ? DType::kF32 : (type == GGMLType::kF16 ? DType::kF16 : DType::kBF16);
        if (aligned_for(t->data, dt)) return {TensorView(t->data, dt, shape), std::nullopt};
      }
      Tensor f(DType::kF32, shape);
      dequantize_gguf_tensor(*t, f.ptr<float>());
      if (permuted) {
        const int64_t heads = hf.find("q_proj") != std::string::npos ? c_.num_heads : c_.num_kv_heads;
        unpermute_gguf_heads(f.ptr<float>(), heads, c_.head_dim, shape.size() == 2 ? shape[1] : 1);
      }
      FloatRef r;
      r.temp = std::move(f);
      r.view = r.temp->view();
      return r;
    }
    const std::string prefix = hf.size() > 7 && hf.compare(hf.size() - 7, 7, ".weight") == 0
                                   ? hf.substr(0, hf.size() - 7) : std::string();
    if (!prefix.empty() && is_mlx_quantized(prefix) && shape.size() == 2) {
      // An MLX-quantized tensor used as float (embedding, or dense formats): dequantized exactly as MLX does, in the
      // scales' dtype (f32 for --weights f32; the values are exact in both).
      MlxTriple m = mlx_triple(prefix, shape[0], shape[1]);
      const DType out = weight_format_info(format_).dtype == DType::kF32 ? DType::kF32 : m.scales.dtype;
      FloatRef r;
      r.temp = quant::affine_dequantize(m.packed, m.scales, m.biases, m.p.group_size, m.p.bits, out);
      r.view = r.temp->view();
      return r;
    }
    const std::string name = fs ? fs->hf : hf;
    const StTensor* t = st(name);
    if (!t) missing(hf);
    check(is_float_dtype(t->dtype), ErrorCode::kCorrupt, kOp, where_, ": tensor '", name,
          "' must be F32, F16 or BF16; got ", safetensors_dtype_name(t->dtype));
    check_shape(name, t->shape, file_shape);
    used_.insert(name);
    const TensorView v = aligned_view(*t);
    return {fs ? view_rows(v, fs->row0, fs->rows) : v, std::nullopt};
  }

  // Keeps `r` as dtype `dt`: in place (moving a temporary into the owned store) or converted once.
  const void* keep_as(FloatRef& r, DType dt) {
    if (r.view.dtype == dt) {
      if (r.temp) return w_->owned.emplace_back(std::move(*r.temp)).buffer.data();
      return r.view.data;
    }
    Tensor& out = w_->owned.emplace_back(dt, r.view.shape_vector());
    const int64_t n = r.view.numel();
    for (int64_t i = 0; i < n; ++i) store_float(out.buffer.data(), dt, i, load_float(r.view.data, r.view.dtype, i));
    return out.buffer.data();
  }

  NormWeight norm(const std::string& hf, int64_t dim) {
    FloatRef r = fetch_float(hf, {dim});
    NormWeight n;
    n.name = hf;
    n.dim = dim;
    n.w = static_cast<const float*>(keep_as(r, DType::kF32));
    return n;
  }

  const float* bias(const std::string& hf, int64_t N) {
    FloatRef r = fetch_float(hf, {N});
    return static_cast<const float*>(keep_as(r, DType::kF32));
  }

  // Quantizes a float (N, K) view into the format's int kind.
  void quantize_into(Linear& L, const TensorView& wv, int group_size) {
    const WeightFormatInfo& info = weight_format_info(format_);
    if (info.kind == Linear::Kind::kGgml) return encode_blocks(L, wv, info);
    check(group_size == 0 || L.K % group_size == 0, ErrorCode::kUnsupported, kOp, where_, ": ", L.name,
          " has K = ", L.K, ", not a multiple of the ", weight_format_name(format_), " group size ", group_size);
    if (weight_format_info(format_).kind == Linear::Kind::kInt8) {
      check(group_size != 0 || L.K <= quant::kInt8MaxAccumK, ErrorCode::kUnsupported, kOp, where_, ": ", L.name,
            " has K = ", L.K, ", beyond the int32-exact limit ", quant::kInt8MaxAccumK, " of per-channel W8A8");
      quant::Int8Weights q = quant::quantize_int8_weights(wv, group_size);
      L.kind = Linear::Kind::kInt8;
      L.w_dtype = DType::kI8;
      L.w = w_->owned.emplace_back(std::move(q.q)).buffer.data();
      L.scales = w_->owned.emplace_back(std::move(q.scales)).ptr<float>();
      L.group_size = group_size;
    } else {
      check(L.K % 2 == 0, ErrorCode::kUnsupported, kOp, where_, ": ", L.name, " has odd K = ", L.K,
            "; W4A8 packs pairs");
      quant::Int4Weights q = quant::quantize_int4_weights(wv, group_size);
      L.kind = Linear::Kind::kInt4;
      L.w_dtype = DType::kU8;
      L.w = w_->owned.emplace_back(std::move(q.packed)).buffer.data();
      L.scales = w_->owned.emplace_back(std::move(q.scales)).ptr<float>();
      L.group_size = group_size;
    }
  }

  // A requantizing format (q8_0, q4_k, …): the float (N, K) view encoded into the format's GGUF block type by
  // cider's encoder, rows in parallel; the LM head takes the format's head type, a K that the body type's blocks do not
  // divide its fallback type; a mix's sensitive layers (is_sensitive_layer) their own type.
  void encode_blocks(Linear& L, const TensorView& wv, const WeightFormatInfo& info, bool counted = true) {
    const bool sensitive = info.ggml_sensitive != 0 && is_sensitive_layer(L.name);
    const bool head = L.name == "lm_head";
    uint32_t type = head ? (head_type_ != 0 ? head_type_ : info.ggml_head)
                         : (sensitive ? info.ggml_sensitive : info.ggml_body);
    const quant::GgmlBlockFormat* f = quant::ggml_block_format(type);
    check(!head || head_type_ == 0 || L.K % f->block_size == 0, ErrorCode::kUnsupported, kOp, where_,
          ": --head-weights ", f->name, " needs the hidden size to be a multiple of its ", f->block_size,
          "-weight blocks; lm_head has K = ", L.K);
    if (L.K % f->block_size != 0)
      f = quant::ggml_block_format(type = sensitive ? info.ggml_sensitive_fallback : info.ggml_fallback);
    check(L.K % f->block_size == 0, ErrorCode::kUnsupported, kOp, where_, ": ", L.name, " has K = ", L.K,
          ", not a multiple of the ", f->block_size, " weights of a ", f->name, " block (--weights ", info.name, ")");
    const int64_t rb = quant::ggml_row_bytes(*f, L.K);
    const float* importance = nullptr;  // --imatrix: this layer's input mean squares (K), when it holds the layer
    const float* gptq = nullptr;        // and GPTQ's factor (K × K) when it holds the layer's second moments
    if (importance_ != nullptr) {
      // cider's file names modules; llama.cpp's names GGUF weights (a fused tensor's entry serves each of its parts)
      std::string key = L.name;
      if (importance_->gguf_names) {
        const std::optional<FusedSlice> fs = fused_slice(L.name + ".weight");
        key = gguf_tensor_name(arch_, fs ? fs->hf : L.name + ".weight");
      }
      if (const auto it = importance_->layers.find(key); it != importance_->layers.end()) {
        check(static_cast<int64_t>(it->second.size()) == L.K, ErrorCode::kShapeMismatch, kOp, where_, ": --imatrix "
              "holds ", it->second.size(), " input channels for ", key, ", which has K = ", L.K,
              " (an importance file of another model?)");
        importance = it->second.data();
        ++importance_used_;
      }
      // Second moments: GPTQ's error feedback (not for a head whose rows also serve as the tied embedding's)
      const bool lookup_too = L.name == "lm_head" && c_.tie_word_embeddings && !head_apart_;
      if (const auto it = importance_->second_moments.find(key);
          importance != nullptr && !lookup_too && it != importance_->second_moments.end()) {
        if (gptq_of_ != it->second.get()) {
          try {
            gptq_factor_ = quant::gptq_factor(it->second->data(), L.K);
          } catch (const Error& e) {
            fail(ErrorCode::kCorrupt, kOp, where_, ": --imatrix's second moments of ", key, " (", e.what(), ")");
          }
          gptq_of_ = it->second.get();
        }
        gptq = gptq_factor_.data();
      }
    }
    Tensor& out = w_->owned.emplace_back(DType::kU8, std::vector<int64_t>{L.N * rb});
    uint8_t* dst = out.ptr<uint8_t>();
    try {  // the pool rethrows a chunk's first error once every chunk is done
      default_thread_pool().parallel_for(L.N, [&](int64_t n0, int64_t n1, int) {
        std::vector<float> row(static_cast<size_t>(L.K));
        const auto t = static_cast<quant::GgmlType>(type);
        for (int64_t n = n0; n < n1; ++n) {
          for (int64_t k = 0; k < L.K; ++k) row[static_cast<size_t>(k)] = load_float(wv.data, wv.dtype, n * L.K + k);
          if (gptq != nullptr)
            quant::ggml_quantize_row_gptq(t, row.data(), L.K, gptq, dst + n * rb, importance);
          else
            quant::ggml_quantize_row(t, row.data(), L.K, dst + n * rb, importance);
        }
      });
    } catch (const Error& e) {
      fail(ErrorCode::kInvalidArgument, kOp, where_, ": ", L.name, ": ", e.what());
    }
    L.kind = Linear::Kind::kGgml;
    L.w = dst;
    L.w_dtype = DType::kU8;
    L.ggml_type = type;
    L.group_size = 0;
    if (counted) count(f->name);
  }

  // A cider-converted int layer: prefix.qweight (int8 (N, K) or uint8 (N, K/2)) + prefix.wscales.
  void cider_int(Linear& L) {
    const std::string qn = L.name + ".qweight", sn = L.name + ".wscales";
    const StTensor* q = st(qn);
    const StTensor* s = st(sn);
    if (!s) missing(sn);
    const Linear::Kind want = weight_format_info(format_).kind;
    const bool int8 = q->dtype == DType::kI8;
    check(int8 || q->dtype == DType::kU8, ErrorCode::kCorrupt, kOp, where_, ": tensor '", qn,
          "' must be I8 (w8a8) or U8 (w4a8); got ", safetensors_dtype_name(q->dtype));
    check((int8 ? Linear::Kind::kInt8 : Linear::Kind::kInt4) == want, ErrorCode::kCorrupt, kOp, where_,
          ": tensor '", qn, "' does not match the file's weight format ", cider_format_);
    check_shape(qn, q->shape, {L.N, int8 ? L.K : L.K / 2});
    check(s->dtype == DType::kF32, ErrorCode::kCorrupt, kOp, where_, ": tensor '", sn, "' must be F32; got ",
          safetensors_dtype_name(s->dtype));
    int gs = 0;
    if (s->shape.size() == 2) {
      check(s->shape[0] > 0 && L.K % s->shape[0] == 0 && s->shape[1] == L.N, ErrorCode::kShapeMismatch, kOp, where_,
            ": tensor '", sn, "' must have shape (K/group, ", L.N, ") or (", L.N, "); got ", shape_str(s->shape));
      gs = static_cast<int>(L.K / s->shape[0]);
    } else {
      check_shape(sn, s->shape, {L.N});
    }
    check(gs == weight_format_info(format_).group_size || (!int8 && gs > 0 && quant::is_int4_group_size(gs)),
          ErrorCode::kCorrupt, kOp, where_, ": tensor '", sn, "' implies group size ", gs,
          ", which does not match the file's weight format ", cider_format_);
    L.kind = int8 ? Linear::Kind::kInt8 : Linear::Kind::kInt4;
    L.w_dtype = q->dtype;
    L.w = aligned_view(*q).data;
    L.scales = static_cast<const float*>(aligned_view(*s).data);
    check_finite_weights(L.scales, DType::kF32, s->nbytes / 4, sn);
    L.group_size = gs;
    used_.insert(qn);
    used_.insert(sn);
  }

  // Finite weights of N rows of K weights in blocks of format f (`row0`: the first row's index in tensor `name`, for
  // the message): a block's codes are integers, so its values are finite exactly when its float16 scales are.
  void check_blocks_finite(const quant::GgmlBlockFormat& f, const uint8_t* data, int64_t N, int64_t K, int64_t row0,
                           const std::string& name) const {
    const int64_t per_row = K / f.block_size;
    for (int64_t b = 0; b < N * per_row; ++b) {
      if (quant::ggml_block_finite(f, data + b * f.block_bytes)) continue;
      std::vector<float> vals(static_cast<size_t>(f.block_size));
      f.decode(data + b * f.block_bytes, vals.data());
      const int64_t bad = find_nonfinite(vals.data(), DType::kF32, f.block_size);
      fail(ErrorCode::kCorrupt, kOp, where_, ": tensor '", name, "' must hold finite values; got ",
           vals[static_cast<size_t>(bad < 0 ? 0 : bad)], " at row ", b / per_row + row0, " column ",
           (b % per_row) * f.block_size + (bad < 0 ? 0 : bad), " (a non-finite ", f.name, " scale)");
    }
  }

  // A cider file converted with --weights native: module `hf` ("<module>.weight") as "<module>.gblocks", U8
  // (N, row bytes) of blocks in the engine's row order, its block type named by the metadata's "ggml_types"; nullptr
  // when the file holds the module as "<module>.weight" (bf16: the source's type had no kernels).
  const uint8_t* cider_blocks(const std::string& hf, int64_t N, int64_t K, uint32_t* type) {
    const std::string gn = hf.substr(0, hf.rfind(".weight")) + ".gblocks";
    const StTensor* t = st(gn);
    if (t == nullptr) return nullptr;
    const auto it = ggml_types_.find(gn);
    check(it != ggml_types_.end(), ErrorCode::kCorrupt, kOp, where_, ": tensor '", gn,
          "' must have its block type in the metadata's ggml_types; got no entry");
    const quant::GgmlBlockFormat* f = ggml_block_format_named(it->second);
    check(f != nullptr && f->integer_form, ErrorCode::kCorrupt, kOp, where_, ": tensor '", gn,
          "': ggml_types must name a block type with native kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, "
          "Q6_K); got \"", it->second, "\"");
    check(K % f->block_size == 0, ErrorCode::kCorrupt, kOp, where_, ": tensor '", gn, "' holds ", f->name,
          " blocks of ", f->block_size, " weights, which must divide its rows of ", K, "; got ", K % f->block_size,
          " left over");
    const int64_t rb = quant::ggml_row_bytes(*f, K);
    check(t->dtype == DType::kU8 && t->shape == std::vector<int64_t>{N, rb}, ErrorCode::kCorrupt, kOp, where_,
          ": tensor '", gn, "' must be U8 of shape ", shape_str({N, rb}), " (", N, " rows of ", rb, " bytes of ",
          f->name, " blocks); got ", safetensors_dtype_name(t->dtype), " of shape ", shape_str(t->shape), ", ",
          t->nbytes, " bytes");
    check_blocks_finite(*f, t->data, N, K, 0, gn);
    used_.insert(gn);
    *type = static_cast<uint32_t>(f->type);
    return t->data;  // stored in the engine's row order: no un-permuting, no regrouping
  }

  // --weights native: the GGUF tensor `hf` (N, K) kept in its block format when the format has kernels; nullptr
  // when it has none (the caller then takes the bf16 path). Every block's float16 scales are checked to be finite. q/k
  // of interleaved-head GGUF files get their rows un-permuted into owned memory. A cider source: cider_blocks.
  // Q3_K tensors come back re-encoded as Q6_K blocks (quant::repack_q3_k_as_q6_k: the same values bit for bit, run by
  // the Q6_K kernels), in owned memory; *repacked says so.
  const uint8_t* native_blocks(const std::string& hf, int64_t N, int64_t K, uint32_t* type, bool* repacked = nullptr) {
    if (repacked) *repacked = false;
    const uint8_t* blocks = stored_blocks(hf, N, K, type);
    if (blocks == nullptr || *type != static_cast<uint32_t>(quant::GgmlType::kQ3_K)) return blocks;
    const quant::GgmlBlockFormat& q3 = *quant::ggml_block_format(*type);
    const quant::GgmlBlockFormat& q6 = *quant::ggml_block_format(static_cast<uint32_t>(quant::GgmlType::kQ6_K));
    const int64_t nblocks = N * (K / q3.block_size);
    Tensor& copy = w_->owned.emplace_back(DType::kU8, std::vector<int64_t>{nblocks * q6.block_bytes});
    for (int64_t b = 0; b < nblocks; ++b)
      quant::repack_q3_k_as_q6_k(blocks + b * q3.block_bytes, copy.ptr<uint8_t>() + b * q6.block_bytes);
    *type = static_cast<uint32_t>(quant::GgmlType::kQ6_K);
    if (repacked) *repacked = true;
    return copy.ptr<uint8_t>();
  }
  // The blocks as the file stores them (types with kernels, and Q3_K), q/k rows un-permuted and regrouped.
  const uint8_t* stored_blocks(const std::string& hf, int64_t N, int64_t K, uint32_t* type) {
    if (kind_ == SourceKind::kCider) return cider_blocks(hf, N, K, type);
    // A part of a fused tensor is its rows: whole rows of whole blocks, used in place.
    const std::optional<FusedSlice> fs = fused_slice(hf);
    const int64_t rows = fs ? fs->total : N;
    const std::string gn = gguf_tensor_name(arch_, fs ? fs->hf : hf);
    const GGUFTensor* t = gguf_->find(gn);
    if (!t) missing(hf);
    const quant::GgmlBlockFormat* f = quant::ggml_block_format(t->type);
    if (f == nullptr || (!f->integer_form && f->type != quant::GgmlType::kQ3_K)) return nullptr;
    check_shape(gn, t->shape, fs && !fs->file_shape.empty() ? fs->file_shape : std::vector<int64_t>{rows, K});
    const int64_t rb = quant::ggml_row_bytes(*f, K);
    check(K % f->block_size == 0 && static_cast<int64_t>(t->nbytes) == rows * rb, ErrorCode::kCorrupt, kOp, where_,
          ": tensor '", gn, "' must hold ", rows * rb, " bytes of ", f->name, " blocks; got ", t->nbytes);
    used_.insert(gn);
    const uint8_t* data = t->data + (fs ? fs->row0 * rb : 0);
    check_blocks_finite(*f, data, N, K, fs ? fs->row0 : 0, gn);
    *type = t->type;
    // Rows regrouped (gated q_proj) and/or reordered (partial rotary): whole rows of blocks copied in that order.
    if (!fs && (row_gather(hf) || rotary_reordered(hf))) {
      check(!arch_.gguf_qk_interleaved, ErrorCode::kUnsupported, kOp, where_, ": ", gn,
            ": rows both interleaved by the converter and regrouped are not supported");
      const std::vector<int64_t> src = engine_row_order(hf, N);
      Tensor& copy = w_->owned.emplace_back(DType::kU8, std::vector<int64_t>{N * rb});
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(copy.ptr<uint8_t>() + n * rb, data + src[static_cast<size_t>(n)] * rb, static_cast<size_t>(rb));
      return copy.ptr<uint8_t>();
    }
    const bool permuted = arch_.gguf_qk_interleaved && (hf.find("self_attn.q_proj.") != std::string::npos ||
                                                        hf.find("self_attn.k_proj.") != std::string::npos);
    if (!permuted) return data;
    // The row order unpermute_gguf_heads gives, read off a column of row indices.
    const int64_t heads = hf.find("q_proj") != std::string::npos ? c_.num_heads : c_.num_kv_heads;
    std::vector<float> src(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) src[static_cast<size_t>(n)] = static_cast<float>(n);
    unpermute_gguf_heads(src.data(), heads, c_.head_dim, 1);
    Tensor& copy = w_->owned.emplace_back(DType::kU8, std::vector<int64_t>{N * rb});
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(copy.ptr<uint8_t>() + n * rb, data + static_cast<int64_t>(src[static_cast<size_t>(n)]) * rb,
                  static_cast<size_t>(rb));
    return copy.ptr<uint8_t>();
  }

  void count(const std::string& what) { ++w_->format_counts[what]; }

  Linear linear(const std::string& prefix, int64_t N, int64_t K, bool has_bias) {
    Linear L;
    L.name = prefix;
    L.N = N;
    L.K = K;
    const Linear::Kind kindw = weight_format_info(format_).kind;
    const bool converted_blocks = kindw == Linear::Kind::kGgml && kind_ == SourceKind::kCider &&
                                  st(prefix + ".gblocks") != nullptr;  // cider convert --weights q4_k, …
    if (format_ == WeightFormat::kNative || converted_blocks) {
      uint32_t type = 0;
      bool repacked = false;
      if (const uint8_t* blocks = native_blocks(prefix + ".weight", N, K, &type, &repacked)) {
        L.kind = Linear::Kind::kGgml;
        L.w = blocks;
        L.w_dtype = DType::kU8;
        L.ggml_type = type;
        count(repacked ? "Q3_K as Q6_K" : quant::ggml_block_format(type)->name);
      } else {  // a type without kernels (F32/F16/BF16): bf16, said in the load summary
        FloatRef r = fetch_float(prefix + ".weight", {N, K});
        L.kind = Linear::Kind::kDense;
        L.w_dtype = DType::kBF16;
        L.w = keep_as(r, DType::kBF16);
        count("bf16");
      }
      if (has_bias) L.bias = bias(prefix + ".bias", N);
      return L;
    }
    if (kind_ == SourceKind::kCider && st(prefix + ".qweight")) {
      cider_int(L);
    } else if (kindw != Linear::Kind::kDense && is_mlx_quantized(prefix)) {
      check(!rotary_reordered(prefix + ".weight"), ErrorCode::kUnsupported, kOp, where_, ": ", prefix,
            ": MLX-quantized q/k projections of a partial-rotary model (rotary dims ", c_.rope_dim(), " of ",
            c_.head_dim, ") are not supported; use --weights bf16 or a float checkpoint");
      check(!row_gather(prefix + ".weight"), ErrorCode::kUnsupported, kOp, where_, ": ", prefix,
            ": MLX-quantized projections whose rows cider regroups (gated attention) are not supported; use "
            "--weights bf16 or a float checkpoint");
      // MLX → int: dequantize in the scales' dtype (exact MLX arithmetic), requantize symmetrically. W4A8 keeps an
      // MLX group finer than ours.
      MlxTriple m = mlx_triple(prefix, N, K);
      Tensor deq = quant::affine_dequantize(m.packed, m.scales, m.biases, m.p.group_size, m.p.bits, m.scales.dtype);
      int gs = weight_format_info(format_).group_size;
      if (kindw == Linear::Kind::kInt4) gs = std::min(gs, m.p.group_size);
      quantize_into(L, deq.view(), gs);
    } else {
      check(!(kind_ == SourceKind::kCider && kindw != Linear::Kind::kDense), ErrorCode::kCorrupt, kOp, where_,
            ": tensor '", prefix, ".qweight' is missing (the file's weight format is ", cider_format_, ")");
      FloatRef r = fetch_float(prefix + ".weight", {N, K});
      if (kindw == Linear::Kind::kDense) {
        L.kind = Linear::Kind::kDense;
        L.w_dtype = weight_format_info(format_).dtype;
        L.w = keep_as(r, L.w_dtype);
      } else {
        quantize_into(L, r.view, weight_format_info(format_).group_size);
      }
    }
    if (has_bias) L.bias = bias(prefix + ".bias", N);
    return L;
  }

  // Wraps a step so that an error from below (a quantizer, a dequantizer) names the tensor it was working on.
  template <typename F>
  auto named(const std::string& what, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      const std::string msg = e.what();
      if (msg.rfind("[load]", 0) == 0) throw;
      throw Error(e.code(), "[load] " + where_ + ": " + what + ": " + msg);
    }
  }

  // A mixture-of-experts layer (ModelConfig::is_moe_layer): the router kept float32 (routing decides which experts
  // run: it is not quantized), every expert's gate/up/down in the weight format like any linear layer. Names from
  // the architecture (ArchSpec::moe).
  void moe_layer(const std::string& p, int64_t l, LayerWeights& L) {
    const ModelConfig& c = c_;
    const MoeNames& n = arch_.moe;
    check(n.router != nullptr, ErrorCode::kInternal, kOp, where_, ": architecture ", arch_.name,
          " has mixture-of-experts layers but no expert tensor names");
    const int64_t H = c.hidden_size, Ie = c.expert_intermediate_size, E = c.num_experts;
    const std::string rn = p + n.router;
    L.router = named(rn, [&] { return float32_linear(rn, E, H); });
    if (c.shared_expert_intermediate_size > 0) {  // Qwen3-Next: "mlp.shared_expert.*" and "mlp.shared_expert_gate"
      const int64_t Is = c.shared_expert_intermediate_size;
      const std::string sp = p + "mlp.shared_expert.";
      L.shared.gate = named(sp + "gate_proj", [&] { return linear(sp + "gate_proj", Is, H, false); });
      L.shared.up = named(sp + "up_proj", [&] { return linear(sp + "up_proj", Is, H, false); });
      L.shared.down = named(sp + "down_proj", [&] { return linear(sp + "down_proj", H, Is, false); });
      const std::string gn = p + "mlp.shared_expert_gate";
      L.shared_gate = named(gn, [&] { return float32_linear(gn, 1, H); });
    }
    L.experts.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + n.experts + std::to_string(e) + ".";
      LayerWeights::Expert& x = L.experts[static_cast<size_t>(e)];
      x.gate = named(ep + n.gate, [&] { return linear(ep + n.gate, Ie, H, false); });
      x.up = named(ep + n.up, [&] { return linear(ep + n.up, Ie, H, false); });
      x.down = named(ep + n.down, [&] { return linear(ep + n.down, H, Ie, false); });
    }
    (void)l;
  }

  // A small layer kept float32 whatever the weight format (routers, gates: they decide, they are not bulk).
  Linear float32_linear(const std::string& prefix, int64_t N, int64_t K) {
    FloatRef r = fetch_float(prefix + ".weight", {N, K});
    Linear L;
    L.name = prefix;
    L.kind = Linear::Kind::kDense;
    L.N = N;
    L.K = K;
    L.w_dtype = DType::kF32;
    L.w = keep_as(r, DType::kF32);
    return L;
  }

  // A gated DeltaNet layer (ModelConfig::is_linear_layer) under "<p>linear_attn.": the engine's q | k | v, z, b and a
  // projections (row_gather regroups Qwen3-Next's fused ones), the depthwise conv kernel, A_log, dt_bias, the output
  // norm and out_proj.
  void linear_attention_layer(const std::string& p, LayerWeights& L) {
    const ModelConfig::LinearAttention& la = c_.linear_attn;
    const int64_t H = c_.hidden_size, Hv = la.num_v_heads, C = la.conv_dim(), V = la.value_dim();
    const std::string q = p + "linear_attn.";
    auto lin = [&](const std::string& mod, int64_t N, int64_t K) {
      return named(mod, [&] { return linear(mod, N, K, false); });
    };
    L.lin_qkv = lin(q + "in_proj_qkv", C, H);
    L.lin_z = lin(q + "in_proj_z", V, H);
    L.lin_b = named(q + "in_proj_b", [&] { return float32_linear(q + "in_proj_b", Hv, H); });
    L.lin_a = named(q + "in_proj_a", [&] { return float32_linear(q + "in_proj_a", Hv, H); });
    L.lin_out = lin(q + "out_proj", H, V);
    auto f32 = [&](const std::string& name, std::vector<int64_t> shape) {
      return named(name, [&] {
        FloatRef r = fetch_float(name, shape);
        return static_cast<const float*>(keep_as(r, DType::kF32));
      });
    };
    // GGUF: the conv kernel squeezed to (C, K), and A = −exp(A_log) stored instead of A_log.
    L.conv_w = f32(q + "conv1d.weight", kind_ == SourceKind::kGGUF ? std::vector<int64_t>{C, la.conv_kernel}
                                                                    : std::vector<int64_t>{C, 1, la.conv_kernel});
    if (kind_ == SourceKind::kGGUF) {
      L.A_log = named(q + "A_log", [&] {
        FloatRef r = fetch_float(q + "A_log", {Hv});
        Tensor& out = w_->owned.emplace_back(DType::kF32, std::vector<int64_t>{Hv});
        for (int64_t h = 0; h < Hv; ++h) {
          const float A = load_float(r.view.data, r.view.dtype, h);
          check(A < 0.0f, ErrorCode::kCorrupt, kOp, where_, ": tensor '", file_name(q + "A_log"),
                "' holds the decay rates −exp(A_log), which must be negative; got ", A, " at ", h);
          out.ptr<float>()[h] = std::log(-A);
        }
        return static_cast<const float*>(out.ptr<float>());
      });
    } else {
      L.A_log = f32(q + "A_log", {Hv});
    }
    L.dt_bias = f32(q + "dt_bias", {Hv});
    L.lin_norm = named(q + "norm.weight", [&] { return norm(q + "norm.weight", la.v_head_dim); });
  }

  void build(Weights& w, const ProgressFn& progress) {
    w_ = &w;
    const ModelConfig& c = c_;
    const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
    const int64_t per_layer = 9 + (c.qk_norm ? 2 : 0) + (c.sandwich_norms ? 2 : 0);
    const int64_t total = 3 + c.num_layers * per_layer;
    int64_t done = 0;
    auto tick = [&] {
      ++done;
      if (progress) progress("load", done, total);
    };

    // Embedding: kept float. Dense formats hold it in their dtype; int formats keep the checkpoint's float dtype
    // (in place) — it is only read one row per token.
    const std::string en = "model.embed_tokens.weight";
    const WeightFormatInfo& finfo = weight_format_info(format_);
    const bool requant = finfo.ggml_body != 0;  // q8_0, q4_k, …
    // A tied head with second moments in --imatrix is GPTQ-coded on its own; the lookup keeps the source's
    // embedding (a GGUF file's blocks in place, else the float rows). A cider file stores such a head apart.
    head_apart_ = requant && c.tie_word_embeddings &&
                  (kind_ == SourceKind::kCider ? st("lm_head.gblocks") != nullptr
                                               : importance_ != nullptr && !importance_->gguf_names &&
                                                     importance_->second_moments.count("lm_head") != 0);
    if (format_ == WeightFormat::kNative || (head_apart_ && kind_ == SourceKind::kGGUF) ||
        (requant && kind_ == SourceKind::kCider && st("model.embed_tokens.gblocks") != nullptr)) {
      // Native: the embedding stays in its block format too (a row is decoded per token); a format with kernels
      // also serves as the tied LM head.
      uint32_t type = 0;
      const uint8_t* blocks = named(en, [&] { return native_blocks(en, c.vocab_size, H, &type); });
      if (blocks != nullptr) {
        w.embed_name = en;
        w.embed = blocks;
        w.embed_dtype = DType::kU8;
        w.embed_ggml_type = type;
      }
    }
    if (w.embed == nullptr && requant && c.tie_word_embeddings && kind_ != SourceKind::kCider && !head_apart_) {
      // A requantizing format with a tied head: the embedding is encoded once in the head's type and serves both, as
      // a GGUF file's does (a row decoded per looked-up token), instead of a float copy beside a block copy.
      named(en, [&] {
        FloatRef e = fetch_float(en, {c.vocab_size, H});
        Linear head;
        head.name = "lm_head";
        head.N = c.vocab_size;
        head.K = H;
        encode_blocks(head, e.view, finfo, /*counted=*/false);
        w.embed_name = en;
        w.embed = static_cast<const uint8_t*>(head.w);
        w.embed_dtype = DType::kU8;
        w.embed_ggml_type = head.ggml_type;
        return 0;
      });
    }
    if (w.embed == nullptr) named(en, [&] {
      FloatRef e = fetch_float(en, {c.vocab_size, H});
      DType dt = e.view.dtype;
      if (weight_format_info(format_).kind == WeightKind::kDense) dt = weight_format_info(format_).dtype;
      else if (e.temp && dt == DType::kF32) dt = DType::kBF16;
      else if (format_ == WeightFormat::kNative) dt = DType::kBF16;  // dequantized GGUF: bf16 is plenty for a lookup table
      w.embed_name = en;
      w.embed_dtype = dt;
      w.embed = keep_as(e, dt);
    });
    tick();

    const std::string prefix = "model.layers.";
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = prefix + std::to_string(l) + ".";
      LayerWeights L;
      auto nm = [&](const std::string& hf, int64_t dim) { return named(hf, [&] { return norm(hf, dim); }); };
      auto lin = [&](const std::string& mod, int64_t N, int64_t K, bool b) {
        return named(mod, [&] { return linear(mod, N, K, b); });
      };
      L.attn_norm = nm(p + "input_layernorm.weight", H); tick();
      if (c.is_linear_layer(l)) {
        linear_attention_layer(p, L);
        tick(); tick(); tick(); tick();
        if (c.qk_norm) { tick(); tick(); }
      } else {
        // Gated attention: q_proj also yields each head's gate (row_gather puts them after the queries).
        const int64_t qrows = (c.attn_output_gate ? 2 : 1) * c.num_heads * D;
        L.q = lin(p + "self_attn.q_proj", qrows, H, c.qkv_bias); tick();
        L.k = lin(p + "self_attn.k_proj", c.num_kv_heads * D, H, c.qkv_bias); tick();
        L.v = lin(p + "self_attn.v_proj", c.num_kv_heads * D, H, c.qkv_bias); tick();
        L.o = lin(p + "self_attn.o_proj", H, c.num_heads * D, c.o_bias); tick();
        if (c.qk_norm) {  // per head, or (OLMoE) over the whole projection
          L.q_norm = nm(p + "self_attn.q_norm.weight", c.qk_norm_full ? c.num_heads * D : D); tick();
          L.k_norm = nm(p + "self_attn.k_norm.weight", c.qk_norm_full ? c.num_kv_heads * D : D); tick();
        }
      }
      if (c.sandwich_norms) {
        L.post_attn_norm = nm(p + "post_attention_layernorm.weight", H); tick();
        L.mlp_norm = nm(p + "pre_feedforward_layernorm.weight", H); tick();
        L.post_mlp_norm = nm(p + "post_feedforward_layernorm.weight", H); tick();
      } else {
        L.mlp_norm = nm(p + "post_attention_layernorm.weight", H); tick();
      }
      if (c.is_moe_layer(l)) {
        moe_layer(p, l, L);
        tick(); tick(); tick();
        w.layers.push_back(std::move(L));
        continue;
      }
      L.gate = lin(p + "mlp.gate_proj", I, H, c.mlp_bias); tick();
      L.up = lin(p + "mlp.up_proj", I, H, c.mlp_bias); tick();
      L.down = lin(p + "mlp.down_proj", H, I, c.mlp_bias); tick();
      w.layers.push_back(std::move(L));
    }
    w.final_norm = named("model.norm.weight", [&] { return norm("model.norm.weight", H); });
    tick();

    // LM head.
    const Linear::Kind kindw = weight_format_info(format_).kind;
    if (head_apart_ && kind_ != SourceKind::kCider) {
      w.lm_head.name = "lm_head";
      w.lm_head.N = c.vocab_size;
      w.lm_head.K = H;
      named("lm_head (tied to the embedding, coded apart)", [&] {
        FloatRef e = fetch_float(en, {c.vocab_size, H});
        encode_blocks(w.lm_head, e.view, finfo);
        return 0;
      });
    } else if (c.tie_word_embeddings && !head_apart_ &&
               (format_ == WeightFormat::kNative || (requant && w.embed_ggml_type != 0))) {
      w.lm_head.name = "lm_head";
      w.lm_head.N = c.vocab_size;
      w.lm_head.K = H;
      if (w.embed_ggml_type != 0) {  // the embedding's blocks, read in place
        w.lm_head.kind = Linear::Kind::kGgml;
        w.lm_head.w = w.embed;
        w.lm_head.w_dtype = DType::kU8;
        w.lm_head.ggml_type = w.embed_ggml_type;
        w.head_is_embedding = true;
        count(quant::ggml_block_format(w.embed_ggml_type)->name);
      } else {  // a float embedding (bf16 here): the head reads it as is
        w.lm_head.kind = Linear::Kind::kDense;
        w.lm_head.w = w.embed;
        w.lm_head.w_dtype = w.embed_dtype;
        w.head_is_embedding = true;
        count("bf16");
      }
    } else if (!c.tie_word_embeddings) {
      w.lm_head = named("lm_head", [&] { return linear("lm_head", c.vocab_size, H, false); });
    } else if (kindw == Linear::Kind::kDense) {
      // Tied, dense: the head reads the embedding matrix itself (same dtype), no copy.
      w.lm_head.name = "lm_head";
      w.lm_head.kind = Linear::Kind::kDense;
      w.lm_head.N = c.vocab_size;
      w.lm_head.K = H;
      w.lm_head.w = w.embed;
      w.lm_head.w_dtype = w.embed_dtype;
      w.head_is_embedding = true;
    } else if (kind_ == SourceKind::kCider) {
      w.lm_head = named("lm_head", [&] { return linear("lm_head", c.vocab_size, H, false); });
    } else {
      // Tied, int formats: the head is a quantized copy of the embedding (it is the largest matmul of a decode step
      // for big vocabularies, so it follows --weights); the lookup keeps the float embedding.
      w.lm_head.name = "lm_head";
      w.lm_head.N = c.vocab_size;
      w.lm_head.K = H;
      named("lm_head (tied to the embedding)", [&] {
        quantize_into(w.lm_head, TensorView(w.embed, w.embed_dtype, {c.vocab_size, H}),
                      weight_format_info(format_).group_size);
      });
    }
    tick();
    if (c.tie_word_embeddings) used_.insert(file_name("lm_head.weight"));  // HF may store the tied copy too

    // Anything left over means the checkpoint and the config disagree (e.g. biases the config does not declare):
    // ignoring it would compute a different model.
    std::vector<std::string> names;
    if (kind_ == SourceKind::kGGUF) {
      for (const GGUFTensor& t : gguf_->tensors()) names.push_back(t.name);
    } else {
      names = st_->names();
    }
    for (const std::string& n : names) {
      if (used_.count(n)) continue;
      if (n.find("rotary_emb.inv_freq") != std::string::npos || n == "rope_freqs.weight" ||
          n == "rope_factors_long.weight" || n == "rope_factors_short.weight")
        continue;
      fail(ErrorCode::kCorrupt, kOp, where_, ": unexpected tensor '", n, "' (not part of a ",
           arch_.name, " model with this config: check attention_bias / mlp_bias / architecture)");
    }

    // Bytes of every weight the model uses.
    size_t bytes = w.embed_ggml_type != 0
                       ? static_cast<size_t>(c.vocab_size * quant::ggml_row_bytes(
                                                                *quant::ggml_block_format(w.embed_ggml_type), H))
                       : static_cast<size_t>(c.vocab_size * H * dtype_size(w.embed_dtype));
    auto add = [&](const Linear& L) { bytes += L.nbytes(); };
    auto addn = [&](const NormWeight& n) { bytes += static_cast<size_t>(n.dim) * sizeof(float); };
    for (const LayerWeights& L : w.layers) {
      for (const Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down, &L.lin_qkv, &L.lin_z, &L.lin_b,
                              &L.lin_a, &L.lin_out, &L.shared.gate, &L.shared.up, &L.shared.down, &L.shared_gate})
        if (x->w) add(*x);
      if (L.conv_w) {
        const ModelConfig::LinearAttention& la = c.linear_attn;
        bytes += static_cast<size_t>(la.conv_dim() * la.conv_kernel + 2 * la.num_v_heads) * sizeof(float);
        addn(L.lin_norm);
      }
      if (!L.experts.empty()) add(L.router);
      for (const LayerWeights::Expert& x : L.experts)
        for (const Linear* y : {&x.gate, &x.up, &x.down}) add(*y);
      for (const NormWeight* n : {&L.attn_norm, &L.q_norm, &L.k_norm, &L.post_attn_norm, &L.mlp_norm,
                                  &L.post_mlp_norm})
        addn(*n);
    }
    addn(w.final_norm);
    if (!w.head_is_embedding) add(w.lm_head);
    w.nbytes = bytes;
  }
};

// tokenizer_config.json and chat_template.jinja are read whole; real ones are below 1 MiB (templates of a few KiB,
// added-token tables of a few hundred).
constexpr int64_t kMaxTemplateBytes = int64_t{64} << 20;

// A special token of tokenizer_config.json: a string, or an AddedToken object {"content": ...}.
std::string token_string(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return "";
}

// The chat template of a Hugging Face directory: chat_template.jinja, else tokenizer_config.json's chat_template (a
// string, or a list of {name, template} of which "default" is taken), with its bos_token / eos_token strings.
void load_chat_template(const std::string& dir, Model::Impl& impl) {
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja)) impl.chat_template = read_text_input(jinja.string(), "load_chat_template", kMaxTemplateBytes);
  const fs::path tc = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(tc)) return;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_input(tc.string(), "load_chat_template", kMaxTemplateBytes));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kCorrupt, kOp, tc.string(), " must be JSON: ", e.what());
  }
  if (!j.is_object()) return;
  if (j.contains("bos_token")) impl.bos_token = token_string(j.at("bos_token"));
  if (j.contains("eos_token")) impl.eos_token = token_string(j.at("eos_token"));
  if (!impl.chat_template.empty() || !j.contains("chat_template")) return;
  const nlohmann::json& t = j.at("chat_template");
  if (t.is_string()) {
    impl.chat_template = t.get<std::string>();
  } else if (t.is_array()) {
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e.at("template").is_string())
        impl.chat_template = e.at("template").get<std::string>();
  }
}

void load_tokenizer_json(const std::string& dir, Model::Impl& impl) {
  const std::string tj = dir + "/tokenizer.json";
  const std::string tg = dir + "/tokenizer.gguf";
  if (fs::exists(tj)) {
    impl.tokenizer.emplace(Tokenizer::from_json_file(tj));
  } else if (fs::exists(tg)) {
    impl.tokenizer.emplace(Tokenizer::from_gguf(*GGUFFile::open(tg)));
  } else {
    impl.tokenizer_error = dir + " has no tokenizer.json";
  }
}

}  // namespace

WeightFormat default_weights(const std::string& path, Device device) {
  std::error_code ec;
  (void)device;  // both devices multiply a GGUF file's blocks as they are
  if (!fs::is_directory(path, ec)) return is_gguf_file(path) ? WeightFormat::kNative : WeightFormat::kBF16;
  // A cider directory converted with --weights native (or a block format: q8_0, q4_k, …): its one model.safetensors
  // (convert writes no shards) says so in its metadata (the header only is read). Anything else — a directory that does not open included — is bf16 here,
  // and loading it reports what is wrong.
  const fs::path single = fs::path(path) / "model.safetensors";
  if (!fs::exists(single, ec)) return WeightFormat::kBF16;
  try {
    const auto file = SafetensorsFile::open(single.string());
    const auto& meta = file->metadata();
    const auto fmt = meta.find("format"), wf = meta.find("weights");
    if (fmt != meta.end() && fmt->second == "cider" && wf != meta.end()) {
      const WeightFormat f = parse_weight_format(wf->second);
      if (weight_format_info(f).kind == WeightKind::kGgml) return f;  // native, or requantized into blocks (q4_k, …)
    }
  } catch (const Error&) {
  }
  return WeightFormat::kBF16;
}

void load_model_files(const std::string& path, WeightFormat format, const ProgressFn& progress, Model::Impl& impl) {
  std::error_code ec;
  check(fs::exists(path, ec), ErrorCode::kIo, kOp, "model path '", path, "' does not exist");
  // --imatrix weights the encoder's fits: only a requantizing block format encodes anything.
  const bool requantizing = weight_format_info(format).kind == Linear::Kind::kGgml;
  check(impl.options.imatrix.empty() || requantizing, ErrorCode::kInvalidArgument, kOp, "--imatrix weights the fits "
        "of a requantizing block format (--weights q8_0, q6_k, q5_1, q5_0, q4_k_m, q4_k, q4_1 or q4_0); got --weights ",
        weight_format_name(format));
  uint32_t head_type = 0;
  if (impl.options.head_weights) {
    const WeightFormatInfo& h = weight_format_info(*impl.options.head_weights);
    check(weight_format_info(format).ggml_body != 0, ErrorCode::kInvalidArgument, kOp,
          "--head-weights sets the LM head's block type of a requantizing format (--weights q8_0, q6_k, q5_1, q5_0, "
          "q4_k_m, q4_k, q4_1 or q4_0); got --weights ", weight_format_name(format));
    check(h.ggml_body != 0 && h.ggml_sensitive == 0, ErrorCode::kInvalidArgument, kOp,
          "--head-weights must name one block type: q8_0, q6_k, q5_1, q5_0, q4_k, q4_1 or q4_0; got ", h.name);
    head_type = h.ggml_body;
  }
  const Importance importance = impl.options.imatrix.empty() ? Importance{} : read_importance(impl.options.imatrix);
  const bool with_importance = !importance.layers.empty();
  // After the build: an importance file none of whose layers the model has belongs to another model.
  auto check_importance_used = [&](const Builder& b) {
    check(!with_importance || b.importance_used_ > 0, ErrorCode::kInvalidArgument, kOp, "--imatrix ",
          impl.options.imatrix, " names none of the linear layers of ", path, " (first: '",
          with_importance ? importance.layers.begin()->first : "", "'): an importance file of another model?");
  };
  if (fs::is_directory(path, ec)) {
    auto set = std::make_shared<const SafetensorsSet>(SafetensorsSet::open_dir(path));
    const auto& meta = set->metadata();
    const auto fmt_it = meta.find("format");
    const bool cider = fmt_it != meta.end() && fmt_it->second == "cider";
    // Native blocks come from a GGUF file, or from a cider directory converted from one (checked below).
    check(cider || format != WeightFormat::kNative, ErrorCode::kInvalidArgument, kOp, "--weights native keeps a GGUF "
          "file's blocks as they are; '", path, "' is a directory that is not a cider model converted with --weights "
          "native (use bf16, f32, w8a8, w8a8-g64/128/256 or w4a8)");
    SourceKind kind;
    std::string where = path;
    std::string cider_weights;
    std::map<std::string, std::string> ggml_types;
    if (cider) {
      kind = SourceKind::kCider;
      const auto ver = meta.find("version");
      check(ver != meta.end() && ver->second == "1", ErrorCode::kUnsupported, kOp, path,
            ": cider format version must be 1; got ", ver == meta.end() ? std::string("none") : ver->second);
      const auto cfg = meta.find("config");
      check(cfg != meta.end(), ErrorCode::kCorrupt, kOp, path, ": a cider model must carry its config in metadata");
      impl.config = config_from_json(cfg->second, path + " (metadata config)");
      const auto wf = meta.find("weights");
      check(wf != meta.end(), ErrorCode::kCorrupt, kOp, path, ": a cider model must name its weight format");
      cider_weights = wf->second;
      const WeightFormat file_format = parse_weight_format(cider_weights);
      check(!with_importance, ErrorCode::kInvalidArgument, kOp, path, ": a cider model's weights load as stored, "
            "with nothing to fit: --imatrix applies when converting (cider convert --weights ",
            weight_format_name(format), " --imatrix FILE)");
      check(file_format == format, ErrorCode::kInvalidArgument, kOp, path, ": this model was converted to ",
            cider_weights, " and loads only as that (no requantization); got --weights ", weight_format_name(format));
      if (const auto gt = meta.find("ggml_types"); gt != meta.end())
        ggml_types = parse_ggml_types(gt->second, *set, path);
      impl.source = "cider";
    } else {
      const std::string cfg_path = path + "/config.json";
      check(fs::exists(cfg_path), ErrorCode::kIo, kOp, path, " has no config.json");
      impl.config = load_hf_config(path);
      kind = SourceKind::kHF;
      impl.source = "hf";
    }
    Builder b(kind, impl.config, format, where);
    b.st_ = set;
    b.cider_format_ = cider_weights;
    b.ggml_types_ = std::move(ggml_types);
    if (kind == SourceKind::kHF) {
      b.mlx_ = parse_mlx_quantization(read_text_input(path + "/config.json", "load_config"), path + "/config.json");
      if (b.mlx_.present) {
        b.kind_ = SourceKind::kMLX;
        impl.source = "mlx";
      }
    }
    impl.w.keep_alive.push_back(set);
    check(kind != SourceKind::kCider || head_type == 0, ErrorCode::kInvalidArgument, kOp, path, ": a cider model's "
          "weights load as stored: --head-weights applies when converting (cider convert --weights ",
          weight_format_name(format), " --head-weights TYPE)");
    b.head_type_ = head_type;
    if (with_importance) b.importance_ = &importance;
    b.build(impl.w, progress);
    check_importance_used(b);
    load_tokenizer_json(path, impl);
    load_chat_template(path, impl);
    return;
  }
  check(is_gguf_file(path), ErrorCode::kUnsupported, kOp, "model path '", path,
        "' must be a model directory (config.json + safetensors) or a GGUF file");
  auto g = GGUFFile::open(path);
  impl.config = config_from_gguf(*g);
  if (const GGUFTensor* rf = g->find("rope_freqs.weight")) {
    // llama3-style rope scaling, stored by llama.cpp as per-frequency divisors.
    check(rf->shape == std::vector<int64_t>{impl.config.head_dim / 2}, ErrorCode::kShapeMismatch, kOp, path,
          ": tensor 'rope_freqs.weight' must have shape ", shape_str({impl.config.head_dim / 2}), "; got ",
          shape_str(rf->shape));
    std::vector<float> f(static_cast<size_t>(rf->numel()));
    dequantize_gguf_tensor(*rf, f.data());
    for (float v : f)
      check(v > 0 && std::isfinite(v), ErrorCode::kCorrupt, kOp, path, ": rope_freqs values must be positive; got ",
            v);
    impl.config.rope.freq_factors = f;
    if (!arch_spec(impl.config.arch).separate_local_rope) impl.config.rope_local.freq_factors = f;
  }
  const GGUFTensor* rope_long = g->find("rope_factors_long.weight");
  const GGUFTensor* rope_short = g->find("rope_factors_short.weight");
  if (rope_long || rope_short || impl.config.rope.scaling == RopeScaling::kLongRope) {
    // LongRoPE (Phi-3): llama.cpp's converter stores long_factor / short_factor as these two tensors, and the
    // attention factor and pre-training context as rope.scaling.attn_factor / original_context_length (config.cpp).
    check(rope_long && rope_short, ErrorCode::kCorrupt, kOp, path,
          ": LongRoPE scaling needs both tensors 'rope_factors_long.weight' and 'rope_factors_short.weight'; got ",
          rope_long ? "only the long one" : (rope_short ? "only the short one" : "neither"));
    auto factors = [&](const GGUFTensor& t) {
      check(t.shape == std::vector<int64_t>{impl.config.head_dim / 2}, ErrorCode::kShapeMismatch, kOp, path,
            ": tensor '", t.name, "' must have shape ", shape_str({impl.config.head_dim / 2}), "; got ",
            shape_str(t.shape));
      std::vector<float> f(static_cast<size_t>(t.numel()));
      dequantize_gguf_tensor(t, f.data());
      for (float v : f)
        check(v > 0 && std::isfinite(v), ErrorCode::kCorrupt, kOp, path, ": tensor '", t.name,
              "' must hold positive finite factors; got ", v);
      return f;
    };
    impl.config.rope.scaling = RopeScaling::kLongRope;
    impl.config.rope.long_factor = factors(*rope_long);
    impl.config.rope.short_factor = factors(*rope_short);
    if (!arch_spec(impl.config.arch).separate_local_rope) impl.config.rope_local = impl.config.rope;
  }
  impl.source = "gguf";
  Builder b(SourceKind::kGGUF, impl.config, format, path);
  b.gguf_ = g;
  impl.w.keep_alive.push_back(g);
  // The tokenizer first (cheap): a file whose tokenizer cannot name every row of the embedding would fail only when
  // generation samples such a row.
  try {
    impl.tokenizer.emplace(Tokenizer::from_gguf(*g));
  } catch (const Error& e) {
    // A GGUF without tokenizer metadata still runs on token ids; other tokenizer errors are real errors.
    if (g->has("tokenizer.ggml.tokens")) throw;
    impl.tokenizer_error = path + " has no tokenizer metadata (" + e.what() + ")";
  }
  if (g->has("tokenizer.chat_template")) impl.chat_template = g->get_string("tokenizer.chat_template");
  if (impl.tokenizer)
    check(impl.tokenizer->vocab_size() >= impl.config.vocab_size, ErrorCode::kCorrupt, kOp, path,
          ": tokenizer.ggml.tokens must name every token the model can produce (vocab_size ", impl.config.vocab_size,
          "); got ", impl.tokenizer->vocab_size(), " tokens");
  b.head_type_ = head_type;
  if (with_importance) b.importance_ = &importance;
  b.build(impl.w, progress);
  check_importance_used(b);
}

}  // namespace cider::model

namespace cider::model {

int interleave_for_kernels(Weights& w, const kernels::KernelTable& kt) {
  if (!kt.ggml_interleave) return 0;
  std::vector<Linear*> all;
  for (LayerWeights& L : w.layers) {
    for (Linear* l : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down, &L.shared.gate, &L.shared.up, &L.shared.down,
                      &L.lin_qkv, &L.lin_z, &L.lin_out})
      all.push_back(l);
    for (LayerWeights::Expert& e : L.experts)
      for (Linear* l : {&e.gate, &e.up, &e.down}) all.push_back(l);
  }
  all.push_back(&w.lm_head);
  // Bytes never rearranged: the embedding's [emb, emb_end) (a tied head's lookup reads its rows).
  const auto* emb = static_cast<const uint8_t*>(w.embed);
  const uint8_t* emb_end = emb;
  if (emb != nullptr) {
    const quant::GgmlBlockFormat* f = quant::ggml_block_format(w.embed_ggml_type);
    const int64_t row = f != nullptr ? quant::ggml_row_bytes(*f, w.lm_head.K)
                                     : w.lm_head.K * static_cast<int64_t>(dtype_size(w.embed_dtype));
    emb_end = emb + std::max<int64_t>(row * w.lm_head.N, 1);
  }
  std::map<const uint8_t*, const uint8_t*> done;  // ranges interleaved: [begin, end)
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  int count = 0;
  std::vector<uint8_t> tmp;
  for (Linear* L : all) {
    if (L->kind != Linear::Kind::kGgml || L->interleaved || L->w == nullptr || !quant::ggml_interleavable(L->ggml_type) ||
        L->N % quant::kGgmlInterleaveRows != 0)
      continue;
    const quant::GgmlBlockFormat& f = *quant::ggml_block_format(L->ggml_type);
    const auto bytes = static_cast<size_t>(L->N * quant::ggml_row_bytes(f, L->K));
    auto* src = static_cast<uint8_t*>(const_cast<void*>(L->w));
    if (auto it = done.find(src); it != done.end() && it->second == src + bytes) {  // the same tensor again
      L->interleaved = true;
      continue;
    }
    bool overlaps = src < emb_end && emb < src + bytes;
    for (const auto& [b, e] : done) overlaps |= src < e && b < src + bytes;
    if (overlaps) continue;
    bool own = false;  // bytes in the model's own buffers
    for (const Tensor& t : w.owned) {
      const auto* b = static_cast<const uint8_t*>(t.buffer.data());
      own |= src >= b && src + bytes <= b + t.buffer.nbytes();
    }
    // A file's pages (a private, read-only mapping) are made writable for the rewrite: each page written becomes the
    // process's own copy in place of the file's, so the resident set does not grow.
    const uintptr_t lo = reinterpret_cast<uintptr_t>(src) / page * page;
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(src) + bytes + page - 1) / page * page;
    if (!own && ::mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_READ | PROT_WRITE) != 0) continue;
    // Group by group: each group of 8 rows keeps its byte range (quant/ggml_interleave.h), so one group's copy is
    // all the scratch (a whole-tensor copy would add the largest tensor to the peak resident set). On the 2-core VM a
    // 7B's 4.4 GB take 10-11 s, most of it the first write of each page (a fresh page: copied from the file's, or
    // zero-filled where anonymous pages replaced them first, as long either way): --no-repack skips it.
    const size_t group = bytes / static_cast<size_t>(L->N / quant::kGgmlInterleaveRows);
    for (size_t off = 0; off < bytes; off += group) {
      tmp.assign(src + off, src + off + group);
      quant::ggml_interleave_rows(L->ggml_type, tmp.data(), quant::kGgmlInterleaveRows, L->K, src + off);
    }
    if (!own) ::mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_READ);
    done.emplace(src, src + bytes);
    L->interleaved = true;
    ++count;
  }
  return count;
}

}  // namespace cider::model
