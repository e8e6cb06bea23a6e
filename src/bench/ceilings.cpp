// Ceiling measurements with the widest SIMD the machine offers (Highway dynamic dispatch).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/ceilings.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "bench/ceilings.h"
#include "bench/timing.h"
#include "hwy/aligned_allocator.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace escala::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 independent FMA chains: enough to cover FMA latency x ports on current x86 cores. The chains
// start from different values: with equal starting values the compiler proved them identical and
// kept one chain, so the loop ran one FMA per FMA latency (4 cycles) while 12 were counted, a
// "peak" 1.5x the real one (2 FMAs per cycle) on this machine.
HWY_ATTR Rate FmaPeakImpl(int threads, double seconds) {
  const hn::ScalableTag<float> df;
  const double lanes = double(hn::Lanes(df));
  constexpr int kIters = 1 << 20;
  double total_flops = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = process_cpu_seconds();
  double elapsed = 0;
  int rounds = 0;
  float sink = 0;
  while (elapsed < seconds || rounds < 2) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      // Starting values the compiler cannot see (the thread number) and all different.
      const float t = float(omp_get_thread_num());
      auto a0 = hn::Set(df, 1.00f + t), a1 = hn::Set(df, 1.01f + t), a2 = hn::Set(df, 1.02f + t),
           a3 = hn::Set(df, 1.03f + t), a4 = hn::Set(df, 1.04f + t), a5 = hn::Set(df, 1.05f + t),
           a6 = hn::Set(df, 1.06f + t), a7 = hn::Set(df, 1.07f + t), a8 = hn::Set(df, 1.08f + t),
           a9 = hn::Set(df, 1.09f + t), a10 = hn::Set(df, 1.10f + t), a11 = hn::Set(df, 1.11f + t);
      const auto x = hn::Set(df, 0.999999f), y = hn::Set(df, 1e-7f);
      for (int i = 0; i < kIters; ++i) {
        a0 = hn::MulAdd(a0, x, y); a1 = hn::MulAdd(a1, x, y); a2 = hn::MulAdd(a2, x, y);
        a3 = hn::MulAdd(a3, x, y); a4 = hn::MulAdd(a4, x, y); a5 = hn::MulAdd(a5, x, y);
        a6 = hn::MulAdd(a6, x, y); a7 = hn::MulAdd(a7, x, y); a8 = hn::MulAdd(a8, x, y);
        a9 = hn::MulAdd(a9, x, y); a10 = hn::MulAdd(a10, x, y); a11 = hn::MulAdd(a11, x, y);
      }
      auto s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
      s = hn::Add(s, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
      sink += hn::GetLane(s);
    }
    total_flops += double(threads) * kIters * 12 * lanes * 2;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++rounds;
  }
  if (sink == 12345.0f) total_flops += 1;  // keeps the loop alive
  const double cpu = (process_cpu_seconds() - c0) / threads;
  return {total_flops / elapsed * 1e-9, total_flops / cpu * 1e-9};
}

HWY_ATTR Rate ReadBandwidthImpl(int threads, size_t bytes, int repeats) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  const size_t n = bytes / sizeof(float) / (4 * L) * (4 * L);
  auto buf = hwy::AllocateAligned<float>(n);
  // First touch by the threads that read it later.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = float(i & 1023) * 1e-3f;
  std::vector<double> times, cpu_times;
  float sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
      auto s0 = hn::Zero(df), s1 = s0, s2 = s0, s3 = s0;
#pragma omp for schedule(static)
      for (size_t i = 0; i < n; i += 4 * L) {
        s0 = hn::Add(s0, hn::Load(df, buf.get() + i));
        s1 = hn::Add(s1, hn::Load(df, buf.get() + i + L));
        s2 = hn::Add(s2, hn::Load(df, buf.get() + i + 2 * L));
        s3 = hn::Add(s3, hn::Load(df, buf.get() + i + 3 * L));
      }
      sink += hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
    }
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu_times.push_back((process_cpu_seconds() - c0) / threads);
  }
  if (sink == 12345.0f) times.push_back(1);
  std::sort(times.begin(), times.end());
  std::sort(cpu_times.begin(), cpu_times.end());
  const double gb = double(n * sizeof(float)) * 1e-9;
  return {gb / times[times.size() / 2], gb / cpu_times[cpu_times.size() / 2]};
}

}  // namespace escala::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace escala::bench {
HWY_EXPORT(FmaPeakImpl);
HWY_EXPORT(ReadBandwidthImpl);
Rate measure_fma_peak(int threads, double seconds) { return HWY_DYNAMIC_DISPATCH(FmaPeakImpl)(threads, seconds); }
Rate measure_read_bandwidth(int threads, size_t bytes, int repeats) {
  return HWY_DYNAMIC_DISPATCH(ReadBandwidthImpl)(threads, bytes, repeats);
}
}  // namespace escala::bench
#endif
