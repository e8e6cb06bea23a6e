// Checks shared by the structured-output tests and the json fuzz target: nlohmann::json as the
// reference (is a text one JSON object? does a parsed value follow a compiled schema?) and the
// recogniser's no-dead-end property.
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
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

// Characters (Unicode code points) of a parsed string, which nlohmann holds as UTF-8: the bytes
// that are not continuation bytes (10xxxxxx).
inline int64_t code_points(const std::string& utf8) {
  int64_t n = 0;
  for (char c : utf8) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

inline bool within_length(const engine::JsonSchemaNode& n, const std::string& s) {
  const int64_t len = code_points(s);
  return len >= n.min_length && (n.max_length < 0 || len <= n.max_length);
}

// An integer against the bounds, exactly: nlohmann holds one beyond 64 bits as a float, whose
// magnitude is then at least 2^63, beyond every bound on its side.
inline bool within_bounds(const engine::JsonSchemaNode& n, const nlohmann::ordered_json& v) {
  if (v.is_number_float()) return v.get<double>() > 0 ? !n.maximum : !n.minimum;
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) return !n.maximum;
  const int64_t x = v.get<int64_t>();
  return (!n.minimum || x >= *n.minimum) && (!n.maximum || x <= *n.maximum);
}

// A float that only an integer text beyond 64 bits gives (the recogniser reads no fraction or
// exponent for integer-only nodes).
inline bool long_integer(const nlohmann::ordered_json& v) {
  const double x = v.get<double>();
  return std::fabs(x) >= 0x1p63 && std::trunc(x) == x;
}

// An independent validator: the instance (parsed) against the compiled node i (-1: any), as a tree.
inline bool valid(const engine::JsonSchema& s, int32_t i, const nlohmann::ordered_json& v) {
  using namespace engine;
  if (i < 0) return true;
  const JsonSchemaNode& n = s.node(i);
  if (!n.literals.empty()) {
    for (const auto& l : n.literals)
      if (v.dump() == l) return true;
    return false;
  }
  if (!n.any_of.empty()) {
    for (int32_t b : n.any_of)
      if (valid(s, b, v)) return true;
    return false;
  }
  if (v.is_object()) {
    if (!(n.types & kJsonObject)) return false;
    if (!n.keyed) return true;
    size_t at = 0;
    for (const auto& [k, x] : v.items()) {
      const std::string key = nlohmann::ordered_json(k).dump();
      while (at < n.properties.size() && n.properties[at].key != key) {
        if (n.properties[at].required) return false;  // a required key skipped
        ++at;
      }
      if (at == n.properties.size() || !valid(s, n.properties[at].node, x)) return false;
      ++at;
    }
    for (; at < n.properties.size(); ++at)
      if (n.properties[at].required) return false;
    return true;
  }
  if (v.is_array()) {
    if (!(n.types & kJsonArray) || int64_t(v.size()) < n.min_items || (n.max_items >= 0 && int64_t(v.size()) > n.max_items))
      return false;
    for (const auto& x : v)
      if (!valid(s, n.items, x)) return false;
    return true;
  }
  if (v.is_string()) return (n.types & kJsonString) && within_length(n, v.get_ref<const std::string&>());
  if (v.is_boolean()) return n.types & kJsonBoolean;
  if (v.is_null()) return n.types & kJsonNull;
  if (n.types & kJsonNumber) return true;  // no bounds on such nodes
  const bool integer = v.is_number_integer() || long_integer(v);
  return (n.types & kJsonInteger) && integer && within_bounds(n, v);
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
