#include "apps/serve.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>

#include "core/error.h"
#include "core/file_io.h"
#include "model/chat_template.h"
#include "model/chat_format.h"
#include "runtime/engine.h"
#include "runtime/openai_api.h"
#include "runtime/prompt_cache.h"

namespace cider::apps {

namespace {

namespace fs = std::filesystem;
using runtime::ApiError;
using runtime::Endpoint;

std::atomic<int> g_signal{0};
extern "C" void on_signal(int s) { g_signal.store(s); }

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", prefix, static_cast<unsigned long long>(salt),
                static_cast<unsigned long long>(++counter));
  return buf;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(e.body(), "application/json");
}

// The numeric host and port of a socket address, as httplib writes a request's remote_addr and remote_port.
bool numeric_address(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

// The socket of a request's connection, or -1. httplib 0.11 (Debian 12's) gives a handler no way to it (later versions
// have Request::is_connection_closed), so it is looked up among the process's descriptors by its two addresses: the
// one socket whose local and peer address and port are the request's. The descriptor stays this connection's while
// the handler runs (httplib closes it after).
int connection_socket(const httplib::Request& req) {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(d)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
      continue;
    std::string lh, ph;
    int lp = 0, pp = 0;
    if (numeric_address(local, ll, lh, lp) && numeric_address(peer, pl, ph, pp) && pp == req.remote_port &&
        ph == req.remote_addr && lp == req.local_port && lh == req.local_addr) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

// Whether the client closed its side: a hang-up or error, or a read would return end-of-file (MSG_PEEK leaves the
// bytes of a pipelined next request to httplib).
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) return true;
  char c;
  return (p.revents & POLLIN) && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

// The streaming side of one request: the provider is called again and again until it says done.
struct StreamState {
  runtime::ApiRequest request;
  std::shared_ptr<runtime::Request> handle;
  std::string id;
  int64_t created = 0;
  bool first = true;
  bool done = false;
};

}  // namespace

