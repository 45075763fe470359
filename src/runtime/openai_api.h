// cider/runtime/openai_api.h — the OpenAI-compatible protocol of `cider serve`: request bodies of /v1/completions and
// /v1/chat/completions turned into engine requests (runtime/engine.h), and the engine's updates turned into response
// bodies and server-sent-event chunks. No HTTP here (apps/serve.cpp holds the server).
//
// Request fields: model (echoed back, not checked), prompt (completions: a string, a list of token ids, or a list of
// one string), messages (chat: role system/user/assistant — and tool with a chat template —, content a string or a
// list of {"type": "text"} parts), tools and tool_choice (below),
// max_tokens / max_completion_tokens (default: completions 16, as OpenAI; chat: to the end of the context), temperature
// [0, 2] (default 1), top_p (0, 1] (1), top_k (0 or -1: off), min_p [0, 1] (0), seed (default: a fresh one),
// stop (a string or a list of strings), presence_penalty / frequency_penalty [-2, 2], repetition_penalty (> 0, over
// the whole history), logit_bias ({token id: bias in [-100, 100]}), logprobs (chat: bool, with top_logprobs 0…20;
// completions: an integer 0…20), echo (completions), ignore_eos (vLLM's and llama-server's: end tokens do not stop),
// stream, stream_options.include_usage, n (1 only), response_format ({"type": "text"}; {"type": "json_object"} or
// {"type": "json_schema", "json_schema": {"schema"}}: constrained decoding — the reply is one JSON object, or one the
// schema allows, model/json_prefix.h — that ends, finish_reason "stop", when the object closes; "length" if
// max_tokens comes first; a schema keyword that cannot be enforced is a 400 naming it).
// Tools (chat, with a chat template whose tool-call format runtime/tool_calls.h parses: Hermes, Mistral, Llama 3
// JSON): tools (a list of {"type": "function", "function": {"name", "description", "parameters"}}) is passed to the
// template as `tools`; tool_choice "auto" (the default) splits the reply into content and message.tool_calls
// ({id, type "function", function {name, arguments: a JSON string}}, finish_reason "tool_calls"; streamed as one
// tool_calls delta at the end, the content before the first call streamed as it comes), "none" renders the tools but
// leaves the reply as text. Messages may then carry role "tool" and assistant tool_calls (the template renders them).
// tool_choice "required" or {"type": "function", "function": {"name"}} forces one call by constrained decoding: the
// format's opening (tool_calls.h forced_call_text) ends the prompt, the reply is held to {"name": N, "arguments" (Llama
// 3: "parameters"): A} with N the named tool (or one of the tools) and A what its parameters schema allows
// (model::JsonSchema::tool_call; a keyword it cannot enforce is a 400 naming tools[i].function.parameters); the
// closed object is the call (finish_reason "tool_calls", streamed as one delta); cut by max_tokens, the opening and the
// text are content ("length"). Refused: no tools, a name not among them, response_format json beside it.
// Unknown fields are ignored, as OpenAI does. Wrong types or values: ApiError 400 (invalid_request_error) naming the
// field, the rule and the value. Fields that would change the answer and that cider does not implement (n > 1, tools
// with a template that takes none or writes calls in another format, best_of > 1, suffix) are refused with 400 rather
// than ignored.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include <memory>

#include "model/chat_format.h"
#include "model/chat_template.h"
#include "runtime/engine.h"
#include "runtime/tool_calls.h"

namespace cider::runtime {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "")
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  std::string body() const;  // {"error": {"message", "type", "param", "code"}}

 private:
  int status_;
  std::string type_;
  std::string param_;
};

enum class Endpoint { kCompletions, kChat };

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;            // as sent (or the server's name)
  RequestOptions options;       // for the engine
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  bool logprobs = false;
  std::string echo_text;        // completions with echo: the prompt text, sent before the completion
  // Tool calls parsed from the reply (tools sent, tool_choice "auto", "required" or named): the template's format,
  // else kNone.
  ToolCallFormat tool_calls = ToolCallFormat::kNone;
  std::shared_ptr<ToolCallStream> tool_stream;  // streaming with tool_calls: the reply's split as it arrives
  // tool_choice "required" or a named function: options.json is call_schema (one call's JSON object) and the prompt
  // ends with call_open (the format's opening). A reply whose object closed is the call, read from the object; an
  // unfinished one is content: call_open + reply.
  std::shared_ptr<const model::JsonSchema> call_schema;
  std::string call_open;
  std::shared_ptr<std::string> call_reply;  // streaming a forced call (no tool_stream): the reply so far
};

class OpenAIApi {
 public:
  // Chat prompts: rendered by `chat_template` when given (the model's own Jinja template, or one the server was
  // told to use), as transformers' apply_chat_template does — variables messages (as sent), add_generation_prompt
  // true, bos_token, eos_token, tools null, plus the request's chat_template_kwargs — and encoded without adding
  // special tokens (the template writes them); else in the built-in `chat_format`. The format's end-of-turn tokens
  // end a reply either way.
  OpenAIApi(const model::Model& model, std::string model_name, model::ChatFormat chat_format,
            std::optional<model::ChatTemplate> chat_template = std::nullopt);

  // The body of a POST; throws ApiError (400) for anything malformed.
  ApiRequest parse(std::string_view body, Endpoint endpoint) const;

  // The whole response of a finished non-streaming request: `text` and `logprobs` concatenated from its updates,
  // `last` its final update (reason, usage).
  std::string response(const ApiRequest& r, const std::string& id, int64_t created, const std::string& text,
                       const std::vector<TokenLogprob>& logprobs, const RequestUpdate& last) const;
  // Server-sent events for one update of a streaming request ("data: {...}\n\n" lines; the first update of a chat
  // also carries the assistant role; the final one the finish reason, the usage chunk when asked, and [DONE]).
  std::string stream_events(const ApiRequest& r, const std::string& id, int64_t created, const RequestUpdate& u,
                            bool first) const;

  std::string models_json(int64_t created) const;  // GET /v1/models
  const std::string& model_name() const { return name_; }
  model::ChatFormat chat_format() const { return format_; }
  bool has_chat_template() const { return template_.has_value(); }
  ToolCallFormat tool_call_format() const { return tool_format_; }  // the template's (kNone without one)

 private:
  const model::Model& model_;
  std::string name_;
  model::ChatFormat format_;
  std::optional<model::ChatTemplate> template_;
  ToolCallFormat tool_format_ = ToolCallFormat::kNone;
  std::vector<int32_t> eos_ids_;       // the model's
  std::vector<int32_t> chat_end_ids_;  // the model's plus the chat format's end-of-turn tokens
};

}  // namespace cider::runtime
