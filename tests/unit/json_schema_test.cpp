// Structured output: schemas compile (unsupported keywords refused with their path), and the
// recogniser follows them. Property test: random schemas, random instances generated from them are
// accepted byte by byte; random mutations of those instances, when accepted as complete, pass an
// independent tree validator; no accepted prefix is a dead end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/json_prefix.h"
#include "engine/json_schema.h"
#include "json_reference.h"

namespace escala::engine {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const JsonSchema> must_compile(const std::string& text) {
  auto s = JsonSchema::compile(ojson::parse(text));
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok() ? *s : JsonSchema::any_object();
}

bool accepts(const JsonSchema& schema, const std::string& text) {
  JsonPrefix p(&schema);
  return p.feed(text) && p.complete();
}

const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "description": "ignored"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 1, 10]}, "maxItems": 2},
    "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
    "ok": {"type": "boolean"},
    "score": {"type": ["number", "null"]}
  },
  "required": ["name", "age"],
  "additionalProperties": false,
  "$defs": {"Pet": {"type": "object", "properties": {"kind": {"const": "cat"}, "kids": {"type": "array",
                    "items": {"$ref": "#/$defs/Pet"}, "minItems": 1}}, "required": ["kind"]}}
})";

TEST(JsonSchema, FollowsAPersonSchema) {
  const auto s = must_compile(kPerson);
  for (const char* ok : {R"({"name":"x","age":3})", R"({ "name" : "Ann", "age" : -0 , "ok" : false })",
                         R"({"name":"x","age":3,"tags":["a",10],"pet":{"kind":"cat","kids":[{"kind":"cat"}]},"ok":true})",
                         R"({"name":"x","age":3,"tags":[1],"pet":null,"score":2.5e3})", R"({"name":"","age":0,"tags":[]})",
                         R"({"name":"x","age":3,"score":null})"})
    EXPECT_TRUE(accepts(*s, ok)) << ok;
  for (const char* bad : {R"({"age":3,"name":"x"})", R"({"name":"x"})", R"({"name":"x","age":3.5})",
                          R"({"name":"x","age":3,"tags":["c"]})", R"({"name":"x","age":3,"tags":["a","b","a"]})",
                          R"({"name":"x","age":3,"extra":1})", R"({"name":1,"age":3})", R"({"name":"x","age":1e2})",
                          R"({"name":"x","age":3,"pet":{"kind":"dog"}})", R"({"name":"x","age":3,"ok":"yes"})",
                          R"({"name":"x","age":3,"pet":{"kind":"cat","kids":[]}})", R"({"name":"x","age":3,"tags":[100]})",
                          R"({"name":"x","age":3,"ok":true,"tags":[]})", R"(["name"])", R"({"name":"x","age":3,})"})
    EXPECT_FALSE(accepts(*s, bad)) << bad;
}

TEST(JsonSchema, RefusesWhatItCannotEnforce) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"integer","multipleOf":3})", "schema: 'multipleOf' is not supported"},
      {R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})", "schema.properties.a: 'pattern'"},
      {R"({"$ref":"#/$defs/Nope"})", "is not defined"},
      {R"({"$ref":"http://x/y"})", "only references to"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "'b' is not among the properties"},
      {R"({"type":"object","properties":{"a":{}},"additionalProperties":true})", "only false is supported"},
      {R"({"anyOf":[{"type":"object"},{"type":"object","properties":{}}]})", "the same byte"},
      {R"({"anyOf":[{"enum":[1,2]},{"type":"integer"}]})", "the same byte"},
      {R"({"type":"array","minItems":3,"maxItems":2})", "minItems is above maxItems"},
      {R"({"type":"array","items":[{"type":"string"}]})", "tuple items"},
      {R"({"type":"wizard"})", "unknown type 'wizard'"},
      {R"(false)", "allows no value"},
      {R"({"enum":[]})", "non-empty array"},
      {R"(3)", "must be an object or a boolean"},
  };
  // Size bounds (a token mask pass checks every key and enum byte against the candidates).
  ojson big_enum = {{"enum", ojson::array()}};
  for (int i = 0; i < 300; ++i) big_enum["enum"].push_back(i);
  EXPECT_NE(JsonSchema::compile(big_enum).message().find("more than 256 values"), std::string::npos);
  ojson nested = ojson::object();
  for (int i = 0; i < 17; ++i) nested = ojson{{"type", "array"}, {"items", nested}};
  ojson wide = {{"type", "object"}, {"properties", ojson::object()}};
  for (int i = 0; i < 250; ++i) wide["properties"][std::to_string(i)] = nested;  // 250 x 18 nodes
  EXPECT_NE(JsonSchema::compile(wide).message().find("more than 4096 parts"), std::string::npos);
  for (const auto& [schema, message] : cases) {
    auto s = JsonSchema::compile(ojson::parse(schema));
    ASSERT_FALSE(s.ok()) << schema;
    EXPECT_NE(s.message().find(message), std::string::npos) << schema << " -> " << s.message();
  }
}

