// Device helpers shared by the CUDA prefill kernels: score transform and mask on an accumulator
// tile, the online-softmax update, and the epilogue (sink logit, normalisation, O and LSE stores).
// Accumulator layout (mma.sync m16n8 C fragments, and wgmma m64 per warp): s[j][e] holds row
// `g` (e < 2) or `g + 8` (e >= 2) of the warp's 16 rows, column 8 j + 2 t4 + (e & 1), where
// g = lane / 4 and t4 = lane % 4. Scores stay in raw dot units (scale folded into exp2).
#pragma once

#include <cstdint>

#include "attention/cuda/fwd_params.h"
#include "attention/cuda/sm80/ptx.cuh"
#include "attention/cuda/tile_range.cuh"

namespace escala::attn::cuda {

// Soft-cap in raw units: s <- cap/scale * tanh(s * scale/cap) on every element (a no-op when
// `softcap` is 0). For the decode kernel's two layouts; transform_and_mask keeps its own copy,
// since calling this there changed the sm_90 prefill kernel's mask code (SASS), unmeasured.
template <int kNT>
__device__ __forceinline__ void apply_softcap(float (&s)[kNT][4], float scale, float softcap) {
  if (softcap > 0.0f) {
    const float in = scale / softcap, out = softcap / scale;
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = out * accurate_tanh(s[j][e] * in);
  }
}

// Soft-cap in raw units (s <- cap/scale * tanh(s * scale/cap)), then -inf where the mask hides
// the key. `row0` is the aligned query position of row g; keys of the tile start at k_lo.
// kSinksSoftcap = false: for calls with neither sinks nor a soft-cap (the caller checks), without
// the code for them (the soft-cap's tanh and the general mask test, ~1300 instructions in the
// sm_90 d = 128 key-tile loop, which they lengthened from 1009 to 2298: cuda_notes step 158).
template <int kNT, bool kSinksSoftcap = true>
__device__ __forceinline__ void transform_and_mask(float (&s)[kNT][4], const FwdParams& p, bool needs_mask,
                                                   int64_t row0, int k_lo, int kv_len, int t4) {
  if (kSinksSoftcap && p.softcap > 0.0f) {
    const float in = p.scale / p.softcap, out = p.softcap / p.scale;
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = out * accurate_tanh(s[j][e] * in);
  }
  if (needs_mask && p.mask.window_left < 0 && p.mask.window_right < 0 && p.mask.num_sinks == 0) {
    // Causal and/or the sequence end only: one bound per row.
    const RowMask rm[2] = {RowMask(p.mask, row0, kv_len), RowMask(p.mask, row0 + 8, kv_len)};
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (k_lo + j * 8 + 2 * t4 + (e & 1) >= rm[e / 2].end) s[j][e] = -INFINITY;
  } else if (needs_mask && k_lo >= p.mask.num_sinks) {
    // A window's band edge past the sinks: each row sees one interval of keys, [lo, lo + n) (one
    // unsigned compare per element instead of the general test's four).
    uint32_t lo[2], n[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const RowMask rm(p.mask, row0 + 8 * r, kv_len);
      const int32_t first = rm.win_lo > 0 ? rm.win_lo : 0;
      const int32_t end = rm.win_hi < rm.end ? rm.win_hi + 1 : rm.end;  // no overflow: win_hi < end
      lo[r] = static_cast<uint32_t>(first);
      n[r] = end > first ? static_cast<uint32_t>(end - first) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (static_cast<uint32_t>(k_lo + j * 8 + 2 * t4 + (e & 1)) - lo[e / 2] >= n[e / 2]) s[j][e] = -INFINITY;
  } else if (kSinksSoftcap && needs_mask) {  // sink tiles: without sinks every key is >= num_sinks = 0
    const RowMask rm[2] = {RowMask(p.mask, row0, kv_len), RowMask(p.mask, row0 + 8, kv_len)};
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!rm[e / 2].visible(k_lo + j * 8 + 2 * t4 + (e & 1))) s[j][e] = -INFINITY;
  }
}

// kLazy: the running max is only raised when a tile's max exceeds it by more than 2^8 in
// probability (FlashAttention-4's conditional rescale): below that the old max stays the reference,
// the tile's probabilities reach at most 2^8 before the final normalisation (far inside f32, and
// f16 for P), and alpha is exactly 1, so the caller can skip the O rescale. Once a long row's max
// settles, almost every tile skips it. (H200, sm_90 kernel: session 6, d = 256 4-13% faster, d = 64
// 5-9% slower; session 20, with the P V wait pinned after the softmax, d = 128 1-3% faster and
// d = 64 still 4% slower at S = 1k: the sm_90 kernels wider than 64 use it.)
constexpr float kLazyRescaleLog2 = 8.0f;

// Online softmax over one tile: new running max, s <- exp2((s - max) * scale_log2), this thread's
// partial row sums rescaled and accumulated; alpha[r] is the factor the O rows must be scaled by
// (exactly 1 when the max stays). kColumns: the decode kernel's layout with the rows as MMA
// columns, s[j][e] of row 2 t4 + (e & 1), so a row's values are spread over the 8 lanes of one t4
// (xor 4, 8, 16) instead of the 4 of one g (xor 1, 2).
// kNoSums: the caller's P V sums the rows (row_sum untouched).
template <int kNT, bool kLazy = false, bool kColumns = false, bool kNoSums = false>
__device__ __forceinline__ void softmax_update(float (&s)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                               float scale_log2, float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int e0 = kColumns ? r : 2 * r, e1 = kColumns ? r + 2 : 2 * r + 1;  // the row's two elements
    float mx = row_max[r];
#pragma unroll
    for (int j = 0; j < kNT; ++j) mx = fmaxf(mx, fmaxf(s[j][e0], s[j][e1]));
#pragma unroll
    for (int off = kColumns ? 4 : 1; off < (kColumns ? 32 : 4); off *= 2)
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    // The lanes of a row hold the same mx and row_max: the choice is the same for all of them.
    if (kLazy && row_max[r] != -INFINITY && (mx - row_max[r]) * scale_log2 <= kLazyRescaleLog2) mx = row_max[r];
    const float m_use = mx == -INFINITY ? 0.0f : mx;
    alpha[r] = mx == row_max[r] ? 1.0f : fast_exp2((row_max[r] - m_use) * scale_log2);
    row_max[r] = mx;
    const float ms = m_use * scale_log2;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      s[j][e0] = fast_exp2(fmaf(s[j][e0], scale_log2, -ms));
      s[j][e1] = fast_exp2(fmaf(s[j][e1], scale_log2, -ms));
      if constexpr (!kNoSums) sum += s[j][e0] + s[j][e1];
    }
    if constexpr (!kNoSums) row_sum[r] = row_sum[r] * alpha[r] + sum;
  }
}

