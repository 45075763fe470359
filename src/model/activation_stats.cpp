// Activation statistics and the importance file (model/activation_stats.h).
#include "model/activation_stats.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/gguf.h"
#include "model/safetensors.h"

namespace cider::model {

namespace {

constexpr const char* kSuffix = ".act_sq";
constexpr const char* kHessianSuffix = ".hessian";
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
  const bool first = e.sum_sq.empty();
  if (first) e.sum_sq.assign(static_cast<size_t>(K), 0.0);
  check(static_cast<int64_t>(e.sum_sq.size()) == K, ErrorCode::kShapeMismatch, "activation_stats", "layer '", layer,
        "' had inputs of ", e.sum_sq.size(), " channels; got ", K);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const double v = x[r * K + k];
      e.sum_sq[static_cast<size_t>(k)] += v * v;
    }
  e.rows += rows;
  if (K > second_moments_max_k_) {  // none for this layer (nor a share with the next)
    last_layer_.clear();
    return;
  }
  if (first) {  // whether it shares: FNV-1a over the input's bytes and shape, equal to the previous first call's
    uint64_t h = 1469598103934665603ull;
    const auto* bytes = reinterpret_cast<const uint8_t*>(x);
    for (size_t i = 0; i < static_cast<size_t>(rows * K) * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(rows)) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(K)) * 1099511628211ull;
    if (!last_layer_.empty() && h == last_hash_ && layers_.at(last_layer_).sum_sq.size() == static_cast<size_t>(K))
      e.shares = last_layer_;
    last_hash_ = h;
    last_layer_ = e.shares.empty() ? layer : e.shares;
  } else {
    last_layer_.clear();  // sharing is settled on a layer's first call
  }
  if (!e.shares.empty()) return;  // its leader's Σ x xᵀ (accumulated by the leader's own call)
  const auto k = static_cast<size_t>(K);
  if (e.sum_xxt.empty()) e.sum_xxt.assign(k * k, 0.0f);
  // Σ x xᵀ over these rows, upper triangle: dots of the transposed input's columns (float sums per call).
  std::vector<float> xt(k * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < K; ++c) xt[static_cast<size_t>(c) * static_cast<size_t>(rows) + static_cast<size_t>(r)] =
        x[r * K + c];
  float* H = e.sum_xxt.data();
  const auto R = static_cast<size_t>(rows);
  // Row i holds K − i dots: rows i and K − 1 − i go to the same task, so the tasks are even.
  auto dots_of_row = [&](int64_t i) {
    const float* xi = xt.data() + static_cast<size_t>(i) * R;
    for (int64_t j = i; j < K; ++j) {
      const float* xj = xt.data() + static_cast<size_t>(j) * R;
      float s[16] = {};  // sixteen running sums: vectorizable
      size_t r = 0;
      for (; r + 16 <= R; r += 16)
        for (int l = 0; l < 16; ++l) s[l] += xi[r + l] * xj[r + l];
      for (; r < R; ++r) s[0] += xi[r] * xj[r];
      double t = 0.0;
      for (const float v : s) t += v;
      H[static_cast<size_t>(i) * k + static_cast<size_t>(j)] += static_cast<float>(t);
    }
  };
  default_thread_pool().parallel_for((K + 1) / 2, [&](int64_t b0, int64_t b1, int) {
    for (int64_t p = b0; p < b1; ++p) {
      dots_of_row(p);
      if (K - 1 - p != p) dots_of_row(K - 1 - p);
    }
  });
}

int64_t ActivationStats::second_moment_layers() const {
  int64_t n = 0;
  for (const auto& [name, e] : layers_) n += (!e.sum_xxt.empty() || !e.shares.empty()) ? 1 : 0;
  return n;
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
  means.reserve(2 * layers_.size());
  SafetensorsWriter w;
  for (const std::string& name : layers()) {
    means.push_back(mean_square(name));
    const auto K = static_cast<int64_t>(means.back().size());
    w.add(name + kSuffix, DType::kF32, {K}, means.back().data());
    w.set_metadata("rows_" + name, std::to_string(rows(name)));
    const Entry& e = layers_.at(name);
    if (!e.shares.empty()) {
      w.set_metadata("hessian_of_" + name, e.shares);
    } else if (!e.sum_xxt.empty()) {  // the mean of x xᵀ, both triangles
      const auto k = static_cast<size_t>(K);
      std::vector<float>& m = means.emplace_back(k * k);
      const double inv = 1.0 / static_cast<double>(e.rows);
      for (size_t i = 0; i < k; ++i)
        for (size_t j = i; j < k; ++j)
          m[i * k + j] = m[j * k + i] = static_cast<float>(static_cast<double>(e.sum_xxt[i * k + j]) * inv);
      w.add(name + kHessianSuffix, DType::kF32, {K, K}, m.data());
    }
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
    if (const std::string of = strip_suffix(name, kHessianSuffix); !of.empty()) {
      const StTensor* d = set.find(of + kSuffix);
      check(d != nullptr && t->dtype == DType::kF32 && t->shape.size() == 2 && t->shape[0] == d->shape[0] &&
                t->shape[1] == d->shape[0],
            ErrorCode::kCorrupt, op, path, ": tensor '", name, "' must be F32 (K, K) beside '", of, kSuffix,
            "' of K values");
      const int64_t K = t->shape[0];
      auto m = std::make_shared<std::vector<float>>(static_cast<size_t>(K * K));
      std::memcpy(m->data(), t->data, m->size() * sizeof(float));
      for (int64_t i = 0; i < K * K; ++i)
        check(std::isfinite((*m)[static_cast<size_t>(i)]) && (i % (K + 1) != 0 || (*m)[static_cast<size_t>(i)] >= 0.0f),
              ErrorCode::kCorrupt, op, path, ": tensor '", name, "' must hold finite second moments (diagonal >= 0); "
              "got ", (*m)[static_cast<size_t>(i)], " at (", i / K, ", ", i % K, ")");
      out.second_moments[of] = std::move(m);
      continue;
    }
    const std::string module = strip_suffix(name, kSuffix);
    check(!module.empty(), ErrorCode::kCorrupt, op, path, ": tensor '", name, "' must be named \"<module>", kSuffix,
          "\"");
    check(t->dtype == DType::kF32 && t->shape.size() == 1 && t->shape[0] > 0, ErrorCode::kCorrupt, op, path,
          ": tensor '", name, "' must be F32 of one dimension (the layer's input channels); got ",
          safetensors_dtype_name(t->dtype), " of rank ", t->shape.size());
    out.layers[module] = read_values(t->data, t->shape[0], path, name, "mean squares");
  }
  check(!out.layers.empty(), ErrorCode::kCorrupt, op, path, ": holds no layer");
  for (const auto& [key, value] : meta) {  // layers fed the same input as another: its second moments
    const std::string module = key.rfind("hessian_of_", 0) == 0 ? key.substr(11) : std::string();
    if (module.empty()) continue;
    const auto it = out.second_moments.find(value);
    const auto own = out.layers.find(module);
    check(it != out.second_moments.end() && own != out.layers.end() &&
              it->second->size() == own->second.size() * own->second.size(),
          ErrorCode::kCorrupt, op, path, ": metadata '", key, "' must name a layer with second moments of the same K; "
          "got '", value, "'");
    out.second_moments[module] = it->second;
  }
  return out;
}

}  // namespace cider::model
