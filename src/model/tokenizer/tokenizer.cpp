// Building a tokenizer from GGUF metadata, special-token splitting, encode and decode.
#include "escala/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "escala/gguf.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode_class.h"

namespace escala::model {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// "<0xAB>" -> 0xAB, else -1.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int v = 0;
  auto [p, ec] = std::from_chars(text.data() + 3, text.data() + 5, v, 16);
  return ec == std::errc() && p == text.data() + 5 ? v : -1;
}

Result<TokenId> read_id(const GgufFile& f, std::string_view key, TokenId fallback, size_t n_vocab) {
  if (!f.has(key)) return fallback;
  auto v = f.get_i64(key);
  if (!v.ok()) return v.status();
  if (*v < 0 || static_cast<uint64_t>(*v) >= n_vocab)
    return Status::error(fmt::format("tokenizer: {} = {} is outside the vocabulary of {} tokens", key, *v, n_vocab));
  return static_cast<TokenId>(*v);
}

Result<int> read_flag(const GgufFile& f, std::string_view key) {
  if (!f.has(key)) return -1;
  auto v = f.get_bool(key);
  if (!v.ok()) return v.status();
  return *v ? 1 : 0;
}

// Raw-text pieces and already-known special tokens, in input order.
struct Fragment {
  TokenId id;  // kNoToken: raw text
  size_t begin, end;
};

