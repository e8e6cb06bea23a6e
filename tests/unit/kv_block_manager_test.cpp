// The block manager: capacity from the planner, out-of-blocks as a clean outcome, fork with
// copy-on-write, truncate, prefix caching with LRU eviction, and a model-based randomized test that
// checks refcounts, leaks and the actual K/V bytes of every sequence after every operation.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "attention/kv_layout.h"
#include "escala/kv_cache.h"
#include "kv/planner.h"

namespace escala::kv {
namespace {

// Small shapes so that every byte can be checked after every step.
CacheConfig small_config(int32_t blocks, int32_t bs = 4, int32_t groups = 1) {
  CacheConfig c;
  c.num_layers = 2 * groups;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.dtype = DType::kF32;
  c.block_size = bs;
  for (int32_t g = 0; g < groups; ++g) c.groups.push_back({{2 * g, 2 * g + 1}, 0});
  c.budget_bytes = blocks * *block_bytes(2, c.num_kv_heads, c.head_dim, format_of(c.dtype), bs);
  return c;
}

std::unique_ptr<KvCache> make(const CacheConfig& c) {
  auto r = KvCache::create(c);
  EXPECT_TRUE(r.ok()) << r.message();
  return std::move(r.value());
}

// K/V of a token depend on the whole prefix (as in a real model), its layer, head and channel.
float kv_value(uint64_t prefix_hash, int32_t layer, int32_t head, int32_t c, bool is_v) {
  uint64_t x = prefix_hash ^ (uint64_t(layer) << 40) ^ (uint64_t(head) << 32) ^ (uint64_t(c) << 8) ^ (is_v ? 1 : 0);
  x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
  x ^= x >> 27;
  return float(int32_t(x % 2001) - 1000) / 64.0f;  // exact in f32
}

std::vector<uint64_t> prefix_hashes(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> h;
  uint64_t x = 1469598103934665603ull;
  for (int32_t t : tokens) {
    x = (x ^ uint64_t(uint32_t(t))) * 1099511628211ull;
    h.push_back(x);
  }
  return h;
}

// Writes the model's K/V for tokens [first, tokens.size()) in every layer.
void write_tokens(KvCache& cache, SeqId id, const std::vector<int32_t>& tokens, int64_t first) {
  const auto& c = cache.config();
  const auto h = prefix_hashes(tokens);
  const int64_t n = int64_t(tokens.size()) - first;
  const int64_t row = int64_t(c.num_kv_heads) * c.head_dim;
  std::vector<float> k(size_t(n * row)), v(size_t(n * row));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (int64_t t = 0; t < n; ++t)
      for (int32_t hh = 0; hh < c.num_kv_heads; ++hh)
        for (int32_t ch = 0; ch < c.head_dim; ++ch) {
          k[size_t(t * row + hh * c.head_dim + ch)] = kv_value(h[size_t(first + t)], l, hh, ch, false);
          v[size_t(t * row + hh * c.head_dim + ch)] = kv_value(h[size_t(first + t)], l, hh, ch, true);
        }
    ASSERT_TRUE(cache.write_kv(id, l, first, n, k.data(), v.data()).ok());
  }
}

// prepare + apply + write; false when out of blocks (then nothing may have changed).
bool append(KvCache& cache, SeqId id, std::vector<int32_t>& tokens, const std::vector<int32_t>& add) {
  AppendRequest r{id, add};
  auto plan = cache.prepare_append({&r, 1});
  EXPECT_TRUE(plan.ok()) << plan.message();
  if (!plan->fits()) return false;
  Status st = cache.apply(*plan);
  EXPECT_TRUE(st.ok()) << st.message();
  const int64_t first = int64_t(tokens.size());
  tokens.insert(tokens.end(), add.begin(), add.end());
  write_tokens(cache, id, tokens, first);
  return true;
}

// Every resident K/V element of every sequence, read through the exported attention view, equals
// what the model wrote for that sequence's own tokens. A streamed sequence's view holds its sink
// blocks then its window: cache position i is true position i, or i + evicted past the sinks.
void check_data(const KvCache& cache, const std::map<SeqId, std::vector<int32_t>>& model,
                const std::map<SeqId, StreamingPolicy>& policies = {}) {
  std::vector<SeqId> ids;
  for (const auto& [id, t] : model) ids.push_back(id);
  auto batch = cache.batch(ids);
  ASSERT_TRUE(batch.ok()) << batch.message();
  const auto& c = cache.config();
  for (int32_t l = 0; l < c.num_layers; ++l) {
    attn::AttentionParams p;
    ASSERT_TRUE(cache.bind(*batch, l, p).ok());
    for (size_t b = 0; b < ids.size(); ++b) {
      const auto& tokens = model.at(ids[b]);
      const auto h = prefix_hashes(tokens);
      const int64_t evicted = cache.evicted_tokens(ids[b], cache.group_of_layer(l));
      auto pol = policies.find(ids[b]);
      const int64_t sink_end =
          pol == policies.end() ? 0 : (pol->second.num_sinks + c.block_size - 1) / c.block_size * c.block_size;
      ASSERT_EQ(p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b], int64_t(tokens.size()) - evicted);
      const attn::KvSeq K = attn::make_kv_seq(p, int32_t(b), false), V = attn::make_kv_seq(p, int32_t(b), true);
      for (int64_t i = 0; i < int64_t(tokens.size()) - evicted; ++i) {
        const size_t t = size_t(evicted > 0 && i >= sink_end ? i + evicted : i);
        for (int32_t hh = 0; hh < c.num_kv_heads; ++hh)
          for (int32_t ch = 0; ch < c.head_dim; ++ch) {
            ASSERT_EQ(K.load(i, hh, ch), kv_value(h[t], l, hh, ch, false))
                << "seq " << ids[b] << " layer " << l << " token " << t;
            ASSERT_EQ(V.load(i, hh, ch), kv_value(h[t], l, hh, ch, true));
          }
      }
    }
  }
}

