#include "core/error.h"

namespace cider {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kShapeMismatch: return "shape mismatch";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kIo: return "I/O error";
    case ErrorCode::kCorrupt: return "corrupt data";
    case ErrorCode::kOutOfMemory: return "out of memory";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

}  // namespace cider
