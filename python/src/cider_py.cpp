// cider._cider — the Python extension: the public C++ interface (include/cider/cider.hpp) over NumPy arrays, with
// nanobind. Deliberately thin: arrays arrive as (C-contiguous CPU array, cider dtype code) pairs chosen by the Python
// package (python/cider/__init__.py), which also allocates every output array, names the seeds' methods and
// converts dtypes (bfloat16 travels as a uint16 view). Long computations release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cider/cider.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Array = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

size_t dtype_bytes(int code) {
  switch (static_cast<cider::DType>(code)) {
    case cider::DType::kF32: case cider::DType::kU32: case cider::DType::kI32: return 4;
    case cider::DType::kF16: case cider::DType::kBF16: return 2;
    case cider::DType::kI8: case cider::DType::kU8: case cider::DType::kBool: return 1;
    default: return 0;
  }
}

// An array and the cider dtype its elements are read as (the item sizes must agree).
cider::TensorRef ref(const Array& a, int code, const char* what) {
  const size_t size = dtype_bytes(code);
  if (size == 0) throw cider::Error(cider::ErrorCode::kInvalidArgument,
                                    std::string("[cider python] ") + what + ": unsupported dtype code " +
                                        std::to_string(code));
  if (static_cast<size_t>(a.dtype().bits) != 8 * size)
    throw cider::Error(cider::ErrorCode::kInvalidArgument,
                       std::string("[cider python] ") + what + ": the array's items are " +
                           std::to_string(a.dtype().bits) + " bits; its dtype needs " + std::to_string(8 * size));
  std::vector<int64_t> shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<int64_t>(a.shape(i));
  return cider::TensorRef(a.data(), static_cast<cider::DType>(code), std::move(shape));
}

std::optional<cider::TensorRef> optional_ref(const std::optional<Array>& a, int code, const char* what) {
  if (!a) return std::nullopt;
  return ref(*a, code, what);
}

// A snapshot plane as (bytes of its data, dtype code, shape); the Python side views the bytes with the dtype.
nb::tuple plane_tuple(const cider::KVSnapshot& s, size_t i) {
  const cider::TensorRef t = s.plane(i);
  size_t n = dtype_bytes(static_cast<int>(t.dtype));
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  nb::bytes data(static_cast<const char*>(t.data), n);
  return nb::make_tuple(data, static_cast<int>(t.dtype), t.shape);
}

cider::SamplerConfig sampler_config(double temperature, int64_t top_k, double top_p, double min_p,
                                    double repeat_penalty, int64_t repeat_window, uint64_t seed) {
  cider::SamplerConfig c;
  c.temperature = temperature;
  c.top_k = top_k;
  c.top_p = top_p;
  c.min_p = min_p;
  c.repeat_penalty = repeat_penalty;
  c.repeat_window = repeat_window;
  c.seed = seed;
  return c;
}

nb::dict generation_dict(const cider::Generation& g) {
  nb::dict d;
  d["text"] = g.text;
  d["tokens"] = g.tokens;
  d["finish_reason"] = std::string(cider::stop_reason_name(g.reason));
  d["last_token_pending"] = g.last_token_pending;
  d["prompt_tokens"] = g.prompt_tokens;
  d["prompt_seconds"] = g.prompt_seconds;
  d["generation_seconds"] = g.generation_seconds;
  return d;
}

}  // namespace