// Refcounts recomputed from the public tables; used/free counts; the cache's own invariant check.
void check_accounting(const KvCache& cache, const std::map<SeqId, std::vector<int32_t>>& model) {
  Status st = cache.check_invariants();
  ASSERT_TRUE(st.ok()) << st.message();
  const int32_t groups = int32_t(cache.config().groups.size());
  const int32_t bs = cache.config().block_size;
  std::map<int32_t, int32_t> refs;
  int64_t table_blocks = 0;
  for (const auto& [id, tokens] : model) {
    ASSERT_EQ(cache.num_tokens(id), int64_t(tokens.size()));
    for (int32_t g = 0; g < groups; ++g) {
      auto t = cache.block_table(id, g);
      ASSERT_EQ(int64_t(t.size()), (int64_t(tokens.size()) + bs - 1) / bs - cache.evicted_tokens(id, g) / bs);
      for (int32_t b : t) ++refs[b];
      table_blocks += int64_t(t.size());
    }
  }
  for (int32_t b = 0; b < cache.num_blocks(); ++b) ASSERT_EQ(cache.block_refcount(b), refs.count(b) ? refs[b] : 0);
  const CacheStats s = cache.stats();
  ASSERT_EQ(s.used_blocks, int64_t(refs.size()));
  ASSERT_EQ(s.used_blocks + s.free_blocks, s.total_blocks);
  ASSERT_LE(s.cached_blocks, s.free_blocks);
  ASSERT_EQ(s.bytes_in_use, s.used_blocks * s.block_bytes);
  ASSERT_LE(s.used_blocks, table_blocks);  // sharing only ever saves blocks
  ASSERT_EQ(s.sequences, int64_t(model.size()));
}

TEST(KvBlockManager, CapacityComesFromThePlanner) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI8, DType::kFp8E4M3}) {
    CacheConfig c;
    c.num_layers = 4;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.dtype = t;
    c.budget_bytes = int64_t(64) << 20;
    auto cache = make(c);
    const int64_t bb = *block_bytes(4, 8, 128, format_of(t), 16);
    EXPECT_EQ(cache->num_blocks(), *blocks_in_budget(c.budget_bytes, bb));
    EXPECT_EQ(cache->stats().block_bytes, bb);
    EXPECT_EQ(cache->stats().bytes_total, cache->num_blocks() * bb);
  }
}

