// Tokenizers built from a GGUF vocabulary alone, the streaming detokenizer and chat templates.
//
// Two vocabulary kinds (tokenizer.ggml.model):
//  - "gpt2": byte-level BPE. Text is cut into words by the pre-tokenizer named in
//    tokenizer.ggml.pre, every byte of a word becomes one symbol (GPT-2's byte-to-character
//    mapping), and adjacent symbols merge by the rank of tokenizer.ggml.merges. A byte the
//    vocabulary has no token for is left out, as llama.cpp does.
//  - "llama": SentencePiece-style BPE. Spaces become U+2581, a space is prefixed when
//    tokenizer.ggml.add_space_prefix says so, adjacent symbols merge by the highest
//    tokenizer.ggml.scores, and characters without a token fall back to <0xXX> byte tokens.
// Special tokens (token types CONTROL and USER_DEFINED) are found as whole strings before BPE.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "escala/status.h"

namespace escala::model {

class GgufFile;

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// Numbered as tokenizer.ggml.token_type stores them.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class VocabKind { kBpe, kSpm };

struct EncodeOptions {
  // Add BOS (and EOS) as the model's tokenizer.ggml.add_bos_token / add_eos_token ask.
  bool add_special = true;
  // Recognise CONTROL tokens such as <|im_start|> written in the text. USER_DEFINED tokens are
  // always recognised.
  bool parse_special = false;
};

struct DecodeOptions {
  // Print CONTROL tokens as their text (otherwise they print as nothing).
  bool render_special = false;
  // Drop the space SentencePiece put before the first word (only for "llama" vocabularies that
  // add a space prefix), so that decode(encode(text)) == text.
  bool strip_leading_space = true;
};

// Everything the tokenizer reads from GGUF metadata; tests can build one by hand.
struct VocabData {
  std::string model;  // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;    // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> tokens;
  std::vector<float> scores;           // empty, or one per token
  std::vector<TokenType> types;        // empty (all normal), or one per token
  std::vector<std::string> merges;     // "left right", rank order
  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, unk = kNoToken, pad = kNoToken;
  int add_bos = -1, add_eos = -1, add_space_prefix = -1;  // -1: the kind's default
  std::string chat_template;
};

class Tokenizer {
 public:
  // Reads the tokenizer.* keys; a missing or malformed key is an error naming it.
  static Result<Tokenizer> from_gguf(const GgufFile& file);
  static Result<Tokenizer> from_vocab(VocabData data);

  Result<std::vector<TokenId>> encode(std::string_view text, const EncodeOptions& options = {}) const;
  // The bytes of one token (CONTROL tokens: empty unless render_special). No leading-space strip.
  std::string token_to_piece(TokenId id, bool render_special = false) const;
  // The text of a whole sequence; ids out of range are an error.
  Result<std::string> decode(std::span<const TokenId> ids, const DecodeOptions& options = {}) const;

  VocabKind kind() const;
  std::string_view pre_tokenizer() const;
  int32_t vocab_size() const;
  std::string_view token_text(TokenId id) const;  // as stored in the vocabulary
  TokenType token_type(TokenId id) const;
  TokenId find_token(std::string_view text) const;  // kNoToken when absent
  TokenId bos() const;
  TokenId eos() const;
  TokenId eot() const;
  TokenId unk() const;
  bool add_bos() const;
  bool add_eos() const;
  bool add_space_prefix() const;
  // End of generation: EOS, EOT, and the end-of-turn tokens of the known chat formats.
  bool is_end_of_generation(TokenId id) const;
  const std::string& chat_template() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;  // immutable: copies are cheap and thread-safe
};

// Turns a stream of token ids into text that only ever ends on complete UTF-8 characters:
// bytes of a character split over tokens are held back until the character is complete.
// Bytes that can never form a valid character come out as U+FFFD.
// By default nothing is stripped: generated tokens continue a prompt, so the space of a first
// SentencePiece piece such as "▁Paris" belongs in the output.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer,
                         DecodeOptions options = {.render_special = false, .strip_leading_space = false});
  // The text that became complete with this token (often empty or one word).
  Result<std::string> push(TokenId id);
  // Whatever is still held back (incomplete characters become U+FFFD). Call at the end.
  std::string flush();
  void reset();

 private:
  Tokenizer tokenizer_;
  DecodeOptions options_;
  std::string pending_;
  bool at_start_ = true;
};

// ---- Chat templates -----------------------------------------------------------------------

enum class ChatFormat { kChatMl, kLlama3, kGemma, kLlama2 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // Recognises the family of a Jinja template (tokenizer.chat_template). An empty template is
  // ChatML (as llama.cpp does); an unrecognised one is an error naming --chat-template.
  static Result<ChatTemplate> from_jinja(std::string_view jinja);
  // chatml, llama3, gemma, llama2.
  static Result<ChatTemplate> from_name(std::string_view name);
  // The model's template, or the named one when `override_name` is not empty.
  static Result<ChatTemplate> for_model(const Tokenizer& tokenizer, std::string_view override_name = {});

  ChatFormat format() const { return format_; }
  std::string_view name() const;
  // The system prompt the template inserts when the conversation has none ("" if none).
  const std::string& default_system_prompt() const { return default_system_; }

  // The prompt text; BOS is not included (the tokenizer adds it). Special tokens are written as
  // text: tokenize the result with parse_special on.
  Result<std::string> render(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

 private:
  ChatFormat format_ = ChatFormat::kChatMl;
  std::string default_system_;
};

}  // namespace escala::model
