// Quantized matrix products against dequantize-then-multiply in double.
//
// Tolerance: the fast kernels quantize each activation to 8 bits (step d_a = block absmax / 127),
// so |y - y_ref| <= sum_i |w_i| * d_a(i) / 2 exactly, plus float rounding, for which we allow
// 1e-5 of sum_i |w_i x_i| (f32 accumulation over at most a few thousand terms). f32/f16 weights
// are not quantized: only the rounding term applies.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "escala/quant.h"
#include "model/quant_matmul_internal.h"
#include "simd_targets.h"

namespace escala::model {
namespace {

struct Fixture {
  std::vector<uint8_t> bytes;
  WeightView w;
  std::vector<float> dequantized;  // rows x cols
};

Fixture make_weights(TensorType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = normal(rng);
  Fixture f;
  uint64_t rb = *row_bytes(t, cols);
  f.bytes.resize(rb * static_cast<uint64_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(t, values.data() + r * cols, f.bytes.data() + r * static_cast<int64_t>(rb), cols);
  f.w = WeightView{.type = t, .data = f.bytes.data(), .rows = rows, .cols = cols, .row_stride = rb};
  f.dequantized.resize(values.size());
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(t, f.bytes.data() + r * static_cast<int64_t>(rb), f.dequantized.data() + r * cols,
                   cols);
  return f;
}

std::vector<float> make_acts(int64_t m, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * cols));
  for (float& v : x) v = normal(rng);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 8;  // a few large activations
  return x;
}

void check_against_reference(const Fixture& f, const std::vector<float>& x, int64_t m,
                             const std::vector<float>& y) {
  const int64_t rows = f.w.rows, cols = f.w.cols;
  const bool quantized_acts = is_quantized(f.w.type);
  const int64_t ablock = block_elems(f.w.type) == 256 ? 256 : 32;
  std::vector<float> ref(static_cast<size_t>(m * rows));
  matmul_reference(f.w, x.data(), m, ref.data());
  for (int64_t t = 0; t < m; ++t) {
    std::vector<double> step(static_cast<size_t>(cols), 0.0);  // activation step per element
    if (quantized_acts) {
      for (int64_t b = 0; b < cols; b += ablock) {
        double amax = 0;
        for (int64_t i = b; i < b + ablock; ++i) amax = std::max(amax, std::fabs(double(x[t * cols + i])));
        for (int64_t i = b; i < b + ablock; ++i) step[i] = amax / 127.0;
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      double bound = 0, mag = 0;
      for (int64_t i = 0; i < cols; ++i) {
        double w = f.dequantized[r * cols + i];
        bound += std::fabs(w) * step[i] * 0.5;
        mag += std::fabs(w * x[t * cols + i]);
      }
      bound += 1e-5 * mag + 1e-30;
      ASSERT_LE(std::fabs(double(y[t * rows + r]) - ref[t * rows + r]), bound)
          << tensor_type_name(f.w.type) << " token " << t << " row " << r;
    }
  }
}

TEST(QuantMatmul, AllTypesMatchReference) {
  uint32_t seed = 1;
  for (TensorType t : kAllTensorTypes) {
    for (int64_t cols : {256, 768}) {
      for (int64_t m : {1, 3, 4, 9}) {
        SCOPED_TRACE(fmt::format("{} cols={} m={}", tensor_type_name(t), cols, m));
        const int64_t rows = 37;
        Fixture f = make_weights(t, rows, cols, seed++);
        auto x = make_acts(m, cols, seed++);
        std::vector<float> y(static_cast<size_t>(m * rows), std::nanf(""));  // poisoned
        ASSERT_TRUE(matmul(f.w, x.data(), m, y.data()).ok());
        check_against_reference(f, x, m, y);
      }
    }
  }
}

// The AVX-512 VNNI kernels (used when the CPU has them) and the portable Highway kernels both
// meet the bound; run every type through both.
TEST(QuantMatmul, PortableKernelsWhenVnniIsOff) {
  set_vnni_enabled(false);
  uint32_t seed = 100;
  for (TensorType t : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ8_0, TensorType::kQ4_K,
                       TensorType::kQ6_K}) {
    for (int64_t cols : {256, 768, 1536}) {
      for (int64_t m : {1, 5}) {
        SCOPED_TRACE(fmt::format("{} cols={} m={}", tensor_type_name(t), cols, m));
        Fixture f = make_weights(t, 21, cols, seed++);
        auto x = make_acts(m, cols, seed++);
        std::vector<float> y(static_cast<size_t>(m * 21), std::nanf(""));
        ASSERT_TRUE(matmul(f.w, x.data(), m, y.data()).ok());
        check_against_reference(f, x, m, y);
      }
    }
  }
  set_vnni_enabled(true);
}

// The portable kernels once per compiled SIMD target (AVX-512, AVX2, SSE4, ...), not only the
// one this machine picks.
TEST(QuantMatmul, EverySimdTargetMatchesReference) {
  set_vnni_enabled(false);
  uint32_t seed = 300;
  for (int64_t target : escala::test::simd_targets()) {
    escala::test::PinSimdTarget pin(target);
    for (TensorType t : kAllTensorTypes) {
      for (int64_t m : {1, 5}) {
        SCOPED_TRACE(fmt::format("{} {} m={}", escala::test::simd_target_name(target), tensor_type_name(t), m));
        Fixture f = make_weights(t, 19, 512, seed++);
        auto x = make_acts(m, 512, seed++);
        std::vector<float> y(static_cast<size_t>(m * 19), std::nanf(""));
        ASSERT_TRUE(matmul(f.w, x.data(), m, y.data()).ok());
        check_against_reference(f, x, m, y);
      }
    }
  }
  set_vnni_enabled(true);
}

// An inf or NaN f16 weight reaches its output on every target (Highway's software f16 conversion,
// used without F16C, read them as finite numbers).
TEST(QuantMatmul, NonFiniteF16WeightsPropagateOnEveryTarget) {
  for (int64_t target : escala::test::simd_targets()) {
    escala::test::PinSimdTarget pin(target);
    SCOPED_TRACE(escala::test::simd_target_name(target));
    Fixture f = make_weights(TensorType::kF16, 3, 64, 400);
    auto* w16 = reinterpret_cast<uint16_t*>(f.bytes.data());
    w16[0 * 64 + 5] = 0x7E00;  // row 0: NaN in the vector body
    w16[1 * 64 + 63] = 0xFC00;  // row 1: -inf in the last lane
    auto x = make_acts(2, 64, 401);
    std::vector<float> y(6, 0.0f);
    ASSERT_TRUE(matmul(f.w, x.data(), 2, y.data()).ok());
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(std::isnan(y[i * 3 + 0])) << y[i * 3 + 0];
      EXPECT_TRUE(std::isinf(y[i * 3 + 1])) << y[i * 3 + 1];
      EXPECT_TRUE(std::isfinite(y[i * 3 + 2])) << y[i * 3 + 2];
    }
  }
}

