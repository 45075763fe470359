// cider/kernels/cuda/cuda_api.h — the CUDA backend's host interface: device discovery, device memory, streams, and
// every CUDA kernel launcher. Plain C++ (no CUDA headers), so the engine, tests and benchmarks include it freely.
// Built only with -DCIDER_CUDA=ON (CIDER_HAVE_CUDA is then defined for everything that links cider).
//
// Conventions
//   * Launchers take the same argument structs as the CPU kernel table (kernels/kernel_table.h) with DEVICE pointers,
//     plus an Exec (stream + scratch workspace). They validate what a caller could get wrong (dtype, bits, shapes a
//     kernel does not support) with cider::check — "[cuda.<op>] rule; got value" — and never fall back silently.
//   * Launchers are asynchronous on exec.stream and never allocate or synchronize (so they can be captured in a CUDA
//     graph); a launch error is reported by check_last_launch() inside the launcher.
//   * Sizes that change per decode step (KV length, position) can be read from device memory (d_length / d_offset
//     arguments), so one captured graph replays correctly as the cache grows.
//   * The CPU reference kernels (kernels/ref) are the oracle: tests/cuda compares every launcher against them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "kernels/kernel_table.h"

namespace cider::cuda {

// ---- device ------------------------------------------------------------------------------------------------------
// True when a CUDA device of compute capability 9.x is usable; otherwise false and *why (if given) says what is
// missing ("no CUDA driver", "no CUDA device", "compute capability 8.0, kernels are built for sm_90a"). Never throws.
bool device_available(std::string* why = nullptr);

struct DeviceInfo {
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t total_memory = 0;
  int l2_bytes = 0;
  int max_shared_per_block_optin = 0;
};
// Throws Error(kUnsupported, "[op] needs an NVIDIA GPU of compute capability 9.0 (sm_90a); <why>") without one.
void require_device(const char* op);
const DeviceInfo& device_info();  // of device 0; require_device first

// Lets `kernel` (a __global__ function's address) launch with `bytes` of dynamic shared memory on the current device.
// CUDA keeps that limit per kernel and device; the first call for a (device, kernel) raises it to everything the
// device allows beside the kernel's static shared memory, and no call lowers it again. So threads that launch one
// kernel with different sizes (tensor-parallel ranks sharing a GPU, concurrent sessions) cannot shrink the limit
// between another thread's set and its launch (cudaErrorInvalidValue), and each GPU of a process gets it set.
// Throws Error(kUnsupported) naming `op` when `bytes` is more than the device allows.
void allow_dynamic_smem(const void* kernel, size_t bytes, const char* op);

// ---- memory ------------------------------------------------------------------------------------------------------
// Owned device memory (cudaMalloc, 256-byte aligned). Move-only. Throws Error(kOutOfMemory) when cudaMalloc fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  // Synchronous copies (offset and size in bytes, checked against the allocation): complete on the device when they
  // return, so a kernel on any stream launched afterwards sees the bytes (fill likewise).
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill(uint8_t byte);  // every byte (tests poison outputs with it)

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};
DeviceBuffer to_device(const void* host, size_t bytes);

// ---- streams, errors ---------------------------------------------------------------------------------------------
class Stream {
 public:
  Stream();  // a new non-blocking stream
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* handle() const { return s_; }  // cudaStream_t
  void synchronize() const;            // throws Error(kInternal) with the CUDA error of any failed kernel

 private:
  void* s_ = nullptr;
};

