// Tensor formats: dequantizers against blocks written byte by byte with the expected values
// worked out by hand from the format definitions, and quantize/dequantize round-trip bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "escala/quant.h"

namespace escala::model {
namespace {

std::vector<float> dequant(TensorType t, const std::vector<uint8_t>& bytes) {
  int64_t n = static_cast<int64_t>(bytes.size()) / block_bytes(t) * block_elems(t);
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, bytes.data(), out.data(), n);
  return out;
}

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v & 0xff);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

// f16 bit patterns used below: 0x3C00 = 1, 0x3800 = 0.5, 0x4000 = 2, 0xBC00 = -1, 0xC000 = -2.

TEST(QuantFormats, TraitsMatchGgml) {
  EXPECT_EQ(block_bytes(TensorType::kQ4_0), 18);
  EXPECT_EQ(block_bytes(TensorType::kQ4_1), 20);
  EXPECT_EQ(block_bytes(TensorType::kQ5_0), 22);
  EXPECT_EQ(block_bytes(TensorType::kQ5_1), 24);
  EXPECT_EQ(block_bytes(TensorType::kQ8_0), 34);
  EXPECT_EQ(block_bytes(TensorType::kQ4_K), 144);
  EXPECT_EQ(block_bytes(TensorType::kQ5_K), 176);
  EXPECT_EQ(block_bytes(TensorType::kQ6_K), 210);
  EXPECT_EQ(block_elems(TensorType::kQ6_K), 256);
  EXPECT_EQ(static_cast<uint32_t>(TensorType::kBF16), 30u);
  EXPECT_EQ(*row_bytes(TensorType::kQ4_1, 576), 18u * 20u);
  EXPECT_FALSE(row_bytes(TensorType::kQ4_K, 576).has_value());  // not a multiple of 256
  for (TensorType t : kAllTensorTypes) {
    EXPECT_EQ(tensor_type_from_id(static_cast<uint32_t>(t)), t);
    EXPECT_EQ(parse_tensor_type(tensor_type_name(t)), t);
  }
  EXPECT_FALSE(tensor_type_from_id(4).has_value());   // removed q4_2
  EXPECT_FALSE(tensor_type_from_id(16).has_value());  // iq2_xxs: not supported
  EXPECT_EQ(parse_tensor_type("Q4_k"), TensorType::kQ4_K);
}

TEST(QuantFormats, HandBlocksPlainFloats) {
  std::vector<uint8_t> f16(8);
  put16(f16, 0, 0x3C00);  // 1
  put16(f16, 2, 0xC000);  // -2
  put16(f16, 4, 0x7BFF);  // 65504, the largest finite f16
  put16(f16, 6, 0x0001);  // 2^-24, the smallest subnormal
  auto v = dequant(TensorType::kF16, f16);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
  EXPECT_EQ(v[2], 65504.0f);
  EXPECT_EQ(v[3], std::ldexp(1.0f, -24));

  std::vector<uint8_t> bf16(4);
  put16(bf16, 0, 0x3F80);  // 1
  put16(bf16, 2, 0xC040);  // -3
  v = dequant(TensorType::kBF16, bf16);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -3.0f);
}

TEST(QuantFormats, HandBlockQ8_0) {
  std::vector<uint8_t> b(34, 0);
  put16(b, 0, 0x3800);  // d = 0.5
  b[2] = 1;
  b[3] = static_cast<uint8_t>(-2);
  b[4] = 127;
  b[33] = static_cast<uint8_t>(-128);
  auto v = dequant(TensorType::kQ8_0, b);
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_EQ(v[1], -1.0f);
  EXPECT_EQ(v[2], 63.5f);
  EXPECT_EQ(v[3], 0.0f);
  EXPECT_EQ(v[31], -64.0f);
}

TEST(QuantFormats, HandBlockQ4_0) {
  std::vector<uint8_t> b(18, 0x88);  // every nibble 8 -> 0
  put16(b, 0, 0x4000);               // d = 2
  b[2] = 0x1F;  // element 0: (15 - 8) * 2 = 14; element 16: (1 - 8) * 2 = -14
  b[3] = 0x80;  // element 1: (0 - 8) * 2 = -16; element 17: 0
  auto v = dequant(TensorType::kQ4_0, b);
  EXPECT_EQ(v[0], 14.0f);
  EXPECT_EQ(v[16], -14.0f);
  EXPECT_EQ(v[1], -16.0f);
  EXPECT_EQ(v[17], 0.0f);
  EXPECT_EQ(v[5], 0.0f);
}

TEST(QuantFormats, HandBlockQ4_1) {
  std::vector<uint8_t> b(20, 0);
  put16(b, 0, 0x3800);  // d = 0.5
  put16(b, 2, 0xBC00);  // m = -1
  b[4] = 0x3A;          // element 0: 10 * 0.5 - 1 = 4; element 16: 3 * 0.5 - 1 = 0.5
  b[19] = 0xF0;         // element 15: -1; element 31: 15 * 0.5 - 1 = 6.5
  auto v = dequant(TensorType::kQ4_1, b);
  EXPECT_EQ(v[0], 4.0f);
  EXPECT_EQ(v[16], 0.5f);
  EXPECT_EQ(v[15], -1.0f);
  EXPECT_EQ(v[31], 6.5f);
}

