// Fuzz harness: Jinja chat templates (model/chat_template.h), parsed and rendered.
//
// Input: template source, then optionally 0x00 and a JSON object of extra variables (the rest of the input, further
// 0x00 bytes included). The variables are a fixed, realistic set (a conversation with a system prompt, user and
// assistant turns, a tool call and its result; add_generation_prompt, bos_token, eos_token, tools null) with the
// extra object's members merged over it; a second part that is JSON but not an object is passed to render() as it
// is (only an object or null is accepted), one that is not JSON is ignored.
//
// Constructs a ChatTemplate with limits well below the defaults (1 MiB of output, 20000 loop iterations, 4 MiB of
// string work, 32 nested macro calls), so that one execution stays fast, then renders with nlohmann::json (keys
// sorted) and nlohmann::ordered_json (keys in input order). Checks: only cider::Error escapes, never with
// ErrorCode::kInternal (a std::exception the renderer caught: a bug) nor kOutOfMemory (the limits bound memory), its
// message starts with "[chat_template]"; the rendered text never exceeds max_output_bytes; a second render gives the
// same text or the same error; a copy, a copy-assigned and a moved ChatTemplate render the same; source() and
// limits() are what was given. Templates that mention strftime_now (local time) skip the sameness checks.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "model/chat_template.h"

namespace {

using cider::model::ChatTemplate;
using cider::model::ChatTemplateLimits;

using cider::fuzz::require;

ChatTemplateLimits fuzz_limits() {
  ChatTemplateLimits lim;
  lim.max_output_bytes = size_t{1} << 20;
  lim.max_loop_iterations = 20000;
  lim.max_call_depth = 32;
  lim.max_string_work_bytes = size_t{4} << 20;
  return lim;
}

// What transformers' apply_chat_template passes: one conversation that reaches the common branches of real
// templates (system prompt, alternating turns, an assistant tool call, a tool result, a final user turn).
constexpr const char* kBaseVariables = R"({
  "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 18}"},
    {"role": "assistant", "content": "It is 18 °C in Paris."},
    {"role": "user", "content": "Thanks! <b>And</b> tomorrow?"}
  ],
  "add_generation_prompt": true,
  "bos_token": "<s>",
  "eos_token": "</s>",
  "tools": null
})";

// The outcome of one render: the text, or the cider::Error's message.
struct Outcome {
  bool ok = false;
  std::string text;  // the rendered text, or the error message
  bool operator==(const Outcome& o) const { return ok == o.ok && text == o.text; }
};

template <typename Json>
Outcome render_checked(const ChatTemplate& t, const Json& vars) {
  Outcome r;
  try {
    r.text = t.render(vars);
    r.ok = true;
  } catch (const cider::Error& e) {
    if (cider::fuzz::verbose()) std::fprintf(stderr, "  (expected) cider::Error: %.300s\n", e.what());
    if (e.code() == cider::ErrorCode::kInternal) {
      std::fprintf(stderr, "fuzz harness: render failed with an internal error: %s\n", e.what());
      require(false, "render never fails with ErrorCode::kInternal");
    }
    if (e.code() == cider::ErrorCode::kOutOfMemory) {
      std::fprintf(stderr, "fuzz harness: render ran out of memory: %s\n", e.what());
      require(false, "render stays within memory under the limits");
    }
    r.text = e.what();
    require(r.text.rfind("[chat_template] ", 0) == 0, "render's errors are [chat_template] errors");
    return r;
  }
  require(r.text.size() <= t.limits().max_output_bytes, "the rendered text is within max_output_bytes");
  return r;
}

// The fixed variables with the extra object's members merged over them; nullopt when the second part is not JSON.
template <typename Json>
std::optional<Json> variables(std::string_view extra, bool have_extra) {
  static const Json base = Json::parse(kBaseVariables);
  if (!have_extra) return base;
  Json x = Json::parse(extra.begin(), extra.end(), nullptr, /*allow_exceptions=*/false);
  if (x.is_discarded()) return std::nullopt;
  if (!x.is_object()) return x;  // render must refuse it (or take null) with a cider::Error
  Json v = base;
  for (auto it = x.begin(); it != x.end(); ++it) v[it.key()] = it.value();
  return v;
}

template <typename Json>
void render_all(const ChatTemplate& t, const ChatTemplate& copy, const std::optional<Json>& vars, bool deterministic) {
  if (!vars) return;
  const bool accepted = vars->is_object() || vars->is_null();
  const Outcome first = render_checked(t, *vars);
  if (!accepted) {
    require(!first.ok, "render refuses variables that are not a JSON object");
    return;
  }
  if (!deterministic) return;
  require(render_checked(t, *vars) == first, "rendering twice gives the same text (or the same error)");
  require(render_checked(copy, *vars) == first, "a copy of a ChatTemplate renders the same");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const cider::fuzz::Parts p = cider::fuzz::split_nul(data, size, 2);
  const std::string source(p.parts[0]);
  const bool have_extra = p.present > 1;
  const ChatTemplateLimits lim = fuzz_limits();

  std::optional<ChatTemplate> t;
  cider::fuzz::expect_errors([&] { t.emplace(source, lim); });
  if (!t) return 0;
  require(t->source() == source, "source() is the source given");
  require(t->limits().max_output_bytes == lim.max_output_bytes &&
              t->limits().max_loop_iterations == lim.max_loop_iterations,
          "limits() are the limits given");

  // Copies: copy-constructed, copy-assigned over another template, and moved.
  const ChatTemplate copy(*t);
  ChatTemplate assigned("x");
  assigned = copy;
  ChatTemplate moved(std::move(assigned));
  require(moved.source() == source, "a moved ChatTemplate keeps its source");

  const bool deterministic = source.find("strftime_now") == std::string::npos;
  render_all(*t, moved, variables<nlohmann::json>(p.parts[1], have_extra), deterministic);
  render_all(*t, copy, variables<nlohmann::ordered_json>(p.parts[1], have_extra), deterministic);
  return 0;
}