TEST(JsonSchema, EnumValuesThatPrefixEachOther) {
  const auto s = must_compile(R"({"type":"object","properties":{"n":{"enum":[1,10,100,"1"]},"m":{"const":[1,{"a":null}]}},
                                  "required":["n"]})");
  for (const char* ok : {R"({"n":1})", R"({"n":10 })", R"({"n":100,"m":[1,{"a":null}]})", R"({"n":"1"})"})
    EXPECT_TRUE(accepts(*s, ok)) << ok;
  for (const char* bad : {R"({"n":1000})", R"({"n":2})", R"({"n":"10"})", R"({"n":1,"m":[1, {"a":null}]})"})
    EXPECT_FALSE(accepts(*s, bad)) << bad;
}

// Each keyword's value as the compiled node holds it: lengths as given, integer bounds inclusive.
TEST(JsonSchema, CompilesLengthAndIntegerBounds) {
  auto node = [](const std::string& text) { return must_compile(text)->node(0); };
  using Bounds = std::pair<std::optional<int64_t>, std::optional<int64_t>>;
  auto bounds = [&](const std::string& text) {
    const JsonSchemaNode n = node(text);
    return Bounds{n.minimum, n.maximum};
  };
  const JsonSchemaNode str = node(R"({"type":"string","minLength":2,"maxLength":5})");
  EXPECT_EQ(str.min_length, 2);
  EXPECT_EQ(str.max_length, 5);
  EXPECT_EQ(node(R"({"type":"string"})").max_length, -1);
  EXPECT_EQ(node(R"({"type":"string","maxLength":0})").max_length, 0);
  EXPECT_EQ(node(R"({"minLength":1})").min_length, 1);  // no type: any value, strings of 1 or more
  const std::pair<const char*, Bounds> cases[] = {
      {R"({"type":"integer"})", {std::nullopt, std::nullopt}},
      {R"({"type":"integer","minimum":-3,"maximum":7})", {-3, 7}},
      {R"({"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":7})", {4, 6}},
      {R"({"type":"integer","minimum":2.5,"maximum":6.5})", {3, 6}},
      {R"({"type":"integer","exclusiveMinimum":2.5,"exclusiveMaximum":6.5})", {3, 6}},
      {R"({"type":"integer","minimum":-2.5,"maximum":-0.5})", {-2, -1}},
      {R"({"type":"integer","exclusiveMinimum":-2.5,"exclusiveMaximum":-0.5})", {-2, -1}},
      {R"({"type":"integer","exclusiveMinimum":3.0,"maximum":4.0})", {4, 4}},
      {R"({"type":"integer","minimum":5,"exclusiveMinimum":5,"maximum":9,"exclusiveMaximum":8})", {6, 7}},
      {R"({"type":"integer","minimum":5,"exclusiveMinimum":1})", {5, std::nullopt}},
      {R"({"type":"integer","maximum":-9223372036854775808})", {std::nullopt, INT64_MIN}},
      {R"({"type":"integer","minimum":-9223372036854775808,"maximum":9223372036854775807})", {INT64_MIN, INT64_MAX}},
      {R"({"type":"integer","exclusiveMinimum":-9223372036854775808,"exclusiveMaximum":9223372036854775807})",
       {INT64_MIN + 1, INT64_MAX - 1}},
      {R"({"type":"integer","minimum":-9.2e18})", {-9200000000000000000, std::nullopt}},
      {R"({"type":["integer","null"],"minimum":0})", {0, std::nullopt}},
      {R"({"type":"string","maximum":3})", {std::nullopt, 3}},  // no numbers at all: nothing to bound
  };
  for (const auto& [schema, want] : cases) EXPECT_EQ(bounds(schema), want) << schema;
}

