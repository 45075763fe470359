#include "runtime/openai_api.h"

#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/generate.h"
#include "model/json_prefix.h"

namespace cider::runtime {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", message, param);
}

std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Optional typed fields: absent or null → the default.
bool present(const json& b, const char* k) { return b.contains(k) && !b.at(k).is_null(); }

double number(const json& b, const char* k, double def, double lo, double hi, bool lo_open = false) {
  if (!present(b, k)) return def;
  const json& v = b.at(k);
  if (!v.is_number()) bad(k, std::string("'") + k + "' must be a number; got " + brief(v));
  const double x = v.get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi) || !std::isfinite(x)) {
    std::ostringstream range;
    range << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
    bad(k, std::string("'") + k + "' must be in " + range.str() + "; got " + brief(v));
  }
  return x;
}

int64_t integer(const json& b, const char* k, int64_t def, int64_t lo, int64_t hi) {
  if (!present(b, k)) return def;
  const json& v = b.at(k);
  if (!v.is_number_integer()) bad(k, std::string("'") + k + "' must be an integer; got " + brief(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    bad(k, std::string("'") + k + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]; got " +
               brief(v));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad(k, std::string("'") + k + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]; got " +
               brief(v));
  return x;
}

bool boolean(const json& b, const char* k, bool def) {
  if (!present(b, k)) return def;
  if (!b.at(k).is_boolean()) bad(k, std::string("'") + k + "' must be a boolean; got " + brief(b.at(k)));
  return b.at(k).get<bool>();
}

std::string content_text(const json& c, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(where, "'" + where + "' must be a string or a list of text parts; got " + brief(c));
  std::string s;
  for (const json& part : c) {
    if (!part.is_object() || !part.contains("type") || part.at("type") != "text" || !part.contains("text") ||
        !part.at("text").is_string())
      bad(where, "'" + where + "' parts must be {\"type\": \"text\", \"text\": string} (cider serves text models); got " +
                     brief(part));
    s += part.at("text").get<std::string>();
  }
  return s;
}

std::string token_text(const model::Tokenizer& tok, int32_t id) { return tok.decode({id}, false); }

json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}

// logprobs of a chat choice: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs(const model::Tokenizer& tok, const std::vector<TokenLogprob>& logprobs) {
  json content = json::array();
  for (const auto& t : logprobs) {
    json top = json::array();
    for (const auto& [tid, l] : t.top) {
      const std::string s = token_text(tok, tid);
      top.push_back({{"token", s}, {"logprob", l}, {"bytes", bytes_of(s)}});
    }
    const std::string s = token_text(tok, t.id);
    content.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

// logprobs of a completion choice: {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset (when
// `offset` >= 0: the offset of the first token's text)}.
json completion_logprobs(const model::Tokenizer& tok, const std::vector<TokenLogprob>& logprobs, int64_t offset) {
  const bool with_offsets = offset >= 0;
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& t : logprobs) {
    const std::string s = token_text(tok, t.id);
    tokens.push_back(s);
    token_lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [tid, l] : t.top) top[token_text(tok, tid)] = l;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += static_cast<int64_t>(s.size());
  }
  json out{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}};
  if (with_offsets) out["text_offset"] = offsets;
  return out;
}

