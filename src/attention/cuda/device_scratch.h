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

class DeviceScratch {
 public:
  // At least `bytes` of device memory; nullptr (and the error in `err`) when allocation fails.
  void* get(size_t bytes, cudaError_t& err) {
    std::lock_guard<std::mutex> lock(mu_);
    err = cudaSuccess;
    if (bytes > size_) {
      if (buf_) cudaFree(buf_);
      buf_ = nullptr, size_ = 0;
      err = cudaMalloc(&buf_, bytes);
      if (err != cudaSuccess) return nullptr;
      size_ = bytes;
    }
    return buf_;
  }

 private:
  std::mutex mu_;
  void* buf_ = nullptr;
  size_t size_ = 0;
};

// Device int32 counters that are zero whenever no kernel is running: zeroed once when (re)allocated,
// and every kernel that counts in them resets what it used (the decode kernel's in-place merge).
// Grown on demand and kept; growing is not capturable.
class ZeroedCounters {
 public:
  int32_t* get(size_t count, cudaError_t& err) {
    std::lock_guard<std::mutex> lock(mu_);
    err = cudaSuccess;
    if (count > count_) {
      if (buf_) cudaFree(buf_);
      buf_ = nullptr, count_ = 0;
      err = cudaMalloc(&buf_, count * sizeof(int32_t));
      if (err == cudaSuccess) err = cudaMemset(buf_, 0, count * sizeof(int32_t));
      if (err != cudaSuccess) {
        if (buf_) cudaFree(buf_);
        buf_ = nullptr;
        return nullptr;
      }
      count_ = count;
    }
    return buf_;
  }

 private:
  std::mutex mu_;
  int32_t* buf_ = nullptr;
  size_t count_ = 0;
};

// One device int32 per stream, kept: the prefill kernel's work counter (zeroed on the stream before
// each launch), so that launches on different streams never share one. The first use on a stream
// allocates (not capturable: callers that capture pass their own workspace).
class StreamCounters {
 public:
  int32_t* get(cudaStream_t stream, cudaError_t& err) {
    std::lock_guard<std::mutex> lock(mu_);
    err = cudaSuccess;
    int32_t*& c = counters_[stream];
    if (c == nullptr) {
      err = cudaMalloc(&c, sizeof(int32_t));
      if (err != cudaSuccess) c = nullptr;
    }
    return c;
  }

 private:
  std::mutex mu_;
  std::map<cudaStream_t, int32_t*> counters_;
};

}  // namespace escala::attn::cuda
