// The continuous-batching engine: request queue, iteration-level scheduler, preemption by
// recomputation, cancellation. See include/escala/engine.h for the step.
#include "escala/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "engine/json_prefix.h"
#include "engine/stop_strings.h"
#include "escala/model.h"

namespace escala::engine {

namespace {
using Clock = std::chrono::steady_clock;

constexpr double kTtftBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
constexpr double kRateWindowSeconds = 5.0;

// One request inside the engine (engine thread only, once queued).
struct Seq {
  std::shared_ptr<RequestHandle> handle;
  Request req;
  kv::SeqId id = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens (what a preempted sequence recomputes)
  int64_t prompt_len = 0;
  int64_t computed = 0;  // tokens resident in the cache
  int64_t generated = 0;
  int64_t cached_tokens = 0;
  bool in_cache = false;
  bool admitted_once = false;
  bool first_token = false;
  int32_t index = 0;        // the choice this sequence produces
  int32_t fan_out = 1;      // > 1 until the prompt is computed: then it forks into that many choices
  std::shared_ptr<int32_t> open_choices;  // choices of the request not finished yet (shared by siblings)
  int64_t admitted_step = -1;
  Clock::time_point arrival;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<model::StreamDecoder> decoder;
  StopMatcher stops;
  std::optional<JsonPrefix> json;  // structured output: the recogniser over the output so far
};

struct Item {
  Seq* seq;
  int64_t n;  // tokens this step, from seq->computed
};
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    default: return "none";
  }
}

// ---- RequestHandle ----

std::vector<Event> RequestHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return !events_.empty(); });
  std::vector<Event> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

void RequestHandle::cancel() { cancel_.store(true); }

