// Where key `key` of a paged sequence lives: its page (an index into the sequence's page list) and
// its row inside that page, by a multiply-high with a magic number computed once on the host
// (Granlund and Montgomery's division by an invariant integer), without a branch. A plain `/` by
// the runtime page size is ~20 dependent instructions per K/V tile in the decode warps and the
// prefill producer; a branch between a shift and `/` split the decode loop's scheduling region
// (fp8 decode ran 4% slower with it). C++17, host and device.
#pragma once

#include <cstdint>

#include "common/hd.h"

namespace escala::attn::cuda {

// The page size as a divisor: page = (mulhi(key, magic) + key) >> shift, exact for 0 <= key < 2^31.
struct PageDivisor {
  int32_t size = 0;
  uint32_t magic = 0;
  int32_t shift = 0;
};

inline PageDivisor page_divisor(int page_size) {
  PageDivisor d;
  d.size = page_size;
  if (page_size <= 0) return d;
  int l = 0;
  while ((int64_t(1) << l) < page_size) ++l;  // l = ceil(log2(page_size))
  d.shift = l;
  // floor(2^32 (2^l - size) / size) + 1 < 2^32
  d.magic = static_cast<uint32_t>((((uint64_t(1) << l) - uint64_t(page_size)) << 32) / uint64_t(page_size) + 1);
  return d;
}

struct PagePos {
  int page;
  int row;
};

ESCALA_HD PagePos page_pos(int key, const PageDivisor& d) {
  const uint32_t k = static_cast<uint32_t>(key);
  const uint32_t hi = static_cast<uint32_t>((uint64_t(k) * d.magic) >> 32);
  const int page = static_cast<int>((hi + k) >> d.shift);  // hi <= k < 2^31: no overflow
  return {page, key - page * d.size};
}

}  // namespace escala::attn::cuda
