// cider/model/tokenizer.cpp — see tokenizer.h and docs/tokenizer.md.
//
// The encode pipeline mirrors Hugging Face `tokenizers`, stage by stage, because token ids must be identical:
//   1. added tokens whose `normalized` flag is false are cut out of the raw text (leftmost, then longest match);
//   2. each remaining piece is normalized, then added tokens with `normalized` true are cut out of it;
//   3. each remaining piece is pre-tokenized into words (regex splits, Metaspace, the byte-level alphabet);
//   4. each word goes through the BPE model (merges by rank, or by score for GGUF "llama" vocabularies);
//   5. the post-processor adds BOS/EOS when add_special is set.
// Decoding runs the decoder chain (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace) on token strings.
#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "core/limits.h"
#include "model/gguf.h"
#include "model/json_brief.h"
#include "model/unicode.h"

namespace cider::model {

namespace {

using json = nlohmann::json;
namespace uni = cider::model::unicode;

constexpr const char* kOpJson = "tokenizer.from_json";
constexpr const char* kOpGguf = "tokenizer.from_gguf";

// ---------------------------------------------------------------------------------------------------------------
// Oniguruma character classes in PCRE2 terms.
//
// HF `tokenizers` compiles Split patterns with Oniguruma (Ruby syntax), whose bracket classes may nest
// (BLOOM: ` ?[^(\s|[.,!?…。，、।۔،])]+`) and intersect (Kimi K2: `[\p{Lu}\p{M}&&[^\p{Han}]]`). PCRE2 10.42 has
// neither, so such a class is rewritten into a group that matches exactly one character of the same set:
//   a union with nested classes  -> its plain members joined in one class, plus an alternative per nested class
//                                   that cannot be merged (a negated or intersected one);
//   A && B                       -> (?:(?=A)B);
//   [^E] for a compound E         -> (?:(?!E)(?s:.)).
// Every class without nesting or "&&" is copied unchanged, so the usual patterns reach PCRE2 as written.

namespace onig {

struct ClassExpr;

// One operand of "&&": plain members (ranges, escapes, POSIX brackets, each already safe to paste into any class)
// and nested classes.
struct ClassUnion {
  std::string members;
  std::vector<ClassExpr> nested;
};

struct ClassExpr {
  bool negated = false;
  std::vector<ClassUnion> operands;  // intersected; one for a class without "&&"
  bool simple() const { return operands.size() == 1 && operands[0].nested.empty(); }
};

[[noreturn]] void bad_class(const std::string& pattern, size_t pos, const char* what, const char* op) {
  fail(ErrorCode::kUnsupported, op, "regex character class must be well formed (", what, " at offset ", pos,
       "); got ", pattern);
}

// The UTF-8 character at p[i] (one byte when malformed; PCRE2 reports that later).
size_t char_len(const std::string& p, size_t i) {
  char32_t cp;
  const size_t n = uni::decode_utf8(p, i, cp);
  return n == 0 ? 1 : n;
}

// A backslash escape at p[i] inside a class: \p{..}, \P{..}, \x{..}, \xHH, \uHHHH (Ruby; PCRE2 spells it \x{HHHH})
// or a single escaped character. Returns its PCRE2 text; `single` tells whether it denotes one character (so it
// may end a range).
std::string class_escape(const std::string& p, size_t& i, bool& single, const char* op) {
  if (i + 1 >= p.size()) bad_class(p, i, "a trailing backslash", op);
  const char c = p[i + 1];
  if ((c == 'p' || c == 'P' || c == 'x') && i + 2 < p.size() && p[i + 2] == '{') {
    const size_t close = p.find('}', i + 3);
    if (close == std::string::npos) bad_class(p, i, "an unclosed \\p{ or \\x{", op);
    std::string out = p.substr(i, close + 1 - i);
    single = c == 'x';
    i = close + 1;
    return out;
  }
  if (c == 'u' && i + 6 <= p.size() &&
      std::all_of(p.begin() + i + 2, p.begin() + i + 6, [](char h) { return std::isxdigit(static_cast<uint8_t>(h)); })) {
    std::string out = "\\x{" + p.substr(i + 2, 4) + "}";
    single = true;
    i += 6;
    return out;
  }
  const size_t n = char_len(p, i + 1);
  std::string out = p.substr(i, 1 + n);
  // Class shorthands (\s, \d, \w, \h and their negations) stand for sets, not one character.
  single = std::string_view("sSdDwWhH").find(c) == std::string_view::npos;
  i += 1 + n;
  return out;
}

// Nesting deeper than this is refused (no real pattern comes close; the recursion stays shallow).
constexpr int kMaxClassDepth = 32;

// Parses the class that starts at p[i] == '['; on return i is just past its closing ']'.
ClassExpr parse_class(const std::string& p, size_t& i, const char* op, int depth = 0) {
  const size_t start = i;
  if (depth >= kMaxClassDepth) bad_class(p, start, "classes nested too deep", op);
  ClassExpr cls;
  ++i;
  if (i < p.size() && p[i] == '^') {
    cls.negated = true;
    ++i;
  }
  cls.operands.emplace_back();
  bool first = true;  // a ']' right after '[' or '[^' is a literal
  while (true) {
    if (i >= p.size()) bad_class(p, start, "an unclosed [", op);
    ClassUnion& u = cls.operands.back();
    const char c = p[i];
    if (c == ']' && !first) {
      ++i;
      break;
    }
    first = false;
    if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      cls.operands.emplace_back();
      i += 2;
      continue;
    }
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX bracket [:alpha:]
      const size_t close = p.find(":]", i + 2);
      if (close == std::string::npos) bad_class(p, i, "an unclosed [:", op);
      u.members += p.substr(i, close + 2 - i);
      i = close + 2;
      continue;
    }
    if (c == '[') {
      u.nested.push_back(parse_class(p, i, op, depth + 1));
      continue;
    }
    // One member: a character or escape, perhaps the start of a range a-b.
    bool single = true;
    std::string lo;
    if (c == '\\') {
      lo = class_escape(p, i, single, op);
    } else {
      const size_t n = char_len(p, i);
      lo = p.substr(i, n);
      i += n;
      // Characters special somewhere in a class are escaped, so that members stay valid wherever they are pasted.
      if (lo == "-" || lo == "^" || lo == "]" || lo == "[") lo = "\\" + lo;
    }
    if (single && i + 1 < p.size() && p[i] == '-' && p[i + 1] != ']' && p[i + 1] != '[' &&
        !(p[i + 1] == '&' && i + 2 < p.size() && p[i + 2] == '&')) {
      ++i;
      std::string hi;
      if (p[i] == '\\') {
        bool hi_single = true;
        hi = class_escape(p, i, hi_single, op);
        if (!hi_single) bad_class(p, i, "a range that ends in a set", op);
      } else {
        const size_t n = char_len(p, i);
        hi = p.substr(i, n);
        i += n;
        if (hi == "^" || hi == "-") hi = "\\" + hi;
      }
      u.members += lo + "-" + hi;
    } else {
      u.members += lo;
    }
  }
  return cls;
}

std::string emit_class(const ClassExpr& cls);

// One character of the union: plain members and simple non-negated nested classes merged into one class,
// the other nested classes as alternatives.
std::string emit_union(const ClassUnion& u) {
  std::string members = u.members;
  std::vector<std::string> alts;
  for (const ClassExpr& n : u.nested) {
    if (n.simple() && !n.negated) {
      members += n.operands[0].members;
    } else {
      alts.push_back(emit_class(n));
    }
  }
  if (!members.empty()) alts.insert(alts.begin(), "[" + members + "]");
  if (alts.empty()) return "(?!)";  // an empty class matches nothing
  if (alts.size() == 1) return alts[0];
  std::string out = "(?:";
  for (size_t k = 0; k < alts.size(); ++k) out += (k ? "|" : "") + alts[k];
  return out + ")";
}

std::string emit_class(const ClassExpr& cls) {
  if (cls.simple()) return std::string(cls.negated ? "[^" : "[") + cls.operands[0].members + "]";
  // A union whose nested classes are all plain flattens into one class (BLOOM's [^(\s|[.,!?])] -> [^(\s|).,!?]).
  if (cls.operands.size() == 1 &&
      std::all_of(cls.operands[0].nested.begin(), cls.operands[0].nested.end(),
                  [](const ClassExpr& n) { return n.simple() && !n.negated; })) {
    std::string members = cls.operands[0].members;
    for (const ClassExpr& n : cls.operands[0].nested) members += n.operands[0].members;
    if (!members.empty()) return std::string(cls.negated ? "[^" : "[") + members + "]";
  }
  std::string body;
  if (cls.operands.size() == 1) {
    body = emit_union(cls.operands[0]);
  } else {
    body = "(?:";
    for (size_t k = 0; k + 1 < cls.operands.size(); ++k) body += "(?=" + emit_union(cls.operands[k]) + ")";
    body += emit_union(cls.operands.back()) + ")";
  }
  return cls.negated ? "(?:(?!" + body + ")(?s:.))" : body;
}

bool needs_rewrite(const ClassExpr& cls) { return !cls.simple(); }

}  // namespace onig

