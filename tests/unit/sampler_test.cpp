// The sampler against a reference distribution written here from the definitions (penalties, then
// top-k, the softmax with temperature, min-p and top-p over what is left): tokens outside the kept
// set are never drawn, and the drawn frequencies pass a chi-square test against the reference.
// Greedy picks, seeds and the penalties are checked exactly. Fresh random logits each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "escala/sampler.h"

namespace escala::engine {
namespace {

std::vector<float> penalised(std::vector<float> l, const SamplingParams& p, const std::vector<int32_t>& history) {
  for (const auto& [tok, bias] : p.logit_bias) l[tok] += bias;  // the bias comes first
  std::unordered_map<int32_t, int> counts;
  const size_t from = history.size() > size_t(p.penalty_last_n) ? history.size() - p.penalty_last_n : 0;
  for (size_t i = from; i < history.size(); ++i) ++counts[history[i]];
  for (const auto& [tok, c] : counts) {
    float& x = l[tok];
    x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
    x -= float(c) * p.frequency_penalty + p.presence_penalty;
  }
  return l;
}

// The probability of each token under `p` (temperature > 0).
std::vector<double> reference(const std::vector<float>& logits, const SamplingParams& p,
                              const std::vector<int32_t>& history) {
  const std::vector<float> l = penalised(logits, p, history);
  const int n = int(l.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  order.resize(p.top_k > 0 ? std::min(p.top_k, n) : n);
  std::vector<double> w;
  for (int i : order) w.push_back(std::exp((double(l[i]) - l[order[0]]) / p.temperature));
  size_t keep = w.size();
  if (p.min_p > 0)
    keep = std::count_if(w.begin(), w.end(), [&](double x) { return x >= p.min_p * w[0]; });
  if (p.top_p < 1) {
    const double kept = std::accumulate(w.begin(), w.begin() + keep, 0.0);
    double acc = 0;
    size_t i = 0;
    while (i < keep && (acc += w[i]) < p.top_p * kept) ++i;
    keep = std::min(keep, i + 1);
  }
  const double total = std::accumulate(w.begin(), w.begin() + keep, 0.0);
  std::vector<double> prob(n, 0.0);
  for (size_t j = 0; j < keep; ++j) prob[order[j]] = w[j] / total;
  return prob;
}

TEST(Sampler, DrawsMatchTheReferenceDistribution) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 2.0f);
  struct Config {
    float temperature;
    int top_k;
    float top_p, min_p, rep, presence, frequency;
    bool bias = false;
  };
  const Config configs[] = {
      {1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f},    // plain softmax
      {0.7f, 5, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f},    // top-k
      {1.3f, 0, 0.8f, 0.0f, 1.0f, 0.0f, 0.0f},    // top-p
      {1.0f, 0, 1.0f, 0.08f, 1.0f, 0.0f, 0.0f},   // min-p
      {0.8f, 8, 0.9f, 0.03f, 1.0f, 0.0f, 0.0f},   // all three
      {1.0f, 0, 1.0f, 0.0f, 1.3f, 0.5f, 0.4f},    // penalties
      {0.9f, 6, 1.0f, 0.0f, 1.2f, 0.3f, 0.0f, true},  // logit bias (one token banned), penalties
  };
  const int vocab = 12, draws = 100000;
  for (const Config& c : configs) {
    SamplingParams p;
    p.temperature = c.temperature, p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p;
    p.repetition_penalty = c.rep, p.presence_penalty = c.presence, p.frequency_penalty = c.frequency;
    p.seed = rng();
    ASSERT_TRUE(p.validate().ok());
    std::vector<float> logits(vocab);
    for (float& x : logits) x = normal(rng);
    if (c.bias) {
      const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      p.logit_bias = {{best, -100.0f}, {int32_t((best + 1) % vocab), 1.5f}, {int32_t((best + 2) % vocab), -0.7f}};
    }
    std::vector<int32_t> history;
    for (int i = 0; i < 6; ++i) history.push_back(int32_t(rng() % vocab));
    const std::vector<double> prob = reference(logits, p, history);

    Sampler s(p);
    for (int32_t t : history) s.accept(t);
    std::vector<int> seen(vocab, 0);
    for (int i = 0; i < draws; ++i) {
      const int32_t t = s.sample(logits);
      ASSERT_TRUE(t >= 0 && t < vocab) << t;
      ++seen[t];
    }
    double chi2 = 0;
    int kept = 0;
    for (int i = 0; i < vocab; ++i) {
      if (prob[i] == 0) {
        EXPECT_EQ(seen[i], 0) << "token " << i << " is outside the kept set";
        continue;
      }
      ++kept;
      const double e = prob[i] * draws;
      chi2 += (seen[i] - e) * (seen[i] - e) / e;
    }
    // dof = kept - 1; the bound is ~6 standard deviations above the mean of chi-square.
    const double dof = std::max(1, kept - 1);
    EXPECT_LT(chi2, dof + 6 * std::sqrt(2 * dof) + 10)
        << "T " << c.temperature << " top_k " << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p;
  }
}

TEST(Sampler, GreedyPicksTheFirstMaximumAfterPenalties) {
  SamplingParams p;
  p.temperature = 0;
  Sampler plain(p);
  EXPECT_EQ(plain.sample(std::vector<float>{1, 3, 3, 2}), 1);
  // Token 0 was said: 3 / 1.5 = 2 falls below token 1's 2.9.
  p.repetition_penalty = 1.5f;
  Sampler rep(p);
  rep.accept(0);
  EXPECT_EQ(rep.sample(std::vector<float>{3.0f, 2.9f, -1.0f}), 1);
  // A negative logit is multiplied: -1 * 1.5 - presence 1 = -2.5 < token 1's -2.
  p.repetition_penalty = 1.5f, p.presence_penalty = 1.0f;
  Sampler neg(p);
  neg.accept(0);
  EXPECT_EQ(neg.sample(std::vector<float>{-1.0f, -2.0f, -3.0f}), 1);
  // Frequency counts repeats within the last penalty_last_n tokens only.
  p.repetition_penalty = 1.0f, p.presence_penalty = 0.0f, p.frequency_penalty = 1.0f, p.penalty_last_n = 3;
  Sampler freq(p);
  for (int32_t t : {1, 1, 1, 0, 0}) freq.accept(t);  // window: 1, 0, 0
  EXPECT_EQ(freq.sample(std::vector<float>{5.0f, 4.5f}), 1);  // 5 - 2 = 3 < 4.5 - 1 = 3.5
}

TEST(Sampler, LogitBiasMovesTheGreedyPick) {
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{1, -100.0f}};  // bans the maximum: the next one wins
  EXPECT_EQ(Sampler(p).sample(std::vector<float>{1, 3, 2.5f, 2}), 2);
  p.logit_bias = {{0, 2.5f}};  // 1 + 2.5 > 3
  EXPECT_EQ(Sampler(p).sample(std::vector<float>{1, 3, 2.5f, 2}), 0);
  p.logit_bias = {{7, 100.0f}};  // beyond this vocabulary: ignored
  EXPECT_EQ(Sampler(p).sample(std::vector<float>{1, 3, 2.5f, 2}), 1);
  p.logit_bias = {{0, 100.5f}};
  EXPECT_FALSE(p.validate().ok());
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(p.validate().ok());
  p.logit_bias = {{0, std::nanf("")}};
  EXPECT_FALSE(p.validate().ok());
}

