// The OpenAI protocol: request validation (every field, with the right 4xx and an OpenAI-style
// error object) and the response / stream-chunk bodies.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "escala/engine.h"
#include "escala/tokenizer.h"

namespace escala::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};
std::string error_body(const ApiError& e);

// What the server knows that validation needs.
struct ProtocolContext {
  std::string model_id;
  const model::Tokenizer* tokenizer = nullptr;
  const model::ChatTemplate* chat_template = nullptr;
  int32_t max_context = 0;
  int32_t max_json_depth = 64;
};

// The most choices (n) one request may ask for.
inline constexpr int64_t kMaxChoices = 16;

struct ApiRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  engine::Request request;
};

// Parses and validates a /v1/completions (chat = false) or /v1/chat/completions body, then
// renders the chat template and tokenizes. Returns the error when anything is wrong.
std::optional<ApiError> parse_request(const std::string& body, bool chat, const ProtocolContext& ctx, ApiRequest& out);

// /tokenize and /detokenize, in vLLM's form. Tokenize: {"prompt": text, "add_special_tokens":
// true} -> {"tokens", "count", "max_model_len"}; the text is read as a completions prompt is
// (special tokens written in it recognised). Detokenize: {"tokens": [ids]} -> {"prompt": text},
// control tokens printed. `out` is the response body.
std::optional<ApiError> tokenize_request(const std::string& body, const ProtocolContext& ctx, nlohmann::json& out);
std::optional<ApiError> detokenize_request(const std::string& body, const ProtocolContext& ctx, nlohmann::json& out);

// The depth of nested arrays / objects (strings skipped), stopping once past `limit`.
int json_depth(const std::string& body, int limit);

// Bodies of the responses.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);
// One choice of a finished request; `logprobs` null when the request did not ask for them.
struct ChoiceResult {
  std::string text;
  const char* finish_reason = "stop";
  nlohmann::json logprobs;
};
nlohmann::json completion_response(bool chat, const std::string& id, int64_t created, const std::string& model,
                                   const std::vector<ChoiceResult>& choices, const Usage& usage);
// One streamed chunk of choice `index`; finish_reason null while streaming; role set only on a
// choice's first chat chunk.
nlohmann::json stream_chunk(bool chat, const std::string& id, int64_t created, const std::string& model, int index,
                            const std::string& text, const char* finish_reason, bool first,
                            const nlohmann::json& logprobs = nullptr);
// The "logprobs" member for these tokens. Chat: {"content": [{token, logprob, bytes,
// top_logprobs}], "refusal": null}. Completions: {tokens, token_logprobs, top_logprobs (objects
// token -> logprob), text_offset}; `text_offset` counts characters of the completion text so far
// (it continues across stream chunks) and is advanced past these tokens.
nlohmann::json logprobs_json(bool chat, const std::vector<engine::TokenLogprob>& lps, const model::Tokenizer& tok,
                             int64_t& text_offset);
nlohmann::json usage_chunk(bool chat, const std::string& id, int64_t created, const std::string& model,
                           const Usage& usage);
// JSON text; invalid UTF-8 (never expected) is replaced rather than thrown.
std::string dump(const nlohmann::json& j);

}  // namespace escala::server
