// Tokenizer tests: pre-tokenizer rules, both BPE kinds on small hand-made vocabularies (built
// through the GGUF writer too), special tokens, byte fallback, streaming decode, chat templates,
// and known ids on the real SmolLM2 vocabulary when the model file is present.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "escala/tokenizer.h"
#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode_class.h"
#include "tokenizer_vocabs.h"

namespace escala::model {
namespace {

using Words = std::vector<std::string>;

Words split(PreTokenizerKind kind, std::string_view text) {
  Words out;
  for (std::string_view w : pre_tokenize(kind, text)) out.emplace_back(w);
  return out;
}

Tokenizer make(VocabData d) {
  auto t = Tokenizer::from_vocab(std::move(d));
  EXPECT_TRUE(t.ok()) << t.message();
  return *t;
}

Words texts(const Tokenizer& t, const std::vector<TokenId>& ids) {
  Words out;
  for (TokenId id : ids) out.push_back(t.token_to_piece(id, true));
  return out;
}

std::vector<TokenId> enc(const Tokenizer& t, std::string_view s, EncodeOptions o = {}) {
  auto r = t.encode(s, o);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : std::vector<TokenId>{};
}

// ---- Pre-tokenizers ------------------------------------------------------------------------

TEST(PreTokenizer, Gpt2Rules) {
  EXPECT_EQ(split(PreTokenizerKind::kGpt2, "Hello world's 123  foo\n\nbar"),
            (Words{"Hello", " world", "'s", " 123", " ", " foo", "\n", "\n", "bar"}));
  EXPECT_EQ(split(PreTokenizerKind::kGpt2, "I'M ok!? you'll"), (Words{"I", "'", "M", " ok", "!?", " you", "'ll"}));
  EXPECT_EQ(split(PreTokenizerKind::kGpt2, "x   "), (Words{"x", "   "}));
  EXPECT_EQ(split(PreTokenizerKind::kGpt2, "Grüße, Мир 東京"), (Words{"Grüße", ",", " Мир", " 東京"}));
  EXPECT_TRUE(split(PreTokenizerKind::kGpt2, "").empty());
}

TEST(PreTokenizer, Llama3Rules) {
  EXPECT_EQ(split(PreTokenizerKind::kLlama3, "Hello world 12345 (test)\n\n  x"),
            (Words{"Hello", " world", " ", "123", "45", " (", "test", ")\n\n", " ", " x"}));
  EXPECT_EQ(split(PreTokenizerKind::kLlama3, "I'M\tgo  \n\n end"), (Words{"I", "'M", "\tgo", "  \n\n", " end"}));
  EXPECT_EQ(split(PreTokenizerKind::kQwen2, "abc 2024"), (Words{"abc", " ", "2", "0", "2", "4"}));
}

TEST(PreTokenizer, DigitsThenGpt2AndDefault) {
  // Digits are cut first, so the space before them stays a word of its own.
  EXPECT_EQ(split(PreTokenizerKind::kDigitsGpt2, "abc 2024  x"), (Words{"abc", " ", "2", "0", "2", "4", " ", " x"}));
  EXPECT_EQ(split(PreTokenizerKind::kDefault, "a+b=12345"), (Words{"a", "+", "b", "=", "123", "45"}));
  EXPECT_EQ(split(PreTokenizerKind::kDefault, "x~~y``"), (Words{"x", "~~", "y", "``"}));
}

TEST(PreTokenizer, NamesAndUnknown) {
  EXPECT_EQ(*pre_tokenizer_from_name("smollm"), PreTokenizerKind::kDigitsGpt2);
  EXPECT_EQ(*pre_tokenizer_from_name("llama-bpe"), PreTokenizerKind::kLlama3);
  EXPECT_EQ(*pre_tokenizer_from_name(""), PreTokenizerKind::kDefault);
  auto bad = pre_tokenizer_from_name("nonesuch");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("nonesuch"), std::string::npos);
}

TEST(Unicode, Classes) {
  EXPECT_TRUE(unicode::is_letter(U'é'));
  EXPECT_TRUE(unicode::is_letter(U'東'));
  EXPECT_TRUE(unicode::is_number(U'٣'));  // Arabic-Indic digit
  EXPECT_TRUE(unicode::is_number(U'½'));
  EXPECT_TRUE(unicode::is_punct(U'¿'));
  EXPECT_FALSE(unicode::is_letter(U'😀'));
  EXPECT_TRUE(unicode::is_space(0x3000));
  EXPECT_FALSE(unicode::is_space(0x200B));  // zero-width space is not White_Space
  EXPECT_EQ(unicode::utf8_sequence_length("\xE2\x82"), 0);
  EXPECT_EQ(unicode::utf8_sequence_length("\xC0\x80"), -1);  // overlong
  EXPECT_EQ(unicode::utf8_sequence_length("\xED\xA0\x80"), -1);  // surrogate
}

// ---- Byte-level BPE ------------------------------------------------------------------------

TEST(BpeTokenizer, MergesByRank) {
  Tokenizer t = make(bpe_vocab("gpt2", kHelloMerges));
  EXPECT_EQ(texts(t, enc(t, "hello world")), (Words{"hello", " world"}));
  EXPECT_EQ(texts(t, enc(t, "hello  123")), (Words{"hello", " ", " ", "12", "3"}));
  // The lower rank wins: "a b" before "b c" gives ab|c; the other order a|bc.
  Tokenizer ab = make(bpe_vocab("gpt2", {"a|b", "b|c"}));
  EXPECT_EQ(texts(ab, enc(ab, "abc")), (Words{"ab", "c"}));
  Tokenizer bc = make(bpe_vocab("gpt2", {"b|c", "a|b"}));
  EXPECT_EQ(texts(bc, enc(bc, "abc")), (Words{"a", "bc"}));
}

TEST(BpeTokenizer, Llama3TakesWholeWordTokens) {
  // "abc" is a token but no merge reaches it: Llama 3 still uses it, GPT-2 does not.
  Tokenizer l3 = make(bpe_vocab("llama-bpe", {"a|b"}, {"abc"}));
  EXPECT_EQ(texts(l3, enc(l3, "abc")), (Words{"abc"}));
  Tokenizer g2 = make(bpe_vocab("gpt2", {"a|b"}, {"abc"}));
  EXPECT_EQ(texts(g2, enc(g2, "abc")), (Words{"ab", "c"}));
}

TEST(BpeTokenizer, SpecialTokensAndBos) {
  VocabData d = bpe_vocab("gpt2", kHelloMerges);
  d.add_bos = 1;
  Tokenizer t = make(d);
  const TokenId im_start = t.find_token("<|im_start|>"), im_end = t.find_token("<|im_end|>");
  const TokenId tool = t.find_token("<tool>");
  auto ids = enc(t, "<|im_start|>hello<|im_end|><tool>", {.add_special = false, .parse_special = true});
  EXPECT_EQ(ids, (std::vector<TokenId>{im_start, t.find_token("hello"), im_end, tool}));
  // Without parse_special the control tokens are plain text; user-defined ones still match.
  ids = enc(t, "<|im_start|><tool>", {.add_special = true, .parse_special = false});
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), t.bos());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 0);
  EXPECT_EQ(ids.back(), tool);
  EXPECT_EQ(*t.decode(ids), "<|im_start|><tool>");  // BOS (control) prints as nothing
  EXPECT_TRUE(t.is_end_of_generation(im_end));
  EXPECT_FALSE(t.is_end_of_generation(tool));
}

