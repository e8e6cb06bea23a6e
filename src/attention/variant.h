// The one definition of masks, shared by the reference, the CPU kernels and
// the CUDA kernels (FlashInfer-style variant: small structs, not flags threaded through loops).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/hd.h"

namespace escala::attn {

// Which keys one query may see. Positions are within one sequence; q_pos is the query's aligned
// position i' = i + kv_len - q_len.
struct Mask {
  bool causal = false;
  int32_t window_left = -1;   // -1: unbounded
  int32_t window_right = -1;  // -1: unbounded
  int32_t num_sinks = 0;

  ESCALA_HD bool causal_ok(int64_t q_pos, int64_t k) const { return !causal || k <= q_pos; }

  ESCALA_HD bool in_window(int64_t q_pos, int64_t k) const {
    return (window_left < 0 || k >= q_pos - window_left) &&
           (window_right < 0 || k <= q_pos + window_right);
  }

  ESCALA_HD bool visible(int64_t q_pos, int64_t k) const {
    return causal_ok(q_pos, k) && (in_window(q_pos, k) || k < num_sinks);
  }

  // Upper bound (exclusive) on keys visible to any query at position <= q_pos_max.
  ESCALA_HD int64_t key_end(int64_t q_pos_max, int64_t kv_len) const {
    int64_t end = kv_len;
    if (causal && q_pos_max + 1 < end) end = q_pos_max + 1;
    if (window_right >= 0) {
      int64_t e = q_pos_max + window_right + 1;
      if (e < num_sinks) e = num_sinks;
      if (e < end) end = e;
    }
    return end < 0 ? 0 : end;
  }

  // Lower bound (inclusive) of the window part for queries at positions >= q_pos_min; keys in
  // [num_sinks_clamped, window_begin) are invisible, keys below num_sinks may be visible.
  ESCALA_HD int64_t window_begin(int64_t q_pos_min) const {
    if (window_left < 0) return 0;
    int64_t b = q_pos_min - window_left;
    return b < 0 ? 0 : b;
  }
};

}  // namespace escala::attn
