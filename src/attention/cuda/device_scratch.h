// A device buffer grown on demand and kept: the library's scratch for callers that pass none.
// Growing frees the old buffer (cudaFree waits for the work still using it), so it must not happen
// during stream capture: callers that capture pass their own workspace.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace escala::attn::cuda {

// With `zeroed`, every (re)allocation is zeroed and the kernels that use the buffer leave it zero
// again (the decode kernel's in-place merge counters), so it is zero whenever no kernel runs.
class DeviceScratch {
 public:
  explicit DeviceScratch(bool zeroed = false) : zeroed_(zeroed) {}

  // At least `bytes` of device memory; nullptr (and the error in `err`) when allocation fails.
  void* get(size_t bytes, cudaError_t& err) {
    std::lock_guard<std::mutex> lock(mu_);
    err = cudaSuccess;
    if (bytes > size_) {
      if (buf_) cudaFree(buf_);
      buf_ = nullptr, size_ = 0;
      err = cudaMalloc(&buf_, bytes);
      if (err == cudaSuccess && zeroed_) err = cudaMemset(buf_, 0, bytes);
      if (err != cudaSuccess) {
        if (buf_) cudaFree(buf_);
        buf_ = nullptr;
        return nullptr;
      }
      size_ = bytes;
    }
    return buf_;
  }

 private:
  const bool zeroed_;
  std::mutex mu_;
  void* buf_ = nullptr;
  size_t size_ = 0;
};

// A DeviceScratch per stream, so that calls on different streams (the cascade's two passes, or a
// caller's concurrent streams) never share split partials, merge or work counters, or the
// cascade's partial results. The first use on a stream allocates (not capturable).
class StreamScratch {
 public:
  explicit StreamScratch(bool zeroed = false) : zeroed_(zeroed) {}

  void* get(cudaStream_t stream, size_t bytes, cudaError_t& err) {
    DeviceScratch* s = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = &scratch_.try_emplace(stream, zeroed_).first->second;  // map nodes stay put
    }
    return s->get(bytes, err);
  }

 private:
  const bool zeroed_;
  std::mutex mu_;
  std::map<cudaStream_t, DeviceScratch> scratch_;
};

}  // namespace escala::attn::cuda
