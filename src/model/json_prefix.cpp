// cider/model/json_prefix.cpp — see json_prefix.h.
#include "model/json_prefix.h"

#include <nlohmann/json.hpp>

#include <functional>

#include "core/error.h"
#include "model/unicode.h"

namespace cider::model {

namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// The texts of enum_node 0: the literals, chosen by their first byte.
const std::vector<std::string>& literal_texts() {
  static const std::vector<std::string> t = {"true", "false", "null"};
  return t;
}

uint64_t low_bits(size_t n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

}  // namespace

// ---- JsonSchema ----------------------------------------------------------------------------------------------------

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> s = [] {
    auto j = std::make_shared<JsonSchema>();
    j->nodes.resize(2);  // 0: any value, 1: any object
    j->nodes[1].types = kObject;
    return j;
  }();
  return s;
}

std::shared_ptr<const JsonSchema> JsonSchema::compile(const nlohmann::json& schema) {
  constexpr const char* kOp = "json_schema";
  constexpr int kMaxNesting = 16;  // well inside JsonPrefix::kMaxDepth: a container the schema asks for always fits
  auto out = std::make_shared<JsonSchema>();
  out->nodes.resize(1);  // node 0: any value
  std::function<uint16_t(const nlohmann::json&, const std::string&, int)> add =
      [&](const nlohmann::json& j, const std::string& at, int nesting) -> uint16_t {
    check(nesting <= kMaxNesting, ErrorCode::kInvalidArgument, kOp, "schemas may nest at most ", kMaxNesting,
          " levels; ", at, " is deeper");
    if (j.is_boolean() && j.get<bool>()) return 0;  // true: any value
    check(j.is_object(), ErrorCode::kInvalidArgument, kOp, "a schema must be an object (or true); got ",
          j.type_name(), " at ", at);
    check(out->nodes.size() < 60000, ErrorCode::kInvalidArgument, kOp, "the schema has too many parts");
    const size_t id = out->nodes.size();
    out->nodes.emplace_back();
    Node n;
    bool typed = false;
    for (const auto& [key, v] : j.items()) {
      const std::string here = at + (at == "/" ? "" : "/") + key;
      if (key == "title" || key == "description" || key == "default" || key == "examples" || key == "$schema" ||
          key == "$id" || key == "$comment") {
        continue;  // annotations
      }
      if (key == "type") {
        std::vector<nlohmann::json> names;
        if (v.is_array()) {
          for (const auto& x : v) names.push_back(x);
        } else {
          names.push_back(v);
        }
        check(!names.empty(), ErrorCode::kInvalidArgument, kOp, "'type' must name at least one type at ", here);
        n.types = 0;
        for (const auto& x : names) {
          check(x.is_string(), ErrorCode::kInvalidArgument, kOp, "'type' must be a type name or a list of them at ",
                here, "; got ", x.dump());
          const std::string t = x.get<std::string>();
          const uint8_t bit = t == "object" ? kObject : t == "array" ? kArray : t == "string" ? kString
                              : t == "number" ? kNumber : t == "integer" ? kInteger : t == "boolean" ? kBoolean
                              : t == "null" ? kNull : 0;
          check(bit != 0, ErrorCode::kInvalidArgument, kOp, "unknown type \"", t, "\" at ", here);
          n.types |= bit;
        }
        typed = true;
      } else if (key == "properties") {
        check(v.is_object(), ErrorCode::kInvalidArgument, kOp, "'properties' must be an object at ", here);
        check(v.size() <= static_cast<size_t>(kMaxProperties), ErrorCode::kInvalidArgument, kOp, "at most ",
              kMaxProperties, " properties per object; got ", v.size(), " at ", here);
        n.declared = true;
        for (const auto& [name, sub] : v.items()) {
          for (unsigned char c : name)
            check(c >= 0x20 && c != '"' && c != '\\', ErrorCode::kInvalidArgument, kOp,
                  "property names with quotes, backslashes or control characters are not supported; got ",
                  nlohmann::json(name).dump(), " at ", here);
          n.keys.push_back(name);
          n.key_nodes.push_back(add(sub, here + "/" + name, nesting + 1));
        }
      } else if (key == "required") {
        check(v.is_array(), ErrorCode::kInvalidArgument, kOp, "'required' must be a list of names at ", here);
      } else if (key == "additionalProperties") {
        check(v.is_boolean(), ErrorCode::kInvalidArgument, kOp,
              "'additionalProperties' must be true or false (a schema there is not supported) at ", here);
      } else if (key == "items") {
        check(v.is_object() || v.is_boolean(), ErrorCode::kInvalidArgument, kOp,
              "'items' must be one schema (tuples are not supported) at ", here);
        n.items = add(v, here, nesting + 1);
      } else if (key == "enum" || key == "const") {
        const nlohmann::json values = key == "const" ? nlohmann::json::array({v}) : v;
        check(values.is_array() && !values.empty() && values.size() <= static_cast<size_t>(kMaxEnum),
              ErrorCode::kInvalidArgument, kOp, "'enum' must list 1 to ", kMaxEnum, " values at ", here);
        for (const auto& x : values) n.enum_texts.push_back(x.dump());
      } else {
        check(false, ErrorCode::kInvalidArgument, kOp, "the keyword '", key, "' (at ", here,
              ") is not supported: cider's constrained decoding takes type, properties, required, "
              "additionalProperties, items, enum and const");
      }
    }
    if (!typed && n.declared) n.types = kObject;
    if (j.contains("required")) {
      for (const auto& r : j.at("required")) {
        check(r.is_string(), ErrorCode::kInvalidArgument, kOp, "'required' must list names at ", at);
        size_t i = 0;
        while (i < n.keys.size() && n.keys[i] != r.get<std::string>()) ++i;
        check(i < n.keys.size(), ErrorCode::kInvalidArgument, kOp, "required property ", r.dump(),
              " is not among the properties at ", at);
        n.required |= uint64_t{1} << i;
      }
    }
    out->nodes[id] = std::move(n);
    return static_cast<uint16_t>(id);
  };
  const uint16_t root = add(schema, "/", 0);
  check(root == 1 && out->nodes[1].types == kObject && out->nodes[1].enum_texts.empty(), ErrorCode::kInvalidArgument,
        kOp, "the schema's root must be an object type (\"type\": \"object\"), as OpenAI's structured outputs require");
  return out;
}

