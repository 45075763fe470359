// `cider serve`: an OpenAI-compatible HTTP server (Debian's cpp-httplib) over runtime::Engine (continuous batching,
// KV-memory-bounded admission, prefix cache) and runtime::OpenAIApi (the protocol). docs/serve.md describes it.
#pragma once

#include <cstdint>
#include <string>

#include "apps/cli.h"

namespace cider::apps {

struct ServeArgs {
  ModelArgs m;
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0: any free port (printed)
  int64_t max_batch = 8;           // sequences decoded together
  std::string kv_memory;           // a byte count; "": max_batch full contexts
  int64_t max_waiting = 64;        // queued requests beyond the batch; more get 429
  int64_t prefix_cache = 16;       // finished sequences kept for prefix reuse (0: off)
  bool no_prefix_sharing = false;  // copy reused prefixes instead of sharing their blocks
  std::string prompt_cache;        // a directory keeping the prefix cache across restarts; "": in memory only
  int64_t step_tokens = 0;         // rows per batched forward (decode rows, then prompt chunks); 0: one pass
  std::string api_key;             // "": no key (also $CIDER_API_KEY)
  std::string chat_format;         // a built-in format; "": the model's template, else the model's built-in format
  std::string chat_template;       // a Jinja template file, instead of the model's own
  std::string model_name;          // "": the model file or directory name
  int64_t max_body = 1 << 20;      // request body limit in bytes (413 above)
  double drain_seconds = 30.0;     // on SIGINT/SIGTERM: how long running requests may finish
};
int run_serve(ServeArgs a);

// The chat page served at "/" (apps/chat_page.cpp): one static HTML document, no external resources.
extern const char* const kChatPage;

}  // namespace cider::apps
