// Tool calls (runtime/tool_calls.h, the OpenAI API's `tools` in runtime/openai_api.h): the format each real chat
// template asks for, the reply split into content and calls in each format (whole and streamed in pieces that cut
// the markers anywhere), and the API: tools rendered by the template, the calls in message.tool_calls and in a
// streamed delta, the refusals naming the rule.
#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "model/json_prefix.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/openai_api.h"
#include "runtime/tool_calls.h"
#include "support/json_schema_check.h"
#include "support/test_support.h"

namespace rt = cider::runtime;
namespace cm = cider::model;
using json = nlohmann::json;

namespace {

std::string read_template(const std::string& stem) {
  std::ifstream f(cider::test::repo_file("tests/data/chat_templates/templates/" + stem + ".jinja"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const cm::Model& tiny() {
  static const auto m = cm::Model::load(cider::test::repo_file("models/cider-tiny"), cm::ModelOptions{});
  return *m;
}

// The reply fed to a stream in pieces of `step` bytes: the content it sent as it went and what finish() held.
rt::ParsedReply streamed(rt::ToolCallFormat f, const std::string& text, size_t step, std::string& sent) {
  rt::ToolCallStream s(f);
  sent.clear();
  for (size_t i = 0; i < text.size(); i += step) sent += s.feed(text.substr(i, step));
  return s.finish();
}

}  // namespace

TEST(ToolCalls, FormatsOfTheRealTemplates) {
  const std::vector<std::pair<std::string, rt::ToolCallFormat>> want = {
      {"qwen2.5-instruct", rt::ToolCallFormat::kHermes},
      {"qwen3", rt::ToolCallFormat::kHermes},
      {"hermes3-llama3.1-tool_use", rt::ToolCallFormat::kHermes},
      {"mistral-7b-instruct-v0.3", rt::ToolCallFormat::kMistral},
      {"mistral-nemo-instruct-2407", rt::ToolCallFormat::kMistral},
      {"llama3.1-instruct", rt::ToolCallFormat::kLlama3},
      {"llama3.2-instruct", rt::ToolCallFormat::kLlama3},
      {"functionary-medium-v3.1", rt::ToolCallFormat::kUnknown},
      {"command-r-plus-tool_use", rt::ToolCallFormat::kUnknown},
      {"gemma3-it", rt::ToolCallFormat::kNone},
      {"smollm2-instruct", rt::ToolCallFormat::kNone},
  };
  for (const auto& [stem, f] : want)
    EXPECT_EQ(rt::detect_tool_call_format(read_template(stem)), f)
        << stem << ": " << rt::tool_call_format_name(rt::detect_tool_call_format(read_template(stem)));
}

TEST(ToolCalls, RepliesSplitIntoContentAndCalls) {
  using F = rt::ToolCallFormat;
  struct Case {
    F format;
    std::string text;
    std::string content;
    std::vector<std::pair<std::string, json>> calls;  // name, arguments (parsed back)
  };
  const std::vector<Case> cases = {
      {F::kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>",
       "Let me check.",
       {{"get_weather", {{"city", "Paris"}, {"unit", "c"}}}, {"get_time", {{"tz", "CET"}}}}},
      {F::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a } ] \\\" <tool_call>\"}}", "",
       {{"f", {{"s", "a } ] \" <tool_call>"}}}}},  // no closing tag: the reply ended at the end-of-turn token
      {F::kHermes, "Plain answer, no tools.", "Plain answer, no tools.", {}},
      {F::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1", {}},
      {F::kHermes, "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", {}},
      {F::kMistral, "[TOOL_CALLS] [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"neg\", "
                    "\"arguments\": {\"a\": 3}}]",
       "", {{"add", {{"a", 1}, {"b", 2}}}, {"neg", {{"a", 3}}}}},
      {F::kMistral, "Sure. [TOOL_CALLS][{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}]", "Sure.",
       {{"add", {{"a", 1}}}}},  // arguments written as a string stay that string
      {F::kLlama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "",
       {{"get_weather", {{"city", "Oslo"}}}}},
      {F::kLlama3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": [1, 2]}}",
       "", {{"a", json::object()}, {"b", {{"k", {1, 2}}}}}},
      {F::kLlama3, "The weather is {mild}.", "The weather is {mild}.", {}},
      {F::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(200, '[') + std::string(200, ']') +
                       "}</tool_call>",
       "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(200, '[') + std::string(200, ']') + "}</tool_call>",
       {}},  // nested deeper than input JSON may: not a call
      {F::kLlama3, "{\"name\": \"a\", \"parameters\": {}} and then text", "{\"name\": \"a\", \"parameters\": {}} and then text", {}},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE("case " + std::to_string(k) + " (" + rt::tool_call_format_name(c.format) + "): " + c.text);
    const rt::ParsedReply p = rt::parse_tool_calls(c.format, c.text);
    EXPECT_EQ(p.content, c.content);
    ASSERT_EQ(p.calls.size(), c.calls.size());
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, c.calls[i].first);
      EXPECT_EQ(json::parse(p.calls[i].arguments), c.calls[i].second);
    }
    // Streamed in pieces of every size from 1 byte: the same calls; the content sent before the first call plus
    // what finish() returns is the reply's content (untrimmed where no call was found).
    for (size_t step = 1; step <= c.text.size(); step += (step < 16 ? 1 : 7)) {
      std::string sent;
      const rt::ParsedReply s = streamed(c.format, c.text, step, sent);
      ASSERT_EQ(s.calls.size(), c.calls.size()) << "pieces of " << step;
      for (size_t i = 0; i < c.calls.size(); ++i) EXPECT_EQ(s.calls[i].arguments, p.calls[i].arguments);
      if (c.calls.empty()) {
        EXPECT_EQ(sent + s.content, c.text) << "pieces of " << step;
      } else {
        const std::string before = sent.find_first_not_of(" \n") == std::string::npos ? "" : sent;
        EXPECT_NE((before + s.content).find(c.content), std::string::npos) << "pieces of " << step;
        EXPECT_EQ(sent.find("<tool_call>"), std::string::npos);
        EXPECT_EQ(sent.find("[TOOL_CALLS]"), std::string::npos);
      }
    }
  }
}