TEST(JsonSchema, RefusesBadLengthAndIntegerBounds) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"object","properties":{"a":{"type":"string","minLength":-1}}})",
       "schema.properties.a.minLength: must be a non-negative integer"},
      {R"({"type":"string","maxLength":1.5})", "schema.maxLength: must be a non-negative integer"},
      {R"({"type":"string","maxLength":"3"})", "schema.maxLength: must be a non-negative integer"},
      {R"({"type":"string","minLength":3,"maxLength":2})", "schema: minLength is above maxLength"},
      {R"({"enum":["a","bb"],"maxLength":1})", "schema: 'maxLength' next to 'enum', 'const', 'anyOf' or 'oneOf'"},
      {R"({"const":"abc","minLength":1})", "'minLength' next to 'enum'"},
      {R"({"anyOf":[{"type":"string"},{"type":"null"}],"minLength":1})", "'minLength' next to 'enum'"},
      {R"({"enum":[1,2],"minimum":2})", "'minimum' next to 'enum'"},
      {R"({"oneOf":[{"type":"integer"},{"type":"null"}],"maximum":2})", "'maximum' next to 'enum'"},
      {R"({"type":"object","properties":{"x":{"type":"number","minimum":0}}})",
       "schema.properties.x: 'minimum' is supported on integers only"},
      {R"({"type":["integer","number"],"exclusiveMaximum":3})", "'exclusiveMaximum' is supported on integers only"},
      {R"({"maximum":3})", "'maximum' is supported on integers only"},  // no type: any number
      {R"({"type":"integer","minimum":"3"})", "schema.minimum: must be a number"},
      {R"({"type":"integer","minimum":0,"exclusiveMinimum":true})", "schema.exclusiveMinimum: must be a number"},
      {R"({"type":"integer","maximum":9223372036854775808})", "schema.maximum: is outside the 64-bit integer range"},
      {R"({"type":"integer","minimum":1e19})", "schema.minimum: is outside the 64-bit integer range"},
      {R"({"type":"integer","minimum":-1e19})", "schema.minimum: is outside the 64-bit integer range"},
      {R"({"type":"integer","maximum":9223372036854775807.0})", "schema.maximum: is outside the 64-bit integer range"},
      {R"({"type":"integer","exclusiveMinimum":9223372036854775807})",
       "schema.exclusiveMinimum: is outside the 64-bit integer range"},
      {R"({"type":"integer","exclusiveMaximum":-9223372036854775808})",
       "schema.exclusiveMaximum: is outside the 64-bit integer range"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "schema: no integer is within the bounds"},
      {R"({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})", "no integer is within the bounds"},
      {R"({"type":"integer","minimum":2.1,"maximum":2.9})", "no integer is within the bounds"},
  };
  for (const auto& [schema, message] : cases) {
    auto s = JsonSchema::compile(ojson::parse(schema));
    ASSERT_FALSE(s.ok()) << schema;
    EXPECT_NE(s.message().find(message), std::string::npos) << schema << " -> " << s.message();
  }
}

// ---- the property test ----

struct SchemaMaker {
  std::mt19937& rng;
  int pick(int n) { return int(rng() % uint32_t(n)); }