std::vector<Fragment> split_specials(const Tokenizer::Impl& v, std::string_view text, bool parse_special) {
  std::vector<Fragment> frags;
  if (!text.empty()) frags.push_back({kNoToken, 0, text.size()});  // no text: no space prefix either
  for (TokenId special : v.specials) {
    const TokenType t = v.type(special);
    if (!parse_special && t != TokenType::kUserDefined) continue;
    const std::string_view s = v.tokens[special];
    std::vector<Fragment> next;
    next.reserve(frags.size());
    for (const Fragment& f : frags) {
      if (f.id != kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t pos = f.begin;
      while (true) {
        const size_t hit = text.substr(0, f.end).find(s, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({kNoToken, pos, hit});
        next.push_back({special, hit, hit + s.size()});
        pos = hit + s.size();
      }
      if (pos < f.end) next.push_back({kNoToken, pos, f.end});
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  VocabData d;
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  d.model = std::string(*model);
  if (f.has("tokenizer.ggml.pre")) {
    auto pre = f.get_string("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    d.pre = std::string(*pre);
  }
  auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  d.tokens.assign(tokens->begin(), tokens->end());
  const size_t n = d.tokens.size();
  if (f.has("tokenizer.ggml.scores")) {
    auto scores = f.get_f32_array("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    d.scores = std::move(*scores);
  }
  if (f.has("tokenizer.ggml.token_type")) {
    auto types = f.get_int_array("tokenizer.ggml.token_type");
    if (!types.ok()) return types.status();
    d.types.reserve(types->size());
    for (int64_t t : *types) {
      if (t < 0 || t > 6)
        return Status::error(fmt::format("tokenizer: tokenizer.ggml.token_type has unknown type {}", t));
      d.types.push_back(static_cast<TokenType>(t));
    }
  }
  if (f.has("tokenizer.ggml.merges")) {
    auto merges = f.get_string_array("tokenizer.ggml.merges");
    if (!merges.ok()) return merges.status();
    d.merges.assign(merges->begin(), merges->end());
  }
  const bool spm = d.model == "llama";
  struct IdKey {
    std::string_view key;
    TokenId* id;
    TokenId fallback;
  };
  const IdKey id_keys[] = {
      {"tokenizer.ggml.bos_token_id", &d.bos, spm ? 1 : kNoToken},
      {"tokenizer.ggml.eos_token_id", &d.eos, spm ? 2 : kNoToken},
      {"tokenizer.ggml.eot_token_id", &d.eot, kNoToken},
      {"tokenizer.ggml.unknown_token_id", &d.unk, spm ? 0 : kNoToken},
  };
  for (const IdKey& k : id_keys) {
    auto id = read_id(f, k.key, k.fallback, n);
    if (!id.ok()) return id.status();
    *k.id = *id;
  }
  if (spm && n <= 2) d.bos = d.eos = d.unk = kNoToken;  // the defaults need a real vocabulary
  const std::pair<std::string_view, int*> flags[] = {
      {"tokenizer.ggml.add_bos_token", &d.add_bos},
      {"tokenizer.ggml.add_eos_token", &d.add_eos},
      {"tokenizer.ggml.add_space_prefix", &d.add_space_prefix},
  };
  for (const auto& [key, out] : flags) {
    auto v = read_flag(f, key);
    if (!v.ok()) return v.status();
    *out = *v;
  }
  if (f.has("tokenizer.chat_template")) {
    auto t = f.get_string("tokenizer.chat_template");
    if (!t.ok()) return t.status();
    d.chat_template = std::string(*t);
  }
  return from_vocab(std::move(d));
}

Result<Tokenizer> Tokenizer::from_vocab(VocabData d) {
  auto impl = std::make_shared<Impl>();
  Impl& v = *impl;
  if (d.model == "gpt2") v.kind = VocabKind::kBpe;
  else if (d.model == "llama") v.kind = VocabKind::kSpm;
  else
    return Status::error(fmt::format(
        "tokenizer: tokenizer.ggml.model = '{}' is not supported (gpt2: byte-level BPE, llama: SentencePiece BPE)",
        d.model));
  const size_t n = d.tokens.size();
  if (n == 0) return Status::error("tokenizer: tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return Status::error("tokenizer: too many tokens");
  if (!d.scores.empty() && d.scores.size() != n)
    return Status::error(fmt::format("tokenizer: {} scores for {} tokens", d.scores.size(), n));
  if (!d.types.empty() && d.types.size() != n)
    return Status::error(fmt::format("tokenizer: {} token types for {} tokens", d.types.size(), n));
  for (TokenId id : {d.bos, d.eos, d.eot, d.unk})
    if (id != kNoToken && (id < 0 || static_cast<size_t>(id) >= n))
      return Status::error(fmt::format("tokenizer: special token id {} is outside the vocabulary of {}", id, n));
  if (v.kind == VocabKind::kBpe) {
    auto pre = pre_tokenizer_from_name(d.pre);
    if (!pre.ok()) return pre.status();
    v.pre = *pre;
  }
  v.pre_name = d.pre.empty() ? "default" : d.pre;
  v.tokens = std::move(d.tokens);
  v.scores = std::move(d.scores);
  v.types = std::move(d.types);
  v.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) v.ids[v.tokens[i]] = static_cast<TokenId>(i);

  v.byte_tokens.fill(kNoToken);
  if (v.kind == VocabKind::kBpe) {
    for (int b = 0; b < 256; ++b) {
      std::string s;
      unicode::append_utf8(s, byte_to_unicode(static_cast<uint8_t>(b)));
      v.byte_tokens[b] = v.find(s);
    }
    if (d.merges.empty()) return Status::error("tokenizer: a gpt2 vocabulary needs tokenizer.ggml.merges");
    v.merges.reserve(d.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < d.merges.size(); ++rank) {
      const std::string& m = d.merges[rank];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos)
        return Status::error(fmt::format("tokenizer: merge {} ('{}') has no space", rank, m));
      const std::string_view left = std::string_view(m).substr(0, sp), right = std::string_view(m).substr(sp + 1);
      joined.assign(left);
      joined += right;
      const TokenId l = v.find(left), r = v.find(right), res = v.find(joined);
      // A merge whose parts or result are not tokens can never produce a token: skipped.
      if (l == kNoToken || r == kNoToken || res == kNoToken) continue;
      v.merges.try_emplace(pair_key(l, r), Merge{static_cast<int32_t>(rank), res});
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const int b = parse_byte_token(v.tokens[i]);
      if (b >= 0 && v.byte_tokens[b] == kNoToken) v.byte_tokens[b] = static_cast<TokenId>(i);
    }
  }

  if (!v.types.empty()) {
    for (size_t i = 0; i < n; ++i) {
      const TokenType t = v.types[i];
      if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
          !v.tokens[i].empty())
        v.specials.push_back(static_cast<TokenId>(i));
    }
    std::stable_sort(v.specials.begin(), v.specials.end(),
                     [&](TokenId a, TokenId b) { return v.tokens[a].size() > v.tokens[b].size(); });
  }
  v.bos = d.bos;
  v.eos = d.eos;
  v.eot = d.eot;
  v.unk = d.unk;
  const bool spm = v.kind == VocabKind::kSpm;
  v.add_bos = d.add_bos < 0 ? spm : d.add_bos == 1;
  v.add_eos = d.add_eos == 1;
  v.add_space_prefix = d.add_space_prefix < 0 ? spm : d.add_space_prefix == 1;
  if (v.add_bos && v.bos == kNoToken) v.add_bos = false;
  if (v.add_eos && v.eos == kNoToken) v.add_eos = false;
  v.chat_template = std::move(d.chat_template);

  for (TokenId id : {v.eos, v.eot})
    if (id != kNoToken) v.end_of_generation.push_back(id);
  for (std::string_view s : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|endoftext|>", "<|end|>"}) {
    const TokenId id = v.find(s);
    if (id != kNoToken && v.type(id) == TokenType::kControl) v.end_of_generation.push_back(id);
  }
  return Tokenizer(std::move(impl));
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& v = *impl_;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (options.add_special && v.add_bos) out.push_back(v.bos);
  const std::vector<Fragment> frags = split_specials(v, text, options.parse_special);
  bool after_special = true;  // SentencePiece prefixes a space at the start and after a special
  std::string escaped;
  for (const Fragment& f : frags) {
    if (f.id != kNoToken) {
      out.push_back(f.id);
      after_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.begin, f.end - f.begin);
    if (v.kind == VocabKind::kBpe) {
      for (std::string_view word : pre_tokenize(v.pre, raw)) ESCALA_RETURN_IF_ERROR(bpe_encode_word(v, word, out));
    } else {
      escaped.clear();
      if (v.add_space_prefix && after_special) escaped += kSpmSpace;
      for (char c : raw) {
        if (c == ' ') escaped += kSpmSpace;
        else escaped += c;
      }
      ESCALA_RETURN_IF_ERROR(spm_encode(v, escaped, out));
    }
    after_special = false;
  }
  if (options.add_special && v.add_eos) out.push_back(v.eos);
  return out;
}

std::string Tokenizer::token_to_piece(TokenId id, bool render_special) const {
  const Impl& v = *impl_;
  if (id < 0 || id >= vocab_size()) return {};
  const std::string& text = v.tokens[id];
  switch (v.type(id)) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return render_special ? text : std::string();
    case TokenType::kUserDefined:
      return text;
    case TokenType::kByte:
      if (int b = parse_byte_token(text); b >= 0) return std::string(1, static_cast<char>(b));
      return text;
    case TokenType::kUnused:
    case TokenType::kUndefined:
      return {};
    case TokenType::kNormal:
      break;
  }
  std::string out;
  out.reserve(text.size());
  if (v.kind == VocabKind::kSpm) {
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
        out += ' ';
        i += kSpmSpace.size();
      } else {
        out += text[i++];
      }
    }
    return out;
  }
  for (const unicode::CodePoint& c : unicode::decode_utf8(text)) {
    const int b = unicode_to_byte(c.cp);
    if (b >= 0) out += static_cast<char>(b);
    else out.append(text, c.offset, c.size);  // not a mapped character: kept as written
  }
  return out;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids, const DecodeOptions& options) const {
  std::string out;
  bool strip = options.strip_leading_space && impl_->kind == VocabKind::kSpm && impl_->add_space_prefix;
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size())
      return Status::error(fmt::format("tokenizer: token id {} is outside the vocabulary of {}", id, vocab_size()));
    std::string piece = token_to_piece(id, options.render_special);
    if (strip && !piece.empty()) {
      if (piece[0] == ' ') piece.erase(0, 1);
      strip = false;
    }
    out += piece;
  }
  return out;
}

