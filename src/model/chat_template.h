// cider/model/chat_template.h — a chat-template renderer: the subset of Jinja2 that models' prompt templates use
// (the `chat_template` of tokenizer_config.json, or the GGUF key `tokenizer.chat_template`), interpreted from scratch
// so that render() writes byte for byte what transformers' apply_chat_template writes with Python's jinja2, which is
//   jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//                                                 extensions=[loopcontrols, transformers' {% generation %}])
// with the globals raise_exception(message) and strftime_now(format) and transformers' `tojson` filter
// (json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)).
//
// What is there (see tests/test_chat_template.cpp and the fixtures in tests/data/chat_templates/, which are checked
// against jinja2 by tools/chat_templates/make_expected.py):
//   statements  if/elif/else, for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/
//               length/depth/previtem/nextitem/cycle), break/continue, set (expression, tuple, namespace attribute,
//               block with filters), macro and call blocks, filter blocks, with, raw, generation, comments,
//               whitespace control (-, +) with trim_blocks and lstrip_blocks exactly as jinja2's lexer does them
//   expressions literals, names, .attr and [item] (negative indexes, slices), + - * / // % ** ~, comparisons
//               (chained), in / not in, and/or/not, `is` tests, conditional expressions, filters, calls
//   values      Python's: None/True/False, 64-bit ints, floats (printed as Python's repr), str (code points for
//               len, indexes and slices), lists, tuples, dicts (insertion order), dict views, jinja2's default
//               Undefined (prints empty, falsy; attribute of it fails), namespace(), generators of select/map/...
//               (truthy, no length), markupsafe's Markup from |safe and |escape (`+` with it escapes the other side)
//   filters     abs attr capitalize center count d default dictsort e escape first float forceescape format indent
//               int items join last length list lower map max min reject rejectattr replace reverse round safe
//               select selectattr sort string sum title tojson trim unique upper wordcount
//   tests       boolean callable defined divisibleby eq equalto escaped even false filter float ge greaterthan gt in
//               integer iterable le lessthan lower lt mapping ne none number odd sameas sequence string test true
//               undefined upper (and ==, !=, <, <=, >, >=)
//   methods     of str: capitalize center count endswith find format index isalnum isalpha isdigit islower isspace
//               isupper join ljust lower lstrip partition removeprefix removesuffix replace rfind rindex rjust
//               rpartition rsplit rstrip split splitlines startswith strip swapcase title upper zfill; of dict: get
//               items keys values copy; of list: count index copy. The sandbox's refusals are kept: list.append,
//               dict.update and the like fail as jinja2's ImmutableSandboxedEnvironment makes them fail.
//   globals     raise_exception, strftime_now (local time, as datetime.now().strftime), range, dict, namespace
// Not there (cider::Error when a template reaches them): include/extends/import/block, recursive loops,
// loop.changed, *args/**kwargs in calls, str.format specs ({:>8}), \N{name} escapes, non-ASCII identifiers, the
// filters batch, filesizeformat, groupby, pprint, random, slice, striptags, truncate, urlencode, urlize, wordwrap,
// xmlattr, and the globals lipsum, cycler, joiner. Known differences: integers beyond 64 bits fail instead of
// growing; str upper/lower/title map ASCII, Latin-1, Latin Extended-A/Additional, Greek (final sigma included),
// Cyrillic and Armenian letters, not the rest of Unicode's case tables; a generator is not used up by iterating it
// (jinja2's is, once); jinja2's compile-time folding of constants is not reproduced (a literal sliced that is not a
// sequence, `(1)[1:]`, fails here; jinja2 may fold it into an Undefined).
//
// Variables are JSON. Key order matters for output (`tool|tojson` writes the keys in the order the dict has them, as
// json.dumps does), so a caller that parses a request should parse it into nlohmann::ordered_json and use that
// overload; an nlohmann::json (std::map) hands its keys over sorted.
//
// Thread safety: a ChatTemplate is immutable after construction; render() may run concurrently from many threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace cider::model {

// Bounds on one render, so that a hostile template or input fails with cider::Error instead of exhausting memory,
// stack or time.
struct ChatTemplateLimits {
  size_t max_output_bytes = size_t{16} << 20;      // the rendered text, and any one string built while rendering
  int64_t max_loop_iterations = 100000;            // items iterated over the whole render (loops, filters, ranges,
                                                   // the items of lists and dicts compared by ==, <, `in`)
  int max_call_depth = 64;                         // nested macro calls (recursion)
  size_t max_string_work_bytes = size_t{1} << 30;  // bytes of all strings built (or decoded, indexed, searched)
                                                   // while rendering, added up
  int max_nesting = 64;                            // nested statements and nested expression brackets (parsing)
  size_t max_stack_bytes = size_t{1} << 20;        // the evaluator's own stack use (deep macro recursion over
                                                   // deep statements), checked as it descends
};

class ChatTemplate {
 public:
  // Parses once; cider::Error (kInvalidArgument, op "chat_template") for a syntax error, naming line and column, or
  // for a filter or test jinja2 does not know (outside an `if`, as jinja2 rejects those when compiling).
  explicit ChatTemplate(std::string source);
  ChatTemplate(std::string source, ChatTemplateLimits limits);
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&);
  ChatTemplate& operator=(const ChatTemplate&);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with these variables (messages, add_generation_prompt, bos_token, eos_token, tools, ...: the members of
  // a JSON object; null means none). cider::Error (kInvalidArgument, op "chat_template") for raise_exception (its
  // message), an undefined value used where jinja2 fails on it, an unknown filter/test/method, a type error, or a
  // limit exceeded, naming the template line and carrying jinja2's message for the same failure:
  //   [chat_template] line 7: the template raised an exception: Conversation roles must alternate user/assistant/...
  //   [chat_template] line 3: UndefinedError: 'dict object' has no attribute 'content'
  //   [chat_template] line 9: limit: more than 100000 loop iterations and sequence items in one render
  // (kOutOfMemory if an allocation fails). A moved-from ChatTemplate can only be assigned to or destroyed.
  std::string render(const nlohmann::json& variables) const;
  std::string render(const nlohmann::ordered_json& variables) const;

  const std::string& source() const;
  const ChatTemplateLimits& limits() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace cider::model
