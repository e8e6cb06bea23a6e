// The CUDA backend of the attention API: the same AttentionParams, with device pointers
// (q, k, v, o, lse, cu_seqlens, page tables, scales, sink logits all in device memory).
// Asynchronous on `stream` (a cudaStream_t, passed as void* so this header needs no CUDA).
#pragma once

#include "escala/attention.h"

namespace escala::attn {

// Kernel choice (kAuto): the split-KV decode kernel for quantized K/V and for query runs of at most
// 16 tokens, the prefill kernel otherwise (paged K/V too on Hopper when the pages are 16 x n rows
// stacked in the pool; elsewhere paged K/V go to the decode kernel).
struct CudaOptions {
  Impl impl = Impl::kAuto;
  // Key splits (Flash-Decoding) of the decode kernel and of the sm_90 prefill kernel (whose
  // heuristic splits only when its query tiles fill less than one wave): 0 = heuristic.
  int num_splits = 0;
  // Host copies of cu_seqlens (optional): lets the launcher size the grid without a device read.
  const int32_t* host_cu_seqlens_q = nullptr;
  const int32_t* host_cu_seqlens_k = nullptr;
  // Upper bounds on every sequence's query and key counts (decode path). With both set the launcher
  // reads nothing back and the launch shape depends on them alone, so the call can be captured in a
  // CUDA graph and replayed with new lengths in device memory (set num_splits and workspace too).
  int max_q_len = 0;
  int max_kv_len = 0;
  // Scratch for the decode kernel's splits (decode_workspace_bytes: the merge counters, which each
  // call zeroes on the stream, then the split partials), or for the sm_90 prefill kernel: its work
  // counters (which each call zeroes on the stream) in the first 256 bytes, then the split
  // partials (with num_splits > 1: batch x max_q_len x heads x splits x (head_dim_v + 1) floats).
  // Null: buffers cached by the library per stream (the counters kept zero), allocated with
  // cudaMalloc on first use on a stream or when too small (not capturable).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// True when a CUDA device is present and the library was built with CUDA.
bool cuda_available();

Status attention_cuda(const AttentionParams& p, void* stream, const CudaOptions& options = {});

// Shared-prefix (cascade) attention: every sequence of `p` continues one shared prefix, whose K/V
// are read once for all of them and merged with each sequence's own part by LSE (FlashInfer's
// cascade). `p` is the usual call over each sequence's own tokens (cu_seqlens_k: suffix lengths;
// paged, its own pages) and the result equals attention over prefix + suffix. The prefix lives in
// the same paged pool. Needs host cu_seqlens; masks: causal or none (no window, no sinks: they
// depend on absolute positions).
struct CascadePrefix {
  int32_t kv_len = 0;                     // tokens in the shared prefix
  const int32_t* page_indices = nullptr;  // device: its ceil(kv_len / page_size) pages
};
Status cascade_attention_cuda(const AttentionParams& p, const CascadePrefix& prefix, void* stream,
                              const CudaOptions& options);

// The decode kernel's split count for these shapes (from batch x kv heads against the SM count).
int decode_num_splits(const AttentionParams& p, int max_q_len, int max_kv_len);
// Workspace bytes the decode kernel needs with `num_splits` splits (0 when num_splits == 1).
size_t decode_workspace_bytes(const AttentionParams& p, int max_q_len, int num_splits);

}  // namespace escala::attn
