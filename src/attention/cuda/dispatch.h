// Kernel choice for the CUDA backend. attention_cuda() uses kAuto (the sm_90a kernel on Hopper,
// the sm_80 kernel elsewhere); tests and benchmarks may force one path.
#pragma once

#include "escala/attention_cuda.h"

namespace escala::attn::cuda {

enum class KernelArch { kAuto, kSm80, kSm90 };

// Overrides of the sm_90 kernel's per-call choices, for tests and benchmarks.
struct Sm90Tuning {
  // Query rows per tile at head dims <= 64: 128 or 192 (0: the cost model chooses, tile_rows.h).
  int tile_rows = 0;
  // Sequence-head pairs whose partial last query tile is deferred to the end of the work order
  // (FwdParams::sched_tail; -1: the launcher's choice, 0: none).
  int tail_pairs = -1;
};

Status attention_cuda_arch(const AttentionParams& p, void* stream, const CudaOptions& options, KernelArch arch,
                           const Sm90Tuning& tuning = {});

}  // namespace escala::attn::cuda
