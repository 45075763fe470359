// cider/model/model.h — a loaded language model and its per-conversation state (Session: the KV caches).
//
// This header is the contract between the engine (model/*.cpp: loaders, architectures, forward) and its users
// (generation, the CLI, perplexity). Model::load reads Hugging Face directories (safetensors + config.json +
// tokenizer.json), MLX-quantized directories, GGUF files and cider-converted files, and builds the weights in the
// requested format.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "nn/kv_spec.h"
#include "nn/linear_weights.h"
#include "nn/rotation.h"

namespace cider::model {

enum class Architecture {
  kLlama, kMistral, kQwen2, kQwen3, kGemma3, kGemma2, kMixtral, kQwen3Moe, kPhi3, kQwen3Next, kQwen35, kOlmoe
};
const char* architecture_name(Architecture a);

// --weights: how linear-layer weights are held in memory. One row per format in weight_format_info's table
// (model/weight_format.cpp): adding a format is one enum value and one table row, plus its kernels.
enum class WeightFormat {
  kF32, kBF16, kW8A8, kW8A8G64, kW8A8G128, kW8A8G256, kW4A8, kNative, kQ8_0, kQ6_K, kQ5_1, kQ5_0, kQ4_K_M, kQ4_K, kQ4_1,
  kQ4_0
};
using nn::WeightKind;  // what a linear layer holds: float, int8 codes, packed int4 codes (nn/linear_weights.h)
struct WeightFormatInfo {
  WeightFormat id;
  const char* name;         // the --weights value
  WeightKind kind;
  DType dtype;              // dense: the float dtype held; int: the code dtype (i8, u8 = two int4 codes)
  int group_size;           // int: weights per float32 scale along K (0 = one scale per output channel)
  const char* activations;  // what the kernels multiply the weights with
  bool cuda;                // --device cuda has kernels for it
  const char* summary;
  // Formats that requantize every linear layer into a GGUF block type with cider's encoder (quant/ggml_quantize.h;
  // kind kGgml, run by the native-weight kernels): the body's ggml type id, the type taken where a layer's K is not a
  // multiple of the body type's block (the K-quants' 256), and the LM head's type; a mix also names the type of the
  // layers that quantization hurts most (v_proj and down_proj: is_sensitive_layer) and its fallback. 0 for every other
  // format.
  uint32_t ggml_body = 0, ggml_fallback = 0, ggml_head = 0, ggml_sensitive = 0, ggml_sensitive_fallback = 0;
};
const WeightFormatInfo& weight_format_info(WeightFormat f);
// Whether a linear layer (its checkpoint name) takes a mix's ggml_sensitive type: the value and down projections,
// the layers that 4-bit weights hurt most on Gemma 3 270M (docs/quality.md) and that llama.cpp's Q4_K_M raises too.
bool is_sensitive_layer(std::string_view name);
std::span<const WeightFormatInfo> weight_formats();
WeightFormat parse_weight_format(std::string_view s);  // "bf16", "w8a8-g128", ...; cider::Error otherwise
const char* weight_format_name(WeightFormat f);
std::string weight_format_names(bool cuda_only = false);  // "f32, bf16, w8a8, ..." for messages and help

// --kv, --kv-rotation, --kv-layout, --kv-group-size: the KV cache of every attention layer, in nn::KVSpec's terms
// (nn/kv_spec.h: the one description of a cache format and its rules). Plain caches are never rotated by the engine.
struct KVOptions : nn::KVSpec {
  // The group size was not chosen by the user: a head_dim it does not divide gets the largest of 128/64/32 that
  // does (e.g. 32 for head_dim 32) instead of an error.
  bool group_size_auto = false;
  // The outlier-key-channel count was not chosen (`--kv-outliers auto`, the CPU's default cache): Model::load sets
  // key_outliers to nn::auto_key_outliers(head_dim) with per-channel keys, 0 with per-token keys.
  bool key_outliers_auto = false;
  // default_kv's cache, untouched by options: Model::load may adapt it to the model (on CUDA, heads other than 128 or
  // 256 wide — which the tensor-core kernels do not read per channel — get k8v4/hadamard with keys per position).
  bool device_default = false;
};
// "bf16", "f16", "f32" (plain) or "k<bits>v<bits>" (quantized, bits in 2,3,4,5,6,8); cider::Error otherwise.
KVOptions parse_kv_format(std::string_view s);
nn::RotationKind parse_kv_rotation(std::string_view s);  // "so4-full", "so4-fast", "hadamard", "none"
std::string kv_format_name(const KVOptions& kv);         // "k4v3/so4-full/g64", "bf16"

// --device: where the forward pass runs. kCUDA needs a build with -DCIDER_CUDA=ON and an sm_90 GPU (model/cuda);
// Model::load fails with kUnsupported otherwise (never a silent CPU fallback).
enum class Device { kCPU, kCUDA };
Device parse_device(std::string_view s);  // "cpu", "cuda"; cider::Error otherwise
const char* device_name(Device d);

// The KV cache a model gets when none is asked for (docs/quality.md has the measurements behind it): per-channel keys
// with head_dim/32 outlier key channels. On the CPU k4v4 with symmetric values, the recent block and the sink read
// unquantized and blocks (and value groups) of 128 (4.25 bits per value; the largest of 64/32 dividing a head 128
// does not: 4.44 bits at 64; the fewest measured within KL 0.02 and +1% perplexity on every real model, at ctx 512
// and 2048); on CUDA group 64 (or the largest of 32 dividing the head) and k5v4 with affine
// values (5.07 bits; its kernels read neither symmetric values nor the recent block). On CUDA a model whose heads are
// not 128 or 256 wide gets k8v4/hadamard with keys per position instead (6.5 bits; KVOptions::device_default).
KVOptions default_kv(Device device);

// The weight format a model gets when none is asked for: native for a GGUF file on either device (its blocks
// multiplied as they are, the file's own fidelity: docs/quality.md) and for a cider directory converted with
// --weights native (its metadata says so), else bf16. (The device is kept for formats a device may lack.)
WeightFormat default_weights(const std::string& path, Device device);

struct ModelOptions {
  WeightFormat weights = WeightFormat::kBF16;
  KVOptions kv;
  int64_t ctx = 0;  // context length in tokens; 0 = the model's maximum (capped at 8192 when that is larger)
  Device device = Device::kCPU;
  // Sliding-window layers keep only their window in the KV cache (drop older positions, nn/kv_cache.h) unless this
  // is set: then they keep every position and attention masks them (more memory; trims to any position).
  bool kv_full_sliding = false;
  // Tensor-parallel ranks (`--tp`): the model split over this many GPUs of the host, one rank per GPU, all-reduced
  // through NCCL (model/tensor_parallel.h); 1 = one device. More than 1 needs device kCUDA.
  int tp = 1;
  // `--imatrix`: an importance file (`cider imatrix`, model/activation_stats.h) that weights the block fits of a
  // requantizing format (q4_k_m, q4_0, …; quant/ggml_quantize.h); empty: plain least-squares fits.
  std::string imatrix;
  // `--head-weights`: the LM head's block type for a requantizing format, named by the plain format that uses it for
  // every layer (q8_0, q6_k, q5_1, q5_0, q4_k, q4_1, q4_0); unset: the format's own head type (Q8_0). With second
  // moments of the head's input in --imatrix, a tied head is GPTQ-coded apart from the embedding, which the lookup
  // then reads from the source (docs/engine.md).
  std::optional<WeightFormat> head_weights;
  // A CPU model's native weights in the row order its kernels read fastest (model/loader.h interleave_for_kernels);
  // off for a load whose weights are written out as they are (cider convert) and with the CLI's --no-repack.
  bool kernel_layout = true;
};

// The architecture's hyper-parameters after reading any of the supported formats (the engine adds fields).
// Rotary position embedding of one kind of layer, HF's convention: pairs (i, i + head_dim/2) of each head are rotated
// by the angle position·inv_freq[i] (rotate_half), inv_freq[i] = theta^(−2i/head_dim) adjusted by the scaling below.
// Scalings (HF's rope_type; transformers' modeling_rope_utils is the reference; docs/engine.md "RoPE scaling"):
//   linear    inv_freq / factor
//   llama3    the low frequencies / factor, the high ones kept, a smooth band between (original_max_position)
//   yarn      YaRN: frequencies below the beta_slow..beta_fast correction band interpolated (/ factor), above it
//             kept, a linear ramp between; cos/sin × attention_factor (0.1·ln(factor) + 1 by default)
//   longrope  LongRoPE (Phi-3): inv_freq / long_factor[i] when the context exceeds original_max_position, else
//             / short_factor[i]; cos/sin × attention_factor (√(1 + ln(factor)/ln(original_max_position)))
//   dynamic   dynamic NTK: theta·((factor·ctx/original_max_position) − (factor − 1))^(D/(D−2)) when the context
//             exceeds original_max_position (= max_position_embeddings), else unscaled
// The long/short choice and the dynamic base depend on the context: one static choice at load time from the model's
// context (Model::context_length()), as llama.cpp does; transformers switches per forward on the sequence length,
// which gives the same numbers when the sequence fills the context.
enum class RopeScaling { kNone, kLinear, kLlama3, kYarn, kLongRope, kDynamic };
struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;                    // linear, llama3, yarn, dynamic (longrope: for its attention factor)
  double low_freq_factor = 1.0;           // llama3
  double high_freq_factor = 4.0;          // llama3
  // llama3, yarn, longrope: the context the model was pre-trained on; dynamic: max_position_embeddings.
  int64_t original_max_position = 8192;
  double beta_fast = 32.0;                // yarn: correction band, in rotations over original_max_position
  double beta_slow = 1.0;
  bool truncate = true;                   // yarn: the band's ends rounded outwards to whole dimensions
  // Multiplies cos and sin (yarn, longrope; 1 otherwise), resolved when the config is read.
  double attention_factor = 1.0;
  std::vector<float> short_factor, long_factor;  // longrope: [head_dim/2] frequency divisors
  // GGUF files of llama3-scaled models carry the scaling as per-frequency divisors instead (tensor rope_freqs,
  // [head_dim/2]): inv_freq[i] = theta^(−2i/head_dim) / freq_factors[i]. Empty when unused.
  std::vector<float> freq_factors;
};
// inv_freq [head_dim/2] in float32, computed as HF does (in double, rounded once). `ctx` is the model's context length
// (longrope's long/short choice, dynamic NTK's base); the other scalings ignore it. With 0 < rotary_dim < head_dim
// (partial rotary): the frequencies of rotary_dim (as HF computes them over the rotary dims), then zeros up to
// head_dim/2 — pairs that do not rotate (the rope tables give them cos 1, sin 0, without the attention factor).
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim, int64_t ctx, int64_t rotary_dim = 0);

