// Benchmark mode of the GPU test binary: `escala_gpu_tests --bench [--reps N] [--arch sm80|sm90] SPEC...` where SPEC is
// name,B=..,S=..[,Sk=..],h=..,hk=..,d=..[,dv=..][,causal=1][,wl=..][,wr=..][,sinks=..][,dtype=bf16|f16]
// [,rows=128|192] (the sm_90 kernel's query tile at d <= 64; default: its cost model) [,splits=N] (split-KV;
// default: the split rule) [,page=N] (K/V read through a block table of N-token pages, laid out in
// order: the same bytes as contiguous) [,lse=0] (O only, no LSE written; default: LSE written)
// [,tail=N] (the sm_90 work order's deferred partial tiles, Sm90Tuning::tail_pairs; default: automatic).
// [--eager] [--warmup S] [--inner N]. Fresh random inputs per shape (never zeros); timing in bench_timing.h
// (warm-up, samples of --inner calls, default 10, replayed from a CUDA graph; median of --reps).
// FLOPs = 2 * (d + dv) * (visible (query, key) pairs) * h * B: only pairs the mask lets through count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "attention/cuda/dispatch.h"
#include "attention/variant.h"
#include "bench_timing.h"
#include "escala/attention_cuda.h"
#include "gpu_util.h"

namespace escala::gputest {

namespace {

struct Shape {
  std::string name;
  int B = 1, S = 1024, Sk = 0, h = 16, hk = 16, d = 128, dv = 0, wl = -1, wr = -1, sinks = 0, rows = 0, splits = 0, page = 0,
      tail = -1;
  bool causal = false;
  bool lse = true;  // lse=0: O only, as PyTorch asks cuDNN for when no input needs a gradient
  DType dt = DType::kBF16;
};

bool parse_shape(const std::string& spec, Shape& s) {
  const bool ok = parse_spec(spec, s.name, [&s](const std::string& k, const std::string& v) {
    if (k == "dtype") {
      if (v != "bf16" && v != "f16") return false;
      s.dt = v == "bf16" ? DType::kBF16 : DType::kF16;
      return true;
    }
    const int x = std::atoi(v.c_str());
    if (k == "B") s.B = x;
    else if (k == "S") s.S = x;
    else if (k == "Sk") s.Sk = x;
    else if (k == "h") s.h = x;
    else if (k == "hk") s.hk = x;
    else if (k == "d") s.d = x;
    else if (k == "dv") s.dv = x;
    else if (k == "causal") s.causal = x != 0;
    else if (k == "wl") s.wl = x;
    else if (k == "wr") s.wr = x;
    else if (k == "sinks") s.sinks = x;
    else if (k == "rows") s.rows = x;
    else if (k == "tail") s.tail = x;
    else if (k == "splits") s.splits = x;
    else if (k == "page") s.page = x;
    else if (k == "lse") s.lse = x != 0;
    else return false;
    return true;
  });
  if (s.Sk == 0) s.Sk = s.S;
  if (s.dv == 0) s.dv = s.d;
  if (s.page < 0 || (s.page > 0 && s.Sk % s.page != 0)) return false;  // whole pages only
  return ok;
}

// Visible (query, key) pairs of one sequence, from the one Mask definition.
double visible_pairs(const attn::Mask& m, int64_t q_len, int64_t kv_len) {
  double pairs = 0;
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t qp = i + kv_len - q_len;
    const int64_t end = m.key_end(qp, kv_len), wb = m.window_begin(qp);
    const int64_t win = std::max<int64_t>(0, end - wb);
    const int64_t snk = std::max<int64_t>(0, std::min({static_cast<int64_t>(m.num_sinks), end, wb}));
    pairs += static_cast<double>(win + snk);
  }
  return pairs;
}

}  // namespace

