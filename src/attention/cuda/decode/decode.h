// Host side of the CUDA decode kernels: one launcher per head dim (each in its own .cu file so the
// instantiations compile in parallel), and the split-count / workspace helpers.
#pragma once

#include <cuda_runtime.h>

#include "attention/cuda/decode/decode_params.h"

namespace escala::attn::cuda {

// Launches the decode kernel (grid num_splits x (kv heads * row tiles) x batch) and, when
// num_splits > 1, the merge kernel. `bf16`: q/o dtype (else f16). Returns the launch error.
cudaError_t run_decode_hd64(const DecodeParams& p, bool bf16, KvFormat f, cudaStream_t stream);
cudaError_t run_decode_hd128(const DecodeParams& p, bool bf16, KvFormat f, cudaStream_t stream);
cudaError_t run_decode_hd256(const DecodeParams& p, bool bf16, KvFormat f, cudaStream_t stream);

// CTAs of the decode kernel that fit on one SM at once (for the split heuristic).
int decode_ctas_per_sm_hd64(KvFormat f);
int decode_ctas_per_sm_hd128(KvFormat f);
int decode_ctas_per_sm_hd256(KvFormat f);

}  // namespace escala::attn::cuda
