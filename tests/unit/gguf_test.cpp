// GGUF reader and writer: round trips, every validation error, architecture checks, a
// mutation-fuzz loop, and (when present) the real SmolLM2 file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "escala/gguf.h"

namespace escala::model {
namespace {

using V = GgufWriteValue;
using Bytes = std::vector<uint8_t>;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// A small llama-shaped model with one metadata value of every type.
GgufWriter make_writer(uint32_t version = 3, std::string_view skip = "") {
  GgufWriter w(version);
  auto set = [&](std::string key, V v) {
    if (key != skip) w.set(std::move(key), std::move(v));
  };
  set("general.architecture", V::string("llama"));
  set("general.name", V::string("escala test model"));
  set("llama.context_length", V::u32(256));
  set("llama.embedding_length", V::u32(64));
  set("llama.block_count", V::u32(1));
  set("llama.feed_forward_length", V::u32(256));
  set("llama.attention.head_count", V::u32(4));
  set("llama.attention.head_count_kv", V::u32(2));
  set("llama.attention.layer_norm_rms_epsilon", V::f32(1e-5f));
  set("llama.rope.freq_base", V::f32(100000.0f));
  set("test.u8", V::u8(200));
  set("test.i8", V::i8(-100));
  set("test.u16", V::u16(60000));
  set("test.i16", V::i16(-30000));
  set("test.i32", V::i32(-5));
  set("test.u64", V::u64(1ull << 40));
  set("test.i64", V::i64(-(1ll << 40)));
  set("test.f64", V::f64(0.125));
  set("test.bool", V::boolean(true));
  set("test.empty", V::array(GgufValueType::kU32, {}));
  set("test.floats", V::f32_array({1.5f, -2.0f}));
  set("test.nested", V::array(GgufValueType::kArray,
                                {V::i32_array({1, 2}), V::i32_array({3})}));
  set("tokenizer.ggml.tokens", V::string_array({"<s>", "hello", "wörld", ""}));
  EXPECT_TRUE(w.add_tensor("token_embd.weight", TensorType::kQ8_0, {64, 10},
                           random_values(640, 1)).ok());
  EXPECT_TRUE(w.add_tensor("blk.0.attn_q.weight", TensorType::kQ4_1, {64, 64},
                           random_values(64 * 64, 2)).ok());
  EXPECT_TRUE(w.add_tensor("blk.0.ffn_up.weight", TensorType::kQ4_K, {256, 3},
                           random_values(768, 3)).ok());
  EXPECT_TRUE(w.add_tensor("output_norm.weight", TensorType::kF32, {64},
                           random_values(64, 4)).ok());
  return w;
}

Bytes make_bytes(uint32_t version = 3) {
  auto r = make_writer(version).to_bytes();
  EXPECT_TRUE(r.ok()) << r.message();
  return *r;
}

size_t find(const Bytes& b, std::string_view needle) {
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << needle;
  return static_cast<size_t>(it - b.begin());
}
template <class T>
void patch(Bytes& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// The error message of parsing `b`, or "" when it parses.
std::string error_of(const Bytes& b) {
  auto r = GgufFile::parse(b);
  return r.ok() ? "" : r.message();
}

// Offsets inside the tensor info that follows `name` (its 1-D or 2-D dims).
struct InfoAt {
  size_t n_dims, dims, type, offset;
};
InfoAt info_at(const Bytes& b, std::string_view name) {
  size_t p = find(b, name) + name.size();
  uint32_t nd;
  std::memcpy(&nd, b.data() + p, 4);
  return {p, p + 4, p + 4 + 8 * nd, p + 8 + 8 * nd};
}

TEST(Gguf, RoundTripsEveryValueTypeAndTensor) {
  for (uint32_t version : {2u, 3u}) {
    Bytes bytes = make_bytes(version);
    auto r = GgufFile::parse(bytes);
    ASSERT_TRUE(r.ok()) << r.message();
    const GgufFile& f = *r;
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.alignment(), 32u);
    EXPECT_EQ(f.data_offset() % 32, 0u);
    EXPECT_EQ(*f.get_string("general.architecture"), "llama");
    EXPECT_EQ(*f.get_u32("test.u8"), 200u);
    EXPECT_EQ(*f.get_i32("test.i8"), -100);
    EXPECT_EQ(*f.get_u32("test.u16"), 60000u);
    EXPECT_EQ(*f.get_i32("test.i16"), -30000);
    EXPECT_EQ(*f.get_i64("test.i32"), -5);
    EXPECT_EQ(*f.get_u64("test.u64"), 1ull << 40);
    EXPECT_EQ(*f.get_i64("test.i64"), -(1ll << 40));
    EXPECT_EQ(*f.get_f64("test.f64"), 0.125);
    EXPECT_EQ(*f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
    EXPECT_TRUE(*f.get_bool("test.bool"));
    EXPECT_TRUE(f.get_int_array("test.empty")->empty());
    EXPECT_EQ(*f.get_f32_array("test.floats"), (std::vector<float>{1.5f, -2.0f}));
    const GgufValue* nested = f.find("test.nested");
    ASSERT_NE(nested, nullptr);
    ASSERT_EQ(nested->items.size(), 2u);
    EXPECT_EQ(nested->items[0].count, 2u);
    EXPECT_EQ(nested->items[1].elem_type, GgufValueType::kI32);
    auto tokens = f.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok());
    EXPECT_EQ(*tokens, (std::vector<std::string_view>{"<s>", "hello", "wörld", ""}));

    ASSERT_EQ(f.tensors().size(), 4u);
    const GgufTensor* q = f.find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, TensorType::kQ4_1);
    EXPECT_EQ(q->n_dims, 2);
    EXPECT_EQ(q->ne[0], 64);
    EXPECT_EQ(q->ne[1], 64);
    EXPECT_EQ(q->size, 64u * 2 * 20);
    // The stored bytes are exactly what the quantizer produced.
    auto values = random_values(64 * 64, 2);
    std::vector<uint8_t> expect(q->size);
    for (int r2 = 0; r2 < 64; ++r2) quantize_row(TensorType::kQ4_1, values.data() + 64 * r2, expect.data() + 40 * r2, 64);
    EXPECT_EQ(std::memcmp(q->data, expect.data(), q->size), 0);
    for (const GgufTensor& t : f.tensors())
      EXPECT_EQ(static_cast<size_t>(t.data - bytes.data()) % 32, 0u) << t.name;
    WeightView m = q->as_matrix();
    EXPECT_EQ(m.rows, 64);
    EXPECT_EQ(m.cols, 64);
    EXPECT_EQ(f.find_tensor("missing"), nullptr);
  }
}

TEST(Gguf, AlignmentKeyIsHonoured) {
  for (uint32_t al : {1u, 8u, 64u, 4096u}) {
    GgufWriter w = make_writer();
    w.set("general.alignment", V::u32(al));
    Bytes b = *w.to_bytes();
    auto r = GgufFile::parse(b);
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(r->alignment(), al);
    for (const GgufTensor& t : r->tensors()) EXPECT_EQ(t.offset % al, 0u);
  }
}

TEST(Gguf, TypedAccessorsReturnErrorsAsValues) {
  Bytes b = make_bytes();
  GgufFile f = *GgufFile::parse(b);
  auto missing = f.get_u32("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("'nope' is missing"), std::string::npos);
  auto wrong = f.get_u32("general.name");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.message().find("has type string, expected u32"), std::string::npos);
  EXPECT_FALSE(f.get_u32("test.i8").ok());     // negative into unsigned
  EXPECT_FALSE(f.get_i32("test.u64").ok());    // 2^40 does not fit
  EXPECT_FALSE(f.get_u32("test.u64").ok());
  EXPECT_FALSE(f.get_string("test.u8").ok());
  EXPECT_FALSE(f.get_bool("test.u8").ok());
  EXPECT_FALSE(f.get_f32("test.bool").ok());
  EXPECT_FALSE(f.get_string_array("test.floats").ok());
  EXPECT_FALSE(f.get_f32_array("tokenizer.ggml.tokens").ok());
  auto arr = f.get_string_array("test.nested");
  ASSERT_FALSE(arr.ok());
  EXPECT_NE(arr.message().find("array of array"), std::string::npos);
  EXPECT_EQ(*f.get_u32_or("absent", 7), 7u);
  EXPECT_FALSE(f.get_u32_or("general.name", 7).ok());  // present with the wrong type
  EXPECT_EQ(*f.get_f32_or("absent", 0.5f), 0.5f);
}

struct Corruption {
  const char* what;
  std::function<void(Bytes&)> apply;
  const char* expect;  // a fragment of the error message
};

TEST(Gguf, EveryCorruptionIsOneClearError) {
  const Bytes good = make_bytes();
  const std::vector<Corruption> cases = {
      {"magic", [](Bytes& b) { b[0] = 'X'; }, "bad magic"},
      {"version 1", [](Bytes& b) { patch<uint32_t>(b, 4, 1); }, "version 1 is not supported"},
      {"big-endian", [](Bytes& b) { patch<uint32_t>(b, 4, 0x03000000); }, "big-endian"},
      {"tensor count", [](Bytes& b) { patch<uint64_t>(b, 8, 1ull << 40); }, "tensor count"},
      {"kv count", [](Bytes& b) { patch<uint64_t>(b, 16, ~0ull); }, "metadata count"},
      {"string length",
       [](Bytes& b) { patch<uint64_t>(b, find(b, "llama") - 8, ~0ull >> 1); },
       "only"},
      {"key length", [](Bytes& b) { patch<uint64_t>(b, 24, 70000); }, "limit 65535"},
      {"truncated key", [](Bytes& b) { b.resize(40); }, "cannot fit in the 16 bytes"},
      {"truncated value", [](Bytes& b) { b.resize(find(b, "llama") + 2); }, "cannot fit"},
      {"value type",
       [](Bytes& b) { patch<uint32_t>(b, find(b, "test.u8") + 7, 13); }, "unknown value type 13"},
      {"bool byte", [](Bytes& b) { b[find(b, "test.bool") + 9 + 4] = 2; }, "must be 0 or 1"},
      {"array count",
       [](Bytes& b) { patch<uint64_t>(b, find(b, "test.floats") + 11 + 4 + 4, 1ull << 60); },
       "claims"},
      {"array elem type",
       [](Bytes& b) { patch<uint32_t>(b, find(b, "test.floats") + 11 + 4, 99); },
       "unknown array element type 99"},
      {"duplicate key", [](Bytes& b) { b[find(b, "test.i16") + 5] = 'u'; }, "duplicate metadata key 'test.u16'"},
      {"n_dims 5", [](Bytes& b) { patch<uint32_t>(b, info_at(b, "output_norm.weight").n_dims, 5); },
       "has 5 dimensions"},
      {"n_dims 0", [](Bytes& b) { patch<uint32_t>(b, info_at(b, "output_norm.weight").n_dims, 0); },
       "has 0 dimensions"},
      {"dim 0", [](Bytes& b) { patch<uint64_t>(b, info_at(b, "blk.0.attn_q.weight").dims + 8, 0); },
       "dimension 1 = 0"},
      {"dims overflow",
       [](Bytes& b) {
         patch<uint64_t>(b, info_at(b, "blk.0.attn_q.weight").dims + 8, 1ull << 62);
       },
       "overflows"},
      {"block multiple",
       [](Bytes& b) { patch<uint64_t>(b, info_at(b, "blk.0.attn_q.weight").dims, 48); },
       "whole number of q4_1 blocks"},
      {"tensor type",
       [](Bytes& b) { patch<uint32_t>(b, info_at(b, "blk.0.attn_q.weight").type, 16); },
       "unsupported tensor type 16 (iq2_xxs)"},
      {"unaligned offset",
       [](Bytes& b) {
         size_t at = info_at(b, "output_norm.weight").offset;
         uint64_t off;
         std::memcpy(&off, b.data() + at, 8);
         patch<uint64_t>(b, at, off + 4);
       },
       "not a multiple of the alignment 32"},
      {"offset past end",
       [](Bytes& b) { patch<uint64_t>(b, info_at(b, "output_norm.weight").offset, 1ull << 20); },
       "outside the data section"},
      {"offset overflow",
       [](Bytes& b) { patch<uint64_t>(b, info_at(b, "output_norm.weight").offset, ~0ull - 31); },
       "outside the data section"},
      {"overlap",
       [](Bytes& b) { patch<uint64_t>(b, info_at(b, "output_norm.weight").offset, 0); },
       "overlap"},
      {"truncated", [](Bytes& b) { b.resize(b.size() - 300); }, "outside the data section"},
      {"truncated header", [](Bytes& b) { b.resize(100); }, "cannot fit in the 76 bytes"},
      {"empty", [](Bytes& b) { b.clear(); }, "truncated while reading the magic"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Bytes b = good;
    c.apply(b);
    std::string err = error_of(b);
    EXPECT_FALSE(err.empty());
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << "one line: " << err;
  }
}

TEST(Gguf, TruncatedInsideAValue) {
  GgufWriter w;
  w.set("general.name", V::string("a fairly long model name, longer than fourteen bytes"));
  Bytes b = *w.to_bytes();
  b.resize(find(b, "a fairly") + 20);
  EXPECT_NE(error_of(b).find("metadata 'general.name' has length 52 but only 20 bytes remain"),
            std::string::npos)
      << error_of(b);
  b.resize(find(b, "general.name") + 14);  // inside the type field
  EXPECT_NE(error_of(b).find("truncated while reading the type of metadata 'general.name'"),
            std::string::npos)
      << error_of(b);
}

TEST(Gguf, DuplicateTensorNamesAndBadAlignment) {
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor("aaaa", TensorType::kF32, {4}, random_values(4, 1)).ok());
  ASSERT_TRUE(w.add_tensor("bbbb", TensorType::kF32, {4}, random_values(4, 2)).ok());
  EXPECT_FALSE(w.add_tensor("aaaa", TensorType::kF32, {4}, random_values(4, 2)).ok());
  w.set("general.alignment", V::u32(32));
  Bytes b = *w.to_bytes();
  Bytes dup = b;
  std::memcpy(dup.data() + find(dup, "bbbb"), "aaaa", 4);
  EXPECT_NE(error_of(dup).find("duplicate tensor 'aaaa'"), std::string::npos) << error_of(dup);

  Bytes al = b;
  patch<uint32_t>(al, find(al, "general.alignment") + 17 + 4, 48);
  EXPECT_NE(error_of(al).find("general.alignment 48 is not a power of two"), std::string::npos)
      << error_of(al);
  patch<uint32_t>(al, find(al, "general.alignment") + 17 + 4, 0);
  EXPECT_NE(error_of(al).find("not a power of two"), std::string::npos);
  patch<uint32_t>(al, find(al, "general.alignment") + 17, static_cast<uint32_t>(GgufValueType::kF32));
  EXPECT_NE(error_of(al).find("general.alignment has type f32"), std::string::npos) << error_of(al);

  w.set("general.alignment", V::u32(48));
  EXPECT_FALSE(w.to_bytes().ok());
}

TEST(Gguf, DeepNestingAndNonPrintableNames) {
  V v = V::i32_array({1});
  for (int d = 0; d < 9; ++d) v = V::array(GgufValueType::kArray, {v});
  GgufWriter w;
  w.set("deep", v);
  std::string err = error_of(*w.to_bytes());
  EXPECT_NE(err.find("nests arrays deeper than 8"), std::string::npos) << err;

  // A name printed in an error has its control bytes escaped.
  GgufWriter w3;
  w3.set(std::string("k\x02"), V::u32(1));
  w3.set(std::string("k\x03"), V::u32(1));
  Bytes b3 = *w3.to_bytes();
  b3[find(b3, "k\x03") + 1] = 2;
  err = error_of(b3);
  EXPECT_NE(err.find("'k\\x02'"), std::string::npos) << err;
}

TEST(Gguf, EveryTruncationFailsUnlessOnlyPaddingIsLost) {
  const Bytes good = make_bytes();
  GgufFile f = *GgufFile::parse(good);
  uint64_t data_end = 0;
  for (const GgufTensor& t : f.tensors())
    data_end = std::max(data_end, f.data_offset() + t.offset + t.size);
  for (size_t n = 0; n < good.size(); ++n) {
    Bytes b(good.begin(), good.begin() + static_cast<long>(n));
    bool ok = GgufFile::parse(b).ok();
    ASSERT_EQ(ok, n >= data_end) << "prefix of " << n << " bytes";
  }
}

TEST(Gguf, ArchitectureParamsAndMissingKeys) {
  Bytes b = make_bytes();
  GgufFile f = *GgufFile::parse(b);
  auto p = read_arch_params(f);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->arch, "llama");
  EXPECT_EQ(p->embedding_length, 64u);
  EXPECT_EQ(p->head_count, 4u);
  EXPECT_EQ(p->head_count_kv, 2u);
  EXPECT_EQ(p->head_dim, 16u);
  EXPECT_EQ(p->rope_dimension_count, 16u);
  EXPECT_EQ(p->rope_freq_base, 100000.0f);
  EXPECT_EQ(p->sliding_window, 0u);

