#include "server/http_server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <ctime>

#include "server/protocol.h"

namespace escala::server {

using nlohmann::json;

namespace {
constexpr auto kPoll = std::chrono::milliseconds(50);

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

ApiError server_error(int status, std::string message, std::string type, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

// The socket a request came on. cpp-httplib 0.11 hands a handler neither the socket nor a way to
// ask whether the peer is still there (Request::is_connection_closed came in a later version), but
// the request carries both ends' addresses: the one open socket whose local port and peer address
// are the request's is its connection (a TCP 4-tuple names one connection at a time, and this one
// stays open while its handler runs). -1 if none is found.
int connection_socket(const std::string& peer_addr, int peer_port, int local_port) {
  if (peer_port < 0 || local_port < 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  auto port_of = [](const sockaddr_storage& a) {
    if (a.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
    if (a.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
    return -1;
  };
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat sb;
    if (fstat(int(fd), &sb) != 0 || !S_ISSOCK(sb.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &llen) != 0 || port_of(local) != local_port) continue;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &plen) != 0 || port_of(peer) != peer_port) continue;
    char host[NI_MAXHOST];  // formatted the way httplib formats Request::remote_addr
    if (getnameinfo(reinterpret_cast<sockaddr*>(&peer), plen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0 ||
        peer_addr != host)
      continue;
    found = int(fd);
    break;
  }
  closedir(dir);
  return found;
}

// Whether the client closed its end (FIN or reset), seen without reading or writing anything:
// POLLRDHUP is raised once the peer's FIN has arrived, even with unread data before it. A client
// that only shuts down its sending half (rare for HTTP) reads as gone too.
bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// Watches a request's connection: finds its socket on the first check (not before: most requests
// that end within one poll never need it) and says whether the client has gone.
class PeerWatch {
 public:
  explicit PeerWatch(const httplib::Request& req)
      : addr_(req.remote_addr), port_(req.remote_port), local_port_(req.local_port) {}
  bool gone() {
    if (fd_ == -2) fd_ = connection_socket(addr_, port_, local_port_);
    return peer_closed(fd_);
  }

 private:
  std::string addr_;
  int port_, local_port_;
  int fd_ = -2;  // -2: not looked up yet; -1: not found
};

// What a finished request reports as finish_reason (cancelled/error are not sent as such).
const char* finish_name(engine::FinishReason r) { return r == engine::FinishReason::kLength ? "length" : "stop"; }
}  // namespace

struct HttpServer::Impl {
  engine::Engine& engine;
  model::Tokenizer tokenizer;
  model::ChatTemplate chat_template;
  ServerOptions options;
  ProtocolContext ctx;
  httplib::Server svr;
  int port = -1;
  std::atomic<bool> stopping{false};
  std::atomic<uint64_t> next_id{1};
  int64_t started = std::time(nullptr);

  Impl(engine::Engine& e, const model::Tokenizer& t, const model::ChatTemplate& ct, const ServerOptions& o)
      : engine(e), tokenizer(t), chat_template(ct), options(o) {}

  void routes();
  void completion(const httplib::Request& req, httplib::Response& res, bool chat);
};

void HttpServer::Impl::routes() {
  ctx.model_id = options.model_id;
  ctx.tokenizer = &tokenizer;
  ctx.chat_template = &chat_template;
  ctx.max_context = engine.max_context();
  const int threads = options.http_threads > 0 ? options.http_threads : 256;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr.set_payload_max_length(options.max_body_bytes);
  svr.set_keep_alive_max_count(1000);

  svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, false); });
  svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { completion(q, r, true); });
  auto tokens_route = [this](auto handler) {
    return [this, handler](const httplib::Request& q, httplib::Response& r) {
      json out;
      if (auto e = handler(q.body, ctx, out)) return send_error(r, *e);
      r.set_content(dump(out), "application/json");
    };
  };
  svr.Post("/tokenize", tokens_route(tokenize_request));
  svr.Post("/detokenize", tokens_route(detokenize_request));
  auto model_json = [this] {
    return json{{"id", options.model_id},
                {"object", "model"},
                {"created", started},
                {"owned_by", "escala"},
                {"max_model_len", engine.max_context()}};
  };
  svr.Get("/v1/models", [model_json](const httplib::Request&, httplib::Response& r) {
    r.set_content(dump(json{{"object", "list"}, {"data", json::array({model_json()})}}), "application/json");
  });
  svr.Get(R"(/v1/models/(.+))", [this, model_json](const httplib::Request& q, httplib::Response& r) {
    if (q.matches[1] != options.model_id) {
      ApiError e = server_error(404, fmt::format("The model '{}' does not exist", std::string(q.matches[1])),
                                "invalid_request_error", "model_not_found");
      e.param = "model";
      return send_error(r, e);
    }
    r.set_content(dump(model_json()), "application/json");
  });
  svr.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
    if (stopping) return send_error(r, server_error(503, "the server is shutting down", "server_error", "shutting_down"));
    r.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
    r.set_content(metrics_text(engine.stats(), options.model_id), "text/plain; version=0.0.4");
  });

  // Errors httplib produces itself (unknown route, body too large, bad request line) get an
  // OpenAI-style body too.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = r.status;
    switch (r.status) {
      case 404: e.message = fmt::format("no route for {} {}", q.method, q.path); e.code = "not_found"; break;
      case 413: e.message = "the request body is too large"; e.code = "payload_too_large"; break;
      case 405: e.message = "method not allowed"; e.code = "method_not_allowed"; break;
      default: e.message = fmt::format("HTTP error {}", r.status); break;
    }
    if (r.status >= 500) e.type = "server_error";
    r.set_content(error_body(e), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    send_error(r, server_error(500, what, "server_error", "internal_error"));
  });
}