enum class Activation { kSiLU, kGeluTanh };  // MLP gate: SwiGLU (silu) or GeGLU (gelu, tanh approximation)

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position = 0;
  int32_t bos_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  // ---- added by the engine (model/config.h reads them from every format) ----
  double rms_norm_eps = 1e-6;
  // RMSNorm multiplies by (norm_weight_offset + w): 1 for Gemma checkpoints from HF (its (1 + w) norm), 0 otherwise
  // (llama.cpp's GGUF converter stores Gemma's 1 + w, so GGUF Gemma uses 0).
  float norm_weight_offset = 0.0f;
  bool qkv_bias = false;        // q/k/v projections carry a bias (Qwen2; attention_bias of Llama/Qwen3/Gemma 3)
  bool o_bias = false;          // o_proj carries a bias (attention_bias of Llama/Qwen3/Gemma 3)
  bool mlp_bias = false;        // gate/up/down carry biases (Llama mlp_bias)
  bool qk_norm = false;         // RMSNorm over each query/key head before RoPE (Qwen3, Gemma 3)
  bool qk_norm_full = false;    // with qk_norm: one RMSNorm over the whole q (Hq·D) and k (Hkv·D) row (OLMoE)
  float clip_qkv = 0.0f;        // > 0: q, k (after their norms) and v clamped to ±clip_qkv (OLMoE's clip_qkv); 0 = none
  bool sandwich_norms = false;  // Gemma 3: post-attention, pre- and post-feedforward norms
  Activation activation = Activation::kSiLU;
  float attn_scale = 0.0f;      // multiplies q·k: head_dim^−1/2, Gemma 3 query_pre_attn_scalar^−1/2
  float embed_scale = 1.0f;     // Gemma: √hidden (rounded to the checkpoint dtype, as HF does)
  float final_logit_softcap = 0.0f;  // > 0: logits = cap·tanh(logits/cap) (Gemma); 0 = none
  float attn_logit_softcap = 0.0f;   // > 0: attention scores s = cap·tanh(s/cap) before the mask (Gemma 2); 0 = none
  bool tie_word_embeddings = false;  // LM head = the embedding matrix
  RopeConfig rope;        // full-attention layers
  RopeConfig rope_local;  // sliding-window layers (Gemma 3 uses its own base there)
  // Partial rotary embeddings (partial_rotary_factor < 1: Phi-4-mini, Qwen3-Next): only the first rotary_dim dims
  // of each head rotate (pairs (i, i + rotary_dim/2)); 0 = all of head_dim. The loader reorders every q/k head so
  // that the rotated pairs sit at (i, i + head_dim/2) and the rest stay in place of rotation (q·k is unchanged by
  // one reordering of both), so the forward and the kernels only ever rotate (i, i + head_dim/2) pairs; the rope
  // tables hold cos 1, sin 0 for the unrotated pairs (inv_freq 0: rope_inv_freq).
  int64_t rotary_dim = 0;
  int64_t rope_dim() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  int64_t sliding_window = 0;         // > 0: a sliding layer's query at p sees keys p − window < j ≤ p
  std::vector<uint8_t> layer_sliding;  // [num_layers]: 1 = sliding-window layer
  DType dtype = DType::kBF16;          // the checkpoint's float dtype (config torch_dtype / dtype)
  // Mixture of experts (Mixtral, Qwen3-MoE): a layer with layer_moe[l] = 1 replaces its MLP by a router (hidden →
  // num_experts logits, softmax in float32, the experts_per_token largest kept, renormalised to sum 1 when
  // norm_topk_prob) and num_experts GLU MLPs of expert_intermediate_size; the output is the weighted sum of the
  // chosen experts' outputs. layer_moe is empty (or all 0) for dense models.
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_intermediate_size = 0;
  bool norm_topk_prob = true;
  std::vector<uint8_t> layer_moe;  // [num_layers] or empty
  bool is_moe_layer(int64_t layer) const {
    return !layer_moe.empty() && layer_moe[static_cast<size_t>(layer)] != 0;
  }
  // A shared expert beside the routed ones (Qwen3-Next): a GLU MLP of this size on every row of a MoE layer, its
  // output times sigmoid(h·w_gate) (one gate value per row) added to the experts' sum. 0 = none.
  int64_t shared_expert_intermediate_size = 0;
  // Gated attention (Qwen3-Next, Qwen3.5): q_proj yields each head's query and a gate of head_dim values; the
  // attention output is multiplied by sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  // Hybrid models (Qwen3-Next, Qwen3.5): layer_linear[l] = 1 replaces layer l's attention by a gated DeltaNet
  // (model/transformer.h): a recurrent state of num_v_heads (k_head_dim × v_head_dim) float32 matrices and a causal
  // depthwise convolution over the last conv_kernel projected rows, instead of a KV cache.
  struct LinearAttention {
    int64_t num_k_heads = 0, num_v_heads = 0;  // num_v_heads a multiple of num_k_heads: each key head serves
                                               // num_v_heads / num_k_heads consecutive value heads
    int64_t k_head_dim = 0, v_head_dim = 0;
    int64_t conv_kernel = 0;
    // Value-head order: false (the checkpoints'): value head h belongs to key head h / (num_v_heads / num_k_heads);
    // true (llama.cpp's "qwen35" GGUF, whose converter reorders every value-head tensor): key head h % num_k_heads.
    bool v_tiled = false;
    int64_t key_dim() const { return num_k_heads * k_head_dim; }
    int64_t value_dim() const { return num_v_heads * v_head_dim; }
    int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // the convolved channels: q | k | v
    // Bytes of one sequence's state in one layer: the float32 recurrent state and the conv window.
    int64_t state_bytes() const {
      return 4 * (num_v_heads * k_head_dim * v_head_dim + (conv_kernel - 1) * conv_dim());
    }
  };
  LinearAttention linear_attn;
  std::vector<uint8_t> layer_linear;  // [num_layers] or empty
  bool is_linear_layer(int64_t layer) const {
    return !layer_linear.empty() && layer_linear[static_cast<size_t>(layer)] != 0;
  }
  bool has_linear_layers() const {
    for (uint8_t v : layer_linear)
      if (v != 0) return true;
    return false;
  }
};

