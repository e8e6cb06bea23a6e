// libFuzzer target for the tokenizers and chat templates: any bytes must encode without error and
// decode back to themselves, less the bytes a byte-level vocabulary has no token for (byte-level
// BPE under every pre-tokenizer, SentencePiece with byte fallback, and the default model's
// vocabulary when present); the pre-tokenizers must cover every byte in order; the streaming
// decoder must emit, token by token, exactly what a whole decode does; and chat templates must
// recognise or refuse any text, and render any conversation or refuse it, in one line.
//
// Build and run (clang): see tests/fuzz/CMakeLists.txt.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_vocab.h"
#include "model/tokenizer/pretokenizer.h"

namespace {

using namespace escala;
using namespace escala::fuzz;

[[noreturn]] void fail(const char* what, std::string_view vocab, const std::string& detail = {}) {
  std::fprintf(stderr, "tokenizer fuzz: %s (%.*s vocabulary) %s\n", what, int(vocab.size()), vocab.data(),
               detail.c_str());
  std::abort();
}

struct Vocab {
  std::string name;
  Tokenizer tokenizer;
  std::array<bool, 256> has_byte{};    // byte-level BPE: whether the byte has a token
  std::vector<std::string> user_defined;  // texts of the USER_DEFINED tokens (always recognised)
};

struct Vocabs {
  std::vector<Vocab> all;
  Vocabs() {
    for (const char* pre : {"default", "gpt2", "llama3", "qwen2", "smollm"})
      add(std::string("bpe/") + pre, must(Tokenizer::from_vocab(model::bpe_vocab(pre, fuzz_merges()))));
    add("spm", must(Tokenizer::from_vocab(model::spm_vocab())));
    if (const Tokenizer* t = model_tokenizer()) add("default model", *t);
  }
  void add(std::string name, Tokenizer t) {
    Vocab v{std::move(name), std::move(t)};
    for (int b = 0; b < 256; ++b)
      v.has_byte[b] = v.tokenizer.find_token(model::mapped(std::string(1, static_cast<char>(b)))) != model::kNoToken;
    for (TokenId id = 0; id < v.tokenizer.vocab_size(); ++id)
      if (v.tokenizer.token_type(id) == model::TokenType::kUserDefined)
        v.user_defined.emplace_back(v.tokenizer.token_text(id));
    all.push_back(std::move(v));
  }
};

void check(const Vocab& v, std::string_view text) {
  const std::string& name = v.name;
  const Tokenizer& t = v.tokenizer;
  const bool spm = t.kind() == model::VocabKind::kSpm;
  // SentencePiece writes spaces as U+2581, so a U+2581 in the text decodes as a space; and it puts
  // a space before the text after a special token (USER_DEFINED ones are found without
  // parse_special), as llama.cpp does.
  bool round_trips = !spm || text.find("\xE2\x96\x81") == std::string_view::npos;
  for (const std::string& u : v.user_defined)
    if (spm && text.find(u) != std::string_view::npos) round_trips = false;
  // Byte-level BPE leaves out the bytes its vocabulary has no token for.
  std::string expected;
  for (char c : text)
    if (spm || v.has_byte[static_cast<uint8_t>(c)]) expected += c;

  auto ids = t.encode(text, {.add_special = false, .parse_special = false});
  if (!ids.ok()) fail("encode failed", name, ids.message());
  for (TokenId id : *ids)
    if (id < 0 || id >= t.vocab_size()) fail("token id out of range", name);
  auto back = t.decode(*ids);
  if (!back.ok()) fail("decode of encoded ids failed", name);
  if (round_trips && *back != expected) fail("decode(encode(text)) != text", name);

  // Streamed token by token (nothing stripped) = one decode (nothing stripped), when that decode is
  // valid UTF-8: the stream turns invalid bytes into U+FFFD.
  auto whole = t.decode(*ids, {.render_special = false, .strip_leading_space = false});
  if (!whole.ok()) fail("decode without strip failed", name);
  if (valid_utf8(*whole)) {
    model::StreamDecoder stream(t);
    std::string streamed;
    for (TokenId id : *ids) {
      auto piece = stream.push(id);
      if (!piece.ok()) fail("stream push failed", name);
      streamed += *piece;
    }
    streamed += stream.flush();
    if (streamed != *whole) fail("streamed text != decoded text", name);
  }

  // Special tokens written in the text: any input still encodes, ids stay in range, and
  // byte-level BPE renders them back as written.
  auto special = t.encode(text, {.add_special = true, .parse_special = true});
  if (!special.ok()) fail("encode with special tokens failed", name, special.message());
  for (TokenId id : *special)
    if (id < 0 || id >= t.vocab_size()) fail("token id out of range (special)", name);
  auto rendered = t.decode(*special, {.render_special = true, .strip_leading_space = true});
  if (!rendered.ok()) fail("decode with special tokens failed", name);
  if (!spm && !t.add_bos() && !t.add_eos() && *rendered != expected) fail("special tokens do not render back", name);
}

// Chat templates: any Jinja text is recognised or refused in one line, and every family renders a
// conversation cut from the input (roles from its bytes) or refuses it in one line.
void check_chat_templates(std::string_view text) {
  auto one_line = [](const std::string& m) { return !m.empty() && m.find('\n') == std::string::npos; };
  auto jinja = model::ChatTemplate::from_jinja(text);
  if (!jinja.ok() && !one_line(jinja.message())) fail("template error is not one line", "chat");
  std::vector<model::ChatMessage> messages;
  for (size_t at = 0; at < text.size() && messages.size() < 6;) {
    const size_t n = std::min(text.size() - at, size_t(1 + static_cast<uint8_t>(text[at]) % 24));
    static const char* kRoles[] = {"system", "user", "assistant", "user"};
    messages.push_back({kRoles[static_cast<uint8_t>(text[at]) % 4], std::string(text.substr(at, n))});
    at += n;
  }
  for (const char* name : {"chatml", "llama3", "gemma", "llama2"}) {
    auto t = model::ChatTemplate::from_name(name);
    if (!t.ok()) fail("a named template does not exist", name);
    auto r = t->render(messages, true);
    if (!r.ok() && !one_line(r.message())) fail("render error is not one line", name);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Vocabs vocabs;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (auto kind : {model::PreTokenizerKind::kDefault, model::PreTokenizerKind::kGpt2, model::PreTokenizerKind::kLlama3,
                    model::PreTokenizerKind::kQwen2, model::PreTokenizerKind::kDigitsGpt2}) {
    std::string joined;
    for (std::string_view w : model::pre_tokenize(kind, text)) {
      if (w.data() != text.data() + joined.size()) fail("pre-tokenizer words out of order", model::pre_tokenizer_name(kind));
      joined += w;
    }
    if (joined != text) fail("pre-tokenizer words do not cover the text", model::pre_tokenizer_name(kind));
  }
  for (const Vocab& v : vocabs.all) check(v, text);
  check_chat_templates(text);
  return 0;
}