std::string random_unicode(std::mt19937& rng, bool spm_safe) {
  static const std::vector<char32_t> kPool = {
      U'a', U'b', U'z', U'A', U'Q', U'0', U'7', U'9', U' ', U' ', U' ', U'\n', U'\t', U'\r', U'\'', U's', U'!', U'.',
      U'(', U'$', U'_', U'é', U'ß', U'Ω', U'ж', U'Я', U'ש', U'ع', U'٣', U'अ', U'ก', U'東', U'京', U'한', U'ー',
      U'½', U'€', U'\u00A0', U'\u3000', U'\u0301', U'\u200D', U'😀', U'👍', U'🏽', U'𝔘', U'\u2581'};
  std::uniform_int_distribution<size_t> len(0, 40), pick(0, kPool.size() - 1);
  std::string s;
  for (size_t n = len(rng), i = 0; i < n; ++i) {
    char32_t c = kPool[pick(rng)];
    if (spm_safe && c == U'\u2581') c = U'x';  // SentencePiece decodes U+2581 as a space
    unicode::append_utf8(s, c);
  }
  return s;
}

TEST(BpeTokenizer, RoundTripRandomUnicodeAndBytes) {
  std::mt19937 rng(1234);
  for (const char* pre : {"gpt2", "llama3", "qwen2", "smollm", "default"}) {
    Tokenizer t = make(bpe_vocab(pre, kHelloMerges));
    for (int iter = 0; iter < 300; ++iter) {
      std::string s = random_unicode(rng, false);
      if (iter % 10 == 0) s += std::string("\xFF\xC3", 2);  // invalid UTF-8 survives too
      auto words = pre_tokenize(t.kind() == VocabKind::kBpe ? *pre_tokenizer_from_name(pre) : PreTokenizerKind::kGpt2, s);
      std::string joined;
      for (auto w : words) joined += w;
      ASSERT_EQ(joined, s) << pre;
      auto ids = enc(t, s, {.add_special = false});
      ASSERT_EQ(*t.decode(ids), s) << pre << " iteration " << iter;
    }
  }
}

