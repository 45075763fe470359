#include "nn/quantized_matmul.h"

#include <algorithm>

#include "kernels/kernel_table.h"
#include "quant/affine.h"

namespace cider::nn {

namespace {

constexpr const char* kOp = "quantized_matmul";

// Dimensions of w's matrix: N (outputs) and K (reduction), from its packed shape.
void matrix_dims(const TensorView& x, const TensorView& w, bool transpose, int bits, int64_t* N, int64_t* K) {
  const int64_t unpacked = w.dim(-1) * 32 / bits;
  *K = transpose ? unpacked : w.dim(-2);
  *N = transpose ? w.dim(-2) : unpacked;
  check(x.dim(-1) == *K, ErrorCode::kShapeMismatch, kOp, "x's last dimension must equal the reduction size K = ",
        *K, " of w (", transpose ? "transpose=true: w is [N, K*bits/32]" : "transpose=false: w is [K, N*bits/32]",
        ", shape ", w.shape_string(), ", bits ", bits, "); got x shape ", x.shape_string());
}

// NumPy broadcasting of two batch shapes (right-aligned).
std::vector<int64_t> broadcast_batch(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    check(da == db || da == 1 || db == 1, ErrorCode::kShapeMismatch, kOp,
          "batch dimensions of x and w must broadcast; got ", shape_string(a), " and ", shape_string(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Element offset of batch index `idx` (in the broadcast shape) within a tensor of batch shape `shape` whose batch
// entries are `matrix_elems` apart.
int64_t batch_offset(const std::vector<int64_t>& idx, const std::vector<int64_t>& shape, int64_t matrix_elems) {
  int64_t off = 0, stride = matrix_elems;
  for (size_t i = 0; i < shape.size(); ++i) {
    const size_t d = shape.size() - 1 - i;
    const size_t id = idx.size() - 1 - i;
    if (shape[d] != 1) off += idx[id] * stride;
    stride *= shape[d];
  }
  return off;
}

}  // namespace

DType quantized_matmul_output_dtype(const TensorView& x, const TensorView& scales) {
  return promote_float(x.dtype, scales.dtype);
}

std::vector<int64_t> quantized_matmul_output_shape(const TensorView& x, const TensorView& w, bool transpose,
                                                   int bits) {
  check_rank_at_least(x, 1, kOp, "x");
  check_rank_at_least(w, 2, kOp, "w");
  check(quant::is_affine_bits(bits), ErrorCode::kInvalidArgument, kOp, "bits must be one of 2, 3, 4, 5, 6, 8; got ",
        bits);
  int64_t N, K;
  matrix_dims(x, w, transpose, bits, &N, &K);
  std::vector<int64_t> xs = x.shape_vector();
  if (w.rank == 2) {
    xs.back() = N;
    return xs;
  }
  check(x.rank >= 2, ErrorCode::kShapeMismatch, kOp, "x must have at least 2 dimensions when w is batched (",
        w.shape_string(), "); got ", x.shape_string());
  std::vector<int64_t> bx(xs.begin(), xs.end() - 2);
  std::vector<int64_t> ws = w.shape_vector();
  std::vector<int64_t> bw(ws.begin(), ws.end() - 2);
  std::vector<int64_t> out = broadcast_batch(bx, bw);
  out.push_back(x.dim(-2));
  out.push_back(N);
  return out;
}

void quantized_matmul(const TensorView& x, const TensorView& w, const TensorView& scales, const TensorView& biases,
                      bool transpose, int group_size, int bits, const TensorView& out) {
  check_float_dtype(x, kOp, "x");
  check_dtype(w, DType::kU32, kOp, "w");
  check_float_dtype(scales, kOp, "scales");
  check(biases.dtype == scales.dtype, ErrorCode::kInvalidArgument, kOp, "biases must have the dtype of scales (",
        dtype_name(scales.dtype), "); got ", dtype_name(biases.dtype));
  check_float_dtype(out, kOp, "out");
  const std::vector<int64_t> out_shape = quantized_matmul_output_shape(x, w, transpose, bits);
  int64_t N, K;
  matrix_dims(x, w, transpose, bits, &N, &K);
  const int64_t packed_dim = transpose ? K : N;  // the quantized (grouped) dimension
  quant::check_affine_params(kOp, packed_dim, group_size, bits);
  for (const auto& [t, name] : {std::pair{&x, "x"}, {&w, "w"}, {&scales, "scales"}, {&biases, "biases"},
                                {&out, "out"}}) {
    check_contiguous(*t, kOp, name);
    check_not_null(*t, kOp, name);
    check_cpu(*t, kOp, name);
  }
  // scales/biases: w's shape with the packed last dimension replaced by the number of groups.
  std::vector<int64_t> want_s = w.shape_vector();
  want_s.back() = packed_dim / group_size;
  check(scales.shape_vector() == want_s && biases.shape_vector() == want_s, ErrorCode::kShapeMismatch, kOp,
        "scales and biases must have shape ", shape_string(want_s), " for w of shape ", w.shape_string(),
        " and group_size ", group_size, "; got ", scales.shape_string(), " and ", biases.shape_string());
  check(out.shape_vector() == out_shape, ErrorCode::kShapeMismatch, kOp, "out must have shape ",
        shape_string(out_shape), "; got ", out.shape_string());

  const auto& table = kernels::active_kernels();
  kernels::AffineQmmArgs a{};
  a.x_dtype = x.dtype;
  a.scale_dtype = scales.dtype;
  a.out_dtype = out.dtype;
  a.N = N;
  a.K = K;
  a.group_size = group_size;
  a.bits = bits;
  a.transpose = transpose;
  const int xe = dtype_size(x.dtype), oe = dtype_size(out.dtype), se = dtype_size(scales.dtype);
  if (w.rank == 2) {
    // One weight matrix for every row of x.
    a.M = x.rows();
    a.x = x.data;
    a.w = w.ptr<uint32_t>();
    a.scales = scales.data;
    a.biases = biases.data;
    a.out = out.data;
    if (a.M > 0) table.affine_qmm(a);
    return;
  }
  const int64_t M = x.dim(-2);
  a.M = M;
  const std::vector<int64_t> xs = x.shape_vector(), ws = w.shape_vector();
  const std::vector<int64_t> bx(xs.begin(), xs.end() - 2), bw(ws.begin(), ws.end() - 2);
  const std::vector<int64_t> bo(out_shape.begin(), out_shape.end() - 2);
  int64_t batches = 1;
  for (int64_t d : bo) batches *= d;
  const int64_t w_elems = w.dim(-2) * w.dim(-1), s_elems = want_s[want_s.size() - 2] * want_s.back();
  std::vector<int64_t> idx(bo.size(), 0);
  for (int64_t b = 0; b < batches; ++b) {
    a.x = static_cast<const uint8_t*>(x.data) + batch_offset(idx, bx, M * K) * xe;
    a.w = w.ptr<uint32_t>() + batch_offset(idx, bw, w_elems);
    a.scales = static_cast<const uint8_t*>(scales.data) + batch_offset(idx, bw, s_elems) * se;
    a.biases = static_cast<const uint8_t*>(biases.data) + batch_offset(idx, bw, s_elems) * se;
    a.out = static_cast<uint8_t*>(out.data) + b * M * N * oe;
    if (M > 0) table.affine_qmm(a);
    for (size_t d = bo.size(); d-- > 0;) {  // next batch index, last dimension fastest
      if (++idx[d] < bo[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace cider::nn
