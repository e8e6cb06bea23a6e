// A diagnostic timeline of the sm_90 prefill kernel, compiled only with ESCALA_SM90_TRACE defined
// (say `#define ESCALA_SM90_TRACE 1` at the top of one fwd_sm90_hd*.cu): the loader, the
// scheduler and the first two consumer warpgroups' first threads in the first kCtas CTAs record
// (event code, SM clock) pairs, and the launcher writes the last launch's events to the file named
// by ESCALA_SM90_TRACE_OUT, for bench/sm90_trace.py. The launcher synchronises to copy them, so
// run the benchmark with --eager (not from a CUDA graph). Without the macro every SM90_TRACE is
// empty and the kernels' SASS is unchanged.
#pragma once

#ifdef ESCALA_SM90_TRACE
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace escala::attn::cuda::sm90_trace {

// Streams per CTA: 0 the K/V loader, 1 and 2 the first two consumer warpgroups' first threads, 3 the
// scheduler.
constexpr int kCtas = 4, kStreams = 4, kEvents = 8192;
static __device__ unsigned long long g_events[kCtas * kStreams * kEvents];

struct Recorder {
  unsigned long long* out = nullptr;
  int n = 0;
  __device__ Recorder(int stream, bool on) {
    if (on && blockIdx.x < kCtas) out = g_events + (blockIdx.x * kStreams + stream) * kEvents;
  }
  __device__ void operator()(int code) {
    if (out != nullptr && n < kEvents) {
      long long t;
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
      out[n++] = static_cast<unsigned long long>(code) << 56 | (static_cast<unsigned long long>(t) & ((1ull << 56) - 1));
    }
  }
};

// Before a launch, on whatever stream it goes to: the device is idle around the zeroing.
inline void clear() {
  void* a = nullptr;
  cudaDeviceSynchronize();
  if (cudaGetSymbolAddress(&a, g_events) == cudaSuccess) cudaMemset(a, 0, sizeof(g_events));
  cudaDeviceSynchronize();
}

inline void dump() {
  const char* path = std::getenv("ESCALA_SM90_TRACE_OUT");
  if (path == nullptr) return;
  std::vector<unsigned long long> h(kCtas * kStreams * kEvents);
  cudaDeviceSynchronize();
  if (cudaMemcpyFromSymbol(h.data(), g_events, sizeof(g_events)) != cudaSuccess) return;
  if (FILE* f = std::fopen(path, "wb")) {
    std::fwrite(h.data(), sizeof(h[0]), h.size(), f);
    std::fclose(f);
  }
}

}  // namespace escala::attn::cuda::sm90_trace
#define SM90_TRACE_DECL(name, stream, on) ::escala::attn::cuda::sm90_trace::Recorder name(stream, on)
#define SM90_TRACE(name, code) name(code)
#else
#define SM90_TRACE_DECL(name, stream, on)
#define SM90_TRACE(name, code) ((void)0)
#endif