TEST(QuantMatmul, OddBlockCountsAndTails) {
  // 1, 3, 15, 17 and 33 blocks: odd pairs and partial groups of 16 in the VNNI path.
  uint32_t seed = 200;
  for (TensorType t : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ8_0}) {
    for (int64_t nb : {1, 3, 15, 17, 33}) {
      SCOPED_TRACE(fmt::format("{} blocks={}", tensor_type_name(t), nb));
      Fixture f = make_weights(t, 9, 32 * nb, seed++);
      auto x = make_acts(6, 32 * nb, seed++);
      std::vector<float> y(6 * 9, std::nanf(""));
      ASSERT_TRUE(matmul(f.w, x.data(), 6, y.data()).ok());
      check_against_reference(f, x, 6, y);
    }
  }
}

TEST(QuantMatmul, SmolLMShapesAndThreadCountsAgree) {
  for (TensorType t : {TensorType::kQ4_1, TensorType::kQ8_0, TensorType::kQ4_0}) {
    SCOPED_TRACE(std::string(tensor_type_name(t)));
    Fixture f = make_weights(t, 1536, 576, 7);
    auto x = make_acts(1, 576, 8);
    std::vector<float> y1(1536), y2(1536), y4(1536);
    ASSERT_TRUE(matvec(f.w, x.data(), y1.data(), 1).ok());
    ASSERT_TRUE(matvec(f.w, x.data(), y2.data(), 2).ok());
    ASSERT_TRUE(matvec(f.w, x.data(), y4.data(), 4).ok());
    EXPECT_EQ(y1, y2);  // each row is computed by one thread in a fixed order
    EXPECT_EQ(y1, y4);
    check_against_reference(f, x, 1, y1);
  }
}

