#include "server/protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <ctime>
#include <limits>
#include <vector>

#include "engine/json_schema.h"

namespace escala::server {

using nlohmann::json;

namespace {

ApiError bad(std::string message, std::string param, std::string code = "invalid_value") {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    case json::value_t::number_float: return "number";
    default: return "integer";
  }
}

ApiError wrong_type(const std::string& param, const json& v, const char* want) {
  return bad(fmt::format("'{}' must be {} (got {})", param, want, type_name(v)), param, "invalid_type");
}

// Optional numeric field within [lo, hi]; null means absent.
std::optional<ApiError> get_number(const json& b, const char* key, double lo, double hi, float& out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return wrong_type(key, *it, "a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi)
    return bad(fmt::format("'{}' must be between {} and {} (got {})", key, lo, hi, v), key);
  out = float(v);
  return std::nullopt;
}

std::optional<ApiError> get_int(const json& b, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return wrong_type(key, *it, "an integer");
  int64_t v = 0;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      return bad(fmt::format("'{}' must be between {} and {}", key, lo, hi), key);
    v = int64_t(u);
  } else {
    v = it->get<int64_t>();
  }
  if (v < lo || v > hi) return bad(fmt::format("'{}' must be between {} and {} (got {})", key, lo, hi, v), key);
  out = v;
  return std::nullopt;
}

std::optional<ApiError> get_bool(const json& b, const char* key, bool& out) {
  auto it = b.find(key);
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return wrong_type(key, *it, "a boolean");
  out = it->get<bool>();
  return std::nullopt;
}

// The text of a chat message's content: a string or an array of {"type": "text", "text": ...}.
std::optional<ApiError> content_text(const json& c, const std::string& param, std::string& out) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  if (c.is_null()) {
    out.clear();
    return std::nullopt;
  }
  if (!c.is_array()) return wrong_type(param, c, "a string or an array of text parts");
  out.clear();
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string pp = fmt::format("{}[{}]", param, i);
    if (!part.is_object()) return wrong_type(pp, part, "an object");
    auto t = part.find("type");
    if (t == part.end() || !t->is_string() || *t != "text")
      return bad(fmt::format("'{}.type' must be \"text\" (only text content is supported)", pp), pp + ".type");
    auto x = part.find("text");
    if (x == part.end() || !x->is_string()) return bad(fmt::format("'{}.text' must be a string", pp), pp + ".text");
    out += x->get<std::string>();
  }
  return std::nullopt;
}

// A JSON object body (within the depth limit), or the error.
std::optional<ApiError> parse_object(const std::string& body, const ProtocolContext& ctx, json& b) {
  if (json_depth(body, ctx.max_json_depth) > ctx.max_json_depth)
    return bad(fmt::format("the JSON body is nested deeper than {} levels", ctx.max_json_depth), "", "invalid_json");
  b = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (b.is_discarded()) return bad("the body is not valid JSON (UTF-8)", "", "invalid_json");
  if (!b.is_object()) return bad(fmt::format("the body must be a JSON object (got {})", type_name(b)), "", "invalid_json");
  return std::nullopt;
}

// One token id of an array (a prompt's, /detokenize's): an integer within the vocabulary.
std::optional<ApiError> append_token_id(const json& t, const char* param, const char* want,
                                        const model::Tokenizer& tok, std::vector<int32_t>& out) {
  if (!t.is_number_integer()) return wrong_type(param, t, want);
  const int64_t id = t.is_number_unsigned() ? int64_t(std::min<uint64_t>(t.get<uint64_t>(), 1ull << 40)) : t.get<int64_t>();
  if (id < 0 || id >= tok.vocab_size())
    return bad(fmt::format("token id {} is out of range [0, {})", id, tok.vocab_size()), param);
  out.push_back(int32_t(id));
  return std::nullopt;
}

