// main() of the GPU test binary: exits 77 (ctest: skipped) where no CUDA device is present;
// `escala_gpu_tests --bench SPEC...` runs the prefill benchmark instead of the tests,
// `--bench-decode SPEC...` the decode benchmark, `--bench-read` the read-bandwidth ceiling,
// `--bench-stream SPEC...` K/V streamed in decode-shaped requests without math (stream_bench.cu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

namespace escala::gputest {
int run_bench(int argc, char** argv);
int run_decode_bench(int argc, char** argv);
int run_read_bench(int argc, char** argv);
int run_stream_bench(int argc, char** argv);
}

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  if (argc > 1 && std::strcmp(argv[1], "--bench") == 0) return escala::gputest::run_bench(argc - 2, argv + 2);
  if (argc > 1 && std::strcmp(argv[1], "--bench-decode") == 0)
    return escala::gputest::run_decode_bench(argc - 2, argv + 2);
  if (argc > 1 && std::strcmp(argv[1], "--bench-read") == 0) return escala::gputest::run_read_bench(argc - 2, argv + 2);
  if (argc > 1 && std::strcmp(argv[1], "--bench-stream") == 0)
    return escala::gputest::run_stream_bench(argc - 2, argv + 2);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
