// Activation statistics and the importance file (model/activation_stats.h).
#include "model/activation_stats.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/gguf.h"
#include "model/safetensors.h"

namespace cider::model {

namespace {

constexpr const char* kSuffix = ".act_sq";
constexpr const char* kReadOp = "read_importance";

// `name` without `suffix`, or "" when it does not end with it (or is nothing else).
std::string strip_suffix(const std::string& name, const std::string& suffix) {
  const bool ends = name.size() > suffix.size() &&
                    name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  return ends ? name.substr(0, name.size() - suffix.size()) : std::string();
}

// K float32 values of tensor `name` of file `path` (possibly unaligned), each finite and >= 0 (`what` they are).
std::vector<float> read_values(const uint8_t* data, int64_t K, const std::string& path, const std::string& name,
                               const char* what) {
  std::vector<float> v(static_cast<size_t>(K));
  std::memcpy(v.data(), data, v.size() * sizeof(float));
  for (size_t k = 0; k < v.size(); ++k)
    check(std::isfinite(v[k]) && v[k] >= 0.0f, ErrorCode::kCorrupt, kReadOp, path, ": tensor '", name,
          "' must hold finite ", what, " >= 0; got ", v[k], " at channel ", k);
  return v;
}

}  // namespace

void ActivationStats::add(const std::string& layer, const float* x, int64_t rows, int64_t K) {
  Entry& e = layers_[layer];
  if (e.sum_sq.empty()) e.sum_sq.assign(static_cast<size_t>(K), 0.0);
  check(static_cast<int64_t>(e.sum_sq.size()) == K, ErrorCode::kShapeMismatch, "activation_stats", "layer '", layer,
        "' had inputs of ", e.sum_sq.size(), " channels; got ", K);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const double v = x[r * K + k];
      e.sum_sq[static_cast<size_t>(k)] += v * v;
    }
  e.rows += rows;
}

int64_t ActivationStats::rows(const std::string& layer) const {
  const auto it = layers_.find(layer);
  return it == layers_.end() ? 0 : it->second.rows;
}

std::vector<float> ActivationStats::mean_square(const std::string& layer) const {
  const auto it = layers_.find(layer);
  if (it == layers_.end() || it->second.rows == 0) return {};
  std::vector<float> m(it->second.sum_sq.size());
  for (size_t k = 0; k < m.size(); ++k)
    m[k] = static_cast<float>(it->second.sum_sq[k] / static_cast<double>(it->second.rows));
  return m;
}

std::vector<std::string> ActivationStats::layers() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : layers_)
    if (e.rows > 0) out.push_back(name);
  return out;
}

void ActivationStats::write(const std::string& path, int64_t tokens, const std::string& text) const {
  std::vector<std::vector<float>> means;  // alive until write() returns
  means.reserve(layers_.size());
  SafetensorsWriter w;
  for (const std::string& name : layers()) {
    means.push_back(mean_square(name));
    w.add(name + kSuffix, DType::kF32, {static_cast<int64_t>(means.back().size())}, means.back().data());
    w.set_metadata("rows_" + name, std::to_string(rows(name)));
  }
  check(!means.empty(), ErrorCode::kInvalidArgument, "imatrix", "no linear layer saw an input: nothing to write to '",
        path, "'");
  w.set_metadata("format", "cider-imatrix");
  w.set_metadata("version", "1");
  w.set_metadata("tokens", std::to_string(tokens));
  w.set_metadata("text", text);
  w.write(path);
}

namespace {

// llama.cpp's imatrix GGUF (model/activation_stats.h).
Importance read_llama_imatrix(const std::string& path) {
  constexpr const char* op = kReadOp;
  const auto g = GGUFFile::open(path);
  const std::string type = g->has("general.type") ? g->get_string("general.type") : std::string();
  check(type == "imatrix", ErrorCode::kCorrupt, op, path,
        ": a GGUF importance file (llama-imatrix's) must have general.type = \"imatrix\"; got \"", type, "\"");
  Importance out;
  out.gguf_names = true;
  for (const GGUFTensor& t : g->tensors()) {
    const std::string base = strip_suffix(t.name, ".in_sum2");
    if (base.empty()) continue;
    const GGUFTensor* c = g->find(base + ".counts");
    check(c != nullptr, ErrorCode::kCorrupt, op, path, ": tensor '", t.name, "' has no '", base, ".counts' beside it");
    // (n_mat, K), or (K) for one matrix (a GGUF writer drops trailing dimensions of 1)
    const bool rank_ok = t.shape.size() == 1 || t.shape.size() == 2;
    check(t.type == static_cast<uint32_t>(GGMLType::kF32) && rank_ok && t.shape.back() > 0 && t.shape.front() > 0,
          ErrorCode::kCorrupt, op, path, ": tensor '", t.name, "' must be F32 of shape (n_mat, K) or (K)");
    const int64_t n_mat = t.shape.size() == 2 ? t.shape[0] : 1;
    check(c->type == static_cast<uint32_t>(GGMLType::kF32) && c->numel() == n_mat, ErrorCode::kCorrupt, op, path,
          ": tensor '", c->name, "' must be F32 with one count per matrix (", n_mat, ")");
    if (n_mat != 1) continue;  // stacked experts: not used
    const int64_t K = t.shape.back();
    float count = 0.0f;
    std::memcpy(&count, c->data, sizeof(float));
    check(std::isfinite(count) && count >= 0.0f, ErrorCode::kCorrupt, op, path, ": tensor '", c->name,
          "' must hold a count >= 0; got ", count);
    std::vector<float> v = read_values(t.data, K, path, t.name, "sums of squares");
    for (float& x : v) x = count > 0.0f ? x / count : 0.0f;
    out.layers[base] = std::move(v);
  }
  check(!out.layers.empty(), ErrorCode::kCorrupt, op, path, ": holds no layer (\"<weight>.in_sum2\" of one matrix)");
  return out;
}

}  // namespace

Importance read_importance(const std::string& path) {
  constexpr const char* op = kReadOp;
  if (is_gguf_file(path)) return read_llama_imatrix(path);
  const SafetensorsSet set = SafetensorsSet::open_file(path);
  const auto& meta = set.metadata();
  const auto fmt = meta.find("format");
  check(fmt != meta.end() && fmt->second == "cider-imatrix", ErrorCode::kCorrupt, op, path,
        ": an importance file (from `cider imatrix`) must have metadata format = \"cider-imatrix\"; got ",
        fmt == meta.end() ? std::string("none") : "\"" + fmt->second + "\"");
  const auto ver = meta.find("version");
  check(ver != meta.end() && ver->second == "1", ErrorCode::kCorrupt, op, path, ": version must be 1; got ",
        ver == meta.end() ? std::string("none") : ver->second);
  Importance out;
  for (const std::string& name : set.names()) {
    const StTensor* t = set.find(name);
    const std::string module = strip_suffix(name, kSuffix);
    check(!module.empty(), ErrorCode::kCorrupt, op, path, ": tensor '", name, "' must be named \"<module>", kSuffix,
          "\"");
    check(t->dtype == DType::kF32 && t->shape.size() == 1 && t->shape[0] > 0, ErrorCode::kCorrupt, op, path,
          ": tensor '", name, "' must be F32 of one dimension (the layer's input channels); got ",
          safetensors_dtype_name(t->dtype), " of rank ", t->shape.size());
    out.layers[module] = read_values(t->data, t->shape[0], path, name, "mean squares");
  }
  check(!out.layers.empty(), ErrorCode::kCorrupt, op, path, ": holds no layer");
  return out;
}

}  // namespace cider::model
