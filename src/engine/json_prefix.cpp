#include "engine/json_prefix.h"

namespace escala::engine {

namespace {
constexpr size_t kMaxDepth = 32;  // open containers at most: no endless "[[[[" either

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
const char* literal_text(char first) { return first == 't' ? "true" : first == 'f' ? "false" : "null"; }
}  // namespace

bool JsonPrefix::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(uint8_t(c))) return false;
  return true;
}

void JsonPrefix::end_value() { state_ = stack_.empty() ? State::kDone : State::kCommaOrEnd; }

bool JsonPrefix::whitespace(uint8_t c) {
  (void)c;
  return ++ws_run_ <= kMaxWhitespaceRun;
}

bool JsonPrefix::begin_value(uint8_t c) {
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return false;
      stack_.push_back(char(c));
      state_ = c == '{' ? State::kKeyOrEnd : State::kValueOrEnd;
      return true;
    case '"': state_ = State::kString; in_key_ = false; return true;
    case '-': state_ = State::kMinus; return true;
    case '0': state_ = State::kZero; return true;
    case 't':
    case 'f':
    case 'n': state_ = State::kLiteral; literal_ = char(c); aux_ = 1; return true;
    default:
      if (c >= '1' && c <= '9') {
        state_ = State::kInt;
        return true;
      }
      return false;
  }
}

// Bytes between values: whitespace, brackets, commas, colons and the first byte of a value.
bool JsonPrefix::structural(uint8_t c) {
  if (state_ == State::kDone) return false;
  if (is_ws(c)) return whitespace(c);
  ws_run_ = 0;
  switch (state_) {
    case State::kStart:
      if (c != '{') return false;
      stack_.push_back('{');
      state_ = State::kKeyOrEnd;
      return true;
    case State::kValue: return begin_value(c);
    case State::kValueOrEnd:
      if (c != ']') return begin_value(c);
      stack_.pop_back();
      end_value();
      return true;
    case State::kKeyOrEnd:
      if (c == '}') {
        stack_.pop_back();
        end_value();
        return true;
      }
      [[fallthrough]];
    case State::kKey:
      if (c != '"') return false;
      state_ = State::kString;
      in_key_ = true;
      return true;
    case State::kColon:
      if (c != ':') return false;
      state_ = State::kValue;
      return true;
    case State::kCommaOrEnd: {
      const bool object = stack_.back() == '{';
      if (c == ',') {
        state_ = object ? State::kKey : State::kValue;
        return true;
      }
      if (c != (object ? '}' : ']')) return false;
      stack_.pop_back();
      end_value();
      return true;
    }
    default: return false;
  }
}

