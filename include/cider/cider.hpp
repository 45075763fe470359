// cider/cider.hpp — the C++ interface of cider: load a model, run sessions (decode, sample, generate), and the
// building blocks on their own (the quantized KV cache with attention over it, the W8A8 / W4A8 linear layers).
//
// Link cider::cider (CMake: find_package(cider), docs/api.md). C++20. Everything here is in namespace cider; no
// header of the library's internals is included, and none is needed.
//
// Conventions
// - Every failure throws cider::Error (cider/error.hpp): a code and a message "[operation] rule; got value".
//   Out of memory is std::bad_alloc.
// - Formats are named by strings, as on the command line: weights "bf16", "f32", "w8a8", "w8a8-g64", "w8a8-g128",
//   "w8a8-g256", "w4a8", "native" (a GGUF file's blocks as they are); KV caches "k8v4" (default), "k4v3", ...
//   (bits 2,3,4,5,6,8), or "bf16", "f16", "f32" (plain);
//   KV rotations "hadamard", "so4-full", "so4-fast", "none"; devices "cpu", "cuda".
// - Tensors (TensorRef) are caller-owned, contiguous, row-major.
// - Threads: the kernels run on one process-wide worker pool (set_threads), which serves one caller at a time: run
//   one computation (decode, generate, attention, Linear::forward, ...) at a time per process. Creating, loading
//   and inspecting objects may happen on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cider/dtype.hpp"
#include "cider/error.hpp"

namespace cider {

// "0.1.0"
const char* version();

// Worker threads of the process-wide pool every kernel uses (default: $CIDER_NUM_THREADS, else every CPU).
// 1 <= n <= max_threads(); not while another thread is running a model or kernel.
void set_threads(int n);
int threads();
int max_threads();  // 4 per CPU this process may run on

// ---- the KV cache specification ------------------------------------------------------------------------------
// One description for a model's caches (ModelOptions::kv) and for a standalone KVCache.
struct KVSpec {
  // "k<bits>v<bits>" (affine-quantized, rotated) or "bf16", "f16", "f32" (plain). "" = the default: for a model, the
  // engine's for its device (per-channel keys and head_dim/32 outlier key channels: on cpu k4v4 with symmetric values
  // and the recent block exact, on cuda k5v4; docs/quality.md); for a standalone KVCache, "k8v4".
  std::string format;
  // "" = the default: "hadamard" for quantized caches, "none" for plain ones. A model's plain caches are never
  // rotated (the rotation must then be "" or "none").
  std::string rotation;
  // Quantized caches: 32, 64 or 128. 0 = 64; in a model, the largest of 128/64/32 dividing the head size when 64
  // does not.
  int group_size = 0;
  // Quantized caches: "token" (keys per position, groups along the head: the seeds' layout) or "channel" (keys per
  // channel over blocks of group_size positions, the newest block in bf16; docs/kv_cache.md §2b). "" = "token".
  std::string key_layout;
  // Models with key_layout "channel" only: outlier key channels per block and KV head, refined by 4 bits
  // (docs/kv_cache.md "Outlier key channels"). -1 = automatic (head_dim/32 with per-channel keys, none with per-token
  // keys); 0 = the default's: automatic for the default cache (format ""), none with an explicit format. A
  // standalone KVCache refuses them (it is not shown the queries).
  int key_outliers = 0;
  // Quantized caches: value codes "affine" (a scale and a bias per group) or "symmetric" (a step per group and no
  // bias: 0.125 bits per value less at group 64; CPU only; docs/kv_cache.md). "" = the default's: symmetric for a
  // model's default cache on the CPU (format ""), affine otherwise.
  std::string values;
  // Per-channel keys: "exact" (each query reads its own block of group_size positions unquantized, keys and values in
  // bfloat16, whatever the chunking; CPU only; docs/kv_cache.md) or "quantized". "" = the default's.
  std::string recent;
  // Standalone caches only (a model seeds its own): the rotation's seed and the stored scales' dtype
  // (DType::kF16, kBF16 or kF32).
  uint64_t seed = 0;
  DType scale_dtype = DType::kF16;
};

// ---- models --------------------------------------------------------------------------------------------------
struct ModelOptions {
  std::string weights;           // how linear weights are held in memory (see the conventions above); "": native for
                                 // a .gguf file on the CPU, else bf16
  KVSpec kv;
  int64_t ctx = 0;               // context length in tokens; 0 = the model's maximum, capped at 8192
  std::string device = "cpu";    // "cuda" needs a CUDA build and an sm_90 GPU (never a silent CPU fallback)
  int threads = 0;               // > 0: set_threads(threads) before loading (process-wide); 0 = unchanged
  std::string imatrix;           // an importance file (`cider imatrix`) weighting a requantizing format's block fits
                                 // ("q4_k_m", ...); "": plain fits
  std::string head_weights;      // the LM head's block type of a requantizing format ("q5_0", ...); "" = its own (q8_0)
};

struct ModelInfo {
  std::string architecture;  // "llama", "mistral", "qwen2", "qwen3", "gemma3"
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // the effective ctx
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int32_t bos_id = -1;            // -1: none
  std::vector<int32_t> eos_ids;   // the config's and the tokenizer's
  size_t weight_bytes = 0;
  std::string weights, kv, device;  // the formats in use, e.g. "bf16", "k8v4/hadamard/g64", "cpu"
};

class Session;
struct PerplexityConfig;
struct PerplexityReport;

// One message of a conversation (Model::chat_prompt).
struct ChatMessage {
  std::string role;  // "system" (first only), "user", "assistant"
  std::string content;
};

// A loaded model: weights, configuration and tokenizer. Move-only; Sessions keep what they need alive, so a Model
// may be destroyed before its sessions.
class Model {
 public:
  // path: a Hugging Face / MLX / cider-converted directory, or a .gguf file.
  static Model load(const std::string& path, const ModelOptions& options = {});
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  ModelInfo info() const;
  int64_t vocab_size() const;
  int64_t context_length() const;

