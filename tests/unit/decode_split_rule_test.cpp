// The decode split count for one partial wave (attention/cuda/decode/split_rule.h): the measured
// H200 cases, and the rule's two bounds on random inputs.
#include "attention/cuda/decode/split_rule.h"

#include <gtest/gtest.h>

#include <random>

namespace escala::attn::cuda {
namespace {

TEST(DecodeSplitRule, MeasuredShapes) {
  // fp8 d = 128 (three CTAs per SM: 396 slots, 32-key tiles, 4 warps): 17 x 8k and 24 x 8k split in two.
  EXPECT_EQ(partial_wave_splits(17 * 8, 396, 8192 / 32 / 4), 2);
  EXPECT_EQ(partial_wave_splits(24 * 8, 396, 8192 / 32 / 4), 2);
  // SmolLM2's 9/3 d = 64 at 64 x 4k: a split would leave 16 tiles per warp.
  EXPECT_EQ(partial_wave_splits(64 * 3, 396, 4096 / 32 / 4), 1);
  // bf16 d = 128 (two CTAs per SM: 264 slots) at 17 x 8k: two splits would not fit in one wave.
  EXPECT_EQ(partial_wave_splits(17 * 8, 264, 8192 / 16 / 4), 1);
}

TEST(DecodeSplitRule, LargestCountWithinBothBounds) {
  std::mt19937 rng(5);
  for (int i = 0; i < 10000; ++i) {
    const int64_t slots = 1 + rng() % 2000, units = 1 + rng() % slots, warp_tiles = rng() % 5000;
    const int64_t s = partial_wave_splits(units, slots, warp_tiles);
    ASSERT_GE(s, 1);
    if (s > 1) {
      EXPECT_LE(units * s, slots);
      EXPECT_GE(warp_tiles / s, 32);
    }
    EXPECT_TRUE(units * (s + 1) > slots || warp_tiles / (s + 1) < 32) << units << " " << slots << " " << warp_tiles;
  }
}

}  // namespace
}  // namespace escala::attn::cuda
