// The decode split counts (attention/cuda/decode/split_rule.h): the measured H200 cases, and each
// rule's bounds on random inputs.
#include "attention/cuda/decode/split_rule.h"

#include <gtest/gtest.h>

#include <random>

namespace escala::attn::cuda {
namespace {

TEST(DecodeSplitRule, MeasuredShapes) {
  // fp8 d = 128 (three CTAs per SM: 396 slots, 32-key tiles, 4 warps): 17 x 8k and 24 x 8k split in two.
  EXPECT_EQ(partial_wave_splits(17 * 8, 396, 8192 / 32 / 4), 2);
  EXPECT_EQ(partial_wave_splits(24 * 8, 396, 8192 / 32 / 4), 2);
  // SmolLM2's 9/3 d = 64 at 64 x 4k, bf16: a split would leave 16 tiles per warp.
  EXPECT_EQ(partial_wave_splits(64 * 3, 396, 4096 / 32 / 4), 1);
  // ... fp8 (four CTAs per SM: 528 slots), where 16 tiles per warp are enough: two splits, not three
  // (576 CTAs would not fit in one wave).
  EXPECT_EQ(partial_wave_splits(64 * 3, 528, 4096 / 32 / 4, 16), 2);
  // bf16 d = 128 (two CTAs per SM: 264 slots) at 17 x 8k: two splits would not fit in one wave.
  EXPECT_EQ(partial_wave_splits(17 * 8, 264, 8192 / 16 / 4), 1);
}

TEST(DecodeSplitRule, LargestCountWithinBothBounds) {
  std::mt19937 rng(5);
  for (int i = 0; i < 10000; ++i) {
    const int64_t slots = 1 + rng() % 2000, units = 1 + rng() % slots, warp_tiles = rng() % 5000;
    const int64_t min_tiles = i % 2 == 0 ? 32 : 16;
    const int64_t s = partial_wave_splits(units, slots, warp_tiles, min_tiles);
    ASSERT_GE(s, 1);
    if (s > 1) {
      EXPECT_LE(units * s, slots);
      EXPECT_GE(warp_tiles / s, min_tiles);
    }
    EXPECT_TRUE(units * (s + 1) > slots || warp_tiles / (s + 1) < min_tiles) << units << " " << slots << " " << warp_tiles;
  }
}

TEST(DecodeSplitRule, WaveFillMeasuredShapes) {
  // (1, 32k), GQA 32/8: 8 units on 264 slots (two CTAs per SM). bf16 d = 128 (2048 tiles of 16 keys)
  // and fp8 d = 128 (1024 tiles of 32 keys): 32 splits, 16 or 8 tiles for every warp, not 30.
  EXPECT_EQ(wave_fill_splits(8, 264, 2048, 4, 256), 32);
  EXPECT_EQ(wave_fill_splits(8, 264, 1024, 4, 256), 32);
  EXPECT_NEAR(split_wave_use(8, 264, 2048, 4, 30), 240.0 / 264 * (2048.0 / 30) / 72, 1e-12);
  // 16 x 8k bf16 d = 128: 128 units, two splits fill one wave (three would need two).
  EXPECT_EQ(wave_fill_splits(128, 264, 512, 4, 64), 2);
  // 64 x 4k bf16 d = 128: 512 units already fill 97% of two waves.
  EXPECT_EQ(wave_fill_splits(512, 264, 256, 4, 32), 1);
  // Never 90%: the best use (one 2k sequence of 128 tiles, at most 16 splits).
  EXPECT_EQ(wave_fill_splits(8, 264, 128, 4, 16), 16);
}

TEST(DecodeSplitRule, WaveFillWithinBoundsAndAtLeastTheFirstFit) {
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    const int64_t slots = 1 + rng() % 1000, units = 1 + rng() % (2 * slots), n_tiles = 1 + rng() % 5000;
    const int warps = rng() % 2 ? 4 : 1;
    const int64_t max_splits = 1 + rng() % 300;
    const int64_t s = wave_fill_splits(units, slots, n_tiles, warps, max_splits);
    ASSERT_GE(s, 1);
    ASSERT_LE(s, max_splits);
    // The first count that reaches 90%, if any, and the result uses at least as much.
    int64_t first = 0;
    for (int64_t t = 1; t <= max_splits && first == 0; ++t)
      if (split_wave_use(units, slots, n_tiles, warps, t) >= 0.9) first = t;
    const double use = split_wave_use(units, slots, n_tiles, warps, s);
    if (first > 0) {
      EXPECT_GE(s, first);
      EXPECT_GE(use, split_wave_use(units, slots, n_tiles, warps, first) - 1e-12);
    } else {
      for (int64_t t = 1; t <= max_splits; ++t) EXPECT_GE(use, split_wave_use(units, slots, n_tiles, warps, t) - 1e-9);
    }
  }
}

}  // namespace
}  // namespace escala::attn::cuda