int run_serve(ServeArgs a) {
  constexpr const char* op = "serve";
  check(a.port >= 0 && a.port <= 65535, ErrorCode::kInvalidArgument, op, "--port must be in [0, 65535]; got ", a.port);
  check(a.max_batch >= 1 && a.max_batch <= 1024, ErrorCode::kInvalidArgument, op,
        "--max-batch must be in [1, 1024]; got ", a.max_batch);
  check(a.max_waiting >= 0 && a.max_waiting <= 4096, ErrorCode::kInvalidArgument, op,
        "--max-waiting must be in [0, 4096]; got ", a.max_waiting);
  check(a.prefix_cache >= 0 && a.prefix_cache <= 4096, ErrorCode::kInvalidArgument, op,
        "--prefix-cache must be in [0, 4096]; got ", a.prefix_cache);
  check(a.prompt_cache.empty() || a.prefix_cache > 0, ErrorCode::kInvalidArgument, op,
        "--prompt-cache keeps the prefix cache on disk: it needs --prefix-cache > 0; got ", a.prefix_cache);
  check(a.step_tokens >= 0 && a.step_tokens <= 65536, ErrorCode::kInvalidArgument, op,
        "--step-tokens must be in [0, 65536] (0: one pass of the model); got ", a.step_tokens);
  check(a.max_body >= 1024, ErrorCode::kInvalidArgument, op, "--max-body must be >= 1024 bytes; got ", a.max_body);
  check(a.drain_seconds >= 0.0 && a.drain_seconds <= 3600.0, ErrorCode::kInvalidArgument, op,
        "--drain-seconds must be in [0, 3600]; got ", a.drain_seconds);
  const int64_t kv_memory = a.kv_memory.empty() ? 0 : parse_byte_count(a.kv_memory, "--kv-memory");
  check(a.kv_memory.empty() || kv_memory > 0, ErrorCode::kInvalidArgument, op, "--kv-memory must be > 0; got ",
        a.kv_memory);
  if (a.api_key.empty())
    if (const char* k = std::getenv("CIDER_API_KEY")) a.api_key = k;
  if (!a.chat_format.empty()) (void)model::parse_chat_format(a.chat_format);
  const model::ModelOptions opts = model_options(a.m);
  // Before the load (the engine checks Model::can_snapshot again): a tensor-parallel model's sessions are split over
  // its GPUs and are not copied to the host.
  check(a.prompt_cache.empty() || opts.tp <= 1, ErrorCode::kUnsupported, op,
        "--prompt-cache needs sessions whose KV the host can copy (the cpu's, or one GPU's); --tp ", opts.tp,
        " splits them over the GPUs");
  const std::string path = resolve_model_path(a.m);
  auto model = load_model(a.m, opts, path);
  const model::ChatFormat format = chat_format_for(*model, a.chat_format);
  // The chat prompt: --chat-format (built-in) wins, then --chat-template FILE, then the model's own template (one this
  // renderer cannot parse falls back to the built-in format, with a warning), then the built-in format.
  std::optional<model::ChatTemplate> chat_template;
  std::string template_origin = "built-in " + std::string(model::chat_format_name(format));
  if (a.chat_format.empty() && !a.chat_template.empty()) {
    chat_template.emplace(read_text_input(a.chat_template, op, int64_t{16} << 20));
    template_origin = "template " + a.chat_template;
  } else if (a.chat_format.empty() && !model->chat_template().empty()) {
    try {
      chat_template.emplace(model->chat_template());
      template_origin = "the model's chat template";
    } catch (const Error& e) {
      std::fprintf(stderr, "cider serve: warning: the model's chat template cannot be used (%s); chat prompts use the "
                   "built-in %s format\n", e.what(), model::chat_format_name(format));
    }
  }
  std::string name = a.model_name;
  if (name.empty()) {
    fs::path p(path);
    if (p.filename().empty()) p = p.parent_path();
    name = p.filename().string();
  }

  runtime::EngineOptions eo;
  eo.max_batch = a.max_batch;
  eo.kv_memory = kv_memory;
  eo.max_waiting = a.max_waiting;
  eo.step_tokens = a.step_tokens;
  eo.prefix_cache_entries = a.prefix_cache;
  eo.share_prefixes = !a.no_prefix_sharing;
  if (!a.prompt_cache.empty()) {
    eo.prompt_cache_dir = a.prompt_cache;
    eo.model_identity = runtime::model_identity(*model, path);
    eo.warn = [](const std::string& m) {
      std::fprintf(stderr, "cider serve: warning: %s\n", m.c_str());
      std::fflush(stderr);
    };
  }
  runtime::Engine engine(*model, eo);
  if (!a.prompt_cache.empty())
    std::fprintf(stderr, "cider serve: prompt cache %s: %lld entries loaded\n", a.prompt_cache.c_str(),
                 static_cast<long long>(engine.stats().prompt_cache_loaded));
  const runtime::OpenAIApi api(*model, name, format, std::move(chat_template));
  const int64_t started = static_cast<int64_t>(std::time(nullptr));

  httplib::Server svr;
  // Every streaming request holds a connection thread: enough for the batch, the queue and a few plain requests.
  const size_t threads = static_cast<size_t>(a.max_batch + a.max_waiting + 8);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(static_cast<size_t>(a.max_body));
  svr.set_keep_alive_timeout(2);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on the same port binds too and
  // the kernel splits the connections between the two.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, reinterpret_cast<const void*>(&yes), sizeof(yes));
  });

  svr.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (a.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + a.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401, "invalid_request_error",
                             "a valid API key is required: send the header 'Authorization: Bearer <key>'"));
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      send_error(res, ApiError(404, "invalid_request_error", "no route " + req.method + " " + req.path));
    else if (res.status == 413)
      send_error(res, ApiError(413, "invalid_request_error", "the request body is larger than the server's limit (--max-body)"));
    else
      send_error(res, ApiError(res.status, "invalid_request_error", std::string("HTTP ") + std::to_string(res.status)));
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "server_error", what));
  });

  svr.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    const auto st = engine.stats();
    res.set_content("{\"status\":\"ok\",\"running\":" + std::to_string(st.running) +
                        ",\"waiting\":" + std::to_string(st.waiting) + "}",
                    "application/json");
  });
  svr.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(engine.metrics_text(), "text/plain; version=0.0.4");
  });
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(api.models_json(started), "application/json");
  });
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kChatPage, "text/html; charset=utf-8"); });

  // The body is read through a content reader: whatever its Content-Type, it is the JSON text (httplib would
  // otherwise parse a form-encoded body itself, with a limit of its own). --max-body still applies (413).
  const auto completion = [&](Endpoint ep) {
    return [&, ep](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      const bool read = reader([&](const char* data, size_t n) {
        if (body.size() + n > static_cast<size_t>(a.max_body)) return false;
        body.append(data, n);
        return true;
      });
      if (!read)
        return send_error(res, ApiError(413, "invalid_request_error",
                                        "the request body is larger than the server's limit (--max-body " +
                                            std::to_string(a.max_body) + " bytes)"));
      runtime::ApiRequest r;
      std::shared_ptr<runtime::Request> h;
      try {
        r = api.parse(body, ep);
        const auto st = engine.submit(r.options, h);
        if (st == runtime::Engine::Submit::kBusy) {
          res.set_header("Retry-After", "1");
          return send_error(res, ApiError(429, "rate_limit_error",
                                          "the server is at capacity: " + std::to_string(a.max_batch) + " running and " +
                                              std::to_string(a.max_waiting) + " waiting requests; retry later"));
        }
        if (st == runtime::Engine::Submit::kDraining) {
          res.set_header("Retry-After", "5");
          return send_error(res, ApiError(503, "server_error", "the server is shutting down"));
        }
      } catch (const ApiError& e) {
        return send_error(res, e);
      } catch (const Error& e) {
        return send_error(res, ApiError(e.code() == ErrorCode::kInternal ? 500 : 400, "invalid_request_error", e.what()));
      }
      const std::string id = new_id(ep == Endpoint::kChat ? "chatcmpl" : "cmpl");
      const int64_t created = static_cast<int64_t>(std::time(nullptr));
      if (!r.stream) {
        std::string text;
        std::vector<runtime::TokenLogprob> lps;
        runtime::RequestUpdate u;
        // A client that goes away is noticed within one wait: its sequence is cancelled (and its KV released).
        const int sock = connection_socket(req);
        bool gone = false;
        while (true) {
          u = h->wait(std::chrono::milliseconds(100));
          text += u.text;
          for (auto& l : u.logprobs) lps.push_back(std::move(l));
          if (u.finished) break;
          if (!gone && sock >= 0 && peer_closed(sock)) {
            gone = true;
            h->cancel();
          }
        }
        if (gone) return;  // nobody to answer
        if (u.reason == runtime::FinishReason::kError) return send_error(res, ApiError(500, "server_error", u.error));
        if (u.reason == runtime::FinishReason::kCancelled)
          return send_error(res, ApiError(503, "server_error", "the server stopped before the request finished"));
        res.set_content(api.response(r, id, created, text, lps, u), "application/json");
        return;
      }
      auto state = std::make_shared<StreamState>();
      state->request = std::move(r);
      state->handle = h;
      state->id = id;
      state->created = created;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [state, &api](size_t, httplib::DataSink& sink) {
            if (state->done) {
              sink.done();
              return true;
            }
            runtime::RequestUpdate u = state->handle->wait(std::chrono::milliseconds(100));
            if (!sink.is_writable()) {
              state->handle->cancel();
              return false;
            }
            if (!state->first && !u.finished && u.text.empty() && u.logprobs.empty()) return true;
            std::string ev;
            if (u.finished && (u.reason == runtime::FinishReason::kError || u.reason == runtime::FinishReason::kCancelled)) {
              const ApiError e(u.reason == runtime::FinishReason::kError ? 500 : 503, "server_error",
                               u.reason == runtime::FinishReason::kError ? u.error : "the server stopped");
              ev = "data: " + e.body() + "\n\ndata: [DONE]\n\n";
            } else {
              ev = api.stream_events(state->request, state->id, state->created, u, state->first);
            }
            state->first = false;
            if (!ev.empty() && !sink.write(ev.data(), ev.size())) {
              state->handle->cancel();
              return false;
            }
            if (u.finished) {
              state->done = true;
              sink.done();
            }
            return true;
          },
          [state](bool) { state->handle->cancel(); });  // a no-op once finished; frees the KV of a dropped stream
    };
  };
  svr.Post("/v1/completions", completion(Endpoint::kCompletions));
  svr.Post("/v1/chat/completions", completion(Endpoint::kChat));

  int port = a.port;
  if (port == 0) {
    port = svr.bind_to_any_port(a.host);
    check(port > 0, ErrorCode::kIo, op, "could not bind to any port on ", a.host);
  } else {
    check(svr.bind_to_port(a.host, port), ErrorCode::kIo, op, "could not bind to ", a.host, ":", port,
          " (in use, or not an address of this machine)");
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::atomic<bool> listen_returned{false};
  std::thread listener([&] {
    svr.listen_after_bind();
    listen_returned.store(true);
  });
  std::fprintf(stderr, "cider serve: %s (%s; chat: %s), batch %lld, KV memory %s, listening on http://%s:%d\n",
               name.c_str(), describe(opts).c_str(), template_origin.c_str(), static_cast<long long>(a.max_batch),
               model::format_bytes(static_cast<double>(engine.stats().kv_memory)).c_str(), a.host.c_str(), port);
  std::fflush(stderr);
  while (g_signal.load() == 0 && !listen_returned.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (g_signal.load() == 0) {
    // listen_after_bind returned by itself: an error of the listening socket.
    listener.join();
    fail(ErrorCode::kIo, op, "the server stopped listening on ", a.host, ":", port);
  }
  std::fprintf(stderr, "cider serve: signal %d: finishing running requests (up to %.0f s), refusing new ones\n",
               g_signal.load(), a.drain_seconds);
  const bool idle = engine.drain(std::chrono::milliseconds(static_cast<int64_t>(a.drain_seconds * 1000.0)));
  if (!idle) {
    // Out of time: the running requests end as cancelled, and their streams get an error event and [DONE] before
    // the sockets close.
    engine.cancel_all();
    (void)engine.drain(std::chrono::milliseconds(2000));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  svr.stop();
  listener.join();
  std::fprintf(stderr, "cider serve: stopped%s\n", idle ? "" : " (requests still running were cancelled)");
  return 0;
}

}  // namespace cider::apps