// The pattern with every nested or intersected Oniguruma class rewritten for PCRE2 (see above).
std::string onig_classes_to_pcre2(const std::string& p, const char* op) {
  std::string out;
  out.reserve(p.size());
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size() && p[i + 1] == 'u') {  // Ruby's \uHHHH is PCRE2's \x{HHHH}
      bool single = true;
      out += onig::class_escape(p, i, single, op);
    } else if (c == '\\') {  // an escape outside classes: copied whole (its second character may be '[')
      const size_t n = i + 1 < p.size() ? 1 + onig::char_len(p, i + 1) : 1;
      out.append(p, i, n);
      i += n;
    } else if (c == '[') {
      const size_t start = i;
      const onig::ClassExpr cls = onig::parse_class(p, i, op);
      if (onig::needs_rewrite(cls)) {
        out += onig::emit_class(cls);
      } else {
        out.append(p, start, i - start);
      }
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// PCRE2 regexes (UTF + UCP so that \p{L}, \s and case-insensitive groups follow Unicode, as Oniguruma does in HF).

class Regex {
 public:
  Regex(const std::string& pattern, const char* op) : pattern_(pattern) {
    const std::string compiled = onig_classes_to_pcre2(pattern, op);
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), PCRE2_UTF | PCRE2_UCP,
                          &err, &off, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof(buf));
      fail(ErrorCode::kUnsupported, op, "regex must compile with PCRE2 (", reinterpret_cast<const char*>(buf),
           " at offset ", off, "); got ", pattern);
    }
    // JIT is only a speed-up: when it is unavailable the interpreter gives the same matches.
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // The non-overlapping matches of well-formed UTF-8 `s`, left to right, as [begin, end) byte spans, found as the
  // onig crate's find_iter (which HF uses) finds them: empty matches count (a Split cuts there), except one that
  // a search starting at the previous match's end finds; then the search moves one character on. An empty `s`
  // has no matches (HF's find_matches never searches it).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    if (s.empty()) return out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0;
    size_t last_match_end = std::string_view::npos;
    while (pos <= s.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, md,
                           nullptr);
      // The JIT's small default stack can run out on huge inputs; the interpreter (heap-backed) then retries.
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit_) {
        rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                         PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        // Stopping here would silently tokenize differently; better to say so.
        pcre2_match_data_free(md);
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(rc, buf, sizeof(buf));
        fail(ErrorCode::kOutOfRange, "tokenizer.encode", "the split regex must finish on every piece (PCRE2: ",
             reinterpret_cast<const char*>(buf), "); got a piece of ", s.size(), " bytes at offset ", pos);
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e == b && pos == last_match_end) {
        // No empty match right where the previous match ended: step one character on and search again.
        if (pos >= s.size()) break;
        char32_t cp;
        const size_t n = uni::decode_utf8(s, pos, cp);
        pos += n == 0 ? 1 : n;
        continue;
      }
      out.emplace_back(b, e);
      pos = last_match_end = e;
    }
    pcre2_match_data_free(md);
    return out;
  }
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// GPT-2's split regex (ByteLevel with use_regex) and the two that Llama 3 and Qwen2 ship in a Split pre-tokenizer;
// GGUF files name them through tokenizer.ggml.pre.
const char* const kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Literal (non-overlapping, left to right) occurrences of `needle` in `s`.
std::vector<std::pair<size_t, size_t>> find_literal(std::string_view s, std::string_view needle) {
  std::vector<std::pair<size_t, size_t>> out;
  if (needle.empty()) return out;
  size_t pos = 0;
  while ((pos = s.find(needle, pos)) != std::string_view::npos) {
    out.emplace_back(pos, pos + needle.size());
    pos += needle.size();
  }
  return out;
}

// A pattern as tokenizer.json spells it: {"String": "..."} or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;  // null for a literal
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    return regex ? regex->find_all(s) : find_literal(s, literal);
  }
};

// ---------------------------------------------------------------------------------------------------------------
// JSON access with errors that name the field.

const json& require(const json& obj, const char* key, const char* where) {
  check(obj.is_object(), ErrorCode::kCorrupt, kOpJson, where, " must be a JSON object; got ", obj.type_name());
  auto it = obj.find(key);
  check(it != obj.end(), ErrorCode::kCorrupt, kOpJson, where, " must have the field \"", key, "\"; got none");
  return *it;
}

std::string get_string(const json& obj, const char* key, const char* where) {
  const json& v = require(obj, key, where);
  check(v.is_string(), ErrorCode::kCorrupt, kOpJson, where, ".", key, " must be a string; got ", v.type_name());
  return v.get<std::string>();
}

std::string opt_string(const json& obj, const char* key, const char* where, const std::string& def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  check(it->is_string(), ErrorCode::kCorrupt, kOpJson, where, ".", key, " must be a string; got ", it->type_name());
  return it->get<std::string>();
}

bool opt_bool(const json& obj, const char* key, const char* where, bool def) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  if (!it->is_boolean()) {
    fail(ErrorCode::kCorrupt, kOpJson, where, ".", key, " must be true or false; got ", brief(*it));
  }
  return it->get<bool>();
}

int64_t get_int(const json& v, const char* where) {
  // (fail, not check: check would build the message, dump() included, for each of 150k vocabulary entries)
  if (!v.is_number_integer()) fail(ErrorCode::kCorrupt, kOpJson, where, " must be an integer; got ", brief(v));
  return v.get<int64_t>();
}

// Token ids are int32 (the public API); anything outside [0, 2^31) is a corrupt file.
int32_t to_token_id(int64_t v, const char* op, const char* where) {
  check(v >= 0 && v <= limits::kMaxTokenId, ErrorCode::kCorrupt, op, where, " must be a token id in [0, ",
        limits::kMaxTokenId, "]; got ", v);
  return static_cast<int32_t>(v);
}

std::string type_of(const json& obj, const char* where) {
  check(obj.is_object(), ErrorCode::kCorrupt, kOpJson, where, " must be a JSON object or null; got ",
        obj.type_name());
  return get_string(obj, "type", where);
}

Pattern parse_pattern(const json& obj, const char* where) {
  const json& p = require(obj, "pattern", where);
  check(p.is_object() && p.size() == 1, ErrorCode::kCorrupt, kOpJson, where,
        ".pattern must be {\"String\": ...} or {\"Regex\": ...}; got ", brief(p));
  Pattern out;
  if (p.contains("String")) {
    check(p["String"].is_string(), ErrorCode::kCorrupt, kOpJson, where, ".pattern.String must be a string; got ",
          brief(p["String"]));
    out.literal = p["String"].get<std::string>();
    check(!out.literal.empty(), ErrorCode::kCorrupt, kOpJson, where, ".pattern.String must not be empty; got \"\"");
  } else if (p.contains("Regex")) {
    check(p["Regex"].is_string(), ErrorCode::kCorrupt, kOpJson, where, ".pattern.Regex must be a string; got ",
          brief(p["Regex"]));
    out.regex = std::make_shared<Regex>(p["Regex"].get<std::string>(), kOpJson);
  } else {
    fail(ErrorCode::kCorrupt, kOpJson, where, ".pattern must be {\"String\": ...} or {\"Regex\": ...}; got ",
         brief(p));
  }
  return out;
}

// A single character given as a string (Metaspace replacement, Strip content).
char32_t single_char(const std::string& s, const char* where) {
  char32_t cp = 0;
  const size_t n = s.empty() ? 0 : uni::decode_utf8(s, 0, cp);
  check(n != 0 && n == s.size(), ErrorCode::kCorrupt, kOpJson, where, " must be exactly one character; got \"", s,
        "\"");
  return cp;
}

// ---------------------------------------------------------------------------------------------------------------
// Normalizers.

struct Normalizer {
  enum Kind { kNFC, kPrepend, kReplace, kSequence } kind = kSequence;
  std::string text;  // Prepend: the prefix; Replace: the content
  Pattern pattern;   // Replace
  std::vector<Normalizer> children;

  void apply(std::string& s) const {
    switch (kind) {
      case kNFC:
        s = uni::nfc(s);
        break;
      case kPrepend:
        if (!s.empty()) s = text + s;  // HF prepends only to non-empty strings
        break;
      case kReplace: {
        const auto spans = pattern.find_all(s);
        if (spans.empty()) break;
        std::string out;
        size_t prev = 0;
        for (const auto& [b, e] : spans) {
          out.append(s, prev, b - prev);
          out += text;
          prev = e;
        }
        out.append(s, prev, std::string::npos);
        s = std::move(out);
        break;
      }
      case kSequence:
        for (const auto& c : children) c.apply(s);
        break;
    }
  }
};

Normalizer parse_normalizer(const json& obj) {
  const std::string type = type_of(obj, "normalizer");
  Normalizer n;
  if (type == "Sequence") {
    const json& list = require(obj, "normalizers", "normalizer");
    check(list.is_array(), ErrorCode::kCorrupt, kOpJson, "normalizer.normalizers must be an array; got ",
          list.type_name());
    n.kind = Normalizer::kSequence;
    for (const auto& c : list) n.children.push_back(parse_normalizer(c));
  } else if (type == "NFC") {
    n.kind = Normalizer::kNFC;
  } else if (type == "Prepend") {
    n.kind = Normalizer::kPrepend;
    n.text = get_string(obj, "prepend", "normalizer(Prepend)");
  } else if (type == "Replace") {
    n.kind = Normalizer::kReplace;
    n.pattern = parse_pattern(obj, "normalizer(Replace)");
    n.text = get_string(obj, "content", "normalizer(Replace)");
  } else {
    fail(ErrorCode::kUnsupported, kOpJson, "normalizer type must be one of NFC, Prepend, Replace, Sequence; got ",
         type);
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------------------
// Pre-tokenizers. A piece remembers whether it starts at offset 0 of the original text (Metaspace "first").

struct Piece {
  std::string text;
  bool at_text_start = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Cuts `s` into pieces around the match spans, as HF's NormalizedString::split does for each behavior.
std::vector<std::pair<size_t, size_t>> split_by(std::string_view s, const std::vector<std::pair<size_t, size_t>>& m,
                                                SplitBehavior behavior, bool invert) {
  // Every byte of s belongs to exactly one span, flagged as match or not.
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> spans;
  size_t prev = 0;
  for (const auto& [b, e] : m) {
    if (b > prev) spans.push_back({{prev, b}, invert});
    spans.push_back({{b, e}, !invert});
    prev = e;
  }
  if (prev < s.size()) spans.push_back({{prev, s.size()}, invert});

  std::vector<std::pair<size_t, size_t>> out;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& [span, is_match] : spans)
        if (!is_match) out.push_back(span);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& sp : spans) out.push_back(sp.first);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool prev_match = false;
      for (const auto& [span, is_match] : spans) {
        if (is_match && !prev_match && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        prev_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool prev_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        const auto& [span, is_match] = *it;
        if (is_match && !prev_match && !out.empty()) {
          out.back().first = span.first;
        } else {
          out.push_back(span);
        }
        prev_match = is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool prev_match = false;
      for (const auto& [span, is_match] : spans) {
        if (is_match == prev_match && !out.empty()) {
          out.back().second = span.second;
        } else {
          out.push_back(span);
        }
        prev_match = is_match;
      }
      break;
    }
  }
  std::erase_if(out, [](const auto& sp) { return sp.second <= sp.first; });
  return out;
}

enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizer {
  enum Kind { kByteLevel, kSplit, kMetaspace, kSequence } kind = kSequence;
  // ByteLevel
  bool add_prefix_space = false;
  bool use_regex = true;
  // Split
  Pattern pattern;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // Metaspace
  std::string replacement;
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;
  std::vector<PreTokenizer> children;

  void apply(std::vector<Piece>& pieces) const {
    if (kind == kSequence) {
      for (const auto& c : children) c.apply(pieces);
      return;
    }
    std::vector<Piece> out;
    for (auto& p : pieces) apply_one(p, out);
    pieces = std::move(out);
  }

 private:
  static void emit(const Piece& p, const std::vector<std::pair<size_t, size_t>>& spans, std::vector<Piece>& out) {
    for (const auto& [b, e] : spans) out.push_back({p.text.substr(b, e - b), p.at_text_start && b == 0});
  }

  void apply_one(Piece& p, std::vector<Piece>& out) const {
    switch (kind) {
      case kByteLevel: {
        if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, 1, ' ');
        std::vector<Piece> parts;
        if (use_regex) {
          static const Regex gpt2(kGpt2Regex, "tokenizer");
          emit(p, split_by(p.text, gpt2.find_all(p.text), SplitBehavior::kIsolated, false), parts);
        } else if (!p.text.empty()) {
          parts.push_back(p);
        }
        for (auto& part : parts) {
          std::string mapped;
          mapped.reserve(part.text.size() * 2);
          for (char ch : part.text) uni::append_utf8(mapped, uni::byte_to_char(static_cast<uint8_t>(ch)));
          out.push_back({std::move(mapped), part.at_text_start});
        }
        break;
      }
      case kSplit:
        emit(p, split_by(p.text, pattern.find_all(p.text), behavior, invert), out);
        break;
      case kMetaspace: {
        std::string s;
        s.reserve(p.text.size() + replacement.size());
        for (char ch : p.text) {
          if (ch == ' ') {
            s += replacement;
          } else {
            s.push_back(ch);
          }
        }
        const bool starts = s.compare(0, replacement.size(), replacement) == 0;
        if (!starts && (prepend == PrependScheme::kAlways || (prepend == PrependScheme::kFirst && p.at_text_start)))
          s.insert(0, replacement);
        Piece q{std::move(s), p.at_text_start};
        if (split) {
          emit(q, split_by(q.text, find_literal(q.text, replacement), SplitBehavior::kMergedWithNext, false), out);
        } else if (!q.text.empty()) {
          out.push_back(std::move(q));
        }
        break;
      }
      case kSequence:
        break;
    }
  }
};

