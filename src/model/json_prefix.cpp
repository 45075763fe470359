// cider/model/json_prefix.cpp — see json_prefix.h.
#include "model/json_prefix.h"

namespace cider::model {

namespace {

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

constexpr std::string_view kLiterals[3] = {"true", "false", "null"};

}  // namespace

bool JsonPrefix::whitespace_ok() { return ++ws_ <= kMaxWhitespace; }

void JsonPrefix::end_value() {
  mode_ = depth_ == 0 ? Mode::kDone : Mode::kCommaOrClose;
  ws_ = 0;
}

bool JsonPrefix::value_start(uint8_t c) {
  ws_ = 0;
  switch (c) {
    case '{':
    case '[':
      if (depth_ >= kMaxDepth) return false;
      stack_[depth_++] = static_cast<char>(c);
      mode_ = c == '{' ? Mode::kKeyOrClose : Mode::kValueOrClose;
      return true;
    case '"':
      mode_ = Mode::kString;
      key_ = false;
      return true;
    case '-': mode_ = Mode::kNumMinus; return true;
    case '0': mode_ = Mode::kNumZero; return true;
    case 't':
    case 'f':
    case 'n':
      mode_ = Mode::kLiteral;
      literal_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      literal_pos_ = 1;
      return true;
    default:
      if (c >= '1' && c <= '9') {
        mode_ = Mode::kNumInt;
        return true;
      }
      return false;
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
      return value_start(c);
    case Mode::kKeyOrClose:
    case Mode::kKey:
      if (is_ws(c)) return whitespace_ok();
      if (c == '"') {
        mode_ = Mode::kString;
        key_ = true;
        ws_ = 0;
        return true;
      }
      if (c == '}' && mode_ == Mode::kKeyOrClose) {
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
        mode_ = open == '{' ? Mode::kKey : Mode::kValue;
        ws_ = 0;
        return true;
      }
      if ((open == '{' && c == '}') || (open == '[' && c == ']')) {
        --depth_;
        end_value();
        return true;
      }
      return false;
    }
    case Mode::kString:
      if (c == '"') {
        if (key_) {
          mode_ = Mode::kColon;
          ws_ = 0;
        } else {
          end_value();
        }
        return true;
      }
      if (c == '\\') {
        mode_ = Mode::kEscape;
        return true;
      }
      if (c < 0x80) return c >= 0x20;  // control characters must be escaped
      // The lead byte of a UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
      lo_ = 0x80, hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        utf8_left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        utf8_left_ = 2;
        if (c == 0xE0) lo_ = 0xA0;
        if (c == 0xED) hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        utf8_left_ = 3;
        if (c == 0xF0) lo_ = 0x90;
        if (c == 0xF4) hi_ = 0x8F;
      } else {
        return false;
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
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        mode_ = Mode::kString;
        return true;
      }
      return false;
    case Mode::kHex:
      if (!is_hex(c)) return false;
      if (--hex_left_ == 0) mode_ = Mode::kString;
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
      if (c == '.') {
        mode_ = Mode::kNumDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        mode_ = Mode::kNumExp;
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
    case Mode::kLiteral: {
      const std::string_view lit = kLiterals[literal_];
      if (c != static_cast<uint8_t>(lit[literal_pos_])) return false;
      if (++literal_pos_ == lit.size()) end_value();
      return true;
    }
    case Mode::kDone:
      return false;
  }
  return false;
}

}  // namespace cider::model
