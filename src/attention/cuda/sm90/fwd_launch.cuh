// Launches one instantiation of the sm_90a prefill kernel (included by the per-head-dim .cu files).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "attention/cuda/sm90/fwd_kernel.cuh"
#include "attention/cuda/sm90/fwd_sm90.h"

namespace escala::attn::cuda {

template <class Cfg>
cudaError_t launch_fwd_sm90(FwdParams p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  auto kernel = fwd_sm90_kernel<Cfg>;
  // A build without sm_90a code (e.g. CMAKE_CUDA_ARCHITECTURES=80) has an empty body here: refuse,
  // so that the dispatcher falls back to the sm_80 kernel.
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  if (attr.binaryVersion < 90) return cudaErrorNotSupported;
  CUtensorMap tq, tk, tv;
  err =
      make_tensor_map(&tq, p.q, bf16, Cfg::D, p.num_heads, e.total_q, p.q_head_stride, p.q_row_stride, Cfg::BM);
  if (err == cudaSuccess)
    err = make_tensor_map(&tk, p.k, bf16, Cfg::D, e.num_kv_heads, e.total_kv, p.k_head_stride, p.k_row_stride,
                          Cfg::BN);
  if (err == cudaSuccess)
    err = make_tensor_map(&tv, p.v, bf16, Cfg::D, e.num_kv_heads, e.total_kv, p.v_head_stride, p.v_row_stride,
                          Cfg::BN);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  p.num_m_blocks = (e.max_q_len + Cfg::BM - 1) / Cfg::BM;
  // Grid: every item costs the same without a mask, so a persistent grid (one CTA per SM; the
  // kernel takes all of an SM's registers) overlaps each item's epilogue with the next one's loads.
  // Under a causal or window mask the items differ in cost and the static round-robin leaves SMs
  // idle (measured: persistent 3-18% slower on causal shapes, 2-25% faster on dense ones), so
  // there each CTA takes one item and the hardware scheduler balances them.
  const int64_t items = static_cast<int64_t>(p.num_m_blocks) * p.batch * p.num_heads;
  if (items > INT32_MAX) return cudaErrorInvalidValue;
  int64_t ctas = items;
  const bool uniform = !p.mask.causal && p.mask.window_left < 0 && p.mask.window_right < 0;
  if (uniform) {
    int dev = 0, sms = 0;
    err = cudaGetDevice(&dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    if (sms < ctas) ctas = sms;
  }
  const dim3 grid(static_cast<unsigned>(ctas));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, tq, tk, tv);
  return cudaGetLastError();
}

}  // namespace escala::attn::cuda
