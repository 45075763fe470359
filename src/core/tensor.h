// cider/core/tensor.h — tensors as views (pointer, dtype, device, shape, strides) and owned aligned buffers.
//
// A TensorView never owns memory. Strides are in elements (not bytes), row-major by default; a stride of 0
// broadcasts. Public operations validate views with the check_* helpers below, which name the operation and the
// argument in their errors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace cider {

enum class Device : int { kCPU = 0, kCUDA = 1 };

constexpr int kMaxRank = 8;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCPU;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};

  TensorView() = default;
  // A contiguous row-major view.
  TensorView(const void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = Device::kCPU);
  TensorView(const void* data, DType dtype, const std::vector<int64_t>& shape, Device device = Device::kCPU);

  // Size of dimension i; negative i counts from the end (-1 is the last).
  int64_t dim(int i) const { return shape[static_cast<size_t>(i < 0 ? rank + i : i)]; }
  int64_t stride_of(int i) const { return stride[static_cast<size_t>(i < 0 ? rank + i : i)]; }
  int64_t numel() const;
  bool is_contiguous() const;
  std::vector<int64_t> shape_vector() const { return std::vector<int64_t>(shape.begin(), shape.begin() + rank); }
  std::string shape_string() const;  // "(2, 3, 64)"

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  // Product of all dimensions but the last (rows of a [..., K] matrix); 1 for rank <= 1.
  int64_t rows() const;
};

std::string shape_string(const std::vector<int64_t>& shape);

// A 64-byte aligned, zero-initialised heap allocation. Move-only.
class Buffer {
 public:
  static constexpr size_t kAlignment = 64;
  Buffer() = default;
  explicit Buffer(size_t nbytes);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t nbytes() const { return nbytes_; }
  Buffer clone() const;

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
};

// Owned tensor: a buffer plus its contiguous shape.
struct Tensor {
  Buffer buffer;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;

  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);
  TensorView view() const { return TensorView(buffer.data(), dtype, shape); }
  int64_t numel() const;
  template <typename T>
  T* ptr() const { return buffer.as<T>(); }
};

// Validation helpers for public entry points. `what` names the argument ("x", "scales").
void check_dtype(const TensorView& t, DType want, const char* op, const char* what);
void check_float_dtype(const TensorView& t, const char* op, const char* what);  // f32, f16 or bf16
void check_rank_at_least(const TensorView& t, int min_rank, const char* op, const char* what);
void check_rank(const TensorView& t, int rank, const char* op, const char* what);
void check_contiguous(const TensorView& t, const char* op, const char* what);
void check_not_null(const TensorView& t, const char* op, const char* what);
void check_cpu(const TensorView& t, const char* op, const char* what);

}  // namespace cider
