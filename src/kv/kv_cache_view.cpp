// KvCache: the attention-ready view of a batch (page CSR per layer group, pointers, strides,
// scales), statistics and the invariant check used by the tests.
#include <fmt/format.h>

#include <algorithm>

#include "kv/cache_impl.h"

namespace escala::kv {

Result<KvBatch> KvCache::batch(std::span<const SeqId> seqs) const {
  const Impl& m = *impl_;
  KvBatch out;
  out.seqs.assign(seqs.begin(), seqs.end());
  const size_t ng = size_t(m.num_groups());
  out.cu_seqlens_k.assign(ng, {0});
  out.page_indptr.assign(ng, {0});
  out.page_indices.assign(ng, {});
  for (SeqId id : seqs) {
    auto it = m.seqs.find(id);
    ESCALA_CHECK_ARG(it != m.seqs.end(), "kv cache: unknown sequence {}", id);
    for (size_t g = 0; g < ng; ++g) {
      const GroupTable& t = it->second.groups[g];
      const int64_t resident = it->second.length - t.evicted_blocks * m.bs;
      out.cu_seqlens_k[g].push_back(out.cu_seqlens_k[g].back() + int32_t(resident));
      out.page_indices[g].insert(out.page_indices[g].end(), t.blocks.begin(), t.blocks.end());
      out.page_indptr[g].push_back(int32_t(out.page_indices[g].size()));
    }
  }
  return out;
}

Status KvCache::bind(const KvBatch& b, int32_t layer, attn::AttentionParams& p) const {
  const Impl& m = *impl_;
  ESCALA_CHECK_ARG(layer >= 0 && layer < m.cfg.num_layers, "kv cache: layer {} out of range", layer);
  const int32_t g = m.group_of[size_t(layer)], j = m.slot_of[size_t(layer)];
  ESCALA_CHECK_ARG(size_t(g) < b.page_indptr.size() && b.page_indptr[size_t(g)].size() == b.seqs.size() + 1,
                   "kv cache: batch was not built by this cache");
  const int64_t d = m.cfg.head_dim;
  p.k = m.storage.k(j);
  p.v = m.storage.v(j);
  p.kv_dtype = m.cfg.dtype;
  p.num_kv_heads = m.cfg.num_kv_heads;
  p.head_dim = int32_t(d);
  p.head_dim_v = int32_t(d);
  p.k_head_stride = p.v_head_stride = d;
  p.k_row_stride = p.v_row_stride = m.storage.row_elems();
  p.k_page_stride = p.v_page_stride = m.storage.page_elems();
  p.page_size = m.bs;
  p.batch = int32_t(b.seqs.size());
  p.cu_seqlens_k = b.cu_seqlens_k[size_t(g)].data();
  p.page_indptr = b.page_indptr[size_t(g)].data();
  p.page_indices = b.page_indices[size_t(g)].data();
  p.k_scale = m.storage.k_scale(j);
  p.v_scale = m.storage.v_scale(j);
  p.rope_inv_freq = m.cfg.rope_inv_freq.empty() ? nullptr : m.cfg.rope_inv_freq.data();
  p.rope_neox = m.cfg.rope_neox;
  return {};
}

void KvCache::rotate_queries(float* q, int64_t rows) const {
  if (impl_->cfg.hadamard_keys) hadamard_rotate(q, rows, impl_->cfg.head_dim);
}

CacheStats KvCache::stats() const {
  const Impl& m = *impl_;
  CacheStats s;
  s.total_blocks = m.pool.num_blocks();
  s.free_blocks = m.pool.available();
  s.cached_blocks = m.pool.num_cached();
  s.used_blocks = s.total_blocks - s.free_blocks;
  s.block_bytes = m.block_bytes;
  s.bytes_total = s.total_blocks * m.block_bytes;
  s.bytes_in_use = s.used_blocks * m.block_bytes;
  s.sequences = int64_t(m.seqs.size());
  s.prefix_query_tokens = m.query_tokens;
  s.prefix_hit_tokens = m.hit_tokens;
  s.hit_rate = m.query_tokens > 0 ? double(m.hit_tokens) / double(m.query_tokens) : 0.0;
  s.cache_evictions = m.pool.evictions();
  s.cow_copies = m.cow_copies;
  s.streamed_releases = m.stream_releases;
  return s;
}

std::vector<int32_t> KvCache::block_table(SeqId id, int32_t group) const {
  auto it = impl_->seqs.find(id);
  if (it == impl_->seqs.end() || group < 0 || group >= impl_->num_groups()) return {};
  return it->second.groups[size_t(group)].blocks;
}

int32_t KvCache::block_refcount(int32_t block) const {
  return block >= 0 && block < impl_->pool.num_blocks() ? impl_->pool.refcount(block) : -1;
}

Status KvCache::check_invariants() const {
  const Impl& m = *impl_;
  std::vector<int32_t> refs(size_t(m.pool.num_blocks()), 0);
  for (const auto& [id, s] : m.seqs) {
    for (const GroupTable& g : s.groups) {
      const int64_t want = Impl::ceil_div(s.length, m.bs) - g.evicted_blocks;
      ESCALA_CHECK_ARG(int64_t(g.blocks.size()) == want, "kv cache: sequence {} has {} blocks for {} tokens", id,
                       g.blocks.size(), s.length);
      std::vector<int32_t> sorted = g.blocks;
      std::sort(sorted.begin(), sorted.end());
      ESCALA_CHECK_ARG(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
                       "kv cache: sequence {} holds a block twice", id);
      for (int32_t b : g.blocks) ++refs[size_t(b)];
    }
    ESCALA_CHECK_ARG(s.streamed || int64_t(s.tokens.size()) == s.length, "kv cache: sequence {} token count", id);
  }
  std::string why;
  ESCALA_CHECK_ARG(m.pool.check(refs, &why), "kv cache: {}", why);
  return {};
}

}  // namespace escala::kv