TEST(KvBlockManager, BadConfigIsAnError) {
  CacheConfig c = small_config(8);
  c.budget_bytes = 10;  // less than one block
  EXPECT_FALSE(KvCache::create(c).ok());
  c = small_config(8);
  c.groups = {{{0}, 0}, {{1, 0}, 0}};
  EXPECT_FALSE(KvCache::create(c).ok());  // unequal groups, layer twice
  c = small_config(8);
  c.block_size = 0;
  EXPECT_FALSE(KvCache::create(c).ok());
  c = small_config(8);
  c.rope_inv_freq.assign(4, 1.0f);
  c.hadamard_keys = true;
  EXPECT_FALSE(KvCache::create(c).ok());  // RoPE at read time after a Hadamard write is wrong
}

TEST(KvBlockManager, OutOfBlocksIsAReportedOutcomeAndChangesNothing) {
  auto cache = make(small_config(6));
  std::map<SeqId, std::vector<int32_t>> model;
  ASSERT_TRUE(cache->add_sequence(1).ok());
  ASSERT_TRUE(cache->add_sequence(2).ok());
  model[1];
  model[2];
  ASSERT_TRUE(append(*cache, 1, model[1], std::vector<int32_t>(10, 7)));  // 3 blocks
  ASSERT_TRUE(append(*cache, 2, model[2], std::vector<int32_t>(6, 9)));   // 2 blocks
  const auto t1 = cache->block_table(1), t2 = cache->block_table(2);
  // Seq 1 needs 2 more blocks, seq 2 one more; one is free: short by 2.
  std::vector<int32_t> a(7, 1), b(4, 2);
  AppendRequest reqs[2] = {{1, a}, {2, b}};
  auto plan = cache->prepare_append(reqs);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->fits());
  EXPECT_EQ(plan->blocks_available, 1);
  EXPECT_EQ(plan->blocks_needed, 3);
  EXPECT_EQ(plan->blocks_short, 2);
  EXPECT_FALSE(cache->apply(*plan).ok());
  EXPECT_EQ(cache->block_table(1), t1);
  EXPECT_EQ(cache->block_table(2), t2);
  check_accounting(*cache, model);
  check_data(*cache, model);
  // A stale plan (the cache changed after prepare) is refused too.
  auto ok_plan = cache->prepare_append({&reqs[1], 1});
  ASSERT_TRUE(ok_plan.ok() && ok_plan->fits());
  ASSERT_TRUE(cache->truncate(1, 9).ok());
  model[1].resize(9);
  EXPECT_FALSE(cache->apply(*ok_plan).ok());
  check_accounting(*cache, model);
  // Unknown sequences and duplicates are input errors, not out-of-blocks.
  AppendRequest bad{42, a};
  EXPECT_FALSE(cache->prepare_append({&bad, 1}).ok());
  AppendRequest dup[2] = {{1, a}, {1, b}};
  EXPECT_FALSE(cache->prepare_append(dup).ok());
  // Freeing a sequence makes room.
  ASSERT_TRUE(cache->free_sequence(2).ok());
  model.erase(2);
  EXPECT_TRUE(append(*cache, 1, model[1], a));
  check_accounting(*cache, model);
  check_data(*cache, model);
}

