// The forward pass of each architecture (llama, qwen2, gemma2) against a straightforward
// double-precision reference written here from the architectures' definitions, on small
// random-weight GGUF files made by Escala's own writer; plus the runtime's invariants: prefill ==
// token-by-token decode, batch == alone, and StreamingLLM running past the context in flat memory;
// and corrupt model files (ModelLoad), refused in one line or failing the step that meets them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "escala/model.h"

namespace escala::model {
namespace {

struct Tiny {
  std::string arch = "llama";
  int n = 64, layers = 2, heads = 4, kv_heads = 2, hd = 16, ff = 128, vocab = 48, ctx = 256;
  int window = 8;                       // gemma2 local layers
  float attn_cap = 50.0f, final_cap = 30.0f;  // gemma2
  TensorType type = TensorType::kF32;
};

// The weights as plain matrices, kept for the reference.
struct Weights {
  std::vector<float> embed, out_norm, output;
  struct Layer {
    std::vector<float> attn_norm, q, k, v, o, qb, kb, vb, post_attn, ffn_norm, gate, up, down, post_ffn;
  };
  std::vector<Layer> layers;
};

std::vector<float> rand_vec(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Changes to a model file for the loader's mutation test: `metadata` edits the keys after they are
// set; `tensor` may change a tensor's name, type or shape (the data is then random of the new
// size) or drop it (returns false); `poison` names a tensor one of whose values becomes NaN or inf.
struct Edits {
  std::function<void(GgufWriter&)> metadata;
  std::function<bool(std::string&, TensorType&, std::vector<int64_t>&)> tensor;
  std::string poison;
};

Weights write_model(const Tiny& t, const std::string& path, std::mt19937& rng, const Edits& edits = {}) {
  GgufWriter w;
  const std::string a = t.arch;
  w.set("general.architecture", GgufWriteValue::string(a));
  w.set(a + ".context_length", GgufWriteValue::u32(t.ctx));
  w.set(a + ".embedding_length", GgufWriteValue::u32(t.n));
  w.set(a + ".block_count", GgufWriteValue::u32(t.layers));
  w.set(a + ".feed_forward_length", GgufWriteValue::u32(t.ff));
  w.set(a + ".attention.head_count", GgufWriteValue::u32(t.heads));
  w.set(a + ".attention.head_count_kv", GgufWriteValue::u32(t.kv_heads));
  w.set(a + ".attention.key_length", GgufWriteValue::u32(t.hd));
  w.set(a + ".attention.value_length", GgufWriteValue::u32(t.hd));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufWriteValue::f32(1e-5f));
  w.set(a + ".rope.freq_base", GgufWriteValue::f32(10000.0f));
  if (a == "gemma2") {
    w.set(a + ".attention.sliding_window", GgufWriteValue::u32(t.window));
    w.set(a + ".attn_logit_softcapping", GgufWriteValue::f32(t.attn_cap));
    w.set(a + ".final_logit_softcapping", GgufWriteValue::f32(t.final_cap));
  }
  if (edits.metadata) edits.metadata(w);
  Weights W;
  // The edited tensor, when `edits.tensor` changed or dropped it (true: handled here).
  auto edited = [&](const std::string& name, TensorType type, std::vector<int64_t> ne) {
    if (!edits.tensor) return false;
    std::string new_name = name;
    const TensorType old_type = type;
    const std::vector<int64_t> old_ne = ne;
    if (!edits.tensor(new_name, type, ne)) return true;
    if (new_name == name && type == old_type && ne == old_ne) return false;
    int64_t count = 1;
    for (int64_t d : ne) count *= d;
    (void)w.add_tensor(new_name, type, ne, rand_vec(size_t(count), rng, -1, 1));  // may refuse the shape
    return true;
  };
  auto poison = [&](const std::string& name, std::vector<float>& dst) {
    if (name == edits.poison) dst[rng() % dst.size()] = rng() % 2 ? NAN : INFINITY;
  };
  auto mat = [&](const std::string& name, int cols, int rows, std::vector<float>& dst, float s) {
    dst = rand_vec(size_t(cols) * rows, rng, -s, s);
    poison(name, dst);
    if (edited(name, t.type, {cols, rows})) return;
    EXPECT_TRUE(w.add_tensor(name, t.type, {cols, rows}, dst).ok()) << name;
    // The reference uses what the file holds: quantize-dequantize round trip.
    if (t.type != TensorType::kF32) {
      std::vector<uint8_t> q(*row_bytes(t.type, cols));
      for (int r = 0; r < rows; ++r) {
        quantize_row(t.type, dst.data() + size_t(r) * cols, q.data(), cols);
        dequantize_row(t.type, q.data(), dst.data() + size_t(r) * cols, cols);
      }
    }
  };
  auto vec = [&](const std::string& name, int len, std::vector<float>& dst, float lo, float hi) {
    dst = rand_vec(len, rng, lo, hi);
    poison(name, dst);
    if (edited(name, TensorType::kF32, {len})) return;
    EXPECT_TRUE(w.add_tensor(name, TensorType::kF32, {len}, dst).ok()) << name;
  };
  mat("token_embd.weight", t.n, t.vocab, W.embed, 1.0f);
  vec("output_norm.weight", t.n, W.out_norm, 0.8f, 1.2f);
  if (a != "gemma2") mat("output.weight", t.n, t.vocab, W.output, 0.3f);
  W.layers.resize(t.layers);
  for (int l = 0; l < t.layers; ++l) {
    auto& L = W.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    const float s = 1.0f / std::sqrt(float(t.n));
    vec(p + "attn_norm.weight", t.n, L.attn_norm, 0.8f, 1.2f);
    mat(p + "attn_q.weight", t.n, t.heads * t.hd, L.q, 3 * s);
    mat(p + "attn_k.weight", t.n, t.kv_heads * t.hd, L.k, 3 * s);
    mat(p + "attn_v.weight", t.n, t.kv_heads * t.hd, L.v, s);
    mat(p + "attn_output.weight", t.heads * t.hd, t.n, L.o, s);
    vec(p + "ffn_norm.weight", t.n, L.ffn_norm, 0.8f, 1.2f);
    mat(p + "ffn_gate.weight", t.n, t.ff, L.gate, s);
    mat(p + "ffn_up.weight", t.n, t.ff, L.up, s);
    mat(p + "ffn_down.weight", t.ff, t.n, L.down, 1.0f / std::sqrt(float(t.ff)));
    if (a == "qwen2") {
      vec(p + "attn_q.bias", t.heads * t.hd, L.qb, -0.2f, 0.2f);
      vec(p + "attn_k.bias", t.kv_heads * t.hd, L.kb, -0.2f, 0.2f);
      vec(p + "attn_v.bias", t.kv_heads * t.hd, L.vb, -0.2f, 0.2f);
    }
    if (a == "gemma2") {
      vec(p + "post_attention_norm.weight", t.n, L.post_attn, 0.8f, 1.2f);
      vec(p + "post_ffw_norm.weight", t.n, L.post_ffn, 0.8f, 1.2f);
    }
  }
  EXPECT_TRUE(w.write(path).ok());
  return W;
}

using Vec = std::vector<double>;

Vec matvec(const std::vector<float>& W, const Vec& x, int rows) {
  const int cols = int(x.size());
  Vec y(rows, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[r] += double(W[size_t(r) * cols + c]) * x[c];
  return y;
}

Vec rms(const Vec& x, const std::vector<float>& w) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + 1e-5);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

void rope(double* v, int hd, int pos, bool neox) {
  for (int i = 0; i < hd / 2; ++i) {
    const double ang = pos * std::pow(10000.0, -2.0 * i / hd);
    const int a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
    const double x0 = v[a], x1 = v[b];
    v[a] = x0 * std::cos(ang) - x1 * std::sin(ang);
    v[b] = x0 * std::sin(ang) + x1 * std::cos(ang);
  }
}

// Logits of the last token, computed from the definitions in double precision.
Vec reference_logits(const Tiny& t, const Weights& W, const std::vector<int32_t>& toks) {
  const bool gemma = t.arch == "gemma2", neox = t.arch != "llama";
  const int T = int(toks.size()), g = t.heads / t.kv_heads;
  std::vector<Vec> x(T);
  for (int i = 0; i < T; ++i) {
    x[i].assign(W.embed.begin() + size_t(toks[i]) * t.n, W.embed.begin() + size_t(toks[i] + 1) * t.n);
    if (gemma)
      for (double& v : x[i]) v *= std::sqrt(double(t.n));
  }
  for (int l = 0; l < t.layers; ++l) {
    const auto& L = W.layers[l];
    std::vector<Vec> q(T), k(T), v(T);
    for (int i = 0; i < T; ++i) {
      const Vec h = rms(x[i], L.attn_norm);
      q[i] = matvec(L.q, h, t.heads * t.hd);
      k[i] = matvec(L.k, h, t.kv_heads * t.hd);
      v[i] = matvec(L.v, h, t.kv_heads * t.hd);
      if (!L.qb.empty()) {
        for (size_t c = 0; c < q[i].size(); ++c) q[i][c] += L.qb[c];
        for (size_t c = 0; c < k[i].size(); ++c) k[i][c] += L.kb[c];
        for (size_t c = 0; c < v[i].size(); ++c) v[i][c] += L.vb[c];
      }
      for (int hh = 0; hh < t.heads; ++hh) rope(q[i].data() + hh * t.hd, t.hd, i, neox);
      for (int hh = 0; hh < t.kv_heads; ++hh) rope(k[i].data() + hh * t.hd, t.hd, i, neox);
    }
    const int window = gemma && l % 2 == 0 ? t.window : 0;
    for (int i = 0; i < T; ++i) {
      Vec att(t.heads * t.hd, 0.0);
      for (int hh = 0; hh < t.heads; ++hh) {
        const int kh = hh / g;
        std::vector<double> s(i + 1, -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          if (window > 0 && j < i - window + 1) continue;
          double dot = 0;
          for (int c = 0; c < t.hd; ++c) dot += q[i][hh * t.hd + c] * k[j][kh * t.hd + c];
          dot /= std::sqrt(double(t.hd));
          if (gemma) dot = t.attn_cap * std::tanh(dot / t.attn_cap);
          s[j] = dot;
          mx = std::max(mx, dot);
        }
        double den = 0;
        for (int j = 0; j <= i; ++j) den += std::exp(s[j] - mx);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - mx) / den;
          for (int c = 0; c < t.hd; ++c) att[hh * t.hd + c] += p * v[j][kh * t.hd + c];
        }
      }
      Vec o = matvec(L.o, att, t.n);
      if (gemma) o = rms(o, L.post_attn);
      for (int c = 0; c < t.n; ++c) x[i][c] += o[c];
    }
    for (int i = 0; i < T; ++i) {
      const Vec h = rms(x[i], L.ffn_norm);
      Vec gt = matvec(L.gate, h, t.ff);
      const Vec up = matvec(L.up, h, t.ff);
      for (int c = 0; c < t.ff; ++c) {
        const double z = gt[c];
        gt[c] = (gemma ? 0.5 * z * (1 + std::tanh(0.7978845608028654 * (z + 0.044715 * z * z * z))) : z / (1 + std::exp(-z))) * up[c];
      }
      Vec d = matvec(L.down, gt, t.n);
      if (gemma) d = rms(d, L.post_ffn);
      for (int c = 0; c < t.n; ++c) x[i][c] += d[c];
    }
  }
  Vec logits = matvec(gemma ? W.embed : W.output, rms(x[T - 1], W.out_norm), t.vocab);
  if (gemma)
    for (double& l : logits) l = t.final_cap * std::tanh(l / t.final_cap);
  return logits;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("escala_model_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::vector<int32_t> random_tokens(int n, int vocab, std::mt19937& rng) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % vocab);
  return t;
}

class ArchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ArchTest, LogitsMatchDoublePrecisionReference) {
  Tiny t;
  t.arch = GetParam();
  std::mt19937 rng(std::random_device{}());
  const std::string path = temp_path(t.arch + ".gguf");
  const Weights W = write_model(t, path, rng);
  ModelOptions o;
  o.kv_dtype = DType::kF32;
  auto m = Model::load(path, o);
  ASSERT_TRUE(m.ok()) << m.message();
  const auto toks = random_tokens(23, t.vocab, rng);  // longer than gemma2's window of 8
  std::vector<float> logits;
  ASSERT_TRUE((*m)->append(1, toks, logits).ok());
  const Vec ref = reference_logits(t, W, toks);
  ASSERT_EQ(logits.size(), ref.size());
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_err = std::max(max_err, std::fabs(logits[i] - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  // f32 weights and activations, f32 KV: only accumulation order differs from the reference.
  EXPECT_LT(max_err, 2e-3 * std::max(1.0, max_ref)) << t.arch << ": max |logit error| " << max_err;
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Model, ArchTest, ::testing::Values("llama", "qwen2", "gemma2"));

TEST(Model, PrefillEqualsTokenByToken) {
  // f32 weights: prefill (flash kernel, batched matmul) and decode (decode kernel, matvec) differ
  // only in f32 rounding. (With quantized activations a rounding flip of one int8 can move a logit
  // by ~1e-2, which is why this check uses f32 weights.)
  Tiny t;
  std::mt19937 rng(std::random_device{}());
  const std::string path = temp_path("f32.gguf");
  write_model(t, path, rng);
  ModelOptions o;
  o.max_sequences = 2;
  o.kv_dtype = DType::kF32;
  auto m = Model::load(path, o);
  ASSERT_TRUE(m.ok()) << m.message();
  const auto a = random_tokens(40, t.vocab, rng);
  std::vector<float> la, step;
  ASSERT_TRUE((*m)->append(1, a, la).ok());
  for (int32_t tok : a) ASSERT_TRUE((*m)->append(2, std::span(&tok, 1), step).ok());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], step[i], 2e-3 * (1 + std::fabs(la[i])));
  std::filesystem::remove(path);
}

