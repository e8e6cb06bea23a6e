#include "kv/block_pool.h"

#include <algorithm>
#include <string>

namespace escala::kv {

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent ^ 0x243f6a8885a308d3ull);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

BlockPool::BlockPool(int32_t num_blocks) : blocks_(size_t(num_blocks)) {
  free_.reserve(size_t(num_blocks));
  // Hand out low ids first.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> BlockPool::allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();
    lru_.pop_front();
    blocks_[b].in_lru = false;
    unregister(b);
    ++evictions_;
  } else {
    return std::nullopt;
  }
  blocks_[b].ref = 1;
  return b;
}

void BlockPool::retain(int32_t b) {
  Block& blk = blocks_[b];
  if (blk.in_lru) {
    lru_.erase(blk.lru_it);
    blk.in_lru = false;
  }
  ++blk.ref;
}

void BlockPool::release(int32_t b) {
  Block& blk = blocks_[b];
  if (--blk.ref > 0) return;
  if (blk.registered) {
    blk.lru_it = lru_.insert(lru_.end(), b);
    blk.in_lru = true;
  } else {
    free_.push_back(b);
  }
}

std::optional<int32_t> BlockPool::lookup(uint64_t key, std::span<const int32_t> tokens) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  const auto& t = blocks_[it->second].tokens;
  if (!std::equal(t.begin(), t.end(), tokens.begin(), tokens.end())) return std::nullopt;
  return it->second;
}

void BlockPool::register_block(int32_t b, uint64_t key, std::span<const int32_t> tokens) {
  Block& blk = blocks_[b];
  if (blk.registered || map_.count(key)) return;
  blk.registered = true;
  blk.key = key;
  blk.tokens.assign(tokens.begin(), tokens.end());
  map_.emplace(key, b);
}

void BlockPool::unregister(int32_t b) {
  Block& blk = blocks_[b];
  if (!blk.registered) return;
  map_.erase(blk.key);
  blk.registered = false;
  blk.tokens.clear();
  if (blk.in_lru) {  // unreferenced and no longer cacheable: plain free
    lru_.erase(blk.lru_it);
    blk.in_lru = false;
    free_.push_back(b);
  }
}

bool BlockPool::check(std::span<const int32_t> expected_refs, std::string* why) const {
  auto fail = [&](std::string m) {
    if (why) *why = std::move(m);
    return false;
  };
  std::vector<int> seen(blocks_.size(), 0);
  for (int32_t b : free_) {
    if (seen[b]++) return fail("block " + std::to_string(b) + " twice on the free list");
    if (blocks_[b].ref != 0 || blocks_[b].registered) return fail("free block " + std::to_string(b) + " in use");
  }
  for (int32_t b : lru_) {
    if (seen[b]++) return fail("block " + std::to_string(b) + " both free and cached");
    if (blocks_[b].ref != 0 || !blocks_[b].registered || !blocks_[b].in_lru)
      return fail("cached block " + std::to_string(b) + " inconsistent");
  }
  size_t registered = 0;
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref != expected_refs[b])
      return fail("block " + std::to_string(b) + " refcount " + std::to_string(blk.ref) + ", tables hold " +
                  std::to_string(expected_refs[b]));
    if (blk.ref == 0 && !seen[b]) return fail("block " + std::to_string(b) + " leaked");
    if (blk.ref > 0 && seen[b]) return fail("block " + std::to_string(b) + " referenced but listed free");
    if (blk.registered) {
      ++registered;
      auto it = map_.find(blk.key);
      if (it == map_.end() || it->second != int32_t(b)) return fail("registered block " + std::to_string(b) + " not in map");
    }
  }
  if (registered != map_.size()) return fail("prefix map holds stale entries");
  return true;
}

}  // namespace escala::kv
