// Writes a seed corpus for the GGUF fuzzer: small valid files covering every metadata value
// type, nested arrays, every tensor type and a few alignments.
//
//   escala_gguf_fuzz_seed DIR
#include <cstdio>
#include <string>
#include <vector>

#include "escala/gguf.h"

int main(int argc, char** argv) {
  using namespace escala::model;
  using V = GgufWriteValue;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
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
      if (!w.add_tensor("w", t, {256, 2}, values).ok()) return 1;
      if (!w.add_tensor("b", TensorType::kF32, {4}, std::vector<float>(4, 1.0f)).ok()) return 1;
      auto s = w.write(dir + "/seed_" + std::to_string(n++) + ".gguf");
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.message().c_str());
        return 1;
      }
    }
  }
  std::printf("wrote %d seed files to %s\n", n, dir.c_str());
  return 0;
}