bool JsonPrefix::feed(uint8_t c) {
  switch (state_) {
    case State::kString:
      if (surrogate_ == Surrogate::kWantBackslash) {
        if (c != '\\') return false;
        surrogate_ = Surrogate::kWantLow;
        state_ = State::kEscape;
        return true;
      }
      if (utf8_left_ > 0) {
        if (c < utf8_lo_ || c > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
        return true;
      }
      if (c == '"') {
        if (in_key_) {
          in_key_ = false;
          state_ = State::kColon;
        } else {
          end_value();
        }
        return true;
      }
      if (c == '\\') {
        state_ = State::kEscape;
        return true;
      }
      if (c < 0x20) return false;
      if (c < 0x80) return true;
      // A UTF-8 lead byte and the range of the byte after it (no overlongs, surrogates, > U+10FFFF).
      if (c >= 0xC2 && c <= 0xDF) utf8_left_ = 1;
      else if (c == 0xE0) utf8_left_ = 2, utf8_lo_ = 0xA0;
      else if (c == 0xED) utf8_left_ = 2, utf8_hi_ = 0x9F;
      else if (c >= 0xE1 && c <= 0xEF) utf8_left_ = 2;
      else if (c == 0xF0) utf8_left_ = 3, utf8_lo_ = 0x90;
      else if (c >= 0xF1 && c <= 0xF3) utf8_left_ = 3;
      else if (c == 0xF4) utf8_left_ = 3, utf8_hi_ = 0x8F;
      else return false;
      return true;
    case State::kEscape:
      if (c == 'u') {
        state_ = State::kUnicode;
        aux_ = 0;
        code_ = 0;
        return true;
      }
      if (surrogate_ == Surrogate::kWantLow) return false;  // a high surrogate needs \u next
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        state_ = State::kString;
        return true;
      }
      return false;
    case State::kUnicode: {
      const int h = hex_value(c);
      if (h < 0) return false;
      code_ = uint16_t(code_ << 4 | h);
      ++aux_;
      // Surrogates: a high one (D800-DBFF) must be followed by \u and a low one (DC00-DFFF); a
      // low one alone is invalid. Decided as soon as the first two digits tell.
      if (aux_ == 1 && surrogate_ == Surrogate::kWantLow && code_ != 0xD) return false;
      if (aux_ == 2) {
        const bool low = code_ >= 0xDC && code_ <= 0xDF;
        if (surrogate_ == Surrogate::kWantLow ? !low : low) return false;
      }
      if (aux_ < 4) return true;
      if (surrogate_ == Surrogate::kWantLow) {
        surrogate_ = Surrogate::kNone;
      } else if (code_ >= 0xD800 && code_ <= 0xDBFF) {
        surrogate_ = Surrogate::kWantBackslash;
      }
      state_ = State::kString;
      return true;
    }
    case State::kMinus:
      if (c == '0') state_ = State::kZero;
      else if (c >= '1' && c <= '9') state_ = State::kInt;
      else return false;
      return true;
    case State::kInt:
      if (is_digit(c)) return true;
      [[fallthrough]];
    case State::kZero:
      if (c == '.') {
        state_ = State::kDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        state_ = State::kExp;
        return true;
      }
      end_value();  // the number ended before this byte
      return structural(c);
    case State::kDot:
      if (!is_digit(c)) return false;
      state_ = State::kFrac;
      return true;
    case State::kFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        state_ = State::kExp;
        return true;
      }
      end_value();
      return structural(c);
    case State::kExp:
      if (c == '+' || c == '-') {
        state_ = State::kExpSign;
        return true;
      }
      [[fallthrough]];
    case State::kExpSign:
      if (!is_digit(c)) return false;
      state_ = State::kExpDigits;
      return true;
    case State::kExpDigits:
      if (is_digit(c)) return true;
      end_value();
      return structural(c);
    case State::kLiteral: {
      const char* text = literal_text(literal_);
      if (c != uint8_t(text[aux_])) return false;
      if (text[++aux_] == '\0') end_value();
      return true;
    }
    default: return structural(c);
  }
}

std::string JsonPrefix::key() const {
  std::string k;
  k.reserve(12 + stack_.size());
  for (uint8_t b : {uint8_t(state_), uint8_t(in_key_), aux_, uint8_t(literal_), utf8_left_, utf8_lo_, utf8_hi_,
                    ws_run_, uint8_t(surrogate_), uint8_t(code_ >> 8), uint8_t(code_)})
    k.push_back(char(b));
  return k + stack_;
}

const std::vector<uint8_t>& JsonTokenMasks::allowed(const JsonPrefix& state) {
  std::string k = state.key();
  if (auto it = cache_.find(k); it != cache_.end()) return *it->second;
  if (cache_.size() >= kMaxCached) cache_.clear();
  auto mask = std::make_unique<std::vector<uint8_t>>(pieces_.size(), 0);
  for (size_t t = 0; t < pieces_.size(); ++t) {
    if (pieces_[t].empty()) continue;
    JsonPrefix s = state;
    (*mask)[t] = s.feed(pieces_[t]);
  }
  return *cache_.emplace(std::move(k), std::move(mask)).first->second;
}

}  // namespace escala::engine