TEST(KvBlockManager, ForkCopiesOnWriteAndNeverChangesTheOther) {
  auto cache = make(small_config(16));
  std::map<SeqId, std::vector<int32_t>> model;
  ASSERT_TRUE(cache->add_sequence(1).ok());
  model[1];
  ASSERT_TRUE(append(*cache, 1, model[1], {1, 2, 3, 4, 5, 6}));  // one full block + a partial one
  ASSERT_TRUE(cache->fork(1, 2).ok());
  model[2] = model[1];
  EXPECT_EQ(cache->block_table(1), cache->block_table(2));
  for (int32_t b : cache->block_table(1)) EXPECT_EQ(cache->block_refcount(b), 2);
  check_data(*cache, model);
  ASSERT_TRUE(append(*cache, 2, model[2], {70}));  // child writes first: it copies
  EXPECT_EQ(cache->stats().cow_copies, 1);
  EXPECT_EQ(cache->block_table(1)[0], cache->block_table(2)[0]);  // full block still shared
  EXPECT_NE(cache->block_table(1)[1], cache->block_table(2)[1]);
  ASSERT_TRUE(append(*cache, 1, model[1], {80}));  // parent now alone on its block: in place
  EXPECT_EQ(cache->stats().cow_copies, 1);
  check_accounting(*cache, model);
  check_data(*cache, model);
  // Both append in one batch after another fork: exactly one of them copies.
  ASSERT_TRUE(cache->fork(1, 3).ok());
  model[3] = model[1];
  std::vector<int32_t> x{5}, y{6};
  AppendRequest reqs[2] = {{1, x}, {3, y}};
  auto plan = cache->prepare_append(reqs);
  ASSERT_TRUE(plan.ok() && plan->fits());
  EXPECT_EQ(plan->blocks_needed, 1);  // the first writer copies, the second is then alone
  ASSERT_TRUE(cache->apply(*plan).ok());
  for (auto [id, add] : {std::pair{SeqId(1), x}, std::pair{SeqId(3), y}}) {
    model[id].insert(model[id].end(), add.begin(), add.end());
    write_tokens(*cache, id, model[id], int64_t(model[id].size()) - 1);
  }
  check_accounting(*cache, model);
  check_data(*cache, model);
}

// A device pool replays what apply() did: copy-on-write copies and fresh blocks.
TEST(KvBlockManager, ApplyLogAndMetadataOnlyCache) {
  CacheConfig c = small_config(16);
  c.host_storage = false;
  auto cache = make(c);
  ASSERT_TRUE(cache->add_sequence(1).ok());
  std::vector<int32_t> six{1, 2, 3, 4, 5, 6}, one{7};
  AppendRequest r{1, six};
  auto plan = cache->prepare_append({&r, 1});
  ASSERT_TRUE(plan.ok() && plan->fits());
  ASSERT_TRUE(cache->apply(*plan).ok());
  EXPECT_EQ(cache->last_apply().fresh_blocks, cache->block_table(1));
  EXPECT_TRUE(cache->last_apply().copies.empty());
  std::vector<float> row(16, 1.0f);
  EXPECT_FALSE(cache->write_kv(1, 0, 0, 1, row.data(), row.data()).ok());
  ASSERT_TRUE(cache->fork(1, 2).ok());
  AppendRequest r2{2, one};
  plan = cache->prepare_append({&r2, 1});
  ASSERT_TRUE(plan.ok() && plan->fits());
  ASSERT_TRUE(cache->apply(*plan).ok());
  ASSERT_EQ(cache->last_apply().copies.size(), 1u);
  EXPECT_EQ(cache->last_apply().copies[0].src, cache->block_table(1)[1]);
  EXPECT_EQ(cache->last_apply().copies[0].dst, cache->block_table(2)[1]);
  EXPECT_EQ(cache->last_apply().copies[0].tokens, 2);
  EXPECT_TRUE(cache->last_apply().fresh_blocks.empty());
  const SeqId ids[2] = {1, 2};
  auto batch = cache->batch(ids);
  ASSERT_TRUE(batch.ok());
  attn::AttentionParams p;
  ASSERT_TRUE(cache->bind(*batch, 0, p).ok());
  EXPECT_EQ(p.k, nullptr);
  EXPECT_EQ(p.page_indptr[2], 4);
  EXPECT_EQ(p.cu_seqlens_k[2], 6 + 7);
  ASSERT_TRUE(cache->check_invariants().ok());
}

