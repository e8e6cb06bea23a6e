// The machine's own ceilings, measured in the same run as a benchmark: an FMA peak loop on all
// threads and a streaming read of a large buffer.
#pragma once
#include <cstddef>

namespace escala::bench {
// f32 FMA throughput of `threads` threads (2 FLOPs per lane per FMA), GFLOP/s.
double measure_fma_peak_gflops(int threads, double seconds = 0.5);
// Read bandwidth of a `bytes`-sized buffer summed by `threads` threads, GB/s (1e9 bytes).
double measure_read_bandwidth_gbs(int threads, size_t bytes, int repeats = 5);
}  // namespace escala::bench