TEST(Model, BatchEqualsAloneBitForBit) {
  // Quantized weights as in real models: a sequence's logits are the same bits whether it runs
  // alone or batched with a longer prefill (kernel choice and split counts are per sequence).
  Tiny t;
  t.type = TensorType::kQ8_0;
  std::mt19937 rng(std::random_device{}());
  const std::string path = temp_path("q8.gguf");
  write_model(t, path, rng);
  ModelOptions o;
  o.max_sequences = 4;
  o.kv_dtype = DType::kF16;
  auto m = Model::load(path, o);
  ASSERT_TRUE(m.ok()) << m.message();
  Model& M = **m;
  const auto a = random_tokens(40, t.vocab, rng), b = random_tokens(9, t.vocab, rng);
  std::vector<float> la, lb;
  ASSERT_TRUE(M.append(1, a, la).ok());
  ASSERT_TRUE(M.append(3, b, lb).ok());
  auto& cache = M.cache();
  ASSERT_TRUE(cache.add_sequence(4).ok());
  ASSERT_TRUE(cache.add_sequence(5).ok());
  kv::AppendRequest reqs[2] = {{4, a}, {5, b}};
  auto plan = cache.prepare_append(reqs);
  ASSERT_TRUE(plan.ok() && plan->fits());
  ASSERT_TRUE(cache.apply(*plan).ok());
  StepSequence steps[2] = {{4, a, true}, {5, b, true}};
  std::vector<float> both;
  ASSERT_TRUE(M.forward(steps, both).ok());
  ASSERT_EQ(both.size(), 2 * la.size());
  EXPECT_TRUE(std::equal(la.begin(), la.end(), both.begin())) << "batched logits differ from sequence 1 alone";
  EXPECT_TRUE(std::equal(lb.begin(), lb.end(), both.begin() + la.size())) << "batched logits differ from sequence 3 alone";
  std::filesystem::remove(path);
}

