// libFuzzer target for the .npy reader: any input must give an error that names the file, or an
// array whose data size matches its shape and dtype and which writes back and re-reads unchanged.
//
// Build and run (clang): see tests/fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "common/npy.h"

namespace {
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "npy fuzz: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace escala::npy;
  auto r = parse_npy(std::span<const uint8_t>(data, size), "fuzz.npy");
  if (!r.ok()) {
    if (r.message().rfind("fuzz.npy: ", 0) != 0) fail("error does not name the file");
    return 0;
  }
  const NpyArray& a = *r;
  if (a.data.size() != static_cast<size_t>(a.numel()) * npy_itemsize(a.dtype)) fail("data size != shape x itemsize");
  auto bytes = encode_npy(a);
  if (!bytes.ok()) fail("a parsed array does not encode");
  auto again = parse_npy(*bytes, "again.npy");
  if (!again.ok() || again->dtype != a.dtype || again->shape != a.shape || again->data != a.data)
    fail("write then read changed the array");
  return 0;
}
