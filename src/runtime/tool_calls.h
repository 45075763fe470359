// cider/runtime/tool_calls.h — tool calls in a model's reply (the OpenAI API's `tools`): the format a chat template
// asks its model to write them in, and the reply split into text content and calls.
//
// Formats (chosen from the template's source, as vLLM's and llama.cpp's parsers are named after them):
//   kHermes   <tool_call>{"name": N, "arguments": A}</tool_call>, one block per call, text around them (Qwen2.5,
//             Qwen3, Hermes 2/3 and the many fine-tunes of their templates: the template writes "<tool_call>").
//   kMistral  [TOOL_CALLS][{"name": N, "arguments": A}, …] after any text (Mistral 7B v0.3, Nemo: "[TOOL_CALLS]").
//   kLlama3   the whole reply one JSON object {"name": N, "parameters": A} (or "arguments"), optionally after
//             <|python_tag|>, several separated by ';' (Llama 3.1 / 3.2 / 3.3: "respond with a JSON for a function
//             call").
// A template that names `tools` in none of these ways has no parser here (kUnknown): a request with tools is then
// refused rather than answered with calls left unparsed in the text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cider::runtime {

enum class ToolCallFormat { kNone, kHermes, kMistral, kLlama3, kUnknown };

// kNone: the template never mentions tools; kUnknown: it does, in a format above it does not match.
ToolCallFormat detect_tool_call_format(std::string_view template_source);
const char* tool_call_format_name(ToolCallFormat f);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text (an object's dump, or the string the model wrote)
};

struct ParsedReply {
  std::string content;           // the text outside the calls, trimmed
  std::vector<ToolCall> calls;   // in order; empty: the reply is all content
};

// The reply split in `format`. All or nothing: a call that is not a JSON object with a string "name" (an unfinished
// one, cut by max_tokens) leaves the whole reply as content, with no calls.
ParsedReply parse_tool_calls(ToolCallFormat format, std::string_view text);

// A call written by constrained decoding (the server's tool_choice "required" or a named function): the text before
// its JSON object — the end of the prompt — and after it. Hermes "<tool_call>\n" … "\n</tool_call>", Mistral
// "[TOOL_CALLS][" … "]", Llama 3 JSON nothing (the bare object is the call); parse_tool_calls splits the whole.
struct ToolCallText {
  std::string open, close;
};
ToolCallText forced_call_text(ToolCallFormat format);

// Streaming: text arrives in pieces; what can be sent as content at once is released, the rest held until the end
// (a call's text from its opening marker on, and a possible marker's first characters at the end of a piece).
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}
  // The content to send now for this piece.
  std::string feed(std::string_view piece);
  // At the end: what was held, split (content to send, then the calls).
  ParsedReply finish();

 private:
  ToolCallFormat format_;
  std::string held_;         // not yet sent
  bool sent_any_ = false;    // some content was sent (a Llama 3 reply is a call only if it starts with one)
  bool in_call_ = false;     // held_ starts at a call's marker: nothing more is sent until finish()
};

}  // namespace cider::runtime
