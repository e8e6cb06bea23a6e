// Tokenizers for the fuzz targets: the tests' hand-made vocabularies of both kinds
// (tests/unit/tokenizer_vocabs.h) and, when its file is present, the default model's real
// vocabulary. Built once per process.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "escala/tokenizer.h"
#include "model/tokenizer/unicode_class.h"
#include "../unit/tokenizer_vocabs.h"

namespace escala::fuzz {

using model::TokenId;
using model::Tokenizer;

// The hand-made vocabularies' merges: the tests' and a few for spaces, newlines and contractions.
inline std::vector<std::string> fuzz_merges() {
  std::vector<std::string> m = model::kHelloMerges;
  for (const char* extra : {" | ", "\n|\n", "'|s"}) m.push_back(extra);
  return m;
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
