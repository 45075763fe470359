// Fuzz harness: constrained decoding's JSON Schema compiler and recognizer (model/json_prefix.h) — the schema comes
// from a request body, the reply bytes from a model a prompt can steer.
//
// Input: the schema's JSON text, a 0 byte, then the reply bytes (no 0 byte: any object, the whole input is the
// reply). The schema is parsed (nlohmann: its exceptions end the run) and compiled (cider::Error ends it: refused);
// the reply is fed byte by byte. Checks the relations constrained decoding relies on: every accepted prefix that is
// not complete has some byte that continues it (no dead end: a draw always has a token); nothing continues a complete
// one; a complete text is one JSON object by nlohmann's parser (exponents shortened: nlohmann refuses overflowing
// numbers, the grammar does not). The same reply is fed to a tool call over two tools taking the schema
// (JsonSchema::tool_call), whose complete texts are {"name": one of them, "arguments": an object}.
#include <cstdint>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_common.h"
#include "json_text.h"
#include "model/json_prefix.h"

using cider::fuzz::require;
using cider::fuzz::small_exponents;
using cider::model::JsonPrefix;
using cider::model::JsonSchema;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* zero = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  std::shared_ptr<const JsonSchema> schema = JsonSchema::any_object();
  const uint8_t* reply = data;
  if (zero != nullptr) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(data, zero);
    } catch (const nlohmann::json::exception&) {
      return 0;
    }
    try {
      schema = JsonSchema::compile(j);
    } catch (const cider::Error&) {
      return 0;  // refused, by name
    }
    reply = zero + 1;
  }
  const size_t n = static_cast<size_t>(data + size - reply);
  // The schema itself, then a tool call whose tools "get" and "get_x" both take it (JsonSchema::tool_call: the
  // name picks the arguments' schema), fed the same reply.
  const auto call = JsonSchema::tool_call({"get", "get_x"}, {schema, schema}, "name", "arguments");
  for (const JsonSchema* s : {schema.get(), call.get()}) {
    JsonPrefix p(s);
    std::string text;
    for (size_t i = 0; i < n; ++i) {
      if (!p.feed(reply[i])) break;
      text += static_cast<char>(reply[i]);
      bool continues = false;
      for (int b = 0; b < 256 && !continues; ++b) {
        JsonPrefix q = p;
        continues = q.feed(static_cast<uint8_t>(b));
      }
      require(continues != p.complete(), "an incomplete prefix continues; a complete text does not");
    }
    if (p.complete()) {
      const std::string t = small_exponents(text);
      require(nlohmann::json::accept(t), "a complete text parses");
      const nlohmann::json v = nlohmann::json::parse(t);
      require(v.is_object(), "a complete text is an object");
      if (s == call.get())
        require(v.size() == 2 && v.contains("arguments") && v.contains("name") &&
                    (v.at("name") == "get" || v.at("name") == "get_x") && v.at("arguments").is_object(),
                "a complete call is {name: one of the tools, arguments: an object}");
    }
  }
  return 0;
}
