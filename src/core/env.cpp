// cider/core/env.cpp — environment switches (core/env.h).
#include "core/env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace cider {

namespace {
const char* value_of(const char* name) {
  const char* v = std::getenv(name);
  return (v == nullptr || *v == '\0') ? nullptr : v;
}
}  // namespace

bool env_flag(const char* name, bool default_value, const char* op) {
  const char* v = value_of(name);
  if (v == nullptr) return default_value;
  check(std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0, ErrorCode::kInvalidArgument, op, "$", name,
        " must be 0 or 1 (or unset); got '", v, "'");
  return v[0] == '1';
}

int env_int(const char* name, int default_value, int lo, int hi, const char* op) {
  const char* v = value_of(name);
  if (v == nullptr) return default_value;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  check(errno == 0 && end != v && *end == '\0' && x >= lo && x <= hi, ErrorCode::kInvalidArgument, op, "$", name,
        " must be an integer in [", lo, ", ", hi, "] (or unset); got '", v, "'");
  return static_cast<int>(x);
}

std::string env_word(const char* name, const char* default_value, std::initializer_list<const char*> words,
                     const char* op) {
  const char* v = value_of(name);
  if (v == nullptr) return default_value;
  std::string list;
  for (const char* w : words) {
    if (std::strcmp(v, w) == 0) return v;
    list += list.empty() ? "" : ", ";
    list += w;
  }
  check(false, ErrorCode::kInvalidArgument, op, "$", name, " must be one of ", list, " (or unset); got '", v, "'");
  return default_value;
}

}  // namespace cider
