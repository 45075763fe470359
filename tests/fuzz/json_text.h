// JSON text helpers shared by the JSON recognizer's test (tests/test_json_prefix.cpp) and fuzz harness
// (fuzz_json_schema.cpp). Header-only, standard library only.
#pragma once

#include <string>

namespace cider::fuzz {

// s with every exponent's digits replaced by one 0 (outside strings): nlohmann refuses 1E999 (an overflow), JSON's
// grammar does not, and the recognizer follows the grammar.
inline std::string small_exponents(const std::string& s) {
  std::string t;
  bool quoted = false, escaped = false;
  for (size_t i = 0; i < s.size(); ++i) {
    t += s[i];
    if (quoted) {
      if (escaped) escaped = false;
      else if (s[i] == '\\') escaped = true;
      else if (s[i] == '"') quoted = false;
      continue;
    }
    if (s[i] == '"') quoted = true;
    if ((s[i] != 'e' && s[i] != 'E') || i == 0 || s[i - 1] < '0' || s[i - 1] > '9') continue;
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) t += s[j++];
    const size_t digits = j;
    while (j < s.size() && s[j] >= '0' && s[j] <= '9') ++j;
    if (j > digits) t += '0';
    i = j - 1;
  }
  return t;
}

}  // namespace cider::fuzz