void RequestHandle::push(Event e) {
  {
    std::lock_guard lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
}

// ---- Engine ----

struct Engine::Impl {
  model::Model& model;
  model::Tokenizer tokenizer;
  EngineOptions options;
  kv::KvCache& cache;
  int32_t vocab = 0;
  int32_t context = 0;

  // Shared with clients.
  mutable std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<std::unique_ptr<Seq>> incoming;
  bool stop = false, stopped = false, idle = true;
  uint64_t next_handle = 1;
  // The last snapshot; its `waiting` counts the engine's queue only (requests taken from
  // `incoming` are added at once): stats() adds `incoming`, so that a request is counted as
  // waiting from submit() on, even during a long step.
  EngineStats published;

  // Engine thread only.
  std::deque<std::unique_ptr<Seq>> waiting;
  std::vector<std::unique_ptr<Seq>> running;  // admission order, oldest first
  kv::SeqId next_seq = 1;
  EngineStats st;
  std::deque<std::pair<Clock::time_point, int64_t>> rate_samples;
  std::vector<float> logits;
  std::unique_ptr<JsonTokenMasks> json_masks;  // made at the first structured-output request
  std::mutex join_mu;  // shutdown() may be called from several threads (signal thread, destructor)
  std::thread thread;

  Impl(model::Model& m, const model::Tokenizer& t, const EngineOptions& o)
      : model(m), tokenizer(t), options(o), cache(m.cache()) {}

  void run();
  void step();
  void drop_cancelled();
  void finish(Seq& s, FinishReason reason, Event ev, std::string error = {});
  void on_token(Seq& s, int32_t tok, TokenLogprob* logprob);
  void sample(Seq& s, std::span<const float> row_logits);
  std::vector<std::unique_ptr<Seq>> fork_choices(Seq& parent);
  void preempt(size_t running_index);
  void publish();
  int64_t watermark() const { return std::max<int64_t>(1, cache.num_blocks() / 100); }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Engine>> Engine::create(model::Model& model, const model::Tokenizer& tokenizer,
                                               const EngineOptions& options) {
  ESCALA_CHECK_ARG(options.max_batch >= 1 && options.max_batch <= 4096, "engine: max batch must be in [1, 4096] (got {})",
                   options.max_batch);
  ESCALA_CHECK_ARG(options.step_tokens >= options.max_batch, "engine: step tokens ({}) must be >= max batch ({})",
                   options.step_tokens, options.max_batch);
  ESCALA_CHECK_ARG(options.prefill_chunk >= 1, "engine: prefill chunk must be >= 1 (got {})", options.prefill_chunk);
  ESCALA_CHECK_ARG(options.max_context >= 0, "engine: max context must be >= 0 (got {})", options.max_context);
  ESCALA_CHECK_ARG(options.max_queue >= 1, "engine: max queue must be >= 1 (got {})", options.max_queue);
  auto impl = std::make_unique<Impl>(model, tokenizer, options);
  impl->vocab = model.info().vocab_size;
  // A sequence can hold at most the whole pool (one block of slack for the partial last block).
  const auto& cc = impl->cache.config();
  const int64_t groups = std::max<int64_t>(1, int64_t(cc.groups.size()));
  const int64_t pool_tokens = (impl->cache.num_blocks() / groups - 1) * cc.block_size;
  int64_t ctx = std::min<int64_t>(model.info().arch.context_length, 8192);
  if (options.max_context > 0) ctx = options.max_context;
  ctx = std::min(ctx, pool_tokens);
  ESCALA_CHECK_ARG(ctx >= 2, "engine: the KV cache holds only {} tokens per sequence", pool_tokens);
  impl->context = int32_t(ctx);
  for (double b : kTtftBuckets) impl->st.ttft_buckets.push_back(b);
  impl->st.ttft_counts.assign(impl->st.ttft_buckets.size(), 0);
  impl->published = impl->st;
  impl->published.cache = impl->cache.stats();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::~Engine() { shutdown(); }

int32_t Engine::max_context() const { return impl_->context; }

Result<std::shared_ptr<RequestHandle>> Engine::submit(Request r) {
  Impl& m = *impl_;
  ESCALA_RETURN_IF_ERROR(r.sampling.validate());
  ESCALA_CHECK_ARG(!r.prompt.empty(), "the prompt is empty");
  ESCALA_CHECK_ARG(r.max_tokens >= 0, "max_tokens must be >= 0 (got {})", r.max_tokens);
  ESCALA_CHECK_ARG(r.logprobs >= -1 && r.logprobs <= 20, "logprobs must be in [0, 20] or -1 (got {})", r.logprobs);
  ESCALA_CHECK_ARG(r.n >= 1 && r.n <= m.options.max_batch, "n must be in [1, {}] (the max batch) (got {})",
                   m.options.max_batch, r.n);
  for (const auto& [t, bias] : r.sampling.logit_bias)
    ESCALA_CHECK_ARG(t < m.vocab, "logit_bias: token id {} is out of range [0, {})", t, m.vocab);
  for (int32_t t : r.prompt)
    ESCALA_CHECK_ARG(t >= 0 && t < m.vocab, "token id {} is out of range [0, {})", t, m.vocab);
  for (const auto& s : r.stop) ESCALA_CHECK_ARG(!s.empty(), "stop strings must not be empty");
  ESCALA_CHECK_ARG(int64_t(r.prompt.size()) < m.context,
                   "the prompt has {} tokens; this server's context is {} tokens", r.prompt.size(), m.context);
  ESCALA_CHECK_ARG(int64_t(r.prompt.size()) + r.max_tokens <= m.context,
                   "the prompt ({} tokens) plus max_tokens ({}) exceeds the context of {} tokens", r.prompt.size(),
                   r.max_tokens, m.context);
  auto s = std::make_unique<Seq>();
  s->handle = std::make_shared<RequestHandle>();
  s->arrival = Clock::now();
  s->tokens = r.prompt;
  s->prompt_len = int64_t(r.prompt.size());
  s->sampler = std::make_unique<Sampler>(r.sampling);
  for (int32_t t : r.prompt) s->sampler->accept(t);
  s->decoder = std::make_unique<model::StreamDecoder>(m.tokenizer);
  s->stops = StopMatcher(r.stop);
  if (r.json_schema) s->json.emplace(r.json_schema.get());  // the schema lives in s->req
  s->fan_out = r.n;
  s->open_choices = std::make_shared<int32_t>(r.n);
  s->req = std::move(r);
  auto handle = s->handle;
  {
    std::lock_guard lock(m.mu);
    if (m.stop) return Status::error("the engine is shutting down");
    if (int64_t(m.incoming.size()) + m.published.waiting >= m.options.max_queue)
      return Status::error(fmt::format("the request queue is full ({} waiting)", m.options.max_queue));
    handle->id_ = m.next_handle++;
    if (s->req.max_tokens == 0) {  // nothing to compute
      for (int32_t i = 0; i < s->req.n; ++i) {
        Event ev;
        ev.index = i;
        ev.finished = true;
        ev.reason = FinishReason::kLength;
        ev.prompt_tokens = s->prompt_len;
        handle->push(std::move(ev));
      }
      return handle;
    }
    m.incoming.push_back(std::move(s));
    m.idle = false;
  }
  m.cv.notify_all();
  return handle;
}

void Engine::shutdown() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mu);
    m.stop = true;
  }
  m.cv.notify_all();
  std::lock_guard join_lock(m.join_mu);
  if (m.thread.joinable()) m.thread.join();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->mu);
  EngineStats s = impl_->published;
  s.waiting += int64_t(impl_->incoming.size());
  return s;
}

