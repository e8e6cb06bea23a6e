// `escala_random_gguf`: writes a small random-weight GGUF model (llama, qwen2 or gemma2) with the
// project's own GgufWriter, for comparisons with another runtime (scripts/compare_random_archs.py).
// The tokenizer.ggml.* keys are copied from an existing GGUF file (--tokenizer-from), so that any
// GGUF loader accepts the vocabulary; the vocabulary size comes from its token list.
//
//   escala_random_gguf --arch gemma2 --tokenizer-from models/SmolLM2-135M-Instruct.Q4_1.gguf
//       --out /tmp/gemma2.gguf [--embd 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --ff 256]
//       [--rope-scaling linear|yarn --rope-factor 4 --rope-orig-ctx 16] [--rope-freqs]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "escala/quant.h"

namespace {

using escala::Result;
using escala::Status;
using escala::model::GgufFile;
using escala::model::GgufValue;
using escala::model::GgufValueType;
using escala::model::GgufWriter;
using escala::model::TensorType;
using V = escala::model::GgufWriteValue;

size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: case GgufValueType::kI8: case GgufValueType::kBool: return 1;
    case GgufValueType::kU16: case GgufValueType::kI16: return 2;
    case GgufValueType::kU32: case GgufValueType::kI32: case GgufValueType::kF32: return 4;
    case GgufValueType::kU64: case GgufValueType::kI64: case GgufValueType::kF64: return 8;
    default: return 0;
  }
}

// One numeric element of an array, as stored (little-endian) at `p`.
V numeric(GgufValueType t, const uint8_t* p) {
  auto rd = [p](auto v) { std::memcpy(&v, p, sizeof v); return v; };
  switch (t) {
    case GgufValueType::kU8: return V::u8(rd(uint8_t{}));
    case GgufValueType::kI8: return V::i8(rd(int8_t{}));
    case GgufValueType::kBool: return V::boolean(rd(uint8_t{}) != 0);
    case GgufValueType::kU16: return V::u16(rd(uint16_t{}));
    case GgufValueType::kI16: return V::i16(rd(int16_t{}));
    case GgufValueType::kU32: return V::u32(rd(uint32_t{}));
    case GgufValueType::kI32: return V::i32(rd(int32_t{}));
    case GgufValueType::kF32: return V::f32(rd(float{}));
    case GgufValueType::kU64: return V::u64(rd(uint64_t{}));
    case GgufValueType::kI64: return V::i64(rd(int64_t{}));
    default: return V::f64(rd(double{}));
  }
}

Result<V> convert(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kString: return V::string(std::string(v.str));
    case GgufValueType::kBool: return V::boolean(v.u != 0);
    case GgufValueType::kF32: return V::f32(float(v.f));
    case GgufValueType::kF64: return V::f64(v.f);
    case GgufValueType::kU8: return V::u8(uint8_t(v.u));
    case GgufValueType::kU16: return V::u16(uint16_t(v.u));
    case GgufValueType::kU32: return V::u32(uint32_t(v.u));
    case GgufValueType::kU64: return V::u64(v.u);
    case GgufValueType::kI8: return V::i8(int8_t(v.i));
    case GgufValueType::kI16: return V::i16(int16_t(v.i));
    case GgufValueType::kI32: return V::i32(int32_t(v.i));
    case GgufValueType::kI64: return V::i64(v.i);
    case GgufValueType::kArray: {
      std::vector<V> items;
      if (v.elem_type == GgufValueType::kString) {
        for (auto s : v.strings) items.push_back(V::string(std::string(s)));
      } else if (scalar_size(v.elem_type) > 0) {
        const size_t sz = scalar_size(v.elem_type);
        for (uint64_t k = 0; k < v.count; ++k) items.push_back(numeric(v.elem_type, v.raw + k * sz));
      } else {
        return Status::error("nested arrays are not copied");
      }
      return V::array(v.elem_type, std::move(items));
    }
  }
  return Status::error("unknown metadata type");
}