TEST(ToolCalls, TheApiRendersToolsAndReturnsCalls) {
  const rt::OpenAIApi api(tiny(), "t", cm::ChatFormat::kRaw, cm::ChatTemplate(read_template("qwen2.5-instruct")));
  ASSERT_EQ(api.tool_call_format(), rt::ToolCallFormat::kHermes);
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  const std::string body = R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": )" + tools + "}";
  const rt::ApiRequest r = api.parse(body, rt::Endpoint::kChat);
  EXPECT_EQ(r.tool_calls, rt::ToolCallFormat::kHermes);
  const std::string prompt = tiny().tokenizer().decode(r.options.prompt, false);
  EXPECT_NE(prompt.find("get_weather"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("The weather in a city"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tools>"), std::string::npos) << prompt;
  // A conversation that goes on: the assistant's call and the tool's result, rendered by the template.
  const rt::ApiRequest r2 = api.parse(
      R"({"messages": [{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}], "tools": )" + tools + "}",
      rt::Endpoint::kChat);
  const std::string prompt2 = tiny().tokenizer().decode(r2.options.prompt, false);
  EXPECT_NE(prompt2.find("<tool_response>\n18 C, sunny\n</tool_response>"), std::string::npos) << prompt2;

  // The reply: content null, the call with its arguments as a JSON string, finish_reason tool_calls.
  rt::RequestUpdate last;
  last.finished = true;
  last.reason = rt::FinishReason::kStop;
  const std::string reply = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const json out = json::parse(api.response(r, "abc", 1, reply, {}, last));
  const json& choice = out.at("choices").at(0);
  EXPECT_EQ(choice.at("finish_reason"), "tool_calls");
  EXPECT_TRUE(choice.at("message").at("content").is_null());
  const json& call = choice.at("message").at("tool_calls").at(0);
  EXPECT_EQ(call.at("id"), "call_abc_0");
  EXPECT_EQ(call.at("type"), "function");
  EXPECT_EQ(call.at("function").at("name"), "get_weather");
  EXPECT_EQ(json::parse(call.at("function").at("arguments").get<std::string>()), json({{"city", "Paris"}}));
  // A reply without a call is plain content.
  const json plain = json::parse(api.response(r, "abc", 1, "It is sunny.", {}, last));
  EXPECT_EQ(plain.at("choices").at(0).at("message").at("content"), "It is sunny.");
  EXPECT_FALSE(plain.at("choices").at(0).at("message").contains("tool_calls"));
  EXPECT_EQ(plain.at("choices").at(0).at("finish_reason"), "stop");
  // tool_choice "none": tools rendered, the reply left as text.
  const rt::ApiRequest none = api.parse(
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", "tools": )" + tools + "}",
      rt::Endpoint::kChat);
  EXPECT_EQ(none.tool_calls, rt::ToolCallFormat::kNone);
  EXPECT_EQ(json::parse(api.response(none, "x", 1, reply, {}, last)).at("choices").at(0).at("message").at("content"),
            reply);

  // Streaming: content before the call as it comes, then one tool_calls delta with the finish.
  const rt::ApiRequest s = api.parse(body.substr(0, body.size() - 1) + R"(, "stream": true})", rt::Endpoint::kChat);
  ASSERT_TRUE(s.tool_stream);
  std::string events;
  const std::string streamed_reply = "Checking. " + reply;
  for (size_t i = 0; i < streamed_reply.size(); i += 5) {
    rt::RequestUpdate u;
    u.text = streamed_reply.substr(i, 5);
    u.finished = i + 5 >= streamed_reply.size();
    u.reason = rt::FinishReason::kStop;
    events += api.stream_events(s, "abc", 1, u, i == 0);
  }
  std::string content;
  json calls;
  std::string finish;
  std::istringstream lines(events);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json c = json::parse(line.substr(6));
    const json& ch = c.at("choices").at(0);
    if (ch.at("delta").contains("content")) content += ch.at("delta").at("content").get<std::string>();
    if (ch.at("delta").contains("tool_calls")) calls = ch.at("delta").at("tool_calls");
    if (!ch.at("finish_reason").is_null()) finish = ch.at("finish_reason").get<std::string>();
  }
  EXPECT_EQ(content, "Checking. ");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls.at(0).at("index"), 0);
  EXPECT_EQ(calls.at(0).at("function").at("name"), "get_weather");
  EXPECT_NE(events.find("data: [DONE]"), std::string::npos);
}

TEST(ToolCalls, RefusalsNameTheRule) {
  const std::string tools = R"([{"type": "function", "function": {"name": "f"}}])";
  const std::string msg = R"("messages": [{"role": "user", "content": "hi"}])";
  auto expect_400 = [](const rt::OpenAIApi& api, const std::string& body, const std::string& text,
                       rt::Endpoint e = rt::Endpoint::kChat) {
    try {
      (void)api.parse(body, e);
      ADD_FAILURE() << "no error for " << body;
    } catch (const rt::ApiError& err) {
      EXPECT_EQ(err.status(), 400);
      EXPECT_NE(std::string(err.what()).find(text), std::string::npos) << err.what();
    }
  };
  const rt::OpenAIApi qwen(tiny(), "t", cm::ChatFormat::kRaw, cm::ChatTemplate(read_template("qwen2.5-instruct")));
  // tool_choice "required" / a named function: what cannot be honoured is refused, naming why.
  const std::string named_g = R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})";
  expect_400(qwen, "{" + msg + R"(, "tools": )" + tools + named_g, "\"g\", which is not among 'tools'");
  expect_400(qwen, "{" + msg + named_g, "needs 'tools'");
  expect_400(qwen, "{" + msg + R"(, "tool_choice": "required"})", "needs 'tools'");
  expect_400(qwen, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": {"type": "function"}})", "must be");
  expect_400(qwen, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": "always"})", "must be");
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}], "tool_choice": "required"})",
             "'tools[0].function.parameters'");
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"s": {"anyOf": [{"type": "string"}]}}}}}], "tool_choice": "required"})",
             "anyOf");
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters":
      {"type": "string"}}}], "tool_choice": "required"})", "must be an object type");
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {"name": "f"}},
      {"type": "function", "function": {"name": "f"}}], "tool_choice": "required"})", "given twice");
  expect_400(qwen, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": "required",
      "response_format": {"type": "json_object"}})", "both constrain the reply");
  expect_400(qwen, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": "required", "response_format": "json"})",
             "both constrain the reply");
  EXPECT_TRUE(qwen.parse("{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": "required",
      "response_format": {"type": "text"}})", rt::Endpoint::kChat).call_schema);
  expect_400(qwen, "{" + msg + R"(, "n": 2, "tools": )" + tools + R"(, "tool_choice": "required"})", "'n' must be 1");
  // … while "auto" does not compile the parameters (a keyword the recognizer lacks is fine there).
  EXPECT_EQ(qwen.parse("{" + msg + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}}}]})", rt::Endpoint::kChat).tool_calls,
            rt::ToolCallFormat::kHermes);
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {}}]})", "tools[0]");
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
             "JSON Schema object");
  expect_400(qwen, R"({"prompt": "hi", "tools": )" + tools + "}", "/v1/chat/completions", rt::Endpoint::kCompletions);
  const rt::OpenAIApi raw(tiny(), "t", cm::ChatFormat::kRaw);
  expect_400(raw, "{" + msg + R"(, "tools": )" + tools + "}", "needs the model's chat template");
  expect_400(raw, R"({"messages": [{"role": "tool", "content": "x"}]})", "tool needs a chat template");
  const rt::OpenAIApi gemma(tiny(), "t", cm::ChatFormat::kRaw, cm::ChatTemplate(read_template("gemma3-it")));
  expect_400(gemma, "{" + msg + R"(, "tools": )" + tools + "}", "does not take tools");
  expect_400(gemma, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": "required"})", "does not take tools");
  expect_400(raw, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": "required"})", "needs the model's chat template");
  const rt::OpenAIApi functionary(tiny(), "t", cm::ChatFormat::kRaw,
                                  cm::ChatTemplate(read_template("functionary-medium-v3.1")));
  expect_400(functionary, "{" + msg + R"(, "tools": )" + tools + "}", "does not parse");
  expect_400(functionary, "{" + msg + R"(, "tools": )" + tools + named_g.substr(0, named_g.size() - 1) + "}",
             "does not parse");
  // An empty tools list is no tools.
  EXPECT_EQ(raw.parse("{" + msg + R"(, "tools": []})", rt::Endpoint::kChat).tool_calls, rt::ToolCallFormat::kNone);
}

