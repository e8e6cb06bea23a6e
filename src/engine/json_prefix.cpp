#include "engine/json_prefix.h"

#include <algorithm>
#include <cstring>

namespace escala::engine {

namespace {
bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
int hex_value(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
// The words of a value node that takes booleans or null: choice_pick_ 0, 1, 2.
const std::string kWords[] = {"true", "false", "null"};
}  // namespace

MagnitudeRange::MagnitudeRange(std::optional<int64_t> min, std::optional<int64_t> max, bool negative) {
  // 0 - uint64_t(v) is |v| for v <= 0, INT64_MIN included.
  if (negative) {
    if (min && *min > 0) return;
    lo = max && *max < 0 ? 0 - uint64_t(*max) : 0;
    hi = min ? 0 - uint64_t(*min) : kNoBound;
  } else {
    if (max && *max < 0) return;
    lo = min && *min > 0 ? uint64_t(*min) : 0;
    hi = max ? uint64_t(*max) : kNoBound;
  }
}

uint64_t MagnitudeRange::append(uint64_t prefix, int digit) {
  return prefix > (kNoBound - uint64_t(digit)) / 10 ? kNoBound : prefix * 10 + uint64_t(digit);
}

// The magnitudes with k more digits than the prefix are [prefix·10^k, prefix·10^k + 10^k - 1]:
// some k's must overlap [lo, hi]. They rise with k, so the search stops once they pass hi (at most
// 20 steps: a finite hi is at most 2^63; with no hi, `last` reaches lo or saturates).
bool MagnitudeRange::has_prefix(uint64_t prefix) const {
  if (prefix == 0) return contains(0);
  for (uint64_t first = prefix, last = prefix; first <= hi; first = append(first, 0), last = append(last, 9))
    if (last >= lo) return true;
  return false;
}

bool MagnitudeRange::extends(uint64_t prefix) const {
  if (prefix == 0) return false;  // no leading zeros
  for (int d = 0; d <= 9; ++d)
    if (has_prefix(append(prefix, d))) return true;
  return false;
}

JsonPrefix::JsonPrefix(const JsonSchema* schema) : schema_(schema ? schema : JsonSchema::any_object().get()) {
  node_ = schema_->root();
}

JsonPrefix& JsonPrefix::operator=(const JsonPrefix& o) {
  schema_ = o.schema_;
  state_ = o.state_;
  node_ = o.node_;
  in_key_ = o.in_key_;
  integer_ = o.integer_;
  aux_ = o.aux_;
  utf8_left_ = o.utf8_left_, utf8_lo_ = o.utf8_lo_, utf8_hi_ = o.utf8_hi_;
  ws_run_ = o.ws_run_;
  surrogate_ = o.surrogate_;
  code_ = o.code_;
  length_ = o.length_, magnitude_ = o.magnitude_, negative_ = o.negative_;
  choice_kind_ = o.choice_kind_;
  choice_node_ = o.choice_node_, choice_pick_ = o.choice_pick_, choice_len_ = o.choice_len_;
  depth_ = o.depth_;
  std::copy(o.stack_.begin(), o.stack_.begin() + depth_, stack_.begin());  // only the frames in use
  return *this;
}

bool JsonPrefix::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(uint8_t(c))) return false;
  return true;
}

void JsonPrefix::end_value() {
  length_ = 0, magnitude_ = 0, negative_ = false;
  state_ = depth_ == 0 ? State::kDone : State::kCommaOrEnd;
  if (depth_ > 0 && stack_[size_t(depth_ - 1)].kind == '[') ++stack_[size_t(depth_ - 1)].index;
}

bool JsonPrefix::may_close(const Frame& f) const {
  const JsonSchemaNode* n = node(f.node);
  if (f.kind == '[') return !n || f.index >= n->min_items;
  if (!n || !n->keyed) return true;
  for (size_t i = size_t(f.index); i < n->properties.size(); ++i)
    if (n->properties[i].required) return false;
  return true;
}

bool JsonPrefix::may_continue(const Frame& f) const {
  const JsonSchemaNode* n = node(f.node);
  if (f.kind == '[') return !n || n->max_items < 0 || f.index < n->max_items;
  return !n || !n->keyed || size_t(f.index) < n->properties.size();
}

