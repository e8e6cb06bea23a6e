// Decode kernels for head dim 64 (bf16/f16 queries x bf16-f16/int8/fp8 K/V).
#include "attention/cuda/decode/decode_launch.cuh"

namespace escala::attn::cuda {

cudaError_t run_decode_hd64(const DecodeParams& p, const KvMaps& maps, bool bf16, KvFormat f, cudaStream_t stream) {
  return run_decode<64>(p, maps, bf16, f, stream);
}

cudaError_t run_merge_hd64(const DecodeParams& p, bool bf16, cudaStream_t stream) {
  return run_merge<64>(p, bf16, stream);
}

int decode_ctas_per_sm_hd64(KvFormat f, int rows_per_cta) { return decode_ctas_per_sm<64>(f, rows_per_cta); }

}  // namespace escala::attn::cuda
