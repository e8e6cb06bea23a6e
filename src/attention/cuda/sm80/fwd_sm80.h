// Entry points of the sm_80 prefill kernel, one per head dim (each in its own .cu so that CI
// compiles them in parallel). `bf16` selects bf16, else fp16.
#pragma once

#include <cuda_runtime.h>

#include "attention/cuda/fwd_params.h"

namespace escala::attn::cuda {
cudaError_t run_fwd_sm80_hd64(const FwdParams& p, bool bf16, int max_q_len, cudaStream_t stream);
cudaError_t run_fwd_sm80_hd128(const FwdParams& p, bool bf16, int max_q_len, cudaStream_t stream);
cudaError_t run_fwd_sm80_hd256(const FwdParams& p, bool bf16, int max_q_len, cudaStream_t stream);
}  // namespace escala::attn::cuda
