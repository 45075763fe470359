#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

namespace cider {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kU32: return "uint32";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kBool: return "bool";
    case DType::kF64: return "float64";
  }
  return "unknown";
}

static void init_view(TensorView& v, const int64_t* dims, size_t n) {
  check(n <= static_cast<size_t>(kMaxRank), ErrorCode::kInvalidArgument, "tensor", "rank must be at most ", kMaxRank,
        "; got ", n);
  v.rank = static_cast<int>(n);
  int64_t s = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    check(dims[i] >= 0, ErrorCode::kInvalidArgument, "tensor", "dimensions must be >= 0; got ", dims[i]);
    v.shape[static_cast<size_t>(i)] = dims[i];
    v.stride[static_cast<size_t>(i)] = s;
    s *= dims[i];
  }
}

TensorView::TensorView(const void* d, DType t, std::initializer_list<int64_t> s, Device dev)
    : data(const_cast<void*>(d)), dtype(t), device(dev) {
  init_view(*this, s.begin(), s.size());
}

TensorView::TensorView(const void* d, DType t, const std::vector<int64_t>& s, Device dev)
    : data(const_cast<void*>(d)), dtype(t), device(dev) {
  init_view(*this, s.data(), s.size());
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

int64_t TensorView::rows() const {
  int64_t n = 1;
  for (int i = 0; i + 1 < rank; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    size_t k = static_cast<size_t>(i);
    if (shape[k] != 1 && stride[k] != s) return false;
    s *= shape[k];
  }
  return true;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ")";
  return out.str();
}

std::string TensorView::shape_string() const { return cider::shape_string(shape_vector()); }

Buffer::Buffer(size_t nbytes) : nbytes_(nbytes) {
  if (nbytes == 0) return;
  size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded);
  if (!data_) fail(ErrorCode::kOutOfMemory, "buffer", "allocation of ", nbytes, " bytes failed");
  std::memset(data_, 0, rounded);
}

Buffer::Buffer(Buffer&& o) noexcept : data_(o.data_), nbytes_(o.nbytes_) {
  o.data_ = nullptr;
  o.nbytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    nbytes_ = o.nbytes_;
    o.data_ = nullptr;
    o.nbytes_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { std::free(data_); }

Buffer Buffer::clone() const {
  Buffer b(nbytes_);
  if (nbytes_) std::memcpy(b.data_, data_, nbytes_);
  return b;
}

Tensor::Tensor(DType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
  buffer = Buffer(static_cast<size_t>(numel()) * static_cast<size_t>(dtype_size(t)));
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void check_dtype(const TensorView& t, DType want, const char* op, const char* what) {
  check(t.dtype == want, ErrorCode::kInvalidArgument, op, what, " must have dtype ", dtype_name(want), "; got ",
        dtype_name(t.dtype));
}

void check_float_dtype(const TensorView& t, const char* op, const char* what) {
  check(is_float_dtype(t.dtype), ErrorCode::kInvalidArgument, op, what,
        " must have dtype float32, float16 or bfloat16; got ", dtype_name(t.dtype));
}

void check_rank_at_least(const TensorView& t, int min_rank, const char* op, const char* what) {
  check(t.rank >= min_rank, ErrorCode::kShapeMismatch, op, what, " must have at least ", min_rank,
        " dimensions; got shape ", t.shape_string());
}

void check_rank(const TensorView& t, int rank, const char* op, const char* what) {
  check(t.rank == rank, ErrorCode::kShapeMismatch, op, what, " must have ", rank, " dimensions; got shape ",
        t.shape_string());
}

void check_contiguous(const TensorView& t, const char* op, const char* what) {
  check(t.is_contiguous(), ErrorCode::kInvalidArgument, op, what, " must be contiguous (row-major); got shape ",
        t.shape_string(), " with non-row-major strides");
}

void check_not_null(const TensorView& t, const char* op, const char* what) {
  check(t.data != nullptr || t.numel() == 0, ErrorCode::kInvalidArgument, op, what, " must not be a null pointer");
}

void check_cpu(const TensorView& t, const char* op, const char* what) {
  check(t.device == Device::kCPU, ErrorCode::kUnsupported, op, what,
        " must be in CPU memory for the CPU kernels; got a CUDA tensor");
}

}  // namespace cider

namespace cider {

namespace {
template <typename U, U kExpMask>
int64_t find_nonfinite_bits(const U* p, int64_t n) {
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    U bad = 0;
    for (int64_t i = b; i < e; ++i) bad |= static_cast<U>((p[i] & kExpMask) == kExpMask);
    if (bad)
      for (int64_t i = b; i < e; ++i)
        if ((p[i] & kExpMask) == kExpMask) return i;
  }
  return -1;
}
}  // namespace

int64_t find_nonfinite(const void* p, DType t, int64_t n) {
  switch (t) {
    case DType::kF32: return find_nonfinite_bits<uint32_t, 0x7f800000u>(static_cast<const uint32_t*>(p), n);
    case DType::kF16: return find_nonfinite_bits<uint16_t, 0x7c00u>(static_cast<const uint16_t*>(p), n);
    case DType::kBF16: return find_nonfinite_bits<uint16_t, 0x7f80u>(static_cast<const uint16_t*>(p), n);
    case DType::kF64:
      return find_nonfinite_bits<uint64_t, 0x7ff0000000000000ull>(static_cast<const uint64_t*>(p), n);
    default: return -1;
  }
}

}  // namespace cider
