// The sm_90 prefill kernel's deferred partial tiles (attention/cuda/sm90/work_order.h): every item
// claimed exactly once, the claims before the tail unchanged, the tail's last tiles at the end.
#include "attention/cuda/sm90/work_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace escala::attn::cuda {
namespace {

TEST(Sm90WorkOrder, TailClaimOrderIsABijectionWithTheLastTilesAtTheEnd) {
  for (int pairs : {1, 2, 7, 64})
    for (int m_blocks : {2, 3, 6})
      for (int tail = 0; tail <= pairs; tail += tail < 3 ? 1 : pairs / 4 + 1) {
        SCOPED_TRACE(::testing::Message() << "pairs " << pairs << " m_blocks " << m_blocks << " tail " << tail);
        const int items = pairs * m_blocks;
        std::vector<int> seen(size_t(items), 0);
        for (int c = 0; c < items; ++c) {
          const int w = tail_claim_order(c, pairs, m_blocks, tail);
          ASSERT_GE(w, 0);
          ASSERT_LT(w, items);
          ++seen[size_t(w)];
          const int pair = w / m_blocks;
          const bool last_tile = w % m_blocks == 0;  // decode's order: a pair's tiles from its last
          if (c < (pairs - tail) * m_blocks) {
            EXPECT_EQ(w, c);  // before the tail: unchanged
          } else if (c >= items - tail) {
            EXPECT_TRUE(last_tile) << c;  // the tail's end: last tiles only, in pair order
            EXPECT_EQ(pair, pairs - tail + (c - (items - tail)));
          } else {
            EXPECT_FALSE(last_tile) << c;
          }
        }
        for (int w = 0; w < items; ++w) EXPECT_EQ(seen[size_t(w)], 1) << "item " << w;
      }
}

}  // namespace
}  // namespace escala::attn::cuda
