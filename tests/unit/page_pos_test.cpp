// The branch-free page division of the CUDA kernels (attention/cuda/page_pos.h) against `/` and `%`.
#include "attention/cuda/page_pos.h"

#include <gtest/gtest.h>

#include <climits>
#include <random>
#include <vector>

namespace escala::attn::cuda {
namespace {

void expect_exact(int page_size, int key) {
  const PagePos pos = page_pos(key, page_divisor(page_size));
  ASSERT_EQ(pos.page, key / page_size) << "page_size " << page_size << " key " << key;
  ASSERT_EQ(pos.row, key % page_size) << "page_size " << page_size << " key " << key;
}

TEST(PagePos, MatchesDivisionForEveryPageSizeUpTo4096) {
  std::mt19937 rng(11);
  for (int size = 1; size <= 4096; ++size) {
    for (int key = 0; key < 3 * size + 5; key += std::max(1, size / 7)) expect_exact(size, key);
    for (int i = 0; i < 64; ++i) expect_exact(size, static_cast<int>(rng() & 0x7fffffffu));
    for (int key = INT_MAX; key > INT_MAX - 2 * size - 3; --key) expect_exact(size, key);
  }
}

TEST(PagePos, MatchesDivisionForLargeAndOddPageSizes) {
  std::mt19937 rng(12);
  const std::vector<int> sizes = {65535, 65536, 100000, (1 << 20) + 7, 1 << 30, INT_MAX};
  for (int size : sizes) {
    for (int i = 0; i < 20000; ++i) expect_exact(size, static_cast<int>(rng() & 0x7fffffffu));
    for (int key : {0, 1, size - 1, INT_MAX, INT_MAX - 1}) expect_exact(size, key);
  }
}

}  // namespace
}  // namespace escala::attn::cuda