NB_MODULE(_cider, m) {
  m.doc() = "cider's C++ interface (include/cider/cider.hpp); use the `cider` package, not this module";

  // cider::Error -> cider.Error (codes 1, 2, 4: also ValueError), set up by the package; std::bad_alloc ->
  // MemoryError (nanobind's default).
  static nb::object error_type, value_error_type;
  m.def("_set_error_types", [](nb::object error, nb::object value_error) {
    error_type = std::move(error);
    value_error_type = std::move(value_error);
  });
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const cider::Error& e) {
      const int code = static_cast<int>(e.code());
      const bool value = code == 1 || code == 2 || code == 4;
      nb::object type = value ? value_error_type : error_type;
      if (!type.is_valid()) throw;
      nb::object exc = type(std::string(e.what()), code);
      PyErr_SetObject(type.ptr(), exc.ptr());
    }
  });

  m.def("version", [] { return std::string(cider::version()); });
  m.def("set_threads", &cider::set_threads, "n"_a);
  m.def("threads", &cider::threads);
  m.def("max_threads", &cider::max_threads);

  // ---- MLX-compatible affine quantization ----
  m.def("affine_quantize", [](const Array& w, int wd, int group_size, int bits, const Array& packed,
                              const Array& scales, const Array& biases, int sd) {
    const auto wr = ref(w, wd, "w"), pr = ref(packed, 3, "packed"), sr = ref(scales, sd, "scales"),
               br = ref(biases, sd, "biases");
    nb::gil_scoped_release nogil;
    cider::affine_quantize(wr, group_size, bits, pr, sr, br);
  });
  m.def("affine_dequantize", [](const Array& packed, const Array& scales, const Array& biases, int sd,
                                int group_size, int bits, const Array& out, int od) {
    const auto pr = ref(packed, 3, "packed"), sr = ref(scales, sd, "scales"), br = ref(biases, sd, "biases"),
               orf = ref(out, od, "out");
    nb::gil_scoped_release nogil;
    cider::affine_dequantize(pr, sr, br, group_size, bits, orf);
  });
  m.def("quantized_matmul", [](const Array& x, int xd, const Array& w, const Array& scales, const Array& biases,
                               int sd, bool transpose, int group_size, int bits, const Array& out, int od) {
    const auto xr = ref(x, xd, "x"), wr = ref(w, 3, "w"), sr = ref(scales, sd, "scales"),
               br = ref(biases, sd, "biases"), orf = ref(out, od, "out");
    nb::gil_scoped_release nogil;
    cider::quantized_matmul(xr, wr, sr, br, transpose, group_size, bits, orf);
  });

  // ---- the KV cache and attention ----
  nb::class_<cider::KVSpec>(m, "KVSpec")
      .def(nb::init<>())
      .def_rw("format", &cider::KVSpec::format)
      .def_rw("rotation", &cider::KVSpec::rotation)
      .def_rw("group_size", &cider::KVSpec::group_size)
      .def_rw("key_layout", &cider::KVSpec::key_layout)
      .def_rw("key_outliers", &cider::KVSpec::key_outliers)
      .def_rw("values", &cider::KVSpec::values)
      .def_rw("recent", &cider::KVSpec::recent)
      .def_rw("seed", &cider::KVSpec::seed)
      .def_prop_rw(
          "scale_dtype", [](const cider::KVSpec& s) { return static_cast<int>(s.scale_dtype); },
          [](cider::KVSpec& s, int d) { s.scale_dtype = static_cast<cider::DType>(d); });

  nb::class_<cider::KVSnapshot>(m, "KVSnapshot")
      .def_prop_ro("length", &cider::KVSnapshot::length)
      .def_prop_ro("spec", &cider::KVSnapshot::spec)
      .def_prop_ro("num_planes", &cider::KVSnapshot::num_planes)
      .def("plane", &plane_tuple, "i"_a)
      .def_static("from_state", [](const cider::KVSpec& spec, const std::vector<std::pair<Array, int>>& planes) {
        std::vector<cider::TensorRef> refs;
        for (const auto& [a, code] : planes) refs.push_back(ref(a, code, "state array"));
        return cider::KVSnapshot::from_state(spec, refs);
      });

  nb::class_<cider::KVCache>(m, "KVCache")
      .def(nb::init<const cider::KVSpec&>(), "spec"_a)
      .def("append", [](cider::KVCache& c, const Array& k, int kd, const Array& v, int vd) {
        const auto kr = ref(k, kd, "keys"), vr = ref(v, vd, "values");
        nb::gil_scoped_release nogil;
        c.append(kr, vr);
      })
      .def_prop_ro("offset", &cider::KVCache::offset)
      .def("trim", &cider::KVCache::trim, "n"_a)
      .def_prop_ro("nbytes", &cider::KVCache::nbytes)
      .def_prop_ro("quantized", &cider::KVCache::quantized)
      .def_prop_ro("spec", &cider::KVCache::spec)
      .def("snapshot", &cider::KVCache::snapshot)
      .def("restore", &cider::KVCache::restore, "snapshot"_a);

  m.def("attention", [](const Array& q, int qd, const cider::KVCache& cache, float scale, int mask_kind,
                        int64_t window, const std::optional<Array>& mask, int mask_dtype, const Array& out, int od) {
    cider::AttentionMask am;
    am.kind = static_cast<cider::MaskKind>(mask_kind);
    am.window = window;
    am.mask = optional_ref(mask, mask_dtype, "mask");
    const auto qr = ref(q, qd, "queries"), orf = ref(out, od, "out");
    nb::gil_scoped_release nogil;
    cider::attention(qr, cache, scale, am, orf);
  });

  // ---- linear layers ----
  nb::class_<cider::Linear>(m, "Linear")
      .def_static("from_float", [](int format, const Array& w, int wd, const std::optional<Array>& bias, int bd,
                                   int group_size, std::optional<float> clip) {
        const auto wr = ref(w, wd, "w");
        const auto br = optional_ref(bias, bd, "bias");
        nb::gil_scoped_release nogil;
        return cider::Linear::from_float(static_cast<cider::LinearFormat>(format), wr, br, group_size, clip);
      })
      .def_static("from_mlx", [](int format, const Array& packed, const Array& scales, const Array& biases, int sd,
                                 int group_size, int bits, const std::optional<Array>& bias, int bd,
                                 std::optional<int> target_group_size, std::optional<float> clip) {
        const auto pr = ref(packed, 3, "packed"), sr = ref(scales, sd, "scales"), br = ref(biases, sd, "biases");
        const auto lb = optional_ref(bias, bd, "bias");
        nb::gil_scoped_release nogil;
        return cider::Linear::from_mlx(static_cast<cider::LinearFormat>(format), pr, sr, br, group_size, bits, lb,
                                       target_group_size, clip);
      })
      .def("forward", [](const cider::Linear& l, const Array& x, int xd, const Array& out, int od) {
        const auto xr = ref(x, xd, "x"), orf = ref(out, od, "out");
        nb::gil_scoped_release nogil;
        l.forward(xr, orf);
      })
      .def_prop_ro("format", [](const cider::Linear& l) { return static_cast<int>(l.format()); })
      .def_prop_ro("in_features", &cider::Linear::in_features)
      .def_prop_ro("out_features", &cider::Linear::out_features)
      .def_prop_ro("group_size", &cider::Linear::group_size)
      .def_prop_ro("nbytes", &cider::Linear::nbytes);

  // ---- models, sessions, generation ----
  nb::class_<cider::Session>(m, "Session")
      .def_prop_ro("position", &cider::Session::position)
      .def("trim", &cider::Session::trim, "n"_a)
      .def_prop_ro("kv_bytes", &cider::Session::kv_bytes)
      .def("decode", [](cider::Session& s, const std::vector<int32_t>& tokens, const Array& out, bool all_logits) {
        auto* p = static_cast<float*>(const_cast<void*>(out.data()));
        const std::span<float> logits(p, out.size());
        nb::gil_scoped_release nogil;
        s.decode(tokens, logits, all_logits);
      })
      .def("generate", [](cider::Session& s, const std::vector<int32_t>& prompt, int64_t max_tokens,
                          const std::vector<std::string>& stop, const std::vector<int32_t>& stop_tokens,
                          double temperature, int64_t top_k, double top_p, double min_p, double repeat_penalty,
                          int64_t repeat_window, uint64_t seed, int64_t prefill_chunk,
                          const std::optional<nb::callable>& on_text) {
        cider::GenerateConfig c;
        c.max_tokens = max_tokens;
        c.stop = stop;
        c.stop_tokens = stop_tokens;
        c.sampler = sampler_config(temperature, top_k, top_p, min_p, repeat_penalty, repeat_window, seed);
        c.prefill_chunk = prefill_chunk;
        cider::TextCallback cb;
        if (on_text) cb = [&](std::string_view piece) {
          nb::gil_scoped_acquire gil;
          (*on_text)(nb::str(piece.data(), piece.size()));
        };
        cider::Generation g;
        {
          nb::gil_scoped_release nogil;
          g = s.generate(prompt, c, cb);
        }
        return generation_dict(g);
      });

  nb::class_<cider::Model>(m, "Model")
      .def_static("load", [](const std::string& path, const std::string& weights, const cider::KVSpec& kv,
                             int64_t ctx, const std::string& device, int threads, const std::string& imatrix,
                             const std::string& head_weights) {
        cider::ModelOptions o;
        o.weights = weights;
        o.imatrix = imatrix;
        o.head_weights = head_weights;
        o.kv = kv;
        o.ctx = ctx;
        o.device = device;
        o.threads = threads;
        nb::gil_scoped_release nogil;
        return cider::Model::load(path, o);
      })
      .def("info", [](const cider::Model& model) {
        const cider::ModelInfo i = model.info();
        nb::dict d;
        d["architecture"] = i.architecture;
        d["vocab_size"] = i.vocab_size;
        d["context_length"] = i.context_length;
        d["hidden_size"] = i.hidden_size;
        d["num_layers"] = i.num_layers;
        d["num_heads"] = i.num_heads;
        d["num_kv_heads"] = i.num_kv_heads;
        d["head_dim"] = i.head_dim;
        d["bos_id"] = i.bos_id;
        d["eos_ids"] = i.eos_ids;
        d["weight_bytes"] = i.weight_bytes;
        d["weights"] = i.weights;
        d["kv"] = i.kv;
        d["device"] = i.device;
        return d;
      })
      .def("tokenize", [](const cider::Model& model, std::string_view text, bool add_special) {
        return model.tokenize(text, add_special);
      })
      .def("detokenize", [](const cider::Model& model, const std::vector<int32_t>& ids, bool skip_special) {
        return model.detokenize(ids, skip_special);
      })
      .def("chat_prompt", [](const cider::Model& model, const std::vector<std::pair<std::string, std::string>>& msgs) {
        std::vector<cider::ChatMessage> ms;
        for (const auto& [role, content] : msgs) ms.push_back({role, content});
        return model.chat_prompt(ms);
      })
      .def("chat_format", &cider::Model::chat_format)
      .def("chat_end_tokens", &cider::Model::chat_end_tokens)
      .def("new_session", &cider::Model::new_session)
      .def("perplexity", [](const cider::Model& model, std::string_view text, int64_t ctx, int64_t stride,
                            const cider::Model* baseline) {
        cider::PerplexityConfig c;
        c.ctx = ctx;
        c.stride = stride;
        cider::PerplexityReport r;
        {
          nb::gil_scoped_release nogil;
          r = cider::perplexity(model, text, c, baseline);
        }
        nb::dict d;
        d["windows"] = r.windows;
        d["tokens_scored"] = r.tokens_scored;
        d["ppl"] = r.ppl;
        d["ppl_stderr"] = r.ppl_stderr;
        d["nll"] = r.nll;
        d["has_baseline"] = r.has_baseline;
        d["base_ppl"] = r.base_ppl;
        d["base_ppl_stderr"] = r.base_ppl_stderr;
        d["kl"] = r.kl;
        d["kl_stderr"] = r.kl_stderr;
        d["top1"] = r.top1;
        d["report"] = r.report;
        return d;
      }, "text"_a, "ctx"_a, "stride"_a, "baseline"_a.none());
}
