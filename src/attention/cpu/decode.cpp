// The CPU decode kernel (also speculative verification: up to 16 queries per sequence).
// Work items are (sequence, split of the key range), each over every kv head: the query heads of a
// GQA group and all queries of the sequence are processed together, so each K/V row is read once
// per group, and an item walks whole rows of the cache (all kv heads of a token are adjacent), which
// streams memory far better than one head's short runs at a stride. Splits (Flash-Decoding) give
// every thread work at batch 1; their partial results are merged exactly through the log-sum-exp.
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
  int32_t b;
  int64_t q0, q_len, kv_len;
  int64_t range_begin, range_end;  // keys any query of the sequence may see (window part)
  int64_t sink_end;                // keys [0, sink_end) visited as sinks before the window part
  int splits;
};

struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> q, kf, vf, s, o, m, l, alpha;
  void init(int rows, int d, int dv) {
    q = hwy::AllocateAligned<float>(size_t(rows) * d);
    kf = hwy::AllocateAligned<float>(size_t(kBlock) * d);
    vf = hwy::AllocateAligned<float>(size_t(kBlock) * dv);
    s = hwy::AllocateAligned<float>(size_t(rows) * kBlock + 64);
    o = hwy::AllocateAligned<float>(size_t(rows) * dv);
    m = hwy::AllocateAligned<float>(rows);
    l = hwy::AllocateAligned<float>(rows);
    alpha = hwy::AllocateAligned<float>(rows);
  }
};

// Dot products of `rows` query rows with `nk` keys: s[r][j] = q[r] . k[j]. Four keys at a time
// for independent FMA chains; one horizontal sum per (row, key).
HWY_ATTR void scores(const float* HWY_RESTRICT q, const float* HWY_RESTRICT kf, int rows, int nk, int d,
                     float* HWY_RESTRICT s) {
  const DF df;
  const int L = int(hn::Lanes(df));
  for (int r = 0; r < rows; ++r) {
    const float* qr = q + size_t(r) * d;
    float* sr = s + size_t(r) * kBlock;
    int j = 0;
    for (; j + 4 <= nk; j += 4) {
      const float* k0 = kf + size_t(j) * d;
      VF a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
      for (int c = 0; c < d; c += L) {
        const VF qv = hn::Load(df, qr + c);
        a0 = hn::MulAdd(qv, hn::Load(df, k0 + c), a0);
        a1 = hn::MulAdd(qv, hn::Load(df, k0 + d + c), a1);
        a2 = hn::MulAdd(qv, hn::Load(df, k0 + 2 * d + c), a2);
        a3 = hn::MulAdd(qv, hn::Load(df, k0 + 3 * d + c), a3);
      }
      sr[j] = hn::GetLane(hn::SumOfLanes(df, a0));
      sr[j + 1] = hn::GetLane(hn::SumOfLanes(df, a1));
      sr[j + 2] = hn::GetLane(hn::SumOfLanes(df, a2));
      sr[j + 3] = hn::GetLane(hn::SumOfLanes(df, a3));
    }
    for (; j < nk; ++j) {
      VF a0 = hn::Zero(df);
      for (int c = 0; c < d; c += L) a0 = hn::MulAdd(hn::Load(df, qr + c), hn::Load(df, kf + size_t(j) * d + c), a0);
      sr[j] = hn::GetLane(hn::SumOfLanes(df, a0));
    }
  }
}

