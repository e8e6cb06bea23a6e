// Decode benchmark mode of the GPU test binary:
//   escala_gpu_tests --bench-decode [--reps N] [--eager] [--warmup S] [--inner N] SPEC...
//       SPEC = name,B=..,T=..,h=..,hk=..,d=..[,kv=bf16|f16|i8|fp8][,page=16][,hnd=1][,q=1][,splits=0][,prefix=N]
//   (prefix=N: B sequences share an N-token prefix and own T tokens: plain decode vs cascade)
//   escala_gpu_tests --bench-read [--reps N] [--mb 4096] [timing flags]   the device's read ceiling
// Inputs are filled on the device with hashed uniform values (never zeros); pages are a random
// permutation. Timing in bench_timing.h (warm-up, samples of 10 calls replayed from a CUDA graph,
// median of N). Bandwidth = bytes of K and V (and their scales) the call must read / time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "escala/attention_cuda.h"
#include "gpu_util.h"

namespace escala::gputest {

namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// 16-bit uniform(-1, 1) values (bf16 or f16 bits), or random bytes for 8-bit formats.
__global__ void fill_kernel(uint8_t* p, size_t n_bytes, int mode, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n_bytes / 2; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(seed * 0x9E3779B97F4A7C15ull + i);
    const float f = (static_cast<float>(h >> 8) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
    uint16_t bits;
    if (mode == 0) {
      bits = __bfloat16_as_ushort(__float2bfloat16(f));
    } else if (mode == 1) {
      bits = __half_as_ushort(__float2half(f));
    } else {  // 8-bit: int8 in [-100, 100]; fp8 e4m3 with |x| in [2^-4, 2^4] (no NaN patterns)
      const uint32_t a = h & 0xff, b = (h >> 8) & 0xff;
      if (mode == 2) {
        bits = static_cast<uint16_t>((uint8_t)(int8_t)((int)(a % 201) - 100) | ((uint8_t)(int8_t)((int)(b % 201) - 100) << 8));
      } else {
        const uint32_t ea = 3 + (a % 9), eb = 3 + (b % 9);
        bits = static_cast<uint16_t>(((a & 0x80) | (ea << 3) | (a & 7)) | (((b & 0x80) | (eb << 3) | (b & 7)) << 8));
      }
    }
    reinterpret_cast<uint16_t*>(p)[i] = bits;
  }
}

__global__ void fill_scales(float* s, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) s[i] = v;
}

void fill(void* p, size_t bytes, int mode, uint64_t seed) {
  fill_kernel<<<4096, 256>>>(static_cast<uint8_t*>(p), bytes, mode, seed);
  GPU_CHECK(cudaGetLastError());
}

// Reads n bytes with 16-byte loads; one word per block out so nothing is optimised away.
__global__ void read_kernel(const uint4* p, size_t n, uint32_t* out) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[blockIdx.x] = acc;
}

struct Spec {
  std::string name;
  int B = 1, T = 1024, h = 32, hk = 8, d = 128, page = 0, q = 1, splits = 0, prefix = 0, hnd = 0;
  DType kv = DType::kBF16;
};

bool parse(const std::string& text, Spec& s) {
  const bool ok = parse_spec(text, s.name, [&s](const std::string& k, const std::string& v) {
    if (k == "kv") {
      if (v == "bf16") s.kv = DType::kBF16;
      else if (v == "f16") s.kv = DType::kF16;
      else if (v == "i8") s.kv = DType::kI8;
      else if (v == "fp8") s.kv = DType::kFp8E4M3;
      else return false;
      return true;
    }
    const int x = std::atoi(v.c_str());
    if (k == "B") s.B = x;
    else if (k == "T") s.T = x;
    else if (k == "h") s.h = x;
    else if (k == "hk") s.hk = x;
    else if (k == "d") s.d = x;
    else if (k == "page") s.page = x;
    else if (k == "q") s.q = x;
    else if (k == "splits") s.splits = x;
    else if (k == "prefix") s.prefix = x;
    else if (k == "hnd") s.hnd = x;
    else return false;
    return true;
  });
  return ok && s.B > 0 && s.T > 0 && s.h > 0 && s.hk > 0 && s.d > 0 && s.q > 0;
}

