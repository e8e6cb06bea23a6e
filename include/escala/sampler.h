// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
// penalties, with a seed that makes runs repeatable.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
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

  // A one-line error for out-of-range values.
  Status validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // Picks the next token from `logits` (one per vocabulary entry).
  int32_t sample(std::span<const float> logits);
  // Records a token (prompt or generated) for the penalties.
  void accept(int32_t token);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<int32_t> history_;
  std::vector<std::pair<float, int32_t>> cand_;  // scratch, reused
};

}  // namespace escala::engine
