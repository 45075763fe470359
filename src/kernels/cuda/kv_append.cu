// cider/kernels/cuda/kv_append.cu — rotate + quantize + append of KV rows on the GPU (cuda::kv_append) and the SO(4)
// block rotation of float32 rows (cuda::rotate_rows). Contracts: kernels/cuda/cuda_api.h; layout: docs/kv_cache.md.
//
// Bit-identical to kernels::ref_kernels().kv_append: the reference (built with -ffp-contract=off) rounds every
// multiply and every add, so every float operation here is an explicit _rn intrinsic (__fmul_rn, __fadd_rn,
// __fsub_rn, __fdiv_rn), which nvcc never contracts into FMA; the additions keep the reference's left-to-right order.
//
// kv_append: one CTA of kAppendThreads per cached row (b, h, t) — B·H·n CTAs. The row is read into shared memory
// as float32 [dim], each thread rotates whole 4-d blocks in place, then (bits > 0) one warp per quantization group
// runs quant::affine_quantize_group's arithmetic with a lane per value (warp min/max, every code in parallel) and
// writes the group's packed words (groups start on word boundaries: gs·bits is a multiple of 32) and its scale and
// bias; (bits = 0) each value is rounded to the storage dtype. (The first version ran each group's 64 values
// sequentially in one thread: 13.8 µs for a B1 H8 D128 decode step, a chain of dependent divisions.) Decode appends B·H rows of one position, so one CTA per row is plenty;
// a prefill append of n positions launches B·H·n CTAs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/so4_rotation.cuh"
#include "quant/kv_stats.h"