  struct Case {
    const char* key;
    V value;
    bool erase;
    const char* expect;
  };
  const Case cases[] = {
      {"llama.feed_forward_length", V::u32(0), true, "'llama.feed_forward_length' is missing"},
      {"llama.block_count", V::u32(0), false, "'llama.block_count' is 0"},
      {"llama.attention.head_count_kv", V::u32(3), false, "does not divide"},
      {"llama.attention.layer_norm_rms_epsilon", V::string("x"), false, "expected f32"},
      {"llama.rope.dimension_count", V::u32(64), false, "at most the head dimension"},
      {"general.architecture", V::string("gpt2"), false, "'gpt2' is not supported"},
      {"general.architecture", V::u32(1), false, "expected string"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    GgufWriter w = make_writer(3, c.erase ? c.key : "");
    if (!c.erase) w.set(c.key, c.value);
    Bytes bb = *w.to_bytes();
    auto r = read_arch_params(*GgufFile::parse(bb));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find(c.expect), std::string::npos) << r.message();
  }
}

TEST(Gguf, Gemma2AndQwen2Defaults) {
  for (std::string arch : {"gemma2", "qwen2"}) {
    GgufWriter w;
    w.set("general.architecture", V::string(arch));
    for (const char* k : {"context_length", "embedding_length", "block_count",
                          "feed_forward_length", "attention.head_count"})
      w.set(arch + "." + k, V::u32(k == std::string("embedding_length") ? 128 : 8));
    w.set(arch + ".attention.layer_norm_rms_epsilon", V::f32(1e-6f));
    Bytes b = *w.to_bytes();
    auto p = read_arch_params(*GgufFile::parse(b));
    ASSERT_TRUE(p.ok()) << p.message();
    EXPECT_EQ(p->head_dim, 16u);
    if (arch == "gemma2") {
      EXPECT_EQ(p->attn_logit_softcap, 50.0f);
      EXPECT_EQ(p->final_logit_softcap, 30.0f);
      EXPECT_EQ(p->sliding_window, 4096u);
    } else {
      EXPECT_EQ(p->attn_logit_softcap, 0.0f);
      EXPECT_EQ(p->sliding_window, 0u);
    }
  }
}

