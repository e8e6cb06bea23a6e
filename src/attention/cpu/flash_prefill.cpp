// The CPU flash kernel: Q tiles against K/V tiles with the online softmax (FlashAttention), never
// holding more than one Bq x Bk score tile per q-tile. A work item is up to kUnits (query head,
// q-tile) units of one sequence that share a kv head; each K/V tile is converted to f32 once per
// item and used by every unit that sees it (the next q-tiles of a head, or the heads of a GQA
// group), not once per q-tile. Items are spread over OpenMP threads, longest first.
//
// Layout choice: queries are the SIMD lanes. Q is held transposed (Qt[c][i]) and K, V row-major in
// f32, so both products are broadcast-FMA microkernels with no horizontal reductions, and the
// softmax statistics of a row live in one lane (max/sum over keys are plain vertical ops).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/cpu/flash_prefill.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/cpu/exp-inl.h"
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

constexpr int kQVecs = 4;     // query vectors per tile: Bq = kQVecs * lanes
constexpr int kBk = 64;       // keys per tile
constexpr int kKeyBlock = 4;  // keys per QK microkernel step
constexpr int kValBlock = 4;  // value columns per PV microkernel step
constexpr int kUnits = 4;     // (head, q-tile) units per work item
// Lazy rescaling: a row keeps the maximum it subtracts before exp until a score exceeds it by more
// than this (natural-log units), so exp(s - m) <= e^8 and O and l are rescaled only when the max
// grows that much. Exact: O and l carry the same m and the final normalisation divides them.
constexpr float kRescaleThreshold = 8.0f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-thread scratch: the only memory the kernel uses besides inputs and outputs; it depends on
// the tile sizes and head dims, never on the sequence length.
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> qt, kf, vf, st, ot, m, l;
  size_t qt_size = 0, ot_size = 0, bq = 0;
  void init(int d, int dv, int bq_) {
    bq = size_t(bq_);
    qt_size = size_t(d) * bq;
    ot_size = size_t(dv) * bq;
    qt = hwy::AllocateAligned<float>(kUnits * qt_size);
    kf = hwy::AllocateAligned<float>(size_t(kBk) * d);
    vf = hwy::AllocateAligned<float>(size_t(kBk) * dv);
    st = hwy::AllocateAligned<float>(size_t(kBk) * bq);
    ot = hwy::AllocateAligned<float>(kUnits * ot_size);
    m = hwy::AllocateAligned<float>(kUnits * bq);
    l = hwy::AllocateAligned<float>(kUnits * bq);
  }
};

// St[j][i] = sum_c Kf[j][c] * Qt[c][i] for j < kBk (all lanes of the q tile).
HWY_ATTR void qk_tile(const float* HWY_RESTRICT qt, const float* HWY_RESTRICT kf, int d, int bq,
                      float* HWY_RESTRICT st) {
  const DF df;
  const size_t L = hn::Lanes(df);
  for (int j0 = 0; j0 < kBk; j0 += kKeyBlock) {
    VF acc[kKeyBlock][kQVecs];
    for (int a = 0; a < kKeyBlock; ++a)
      for (int v = 0; v < kQVecs; ++v) acc[a][v] = hn::Zero(df);
    const float* k0 = kf + size_t(j0) * d;
    for (int c = 0; c < d; ++c) {
      const float* qrow = qt + size_t(c) * bq;
      VF q[kQVecs];
      for (int v = 0; v < kQVecs; ++v) q[v] = hn::Load(df, qrow + v * L);
      for (int a = 0; a < kKeyBlock; ++a) {
        const VF kb = hn::Set(df, k0[size_t(a) * d + c]);
        for (int v = 0; v < kQVecs; ++v) acc[a][v] = hn::MulAdd(q[v], kb, acc[a][v]);
      }
    }
    for (int a = 0; a < kKeyBlock; ++a)
      for (int v = 0; v < kQVecs; ++v) hn::Store(acc[a][v], df, st + size_t(j0 + a) * bq + v * L);
  }
}

