// Quantized matvec microbenchmark (developer tool): GB/s of weights streamed and GFLOP/s of
// y = W x for each weight type at SmolLM2-135M's shapes and at 4096 x 4096, next to this
// machine's read bandwidth measured in the same run.
//
//   escala_model_matmul_bench [--threads N] [--min-ms MS] [--batch M] [--portable] [--gguf-rows]
//
// --portable turns off the AVX-512 VNNI kernels so the Highway (SSE4/AVX2/AVX-512) ones run.
// q4_0/q4_1/q8_0 weights are stored in the VNNI layout first, as Model does; --gguf-rows reads
// the GGUF rows instead (transposed per call). GOPS = GFLOP/s: 2 operations per multiply-add.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "escala/quant.h"

namespace escala::model {
// src/model/quant_matmul_internal.h
void set_vnni_enabled(bool enabled);
bool store_weight(const WeightView& w);
void release_stored(const void* data);
}

namespace {

using escala::model::TensorType;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t rows, cols;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best-of timing: repeat until min_ms has passed, report the fastest call.
template <class Fn>
double best_seconds(Fn fn, double min_ms) {
  fn();  // warm caches and the thread pool
  double best = 1e30;
  auto start = Clock::now();
  int reps = 0;
  while (seconds_since(start) * 1e3 < min_ms || reps < 5) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
    ++reps;
  }
  return best;
}

// The machine's read bandwidth with all threads: a sum over 512 MiB.
double read_bandwidth_gbs(int threads) {
  const size_t n = (512ull << 20) / 8;
  std::vector<uint64_t> buf(n);
#pragma omp parallel for num_threads(threads)
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  volatile uint64_t sink = 0;
  double t = best_seconds(
      [&] {
        uint64_t s = 0;
#pragma omp parallel for reduction(+ : s) num_threads(threads)
        for (size_t i = 0; i < n; ++i) s += buf[i];
        sink = sink + s;
      },
      300);
  return static_cast<double>(n * 8) / t / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  double min_ms = 200;
  int64_t batch = 1;
  bool stored = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--min-ms" && i + 1 < argc) min_ms = std::atof(argv[++i]);
    else if (a == "--batch" && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (a == "--portable") escala::model::set_vnni_enabled(false);
    else if (a == "--gguf-rows") stored = false;
    else {
      std::fprintf(stderr, "usage: %s [--threads N] [--min-ms MS] [--batch M] [--portable] [--gguf-rows]\n", argv[0]);
      return 2;
    }
  }
  const Shape shapes[] = {
      {"smollm attn_k/v", 192, 576},  {"smollm attn_q/o", 576, 576},
      {"smollm ffn_gate/up", 1536, 576}, {"smollm ffn_down", 576, 1536},
      {"smollm output", 49152, 576},  {"4096x4096", 4096, 4096},
  };
  const TensorType types[] = {TensorType::kQ4_1, TensorType::kQ4_0, TensorType::kQ8_0,
                              TensorType::kQ4_K, TensorType::kQ6_K, TensorType::kF16,
                              TensorType::kF32};
  std::printf("threads %d, batch %lld, %s, read bandwidth (sum over 512 MiB): %.1f GB/s\n", threads,
              static_cast<long long>(batch), stored ? "stored weights" : "GGUF rows",
              read_bandwidth_gbs(threads));
  std::printf("%-20s %-6s %12s %10s %10s %10s\n", "shape", "type", "weights KiB", "us/call",
              "GB/s", "GFLOP/s");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const Shape& s : shapes) {
    std::vector<float> x(static_cast<size_t>(batch * s.cols));
    for (float& v : x) v = normal(rng) * 20;
    std::vector<float> y(static_cast<size_t>(batch * s.rows));
    for (TensorType t : types) {
      auto rb = escala::model::row_bytes(t, s.cols);
      if (!rb) {
        std::printf("%-20s %-6s %12s\n", s.name,
                    std::string(escala::model::tensor_type_name(t)).c_str(),
                    "(cols not a multiple of the block)");
        continue;
      }
      std::vector<float> row(static_cast<size_t>(s.cols));
      std::vector<uint8_t> w(*rb * static_cast<uint64_t>(s.rows));
      for (int64_t r = 0; r < s.rows; ++r) {
        for (float& v : row) v = normal(rng);
        escala::model::quantize_row(t, row.data(), w.data() + r * static_cast<int64_t>(*rb), s.cols);
      }
      escala::model::WeightView view{.type = t, .data = w.data(), .rows = s.rows, .cols = s.cols,
                                     .row_stride = *rb};
      const bool kept = stored && escala::model::store_weight(view);
      double sec = best_seconds(
          [&] { (void)escala::model::matmul(view, x.data(), batch, y.data(), threads); }, min_ms);
      if (kept) escala::model::release_stored(view.data);
      double bytes = static_cast<double>(w.size());
      double flops = 2.0 * static_cast<double>(s.rows * s.cols * batch);
      std::printf("%-20s %-6s %12.1f %10.1f %10.2f %10.2f\n", s.name,
                  std::string(escala::model::tensor_type_name(t)).c_str(), bytes / 1024, sec * 1e6,
                  bytes / sec / 1e9, flops / sec / 1e9);
    }
  }
  return 0;
}
