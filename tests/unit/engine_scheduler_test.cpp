// The continuous-batching engine on a tiny random-weight model: batched greedy output equals the
// same request run alone (bit-exact logits), preemption under a tiny KV budget completes every
// request, cancellation frees blocks, the pool returns to empty.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/json_prefix.h"
#include "engine/stop_strings.h"
#include "engine_fixture.h"
#include "escala/engine.h"
#include "json_reference.h"

namespace escala::engine {
namespace {

using testing::kVocab;

struct Outcome {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// The n choices of a request, by index, once all have finished.
std::vector<Outcome> drain_choices(RequestHandle& h, int n) {
  std::vector<Outcome> o(static_cast<size_t>(n));
  std::vector<int> finished(static_cast<size_t>(n), 0);
  for (int done = 0; done < n;) {
    for (auto& ev : h.wait(std::chrono::milliseconds(100))) {
      EXPECT_TRUE(ev.index >= 0 && ev.index < n) << ev.index;
      if (ev.index < 0 || ev.index >= n) continue;
      Outcome& c = o[size_t(ev.index)];
      EXPECT_EQ(finished[size_t(ev.index)], 0) << "an event after choice " << ev.index << " finished";
      c.tokens.insert(c.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      c.text += ev.text;
      if (ev.finished) {
        c.reason = ev.reason;
        c.prompt_tokens = ev.prompt_tokens;
        c.completion_tokens = ev.completion_tokens;
        ++finished[size_t(ev.index)];
        ++done;
      }
    }
  }
  return o;
}

Outcome drain(RequestHandle& h) { return drain_choices(h, 1)[0]; }

// Prompts of mixed lengths; every fourth shares a 40-token prefix (prefix-cache hits).
std::vector<Request> make_requests(int n, int max_tokens, float temperature = 0.0f) {
  std::mt19937 rng(77);
  std::uniform_int_distribution<int> tok(0, 255), len(3, 70);
  std::vector<int32_t> shared(40);
  for (auto& t : shared) t = tok(rng);
  std::vector<Request> out;
  for (int i = 0; i < n; ++i) {
    Request r;
    if (i % 4 == 0) r.prompt = shared;
    const int l = len(rng);
    for (int k = 0; k < l; ++k) r.prompt.push_back(tok(rng));
    r.sampling.temperature = temperature;
    r.sampling.seed = uint64_t(1000 + i);
    r.max_tokens = max_tokens + i % 7;
    r.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<Outcome> run_alone(Engine& e, const std::vector<Request>& reqs) {
  std::vector<Outcome> out;
  for (const auto& r : reqs) {
    auto h = e.submit(r);
    EXPECT_TRUE(h.ok()) << h.message();
    out.push_back(drain(**h));
  }
  return out;
}

std::vector<Outcome> run_together(Engine& e, const std::vector<Request>& reqs) {
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (const auto& r : reqs) {
    auto h = e.submit(r);
    EXPECT_TRUE(h.ok()) << h.message();
    hs.push_back(*h);
  }
  std::vector<Outcome> out;
  for (auto& h : hs) out.push_back(drain(*h));
  return out;
}

void expect_pool_empty(model::Model& m, Engine& e) {
  e.wait_idle();
  const auto st = m.cache().stats();
  EXPECT_EQ(st.used_blocks, 0);
  EXPECT_EQ(st.sequences, 0);
  EXPECT_TRUE(m.cache().check_invariants().ok()) << m.cache().check_invariants().message();
  EXPECT_EQ(e.stats().cache.used_blocks, 0);
}

// The cause of any batch dependence, exposed directly: the logits of a sequence computed in
// chunks of <= 16 tokens (the engine's default), alone or next to other sequences, bit for bit.
TEST(EngineBatchInvariance, ForwardRowsDoNotDependOnTheBatch) {
  auto alone = testing::tiny_model();
  auto mixed = testing::tiny_model();
  ASSERT_TRUE(alone && mixed);
  std::mt19937 rng(5);
  std::vector<int32_t> a(45), b(30), c(7);
  for (auto* v : {&a, &b, &c}) {
    for (auto& t : *v) t = int32_t(rng() % 256);
  }
  auto step = [](model::Model& m, std::vector<std::pair<kv::SeqId, std::span<const int32_t>>> parts,
                 std::vector<float>& logits) {
    std::vector<kv::AppendRequest> reqs;
    std::vector<model::StepSequence> batch;
    for (auto& [id, toks] : parts) {
      if (!m.cache().contains(id)) {
        ASSERT_TRUE(m.cache().add_sequence(id).ok());
      }
      reqs.push_back({id, toks});
      batch.push_back({id, toks, true});
    }
    auto plan = m.cache().prepare_append(reqs);
    ASSERT_TRUE(plan.ok() && plan->fits());
    ASSERT_TRUE(m.cache().apply(*plan).ok());
    ASSERT_TRUE(m.forward(batch, logits).ok());
  };
  std::vector<float> la, lm;
  const std::span<const int32_t> A(a), B(b), C(c);
  // Alone: A in chunks 16, 16, 13.
  step(*alone, {{1, A.subspan(0, 16)}}, la);
  step(*alone, {{1, A.subspan(16, 16)}}, la);
  step(*alone, {{1, A.subspan(32)}}, la);
  // Mixed: A in chunks 5, 16, 16, 8 next to B and C at other offsets.
  step(*mixed, {{2, B.subspan(0, 16)}, {1, A.subspan(0, 5)}, {3, C}}, lm);
  step(*mixed, {{1, A.subspan(5, 16)}, {2, B.subspan(16, 14)}}, lm);
  step(*mixed, {{3, std::span<const int32_t>(&a[0], 1)}, {1, A.subspan(21, 16)}}, lm);
  step(*mixed, {{1, A.subspan(37)}, {2, std::span<const int32_t>(&a[1], 1)}}, lm);
  ASSERT_EQ(la.size(), size_t(kVocab));
  ASSERT_EQ(lm.size(), size_t(2 * kVocab));
  for (int i = 0; i < kVocab; ++i) ASSERT_EQ(la[size_t(i)], lm[size_t(i)]) << "logit " << i;
}

TEST(EngineScheduler, GreedyBatchOf64EqualsAlone) {
  const auto reqs = make_requests(64, 12);
  auto m1 = testing::tiny_model();
  auto e1 = Engine::create(*m1, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(e1.ok()) << e1.message();
  const auto alone = run_alone(**e1, reqs);
  auto m2 = testing::tiny_model();
  auto e2 = Engine::create(*m2, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(e2.ok());
  const auto together = run_together(**e2, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(alone[i].reason, FinishReason::kLength);
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(together[i].text, alone[i].text) << "request " << i;
    EXPECT_EQ(int64_t(together[i].tokens.size()), int64_t(reqs[i].max_tokens));
    EXPECT_EQ(together[i].completion_tokens, reqs[i].max_tokens);
  }
  EXPECT_GT((*e2)->stats().cache.prefix_hit_tokens, 0);  // the shared prefix was not recomputed
  expect_pool_empty(*m1, **e1);
  expect_pool_empty(*m2, **e2);
}

TEST(EngineScheduler, SeededSamplingBatchEqualsAlone) {
  const auto reqs = make_requests(16, 10, 0.9f);
  auto m1 = testing::tiny_model();
  auto e1 = Engine::create(*m1, testing::tiny_tokenizer(), EngineOptions{});
  auto m2 = testing::tiny_model();
  auto e2 = Engine::create(*m2, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(e1.ok() && e2.ok());
  const auto alone = run_alone(**e1, reqs);
  const auto together = run_together(**e2, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
}

TEST(EngineScheduler, PreemptionUnderTinyBudgetCompletesEveryRequest) {
  const auto reqs = make_requests(24, 60);
  auto ref_model = testing::tiny_model();
  auto ref = Engine::create(*ref_model, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(ref.ok());
  const auto alone = run_alone(**ref, reqs);

  // About 40 blocks of 16 tokens: a handful of these sequences at a time.
  auto probe = testing::tiny_model(0, 1);
  const int64_t block_bytes = probe->cache().stats().block_bytes;
  auto small = testing::tiny_model(40 * block_bytes, 1);
  ASSERT_TRUE(small);
  ASSERT_LE(small->cache().num_blocks(), 41);
  EngineOptions eo;
  eo.max_batch = 16;
  auto e = Engine::create(*small, testing::tiny_tokenizer(), eo);
  ASSERT_TRUE(e.ok()) << e.message();
  const auto together = run_together(**e, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i].reason, FinishReason::kLength) << "request " << i;
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i;
  }
  EXPECT_GT((*e)->stats().preemptions, 0);
  expect_pool_empty(*small, **e);
}

TEST(EngineScheduler, CancellationFreesBlocksAtOnce) {
  auto m = testing::tiny_model();
  auto e = Engine::create(*m, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(e.ok());
  Request r;
  for (int i = 0; i < 100; ++i) r.prompt.push_back(i);
  r.max_tokens = 400;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  auto h = (*e)->submit(r);
  ASSERT_TRUE(h.ok());
  int64_t got = 0;
  while (got < 3)
    for (auto& ev : (*h)->wait(std::chrono::milliseconds(100))) got += int64_t(ev.tokens.size());
  EXPECT_GT((*e)->stats().cache.used_blocks, 0);
  (*h)->cancel();
  const Outcome o = drain(**h);
  EXPECT_EQ(o.reason, FinishReason::kCancelled);
  EXPECT_LT(o.completion_tokens, 400);
  // Also a request cancelled while it is still queued.
  auto q = (*e)->submit(r);
  ASSERT_TRUE(q.ok());
  (*q)->cancel();
  EXPECT_EQ(drain(**q).reason, FinishReason::kCancelled);
  expect_pool_empty(*m, **e);
  const auto st = (*e)->stats();
  EXPECT_EQ(st.requests_cancelled, 2);
}

TEST(EngineScheduler, ShutdownCancelsInFlight) {
  auto m = testing::tiny_model();
  auto e = Engine::create(*m, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(e.ok());
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (auto& r : make_requests(8, 300)) hs.push_back(*(*e)->submit(r));
  (*e)->shutdown();
  for (auto& h : hs) EXPECT_EQ(drain(*h).reason, FinishReason::kCancelled);
  EXPECT_EQ(m->cache().stats().used_blocks, 0);
  EXPECT_FALSE((*e)->submit(make_requests(1, 4)[0]).ok());
}


// Choice i of a request with n choices is the request alone with seed + i: the prompt is computed
// once and forked, and each choice samples as a request of its own would. Also under a KV budget
// that forces preemption, and with several such requests at once.
TEST(EngineScheduler, ChoicesEqualSeparateRequestsWithTheirSeeds) {
  auto reqs = make_requests(6, 14, 0.9f);
  auto ref_model = testing::tiny_model();
  auto ref = Engine::create(*ref_model, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(ref.ok());
  const int n = 4;
  std::vector<std::vector<Outcome>> alone;
  for (const Request& r : reqs) {
    std::vector<Request> seeds;
    for (int i = 0; i < n; ++i) {
      seeds.push_back(r);
      seeds.back().sampling.seed = r.sampling.seed + uint64_t(i);
    }
    alone.push_back(run_alone(**ref, seeds));
  }
  auto probe = testing::tiny_model(0, 1);
  const int64_t block_bytes = probe->cache().stats().block_bytes;
  for (int64_t budget_blocks : {0, 30}) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget_blocks << " blocks");
    auto m = testing::tiny_model(budget_blocks * block_bytes, 1);
    ASSERT_TRUE(m);
    EngineOptions eo;
    eo.max_batch = 16;
    auto e = Engine::create(*m, testing::tiny_tokenizer(), eo);
    ASSERT_TRUE(e.ok()) << e.message();
    const int64_t prompt_before = (*e)->stats().prompt_tokens;
    std::vector<std::shared_ptr<RequestHandle>> hs;
    int64_t prompt_sum = 0;
    for (Request r : reqs) {
      r.n = n;
      prompt_sum += int64_t(r.prompt.size());
      auto h = (*e)->submit(r);
      ASSERT_TRUE(h.ok()) << h.message();
      hs.push_back(*h);
    }
    for (size_t k = 0; k < reqs.size(); ++k) {
      const auto got = drain_choices(*hs[k], n);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(got[size_t(i)].tokens, alone[k][size_t(i)].tokens) << "request " << k << " choice " << i;
        EXPECT_EQ(got[size_t(i)].text, alone[k][size_t(i)].text) << "request " << k << " choice " << i;
        EXPECT_EQ(got[size_t(i)].completion_tokens, reqs[k].max_tokens);
        EXPECT_EQ(got[size_t(i)].prompt_tokens, int64_t(reqs[k].prompt.size()));
      }
    }
    (*e)->wait_idle();  // the stats are published after the step that finished the last choice
    const auto st = (*e)->stats();
    EXPECT_EQ(st.requests_finished, int64_t(reqs.size()));  // requests, not choices
    EXPECT_EQ(st.prompt_tokens - prompt_before, prompt_sum);  // each prompt counted (computed) once
    if (budget_blocks > 0) {
      EXPECT_GT(st.preemptions, 0);
    }
    expect_pool_empty(*m, **e);
  }
}

TEST(EngineScheduler, ChoicesCancelTogetherAndAreValidated) {
  auto m = testing::tiny_model();
  EngineOptions eo;
  eo.max_batch = 8;
  auto e = Engine::create(*m, testing::tiny_tokenizer(), eo);
  ASSERT_TRUE(e.ok());
  Request r = make_requests(1, 300)[0];
  r.n = 3;
  auto h = (*e)->submit(r);
  ASSERT_TRUE(h.ok());
  int64_t got = 0;
  while (got < 6)
    for (auto& ev : (*h)->wait(std::chrono::milliseconds(100))) got += int64_t(ev.tokens.size());
  (*h)->cancel();
  for (const Outcome& o : drain_choices(**h, 3)) EXPECT_EQ(o.reason, FinishReason::kCancelled);
  // Greedy choices are all the same; max_tokens 0 still gives every choice its end.
  r.sampling.temperature = 0;
  r.max_tokens = 9;
  auto g = drain_choices(**(*e)->submit(r), 3);
  EXPECT_EQ(g[1].tokens, g[0].tokens);
  EXPECT_EQ(g[2].tokens, g[0].tokens);
  EXPECT_EQ(g[0].tokens.size(), 9u);
  r.max_tokens = 0;
  for (const Outcome& o : drain_choices(**(*e)->submit(r), 3)) EXPECT_EQ(o.reason, FinishReason::kLength);
  expect_pool_empty(*m, **e);
  EXPECT_EQ((*e)->stats().requests_cancelled, 1);
  r.n = 0;
  EXPECT_FALSE((*e)->submit(r).ok());
  r.n = 9;  // beyond max batch 8
  EXPECT_FALSE((*e)->submit(r).ok());
}

// Each token's log-probabilities come with it; greedy picks the top one.
TEST(EngineScheduler, LogprobsComeWithTheirTokens) {
  auto m = testing::tiny_model();
  auto e = Engine::create(*m, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(e.ok());
  Request r = make_requests(1, 12)[0];
  r.logprobs = 3;
  auto h = (*e)->submit(r);
  ASSERT_TRUE(h.ok());
  size_t tokens = 0;
  for (bool done = false; !done;) {
    for (auto& ev : (*h)->wait(std::chrono::milliseconds(100))) {
      ASSERT_EQ(ev.logprobs.size(), ev.tokens.size());
      for (size_t i = 0; i < ev.tokens.size(); ++i) {
        const TokenLogprob& lp = ev.logprobs[i];
        EXPECT_EQ(lp.token, ev.tokens[i]);
        ASSERT_EQ(lp.top.size(), 3u);
        EXPECT_EQ(lp.top[0].first, lp.token);
        EXPECT_EQ(lp.top[0].second, lp.logprob);
        EXPECT_LE(lp.logprob, 0.0f);
      }
      tokens += ev.tokens.size();
      done = ev.finished;
    }
  }
  EXPECT_EQ(tokens, size_t(r.max_tokens));
  r.logprobs = 21;
  EXPECT_FALSE((*e)->submit(r).ok());
  r.logprobs = -1;
  r.sampling.logit_bias = {{kVocab, 1.0f}};  // beyond the vocabulary
  EXPECT_FALSE((*e)->submit(r).ok());
}

// JSON mode on a random model: every finished output parses as one JSON object, every cut one is
// a prefix of one; choices and greedy too. A bias towards the closing bytes lets objects end.
TEST(EngineScheduler, JsonModeOutputsAreJsonObjects) {
  auto m = testing::tiny_model();
  auto e = Engine::create(*m, testing::tiny_tokenizer(), EngineOptions{});
  ASSERT_TRUE(e.ok());
  std::mt19937 rng(std::random_device{}());
  int closed = 0, total = 0;
  for (int iter = 0; iter < 12; ++iter) {
    Request r = make_requests(1, 120)[0];
    r.json_schema = JsonSchema::any_object();
    r.ignore_eos = false;
    r.sampling.temperature = iter == 0 ? 0.0f : 1.2f;
    r.sampling.top_k = 0, r.sampling.top_p = 1.0f, r.sampling.min_p = 0.0f;
    r.sampling.seed = rng();
    r.sampling.logit_bias = {{'"', 3.0f}, {'}', 2.5f}, {']', 2.0f}, {':', 2.0f}, {',', 1.0f}, {'[', 1.0f}, {'1', 1.0f}};
    r.n = iter % 3 == 0 ? 3 : 1;
    auto h = (*e)->submit(r);
    ASSERT_TRUE(h.ok()) << h.message();
    for (const Outcome& o : drain_choices(**h, r.n)) {
      ++total;
      SCOPED_TRACE(::testing::PrintToString(o.text));
      if (o.reason == FinishReason::kStop) {
        ++closed;
        EXPECT_TRUE(test::is_json_object(o.text));
      } else {
        EXPECT_EQ(o.reason, FinishReason::kLength);
        JsonPrefix p;
        EXPECT_TRUE(p.feed(o.text) && !p.complete());
      }
    }
  }
  EXPECT_GT(closed, total / 3);  // the bias makes most objects close: the parse check runs
  expect_pool_empty(*m, **e);
}

TEST(EngineScheduler, StopStringsAndValidation) {
  auto m = testing::tiny_model();
  auto tok = testing::tiny_tokenizer();
  auto e = Engine::create(*m, tok, EngineOptions{});
  ASSERT_TRUE(e.ok());
  Request r;
  r.prompt = {97, 98, 99, 100};
  r.max_tokens = 40;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  const Outcome full = drain(**(*e)->submit(r));
  ASSERT_GT(full.text.size(), 8u);
  // Cut at a stop string taken from the middle of the greedy text.
  const std::string stop = full.text.substr(full.text.size() / 2, 2);
  r.stop = {stop};
  const Outcome cut = drain(**(*e)->submit(r));
  EXPECT_EQ(cut.reason, FinishReason::kStop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));

  Request bad = r;
  bad.prompt.clear();
  EXPECT_FALSE((*e)->submit(bad).ok());
  bad.prompt = {kVocab};
  EXPECT_FALSE((*e)->submit(bad).ok());
  bad.prompt = std::vector<int32_t>(size_t((*e)->max_context()), 1);
  EXPECT_FALSE((*e)->submit(bad).ok());
  bad.prompt = {1, 2};
  bad.max_tokens = (*e)->max_context();
  EXPECT_FALSE((*e)->submit(bad).ok());
  bad.max_tokens = 4;
  bad.sampling.temperature = -1;
  EXPECT_FALSE((*e)->submit(bad).ok());
  expect_pool_empty(*m, **e);
}

TEST(EngineStopStrings, HoldsBackPrefixesAndCutsAtTheEarliest) {
  StopMatcher s({"END", "xy"});
  EXPECT_EQ(s.push("abc"), "abc");
  EXPECT_EQ(s.push("dE"), "d");  // "E" may start "END"
  EXPECT_EQ(s.push("N"), "");
  EXPECT_EQ(s.push("Dzz"), "");  // "END" completed
  EXPECT_TRUE(s.stopped());
  StopMatcher t({"xyz", "yz"});
  EXPECT_EQ(t.push("axyz"), "a");
  StopMatcher u({"zz"});
  EXPECT_EQ(u.push("az"), "a");
  EXPECT_EQ(u.flush(), "z");
}

// Generation stops with the piece (token) that completes a stop string, and the text is cut at the
// earliest stop string in the text so far (a longer one that started earlier but is not complete
// yet does not count). Whatever the pieces, the matcher lets out exactly that cut (all the text
// when no stop string occurs), and never lets out a byte it must later take back. Small alphabets,
// so that stop strings overlap and recur.
TEST(EngineStopStrings, AnyPiecesGiveTheCutAtTheStoppingPiece) {
  std::mt19937 rng(std::random_device{}());
  auto word = [&](size_t max_len) {
    std::string w(1 + rng() % max_len, 'a');
    for (char& c : w) c = "abc"[rng() % 3];
    return w;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::string> stops(1 + rng() % 3);
    for (auto& s : stops) s = word(4);
    const std::string text = rng() % 4 == 0 ? std::string() : word(24);
    std::vector<size_t> ends;  // where the pieces end
    for (size_t at = 0; at < text.size();) ends.push_back(at += std::min(text.size() - at, size_t(1 + rng() % 5)));
    // The reference: the first piece after which the text holds a stop string, and its earliest one.
    std::string expected = text;
    bool stops_expected = false;
    for (size_t e : ends) {
      size_t cut = std::string::npos;
      for (const auto& s : stops) cut = std::min(cut, text.substr(0, e).find(s));
      if (cut != std::string::npos) {
        expected = text.substr(0, cut), stops_expected = true;
        break;
      }
    }
    std::string shown = "text '" + text + "', stops";
    for (const auto& st : stops) shown += " '" + st + "'";
    SCOPED_TRACE(shown);

    StopMatcher m(stops);
    std::string out;
    for (size_t i = 0, at = 0; i < ends.size() && !m.stopped(); at = ends[i++]) {
      out += m.push(std::string_view(text).substr(at, ends[i] - at));
      ASSERT_EQ(expected.compare(0, out.size(), out), 0) << "let out more than the cut: " << out;
    }
    if (!m.stopped()) out += m.flush();
    ASSERT_EQ(out, expected);
    ASSERT_EQ(m.stopped(), stops_expected);
  }
}

}  // namespace
}  // namespace escala::engine
