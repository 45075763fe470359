// cider/error.hpp — the one error type of cider, public and internal alike.
//
// Every failing call throws cider::Error: a code (the same numbers as cider_status in cider/cider.h) and a message
//   [operation] the rule; got the actual value
// e.g. "[affine_quantize] group_size must be one of 32, 64, 128; got 48". The C API turns it into a status plus the
// same message (cider_last_error()). Other exceptions: std::bad_alloc when memory runs out.
#pragma once

#include <stdexcept>
#include <string>

namespace cider {

// Kept in sync with cider_status in include/cider/cider.h (same numeric values).
enum class ErrorCode : int {
  kInvalidArgument = 1,  // a value outside its allowed set (bits, group size, option)
  kShapeMismatch = 2,    // shapes or ranks that do not fit together
  kUnsupported = 3,      // a valid request this build or backend cannot do
  kOutOfRange = 4,       // an index, length or size beyond a limit (context, capacity)
  kIo = 5,               // a file could not be read or written
  kCorrupt = 6,          // a file or buffer whose contents break its format
  kOutOfMemory = 7,
  kInternal = 8,         // a bug in cider
};

// "invalid argument", "shape mismatch", ...
const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace cider
