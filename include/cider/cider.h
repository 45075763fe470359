/* cider.h — the C interface of cider: models and sessions (load, decode, sample, tokenize), and the building
 * blocks: low-bit quantization, INT8/INT4 linear layers, the IsoQuant KV cache and attention over it, on
 * caller-owned buffers. For Python (ctypes), Rust, Go, or C. The C++ interface: cider/cider.hpp.
 *
 * Conventions
 * - Every function returns a cider_status; CIDER_OK (0) on success. On failure, cider_last_error() returns a message
 *   of the form "[operation] rule; got value", valid until the next cider call on the same thread.
 * - Tensors are described by cider_tensor: a pointer, a dtype and a shape; data is contiguous row-major and owned by
 *   the caller. Outputs are written into caller-allocated tensors whose shape must be exactly the documented one.
 * - Objects (linear layers, caches, snapshots) are opaque handles created by *_create and released by *_free.
 *   One handle must not be used by two threads at once. The calls that compute (cider_decode, cider_linear_forward,
 *   cider_attention, cider_kv_cache_append, the quantized matmul) share one process-wide thread pool: run them one
 *   at a time per process. Other calls on different handles may run concurrently.
 */
#ifndef CIDER_CIDER_H_
#define CIDER_CIDER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CIDER_MAX_RANK 8

typedef enum cider_status {
  CIDER_OK = 0,
  CIDER_ERR_INVALID_ARGUMENT = 1, /* a value outside its allowed set (bits, group size, option) */
  CIDER_ERR_SHAPE_MISMATCH = 2,   /* shapes or ranks that do not fit together */
  CIDER_ERR_UNSUPPORTED = 3,      /* a valid request this build cannot do */
  CIDER_ERR_OUT_OF_RANGE = 4,     /* a length or index beyond a limit */
  CIDER_ERR_IO = 5,
  CIDER_ERR_CORRUPT = 6,
  CIDER_ERR_OUT_OF_MEMORY = 7,
  CIDER_ERR_INTERNAL = 8
} cider_status;

typedef enum cider_dtype {
  CIDER_F32 = 0,
  CIDER_F16 = 1,
  CIDER_BF16 = 2,
  CIDER_U32 = 3, /* packed affine codes */
  CIDER_I8 = 4,
  CIDER_U8 = 5,  /* packed int4 pairs */
  CIDER_I32 = 6,
  CIDER_BOOL = 7 /* one byte per element, 0 or 1 */
} cider_dtype;

/* Enumerated values travel as plain ints (FFI-friendly, and an out-of-range value is reported, not undefined). */
typedef struct cider_tensor {
  void* data;
  int32_t dtype; /* a cider_dtype */
  int32_t rank;
  int64_t shape[CIDER_MAX_RANK];
} cider_tensor;

/* The message of the last failed call on this thread ("" if none). */
const char* cider_last_error(void);
const char* cider_version(void);

/* ---- affine group quantization, MLX-compatible (docs/formats.md) ---------------------------------------------
 * w [..., K] f32/f16/bf16 -> packed [..., K*bits/32] u32, scales and biases [..., K/group_size] in w's dtype.
 * bits in {2,3,4,5,6,8}, group_size in {32,64,128}. */
cider_status cider_affine_quantize(const cider_tensor* w, int group_size, int bits, const cider_tensor* packed,
                                   const cider_tensor* scales, const cider_tensor* biases);
/* out [..., K], any float dtype. */
cider_status cider_affine_dequantize(const cider_tensor* packed, const cider_tensor* scales,
                                     const cider_tensor* biases, int group_size, int bits, const cider_tensor* out);
/* MLX's quantized_matmul: transpose != 0: out = x @ dequant(w)^T with w [..., N, K*bits/32];
 * transpose == 0: out = x @ dequant(w) with w [..., K, N*bits/32]. out: broadcast batch + [M, N]. */
cider_status cider_quantized_matmul(const cider_tensor* x, const cider_tensor* w, const cider_tensor* scales,
                                    const cider_tensor* biases, int transpose, int group_size, int bits,
                                    const cider_tensor* out);

