// cider/nn/kv_cache.h — per-layer key/value caches: the rotated, affine-quantized cache (IsoQuant K4/V3 style) and the
// plain float baseline, behind one interface that attention (nn/attention.h) reads.
//
// Contract (both caches; docs/kv_cache.md has the byte layout and the reasoning):
//   * update_and_fetch(keys [B, H, n, Dk], values [B, H, n, Dv]) appends n positions. Inputs may be float32, float16
//     or bfloat16 (keys and values independently) with any strides. B, H, Dk and Dv are fixed by the first append;
//     later appends must match them. Returns views of the whole valid cache (length = offset()).
//   * Storage is [B, H, capacity, ·] per stored array, capacity a multiple of kStep (256) positions. When an append
//     does not fit, the storage is reallocated to round_up(offset + n, 256) and the valid positions [0, offset) are
//     copied; appends that fit write in place (no reallocation per token).
//   * Writing rotates each row with the cache's rotation (keys: key_rotation() of Dk, values: value_rotation() of
//     Dv), in float32, then stores it (quantized: quant::affine_quantize_row; plain: rounded to the storage dtype).
//   * trim(n) drops the last min(n, offset) positions (storage untouched) and returns how many it dropped.
//   * copy_prefix(end) is a new cache holding what this one would hold after trim(this->end() − end), this one left
//     as it is: one copy of the kept rows (capacity round_up(kept, 256)); the server's prefix cache gives each request
//     its own copy of a pooled session's prefix this way. Only where can_trim(this->end() − end) (cider::Error).
//   * snapshot() copies the valid state [0, offset) and the metadata into an immutable, shareable object;
//     restore(snapshot) takes the metadata (bits, group size, rotation, seed, dtypes, dims) and the data from it,
//     with offset = snapshot length and capacity round_up(length, 256); appends then continue as usual.
//   * nbytes() = bytes of allocated storage (all capacity, valid or not), as mlx-lm reports.
//   * empty() = no dimensions yet (nothing appended since construction, or restored from a snapshot of such a cache).
//   * Sliding-window caches (config window W > 0; the model gives one to each sliding layer) keep only what queries
//     with a window of W can still see: before an append that would grow the storage past window_capacity(W, align,
//     kWindowSlack) positions, the positions older than the last W − 1 are dropped in bulk (the newest rows move
//     down to storage row 0: one memmove per (b, h) and plane; in multiples of align = window_align(spec): 16, or
//     whole blocks of group_size for per-channel keys) and the storage is set to that bound. start() counts the dropped positions:
//     storage row 0 holds absolute position start(), and offset() is the number of stored positions, so attention
//     (query i of L at stored position offset() − L + i, relative window mask) reads the cache as before; its mask
//     must be causal with a window of at most W (nn::attention checks). Appends of up to kWindowSlack positions never
//     grow the storage past the bound; a larger one grows it as far as it needs. trim(n) refuses (cider::Error,
//     nothing changed) to go back to where the next query would need a dropped position (can_trim); snapshots
//     carry window and start, and restore takes both.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/kernel_table.h"
#include "nn/kv_spec.h"
#include "nn/rotation.h"

namespace cider::nn {

// Everything needed to rebuild a cache: configuration, dimensions and valid length.
struct KVCacheMeta {
  bool quantized = true;
  // Quantized caches: bits of keys and values (independent), group size, dtype of the stored scales and biases.
  int k_bits = 0, v_bits = 0, group_size = 0;
  DType scale_dtype = DType::kF16;
  // Plain caches: dtype of the stored keys and values.
  DType dtype = DType::kF16;
  RotationKind rotation = RotationKind::kNone;
  uint64_t seed = 0;
  // Dimensions: all 0 until the first append (has_dims false).
  bool has_dims = false;
  int64_t B = 0, H = 0, Dk = 0, Dv = 0;
  int64_t length = 0;  // valid positions (stored)
  // Sliding-window caches: window > 0 (0: every position is kept) and start = positions dropped before storage row 0
  // (a multiple of group_size for per-channel keys; 0 when window is 0).
  int64_t window = 0;
  int64_t start = 0;
  KeyLayout key_layout = KeyLayout::kToken;  // quantized caches: keys per position or per channel (nn/kv_spec.h)
  int key_outliers = 0;                      // per-channel keys: outlier channels per block (nn/kv_spec.h)
  bool v_symmetric = false;                  // quantized caches: symmetric value codes, no value biases (nn/kv_spec.h)
  bool recent_exact = false;                 // per-channel keys: the recent block read unquantized (nn/kv_spec.h)