// Keys of a keyed object: the properties from the frame's index up to the first required one.
int32_t JsonPrefix::choice_count() const {
  if (choice_kind_ == ChoiceKind::kLiteral) return int32_t(node(choice_node_)->literals.size());
  if (choice_kind_ == ChoiceKind::kWord) return 3;
  const Frame& f = stack_[size_t(depth_ - 1)];
  const auto& props = node(f.node)->properties;
  int32_t last = f.index;
  while (size_t(last) + 1 < props.size() && !props[size_t(last)].required) ++last;
  return last + 1;  // choices are the absolute indices [f.index, last]
}

const std::string& JsonPrefix::choice_text(int32_t i) const {
  if (choice_kind_ == ChoiceKind::kLiteral) return node(choice_node_)->literals[size_t(i)];
  if (choice_kind_ == ChoiceKind::kWord) return kWords[i];
  return node(stack_[size_t(depth_ - 1)].node)->properties[size_t(i)].key;
}

bool JsonPrefix::choice_byte(uint8_t c) {
  const int32_t first = choice_kind_ == ChoiceKind::kKey ? stack_[size_t(depth_ - 1)].index : 0;
  const int32_t end = choice_count();
  const std::string& cur = choice_text(choice_pick_);
  const size_t len = size_t(choice_len_);
  bool complete_now = false;  // the bytes so far are a whole text (that others extend)
  int32_t next = len < cur.size() && uint8_t(cur[len]) == c ? choice_pick_ : -1;  // the usual case
  for (int32_t i = first; i < end && next < 0; ++i) {
    const std::string& t = choice_text(i);
    if (t.size() < len || t.compare(0, len, cur, 0, len) != 0) continue;
    if (t.size() == len) complete_now = true;
    else if (uint8_t(t[len]) == c) next = i;
  }
  if (next < 0) {
    if (!complete_now) return false;
    end_value();  // e.g. the enum value 1 of {1, 10}, followed by ','
    return structural(c);
  }
  choice_pick_ = next;
  ++choice_len_;
  // Whole, and no other text goes on from here: the value (or key) ends with this byte.
  const std::string& t = choice_text(next);
  if (t.size() != size_t(choice_len_)) return true;
  for (int32_t i = first; i < end; ++i) {
    const std::string& u = choice_text(i);
    if (u.size() > t.size() && u.compare(0, t.size(), t) == 0) return true;
  }
  if (choice_kind_ == ChoiceKind::kKey) {
    Frame& f = stack_[size_t(depth_ - 1)];
    node_ = node(f.node)->properties[size_t(next)].node;
    f.index = next + 1;
    state_ = State::kColon;
  } else {
    end_value();
  }
  return true;
}

// Free object keys are not counted (a node's length bounds are for its string values).
bool JsonPrefix::count_char() {
  const JsonSchemaNode* n = node(node_);
  if (in_key_ || !n) return true;
  if (n->max_length >= 0 && length_ >= n->max_length) return false;
  length_ = std::min(length_ + 1, n->max_length >= 0 ? n->max_length : n->min_length);
  return true;
}

bool JsonPrefix::may_close_string() const {
  const JsonSchemaNode* n = node(node_);
  return in_key_ || !n || length_ >= n->min_length;
}

MagnitudeRange JsonPrefix::integer_range() const {
  const JsonSchemaNode* n = node(node_);
  return n ? MagnitudeRange(n->minimum, n->maximum, negative_) : MagnitudeRange({}, {}, negative_);
}

// Refused unless some integer within the bounds begins with the digits so far (magnitude_ 0: none
// yet, since nothing follows a leading 0).
bool JsonPrefix::integer_digit(uint8_t c) {
  state_ = State::kInt;
  if (magnitude_ == kAnyDigits) return true;
  const MagnitudeRange r = integer_range();
  const uint64_t m = MagnitudeRange::append(magnitude_, c - '0');
  if (!r.has_prefix(m)) return false;
  if (!r.extends(m)) {
    end_value();  // e.g. "0", or "5" under maximum 5: the next byte is the container's
  } else if (r.contains(m) && r.hi == MagnitudeRange::kNoBound) {
    magnitude_ = kAnyDigits;  // every continuation is within the bounds
    negative_ = false;
  } else {
    magnitude_ = m;
  }
  return true;
}