// probe_prompt() predicts add_sequence() + the prompt's append without changing anything.
TEST(KvBlockManager, ProbePromptPredictsAdmission) {
  auto cache = make(small_config(8));
  std::map<SeqId, std::vector<int32_t>> model;
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  PromptProbe pr = cache->probe_prompt(prompt);
  EXPECT_EQ(pr.hit_tokens, 0);
  EXPECT_EQ(pr.blocks_needed, 3);
  EXPECT_EQ(pr.blocks_available, 8);
  ASSERT_TRUE(cache->add_sequence(1).ok());
  model[1];
  ASSERT_TRUE(append(*cache, 1, model[1], prompt));
  ASSERT_TRUE(cache->free_sequence(1).ok());  // two full blocks stay cached
  model.clear();
  pr = cache->probe_prompt(prompt);
  EXPECT_EQ(pr.hit_tokens, 8);
  EXPECT_EQ(pr.blocks_needed, 1);
  EXPECT_EQ(pr.blocks_available, 8 - 2);  // the hits leave the cached list when attached
  const CacheStats before = cache->stats();
  EXPECT_EQ(before.used_blocks, 0);
  EXPECT_EQ(before.prefix_query_tokens, 0);  // probing is not a lookup for the hit rate
  EXPECT_EQ(*cache->add_sequence(2, prompt), pr.hit_tokens);
  std::vector<int32_t> rest(prompt.begin() + 8, prompt.end());
  AppendRequest r{2, rest};
  auto plan = cache->prepare_append({&r, 1});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->blocks_needed, pr.blocks_needed);
  EXPECT_EQ(plan->blocks_available, pr.blocks_available);
}

