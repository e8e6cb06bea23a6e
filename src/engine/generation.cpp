#include "engine/generation.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace escala::engine {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Length of the longest suffix of `text` that is a proper prefix of some stop string: that much
// text must be held back, since the next token could complete a stop string.
size_t held_back(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  return hold;
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

  const auto t1 = std::chrono::steady_clock::now();
  model::StreamDecoder decoder(tokenizer);
  std::string pending;  // decoded text not yet emitted (may be the start of a stop string)
  out.finish_reason = "length";
  for (int32_t i = 0; i < req.max_tokens; ++i) {
    const int32_t tok = sampler.sample(logits);
    sampler.accept(tok);
    if (tokenizer.is_end_of_generation(tok)) {
      out.finish_reason = "stop";
      break;
    }
    out.tokens.push_back(tok);
    auto piece = decoder.push(tok);
    if (!piece.ok()) return piece.status();
    pending += *piece;
    bool stopped = false;
    for (const auto& s : req.stop) {
      const size_t at = pending.find(s);
      if (at != std::string::npos) {
        pending.resize(at);
        stopped = true;
      }
    }
    const size_t hold = stopped ? 0 : held_back(pending, req.stop);
    const std::string_view ready = std::string_view(pending).substr(0, pending.size() - hold);
    if (on_text && !ready.empty()) on_text(ready);
    out.text += ready;
    pending.erase(0, ready.size());
    if (stopped) {
      out.finish_reason = "stop";
      break;
    }
    if (i + 1 == req.max_tokens) break;  // no forward pass for a token nobody samples
    ESCALA_RETURN_IF_ERROR(model.append(seq, std::span(&tok, 1), logits));
  }
  if (out.finish_reason == "length") {
    pending += decoder.flush();
    if (on_text && !pending.empty()) on_text(pending);
    out.text += pending;
  }
  out.generation_seconds = seconds_since(t1);
  return out;
}

}  // namespace escala::engine
