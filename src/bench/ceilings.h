// The machine's own ceilings, measured in the same run as a benchmark: an FMA peak loop on all
// threads and a streaming read of a large buffer.
#pragma once
#include <cstddef>

namespace escala::bench {
// A rate by both clocks: per wall second, and per CPU second of each thread (see timing.h).
struct Rate {
  double wall, cpu;
};
// f32 FMA throughput of `threads` threads (2 FLOPs per lane per FMA), GFLOP/s.
Rate measure_fma_peak(int threads, double seconds = 0.5);
// Read bandwidth of a `bytes`-sized buffer summed by `threads` threads, GB/s (1e9 bytes); median
// of `repeats` passes by each clock.
Rate measure_read_bandwidth(int threads, size_t bytes, int repeats = 5);
inline double measure_fma_peak_gflops(int threads, double seconds = 0.5) { return measure_fma_peak(threads, seconds).wall; }
inline double measure_read_bandwidth_gbs(int threads, size_t bytes, int repeats = 5) {
  return measure_read_bandwidth(threads, bytes, repeats).wall;
}
}  // namespace escala::bench
