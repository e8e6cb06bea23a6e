// CUDA backend entry point: checks what the CUDA kernels support, builds the kernel params and
// dispatches on head dim and dtype. Asynchronous on the caller's stream; the only synchronisation
// is the fallback read of cu_seqlens_q when the caller gives no host copy (to size the grid).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attention/cuda/fwd_params.h"
#include "attention/cuda/dispatch.h"
#include "attention/cuda/sm80/fwd_sm80.h"
#include "attention/cuda/sm90/fwd_sm90.h"
#include "escala/attention_cuda.h"

namespace escala::attn {

namespace {

Status cuda_error(const char* what, cudaError_t e) {
  return Status::error(std::string("attention_cuda: ") + what + ": " + cudaGetErrorString(e));
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

Status check_supported(const AttentionParams& p) {
  auto fail = [](const std::string& m) { return Status::error("attention_cuda: " + m); };
  if (!p.q || !p.k || !p.v || !p.o) return fail("q, k, v and o must all be given");
  if (p.batch < 1 || p.batch > 65535) return fail("batch must be in [1, 65535]");
  if (!p.cu_seqlens_q || !p.cu_seqlens_k) return fail("cu_seqlens_q and cu_seqlens_k are required");
  if (p.num_heads < 1 || p.num_kv_heads < 1 || p.num_heads > 65535) return fail("bad head counts");
  if (p.num_heads % p.num_kv_heads != 0) return fail("num_heads must be divisible by num_kv_heads");
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return fail("head_dim " + std::to_string(p.head_dim) + " not supported on CUDA yet (64, 128, 256)");
  if (dv != p.head_dim) return fail("head_dim_v != head_dim not supported on CUDA yet");
  const bool half = p.q_dtype == DType::kBF16 || p.q_dtype == DType::kF16;
  if (!half || p.kv_dtype != p.q_dtype || p.o_dtype != p.q_dtype)
    return fail("CUDA prefill needs q, kv and o all bf16 or all f16");
  if (p.page_size != 0) return fail("paged K/V not supported on CUDA yet");
  if (p.rope_inv_freq) return fail("rope at read time not supported on CUDA yet");
  if (p.window_left < -1 || p.window_right < -1 || p.num_sinks < 0) return fail("bad window or sink counts");
  if (!(std::isfinite(p.softcap) && p.softcap >= 0.0f)) return fail("softcap must be finite and >= 0");
  if (!(effective_scale(p) > 0.0f) || !std::isfinite(effective_scale(p)))
    return fail("softmax_scale must be positive and finite on CUDA");
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o))
    return fail("q, k, v and o must be 16-byte aligned");
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.k_row_stride, p.k_head_stride,
                             p.v_row_stride, p.v_head_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s <= 0 || s % 8 != 0) return fail("strides must be positive multiples of 8 elements");
  return {};
}

}  // namespace

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Status attention_cuda(const AttentionParams& p, void* stream, const CudaOptions& options) {
  return cuda::attention_cuda_arch(p, stream, options, cuda::KernelArch::kAuto);
}

Status cuda::attention_cuda_arch(const AttentionParams& p, void* stream_ptr, const CudaOptions& options,
                                 KernelArch arch) {
  if (options.impl == Impl::kReference || options.impl == Impl::kDecode)
    return Status::error("attention_cuda: only the flash (prefill) kernel exists on CUDA yet");
  ESCALA_RETURN_IF_ERROR(check_supported(p));
  auto stream = static_cast<cudaStream_t>(stream_ptr);

  // Pick the kernel: the sm_90a one needs a Hopper device.
  const bool auto_arch = arch == KernelArch::kAuto;
  if (arch == KernelArch::kAuto) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess) return cuda_error("querying the device", e);
    arch = (major == 9 && minor == 0) ? KernelArch::kSm90 : KernelArch::kSm80;
  }

  // Sequence extents on the host: the longest query run sizes the grid, the totals size the TMA
  // tensor maps. Without host copies they are read back (a synchronisation: pass host copies).
  int max_q_len = 0;
  int64_t total_q = 0, total_kv = 0;
  {
    const int32_t* hq = options.host_cu_seqlens_q;
    const int32_t* hk = options.host_cu_seqlens_k;
    std::vector<int32_t> cq, ck;
    if (hq == nullptr || (hk == nullptr && arch == KernelArch::kSm90)) {
      cq.resize(static_cast<size_t>(p.batch) + 1), ck.resize(static_cast<size_t>(p.batch) + 1);
      cudaError_t e = cudaMemcpyAsync(cq.data(), p.cu_seqlens_q, cq.size() * 4, cudaMemcpyDeviceToHost, stream);
      if (e == cudaSuccess)
        e = cudaMemcpyAsync(ck.data(), p.cu_seqlens_k, ck.size() * 4, cudaMemcpyDeviceToHost, stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
      if (e != cudaSuccess) return cuda_error("reading cu_seqlens", e);
      hq = cq.data(), hk = ck.data();
    }
    for (int b = 0; b < p.batch; ++b) max_q_len = std::max(max_q_len, hq[b + 1] - hq[b]);
    total_q = hq[p.batch];
    total_kv = hk != nullptr ? hk[p.batch] : 0;
  }
  if (max_q_len <= 0) return {};

  cuda::FwdParams k;
  k.q = p.q, k.k = p.k, k.v = p.v, k.o = p.o, k.lse = p.lse, k.sink_logits = p.sink_logits;
  k.q_row_stride = p.q_row_stride, k.q_head_stride = p.q_head_stride;
  k.k_row_stride = p.k_row_stride, k.k_head_stride = p.k_head_stride;
  k.v_row_stride = p.v_row_stride, k.v_head_stride = p.v_head_stride;
  k.o_row_stride = p.o_row_stride, k.o_head_stride = p.o_head_stride;
  k.cu_seqlens_q = p.cu_seqlens_q, k.cu_seqlens_k = p.cu_seqlens_k;
  k.batch = p.batch, k.num_heads = p.num_heads, k.group = p.num_heads / p.num_kv_heads;
  k.scale = effective_scale(p);
  k.scale_log2 = k.scale * 1.4426950408889634f;
  k.softcap = p.softcap;
  k.mask = Mask{p.causal, p.window_left, p.window_right, p.num_sinks};

  const bool bf16 = p.q_dtype == DType::kBF16;
  cudaError_t e = cudaSuccess;
  if (arch == KernelArch::kSm90) {
    const cuda::Sm90Extents ext{max_q_len, total_q, total_kv, p.num_kv_heads};
    switch (p.head_dim) {
      case 64: e = cuda::run_fwd_sm90_hd64(k, bf16, ext, stream); break;
      case 128: e = cuda::run_fwd_sm90_hd128(k, bf16, ext, stream); break;
      default: e = cuda::run_fwd_sm90_hd256(k, bf16, ext, stream); break;
    }
    // No sm_90a code in this build, or no TMA encoder in the driver: the portable kernel.
    if (e == cudaErrorNotSupported && auto_arch) arch = KernelArch::kSm80;
  }
  if (arch == KernelArch::kSm80) {
    switch (p.head_dim) {
      case 64: e = cuda::run_fwd_sm80_hd64(k, bf16, max_q_len, stream); break;
      case 128: e = cuda::run_fwd_sm80_hd128(k, bf16, max_q_len, stream); break;
      default: e = cuda::run_fwd_sm80_hd256(k, bf16, max_q_len, stream); break;
    }
  }
  if (e != cudaSuccess) return cuda_error("prefill kernel launch", e);
  return {};
}

}  // namespace escala::attn
