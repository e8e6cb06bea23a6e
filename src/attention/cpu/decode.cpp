// The CPU decode kernel (also speculative verification: up to 16 queries per sequence).
// Work items are (sequence, kv head, split of the key range): the query heads of a GQA group and
// all queries of the sequence are processed together, so each K/V row is read once per group.
// Splits (Flash-Decoding) give every thread work at batch 1; their partial results are merged
// exactly through the log-sum-exp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/cpu/decode.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/cpu/kernels.h"
#include "attention/cpu/tile_load-inl.h"
#include "attention/kv_layout.h"
#include "attention/variant.h"
#include "hwy/aligned_allocator.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace escala::attn::cpu::HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr int kBlock = 32;            // keys per block
constexpr int64_t kMinSplitKeys = 256;  // a split shorter than this costs more to merge than it saves
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Geometry {
  int32_t b, hk;
  int64_t q0, q_len, kv_len;
  int64_t range_begin, range_end;  // keys any query of the sequence may see (window part)
  int64_t sink_end;                // keys [0, sink_end) visited as sinks before the window part
  int splits;
};

struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> q, kf, vf, s, o, m, l;
  void init(int rows, int d, int dv) {
    q = hwy::AllocateAligned<float>(size_t(rows) * d);
    kf = hwy::AllocateAligned<float>(size_t(kBlock) * d);
    vf = hwy::AllocateAligned<float>(size_t(kBlock) * dv);
    s = hwy::AllocateAligned<float>(size_t(rows) * kBlock);
    o = hwy::AllocateAligned<float>(size_t(rows) * dv);
    m = hwy::AllocateAligned<float>(rows);
    l = hwy::AllocateAligned<float>(rows);
  }
};

// Dot products of `rows` query rows with `nk` keys: s[r][j] = q[r] . k[j].
HWY_ATTR void scores(const float* HWY_RESTRICT q, const float* HWY_RESTRICT kf, int rows, int nk, int d,
                     float* HWY_RESTRICT s) {
  const DF df;
  const int L = int(hn::Lanes(df));
  for (int r = 0; r < rows; ++r) {
    const float* qr = q + size_t(r) * d;
    int j = 0;
    for (; j + 2 <= nk; j += 2) {  // two keys at once: independent FMA chains
      const float* k0 = kf + size_t(j) * d;
      const float* k1 = k0 + d;
      VF a0 = hn::Zero(df), a1 = hn::Zero(df);
      for (int c = 0; c < d; c += L) {
        const VF qv = hn::Load(df, qr + c);
        a0 = hn::MulAdd(qv, hn::Load(df, k0 + c), a0);
        a1 = hn::MulAdd(qv, hn::Load(df, k1 + c), a1);
      }
      s[size_t(r) * kBlock + j] = hn::GetLane(hn::SumOfLanes(df, a0));
      s[size_t(r) * kBlock + j + 1] = hn::GetLane(hn::SumOfLanes(df, a1));
    }
    for (; j < nk; ++j) {
      VF a0 = hn::Zero(df);
      for (int c = 0; c < d; c += L) a0 = hn::MulAdd(hn::Load(df, qr + c), hn::Load(df, kf + size_t(j) * d + c), a0);
      s[size_t(r) * kBlock + j] = hn::GetLane(hn::SumOfLanes(df, a0));
    }
  }
}

