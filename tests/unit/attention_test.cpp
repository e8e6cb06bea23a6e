// Property tests: every CPU kernel against the double-precision reference on fresh random inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "attention/reference.h"
#include "attention_case.h"
#include "simd_targets.h"

namespace escala::test {
namespace {

using attn::Impl;

// Runs `impl` and the reference on the same case (after `edit`, if any, changes its inputs);
// checks O element-wise and the LSE. Where the reference is NaN (non-finite inputs), so must the
// kernel be.
void check_against_reference(const AttnCase& c, Impl impl, uint32_t seed, int num_splits = 0,
                             const std::function<void(AttnBuffers&, std::mt19937&)>& edit = {}) {
  std::mt19937 rng(seed);
  AttnBuffers b = make_buffers(c, rng);
  if (edit) edit(b, rng);
  auto o = poisoned_output(b);
  std::vector<float> lse(size_t(b.total_q) * c.h, std::nanf(""));
  attn::CpuOptions opt;
  opt.impl = impl;
  opt.num_splits = num_splits;
  Status st = attn::attention(b.params(o.data(), lse.data()), opt);
  ASSERT_TRUE(st.ok()) << st.message();

  AttnCase rc = c;
  rc.o_dtype = DType::kF32;
  std::vector<float> ref(size_t(b.total_q) * c.h * b.dv()), ref_lse(size_t(b.total_q) * c.h);
  attn::AttentionParams rp = b.params(ref.data(), ref_lse.data());
  rp.o_dtype = DType::kF32;
  attn::attention_reference(rp);

  // The int8 decode path rounds queries and softmax weights to 16 bits (attention_case.h): its own,
  // f16-class tolerance where the output type's is tighter.
  const bool int8_decode = impl == Impl::kDecode && c.kv_dtype == DType::kI8;
  Tolerance tol = tolerance_for(c.o_dtype);
  if (int8_decode)
    tol = {std::max(tol.atol, kInt8DecodeTolerance.atol), std::max(tol.rtol, kInt8DecodeTolerance.rtol)};
  const double lse_tol = int8_decode ? std::max(kLseTolerance, kInt8DecodeLseTolerance) : kLseTolerance;
  int bad = 0;
  for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
    const float got = output_at(o, c.o_dtype, int64_t(i));
    const double err = std::fabs(double(got) - ref[i]);
    const bool ok = std::isnan(ref[i]) ? std::isnan(got) : err <= tol.atol + tol.rtol * std::fabs(ref[i]);
    if (!ok) {
      ++bad;
      ADD_FAILURE() << "O[" << i << "] = " << got << ", reference " << ref[i] << " (seed " << seed << ")";
    }
  }
  for (size_t i = 0; i < ref_lse.size() && bad < 5; ++i) {
    const bool both_empty = std::isinf(ref_lse[i]) && ref_lse[i] < 0 && std::isinf(lse[i]) && lse[i] < 0;
    const bool ok = std::isnan(ref_lse[i]) ? std::isnan(lse[i])
                                           : both_empty || std::fabs(double(lse[i]) - ref_lse[i]) <=
                                                               lse_tol * (1 + std::fabs(ref_lse[i]));
    if (!ok) {
      ++bad;
      ADD_FAILURE() << "LSE[" << i << "] = " << lse[i] << ", reference " << ref_lse[i] << " (seed " << seed << ")";
    }
  }
}

AttnCase random_case(std::mt19937& rng, bool short_queries) {
  AttnCase c;
  auto pick = [&](std::initializer_list<int> xs) { return *(xs.begin() + rng() % xs.size()); };
  c.d = pick({8, 16, 64, 72, 80, 96, 112, 128, 256});
  c.dv = rng() % 5 == 0 ? pick({32, 64, 128}) : 0;
  c.h_kv = pick({1, 2, 3});
  c.h = c.h_kv * pick({1, 2, 7, 8});
  const DType fl[] = {DType::kF32, DType::kF16, DType::kBF16};
  c.q_dtype = fl[rng() % 3];
  c.kv_dtype = c.q_dtype;
  c.o_dtype = fl[rng() % 3];
  const int batch = 1 + rng() % 3;
  c.q_lens.clear();
  c.kv_lens.clear();
  for (int i = 0; i < batch; ++i) {
    const int kv = pick({1, 2, 5, 17, 64, 100, 300});
    const int q = short_queries ? 1 + int(rng() % std::min(16, kv)) : (rng() % 2 ? kv : 1 + int(rng() % kv));
    c.q_lens.push_back(q);
    c.kv_lens.push_back(kv);
  }
  c.causal = rng() % 2;
  if (rng() % 3 == 0) c.window_left = pick({0, 1, 3, 16, 50});
  if (rng() % 4 == 0) c.window_right = pick({0, 2, 9});
  if (rng() % 3 == 0) c.num_sinks = pick({1, 4});
  c.sink_logits = rng() % 3 == 0;
  if (rng() % 3 == 0) c.softcap = 5.0f + float(rng() % 30);
  if (rng() % 4 == 0) c.scale = 0.05f + float(rng() % 100) / 200.0f;
  // Layout and storage: paged (random page permutation), quantized, keys stored before RoPE.
  if (rng() % 3 == 0) c.page_size = pick({1, 7, 16});
  if (rng() % 4 == 0) c.kv_dtype = DType::kI8;
  if (c.page_size > 0 && rng() % 4 == 0) c.kv_dtype = DType::kFp8E4M3;
  if (rng() % 6 == 0) c.rope = 1 + int(rng() % 2);
  return c;
}

class AttentionProperty : public ::testing::TestWithParam<Impl> {};

TEST_P(AttentionProperty, RandomCasesMatchReference) {
  const Impl impl = GetParam();
  std::mt19937 rng(std::random_device{}());
  for (int iter = 0; iter < 60; ++iter) {
    const uint32_t seed = rng();
    std::mt19937 case_rng(seed);
    AttnCase c = random_case(case_rng, impl == Impl::kDecode);
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " seed " << seed << " d=" << c.d << " h=" << c.h
                                      << "/" << c.h_kv << " causal=" << c.causal << " win=" << c.window_left << ","
                                      << c.window_right << " sinks=" << c.num_sinks << " softcap=" << c.softcap
                                      << " page=" << c.page_size << " kv=" << dtype_name(c.kv_dtype)
                                      << " rope=" << c.rope);
    check_against_reference(c, impl, seed);
    if (::testing::Test::HasFailure()) return;
  }
}