TEST(Gguf, AtomicWriteAndOpen) {
  auto dir = std::filesystem::temp_directory_path() / ("escala_gguf_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "model.gguf").string();
  GgufWriter w = make_writer();
  ASSERT_TRUE(w.write(path).ok());
  ASSERT_TRUE(w.write(path).ok());  // replacing an existing file
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) (void)e, ++entries;
  EXPECT_EQ(entries, 1) << "no temp files left behind";
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->file_size(), w.to_bytes()->size());

  auto missing = GgufFile::open((dir / "nope.gguf").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("cannot open"), std::string::npos);
  EXPECT_FALSE(GgufFile::open(dir.string()).ok());  // a directory
  std::ofstream(dir / "empty.gguf").close();
  auto empty = GgufFile::open((dir / "empty.gguf").string());
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.message().find("empty"), std::string::npos);
  EXPECT_FALSE(w.write((dir / "no" / "such" / "dir.gguf").string()).ok());
  std::filesystem::remove_all(dir);
}

// release_pages drops a tensor's resident pages from the mapping; its bytes read back unchanged
// (from the file), and its neighbours are untouched.
TEST(Gguf, ReleasedPagesReadBackUnchanged) {
  auto dir = std::filesystem::temp_directory_path() / ("escala_gguf_rel_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.gguf").string();
  GgufWriter w = make_writer();
  ASSERT_TRUE(w.add_tensor("blk.0.ffn_down.weight", TensorType::kQ8_0, {1024, 64}, random_values(64 * 1024, 9)).ok());
  ASSERT_TRUE(w.write(path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.message();
  std::vector<std::vector<uint8_t>> before;
  for (const GgufTensor& t : f->tensors()) before.emplace_back(t.data, t.data + t.size);
  for (const GgufTensor& t : f->tensors()) f->release_pages(t);
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const GgufTensor& t = f->tensors()[i];
    EXPECT_TRUE(std::equal(t.data, t.data + t.size, before[i].begin())) << t.name;
  }
  std::filesystem::remove_all(dir);
}

// Random byte flips, truncations and length-field corruptions of a valid file: the reader
// returns an error or a valid file, never crashes (run under ASan/UBSan in the sanitizer build).
TEST(Gguf, MutationFuzzNeverCrashes) {
  GgufWriter w1 = make_writer(2);
  w1.set("general.alignment", V::u32(1));  // tensors at odd offsets
  const Bytes goods[] = {make_bytes(), *w1.to_bytes()};
  std::mt19937_64 rng(1234);
  const uint64_t interesting[] = {0, 1, 2, 31, 32, 255, 65535, 65536, 1ull << 31, 1ull << 32,
                                  (1ull << 63) - 1, 1ull << 63, ~0ull, ~0ull - 7, 4000, 5000};
  // 30000 mutations (about a second in a release build); a time cap keeps sanitizer builds,
  // which are ~50x slower, within a few seconds too.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int runs = 0, parsed = 0;
  while (runs < 30000 && std::chrono::steady_clock::now() < deadline) {
    Bytes b = goods[runs % 2];
    int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_mut; ++k) {
      switch (rng() % 4) {
        case 0: b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: b[rng() % b.size()] = static_cast<uint8_t>(rng()); break;
        case 2: {  // an 8- or 4-byte field overwritten with an interesting value
          uint64_t v = interesting[rng() % std::size(interesting)];
          size_t at = rng() % (b.size() - 8);
          if (rng() % 2) patch<uint64_t>(b, at, v);
          else patch<uint32_t>(b, at, static_cast<uint32_t>(v));
          break;
        }
        case 3: b.resize(rng() % b.size()); break;
      }
      if (b.size() < 16) break;
    }
    auto r = GgufFile::parse(b);
    ++runs;
    if (!r.ok()) continue;
    ++parsed;
    // Touch everything a valid file promises: tensor bytes and metadata.
    uint64_t sum = 0;
    for (const GgufTensor& t : r->tensors()) {
      for (uint64_t i = 0; i < t.size; i += 64) sum += t.data[i];
      std::vector<float> row(static_cast<size_t>(t.ne[0]));
      dequantize_row(t.type, t.data, row.data(), t.ne[0]);
    }
    for (const auto& [k, v] : r->metadata()) {
      sum += k.size() + v.str.size();
      (void)r->get_string_array(k);
      (void)r->get_int_array(k);
      (void)r->get_f32_array(k);
    }
    (void)read_arch_params(*r);
    EXPECT_GE(sum, 0u);
  }
  EXPECT_GT(runs, 200);
  RecordProperty("runs", runs);
  std::printf("mutation fuzz: %d runs, %d parsed as valid\n", runs, parsed);
}