TEST(Model, StreamingRunsPastTheContextInFlatMemory) {
  Tiny t;
  t.ctx = 64;
  std::mt19937 rng(std::random_device{}());
  const std::string path = temp_path("stream.gguf");
  write_model(t, path, rng);
  ModelOptions o;
  o.streaming = {4, 32};
  auto m = Model::load(path, o);
  ASSERT_TRUE(m.ok()) << m.message();
  std::vector<float> logits;
  // Resident bytes cycle by one block as the window slides; the peak must not grow.
  int64_t peak_first = 0, peak_second = 0;
  for (int i = 0; i < 400; ++i) {  // 6x the trained context
    const int32_t tok = int32_t(rng() % t.vocab);
    ASSERT_TRUE((*m)->append(1, std::span(&tok, 1), logits).ok()) << "token " << i;
    for (float l : logits) ASSERT_TRUE(std::isfinite(l));
    const int64_t bytes = (*m)->cache().stats().bytes_in_use;
    if (i >= 100 && i < 250) peak_first = std::max(peak_first, bytes);
    if (i >= 250) peak_second = std::max(peak_second, bytes);
  }
  EXPECT_GT(peak_first, 0);
  EXPECT_EQ(peak_second, peak_first);
  EXPECT_LE((*m)->cache().num_tokens(1) - (*m)->cache().evicted_tokens(1), 4 + 32 + 2 * 16);
  std::filesystem::remove(path);
}

