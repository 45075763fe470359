// cider/model/json_prefix.h — a byte-level recognizer of JSON text whose top-level value is an object (RFC 8259),
// optionally one that a JSON Schema describes, for constrained decoding (the server's response_format json_object /
// json_schema): a token may be sampled only when the bytes it adds keep the reply a prefix of such a text, and the
// reply ends when the object closes.
//
// What it accepts: optional whitespace, then one object, nothing after it. Inside: objects, arrays, strings with the
// escapes \" \\ \/ \b \f \n \r \t \uXXXX (surrogates in pairs) and well-formed UTF-8 (RFC 3629), numbers as the
// RFC writes them, true, false, null. No accepted prefix is a dead end: some byte always continues it. Two limits a
// model could otherwise run into forever, both refused: at most kMaxDepth nested objects and arrays, and at most
// kMaxWhitespace whitespace bytes in a row outside strings (llama.cpp's JSON grammar bounds whitespace the same way).
//
// With a schema (JsonSchema::compile, or JsonSchema::tool_call for one tool call) it accepts a subset of the texts
// the schema allows — every text it accepts is valid against the schema, not every valid text is accepted: objects
// hold only declared properties (each at most once, any order; `required` ones before the object may close), keys
// are written without escapes, `enum` / `const` values exactly as nlohmann::json::dump() writes them. Supported keywords: type (a name or a list of names),
// properties, required, additionalProperties (false, true or absent: declared properties only either way), items,
// enum, const; annotations (title, description, default, examples, $schema, $id, $comment) are ignored. Any other
// keyword (pattern, minLength, minimum, anyOf, $ref, …) would constrain values this recognizer does not check, so
// compile() refuses it by name rather than produce a text the schema rejects.
//
// The state is a small trivially copyable value (the schema is referenced, not owned): a caller tests a token by
// copying it and feeding the token's bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace cider::model {

class JsonSchema {
 public:
  // Type bits of a node.
  static constexpr uint8_t kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32, kNull = 64;
  static constexpr uint8_t kAnyType = 127;
  static constexpr int kMaxProperties = 64;   // per object
  static constexpr int kMaxEnum = 64;         // values per enum
  struct Node {
    uint8_t types = kAnyType;
    std::vector<std::string> enum_texts;      // non-empty: the value is one of these texts, byte for byte
    bool declared = false;                    // an object with declared properties (only those keys)
    std::vector<std::string> keys;            // declared property names
    std::vector<uint16_t> key_nodes;          // their value nodes
    uint64_t required = 0;                    // bit i: keys[i] must appear
    uint16_t items = 0;                       // array elements' node
    // Non-empty (tool_call() only, an enum of strings): when enum value i has been read as a property's value, the
    // enclosing object goes on as node select[i] (its keys seen so far kept) — the name of a call picks the schema of
    // its arguments.
    std::vector<uint16_t> select;
  };
  // Node 0: any value. Node 1: the root, an object.
  std::vector<Node> nodes;

