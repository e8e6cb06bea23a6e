// Without nvcc the CUDA backend reports that it is absent.
#ifndef ESCALA_HAVE_CUDA
#include "escala/attention_cuda.h"

namespace escala::attn {
bool cuda_available() { return false; }
Status attention_cuda(const AttentionParams&, void*, const CudaOptions&) {
  return Status::error("attention: this build of Escala has no CUDA backend");
}
}  // namespace escala::attn
#endif
