// libFuzzer target for JSON mode's recogniser (src/engine/json_prefix.cpp): whatever it accepts as a
// complete object nlohmann::json parses as an object; every object nlohmann accepts (within the
// whitespace and depth caps, nothing after it) is accepted byte by byte; and no accepted prefix is a
// dead end (some byte goes on, or the object is complete).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../unit/json_reference.h"
#include "engine/json_prefix.h"
#include "server/protocol.h"

namespace {

[[noreturn]] void fail(const char* what, const std::string& text) {
  std::fprintf(stderr, "json fuzz: %s (%zu bytes)\n", what, text.size());
  std::abort();
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
  return 0;
}
