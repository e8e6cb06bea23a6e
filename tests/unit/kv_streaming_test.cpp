// StreamingLLM and sliding-window release: memory stays flat over 100k tokens, and attention over
// the evicted page list (keys stored before or after RoPE) equals a direct computation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "attention/kv_layout.h"
#include "escala/kv_cache.h"
#include "kv/planner.h"

namespace escala::kv {
namespace {

CacheConfig stream_config(int h_kv, int d, int bs, int64_t blocks, DType t = DType::kF32) {
  CacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = h_kv;
  c.head_dim = d;
  c.dtype = t;
  c.block_size = bs;
  c.budget_bytes = blocks * *block_bytes(2, h_kv, d, format_of(t), bs);
  return c;
}

Status append_and_write(KvCache& cache, SeqId id, int64_t n, const float* k, const float* v) {
  std::vector<int32_t> toks(static_cast<size_t>(n), 1);
  AppendRequest r{id, toks};
  auto plan = cache.prepare_append({&r, 1});
  if (!plan.ok()) return plan.status();
  if (!plan->fits()) return Status::error("out of blocks");
  ESCALA_RETURN_IF_ERROR(cache.apply(*plan));
  const int64_t first = cache.num_tokens(id) - n;
  for (int32_t l = 0; l < cache.config().num_layers; ++l) ESCALA_RETURN_IF_ERROR(cache.write_kv(id, l, first, n, k, v));
  return {};
}

TEST(KvStreaming, MemoryStaysFlatOver100kTokens) {
  constexpr int kSinks = 4, kWindow = 256, kBs = 16;
  for (int chunk : {1, 37}) {
    auto cache = std::move(KvCache::create(stream_config(2, 32, kBs, 64, DType::kBF16)).value());
    SeqOptions opt;
    opt.streaming = {kSinks, kWindow};
    ASSERT_TRUE(cache->add_sequence(7, {}, opt).ok());
    std::vector<float> k(size_t(chunk) * 2 * 32, 0.5f), v = k;
    const int32_t sink_block = -1;
    int32_t first_block = sink_block;
    int64_t max_used = 0, min_used_late = std::numeric_limits<int64_t>::max();
    const int64_t total = 100000;
    for (int64_t t = 0; t < total; t += chunk) {
      ASSERT_TRUE(append_and_write(*cache, 7, chunk, k.data(), v.data()).ok()) << "token " << t;
      const CacheStats s = cache->stats();
      max_used = std::max(max_used, s.used_blocks);
      if (t > 10 * kWindow) min_used_late = std::min(min_used_late, s.used_blocks);
      const auto table = cache->block_table(7);
      if (first_block < 0) first_block = table[0];
      ASSERT_EQ(table[0], first_block);  // the sink block never moves
      if (t % 4999 == 0) {
        ASSERT_TRUE(cache->check_invariants().ok());
      }
    }
    // Sink block + the window's blocks + the partial block + the chunk: independent of length.
    const int64_t bound = 1 + (kWindow + kBs - 1) / kBs + 1 + (chunk + kBs - 1) / kBs;
    EXPECT_LE(max_used, bound) << "chunk " << chunk;
    EXPECT_GE(min_used_late, max_used - (chunk + kBs - 1) / kBs - 1) << "chunk " << chunk;
    EXPECT_EQ(cache->num_tokens(7), (total + chunk - 1) / chunk * chunk);
    const SeqId ids[1] = {7};
    auto batch = cache->batch(ids);
    const int32_t resident = batch->cu_seqlens_k[0][1];
    EXPECT_LE(resident, kBs + kWindow + 2 * kBs + chunk);
    EXPECT_EQ(resident, cache->num_tokens(7) - cache->evicted_tokens(7));
    EXPECT_GT(cache->stats().streamed_releases, 0);
    EXPECT_FALSE(cache->truncate(7, 100).ok());  // evicted tokens cannot come back
  }
}

// Direct StreamingLLM attention in double for one query head: visible keys are given explicitly,
// each with the position its RoPE uses.
std::vector<double> direct(const std::vector<float>& q, int64_t q_pos, const std::vector<const float*>& keys,
                           const std::vector<int64_t>& key_pos, const std::vector<const float*>& values, int d,
                           const float* inv_freq) {
  std::vector<double> qr(q.begin(), q.end()), s;
  attn::apply_rope(qr.data(), d, q_pos, inv_freq, false);
  double m = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < keys.size(); ++j) {
    std::vector<double> kr(keys[j], keys[j] + d);
    attn::apply_rope(kr.data(), d, key_pos[j], inv_freq, false);
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += qr[size_t(c)] * kr[size_t(c)];
    s.push_back(dot / std::sqrt(double(d)));
    m = std::max(m, s.back());
  }
  std::vector<double> o(size_t(d), 0.0);
  double den = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    const double w = std::exp(s[j] - m);
    den += w;
    for (int c = 0; c < d; ++c) o[size_t(c)] += w * values[j][c];
  }
  for (auto& x : o) x /= den;
  return o;
}

