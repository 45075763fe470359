// cider/model/cuda/cuda_backend.h — the CUDA backend (`--device cuda`, model/backend.h): device weights uploaded from a
// loaded CPU model (or random ones for the benchmark), and sessions whose executor implements the Backend ops with the
// CUDA launchers, so the one forward (model/forward.cpp) runs on the GPU with per-layer device KV caches allocated once
// for the model's context. What is GPU-specific stays here: upload, CUDA graphs of the decode step, PDL, pinned I/O.
//
// Plain C++ (no CUDA headers): tests and benchmarks include it. Built only with -DCIDER_CUDA=ON.
//
// Per chunk of m tokens (x: float32 (m, hidden), the residual stream; every buffer below is device memory):
//   prefill (m ≥ 1, host positions): the GEMM paths of the linear layers, attention in tiles over [Hq, m, D] queries
//   decode  (m = 1, one CUDA graph): token id, position and KV length read from a 16-byte device block that the graph
//            itself copies in from pinned host memory; kv_append(d_offset), rope(d_pos), attention(d_length); the
//            last-row logits copied back to pinned host memory at the graph's end. One graph per capacity bucket
//            (the attention grid is sized by a bound on the KV length: min(ctx, max(256, next power of two))).
// The KV caches are [1, Hkv, ctx, ·] planes in the CPU cache's byte format (quantized with the same rotation and seed
// per layer as nn::QuantizedKVCache — SO(4) applied by kv_append, Hadamard by prepare_heads before a rotation-0
// append — f16 scales/biases; or plain bf16/f16/f32), so positions never move and a trim only lowers the session's
// position. The key and value planes of a layer are one allocation (values right after keys), so when keys and values
// have the same bits one kv_append (B = 2) writes both, otherwise one kv_append_pair.
// Per layer (model/forward.cpp run_layers): residual_norm, q|k|v linear, prepare_heads, kv_append (one launch),
// attention, [finish_heads], o linear, residual_norm, gate|up linear, glu_rows, down linear — the next layer's
// residual_norm closes it.
// Hybrid models (Qwen3-Next, Qwen3.5): a linear-attention layer has no KV cache but a recurrent state per session
// (kernels/cuda/gated_delta.h: S [Hv, Dk, Dv] and the conv window [K − 1, C], float32, allocated with the session,
// at the position of the session's latest step), and runs q|k|v|z linear, gdn_gates, causal_conv1d_silu (per
// sequence), l2norm_qk, gated_delta_rule (per sequence), gated_rms_norm, out linear. Gated attention multiplies the
// attention output by sigmoid(gate) before o (sigmoid_gate_rows); a shared expert runs after the routed ones. Their
// decode steps run without CUDA graphs (the states' positions are kept on the host, as MoE routing is).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/moe.h"
#include "model/backend.h"
#include "model/cuda/collective.h"
#include "model/model.h"
#include "model/session_state.h"
#include "nn/linear_weights.h"

namespace cider::model::gpu {

// A linear layer on the device: its descriptor (nn/linear_weights.h) with device pointers — into the buffers below,
// or (the tied bf16 head) w into a buffer owned elsewhere. Dense weights are always bf16 [N, K]; int8 [N, K]; int4
// uint8 [N, K/2] (element 2i in the low nibble, q + 8); scales float32 [N] (per channel) or [K/group_size, N].
// y (M, N) float32 = x (M, K) float32 · Wᵀ (+ bias).
struct GpuLinear : nn::LinearWeights {
  cuda::DeviceBuffer w_buf, scales_buf, bias_buf;
  // Dense only: x as bf16 hi + lo (cuda::dense_bf16_split: float32-faithful activations) instead of x rounded to
  // bf16 (GpuModel::split_activations).
  bool split_x = false;

