// Checks shared by the structured-output tests and the json fuzz target: nlohmann::json as the
// reference (is a text one JSON object?) and the recogniser's no-dead-end property.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "engine/json_prefix.h"

namespace escala::test {

// nlohmann refuses numbers beyond double's range (valid JSON), so the digits after every 'e' / 'E'
// (and its sign) become zeros first: that changes no text's validity (exponent digits are free,
// leading zeros included; in strings and \u escapes digits stay digits) and leaves no exponent to
// overflow.
// A NUL byte is never valid JSON, but nlohmann's lexer reads it as the end of the input.
inline bool is_json_object(std::string s) {
  if (s.find('\0') != std::string::npos) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != 'e' && s[i] != 'E') continue;
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    for (; j < s.size() && s[j] >= '0' && s[j] <= '9'; ++j) s[j] = '0';
  }
  return nlohmann::json::accept(s) && nlohmann::json::parse(s).is_object();
}

// No dead ends: from an accepted prefix some byte goes on, unless the value is complete.
inline bool can_continue(const engine::JsonPrefix& p) {
  if (p.complete()) return true;
  for (int c = 0; c < 256; ++c) {
    engine::JsonPrefix q = p;
    if (q.feed(uint8_t(c))) return true;
  }
  return false;
}

}  // namespace escala::test