  ojson scalar_type() {
    static const char* kTypes[] = {"string", "integer", "number", "boolean", "null"};
    return kTypes[pick(5)];
  }
  // Often, the bounds its type takes: lengths on strings, bounds on integers.
  ojson with_bounds(ojson s) {
    const ojson t = s["type"];  // a copy: adding keywords moves s's members
    const auto is = [&](const char* name) { return t == name || (t.is_array() && t[0] == name); };
    if (is("string") && pick(3)) add_lengths(s);
    if (is("integer") && pick(3)) add_integer_bounds(s);
    return s;
  }
  void add_lengths(ojson& s) {
    const int min = pick(2) ? 0 : pick(4);
    if (min > 0) s["minLength"] = min;
    if (pick(3)) s["maxLength"] = min + pick(3);
  }
  // Ranges straddling 0, negative or positive, single values, at the int64 extremes; either side
  // may be left out.
  void add_integer_bounds(ojson& s) {
    static const int64_t kEdges[] = {INT64_MIN, INT64_MIN + 1, -1000, -20, -10, -1, 0,
                                     1,         5,             10,    99,  100, 1000, INT64_MAX - 1, INT64_MAX};
    auto edge = [&] { return pick(4) ? kEdges[pick(int(std::size(kEdges)))] : int64_t(pick(20000)) - 10000; };
    int64_t lo = edge(), hi = edge();
    if (lo > hi) std::swap(lo, hi);
    if (pick(4)) write_bound(s, lo, true);
    if (pick(4)) write_bound(s, hi, false);
  }
  // The inclusive bound b, written as minimum / maximum, as an exclusive bound one past, or as a
  // fraction half-way to the next integer outside.
  void write_bound(ojson& s, int64_t b, bool lower) {
    const int form = pick(3);
    if (form == 1 && b != (lower ? INT64_MIN : INT64_MAX)) {
      s[lower ? "exclusiveMinimum" : "exclusiveMaximum"] = lower ? b - 1 : b + 1;
    } else if (form == 2 && b > -1000000 && b < 1000000) {
      s[lower ? "minimum" : "maximum"] = double(b) + (lower ? -0.5 : 0.5);
    } else {
      s[lower ? "minimum" : "maximum"] = b;
    }
  }
  ojson make(int depth) {
    switch (depth > 0 ? pick(7) : pick(4)) {
      case 0: return with_bounds(ojson{{"type", scalar_type()}});
      case 1: return with_bounds(ojson{{"type", ojson::array({scalar_type(), "null"})}});
      case 2: return ojson{{"enum", ojson::array({1, 10, "x", "x\u00e9", 2.5, nullptr, true})}};
      case 3: return ojson{{"const", pick(2) ? ojson("c") : ojson(100)}};
      case 4: {
        ojson a = {{"type", "array"}, {"items", make(depth - 1)}};
        if (pick(2)) a["minItems"] = pick(2);
        if (pick(2)) a["maxItems"] = 1 + pick(3);
        return a;
      }
      case 5: return ojson{{"anyOf", ojson::array({make_object(depth - 1), ojson{{"type", "null"}}})}};
      default: return make_object(depth - 1);
    }
  }
  ojson make_object(int depth) {
    ojson o = {{"type", "object"}};
    if (pick(5) == 0) return o;  // any object
    ojson props = ojson::object(), req = ojson::array();
    static const char* kNames[] = {"a", "ab", "b", "name", "n\u00e9", "q\"uote", "x"};
    for (int i = 0, k = pick(5); i < k; ++i) {
      const std::string name = std::string(kNames[pick(7)]) + std::to_string(i);
      props[name] = make(depth);
      if (pick(2)) req.push_back(name);
    }
    o["properties"] = props;
    o["required"] = req;
    return o;
  }
};

