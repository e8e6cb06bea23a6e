// `escala bench attention`: CPU attention throughput next to the machine's own ceilings, all
// measured in the same run. Prefill is reported in GFLOP/s (visible scores only), decode in GB/s
// of K/V read (each K/V row once per GQA group).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/ceilings.h"
#include "bench/timing.h"
#include "commands.h"
#include "common/numeric.h"
#include "escala/attention.h"

namespace escala::cli {
namespace {

struct Problem {
  int h, h_kv, d, q_len, kv_len, batch = 1;
  DType q_dtype = DType::kBF16, kv_dtype = DType::kBF16;
  bool causal = false;
  int page_size = 0;
};

// Owns random inputs for a problem; K/V stored contiguous or as randomly permuted pages.
struct Inputs {
  Problem pr;
  std::vector<uint8_t> q, k, v;
  std::vector<float> o, k_scale, v_scale;
  std::vector<int32_t> cu_q, cu_k, indptr, pages;

  explicit Inputs(const Problem& p, std::mt19937& rng) : pr(p) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t tq = int64_t(p.batch) * p.q_len, tk = int64_t(p.batch) * p.kv_len;
    q.resize(size_t(tq) * p.h * p.d * 2);
    for (size_t i = 0; i < q.size() / 2; ++i) reinterpret_cast<uint16_t*>(q.data())[i] = f32_to_bf16(u(rng));
    const size_t kv_elems = size_t(tk) * p.h_kv * p.d;
    const size_t eb = dtype_size(p.kv_dtype);
    k.resize(kv_elems * eb);
    v.resize(kv_elems * eb);
    for (auto* buf : {&k, &v})
      for (size_t i = 0; i < kv_elems; ++i) {
        const float x = u(rng);
        if (eb == 2) reinterpret_cast<uint16_t*>(buf->data())[i] = f32_to_bf16(x);
        else if (p.kv_dtype == DType::kI8) reinterpret_cast<int8_t*>(buf->data())[i] = int8_t(x * 127);
        else (*buf)[i] = f32_to_fp8e4m3(x * 400);
      }
    if (is_quantized(p.kv_dtype)) {
      const size_t n = p.kv_dtype == DType::kI8 ? size_t(tk) * p.h_kv : size_t(tk / std::max(1, p.page_size)) * p.h_kv;
      k_scale.assign(n, 1.0f / 127);
      v_scale.assign(n, 1.0f / 127);
    }
    o.resize(size_t(tq) * p.h * p.d);
    for (int b = 0; b <= p.batch; ++b) {
      cu_q.push_back(b * p.q_len);
      cu_k.push_back(b * p.kv_len);
    }
    if (p.page_size > 0) {
      pages.resize(size_t(tk / p.page_size));
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), rng);
      for (int b = 0; b <= p.batch; ++b) indptr.push_back(b * (p.kv_len / p.page_size));
    }
  }

  attn::AttentionParams params() {
    attn::AttentionParams a;
    a.q = q.data(); a.k = k.data(); a.v = v.data(); a.o = o.data();
    a.q_dtype = pr.q_dtype; a.kv_dtype = pr.kv_dtype; a.o_dtype = DType::kF32;
    a.q_head_stride = a.o_head_stride = pr.d;
    a.q_row_stride = a.o_row_stride = int64_t(pr.h) * pr.d;
    a.k_head_stride = a.v_head_stride = pr.d;
    a.k_row_stride = a.v_row_stride = int64_t(pr.h_kv) * pr.d;
    a.batch = pr.batch;
    a.cu_seqlens_q = cu_q.data(); a.cu_seqlens_k = cu_k.data();
    a.num_heads = pr.h; a.num_kv_heads = pr.h_kv; a.head_dim = pr.d;
    a.causal = pr.causal;
    if (pr.page_size > 0) {
      a.page_size = pr.page_size;
      a.page_indptr = indptr.data(); a.page_indices = pages.data();
      a.k_page_stride = a.v_page_stride = int64_t(pr.page_size) * a.k_row_stride;
    }
    if (is_quantized(pr.kv_dtype)) { a.k_scale = k_scale.data(); a.v_scale = v_scale.data(); }
    return a;
  }
};