// Ot[c][i] += sum_j Vf[j][c] * P[j][i] over the kBk keys of the tile.
HWY_ATTR void pv_tile(const float* HWY_RESTRICT p, const float* HWY_RESTRICT vf, int dv, int bq, int nk,
                      float* HWY_RESTRICT ot) {
  const DF df;
  const size_t L = hn::Lanes(df);
  for (int c0 = 0; c0 < dv; c0 += kValBlock) {
    VF acc[kValBlock][kQVecs];
    for (int a = 0; a < kValBlock; ++a)
      for (int v = 0; v < kQVecs; ++v) acc[a][v] = hn::Load(df, ot + size_t(c0 + a) * bq + v * L);
    for (int j = 0; j < nk; ++j) {
      const float* prow = p + size_t(j) * bq;
      VF pv[kQVecs];
      for (int v = 0; v < kQVecs; ++v) pv[v] = hn::Load(df, prow + v * L);
      const float* vrow = vf + size_t(j) * dv + c0;
      for (int a = 0; a < kValBlock; ++a) {
        const VF vb = hn::Set(df, vrow[a]);
        for (int v = 0; v < kQVecs; ++v) acc[a][v] = hn::MulAdd(pv[v], vb, acc[a][v]);
      }
    }
    for (int a = 0; a < kValBlock; ++a)
      for (int v = 0; v < kQVecs; ++v) hn::Store(acc[a][v], df, ot + size_t(c0 + a) * bq + v * L);
  }
}

struct Unit {
  int32_t h, q_tile;
};
struct WorkItem {
  int32_t b, n;  // sequence, units
  Unit u[kUnits];
  int64_t cost;
};

// The rows of one unit and the keys they may see: [0, sink_end) and [window_lo, key_end).
struct UnitRange {
  int64_t i_lo, i_hi, pos_lo, pos_hi;
  int64_t key_end, window_lo, sink_end;
  bool sees(int64_t j0, int64_t j1) const { return j0 < sink_end || (j1 > window_lo && j0 < key_end); }
};