// A random string within the node's length bounds (often at one of them), of characters of 1 to 4
// UTF-8 bytes, some of which dump escapes.
std::string random_string(const JsonSchemaNode& n, std::mt19937& rng) {
  static const char* kChars[] = {"a", "\"", "\\", "\n", "\x01", "/", " ", "\xC3\xA9", "\xE6\x9D\xB1",
                                 "\xF0\x9F\x98\x80"};
  const int64_t spread = n.max_length >= 0 ? n.max_length - n.min_length + 1 : 4;
  const int64_t length = rng() % 2 ? n.min_length + int64_t(rng() % uint64_t(spread))
                                   : n.max_length >= 0 && rng() % 2 ? n.max_length : n.min_length;
  std::string s;
  for (int64_t i = 0; i < length; ++i) s += kChars[rng() % std::size(kChars)];
  return s;
}

// A random integer within the node's bounds: near one end or anywhere between (an absent bound:
// 1000 past the other one or 0, kept within int64).
int64_t random_integer(const JsonSchemaNode& n, std::mt19937& rng) {
  using i128 = __int128;
  const i128 lo = n.minimum ? i128(*n.minimum)
                            : std::max<i128>(i128(INT64_MIN), std::min<i128>(n.maximum.value_or(0), 0) - 1000);
  const i128 hi = n.maximum ? i128(*n.maximum) : std::min<i128>(i128(INT64_MAX), std::max<i128>(lo, 0) + 1000);
  const uint64_t r = uint64_t(rng()) << 32 | rng();
  switch (rng() % 3) {
    case 0: return int64_t(std::min(hi, lo + i128(r % 20)));
    case 1: return int64_t(std::max(lo, hi - i128(r % 20)));
    default: return int64_t(lo + i128(r) % (hi - lo + 1));
  }
}

// A random instance of node i (any: a small random value).
ojson instance(const JsonSchema& s, int32_t i, std::mt19937& rng, int depth) {
  auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
  if (i < 0) return pick(2) ? ojson(pick(100)) : ojson("any");
  const JsonSchemaNode& n = s.node(i);
  if (!n.literals.empty()) return ojson::parse(n.literals[size_t(pick(int(n.literals.size())))]);
  if (!n.any_of.empty()) return instance(s, n.any_of[size_t(pick(int(n.any_of.size())))], rng, depth);
  std::vector<uint8_t> types;
  for (uint8_t t : {kJsonObject, kJsonArray, kJsonString, kJsonInteger, kJsonNumber, kJsonBoolean, kJsonNull})
    if ((n.types & t) && !(depth > 6 && (t == kJsonObject || t == kJsonArray))) types.push_back(t);
  if (types.empty()) types.push_back(n.types & kJsonObject ? kJsonObject : kJsonArray);
  switch (types[size_t(pick(int(types.size())))]) {
    case kJsonObject: {
      ojson o = ojson::object();
      if (!n.keyed) {
        if (pick(2)) o["k"] = pick(10);
        return o;
      }
      for (const auto& p : n.properties)
        if (p.required || pick(2)) o[ojson::parse(p.key).get<std::string>()] = instance(s, p.node, rng, depth + 1);
      return o;
    }
    case kJsonArray: {
      ojson a = ojson::array();
      int64_t count = n.min_items + pick(3);
      if (n.max_items >= 0) count = std::min(count, n.max_items);
      for (int64_t k = 0; k < count; ++k) a.push_back(instance(s, n.items, rng, depth + 1));
      return a;
    }
    case kJsonString: return random_string(n, rng);
    case kJsonInteger: return random_integer(n, rng);
    case kJsonNumber: return pick(2) ? ojson(double(pick(1000)) / 8.0 - 50) : ojson(pick(9));
    case kJsonBoolean: return pick(2) == 0;
    default: return nullptr;
  }
}