std::shared_ptr<const JsonSchema> JsonSchema::tool_call(const std::vector<std::string>& names,
                                                        const std::vector<std::shared_ptr<const JsonSchema>>& parameters,
                                                        const std::string& name_key, const std::string& args_key) {
  constexpr const char* kOp = "json_schema";
  check(!names.empty() && names.size() <= static_cast<size_t>(kMaxEnum) && names.size() == parameters.size(),
        ErrorCode::kInvalidArgument, kOp, "a tool call takes 1 to ", kMaxEnum, " tools, each with its parameters; got ",
        names.size(), " names and ", parameters.size(), " schemas");
  for (const std::string& k : {name_key, args_key})
    for (unsigned char c : k)
      check(c >= 0x20 && c != '"' && c != '\\', ErrorCode::kInvalidArgument, kOp, "tool call keys are plain text");
  check(name_key != args_key, ErrorCode::kInvalidArgument, kOp, "a tool call's two keys must differ");
  auto out = std::make_shared<JsonSchema>();
  out->nodes.resize(3);  // 0: any value, 1: the call before its name ({name_key} only), 2: the name, one of names
  Node& root = out->nodes[1];
  root.types = kObject;
  root.declared = true;
  root.keys = {name_key};
  root.key_nodes = {2};
  root.required = 1;
  out->nodes[2].types = kString;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string text = nlohmann::json(names[i]).dump();
    for (const std::string& t : out->nodes[2].enum_texts)
      check(t != text, ErrorCode::kInvalidArgument, kOp, "the tool name ", text, " is given twice");
    out->nodes[2].enum_texts.push_back(text);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const JsonSchema& p = *parameters[i];
    check(p.nodes.size() >= 2 && p.nodes[1].types == kObject && p.nodes[1].enum_texts.empty(),
          ErrorCode::kInvalidArgument, kOp, "the parameters of ", out->nodes[2].enum_texts[i], " must describe an object");
    check(out->nodes.size() + p.nodes.size() + 1 < 60000, ErrorCode::kInvalidArgument, kOp,
          "the tools' schemas have too many parts");
    // The parameters' nodes, renumbered: node 0 (any value) stays 0, node k > 0 becomes base + k - 1.
    const size_t base = out->nodes.size();
    const auto at = [&](uint16_t k) { return k == 0 ? uint16_t{0} : static_cast<uint16_t>(base + k - 1); };
    for (size_t k = 1; k < p.nodes.size(); ++k) {
      Node n = p.nodes[k];
      for (uint16_t& x : n.key_nodes) x = at(x);
      n.items = at(n.items);
      for (uint16_t& x : n.select) x = at(x);
      out->nodes.push_back(std::move(n));
    }
    Node name;  // the name once written (the variant's first key)
    name.types = kString;
    name.enum_texts = {out->nodes[2].enum_texts[i]};
    out->nodes.push_back(std::move(name));
    Node call;  // the call once its name is read: both keys, both required, the name already seen
    call.types = kObject;
    call.declared = true;
    call.keys = {name_key, args_key};
    call.key_nodes = {static_cast<uint16_t>(out->nodes.size() - 1), at(1)};
    call.required = 3;
    out->nodes.push_back(std::move(call));
    out->nodes[2].select.push_back(static_cast<uint16_t>(out->nodes.size() - 1));
  }
  return out;
}