void HttpServer::Impl::completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (stopping) return send_error(res, server_error(503, "the server is shutting down", "server_error", "shutting_down"));
  ApiRequest ar;
  if (auto e = parse_request(req.body, chat, ctx, ar)) return send_error(res, *e);
  const bool want_logprobs = ar.request.logprobs >= 0;
  const int n = ar.request.n;
  auto submitted = engine.submit(std::move(ar.request));
  if (!submitted.ok()) {
    const std::string& m = submitted.message();
    if (m.find("queue is full") != std::string::npos)
      return send_error(res, server_error(429, m, "rate_limit_error", "queue_full"));
    if (m.find("shutting down") != std::string::npos)
      return send_error(res, server_error(503, m, "server_error", "shutting_down"));
    ApiError e;
    e.message = m;
    return send_error(res, e);
  }
  std::shared_ptr<engine::RequestHandle> handle = *submitted;
  const std::string id = fmt::format("{}-{:x}{:08x}", chat ? "chatcmpl" : "cmpl", next_id++, uint32_t(started));
  const int64_t created = std::time(nullptr);
  const std::string model = options.model_id;

  if (!ar.stream) {
    std::vector<ChoiceResult> choices(static_cast<size_t>(n));
    std::vector<std::vector<engine::TokenLogprob>> logprobs(static_cast<size_t>(n));
    Usage usage{};
    engine::FinishReason failed = engine::FinishReason::kNone;
    std::string error;
    PeerWatch watch(req);
    for (int finished = 0; finished < n;) {
      auto events = handle->wait(kPoll);
      for (auto& ev : events) {
        const size_t c = size_t(ev.index);
        choices[c].text += ev.text;
        for (auto& lp : ev.logprobs) logprobs[c].push_back(std::move(lp));
        if (!ev.finished) continue;
        ++finished;
        choices[c].finish_reason = finish_name(ev.reason);
        usage.prompt_tokens = ev.prompt_tokens;
        usage.completion_tokens += ev.completion_tokens;
        if (ev.index == 0) usage.cached_tokens = ev.cached_tokens;
        if (ev.reason == engine::FinishReason::kCancelled || ev.reason == engine::FinishReason::kError) {
          if (failed != engine::FinishReason::kError) failed = ev.reason, error = ev.error;
          handle->cancel();  // one choice failed: the answer cannot be whole, stop the others
        }
      }
      // Nothing is written before the answer is complete, so a client that hangs up is seen on
      // its socket: cancel, which frees the blocks (the final events follow).
      if (finished < n && !handle->cancelled() && watch.gone()) handle->cancel();
    }
    if (failed == engine::FinishReason::kError)
      return send_error(res, server_error(500, error, "server_error", "internal_error"));
    if (failed == engine::FinishReason::kCancelled && watch.gone())
      return send_error(res, server_error(499, "the client closed the connection", "server_error", "cancelled"));
    if (failed == engine::FinishReason::kCancelled)
      return send_error(res, server_error(503, "the request was cancelled (server shutting down)", "server_error",
                                          "cancelled"));
    for (size_t c = 0; c < choices.size(); ++c) {
      int64_t offset = 0;
      choices[c].logprobs = want_logprobs ? logprobs_json(chat, logprobs[c], tokenizer, offset) : json(nullptr);
    }
    res.set_content(dump(completion_response(chat, id, created, model, choices, usage)), "application/json");
    return;
  }

  struct Stream {
    std::shared_ptr<engine::RequestHandle> handle;
    PeerWatch watch;
    int n = 1, finished_choices = 0;
    bool started = false, finished = false;
    Usage usage{};
    std::vector<int64_t> text_offset{};  // completions' logprobs.text_offset per choice, across chunks
  };
  auto st = std::make_shared<Stream>(Stream{handle, PeerWatch(req), n});
  st->text_offset.assign(size_t(n), 0);
  const bool include_usage = ar.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, chat, id, created, model, include_usage, want_logprobs](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          st->handle->cancel();  // the client is gone: free its blocks
          return false;
        };
        if (!st->started) {
          st->started = true;
          if (chat)  // each choice's role first, as OpenAI does
            for (int c = 0; c < st->n; ++c)
              if (!write(sse(stream_chunk(true, id, created, model, c, "", nullptr, true)))) return false;
        }
        auto events = st->handle->wait(kPoll);
        // A request still queued (or prefilling) writes nothing, so a client gone meanwhile is seen
        // on its socket; a write would notice only at the second attempt after the hang-up.
        if (st->watch.gone()) {
          st->handle->cancel();
          return false;
        }
        for (auto& ev : events) {
          // A token's log-probabilities go with the chunk of its event, even when its text is held
          // back (a possible stop string, an incomplete character).
          if (!ev.text.empty() || (want_logprobs && !ev.logprobs.empty())) {
            const json lp = want_logprobs ? logprobs_json(chat, ev.logprobs, tokenizer, st->text_offset[size_t(ev.index)])
                                          : json(nullptr);
            if (!write(sse(stream_chunk(chat, id, created, model, ev.index, ev.text, nullptr, false, lp)))) return false;
          }
          if (!ev.finished) continue;
          if (ev.reason == engine::FinishReason::kCancelled || ev.reason == engine::FinishReason::kError) {
            // One choice failed: report it, end the stream and stop the other choices.
            st->finished = true;
            st->handle->cancel();
            const ApiError e = ev.reason == engine::FinishReason::kError
                                   ? server_error(500, ev.error, "server_error", "internal_error")
                                   : server_error(503, "the request was cancelled", "server_error", "cancelled");
            if (!write("data: " + error_body(e) + "\n\n")) return false;
            if (!write("data: [DONE]\n\n")) return false;
            sink.done();
            return true;
          }
          if (!write(sse(stream_chunk(chat, id, created, model, ev.index, "", finish_name(ev.reason), false))))
            return false;
          st->usage.prompt_tokens = ev.prompt_tokens;
          st->usage.completion_tokens += ev.completion_tokens;
          if (ev.index == 0) st->usage.cached_tokens = ev.cached_tokens;
          if (++st->finished_choices < st->n) continue;
          st->finished = true;
          if (include_usage && !write(sse(usage_chunk(chat, id, created, model, st->usage)))) return false;
          if (!write("data: [DONE]\n\n")) return false;
          sink.done();
          return true;
        }
        return true;
      },
      [st](bool) {
        if (!st->finished) st->handle->cancel();  // connection closed or server stopping
      });
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { stop(); }