TEST(QuantFormats, HandBlockQ5_0) {
  std::vector<uint8_t> b(22, 0);
  put16(b, 0, 0x3C00);  // d = 1
  b[2] = 0x01;          // qh bit 0: element 0 has its fifth bit
  b[4] = 0x01;          // qh bit 16: element 16
  b[5] = 0x80;          // qh bit 31: element 31
  b[6] = 0x21;          // element 0: (1 | 16) - 16 = 1; element 16: (2 | 16) - 16 = 2
  b[21] = 0x70;         // element 15: 0 - 16; element 31: (7 | 16) - 16 = 7
  auto v = dequant(TensorType::kQ5_0, b);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[16], 2.0f);
  EXPECT_EQ(v[1], -16.0f);
  EXPECT_EQ(v[15], -16.0f);
  EXPECT_EQ(v[31], 7.0f);
}

TEST(QuantFormats, HandBlockQ5_1) {
  std::vector<uint8_t> b(24, 0);
  put16(b, 0, 0x3800);  // d = 0.5
  put16(b, 2, 0x4000);  // m = 2
  b[7] = 0x80;          // qh bit 31
  b[8 + 15] = 0xF0;     // element 15: 0 * 0.5 + 2; element 31: 31 * 0.5 + 2 = 17.5
  b[8] = 0x09;          // element 0: 9 * 0.5 + 2 = 6.5
  auto v = dequant(TensorType::kQ5_1, b);
  EXPECT_EQ(v[15], 2.0f);
  EXPECT_EQ(v[31], 17.5f);
  EXPECT_EQ(v[0], 6.5f);
  EXPECT_EQ(v[16], 2.0f);
}

TEST(QuantFormats, HandBlockQ4_K) {
  // d = 1, dmin = 0.5. Sub-block 0: scale 3, min 2. Sub-block 1: scale 1, min 0.
  // Sub-block 5: scale 37 (0b10'0101), min 19 (0b01'0011): low nibbles in byte 9, top bits in
  // bytes 1 (scale) and 5 (min).
  std::vector<uint8_t> b(144, 0);
  put16(b, 0, 0x3C00);
  put16(b, 2, 0x3800);
  uint8_t* s = b.data() + 4;
  s[0] = 3;
  s[1] = 1 | (2 << 6);   // scale 1 of sub-block 1, top bits of scale 5
  s[4] = 2;              // min of sub-block 0
  s[5] = 0 | (1 << 6);   // min 0 of sub-block 1, top bits of min 5
  s[9] = 0x5 | (0x3 << 4);
  uint8_t* qs = b.data() + 16;
  qs[0] = 0x47;   // element 0 (sub-block 0): 3 * 7 - 0.5 * 2 = 20; element 32 (sub-block 1): 4
  qs[64] = 0xA0;  // element 160 (sub-block 5, chunk 2 high nibble): 37 * 10 - 0.5 * 19 = 360.5
  auto v = dequant(TensorType::kQ4_K, b);
  EXPECT_EQ(v[0], 20.0f);
  EXPECT_EQ(v[1], -1.0f);  // nibble 0 in sub-block 0: -dmin * 2
  EXPECT_EQ(v[32], 4.0f);
  EXPECT_EQ(v[160], 360.5f);
  EXPECT_EQ(v[161], -9.5f);
  EXPECT_EQ(v[128], 0.0f);  // sub-block 4: scale 0, min 0
}

TEST(QuantFormats, HandBlockQ5_K) {
  // d = 1, dmin = 1; sub-block 0: scale 2, min 1; sub-block 1: scale 1, min 0;
  // sub-block 2: scale 4, min 0.
  std::vector<uint8_t> b(176, 0);
  put16(b, 0, 0x3C00);
  put16(b, 2, 0x3C00);
  uint8_t* s = b.data() + 4;
  s[0] = 2;
  s[1] = 1;
  s[2] = 4;
  s[4] = 1;
  uint8_t* qh = b.data() + 16;
  uint8_t* qs = b.data() + 48;
  qh[0] = 0x03 | 0x04;  // fifth bits: element 0 (bit 0), element 32 (bit 1), element 64 (bit 2)
  qs[0] = 0x53;         // element 0: 2 * (3 | 16) - 1 = 37; element 32: 1 * (5 | 16) = 21
  qs[32] = 0x02;        // element 64 (chunk 1 low, sub-block 2): 4 * (2 | 16) = 72
  auto v = dequant(TensorType::kQ5_K, b);
  EXPECT_EQ(v[0], 37.0f);
  EXPECT_EQ(v[32], 21.0f);
  EXPECT_EQ(v[64], 72.0f);
  EXPECT_EQ(v[1], -1.0f);
  EXPECT_EQ(v[96], 0.0f);  // sub-block 3: all zero
}

