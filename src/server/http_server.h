// The OpenAI-compatible HTTP server over the engine (cpp-httplib): /v1/completions,
// /v1/chat/completions (SSE streaming or not), /v1/models, /health, /metrics.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "escala/engine.h"
#include "escala/status.h"
#include "escala/tokenizer.h"

namespace escala::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;              // 0: any free port (bound_port() says which)
  std::string model_id;         // what /v1/models lists and requests must name
  size_t max_body_bytes = 4u << 20;
  int http_threads = 0;         // 0: enough for every running and waiting stream
};

class HttpServer {
 public:
  static Result<std::unique_ptr<HttpServer>> create(engine::Engine& engine, const model::Tokenizer& tokenizer,
                                                    const model::ChatTemplate& chat_template,
                                                    const ServerOptions& options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds; an error if the address is taken.
  Status bind();
  int bound_port() const;
  // Serves until stop(). In-flight streams end when the engine cancels their requests.
  Status listen();
  // Stops accepting and wakes listen(); callable from any thread (not from a signal handler).
  void stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Prometheus text for /metrics.
std::string metrics_text(const engine::EngineStats& s, const std::string& model_id);

}  // namespace escala::server
