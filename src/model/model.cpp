// Model and Session (model/model.h): option parsing, loading, argument checks around the forward pass.
#include "model/model.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/kernel_table.h"
#include "model/backend.h"
#include "model/loader.h"
#include "model/session_state.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"
#include "quant/affine.h"

namespace cider::model {

namespace {

// The context length cap when --ctx is not given: KV memory for the model's full maximum (often 128k) is rarely
// what a CPU user wants by default.
constexpr int64_t kDefaultCtxCap = 8192;

// Runs steps[i] on sessions[i] (already checked) and advances each session's position; on an error every session is
// left as it was (whatever part of the tokens reached its caches is dropped) and the error goes on.
template <typename Forward>
void run_steps_with(std::span<Session::Impl* const> sessions, std::span<const SequenceStep> steps, Forward&& forward) {
  std::vector<BackendSession*> bs;
  for (Session::Impl* si : sessions) bs.push_back(si->backend.get());
  try {
    forward(std::span<BackendSession* const>(bs));
  } catch (...) {
    // Back to where each session was; a session whose sliding-window caches dropped positions its start needs
    // (the failed call appended more than the window's slack) starts over, empty (docs/engine.md).
    for (Session::Impl* si : sessions) {
      if (!si->backend->can_truncate(si->position)) si->position = 0;
      si->backend->truncate(si->position);
    }
    throw;
  }
  for (size_t i = 0; i < sessions.size(); ++i) sessions[i]->position += steps[i].n;
}

void run_steps(const BackendModel& backend, std::span<Session::Impl* const> sessions,
               std::span<const SequenceStep> steps) {
  run_steps_with(sessions, steps, [&](std::span<BackendSession* const> bs) { backend.forward(bs, steps); });
}

}  // namespace

KVOptions parse_kv_format(std::string_view s) {
  KVOptions kv;
  static_cast<nn::KVSpec&>(kv) = nn::parse_kv_spec(s);
  return kv;
}

nn::RotationKind parse_kv_rotation(std::string_view s) { return nn::parse_rotation(s); }

KVOptions default_kv(Device device) {
  const bool cpu = device == Device::kCPU;
  // The CPU: k4v4 with the recent block and the sink read unquantized, symmetric values and blocks of 128 (4.25 bits
  // per value; docs/quality.md); CUDA's kernels read neither, and k5v4 with affine values is its fewest within the
  // bounds.
  KVOptions kv = parse_kv_format(cpu ? "k4v4" : "k5v4");
  kv.rotation = nn::RotationKind::kHadamard;
  kv.key_layout = nn::KeyLayout::kChannel;
  kv.key_outliers_auto = true;
  kv.v_symmetric = cpu;
  kv.recent_exact = cpu;
  kv.group_size = cpu ? 128 : 64;  // the CPU: blocks of 128 positions (64 or 32 where 128 does not divide the head)
  kv.group_size_auto = true;
  kv.device_default = true;
  return kv;
}

namespace {
// default_kv's cache for this model: on CUDA the per-channel layout with outlier channels runs on the tensor-core
// kernels, which take heads of 128 or 256; other head sizes get the per-position k8v4/hadamard cache.
KVOptions adapt_default_kv(const KVOptions& kv, Device device, int64_t head_dim) {
  if (!kv.device_default || device != Device::kCUDA || head_dim == 128 || head_dim == 256) return kv;
  KVOptions o = parse_kv_format("k8v4");
  o.rotation = nn::RotationKind::kHadamard;
  o.group_size = 64;
  o.group_size_auto = true;
  return o;
}
}  // namespace

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::kCPU;
  if (s == "cuda") return Device::kCUDA;
  fail(ErrorCode::kInvalidArgument, "parse_device", "device must be cpu or cuda; got \"", s, "\"");
}

const char* device_name(Device d) { return d == Device::kCUDA ? "cuda" : "cpu"; }

std::string kv_format_name(const KVOptions& kv) { return kv.name(); }

// ---- Session ----------------------------------------------------------------------------------------------------

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

int64_t Session::position() const { return impl_->position; }