  KVSpec spec() const;  // the format part (nn/kv_spec.h), whose rules it follows
};

// An owned, immutable copy of a cache's valid state. Copies share the same read-only data.
// planes (row-major, little-endian; [B, H, length, ·] unless stated):
//   quantized: 0 key codes (uint32, Dk·k_bits/32), 1 key scales, 2 key biases (scale_dtype, Dk/gs),
//              3 value codes (uint32, Dv·v_bits/32), 4 value scales, 5 value biases (scale_dtype, Dv/gs; empty rows
//              with symmetric values: plane 4 then holds their steps)
//   quantized, per-channel keys: planes 1 and 2 are [B, H, ceil(length/gs), Dk] (one row per block of gs
//              positions; the last, incomplete block's row is not meaningful), and plane 6 is the residual window,
//              bfloat16 [B, H, gs, Dk] (rows [0, length mod gs) hold positions [length − length mod gs, length);
//              empty when length is 0)
//   quantized, per-channel keys with key_outliers = n > 0, also: plane 7 the refinement codes [B, H, ceil(length/gs),
//              n·gs/2] (uint8: per outlier channel, gs 4-bit codes, two per byte, even position low), plane 8 the
//              outlier channel indices [B, H, ceil(length/gs), n] (uint16, ascending), plane 9 the query statistics
//              of the residual window's positions [B, H, gs, Dk + 1] (uint8: per position, Σ q² per channel over the
//              head's group of query heads in quant/kv_stats.h's one-byte code, then their count; row i for position
//              ⌊length/gs⌋·gs + i, 0 where the queries were not shown)
//   quantized, per-channel keys with recent_exact, also (the last three planes): the values' window, bfloat16
//              [B, H, V, Dv] in the rotated value space as appended (V = value_window_rows(gs), nn/kv_spec.h; rows
//              [0, length mod V) hold positions [length − length mod V, length)); the sink's keys [B, H, ns, Dk] and
//              values [B, H, ns, Dv] in bfloat16 as appended (ns = sink_rows(gs); rows [0, min(ns, end)) meaningful
//              while no sliding window dropped positions)
//   plain:     0 keys (dtype, Dk), 1 values (dtype, Dv)
class KVCacheSnapshot {
 public:
  KVCacheSnapshot() = default;
  // Validates the metadata and that each plane has exactly the size the metadata implies (throws cider::Error).
  KVCacheSnapshot(const KVCacheMeta& meta, std::vector<Buffer> planes);

  const KVCacheMeta& meta() const { return meta_; }
  int64_t length() const { return meta_.length; }
  size_t num_planes() const { return planes_ ? planes_->size() : 0; }
  const Buffer& plane(size_t i) const { return (*planes_)[i]; }
  int64_t nbytes() const;  // bytes of the copied data
  const void* data_id() const { return planes_.get(); }  // equal for copies of one snapshot (null: none)
  // Views of the snapshot's data, ready for attention (capacity == length).
  kernels::KVTensorView keys() const;
  kernels::KVTensorView values() const;

