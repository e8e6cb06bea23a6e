// The flash kernel's memory does not grow with T^2: a T = 65536 causal run on one head must add
// only its fixed per-thread scratch to the peak resident set (a score matrix would be 16 GiB).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include "attention/reference.h"
#include "attention_case.h"

namespace escala::test {
namespace {

long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(AttentionLong, Flash65536TokensConstantMemory) {
  AttnCase c;
  c.h = c.h_kv = 1;
  c.d = 64;
  c.q_lens = c.kv_lens = {65536};
  c.causal = true;
  c.q_dtype = c.kv_dtype = c.o_dtype = DType::kBF16;
  std::mt19937 rng(std::random_device{}());
  AttnBuffers b = make_buffers(c, rng);
  auto o = poisoned_output(b);
  std::vector<float> lse(b.total_q);
  const long before = peak_rss_kib();
  attn::CpuOptions opt;
  opt.impl = attn::Impl::kFlash;
  ASSERT_TRUE(attn::attention(b.params(o.data(), lse.data()), opt).ok());
  const long grown_kib = peak_rss_kib() - before;
  EXPECT_LT(grown_kib, 64 * 1024) << "flash kernel grew the resident set by " << grown_kib << " KiB";

  // Spot-check rows against the reference: query i of the full run equals a one-query append
  // over keys [0, i] (the causal diagonal is aligned to the end of the KV).
  const Tolerance tol = tolerance_for(c.o_dtype);
  for (int i : {0, 1, 4095, 40000, 65535}) {
    std::vector<float> ref(c.d), ref_lse(1);
    attn::AttentionParams p = b.params(ref.data(), ref_lse.data());
    int32_t cu_q[2] = {0, 1}, cu_k[2] = {0, i + 1};
    p.q = b.q.data() + size_t(i) * c.d * 2;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    p.o_dtype = DType::kF32;
    attn::attention_reference(p);
    for (int k = 0; k < c.d; ++k) {
      const float got = output_at(o, c.o_dtype, int64_t(i) * c.d + k);
      EXPECT_LE(std::fabs(got - ref[k]), tol.atol + tol.rtol * std::fabs(ref[k])) << "row " << i << " col " << k;
    }
    EXPECT_NEAR(lse[i], ref_lse[0], kLseTolerance * (1 + std::fabs(ref_lse[0])));
  }
}

}  // namespace
}  // namespace escala::test