TEST(QuantMatmul, BatchRowsEqualSingleRows) {
  // matmul over m tokens must give exactly what m separate matvecs give.
  for (TensorType t : {TensorType::kQ4_1, TensorType::kQ4_K, TensorType::kQ6_K}) {
    Fixture f = make_weights(t, 19, 512, 11);
    const int64_t m = 6;
    auto x = make_acts(m, 512, 12);
    std::vector<float> y(static_cast<size_t>(m * 19)), yv(19);
    ASSERT_TRUE(matmul(f.w, x.data(), m, y.data()).ok());
    for (int64_t t2 = 0; t2 < m; ++t2) {
      ASSERT_TRUE(matvec(f.w, x.data() + t2 * 512, yv.data()).ok());
      for (int r = 0; r < 19; ++r) EXPECT_EQ(y[t2 * 19 + r], yv[r]) << tensor_type_name(t);
    }
  }
}

TEST(QuantMatmul, EveryBatchSizeGivesTheSameBits) {
  // Each output element must not depend on m, on which microkernel width (8, 4, 2, 1 activation
  // rows) computes it, on the thread count, or on whether matmul_group runs it: the engine's
  // greedy outputs are identical alone or in a batch. 37 rows: two full slabs of 16 and a tail.
  for (TensorType t : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ8_0, TensorType::kQ4_K,
                       TensorType::kQ6_K}) {
    SCOPED_TRACE(std::string(tensor_type_name(t)));
    const int64_t rows = 37, cols = 768, mmax = 21;
    Fixture f = make_weights(t, rows, cols, 31);
    auto x = make_acts(mmax, cols, 32);
    std::vector<float> alone(static_cast<size_t>(mmax * rows));
    for (int64_t r = 0; r < mmax; ++r)
      ASSERT_TRUE(matvec(f.w, x.data() + r * cols, alone.data() + r * rows, 1).ok());
    for (int64_t m : {2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 21}) {
      for (int threads : {1, 2}) {
        std::vector<float> y(static_cast<size_t>(m * rows), std::nanf(""));
        ASSERT_TRUE(matmul(f.w, x.data(), m, y.data(), threads).ok());
        for (int64_t i = 0; i < m * rows; ++i)
          ASSERT_EQ(y[size_t(i)], alone[size_t(i)]) << "m=" << m << " threads=" << threads << " at " << i;
      }
      // Two weights reading the same input in one parallel region.
      std::vector<float> y0(static_cast<size_t>(m * rows)), y1(static_cast<size_t>(m * rows));
      const WeightView ws[2] = {f.w, f.w};
      float* const ys[2] = {y0.data(), y1.data()};
      ASSERT_TRUE(matmul_group(ws, x.data(), m, ys, 2).ok());
      for (int64_t i = 0; i < m * rows; ++i) {
        ASSERT_EQ(y0[size_t(i)], alone[size_t(i)]) << "group m=" << m << " at " << i;
        ASSERT_EQ(y1[size_t(i)], alone[size_t(i)]) << "group m=" << m << " at " << i;
      }
    }
  }
}

