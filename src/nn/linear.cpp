#include "nn/linear.h"

#include <cmath>
#include <vector>

#include "kernels/kernel_table.h"
#include "quant/affine.h"

namespace cider::nn {

namespace {

// The float weight matrix every constructor quantizes: w [N, K], CPU, contiguous, float dtype, finite.
void check_float_weight(const char* op, const TensorView& w) {
  check_cpu(w, op, "w");
  check_float_dtype(w, op, "w");
  check_rank(w, 2, op, "w");
  check_contiguous(w, op, "w");
  check_not_null(w, op, "w");
  check(w.dim(0) >= 1 && w.dim(1) >= 1, ErrorCode::kShapeMismatch, op,
        "w must have at least one row and one column; got shape ", w.shape_string());
  const int64_t K = w.dim(1);
  for (int64_t i = 0; i < w.numel(); ++i) {
    const float v = load_float(w.data, w.dtype, i);
    check(std::isfinite(v), ErrorCode::kInvalidArgument, op, "w must be finite; got ", v, " at [", i / K, ", ",
          i % K, "]");
  }
}

// bias: nullptr or [N] of any float dtype → an owned float32 copy.
std::optional<Tensor> make_bias(const char* op, const TensorView* bias, int64_t N) {
  if (!bias) return std::nullopt;
  check_cpu(*bias, op, "bias");
  check_float_dtype(*bias, op, "bias");
  check(bias->rank == 1 && bias->dim(0) == N, ErrorCode::kShapeMismatch, op, "bias must have shape (", N,
        ") (out_features); got ", bias->shape_string());
  check_contiguous(*bias, op, "bias");
  check_not_null(*bias, op, "bias");
  Tensor b(DType::kF32, {N});
  for (int64_t n = 0; n < N; ++n) b.ptr<float>()[n] = load_float(bias->data, bias->dtype, n);
  return b;
}

void check_clip_percentile(const char* op, std::optional<float> clip_percentile) {
  if (!clip_percentile) return;
  const float p = *clip_percentile;
  check(p > 0.0f && p <= 100.0f, ErrorCode::kInvalidArgument, op, "clip_percentile must be in (0, 100]; got ", p);
}

// MLX affine layer (packed uint32 [N, K·bits/32], scales/biases [N, K/gs]) → dequantized float32 [N, K].
Tensor dequantize_mlx(const char* op, const TensorView& packed, const TensorView& scales, const TensorView& biases,
                      int group_size, int bits) {
  check(quant::is_affine_bits(bits), ErrorCode::kInvalidArgument, op,
        "mlx_bits must be 2, 3, 4, 5, 6 or 8; got ", bits);
  check(quant::is_affine_group_size(group_size), ErrorCode::kInvalidArgument, op,
        "mlx_group_size must be 32, 64 or 128; got ", group_size);
  for (auto [t, name] : {std::pair{&packed, "packed"}, std::pair{&scales, "scales"}, std::pair{&biases, "biases"}}) {
    check_cpu(*t, op, name);
    check_rank(*t, 2, op, name);
    check_contiguous(*t, op, name);
    check_not_null(*t, op, name);
  }
  check_dtype(packed, DType::kU32, op, "packed");
  check_float_dtype(scales, op, "scales");
  check(biases.dtype == scales.dtype, ErrorCode::kInvalidArgument, op, "biases must have the dtype of scales (",
        dtype_name(scales.dtype), "); got ", dtype_name(biases.dtype));
  check(biases.shape_vector() == scales.shape_vector(), ErrorCode::kShapeMismatch, op,
        "biases must have the shape of scales ", scales.shape_string(), "; got ", biases.shape_string());
  const int64_t N = scales.dim(0), K = scales.dim(1) * group_size;
  check(N >= 1 && K >= 1, ErrorCode::kShapeMismatch, op, "scales must have at least one row and one column; got ",
        scales.shape_string());
  check(packed.dim(0) == N && packed.dim(1) == quant::packed_words(K, bits), ErrorCode::kShapeMismatch, op,
        "packed must have shape (", N, ", ", quant::packed_words(K, bits), ") for scales ", scales.shape_string(),
        ", group size ", group_size, " and ", bits, " bits; got ", packed.shape_string());
  return quant::affine_dequantize(packed, scales, biases, group_size, bits, DType::kF32);
}

// Validates a forward call and fills the kernel arguments (everything but w, w_scales, bias).
kernels::IntLinearArgs forward_args(const char* op, const TensorView& x, const TensorView& out, int64_t K,
                                    int64_t N, int group_size) {
  for (auto [t, name] : {std::pair{&x, "x"}, std::pair{&out, "out"}}) {
    check_cpu(*t, op, name);
    check_float_dtype(*t, op, name);
    check_rank_at_least(*t, 1, op, name);
    check_contiguous(*t, op, name);
    check_not_null(*t, op, name);
  }
  check(x.dim(-1) == K, ErrorCode::kShapeMismatch, op, "x must have last dimension ", K, " (in_features); got shape ",
        x.shape_string());
  std::vector<int64_t> want = x.shape_vector();
  want.back() = N;
  check(out.shape_vector() == want, ErrorCode::kShapeMismatch, op, "out must have shape ", shape_string(want),
        " (x's leading dimensions, out_features ", N, "); got ", out.shape_string());
  // The kernel writes out while it still reads x, so the two must not share bytes.
  const auto* xb = static_cast<const uint8_t*>(x.data);
  const auto* ob = static_cast<const uint8_t*>(out.data);
  const int64_t x_bytes = x.numel() * dtype_size(x.dtype), out_bytes = out.numel() * dtype_size(out.dtype);
  check(x_bytes == 0 || out_bytes == 0 || xb + x_bytes <= ob || ob + out_bytes <= xb, ErrorCode::kInvalidArgument,
        op, "out must not overlap x; got out at ", out.data, " (", out_bytes, " bytes) and x at ", x.data, " (",
        x_bytes, " bytes)");
  kernels::IntLinearArgs a{};
  a.x = x.data;
  a.x_dtype = x.dtype;
  a.out = out.data;
  a.out_dtype = out.dtype;
  a.M = x.rows();
  a.N = N;
  a.K = K;
  a.group_size = group_size;
  return a;
}

}  // namespace

// ---- Int8Linear ----------------------------------------------------------------------------------------------

Int8Linear Int8Linear::build(const char* op, const TensorView& w, const TensorView* bias, int group_size,
                             std::optional<float> clip_percentile) {
  check(quant::is_int8_group_size(group_size), ErrorCode::kInvalidArgument, op,
        "group_size must be 0 (per channel), 64, 128 or 256; got ", group_size);
  check(!clip_percentile || group_size == 0, ErrorCode::kInvalidArgument, op,
        "clip_percentile is supported only per channel (group_size 0); got group_size ", group_size);
  check_clip_percentile(op, clip_percentile);
  check_float_weight(op, w);
  const int64_t N = w.dim(0), K = w.dim(1);
  check(group_size == 0 || K % group_size == 0, ErrorCode::kShapeMismatch, op,
        "in_features K must be a multiple of group_size ", group_size, "; got w shape ", w.shape_string());
  check(group_size != 0 || K <= quant::kInt8MaxAccumK, ErrorCode::kOutOfRange, op,
        "per-channel in_features K must be at most ", quant::kInt8MaxAccumK,
        " (int32 accumulation); got w shape ", w.shape_string());
  std::optional<Tensor> b = make_bias(op, bias, N);
  return Int8Linear(quant::quantize_int8_weights(w, group_size, clip_percentile), std::move(b));
}

Int8Linear Int8Linear::from_float(const TensorView& w, const TensorView* bias, int group_size,
                                  std::optional<float> clip_percentile) {
  return build("int8_linear.from_float", w, bias, group_size, clip_percentile);
}

Int8Linear Int8Linear::from_mlx_affine(const TensorView& packed, const TensorView& scales, const TensorView& biases,
                                       int mlx_group_size, int mlx_bits, const TensorView* bias,
                                       std::optional<int> target_group_size, std::optional<float> clip_percentile) {
  constexpr const char* op = "int8_linear.from_mlx_affine";
  Tensor w = dequantize_mlx(op, packed, scales, biases, mlx_group_size, mlx_bits);
  int group_size = 0;
  if (target_group_size) {
    group_size = *target_group_size;
  } else if (mlx_bits == 8 && (mlx_group_size == 64 || mlx_group_size == 128 || mlx_group_size == 256)) {
    group_size = mlx_group_size;
  }
  return build(op, w.view(), bias, group_size, clip_percentile);
}

void Int8Linear::forward(const TensorView& x, const TensorView& out) const {
  kernels::IntLinearArgs a = forward_args("int8_linear.forward", x, out, in_features(), out_features(), group_size());
  if (a.M == 0) return;
  const LinearWeights d = descriptor();
  a.w = d.w;
  a.w_scales = d.scales;
  a.bias = d.bias;
  const kernels::KernelTable& table = kernels::active_kernels();
  (a.M == 1 ? table.w8a8_gemv : table.w8a8_gemm)(a);
}

LinearWeights Int8Linear::descriptor() const {
  LinearWeights d;
  d.kind = WeightKind::kInt8;
  d.N = out_features();
  d.K = in_features();
  d.w = w_.q.ptr<int8_t>();
  d.w_dtype = DType::kI8;
  d.scales = w_.scales.ptr<float>();
  d.group_size = group_size();
  d.bias = bias_ ? bias_->ptr<float>() : nullptr;
  return d;
}

std::optional<TensorView> Int8Linear::bias() const {
  if (!bias_) return std::nullopt;
  return bias_->view();
}

size_t Int8Linear::nbytes() const { return descriptor().nbytes(); }

// ---- Int4Linear ----------------------------------------------------------------------------------------------

Int4Linear Int4Linear::build(const char* op, const TensorView& w, const TensorView* bias, int group_size,
                             std::optional<float> clip_percentile) {
  check(quant::is_int4_group_size(group_size), ErrorCode::kInvalidArgument, op,
        "group_size must be 0 (per channel), 32, 64, 128 or 256; got ", group_size);
  check(!clip_percentile, ErrorCode::kInvalidArgument, op,
        "clip_percentile is supported only for per-channel INT8 weights (Int8Linear); got ",
        clip_percentile.value_or(0.0f));
  check_float_weight(op, w);
  const int64_t N = w.dim(0), K = w.dim(1);
  check(K % 2 == 0, ErrorCode::kShapeMismatch, op,
        "in_features K must be even (two int4 codes per byte); got w shape ", w.shape_string());
  check(group_size == 0 || K % group_size == 0, ErrorCode::kShapeMismatch, op,
        "in_features K must be a multiple of group_size ", group_size, "; got w shape ", w.shape_string());
  check(group_size != 0 || K <= quant::kInt4MaxAccumK, ErrorCode::kOutOfRange, op,
        "per-channel in_features K must be at most ", quant::kInt4MaxAccumK,
        " (int32 accumulation); got w shape ", w.shape_string());
  std::optional<Tensor> b = make_bias(op, bias, N);
  return Int4Linear(quant::quantize_int4_weights(w, group_size), std::move(b));
}

Int4Linear Int4Linear::from_float(const TensorView& w, const TensorView* bias, int group_size,
                                  std::optional<float> clip_percentile) {
  return build("int4_linear.from_float", w, bias, group_size, clip_percentile);
}

Int4Linear Int4Linear::from_mlx_affine(const TensorView& packed, const TensorView& scales, const TensorView& biases,
                                       int mlx_group_size, int mlx_bits, const TensorView* bias,
                                       std::optional<int> target_group_size, std::optional<float> clip_percentile) {
  constexpr const char* op = "int4_linear.from_mlx_affine";
  Tensor w = dequantize_mlx(op, packed, scales, biases, mlx_group_size, mlx_bits);
  return build(op, w.view(), bias, target_group_size.value_or(mlx_group_size), clip_percentile);
}

void Int4Linear::forward(const TensorView& x, const TensorView& out) const {
  kernels::IntLinearArgs a = forward_args("int4_linear.forward", x, out, in_features(), out_features(), group_size());
  if (a.M == 0) return;
  const LinearWeights d = descriptor();
  a.w = d.w;
  a.w_scales = d.scales;
  a.bias = d.bias;
  const kernels::KernelTable& table = kernels::active_kernels();
  (a.M == 1 ? table.w4a8_gemv : table.w4a8_gemm)(a);
}

LinearWeights Int4Linear::descriptor() const {
  LinearWeights d;
  d.kind = WeightKind::kInt4;
  d.N = out_features();
  d.K = in_features();
  d.w = w_.packed.ptr<uint8_t>();
  d.w_dtype = DType::kU8;
  d.scales = w_.scales.ptr<float>();
  d.group_size = group_size();
  d.bias = bias_ ? bias_->ptr<float>() : nullptr;
  return d;
}

std::optional<TensorView> Int4Linear::bias() const {
  if (!bias_) return std::nullopt;
  return bias_->view();
}

size_t Int4Linear::nbytes() const { return descriptor().nbytes(); }

}  // namespace cider::nn