  // Any JSON object (response_format json_object).
  static std::shared_ptr<const JsonSchema> any_object();
  // The schema, whose root must describe an object; throws cider::Error (kInvalidArgument, op "json_schema") naming
  // the unsupported keyword or bad value and its JSON pointer.
  static std::shared_ptr<const JsonSchema> compile(const nlohmann::json& schema);
  // One tool call (the server's tool_choice "required" or a named function): an object with exactly two keys,
  // `name_key` first — its value one of `names` — then `args_key`, whose value the schema of the tool named allows
  // (`parameters[i]`, a compile() result, for names[i]). Not anyOf: the name, written first, decides the arguments'
  // schema deterministically (Node::select), so the recognizer keeps one state, and no dead ends. Throws cider::Error
  // (kInvalidArgument, op "json_schema") for no names or more than kMaxEnum, a name twice, or sizes that differ.
  static std::shared_ptr<const JsonSchema> tool_call(const std::vector<std::string>& names,
                                                     const std::vector<std::shared_ptr<const JsonSchema>>& parameters,
                                                     const std::string& name_key, const std::string& args_key);
};

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 24;

  // Any object when schema is null; otherwise the schema must outlive the recognizer and its copies.
  explicit JsonPrefix(const JsonSchema* schema = nullptr);

  // Feeds one byte; false when no accepted text starts with the bytes so far plus this one (the state is then
  // unspecified: feed a copy).
  bool feed(uint8_t c);
  // Feeds every byte (stops at the first refused one).
  bool feed(std::string_view bytes) {
    for (char ch : bytes)
      if (!feed(static_cast<uint8_t>(ch))) return false;
    return true;
  }
  // A whole object has been read (nothing may follow).
  bool complete() const { return mode_ == Mode::kDone; }
  // Inside a string value that takes any text: bytes without '"', '\\', control characters or a UTF-8 lead byte
  // keep it there (callers skip copying the state for such tokens).
  bool in_free_string() const { return mode_ == Mode::kString && !key_; }

 private:
  enum class Mode : uint8_t {
    kStart,          // before the top-level object: whitespace or '{'
    kKeyOrClose,     // after '{': a key or '}'
    kKey,            // after ',' in an object: a key
    kColon,          // after a key
    kValue,          // a value (after ':' or '[' or ',' in an array)
    kValueOrClose,   // after '[': a value or ']'
    kCommaOrClose,   // after a value inside a container
    kString,         // inside a string (a key, a free string value)
    kUtf8,           // inside a multi-byte UTF-8 character of a string (utf8_left_ bytes to go)
    kEscape,         // after '\' in a string
    kHex,            // in a \u escape (hex_left_ digits to go)
    kLowBackslash,   // after a high surrogate's escape: its low half's '\' must follow
    kNumMinus,       // after '-'
    kNumZero,        // a leading 0
    kNumInt,         // integer digits
    kNumDot,         // after '.'
    kNumFrac,        // fraction digits
    kNumExp,         // after 'e' / 'E'
    kNumExpSign,     // after the exponent's sign
    kNumExpInt,      // exponent digits
    kText,           // inside true / false / null or an enum value: matching the candidate texts
    kDone,
  };
  const JsonSchema::Node& node(uint16_t i) const { return schema_->nodes[i]; }
  bool whitespace_ok();          // one more whitespace byte in a row, within the bound
  void end_value();              // a value ended: back to the container (or done)
  bool value_start(uint8_t c);   // c begins a value of node value_node_
  bool after_number(uint8_t c);  // a number ended at c (not part of it): c continues after the value
  bool key_start();              // '"' of a key in the current object
  bool key_char(uint8_t c);      // a byte of a declared key
  bool key_end();                // the key's closing '"'
  bool can_close_object() const;
  bool more_keys() const;        // a declared object has keys left to write

  const JsonSchema* schema_;
  Mode mode_ = Mode::kStart;
  bool key_ = false;             // the string being read is an object key
  bool integer_ = false;         // the number being read must be an integer
  uint8_t depth_ = 0;
  uint8_t ws_ = 0;               // whitespace bytes in a row
  uint8_t hex_left_ = 0;
  bool first_d_ = false;         // the \u escape's first digit is d / D
  bool high_ = false;            // the \u escape is a high surrogate
  bool low_next_ = false;        // the next \u escape must be a low surrogate
  uint8_t utf8_left_ = 0;        // continuation bytes to go, the next one in [lo_, hi_]
  uint8_t lo_ = 0x80, hi_ = 0xBF;
  uint16_t value_node_ = 1;      // the node of the value that comes next
  uint16_t enum_node_ = 0;       // kText: the node whose enum texts are matched (0: true / false / null)
  uint16_t text_pos_ = 0;        // kText / declared keys: bytes matched so far
  uint64_t cand_ = 0;            // kText: candidate texts; declared keys: candidate keys
  char stack_[kMaxDepth] = {};   // '{' or '[' per open container
  uint16_t nodes_[kMaxDepth] = {};   // each container's node
  uint64_t seen_[kMaxDepth] = {};    // objects with declared keys: the keys written
};

}  // namespace cider::model
