// Decode through the KV cache's own pages: one query token, GQA 32/8, d 128, T tokens, K/V written
// by KvCache into a fragmented pool (block ids in random order), next to the same K/V contiguous;
// bf16, int8 and fp8 caches. Also the per-step cost of the cache's metadata (prepare + apply for a
// decode step of many sequences, batch() + bind()). Machine read bandwidth measured in the same run.
//
//   escala_kv_decode_bench [--tokens N] [--threads N] [--runs N]
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "bench/ceilings.h"
#include "bench/timing.h"
#include "common/numeric.h"
#include "escala/attention.h"
#include "escala/kv_cache.h"
#include "kv/planner.h"

namespace {

using namespace escala;

constexpr int kH = 32, kHkv = 8, kD = 128, kBs = 16;

using bench::median_seconds;

void check(const Status& st) {
  if (!st.ok()) {
    fmt::print(stderr, "kv_decode_bench: {}\n", st.message());
    std::exit(1);
  }
}

// A cache of format t holding one sequence of `tokens` tokens whose blocks are a random
// permutation of the pool (many one-block sequences freed in random order first).
std::unique_ptr<kv::KvCache> make_cache(DType t, int tokens, const std::vector<float>& k, const std::vector<float>& v,
                                        std::mt19937& rng) {
  kv::CacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = kHkv;
  c.head_dim = kD;
  c.dtype = t;
  c.block_size = kBs;
  const int blocks = tokens / kBs + 1;
  c.budget_bytes = blocks * *kv::block_bytes(1, kHkv, kD, kv::format_of(t), kBs);
  auto cache = std::move(kv::KvCache::create(c).value());
  std::vector<int32_t> one(kBs, 0);
  for (int i = 0; i < blocks; ++i) {
    check(cache->add_sequence(1000 + i).status());
    kv::AppendRequest r{1000 + i, one};
    auto plan = cache->prepare_append({&r, 1});
    check(plan.status());
    check(cache->apply(*plan));
  }
  std::vector<int> order(static_cast<size_t>(blocks));
  for (int i = 0; i < blocks; ++i) order[size_t(i)] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (int i : order) check(cache->free_sequence(1000 + i));
  std::vector<int32_t> toks(size_t(tokens), 1);
  check(cache->add_sequence(0).status());
  kv::AppendRequest r{0, toks};
  auto plan = cache->prepare_append({&r, 1});
  check(plan.status());
  check(cache->apply(*plan));
  check(cache->write_kv(0, 0, 0, tokens, k.data(), v.data()));
  return cache;
}

}  // namespace

