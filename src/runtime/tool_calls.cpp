// Tool calls in a reply: format detection, parsing, and the streaming split (runtime/tool_calls.h).
#include "runtime/tool_calls.h"

#include <nlohmann/json.hpp>

#include "core/limits.h"

namespace cider::runtime {

namespace {

using json = nlohmann::json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && is_space(s[a])) ++a;
  while (b > a && is_space(s[b - 1])) --b;
  return std::string(s.substr(a, b - a));
}

// The end (one past) of the JSON object or array that starts at text[i] ('{' or '['), strings and escapes
// respected; npos when it does not close.
size_t json_value_end(std::string_view text, size_t i) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t k = i; k < text.size(); ++k) {
    const char c = text[k];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (--depth == 0) return k + 1;
    }
  }
  return std::string_view::npos;
}

// {"name": N, "arguments"|"parameters": A} → a call; false when it is not one.
bool to_call(const json& v, ToolCall& out) {
  if (!v.is_object() || !v.contains("name") || !v.at("name").is_string() || v.at("name").get<std::string>().empty())
    return false;
  out.name = v.at("name").get<std::string>();
  const char* key = v.contains("arguments") ? "arguments" : v.contains("parameters") ? "parameters" : nullptr;
  if (key == nullptr) {
    out.arguments = "{}";
  } else if (v.at(key).is_string()) {
    out.arguments = v.at(key).get<std::string>();
  } else {
    out.arguments = v.at(key).dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return true;
}

// The model's text as JSON; false for text that is not, or that nests deeper than input JSON may
// (limits::kMaxJsonDepth: the arguments are written back out by a recursive dump).
bool parse_json(std::string_view s, json& out) {
  if (json_nesting_depth(s.data(), s.data() + s.size(), limits::kMaxJsonDepth) > limits::kMaxJsonDepth) return false;
  out = json::parse(s.begin(), s.end(), nullptr, /*allow_exceptions=*/false);
  return !out.is_discarded();
}

ParsedReply all_content(std::string_view text) { return {trim(text), {}}; }

ParsedReply parse_hermes(std::string_view text) {
  ParsedReply r;
  std::string content;
  size_t pos = 0, s;
  while ((s = text.find(kHermesOpen, pos)) != std::string_view::npos) {
    content += text.substr(pos, s - pos);
    const size_t b = s + kHermesOpen.size(), e = text.find(kHermesClose, b);
    json v;
    ToolCall c;
    if (!parse_json(trim(text.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b)), v) ||
        !to_call(v, c))
      return all_content(text);
    r.calls.push_back(std::move(c));
    pos = e == std::string_view::npos ? text.size() : e + kHermesClose.size();
  }
  content += text.substr(pos);
  r.content = trim(content);
  return r;
}

ParsedReply parse_mistral(std::string_view text) {
  const size_t s = text.find(kMistralMarker);
  if (s == std::string_view::npos) return all_content(text);
  size_t i = s + kMistralMarker.size();
  while (i < text.size() && is_space(text[i])) ++i;
  if (i >= text.size() || (text[i] != '[' && text[i] != '{')) return all_content(text);
  const size_t e = json_value_end(text, i);
  json v;
  if (e == std::string_view::npos || !parse_json(text.substr(i, e - i), v)) return all_content(text);
  ParsedReply r;
  if (v.is_object()) v = json::array({v});
  for (const json& x : v) {
    ToolCall c;
    if (!to_call(x, c)) return all_content(text);
    r.calls.push_back(std::move(c));
  }
  if (r.calls.empty()) return all_content(text);
  r.content = trim(std::string(text.substr(0, s)) + std::string(text.substr(e)));
  return r;
}

ParsedReply parse_llama3(std::string_view text) {
  std::string t = trim(text);
  std::string_view v = t;
  if (v.substr(0, kPythonTag.size()) == kPythonTag) v.remove_prefix(kPythonTag.size());
  size_t i = 0;
  while (i < v.size() && is_space(v[i])) ++i;
  if (i >= v.size() || v[i] != '{') return all_content(text);
  ParsedReply r;
  while (i < v.size()) {
    if (v[i] != '{') return all_content(text);
    const size_t e = json_value_end(v, i);
    json obj;
    ToolCall c;
    if (e == std::string_view::npos || !parse_json(v.substr(i, e - i), obj) || !to_call(obj, c)) return all_content(text);
    r.calls.push_back(std::move(c));
    i = e;
    while (i < v.size() && (is_space(v[i]) || v[i] == ';')) ++i;
  }
  return r;
}

// The length of the longest suffix of s that is a proper prefix of marker (a marker split across pieces).
size_t partial_marker(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view src) {
  if (src.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (src.find(kMistralMarker) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (src.find("respond with a JSON for a function call") != std::string_view::npos) return ToolCallFormat::kLlama3;
  if (src.find("tools") != std::string_view::npos) return ToolCallFormat::kUnknown;
  return ToolCallFormat::kNone;
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kLlama3: return "llama3-json";
    case ToolCallFormat::kUnknown: return "unknown";
  }
  return "unknown";
}

ToolCallText forced_call_text(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes: return {std::string(kHermesOpen) + "\n", "\n" + std::string(kHermesClose)};
    case ToolCallFormat::kMistral: return {std::string(kMistralMarker) + "[", "]"};
    default: return {};
  }
}

ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text) {
  switch (format) {
    case ToolCallFormat::kHermes: return parse_hermes(text);
    case ToolCallFormat::kMistral: return parse_mistral(text);
    case ToolCallFormat::kLlama3: return parse_llama3(text);
    default: return all_content(text);
  }
}

std::string ToolCallStream::feed(std::string_view piece) {
  held_ += piece;
  if (in_call_) return {};
  std::string out;
  if (format_ == ToolCallFormat::kHermes || format_ == ToolCallFormat::kMistral) {
    const std::string_view marker = format_ == ToolCallFormat::kHermes ? kHermesOpen : kMistralMarker;
    const size_t k = held_.find(marker);
    if (k != std::string::npos) {
      out = held_.substr(0, k);
      held_.erase(0, k);
      in_call_ = true;
    } else {
      const size_t keep = partial_marker(held_, marker);
      out = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
    }
  } else if (format_ == ToolCallFormat::kLlama3 && !sent_any_) {
    // A call only if the reply starts with one: held while it is blank or a prefix of <|python_tag|>.
    size_t i = 0;
    while (i < held_.size() && is_space(held_[i])) ++i;
    const std::string_view rest = std::string_view(held_).substr(i);
    if (rest.empty()) return {};
    if (rest[0] == '{' || rest.substr(0, kPythonTag.size()) == kPythonTag) {
      in_call_ = true;
      return {};
    }
    if (kPythonTag.substr(0, rest.size()) == rest) return {};
    out.swap(held_);
  } else {
    out.swap(held_);
  }
  sent_any_ = sent_any_ || !out.empty();
  return out;
}

ParsedReply ToolCallStream::finish() {
  if (!in_call_) {
    ParsedReply r;
    r.content.swap(held_);
    return r;
  }
  ParsedReply r = parse_tool_calls(format_, held_);
  if (r.calls.empty()) r.content = held_;  // sent as it came (not trimmed: the content sent before it was not)
  held_.clear();
  return r;
}

}  // namespace cider::runtime
