// KvCache: sequence operations (add with prefix hits, fork, truncate, free) and the two-phase
// append (prepare finds room and changes nothing; apply releases, copies on write, allocates).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "common/numeric.h"
#include "kv/cache_impl.h"
#include "kv/planner.h"

namespace escala::kv {

namespace {

Status validate_config(CacheConfig& c, int32_t& layers_per_group) {
  ESCALA_CHECK_ARG(c.num_layers >= 1, "kv cache: num_layers must be >= 1 (got {})", c.num_layers);
  ESCALA_CHECK_ARG(c.num_kv_heads >= 1, "kv cache: num_kv_heads must be >= 1 (got {})", c.num_kv_heads);
  ESCALA_CHECK_ARG(c.head_dim >= 1 && c.head_dim <= 4096, "kv cache: head_dim must be in [1, 4096] (got {})",
                   c.head_dim);
  ESCALA_CHECK_ARG(c.block_size >= 1 && c.block_size <= 4096, "kv cache: block_size must be in [1, 4096] (got {})",
                   c.block_size);
  ESCALA_CHECK_ARG(c.budget_bytes >= 0, "kv cache: budget must be >= 0 bytes");
  if (c.groups.empty()) {
    LayerGroupSpec all;
    for (int32_t l = 0; l < c.num_layers; ++l) all.layers.push_back(l);
    c.groups.push_back(std::move(all));
  }
  std::vector<int> seen(size_t(c.num_layers), 0);
  layers_per_group = int32_t(c.groups[0].layers.size());
  for (const LayerGroupSpec& g : c.groups) {
    ESCALA_CHECK_ARG(g.window >= 0, "kv cache: a group's window must be >= 0 (0 = global)");
    ESCALA_CHECK_ARG(int32_t(g.layers.size()) == layers_per_group && layers_per_group > 0,
                     "kv cache: every layer group must have the same, non-zero number of layers (split a larger "
                     "group); got {} and {}",
                     layers_per_group, g.layers.size());
    for (int32_t l : g.layers) {
      ESCALA_CHECK_ARG(l >= 0 && l < c.num_layers, "kv cache: layer {} out of range", l);
      ESCALA_CHECK_ARG(seen[size_t(l)]++ == 0, "kv cache: layer {} is in two groups", l);
    }
  }
  ESCALA_CHECK_ARG(int64_t(layers_per_group) * int64_t(c.groups.size()) == c.num_layers,
                   "kv cache: the groups must cover every layer");
  if (!c.rope_inv_freq.empty()) {
    ESCALA_CHECK_ARG(c.head_dim % 2 == 0 && int32_t(c.rope_inv_freq.size()) == c.head_dim / 2,
                     "kv cache: rope_inv_freq needs head_dim / 2 = {} entries (got {})", c.head_dim / 2,
                     c.rope_inv_freq.size());
    // RoPE applied at read time does not commute with a Hadamard rotation applied at write time.
    ESCALA_CHECK_ARG(!c.hadamard_keys, "kv cache: hadamard_keys needs keys stored after RoPE");
  }
  return {};
}

}  // namespace

void KvCache::Impl::release_range(const GroupTable& g, int64_t old_len, size_t& begin, size_t& count) const {
  begin = size_t(g.sink_blocks);
  count = 0;
  if (g.window <= 0) return;
  // The earliest query of this append sits at old_len and sees [old_len - window + 1, old_len].
  const int64_t keep_from = old_len - g.window + 1;
  if (keep_from <= 0) return;
  const int64_t first_needed = keep_from / bs;                            // true block index
  const int64_t first_resident = g.sink_blocks + g.evicted_blocks;        // first window block
  const int64_t table_window = int64_t(g.blocks.size()) - g.sink_blocks;  // blocks after the sinks
  if (first_needed > first_resident && table_window > 0)
    count = size_t(std::min(first_needed - first_resident, table_window));
}

std::vector<std::vector<int32_t>> KvCache::Impl::match_prefix(std::span<const int32_t> prompt) const {
  std::vector<std::vector<int32_t>> hits;
  if (!cfg.prefix_caching || prompt.empty()) return hits;
  const int64_t max_blocks = (int64_t(prompt.size()) - 1) / bs;
  uint64_t parent = kRootHash;
  for (int64_t i = 0; i < max_blocks; ++i) {
    auto toks = prompt.subspan(size_t(i * bs), size_t(bs));
    const uint64_t h = block_hash(parent, toks);
    std::vector<int32_t> row;
    for (int32_t g = 0; g < num_groups(); ++g) {
      auto b = pool.lookup(group_key(h, g), toks);
      if (!b) return hits;
      row.push_back(*b);
    }
    hits.push_back(std::move(row));
    parent = h;
  }
  return hits;
}

PromptProbe KvCache::probe_prompt(std::span<const int32_t> prompt) {
  Impl& m = *impl_;
  m.register_written();
  PromptProbe p;
  const auto hits = m.match_prefix(prompt);
  int64_t revived = 0;
  for (const auto& row : hits)
    for (int32_t b : row) revived += m.pool.refcount(b) == 0;
  p.hit_tokens = int64_t(hits.size()) * m.bs;
  p.blocks_needed = (Impl::ceil_div(int64_t(prompt.size()), m.bs) - int64_t(hits.size())) * m.num_groups();
  p.blocks_available = m.pool.available() - revived;
  return p;
}

const ApplyLog& KvCache::last_apply() const { return impl_->log; }

KvCache::KvCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KvCache::~KvCache() = default;

Result<std::unique_ptr<KvCache>> KvCache::create(const CacheConfig& config) {
  CacheConfig c = config;
  int32_t lpg = 0;
  ESCALA_RETURN_IF_ERROR(validate_config(c, lpg));
  // Capacity from the planner, the one KV formula (src/kv/planner.h).
  auto bb = block_bytes(lpg, c.num_kv_heads, c.head_dim, format_of(c.dtype), c.block_size);
  if (!bb.ok()) return bb.status();
  auto nb = blocks_in_budget(c.budget_bytes, *bb);
  if (!nb.ok()) return nb.status();
  ESCALA_CHECK_ARG(*nb >= 1, "kv cache: a budget of {} bytes holds no block of {} bytes", c.budget_bytes, *bb);
  ESCALA_CHECK_ARG(*nb <= std::numeric_limits<int32_t>::max(), "kv cache: {} blocks exceed the int32 page ids",
                   *nb);
  auto impl = std::make_unique<Impl>(c, int32_t(*nb), lpg);
  impl->block_bytes = *bb;
  impl->group_of.assign(size_t(c.num_layers), 0);
  impl->slot_of.assign(size_t(c.num_layers), 0);
  for (size_t g = 0; g < c.groups.size(); ++g)
    for (size_t j = 0; j < c.groups[g].layers.size(); ++j) {
      impl->group_of[size_t(c.groups[g].layers[j])] = int32_t(g);
      impl->slot_of[size_t(c.groups[g].layers[j])] = int32_t(j);
    }
  return std::unique_ptr<KvCache>(new KvCache(std::move(impl)));
}

const CacheConfig& KvCache::config() const { return impl_->cfg; }
int64_t KvCache::num_blocks() const { return impl_->pool.num_blocks(); }
bool KvCache::contains(SeqId id) const { return impl_->seqs.count(id) != 0; }
int32_t KvCache::group_of_layer(int32_t layer) const {
  return layer >= 0 && layer < impl_->cfg.num_layers ? impl_->group_of[size_t(layer)] : -1;
}

Result<int64_t> KvCache::add_sequence(SeqId id, std::span<const int32_t> prompt, const SeqOptions& options) {
  Impl& m = *impl_;
  ESCALA_CHECK_ARG(!m.seqs.count(id), "kv cache: sequence {} already exists", id);
  ESCALA_CHECK_ARG(options.streaming.window >= 0 && options.streaming.num_sinks >= 0,
                   "kv cache: streaming window and sinks must be >= 0");
  ESCALA_CHECK_ARG(options.streaming.enabled() || options.streaming.num_sinks == 0,
                   "kv cache: streaming sinks need a window");
  m.register_written();
  Sequence s;
  s.streaming = options.streaming;
  s.written.assign(size_t(m.cfg.num_layers), 0);
  for (const LayerGroupSpec& spec : m.cfg.groups) {
    GroupTable g;
    int32_t w = spec.window;
    if (s.streaming.enabled()) {
      w = w > 0 ? std::min(w, s.streaming.window) : s.streaming.window;
      g.sink_blocks = int32_t(Impl::ceil_div(s.streaming.num_sinks, m.bs));
    }
    g.window = w;
    s.groups.push_back(std::move(g));
  }
  // Prefix hits: whole blocks present in every group; at least one prompt token is left to compute.
  if (m.cfg.prefix_caching && !prompt.empty()) {
    m.query_tokens += int64_t(prompt.size());
    const auto hits = m.match_prefix(prompt);
    uint64_t parent = kRootHash;
    for (size_t i = 0; i < hits.size(); ++i) {
      for (int32_t g = 0; g < m.num_groups(); ++g) {
        m.pool.retain(hits[i][size_t(g)]);
        s.groups[size_t(g)].blocks.push_back(hits[i][size_t(g)]);
      }
      parent = block_hash(parent, prompt.subspan(i * size_t(m.bs), size_t(m.bs)));
      s.hashes.push_back(parent);
    }
    s.length = int64_t(s.hashes.size()) * m.bs;
    s.tokens.assign(prompt.begin(), prompt.begin() + s.length);
    s.pending_from = s.length;
    s.written.assign(size_t(m.cfg.num_layers), s.length);
    s.registered_blocks = int64_t(s.hashes.size());
    m.hit_tokens += s.length;
  }
  const int64_t len = s.length;
  m.seqs.emplace(id, std::move(s));
  ++m.generation;
  return len;
}

Status KvCache::fork(SeqId parent, SeqId child) {
  Impl& m = *impl_;
  m.register_written();
  auto it = m.seqs.find(parent);
  ESCALA_CHECK_ARG(it != m.seqs.end(), "kv cache: unknown sequence {}", parent);
  ESCALA_CHECK_ARG(!m.seqs.count(child), "kv cache: sequence {} already exists", child);
  Sequence s = it->second;
  for (const GroupTable& g : s.groups)
    for (int32_t b : g.blocks) m.pool.retain(b);
  m.seqs.emplace(child, std::move(s));
  ++m.generation;
  return {};
}

Status KvCache::truncate(SeqId id, int64_t num_tokens) {
  Impl& m = *impl_;
  m.register_written();
  auto it = m.seqs.find(id);
  ESCALA_CHECK_ARG(it != m.seqs.end(), "kv cache: unknown sequence {}", id);
  Sequence& s = it->second;
  ESCALA_CHECK_ARG(num_tokens >= 0 && num_tokens <= s.length, "kv cache: cannot truncate sequence {} of {} tokens to {}",
                   id, s.length, num_tokens);
  for (const GroupTable& g : s.groups)
    ESCALA_CHECK_ARG(g.evicted_blocks == 0 || num_tokens >= (g.sink_blocks + g.evicted_blocks) * m.bs,
                     "kv cache: sequence {}: tokens before {} were evicted; cannot truncate to {}", id,
                     (g.sink_blocks + g.evicted_blocks) * m.bs, num_tokens);
  const int64_t keep_blocks = Impl::ceil_div(num_tokens, m.bs);
  for (GroupTable& g : s.groups) {
    const size_t keep = size_t(keep_blocks - g.evicted_blocks);
    while (g.blocks.size() > keep) {
      m.pool.release(g.blocks.back());
      g.blocks.pop_back();
    }
    // The block is partial again and will be written: it can no longer stand for its full content.
    if (num_tokens % m.bs != 0 && !g.blocks.empty()) {
      const int32_t b = g.blocks.back();
      if (m.pool.refcount(b) == 1) m.pool.unregister(b);
    }
  }
  if (!s.streamed) {
    s.tokens.resize(size_t(num_tokens));
    s.hashes.resize(std::min(s.hashes.size(), size_t(num_tokens / m.bs)));
  }
  s.length = num_tokens;
  s.pending_from = std::min(s.pending_from, num_tokens);
  for (int64_t& w : s.written) w = std::min(w, num_tokens);
  s.registered_blocks = std::min(s.registered_blocks, num_tokens / m.bs);
  ++m.generation;
  return {};
}

Status KvCache::free_sequence(SeqId id) {
  Impl& m = *impl_;
  m.register_written();  // a finished request's last written blocks stay reusable
  auto it = m.seqs.find(id);
  ESCALA_CHECK_ARG(it != m.seqs.end(), "kv cache: unknown sequence {}", id);
  // Tail first: the LRU then recycles a sequence's last blocks before its (more shared) first ones.
  for (GroupTable& g : it->second.groups)
    for (auto b = g.blocks.rbegin(); b != g.blocks.rend(); ++b) m.pool.release(*b);
  m.seqs.erase(it);
  ++m.generation;
  return {};
}

Result<AppendPlan> KvCache::prepare_append(std::span<const AppendRequest> requests) {
  Impl& m = *impl_;
  AppendPlan plan;
  std::unordered_set<SeqId> ids;
  for (const AppendRequest& r : requests) {
    auto it = m.seqs.find(r.seq);
    ESCALA_CHECK_ARG(it != m.seqs.end(), "kv cache: unknown sequence {}", r.seq);
    ESCALA_CHECK_ARG(ids.insert(r.seq).second, "kv cache: sequence {} appears twice in one append", r.seq);
    ESCALA_CHECK_ARG(it->second.length + int64_t(r.tokens.size()) <= std::numeric_limits<int32_t>::max(),
                     "kv cache: sequence {} would exceed 2^31 tokens", r.seq);
  }
  // Simulate apply(): every release first, then copies and fresh blocks, with refcount deltas so
  // that blocks shared between requests of the batch are counted exactly.
  std::unordered_map<int32_t, int32_t> delta;
  auto ref = [&](int32_t b) { return m.pool.refcount(b) + delta[b]; };
  int64_t freed = 0, needed = 0;
  for (const AppendRequest& r : requests) {
    const Sequence& s = m.seqs.at(r.seq);
    for (const GroupTable& g : s.groups) {
      size_t begin, count;
      m.release_range(g, s.length, begin, count);
      for (size_t i = begin; i < begin + count; ++i) {
        if (ref(g.blocks[i]) == 1) ++freed;
        --delta[g.blocks[i]];
      }
    }
  }
  for (const AppendRequest& r : requests) {
    const Sequence& s = m.seqs.at(r.seq);
    const int64_t n = int64_t(r.tokens.size());
    if (n == 0) continue;
    for (const GroupTable& g : s.groups) {
      if (s.length % m.bs != 0 && ref(g.blocks.back()) > 1) {
        ++needed;
        --delta[g.blocks.back()];
      }
      needed += Impl::ceil_div(s.length + n, m.bs) - Impl::ceil_div(s.length, m.bs);
    }
  }
  plan.blocks_available = m.pool.available();
  plan.blocks_needed = needed - freed;
  plan.blocks_short = std::max<int64_t>(0, plan.blocks_needed - plan.blocks_available);
  plan.requests.assign(requests.begin(), requests.end());
  plan.generation = m.generation;
  return plan;
}

Status KvCache::apply(const AppendPlan& plan) {
  Impl& m = *impl_;
  ESCALA_CHECK_ARG(plan.generation == m.generation, "kv cache: stale append plan (the cache changed since prepare)");
  ESCALA_CHECK_ARG(plan.fits(), "kv cache: out of blocks ({} short); nothing was changed", plan.blocks_short);
  m.register_written();
  m.log.copies.clear();
  m.log.fresh_blocks.clear();
  // Phase 1: releases by the streaming / window policies.
  for (const AppendRequest& r : plan.requests) {
    Sequence& s = m.seqs.at(r.seq);
    for (GroupTable& g : s.groups) {
      size_t begin, count;
      m.release_range(g, s.length, begin, count);
      if (count == 0) continue;
      for (size_t i = begin + count; i-- > begin;) m.pool.release(g.blocks[i]);
      g.blocks.erase(g.blocks.begin() + ptrdiff_t(begin), g.blocks.begin() + ptrdiff_t(begin + count));
      g.evicted_blocks += int64_t(count);
      m.stream_releases += int64_t(count);
      if (s.streaming.enabled() && !s.streamed) {
        // Later K/V depend on what was dropped: never share them through the prefix cache.
        s.streamed = true;
        s.tokens = {};
        s.hashes = {};
      }
    }
  }
  // Phase 2: copy-on-write of shared partial blocks, then fresh blocks.
  for (const AppendRequest& r : plan.requests) {
    Sequence& s = m.seqs.at(r.seq);
    const int64_t n = int64_t(r.tokens.size());
    const int64_t old_len = s.length;
    if (n == 0) continue;
    for (GroupTable& g : s.groups) {
      if (old_len % m.bs != 0) {
        int32_t& last = g.blocks.back();
        if (m.pool.refcount(last) > 1) {
          auto nb = m.pool.allocate();
          if (!nb) return Status::error("kv cache: internal error: planned block missing (copy on write)");
          m.storage.copy_block(last, *nb, int32_t(old_len % m.bs));
          m.log.copies.push_back({last, *nb, int32_t(old_len % m.bs)});
          m.pool.release(last);
          last = *nb;
          ++m.cow_copies;
        } else {
          m.pool.unregister(last);  // sole owner of a partial cached block: it is rewritten now
        }
      }
      const int64_t add = Impl::ceil_div(old_len + n, m.bs) - Impl::ceil_div(old_len, m.bs);
      for (int64_t i = 0; i < add; ++i) {
        auto nb = m.pool.allocate();
        if (!nb) return Status::error("kv cache: internal error: planned block missing");
        m.storage.reset_block(*nb);
        m.log.fresh_blocks.push_back(*nb);
        g.blocks.push_back(*nb);
      }
    }
    s.length = old_len + n;
    s.pending_from = old_len;
    if (!s.streamed) {
      s.tokens.insert(s.tokens.end(), r.tokens.begin(), r.tokens.end());
      if (m.cfg.prefix_caching) {
        // Hash newly full blocks; they join the prefix cache once written (register_written).
        while (int64_t(s.hashes.size()) < s.length / m.bs) {
          const size_t i = s.hashes.size();
          auto toks = std::span<const int32_t>(s.tokens).subspan(i * size_t(m.bs), size_t(m.bs));
          s.hashes.push_back(block_hash(i == 0 ? kRootHash : s.hashes[i - 1], toks));
        }
      }
    }
  }
  ++m.generation;
  return {};
}

Status KvCache::write_kv(SeqId seq, int32_t layer, int64_t first, int64_t n, const float* k, const float* v) {
  Impl& m = *impl_;
  auto it = m.seqs.find(seq);
  ESCALA_CHECK_ARG(it != m.seqs.end(), "kv cache: unknown sequence {}", seq);
  ESCALA_CHECK_ARG(layer >= 0 && layer < m.cfg.num_layers, "kv cache: layer {} out of range", layer);
  ESCALA_CHECK_ARG(k && v, "kv cache: write_kv needs k and v");
  ESCALA_CHECK_ARG(m.storage.allocated(), "kv cache: no host storage (host_storage = false)");
  const Sequence& s = it->second;
  ESCALA_CHECK_ARG(n >= 0 && first >= s.pending_from && first + n <= s.length,
                   "kv cache: sequence {}: tokens [{}, {}) are not the ones appended last ([{}, {}))", seq, first,
                   first + n, s.pending_from, s.length);
  const GroupTable& g = s.groups[size_t(m.group_of[size_t(layer)])];
  const int32_t j = m.slot_of[size_t(layer)];
  const int64_t row = int64_t(m.cfg.num_kv_heads) * m.cfg.head_dim;
  // A NaN or infinity would poison a whole block's scale (fp8) or quantize to garbage: refuse it.
  if (!all_finite(k, n * row) || !all_finite(v, n * row)) {
    int64_t i = 0;
    while (std::isfinite(k[i]) && std::isfinite(v[i])) ++i;
    return Status::error(
        fmt::format("kv cache: non-finite K/V for sequence {}, layer {}, token {}", seq, layer, first + i / row));
  }
  for (int64_t t = first; t < first + n; ++t) {
    if (!m.resident(g, t)) continue;  // a sliding-window group may have released it already
    m.storage.write(j, m.block_of(g, t), int32_t(t % m.bs), k + (t - first) * row, v + (t - first) * row);
  }
  // Only this layer's entry: concurrent writes of other layers touch other entries.
  int64_t& w = it->second.written[size_t(layer)];
  if (first <= w) w = std::max(w, first + n);
  return {};
}

Status KvCache::mark_written(SeqId seq, int64_t upto) {
  Impl& m = *impl_;
  auto it = m.seqs.find(seq);
  ESCALA_CHECK_ARG(it != m.seqs.end(), "kv cache: unknown sequence {}", seq);
  Sequence& s = it->second;
  ESCALA_CHECK_ARG(upto >= 0 && upto <= s.length, "kv cache: sequence {} has {} tokens, not {}", seq, s.length, upto);
  for (int64_t& w : s.written) w = std::max(w, upto);
  return {};
}

void KvCache::Impl::register_written() {
  if (!cfg.prefix_caching) return;
  for (auto& [id, s] : seqs) {
    if (s.streamed || s.registered_blocks >= int64_t(s.hashes.size())) continue;
    const int64_t done = *std::min_element(s.written.begin(), s.written.end());
    const int64_t full = std::min<int64_t>(done / bs, int64_t(s.hashes.size()));
    for (int64_t i = s.registered_blocks; i < full; ++i) {
      auto toks = std::span<const int32_t>(s.tokens).subspan(size_t(i * bs), size_t(bs));
      for (int32_t gi = 0; gi < num_groups(); ++gi) {
        const GroupTable& g = s.groups[size_t(gi)];
        if (resident(g, i * bs)) pool.register_block(block_of(g, i * bs), group_key(s.hashes[size_t(i)], gi), toks);
      }
    }
    s.registered_blocks = std::max(s.registered_blocks, full);
  }
}

int64_t KvCache::num_tokens(SeqId id) const {
  auto it = impl_->seqs.find(id);
  return it == impl_->seqs.end() ? -1 : it->second.length;
}

int64_t KvCache::evicted_tokens(SeqId id, int32_t group) const {
  auto it = impl_->seqs.find(id);
  if (it == impl_->seqs.end() || group < 0 || group >= impl_->num_groups()) return -1;
  return it->second.groups[size_t(group)].evicted_blocks * impl_->bs;
}

int64_t KvCache::query_position(SeqId id, int64_t pos, int32_t group) const {
  auto it = impl_->seqs.find(id);
  if (it == impl_->seqs.end() || group < 0 || group >= impl_->num_groups()) return -1;
  const GroupTable& g = it->second.groups[size_t(group)];
  return pos < int64_t(g.sink_blocks) * impl_->bs ? pos : pos - g.evicted_blocks * impl_->bs;
}

}  // namespace escala::kv
