// Single-stream generation (escala generate / chat): prefill the prompt, then sample token by token
// until max tokens, an end-of-generation token or a stop string, streaming text as it completes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/json_schema.h"
#include "escala/model.h"
#include "escala/sampler.h"
#include "escala/tokenizer.h"

namespace escala::engine {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int32_t max_tokens = 128;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  // Structured output (engine/json_schema.h): only tokens that keep the output a prefix of a JSON
  // text the schema allows; ends ("stop") when the value is complete. Null: off.
  std::shared_ptr<const JsonSchema> json_schema;
};

struct GenerationResult {
  std::string text;
  std::vector<int32_t> tokens;
  std::string finish_reason;  // "stop" (EOG token or stop string) or "length"
  int64_t prompt_tokens = 0;
  std::vector<float> first_logits;  // logits at the first generated position (for comparisons)
  double prompt_seconds = 0, generation_seconds = 0;
};

// Runs one request on sequence `seq` of the model's cache (created if absent: a chat continues its
// sequence, so the history is not recomputed). `on_text` receives text as it becomes final.
Result<GenerationResult> generate(model::Model& model, const model::Tokenizer& tokenizer, kv::SeqId seq,
                                  const GenerationRequest& request,
                                  const std::function<void(std::string_view)>& on_text = {});

}  // namespace escala::engine
