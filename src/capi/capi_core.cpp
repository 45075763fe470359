// C API: errors, version, tensor descriptors, affine quantization and quantized_matmul.
#include <limits>
#include <string>

#include "capi/capi_internal.h"
#include "core/limits.h"
#include "nn/quantized_matmul.h"
#include "quant/affine.h"

namespace cider::capi {

namespace {
thread_local std::string g_last_error;
}

void set_last_error(const std::string& message) { g_last_error = message; }
void clear_last_error() { g_last_error.clear(); }

TensorView to_view(const cider_tensor* t, const char* op, const char* what) {
  check(t != nullptr, ErrorCode::kInvalidArgument, op, what, " must not be NULL");
  check(t->rank >= 0 && t->rank <= CIDER_MAX_RANK, ErrorCode::kInvalidArgument, op, what, " rank must be in 0..",
        CIDER_MAX_RANK, "; got ", t->rank);
  const int dt = t->dtype;
  check(dt >= CIDER_F32 && dt <= CIDER_BOOL, ErrorCode::kInvalidArgument, op, what,
        " dtype must be a cider_dtype value (0..7); got ", dt);
  std::vector<int64_t> shape(t->shape, t->shape + t->rank);
  int64_t bytes = dtype_size(static_cast<DType>(dt));
  for (int64_t d : shape) {
    check(d >= 0, ErrorCode::kInvalidArgument, op, what, " dimensions must be >= 0; got ", shape_string(shape));
    bytes = checked_mul(bytes, d, op, "the tensor's byte size");
  }
  TensorView v(t->data, static_cast<DType>(dt), shape);
  check_not_null(v, op, what);
  return v;
}

TensorView to_input_view(const cider_tensor* t, const char* op, const char* what, bool allow_neg_inf) {
  TensorView v = to_view(t, op, what);
  if (!is_float_dtype(v.dtype) || v.numel() == 0) return v;
  const int64_t n = v.numel();
  for (int64_t at = find_nonfinite(v.data, v.dtype, n); at >= 0;) {
    const float x = load_float(v.data, v.dtype, at);
    check(allow_neg_inf && x == -std::numeric_limits<float>::infinity(), ErrorCode::kInvalidArgument, op, what,
          allow_neg_inf ? " must hold finite values or -inf; got " : " must hold finite values; got ", x,
          " at flat index ", at);
    const int64_t next = find_nonfinite(static_cast<const uint8_t*>(v.data) + (at + 1) * dtype_size(v.dtype),
                                        v.dtype, n - at - 1);
    at = next < 0 ? -1 : at + 1 + next;
  }
  return v;
}

TensorView to_optional_view(const cider_tensor* t, const char* op, const char* what) {
  if (t == nullptr) return TensorView();
  return to_view(t, op, what);
}

void check_out_ptr(const void* p, const char* op, const char* what) {
  check(p != nullptr, ErrorCode::kInvalidArgument, op, what, " (output pointer) must not be NULL");
}

}  // namespace cider::capi

using cider::capi::guarded;
using cider::capi::to_view;

extern "C" {

const char* cider_last_error(void) { return cider::capi::g_last_error.c_str(); }

const char* cider_version(void) { return "0.1.0"; }

cider_status cider_affine_quantize(const cider_tensor* w, int group_size, int bits, const cider_tensor* packed,
                                   const cider_tensor* scales, const cider_tensor* biases) {
  return guarded([&] {
    const char* op = "cider_affine_quantize";
    cider::quant::affine_quantize(cider::capi::to_input_view(w, op, "w"), group_size, bits, to_view(packed, op, "packed"),
                                  to_view(scales, op, "scales"), to_view(biases, op, "biases"));
  });
}

cider_status cider_affine_dequantize(const cider_tensor* packed, const cider_tensor* scales,
                                     const cider_tensor* biases, int group_size, int bits, const cider_tensor* out) {
  return guarded([&] {
    const char* op = "cider_affine_dequantize";
    cider::quant::affine_dequantize(to_view(packed, op, "packed"), cider::capi::to_input_view(scales, op, "scales"),
                                    cider::capi::to_input_view(biases, op, "biases"), group_size, bits, to_view(out, op, "out"));
  });
}

cider_status cider_quantized_matmul(const cider_tensor* x, const cider_tensor* w, const cider_tensor* scales,
                                    const cider_tensor* biases, int transpose, int group_size, int bits,
                                    const cider_tensor* out) {
  return guarded([&] {
    const char* op = "cider_quantized_matmul";
    cider::nn::quantized_matmul(cider::capi::to_input_view(x, op, "x"), to_view(w, op, "w"),
                                cider::capi::to_input_view(scales, op, "scales"),
                                cider::capi::to_input_view(biases, op, "biases"), transpose != 0, group_size, bits,
                                to_view(out, op, "out"));
  });
}

}  // extern "C"
