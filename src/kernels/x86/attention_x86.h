// cider/kernels/x86 — fast attention over the packed KV cache and fused rotate-quantize-append (issue 4, attention
// half). The dispatcher (kernels/kernel_table.cpp) installs them with register_attention_avx2 / _avx512.
//
// Files: attention_common.cpp (baseline flags: planning, query quantization, masks, the split merge, threads),
// avx512/attention_avx512.cpp, avx2/attention_avx2.cpp, avx512/kv_append_avx512.cpp, avx2/kv_append_avx2.cpp.
// As for every file under x86/avx2 and x86/avx512 (see x86_kernels.h): the ISA files define everything they use
// file-locally and call shared code only through the plain functions declared here. This header has no intrinsics
// and no inline functions.
//
// ---- attention design (docs/benchmarks.md, "## Attention", has the measurements) ----
// Work item = (batch b, KV head g, block of query rows, piece of the key range). The R = rep·Lb query rows of a
// block that share KV head g are processed together, so each cached row is read and unpacked once per item.
// Keys, 16 rows at a time ("tile"): the packed rows are transposed as 32-bit words (16×16), so each vector holds one
// word of 16 rows — rows in lanes. A 4-bit word holds 8 codes: its low nibbles (dims 8k, 8k+2, 8k+4, 8k+6) and its
// high nibbles (the odd dims) are multiplied by the matching 4 int8 query values with one VNNI dot product each
// (vpdpbusd: u8 codes × s8 query, int32 sums, exact); 8-bit keys are used as bytes; other widths are first unpacked
// to bytes. The query row is quantized per key group to 16-bit precision held in two int8 planes, Q = 256·qh + ql
// (quantize_query_groups below), so each word takes two dot products (high and low plane) and the exact int32 sum
// of group g is I = 256·I_h + I_l = Σ_k Q_k·c_k. It becomes
//     score += (scale·step_rg)·(s_jg·I_rjg + b_jg·Σ_k Q_rk)            (s, b the stored scale and bias of row j)
// so the score is exactly scale·q̃·k̂ with q̃ = step·Q (relative precision about 2^-16 of the group's max |q|),
// up to float32 rounding. (One int8 plane alone — half the dot products — errs by up to max|q|/254 per element:
// measured in docs/benchmarks.md, too coarse for the reference comparison the tests hold the kernels to.)
// A softcap (AttentionArgs::softcap > 0) maps each score to cap·tanh(score·(1/cap)) as the tile's scores are stored,
// before the mask, with a vector tanh within a few ulp (Taylor polynomial below |x| = 0.625, (1 − e^{−2|x|})/(1 +
// e^{−2|x|}) above), so a capped score is within about (2|s| + 8·cap)·2^-24 of cap·tanh(s/cap).
// Softmax: online, per block of kBlockRows keys (max, rescale, exp in float32). Values: float32 FMAs on codes
// converted exactly to float (3-bit and other widths unpacked from the bit stream with a byte shuffle + variable
// shift), weights p·s per (row, group), the bias part Σ p·b kept per group — the same algebra as the reference.
// Splits of the key range are merged with log-sum-exp. Plain (unquantized) caches go to the reference kernel.
// Per-channel keys (KVTensorView layout 1, docs/kv_cache.md §2b): the codes are read exactly as above, but each block
// of group_size positions has a scale and bias per channel, so the score of position j in block β is
// scale·(Σ_d (q_d·s_βd)·c_jd + Σ_d q_d·b_βd). At the first tile of each block every query row is refolded:
// q' = float32(q ⊙ s_β) goes through the same query quantization, as one group of the whole head (query_group_size
// below; the key "scale" columns are then 1 and the "bias" column 1, with bcoef[r, 0] = scale·q·b_β plus the outlier
// channels' offset), in one pass per row: q', its max, the integers and the image words; tiles of the bfloat16
// residual window (positions past the last complete block; tiles never straddle it, blocks being multiples of 16) are
// scored in float32 with the exact queries. The value path is unchanged.
// Prefill over per-channel keys on CPUs with AMX-BF16 runs the same algebra on bfloat16 tiles instead
// (amx/attention_prefill_bf16.cpp, x86_kernels.h: amx::attention_bf16); it uses this file's plan, ranges, outlier
// weights and merge.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_table.h"