// model: optional; when given it must name the served model.
std::optional<ApiError> check_model(const json& b, const ProtocolContext& ctx) {
  auto it = b.find("model");
  if (it == b.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return wrong_type("model", *it, "a string");
  if (*it == ctx.model_id) return std::nullopt;
  ApiError e = bad(fmt::format("The model '{}' does not exist (this server serves '{}')", it->get<std::string>(),
                               ctx.model_id),
                   "model", "model_not_found");
  e.status = 404;
  return e;
}
}  // namespace

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return dump(json{{"error", err}});
}

int json_depth(const std::string& body, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escape = false;
  for (char c : body) {
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

std::optional<ApiError> parse_request(const std::string& body, bool chat, const ProtocolContext& ctx, ApiRequest& out) {
  json b;
  if (auto e = parse_object(body, ctx, b)) return e;
  out = ApiRequest{};
  out.chat = chat;
  if (auto e = check_model(b, ctx)) return e;

  // n choices (the prompt computed once, then forked); best_of only as n, which it then equals.
  std::optional<int64_t> n;
  if (auto e = get_int(b, "n", 1, kMaxChoices, n)) return e;
  out.request.n = int32_t(n ? *n : 1);
  if (auto it = b.find("best_of"); it != b.end() && !it->is_null()) {
    if (!it->is_number_integer()) return wrong_type("best_of", *it, "an integer");
    if (*it != out.request.n) return bad("'best_of' is supported only equal to n (no ranking of choices)", "best_of");
  }
  // Unsupported features are refused rather than silently ignored.
  if (auto it = b.find("echo"); it != b.end() && !it->is_null()) {
    if (!it->is_boolean()) return wrong_type("echo", *it, "a boolean");
    if (it->get<bool>()) return bad("'echo' is not supported", "echo", "unsupported_value");
  }
  if (auto it = b.find("suffix"); it != b.end() && !it->is_null())
    return bad("'suffix' is not supported", "suffix", "unsupported_value");
  if (auto it = b.find("tools"); it != b.end() && !it->is_null() && !(it->is_array() && it->empty()))
    return bad("'tools' are not supported", "tools", "unsupported_value");

  // response_format: text, json_object (JSON mode) or json_schema (structured output).
  if (auto it = b.find("response_format"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("response_format", *it, "an object");
    auto t = it->find("type");
    if (t == it->end() || !t->is_string() || (*t != "text" && *t != "json_object" && *t != "json_schema"))
      return bad("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
    if (*t == "json_object") out.request.json_schema = engine::JsonSchema::any_object();
    if (*t == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        return bad("'response_format.json_schema' must be an object with a 'schema'", "response_format.json_schema");
      if (auto name = js->find("name"); name != js->end() && !name->is_string())
        return wrong_type("response_format.json_schema.name", *name, "a string");
      if (!js->contains("schema"))
        return bad("'response_format.json_schema.schema' is required", "response_format.json_schema.schema",
                   "missing_required_parameter");
      // Parsed again keeping the order of the keys: the properties come out in the order written.
      const auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
      auto schema = engine::JsonSchema::compile(ordered["response_format"]["json_schema"]["schema"]);
      if (!schema.ok()) return bad(schema.message(), "response_format.json_schema.schema");
      out.request.json_schema = *schema;
    }
  }
  if (auto it = b.find("user"); it != b.end() && !it->is_null() && !it->is_string())
    return wrong_type("user", *it, "a string");

  // Sampling: OpenAI's defaults (temperature 1, nucleus off), Escala's extensions optional.
  engine::SamplingParams& sp = out.request.sampling;
  sp.temperature = 1.0f;
  sp.top_p = 1.0f;
  sp.top_k = 0;
  sp.min_p = 0.0f;
  if (auto e = get_number(b, "temperature", 0.0, 2.0, sp.temperature)) return e;
  if (auto e = get_number(b, "top_p", 0.0, 1.0, sp.top_p)) return e;
  if (b.contains("top_p") && b["top_p"].is_number() && sp.top_p <= 0.0f) return bad("'top_p' must be > 0", "top_p");
  if (auto e = get_number(b, "min_p", 0.0, 1.0, sp.min_p)) return e;
  if (auto e = get_number(b, "presence_penalty", -2.0, 2.0, sp.presence_penalty)) return e;
  if (auto e = get_number(b, "frequency_penalty", -2.0, 2.0, sp.frequency_penalty)) return e;
  if (auto e = get_number(b, "repetition_penalty", 0.01, 10.0, sp.repetition_penalty)) return e;
  std::optional<int64_t> v;
  if (auto e = get_int(b, "top_k", -1, 1 << 20, v)) return e;
  if (v) sp.top_k = int32_t(std::max<int64_t>(0, *v));
  v.reset();
  if (auto e = get_int(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), v)) return e;
  static std::atomic<uint64_t> seed_counter{0x9E3779B97F4A7C15ull};
  sp.seed = v ? uint64_t(*v) : seed_counter.fetch_add(0x9E3779B97F4A7C15ull) ^ uint64_t(std::time(nullptr));
  if (auto e = get_bool(b, "ignore_eos", out.request.ignore_eos)) return e;
  // logit_bias: {"token id": bias in [-100, 100]}, ids written as plain decimals.
  if (auto it = b.find("logit_bias"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("logit_bias", *it, "an object");
    for (const auto& [key, val] : it->items()) {
      const std::string param = fmt::format("logit_bias.{}", key.substr(0, 32));
      const bool decimal = !key.empty() && key.size() <= 9 && std::all_of(key.begin(), key.end(), [](char c) {
        return c >= '0' && c <= '9';
      }) && (key.size() == 1 || key[0] != '0');
      if (!decimal || std::stol(key) >= ctx.tokenizer->vocab_size())
        return bad(fmt::format("'logit_bias' keys must be token ids in [0, {}) (got '{}')", ctx.tokenizer->vocab_size(),
                               key.substr(0, 32)),
                   param);
      if (!val.is_number()) return wrong_type(param, val, "a number");
      const double bias = val.get<double>();
      if (!std::isfinite(bias) || bias < -100 || bias > 100)
        return bad(fmt::format("'{}' must be between -100 and 100 (got {})", param, bias), param);
      sp.logit_bias.emplace_back(int32_t(std::stol(key)), float(bias));
    }
  }
  // logprobs: chat takes a boolean and top_logprobs (0-20), completions an integer (0-20).
  if (chat) {
    bool want = false;
    if (auto e = get_bool(b, "logprobs", want)) return e;
    std::optional<int64_t> top;
    if (auto e = get_int(b, "top_logprobs", 0, 20, top)) return e;
    if (top && !want) return bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    if (want) out.request.logprobs = int32_t(top ? *top : 0);
  } else {
    std::optional<int64_t> n_logprobs;
    if (auto e = get_int(b, "logprobs", 0, 20, n_logprobs)) return e;
    if (n_logprobs) out.request.logprobs = int32_t(*n_logprobs);
  }
  {
    Status s = sp.validate();
    if (!s.ok()) return bad(s.message(), "");
  }

  // stream, stream_options.include_usage
  if (auto e = get_bool(b, "stream", out.stream)) return e;
  if (auto it = b.find("stream_options"); it != b.end() && !it->is_null()) {
    if (!it->is_object()) return wrong_type("stream_options", *it, "an object");
    if (!out.stream) return bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (auto e = get_bool(*it, "include_usage", out.include_usage)) {
      e->param = "stream_options.include_usage";
      return e;
    }
  }

  // stop: a string or up to 4 strings.
  if (auto it = b.find("stop"); it != b.end() && !it->is_null()) {
    std::vector<std::string> stops;
    if (it->is_string()) {
      stops.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) return bad("'stop' takes at most 4 strings", "stop");
      for (const json& s : *it) {
        if (!s.is_string()) return wrong_type("stop", s, "a string or an array of strings");
        stops.push_back(s.get<std::string>());
      }
    } else {
      return wrong_type("stop", *it, "a string or an array of strings");
    }
    for (const auto& s : stops)
      if (s.empty()) return bad("stop strings must not be empty", "stop");
    out.request.stop = std::move(stops);
  }

  // The prompt, as tokens.
  const model::Tokenizer& tok = *ctx.tokenizer;
  model::EncodeOptions eo;
  eo.parse_special = true;
  std::vector<int32_t> prompt;
  const char* prompt_param = chat ? "messages" : "prompt";
  if (chat) {
    auto it = b.find("messages");
    if (it == b.end() || it->is_null()) return bad("'messages' is required", "messages", "missing_required_parameter");
    if (!it->is_array()) return wrong_type("messages", *it, "an array");
    if (it->empty()) return bad("'messages' must not be empty", "messages");
    std::vector<model::ChatMessage> msgs;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      const std::string mp = fmt::format("messages[{}]", i);
      if (!m.is_object()) return wrong_type(mp, m, "an object");
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) return bad(fmt::format("'{}.role' must be a string", mp), mp + ".role");
      std::string r = role->get<std::string>();
      if (r == "developer") r = "system";
      if (r != "system" && r != "user" && r != "assistant")
        return bad(fmt::format("'{}.role' must be system, developer, user or assistant (got '{}')", mp, r), mp + ".role");
      auto content = m.find("content");
      if (content == m.end()) return bad(fmt::format("'{}.content' is required", mp), mp + ".content");
      std::string text;
      if (auto e = content_text(*content, mp + ".content", text)) return e;
      msgs.push_back({r, std::move(text)});
    }
    auto rendered = ctx.chat_template->render(msgs, true);
    if (!rendered.ok()) return bad(rendered.message(), "messages");
    auto ids = tok.encode(*rendered, eo);
    if (!ids.ok()) return bad(ids.message(), "messages");
    prompt = std::move(*ids);
  } else {
    auto it = b.find("prompt");
    if (it == b.end() || it->is_null()) return bad("'prompt' is required", "prompt", "missing_required_parameter");
    const json* p = &*it;
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
    if (p->is_string()) {
      auto ids = tok.encode(p->get<std::string>(), eo);
      if (!ids.ok()) return bad(ids.message(), "prompt");
      prompt = std::move(*ids);
    } else if (p->is_array()) {
      for (const json& t : *p) {
        if (t.is_string()) return bad("only one prompt per request is supported", "prompt", "unsupported_value");
        if (auto e = append_token_id(t, "prompt", "a string or an array of token ids", tok, prompt)) return e;
      }
    } else {
      return wrong_type("prompt", *p, "a string or an array of token ids");
    }
  }
  if (prompt.empty()) return bad("the prompt is empty", prompt_param);
  if (int64_t(prompt.size()) >= ctx.max_context)
    return bad(fmt::format("This model's maximum context length is {} tokens; the prompt has {} tokens",
                           ctx.max_context, prompt.size()),
               prompt_param, "context_length_exceeded");

  // max_tokens (max_completion_tokens for chat): at least 1, and within the context.
  const int64_t room = int64_t(ctx.max_context) - int64_t(prompt.size());
  std::optional<int64_t> max_tokens;
  const char* mt_key = "max_tokens";
  if (chat && b.contains("max_completion_tokens") && !b["max_completion_tokens"].is_null()) mt_key = "max_completion_tokens";
  if (auto e = get_int(b, mt_key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), max_tokens)) return e;
  if (max_tokens) {
    if (*max_tokens < 1) return bad(fmt::format("'{}' must be at least 1 (got {})", mt_key, *max_tokens), mt_key);
    if (*max_tokens > room)
      return bad(fmt::format("This model's maximum context length is {} tokens; the prompt ({} tokens) plus {} ({}) "
                             "exceeds it",
                             ctx.max_context, prompt.size(), mt_key, *max_tokens),
                 mt_key, "context_length_exceeded");
  }
  out.request.max_tokens = int32_t(max_tokens ? *max_tokens : chat ? room : std::min<int64_t>(16, room));
  out.request.prompt = std::move(prompt);
  return std::nullopt;
}

