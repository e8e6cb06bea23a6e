// The sm_90 prefill kernel's tile shapes (attention/cuda/sm90/tile_rows.h): the height at d = 64,
// measured on an H200 (132 SMs) under sustained load, session 13 (docs/cuda_notes.md, step 60;
// S = 4k causal again in session 28, step 133; S = 1k and S = 2k causal with the 192-row kernel's
// bulk stores in session 30, step 139), and
// the key-tile width at d = 256 (session 23, step 102).
#include "attention/cuda/sm90/tile_rows.h"

#include <gtest/gtest.h>

namespace escala::attn::cuda {
namespace {

constexpr int kH200Sms = 132;

int rows_for(int S, int batch, int heads, bool causal) {
  Mask m;
  m.causal = causal;
  return dense_tile_rows_d64(m, S, S, batch, heads, kH200Sms);
}

TEST(Sm90TileRows, MeasuredFasterHeight) {
  // The faster height in each measured pair (µs, 128 rows / 192 rows).
  EXPECT_EQ(rows_for(1024, 32, 32, false), 192);   // 731 / 775 in session 13; 340.1 / 330.6 (16 heads) in session 30
  EXPECT_EQ(rows_for(1024, 32, 32, true), 128);    // 461 / 569
  EXPECT_EQ(rows_for(4096, 8, 32, false), 192);    // 2581 / 2470
  EXPECT_EQ(rows_for(4096, 8, 32, true), 192);     // 1364 / 1406 in session 13; 657.2 / 646.6 (16 heads) in session 28
  EXPECT_EQ(rows_for(16384, 2, 32, false), 192);   // 9920 / 9260
  EXPECT_EQ(rows_for(16384, 2, 32, true), 192);    // 4970 / 4750
  EXPECT_EQ(rows_for(8192, 4, 32, false), 192);    // GQA 32/8: 4960 / 4660
  EXPECT_EQ(rows_for(2000, 16, 32, true), 192);    // 771 / 802 in session 13; S2k 365.1 / 364.2 (16 heads) in session 30
}

TEST(Sm90TileRows, ShortQueriesKeep128Rows) {
  // A query run of at most 128 rows is one 128-row tile; a 192-row tile would only add padding.
  for (int q : {1, 16, 128}) {
    Mask m;
    m.causal = true;
    EXPECT_EQ(dense_tile_rows_d64(m, q, 8192, 64, 32, kH200Sms), 128) << q;
  }
}

TEST(Sm90KeyTile, D256CausalShortRowsTake64Keys) {
  Mask m;
  EXPECT_EQ(dense_key_tile_d256(m, 1024), 80);  // non-causal: 80 at every length
  m.causal = true;
  EXPECT_EQ(dense_key_tile_d256(m, 1024), 64);   // measured 2.4-2.7% faster
  EXPECT_EQ(dense_key_tile_d256(m, 2048), 80);   // 0.8% slower with 64
  EXPECT_EQ(dense_key_tile_d256(m, 4096), 80);   // 0-1.6% slower with 64
  EXPECT_EQ(dense_key_tile_d256(m, 16384), 80);  // 3.2% slower with 64
  m.window_left = 1023;                           // a query tile sees ~1k keys of a long row
  EXPECT_EQ(dense_key_tile_d256(m, 16384), 64);  // 2.2% faster
  m.window_left = 4095;
  EXPECT_EQ(dense_key_tile_d256(m, 16384), 80);
}

}  // namespace
}  // namespace escala::attn::cuda
