// Writes the fuzz targets' seed corpora, one folder each under DIR:
//  - gguf: small valid files covering every metadata value type, nested arrays, every tensor
//    type and a few alignments;
//  - npy: every dtype and header version, 0-d to 3-d;
//  - tokenizer: text in several scripts, digits, contractions, spaces and special tokens;
//  - protocol: valid and invalid completion and chat bodies (first byte: the endpoint).
//
//   escala_fuzz_seeds DIR
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/npy.h"
#include "escala/gguf.h"

namespace {

bool write_file(const std::string& path, const void* data, size_t size) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  return bool(f);
}

int write_gguf_seeds(const std::string& dir) {
  using namespace escala::model;
  using V = GgufWriteValue;
  int n = 0;
  for (uint32_t alignment : {32u, 1u, 64u}) {
    for (TensorType t : kAllTensorTypes) {
      GgufWriter w(alignment == 1 ? 2 : 3);
      w.set("general.architecture", V::string("llama"));
      w.set("general.alignment", V::u32(alignment));
      for (const char* k : {"llama.context_length", "llama.embedding_length", "llama.block_count",
                            "llama.feed_forward_length", "llama.attention.head_count"})
        w.set(k, V::u32(32));
      w.set("llama.attention.layer_norm_rms_epsilon", V::f32(1e-5f));
      w.set("a.i8", V::i8(-1));
      w.set("a.u16", V::u16(7));
      w.set("a.i64", V::i64(-7));
      w.set("a.f64", V::f64(2.5));
      w.set("a.bool", V::boolean(false));
      w.set("a.strs", V::string_array({"x", "yz"}));
      w.set("a.nested", V::array(GgufValueType::kArray, {V::i32_array({1}), V::i32_array({})}));
      std::vector<float> values(256 * 2);
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 17) - 8.0f;
      if (!w.add_tensor("w", t, {256, 2}, values).ok()) return -1;
      if (!w.add_tensor("b", TensorType::kF32, {4}, std::vector<float>(4, 1.0f)).ok()) return -1;
      auto s = w.write(dir + "/seed_" + std::to_string(n++) + ".gguf");
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.message().c_str());
        return -1;
      }
    }
  }
  return n;
}

int write_npy_seeds(const std::string& dir) {
  using namespace escala::npy;
  int n = 0;
  const std::vector<std::vector<int64_t>> shapes = {{}, {3}, {2, 5}, {2, 1, 3}, {0, 4}};
  for (NpyDType t : {NpyDType::kF32, NpyDType::kF16, NpyDType::kI32, NpyDType::kI8})
    for (int version = 1; version <= 3; ++version)
      for (const auto& shape : shapes) {
        NpyArray a;
        a.dtype = t;
        a.shape = shape;
        a.data.resize(static_cast<size_t>(a.numel()) * npy_itemsize(t));
        for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<uint8_t>(i * 37 + 11);
        auto bytes = encode_npy(a, version);
        if (!bytes.ok()) {
          std::fprintf(stderr, "%s\n", bytes.message().c_str());
          return -1;
        }
        if (!write_file(dir + "/seed_" + std::to_string(n++) + ".npy", bytes->data(), bytes->size())) return -1;
      }
  return n;
}

int write_text_seeds(const std::string& dir, const std::vector<std::string>& texts) {
  int n = 0;
  for (const std::string& t : texts)
    if (!write_file(dir + "/seed_" + std::to_string(n++), t.data(), t.size())) return -1;
  return n;
}

const std::vector<std::string> kTexts = {
    "hello world", "Hello, World! It's 2026: 12345 apples.", "  leading and trailing  ", "line\nbreak\r\n\ttab",
    "don't we'll I'M you've", "caf\xC3\xA9 \xC3\x9F \xCE\xA9 \xD0\xB6 \xE6\x9D\xB1\xE4\xBA\xAC \xED\x95\x9C",
    "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD emoji", "<|im_start|>user\nhi<|im_end|>",
    "<s>[INST] x [/INST]", "\xE2\x96\x81spm space", "bad \xFF\xC3 bytes", "x = f(a_b) + $y; // 3.14"};