/* ---- symmetric INT8 / INT4 weights and the W8A8 / W4A8 linear layers -----------------------------------------
 * Weights w [N, K] (N outputs). group_size 0 = one scale per output channel.
 * INT8: q [N, K] i8, scales f32 [N] (per channel) or [K/group_size, N] (group_size 64/128/256);
 *       clip_percentile in (0, 100] clips each row at that percentile of |w| (per channel only); <= 0: no clipping.
 * INT4: q [N, K/2] u8 (element 2i in the low nibble, stored as code+8), scales f32 [N] or [K/group_size, N]
 *       (group_size 32/64/128/256). */
cider_status cider_int8_quantize_weights(const cider_tensor* w, int group_size, float clip_percentile,
                                         const cider_tensor* q, const cider_tensor* scales);
cider_status cider_int4_quantize_weights(const cider_tensor* w, int group_size, const cider_tensor* q,
                                         const cider_tensor* scales);

typedef struct cider_linear cider_linear;
typedef enum cider_linear_format { CIDER_W8A8 = 0, CIDER_W4A8 = 1 } cider_linear_format;

/* From float weights w [N, K] and an optional bias [N] (NULL for none). */
cider_status cider_linear_create(int format /* a cider_linear_format */, const cider_tensor* w, const cider_tensor* bias,
                                 int group_size, float clip_percentile, cider_linear** out);
/* From an MLX affine-quantized weight (dequantized, then requantized). target_group_size < 0 picks the default:
 * W8A8 keeps an 8-bit MLX weight's group size 64/128/256, otherwise per channel. */
cider_status cider_linear_create_from_mlx(int format /* a cider_linear_format */, const cider_tensor* packed,
                                          const cider_tensor* scales, const cider_tensor* biases, int mlx_group_size,
                                          int mlx_bits, const cider_tensor* bias, int target_group_size,
                                          float clip_percentile, cider_linear** out);
/* x [..., K] float -> out [..., N] float. M = 1 takes the GEMV kernel, M > 1 the GEMM kernel. */
cider_status cider_linear_forward(const cider_linear* layer, const cider_tensor* x, const cider_tensor* out);
cider_status cider_linear_info(const cider_linear* layer, int64_t* in_features, int64_t* out_features,
                               int* group_size, size_t* nbytes);
void cider_linear_free(cider_linear* layer);

/* ---- the KV cache ------------------------------------------------------------------------------------------ */
/* HADAMARD: a randomized Hadamard transform over the whole head (head_dim a power of two), docs/kv_cache.md. */
typedef enum cider_rotation {
  CIDER_ROTATION_NONE = 0,
  CIDER_ROTATION_SO4_FAST = 1,
  CIDER_ROTATION_SO4_FULL = 2,
  CIDER_ROTATION_HADAMARD = 3
} cider_rotation;

typedef struct cider_kv_config {
  int quantized;            /* 1: affine-quantized (IsoQuant) cache; 0: plain cache of plain_dtype */
  int k_bits, v_bits;       /* quantized: bits of keys and values (defaults 8 and 4) */
  int group_size;           /* quantized: 32, 64 (default) or 128 */
  int rotation;             /* a cider_rotation; default CIDER_ROTATION_HADAMARD */
  uint64_t seed;            /* rotation seed (default 0) */
  int scale_dtype;          /* a cider_dtype; quantized: stored scales and biases (default CIDER_F16) */
  int plain_dtype;          /* a cider_dtype; plain: CIDER_F16, CIDER_BF16 or CIDER_F32 */
} cider_kv_config;

typedef struct cider_kv_cache cider_kv_cache;
typedef struct cider_kv_snapshot cider_kv_snapshot;

/* The defaults: quantized K8/V4, group 64, Hadamard rotation, seed 0, f16 scales (docs/quality.md). */
cider_kv_config cider_kv_config_default(void);
cider_status cider_kv_cache_create(const cider_kv_config* config, cider_kv_cache** out);
/* keys [B, Hkv, n, Dk], values [B, Hkv, n, Dv], float. B, Hkv and the head dims are fixed by the first append. */
cider_status cider_kv_cache_append(cider_kv_cache* cache, const cider_tensor* keys, const cider_tensor* values);
cider_status cider_kv_cache_offset(const cider_kv_cache* cache, int64_t* offset);
/* Removes min(n, offset) positions from the end; *removed receives how many (may be NULL). */
cider_status cider_kv_cache_trim(cider_kv_cache* cache, int64_t n, int64_t* removed);
cider_status cider_kv_cache_nbytes(const cider_kv_cache* cache, size_t* nbytes);
/* An immutable copy of the cache's state and configuration. */
cider_status cider_kv_cache_snapshot(const cider_kv_cache* cache, cider_kv_snapshot** out);
cider_status cider_kv_cache_restore(cider_kv_cache* cache, const cider_kv_snapshot* snapshot);
void cider_kv_snapshot_free(cider_kv_snapshot* snapshot);
void cider_kv_cache_free(cider_kv_cache* cache);