int64_t Session::trim(int64_t n) {
  check(n >= 0, ErrorCode::kInvalidArgument, "session_trim", "n must be >= 0; got ", n);
  const int64_t m = std::min(n, impl_->position);
  const ModelConfig& c = impl_->model->config;
  if (c.has_linear_layers())
    check(m == 0 || m == impl_->position, ErrorCode::kOutOfRange, "session_trim",
          "a model with linear-attention (recurrent) layers keeps only its latest state: a session can go back to "
          "position 0, not ", m, " of ", impl_->position, " positions");
  check(impl_->backend->can_truncate(impl_->position - m), ErrorCode::kOutOfRange, "session_trim",
        "the sliding-window layers (window ", c.sliding_window, ") dropped positions older than their window; going "
        "back ", m, " of ", impl_->position, " positions would need some of them (a session can go back to where the "
        "window still reaches, or to 0; ModelOptions::kv_full_sliding keeps every position)");
  impl_->position -= m;
  impl_->backend->truncate(impl_->position);
  return m;
}

bool Session::can_truncate(int64_t position) const {
  return position >= 0 && position <= impl_->position && impl_->backend->can_truncate(position);
}

int64_t kv_cache_bytes(const ModelConfig& c, const KVOptions& kv, int64_t positions, bool full_sliding,
                       int64_t shared) {
  int64_t b = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.is_linear_layer(l)) {  // a recurrent state, the same at any length (allocated at the first token)
      if (positions > 0) b += c.linear_attn.state_bytes();
      continue;
    }
    const bool sliding = !full_sliding && static_cast<size_t>(l) < c.layer_sliding.size() &&
                         c.layer_sliding[static_cast<size_t>(l)] != 0;
    b += nn::kv_cache_bytes(kv, 1, c.num_kv_heads, c.head_dim, c.head_dim,
                            sliding ? positions : std::max<int64_t>(0, positions - shared), sliding ? c.sliding_window : 0);
  }
  return b;
}

size_t Session::kv_bytes() const { return impl_->backend->kv_bytes(); }
void Session::shared_kv(std::vector<SharedKvBlock>& out) const { impl_->backend->shared_kv(out); }

