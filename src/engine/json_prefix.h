// Structured output: a byte-level recogniser of the prefixes of the JSON texts a schema allows
// (JSON mode, OpenAI's response_format json_object, is the schema "any object"; json_schema
// compiles one, engine/json_schema.h), and the per-state masks of the tokens that keep the output
// such a prefix. The engine samples only allowed tokens and ends the request once the value is
// complete. JSON itself follows RFC 8259 (numbers, escapes, surrogate pairs, UTF-8 checked).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/json_schema.h"
#include "escala/tokenizer.h"

namespace escala::engine {

// Integer bounds seen digit by digit: the integers of one sign within [lo, hi] (nullopt: no bound
// on that side, integers beyond 64 bits included) as a range of magnitudes (absolute values; 0 is
// in both signs' ranges, as "-0" is 0). kNoBound: no upper bound on the magnitude. The arithmetic
// saturates at kNoBound, which is beyond every int64's magnitude (at most 2^63), so it never wraps.
struct MagnitudeRange {
  static constexpr uint64_t kNoBound = UINT64_MAX;
  uint64_t lo = 1, hi = 0;  // lo > hi: no integer of this sign

  MagnitudeRange(std::optional<int64_t> min, std::optional<int64_t> max, bool negative);
  bool empty() const { return lo > hi; }
  bool contains(uint64_t m) const { return lo <= m && m <= hi; }
  // Some magnitude in the range has decimal digits that begin with those of `prefix` (the prefix
  // 0 is the digits "0", which JSON lets no digit follow).
  bool has_prefix(uint64_t prefix) const;
  // Some magnitude in the range begins with prefix's digits and at least one more.
  bool extends(uint64_t prefix) const;
  // prefix·10 + digit, saturated at kNoBound.
  static uint64_t append(uint64_t prefix, int digit);
};

class JsonPrefix {
 public:
  // Runs of whitespace between tokens are capped, so that a model cannot pad forever; so is the
  // nesting depth.
  static constexpr int kMaxWhitespaceRun = 16;
  static constexpr int kMaxDepth = 32;

  // `schema` must outlive the recogniser (and its copies); default: any JSON object.
  explicit JsonPrefix(const JsonSchema* schema = nullptr);
  JsonPrefix(const JsonPrefix& o) { *this = o; }
  JsonPrefix& operator=(const JsonPrefix& o);

  // Consumes one byte; false (and the recogniser must not be used further) when no allowed text
  // starts with what was fed plus this byte. Each byte is refused as soon as no completion exists,
  // so an accepted prefix is never a dead end.
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);
  // The value is complete: nothing may follow.
  bool complete() const { return state_ == State::kDone; }
  // The whole state as bytes (a key for caching the token mask per state), the schema included.
  std::string key() const;

 private:
  enum class State : uint8_t {
    kValue,         // a value must come (node_: its schema node)
    kValueOrEnd,    // after '[': a value or ']'
    kKeyOrEnd,      // after '{': a key or '}'
    kKey,           // after ',' in an object: a key
    kColon,         // after a key
    kCommaOrEnd,    // after a value inside a container
    kString,        // inside a string (in_key_: a free object key)
    kEscape,        // after '\' in a string
    kUnicode,       // inside \uXXXX (aux_: hex digits read)
    kMinus,         // number: after '-'
    kZero,          // number: a leading 0
    kInt,           // number: integer digits
    kDot,           // number: after '.'
    kFrac,          // number: fraction digits
    kExp,           // number: after 'e'
    kExpSign,       // number: after the exponent's sign
    kExpDigits,     // number: exponent digits
    kChoice,        // one of fixed texts: a literal, an enum value or a schema's key (see below)
    kDone,          // the value is complete
  };
  // After a high surrogate escape (\uD800-\uDBFF) a low one must follow at once.
  enum class Surrogate : uint8_t { kNone, kWantBackslash, kWantLow };
  enum class ChoiceKind : uint8_t { kLiteral, kWord, kKey };  // enum/const values; true/false/null; keys
  struct Frame {
    int32_t node;   // the container's schema node; -1: any
    int32_t index;  // keyed object: the next property that may come; array: items so far
    char kind;      // '{' or '['
  };