  // Text <-> token ids with the model's tokenizer. add_special: the tokenizer's post-processing (e.g. BOS first).
  std::vector<int32_t> tokenize(std::string_view text, bool add_special = true) const;
  // skip_special: leave out special/control tokens.
  std::string detokenize(std::span<const int32_t> ids, bool skip_special = false) const;

  // The prompt text of a conversation in the model's chat format (chat_format()): an optional system message, then
  // user and assistant alternating, starting and ending with user; the text ends with the assistant's header (the
  // generation prompt). Generate from it as from any prompt (BOS is added by the tokenizer), with
  // GenerateConfig::stop_tokens = chat_end_tokens().
  std::string chat_prompt(const std::vector<ChatMessage>& messages) const;
  std::string chat_format() const;               // "chatml", "llama3", "gemma", "mistral", "llama2", "raw" or "phi3"
  std::vector<int32_t> chat_end_tokens() const;  // ids that end an assistant reply in that format (may be empty)

  // A new, empty token sequence (its own KV caches).
  Session new_session() const;

  struct Impl;

 private:
  explicit Model(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
  friend class Session;
  friend PerplexityReport perplexity(const Model&, std::string_view, const PerplexityConfig&, const Model*);
};

// ---- sampling ------------------------------------------------------------------------------------------------
// Greedy, or temperature / top-k / top-p / min-p sampling with a repetition penalty, reproducible from the seed
// (the pipeline and the generator are documented in docs/api.md).
struct SamplerConfig {
  double temperature = 0.8;     // >= 0; 0 = greedy
  int64_t top_k = 40;           // >= 0; 0 = off
  double top_p = 0.95;          // (0, 1]; 1 = off
  double min_p = 0.05;          // [0, 1]; 0 = off
  double repeat_penalty = 1.0;  // > 0; 1 = off
  int64_t repeat_window = 64;   // >= 0: how many recent history tokens are penalised; 0 = all
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config = {});  // validates
  Sampler(Sampler&&) noexcept;
  Sampler& operator=(Sampler&&) noexcept;
  ~Sampler();

