// Normalized fast Walsh-Hadamard transform (the "incoherent processing" of FlashAttention-3's FP8
// path): spreads an outlier channel over all channels of its part so per-row or per-block scales
// cover a narrower range.
#include <cmath>

#include "escala/kv_cache.h"

namespace escala::kv {

namespace {
// In-place unnormalized transform of a power-of-two run, then scaled by 1/sqrt(n).
void fwht_pow2(float* x, int32_t n) {
  for (int32_t len = 1; len < n; len <<= 1)
    for (int32_t i = 0; i < n; i += len << 1)
      for (int32_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int32_t i = 0; i < n; ++i) x[i] *= norm;
}
}  // namespace

void hadamard_rotate(float* x, int64_t rows, int32_t d) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * d;
    // Block-diagonal over the binary digits of d, largest part first (96 -> 64 + 32).
    int32_t at = 0;
    for (int32_t bit = 30; bit >= 0; --bit) {
      const int32_t part = int32_t(1) << bit;
      if (d & part) {
        if (part > 1) fwht_pow2(row + at, part);
        at += part;
      }
    }
  }
}

}  // namespace escala::kv
