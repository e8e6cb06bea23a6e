// The sm_90 prefill kernel's tile shapes chosen per call: the query-tile height for dense d <= 64
// inputs, 128 rows (two consumer warpgroups) or 192 (three, FlashAttention-3's d = 64 tile), and
// the key-tile width for dense d = 256 inputs. Host code, no CUDA: unit-tested on the CPU
// (tests/unit/sm90_tile_rows_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/cuda/tile_range.cuh"
#include "attention/variant.h"

namespace escala::attn::cuda {

// 192 where its higher throughput pays for its padding rows and its wider diagonal. The cost of a
// tile height is the makespan of its items on the persistent grid, in 128-row x 128-key tile
// times: the larger of the total work over the SMs and the longest item. A 192-row tile takes
// 192 / 128 / kGain of that time. Under sustained load (graph timing, power-capped clocks; H200,
// session 13) the 192-row kernel did 6-8% more row x key tiles per second than the 128-row one:
// S = 1k non-causal 128 rows 6% faster (731 against 775 us, 192 rows visit 12.5% more tiles),
// S = 4k non-causal 192 rows 4% faster, causal 128 rows 3% faster, S = 16k 192 rows 4-7% faster,
// GQA 32/8 at 8k 6%. Every choice was right for kGain in (1.031, 1.091). (Session 7, each call
// timed alone at a cool card's clocks, had measured 12-16%.) Session 28, the kernels since
// improved: S = 4k causal 192 rows 1.6% faster (646.6 against 657.2 us, 16 heads), a gain of
// ~1.11 by this model. Session 30, the 192-row kernel's O staged and stored in bulk: gains of
// 1.13-1.16 (S1k full 330.6 against 340.1 us, S4k causal 630.1 against ~660, S4k / S16k full);
// 1.14 moves S = 1k full (ties at 1.125) and S = 2k causal (1.114) to 192 rows and keeps S = 1k
// causal (1.333) on 128.
inline int dense_tile_rows_d64(const Mask& mask, int max_q_len, int max_kv_len, int64_t batch, int64_t heads,
                               int sms) {
  const int64_t shift = int64_t(max_kv_len) - max_q_len;
  constexpr double kGain = 1.14;
  auto makespan = [&](int bm) {
    int64_t tiles = 0, longest = 0;
    for (int m0 = 0; m0 < max_q_len; m0 += bm) {
      const int64_t qp_max = std::min(m0 + bm, max_q_len) - 1 + shift;
      const int64_t n = tile_range(mask, m0 + shift, qp_max, max_kv_len, 128).count();
      tiles += n, longest = std::max(longest, n);
    }
    const double per_tile = bm == 192 ? 192.0 / 128.0 / kGain : 1.0;
    return std::max(double(tiles) * double(batch) * double(heads) / std::max(sms, 1), double(longest)) * per_tile;
  };
  return makespan(192) < makespan(128) ? 192 : 128;
}

// Keys per tile for dense d = 256 inputs: 80 (FlashAttention-3's width; its registers fit the
// overlap of two tiles), or 64 for causal inputs whose query tiles see few keys. 64-key tiles divide
// the 128-row diagonal, where 80-key ones visit 6% more key columns on a causal 1k head; on long
// rows their per-tile cost wins. H200, session 23, 64 against 80 keys: causal S = 1k 2.4 / 2.7%
// faster, window 1024 at S = 16k 2.2% faster; S = 2k 0.8%, S = 4k 0-1.6%, S = 16k 3.2% slower.
inline int dense_key_tile_d256(const Mask& mask, int max_kv_len) {
  if (!mask.causal) return 80;
  const int64_t keys = mask.window_left >= 0 ? std::min<int64_t>(max_kv_len, int64_t(mask.window_left) + 1) : max_kv_len;
  return keys <= 1536 ? 64 : 80;
}

}  // namespace escala::attn::cuda