 private:
  KVCacheMeta meta_;
  std::shared_ptr<const std::vector<Buffer>> planes_;
};

// Bytes a cache of format `spec` holds for B·H heads of dims Dk/Dv once `positions` positions were appended (its
// capacity grown to a multiple of KVCache::kStep): what nbytes() then reports, from the same plane shapes. Used by
// `cider fit` to size a context without allocating it. The spec must be valid (spec.validate).
// window > 0: a sliding-window cache of that window fed appends of at most KVCache::kWindowSlack positions, whose
// storage stops at window_capacity(window, window_align(spec), kWindowSlack).
int64_t kv_cache_bytes(const KVSpec& spec, int64_t B, int64_t H, int64_t Dk, int64_t Dv, int64_t positions,
                       int64_t window = 0);

// The planes of a snapshot of this metadata, in the KVCacheSnapshot order: the bytes of one row and the rows per head
// that `positions` stored positions take (one per position, one per block of group_size positions, or a fixed count;
// 0 rows for a plane the format leaves empty). For a device that keeps a cache in its own memory in these planes
// (model/cuda/cuda_backend.cpp): its snapshot copies rows(length) rows per head out of rows(capacity). Empty without
// dims.
struct KVPlaneRows {
  int64_t row_bytes = 0;
  int64_t rows = 0;
};
std::vector<KVPlaneRows> kv_snapshot_planes(const KVCacheMeta& meta, int64_t positions);

// The positions a sliding-window cache drops in multiples of: KVCache::kWindowAlign, or the group size for per-channel
// keys when larger (whole blocks).
int64_t window_align(const KVSpec& spec);
// The storage (positions) of a sliding-window cache of window W that drops in multiples of `align` and takes appends
// of up to max_append positions: the W − 1 positions the next query sees, up to align − 1 more that share a block
// with them, and the append; rounded up to KVCache::kStep. W, align, max_append >= 1.
int64_t window_capacity(int64_t window, int64_t align, int64_t max_append);

// The interface attention and the model code use; the two implementations below.
class KVCache {
 public:
  static constexpr int64_t kStep = 256;  // storage grows in multiples of this many positions
  // Sliding-window caches: appends of up to this many positions fit in their bound (window_capacity).
  static constexpr int64_t kWindowSlack = 256;
  // Sliding-window caches drop positions in multiples of this (and of the group size for per-channel keys): the x86
  // attention kernels tile keys in 16s from storage row 0, so the kept keys keep their tiles and their sums.
  static constexpr int64_t kWindowAlign = 16;

  virtual ~KVCache() = default;

  // keys [B, H, n, Dk], values [B, H, n, Dv] (n may be 0). Returns (keys(), values()) after the append.
  virtual std::pair<kernels::KVTensorView, kernels::KVTensorView> update_and_fetch(const TensorView& keys,
                                                                                   const TensorView& values) = 0;
  // Views of the valid positions [0, offset) in the storage (stay valid until the next append, trim or restore).
  virtual kernels::KVTensorView keys() const = 0;
  virtual kernels::KVTensorView values() const = 0;

  virtual int64_t offset() const = 0;  // stored positions (the views' length)
  virtual int64_t capacity() const = 0;
  virtual int64_t trim(int64_t n) = 0;  // n >= 0; returns min(n, offset); cider::Error where !can_trim(n)
  // Sliding-window caches: the window (0: none) and the positions dropped before storage row 0 (0 without window).
  virtual int64_t window() const = 0;
  virtual int64_t start() const = 0;
  int64_t end() const { return start() + offset(); }  // positions appended (absolute), less those trimmed
  // Whether trim(n) keeps what the next query needs: always without dropped positions; else the W − 1 positions
  // before the new end must still be stored (n <= offset − (W − 1)).
  bool can_trim(int64_t n) const { return start() == 0 || n <= offset() - (window() - 1); }
  virtual bool empty() const = 0;
  virtual int64_t nbytes() const = 0;
  virtual KVCacheSnapshot snapshot() const = 0;
  virtual void restore(const KVCacheSnapshot& snapshot) = 0;
  // A new cache equal to this one trimmed back to absolute position `end` (see the contract above): end in
  // [start() + window() − 1 (or 0 without dropped positions), end()], else cider::Error (kOutOfRange).
  virtual std::unique_ptr<KVCache> copy_prefix(int64_t end) const = 0;
  virtual KVCacheMeta meta() const = 0;  // current configuration, dims and length