TEST(Model, RejectsMissingTensorsAndBadShapes) {
  Tiny t;
  std::mt19937 rng(1);
  const std::string path = temp_path("bad.gguf");
  write_model(t, path, rng);
  // A model whose K projection has the wrong shape.
  {
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.ok());
  }
  GgufWriter w;
  w.set("general.architecture", GgufWriteValue::string("llama"));
  w.set("llama.context_length", GgufWriteValue::u32(64));
  w.set("llama.embedding_length", GgufWriteValue::u32(64));
  w.set("llama.block_count", GgufWriteValue::u32(1));
  w.set("llama.feed_forward_length", GgufWriteValue::u32(128));
  w.set("llama.attention.head_count", GgufWriteValue::u32(4));
  w.set("llama.attention.layer_norm_rms_epsilon", GgufWriteValue::f32(1e-5f));
  ASSERT_TRUE(w.add_tensor("token_embd.weight", TensorType::kF32, {64, 8}, rand_vec(64 * 8, rng, -1, 1)).ok());
  ASSERT_TRUE(w.write(path).ok());
  auto m = Model::load(path, {});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.message().find("missing"), std::string::npos) << m.message();
  std::filesystem::remove(path);
}

// Corrupt models: one random change to a valid file's metadata or tensors (a value out of range or
// of the wrong type, a key gone, a tensor dropped, reshaped, re-typed, or holding a NaN / inf).
// Loading must give one clear line of error, or a model whose forward pass gives finite logits;
// only the NaN / inf weights, which the loader does not scan (a 70B model's 40 GB), may load and
// then fail the forward pass, with an error that says so. Fresh changes each run; the seed is
// printed with any failure.
TEST(ModelLoad, CorruptModelsFailCleanlyOrRun) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  const std::vector<std::string> suffixes = {
      "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
      "attention.head_count_kv", "attention.key_length", "attention.value_length",
      "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "attention.sliding_window",
      "attn_logit_softcapping", "final_logit_softcapping", "vocab_size"};
  const std::vector<GgufWriteValue> values = {
      GgufWriteValue::u32(0), GgufWriteValue::u32(1), GgufWriteValue::u32(3), GgufWriteValue::u32(7),
      GgufWriteValue::u32(33), GgufWriteValue::u32(100000), GgufWriteValue::u32(0x7FFFFFFFu),
      GgufWriteValue::u32(0xFFFFFFFFu), GgufWriteValue::i32(-1), GgufWriteValue::u64(1ull << 40),
      GgufWriteValue::f32(0.0f), GgufWriteValue::f32(-1.0f), GgufWriteValue::f32(1e-30f), GgufWriteValue::f32(1e30f),
      GgufWriteValue::f32(NAN), GgufWriteValue::f32(INFINITY), GgufWriteValue::string("x"),
      GgufWriteValue::boolean(true), GgufWriteValue::f64(2.0)};
  const TensorType types[] = {TensorType::kF16, TensorType::kBF16, TensorType::kQ8_0, TensorType::kQ4_0,
                              TensorType::kQ4_K, TensorType::kQ6_K};
  const std::vector<std::string> poisonable = {"token_embd.weight", "output_norm.weight", "blk.0.attn_k.weight",
                                               "blk.1.attn_q.weight", "blk.1.ffn_down.weight",
                                               "blk.1.ffn_norm.weight"};
  const std::string path = temp_path("corrupt.gguf");
  int ran = 0, refused = 0, failed_step = 0;
  for (int iter = 0; iter < 120; ++iter) {
    Tiny t;
    t.arch = std::vector<std::string>{"llama", "qwen2", "gemma2"}[rng() % 3];
    Edits e;
    std::string change;
    if (rng() % 8 == 0) {
      e.poison = poisonable[rng() % poisonable.size()];
      change = "NaN or inf in " + e.poison;
    } else if (rng() % 2 == 0) {
      const std::string key = rng() % 16 == 0 ? "general.architecture" : t.arch + "." + suffixes[rng() % suffixes.size()];
      const GgufWriteValue v = values[rng() % values.size()];
      change = key + " := value of type " + std::to_string(int(v.type)) + " (u " + std::to_string(v.u) + ", f " +
               std::to_string(v.f) + ")";
      e.metadata = [key, v](GgufWriter& w) { w.set(key, v); };
    } else {
      const int target = int(rng() % 20), action = int(rng() % 6);
      const TensorType type = types[rng() % std::size(types)];
      auto n = std::make_shared<int>(0);
      e.tensor = [=, &change](std::string& name, TensorType& ty, std::vector<int64_t>& ne) {
        if ((*n)++ != target) return true;
        change = name + ": action " + std::to_string(action);
        switch (action) {
          case 0: return false;                                          // dropped
          case 1: ne[0] += 1; break;                                     // one column more
          case 2: ne.back() = std::max<int64_t>(1, ne.back() / 2); break;  // half the rows
          case 3: std::reverse(ne.begin(), ne.end()); break;             // transposed
          case 4: ne.push_back(2); break;                                // a third dimension
          default: ty = type; break;                                     // another format
        }
        return true;
      };
    }
    write_model(t, path, rng, e);
    ModelOptions o;
    o.kv_dtype = DType::kF32;
    o.context = 64;
    auto m = Model::load(path, o);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", iteration " + std::to_string(iter) + ", " + t.arch + ": " +
                 change);
    if (!m.ok()) {
      ++refused;
      EXPECT_FALSE(m.message().empty());
      EXPECT_EQ(m.message().find('\n'), std::string::npos) << m.message();
      continue;
    }
    const int vocab = (*m)->info().vocab_size;
    ASSERT_GT(vocab, 0);
    std::vector<float> logits;
    // A model that loads must run: what it cannot run is refused when it loads, but for bad values.
    const Status s = (*m)->append(1, random_tokens(5, vocab, rng), logits);
    if (!e.poison.empty() && !s.ok()) {
      EXPECT_NE(s.message().find("non-finite"), std::string::npos) << s.message();
      ++failed_step;
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.message();
    ++ran;
    ASSERT_EQ(logits.size(), size_t(vocab));
    for (float l : logits) ASSERT_TRUE(std::isfinite(l)) << "non-finite logit";
  }
  std::printf("corrupt models: %d refused, %d failed their first step (NaN / inf weights), %d ran\n", refused,
              failed_step, ran);
  EXPECT_GT(refused, 0);
  std::filesystem::remove(path);
}


