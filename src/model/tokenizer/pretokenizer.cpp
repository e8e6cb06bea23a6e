// The pre-tokenizer passes. Each matcher returns the length (in code points) of the match that
// the corresponding regular expression finds at `pos` inside the piece [pos, end), or 0.
#include "model/tokenizer/pretokenizer.h"

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <string>

#include "model/tokenizer/unicode_class.h"

namespace escala::model {

namespace {

using unicode::CodePoint;

// Per code point: class bits.
enum : uint8_t { kL = 1, kN = 2, kP = 4, kS = 8 };

struct Text {
  std::vector<CodePoint> cps;
  std::vector<uint8_t> flags;
  uint32_t cp(size_t i) const { return cps[i].cp; }
  bool letter(size_t i) const { return flags[i] & kL; }
  bool number(size_t i) const { return flags[i] & kN; }
  bool space(size_t i) const { return flags[i] & kS; }
  // [^\s\p{L}\p{N}]
  bool other(size_t i) const { return (flags[i] & (kL | kN | kS)) == 0; }
  bool newline(size_t i) const { return cps[i].cp == '\r' || cps[i].cp == '\n'; }
};

using Matcher = size_t (*)(const Text&, size_t pos, size_t end);

// 's|'t|'re|'ve|'m|'ll|'d, optionally ignoring ASCII case.
size_t match_contraction(const Text& t, size_t pos, size_t end, bool ignore_case) {
  if (t.cp(pos) != '\'' || pos + 1 >= end) return 0;
  auto lower = [&](size_t i) -> uint32_t {
    if (i >= end) return 0;
    uint32_t c = t.cp(i);
    return ignore_case && c >= 'A' && c <= 'Z' ? c + 32 : c;
  };
  const uint32_t a = lower(pos + 1), b = lower(pos + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ at a white-space code point: the run, less its last code point when a
// non-space follows and the run is longer than one.
size_t match_space_run(const Text& t, size_t pos, size_t end) {
  size_t k = pos;
  while (k < end && t.space(k)) ++k;
  if (k < end && k - pos >= 2) return k - 1 - pos;
  return k - pos;
}

// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Text& t, size_t pos, size_t end) {
  if (size_t n = match_contraction(t, pos, end, false)) return n;
  size_t j = pos + (t.cp(pos) == ' ' && pos + 1 < end ? 1 : 0);
  for (int pass = 0; pass < 2; ++pass) {
    size_t k = j;
    if (t.letter(j)) {
      while (k < end && t.letter(k)) ++k;
    } else if (t.number(j)) {
      while (k < end && t.number(k)) ++k;
    } else if (t.other(j)) {
      while (k < end && t.other(k)) ++k;
    }
    if (k > j) return k - pos;
    if (j == pos) break;
    j = pos;  // the optional space did not lead anywhere: try without it
  }
  return match_space_run(t, pos, end);
}

// Llama 3 (max_digits 3) and Qwen 2 (max_digits 1):
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
template <size_t kMaxDigits>
size_t match_llama3(const Text& t, size_t pos, size_t end) {
  if (size_t n = match_contraction(t, pos, end, true)) return n;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t j = pos;
  if (!t.letter(pos) && !t.number(pos) && !t.newline(pos) && pos + 1 < end && t.letter(pos + 1)) j = pos + 1;
  if (t.letter(j)) {
    size_t k = j;
    while (k < end && t.letter(k)) ++k;
    return k - pos;
  }
  if (t.number(pos)) {
    size_t k = pos;
    while (k < end && k - pos < kMaxDigits && t.number(k)) ++k;
    return k - pos;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  j = pos + (t.cp(pos) == ' ' && pos + 1 < end && t.other(pos + 1) ? 1 : 0);
  if (t.other(j)) {
    size_t k = j;
    while (k < end && t.other(k)) ++k;
    while (k < end && t.newline(k)) ++k;
    return k - pos;
  }
  // \s*[\r\n]+ : up to the last line break of the white-space run.
  size_t k = pos, last_break = end;
  while (k < end && t.space(k)) {
    if (t.newline(k)) last_break = k;
    ++k;
  }
  if (last_break != end) return last_break + 1 - pos;
  return match_space_run(t, pos, end);
}

size_t match_each_number(const Text& t, size_t pos, size_t) { return t.number(pos) ? 1 : 0; }

size_t match_number_run(const Text& t, size_t pos, size_t end) {
  size_t k = pos;
  while (k < end && t.number(k)) ++k;
  return k - pos;
}

// [\p{P}\$\+<=>\^~\|]+
size_t match_punct_run(const Text& t, size_t pos, size_t end) {
  auto hit = [&](size_t i) {
    if (t.flags[i] & kP) return true;
    switch (t.cp(i)) {
      case '$': case '+': case '<': case '=': case '>': case '^': case '~': case '|': return true;
      default: return false;
    }
  };
  size_t k = pos;
  while (k < end && hit(k)) ++k;
  return k - pos;
}

// [0-9][0-9][0-9]
size_t match_ascii_triple(const Text& t, size_t pos, size_t end) {
  if (pos + 3 > end) return 0;
  for (size_t i = pos; i < pos + 3; ++i)
    if (t.cp(i) < '0' || t.cp(i) > '9') return 0;
  return 3;
}

struct Piece {
  size_t begin, end;
};

std::vector<Piece> apply_pass(const Text& t, const std::vector<Piece>& in, Matcher m) {
  std::vector<Piece> out;
  out.reserve(in.size() * 2);
  for (const Piece& p : in) {
    size_t gap = p.begin, pos = p.begin;
    while (pos < p.end) {
      const size_t n = m(t, pos, p.end);
      if (n == 0) {
        ++pos;
        continue;
      }
      if (gap < pos) out.push_back({gap, pos});
      out.push_back({pos, pos + n});
      pos += n;
      gap = pos;
    }
    if (gap < p.end) out.push_back({gap, p.end});
  }
  return out;
}

struct NamedKind {
  std::string_view name;
  PreTokenizerKind kind;
};
constexpr std::array kNames{
    NamedKind{"default", PreTokenizerKind::kDefault},
    NamedKind{"gpt2", PreTokenizerKind::kGpt2},
    NamedKind{"gpt-2", PreTokenizerKind::kGpt2},
    NamedKind{"mpt", PreTokenizerKind::kGpt2},
    NamedKind{"olmo", PreTokenizerKind::kGpt2},
    NamedKind{"jais", PreTokenizerKind::kGpt2},
    NamedKind{"llama3", PreTokenizerKind::kLlama3},
    NamedKind{"llama-v3", PreTokenizerKind::kLlama3},
    NamedKind{"llama-bpe", PreTokenizerKind::kLlama3},
    NamedKind{"falcon3", PreTokenizerKind::kLlama3},
    NamedKind{"qwen2", PreTokenizerKind::kQwen2},
    NamedKind{"deepseek-r1-qwen", PreTokenizerKind::kQwen2},
    NamedKind{"stablelm2", PreTokenizerKind::kQwen2},
    NamedKind{"smollm", PreTokenizerKind::kDigitsGpt2},
    NamedKind{"starcoder", PreTokenizerKind::kDigitsGpt2},
    NamedKind{"refact", PreTokenizerKind::kDigitsGpt2},
    NamedKind{"command-r", PreTokenizerKind::kDigitsGpt2},
    NamedKind{"codeshell", PreTokenizerKind::kDigitsGpt2},
    NamedKind{"exaone", PreTokenizerKind::kDigitsGpt2},
};

}  // namespace

Result<PreTokenizerKind> pre_tokenizer_from_name(std::string_view name) {
  if (name.empty()) return PreTokenizerKind::kDefault;
  for (const NamedKind& n : kNames)
    if (n.name == name) return n.kind;
  std::string known;
  for (const NamedKind& n : kNames) known += (known.empty() ? "" : ", ") + std::string(n.name);
  return Status::error(fmt::format("tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = '{}' (known: {})",
                                   name, known));
}

std::string_view pre_tokenizer_name(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kDefault: return "default";
    case PreTokenizerKind::kGpt2: return "gpt2";
    case PreTokenizerKind::kLlama3: return "llama3";
    case PreTokenizerKind::kQwen2: return "qwen2";
    case PreTokenizerKind::kDigitsGpt2: return "smollm";
  }
  return "?";
}

bool pre_tokenizer_ignores_merges(PreTokenizerKind kind) { return kind == PreTokenizerKind::kLlama3; }

std::vector<std::string_view> pre_tokenize(PreTokenizerKind kind, std::string_view text) {
  Text t;
  t.cps = unicode::decode_utf8(text);
  t.flags.resize(t.cps.size());
  for (size_t i = 0; i < t.cps.size(); ++i) {
    const uint32_t cp = t.cps[i].cp;
    uint8_t f = 0;
    switch (unicode::char_class(cp)) {
      case unicode::CharClass::kLetter: f = kL; break;
      case unicode::CharClass::kNumber: f = kN; break;
      case unicode::CharClass::kPunct: f = kP; break;
      case unicode::CharClass::kOther: break;
    }
    if (unicode::is_space(cp)) f |= kS;
    t.flags[i] = f;
  }
  std::vector<Piece> pieces;
  if (!t.cps.empty()) pieces.push_back({0, t.cps.size()});
  switch (kind) {
    case PreTokenizerKind::kDefault:
      pieces = apply_pass(t, pieces, match_punct_run);
      pieces = apply_pass(t, pieces, match_gpt2);
      pieces = apply_pass(t, pieces, match_number_run);
      pieces = apply_pass(t, pieces, match_ascii_triple);
      break;
    case PreTokenizerKind::kGpt2: pieces = apply_pass(t, pieces, match_gpt2); break;
    case PreTokenizerKind::kLlama3: pieces = apply_pass(t, pieces, match_llama3<3>); break;
    case PreTokenizerKind::kQwen2: pieces = apply_pass(t, pieces, match_llama3<1>); break;
    case PreTokenizerKind::kDigitsGpt2:
      pieces = apply_pass(t, pieces, match_each_number);
      pieces = apply_pass(t, pieces, match_gpt2);
      break;
  }
  std::vector<std::string_view> words;
  words.reserve(pieces.size());
  for (const Piece& p : pieces) {
    const size_t b = t.cps[p.begin].offset;
    const size_t e = t.cps[p.end - 1].offset + t.cps[p.end - 1].size;
    words.push_back(text.substr(b, e - b));
  }
  return words;
}

}  // namespace escala::model