// Bytes of KV cache a CPU session of a model of config c holds after `positions` positions, every layer in format kv:
// what Session::kv_bytes then reports (nn::kv_cache_bytes per layer; sliding-window layers bounded by their window
// unless full_sliding).
// shared: positions [0, shared) of the layers without a sliding window are held in segments shared with other
// sessions (Model::share_session) and not counted: those layers count positions − shared.
int64_t kv_cache_bytes(const ModelConfig& c, const KVOptions& kv, int64_t positions, bool full_sliding = false,
                       int64_t shared = 0);

// A block of KV bytes shared by sessions (Model::share_session): its identity, equal in every session holding it.
struct SharedKvBlock {
  const void* id = nullptr;
  size_t bytes = 0;
};

// (stage, done, total): called while loading/converting so the CLI can draw a progress bar.
using ProgressFn = std::function<void(const char* stage, int64_t done, int64_t total)>;

class Model;
class ActivationStats;  // model/activation_stats.h
struct SessionState;  // model/session_state.h
struct SequenceStep;  // model/backend.h

// The state of one token sequence: every layer's KV cache and the number of positions processed.
class Session {
 public:
  ~Session();
  int64_t position() const;     // tokens processed so far
  // Forget the last min(n, position) tokens (speculative rollback); returns how many. A session whose sliding-window
  // layers dropped old positions can go back only as far as their window still reaches (can_truncate): trimming
  // further throws cider::Error (kOutOfRange) and changes nothing. Trimming to position 0 always works.
  int64_t trim(int64_t n);
  bool can_truncate(int64_t position) const;  // whether trim(this->position() − position) would succeed
  size_t kv_bytes() const;      // bytes of KV storage allocated, all layers (shared segments included)
  // The shared segments it holds (Model::share_session), each once: count a block once however many sessions hold it.
  void shared_kv(std::vector<SharedKvBlock>& out) const;
  struct Impl;
  Impl& impl() { return *impl_; }
  const Impl& impl() const { return *impl_; }