// ---- Model ------------------------------------------------------------------------------------------------------

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& options, const ProgressFn& progress) {
  constexpr const char* op = "model_options";
  check(options.ctx >= 0, ErrorCode::kInvalidArgument, op, "ctx must be >= 0 (0 = the model's maximum); got ",
        options.ctx);
  options.kv.validate(op);
  require_device(options.device);  // before reading any weights
  check(options.tp >= 1 && options.tp <= kMaxTensorParallel, ErrorCode::kInvalidArgument, op, "--tp must be in [1, ",
        kMaxTensorParallel, "]; got ", options.tp);
  check(options.tp == 1 || options.device == Device::kCUDA, ErrorCode::kUnsupported, op,
        "--tp ", options.tp, " splits the model over GPUs: it needs --device cuda (the CPU runs --tp 1)");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (!options.kv.quantized) impl->options.kv.rotation = nn::RotationKind::kNone;  // plain caches are not rotated

  load_model_files(path, options.weights, progress, *impl);
  const ModelConfig& c = impl->config;
  // The CPU kernels' preferred row order for some native formats (cider convert writes the file's order back)
  if (options.device == Device::kCPU && options.kernel_layout) interleave_for_kernels(impl->w, kernels::active_kernels());

  // The cache configuration must fit the head size: checked now rather than at the first token.
  impl->options.kv = adapt_default_kv(impl->options.kv, options.device, c.head_dim);
  KVOptions& kv = impl->options.kv;
  if (kv.quantized && kv.group_size_auto && c.head_dim % kv.group_size != 0) {
    for (int g : {64, 32})
      if (g < kv.group_size && c.head_dim % g == 0) {
        kv.group_size = g;
        break;
      }
  }
  if (kv.quantized && kv.key_outliers_auto)
    kv.key_outliers = kv.key_layout == nn::KeyLayout::kChannel ? nn::auto_key_outliers(c.head_dim) : 0;
  kv.validate_head_dims(c.head_dim, c.head_dim, op);
  // Dynamic NTK scaling exists to run past max_position_embeddings: its maximum is max_position × factor.
  int64_t max_ctx = c.max_position;
  if (c.rope.scaling == RopeScaling::kDynamic)
    max_ctx = static_cast<int64_t>(std::min(static_cast<double>(c.max_position) * c.rope.factor, 2147483647.0));
  check(options.ctx <= max_ctx, ErrorCode::kOutOfRange, op, "ctx must be <= the model's maximum context ", max_ctx,
        "; got ", options.ctx);
  impl->ctx = options.ctx > 0 ? options.ctx : std::min(c.max_position, kDefaultCtxCap);
  // The context decides longrope's long/short factors and dynamic NTK's base (model.h, RopeConfig).
  impl->inv_freq = rope_inv_freq(c.rope, c.head_dim, impl->ctx, c.rotary_dim);
  impl->inv_freq_local = rope_inv_freq(c.rope_local, c.head_dim, impl->ctx, c.rotary_dim);
  if (impl->tokenizer) {
    const Tokenizer& tok = *impl->tokenizer;
    if (impl->bos_token.empty() && tok.bos_id() >= 0) impl->bos_token = tok.id_to_token(tok.bos_id());
    if (impl->eos_token.empty() && !tok.eos_ids().empty()) impl->eos_token = tok.id_to_token(tok.eos_ids().front());
  }
  check_tensor_parallel(c, impl->options.weights, options.tp);
  impl->backend = make_backend(*impl);
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelConfig& Model::config() const { return impl_->config; }
const ModelOptions& Model::options() const { return impl_->options; }
const Tokenizer& Model::tokenizer() const {
  check(impl_->tokenizer.has_value(), ErrorCode::kUnsupported, "tokenizer", "this model has no tokenizer: ",
        impl_->tokenizer_error);
  return *impl_->tokenizer;
}
int64_t Model::context_length() const { return impl_->ctx; }
int64_t Model::pass_rows() const { return impl_->backend->pass_rows(); }
size_t Model::weight_bytes() const { return impl_->w.nbytes; }
const std::string& Model::chat_template() const { return impl_->chat_template; }
const std::string& Model::bos_token() const { return impl_->bos_token; }
const std::string& Model::eos_token() const { return impl_->eos_token; }

void Model::record_activations(ActivationStats* stats) {
  check(stats == nullptr || impl_->options.device == Device::kCPU, ErrorCode::kUnsupported, "record_activations",
        "activation statistics are recorded on the CPU only; the model runs on ", device_name(impl_->options.device));
  impl_->activation_stats = stats;
}

std::unique_ptr<Session> Model::new_session() const {
  auto s = std::make_unique<Session::Impl>();
  s->model = impl_.get();
  s->backend_model = impl_->backend;
  s->backend = impl_->backend->new_session();
  return std::unique_ptr<Session>(new Session(std::move(s)));
}

// The checks forward() and forward_candidates() share: this model's session, n >= 1 tokens, ids in the vocabulary,
// the positions within the context (before anything changes the session). has_logits: the caller's output is given.
void Model::check_forward_args(const Session::Impl& si, const int32_t* tokens, int64_t n, bool has_logits,
                               const char* op) const {
  check(si.model == impl_.get(), ErrorCode::kInvalidArgument, op, "the session must come from this model's new_session()");
  check(n >= 1, ErrorCode::kInvalidArgument, op, "n must be >= 1; got ", n);
  check(tokens != nullptr && has_logits, ErrorCode::kInvalidArgument, op, "tokens and logits must not be null");
  check(si.position + n <= impl_->ctx, ErrorCode::kOutOfRange, op, "positions must stay within the context length ",
        impl_->ctx, "; got ", si.position, " + ", n, " tokens");
  const int64_t V = impl_->config.vocab_size;
  for (int64_t i = 0; i < n; ++i)
    check(tokens[i] >= 0 && tokens[i] < V, ErrorCode::kOutOfRange, op, "token ids must be in [0, ", V, "); got ",
          tokens[i], " at index ", i);
}

void Model::forward(Session& s, const int32_t* tokens, int64_t n, float* logits, bool all_logits) const {
  BatchItem item{&s, tokens, n, logits, all_logits};
  forward_batch(std::span<const BatchItem>(&item, 1));
}

void Model::batch_steps(std::span<const BatchItem> items, bool rows_on_device, const char* op,
                        std::vector<Session::Impl*>& sessions, std::vector<SequenceStep>& steps) const {
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& it = items[i];
    check(it.session != nullptr, ErrorCode::kInvalidArgument, op, "batch item ", i, " has no session");
    check(!rows_on_device || it.n == 1, ErrorCode::kInvalidArgument, op, "batch item ", i,
          " must be one token when the rows stay on the device; got n ", it.n);
    Session::Impl& si = it.session->impl();
    check_forward_args(si, it.tokens, it.n, rows_on_device || it.logits != nullptr, op);
    for (size_t j = 0; j < i; ++j)
      check(items[j].session != it.session, ErrorCode::kInvalidArgument, op,
            "a session may appear once in a batch; items ", j, " and ", i, " share one");
    sessions.push_back(&si);
    if (rows_on_device)
      steps.push_back({it.tokens, 1, si.position, /*logits=*/nullptr, /*all_logits=*/false});
    else
      steps.push_back({it.tokens, it.n, si.position, it.logits, it.all_logits});
  }
}

