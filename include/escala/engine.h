// The serving engine: a request queue and an iteration-level scheduler (continuous batching).
//
// One engine thread owns the model and its KV cache. Each step it
//   1. drops cancelled requests (their blocks are freed at once),
//   2. gives every running sequence its next tokens: one decode token, or a chunk of its prompt
//      (chunked prefill, at most prefill_chunk tokens per sequence and step_tokens per step),
//   3. admits waiting requests first come, first served while the KV cache has room for their
//      prompt (prefix-cached blocks are attached, not recomputed) and the batch is not full,
//   4. prepares the append; when blocks run out it preempts the newest running sequence (frees it
//      and puts it back at the front of the queue with its prompt and generated tokens, to be
//      recomputed later: never dropped) until the step fits,
//   5. runs one Model::forward over the whole batch and samples the sequences that reached the
//      end of their tokens.
// Clients submit requests from any thread and read their tokens and text from a RequestHandle,
// a thread-safe queue of events.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "escala/kv_cache.h"
#include "escala/sampler.h"
#include "escala/status.h"
#include "escala/tokenizer.h"

namespace escala::model {
class Model;
}

namespace escala::engine {

class JsonSchema;  // src/engine/json_schema.h

struct EngineOptions {
  int32_t max_batch = 64;      // running sequences at most
  int32_t step_tokens = 512;   // tokens per forward pass (decode + prefill chunks); >= max_batch
  // Prompt tokens of one sequence per step. At most 16 keeps every step on the attention decode
  // kernel, whose rows do not depend on what else is in the batch: greedy outputs are then the same
  // alone or batched (see docs/ARCHITECTURE.md, "Engine and server"). Larger: faster prefill.
  int32_t prefill_chunk = 16;
  int32_t max_context = 0;     // tokens per sequence (prompt + output); 0: the model's, capped
  int32_t max_queue = 4096;    // waiting requests at most (submit fails beyond)
};

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 128;        // generated tokens at most
  std::vector<std::string> stop;   // stop strings (not part of the output)
  bool ignore_eos = false;         // keep going past end-of-generation tokens
  // -1: off. Otherwise each generated token's event carries its log-probability and those of
  // this many (at most 20) most likely tokens (token_logprobs in sampler.h).
  int32_t logprobs = -1;
  // Structured output (OpenAI's response_format json_object or json_schema): only tokens that keep
  // the output a prefix of a JSON text the schema allows are sampled, and the request ends
  // ("stop") when the value is complete. JsonSchema::any_object() is JSON mode. Null: off.
  std::shared_ptr<const JsonSchema> json_schema;
  // Choices: the prompt is computed once, then its sequence forks (the KV blocks are shared,
  // copy-on-write) into n that sample independently, choice i with seed + i. At most max batch.
  int32_t n = 1;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

// What a client reads, per choice: new tokens with the text that became final, then one last event
// with `finished` set. A request of n choices ends after n finished events.
struct Event {
  int32_t index = 0;            // the choice (0 .. n-1)
  std::vector<int32_t> tokens;  // generated tokens since the last event
  std::vector<TokenLogprob> logprobs;  // one per token, when the request asked for them
  std::string text;             // text that became final (stop strings held back / cut)
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string error;            // reason == kError
  int64_t prompt_tokens = 0;    // on the last event: usage
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;    // prompt tokens served from the prefix cache (first admission)
};

class Engine;

// The client's end of one request. Thread-safe; keep it as long as you read.
class RequestHandle {
 public:
  uint64_t id() const { return id_; }
  // Waits up to `timeout` for events; returns them all (empty on timeout). After a choice's event
  // with `finished` set nothing more comes for that choice.
  std::vector<Event> wait(std::chrono::milliseconds timeout);
  // Asks the engine to stop this request; its blocks are freed at the start of the next step
  // (the engine looks at the flag every step, and at least every 50 ms when idle).
  void cancel();
  bool cancelled() const { return cancel_.load(); }

 private:
  friend class Engine;
  void push(Event e);
  uint64_t id_ = 0;
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
};

// Live figures for /metrics (a snapshot taken by the engine thread after every step).
struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  int64_t prompt_tokens = 0;        // prompt tokens computed (prefix hits and recomputation excluded)
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t steps = 0;
  double tokens_per_second = 0;     // generated, over the last few seconds
  // Time to first token: a histogram (seconds; bucket counts are cumulative, Prometheus style).
  std::vector<double> ttft_buckets;
  std::vector<int64_t> ttft_counts;
  double ttft_sum = 0;
  int64_t ttft_count = 0;
  kv::CacheStats cache;
};

class Engine {
 public:
  // The model (and its cache) must outlive the engine; the engine thread starts here.
  static Result<std::unique_ptr<Engine>> create(model::Model& model, const model::Tokenizer& tokenizer,
                                                const EngineOptions& options);
  ~Engine();  // cancels everything and joins the engine thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request (FCFS). Errors: bad sampling values, empty prompt, token ids
  // out of range, prompt + max_tokens beyond the context, queue full, engine stopped.
  Result<std::shared_ptr<RequestHandle>> submit(Request request);
  // Stops admitting, cancels every request (each gets its final event) and stops the thread.
  void shutdown();

  int32_t max_context() const;  // tokens per sequence, prompt included
  EngineStats stats() const;
  // Blocks until no request is running or waiting (tests).
  void wait_idle();

 private:
  friend class RequestHandle;
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace escala::engine