VocabKind Tokenizer::kind() const { return impl_->kind; }
std::string_view Tokenizer::pre_tokenizer() const { return impl_->pre_name; }
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }
std::string_view Tokenizer::token_text(TokenId id) const {
  return id >= 0 && id < vocab_size() ? std::string_view(impl_->tokens[id]) : std::string_view();
}
TokenType Tokenizer::token_type(TokenId id) const {
  return id >= 0 && id < vocab_size() ? impl_->type(id) : TokenType::kUndefined;
}
TokenId Tokenizer::find_token(std::string_view text) const { return impl_->find(text); }
TokenId Tokenizer::bos() const { return impl_->bos; }
TokenId Tokenizer::eos() const { return impl_->eos; }
TokenId Tokenizer::eot() const { return impl_->eot; }
TokenId Tokenizer::unk() const { return impl_->unk; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
bool Tokenizer::add_eos() const { return impl_->add_eos; }
bool Tokenizer::add_space_prefix() const { return impl_->add_space_prefix; }
bool Tokenizer::is_end_of_generation(TokenId id) const {
  const auto& e = impl_->end_of_generation;
  return id != kNoToken && std::find(e.begin(), e.end(), id) != e.end();
}
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

// ---- Streaming ------------------------------------------------------------------------------

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(tokenizer), options_(options) {}

Result<std::string> StreamDecoder::push(TokenId id) {
  if (id < 0 || id >= tokenizer_.vocab_size())
    return Status::error(fmt::format("tokenizer: token id {} is outside the vocabulary of {}", id,
                                     tokenizer_.vocab_size()));
  std::string piece = tokenizer_.token_to_piece(id, options_.render_special);
  if (at_start_ && !piece.empty()) {
    if (options_.strip_leading_space && tokenizer_.kind() == VocabKind::kSpm && tokenizer_.add_space_prefix() &&
        piece[0] == ' ')
      piece.erase(0, 1);
    at_start_ = false;
  }
  pending_ += piece;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int len = unicode::utf8_sequence_length(std::string_view(pending_).substr(i));
    if (len == 0) break;  // an incomplete character at the end: wait for more bytes
    if (len < 0) {
      out += "\xEF\xBF\xBD";
      i += 1;
    } else {
      out.append(pending_, i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  if (!pending_.empty()) out = "\xEF\xBF\xBD";  // an unfinished character
  pending_.clear();
  return out;
}

void StreamDecoder::reset() {
  pending_.clear();
  at_start_ = true;
}

}  // namespace escala::model
