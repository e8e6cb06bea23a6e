// The CPU flash kernel: Q tiles against K/V tiles with the online softmax (FlashAttention), never
// holding more than one Bq x Bk score tile. Work items are (sequence, head, q-tile), spread over
// OpenMP threads, longest first.
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

constexpr int kQVecs = 4;   // query vectors per tile: Bq = kQVecs * lanes
constexpr int kBk = 64;     // keys per tile
constexpr int kKeyBlock = 4;  // keys per QK microkernel step
constexpr int kValBlock = 4;  // value columns per PV microkernel step
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Per-thread scratch: the only memory the kernel uses besides inputs and outputs; it depends on
// the tile sizes and head dims, never on the sequence length.
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> qt, kf, vf, st, ot, m, l;
  void init(int d, int dv, int bq) {
    qt = hwy::AllocateAligned<float>(size_t(d) * bq);
    kf = hwy::AllocateAligned<float>(size_t(kBk) * d);
    vf = hwy::AllocateAligned<float>(size_t(kBk) * dv);
    st = hwy::AllocateAligned<float>(size_t(kBk) * bq);
    ot = hwy::AllocateAligned<float>(size_t(dv) * bq);
    m = hwy::AllocateAligned<float>(bq);
    l = hwy::AllocateAligned<float>(bq);
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

struct WorkItem {
  int32_t b, h, q_tile;
  int64_t cost;
};

// One (sequence, head, q-tile): the whole online-softmax loop over the visible K/V tiles.
HWY_ATTR void run_item(const AttentionParams& p, const WorkItem& w, Scratch& s) {
  const DF df;
  const int L = int(hn::Lanes(df));
  const int bq = kQVecs * L;
  const int d = p.head_dim, dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads, hk = w.h / group;
  const int64_t q0 = p.cu_seqlens_q[w.b], q_len = p.cu_seqlens_q[w.b + 1] - q0;
  const int64_t kv_len = p.cu_seqlens_k[w.b + 1] - p.cu_seqlens_k[w.b];
  const int64_t i_lo = int64_t(w.q_tile) * bq, i_hi = std::min<int64_t>(q_len, i_lo + bq);
  const int64_t pos_lo = i_lo + kv_len - q_len, pos_hi = i_hi - 1 + kv_len - q_len;
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  const float scale = effective_scale(p);
  const KvSeq K = make_kv_seq(p, w.b, false), V = make_kv_seq(p, w.b, true);

  // Q tile, transposed and pre-scaled; padding rows are zero.
  float* qt = s.qt.get();
  std::fill(qt, qt + size_t(d) * bq, 0.0f);
  {
    float row[256];
    const size_t qb = dtype_size(p.q_dtype);
    for (int64_t i = i_lo; i < i_hi; ++i) {
      const auto* src = static_cast<const uint8_t*>(p.q) + ((q0 + i) * p.q_row_stride + w.h * p.q_head_stride) * qb;
      row_to_f32(src, p.q_dtype, d, scale, row);
      for (int c = 0; c < d; ++c) qt[size_t(c) * bq + (i - i_lo)] = row[c];
    }
  }
  float* ot = s.ot.get();
  std::fill(ot, ot + size_t(dv) * bq, 0.0f);
  float* m = s.m.get();
  float* l = s.l.get();
  std::fill(m, m + bq, kNegInf);
  std::fill(l, l + bq, 0.0f);

  // Keys to visit: the sinks below the window, then the window up to the last visible key.
  const int64_t key_end = mask.key_end(pos_hi, kv_len);
  const int64_t win_begin = std::min(mask.window_begin(pos_lo), key_end);
  const int64_t sink_end = std::min<int64_t>(p.num_sinks, win_begin);
  auto visit = [&](int64_t j0, int64_t j1) HWY_ATTR {
    const int nk = int(j1 - j0);
    load_kv_tile(K, hk, j0, j1, d, kBk, s.kf.get(), d, p.rope_inv_freq, p.rope_neox);
    load_kv_tile(V, hk, j0, j1, dv, nk, s.vf.get(), dv);
    float* st = s.st.get();
    qk_tile(qt, s.kf.get(), d, bq, st);
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
    const bool full = (!p.causal || jl <= pos_lo) &&
                      (p.window_left < 0 || j0 >= pos_hi - p.window_left || j1 <= p.num_sinks) &&
                      (p.window_right < 0 || jl <= pos_lo + p.window_right || j1 <= p.num_sinks);
    if (!full) {
      for (int j = 0; j < nk; ++j)
        for (int64_t i = i_lo; i < i_hi; ++i)
          if (!mask.visible(i + kv_len - q_len, j0 + j)) st[size_t(j) * bq + (i - i_lo)] = kNegInf;
    }
    // Online softmax, one query per lane.
    for (int v = 0; v < kQVecs; ++v) {
      VF mx = hn::Load(df, m + v * L);
      const VF m_old = mx;
      for (int j = 0; j < nk; ++j) mx = hn::Max(mx, hn::Load(df, st + size_t(j) * bq + v * L));
      // All-masked rows keep m = -inf; subtract 0 there so exp(-inf) = 0 and no NaN appears.
      const auto empty = hn::Eq(mx, hn::Set(df, kNegInf));
      const VF m_use = hn::IfThenZeroElse(empty, mx);
      const VF alpha = hn::Exp(df, hn::Sub(m_old, m_use));
      VF sum = hn::Zero(df);
      for (int j = 0; j < nk; ++j) {
        float* x = st + size_t(j) * bq + v * L;
        const VF e = hn::Exp(df, hn::Sub(hn::Load(df, x), m_use));
        sum = hn::Add(sum, e);
        hn::Store(e, df, x);
      }
      hn::Store(hn::MulAdd(hn::Load(df, l + v * L), alpha, sum), df, l + v * L);
      hn::Store(mx, df, m + v * L);
      if (!hn::AllTrue(df, hn::Eq(alpha, hn::Set(df, 1.0f)))) {
        for (int c = 0; c < dv; ++c) {
          float* o = ot + size_t(c) * bq + v * L;
          hn::Store(hn::Mul(hn::Load(df, o), alpha), df, o);
        }
      }
    }
    pv_tile(st, s.vf.get(), dv, bq, nk, ot);
  };
  for (int64_t j0 = 0; j0 < sink_end; j0 += kBk) visit(j0, std::min<int64_t>(j0 + kBk, sink_end));
  for (int64_t j0 = std::max(win_begin, sink_end); j0 < key_end; j0 += kBk)
    visit(j0, std::min<int64_t>(j0 + kBk, key_end));

  // Epilogue: normalise, fold in the learned sink logit, write O (and LSE).
  const size_t ob = dtype_size(p.o_dtype);
  for (int64_t i = i_lo; i < i_hi; ++i) {
    const int r = int(i - i_lo);
    float mr = m[r], lr = l[r], wscale = 1.0f;
    if (p.sink_logits) {
      const float sink = p.sink_logits[w.h];
      const float mf = std::max(mr, sink);
      wscale = lr > 0.0f ? std::exp(mr - mf) : 0.0f;
      lr = lr * wscale + std::exp(sink - mf);
      mr = mf;
    }
    const float inv = lr > 0.0f ? wscale / lr : 0.0f;
    auto* dst = static_cast<uint8_t*>(p.o) + ((q0 + i) * p.o_row_stride + w.h * p.o_head_stride) * ob;
    for (int c = 0; c < dv; ++c) store_float(dst, p.o_dtype, c, ot[size_t(c) * bq + r] * inv);
    if (p.lse) p.lse[(q0 + i) * p.num_heads + w.h] = lr > 0.0f ? mr + std::log(lr) : kNegInf;
  }
}

}  // namespace

HWY_ATTR void FlashAttentionImpl(const AttentionParams& p, int num_threads, SeqRange range) {
  const int bq = kQVecs * int(hn::Lanes(DF()));
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  std::vector<WorkItem> items;
  for (int32_t b = 0; b < p.batch; ++b) {
    const int64_t q_len = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const int64_t kv_len = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    if (!range.covers(q_len)) continue;
    const int32_t tiles = int32_t((q_len + bq - 1) / bq);
    for (int32_t t = 0; t < tiles; ++t) {
      // Cost ~ keys visited: later tiles see more keys under a causal mask.
      const int64_t last = std::min<int64_t>(q_len, int64_t(t + 1) * bq) - 1 + kv_len - q_len;
      const int64_t cost = p.causal ? std::max<int64_t>(1, std::min(kv_len, last + 1)) : kv_len + 1;
      for (int32_t h = 0; h < p.num_heads; ++h) items.push_back({b, h, t, cost});
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