using bench::median_seconds;
using bench::median_times;

// FLOPs of the visible scores: 2*d for QK and 2*d for PV per visible (query, key) pair.
double prefill_flops(const Problem& p) {
  double pairs = 0;
  for (int i = 0; i < p.q_len; ++i) pairs += p.causal ? std::min(p.kv_len, i + p.kv_len - p.q_len + 1) : p.kv_len;
  return pairs * p.batch * p.h * 4.0 * p.d;
}

double decode_bytes(const Problem& p) {
  double per_elem = double(dtype_size(p.kv_dtype));
  double bytes = 2.0 * p.batch * p.kv_len * p.h_kv * p.d * per_elem;
  if (p.kv_dtype == DType::kI8) bytes += 2.0 * p.batch * p.kv_len * p.h_kv * 4;  // f32 scales
  return bytes;
}

void run_prefill(bool quick, int threads, const bench::Rate& peak, attn::CpuOptions opt, std::mt19937& rng) {
  const int T = quick ? 1024 : 4096;
  Problem pf{.h = 8, .h_kv = 8, .d = 128, .q_len = T, .kv_len = T, .causal = true};
  Inputs pin(pf, rng);
  opt.impl = attn::Impl::kFlash;
  auto pp = pin.params();
  const bench::Times t_flash = median_times(quick ? 3 : 5, threads, [&] { (void)attn::attention(pp, opt); });
  const double gflops = prefill_flops(pf) / t_flash.wall * 1e-9, gflops_cpu = prefill_flops(pf) / t_flash.cpu * 1e-9;
  // The reference is single-threaded and slow: time it on 1 head and scale by the head count.
  Problem pr1 = pf;
  pr1.h = pr1.h_kv = 1;
  Inputs rin(pr1, rng);
  auto rp = rin.params();
  attn::CpuOptions ropt = opt;
  ropt.impl = attn::Impl::kReference;
  const double t_ref = median_seconds(1, [&] { (void)attn::attention(rp, ropt); }) * pf.h;
  std::printf("prefill  T=%d d=128 h=8 causal bf16: %8.2f ms  %7.1f GFLOP/s  %5.1f%% of FMA peak  %6.1fx reference"
              "  | CPU clock: %7.1f GFLOP/s %5.1f%%\n",
              T, t_flash.wall * 1e3, gflops, 100 * gflops / peak.wall, t_ref / t_flash.wall, gflops_cpu,
              100 * gflops_cpu / peak.cpu);
}

