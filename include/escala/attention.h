// The one attention API: prefill, append (chunked prefill / speculative verification) and decode,
// on contiguous or paged K/V, for CPU and (through attention_cuda.h) CUDA.
//
// Shapes (strides are in elements, so any row/head layout with unit stride along d works):
//   Q   [total_q,  num_heads,    head_dim]
//   K   [total_kv, num_kv_heads, head_dim]     (contiguous)  or pages, see below
//   V   [total_kv, num_kv_heads, head_dim_v]
//   O   [total_q,  num_heads,    head_dim_v]
//   LSE [total_q,  num_heads]  float, natural log, optional
// Sequence b owns query rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] and kv rows
// cu_seqlens_k[b] .. cu_seqlens_k[b+1]. Query i of a sequence with q_len queries and kv_len keys
// sits at position i' = i + kv_len - q_len (the causal diagonal is aligned to the end of the KV).
//
// Visibility of key j to query i (all conditions combined):
//   causal:        j <= i'
//   window:        i' - window_left <= j <= i' + window_right   (-1 = unbounded on that side)
//   sinks:         j < num_sinks is visible whatever the window (still subject to causality)
// Score: s = q.k * softmax_scale; if softcap > 0, s = softcap * tanh(s / softcap).
// Learned sink logit (per query head): exp(sink_logit) joins the softmax denominator with no value.
// A row with nothing visible (and no sink logit) yields O = 0 and LSE = -inf, never NaN.
// Non-finite inputs propagate as in exact arithmetic (CPU and CUDA kernels): a NaN or inf in a
// query makes its row NaN, a NaN or +inf score (from a key) the rows that see that key, a NaN value
// its column in those rows. A non-finite value at a key that a row does not see may still reach
// that row when the key shares a kernel tile with visible ones; in the Hopper prefill kernel over
// contiguous K/V, a NaN value in a sequence's first rows may also reach the previous sequence's rows
// (its last key tile runs on into them, with probability 0).
// With int8 K/V the CPU decode kernel quantizes each query row: an inf in it gives a NaN row.
//
// LSE = log(sum_j exp(s_j) [+ exp(sink_logit)]). Two results over disjoint key ranges, computed
// without sink logits, merge exactly with merge_partial(); a sink logit is a partial with O = 0.
//
// Paged K/V (page_size > 0): K and V point at pools [num_pages, page_size, num_kv_heads, d]
// (k_page_stride elements between pages, k_row_stride between token slots). Sequence b's pages are
// page_indices[page_indptr[b] .. page_indptr[b+1]); its token t is in page
// page_indices[page_indptr[b] + t / page_size], slot t % page_size. cu_seqlens_k still gives kv_len.
//
// Quantized K/V: kI8 reads k_scale/v_scale per (token slot, kv head): contiguous [total_kv, h_kv],
// paged [num_pages, page_size, h_kv]; kFp8E4M3 reads a scale per (page, kv head) [num_pages, h_kv]
// (paged only). Dequantization happens inside the kernels: value = stored * scale.
#pragma once

#include <cstdint>

#include "escala/dtype.h"
#include "escala/status.h"

namespace escala::attn {

struct AttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // optional

  DType q_dtype = DType::kF32;   // f32, f16, bf16
  DType kv_dtype = DType::kF32;  // f32, f16, bf16, int8, fp8
  DType o_dtype = DType::kF32;   // f32, f16, bf16

  int64_t q_row_stride = 0, q_head_stride = 0;
  int64_t k_row_stride = 0, k_head_stride = 0;
  int64_t v_row_stride = 0, v_head_stride = 0;
  int64_t o_row_stride = 0, o_head_stride = 0;

  int32_t batch = 0;
  const int32_t* cu_seqlens_q = nullptr;  // [batch + 1]
  const int32_t* cu_seqlens_k = nullptr;  // [batch + 1]
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;  // 0 means head_dim

  // Paged layout (page_size == 0: contiguous).
  int32_t page_size = 0;
  const int32_t* page_indptr = nullptr;   // [batch + 1]
  const int32_t* page_indices = nullptr;  // [page_indptr[batch]]
  int64_t k_page_stride = 0, v_page_stride = 0;

  const float* k_scale = nullptr;  // quantized KV only
  const float* v_scale = nullptr;

  float softmax_scale = 0.0f;  // 0 means 1/sqrt(head_dim)
  bool causal = false;
  int32_t window_left = -1;
  int32_t window_right = -1;
  int32_t num_sinks = 0;
  const float* sink_logits = nullptr;  // [num_heads], optional
  float softcap = 0.0f;                // 0 = off

  // Keys stored before RoPE (StreamingLLM): when rope_inv_freq is set, the kernels rotate key j of
  // a sequence by angle j * inv_freq[i] at read time (j = its slot in the cache, so positions are
  // re-assigned as tokens are evicted). Queries must come already rotated by their position i'.
  const float* rope_inv_freq = nullptr;  // [head_dim / 2]
  bool rope_neox = false;                // NeoX layout pairs (i, i + d/2); else (2i, 2i + 1)
};

enum class Impl : uint8_t {
  kAuto,       // decode kernel for short query runs, flash kernel otherwise
  kReference,  // materialised scores, double accumulation: for tests only
  kFlash,      // tiled online-softmax kernel
  kDecode,     // split-KV decode kernel with LSE merge
};

struct CpuOptions {
  Impl impl = Impl::kAuto;
  int num_threads = 0;  // 0 = OpenMP default
  int num_splits = 0;   // decode: 0 = heuristic
};

// Checks shapes, strides, dtypes and options; a clear one-line error otherwise.
Status validate(const AttentionParams& p);

// Runs attention on the CPU (all pointers are host pointers).
Status attention(const AttentionParams& p, const CpuOptions& options = {});

// Merges partial result b into a (same row): o_a, lse_a updated in place. lse = -inf means empty.
void merge_partial(float* o_a, float* lse_a, const float* o_b, float lse_b, int head_dim_v);

// Scale actually used (resolves softmax_scale == 0).
inline float effective_scale(const AttentionParams& p);

}  // namespace escala::attn

#include <cmath>
inline float escala::attn::effective_scale(const AttentionParams& p) {
  return p.softmax_scale != 0.0f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
}