// One work item: each unit's online softmax over the K/V tiles it sees. Tiles are aligned to
// multiples of kBk keys, so a unit visits the same tiles whatever the other units of its item.
HWY_ATTR void run_item(const AttentionParams& p, const WorkItem& w, Scratch& s) {
  const DF df;
  const int L = int(hn::Lanes(df));
  const int bq = kQVecs * L;
  const int d = p.head_dim, dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads, hk = w.u[0].h / group;
  const int64_t q0 = p.cu_seqlens_q[w.b], q_len = p.cu_seqlens_q[w.b + 1] - q0;
  const int64_t kv_len = p.cu_seqlens_k[w.b + 1] - p.cu_seqlens_k[w.b];
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  const float scale = effective_scale(p);
  const KvSeq K = make_kv_seq(p, w.b, false), V = make_kv_seq(p, w.b, true);

  // Per unit: Q tile transposed and pre-scaled (padding rows zero), O, m, l, visible keys.
  UnitRange ur[kUnits];
  int64_t t_lo = kv_len, t_hi = 0;
  for (int u = 0; u < w.n; ++u) {
    UnitRange& r = ur[u];
    r.i_lo = int64_t(w.u[u].q_tile) * bq;
    r.i_hi = std::min<int64_t>(q_len, r.i_lo + bq);
    r.pos_lo = r.i_lo + kv_len - q_len;
    r.pos_hi = r.i_hi - 1 + kv_len - q_len;
    r.key_end = mask.key_end(r.pos_hi, kv_len);
    const int64_t win_begin = std::min(mask.window_begin(r.pos_lo), r.key_end);
    r.sink_end = std::min<int64_t>(p.num_sinks, win_begin);
    r.window_lo = std::max(win_begin, r.sink_end);
    if (r.sink_end > 0) t_lo = 0;
    if (r.window_lo < r.key_end) {
      t_lo = std::min(t_lo, r.window_lo);
      t_hi = std::max(t_hi, r.key_end);
    }
    t_hi = std::max(t_hi, r.sink_end);

    float* qt = s.qt.get() + u * s.qt_size;
    std::fill(qt, qt + size_t(d) * bq, 0.0f);
    float row[256];
    const size_t qb = dtype_size(p.q_dtype);
    for (int64_t i = r.i_lo; i < r.i_hi; ++i) {
      const auto* src =
          static_cast<const uint8_t*>(p.q) + ((q0 + i) * p.q_row_stride + w.u[u].h * p.q_head_stride) * qb;
      row_to_f32(src, p.q_dtype, d, scale, row);
      for (int c = 0; c < d; ++c) qt[size_t(c) * bq + (i - r.i_lo)] = row[c];
    }
    float* ot = s.ot.get() + u * s.ot_size;
    std::fill(ot, ot + size_t(dv) * bq, 0.0f);
    std::fill(s.m.get() + u * bq, s.m.get() + (u + 1) * bq, kNegInf);
    std::fill(s.l.get() + u * bq, s.l.get() + (u + 1) * bq, 0.0f);
  }

  // One unit against keys [j0, j1) of the tile in s.kf / s.vf.
  auto visit = [&](int u, int64_t j0, int64_t j1) HWY_ATTR {
    const UnitRange& r = ur[u];
    const int nk = int(j1 - j0);
    float* st = s.st.get();
    float* ot = s.ot.get() + u * s.ot_size;
    float* m = s.m.get() + u * bq;
    float* l = s.l.get() + u * bq;
    qk_tile(s.qt.get() + u * s.qt_size, s.kf.get(), d, bq, st);
    if (p.softcap > 0.0f) {
      const VF cap = hn::Set(df, p.softcap), inv = hn::Set(df, 1.0f / p.softcap);
      for (int j = 0; j < nk; ++j)
        for (int v = 0; v < kQVecs; ++v) {
          float* x = st + size_t(j) * bq + v * L;
          hn::Store(hn::Mul(cap, hn::Tanh(df, hn::Mul(hn::Load(df, x), inv))), df, x);
        }
    }
    // Per-element masking only where some (row, key) pair of the tile may be invisible.
    const int64_t jl = j1 - 1;
    const bool full = (!p.causal || jl <= r.pos_lo) && jl < kv_len &&
                      (p.window_left < 0 || j0 >= r.pos_hi - p.window_left || j1 <= p.num_sinks) &&
                      (p.window_right < 0 || jl <= r.pos_lo + p.window_right || j1 <= p.num_sinks);
    if (!full) {
      // Mask::visible for a vector of query positions (lanes) and one key j: causal j <= pos,
      // window pos - left <= j <= pos + right unless j is a sink. Padding rows are masked too
      // (their results are dropped).
      const hn::RebindToSigned<DF> di;
      for (int v = 0; v < kQVecs; ++v) {
        const auto pos = hn::Add(hn::Iota(di, 0), hn::Set(di, int32_t(r.pos_lo + v * L)));
        const auto row_ok = hn::RebindMask(df, hn::Lt(hn::Iota(di, 0), hn::Set(di, int32_t(r.i_hi - r.i_lo - v * L))));
        for (int j = 0; j < nk; ++j) {
          const int32_t k = int32_t(j0 + j);
          auto vis = row_ok;
          if (p.causal) vis = hn::And(vis, hn::RebindMask(df, hn::Gt(pos, hn::Set(di, k - 1))));
          if (k >= p.num_sinks) {
            if (p.window_left >= 0) vis = hn::And(vis, hn::RebindMask(df, hn::Lt(pos, hn::Set(di, k + p.window_left + 1))));
            if (p.window_right >= 0) vis = hn::And(vis, hn::RebindMask(df, hn::Gt(pos, hn::Set(di, k - p.window_right - 1))));
          }
          float* x = st + size_t(j) * bq + v * L;
          hn::Store(hn::IfThenElse(vis, hn::Load(df, x), hn::Set(df, kNegInf)), df, x);
        }
      }
    }
    // Online softmax, one query per lane, with lazy rescaling.
    const VF thr = hn::Set(df, kRescaleThreshold), neg_inf = hn::Set(df, kNegInf);
    for (int v = 0; v < kQVecs; ++v) {
      const VF m_old = hn::Load(df, m + v * L);
      // Four independent chains: one chain of nk dependent Max was latency-bound.
      VF mx0 = m_old, mx1 = m_old, mx2 = m_old, mx3 = m_old;
      int j = 0;
      for (; j + 4 <= nk; j += 4) {
        mx0 = hn::Max(mx0, hn::Load(df, st + size_t(j) * bq + v * L));
        mx1 = hn::Max(mx1, hn::Load(df, st + size_t(j + 1) * bq + v * L));
        mx2 = hn::Max(mx2, hn::Load(df, st + size_t(j + 2) * bq + v * L));
        mx3 = hn::Max(mx3, hn::Load(df, st + size_t(j + 3) * bq + v * L));
      }
      for (; j < nk; ++j) mx0 = hn::Max(mx0, hn::Load(df, st + size_t(j) * bq + v * L));
      const VF mx = hn::Max(hn::Max(mx0, mx1), hn::Max(mx2, mx3));
      // Lanes whose max grew by more than the threshold (or that saw their first key) move to it.
      const auto grow = hn::Gt(mx, hn::Add(m_old, thr));
      const VF m_new = hn::IfThenElse(grow, mx, m_old);
      // Rows with nothing visible yet keep m = -inf; subtract 0 there so exp(-inf) = 0, no NaN.
      const VF m_use = hn::IfThenZeroElse(hn::Eq(m_new, neg_inf), m_new);
      VF sum0 = hn::Zero(df), sum1 = hn::Zero(df);
      j = 0;
      for (; j + 2 <= nk; j += 2) {
        float* x0 = st + size_t(j) * bq + v * L;
        float* x1 = x0 + bq;
        const VF e0 = SoftmaxExp(df, hn::Sub(hn::Load(df, x0), m_use));
        const VF e1 = SoftmaxExp(df, hn::Sub(hn::Load(df, x1), m_use));
        sum0 = hn::Add(sum0, e0);
        sum1 = hn::Add(sum1, e1);
        hn::Store(e0, df, x0);
        hn::Store(e1, df, x1);
      }
      for (; j < nk; ++j) {
        float* x = st + size_t(j) * bq + v * L;
        const VF e = SoftmaxExp(df, hn::Sub(hn::Load(df, x), m_use));
        sum0 = hn::Add(sum0, e);
        hn::Store(e, df, x);
      }
      const VF sum = hn::Add(sum0, sum1);
      if (hn::AllFalse(df, grow)) {
        hn::Store(hn::Add(hn::Load(df, l + v * L), sum), df, l + v * L);
        continue;
      }
      const VF alpha = SoftmaxExp(df, hn::Sub(m_old, m_use));  // 1 where the max was kept, 0 where none
      hn::Store(hn::MulAdd(hn::Load(df, l + v * L), alpha, sum), df, l + v * L);
      hn::Store(m_new, df, m + v * L);
      for (int c = 0; c < dv; ++c) {
        float* o = ot + size_t(c) * bq + v * L;
        hn::Store(hn::Mul(hn::Load(df, o), alpha), df, o);
      }
    }
    pv_tile(st, s.vf.get(), dv, bq, nk, ot);
  };

  // Tiles aligned to kBk over the union of the units' visible keys; each tile is converted once.
  for (int64_t j0 = t_lo / kBk * kBk; j0 < t_hi; j0 += kBk) {
    const int64_t j1 = std::min<int64_t>(j0 + kBk, t_hi);
    bool any = false;
    for (int u = 0; u < w.n; ++u) any = any || ur[u].sees(j0, j1);
    if (!any) continue;
    load_kv_tile(K, hk, j0, j1, d, kBk, s.kf.get(), d, p.rope_inv_freq, p.rope_neox);
    load_kv_tile(V, hk, j0, j1, dv, int(j1 - j0), s.vf.get(), dv);
    for (int u = 0; u < w.n; ++u)
      if (ur[u].sees(j0, j1)) visit(u, j0, j1);
  }

  // Epilogue: normalise, fold in the learned sink logit, write O (and LSE).
  const size_t ob = dtype_size(p.o_dtype);
  for (int u = 0; u < w.n; ++u) {
    const UnitRange& r = ur[u];
    const int h = w.u[u].h;
    const float* ot = s.ot.get() + u * s.ot_size;
    for (int64_t i = r.i_lo; i < r.i_hi; ++i) {
      const int row = int(i - r.i_lo);
      float mr = s.m[u * bq + row], lr = s.l[u * bq + row], wscale = 1.0f;
      if (p.sink_logits) {
        const float sink = p.sink_logits[h];
        const float mf = std::max(mr, sink);
        wscale = lr != 0.0f ? std::exp(mr - mf) : 0.0f;
        lr = lr * wscale + std::exp(sink - mf);
        mr = mf;
      }
      // lr is 0 only for a row with nothing visible (zeros, LSE -inf); NaN from a non-finite input
      // goes on into O and the LSE.
      const float inv = lr != 0.0f ? wscale / lr : 0.0f;
      auto* dst = static_cast<uint8_t*>(p.o) + ((q0 + i) * p.o_row_stride + h * p.o_head_stride) * ob;
      for (int c = 0; c < dv; ++c) store_float(dst, p.o_dtype, c, ot[size_t(c) * bq + row] * inv);
      if (p.lse) p.lse[(q0 + i) * p.num_heads + h] = lr != 0.0f ? mr + std::log(lr) : kNegInf;
    }
  }
}

}  // namespace

