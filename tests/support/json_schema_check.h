// A JSON Schema validator of the keywords constrained decoding supports (model/json_prefix.h: type, properties,
// required, additionalProperties, items, enum, const), written independently of the recognizer so that tests can
// check what it lets through (tests/test_json_prefix.cpp, tests/test_tool_calls.cpp). Header-only.
#pragma once

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

namespace cider::test {

inline bool json_schema_valid(const nlohmann::json& v, const nlohmann::json& s) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("const") && v != s.at("const")) return false;
  if (s.contains("enum")) {
    bool any = false;
    for (const auto& e : s.at("enum")) any = any || v == e;
    if (!any) return false;
  }
  if (s.contains("type")) {
    const nlohmann::json t = s.at("type").is_array() ? s.at("type") : nlohmann::json::array({s.at("type")});
    bool ok = false;
    for (const auto& name : t) {
      const std::string n = name.get<std::string>();
      ok = ok || (n == "object" && v.is_object()) || (n == "array" && v.is_array()) || (n == "string" && v.is_string()) ||
           (n == "number" && v.is_number()) ||
           (n == "integer" && (v.is_number_integer() ||  // a big one is parsed as a double; still an integer
                               (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                std::trunc(v.get<double>()) == v.get<double>()))) ||
           (n == "boolean" && v.is_boolean()) || (n == "null" && v.is_null());
    }
    if (!ok) return false;
  }
  if (v.is_object()) {
    const nlohmann::json props = s.value("properties", nlohmann::json::object());
    for (const auto& [k, x] : v.items()) {
      if (props.contains(k)) {
        if (!json_schema_valid(x, props.at(k))) return false;
      } else if (s.value("additionalProperties", true) == false) {
        return false;
      }
    }
    for (const auto& r : s.value("required", nlohmann::json::array()))
      if (!v.contains(r.get<std::string>())) return false;
  }
  if (v.is_array() && s.contains("items"))
    for (const auto& x : v)
      if (!json_schema_valid(x, s.at("items"))) return false;
  return true;
}

}  // namespace cider::test