// Keys stored after RoPE (true positions) and before RoPE (rotated at read time by cache position)
// both reproduce StreamingLLM through the evicted page list with causal + sinks + window masks.
TEST(KvStreaming, PreAndPostRopeKeysMatchDirectComputation) {
  constexpr int kD = 16, kHkv = 2, kH = 4, kBs = 4, kSinks = 2, kWindow = 10;
  std::vector<float> inv_freq(kD / 2);
  for (int i = 0; i < kD / 2; ++i) inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * i / kD));
  CacheConfig post_cfg = stream_config(kHkv, kD, kBs, 32), pre_cfg = post_cfg;
  pre_cfg.rope_inv_freq = inv_freq;
  auto post = std::move(KvCache::create(post_cfg).value());
  auto pre = std::move(KvCache::create(pre_cfg).value());
  SeqOptions opt;
  opt.streaming = {kSinks, kWindow};
  ASSERT_TRUE(post->add_sequence(0, {}, opt).ok());
  ASSERT_TRUE(pre->add_sequence(0, {}, opt).ok());

  std::mt19937 rng(8);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> k_raw, v_all;  // per true position, [h_kv * d]
  int64_t len = 0;
  // [impl][is_pre]: the reference, and whatever kernel kAuto picks (decode for these short runs).
  double worst[2][2] = {{0, 0}, {0, 0}};
  while (len < 90) {
    const int n = 1 + int(rng() % 5);
    std::vector<float> kpost, kpre, vv;
    for (int t = 0; t < n; ++t) {
      std::vector<float> kr(kHkv * kD), v(kHkv * kD);
      for (auto& x : kr) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      kpre.insert(kpre.end(), kr.begin(), kr.end());
      for (int h = 0; h < kHkv; ++h) {  // post-RoPE: rotated by the true position at write
        std::vector<double> r(kr.begin() + h * kD, kr.begin() + (h + 1) * kD);
        attn::apply_rope(r.data(), kD, len + t, inv_freq.data(), false);
        for (double x : r) kpost.push_back(float(x));
      }
      vv.insert(vv.end(), v.begin(), v.end());
      k_raw.push_back(kr);
      v_all.push_back(v);
    }
    ASSERT_TRUE(append_and_write(*post, 0, n, kpost.data(), vv.data()).ok());
    ASSERT_TRUE(append_and_write(*pre, 0, n, kpre.data(), vv.data()).ok());
    const int64_t old_len = len;
    len += n;
    ASSERT_EQ(post->evicted_tokens(0), pre->evicted_tokens(0));
    const int64_t evicted = post->evicted_tokens(0);

    // Queries for the n new tokens.
    std::vector<float> q_raw(size_t(n) * kH * kD);
    for (auto& x : q_raw) x = nd(rng);
    const SeqId ids[1] = {0};
    for (bool is_pre : {false, true}) {
      KvCache& cache = is_pre ? *pre : *post;
      std::vector<float> q = q_raw;
      for (int i = 0; i < n; ++i)
        for (int h = 0; h < kH; ++h) {
          float* row = q.data() + (size_t(i) * kH + h) * kD;
          const int64_t pos = is_pre ? cache.query_position(0, old_len + i) : old_len + i;
          std::vector<double> r(row, row + kD);
          attn::apply_rope(r.data(), kD, pos, inv_freq.data(), false);
          for (int c = 0; c < kD; ++c) row[c] = float(r[size_t(c)]);
        }
      auto batch = cache.batch(ids);
      ASSERT_TRUE(batch.ok());
      std::vector<float> o(q.size(), std::nanf(""));
      std::vector<int32_t> cu_q{0, n};
      attn::AttentionParams p;
      ASSERT_TRUE(cache.bind(*batch, 1, p).ok());
      p.q = q.data();
      p.o = o.data();
      p.q_row_stride = p.o_row_stride = kH * kD;
      p.q_head_stride = p.o_head_stride = kD;
      p.cu_seqlens_q = cu_q.data();
      p.num_heads = kH;
      p.causal = true;
      p.num_sinks = kSinks;
      p.window_left = kWindow - 1;
      for (int impl = 0; impl < 2; ++impl) {
      attn::CpuOptions copt;
      copt.impl = impl == 0 ? attn::Impl::kReference : attn::Impl::kAuto;
      Status st = attn::attention(p, copt);
      ASSERT_TRUE(st.ok()) << st.message();
      // Direct: StreamingLLM over the full history in true positions; positions for RoPE are the
      // true ones (post) or the cache ones (pre: sinks keep theirs, the window shifts by evicted).
      auto cache_pos = [&](int64_t t) { return t < int64_t(kBs) * ((kSinks + kBs - 1) / kBs) ? t : t - evicted; };
      for (int i = 0; i < n; ++i) {
        const int64_t qp = old_len + i;
        for (int h = 0; h < kH; ++h) {
          const int hk = h / (kH / kHkv);
          std::vector<const float*> keys, vals;
          std::vector<int64_t> kpos;
          for (int64_t j = 0; j <= qp; ++j) {
            if (!(j < kSinks || j >= qp - kWindow + 1)) continue;
            keys.push_back(k_raw[size_t(j)].data() + hk * kD);
            vals.push_back(v_all[size_t(j)].data() + hk * kD);
            kpos.push_back(is_pre ? cache_pos(j) : j);
          }
          std::vector<float> qh(q_raw.begin() + (i * kH + h) * kD, q_raw.begin() + (i * kH + h + 1) * kD);
          const auto want = direct(qh, is_pre ? cache_pos(qp) : qp, keys, kpos, vals, kD, inv_freq.data());
          for (int c = 0; c < kD; ++c) {
            const double err = std::fabs(o[(size_t(i) * kH + h) * kD + size_t(c)] - want[size_t(c)]);
            worst[impl][is_pre] = std::max(worst[impl][is_pre], err);
          }
        }
      }
      }
    }
  }
  EXPECT_GT(post->evicted_tokens(0), 40);  // eviction really happened
  EXPECT_LT(worst[0][0], 2e-5);  // reference, keys after RoPE
  EXPECT_LT(worst[0][1], 2e-5);  // reference, keys before RoPE
  EXPECT_LT(worst[1][0], 1e-4);  // kernels (f32 accumulation)
  EXPECT_LT(worst[1][1], 1e-4);
}

