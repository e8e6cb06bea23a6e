// JSON mode (OpenAI's response_format {"type": "json_object"}): a byte-level recogniser of the
// prefixes of one JSON object (RFC 8259, UTF-8 checked), and the per-state masks of the tokens that
// keep the output such a prefix. The engine samples only allowed tokens and ends the request once
// the object is closed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace escala::engine {

class JsonPrefix {
 public:
  // Runs of whitespace between tokens are capped, so that a model cannot pad forever.
  static constexpr int kMaxWhitespaceRun = 16;

  // Consumes one byte; false (state unchanged in meaning: do not use it further) when no JSON
  // object starts with what was fed plus this byte.
  bool feed(uint8_t c);
  bool feed(std::string_view bytes);
  // The object is closed: nothing may follow.
  bool complete() const { return state_ == State::kDone; }
  // The whole state as bytes (a key for caching the token mask per state).
  std::string key() const;

 private:
  enum class State : uint8_t {
    kStart,         // before the top-level '{'
    kValue,         // a value must come
    kValueOrEnd,    // after '[': a value or ']'
    kKeyOrEnd,      // after '{': a key or '}'
    kKey,           // after ',' in an object: a key
    kColon,         // after a key
    kCommaOrEnd,    // after a value inside a container
    kString,        // inside a string
    kEscape,        // after '\' in a string
    kUnicode,       // inside \uXXXX (aux: hex digits left)
    kMinus,         // number: after '-'
    kZero,          // number: a leading 0
    kInt,           // number: integer digits
    kDot,           // number: after '.'
    kFrac,          // number: fraction digits
    kExp,           // number: after 'e'
    kExpSign,       // number: after the exponent's sign
    kExpDigits,     // number: exponent digits
    kLiteral,       // true / false / null (aux: bytes matched, literal_: which)
    kDone,          // the object is closed
  };
  bool structural(uint8_t c);
  bool begin_value(uint8_t c);
  void end_value();  // a value just ended: comma/end inside a container, done at the top
  bool whitespace(uint8_t c);

  // After a high surrogate escape (\uD800-\uDBFF) a low one must follow at once.
  enum class Surrogate : uint8_t { kNone, kWantBackslash, kWantLow };

  State state_ = State::kStart;
  bool in_key_ = false;            // the string being read is an object key
  uint8_t aux_ = 0;                // kUnicode: hex digits left; kLiteral: bytes matched
  char literal_ = 0;               // 't', 'f' or 'n'
  uint8_t utf8_left_ = 0;          // continuation bytes still due in a string
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the next continuation byte's range
  uint8_t ws_run_ = 0;
  Surrogate surrogate_ = Surrogate::kNone;
  uint16_t code_ = 0;              // kUnicode: the hex digits so far
  std::string stack_;              // open containers, '{' or '['
};

// Which tokens keep the output a JSON object prefix, from a recogniser's state. Token bytes are
// fixed per vocabulary; masks are cached per state (a run of JSON revisits few states).
class JsonTokenMasks {
 public:
  // pieces[t]: the bytes token t prints; an empty piece (a control token) is never allowed.
  explicit JsonTokenMasks(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  // mask[t] != 0 where token t may come next. The reference stays valid until the next call.
  const std::vector<uint8_t>& allowed(const JsonPrefix& state);
  const std::string& piece(int32_t token) const { return pieces_[size_t(token)]; }

 private:
  static constexpr size_t kMaxCached = 512;
  std::vector<std::string> pieces_;
  std::unordered_map<std::string, std::unique_ptr<std::vector<uint8_t>>> cache_;
};

}  // namespace escala::engine