  void attach();               // points w (unless already set elsewhere), scales and bias at the buffers
  size_t owned_bytes() const;  // device bytes this layer owns
  void forward(const float* x, int64_t M, float* out, const cuda::Exec& exec) const;
};

// Several linear layers over the same input whose outputs sit side by side in one (M, N = ΣNᵢ) buffer: q|k|v and
// gate|up. Uploaded as ONE layer (weight rows, per-channel scales and biases concatenated; per-group scales
// [K/gs, N] concatenated within each group row), so one GEMV streams them all; parts that cannot be concatenated
// (different formats or group sizes) run one by one into their column slices.
struct GpuFusedLinear {
  GpuLinear fused;               // when the parts share a format
  std::vector<GpuLinear> parts;  // otherwise (fused unused)
  int64_t N = 0, K = 0;

  size_t nbytes() const;
  int64_t max_part_N() const;  // scratch rows needed by the unfused path (0 when fused)
  // out (M, N) float32; scratch: (M, max_part_N()) float32 when the parts run one by one and M > 1, else unused.
  void forward(const float* x, int64_t M, float* out, float* scratch, const cuda::Exec& exec) const;
};

// One expert of a mixture-of-experts layer: gate|up fused [Ie | Ie, hidden] and down [hidden, Ie].
struct GpuExpert {
  GpuFusedLinear gate_up;
  GpuLinear down;
};

struct GpuLayer {
  cuda::DeviceBuffer attn_norm, q_norm, k_norm, post_attn_norm, mlp_norm, post_mlp_norm;  // float32 [dim]
  GpuFusedLinear qkv;      // [Hq·D | Hkv·D | Hkv·D, hidden]; gated attention: [Hq·D queries | Hq·D gates | Hkv·D | Hkv·D]
  GpuLinear o;
  GpuFusedLinear gate_up;  // [I | I, hidden]
  GpuLinear down;
  // Mixture-of-experts layers (ModelConfig::is_moe_layer) instead of gate_up/down: the router float32 [E, hidden]
  // kept on the host (the routing runs there: GpuSession::Impl::moe) and the experts on the device.
  std::vector<float> router;
  std::vector<GpuExpert> experts;
  // A shared expert beside them (ModelConfig::shared_expert_intermediate_size > 0): gate|up [Is | Is, hidden], down
  // [hidden, Is] on the device, its gate float32 [hidden] on the host (the routing's copy of h meets it there).
  GpuExpert shared;
  std::vector<float> shared_gate;
  // Device routing (GpuModel::moe_on_device): the router and the shared expert's gate on the device too (float32
  // [E, hidden], [hidden]), and the experts' gate|up and down weights as tables of cuda::MoeExpertWeights [E].
  cuda::DeviceBuffer router_dev, shared_gate_dev, moe_gu_table, moe_down_table;
  // Gated DeltaNet layers (ModelConfig::is_linear_layer) instead of qkv/o, with C = 2·Hk·Dk + Hv·Dv and V = Hv·Dv
  // (ModelConfig::LinearAttention): the q|k|v and z projections fused [C | V, hidden] and out_proj [hidden, V] in the
  // weight format; b and a float32 [2·Hv, hidden] (b's rows then a's, kept float32 as the CPU keeps them: the decay
  // is exponentiated and compounds over the sequence), A_log and dt_bias [Hv], the conv kernel [C, K] and the output
  // norm's weight [Dv], float32.
  GpuFusedLinear lin_qkvz;
  GpuLinear lin_out;
  cuda::DeviceBuffer lin_ba, A_log, dt_bias, conv_w, lin_norm;
  // The KV cache rotation of this layer (seed = layer): SO(4) quaternions rot_left/rot_right float32 [D/4, 4], or the
  // Hadamard signs in rot_left [D].
  cuda::DeviceBuffer rot_left, rot_right;
};

struct GpuModel {
  ModelConfig config;
  KVOptions kv;       // as the CPU model uses them (plain caches: rotation none)
  int64_t ctx = 0;    // KV capacity of every session, in positions (sliding layers: slide_capacity())
  bool kv_full_sliding = false;  // ModelOptions::kv_full_sliding: sliding layers keep every position
  WeightFormat weights = WeightFormat::kBF16;
  cuda::DeviceBuffer embed;  // [vocab, hidden] in embed_dtype, or vocab rows of native GGUF blocks (embed_ggml_type)
  DType embed_dtype = DType::kBF16;
  uint32_t embed_ggml_type = 0;  // a quant::GgmlType with kernels (the rows are decoded per token), or 0
  std::vector<GpuLayer> layers;
  cuda::DeviceBuffer final_norm;
  GpuLinear lm_head;
  // RoPE cos/sin for every position of the context, float32 [ctx, D] (rope_table() below), uploaded once per model:
  // prepare_heads reads the row of the position instead of evaluating sin/cos in double on the device. The local one
  // (sliding-window layers with their own inv_freq, Gemma 3) only when some layer slides and its inv_freq differs;
  // otherwise empty and rope_for() gives the global table.
  cuda::DeviceBuffer rope_global, rope_local;
  size_t weight_bytes = 0;
  // Hybrid models with dense weights: every dense layer (the head too) runs cuda::dense_bf16_split. Their gated
  // DeltaNet layers amplify small input errors (the RMSNorm of each head's output renormalises a sum that can
  // cancel), so rounding the activations to bf16 — what dense_bf16 does, harmless elsewhere — moves the tiny
  // fixtures' logits by O(1) from the CPU's (measured by emulating it on the CPU: 4.0 of max 7.1 on qwen3_next, 1.9
  // of 37 on qwen3_5); hi + lo brings that to 0.004 (docs/cuda/model.md). The price: 2·M GEMM rows (prefill FLOPs
  // twice; decode reads the weights once, for two rows).
  bool split_activations = false;
  // Mixture-of-experts layers route on the device for passes of at most moe_device_rows rows (decode steps and small
  // decode batches: kernels/cuda/moe.h, no host round trip, so MoE decode steps run as CUDA graphs); larger passes
  // (prefill, larger batches) route on the host and group rows by expert. Set at upload (prepare_device_moe) when
  // every expert's gate|up is one fused layer and every expert layer passes cuda::moe_gemv_supports, E ≤
  // cuda::kMoeMaxExperts, and the model has no linear-attention layers; $CIDER_CUDA_MOE_ROUTING=host turns it off.
  bool moe_on_device = false;
  int64_t moe_device_rows = 0;
  static constexpr int64_t kMoeDeviceRows = 16;  // the most rows moe_device_rows may allow
  // Tensor parallelism (model/tensor_parallel.h): this rank's share of the model when comm is set — config is the
  // rank's shape (tp_shard_config), lm_head holds vocabulary rows [vocab0, vocab0 + head_rows()), and the o, down and
  // MoE outputs are all-reduced through comm. `device`: the CUDA device the buffers live on.
  std::shared_ptr<Collective> comm;
  int device = 0;
  int64_t vocab0 = 0;
  int64_t head_rows() const { return lm_head.N; }