json usage_json(const RequestUpdate& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

const char* finish_name(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";  // cancelled/error never reach a client as a reason
}

// message.tool_calls (with_index: a streamed delta's, each call with its index): ids call_<response id>_<i>.
json tool_calls_json(const std::vector<ToolCall>& calls, const std::string& id, bool with_index) {
  json a = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c{{"id", "call_" + id + "_" + std::to_string(i)},
           {"type", "function"},
           {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    a.push_back(std::move(c));
  }
  return a;
}

// A forced call's reply (ApiRequest::call_schema): the call, when the object closed — read from the object itself,
// as the Llama 3 JSON form reads a bare {"name", "arguments"|"parameters"} object, so that a marker inside a string
// value cannot split it —, else (cut by max_tokens or a stop string) content: the opening and the reply, as "auto"
// leaves an unfinished call.
ParsedReply forced_call(const ApiRequest& r, const std::string& reply) {
  model::JsonPrefix p(r.call_schema.get());
  if (p.feed(reply) && p.complete()) {
    ParsedReply call = parse_tool_calls(ToolCallFormat::kLlama3, reply);
    if (call.calls.size() == 1) return call;
  }
  return {r.call_open + reply, {}};
}

}  // namespace

std::string ApiError::body() const {
  json e{{"error",
          {{"message", what()},
           {"type", type_},
           {"param", param_.empty() ? json(nullptr) : json(param_)},
           {"code", json(nullptr)}}}};
  return e.dump(-1, ' ', false, json::error_handler_t::replace);
}

OpenAIApi::OpenAIApi(const model::Model& model, std::string model_name, model::ChatFormat chat_format,
                     std::optional<model::ChatTemplate> chat_template)
    : model_(model), name_(std::move(model_name)), format_(chat_format), template_(std::move(chat_template)) {
  if (template_) tool_format_ = detect_tool_call_format(template_->source());
  eos_ids_ = model::model_eos_ids(model_);
  chat_end_ids_ = eos_ids_;
  for (const auto& t : model::chat_end_tokens(format_))
    if (const int32_t id = model_.tokenizer().token_to_id(t); id >= 0) chat_end_ids_.push_back(id);
}

ApiRequest OpenAIApi::parse(std::string_view body, Endpoint endpoint) const {
  json b;
  try {
    b = json::parse(body.begin(), body.end(), nullptr, true, false);
  } catch (const json::exception& e) {
    bad("", std::string("the request body must be JSON: ") + e.what());
  }
  if (!b.is_object()) bad("", "the request body must be a JSON object; got " + brief(b));
  const model::Tokenizer& tok = model_.tokenizer();
  const int64_t ctx = model_.context_length();
  const int64_t vocab = model_.config().vocab_size;
  ApiRequest r;
  r.endpoint = endpoint;
  r.model = present(b, "model") && b.at("model").is_string() ? b.at("model").get<std::string>() : name_;

  if (integer(b, "n", 1, 1, 1024) != 1) bad("n", "'n' must be 1 (cider samples one choice per request); got " + brief(b.at("n")));
  if (integer(b, "best_of", 1, 1, 1024) != 1) bad("best_of", "'best_of' must be 1; got " + brief(b.at("best_of")));
  // Tools: checked here, passed to the template below, the reply split in response() / stream_events().
  const bool tools = present(b, "tools") && !(b.at("tools").is_array() && b.at("tools").empty());
  if (tools) {
    const json& t = b.at("tools");
    if (!t.is_array() || t.size() > 128) bad("tools", "'tools' must be a list of at most 128 tools; got " + brief(t));
    for (size_t i = 0; i < t.size(); ++i) {
      const json& x = t[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!x.is_object() || !x.contains("type") || x.at("type") != "function" || !x.contains("function") ||
          !x.at("function").is_object() || !x.at("function").contains("name") ||
          !x.at("function").at("name").is_string() || x.at("function").at("name").get<std::string>().empty())
        bad(where, "'" + where + "' must be {\"type\": \"function\", \"function\": {\"name\": string, ...}}; got " +
                       brief(x));
      if (x.at("function").contains("parameters") && !x.at("function").at("parameters").is_object())
        bad(where + ".function.parameters",
            "'" + where + ".function.parameters' must be a JSON Schema object; got " + brief(x.at("function").at("parameters")));
    }
    if (endpoint != Endpoint::kChat) bad("tools", "'tools' belongs to /v1/chat/completions");
    if (!template_)
      bad("tools", std::string("'tools' needs the model's chat template (this server renders chats in the built-in ") +
                       model::chat_format_name(format_) + " format, which has no tools)");
    if (tool_format_ == ToolCallFormat::kNone)
      bad("tools", "'tools' was sent, but this model's chat template does not take tools");
    if (tool_format_ == ToolCallFormat::kUnknown)
      bad("tools", "this model's chat template takes tools, but writes calls in a format cider does not parse (it "
                   "parses hermes <tool_call>, mistral [TOOL_CALLS] and llama 3 JSON calls)");
  }
  bool parse_calls = tools;
  // tool_choice "required" / a named function: the tools the call may name (all, or the one named).
  std::vector<size_t> forced;
  if (present(b, "tool_choice")) {
    const json& c = b.at("tool_choice");
    const bool named = c.is_object() && c.contains("type") && c.at("type") == "function" &&
                       c.contains("function") && c.at("function").is_object() && c.at("function").contains("name") &&
                       c.at("function").at("name").is_string();
    if (c == "none") {
      parse_calls = false;
    } else if (c == "required" || named) {
      if (!tools) bad("tool_choice", "'tool_choice' " + brief(c) + " needs 'tools' (it asks for a call of one of them)");
      const json& t = b.at("tools");
      for (size_t i = 0; i < t.size(); ++i)
        if (!named || t[i].at("function").at("name") == c.at("function").at("name")) forced.push_back(i);
      if (named && forced.empty())
        bad("tool_choice", "'tool_choice' names the function " + brief(c.at("function").at("name")) +
                               ", which is not among 'tools'");
      if (forced.size() > static_cast<size_t>(model::JsonSchema::kMaxEnum))
        bad("tool_choice", "'tool_choice' \"required\" takes at most " +
                               std::to_string(model::JsonSchema::kMaxEnum) + " tools; got " +
                               std::to_string(forced.size()));
    } else if (c != "auto") {
      bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", "
                         "\"function\": {\"name\": string}}; got " + brief(c));
    }
  }
  if (present(b, "suffix")) bad("suffix", "'suffix' (insertion) is not supported");
  std::shared_ptr<const model::JsonSchema> json_constraint;
  if (!forced.empty()) {
    // Constrained decoding of one call: {"name": N, "arguments"|"parameters": A}, N one of the forced tools' names
    // and A what that tool's parameters allow (model::JsonSchema::tool_call); the format's opening text goes at the
    // end of the prompt (ApiRequest::call_open).
    const json& t = b.at("tools");
    std::vector<std::string> names;
    std::vector<std::shared_ptr<const model::JsonSchema>> params;
    for (size_t i : forced) {
      const json& f = t[i].at("function");
      const std::string where = "tools[" + std::to_string(i) + "].function.parameters";
      names.push_back(f.at("name").get<std::string>());
      // Absent: an empty parameter list, as OpenAI reads it (the arguments are {}); without "type", an object
      // (OpenAI's parameters always describe one).
      json p = present(f, "parameters") ? f.at("parameters") : json{{"type", "object"}, {"properties", json::object()}};
      if (!p.contains("type")) p["type"] = "object";
      try {
        params.push_back(model::JsonSchema::compile(p));
      } catch (const Error& e) {
        bad(where, "'" + where + "' (tool_choice " + brief(b.at("tool_choice")) + " constrains the arguments to it): " +
                       e.what());
      }
    }
    try {
      json_constraint = model::JsonSchema::tool_call(names, params, "name",
                                                     tool_format_ == ToolCallFormat::kLlama3 ? "parameters" : "arguments");
    } catch (const Error& e) {
      bad("tools", std::string("'tools' with tool_choice ") + brief(b.at("tool_choice")) + ": " + e.what());
    }
    r.call_open = forced_call_text(tool_format_).open;
    r.call_schema = json_constraint;
    if (present(b, "response_format") && !(b.at("response_format").is_object() &&
                                           b.at("response_format").contains("type") &&
                                           b.at("response_format").at("type") == "text"))
      bad("response_format", "'response_format' " + brief(b.at("response_format")) + " and 'tool_choice' " +
                                 brief(b.at("tool_choice")) + " both constrain the reply; send one of them");
  }
  if (present(b, "response_format")) {
    const json& f = b.at("response_format");
    const bool typed = f.is_object() && f.contains("type") && f.at("type").is_string();
    if (!typed || (f.at("type") != "text" && f.at("type") != "json_object" && f.at("type") != "json_schema"))
      bad("response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                             "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}; got " + brief(f));
    if (f.at("type") == "json_object") json_constraint = model::JsonSchema::any_object();
    if (f.at("type") == "json_schema") {
      if (!f.contains("json_schema") || !f.at("json_schema").is_object() || !f.at("json_schema").contains("schema"))
        bad("response_format", "'response_format' of type json_schema needs json_schema.schema; got " + brief(f));
      try {
        json_constraint = model::JsonSchema::compile(f.at("json_schema").at("schema"));
      } catch (const Error& e) {
        bad("response_format", std::string("'response_format' json_schema.schema: ") + e.what());
      }
    }
  }

  RequestOptions& o = r.options;
  o.json = json_constraint;
  // Sampling: OpenAI's defaults (temperature 1, top_p 1, nothing else), the penalty over the whole history.
  o.sampling.temperature = number(b, "temperature", 1.0, 0.0, 2.0);
  o.sampling.top_p = number(b, "top_p", 1.0, 0.0, 1.0, /*lo_open=*/true);
  const int64_t top_k = integer(b, "top_k", 0, -1, std::numeric_limits<int32_t>::max());
  o.sampling.top_k = top_k < 0 ? 0 : top_k;
  o.sampling.min_p = number(b, "min_p", 0.0, 0.0, 1.0);
  o.sampling.repeat_penalty = number(b, "repetition_penalty", 1.0, 0.0, 100.0, /*lo_open=*/true);
  o.sampling.repeat_window = 0;
  if (present(b, "seed")) {
    const json& v = b.at("seed");
    if (!v.is_number_integer()) bad("seed", "'seed' must be an integer; got " + brief(v));
    o.sampling.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  } else {
    std::random_device rd;
    o.sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  o.presence_penalty = number(b, "presence_penalty", 0.0, -2.0, 2.0);
  o.frequency_penalty = number(b, "frequency_penalty", 0.0, -2.0, 2.0);
  if (present(b, "logit_bias")) {
    const json& lb = b.at("logit_bias");
    if (!lb.is_object()) bad("logit_bias", "'logit_bias' must be an object {token id: bias}; got " + brief(lb));
    for (const auto& [key, v] : lb.items()) {
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || id < 0 || id >= vocab)
        bad("logit_bias", "'logit_bias' keys must be token ids in [0, " + std::to_string(vocab) + "); got \"" + key + "\"");
      if (!v.is_number() || !(v.get<double>() >= -100.0 && v.get<double>() <= 100.0))
        bad("logit_bias", "'logit_bias' values must be numbers in [-100, 100]; got " + brief(v));
      o.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<float>());
    }
  }
  if (present(b, "stop")) {
    const json& s = b.at("stop");
    if (s.is_string()) {
      o.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 16) {
      for (const json& x : s) {
        if (!x.is_string()) bad("stop", "'stop' must be a string or a list of at most 16 strings; got " + brief(s));
        o.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of at most 16 strings; got " + brief(s));
    }
    for (const auto& x : o.stop)
      if (x.empty()) bad("stop", "'stop' strings must not be empty");
  }
  r.stream = boolean(b, "stream", false);
  if (present(b, "stream_options")) {
    const json& so = b.at("stream_options");
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object; got " + brief(so));
    r.include_usage = boolean(so, "include_usage", false);
  }

  // The prompt.
  std::string prompt_text;
  if (endpoint == Endpoint::kChat) {
    if (!present(b, "messages") || !b.at("messages").is_array() || b.at("messages").empty())
      bad("messages", "'messages' must be a non-empty list of {role, content}");
    std::vector<model::ChatMessage> msgs;
    const json& m = b.at("messages");
    for (size_t i = 0; i < m.size(); ++i) {
      const json& x = m[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!x.is_object() || !x.contains("role") || !x.at("role").is_string())
        bad(where, "'" + where + "' must be an object with a string 'role'; got " + brief(x));
      std::string role = x.at("role").get<std::string>();
      if (role == "developer") role = "system";
      const bool tool_role = role == "tool" && template_.has_value();  // a tool's result: the template renders it
      if (role != "system" && role != "user" && role != "assistant" && !tool_role)
        bad(where + ".role", "'" + where + ".role' must be system, developer, user or assistant" +
                                 (template_ ? ", or tool" : " (tool needs a chat template)") + "; got \"" + role + "\"");
      if (x.contains("tool_calls") && !template_)
        bad(where + ".tool_calls", "'" + where + ".tool_calls' needs a chat template (the built-in formats have none)");
      msgs.push_back({role, content_text(x.contains("content") ? x.at("content") : json(nullptr), i)});
    }
    if (template_) {
      // The messages as sent (key order kept: a template may write them out with tojson).
      const nlohmann::ordered_json ob = nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false, false);
      nlohmann::ordered_json vars = nlohmann::ordered_json::object();
      vars["messages"] = ob.at("messages");
      vars["add_generation_prompt"] = true;
      vars["bos_token"] = model_.bos_token();
      vars["eos_token"] = model_.eos_token();
      vars["tools"] = tools ? ob.at("tools") : nlohmann::ordered_json(nullptr);
      if (ob.contains("chat_template_kwargs")) {
        const auto& kw = ob.at("chat_template_kwargs");
        if (!kw.is_object())
          bad("chat_template_kwargs",
              "'chat_template_kwargs' must be an object; got " + brief(b.at("chat_template_kwargs")));
        for (const auto& [k, v] : kw.items()) vars[k] = v;
      }
      try {
        prompt_text = template_->render(vars);
      } catch (const Error& e) {
        bad("messages", std::string("the model's chat template refused the conversation: ") + e.what());
      }
      // A forced call's opening (Hermes "<tool_call>\n", Mistral "[TOOL_CALLS]["), encoded with the rest, so that a
      // special token in it is recognized as in the template's own text.
      prompt_text += r.call_open;
      o.prompt = tok.encode(prompt_text, /*add_special=*/false);
    } else {
      try {
        prompt_text = model::render_chat(format_, msgs);
      } catch (const Error& e) {
        bad("messages", e.what());
      }
      o.prompt = tok.encode(prompt_text, /*add_special=*/true);
    }
    o.end_tokens = chat_end_ids_;
    const bool lp = boolean(b, "logprobs", false);
    const int64_t top = integer(b, "top_logprobs", 0, 0, 20);
    if (present(b, "top_logprobs") && !lp) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.logprobs = lp;
    o.top_logprobs = lp ? static_cast<int>(top) : -1;
  } else {
    if (!present(b, "prompt")) bad("prompt", "'prompt' is required: a string, a list of token ids or a list of one string");
    const json& p = b.at("prompt");
    if (p.is_string()) {
      prompt_text = p.get<std::string>();
      o.prompt = tok.encode(prompt_text, true);
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      prompt_text = p[0].get<std::string>();
      o.prompt = tok.encode(prompt_text, true);
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (const json& x : p) {
        if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
          bad("prompt", "'prompt' token ids must be integers in [0, " + std::to_string(vocab) + "); got " + brief(x));
        o.prompt.push_back(x.get<int32_t>());
      }
      prompt_text = tok.decode(o.prompt, false);
    } else {
      bad("prompt", "'prompt' must be a string, a list of token ids or a list of one string (n = 1); got " + brief(p));
    }
    o.end_tokens = eos_ids_;
    if (present(b, "logprobs")) {
      const json& v = b.at("logprobs");
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 20)
        bad("logprobs", "'logprobs' must be an integer in [0, 20]; got " + brief(v));
      r.logprobs = true;
      o.top_logprobs = v.get<int>();
    }
    if (boolean(b, "echo", false)) r.echo_text = prompt_text;
  }
  if (parse_calls) {
    r.tool_calls = tool_format_;
    if (r.stream && r.call_schema) r.call_reply = std::make_shared<std::string>();
    else if (r.stream) r.tool_stream = std::make_shared<ToolCallStream>(tool_format_);
  }
  if (boolean(b, "ignore_eos", false)) o.end_tokens.clear();  // vLLM's and llama-server's extension (benchmarks)
  if (o.prompt.empty()) bad(endpoint == Endpoint::kChat ? "messages" : "prompt", "the prompt encodes to no tokens");
  const int64_t n = static_cast<int64_t>(o.prompt.size());
  if (n >= ctx)
    bad(endpoint == Endpoint::kChat ? "messages" : "prompt",
        "the prompt has " + std::to_string(n) + " tokens; the context is " + std::to_string(ctx) +
            " tokens, so a prompt may have at most " + std::to_string(ctx - 1));
  // max_tokens: the newer name wins when both are given.
  const int64_t def = endpoint == Endpoint::kChat ? ctx - n : 16;
  const char* mk = present(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  o.max_tokens = std::min(integer(b, mk, def, 1, std::numeric_limits<int32_t>::max()), ctx - n);
  return r;
}

