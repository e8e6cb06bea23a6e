// The tokenizer's immutable state, shared by its translation units (not a public header).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "escala/tokenizer.h"
#include "model/tokenizer/pretokenizer.h"

namespace escala::model {

struct Merge {
  int32_t rank;
  TokenId result;
};

inline uint64_t pair_key(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Tokenizer::Impl {
  VocabKind kind = VocabKind::kBpe;
  PreTokenizerKind pre = PreTokenizerKind::kDefault;
  std::string pre_name;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<TokenType> types;
  // Views into `tokens`, which never change once the Impl is built.
  std::unordered_map<std::string_view, TokenId> ids;
  std::unordered_map<uint64_t, Merge> merges;  // BPE: (left, right) -> rank and result
  // BPE: the token of each byte's GPT-2 character; SPM: the <0xXX> token. kNoToken if absent.
  std::array<TokenId, 256> byte_tokens{};
  // CONTROL, USER_DEFINED and UNKNOWN tokens, longest text first.
  std::vector<TokenId> specials;
  std::vector<TokenId> end_of_generation;
  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, unk = kNoToken;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  std::string chat_template;

  TokenId find(std::string_view text) const {
    auto it = ids.find(text);
    return it == ids.end() ? kNoToken : it->second;
  }
  TokenType type(TokenId id) const { return types.empty() ? TokenType::kNormal : types[id]; }
  float score(TokenId id) const { return scores.empty() ? 0.0f : scores[id]; }
};

// GPT-2's reversible byte <-> printable-character mapping (bytes_to_unicode).
uint32_t byte_to_unicode(uint8_t byte);
// The byte for a mapped character, or -1.
int unicode_to_byte(uint32_t cp);

// Byte-level BPE of one pre-tokenized word (appends to `out`).
Status bpe_encode_word(const Tokenizer::Impl& v, std::string_view word, std::vector<TokenId>& out);
// SentencePiece BPE of one fragment of text, spaces already escaped to U+2581.
Status spm_encode(const Tokenizer::Impl& v, std::string_view text, std::vector<TokenId>& out);

}  // namespace escala::model