PrependScheme parse_prepend_scheme(const json& obj, const char* where) {
  auto it = obj.find("prepend_scheme");
  if (it == obj.end() || it->is_null()) {
    // Files written before tokenizers 0.19 carry add_prefix_space instead.
    return opt_bool(obj, "add_prefix_space", where, true) ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  const std::string s = get_string(obj, "prepend_scheme", where);
  if (s == "always") return PrependScheme::kAlways;
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  fail(ErrorCode::kCorrupt, kOpJson, where, ".prepend_scheme must be always, first or never; got ", s);
}

SplitBehavior parse_behavior(const std::string& b, const char* where) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  fail(ErrorCode::kCorrupt, kOpJson, where,
       ".behavior must be Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous; got ", b);
}

// HF's Punctuation pre-tokenizer: each character that is ASCII punctuation (Rust's is_ascii_punctuation, which
// counts $+<=>^`|~ too) or Unicode punctuation (\p{P}) is one match, then the behavior applies.
const char* const kPunctuationRegex = R"([\p{P}!-/:-@\[-`{-~])";

PreTokenizer parse_pre_tokenizer(const json& obj) {
  const std::string type = type_of(obj, "pre_tokenizer");
  PreTokenizer p;
  if (type == "Sequence") {
    const json& list = require(obj, "pretokenizers", "pre_tokenizer");
    check(list.is_array(), ErrorCode::kCorrupt, kOpJson, "pre_tokenizer.pretokenizers must be an array; got ",
          list.type_name());
    p.kind = PreTokenizer::kSequence;
    for (const auto& c : list) p.children.push_back(parse_pre_tokenizer(c));
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::kByteLevel;
    p.add_prefix_space = opt_bool(obj, "add_prefix_space", "pre_tokenizer(ByteLevel)", true);
    p.use_regex = opt_bool(obj, "use_regex", "pre_tokenizer(ByteLevel)", true);
  } else if (type == "Split") {
    p.kind = PreTokenizer::kSplit;
    p.pattern = parse_pattern(obj, "pre_tokenizer(Split)");
    p.behavior = parse_behavior(get_string(obj, "behavior", "pre_tokenizer(Split)"), "pre_tokenizer(Split)");
    p.invert = opt_bool(obj, "invert", "pre_tokenizer(Split)", false);
  } else if (type == "Digits") {  // numeric characters (\p{N}) split off: one by one, or as runs
    p.kind = PreTokenizer::kSplit;
    p.behavior = SplitBehavior::kIsolated;
    const bool individual = opt_bool(obj, "individual_digits", "pre_tokenizer(Digits)", false);
    p.pattern.regex = std::make_shared<Regex>(individual ? R"(\p{N})" : R"(\p{N}+)", kOpJson);
  } else if (type == "Punctuation") {
    p.kind = PreTokenizer::kSplit;
    p.behavior = parse_behavior(opt_string(obj, "behavior", "pre_tokenizer(Punctuation)", "Isolated"),
                                "pre_tokenizer(Punctuation)");
    p.pattern.regex = std::make_shared<Regex>(kPunctuationRegex, kOpJson);
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::kMetaspace;
    p.replacement = opt_string(obj, "replacement", "pre_tokenizer(Metaspace)", "\xE2\x96\x81");
    single_char(p.replacement, "pre_tokenizer(Metaspace).replacement");
    p.prepend = parse_prepend_scheme(obj, "pre_tokenizer(Metaspace)");
    p.split = opt_bool(obj, "split", "pre_tokenizer(Metaspace)", true);
  } else {
    fail(ErrorCode::kUnsupported, kOpJson,
         "pre_tokenizer type must be one of ByteLevel, Split, Digits, Punctuation, Metaspace, Sequence; got ", type);
  }
  return p;
}

// ---------------------------------------------------------------------------------------------------------------
// GGUF "gpt2" (byte-level BPE) vocabularies: tokenizer.ggml.pre names the model family, and with it the
// normalizer and pre-tokenizer of the family's tokenizer.json. The names are llama.cpp's (its `tokenizer.ggml.pre`
// list); the patterns below are written as the families' tokenizer.json files (or tiktoken patterns) spell them,
// in Oniguruma syntax, and each family's pipeline is checked against HF `tokenizers` by a fixture
// (tests/data/tokenizers/pre_*.json and their GGUF twins, see tools/gen_tokenizer_fixtures.py).

// Llama 3 / cl100k (also DBRX, ChatGLM-4, GLM-4/5, Falcon 3, LFM2, Pixtral, ...).
const char* const kCl100kRegex = kLlama3Regex;
// Qwen 3.5: marks join letters.
const char* const kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral's Tekken: case-aware words, single digits.
const char* const kTekkenRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (GPT-4o, gpt-oss, Llama 4, MiniMax-M2, Tiny Aya's second stage).
const char* const kO200kRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Kimi K2 (tiktoken pattern): Han runs apart, letters without Han (class intersection).
const char* const kKimiRegex =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Jais 2: Llama 3's pattern with whitespace runs cut in powers of two.
const char* const kJais2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1})";
// BLOOM (also Poro, GPT-3 Finnish, Viking): a nested Oniguruma class.
const char* const kBloomRegex = R"( ?[^(\s|[.,!?…。，、।۔،])]+)";
// DeepSeek LLM: newlines, Latin/Greek/Cyrillic/... letters, ASCII and full-width punctuation, trailing spaces, CJK.
const char* const kDeepseekLlmLetters = R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";
const char* const kDeepseekLlmPunct = R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)";
const char* const kDeepseekCjk = R"([一-龥ࠀ-一가-퟿]+)";
// DeepSeek V3 (also Hunyuan dense, JoyAI, HY v4) and Spark 2.5.
const char* const kDeepseekV3Cjk = R"([一-龥぀-ゟ゠-ヿ]+)";
const char* const kDeepseekV3Regex =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|"
    "\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const char* const kSpark25Regex =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|"
    "\\s+(?!\\S)|\\s+";
// Youtu: Korean / CJK punctuation / Bopomofo / CJK runs, then an o200k-like pattern.
const char* const kYoutuCjk = R"([가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+)";
const char* const kYoutuRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Ling / Bailing MoE: possessive quantifiers.
const char* const kBailingRegex =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
const char* const kSeedCoderRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2's pattern without the English contractions (Turkish suffixes stay on their word).
const char* const kUfakzekaRegex =
    R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// EXAONE MoE: a word may hold single spaces between letters.
const char* const kExaoneMoeRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+)";
const char* const kMiniCpm5Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// One stage of a family's pre-tokenizer Sequence.
struct PreStep {
  enum Kind {
    kSplit,          // Split(Regex(regex), Isolated)
    kDigits,         // Digits(individual_digits=true)
    kDigitRuns,      // Digits(individual_digits=false)
    kPunctuation,    // Punctuation(Contiguous)
    kByteLevel,      // ByteLevel(use_regex=false): the byte alphabet only
    kByteLevelGpt2,  // ByteLevel(use_regex=true): GPT-2's split, then the byte alphabet
  } kind;
  const char* regex = nullptr;
};

struct GgufPreType {
  std::vector<const char*> names;  // tokenizer.ggml.pre values (llama.cpp's aliases share an entry)
  std::vector<PreStep> steps;
  bool nfc = false;            // the family's tokenizer.json normalizes to NFC
  bool ignore_merges = false;  // its BPE model has ignore_merges (a word in the vocabulary is one token)
  bool add_bos = false;        // BOS is added when the GGUF has no tokenizer.ggml.add_bos_token
};