std::string OpenAIApi::response(const ApiRequest& r, const std::string& id, int64_t created, const std::string& text,
                                const std::vector<TokenLogprob>& logprobs, const RequestUpdate& last) const {
  const model::Tokenizer& tok = model_.tokenizer();
  json choice{{"index", 0}, {"finish_reason", finish_name(last.reason)}};
  if (r.endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (r.tool_calls != ToolCallFormat::kNone) {
      const ParsedReply p = r.call_schema ? forced_call(r, text) : parse_tool_calls(r.tool_calls, text);
      if (r.call_schema) choice["message"]["content"] = p.content;
      if (!p.calls.empty()) {
        choice["message"]["content"] = p.content.empty() ? json(nullptr) : json(p.content);
        choice["message"]["tool_calls"] = tool_calls_json(p.calls, id, /*with_index=*/false);
        choice["finish_reason"] = "tool_calls";
      }
    }
    choice["logprobs"] = r.logprobs ? chat_logprobs(tok, logprobs) : json(nullptr);
  } else {
    choice["text"] = r.echo_text + text;
    choice["logprobs"] =
        r.logprobs ? completion_logprobs(tok, logprobs, static_cast<int64_t>(r.echo_text.size())) : json(nullptr);
  }
  json out{{"id", id},
           {"object", r.endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
           {"created", created},
           {"model", r.model},
           {"choices", json::array({choice})},
           {"usage", usage_json(last)}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string OpenAIApi::stream_events(const ApiRequest& r, const std::string& id, int64_t created,
                                     const RequestUpdate& u, bool first) const {
  const model::Tokenizer& tok = model_.tokenizer();
  const bool chat = r.endpoint == Endpoint::kChat;
  std::string out;
  const auto event = [&](const json& choices, const json& usage) {
    json c{{"id", id},
           {"object", chat ? "chat.completion.chunk" : "text_completion"},
           {"created", created},
           {"model", r.model},
           {"choices", choices}};
    if (r.include_usage) c["usage"] = usage;
    out += "data: " + c.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  };
  std::string text = u.text;
  if (first && !chat) text = r.echo_text + text;
  ParsedReply tail;  // with tool calls: what the split held back, at the end
  if (r.call_reply) {  // a forced call: held to the end, then the call (or the content of an unfinished one)
    *r.call_reply += text;
    text.clear();
    if (u.finished) {
      tail = forced_call(r, *r.call_reply);
      text = tail.content;
    }
  } else if (r.tool_stream) {
    text = r.tool_stream->feed(text);
    if (u.finished) {
      tail = r.tool_stream->finish();
      text += tail.content;
    }
  }
  const bool has_content = !text.empty() || !u.logprobs.empty();
  if (first && chat) event(json::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                                         {"logprobs", nullptr}, {"finish_reason", nullptr}}}),
                           nullptr);
  if (!tail.calls.empty() && (has_content || u.finished)) {  // the content first, then the calls with the finish
    if (has_content) {
      json lp = r.logprobs && !u.logprobs.empty() ? chat_logprobs(tok, u.logprobs) : json(nullptr);
      event(json::array({{{"index", 0}, {"delta", text.empty() ? json::object() : json{{"content", text}}},
                          {"logprobs", lp}, {"finish_reason", nullptr}}}),
            nullptr);
    }
    event(json::array({{{"index", 0}, {"delta", {{"tool_calls", tool_calls_json(tail.calls, id, true)}}},
                        {"logprobs", nullptr}, {"finish_reason", "tool_calls"}}}),
          nullptr);
  } else if (has_content || u.finished) {
    json choice{{"index", 0}, {"finish_reason", u.finished ? json(finish_name(u.reason)) : json(nullptr)}};
    json lp = nullptr;
    if (r.logprobs && !u.logprobs.empty())
      lp = chat ? chat_logprobs(tok, u.logprobs) : completion_logprobs(tok, u.logprobs, /*offset=*/-1);
    if (chat)
      choice["delta"] = text.empty() ? json::object() : json{{"content", text}};
    else
      choice["text"] = text;
    choice["logprobs"] = lp;
    event(json::array({choice}), nullptr);
  }
  if (u.finished) {
    if (r.include_usage) event(json::array(), usage_json(u));
    out += "data: [DONE]\n\n";
  }
  return out;
}

std::string OpenAIApi::models_json(int64_t created) const {
  json m{{"object", "list"},
         {"data", json::array({{{"id", name_},
                                {"object", "model"},
                                {"created", created},
                                {"owned_by", "cider"},
                                {"max_model_len", model_.context_length()}}})}};
  return m.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace cider::runtime
