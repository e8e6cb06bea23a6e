// The CPU decode kernel on int8 K/V at the shapes of its integer (AVX-512 VNNI) path: query rows in
// passes of 4 (GQA groups of 4, 7, 8; speculative runs of several queries), head dims that are
// multiples of 64 up to 256, against the double-precision reference with the int8 path's
// tolerance (kInt8DecodeTolerance: 16-bit queries and weights). On machines without VNNI the same
// cases run the f32 path.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attention/reference.h"
#include "attention_case.h"

namespace escala::test {
namespace {

// Runs the decode kernel and the reference on b; returns the worst |err| / (atol + rtol |ref|).
double worst_error_ratio(const AttnBuffers& b, const Tolerance& tol, int num_splits = 0) {
  const AttnCase& c = b.c;
  auto o = poisoned_output(b);
  std::vector<float> lse(size_t(b.total_q) * c.h, std::nanf(""));
  attn::CpuOptions opt;
  opt.impl = attn::Impl::kDecode;
  opt.num_splits = num_splits;
  const Status st = attn::attention(b.params(o.data(), lse.data()), opt);
  EXPECT_TRUE(st.ok()) << st.message();
  std::vector<float> ref(size_t(b.total_q) * c.h * b.dv()), ref_lse(size_t(b.total_q) * c.h);
  attn::AttentionParams rp = b.params(ref.data(), ref_lse.data());
  rp.o_dtype = DType::kF32;
  attn::attention_reference(rp);
  double worst = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(double(output_at(o, c.o_dtype, int64_t(i))) - ref[i]);
    const double r = err / (tol.atol + tol.rtol * std::fabs(ref[i]));
    worst = std::isnan(r) ? std::numeric_limits<double>::infinity() : std::max(worst, r);
  }
  for (size_t i = 0; i < ref_lse.size(); ++i) {
    if (std::isinf(ref_lse[i]) && std::isinf(lse[i]) && ref_lse[i] < 0 && lse[i] < 0) continue;
    const double r = std::fabs(double(lse[i]) - ref_lse[i]) / (kInt8DecodeLseTolerance * (1 + std::fabs(ref_lse[i])));
    worst = std::isnan(r) ? std::numeric_limits<double>::infinity() : std::max(worst, r);
  }
  return worst;
}

TEST(DecodeInt8, GroupsOfFourRowsMatchReference) {
  std::mt19937 rng(std::random_device{}());
  int cases = 0;
  for (int d : {64, 128, 192, 256})
    for (int group : {4, 7, 8})
      for (int variant = 0; variant < 3; ++variant) {
        const uint32_t seed = rng();
        std::mt19937 case_rng(seed);
        AttnCase c;
        c.d = d;
        c.h_kv = 1 + int(case_rng() % 3);
        c.h = c.h_kv * group;
        c.kv_dtype = DType::kI8;
        c.q_dtype = variant == 2 ? DType::kBF16 : DType::kF32;
        c.page_size = variant == 1 ? 16 : (variant == 2 ? 7 : 0);
        // Lengths that leave partial blocks of 32 and partial groups of 16 keys.
        c.kv_lens = {int(1 + case_rng() % 700), 33, 16, 17};
        c.q_lens = {1, 1 + int(case_rng() % 3), 1, 1};
        c.causal = variant != 0;
        if (variant == 2) {
          c.window_left = 40;
          c.num_sinks = 4;
          c.softcap = 30.0f;
        }
        c.value_range = variant == 1 ? 4.0f : 1.0f;  // sharper softmax
        AttnBuffers b = make_buffers(c, case_rng);
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " d=" << d << " group=" << group << " variant "
                                          << variant);
        EXPECT_LE(worst_error_ratio(b, kInt8DecodeTolerance), 1.0);
        ++cases;
      }
  EXPECT_EQ(cases, 36);
}

// Query rows with one large element and the rest tiny (a row is quantized relative to its largest
// element), zero rows, and large scores (logits in the hundreds): within the outlier tolerance.
TEST(DecodeInt8, OutlierAndZeroQueriesMatchReference) {
  std::mt19937 rng(std::random_device{}());
  for (int iter = 0; iter < 6; ++iter) {
    const uint32_t seed = rng();
    std::mt19937 case_rng(seed);
    AttnCase c;
    c.d = 128;
    c.h_kv = 2;
    c.h = 8;
    c.kv_dtype = DType::kI8;
    c.page_size = 16;
    c.kv_lens = {300};
    c.q_lens = {1};
    c.value_range = 2.0f;
    AttnBuffers b = make_buffers(c, case_rng);
    float* q = reinterpret_cast<float*>(b.q.data());
    for (int h = 0; h < c.h; ++h) {
      float* row = q + size_t(h) * c.d;
      if (h % 4 == 1) {
        for (int i = 0; i < c.d; ++i) row[i] *= 1e-4f;
        row[case_rng() % c.d] = 30.0f;
      } else if (h % 4 == 2) {
        for (int i = 0; i < c.d; ++i) row[i] = 0.0f;
      } else if (h % 4 == 3) {
        for (int i = 0; i < c.d; ++i) row[i] *= 20.0f;
      }
    }
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    EXPECT_LE(worst_error_ratio(b, kInt8DecodeOutlierTolerance), 1.0);
    EXPECT_LE(worst_error_ratio(b, kInt8DecodeOutlierTolerance, 3), 1.0);
  }
}

}  // namespace
}  // namespace escala::test