 private:
  friend class Model;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Model {
 public:
  // path: a directory (HF / MLX / cider-converted) or a .gguf file. cider::Error on anything unsupported or corrupt.
  static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& options,
                                     const ProgressFn& progress = {});
  ~Model();

  const ModelConfig& config() const;
  const ModelOptions& options() const;
  const Tokenizer& tokenizer() const;
  int64_t context_length() const;  // the effective ctx
  // Rows of one forward pass on this model's device (CPU: kMaxChunk; CUDA: the prefill chunk, $CIDER_PREFILL_CHUNK or
  // 2048, at most the context): a longer forward runs in passes of this many rows.
  int64_t pass_rows() const;
  size_t weight_bytes() const;     // bytes of weights held in memory (mapped bf16 tensors count as held)
  // The model's own chat template (Jinja source; model/chat_template.h renders it), empty when it has none; and the
  // BOS / EOS strings a template sees.
  const std::string& chat_template() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;

  std::unique_ptr<Session> new_session() const;
  // Calibration (`cider imatrix`): while set, every CPU forward adds each linear layer's input rows to *stats
  // (model/activation_stats.h); nullptr stops. Only on the CPU (kUnsupported elsewhere); *stats must outlive the
  // recording.
  void record_activations(ActivationStats* stats);
  // Processes tokens[0, n) at positions [s.position(), s.position() + n) and writes logits (float32): all n rows
  // ([n, vocab]) when all_logits, else only the last row ([vocab]). Throws cider::Error (kOutOfRange) if the
  // positions would pass context_length(), before changing the session.
  void forward(Session& s, const int32_t* tokens, int64_t n, float* logits, bool all_logits) const;
  // Several sessions' tokens in one forward (the server's batch): per-row work (the linear layers) runs over every
  // item's rows at once, attention per session. Each item as forward() above; a session at most once. On error no
  // session changes.
  struct BatchItem {
    Session* session = nullptr;
    const int32_t* tokens = nullptr;
    int64_t n = 0;
    float* logits = nullptr;
    bool all_logits = false;
  };
  void forward_batch(std::span<const BatchItem> items) const;
  // Sampling on the device (--device cuda): forward() of tokens[0, n) whose last row of logits stays on the GPU, which
  // answers the sampler's request (model/sampler.h) with its top-k candidates — k tokens cross to the host instead of
  // the vocabulary. Returns false, having done nothing, when the session runs on the CPU or request.k is 0.
  bool forward_candidates(Session& s, const int32_t* tokens, int64_t n, const CandidateRequest& request,
                          Candidates& out) const;
  // The same for a decode batch (the server's step): one token per item (n == 1; logits and all_logits ignored), each
  // row answered on the device with requests[i]'s candidates and the row's log normalizer (Candidates::row_max,
  // row_log_sum: logprobs without copying the row). Returns false, having done nothing, where the device cannot
  // (the CPU; a tensor-parallel model; a model whose decode steps need the host) or a request has k 0. On error no
  // session changes.
  bool forward_batch_candidates(std::span<const BatchItem> items, std::span<const CandidateRequest> requests,
                                std::span<Candidates> out) const;
  bool samples_on_device() const;  // forward_candidates can answer (a GPU device)
  // A session's state copied to the host, and a new session holding a copy of one (model/session_state.h): the
  // server's prefix cache on disk. Only where can_snapshot() (the CPU device, and one GPU: its caches copied in the CPU cache's planes):
  // elsewhere both throw cider::Error (kUnsupported). restore_session checks everything against this model before
  // allocating a session (the layer count, each cache's format, seed, window, dims, length and start, the linear-
  // attention states' sizes and positions, outlier channel indices) and throws cider::Error (kCorrupt) naming what
  // differs; a state from snapshot() of this model's session always passes.
  bool can_snapshot() const;
  SessionState snapshot(const Session& s) const;
  std::unique_ptr<Session> restore_session(const SessionState& state) const;
  // A new session holding a copy of s's first `position` positions — what s would hold after trim(s.position() −
  // position), s unchanged — copied on the session's device, only the kept positions (the server's prefix cache:
  // every request sharing a pooled prefix gets its own copy). Only where can_copy_sessions() (CPU: the kept positions;
  // CUDA: every buffer, device to device) and s.can_truncate(position); else cider::Error (kUnsupported, kOutOfRange)
  // naming the rule.
  bool can_copy_sessions() const;
  std::unique_ptr<Session> copy_session(const Session& s, int64_t position) const;
  // Shared prefixes (where can_share_sessions: the CPU device): moves s's complete blocks (of the group size for per-channel keys,
  // every position otherwise) in the layers without a sliding window into read-only segments, one copy of them, so
  // that copy_session then shares them instead of copying: N sessions copied from s hold its prefix once (reference
  // counted, freed with the last holder), each only its own positions after it. s reads the same afterwards (its
  // attention sums the segments' and its own parts: the same codes, float32 sums in another order); snapshot() joins
  // them back. Sliding-window layers and recurrent states are still copied (bounded by their window).
  void share_session(Session& s) const;
  bool can_share_sessions() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }  // the engine's internals (model/transformer.h), for tests and tools

 private:
  void check_forward_args(const Session::Impl& si, const int32_t* tokens, int64_t n, bool has_logits,
                          const char* op) const;
  // The checks of a batch's items (each as check_forward_args, a session at most once) and their steps; rows_on_device:
  // the items' logits pointers are ignored and the steps keep their rows on the device.
  void batch_steps(std::span<const BatchItem> items, bool rows_on_device, const char* op,
                   std::vector<Session::Impl*>& sessions, std::vector<SequenceStep>& steps) const;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cider::model