// A random change to the tree: a member dropped, added, replaced or moved; an element dropped,
// repeated or replaced; a scalar of another type; an integer one off, of the other sign or without
// its last digit, a string one character longer or shorter (the edges of the bounds). The result
// may or may not still be valid.
void mutate_tree(ojson& root, std::mt19937& rng) {
  auto pick = [&](size_t n) { return size_t(rng() % uint32_t(n)); };
  std::vector<ojson*> nodes;
  std::vector<ojson*> stack = {&root};
  while (!stack.empty()) {
    ojson* v = stack.back();
    stack.pop_back();
    nodes.push_back(v);
    if (v->is_structured())
      for (auto& x : *v) stack.push_back(&x);
  }
  ojson* v = nodes[pick(nodes.size())];
  const ojson scalars[] = {1, 10, 2.5, "x", "c", true, nullptr, ojson::array(), ojson::object(), -15, INT64_MAX, "",
                           "\xF0\x9F\x98\x80\xF0\x9F\x98\x80"};
  const ojson other = scalars[pick(std::size(scalars))];
  if (v->is_number_integer() && !v->is_number_unsigned() && pick(2)) {
    const int64_t x = v->get<int64_t>();
    switch (pick(4)) {
      case 0: *v = x == INT64_MAX ? x : x + 1; return;
      case 1: *v = x == INT64_MIN ? x : x - 1; return;
      case 2: *v = x / 10; return;  // its digits but the last: a prefix of it
      default: *v = x == INT64_MIN ? x : -x; return;
    }
  }
  if (v->is_string() && pick(2)) {
    std::string& str = v->get_ref<std::string&>();
    if (str.empty() || pick(2)) {
      str += pick(2) ? "b" : "\xE6\x9D\xB1";
    } else {
      while ((uint8_t(str.back()) & 0xC0) == 0x80) str.pop_back();  // the last character's continuation bytes
      str.pop_back();
    }
    return;
  }
  if (v->is_object() && !v->empty()) {
    std::vector<std::string> keys;
    for (const auto& [k, x] : v->items()) keys.push_back(k);
    const std::string k = keys[pick(keys.size())];
    switch (pick(4)) {
      case 0: v->erase(k); return;
      case 1: (*v)[pick(2) ? std::string("zz") : k + "0"] = other; return;
      case 2: (*v)[k] = other; return;
      default: {  // move the member to the end
        ojson x = (*v)[k];
        v->erase(k);
        (*v)[k] = x;
        return;
      }
    }
  }
  if (v->is_array() && !v->empty()) {
    const size_t at = pick(v->size());
    switch (pick(3)) {
      case 0: v->erase(at); return;
      case 1: v->push_back((*v)[at]); return;
      default: (*v)[at] = other; return;
    }
  }
  if (v != &root) *v = other;
  else (*v)["added"] = other;
}

