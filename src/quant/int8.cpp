#include "quant/int8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace cider::quant {

namespace {

constexpr const char* kWeightsOp = "quantize_int8_weights";
constexpr const char* kActivationsOp = "quantize_int8_activations";
constexpr float kQMax = static_cast<float>(kInt8QMax);

// A zero scale (all-zero values, or max/127 underflowing to 0) would divide 0 by 0; 1 gives codes 0 instead.
float scale_from_amax(float amax) {
  float s = amax / kQMax;
  return s == 0.0f ? 1.0f : s;
}

int8_t int8_code(float v, float scale) {
  float r = std::clamp(std::rint(v / scale), -kQMax, kQMax);
  return static_cast<int8_t>(r);
}

}  // namespace

bool is_int8_group_size(int group_size) {
  return group_size == 0 || group_size == 64 || group_size == 128 || group_size == 256;
}

float abs_percentile(float* abs_values, int64_t n, double percentile) {
  CIDER_DEBUG_ASSERT(n >= 1);
  double h = percentile / 100.0 * static_cast<double>(n - 1);
  int64_t i = std::min(static_cast<int64_t>(std::floor(h)), n - 1);
  double frac = h - static_cast<double>(i);
  std::nth_element(abs_values, abs_values + i, abs_values + n);
  double lo = abs_values[i];
  if (i + 1 >= n || frac <= 0.0) return static_cast<float>(lo);
  // After nth_element everything past i is >= a_i, so a_{i+1} is the smallest of them.
  double hi = *std::min_element(abs_values + i + 1, abs_values + n);
  return static_cast<float>(lo + frac * (hi - lo));
}

Int8Weights quantize_int8_weights(const TensorView& w, int group_size, std::optional<float> clip_percentile) {
  check_cpu(w, kWeightsOp, "w");
  check_float_dtype(w, kWeightsOp, "w");
  check_rank(w, 2, kWeightsOp, "w");
  check_contiguous(w, kWeightsOp, "w");
  check_not_null(w, kWeightsOp, "w");
  const int64_t N = w.dim(0), K = w.dim(1);
  check(N >= 1 && K >= 1, ErrorCode::kShapeMismatch, kWeightsOp, "w must have at least one row and one column; got ",
        w.shape_string());
  check(is_int8_group_size(group_size), ErrorCode::kInvalidArgument, kWeightsOp,
        "group_size must be 0 (per channel), 64, 128 or 256; got ", group_size);
  check(group_size == 0 || K % group_size == 0, ErrorCode::kShapeMismatch, kWeightsOp,
        "K (the last dimension of w) must be a multiple of group_size ", group_size, "; got w shape ",
        w.shape_string());
  if (clip_percentile) {
    const float p = *clip_percentile;
    check(group_size == 0, ErrorCode::kInvalidArgument, kWeightsOp,
          "clip_percentile is supported only per channel (group_size 0); got group_size ", group_size);
    check(p > 0.0f && p <= 100.0f, ErrorCode::kInvalidArgument, kWeightsOp,
          "clip_percentile must be in (0, 100]; got ", p);
  }

  Int8Weights out;
  out.group_size = group_size;
  out.q = Tensor(DType::kI8, {N, K});
  out.scales = group_size == 0 ? Tensor(DType::kF32, {N}) : Tensor(DType::kF32, {K / group_size, N});
  int8_t* q = out.q.ptr<int8_t>();
  float* scales = out.scales.ptr<float>();

  std::vector<float> row(static_cast<size_t>(K));
  std::vector<float> abs_row;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      float v = load_float(w.data, w.dtype, n * K + k);
      check(std::isfinite(v), ErrorCode::kInvalidArgument, kWeightsOp, "w must be finite; got ", v, " at [", n,
            ", ", k, "]");
      row[static_cast<size_t>(k)] = v;
    }
    int8_t* qrow = q + n * K;
    if (group_size == 0) {
      float limit;  // values are clamped to [-limit, limit]; without clipping that is the row's max |w|
      if (clip_percentile) {
        abs_row.resize(row.size());
        for (size_t k = 0; k < row.size(); ++k) abs_row[k] = std::fabs(row[k]);
        limit = abs_percentile(abs_row.data(), K, static_cast<double>(*clip_percentile));
      } else {
        limit = 0.0f;
        for (float v : row) limit = std::max(limit, std::fabs(v));
      }
      const float s = scale_from_amax(limit);
      scales[n] = s;
      for (int64_t k = 0; k < K; ++k) qrow[k] = int8_code(std::clamp(row[static_cast<size_t>(k)], -limit, limit), s);
    } else {
      for (int64_t g = 0; g < K / group_size; ++g) {
        const float* grp = row.data() + g * group_size;
        float amax = 0.0f;
        for (int j = 0; j < group_size; ++j) amax = std::max(amax, std::fabs(grp[j]));
        const float s = scale_from_amax(amax);
        scales[g * N + n] = s;
        for (int j = 0; j < group_size; ++j) qrow[g * group_size + j] = int8_code(grp[j], s);
      }
    }
  }
  return out;
}

float quantize_int8_row(const void* x, DType x_dtype, int64_t K, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t k = 0; k < K; ++k) {
    float v = load_float(x, x_dtype, k);
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  if (!finite) {
    std::fill(q, q + K, int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float sx = scale_from_amax(amax);
  for (int64_t k = 0; k < K; ++k) q[k] = int8_code(load_float(x, x_dtype, k), sx);
  return sx;
}

Int8Activations quantize_int8_activations(const TensorView& x) {
  check_cpu(x, kActivationsOp, "x");
  check_float_dtype(x, kActivationsOp, "x");
  check_rank_at_least(x, 1, kActivationsOp, "x");
  check_contiguous(x, kActivationsOp, "x");
  check_not_null(x, kActivationsOp, "x");
  const int64_t M = x.rows(), K = x.dim(-1);
  Int8Activations out;
  out.q = Tensor(DType::kI8, {M, K});
  out.scales = Tensor(DType::kF32, {M});
  const size_t row_bytes = static_cast<size_t>(K) * static_cast<size_t>(dtype_size(x.dtype));
  for (int64_t m = 0; m < M; ++m) {
    const void* xrow = static_cast<const uint8_t*>(x.data) + static_cast<size_t>(m) * row_bytes;
    out.scales.ptr<float>()[m] = quantize_int8_row(xrow, x.dtype, K, out.q.ptr<int8_t>() + m * K);
  }
  return out;
}

}  // namespace cider::quant