// True when some row of the warp must rescale its O (a warp-uniform branch around rescale_rows).
__device__ __forceinline__ bool warp_needs_rescale(const float (&alpha)[2]) {
  return __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f);
}

// O *= alpha per row: rows on the accumulators' M side (element e of a tile is row e / 2), or with
// kColumns on their N side (the decode kernel's O^T: row e % 2).
template <int kDT, bool kColumns = false>
__device__ __forceinline__ void rescale_rows(float (&o)[kDT][4], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < kDT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] *= alpha[kColumns ? (e & 1) : (e >> 1)];
}

// P (the exponentiated scores) as A fragments of m16n8k16 / wgmma k16: key chunk kk is n-tiles
// 2 kk and 2 kk + 1.
template <class T, int kNT>
__device__ __forceinline__ void pack_p(const float (&s)[kNT][4], uint32_t (&pf)[kNT / 2][4]) {
  using M = MmaType<T>;
#pragma unroll
  for (int kk = 0; kk < kNT / 2; ++kk) {
    pf[kk][0] = M::pack(s[2 * kk][0], s[2 * kk][1]);
    pf[kk][1] = M::pack(s[2 * kk][2], s[2 * kk][3]);
    pf[kk][2] = M::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pf[kk][3] = M::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// A finished row's log-sum-exp in natural-log units from its max in log2 units (m2) and its sum
// (l): -inf for a row that saw no key (l == 0), NaN for a NaN sum. The epilogues test l != 0, not
// l > 0, so that a row that saw a NaN score stays NaN instead of reading as empty.
__device__ __forceinline__ float row_lse(float m2, float l) {
  constexpr float kLn2 = 0.6931471805599453f;
  return l != 0.0f ? (m2 + __log2f(l)) * kLn2 : -INFINITY;
}

// Joins a learned sink logit (natural-log units; none when `sink` is null) into a finished row's
// softmax state: m2 is the row max in log2 units, l the row sum. Returns the factor O must take.
__device__ __forceinline__ float join_sink_logit(const float* sink, float& m2, float& l) {
  if (sink == nullptr) return 1.0f;
  const float s2 = *sink * 1.4426950408889634f;
  const float mn = fmaxf(m2, s2);
  if (mn == -INFINITY) {
    l = 0.0f;
    return 1.0f;
  }
  const float ofac = fast_exp2(m2 - mn);
  l = l * ofac + fast_exp2(s2 - mn);
  m2 = mn;
  return ofac;
}

// A row's sum over the 4 lanes (t4 = 0..3) that hold its columns, or (kColumns, softmax_update's
// other layout) over the 8 lanes (g = 0..7) that hold its keys.
template <bool kColumns = false>
__device__ __forceinline__ float row_total(float partial) {
#pragma unroll
  for (int off = kColumns ? 4 : 1; off < (kColumns ? 32 : 4); off *= 2)
    partial += __shfl_xor_sync(0xffffffffu, partial, off);
  return partial;
}

// A finished row's full sum, its learned sink logit and its LSE (written by the row's t4 == 0 lane
// when `rr` is inside the sequence); returns the factor that normalises the row's O.
__device__ __forceinline__ float finish_row(const FwdParams& p, float row_max, float partial_sum, int q0, int q_len,
                                            int rr, int h, int t4) {
  float l = row_total(partial_sum);
  float m2 = row_max == -INFINITY ? -INFINITY : row_max * p.scale_log2;  // log2 units
  const float ofac = join_sink_logit(p.sink_logits ? p.sink_logits + h : nullptr, m2, l);
  if (p.lse != nullptr && t4 == 0 && rr < q_len)
    p.lse[static_cast<int64_t>(q0 + rr) * p.num_heads + h] = row_lse(m2, l);
  return l != 0.0f ? ofac / l : 0.0f;
}

// finish_row for both of a thread's rows (`rr` and `rr + 8`) at once: the two quad sums interleaved,
// and 1 / l as a fast reciprocal (2 ulp; O leaves in 16 bits). finish_row's IEEE division took a
// branch region per row, and ptxas kept the rows one after the other (cuda_notes step 121).
__device__ __forceinline__ void finish_rows(const FwdParams& p, const float (&row_max)[2], const float (&row_sum)[2],
                                            int q0, int q_len, int rr, int h, int t4, float (&inv)[2]) {
  float l[2] = {row_sum[0], row_sum[1]}, m2[2], ofac[2];
#pragma unroll
  for (int off = 1; off < 4; off *= 2)
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] += __shfl_xor_sync(0xffffffffu, l[r], off);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    m2[r] = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * p.scale_log2;  // log2 units
    ofac[r] = join_sink_logit(p.sink_logits ? p.sink_logits + h : nullptr, m2[r], l[r]);
    inv[r] = l[r] != 0.0f ? __fdividef(ofac[r], l[r]) : 0.0f;
  }
  if (p.lse != nullptr && t4 == 0)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (rr + 8 * r < q_len)
        p.lse[static_cast<int64_t>(q0 + rr + 8 * r) * p.num_heads + h] = row_lse(m2[r], l[r]);
}

