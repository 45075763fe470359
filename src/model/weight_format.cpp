// The weight formats (model/model.h WeightFormatInfo): one row each, the only place their properties are written.
#include <string>

#include "core/error.h"
#include "model/model.h"
#include "quant/ggml_blocks.h"

namespace cider::model {

namespace {

constexpr uint32_t id(quant::GgmlType t) { return static_cast<uint32_t>(t); }
constexpr uint32_t kQ8 = id(quant::GgmlType::kQ8_0), kQ6K = id(quant::GgmlType::kQ6_K),
                   kQ51 = id(quant::GgmlType::kQ5_1), kQ50 = id(quant::GgmlType::kQ5_0),
                   kQ4K = id(quant::GgmlType::kQ4_K), kQ41 = id(quant::GgmlType::kQ4_1),
                   kQ40 = id(quant::GgmlType::kQ4_0);

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
    // Requantized by cider into GGUF block types (any source: float, MLX, GGUF); the LM head is kept at Q8_0, as
    // llama.cpp's mixes keep it at 6-8 bits (it is one matmul, but the logits read it directly).
    {WeightFormat::kQ8_0, "q8_0", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "Q8_0 blocks (int8 per 32 weights, f16 scale: 8.5 bits) × int8 activations per 32", kQ8, kQ8, kQ8},
    {WeightFormat::kQ6_K, "q6_k", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "Q6_K blocks (6.56 bits; Q8_0 where K is not a multiple of 256), LM head Q8_0", kQ6K, kQ8, kQ8},
    {WeightFormat::kQ5_1, "q5_1", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "Q5_1 blocks (affine 5-bit per 32: 6 bits), LM head Q8_0", kQ51, kQ51, kQ8},
    {WeightFormat::kQ5_0, "q5_0", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "Q5_0 blocks (symmetric 5-bit per 32: 5.5 bits), LM head Q8_0", kQ50, kQ50, kQ8},
    {WeightFormat::kQ4_K_M, "q4_k_m", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "q4_k with v_proj and down_proj at Q6_K (Q8_0 where K is not a multiple of 256), LM head Q8_0", kQ4K, kQ41, kQ8,
     kQ6K, kQ8},
    {WeightFormat::kQ4_K, "q4_k", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "Q4_K blocks (affine 4-bit per 32 with 6-bit sub-scales: 4.5 bits; Q4_1 where K is not a multiple of 256), "
     "LM head Q8_0", kQ4K, kQ41, kQ8},
    {WeightFormat::kQ4_1, "q4_1", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "Q4_1 blocks (affine 4-bit per 32: 5 bits), LM head Q8_0", kQ41, kQ41, kQ8},
    {WeightFormat::kQ4_0, "q4_0", WeightKind::kGgml, DType::kU8, 0, "int8 per 32", true,
     "Q4_0 blocks (symmetric 4-bit per 32: 4.5 bits), LM head Q8_0", kQ40, kQ40, kQ8},
};

}  // namespace

std::span<const WeightFormatInfo> weight_formats() { return kFormats; }

bool is_sensitive_layer(std::string_view name) {
  auto ends = [&](std::string_view s) { return name.size() >= s.size() && name.substr(name.size() - s.size()) == s; };
  return ends("v_proj") || ends("down_proj");
}

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
