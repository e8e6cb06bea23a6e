// sm_90a prefill kernel instantiations for head dim 256 (bf16 and fp16).
#include "attention/cuda/sm90/fwd_launch.cuh"
#include "attention/cuda/sm90/tile_rows.h"

namespace escala::attn::cuda {
namespace {

template <class T>
cudaError_t launch_hd256(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  using Keys80 = Sm90Config<T, 256, 256, 80, 2>;
  using Keys64 = Sm90Config<T, 256, 256, 64, 2>;  // dense only (tile_rows.h)
  const bool dense = !split_paged_call(p);
  if (dense && dense_key_tile_d256(p.mask, e.max_kv_len) == 64)
    return launch_fwd_sm90_variant<Keys64, false>(p, bf16, e, stream);
  return launch_fwd_sm90<Keys80>(p, bf16, e, stream);
}

}  // namespace

cudaError_t run_fwd_sm90_hd256(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  return bf16 ? launch_hd256<__nv_bfloat16>(p, bf16, e, stream) : launch_hd256<__half>(p, bf16, e, stream);
}
}  // namespace escala::attn::cuda