void Model::forward_batch(std::span<const BatchItem> items) const {
  constexpr const char* op = "forward";
  check(!items.empty(), ErrorCode::kInvalidArgument, op, "a batch needs at least one sequence");
  std::vector<Session::Impl*> sessions;
  std::vector<SequenceStep> steps;
  batch_steps(items, /*rows_on_device=*/false, op, sessions, steps);
  run_steps(*impl_->backend, sessions, steps);
}

bool Model::forward_candidates(Session& s, const int32_t* tokens, int64_t n, const CandidateRequest& request,
                               Candidates& out) const {
  constexpr const char* op = "model.forward_candidates";
  Session::Impl& si = s.impl();
  if (!impl_->backend->samples_on_device() || request.k < 1) return false;
  check_forward_args(si, tokens, n, /*has_logits=*/true, op);
  const SequenceStep step{tokens, n, si.position, /*logits=*/nullptr, /*all_logits=*/false};
  Session::Impl* sp = &si;
  run_steps(*impl_->backend, std::span<Session::Impl* const>(&sp, 1), std::span<const SequenceStep>(&step, 1));
  impl_->backend->candidates(*si.backend, request, out);
  return true;
}

bool Model::samples_on_device() const { return impl_->backend->samples_on_device(); }

bool Model::forward_batch_candidates(std::span<const BatchItem> items, std::span<const CandidateRequest> requests,
                                     std::span<Candidates> out) const {
  constexpr const char* op = "model.forward_batch_candidates";
  if (items.empty() || !impl_->backend->samples_batches_on_device(static_cast<int64_t>(items.size()))) return false;
  check(requests.size() == items.size() && out.size() == items.size(), ErrorCode::kInvalidArgument, op,
        "one request and one output per item; got ", items.size(), " items, ", requests.size(), " requests, ",
        out.size(), " outputs");
  for (const CandidateRequest& r : requests)
    if (r.k < 1) return false;
  std::vector<Session::Impl*> sessions;
  std::vector<SequenceStep> steps;
  batch_steps(items, /*rows_on_device=*/true, op, sessions, steps);
  run_steps_with(sessions, steps, [&](std::span<BackendSession* const> bs) {
    impl_->backend->forward_candidates_batch(bs, steps, requests, out);
  });
  return true;
}

// ---- session states (model/session_state.h) ----------------------------------------------------------------------

void BackendSession::restore(const SessionState&) {
  fail(ErrorCode::kUnsupported, "session_restore", "this device's sessions cannot be restored from the host");
}

int64_t SessionState::nbytes() const {
  int64_t b = 0;
  for (const auto& c : caches) b += c.nbytes();
  for (const auto& l : linear) b += static_cast<int64_t>((l.S.size() + l.conv.size()) * sizeof(float));
  return b;
}

nn::KVCacheMeta expected_cache_meta(const Model& m, int64_t layer) { return expected_cache_meta(m.impl(), layer); }

nn::KVCacheMeta expected_cache_meta(const Model::Impl& m, int64_t layer) {
  const ModelConfig& c = m.config;
  check(layer >= 0 && layer < c.num_layers, ErrorCode::kInvalidArgument, "expected_cache_meta", "layer must be in [0, ",
        c.num_layers, "); got ", layer);
  nn::KVCacheMeta meta = m.make_cache(layer)->meta();
  if (c.is_linear_layer(layer)) return meta;  // its cache stays empty
  meta.has_dims = true;
  meta.B = 1;
  meta.H = c.num_kv_heads;
  meta.Dk = meta.Dv = c.head_dim;
  return meta;
}

