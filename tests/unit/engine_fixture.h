// A tiny random-weight llama (2 layers, 260-token byte vocabulary) for the engine tests, written
// with the GGUF writer, plus a byte-level tokenizer for it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "escala/model.h"
#include "escala/tokenizer.h"
#include "model/tokenizer/tokenizer_impl.h"
#include "model/tokenizer/unicode_class.h"

namespace escala::engine::testing {

inline constexpr int kVocab = 260;  // 256 bytes + 4 specials
inline constexpr int kEmbd = 64, kLayers = 2, kHeads = 4, kKvHeads = 2, kFf = 128, kContext = 512;

inline std::string byte_token(uint8_t b) {
  std::string s;
  model::unicode::append_utf8(s, model::byte_to_unicode(b));
  return s;
}

inline model::Tokenizer tiny_tokenizer() {
  model::VocabData d;
  d.model = "gpt2";
  d.pre = "gpt2";
  for (int b = 0; b < 256; ++b) d.tokens.push_back(byte_token(uint8_t(b)));
  d.merges.push_back(byte_token('a') + " " + byte_token('b'));
  d.tokens.push_back(byte_token('a') + byte_token('b'));
  d.types.assign(d.tokens.size(), model::TokenType::kNormal);
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    d.tokens.push_back(t);
    d.types.push_back(model::TokenType::kControl);
  }
  d.bos = d.eos = 257;
  d.add_bos = 0;
  auto t = model::Tokenizer::from_vocab(std::move(d));
  EXPECT_TRUE(t.ok()) << t.message();
  return *t;
}

// Writes the model once per test binary; returns its path.
inline const std::string& tiny_model_path() {
  static const std::string path = [] {
    using V = model::GgufWriteValue;
    model::GgufWriter w;
    w.set("general.architecture", V::string("llama"));
    w.set("llama.context_length", V::u32(kContext));
    w.set("llama.embedding_length", V::u32(kEmbd));
    w.set("llama.block_count", V::u32(kLayers));
    w.set("llama.feed_forward_length", V::u32(kFf));
    w.set("llama.attention.head_count", V::u32(kHeads));
    w.set("llama.attention.head_count_kv", V::u32(kKvHeads));
    w.set("llama.attention.layer_norm_rms_epsilon", V::f32(1e-5f));
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto rnd = [&](int64_t n, float scale) {
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = nd(rng) * scale;
      return v;
    };
    auto ones = [](int64_t n) { return std::vector<float>(size_t(n), 1.0f); };
    auto add = [&](const std::string& name, model::TensorType t, std::vector<int64_t> ne, std::vector<float> v) {
      auto st = w.add_tensor(name, t, std::move(ne), v);
      EXPECT_TRUE(st.ok()) << st.message();
    };
    const auto q8 = model::TensorType::kQ8_0, f32 = model::TensorType::kF32;
    const int hd = kEmbd / kHeads;
    add("token_embd.weight", q8, {kEmbd, kVocab}, rnd(int64_t(kEmbd) * kVocab, 1.0f));
    add("output_norm.weight", f32, {kEmbd}, ones(kEmbd));
    add("output.weight", q8, {kEmbd, kVocab}, rnd(int64_t(kEmbd) * kVocab, 0.5f));
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", f32, {kEmbd}, ones(kEmbd));
      add(p + "attn_q.weight", q8, {kEmbd, kHeads * hd}, rnd(int64_t(kEmbd) * kHeads * hd, 0.3f));
      add(p + "attn_k.weight", q8, {kEmbd, kKvHeads * hd}, rnd(int64_t(kEmbd) * kKvHeads * hd, 0.3f));
      add(p + "attn_v.weight", q8, {kEmbd, kKvHeads * hd}, rnd(int64_t(kEmbd) * kKvHeads * hd, 0.3f));
      add(p + "attn_output.weight", q8, {kHeads * hd, kEmbd}, rnd(int64_t(kHeads) * hd * kEmbd, 0.2f));
      add(p + "ffn_norm.weight", f32, {kEmbd}, ones(kEmbd));
      add(p + "ffn_gate.weight", q8, {kEmbd, kFf}, rnd(int64_t(kEmbd) * kFf, 0.3f));
      add(p + "ffn_up.weight", q8, {kEmbd, kFf}, rnd(int64_t(kEmbd) * kFf, 0.3f));
      add(p + "ffn_down.weight", q8, {kFf, kEmbd}, rnd(int64_t(kFf) * kEmbd, 0.2f));
    }
    const std::string out = (std::filesystem::temp_directory_path() /
                             ("escala_engine_tiny_" + std::to_string(::getpid()) + ".gguf"))
                                .string();
    auto st = w.write(out);
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }();
  return path;
}

inline std::unique_ptr<model::Model> tiny_model(int64_t kv_budget_bytes = 0, int32_t max_sequences = 64) {
  model::ModelOptions o;
  o.kv_budget_bytes = kv_budget_bytes;
  o.max_sequences = max_sequences;
  o.context = kContext;
  auto m = model::Model::load(tiny_model_path(), o);
  EXPECT_TRUE(m.ok()) << m.message();
  return m.ok() ? std::move(*m) : nullptr;
}

}  // namespace escala::engine::testing