// A byte with no token (SmolLM2 has none for 0x04, 0xF5-0xFF and a few more) is left out of the ids
// and blocks the merges across it, as in llama.cpp; it does not fail the whole text.
TEST(BpeTokenizer, BytesWithoutTokensAreLeftOut) {
  VocabData d = bpe_vocab("gpt2", {"!|!"});
  d.tokens[4] = "<unused>";  // no token for byte 0x04 now
  Tokenizer t = make(d);
  const TokenId bang = t.find_token("!"), bangs = t.find_token("!!");
  ASSERT_NE(bangs, kNoToken);
  EXPECT_EQ(enc(t, "!!", {.add_special = false}), (std::vector<TokenId>{bangs}));
  EXPECT_EQ(enc(t, "!\x04!", {.add_special = false}), (std::vector<TokenId>{bang, bang}));
  EXPECT_EQ(*t.decode(enc(t, "a\x04" "b\x04", {.add_special = false})), "ab");
}

// ---- SentencePiece BPE ---------------------------------------------------------------------

TEST(SpmTokenizer, ScoresPrefixAndByteFallback) {
  Tokenizer t = make(spm_vocab());
  EXPECT_TRUE(t.add_bos());
  auto ids = enc(t, "hello world");
  EXPECT_EQ(texts(t, ids), (Words{"<s>", " hello", " world"}));
  EXPECT_EQ(*t.decode(ids), "hello world");
  ids = enc(t, "h€", {.add_special = false});
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(t.token_text(ids[0]), "▁h");
  EXPECT_EQ(t.token_text(ids[1]), "<0xE2>");
  EXPECT_EQ(t.token_text(ids[3]), "<0xAC>");
  EXPECT_EQ(*t.decode(ids), "h€");
  // Empty text is nothing but BOS (no space prefix).
  EXPECT_EQ(enc(t, ""), (std::vector<TokenId>{1}));
  EXPECT_TRUE(enc(t, "", {.add_special = false}).empty());
  // A space is prefixed after each special token too.
  ids = enc(t, "<s>hello<tool>", {.add_special = false, .parse_special = true});
  EXPECT_EQ(texts(t, ids), (Words{"<s>", " hello", "<tool>"}));
}