// B sequences that share a `prefix`-token prefix (whole 16-token pages) and own T tokens each:
// plain paged decode over prefix + own tokens, then cascade (prefix read once), bf16.
void bench_cascade(const Spec& s, int reps, const BenchTiming& timing, cudaStream_t stream, uint64_t seed) {
  const int page = 16;
  const int64_t pre_pages = (s.prefix + page - 1) / page, own_pages = (s.T + page - 1) / page;
  const int64_t pages = pre_pages + own_pages * s.B;
  const size_t bytes = size_t(pages) * page * s.hk * s.d * 2;
  DeviceBuffer dq(size_t(s.B) * s.h * s.d * 2), d_o(size_t(s.B) * s.h * s.d * 2), dk(bytes), dv(bytes);
  fill(dq.get(), dq.bytes(), 0, seed), fill(dk.get(), bytes, 0, seed + 1), fill(dv.get(), bytes, 0, seed + 2);
  std::vector<int32_t> cu_q(s.B + 1), cu_full(s.B + 1), cu_own(s.B + 1), ind_full{0}, ind_own{0}, pg_full, pg_own, pg_pre;
  for (int64_t i = 0; i < pre_pages; ++i) pg_pre.push_back(int32_t(i));
  for (int b = 0; b < s.B; ++b) {
    cu_q[b + 1] = b + 1, cu_full[b + 1] = cu_full[b] + s.prefix + s.T, cu_own[b + 1] = cu_own[b] + s.T;
    pg_full.insert(pg_full.end(), pg_pre.begin(), pg_pre.end());
    for (int64_t i = 0; i < own_pages; ++i) {
      const int32_t pg = int32_t(pre_pages + b * own_pages + i);
      pg_full.push_back(pg), pg_own.push_back(pg);
    }
    ind_full.push_back(int32_t(pg_full.size())), ind_own.push_back(int32_t(pg_own.size()));
  }
  DeviceBuffer dcq(cu_q.size() * 4), dcf(cu_q.size() * 4), dco(cu_q.size() * 4), dif(cu_q.size() * 4), dio(cu_q.size() * 4),
      dpf(pg_full.size() * 4), dpo(std::max<size_t>(4, pg_own.size() * 4)), dpp(std::max<size_t>(4, pg_pre.size() * 4));
  dcq.upload(cu_q), dcf.upload(cu_full), dco.upload(cu_own), dif.upload(ind_full), dio.upload(ind_own);
  dpf.upload(pg_full), dpo.upload(pg_own), dpp.upload(pg_pre);
  attn::AttentionParams p;
  p.q = dq.get(), p.k = dk.get(), p.v = dv.get(), p.o = d_o.get();
  p.q_dtype = p.o_dtype = p.kv_dtype = DType::kBF16;
  p.q_row_stride = p.o_row_stride = int64_t(s.h) * s.d, p.q_head_stride = p.o_head_stride = s.d;
  p.k_row_stride = p.v_row_stride = int64_t(s.hk) * s.d, p.k_head_stride = p.v_head_stride = s.d;
  p.k_page_stride = p.v_page_stride = int64_t(page) * s.hk * s.d;
  p.page_size = page, p.batch = s.B, p.num_heads = s.h, p.num_kv_heads = s.hk, p.head_dim = s.d, p.causal = true;
  p.cu_seqlens_q = dcq.get<int32_t>();
  attn::AttentionParams full = p, own = p;
  full.cu_seqlens_k = dcf.get<int32_t>(), full.page_indptr = dif.get<int32_t>(), full.page_indices = dpf.get<int32_t>();
  own.cu_seqlens_k = dco.get<int32_t>(), own.page_indptr = dio.get<int32_t>(), own.page_indices = dpo.get<int32_t>();
  attn::CudaOptions of, oo;
  of.host_cu_seqlens_q = oo.host_cu_seqlens_q = cu_q.data();
  of.host_cu_seqlens_k = cu_full.data(), oo.host_cu_seqlens_k = cu_own.data();
  attn::CascadePrefix prefix;
  prefix.kv_len = s.prefix, prefix.page_indices = dpp.get<int32_t>();
  Status st1, st2;
  const CallTime plain =
      time_calls([&](cudaStream_t strm) { return (st1 = attn::attention_cuda(full, strm, of)).ok(); }, stream, reps, timing);
  const CallTime casc = time_calls(
      [&](cudaStream_t strm) { return (st2 = attn::cascade_attention_cuda(own, prefix, strm, oo)).ok(); }, stream, reps,
      timing);
  if (!plain.ok || !casc.ok) {
    std::printf("CASCADE name=%s error=\"%s\"\n", s.name.c_str(), (st1.ok() ? st2 : st1).message().c_str());
    return;
  }
  std::printf("CASCADE name=%s plain_ms=%.4f cascade_ms=%.4f speedup=%.2f\n", s.name.c_str(), plain.median_ms,
              casc.median_ms, plain.median_ms / casc.median_ms);
  std::fflush(stdout);
}

}  // namespace

