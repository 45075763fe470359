#include "quant/affine.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace cider::quant {

bool is_affine_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

bool is_affine_group_size(int group_size) { return group_size == 32 || group_size == 64 || group_size == 128; }

void check_affine_params(const char* op, int64_t K, int group_size, int bits) {
  check(is_affine_bits(bits), ErrorCode::kInvalidArgument, op, "bits must be one of 2, 3, 4, 5, 6, 8; got ", bits);
  check(is_affine_group_size(group_size), ErrorCode::kInvalidArgument, op,
        "group_size must be one of 32, 64, 128; got ", group_size);
  check(K > 0 && K % group_size == 0, ErrorCode::kShapeMismatch, op,
        "the quantized dimension must be a positive multiple of group_size ", group_size, "; got ", K);
}

void pack_codes(const uint8_t* codes, int64_t n, int bits, uint32_t* words) {
  CIDER_DEBUG_ASSERT((n * bits) % 32 == 0);
  int64_t n_words = n * bits / 32;
  std::fill(words, words + n_words, 0u);
  for (int64_t k = 0; k < n; ++k) {
    int64_t bit = k * bits;
    int64_t w = bit >> 5;
    int shift = static_cast<int>(bit & 31);
    uint64_t v = static_cast<uint64_t>(codes[k]) << shift;
    words[w] |= static_cast<uint32_t>(v);
    if (shift + bits > 32) words[w + 1] |= static_cast<uint32_t>(v >> 32);
  }
}

void unpack_codes(const uint32_t* words, int64_t n, int bits, uint8_t* codes) {
  for (int64_t k = 0; k < n; ++k) codes[k] = static_cast<uint8_t>(unpack_code(words, k, bits));
}

void affine_quantize_group(const float* w, int group_size, int bits, uint8_t* codes, float* scale_out,
                           float* bias_out) {
  // MLX CPU backend arithmetic (docs/formats.md): all float32, rint = round half to even (the default FP mode).
  const float n_bins = static_cast<float>((1 << bits) - 1);
  const float eps = 1e-7f;
  float lo = w[0], hi = w[0];
  for (int i = 1; i < group_size; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  const bool neg = std::fabs(lo) > std::fabs(hi);
  float scale = std::max((hi - lo) / n_bins, eps);
  scale = neg ? scale : -scale;
  const float edge = neg ? lo : hi;
  const float q0 = std::rint(edge / scale);
  float bias = 0.0f;
  if (q0 != 0.0f) {
    scale = edge / q0;
    bias = edge;
  }
  for (int i = 0; i < group_size; ++i) {
    const float q = std::rint((w[i] - bias) / scale);
    // Written so that a NaN (which compares false) becomes code 0: defined behaviour, never UB. Public entry points
    // reject non-finite input before reaching here.
    codes[i] = static_cast<uint8_t>(q >= 0.0f ? std::min(q, n_bins) : 0.0f);
  }
  *scale_out = scale;
  *bias_out = bias;
}

void affine_quantize_row(const float* w, int64_t K, int group_size, int bits, uint32_t* packed, void* scales,
                         void* biases, DType scale_dtype) {
  uint8_t codes[128];
  const int64_t groups = K / group_size;
  const int64_t words_per_group = packed_words(group_size, bits);  // group_size·bits is a multiple of 32
  for (int64_t g = 0; g < groups; ++g) {
    float s, b;
    affine_quantize_group(w + g * group_size, group_size, bits, codes, &s, &b);
    pack_codes(codes, group_size, bits, packed + g * words_per_group);
    store_float(scales, scale_dtype, g, s);
    store_float(biases, scale_dtype, g, b);
  }
}

float symmetric_step(const float* w, int group_size, int bits, DType scale_dtype) {
  float edge = w[0];
  for (int i = 1; i < group_size; ++i)
    if (std::fabs(w[i]) > std::fabs(edge)) edge = w[i];
  return round_to(scale_dtype, edge / -static_cast<float>(1 << (bits - 1)));
}

void symmetric_quantize_group(const float* w, int group_size, int bits, DType scale_dtype, uint8_t* codes,
                              float* step) {
  const float half = static_cast<float>(1 << (bits - 1)), top = static_cast<float>((1 << bits) - 1);
  const float d = symmetric_step(w, group_size, bits, scale_dtype);
  for (int i = 0; i < group_size; ++i) {
    const float q = d != 0.0f ? std::rint(w[i] / d) + half : half;
    codes[i] = static_cast<uint8_t>(q >= 0.0f ? std::min(q, top) : 0.0f);  // NaN (compares false): 0
  }
  *step = d;
}

void symmetric_quantize_row(const float* w, int64_t K, int group_size, int bits, uint32_t* packed, void* scales,
                            DType scale_dtype) {
  uint8_t codes[128];
  const int64_t words_per_group = packed_words(group_size, bits);
  for (int64_t g = 0; g < K / group_size; ++g) {
    float d;
    symmetric_quantize_group(w + g * group_size, group_size, bits, scale_dtype, codes, &d);
    pack_codes(codes, group_size, bits, packed + g * words_per_group);
    store_float(scales, scale_dtype, g, d);
  }
}

void affine_quantize_columns(const float* x, int64_t x_stride, int64_t n, int64_t dim, int bits, uint32_t* packed,
                             int64_t packed_stride, void* scales, void* biases, DType scale_dtype) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * dim));  // [n, dim]
  std::vector<float> column(static_cast<size_t>(n));
  std::vector<uint8_t> ccodes(static_cast<size_t>(n));
  for (int64_t d = 0; d < dim; ++d) {
    for (int64_t t = 0; t < n; ++t) column[static_cast<size_t>(t)] = x[t * x_stride + d];
    float s, b;
    affine_quantize_group(column.data(), static_cast<int>(n), bits, ccodes.data(), &s, &b);
    for (int64_t t = 0; t < n; ++t) codes[static_cast<size_t>(t * dim + d)] = ccodes[static_cast<size_t>(t)];
    store_float(scales, scale_dtype, d, s);
    store_float(biases, scale_dtype, d, b);
  }
  for (int64_t t = 0; t < n; ++t) pack_codes(codes.data() + t * dim, dim, bits, packed + t * packed_stride);
}

