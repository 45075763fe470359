// C API: INT8 / INT4 weight quantization into caller buffers, and W8A8 / W4A8 linear layers as opaque handles.
#include <cmath>
#include <cstring>
#include <optional>
#include <variant>

#include "capi/capi_internal.h"
#include "nn/linear.h"
#include "quant/int4.h"
#include "quant/int8.h"

struct cider_linear {
  std::variant<cider::nn::Int8Linear, cider::nn::Int4Linear> layer;
};

namespace {

using cider::ErrorCode;
using cider::TensorView;
using cider::capi::guarded;
using cider::capi::to_view;

// Copies an owned result into a caller tensor after checking dtype and exact shape.
void copy_out(const cider::Tensor& src, const TensorView& dst, const char* op, const char* what) {
  cider::check_dtype(dst, src.dtype, op, what);
  cider::check(dst.shape_vector() == src.shape, ErrorCode::kShapeMismatch, op, what, " must have shape ",
               cider::shape_string(src.shape), "; got ", dst.shape_string());
  if (src.buffer.nbytes()) std::memcpy(dst.data, src.buffer.data(), src.buffer.nbytes());
}

// 0 (or below) = no clipping; a NaN is an error, not "no clipping".
std::optional<float> clip_option(float clip_percentile) {
  cider::check(!std::isnan(clip_percentile), ErrorCode::kInvalidArgument, "clip_percentile",
               "clip_percentile must be a number in (0, 100], or <= 0 for none; got NaN");
  return clip_percentile > 0.0f ? std::optional<float>(clip_percentile) : std::nullopt;
}

void check_format(int f, const char* op) {
  cider::check(f == CIDER_W8A8 || f == CIDER_W4A8, ErrorCode::kInvalidArgument, op,
               "format must be CIDER_W8A8 (0) or CIDER_W4A8 (1); got ", f);
}

}  // namespace

extern "C" {

cider_status cider_int8_quantize_weights(const cider_tensor* w, int group_size, float clip_percentile,
                                         const cider_tensor* q, const cider_tensor* scales) {
  return guarded([&] {
    const char* op = "cider_int8_quantize_weights";
    TensorView qv = to_view(q, op, "q"), sv = to_view(scales, op, "scales");
    auto r = cider::quant::quantize_int8_weights(cider::capi::to_input_view(w, op, "w"), group_size, clip_option(clip_percentile));
    copy_out(r.q, qv, op, "q");
    copy_out(r.scales, sv, op, "scales");
  });
}

cider_status cider_int4_quantize_weights(const cider_tensor* w, int group_size, const cider_tensor* q,
                                         const cider_tensor* scales) {
  return guarded([&] {
    const char* op = "cider_int4_quantize_weights";
    TensorView qv = to_view(q, op, "q"), sv = to_view(scales, op, "scales");
    auto r = cider::quant::quantize_int4_weights(cider::capi::to_input_view(w, op, "w"), group_size);
    copy_out(r.packed, qv, op, "q");
    copy_out(r.scales, sv, op, "scales");
  });
}

cider_status cider_linear_create(int format, const cider_tensor* w, const cider_tensor* bias,
                                 int group_size, float clip_percentile, cider_linear** out) {
  return guarded([&] {
    const char* op = "cider_linear_create";
    cider::capi::check_out_ptr(out, op, "out");
    check_format(format, op);
    TensorView wv = cider::capi::to_input_view(w, op, "w");
    std::optional<TensorView> bv;
    if (bias) bv = cider::capi::to_input_view(bias, op, "bias");
    const TensorView* bp = bv ? &*bv : nullptr;
    if (format == CIDER_W8A8)
      *out = new cider_linear{cider::nn::Int8Linear::from_float(wv, bp, group_size, clip_option(clip_percentile))};
    else
      *out = new cider_linear{cider::nn::Int4Linear::from_float(wv, bp, group_size, clip_option(clip_percentile))};
  });
}

cider_status cider_linear_create_from_mlx(int format, const cider_tensor* packed,
                                          const cider_tensor* scales, const cider_tensor* biases, int mlx_group_size,
                                          int mlx_bits, const cider_tensor* bias, int target_group_size,
                                          float clip_percentile, cider_linear** out) {
  return guarded([&] {
    const char* op = "cider_linear_create_from_mlx";
    cider::capi::check_out_ptr(out, op, "out");
    check_format(format, op);
    TensorView pv = to_view(packed, op, "packed"), sv = cider::capi::to_input_view(scales, op, "scales"),
               bsv = cider::capi::to_input_view(biases, op, "biases");
    std::optional<TensorView> bv;
    if (bias) bv = cider::capi::to_input_view(bias, op, "bias");
    const TensorView* bp = bv ? &*bv : nullptr;
    std::optional<int> target = target_group_size >= 0 ? std::optional<int>(target_group_size) : std::nullopt;
    if (format == CIDER_W8A8)
      *out = new cider_linear{cider::nn::Int8Linear::from_mlx_affine(pv, sv, bsv, mlx_group_size, mlx_bits, bp,
                                                                     target, clip_option(clip_percentile))};
    else
      *out = new cider_linear{cider::nn::Int4Linear::from_mlx_affine(pv, sv, bsv, mlx_group_size, mlx_bits, bp,
                                                                     target, clip_option(clip_percentile))};
  });
}

cider_status cider_linear_forward(const cider_linear* layer, const cider_tensor* x, const cider_tensor* out) {
  return guarded([&] {
    const char* op = "cider_linear_forward";
    cider::check(layer != nullptr, ErrorCode::kInvalidArgument, op, "layer must not be NULL");
    TensorView xv = cider::capi::to_input_view(x, op, "x"), ov = to_view(out, op, "out");
    std::visit([&](const auto& l) { l.forward(xv, ov); }, layer->layer);
  });
}

cider_status cider_linear_info(const cider_linear* layer, int64_t* in_features, int64_t* out_features,
                               int* group_size, size_t* nbytes) {
  return guarded([&] {
    cider::check(layer != nullptr, ErrorCode::kInvalidArgument, "cider_linear_info", "layer must not be NULL");
    std::visit(
        [&](const auto& l) {
          if (in_features) *in_features = l.in_features();
          if (out_features) *out_features = l.out_features();
          if (group_size) *group_size = l.group_size();
          if (nbytes) *nbytes = l.nbytes();
        },
        layer->layer);
  });
}

void cider_linear_free(cider_linear* layer) { delete layer; }

}  // extern "C"
