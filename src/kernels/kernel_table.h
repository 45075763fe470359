// cider/kernels/kernel_table.h — the small dispatch table through which every compute kernel is reached.
//
// One table per backend/ISA. The reference table (kernels/ref) is plain, obviously-correct C++ kept forever as the
// oracle; fast tables (x86 AVX2 / AVX-512, CUDA) fill the same entries and are tested against it. Kernels receive
// already-validated, contiguous arguments: validation happens once, in the public operations (nn/, quant/).
// Every entry is required unless marked (optional); a null optional entry means "use the reference".
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/dtype.h"

namespace cider::kernels {

// ---- affine (MLX) quantized matmul --------------------------------------------------------------------------
// out[M, N] = x[M, K] @ dequant(w)ᵀ         (transpose = true:  w packed [N, K*bits/32], scales/biases [N, K/gs])
// out[M, N] = x[M, K] @ dequant(w)          (transpose = false: w packed [K, N*bits/32], scales/biases [K, N/gs])
// Accumulation in float32, group by group; the result is rounded once to out_dtype.
struct AffineQmmArgs {
  const void* x;  // [M, K], x_dtype
  DType x_dtype;
  const uint32_t* w;
  const void* scales;  // scale_dtype
  const void* biases;  // scale_dtype
  DType scale_dtype;
  void* out;  // [M, N], out_dtype
  DType out_dtype;
  int64_t M, N, K;
  int group_size, bits;
  bool transpose;
};

// ---- symmetric INT8 / INT4 weight linear layers (W8A8 / W4A8) -----------------------------------------------
// x is quantized per token (row) to int8 inside the kernel: sx[m] = max|x[m,:]| / 127 (1 if the row is all zero),
// xq = clamp(rint(x / sx), -127, 127). Then
//   per-channel (group_size == 0): y[m,n] = sx[m] * sw[n] * Σ_k xq[m,k]·wq[n,k] + bias[n]
//   per-group   (group_size  > 0): y[m,n] = sx[m] * Σ_g sw[g,n] * Σ_{k∈g} xq[m,k]·wq[n,k] + bias[n]
// with integer sums exact in int32. Weight scales are float32: [N] per channel, [K/gs, N] per group.
struct IntLinearArgs {
  const void* x;  // [M, K], x_dtype
  DType x_dtype;
  const void* w;  // W8A8: int8 [N, K]; W4A8: uint8 [N, K/2], element 2i in the low nibble, code = q + 8
  const float* w_scales;
  const float* bias;  // [N] or nullptr
  void* out;          // [M, N], out_dtype
  DType out_dtype;
  int64_t M, N, K;
  int group_size;  // 0 = per output channel
};

// ---- dense float linear (unquantized weights: the f32 / bf16 model paths) -------------------------------------
// out[M, N] = x[M, K] @ wᵀ (+ bias), w [N, K] row-major in w_dtype (f32, f16 or bf16, e.g. a memory-mapped
// checkpoint tensor used in place), x f32, accumulation in float32, out f32.
struct DenseGemmArgs {
  const float* x;  // [M, K]
  const void* w;   // [N, K], w_dtype
  DType w_dtype;
  const float* bias;  // [N] or nullptr
  float* out;         // [M, N]
  int64_t M, N, K;
};

// ---- native GGUF weights (quant/ggml_blocks.h) ------------------------------------------------------------------
// out[M, N] = x[M, K] @ wᵀ (+ bias) with w [N, K] kept in a ggml block format: row n is K / block_size blocks at
// w + n·row_bytes (e.g. a memory-mapped GGUF tensor used in place). x and out float32.
// Reference (kernels/ref): each row dequantized by the format's decoder, the dot product summed in float64.
// Fast kernels quantize x to int8 per 32 elements (step max|x|/127 of the piece, as ggml's Q8 activations do) and
// multiply the integer form exactly in int32: |out − ref| <= Σ_pieces (step/2)·Σ|w| plus float32 rounding.
// Where the CPU has AMX-BF16, prefill (M >= 16) rounds x and the decoded w to bfloat16 instead and sums in float32:
// |out − ref| <= Σ|x·w|·(2⁻⁷ + 2⁻¹⁶) plus K float32 roundings (amx/ggml_linear_bf16.cpp).
struct GgmlLinearArgs {
  const float* x;        // [M, K]
  const void* w;         // N rows of row_bytes bytes
  uint32_t ggml_type;    // a quant::GgmlType with an integer form
  int64_t row_bytes;
  const float* bias;     // [N] or nullptr
  float* out;            // [M, N]
  int64_t M, N, K;       // K a multiple of the block size
  // The rows interleaved in groups of 8 (quant/ggml_interleave.h; N a multiple of 8, a format it takes), as the CPU
  // loads them where KernelTable::ggml_interleave asks for it. Every table multiplies them; row_bytes stays a row's.
  bool interleaved = false;
};

// The rows of such a weight as float32 (what the layers' prefill path multiplies): out[r, k] = the file's value,
// bit for bit the block format's decoder (quant/ggml_blocks.h). Single-threaded (the caller splits the rows).
struct GgmlDequantArgs {
  const void* w;       // rows of row_bytes bytes
  uint32_t ggml_type;  // a quant::GgmlType with an integer form
  int64_t row_bytes;
  int64_t rows, K;     // K a multiple of the block size
  float* out;          // [rows, K]
  // Interleaved rows (GgmlLinearArgs::interleaved): w is the tensor's first byte and the rows are [row0, row0 + rows).
  bool interleaved = false;
  int64_t row0 = 0;
};

// ---- attention over a KV cache -------------------------------------------------------------------------------
// One of keys or values of a cache, valid positions [0, length) of storage with room for `capacity` positions.
// Quantized: packed [B, H, capacity, dim*bits/32] uint32 and scales/biases [B, H, capacity, dim/group_size] in
// scale_dtype. Plain: data [B, H, capacity, dim] in dtype (bits == 0).
// Per-channel keys (layout 1, nn::KeyLayout::kChannel): positions [0, nq), nq = length / group_size · group_size, are
// codes packed per position as above, but quantized per channel over blocks of group_size positions: scales/biases
// [B, H, blocks, dim] (block j / group_size of position j), so k[j, d] = c[j, d]·s[blk, d] + b[blk, d]. Positions
// [nq, length) are the residual window: bfloat16 rows [B, H, group_size, dim] at `residual`, position j in row
// j − nq. Keys only; values always use layout 0.
// Outlier channels (outliers = n > 0, layout 1 only): block k's n channel indices at outlier_index (uint16
// [B, H, blocks, n], ascending) and 4-bit refinement codes at outlier_codes (uint8 [B, H, blocks, n·gs/2]: channel
// o's codes of the block's positions, two per byte, the even position in the low nibble); for a quantized position j
// of block k and its channel d = index[o]: k[j, d] += (|s[k, d]|/15)·(r − 7.5) (quant::outlier_refinement).
struct KVTensorView {
  const void* data;  // packed codes (quantized) or values (plain)
  const void* scales;  // quantized only
  const void* biases;  // quantized only
  DType dtype;          // plain: element dtype; quantized: kU32
  DType scale_dtype;    // quantized only
  int bits;             // 0 = plain
  int group_size;       // quantized only
  int64_t B, H, length, capacity, dim;
  int layout = 0;               // 0 per position (groups along dim), 1 per channel (keys; see above)
  int64_t blocks = 0;           // layout 1: rows of scales/biases per (b, h)
  const void* residual = nullptr;  // layout 1: bfloat16 [B, H, group_size, dim]
  int outliers = 0;                    // layout 1: outlier channels per block (0: none)
  const void* outlier_codes = nullptr;  // layout 1, outliers > 0: uint8 [B, H, blocks, outliers·group_size/2]
  const void* outlier_index = nullptr;  // layout 1, outliers > 0: uint16 [B, H, blocks, outliers]
  // Symmetric codes (the values of a cache with symmetric values, nn/kv_spec.h): biases is null and every group's bias
  // is −2^(bits−1)·scale (quant::symmetric_bias), i.e. a value is scale·(c − 2^(bits−1)).
  bool symmetric = false;
};

enum class MaskKind : int { kNone = 0, kCausal = 1, kBool = 2, kAdditive = 3 };

// Query row i (of L) sits at absolute position kL - L + i, where kL = keys.length.
// kCausal: key j is visible to query i iff j <= pos(i) and (window == 0 or j > pos(i) - window).
// kBool: visible iff mask[b, h, i, j] != 0.   kAdditive: score += mask[b, h, i, j].
// The mask is read through element strides (0 broadcasts a dimension) in mask_dtype (kBool or a float dtype).
// A query row that sees no key gets an output of zeros.
// softcap > 0 (Gemma 2's attention logit softcapping): each score s = scale·q·k becomes softcap·tanh(s / softcap)
// before the mask is applied (HF: scores / cap, tanh, · cap, then + mask); 0 = none. Finite and >= 0 (nn::attention
// and cuda::attention check it).
struct AttentionArgs {
  const float* q;  // [B, Hq, L, Dk] float32, contiguous, already in the cache's rotated space
  float* out;      // [B, Hq, L, Dv] float32, contiguous, still in the rotated value space
  int64_t B, Hq, L;
  KVTensorView keys;    // H = Hkv, dim = Dk
  KVTensorView values;  // H = Hkv, dim = Dv
  float scale;          // multiplies q·k before the softmax
  float softcap;        // > 0: score = softcap·tanh(score / softcap) before the mask; 0 = none
  MaskKind mask_kind;
  int64_t window;
  const void* mask;
  DType mask_dtype;
  int64_t mask_stride[4];  // strides over [B, Hq, L, kL]
  // (optional) How many pieces each (b, KV head, query block) splits the key sequence into for threads, merged by
  // log-sum-exp. 0 = the kernel decides; tests set it to exercise the merge. The reference ignores it.
  int kv_splits;
  // (optional) exact_block > 0: the recent block is read elsewhere (nn::attention, KVCache::exact_stage): query row i
  // (storage position t = kL − L + i) sees only keys j < max(⌊t/exact_block⌋·exact_block, exact_lo), besides its mask.
  int64_t exact_block;
  int64_t exact_lo;
  // (optional) keys j < exact_sink are read elsewhere too (the sink, KVCache::exact_stage): rows see j >= it.
  int64_t exact_sink;
  // (optional) [B, Hq, L]: per query row, m + log l of its softmax (m the maximum score seen, l = Σ exp(s − m)), −inf
  // for a row that saw no key; for merging with the recent block's part.
  float* lse;
};

// The recent block's rule (AttentionArgs::exact_block, nn::KVCache::exact_stage): a query row at storage position
// `pos` reads positions from max(⌊pos/block⌋·block, lo) on unquantized.
inline int64_t recent_block_start(int64_t pos, int64_t block, int64_t lo) {
  return std::max(pos / block * block, lo);
}

// ---- the recent block's exact part of attention, merged (nn::attention, KVCache::exact_stage) -------------------
// Rows r in [row_begin, row_end) of the B·Hq query heads (b = r / Hq, h = r % Hq, KV head h / (Hq / Hkv)); for each
// query row i of L at storage position t = kL − L + i: the keys j >= e(t) = recent_block_start(t, block, lo) of the
// stage and the sink's keys j < min(sink, e(t)) — those the attention kernel left out (AttentionArgs::exact_block /
// exact_sink) — read in bfloat16, under the same scale, softcap (as AttentionArgs) and mask (mask_kind, window, mask,
// mask_dtype, mask_stride as AttentionArgs; bool and additive masks read at [b, h, i, position]); each key's value row
// is the stage's as appended (values_exact) from position w(t) = max(⌊t/vwin⌋·vwin, xlo) on, else as its codes read
// (values; the sink's: sink_values). That part's softmax is merged into the kernel's normalised output o (rotated
// value space) through its row log-sum-exp lse (−inf: saw no key):
//   o ← (e^(lse−M)·o + Σ_j e^(s_j−M)·v_j) / (e^(lse−M) + Σ_j e^(s_j−M)),  lse ← M + log(e^(lse−M) + Σ_j e^(s_j−M))
// with M the larger of lse and the part's maximum score; a row where both saw nothing is left as it is.
// The reference (kernels/ref/recent_block_ref.cpp) sums in float32 in a fixed order with std::exp; the fast levels
// differ only in the order of the float32 sums (dot products and value sums), so each score is within
// 2·γ_Dk·scale·Σ_d|q_d·k_d| of the reference's (γ_n = n·2⁻²⁴/(1 − n·2⁻²⁴)) and the merged output within the
// weighted-average bound derived in tests/test_recent_block.cpp. Bool and additive masks: the reference.
struct RecentBlockArgs {
  const float* q;  // [B, Hq, L, Dk] float32, in the cache's rotated key space
  float* out;      // [B, Hq, L, Dv], in: the kernel's part, out: merged
  float* lse;      // [B, Hq, L], in and out
  int64_t B, Hq, Hkv, L, kL, Dk, Dv;
  float scale, softcap;
  MaskKind mask_kind;
  int64_t window;
  const void* mask;
  DType mask_dtype;
  int64_t mask_stride[4];
  // The stage: positions [lo, lo + n) at keys / values / values_exact, bfloat16 [B, Hkv, n, D]; the sink's rows
  // [0, sink) at sink_keys / sink_values, bfloat16 [B, Hkv, sink_rows, D].
  const uint16_t* keys;
  const uint16_t* values;
  const uint16_t* values_exact;
  int64_t lo, n, block, xlo, vwin;
  const uint16_t* sink_keys;
  const uint16_t* sink_values;
  int64_t sink, sink_rows;
  int64_t row_begin, row_end;  // the query heads this call merges (callers split B·Hq over the pool)
};

// ---- the randomized Hadamard rotation of rows (nn::Rotation kind 3: queries in, attention outputs back) -------
// rows [n, dim] float32 in place, each as kernels::ref::hadamard_row(row, signs, dim, inverse): forward
// H·diag(s)·x/√P, inverse diag(s)·H·x/√P, H block-diagonal with blocks of P = the largest power of two dividing dim.
// Every level gives the reference's bits (the same multiplies and butterfly adds in the same order per element).
struct HadamardRowsArgs {
  float* rows;
  int64_t n, dim;
  const float* signs;  // [dim], ±1.0f
  bool inverse;
};

// ---- rotate + quantize + append of KV rows, in one pass ------------------------------------------------------
// n consecutive positions of one (b, h). Row i is read from src (element d at src + i·src_row_stride +
// d·src_elem_stride, in src_dtype f32/f16/bf16), read as float32, rotated in float32 by the SO(4) block rotation
// (nn/rotation.h: rotation 0 none, 1 fast w = qL·v, 2 full w = qL·v·conj(qR); Hamilton products with the multiplies
// and adds in nn/rotation.cpp's order, never fused) or by the randomized Hadamard transform (rotation 3:
// w = H·diag(s)·v/√D over the whole row, dim a power of two, qL = the signs s [dim] (±1.0f), qR unused; the steps of
// nn/rotation.h / kernels::ref::hadamard_row), then stored:
//   bits > 0: quant::affine_quantize_row(row, dim, group_size, bits, dst + i·dim·bits/32 words,
//             scales + i·dim/gs, biases + i·dim/gs, scale_dtype)                (MLX's arithmetic, formats.md §1)
//   bits = 0: each value rounded to dst_dtype at dst + i·dim elements (plain cache).
// Fast kernels produce bit-identical bytes to the reference (kernels/ref/kv_append_ref.cpp).
struct KVAppendArgs {
  const void* src;
  DType src_dtype;
  int64_t src_row_stride, src_elem_stride;  // in elements
  int64_t n, dim;
  int rotation;                     // 0 none, 1 so4 fast, 2 so4 full, 3 hadamard (nn::RotationKind values)
  const float* qL;                  // [dim/4, 4] (w, x, y, z) unit quaternions; rotation 3: signs [dim]; null for 0
  const float* qR;                  // [dim/4, 4]; used by rotation 2 only
  void* dst;                        // bits > 0: uint32 codes [n, dim·bits/32]; bits = 0: [n, dim] in dst_dtype
  void* scales;                     // bits > 0: [n, dim/gs] in dst_dtype (the scale dtype)
  void* biases;                     // bits > 0, not symmetric: [n, dim/gs] in dst_dtype
  bool symmetric = false;           // bits > 0: quant::symmetric_quantize_row (no biases) instead of the affine row
  DType dst_dtype;
  int bits;                         // 0 (plain) or 2, 3, 4, 5, 6, 8
  int group_size;                   // bits > 0: 32, 64, 128
};

// ---- gated delta rule (the linear-attention layers of hybrid models, nn/gated_delta.h) ----------------------------
// Value heads [h0, h1) over n tokens; head h reads key head h / (Hv / Hk), or h % Hk when v_tiled. Per token t in
// order, per head:
//   S ← S·exp(g[t, h]);  δ = (v[t, h] − Sᵀk[t])·β[t, h];  S ← S + k[t] δᵀ;  out[t, h] = Sᵀq[t]
// with S (Dk, Dv) float32 updated in place. q and k are already l2-normalised (q also scaled), float32.
struct GatedDeltaKernelArgs {
  const float* q;      // (n, Hk, Dk)
  const float* k;      // (n, Hk, Dk)
  const float* v;      // row t's head h at v + t·v_stride + h·Dv
  int64_t v_stride;
  const float* g;      // (n, Hv) log decay
  const float* beta;   // (n, Hv)
  float* state;        // (Hv, Dk, Dv)
  float* out;          // (n, Hv·Dv)
  int64_t n, Hk, Hv, Dk, Dv;
  int64_t h0, h1;      // the value heads this call runs
  bool v_tiled;        // ModelConfig::LinearAttention::v_tiled
};

// ---- log-sum-exp of a row (runtime: the logprobs OpenAI reports; kernels/ref/log_sum_exp_ref.cpp) ---------------
// max = max_i z[i] and lse = log Σ_i exp(z[i] − max) over z[0, n), n >= 1, reported in float64. Every z[i] = −inf:
// max = lse = −inf. A NaN anywhere, or a +inf: lse = NaN. The reference sums exp in float64; the fast levels compute
// exp(z − max) in float32 (a few ulp) and sum in float64, so lse agrees with the reference within
// 2^-24·max_i |z[i] − max| + 1e-6 (the float32 rounding of z − max and of exp).
struct LogSumExpArgs {
  const float* z;
  int64_t n;
  double* max;
  double* lse;
};

// ---- gated activation of the MLP, g ← act(g)·u (model/cpu_backend.cpp glu_rows; kernels/ref/glu_ref.cpp) ----------
// Element-wise over [0, count), count >= 0, g and u not overlapping (g is read and written in place; below x = g[i] on
// entry, u = u[i]):
//   kSiLU      act(x) = x·σ(x) = x / (1 + e^−x)                                   (SwiGLU)
//   kGeluTanh  act(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))  = x·σ(2y)      (GeGLU; PyTorch approximate="tanh")
// at infinities the limits, act(+inf) = +inf and act(−inf) = −0 (then times u: +inf·0 and −0·±inf are NaN, as IEEE
// says; and where act(x) rounds to 0 in float32, ·±inf is NaN on the fast levels, ±inf in the reference's float64);
// a NaN in g or u gives NaN. The reference evaluates act(x)·u in float64 and rounds once. The fast levels work
// in float32 with σ from exp of a non-positive argument; against the reference, each element is within
//   2^-24·(14 + 6·|z|·σ(−z))·|r| + 2^-52·|x·u| + 2^-146·max(1, |u|)
// with r the reference result, z the sigmoid's argument (x for SiLU, 2y for GELU), the 6·|z| term being the float32
// rounding of z (GELU only; 0 for SiLU), the 2^-52 term the reference's own float64 cancellation in 1 + tanh and
// (AVX2) e^−|z| below 2^-126 taken as 0, the last the subnormal range (derivation: tests/test_glu.cpp).
enum class GluActivation : int { kSiLU = 0, kGeluTanh = 1 };
struct GluArgs {
  float* g;        // [count], in: the gate projection, out: act(g)·u
  const float* u;  // [count], the up projection
  int64_t count;
  GluActivation act;
};

struct KernelTable {
  const char* name;
  void (*affine_qmm)(const AffineQmmArgs&);
  void (*w8a8_gemm)(const IntLinearArgs&);  // M > 1
  void (*w8a8_gemv)(const IntLinearArgs&);  // M == 1
  void (*w4a8_gemm)(const IntLinearArgs&);
  void (*w4a8_gemv)(const IntLinearArgs&);
  void (*attention)(const AttentionArgs&);
  void (*dense_gemm)(const DenseGemmArgs&);  // M >= 1
  void (*kv_append)(const KVAppendArgs&);    // rotate + quantize + store new KV rows (n >= 1)
  void (*ggml_linear)(const GgmlLinearArgs&);  // native GGUF weights, M >= 1
  void (*ggml_dequantize)(const GgmlDequantArgs&);  // native GGUF weight rows → float32
  void (*gated_delta)(const GatedDeltaKernelArgs&);  // the gated delta rule over value heads [h0, h1)
  void (*log_sum_exp)(const LogSumExpArgs&);
  void (*glu)(const GluArgs&);  // element-wise; callers split large counts over the pool
  void (*recent_block)(const RecentBlockArgs&);  // callers split the query heads over the pool
  void (*hadamard_rows)(const HadamardRowsArgs&);  // one thread; bit-identical at every level
  // Whether ggml_linear beats ggml_dequantize + dense_gemm with 16 or more activation rows (the layers' choice,
  // nn/linear_weights.cpp): true where a level has a GEMM-shaped int8 kernel for native weights (avx512).
  bool ggml_linear_prefill = false;
  // Whether this level multiplies the formats quant::ggml_interleavable takes faster with their rows interleaved
  // (quant/ggml_interleave.h): the CPU loader then interleaves every such weight whose N is a multiple of 8.
  bool ggml_interleave = false;
};

// The reference table: always present.
const KernelTable& ref_kernels();
// The table the public operations use (chosen once at start-up; the reference until fast tables exist).
const KernelTable& active_kernels();

}  // namespace cider::kernels

// ---- ISA dispatch (x86 kernels, issue 4) ------------------------------------------------------------------------
// Tables: "ref" (kernels/ref), "avx2" (kernels/x86/avx2: AVX2+FMA+F16C), "avx512" (kernels/x86/avx512: AVX-512
// F/BW/VL/DQ + VNNI). active_kernels() is chosen once, on first use: the highest level the CPU and OS support
// (core/cpu_features.h), lowered by $CIDER_ISA=ref|avx2|avx512 (a level above the machine's is an error). Entries a
// fast table does not speed up call the reference explicitly (documented per table in kernels/kernel_table.cpp).
namespace cider {
enum class IsaLevel : int;  // core/cpu_features.h
}
namespace cider::kernels {
// The table of one level; throws Error(kUnsupported) when this machine cannot run it (so tests can run every level
// in supported_isas() against ref_kernels()).
const KernelTable& kernels_for_isa(IsaLevel level);
}  // namespace cider::kernels
