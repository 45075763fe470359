// Reference linear layer over native GGUF weights: each weight row dequantized by its block format's decoder
// (quant/ggml_blocks.h), the dot product with x summed in float64. See GgmlLinearArgs.
#include <vector>

#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
#include "quant/ggml_blocks.h"

namespace cider::kernels::ref {

namespace {

// The block format of a weight whose rows are K wide and row_bytes long; cider::Error naming `op` otherwise.
const quant::GgmlBlockFormat* checked_format(uint32_t type, int64_t K, int64_t row_bytes, const char* op) {
  const quant::GgmlBlockFormat* f = quant::ggml_block_format(type);
  check(f != nullptr, ErrorCode::kUnsupported, op, "the weight type must be a ggml block format; got id ", type);
  check(K % f->block_size == 0 && row_bytes == quant::ggml_row_bytes(*f, K), ErrorCode::kShapeMismatch, op,
        "K must be a multiple of the ", f->name, " block size ", f->block_size, " and rows ",
        quant::ggml_row_bytes(*f, K), " bytes; got K = ", K, ", ", row_bytes, " bytes");
  return f;
}

}  // namespace

void ggml_linear(const GgmlLinearArgs& a) {
  const quant::GgmlBlockFormat* f = checked_format(a.ggml_type, a.K, a.row_bytes, "ggml_linear");
  std::vector<float> row(static_cast<size_t>(a.K));
  const int64_t blocks = a.K / f->block_size;
  for (int64_t n = 0; n < a.N; ++n) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + n * a.row_bytes;
    for (int64_t b = 0; b < blocks; ++b) f->decode(w + b * f->block_bytes, row.data() + b * f->block_size);
    for (int64_t m = 0; m < a.M; ++m) {
      const float* x = a.x + m * a.K;
      double acc = 0.0;
      for (int64_t k = 0; k < a.K; ++k) acc += static_cast<double>(x[k]) * row[static_cast<size_t>(k)];
      if (a.bias) acc += a.bias[n];
      a.out[m * a.N + n] = static_cast<float>(acc);
    }
  }
}

void ggml_dequantize(const GgmlDequantArgs& a) {
  const quant::GgmlBlockFormat* f = checked_format(a.ggml_type, a.K, a.row_bytes, "ggml_dequantize");
  const int64_t blocks = a.K / f->block_size;
  for (int64_t r = 0; r < a.rows; ++r) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + r * a.row_bytes;
    for (int64_t b = 0; b < blocks; ++b) f->decode(w + b * f->block_bytes, a.out + r * a.K + b * f->block_size);
  }
}

}  // namespace cider::kernels::ref
