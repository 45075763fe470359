// The weight formats (model/model.h WeightFormatInfo): one row each, the only place their properties are written.
#include <string>

#include "core/error.h"
#include "model/model.h"

namespace cider::model {

namespace {

// Symmetric INT4 per group of 64 (one float32 scale per 64 weights, 4.5 bits per weight): far more accurate than per
// channel at a small cost.
constexpr WeightFormatInfo kFormats[] = {
    {WeightFormat::kF32, "f32", WeightKind::kDense, DType::kF32, 0, "float32", false,
     "float32 weights (a reference, 4 bytes per weight)"},
    {WeightFormat::kBF16, "bf16", WeightKind::kDense, DType::kBF16, 0, "float32", true,
     "bfloat16 weights (a bf16 checkpoint's tensors used in place)"},
    {WeightFormat::kW8A8, "w8a8", WeightKind::kInt8, DType::kI8, 0, "int8 per token", true,
     "symmetric int8 per output channel × int8 activations"},
    {WeightFormat::kW8A8G64, "w8a8-g64", WeightKind::kInt8, DType::kI8, 64, "int8 per token", true,
     "symmetric int8 per group of 64 × int8 activations"},
    {WeightFormat::kW8A8G128, "w8a8-g128", WeightKind::kInt8, DType::kI8, 128, "int8 per token", true,
     "symmetric int8 per group of 128 × int8 activations"},
    {WeightFormat::kW8A8G256, "w8a8-g256", WeightKind::kInt8, DType::kI8, 256, "int8 per token", true,
     "symmetric int8 per group of 256 × int8 activations"},
    {WeightFormat::kW4A8, "w4a8", WeightKind::kInt4, DType::kU8, 64, "int8 per token", true,
     "symmetric int4 per group of 64 × int8 activations (MLX sources with a finer group keep it)"},
    {WeightFormat::kNative, "native", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "a GGUF file's blocks as they are (Q8_0, Q4_0/1, Q5_0/1, Q4_K, Q5_K, Q6_K; other tensors bf16) × int8 "
     "activations per 32"},
};

}  // namespace

std::span<const WeightFormatInfo> weight_formats() { return kFormats; }

const WeightFormatInfo& weight_format_info(WeightFormat f) {
  for (const WeightFormatInfo& w : kFormats)
    if (w.id == f) return w;
  fail(ErrorCode::kInvalidArgument, "weight_format", "unknown weight format id ", static_cast<int>(f));
}

std::string weight_format_names(bool cuda_only) {
  std::string s;
  for (const WeightFormatInfo& w : kFormats) {
    if (cuda_only && !w.cuda) continue;
    if (!s.empty()) s += ", ";
    s += w.name;
  }
  return s;
}

WeightFormat parse_weight_format(std::string_view s) {
  for (const WeightFormatInfo& w : kFormats)
    if (s == w.name) return w.id;
  fail(ErrorCode::kInvalidArgument, "parse_weight_format", "weights must be one of ", weight_format_names(), "; got \"",
       s, "\"");
}

const char* weight_format_name(WeightFormat f) {
  for (const WeightFormatInfo& w : kFormats)
    if (w.id == f) return w.name;
  return "unknown";
}

}  // namespace cider::model
