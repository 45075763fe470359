// cider/model/chat_template.cpp — the Jinja2-subset interpreter behind ChatTemplate (see chat_template.h for what it
// covers). Three stages: a lexer that reproduces jinja2's tokenizer (delimiters, whitespace control, trim_blocks and
// lstrip_blocks), a recursive-descent parser that follows jinja2's grammar (jinja2/parser.py) and builds an AST, and a
// tree-walking evaluator over Python-like values with jinja2's runtime semantics (Undefined, scoping of loops and
// macros, the sandbox's getattr/getitem, the filters and tests).
#include "model/chat_template.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/unicode.h"

namespace cider::model {

namespace {

constexpr const char* kOp = "chat_template";

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

// ------------------------------------------------------------------------------------------------------------------
// Errors. A render-time failure is a JinjaError (the Python exception class jinja2 would raise, and its message);
// the innermost AST node that sees it without a line stamps its line, and render() turns it into cider::Error.

struct JinjaError {
  std::string kind;     // "UndefinedError", "TypeError", "raise_exception", "limit", ...
  std::string message;  // jinja2's / Python's message where there is one
  int line = 0;
};

[[noreturn]] void throw_error(std::string kind, std::string message) {
  throw JinjaError{std::move(kind), std::move(message), 0};
}
[[noreturn]] void type_error(std::string message) { throw_error("TypeError", std::move(message)); }
[[noreturn]] void value_error(std::string message) { throw_error("ValueError", std::move(message)); }

// ------------------------------------------------------------------------------------------------------------------
// The running render's counters, for the helpers below that build text (repr, JSON), decode strings or walk values
// (comparisons) outside the Renderer: the Renderer installs its budget on its thread for the length of the render
// (outside a render, while parsing, there is none and nothing is counted).

struct Budget {
  const ChatTemplateLimits* lim = nullptr;
  int64_t iterations = 0;  // loop iterations and sequence items (iterated or compared), over the whole render
  size_t work = 0;         // bytes of strings built or decoded, over the whole render

  void tick(size_t n) {
    iterations += static_cast<int64_t>(n);
    if (iterations > lim->max_loop_iterations)
      throw_error("limit", "more than " + std::to_string(lim->max_loop_iterations) +
                               " loop iterations and sequence items in one render");
  }
  void add_work(size_t n) {
    work += n;
    if (work > lim->max_string_work_bytes)
      throw_error("limit",
                  "more than " + std::to_string(lim->max_string_work_bytes) + " bytes of strings built in one render");
  }
  // A string being built has reached `size` bytes: no string may exceed max_output_bytes.
  void check_size(size_t size) const {
    if (size > lim->max_output_bytes)
      throw_error("limit", "a string of " + std::to_string(size) + " bytes exceeds the limit of " +
                               std::to_string(lim->max_output_bytes));
  }
};

thread_local Budget* t_budget = nullptr;

void budget_tick(size_t n) {
  if (t_budget) t_budget->tick(n);
}
void budget_work(size_t n) {
  if (t_budget) t_budget->add_work(n);
}
void check_built(size_t size) {
  if (t_budget) t_budget->check_size(size);
}

// ------------------------------------------------------------------------------------------------------------------
// Unicode pieces: Python's str works on code points.

bool py_isspace(char32_t c) { return unicode::is_whitespace(c) || (c >= 0x1C && c <= 0x1F); }

std::u32string to_u32(std::string_view s) {
  budget_work(s.size());
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp = 0;
    size_t n = unicode::decode_utf8(s, i, cp);
    if (n == 0) {  // not reachable for validated input; keep going byte by byte
      cp = unicode::kReplacementChar;
      n = 1;
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) unicode::append_utf8(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

int64_t cp_length(std::string_view s) {
  budget_work(s.size());
  int64_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

// Substring search in linear time (glibc's memmem, the two-way algorithm; std::string::find can take
// |haystack| x |needle| steps): the byte offset of the first `needle` in `hay` at or after `from`, or npos.
size_t find_bytes(std::string_view hay, std::string_view needle, size_t from = 0) {
  if (from > hay.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  const void* p = ::memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  return p ? static_cast<size_t>(static_cast<const char*>(p) - hay.data()) : std::string_view::npos;
}

// The byte offset of the last `needle` in `hay`, or npos (a forward search over both reversed).
size_t rfind_bytes(std::string_view hay, std::string_view needle) {
  if (needle.empty()) return hay.size();
  if (needle.size() > hay.size()) return std::string_view::npos;
  const std::string rh(hay.rbegin(), hay.rend()), rn(needle.rbegin(), needle.rend());
  const size_t q = find_bytes(rh, rn);
  return q == std::string_view::npos ? q : hay.size() - q - needle.size();
}

// Simple case mappings for ASCII, Latin-1, Latin Extended-A, Latin Extended Additional, Greek, Cyrillic, Armenian
// and fullwidth Latin (what Python's str.lower/upper do there, less the few multi-character results noted below).
char32_t lower_cp(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c >= 0x100 && c <= 0x137 && c != 0x130) return (c % 2 == 0) ? c + 1 : c;
  if (c >= 0x139 && c <= 0x148) return (c % 2 == 1) ? c + 1 : c;
  if (c >= 0x14A && c <= 0x177) return (c % 2 == 0) ? c + 1 : c;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E) return (c % 2 == 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
    return (c % 2 == 0) ? c + 1 : c;
  if (c == 0x4C0) return 0x4CF;
  if (c >= 0x4C1 && c <= 0x4CE) return (c % 2 == 1) ? c + 1 : c;
  if (c >= 0x531 && c <= 0x556) return c + 48;
  if ((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) return (c % 2 == 0) ? c + 1 : c;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

char32_t upper_cp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (c == 0x131) return 'I';
  if (c == 0x17F) return 'S';
  if (c >= 0x100 && c <= 0x137 && c != 0x131) return (c % 2 == 1) ? c - 1 : c;
  if (c >= 0x139 && c <= 0x148) return (c % 2 == 0) ? c - 1 : c;
  if (c >= 0x14A && c <= 0x177) return (c % 2 == 1) ? c - 1 : c;
  if (c >= 0x179 && c <= 0x17E) return (c % 2 == 0) ? c - 1 : c;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x3B1 && c <= 0x3CB) return c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || (c >= 0x4D0 && c <= 0x52F))
    return (c % 2 == 1) ? c - 1 : c;
  if (c == 0x4CF) return 0x4C0;
  if (c >= 0x4C1 && c <= 0x4CE) return (c % 2 == 0) ? c - 1 : c;
  if (c >= 0x561 && c <= 0x586) return c - 48;
  if ((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) return (c % 2 == 1) ? c - 1 : c;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

bool is_upper_cp(char32_t c) { return lower_cp(c) != c || c == 0x130; }
bool is_lower_cp(char32_t c) { return upper_cp(c) != c || c == 0xDF; }
bool is_cased_cp(char32_t c) { return is_upper_cp(c) || is_lower_cp(c); }

void append_lower(std::u32string& out, char32_t c) {
  if (c == 0x130) {  // İ → i + combining dot above
    out.push_back('i');
    out.push_back(0x307);
  } else {
    out.push_back(lower_cp(c));
  }
}
bool is_case_ignorable_cp(char32_t c) {
  return c == '\'' || c == '.' || c == ':' || c == '^' || c == '`' || c == 0xA8 || c == 0xAD || c == 0xAF ||
         c == 0xB4 || c == 0xB7 || c == 0xB8 || c == 0x2018 || c == 0x2019 || c == 0x2024 || c == 0x2027 ||
         (c >= 0x300 && c <= 0x36F) || (c >= 0x483 && c <= 0x489) || (c >= 0x2B0 && c <= 0x2FF);
}

// Lower-cases in[i] into out, with Python's Final_Sigma rule: Σ after a cased letter and not before one is ς.
void append_lower_at(std::u32string& out, const std::u32string& in, size_t i) {
  if (in[i] != 0x3A3) {
    append_lower(out, in[i]);
    return;
  }
  size_t j = i;
  while (j > 0 && is_case_ignorable_cp(in[j - 1])) --j;
  bool final_sigma = j > 0 && is_cased_cp(in[j - 1]);
  if (final_sigma) {
    size_t k = i + 1;
    while (k < in.size() && is_case_ignorable_cp(in[k])) ++k;
    final_sigma = k == in.size() || !is_cased_cp(in[k]);
  }
  out.push_back(final_sigma ? 0x3C2 : 0x3C3);
}

void append_upper(std::u32string& out, char32_t c) {
  if (c == 0xDF) {  // ß → SS
    out.push_back('S');
    out.push_back('S');
  } else {
    out.push_back(upper_cp(c));
  }
}

std::string str_lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
    return out;
  }
  std::u32string in = to_u32(s), out;
  for (size_t i = 0; i < in.size(); ++i) append_lower_at(out, in, i);
  return to_utf8(out);
}

std::string str_upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
    return out;
  }
  std::u32string out;
  for (char32_t c : to_u32(s)) append_upper(out, c);
  return to_utf8(out);
}

// Python's str.capitalize: the first character upper (title) case, the rest lower.
std::string str_capitalize(std::string_view s) {
  std::u32string in = to_u32(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0)
      append_upper(out, in[i]);
    else
      append_lower_at(out, in, i);
  }
  return to_utf8(out);
}

// Python's str.title: a cased character after an uncased one is upper-cased, after a cased one lower-cased.
std::string str_title_py(std::string_view s) {
  std::u32string in = to_u32(s), out;
  bool prev_cased = false;
  for (size_t i = 0; i < in.size(); ++i) {
    const char32_t c = in[i];
    if (is_upper_cp(c)) {
      if (prev_cased)
        append_lower_at(out, in, i);
      else
        out.push_back(c);
      prev_cased = true;
    } else if (is_lower_cp(c)) {
      if (prev_cased)
        out.push_back(c);
      else
        append_upper(out, c);
      prev_cased = true;
    } else {
      out.push_back(c);
      prev_cased = false;
    }
  }
  return to_utf8(out);
}

std::string str_swapcase(std::string_view s) {
  std::u32string in = to_u32(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    const char32_t c = in[i];
    if (is_upper_cp(c))
      append_lower_at(out, in, i);
    else if (is_lower_cp(c))
      append_upper(out, c);
    else
      out.push_back(c);
  }
  return to_utf8(out);
}

// jinja2's |title: split on runs of -, whitespace, ( { [ < (keeping them); each piece's first character upper, the
// rest lower.
std::string filter_title(std::string_view s) {
  std::u32string in = to_u32(s), out;
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  size_t i = 0;
  while (i < in.size()) {
    size_t j = i;
    bool sep = is_sep(in[i]);
    while (j < in.size() && is_sep(in[j]) == sep) ++j;
    for (size_t k = i; k < j; ++k) {
      if (k == i)
        append_upper(out, in[k]);
      else
        append_lower_at(out, in, k);
    }
    i = j;
  }
  return to_utf8(out);
}

// Python's str.isprintable for one code point, approximately: the C0/C1 controls, the separators other than space,
// the format characters of the common blocks, surrogates and private use are not printable.
bool is_printable_cp(char32_t c) {
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c <= 0xA0 || c == 0xAD) return false;
  if (c == 0x61C || c == 0x1680 || c == 0x180E) return false;
  if (c >= 0x2000 && c <= 0x200F) return false;
  if (c >= 0x2028 && c <= 0x202F) return false;
  if (c >= 0x205F && c <= 0x206F) return false;
  if (c == 0x3000 || c == 0xFEFF) return false;
  if (c >= 0xD800 && c <= 0xF8FF) return false;
  if (c >= 0xFFF0 && c <= 0xFFFB) return false;
  if (c >= 0xF0000) return false;
  return true;
}

// ------------------------------------------------------------------------------------------------------------------
// Values: Python's, as jinja2 sees them.

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Namespace;
struct Callable;
struct LoopInfo;

enum class VT : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kNamespace, kCallable, kLoop };
enum : uint8_t {
  kFlagTuple = 1,
  kFlagGenerator = 2,
  kFlagSecurity = 4,
  kFlagItems = 8,
  kFlagKeys = 16,
  kFlagValues = 32,
  kFlagMarkup = 64  // kStr: markupsafe.Markup (made by |safe and |escape): `+` with it escapes the plain side
};
constexpr uint8_t kFlagView = kFlagItems | kFlagKeys | kFlagValues;  // dict.items()/keys()/values()

// Containers nest at most this deep (the variables, and what a template builds): the recursive walks over values
// (printing, comparing, JSON, destruction) stay within a small, fixed stack.
constexpr int kMaxValueDepth = 512;

struct Value {
  VT t = VT::kUndefined;
  uint8_t flags = 0;   // kFlag* above
  uint16_t depth = 0;  // kList/kDict: 1 + the deepest item's depth
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::shared_ptr<const std::string> s;  // kStr: the text; kUndefined: the message of the error using it raises
  std::shared_ptr<const List> l;
  std::shared_ptr<const Dict> d;
  std::shared_ptr<Namespace> ns;
  std::shared_ptr<const Callable> fn;
  std::shared_ptr<const LoopInfo> loop;

  static Value none() {
    Value v;
    v.t = VT::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.t = VT::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.t = VT::kInt;
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.t = VT::kFloat;
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.t = VT::kStr;
    v.s = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static Value markup(std::string x) {
    Value v = str(std::move(x));
    v.flags = kFlagMarkup;
    return v;
  }
  static Value list(List x, uint8_t flags = 0) {
    Value v;
    v.t = VT::kList;
    v.flags = flags;
    int d = 0;
    for (const auto& item : x) d = std::max<int>(d, item.depth);
    if (d + 1 > kMaxValueDepth) throw_error("limit", "values nested more than 512 deep");
    v.depth = static_cast<uint16_t>(d + 1);
    v.l = std::make_shared<const List>(std::move(x));
    return v;
  }
  static Value undefined(std::string message, uint8_t flags = 0) {
    Value v;
    v.t = VT::kUndefined;
    v.flags = flags;
    v.s = std::make_shared<const std::string>(std::move(message));
    return v;
  }

  bool undef() const { return t == VT::kUndefined; }
  bool is_str() const { return t == VT::kStr; }
  bool is_markup() const { return t == VT::kStr && (flags & kFlagMarkup); }
  bool is_list() const { return t == VT::kList; }
  bool is_tuple() const { return t == VT::kList && (flags & kFlagTuple); }
  bool is_gen() const { return t == VT::kList && (flags & kFlagGenerator); }
  bool is_view() const { return t == VT::kList && (flags & kFlagView); }
  bool is_seq() const { return t == VT::kList && !(flags & (kFlagGenerator | kFlagView)); }  // list or tuple
  bool is_int_like() const { return t == VT::kInt || t == VT::kBool; }
  bool is_number() const { return t == VT::kInt || t == VT::kBool || t == VT::kFloat; }
  int64_t as_int() const { return t == VT::kBool ? (b ? 1 : 0) : i; }
  double as_double() const { return t == VT::kFloat ? f : static_cast<double>(as_int()); }
  const std::string& str_ref() const { return *s; }
};

bool py_eq(const Value& a, const Value& b, int depth = 0);

struct Dict {
  std::vector<std::pair<Value, Value>> items;
  std::unordered_map<std::string, size_t> index;  // string keys → position in items

  const Value* find_str(std::string_view key) const {
    auto it = index.find(std::string(key));
    return it == index.end() ? nullptr : &items[it->second].second;
  }
  const Value* find(const Value& key) const {
    if (key.is_str()) return find_str(key.str_ref());
    for (const auto& kv : items)
      if (!kv.first.is_str() && py_eq(kv.first, key)) return &kv.second;
    return nullptr;
  }
  void set(Value key, Value value) {
    if (key.is_str()) {
      auto it = index.find(key.str_ref());
      if (it != index.end()) {
        items[it->second].second = std::move(value);
        return;
      }
      index.emplace(key.str_ref(), items.size());
    } else {
      for (auto& kv : items)
        if (!kv.first.is_str() && py_eq(kv.first, key)) {
          kv.second = std::move(value);
          return;
        }
    }
    items.emplace_back(std::move(key), std::move(value));
  }
};

Value make_dict(Dict d) {
  Value v;
  v.t = VT::kDict;
  int depth = 0;
  for (const auto& kv : d.items) depth = std::max<int>(depth, std::max<int>(kv.first.depth, kv.second.depth));
  if (depth + 1 > kMaxValueDepth) throw_error("limit", "values nested more than 512 deep");
  v.depth = static_cast<uint16_t>(depth + 1);
  v.d = std::make_shared<const Dict>(std::move(d));
  return v;
}

struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const {
    for (const auto& kv : attrs)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    for (auto& kv : attrs)
      if (kv.first == name) {
        kv.second = std::move(value);
        return;
      }
    attrs.emplace_back(name, std::move(value));
  }
};

struct MacroDef;
struct Scope;

struct Callable {
  enum class K { kMacro, kGlobal, kMethod } k = K::kGlobal;
  std::string name;                 // the global's or method's name; the macro's name
  const MacroDef* macro = nullptr;  // kMacro (owned by the parsed template, which outlives the render)
  Scope* closure = nullptr;         // kMacro: the scope it was defined in (owned by the render's arena)
  Value self;                       // kMethod: the object
};

struct LoopInfo {
  std::shared_ptr<const List> items;
  int64_t index0 = 0;
  int64_t length = 0;
};

Value make_callable(Callable c) {
  Value v;
  v.t = VT::kCallable;
  v.fn = std::make_shared<const Callable>(std::move(c));
  return v;
}

Value make_method(const Value& self, std::string name) {
  Callable c;
  c.k = Callable::K::kMethod;
  c.name = std::move(name);
  c.self = self;
  return make_callable(std::move(c));
}

// Python's type(x).__name__.
std::string type_name(const Value& v) {
  switch (v.t) {
    case VT::kUndefined: return "Undefined";
    case VT::kNone: return "NoneType";
    case VT::kBool: return "bool";
    case VT::kInt: return "int";
    case VT::kFloat: return "float";
    case VT::kStr: return v.is_markup() ? "Markup" : "str";
    case VT::kList:
      if (v.flags & kFlagItems) return "dict_items";
      if (v.flags & kFlagKeys) return "dict_keys";
      if (v.flags & kFlagValues) return "dict_values";
      return v.is_gen() ? "generator" : v.is_tuple() ? "tuple" : "list";
    case VT::kDict: return "dict";
    case VT::kNamespace: return "Namespace";
    case VT::kCallable:
      return v.fn->k == Callable::K::kMacro
                 ? "Macro"
                 : (v.fn->k == Callable::K::kMethod ? "builtin_function_or_method" : "function");
    case VT::kLoop: return "LoopContext";
  }
  return "object";
}

// jinja2.utils.object_type_repr.
std::string object_type_repr(const Value& v) {
  switch (v.t) {
    case VT::kNone: return "None";
    case VT::kNamespace: return "jinja2.utils.Namespace object";
    case VT::kLoop: return "jinja2.runtime.LoopContext object";
    case VT::kUndefined: return "jinja2.runtime.Undefined object";
    case VT::kCallable:
      if (v.fn->k == Callable::K::kMacro) return "jinja2.runtime.Macro object";
      return type_name(v) + " object";
    default: return type_name(v) + " object";
  }
}

[[noreturn]] void fail_undefined(const Value& u) {
  throw_error((u.flags & kFlagSecurity) ? "SecurityError" : "UndefinedError", u.s ? *u.s : std::string("undefined"));
}

Value undefined_name(std::string_view name) { return Value::undefined("'" + std::string(name) + "' is undefined"); }

std::string py_repr(const Value& v, int depth = 0);

Value undefined_attr(const Value& obj, const Value& key) {
  if (key.is_str()) return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + key.str_ref() + "'");
  return Value::undefined(object_type_repr(obj) + " has no element " + py_repr(key));
}
Value undefined_attr(const Value& obj, std::string_view name) {
  return undefined_attr(obj, Value::str(std::string(name)));
}

Value unsafe_attr(const Value& obj, std::string_view name) {
  return Value::undefined(
      "access to attribute '" + std::string(name) + "' of '" + type_name(obj) + "' object is unsafe.", kFlagSecurity);
}

void check_depth(int depth) {
  if (depth > kMaxValueDepth) throw_error("limit", "values nested more than 512 deep");
}

// Python's truth value.
bool truthy(const Value& v) {
  switch (v.t) {
    case VT::kUndefined:
    case VT::kNone: return false;
    case VT::kBool: return v.b;
    case VT::kInt: return v.i != 0;
    case VT::kFloat: return v.f != 0.0;
    case VT::kStr: return !v.s->empty();
    case VT::kList: return v.is_gen() || !v.l->empty();
    case VT::kDict: return !v.d->items.empty();
    default: return true;
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Python's str() and repr().

// repr(float): the shortest digits that round-trip, fixed notation for exponents -4..15, else d.ddde±XX.
std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(res.ptr - buf));
  bool neg = false;
  if (s[0] == '-') {
    neg = true;
    s.remove_prefix(1);
  }
  size_t epos = s.find('e');
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (s[k] != '.') digits.push_back(s[k]);
  int exp10 = 0;
  std::from_chars(s.data() + epos + 1 + (s[epos + 1] == '+' ? 1 : 0), s.data() + s.size(), exp10);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp10 + 1;
  const int nd = static_cast<int>(digits.size());
  std::string out = neg ? "-" : "";
  if (decpt > 16 || decpt < -3) {
    out += digits[0];
    if (nd > 1) {
      out += '.';
      out += digits.substr(1);
    }
    const int e = decpt - 1;
    out += e < 0 ? "e-" : "e+";
    const int ae = e < 0 ? -e : e;
    if (ae < 10) out += '0';
    out += std::to_string(ae);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= nd) {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

void append_hex(std::string& out, uint32_t v, int width) {
  static const char* kHex = "0123456789abcdef";
  for (int k = width - 1; k >= 0; --k) out.push_back(kHex[(v >> (4 * k)) & 0xF]);
}

std::string py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    char32_t c = 0;
    size_t n = unicode::decode_utf8(s, i, c);
    if (n == 0) {
      c = unicode::kReplacementChar;
      n = 1;
    }
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x7F && c >= 0x20) {
      out += static_cast<char>(c);
    } else if (is_printable_cp(c)) {
      out.append(s.substr(i, n));
    } else if (c <= 0xFF) {
      out += "\\x";
      append_hex(out, c, 2);
    } else if (c <= 0xFFFF) {
      out += "\\u";
      append_hex(out, c, 4);
    } else {
      out += "\\U";
      append_hex(out, c, 8);
    }
    i += n;
  }
  out += quote;
  return out;
}