namespace cider::cuda {

namespace {

constexpr int kAppendThreads = 128;
constexpr int64_t kMaxAppendDim = 8192;  // float32 row in shared memory: 32 KB

__device__ __forceinline__ float load_elem(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Round to nearest even, as core/dtype.h's store_float (f16 overflow to inf, bf16 top half rounded).
__device__ __forceinline__ void store_elem(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

__device__ __forceinline__ int64_t dtype_size_dev(DType t) { return t == DType::kF32 ? 4 : 2; }

// quant::affine_quantize_group for one group of `gs` values at w (shared memory), run by one warp: lane ℓ owns
// values ℓ, ℓ + 32, … Same bytes as the reference's sequential loop: its min/max (keep the first of equals) differ
// from fminf/fmaxf only in the sign of a zero, which no output depends on (|lo|, |hi|, hi − lo, and a ±0 edge gives
// q0 = ±0 → bias 0), and in NaN handling, reproduced: a NaN first value stays the min and max, later NaNs are skipped.
// True divisions, rintf (round half to even), the NaN-safe clamp of the reference. The group's values are read through
// value(i), i < gs, its codes written through put(i, code); the (unrounded) scale and bias are returned. Used for
// groups along a row (quantize_group_warp) and for the per-channel keys' columns (quantize_column_warp) alike.
template <class Value, class Put>
__device__ __forceinline__ void affine_group_warp(Value value, int gs, int bits, Put put, int lane, float& scale_out,
                                                  float& bias_out) {
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  const float w0 = value(0);
  float lo = value(lane), hi = lo;
  for (int i = lane + 32; i < gs; i += 32) {
    const float w = value(i);
    lo = fminf(lo, w);
    hi = fmaxf(hi, w);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if (isnan(w0)) lo = hi = w0;
  const bool neg = fabsf(lo) > fabsf(hi);
  float scale = __fdiv_rn(__fsub_rn(hi, lo), n_bins);
  scale = (scale < eps) ? eps : scale;
  scale = neg ? scale : -scale;
  const float edge = neg ? lo : hi;
  const float q0 = rintf(__fdiv_rn(edge, scale));
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = __fdiv_rn(edge, q0);
    bias = edge;
  }
  for (int i = lane; i < gs; i += 32) {
    const float q = rintf(__fdiv_rn(__fsub_rn(value(i), bias), scale));
    put(i, static_cast<uint8_t>(q >= 0.0f ? fminf(q, n_bins) : 0.0f));
  }
  scale_out = scale;
  bias_out = bias;
}

// One group of a row in shared memory: the codes go through shared memory (`codes`, gs bytes) and lanes
// < gs·bits/32 assemble the packed words.
__device__ void quantize_group_warp(const float* w, int gs, int bits, uint32_t* words, void* scales, void* biases,
                                    DType sdt, int64_t gi, uint8_t* codes, int lane) {
  float scale, bias;
  affine_group_warp([&](int i) { return w[i]; }, gs, bits, [&](int i, uint8_t c) { codes[i] = c; }, lane, scale, bias);
  __syncwarp();
  const int n_words = gs * bits / 32;  // groups start on word boundaries: gs·bits is a multiple of 32
  if (lane < n_words) {
    const int first = (32 * lane) / bits, last = (32 * lane + 31) / bits;  // codes touching this word
    uint32_t word = 0;
    for (int i = first; i <= last && i < gs; ++i) {
      const int sh = i * bits - 32 * lane;
      const uint32_t c = codes[i];
      word |= sh >= 0 ? (c << sh) : (c >> (-sh));
    }
    words[lane] = word;
  }
  if (lane == 0) {
    store_elem(scales, sdt, gi, scale);
    store_elem(biases, sdt, gi, bias);
  }
  __syncwarp();  // codes is reused by this warp's next group
}

// blockIdx.y picks the append (a0, or a1 for kv_append_pair: keys and values with their own bits in one launch).
__global__ void __launch_bounds__(kAppendThreads) kv_append_kernel(KVAppendBatchArgs a0, KVAppendBatchArgs a1,
                                                                    const int32_t* d_offset) {
  extern __shared__ float row[];  // [dim]
  const KVAppendBatchArgs& a = blockIdx.y == 0 ? a0 : a1;
  const int64_t row_id = blockIdx.x;  // (b, h, t) in [B, H, n] order
  // The source rows and d_offset come from earlier kernels, and the cache may still be read by the previous step's
  // attention: nothing is touched before the wait (PDL, kernels/cuda/pdl.cuh).
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  if (row_id >= a.B * a.H * a.n) return;  // the shorter of a pair's appends
  const int64_t t = row_id % a.n;
  const int64_t bh = row_id / a.n;
  const int64_t h = bh % a.H, b = bh / a.H;
  const int64_t offset = d_offset ? static_cast<int64_t>(*d_offset) : a.offset;
  const int64_t pos = offset + t;
  if (pos < 0 || pos >= a.capacity) return;  // a device offset past the storage: write nothing
  const int64_t D = a.dim;
  const int64_t src0 = b * a.src_stride_b + h * a.src_stride_h + t * a.src_stride_t;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) row[d] = load_elem(a.src, a.src_dtype, src0 + d);
  __syncthreads();
  if (a.rotation != 0) {
    for (int64_t blk = threadIdx.x; blk < D / 4; blk += blockDim.x) {
      float v[4] = {row[blk * 4], row[blk * 4 + 1], row[blk * 4 + 2], row[blk * 4 + 3]};
      so4::rotate_block(v, a.qL + blk * 4, a.qR ? a.qR + blk * 4 : nullptr, a.rotation, false);
      for (int k = 0; k < 4; ++k) row[blk * 4 + k] = v[k];
    }
    __syncthreads();
  }
  const int64_t dst_row = (b * a.H + h) * a.capacity + pos;
  if (a.bits == 0) {
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) store_elem(a.dst, a.dst_dtype, dst_row * D + d, row[d]);
    return;
  }
  const int64_t groups = D / a.group_size;
  const int64_t words_per_row = D * a.bits / 32, words_per_group = a.group_size * a.bits / 32;
  __shared__ uint8_t codes[kAppendThreads / 32][128];  // one group's codes per warp (gs ≤ 128)
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t g = warp; g < groups; g += kAppendThreads / 32) {
    quantize_group_warp(row + g * a.group_size, static_cast<int>(a.group_size), a.bits,
                        static_cast<uint32_t*>(a.dst) + dst_row * words_per_row + g * words_per_group, a.scales,
                        a.biases, a.dst_dtype, dst_row * groups + g, codes[warp], lane);
  }
}

__global__ void rotate_rows_kernel(float* x, int64_t rows, int64_t dim, int rotation, const float* qL,
                                   const float* qR, bool inverse) {
  const int64_t blocks = dim / 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // (row, block)
  if (i >= rows * blocks) return;
  const int64_t r = i / blocks, blk = i % blocks;
  float* v4 = x + r * dim + blk * 4;
  float v[4] = {v4[0], v4[1], v4[2], v4[3]};
  so4::rotate_block(v, qL + blk * 4, qR ? qR + blk * 4 : nullptr, rotation, inverse);
  for (int k = 0; k < 4; ++k) v4[k] = v[k];
}

// ---- per-channel keys --------------------------------------------------------------------------------------------

__device__ __forceinline__ float bf16_bits_to_float(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }

// round_to(dtype, x) of core/dtype.h.
__device__ __forceinline__ float round_to_dtype(DType t, float x) {
  switch (t) {
    case DType::kF16: return __half2float(__float2half_rn(x));
    case DType::kBF16: return __bfloat162float(__float2bfloat16_rn(x));
    default: return x;
  }
}

// Column d of the window (gs rows of `dim` bfloat16 values): the codes go to codes[t·cstride + d] (shared memory),
// the scale and bias to element d of the block's rows.
__device__ void quantize_column_warp(const uint16_t* window, int64_t dim, int gs, int bits, int64_t d,
                                     int64_t cstride, uint8_t* codes, void* scales, void* biases, DType sdt,
                                     int lane) {
  float scale, bias;
  affine_group_warp([&](int i) { return bf16_bits_to_float(window[i * dim + d]); }, gs, bits,
                    [&](int i, uint8_t c) { codes[i * cstride + d] = c; }, lane, scale, bias);
  if (lane == 0) {
    store_elem(scales, sdt, d, scale);
    store_elem(biases, sdt, d, bias);
  }
}

// The per-channel key kernels work on column groups of 32 (the last may be narrower): a group of 32 columns holds
// 32·bits bits, whole words at every width, so a group's codes pack into words no other group touches, and the groups
// of a head run in parallel (CTA y = group). kChanThreads: 8 warps, a warp per column at a time.
constexpr int kChanThreads = 256;
constexpr int kChanCols = 32;

// Packs rows [0, gs) of a block's codes (shared memory [gs][ncols], columns c0 .. c0 + ncols − 1) into their words
// (quant::pack_codes: code d at bit d·bits of the row, little-endian words).
__device__ void pack_group(const uint8_t* block_codes, int64_t gs, int64_t ncols, int64_t c0, int bits, int64_t wpr,
                           uint32_t* codes) {
  const int64_t w0 = c0 * bits / 32, nw = ncols * bits / 32;
  for (int64_t i = threadIdx.x; i < gs * nw; i += blockDim.x) {
    const int64_t t = i / nw, wd = w0 + i % nw;
    const int first = static_cast<int>((32 * wd) / bits), last = static_cast<int>((32 * wd + 31) / bits);
    uint32_t word = 0;
    for (int k = first; k <= last && k < c0 + ncols; ++k) {
      const int sh = k * bits - 32 * static_cast<int>(wd);
      const uint32_t c = block_codes[t * ncols + (k - c0)];
      word |= sh >= 0 ? (c << sh) : (c >> (-sh));
    }
    codes[t * wpr + wd] = word;
  }
}

// ---- outlier key channels (KVChannelKeysArgs::outliers > 0; nn::QuantizedKVCache::refine_outliers) ----

constexpr int kMaxQueryRep = 64;  // query heads per KV head whose statistics an append reads

// Channel d of block row t (position pos) as the window holds it when its block fills: positions before the append
// from the window, the append's from the source rounded to bfloat16.
__device__ __forceinline__ float chan_key(const KVChannelKeysArgs& a, int64_t bh, int64_t offset, int64_t pos,
                                          int64_t d) {
  if (pos < offset) return bf16_bits_to_float(a.residual[(bh * a.group_size + pos % a.group_size) * a.dim + d]);
  const int64_t b = bh / a.H, h = bh % a.H;
  const float v = load_elem(a.src, a.src_dtype, b * a.src_stride_b + h * a.src_stride_h + (pos - offset) * a.src_stride_t + d);
  return __bfloat162float(__float2bfloat16_rn(v));
}

// fin[(pos − first)·rep + i] = 1 when query head h·rep + i at append position pos (first ≤ pos < first + count) is
// finite in every channel (nn::QuantizedKVCache::observe_queries: a row with a non-finite element counts 0). A warp
// per row.
__device__ void query_finite_flags(const KVChannelKeysArgs& a, int64_t bh, int64_t offset, int64_t first,
                                   int64_t count, uint8_t* fin) {
  const int64_t rep = a.Hq / a.H, b = bh / a.H, h = bh % a.H;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t k = warp; k < count * rep; k += blockDim.x / 32) {
    const float* row = a.q + b * a.q_stride_b + (h * rep + k % rep) * a.q_stride_h + (first + k / rep - offset) * a.q_stride_t;
    bool ok = true;
    for (int64_t d = lane; d < a.dim; d += 32) ok = ok && isfinite(row[d]);
    ok = __all_sync(0xffffffffu, ok);
    if (lane == 0) fin[k] = ok ? 1 : 0;
  }
}

