// The decode kernel's split counts (attention_cuda.cu, decode_num_splits) for CTAs that make one
// partial wave, or that leave SMs idle. Host code, no CUDA: unit-tested on the CPU.
#pragma once

#include <cstdint>

namespace escala::attn::cuda {

// `units` CTAs without a split (sequences x kv heads x row tiles), `slots` CTAs the GPU holds at
// once, `warp_tiles` key tiles each warp takes without a split. Splits while all CTAs still fit in
// the one wave and each warp keeps at least `min_warp_tiles` tiles, so that the merge's launch and
// partials cost less than what the extra CTAs bring: bytes in flight for 16-bit K/V (32 tiles; H200:
// bf16 SmolLM2's 9/3 d64 at 64 x 4k, 192 CTAs with 16 tiles per warp after a split: 54.0 us with
// one, 58.1 with two), warps to hide each other's math for 8-bit K/V (16 tiles; fp8 d128 at 17 x 8k,
// 136 CTAs: 0.133 ms with one split, 0.097 with two; fp8 SmolLM2's shape at 4 CTAs per SM: 44.2 us
// with one, 41.4 with two).
inline int partial_wave_splits(int64_t units, int64_t slots, int64_t warp_tiles, int64_t min_warp_tiles = 32) {
  int64_t s = 1;
  while (units > 0 && units * (s + 1) <= slots && warp_tiles / (s + 1) >= min_warp_tiles) ++s;
  return static_cast<int>(s);
}

// The fraction of its waves' capacity that `units` x `s` CTAs use, where a split's `per_split`
// tiles, dealt round-robin to `warps` warps, last ceil(per_split / warps) tiles of its slowest warp.
inline double split_wave_use(int64_t units, int64_t slots, int64_t n_tiles, int warps, int64_t s) {
  const int64_t ctas = units * s, waves = (ctas + slots - 1) / slots;
  const int64_t per_split = (n_tiles + s - 1) / s, slowest = (per_split + warps - 1) / warps;
  return double(ctas) / double(waves * slots) * (double(n_tiles) / double(s)) / double(warps * slowest);
}

// Splits for CTAs that leave SMs idle or fill less than two waves: the fewest splits whose CTAs use
// 90% of their waves (split_wave_use), then, within that many waves, a count that uses them over 1%
// better; without 90%, the best use. Counting the slowest warp matters: 2048 tiles in 30 splits
// give it 18 tiles for an average of 17.1 (H200, bf16 d = 128 at (1, 32k): 40.6 us), in 32 splits
// 16 (39.9 us; fp8 28.6 us against 29.6, bf16 d = 64 23.6 against 24.1).
inline int wave_fill_splits(int64_t units, int64_t slots, int64_t n_tiles, int warps, int64_t max_splits) {
  int64_t best = 1, s = 1;
  double best_use = split_wave_use(units, slots, n_tiles, warps, 1);
  for (; s <= max_splits; ++s) {
    const double use = split_wave_use(units, slots, n_tiles, warps, s);
    if (use > best_use + 1e-9) best = s, best_use = use;
    if (use >= 0.9) break;
  }
  if (s > max_splits) return static_cast<int>(best);
  const int64_t waves = (units * s + slots - 1) / slots;
  for (int64_t t = s + 1; t <= max_splits && (units * t + slots - 1) / slots == waves; ++t) {
    const double use = split_wave_use(units, slots, n_tiles, warps, t);
    if (use > best_use + 0.01) best = t, best_use = use;
  }
  return static_cast<int>(best);
}

}  // namespace escala::attn::cuda
