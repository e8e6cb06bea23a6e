#include "engine/generation.h"

#include "engine/json_prefix.h"
#include "engine/stop_strings.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

namespace escala::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Result<GenerationResult> generate(model::Model& model, const model::Tokenizer& tokenizer, kv::SeqId seq,
                                  const GenerationRequest& req, const std::function<void(std::string_view)>& on_text) {
  ESCALA_RETURN_IF_ERROR(req.sampling.validate());
  ESCALA_CHECK_ARG(req.max_tokens >= 0, "generate: max tokens must be >= 0 (got {})", req.max_tokens);
  ESCALA_CHECK_ARG(!req.prompt.empty(), "generate: the prompt is empty");
  for (const auto& s : req.stop) ESCALA_CHECK_ARG(!s.empty(), "generate: empty stop string");
  GenerationResult out;
  out.prompt_tokens = int64_t(req.prompt.size());
  Sampler sampler(req.sampling);
  for (int32_t t : req.prompt) sampler.accept(t);

  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  ESCALA_RETURN_IF_ERROR(model.append(seq, req.prompt, logits));
  out.prompt_seconds = seconds_since(t0);
  out.first_logits = logits;

  const auto t1 = std::chrono::steady_clock::now();
  model::StreamDecoder decoder(tokenizer);
  StopMatcher stops(req.stop);  // holds back text that may be the start of a stop string
  out.finish_reason = "length";
  std::unique_ptr<JsonTokenMasks> json_masks;
  std::optional<JsonPrefix> json;
  if (req.json_schema) {
    json_masks = JsonTokenMasks::for_tokenizer(tokenizer);
    json.emplace(req.json_schema.get());
  }
  for (int32_t i = 0; i < req.max_tokens; ++i) {
    const std::vector<uint8_t>* allowed = json ? &json_masks->allowed(*json) : nullptr;
    if (allowed && std::find(allowed->begin(), allowed->end(), uint8_t(1)) == allowed->end())
      return Status::error("JSON output: no token of this vocabulary continues the value");
    const int32_t tok = sampler.sample(logits, allowed);
    sampler.accept(tok);
    if (json) (void)json->feed(json_masks->piece(tok));  // allowed, so it feeds
    if (tokenizer.is_end_of_generation(tok)) {
      out.finish_reason = "stop";
      break;
    }
    out.tokens.push_back(tok);
    auto piece = decoder.push(tok);
    if (!piece.ok()) return piece.status();
    const std::string ready = stops.push(*piece);
    if (on_text && !ready.empty()) on_text(ready);
    out.text += ready;
    if (stops.stopped() || (json && json->complete())) {  // a stop string, or the JSON value is whole
      out.finish_reason = "stop";
      break;
    }
    if (i + 1 == req.max_tokens) break;  // no forward pass for a token nobody samples
    ESCALA_RETURN_IF_ERROR(model.append(seq, std::span(&tok, 1), logits));
  }
  if (!stops.stopped()) {  // an end-of-generation token or the length: held-back text is final
    const std::string rest = stops.push(decoder.flush()) + stops.flush();
    if (on_text && !rest.empty()) on_text(rest);
    out.text += rest;
  }
  out.generation_seconds = seconds_since(t1);
  return out;
}

}  // namespace escala::engine
