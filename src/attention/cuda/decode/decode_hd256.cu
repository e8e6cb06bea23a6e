// Decode kernels for head dim 256 (bf16/f16 queries x bf16-f16/int8/fp8 K/V).
#include "attention/cuda/decode/decode_launch.cuh"

namespace escala::attn::cuda {

cudaError_t run_decode_hd256(const DecodeParams& p, const KvMaps& maps, bool bf16, KvFormat f, cudaStream_t stream) {
  return run_decode<256>(p, maps, bf16, f, stream);
}

cudaError_t run_merge_hd256(const DecodeParams& p, bool bf16, cudaStream_t stream) {
  return run_merge<256>(p, bf16, stream);
}

int decode_ctas_per_sm_hd256(KvFormat f, int rows_per_cta) { return decode_ctas_per_sm<256>(f, rows_per_cta); }

}  // namespace escala::attn::cuda