TEST(SpmTokenizer, UnknownWithoutByteTokens) {
  VocabData d;
  d.model = "llama";
  d.tokens = {"<unk>", "<s>", "</s>", "▁", "a"};
  d.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl, TokenType::kNormal, TokenType::kNormal};
  d.unk = 0;
  Tokenizer t = make(d);
  EXPECT_EQ(enc(t, "aé", {.add_special = false}), (std::vector<TokenId>{3, 4, 0}));
}

TEST(SpmTokenizer, RoundTripRandomUnicode) {
  Tokenizer t = make(spm_vocab());
  std::mt19937 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    std::string s = random_unicode(rng, true);
    if (iter % 10 == 0) s += std::string("\xC3(\xFF", 3);  // bad bytes fall back to byte tokens
    auto ids = enc(t, s);
    ASSERT_EQ(*t.decode(ids), s) << "iteration " << iter;
  }
}

// ---- Streaming decode ----------------------------------------------------------------------

TEST(StreamDecoder, EmitsOnlyCompleteCharacters) {
  Tokenizer t = make(spm_vocab());
  StreamDecoder dec(t, {.render_special = false, .strip_leading_space = true});
  auto ids = enc(t, "h€😀", {.add_special = false});
  std::string all;
  for (TokenId id : ids) {
    auto piece = dec.push(id);
    ASSERT_TRUE(piece.ok());
    EXPECT_GE(unicode::utf8_sequence_length(*piece), piece->empty() ? 0 : 1);
    for (auto c : unicode::decode_utf8(*piece)) EXPECT_NE(c.cp, unicode::kInvalid);
    all += *piece;
  }
  all += dec.flush();
  EXPECT_EQ(all, "h€😀");
  // Three byte tokens of one character: nothing, nothing, then the character.
  // Streaming keeps the space of a first SentencePiece piece (it continues the prompt);
  // decode() of a whole sequence drops it.
  StreamDecoder cont(t);
  EXPECT_EQ(*cont.push(t.find_token("▁hello")), " hello");
  const TokenId hello[] = {t.find_token("▁hello")};
  EXPECT_EQ(*t.decode(hello), "hello");
  const TokenId e2 = t.find_token("<0xE2>"), x82 = t.find_token("<0x82>"), xac = t.find_token("<0xAC>");
  dec.reset();
  EXPECT_EQ(*dec.push(e2), "");
  EXPECT_EQ(*dec.push(x82), "");
  EXPECT_EQ(*dec.push(xac), "€");
  EXPECT_EQ(*dec.push(t.find_token("<0xFF>")), "\xEF\xBF\xBD");  // never valid
  EXPECT_EQ(*dec.push(e2), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");  // unfinished at the end
  EXPECT_FALSE(dec.push(100000).ok());
}

// ---- Through a GGUF file -------------------------------------------------------------------

std::vector<uint8_t> write_vocab(const VocabData& d, std::string_view model_override = {}) {
  GgufWriter w;
  w.set("general.architecture", GgufWriteValue::string("llama"));
  w.set("tokenizer.ggml.model", GgufWriteValue::string(model_override.empty() ? d.model : std::string(model_override)));
  if (!d.pre.empty()) w.set("tokenizer.ggml.pre", GgufWriteValue::string(d.pre));
  w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(d.tokens));
  std::vector<int32_t> types;
  for (TokenType ty : d.types) types.push_back(static_cast<int32_t>(ty));
  w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(types));
  if (!d.scores.empty()) w.set("tokenizer.ggml.scores", GgufWriteValue::f32_array(d.scores));
  if (!d.merges.empty()) w.set("tokenizer.ggml.merges", GgufWriteValue::string_array(d.merges));
  if (d.bos != kNoToken) w.set("tokenizer.ggml.bos_token_id", GgufWriteValue::u32(static_cast<uint32_t>(d.bos)));
  w.set("tokenizer.ggml.add_bos_token", GgufWriteValue::boolean(d.add_bos == 1));
  w.set("tokenizer.chat_template", GgufWriteValue::string("{{ '<|im_start|>' }}"));
  auto bytes = w.to_bytes();
  EXPECT_TRUE(bytes.ok()) << bytes.message();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