HWY_ATTR void FlashAttentionImpl(const AttentionParams& p, int num_threads, SeqRange range) {
  const int bq = kQVecs * int(hn::Lanes(DF()));
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  std::vector<WorkItem> items;
  for (int32_t b = 0; b < p.batch; ++b) {
    const int64_t q_len = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const int64_t kv_len = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    if (!range.covers(q_len)) continue;
    const int32_t tiles = int32_t((q_len + bq - 1) / bq);
    // Units of one kv head, q-tile major (consecutive q-tiles see nearly the same keys), grouped
    // by kUnits into items.
    for (int32_t hk = 0; hk < p.num_kv_heads; ++hk) {
      WorkItem it{b, 0, {}, 0};
      for (int32_t t = 0; t < tiles; ++t)
        for (int32_t g = 0; g < group; ++g) {
          // Cost ~ keys visited: later tiles see more keys under a causal mask.
          const int64_t last = std::min<int64_t>(q_len, int64_t(t + 1) * bq) - 1 + kv_len - q_len;
          const int64_t cost = p.causal ? std::max<int64_t>(1, std::min(kv_len, last + 1)) : kv_len + 1;
          it.u[it.n++] = {hk * group + g, t};
          it.cost += cost;
          if (it.n == kUnits) {
            items.push_back(it);
            it = WorkItem{b, 0, {}, 0};
          }
        }
      if (it.n > 0) items.push_back(it);
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    Scratch s;
    s.init(p.head_dim, dv, bq);
#pragma omp for schedule(dynamic, 1)
    for (size_t k = 0; k < items.size(); ++k) run_item(p, items[k], s);
  }
}

}  // namespace escala::attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace escala::attn::cpu {
HWY_EXPORT(FlashAttentionImpl);
void flash_attention(const AttentionParams& p, int num_threads, SeqRange range) {
  HWY_DYNAMIC_DISPATCH(FlashAttentionImpl)(p, num_threads, range);
}
}  // namespace escala::attn::cpu
#endif
