// The OpenAI protocol: request validation (every field, with the right 4xx and an OpenAI-style
// error object) and the response / stream-chunk bodies.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

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

struct ApiRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  engine::Request request;
};

// Parses and validates a /v1/completions (chat = false) or /v1/chat/completions body, then
// renders the chat template and tokenizes. Returns the error when anything is wrong.
std::optional<ApiError> parse_request(const std::string& body, bool chat, const ProtocolContext& ctx, ApiRequest& out);

// The depth of nested arrays / objects (strings skipped), stopping once past `limit`.
int json_depth(const std::string& body, int limit);

// Bodies of the responses.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);
nlohmann::json completion_response(bool chat, const std::string& id, int64_t created, const std::string& model,
                                   const std::string& text, const char* finish_reason, const Usage& usage);
// One streamed chunk; finish_reason null while streaming; role set only on the first chat chunk.
nlohmann::json stream_chunk(bool chat, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const char* finish_reason, bool first);
nlohmann::json usage_chunk(bool chat, const std::string& id, int64_t created, const std::string& model,
                           const Usage& usage);
// JSON text; invalid UTF-8 (never expected) is replaced rather than thrown.
std::string dump(const nlohmann::json& j);

}  // namespace escala::server
