// The block pool: metadata only (TensorRT-LLM style). Each block has an exact reference count; an
// unreferenced block is either free or, when it holds a full prefix-cache block, "cached" on an LRU
// list from which it is recycled only when the free list is empty.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace escala::kv {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return int32_t(blocks_.size()); }
  int64_t num_free() const { return int64_t(free_.size()); }       // never-cached free blocks
  int64_t num_cached() const { return int64_t(lru_.size()); }      // unreferenced, hashed
  int64_t available() const { return num_free() + num_cached(); }  // what allocate() can hand out
  int32_t refcount(int32_t b) const { return blocks_[b].ref; }
  bool is_registered(int32_t b) const { return blocks_[b].registered; }
  int64_t evictions() const { return evictions_; }

  // A block with refcount 1: from the free list, else the least recently used cached block (its
  // prefix-cache entry is dropped). nullopt when neither has one.
  std::optional<int32_t> allocate();
  void retain(int32_t b);   // refcount + 1; a cached block leaves the LRU list
  void release(int32_t b);  // refcount - 1; at 0 a registered block goes to the LRU tail

  // Prefix cache: full blocks keyed by (chain hash); tokens are compared too, so a hash collision
  // is a miss, not a wrong hit.
  std::optional<int32_t> lookup(uint64_t key, std::span<const int32_t> tokens) const;
  // Registers a referenced full block; a no-op when the key is already taken (another block holds
  // the same content; this one stays private).
  void register_block(int32_t b, uint64_t key, std::span<const int32_t> tokens);
  void unregister(int32_t b);

  // Internal consistency (free list, LRU, map) given the expected refcount of every block.
  bool check(std::span<const int32_t> expected_refs, std::string* why) const;

 private:
  struct Block {
    int32_t ref = 0;
    bool registered = false;
    bool in_lru = false;
    uint64_t key = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator lru_it;
  };
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;  // stack: the last freed block is reused first (warm memory)
  std::list<int32_t> lru_;     // front = least recently used
  std::unordered_map<uint64_t, int32_t> map_;
  int64_t evictions_ = 0;
};

// Chain hash of a full block: parent's hash and the block's token ids (splitmix64 mixing).
uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens);
constexpr uint64_t kRootHash = 0x6a09e667f3bcc908ull;

}  // namespace escala::kv
