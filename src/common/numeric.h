// Scalar conversions between f32 and the storage types (f16, bf16, fp8 e4m3), host and device.
// Vectorised conversions live in the kernels (Highway / CUDA intrinsics); these define the values.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/hd.h"

namespace escala {

ESCALA_HD uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
ESCALA_HD float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

ESCALA_HD float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN.
ESCALA_HD uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

ESCALA_HD float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return bits_f32(sign | 0x7f800000u | (mant << 13));
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even, overflow to inf.
ESCALA_HD uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (a < 0x38800000u) {                                                  // subnormal or zero
    float v = bits_f32(a) * 16777216.0f;                                  // * 2^24
    uint32_t m = static_cast<uint32_t>(rintf(v));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

// fp8 e4m3 (OCP "fn" variant: no infinities, 0x7f/0xff are NaN, max 448).
ESCALA_HD float fp8e4m3_to_f32(uint8_t b) {
  uint32_t sign = (b & 0x80u) << 24;
  uint32_t exp = (b >> 3) & 0xfu;
  uint32_t mant = b & 0x7u;
  if (exp == 15 && mant == 7) return bits_f32(sign | 0x7fc00000u);
  if (exp == 0) {
    float v = static_cast<float>(mant) * 0.001953125f;  // 2^-9
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 120u) << 23) | (mant << 20));
}

// Round to nearest even, saturating at +-448 (the usual choice for KV caches).
ESCALA_HD uint8_t f32_to_fp8e4m3(float f) {
  uint32_t u = f32_bits(f);
  uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  float a = fabsf(f);
  if (a != a) return static_cast<uint8_t>(sign | 0x7f);
  if (a >= 448.0f) return static_cast<uint8_t>(sign | 0x7e);
  if (a < 0.015625f) {  // subnormal range: multiples of 2^-9
    uint32_t m = static_cast<uint32_t>(rintf(a * 512.0f));
    return static_cast<uint8_t>(sign | m);  // m == 8 lands on the smallest normal, as it should
  }
  uint32_t au = f32_bits(a);
  uint32_t r = au + 0x7ffffu + ((au >> 20) & 1u);
  uint32_t exp = (r >> 23) - 120u;
  uint32_t mant = (r >> 20) & 0x7u;
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

// Whether all n values are finite: the largest magnitude's bits stay below inf's. An integer max,
// which compilers vectorise; a float test with an early exit stays scalar (host only).
inline bool all_finite(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = f32_bits(x[i]) & 0x7fffffffu;
    m = b > m ? b : m;
  }
  return m < 0x7f800000u;
}

}  // namespace escala