TEST(QuantMatmul, StoredWeightsGiveTheSameBits) {
  // A weight stored in the VNNI layout (as Model does) must give exactly what its GGUF rows give,
  // for every m, alone and in matmul_group; released, the rows are read again.
  for (TensorType t : {TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ8_0}) {
    SCOPED_TRACE(std::string(tensor_type_name(t)));
    const int64_t rows = 37, cols = 576;
    Fixture f = make_weights(t, rows, cols, 41);
    Fixture g = make_weights(t, rows, cols, 42);
    auto x = make_acts(17, cols, 43);
    for (int64_t m : {1, 2, 3, 8, 17}) {
      std::vector<float> plain(size_t(m * rows)), plain_g(size_t(m * rows));
      ASSERT_TRUE(matmul(f.w, x.data(), m, plain.data()).ok());
      ASSERT_TRUE(matmul(g.w, x.data(), m, plain_g.data()).ok());
      std::vector<float> y(size_t(m * rows)), y0(size_t(m * rows)), y1(size_t(m * rows));
      {
        StoredWeights stored;
        stored.add(f.w);
        stored.add(g.w);
        stored.add(f.w);  // a second add is a no-op
        EXPECT_EQ(find_stored(f.w) != nullptr, vnni_active());
        ASSERT_TRUE(matmul(f.w, x.data(), m, y.data()).ok());
        EXPECT_EQ(y, plain) << "m=" << m;
        const WeightView ws[2] = {f.w, g.w};
        float* const ys[2] = {y0.data(), y1.data()};
        ASSERT_TRUE(matmul_group(ws, x.data(), m, ys, 2).ok());
        EXPECT_EQ(y0, plain) << "group m=" << m;
        EXPECT_EQ(y1, plain_g) << "group m=" << m;
        WeightView other = f.w;
        other.rows = 20;  // another view of the same data is not the stored weight
        EXPECT_EQ(find_stored(other), nullptr);
      }
      EXPECT_EQ(find_stored(f.w), nullptr);
      ASSERT_TRUE(matmul(f.w, x.data(), m, y.data()).ok());
      EXPECT_EQ(y, plain);
    }
  }
}

TEST(QuantMatmul, StridedRowsAndBadViews) {
  Fixture f = make_weights(TensorType::kQ8_0, 8, 64, 3);
  // The same rows with 6 bytes of padding between them.
  uint64_t rb = *row_bytes(TensorType::kQ8_0, 64);
  std::vector<uint8_t> padded((rb + 6) * 8);
  for (int r = 0; r < 8; ++r) std::copy_n(f.bytes.data() + r * rb, rb, padded.data() + r * (rb + 6));
  WeightView w = f.w;
  w.data = padded.data();
  w.row_stride = rb + 6;
  auto x = make_acts(1, 64, 4);
  std::vector<float> a(8), b(8);
  ASSERT_TRUE(matvec(f.w, x.data(), a.data()).ok());
  ASSERT_TRUE(matvec(w, x.data(), b.data()).ok());
  EXPECT_EQ(a, b);

  // GGUF allows alignment 1: rows at odd addresses must work (and be UB-free) too.
  for (TensorType t : kAllTensorTypes) {
    Fixture g = make_weights(t, 3, 256, 5);
    std::vector<uint8_t> odd(g.bytes.size() + 1);
    std::copy(g.bytes.begin(), g.bytes.end(), odd.begin() + 1);
    WeightView wo = g.w;
    wo.data = odd.data() + 1;
    auto x2 = make_acts(1, 256, 6);
    std::vector<float> ya(3), yb(3);
    ASSERT_TRUE(matvec(g.w, x2.data(), ya.data()).ok());
    ASSERT_TRUE(matvec(wo, x2.data(), yb.data()).ok());
    EXPECT_EQ(ya, yb) << tensor_type_name(t);
  }

  WeightView bad = f.w;
  bad.cols = 48;  // not a whole number of q8_0 blocks
  EXPECT_FALSE(matvec(bad, x.data(), a.data()).ok());
  bad = f.w;
  bad.row_stride = rb - 1;
  EXPECT_FALSE(matvec(bad, x.data(), a.data()).ok());
}

TEST(QuantMatmul, ZeroActivationsGiveZero) {
  for (TensorType t : kAllTensorTypes) {
    Fixture f = make_weights(t, 5, 256, 9);
    std::vector<float> x(256, 0.0f), y(5, 1.0f);
    ASSERT_TRUE(matvec(f.w, x.data(), y.data()).ok());
    for (float v : y) EXPECT_EQ(v, 0.0f) << tensor_type_name(t);
  }
}

}  // namespace
}  // namespace escala::model
