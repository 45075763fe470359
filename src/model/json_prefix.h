// cider/model/json_prefix.h — a byte-level recognizer of JSON text whose top-level value is an object (RFC 8259), for
// constrained decoding (the server's response_format {"type": "json_object"}): a token may be sampled only when the
// bytes it adds keep the reply a prefix of such a text, and the reply ends when the object closes.
//
// What it accepts: optional whitespace, then one object, nothing after it. Inside: objects, arrays, strings with the
// escapes \" \\ \/ \b \f \n \r \t \uXXXX and well-formed UTF-8 (RFC 3629), numbers as the RFC writes them, true,
// false, null. Two limits a model could otherwise run
// into forever, both refused: at most kMaxDepth nested objects and arrays, and at most kMaxWhitespace whitespace bytes
// in a row outside strings (llama.cpp's JSON grammar bounds whitespace the same way).
//
// The state is a small trivially copyable value: a caller tests a token by copying it and feeding the token's bytes.
#pragma once

#include <cstdint>
#include <string_view>

namespace cider::model {

class JsonPrefix {
 public:
  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxWhitespace = 24;

  // Feeds one byte; false when no JSON object text starts with the bytes so far plus this one (the state is then
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

 private:
  enum class Mode : uint8_t {
    kStart,          // before the top-level object: whitespace or '{'
    kKeyOrClose,     // after '{': a key or '}'
    kKey,            // after ',' in an object: a key
    kColon,          // after a key
    kValue,          // a value (after ':' or '[' or ',' in an array)
    kValueOrClose,   // after '[': a value or ']'
    kCommaOrClose,   // after a value inside a container
    kString,         // inside a string
    kUtf8,           // inside a multi-byte UTF-8 character of a string (utf8_left_ bytes to go)
    kEscape,         // after '\' in a string
    kHex,            // in a \u escape (hex_left digits to go)
    kNumMinus,       // after '-'
    kNumZero,        // a leading 0
    kNumInt,         // integer digits
    kNumDot,         // after '.'
    kNumFrac,        // fraction digits
    kNumExp,         // after 'e' / 'E'
    kNumExpSign,     // after the exponent's sign
    kNumExpInt,      // exponent digits
    kLiteral,        // inside true / false / null
    kDone,
  };
  bool whitespace_ok();          // one more whitespace byte in a row, within the bound
  void end_value();              // a value ended: back to the container (or done)
  bool value_start(uint8_t c);   // c begins a value
  bool after_number(uint8_t c);  // a number ended at c (not part of it): c continues after the value

  Mode mode_ = Mode::kStart;
  bool key_ = false;             // the string being read is an object key
  uint8_t depth_ = 0;
  uint8_t ws_ = 0;               // whitespace bytes in a row
  uint8_t hex_left_ = 0;
  uint8_t utf8_left_ = 0;        // continuation bytes to go, the next one in [lo_, hi_]
  uint8_t lo_ = 0x80, hi_ = 0xBF;
  uint8_t literal_ = 0;          // 0 true, 1 false, 2 null
  uint8_t literal_pos_ = 0;      // bytes of it read
  char stack_[kMaxDepth] = {};   // '{' or '[' per open container
};

}  // namespace cider::model