// The real default model, when `models/` has it (never committed).
TEST(Gguf, ReadsSmolLM2WhenPresent) {
  std::string src = __FILE__;
  std::string root = src.substr(0, src.rfind("tests/unit/"));
  std::string path = root + "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " absent";
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 272u);
  auto p = read_arch_params(*f);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->block_count, 30u);
  EXPECT_EQ(p->embedding_length, 576u);
  EXPECT_EQ(p->head_count, 9u);
  EXPECT_EQ(p->head_count_kv, 3u);
  EXPECT_EQ(p->head_dim, 64u);
  EXPECT_EQ(p->feed_forward_length, 1536u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(*f->get_string("tokenizer.ggml.pre"), "smollm");
  const GgufTensor* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, TensorType::kQ8_0);
  const GgufTensor* up = f->find_tensor("blk.0.ffn_up.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->type, TensorType::kQ4_1);
  // Weights look like weights: finite and small.
  WeightView w = up->as_matrix();
  std::vector<float> row(576);
  double sq = 0;
  for (int64_t r = 0; r < w.rows; r += 97) {
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * static_cast<int64_t>(w.row_stride), row.data(), 576);
    for (float v : row) {
      ASSERT_TRUE(std::isfinite(v));
      sq += double(v) * v;
    }
  }
  EXPECT_GT(sq, 0.0);
  // The fast product agrees with the reference on the real weights, within the bound of the
  // 8-bit activation rounding (see matmul_test.cpp).
  std::vector<float> x(576), y(1536), ref(1536), wrow(576);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  ASSERT_TRUE(matvec(w, x.data(), y.data()).ok());
  matmul_reference(w, x.data(), 1, ref.data());
  for (int r = 0; r < 1536; ++r) {
    dequantize_row(w.type, static_cast<const uint8_t*>(w.data) + r * static_cast<int64_t>(w.row_stride), wrow.data(), 576);
    double bound = 0;
    for (int b0 = 0; b0 < 576; b0 += 32) {
      float amax = 0;
      for (int i = b0; i < b0 + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (int i = b0; i < b0 + 32; ++i) bound += std::fabs(wrow[i]) * (amax / 127.0 / 2 + 1e-5 * std::fabs(x[i]));
    }
    EXPECT_LE(std::fabs(y[r] - ref[r]), bound) << r;
  }
}

}  // namespace
}  // namespace escala::model