/* ---- attention over the cache --------------------------------------------------------------------------------
 * queries [B, Hq, L, Dk] float (Hq a multiple of Hkv), in the model's space; out [B, Hq, L, Dv] float, in the
 * model's space. The L queries are the last L positions of the cache. mask_kind: 0 none, 1 causal (window > 0
 * limits each query to its last `window` keys), 2 boolean mask, 3 additive mask; mask is broadcastable to
 * [B, Hq, L, offset] (rank 2..4), bool or float, NULL unless mask_kind is 2 or 3. */
cider_status cider_attention(const cider_tensor* queries, const cider_kv_cache* cache, float scale, int mask_kind,
                             int64_t window, const cider_tensor* mask, const cider_tensor* out);

/* ---- models, sessions, sampling ------------------------------------------------------------------------------
 * A model is loaded once (cider_model_load) and read by any number of sessions; a session is one token sequence
 * (its KV caches and position). Formats are named by strings as on the command line (docs/api.md): weights "bf16",
 * "f32", "w8a8", "w8a8-g64", "w8a8-g128", "w8a8-g256", "w4a8", "native" (a GGUF file's blocks), "q8_0", "q6_k",
 * "q5_1", "q5_0", "q4_k_m", "q4_k", "q4_1", "q4_0" (requantized into GGUF blocks); kv "k8v4", "k4v3", ... or "bf16", "f16", "f32";
 * kv_rotation "hadamard", "so4-full", "so4-fast", "none"; kv_layout "token", "channel"; device "cpu", "cuda". */
typedef struct cider_model cider_model;
typedef struct cider_session cider_session;
typedef struct cider_sampler cider_sampler;

typedef struct cider_model_options {
  const char* weights;     /* NULL = native for a .gguf file on cpu, else "bf16" */
  const char* kv;          /* NULL = the device's default: per-channel keys, auto outliers; on cpu k4v4 with symmetric
                              values and kv_recent "exact", on cuda k5v4 (heads other than 128 or 256 wide: k8v4) */
  const char* kv_rotation; /* NULL or "" = the default (hadamard for quantized caches; plain caches are not rotated) */
  int kv_group_size;       /* 32, 64, 128; 0 = the default cache's on cpu (128), else 64; the largest of 128/64/32
                              dividing the head size where that does not */
  int64_t ctx;             /* context length; 0 = the model's maximum, capped at 8192 */
  const char* device;      /* NULL = "cpu" */
  int threads;             /* > 0: worker threads of the process-wide pool (process-wide); 0 = unchanged */
  const char* kv_layout;   /* "token" or "channel" (keys per channel); NULL or "" = the default's (token with kv) */
  int kv_outliers;         /* with kv_layout "channel": outlier key channels per block, refined by 4 bits; -1 = auto
                              (head_dim/32); 0 = the default's: auto with kv NULL, none with an explicit kv */
  const char* kv_values;   /* "affine" or "symmetric" value codes (symmetric: a step per group, no bias; cpu only);
                              NULL or "" = the default's: symmetric with kv NULL on cpu, affine otherwise */
  const char* kv_recent;   /* with kv_layout "channel": "exact" (each query reads its own block of group-size positions
                              unquantized, in bfloat16; cpu only) or "quantized"; NULL or "" = the default's */
  const char* imatrix;     /* an importance file (`cider imatrix`) weighting the block fits of a weights format cider
                              requantizes into ("q4_k_m", ...); NULL or "" = plain fits */
  const char* head_weights; /* the LM head's block type of such a format: "q8_0", "q6_k", "q5_1", "q5_0", "q4_k", "q4_1"
                               or "q4_0"; NULL or "" = the format's own (q8_0) */
} cider_model_options;