bool Model::can_snapshot() const { return impl_->backend->can_snapshot(); }

SessionState Model::snapshot(const Session& s) const {
  constexpr const char* op = "session_snapshot";
  check(can_snapshot(), ErrorCode::kUnsupported, op, "sessions on the ", device_name(impl_->options.device),
        " device cannot be copied to the host here (the cpu's and one GPU's can)");
  check(s.impl().model == impl_.get(), ErrorCode::kInvalidArgument, op,
        "the session must come from this model's new_session()");
  SessionState st;
  st.position = s.impl().position;
  check(s.impl().backend->snapshot(st), ErrorCode::kUnsupported, op, "this session cannot be copied to the host");
  return st;
}

bool Model::can_copy_sessions() const { return impl_->backend->can_copy_sessions(); }

bool Model::can_share_sessions() const { return impl_->backend->can_share_sessions(); }

std::unique_ptr<Session> Model::copy_session(const Session& s, int64_t position) const {
  constexpr const char* op = "session_copy";
  check(can_copy_sessions(), ErrorCode::kUnsupported, op, "sessions on the ", device_name(impl_->options.device),
        " device cannot be copied (the cpu and cuda devices' can)");
  check(s.impl().model == impl_.get(), ErrorCode::kInvalidArgument, op,
        "the session must come from this model's new_session()");
  check(s.can_truncate(position), ErrorCode::kOutOfRange, op, "a copy holds a prefix the session can go back to: ",
        "position must be in [0, ", s.position(), "] and still reachable by its sliding-window caches and recurrent "
        "states (Session::can_truncate); got ", position);
  auto copy = std::make_unique<Session::Impl>();
  copy->model = impl_.get();
  copy->backend_model = impl_->backend;
  copy->backend = s.impl().backend->copy_prefix(position);
  check(copy->backend != nullptr, ErrorCode::kUnsupported, op, "this session cannot be copied");
  copy->position = position;
  return std::unique_ptr<Session>(new Session(std::move(copy)));
}

void Model::share_session(Session& s) const {
  constexpr const char* op = "session_share";
  check(can_share_sessions(), ErrorCode::kUnsupported, op, "sessions on the ", device_name(impl_->options.device),
        " device cannot share their prefixes (the cpu device's can)");
  check(s.impl().model == impl_.get(), ErrorCode::kInvalidArgument, op,
        "the session must come from this model's new_session()");
  s.impl().backend->share();
}

namespace {

std::string describe_meta(const nn::KVCacheMeta& m) {
  std::string out = m.spec().name() + " seed " + std::to_string(m.seed) + " window " + std::to_string(m.window);
  if (m.quantized && m.key_outliers > 0) out += " outliers " + std::to_string(m.key_outliers);
  if (!m.has_dims) return out + " without dims";
  return out + " dims (" + std::to_string(m.B) + ", " + std::to_string(m.H) + ", " + std::to_string(m.Dk) + ", " +
         std::to_string(m.Dv) + ")";
}

bool same_format(const nn::KVCacheMeta& a, const nn::KVCacheMeta& b) {
  return a.quantized == b.quantized && a.k_bits == b.k_bits && a.v_bits == b.v_bits && a.group_size == b.group_size &&
         a.scale_dtype == b.scale_dtype && a.dtype == b.dtype && a.rotation == b.rotation && a.seed == b.seed &&
         a.key_layout == b.key_layout && a.key_outliers == b.key_outliers && a.v_symmetric == b.v_symmetric && a.recent_exact == b.recent_exact &&
         a.window == b.window &&
         a.has_dims == b.has_dims && a.B == b.B && a.H == b.H && a.Dk == b.Dk && a.Dv == b.Dv;
}

// The outlier channel indices of a per-channel key cache's complete blocks (KVCacheSnapshot plane 8: uint16
// [B, H, ceil(length/gs), n], ascending, each < Dk): attention reads them as offsets into a row.
void check_outlier_indices(const nn::KVCacheSnapshot& snap, int64_t layer, const char* op) {
  const nn::KVCacheMeta& m = snap.meta();
  if (!m.quantized || m.key_layout != nn::KeyLayout::kChannel || m.key_outliers == 0 || m.length == 0) return;
  constexpr size_t kOutlierIndexPlane = 8;
  const int64_t n = m.key_outliers, rows = (m.length + m.group_size - 1) / m.group_size;
  const int64_t complete = m.length / m.group_size;
  const auto* idx = static_cast<const uint16_t*>(snap.plane(kOutlierIndexPlane).data());
  for (int64_t bh = 0; bh < m.B * m.H; ++bh)
    for (int64_t r = 0; r < complete; ++r) {
      const uint16_t* row = idx + (bh * rows + r) * n;
      for (int64_t o = 0; o < n; ++o)
        check(row[o] < m.Dk && (o == 0 || row[o] > row[o - 1]), ErrorCode::kCorrupt, op, "layer ", layer,
              ": outlier channel indices must ascend and be < ", m.Dk, "; got ", row[o], " in block ", r);
    }
}

}  // namespace

