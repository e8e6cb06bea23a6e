// `escala serve`: the OpenAI-compatible server (continuous-batching engine + cpp-httplib).
// SIGINT / SIGTERM: stop accepting, cancel in-flight requests, exit 0.
#include <fmt/format.h>
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "escala/engine.h"
#include "model/model_paths.h"
#include "model_options.h"
#include "server/http_server.h"

namespace escala::cli {

namespace {
struct ServeFlags {
  ModelFlags model;
  std::string host = "127.0.0.1";
  int port = 8080;
  int max_batch = 64;
  int64_t kv_budget = int64_t(1) << 30;
  int step_tokens = 512;
  int prefill_chunk = 16;
  int max_queue = 4096;
  int64_t max_body = 4 << 20;
  int http_threads = 0;
  std::string omp_spin = "3000";
};

Status run_serve(const ServeFlags& f) {
  // libgomp's default spin makes every parallel region of a forward cost up to a time slice on a
  // busy machine (docs/PERFORMANCE.md, Serving): a short spin, set by executing again.
  ESCALA_RETURN_IF_ERROR(check_omp_spin(f.omp_spin));
  reexec_with_omp_spin(f.omp_spin, "ESCALA_SERVE_REEXEC");
  if (!f.model.streaming.empty()) return Status::error("serve: --streaming is not supported (it disables prefix caching)");
  // Signals go to one thread that waits for them; block them before any other thread exists.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::string path = f.model.model;
  if (path.empty()) {
    auto d = model::default_model_path();
    if (!d.ok()) return d.status();
    path = *d;
  }
  model::ModelOptions o;
  o.threads = f.model.threads;
  auto kv = parse_dtype(f.model.kv_type);
  if (!kv) return Status::error(fmt::format("--kv-type must be f16, bf16, f32, int8 or fp8 (got '{}')", f.model.kv_type));
  o.kv_dtype = *kv;
  o.context = f.model.context;
  o.max_sequences = f.max_batch;
  o.kv_budget_bytes = f.kv_budget;
  auto m = model::Model::load(path, o);
  if (!m.ok()) return m.status();
  auto tok = model::Tokenizer::from_gguf((*m)->gguf());
  if (!tok.ok()) return tok.status();
  auto tmpl = model::ChatTemplate::for_model(*tok, f.model.chat_template);
  if (!tmpl.ok()) return tmpl.status();

  engine::EngineOptions eo;
  eo.max_batch = f.max_batch;
  eo.step_tokens = std::max(f.step_tokens, f.max_batch);
  eo.prefill_chunk = f.prefill_chunk;
  eo.max_context = f.model.context;
  eo.max_queue = f.max_queue;
  auto engine = engine::Engine::create(**m, *tok, eo);
  if (!engine.ok()) return engine.status();

  server::ServerOptions so;
  so.host = f.host;
  so.port = f.port;
  so.model_id = std::filesystem::path(path).stem().string();
  so.max_body_bytes = size_t(f.max_body);
  so.http_threads = f.http_threads > 0 ? f.http_threads : std::max(64, 4 * f.max_batch) + 16;
  auto server = server::HttpServer::create(**engine, *tok, *tmpl, so);
  if (!server.ok()) return server.status();
  ESCALA_RETURN_IF_ERROR((*server)->bind());

  server::HttpServer* srv = server->get();
  engine::Engine* eng = engine->get();
  std::atomic<bool> signalled{false};
  std::thread signal_thread([sigs, srv, eng, &signalled] {
    int sig = 0;
    sigset_t s = sigs;
    if (sigwait(&s, &sig) != 0) return;
    if (!signalled.exchange(true))
      std::fprintf(stderr, "escala serve: %s received, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    srv->stop();      // stop accepting; streams see the shutdown
    eng->shutdown();  // cancel whatever is in flight (their blocks are freed)
  });

  const auto cs = (*m)->cache().stats();
  std::fprintf(stderr,
               "escala serve: listening on http://%s:%d (model %s, context %d tokens, %lld KV blocks of %d tokens, "
               "max batch %d)\n",
               f.host.c_str(), srv->bound_port(), so.model_id.c_str(), eng->max_context(), (long long)cs.total_blocks,
               (*m)->cache().config().block_size, f.max_batch);
  std::fflush(stderr);
  Status st = srv->listen();
  // The listener ended (a signal, or an error): make sure the signal thread has run its course
  // before the engine and server go away.
  if (!signalled.exchange(true)) pthread_kill(signal_thread.native_handle(), SIGTERM);
  signal_thread.join();
  eng->shutdown();
  server->reset();
  engine->reset();
  return st;
}
}  // namespace

void add_serve_command(CLI::App& app, int& exit_code) {
  static ServeFlags flags;
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  add_model_flags(*cmd, flags.model);
  cmd->add_option("--host", flags.host, "Address to listen on (default 127.0.0.1: loopback only)");
  cmd->add_option("--port", flags.port, "Port (0: any free port)")->check(CLI::Range(0, 65535));
  cmd->add_option("--max-batch", flags.max_batch, "Sequences computed together at most")->check(CLI::Range(1, 4096));
  cmd->add_option("--kv-budget", flags.kv_budget, "KV cache bytes (default 1 GiB)")
      ->check(CLI::Range(int64_t(1) << 16, int64_t(1) << 40));
  cmd->add_option("--step-tokens", flags.step_tokens, "Tokens per engine step (decode + prefill chunks)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--prefill-chunk", flags.prefill_chunk,
                  "Prompt tokens per sequence per step (<= 16 keeps greedy output batch-invariant)")
      ->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--max-queue", flags.max_queue, "Waiting requests at most (then 429)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-body", flags.max_body, "Request body bytes at most (then 413)")
      ->check(CLI::Range(int64_t(1024), int64_t(1) << 30));
  cmd->add_option("--http-threads", flags.http_threads, "HTTP worker threads (default 4 x max batch + 16)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--omp-spin", flags.omp_spin,
                  "OpenMP wait before a thread sleeps: a spin count (GOMP_SPINCOUNT), passive, or keep the "
                  "runtime's default (default 3000; ignored when OMP_WAIT_POLICY or GOMP_SPINCOUNT is set)");
  cmd->callback([&exit_code] {
    Status st = run_serve(flags);
    if (!st.ok()) {
      std::fprintf(stderr, "escala: error: %s\n", st.message().c_str());
      exit_code = 1;
    }
  });
}

}  // namespace escala::cli