  // Shared prefixes (nn::KVSegment). split_front(n) moves the first n stored positions out of this cache into a
  // snapshot of a cache holding just them (its start 0, its length n; a per-channel cache's sink, when start() is
  // 0, with them): this cache then holds positions [start() + n, end()) (its storage cut to them: capacity
  // round_up(offset(), kStep)) and start() grows by n, so that attention
  // over the segment and this cache, merged (nn::attention's segments), reads what it read over this cache alone.
  // Only without a sliding window (window() == 0), 0 <= n <= offset(), n a multiple of split_align(). Positions
  // before start() are then held elsewhere: a cache with start() > 0 keeps no sink of its own.
  // empty_at(p): a cache of this one's format and dims holding no positions, starting at absolute position p
  // (start() == end() == p): p >= 0, a multiple of split_align(), window() == 0, and this cache has dims.
  virtual KVCacheSnapshot split_front(int64_t n) = 0;
  virtual std::unique_ptr<KVCache> empty_at(int64_t position) const = 0;
  // The positions split_front and empty_at cut at multiples of: the group size for per-channel keys, else 1.
  int64_t split_align() const;

  // The recent block read unquantized (KVSpec::recent_exact; n == 0 otherwise): storage positions [lo, lo + n) in
  // bfloat16 — keys [B, H, n, Dk] in the key space attention reads, values [B, H, n, Dv] in the rotated value space
  // as their codes read (the sink's as appended), and values_exact [B, H, n, Dv] as appended, meaningful from
  // position xlo (a multiple of vwin) on; lo is a multiple of block (the group size) and lo + n == offset(). After an
  // append of positions [p, offset) it starts at p's block and xlo = ⌊p/vwin⌋·vwin; after trim, restore or
  // copy_prefix it is the incomplete block. Attention reads, for a query at storage position t, the positions from
  // e(t) = max(⌊t/block⌋·block, lo) on from here — values from values_exact where j ≥ ⌊t/vwin⌋·vwin — and those
  // before min(sink, e(t)) from the sink (nn/attention.h).
  struct ExactStage {
    const uint16_t* keys = nullptr;
    const uint16_t* values = nullptr;
    const uint16_t* values_exact = nullptr;
    int64_t lo = 0, n = 0, block = 0, xlo = 0, vwin = 0;
    // The sink (positions [0, sink), sink = min(sink_rows, offset()), 0 once a sliding window dropped positions;
    // nn/kv_spec.h): keys [B, H, sink_rows, Dk] and values [B, H, sink_rows, Dv] in bfloat16, read unquantized by every
    // later query too.
    const uint16_t* sink_keys = nullptr;
    const uint16_t* sink_values = nullptr;
    int64_t sink = 0, sink_rows = 0;
  };
  virtual ExactStage exact_stage() const { return {}; }

  virtual bool is_quantized() const = 0;
  // Rotations of the stored keys (head_dim Dk) and values (Dv); identity placeholders before the first append.
  virtual const Rotation& key_rotation() const = 0;
  virtual const Rotation& value_rotation() const = 0;
};

// A shared, read-only run of a session's positions [begin, begin + length): positions [0, length) of `snapshot` (a
// cache's split_front, or a shorter cut of one: length <= snapshot.length(), a multiple of the group size for per-
// channel keys). Attention reads it in place (nn::attention's segments) for every session that holds a copy; copies
// share the data (KVCacheSnapshot), freed with the last one. The sink (per-channel keys read recent_exact) is the
// segment's at begin 0.
struct KVSegment {
  KVCacheSnapshot snapshot;
  int64_t begin = 0;
  int64_t length = 0;