// What a launcher runs on: a stream (null = the legacy default stream) and a scratch area it may use (each
// launcher says how many bytes it needs through a *_workspace_bytes function; 256-byte aligned).
struct Exec {
  void* stream = nullptr;  // cudaStream_t
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// cudaGetLastError after a launch: throws Error(kInternal, "[op] kernel launch failed: <CUDA message>").
void check_last_launch(const char* op);
void device_synchronize(const char* op);  // cudaDeviceSynchronize, same error reporting

// ---- INT8 / INT4 linear layers (kernels/cuda/linear_*.cu) -------------------------------------------------------
// Semantics exactly as kernels::IntLinearArgs (kernel_table.h): per-token int8 activations (sx = max|x|/127,
// xq = clamp(rint(x/sx)), an all-zero row has sx = 1), int32 sums, per-channel or per-group float32 weight scales,
// optional bias. All pointers are device pointers. x_dtype f32/f16/bf16; out_dtype f32/bf16/f16.
// Workspace for the quantized activations: int_linear_workspace_bytes(M, K).
size_t int_linear_workspace_bytes(int64_t M, int64_t K);
// x [M, K] → xq [M, K] int8, sx [M] float32 (the per-token quantization above, as the CPU reference rounds it).
void quantize_rows_int8(const void* x, DType x_dtype, int64_t M, int64_t K, int8_t* xq, float* sx, const Exec& exec);
// Decode (M = 1 … 16): weights streamed once from HBM for all M rows.
void w8a8_gemv(const kernels::IntLinearArgs& args, const Exec& exec);
void w4a8_gemv(const kernels::IntLinearArgs& args, const Exec& exec);
// Prefill (any M ≥ 1): int8 tensor cores; activation quantization in front, scale/bias epilogue fused behind.
void w8a8_gemm(const kernels::IntLinearArgs& args, const Exec& exec);
void w4a8_gemm(const kernels::IntLinearArgs& args, const Exec& exec);
// Picks GEMV (M ≤ 16) or GEMM.
void int_linear(const kernels::IntLinearArgs& args, bool int4, const Exec& exec);

// ---- Native GGUF weights (kernels/cuda/linear_ggml.cu) -----------------------------------------------------------
// out[M, N] (f32) = x[M, K] (f32) · Wᵀ (+ bias), W the rows of a GGUF block format with an integer form (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q2_K, Q4_K, Q5_K, Q6_K; quant/ggml_blocks.h), as kernels::GgmlLinearArgs with device pointers.
//   M ≤ kGgmlGemvRows: the CPU kernels' arithmetic — x quantized per piece of 32 to int8 (step max|x|/127, rint, an
//     all-zero piece step 1, a non-finite one NaN), each half-piece h's integer dot S_h of the block's int8 codes
//     with those codes (dp4a), X_h = step·Σ_{i∈h} code_i, and y = Σ_pieces step·(a₀·S₀ + a₁·S₁) + b₀·X₀ + b₁·X₁ in
//     float32 (the weights streamed once for all M rows);
//   M > kGgmlGemvRows: the weights decoded to bf16 in the workspace (ggml_dequantize_bf16), then dense_bf16
//     (cuBLASLt, x rounded to bf16), in passes of at most 32 MiB of decoded rows (outputs of a partial pass staged in
//     the workspace and copied into their columns), so the workspace stays bounded for any layer.
// Workspace (required): ggml_linear_workspace_bytes(M, N, K) — either path; it does not depend on the type. The
// weights must be 16-byte aligned for Q4_K / Q5_K, 4-byte for Q4_1 / Q5_1, 2-byte otherwise (device allocations and
// whole rows are).
constexpr int64_t kGgmlGemvRows = 16;
size_t ggml_linear_workspace_bytes(int64_t M, int64_t N, int64_t K);
void ggml_linear(const kernels::GgmlLinearArgs& args, const Exec& exec);
// rows × K weights → bf16 [rows, K] (out 16-byte aligned): each value the block decoder's float32 value (bit for bit
// quant::ggml_block_format decode: the same roundings in the same order) rounded to nearest even.
void ggml_dequantize_bf16(const void* w, uint32_t ggml_type, int64_t rows, int64_t K, uint16_t* out, const Exec& exec);
// Embedding rows of native blocks: out[i, :] = decoded row tokens[i] (float32, as the decoder) · scale; a token id
// outside [0, vocab) gives a NaN row (as embed_rows).
void ggml_embed_rows(const void* w, uint32_t ggml_type, int64_t vocab, int64_t K, const int32_t* tokens, int64_t n,
                     float scale, float* out, const Exec& exec);

// ---- KV cache: rotate + quantize + append (kernels/cuda/kv_append.cu) --------------------------------------------
// Appends n positions for every (b, h) in one launch. Row (b, h, t) is read from src at
// b·src_stride_b + h·src_stride_h + t·src_stride_t (+ d, elements; dims contiguous), in src_dtype (f32/f16/bf16),
// rotated in float32 (rotation 0 none, 1 so4 fast, 2 so4 full; qL/qR device [dim/4, 4]; the Hadamard rotation 3 is
// not fused here: callers apply cuda::hadamard_rows (kernels/cuda/hadamard.h) and append with rotation 0, which gives
// the same bytes as the CPU cache) and stored at position
// offset + t of storage [B, H, capacity, ·]:
//   bits > 0: codes [.., dim·bits/32] uint32, scales/biases [.., dim/gs] in dst_dtype — the same bytes as
//             kernels/ref kv_append (MLX's arithmetic: every multiply and add rounded, never fused);
//   bits = 0: the rotated values rounded to dst_dtype [.., dim] (plain cache).
struct KVAppendBatchArgs {
  const void* src;
  DType src_dtype;
  int64_t B, H, n, dim;
  int64_t src_stride_b, src_stride_h, src_stride_t;  // elements
  int rotation;
  const float* qL;
  const float* qR;
  void* dst;
  void* scales;
  void* biases;
  DType dst_dtype;
  int bits;        // 0, 2, 3, 4, 5, 6, 8
  int group_size;  // bits > 0: 32, 64, 128
  int64_t capacity;
  int64_t offset;  // first position written (overridden by *d_offset when given)
};
// d_offset: null, or a device int32 read by the kernel instead of args.offset (CUDA-graph decode).
void kv_append(const KVAppendBatchArgs& args, const int32_t* d_offset, const Exec& exec);
// Two appends in one launch (the keys and the values of a layer, each with its own bits, source and planes): the
// same result as kv_append(keys) then kv_append(values). Each is validated as kv_append validates it.
void kv_append_pair(const KVAppendBatchArgs& keys, const KVAppendBatchArgs& values, const int32_t* d_offset,
                    const Exec& exec);

// Per-channel keys (nn::KeyLayout::kChannel, docs/kv_cache.md §2b), the same bytes as nn::QuantizedKVCache: positions
// [offset, offset + n) of every (b, h) go, unrotated and rounded to bfloat16, to the residual window [B, H, gs, dim]
// (slot = position mod gs); each block of gs positions that fills is quantized per channel (column d of the window is
// one group of gs values, quant::affine_quantize_columns' arithmetic) into its codes [B, H, capacity, dim·bits/32]
// and its scale/bias row [B, H, blocks, dim] (scale_dtype). One CTA per (b, h) walks the append in runs that end
// where a block fills (a prefill of n positions fills n/gs blocks in order). d_offset as for kv_append.
struct KVChannelKeysArgs {
  const void* src;
  DType src_dtype;
  int64_t B, H, n, dim;
  int64_t src_stride_b, src_stride_h, src_stride_t;  // elements
  uint32_t* codes;
  void* scales;
  void* biases;
  uint16_t* residual;  // bfloat16
  DType scale_dtype;   // f16, bf16 or f32
  int bits;            // 2, 3, 4, 5, 6, 8
  int group_size;      // block length: 32, 64, 128
  int64_t capacity, blocks;
  int64_t offset;
  // Outlier key channels (nn::KVSpec::key_outliers, docs/kv_cache.md "Outlier key channels"; 0 = none, at most 32):
  // when a block fills, its `outliers` channels with the largest range × RMS of the block's own queries get a 4-bit
  // refinement code per position, as nn::QuantizedKVCache::refine_outliers (same bytes). Planes: outlier_codes
  // [B, H, blocks, outliers·gs/2] uint8, outlier_index [B, H, blocks, outliers] uint16, and qstats [B, H, gs, dim + 1]
  // uint8, the window positions' query statistics (Σ q² per channel over the KV head's query heads in
  // quant/kv_stats.h's one-byte code, then the count of finite query rows). q: the appended positions' queries (float32, after RoPE, in the keys' space: query
  // head hq of batch b at position t of the append at q + b·q_stride_b + hq·q_stride_h + t·q_stride_t; Hq a
  // multiple of H, at most 64 per KV head), or null: no statistics (zeros; the choice is then by range alone).
  int outliers;
  uint8_t* outlier_codes;
  uint16_t* outlier_index;
  uint8_t* qstats;
  const float* q;
  int64_t Hq, q_stride_b, q_stride_h, q_stride_t;
};
void kv_append_channel_keys(const KVChannelKeysArgs& args, const int32_t* d_offset, const Exec& exec);
// A trim back into block position / gs: its kept positions [block·gs, position) return to the residual window,
// dequantized as quant::affine_dequantize_value does and rounded to bfloat16 (the CPU cache's trim). Only for a block
// that was quantized (the cache had reached (block + 1)·gs): inside the window there is nothing to refill, and the
// block's codes would be stale. With outlier channels their refined values (c·s + b in float32 plus the refinement,
// as the CPU cache's trim) and the kept positions' query statistics zeroed (their queries were not kept). args' src,
// n, offset and q are unused.
void kv_channel_refill(const KVChannelKeysArgs& args, int64_t position, const Exec& exec);

// ---- attention over the cache (kernels/cuda/attention.cu) --------------------------------------------------------
// kernels::AttentionArgs with device pointers (q and out float32, keys/values quantized or plain f16/bf16/f32).
// Decode (L ≤ 16) splits the key sequence over blocks (online softmax, log-sum-exp merge); prefill runs in tiles.
// Mask kinds: none, causal (+ window). d_length: null, or a device int32 that replaces keys.length and values.length
// (which then only bound the grid): one captured graph serves every step of a decode; the kernels spread the keys a
// call can see over the whole grid from the device length, so a bound above the real length leaves no split idle.
// keys.length must be below 2^31 (kOutOfRange otherwise).
// PDL contract: the decode kernel may read *d_length and the cache rows at positions below length − L before the
// kernel just before it in the stream has finished (its first tiles' HBM latency then overlaps that kernel's tail), so
// no kernel that may still run then may write them: the one just before it, and the ones before that one if it lets
// its dependents start before its own griddepcontrol.wait (cider's kernels never do: pdl.cuh). A decode step's append
// writes rows length − L … length − 1, and d_length comes from a copy, which PDL never overlaps.
// $CIDER_ATTN_TC_EARLY=0 reads nothing before the wait.
size_t attention_workspace_bytes(const kernels::AttentionArgs& args);
// The per-channel-key cache formats the tensor-core decode and prefill kernels read (the format part of their
// eligibility, also what a model's load checks outlier channels against): K4V4, K5V4 or K5V5, blocks of 64, f16
// scales, head dim 128 or 256, at most head_dim/16 outlier channels.
bool kchan_tc_format(int k_bits, int v_bits, int64_t group_size, DType scale_dtype, int64_t head_dim, int64_t outliers);
void attention(const kernels::AttentionArgs& args, const int32_t* d_length, const Exec& exec);
// In place, rows [rows, dim] float32: x ← R x (inverse = false) or Rᵀ x (inverse = true), R the cache's SO(4)
// rotation (rotation 1/2, qL/qR device [dim/4, 4]); used for queries before attention and outputs after.
void rotate_rows(float* x, int64_t rows, int64_t dim, int rotation, const float* qL, const float* qR, bool inverse,
                 const Exec& exec);

// ---- sampling on the device (kernels/cuda/topk.cu) ---------------------------------------------------------------
// The candidates of model/sampler.h's top-k step, chosen where the logits are, so a decode step copies k tokens to the
// host instead of the whole vocabulary. logits: [vocab] float32 (device). excluded: [n_excluded] int32 (device), sorted
// ascending, unique, each in [0, vocab): the tokens the host ranks itself (the repetition-penalised ones); their raw
// logits are written to excluded_vals [n_excluded]. Of the other tokens, those with a finite logit are ranked by
// (logit descending, id ascending) and the first k written to ids [k] / vals [k] in that order; when fewer than k
// qualify the rest is id -1, value -inf. status [1] int32: the smallest index whose logit is NaN or +inf, else -1
// (the host then raises the sampler's error). All outputs are device pointers. Limits (kInvalidArgument otherwise,
// naming the rule and the value): 1 ≤ k ≤ kTopkMaxK, 0 ≤ n_excluded ≤ kTopkMaxExcluded, 1 ≤ vocab ≤ 2^24.
// Workspace: topk_workspace_bytes(vocab, k) bytes in exec.workspace (256-byte aligned).
constexpr int64_t kTopkMaxK = 256;
constexpr int64_t kTopkMaxExcluded = 1024;
size_t topk_workspace_bytes(int64_t vocab, int64_t k);
void topk_logits(const float* logits, int64_t vocab, const int32_t* excluded, int64_t n_excluded, int64_t k,
                 int32_t* ids, float* vals, float* excluded_vals, int32_t* status, const Exec& exec);
// The log-softmax normalizer of each of n rows of logits (device, row r at logits + r·vocab), for logprobs beside the
// candidates: out[2r] = max of the row, out[2r + 1] = log Σ exp(z − max) — expf of each float32 term, summed in
// float64, the log in float64, stored as float32 (the host's log_sum_exp sums the same terms in float64). A row with
// NaN or +inf gives NaN (topk_logits' status names the token); a row of −inf only gives max −inf, sum NaN.
// One 512-thread CTA per row, no workspace. 1 ≤ n, 1 ≤ vocab ≤ 2^31 − 1 (kInvalidArgument otherwise).
void log_normalizers(const float* logits, int64_t n, int64_t vocab, float* out, const Exec& exec);

}  // namespace cider::cuda