  // The next token from a row of logits ([vocab]; NaN/+inf are errors, -inf marks an impossible token). history:
  // the tokens so far (for the repetition penalty), ids in [0, vocab). Advances the generator unless greedy.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history = {});
  const SamplerConfig& config() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend class Session;
};

// ---- sessions and generation ---------------------------------------------------------------------------------
struct GenerateConfig {
  int64_t max_tokens = 256;       // >= 0: tokens to sample at most
  std::vector<std::string> stop;  // stop strings (non-empty each): generation ends before one would be emitted
  std::vector<int32_t> stop_tokens;  // token ids that end generation as the model's EOS ids do (e.g. end of turn)
  SamplerConfig sampler;
  int64_t prefill_chunk = 2048;   // >= 1: the prompt goes through the model in pieces of at most this many tokens
};

enum class StopReason { kEos, kStopString, kMaxTokens, kContextFull };
const char* stop_reason_name(StopReason r);  // "eos", "stop string", "max tokens", "context full"

struct Generation {
  std::string text;              // everything emitted (also streamed through the callback)
  std::vector<int32_t> tokens;   // every sampled token, in order (an EOS included)
  StopReason reason = StopReason::kMaxTokens;
  // The last sampled token was not fed to the model (generation ended on it): a conversation that goes on should
  // decode it first (unless it is an EOS).
  bool last_token_pending = false;
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0.0;
  double generation_seconds = 0.0;
};

using TextCallback = std::function<void(std::string_view piece)>;

// One token sequence of a Model: its KV caches, its position, and the tokens seen so far (for the repetition
// penalty of generate()). Move-only.
class Session {
 public:
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;
  ~Session();

  int64_t position() const;  // tokens processed so far
  int64_t trim(int64_t n);   // forgets the last min(n, position) tokens (n >= 0); returns how many
  size_t kv_bytes() const;   // bytes of KV storage allocated, all layers

  // Feeds tokens (at least one, ids in [0, vocab), position + count <= context_length) and returns the logits of the
  // last one ([vocab], float32). On any error the session is unchanged.
  std::vector<float> decode(std::span<const int32_t> tokens);
  // Same, into caller memory: all_logits: every row ([n, vocab]), else the last row ([vocab]); logits must hold at
  // least that many floats.
  void decode(std::span<const int32_t> tokens, std::span<float> logits, bool all_logits = false);

  // Tokenizes `prompt` (with the tokenizer's special tokens, e.g. BOS, when the session is empty), feeds it and
  // samples up to config.max_tokens tokens, streaming text through on_text, until EOS, a stop string, the token
  // limit or the end of the context.
  Generation generate(std::string_view prompt, const GenerateConfig& config = {}, const TextCallback& on_text = {});
  // Same from token ids (at least one).
  Generation generate(std::span<const int32_t> prompt, const GenerateConfig& config = {},
                      const TextCallback& on_text = {});

  // The model's tokenizer, as Model::tokenize / detokenize.
  std::vector<int32_t> tokenize(std::string_view text, bool add_special = true) const;
  std::string detokenize(std::span<const int32_t> ids, bool skip_special = false) const;
  int64_t vocab_size() const;
  int64_t context_length() const;

  struct Impl;