TEST(TokenizerGguf, LoadsFromWrittenFile) {
  VocabData d = bpe_vocab("smollm", kHelloMerges);
  d.add_bos = 1;
  const std::vector<uint8_t> bytes = write_vocab(d);
  auto file = GgufFile::parse(bytes);
  ASSERT_TRUE(file.ok()) << file.message();
  auto t = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->pre_tokenizer(), "smollm");
  EXPECT_EQ(texts(*t, enc(*t, "hello world 12")), (Words{"<|endoftext|>", "hello", " world", " ", "1", "2"}));
  auto chat = ChatTemplate::for_model(*t);
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(chat->format(), ChatFormat::kChatMl);

  const std::vector<uint8_t> spm = write_vocab(spm_vocab());
  auto sf = GgufFile::parse(spm);
  ASSERT_TRUE(sf.ok()) << sf.message();
  auto st = Tokenizer::from_gguf(*sf);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(texts(*st, enc(*st, "hello", {.add_special = false})), (Words{" hello"}));
}

TEST(TokenizerGguf, ErrorsNameTheProblem) {
  const std::vector<uint8_t> bert = write_vocab(bpe_vocab("gpt2", kHelloMerges), "bert");
  auto f = GgufFile::parse(bert);
  ASSERT_TRUE(f.ok());
  auto t = Tokenizer::from_gguf(*f);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("bert"), std::string::npos);

  VocabData d = bpe_vocab("gpt2", kHelloMerges);
  d.bos = 1 << 20;
  auto bad_bos = Tokenizer::from_vocab(d);
  ASSERT_FALSE(bad_bos.ok());
  d = bpe_vocab("gpt2", {});
  auto no_merges = Tokenizer::from_vocab(d);
  ASSERT_FALSE(no_merges.ok());
  EXPECT_NE(no_merges.message().find("merges"), std::string::npos);
  d = bpe_vocab("mystery", kHelloMerges);
  EXPECT_FALSE(Tokenizer::from_vocab(d).ok());
  Tokenizer ok = make(bpe_vocab("gpt2", kHelloMerges));
  const TokenId out_of_range[] = {ok.vocab_size()};
  EXPECT_FALSE(ok.decode(out_of_range).ok());
}


// ---- Chat templates ------------------------------------------------------------------------

// SmolLM2-135M-Instruct's tokenizer.chat_template as its GGUF stores it.
constexpr std::string_view kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' "
    "}}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplate, ChatMlWithDefaultSystem) {
  auto t = ChatTemplate::from_jinja(kSmolTemplate);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->name(), "chatml");
  EXPECT_EQ(t->default_system_prompt(), "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const std::vector<ChatMessage> msgs = {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  EXPECT_EQ(*t->render(msgs, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> with_system = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(*t->render(with_system, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // The same template with escaped newlines (as JSON-sourced templates often are).
  std::string escaped(kSmolTemplate);
  for (size_t p = 0; (p = escaped.find('\n', p)) != std::string::npos;) escaped.replace(p, 1, "\\n");
  EXPECT_EQ(ChatTemplate::from_jinja(escaped)->default_system_prompt(), t->default_system_prompt());
  // Qwen 2.5 style: the default sits in an else branch after a branch built from the message.
  auto qwen = ChatTemplate::from_jinja(
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
      "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}");
  EXPECT_EQ(qwen->default_system_prompt(), "You are Qwen.");
  // A plain ChatML template has no default system prompt.
  auto plain = ChatTemplate::from_jinja("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + "
                                        "'<|im_end|>\n'}}{% endfor %}");
  EXPECT_EQ(plain->default_system_prompt(), "");
}

