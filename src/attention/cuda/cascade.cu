// Cascade (shared-prefix) attention: one call over the shared prefix with every sequence's queries
// as the rows of one sequence (on Hopper the sm_90 prefill kernel, reading the prefix's pages by
// TMA and splitting its keys across the SMs; elsewhere the decode kernel), one over each
// sequence's own tokens, and a merge of the two partial results by LSE (with the learned sink
// logit joining once, at the merge).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <vector>

#include "attention/cuda/device_scratch.h"
#include "attention/cuda/sm80/ptx.cuh"
#include "escala/attention_cuda.h"

namespace escala::attn {

namespace {

Status fail(const std::string& m) { return Status::error("cascade_attention_cuda: " + m); }

// One warp per (query row, head): O = (w_a O_a + w_b O_b) / (w_a + w_b [+ e^sink]).
template <class T>
__global__ void merge_two_kernel(const T* oa, const float* la, const T* ob, const float* lb, const float* sinks,
                                 T* o, float* lse, int64_t rows, int heads, int d, int64_t o_row_stride,
                                 int64_t o_head_stride) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows * heads) return;
  const int64_t row = w / heads;
  const int h = static_cast<int>(w % heads);
  const float a = la[w], b = lb[w], s = sinks ? sinks[h] : -INFINITY;
  const float mx = fmaxf(fmaxf(a, b), s);
  float wa = 0.0f, wb = 0.0f, l = 0.0f;
  if (mx != -INFINITY) {
    wa = a == -INFINITY ? 0.0f : __expf(a - mx), wb = b == -INFINITY ? 0.0f : __expf(b - mx);
    l = wa + wb + (s == -INFINITY ? 0.0f : __expf(s - mx));
  }
  if (a != a || b != b) l = __int_as_float(0x7fffffff);  // a NaN part (fmaxf skipped it): a NaN row
  const float inv = l != 0.0f ? 1.0f / l : 0.0f;
  T* out = o + row * o_row_stride + h * o_head_stride;
  const int64_t src = w * d;
  using M = cuda::MmaType<T>;
  for (int c = 2 * lane; c < d; c += 64) {
    float x0, x1, y0, y1;
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(oa + src + c));
      const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(ob + src + c));
      x0 = f.x, x1 = f.y, y0 = g.x, y1 = g.y;
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(oa + src + c));
      const float2 g = __half22float2(*reinterpret_cast<const __half2*>(ob + src + c));
      x0 = f.x, x1 = f.y, y0 = g.x, y1 = g.y;
    }
    *reinterpret_cast<uint32_t*>(out + c) = M::pack((wa * x0 + wb * y0) * inv, (wa * x1 + wb * y1) * inv);
  }
  if (lane == 0 && lse) lse[w] = l != 0.0f ? mx + __logf(l) : -INFINITY;
}

// cu_seqlens_q {0, total_q}, cu_seqlens_k {0, kv_len}, page_indptr {0, pages} of the prefix call.
__global__ void write_indices(int32_t* idx, int32_t total_q, int32_t kv_len, int32_t pages) {
  idx[0] = 0, idx[1] = total_q, idx[2] = 0, idx[3] = kv_len, idx[4] = 0, idx[5] = pages;
}

// A second stream of the library's, per device, for the own-token pass: forked from the caller's
// stream and joined back by events (a CUDA graph capture follows them), so that the pass runs in
// what the prefix pass leaves idle (SMs beyond its CTAs, and bandwidth) instead of after it. The
// events are shared, so one fork at a time (the mutex is held from fork to join).
struct SideStream {
  std::mutex mu;
  bool tried = false;
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

// The current device's side stream, created on first use (null when creation failed).
SideStream* side_stream() {
  constexpr int kMaxDevices = 16;
  static SideStream sides[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return nullptr;
  SideStream& s = sides[dev];
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.tried) {
    s.tried = true;
    if (cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&s.fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&s.join, cudaEventDisableTiming) != cudaSuccess)
      s.stream = nullptr;
    (void)cudaGetLastError();
  }
  return s.stream != nullptr ? &s : nullptr;
}

}  // namespace