  kernels::KVTensorView keys() const;    // length positions, storage of the snapshot's length
  kernels::KVTensorView values() const;
  // The sink's rows (begin 0 and recent_exact: KVCache::ExactStage's sink fields, block = lo = xlo = length, n = 0);
  // else block 0 (none).
  KVCache::ExactStage sink() const;
  const void* id() const;  // the shared data's identity: equal for copies of one split
  int64_t nbytes() const { return snapshot.nbytes(); }  // all of the snapshot's bytes (a cut keeps them alive)
  KVSegment cut(int64_t n) const;  // the first n positions (n <= length; the alignment rule above)
};

// One snapshot of a cache's whole state from its segments (contiguous from position 0) and the cache holding the
// rest (start() == the segments' end, window 0): the snapshot split_front never made (start 0, length end()). Each
// segment's rows, then the cache's; the fixed planes (residual window, its statistics, the values' window) the
// cache's, the sink the first segment's. What restore() of it then holds reads, under attention, as the segments and
// the cache did.
KVCacheSnapshot join_snapshot(const std::vector<KVSegment>& segments, const KVCache& rest);
// The rules segments and the cache that continues them follow (cider::Error naming `op`): the cache has dims and no
// sliding window; the segments are contiguous from position 0 to the cache's start(), each non-empty and within its
// snapshot, of the cache's format (KVSpec, seed) and dims.
void check_segments(const std::vector<KVSegment>& segments, const KVCache& rest, const char* op);

namespace detail {

// One plane of a store: rows of row_bytes bytes; one row per `per` positions (1: per position, gs: per block of
// positions, the last row covering an incomplete block), or per == 0: `fixed` rows whatever the capacity (none
// while the capacity or the length is 0).
struct PlaneShape {
  int64_t row_bytes = 0;
  int64_t per = 1;
  int64_t fixed = 0;
  int64_t rows(int64_t positions) const {
    if (per == 0) return positions > 0 ? fixed : 0;
    return (positions + per - 1) / per;
  }
};

// Bytes of planes of these shapes for B·H heads at `capacity` positions (KVStore::nbytes, kv_cache_bytes).
int64_t planes_bytes(const std::vector<PlaneShape>& shapes, int64_t B, int64_t H, int64_t capacity);

// The storage shared by both caches: a fixed list of planes, plane p holding [B, H, rows(capacity), row_bytes]
// bytes, plus the growth / trim / snapshot mechanics, which do not depend on what a row contains.
class KVStore {
 public:
  void reset(int64_t B, int64_t H, std::vector<PlaneShape> shapes);  // dims fixed, capacity 0
  void clear();                                                      // back to no dims
  bool has_dims() const { return !shapes_.empty(); }
  int64_t B() const { return B_; }
  int64_t H() const { return H_; }
  int64_t offset() const { return offset_; }
  int64_t capacity() const { return capacity_; }
  void set_offset(int64_t offset) { offset_ = offset; }
  // Makes room for positions [offset, offset + n): reallocates to round_up(offset + n, kStep) if needed.
  void reserve_append(int64_t n);
  // Start of row t of (b, h) in plane p (a position for per-position planes, a block or fixed row otherwise).
  uint8_t* row(size_t p, int64_t b, int64_t h, int64_t t) const;
  // Grows every plane to `capacity` positions (a multiple of kStep) if it is smaller, copying the valid rows.
  void reserve(int64_t capacity);
  // Drops positions [0, d): rows [d, offset) of each (b, h) move to [0, offset − d) (block planes by d / per rows,
  // d a multiple of every block plane's per; fixed planes stay); offset −= d.
  void drop_front(int64_t d);
  int64_t rows_per_head(size_t p) const { return shapes_[p].rows(capacity_); }
  std::vector<const void*> plane_pointers() const;  // one per plane; empty without dims
  int64_t nbytes() const;
  // Copies the rows(length) rows of every plane (length <= offset; −1: offset) into contiguous [B, H, rows(length),
  // row] buffers.
  std::vector<Buffer> copy_valid(int64_t length = -1) const;
  // A store holding rows [from, offset) of every per-position or per-block plane (from a multiple of every block
  // plane's per) and the fixed planes whole, capacity round_up(offset − from, kStep), offset offset − from.
  KVStore copy_suffix(int64_t from) const;
  // A store of the same dims and planes holding copies of the rows(length) rows of each plane (length <= offset),
  // capacity round_up(length, kStep), offset length.
  KVStore copy_prefix(int64_t length) const;
  // Replaces the storage by copies of the given contiguous [B, H, rows(length), row] planes (one pointer per
  // plane); capacity becomes round_up(length, kStep).
  void load(const std::vector<const void*>& planes, int64_t length);

