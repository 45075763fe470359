// cider/model/unicode.h — the UTF-8 and Unicode pieces the tokenizer needs: decoding/encoding code points, lossy
// repair of invalid UTF-8 (as Rust's String::from_utf8_lossy does, which is what Hugging Face decoders produce),
// the GPT-2 byte-to-unicode alphabet, White_Space and word-character tests, and NFC normalization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cider::model::unicode {

constexpr char32_t kReplacementChar = 0xFFFD;

// Length in bytes (1..4) of the well-formed UTF-8 sequence starting at s[pos], with its code point in `cp`; 0 when
// the bytes at pos do not start one (overlong forms, surrogates, values past U+10FFFF and truncations included).
size_t decode_utf8(std::string_view s, size_t pos, char32_t& cp);

void append_utf8(std::string& out, char32_t cp);

// The bytes of a well-formed UTF-8 sequence that b0 leads (Table 3-7 of the Unicode standard): 1 for ASCII, 2..4 for
// a lead byte, with the range [lo, hi] its second byte must fall in (later bytes: 0x80..0xBF); 0 for a byte that
// starts no sequence (a continuation byte, 0xC0, 0xC1, 0xF5 and above).
int utf8_sequence_length(uint8_t b0, uint8_t& lo, uint8_t& hi);

// Offset of the first byte that is not part of well-formed UTF-8, or std::string_view::npos.
size_t find_invalid_utf8(std::string_view s);

// The bytes with every maximal ill-formed subpart replaced by one U+FFFD (the Unicode "maximal subpart" practice).
std::string utf8_lossy(std::string_view bytes);

// GPT-2's byte-level alphabet: each byte maps to a printable code point (printable Latin-1 bytes to themselves,
// the others to U+0100 + n), so that any byte string becomes a string of visible characters.
char32_t byte_to_char(uint8_t b);
int char_to_byte(char32_t c);  // the byte, or -1 if c is not in the alphabet

// Unicode White_Space (what Rust's char::is_whitespace tests).
bool is_whitespace(char32_t c);
// Unicode \w (Alphabetic, marks, decimal digits, connector punctuation, ZWNJ/ZWJ): the word characters that
// decide whether a single_word added token stands alone.
bool is_word_char(char32_t c);

// Canonical composition (NFC) of well-formed UTF-8.
std::string nfc(std::string_view s);

}  // namespace cider::model::unicode
