// ChatTemplate (model/chat_template.h), the Jinja2-subset renderer for models' chat templates.
//
// The fixtures are the point: tests/data/chat_templates/templates/ holds real models' templates (Llama 3/3.1/3.2,
// Qwen2.5, Qwen3, Gemma 2/3, Mistral v0.3 and Nemo, DeepSeek-R1-Distill, Phi-3.5, SmolLM2, Hermes 3) and hand-written
// ones that exercise each construct; expected/<name>.json has, for each case, the variables and what Python's jinja2
// rendered in transformers' environment (tools/chat_templates/make_expected.py), or the exception it raised. Every case
// must come out byte for byte the same here, and every error must carry jinja2's message.
//
// Then the contract's other half: syntax errors name line and column, unknown filters and tests fail as jinja2 makes
// them fail, raise_exception's message reaches the caller, and the limits stop hostile templates (loop, output, string
// growth, recursion, nesting) with cider::Error instead of a crash, a hang or an exhausted machine.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/test_support.h"

namespace cider::model {
namespace {

using cider::test::throws_code;
using nlohmann::ordered_json;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string fixture_dir() { return cider::test::repo_file("tests/data/chat_templates"); }

// Where two texts first differ, with some context, for a readable failure.
std::string describe_diff(const std::string& got, const std::string& want) {
  size_t k = 0;
  while (k < got.size() && k < want.size() && got[k] == want[k]) ++k;
  const size_t from = k > 40 ? k - 40 : 0;
  std::ostringstream out;
  out << "first difference at byte " << k << " (got " << got.size() << " bytes, want " << want.size() << ")\n"
      << "  got:  " << ordered_json(got.substr(from, 100)).dump(-1, ' ', false, ordered_json::error_handler_t::replace)
      << "\n  want: "
      << ordered_json(want.substr(from, 100)).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  return out.str();
}

// The template files that have expected outputs (each expected/<stem>.json names its template).
const std::vector<std::string> kFixtures = {
    // real models' templates
    "command-r-plus-tool_use", "deepseek-r1-distill-qwen", "functionary-medium-v3.1", "gemma2-it", "gemma3-it",
    "hermes3-llama3.1-tool_use", "llama3-instruct", "llama3.1-instruct", "llama3.2-instruct",
    "mistral-7b-instruct-v0.3", "mistral-nemo-instruct-2407", "phi3.5-mini-instruct", "qwen2.5-instruct", "qwen3",
    "smollm2-instruct", "smollm3",
    // hand-written, one group of constructs each
    "t_errors", "t_expressions", "t_filters_seq", "t_filters_str", "t_generation", "t_loops", "t_macros", "t_markup",
    "t_methods", "t_scoping", "t_tests", "t_tojson", "t_undefined", "t_whitespace", "t_whitespace_crlf"};

class Jinja2Fixture : public ::testing::TestWithParam<std::string> {};

TEST_P(Jinja2Fixture, RendersWhatJinja2Renders) {
  const ordered_json doc = ordered_json::parse(slurp(fixture_dir() + "/expected/" + GetParam() + ".json"));
  const std::string name = doc.at("template").get<std::string>();
  const ChatTemplate tpl(slurp(fixture_dir() + "/templates/" + name));
  size_t rendered = 0, failed_as_expected = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string case_name = c.at("name").get<std::string>();
    SCOPED_TRACE(name + " / " + case_name);
    const ordered_json& vars = c.at("variables");
    if (c.contains("expected")) {
      const std::string want = c.at("expected").get<std::string>();
      std::string got;
      try {
        got = tpl.render(vars);
      } catch (const Error& e) {
        ADD_FAILURE() << "jinja2 rendered this case; ChatTemplate failed: " << e.what();
        continue;
      }
      EXPECT_TRUE(got == want) << describe_diff(got, want);
      ++rendered;
    } else {
      const std::string message = c.at("error").get<std::string>();
      EXPECT_TRUE(throws_code([&] { (void)tpl.render(vars); }, ErrorCode::kInvalidArgument, message))
          << "jinja2 raised " << c.at("error_type").get<std::string>() << ": " << message;
      ++failed_as_expected;
    }
  }
  EXPECT_GT(rendered + failed_as_expected, 0u);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Jinja2Fixture, ::testing::ValuesIn(kFixtures),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// Every expected file is in kFixtures (so a new fixture cannot be silently skipped), and every template has one.
TEST(ChatTemplateFixtures, EveryFileIsChecked) {
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(fixture_dir() + "/expected"))
    if (e.path().extension() == ".json") found.push_back(e.path().stem().string());
  std::sort(found.begin(), found.end());
  std::vector<std::string> listed = kFixtures;
  std::sort(listed.begin(), listed.end());
  EXPECT_EQ(found, listed);
  size_t templates = 0;
  for (const auto& e : std::filesystem::directory_iterator(fixture_dir() + "/templates")) {
    ++templates;
    EXPECT_TRUE(std::filesystem::exists(fixture_dir() + "/expected/" + e.path().stem().string() + ".json"))
        << e.path() << " has no expected outputs";
  }
  EXPECT_EQ(templates, kFixtures.size());
}

// --- errors

std::string error_of(const std::string& source, const ordered_json& vars = ordered_json::object()) {
  try {
    ChatTemplate t(source);
    (void)t.render(vars);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

TEST(ChatTemplateErrors, SyntaxErrorNamesLineAndColumn) {
  const std::string msg = error_of("Hello\n{% if x %}\n  {{ x + }}\n{% endif %}");
  EXPECT_NE(msg.find("[chat_template]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line 3, column 10"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unexpected 'end of print statement'"), std::string::npos) << msg;

  const std::string eof = error_of("{% for m in messages %}\n{{ m.content }}\n");
  EXPECT_NE(eof.find("Unexpected end of template"), std::string::npos) << eof;
  EXPECT_NE(eof.find("'endfor' or 'else'"), std::string::npos) << eof;

  const std::string tag = error_of("ok\n\n   {% frobnicate %}");
  EXPECT_NE(tag.find("line 3, column 7"), std::string::npos) << tag;
  EXPECT_NE(tag.find("Encountered unknown tag 'frobnicate'."), std::string::npos) << tag;

  EXPECT_NE(error_of("{{ 'unterminated }}").find("line 1"), std::string::npos);
  EXPECT_NE(error_of("{# never closed").find("Missing end of comment tag"), std::string::npos);
  EXPECT_NE(error_of("{{ (1, 2 }}").find("unexpected '}', expected ')'"), std::string::npos);
  EXPECT_NE(error_of("{{ x y }}").find("expected token 'end of print statement', got 'y'"), std::string::npos);
  EXPECT_NE(error_of("{% if %}{% endif %}").find("Expected an expression, got 'end of statement block'"),
            std::string::npos);
  EXPECT_NE(error_of("{% set 1 = 2 %}").find("can't assign"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").find("outside of a loop"), std::string::npos);
  EXPECT_NE(error_of("{% include 'x.jinja' %}").find("not supported"), std::string::npos);
}

TEST(ChatTemplateErrors, UnknownFilterOrTest) {
  // Outside an `if`, jinja2 rejects it when compiling: so does the constructor.
  EXPECT_TRUE(throws_code([] { ChatTemplate t("{{ messages|frobnicate }}"); }, ErrorCode::kInvalidArgument,
                          "No filter named 'frobnicate'."));
  EXPECT_TRUE(throws_code([] { ChatTemplate t("{% for m in messages %}{{ m is frob }}{% endfor %}"); },
                          ErrorCode::kInvalidArgument, "No test named 'frob'."));
  // Inside one, only reaching it fails (jinja2's runtime message).
  const ChatTemplate t("{% if x %}{{ x|frobnicate }}{% endif %}ok");
  EXPECT_EQ(t.render(ordered_json{{"x", 0}}), "ok");
  EXPECT_TRUE(throws_code(
      [&] {
        (void)t.render(ordered_json{{"x", 1}});
      },
      ErrorCode::kInvalidArgument, "No filter named 'frobnicate' found."));
  // A jinja2 filter this renderer leaves out fails when reached, naming it.
  const ChatTemplate g("{% if x %}{{ x|groupby('a') }}{% endif %}");
  EXPECT_TRUE(throws_code(
      [&] {
        (void)g.render(ordered_json{{"x", {1}}});
      },
      ErrorCode::kInvalidArgument, "the filter 'groupby' is not supported"));
}

TEST(ChatTemplateErrors, UnknownMethodAndUndefined) {
  EXPECT_NE(error_of("{{ 'abc'.frobnicate() }}").find("'str object' has no attribute 'frobnicate'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc'.expandtabs() }}").find("str.expandtabs() is not supported"), std::string::npos);
  const std::string undef =
      error_of("line one\n{{ messages[0].content.strip() }}", ordered_json{{"messages", ordered_json::array()}});
  EXPECT_NE(undef.find("line 2"), std::string::npos) << undef;
  EXPECT_NE(undef.find("UndefinedError: list object has no element 0"), std::string::npos) << undef;
  EXPECT_NE(error_of("{{ messages.append(1) }}", ordered_json{{"messages", {1}}})
                .find("access to attribute 'append' of 'list' object is unsafe."),
            std::string::npos);
}

TEST(ChatTemplateErrors, RaiseExceptionCarriesItsMessage) {
  const ChatTemplate t(
      "{% for m in messages %}\n"
      "{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('Unsupported role: ' ~ m.role) }}{% endif %}\n"
      "{% endfor %}");
  const ordered_json vars = {{"messages", {{{"role", "user"}}, {{"role", "narrator"}}}}};
  try {
    (void)t.render(vars);
    FAIL() << "did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("[chat_template]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Unsupported role: narrator"), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
  }
}

TEST(ChatTemplateErrors, VariablesMustBeAnObject) {
  const ChatTemplate t("x");
  EXPECT_EQ(t.render(ordered_json()), "x");
  EXPECT_TRUE(throws_code([&] { (void)t.render(ordered_json::array()); }, ErrorCode::kInvalidArgument,
                          "the variables must be a JSON object"));
  EXPECT_TRUE(
      throws_code([] { ChatTemplate bad(std::string("ok \xC3\x28")); }, ErrorCode::kInvalidArgument, "valid UTF-8"));
}

// --- limits

TEST(ChatTemplateLimits, LoopIterations) {
  ChatTemplateLimits lim;
  lim.max_loop_iterations = 10;
  const ChatTemplate t("{% for x in xs %}{{ x }}{% endfor %}", lim);
  EXPECT_EQ(t.render(ordered_json{{"xs", {1, 2, 3, 4, 5, 6, 7, 8, 9, 0}}}), "1234567890");
  EXPECT_TRUE(throws_code(
      [&] {
        (void)t.render(ordered_json{{"xs", ordered_json(std::vector<int>(11, 1))}});
      },
      ErrorCode::kInvalidArgument, "loop iterations"));
  // The default cap stops nested loops that would run 10^10 times, quickly.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}")
                .find("loop iterations"),
            std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(error_of("{{ range(10000000)|list|length }}").find("Range too big"), std::string::npos);
}

TEST(ChatTemplateLimits, OutputAndStringGrowth) {
  ChatTemplateLimits lim;
  lim.max_output_bytes = 1000;
  const ChatTemplate t("{% for i in range(n) %}0123456789{% endfor %}", lim);
  EXPECT_EQ(t.render(ordered_json{{"n", 100}}).size(), 1000u);
  EXPECT_TRUE(throws_code(
      [&] {
        (void)t.render(ordered_json{{"n", 101}});
      },
      ErrorCode::kInvalidArgument, "would exceed 1000 bytes"));
  // Doubling a string in a namespace: stopped by the size of one string, not by memory running out.
  EXPECT_NE(error_of("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}{{ ns.s|length }}")
                .find("exceeds the limit"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'abc' * 1000000000 }}").find("limit"), std::string::npos);
  EXPECT_NE(error_of("{{ [1, 2] * 1000000000 }}").find("limit"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x'|center(1000000000) }}").find("limit"), std::string::npos);
}

TEST(ChatTemplateLimits, RecursionAndNesting) {
  // Unbounded recursion stops at the call depth (or, where frames are large as under ASan, at the stack budget).
  const std::string rec = error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_TRUE(rec.find("macro calls nested deeper than 64") != std::string::npos ||
              rec.find("stack budget exceeded") != std::string::npos)
      << rec;
  ChatTemplateLimits shallow;
  shallow.max_call_depth = 3;
  const ChatTemplate t3("{% macro f(n) %}{{ n }}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(k) }}",
                        shallow);
  EXPECT_EQ(t3.render(ordered_json{{"k", 2}}), "210");
  EXPECT_TRUE(throws_code(
      [&] {
        (void)t3.render(ordered_json{{"k", 3}});
      },
      ErrorCode::kInvalidArgument, "macro calls nested deeper than 3"));
  // Deep brackets and deep statement nesting fail to parse instead of overflowing the stack.
  EXPECT_NE(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").find("syntax error"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}").find("syntax error"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(50000, '-') + "1 }}").find("syntax error"), std::string::npos);
  std::string nested;
  for (int k = 0; k < 5000; ++k) nested += "{% if true %}";
  EXPECT_NE(error_of(nested).find("syntax error"), std::string::npos);
  // A value nested deeper than the renderer follows (built by the template) fails when printed.
  EXPECT_NE(error_of("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}"
                     "{{ ns.v }}")
                .find("nested more than"),
            std::string::npos);
  // Namespaces that hold themselves, or chains of 100000 of them, are freed without recursion (and without a leak:
  // LeakSanitizer checks this in the ASan build).
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me.me is defined }}"), "");
  const ChatTemplate chain(
      "{% set ns = namespace(v=none) %}{% for i in range(90000) %}{% set ns.v = namespace(v=ns.v) %}{% endfor %}"
      "{{ ns.v.v.v is defined }}");
  EXPECT_EQ(chain.render(ordered_json::object()), "True");
  // So do variables nested past that depth.
  std::string deep = std::string(10000, '[') + std::string(10000, ']');
  const ChatTemplate t("{{ x|length }}");
  EXPECT_TRUE(throws_code(
      [&] {
        (void)t.render(ordered_json{{"x", ordered_json::parse(deep)}});
      },
      ErrorCode::kInvalidArgument, "nest more than"));
}

// Random templates built from template fragments: each one parses or fails with cider::Error, and renders or fails
// with cider::Error — never anything else (run under ASan/UBSan in build-asan for memory errors).
TEST(ChatTemplateLimits, RandomTemplatesNeverCrash) {
  static const char* const kPieces[] = {"{{",
                                        "}}",
                                        "{%",
                                        "%}",
                                        "{#",
                                        "#}",
                                        "{%-",
                                        "-%}",
                                        "{{-",
                                        "-}}",
                                        " if ",
                                        " for ",
                                        " in ",
                                        " endif ",
                                        " endfor ",
                                        " else ",
                                        " set ",
                                        " = ",
                                        " macro ",
                                        " endmacro ",
                                        " x ",
                                        " messages ",
                                        " m ",
                                        ".",
                                        "[",
                                        "]",
                                        "(",
                                        ")",
                                        "{",
                                        "}",
                                        "|",
                                        " trim ",
                                        " tojson ",
                                        " join ",
                                        " length ",
                                        " is ",
                                        " not ",
                                        " defined ",
                                        " and ",
                                        " or ",
                                        "'s'",
                                        "\"q\"",
                                        "1",
                                        "0",
                                        "-1",
                                        "2.5",
                                        ":",
                                        ",",
                                        "~",
                                        "+",
                                        "*",
                                        "/",
                                        "//",
                                        "%",
                                        "**",
                                        "==",
                                        "<",
                                        " loop.index ",
                                        " namespace(a=1) ",
                                        " ns.a ",
                                        " range(3) ",
                                        " raise_exception('r') ",
                                        "\n",
                                        "  ",
                                        "text",
                                        " none ",
                                        " true ",
                                        " content ",
                                        " role ",
                                        " items() ",
                                        " selectattr('role') ",
                                        " map(attribute='x') ",
                                        " break ",
                                        " raw ",
                                        " endraw ",
                                        " call ",
                                        " filter ",
                                        " upper ",
                                        " endfilter ",
                                        " with ",
                                        " endwith ",
                                        " caller() "};
  auto rng = cider::test::make_rng(0xC4A7);
  const ordered_json vars = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", 1}}}},
      {"x", {{"a", {1, 2}}}},
      {"m", "str"}};
  ChatTemplateLimits lim;
  lim.max_loop_iterations = 2000;
  lim.max_output_bytes = 1 << 16;
  size_t parsed = 0, rendered = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string src;
    const int n = static_cast<int>(rng() % 24) + 1;
    for (int k = 0; k < n; ++k) src += kPieces[rng() % (sizeof(kPieces) / sizeof(kPieces[0]))];
    try {
      ChatTemplate t(src, lim);
      ++parsed;
      (void)t.render(vars);
      ++rendered;
    } catch (const Error&) {
    }
  }
  EXPECT_GT(parsed, 10u);
  EXPECT_GT(rendered, 5u);
}

// --- behaviour the fixtures cannot pin down

TEST(ChatTemplateBehaviour, KeyOrderFollowsTheJsonType) {
  const ChatTemplate t("{{ d|tojson }} {% for k in d %}{{ k }}{% endfor %}");
  EXPECT_EQ(t.render(ordered_json::parse(R"({"d": {"b": 1, "a": 2}})")), "{\"b\": 1, \"a\": 2} ba");
  EXPECT_EQ(t.render(nlohmann::json::parse(R"({"d": {"b": 1, "a": 2}})")), "{\"a\": 2, \"b\": 1} ab");
}

TEST(ChatTemplateBehaviour, StrftimeNowIsLocalTime) {
  const ChatTemplate t("{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('') }}|");
  std::time_t now = std::time(nullptr);
  std::tm tm_local{};
  localtime_r(&now, &tm_local);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d", &tm_local);
  const std::string got = t.render(ordered_json::object());
  // (a render straddling midnight may see the next day)
  EXPECT_EQ(got.size(), std::string(buf).size() + 2) << got;
  EXPECT_EQ(got.substr(0, 4), std::string(buf).substr(0, 4)) << got;
}

TEST(ChatTemplateBehaviour, ConcurrentRendersAgree) {
  const ChatTemplate t(slurp(fixture_dir() + "/templates/qwen3.jinja"));
  const ordered_json vars = {
      {"messages", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "U"}}}},
      {"add_generation_prompt", true}};
  const std::string want = t.render(vars);
  std::vector<std::string> got(8);
  std::vector<std::thread> threads;
  for (size_t k = 0; k < got.size(); ++k)
    threads.emplace_back([&, k] {
      for (int r = 0; r < 50; ++r) got[k] = t.render(vars);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
  EXPECT_EQ(want, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateBehaviour, CopiesShareTheParsedTemplate) {
  ChatTemplate a("{{ x }}!");
  ChatTemplate b = a;
  ChatTemplate c(std::move(a));
  EXPECT_EQ(b.render(ordered_json{{"x", 1}}), "1!");
  EXPECT_EQ(c.render(ordered_json{{"x", "y"}}), "y!");
  EXPECT_EQ(b.source(), "{{ x }}!");
  EXPECT_EQ(b.limits().max_loop_iterations, ChatTemplateLimits{}.max_loop_iterations);
}

}  // namespace
}  // namespace cider::model
