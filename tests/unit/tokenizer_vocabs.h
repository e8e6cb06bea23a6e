// Small hand-made vocabularies of both kinds, for the tokenizer tests and the tokenizer and
// protocol fuzz targets (tests/fuzz).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "escala/tokenizer.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode_class.h"

namespace escala::model {

// GPT-2 byte-level form of plain bytes ("a b" -> "aĠb").
inline std::string mapped(std::string_view plain) {
  std::string out;
  for (char c : plain) unicode::append_utf8(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

// 256 byte tokens, the results of `merges` (plain text, "left|right"), then four specials.
inline VocabData bpe_vocab(std::string pre, const std::vector<std::string>& merges,
                           const std::vector<std::string>& extra_tokens = {}) {
  VocabData d;
  d.model = "gpt2";
  d.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) d.tokens.push_back(mapped(std::string(1, static_cast<char>(b))));
  for (const std::string& m : merges) {
    const size_t sp = m.find('|');
    const std::string l = mapped(m.substr(0, sp)), r = mapped(m.substr(sp + 1));
    d.merges.push_back(l + " " + r);
    d.tokens.push_back(l + r);
  }
  for (const std::string& t : extra_tokens) d.tokens.push_back(mapped(t));
  d.types.assign(d.tokens.size(), TokenType::kNormal);
  for (auto [text, type] : {std::pair{"<|endoftext|>", TokenType::kControl}, {"<|im_start|>", TokenType::kControl},
                            {"<|im_end|>", TokenType::kControl}, {"<tool>", TokenType::kUserDefined}}) {
    d.tokens.push_back(text);
    d.types.push_back(type);
  }
  d.bos = d.eos = static_cast<TokenId>(d.tokens.size() - 4);
  return d;
}

inline const std::vector<std::string> kHelloMerges = {"h|e", "l|l", "he|ll", "hell|o", " |w", " w|o", "r|l", " wo|rl",
                                                      " worl|d", "1|2"};

// SentencePiece vocabulary: <unk> <s> </s>, 256 byte tokens, then pieces scored by position.
inline VocabData spm_vocab() {
  VocabData d;
  d.model = "llama";
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    d.tokens.push_back(buf);
    d.types.push_back(TokenType::kByte);
  }
  for (const char* p : {"▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "ll", "▁hell", "▁hello", "▁w", "or",
                        "▁wor", "▁worl", "▁world", "<tool>"}) {
    d.tokens.push_back(p);
    d.types.push_back(std::string_view(p) == "<tool>" ? TokenType::kUserDefined : TokenType::kNormal);
  }
  for (size_t i = 0; i < d.tokens.size(); ++i) d.scores.push_back(-static_cast<float>(i));
  d.bos = 1;
  d.eos = 2;
  d.unk = 0;
  return d;
}

}  // namespace escala::model