// The characters that only string values hold (no key or enum value, which the recogniser matches
// as written) as \u escapes: a surrogate pair for U+1F600, one escape for U+6771.
std::string escape_some(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 4, "\xF0\x9F\x98\x80") == 0) {
      out += R"(\ud83d\uDE00)";
      i += 3;
    } else if (text.compare(i, 3, "\xE6\x9D\xB1") == 0) {
      out += R"(\u6771)";
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// ---- property tests of one bounded value: random bounds, random texts at and around them ----

std::string to_text(__int128 x) {
  const bool negative = x < 0;
  unsigned __int128 m = negative ? 0 - (unsigned __int128)(x) : (unsigned __int128)(x);
  std::string digits;
  do digits.insert(digits.begin(), char('0' + int(m % 10))); while ((m /= 10) > 0);
  return negative ? "-" + digits : digits;
}

// Integer texts around the node's bounds: each bound and its neighbours (beyond int64 too), 0 and
// -0, and random ones; then each with its last digit dropped, a digit appended, a leading zero, its
// sign flipped; and random digit strings of up to 25 digits.
std::vector<std::string> integer_texts_around(const JsonSchemaNode& n, std::mt19937& rng) {
  std::vector<__int128> values = {0, int64_t(rng() % 2000) - 1000, INT64_MAX, INT64_MIN};
  for (const auto& b : {n.minimum, n.maximum})
    if (b)
      for (int d = -2; d <= 2; ++d) values.push_back(__int128(*b) + d);
  std::vector<std::string> texts = {"-0", "00", "-00"};
  for (__int128 v : values) {
    const std::string t = to_text(v);
    texts.push_back(t);
    texts.push_back(to_text(-v));
    if (t.size() > 1 && t != "-0") texts.push_back(t.substr(0, t.size() - 1));
    texts.push_back(t + char('0' + rng() % 10));
    texts.push_back(v < 0 ? "-0" + t.substr(1) : "0" + t);
  }
  for (int i = 0; i < 10; ++i) {
    std::string t = rng() % 2 ? "-" : "";
    for (int k = int(rng() % 25); k >= 0; --k) t += char('0' + rng() % 10);
    texts.push_back(t);
  }
  return texts;
}

// Strings of up to maxLength + 2 (or minLength + 4) characters, each written one of many ways: a
// raw UTF-8 sequence of 1 to 4 bytes, a short escape, a \u escape, a surrogate pair.
std::vector<std::string> string_texts_around(const JsonSchemaNode& n, std::mt19937& rng) {
  static const char* kChars[] = {"a",          "\xC3\xA9",    "\xE6\x9D\xB1",     "\xF0\x9F\x98\x80",
                                 R"(\n)",       R"(\")",       R"(\\)",           R"(\/)",
                                 R"(\u00e9)",   R"(\u6771)",   R"(\uD83D\uDE00)", R"(\ud83d\ude00)",
                                 R"(\u0000)"};
  const int64_t longest = n.max_length >= 0 ? n.max_length + 2 : n.min_length + 4;
  std::vector<std::string> texts;
  for (int64_t length = 0; length <= longest; ++length) {
    for (int i = 0; i < 3; ++i) {
      std::string t = "\"";
      for (int64_t k = 0; k < length; ++k) t += kChars[rng() % std::size(kChars)];
      texts.push_back(t + "\"");
    }
  }
  return texts;
}

// Feeds text byte by byte until a byte is refused: whether all of it was accepted as a complete
// value, and the length of the first accepted prefix that is a dead end (npos: none).
struct Fed {
  bool complete = false;
  size_t dead_end = std::string::npos;
};
Fed feed_checked(const JsonSchema& s, const std::string& text) {
  JsonPrefix p(&s);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!test::can_continue(p)) return {false, i};
    if (!p.feed(uint8_t(text[i]))) return {};
  }
  return {p.complete(), test::can_continue(p) ? std::string::npos : text.size()};
}

// {"v": TEXT} for each text: accepted exactly when the validator accepts it parsed, and no
// accepted prefix is a dead end.
void expect_agreement(const JsonSchema& s, const ojson& raw, const std::vector<std::string>& texts) {
  for (const auto& t : texts) {
    const std::string text = R"({"v":)" + t + "}";
    const ojson parsed = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    const bool want = !parsed.is_discarded() && test::valid(s, s.root(), parsed);
    const Fed fed = feed_checked(s, text);
    ASSERT_EQ(fed.dead_end, std::string::npos) << raw.dump() << "\ndead end in " << text;
    ASSERT_EQ(fed.complete, want) << raw.dump() << "\n" << text;
  }
}

TEST(JsonSchema, RandomIntegerBoundsAgreeWithTheValidator) {
  std::mt19937 rng(std::random_device{}());
  SchemaMaker maker{rng};
  for (int iter = 0; iter < 300; ++iter) {
    ojson v = {{"type", rng() % 4 ? ojson("integer") : ojson::array({"integer", "null"})}};
    maker.add_integer_bounds(v);
    const ojson raw = {{"type", "object"}, {"properties", {{"v", v}}}, {"required", {"v"}}};
    auto s = JsonSchema::compile(raw);
    ASSERT_TRUE(s.ok()) << s.message() << "\n" << raw.dump();
    const JsonSchemaNode& n = (*s)->node((*s)->node(0).properties[0].node);
    expect_agreement(**s, raw, integer_texts_around(n, rng));
    if (HasFatalFailure()) return;
  }
}