// Gemma-2 style: a global group and a sliding-window group. The local group's table stays bounded,
// attention through it equals windowed attention over the full history, and its full blocks still
// serve prefix hits (a sliding window changes no K/V, unlike StreamingLLM).
TEST(KvStreaming, SlidingWindowGroupReleasesBlocks) {
  CacheConfig c = stream_config(1, 8, 4, 64);
  c.groups = {{{0}, 0}, {{1}, 8}};
  c.budget_bytes = 64 * *block_bytes(1, 1, 8, KvFormat::kF32, 4);
  auto cache = std::move(KvCache::create(c).value());
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[size_t(i)] = i;
  ASSERT_TRUE(cache->add_sequence(0, prompt).ok());
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> k(800), v(800);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (int t = 0; t < 100; ++t) {
    AppendRequest r{0, std::span<const int32_t>(prompt).subspan(size_t(t), 1)};
    auto plan = cache->prepare_append({&r, 1});
    ASSERT_TRUE(plan.ok() && plan->fits());
    ASSERT_TRUE(cache->apply(*plan).ok());
    for (int32_t l = 0; l < 2; ++l) ASSERT_TRUE(cache->write_kv(0, l, t, 1, k.data() + t * 8, v.data() + t * 8).ok());
    ASSERT_LE(cache->block_table(0, 1).size(), 4u);
  }
  EXPECT_EQ(cache->block_table(0, 0).size(), 25u);
  EXPECT_EQ(cache->evicted_tokens(0, 1), 92);  // blocks 0..22: before the last query's window
  EXPECT_EQ(cache->evicted_tokens(0, 0), 0);
  ASSERT_TRUE(cache->check_invariants().ok());
  // Decode query at position 99 through layer 1 (local): window of 8.
  std::vector<float> q(8), o(8);
  for (auto& x : q) x = nd(rng);
  const SeqId ids[1] = {0};
  auto batch = cache->batch(ids);
  std::vector<int32_t> cu_q{0, 1};
  attn::AttentionParams p;
  ASSERT_TRUE(cache->bind(*batch, 1, p).ok());
  EXPECT_EQ(p.cu_seqlens_k[1], 8);
  p.q = q.data();
  p.o = o.data();
  p.q_row_stride = p.o_row_stride = p.q_head_stride = p.o_head_stride = 8;
  p.cu_seqlens_q = cu_q.data();
  p.num_heads = 1;
  p.causal = true;
  p.window_left = 7;
  attn::CpuOptions copt;
  copt.impl = attn::Impl::kReference;
  ASSERT_TRUE(attn::attention(p, copt).ok());
  std::vector<const float*> keys, vals;
  std::vector<int64_t> pos;
  for (int j = 92; j < 100; ++j) {
    keys.push_back(k.data() + j * 8);
    vals.push_back(v.data() + j * 8);
    pos.push_back(0);
  }
  const std::vector<float> zero_freq(4, 0.0f);
  const auto want = direct(q, 0, keys, pos, vals, 8, zero_freq.data());
  for (int c = 0; c < 8; ++c) EXPECT_NEAR(o[size_t(c)], want[size_t(c)], 2e-5);
  // The prompt's blocks are still cached in both groups: a second request reuses 96 tokens.
  EXPECT_EQ(*cache->add_sequence(1, prompt), 96);
  ASSERT_TRUE(cache->check_invariants().ok());
}

}  // namespace
}  // namespace escala::kv
