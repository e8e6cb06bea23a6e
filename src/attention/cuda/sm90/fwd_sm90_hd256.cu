// sm_90a prefill kernel instantiations for head dim 256 (bf16 and fp16).
#include "attention/cuda/sm90/fwd_launch.cuh"

namespace escala::attn::cuda {
cudaError_t run_fwd_sm90_hd256(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  return bf16 ? launch_fwd_sm90<Sm90Config<__nv_bfloat16, 256, 256, 80, 2>>(p, bf16, e, stream)
              : launch_fwd_sm90<Sm90Config<__half, 256, 256, 80, 2>>(p, bf16, e, stream);
}
}  // namespace escala::attn::cuda