namespace {

// The tools of the forced-call tests: arguments with a string, an enum, an integer; an enum only; none at all.
const json kForcedTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                  "days": {"type": "integer"}}, "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
   "parameters": {"type": "object", "properties": {"tz": {"enum": ["CET", "UTC", "JST"]}}, "required": ["tz"]}}},
  {"type": "function", "function": {"name": "ping"}}])");

// The parameters schema of the tool named `name` in kForcedTools (none: an empty parameter list, OpenAI's reading).
json forced_params(const std::string& name) {
  const json empty = {{"type", "object"}, {"additionalProperties", false}};
  for (const json& t : kForcedTools)
    if (t.at("function").at("name") == name) return t.at("function").value("parameters", empty);
  return nullptr;
}

struct ForcedReply {
  std::string text;    // the engine's reply (non-streaming)
  json message;        // the response's choices[0] (non-streaming)
  json stream_calls;   // the streamed tool_calls delta (null when none)
  std::string stream_content, stream_finish;
  int tool_call_deltas = 0;
};

// A chat request through the API and the engine, as `cider serve` runs it: the response, then the same request
// streamed (seeded: the same tokens) through stream_events.
ForcedReply forced_reply(rt::Engine& engine, const rt::OpenAIApi& api, const std::string& body) {
  ForcedReply out;
  for (bool stream : {false, true}) {
    const rt::ApiRequest r =
        api.parse(stream ? body.substr(0, body.size() - 1) + R"(, "stream": true})" : body, rt::Endpoint::kChat);
    std::shared_ptr<rt::Request> h;
    EXPECT_EQ(engine.submit(r.options, h), rt::Engine::Submit::kAccepted);
    std::string text, events;
    rt::RequestUpdate last;
    bool first = true;
    for (int i = 0; i < 1800 && !last.finished; ++i) {
      rt::RequestUpdate u = h->wait(std::chrono::milliseconds(100));
      if (u.text.empty() && !u.finished) continue;
      text += u.text;
      if (stream) events += api.stream_events(r, "abc", 1, u, first);
      first = false;
      if (u.finished) last = u;
    }
    EXPECT_TRUE(last.finished);
    if (!stream) {
      out.text = text;
      out.message = json::parse(api.response(r, "abc", 1, text, {}, last)).at("choices").at(0);
      continue;
    }
    std::istringstream lines(events);
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("data: {", 0) != 0) continue;
      const json chunk = json::parse(line.substr(6));
      const json& ch = chunk.at("choices").at(0);
      if (ch.at("delta").contains("content")) out.stream_content += ch.at("delta").at("content").get<std::string>();
      if (ch.at("delta").contains("tool_calls")) {
        out.stream_calls = ch.at("delta").at("tool_calls");
        ++out.tool_call_deltas;
      }
      if (!ch.at("finish_reason").is_null()) out.stream_finish = ch.at("finish_reason").get<std::string>();
    }
  }
  return out;
}

}  // namespace