TEST(QuantFormats, HandBlockQ6_K) {
  // d = 0.5; scales (int8) of sub-blocks 0, 2, 4, 6, 8: 2, -1, 3, 1, 4.
  std::vector<uint8_t> b(210, 0);
  uint8_t* ql = b.data();
  uint8_t* qh = b.data() + 128;
  auto* sc = reinterpret_cast<int8_t*>(b.data() + 192);
  put16(b, 208, 0x3800);
  sc[0] = 2;
  sc[2] = -1;
  sc[4] = 3;
  sc[6] = 1;
  sc[8] = 4;
  ql[0] = 0x21;
  qh[0] = 0xE4;  // 2-bit fields (low to high): 0, 1, 2, 3
  // element 0:   ql[0] low 1  | 0<<4 = 1  -> 1 - 32 = -31 -> 0.5 * 2 * -31 = -31
  // element 32:  ql[32] low 0 | 1<<4 = 16 -> -16 -> 0.5 * -1 * -16 = 8
  // element 64:  ql[0] high 2 | 2<<4 = 34 -> 2 -> 0.5 * 3 * 2 = 3
  // element 96:  ql[32] high 0 | 3<<4 = 48 -> 16 -> 0.5 * 1 * 16 = 8
  ql[64] = 0x0F;
  qh[32] = 0x03;
  // element 128: ql[64] low 15 | 3<<4 = 63 -> 31 -> 0.5 * 4 * 31 = 62
  auto v = dequant(TensorType::kQ6_K, b);
  EXPECT_EQ(v[0], -31.0f);
  EXPECT_EQ(v[32], 8.0f);
  EXPECT_EQ(v[64], 3.0f);
  EXPECT_EQ(v[96], 8.0f);
  EXPECT_EQ(v[128], 62.0f);
  EXPECT_EQ(v[1], -32.0f);  // level 0 -> -32 * 0.5 * 2
  EXPECT_EQ(v[16], 0.0f);   // sub-block 1 has scale 0
}

// Quantize then dequantize random data: every element within `bound` x the largest magnitude
// of its block (super-block for the K-quants), and the RMS error under `rms`.
struct RoundTripCase {
  TensorType type;
  double bound;  // max |error| / block absmax
  double rms;    // rms error / rms value
};

TEST(QuantFormats, RoundTripErrorBounds) {
  const RoundTripCase cases[] = {
      {TensorType::kF32, 0, 0},
      {TensorType::kF16, 1e-3, 5e-4},
      {TensorType::kBF16, 4e-3, 3e-3},
      {TensorType::kQ8_0, 1.0 / 254 * 1.01, 0.0135},
      {TensorType::kQ4_0, 1.0 / 8 * 1.01, 0.12},
      {TensorType::kQ4_1, 1.0 / 15 * 1.01, 0.09},
      {TensorType::kQ5_0, 1.0 / 16 * 1.01, 0.09},
      {TensorType::kQ5_1, 1.0 / 31 * 1.01, 0.058},
      {TensorType::kQ4_K, 0.075, 0.11},
      {TensorType::kQ5_K, 0.04, 0.055},
      {TensorType::kQ6_K, 0.02, 0.038},
  };
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 4096;
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(tensor_type_name(c.type)));
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) {
      x[i] = normal(rng) * 0.02f;
      if (i % 512 == 7) x[i] *= 20;  // outliers, as real weights have
      if (i >= 1024 && i < 1280) x[i] = std::fabs(x[i]);  // an all-positive super-block
    }
    std::vector<uint8_t> q(*row_bytes(c.type, n));
    quantize_row(c.type, x.data(), q.data(), n);
    std::vector<float> y(n);
    dequantize_row(c.type, q.data(), y.data(), n);
    const int64_t blk = block_elems(c.type) == 1 ? 1 : block_elems(c.type);
    double se = 0, sx = 0;
    for (int64_t b0 = 0; b0 < n; b0 += blk) {
      double amax = 0;
      for (int64_t i = b0; i < b0 + blk; ++i) amax = std::max(amax, std::fabs(double(x[i])));
      for (int64_t i = b0; i < b0 + blk; ++i) {
        double e = std::fabs(double(y[i]) - x[i]);
        ASSERT_LE(e, c.bound * amax + 1e-7) << "element " << i << " x=" << x[i] << " y=" << y[i];
        se += e * e;
        sx += double(x[i]) * x[i];
      }
    }
    EXPECT_LE(std::sqrt(se / sx), c.rms + 1e-12);
  }
}

TEST(QuantFormats, ZerosAndConstantsRoundTripExactly) {
  for (TensorType t : kAllTensorTypes) {
    SCOPED_TRACE(std::string(tensor_type_name(t)));
    const int64_t n = 512;
    for (float value : {0.0f, 0.25f, -3.0f}) {
      std::vector<float> x(n, value), y(n);
      std::vector<uint8_t> q(*row_bytes(t, n));
      quantize_row(t, x.data(), q.data(), n);
      dequantize_row(t, q.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (value == 0.0f) {
          ASSERT_EQ(y[i], 0.0f);
        } else {
          ASSERT_NEAR(y[i], value, std::fabs(value) * 2e-3) << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace escala::model