  const JsonSchemaNode* node(int32_t i) const { return i < 0 ? nullptr : &schema_->node(i); }
  bool structural(uint8_t c);
  bool begin_value(uint8_t c);
  void end_value();  // a value just ended: comma/end inside a container, done at the top
  bool choice_byte(uint8_t c);
  bool count_char();               // one more character of a string value
  bool may_close_string() const;   // '"' now
  bool integer_digit(uint8_t c);   // a digit of an integer-only number
  bool integer_may_end() const;    // the byte after such a number
  MagnitudeRange integer_range() const;
  // The fixed texts of the current choice, and of a keyed object's next keys.
  int32_t choice_count() const;
  const std::string& choice_text(int32_t i) const;
  bool may_close(const Frame& f) const;     // '}' or ']' now
  bool may_continue(const Frame& f) const;  // ',' now

  const JsonSchema* schema_ = nullptr;
  State state_ = State::kValue;
  int32_t node_ = 0;               // kValue: the node of the value to come; -1: any
  bool in_key_ = false;            // the string being read is a free object key
  bool integer_ = false;           // the number being read must be an integer
  uint8_t aux_ = 0;                // kUnicode: hex digits read
  uint8_t utf8_left_ = 0;          // continuation bytes still due in a string
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the next continuation byte's range
  uint8_t ws_run_ = 0;
  Surrogate surrogate_ = Surrogate::kNone;
  uint16_t code_ = 0;              // kUnicode: the hex digits so far
  // The value being read, for its node's bounds (reset when it ends, so that states after it share
  // keys). The counts are normalised so that states with the same future share a key (and so a
  // cached mask): a string's characters saturate at maxLength, or without one at minLength (beyond
  // it the count changes nothing; no bounds: always 0); an integer's digits (magnitude_, with
  // negative_ its sign) become kAnyDigits once every continuation is within the bounds (no bounds:
  // after the first digit), and a number that no digit may extend ends at once, as a literal does.
  static constexpr uint64_t kAnyDigits = MagnitudeRange::kNoBound;
  int64_t length_ = 0;             // string: characters so far (saturated)
  uint64_t magnitude_ = 0;         // integer: the digits so far as a number, or kAnyDigits
  bool negative_ = false;          // integer: after '-'
  // kChoice: the texts are a literal node's (choice_node_'s literals) or the next keys of the top
  // frame's keyed object; the bytes so far equal the first choice_len_ of text choice_pick_.
  ChoiceKind choice_kind_ = ChoiceKind::kLiteral;
  int32_t choice_node_ = 0, choice_pick_ = 0, choice_len_ = 0;
  int32_t depth_ = 0;
  std::array<Frame, kMaxDepth> stack_;  // only [0, depth_) is meaningful (and copied)
};

// Which tokens keep the output an allowed prefix, from a recogniser's state. Token bytes are fixed
// per vocabulary; masks are cached per state (a run of JSON revisits few states).
class JsonTokenMasks {
 public:
  // pieces[t]: the bytes token t prints; an empty piece (a control token) is never allowed.
  explicit JsonTokenMasks(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  // The pieces of a tokenizer's vocabulary (control tokens print nothing, so never come).
  static std::unique_ptr<JsonTokenMasks> for_tokenizer(const model::Tokenizer& tokenizer);
  // mask[t] != 0 where token t may come next. The reference stays valid until the next call.
  const std::vector<uint8_t>& allowed(const JsonPrefix& state);
  const std::string& piece(int32_t token) const { return pieces_[size_t(token)]; }

 private:
  static constexpr size_t kMaxCached = 512;
  std::vector<std::string> pieces_;
  std::unordered_map<std::string, std::unique_ptr<std::vector<uint8_t>>> cache_;
};

}  // namespace escala::engine
