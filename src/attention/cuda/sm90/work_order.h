// The sm_90 prefill kernel's work order for uniform items (no mask that makes query tiles differ
// in length: one (sequence, head) pair per section, a pair's query tiles from its last to its
// first). Host and device code: unit-tested on the CPU (tests/unit/sm90_work_order_test.cpp).
#pragma once

#include "common/hd.h"

namespace escala::attn::cuda {

// The item index (decode's order: pair * m_blocks + tiles counted back from the pair's last)
// that the scheduler's claim `c` takes when the last query tile of each of the last `tail` pairs,
// partial and so the shortest item, is deferred to the very end (FwdParams::sched_tail): the
// claims before the tail take their own items; the tail's pairs then give their other tiles pair
// by pair, and their last tiles after all of those. A bijection on [0, pairs * m_blocks) for
// 0 <= tail <= pairs and m_blocks >= 2 (tail 0: the identity).
ESCALA_HD int tail_claim_order(int c, int pairs, int m_blocks, int tail) {
  const int tail_start = (pairs - tail) * m_blocks;
  if (c < tail_start) return c;
  const int r = c - tail_start, others = m_blocks - 1;
  const bool last = r >= tail * others;
  const int pair = pairs - tail + (last ? r - tail * others : r / others);
  return pair * m_blocks + (last ? 0 : 1 + r % others);
}

}  // namespace escala::attn::cuda
