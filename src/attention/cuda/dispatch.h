// Kernel choice for the CUDA backend. attention_cuda() uses kAuto (the sm_90a kernel on Hopper,
// the sm_80 kernel elsewhere); tests and benchmarks may force one path.
#pragma once

#include "escala/attention_cuda.h"

namespace escala::attn::cuda {

enum class KernelArch { kAuto, kSm80, kSm90 };

Status attention_cuda_arch(const AttentionParams& p, void* stream, const CudaOptions& options, KernelArch arch);

}  // namespace escala::attn::cuda