// tool_choice "required" and a named function, in each format, through the engine with the embedded model: a reply
// that finishes is exactly one call, of the named tool (or one of the tools), whose arguments parse as JSON valid
// against that tool's parameters; one cut by max_tokens is content with finish_reason "length" and no calls; the
// stream carries the same call in one tool_calls delta.
TEST(ToolCalls, ForcedCallsAreCallsOfTheRequestedToolWithValidArguments) {
  rt::Engine engine(tiny(), rt::EngineOptions{});
  const std::vector<std::pair<std::string, rt::ToolCallFormat>> templates = {
      {"qwen2.5-instruct", rt::ToolCallFormat::kHermes},
      {"mistral-7b-instruct-v0.3", rt::ToolCallFormat::kMistral},
      {"llama3.1-instruct", rt::ToolCallFormat::kLlama3}};
  const std::vector<std::string> choices = {
      R"({"type": "function", "function": {"name": "get_weather"}})",
      R"({"type": "function", "function": {"name": "get_time"}})",
      R"({"type": "function", "function": {"name": "ping"}})", R"("required")"};
  // cider-tiny, trained on Python's documentation, pads JSON with runs of whitespace (each run within the
  // recognizer's bound, but they eat max_tokens): the whitespace-only tokens get a logit_bias of -100, so that the
  // replies reach the values; the constraint still decides every byte.
  json bias = json::object();
  const cm::Tokenizer& tok = tiny().tokenizer();
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) continue;
    const std::string t = tok.decode({id}, false);
    if (!t.empty() && t.find_first_not_of(" \t\n\r") == std::string::npos) bias[std::to_string(id)] = -100;
  }
  ASSERT_GT(bias.size(), 0u);
  for (const auto& [stem, format] : templates) {
    const rt::OpenAIApi api(tiny(), "t", cm::ChatFormat::kRaw, cm::ChatTemplate(read_template(stem)));
    ASSERT_EQ(api.tool_call_format(), format);
    const rt::ToolCallText around = rt::forced_call_text(format);
    int calls = 0, cut = 0;
    std::set<std::string> names;
    for (const std::string& choice : choices) {
      const json c = json::parse(choice);
      for (uint64_t seed = 1; seed <= 3; ++seed) {
        const std::string body = R"({"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "max_tokens": 160, "temperature": 0.8, "logit_bias": )" + bias.dump() + R"(, "seed": )" + std::to_string(seed) +
                                 R"(, "tools": )" + kForcedTools.dump() + R"(, "tool_choice": )" + choice + "}";
        SCOPED_TRACE(stem + ", tool_choice " + choice + ", seed " + std::to_string(seed));
        // The prompt ends with the format's opening, its special tokens encoded as the template's are.
        const rt::ApiRequest r = api.parse(body, rt::Endpoint::kChat);
        ASSERT_TRUE(r.options.json);
        const std::string prompt = tiny().tokenizer().decode(r.options.prompt, false);
        EXPECT_EQ(prompt.substr(prompt.size() - around.open.size()), around.open);
        const ForcedReply f = forced_reply(engine, api, body);
        const json& m = f.message.at("message");
        SCOPED_TRACE("reply " + f.message.dump());
        if (f.message.at("finish_reason") == "length") {  // cut by max_tokens: the text as it came, no calls
          ++cut;
          EXPECT_FALSE(m.contains("tool_calls"));
          EXPECT_EQ(m.at("content").get<std::string>().substr(0, around.open.size()), around.open);
          EXPECT_EQ(f.stream_finish, "length");
          EXPECT_EQ(f.tool_call_deltas, 0);
          EXPECT_EQ(f.stream_content, m.at("content").get<std::string>());
          continue;
        }
        ++calls;
        ASSERT_EQ(f.message.at("finish_reason"), "tool_calls");
        EXPECT_TRUE(m.at("content").is_null());
        ASSERT_EQ(m.at("tool_calls").size(), 1u);
        const json& fn = m.at("tool_calls").at(0).at("function");
        const std::string name = fn.at("name").get<std::string>();
        if (c.is_object()) {
          EXPECT_EQ(name, c.at("function").at("name"));
        }
        const json params = forced_params(name);
        ASSERT_FALSE(params.is_null()) << "not one of the tools: " << name;
        const json args = json::parse(fn.at("arguments").get<std::string>());
        EXPECT_TRUE(args.is_object());
        EXPECT_TRUE(cider::test::json_schema_valid(args, params)) << args.dump() << " against " << params.dump();
        names.insert(name);
        // The reply in the format's own text (what the template writes for a call) is the same call to the parser.
        const rt::ParsedReply again = rt::parse_tool_calls(format, around.open + f.text + around.close);
        ASSERT_EQ(again.calls.size(), 1u) << around.open + f.text + around.close;
        EXPECT_EQ(again.calls[0].name, name);
        EXPECT_EQ(json::parse(again.calls[0].arguments), args);
        EXPECT_EQ(again.content, "");
        // Streamed: no content, one tool_calls delta with the same call, finish_reason tool_calls.
        EXPECT_EQ(f.stream_content, "");
        EXPECT_EQ(f.tool_call_deltas, 1);
        EXPECT_EQ(f.stream_finish, "tool_calls");
        ASSERT_EQ(f.stream_calls.size(), 1u);
        EXPECT_EQ(f.stream_calls.at(0).at("function"), fn);
      }
    }
    // max_tokens before the object closes: finish_reason "length", the text as it came (after the opening), no calls.
    const ForcedReply f = forced_reply(engine, api, R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "seed": 5,
        "tools": )" + kForcedTools.dump() + R"(, "tool_choice": "required"})");
    EXPECT_EQ(f.message.at("finish_reason"), "length") << f.message.dump();
    EXPECT_FALSE(f.message.at("message").contains("tool_calls"));
    const std::string content = f.message.at("message").at("content").get<std::string>();
    EXPECT_EQ(content.substr(0, around.open.size()), around.open);
    EXPECT_GT(content.size(), around.open.size());
    EXPECT_EQ(f.stream_finish, "length");
    EXPECT_EQ(f.tool_call_deltas, 0);
    EXPECT_EQ(f.stream_content, content);
    // A marker inside a string value does not split the call: it is read from the object.
    const std::string marker_body = R"({"messages": [{"role": "user", "content": "Hi"}], "tools": )" +
                                    kForcedTools.dump() + R"(, "tool_choice": "required"})";
    const rt::ApiRequest mr = api.parse(marker_body, rt::Endpoint::kChat);
    const std::string arg_key = format == rt::ToolCallFormat::kLlama3 ? "parameters" : "arguments";
    const std::string marked = R"({"name": "get_weather", ")" + arg_key +
                               R"(": {"city": "</tool_call>] [TOOL_CALLS]", "unit": "celsius"}})";
    cm::JsonPrefix mp(mr.call_schema.get());
    ASSERT_TRUE(mp.feed(marked) && mp.complete());
    rt::RequestUpdate done;
    done.finished = true;
    done.reason = rt::FinishReason::kStop;
    const json mc = json::parse(api.response(mr, "m", 1, marked, {}, done)).at("choices").at(0);
    ASSERT_EQ(mc.at("finish_reason"), "tool_calls") << mc.dump();
    EXPECT_EQ(json::parse(mc.at("message").at("tool_calls").at(0).at("function").at("arguments").get<std::string>()),
              json({{"city", "</tool_call>] [TOOL_CALLS]"}, {"unit", "celsius"}}));
    RecordProperty(stem + "_calls", calls);
    EXPECT_GE(calls, 6) << stem << ": " << calls << " calls, " << cut << " cut by max_tokens";
    EXPECT_GE(names.size(), 2u) << stem;
  }
}
