#include "quant/int4.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cider::quant {

namespace {

constexpr const char* kOp = "quantize_int4_weights";

// A zero scale (all-zero values, or max/7 underflowing to 0) would divide 0 by 0; 1 gives codes 0 instead.
float int4_scale(float amax) {
  float s = amax / static_cast<float>(kInt4QMax);
  return s == 0.0f ? 1.0f : s;
}

int8_t int4_quantize_value(float v, float scale) {
  float r = std::clamp(std::rint(v / scale), static_cast<float>(kInt4QMin), static_cast<float>(kInt4QMax));
  return static_cast<int8_t>(r);
}

}  // namespace

bool is_int4_group_size(int group_size) {
  return group_size == 0 || group_size == 32 || group_size == 64 || group_size == 128 || group_size == 256;
}

void pack_int4(const int8_t* codes, int64_t n, uint8_t* packed_row) {
  for (int64_t i = 0; i < n / 2; ++i) {
    const unsigned lo = static_cast<unsigned>(codes[2 * i] + kInt4ZeroPoint);
    const unsigned hi = static_cast<unsigned>(codes[2 * i + 1] + kInt4ZeroPoint);
    CIDER_DEBUG_ASSERT(lo < 16 && hi < 16);
    packed_row[i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

Int4Weights quantize_int4_weights(const TensorView& w, int group_size) {
  check_cpu(w, kOp, "w");
  check_float_dtype(w, kOp, "w");
  check_rank(w, 2, kOp, "w");
  check_contiguous(w, kOp, "w");
  check_not_null(w, kOp, "w");
  const int64_t N = w.dim(0), K = w.dim(1);
  check(N >= 1 && K >= 1, ErrorCode::kShapeMismatch, kOp, "w must have at least one row and one column; got ",
        w.shape_string());
  check(is_int4_group_size(group_size), ErrorCode::kInvalidArgument, kOp,
        "group_size must be 0 (per channel), 32, 64, 128 or 256; got ", group_size);
  check(K % 2 == 0, ErrorCode::kShapeMismatch, kOp,
        "K (the last dimension of w) must be even to pack two codes per byte; got w shape ", w.shape_string());
  check(group_size == 0 || K % group_size == 0, ErrorCode::kShapeMismatch, kOp,
        "K (the last dimension of w) must be a multiple of group_size ", group_size, "; got w shape ",
        w.shape_string());

  Int4Weights out;
  out.group_size = group_size;
  out.packed = Tensor(DType::kU8, {N, K / 2});
  out.scales = group_size == 0 ? Tensor(DType::kF32, {N}) : Tensor(DType::kF32, {K / group_size, N});
  float* scales = out.scales.ptr<float>();
  const int64_t span = group_size == 0 ? K : group_size;  // values sharing one scale

  std::vector<float> row(static_cast<size_t>(K));
  std::vector<int8_t> codes(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      float v = load_float(w.data, w.dtype, n * K + k);
      check(std::isfinite(v), ErrorCode::kInvalidArgument, kOp, "w must be finite; got ", v, " at [", n, ", ", k,
            "]");
      row[static_cast<size_t>(k)] = v;
    }
    for (int64_t g = 0; g < K / span; ++g) {
      const int64_t k0 = g * span;
      float amax = 0.0f;
      for (int64_t k = k0; k < k0 + span; ++k) amax = std::max(amax, std::fabs(row[static_cast<size_t>(k)]));
      const float s = int4_scale(amax);
      scales[group_size == 0 ? n : g * N + n] = s;
      for (int64_t k = k0; k < k0 + span; ++k)
        codes[static_cast<size_t>(k)] = int4_quantize_value(row[static_cast<size_t>(k)], s);
    }
    pack_int4(codes.data(), K, out.packed.ptr<uint8_t>() + n * (K / 2));
  }
  return out;
}

}  // namespace cider::quant
