// Kernel choice for the CUDA backend. attention_cuda() uses kAuto (the sm_90a kernel on Hopper,
// the sm_80 kernel elsewhere); tests and benchmarks may force one path.
#pragma once

#include "escala/attention_cuda.h"

namespace escala::attn::cuda {

enum class KernelArch { kAuto, kSm80, kSm90 };

// sm90_tile_rows: the sm_90 kernel's query rows per tile at head dims <= 64 (128 or 192; 0: its
// cost model chooses).
Status attention_cuda_arch(const AttentionParams& p, void* stream, const CudaOptions& options, KernelArch arch,
                           int sm90_tile_rows = 0);

}  // namespace escala::attn::cuda
