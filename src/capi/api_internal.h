// The implementation side of the public interfaces (include/cider/cider.hpp and the model-level part of cider.h):
// the Impl structs behind the facade's handles and the operations both interfaces share, each taking the name of
// the operation its errors report ("session.decode" from C++, "cider_decode" from C).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cider/cider.hpp"
#include "core/error.h"
#include "core/tensor.h"
#include "model/model.h"
#include "model/sampler.h"

namespace cider {

struct Model::Impl {
  std::unique_ptr<model::Model> model;
  std::vector<int32_t> eos_ids;  // the config's and the tokenizer's (model::model_eos_ids)
  std::string architecture, weights, kv, device;
};

struct Session::Impl {
  std::shared_ptr<const Model::Impl> model;  // keeps the model alive
  std::unique_ptr<model::Session> session;
  std::vector<int32_t> history;  // tokens fed so far (the repetition penalty of generate())
};

struct Sampler::Impl {
  SamplerConfig config;
  model::Sampler sampler;
};

namespace api {

// Runs f(); an Error from inside (the engine's option parsers, the tokenizer, ...) gets `op` and `what` in front of
// its message: "[cider_model_load] weights: [parse_weight_format] ...".
template <typename F>
auto named(const char* op, const char* what, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    std::string message = "[";
    message += op;
    message += "] ";
    message += what;
    message += ": ";
    message += e.what();
    throw Error(e.code(), message);
  }
}

// The public options -> the engine's; cider::Error naming `op` and the option on anything invalid. Applies
// options.threads (process-wide).
model::ModelOptions engine_options(const ModelOptions& options, const char* op);
std::shared_ptr<Model::Impl> load_model(const std::string& path, const ModelOptions& options, const char* op);
ModelInfo model_info(const Model::Impl& m);
std::unique_ptr<Session::Impl> new_session(const std::shared_ptr<const Model::Impl>& m);

model::SamplerParams sampler_params(const SamplerConfig& c);
// Validates (op named in the message) and builds.
std::unique_ptr<Sampler::Impl> new_sampler(const SamplerConfig& c, const char* op);
int32_t sample(Sampler::Impl& s, const float* logits, int64_t vocab, std::span<const int32_t> history, const char* op);

// Validates everything a caller can get wrong (count, null pointers, ids, context, logits size) under `op`, then runs
// the model. logits_len: the floats `logits` holds.
void decode(Session::Impl& s, const int32_t* tokens, int64_t n, float* logits, size_t logits_len, bool all_logits,
            const char* op);
int64_t trim(Session::Impl& s, int64_t n, const char* op);

std::vector<int32_t> tokenize(const Model::Impl& m, std::string_view text, bool add_special, const char* op);
std::string detokenize(const Model::Impl& m, std::span<const int32_t> ids, bool skip_special, const char* op);

// A public tensor reference -> a view (rank <= 8, non-negative dims, data non-null unless empty). input: float
// inputs must be finite (-inf allowed where allow_neg_inf).
TensorView to_view(const TensorRef& t, const char* op, const char* what, bool input = false,
                   bool allow_neg_inf = false);

}  // namespace api
}  // namespace cider