const std::vector<GgufPreType>& gguf_pre_types() {
  using S = PreStep;
  static const std::vector<GgufPreType> table = {
      // GPT-2's ByteLevel pre-tokenizer (GPT-2, Phi-2, Jais, GigaChat, ...). "default" is what an old file without
      // tokenizer.ggml.pre gets.
      {{"gpt-2", "gpt2", "default", "phi-2", "jais", "gigachat", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de",
        "a.x-4.0", "mellum", "modern-bert", "trillion", "granite-docling", "exaone4"},
       {{S::kByteLevelGpt2}}},
      // GPT-NeoX-20B's tokenizer (MPT, OLMo 1): NFC, then GPT-2's ByteLevel.
      {{"mpt", "olmo"}, {{S::kByteLevelGpt2}}, /*nfc=*/true},
      // StarCoder-style: every digit apart, then GPT-2's ByteLevel (Refact, SmolLM, CodeShell, EXAONE 3, ...).
      {{"starcoder", "refact", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"},
       {{S::kDigits}, {S::kByteLevelGpt2}}},
      {{"command-r"}, {{S::kDigits}, {S::kByteLevelGpt2}}, /*nfc=*/true},
      // Falcon: punctuation runs, GPT-2's ByteLevel, digit runs, then digit triples.
      {{"falcon"},
       {{S::kPunctuation}, {S::kByteLevelGpt2}, {S::kDigitRuns}, {S::kSplit, "[0-9][0-9][0-9]"}}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"},
       {{S::kSplit, kCl100kRegex}, {S::kByteLevel}}, false, /*ignore_merges=*/true, /*add_bos=*/true},
      {{"dbrx", "smaug-bpe"}, {{S::kSplit, kCl100kRegex}, {S::kByteLevel}}},
      {{"chatglm-bpe"}, {{S::kSplit, kCl100kRegex}, {S::kByteLevel}}},
      {{"glm4", "glm5"}, {{S::kSplit, kCl100kRegex}, {S::kByteLevel}}, false, /*ignore_merges=*/true},
      {{"jais-2"}, {{S::kSplit, kJais2Regex}, {S::kByteLevel}}},
      // Qwen2 / Qwen2.5 / Qwen3 (and the R1 distills of Qwen2.5, F2LLM v2 on Qwen3): NFC.
      {{"qwen2", "deepseek-r1-qwen", "f2llmv2"}, {{S::kSplit, kQwen2Regex}, {S::kByteLevel}}, /*nfc=*/true},
      // The same pattern in files whose normalizer is not Qwen's (llama.cpp applies none either).
      {{"stablelm2", "hunyuan", "solar-open", "grok-2", "kormo", "megrez"},
       {{S::kSplit, kQwen2Regex}, {S::kByteLevel}}},
      // Qwen 3.5 has no normalizer: HF keeps "e" + U+0301 apart (llama.cpp's recorded ids for it say so).
      {{"qwen35"}, {{S::kSplit, kQwen35Regex}, {S::kByteLevel}}},
      {{"laguna"}, {{S::kSplit, "[^\\n]+|[\\n]+"}, {S::kSplit, kQwen2Regex}, {S::kByteLevel}}},
      {{"ufakzeka"}, {{S::kSplit, kUfakzekaRegex}, {S::kByteLevel}}},
      {{"tekken"}, {{S::kSplit, kTekkenRegex}, {S::kByteLevel}}, false, true, /*add_bos=*/true},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {{S::kSplit, kO200kRegex}, {S::kByteLevel}}},
      // Tiny Aya / Cohere2 MoE: digits in groups of three counted from the right, then o200k.
      {{"tiny_aya", "cohere2moe"},
       {{S::kSplit, R"(\d{1,3}(?=(?:\d{3})*\b))"}, {S::kSplit, kO200kRegex}, {S::kByteLevel}}},
      {{"kimi-k2"}, {{S::kSplit, kKimiRegex}, {S::kByteLevel}}},
      {{"deepseek-llm"},
       {{S::kSplit, "[\r\n]"}, {S::kSplit, kDeepseekLlmLetters}, {S::kSplit, kDeepseekLlmPunct},
        {S::kSplit, "\\s+$"}, {S::kSplit, kDeepseekCjk}, {S::kDigits}, {S::kByteLevel}}},
      {{"deepseek-coder"},
       {{S::kSplit, "[\r\n]"}, {S::kSplit, "\\s?\\p{L}+"}, {S::kSplit, "\\s?\\p{P}+"}, {S::kSplit, kDeepseekCjk},
        {S::kDigits}, {S::kByteLevel}}},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"},
       {{S::kSplit, "\\p{N}{1,3}"}, {S::kSplit, kDeepseekV3Cjk}, {S::kSplit, kDeepseekV3Regex}, {S::kByteLevel}}},
      {{"spark2_5"},
       {{S::kSplit, "\\p{N}{1,3}"}, {S::kSplit, kDeepseekV3Cjk}, {S::kSplit, kSpark25Regex}, {S::kDigits},
        {S::kByteLevel}}},
      {{"youtu"}, {{S::kSplit, kYoutuCjk}, {S::kSplit, kYoutuRegex}, {S::kByteLevel}}, false, /*ignore_merges=*/true},
      {{"bailingmoe", "bailingmoe2", "llada-moe"}, {{S::kSplit, kBailingRegex}, {S::kByteLevel}}},
      {{"seed-coder"}, {{S::kSplit, kSeedCoderRegex}, {S::kByteLevel}}},
      {{"exaone-moe"}, {{S::kSplit, kExaoneMoeRegex}, {S::kByteLevel}}},
      {{"minicpm5"}, {{S::kSplit, "\\p{N}{1,3}"}, {S::kSplit, kMiniCpm5Regex}, {S::kByteLevel}}, false,
       /*ignore_merges=*/true},
      // SuperBPE: digit runs, cut into groups of three from the right by an empty-matching lookahead; no
      // whitespace split at all (its tokens span words).
      {{"superbpe"}, {{S::kSplit, "\\p{N}+"}, {S::kSplit, R"((?=(\d{3})+(?!\d)))"}, {S::kByteLevel}}},
      {{"bloom", "poro-chat", "gpt3-finnish"}, {{S::kSplit, kBloomRegex}, {S::kByteLevel}}},
      {{"viking"}, {{S::kSplit, kBloomRegex}, {S::kDigits}, {S::kByteLevel}}},
  };
  return table;
}

// llama.cpp knows these names too, but their vocabularies need what cider's GGUF loader does not do; each is
// refused with the reason.
const std::vector<std::pair<const char*, const char*>>& gguf_pre_types_refused() {
  constexpr const char* kRawUtf8 = "BPE on raw UTF-8 with spaces as \xE2\x96\x81 (SentencePiece style), not byte-level BPE";
  constexpr const char* kSeparator = "the separator token an embedding model appends";
  static const std::vector<std::pair<const char*, const char*>> refused = {
      {"gemma4", kRawUtf8},
      {"granite-embed-multi-311m", kRawUtf8},
      {"sarvam-moe", kRawUtf8},
      {"whitespace", "a whitespace split over raw UTF-8 (an embedding model), not byte-level BPE"},
      {"jina-v1-en", kSeparator},
      {"jina-v2-code", kSeparator},
      {"roberta-bpe", kSeparator},
      {"granite-embed-multi-97m", "its tokenizer.json pattern, which llama.cpp keeps only as an approximation"},
      {"afmoe", "its tokenizer.json digit rule, which llama.cpp keeps only as a hand-written splitter"},
      {"chameleon", "the image and sentinel token patterns of Chameleon (a multimodal model)"},
  };
  return refused;
}

const GgufPreType* find_gguf_pre_type(const std::string& name) {
  for (const auto& t : gguf_pre_types())
    for (const char* n : t.names)
      if (name == n) return &t;
  return nullptr;
}

std::string gguf_pre_type_list() {
  std::string out;
  for (const auto& t : gguf_pre_types())
    for (const char* n : t.names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

PreTokenizer build_pre_tokenizer(const GgufPreType& type) {
  PreTokenizer seq;
  seq.kind = PreTokenizer::kSequence;
  for (const PreStep& step : type.steps) {
    PreTokenizer p;
    p.kind = PreTokenizer::kSplit;
    p.behavior = SplitBehavior::kIsolated;
    switch (step.kind) {
      case PreStep::kSplit:
        p.pattern.regex = std::make_shared<Regex>(step.regex, kOpGguf);
        break;
      case PreStep::kDigits:
        p.pattern.regex = std::make_shared<Regex>(R"(\p{N})", kOpGguf);
        break;
      case PreStep::kDigitRuns:
        p.pattern.regex = std::make_shared<Regex>(R"(\p{N}+)", kOpGguf);
        break;
      case PreStep::kPunctuation:
        p.behavior = SplitBehavior::kContiguous;
        p.pattern.regex = std::make_shared<Regex>(kPunctuationRegex, kOpGguf);
        break;
      case PreStep::kByteLevel:
      case PreStep::kByteLevelGpt2:
        p.kind = PreTokenizer::kByteLevel;
        p.add_prefix_space = false;
        p.use_regex = step.kind == PreStep::kByteLevelGpt2;
        break;
    }
    seq.children.push_back(std::move(p));
  }
  return seq;
}

// ---------------------------------------------------------------------------------------------------------------
// Decoders (each maps a list of token strings to a list of strings; the results are concatenated at the end).

struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = kFuse;
  Pattern pattern;  // Replace
  std::string text;  // Replace: content; Metaspace: replacement
  char32_t strip_char = ' ';
  size_t strip_start = 0, strip_stop = 0;
  bool metaspace_strip_first = true;  // prepend_scheme != never
};

// The <0xNN> spelling of byte-fallback tokens; returns the byte or -1.
int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = t[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return -1;  // HF spells them with upper-case digits only
    }
    v = v * 16 + d;
  }
  return v;
}