// One split of one (sequence, kv head): writes normalised partial O rows and their LSE.
HWY_ATTR void run_split(const AttentionParams& p, const Geometry& g, int split, Scratch& sc, float* out_o,
                        float* out_lse) {
  const DF df;
  const int L = int(hn::Lanes(df));
  const int d = p.head_dim, dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int rows = int(g.q_len) * group;  // row r = (query r / group, head hk*group + r % group)
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  const KvSeq K = make_kv_seq(p, g.b, false), V = make_kv_seq(p, g.b, true);
  const int64_t pos0 = g.kv_len - g.q_len;  // aligned position of query 0

  // Queries, pre-scaled; head dims are multiples of 8, vectors may be 16 wide: pad with zeros.
  const int dp = (d + L - 1) / L * L, dvp = (dv + L - 1) / L * L;
  float* q = sc.q.get();
  const size_t qb = dtype_size(p.q_dtype);
  for (int r = 0; r < rows; ++r) {
    const int64_t i = r / group;
    const int h = g.hk * group + r % group;
    const auto* src = static_cast<const uint8_t*>(p.q) + ((g.q0 + i) * p.q_row_stride + h * p.q_head_stride) * qb;
    row_to_f32(src, p.q_dtype, d, effective_scale(p), q + size_t(r) * dp);
    std::fill(q + size_t(r) * dp + d, q + size_t(r) * dp + dp, 0.0f);
  }
  float* o = sc.o.get();
  std::fill(o, o + size_t(rows) * dvp, 0.0f);
  float* m = sc.m.get();
  float* l = sc.l.get();
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.0f);

  // This split's share of the visited keys: sinks first, then the window part.
  const int64_t total = g.sink_end + (g.range_end - g.range_begin);
  const int64_t per = (total + g.splits - 1) / g.splits;
  const int64_t v_lo = std::min(total, int64_t(split) * per), v_hi = std::min(total, v_lo + per);
  auto key_of = [&](int64_t v) { return v < g.sink_end ? v : g.range_begin + (v - g.sink_end); };

  float* kf = sc.kf.get();
  float* vf = sc.vf.get();
  float* s = sc.s.get();
  for (int64_t v0 = v_lo; v0 < v_hi;) {
    // A block never straddles the sink/window boundary, so its keys are contiguous.
    int64_t v1 = std::min(v_hi, v0 + kBlock);
    if (v0 < g.sink_end) v1 = std::min(v1, g.sink_end);
    const int nk = int(v1 - v0);
    const int64_t j0 = key_of(v0);
    load_kv_tile(K, g.hk, j0, j0 + nk, d, nk, kf, dp, p.rope_inv_freq, p.rope_neox);
    load_kv_tile(V, g.hk, j0, j0 + nk, dv, nk, vf, dvp);
    if (dp != d)
      for (int j = 0; j < nk; ++j) std::fill(kf + size_t(j) * dp + d, kf + size_t(j) * dp + dp, 0.0f);
    if (dvp != dv)
      for (int j = 0; j < nk; ++j) std::fill(vf + size_t(j) * dvp + dv, vf + size_t(j) * dvp + dvp, 0.0f);
    scores(q, kf, rows, nk, dp, s);
    for (int r = 0; r < rows; ++r) {
      float* sr = s + size_t(r) * kBlock;
      const int64_t pos = pos0 + r / group;
      float mx = m[r];
      for (int j = 0; j < nk; ++j) {
        float x = sr[j];
        if (p.softcap > 0.0f) x = p.softcap * std::tanh(x / p.softcap);
        if (!mask.visible(pos, j0 + j)) x = kNegInf;
        sr[j] = x;
        mx = std::max(mx, x);
      }
      if (mx == kNegInf) continue;  // nothing visible yet for this row
      const float alpha = std::exp(m[r] - mx);
      float sum = 0.0f;
      for (int j = 0; j < nk; ++j) {
        sr[j] = std::exp(sr[j] - mx);
        sum += sr[j];
      }
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
      // o[r] = o[r] * alpha + sum_j p[j] v[j]
      float* orow = o + size_t(r) * dvp;
      const VF va = hn::Set(df, alpha);
      for (int c = 0; c < dvp; c += L) {
        VF acc = hn::Mul(hn::Load(df, orow + c), va);
        for (int j = 0; j < nk; ++j) acc = hn::MulAdd(hn::Set(df, sr[j]), hn::Load(df, vf + size_t(j) * dvp + c), acc);
        hn::Store(acc, df, orow + c);
      }
    }
    v0 = v1;
  }
  for (int r = 0; r < rows; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int c = 0; c < dv; ++c) out_o[size_t(r) * dv + c] = o[size_t(r) * dvp + c] * inv;
    out_lse[r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
  }
}

}  // namespace