void Engine::wait_idle() {
  std::unique_lock lock(impl_->mu);
  impl_->idle_cv.wait(lock, [this] { return impl_->idle || impl_->stopped; });
}

// ---- the engine thread ----

void Engine::Impl::run() {
  for (;;) {
    {
      std::unique_lock lock(mu);
      while (!incoming.empty()) {
        waiting.push_back(std::move(incoming.front()));
        incoming.pop_front();
        ++published.waiting;  // still counted while the step runs (see stats())
      }
      if (stop) break;
      if (running.empty() && waiting.empty()) {
        idle = true;
        lock.unlock();
        publish();
        idle_cv.notify_all();
        lock.lock();
        cv.wait_for(lock, std::chrono::milliseconds(50), [this] { return stop || !incoming.empty(); });
        continue;
      }
    }
    step();
    publish();
  }
  // Shutdown: every request still here ends as cancelled, its blocks freed.
  {
    std::lock_guard lock(mu);
    while (!incoming.empty()) {
      waiting.push_back(std::move(incoming.front()));
      incoming.pop_front();
    }
  }
  for (auto& s : running) finish(*s, FinishReason::kCancelled, {});
  for (auto& s : waiting) finish(*s, FinishReason::kCancelled, {});
  running.clear();
  waiting.clear();
  publish();
  {
    std::lock_guard lock(mu);
    stopped = idle = true;
  }
  idle_cv.notify_all();
}

void Engine::Impl::finish(Seq& s, FinishReason reason, Event ev, std::string error) {
  if (s.in_cache) {
    (void)cache.free_sequence(s.id);
    s.in_cache = false;
  }
  // Text held back for a stop string or an incomplete character is final now (unless a stop
  // string cut it).
  if ((reason == FinishReason::kLength || reason == FinishReason::kStop) && !s.stops.stopped())
    ev.text += s.stops.push(s.decoder->flush()) + s.stops.flush();
  ev.index = s.index;
  ev.finished = true;
  ev.reason = reason;
  ev.error = std::move(error);
  ev.prompt_tokens = s.prompt_len;
  ev.completion_tokens = s.generated;
  ev.cached_tokens = s.cached_tokens;
  // Not forked yet: the choices that would have come from this sequence end with it.
  const int32_t ending = s.fan_out;
  *s.open_choices -= ending;
  if (*s.open_choices == 0) {  // the request's last choice: count the request once
    if (reason == FinishReason::kCancelled) ++st.requests_cancelled;
    else if (reason == FinishReason::kError) ++st.requests_failed;
    else ++st.requests_finished;
  }
  for (int32_t i = 1; i < ending; ++i) {
    Event other;
    other.index = s.index + i;
    other.finished = true;
    other.reason = reason;
    other.error = ev.error;
    other.prompt_tokens = s.prompt_len;
    s.handle->push(std::move(other));
  }
  s.handle->push(std::move(ev));
}