// Values found by the test above that once loaded and then failed or threw: each is refused when
// the model loads, with the key named.
TEST(ModelLoad, ImpossibleValuesNameTheirKey) {
  const std::string path = temp_path("impossible.gguf");
  const std::pair<std::string, GgufWriteValue> cases[] = {
      {"block_count", GgufWriteValue::u32(0x7FFFFFFFu)},  // was std::bad_alloc
      {"rope.freq_base", GgufWriteValue::f32(0.0f)},        // was non-finite K/V at the first step
      {"rope.freq_base", GgufWriteValue::f32(-1.0f)},
      {"attn_logit_softcapping", GgufWriteValue::f32(-1.0f)},  // was an attention error per step
  };
  for (const auto& [suffix, value] : cases) {
    Tiny t;
    t.arch = "gemma2";
    std::mt19937 rng(7);
    Edits e;
    e.metadata = [&, suffix, value](GgufWriter& w) { w.set(t.arch + "." + suffix, value); };
    write_model(t, path, rng, e);
    auto m = Model::load(path, {});
    ASSERT_FALSE(m.ok()) << suffix;
    const std::string key = suffix == "attn_logit_softcapping" ? "soft-caps" : suffix;
    EXPECT_NE(m.message().find(key), std::string::npos) << m.message();
  }
  std::filesystem::remove(path);
}


// NaN / inf weights load (the loader does not scan them) and fail the step that meets them, with an
// error that names the cause, rather than reaching the sampler or being read as masked keys.
TEST(ModelLoad, NonFiniteWeightsFailTheStep) {
  const std::string path = temp_path("nan.gguf");
  const std::pair<const char*, const char*> cases[] = {{"output_norm.weight", "non-finite logits"},
                                                       {"blk.0.attn_k.weight", "non-finite K/V"},
                                                       {"blk.1.attn_q.weight", "non-finite queries"}};
  for (const auto& [tensor, error] : cases) {
    Tiny t;
    std::mt19937 rng(3);
    Edits e;
    e.poison = tensor;
    write_model(t, path, rng, e);
    ModelOptions o;
    o.kv_dtype = DType::kF32;
    auto m = Model::load(path, o);
    ASSERT_TRUE(m.ok()) << m.message();
    std::vector<float> logits;
    const Status s = (*m)->append(1, random_tokens(4, t.vocab, rng), logits);
    ASSERT_FALSE(s.ok()) << tensor;
    EXPECT_NE(s.message().find(error), std::string::npos) << s.message();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace escala::model