bool JsonPrefix::integer_may_end() const { return magnitude_ == kAnyDigits || integer_range().contains(magnitude_); }

bool JsonPrefix::begin_value(uint8_t c) {
  const JsonSchemaNode* n = node(node_);
  if (n && !n->any_of.empty()) {
    // The branch whose values can begin with c (at most one: checked when compiled).
    for (int32_t branch : n->any_of) {
      JsonPrefix t = *this;
      t.node_ = branch;
      if (t.begin_value(c)) {
        *this = t;
        return true;
      }
    }
    return false;
  }
  if (n && !n->literals.empty()) {
    choice_kind_ = ChoiceKind::kLiteral;
    choice_node_ = node_;
    choice_pick_ = 0;
    choice_len_ = 0;
    state_ = State::kChoice;
    return choice_byte(c);
  }
  const uint8_t types = n ? n->types : uint8_t(kJsonAnyType);
  switch (c) {
    case '{':
    case '[':
      if (!(types & (c == '{' ? kJsonObject : kJsonArray)) || depth_ >= kMaxDepth) return false;
      stack_[size_t(depth_++)] = Frame{n ? node_ : -1, 0, char(c)};
      if (c == '[') {
        node_ = n ? n->items : -1;
        state_ = State::kValueOrEnd;
      } else {
        state_ = State::kKeyOrEnd;
      }
      return true;
    case '"':
      if (!(types & kJsonString)) return false;
      state_ = State::kString;
      in_key_ = false;
      length_ = 0;
      return true;
    case 't':
    case 'f':
    case 'n':
      if (!(types & (c == 'n' ? kJsonNull : kJsonBoolean))) return false;
      choice_kind_ = ChoiceKind::kWord;
      choice_pick_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
      choice_len_ = 1;
      state_ = State::kChoice;
      return true;
    default:
      if (!(types & (kJsonInteger | kJsonNumber)) || !(c == '-' || is_digit(c))) return false;
      integer_ = !(types & kJsonNumber);
      negative_ = integer_ && c == '-';  // only integers' signs matter (their bounds)
      magnitude_ = 0;
      if (integer_) {
        if (c != '-') return integer_digit(c);
        state_ = State::kMinus;
        return !integer_range().empty();
      }
      state_ = c == '-' ? State::kMinus : c == '0' ? State::kZero : State::kInt;
      return true;
  }
}

