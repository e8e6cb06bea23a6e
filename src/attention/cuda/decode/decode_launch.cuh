// Launches one head dim's decode kernels (included by decode_hd*.cu).
#pragma once

#include <cuda_runtime.h>

#include "attention/cuda/decode/decode.h"
#include "attention/cuda/decode/decode_kernel.cuh"

namespace escala::attn::cuda {

// The merge of num_splits partial results by LSE (decode_merge_kernel); also the sm_90 prefill
// kernel's split-KV mode uses it.
template <int D, class T>
cudaError_t launch_merge(const DecodeParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.max_q_len * p.num_heads;
  // On Hopper the merge kernel is a programmatic dependent launch: its launch overlaps the decode
  // grid instead of following it (it waits on griddepcontrol.wait for the partial results).
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>((rows * 32 + 127) / 128));
  cfg.blockDim = dim3(128);
  cfg.stream = stream;
  cudaLaunchAttribute attr_pdl[1];
  attr_pdl[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr_pdl[0].val.programmaticStreamSerializationAllowed = 1;
  if (p.dependent_merge) cfg.attrs = attr_pdl, cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, decode_merge_kernel<D, T>, p);
}

template <int D, class T, KvFormat F, int kRows>
cudaError_t launch_decode(const DecodeParams& p, const KvMaps& maps, cudaStream_t stream) {
  using Cfg = DecodeCfg<D, T, F, kRows>;
  auto kernel = decode_kernel<D, T, F, kRows>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.num_kv_heads * p.row_tiles),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps.k, maps.v);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || p.num_splits == 1 || (!Cfg::kWide && p.merge_counters != nullptr)) return e;
  return launch_merge<D, T>(p, stream);
}

template <int D, class T, KvFormat F>
cudaError_t launch_decode(const DecodeParams& p, const KvMaps& maps, cudaStream_t stream) {
  if (p.rows_per_cta == 64) return launch_decode<D, T, F, 64>(p, maps, stream);
  if (p.rows_per_cta == 8) return launch_decode<D, T, F, 8>(p, maps, stream);
  return launch_decode<D, T, F, 16>(p, maps, stream);
}

template <int D, class T, KvFormat F, int kRows>
int ctas_per_sm() {
  using Cfg = DecodeCfg<D, T, F, kRows>;
  static const int n = [] {
    auto kernel = decode_kernel<D, T, F, kRows>;
    int blocks = 1;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Cfg::kThreads, Cfg::kSmemBytes) != cudaSuccess)
      return 1;
    return blocks > 0 ? blocks : 1;
  }();
  return n;
}

template <int D>
cudaError_t run_merge(const DecodeParams& p, bool bf16, cudaStream_t stream) {
  return bf16 ? launch_merge<D, __nv_bfloat16>(p, stream) : launch_merge<D, __half>(p, stream);
}

template <int D>
cudaError_t run_decode(const DecodeParams& p, const KvMaps& maps, bool bf16, KvFormat f, cudaStream_t stream) {
  if (bf16) {
    switch (f) {
      case KvFormat::kHalf: return launch_decode<D, __nv_bfloat16, KvFormat::kHalf>(p, maps, stream);
      case KvFormat::kInt8: return launch_decode<D, __nv_bfloat16, KvFormat::kInt8>(p, maps, stream);
      case KvFormat::kFp8: return launch_decode<D, __nv_bfloat16, KvFormat::kFp8>(p, maps, stream);
    }
  } else {
    switch (f) {
      case KvFormat::kHalf: return launch_decode<D, __half, KvFormat::kHalf>(p, maps, stream);
      case KvFormat::kInt8: return launch_decode<D, __half, KvFormat::kInt8>(p, maps, stream);
      case KvFormat::kFp8: return launch_decode<D, __half, KvFormat::kFp8>(p, maps, stream);
    }
  }
  return cudaErrorInvalidValue;
}

// Occupancy depends on shared memory and registers, which the q dtype barely changes.
template <int D, int kRows>
int decode_ctas(KvFormat f) {
  switch (f) {
    case KvFormat::kHalf: return ctas_per_sm<D, __nv_bfloat16, KvFormat::kHalf, kRows>();
    case KvFormat::kInt8: return ctas_per_sm<D, __nv_bfloat16, KvFormat::kInt8, kRows>();
    case KvFormat::kFp8: return ctas_per_sm<D, __nv_bfloat16, KvFormat::kFp8, kRows>();
  }
  return 1;
}

template <int D>
int decode_ctas_per_sm(KvFormat f, int rows_per_cta) {
  return rows_per_cta == 64 ? decode_ctas<D, 64>(f) : rows_per_cta == 8 ? decode_ctas<D, 8>(f) : decode_ctas<D, 16>(f);
}

}  // namespace escala::attn::cuda
