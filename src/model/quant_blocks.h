// ggml's block layouts, byte for byte (little-endian, no padding). Scales are IEEE f16 bits.
//
//   type  elems bytes  value of element j
//   q4_0   32    18    d * (nibble_j - 8)           nibble j<16: qs[j] & 15, else qs[j-16] >> 4
//   q4_1   32    20    d * nibble_j + m
//   q5_0   32    22    d * (nibble_j | bit_j(qh) << 4) - 16 * d      (qh: u32, bit j for element j)
//   q5_1   32    24    d * (nibble_j | bit_j(qh) << 4) + m
//   q8_0   32    34    d * qs[j]
//   q4_K  256   144    8 sub-blocks of 32 with 6-bit scale sc and min mn (packed in `scales`):
//                      d * sc * q - dmin * mn; chunk c (64 elements) uses qs[32c..32c+31], low
//                      nibbles for sub-block 2c, high nibbles for 2c+1
//   q5_K  256   176    as q4_K with a fifth bit: qh[l] bit 2c (low half) / 2c+1 (high half)
//   q6_K  256   210    16 sub-blocks of 16 with int8 scales: d * sc * (q - 32), q 6 bits from
//                      ql (4) and qh (2); see dequantize_q6_k for the interleaving
#pragma once

#include <cstdint>

namespace escala::model {

inline constexpr int kQK = 32;    // elements per block of the 32-element formats
inline constexpr int kQKK = 256;  // elements per K-quant super-block

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// The 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block. Bytes 0-3 hold scales 0-3
// (low 6 bits), 4-7 mins 0-3; bytes 8-11 hold the low nibbles of scales 4-7 and (high nibble)
// mins 4-7, whose top two bits sit in the spare top bits of bytes 0-3 and 4-7.
inline void k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

}  // namespace escala::model