std::vector<std::string> run_decoder_step(const DecoderStep& d, std::vector<std::string> tokens) {
  switch (d.kind) {
    case DecoderStep::kByteLevel: {
      // A token made only of byte-alphabet characters becomes those bytes; any other token keeps its own UTF-8.
      std::string bytes;
      for (const auto& t : tokens) {
        std::string mapped;
        bool all = true;
        size_t i = 0;
        char32_t cp;
        while (i < t.size()) {
          const size_t n = uni::decode_utf8(t, i, cp);
          const int b = n == 0 ? -1 : uni::char_to_byte(cp);
          if (b < 0) {
            all = false;
            break;
          }
          mapped.push_back(static_cast<char>(b));
          i += n;
        }
        bytes += all ? mapped : t;
      }
      return {uni::utf8_lossy(bytes)};
    }
    case DecoderStep::kReplace:
      for (auto& t : tokens) {
        const auto spans = d.pattern.find_all(t);
        if (spans.empty()) continue;
        std::string out;
        size_t prev = 0;
        for (const auto& [b, e] : spans) {
          out.append(t, prev, b - prev);
          out += d.text;
          prev = e;
        }
        out.append(t, prev, std::string::npos);
        t = std::move(out);
      }
      return tokens;
    case DecoderStep::kByteFallback: {
      // Runs of <0xNN> tokens become their bytes when those form valid UTF-8, else one U+FFFD per byte.
      std::vector<std::string> out;
      std::string pending;
      size_t pending_count = 0;
      auto flush = [&] {
        if (pending_count == 0) return;
        if (uni::find_invalid_utf8(pending) == std::string_view::npos) {
          out.push_back(pending);
        } else {
          for (size_t i = 0; i < pending_count; ++i) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
        pending_count = 0;
      };
      for (auto& t : tokens) {
        const int b = byte_token_value(t);
        if (b >= 0) {
          pending.push_back(static_cast<char>(b));
          ++pending_count;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      return out;
    }
    case DecoderStep::kFuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      return {all};
    }
    case DecoderStep::kStrip:
      for (auto& t : tokens) {
        std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
        size_t i = 0;
        char32_t cp;
        while (i < t.size()) {
          size_t n = uni::decode_utf8(t, i, cp);
          if (n == 0) n = 1, cp = 0xFFFD;
          chars.emplace_back(i, cp);
          i += n;
        }
        size_t first = 0, last = chars.size();
        while (first < d.strip_start && first < chars.size() && chars[first].second == d.strip_char) ++first;
        size_t stripped = 0;
        while (stripped < d.strip_stop && last > first && chars[last - 1].second == d.strip_char) --last, ++stripped;
        const size_t b = first < chars.size() ? chars[first].first : t.size();
        const size_t e = last < chars.size() ? chars[last].first : t.size();
        t = t.substr(b, e > b ? e - b : 0);
      }
      return tokens;
    case DecoderStep::kMetaspace:
      // The replacement becomes a space, except in the first token where (unless the scheme is "never") it is
      // dropped: that is where the pre-tokenizer added it.
      for (size_t k = 0; k < tokens.size(); ++k) {
        std::string out;
        const std::string& t = tokens[k];
        size_t pos = 0, hit;
        while ((hit = t.find(d.text, pos)) != std::string::npos) {
          out.append(t, pos, hit - pos);
          if (!(k == 0 && d.metaspace_strip_first)) out.push_back(' ');
          pos = hit + d.text.size();
        }
        out.append(t, pos, std::string::npos);
        tokens[k] = std::move(out);
      }
      return tokens;
  }
  return tokens;
}

void parse_decoder(const json& obj, std::vector<DecoderStep>& steps) {
  const std::string type = type_of(obj, "decoder");
  DecoderStep d;
  if (type == "Sequence") {
    const json& list = require(obj, "decoders", "decoder");
    check(list.is_array(), ErrorCode::kCorrupt, kOpJson, "decoder.decoders must be an array; got ", list.type_name());
    for (const auto& c : list) parse_decoder(c, steps);
    return;
  } else if (type == "ByteLevel") {
    d.kind = DecoderStep::kByteLevel;
  } else if (type == "Replace") {
    d.kind = DecoderStep::kReplace;
    d.pattern = parse_pattern(obj, "decoder(Replace)");
    d.text = get_string(obj, "content", "decoder(Replace)");
  } else if (type == "ByteFallback") {
    d.kind = DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = DecoderStep::kFuse;
  } else if (type == "Strip") {
    d.kind = DecoderStep::kStrip;
    d.strip_char = single_char(get_string(obj, "content", "decoder(Strip)"), "decoder(Strip).content");
    const int64_t start = get_int(require(obj, "start", "decoder(Strip)"), "decoder(Strip).start");
    const int64_t stop = get_int(require(obj, "stop", "decoder(Strip)"), "decoder(Strip).stop");
    check(start >= 0 && stop >= 0, ErrorCode::kCorrupt, kOpJson, "decoder(Strip) start and stop must be >= 0; got ",
          start, " and ", stop);
    d.strip_start = static_cast<size_t>(start);
    d.strip_stop = static_cast<size_t>(stop);
  } else if (type == "Metaspace") {
    d.kind = DecoderStep::kMetaspace;
    d.text = opt_string(obj, "replacement", "decoder(Metaspace)", "\xE2\x96\x81");
    single_char(d.text, "decoder(Metaspace).replacement");
    d.metaspace_strip_first = parse_prepend_scheme(obj, "decoder(Metaspace)") != PrependScheme::kNever;
  } else {
    fail(ErrorCode::kUnsupported, kOpJson,
         "decoder type must be one of ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence; got ", type);
  }
  steps.push_back(std::move(d));
}

// ---------------------------------------------------------------------------------------------------------------
// Added tokens: a byte trie gives the leftmost-longest match, like HF's Aho-Corasick in LeftmostLongest mode.

struct AddedToken {
  std::string content;     // as written in tokenizer.json
  std::string match_text;  // what is matched and decoded: the content, normalized when `normalized` is set
  int32_t id = -1;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = false;
};

class TokenTrie {
 public:
  void insert(std::string_view s, size_t token_index) {
    size_t node = 0;
    for (char ch : s) {
      const auto key = static_cast<uint8_t>(ch);
      auto it = nodes_[node].next.find(key);
      if (it == nodes_[node].next.end()) {
        nodes_.push_back({});
        it = nodes_[node].next.emplace(key, nodes_.size() - 1).first;
      }
      node = it->second;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int64_t>(token_index);
  }
  bool empty() const { return nodes_.size() == 1; }
  // The longest token starting exactly at pos: (token index, length), or (-1, 0).
  std::pair<int64_t, size_t> longest_at(std::string_view s, size_t pos) const {
    std::pair<int64_t, size_t> best{-1, 0};
    size_t node = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      auto it = nodes_[node].next.find(static_cast<uint8_t>(s[i]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::map<uint8_t, size_t> next;
    int64_t token = -1;
  };
  std::vector<Node> nodes_{Node{}};
};

// A piece of the text: either an added token (id >= 0) or text for the model.
struct Segment {
  int32_t token = -1;
  size_t begin = 0, end = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// The BPE model.

struct MergeInfo {
  int32_t rank;
  int32_t new_id;
};

// Vocabulary maps looked up with string_view keys, without building a std::string per character.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  // Vocabulary: model tokens and added tokens share one id space.
  TokenMap vocab;  // model vocabulary (plus, for GGUF, every token)
  std::vector<std::string> id_to_token;            // decoding strings, "" for unused ids
  std::vector<uint8_t> id_present;
  std::vector<uint8_t> id_special;

  // BPE.
  std::unordered_map<uint64_t, MergeInfo> merges;
  bool merge_by_score = false;  // GGUF "llama": SentencePiece merges by the score of the merged piece
  std::vector<float> scores;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_ids{};  // <0xNN> token ids (byte fallback), -1 when absent

  // Pipeline.
  std::vector<AddedToken> added;
  TokenMap added_by_content;  // token_to_id: added tokens by their content
  TokenTrie raw_trie, normalized_trie;
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  bool has_decoder = false;
  std::vector<DecoderStep> decoder;
  bool decoder_has_byte_fallback = false;
  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor: ids around $A

  int32_t bos = -1;
  std::vector<int32_t> eos;

  void set_token(int32_t id, const std::string& text) {
    const auto n = static_cast<size_t>(id) + 1;
    if (id_to_token.size() < n) {
      id_to_token.resize(n);
      id_present.resize(n, 0);
      id_special.resize(n, 0);
    }
    id_to_token[static_cast<size_t>(id)] = text;
    id_present[static_cast<size_t>(id)] = 1;
  }

  bool valid_id(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < id_present.size() && id_present[static_cast<size_t>(id)] != 0;
  }

  void finish_byte_ids() {
    byte_ids.fill(-1);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = vocab.find(name);
      if (it != vocab.end()) byte_ids[static_cast<size_t>(b)] = it->second;
    }
  }

  void build_tries() {
    for (const auto& a : added) added_by_content.emplace(a.content, a.id);
    for (size_t i = 0; i < added.size(); ++i) {
      if (added[i].match_text.empty()) continue;
      (added[i].normalized ? normalized_trie : raw_trie).insert(added[i].match_text, i);
    }
  }

  // HF's AddedVocabulary::find_matches: splits `s` around the added tokens of `trie`, honouring single_word, lstrip
  // and rstrip.
  std::vector<Segment> split_added(std::string_view s, const TokenTrie& trie) const {
    std::vector<Segment> out;
    if (trie.empty()) {
      out.push_back({-1, 0, s.size()});
      return out;
    }
    size_t start_offset = 0;
    size_t pos = 0;
    while (pos < s.size()) {
      const auto [index, len] = trie.longest_at(s, pos);
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedToken& tok = added[static_cast<size_t>(index)];
      size_t start = pos, stop = pos + len;
      const size_t match_end = stop;
      if (tok.single_word) {
        const bool word_before = start > 0 && uni::is_word_char(last_char(s.substr(0, start)));
        const bool word_after = stop < s.size() && uni::is_word_char(first_char(s.substr(stop)));
        if (word_before || word_after) {
          // HF's matcher continues after the rejected match, not inside it.
          pos = match_end;
          continue;
        }
      }
      if (tok.lstrip) {
        size_t b = start;
        while (b > 0) {
          size_t cb = b - 1;
          while (cb > 0 && (static_cast<uint8_t>(s[cb]) & 0xC0) == 0x80) --cb;
          char32_t cp;
          if (uni::decode_utf8(s, cb, cp) == 0 || !uni::is_whitespace(cp)) break;
          b = cb;
        }
        start = std::max(b, start_offset);
      }
      if (tok.rstrip) {
        char32_t cp;
        size_t n;
        while (stop < s.size() && (n = uni::decode_utf8(s, stop, cp)) != 0 && uni::is_whitespace(cp)) stop += n;
      }
      if (start_offset < start) out.push_back({-1, start_offset, start});
      out.push_back({tok.id, start, stop});
      start_offset = stop;
      pos = match_end;
    }
    if (start_offset != s.size() || out.empty()) out.push_back({-1, start_offset, s.size()});
    return out;
  }

  static char32_t first_char(std::string_view s) {
    char32_t cp = 0;
    return uni::decode_utf8(s, 0, cp) ? cp : 0;
  }
  static char32_t last_char(std::string_view s) {
    size_t b = s.size() - 1;
    while (b > 0 && (static_cast<uint8_t>(s[b]) & 0xC0) == 0x80) --b;
    char32_t cp = 0;
    return uni::decode_utf8(s, b, cp) ? cp : 0;
  }

  // BPE on one word, merges by rank (HF's algorithm: always the lowest-rank pair, leftmost among equals).
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      // Llama 3: a word that is already a token is emitted whole, whatever the merges would make of it.
      auto it = vocab.find(word);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    if (merge_by_score) {
      spm_word(word, out);
      return;
    }
    // Initial symbols: characters, or their <0xNN> bytes, or <unk> (consecutive ones fused when fuse_unk).
    std::vector<int32_t> sym;
    sym.reserve(word.size());
    bool pending_unk = false;
    size_t i = 0;
    char32_t cp;
    while (i < word.size()) {
      size_t n = uni::decode_utf8(word, i, cp);
      if (n == 0) n = 1;  // cannot happen: input was validated, pieces are cut on character boundaries
      auto it = vocab.find(word.substr(i, n));
      if (it != vocab.end()) {
        if (pending_unk) sym.push_back(unk_id), pending_unk = false;
        sym.push_back(it->second);
      } else {
        bool done = false;
        if (byte_fallback) {
          bool all = true;
          for (size_t k = 0; k < n; ++k) all = all && byte_ids[static_cast<uint8_t>(word[i + k])] >= 0;
          if (all) {
            if (pending_unk) sym.push_back(unk_id), pending_unk = false;
            for (size_t k = 0; k < n; ++k) sym.push_back(byte_ids[static_cast<uint8_t>(word[i + k])]);
            done = true;
          }
        }
        if (!done && unk_id >= 0) {
          if (pending_unk && !fuse_unk) sym.push_back(unk_id);
          pending_unk = true;
        }
        // With neither a byte token nor an unk token the character is dropped, as HF does.
      }
      i += n;
    }
    if (pending_unk) sym.push_back(unk_id);
    merge_symbols(sym, out);
  }

  void merge_symbols(std::vector<int32_t>& sym, std::vector<int32_t>& out) const {
    const size_t n = sym.size();
    if (n < 2) {
      out.insert(out.end(), sym.begin(), sym.end());
      return;
    }
    // Doubly linked symbols; a min-heap of candidate merges keyed by (rank, position). Entries made stale by an
    // earlier merge are recognised when popped (the pair at that position no longer gives that new id).
    std::vector<int64_t> prev(n), next(n);
    std::vector<uint8_t> alive(n, 1);
    for (size_t k = 0; k < n; ++k) {
      prev[k] = static_cast<int64_t>(k) - 1;
      next[k] = k + 1 < n ? static_cast<int64_t>(k + 1) : -1;
    }
    struct Cand {
      int32_t rank;
      size_t pos;
      int32_t new_id;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](size_t a) {
      if (next[a] < 0) return;
      auto it = merges.find(pair_key(sym[a], sym[static_cast<size_t>(next[a])]));
      if (it != merges.end()) heap.push({it->second.rank, a, it->second.new_id});
    };
    for (size_t k = 0; k + 1 < n; ++k) push(k);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (!alive[c.pos] || next[c.pos] < 0) continue;
      const auto right = static_cast<size_t>(next[c.pos]);
      auto it = merges.find(pair_key(sym[c.pos], sym[right]));
      if (it == merges.end() || it->second.new_id != c.new_id) continue;
      sym[c.pos] = c.new_id;
      alive[right] = 0;
      next[c.pos] = next[right];
      if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = static_cast<int64_t>(c.pos);
      if (prev[c.pos] >= 0) push(static_cast<size_t>(prev[c.pos]));
      push(c.pos);
    }
    for (int64_t k = 0; k >= 0; k = next[static_cast<size_t>(k)]) out.push_back(sym[static_cast<size_t>(k)]);
  }

  // SentencePiece BPE as GGUF "llama" vocabularies need it: start from characters, repeatedly merge the adjacent
  // pair whose concatenation is a vocabulary piece with the highest score (leftmost among equals); pieces that are
  // not in the vocabulary at the end are re-split along the merges that built them, down to byte tokens.
  void spm_word(std::string_view word, std::vector<int32_t>& out) const {
    struct Sym {
      size_t begin, len;
      int64_t prev, next;
    };
    std::vector<Sym> sym;
    size_t i = 0;
    char32_t cp;
    while (i < word.size()) {
      size_t n = uni::decode_utf8(word, i, cp);
      if (n == 0) n = 1;
      sym.push_back({i, n, static_cast<int64_t>(sym.size()) - 1, static_cast<int64_t>(sym.size()) + 1});
      i += n;
    }
    sym.back().next = -1;
    struct Cand {
      float score;
      size_t left, right, len;
    };
    auto worse = [](const Cand& a, const Cand& b) { return a.score != b.score ? a.score < b.score : a.left > b.left; };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
    std::unordered_map<std::string, std::pair<std::string, std::string>> built_from;
    auto try_pair = [&](int64_t l, int64_t r) {
      if (l < 0 || r < 0) return;
      const Sym& a = sym[static_cast<size_t>(l)];
      const Sym& b = sym[static_cast<size_t>(r)];
      auto it = vocab.find(word.substr(a.begin, a.len + b.len));
      if (it == vocab.end()) return;
      heap.push({scores[static_cast<size_t>(it->second)], static_cast<size_t>(l), static_cast<size_t>(r),
                 a.len + b.len});
    };
    for (size_t k = 0; k + 1 < sym.size(); ++k) try_pair(static_cast<int64_t>(k), static_cast<int64_t>(k + 1));
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      Sym& a = sym[c.left];
      Sym& b = sym[c.right];
      if (a.len == 0 || b.len == 0 || a.len + b.len != c.len || a.next != static_cast<int64_t>(c.right)) continue;
      built_from.emplace(std::string(word.substr(a.begin, c.len)),
                         std::make_pair(std::string(word.substr(a.begin, a.len)),
                                        std::string(word.substr(b.begin, b.len))));
      a.len = c.len;
      a.next = b.next;
      b.len = 0;
      if (a.next >= 0) sym[static_cast<size_t>(a.next)].prev = static_cast<int64_t>(c.left);
      try_pair(a.prev, static_cast<int64_t>(c.left));
      try_pair(static_cast<int64_t>(c.left), a.next);
    }
    std::function<void(const std::string&)> emit = [&](const std::string& piece) {
      auto it = vocab.find(piece);
      if (it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
      auto bf = built_from.find(piece);
      if (bf != built_from.end()) {
        emit(bf->second.first);
        emit(bf->second.second);
        return;
      }
      bool all = true;
      for (char ch : piece) all = all && byte_ids[static_cast<uint8_t>(ch)] >= 0;
      if (all) {
        for (char ch : piece) out.push_back(byte_ids[static_cast<uint8_t>(ch)]);
      } else if (unk_id >= 0) {
        out.push_back(unk_id);
      }
    };
    for (int64_t k = 0; k >= 0; k = sym[static_cast<size_t>(k)].next) {
      const Sym& s = sym[static_cast<size_t>(k)];
      emit(std::string(word.substr(s.begin, s.len)));
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const {
    const size_t bad = uni::find_invalid_utf8(text);
    if (bad != std::string_view::npos) {
      fail(ErrorCode::kInvalidArgument, "tokenizer.encode", "text must be valid UTF-8; got an invalid byte 0x",
           hex_byte(text, bad), " at offset ", bad);
    }
    std::vector<int32_t> ids;
    for (const Segment& seg : split_added(text, raw_trie)) {
      if (seg.token >= 0) {
        ids.push_back(seg.token);
        continue;
      }
      // Empty pieces are dropped before normalization, as HF does (so Prepend or a prefix space never makes a
      // token out of nothing).
      if (seg.end == seg.begin) continue;
      std::string norm(text.substr(seg.begin, seg.end - seg.begin));
      if (normalizer) normalizer->apply(norm);
      for (const Segment& sub : split_added(norm, normalized_trie)) {
        if (sub.token >= 0) {
          ids.push_back(sub.token);
          continue;
        }
        if (sub.end == sub.begin) continue;
        std::vector<Piece> pieces;
        pieces.push_back({norm.substr(sub.begin, sub.end - sub.begin), seg.begin == 0 && sub.begin == 0});
        if (pre_tokenizer) pre_tokenizer->apply(pieces);
        for (const Piece& p : pieces) bpe_word(p.text, ids);
      }
    }
    if (add_special && (!prefix_ids.empty() || !suffix_ids.empty())) {
      ids.insert(ids.begin(), prefix_ids.begin(), prefix_ids.end());
      ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
    }
    return ids;
  }

  static std::string hex_byte(std::string_view s, size_t at) {
    char buf[4];
    std::snprintf(buf, sizeof(buf), "%02X", static_cast<unsigned>(static_cast<uint8_t>(s[at])));
    return buf;
  }

  // The token strings that decode() feeds to the decoder chain.
  std::vector<std::string> tokens_for(const std::vector<int32_t>& ids, bool skip_special) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      check(valid_id(id), ErrorCode::kOutOfRange, "tokenizer.decode", "token ids must be in the vocabulary [0, ",
            id_present.size(), "); got ", id);
      if (skip_special && id_special[static_cast<size_t>(id)]) continue;
      tokens.push_back(id_to_token[static_cast<size_t>(id)]);
    }
    return tokens;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const {
    std::vector<std::string> tokens = tokens_for(ids, skip_special);
    if (!has_decoder) {
      // HF joins with spaces when a tokenizer has no decoder.
      std::string out;
      for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
      return out;
    }
    for (const auto& step : decoder) tokens = run_decoder_step(step, std::move(tokens));
    std::string out;
    for (const auto& t : tokens) out += t;
    return out;
  }

  bool is_byte_token(int32_t id) const {
    return valid_id(id) && byte_token_value(id_to_token[static_cast<size_t>(id)]) >= 0;
  }

  // Derives bos/eos from the post-processor and well-known special token names (tokenizer.json itself does not
  // say which token ends a sequence; tokenizer_config.json does).
  void guess_bos_eos() {
    auto find_special = [&](const char* name) -> int32_t {
      for (const auto& a : added)
        if (a.special && a.content == name) return a.id;
      return -1;
    };
    if (!prefix_ids.empty()) {
      bos = prefix_ids.front();
    } else {
      for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>"}) {
        if ((bos = find_special(name)) >= 0) break;
      }
    }
    for (int32_t id : suffix_ids) eos.push_back(id);
    for (const char* name : {"</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>",
                             "<|im_end|>", "<end_of_turn>"}) {
      const int32_t id = find_special(name);
      if (id >= 0 && std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    }
  }
};

namespace {

// ---------------------------------------------------------------------------------------------------------------
// tokenizer.json loading.

void parse_model(const json& model, Tokenizer::Impl& t) {
  check(model.is_object(), ErrorCode::kCorrupt, kOpJson, "model must be a JSON object; got ", model.type_name());
  std::string type = opt_string(model, "type", "model", "");
  if (type.empty() && model.contains("merges")) type = "BPE";  // very old files leave the type out
  check(type == "BPE", ErrorCode::kUnsupported, kOpJson, "model type must be BPE; got ",
        type.empty() ? "none" : type);
  {
    auto it = model.find("dropout");
    const bool no_dropout = it == model.end() || it->is_null() || (it->is_number() && it->get<double>() == 0.0);
    check(no_dropout, ErrorCode::kUnsupported, kOpJson, "model.dropout must be null (no BPE dropout); got ",
          it == model.end() ? "" : it->dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const std::string v = opt_string(model, key, "model", "");
    check(v.empty(), ErrorCode::kUnsupported, kOpJson, "model.", key, " must be empty or null; got \"", v, "\"");
  }
  t.fuse_unk = opt_bool(model, "fuse_unk", "model", false);
  t.byte_fallback = opt_bool(model, "byte_fallback", "model", false);
  t.ignore_merges = opt_bool(model, "ignore_merges", "model", false);

  const json& vocab = require(model, "vocab", "model");
  check(vocab.is_object(), ErrorCode::kCorrupt, kOpJson, "model.vocab must be an object {token: id}; got ",
        vocab.type_name());
  t.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = to_token_id(get_int(it.value(), "model.vocab value"), kOpJson, "model.vocab value");
    t.vocab[it.key()] = id;
    t.set_token(id, it.key());
  }

  const std::string unk = opt_string(model, "unk_token", "model", "");
  if (!unk.empty()) {
    auto it = t.vocab.find(unk);
    check(it != t.vocab.end(), ErrorCode::kCorrupt, kOpJson, "model.unk_token must be in the vocabulary; got \"",
          unk, "\"");
    t.unk_id = it->second;
  }

  const json& merges = require(model, "merges", "model");
  check(merges.is_array(), ErrorCode::kCorrupt, kOpJson, "model.merges must be an array; got ", merges.type_name());
  t.merges.reserve(merges.size());
  int32_t rank = 0;
  for (const auto& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      // "a b": the older form; tokens never contain a plain space in these vocabularies.
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      check(sp != std::string::npos && sp != 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
            ErrorCode::kCorrupt, kOpJson, "model.merges entries must be \"a b\" with one space; got \"", s, "\"");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      if (!(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())) {
        fail(ErrorCode::kCorrupt, kOpJson, "model.merges entries must be \"a b\" or [\"a\", \"b\"]; got ", brief(m));
      }
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    auto ia = t.vocab.find(a), ib = t.vocab.find(b), ic = t.vocab.find(a + b);
    check(ia != t.vocab.end() && ib != t.vocab.end(), ErrorCode::kCorrupt, kOpJson,
          "model.merges entries must join vocabulary tokens; got \"", a, "\" + \"", b, "\" at rank ", rank);
    check(ic != t.vocab.end(), ErrorCode::kCorrupt, kOpJson,
          "model.merges results must be in the vocabulary; got \"", a + b, "\" at rank ", rank);
    // The first occurrence of a pair wins, as in HF (later duplicates have a higher rank and never apply).
    t.merges.emplace(pair_key(ia->second, ib->second), MergeInfo{rank, ic->second});
    ++rank;
  }
  t.finish_byte_ids();
}

void parse_added_tokens(const json& list, Tokenizer::Impl& t) {
  check(list.is_array(), ErrorCode::kCorrupt, kOpJson, "added_tokens must be an array; got ", list.type_name());
  for (const auto& a : list) {
    AddedToken tok;
    tok.id = to_token_id(get_int(require(a, "id", "added_tokens[]"), "added_tokens[].id"), kOpJson,
                         "added_tokens[].id");
    tok.content = get_string(a, "content", "added_tokens[]");
    check(!tok.content.empty(), ErrorCode::kCorrupt, kOpJson, "added_tokens[].content must not be empty; got \"\"",
          " for id ", tok.id);
    check(uni::find_invalid_utf8(tok.content) == std::string_view::npos, ErrorCode::kCorrupt, kOpJson,
          "added_tokens[].content must be valid UTF-8; got invalid bytes for id ", tok.id);
    tok.special = opt_bool(a, "special", "added_tokens[]", false);
    tok.single_word = opt_bool(a, "single_word", "added_tokens[]", false);
    tok.lstrip = opt_bool(a, "lstrip", "added_tokens[]", false);
    tok.rstrip = opt_bool(a, "rstrip", "added_tokens[]", false);
    tok.normalized = opt_bool(a, "normalized", "added_tokens[]", !tok.special);
    t.added.push_back(std::move(tok));
  }
}

void parse_post_processor(const json& obj, Tokenizer::Impl& t) {
  if (obj.is_null()) return;
  const std::string type = type_of(obj, "post_processor");
  if (type == "Sequence") {
    const json& list = require(obj, "processors", "post_processor");
    check(list.is_array(), ErrorCode::kCorrupt, kOpJson, "post_processor.processors must be an array; got ",
          list.type_name());
    for (const auto& p : list) parse_post_processor(p, t);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets in HF; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    const json& single = require(obj, "single", "post_processor(TemplateProcessing)");
    const json& specials = require(obj, "special_tokens", "post_processor(TemplateProcessing)");
    check(single.is_array(), ErrorCode::kCorrupt, kOpJson,
          "post_processor(TemplateProcessing).single must be an array; got ", single.type_name());
    std::vector<int32_t> before, after;
    bool seen_a = false;
    for (const auto& item : single) {
      if (item.is_object() && item.contains("Sequence")) {
        const std::string id = get_string(item["Sequence"], "id", "post_processor(TemplateProcessing).single[]");
        check(id == "A" && !seen_a, ErrorCode::kCorrupt, kOpJson,
              "post_processor(TemplateProcessing).single must hold the sequence $A once; got $", id);
        seen_a = true;
      } else if (item.is_object() && item.contains("SpecialToken")) {
        const std::string name =
            get_string(item["SpecialToken"], "id", "post_processor(TemplateProcessing).single[]");
        check(specials.is_object() && specials.contains(name), ErrorCode::kCorrupt, kOpJson,
              "post_processor(TemplateProcessing).special_tokens must define every template token; got none for ",
              name);
        const json& ids = require(specials[name], "ids", "post_processor(TemplateProcessing).special_tokens[]");
        check(ids.is_array(), ErrorCode::kCorrupt, kOpJson,
              "post_processor(TemplateProcessing).special_tokens[].ids must be an array; got ", ids.type_name());
        for (const auto& v : ids) {
          const int32_t id = to_token_id(get_int(v, "post_processor special token id"), kOpJson,
                                         "post_processor special token id");
          (seen_a ? after : before).push_back(id);
        }
      } else {
        fail(ErrorCode::kCorrupt, kOpJson,
             "post_processor(TemplateProcessing).single items must be {\"Sequence\"} or {\"SpecialToken\"}; got ",
             brief(item));
      }
    }
    check(seen_a, ErrorCode::kCorrupt, kOpJson,
          "post_processor(TemplateProcessing).single must hold the sequence $A; got ", brief(single));
    // Templates nested in a Sequence wrap what came before them.
    t.prefix_ids.insert(t.prefix_ids.begin(), before.begin(), before.end());
    t.suffix_ids.insert(t.suffix_ids.end(), after.begin(), after.end());
  } else {
    fail(ErrorCode::kUnsupported, kOpJson,
         "post_processor type must be one of TemplateProcessing, ByteLevel, Sequence or null; got ", type);
  }
}

// Added tokens enter the id space after the model vocabulary, and their match strings need the normalizer.
void finish_added_tokens(Tokenizer::Impl& t) {
  for (auto& a : t.added) {
    a.match_text = a.content;
    if (a.normalized && t.normalizer) t.normalizer->apply(a.match_text);
    t.set_token(a.id, a.match_text);
    t.id_special[static_cast<size_t>(a.id)] = a.special ? 1 : 0;
  }
  t.build_tries();
}

void check_post_ids(const Tokenizer::Impl& t, const char* op) {
  for (const auto* v : {&t.prefix_ids, &t.suffix_ids})
    for (int32_t id : *v)
      check(t.valid_id(id), ErrorCode::kCorrupt, op, "post-processor token ids must be in the vocabulary; got ", id);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Public API.

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json_file(const std::string& path) {
  return from_json(read_text_input(path, "tokenizer.from_json_file"));
}

Tokenizer Tokenizer::from_json(std::string_view json_text) {
  check_json_nesting(json_text.data(), json_text.data() + json_text.size(), kOpJson, "tokenizer.json");
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::parse_error& e) {
    fail(ErrorCode::kCorrupt, kOpJson, "tokenizer.json must be valid JSON; got ", e.what());
  }
  check(root.is_object(), ErrorCode::kCorrupt, kOpJson, "tokenizer.json must be a JSON object; got ",
        root.type_name());
  auto t = std::make_unique<Impl>();
  parse_model(require(root, "model", "tokenizer.json"), *t);
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) parse_added_tokens(root["added_tokens"], *t);
  if (root.contains("normalizer") && !root["normalizer"].is_null())
    t->normalizer = parse_normalizer(root["normalizer"]);
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null())
    t->pre_tokenizer = parse_pre_tokenizer(root["pre_tokenizer"]);
  if (root.contains("decoder") && !root["decoder"].is_null()) {
    t->has_decoder = true;
    parse_decoder(root["decoder"], t->decoder);
  }
  if (root.contains("post_processor")) parse_post_processor(root["post_processor"], *t);
  finish_added_tokens(*t);
  check_post_ids(*t, kOpJson);
  for (const auto& d : t->decoder) t->decoder_has_byte_fallback |= d.kind == DecoderStep::kByteFallback;
  t->guess_bos_eos();
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::from_gguf(const GGUFFile& gguf) {
  auto t = std::make_unique<Impl>();
  check(gguf.has("tokenizer.ggml.model"), ErrorCode::kCorrupt, kOpGguf,
        "the file must have tokenizer.ggml.model; got none");
  const std::string model = gguf.get_string("tokenizer.ggml.model");
  check(model == "gpt2" || model == "llama", ErrorCode::kUnsupported, kOpGguf,
        "tokenizer.ggml.model must be gpt2 (byte-level BPE) or llama (SentencePiece BPE); got ", model);
  const std::vector<std::string> tokens = gguf.get_string_array("tokenizer.ggml.tokens");
  check(!tokens.empty() && tokens.size() <= static_cast<size_t>(limits::kMaxTokenId) + 1, ErrorCode::kCorrupt,
        kOpGguf, "tokenizer.ggml.tokens must hold 1 to ", limits::kMaxTokenId + 1, " tokens; got ", tokens.size());
  std::vector<int64_t> types;
  if (gguf.has("tokenizer.ggml.token_type")) {
    types = gguf.get_int_array("tokenizer.ggml.token_type");
    check(types.size() == tokens.size(), ErrorCode::kCorrupt, kOpGguf,
          "tokenizer.ggml.token_type must have one entry per token (", tokens.size(), "); got ", types.size());
  } else {
    types.assign(tokens.size(), 1);
  }
  // llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
  constexpr int64_t kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    check(uni::find_invalid_utf8(tokens[i]) == std::string_view::npos, ErrorCode::kCorrupt, kOpGguf,
          "tokenizer.ggml.tokens must be valid UTF-8; got invalid bytes in token ", i);
    t->set_token(id, tokens[i]);
    if (types[i] != kUnused) t->vocab.emplace(tokens[i], id);  // the first of duplicate strings wins
    if ((types[i] == kControl || types[i] == kUserDefined || types[i] == kUnknown) && !tokens[i].empty()) {
      // Control, unknown and user-defined tokens are matched in the raw text, as llama.cpp's special-token
      // partition (and HF's added tokens) do.
      AddedToken a;
      a.content = a.match_text = tokens[i];
      a.id = id;
      a.special = types[i] != kUserDefined;
      t->added.push_back(std::move(a));
      t->id_special[i] = types[i] != kUserDefined ? 1 : 0;
    }
  }
  auto opt_id = [&](const char* key) -> int32_t {
    if (!gguf.has(key)) return -1;
    const int64_t v = gguf.get_int(key);
    check(v >= 0 && v < static_cast<int64_t>(tokens.size()), ErrorCode::kCorrupt, kOpGguf, key,
          " must be a token id below ", tokens.size(), "; got ", v);
    return static_cast<int32_t>(v);
  };
  auto opt_flag = [&](const char* key, bool def) { return gguf.has(key) ? gguf.get_int(key) != 0 : def; };
  const int32_t bos = opt_id("tokenizer.ggml.bos_token_id");
  const int32_t eos = opt_id("tokenizer.ggml.eos_token_id");
  t->unk_id = opt_id("tokenizer.ggml.unknown_token_id");
  t->bos = bos;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = opt_id(key);
    if (id >= 0 && std::find(t->eos.begin(), t->eos.end(), id) == t->eos.end()) t->eos.push_back(id);
  }
  // The family of a byte-level vocabulary (tokenizer.ggml.pre) decides its pre-tokenizer, normalizer and merge
  // rule, and whether BOS is added when the file does not say.
  const std::string pre_name = gguf.has("tokenizer.ggml.pre") ? gguf.get_string("tokenizer.ggml.pre") : "default";
  const GgufPreType* family = nullptr;
  if (model == "gpt2") {
    family = find_gguf_pre_type(pre_name);
    if (family == nullptr) {
      for (const auto& [name, reason] : gguf_pre_types_refused()) {
        check(pre_name != name, ErrorCode::kUnsupported, kOpGguf, "tokenizer.ggml.pre ", name,
              " is known but not supported: it needs ", reason);
      }
      fail(ErrorCode::kUnsupported, kOpGguf, "tokenizer.ggml.pre must be one of ", gguf_pre_type_list(), "; got ",
           pre_name);
    }
  }
  // Without an explicit add_bos_token, BOS is added where the model family's tokenizer adds it: SentencePiece
  // vocabularies and the byte-level families whose table entry says so (Llama 3, Tekken); llama.cpp's defaults too.
  const bool bos_default = model == "llama" || (family != nullptr && family->add_bos);
  if (opt_flag("tokenizer.ggml.add_bos_token", bos_default) && bos >= 0) t->prefix_ids.push_back(bos);
  if (opt_flag("tokenizer.ggml.add_eos_token", false) && eos >= 0) t->suffix_ids.push_back(eos);
  t->has_decoder = true;

  if (model == "gpt2") {
    t->pre_tokenizer = build_pre_tokenizer(*family);
    t->ignore_merges = family->ignore_merges;
    if (family->nfc) {
      Normalizer n;
      n.kind = Normalizer::kNFC;
      t->normalizer = n;
    }
    const std::vector<std::string> merges = gguf.get_string_array("tokenizer.ggml.merges");
    int32_t rank = 0;
    for (const auto& s : merges) {
      const size_t sp = s.find(' ');
      check(sp != std::string::npos && sp != 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
            ErrorCode::kCorrupt, kOpGguf, "tokenizer.ggml.merges entries must be \"a b\" with one space; got \"", s,
            "\"");
      const std::string a = s.substr(0, sp), b = s.substr(sp + 1);
      auto ia = t->vocab.find(a), ib = t->vocab.find(b), ic = t->vocab.find(a + b);
      check(ia != t->vocab.end() && ib != t->vocab.end() && ic != t->vocab.end(), ErrorCode::kCorrupt, kOpGguf,
            "tokenizer.ggml.merges must join tokens into a token; got \"", s, "\" at rank ", rank);
      t->merges.emplace(pair_key(ia->second, ib->second), MergeInfo{rank, ic->second});
      ++rank;
    }
    DecoderStep d;
    d.kind = DecoderStep::kByteLevel;
    t->decoder.push_back(d);
  } else {
    const std::vector<double> scores = gguf.get_float_array("tokenizer.ggml.scores");
    check(scores.size() == tokens.size(), ErrorCode::kCorrupt, kOpGguf,
          "tokenizer.ggml.scores must have one entry per token (", tokens.size(), "); got ", scores.size());
    t->scores.assign(scores.begin(), scores.end());
    for (double s : scores)
      check(std::isfinite(s), ErrorCode::kCorrupt, kOpGguf, "tokenizer.ggml.scores must be finite; got ", s);
    t->merge_by_score = true;
    t->byte_fallback = true;
    // Spaces become "▁"; a "▁" is prepended to every text piece (llama.cpp's add_space_prefix, HF's legacy Prepend).
    Normalizer seq;
    seq.kind = Normalizer::kSequence;
    if (opt_flag("tokenizer.ggml.add_space_prefix", true)) {
      Normalizer p;
      p.kind = Normalizer::kPrepend;
      p.text = "\xE2\x96\x81";
      seq.children.push_back(p);
    }
    Normalizer r;
    r.kind = Normalizer::kReplace;
    r.pattern.literal = " ";
    r.text = "\xE2\x96\x81";
    seq.children.push_back(r);
    t->normalizer = std::move(seq);
    DecoderStep rep;
    rep.kind = DecoderStep::kReplace;
    rep.pattern.literal = "\xE2\x96\x81";
    rep.text = " ";
    DecoderStep fb;
    fb.kind = DecoderStep::kByteFallback;
    DecoderStep fuse;
    fuse.kind = DecoderStep::kFuse;
    t->decoder = {rep, fb, fuse};
    if (opt_flag("tokenizer.ggml.add_space_prefix", true)) {
      DecoderStep strip;
      strip.kind = DecoderStep::kStrip;
      strip.strip_char = ' ';
      strip.strip_start = 1;
      t->decoder.push_back(strip);
    }
    t->decoder_has_byte_fallback = true;
  }
  t->finish_byte_ids();
  // Byte tokens are decoded by the decoder, not matched in text.
  t->build_tries();
  check_post_ids(*t, kOpGguf);
  return Tokenizer(std::move(t));
}

std::vector<std::string> Tokenizer::gguf_pre_types() {
  std::vector<std::string> out;
  for (const auto& t : cider::model::gguf_pre_types())
    for (const char* n : t.names) out.emplace_back(n);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  return impl_->encode(text, add_special);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  return impl_->decode(ids, skip_special);
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_present.size()); }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
std::vector<int32_t> Tokenizer::eos_ids() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  return impl_->valid_id(id) && impl_->id_special[static_cast<size_t>(id)] != 0;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto added = impl_->added_by_content.find(token);
  if (added != impl_->added_by_content.end()) return added->second;
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  check(impl_->valid_id(id), ErrorCode::kOutOfRange, "tokenizer.id_to_token",
        "id must be in the vocabulary [0, ", impl_->id_present.size(), "); got ", id);
  return impl_->id_to_token[static_cast<size_t>(id)];
}