  const float* rope_for(bool sliding) const;
  int rotation() const;        // 0, 1, 2, 3 (kernels' numbering: none, so4 fast, so4 full, hadamard) of the KV caches
  // Sliding-window layers keep only their window (as nn's sliding-window caches, nn/kv_cache.h): positions
  // [base, end) in storage of slide_capacity(chunk) rows; 0 when they keep every position (kv_full_sliding, no
  // sliding layer, or a context that fits the bound anyway). A layer is bounded when layer_sliding and this is > 0.
  int64_t slide_capacity(int64_t chunk) const;
  DType kv_store_dtype() const;  // quantized: the scale/bias dtype; plain: the element dtype
};

// The RoPE table of `positions` positions for inv_freq [D/2]: row p = cos(θ)·attention_factor for the D/2 frequencies,
// then sin(θ)·attention_factor, with θ = fl(p·inv_freq[i]) the float32 product and the products evaluated in double
// and rounded once — the CPU forward's rope_tables (model/cpu_backend.cpp) value for value. attention_factor: the
// rope's (YaRN, LongRoPE; model.h RopeConfig), 1 otherwise.
std::vector<float> rope_table(const std::vector<float>& inv_freq, int64_t positions, double attention_factor = 1.0);

// Checks that the model can run on the GPU (a device, a weight format the GPU has kernels for, a KV rotation the GPU
// kernels know) and uploads it. cider::Error (kUnsupported) otherwise: never a silent CPU fallback.
// The tensors come from the loaded CPU model (model/transformer.h): dense bf16 weights as they are (any other float
// dtype rounded to bf16), int8/int4 codes and float32 scales in cider's layout as they are.
// With comm: rank comm->rank()'s share of a split over comm->size() ranks (model/tensor_parallel.h; the split checked
// by check_tensor_parallel), uploaded to the current device.
std::shared_ptr<const GpuModel> upload_model(const Model::Impl& cpu, std::shared_ptr<Collective> comm = nullptr);

// A model of the given shape with random device weights (no checkpoint): for benchmarks. Formats bf16, w8a8 (per
// channel or per group) and w4a8; weights uniform in ±1/√K (int: random codes, scales 1/(127·√K)), norms 1.
// With comm: rank comm->rank()'s share of such a model (its shapes; random weights of its own).
std::shared_ptr<const GpuModel> random_model(const ModelConfig& config, WeightFormat weights, const KVOptions& kv,
                                             int64_t ctx, uint64_t seed, std::shared_ptr<Collective> comm = nullptr);

class GpuSession {
 public:
  explicit GpuSession(std::shared_ptr<const GpuModel> model);
  ~GpuSession();
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;