std::string py_str(const Value& v, int depth = 0);

// repr(v) appended to `out`, one buffer for the whole value: each item is checked against the longest string a render
// may build (items can repeat one shared value, so the text can grow exponentially with the nesting).
void repr_into(std::string& out, const Value& v, int depth) {
  check_depth(depth);
  switch (v.t) {
    case VT::kStr:
      out += v.is_markup() ? "Markup(" + py_str_repr(v.str_ref()) + ")" : py_str_repr(v.str_ref());
      return;
    case VT::kUndefined: out += "Undefined"; return;
    case VT::kList: {
      if (v.is_gen()) {
        out += "<generator object>";
        return;
      }
      out += v.is_view() ? type_name(v) + "([" : (v.is_tuple() ? "(" : "[");
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += ", ";
        repr_into(out, (*v.l)[k], depth + 1);
        check_built(out.size());
      }
      if (v.is_tuple() && v.l->size() == 1) out += ",";
      out += v.is_view() ? "])" : (v.is_tuple() ? ")" : "]");
      return;
    }
    case VT::kDict: {
      out += "{";
      bool first = true;
      for (const auto& kv : v.d->items) {
        if (!first) out += ", ";
        first = false;
        repr_into(out, kv.first, depth + 1);
        out += ": ";
        repr_into(out, kv.second, depth + 1);
        check_built(out.size());
      }
      out += "}";
      return;
    }
    case VT::kNamespace: {
      out += "<Namespace {";
      bool first = true;
      for (const auto& kv : v.ns->attrs) {
        if (!first) out += ", ";
        first = false;
        out += py_str_repr(kv.first) + ": ";
        repr_into(out, kv.second, depth + 1);
        check_built(out.size());
      }
      out += "}>";
      return;
    }
    default: out += py_str(v, depth);
  }
}

std::string py_repr(const Value& v, int depth) {
  std::string out;
  repr_into(out, v, depth);
  if (depth == 0 && (v.t == VT::kList || v.t == VT::kDict || v.t == VT::kNamespace)) budget_work(out.size());
  return out;
}

std::string py_str(const Value& v, int depth) {
  switch (v.t) {
    case VT::kUndefined: return "";
    case VT::kNone: return "None";
    case VT::kBool: return v.b ? "True" : "False";
    case VT::kInt: return std::to_string(v.i);
    case VT::kFloat: return py_float_repr(v.f);
    case VT::kStr: return v.str_ref();
    case VT::kCallable:
      if (v.fn->k == Callable::K::kMacro) return "<Macro '" + v.fn->name + "'>";
      return "<built-in function " + v.fn->name + ">";
    case VT::kLoop:
      return "<LoopContext " + std::to_string(v.loop->index0 + 1) + "/" + std::to_string(v.loop->length) + ">";
    default: return py_repr(v, depth);
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Python's comparisons.

bool py_eq(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.undef() || b.undef()) return a.undef() && b.undef();
  if (a.is_number() && b.is_number()) {
    if (a.is_int_like() && b.is_int_like()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case VT::kNone: return true;
    case VT::kStr: return a.s == b.s || a.str_ref() == b.str_ref();
    case VT::kList: {
      if (!a.is_seq() || !b.is_seq()) return a.l == b.l && a.flags == b.flags;
      if (a.is_tuple() != b.is_tuple() || a.l->size() != b.l->size()) return false;
      if (a.l == b.l) return true;
      budget_tick(a.l->size());  // (values can share items: without a count, comparing grows exponentially)
      for (size_t k = 0; k < a.l->size(); ++k)
        if (!py_eq((*a.l)[k], (*b.l)[k], depth + 1)) return false;
      return true;
    }
    case VT::kDict: {
      if (a.d == b.d) return true;
      if (a.d->items.size() != b.d->items.size()) return false;
      budget_tick(a.d->items.size());
      for (const auto& kv : a.d->items) {
        const Value* other = b.d->find(kv.first);
        if (!other || !py_eq(kv.second, *other, depth + 1)) return false;
      }
      return true;
    }
    case VT::kNamespace: return a.ns == b.ns;
    case VT::kCallable: return a.fn == b.fn;
    case VT::kLoop: return a.loop == b.loop;
    default: return false;
  }
}

// <0, 0, >0 as Python's ordering of a and b, or TypeError naming `op`.
int py_cmp(const Value& a, const Value& b, const char* op, int depth = 0) {
  check_depth(depth);
  if (a.undef()) fail_undefined(a);
  if (b.undef()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_int_like() && b.is_int_like()) {
      const int64_t x = a.as_int(), y = b.as_int();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const double x = a.as_double(), y = b.as_double();
    if (x < y) return -1;
    if (x > y) return 1;
    if (x == y) return 0;
    return 2;  // NaN: every ordering is false; the callers treat 2 as "unordered"
  }
  if (a.is_str() && b.is_str()) {
    const int c = a.str_ref().compare(b.str_ref());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_seq() && b.is_seq() && a.is_tuple() == b.is_tuple()) {
    const size_t n = std::min(a.l->size(), b.l->size());
    budget_tick(n);
    for (size_t k = 0; k < n; ++k)
      if (!py_eq((*a.l)[k], (*b.l)[k], depth + 1)) return py_cmp((*a.l)[k], (*b.l)[k], op, depth + 1);
    return a.l->size() < b.l->size() ? -1 : (a.l->size() > b.l->size() ? 1 : 0);
  }
  type_error(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
             type_name(b) + "'");
}

// ------------------------------------------------------------------------------------------------------------------
// JSON (transformers' tojson: json.dumps(x, ensure_ascii, indent, separators, sort_keys)).

void json_escape(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\b':
        out += "\\b";
        ++i;
        continue;
      case '\f':
        out += "\\f";
        ++i;
        continue;
      default: break;
    }
    if (c < 0x20) {
      out += "\\u";
      append_hex(out, c, 4);
      ++i;
    } else if (c < 0x80 || !ensure_ascii) {
      out += static_cast<char>(c);
      ++i;
    } else {
      char32_t cp = 0;
      size_t n = unicode::decode_utf8(s, i, cp);
      if (n == 0) {
        cp = unicode::kReplacementChar;
        n = 1;
      }
      if (cp >= 0x10000) {
        const uint32_t v = static_cast<uint32_t>(cp) - 0x10000;
        out += "\\u";
        append_hex(out, 0xD800 + (v >> 10), 4);
        out += "\\u";
        append_hex(out, 0xDC00 + (v & 0x3FF), 4);
      } else {
        out += "\\u";
        append_hex(out, cp, 4);
      }
      i += n;
    }
  }
  out += '"';
}

struct JsonStyle {
  bool ensure_ascii = false;
  bool pretty = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void json_dump(std::string& out, const Value& v, const JsonStyle& st, int level);

std::string json_key(const Value& k) {
  switch (k.t) {
    case VT::kStr: return k.str_ref();
    case VT::kInt: return std::to_string(k.i);
    case VT::kBool: return k.b ? "true" : "false";
    case VT::kNone: return "null";
    case VT::kFloat: {
      if (std::isnan(k.f)) return "NaN";
      if (std::isinf(k.f)) return k.f > 0 ? "Infinity" : "-Infinity";
      return py_float_repr(k.f);
    }
    default: type_error("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void json_newline(std::string& out, const JsonStyle& st, int level) {
  check_built(out.size() + 1 + static_cast<size_t>(level) * st.indent.size());
  out += '\n';
  for (int k = 0; k < level; ++k) out += st.indent;
}

void json_dump(std::string& out, const Value& v, const JsonStyle& st, int level) {
  check_depth(level);
  switch (v.t) {
    case VT::kNone: out += "null"; return;
    case VT::kBool: out += v.b ? "true" : "false"; return;
    case VT::kInt: out += std::to_string(v.i); return;
    case VT::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float_repr(v.f);
      return;
    case VT::kStr: json_escape(out, v.str_ref(), st.ensure_ascii); return;
    case VT::kList: {
      if (!v.is_seq()) type_error("Object of type " + type_name(v) + " is not JSON serializable");
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += st.item_sep;
        if (st.pretty) json_newline(out, st, level + 1);
        json_dump(out, (*v.l)[k], st, level + 1);
        check_built(out.size());
      }
      if (st.pretty) json_newline(out, st, level);
      out += ']';
      return;
    }
    case VT::kDict: {
      if (v.d->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.d->items) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* x, const auto* y) { return py_cmp(x->first, y->first, "<") < 0; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += st.item_sep;
        first = false;
        if (st.pretty) json_newline(out, st, level + 1);
        json_escape(out, json_key(kv->first), st.ensure_ascii);
        out += st.key_sep;
        json_dump(out, kv->second, st, level + 1);
        check_built(out.size());
      }
      if (st.pretty) json_newline(out, st, level);
      out += '}';
      return;
    }
    default: type_error("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Lexer: jinja2's tokenizer with trim_blocks and lstrip_blocks.

enum class TK : uint8_t {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOper,
  kEof
};

struct Token {
  TK k = TK::kEof;
  std::string text;  // data, name, string value, operator
  int64_t ival = 0;
  double fval = 0.0;
  int line = 1;
  int col = 1;
};

std::string describe(const Token& t) {
  switch (t.k) {
    case TK::kData: return "template data";
    case TK::kVarBegin: return "begin of print statement";
    case TK::kVarEnd: return "end of print statement";
    case TK::kBlockBegin: return "begin of statement block";
    case TK::kBlockEnd: return "end of statement block";
    case TK::kName: return t.text;
    case TK::kString: return "string";
    case TK::kInt: return "integer";
    case TK::kFloat: return "float";
    case TK::kOper: return t.text;
    case TK::kEof: return "end of template";
  }
  return "token";
}

struct SyntaxError {
  std::string message;
  int line;
  int col;
};

class Lexer {
 public:
  explicit Lexer(const std::string& src, int max_nesting) : src_(src), max_nesting_(max_nesting) {
    line_starts_.push_back(0);
    for (size_t k = 0; k < src_.size(); ++k)
      if (src_[k] == '\n') line_starts_.push_back(k + 1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) root_step();
    Token eof;
    eof.k = TK::kEof;
    set_pos(eof, src_.size());
    out_.push_back(eof);
    return std::move(out_);
  }

 private:
  const std::string& src_;
  int max_nesting_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;

  void set_pos(Token& t, size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line_idx = static_cast<size_t>(it - line_starts_.begin()) - 1;
    t.line = static_cast<int>(line_idx + 1);
    t.col = static_cast<int>(
                cp_length(std::string_view(src_).substr(line_starts_[line_idx], offset - line_starts_[line_idx]))) +
            1;
  }

  [[noreturn]] void fail(std::string message, size_t offset) const {
    Token t;
    set_pos(t, offset);
    throw SyntaxError{std::move(message), t.line, t.col};
  }

  // Bytes of the Python `\s` character at p, or 0.
  size_t ws_at(size_t p) const {
    if (p >= src_.size()) return 0;
    const unsigned char c = static_cast<unsigned char>(src_[p]);
    if (c < 0x80) return (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= 0x1F)) ? 1 : 0;
    char32_t cp = 0;
    const size_t n = unicode::decode_utf8(src_, p, cp);
    return (n && py_isspace(cp)) ? n : 0;
  }
  size_t skip_ws(size_t p) const {
    while (size_t n = ws_at(p)) p += n;
    return p;
  }
  bool starts(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  void emit(TK k, std::string text, size_t offset) {
    Token t;
    t.k = k;
    t.text = std::move(text);
    set_pos(t, offset);
    out_.push_back(std::move(t));
  }

  // Python's str.rstrip() of data.
  static std::string rstrip_ws(std::string_view s) {
    std::u32string u = to_u32(s);
    size_t e = u.size();
    while (e > 0 && py_isspace(u[e - 1])) --e;
    return to_utf8(u.substr(0, e));
  }

  // The data before a tag: '-' strips all whitespace before it; otherwise (lstrip_blocks, for block and comment
  // tags without '+') the spaces and tabs between the line start and the tag go.
  std::string strip_before(std::string text, char sign, bool lstrip_applies) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign != '+' && lstrip_applies) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
        bool all_ws = true;
        size_t p = l_pos;
        while (p < text.size()) {
          char32_t cp = 0;
          size_t n = unicode::decode_utf8(text, p, cp);
          if (n == 0 || !py_isspace(cp)) {
            all_ws = false;
            break;
          }
          p += n;
        }
        if (all_ws) text.resize(l_pos);
      }
    }
    return text;
  }

  // `{%[-+]?\s*raw\s*(-%}\s*|%})` at p: the end offset, or npos.
  size_t match_raw_begin(size_t p) const {
    size_t q = p + 2;
    if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ++q;
    q = skip_ws(q);
    if (!starts(q, "raw")) return std::string::npos;
    q = skip_ws(q + 3);
    if (starts(q, "-%}")) return skip_ws(q + 3);
    if (starts(q, "%}")) return q + 2;
    return std::string::npos;
  }

