#include "core/limits.h"

namespace cider {

int json_nesting_depth(const char* begin, const char* end, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (const char* p = begin; p < end; ++p) {
    const char c = *p;
    if (in_string) {
      if (c == '\\') {
        ++p;  // the escaped character (a quote or backslash) never ends the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > stop_above) return deepest;
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void check_json_nesting(const char* begin, const char* end, const char* op, const std::string& source) {
  const int depth = json_nesting_depth(begin, end, limits::kMaxJsonDepth);
  check(depth <= limits::kMaxJsonDepth, ErrorCode::kCorrupt, op, source, " must nest JSON arrays and objects at most ",
        limits::kMaxJsonDepth, " levels deep; got more than ", limits::kMaxJsonDepth);
}

}  // namespace cider
