// cider/model/json_brief.h — a JSON value quoted in an error message: at most 160 characters, invalid UTF-8
// replaced, and rendered only when the message is built (check() formats its parts only on failure), so a check that
// passes never serializes anything.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

namespace cider::model {

struct JsonBrief {
  const nlohmann::json& value;
};

inline JsonBrief brief(const nlohmann::json& value) { return JsonBrief{value}; }

inline std::ostream& operator<<(std::ostream& out, const JsonBrief& b) {
  std::string s = b.value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return out << s;
}

}  // namespace cider::model