void Engine::Impl::drop_cancelled() {
  auto drop = [this](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if ((*it)->handle->cancelled()) {
        finish(**it, FinishReason::kCancelled, {});
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop(running);
  drop(waiting);
}

void Engine::Impl::preempt(size_t i) {
  std::unique_ptr<Seq> s = std::move(running[i]);
  running.erase(running.begin() + std::ptrdiff_t(i));
  (void)cache.free_sequence(s->id);
  s->in_cache = false;
  s->computed = 0;
  if (s->admitted_step != st.steps) ++st.preemptions;  // admitted this very step: just not admitted
  waiting.push_front(std::move(s));
}

void Engine::Impl::on_token(Seq& s, int32_t tok, TokenLogprob* logprob) {
  s.sampler->accept(tok);
  if (!s.first_token) {
    s.first_token = true;
    const double t = std::chrono::duration<double>(Clock::now() - s.arrival).count();
    for (size_t b = 0; b < st.ttft_buckets.size(); ++b)
      if (t <= st.ttft_buckets[b]) ++st.ttft_counts[b];
    st.ttft_sum += t;
    ++st.ttft_count;
  }
  Event ev;
  ev.index = s.index;
  if (!s.req.ignore_eos && tokenizer.is_end_of_generation(tok)) {
    finish(s, FinishReason::kStop, std::move(ev));
    return;
  }
  s.tokens.push_back(tok);
  ++s.generated;
  ++st.generated_tokens;
  ev.tokens.push_back(tok);
  if (logprob) ev.logprobs.push_back(std::move(*logprob));
  auto piece = s.decoder->push(tok);
  if (!piece.ok()) {
    finish(s, FinishReason::kError, std::move(ev), piece.message());
    return;
  }
  ev.text = s.stops.push(*piece);
  if (s.stops.stopped()) {
    finish(s, FinishReason::kStop, std::move(ev));
  } else if (s.generated >= s.req.max_tokens || int64_t(s.tokens.size()) >= context) {
    finish(s, FinishReason::kLength, std::move(ev));
  } else {
    s.handle->push(std::move(ev));
  }
}

void Engine::Impl::sample(Seq& s, std::span<const float> row_logits) {
  const std::vector<uint8_t>* allowed = nullptr;
  if (s.json) {
    if (!json_masks) json_masks = JsonTokenMasks::for_tokenizer(tokenizer);
    allowed = &json_masks->allowed(*s.json);
    if (std::find(allowed->begin(), allowed->end(), uint8_t(1)) == allowed->end()) {
      Event ev;
      ev.index = s.index;
      finish(s, FinishReason::kError, std::move(ev),
             "structured output: no token of this vocabulary continues the JSON value");
      return;
    }
  }
  const int32_t tok = s.sampler->sample(row_logits, allowed);
  if (s.json) (void)s.json->feed(json_masks->piece(tok));  // allowed, so it feeds
  if (s.req.logprobs >= 0) {
    TokenLogprob lp = token_logprobs(row_logits, tok, s.req.logprobs);
    on_token(s, tok, &lp);
  } else {
    on_token(s, tok, nullptr);
  }
  if (s.json && s.json->complete() && s.in_cache) {  // the value is whole: nothing may follow
    Event ev;
    ev.index = s.index;
    finish(s, FinishReason::kStop, std::move(ev));
  }
}

// Choices 1 .. n-1 of `parent` (choice 0 stays `parent`), each a fork of its computed prompt in the
// cache with its own sampler (seed + i), detokenizer and stop strings. A fork that fails ends its
// choice with an error; the others go on.
std::vector<std::unique_ptr<Seq>> Engine::Impl::fork_choices(Seq& parent) {
  std::vector<std::unique_ptr<Seq>> out;
  for (int32_t i = 1; i < parent.fan_out; ++i) {
    auto c = std::make_unique<Seq>();
    c->handle = parent.handle;
    c->req = parent.req;
    c->req.sampling.seed = parent.req.sampling.seed + uint64_t(i);
    c->tokens = parent.tokens;
    c->prompt_len = parent.prompt_len;
    c->computed = parent.computed;
    c->admitted_once = true;
    c->first_token = true;  // time to first token counts once per request
    c->admitted_step = parent.admitted_step;
    c->arrival = parent.arrival;
    c->sampler = std::make_unique<Sampler>(c->req.sampling);
    for (int32_t t : c->tokens) c->sampler->accept(t);
    c->decoder = std::make_unique<model::StreamDecoder>(tokenizer);
    c->stops = StopMatcher(c->req.stop);
    c->json = parent.json;
    c->index = parent.index + i;
    c->open_choices = parent.open_choices;
    c->id = next_seq++;
    const Status forked = cache.fork(parent.id, c->id);
    if (forked.ok()) c->in_cache = true;
    else finish(*c, FinishReason::kError, {}, forked.message());
    out.push_back(std::move(c));
  }
  parent.fan_out = 1;
  return out;
}

void Engine::Impl::step() {
  drop_cancelled();
  std::vector<Item> items;
  int64_t budget = options.step_tokens;
  // Decode tokens first (one per running sequence), then prompt chunks in admission order.
  for (auto& s : running)
    if (int64_t(s->tokens.size()) - s->computed == 1) {
      items.push_back({s.get(), 1});
      --budget;
    }
  for (auto& s : running) {
    const int64_t rest = int64_t(s->tokens.size()) - s->computed;
    if (rest <= 1 || budget <= 0) continue;
    const int64_t n = std::min<int64_t>({rest, options.prefill_chunk, budget});
    items.push_back({s.get(), n});
    budget -= n;
  }
  // Admission, first come first served: the head of the queue waits until its whole prompt fits.
  int64_t reserved = 0;
  // A request of n choices takes n places in the batch (it forks once its prompt is computed).
  int64_t places = 0;
  for (const auto& s : running) places += s->fan_out;
  while (!waiting.empty() && places + waiting.front()->fan_out <= options.max_batch && budget > 0) {
    Seq& s = *waiting.front();
    const kv::PromptProbe probe = cache.probe_prompt(s.tokens);
    if (probe.blocks_needed + reserved + watermark() > probe.blocks_available) {
      if (running.empty() && probe.blocks_needed > probe.blocks_available) {
        auto dead = std::move(waiting.front());
        waiting.pop_front();
        finish(*dead, FinishReason::kError, {}, "the prompt does not fit in the KV cache");
        continue;
      }
      if (!running.empty()) break;
    }
    kv::SeqOptions so;
    auto hit = cache.add_sequence(s.id = next_seq++, s.tokens, so);
    if (!hit.ok()) {
      auto dead = std::move(waiting.front());
      waiting.pop_front();
      finish(*dead, FinishReason::kError, {}, hit.message());
      continue;
    }
    s.in_cache = true;
    s.computed = *hit;
    s.admitted_step = st.steps;
    if (!s.admitted_once) {
      s.admitted_once = true;
      s.cached_tokens = *hit;
      st.prompt_tokens += s.prompt_len;
    }
    reserved += probe.blocks_needed;
    places += s.fan_out;
    const int64_t n = std::min<int64_t>({int64_t(s.tokens.size()) - s.computed, options.prefill_chunk, budget});
    items.push_back({&s, n});
    budget -= n;
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
  }
  if (items.empty()) return;

  // Find room: preempt the newest running sequence until the step fits.
  std::vector<kv::AppendRequest> reqs;
  Result<kv::AppendPlan> plan = Status::error("unplanned");
  for (;;) {
    reqs.clear();
    for (const Item& it : items)
      reqs.push_back({it.seq->id, std::span<const int32_t>(it.seq->tokens).subspan(size_t(it.seq->computed), size_t(it.n))});
    plan = cache.prepare_append(reqs);
    if (!plan.ok()) break;
    if (plan->fits()) break;
    if (running.size() <= 1) {
      // Alone and still short of blocks: the sequence outgrew the pool.
      Seq& s = *running.front();
      if (s.generated > 0) finish(s, FinishReason::kLength, {});
      else finish(s, FinishReason::kError, {}, "the request does not fit in the KV cache");
      running.clear();
      return;
    }
    Seq* victim = running.back().get();
    items.erase(std::remove_if(items.begin(), items.end(), [victim](const Item& it) { return it.seq == victim; }),
                items.end());
    preempt(running.size() - 1);
    if (items.empty()) return;
  }
  Status status = plan.ok() ? cache.apply(*plan) : plan.status();
  std::vector<model::StepSequence> batch;
  if (status.ok()) {
    for (size_t i = 0; i < items.size(); ++i) {
      const bool want = items[i].seq->computed + items[i].n == int64_t(items[i].seq->tokens.size());
      batch.push_back({items[i].seq->id, reqs[i].tokens, want});
    }
    status = model.forward(batch, logits);
  }
  ++st.steps;
  if (!status.ok()) {
    // A failed step fails the requests in it (their cache state is unknown); the rest go on.
    for (const Item& it : items) it.seq->handle->cancel();
    std::vector<std::unique_ptr<Seq>> keep;
    for (auto& s : running) {
      if (s->handle->cancelled()) finish(*s, FinishReason::kError, {}, status.message());
      else keep.push_back(std::move(s));
    }
    running = std::move(keep);
    return;
  }
  int64_t row = 0;
  std::vector<Seq*> done;
  for (size_t i = 0; i < items.size(); ++i) {
    Seq& s = *items[i].seq;
    s.computed += items[i].n;
    if (!batch[i].want_logits) continue;
    const auto row_logits = std::span<const float>(logits).subspan(size_t(row * vocab), size_t(vocab));
    ++row;
    // A request of n choices forks once its prompt is computed; every choice samples this row.
    std::vector<std::unique_ptr<Seq>> choices = s.fan_out > 1 ? fork_choices(s) : std::vector<std::unique_ptr<Seq>>{};
    sample(s, row_logits);
    for (auto& c : choices) {
      if (!c->in_cache) continue;  // its fork failed: already finished with the error
      sample(*c, row_logits);
      if (c->in_cache) running.push_back(std::move(c));
    }
  }
  // Sequences that finished (their cache entry is gone) leave the running list.
  running.erase(std::remove_if(running.begin(), running.end(), [](const std::unique_ptr<Seq>& s) { return !s->in_cache; }),
                running.end());
}

void Engine::Impl::publish() {
  const auto now = Clock::now();
  rate_samples.emplace_back(now, st.generated_tokens);
  while (rate_samples.size() > 2 &&
         std::chrono::duration<double>(now - rate_samples[1].first).count() > kRateWindowSeconds)
    rate_samples.pop_front();
  const double dt = std::chrono::duration<double>(now - rate_samples.front().first).count();
  st.tokens_per_second = dt > 0.05 ? double(st.generated_tokens - rate_samples.front().second) / dt : 0.0;
  st.running = int64_t(running.size());
  st.waiting = int64_t(waiting.size());
  st.cache = cache.stats();
  std::lock_guard lock(mu);
  published = st;
}

}  // namespace escala::engine