Result<std::unique_ptr<HttpServer>> HttpServer::create(engine::Engine& engine, const model::Tokenizer& tokenizer,
                                                       const model::ChatTemplate& chat_template,
                                                       const ServerOptions& options) {
  ESCALA_CHECK_ARG(options.port >= 0 && options.port <= 65535, "serve: port must be in [0, 65535] (got {})", options.port);
  ESCALA_CHECK_ARG(!options.model_id.empty(), "serve: empty model id");
  auto impl = std::make_unique<Impl>(engine, tokenizer, chat_template, options);
  impl->routes();
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

Status HttpServer::bind() {
  Impl& m = *impl_;
  if (m.options.port == 0) {
    m.port = m.svr.bind_to_any_port(m.options.host);
    if (m.port < 0) return Status::error(fmt::format("serve: cannot bind {}:0", m.options.host));
  } else {
    if (!m.svr.bind_to_port(m.options.host, m.options.port))
      return Status::error(fmt::format("serve: cannot bind {}:{} (in use, or not a local address?)", m.options.host,
                                       m.options.port));
    m.port = m.options.port;
  }
  return {};
}

int HttpServer::bound_port() const { return impl_->port; }

Status HttpServer::listen() {
  if (impl_->port < 0) ESCALA_RETURN_IF_ERROR(bind());
  if (!impl_->svr.listen_after_bind() && !impl_->stopping) return Status::error("serve: the listener failed");
  return {};
}

void HttpServer::stop() {
  impl_->stopping = true;
  impl_->svr.stop();
}

}  // namespace escala::server
