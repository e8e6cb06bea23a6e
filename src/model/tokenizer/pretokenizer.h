// Pre-tokenizers of byte-level BPE vocabularies: the text is cut into words before merging, by
// rules that the GGUF key tokenizer.ggml.pre selects. Each rule set is a sequence of passes; a
// pass cuts every piece left by the previous one into the matches of one expression and the
// text between them (so a lookahead never sees past the end of its piece). The expressions are
// hand-written matchers over code points, equivalent to the regular expressions in the comments
// of pretokenizer.cpp.
#pragma once

#include <string_view>
#include <vector>

#include "escala/status.h"

namespace escala::model {

enum class PreTokenizerKind {
  kDefault,     // "default" (also a missing key): punctuation runs, then GPT-2, then digit cuts
  kGpt2,        // "gpt2" and the other vocabularies that use GPT-2's expression unchanged
  kLlama3,      // "llama3", "llama-bpe": case-insensitive contractions, numbers in 1..3 digits
  kQwen2,       // "qwen2": as Llama 3 with single digits
  kDigitsGpt2,  // "smollm", "starcoder", "refact", ...: every digit alone, then GPT-2
};

// The rules for a tokenizer.ggml.pre value; an unknown value is an error naming it.
Result<PreTokenizerKind> pre_tokenizer_from_name(std::string_view name);
std::string_view pre_tokenizer_name(PreTokenizerKind kind);
// Whether a word that is itself a token skips the merges (Llama 3 does this).
bool pre_tokenizer_ignores_merges(PreTokenizerKind kind);

// Cuts `text` into words (views into `text`, in order, covering every byte).
std::vector<std::string_view> pre_tokenize(PreTokenizerKind kind, std::string_view text);

}  // namespace escala::model