// ---- JsonPrefix ----------------------------------------------------------------------------------------------------

JsonPrefix::JsonPrefix(const JsonSchema* schema) : schema_(schema ? schema : JsonSchema::any_object().get()) {}

bool JsonPrefix::whitespace_ok() { return ++ws_ <= kMaxWhitespace; }

void JsonPrefix::end_value() {
  mode_ = depth_ == 0 ? Mode::kDone : Mode::kCommaOrClose;
  ws_ = 0;
}

bool JsonPrefix::can_close_object() const {
  const JsonSchema::Node& n = node(nodes_[depth_ - 1]);
  return !n.declared || (n.required & ~seen_[depth_ - 1]) == 0;
}

bool JsonPrefix::more_keys() const {
  const JsonSchema::Node& n = node(nodes_[depth_ - 1]);
  return !n.declared || (low_bits(n.keys.size()) & ~seen_[depth_ - 1]) != 0;
}

bool JsonPrefix::key_start() {
  const JsonSchema::Node& n = node(nodes_[depth_ - 1]);
  if (n.declared) {
    cand_ = low_bits(n.keys.size()) & ~seen_[depth_ - 1];
    if (cand_ == 0) return false;
    text_pos_ = 0;
  }
  mode_ = Mode::kString;
  key_ = true;
  ws_ = 0;
  return true;
}

bool JsonPrefix::key_char(uint8_t c) {
  const JsonSchema::Node& n = node(nodes_[depth_ - 1]);
  uint64_t next = 0;
  for (uint64_t m = cand_; m != 0; m &= m - 1) {
    const auto i = static_cast<size_t>(__builtin_ctzll(m));
    if (n.keys[i].size() > text_pos_ && static_cast<uint8_t>(n.keys[i][text_pos_]) == c) next |= uint64_t{1} << i;
  }
  if (next == 0) return false;
  cand_ = next;
  ++text_pos_;
  return true;
}

bool JsonPrefix::key_end() {
  const JsonSchema::Node& n = node(nodes_[depth_ - 1]);
  if (!n.declared) {
    value_node_ = 0;  // any value under any key
  } else {
    size_t hit = n.keys.size();
    for (uint64_t m = cand_; m != 0; m &= m - 1) {
      const auto i = static_cast<size_t>(__builtin_ctzll(m));
      if (n.keys[i].size() == text_pos_) hit = i;
    }
    if (hit == n.keys.size()) return false;
    seen_[depth_ - 1] |= uint64_t{1} << hit;
    value_node_ = n.key_nodes[hit];
  }
  mode_ = Mode::kColon;
  ws_ = 0;
  return true;
}