// o[r] = o[r] * alpha[r] + sum_j p[r][j] v[j] for all rows; two rows share each V load, and up to
// kMaxVecs accumulators per row stay in registers.
constexpr int kMaxVecs = 8;
HWY_ATTR void accumulate_pv(const float* HWY_RESTRICT p, const float* HWY_RESTRICT vf, const float* alpha, int rows,
                            int nk, int dvp, float* HWY_RESTRICT o) {
  const DF df;
  const int L = int(hn::Lanes(df));
  for (int c0 = 0; c0 < dvp; c0 += kMaxVecs * L) {
    const int nv = std::min(kMaxVecs, (dvp - c0) / L);
    for (int r = 0; r < rows; r += 2) {
      const bool two = r + 1 < rows;
      const float* p0 = p + size_t(r) * kBlock;
      const float* p1 = two ? p0 + kBlock : p0;
      float* o0 = o + size_t(r) * dvp + c0;
      float* o1 = two ? o0 + dvp : o0;
      VF a0[kMaxVecs], a1[kMaxVecs];
      const VF al0 = hn::Set(df, alpha[r]), al1 = hn::Set(df, two ? alpha[r + 1] : 0.0f);
      for (int v = 0; v < kMaxVecs; ++v) a0[v] = a1[v] = hn::Zero(df);
      for (int v = 0; v < kMaxVecs; ++v)
        if (v < nv) {
          a0[v] = hn::Mul(hn::Load(df, o0 + v * L), al0);
          a1[v] = hn::Mul(hn::Load(df, o1 + v * L), al1);
        }
      for (int j = 0; j < nk; ++j) {
        const VF w0 = hn::Set(df, p0[j]), w1 = hn::Set(df, p1[j]);
        const float* vr = vf + size_t(j) * dvp + c0;
        for (int v = 0; v < kMaxVecs; ++v)
          if (v < nv) {
            const VF x = hn::Load(df, vr + v * L);
            a0[v] = hn::MulAdd(w0, x, a0[v]);
            a1[v] = hn::MulAdd(w1, x, a1[v]);
          }
      }
      for (int v = 0; v < kMaxVecs; ++v)
        if (v < nv) {
          hn::Store(a0[v], df, o0 + v * L);
          if (two) hn::Store(a1[v], df, o1 + v * L);
        }
    }
  }
}