namespace {

void check_packed_triple(const char* op, const TensorView& packed, const TensorView& scales,
                         const TensorView& biases, int64_t K, int group_size, int bits) {
  check_dtype(packed, DType::kU32, op, "packed");
  check_float_dtype(scales, op, "scales");
  check(biases.dtype == scales.dtype, ErrorCode::kInvalidArgument, op,
        "biases must have the dtype of scales (", dtype_name(scales.dtype), "); got ", dtype_name(biases.dtype));
  for (const TensorView* t : {&packed, &scales, &biases}) {
    check_not_null(*t, op, t == &packed ? "packed" : t == &scales ? "scales" : "biases");
    check_contiguous(*t, op, t == &packed ? "packed" : t == &scales ? "scales" : "biases");
    check_cpu(*t, op, t == &packed ? "packed" : t == &scales ? "scales" : "biases");
  }
  check(scales.rank == packed.rank && biases.rank == packed.rank, ErrorCode::kShapeMismatch, op,
        "packed, scales and biases must have the same rank; got ", packed.shape_string(), ", ",
        scales.shape_string(), ", ", biases.shape_string());
  for (int i = 0; i + 1 < packed.rank; ++i) {
    check(scales.dim(i) == packed.dim(i) && biases.dim(i) == packed.dim(i), ErrorCode::kShapeMismatch, op,
          "packed, scales and biases must agree in all but the last dimension; got ", packed.shape_string(), ", ",
          scales.shape_string(), ", ", biases.shape_string());
  }
  check(packed.dim(-1) == packed_words(K, bits), ErrorCode::kShapeMismatch, op, "packed's last dimension must be ",
        K, "*", bits, "/32 = ", packed_words(K, bits), "; got shape ", packed.shape_string());
  check(scales.dim(-1) == K / group_size && biases.dim(-1) == K / group_size, ErrorCode::kShapeMismatch, op,
        "scales and biases must have K/group_size = ", K / group_size, " entries per row; got ",
        scales.shape_string(), " and ", biases.shape_string());
}

}  // namespace