bool JsonPrefix::value_start(uint8_t c) {
  ws_ = 0;
  const JsonSchema::Node& n = node(value_node_);
  if (!n.enum_texts.empty()) {
    uint64_t m = 0;
    for (size_t i = 0; i < n.enum_texts.size(); ++i)
      if (static_cast<uint8_t>(n.enum_texts[i][0]) == c) m |= uint64_t{1} << i;
    if (m == 0) return false;
    mode_ = Mode::kText;
    enum_node_ = value_node_;
    cand_ = m;
    text_pos_ = 1;
    return true;
  }
  const uint8_t t = n.types;
  switch (c) {
    case '{':
    case '[':
      if (!(t & (c == '{' ? JsonSchema::kObject : JsonSchema::kArray)) || depth_ >= kMaxDepth) return false;
      stack_[depth_] = static_cast<char>(c);
      nodes_[depth_] = value_node_;
      seen_[depth_] = 0;
      ++depth_;
      if (c == '{') {
        mode_ = Mode::kKeyOrClose;
      } else {
        mode_ = Mode::kValueOrClose;
        value_node_ = n.items;
      }
      return true;
    case '"':
      if (!(t & JsonSchema::kString)) return false;
      mode_ = Mode::kString;
      key_ = false;
      return true;
    case 't':
    case 'f':
    case 'n':
      if (!(t & (c == 'n' ? JsonSchema::kNull : JsonSchema::kBoolean))) return false;
      mode_ = Mode::kText;
      enum_node_ = 0;
      cand_ = uint64_t{1} << (c == 't' ? 0 : c == 'f' ? 1 : 2);
      text_pos_ = 1;
      return true;
    default:
      if (c != '-' && !is_digit(c)) return false;
      if (!(t & (JsonSchema::kNumber | JsonSchema::kInteger))) return false;
      integer_ = !(t & JsonSchema::kNumber);
      mode_ = c == '-' ? Mode::kNumMinus : c == '0' ? Mode::kNumZero : Mode::kNumInt;
      return true;
  }
}

bool JsonPrefix::after_number(uint8_t c) {
  end_value();  // a number is never the top-level value, so the mode is kCommaOrClose
  return feed(c);
}