Status cascade_attention_cuda(const AttentionParams& p, const CascadePrefix& prefix, void* stream_ptr,
                              const CudaOptions& options) {
  if (!options.host_cu_seqlens_q || !options.host_cu_seqlens_k) return fail("host cu_seqlens are required");
  if (p.page_size <= 0 || !prefix.page_indices) return fail("the prefix must be paged (page_indices)");
  if (prefix.kv_len < 0) return fail("negative prefix length");
  if (p.window_left >= 0 || p.window_right >= 0 || p.num_sinks > 0) return fail("windows and sinks are not supported");
  if (p.q_dtype != DType::kBF16 && p.q_dtype != DType::kF16) return fail("q must be bf16 or f16");
  if (p.num_heads < 1 || p.head_dim < 1 || p.batch < 1) return fail("bad shape");
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t total_q = options.host_cu_seqlens_q[p.batch];
  if (total_q <= 0) return {};
  const int d = p.head_dim;
  const size_t o_bytes = size_t(total_q) * p.num_heads * d * 2, l_bytes = size_t(total_q) * p.num_heads * 4;
  // The two partial results and the prefix call's index arrays, per stream like the library's other
  // workspaces (cascade calls on two streams at once must not share them).
  static cuda::StreamScratch scratch;
  cudaError_t e = cudaSuccess;
  auto* base = static_cast<uint8_t*>(scratch.get(stream, 2 * o_bytes + 2 * l_bytes + 64, e));
  if (base == nullptr) return fail(std::string("allocating scratch: ") + cudaGetErrorString(e));
  void* o_pre = base;
  void* o_own = base + o_bytes;
  auto* l_pre = reinterpret_cast<float*>(base + 2 * o_bytes);
  auto* l_own = reinterpret_cast<float*>(base + 2 * o_bytes + l_bytes);
  auto* idx = reinterpret_cast<int32_t*>(base + 2 * o_bytes + 2 * l_bytes);
  const int32_t pages = (prefix.kv_len + p.page_size - 1) / p.page_size;

  // Fork: the own-token pass (below) waits only for what the caller queued before this call.
  SideStream* side = side_stream();
  std::unique_lock<std::mutex> fork_lock;
  cudaStream_t own_stream = stream;
  if (side != nullptr) {
    fork_lock = std::unique_lock<std::mutex>(side->mu);
    e = cudaEventRecord(side->fork, stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(side->stream, side->fork, 0);
    if (e != cudaSuccess) return fail(std::string("forking the own-token pass: ") + cudaGetErrorString(e));
    own_stream = side->stream;
  }
  // Join: the merge below waits for the own-token pass. Runs on every return after the fork, so
  // the caller's stream never leaves the side stream's work behind (nor a capture unjoined).
  auto join = [&]() -> cudaError_t {
    if (side == nullptr) return cudaSuccess;
    cudaError_t je = cudaEventRecord(side->join, side->stream);
    if (je == cudaSuccess) je = cudaStreamWaitEvent(stream, side->join, 0);
    return je;
  };

  // The prefix call's index arrays, written by a one-thread kernel (a host copy would synchronise).
  int32_t host_idx[6] = {0, static_cast<int32_t>(total_q), 0, prefix.kv_len, 0, pages};
  write_indices<<<1, 1, 0, stream>>>(idx, host_idx[1], host_idx[3], host_idx[5]);
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    join();
    return fail(std::string("index kernel: ") + cudaGetErrorString(e));
  }

  // The shared prefix: every query sees all of it (it precedes every sequence's own tokens).
  AttentionParams pre = p;
  pre.batch = 1;
  pre.cu_seqlens_q = idx, pre.cu_seqlens_k = idx + 2, pre.page_indptr = idx + 4, pre.page_indices = prefix.page_indices;
  pre.causal = false, pre.sink_logits = nullptr;
  pre.o = o_pre, pre.lse = l_pre;
  pre.o_row_stride = int64_t(p.num_heads) * d, pre.o_head_stride = d;
  CudaOptions po;  // kAuto: the prefill kernel where it reads these pages, the decode kernel otherwise
  po.host_cu_seqlens_q = host_idx, po.host_cu_seqlens_k = host_idx + 2;
  if (prefix.kv_len > 0) {
    const Status st = attention_cuda(pre, stream, po);
    if (!st.ok()) {
      join();
      return st;
    }
  } else {
    // An empty prefix contributes nothing: O = 0, LSE = -inf (a pageable copy: staged at once).
    const std::vector<float> neg(size_t(total_q) * p.num_heads, -INFINITY);
    e = cudaMemcpyAsync(l_pre, neg.data(), l_bytes, cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) e = cudaMemsetAsync(o_pre, 0, o_bytes, stream);
    if (e != cudaSuccess) {
      join();
      return fail(cudaGetErrorString(e));
    }
  }

  // Each sequence's own tokens.
  AttentionParams own = p;
  own.sink_logits = nullptr, own.o = o_own, own.lse = l_own;
  own.o_row_stride = int64_t(p.num_heads) * d, own.o_head_stride = d;
  // (The library's own workspaces are per stream, so the two passes, which run at once, never
  // share one.)
  CudaOptions oo = options;
  oo.impl = Impl::kDecode;
  const Status own_status = attention_cuda(own, own_stream, oo);
  e = join();
  ESCALA_RETURN_IF_ERROR(own_status);
  if (e != cudaSuccess) return fail(std::string("joining the own-token pass: ") + cudaGetErrorString(e));

  const int64_t warps = total_q * p.num_heads;
  const unsigned blocks = unsigned((warps * 32 + 127) / 128);
  const float* lpre = l_pre;
  if (p.q_dtype == DType::kBF16) {
    merge_two_kernel<__nv_bfloat16><<<blocks, 128, 0, stream>>>(
        static_cast<const __nv_bfloat16*>(o_pre), lpre, static_cast<const __nv_bfloat16*>(o_own), l_own, p.sink_logits,
        static_cast<__nv_bfloat16*>(p.o), p.lse, total_q, p.num_heads, d, p.o_row_stride, p.o_head_stride);
  } else {
    merge_two_kernel<__half><<<blocks, 128, 0, stream>>>(static_cast<const __half*>(o_pre), lpre,
                                                         static_cast<const __half*>(o_own), l_own, p.sink_logits,
                                                         static_cast<__half*>(p.o), p.lse, total_q, p.num_heads, d,
                                                         p.o_row_stride, p.o_head_stride);
  }
  e = cudaGetLastError();
  return e == cudaSuccess ? Status{} : fail(std::string("merge launch: ") + cudaGetErrorString(e));
}

}  // namespace escala::attn