void affine_quantize(const TensorView& w, int group_size, int bits, const TensorView& packed,
                     const TensorView& scales, const TensorView& biases) {
  const char* op = "affine_quantize";
  check_float_dtype(w, op, "w");
  check_rank_at_least(w, 1, op, "w");
  check_contiguous(w, op, "w");
  check_not_null(w, op, "w");
  check_cpu(w, op, "w");
  const int64_t K = w.dim(-1);
  check_affine_params(op, K, group_size, bits);
  check_packed_triple(op, packed, scales, biases, K, group_size, bits);
  check(packed.rank == w.rank, ErrorCode::kShapeMismatch, op, "packed must have w's rank ", w.rank, "; got shape ",
        packed.shape_string());
  for (int i = 0; i + 1 < w.rank; ++i)
    check(packed.dim(i) == w.dim(i), ErrorCode::kShapeMismatch, op,
          "outputs must have w's leading dimensions ", w.shape_string(), "; got ", packed.shape_string());
  check(scales.dtype == w.dtype, ErrorCode::kInvalidArgument, op, "scales must have w's dtype ",
        dtype_name(w.dtype), " (MLX stores them in the input dtype); got ", dtype_name(scales.dtype));

  const int64_t rows = w.rows();
  const int64_t groups = K / group_size;
  const int64_t words = packed_words(K, bits);
  std::vector<float> row(static_cast<size_t>(K));
  const int elt = dtype_size(w.dtype);
  const int selt = dtype_size(scales.dtype);
  for (int64_t r = 0; r < rows; ++r) {
    const void* src = static_cast<const uint8_t*>(w.data) + r * K * elt;
    for (int64_t k = 0; k < K; ++k) {
      const float v = load_float(src, w.dtype, k);
      check(std::isfinite(v), ErrorCode::kInvalidArgument, op, "w must be finite; got ", v, " at row ", r,
            ", column ", k);
      row[static_cast<size_t>(k)] = v;
    }
    affine_quantize_row(row.data(), K, group_size, bits, packed.ptr<uint32_t>() + r * words,
                        static_cast<uint8_t*>(scales.data) + r * groups * selt,
                        static_cast<uint8_t*>(biases.data) + r * groups * selt, scales.dtype);
  }
}

void affine_dequantize(const TensorView& packed, const TensorView& scales, const TensorView& biases, int group_size,
                       int bits, const TensorView& out) {
  const char* op = "affine_dequantize";
  check_dtype(packed, DType::kU32, op, "packed");
  check_rank_at_least(packed, 1, op, "packed");
  check(is_affine_bits(bits), ErrorCode::kInvalidArgument, op, "bits must be one of 2, 3, 4, 5, 6, 8; got ", bits);
  const int64_t K = packed.dim(-1) * 32 / bits;
  check_affine_params(op, K, group_size, bits);
  check_packed_triple(op, packed, scales, biases, K, group_size, bits);
  check_float_dtype(out, op, "out");
  check_contiguous(out, op, "out");
  check_not_null(out, op, "out");
  check_cpu(out, op, "out");
  check(out.rank == packed.rank && out.dim(-1) == K, ErrorCode::kShapeMismatch, op, "out must have shape ",
        "packed's leading dimensions and last dimension ", K, "; got ", out.shape_string());
  for (int i = 0; i + 1 < out.rank; ++i)
    check(out.dim(i) == packed.dim(i), ErrorCode::kShapeMismatch, op, "out must have packed's leading dimensions ",
          packed.shape_string(), "; got ", out.shape_string());

  const int64_t rows = packed.rows();
  const int64_t groups = K / group_size;
  const int64_t words = packed_words(K, bits);
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* row = packed.ptr<uint32_t>() + r * words;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = r * groups + k / group_size;
      float s = load_float(scales.data, scales.dtype, g);
      float b = load_float(biases.data, biases.dtype, g);
      store_float(out.data, out.dtype, r * K + k, affine_dequantize_value(unpack_code(row, k, bits), s, b, scales.dtype));
    }
  }
}

AffineQuantized affine_quantize(const TensorView& w, int group_size, int bits) {
  check_rank_at_least(w, 1, "affine_quantize", "w");
  std::vector<int64_t> lead = w.shape_vector();
  const int64_t K = lead.back();
  check_affine_params("affine_quantize", K, group_size, bits);
  AffineQuantized q;
  q.group_size = group_size;
  q.bits = bits;
  lead.back() = packed_words(K, bits);
  q.packed = Tensor(DType::kU32, lead);
  lead.back() = K / group_size;
  q.scales = Tensor(w.dtype, lead);
  q.biases = Tensor(w.dtype, lead);
  affine_quantize(w, group_size, bits, q.packed.view(), q.scales.view(), q.biases.view());
  return q;
}

Tensor affine_dequantize(const TensorView& packed, const TensorView& scales, const TensorView& biases,
                         int group_size, int bits, DType out_dtype) {
  check_rank_at_least(packed, 1, "affine_dequantize", "packed");
  check(is_affine_bits(bits), ErrorCode::kInvalidArgument, "affine_dequantize",
        "bits must be one of 2, 3, 4, 5, 6, 8; got ", bits);
  std::vector<int64_t> shape = packed.shape_vector();
  shape.back() = shape.back() * 32 / bits;
  Tensor out(out_dtype, shape);
  affine_dequantize(packed, scales, biases, group_size, bits, out.view());
  return out;
}

}  // namespace cider::quant
