// Launches one instantiation of the sm_80 prefill kernel (included by the per-head-dim .cu files).
#pragma once

#include <cuda_runtime.h>

#include "attention/cuda/sm80/fwd_kernel.cuh"

namespace escala::attn::cuda {

template <class Cfg>
cudaError_t launch_fwd_sm80(FwdParams p, int max_q_len, cudaStream_t stream) {
  auto kernel = fwd_sm80_kernel<Cfg>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (e != cudaSuccess) return e;
  p.num_m_blocks = (max_q_len + Cfg::BM - 1) / Cfg::BM;
  const dim3 grid(static_cast<unsigned>(p.num_m_blocks), static_cast<unsigned>(p.num_heads),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace escala::attn::cuda