// One split of one sequence, every kv head: writes normalised partial O rows and their LSE.
// Row r of kv head hk is (query r / group, query head hk * group + r % group).
HWY_ATTR void run_split(const AttentionParams& p, const Geometry& g, int split, Scratch& sc, float* out_o,
                        float* out_lse) {
  const DF df;
  const int L = int(hn::Lanes(df));
  const int d = p.head_dim, dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads, nh = p.num_kv_heads;
  const int rows = int(g.q_len) * group;  // per kv head
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  const KvSeq K = make_kv_seq(p, g.b, false), V = make_kv_seq(p, g.b, true);
  const int64_t pos0 = g.kv_len - g.q_len;  // aligned position of query 0

  // Queries, pre-scaled; head dims are multiples of 8, vectors may be 16 wide: pad with zeros.
  const int dp = (d + L - 1) / L * L, dvp = (dv + L - 1) / L * L;
  float* q = sc.q.get();
  const size_t qb = dtype_size(p.q_dtype);
  for (int hk = 0; hk < nh; ++hk)
    for (int r = 0; r < rows; ++r) {
      const int64_t i = r / group;
      const int h = hk * group + r % group;
      float* dst = q + (size_t(hk) * rows + r) * dp;
      const auto* src = static_cast<const uint8_t*>(p.q) + ((g.q0 + i) * p.q_row_stride + h * p.q_head_stride) * qb;
      row_to_f32(src, p.q_dtype, d, effective_scale(p), dst);
      std::fill(dst + d, dst + dp, 0.0f);
    }
  float* o = sc.o.get();
  std::fill(o, o + size_t(nh) * rows * dvp, 0.0f);
  float* m = sc.m.get();
  float* l = sc.l.get();
  std::fill(m, m + nh * rows, kNegInf);
  std::fill(l, l + nh * rows, 0.0f);

  // This split's share of the visited keys: sinks first, then the window part.
  const int64_t total = g.sink_end + (g.range_end - g.range_begin);
  const int64_t per = (total + g.splits - 1) / g.splits;
  const int64_t v_lo = std::min(total, int64_t(split) * per), v_hi = std::min(total, v_lo + per);
  auto key_of = [&](int64_t v) { return v < g.sink_end ? v : g.range_begin + (v - g.sink_end); };

  float* kf = sc.kf.get();
  float* vf = sc.vf.get();
  float* s = sc.s.get();
  float* alpha = sc.alpha.get();
  for (int64_t v0 = v_lo; v0 < v_hi;) {
    // A block never straddles the sink/window boundary, so its keys are contiguous.
    int64_t v1 = std::min(v_hi, v0 + kBlock);
    if (v0 < g.sink_end) v1 = std::min(v1, g.sink_end);
    const int nk = int(v1 - v0);
    const int64_t j0 = key_of(v0);
    // Per-element masking only when some (query, key) pair of the block may be invisible.
    const int64_t jl = j0 + nk - 1, pos_hi = pos0 + g.q_len - 1;
    const bool full = (!p.causal || jl <= pos0) &&
                      (p.window_left < 0 || j0 >= pos_hi - p.window_left || jl < p.num_sinks) &&
                      (p.window_right < 0 || jl <= pos0 + p.window_right || jl < p.num_sinks);
    const int nkp = (nk + L - 1) / L * L;  // scores padded to whole vectors with -inf
    for (int hk = 0; hk < nh; ++hk) {
      float* qh = q + size_t(hk) * rows * dp;
      float* oh = o + size_t(hk) * rows * dvp;
      float* mh = m + hk * rows;
      float* lh = l + hk * rows;
      load_kv_tile(K, hk, j0, j0 + nk, d, nk, kf, dp, p.rope_inv_freq, p.rope_neox);
      load_kv_tile(V, hk, j0, j0 + nk, dv, nk, vf, dvp);
      if (dp != d)
        for (int j = 0; j < nk; ++j) std::fill(kf + size_t(j) * dp + d, kf + size_t(j) * dp + dp, 0.0f);
      if (dvp != dv)
        for (int j = 0; j < nk; ++j) std::fill(vf + size_t(j) * dvp + dv, vf + size_t(j) * dvp + dvp, 0.0f);
      scores(qh, kf, rows, nk, dp, s);
      for (int r = 0; r < rows; ++r) {
        float* sr = s + size_t(r) * kBlock;
        if (p.softcap > 0.0f) {
          const VF cap = hn::Set(df, p.softcap), inv = hn::Set(df, 1.0f / p.softcap);
          for (int j = 0; j < nkp; j += L)
            hn::Store(hn::Mul(cap, hn::Tanh(df, hn::Mul(hn::Load(df, sr + j), inv))), df, sr + j);
        }
        for (int j = nk; j < nkp; ++j) sr[j] = kNegInf;  // after the soft-cap, which would make it finite
        if (!full) {
          const int64_t pos = pos0 + r / group;
          for (int j = 0; j < nk; ++j)
            if (!mask.visible(pos, j0 + j)) sr[j] = kNegInf;
        }
        VF vmax = hn::Set(df, mh[r]);
        for (int j = 0; j < nkp; j += L) vmax = hn::Max(vmax, hn::Load(df, sr + j));
        const float mx = hn::GetLane(hn::MaxOfLanes(df, vmax));
        if (mx == kNegInf) {  // nothing visible yet for this row: weights 0, state unchanged
          alpha[r] = 1.0f;
          std::fill(sr, sr + nkp, 0.0f);
          continue;
        }
        alpha[r] = std::exp(mh[r] - mx);
        const VF vm = hn::Set(df, mx);
        VF sum = hn::Zero(df);
        for (int j = 0; j < nkp; j += L) {
          const VF e = hn::Exp(df, hn::Sub(hn::Load(df, sr + j), vm));
          sum = hn::Add(sum, e);
          hn::Store(e, df, sr + j);
        }
        lh[r] = lh[r] * alpha[r] + hn::GetLane(hn::SumOfLanes(df, sum));
        mh[r] = mx;
      }
      accumulate_pv(s, vf, alpha, rows, nk, dvp, oh);
    }
    v0 = v1;
  }
  for (int r = 0; r < nh * rows; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int c = 0; c < dv; ++c) out_o[size_t(r) * dv + c] = o[size_t(r) * dvp + c] * inv;
    out_lse[r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : kNegInf;
  }
}

}  // namespace

