// The paged KV cache: a pool of fixed-size blocks carved from one byte budget, per-sequence block
// tables (one per layer group), fork with copy-on-write, truncate, automatic prefix caching, a
// StreamingLLM eviction policy, and quantized storage (bf16/f16/f32, int8, fp8 e4m3) with an
// optional Hadamard rotation of the keys. Its pages are exactly the paged layout of attention.h,
// so bind() turns a batch of sequences into AttentionParams that every kernel reads unchanged.
//
// A step of the engine (prepare, then apply; llama.cpp's memory context):
//   auto plan = cache.prepare_append({{seq, new_tokens}, ...});  // finds room, changes nothing
//   if (!plan->fits()) -> wait / preempt / reject (plan->blocks_short says by how much)
//   cache.apply(*plan);                                          // allocates, copies on write
//   for each layer: cache.write_kv(seq, layer, k, v)             // quantizes (and rotates K)
//   auto batch = cache.batch({seqs...}); cache.bind(*batch, layer, params); attn::attention(params)
//
// Layer groups: layers whose block tables are the same (Gemma-2's local and global layers are two
// groups). All groups must have the same number of layers: a block id names the same storage slot
// in every group's layers, so one pool serves all groups (split a larger group in two if needed).
// A group may have a sliding window: its blocks wholly before every future query's window are
// released as the sequence grows.
//
// Streamed sequences (StreamingLLM): the first num_sinks tokens and the most recent `window` tokens
// are kept; whole blocks in between are released. A sequence's page list is then
//   [sink blocks: ceil(num_sinks / block_size) of them][window blocks, oldest first]
// and the cache coordinates of its tokens are their index in that list (kv_len = resident tokens).
// Releasing whole blocks shifts later tokens by a multiple of block_size: cache position = token
// position - evicted_tokens. The attention that reproduces StreamingLLM over this view uses
// causal + num_sinks = n_sink + window_left = window - 1 in cache coordinates: the extra tokens that
// share a sink block and the stale head of the first window block are masked by it. With keys stored
// before RoPE (CacheConfig::rope_inv_freq set) the kernels rotate key j by its cache position j, and
// queries must be rotated by their cache position (query_position()); keys stored after RoPE carry
// their true positions and queries are rotated by the true position. See docs/ARCHITECTURE.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "escala/attention.h"
#include "escala/dtype.h"
#include "escala/status.h"

namespace escala::kv {

using SeqId = int64_t;

struct LayerGroupSpec {
  std::vector<int32_t> layers;  // model layer indices
  int32_t window = 0;           // sliding window (tokens a query sees, itself included); 0 = global
};

struct CacheConfig {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // K and V
  DType dtype = DType::kBF16;
  int32_t block_size = 16;
  int64_t budget_bytes = 0;        // the pool's capacity is planned from this (src/kv/planner.h)
  std::vector<LayerGroupSpec> groups;  // empty: one group holding every layer
  bool prefix_caching = true;
  bool hadamard_keys = false;  // rotate K on write; queries need rotate_queries()
  // Keys stored before RoPE: the attention path rotates them at read time by cache position.
  std::vector<float> rope_inv_freq;  // [head_dim / 2]; empty = keys stored after RoPE
  bool rope_neox = false;
  // false: metadata only (block tables, refcounts, prefix cache), no host pools. For a device pool
  // driven by the same manager: it replays last_apply() and writes K/V itself; write_kv() is then
  // an error and bind() leaves the K/V and scale pointers null for the caller to fill.
  bool host_storage = true;
};

// StreamingLLM for one sequence: keep the first num_sinks tokens and the most recent window.
struct StreamingPolicy {
  int32_t num_sinks = 0;
  int32_t window = 0;  // 0 = off
  bool enabled() const { return window > 0; }
};

struct SeqOptions {
  StreamingPolicy streaming;
};

struct AppendRequest {
  SeqId seq = 0;
  std::span<const int32_t> tokens;  // token ids of the new tokens (prefix-cache keys)
};

// The result of prepare_append(): whether the batch fits, and what apply() will do.
struct AppendPlan {
  int64_t blocks_needed = 0;     // fresh blocks (new + copy-on-write) minus blocks released first
  int64_t blocks_available = 0;  // free + evictable cached blocks at prepare time
  int64_t blocks_short = 0;      // > 0: does not fit; nothing was changed
  bool fits() const { return blocks_short == 0; }

