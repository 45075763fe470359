// cider/dtype.hpp — element types of the tensors cider reads and writes (the same type inside the library).
#pragma once

namespace cider {

// Values kept in sync with cider_dtype in include/cider/cider.h.
enum class DType : int {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kU32 = 3,  // packed quantization codes
  kI8 = 4,
  kU8 = 5,   // packed int4 pairs, raw bytes
  kI32 = 6,
  kBool = 7, // one byte per element, 0 or 1
  kF64 = 8,  // internal (reference computations); no public function takes it
};

}  // namespace cider
