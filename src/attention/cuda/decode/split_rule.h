// The decode kernel's split count when its CTAs make one partial wave that still gives every SM a
// CTA (attention_cuda.cu, decode_num_splits). Host code, no CUDA: unit-tested on the CPU.
#pragma once

#include <cstdint>

namespace escala::attn::cuda {

// `units` CTAs without a split (sequences x kv heads x row tiles), `slots` CTAs the GPU holds at
// once, `warp_tiles` key tiles each warp takes without a split. Splits while all CTAs still fit in
// the one wave and each warp keeps at least 32 tiles, so that the merge's launch and partials cost
// less than the bytes the extra CTAs put in flight bring (H200: fp8 d128 at 17 x 8k, 136 CTAs:
// 0.133 ms with one split, 0.097 with two; at 24 x 8k 0.135 / 0.117; but SmolLM2's 9/3 d64 at
// 64 x 4k, 192 CTAs with 16 tiles per warp after a split: 54.0 us with one, 58.1 with two).
inline int partial_wave_splits(int64_t units, int64_t slots, int64_t warp_tiles) {
  int64_t s = 1;
  while (units > 0 && units * (s + 1) <= slots && warp_tiles / (s + 1) >= 32) ++s;
  return static_cast<int>(s);
}

}  // namespace escala::attn::cuda
