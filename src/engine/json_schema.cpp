#include "engine/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bitset>
#include <cmath>
#include <map>
#include <set>

namespace escala::engine {

using ojson = nlohmann::ordered_json;

class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(const ojson& root, JsonSchema& out) : root_(root), out_(out) {}

  Status run() {
    auto r = compile(root_, "schema");
    if (!r.ok()) return r.status();
    return check_any_of();
  }

 private:
  std::vector<JsonSchemaNode>& nodes() { return out_.nodes_; }

  int32_t new_node() {
    nodes().emplace_back();
    return int32_t(nodes().size() - 1);
  }

  // Bounds that keep a token mask pass cheap: every byte of a key or enum value is checked
  // against the candidates, and a schema's nodes are walked per value.
  static constexpr size_t kMaxNodes = 4096, kMaxChoices = 256, kMaxChoiceBytes = 8192;

  static Status check_choice_bytes(size_t bytes, const std::string& path) {
    if (bytes <= kMaxChoiceBytes) return {};
    return error(path, fmt::format("the values or keys take more than {} bytes", kMaxChoiceBytes));
  }

  static Status error(const std::string& path, const std::string& what) {
    return Status::error(fmt::format("{}: {}", path, what));
  }

  // The node for schema `s` at `path` (a $ref to an already compiled definition reuses its node).
  Result<int32_t> compile(const ojson& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) return error(path, "the schema false allows no value");
      return new_node();
    }
    if (!s.is_object()) return error(path, "a schema must be an object or a boolean");
    if (auto ref = s.find("$ref"); ref != s.end()) {
      for (const auto& [k, v] : s.items())
        if (k != "$ref" && !annotation(k)) return error(path, fmt::format("'{}' next to '$ref' is not supported", k));
      if (!ref->is_string()) return error(path + ".$ref", "must be a string");
      return resolve(ref->get<std::string>(), path + ".$ref");
    }
    if (nodes().size() >= kMaxNodes) return error(path, fmt::format("the schema has more than {} parts", kMaxNodes));
    const int32_t idx = new_node();
    ESCALA_RETURN_IF_ERROR(fill(idx, s, path));
    return idx;
  }

  Result<int32_t> resolve(const std::string& ref, const std::string& path) {
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    std::string name, group;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (ref.rfind(prefix, 0) == 0) {
        group = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = ref.substr(std::string(prefix).size());
      }
    }
    if (name.empty() || name.find('/') != std::string::npos || name.find('~') != std::string::npos)
      return error(path, fmt::format("only references to #/$defs/NAME or #/definitions/NAME are supported (got '{}')", ref));
    auto defs = root_.find(group);
    if (defs == root_.end() || !defs->is_object() || !defs->contains(name))
      return error(path, fmt::format("'{}' is not defined", ref));
    const ojson& target = (*defs)[name];
    if (target.is_object() && target.contains("$ref")) return error(path, "a reference to a reference is not supported");
    const int32_t idx = new_node();
    refs_[ref] = idx;  // before its body: a definition may refer to itself
    if (target.is_boolean() && !target.get<bool>()) return error(path, "the schema false allows no value");
    if (target.is_object()) ESCALA_RETURN_IF_ERROR(fill(idx, target, fmt::format("schema.{}.{}", group, name)));
    else if (!target.is_boolean()) return error(path, "a schema must be an object or a boolean");
    return idx;
  }

  static bool annotation(const std::string& k) {
    static const std::set<std::string> kIgnored = {"title", "description", "default", "examples", "$schema",
                                                   "$id", "$comment", "format", "strict", "$defs", "definitions"};
    return kIgnored.count(k) > 0;
  }

  static Result<uint8_t> type_bit(const ojson& t, const std::string& path) {
    if (!t.is_string()) return error(path, "a type must be a string");
    const std::string s = t.get<std::string>();
    if (s == "object") return uint8_t(kJsonObject);
    if (s == "array") return uint8_t(kJsonArray);
    if (s == "string") return uint8_t(kJsonString);
    if (s == "integer") return uint8_t(kJsonInteger);
    if (s == "number") return uint8_t(kJsonNumber | kJsonInteger);
    if (s == "boolean") return uint8_t(kJsonBoolean);
    if (s == "null") return uint8_t(kJsonNull);
    return error(path, fmt::format("unknown type '{}'", s));
  }

  static Result<int64_t> count(const ojson& v, const std::string& path) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return error(path, "must be a non-negative integer");
    return v.get<int64_t>();
  }

  Status fill(int32_t idx, const ojson& s, const std::string& path) {
    static const std::set<std::string> kKnown = {"type", "properties", "required", "additionalProperties", "items",
                                                 "minItems", "maxItems", "minLength", "maxLength", "minimum",
                                                 "exclusiveMinimum", "maximum", "exclusiveMaximum", "enum", "const",
                                                 "anyOf", "oneOf"};
    for (const auto& [k, v] : s.items())
      if (!kKnown.count(k) && !annotation(k)) return error(path, fmt::format("'{}' is not supported", k));
    JsonSchemaNode n;
    if (auto t = s.find("type"); t != s.end()) {
      n.types = 0;
      if (t->is_array()) {
        if (t->empty()) return error(path + ".type", "an empty list of types allows no value");
        for (const auto& one : *t) {
          auto b = type_bit(one, path + ".type");
          if (!b.ok()) return b.status();
          n.types |= *b;
        }
      } else {
        auto b = type_bit(*t, path + ".type");
        if (!b.ok()) return b.status();
        n.types = *b;
      }
    } else if (s.contains("properties")) {
      n.types = kJsonObject;
    } else if (s.contains("items")) {
      n.types = kJsonArray;
    }
    for (const char* key : {"enum", "const"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      if (!n.literals.empty()) return error(path, "'enum' and 'const' together are not supported");
      if (std::string(key) == "const") {
        n.literals.push_back(it->dump());
      } else {
        if (!it->is_array() || it->empty()) return error(path + ".enum", "must be a non-empty array");
        if (it->size() > kMaxChoices) return error(path + ".enum", fmt::format("more than {} values", kMaxChoices));
        for (const auto& v : *it) n.literals.push_back(v.dump());
      }
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      if (!n.any_of.empty()) return error(path, "'anyOf' and 'oneOf' together are not supported");
      if (s.contains("type") || !n.literals.empty())
        return error(path, fmt::format("'{}' next to 'type', 'enum' or 'const' is not supported", key));
      if (!it->is_array() || it->empty()) return error(path + "." + key, "must be a non-empty array");
      if (it->size() > 8) return error(path + "." + key, "more than 8 branches");  // at most one per kind of value
      for (size_t i = 0; i < it->size(); ++i) {
        auto b = compile((*it)[i], fmt::format("{}.{}[{}]", path, key, i));
        if (!b.ok()) return b.status();
        n.any_of.push_back(*b);
      }
      any_of_paths_.emplace_back(idx, path + "." + key);
    }
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return error(path + ".properties", "must be an object");
      if (it->size() > kMaxChoices) return error(path + ".properties", fmt::format("more than {} properties", kMaxChoices));
      n.keyed = true;
      for (const auto& [name, sub] : it->items()) {
        auto b = compile(sub, path + ".properties." + name);
        if (!b.ok()) return b.status();
        n.properties.push_back({ojson(name).dump(), *b, false});
      }
    }
    size_t key_bytes = 0, literal_bytes = 0;
    for (const auto& p : n.properties) key_bytes += p.key.size();
    for (const auto& l : n.literals) literal_bytes += l.size();
    ESCALA_RETURN_IF_ERROR(check_choice_bytes(key_bytes, path + ".properties"));
    ESCALA_RETURN_IF_ERROR(check_choice_bytes(literal_bytes, path));
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return error(path + ".required", "must be an array of property names");
      for (const auto& r : *it) {
        if (!r.is_string()) return error(path + ".required", "must be an array of property names");
        const std::string key = ojson(r.get<std::string>()).dump();
        bool found = false;
        for (auto& p : n.properties) found = found || (p.key == key && (p.required = true));
        if (!found)
          return error(path + ".required",
                       fmt::format("'{}' is not among the properties (other keys are not allowed)", r.get<std::string>()));
      }
    }
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (!(it->is_boolean() && !it->get<bool>()) && !(n.properties.empty() && it->is_boolean()))
        return error(path + ".additionalProperties", "only false is supported (the properties listed, no others)");
    }
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_array()) return error(path + ".items", "tuple items are not supported");
      auto b = compile(*it, path + ".items");
      if (!b.ok()) return b.status();
      n.items = *b;
    }
    if (auto it = s.find("minItems"); it != s.end()) {
      auto c = count(*it, path + ".minItems");
      if (!c.ok()) return c.status();
      n.min_items = *c;
    }
    if (auto it = s.find("maxItems"); it != s.end()) {
      auto c = count(*it, path + ".maxItems");
      if (!c.ok()) return c.status();
      n.max_items = *c;
    }
    if (n.max_items >= 0 && n.min_items > n.max_items) return error(path, "minItems is above maxItems");
    ESCALA_RETURN_IF_ERROR(fill_lengths(n, s, path));
    ESCALA_RETURN_IF_ERROR(fill_integer_bounds(n, s, path));
    if (n.types == 0) return error(path, "no type is allowed");
    nodes()[size_t(idx)] = std::move(n);
    return {};
  }

  // Length and integer bounds constrain the node's own strings and integers: an enum, const or
  // anyOf takes its values elsewhere, where they would not be enforced.
  static Status check_own_values(const JsonSchemaNode& n, const std::string& keyword, const std::string& path) {
    if (n.literals.empty() && n.any_of.empty()) return {};
    return error(path, fmt::format("'{}' next to 'enum', 'const', 'anyOf' or 'oneOf' is not supported", keyword));
  }

  // minLength / maxLength: counted in characters by the recogniser.
  static Status fill_lengths(JsonSchemaNode& n, const ojson& s, const std::string& path) {
    for (const char* key : {"minLength", "maxLength"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      ESCALA_RETURN_IF_ERROR(check_own_values(n, key, path));
      auto c = count(*it, path + "." + key);
      if (!c.ok()) return c.status();
      (std::string(key) == "minLength" ? n.min_length : n.max_length) = *c;
    }
    if (n.max_length >= 0 && n.min_length > n.max_length) return error(path, "minLength is above maxLength");
    return {};
  }

  // A numeric bound as an inclusive int64 bound on integers: a fraction rounds inwards (minimum 2.5
  // -> 3, maximum 2.5 -> 2) and an exclusive bound moves one past (exclusiveMinimum 3 -> 3 + 1).
  static Result<int64_t> integer_bound(const ojson& v, bool lower, bool exclusive, const std::string& path) {
    if (!v.is_number()) return error(path, "must be a number");
    const Status outside = error(path, "is outside the 64-bit integer range");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) return outside;
    if (v.is_number_integer()) {
      const int64_t b = v.get<int64_t>();
      if (!exclusive) return b;
      if (b == (lower ? INT64_MAX : INT64_MIN)) return outside;
      return lower ? b + 1 : b - 1;
    }
    const double x = v.get<double>();
    const double b = lower ? (exclusive ? std::floor(x) + 1 : std::ceil(x))
                           : (exclusive ? std::ceil(x) - 1 : std::floor(x));
    if (!(b >= -0x1p63 && b < 0x1p63)) return outside;  // the doubles that convert exactly
    return int64_t(b);
  }

  // minimum / maximum / exclusiveMinimum / exclusiveMaximum: the recogniser checks integers digit
  // by digit; numbers with fractions or exponents it cannot bound, so those nodes are refused.
  static Status fill_integer_bounds(JsonSchemaNode& n, const ojson& s, const std::string& path) {
    struct Keyword {
      const char* name;
      bool lower, exclusive;
    };
    for (const Keyword k : {Keyword{"minimum", true, false}, Keyword{"exclusiveMinimum", true, true},
                            Keyword{"maximum", false, false}, Keyword{"exclusiveMaximum", false, true}}) {
      auto it = s.find(k.name);
      if (it == s.end()) continue;
      ESCALA_RETURN_IF_ERROR(check_own_values(n, k.name, path));
      if (n.types & kJsonNumber)
        return error(path,
                     fmt::format("'{}' is supported on integers only (\"type\": \"integer\", not \"number\")", k.name));
      auto b = integer_bound(*it, k.lower, k.exclusive, path + "." + k.name);
      if (!b.ok()) return b.status();
      std::optional<int64_t>& bound = k.lower ? n.minimum : n.maximum;
      bound = !bound ? *b : k.lower ? std::max(*bound, *b) : std::min(*bound, *b);  // both apply
    }
    if (n.minimum && n.maximum && *n.minimum > *n.maximum) return error(path, "no integer is within the bounds");
    return {};
  }

  // The bytes a value of node i can begin with (for anyOf: the branch is chosen by that byte).
  std::bitset<256> first_bytes(int32_t i, std::set<int32_t>& seen) const {
    std::bitset<256> b;
    if (!seen.insert(i).second) return b;
    const JsonSchemaNode& n = out_.nodes_[size_t(i)];
    if (!n.literals.empty()) {
      for (const auto& l : n.literals) b.set(uint8_t(l[0]));
      return b;
    }
    if (!n.any_of.empty()) {
      for (int32_t a : n.any_of) b |= first_bytes(a, seen);
      return b;
    }
    if (n.types & kJsonObject) b.set('{');
    if (n.types & kJsonArray) b.set('[');
    if (n.types & kJsonString) b.set('"');
    if (n.types & (kJsonInteger | kJsonNumber)) {
      b.set('-');
      for (char c = '0'; c <= '9'; ++c) b.set(uint8_t(c));
    }
    if (n.types & kJsonBoolean) b.set('t'), b.set('f');
    if (n.types & kJsonNull) b.set('n');
    return b;
  }

  Status check_any_of() const {
    for (const auto& [idx, path] : any_of_paths_) {
      std::bitset<256> all;
      for (int32_t a : out_.nodes_[size_t(idx)].any_of) {
        std::set<int32_t> seen;
        const auto b = first_bytes(a, seen);
        if ((all & b).any())
          return error(path, "branches that can begin with the same byte are not supported (e.g. two objects)");
        all |= b;
      }
    }
    return {};
  }

  const ojson& root_;
  JsonSchema& out_;
  std::map<std::string, int32_t> refs_;
  std::vector<std::pair<int32_t, std::string>> any_of_paths_;
};

namespace {
uint64_t next_serial() {
  static std::atomic<uint64_t> serial{1};
  return serial.fetch_add(1);
}
}  // namespace

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(const nlohmann::ordered_json& schema) {
  auto s = std::make_shared<JsonSchema>();
  s->serial_ = next_serial();
  ESCALA_RETURN_IF_ERROR(JsonSchemaCompiler(schema, *s).run());
  return std::shared_ptr<const JsonSchema>(std::move(s));
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
  static const std::shared_ptr<const JsonSchema> any = [] {
    auto s = std::make_shared<JsonSchema>();
    s->serial_ = 0;
    JsonSchemaNode n;
    n.types = kJsonObject;
    s->nodes_.push_back(n);
    return std::shared_ptr<const JsonSchema>(std::move(s));
  }();
  return any;
}

}  // namespace escala::engine
