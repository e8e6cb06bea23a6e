// How one K or V row [head_dim] is stored, shared by the host pools (kv_storage.cpp) and the device
// pools (cuda/device_pool.cu) so that both hold the same bits: the Hadamard rotation, and the
// encoders of every cache format with their scale rules (see kv_storage.h for the fp8 policy).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/hd.h"
#include "common/numeric.h"
#include "escala/dtype.h"

namespace escala::kv {

constexpr float kI8Max = 127.0f;
constexpr float kFp8Max = 448.0f;

// In-place normalized fast Walsh-Hadamard transform of a power-of-two run.
ESCALA_HD void fwht_pow2(float* x, int32_t n) {
  for (int32_t len = 1; len < n; len <<= 1)
    for (int32_t i = 0; i < n; i += len << 1)
      for (int32_t j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const float norm = 1.0f / sqrtf(static_cast<float>(n));
  for (int32_t i = 0; i < n; ++i) x[i] *= norm;
}

// Block-diagonal over the binary digits of d, largest part first (96 -> 64 + 32).
ESCALA_HD void hadamard_row(float* row, int32_t d) {
  int32_t at = 0;
  for (int32_t bit = 30; bit >= 0; --bit) {
    const int32_t part = int32_t(1) << bit;
    if (d & part) {
      if (part > 1) fwht_pow2(row + at, part);
      at += part;
    }
  }
}

// Smallest power of two >= x (x >= 0; 0 stays 0).
ESCALA_HD float pow2_at_least(float x) {
  if (!(x > 0.0f)) return 0.0f;
  int e = 0;
  const float m = frexpf(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return m == 0.5f ? x : ldexpf(1.0f, e);
}

ESCALA_HD float max_abs(const float* x, int32_t d) {
  float mx = 0.0f;
  for (int32_t c = 0; c < d; ++c) mx = fmaxf(mx, fabsf(x[c]));
  return mx;
}

// Stores a float-format row (f32, f16, bf16).
ESCALA_HD void encode_float_row(uint8_t* dst, DType t, const float* x, int32_t d) {
  for (int32_t c = 0; c < d; ++c) {
    switch (t) {
      case DType::kF16: reinterpret_cast<uint16_t*>(dst)[c] = f32_to_f16(x[c]); break;
      case DType::kBF16: reinterpret_cast<uint16_t*>(dst)[c] = f32_to_bf16(x[c]); break;
      default: reinterpret_cast<float*>(dst)[c] = x[c]; break;
    }
  }
}

// int8 with a scale per row: returns the scale.
ESCALA_HD float encode_i8_row(int8_t* dst, const float* x, int32_t d) {
  const float sc = max_abs(x, d) / kI8Max;
  const float inv = sc > 0 ? 1.0f / sc : 0.0f;
  for (int32_t c = 0; c < d; ++c) {
    const float r = rintf(x[c] * inv);
    dst[c] = static_cast<int8_t>(r < -127.0f ? -127.0f : (r > 127.0f ? 127.0f : r));
  }
  return sc;
}

// fp8 e4m3 row `slot` of a block whose scale is `*scale` (0 before the first token). When the row
// needs a larger scale, the block's rows [0, slot) are re-encoded first: `earlier(s)` gives row s.
template <class RowOf>
ESCALA_HD void encode_fp8_row(uint8_t* dst, float* scale, const float* x, int32_t d, int32_t slot, RowOf earlier) {
  const float need = pow2_at_least(max_abs(x, d) / kFp8Max);
  if (need > *scale) {
    // Exact for normal values: old / need is a power of two.
    const float ratio = *scale / need;
    for (int32_t s = 0; s < slot; ++s) {
      uint8_t* r = earlier(s);
      for (int32_t c = 0; c < d; ++c) r[c] = f32_to_fp8e4m3(fp8e4m3_to_f32(r[c]) * ratio);
    }
    *scale = need;
  }
  const float inv = *scale > 0 ? 1.0f / *scale : 0.0f;
  for (int32_t c = 0; c < d; ++c) dst[c] = f32_to_fp8e4m3(x[c] * inv);
}

}  // namespace escala::kv