// The first byte picks the endpoint (mod 4): /v1/completions, /v1/chat/completions, /tokenize,
// /detokenize.
const std::vector<std::string> kBodies = {
    std::string(1, '\0') + R"({"prompt": "Once upon a time", "max_tokens": 8})",
    std::string(1, '\0') + R"({"model": "fuzz-model", "prompt": [1, 2, 3], "temperature": 0.7, "top_p": 0.9, "seed": 5})",
    std::string(1, '\0') + R"({"prompt": ["one"], "stop": ["\n", "."], "stream": true, "stream_options": {"include_usage": true}})",
    std::string(1, '\0') + R"({"prompt": "x", "n": 2, "logprobs": true, "echo": false, "suffix": null})",
    std::string(1, '\0') + R"({"prompt": "x", "max_tokens": 100000, "top_k": 40, "min_p": 0.05, "ignore_eos": true})",
    "\1" + std::string(R"({"messages": [{"role": "user", "content": "Hi"}]})"),
    "\1" + std::string(R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": )"
                        R"([{"type": "text", "text": "Why?"}]}], "max_completion_tokens": 16})"),
    "\1" + std::string(R"({"messages": [{"role": "developer", "content": "x"}, {"role": "assistant", "content": "y"}],)"
                        R"( "presence_penalty": 1.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1})"),
    "\1" + std::string(R"({"messages": [], "tools": [{}], "response_format": {"type": "json_object"}})"),
    "\1" + std::string(R"({"messages": [{"role": "user", "content": "JSON"}], "response_format": {"type": "json_object"}})"),
    "\1" + std::string(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",)"
                        R"( "json_schema": {"name": "p", "schema": {"type": "object", "properties": {"a": {"enum": [1, "b"]},)"
                        R"( "c": {"anyOf": [{"$ref": "#/$defs/D"}, {"type": "null"}]}}, "required": ["a"],)"
                        R"( "$defs": {"D": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}}}}}})"),
    "\1" + std::string(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",)"
                        R"( "json_schema": {"schema": {"type": "object", "properties": {"s": {"type": "string", "minLength": 1,)"
                        R"( "maxLength": 8}, "n": {"type": "integer", "exclusiveMinimum": -1, "maximum": 99.5}}}}}})"),
    "\1" + std::string(R"({"messages": [{"role": "user", "content": "<|im_start|>"}], "logit_bias": {"1": 2}})"),
    "\1" + std::string(R"([[[[{"messages": null}]]]])"),
    "\1" + std::string(R"({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true, "top_logprobs": 5,)"
                        R"( "logit_bias": {"0": -100, "17": 3.5}})"),
    std::string(1, '\0') + R"({"prompt": "x", "logprobs": 3, "logit_bias": {"01": 1, "x": 2}})",
    "\2" + std::string(R"({"prompt": "Hello <|im_start|> world", "add_special_tokens": false})"),
    "\3" + std::string(R"({"tokens": [1, 2, 3, 0], "model": "fuzz-model"})"),
};

// JSON mode's recogniser: objects, and texts that are not.
const std::vector<std::string> kJson = {
    "{}", R"({"a": [1, -2.5e+3, 0, true, false, null, "x\n\u00e9\uD83D\uDE00"], "b": {"c": {}}})",
    "{\n  \"name\": \"John\",\n  \"age\": 45\n}", "{\"caf\xC3\xA9\": \"\xF0\x9F\x98\x80\"}",
    "[1, 2]", "{\"a\":01}", "{\"a\":\"\\uDC00\"}", "{} {}",
    // For the schemas with string lengths and integer bounds (json_fuzz.cpp).
    R"(["ab", -20, 300, "\ud83d\ude00\n", {"s": "xy", "n": -9223372036854775807}])",
    R"({"a": "", "b": 10, "c": -10, "d": "\u00e9\ud83d\ude00"})"};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  int total = 0;
  for (const char* target : {"gguf", "npy", "tokenizer", "protocol", "json"}) {
    const std::string dir = root + "/" + target;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::string t = target;
    const int n = t == "gguf"        ? write_gguf_seeds(dir)
                  : t == "npy"       ? write_npy_seeds(dir)
                  : t == "tokenizer" ? write_text_seeds(dir, kTexts)
                  : t == "json"      ? write_text_seeds(dir, kJson)
                                     : write_text_seeds(dir, kBodies);
    if (ec || n < 0) {
      std::fprintf(stderr, "%s: could not write the %s seeds\n", argv[0], target);
      return 1;
    }
    total += n;
  }
  std::printf("wrote %d seed files under %s\n", total, root.c_str());
  return 0;
}