// The O stores of this thread's two rows (`row` and `row + 8`, relative to the sequence), each
// normalised by finish_row.
template <class T, int kDT>
__device__ __forceinline__ void store_output(const FwdParams& p, float (&o)[kDT][4], const float (&row_max)[2],
                                             const float (&row_sum)[2], int q0, int q_len, int row, int h, int t4) {
  using M = MmaType<T>;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int rr = row + r * 8;
    const float inv = finish_row(p, row_max[r], row_sum[r], q0, q_len, rr, h, t4);
    if (rr < q_len) {
      T* orow = static_cast<T*>(p.o) + (q0 + rr) * p.o_row_stride + h * p.o_head_stride;
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        if (j * 8 >= p.d_v) break;  // tile columns past the real head dim
        const uint32_t v = M::pack(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t4) = v;
      }
    }
  }
}

// Split-KV epilogue: this split's O normalised over its own keys (f32) and its LSE (natural log,
// no sink logit: the merge joins it once) into the partial buffers (FwdParams::part_o/part_lse).
template <int kDT>
__device__ __forceinline__ void store_partial(const FwdParams& p, float (&o)[kDT][4], const float (&row_max)[2],
                                              const float (&row_sum)[2], int b, int q_len, int row, int h, int split,
                                              int t4) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_total(row_sum[r]);
    const int rr = row + r * 8;
    if (rr < q_len) {
      const int64_t part = ((static_cast<int64_t>(b) * p.max_q_len + rr) * p.num_heads + h) * p.num_splits + split;
      const float inv = l != 0.0f ? 1.0f / l : 0.0f;
      float* dst = p.part_o + part * p.d_v;
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        if (j * 8 >= p.d_v) break;
        *reinterpret_cast<float2*>(dst + j * 8 + 2 * t4) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
      }
      if (t4 == 0) {
        const float m2 = row_max[r] * p.scale_log2;
        p.part_lse[part] = row_lse(m2, l);
      }
    }
  }
}

}  // namespace escala::attn::cuda
