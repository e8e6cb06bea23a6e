// CPU attention kernels (Highway SIMD, OpenMP threads). Callers go through attn::attention().
#pragma once
#include <cstdint>

#include "escala/attention.h"

namespace escala::attn::cpu {
// Which sequences of the batch a kernel call covers: those whose query count lies in
// [min_queries, max_queries]. Each sequence's result depends only on itself (never on the rest of
// the batch), so a request gives the same bits alone or batched.
struct SeqRange {
  int64_t min_queries = 0;
  int64_t max_queries = INT64_MAX;
  bool covers(int64_t q_len) const { return q_len >= min_queries && q_len <= max_queries; }
};
// Tiled online-softmax kernel: any query length; memory independent of kv length.
void flash_attention(const AttentionParams& p, int num_threads, SeqRange range = {});
// Split-KV decode kernel for short query runs; each K/V head is read once for its query group.
// num_splits 0: chosen per sequence from its own length and the thread count.
void decode_attention(const AttentionParams& p, int num_threads, int num_splits, SeqRange range = {});
}  // namespace escala::attn::cpu
