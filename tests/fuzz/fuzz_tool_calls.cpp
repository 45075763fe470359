// Fuzz harness: tool calls in a model's reply (runtime/tool_calls.h) — text a server's client does not control
// directly but a prompt can steer.
//
// Input: byte 0 = format (low 2 bits: hermes, mistral, llama3, and again hermes) and the streaming piece size
// (1 + the high 6 bits), then the reply text. Parses the reply whole (parse_tool_calls: no exception of any kind)
// and streamed (ToolCallStream, pieces of that size), and checks the relations the server relies on: the stream
// finds the same calls with the same names and arguments; without calls, the content sent as it came plus what
// finish() returns is the reply, byte for byte; with calls, the format's call marker was never sent as content (a
// Llama 3 reply with calls sent nothing); every call has a name.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "runtime/tool_calls.h"

using cider::fuzz::require;
using cider::runtime::ParsedReply;
using cider::runtime::ToolCallFormat;
using cider::runtime::ToolCallStream;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  constexpr ToolCallFormat kFormats[] = {ToolCallFormat::kHermes, ToolCallFormat::kMistral, ToolCallFormat::kLlama3,
                                         ToolCallFormat::kHermes};
  const ToolCallFormat f = kFormats[data[0] & 3];
  const size_t step = 1 + (data[0] >> 2);
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  const ParsedReply whole = cider::runtime::parse_tool_calls(f, text);
  ToolCallStream s(f);
  std::string sent;
  for (size_t i = 0; i < text.size(); i += step) sent += s.feed(std::string_view(text).substr(i, step));
  const ParsedReply tail = s.finish();

  require(tail.calls.size() == whole.calls.size(), "the stream finds as many calls as the whole reply");
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    require(whole.calls[i].name == tail.calls[i].name, "the same call names");
    require(whole.calls[i].arguments == tail.calls[i].arguments, "the same call arguments");
    require(!whole.calls[i].name.empty(), "a call has a name");
  }
  if (whole.calls.empty()) {
    require(sent + tail.content == text, "without calls the stream sends the reply as it is");
  } else if (f == ToolCallFormat::kHermes) {  // the format's own marker only: another format's is plain text
    require(sent.find("<tool_call>") == std::string::npos, "no <tool_call> is sent as content");
  } else if (f == ToolCallFormat::kMistral) {
    require(sent.find("[TOOL_CALLS]") == std::string::npos, "no [TOOL_CALLS] is sent as content");
  } else {
    require(sent.empty(), "a Llama 3 reply with calls sends no content");
  }
  return 0;
}