  std::vector<AppendRequest> requests;
  uint64_t generation = 0;  // apply() refuses a plan made before another mutation
};

// What the last apply() did to block contents, for a pool that lives elsewhere (device memory).
struct BlockCopy {
  int32_t src = 0, dst = 0;
  int32_t tokens = 0;  // filled slots copied (K, V and scales of every layer of the group)
};
struct ApplyLog {
  std::vector<BlockCopy> copies;      // copy-on-write, in order
  std::vector<int32_t> fresh_blocks;  // newly allocated (fp8 block scales start at 0)
};

// Admission estimate for a new request (nothing changes): prefix hits and the blocks its whole
// prompt would still need. Conservative: sliding-window / streaming releases are not counted.
struct PromptProbe {
  int64_t hit_tokens = 0;        // what add_sequence() would attach
  int64_t blocks_needed = 0;     // fresh blocks for the rest of the prompt, all groups
  int64_t blocks_available = 0;  // available now, less the cached hit blocks it would revive
  bool fits() const { return blocks_needed <= blocks_available; }
};

struct CacheStats {
  int64_t total_blocks = 0;
  int64_t used_blocks = 0;    // referenced by at least one sequence
  int64_t free_blocks = 0;    // not referenced (includes cached_blocks)
  int64_t cached_blocks = 0;  // not referenced, kept for prefix hits, evicted LRU when room is needed
  int64_t block_bytes = 0;    // one block, all layers, K and V, scales included (the planner's figure)
  int64_t bytes_total = 0;
  int64_t bytes_in_use = 0;   // used_blocks * block_bytes
  int64_t sequences = 0;
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;    // of which served from cached blocks
  double hit_rate = 0.0;            // prefix_hit_tokens / prefix_query_tokens
  int64_t cache_evictions = 0;      // cached blocks recycled for room
  int64_t cow_copies = 0;
  int64_t streamed_releases = 0;    // blocks released by streaming / sliding-window policies
};

// Block tables of a batch of sequences in CSR form, one per layer group (the attention page list).
struct KvBatch {
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> cu_seqlens_k;  // [group][batch + 1], resident tokens
  std::vector<std::vector<int32_t>> page_indptr;   // [group][batch + 1]
  std::vector<std::vector<int32_t>> page_indices;  // [group][...]
};

// Not thread-safe: one thread (the engine step) calls everything but write_kv and the const
// methods. write_kv calls for different layers, or for sequences that share no pending block, may
// run concurrently: they only touch their own token slots.
class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(const CacheConfig& config);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const CacheConfig& config() const;
  int64_t num_blocks() const;

  // A new, empty sequence. With a prompt, leading full blocks found in the prefix cache are attached
  // (at most prompt.size() - 1 tokens, so that one token is always left to compute). Returns the
  // number of prompt tokens now resident; the caller appends the rest.
  Result<int64_t> add_sequence(SeqId id, std::span<const int32_t> prompt = {}, const SeqOptions& options = {});
  PromptProbe probe_prompt(std::span<const int32_t> prompt);
  // A new sequence sharing every block of `parent` (copy on the first write to a shared block).
  Status fork(SeqId parent, SeqId child);
  // Keeps the first num_tokens tokens (rejected speculative tokens).
  Status truncate(SeqId id, int64_t num_tokens);
  Status free_sequence(SeqId id);
  bool contains(SeqId id) const;

  // Finds room for the batch; changes nothing. An error only for bad input (unknown sequence, ...).
  Result<AppendPlan> prepare_append(std::span<const AppendRequest> requests);
  // Releases what the streaming / window policies allow, allocates, copies shared partial blocks,
  // extends the tables. Fails only if the plan is stale or did not fit (nothing changed then).
  Status apply(const AppendPlan& plan);
  const ApplyLog& last_apply() const;
  // Writes K and V of tokens [first, first + n) of `seq` (their true positions; slots must have been
  // allocated by apply) for one layer, as f32 rows [n, num_kv_heads, head_dim]. Quantizes, and
  // rotates K when hadamard_keys is set.
  Status write_kv(SeqId seq, int32_t layer, int64_t first, int64_t n, const float* k, const float* v);
  // A full block joins the prefix cache only once its K/V are written in every layer (so a request
  // cancelled between apply and its forward pass never leaves unwritten blocks to be hit). write_kv
  // records that per layer; a cache whose pool lives elsewhere (host_storage = false) says it here
  // after its device writes: tokens [0, upto) of `seq` are written in every layer.
  Status mark_written(SeqId seq, int64_t upto);

  int64_t num_tokens(SeqId id) const;  // tokens appended (true length), -1 if unknown
  // Tokens released from the middle of the sequence by the streaming / window policy of a group.
  int64_t evicted_tokens(SeqId id, int32_t group = 0) const;
  // Cache position of the token at true position `pos` (where a pre-RoPE query is rotated):
  // pos - evicted_tokens once pos is past the sink blocks.
  int64_t query_position(SeqId id, int64_t pos, int32_t group = 0) const;
  int32_t group_of_layer(int32_t layer) const;

  // The batch's block tables; bind() fills the K/V fields of params (pointers, dtype, strides,
  // page table, scales, rope) for one layer; q, o, cu_seqlens_q and the mask are the caller's.
  Result<KvBatch> batch(std::span<const SeqId> seqs) const;
  Status bind(const KvBatch& batch, int32_t layer, attn::AttentionParams& params) const;
  // Rotates query rows [rows, head_dim] like the keys (no-op unless hadamard_keys).
  void rotate_queries(float* q, int64_t rows) const;

  CacheStats stats() const;

  // Introspection for tests and metrics.
  std::vector<int32_t> block_table(SeqId id, int32_t group = 0) const;
  int32_t block_refcount(int32_t block) const;
  Status check_invariants() const;  // refcounts == table references, lists disjoint, no leak

 private:
  struct Impl;
  explicit KvCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Normalized fast Walsh-Hadamard transform of each row of x [rows, d], in place. Orthogonal and
// its own inverse, so (Hq).(Hk) = q.k. For d not a power of two the transform is block-diagonal over
// the power-of-two parts of d (96 = 64 + 32): still orthogonal, but it spreads an outlier only
// within its part.
void hadamard_rotate(float* x, int64_t rows, int32_t d);

}  // namespace escala::kv
