// A probe for scripts/ptxas_guard.sh (compiled only, never run): one wgmma in flight, and with
// ESCALA_PROBE_SERIALISED an add to its accumulator before the wait, which makes ptxas inject a
// warpgroup.wait (its note C7517), as a real kernel's misplaced register write would.
#include "attention/cuda/sm90/ptx90.cuh"
#include "attention/cuda/sm90/wgmma_ops.cuh"

__global__ void wgmma_guard_probe(float* out, uint64_t desc_a, uint64_t desc_b) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace escala::attn::cuda;
  using namespace escala::attn::cuda::sm90;
  float d[16][4] = {};
  wgmma_fence();
  wgmma_ss(d, desc_a, desc_b, 1, static_cast<const __nv_bfloat16*>(nullptr));
  wgmma_commit();
#ifdef ESCALA_PROBE_SERIALISED
  d[0][0] += out[0];  // an accumulator register written while its wgmma is in flight
#endif
  wgmma_wait<0>();
  for (int j = 0; j < 16; ++j)
    for (int e = 0; e < 4; ++e) out[threadIdx.x * 64 + 4 * j + e] = d[j][e];
#endif
}
