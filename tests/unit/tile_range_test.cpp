// The sm_90 kernel's per-query-tile mask test (attention/cuda/tile_range.cuh): visible_tiles must
// agree with tile_fully_visible, tile by tile, for every mask kind and alignment.
#include "attention/cuda/tile_range.cuh"

#include <gtest/gtest.h>

#include <random>

namespace escala::attn::cuda {
namespace {

TEST(VisibleTiles, AgreesWithPerTileTest) {
  std::mt19937 rng(20261130);
  const int32_t windows[] = {-1, 0, 1, 63, 64, 127, 128, 200, 4095};
  const int32_t sinks[] = {0, 1, 4, 64, 128, 300};
  int64_t checked = 0, visible = 0;
  for (int32_t bn : {64, 80, 112, 128}) {
    for (int trial = 0; trial < 400; ++trial) {
      Mask m;
      m.causal = rng() % 2;
      m.window_left = windows[rng() % 9];
      m.window_right = rng() % 3 == 0 ? windows[rng() % 9] : -1;
      m.num_sinks = sinks[rng() % 6];
      const int64_t kv_len = 1 + rng() % 3000;
      const int64_t q_len = 1 + rng() % 3000;  // shift = kv_len - q_len may be negative
      const int64_t rows = (rng() % 2) ? 128 : 192;
      for (int64_t m0 = 0; m0 < q_len; m0 += rows) {
        const int64_t qp_min = m0 + kv_len - q_len, qp_max = std::min(m0 + rows, q_len) - 1 + kv_len - q_len;
        const VisibleTiles v = visible_tiles(m, qp_min, qp_max, kv_len, bn);
        for (int32_t t = 0; int64_t(t) * bn < kv_len + bn; ++t) {
          const bool want = tile_fully_visible(m, qp_min, qp_max, int64_t(t) * bn, bn, kv_len);
          ASSERT_EQ(v.has(t), want) << "bn " << bn << " causal " << m.causal << " wl " << m.window_left << " wr "
                                    << m.window_right << " sinks " << m.num_sinks << " kv " << kv_len << " q "
                                    << q_len << " m0 " << m0 << " tile " << t;
          ++checked, visible += want;
        }
      }
    }
  }
  EXPECT_GT(visible, checked / 10);  // the grid has both kinds of tiles
  EXPECT_LT(visible, checked);
}

TEST(TileRange, CountBelowMatchesVisitedTiles) {
  // count_below(t) is the number of i in [0, count()) with at(i) < t, for ranges with and without
  // separate sink tiles and with an empty window part.
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 2000; ++trial) {
    TileRange r;
    r.first = rng() % 20;
    r.end = r.first + static_cast<int32_t>(rng() % 20) - 3;  // empty when end <= first
    r.sink_tiles = r.first > 1 && rng() % 2 ? 1 + rng() % (r.first - 1) : 0;
    for (int32_t t = 0; t < 45; ++t) {
      int32_t want = 0;
      for (int32_t i = 0; i < r.count(); ++i) want += r.at(i) < t;
      ASSERT_EQ(r.count_below(t), want) << "sinks " << r.sink_tiles << " first " << r.first << " end " << r.end
                                        << " t " << t;
    }
  }
}

}  // namespace
}  // namespace escala::attn::cuda
