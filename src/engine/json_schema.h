// JSON schemas for structured output (OpenAI's response_format json_schema), compiled into the
// nodes that JsonPrefix follows. The supported subset is what structured-output APIs use:
//   type (one or a list), properties + required (keys in the declared order, optional ones may be
//   left out, no other keys: additionalProperties must be absent or false), items, minItems,
//   maxItems, minLength / maxLength (strings, in Unicode code points), minimum / maximum /
//   exclusiveMinimum / exclusiveMaximum (on integers only: type "integer" without "number"), enum,
//   const, anyOf / oneOf whose branches begin with different bytes, $ref to #/$defs/... or
//   #/definitions/... (recursion allowed); annotations (title, description, default, examples,
//   $schema, $id, format, strict) are ignored. Any other keyword is refused with its path, rather
//   than silently not enforced; so are the length and integer bounds next to enum, const, anyOf or
//   oneOf (whose values do not follow them).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "escala/status.h"

namespace escala::engine {

enum JsonType : uint8_t {
  kJsonObject = 1,
  kJsonArray = 2,
  kJsonString = 4,
  kJsonInteger = 8,
  kJsonNumber = 16,  // integers included
  kJsonBoolean = 32,
  kJsonNull = 64,
  kJsonAnyType = 127,
};

struct JsonSchemaNode {
  uint8_t types = kJsonAnyType;
  // Object: with `keyed`, exactly these keys in this order (the optional ones may be skipped);
  // otherwise any keys with any values.
  struct Property {
    std::string key;  // as written in the output: the name JSON-encoded, quotes included
    int32_t node = 0;
    bool required = false;
  };
  bool keyed = false;
  std::vector<Property> properties;
  // Array: the items' node (-1: any value) and the count bounds (max -1: none).
  int32_t items = -1;
  int64_t min_items = 0, max_items = -1;
  // String: the length bounds in characters (Unicode code points: an escape or a surrogate pair
  // is one); max -1: none.
  int64_t min_length = 0, max_length = -1;
  // Integer (on nodes that allow no other numbers): the inclusive bounds; absent: none (then
  // integers beyond 64 bits are allowed on that side).
  std::optional<int64_t> minimum, maximum;
  // enum / const: the value is one of these texts (compact JSON). Empty: no such constraint.
  std::vector<std::string> literals;
  // anyOf / oneOf: the branch is chosen by the value's first byte (compiled to be unambiguous).
  std::vector<int32_t> any_of;
};

class JsonSchema {
 public:
  // Compiles a schema; errors name the offending path, e.g. "schema.properties.age: 'pattern' is
  // not supported".
  // (ordered_json: the properties keep the order they are written in.)
  static Result<std::shared_ptr<const JsonSchema>> compile(const nlohmann::ordered_json& schema);
  // Any JSON object (JSON mode).
  static std::shared_ptr<const JsonSchema> any_object();

  const JsonSchemaNode& node(int32_t i) const { return nodes_[size_t(i)]; }
  int32_t root() const { return 0; }
  // Unique per compiled schema: masks cached per state are keyed with it.
  uint64_t serial() const { return serial_; }

 private:
  std::vector<JsonSchemaNode> nodes_;
  uint64_t serial_ = 0;
  friend class JsonSchemaCompiler;
};

}  // namespace escala::engine