// Bytes between values: whitespace, brackets, commas, colons and the first byte of a value.
bool JsonPrefix::structural(uint8_t c) {
  if (state_ == State::kDone) return false;
  if (is_ws(c)) return ++ws_run_ <= kMaxWhitespaceRun;
  ws_run_ = 0;
  Frame* top = depth_ > 0 ? &stack_[size_t(depth_ - 1)] : nullptr;
  switch (state_) {
    case State::kValue: return begin_value(c);
    case State::kValueOrEnd:
      if (c == ']') {
        if (!may_close(*top)) return false;
        --depth_;
        end_value();
        return true;
      }
      return may_continue(*top) && begin_value(c);
    case State::kKeyOrEnd:
      if (c == '}') {
        if (!may_close(*top)) return false;
        --depth_;
        end_value();
        return true;
      }
      [[fallthrough]];
    case State::kKey: {
      if (c != '"') return false;
      const JsonSchemaNode* n = node(top->node);
      if (n && n->keyed) {
        if (size_t(top->index) >= n->properties.size()) return false;
        choice_kind_ = ChoiceKind::kKey;
        choice_pick_ = top->index;
        choice_len_ = 1;  // every key text begins with '"'
        state_ = State::kChoice;
        return true;
      }
      state_ = State::kString;
      in_key_ = true;
      return true;
    }
    case State::kColon:
      if (c != ':') return false;
      state_ = State::kValue;
      return true;
    case State::kCommaOrEnd: {
      const bool object = top->kind == '{';
      if (c == ',') {
        if (!may_continue(*top)) return false;
        state_ = object ? State::kKey : State::kValue;
        if (!object) node_ = top->node < 0 ? -1 : node(top->node)->items;
        return true;
      }
      if (c != (object ? '}' : ']') || !may_close(*top)) return false;
      --depth_;
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
        if (!may_close_string()) return false;
        if (in_key_) {  // a free key: any value follows
          in_key_ = false;
          node_ = -1;
          state_ = State::kColon;
        } else {
          end_value();
        }
        return true;
      }
      // A character counts at its first byte: an escape's '\\' (a surrogate pair's second half is
      // not counted: above), a UTF-8 lead byte.
      if (c == '\\') {
        state_ = State::kEscape;
        return count_char();
      }
      if (c < 0x20) return false;
      if (c < 0x80) return count_char();
      // A UTF-8 lead byte and the range of the byte after it (no overlongs, surrogates, > U+10FFFF).
      if (c >= 0xC2 && c <= 0xDF) utf8_left_ = 1;
      else if (c == 0xE0) utf8_left_ = 2, utf8_lo_ = 0xA0;
      else if (c == 0xED) utf8_left_ = 2, utf8_hi_ = 0x9F;
      else if (c >= 0xE1 && c <= 0xEF) utf8_left_ = 2;
      else if (c == 0xF0) utf8_left_ = 3, utf8_lo_ = 0x90;
      else if (c >= 0xF1 && c <= 0xF3) utf8_left_ = 3;
      else if (c == 0xF4) utf8_left_ = 3, utf8_hi_ = 0x8F;
      else return false;
      return count_char();
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
      // low one alone is invalid. Decided as soon as the first digits tell.
      if (aux_ == 1 && surrogate_ == Surrogate::kWantLow && code_ != 0xD) return false;
      if (aux_ == 2) {
        const bool low = code_ >= 0xDC && code_ <= 0xDF;
        if (surrogate_ == Surrogate::kWantLow ? !low : low) return false;
      }
      if (aux_ < 4) return true;
      if (surrogate_ == Surrogate::kWantLow) surrogate_ = Surrogate::kNone;
      else if (code_ >= 0xD800 && code_ <= 0xDBFF) surrogate_ = Surrogate::kWantBackslash;
      state_ = State::kString;
      return true;
    }
    case State::kMinus:
      if (integer_) return is_digit(c) && integer_digit(c);
      if (c == '0') state_ = State::kZero;
      else if (c >= '1' && c <= '9') state_ = State::kInt;
      else return false;
      return true;
    case State::kInt:
      if (is_digit(c)) return !integer_ || integer_digit(c);
      if (integer_) {  // the number ends before this byte, if within its bounds
        if (!integer_may_end()) return false;
        end_value();
        return structural(c);
      }
      [[fallthrough]];
    case State::kZero:  // never an integer's: its "0" ends at once (integer_digit)
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
    case State::kChoice: return choice_byte(c);
    default: return structural(c);
  }
}

std::string JsonPrefix::key() const {
  std::string k;
  auto put = [&k](const auto& v) { k.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(schema_->serial());
  for (uint8_t b : {uint8_t(state_), uint8_t(in_key_), uint8_t(integer_), aux_, utf8_left_, utf8_lo_, utf8_hi_, ws_run_,
                    uint8_t(surrogate_), uint8_t(choice_kind_)})
    k.push_back(char(b));
  for (int32_t v : {node_, int32_t(code_), choice_node_, choice_pick_, choice_len_, depth_}) put(v);
  put(length_);
  put(magnitude_);
  k.push_back(char(negative_));
  for (int32_t i = 0; i < depth_; ++i) {
    put(stack_[size_t(i)].node);
    put(stack_[size_t(i)].index);
    k.push_back(stack_[size_t(i)].kind);
  }
  return k;
}

std::unique_ptr<JsonTokenMasks> JsonTokenMasks::for_tokenizer(const model::Tokenizer& tokenizer) {
  std::vector<std::string> pieces(static_cast<size_t>(tokenizer.vocab_size()));
  for (int32_t t = 0; t < tokenizer.vocab_size(); ++t) pieces[size_t(t)] = tokenizer.token_to_piece(t);
  return std::make_unique<JsonTokenMasks>(std::move(pieces));
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
