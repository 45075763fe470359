// C API: models, sessions, decoding, sampling and the tokenizer (include/cider/cider.h), on the C++ facade's
// implementation (api_internal.h) with the C functions' names in the error messages.
#include <algorithm>
#include <cstring>
#include <memory>

#include "capi/api_internal.h"
#include "capi/capi_internal.h"

struct cider_model {
  std::shared_ptr<cider::Model::Impl> impl;
};

struct cider_session {
  std::unique_ptr<cider::Session::Impl> impl;
};

struct cider_sampler {
  std::unique_ptr<cider::Sampler::Impl> impl;
};

namespace {

using cider::ErrorCode;
using cider::capi::check_out_ptr;
using cider::capi::guarded;

const cider::Model::Impl& model_of(const cider_model* m, const char* op) {
  cider::check(m != nullptr && m->impl != nullptr, ErrorCode::kInvalidArgument, op, "model must not be NULL");
  return *m->impl;
}

cider::Session::Impl& session_of(const cider_session* s, const char* op) {
  cider::check(s != nullptr && s->impl != nullptr, ErrorCode::kInvalidArgument, op, "session must not be NULL");
  return *s->impl;
}

}  // namespace

extern "C" {

cider_model_options cider_model_options_default(void) {
  cider_model_options o{};  /* every field NULL/0: the defaults */
  return o;
}

cider_status cider_model_load(const char* path, const cider_model_options* options, cider_model** out) {
  return guarded([&] {
    const char* op = "cider_model_load";
    check_out_ptr(out, op, "out");
    *out = nullptr;
    cider::check(path != nullptr, ErrorCode::kInvalidArgument, op, "path must not be NULL");
    cider::ModelOptions o;
    if (options) {
      if (options->weights) o.weights = options->weights;
      if (options->kv) o.kv.format = options->kv;
      if (options->kv_rotation) o.kv.rotation = options->kv_rotation;
      if (options->kv_layout) o.kv.key_layout = options->kv_layout;
      o.kv.key_outliers = options->kv_outliers;
      if (options->kv_values) o.kv.values = options->kv_values;
      if (options->kv_recent) o.kv.recent = options->kv_recent;
      if (options->imatrix) o.imatrix = options->imatrix;
      if (options->head_weights) o.head_weights = options->head_weights;
      o.kv.group_size = options->kv_group_size;
      o.ctx = options->ctx;
      if (options->device) o.device = options->device;
      o.threads = options->threads;
    }
    auto handle = std::make_unique<cider_model>();
    handle->impl = cider::api::load_model(path, o, op);
    *out = handle.release();
  });
}

void cider_model_free(cider_model* model) { delete model; }

cider_status cider_model_info_get(const cider_model* model, cider_model_info* out) {
  return guarded([&] {
    const char* op = "cider_model_info_get";
    const cider::Model::Impl& m = model_of(model, op);
    check_out_ptr(out, op, "out");
    const cider::ModelInfo info = cider::api::model_info(m);
    cider_model_info r{};
    r.vocab_size = info.vocab_size;
    r.context_length = info.context_length;
    r.hidden_size = info.hidden_size;
    r.num_layers = info.num_layers;
    r.num_heads = info.num_heads;
    r.num_kv_heads = info.num_kv_heads;
    r.head_dim = info.head_dim;
    r.bos_id = info.bos_id;
    const size_t n_eos = std::min<size_t>(info.eos_ids.size(), CIDER_MAX_EOS);
    r.num_eos = static_cast<int32_t>(n_eos);
    for (size_t i = 0; i < n_eos; ++i) r.eos_ids[i] = info.eos_ids[i];
    r.weight_bytes = info.weight_bytes;
    r.architecture = m.architecture.c_str();
    r.weights = m.weights.c_str();
    r.kv = m.kv.c_str();
    r.device = m.device.c_str();
    *out = r;
  });
}

cider_status cider_session_create(const cider_model* model, cider_session** out) {
  return guarded([&] {
    const char* op = "cider_session_create";
    model_of(model, op);
    check_out_ptr(out, op, "out");
    *out = new cider_session{cider::api::new_session(model->impl)};
  });
}

void cider_session_free(cider_session* session) { delete session; }

cider_status cider_session_position(const cider_session* session, int64_t* position) {
  return guarded([&] {
    const char* op = "cider_session_position";
    const cider::Session::Impl& s = session_of(session, op);
    check_out_ptr(position, op, "position");
    *position = s.session->position();
  });
}

cider_status cider_session_trim(cider_session* session, int64_t n, int64_t* removed) {
  return guarded([&] {
    const char* op = "cider_session_trim";
    const int64_t r = cider::api::trim(session_of(session, op), n, op);
    if (removed) *removed = r;
  });
}

cider_status cider_session_kv_bytes(const cider_session* session, size_t* nbytes) {
  return guarded([&] {
    const char* op = "cider_session_kv_bytes";
    const cider::Session::Impl& s = session_of(session, op);
    check_out_ptr(nbytes, op, "nbytes");
    *nbytes = s.session->kv_bytes();
  });
}

cider_status cider_decode(cider_session* session, const int32_t* tokens, int64_t n, float* logits, size_t logits_len,
                          int all_logits) {
  return guarded([&] {
    const char* op = "cider_decode";
    cider::api::decode(session_of(session, op), tokens, n, logits, logits_len, all_logits != 0, op);
  });
}

cider_sampler_params cider_sampler_params_default(void) {
  const cider::SamplerConfig c;
  cider_sampler_params p{};
  p.temperature = c.temperature;
  p.top_k = c.top_k;
  p.top_p = c.top_p;
  p.min_p = c.min_p;
  p.repeat_penalty = c.repeat_penalty;
  p.repeat_window = c.repeat_window;
  p.seed = c.seed;
  return p;
}

cider_status cider_sampler_create(const cider_sampler_params* params, cider_sampler** out) {
  return guarded([&] {
    const char* op = "cider_sampler_create";
    check_out_ptr(out, op, "out");
    cider::check(params != nullptr, ErrorCode::kInvalidArgument, op, "params must not be NULL");
    cider::SamplerConfig c;
    c.temperature = params->temperature;
    c.top_k = params->top_k;
    c.top_p = params->top_p;
    c.min_p = params->min_p;
    c.repeat_penalty = params->repeat_penalty;
    c.repeat_window = params->repeat_window;
    c.seed = params->seed;
    *out = new cider_sampler{cider::api::new_sampler(c, op)};
  });
}

void cider_sampler_free(cider_sampler* sampler) { delete sampler; }

cider_status cider_sample(cider_sampler* sampler, const float* logits, int64_t vocab, const int32_t* history,
                          int64_t n_history, int32_t* token_out) {
  return guarded([&] {
    const char* op = "cider_sample";
    cider::check(sampler != nullptr && sampler->impl != nullptr, ErrorCode::kInvalidArgument, op,
                 "sampler must not be NULL");
    check_out_ptr(token_out, op, "token_out");
    cider::check(n_history >= 0, ErrorCode::kInvalidArgument, op, "n_history must be >= 0; got ", n_history);
    cider::check(n_history == 0 || history != nullptr, ErrorCode::kInvalidArgument, op,
                 "history must not be NULL when n_history is ", n_history);
    const std::span<const int32_t> h(history, n_history ? static_cast<size_t>(n_history) : 0);
    *token_out = cider::api::sample(*sampler->impl, logits, vocab, h, op);
  });
}

cider_status cider_tokenize(const cider_model* model, const char* text, size_t text_len, int add_special,
                            int32_t* tokens, int64_t capacity, int64_t* n_tokens) {
  return guarded([&] {
    const char* op = "cider_tokenize";
    const cider::Model::Impl& m = model_of(model, op);
    check_out_ptr(n_tokens, op, "n_tokens");
    cider::check(text != nullptr || text_len == 0, ErrorCode::kInvalidArgument, op,
                 "text must not be NULL when text_len is ", text_len);
    cider::check(capacity >= 0, ErrorCode::kInvalidArgument, op, "capacity must be >= 0; got ", capacity);
    cider::check(tokens != nullptr || capacity == 0, ErrorCode::kInvalidArgument, op,
                 "tokens must not be NULL when capacity is ", capacity);
    const std::vector<int32_t> ids =
        cider::api::tokenize(m, std::string_view(text ? text : "", text_len), add_special != 0, op);
    const auto count = static_cast<int64_t>(ids.size());
    *n_tokens = count;
    cider::check(count <= capacity, ErrorCode::kOutOfRange, op, "tokens must hold the ", count,
                 " ids of the text; got capacity ", capacity);
    if (count) std::memcpy(tokens, ids.data(), ids.size() * sizeof(int32_t));
  });
}

cider_status cider_detokenize(const cider_model* model, const int32_t* tokens, int64_t n, int skip_special, char* text,
                              size_t capacity, size_t* text_len) {
  return guarded([&] {
    const char* op = "cider_detokenize";
    const cider::Model::Impl& m = model_of(model, op);
    check_out_ptr(text_len, op, "text_len");
    cider::check(n >= 0, ErrorCode::kInvalidArgument, op, "n must be >= 0; got ", n);
    cider::check(tokens != nullptr || n == 0, ErrorCode::kInvalidArgument, op, "tokens must not be NULL when n is ", n);
    cider::check(text != nullptr || capacity == 0, ErrorCode::kInvalidArgument, op,
                 "text must not be NULL when capacity is ", capacity);
    const std::string s = cider::api::detokenize(
        m, std::span<const int32_t>(tokens, n ? static_cast<size_t>(n) : 0), skip_special != 0, op);
    *text_len = s.size();
    cider::check(s.size() < capacity, ErrorCode::kOutOfRange, op, "text must hold the ", s.size() + 1,
                 " bytes of the text and its NUL; got capacity ", capacity);
    std::memcpy(text, s.c_str(), s.size() + 1);
  });
}

}  // extern "C"
