// cider/model/backend.h — the seam between the one forward pass (model/forward.cpp) and the devices it runs on.
//
// The forward is written once, against Backend: a pass's executor on one device, which owns the pass's activation
// buffers and runs the ops at the fused granularity of the GPU path. Each op names its inputs and outputs (below), so
// the layer loop passes no pointers and each device keeps the layouts its kernels want:
//   embed          x = embedding(tokens)·embed_scale                                      x: (rows, hidden)
//   residual_norm  t' = post ? rms_norm(t, post) : t;  x += t' (when add);  h = rms_norm(x, next)
//   linear         qkv: h → q|k|v (rows, (Hq + 2·Hkv)·D) (gated attention: and each head's gate, (rows, Hq·D));
//                  o: attention output (· sigmoid(gate) when gated) → t;  gate_up: h → gate|up (rows, 2·I);
//                  down: glu output → t
//   prepare_heads  q and k: rms_norm per head (qk_norm), RoPE at each row's position (the layer's kind: global or
//                  sliding); plus the KV rotation where the device's cache expects rotated rows
//   kv_append      the k and v heads of every sequence into that sequence's cache of this layer
//   attention      q over each sequence's cache (causal; a sliding layer also windowed), in the rotated space
//   finish_heads   the attention output back from the rotated space, as (rows, Hq·D)
//   glu            act(gate)·up (SiLU or GELU-tanh)
//   moe            a mixture-of-experts layer's MLP, h → t: router logits h·W_rᵀ (rows, E), softmax (float32), the
//                  top experts_per_token (ties: the lower expert index), renormalised when norm_topk_prob; each
//                  expert's down(act(gate(h))·up(h)) over the rows routed to it, weighted and summed in expert order;
//                  plus, with a shared expert, sigmoid(h·w_sg) · shared(h)
//   linear_attention  a gated DeltaNet layer's token mixing (hybrid models), h → t: q|k|v, z, b, a projections, the
//                  causal conv (+SiLU) over q|k|v with the sequence's conv window, the gated delta rule over its
//                  recurrent state (nn/gated_delta.h), RMSNorm(o)·w·silu(z) per value head, out_proj
//   logits         rows of h (already final-normed) · W_headᵀ, with the final softcap, to the sequence's output
// Rotation: the CPU backend's caches (nn::KVCache, the seeds' classes) take unrotated rows and rotate on append, and
// nn::attention rotates the queries and the output; the CUDA backend rotates q (and k, v for Hadamard) in
// prepare_heads and back in finish_heads. Both store the same cache bytes (tests/cuda/test_cuda_model.cpp).
//
// A pass holds rows of one or more sequences (a batch): PassSegment says which rows belong to which sequence and at
// which positions. Per-row ops (norms, linears, GLU) run over all rows at once; kv_append and attention per segment.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "model/model.h"