HWY_ATTR void DecodeAttentionImpl(const AttentionParams& p, int num_threads, int num_splits) {
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};

  // Geometry per (sequence, kv head) and the split count.
  std::vector<Geometry> geo;
  int max_rows = 0;
  for (int32_t b = 0; b < p.batch; ++b) {
    Geometry g{};
    g.b = b;
    g.q0 = p.cu_seqlens_q[b];
    g.q_len = p.cu_seqlens_q[b + 1] - g.q0;
    g.kv_len = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    const int64_t pos_lo = g.kv_len - g.q_len, pos_hi = g.kv_len - 1;
    g.range_end = mask.key_end(pos_hi, g.kv_len);
    g.range_begin = std::min(mask.window_begin(pos_lo), g.range_end);
    g.sink_end = std::min<int64_t>(p.num_sinks, g.range_begin);
    max_rows = std::max(max_rows, int(g.q_len) * group);
    for (int32_t hk = 0; hk < p.num_kv_heads; ++hk) {
      g.hk = hk;
      geo.push_back(g);
    }
  }
  int64_t max_keys = 0;
  for (const auto& g : geo) max_keys = std::max(max_keys, g.sink_end + g.range_end - g.range_begin);
  int splits = num_splits;
  if (splits <= 0) {
    // Enough items to keep every thread busy, but never splits shorter than kMinSplitKeys.
    const int64_t want = (2 * int64_t(threads) + int64_t(geo.size()) - 1) / int64_t(geo.size());
    splits = int(std::clamp<int64_t>(std::min<int64_t>(want, max_keys / kMinSplitKeys), 1, 256));
  }
  for (auto& g : geo) g.splits = splits;

  // Partials: [geo][split][rows][dv] and their LSE.
  const size_t stride_o = size_t(max_rows) * dv;
  std::vector<float> part_o(geo.size() * splits * stride_o), part_lse(geo.size() * splits * max_rows);
  const int64_t n_items = int64_t(geo.size()) * splits;
  const int d_pad = p.head_dim + 64, dv_pad = dv + 64;
#pragma omp parallel num_threads(threads)
  {
    Scratch sc;
    sc.init(max_rows, d_pad, dv_pad);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const size_t gi = size_t(it / splits);
      const int sp = int(it % splits);
      run_split(p, geo[gi], sp, sc, part_o.data() + size_t(it) * stride_o, part_lse.data() + size_t(it) * max_rows);
    }
  }

  // Merge the splits (and the learned sink logit, a partial with no value), write O and LSE.
  const size_t ob = dtype_size(p.o_dtype);
  std::vector<float> acc(dv);
  for (size_t gi = 0; gi < geo.size(); ++gi) {
    const Geometry& g = geo[gi];
    const int rows = int(g.q_len) * group;
    for (int r = 0; r < rows; ++r) {
      const int64_t i = r / group;
      const int h = g.hk * group + r % group;
      float lse = kNegInf;
      for (int sp = 0; sp < splits; ++sp) {
        const size_t it = gi * splits + sp;
        merge_partial(acc.data(), &lse, part_o.data() + it * stride_o + size_t(r) * dv,
                      part_lse[it * max_rows + r], dv);
      }
      if (lse == kNegInf) std::fill(acc.begin(), acc.end(), 0.0f);
      if (p.sink_logits) merge_partial(acc.data(), &lse, nullptr, p.sink_logits[h], dv);
      auto* dst = static_cast<uint8_t*>(p.o) + ((g.q0 + i) * p.o_row_stride + h * p.o_head_stride) * ob;
      for (int c = 0; c < dv; ++c) store_float(dst, p.o_dtype, c, acc[c]);
      if (p.lse) p.lse[(g.q0 + i) * p.num_heads + h] = lse;
    }
  }
}

}  // namespace escala::attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace escala::attn::cpu {
HWY_EXPORT(DecodeAttentionImpl);
void decode_attention(const AttentionParams& p, int num_threads, int num_splits) {
  HWY_DYNAMIC_DISPATCH(DecodeAttentionImpl)(p, num_threads, num_splits);
}
}  // namespace escala::attn::cpu
#endif
