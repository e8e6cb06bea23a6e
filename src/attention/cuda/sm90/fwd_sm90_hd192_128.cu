// sm_90a prefill kernel instantiations for d_qk = 192, d_v = 128 (bf16 and fp16; DeepSeek-style
// heads whose query/key carry an extra rotary part).
#include "attention/cuda/sm90/fwd_launch.cuh"

namespace escala::attn::cuda {
cudaError_t run_fwd_sm90_hd192_128(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  return bf16 ? launch_fwd_sm90<Sm90Config<__nv_bfloat16, 192, 128, 128, 2>>(p, bf16, e, stream)
              : launch_fwd_sm90<Sm90Config<__half, 192, 128, 128, 2>>(p, bf16, e, stream);
}
}  // namespace escala::attn::cuda