int run_read_bench(int argc, char** argv) {
  int reps = 20;
  size_t mb = 4096;
  BenchTiming timing;
  for (int i = 0; i < argc; ++i) {
    if (timing.parse_flag(argc, argv, i)) continue;
    if (i + 1 >= argc) break;
    if (std::string(argv[i]) == "--reps") reps = std::max(1, std::atoi(argv[++i]));
    else if (std::string(argv[i]) == "--mb") mb = std::max(64, std::atoi(argv[++i]));
  }
  cudaStream_t stream;
  GPU_CHECK(cudaStreamCreate(&stream));
  const size_t bytes = mb << 20;
  DeviceBuffer buf(bytes), out(65536 * 4);
  fill(buf.get(), bytes, 0, 1);
  cudaDeviceProp prop{};
  GPU_CHECK(cudaGetDeviceProperties(&prop, 0));
  double best = 0;
  for (int per_sm : {4, 8, 16}) {
    const int blocks = prop.multiProcessorCount * per_sm;
    const CallTime t = time_calls(
        [&](cudaStream_t strm) {
          read_kernel<<<blocks, 512, 0, strm>>>(buf.get<uint4>(), bytes / 16, out.get<uint32_t>());
          return cudaGetLastError() == cudaSuccess;
        },
        stream, reps, timing);
    if (t.ok) best = std::max(best, bytes / (t.median_ms * 1e-3) / 1e9);
  }
  GPU_CHECK(cudaStreamDestroy(stream));
  std::printf("READ gbps=%.1f mb=%zu\n", best, mb);
  return 0;
}