// Seeds the property test once failed on, replayed every run. 3351536332: int8 K/V through the
// decode kernel, d = 256, GQA 24/3, window 50, soft-cap 26, f32 output (CI, 2026-11-29): 2.5e-5
// off on outputs near 7e-4, inside the int8 path's tolerance but not the f32 output's.
TEST(Attention, PropertyRegressionSeeds) {
  for (uint32_t seed : {3351536332u}) {
    std::mt19937 case_rng(seed);
    const AttnCase c = random_case(case_rng, true);
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    check_against_reference(c, Impl::kDecode, seed);
  }
}

// The same random cases with dispatch pinned to each compiled SIMD target (AVX-512, AVX2, SSE4,
// SSSE3, scalar where built): each has its own lane count, row grouping and exp.
TEST(Attention, EverySimdTargetMatchesReference) {
  std::mt19937 rng(std::random_device{}());
  for (int64_t target : simd_targets()) {
    PinSimdTarget pin(target);
    for (Impl impl : {Impl::kFlash, Impl::kDecode}) {
      for (int iter = 0; iter < 12; ++iter) {
        const uint32_t seed = rng();
        std::mt19937 case_rng(seed);
        const AttnCase c = random_case(case_rng, impl == Impl::kDecode);
        SCOPED_TRACE(::testing::Message() << simd_target_name(target) << (impl == Impl::kFlash ? " flash" : " decode")
                                          << " seed " << seed << " d=" << c.d << " kv=" << dtype_name(c.kv_dtype));
        check_against_reference(c, impl, seed);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// Non-finite inputs propagate as they would in exact arithmetic (the reference decides which
// outputs): a NaN or inf query element makes its row NaN, a NaN or +inf key element the rows that
// see that key, a NaN value element that column of the rows that see it; a key a row does not see
// leaves it untouched. Quantized K/V hold no NaN, so only their queries are poisoned. A NaN value
// is placed only where every row sees every key: the kernels multiply whole tiles, so a row may
// also read a masked key's NaN value (0 * NaN).
TEST(Attention, NonFiniteInputsPropagate) {
  std::mt19937 rng(std::random_device{}());
  const float kBad[] = {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (int64_t target : simd_targets()) {
    PinSimdTarget pin(target);
    for (Impl impl : {Impl::kFlash, Impl::kDecode}) {
      for (int iter = 0; iter < 16; ++iter) {
        const uint32_t seed = rng();
        std::mt19937 case_rng(seed);
        AttnCase c = random_case(case_rng, impl == Impl::kDecode);
        const int what = is_quantized(c.kv_dtype) ? 0 : iter % 3;  // 0 Q, 1 K, 2 V
        if (what == 2) c.causal = false, c.window_left = c.window_right = -1;
        // An inf query element against int8 K/V: the decode kernel quantizes the row, so it is
        // NaN there where exact arithmetic may give ±inf scores (finite after a soft-cap).
        const float bad = what == 2 || is_quantized(c.kv_dtype) ? kBad[0] : kBad[iter / 3 % 3];
        SCOPED_TRACE(::testing::Message() << simd_target_name(target) << (impl == Impl::kFlash ? " flash" : " decode")
                                          << " seed " << seed << " poison " << "QKV"[what] << " = " << bad);
        check_against_reference(c, impl, seed, 0, [&](AttnBuffers& b, std::mt19937& r) {
          std::vector<uint8_t>& t = what == 0 ? b.q : what == 1 ? b.k : b.v;
          const DType dt = what == 0 ? c.q_dtype : c.kv_dtype;
          const int64_t n = int64_t(t.size() / dtype_size(dt));
          for (int k = 0; k < 2; ++k) store_as(t.data(), dt, int64_t(r() % uint64_t(n)), bad);
        });
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionProperty, ::testing::Values(Impl::kFlash, Impl::kDecode),
                         [](const auto& info) { return info.param == Impl::kFlash ? "Flash" : "Decode"; });

TEST(Attention, FastPathHeadDimsAllMasks) {
  std::mt19937 rng(std::random_device{}());
  for (int d : {64, 128, 256})
    for (int mask = 0; mask < 4; ++mask)
      for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
        AttnCase c;
        c.d = d;
        c.h = 8;
        c.h_kv = 2;
        c.q_dtype = c.kv_dtype = c.o_dtype = t;
        c.q_lens = {300, 1};
        c.kv_lens = {300, 200};
        c.causal = mask >= 1;
        if (mask >= 2) c.window_left = 70;
        if (mask >= 3) { c.num_sinks = 4; c.softcap = 20.0f; c.sink_logits = true; }
        check_against_reference(c, Impl::kFlash, rng());
      }
}

TEST(Attention, PagedEqualsContiguousBitForBit) {
  // Same inputs laid out contiguous and as permuted pages: the kernels read the same values in the
  // same order, so the outputs must be identical, not just close.
  std::mt19937 rng(std::random_device{}());
  for (Impl impl : {Impl::kFlash, Impl::kDecode})
    for (DType kv : {DType::kBF16, DType::kI8}) {
      AttnCase c;
      c.d = 128;
      c.h = 8;
      c.h_kv = 2;
      c.q_dtype = DType::kBF16;
      c.kv_dtype = kv;
      c.q_lens = impl == Impl::kDecode ? std::vector<int>{1, 3} : std::vector<int>{100, 37};
      c.kv_lens = {300, 37};
      c.causal = true;
      c.num_sinks = 2;
      c.window_left = 90;
      c.page_size = 16;
      const uint32_t seed = rng();
      std::mt19937 r1(seed);
      AttnBuffers paged = make_buffers(c, r1);
      // Gather the pages back into contiguous rows (and per-row int8 scales).
      AttnCase cc = c;
      cc.page_size = 0;
      std::mt19937 r2(seed);
      AttnBuffers cont = make_buffers(cc, r2);
      const int64_t row_bytes = int64_t(c.h_kv) * c.d * dtype_size(kv);
      for (int b = 0; b < 2; ++b)
        for (int t = 0; t < c.kv_lens[b]; ++t) {
          const int64_t slot = int64_t(paged.page_indices[paged.page_indptr[b] + t / 16]) * 16 + t % 16;
          const int64_t row = cont.cu_k[b] + t;
          std::copy_n(paged.k.data() + slot * row_bytes, row_bytes, cont.k.data() + row * row_bytes);
          std::copy_n(paged.v.data() + slot * row_bytes, row_bytes, cont.v.data() + row * row_bytes);
          if (kv == DType::kI8)
            for (int hh = 0; hh < c.h_kv; ++hh) {
              cont.k_scale[row * c.h_kv + hh] = paged.k_scale[slot * c.h_kv + hh];
              cont.v_scale[row * c.h_kv + hh] = paged.v_scale[slot * c.h_kv + hh];
            }
        }
      cont.q = paged.q;
      auto o1 = poisoned_output(paged), o2 = poisoned_output(cont);
      attn::CpuOptions opt;
      opt.impl = impl;
      ASSERT_TRUE(attn::attention(paged.params(o1.data(), nullptr), opt).ok());
      ASSERT_TRUE(attn::attention(cont.params(o2.data(), nullptr), opt).ok());
      EXPECT_EQ(o1, o2) << "impl " << int(impl) << " kv " << dtype_name(kv);
    }
}

TEST(Attention, QueryLongerThanKvMasksLeadingRows) {
  AttnCase c;
  c.q_lens = {9};
  c.kv_lens = {4};
  c.causal = true;
  for (Impl impl : {Impl::kFlash, Impl::kDecode}) check_against_reference(c, impl, 7);
}

TEST(Attention, AllMaskedRowGivesZerosNotNan) {
  // window_right = 0 and window_left = 0 with the diagonal beyond kv: nothing visible for early rows.
  AttnCase c;
  c.q_lens = {6};
  c.kv_lens = {3};
  c.causal = true;
  std::mt19937 rng(1);
  AttnBuffers b = make_buffers(c, rng);
  auto o = poisoned_output(b);
  std::vector<float> lse(size_t(b.total_q) * c.h);
  for (Impl impl : {Impl::kFlash, Impl::kDecode, Impl::kReference}) {
    attn::CpuOptions opt;
    opt.impl = impl;
    ASSERT_TRUE(attn::attention(b.params(o.data(), lse.data()), opt).ok());
    for (int i = 0; i < 3 * c.h * c.d; ++i) EXPECT_EQ(output_at(o, c.o_dtype, i), 0.0f);  // rows 0..2 see nothing
    for (int i = 0; i < 3 * c.h; ++i) EXPECT_TRUE(std::isinf(lse[i]) && lse[i] < 0);
  }
}

TEST(Attention, DecodeSplitCountsAgree) {
  std::mt19937 rng(std::random_device{}());
  for (int splits : {1, 2, 3, 8, 64}) {
    AttnCase c;
    c.d = 128;
    c.h = 8;
    c.h_kv = 2;
    c.q_lens = {1, 4};
    c.kv_lens = {1000, 37};
    c.causal = true;
    c.q_dtype = c.kv_dtype = DType::kBF16;
    check_against_reference(c, Impl::kDecode, rng(), splits);
  }
}

TEST(Attention, MergeOfDisjointKeyRangesEqualsWhole) {
  // Attention over keys [0, 40) and [40, 100) merged by LSE equals attention over [0, 100).
  std::mt19937 rng(std::random_device{}());
  AttnCase c;
  c.q_lens = {1};
  c.kv_lens = {100};
  c.h = 2;
  c.h_kv = 2;
  c.d = 32;
  AttnBuffers b = make_buffers(c, rng);
  std::vector<float> o_all(c.h * c.d), lse_all(c.h), o_a(c.h * c.d), lse_a(c.h), o_b(c.h * c.d), lse_b(c.h);
  attn::AttentionParams p = b.params(o_all.data(), lse_all.data());
  ASSERT_TRUE(attn::attention(p).ok());
  int32_t cu_a[2] = {0, 40}, cu_b[2] = {0, 60};
  attn::AttentionParams pa = b.params(o_a.data(), lse_a.data());
  pa.cu_seqlens_k = cu_a;
  ASSERT_TRUE(attn::attention(pa).ok());
  attn::AttentionParams pb = b.params(o_b.data(), lse_b.data());
  pb.cu_seqlens_k = cu_b;
  pb.k = b.k.data() + 40 * pb.k_row_stride * 4;
  pb.v = b.v.data() + 40 * pb.v_row_stride * 4;
  ASSERT_TRUE(attn::attention(pb).ok());
  for (int h = 0; h < c.h; ++h) {
    attn::merge_partial(&o_a[h * c.d], &lse_a[h], &o_b[h * c.d], lse_b[h], c.d);
    EXPECT_NEAR(lse_a[h], lse_all[h], 1e-5);
    for (int i = 0; i < c.d; ++i) EXPECT_NEAR(o_a[h * c.d + i], o_all[h * c.d + i], 1e-5);
  }
}

TEST(Attention, RejectsBadShapes) {
  std::mt19937 rng(3);
  AttnCase c;
  AttnBuffers b = make_buffers(c, rng);
  auto o = poisoned_output(b);
  attn::AttentionParams p = b.params(o.data(), nullptr);
  p.num_heads = 5;  // not divisible by 2
  Status st = attn::attention(p);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("divisible"), std::string::npos);
  p = b.params(o.data(), nullptr);
  p.head_dim = 12;
  EXPECT_FALSE(attn::attention(p).ok());
  p = b.params(o.data(), nullptr);
  p.window_left = -5;
  EXPECT_FALSE(attn::attention(p).ok());
  p = b.params(o.data(), nullptr);
  p.softcap = -1.0f;
  EXPECT_FALSE(attn::attention(p).ok());
}

}  // namespace
}  // namespace escala::test