 private:
  friend class Model;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- perplexity ----------------------------------------------------------------------------------------------
// Perplexity of a text, and its divergence from a baseline model (the same weights with another KV cache or weight
// format), over windows each evaluated from an empty context, as `cider perplexity` does (docs/quality.md): a model
// whose tokenizer adds BOS gets it at the start of every window.
struct PerplexityConfig {
  int64_t ctx = 512;   // >= 2: tokens per window (BOS included)
  int64_t stride = 0;  // 0 = non-overlapping windows; else 1 <= stride <= ctx (ctx − 1 with BOS per window)
};

struct PerplexityReport {
  int64_t windows = 0, tokens_scored = 0;
  double ppl = 0.0, ppl_stderr = 0.0;  // exp(mean NLL) and its standard error
  double nll = 0.0;                    // mean NLL, nats/token
  bool has_baseline = false;
  double base_ppl = 0.0, base_ppl_stderr = 0.0;
  double kl = 0.0, kl_stderr = 0.0;  // mean KL(P_baseline ‖ P_model), nats/token
  double top1 = 0.0;                 // fraction of tokens whose argmax agrees with the baseline's
  std::string report;                // the lines `cider perplexity` prints
};

// baseline: null, or a model with the same vocabulary.
PerplexityReport perplexity(const Model& model, std::string_view text, const PerplexityConfig& config = {},
                            const Model* baseline = nullptr);

// ---- building blocks: tensors, the KV cache, attention, linear layers -----------------------------------------
// A caller-owned, contiguous, row-major tensor (at most 8 dimensions).
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  TensorRef() = default;
  TensorRef(const void* d, DType t, std::vector<int64_t> s) : data(const_cast<void*>(d)), dtype(t), shape(std::move(s)) {}
  TensorRef(const float* d, std::vector<int64_t> s) : TensorRef(d, DType::kF32, std::move(s)) {}
};

// MLX-compatible affine quantization, bit for bit (mx.quantize / mx.dequantize / mx.quantized_matmul;
// docs/formats.md): w [..., K] f32/f16/bf16 ->
// packed u32 [..., K·bits/32], scales and biases [..., K/group_size] (the dtype of w). bits 2, 3, 4, 5, 6 or 8;
// group_size 32, 64 or 128.
void affine_quantize(const TensorRef& w, int group_size, int bits, const TensorRef& packed, const TensorRef& scales,
                     const TensorRef& biases);
void affine_dequantize(const TensorRef& packed, const TensorRef& scales, const TensorRef& biases, int group_size,
                       int bits, const TensorRef& out);
// x [..., K] with w [N, K·bits/32] (transpose) -> out [..., N]; without transpose w is [K, N·bits/32] -> [..., N].
void quantized_matmul(const TensorRef& x, const TensorRef& w, const TensorRef& scales, const TensorRef& biases,
                      bool transpose, int group_size, int bits, const TensorRef& out);

// The mask of attention(): none, causal (optionally windowed), or a boolean / additive tensor.
enum class MaskKind { kNone = 0, kCausal = 1, kBool = 2, kAdditive = 3 };
struct AttentionMask {
  MaskKind kind = MaskKind::kCausal;
  int64_t window = 0;                 // causal: > 0 limits each query to its last `window` keys
  std::optional<TensorRef> mask;      // kBool / kAdditive: broadcastable to [B, Hq, L, offset]
};

// A copy of a cache's valid state and configuration (immutable; copies share the data).
class KVSnapshot {
 public:
  KVSnapshot();
  KVSnapshot(const KVSnapshot&);
  KVSnapshot& operator=(const KVSnapshot&);
  ~KVSnapshot();
  int64_t length() const;
  // The configuration (format, rotation, group size, key layout, seed, scale dtype: never empty strings) and the data
  // as arrays (the seeds' `state`; docs/kv_cache.md has the layout): quantized
  //   0 key codes u32 [B, H, length, Dk·k_bits/32], 1 key scales, 2 key biases [B, H, length, Dk/gs] (scale dtype),
  //   3 value codes u32 [B, H, length, Dv·v_bits/32], 4 value scales, 5 value biases [B, H, length, Dv/gs];
  //   per-channel keys: 1 and 2 are [B, H, ceil(length/gs), Dk] and 6 is the bf16 residual window [B, H, gs, Dk];
  // plain: 0 keys [B, H, length, Dk], 1 values [B, H, length, Dv]. None before the first append. The views are
  // read-only and live as long as this snapshot (or a copy of it).
  KVSpec spec() const;
  size_t num_planes() const;
  TensorRef plane(size_t i) const;
  // The inverse: a snapshot of `spec` holding copies of these arrays (shapes and dtypes as above; the dimensions
  // and the length are read from them). Throws cider::Error naming the array and the rule it breaks.
  static KVSnapshot from_state(const KVSpec& spec, const std::vector<TensorRef>& planes);
  struct Impl;

