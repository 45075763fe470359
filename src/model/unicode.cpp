// cider/model/unicode.cpp — see unicode.h.
#include "model/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <memory>
#include <vector>

#include "core/error.h"

namespace cider::model::unicode {

namespace {

struct CccRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;  // second == 0: a singleton decomposition
};
struct Composition {
  char32_t first, second, composite;
};

#include "model/unicode_data.inc"

// Hangul syllables decompose and compose arithmetically (Unicode §3.12), so the tables leave them out.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;  // nothing below U+0300 combines: the common case stays cheap
  auto it = std::upper_bound(std::begin(kCccRanges), std::end(kCccRanges), c,
                             [](char32_t v, const CccRange& r) { return v < r.first; });
  if (it == std::begin(kCccRanges)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

const Decomposition* find_decomposition(char32_t c) {
  auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                             [](const Decomposition& d, char32_t v) { return d.cp < v; });
  return (it != std::end(kDecompositions) && it->cp == c) ? &*it : nullptr;
}

void decompose(char32_t c, std::u32string& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* d = c < 0xC0 ? nullptr : find_decomposition(c);
  if (d == nullptr) {
    out.push_back(c);
    return;
  }
  decompose(d->first, out);  // decompositions are applied fully (they nest, e.g. U+1E69 -> s + dot + dot)
  if (d->second != 0) decompose(d->second, out);
}

// The primary composite of (a, b), or 0.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
                             [](const Composition& c, const std::pair<char32_t, char32_t>& v) {
                               return c.first != v.first ? c.first < v.first : c.second < v.second;
                             });
  return (it != std::end(kCompositions) && it->first == a && it->second == b) ? it->composite : 0;
}

constexpr std::array<char32_t, 256> make_byte_table() {
  std::array<char32_t, 256> t{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return t;
}
constexpr std::array<char32_t, 256> kByteToChar = make_byte_table();

}  // namespace

size_t decode_utf8(std::string_view s, size_t pos, char32_t& cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  size_t len;
  char32_t min;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2, min = 0x80, cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3, min = 0x800, cp = b0 & 0x0Fu;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4, min = 0x10000, cp = b0 & 0x07u;
  } else {
    return 0;
  }
  if (pos + len > s.size()) return 0;
  for (size_t i = 1; i < len; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  char32_t cp;
  while (i < s.size()) {
    const size_t n = decode_utf8(s, i, cp);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

int utf8_sequence_length(uint8_t b0, uint8_t& lo, uint8_t& hi) {
  lo = 0x80, hi = 0xBF;
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) return 2;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
    return 4;
  }
  return 0;
}

namespace {
// Length of the maximal subpart of an ill-formed sequence at pos: the longest prefix of a well-formed sequence
// (at least 1 byte). The second-byte ranges follow Table 3-7 of the Unicode standard.
size_t maximal_subpart(std::string_view s, size_t pos) {
  uint8_t lo = 0x80, hi = 0xBF;
  const auto len = static_cast<size_t>(utf8_sequence_length(static_cast<uint8_t>(s[pos]), lo, hi));
  if (len < 2) return 1;
  size_t i = 1;
  for (; i < len && pos + i < s.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  return i;
}
}  // namespace

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  char32_t cp;
  while (i < bytes.size()) {
    const size_t n = decode_utf8(bytes, i, cp);
    if (n != 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      append_utf8(out, kReplacementChar);
      i += maximal_subpart(bytes, i);
    }
  }
  return out;
}

char32_t byte_to_char(uint8_t b) { return kByteToChar[b]; }

int char_to_byte(char32_t c) {
  static const std::vector<int> inverse = [] {
    std::vector<int> v(512, -1);
    for (int b = 0; b < 256; ++b) v[kByteToChar[static_cast<size_t>(b)]] = b;
    return v;
  }();
  return c < inverse.size() ? inverse[c] : -1;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  // Outside ASCII, Unicode's \w (UTS #18, what HF's regex-based word test uses): Alphabetic, marks, decimal
  // digits, connector punctuation and the joiners ZWNJ/ZWJ. PCRE2's tables answer the properties.
  struct Deleter {
    void operator()(pcre2_code* p) const { pcre2_code_free(p); }
  };
  static const std::unique_ptr<pcre2_code, Deleter> re = [] {
    int err = 0;
    PCRE2_SIZE off = 0;
    const char* pattern = R"(^[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])";
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    check(code != nullptr, ErrorCode::kInternal, "unicode::is_word_char", "PCRE2 rejected the word pattern; code ",
          err);
    return std::unique_ptr<pcre2_code, Deleter>(code);
  }();
  std::string s;
  append_utf8(s, c);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re.get(), nullptr);
  const int rc = pcre2_match(re.get(), reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md, nullptr);
  pcre2_match_data_free(md);
  return rc >= 0;
}

std::string nfc(std::string_view s) {
  // Fast path: ASCII is unchanged by NFC (nothing below U+0300 combines, nothing ASCII decomposes).
  if (std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<uint8_t>(ch) < 0x80; })) {
    return std::string(s);
  }
  std::u32string d;
  d.reserve(s.size());
  size_t i = 0;
  char32_t cp;
  while (i < s.size()) {
    const size_t n = decode_utf8(s, i, cp);
    CIDER_DEBUG_ASSERT(n != 0);
    decompose(cp, d);
    i += n;
  }
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t a = 0; a < d.size();) {
    if (combining_class(d[a]) == 0) {
      ++a;
      continue;
    }
    size_t b = a;
    while (b < d.size() && combining_class(d[b]) != 0) ++b;
    std::stable_sort(d.begin() + static_cast<std::ptrdiff_t>(a), d.begin() + static_cast<std::ptrdiff_t>(b),
                     [](char32_t x, char32_t y) { return combining_class(x) < combining_class(y); });
    a = b;
  }
  // Canonical composition: each character joins the last starter unless a character in between blocks it
  // (has a combining class of 0 or not lower than its own).
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;
  int last_ccc = -1;
  for (char32_t c : d) {
    const int ccc = combining_class(c);
    if (starter != std::u32string::npos) {
      const bool blocked = last_ccc != -1 && (last_ccc == 0 || last_ccc >= ccc);
      if (!blocked) {
        const char32_t comp = compose_pair(out[starter], c);
        if (comp != 0) {
          out[starter] = comp;
          continue;
        }
      }
    }
    if (ccc == 0) {
      starter = out.size();
      last_ccc = -1;
    } else {
      last_ccc = ccc;
    }
    out.push_back(c);
  }
  std::string r;
  r.reserve(s.size());
  for (char32_t c : out) append_utf8(r, c);
  return r;
}

}  // namespace cider::model::unicode
