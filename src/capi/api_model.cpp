// The C++ facade (include/cider/cider.hpp): models, sessions, sampling and generation on top of model::Model,
// model::generate and model::Sampler; and the shared operations the C API (capi_model.cpp) calls with its own names.
#include <algorithm>
#include <utility>

#include "capi/api_internal.h"
#include "core/thread_pool.h"
#include "model/chat_format.h"
#include "model/generate.h"
#include "model/perplexity.h"
#include "model/tokenizer.h"

namespace cider {
namespace api {

namespace {

void check_threads(int n, const char* op) {
  const int hi = max_num_threads();
  check(n >= 1 && n <= hi, ErrorCode::kInvalidArgument, op, "threads must be in [1, ", hi,
        "] (at most 4 per CPU this process may use); got ", n);
}

}  // namespace

model::ModelOptions engine_options(const ModelOptions& options, const char* op) {
  model::ModelOptions o;
  o.weights = options.weights.empty() ? model::WeightFormat::kBF16  // load_model applies model::default_weights
                                      : named(op, "weights", [&] { return model::parse_weight_format(options.weights); });
  o.device = named(op, "device", [&] { return model::parse_device(options.device); });
  o.kv = options.kv.format.empty() ? model::default_kv(o.device)
                                   : named(op, "kv.format", [&] { return model::parse_kv_format(options.kv.format); });
  const int gs = options.kv.group_size;
  // The engine's default only when nothing of the cache was chosen (then Model::load may adapt it to the model).
  o.kv.device_default = options.kv.format.empty() && options.kv.rotation.empty() && options.kv.key_layout.empty() &&
                        options.kv.key_outliers == 0 && gs == 0 && options.kv.values.empty() &&
                        options.kv.recent.empty();
  check(gs == 0 || gs == 32 || gs == 64 || gs == 128, ErrorCode::kInvalidArgument, op,
        "kv.group_size must be 0 (automatic), 32, 64 or 128; got ", gs);
  if (!options.kv.rotation.empty()) {
    const nn::RotationKind r = named(op, "kv.rotation", [&] { return model::parse_kv_rotation(options.kv.rotation); });
    if (o.kv.quantized)
      o.kv.rotation = r;
    else
      check(r == nn::RotationKind::kNone, ErrorCode::kInvalidArgument, op,
            "a plain KV cache (kv.format \"", options.kv.format,
            "\") is not rotated: kv.rotation must be \"\" or \"none\"; got \"", options.kv.rotation, "\"");
  }
  if (!options.kv.key_layout.empty()) {
    const nn::KeyLayout l = named(op, "kv.key_layout", [&] { return nn::parse_key_layout(options.kv.key_layout); });
    check(o.kv.quantized || l == nn::KeyLayout::kToken, ErrorCode::kInvalidArgument, op, "a plain KV cache (kv.format \"",
          options.kv.format, "\") stores keys per position: kv.key_layout must be \"\" or \"token\"; got \"",
          options.kv.key_layout, "\"");
    o.kv.key_layout = l;
  }
  if (!options.kv.values.empty()) {
    const bool sym = named(op, "kv.values", [&] { return nn::parse_value_codes(options.kv.values); });
    check(o.kv.quantized || !sym, ErrorCode::kInvalidArgument, op, "a plain KV cache (kv.format \"", options.kv.format,
          "\") stores its values as they are: kv.values must be \"\" or \"affine\"; got \"", options.kv.values, "\"");
    if (o.kv.quantized) o.kv.v_symmetric = sym;
  }
  if (!options.kv.recent.empty()) {
    const bool exact = named(op, "kv.recent", [&] { return nn::parse_recent(options.kv.recent); });
    check(o.kv.quantized || !exact, ErrorCode::kInvalidArgument, op, "a plain KV cache (kv.format \"", options.kv.format,
          "\") is read as it is stored: kv.recent must be \"\" or \"quantized\"; got \"", options.kv.recent, "\"");
    if (o.kv.quantized) o.kv.recent_exact = exact;
  } else if (o.kv.key_layout != nn::KeyLayout::kChannel) {
    o.kv.recent_exact = false;  // keys per position (the default's turned to token): no residual windows
  }
  check(options.kv.key_outliers >= -1, ErrorCode::kInvalidArgument, op,
        "kv.key_outliers must be -1 (automatic), 0 (the default's) or a count; got ", options.kv.key_outliers);
  if (options.kv.key_outliers != 0) {
    check(o.kv.quantized, ErrorCode::kInvalidArgument, op, "a plain KV cache (kv.format \"", options.kv.format,
          "\") has no per-channel keys to refine: kv.key_outliers must be 0; got ", options.kv.key_outliers);
    o.kv.key_outliers_auto = options.kv.key_outliers == -1;
    o.kv.key_outliers = std::max(0, options.kv.key_outliers);
    o.kv.validate(op);  // a count in range, with per-channel keys
  } else if (!options.kv.format.empty()) {
    o.kv.key_outliers_auto = false;  // an explicit format: none unless asked for
  }
  if (o.kv.quantized) {
    if (gs != 0) o.kv.group_size = gs;  // else the format's (64) or the default cache's
    o.kv.group_size_auto = gs == 0;
  }
  check(options.ctx >= 0, ErrorCode::kInvalidArgument, op, "ctx must be >= 0 (0 = the model's maximum); got ",
        options.ctx);
  o.ctx = options.ctx;
  check(options.threads >= 0, ErrorCode::kInvalidArgument, op, "threads must be >= 0 (0 = unchanged); got ",
        options.threads);
  o.imatrix = options.imatrix;
  if (!options.head_weights.empty())
    o.head_weights = named(op, "head_weights", [&] { return model::parse_weight_format(options.head_weights); });
  if (options.threads > 0) {
    check_threads(options.threads, op);
    set_num_threads(options.threads);
  }
  return o;
}

std::shared_ptr<Model::Impl> load_model(const std::string& path, const ModelOptions& options, const char* op) {
  check(!path.empty(), ErrorCode::kInvalidArgument, op, "path must name a model directory or .gguf file; got \"\"");
  model::ModelOptions o = engine_options(options, op);
  if (options.weights.empty()) o.weights = model::default_weights(path, o.device);
  auto m = std::make_shared<Model::Impl>();
  m->model = model::Model::load(path, o);
  m->eos_ids = model::model_eos_ids(*m->model);
  m->architecture = model::architecture_name(m->model->config().arch);
  m->weights = model::weight_format_name(m->model->options().weights);
  m->kv = model::kv_format_name(m->model->options().kv);
  m->device = model::device_name(m->model->options().device);
  return m;
}

ModelInfo model_info(const Model::Impl& m) {
  const model::ModelConfig& c = m.model->config();
  ModelInfo info;
  info.architecture = m.architecture;
  info.vocab_size = c.vocab_size;
  info.context_length = m.model->context_length();
  info.hidden_size = c.hidden_size;
  info.num_layers = c.num_layers;
  info.num_heads = c.num_heads;
  info.num_kv_heads = c.num_kv_heads;
  info.head_dim = c.head_dim;
  info.bos_id = m.model->tokenizer().bos_id() >= 0 ? m.model->tokenizer().bos_id() : c.bos_token_id;
  info.eos_ids = m.eos_ids;
  info.weight_bytes = m.model->weight_bytes();
  info.weights = m.weights;
  info.kv = m.kv;
  info.device = m.device;
  return info;
}

std::unique_ptr<Session::Impl> new_session(const std::shared_ptr<const Model::Impl>& m) {
  auto s = std::make_unique<Session::Impl>();
  s->model = m;
  s->session = m->model->new_session();
  return s;
}

model::SamplerParams sampler_params(const SamplerConfig& c) {
  model::SamplerParams p;
  p.temperature = c.temperature;
  p.top_k = c.top_k;
  p.top_p = c.top_p;
  p.min_p = c.min_p;
  p.repeat_penalty = c.repeat_penalty;
  p.repeat_window = c.repeat_window;
  p.seed = c.seed;
  return p;
}

std::unique_ptr<Sampler::Impl> new_sampler(const SamplerConfig& c, const char* op) {
  const model::SamplerParams p = sampler_params(c);
  named(op, "sampler", [&] { model::validate_sampler_params(p); });
  return std::make_unique<Sampler::Impl>(Sampler::Impl{c, model::Sampler(p)});
}

int32_t sample(Sampler::Impl& s, const float* logits, int64_t vocab, std::span<const int32_t> history,
               const char* op) {
  check(vocab >= 1, ErrorCode::kInvalidArgument, op, "vocab must be >= 1; got ", vocab);
  check(logits != nullptr, ErrorCode::kInvalidArgument, op, "logits must not be NULL");
  for (size_t i = 0; i < history.size(); ++i)
    check(history[i] >= 0 && history[i] < vocab, ErrorCode::kOutOfRange, op, "history ids must be in [0, ", vocab,
          "); got ", history[i], " at index ", i);
  return named(op, "sample", [&] { return s.sampler.sample(logits, vocab, history); });
}

void decode(Session::Impl& s, const int32_t* tokens, int64_t n, float* logits, size_t logits_len, bool all_logits,
            const char* op) {
  const model::Model& m = *s.model->model;
  const int64_t vocab = m.config().vocab_size, ctx = m.context_length(), pos = s.session->position();
  check(n >= 1, ErrorCode::kInvalidArgument, op, "the number of tokens must be >= 1; got ", n);
  check(tokens != nullptr, ErrorCode::kInvalidArgument, op, "tokens must not be NULL");
  check(logits != nullptr, ErrorCode::kInvalidArgument, op, "logits must not be NULL");
  check(n <= ctx - pos, ErrorCode::kOutOfRange, op, "positions must stay within the context length ", ctx, "; got ",
        pos, " + ", n, " tokens");
  for (int64_t i = 0; i < n; ++i)
    check(tokens[i] >= 0 && tokens[i] < vocab, ErrorCode::kOutOfRange, op, "token ids must be in [0, ", vocab,
          "); got ", tokens[i], " at index ", i);
  const int64_t need = all_logits ? n * vocab : vocab;  // n <= ctx: no overflow
  check(logits_len >= static_cast<size_t>(need), ErrorCode::kInvalidArgument, op, "logits must hold ", need,
        all_logits ? " floats (n × vocab); got " : " floats (vocab); got ", logits_len);
  m.forward(*s.session, tokens, n, logits, all_logits);
  s.history.insert(s.history.end(), tokens, tokens + n);
}

int64_t trim(Session::Impl& s, int64_t n, const char* op) {
  check(n >= 0, ErrorCode::kInvalidArgument, op, "n must be >= 0; got ", n);
  const int64_t removed = s.session->trim(n);
  s.history.resize(s.history.size() - static_cast<size_t>(std::min<int64_t>(removed, std::ssize(s.history))));
  return removed;
}

std::vector<int32_t> tokenize(const Model::Impl& m, std::string_view text, bool add_special, const char* op) {
  return named(op, "tokenize", [&] { return m.model->tokenizer().encode(text, add_special); });
}

std::string detokenize(const Model::Impl& m, std::span<const int32_t> ids, bool skip_special, const char* op) {
  return named(op, "detokenize",
               [&] { return m.model->tokenizer().decode(std::vector<int32_t>(ids.begin(), ids.end()), skip_special); });
}

namespace {

Generation run_generate(Session::Impl& s, std::span<const int32_t> prompt, const GenerateConfig& config,
                        const TextCallback& on_text, const char* op) {
  check(!prompt.empty(), ErrorCode::kInvalidArgument, op, "the prompt must hold at least one token; got none");
  const model::Model& m = *s.model->model;
  for (size_t i = 0; i < prompt.size(); ++i)
    check(prompt[i] >= 0 && prompt[i] < m.config().vocab_size, ErrorCode::kOutOfRange, op,
          "prompt token ids must be in [0, ", m.config().vocab_size, "); got ", prompt[i], " at index ", i);
  auto sampler = new_sampler(config.sampler, op);
  model::GenerateOptions go;
  go.max_tokens = config.max_tokens;
  go.stop = config.stop;
  go.eos_ids = s.model->eos_ids;
  for (size_t i = 0; i < config.stop_tokens.size(); ++i) {
    const int32_t id = config.stop_tokens[i];
    check(id >= 0 && id < m.config().vocab_size, ErrorCode::kOutOfRange, op, "stop_tokens ids must be in [0, ",
          m.config().vocab_size, "); got ", id, " at index ", i);
    go.eos_ids.push_back(id);
  }
  go.prefill_chunk = config.prefill_chunk;
  model::ModelLogitsSource source(m, *s.session);
  model::TokenizerTextStream text(m.tokenizer(), prompt.back());
  model::TextCallback stream;
  if (on_text) stream = [&](std::string_view piece) { on_text(piece); };
  const model::GenerationResult r =
      named(op, "generate", [&] { return model::generate(source, text, sampler->sampler, s.history, prompt, go, stream); });
  // The history holds exactly the tokens fed to the session: a pending token is not in it yet.
  if (r.last_token_pending && !s.history.empty()) s.history.pop_back();
  Generation g;
  g.text = r.text;
  g.tokens = r.tokens;
  g.reason = static_cast<StopReason>(static_cast<int>(r.reason));
  g.last_token_pending = r.last_token_pending;
  g.prompt_tokens = r.stats.prompt_tokens;
  g.prompt_seconds = r.stats.prompt_seconds;
  g.generation_seconds = r.stats.generation_seconds;
  return g;
}

}  // namespace
}  // namespace api

static_assert(static_cast<int>(StopReason::kEos) == static_cast<int>(model::StopReason::kEos) &&
              static_cast<int>(StopReason::kStopString) == static_cast<int>(model::StopReason::kStopString) &&
              static_cast<int>(StopReason::kMaxTokens) == static_cast<int>(model::StopReason::kMaxTokens) &&
              static_cast<int>(StopReason::kContextFull) == static_cast<int>(model::StopReason::kContextFull));

const char* version() { return "0.1.0"; }

void set_threads(int n) {
  api::check_threads(n, "cider::set_threads");
  set_num_threads(n);
}
int threads() { return num_threads(); }
int max_threads() { return max_num_threads(); }

const char* stop_reason_name(StopReason r) { return model::stop_reason_name(static_cast<model::StopReason>(r)); }

// ---- Model ----
Model::Model(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path, const ModelOptions& options) {
  return Model(api::load_model(path, options, "cider::Model::load"));
}

namespace {
const Model::Impl& checked(const std::shared_ptr<Model::Impl>& impl, const char* op) {
  check(impl != nullptr, ErrorCode::kInvalidArgument, op, "the model was moved from");
  return *impl;
}
}  // namespace

ModelInfo Model::info() const { return api::model_info(checked(impl_, "cider::Model::info")); }
int64_t Model::vocab_size() const { return checked(impl_, "cider::Model::vocab_size").model->config().vocab_size; }
int64_t Model::context_length() const {
  return checked(impl_, "cider::Model::context_length").model->context_length();
}
std::vector<int32_t> Model::tokenize(std::string_view text, bool add_special) const {
  return api::tokenize(checked(impl_, "cider::Model::tokenize"), text, add_special, "cider::Model::tokenize");
}
std::string Model::detokenize(std::span<const int32_t> ids, bool skip_special) const {
  return api::detokenize(checked(impl_, "cider::Model::detokenize"), ids, skip_special, "cider::Model::detokenize");
}
namespace {
model::ChatFormat chat_format_of(const Model::Impl& m) {
  const model::Tokenizer& tok = m.model->tokenizer();
  return model::default_chat_format(m.model->config().arch,
                                    [&](std::string_view t) { return tok.token_to_id(t) >= 0; });
}
}  // namespace

std::string Model::chat_prompt(const std::vector<ChatMessage>& messages) const {
  const Impl& m = checked(impl_, "cider::Model::chat_prompt");
  std::vector<model::ChatMessage> ms;
  ms.reserve(messages.size());
  for (const auto& x : messages) ms.push_back({x.role, x.content});
  return api::named("cider::Model::chat_prompt", "messages", [&] { return model::render_chat(chat_format_of(m), ms); });
}
std::string Model::chat_format() const {
  return model::chat_format_name(chat_format_of(checked(impl_, "cider::Model::chat_format")));
}
std::vector<int32_t> Model::chat_end_tokens() const {
  const Impl& m = checked(impl_, "cider::Model::chat_end_tokens");
  std::vector<int32_t> ids;
  for (const auto& t : model::chat_end_tokens(chat_format_of(m)))
    if (const int32_t id = m.model->tokenizer().token_to_id(t); id >= 0) ids.push_back(id);
  return ids;
}

PerplexityReport perplexity(const Model& model, std::string_view text, const PerplexityConfig& config,
                            const Model* baseline) {
  constexpr const char* op = "cider::perplexity";
  const model::Model& m = *checked(model.impl_, op).model;
  const model::Model* base = baseline != nullptr ? checked(baseline->impl_, op).model.get() : nullptr;
  check(base == nullptr || base->config().vocab_size == m.config().vocab_size, ErrorCode::kInvalidArgument, op,
        "the baseline must have the model's vocabulary of ", m.config().vocab_size, " tokens; got ",
        base != nullptr ? base->config().vocab_size : 0);
  check(config.ctx >= 2 && config.ctx <= m.context_length(), ErrorCode::kInvalidArgument, op,
        "ctx must be in [2, the model's context length ", m.context_length(), "]; got ", config.ctx);
  check(base == nullptr || config.ctx <= base->context_length(), ErrorCode::kInvalidArgument, op,
        "ctx must fit the baseline's context length ", base != nullptr ? base->context_length() : 0, "; got ",
        config.ctx);
  const model::Tokenizer& tok = m.tokenizer();
  model::PerplexityOptions po;
  po.ctx = config.ctx;
  po.stride = config.stride;
  po.bos = model::bos_per_window(tok);
  const std::vector<int32_t> tokens =
      api::named(op, "tokenize", [&] { return tok.encode(text, /*add_special=*/po.bos < 0); });
  const model::PerplexityResult r = model::evaluate_perplexity(
      tokens, m.config().vocab_size, po, model::window_evaluator(m), base ? model::window_evaluator(*base) : nullptr);
  PerplexityReport out;
  out.windows = r.windows;
  out.tokens_scored = r.tokens_scored;
  out.ppl = r.ppl;
  out.ppl_stderr = r.ppl_stderr;
  out.nll = r.nll.mean;
  out.has_baseline = r.has_baseline;
  out.base_ppl = r.base_ppl;
  out.base_ppl_stderr = r.base_ppl_stderr;
  out.kl = r.kl.mean;
  out.kl_stderr = r.kl.se;
  out.top1 = r.top1.mean;
  out.report = r.report();
  return out;
}

Session Model::new_session() const {
  checked(impl_, "cider::Model::new_session");
  return Session(api::new_session(impl_));
}

// ---- Sampler ----
Sampler::Sampler(const SamplerConfig& config) : impl_(api::new_sampler(config, "cider::Sampler")) {}
Sampler::Sampler(Sampler&&) noexcept = default;
Sampler& Sampler::operator=(Sampler&&) noexcept = default;
Sampler::~Sampler() = default;

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  constexpr const char* op = "cider::Sampler::sample";
  check(impl_ != nullptr, ErrorCode::kInvalidArgument, op, "the sampler was moved from");
  return api::sample(*impl_, logits.data(), std::ssize(logits), history, op);
}
const SamplerConfig& Sampler::config() const {
  check(impl_ != nullptr, ErrorCode::kInvalidArgument, "cider::Sampler::config", "the sampler was moved from");
  return impl_->config;
}

