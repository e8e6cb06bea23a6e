// CUDA backend entry point (kernels to come).
#include <cuda_runtime.h>

#include "escala/attention_cuda.h"

namespace escala::attn {
bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
Status attention_cuda(const AttentionParams&, void*, const CudaOptions&) {
  return Status::error("attention_cuda: not implemented yet");
}
}  // namespace escala::attn