TEST(KvBlockManager, TruncateDropsRejectedTokens) {
  auto cache = make(small_config(16));
  std::map<SeqId, std::vector<int32_t>> model;
  ASSERT_TRUE(cache->add_sequence(1).ok());
  model[1];
  ASSERT_TRUE(append(*cache, 1, model[1], {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(cache->stats().used_blocks, 3);
  ASSERT_TRUE(cache->truncate(1, 5).ok());
  model[1].resize(5);
  EXPECT_EQ(cache->stats().used_blocks, 2);
  EXPECT_FALSE(cache->truncate(1, 6).ok());
  EXPECT_FALSE(cache->write_kv(1, 0, 0, 1, nullptr, nullptr).ok());
  ASSERT_TRUE(append(*cache, 1, model[1], {11, 12, 13}));
  check_accounting(*cache, model);
  check_data(*cache, model);
  // Writing tokens that were not just appended (an older, possibly shared, block) is refused.
  std::vector<float> row(16, 0.0f);
  EXPECT_FALSE(cache->write_kv(1, 0, 0, 1, row.data(), row.data()).ok());
  // So are non-finite values; nothing is written.
  row[3] = std::nanf("");
  EXPECT_FALSE(cache->write_kv(1, 0, 7, 1, row.data(), row.data()).ok());
  row[3] = INFINITY;
  EXPECT_FALSE(cache->write_kv(1, 1, 7, 1, row.data(), row.data()).ok());
  check_data(*cache, model);
}

TEST(KvBlockManager, PrefixCacheHitsAndEvictsLeastRecentlyUsed) {
  auto cache = make(small_config(8));
  std::map<SeqId, std::vector<int32_t>> model;
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ASSERT_EQ(*cache->add_sequence(1, prompt), 0);
  model[1];
  ASSERT_TRUE(append(*cache, 1, model[1], prompt));
  // Same prompt: two full blocks reused (at most prompt.size() - 1 tokens).
  auto hit = cache->add_sequence(2, prompt);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(*hit, 8);
  model[2] = std::vector<int32_t>(prompt.begin(), prompt.begin() + 8);
  ASSERT_TRUE(append(*cache, 2, model[2], {9, 10}));
  EXPECT_EQ(cache->block_table(1)[0], cache->block_table(2)[0]);
  EXPECT_EQ(cache->block_table(1)[1], cache->block_table(2)[1]);
  EXPECT_NE(cache->block_table(1)[2], cache->block_table(2)[2]);
  check_accounting(*cache, model);
  check_data(*cache, model);
  EXPECT_DOUBLE_EQ(cache->stats().hit_rate, 8.0 / 20.0);
  // A prompt that diverges in the second block reuses only the first.
  std::vector<int32_t> other = prompt;
  other[5] = 99;
  EXPECT_EQ(*cache->add_sequence(3, other), 4);
  ASSERT_TRUE(cache->free_sequence(3).ok());
  // Freed sequences leave their full blocks cached, not free; a new request still hits them.
  ASSERT_TRUE(cache->free_sequence(1).ok());
  ASSERT_TRUE(cache->free_sequence(2).ok());
  model.clear();
  EXPECT_EQ(cache->stats().used_blocks, 0);
  EXPECT_EQ(cache->stats().cached_blocks, 2);
  EXPECT_EQ(*cache->add_sequence(4, prompt), 8);
  ASSERT_TRUE(cache->free_sequence(4).ok());
  // Filling the pool with other content evicts the cached blocks, only once free ones ran out.
  ASSERT_TRUE(cache->add_sequence(5).ok());
  model[5];
  ASSERT_TRUE(append(*cache, 5, model[5], std::vector<int32_t>(6 * 4, 3)));
  EXPECT_EQ(cache->stats().cache_evictions, 0);
  EXPECT_EQ(cache->stats().cached_blocks, 2);
  ASSERT_TRUE(append(*cache, 5, model[5], std::vector<int32_t>(4, 3)));
  EXPECT_EQ(cache->stats().cache_evictions, 1);
  check_accounting(*cache, model);
  check_data(*cache, model);
  EXPECT_LT(*cache->add_sequence(6, prompt), 8);
}

// A request cancelled after apply() but before its K/V were written leaves nothing to hit; a block
// joins the prefix cache only once every layer has written it (or mark_written() says so).
TEST(KvBlockManager, OnlyWrittenBlocksServePrefixHits) {
  auto cache = make(small_config(16));
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  ASSERT_TRUE(cache->add_sequence(1).ok());
  AppendRequest r{1, prompt};
  auto plan = cache->prepare_append({&r, 1});
  ASSERT_TRUE(plan.ok() && plan->fits());
  ASSERT_TRUE(cache->apply(*plan).ok());
  EXPECT_EQ(cache->probe_prompt(prompt).hit_tokens, 0);
  ASSERT_TRUE(cache->free_sequence(1).ok());  // cancelled before the forward pass
  EXPECT_EQ(cache->stats().cached_blocks, 0);
  EXPECT_EQ(*cache->add_sequence(2, prompt), 0);
  // Layer 0 written, layer 1 not yet: still no hit.
  AppendRequest r2{2, prompt};
  plan = cache->prepare_append({&r2, 1});
  ASSERT_TRUE(plan.ok() && plan->fits());
  ASSERT_TRUE(cache->apply(*plan).ok());
  std::vector<float> kv(10 * 16, 0.25f);
  ASSERT_TRUE(cache->write_kv(2, 0, 0, 10, kv.data(), kv.data()).ok());
  EXPECT_EQ(cache->probe_prompt(prompt).hit_tokens, 0);
  ASSERT_TRUE(cache->write_kv(2, 1, 0, 10, kv.data(), kv.data()).ok());
  EXPECT_EQ(cache->probe_prompt(prompt).hit_tokens, 8);
  EXPECT_EQ(*cache->add_sequence(3, prompt), 8);
  // A metadata-only cache learns it from mark_written().
  CacheConfig c = small_config(16);
  c.host_storage = false;
  auto meta = make(c);
  ASSERT_TRUE(meta->add_sequence(1).ok());
  plan = meta->prepare_append({&r, 1});
  ASSERT_TRUE(meta->apply(*plan).ok());
  EXPECT_EQ(meta->probe_prompt(prompt).hit_tokens, 0);
  ASSERT_TRUE(meta->mark_written(1, 10).ok());
  EXPECT_FALSE(meta->mark_written(1, 11).ok());
  EXPECT_EQ(meta->probe_prompt(prompt).hit_tokens, 8);
  ASSERT_TRUE(meta->check_invariants().ok());
}

TEST(KvBlockManager, BytesInUseMatchTheFormula) {
  auto cache = make(small_config(64));
  std::map<SeqId, std::vector<int32_t>> model;
  std::mt19937 rng(5);
  int64_t tokens = 0;
  for (SeqId id = 0; id < 6; ++id) {
    ASSERT_TRUE(cache->add_sequence(id).ok());
    std::vector<int32_t> add(1 + rng() % 30);
    for (auto& t : add) t = int32_t(rng() % 1000) + int32_t(id) * 1000;  // no sharing
    ASSERT_TRUE(append(*cache, id, model[id], add));
    tokens += int64_t(add.size());
  }
  const CacheStats s = cache->stats();
  const auto& c = cache->config();
  const int64_t per_token = *token_bytes_per_layer(c.num_kv_heads, c.head_dim, format_of(c.dtype)) * c.num_layers;
  EXPECT_GE(s.bytes_in_use, tokens * per_token);
  EXPECT_LE(s.bytes_in_use, tokens * per_token + int64_t(model.size()) * s.block_bytes);
}

// The planner's per-sequence figure is what the cache really holds, for every format.
TEST(KvBlockManager, BytesInUseEqualThePlannersPagedFigure) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kI8, DType::kFp8E4M3}) {
    CacheConfig c;
    c.num_layers = 3;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.dtype = t;
    c.budget_bytes = 64 * *block_bytes(3, 2, 16, format_of(t), 16);
    c.host_storage = false;
    auto cache = make(c);
    ModelConfig m;
    m.num_layers = 3;
    m.num_heads = 4;
    m.num_kv_heads = 2;
    m.head_dim = 16;
    int64_t want = 0;
    for (int32_t id = 0; id < 5; ++id) {
      const int64_t len = 1 + 37 * id;
      std::vector<int32_t> toks(size_t(len), id);
      ASSERT_TRUE(cache->add_sequence(id).ok());
      AppendRequest r{id, toks};
      auto plan = cache->prepare_append({&r, 1});
      ASSERT_TRUE(plan.ok() && plan->fits() && cache->apply(*plan).ok());
      want += *paged_sequence_bytes(m, len, format_of(t), 16);
    }
    EXPECT_EQ(cache->stats().bytes_in_use, want) << dtype_name(t);
  }
}

