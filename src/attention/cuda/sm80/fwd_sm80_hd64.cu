// sm_80 prefill kernel instantiations for head dim 64 (bf16 and fp16).
#include "attention/cuda/sm80/fwd_launch.cuh"
#include "attention/cuda/sm80/fwd_sm80.h"

namespace escala::attn::cuda {
cudaError_t run_fwd_sm80_hd64(const FwdParams& p, bool bf16, int max_q_len, cudaStream_t stream) {
  return bf16 ? launch_fwd_sm80<Sm80Config<__nv_bfloat16, 64, 64, 3>>(p, max_q_len, stream)
              : launch_fwd_sm80<Sm80Config<__half, 64, 64, 3>>(p, max_q_len, stream);
}
}  // namespace escala::attn::cuda
