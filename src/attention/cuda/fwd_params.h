// The plain struct the CUDA prefill kernels take (no STL, no pointers to host memory): built once
// by the launcher from AttentionParams. C++17, includable by host and device code.
#pragma once

#include <cstdint>

#include "attention/cuda/page_pos.h"
#include "attention/variant.h"

namespace escala::attn::cuda {

struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;                // [total_q, num_heads] or null
  const float* sink_logits = nullptr;  // [num_heads] or null

  int64_t q_row_stride = 0, q_head_stride = 0;
  int64_t k_row_stride = 0, k_head_stride = 0;
  int64_t v_row_stride = 0, v_head_stride = 0;
  int64_t o_row_stride = 0, o_head_stride = 0;

  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int32_t batch = 0;
  int32_t num_heads = 0;
  int32_t group = 1;  // num_heads / num_kv_heads
  int32_t num_m_blocks = 0;  // query tiles of the longest sequence
  // The real head dims; the kernel's tile width may be larger (columns past d_qk / d_v are read as
  // zeros and never stored).
  int32_t d_qk = 0, d_v = 0;

  // sm_90 persistent scheduler: CTAs take work items from `tile_counter[0]`; `tile_counter[1]`
  // counts the CTAs past their last claim, and the last of them sets both to zero again. Both are
  // zero at the launch (and after it). Items are ordered in sections of `sched_section`
  // (sequence, head) pairs whose K/V fit in L2 together, longest query tiles first within a
  // section.
  int32_t* tile_counter = nullptr;
  int32_t sched_section = 1;
  // sm_90: O can be written by TMA bulk stores (its tensor map could be encoded: 16-byte strides).
  int32_t o_tma = 0;

  // Paged K/V (sm_90 kernel, page_size > 0): sequence b's keys are the pages
  // page_indices[page_indptr[b] ..] of page_size rows each, stacked row after row in K and V (the
  // tensor maps span the pool as rows); each K/V tile is read as boxes of kv_box_rows rows.
  int32_t page_size = 0;
  PageDivisor page_div;  // page_size as a divisor (page_pos.h)
  int32_t kv_box_rows = 0;
  const int32_t* page_indptr = nullptr;
  const int32_t* page_indices = nullptr;

  // Split-KV (sm_90 kernel, num_splits > 1): split s of a query tile takes its s-th share of the
  // visited key tiles and writes O normalised over that share (f32) and its LSE (natural log, no
  // sink logit) to part_o [batch, max_q_len, heads, splits, d_v] / part_lse [.., splits]; the
  // decode path's merge kernel then combines them.
  int32_t num_splits = 1;
  int32_t max_q_len = 0;
  float* part_o = nullptr;
  float* part_lse = nullptr;

  float scale = 1.0f;       // softmax scale
  float scale_log2 = 1.0f;  // scale * log2(e)
  float softcap = 0.0f;     // 0 = off
  Mask mask;
  // sm_90 dense kernel: the sinks (at most its kSinkKeys keys) are read as one narrow tile where
  // they lie below the window (the kernel's spare tensor maps then have kSinkKeys-row boxes).
  int32_t narrow_sinks = 0;  // (last: the other fields keep their offsets, and their kernels' code)
  // sm_90 dense 192-row kernel, one pair per section (no mask that makes tiles differ in length):
  // the last query tile of the last `sched_tail` pairs, partial and so the shortest item, comes
  // after all other items instead of first in its pair; short items at the end even out the CTAs'
  // finishing times. (Last, as narrow_sinks.)
  int32_t sched_tail = 0;
};

}  // namespace escala::attn::cuda
