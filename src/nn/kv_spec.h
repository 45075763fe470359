// cider/nn/kv_spec.h — the format of a KV cache: one description used by every layer that builds or reads a cache
// (the model's options, nn's caches and their snapshots, the C API, the GPU caches), with its rules here only.
//
// Quantized (the seeds' IsoQuant cache): keys and values rotated, then affine-quantized per row in groups of
// group_size with k_bits / v_bits (independent widths), codes packed dim·bits/32 uint32 per row, scales and biases in
// scale_dtype. Plain: elements in plain_dtype, optionally rotated (for comparing rotation without quantization).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "nn/rotation.h"

namespace cider::nn {

// How keys are grouped for quantization (values are always per token, in groups of group_size along the head):
//   kToken:   per position, groups of group_size values along the head dim (the seeds' layout).
//   kChannel: per channel, over blocks of group_size consecutive positions (KIVI-style): each channel of a block
//             gets its own scale and bias, so a few large channels (outliers) no longer set the step of the others.
//             The newest, incomplete block is kept unquantized in bfloat16 (the residual window) and quantized when
//             it fills. Keys are not rotated in this layout: per-channel steps already isolate the outlier channels
//             that a rotation would spread over all of them (docs/quality.md measures both). Values are rotated.
enum class KeyLayout : int { kToken = 0, kChannel = 1 };

// Outlier key channels (per-channel keys only, key_outliers = n > 0): when a block of positions is quantized, the n
// channels of each KV head with the largest range × query RMS (the RMS of that channel in the queries of the block's
// own positions, QuantizedKVCache::observe_queries; the range alone without them) get 4 more bits: a refinement code r in 0..15 per
// position, k = s·c + b + (|s|/15)·(r − 7.5), i.e. an 8-bit grid over the channel's range (docs/quality.md: the keys'
// error concentrates in the channels the queries weigh). Stored per block: the n channel indices (uint16) and the
// codes, [n][group_size/2] bytes (two positions per byte, the even one in the low nibble).
constexpr int kMaxKeyOutliers = 32;
// The count when none is chosen (`--kv-outliers auto`, the CPU's default cache): Dk/32 channels (0.07 bits per value
// at 4 + 16/64 bits each), at least 1 and at most kMaxKeyOutliers — Gemma 3's 256-wide heads 8, 64-wide heads 2.
int auto_key_outliers(int64_t Dk);

// The sink (recent_exact only): the first kSinkPositions positions of a sequence (at most a block) are also kept in
// bfloat16 and every query reads them from there, while no sliding window dropped them; the rest of the first block is
// quantized over its own range, the sink's keys (the first position's often far outside the others') left out of it.
constexpr int64_t kSinkPositions = 16;
int64_t sink_rows(int64_t group_size);  // min(kSinkPositions, group_size)
// The values' window (recent_exact only): a query at position t reads the values of its own run of
// kValueWindowPositions positions, [⌊t/V⌋·V, t], as appended (bfloat16, rotated), the rest of its block from their
// codes — the keys of its whole block unquantized. V divides the block and is at least the sink.
constexpr int64_t kValueWindowPositions = 32;
int64_t value_window_rows(int64_t group_size);  // min(kValueWindowPositions, group_size)

struct KVSpec {
  bool quantized = true;
  int k_bits = 8;                                   // quantized: 2, 3, 4, 5, 6 or 8
  int v_bits = 4;                                   // quantized: 2, 3, 4, 5, 6 or 8
  int group_size = 64;                              // quantized: 32, 64 or 128; divides both head dims
  RotationKind rotation = RotationKind::kHadamard;  // none, so4 fast/full (head dims a multiple of 4), hadamard
  DType scale_dtype = DType::kF16;                  // quantized: scales and biases (float16, bfloat16, float32)
  DType plain_dtype = DType::kBF16;                 // plain: elements (float16, bfloat16, float32)
  KeyLayout key_layout = KeyLayout::kToken;         // quantized only (plain caches: kToken)
  int key_outliers = 0;                             // per-channel keys: outlier channels per block (see above)
  // Symmetric values (quantized only): each value group stores one step d (scale_dtype) and no bias, codes
  // c = clamp(rint(v/d) + 2^(v_bits−1)) with d = −edge/2^(v_bits−1) for the group's value of largest magnitude
  // (quant::symmetric_quantize_group, llama.cpp's q4_0 kind): half the side bits of affine values (16/group_size
  // per value instead of 32 with float16), at a small cost in fidelity (docs/quality.md).
  bool v_symmetric = false;
  // The recent block read unquantized (per-channel keys only): attention reads, for a query at position t, the keys
  // of every stored position from the start of t's own block of group_size positions (never before the first position
  // of the latest append's block) unquantized from the keys' residual window, and the values of t's own run of
  // value_window_rows positions in bfloat16 (the rest of the block's from their codes); the sink's keys and values
  // (above) too; every other position quantized. What a query reads thus depends on its position only, not on how the
  // positions were split into appends: a prompt prefilled at once, in chunks or one token at a time reads the same
  // (docs/kv_cache.md). The quantized codes are the same as without it (but the first block's keys, whose ranges
  // leave the sink out); it adds, per KV head, the values' window and the sink, bfloat16, not per position.
  bool recent_exact = false;

  // The rules of the fields alone; cider::Error (kInvalidArgument) naming `op`, the rule and the value.
  void validate(const char* op) const;
  // The rules against the head dims (kShapeMismatch): positive; quantized: multiples of group_size; SO(4): of 4.
  void validate_head_dims(int64_t Dk, int64_t Dv, const char* op) const;
  // "k4v3/so4-full/g64", "k4v4/hadamard/g64/kchan" (per-channel keys), "…/o8" (outlier channels), "…/vsym"
  // (symmetric values), "…/rx" (the recent block read unquantized), "bf16" (plain, unrotated), "f32/hadamard".
  std::string name() const;
  // The rotation applied to keys (and so to queries): `rotation`, except none for per-channel keys.
  RotationKind key_rotation() const {
    return key_layout == KeyLayout::kChannel ? RotationKind::kNone : rotation;
  }
  // Stored bits per cached value, keys and values averaged, scales and biases counted (the residual window not):
  // token layout (k + v)/2 + 8·ss/group_size (4·ss/group_size less with symmetric values: no value bias); per-channel
  // keys take their scale and bias per block of positions;
  // outlier channels add key_outliers·(4 + 16/group_size)/Dk per key value (Dk: the key head dim, needed then).
  double bits_per_value(int64_t Dk = 0) const;
};

bool is_kv_bits(int bits);              // 2, 3, 4, 5, 6, 8
bool is_kv_group_size(int group_size);  // 32, 64, 128
// "bf16", "f16", "f32" (plain, no rotation) or "k<bits>v<bits>" (quantized, the other fields at their defaults).
KVSpec parse_kv_spec(std::string_view format);
// "so4-full", "so4-fast", "hadamard", "none"; the names rotation_name gives back.
RotationKind parse_rotation(std::string_view name);
const char* rotation_name(RotationKind kind);
// "affine", "symmetric" (KVSpec::v_symmetric); the names value_codes_name gives back.
bool parse_value_codes(std::string_view name);
const char* value_codes_name(bool symmetric);
// "quantized", "exact" (KVSpec::recent_exact); the names recent_name gives back.
bool parse_recent(std::string_view name);
const char* recent_name(bool exact);
// "token", "channel"; the names key_layout_name gives back.
KeyLayout parse_key_layout(std::string_view name);
const char* key_layout_name(KeyLayout layout);

}  // namespace cider::nn
