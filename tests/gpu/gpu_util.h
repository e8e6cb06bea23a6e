// Helpers for the GPU tests and the GPU benchmark mode: checked CUDA calls, a device buffer,
// random half-precision data.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/numeric.h"
#include "escala/dtype.h"

namespace escala::gputest {

#define GPU_CHECK(expr)                                                                              \
  do {                                                                                               \
    cudaError_t _e = (expr);                                                                         \
    if (_e != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
      std::abort();                                                                                  \
    }                                                                                                \
  } while (0)

// Owns one device allocation (setup only, never in a timed region).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) GPU_CHECK(cudaMalloc(&ptr_, bytes_));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  template <class T>
  void upload(const std::vector<T>& v) {
    GPU_CHECK(cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  template <class T>
  void download(std::vector<T>& v) const {
    GPU_CHECK(cudaMemcpy(v.data(), ptr_, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Half-precision storage bits of normally distributed values (never zeros).
inline std::vector<uint16_t> random_half(size_t n, DType t, uint64_t seed, float stddev = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    const float f = dist(rng);
    x = t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
  }
  return v;
}

// Cheap uniform(-1, 1) half bits for large benchmark inputs (xorshift; never exactly zero).
inline void fast_random_half(uint16_t* v, size_t n, DType t, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float f = (static_cast<float>(s >> 40) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
    v[i] = t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
  }
}

// A benchmark spec "name,key=value,...": sets `name`, then calls field(key, value) for each pair.
// False when the spec is empty, a pair has no '=', or `field` rejects a pair.
template <class Field>
bool parse_spec(const std::string& spec, std::string& name, Field&& field) {
  std::stringstream ss(spec);
  std::string tok;
  if (!std::getline(ss, name, ',')) return false;
  while (std::getline(ss, tok, ',')) {
    const auto eq = tok.find('=');
    if (eq == std::string::npos || !field(tok.substr(0, eq), tok.substr(eq + 1))) return false;
  }
  return true;
}

inline float half_to_float(uint16_t h, DType t) { return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h); }

}  // namespace escala::gputest