  // tokens[0, n) (host, already validated) at positions [start, start + n); logits (host) as Model::forward writes
  // them. n == 1 runs the decode step (graph replay unless use_graphs is false); otherwise chunks of prefill_chunk()
  // tokens.
  // logits null (all_logits false): the last row stays on the device for candidates() (decode graphs without the
  // copy are captured separately).
  void forward(const int32_t* tokens, int64_t n, int64_t start, float* logits, bool all_logits);
  // Several sessions of one model in one forward (Model::forward_batch): steps[i] on sessions[i], every row of the
  // batch through each linear layer at once, kv_append and attention per session; on sessions[0]'s stream and
  // activations. Logits to the host. A step of one token per session (a decode batch) runs at device positions
  // through a CUDA graph of sessions[0]'s, keyed by the sessions, their KV bounds and whether the rows are copied out
  // (recaptured when they change; use_graphs of sessions[0] false: the same launches directly); other steps (prompt
  // chunks) run directly. A decode batch may leave every logits pointer null: its rows then stay on the device for
  // batch_candidates (a null pointer is an error anywhere else).
  static void forward_batch(std::span<GpuSession* const> sessions, std::span<const SequenceStep> steps);
  // After forward_batch of a decode batch that kept its rows on the device (the same sessions, in order): each row's
  // candidates for requests[i] (cuda::topk_logits, one after another on the lead's stream) and its log normalizer
  // (cuda::log_normalizers over all rows), then everything to the host in one copy. requests[i].k in
  // [1, kDeviceTopkMax], at most kDeviceExcludedMax excluded tokens each.
  static void batch_candidates(std::span<GpuSession* const> sessions, std::span<const CandidateRequest> requests,
                               std::span<Candidates> out);
  // The sampler's candidates (model/sampler.h) from the last row of logits of the latest forward():
  // cuda::topk_logits on the device, then k ids and logits (and the excluded tokens' logits) to the host.
  void candidates(const CandidateRequest& request, Candidates& out);