// ---------------------------------------------------------------------------------------------------------------
// Streaming. ids_ is a window of the most recent ids whose decoded text starts with emitted_bytes_ bytes already
// returned; the text after them is returned once it can no longer change:
//   * a trailing run of U+FFFD may be an unfinished character (more byte tokens can complete it): held back;
//   * with a ByteFallback decoder, a trailing run of <0xNN> tokens is held back entirely, because HF turns the
//     whole run into U+FFFDs when any part of it is invalid;
//   * after a Strip decoder with stop > 0, trailing strip characters are held back.
// The window restarts at the last id once everything is out and that id decodes cleanly on its own, so each push
// decodes a few ids, not the whole stream; first-token rules (Metaspace, Strip) then apply to that id in both
// decodes and cancel out.

Tokenizer::StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special)
    : tok_(&tok), skip_special_(skip_special) {}

std::string Tokenizer::StreamDecoder::push(int32_t id) {
  const Impl& impl = *tok_->impl_;
  check(impl.valid_id(id), ErrorCode::kOutOfRange, "tokenizer.stream_decode",
        "token ids must be in the vocabulary [0, ", impl.id_present.size(), "); got ", id);
  ids_.push_back(id);
  size_t stable_ids = ids_.size();
  if (impl.decoder_has_byte_fallback) {
    // A trailing run of byte tokens may still be completed (or turned into U+FFFD as a whole) by the next ids. A
    // skipped special token does not end such a run: decode() drops it and joins the bytes around it (found by
    // fuzz_tokenizer: tests/fuzz/regressions/tokenizer/stream_decoder_byte_run_across_skipped_special_*).
    auto transparent = [&](int32_t t) {
      return impl.is_byte_token(t) || (skip_special_ && impl.id_special[static_cast<size_t>(t)] != 0);
    };
    while (stable_ids > 0 && transparent(ids_[stable_ids - 1])) --stable_ids;
  }
  std::string text = impl.decode(std::vector<int32_t>(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(stable_ids)),
                                 skip_special_);
  size_t stable = text.size();
  while (stable >= 3 && text.compare(stable - 3, 3, "\xEF\xBF\xBD") == 0) stable -= 3;
  for (const auto& d : impl.decoder) {
    if (d.kind != DecoderStep::kStrip || d.strip_stop == 0) continue;
    std::string c;
    uni::append_utf8(c, d.strip_char);
    while (stable >= c.size() && text.compare(stable - c.size(), c.size(), c) == 0) stable -= c.size();
  }
  std::string out;
  if (stable > emitted_bytes_) {
    out = text.substr(emitted_bytes_, stable - emitted_bytes_);
    emitted_bytes_ = stable;
  }
  if (stable_ids == ids_.size() && stable == text.size() && emitted_bytes_ == text.size()) {
    const std::vector<int32_t> last{ids_.back()};
    std::string alone = impl.decode(last, skip_special_);
    // An id that decodes to nothing (a skipped special token, a stripped "▁") cannot start the window: the next
    // token would then be decoded as a first token.
    const bool clean = !alone.empty() && alone.find("\xEF\xBF\xBD") == std::string::npos &&
                       !impl.is_byte_token(ids_.back());
    if (clean) {
      ids_ = last;
      emitted_bytes_ = alone.size();
    }
  }
  return out;
}

std::string Tokenizer::StreamDecoder::flush() {
  std::string text = tok_->impl_->decode(ids_, skip_special_);
  std::string out = text.size() > emitted_bytes_ ? text.substr(emitted_bytes_) : std::string();
  ids_.clear();
  emitted_bytes_ = 0;
  return out;
}

}  // namespace cider::model