 private:
  int64_t B_ = 0, H_ = 0, offset_ = 0, capacity_ = 0;
  std::vector<PlaneShape> shapes_;
  std::vector<Buffer> planes_;
};

}  // namespace detail

// Defaults: K8/V4, group 64, Hadamard rotation, keys per token (a standalone cache's; a model's cache comes from
// model::default_kv, docs/quality.md).
struct QuantizedKVCacheConfig {
  int k_bits = 8;                                   // 2, 3, 4, 5, 6 or 8
  int v_bits = 4;                                   // 2, 3, 4, 5, 6 or 8
  int group_size = 64;                              // 32, 64 or 128; must divide Dk and Dv
  RotationKind rotation = RotationKind::kHadamard;  // applied to keys and values before quantizing
  uint64_t seed = 0;                               // rotation seed (keys and values use the same seed)
  DType scale_dtype = DType::kF16;                 // stored scales and biases: float16, bfloat16 or float32
  KeyLayout key_layout = KeyLayout::kToken;        // keys per position (the seeds') or per channel (nn/kv_spec.h)
  int key_outliers = 0;                            // per-channel keys: outlier channels per block (nn/kv_spec.h)
  bool v_symmetric = false;                        // symmetric value codes, no value biases (nn/kv_spec.h)
  bool recent_exact = false;                       // per-channel keys: the recent block read unquantized (kv_spec.h)
  int64_t window = 0;                              // > 0: a sliding-window cache (see the contract above)

  KVSpec spec() const;  // the format (nn/kv_spec.h), whose rules it follows
};

// Keys and values rotated, then affine-quantized per row in groups (MLX's format, docs/formats.md):
//   key codes   [B, H, capacity, Dk·k_bits/32] uint32, key scales/biases   [B, H, capacity, Dk/gs] scale_dtype
//   value codes [B, H, capacity, Dv·v_bits/32] uint32, value scales/biases [B, H, capacity, Dv/gs] scale_dtype
// Per-channel keys (KeyLayout::kChannel): keys are not rotated; each append writes them as bfloat16 rows into the
// residual window [B, H, gs, Dk]; when the window holds gs positions it is quantized per channel
// (quant::affine_quantize_columns) into the codes of those positions and one scale/bias row [Dk] of the block.
// trim() back into a quantized block dequantizes its kept positions into the residual window (bfloat16), so they
// are quantized again, with the block's new rows, when it fills: at most one extra rounding on those positions.
class QuantizedKVCache final : public KVCache {
 public:
  explicit QuantizedKVCache(const QuantizedKVCacheConfig& config = {});  // validates the config

  std::pair<kernels::KVTensorView, kernels::KVTensorView> update_and_fetch(const TensorView& keys,
                                                                           const TensorView& values) override;
  kernels::KVTensorView keys() const override;
  kernels::KVTensorView values() const override;
  int64_t offset() const override { return store_.offset(); }
  int64_t capacity() const override { return store_.capacity(); }
  int64_t trim(int64_t n) override;
  int64_t window() const override { return config_.window; }
  int64_t start() const override { return start_; }
  bool empty() const override { return !store_.has_dims(); }
  int64_t nbytes() const override { return store_.nbytes(); }
  KVCacheSnapshot snapshot() const override;
  void restore(const KVCacheSnapshot& snapshot) override;
  std::unique_ptr<KVCache> copy_prefix(int64_t end) const override;
  KVCacheMeta meta() const override;
  KVCacheSnapshot split_front(int64_t n) override;
  std::unique_ptr<KVCache> empty_at(int64_t position) const override;
  bool is_quantized() const override { return true; }
  const Rotation& key_rotation() const override { return key_rot_; }
  const Rotation& value_rotation() const override { return value_rot_; }

  const QuantizedKVCacheConfig& config() const { return config_; }

  // Outlier key channels (config key_outliers > 0; otherwise a no-op): shows the cache the queries q [B, Hq, n, Dk]
  // (the model's, after RoPE, in the keys' space) of the n positions the next update_and_fetch appends; a block
  // chooses its outlier channels by the queries of its own positions (Σ q² per channel over the KV head's group of
  // query heads). Several calls before one append concatenate their positions. The append checks that B, Dk, the
  // head grouping and the number of positions match; an append without them records no queries for its positions.
  // A block's choice thus depends only on its own keys and queries: not on how the positions were split into
  // appends, nor on positions trimmed away (their statistics go with them; the residual window's are in the cache's
  // state and its snapshots).
  void observe_queries(const TensorView& q);

  ExactStage exact_stage() const override;