// The model-based randomized test: random operations, each checked against a plain model.
void run_random_ops(uint32_t seed, int32_t groups, int steps, bool streaming = false) {
  std::mt19937 rng(seed);
  auto cache = make(small_config(40, 4, groups));
  std::map<SeqId, std::vector<int32_t>> model;
  std::map<SeqId, StreamingPolicy> policies;  // streamed sequences
  SeqId next = 0;
  // A few shared prompt stems so that prefix hits happen often.
  std::vector<std::vector<int32_t>> stems;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> s(4 + rng() % 12);
    for (auto& t : s) t = int32_t(rng() % 5);
    stems.push_back(s);
  }
  auto random_tokens = [&](size_t n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = int32_t(rng() % 5);
    return v;
  };
  auto pick = [&]() {
    auto it = model.begin();
    std::advance(it, rng() % model.size());
    return it->first;
  };
  int64_t out_of_blocks = 0, hits = 0;
  for (int step = 0; step < steps; ++step) {
    const int op = int(rng() % 10);
    if (op <= 1 || model.empty()) {  // add, with a prompt from a stem
      std::vector<int32_t> prompt = stems[rng() % stems.size()];
      auto tail = random_tokens(rng() % 9);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const SeqId id = next++;
      SeqOptions opt;
      if (streaming && rng() % 2) {
        opt.streaming = {int32_t(rng() % 6), 4 + int32_t(rng() % 12)};
        policies[id] = opt.streaming;
      }
      auto got = cache->add_sequence(id, prompt, opt);
      ASSERT_TRUE(got.ok()) << got.message();
      ASSERT_EQ(*got % 4, 0);
      ASSERT_LT(*got, int64_t(prompt.size()));
      hits += *got > 0;
      model[id] = std::vector<int32_t>(prompt.begin(), prompt.begin() + *got);
      std::vector<int32_t> rest(prompt.begin() + *got, prompt.end());
      if (!append(*cache, id, model[id], rest)) {
        ++out_of_blocks;
        ASSERT_TRUE(cache->free_sequence(id).ok());  // rejected: admission failed
        model.erase(id);
        policies.erase(id);
      }
    } else if (op <= 4) {  // append to one or several sequences at once
      std::vector<SeqId> ids;
      for (int i = 0, n = 1 + int(rng() % 3); i < n; ++i) {
        const SeqId id = pick();
        if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
      }
      std::vector<std::vector<int32_t>> adds;
      std::vector<AppendRequest> reqs;
      for (size_t i = 0; i < ids.size(); ++i) adds.push_back(random_tokens(1 + rng() % 6));
      for (size_t i = 0; i < ids.size(); ++i) reqs.push_back({ids[i], adds[i]});
      std::map<SeqId, std::vector<int32_t>> before;
      for (const auto& [id, t] : model) before[id] = cache->block_table(id);
      auto plan = cache->prepare_append(reqs);
      ASSERT_TRUE(plan.ok()) << plan.message();
      if (!plan->fits()) {
        ++out_of_blocks;
        for (const auto& [id, t] : model) ASSERT_EQ(cache->block_table(id), before[id]);
        if (rng() % 2) {  // preempt someone
          const SeqId victim = pick();
          ASSERT_TRUE(cache->free_sequence(victim).ok());
          model.erase(victim);
          policies.erase(victim);
        }
      } else {
        ASSERT_TRUE(cache->apply(*plan).ok());
        for (size_t i = 0; i < ids.size(); ++i) {
          auto& t = model[ids[i]];
          const int64_t first = int64_t(t.size());
          t.insert(t.end(), adds[i].begin(), adds[i].end());
          write_tokens(*cache, ids[i], t, first);
        }
      }
    } else if (op == 5) {  // fork
      const SeqId parent = pick(), child = next++;
      ASSERT_TRUE(cache->fork(parent, child).ok());
      model[child] = model[parent];
      if (policies.count(parent)) policies[child] = policies[parent];
    } else if (op == 6) {  // truncate (rejected speculative tokens)
      const SeqId id = pick();
      const int64_t n = int64_t(model[id].size()) - int64_t(rng() % 7);
      const int64_t evicted = cache->evicted_tokens(id);
      const int32_t sink_blocks = policies.count(id) ? (policies[id].num_sinks + 3) / 4 : 0;
      if (n >= 0 && (evicted == 0 || n >= evicted + sink_blocks * 4)) {
        ASSERT_TRUE(cache->truncate(id, n).ok());
        model[id].resize(size_t(n));
      } else {
        ASSERT_FALSE(cache->truncate(id, n).ok());
      }
    } else if (op == 7) {  // free
      const SeqId id = pick();
      ASSERT_TRUE(cache->free_sequence(id).ok());
      model.erase(id);
      policies.erase(id);
      ASSERT_FALSE(cache->free_sequence(id).ok());  // no double free
    } else {  // bad input is an error and changes nothing
      EXPECT_FALSE(cache->fork(next + 100, next + 101).ok());
      EXPECT_FALSE(cache->truncate(pick(), 1 << 20).ok());
    }
    ASSERT_NO_FATAL_FAILURE(check_accounting(*cache, model)) << "step " << step;
    ASSERT_NO_FATAL_FAILURE(check_data(*cache, model, policies)) << "step " << step;
    for (const auto& [id, pol] : policies)  // constant memory per streamed sequence
      ASSERT_LE(int64_t(cache->block_table(id).size()), (pol.num_sinks + 3) / 4 + (pol.window + 6) / 4 + 3);
  }
  if (streaming) {
    EXPECT_GT(cache->stats().streamed_releases, 0);
  }
  EXPECT_GT(out_of_blocks, 0);  // the pool was under pressure
  EXPECT_GT(hits, 0);           // and prefixes were reused
  EXPECT_GT(cache->stats().cow_copies, 0);
  for (const auto& [id, t] : model) ASSERT_TRUE(cache->free_sequence(id).ok());
  model.clear();
  check_accounting(*cache, model);
  EXPECT_EQ(cache->stats().used_blocks, 0);  // no leak
}

TEST(KvBlockManager, RandomOperationsMatchTheModel) {
  for (uint32_t seed : {1u, 2u, 3u}) run_random_ops(seed, 1, 1500);
}

TEST(KvBlockManager, RandomOperationsMatchTheModelWithTwoLayerGroups) { run_random_ops(11, 2, 1000); }

TEST(KvBlockManager, RandomOperationsMatchTheModelWithStreamedSequences) {
  for (uint32_t seed : {21u, 22u}) run_random_ops(seed, seed == 21 ? 1 : 2, 1500, true);
}

}  // namespace
}  // namespace escala::kv
