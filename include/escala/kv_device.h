// The paged KV pool in device memory, driven by the same block manager as the host cache: a KvCache
// made with host_storage = false keeps the block tables, refcounts and prefix cache; this pool holds
// the K/V bytes (and scales) with exactly the host layout (kv_storage.h), replays each apply()
// (copy-on-write, fresh fp8 blocks) and writes new tokens, quantizing (and rotating K) on the
// device with the host's encoders, so both pools hold the same bits for the same input.
// All calls are asynchronous on `stream` (a cudaStream_t as void*). Needs a CUDA build.
#pragma once

#include <cstdint>
#include <memory>

#include "escala/attention.h"
#include "escala/kv_cache.h"
#include "escala/status.h"

namespace escala::kv {

class DevicePool {
 public:
  // Pools for a cache made with `config` holding `num_blocks` blocks (KvCache::num_blocks()).
  static Result<std::unique_ptr<DevicePool>> create(const CacheConfig& config, int64_t num_blocks);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // Replays KvCache::last_apply(): copy-on-write copies, then zeroed fp8 scales of fresh blocks.
  Status apply(const ApplyLog& log, void* stream);
  // Writes n tokens of one layer: k, v are device f32 [n, num_kv_heads, head_dim]; slots (device
  // int32 [n]) are block * block_size + slot in block, ascending within each block. Quantizes, and
  // rotates K when hadamard_keys is set.
  Status write(int32_t layer, const float* k, const float* v, const int32_t* slots, int32_t n, void* stream);
  // Fills the K/V fields of params for one layer (device pointers, dtype, strides, scales); the
  // page table comes from KvCache::batch() (uploaded by the caller).
  Status bind(int32_t layer, attn::AttentionParams& params) const;

  // Storage of one layer (tests): K or V pool and its scales.
  const void* data(int32_t layer, bool is_v) const;
  const float* scales(int32_t layer, bool is_v) const;
  int64_t pool_bytes() const;   // one of K or V, one storage layer
  int64_t scale_count() const;  // floats of one scale array

 private:
  struct Impl;
  explicit DevicePool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace escala::kv