TEST(ChatTemplate, OtherFamilies) {
  const std::vector<ChatMessage> msgs = {{"system", "Sys"}, {"user", " Hi "}, {"assistant", "Yo"}, {"user", "Q"}};
  auto l3 = ChatTemplate::from_jinja("{{ bos_token }}{% for m in messages %}<|start_header_id|>...{% endfor %}");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(*l3->render(msgs, true),
            "<|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nYo<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  auto gemma = ChatTemplate::from_jinja("{{ bos_token }}{{ '<start_of_turn>' + role + '\n' }}");
  ASSERT_TRUE(gemma.ok());
  EXPECT_EQ(*gemma->render(msgs, true),
            "<start_of_turn>user\nSys\n\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"
            "<start_of_turn>user\nQ<end_of_turn>\n<start_of_turn>model\n");
  auto l2 = ChatTemplate::from_jinja("{{ bos_token + '[INST] ' + content + ' [/INST]' }} <<SYS>>");
  ASSERT_TRUE(l2.ok());
  EXPECT_EQ(*l2->render(msgs, true),
            "[INST] <<SYS>>\nSys\n<</SYS>>\n\nHi [/INST] Yo </s><s>[INST] Q [/INST]");
  const std::vector<ChatMessage> late_system = {{"user", "a"}, {"system", "b"}};
  EXPECT_FALSE(gemma->render(late_system, true).ok());
}

TEST(ChatTemplate, UnknownTemplateNamesTheOverride) {
  auto t = ChatTemplate::from_jinja("{{ messages | tojson }}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("--chat-template"), std::string::npos);
  EXPECT_NE(t.message().find("llama3"), std::string::npos);
  EXPECT_TRUE(ChatTemplate::from_jinja("").ok());  // no template: ChatML, as llama.cpp does
  EXPECT_EQ(ChatTemplate::from_name("gemma")->format(), ChatFormat::kGemma);
  EXPECT_FALSE(ChatTemplate::from_name("vicuna").ok());
  Tokenizer tok = make(bpe_vocab("gpt2", kHelloMerges));
  EXPECT_EQ(ChatTemplate::for_model(tok, "llama2")->format(), ChatFormat::kLlama2);
}

// ---- The real SmolLM2 vocabulary -----------------------------------------------------------

std::string smollm_path() {
  return (std::filesystem::path(__FILE__).parent_path() / ".." / ".." / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
      .lexically_normal()
      .string();
}

TEST(SmolLm2Tokenizer, KnownIdsFromLlamaCpp) {
  const std::string path = smollm_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok()) << file.message();
  auto t = Tokenizer::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->kind(), VocabKind::kBpe);
  EXPECT_EQ(t->pre_tokenizer(), "smollm");
  EXPECT_FALSE(t->add_bos());
  // Expected ids: llama.cpp (llama-cpp-python 0.3.x, Llama(vocab_only=True).tokenize(text,
  // add_bos=False, special=...)) on the same file.
  struct Case {
    std::string_view text;
    bool special;
    std::vector<TokenId> ids;
  };
  const std::vector<Case> cases = {
      {"Hello, world! I'm 2024 years old.", false, {19556, 28, 905, 17, 339, 5248, 216, 34, 32, 34, 36, 929, 1573, 30}},
      {"  leading spaces\n\n\ttabs and 12345 digits", false,
       {216, 2899, 5600, 1116, 197, 100, 7366, 284, 216, 33, 34, 35, 36, 37, 18638}},
      {"Привет мир! 你好，世界 😀👍🏽", false,
       {155, 249, 46879, 16464, 32547, 41337, 7872, 9175, 17, 216, 18645, 250, 48392, 138,
        12831, 7906, 240, 178, 239, 230, 40303, 218, 10813, 235, 231, 10813, 233, 138}},
      {"def f(x):\n    return x**2  # square", false, {1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5222}},
      {"<|im_start|>user\nHi there<|im_end|>\n", true, {1, 4093, 198, 26843, 665, 2, 198}},
      {"<|im_start|>user\nHi there<|im_end|>\n", false,
       {44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 665, 44, 108, 306, 79, 486, 108, 46, 198}},
  };
  for (const Case& c : cases) {
    auto ids = t->encode(c.text, {.add_special = false, .parse_special = c.special});
    ASSERT_TRUE(ids.ok()) << ids.message();
    EXPECT_EQ(*ids, c.ids) << c.text;
    EXPECT_EQ(*t->decode(*ids, {.render_special = true}), c.text);
  }
  // Bytes SmolLM2 has no token for (0x04, 0x1D, U+40000's lead byte 0xF1) are left out, with the
  // ids llama.cpp gives (llama-cpp-python 0.3.36); the continuation bytes left behind do have tokens.
  const Case dropped[] = {
      {"control\x04" "chars\x1d in!\x04!text", false, {11656, 33879, 281, 17, 17, 2692}},
      {"plane four \xf1\x80\x80\x80 and \x7f del", false, {12758, 1876, 216, 218, 218, 218, 284, 216, 217, 1347}},
  };
  for (const Case& c : dropped) {
    auto ids = t->encode(c.text, {.add_special = false});
    ASSERT_TRUE(ids.ok()) << ids.message();
    EXPECT_EQ(*ids, c.ids) << c.text;
    std::string kept;
    for (char ch : c.text)
      if (ch != '\x04' && ch != '\x1d' && ch != '\xf1') kept += ch;
    EXPECT_EQ(*t->decode(*ids), kept);
  }
  // Random text through the real vocabulary and back, whole and streamed token by token.
  std::mt19937 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    const std::string text = random_unicode(rng, false);
    auto ids = t->encode(text, {.add_special = false});
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*t->decode(*ids), text);
    StreamDecoder stream(*t);
    std::string streamed;
    for (TokenId id : *ids) streamed += *stream.push(id);
    streamed += stream.flush();
    EXPECT_EQ(streamed, text);
  }
  auto chat = ChatTemplate::for_model(*t);
  ASSERT_TRUE(chat.ok()) << chat.message();
  EXPECT_EQ(chat->format(), ChatFormat::kChatMl);
  EXPECT_TRUE(t->is_end_of_generation(t->find_token("<|im_end|>")));
}


