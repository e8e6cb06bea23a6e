#include "escala/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace escala::engine {

Status SamplingParams::validate() const {
  ESCALA_CHECK_ARG(std::isfinite(temperature) && temperature >= 0 && temperature <= 100,
                   "sampling: temperature must be in [0, 100] (got {})", temperature);
  ESCALA_CHECK_ARG(top_k >= 0, "sampling: top_k must be >= 0 (got {})", top_k);
  ESCALA_CHECK_ARG(std::isfinite(top_p) && top_p > 0 && top_p <= 1, "sampling: top_p must be in (0, 1] (got {})", top_p);
  ESCALA_CHECK_ARG(std::isfinite(min_p) && min_p >= 0 && min_p <= 1, "sampling: min_p must be in [0, 1] (got {})", min_p);
  ESCALA_CHECK_ARG(std::isfinite(repetition_penalty) && repetition_penalty > 0 && repetition_penalty <= 10,
                   "sampling: repetition_penalty must be in (0, 10] (got {})", repetition_penalty);
  ESCALA_CHECK_ARG(std::isfinite(presence_penalty) && std::fabs(presence_penalty) <= 10,
                   "sampling: presence_penalty must be in [-10, 10] (got {})", presence_penalty);
  ESCALA_CHECK_ARG(std::isfinite(frequency_penalty) && std::fabs(frequency_penalty) <= 10,
                   "sampling: frequency_penalty must be in [-10, 10] (got {})", frequency_penalty);
  ESCALA_CHECK_ARG(penalty_last_n >= 0, "sampling: penalty_last_n must be >= 0 (got {})", penalty_last_n);
  for (const auto& [tok, bias] : logit_bias) {
    ESCALA_CHECK_ARG(tok >= 0, "sampling: logit_bias token id {} is negative", tok);
    ESCALA_CHECK_ARG(std::isfinite(bias) && std::fabs(bias) <= 100,
                     "sampling: logit_bias for token {} must be in [-100, 100] (got {})", tok, bias);
  }
  return {};
}

Sampler::Sampler(const SamplingParams& params) : p_(params), rng_(params.seed) {}

void Sampler::accept(int32_t token) { history_.push_back(token); }

int32_t Sampler::sample(std::span<const float> logits, const std::vector<uint8_t>* allowed) {
  const int32_t n = int32_t(logits.size());
  const bool penalise = p_.repetition_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  // Greedy: the first maximum (stable across runs and batch sizes). Without penalties or bias the
  // logits are read in place (copying 49k candidates cost as much as the argmax, per token).
  if (p_.temperature == 0.0f && p_.logit_bias.empty() && !allowed &&
      !(penalise && p_.penalty_last_n > 0 && !history_.empty())) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  cand_.resize(n);
  for (int32_t i = 0; i < n; ++i) cand_[i] = {logits[i], i};
  for (const auto& [tok, bias] : p_.logit_bias)
    if (tok < n) cand_[tok].first += bias;

  // Penalties over the recent history (llama.cpp's semantics).
  if (penalise && p_.penalty_last_n > 0 && !history_.empty()) {
    std::unordered_map<int32_t, int> counts;
    const size_t from = history_.size() > size_t(p_.penalty_last_n) ? history_.size() - p_.penalty_last_n : 0;
    for (size_t i = from; i < history_.size(); ++i) ++counts[history_[i]];
    for (const auto& [tok, c] : counts) {
      if (tok < 0 || tok >= n) continue;
      float& l = cand_[tok].first;
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
      l -= float(c) * p_.frequency_penalty + p_.presence_penalty;
    }
  }
  // Constrained: the other tokens leave the candidates (the order by id stays).
  if (allowed)
    std::erase_if(cand_, [&](const std::pair<float, int32_t>& c) { return (*allowed)[size_t(c.second)] == 0; });
  const int32_t m = int32_t(cand_.size());
  // Greedy with penalties, bias or a constraint: the first maximum of what is left.
  if (p_.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < m; ++i)
      if (cand_[i].first > cand_[best].first) best = i;
    return cand_[best].second;
  }
  // Top-k, then softmax with temperature, min-p, top-p.
  const int32_t k = p_.top_k > 0 ? std::min(p_.top_k, m) : m;
  std::partial_sort(cand_.begin(), cand_.begin() + k, cand_.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  cand_.resize(k);
  const float mx = cand_[0].first;
  double total = 0;
  for (auto& c : cand_) {
    c.first = std::exp((c.first - mx) / p_.temperature);
    total += c.first;
  }
  size_t keep = cand_.size();
  if (p_.min_p > 0.0f) {
    const float floor = cand_[0].first * p_.min_p;  // probabilities relative to the top one
    keep = 1;
    while (keep < cand_.size() && cand_[keep].first >= floor) ++keep;
  }
  if (p_.top_p < 1.0f) {
    double acc = 0, kept_total = 0;
    for (size_t i = 0; i < keep; ++i) kept_total += cand_[i].first;
    size_t i = 0;
    for (; i < keep; ++i) {
      acc += cand_[i].first;
      if (acc >= p_.top_p * kept_total) break;
    }
    keep = std::min(keep, i + 1);
  }
  total = 0;
  for (size_t i = 0; i < keep; ++i) total += cand_[i].first;
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= cand_[i].first;
    if (r <= 0) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

TokenLogprob token_logprobs(std::span<const float> logits, int32_t token, int32_t top_n) {
  const int32_t n = int32_t(logits.size());
  float mx = -std::numeric_limits<float>::infinity();
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x - mx));
  const double log_z = double(mx) + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - log_z);
  // The top_n largest (logit, id), most likely first; a small heap over one pass of the logits.
  const int32_t k = std::min(std::max(top_n, 0), n);
  auto before = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::vector<std::pair<float, int32_t>> heap;  // the worst kept on top
  heap.reserve(size_t(k) + 1);
  for (int32_t i = 0; i < n && k > 0; ++i) {
    const std::pair<float, int32_t> c{logits[size_t(i)], i};
    if (int32_t(heap.size()) < k) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), before);
    } else if (before(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), before);
    }
  }
  std::sort(heap.begin(), heap.end(), before);
  for (const auto& [l, id] : heap) out.top.emplace_back(id, float(double(l) - log_z));
  return out;
}

}  // namespace escala::engine
