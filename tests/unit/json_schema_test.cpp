// Structured output: schemas compile (unsupported keywords refused with their path), and the
// recogniser follows them. Property test: random schemas, random instances generated from them are
// accepted byte by byte; random mutations of those instances, when accepted as complete, pass an
// independent tree validator; no accepted prefix is a dead end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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
      {R"({"type":"integer","minimum":3})", "schema: 'minimum' is not supported"},
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

// ---- the property test ----

// An independent validator: the instance (parsed) against the compiled node, as a tree.
bool valid(const JsonSchema& s, int32_t i, const ojson& v) {
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
      const std::string key = ojson(k).dump();
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
  if (v.is_string()) return n.types & kJsonString;
  if (v.is_boolean()) return n.types & kJsonBoolean;
  if (v.is_null()) return n.types & kJsonNull;
  if (v.is_number_integer()) return n.types & (kJsonInteger | kJsonNumber);
  return n.types & kJsonNumber;  // a float
}

struct SchemaMaker {
  std::mt19937& rng;
  int pick(int n) { return int(rng() % uint32_t(n)); }

  ojson scalar_type() {
    static const char* kTypes[] = {"string", "integer", "number", "boolean", "null"};
    return kTypes[pick(5)];
  }
  ojson make(int depth) {
    switch (depth > 0 ? pick(7) : pick(4)) {
      case 0: return ojson{{"type", scalar_type()}};
      case 1: return ojson{{"type", ojson::array({scalar_type(), "null"})}};
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
    case kJsonString: return pick(2) ? "s\u00e9 \"q\"" : "";
    case kJsonInteger: return int(pick(2000)) - 1000;
    case kJsonNumber: return pick(2) ? ojson(double(pick(1000)) / 8.0 - 50) : ojson(pick(9));
    case kJsonBoolean: return pick(2) == 0;
    default: return nullptr;
  }
}

// A random change to the tree: a member dropped, added, replaced or moved; an element dropped,
// repeated or replaced; a scalar of another type. The result may or may not still be valid.
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
  const ojson scalars[] = {1, 10, 2.5, "x", "c", true, nullptr, ojson::array(), ojson::object()};
  const ojson other = scalars[pick(std::size(scalars))];
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

TEST(JsonSchema, RandomSchemasInstancesAndMutations) {
  std::mt19937 rng(std::random_device{}());
  SchemaMaker maker{rng};
  const std::string alphabet = "{}[]\":,0123456789.-eEtruefalsn \nxabc\xC3\xA9";
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
      const std::string text = inst.dump(int(rng() % 3) - 1);
      ASSERT_TRUE(valid(s, s.root(), inst)) << "generator: " << text;
      ASSERT_TRUE(accepts(s, text)) << "schema " << raw.dump() << "\nrefused " << text;
      // Changed as a tree: the recogniser and the validator must agree, both ways.
      ojson changed = inst;
      mutate_tree(changed, rng);
      const std::string ct = changed.dump(int(rng() % 2) - 1);
      const bool want = valid(s, s.root(), changed);
      agree_valid += want;
      ASSERT_EQ(accepts(s, ct), want) << "schema " << raw.dump() << "\ninstance " << ct;
      std::string m = text;
      for (int e = int(rng() % 3) + 1; e > 0; --e) {
        const size_t at = rng() % (m.size() + 1);
        const char c = alphabet[rng() % alphabet.size()];
        if (rng() % 2 && at < m.size()) m.erase(at, 1);
        else m.insert(m.begin() + std::ptrdiff_t(at), c);
      }
      JsonPrefix p(&s);
      size_t i = 0;
      for (; i < m.size(); ++i) {
        ASSERT_TRUE(test::can_continue(p)) << "dead end after " << i << " bytes of " << m << "\nschema " << raw.dump();
        if (!p.feed(uint8_t(m[i]))) break;
      }
      if (i == m.size() && p.complete()) {
        ASSERT_TRUE(test::is_json_object(m)) << m;
        ojson parsed;
        try {
          parsed = ojson::parse(m);
        } catch (const ojson::out_of_range&) {
          continue;  // a number beyond double's range: valid JSON that nlohmann cannot hold
        }
        ++complete_mutants;
        EXPECT_TRUE(valid(s, s.root(), parsed)) << "accepted an invalid instance " << m << "\nschema " << raw.dump();
      }
    }
  }
  EXPECT_GT(complete_mutants, 50);
  EXPECT_GT(agree_valid, 100);       // changed trees that stay valid
  EXPECT_LT(agree_valid, 400 * 5 - 100);  // and ones that do not
}

}  // namespace
}  // namespace escala::engine
