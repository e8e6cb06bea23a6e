// Token sampling: logit bias, greedy, temperature, top-k, top-p, min-p, repetition / presence /
// frequency penalties, with a seed that makes runs repeatable; and the model's log-probabilities of
// a token and of the most likely ones (OpenAI's logprobs).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "escala/status.h"

namespace escala::engine {

struct SamplingParams {
  float temperature = 0.8f;  // 0: greedy
  int32_t top_k = 40;        // 0: off
  float top_p = 0.95f;       // 1: off
  float min_p = 0.05f;       // 0: off (relative to the most likely token)
  float repetition_penalty = 1.0f;  // 1: off (divides positive logits, multiplies negative ones)
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t penalty_last_n = 64;  // tokens of history the penalties look at
  uint64_t seed = 0;
  // Added to those tokens' logits before anything else (OpenAI's logit_bias, in [-100, 100]):
  // -100 in effect bans a token, +100 forces it among the allowed.
  std::vector<std::pair<int32_t, float>> logit_bias;

  // A one-line error for out-of-range values.
  Status validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from `logits` (one per vocabulary entry). With `allowed` (one byte per
  // entry, at least one non-zero), only allowed tokens are candidates, as if the others had
  // probability 0 before top-k, min-p and top-p (JSON mode).
  int32_t sample(std::span<const float> logits, const std::vector<uint8_t>* allowed = nullptr);
  // Records a token (prompt or generated) for the penalties.
  void accept(int32_t token);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch, reused
};

// The model's log-probabilities, log_softmax of the raw logits (before bias, penalties and
// temperature, as vLLM reports by default): of `token`, and of the `top_n` most likely tokens, most
// likely first (ties: lower id first).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
TokenLogprob token_logprobs(std::span<const float> logits, int32_t token, int32_t top_n);

}  // namespace escala::engine
