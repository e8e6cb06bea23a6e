// libFuzzer target for the OpenAI request parser: any body must give a 4xx error whose body is an
// OpenAI error object, or a request the engine can run (a non-empty prompt of valid ids that fits
// the context with its max_tokens, valid sampling parameters). The input's first byte picks the
// endpoint (mod 4: /v1/completions, /v1/chat/completions, /tokenize, /detokenize); the rest is the
// body.
//
// Build and run (clang): see tests/fuzz/CMakeLists.txt.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/json_prefix.h"
#include "fuzz_vocab.h"
#include "server/protocol.h"

namespace {

using namespace escala;

[[noreturn]] void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "protocol fuzz: %s %s\n", what, detail.c_str());
  std::abort();
}

struct Context {
  model::Tokenizer tokenizer;
  model::ChatTemplate chat_template;
  server::ProtocolContext ctx;
  Context()
      : tokenizer(model_or_hand_made()),
        chat_template([&] {
          auto t = model::ChatTemplate::for_model(tokenizer, tokenizer.chat_template().empty() ? "chatml" : "");
          if (!t.ok()) fail("chat template:", t.message());
          return *t;
        }()) {
    ctx.model_id = "fuzz-model";
    ctx.tokenizer = &tokenizer;
    ctx.chat_template = &chat_template;
    ctx.max_context = 512;
  }
  static model::Tokenizer model_or_hand_made() {
    if (const model::Tokenizer* t = fuzz::model_tokenizer()) return *t;
    return fuzz::must(model::Tokenizer::from_vocab(model::bpe_vocab("smollm", fuzz::fuzz_merges())));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Context c;
  if (size == 0) return 0;
  const int endpoint = data[0] % 4;
  const bool chat = endpoint == 1;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto check_error = [](const server::ApiError& e) {
    if (e.status < 400 || e.status > 499) fail("error status is not 4xx:", std::to_string(e.status));
    if (e.message.empty()) fail("empty error message");
    const auto j = nlohmann::json::parse(server::error_body(e), nullptr, false);
    if (j.is_discarded() || !j.contains("error") || !j["error"]["message"].is_string())
      fail("error body is not an OpenAI error object:", server::error_body(e));
  };
  if (endpoint >= 2) {
    nlohmann::json out;
    auto e = endpoint == 2 ? server::tokenize_request(body, c.ctx, out) : server::detokenize_request(body, c.ctx, out);
    if (e) {
      check_error(*e);
    } else if (endpoint == 2) {
      if (!out["tokens"].is_array() || out["count"] != out["tokens"].size()) fail("tokenize: bad body", server::dump(out));
      for (const auto& t : out["tokens"])
        if (!t.is_number_integer() || t < 0 || t >= c.tokenizer.vocab_size()) fail("tokenize: bad id", server::dump(t));
    } else if (!out["prompt"].is_string()) {
      fail("detokenize: no text", server::dump(out));
    }
    (void)server::dump(out);
    return 0;
  }
  server::ApiRequest req;
  if (auto e = server::parse_request(body, chat, c.ctx, req)) {
    check_error(*e);
    return 0;
  }
  const engine::Request& r = req.request;
  if (r.prompt.empty()) fail("accepted an empty prompt");
  for (int32_t id : r.prompt)
    if (id < 0 || id >= c.tokenizer.vocab_size()) fail("accepted an out-of-range token id", std::to_string(id));
  if (r.max_tokens < 1 || int64_t(r.prompt.size()) + r.max_tokens > c.ctx.max_context)
    fail("accepted a request that does not fit the context:",
         std::to_string(r.prompt.size()) + " + " + std::to_string(r.max_tokens));
  if (!r.sampling.validate().ok()) fail("accepted invalid sampling parameters", r.sampling.validate().message());
  if (req.chat != chat || (req.include_usage && !req.stream)) fail("accepted inconsistent stream options");
  for (const std::string& s : r.stop)
    if (s.empty()) fail("accepted an empty stop string");
  if (r.logprobs < -1 || r.logprobs > 20) fail("accepted logprobs", std::to_string(r.logprobs));
  if (r.json_schema) {  // a compiled schema lets some byte begin the output
    bool any = false;
    for (int c = 0; c < 256 && !any; ++c) {
      engine::JsonPrefix p(r.json_schema.get());
      any = p.feed(uint8_t(c));
    }
    if (!any) fail("accepted a schema that no output can begin");
  }
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (id >= c.tokenizer.vocab_size()) fail("accepted a logit_bias id beyond the vocabulary", std::to_string(id));
  return 0;
}