struct Shape {
  std::string arch = "qwen2", out, tokenizer_from;
  int embd = 128, layers = 4, heads = 4, kv_heads = 2, head_dim = 32, ff = 256, ctx = 2048, window = 8;
  float attn_cap = 50.0f, final_cap = 30.0f;
  uint32_t seed = 1;
  std::string type = "f32";
  // RoPE scaling (llama): rope.scaling.type none / linear / yarn with its factor and original
  // context; rope_freqs: Llama 3's per-frequency factors as a tensor.
  std::string rope_scaling = "none";
  float rope_factor = 4.0f;
  int rope_orig_ctx = 16;
  bool rope_freqs = false;
};

Status run(const Shape& s) {
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "gemma2")
    return Status::error("--arch must be llama, qwen2 or gemma2");
  const TensorType wt = s.type == "f16" ? TensorType::kF16 : TensorType::kF32;
  auto tok = GgufFile::open(s.tokenizer_from);
  if (!tok.ok()) return tok.status();
  GgufWriter w;
  const std::string& a = s.arch;
  w.set("general.architecture", V::string(a));
  w.set("general.name", V::string("escala-random-" + a));
  w.set(a + ".context_length", V::u32(uint32_t(s.ctx)));
  w.set(a + ".embedding_length", V::u32(uint32_t(s.embd)));
  w.set(a + ".block_count", V::u32(uint32_t(s.layers)));
  w.set(a + ".feed_forward_length", V::u32(uint32_t(s.ff)));
  w.set(a + ".attention.head_count", V::u32(uint32_t(s.heads)));
  w.set(a + ".attention.head_count_kv", V::u32(uint32_t(s.kv_heads)));
  w.set(a + ".attention.key_length", V::u32(uint32_t(s.head_dim)));
  w.set(a + ".attention.value_length", V::u32(uint32_t(s.head_dim)));
  w.set(a + ".attention.layer_norm_rms_epsilon", V::f32(1e-6f));
  w.set(a + ".rope.freq_base", V::f32(10000.0f));
  if (s.rope_scaling != "none") {
    w.set(a + ".rope.scaling.type", V::string(s.rope_scaling));
    w.set(a + ".rope.scaling.factor", V::f32(s.rope_factor));
    if (s.rope_scaling == "yarn") w.set(a + ".rope.scaling.original_context_length", V::u32(uint32_t(s.rope_orig_ctx)));
  }
  if (a == "gemma2") {
    w.set(a + ".attention.sliding_window", V::u32(uint32_t(s.window)));
    w.set(a + ".attn_logit_softcapping", V::f32(s.attn_cap));
    w.set(a + ".final_logit_softcapping", V::f32(s.final_cap));
  }
  int64_t vocab = 0;
  for (const auto& [key, value] : tok->metadata()) {
    if (!key.starts_with("tokenizer.ggml.")) continue;
    auto v = convert(value);
    if (!v.ok()) return Status::error("copying '" + std::string(key) + "': " + v.message());
    if (key == "tokenizer.ggml.tokens") vocab = int64_t(value.count);
    w.set(std::string(key), std::move(*v));
  }
  if (vocab == 0) return Status::error(s.tokenizer_from + " has no tokenizer.ggml.tokens");

  std::mt19937 rng(s.seed);
  auto rnd = [&](int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng);
    return v;
  };
  Status st;
  auto mat = [&](const std::string& name, int64_t cols, int64_t rows, float sc) {
    if (st.ok()) st = w.add_tensor(name, wt, {cols, rows}, rnd(cols * rows, -sc, sc));
  };
  auto vec = [&](const std::string& name, int64_t len, float lo, float hi) {
    if (st.ok()) st = w.add_tensor(name, TensorType::kF32, {len}, rnd(len, lo, hi));
  };
  const int64_t n = s.embd, q = int64_t(s.heads) * s.head_dim, kv = int64_t(s.kv_heads) * s.head_dim;
  const float is = 1.0f / std::sqrt(float(n));
  // gemma2 scales the embedding by sqrt(n) and ties the output to it: keep its entries small.
  mat("token_embd.weight", n, vocab, a == "gemma2" ? 3 * is : 1.0f);
  vec("output_norm.weight", n, 0.8f, 1.2f);
  if (a != "gemma2") mat("output.weight", n, vocab, 6 * is);
  for (int l = 0; l < s.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", n, 0.8f, 1.2f);
    mat(p + "attn_q.weight", n, q, 3 * is);
    mat(p + "attn_k.weight", n, kv, 3 * is);
    mat(p + "attn_v.weight", n, kv, 1.7f * is);
    mat(p + "attn_output.weight", q, n, 1.7f / std::sqrt(float(q)));
    if (a == "qwen2") {
      vec(p + "attn_q.bias", q, -0.3f, 0.3f);
      vec(p + "attn_k.bias", kv, -0.3f, 0.3f);
      vec(p + "attn_v.bias", kv, -0.3f, 0.3f);
    }
    // gemma2's tied output favours the input token: larger post-norms keep the layers' share up.
    if (a == "gemma2") vec(p + "post_attention_norm.weight", n, 2.0f, 4.0f);
    vec(p + "ffn_norm.weight", n, 0.8f, 1.2f);
    mat(p + "ffn_gate.weight", n, s.ff, 1.7f * is);
    mat(p + "ffn_up.weight", n, s.ff, 1.7f * is);
    mat(p + "ffn_down.weight", s.ff, n, 1.7f / std::sqrt(float(s.ff)));
    if (a == "gemma2") vec(p + "post_ffw_norm.weight", n, 2.0f, 4.0f);
  }
  // Llama 3's factors grow from 1 (high frequencies) to 8 (low ones).
  if (s.rope_freqs) {
    std::vector<float> f(size_t(s.head_dim / 2));
    for (size_t i = 0; i < f.size(); ++i) f[i] = 1.0f + 7.0f * float(i) / float(f.size()) + rnd(1, 0.0f, 0.5f)[0];
    if (st.ok()) st = w.add_tensor("rope_freqs.weight", TensorType::kF32, {int64_t(f.size())}, f);
  }
  if (!st.ok()) return st;
  return w.write(s.out);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a small random-weight GGUF model with Escala's GGUF writer"};
  Shape s;
  app.add_option("--arch", s.arch, "llama, qwen2 or gemma2")->required();
  app.add_option("--out,-o", s.out, "Output GGUF file")->required();
  app.add_option("--tokenizer-from", s.tokenizer_from, "GGUF file whose tokenizer.ggml.* keys are copied")->required();
  app.add_option("--embd", s.embd, "Hidden size")->check(CLI::Range(1, 1 << 16));
  app.add_option("--layers", s.layers, "Layers")->check(CLI::Range(1, 256));
  app.add_option("--heads", s.heads, "Query heads")->check(CLI::Range(1, 256));
  app.add_option("--kv-heads", s.kv_heads, "KV heads")->check(CLI::Range(1, 256));
  app.add_option("--head-dim", s.head_dim, "Head dimension")->check(CLI::Range(2, 1024));
  app.add_option("--ff", s.ff, "Feed-forward size")->check(CLI::Range(1, 1 << 16));
  app.add_option("--context", s.ctx, "context_length")->check(CLI::Range(1, 1 << 20));
  app.add_option("--window", s.window, "gemma2: sliding window of the local (even) layers")->check(CLI::Range(1, 1 << 20));
  app.add_option("--attn-softcap", s.attn_cap, "gemma2: attention logit soft-cap");
  app.add_option("--final-softcap", s.final_cap, "gemma2: final logit soft-cap");
  app.add_option("--type", s.type, "Matrix weight type: f32 or f16")->check(CLI::IsMember({"f32", "f16"}));
  app.add_option("--seed", s.seed, "Random seed");
  app.add_option("--rope-scaling", s.rope_scaling, "rope.scaling.type: none, linear or yarn")
      ->check(CLI::IsMember({"none", "linear", "yarn"}));
  app.add_option("--rope-factor", s.rope_factor, "rope.scaling.factor")->check(CLI::Range(1.0f, 64.0f));
  app.add_option("--rope-orig-ctx", s.rope_orig_ctx, "yarn: rope.scaling.original_context_length")
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--rope-freqs", s.rope_freqs, "write a rope_freqs.weight tensor (Llama 3's factors)");
  CLI11_PARSE(app, argc, argv);
  Status st = run(s);
  if (!st.ok()) {
    std::fprintf(stderr, "escala_random_gguf: error: %s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
