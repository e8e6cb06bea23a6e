// Merging: byte-level BPE by merge rank and SentencePiece BPE by score. Both keep the symbols in
// a linked list and the candidate pairs in a heap; a popped pair whose symbols changed since it
// was pushed is stale and skipped.
#include <fmt/format.h>

#include <queue>

#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode_class.h"

namespace escala::model {

uint32_t byte_to_unicode(uint8_t b) {
  // Printable Latin-1 bytes stand for themselves; the others are moved to 256 and up, in order.
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
  uint32_t n = 0;
  for (uint32_t x = 0; x < b; ++x)
    if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
  return 256 + n;
}

int unicode_to_byte(uint32_t cp) {
  static const std::array<int, 324> kTable = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_unicode(static_cast<uint8_t>(b))] = b;
    return t;
  }();
  return cp < kTable.size() ? kTable[cp] : -1;
}

namespace {

struct Symbol {
  TokenId id;     // BPE: current token; SPM: unused
  uint32_t offset, size;  // bytes of the input
  int32_t prev, next;     // -1 at the ends
};

struct BpePair {
  int32_t rank;
  int32_t left, right;
  TokenId left_id, right_id;
  bool operator>(const BpePair& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

struct SpmPair {
  float score;
  int32_t left, right;
  uint32_t size;
  // Highest score first, then the leftmost.
  bool operator<(const SpmPair& o) const {
    return score != o.score ? score < o.score : left > o.left;
  }
};

}  // namespace

Status bpe_encode_word(const Tokenizer::Impl& v, std::string_view word, std::vector<TokenId>& out) {
  if (word.empty()) return {};
  if (pre_tokenizer_ignores_merges(v.pre)) {
    std::string mapped;
    for (char c : word) unicode::append_utf8(mapped, byte_to_unicode(static_cast<uint8_t>(c)));
    if (TokenId id = v.find(mapped); id != kNoToken) {
      out.push_back(id);
      return {};
    }
  }
  // A byte the vocabulary has no token for (SmolLM2 lacks 0x04, 0xF5-0xFF and a few more) stays a
  // symbol that never merges and is left out of the ids, as llama.cpp does: one stray control
  // character does not make a whole prompt fail.
  std::vector<Symbol> sym(word.size());
  for (size_t i = 0; i < word.size(); ++i)
    sym[i] = {v.byte_tokens[static_cast<uint8_t>(word[i])], static_cast<uint32_t>(i), 1, static_cast<int32_t>(i) - 1,
              i + 1 < word.size() ? static_cast<int32_t>(i + 1) : -1};
  std::priority_queue<BpePair, std::vector<BpePair>, std::greater<>> heap;
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0 || sym[l].id == kNoToken || sym[r].id == kNoToken) return;
    auto it = v.merges.find(pair_key(sym[l].id, sym[r].id));
    if (it != v.merges.end()) heap.push({it->second.rank, l, r, sym[l].id, sym[r].id});
  };
  for (size_t i = 0; i + 1 < word.size(); ++i) try_pair(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  while (!heap.empty()) {
    const BpePair p = heap.top();
    heap.pop();
    Symbol& l = sym[p.left];
    Symbol& r = sym[p.right];
    if (l.size == 0 || r.size == 0 || l.next != p.right || l.id != p.left_id || r.id != p.right_id) continue;
    l.id = v.merges.at(pair_key(p.left_id, p.right_id)).result;
    l.size += r.size;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    try_pair(l.prev, p.left);
    try_pair(p.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next)
    if (sym[i].id != kNoToken) out.push_back(sym[i].id);
  return {};
}

Status spm_encode(const Tokenizer::Impl& v, std::string_view text, std::vector<TokenId>& out) {
  if (text.empty()) return {};
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    // One character per symbol; a bad byte is a symbol of its own (and falls back to bytes).
    int len = unicode::utf8_sequence_length(text.substr(i));
    if (len <= 0) len = 1;
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({kNoToken, static_cast<uint32_t>(i), static_cast<uint32_t>(len), n - 1, n + 1});
    i += len;
  }
  sym.back().next = -1;
  std::priority_queue<SpmPair> heap;
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t size = sym[l].size + sym[r].size;
    const TokenId id = v.find(text.substr(sym[l].offset, size));
    if (id != kNoToken) heap.push({v.score(id), l, r, size});
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) try_pair(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  while (!heap.empty()) {
    const SpmPair p = heap.top();
    heap.pop();
    Symbol& l = sym[p.left];
    Symbol& r = sym[p.right];
    if (l.size == 0 || r.size == 0 || l.next != p.right || l.size + r.size != p.size) continue;
    l.size += r.size;
    r.size = 0;
    l.next = r.next;
    if (r.next >= 0) sym[r.next].prev = p.left;
    try_pair(l.prev, p.left);
    try_pair(p.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = text.substr(sym[i].offset, sym[i].size);
    if (TokenId id = v.find(piece); id != kNoToken) {
      out.push_back(id);
      continue;
    }
    bool have_bytes = true;
    for (char c : piece) have_bytes = have_bytes && v.byte_tokens[static_cast<uint8_t>(c)] != kNoToken;
    if (have_bytes) {  // byte fallback
      for (char c : piece) out.push_back(v.byte_tokens[static_cast<uint8_t>(c)]);
    } else if (v.unk != kNoToken) {  // one unknown token per character, as SentencePiece does
      out.push_back(v.unk);
    } else {
      return Status::error(fmt::format("tokenizer: no token, byte tokens or unknown token for '{}'", piece));
    }
  }
  return {};
}

}  // namespace escala::model
