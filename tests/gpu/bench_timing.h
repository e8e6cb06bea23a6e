// Timing of the GPU benchmark modes (--bench, --bench-decode, --bench-read), the same protocol as
// the peers' in bench/cuda_timing.py:
// - a warm-up of at least `warmup_s` seconds of calls, so that each shape is timed at the clocks its
//   own load settles to: the H200's power controller keeps the lower clocks of a heavy predecessor
//   for a few hundred ms (2026-11-30: SmolLM2's decode read 61 us when timed right after fp8
//   128 x 32k, 55 us when timed again);
// - samples of `inner` back-to-back calls replayed from one CUDA graph, so that no host launch cost
//   sits between calls (PyTorch's SDPA spends ~60 us of host time per call on that machine, which
//   floored its decode calls at 60 us whatever their length).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gpu_util.h"

namespace escala::gputest {

struct BenchTiming {
  bool graph = true;       // --eager: launch each call from the host instead
  double warmup_s = 0.25;  // --warmup S
  int inner = 10;          // --inner N: calls per sample

  // Consumes the timing flags at argv[i] (advancing i past a value); false if argv[i] is not one.
  bool parse_flag(int argc, char** argv, int& i) {
    const std::string a = argv[i];
    if (a == "--eager") return graph = false, true;
    if (a == "--warmup" && i + 1 < argc) return warmup_s = std::max(0.0, std::atof(argv[++i])), true;
    if (a == "--inner" && i + 1 < argc) return inner = std::max(1, std::atoi(argv[++i])), true;
    return false;
  }
};

// The benchmark modes' command line: [--reps N] [timing flags] [the mode's own flags] SPEC...
// `extra(argc, argv, i)` takes a mode's own flag at argv[i] (true if it did, advancing i past a
// value); `parse(text, spec)` reads one SPEC. False, after a one-line error, on a SPEC it cannot read.
template <class Spec, class Extra, class Parse>
bool parse_bench_args(int argc, char** argv, const char* what, int& reps, BenchTiming& timing, std::vector<Spec>& specs,
                      Extra&& extra, Parse&& parse) {
  for (int i = 0; i < argc; ++i) {
    if (timing.parse_flag(argc, argv, i) || extra(argc, argv, i)) continue;
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
      continue;
    }
    Spec s;
    if (!parse(a, s)) {
      std::fprintf(stderr, "bad %s spec: %s\n", what, a.c_str());
      return false;
    }
    specs.push_back(s);
  }
  return true;
}

struct CallTime {
  bool ok = false;  // false: a call failed
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Milliseconds per call of `launch(stream)` (which returns false when the call failed) over `reps`
// samples.
template <class F>
CallTime time_calls(F&& launch, cudaStream_t stream, int reps, const BenchTiming& t) {
  const int inner = std::max(1, t.inner);
  const auto start = std::chrono::steady_clock::now();
  for (int calls = 0; calls < 3 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < t.warmup_s;) {
    for (int k = 0; k < inner; ++k, ++calls)
      if (!launch(stream)) return {};
    GPU_CHECK(cudaStreamSynchronize(stream));
  }
  cudaGraphExec_t exec = nullptr;
  if (t.graph) {
    cudaGraph_t graph;
    GPU_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    bool ok = true;
    for (int k = 0; k < inner && ok; ++k) ok = launch(stream);
    GPU_CHECK(cudaStreamEndCapture(stream, &graph));
    if (!ok) {
      cudaGraphDestroy(graph);
      return {};
    }
    GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    GPU_CHECK(cudaGraphDestroy(graph));
    GPU_CHECK(cudaGraphLaunch(exec, stream));  // the graph's first launch uploads it
  }
  cudaEvent_t e0, e1;
  GPU_CHECK(cudaEventCreate(&e0));
  GPU_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int r = 0; r < std::max(1, reps); ++r) {
    GPU_CHECK(cudaEventRecord(e0, stream));
    if (exec) {
      GPU_CHECK(cudaGraphLaunch(exec, stream));
    } else {
      for (int k = 0; k < inner; ++k) launch(stream);
    }
    GPU_CHECK(cudaEventRecord(e1, stream));
    GPU_CHECK(cudaEventSynchronize(e1));
    float x = 0;
    GPU_CHECK(cudaEventElapsedTime(&x, e0, e1));
    ms.push_back(x / inner);
  }
  GPU_CHECK(cudaEventDestroy(e0));
  GPU_CHECK(cudaEventDestroy(e1));
  if (exec) GPU_CHECK(cudaGraphExecDestroy(exec));
  std::sort(ms.begin(), ms.end());
  return {true, ms[ms.size() / 2], ms.front(), ms.back()};
}

}  // namespace escala::gputest