int run_decode_bench(int argc, char** argv) {
  int reps = 30;
  BenchTiming timing;
  std::vector<Spec> specs;
  if (!parse_bench_args(argc, argv, "decode", reps, timing, specs, [](int, char**, int&) { return false; }, parse))
    return 2;
  cudaStream_t stream;
  GPU_CHECK(cudaStreamCreate(&stream));
  uint64_t seed = 1;
  for (const Spec& s : specs) {
    if (s.prefix > 0) {
      bench_cascade(s, reps, timing, stream, seed += 3);
      continue;
    }
    const int64_t tq = int64_t(s.B) * s.q;
    const size_t eb = dtype_size(s.kv);
    const bool quant = s.kv == DType::kI8 || s.kv == DType::kFp8E4M3;
    const int page = s.kv == DType::kFp8E4M3 && s.page == 0 ? 16 : s.page;
    const int64_t pages_per_seq = page ? (s.T + page - 1) / page : 0;
    const int64_t slots = page ? pages_per_seq * s.B * page : int64_t(s.B) * s.T;
    const size_t kv_bytes = size_t(slots) * s.hk * s.d * eb;
    DeviceBuffer dq(tq * s.h * s.d * 2), d_o(tq * s.h * s.d * 2), dk(kv_bytes), dv(kv_bytes), dcq((s.B + 1) * 4),
        dck((s.B + 1) * 4);
    fill(dq.get(), dq.bytes(), 0, seed++);
    fill(dk.get(), kv_bytes, quant ? (s.kv == DType::kI8 ? 2 : 3) : (s.kv == DType::kBF16 ? 0 : 1), seed++);
    fill(dv.get(), kv_bytes, quant ? (s.kv == DType::kI8 ? 2 : 3) : (s.kv == DType::kBF16 ? 0 : 1), seed++);
    size_t scale_count = 0;
    DeviceBuffer dks, dvs, dindptr, dindices;
    if (quant) {
      scale_count = s.kv == DType::kI8 ? size_t(slots) * s.hk : size_t(slots / page) * s.hk;
      dks = DeviceBuffer(scale_count * 4), dvs = DeviceBuffer(scale_count * 4);
      fill_scales<<<1024, 256>>>(dks.get<float>(), scale_count, s.kv == DType::kI8 ? 0.01f : 0.05f);
      fill_scales<<<1024, 256>>>(dvs.get<float>(), scale_count, s.kv == DType::kI8 ? 0.01f : 0.05f);
    }
    std::vector<int32_t> cu_q(s.B + 1), cu_k(s.B + 1), indptr, indices;
    for (int b = 0; b <= s.B; ++b) cu_q[b] = b * s.q, cu_k[b] = b * s.T;
    dcq.upload(cu_q), dck.upload(cu_k);
    if (page) {
      indices.resize(pages_per_seq * s.B);
      std::iota(indices.begin(), indices.end(), 0);
      std::mt19937_64 rng(seed++);
      std::shuffle(indices.begin(), indices.end(), rng);
      for (int b = 0; b <= s.B; ++b) indptr.push_back(static_cast<int32_t>(b * pages_per_seq));
      dindptr = DeviceBuffer(indptr.size() * 4), dindices = DeviceBuffer(indices.size() * 4);
      dindptr.upload(indptr), dindices.upload(indices);
    }
    GPU_CHECK(cudaDeviceSynchronize());

    attn::AttentionParams p;
    p.q = dq.get(), p.k = dk.get(), p.v = dv.get(), p.o = d_o.get();
    p.q_dtype = p.o_dtype = s.kv == DType::kF16 ? DType::kF16 : DType::kBF16;
    p.kv_dtype = s.kv;
    p.q_row_stride = p.o_row_stride = int64_t(s.h) * s.d;
    p.q_head_stride = p.o_head_stride = s.d;
    p.k_row_stride = p.v_row_stride = int64_t(s.hk) * s.d;
    p.k_head_stride = p.v_head_stride = s.d;
    p.batch = s.B, p.cu_seqlens_q = dcq.get<int32_t>(), p.cu_seqlens_k = dck.get<int32_t>();
    p.num_heads = s.h, p.num_kv_heads = s.hk, p.head_dim = s.d;
    p.causal = true;
    if (page) {
      p.page_size = page, p.page_indptr = dindptr.get<int32_t>(), p.page_indices = dindices.get<int32_t>();
      p.k_page_stride = p.v_page_stride = int64_t(page) * s.hk * s.d;
      if (s.hnd) {  // head-major pages [pages, h_kv, page, d]: a head's rows of a page are contiguous
        p.k_row_stride = p.v_row_stride = s.d;
        p.k_head_stride = p.v_head_stride = int64_t(page) * s.d;
      }
    } else if (s.hnd) {  // head-major [h_kv, B * T, d]: each head's keys one contiguous run, as in PyTorch's [B, h_kv, T, d]
      p.k_row_stride = p.v_row_stride = s.d;
      p.k_head_stride = p.v_head_stride = slots * s.d;
    }
    p.k_scale = quant ? dks.get<float>() : nullptr, p.v_scale = quant ? dvs.get<float>() : nullptr;
    attn::CudaOptions opt;
    opt.impl = attn::Impl::kDecode;
    opt.num_splits = s.splits;
    opt.host_cu_seqlens_q = cu_q.data(), opt.host_cu_seqlens_k = cu_k.data();
    const int splits = s.splits > 0 ? s.splits : attn::decode_num_splits(p, s.q, s.T);
    Status st;
    const CallTime t =
        time_calls([&](cudaStream_t strm) { return (st = attn::attention_cuda(p, strm, opt)).ok(); }, stream, reps, timing);
    if (!t.ok) {
      std::printf("BENCH name=%s error=\"%s\"\n", s.name.c_str(), st.message().c_str());
      continue;
    }
    const double bytes = double(s.B) * s.T * s.hk * s.d * eb * 2 +
                         (quant ? (s.kv == DType::kI8 ? double(s.B) * s.T * s.hk * 8 : double(scale_count) * 8) : 0.0);
    const double ms = t.median_ms;
    std::printf("BENCH name=%s ms=%.4f gbps=%.1f splits=%d tokens_per_s=%.1f\n", s.name.c_str(), ms,
                bytes / (ms * 1e-3) / 1e9, splits, double(tq) / (ms * 1e-3));
    std::fflush(stdout);
  }
  GPU_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace escala::gputest