// Plane 9's value for append position pos and column d (d = dim: the count): Σ over the KV head's query heads, in
// order, of q² (1 for the count), 0 for a non-finite row, in float32, rounded to bfloat16 (as the CPU cache sums and
// stores them). fin: pos's rep flags.
__device__ __forceinline__ float query_stat(const KVChannelKeysArgs& a, int64_t bh, int64_t offset, int64_t pos,
                                            int64_t d, const uint8_t* fin) {
  const int64_t rep = a.Hq / a.H, b = bh / a.H, h = bh % a.H;
  float s = 0.0f;
  for (int64_t i = 0; i < rep; ++i) {
    float x = 0.0f;
    if (fin[i]) {
      if (d == a.dim) {
        x = 1.0f;
      } else {
        const float q = a.q[b * a.q_stride_b + (h * rep + i) * a.q_stride_h + (pos - offset) * a.q_stride_t + d];
        x = __fmul_rn(q, q);
      }
    }
    s = __fadd_rn(s, x);
  }
  return d == a.dim ? s : quant::kv_stat_decode(quant::kv_stat_encode(s));  // as stored: the count exact
}

// Shared memory of outlier_block / write_qstats: the finite flags [gs][rep], the statistics' column sums [dim + 1]
// and the scores [dim] (double), the ranks [dim] and the chosen channels [32] (int), a code row per warp [8][gs].
__host__ __device__ inline size_t outlier_smem_bytes(int64_t gs, int64_t rep, int64_t dim) {
  const size_t fin = (static_cast<size_t>(gs * (rep > 0 ? rep : 1)) + 7) / 8 * 8;
  return fin + static_cast<size_t>(2 * dim + 1) * 8 + static_cast<size_t>(dim + 32) * 4 + 8 * static_cast<size_t>(gs);
}

