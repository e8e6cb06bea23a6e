// Wall-clock timing shared by the benchmark programs.
#pragma once

#include <algorithm>
#include <time.h>

#include <chrono>
#include <functional>
#include <vector>

namespace escala::bench {

// Median wall time of `runs` calls of `fn`, after one warm-up call.
inline double median_seconds(int runs, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// CPU time of the whole process (every thread), seconds.
inline double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Times {
  double wall, cpu;
};

// Median wall time and median CPU time per thread (process CPU time / threads) of `runs` calls of
// each function, after one warm-up call of each. On a shared machine the wall time also counts the
// time slices other processes got; the CPU time per thread counts only the time this benchmark's
// threads ran (spin waits included), so rates computed from it are comparable between a busy and a
// quiet moment. Several functions whose times are compared run in `runs` rounds that call each once
// in turn, so a slow stretch of the machine (another tenant, a frequency change) lands on all of
// them instead of on whichever was running.
inline std::vector<Times> interleaved_median_times(int runs, int threads, const std::vector<std::function<void()>>& fns) {
  for (const auto& fn : fns) fn();
  std::vector<std::vector<double>> w(fns.size()), c(fns.size());
  for (int i = 0; i < runs; ++i)
    for (size_t f = 0; f < fns.size(); ++f) {
      const double c0 = process_cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      fns[f]();
      w[f].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      c[f].push_back((process_cpu_seconds() - c0) / threads);
    }
  std::vector<Times> out;
  for (size_t f = 0; f < fns.size(); ++f) {
    std::sort(w[f].begin(), w[f].end());
    std::sort(c[f].begin(), c[f].end());
    out.push_back({w[f][w[f].size() / 2], c[f][c[f].size() / 2]});
  }
  return out;
}
inline Times median_times(int runs, int threads, const std::function<void()>& fn) {
  return interleaved_median_times(runs, threads, {fn})[0];
}

}  // namespace escala::bench