int main(int argc, char** argv) {
  int tokens = 32768, threads = omp_get_max_threads(), runs = 15;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
  }
  if (tokens < kBs || tokens > (1 << 22) || threads < 1 || threads > 1024 || runs < 1 || runs > 1000) {
    fmt::print(stderr, "kv_decode_bench: --tokens in [16, 2^22], --threads in [1, 1024], --runs in [1, 1000]\n");
    return 2;
  }
  tokens = tokens / kBs * kBs;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t(tokens) * kHkv * kD), v(k.size()), q(size_t(kH) * kD), o(q.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (auto& x : q) x = nd(rng);
  const double bw = bench::measure_read_bandwidth_gbs(threads, size_t(1) << 30);
  fmt::print("decode through KvCache pages: T={} GQA {}/{} d={} block {}, {} threads, median of {}\n", tokens, kH, kHkv,
             kD, kBs, threads, runs);
  fmt::print("machine read bandwidth: {:.2f} GB/s\n\n", bw);
  fmt::print("| layout            | ms      | GB/s   | % of read bw | vs contiguous bf16 |\n");
  fmt::print("|-------------------|---------|--------|--------------|--------------------|\n");
  attn::CpuOptions opt;
  opt.impl = attn::Impl::kDecode;
  opt.num_threads = threads;
  std::vector<int32_t> cu_q{0, 1}, cu_k{0, tokens};
  auto set_q = [&](attn::AttentionParams& p) {
    p.q = q.data();
    p.o = o.data();
    p.q_row_stride = p.o_row_stride = int64_t(kH) * kD;
    p.q_head_stride = p.o_head_stride = kD;
    p.cu_seqlens_q = cu_q.data();
    p.num_heads = kH;
  };
  // Contiguous bf16: the baseline.
  std::vector<uint16_t> kc(k.size()), vc(v.size());
  for (size_t i = 0; i < k.size(); ++i) kc[i] = f32_to_bf16(k[i]), vc[i] = f32_to_bf16(v[i]);
  attn::AttentionParams pc;
  set_q(pc);
  pc.k = kc.data();
  pc.v = vc.data();
  pc.kv_dtype = DType::kBF16;
  pc.batch = 1;
  pc.cu_seqlens_k = cu_k.data();
  pc.num_kv_heads = kHkv;
  pc.head_dim = kD;
  pc.k_head_stride = pc.v_head_stride = kD;
  pc.k_row_stride = pc.v_row_stride = int64_t(kHkv) * kD;
  const double t_base = median_seconds(runs, [&] { check(attn::attention(pc, opt)); });
  const double bytes_bf16 = 2.0 * tokens * kHkv * kD * 2;
  fmt::print("| contiguous bf16   | {:7.3f} | {:6.2f} | {:11.1f}% | {:17.2f}x |\n", t_base * 1e3, bytes_bf16 / t_base * 1e-9,
             100 * bytes_bf16 / t_base * 1e-9 / bw, 1.0);
  for (DType t : {DType::kBF16, DType::kI8, DType::kFp8E4M3}) {
    auto cache = make_cache(t, tokens, k, v, rng);
    const kv::SeqId ids[1] = {0};
    auto batch = cache->batch(ids);
    check(batch.status());
    attn::AttentionParams p;
    set_q(p);
    check(cache->bind(*batch, 0, p));
    const double sec = median_seconds(runs, [&] { check(attn::attention(p, opt)); });
    const int64_t bb = *kv::block_bytes(1, kHkv, kD, kv::format_of(t), kBs);
    const double bytes = double(bb) * (tokens / kBs);  // data and scales, as stored
    fmt::print("| paged {:5}       | {:7.3f} | {:6.2f} | {:11.1f}% | {:17.2f}x |\n", dtype_name(t), sec * 1e3,
               bytes / sec * 1e-9, 100 * bytes / sec * 1e-9 / bw, t_base / sec);
  }
  // Metadata cost of one engine step: a decode token for each of 64 sequences of 2048 tokens.
  {
    kv::CacheConfig c;
    c.num_layers = 32;
    c.num_kv_heads = kHkv;
    c.head_dim = kD;
    c.block_size = kBs;
    c.host_storage = false;
    c.budget_bytes = int64_t(64 * 2048 / kBs + 64 * 40) * *kv::block_bytes(32, kHkv, kD, kv::KvFormat::kBF16, kBs);
    auto cache = std::move(kv::KvCache::create(c).value());
    std::vector<kv::SeqId> ids;
    std::vector<int32_t> prompt(2048, 3);
    for (int s = 0; s < 64; ++s) {
      prompt[0] = s;  // distinct prompts: no sharing
      ids.push_back(s);
      check(cache->add_sequence(s).status());
      kv::AppendRequest r{s, prompt};
      auto plan = cache->prepare_append({&r, 1});
      check(plan.status());
      check(cache->apply(*plan));
    }
    std::vector<int32_t> tok{5};
    std::vector<kv::AppendRequest> reqs;
    for (kv::SeqId s : ids) reqs.push_back({s, tok});
    const double t_step = median_seconds(runs * 20, [&] {
      auto plan = cache->prepare_append(reqs);
      check(plan.status());
      check(cache->apply(*plan));
    });
    attn::AttentionParams p;
    const double t_view = median_seconds(runs * 20, [&] {
      auto batch = cache->batch(ids);
      check(cache->bind(*batch, 0, p));
    });
    fmt::print("\nmetadata per engine step, 64 sequences x ~2k tokens, 32 layers: prepare+apply {:.1f} us, "
               "batch()+bind() {:.1f} us\n",
               t_step * 1e6, t_view * 1e6);
  }
  return 0;
}
