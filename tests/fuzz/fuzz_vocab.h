// Tokenizers for the fuzz targets: small hand-made vocabularies of both kinds (every pre-tokenizer
// for byte-level BPE, SentencePiece with byte fallback) and, when its file is present, the default
// model's real vocabulary. Built once per process.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "escala/tokenizer.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode_class.h"

namespace escala::fuzz {

using model::TokenId;
using model::TokenType;
using model::Tokenizer;
using model::VocabData;

// GPT-2's byte-level form of plain bytes.
inline std::string byte_level(std::string_view plain) {
  std::string out;
  for (char c : plain) model::unicode::append_utf8(out, model::byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

// 256 byte tokens, a few merges ("left|right" in plain text), then the ChatML specials.
inline VocabData bpe_vocab(const char* pre) {
  VocabData d;
  d.model = "gpt2";
  d.pre = pre;
  for (int b = 0; b < 256; ++b) d.tokens.push_back(byte_level(std::string(1, static_cast<char>(b))));
  for (const char* m : {"h|e", "l|l", "he|ll", "hell|o", " |w", " w|o", "r|l", " wo|rl", " worl|d", "1|2", " | ",
                        "\n|\n", "'|s"}) {
    const std::string s = m;
    const size_t bar = s.find('|', 1);
    const std::string l = byte_level(s.substr(0, bar)), r = byte_level(s.substr(bar + 1));
    d.merges.push_back(l + " " + r);
    d.tokens.push_back(l + r);
  }
  d.types.assign(d.tokens.size(), TokenType::kNormal);
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    d.tokens.push_back(special);
    d.types.push_back(TokenType::kControl);
  }
  d.bos = d.eos = static_cast<TokenId>(d.tokens.size() - 3);
  return d;
}

// <unk> <s> </s>, 256 byte tokens, then pieces scored by position.
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
  for (const char* p : {"▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "▁he", "ll", "▁hell", "▁hello", "▁w", "or", "▁wor",
                        "▁worl", "▁world", "▁▁", "\n"}) {
    d.tokens.push_back(p);
    d.types.push_back(TokenType::kNormal);
  }
  for (size_t i = 0; i < d.tokens.size(); ++i) d.scores.push_back(-static_cast<float>(i));
  d.bos = 1, d.eos = 2, d.unk = 0;
  return d;
}

inline Tokenizer must(Result<Tokenizer> t) {
  if (!t.ok()) {
    std::fprintf(stderr, "fuzz set-up: %s\n", t.message().c_str());
    std::abort();
  }
  return *std::move(t);
}

// The default model's vocabulary (ESCALA_FUZZ_MODEL, else the path compiled in), or null when the
// file is absent: the targets then run on the hand-made vocabularies alone.
inline const Tokenizer* model_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const char* env = std::getenv("ESCALA_FUZZ_MODEL");
    const std::string path = env ? env : ESCALA_FUZZ_DEFAULT_MODEL;
    if (!std::filesystem::exists(path)) return nullptr;
    auto file = model::GgufFile::open(path);
    if (!file.ok()) return nullptr;
    return std::make_unique<Tokenizer>(must(Tokenizer::from_gguf(*file)));
  }();
  return tok.get();
}

// Whether `s` is valid UTF-8 throughout.
inline bool valid_utf8(std::string_view s) {
  for (const auto& cp : model::unicode::decode_utf8(s))
    if (cp.cp == model::unicode::kInvalid) return false;
  return true;
}

}  // namespace escala::fuzz