// Block `block` of head bh, filled by this append (positions from `offset` come from the source): its `outliers`
// channels with the largest range × RMS of its own positions' queries (range alone when none were shown; ties to the
// lower channel), in ascending order, each refined by 4 bits — nn::QuantizedKVCache::refine_outliers, the same
// arithmetic: column sums of the stored statistics (quant/kv_stats.h) in double in position order, score −(hi − lo)·√(Σq²/count) in
// double, the coarse value c·s + b with the stored (rounded) scale and bias in float32, the code
// ⌊residual/(|s|/15) + 8⌋ clamped to 0..15. The codes c are recomputed with the quantizer the block's columns went
// through (affine_group_warp), so they are the packed codes. The whole CTA; rows are read where they are (window or
// source), nothing is written but the block's outlier planes.
__device__ void outlier_block(const KVChannelKeysArgs& a, int64_t bh, int64_t block, int64_t offset, uint8_t* smem) {
  const int64_t D = a.dim, gs = a.group_size, N = a.outliers, p0 = block * gs;
  const int64_t rep = a.q ? a.Hq / a.H : 0, first = max(p0, offset);
  uint8_t* fin = smem;
  double* st = reinterpret_cast<double*>(smem + (static_cast<size_t>(gs * (rep > 0 ? rep : 1)) + 7) / 8 * 8);
  double* score = st + D + 1;
  int* rank = reinterpret_cast<int*>(score + D);
  int* chosen = rank + D;
  uint8_t* rc = reinterpret_cast<uint8_t*>(chosen + 32);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int nwarps = static_cast<int>(blockDim.x >> 5);
  if (rep > 0) query_finite_flags(a, bh, offset, first, p0 + gs - first, fin);
  __syncthreads();
  for (int64_t d = threadIdx.x; d <= D; d += blockDim.x) {
    double sum = 0.0;
    for (int64_t t = 0; t < gs; ++t) {
      const int64_t pos = p0 + t;
      float v = 0.0f;
      if (pos < offset)
        v = d == D ? static_cast<float>(a.qstats[(bh * gs + t) * (D + 1) + d])
                   : quant::kv_stat_decode(a.qstats[(bh * gs + t) * (D + 1) + d]);
      else if (rep > 0)
        v = query_stat(a, bh, offset, pos, d, fin + (pos - first) * rep);
      sum = __dadd_rn(sum, static_cast<double>(v));
    }
    st[d] = sum;
  }
  __syncthreads();
  const double count = st[D];
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float lo = chan_key(a, bh, offset, p0, d), hi = lo;
    for (int64_t t = 1; t < gs; ++t) {
      const float v = chan_key(a, bh, offset, p0 + t, d);
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
    }
    const double w = count > 0.0 ? __dsqrt_rn(__ddiv_rn(st[d], count)) : 1.0;
    score[d] = __dmul_rn(-__dsub_rn(static_cast<double>(hi), static_cast<double>(lo)), w);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {  // the ordering of (score, channel) pairs
    const double sd = score[d];
    int r = 0;
    for (int64_t e = 0; e < D; ++e) r += (score[e] < sd || (score[e] == sd && e < d)) ? 1 : 0;
    rank[d] = r;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    if (rank[d] >= N) continue;
    int o = 0;
    for (int64_t e = 0; e < d; ++e) o += rank[e] < N ? 1 : 0;
    chosen[o] = static_cast<int>(d);
  }
  __syncthreads();
  const DType sdt = a.scale_dtype;
  uint8_t* codes = rc + warp * gs;
  for (int64_t o = warp; o < N; o += nwarps) {
    const int64_t d = chosen[o];
    float scale, bias;
    affine_group_warp([&](int i) { return chan_key(a, bh, offset, p0 + i, d); }, static_cast<int>(gs), a.bits,
                      [&](int i, uint8_t c) { codes[i] = c; }, lane, scale, bias);
    __syncwarp();
    const float s = round_to_dtype(sdt, scale), bb = round_to_dtype(sdt, bias);
    const float step = __fdiv_rn(fabsf(s), 15.0f);
    uint8_t* dst = a.outlier_codes + ((bh * a.blocks + block) * N + o) * (gs / 2);
    for (int64_t j = lane; j < gs / 2; j += 32) {
      uint32_t byte = 0;
      for (int u = 0; u < 2; ++u) {
        const int64_t t = 2 * j + u;
        uint32_t r = 8u;  // a constant channel: its coarse value is exact
        if (step > 0.0f) {
          const float base = __fadd_rn(__fmul_rn(static_cast<float>(codes[t]), s), bb);
          const float res = __fsub_rn(chan_key(a, bh, offset, p0 + t, d), base);
          const float f = floorf(__fadd_rn(__fdiv_rn(res, step), 8.0f));
          r = static_cast<uint32_t>(fminf(fmaxf(f, 0.0f), 15.0f));
        }
        byte |= r << (4 * u);
      }
      dst[j] = static_cast<uint8_t>(byte);
    }
    if (lane == 0) a.outlier_index[(bh * a.blocks + block) * N + o] = static_cast<uint16_t>(d);
    __syncwarp();  // codes is reused by this warp's next channel
  }
}

// Plane 9 rows of append positions [first, end) (row = position mod gs): their queries' statistics, zeros without
// queries. The whole CTA; fin as in outlier_block.
__device__ void write_qstats(const KVChannelKeysArgs& a, int64_t bh, int64_t offset, int64_t first, int64_t end,
                             uint8_t* fin) {
  if (first >= end) return;
  const int64_t D = a.dim, gs = a.group_size, rep = a.q ? a.Hq / a.H : 0;
  if (rep > 0) query_finite_flags(a, bh, offset, first, end - first, fin);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < (end - first) * (D + 1); i += blockDim.x) {
    const int64_t pos = first + i / (D + 1), d = i % (D + 1);
    const float v = rep > 0 ? query_stat(a, bh, offset, pos, d, fin + (pos - first) * rep) : 0.0f;
    a.qstats[(bh * gs + pos % gs) * (D + 1) + d] = d == D ? static_cast<uint8_t>(v) : quant::kv_stat_encode(v);
  }
}

// Appends of n > 1 positions with outlier channels, before the key kernels (which overwrite window rows this reads):
// CTA (b·H + h, z) chooses and refines the z-th block the append fills.
__global__ void __launch_bounds__(kChanThreads) kv_channel_outliers_kernel(KVChannelKeysArgs a, const int32_t* d_offset) {
  extern __shared__ __align__(16) uint8_t out_smem[];
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t bh = blockIdx.x;
  const int64_t offset = d_offset ? static_cast<int64_t>(*d_offset) : a.offset;
  if (offset < 0 || offset + a.n > a.capacity) return;
  const int64_t block = offset / a.group_size + blockIdx.y;
  if ((block + 1) * a.group_size > offset + a.n) return;  // not filled by this append
  outlier_block(a, bh, block, offset, out_smem);
}