bool JsonPrefix::feed(uint8_t c) {
  switch (mode_) {
    case Mode::kStart:
      if (is_ws(c)) return whitespace_ok();
      if (c != '{') return false;
      value_node_ = 1;
      return value_start(c);
    case Mode::kKeyOrClose:
    case Mode::kKey:
      if (is_ws(c)) return whitespace_ok();
      if (c == '"') return key_start();
      if (c == '}' && mode_ == Mode::kKeyOrClose && can_close_object()) {
        --depth_;
        end_value();
        return true;
      }
      return false;
    case Mode::kColon:
      if (is_ws(c)) return whitespace_ok();
      if (c != ':') return false;
      mode_ = Mode::kValue;
      ws_ = 0;
      return true;
    case Mode::kValue:
      if (is_ws(c)) return whitespace_ok();
      return value_start(c);
    case Mode::kValueOrClose:
      if (is_ws(c)) return whitespace_ok();
      if (c == ']') {
        --depth_;
        end_value();
        return true;
      }
      return value_start(c);
    case Mode::kCommaOrClose: {
      if (is_ws(c)) return whitespace_ok();
      const char open = stack_[depth_ - 1];
      if (c == ',') {
        if (open == '{') {
          if (!more_keys()) return false;
          mode_ = Mode::kKey;
        } else {
          mode_ = Mode::kValue;
          value_node_ = node(nodes_[depth_ - 1]).items;
        }
        ws_ = 0;
        return true;
      }
      if ((open == '{' && c == '}' && can_close_object()) || (open == '[' && c == ']')) {
        --depth_;
        end_value();
        return true;
      }
      return false;
    }
    case Mode::kString:
      if (key_ && node(nodes_[depth_ - 1]).declared) {  // a declared key: its bytes as written, no escapes
        if (c == '"') return key_end();
        return c != '\\' && c >= 0x20 && key_char(c);
      }
      if (c == '"') {
        if (key_) return key_end();
        end_value();
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::kEscape;
        return true;
      }
      if (c < 0x80) return c >= 0x20;  // control characters must be escaped
      {  // the lead byte of a UTF-8 sequence (no overlong forms, no surrogates, nothing past U+10FFFF)
        const int len = unicode::utf8_sequence_length(c, lo_, hi_);
        if (len < 2) return false;
        utf8_left_ = static_cast<uint8_t>(len - 1);
      }
      mode_ = Mode::kUtf8;
      return true;
    case Mode::kUtf8:
      if (c < lo_ || c > hi_) return false;
      lo_ = 0x80, hi_ = 0xBF;
      if (--utf8_left_ == 0) mode_ = Mode::kString;
      return true;
    case Mode::kEscape:
      if (c == 'u') {
        mode_ = Mode::kHex;
        hex_left_ = 4;
        high_ = false;
        return true;
      }
      if (low_next_) return false;  // a high surrogate's pair must follow
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        mode_ = Mode::kString;
        return true;
      }
      return false;
    case Mode::kHex: {
      // Surrogates come in pairs (\uD800-\uDBFF then \uDC00-\uDFFF), refused at the first digit that breaks that,
      // so no accepted prefix is a dead end.
      if (!is_hex(c)) return false;
      const uint8_t pos = static_cast<uint8_t>(4 - hex_left_);
      const bool d = c == 'd' || c == 'D';
      if (pos == 0 && low_next_ && !d) return false;
      if (pos == 0) first_d_ = d;
      if (pos == 1 && first_d_) {
        const bool low = (c >= 'c' && c <= 'f') || (c >= 'C' && c <= 'F');
        const bool high = c == '8' || c == '9' || (c >= 'a' && c <= 'b') || (c >= 'A' && c <= 'B');
        if (low != low_next_) return false;  // a lone low surrogate, or a pair's second half that is not low
        high_ = high;
      } else if (pos == 1 && low_next_) {
        return false;
      }
      if (--hex_left_ == 0) {
        low_next_ = high_;
        mode_ = high_ ? Mode::kLowBackslash : Mode::kString;
      }
      return true;
    }
    case Mode::kLowBackslash:
      if (c != '\\') return false;
      mode_ = Mode::kEscape;
      return true;
    case Mode::kNumMinus:
      if (c == '0') {
        mode_ = Mode::kNumZero;
        return true;
      }
      if (c >= '1' && c <= '9') {
        mode_ = Mode::kNumInt;
        return true;
      }
      return false;
    case Mode::kNumZero:
    case Mode::kNumInt:
      if (mode_ == Mode::kNumInt && is_digit(c)) return true;
      if (c == '.' || c == 'e' || c == 'E') {
        if (integer_) return false;
        mode_ = c == '.' ? Mode::kNumDot : Mode::kNumExp;
        return true;
      }
      return after_number(c);
    case Mode::kNumDot:
      if (!is_digit(c)) return false;
      mode_ = Mode::kNumFrac;
      return true;
    case Mode::kNumFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        mode_ = Mode::kNumExp;
        return true;
      }
      return after_number(c);
    case Mode::kNumExp:
      if (c == '+' || c == '-') {
        mode_ = Mode::kNumExpSign;
        return true;
      }
      [[fallthrough]];
    case Mode::kNumExpSign:
      if (!is_digit(c)) return false;
      mode_ = Mode::kNumExpInt;
      return true;
    case Mode::kNumExpInt:
      if (is_digit(c)) return true;
      return after_number(c);
    case Mode::kText: {
      // Candidates that go on with c; else, if one candidate is whole, the value ended before c.
      const std::vector<std::string>& texts = enum_node_ == 0 ? literal_texts() : node(enum_node_).enum_texts;
      uint64_t next = 0;
      bool whole = false;
      for (uint64_t m = cand_; m != 0; m &= m - 1) {
        const std::string& t = texts[static_cast<size_t>(__builtin_ctzll(m))];
        if (t.size() > text_pos_ && static_cast<uint8_t>(t[text_pos_]) == c) next |= m & (~m + 1);
        if (t.size() == text_pos_) whole = true;
      }
      if (next != 0) {
        cand_ = next;
        ++text_pos_;
        return true;
      }
      if (!whole) return false;
      if (enum_node_ != 0 && !node(enum_node_).select.empty() && stack_[depth_ - 1] == '{') {
        // A name that picks its object's schema (JsonSchema::tool_call): the object goes on as the variant of the
        // candidate that is whole (texts of distinct JSON strings: one at most).
        for (uint64_t m = cand_; m != 0; m &= m - 1) {
          const auto i = static_cast<size_t>(__builtin_ctzll(m));
          if (texts[i].size() == text_pos_) nodes_[depth_ - 1] = node(enum_node_).select[i];
        }
      }
      end_value();  // never the top-level value
      return feed(c);
    }
    case Mode::kDone:
      return false;
  }
  return false;
}

}  // namespace cider::model
