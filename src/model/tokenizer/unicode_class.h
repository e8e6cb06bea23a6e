// Code points, UTF-8 and the few Unicode properties the pre-tokenizers test.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace escala::model::unicode {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kPunct = 3 };

// Sorted runs from the generated table (unicode_tables.cpp).
std::span<const uint32_t> category_runs();

CharClass char_class(uint32_t cp);
inline bool is_letter(uint32_t cp) { return char_class(cp) == CharClass::kLetter; }
inline bool is_number(uint32_t cp) { return char_class(cp) == CharClass::kNumber; }
inline bool is_punct(uint32_t cp) { return char_class(cp) == CharClass::kPunct; }
// The Unicode White_Space property (what \s means in the pre-tokenizer expressions).
bool is_space(uint32_t cp);

// A code point with the bytes it came from. Invalid UTF-8 is one "code point" per bad byte with
// cp = kInvalid, so splitting never loses or alters input bytes.
inline constexpr uint32_t kInvalid = 0xFFFFFFFFu;
struct CodePoint {
  uint32_t cp;
  uint32_t offset;  // byte offset in the text
  uint32_t size;    // bytes
};
std::vector<CodePoint> decode_utf8(std::string_view text);

// Length of the complete, valid UTF-8 sequence at the start of `bytes` (1..4), 0 when the
// bytes are a valid but incomplete prefix, -1 when the first bytes cannot start a valid sequence.
int utf8_sequence_length(std::string_view bytes);

void append_utf8(std::string& out, uint32_t cp);

}  // namespace escala::model::unicode
