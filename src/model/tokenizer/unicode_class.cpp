// UTF-8 decoding and the character-class lookups over the generated run table.
#include "model/tokenizer/unicode_class.h"

#include <algorithm>

namespace escala::model::unicode {

CharClass char_class(uint32_t cp) {
  if (cp < 0x80) {  // fast path for ASCII
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
  }
  if (cp > 0x10FFFF) return CharClass::kOther;
  std::span<const uint32_t> runs = category_runs();
  // The last run whose start is <= cp.
  auto it = std::upper_bound(runs.begin(), runs.end(), cp,
                             [](uint32_t v, uint32_t run) { return v < (run >> 2); });
  if (it == runs.begin()) return CharClass::kOther;
  return static_cast<CharClass>(*(it - 1) & 3u);
}

bool is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

int utf8_sequence_length(std::string_view s) {
  if (s.empty()) return 0;
  const auto b0 = static_cast<uint8_t>(s[0]);
  int len;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) len = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;        // no overlong forms
    else if (b0 == 0xED) hi = 0x9F;   // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    else if (b0 == 0xF4) hi = 0x8F;   // nothing past U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= s.size()) return 0;
    const auto b = static_cast<uint8_t>(s[k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return -1;
  }
  return len;
}

std::vector<CodePoint> decode_utf8(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const int len = utf8_sequence_length(text.substr(i));
    const auto b0 = static_cast<uint8_t>(text[i]);
    if (len <= 0) {
      out.push_back({kInvalid, static_cast<uint32_t>(i), 1});
      ++i;
      continue;
    }
    uint32_t cp;
    if (len == 1) cp = b0;
    else if (len == 2) cp = b0 & 0x1Fu;
    else if (len == 3) cp = b0 & 0x0Fu;
    else cp = b0 & 0x07u;
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3Fu);
    out.push_back({cp, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace escala::model::unicode