// …and after them: the statistics of the positions left in the window (from the last block the append fills).
__global__ void __launch_bounds__(kChanThreads) kv_channel_qstats_kernel(KVChannelKeysArgs a, const int32_t* d_offset) {
  extern __shared__ __align__(16) uint8_t out_smem[];
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t bh = blockIdx.x;
  const int64_t offset = d_offset ? static_cast<int64_t>(*d_offset) : a.offset;
  if (offset < 0 || offset + a.n > a.capacity) return;
  const int64_t end = offset + a.n;
  write_qstats(a, bh, offset, max(offset, end / a.group_size * a.group_size), end, out_smem);
}

// Small appends (n ≤ gs: decode, short chunks). CTA (b·H + h, column group): the append's runs in order, each run's
// rows of the group's columns to the window; a filled block is quantized column by column (one warp per column) and
// its group's words packed.
__global__ void __launch_bounds__(kChanThreads) kv_channel_keys_kernel(KVChannelKeysArgs a, const int32_t* d_offset) {
  extern __shared__ __align__(16) uint8_t block_codes[];  // [gs, kChanCols] (the outlier CTA: outlier_smem_bytes)
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int64_t offset = d_offset ? static_cast<int64_t>(*d_offset) : a.offset;
  if (offset < 0 || offset + a.n > a.capacity) return;  // a device offset past the storage: write nothing
  const int64_t D = a.dim, gs = a.group_size, wpr = D * a.bits / 32;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kChanCols;
  if (c0 >= D) {
    // One position (decode) with outlier channels: the CTA after the column groups chooses the channels of the block
    // it fills (it reads window rows before the position, which no CTA of this launch writes, and the source) and
    // writes the position's query statistics.
    if ((offset + 1) % gs == 0) outlier_block(a, bh, offset / gs, offset, block_codes);
    __syncthreads();
    write_qstats(a, bh, offset, offset, offset + 1, block_codes);
    return;
  }
  const int64_t ncols = min(static_cast<int64_t>(kChanCols), D - c0);
  uint16_t* window = a.residual + bh * gs * D;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t src0 = b * a.src_stride_b + h * a.src_stride_h;
  for (int64_t done = 0; done < a.n;) {
    const int64_t pos = offset + done, r = pos % gs, run = min(a.n - done, gs - r);
    for (int64_t i = threadIdx.x; i < run * ncols; i += blockDim.x) {
      const int64_t t = i / ncols, d = c0 + i % ncols;
      const float v = load_elem(a.src, a.src_dtype, src0 + (done + t) * a.src_stride_t + d);
      window[(r + t) * D + d] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    }
    __syncthreads();
    if (r + run == gs) {
      const int64_t block = pos / gs;
      const int64_t ss = dtype_size_dev(a.scale_dtype);
      void* sc = static_cast<uint8_t*>(a.scales) + ((bh * a.blocks + block) * D + c0) * ss;
      void* bi = static_cast<uint8_t*>(a.biases) + ((bh * a.blocks + block) * D + c0) * ss;
      for (int64_t d = warp; d < ncols; d += kChanThreads / 32)
        quantize_column_warp(window + c0, D, static_cast<int>(gs), a.bits, d, ncols, block_codes, sc, bi,
                             a.scale_dtype, lane);
      __syncthreads();
      pack_group(block_codes, gs, ncols, c0, a.bits, wpr, a.codes + (bh * a.capacity + block * gs) * wpr);
      __syncthreads();  // the window and block_codes are rewritten by the next run
    }
    done += run;
  }
}

