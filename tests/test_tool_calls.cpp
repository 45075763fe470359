// Tool calls (runtime/tool_calls.h, the OpenAI API's `tools` in runtime/openai_api.h): the format each real chat
// template asks for, the reply split into content and calls in each format (whole and streamed in pieces that cut
// the markers anywhere), and the API: tools rendered by the template, the calls in message.tool_calls and in a
// streamed delta, the refusals naming the rule.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "model/model.h"
#include "runtime/openai_api.h"
#include "runtime/tool_calls.h"
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
  expect_400(qwen, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": "required"})", "constrained decoding");
  expect_400(qwen, "{" + msg + R"(, "tools": )" + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}}})",
             "constrained decoding");
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {}}]})", "tools[0]");
  expect_400(qwen, "{" + msg + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
             "JSON Schema object");
  expect_400(qwen, R"({"prompt": "hi", "tools": )" + tools + "}", "/v1/chat/completions", rt::Endpoint::kCompletions);
  const rt::OpenAIApi raw(tiny(), "t", cm::ChatFormat::kRaw);
  expect_400(raw, "{" + msg + R"(, "tools": )" + tools + "}", "needs the model's chat template");
  expect_400(raw, R"({"messages": [{"role": "tool", "content": "x"}]})", "tool needs a chat template");
  const rt::OpenAIApi gemma(tiny(), "t", cm::ChatFormat::kRaw, cm::ChatTemplate(read_template("gemma3-it")));
  expect_400(gemma, "{" + msg + R"(, "tools": )" + tools + "}", "does not take tools");
  const rt::OpenAIApi functionary(tiny(), "t", cm::ChatFormat::kRaw,
                                  cm::ChatTemplate(read_template("functionary-medium-v3.1")));
  expect_400(functionary, "{" + msg + R"(, "tools": )" + tools + "}", "does not parse");
  // An empty tools list is no tools.
  EXPECT_EQ(raw.parse("{" + msg + R"(, "tools": []})", rt::Endpoint::kChat).tool_calls, rt::ToolCallFormat::kNone);
}