/* All zeros / NULL: the defaults above. */
cider_model_options cider_model_options_default(void);
/* path: a Hugging Face / MLX / cider-converted directory or a .gguf file; options NULL = the defaults. */
cider_status cider_model_load(const char* path, const cider_model_options* options, cider_model** out);
/* Sessions keep what they need: a model may be freed before its sessions. */
void cider_model_free(cider_model* model);

#define CIDER_MAX_EOS 16
typedef struct cider_model_info {
  int64_t vocab_size;
  int64_t context_length; /* the effective ctx */
  int64_t hidden_size, num_layers, num_heads, num_kv_heads, head_dim;
  int32_t bos_id;         /* -1: none */
  int32_t num_eos;        /* how many of eos_ids are set (at most CIDER_MAX_EOS) */
  int32_t eos_ids[CIDER_MAX_EOS];
  size_t weight_bytes;
  /* Names, valid while the model lives: "llama", ...; "bf16", ...; "k8v4/hadamard/g64", ...; "cpu" or "cuda". */
  const char* architecture;
  const char* weights;
  const char* kv;
  const char* device;
} cider_model_info;
cider_status cider_model_info_get(const cider_model* model, cider_model_info* out);

cider_status cider_session_create(const cider_model* model, cider_session** out);
void cider_session_free(cider_session* session);
cider_status cider_session_position(const cider_session* session, int64_t* position);
/* Forgets the last min(n, position) tokens (n >= 0); *removed receives how many (may be NULL). */
cider_status cider_session_trim(cider_session* session, int64_t n, int64_t* removed);
cider_status cider_session_kv_bytes(const cider_session* session, size_t* nbytes);

/* Feeds tokens[0, n) (n >= 1, ids in [0, vocab), position + n <= context length) and writes float32 logits: all n
 * rows ([n, vocab]) when all_logits != 0, else the last row ([vocab]). logits_len: the floats `logits` holds; it must
 * be at least what is written. On failure the session is unchanged. */
cider_status cider_decode(cider_session* session, const int32_t* tokens, int64_t n, float* logits, size_t logits_len,
                          int all_logits);

/* Sampling (the pipeline and the seeded generator: docs/api.md). */
typedef struct cider_sampler_params {
  double temperature;     /* >= 0; 0 = greedy */
  int64_t top_k;          /* >= 0; 0 = off */
  double top_p;           /* (0, 1]; 1 = off */
  double min_p;           /* [0, 1]; 0 = off */
  double repeat_penalty;  /* > 0; 1 = off */
  int64_t repeat_window;  /* >= 0: how many recent history tokens are penalised; 0 = all */
  uint64_t seed;
} cider_sampler_params;
/* temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1, repeat_window 64, seed 0. */
cider_sampler_params cider_sampler_params_default(void);
/* A sampler holds the random generator's state: successive draws continue one seeded sequence. */
cider_status cider_sampler_create(const cider_sampler_params* params, cider_sampler** out);
void cider_sampler_free(cider_sampler* sampler);
/* The next token from logits[0, vocab) (NaN/+inf are errors, -inf an impossible token); history[0, n_history): the
 * tokens so far, for the repetition penalty (NULL when n_history is 0). */
cider_status cider_sample(cider_sampler* sampler, const float* logits, int64_t vocab, const int32_t* history,
                          int64_t n_history, int32_t* token_out);

/* Text (text_len bytes of UTF-8; text may be NULL when text_len is 0) -> token ids with the model's tokenizer;
 * add_special != 0 applies its post-processing (e.g. BOS first). *n_tokens receives the count; tokens must hold
 * it (capacity), else CIDER_ERR_OUT_OF_RANGE and nothing is written (call with capacity 0 to ask the count). */
cider_status cider_tokenize(const cider_model* model, const char* text, size_t text_len, int add_special,
                            int32_t* tokens, int64_t capacity, int64_t* n_tokens);
/* Token ids -> UTF-8 text, NUL-terminated; skip_special != 0 leaves out special tokens. *text_len receives the
 * length (without the NUL); text must hold text_len + 1 bytes (capacity), else CIDER_ERR_OUT_OF_RANGE and nothing
 * is written. */
cider_status cider_detokenize(const cider_model* model, const int32_t* tokens, int64_t n, int skip_special, char* text,
                              size_t capacity, size_t* text_len);

#ifdef __cplusplus
}
#endif

#endif /* CIDER_CIDER_H_ */