  void root_step() {
    // The next tag start: "{{", "{%" or "{#".
    size_t start = pos_;
    while (true) {
      start = src_.find('{', start);
      if (start == std::string::npos || start + 1 >= src_.size()) {
        start = std::string::npos;
        break;
      }
      const char c = src_[start + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++start;
    }
    if (start == std::string::npos) {
      emit(TK::kData, src_.substr(pos_), pos_);
      pos_ = src_.size();
      return;
    }
    const char kind = src_[start + 1];
    const char sign =
        (start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')) ? src_[start + 2] : 0;
    const size_t raw_end = kind == '%' ? match_raw_begin(start) : std::string::npos;
    std::string text = strip_before(src_.substr(pos_, start - pos_), sign, kind != '{');
    if (!text.empty()) emit(TK::kData, std::move(text), pos_);
    if (raw_end != std::string::npos) {
      lex_raw(start, raw_end);
      return;
    }
    const size_t body = start + 2 + (sign ? 1 : 0);
    if (kind == '#') {
      lex_comment(start, body);
      return;
    }
    emit(kind == '{' ? TK::kVarBegin : TK::kBlockBegin, "", start);
    lex_tag(kind == '{', body);
  }

  void lex_raw(size_t start, size_t body) {
    line_starting_ = src_[body - 1] == '\n';
    // `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)`, the first one.
    size_t q = body;
    while (true) {
      q = src_.find("{%", q);
      if (q == std::string::npos) fail("Missing end of raw directive", start);
      size_t r = q + 2;
      char sign = 0;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      r = skip_ws(r);
      if (starts(r, "endraw")) {
        r = skip_ws(r + 6);
        size_t end = std::string::npos;
        if (starts(r, "+%}")) {
          end = r + 3;
        } else if (starts(r, "-%}")) {
          end = skip_ws(r + 3);
        } else if (starts(r, "%}")) {
          end = r + 2;
          if (end < src_.size() && src_[end] == '\n') ++end;
        }
        if (end != std::string::npos) {
          std::string text = strip_before(src_.substr(body, q - body), sign, true);
          if (!text.empty()) emit(TK::kData, std::move(text), body);
          pos_ = end;
          line_starting_ = src_[end - 1] == '\n';
          return;
        }
      }
      q += 2;
    }
  }

  void lex_comment(size_t start, size_t body) {
    size_t q = src_.find("#}", body);
    if (q == std::string::npos) fail("Missing end of comment tag", start);
    size_t end;
    if (q > body && src_[q - 1] == '-') {
      end = skip_ws(q + 2);
    } else if (q > body && src_[q - 1] == '+') {
      end = q + 2;
    } else {
      end = q + 2;
      if (end < src_.size() && src_[end] == '\n') ++end;
    }
    pos_ = end;
    line_starting_ = src_[end - 1] == '\n';
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
  static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

  // (\d+_)*\d+ at p: the end, or npos.
  size_t match_digits(size_t p) const {
    if (p >= src_.size() || !is_digit(src_[p])) return std::string::npos;
    while (true) {
      while (p < src_.size() && is_digit(src_[p])) ++p;
      if (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) {
        ++p;
        continue;
      }
      return p;
    }
  }

  // jinja2's float_re at p: the end, or npos.
  size_t match_float(size_t p) const {
    if (p > 0 && src_[p - 1] == '.') return std::string::npos;
    size_t q = match_digits(p);
    if (q == std::string::npos) return q;
    size_t frac_end = std::string::npos;
    if (q < src_.size() && src_[q] == '.') frac_end = match_digits(q + 1);
    size_t after = frac_end != std::string::npos ? frac_end : q;
    if (after < src_.size() && (src_[after] == 'e' || src_[after] == 'E')) {
      size_t r = after + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      size_t e = match_digits(r);
      if (e != std::string::npos) return e;
    }
    return frac_end;
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s)
      if (c != '_') out.push_back(c);
    return out;
  }

  // jinja2's integer_re at p (decimal, 0b, 0o, 0x): fills the value; the end, or npos.
  size_t match_integer(size_t p, int64_t& value) const {
    auto digit_of = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return 99;
    };
    int base = 10;
    size_t q = p;
    if (src_[p] == '0' && p + 1 < src_.size()) {
      const char x = src_[p + 1];
      if (x == 'b' || x == 'B') base = 2;
      if (x == 'o' || x == 'O') base = 8;
      if (x == 'x' || x == 'X') base = 16;
      if (base != 10) q = p + 2;
    }
    size_t end = q;
    bool any = false;
    if (base == 10) {
      if (src_[p] == '0') {  // 0(_?0)*
        end = p + 1;
        while (true) {
          if (end < src_.size() && src_[end] == '0') {
            ++end;
          } else if (end + 1 < src_.size() && src_[end] == '_' && src_[end + 1] == '0') {
            end += 2;
          } else {
            break;
          }
        }
        value = 0;
        return end;
      }
      if (!is_digit(src_[p])) return std::string::npos;
    }
    // (_?digit)+
    u128 acc = 0;
    while (true) {
      size_t r = end;
      if (base != 10 || any) {
        if (r < src_.size() && src_[r] == '_') ++r;
      }
      if (r < src_.size() && digit_of(src_[r]) < base) {
        acc = acc * static_cast<unsigned>(base) + static_cast<unsigned>(digit_of(src_[r]));
        if (acc > static_cast<u128>(INT64_MAX)) fail("integer literal too large for 64 bits", p);
        end = r + 1;
        any = true;
      } else {
        break;
      }
    }
    if (!any) return std::string::npos;
    value = static_cast<int64_t>(acc);
    return end;
  }

  // Python's "unicode-escape" decoding of a string literal's body (what jinja2 applies).
  std::string unescape(std::string_view s, size_t offset) const {
    std::string out;
    size_t i = 0;
    auto hexval = [&](size_t from, int count, uint32_t& v) {
      v = 0;
      for (int k = 0; k < count; ++k) {
        if (from + k >= s.size()) return false;
        const char c = s[from + k];
        int d;
        if (c >= '0' && c <= '9')
          d = c - '0';
        else if (c >= 'a' && c <= 'f')
          d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
          d = c - 'A' + 10;
        else
          return false;
        v = v * 16 + static_cast<uint32_t>(d);
      }
      return true;
    };
    while (i < s.size()) {
      if (s[i] != '\\' || i + 1 >= s.size()) {
        out += s[i++];
        continue;
      }
      const char e = s[i + 1];
      switch (e) {
        case '\n': i += 2; continue;
        case '\\':
          out += '\\';
          i += 2;
          continue;
        case '\'':
          out += '\'';
          i += 2;
          continue;
        case '"':
          out += '"';
          i += 2;
          continue;
        case 'a':
          out += '\a';
          i += 2;
          continue;
        case 'b':
          out += '\b';
          i += 2;
          continue;
        case 'f':
          out += '\f';
          i += 2;
          continue;
        case 'n':
          out += '\n';
          i += 2;
          continue;
        case 'r':
          out += '\r';
          i += 2;
          continue;
        case 't':
          out += '\t';
          i += 2;
          continue;
        case 'v':
          out += '\v';
          i += 2;
          continue;
        default: break;
      }
      if (e >= '0' && e <= '7') {
        uint32_t v = 0;
        size_t k = i + 1;
        int n = 0;
        while (n < 3 && k < s.size() && s[k] >= '0' && s[k] <= '7') {
          v = v * 8 + static_cast<uint32_t>(s[k] - '0');
          ++k;
          ++n;
        }
        unicode::append_utf8(out, static_cast<char32_t>(v));
        i = k;
        continue;
      }
      if (e == 'x' || e == 'u' || e == 'U') {
        const int count = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        uint32_t v = 0;
        if (!hexval(i + 2, count, v) || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
          fail("invalid \\" + std::string(1, e) + " escape in a string literal", offset + i);
        unicode::append_utf8(out, static_cast<char32_t>(v));
        i += 2 + static_cast<size_t>(count);
        continue;
      }
      if (e == 'N') fail("\\N{...} escapes are not supported", offset + i);
      out += '\\';  // an unknown escape stays as written
      ++i;
    }
    return out;
  }

  void lex_tag(bool variable, size_t p) {
    std::vector<char> balance;
    while (true) {
      if (p >= src_.size())
        fail(variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'", p);
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (variable) {
          if (starts(p, "-}}"))
            end = skip_ws(p + 3);
          else if (starts(p, "}}"))
            end = p + 2;
        } else {
          if (starts(p, "-%}")) {
            end = skip_ws(p + 3);
          } else if (starts(p, "+%}")) {
            end = p + 3;
          } else if (starts(p, "%}")) {
            end = p + 2;
            if (end < src_.size() && src_[end] == '\n') ++end;
          }
        }
        if (end != std::string::npos) {
          emit(variable ? TK::kVarEnd : TK::kBlockEnd, "", p);
          pos_ = end;
          line_starting_ = src_[end - 1] == '\n';
          return;
        }
      }
      if (size_t n = ws_at(p)) {
        p += n;
        continue;
      }
      const char c = src_[p];
      if (size_t e = match_float(p); e != std::string::npos) {
        std::string lit = without_underscores(std::string_view(src_).substr(p, e - p));
        Token t;
        t.k = TK::kFloat;
        t.fval = std::strtod(lit.c_str(), nullptr);
        set_pos(t, p);
        out_.push_back(std::move(t));
        p = e;
        continue;
      }
      if (is_digit(c)) {
        int64_t v = 0;
        size_t e = match_integer(p, v);
        if (e != std::string::npos) {
          Token t;
          t.k = TK::kInt;
          t.ival = v;
          set_pos(t, p);
          out_.push_back(std::move(t));
          p = e;
          continue;
        }
      }
      if (is_name_start(c)) {
        size_t e = p;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        emit(TK::kName, src_.substr(p, e - p), p);
        p = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t e = p + 1;
        while (e < src_.size() && src_[e] != c) {
          if (src_[e] == '\\' && e + 1 < src_.size()) ++e;
          ++e;
        }
        if (e >= src_.size()) fail("unexpected end of string", p);
        Token t;
        t.k = TK::kString;
        t.text = unescape(std::string_view(src_).substr(p + 1, e - p - 1), p + 1);
        set_pos(t, p);
        out_.push_back(std::move(t));
        p = e + 1;
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                   "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
      const char* op = nullptr;
      for (const char* cand : kOps)
        if (starts(p, cand)) {
          op = cand;
          break;
        }
      if (!op) {
        char32_t cp = 0;
        const size_t n = std::max<size_t>(1, unicode::decode_utf8(src_, p, cp));
        fail("unexpected char " + py_str_repr(std::string_view(src_).substr(p, n)), p);
      }
      const std::string o(op);
      if (o == "(" || o == "[" || o == "{") {
        if (static_cast<int>(balance.size()) >= max_nesting_) fail("brackets nested too deeply", p);
        balance.push_back(o == "(" ? ')' : (o == "[" ? ']' : '}'));
      } else if (o == ")" || o == "]" || o == "}") {
        if (balance.empty()) fail("unexpected '" + o + "'", p);
        if (balance.back() != o[0])
          fail("unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'", p);
        balance.pop_back();
      }
      emit(TK::kOper, o, p);
      p += o.size();
    }
  }
};

// ------------------------------------------------------------------------------------------------------------------
// The AST.

struct Expr;
using ExprP = std::unique_ptr<Expr>;

enum class EK : uint8_t {
  kConst,
  kName,
  kGetattr,
  kGetitem,
  kSlice,
  kList,
  kTuple,
  kDict,
  kCall,
  kFilter,
  kTest,
  kNeg,
  kPos,
  kNot,
  kBin,
  kAnd,
  kOr,
  kConcat,
  kCompare,
  kCond,
  kNsRef
};
enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CmpOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr {
  EK k = EK::kConst;
  int line = 0;
  int col = 0;
  Value value;                                        // kConst
  std::string name;                                   // kName; kGetattr/kNsRef attribute; kFilter/kTest name
  BinOp bop = BinOp::kAdd;                            // kBin
  std::vector<CmpOp> cops;                            // kCompare: one per operand after the first
  std::vector<ExprP> items;                           // kList/kTuple elements; kDict key, value, key, value...;
                                                      // kCall/kFilter/kTest positional arguments; kConcat parts;
                                                      // kCompare operands; kSlice start, stop, step (null: absent)
  std::vector<std::pair<std::string, ExprP>> kwargs;  // kCall/kFilter/kTest keyword arguments
  ExprP a, b, c;  // kGetattr/kGetitem: a object, b key; kCall: a callee; kFilter/kTest: a value (null in a filter
                  // block); unary: a; kBin/kAnd/kOr: a, b; kCond: a value if true, b test, c value if false (or null);
                  // kNsRef: a the namespace's name
  int fn = -1;    // kFilter/kTest: the builtin's id, -1 when jinja2 has no such one
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprP> defaults;  // one per parameter, null where there is none
  Body body;
};

enum class SK : uint8_t {
  kData,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kWith,
  kBreak,
  kContinue,
  kBlock
};

struct Stmt {
  SK k = SK::kData;
  int line = 0;
  std::string text;                              // kData
  ExprP expr;                                    // kOutput, kSet value; kFor iterable; kCallBlock call
  ExprP target;                                  // kFor, kSet, kSetBlock
  ExprP cond;                                    // kFor: the `if` filter
  ExprP filter;                                  // kSetBlock (may be null), kFilterBlock: filters on a null value
  std::vector<std::pair<ExprP, Body>> branches;  // kIf: if and elif tests with their bodies
  Body body, else_body;                          // kIf else; kFor body/else; kSetBlock, kFilterBlock, kWith, kBlock
  std::unique_ptr<MacroDef> macro;               // kMacro; kCallBlock: the caller
  std::vector<std::pair<ExprP, ExprP>> assigns;  // kWith
};

// ------------------------------------------------------------------------------------------------------------------
// The builtins' names (jinja2's, plus transformers' tojson). Ids index these tables.

enum class Flt : int {
  kAbs,
  kAttr,
  kCapitalize,
  kCenter,
  kDefault,
  kDictsort,
  kEscape,
  kFirst,
  kFloat,
  kForceescape,
  kFormat,
  kIndent,
  kInt,
  kItems,
  kJoin,
  kLast,
  kLength,
  kList,
  kLower,
  kMap,
  kMax,
  kMin,
  kReject,
  kRejectattr,
  kReplace,
  kReverse,
  kRound,
  kSafe,
  kSelect,
  kSelectattr,
  kSort,
  kString,
  kSum,
  kTitle,
  kTojson,
  kTrim,
  kUnique,
  kUpper,
  kWordcount,
  kUnsupported
};

const std::vector<std::pair<std::string_view, Flt>>& filter_table() {
  static const std::vector<std::pair<std::string_view, Flt>> t = {
      {"abs", Flt::kAbs},
      {"attr", Flt::kAttr},
      {"capitalize", Flt::kCapitalize},
      {"center", Flt::kCenter},
      {"count", Flt::kLength},
      {"d", Flt::kDefault},
      {"default", Flt::kDefault},
      {"dictsort", Flt::kDictsort},
      {"e", Flt::kEscape},
      {"escape", Flt::kEscape},
      {"first", Flt::kFirst},
      {"float", Flt::kFloat},
      {"forceescape", Flt::kForceescape},
      {"format", Flt::kFormat},
      {"indent", Flt::kIndent},
      {"int", Flt::kInt},
      {"items", Flt::kItems},
      {"join", Flt::kJoin},
      {"last", Flt::kLast},
      {"length", Flt::kLength},
      {"list", Flt::kList},
      {"lower", Flt::kLower},
      {"map", Flt::kMap},
      {"max", Flt::kMax},
      {"min", Flt::kMin},
      {"reject", Flt::kReject},
      {"rejectattr", Flt::kRejectattr},
      {"replace", Flt::kReplace},
      {"reverse", Flt::kReverse},
      {"round", Flt::kRound},
      {"safe", Flt::kSafe},
      {"select", Flt::kSelect},
      {"selectattr", Flt::kSelectattr},
      {"sort", Flt::kSort},
      {"string", Flt::kString},
      {"sum", Flt::kSum},
      {"title", Flt::kTitle},
      {"tojson", Flt::kTojson},
      {"trim", Flt::kTrim},
      {"unique", Flt::kUnique},
      {"upper", Flt::kUpper},
      {"wordcount", Flt::kWordcount},
      // jinja2 has these; this renderer does not (they fail when reached)
      {"batch", Flt::kUnsupported},
      {"filesizeformat", Flt::kUnsupported},
      {"groupby", Flt::kUnsupported},
      {"pprint", Flt::kUnsupported},
      {"random", Flt::kUnsupported},
      {"slice", Flt::kUnsupported},
      {"striptags", Flt::kUnsupported},
      {"truncate", Flt::kUnsupported},
      {"urlencode", Flt::kUnsupported},
      {"urlize", Flt::kUnsupported},
      {"wordwrap", Flt::kUnsupported},
      {"xmlattr", Flt::kUnsupported}};
  return t;
}

enum class Tst : int {
  kBoolean,
  kCallable,
  kDefined,
  kDivisibleby,
  kEq,
  kEscaped,
  kEven,
  kFalse,
  kFilter,
  kFloat,
  kGe,
  kGt,
  kIn,
  kInteger,
  kIterable,
  kLe,
  kLower,
  kLt,
  kMapping,
  kNe,
  kNone,
  kNumber,
  kOdd,
  kSameas,
  kSequence,
  kString,
  kTest,
  kTrue,
  kUndefined,
  kUpper
};

const std::vector<std::pair<std::string_view, Tst>>& test_table() {
  static const std::vector<std::pair<std::string_view, Tst>> t = {{"boolean", Tst::kBoolean},
                                                                  {"callable", Tst::kCallable},
                                                                  {"defined", Tst::kDefined},
                                                                  {"divisibleby", Tst::kDivisibleby},
                                                                  {"eq", Tst::kEq},
                                                                  {"equalto", Tst::kEq},
                                                                  {"==", Tst::kEq},
                                                                  {"escaped", Tst::kEscaped},
                                                                  {"even", Tst::kEven},
                                                                  {"false", Tst::kFalse},
                                                                  {"filter", Tst::kFilter},
                                                                  {"float", Tst::kFloat},
                                                                  {"ge", Tst::kGe},
                                                                  {">=", Tst::kGe},
                                                                  {"gt", Tst::kGt},
                                                                  {"greaterthan", Tst::kGt},
                                                                  {">", Tst::kGt},
                                                                  {"in", Tst::kIn},
                                                                  {"integer", Tst::kInteger},
                                                                  {"iterable", Tst::kIterable},
                                                                  {"le", Tst::kLe},
                                                                  {"<=", Tst::kLe},
                                                                  {"lower", Tst::kLower},
                                                                  {"lt", Tst::kLt},
                                                                  {"lessthan", Tst::kLt},
                                                                  {"<", Tst::kLt},
                                                                  {"mapping", Tst::kMapping},
                                                                  {"ne", Tst::kNe},
                                                                  {"!=", Tst::kNe},
                                                                  {"none", Tst::kNone},
                                                                  {"number", Tst::kNumber},
                                                                  {"odd", Tst::kOdd},
                                                                  {"sameas", Tst::kSameas},
                                                                  {"sequence", Tst::kSequence},
                                                                  {"string", Tst::kString},
                                                                  {"test", Tst::kTest},
                                                                  {"true", Tst::kTrue},
                                                                  {"undefined", Tst::kUndefined},
                                                                  {"upper", Tst::kUpper}};
  return t;
}

int find_filter(std::string_view name) {
  const auto& t = filter_table();
  for (size_t k = 0; k < t.size(); ++k)
    if (t[k].first == name) return static_cast<int>(k);
  return -1;
}
int find_test(std::string_view name) {
  const auto& t = test_table();
  for (size_t k = 0; k < t.size(); ++k)
    if (t[k].first == name) return static_cast<int>(k);
  return -1;
}

// ------------------------------------------------------------------------------------------------------------------
// Parser: jinja2's grammar (jinja2/parser.py), statement by statement and expression level by level.

class Parser {
 public:
  Parser(std::vector<Token> tokens, int max_nesting) : t_(std::move(tokens)), max_nesting_(max_nesting) {}

  Body parse() {
    Body body = subparse({});
    if (cur().k != TK::kEof) fail("unexpected " + quoted(cur()));
    return body;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int max_nesting_;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::vector<std::string>> end_stack_;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.max_nesting_) p.fail("the template nests statements or expressions too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& look() const { return t_[std::min(p_ + 1, t_.size() - 1)]; }
  Token next() {
    Token x = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return x;
  }
  static bool is_name(const Token& t, std::string_view n) { return t.k == TK::kName && t.text == n; }
  static bool is_op(const Token& t, std::string_view o) { return t.k == TK::kOper && t.text == o; }
  static std::string quoted(const Token& t) {
    std::string out(1, '\'');
    out.append(describe(t));
    out.push_back('\'');
    return out;
  }

  [[noreturn]] void fail(std::string message) const { fail_at(std::move(message), cur()); }
  [[noreturn]] static void fail_at(std::string message, const Token& t) {
    throw SyntaxError{std::move(message), t.line, t.col};
  }

  bool skip_op(std::string_view o) {
    if (!is_op(cur(), o)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(cur(), n)) return false;
    next();
    return true;
  }
  void expect_op(std::string_view o) {
    if (!is_op(cur(), o)) {
      if (cur().k == TK::kEof) fail("unexpected end of template, expected '" + std::string(o) + "'.");
      fail("expected token '" + std::string(o) + "', got " + quoted(cur()));
    }
    next();
  }
  void expect_name(std::string_view n) {
    if (!is_name(cur(), n)) {
      if (cur().k == TK::kEof) fail("unexpected end of template, expected '" + std::string(n) + "'.");
      fail("expected token '" + std::string(n) + "', got " + quoted(cur()));
    }
    next();
  }
  Token expect_any_name() {
    if (cur().k != TK::kName) {
      if (cur().k == TK::kEof) fail("unexpected end of template, expected 'name'.");
      fail("expected token 'name', got " + quoted(cur()));
    }
    return next();
  }
  void expect_kind(TK k, const char* what) {
    if (cur().k != k) {
      if (cur().k == TK::kEof) fail(std::string("unexpected end of template, expected '") + what + "'.");
      fail(std::string("expected token '") + what + "', got " + quoted(cur()));
    }
    next();
  }

  static ExprP make(EK k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = at.line;
    e->col = at.col;
    return e;
  }
  static StmtP make_stmt(SK k, int line) {
    auto s = std::make_unique<Stmt>();
    s->k = k;
    s->line = line;
    return s;
  }

  std::string looking_for(const std::vector<std::string>& ends) const {
    std::string out;
    for (size_t k = 0; k < ends.size(); ++k) {
      if (k) out += k + 1 == ends.size() ? " or " : ", ";
      out += "'" + ends[k] + "'";
    }
    return out;
  }

  // The block an end-token list closes ({"elif", "else", "endif"} → "if").
  static std::string block_name(const std::vector<std::string>& ends) {
    for (const auto& e : ends)
      if (e.rfind("end", 0) == 0) return e.substr(3);
    return ends.empty() ? std::string() : ends[0];
  }

  [[noreturn]] void fail_eof() const {
    std::string msg = "Unexpected end of template.";
    if (!end_stack_.empty() && !end_stack_.back().empty()) {
      const auto& ends = end_stack_.back();
      msg += " Jinja was looking for the following tags: " + looking_for(ends) + ".";
      msg += " The innermost block that needs to be closed is '" + block_name(ends) + "'.";
    }
    fail_at(msg, cur());
  }

  [[noreturn]] void fail_unknown_tag(const Token& t) const {
    std::string msg = "Encountered unknown tag '" + t.text + "'.";
    for (auto it = end_stack_.rbegin(); it != end_stack_.rend(); ++it) {
      if (std::find(it->begin(), it->end(), t.text) != it->end() && !end_stack_.back().empty()) {
        msg += " Jinja was looking for the following tags: " + looking_for(end_stack_.back()) + ".";
        msg += " The innermost block that needs to be closed is '" + block_name(end_stack_.back()) + "'.";
        break;
      }
    }
    fail_at(msg, t);
  }

  Body subparse(const std::vector<std::string>& end_tokens) {
    Body body;
    end_stack_.push_back(end_tokens);
    while (cur().k != TK::kEof) {
      const Token& t = cur();
      if (t.k == TK::kData) {
        auto s = make_stmt(SK::kData, t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.k == TK::kVarBegin) {
        next();
        auto s = make_stmt(SK::kOutput, cur().line);
        s->expr = parse_tuple(false, true, {}, false);
        expect_kind(TK::kVarEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.k == TK::kBlockBegin) {
        next();
        if (!end_tokens.empty() && cur().k == TK::kName &&
            std::find(end_tokens.begin(), end_tokens.end(), cur().text) != end_tokens.end()) {
          end_stack_.pop_back();
          return body;
        }
        body.push_back(parse_statement());
        expect_kind(TK::kBlockEnd, "end of statement block");
      } else {
        fail("unexpected " + quoted(t));
      }
    }
    end_stack_.pop_back();
    return body;
  }

  Body parse_statements(const std::vector<std::string>& end_tokens, bool drop_needle) {
    skip_op(":");
    expect_kind(TK::kBlockEnd, "end of statement block");
    end_stack_.push_back(end_tokens);  // for the EOF message
    Body body = subparse(end_tokens);
    if (cur().k == TK::kEof) fail_eof();
    end_stack_.pop_back();
    if (drop_needle) next();
    return body;
  }

  StmtP parse_statement() {
    DepthGuard guard(*this);
    const Token t = cur();
    if (t.k != TK::kName) fail("tag name expected");
    const std::string& n = t.text;
    if (n == "for") return parse_for();
    if (n == "if") return parse_if();
    if (n == "set") return parse_set();
    if (n == "macro") return parse_macro();
    if (n == "call") return parse_call_block();
    if (n == "filter") return parse_filter_block();
    if (n == "with") return parse_with();
    if (n == "print") {
      next();
      auto s = make_stmt(SK::kOutput, t.line);
      auto tup = make(EK::kTuple, t);
      while (cur().k != TK::kBlockEnd) {
        if (!tup->items.empty()) expect_op(",");
        tup->items.push_back(parse_expression(true));
      }
      if (tup->items.size() == 1)
        s->expr = std::move(tup->items[0]);
      else
        s->expr = std::move(tup);
      return s;
    }
    if (n == "break" || n == "continue") {
      next();
      if (loop_depth_ == 0) fail_at("'" + n + "' outside of a loop", t);
      return make_stmt(n == "break" ? SK::kBreak : SK::kContinue, t.line);
    }
    if (n == "generation") {
      next();
      auto s = make_stmt(SK::kBlock, t.line);
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_statements({"endgeneration"}, true);
      loop_depth_ = saved;
      return s;
    }
    if (n == "block" || n == "extends" || n == "include" || n == "import" || n == "from" || n == "autoescape")
      fail_at("the '" + n + "' tag is not supported by this renderer", t);
    fail_unknown_tag(t);
  }

  StmtP parse_for() {
    const int line = next().line;
    auto s = make_stmt(SK::kFor, line);
    s->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    s->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name(cur(), "recursive")) fail("recursive loops are not supported by this renderer");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text != "endfor") s->else_body = parse_statements({"endfor"}, true);
    return s;
  }

  StmtP parse_if() {
    const int line = next().line;
    auto s = make_stmt(SK::kIf, line);
    while (true) {
      ExprP test = parse_tuple(false, false, {}, false);
      Body body = parse_statements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      const Token t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") s->else_body = parse_statements({"endif"}, true);
      break;
    }
    return s;
  }

  StmtP parse_set() {
    const int line = next().line;
    ExprP target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto s = make_stmt(SK::kSet, line);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = make_stmt(SK::kSetBlock, line);
    s->target = std::move(target);
    s->filter = parse_filter(nullptr, false);
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({"endset"}, true);
    loop_depth_ = saved;
    return s;
  }

  void parse_signature(MacroDef& m) {
    expect_op("(");
    while (!is_op(cur(), ")")) {
      if (!m.params.empty()) expect_op(",");
      const Token name = expect_any_name();
      m.params.push_back(name.text);
      if (skip_op("=")) {
        m.defaults.push_back(parse_expression(true));
      } else {
        for (const auto& d : m.defaults)
          if (d) fail_at("non-default argument follows default argument", name);
        m.defaults.push_back(nullptr);
      }
    }
    expect_op(")");
  }

  StmtP parse_macro() {
    const int line = next().line;
    auto s = make_stmt(SK::kMacro, line);
    s->macro = std::make_unique<MacroDef>();
    s->macro->name = expect_any_name().text;
    parse_signature(*s->macro);
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->macro->body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved;
    return s;
  }

  StmtP parse_call_block() {
    const Token t = next();
    auto s = make_stmt(SK::kCallBlock, t.line);
    s->macro = std::make_unique<MacroDef>();
    s->macro->name = "caller";
    if (is_op(cur(), "(")) parse_signature(*s->macro);
    s->expr = parse_expression(true);
    if (s->expr->k != EK::kCall) fail_at("expected call", t);
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->macro->body = parse_statements({"endcall"}, true);
    loop_depth_ = saved;
    return s;
  }

  StmtP parse_filter_block() {
    const int line = next().line;
    auto s = make_stmt(SK::kFilterBlock, line);
    s->filter = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true);
    return s;
  }

  StmtP parse_with() {
    const int line = next().line;
    auto s = make_stmt(SK::kWith, line);
    while (cur().k != TK::kBlockEnd) {
      if (!s->assigns.empty()) expect_op(",");
      ExprP target = parse_assign_target(true, false, {}, false);
      expect_op("=");
      s->assigns.emplace_back(std::move(target), parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  static bool assignable(const Expr& e) {
    if (e.k == EK::kName || e.k == EK::kNsRef) return true;
    if (e.k == EK::kTuple) {
      for (const auto& it : e.items)
        if (!assignable(*it)) return false;
      return true;
    }
    return false;
  }

  ExprP parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end,
                            bool with_namespace) {
    ExprP target;
    const Token at = cur();
    if (with_namespace && cur().k == TK::kName && is_op(look(), ".")) {
      const Token ns = next();
      next();
      const Token attr = expect_any_name();
      target = make(EK::kNsRef, ns);
      target->a = make(EK::kName, ns);
      target->a->name = ns.text;
      target->name = attr.text;
    } else if (name_only) {
      const Token n = expect_any_name();
      target = make(EK::kName, n);
      target->name = n.text;
    } else {
      target = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
    }
    if (!assignable(*target)) {
      const char* what = target->k == EK::kConst ? "const" : (target->k == EK::kTuple ? "tuple" : "expression");
      fail_at(std::string("can't assign to '") + what + "'", at);
    }
    return target;
  }

  // --- expressions

  ExprP parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprP parse_condexpr() {
    ExprP expr1 = parse_or();
    while (is_name(cur(), "if")) {
      const Token t = next();
      ExprP test = parse_or();
      ExprP expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      auto e = make(EK::kCond, t);
      e->a = std::move(expr1);
      e->b = std::move(test);
      e->c = std::move(expr3);
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprP parse_or() {
    ExprP left = parse_and();
    while (is_name(cur(), "or")) {
      const Token t = next();
      auto e = make(EK::kOr, t);
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprP parse_and() {
    ExprP left = parse_not();
    while (is_name(cur(), "and")) {
      const Token t = next();
      auto e = make(EK::kAnd, t);
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprP parse_not() {
    if (is_name(cur(), "not")) {
      DepthGuard guard(*this);
      const Token t = next();
      auto e = make(EK::kNot, t);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprP parse_compare() {
    const Token at = cur();
    ExprP expr = parse_math1();
    std::vector<CmpOp> ops;
    std::vector<ExprP> operands;
    while (true) {
      const Token& t = cur();
      std::optional<CmpOp> op;
      if (t.k == TK::kOper) {
        if (t.text == "==")
          op = CmpOp::kEq;
        else if (t.text == "!=")
          op = CmpOp::kNe;
        else if (t.text == "<")
          op = CmpOp::kLt;
        else if (t.text == "<=")
          op = CmpOp::kLe;
        else if (t.text == ">")
          op = CmpOp::kGt;
        else if (t.text == ">=")
          op = CmpOp::kGe;
        if (op) next();
      } else if (is_name(t, "in")) {
        next();
        op = CmpOp::kIn;
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        next();
        next();
        op = CmpOp::kNotIn;
      }
      if (!op) break;
      ops.push_back(*op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return expr;
    auto e = make(EK::kCompare, at);
    e->items.push_back(std::move(expr));
    for (auto& o : operands) e->items.push_back(std::move(o));
    e->cops = std::move(ops);
    return e;
  }

  ExprP binary(BinOp op, const Token& t, ExprP a, ExprP b) {
    auto e = make(EK::kBin, t);
    e->bop = op;
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }

  ExprP parse_math1() {
    ExprP left = parse_concat();
    while (is_op(cur(), "+") || is_op(cur(), "-")) {
      const Token t = next();
      ExprP right = parse_concat();
      left = binary(t.text == "+" ? BinOp::kAdd : BinOp::kSub, t, std::move(left), std::move(right));
    }
    return left;
  }

  ExprP parse_concat() {
    const Token at = cur();
    std::vector<ExprP> args;
    args.push_back(parse_math2());
    while (is_op(cur(), "~")) {
      next();
      args.push_back(parse_math2());
    }
    if (args.size() == 1) return std::move(args[0]);
    auto e = make(EK::kConcat, at);
    e->items = std::move(args);
    return e;
  }

  ExprP parse_math2() {
    ExprP left = parse_pow();
    while (is_op(cur(), "*") || is_op(cur(), "/") || is_op(cur(), "//") || is_op(cur(), "%")) {
      const Token t = next();
      ExprP right = parse_pow();
      const BinOp op = t.text == "*"    ? BinOp::kMul
                       : t.text == "/"  ? BinOp::kDiv
                       : t.text == "//" ? BinOp::kFloorDiv
                                        : BinOp::kMod;
      left = binary(op, t, std::move(left), std::move(right));
    }
    return left;
  }

  ExprP parse_pow() {
    ExprP left = parse_unary(true);
    while (is_op(cur(), "**")) {
      const Token t = next();
      ExprP right = parse_unary(true);
      left = binary(BinOp::kPow, t, std::move(left), std::move(right));
    }
    return left;
  }

  ExprP parse_unary(bool with_filter) {
    ExprP node;
    if (is_op(cur(), "-") || is_op(cur(), "+")) {
      DepthGuard guard(*this);
      const Token t = next();
      node = make(t.text == "-" ? EK::kNeg : EK::kPos, t);
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprP parse_primary() {
    const Token t = cur();
    if (t.k == TK::kName) {
      next();
      if (t.text == "true" || t.text == "false" || t.text == "True" || t.text == "False") {
        auto e = make(EK::kConst, t);
        e->value = Value::boolean(t.text == "true" || t.text == "True");
        return e;
      }
      if (t.text == "none" || t.text == "None") {
        auto e = make(EK::kConst, t);
        e->value = Value::none();
        return e;
      }
      auto e = make(EK::kName, t);
      e->name = t.text;
      return e;
    }
    if (t.k == TK::kString) {
      next();
      std::string s = t.text;
      while (cur().k == TK::kString) s += next().text;
      auto e = make(EK::kConst, t);
      e->value = Value::str(std::move(s));
      return e;
    }
    if (t.k == TK::kInt || t.k == TK::kFloat) {
      next();
      auto e = make(EK::kConst, t);
      e->value = t.k == TK::kInt ? Value::integer(t.ival) : Value::real(t.fval);
      return e;
    }
    if (is_op(t, "(")) {
      next();
      ExprP e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (is_op(t, "[")) {
      next();
      auto e = make(EK::kList, t);
      while (!is_op(cur(), "]")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op(cur(), "]")) break;
        e->items.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (is_op(t, "{")) {
      next();
      auto e = make(EK::kDict, t);
      while (!is_op(cur(), "}")) {
        if (!e->items.empty()) expect_op(",");
        if (is_op(cur(), "}")) break;
        e->items.push_back(parse_expression(true));
        expect_op(":");
        e->items.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    if (t.k == TK::kEof) fail("unexpected end of template");
    fail("unexpected " + quoted(t));
  }

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    const Token& t = cur();
    if (t.k == TK::kVarEnd || t.k == TK::kBlockEnd || is_op(t, ")")) return true;
    for (const auto& e : extra_end)
      if (is_name(t, e)) return true;
    return false;
  }

  ExprP parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                    bool explicit_parentheses) {
    const Token at = cur();
    std::vector<ExprP> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified)
        args.push_back(parse_primary());
      else
        args.push_back(parse_expression(with_condexpr));
      if (is_op(cur(), ","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) {
        if (cur().k == TK::kEof) fail("unexpected end of template");
        fail("Expected an expression, got " + quoted(cur()));
      }
    }
    auto e = make(EK::kTuple, at);
    e->items = std::move(args);
    return e;
  }

  ExprP parse_postfix(ExprP node) {
    while (true) {
      if (is_op(cur(), ".") || is_op(cur(), "["))
        node = parse_subscript(std::move(node));
      else if (is_op(cur(), "("))
        node = parse_call(std::move(node));
      else
        break;
    }
    return node;
  }

  ExprP parse_filter_expr(ExprP node) {
    while (true) {
      if (is_op(cur(), "|"))
        node = parse_filter(std::move(node), false);
      else if (is_name(cur(), "is"))
        node = parse_test(std::move(node));
      else if (is_op(cur(), "("))
        node = parse_call(std::move(node));
      else
        break;
    }
    return node;
  }

  ExprP parse_subscript(ExprP node) {
    const Token t = next();
    if (t.text == ".") {
      const Token attr = cur();
      next();
      if (attr.k == TK::kName) {
        auto e = make(EK::kGetattr, t);
        e->a = std::move(node);
        e->name = attr.text;
        return e;
      }
      if (attr.k != TK::kInt) fail_at("expected name or number", attr);
      auto e = make(EK::kGetitem, t);
      e->a = std::move(node);
      e->b = make(EK::kConst, attr);
      e->b->value = Value::integer(attr.ival);
      return e;
    }
    // "["
    std::vector<ExprP> args;
    while (!is_op(cur(), "]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(EK::kGetitem, t);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = make(EK::kTuple, t);
      e->b->items = std::move(args);
    }
    return e;
  }

  ExprP parse_subscribed() {
    DepthGuard guard(*this);
    const Token at = cur();
    std::vector<ExprP> args;
    if (is_op(cur(), ":")) {
      next();
      args.push_back(nullptr);
    } else {
      ExprP node = parse_expression(true);
      if (!is_op(cur(), ":")) return node;
      next();
      args.push_back(std::move(node));
    }
    if (is_op(cur(), ":"))
      args.push_back(nullptr);
    else if (!is_op(cur(), "]") && !is_op(cur(), ","))
      args.push_back(parse_expression(true));
    else
      args.push_back(nullptr);
    if (is_op(cur(), ":")) {
      next();
      if (!is_op(cur(), "]") && !is_op(cur(), ","))
        args.push_back(parse_expression(true));
      else
        args.push_back(nullptr);
    } else {
      args.push_back(nullptr);
    }
    auto e = make(EK::kSlice, at);
    e->items = std::move(args);
    return e;
  }

  void parse_call_args(Expr& e) {
    const Token open = cur();
    expect_op("(");
    bool require_comma = false;
    while (!is_op(cur(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(cur(), ")")) break;
      }
      if (is_op(cur(), "*") || is_op(cur(), "**"))
        fail("*args and **kwargs in calls are not supported by this renderer");
      if (cur().k == TK::kName && is_op(look(), "=")) {
        const std::string key = next().text;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail_at("invalid syntax for function call expression", open);
        e.items.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprP parse_call(ExprP node) {
    DepthGuard guard(*this);
    auto e = make(EK::kCall, cur());
    e->a = std::move(node);
    parse_call_args(*e);
    return e;
  }

  ExprP parse_filter(ExprP node, bool start_inline) {
    while (is_op(cur(), "|") || start_inline) {
      if (!start_inline) next();
      const Token name = expect_any_name();
      std::string n = name.text;
      while (is_op(cur(), ".")) {
        next();
        n += '.';
        n += expect_any_name().text;
      }
      auto e = make(EK::kFilter, name);
      e->name = n;
      e->fn = find_filter(n);
      e->a = std::move(node);
      if (is_op(cur(), "(")) {
        DepthGuard guard(*this);
        parse_call_args(*e);
      }
      node = std::move(e);
      start_inline = false;
    }
    return node;
  }

  ExprP parse_test(ExprP node) {
    const Token t = next();  // "is"
    const bool negated = skip_name("not");
    const Token name = expect_any_name();
    std::string n = name.text;
    while (is_op(cur(), ".")) {
      next();
      n += '.';
      n += expect_any_name().text;
    }
    auto e = make(EK::kTest, name);
    e->name = n;
    e->fn = find_test(n);
    e->a = std::move(node);
    const Token& c = cur();
    if (is_op(c, "(")) {
      DepthGuard guard(*this);
      parse_call_args(*e);
    } else if ((c.k == TK::kName || c.k == TK::kString || c.k == TK::kInt || c.k == TK::kFloat || is_op(c, "(") ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
      if (is_name(c, "is")) fail("You cannot chain multiple tests with is");
      DepthGuard guard(*this);
      ExprP arg = parse_primary();
      e->items.push_back(parse_postfix(std::move(arg)));
    }
    if (!negated) return e;
    auto ne = make(EK::kNot, t);
    ne->a = std::move(e);
    return ne;
  }
};

// jinja2 rejects a filter or test it does not know when compiling, unless it sits in an `if` statement's test or
// bodies or in a conditional expression (then only reaching it fails). This walk applies that rule.
void check_names(const Expr* e, bool soft);

void check_names(const Body& body, bool soft) {
  for (const auto& s : body) {
    check_names(s->expr.get(), soft);
    check_names(s->target.get(), soft);
    switch (s->k) {
      case SK::kIf:
        for (const auto& br : s->branches) {
          check_names(br.first.get(), true);
          check_names(br.second, true);
        }
        check_names(s->else_body, true);
        break;
      case SK::kFor:
        check_names(s->cond.get(), false);
        check_names(s->body, false);
        check_names(s->else_body, false);
        break;
      case SK::kMacro:
      case SK::kCallBlock:
        for (const auto& d : s->macro->defaults) check_names(d.get(), false);
        check_names(s->macro->body, false);
        break;
      case SK::kWith:
        for (const auto& a : s->assigns) check_names(a.second.get(), soft);
        check_names(s->body, false);
        break;
      default:
        check_names(s->filter.get(), false);
        check_names(s->body, false);
        break;
    }
  }
}

void check_names(const Expr* e, bool soft) {
  if (!e) return;
  if (e->k == EK::kCond) soft = true;
  if (!soft && e->fn < 0 && (e->k == EK::kFilter || e->k == EK::kTest))
    throw SyntaxError{"No " + std::string(e->k == EK::kFilter ? "filter" : "test") + " named '" + e->name + "'.",
                      e->line, e->col};
  check_names(e->a.get(), soft);
  check_names(e->b.get(), soft);
  check_names(e->c.get(), soft);
  for (const auto& it : e->items) check_names(it.get(), soft);
  for (const auto& kw : e->kwargs) check_names(kw.second.get(), soft);
}

// ------------------------------------------------------------------------------------------------------------------
// The evaluator.

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  const Value* find_local(std::string_view n) const {
    for (const auto& kv : vars)
      if (kv.first == n) return &kv.second;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    for (auto& kv : vars)
      if (kv.first == n) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(n, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

const char* const kGlobals[] = {"range",        "dict",   "namespace", "raise_exception",
                                "strftime_now", "lipsum", "cycler",    "joiner"};

bool is_global(std::string_view n) {
  for (const char* g : kGlobals)
    if (n == g) return true;
  return false;
}

// Python's str methods (the names getattr finds on a str).
bool is_str_method(std::string_view n) {
  static const char* const kNames[] = {
      "capitalize", "casefold",     "center",       "count",   "encode",     "endswith",    "expandtabs",
      "find",       "format",       "format_map",   "index",   "isalnum",    "isalpha",     "isascii",
      "isdecimal",  "isdigit",      "isidentifier", "islower", "isnumeric",  "isprintable", "isspace",
      "istitle",    "isupper",      "join",         "ljust",   "lower",      "lstrip",      "maketrans",
      "partition",  "removeprefix", "removesuffix", "replace", "rfind",      "rindex",      "rjust",
      "rpartition", "rsplit",       "rstrip",       "split",   "splitlines", "startswith",  "strip",
      "swapcase",   "title",        "translate",    "upper",   "zfill"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

// Python's str.strip family over code points; `chars` null means whitespace.
std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  if (!chars || chars->t == VT::kNone) {  // whitespace: walk in from the ends without decoding the middle
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e) {
        char32_t cp = 0;
        const size_t n = unicode::decode_utf8(s, b, cp);
        if (n == 0 || !py_isspace(cp)) break;
        b += n;
      }
    }
    if (right) {
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        char32_t cp = 0;
        const size_t n = unicode::decode_utf8(s, start, cp);
        if (n == 0 || start + n != e || !py_isspace(cp)) break;
        e = start;
      }
    }
    return std::string(s.substr(b, e - b));
  }
  std::u32string u = to_u32(s);
  std::u32string set;
  const bool ws = !chars || chars->t == VT::kNone;
  if (!ws) {
    if (!chars->is_str()) type_error("strip arg must be None or str");
    set = to_u32(chars->str_ref());
    std::sort(set.begin(), set.end());  // (looked up once per character stripped)
    set.erase(std::unique(set.begin(), set.end()), set.end());
  }
  auto strip_it = [&](char32_t c) { return ws ? py_isspace(c) : std::binary_search(set.begin(), set.end(), c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return to_utf8(std::u32string_view(u).substr(b, e - b));
}

// Python's str.splitlines(); `count_items`: each line counts as a sequence item, before it is made.
std::vector<std::string> py_splitlines(std::string_view s, bool keepends, bool count_items = false) {
  std::u32string u = to_u32(s);
  std::vector<std::string> out;
  size_t start = 0, k = 0;
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  };
  while (k < u.size()) {
    if (is_break(u[k])) {
      size_t eol = k + 1;
      if (u[k] == '\r' && k + 1 < u.size() && u[k + 1] == '\n') eol = k + 2;
      if (count_items) budget_tick(1);
      out.push_back(to_utf8(std::u32string_view(u).substr(start, (keepends ? eol : k) - start)));
      start = k = eol;
    } else {
      ++k;
    }
  }
  if (start < u.size()) {
    if (count_items) budget_tick(1);
    out.push_back(to_utf8(std::u32string_view(u).substr(start)));
  }
  return out;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// markupsafe.escape(x) as text: a Markup stays as it is, anything else is str()-ed and escaped.
std::string markup_text(const Value& v) { return v.is_markup() ? v.str_ref() : html_escape(py_str(v)); }

// Python's float(str): surrounding whitespace allowed, underscores between digits, inf/nan words.
std::optional<double> parse_py_float(std::string_view text) {
  std::string t = py_strip(text, nullptr, true, true);
  std::string clean;
  for (size_t k = 0; k < t.size(); ++k) {
    if (t[k] == '_') {
      if (k == 0 || k + 1 >= t.size() || !std::isdigit(static_cast<unsigned char>(t[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(t[k + 1])))
        return std::nullopt;
      continue;
    }
    clean += t[k];
  }
  if (clean.empty()) return std::nullopt;
  std::string low = str_lower(clean);
  std::string_view body = low;
  bool neg = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    neg = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") return neg ? -HUGE_VAL : HUGE_VAL;
  if (body == "nan") return std::nan("");
  for (char c : body)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-'))
      return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return v;
}

// Python's int(str, base) for base 10 (or 0 with prefixes).
std::optional<int64_t> parse_py_int(std::string_view text, int base) {
  std::string t = py_strip(text, nullptr, true, true);
  std::string_view b = t;
  bool neg = false;
  if (!b.empty() && (b[0] == '+' || b[0] == '-')) {
    neg = b[0] == '-';
    b.remove_prefix(1);
  }
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (b.size() > 2 && b[0] == '0') {
      const char x = static_cast<char>(std::tolower(static_cast<unsigned char>(b[1])));
      const int pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
      if (pb && (base == 0 || base == pb)) {
        base = pb;
        b.remove_prefix(2);
        if (!b.empty() && b[0] == '_') b.remove_prefix(1);
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36 || b.empty()) return std::nullopt;
  u128 acc = 0;
  bool prev_digit = false;
  for (size_t k = 0; k < b.size(); ++k) {
    const char c = b[k];
    if (c == '_') {
      if (!prev_digit || k + 1 >= b.size()) return std::nullopt;
      prev_digit = false;
      continue;
    }
    int d = 99;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'z')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'Z')
      d = c - 'A' + 10;
    if (d >= base) return std::nullopt;
    acc = acc * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (acc > static_cast<u128>(INT64_MAX) + 1) throw_error("OverflowError", "integer beyond 64 bits");
    prev_digit = true;
  }
  if (!neg && acc > static_cast<u128>(INT64_MAX)) throw_error("OverflowError", "integer beyond 64 bits");
  return neg ? static_cast<int64_t>(-static_cast<i128>(acc)) : static_cast<int64_t>(acc);
}

// The value of a string of ASCII digits (an index written in a format field or an attribute path).
int64_t digits_value(std::string_view digits) {
  int64_t v = 0;
  for (char c : digits) {
    if (v > (INT64_MAX - 9) / 10) throw_error("OverflowError", "integer beyond 64 bits (this renderer's ints)");
    v = v * 10 + (c - '0');
  }
  return v;
}

int64_t checked(i128 v) {
  if (v > INT64_MAX || v < INT64_MIN) throw_error("OverflowError", "integer beyond 64 bits (this renderer's ints)");
  return static_cast<int64_t>(v);
}

int64_t py_floordiv(int64_t a, int64_t b) {
  if (b == 0) throw_error("ZeroDivisionError", "integer division or modulo by zero");
  i128 q = static_cast<i128>(a) / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return checked(q);
}
int64_t py_mod(int64_t a, int64_t b) {
  if (b == 0) throw_error("ZeroDivisionError", "integer division or modulo by zero");
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}
double py_fmod(double a, double b) {
  if (b == 0.0) throw_error("ZeroDivisionError", "float modulo");
  double m = std::fmod(a, b);
  if (m != 0.0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(0.0, b);
  }
  return m;
}
double py_ffloordiv(double a, double b) {
  if (b == 0.0) throw_error("ZeroDivisionError", "float floor division by zero");
  double m = std::fmod(a, b);
  double div = (a - m) / b;
  if (m != 0.0 && ((b < 0) != (m < 0))) div -= 1.0;
  if (div != 0.0) {
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
  }
  return std::copysign(0.0, a / b);
}

// Python's round(x, ndigits) for a float: correctly rounded, ties to even (printf does the decimal rounding).
double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits > 300) return x;
  if (ndigits < -300) return 0.0 * x;
  if (ndigits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}

class Renderer {
 public:
  Renderer(const ChatTemplateLimits& limits, const Body& body, const Dict& vars)
      : lim_(limits), body_(body), vars_(vars) {
    char probe = 0;
    stack_base_ = reinterpret_cast<uintptr_t>(&probe);
    budget_.lim = &limits;
    saved_budget_ = t_budget;
    t_budget = &budget_;
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  // A namespace can hold itself or a chain of others (`set ns.me = ns`): emptying each one, one at a time, frees
  // such cycles and chains without recursion.
  ~Renderer() {
    t_budget = saved_budget_;
    for (auto& ns : namespaces_) {
      std::vector<std::pair<std::string, Value>> attrs;
      attrs.swap(ns->attrs);
    }
  }

  std::string run() {
    out_ = &main_out_;
    cur_ = new_scope(nullptr);
    exec(body_);
    return std::move(main_out_);
  }

 private:
  const ChatTemplateLimits& lim_;
  const Body& body_;
  const Dict& vars_;
  std::deque<Scope> arena_;
  Scope* cur_ = nullptr;
  std::string main_out_;
  std::string* out_ = nullptr;
  Budget budget_;  // iterations and string work, shared with the free helpers (t_budget)
  Budget* saved_budget_ = nullptr;
  int calls_ = 0;
  uintptr_t stack_base_ = 0;
  std::vector<std::shared_ptr<Namespace>> namespaces_;

  // --- bookkeeping

  Scope* new_scope(Scope* parent) {
    if (arena_.size() > static_cast<size_t>(lim_.max_loop_iterations) + 1024)
      throw_error("limit", "too many scopes (loops and macro calls) in one render");
    arena_.emplace_back();
    arena_.back().parent = parent;
    return &arena_.back();
  }

  void check_stack() const {
    char probe = 0;
    const uintptr_t here = reinterpret_cast<uintptr_t>(&probe);
    const uintptr_t used = stack_base_ > here ? stack_base_ - here : here - stack_base_;
    if (used > lim_.max_stack_bytes) throw_error("limit", "the template recurses too deeply (stack budget exceeded)");
  }

  void tick(size_t n) { budget_.tick(n); }

  void work(size_t n) {
    budget_.check_size(n);
    budget_.add_work(n);
  }

  Value mk_str(std::string s) {
    work(s.size());
    return Value::str(std::move(s));
  }
  Value mk_markup(std::string s) {
    work(s.size());
    return Value::markup(std::move(s));
  }
  // A string result that is Markup when `from` was (what markupsafe's wrapped str methods return).
  Value keep_markup(const Value& from, std::string s) {
    return from.is_markup() ? mk_markup(std::move(s)) : mk_str(std::move(s));
  }

  void write(std::string_view s) {
    if (out_->size() + s.size() > lim_.max_output_bytes)
      throw_error("limit", "the rendered text would exceed " + std::to_string(lim_.max_output_bytes) + " bytes");
    out_->append(s);
  }

  // --- variables

  Value lookup(const std::string& name) const {
    for (const Scope* s = cur_; s; s = s->parent)
      if (const Value* v = s->find_local(name)) return *v;
    if (const Value* v = vars_.find_str(name)) return *v;
    if (is_global(name)) {
      Callable c;
      c.k = Callable::K::kGlobal;
      c.name = name;
      return make_callable(std::move(c));
    }
    return undefined_name(name);
  }

  // --- sequences

  // The items of an iterable, as Python's iter() yields them (counted against the iteration limit).
  List iterate(const Value& v) {
    List out;
    switch (v.t) {
      case VT::kUndefined: return out;
      case VT::kList: tick(v.l->size()); return *v.l;
      case VT::kDict:
        tick(v.d->items.size());
        for (const auto& kv : v.d->items) out.push_back(kv.first);
        return out;
      case VT::kStr: {
        const std::string& s = v.str_ref();
        size_t i = 0;
        while (i < s.size()) {
          char32_t cp = 0;
          size_t n = unicode::decode_utf8(s, i, cp);
          if (n == 0) n = 1;
          tick(1);  // (each character counted before it is made: a long string fails fast)
          out.push_back(Value::str(s.substr(i, n)));
          i += n;
        }
        return out;
      }
      default: type_error("'" + type_name(v) + "' object is not iterable");
    }
  }

  std::shared_ptr<const List> iterate_shared(const Value& v) {
    if (v.t == VT::kList) {
      tick(v.l->size());
      return v.l;
    }
    return std::make_shared<const List>(iterate(v));
  }

  static int64_t length(const Value& v) {
    switch (v.t) {
      case VT::kUndefined: return 0;
      case VT::kStr: return cp_length(v.str_ref());
      case VT::kList:
        if (v.is_gen()) type_error("object of type 'generator' has no len()");
        return static_cast<int64_t>(v.l->size());
      case VT::kDict: return static_cast<int64_t>(v.d->items.size());
      default: type_error("object of type '" + type_name(v) + "' has no len()");
    }
  }

  static void check_hashable(const Value& v, int depth = 0) {
    check_depth(depth);
    if (v.t == VT::kDict || v.t == VT::kNamespace || (v.is_list() && !v.is_tuple() && !v.is_gen()))
      type_error("unhashable type: '" + type_name(v) + "'");
    if (v.is_tuple())
      for (const auto& x : *v.l) check_hashable(x, depth + 1);
  }

  bool contains(const Value& container, const Value& item) {
    switch (container.t) {
      case VT::kUndefined: return false;
      case VT::kStr:
        if (!item.is_str()) type_error("'in <string>' requires string as left operand, not " + type_name(item));
        budget_work(container.str_ref().size());
        return find_bytes(container.str_ref(), item.str_ref()) != std::string::npos;
      case VT::kList:
        tick(container.l->size());
        for (const auto& x : *container.l)
          if (py_eq(x, item)) return true;
        return false;
      case VT::kDict: check_hashable(item); return container.d->find(item) != nullptr;
      default: type_error("argument of type '" + type_name(container) + "' is not iterable");
    }
  }

  // --- attribute and item access (the sandbox's getattr / getitem)

  // The Python attribute `name` of obj (methods, a namespace's or loop's attributes), or an Undefined when there is
  // none (flagged when the sandbox refuses it).
  Value python_attr(const Value& obj, const std::string& name) {
    if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return unsafe_attr(obj, name);
    switch (obj.t) {
      case VT::kStr:
        if (is_str_method(name)) return make_method(obj, name);
        break;
      case VT::kDict:
        if (name == "get" || name == "items" || name == "keys" || name == "values" || name == "copy" ||
            name == "fromkeys")
          return make_method(obj, name);
        if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update")
          return unsafe_attr(obj, name);
        break;
      case VT::kList:
        if (!obj.is_seq()) break;
        if (name == "count" || name == "index" || (!obj.is_tuple() && name == "copy")) return make_method(obj, name);
        if (!obj.is_tuple() && (name == "append" || name == "clear" || name == "extend" || name == "insert" ||
                                name == "pop" || name == "remove" || name == "reverse" || name == "sort"))
          return unsafe_attr(obj, name);
        break;
      case VT::kNamespace:
        if (const Value* v = obj.ns->find(name)) return *v;
        break;
      case VT::kBool:
      case VT::kInt:
        if (name == "real" || name == "numerator") return Value::integer(obj.as_int());
        if (name == "imag") return Value::integer(0);
        if (name == "denominator") return Value::integer(1);
        if (name == "bit_length" || name == "conjugate" || name == "to_bytes" || name == "as_integer_ratio" ||
            name == "bit_count" || name == "is_integer")
          return make_method(obj, name);
        break;
      case VT::kFloat:
        if (name == "real") return obj;
        if (name == "imag") return Value::real(0.0);
        if (name == "is_integer" || name == "hex" || name == "conjugate" || name == "as_integer_ratio")
          return make_method(obj, name);
        break;
      case VT::kLoop: {
        const LoopInfo& L = *obj.loop;
        if (name == "index") return Value::integer(L.index0 + 1);
        if (name == "index0") return Value::integer(L.index0);
        if (name == "revindex") return Value::integer(L.length - L.index0);
        if (name == "revindex0") return Value::integer(L.length - L.index0 - 1);
        if (name == "first") return Value::boolean(L.index0 == 0);
        if (name == "last") return Value::boolean(L.index0 + 1 == L.length);
        if (name == "length") return Value::integer(L.length);
        if (name == "depth") return Value::integer(1);
        if (name == "depth0") return Value::integer(0);
        if (name == "previtem")
          return L.index0 > 0 ? (*L.items)[static_cast<size_t>(L.index0 - 1)]
                              : Value::undefined("there is no previous item");
        if (name == "nextitem")
          return L.index0 + 1 < L.length ? (*L.items)[static_cast<size_t>(L.index0 + 1)]
                                         : Value::undefined("there is no next item");
        if (name == "cycle" || name == "changed") return make_method(obj, name);
        break;
      }
      default: break;
    }
    return Value::undefined("");
  }

  Value getattr(const Value& obj, const std::string& name) {
    if (obj.undef()) fail_undefined(obj);
    Value a = python_attr(obj, name);
    if (!a.undef() || (a.flags & kFlagSecurity)) return a;
    if (obj.t == VT::kDict)
      if (const Value* v = obj.d->find_str(name)) return *v;
    return undefined_attr(obj, name);
  }

  Value getitem(const Value& obj, const Value& key) {
    // jinja2's getitem: obj[key], and where Python raises TypeError/LookupError, the attribute of that name (for a str
    // key) or an Undefined.
    if (obj.undef()) fail_undefined(obj);
    switch (obj.t) {
      case VT::kDict:
        if (const Value* v = obj.d->find(key)) return *v;
        break;
      case VT::kList:
        if (!obj.is_seq()) break;
        if (key.is_int_like()) {
          int64_t idx = key.as_int();
          const int64_t n = static_cast<int64_t>(obj.l->size());
          if (idx < 0) idx += n;
          if (idx >= 0 && idx < n) return (*obj.l)[static_cast<size_t>(idx)];
        }
        break;
      case VT::kStr:
        if (key.is_int_like()) {
          std::u32string u = to_u32(obj.str_ref());
          int64_t idx = key.as_int();
          const int64_t n = static_cast<int64_t>(u.size());
          if (idx < 0) idx += n;
          if (idx >= 0 && idx < n) {
            Value r = Value::str(to_utf8(std::u32string(1, u[static_cast<size_t>(idx)])));
            r.flags = obj.flags & kFlagMarkup;
            return r;
          }
        }
        break;
      default: break;
    }
    if (key.is_str()) {
      Value a = python_attr(obj, key.str_ref());
      if (!a.undef() || (a.flags & kFlagSecurity)) return a;
    }
    return undefined_attr(obj, key);
  }

  static std::optional<int64_t> slice_index(const Value& v) {
    if (v.t == VT::kNone) return std::nullopt;
    if (v.is_int_like()) return v.as_int();
    type_error("slice indices must be integers or None or have an __index__ method");
  }

  // Python's slice of a sequence of n items: the indexes it selects.
  static std::vector<int64_t> slice_indices(int64_t n, std::optional<int64_t> start, std::optional<int64_t> stop,
                                            std::optional<int64_t> step_opt) {
    const int64_t step = step_opt.value_or(1);
    if (step == 0) value_error("slice step cannot be zero");
    auto adjust = [&](std::optional<int64_t> v, bool is_start) -> int64_t {
      if (!v) return is_start ? (step < 0 ? n - 1 : 0) : (step < 0 ? -1 : n);
      int64_t x = *v;
      if (x < 0) {
        x += n;
        if (x < 0) x = step < 0 ? -1 : 0;
      } else if (x >= n) {
        x = step < 0 ? n - 1 : n;
      }
      return x;
    };
    const int64_t b = adjust(start, true), e = adjust(stop, false);
    std::vector<int64_t> out;  // (k in 128 bits: k + step can pass INT64_MAX, e.g. s[2::9223372036854775807])
    if (step > 0)
      for (i128 k = b; k < e; k += step) out.push_back(static_cast<int64_t>(k));
    else
      for (i128 k = b; k > e; k += step) out.push_back(static_cast<int64_t>(k));
    return out;
  }

  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
    if (obj.undef()) fail_undefined(obj);
    // jinja2 compiles a slice to Python's own subscript (not environment.getitem), so its TypeErrors propagate.
    if (obj.t == VT::kDict) type_error("unhashable type: 'slice'");
    if (!(obj.is_str() || obj.is_seq())) type_error("'" + type_name(obj) + "' object is not subscriptable");
    const auto a = slice_index(start), b = slice_index(stop), c = slice_index(step);
    if (obj.is_str()) {
      std::u32string u = to_u32(obj.str_ref());
      std::u32string out;
      for (int64_t k : slice_indices(static_cast<int64_t>(u.size()), a, b, c)) out.push_back(u[static_cast<size_t>(k)]);
      return keep_markup(obj, to_utf8(out));
    }
    if (obj.is_seq()) {
      List out;
      auto idx = slice_indices(static_cast<int64_t>(obj.l->size()), a, b, c);
      tick(idx.size());
      for (int64_t k : idx) out.push_back((*obj.l)[static_cast<size_t>(k)]);
      return Value::list(std::move(out), obj.flags & kFlagTuple);
    }
    return Value::undefined("");
  }

  // --- arithmetic

  static const char* op_symbol(BinOp op) {
    switch (op) {
      case BinOp::kAdd: return "+";
      case BinOp::kSub: return "-";
      case BinOp::kMul: return "*";
      case BinOp::kDiv: return "/";
      case BinOp::kFloorDiv: return "//";
      case BinOp::kMod: return "%";
      case BinOp::kPow: return "**";
    }
    return "?";
  }

  [[noreturn]] static void unsupported_operands(BinOp op, const Value& a, const Value& b) {
    type_error(std::string("unsupported operand type(s) for ") + op_symbol(op) + ": '" + type_name(a) + "' and '" +
               type_name(b) + "'");
  }

  Value repeat(const Value& seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.is_str()) {
      const std::string& s = seq.str_ref();
      if (!s.empty() && static_cast<uint64_t>(times) > lim_.max_output_bytes / s.size())
        throw_error("limit", "a repeated string would exceed the output limit");
      std::string out;
      for (int64_t k = 0; k < times; ++k) out += s;
      Value r = mk_str(std::move(out));
      r.flags = seq.flags & kFlagMarkup;
      return r;
    }
    const size_t n = seq.l->size();
    if (n && static_cast<uint64_t>(times) > static_cast<uint64_t>(lim_.max_loop_iterations) / n)
      throw_error("limit", "a repeated list would exceed the iteration limit");
    tick(n * static_cast<size_t>(times));
    List out;
    for (int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.l->begin(), seq.l->end());
    return Value::list(std::move(out), seq.flags & kFlagTuple);
  }

  Value binop(BinOp op, const Value& a, const Value& b) {
    if (a.undef()) fail_undefined(a);
    if (op == BinOp::kMod && a.is_str()) {  // str.__mod__ formats an Undefined without failing on it
      Value r = mk_str(percent_format(a.str_ref(), b, a.is_markup()));
      r.flags = a.flags & kFlagMarkup;
      return r;
    }
    if (b.undef()) fail_undefined(b);
    if (a.is_number() && b.is_number()) {
      if (a.is_int_like() && b.is_int_like()) {
        const i128 x = a.as_int(), y = b.as_int();
        switch (op) {
          case BinOp::kAdd: return Value::integer(checked(x + y));
          case BinOp::kSub: return Value::integer(checked(x - y));
          case BinOp::kMul: return Value::integer(checked(x * y));
          case BinOp::kDiv:
            if (y == 0) throw_error("ZeroDivisionError", "division by zero");
            return Value::real(static_cast<double>(a.as_int()) / static_cast<double>(b.as_int()));
          case BinOp::kFloorDiv: return Value::integer(py_floordiv(a.as_int(), b.as_int()));
          case BinOp::kMod: return Value::integer(py_mod(a.as_int(), b.as_int()));
          case BinOp::kPow: {
            if (y < 0) {
              if (x == 0) throw_error("ZeroDivisionError", "0.0 cannot be raised to a negative power");
              return Value::real(std::pow(static_cast<double>(a.as_int()), static_cast<double>(b.as_int())));
            }
            i128 r = 1, base = x;
            int64_t e = b.as_int();
            while (e > 0) {
              if (e & 1) r = checked(r * base);
              e >>= 1;
              if (e > 0) base = checked(base * base);
            }
            return Value::integer(checked(r));
          }
        }
      }
      const double x = a.as_double(), y = b.as_double();
      switch (op) {
        case BinOp::kAdd: return Value::real(x + y);
        case BinOp::kSub: return Value::real(x - y);
        case BinOp::kMul: return Value::real(x * y);
        case BinOp::kDiv:
          if (y == 0.0) throw_error("ZeroDivisionError", "float division by zero");
          return Value::real(x / y);
        case BinOp::kFloorDiv: return Value::real(py_ffloordiv(x, y));
        case BinOp::kMod: return Value::real(py_fmod(x, y));
        case BinOp::kPow:
          if (x == 0.0 && y < 0) throw_error("ZeroDivisionError", "0.0 cannot be raised to a negative power");
          if (x < 0 && y != std::floor(y)) value_error("complex results are not supported");
          return Value::real(std::pow(x, y));
      }
    }
    switch (op) {
      case BinOp::kAdd:
        if (a.is_str()) {
          if (!b.is_str()) {
            if (a.is_markup()) unsupported_operands(op, a, b);
            type_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
          }
          if (a.is_markup() || b.is_markup()) {  // Markup.__add__ / __radd__ escape the plain side
            std::string text = markup_text(a) + markup_text(b);
            work(text.size());
            return Value::markup(std::move(text));
          }
          work(a.str_ref().size() + b.str_ref().size());
          return Value::str(a.str_ref() + b.str_ref());
        }
        if (a.is_seq()) {
          if (!b.is_seq() || a.is_tuple() != b.is_tuple())
            type_error("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
          tick(a.l->size() + b.l->size());
          List out = *a.l;
          out.insert(out.end(), b.l->begin(), b.l->end());
          return Value::list(std::move(out), a.flags & kFlagTuple);
        }
        unsupported_operands(op, a, b);
      case BinOp::kMul: {
        const bool a_seq = a.is_str() || a.is_seq();
        const bool b_seq = b.is_str() || b.is_seq();
        if (a_seq && b.is_int_like()) return repeat(a, b.as_int());
        if (b_seq && a.is_int_like()) return repeat(b, a.as_int());
        if (a_seq || b_seq) type_error("can't multiply sequence by non-int of type '" + type_name(a_seq ? b : a) + "'");
        unsupported_operands(op, a, b);
      }
      case BinOp::kMod:
        if (a.is_str()) {
          Value r = mk_str(percent_format(a.str_ref(), b, a.is_markup()));
          r.flags = a.flags & kFlagMarkup;
          return r;
        }
        unsupported_operands(op, a, b);
      default: unsupported_operands(op, a, b);
    }
  }

  // Python's printf-style `fmt % args` for %s %r %d %i %f %%, without flags or widths.
  std::string percent_format(const std::string& fmt, const Value& args_value, bool escape_args = false) {
    List args;
    if (args_value.is_tuple())
      args = *args_value.l;
    else
      args.push_back(args_value);
    std::string out;
    size_t next_arg = 0;
    for (size_t k = 0; k < fmt.size(); ++k) {
      if (fmt[k] != '%') {
        out += fmt[k];
        continue;
      }
      if (k + 1 >= fmt.size()) value_error("incomplete format");
      Value keyed;
      bool by_key = false;
      if (fmt[k + 1] == '(') {
        const size_t close = fmt.find(')', k + 2);
        if (close == std::string::npos) value_error("incomplete format key");
        if (args_value.t != VT::kDict) type_error("format requires a mapping");
        const Value* found = args_value.d->find_str(fmt.substr(k + 2, close - k - 2));
        if (!found) throw_error("KeyError", py_str_repr(fmt.substr(k + 2, close - k - 2)));
        keyed = *found;
        by_key = true;
        k = close;
        if (k + 1 >= fmt.size()) value_error("incomplete format");
      }
      const char c = fmt[++k];
      if (c == '%') {
        out += '%';
        continue;
      }
      if (!by_key && next_arg >= args.size()) type_error("not enough arguments for format string");
      const Value& v = by_key ? keyed : args[next_arg++];
      switch (c) {
        case 's': out += escape_args ? markup_text(v) : py_str(v); break;
        case 'r': out += escape_args ? html_escape(py_repr(v)) : py_repr(v); break;
        case 'd':
        case 'i':
          if (v.undef()) fail_undefined(v);
          if (!v.is_number())
            type_error(std::string("%") + c + " format: a real number is required, not " + type_name(v));
          if (v.t == VT::kFloat) {
            if (std::isnan(v.f)) value_error("cannot convert float NaN to integer");
            if (!(std::fabs(v.f) < 9223372036854775808.0))
              throw_error("OverflowError", "integer beyond 64 bits (this renderer's ints)");
          }
          out += std::to_string(v.t == VT::kFloat ? static_cast<int64_t>(v.f) : v.as_int());
          break;
        case 'f': {
          if (!v.is_number()) type_error("must be real number, not " + type_name(v));
          char buf[512];
          std::snprintf(buf, sizeof(buf), "%f", v.as_double());
          out += buf;
          break;
        }
        default: value_error(std::string("unsupported format character '") + c + "' in this renderer");
      }
      check_built(out.size());
    }
    // Python checks for unused arguments unless the argument is a mapping (for it: anything with __getitem__ but str)
    if (next_arg < args.size() && args_value.is_tuple())
      type_error("not all arguments converted during string formatting");
    if (next_arg == 0 && !args_value.is_tuple() &&
        !(args_value.t == VT::kDict || args_value.is_seq() || args_value.undef()))
      type_error("not all arguments converted during string formatting");
    return out;
  }

  Value compare(CmpOp op, const Value& a, const Value& b) {
    switch (op) {
      case CmpOp::kEq: return Value::boolean(py_eq(a, b));
      case CmpOp::kNe: return Value::boolean(!py_eq(a, b));
      case CmpOp::kIn: return Value::boolean(contains(b, a));
      case CmpOp::kNotIn: return Value::boolean(!contains(b, a));
      case CmpOp::kLt: {
        const int c = py_cmp(a, b, "<");
        return Value::boolean(c == -1);
      }
      case CmpOp::kLe: {
        const int c = py_cmp(a, b, "<=");
        return Value::boolean(c == -1 || c == 0);
      }
      case CmpOp::kGt: {
        const int c = py_cmp(a, b, ">");
        return Value::boolean(c == 1);
      }
      case CmpOp::kGe: {
        const int c = py_cmp(a, b, ">=");
        return Value::boolean(c == 1 || c == 0);
      }
    }
    return Value::boolean(false);
  }

  // --- expressions

  Args eval_args(const Expr& e) {
    Args a;
    for (const auto& it : e.items) a.pos.push_back(eval(*it));
    for (const auto& kw : e.kwargs) a.kw.emplace_back(kw.first, eval(*kw.second));
    return a;
  }

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (JinjaError& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  Value eval_inner(const Expr& e) {
    check_stack();
    switch (e.k) {
      case EK::kConst: return e.value;
      case EK::kName: return lookup(e.name);
      case EK::kGetattr: return getattr(eval(*e.a), e.name);
      case EK::kGetitem: {
        Value obj = eval(*e.a);
        if (e.b->k == EK::kSlice) {
          Value parts[3];
          for (size_t k = 0; k < 3; ++k) parts[k] = e.b->items[k] ? eval(*e.b->items[k]) : Value::none();
          return slice(obj, parts[0], parts[1], parts[2]);
        }
        return getitem(obj, eval(*e.b));
      }
      case EK::kSlice: type_error("a slice outside of a subscript");
      case EK::kList:
      case EK::kTuple: {
        List items;
        for (const auto& it : e.items) items.push_back(eval(*it));
        return Value::list(std::move(items), e.k == EK::kTuple ? kFlagTuple : 0);
      }
      case EK::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          Value key = eval(*e.items[k]);
          if (key.is_list() && !key.is_tuple()) type_error("unhashable type: '" + type_name(key) + "'");
          if (key.t == VT::kDict) type_error("unhashable type: 'dict'");
          d.set(std::move(key), eval(*e.items[k + 1]));
        }
        return make_dict(std::move(d));
      }
      case EK::kCall: {
        Value f = eval(*e.a);
        Args args = eval_args(e);
        return call(f, std::move(args));
      }
      case EK::kFilter: {
        Value v = e.a ? eval(*e.a) : Value::none();
        return apply_filter(e, std::move(v));
      }
      case EK::kTest: {
        Value v = eval(*e.a);
        return Value::boolean(apply_test(e, v));
      }
      case EK::kNeg:
      case EK::kPos: {
        Value v = eval(*e.a);
        if (v.undef()) fail_undefined(v);
        if (!v.is_number())
          type_error(std::string("bad operand type for unary ") + (e.k == EK::kNeg ? "-" : "+") + ": '" + type_name(v) +
                     "'");
        if (e.k == EK::kPos) return v.t == VT::kBool ? Value::integer(v.as_int()) : v;
        if (v.t == VT::kFloat) return Value::real(-v.f);
        return Value::integer(checked(-static_cast<i128>(v.as_int())));
      }
      case EK::kNot: return Value::boolean(!truthy(eval(*e.a)));
      case EK::kBin: {
        Value a = eval(*e.a);
        Value b = eval(*e.b);
        return binop(e.bop, a, b);
      }
      case EK::kAnd: {
        Value a = eval(*e.a);
        return truthy(a) ? eval(*e.b) : a;
      }
      case EK::kOr: {
        Value a = eval(*e.a);
        return truthy(a) ? a : eval(*e.b);
      }
      case EK::kConcat: {
        std::string s;
        for (const auto& it : e.items) {
          s += py_str(eval(*it));
          check_built(s.size());
        }
        return mk_str(std::move(s));
      }
      case EK::kCompare: {
        Value left = eval(*e.items[0]);
        for (size_t k = 0; k < e.cops.size(); ++k) {
          Value right = eval(*e.items[k + 1]);
          Value r = compare(e.cops[k], left, right);
          if (!r.b) return r;
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case EK::kCond:
        if (truthy(eval(*e.b))) return eval(*e.a);
        if (e.c) return eval(*e.c);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      case EK::kNsRef: type_error("a namespace reference outside of an assignment");
    }
    return Value::undefined("");
  }

  // --- calls

  Value call(const Value& f, Args args) {
    if (f.undef()) fail_undefined(f);
    if (f.t != VT::kCallable) type_error("'" + type_name(f) + "' object is not callable");
    const Callable& c = *f.fn;
    switch (c.k) {
      case Callable::K::kMacro: return call_macro(c, std::move(args));
      case Callable::K::kGlobal: return call_global(c.name, args);
      case Callable::K::kMethod: return call_method(c.self, c.name, args);
    }
    return Value::none();
  }

  Value call_macro(const Callable& c, Args args) {
    const MacroDef& m = *c.macro;
    if (calls_ >= lim_.max_call_depth)
      throw_error("limit", "macro calls nested deeper than " + std::to_string(lim_.max_call_depth));
    ++calls_;
    struct Restore {
      Renderer& r;
      Scope* scope;
      std::string* out;
      ~Restore() {
        r.cur_ = scope;
        r.out_ = out;
        --r.calls_;
      }
    } restore{*this, cur_, out_};
    Scope* sc = new_scope(c.closure);
    cur_ = sc;
    std::vector<bool> used_kw(args.kw.size(), false);
    for (size_t k = 0; k < m.params.size(); ++k) {
      const std::string& p = m.params[k];
      Value v;
      bool have = false;
      if (k < args.pos.size()) {
        v = args.pos[k];
        have = true;
      }
      for (size_t j = 0; j < args.kw.size(); ++j)
        if (args.kw[j].first == p) {
          if (have) type_error("macro '" + m.name + "' got multiple values for argument '" + p + "'");
          v = args.kw[j].second;
          used_kw[j] = true;
          have = true;
        }
      if (!have) {
        if (m.defaults[k])
          v = eval(*m.defaults[k]);
        else
          v = Value::undefined("parameter '" + p + "' was not provided");
      }
      sc->set(p, std::move(v));
    }
    List varargs;
    for (size_t k = m.params.size(); k < args.pos.size(); ++k) varargs.push_back(args.pos[k]);
    Dict kwargs;
    for (size_t j = 0; j < args.kw.size(); ++j) {
      if (used_kw[j]) continue;
      if (args.kw[j].first == "caller")
        sc->set("caller", args.kw[j].second);
      else
        kwargs.set(Value::str(args.kw[j].first), args.kw[j].second);
    }
    sc->set("varargs", Value::list(std::move(varargs), kFlagTuple));
    sc->set("kwargs", make_dict(std::move(kwargs)));
    std::string buf;
    out_ = &buf;
    exec(m.body);
    return Value::str(std::move(buf));
  }

  Value call_global(const std::string& name, const Args& a) {
    if (name == "raise_exception") {
      std::string msg = a.pos.empty() ? std::string() : py_str(a.pos[0]);
      throw_error("raise_exception", std::move(msg));
    }
    if (name == "strftime_now") {
      if (a.pos.empty() || !a.pos[0].is_str()) type_error("strftime_now() takes a format string");
      const std::string& fmt = a.pos[0].str_ref();
      std::time_t now = std::time(nullptr);
      std::tm tm_local{};
      localtime_r(&now, &tm_local);
      std::string buf(fmt.size() * 8 + 64, '\0');
      size_t n = 0;
      for (int attempt = 0; attempt < 6; ++attempt) {
        n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm_local);
        if (n > 0 || fmt.empty()) break;
        buf.resize(buf.size() * 4);
      }
      buf.resize(n);
      return mk_str(std::move(buf));
    }
    if (name == "range") {
      std::vector<int64_t> nums;
      for (const auto& v : a.pos) {
        if (v.undef()) fail_undefined(v);
        if (!v.is_int_like()) type_error("'" + type_name(v) + "' object cannot be interpreted as an integer");
        nums.push_back(v.as_int());
      }
      int64_t start = 0, stop = 0, step = 1;
      if (nums.size() == 1) {
        stop = nums[0];
      } else if (nums.size() == 2 || nums.size() == 3) {
        start = nums[0];
        stop = nums[1];
        if (nums.size() == 3) step = nums[2];
      } else {
        type_error("range expected 1 to 3 arguments, got " + std::to_string(nums.size()));
      }
      if (step == 0) value_error("range() arg 3 must not be zero");
      i128 count = 0;
      if (step > 0 && stop > start) count = (static_cast<i128>(stop) - start + step - 1) / step;
      if (step < 0 && stop < start) count = (static_cast<i128>(start) - stop - step - 1) / (-static_cast<i128>(step));
      if (count > 100000)
        throw_error("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      List out;  // (bounded by MAX_RANGE; iterating it counts against the iteration limit)
      for (i128 k = 0; k < count; ++k) out.push_back(Value::integer(static_cast<int64_t>(start + k * step)));
      return Value::list(std::move(out));
    }
    if (name == "dict") {
      Dict d;
      if (!a.pos.empty()) {
        if (a.pos[0].t == VT::kDict) {
          d = *a.pos[0].d;
        } else {
          for (const auto& item : iterate(a.pos[0])) {
            List kv = iterate(item);
            if (kv.size() != 2)
              value_error("dictionary update sequence element has length " + std::to_string(kv.size()) +
                          "; 2 is required");
            d.set(kv[0], kv[1]);
          }
        }
      }
      for (const auto& kw : a.kw) d.set(Value::str(kw.first), kw.second);
      return make_dict(std::move(d));
    }
    if (name == "namespace") {
      Value v;
      v.t = VT::kNamespace;
      v.ns = std::make_shared<Namespace>();
      namespaces_.push_back(v.ns);
      if (!a.pos.empty()) {
        if (a.pos[0].t == VT::kDict) {
          for (const auto& kv : a.pos[0].d->items) v.ns->set(py_str(kv.first), kv.second);
        } else if (!a.pos[0].undef()) {
          for (const auto& item : iterate(a.pos[0])) {
            List kv = iterate(item);
            if (kv.size() != 2)
              value_error("dictionary update sequence element has length " + std::to_string(kv.size()) +
                          "; 2 is required");
            v.ns->set(py_str(kv[0]), kv[1]);
          }
        }
      }
      for (const auto& kw : a.kw) v.ns->set(kw.first, kw.second);
      return v;
    }
    throw_error("NotSupported", "the global '" + name + "' is not supported by this renderer");
  }

  // --- methods of str, dict, list and the loop

  static const Value* arg_at(const Args& a, size_t idx, std::string_view kwname) {
    if (idx < a.pos.size()) return &a.pos[idx];
    for (const auto& kw : a.kw)
      if (kw.first == kwname) return &kw.second;
    return nullptr;
  }

  static void check_arity(const Args& a, size_t max_pos, const char* what) {
    if (a.pos.size() > max_pos)
      type_error(std::string(what) + " takes at most " + std::to_string(max_pos) + " arguments (" +
                 std::to_string(a.pos.size()) + " given)");
  }

  static const std::string& need_str(const Value* v, const char* what) {
    if (!v) type_error(std::string(what) + " missing required argument");
    if (v->undef()) fail_undefined(*v);
    if (!v->is_str()) type_error(std::string(what) + " argument must be str, not " + type_name(*v));
    return v->str_ref();
  }

  static int64_t need_int(const Value* v, const char* what) {
    if (!v) type_error(std::string(what) + " missing required argument");
    if (v->undef()) fail_undefined(*v);
    if (!v->is_int_like()) type_error("'" + type_name(*v) + "' object cannot be interpreted as an integer");
    return v->as_int();
  }

  // Python's str.split / rsplit.
  static List py_split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
    List out;
    if (!sep || sep->t == VT::kNone) {
      std::u32string u = to_u32(s);
      std::vector<std::pair<size_t, size_t>> words;  // [b, e)
      if (!from_right) {
        size_t k = 0;
        while (k < u.size()) {
          while (k < u.size() && py_isspace(u[k])) ++k;
          if (k >= u.size()) break;
          if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
            budget_tick(1);
            words.emplace_back(k, u.size());
            break;
          }
          size_t b = k;
          while (k < u.size() && !py_isspace(u[k])) ++k;
          budget_tick(1);
          words.emplace_back(b, k);
        }
      } else {
        size_t k = u.size();
        while (k > 0) {
          while (k > 0 && py_isspace(u[k - 1])) --k;
          if (k == 0) break;
          if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
            budget_tick(1);
            words.emplace_back(0, k);
            break;
          }
          size_t e = k;
          while (k > 0 && !py_isspace(u[k - 1])) --k;
          budget_tick(1);
          words.emplace_back(k, e);
        }
        std::reverse(words.begin(), words.end());
      }
      for (const auto& w : words)
        out.push_back(Value::str(to_utf8(std::u32string_view(u).substr(w.first, w.second - w.first))));
      return out;
    }
    const std::string& d = need_str(sep, "split()");
    if (d.empty()) value_error("empty separator");
    // Each part counts as a sequence item as it is made; rsplit is split of the reversed text at the reversed
    // separator (the same non-overlapping matches, found from the right), its parts reversed back.
    auto split_fwd = [&](const std::string& text, const std::string& sp) {
      std::vector<std::string> parts;
      size_t b = 0;
      int64_t n = 0;
      while (true) {
        budget_tick(1);
        const size_t q = (maxsplit < 0 || n < maxsplit) ? find_bytes(text, sp, b) : std::string::npos;
        if (q == std::string::npos) {
          parts.push_back(text.substr(b));
          break;
        }
        parts.push_back(text.substr(b, q - b));
        b = q + sp.size();
        ++n;
      }
      return parts;
    };
    std::vector<std::string> parts;
    if (!from_right) {
      parts = split_fwd(s, d);
    } else {
      parts = split_fwd(std::string(s.rbegin(), s.rend()), std::string(d.rbegin(), d.rend()));
      for (auto& p : parts) std::reverse(p.begin(), p.end());
      std::reverse(parts.begin(), parts.end());
    }
    for (auto& p : parts) out.push_back(Value::str(std::move(p)));
    return out;
  }

  // Code point offsets [start, end) of Python's optional start/end arguments.
  static std::pair<int64_t, int64_t> span_args(const Args& a, size_t first, int64_t n) {
    auto get = [&](size_t idx, int64_t dflt) -> int64_t {
      if (idx >= a.pos.size() || a.pos[idx].t == VT::kNone) return dflt;
      int64_t v = need_int(&a.pos[idx], "slice index");
      if (v < 0) v = std::max<int64_t>(0, v + n);
      return std::min(v, n);
    };
    return {get(first, 0), get(first + 1, n)};
  }

  // The byte offset `n` code points after byte offset `from` in s (at most s.size()).
  static size_t cp_offset(const std::string& s, size_t from, int64_t n) {
    size_t i = from;
    for (int64_t k = 0; k < n && i < s.size(); ++k) {
      ++i;
      while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    }
    return i;
  }

  static std::string pad(const std::string& s, int64_t width, const Value* fill, int mode) {
    std::u32string f = U" ";
    if (fill) {
      f = to_u32(need_str(fill, "fillchar"));
      if (f.size() != 1) type_error("The fill character must be exactly one character long");
    }
    const int64_t n = cp_length(s);
    if (width <= n) return s;
    if (width > (int64_t{1} << 26)) throw_error("limit", "padding too wide");
    check_built(static_cast<size_t>(width));
    const int64_t marg = width - n;
    int64_t left = 0;
    if (mode == 0) left = marg / 2 + (marg & width & 1);  // center
    if (mode == 2) left = marg;                           // rjust
    std::u32string out;
    out.append(static_cast<size_t>(left), f[0]);
    out += to_u32(s);
    out.append(static_cast<size_t>(marg - left), f[0]);
    return to_utf8(out);
  }

  Value call_method(const Value& self, const std::string& name, const Args& a) {
    if (self.t == VT::kLoop) {
      if (name == "cycle") {
        if (a.pos.empty()) type_error("no items for cycling given");
        return a.pos[static_cast<size_t>(self.loop->index0 % static_cast<int64_t>(a.pos.size()))];
      }
      throw_error("NotSupported", "loop." + name + "() is not supported by this renderer");
    }
    if (self.t == VT::kDict) {
      const Dict& d = *self.d;
      if (name == "get") {
        check_arity(a, 2, "get");
        const Value* key = arg_at(a, 0, "");
        if (!key) type_error("get expected at least 1 argument, got 0");
        if (const Value* v = d.find(*key)) return *v;
        const Value* dflt = arg_at(a, 1, "");
        return dflt ? *dflt : Value::none();
      }
      if (name == "items" || name == "keys" || name == "values") {
        List out;
        tick(d.items.size());
        for (const auto& kv : d.items) {
          if (name == "items")
            out.push_back(Value::list({kv.first, kv.second}, kFlagTuple));
          else
            out.push_back(name == "keys" ? kv.first : kv.second);
        }
        return Value::list(std::move(out), name == "items" ? kFlagItems : (name == "keys" ? kFlagKeys : kFlagValues));
      }
      if (name == "copy") return self;
      throw_error("NotSupported", "dict." + name + "() is not supported by this renderer");
    }
    if (self.t == VT::kList) {
      if (name == "copy") return Value::list(*self.l);
      if (name == "count" || name == "index") {
        const Value* x = arg_at(a, 0, "");
        if (!x) type_error(name + "() takes exactly one argument (0 given)");
        tick(self.l->size());
        int64_t count = 0;
        for (size_t k = 0; k < self.l->size(); ++k) {
          if (py_eq((*self.l)[k], *x)) {
            if (name == "index") return Value::integer(static_cast<int64_t>(k));
            ++count;
          }
        }
        if (name == "index") value_error(py_repr(*x) + " is not in list");
        return Value::integer(count);
      }
      throw_error("NotSupported", "list." + name + "() is not supported by this renderer");
    }
    if (!self.is_str()) type_error("'" + type_name(self) + "' object has no method '" + name + "'");
    if (self.is_markup()) return call_markup_method(self, name, a);
    const std::string& s = self.str_ref();
    work(s.size());
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      check_arity(a, 1, name.c_str());
      return Value::str(py_strip(s, arg_at(a, 0, "chars"), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      check_arity(a, 2, name.c_str());
      const Value* mx = arg_at(a, 1, "maxsplit");
      List parts = py_split(s, arg_at(a, 0, "sep"), mx ? need_int(mx, "maxsplit") : -1, name == "rsplit");
      return Value::list(std::move(parts));  // (py_split counted the parts)
    }
    if (name == "splitlines") {
      const Value* ke = arg_at(a, 0, "keepends");
      List out;
      for (auto& line : py_splitlines(s, ke && truthy(*ke), true)) out.push_back(Value::str(std::move(line)));
      return Value::list(std::move(out));  // (py_splitlines counted the lines)
    }
    if (name == "startswith" || name == "endswith") {
      const Value* p = arg_at(a, 0, "");
      if (!p) type_error(name + "() takes at least 1 argument (0 given)");
      List prefixes;
      if (p->is_tuple())
        prefixes = *p->l;
      else if (p->is_str())
        prefixes.push_back(*p);
      else
        type_error(name + " first arg must be str or a tuple of str, not " + type_name(*p));
      if (a.pos.size() == 1 && a.kw.empty()) {  // no start/end: compare bytes (UTF-8 keeps prefixes prefixes)
        for (const auto& pre : prefixes) {
          const std::string& x = need_str(&pre, name.c_str());
          if (x.size() > s.size()) continue;
          const size_t at = name == "startswith" ? 0 : s.size() - x.size();
          if (s.compare(at, x.size(), x) == 0) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      std::u32string u = to_u32(s);
      auto [b, e] = span_args(a, 1, static_cast<int64_t>(u.size()));
      for (const auto& pre : prefixes) {
        std::u32string x = to_u32(need_str(&pre, name.c_str()));
        if (e - b < static_cast<int64_t>(x.size())) continue;
        const size_t at = name == "startswith" ? static_cast<size_t>(b) : static_cast<size_t>(e) - x.size();
        if (u.compare(at, x.size(), x) == 0) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "lower") return Value::str(str_lower(s));
    if (name == "upper") return Value::str(str_upper(s));
    if (name == "title") return Value::str(str_title_py(s));
    if (name == "capitalize") return Value::str(str_capitalize(s));
    if (name == "swapcase") return Value::str(str_swapcase(s));
    if (name == "replace") {
      const std::string& old = need_str(arg_at(a, 0, "old"), "replace()");
      const std::string& neu = need_str(arg_at(a, 1, "new"), "replace()");
      const Value* cnt = arg_at(a, 2, "count");
      return mk_str(py_replace(s, old, neu, cnt ? need_int(cnt, "count") : -1));
    }
    if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
      // Searched as bytes in linear time (a UTF-8 match starts on a code point), offsets given and returned in code
      // points.
      const std::string& x = need_str(arg_at(a, 0, ""), name.c_str());
      auto [b, e] = span_args(a, 1, cp_length(s));
      const int64_t xn = cp_length(x);
      const size_t hb = cp_offset(s, 0, b);
      const std::string_view hay = std::string_view(s).substr(hb, cp_offset(s, hb, e - b) - hb);
      if (name == "count") {
        if (b > e) return Value::integer(0);
        if (x.empty()) return Value::integer(e - b + 1);
        int64_t n = 0;
        for (size_t q = find_bytes(hay, x); q != std::string_view::npos; q = find_bytes(hay, x, q + x.size())) ++n;
        return Value::integer(n);
      }
      int64_t r = -1;
      if (b <= e && xn <= e - b) {
        const size_t q = name[0] == 'r' ? rfind_bytes(hay, x) : find_bytes(hay, x);
        if (q != std::string_view::npos) r = b + cp_length(hay.substr(0, q));
      }
      if (r < 0 && (name == "index" || name == "rindex")) value_error("substring not found");
      return Value::integer(r);
    }
    if (name == "center" || name == "ljust" || name == "rjust") {
      const int64_t w = need_int(arg_at(a, 0, ""), name.c_str());
      return mk_str(pad(s, w, arg_at(a, 1, ""), name == "center" ? 0 : (name == "ljust" ? 1 : 2)));
    }
    if (name == "zfill") {
      const int64_t w = need_int(arg_at(a, 0, ""), "zfill");
      const int64_t n = cp_length(s);
      if (w <= n) return self;
      if (w > (int64_t{1} << 26)) throw_error("limit", "padding too wide");
      check_built(static_cast<size_t>(w));
      std::string out = s;
      size_t at = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
      out.insert(at, static_cast<size_t>(w - n), '0');
      return mk_str(std::move(out));
    }
    if (name == "join") {
      const Value* seq = arg_at(a, 0, "");
      if (!seq) type_error("join() takes exactly one argument (0 given)");
      std::string out;
      size_t k = 0;
      for (const auto& item : iterate(*seq)) {
        if (!item.is_str())
          type_error("sequence item " + std::to_string(k) + ": expected str instance, " + type_name(item) + " found");
        if (k++) out += s;
        out += item.str_ref();
        check_built(out.size());
      }
      return mk_str(std::move(out));
    }
    if (name == "partition" || name == "rpartition") {
      const std::string& sep = need_str(arg_at(a, 0, ""), name.c_str());
      if (sep.empty()) value_error("empty separator");
      const size_t q = name == "partition" ? find_bytes(s, sep) : rfind_bytes(s, sep);
      if (q == std::string::npos) {
        if (name == "partition") return Value::list({self, Value::str(""), Value::str("")}, kFlagTuple);
        return Value::list({Value::str(""), Value::str(""), self}, kFlagTuple);
      }
      return Value::list({Value::str(s.substr(0, q)), Value::str(sep), Value::str(s.substr(q + sep.size()))},
                         kFlagTuple);
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const std::string& x = need_str(arg_at(a, 0, ""), name.c_str());
      if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::str(s.substr(x.size()));
      if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
          s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value::str(s.substr(0, s.size() - x.size()));
      return self;
    }
    if (name == "isspace" || name == "isalpha" || name == "isdigit" || name == "isalnum" || name == "isdecimal" ||
        name == "isnumeric") {
      std::u32string u = to_u32(s);
      if (u.empty()) return Value::boolean(false);
      for (char32_t c : u) {
        const bool digit = c >= '0' && c <= '9';
        const bool alpha = is_cased_cp(c) || (c >= 0x80 && unicode::is_word_char(c) && !digit);
        bool ok = false;
        if (name == "isspace")
          ok = py_isspace(c);
        else if (name == "isalpha")
          ok = alpha;
        else if (name == "isalnum")
          ok = alpha || digit;
        else
          ok = digit;
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(true);
    }
    if (name == "islower" || name == "isupper") {
      bool any_cased = false;
      for (char32_t c : to_u32(s)) {
        if (name == "islower" ? is_upper_cp(c) : is_lower_cp(c)) return Value::boolean(false);
        if (is_cased_cp(c)) any_cased = true;
      }
      return Value::boolean(any_cased);
    }
    if (name == "format") return mk_str(str_format(s, a));
    throw_error("NotSupported", "str." + name + "() is not supported by this renderer");
  }

  // markupsafe.Markup's methods: the str method on escaped string arguments, its string results Markup again.
  Value call_markup_method(const Value& self, const std::string& name, const Args& a) {
    static const char* const kWrapped[] = {"capitalize", "title",      "lower",     "upper",      "replace",
                                           "ljust",      "rjust",      "lstrip",    "rstrip",     "center",
                                           "strip",      "swapcase",   "zfill",     "join",       "split",
                                           "rsplit",     "splitlines", "partition", "rpartition", "format"};
    Value plain = self;
    plain.flags = 0;
    const bool wrapped =
        std::any_of(std::begin(kWrapped), std::end(kWrapped), [&](const char* w) { return name == w; });
    if (!wrapped) return call_method(plain, name, a);
    auto esc = [](const Value& v) { return (v.is_str() && !v.is_markup()) ? Value::str(html_escape(v.str_ref())) : v; };
    Args ea;
    for (const auto& v : a.pos) ea.pos.push_back(esc(v));
    for (const auto& kw : a.kw) ea.kw.emplace_back(kw.first, esc(kw.second));
    if (name == "join" && !ea.pos.empty()) {
      List items;
      for (const auto& item : iterate(ea.pos[0])) items.push_back(esc(item));
      ea.pos[0] = Value::list(std::move(items));
    }
    Value r = call_method(plain, name, ea);
    if (r.is_str()) {
      r.flags = kFlagMarkup;
    } else if (r.is_list()) {
      List items = *r.l;
      for (auto& item : items)
        if (item.is_str()) item.flags = kFlagMarkup;
      r = Value::list(std::move(items), r.flags);
    }
    return r;
  }

  static std::string py_replace(const std::string& s, const std::string& old, const std::string& neu, int64_t count) {
    std::string out;
    if (old.empty()) {
      std::u32string u = to_u32(s);
      int64_t n = 0;
      for (size_t k = 0; k <= u.size(); ++k) {
        if (count < 0 || n < count) {
          out += neu;
          ++n;
          check_built(out.size());
        }
        if (k < u.size()) unicode::append_utf8(out, u[k]);
      }
      return out;
    }
    size_t b = 0;
    int64_t n = 0;
    while (true) {
      size_t q = (count < 0 || n < count) ? find_bytes(s, old, b) : std::string::npos;
      if (q == std::string::npos) break;
      out.append(s, b, q - b);
      out += neu;
      check_built(out.size());
      b = q + old.size();
      ++n;
    }
    out.append(s, b, std::string::npos);
    return out;
  }

  // str.format with {} {0} {name} {name.attr} {name[key]} fields and !s/!r conversions (no format specs).
  std::string str_format(const std::string& fmt, const Args& a) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t k = 0; k < fmt.size(); ++k) {
      const char c = fmt[k];
      if (c == '}') {
        if (k + 1 < fmt.size() && fmt[k + 1] == '}') {
          out += '}';
          ++k;
          continue;
        }
        value_error("Single '}' encountered in format string");
      }
      if (c != '{') {
        out += c;
        continue;
      }
      if (k + 1 < fmt.size() && fmt[k + 1] == '{') {
        out += '{';
        ++k;
        continue;
      }
      const size_t close = fmt.find('}', k);
      if (close == std::string::npos) value_error("Single '{' encountered in format string");
      std::string field = fmt.substr(k + 1, close - k - 1);
      k = close;
      char conv = 's';
      if (size_t bang = field.find('!'); bang != std::string::npos) {
        if (bang + 2 != field.size()) value_error("format specs are not supported by this renderer");
        conv = field[bang + 1];
        field.resize(bang);
      }
      if (field.find(':') != std::string::npos) value_error("format specs are not supported by this renderer");
      size_t name_end = field.find_first_of(".[");
      std::string head = field.substr(0, name_end);
      Value v;
      if (head.empty()) {
        if (auto_idx >= a.pos.size())
          throw_error("IndexError",
                      "Replacement index " + std::to_string(auto_idx) + " out of range for positional args tuple");
        v = a.pos[auto_idx++];
      } else if (std::all_of(head.begin(), head.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        const size_t idx = static_cast<size_t>(digits_value(head));
        if (idx >= a.pos.size())
          throw_error("IndexError", "Replacement index " + head + " out of range for positional args tuple");
        v = a.pos[idx];
      } else {
        const Value* kv = arg_at(a, SIZE_MAX, head);
        if (!kv) throw_error("KeyError", py_str_repr(head));
        v = *kv;
      }
      size_t p = name_end;
      while (p != std::string::npos && p < field.size()) {
        if (field[p] == '.') {
          size_t q = field.find_first_of(".[", p + 1);
          v = getattr(v, field.substr(p + 1, q == std::string::npos ? std::string::npos : q - p - 1));
          p = q;
        } else {
          size_t q = field.find(']', p);
          if (q == std::string::npos) value_error("Missing ']' in format string");
          std::string key = field.substr(p + 1, q - p - 1);
          Value kv = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; })
                         ? Value::integer(digits_value(key))
                         : Value::str(key);
          v = getitem(v, kv);
          p = q + 1;
        }
      }
      out += conv == 'r' ? py_repr(v) : py_str(v);
      check_built(out.size());
    }
    return out;
  }

  // --- filters

  Value ignore_case(const Value& v) { return v.is_str() ? Value::str(str_lower(v.str_ref())) : v; }

  // jinja2's make_attrgetter: "a.b.0" looks up item by item (environment.getitem); an int attribute is one index.
  Value attr_get(const Value& item, const Value* attribute, const Value* dflt) {
    Value cur = item;
    if (attribute && attribute->t != VT::kNone) {
      std::vector<Value> parts;
      if (attribute->is_str()) {
        const std::string& s = attribute->str_ref();
        size_t b = 0;
        while (true) {
          size_t q = s.find('.', b);
          std::string part = s.substr(b, q == std::string::npos ? std::string::npos : q - b);
          const bool digits =
              !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
          parts.push_back(digits ? Value::integer(digits_value(part)) : Value::str(part));
          if (q == std::string::npos) break;
          b = q + 1;
        }
      } else {
        parts.push_back(*attribute);
      }
      for (const auto& part : parts) {
        cur = getitem(cur, part);
        if (dflt && dflt->t != VT::kNone && cur.undef()) cur = *dflt;
      }
    }
    return cur;
  }

  static void check_filter_args(const Args& a, const std::vector<std::string_view>& names, const char* fname) {
    if (a.pos.size() > names.size())
      type_error(std::string(fname) + "() takes at most " + std::to_string(names.size() + 1) + " positional arguments");
    for (const auto& kw : a.kw)
      if (std::find(names.begin(), names.end(), kw.first) == names.end())
        type_error(std::string(fname) + "() got an unexpected keyword argument '" + kw.first + "'");
  }

  bool run_test_by_name(const std::string& name, const Value& v, const Args& args) {
    const int id = find_test(name);
    if (id < 0) throw_error("TemplateRuntimeError", "No test named '" + name + "'.");
    return run_test(static_cast<Tst>(test_table()[static_cast<size_t>(id)].second), name, v, args);
  }

  Value run_filter_by_name(const std::string& name, const Value& v, const Args& args) {
    const int id = find_filter(name);
    if (id < 0) throw_error("TemplateRuntimeError", "No filter named '" + name + "'.");
    return run_filter(filter_table()[static_cast<size_t>(id)].second, name, v, args);
  }

  Value apply_filter(const Expr& e, Value v) {
    if (e.fn < 0) throw_error("TemplateRuntimeError", "No filter named '" + e.name + "' found.");
    Args args = eval_args(e);
    return run_filter(filter_table()[static_cast<size_t>(e.fn)].second, e.name, v, args);
  }

  bool apply_test(const Expr& e, const Value& v) {
    if (e.fn < 0) throw_error("TemplateRuntimeError", "No test named '" + e.name + "' found.");
    Args args = eval_args(e);
    return run_test(test_table()[static_cast<size_t>(e.fn)].second, e.name, v, args);
  }

  // select/reject/selectattr/rejectattr.
  Value select_or_reject(const Value& seq, const Args& a, bool select, bool by_attr) {
    if (!truthy(seq)) return Value::list({}, kFlagGenerator);  // jinja2: `if value:` before anything else
    size_t off = 0;
    const Value* attribute = nullptr;
    if (by_attr) {
      if (a.pos.empty()) throw_error("FilterArgumentError", "Missing parameter for attribute name");
      attribute = &a.pos[0];
      off = 1;
    }
    std::string test;
    bool have_test = false;
    if (a.pos.size() > off) {
      test = py_str(a.pos[off]);
      have_test = true;
    }
    Args targs;
    for (size_t k = off + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
    targs.kw = a.kw;
    List out;
    for (const auto& item : iterate(seq)) {
      Value x = by_attr ? attr_get(item, attribute, nullptr) : item;
      const bool r = have_test ? run_test_by_name(test, x, targs) : truthy(x);
      if (r == select) out.push_back(item);
    }
    return Value::list(std::move(out), kFlagGenerator);
  }

  Value run_filter(Flt f, const std::string& fname, const Value& v, const Args& a) {
    const char* fn = fname.c_str();
    switch (f) {
      case Flt::kAbs:
        check_filter_args(a, {}, fn);
        if (v.undef()) type_error("bad operand type for abs(): 'Undefined'");
        if (v.t == VT::kFloat) return Value::real(std::fabs(v.f));
        if (v.is_int_like())
          return Value::integer(checked(v.as_int() < 0 ? -static_cast<i128>(v.as_int()) : v.as_int()));
        type_error("bad operand type for abs(): '" + type_name(v) + "'");
      case Flt::kAttr: {
        check_filter_args(a, {"name"}, fn);
        const Value* n = arg_at(a, 0, "name");
        if (v.undef()) fail_undefined(v);
        const std::string& attr_name = need_str(n, "attr");
        Value r = python_attr(v, attr_name);  // jinja2's |attr is Python's getattr only, never an item
        if (!r.undef() || (r.flags & kFlagSecurity)) return r;
        return undefined_attr(v, attr_name);
      }
      case Flt::kCapitalize: check_filter_args(a, {}, fn); return keep_markup(v, str_capitalize(py_str(v)));
      case Flt::kCenter: {
        check_filter_args(a, {"width"}, fn);
        const Value* w = arg_at(a, 0, "width");
        return keep_markup(v, pad(py_str(v), w ? need_int(w, "width") : 80, nullptr, 0));
      }
      case Flt::kDefault: {
        check_filter_args(a, {"default_value", "boolean"}, fn);
        const Value* dv = arg_at(a, 0, "default_value");
        const Value* boolean = arg_at(a, 1, "boolean");
        if (v.undef() || (boolean && truthy(*boolean) && !truthy(v))) return dv ? *dv : Value::str("");
        return v;
      }
      case Flt::kDictsort: {
        check_filter_args(a, {"case_sensitive", "by", "reverse"}, fn);
        if (v.undef()) fail_undefined(Value::undefined("'" + object_type_repr(v) + "' has no attribute 'items'"));
        if (v.t != VT::kDict) type_error("'" + type_name(v) + "' object has no attribute 'items'");
        const Value* cs = arg_at(a, 0, "case_sensitive");
        const Value* by = arg_at(a, 1, "by");
        const Value* rev = arg_at(a, 2, "reverse");
        size_t pos = 0;
        if (by) {
          const std::string& b = need_str(by, "by");
          if (b == "value")
            pos = 1;
          else if (b != "key")
            throw_error("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
        }
        const bool case_sensitive = cs && truthy(*cs);
        tick(v.d->items.size());
        std::vector<std::pair<Value, Value>> items = v.d->items;
        std::vector<Value> keys;
        for (const auto& kv : items) {
          const Value& k = pos == 0 ? kv.first : kv.second;
          keys.push_back(case_sensitive ? k : ignore_case(k));
        }
        std::vector<size_t> order(items.size());
        for (size_t k = 0; k < order.size(); ++k) order[k] = k;
        const bool reverse = rev && truthy(*rev);
        std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
          return reverse ? py_cmp(keys[y], keys[x], "<") == -1 : py_cmp(keys[x], keys[y], "<") == -1;
        });
        List out;
        for (size_t k : order) out.push_back(Value::list({items[k].first, items[k].second}, kFlagTuple));
        return Value::list(std::move(out));
      }
      case Flt::kEscape: check_filter_args(a, {}, fn); return v.is_markup() ? v : mk_markup(html_escape(py_str(v)));
      case Flt::kForceescape: check_filter_args(a, {}, fn); return mk_markup(html_escape(py_str(v)));
      case Flt::kFirst: {
        check_filter_args(a, {}, fn);
        if (v.is_str()) {
          if (v.str_ref().empty()) return Value::undefined("No first item, sequence was empty.");
          char32_t cp = 0;
          size_t n = unicode::decode_utf8(v.str_ref(), 0, cp);
          return Value::str(v.str_ref().substr(0, n ? n : 1));
        }
        if (v.t == VT::kList) {
          if (v.l->empty()) return Value::undefined("No first item, sequence was empty.");
          return (*v.l)[0];
        }
        if (v.t == VT::kDict) {
          if (v.d->items.empty()) return Value::undefined("No first item, sequence was empty.");
          return v.d->items[0].first;
        }
        if (v.undef()) return Value::undefined("No first item, sequence was empty.");
        type_error("'" + type_name(v) + "' object is not iterable");
      }
      case Flt::kLast: {
        check_filter_args(a, {}, fn);
        if (v.is_gen()) type_error("'generator' object is not reversible");
        if (v.is_str()) {
          std::u32string u = to_u32(v.str_ref());
          if (u.empty()) return Value::undefined("No last item, sequence was empty.");
          return Value::str(to_utf8(std::u32string(1, u.back())));
        }
        if (v.t == VT::kList) {
          if (v.l->empty()) return Value::undefined("No last item, sequence was empty.");
          return v.l->back();
        }
        if (v.t == VT::kDict) {
          if (v.d->items.empty()) return Value::undefined("No last item, sequence was empty.");
          return v.d->items.back().first;
        }
        if (v.undef()) return Value::undefined("No last item, sequence was empty.");
        type_error("'" + type_name(v) + "' object is not reversible");
      }
      case Flt::kFloat: {
        check_filter_args(a, {"default"}, fn);
        const Value* dflt = arg_at(a, 0, "default");
        if (v.undef()) fail_undefined(v);
        if (v.is_number()) return Value::real(v.as_double());
        if (v.is_str())
          if (auto x = parse_py_float(v.str_ref())) return Value::real(*x);
        return dflt ? *dflt : Value::real(0.0);
      }
      case Flt::kFormat: {
        if (!a.kw.empty()) {
          Dict d;
          for (const auto& kw : a.kw) d.set(Value::str(kw.first), kw.second);
          return keep_markup(v, percent_format(py_str(v), make_dict(std::move(d)), v.is_markup()));
        }
        return keep_markup(v, percent_format(py_str(v), Value::list(a.pos, kFlagTuple), v.is_markup()));
      }
      case Flt::kIndent: {
        check_filter_args(a, {"width", "first", "blank"}, fn);
        const Value* w = arg_at(a, 0, "width");
        const Value* first = arg_at(a, 1, "first");
        const Value* blank = arg_at(a, 2, "blank");
        std::string indention;
        if (w && w->is_str()) {
          indention = w->str_ref();
        } else {
          const int64_t n = w ? need_int(w, "width") : 4;
          if (n > 4096) throw_error("limit", "indent too wide");
          indention.assign(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
        }
        if (v.undef()) fail_undefined(v);  // jinja2 appends "\n" to it first
        if (!v.is_str()) type_error("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
        std::string s = py_str(v) + "\n";
        std::vector<std::string> lines = py_splitlines(s, false);
        std::string rv;
        if (blank && truthy(*blank)) {
          for (size_t k = 0; k < lines.size(); ++k) {
            if (k) rv += "\n" + indention;
            rv += lines[k];
            check_built(rv.size());
          }
        } else {
          rv = lines.empty() ? "" : lines[0];
          if (lines.size() > 1) {
            rv += "\n";
            for (size_t k = 1; k < lines.size(); ++k) {
              if (k > 1) rv += "\n";
              if (!lines[k].empty()) rv += indention;
              rv += lines[k];
              check_built(rv.size());
            }
          }
        }
        if (first && truthy(*first)) rv = indention + rv;
        return keep_markup(v, std::move(rv));
      }
      case Flt::kInt: {
        check_filter_args(a, {"default", "base"}, fn);
        const Value* dflt = arg_at(a, 0, "default");
        const Value* base = arg_at(a, 1, "base");
        if (v.undef()) fail_undefined(v);
        if (v.is_str()) {
          if (auto x = parse_py_int(v.str_ref(), base ? static_cast<int>(need_int(base, "base")) : 10))
            return Value::integer(*x);
          if (auto x = parse_py_float(v.str_ref())) {
            if (std::isfinite(*x) && std::fabs(*x) >= 9.2e18)
              throw_error("OverflowError", "integer beyond 64 bits (this renderer's ints)");
            if (std::isfinite(*x)) return Value::integer(static_cast<int64_t>(*x));
          }
        } else if (v.is_int_like()) {
          return Value::integer(v.as_int());
        } else if (v.t == VT::kFloat && std::isfinite(v.f)) {
          if (std::fabs(v.f) >= 9.2e18) throw_error("OverflowError", "integer beyond 64 bits (this renderer's ints)");
          return Value::integer(static_cast<int64_t>(v.f));
        }
        return dflt ? *dflt : Value::integer(0);
      }
      case Flt::kItems: {
        check_filter_args(a, {}, fn);
        if (v.undef()) return Value::list({}, kFlagGenerator);
        if (v.t != VT::kDict) type_error("Can only get item pairs from a mapping.");
        tick(v.d->items.size());
        List out;
        for (const auto& kv : v.d->items) out.push_back(Value::list({kv.first, kv.second}, kFlagTuple));
        return Value::list(std::move(out), kFlagGenerator);
      }
      case Flt::kJoin: {
        check_filter_args(a, {"d", "attribute"}, fn);
        const Value* d = arg_at(a, 0, "d");
        const Value* attribute = arg_at(a, 1, "attribute");
        const std::string sep = d ? py_str(*d) : std::string();
        std::string out;
        size_t k = 0;
        for (const auto& item : iterate(v)) {
          if (k++) out += sep;
          out += py_str(attribute ? attr_get(item, attribute, nullptr) : item);
          if (out.size() > lim_.max_output_bytes) work(out.size());
        }
        return mk_str(std::move(out));
      }
      case Flt::kLength: check_filter_args(a, {}, fn); return Value::integer(length(v));
      case Flt::kList: check_filter_args(a, {}, fn); return Value::list(iterate(v));
      case Flt::kLower: check_filter_args(a, {}, fn); return keep_markup(v, str_lower(py_str(v)));
      case Flt::kUpper: check_filter_args(a, {}, fn); return keep_markup(v, str_upper(py_str(v)));
      case Flt::kTitle: check_filter_args(a, {}, fn); return mk_str(filter_title(py_str(v)));
      case Flt::kMap: {
        List out;
        if (!truthy(v)) return Value::list({}, kFlagGenerator);  // jinja2: `if value:` before anything else
        if (a.pos.empty()) {
          const Value* attribute = arg_at(a, SIZE_MAX, "attribute");
          if (!attribute) throw_error("FilterArgumentError", "map requires a filter argument");
          const Value* dflt = arg_at(a, SIZE_MAX, "default");
          for (const auto& kw : a.kw)
            if (kw.first != "attribute" && kw.first != "default")
              throw_error("FilterArgumentError", "Unexpected keyword argument '" + kw.first + "'");
          for (const auto& item : iterate(v)) out.push_back(attr_get(item, attribute, dflt));
        } else {
          const std::string name = py_str(a.pos[0]);
          Args rest;
          rest.pos.assign(a.pos.begin() + 1, a.pos.end());
          rest.kw = a.kw;
          for (const auto& item : iterate(v)) out.push_back(run_filter_by_name(name, item, rest));
        }
        return Value::list(std::move(out), kFlagGenerator);
      }
      case Flt::kMax:
      case Flt::kMin: {
        check_filter_args(a, {"case_sensitive", "attribute"}, fn);
        const Value* cs = arg_at(a, 0, "case_sensitive");
        const Value* attribute = arg_at(a, 1, "attribute");
        List items = iterate(v);
        if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        const bool case_sensitive = cs && truthy(*cs);
        auto key = [&](const Value& x) {
          Value k = attr_get(x, attribute, nullptr);
          return case_sensitive ? k : ignore_case(k);
        };
        size_t best = 0;
        Value best_key = key(items[0]);
        for (size_t k = 1; k < items.size(); ++k) {
          Value kk = key(items[k]);
          const int c = py_cmp(kk, best_key, f == Flt::kMax ? ">" : "<");
          if ((f == Flt::kMax && c == 1) || (f == Flt::kMin && c == -1)) {
            best = k;
            best_key = kk;
          }
        }
        return items[best];
      }
      case Flt::kReject: return select_or_reject(v, a, false, false);
      case Flt::kRejectattr: return select_or_reject(v, a, false, true);
      case Flt::kSelect: return select_or_reject(v, a, true, false);
      case Flt::kSelectattr: return select_or_reject(v, a, true, true);
      case Flt::kReplace: {
        check_filter_args(a, {"old", "new", "count"}, fn);
        const Value* o = arg_at(a, 0, "old");
        const Value* n = arg_at(a, 1, "new");
        const Value* c = arg_at(a, 2, "count");
        if (!o || !n) type_error("do_replace() missing required argument");
        return mk_str(
            py_replace(py_str(v), py_str(*o), py_str(*n), (c && c->t != VT::kNone) ? need_int(c, "count") : -1));
      }
      case Flt::kReverse: {
        check_filter_args(a, {}, fn);
        if (v.is_str()) {
          std::u32string u = to_u32(v.str_ref());
          std::reverse(u.begin(), u.end());
          return mk_str(to_utf8(u));
        }
        List items = iterate(v);
        std::reverse(items.begin(), items.end());
        return Value::list(std::move(items), kFlagGenerator);
      }
      case Flt::kRound: {
        check_filter_args(a, {"precision", "method"}, fn);
        const Value* p = arg_at(a, 0, "precision");
        const Value* m = arg_at(a, 1, "method");
        const int64_t precision = p ? need_int(p, "precision") : 0;
        const std::string method = m ? need_str(m, "method") : std::string("common");
        if (method != "common" && method != "ceil" && method != "floor")
          throw_error("FilterArgumentError", "method must be common, ceil or floor");
        if (v.undef()) type_error("type Undefined doesn't define __round__ method");
        if (!v.is_number()) type_error("type " + type_name(v) + " doesn't define __round__ method");
        if (method == "common") {
          if (v.is_int_like()) {
            if (precision >= 0) return Value::integer(v.as_int());
            const double r = py_round(static_cast<double>(v.as_int()), precision);
            if (!(std::fabs(r) < 9223372036854775808.0))  // round(2**63 - 1, -1) is 2**63 + 2
              throw_error("OverflowError", "integer beyond 64 bits (this renderer's ints)");
            return Value::integer(static_cast<int64_t>(r));
          }
          return Value::real(py_round(v.f, precision));
        }
        const double scale = std::pow(10.0, static_cast<double>(precision));
        const double x = v.as_double() * scale;
        return Value::real((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
      }
      case Flt::kSafe: check_filter_args(a, {}, fn); return v.is_markup() ? v : mk_markup(py_str(v));
      case Flt::kSort: {
        check_filter_args(a, {"reverse", "case_sensitive", "attribute"}, fn);
        const Value* rev = arg_at(a, 0, "reverse");
        const Value* cs = arg_at(a, 1, "case_sensitive");
        const Value* attribute = arg_at(a, 2, "attribute");
        List items = iterate(v);
        const bool case_sensitive = cs && truthy(*cs);
        std::vector<Value> keys;
        for (const auto& x : items) {
          Value k = attr_get(x, attribute, nullptr);
          keys.push_back(case_sensitive ? k : ignore_case(k));
        }
        std::vector<size_t> order(items.size());
        for (size_t k = 0; k < order.size(); ++k) order[k] = k;
        const bool reverse = rev && truthy(*rev);
        std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
          return reverse ? py_cmp(keys[y], keys[x], "<") == -1 : py_cmp(keys[x], keys[y], "<") == -1;
        });
        List out;
        for (size_t k : order) out.push_back(items[k]);
        return Value::list(std::move(out));
      }
      case Flt::kString: check_filter_args(a, {}, fn); return v.is_str() ? v : mk_str(py_str(v));
      case Flt::kSum: {
        check_filter_args(a, {"attribute", "start"}, fn);
        const Value* attribute = arg_at(a, 0, "attribute");
        const Value* start = arg_at(a, 1, "start");
        Value acc = start ? *start : Value::integer(0);
        for (const auto& item : iterate(v)) acc = binop(BinOp::kAdd, acc, attr_get(item, attribute, nullptr));
        return acc;
      }
      case Flt::kTojson: {
        check_filter_args(a, {"ensure_ascii", "indent", "separators", "sort_keys"}, fn);
        const Value* ea = arg_at(a, 0, "ensure_ascii");
        const Value* ind = arg_at(a, 1, "indent");
        const Value* seps = arg_at(a, 2, "separators");
        const Value* sk = arg_at(a, 3, "sort_keys");
        JsonStyle st;
        st.ensure_ascii = ea && truthy(*ea);
        st.sort_keys = sk && truthy(*sk);
        if (ind && ind->t != VT::kNone) {
          st.pretty = true;
          if (ind->is_str()) {
            st.indent = ind->str_ref();
          } else {
            const int64_t n = need_int(ind, "indent");
            if (n > 4096) throw_error("limit", "indent too wide");
            st.indent.assign(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
          }
          st.item_sep = ",";
        }
        if (seps && seps->t != VT::kNone) {
          List sp = iterate(*seps);
          if (sp.size() != 2) value_error("too many values to unpack (expected 2)");
          st.item_sep = need_str(&sp[0], "separators");
          st.key_sep = need_str(&sp[1], "separators");
        }
        if (v.undef()) type_error("Object of type Undefined is not JSON serializable");
        std::string out;
        json_dump(out, v, st, 0);
        return mk_str(std::move(out));
      }
      case Flt::kTrim: {
        check_filter_args(a, {"chars"}, fn);
        return keep_markup(v, py_strip(py_str(v), arg_at(a, 0, "chars"), true, true));
      }
      case Flt::kUnique: {
        check_filter_args(a, {"case_sensitive", "attribute"}, fn);
        const Value* cs = arg_at(a, 0, "case_sensitive");
        const Value* attribute = arg_at(a, 1, "attribute");
        const bool case_sensitive = cs && truthy(*cs);
        List out, seen;
        for (const auto& item : iterate(v)) {
          Value k = attr_get(item, attribute, nullptr);
          if (!case_sensitive) k = ignore_case(k);
          check_hashable(k);
          bool dup = false;
          for (const auto& s : seen)
            if (py_eq(s, k)) {
              dup = true;
              break;
            }
          if (dup) continue;
          tick(seen.size() / 64 + 1);
          seen.push_back(k);
          out.push_back(item);
        }
        return Value::list(std::move(out), kFlagGenerator);
      }
      case Flt::kWordcount: {
        check_filter_args(a, {}, fn);
        int64_t n = 0;
        bool in_word = false;
        for (char32_t c : to_u32(py_str(v))) {
          const bool w = c == '_' || unicode::is_word_char(c);
          if (w && !in_word) ++n;
          in_word = w;
        }
        return Value::integer(n);
      }
      case Flt::kUnsupported: break;
    }
    throw_error("NotSupported", "the filter '" + fname + "' is not supported by this renderer");
  }

  // --- tests

  bool run_test(Tst t, const std::string& name, const Value& v, const Args& a) {
    const Value* arg = arg_at(a, 0, "");
    auto need_arg = [&]() -> const Value& {
      if (!arg) type_error("test '" + name + "' needs an argument");
      return *arg;
    };
    switch (t) {
      case Tst::kBoolean: return v.t == VT::kBool;
      case Tst::kCallable: return v.t == VT::kCallable || v.undef() || v.t == VT::kLoop;
      case Tst::kDefined: return !v.undef();
      case Tst::kUndefined: return v.undef();
      case Tst::kDivisibleby: {
        const Value r = binop(BinOp::kMod, v, need_arg());
        return !truthy(r);
      }
      case Tst::kEq: return py_eq(v, need_arg());
      case Tst::kNe: return !py_eq(v, need_arg());
      case Tst::kLt: return py_cmp(v, need_arg(), "<") == -1;
      case Tst::kLe: {
        const int c = py_cmp(v, need_arg(), "<=");
        return c == -1 || c == 0;
      }
      case Tst::kGt: return py_cmp(v, need_arg(), ">") == 1;
      case Tst::kGe: {
        const int c = py_cmp(v, need_arg(), ">=");
        return c == 1 || c == 0;
      }
      case Tst::kEscaped: return false;
      case Tst::kEven:
      case Tst::kOdd: {
        if (v.undef()) fail_undefined(v);
        Value r = binop(BinOp::kMod, v, Value::integer(2));
        return t == Tst::kEven ? !truthy(r) : py_eq(r, Value::integer(1));
      }
      case Tst::kFalse: return v.t == VT::kBool && !v.b;
      case Tst::kTrue: return v.t == VT::kBool && v.b;
      case Tst::kFilter: return v.is_str() && find_filter(v.str_ref()) >= 0;
      case Tst::kTest: return v.is_str() && find_test(v.str_ref()) >= 0;
      case Tst::kFloat: return v.t == VT::kFloat;
      case Tst::kInteger: return v.t == VT::kInt;
      case Tst::kNumber: return v.is_number();
      case Tst::kString: return v.is_str();
      case Tst::kMapping: return v.t == VT::kDict;
      case Tst::kNone: return v.t == VT::kNone;
      case Tst::kIn: return contains(need_arg(), v);
      case Tst::kIterable: return v.undef() || v.is_str() || v.is_list() || v.t == VT::kDict;
      case Tst::kSequence: return v.undef() || v.is_str() || v.is_seq() || v.t == VT::kDict;
      case Tst::kLower:
      case Tst::kUpper: {
        bool any_cased = false;
        for (char32_t c : to_u32(py_str(v))) {
          if (t == Tst::kLower ? is_upper_cp(c) : is_lower_cp(c)) return false;
          if (is_cased_cp(c)) any_cased = true;
        }
        return any_cased;
      }
      case Tst::kSameas: {
        const Value& o = need_arg();
        if (v.t != o.t) return false;
        switch (v.t) {
          case VT::kNone: return true;
          case VT::kBool: return v.b == o.b;
          case VT::kInt: return v.i == o.i;
          case VT::kFloat: return false;
          case VT::kStr: return v.s == o.s;
          case VT::kList: return v.l == o.l;
          case VT::kDict: return v.d == o.d;
          case VT::kNamespace: return v.ns == o.ns;
          default: return false;
        }
      }
    }
    return false;
  }

  // --- statements

  void assign(const Expr& target, const Value& value) {
    switch (target.k) {
      case EK::kName: cur_->set(target.name, value); return;
      case EK::kNsRef: {
        Value ns = lookup(target.a->name);
        if (ns.t != VT::kNamespace)
          throw_error("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
        ns.ns->set(target.name, value);
        return;
      }
      case EK::kTuple: {
        List items = iterate(value);
        const size_t n = target.items.size();
        if (items.size() < n)
          value_error("not enough values to unpack (expected " + std::to_string(n) + ", got " +
                      std::to_string(items.size()) + ")");
        if (items.size() > n) value_error("too many values to unpack (expected " + std::to_string(n) + ")");
        for (size_t k = 0; k < n; ++k) assign(*target.items[k], items[k]);
        return;
      }
      default: type_error("cannot assign to this expression");
    }
  }

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow f = exec_stmt(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec_stmt(const Stmt& s) {
    try {
      return exec_inner(s);
    } catch (JinjaError& err) {
      if (err.line == 0) err.line = s.line;
      throw;
    }
  }

  // Renders `body` into a string of its own, in the current scope.
  std::string capture(const Body& body) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    struct Restore {
      Renderer& r;
      std::string* out;
      ~Restore() { r.out_ = out; }
    } restore{*this, saved};
    exec(body);
    return buf;
  }

  // Applies a filter chain whose innermost value is null (filter blocks, `set x | f`) to `v`.
  Value apply_filter_chain(const Expr& chain, Value v) {
    if (chain.a) v = apply_filter_chain(*chain.a, std::move(v));
    return apply_filter(chain, std::move(v));
  }

  Flow exec_inner(const Stmt& s) {
    check_stack();
    switch (s.k) {
      case SK::kData: write(s.text); return Flow::kNormal;
      case SK::kOutput: {
        const Value v = eval(*s.expr);
        if (v.is_str())
          write(v.str_ref());
        else
          write(py_str(v));
        return Flow::kNormal;
      }
      case SK::kIf:
        for (const auto& br : s.branches)
          if (truthy(eval(*br.first))) return exec(br.second);
        return exec(s.else_body);
      case SK::kFor: return exec_for(s);
      case SK::kSet: assign(*s.target, eval(*s.expr)); return Flow::kNormal;
      case SK::kSetBlock: {
        Scope* saved = cur_;
        cur_ = new_scope(saved);
        std::string text;
        try {
          text = capture(s.body);
        } catch (...) {
          cur_ = saved;
          throw;
        }
        cur_ = saved;
        Value v = Value::str(std::move(text));
        if (s.filter) v = apply_filter_chain(*s.filter, std::move(v));
        assign(*s.target, v);
        return Flow::kNormal;
      }
      case SK::kMacro: {
        Callable c;
        c.k = Callable::K::kMacro;
        c.name = s.macro->name;
        c.macro = s.macro.get();
        c.closure = cur_;
        cur_->set(s.macro->name, make_callable(std::move(c)));
        return Flow::kNormal;
      }
      case SK::kCallBlock: {
        Callable c;
        c.k = Callable::K::kMacro;
        c.name = "caller";
        c.macro = s.macro.get();
        c.closure = cur_;
        const Expr& call_expr = *s.expr;
        Value f = eval(*call_expr.a);
        Args args = eval_args(call_expr);
        args.kw.emplace_back("caller", make_callable(std::move(c)));
        write(py_str(call(f, std::move(args))));
        return Flow::kNormal;
      }
      case SK::kFilterBlock: {
        Scope* saved = cur_;
        cur_ = new_scope(saved);
        std::string text;
        try {
          text = capture(s.body);
        } catch (...) {
          cur_ = saved;
          throw;
        }
        cur_ = saved;
        write(py_str(apply_filter_chain(*s.filter, Value::str(std::move(text)))));
        return Flow::kNormal;
      }
      case SK::kWith: {
        std::vector<Value> values;
        for (const auto& as : s.assigns) values.push_back(eval(*as.second));
        Scope* saved = cur_;
        cur_ = new_scope(saved);
        struct Restore {
          Renderer& r;
          Scope* scope;
          ~Restore() { r.cur_ = scope; }
        } restore{*this, saved};
        for (size_t k = 0; k < values.size(); ++k) assign(*s.assigns[k].first, values[k]);
        return exec(s.body);
      }
      case SK::kBreak: return Flow::kBreak;
      case SK::kContinue: return Flow::kContinue;
      case SK::kBlock: {
        Scope* saved = cur_;
        cur_ = new_scope(saved);
        struct Restore {
          Renderer& r;
          Scope* scope;
          ~Restore() { r.cur_ = scope; }
        } restore{*this, saved};
        exec(s.body);
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& s) {
    const Value seq = eval(*s.expr);
    std::shared_ptr<const List> items = iterate_shared(seq);
    Scope* saved = cur_;
    struct Restore {
      Renderer& r;
      Scope* scope;
      ~Restore() { r.cur_ = scope; }
    } restore{*this, saved};
    Scope* sc = new_scope(saved);
    cur_ = sc;
    if (s.cond) {
      List kept;
      for (const auto& item : *items) {
        sc->vars.clear();
        assign(*s.target, item);
        if (truthy(eval(*s.cond))) kept.push_back(item);
      }
      items = std::make_shared<const List>(std::move(kept));
    }
    if (items->empty()) {
      sc->vars.clear();
      exec(s.else_body);
      return Flow::kNormal;
    }
    const int64_t n = static_cast<int64_t>(items->size());
    for (int64_t k = 0; k < n; ++k) {
      sc->vars.clear();
      auto info = std::make_shared<LoopInfo>();
      info->items = items;
      info->index0 = k;
      info->length = n;
      Value loop;
      loop.t = VT::kLoop;
      loop.loop = std::move(info);
      sc->set("loop", std::move(loop));
      assign(*s.target, (*items)[static_cast<size_t>(k)]);
      const Flow f = exec(s.body);
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }
};

// ------------------------------------------------------------------------------------------------------------------
// JSON variables → values.

template <typename Json>
Value from_json(const Json& j, int depth) {
  if (depth > kMaxValueDepth) throw_error("limit", "the variables nest more than 512 deep");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX))
        throw_error("OverflowError", "an integer in the variables exceeds 64 bits");
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value::real(j.template get<double>());
    case nlohmann::json::value_t::string: return Value::str(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.set(Value::str(it.key()), from_json(it.value(), depth + 1));
      return make_dict(std::move(d));
    }
    case nlohmann::json::value_t::binary: throw_error("TypeError", "binary JSON values are not supported");
  }
  return Value::none();
}

}  // namespace

// ------------------------------------------------------------------------------------------------------------------
// ChatTemplate.

struct ChatTemplate::Impl {
  std::string source;
  ChatTemplateLimits limits;
  Body body;
};

namespace {

std::shared_ptr<const ChatTemplate::Impl> compile(std::string source, const ChatTemplateLimits& limits) {
  auto impl = std::make_shared<ChatTemplate::Impl>();
  impl->limits = limits;
  impl->source = std::move(source);
  const size_t bad = unicode::find_invalid_utf8(impl->source);
  check(bad == std::string_view::npos, ErrorCode::kInvalidArgument, kOp,
        "a template must be valid UTF-8; got an invalid byte at offset ", bad);
  // jinja2 normalizes newlines (\r\n and \r to \n) and drops one trailing newline (keep_trailing_newline=False).
  std::string text;
  text.reserve(impl->source.size());
  for (size_t k = 0; k < impl->source.size(); ++k) {
    const char c = impl->source[k];
    if (c == '\r') {
      text += '\n';
      if (k + 1 < impl->source.size() && impl->source[k + 1] == '\n') ++k;
    } else {
      text += c;
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  try {
    Lexer lexer(text, limits.max_nesting);
    Parser parser(lexer.run(), limits.max_nesting);
    impl->body = parser.parse();
    check_names(impl->body, false);
  } catch (const SyntaxError& e) {
    fail(ErrorCode::kInvalidArgument, kOp, "template syntax error at line ", e.line, ", column ", e.col, ": ",
         e.message);
  } catch (const std::bad_alloc&) {
    fail(ErrorCode::kOutOfMemory, kOp, "out of memory parsing a template of ", impl->source.size(), " bytes");
  }
  return impl;
}

template <typename Json>
std::string render_impl(const ChatTemplate::Impl& impl, const Json& variables) {
  check(variables.is_object() || variables.is_null(), ErrorCode::kInvalidArgument, kOp,
        "the variables must be a JSON object; got a ", variables.type_name());
  try {
    Dict vars;
    if (variables.is_object())
      for (auto it = variables.begin(); it != variables.end(); ++it)
        vars.set(Value::str(it.key()), from_json(it.value(), 1));
    Renderer renderer(impl.limits, impl.body, vars);
    return renderer.run();
  } catch (const JinjaError& e) {
    std::string where = e.line > 0 ? "line " + std::to_string(e.line) + ": " : std::string();
    if (e.kind == "raise_exception")
      fail(ErrorCode::kInvalidArgument, kOp, where, "the template raised an exception: ", e.message);
    fail(ErrorCode::kInvalidArgument, kOp, where, e.kind, ": ", e.message);
  } catch (const std::bad_alloc&) {
    fail(ErrorCode::kOutOfMemory, kOp, "out of memory while rendering");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // not expected: a bug here, reported instead of escaping as another type
    fail(ErrorCode::kInternal, kOp, "internal error while rendering: ", e.what());
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source) : ChatTemplate(std::move(source), ChatTemplateLimits{}) {}
ChatTemplate::ChatTemplate(std::string source, ChatTemplateLimits limits) : impl_(compile(std::move(source), limits)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(const ChatTemplate&) = default;
ChatTemplate& ChatTemplate::operator=(const ChatTemplate&) = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::json& variables) const { return render_impl(*impl_, variables); }
std::string ChatTemplate::render(const nlohmann::ordered_json& variables) const {
  return render_impl(*impl_, variables);
}
const std::string& ChatTemplate::source() const { return impl_->source; }
const ChatTemplateLimits& ChatTemplate::limits() const { return impl_->limits; }

}  // namespace cider::model