// Large appends (n > gs: prefill chunks), phase 1: CTA (b·H + h, column group, z) quantizes the z-th block this append
// completes, staging the group's columns in shared memory as bfloat16 — the window's rows for positions before the
// append (the first block), the source's after — so the blocks run in parallel. Phase 2 (kv_channel_tail_kernel,
// the next launch: it waits for this grid) writes the rows after the last completed block to the window, after
// phase 1 has read the window's old rows.
__global__ void __launch_bounds__(kChanThreads) kv_channel_blocks_kernel(KVChannelKeysArgs a, const int32_t* d_offset) {
  extern __shared__ uint8_t chan_smem[];  // stage [gs][kChanCols] bf16, then codes [gs][kChanCols]
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int64_t offset = d_offset ? static_cast<int64_t>(*d_offset) : a.offset;
  if (offset < 0 || offset + a.n > a.capacity) return;
  const int64_t D = a.dim, gs = a.group_size, wpr = D * a.bits / 32;
  const int64_t block = offset / gs + blockIdx.z;
  if ((block + 1) * gs > offset + a.n) return;  // not completed by this append
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kChanCols, ncols = min(static_cast<int64_t>(kChanCols), D - c0);
  uint16_t* stage = reinterpret_cast<uint16_t*>(chan_smem);
  uint8_t* block_codes = chan_smem + gs * kChanCols * 2;
  const uint16_t* window = a.residual + bh * gs * D;
  const int64_t src0 = b * a.src_stride_b + h * a.src_stride_h;
  for (int64_t i = threadIdx.x; i < gs * ncols; i += blockDim.x) {
    const int64_t t = i / ncols, d = c0 + i % ncols, pos = block * gs + t;
    stage[t * ncols + (d - c0)] =
        pos < offset ? window[t * D + d]
                     : __bfloat16_as_ushort(__float2bfloat16_rn(
                           load_elem(a.src, a.src_dtype, src0 + (pos - offset) * a.src_stride_t + d)));
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t ss = dtype_size_dev(a.scale_dtype);
  void* sc = static_cast<uint8_t*>(a.scales) + ((bh * a.blocks + block) * D + c0) * ss;
  void* bi = static_cast<uint8_t*>(a.biases) + ((bh * a.blocks + block) * D + c0) * ss;
  for (int64_t d = warp; d < ncols; d += kChanThreads / 32)
    quantize_column_warp(stage, ncols, static_cast<int>(gs), a.bits, d, ncols, block_codes, sc, bi, a.scale_dtype,
                         lane);
  __syncthreads();
  pack_group(block_codes, gs, ncols, c0, a.bits, wpr, a.codes + (bh * a.capacity + block * gs) * wpr);
}

// Phase 2 of a large append: the rows after the last block it completes (positions from ⌊(offset + n)/gs⌋·gs, or
// from offset when it completes none) to the window.
__global__ void __launch_bounds__(kChanThreads) kv_channel_tail_kernel(KVChannelKeysArgs a, const int32_t* d_offset) {
  cuda::pdl::wait();
  cuda::pdl::launch_dependents();
  const int64_t bh = blockIdx.x, b = bh / a.H, h = bh % a.H;
  const int64_t offset = d_offset ? static_cast<int64_t>(*d_offset) : a.offset;
  if (offset < 0 || offset + a.n > a.capacity) return;
  const int64_t D = a.dim, gs = a.group_size, end = offset + a.n;
  const int64_t first = max(offset, end / gs * gs);
  uint16_t* window = a.residual + bh * gs * D;
  const int64_t src0 = b * a.src_stride_b + h * a.src_stride_h;
  for (int64_t i = threadIdx.x; i < (end - first) * D; i += blockDim.x) {
    const int64_t pos = first + i / D, d = i % D;
    const float v = load_elem(a.src, a.src_dtype, src0 + (pos - offset) * a.src_stride_t + d);
    window[(pos % gs) * D + d] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// Rows [0, kept) of block `block` dequantized back into the window (quant::affine_dequantize_value, then bfloat16).
__global__ void kv_channel_refill_kernel(KVChannelKeysArgs a, int64_t block, int64_t kept) {
  const int64_t bh = blockIdx.x, D = a.dim, gs = a.group_size, wpr = D * a.bits / 32;
  uint16_t* window = a.residual + bh * gs * D;
  const uint32_t* codes = a.codes + (bh * a.capacity + block * gs) * wpr;
  const int64_t srow = (bh * a.blocks + block) * D;
  const uint32_t mask = (1u << a.bits) - 1u;
  for (int64_t i = threadIdx.x; i < kept * D; i += blockDim.x) {
    const int64_t t = i / D, d = i % D;
    const int64_t bit = d * a.bits, wi = bit >> 5;
    const int sh = static_cast<int>(bit & 31);
    uint64_t two = codes[t * wpr + wi];
    if (sh + a.bits > 32) two |= static_cast<uint64_t>(codes[t * wpr + wi + 1]) << 32;
    const float q = static_cast<float>(static_cast<uint32_t>(two >> sh) & mask);
    const float s = load_elem(a.scales, a.scale_dtype, srow + d), bias = load_elem(a.biases, a.scale_dtype, srow + d);
    const float prod = round_to_dtype(a.scale_dtype, __fmul_rn(q, s));
    float v = round_to_dtype(a.scale_dtype, __fadd_rn(prod, bias));
    for (int64_t o = 0; o < a.outliers; ++o) {  // an outlier channel: c·s + b in float32, refined
      if (a.outlier_index[(bh * a.blocks + block) * a.outliers + o] != d) continue;
      const uint8_t byte = a.outlier_codes[((bh * a.blocks + block) * a.outliers + o) * (gs / 2) + t / 2];
      const float r = static_cast<float>((byte >> (4 * (t % 2))) & 15u);
      v = __fadd_rn(__fadd_rn(__fmul_rn(q, s), bias), __fmul_rn(__fdiv_rn(fabsf(s), 15.0f), __fsub_rn(r, 7.5f)));
    }
    window[t * D + d] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
  if (a.outliers > 0)  // the kept positions' queries were not kept with the block
    for (int64_t i = threadIdx.x; i < kept * (D + 1); i += blockDim.x) a.qstats[bh * gs * (D + 1) + i] = 0;
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

void check_rotation(const char* op, int rotation, int64_t dim, const float* qL, const float* qR) {
  check(rotation == 0 || rotation == 1 || rotation == 2, ErrorCode::kUnsupported, op,
        "rotation must be 0 (none), 1 (so4 fast) or 2 (so4 full); got ", rotation);
  if (rotation == 0) return;
  check(dim % 4 == 0, ErrorCode::kShapeMismatch, op, "a rotated dim must be a multiple of 4; got ", dim);
  check(qL != nullptr, ErrorCode::kInvalidArgument, op, "rotation ", rotation, " needs qL");
  check(rotation != 2 || qR != nullptr, ErrorCode::kInvalidArgument, op, "rotation 2 needs qR");
}

}  // namespace

namespace {
// Validates one append; returns its rows B·H·n (0: nothing to do).
int64_t check_append(const KVAppendBatchArgs& a, const int32_t* d_offset, const char* op) {
  check(is_float(a.src_dtype), ErrorCode::kInvalidArgument, op, "src_dtype must be f32, f16 or bf16; got ",
        dtype_name(a.src_dtype));
  check(is_float(a.dst_dtype), ErrorCode::kInvalidArgument, op, "dst_dtype must be f32, f16 or bf16; got ",
        dtype_name(a.dst_dtype));
  check(a.bits == 0 || a.bits == 2 || a.bits == 3 || a.bits == 4 || a.bits == 5 || a.bits == 6 || a.bits == 8,
        ErrorCode::kInvalidArgument, op, "bits must be 0 (plain), 2, 3, 4, 5, 6 or 8; got ", a.bits);
  check(a.B >= 0 && a.H >= 0 && a.n >= 0, ErrorCode::kShapeMismatch, op, "B, H, n must be >= 0; got ", a.B, ", ",
        a.H, ", ", a.n);
  check(a.dim > 0 && a.dim <= kMaxAppendDim, ErrorCode::kShapeMismatch, op, "dim must be in [1, ", kMaxAppendDim,
        "]; got ", a.dim);
  if (a.bits > 0) {
    check(a.group_size == 32 || a.group_size == 64 || a.group_size == 128, ErrorCode::kInvalidArgument, op,
          "group_size must be 32, 64 or 128; got ", a.group_size);
    check(a.dim % a.group_size == 0, ErrorCode::kShapeMismatch, op, "dim must be a multiple of group_size ",
          a.group_size, "; got ", a.dim);
    check(a.scales != nullptr && a.biases != nullptr, ErrorCode::kInvalidArgument, op,
          "a quantized append needs scales and biases");
  }
  check_rotation(op, a.rotation, a.dim, a.qL, a.qR);
  check(a.capacity > 0, ErrorCode::kShapeMismatch, op, "capacity must be positive; got ", a.capacity);
  if (!d_offset)
    check(a.offset >= 0 && a.offset + a.n <= a.capacity, ErrorCode::kOutOfRange, op,
          "positions [offset, offset + n) must lie in [0, capacity ", a.capacity, "); got offset ", a.offset,
          ", n ", a.n);
  const int64_t rows = a.B * a.H * a.n;
  if (rows == 0) return 0;
  check(a.src != nullptr && a.dst != nullptr, ErrorCode::kInvalidArgument, op, "src and dst must not be null");
  check(rows <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "B·H·n must fit a grid; got ", rows);
  return rows;
}
}  // namespace

void kv_append(const KVAppendBatchArgs& a, const int32_t* d_offset, const Exec& exec) {
  const char* op = "cuda.kv_append";
  const int64_t rows = check_append(a, d_offset, op);
  if (rows == 0) return;
  const size_t smem = static_cast<size_t>(a.dim) * sizeof(float);
  CIDER_CUDA_CHECK(op, cuda::pdl::launch(kv_append_kernel, dim3(static_cast<unsigned>(rows)), dim3(kAppendThreads),
                                        smem, static_cast<cudaStream_t>(exec.stream), a, a, d_offset));
  check_last_launch(op);
}

void kv_append_pair(const KVAppendBatchArgs& keys, const KVAppendBatchArgs& values, const int32_t* d_offset,
                    const Exec& exec) {
  const char* op = "cuda.kv_append_pair";
  const int64_t rows_k = check_append(keys, d_offset, op), rows_v = check_append(values, d_offset, op);
  if (rows_k == 0 && rows_v == 0) return;
  const size_t smem = static_cast<size_t>(std::max(keys.dim, values.dim)) * sizeof(float);
  CIDER_CUDA_CHECK(op, cuda::pdl::launch(kv_append_kernel, dim3(static_cast<unsigned>(std::max(rows_k, rows_v)), 2),
                                        dim3(kAppendThreads), smem, static_cast<cudaStream_t>(exec.stream), keys,
                                        values, d_offset));
  check_last_launch(op);
}

namespace {
void check_channel_keys(const KVChannelKeysArgs& a, const char* op) {
  check(a.B >= 0 && a.H >= 0 && a.n >= 0, ErrorCode::kShapeMismatch, op, "B, H, n must be >= 0; got ", a.B, ", ",
        a.H, ", ", a.n);
  check(a.bits == 2 || a.bits == 3 || a.bits == 4 || a.bits == 5 || a.bits == 6 || a.bits == 8,
        ErrorCode::kInvalidArgument, op, "per-channel key bits must be 2, 3, 4, 5, 6 or 8; got ", a.bits);
  check(a.group_size == 32 || a.group_size == 64 || a.group_size == 128, ErrorCode::kInvalidArgument, op,
        "group_size (block length) must be 32, 64 or 128; got ", a.group_size);
  check(a.dim > 0 && a.dim <= 256 && (a.dim * a.bits) % 32 == 0, ErrorCode::kShapeMismatch, op,
        "dim must be in [1, 256] with dim·bits a multiple of 32; got dim ", a.dim, ", bits ", a.bits);
  check(is_float(a.scale_dtype), ErrorCode::kInvalidArgument, op, "scale_dtype must be f32, f16 or bf16; got ",
        dtype_name(a.scale_dtype));
  check(a.capacity > 0 && a.blocks >= a.capacity / a.group_size, ErrorCode::kShapeMismatch, op,
        "blocks must cover capacity / group_size = ", a.capacity / a.group_size, "; got ", a.blocks);
  check(a.codes != nullptr && a.scales != nullptr && a.biases != nullptr && a.residual != nullptr,
        ErrorCode::kInvalidArgument, op, "codes, scales, biases and residual must not be null");
  check(a.B * a.H <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "B·H must fit a grid; got ", a.B * a.H);
  check(a.outliers >= 0 && a.outliers <= 32 && a.outliers <= a.dim, ErrorCode::kInvalidArgument, op,
        "outlier channels must be in [0, min(32, dim)]; got ", a.outliers);
  if (a.outliers > 0) {
    check(a.outlier_codes != nullptr && a.outlier_index != nullptr && a.qstats != nullptr,
          ErrorCode::kInvalidArgument, op, "outlier channels need outlier_codes, outlier_index and qstats");
    if (a.q)
      check(a.H > 0 && a.Hq >= a.H && a.Hq % a.H == 0 && a.Hq / a.H <= kMaxQueryRep, ErrorCode::kShapeMismatch, op,
            "the queries' heads Hq must be a multiple of H ", a.H, " with at most ", kMaxQueryRep,
            " per KV head; got Hq ", a.Hq);
  }
}
}  // namespace

void kv_append_channel_keys(const KVChannelKeysArgs& a, const int32_t* d_offset, const Exec& exec) {
  const char* op = "cuda.kv_append_channel_keys";
  check_channel_keys(a, op);
  check(is_float(a.src_dtype), ErrorCode::kInvalidArgument, op, "src_dtype must be f32, f16 or bf16; got ",
        dtype_name(a.src_dtype));
  if (!d_offset)
    check(a.offset >= 0 && a.offset + a.n <= a.capacity, ErrorCode::kOutOfRange, op,
          "positions [offset, offset + n) must lie in [0, capacity ", a.capacity, "); got offset ", a.offset,
          ", n ", a.n);
  if (a.B * a.H == 0 || a.n == 0) return;
  check(a.src != nullptr, ErrorCode::kInvalidArgument, op, "src must not be null");
  const unsigned groups = static_cast<unsigned>((a.dim + kChanCols - 1) / kChanCols);
  const cudaStream_t st = static_cast<cudaStream_t>(exec.stream);
  const size_t osmem = a.outliers > 0 ? outlier_smem_bytes(a.group_size, a.q ? a.Hq / a.H : 0, a.dim) : 0;
  // Outlier channels: one position (decode) in the key kernel's extra CTA; more in a launch before the key kernels
  // (the blocks filled) and one after them (the statistics of the positions left in the window).
  const bool split_outliers = a.outliers > 0 && a.n > 1;
  if (split_outliers)
    CIDER_CUDA_CHECK(op, cuda::pdl::launch(kv_channel_outliers_kernel,
                                          dim3(static_cast<unsigned>(a.B * a.H),
                                               static_cast<unsigned>(a.n / a.group_size + 1)),
                                          dim3(kChanThreads), osmem, st, a, d_offset));
  if (a.n <= a.group_size) {
    const bool extra = a.outliers > 0 && a.n == 1;
    const size_t smem = std::max(static_cast<size_t>(a.group_size * kChanCols), extra ? osmem : size_t{0});
    CIDER_CUDA_CHECK(op, cuda::pdl::launch(kv_channel_keys_kernel,
                                          dim3(static_cast<unsigned>(a.B * a.H), groups + (extra ? 1u : 0u)),
                                          dim3(kChanThreads), smem, st, a, d_offset));
  } else {
    // Blocks completed: at most ⌈n / gs⌉ (+ 1 when the append starts inside a block).
    const unsigned zmax = static_cast<unsigned>(a.n / a.group_size + 1);
    const size_t smem = static_cast<size_t>(a.group_size * kChanCols * 3);
    CIDER_CUDA_CHECK(op, cuda::pdl::launch(kv_channel_blocks_kernel,
                                          dim3(static_cast<unsigned>(a.B * a.H), groups, zmax), dim3(kChanThreads),
                                          smem, st, a, d_offset));
    CIDER_CUDA_CHECK(op, cuda::pdl::launch(kv_channel_tail_kernel, dim3(static_cast<unsigned>(a.B * a.H)),
                                          dim3(kChanThreads), 0, st, a, d_offset));
  }
  if (split_outliers)
    CIDER_CUDA_CHECK(op, cuda::pdl::launch(kv_channel_qstats_kernel, dim3(static_cast<unsigned>(a.B * a.H)),
                                          dim3(kChanThreads), osmem, st, a, d_offset));
  check_last_launch(op);
}

void kv_channel_refill(const KVChannelKeysArgs& a, int64_t position, const Exec& exec) {
  const char* op = "cuda.kv_channel_refill";
  check_channel_keys(a, op);
  check(position >= 0 && position <= a.capacity, ErrorCode::kOutOfRange, op, "position must lie in [0, capacity ",
        a.capacity, "]; got ", position);
  const int64_t kept = position % a.group_size;
  if (a.B * a.H == 0 || kept == 0) return;
  kv_channel_refill_kernel<<<static_cast<unsigned>(a.B * a.H), kAppendThreads, 0,
                             static_cast<cudaStream_t>(exec.stream)>>>(a, position / a.group_size, kept);
  check_last_launch(op);
}

void rotate_rows(float* x, int64_t rows, int64_t dim, int rotation, const float* qL, const float* qR, bool inverse,
                 const Exec& exec) {
  const char* op = "cuda.rotate_rows";
  check(rows >= 0 && dim > 0, ErrorCode::kShapeMismatch, op, "rows must be >= 0 and dim positive; got ", rows, ", ",
        dim);
  check_rotation(op, rotation, dim, qL, qR);
  if (rotation == 0 || rows == 0) return;
  check(x != nullptr, ErrorCode::kInvalidArgument, op, "x must not be null");
  const int64_t items = rows * (dim / 4);
  const int threads = 256;
  const int64_t grid = (items + threads - 1) / threads;
  check(grid <= 0x7fffffffLL, ErrorCode::kOutOfRange, op, "rows·dim/4 too large; got ", items);
  rotate_rows_kernel<<<static_cast<unsigned>(grid), threads, 0, static_cast<cudaStream_t>(exec.stream)>>>(
      x, rows, dim, rotation, qL, qR, inverse);
  check_last_launch(op);
}

}  // namespace cider::cuda
