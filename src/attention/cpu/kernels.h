// CPU attention kernels (Highway SIMD, OpenMP threads). Callers go through attn::attention().
#pragma once
#include "escala/attention.h"

namespace escala::attn::cpu {
// Tiled online-softmax kernel: any query length; memory independent of kv length.
void flash_attention(const AttentionParams& p, int num_threads);
// Split-KV decode kernel for short query runs; each K/V head is read once for its query group.
void decode_attention(const AttentionParams& p, int num_threads, int num_splits);
}  // namespace escala::attn::cpu