std::unique_ptr<Session> Model::restore_session(const SessionState& st) const {
  constexpr const char* op = "session_restore";
  check(can_snapshot(), ErrorCode::kUnsupported, op, "sessions on the ", device_name(impl_->options.device),
        " device cannot be restored from the host here (the cpu's and one GPU's can)");
  const ModelConfig& c = impl_->config;
  const auto layers = static_cast<size_t>(c.num_layers);
  check(st.caches.size() == layers && st.linear.size() == layers, ErrorCode::kCorrupt, op, "a state needs ", layers,
        " layers (this model's); got ", st.caches.size(), " caches and ", st.linear.size(), " linear states");
  check(st.position >= 0 && st.position <= impl_->ctx, ErrorCode::kCorrupt, op, "position must be in [0, ",
        impl_->ctx, "] (the context); got ", st.position);
  const ModelConfig::LinearAttention& la = c.linear_attn;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const nn::KVCacheSnapshot& snap = st.caches[static_cast<size_t>(l)];
    const nn::KVCacheMeta& got = snap.meta();
    const LinearStateCopy& ls = st.linear[static_cast<size_t>(l)];
    const nn::KVCacheMeta want = expected_cache_meta(*this, l);
    if (c.is_linear_layer(l)) {
      check(!got.has_dims, ErrorCode::kCorrupt, op, "layer ", l, " is a linear-attention layer: its cache holds "
            "nothing; got ", got.length, " positions");
      const auto S = static_cast<size_t>(la.num_v_heads * la.k_head_dim * la.v_head_dim);
      const auto conv = static_cast<size_t>((la.conv_kernel - 1) * la.conv_dim());
      const bool fresh = ls.S.empty() && ls.conv.empty() && ls.pos == 0 && st.position == 0;
      const bool held = ls.S.size() == S && ls.conv.size() == conv && ls.pos == st.position;
      check(fresh || held, ErrorCode::kCorrupt, op, "layer ", l, "'s linear-attention state must hold ", S, " + ",
            conv, " floats at position ", st.position, "; got ", ls.S.size(), " + ", ls.conv.size(), " at ", ls.pos);
      continue;
    }
    check(ls.S.empty() && ls.conv.empty() && ls.pos == 0, ErrorCode::kCorrupt, op, "layer ", l,
          " is an attention layer: it holds no linear-attention state");
    if (!got.has_dims) {  // an empty cache: only at position 0
      check(st.position == 0 && got.length == 0, ErrorCode::kCorrupt, op, "layer ", l,
            "'s cache is empty but the state holds ", st.position, " positions");
      continue;
    }
    check(same_format(got, want), ErrorCode::kCorrupt, op, "layer ", l, "'s cache must be ", describe_meta(want),
          " (this model's); got ", describe_meta(got));
    check(got.length >= 0 && got.start >= 0 && got.start + got.length == st.position, ErrorCode::kCorrupt, op,
          "layer ", l, "'s cache must end at the state's position ", st.position, "; got start ", got.start,
          " + length ", got.length);
    check_outlier_indices(snap, l, op);
  }
  auto s = new_session();
  s->impl().backend->restore(st);
  s->impl().position = st.position;
  return s;
}

}  // namespace cider::model