int run_bench(int argc, char** argv) {
  int reps = 30;
  attn::cuda::KernelArch arch = attn::cuda::KernelArch::kAuto;
  BenchTiming timing;
  std::vector<Shape> shapes;
  auto arch_flag = [&arch](int n, char** args, int& i) {
    if (std::string(args[i]) != "--arch" || i + 1 >= n) return false;
    const std::string v = args[++i];
    arch = v == "sm80" ? attn::cuda::KernelArch::kSm80
                       : (v == "sm90" ? attn::cuda::KernelArch::kSm90 : attn::cuda::KernelArch::kAuto);
    return true;
  };
  if (!parse_bench_args(argc, argv, "shape", reps, timing, shapes, arch_flag, parse_shape)) return 2;
  cudaDeviceProp prop{};
  GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t stream;
  GPU_CHECK(cudaStreamCreate(&stream));
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    const int64_t tq = static_cast<int64_t>(s.B) * s.S, tk = static_cast<int64_t>(s.B) * s.Sk;
    const size_t nq = tq * s.h * s.d, nk = tk * s.hk * s.d, nv = tk * s.hk * s.dv, no = tq * s.h * s.dv;
    std::vector<uint16_t> host(std::max({nq, nk, nv}));
    DeviceBuffer dq(nq * 2), dk(nk * 2), dv(nv * 2), d_o(no * 2), dlse(tq * s.h * 4), dcq((s.B + 1) * 4),
        dck((s.B + 1) * 4);
    fast_random_half(host.data(), nq, s.dt, seed++);
    GPU_CHECK(cudaMemcpy(dq.get(), host.data(), nq * 2, cudaMemcpyHostToDevice));
    fast_random_half(host.data(), nk, s.dt, seed++);
    GPU_CHECK(cudaMemcpy(dk.get(), host.data(), nk * 2, cudaMemcpyHostToDevice));
    fast_random_half(host.data(), nv, s.dt, seed++);
    GPU_CHECK(cudaMemcpy(dv.get(), host.data(), nv * 2, cudaMemcpyHostToDevice));
    std::vector<int32_t> cu_q(s.B + 1), cu_k(s.B + 1);
    for (int b = 0; b <= s.B; ++b) cu_q[b] = b * s.S, cu_k[b] = b * s.Sk;
    dcq.upload(cu_q), dck.upload(cu_k);

    attn::AttentionParams p;
    p.q = dq.get(), p.k = dk.get(), p.v = dv.get(), p.o = d_o.get(), p.lse = s.lse ? dlse.get<float>() : nullptr;
    p.q_dtype = p.kv_dtype = p.o_dtype = s.dt;
    p.q_row_stride = static_cast<int64_t>(s.h) * s.d, p.o_row_stride = static_cast<int64_t>(s.h) * s.dv;
    p.k_row_stride = static_cast<int64_t>(s.hk) * s.d, p.v_row_stride = static_cast<int64_t>(s.hk) * s.dv;
    p.q_head_stride = p.k_head_stride = s.d;
    p.v_head_stride = p.o_head_stride = s.dv;
    p.batch = s.B, p.cu_seqlens_q = dcq.get<int32_t>(), p.cu_seqlens_k = dck.get<int32_t>();
    p.num_heads = s.h, p.num_kv_heads = s.hk, p.head_dim = s.d, p.head_dim_v = s.dv;
    p.causal = s.causal, p.window_left = s.wl, p.window_right = s.wr, p.num_sinks = s.sinks;
    attn::CudaOptions opt;
    opt.host_cu_seqlens_q = cu_q.data(), opt.host_cu_seqlens_k = cu_k.data();
    opt.num_splits = s.splits;
    // Paged: the contiguous buffers seen as a pool of `page`-token pages, sequence b's in order.
    const int64_t pages_per_seq = s.page > 0 ? s.Sk / s.page : 0;
    std::vector<int32_t> indptr(s.B + 1), indices(size_t(s.B) * pages_per_seq);
    for (int b = 0; b <= s.B; ++b) indptr[b] = int32_t(b * pages_per_seq);
    for (size_t i = 0; i < indices.size(); ++i) indices[i] = int32_t(i);
    DeviceBuffer dpi(indptr.size() * 4), dpx(std::max<size_t>(4, indices.size() * 4));
    if (s.page > 0) {
      dpi.upload(indptr), dpx.upload(indices);
      p.page_size = s.page, p.page_indptr = dpi.get<int32_t>(), p.page_indices = dpx.get<int32_t>();
      p.k_page_stride = s.page * p.k_row_stride, p.v_page_stride = s.page * p.v_row_stride;
    }

    const attn::Mask mask{s.causal, s.wl, s.wr, s.sinks};
    const double flops = 2.0 * (s.d + s.dv) * visible_pairs(mask, s.S, s.Sk) * s.h * s.B;
    Status st;
    const CallTime t = time_calls(
        [&](cudaStream_t strm) { return (st = attn::cuda::attention_cuda_arch(p, strm, opt, arch, {s.rows, s.tail})).ok(); }, stream,
        reps, timing);
    if (!t.ok) {
      std::printf("BENCH name=%s error=\"%s\"\n", s.name.c_str(), st.message().c_str());
      continue;
    }
    const double med = t.median_ms;
    std::printf("BENCH name=%s ms=%.4f tflops=%.1f min_ms=%.4f max_ms=%.4f flops=%.6g\n", s.name.c_str(), med,
                flops / (med * 1e-3) / 1e12, t.min_ms, t.max_ms, flops);
    std::fflush(stdout);
  }
  GPU_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace escala::gputest
