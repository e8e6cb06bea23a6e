// The plain struct the CUDA decode kernels take (built once by the launcher from AttentionParams).
// C++17, includable by host and device code.
#pragma once

#include <cstdint>

#include "attention/cuda/page_pos.h"
#include "attention/variant.h"

namespace escala::attn::cuda {

// How K/V are stored: the query dtype (16-bit), int8 with a scale per (token slot, kv head), or
// fp8 e4m3 with a scale per (page, kv head).
enum class KvFormat : int { kHalf = 0, kInt8 = 1, kFp8 = 2 };

// Keys per warp tile for K/V rows of `row_bytes`: 32 for rows of up to 128 bytes, so that the
// per-tile softmax and bookkeeping are paid per 8 KB of K/V at least (the kernel and the split
// heuristic both use it).
constexpr int decode_tile_keys(int row_bytes) { return row_bytes <= 128 ? 32 : 16; }

struct DecodeParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;                // [total_q, num_heads] or null
  const float* sink_logits = nullptr;  // [num_heads] or null

  int64_t q_row_stride = 0, q_head_stride = 0;
  int64_t k_row_stride = 0, k_head_stride = 0, k_page_stride = 0;
  int64_t v_row_stride = 0, v_head_stride = 0, v_page_stride = 0;
  int64_t o_row_stride = 0, o_head_stride = 0;

  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int32_t page_size = 0;  // 0: contiguous
  PageDivisor page_div;  // page_size as a divisor (page_pos.h)
  const int32_t* page_indptr = nullptr;
  const int32_t* page_indices = nullptr;
  const float* k_scale = nullptr;  // quantized formats only
  const float* v_scale = nullptr;

  int32_t batch = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t group = 1;       // num_heads / num_kv_heads: the query heads packed as MMA rows
  int32_t rows_per_cta = 16;  // 16 or 8 (rows as the MMAs' N side): warps split keys; 64: warps split rows ("wide")
  int32_t row_tiles = 1;      // grid.y / num_kv_heads: row tiles of the longest packed query run
  int32_t num_splits = 1;  // grid.x: key ranges per (sequence, kv head, row tile)
  int32_t max_q_len = 0;   // bounds the partials' index space

  int32_t use_tma = 0;  // Hopper, 128-byte rows: K/V boxes through the tensor maps passed beside
  int32_t dependent_merge = 0;  // Hopper: the merge kernel is a programmatic dependent launch

  float scale = 1.0f;       // softmax scale
  float scale_log2 = 1.0f;  // scale * log2(e)
  float softcap = 0.0f;     // 0 = off
  Mask mask;

  // Split partials (num_splits > 1): O normalised per split, f32 [batch, max_q_len, heads, splits,
  // head_dim] and LSE (natural log, no sink logit) [batch, max_q_len, heads, splits].
  float* part_o = nullptr;
  float* part_lse = nullptr;
  // One int per (sequence, kv head, row tile), zero between launches: with num_splits > 1 and
  // 16-row CTAs, the last split CTA to finish merges (null: the merge kernel does).
  int32_t* merge_counters = nullptr;
};

}  // namespace escala::attn::cuda