namespace cider::kernels::x86 {

// Fill the attention and kv_append entries of a table with this level's kernels (call only when the CPU and OS
// support the level: kernels_for_isa checks CPUID + XCR0 first).
void register_attention_avx2(KernelTable& t);
void register_attention_avx512(KernelTable& t);

namespace avx512 {
void attention(const AttentionArgs& a);
void kv_append(const KVAppendArgs& a);
}  // namespace avx512
namespace avx2 {
void attention(const AttentionArgs& a);
void kv_append(const KVAppendArgs& a);
}  // namespace avx2

namespace attn {

constexpr int kTileRows = 16;     // key rows per tile (one vector lane per row on AVX-512)
constexpr int kBlockRows = 128;   // key rows per online-softmax block (multiple of kTileRows)
constexpr int kMaxBlockQueryRows = 64;  // R = rep·Lb query rows per work item at most (when rep <= 64)

// True when the fast kernels handle these arguments: quantized keys and values (any of the affine widths, group
// sizes and scale dtypes). Plain caches (bits == 0) are handled by the reference kernel.
bool fast_path_supported(const AttentionArgs& a);

// How the work is cut. Work items are numbered ((qb·B + b)·Hkv + g)·splits + s and handed to threads round-robin.
struct Plan {
  int64_t rep;          // Hq / Hkv
  int64_t lb;           // query rows per block
  int64_t qblocks;      // ceil(L / lb)
  int64_t splits;       // pieces of each key range
  int64_t items;        // B·Hkv·qblocks·splits
  int64_t max_rows;     // rep·lb: query rows of an item at most
  int64_t partial_floats;  // floats of one item's partial result: max_rows·(2 + Dv)
  int threads;
};
struct Item {
  int64_t b, g, i0, nl;  // query rows i0 .. i0 + nl − 1 of every query head of KV head g
  int64_t R;             // rep·nl; row r <-> query head g·rep + r / nl, query row i0 + r % nl
  int64_t klo, khi;      // key positions [klo, khi) of this piece (klo is not rounded; may be empty)
};
// threads 0 = the default pool's size; max_rows: R = rep·lb query rows per item at most (at least rep)
Plan make_plan(const AttentionArgs& a, int threads, int64_t max_rows = kMaxBlockQueryRows);
Item item_of(const AttentionArgs& a, const Plan& p, int64_t index);

// Per query row r of an item: the key positions it may see inside the item's piece, [lo, hi) (causal and window
// applied; bool/additive masks are applied per element by fetch_mask).
void row_range(const AttentionArgs& a, const Item& it, int64_t r, int64_t* lo, int64_t* hi);
// Bool/additive masks: writes n values (n <= 16) for keys j0 .. j0 + n − 1 of query row r: 0 or −inf (bool),
// the mask value (additive). Not called for other mask kinds.
void fetch_mask(const AttentionArgs& a, const Item& it, int64_t r, int64_t j0, int n, float* out);

// The query quantization (each ISA file implements it on its vectors): 16-bit precision in two int8 planes, per group
// of `group_size` values of q[0, dim): s = max|q| / 127 (float32), inv = 1/s (float32), the integer
// Q = clamp(rint(q·(256·inv)), −32512, 32512) (the product rounded to float32, then to nearest even), split as
// qh = (Q + 128) >> 8 in [−127, 127] and ql = Q − 256·qh in [−128, 127] (all 0 for an all-zero group). Then q̃ = step·Q
// with step = s/256, |q − q̃| <= step/2 up to the float32 roundings of inv and of the product (the clamp never binds:
// |q·256·inv| <= 32512·(1 + 2^-22)). Per group also ΣQ. (Integer shifts split Q: one float product and one
// conversion per value, where rounding each plane from floats took five more operations — the per-channel keys'
// per-block refold quantizes every query row again at each block of positions.)

// The query's quantization groups (dims per group): per-token keys quantize it per key group (group_size); per-channel
// keys quantize each block's q' = q ⊙ s_blk as one group of the whole head when Dk <= 256 (the key "scale" columns
// are all 1 there, so groups only cost reductions and score terms; with at most 256 dims the int32 sums stay exact:
// 32512·255·256 < 2^31), else per group_size.
int64_t query_group_size(const AttentionArgs& a);

// Partial result of item `index`, at partials + index·p.partial_floats: for each of its R rows, [m, l, o[Dv]] with
// m the score maximum seen (−inf if none), l = Σ exp(s − m), o = Σ exp(s − m)·v (bias part included). Merges the
// splits of every (b, g, query block) by log-sum-exp and writes a.out (zeros for rows that saw no key).
void merge_partials(const AttentionArgs& a, const Plan& p, const float* partials);

// True when $CIDER_ATTN_SCORES is "f32": the AVX-512 kernel then computes scores with float32 FMAs on unpacked
// codes and exact queries (the variant measured against the integer path in docs/benchmarks.md; tested too).
bool float_scores_requested();

// Outlier key channels (KVTensorView::outliers = n > 0): the weights of block `blk`'s refinement codes for every query
// row r of item `it` (each channel's step read once): ow[r·n + o] = scale·q_r[d_o]·|s[blk, d_o]|/15 and the codes'
// offset ob[r] = −7.5·Σ_o ow[r·n + o]; a position's score then gains ob[r] + Σ_o ow[r·n + o]·r_o
// (kernels/kernel_table.h).
void outlier_weights(const AttentionArgs& a, const Plan& p, const Item& it, int64_t blk, float* ow, float* ob);

// Runs fn(ctx, item) for items 0 .. n−1, thread t of the default pool taking items t, t + T, t + 2T, … (round-robin
// balances causal blocks whose cost grows with the block index).
void run_items(int64_t n, void (*fn)(void* ctx, int64_t item), void* ctx);
// Per-thread scratch for the attention kernels (64-byte aligned, at least `bytes`, contents unspecified).
void* thread_scratch(size_t bytes);
// A float buffer for the partial results of one call (owned by the calling thread, reused between calls).
float* partial_buffer(size_t floats);

}  // namespace attn

}  // namespace cider::kernels::x86
