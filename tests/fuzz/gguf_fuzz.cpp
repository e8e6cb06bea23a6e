// libFuzzer target for the GGUF reader: any input must give an error or a fully valid file
// whose tensors and metadata can be read without touching memory outside the input.
//
// Build and run (clang): see tests/fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "escala/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace escala::model;
  auto r = GgufFile::parse(std::span<const uint8_t>(data, size));
  if (!r.ok()) return 0;
  const GgufFile& f = *r;
  volatile uint64_t sink = 0;
  for (const GgufTensor& t : f.tensors()) {
    // The whole declared range must be readable (ASan checks it), and one row decodes.
    for (uint64_t i = 0; i < t.size; i += 61) sink = sink + t.data[i];
    if (t.size > 0) sink = sink + t.data[t.size - 1];
    if (t.ne[0] <= (1 << 16)) {
      std::vector<float> row(static_cast<size_t>(t.ne[0]));
      dequantize_row(t.type, t.data, row.data(), t.ne[0]);
    }
  }
  for (const auto& [key, v] : f.metadata()) {
    sink = sink + key.size() + v.str.size();
    (void)f.get_string_array(key);
    (void)f.get_int_array(key);
    (void)f.get_f32_array(key);
    (void)f.get_u32(key);
    (void)f.get_f32(key);
  }
  (void)read_arch_params(f);
  return 0;
}
