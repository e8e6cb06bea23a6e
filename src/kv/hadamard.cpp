// Normalized fast Walsh-Hadamard transform (the "incoherent processing" of FlashAttention-3's FP8
// path): spreads an outlier channel over all channels of its part so per-row or per-block scales
// cover a narrower range.
#include "escala/kv_cache.h"
#include "kv/row_codec.h"

namespace escala::kv {

void hadamard_rotate(float* x, int64_t rows, int32_t d) {
  for (int64_t r = 0; r < rows; ++r) hadamard_row(x + r * d, d);
}

}  // namespace escala::kv
