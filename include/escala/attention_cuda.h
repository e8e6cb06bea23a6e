// The CUDA backend of the attention API: the same AttentionParams, with device pointers
// (q, k, v, o, lse, cu_seqlens, page tables, scales, sink logits all in device memory).
// Asynchronous on `stream` (a cudaStream_t, passed as void* so this header needs no CUDA).
#pragma once

#include "escala/attention.h"

namespace escala::attn {

struct CudaOptions {
  Impl impl = Impl::kAuto;
  int num_splits = 0;  // decode: 0 = heuristic
  // Host copies of cu_seqlens (optional): lets the launcher size the grid without a device read.
  const int32_t* host_cu_seqlens_q = nullptr;
  const int32_t* host_cu_seqlens_k = nullptr;
};

// True when a CUDA device is present and the library was built with CUDA.
bool cuda_available();

Status attention_cuda(const AttentionParams& p, void* stream, const CudaOptions& options = {});

}  // namespace escala::attn
