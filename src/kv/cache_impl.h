// KvCache's state, shared by the files that implement it (operations, views, statistics).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "escala/kv_cache.h"
#include "kv/block_pool.h"
#include "kv/kv_storage.h"

namespace escala::kv {

// One sequence's block table in one layer group. With E = evicted_blocks > 0 the table holds
// true blocks [0, sink_blocks) then [sink_blocks + E, ...): true block = idx < sink_blocks ? idx
// : idx + E.
struct GroupTable {
  std::vector<int32_t> blocks;
  int64_t evicted_blocks = 0;
  int32_t sink_blocks = 0;  // leading blocks the policy never releases
  int32_t window = 0;       // tokens each query sees (itself included); 0 = nothing released
};

struct Sequence {
  int64_t length = 0;             // tokens appended (true positions 0 .. length-1)
  std::vector<int32_t> tokens;    // token ids, while the sequence can still feed the prefix cache
  std::vector<uint64_t> hashes;   // chain hash of each full block (same condition)
  bool streamed = false;          // StreamingLLM released something: later blocks are not cacheable
  int64_t pending_from = 0;       // write_kv may fill tokens [pending_from, length)
  std::vector<int64_t> written;   // per layer: K/V written for tokens [0, written[l])
  int64_t registered_blocks = 0;  // full blocks [0, this) offered to the prefix cache
  StreamingPolicy streaming;
  std::vector<GroupTable> groups;
};

struct KvCache::Impl {
  CacheConfig cfg;
  int32_t bs = 16;
  int32_t layers_per_group = 0;
  std::vector<int32_t> group_of;  // per model layer
  std::vector<int32_t> slot_of;   // per model layer: storage layer j within its group
  int64_t block_bytes = 0;        // the planner's figure for one block of one group
  BlockPool pool;
  KvStorage storage;
  std::unordered_map<SeqId, Sequence> seqs;
  uint64_t generation = 0;
  ApplyLog log;
  int64_t query_tokens = 0, hit_tokens = 0, cow_copies = 0, stream_releases = 0;

  Impl(const CacheConfig& c, int32_t num_blocks, int32_t lpg)
      : cfg(c),
        bs(c.block_size),
        layers_per_group(lpg),
        pool(num_blocks),
        storage(c.host_storage ? lpg : 0, num_blocks, c.block_size, c.num_kv_heads, c.head_dim, c.dtype,
                c.hadamard_keys) {}

  int32_t num_groups() const { return int32_t(cfg.groups.size()); }
  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
  // Block of the group's table holding true token t (which must be resident).
  int32_t block_of(const GroupTable& g, int64_t t) const {
    const int64_t tb = t / bs;
    return g.blocks[size_t(tb < g.sink_blocks ? tb : tb - g.evicted_blocks)];
  }
  bool resident(const GroupTable& g, int64_t t) const {
    const int64_t tb = t / bs;
    return tb < g.sink_blocks || tb >= g.sink_blocks + g.evicted_blocks;
  }
  // Table indices [begin, begin + count) that the policy releases before appending at old_len.
  void release_range(const GroupTable& g, int64_t old_len, size_t& begin, size_t& count) const;
  // Offers the prefix cache every full block whose K/V are written in all layers. Runs at the start
  // of each metadata operation (not in write_kv, which may run concurrently for several layers).
  void register_written();
  // Leading full prompt blocks present in every group (at most prompt.size() - 1 tokens).
  std::vector<std::vector<int32_t>> match_prefix(std::span<const int32_t> prompt) const;
  uint64_t group_key(uint64_t hash, int32_t group) const {
    const int32_t g[1] = {group};
    return block_hash(hash, g);
  }
};

}  // namespace escala::kv
