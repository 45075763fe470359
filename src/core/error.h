// cider/core/error.h — the one error mechanism used everywhere.
//
// Every public entry point validates its arguments and throws cider::Error whose message names
//   [operation] the rule; got the actual value
// e.g. "[affine_quantize] group_size must be one of 32, 64, 128; got 48".
// The C API turns an Error into a status code plus the same message.
#pragma once

#include <sstream>
#include <string>
#include <utility>

#include "cider/error.hpp"  // ErrorCode, Error, error_code_name: public, the one error type users see

namespace cider {

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Throws Error(code, "[op] " + concatenated message parts).
template <typename... Args>
[[noreturn]] void fail(ErrorCode code, const char* op, Args&&... parts) {
  throw Error(code, detail::concat("[", op, "] ", std::forward<Args>(parts)...));
}

// Checks a rule at a public boundary: if `cond` is false, fails with the op and message parts.
// Usage: check(bits == 4, ErrorCode::kInvalidArgument, "w4a8_linear", "bits must be 4; got ", bits);
template <typename... Args>
inline void check(bool cond, ErrorCode code, const char* op, Args&&... parts) {
  if (!cond) fail(code, op, std::forward<Args>(parts)...);
}

}  // namespace cider

// Programming errors inside kernels (never user input): abort with file and line in debug builds.
#ifndef NDEBUG
#include <cstdio>
#include <cstdlib>
#define CIDER_DEBUG_ASSERT(cond)                                                            \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: internal assertion failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
#else
#define CIDER_DEBUG_ASSERT(cond) ((void)0)
#endif