// ---- escala tokenize -----------------------------------------------------------------------

#ifdef ESCALA_CLI_PATH
struct CliRun {
  int rc;
  std::string out, err;
};

CliRun run_cli(const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("escala_tok_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string cmd = std::string("timeout 60 '") + ESCALA_CLI_PATH + "' " + args + " >'" +
                          (dir / "out").string() + "' 2>'" + (dir / "err").string() + "'";
  const int status = std::system(cmd.c_str());
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  CliRun r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out"), slurp(dir / "err")};
  fs::remove_all(dir);
  return r;
}

TEST(TokenizeCommand, PrintsIdsAndReportsErrors) {
  namespace fs = std::filesystem;
  const fs::path model = fs::temp_directory_path() / ("escala_tok_vocab_" + std::to_string(::getpid()) + ".gguf");
  VocabData d = bpe_vocab("smollm", kHelloMerges);
  d.add_bos = 1;
  {
    const std::vector<uint8_t> bytes = write_vocab(d);
    std::ofstream(model, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                 static_cast<std::streamsize>(bytes.size()));
  }
  Tokenizer t = make(d);
  const std::string expect = fmt::format("{} {} {}\n", t.bos(), t.find_token("hello"), t.find_token(mapped(" world")));
  CliRun r = run_cli("tokenize --model '" + model.string() + "' --prompt 'hello world'");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, expect);
  r = run_cli("tokenize --model '" + model.string() + "' --no-bos --special --prompt '<|im_start|>hello'");
  EXPECT_EQ(r.out, fmt::format("{} {}\n", t.find_token("<|im_start|>"), t.find_token("hello")));
  r = run_cli("tokenize --model '" + model.string() + "' --no-bos --pieces --prompt 'hello'");
  EXPECT_NE(r.out.find("'hello'"), std::string::npos) << r.out;
  r = run_cli("tokenize --model /nonexistent/model.gguf --prompt hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err.rfind("escala: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = run_cli("tokenize --model '" + model.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--prompt"), std::string::npos) << r.err;
  fs::remove(model);
}
#endif

}  // namespace
}  // namespace escala::model