// Decode: GQA 32/8, d 128, one query, contiguous bf16 / paged bf16 / paged int8 / paged fp8 /
// contiguous int8, timed in interleaved rounds. Ratios against contiguous bf16 on each line; the
// like-for-like int8/bf16 ratios (same layout) at the end.
void run_decode(bool quick, int threads, const bench::Rate& bw, attn::CpuOptions opt, std::mt19937& rng) {
  const int TK = quick ? 8192 : 32768;
  struct Variant { const char* name; DType kv; int page; };
  const Variant variants[] = {{"contiguous bf16", DType::kBF16, 0},
                              {"paged(16) bf16", DType::kBF16, 16},
                              {"paged(16) int8", DType::kI8, 16},
                              {"paged(16) fp8", DType::kFp8E4M3, 16},
                              {"contiguous int8", DType::kI8, 0}};
  constexpr int kBase = 0, kPaged = 1, kInt8Paged = 2, kInt8Contig = 4;
  std::vector<std::unique_ptr<Inputs>> inputs;
  std::vector<std::function<void()>> calls;
  opt.impl = attn::Impl::kDecode;
  for (const auto& var : variants) {
    const Problem pd{.h = 32, .h_kv = 8, .d = 128, .q_len = 1, .kv_len = TK, .kv_dtype = var.kv, .page_size = var.page};
    inputs.push_back(std::make_unique<Inputs>(pd, rng));
    calls.push_back([&, dp = inputs.back()->params()] { (void)attn::attention(dp, opt); });
  }
  const std::vector<bench::Times> t = bench::interleaved_median_times(quick ? 5 : 15, threads, calls);
  for (size_t i = 0; i < calls.size(); ++i) {
    const double bytes = decode_bytes(inputs[i]->pr), gbs = bytes / t[i].wall * 1e-9, gbs_cpu = bytes / t[i].cpu * 1e-9;
    std::printf("decode   T=%d GQA 32/8 d=128 %-16s %8.3f ms  %7.2f GB/s  %5.1f%% of read bandwidth  %5.2fx contiguous "
                "bf16 speed  | CPU clock: %7.2f GB/s %5.1f%% %5.2fx\n",
                TK, variants[i].name, t[i].wall * 1e3, gbs, 100 * gbs / bw.wall, t[kBase].wall / t[i].wall, gbs_cpu,
                100 * gbs_cpu / bw.cpu, t[kBase].cpu / t[i].cpu);
  }
  std::printf("\npaged/contiguous decode time: %.3f (CPU clock %.3f)\n", t[kPaged].wall / t[kBase].wall,
              t[kPaged].cpu / t[kBase].cpu);
  std::printf("int8 / bf16 speed, same layout: contiguous %.2fx, paged(16) %.2fx (CPU clock %.2fx, %.2fx)\n",
              t[kBase].wall / t[kInt8Contig].wall, t[kPaged].wall / t[kInt8Paged].wall,
              t[kBase].cpu / t[kInt8Contig].cpu, t[kPaged].cpu / t[kInt8Paged].cpu);
}

// `only`: "" (both), "prefill" or "decode".
int run_bench(bool quick, int threads_opt, const std::string& only) {
  const int threads = threads_opt > 0 ? threads_opt : omp_get_max_threads();
  std::mt19937 rng(std::random_device{}());
  const bench::Rate peak = bench::measure_fma_peak(threads, quick ? 0.2 : 1.0);
  const bench::Rate bw = bench::measure_read_bandwidth(threads, quick ? (size_t(256) << 20) : (size_t(1) << 30));
  std::printf("machine ceilings (%d threads): FMA peak %.1f GFLOP/s, read bandwidth %.2f GB/s\n", threads, peak.wall,
              bw.wall);
  std::printf("  per CPU second of each thread: FMA peak %.1f GFLOP/s, read bandwidth %.2f GB/s\n", peak.cpu, bw.cpu);
  std::printf("  (wall and CPU clocks agree on an idle machine; on a shared one the wall figures also count other\n"
              "   processes' time slices, the CPU ones still count spin waits at barriers: compare a kernel with\n"
              "   the ceilings of the same clock, and trust a quiet run)\n\n");
  attn::CpuOptions opt;
  opt.num_threads = threads;

  if (only != "decode") run_prefill(quick, threads, peak, opt, rng);
  if (only != "prefill") run_decode(quick, threads, bw, opt, rng);
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, int& exit_code) {
  auto* bench = app.add_subcommand("bench", "Benchmarks against the machine's own ceilings");
  bench->require_subcommand(1);
  auto* att = bench->add_subcommand("attention", "CPU prefill GFLOP/s and decode GB/s vs FMA peak and read bandwidth");
  static bool quick = false;
  static int threads = 0;
  att->add_flag("--quick", quick, "Smaller problems (for CI and set-up)");
  att->add_option("--threads", threads, "Threads (default: all)")->check(CLI::Range(0, 1024));
  static std::string only;
  att->add_option("--only", only, "Run only the prefill or only the decode part")
      ->check(CLI::IsMember({"prefill", "decode"}));
  att->callback([&exit_code] { exit_code = run_bench(quick, threads, only); });
}

}  // namespace escala::cli