// ---- Session ----
Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;
Session::~Session() = default;

namespace {
Session::Impl& checked(const std::unique_ptr<Session::Impl>& impl, const char* op) {
  check(impl != nullptr, ErrorCode::kInvalidArgument, op, "the session was moved from");
  return *impl;
}
}  // namespace

int64_t Session::position() const { return checked(impl_, "cider::Session::position").session->position(); }
int64_t Session::trim(int64_t n) { return api::trim(checked(impl_, "cider::Session::trim"), n, "cider::Session::trim"); }
size_t Session::kv_bytes() const { return checked(impl_, "cider::Session::kv_bytes").session->kv_bytes(); }
int64_t Session::vocab_size() const {
  return checked(impl_, "cider::Session::vocab_size").model->model->config().vocab_size;
}
int64_t Session::context_length() const {
  return checked(impl_, "cider::Session::context_length").model->model->context_length();
}

std::vector<float> Session::decode(std::span<const int32_t> tokens) {
  constexpr const char* op = "cider::Session::decode";
  Impl& s = checked(impl_, op);
  std::vector<float> logits(static_cast<size_t>(s.model->model->config().vocab_size));
  api::decode(s, tokens.data(), std::ssize(tokens), logits.data(), logits.size(), false, op);
  return logits;
}

void Session::decode(std::span<const int32_t> tokens, std::span<float> logits, bool all_logits) {
  constexpr const char* op = "cider::Session::decode";
  api::decode(checked(impl_, op), tokens.data(), std::ssize(tokens), logits.data(), logits.size(), all_logits, op);
}

Generation Session::generate(std::string_view prompt, const GenerateConfig& config, const TextCallback& on_text) {
  constexpr const char* op = "cider::Session::generate";
  Impl& s = checked(impl_, op);
  // Special tokens (BOS) only at the start of the sequence.
  const std::vector<int32_t> ids = api::tokenize(*s.model, prompt, s.session->position() == 0, op);
  return api::run_generate(s, ids, config, on_text, op);
}

Generation Session::generate(std::span<const int32_t> prompt, const GenerateConfig& config,
                             const TextCallback& on_text) {
  constexpr const char* op = "cider::Session::generate";
  return api::run_generate(checked(impl_, op), prompt, config, on_text, op);
}

std::vector<int32_t> Session::tokenize(std::string_view text, bool add_special) const {
  constexpr const char* op = "cider::Session::tokenize";
  return api::tokenize(*checked(impl_, op).model, text, add_special, op);
}

std::string Session::detokenize(std::span<const int32_t> ids, bool skip_special) const {
  constexpr const char* op = "cider::Session::detokenize";
  return api::detokenize(*checked(impl_, op).model, ids, skip_special, op);
}

}  // namespace cider