std::optional<ApiError> tokenize_request(const std::string& body, const ProtocolContext& ctx, json& out) {
  json b;
  if (auto e = parse_object(body, ctx, b)) return e;
  if (auto e = check_model(b, ctx)) return e;
  auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) return bad("'prompt' is required", "prompt", "missing_required_parameter");
  if (!it->is_string()) return wrong_type("prompt", *it, "a string");
  model::EncodeOptions eo;
  eo.parse_special = true;
  if (auto e = get_bool(b, "add_special_tokens", eo.add_special)) return e;
  auto ids = ctx.tokenizer->encode(it->get<std::string>(), eo);
  if (!ids.ok()) return bad(ids.message(), "prompt");
  out = json{{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", ctx.max_context}};
  return std::nullopt;
}

std::optional<ApiError> detokenize_request(const std::string& body, const ProtocolContext& ctx, json& out) {
  json b;
  if (auto e = parse_object(body, ctx, b)) return e;
  if (auto e = check_model(b, ctx)) return e;
  auto it = b.find("tokens");
  if (it == b.end() || it->is_null()) return bad("'tokens' is required", "tokens", "missing_required_parameter");
  if (!it->is_array()) return wrong_type("tokens", *it, "an array of token ids");
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (auto e = append_token_id(t, "tokens", "an array of token ids", *ctx.tokenizer, ids)) return e;
  }
  model::DecodeOptions d;
  d.render_special = true;
  auto text = ctx.tokenizer->decode(ids, d);
  if (!text.ok()) return bad(text.message(), "tokens");
  out = json{{"prompt", *text}};
  return std::nullopt;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json logprobs_json(bool chat, const std::vector<engine::TokenLogprob>& lps, const model::Tokenizer& tok,
                   int64_t& text_offset) {
  auto piece = [&](int32_t id) { return tok.token_to_piece(id, /*render_special=*/true); };
  if (chat) {
    auto entry = [&](int32_t id, float lp) {
      const std::string s = piece(id);
      json bytes = json::array();
      for (unsigned char c : s) bytes.push_back(int(c));
      return json{{"token", s}, {"logprob", lp}, {"bytes", bytes}};
    };
    json content = json::array();
    for (const auto& t : lps) {
      json e = entry(t.token, t.logprob);
      json top = json::array();
      for (const auto& [id, lp] : t.top) top.push_back(entry(id, lp));
      e["top_logprobs"] = top;
      content.push_back(e);
    }
    return json{{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  for (const auto& t : lps) {
    const std::string s = piece(t.token);
    tokens.push_back(s);
    token_logprobs.push_back(t.logprob);
    json alts = json::object();
    for (const auto& [id, lp] : t.top) alts[piece(id)] = lp;
    top.push_back(alts);
    offsets.push_back(text_offset);
    // characters: every byte that does not continue a UTF-8 sequence
    for (unsigned char c : s) text_offset += (c & 0xC0) != 0x80;
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

json completion_response(bool chat, const std::string& id, int64_t created, const std::string& model,
                         const std::vector<ChoiceResult>& choices, const Usage& usage) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"logprobs", c.logprobs}, {"finish_reason", c.finish_reason}};
    if (chat) choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else choice["text"] = c.text;
    list.push_back(std::move(choice));
  }
  return json{{"id", id},
              {"object", chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", list},
              {"usage", usage_json(usage)}};
}

json stream_chunk(bool chat, const std::string& id, int64_t created, const std::string& model, int index,
                  const std::string& text, const char* finish_reason, bool first, const json& logprobs) {
  json choice = {{"index", index}, {"logprobs", logprobs}};
  choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && !finish_reason)) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return json{{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({choice})}};
}

json usage_chunk(bool chat, const std::string& id, int64_t created, const std::string& model, const Usage& usage) {
  return json{{"id", id},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array()},
              {"usage", usage_json(usage)}};
}

}  // namespace escala::server
