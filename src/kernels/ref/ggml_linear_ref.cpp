// Reference linear layer over native GGUF weights: each weight row dequantized by its block format's decoder
// (quant/ggml_blocks.h), the dot product with x summed in float64. See GgmlLinearArgs. Interleaved rows
// (quant/ggml_interleave.h) are read block by block back in the file's layout.
#include <vector>

#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

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

// Interleaved weights: the format must take it and the rows come in whole groups.
void check_interleaved(uint32_t type, int64_t first_row, int64_t rows_total, const char* op) {
  check(quant::ggml_interleavable(type), ErrorCode::kUnsupported, op,
        "interleaved rows exist for Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K only; got ggml type ", type);
  check(first_row >= 0 && rows_total % quant::kGgmlInterleaveRows == 0, ErrorCode::kShapeMismatch, op,
        "interleaved rows come in groups of ", quant::kGgmlInterleaveRows, "; got ", rows_total, " rows");
}

// Row n's blocks decoded into row[K].
void decode_row(const quant::GgmlBlockFormat& f, const void* w, int64_t row_bytes, bool interleaved, int64_t n,
                int64_t K, float* row) {
  const int64_t blocks = K / f.block_size;
  uint8_t tmp[quant::kGgmlInterleavedBlockMax];
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = static_cast<const uint8_t*>(w) + n * row_bytes + b * f.block_bytes;
    if (interleaved) {
      quant::ggml_interleaved_block(static_cast<uint32_t>(f.type), w, blocks, n, b, tmp);
      blk = tmp;
    }
    f.decode(blk, row + b * f.block_size);
  }
}

}  // namespace

void ggml_linear(const GgmlLinearArgs& a) {
  const quant::GgmlBlockFormat* f = checked_format(a.ggml_type, a.K, a.row_bytes, "ggml_linear");
  if (a.interleaved) check_interleaved(a.ggml_type, 0, a.N, "ggml_linear");
  std::vector<float> row(static_cast<size_t>(a.K));
  for (int64_t n = 0; n < a.N; ++n) {
    decode_row(*f, a.w, a.row_bytes, a.interleaved, n, a.K, row.data());
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
  if (a.interleaved) check_interleaved(a.ggml_type, a.row0, 0, "ggml_dequantize");
  for (int64_t r = 0; r < a.rows; ++r)
    decode_row(*f, a.w, a.row_bytes, a.interleaved, a.interleaved ? a.row0 + r : r, a.K, a.out + r * a.K);
}

}  // namespace cider::kernels::ref