  size_t kv_bytes() const;
  const GpuModel& model() const { return *model_; }
  // Forget positions >= position (Session::trim): per-channel keys bring a quantized block's kept rows back into
  // their residual window; other caches need nothing (later positions are overwritten). Bounded sliding layers
  // (GpuModel::slide_capacity) go back only while the new end's window is still held, and linear-attention states
  // only to where they are (can_truncate; cider::Error otherwise); position 0 starts them over (states zeroed).
  void truncate(int64_t position);
  bool can_truncate(int64_t position) const;
  // This (new) session becomes src's first `position` positions (src unchanged, src.can_truncate(position)): every
  // cache and recurrent state copied on the device, then truncated (Model::copy_session on the CUDA device).
  void copy_prefix_from(const GpuSession& src, int64_t position);

  // The session's state on the host (Model::snapshot, the server's prompt cache on disk): every attention layer's
  // cache in the CPU cache's planes (nn::KVCacheSnapshot; the device keeps the same planes, [Hkv, rows, ·] each, so
  // a CPU session can restore it and this device a CPU session's), metas[l] the layer's format with its dims (model/
  // session_state.h expected_cache_meta: length and start are the session's), and the linear-attention states.
  void snapshot(std::span<const nn::KVCacheMeta> metas, SessionState& out) const;
  // This (new) session takes a state Model::restore_session checked against the model. What only this device
  // requires, else cider::Error (kUnsupported) naming it: a bounded sliding layer's positions fit its storage and
  // every bounded layer starts at the same position; other layers start at 0.
  void restore(std::span<const nn::KVCacheMeta> metas, const SessionState& st);

  // Decode through CUDA graphs (default) or the same launches enqueued directly (tests compare the two). Models with
  // MoE or linear-attention layers always decode directly (their steps need the host between launches).
  bool use_graphs = true;
  // Timing experiments only (the results are garbage): leave out of what enqueue_decode enqueues every linear layer
  // (kSkipLinear), the attention launches (kSkipAttention), the kv_appends (kSkipAppend) and/or the model's small
  // kernels (kSkipSmall: residual_norm, prepare_heads, finish_heads, glu_rows), to split a graph's time into parts.
  // A decode batch (forward_batch) takes its lead session's.
  static constexpr int kSkipLinear = 1, kSkipAttention = 2, kSkipAppend = 4, kSkipSmall = 8;
  int bench_skip = 0;
  int64_t graphs_captured() const;
  int64_t batch_graphs_captured() const;  // batched decode graphs captured while this session led a batch
  int64_t batch_graphs_updated() const;   // of them, graphs of another composition updated in place

  // ---- benchmark hooks ----
  // Writes positions [0, length) of every layer's cache with random rows (through kv_append, so the bytes are valid).
  void fill_cache_random(int64_t length, uint64_t seed);
  // The decode step's inputs (pinned host memory, read by the next enqueue_decode when the stream reaches it).
  void set_decode_input(int32_t token, int64_t position);
  // Enqueues one decode step on `stream` (cudaStream_t; null = the session's own): what a captured graph holds.
  void enqueue_decode(void* stream);
  void* stream() const;
  void synchronize() const;

  // Prefill chunk: rows per forward pass of a prompt (the activation buffers are sized for it, ≈ 280 KB per row for
  // Llama-3-8B's shapes). $CIDER_PREFILL_CHUNK (read when the session is made; 1 … 65536) or kDefaultPrefillChunk,
  // at most the context length. Larger chunks run the linear layers as larger GEMMs (docs/cuda/model.md).
  static constexpr int64_t kDefaultPrefillChunk = 2048;
  int64_t prefill_chunk() const;
  // What prefill_chunk() of a session made now for a model of ctx positions is.
  static int64_t prefill_chunk_for(int64_t ctx);

 private:
  struct Impl;
  std::shared_ptr<const GpuModel> model_;
  std::unique_ptr<Impl> impl_;
};

// The GPU session behind a Model session made on a CUDA model (tests and tools: graphs on/off, captured graphs); null
// for a CPU session.
GpuSession* gpu_session(Session& s);

}  // namespace cider::model::gpu