namespace cider::model {

enum class NormSlot : uint8_t { kNone, kAttn, kPostAttn, kMlp, kPostMlp, kFinal };
enum class LinearSlot : uint8_t { kQKV, kO, kGateUp, kDown };

// Rows [row0, row0 + n) of a pass are tokens of sequence `seq` (an index into the batch) at positions pos0 … pos0 + n − 1.
struct PassSegment {
  int64_t seq = 0;
  int64_t row0 = 0;
  int64_t n = 0;
  int64_t pos0 = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void embed() = 0;
  // post: the norm on t before the add (kNone: none); next: the norm that makes h (layer next_layer's, or kFinal).
  virtual void residual_norm(bool add, int64_t layer, NormSlot post, int64_t next_layer, NormSlot next) = 0;
  virtual void linear(int64_t layer, LinearSlot slot) = 0;
  virtual void prepare_heads(int64_t layer) = 0;
  virtual void kv_append(int64_t layer) = 0;
  virtual void attention(int64_t layer) = 0;
  virtual void finish_heads(int64_t layer) = 0;
  virtual void glu() = 0;
  virtual void moe(int64_t layer) = 0;
  virtual void linear_attention(int64_t layer) = 0;
};

// The one layer loop: from x (embedded) through every layer, leaving h = final_norm(x).
void run_layers(const ModelConfig& c, Backend& b);

// One sequence's share of a forward call: tokens[0, n) at positions [start, start + n); logits as Model::forward
// writes them (all n rows, or the last row), or null to keep the last row on the device (Model::forward_candidates).
struct SequenceStep {
  const int32_t* tokens = nullptr;
  int64_t n = 0;
  int64_t start = 0;
  float* logits = nullptr;
  bool all_logits = false;
};

// A Backend that the host-driven forward (run_forward) can feed pass by pass.
class PassBackend : public Backend {
 public:
  virtual int64_t max_pass_rows() const = 0;
  // The pass's rows: tokens [rows] (host) in segment order.
  virtual void begin_pass(std::span<const PassSegment> segments, const int32_t* tokens) = 0;
  // logits of `rows` rows of h starting at row `first` → dst (host, [rows, vocab]; null: keep on the device).
  virtual void logits(int64_t first, int64_t rows, float* dst) = 0;
  // Rows rows[i] of h → row i (rows ascending, rows[i] >= i; in place, in order), so that one logits() call takes
  // the last rows of several sequences that are not side by side in the pass.
  virtual void gather_rows(std::span<const int64_t> rows) = 0;
  virtual void end_forward() = 0;  // wait for the device
};

// Splits the steps into passes of at most b.max_pass_rows() rows (a long prompt in chunks: the causal cache makes that
// exact; several sequences share a pass), runs embed → run_layers → logits for each, and waits for the device.
void run_forward(const ModelConfig& c, PassBackend& b, std::span<const SequenceStep> steps);

// The state a session keeps on its device: its KV caches and whatever drives the forward there.
class BackendSession {
 public:
  virtual ~BackendSession() = default;
  virtual size_t kv_bytes() const = 0;
  // Forget positions >= position (a trim, or undoing a failed forward). Only where can_truncate(position): sliding-
  // window caches that dropped old positions cannot go back before their window (position 0, a reset, always can).
  virtual void truncate(int64_t position) = 0;
  virtual bool can_truncate(int64_t position) const = 0;
  // The state on the host (model/session_state.h), for Model::snapshot; false: this device's sessions cannot copy it
  // there (optional).
  virtual bool snapshot(SessionState& out) const {
    (void)out;
    return false;
  }
  // Takes a state Model::restore_session checked against the model (optional: only where snapshot() works).
  virtual void restore(const SessionState& state);
  // A new session on the same device holding this one's first `position` positions, this one unchanged (Model checked
  // can_truncate(position)); null: this device's sessions cannot be copied (optional).
  virtual std::unique_ptr<BackendSession> copy_prefix(int64_t position) const {
    (void)position;
    return nullptr;
  }
  // Shared prefixes (Model::share_session; optional, where copy_prefix works): moves the complete blocks of every
  // layer cache that can be shared into read-only segments that copy_prefix then shares instead of copying.
  virtual void share() {}
  // The shared segments this session holds (their bytes are also in kv_bytes()).
  virtual void shared_kv(std::vector<SharedKvBlock>& out) const { (void)out; }
};

// A model's weights on one device and the forward there.
class BackendModel {
 public:
  virtual ~BackendModel() = default;
  virtual std::unique_ptr<BackendSession> new_session() const = 0;
  // steps[i] on sessions[i] (checked by Model: this model's sessions, ids in the vocabulary, within the context).
  virtual void forward(std::span<BackendSession* const> sessions, std::span<const SequenceStep> steps) const = 0;
  // The sampler's candidates from the last row a forward kept on the device; false when this device has no sampling.
  virtual bool candidates(BackendSession& s, const CandidateRequest& request, Candidates& out) const;
  virtual bool samples_on_device() const { return false; }
  // Whether forward_candidates_batch can run a decode batch of n sessions (optional).
  virtual bool samples_batches_on_device(int64_t n) const {
    (void)n;
    return false;
  }
  // One token per session (steps[i].n == 1, logits null) whose rows stay on the device, which answers requests[i]
  // with its candidates and the row's log normalizer (Candidates::row_max / row_log_sum); only where
  // samples_batches_on_device(sessions.size()).
  virtual void forward_candidates_batch(std::span<BackendSession* const> sessions, std::span<const SequenceStep> steps,
                                        std::span<const CandidateRequest> requests, std::span<Candidates> out) const {
    (void)sessions, (void)steps, (void)requests, (void)out;
    fail(ErrorCode::kInternal, "forward", "this device does not sample batches");
  }
  virtual bool can_snapshot() const { return false; }  // its sessions' snapshot() works (optional)
  virtual bool can_copy_sessions() const { return false; }  // its sessions' copy_prefix() works (optional)
  virtual bool can_share_sessions() const { return false; }  // its sessions' share() makes shared segments (optional)
  // Rows of one forward pass of its sessions (a longer step is split into passes): the most rows a server step
  // should hold, so that no prompt chunk is split between passes.
  virtual int64_t pass_rows() const = 0;
};

// The backend for model.options().device: the CPU (model/cpu_backend.cpp) or, in a CUDA build, the GPU
// (model/cuda/cuda_backend.cpp). cider::Error (kUnsupported) for a device this build lacks: never a silent fallback.
std::unique_ptr<BackendModel> make_backend(const Model::Impl& model);
void require_device(Device device);  // the same error, before anything is loaded
std::unique_ptr<BackendModel> make_cpu_backend(const Model::Impl& model);
std::unique_ptr<BackendModel> make_cuda_backend(const Model::Impl& model);  // uploads the weights
void require_cuda_device(const char* op);  // a CUDA build with a usable sm_90 GPU, or cider::Error (kUnsupported)

}  // namespace cider::model