 private:
  friend class KVCache;
  std::unique_ptr<Impl> impl_;
};

// One attention layer's key/value cache: rotated and affine-quantized (IsoQuant, spec.format "k<b>v<b>") or plain.
// Storage grows in steps of 256 positions.
class KVCache {
 public:
  explicit KVCache(const KVSpec& spec = {});  // validates
  KVCache(KVCache&&) noexcept;
  KVCache& operator=(KVCache&&) noexcept;
  ~KVCache();

  // keys [B, Hkv, n, Dk], values [B, Hkv, n, Dv], f32/f16/bf16. B, Hkv and the head sizes are fixed by the first.
  void append(const TensorRef& keys, const TensorRef& values);
  int64_t offset() const;   // positions held
  int64_t trim(int64_t n);  // drops the last min(n, offset) positions; returns how many
  size_t nbytes() const;    // bytes of storage allocated
  bool quantized() const;
  KVSpec spec() const;  // the configuration, defaults filled in
  KVSnapshot snapshot() const;
  void restore(const KVSnapshot& snapshot);  // state and configuration

  struct Impl;

 private:
  friend void attention(const TensorRef&, const KVCache&, float, const AttentionMask&, const TensorRef&);
  std::unique_ptr<Impl> impl_;
};

// queries [B, Hq, L, Dk] (Hq a multiple of Hkv), the last L positions of the cache; out [B, Hq, L, Dv] float.
void attention(const TensorRef& queries, const KVCache& cache, float scale, const AttentionMask& mask,
               const TensorRef& out);

// y = x·Wᵀ + b with symmetric integer weights and int8 per-token activations: W8A8 (int8 weights, per channel or
// groups of 64/128/256 along K) or W4A8 (int4, per channel or groups of 32/64/128/256).
enum class LinearFormat { kW8A8 = 0, kW4A8 = 1 };

class Linear {
 public:
  // w [N, K] f32/f16/bf16, finite; bias [N] or none. group_size 0 = per output channel. clip_percentile
  // (W8A8 per channel only): clip each row at that percentile of |w|, in (0, 100].
  static Linear from_float(LinearFormat format, const TensorRef& w, const std::optional<TensorRef>& bias = {},
                           int group_size = 0, std::optional<float> clip_percentile = {});
  // From an MLX affine-quantized weight (packed u32 [N, K*bits/32], scales/biases [N, K/group]), requantized.
  static Linear from_mlx(LinearFormat format, const TensorRef& packed, const TensorRef& scales,
                         const TensorRef& biases, int mlx_group_size, int mlx_bits,
                         const std::optional<TensorRef>& bias = {}, std::optional<int> target_group_size = {},
                         std::optional<float> clip_percentile = {});
  Linear(Linear&&) noexcept;
  Linear& operator=(Linear&&) noexcept;
  ~Linear();

  // x [..., K] -> out [..., N] (f32/f16/bf16). One row takes the GEMV kernel, several the GEMM kernel.
  void forward(const TensorRef& x, const TensorRef& out) const;
  LinearFormat format() const;
  int64_t in_features() const;
  int64_t out_features() const;
  int group_size() const;
  size_t nbytes() const;

  struct Impl;

 private:
  explicit Linear(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cider