 private:
  int64_t trim_channel(int64_t n);
  void build_stage(int64_t end, const TensorView* keys, const TensorView* values);
  void stage_from_residual();
  void resize_stage(size_t rows);
  void dequantize_values(int64_t b, int64_t h, int64_t pos, int64_t count, uint16_t* out) const;
  // The positions [0, n) the sink holds: sink_rows(group size) with recent_exact while no sliding window dropped
  // positions, else 0.
  int64_t sink_held() const;
  void append_channel_keys(const TensorView& keys, int64_t start, const std::vector<float>& qstats);
  void quantize_block(int64_t b, int64_t h, int64_t block);
  void refine_outliers(int64_t b, int64_t h, int64_t block, const std::vector<float>& rows);

  QuantizedKVCacheConfig config_;
  int64_t Dk_ = 0, Dv_ = 0;
  Rotation key_rot_, value_rot_;
  detail::KVStore store_;  // planes as in KVCacheSnapshot (quantized)
  int64_t start_ = 0;      // positions dropped (sliding-window caches)
  // observe_queries until the next append: per (b, query head) and position, Σ q² per channel and the count (0 or 1),
  // [B·Hq][rows·(Dk + 1)].
  std::vector<std::vector<float>> pending_q_;
  int64_t pending_B_ = 0, pending_Hq_ = 0, pending_D_ = 0, pending_rows_ = 0;
  // recent_exact: the stage (exact_stage), [B·H][stage_n_][Dk] and [B·H][stage_n_][Dv] bfloat16.
  std::vector<uint16_t> stage_k_, stage_v_;
  std::vector<uint16_t> stage_x_;  // the stage's values as appended, [B·H][stage_n_][Dv], from stage_xlo_ on
  std::vector<uint16_t> stage_v_prev_;  // the previous stage's coded values while build_stage takes them again
  int64_t stage_lo_ = 0, stage_n_ = 0, stage_start_ = 0, stage_xlo_ = 0;  // stage_start_: start_ when built
};

struct PlainKVCacheConfig {
  DType dtype = DType::kF16;                    // storage dtype: float16, bfloat16 or float32
  RotationKind rotation = RotationKind::kNone;  // optional (for comparing rotation without quantization)
  uint64_t seed = 0;
  int64_t window = 0;                           // > 0: a sliding-window cache (see the contract above)

  KVSpec spec() const;  // the format (nn/kv_spec.h), whose rules it follows
};

// The unquantized baseline: keys [B, H, capacity, Dk] and values [B, H, capacity, Dv] in the storage dtype.
class PlainKVCache final : public KVCache {
 public:
  explicit PlainKVCache(const PlainKVCacheConfig& config = {});

  std::pair<kernels::KVTensorView, kernels::KVTensorView> update_and_fetch(const TensorView& keys,
                                                                           const TensorView& values) override;
  kernels::KVTensorView keys() const override;
  kernels::KVTensorView values() const override;
  int64_t offset() const override { return store_.offset(); }
  int64_t capacity() const override { return store_.capacity(); }
  int64_t trim(int64_t n) override;
  int64_t window() const override { return config_.window; }
  int64_t start() const override { return start_; }
  bool empty() const override { return !store_.has_dims(); }
  int64_t nbytes() const override { return store_.nbytes(); }
  KVCacheSnapshot snapshot() const override;
  void restore(const KVCacheSnapshot& snapshot) override;
  std::unique_ptr<KVCache> copy_prefix(int64_t end) const override;
  KVCacheMeta meta() const override;
  KVCacheSnapshot split_front(int64_t n) override;
  std::unique_ptr<KVCache> empty_at(int64_t position) const override;
  bool is_quantized() const override { return false; }
  const Rotation& key_rotation() const override { return key_rot_; }
  const Rotation& value_rotation() const override { return value_rot_; }

  const PlainKVCacheConfig& config() const { return config_; }

 private:
  PlainKVCacheConfig config_;
  int64_t Dk_ = 0, Dv_ = 0;
  Rotation key_rot_, value_rot_;
  detail::KVStore store_;  // planes as in KVCacheSnapshot (plain)
  int64_t start_ = 0;      // positions dropped (sliding-window caches)
};

}  // namespace cider::nn
