// nlohmann::json as the reference for JSON mode's recogniser: is a text one JSON object?
#pragma once

#include <nlohmann/json.hpp>

#include <string>

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

}  // namespace escala::test
