// Shared between the per-target matmul kernels (quant_matmul.cpp, compiled once per SIMD
// target by Highway) and the dispatching code.
#pragma once

#include <cstdint>
#include <vector>

#include "escala/quant.h"

namespace escala::model {

// Activations quantized to 8-bit levels, stored widened to int16 so the kernels can use 16-bit
// multiply-add directly. `block` is the scale granularity: 32 for the 32-element weight formats
// (llama.cpp's q8_0/q8_1 counterpart), 256 for the K-quants (q8_K).
struct QuantizedActs {
  int64_t m = 0;      // rows
  int64_t k = 0;      // elements per row
  int64_t block = 32;
  std::vector<int16_t> q;     // m * k levels in [-127, 127]
  std::vector<float> d;       // m * (k / block) scales
  std::vector<float> s;       // m * (k / 32): scale * sum of the 32 levels (32-block rows only)
  std::vector<int32_t> bsum;  // m * (k / 32): sum of each 32 levels (256-block rows only)

  const int16_t* row_q(int64_t r) const { return q.data() + r * k; }
  const float* row_d(int64_t r) const { return d.data() + r * (k / block); }
  const float* row_s(int64_t r) const { return s.data() + r * (k / 32); }
  const int32_t* row_bsum(int64_t r) const { return bsum.data() + r * (k / 32); }
};

// Everything one kernel call needs: rows [row_begin, row_end) of W against all m activation rows.
struct MatmulArgs {
  WeightView w;
  const float* x = nullptr;          // m x cols, f32 (f32/f16 weights and the fallback)
  const QuantizedActs* acts = nullptr;  // quantized types with a fast kernel
  int64_t m = 0;
  float* y = nullptr;  // m x rows
};

}  // namespace escala::model