TEST(JsonSchema, RandomStringLengthsAgreeWithTheValidator) {
  std::mt19937 rng(std::random_device{}());
  SchemaMaker maker{rng};
  for (int iter = 0; iter < 300; ++iter) {
    ojson v = {{"type", rng() % 4 ? ojson("string") : ojson::array({"string", "null"})}};
    maker.add_lengths(v);
    const ojson raw = {{"type", "object"}, {"properties", {{"v", v}}}, {"required", {"v"}}};
    auto s = JsonSchema::compile(raw);
    ASSERT_TRUE(s.ok()) << s.message() << "\n" << raw.dump();
    const JsonSchemaNode& n = (*s)->node((*s)->node(0).properties[0].node);
    expect_agreement(**s, raw, string_texts_around(n, rng));
    if (HasFatalFailure()) return;
  }
}

TEST(JsonSchema, RandomSchemasInstancesAndMutations) {
  std::mt19937 rng(std::random_device{}());
  SchemaMaker maker{rng};
  const std::string alphabet = "{}[]\":,0123456789.-eEtruefalsn \nxabc\\\xC3\xA9";
  int complete_mutants = 0, agree_valid = 0;
  for (int iter = 0; iter < 400; ++iter) {
    ojson raw = maker.make_object(3);
    if (iter % 4 == 0) raw = ojson{{"$defs", {{"D", maker.make_object(2)}}}, {"type", "object"},
                                   {"properties", {{"d", {{"$ref", "#/$defs/D"}}}, {"e", maker.make(2)}}}};
    auto compiled = JsonSchema::compile(raw);
    ASSERT_TRUE(compiled.ok()) << compiled.message() << "\n" << raw.dump();
    const JsonSchema& s = **compiled;
    for (int k = 0; k < 5; ++k) {
      const ojson inst = instance(s, s.root(), rng, 0);
      std::string text = inst.dump(int(rng() % 3) - 1);
      if (rng() % 2) text = escape_some(text);
      ASSERT_TRUE(test::valid(s, s.root(), inst)) << "generator: " << text;
      const Fed whole = feed_checked(s, text);
      ASSERT_TRUE(whole.complete) << "schema " << raw.dump() << "\nrefused " << text;
      ASSERT_EQ(whole.dead_end, std::string::npos) << text;
      // Changed as a tree: the recogniser and the validator must agree, both ways.
      ojson changed = inst;
      mutate_tree(changed, rng);
      const std::string ct = changed.dump(int(rng() % 2) - 1);
      const bool want = test::valid(s, s.root(), changed);
      agree_valid += want;
      const Fed fed = feed_checked(s, ct);
      ASSERT_EQ(fed.dead_end, std::string::npos) << "schema " << raw.dump() << "\ndead end in " << ct;
      ASSERT_EQ(fed.complete, want) << "schema " << raw.dump() << "\ninstance " << ct;
      std::string m = text;
      for (int e = int(rng() % 3) + 1; e > 0; --e) {
        const size_t at = rng() % (m.size() + 1);
        const char c = alphabet[rng() % alphabet.size()];
        if (rng() % 2 && at < m.size()) m.erase(at, 1);
        else m.insert(m.begin() + std::ptrdiff_t(at), c);
      }
      const Fed mutant = feed_checked(s, m);
      ASSERT_EQ(mutant.dead_end, std::string::npos) << "dead end in " << m << "\nschema " << raw.dump();
      if (mutant.complete) {
        ASSERT_TRUE(test::is_json_object(m)) << m;
        ojson parsed;
        try {
          parsed = ojson::parse(m);
        } catch (const ojson::out_of_range&) {
          continue;  // a number beyond double's range: valid JSON that nlohmann cannot hold
        }
        ++complete_mutants;
        EXPECT_TRUE(test::valid(s, s.root(), parsed)) << "accepted an invalid instance " << m << "\nschema " << raw.dump();
      }
    }
  }
  EXPECT_GT(complete_mutants, 50);
  EXPECT_GT(agree_valid, 100);       // changed trees that stay valid
  EXPECT_LT(agree_valid, 400 * 5 - 100);  // and ones that do not
}

}  // namespace
}  // namespace escala::engine