HWY_ATTR void DecodeAttentionImpl(const AttentionParams& p, int num_threads, int num_splits, SeqRange range) {
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};

  // Geometry per sequence and its split count.
  std::vector<Geometry> geo;
  int max_rows = 0;  // rows of one item: every kv head's (queries x group)
  for (int32_t b = 0; b < p.batch; ++b) {
    Geometry g{};
    g.b = b;
    g.q0 = p.cu_seqlens_q[b];
    g.q_len = p.cu_seqlens_q[b + 1] - g.q0;
    g.kv_len = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    if (!range.covers(g.q_len)) continue;
    const int64_t pos_lo = g.kv_len - g.q_len, pos_hi = g.kv_len - 1;
    g.range_end = mask.key_end(pos_hi, g.kv_len);
    g.range_begin = std::min(mask.window_begin(pos_lo), g.range_end);
    g.sink_end = std::min<int64_t>(p.num_sinks, g.range_begin);
    max_rows = std::max(max_rows, int(g.q_len) * p.num_heads);
    // Splits from this sequence alone (its length and the threads), never from the rest of the
    // batch: enough items to keep every thread busy, none shorter than kMinSplitKeys.
    const int64_t keys = g.sink_end + g.range_end - g.range_begin;
    g.splits = num_splits > 0 ? num_splits
                              : int(std::clamp<int64_t>(std::min<int64_t>(2 * int64_t(threads), keys / kMinSplitKeys), 1, 256));
    geo.push_back(g);
  }
  if (geo.empty()) return;

  // Partials: one slot of [rows][dv] and [rows] per (sequence, split).
  std::vector<int64_t> first_item(geo.size() + 1, 0);
  for (size_t gi = 0; gi < geo.size(); ++gi) first_item[gi + 1] = first_item[gi] + geo[gi].splits;
  const int64_t n_items = first_item.back();
  const size_t stride_o = size_t(max_rows) * dv;
  std::vector<float> part_o(size_t(n_items) * stride_o), part_lse(size_t(n_items) * max_rows);
  const int d_pad = p.head_dim + 64, dv_pad = dv + 64;
#pragma omp parallel num_threads(threads)
  {
    Scratch sc;
    sc.init(max_rows, d_pad, dv_pad);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const size_t gi = size_t(std::upper_bound(first_item.begin(), first_item.end(), it) - first_item.begin() - 1);
      const int sp = int(it - first_item[gi]);
      run_split(p, geo[gi], sp, sc, part_o.data() + size_t(it) * stride_o, part_lse.data() + size_t(it) * max_rows);
    }
  }

  // Merge the splits (and the learned sink logit, a partial with no value), write O and LSE.
  const size_t ob = dtype_size(p.o_dtype);
  std::vector<float> acc(dv);
  for (size_t gi = 0; gi < geo.size(); ++gi) {
    const Geometry& g = geo[gi];
    const int rows = int(g.q_len) * group;  // per kv head
    for (int r = 0; r < rows * p.num_kv_heads; ++r) {
      const int64_t i = (r % rows) / group;
      const int h = (r / rows) * group + (r % rows) % group;
      float lse = kNegInf;
      for (int sp = 0; sp < g.splits; ++sp) {
        const size_t it = size_t(first_item[gi] + sp);
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
void decode_attention(const AttentionParams& p, int num_threads, int num_splits, SeqRange range) {
  HWY_DYNAMIC_DISPATCH(DecodeAttentionImpl)(p, num_threads, num_splits, range);
}
}  // namespace escala::attn::cpu
#endif