// token_logprobs against log_softmax in double and a full sort, on fresh random logits with ties.
TEST(Sampler, TokenLogprobsAreTheLogSoftmaxAndItsTop) {
  std::mt19937 rng(std::random_device{}());
  for (int iter = 0; iter < 50; ++iter) {
    const int n = 1 + int(rng() % 300);
    std::vector<float> logits(static_cast<size_t>(n));
    for (float& x : logits) x = float(int(rng() % 40) - 20) * 0.25f;  // many ties
    double mx = -1e30, z = 0;
    for (float x : logits) mx = std::max(mx, double(x));
    for (float x : logits) z += std::exp(double(x) - mx);
    const int32_t token = int32_t(rng() % uint32_t(n));
    const int32_t top_n = int32_t(rng() % 25);
    const TokenLogprob lp = token_logprobs(logits, token, top_n);
    EXPECT_EQ(lp.token, token);
    EXPECT_NEAR(lp.logprob, double(logits[size_t(token)]) - mx - std::log(z), 1e-5);
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    ASSERT_EQ(lp.top.size(), size_t(std::min(top_n, n)));
    for (size_t i = 0; i < lp.top.size(); ++i) {
      EXPECT_EQ(lp.top[i].first, order[i]) << "rank " << i;
      EXPECT_NEAR(lp.top[i].second, double(logits[size_t(order[i])]) - mx - std::log(z), 1e-5);
    }
  }
}

TEST(Sampler, SameSeedSameTokens) {
  std::mt19937 rng(std::random_device{}());
  std::vector<float> logits(50);
  for (float& x : logits) x = std::uniform_real_distribution<float>(-3, 3)(rng);
  SamplingParams p;
  p.temperature = 1.0f, p.top_k = 0, p.top_p = 1.0f, p.min_p = 0.0f;
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits));
    return out;
  };
  const uint64_t seed = rng();
  EXPECT_EQ(run(seed), run(seed));
  EXPECT_NE(run(seed), run(seed + 1));
}

}  // namespace
}  // namespace escala::engine
