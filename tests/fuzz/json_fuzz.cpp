// libFuzzer target for JSON mode's recogniser (src/engine/json_prefix.cpp): whatever it accepts as a
// complete object nlohmann::json parses as an object; every object nlohmann accepts (within the
// whitespace and depth caps, nothing after it) is accepted byte by byte; and no accepted prefix is a
// dead end (some byte goes on, or the object is complete). The same text is also fed to a few
// schemas with string lengths and integer bounds: no dead end there either, and what they accept
// as complete follows them (json_reference.h's tree validator).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "../unit/json_reference.h"
#include "engine/json_prefix.h"
#include "engine/json_schema.h"
#include "server/protocol.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "json fuzz: %s (%zu bytes)\n", what, text.size());
  std::abort();
}

// Schemas with string lengths and integer bounds (anyOf branches: a string, an integer, an object).
const std::vector<std::shared_ptr<const escala::engine::JsonSchema>>& bounded_schemas() {
  static const auto schemas = [] {
    std::vector<std::shared_ptr<const escala::engine::JsonSchema>> out;
    for (const char* text : {
             R"({"type":"array","items":{"anyOf":[{"type":"string","minLength":1,"maxLength":3},)"
             R"({"type":"integer","minimum":-20,"exclusiveMaximum":300.5},{"type":"object","properties":)"
             R"({"s":{"type":"string","minLength":2},"n":{"type":"integer","exclusiveMinimum":-9223372036854775808,)"
             R"("maximum":9223372036854775807}},"required":["s"]}]}})",
             R"({"type":"object","properties":{"a":{"type":"string","maxLength":0},"b":{"type":"integer","minimum":10},)"
             R"("c":{"type":"integer","maximum":-10},"d":{"type":["string","null"],"minLength":2,"maxLength":2}}})"}) {
      auto s = escala::engine::JsonSchema::compile(nlohmann::ordered_json::parse(text));
      if (!s.ok()) fail(s.message().c_str(), text);
      out.push_back(*s);
    }
    return out;
  }();
  return schemas;
}

// nlohmann cannot hold a number of more than about 309 digits (a valid integer here).
bool long_digit_run(const std::string& text) {
  size_t run = 0;
  for (char c : text)
    if ((run = (c >= '0' && c <= '9') ? run + 1 : 0) > 300) return true;
  return false;
}

void check_bounded(const escala::engine::JsonSchema& schema, const std::string& text) {
  escala::engine::JsonPrefix p(&schema);
  for (char c : text) {
    if (!escala::test::can_continue(p)) fail("dead end under a schema", text);
    if (!p.feed(uint8_t(c))) return;
  }
  if (!p.complete() || long_digit_run(text)) return;
  const auto parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !escala::test::valid(schema, schema.root(), parsed))
    fail("accepted a text that does not follow the schema", text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using escala::engine::JsonPrefix;
  const std::string text(reinterpret_cast<const char*>(data), size);
  JsonPrefix p;
  size_t i = 0;
  for (; i < size; ++i) {
    if (!escala::test::can_continue(p)) fail("dead end", text);
    if (!p.feed(data[i])) break;
  }
  const bool accepted = i == size && p.complete();
  const bool reference = escala::test::is_json_object(text);
  if (accepted && !reference) fail("accepted a text that is not one JSON object", text);
  const bool trailing_ws = size > 0 && (text.back() == ' ' || text.back() == '\n' || text.back() == '\t' ||
                                        text.back() == '\r');
  bool long_ws = false;
  for (size_t k = 0, run = 0; k < size; ++k) {
    run = (text[k] == ' ' || text[k] == '\n' || text[k] == '\t' || text[k] == '\r') ? run + 1 : 0;
    long_ws = long_ws || run > size_t(JsonPrefix::kMaxWhitespaceRun);
  }
  if (reference && !accepted && !trailing_ws && !long_ws && escala::server::json_depth(text, 40) <= 32)
    fail("refused a JSON object", text);
  for (const auto& schema : bounded_schemas()) check_bounded(*schema, text);
  return 0;
}
