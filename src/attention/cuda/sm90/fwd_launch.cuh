// Launches one instantiation of the sm_90a prefill kernel (included by the per-head-dim .cu files).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "attention/cuda/sm90/fwd_kernel.cuh"
#include "attention/cuda/sm90/fwd_sm90.h"

namespace escala::attn::cuda {

// Paged K/V or split-KV take the kernel's kSplitPaged variant; every other call is dense (the
// per-call tile shapes of tile_rows.h apply to dense calls only). page_size >= 0 (validated).
inline bool split_paged_call(const FwdParams& p) { return p.page_size > 0 || p.num_splits > 1; }

// One variant (dense, or paged/split-KV) of the kernel for config Cfg.
template <class Cfg, bool kSplitPaged>
cudaError_t launch_fwd_sm90_variant(FwdParams p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  auto kernel = fwd_sm90_kernel<Cfg, kSplitPaged>;
  if constexpr (Cfg::kPlainVariant && !kSplitPaged)
    if (p.mask.num_sinks == 0 && !(p.softcap > 0.0f)) kernel = fwd_sm90_kernel<Cfg, false, false>;
  // A build without sm_90a code (e.g. CMAKE_CUDA_ARCHITECTURES=80) has an empty body here: refuse,
  // so that the dispatcher falls back to the sm_80 kernel.
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  if (attr.binaryVersion < 90) return cudaErrorNotSupported;
  CUtensorMap tq, tk, tv, tk_run, tv_run, to;
  // The maps span the real head dims: TMA fills the columns past them with zeros.
  // Paged K/V: the maps span the pool as rows (pages stacked row after row), boxes of kv_box_rows.
  const bool paged = p.page_size > 0;
  if (paged && (p.kv_box_rows < 16 || Cfg::BN % p.kv_box_rows != 0 || p.page_size % p.kv_box_rows != 0))
    return cudaErrorInvalidValue;
  const int64_t kv_rows = paged ? int64_t(INT32_MAX) : e.total_kv;
  const int kv_box = paged ? p.kv_box_rows : Cfg::BN;
  err = make_tensor_map(&tq, p.q, bf16, p.d_qk, p.num_heads, e.total_q, p.q_head_stride, p.q_row_stride, Cfg::BM);
  if (err == cudaSuccess)
    err = make_tensor_map(&tk, p.k, bf16, p.d_qk, e.num_kv_heads, kv_rows, p.k_head_stride, p.k_row_stride, kv_box);
  if (err == cudaSuccess)
    err = make_tensor_map(&tv, p.v, bf16, p.d_v, e.num_kv_heads, kv_rows, p.v_head_stride, p.v_row_stride, kv_box);
  // Paged: BN-row boxes too, for tiles whose pages follow each other in the pool.
  tk_run = tk, tv_run = tv;
  if (err == cudaSuccess && paged && kv_box != Cfg::BN)
    err = make_tensor_map(&tk_run, p.k, bf16, p.d_qk, e.num_kv_heads, kv_rows, p.k_head_stride, p.k_row_stride, Cfg::BN);
  if (err == cudaSuccess && paged && kv_box != Cfg::BN)
    err = make_tensor_map(&tv_run, p.v, bf16, p.d_v, e.num_kv_heads, kv_rows, p.v_head_stride, p.v_row_stride, Cfg::BN);
  // Dense: the spare maps read the narrow sink tile (Cfg::kNarrowSinks).
  p.narrow_sinks = 0;
  if constexpr (Cfg::kNarrowSinks && !kSplitPaged) {
    if (err == cudaSuccess && p.mask.num_sinks > 0 && p.mask.num_sinks <= Cfg::kSinkKeys) {
      err = make_tensor_map(&tk_run, p.k, bf16, p.d_qk, e.num_kv_heads, kv_rows, p.k_head_stride, p.k_row_stride,
                            Cfg::kSinkKeys);
      if (err == cudaSuccess)
        err = make_tensor_map(&tv_run, p.v, bf16, p.d_v, e.num_kv_heads, kv_rows, p.v_head_stride, p.v_row_stride,
                              Cfg::kSinkKeys);
      p.narrow_sinks = 1;
    }
  }
  if (err != cudaSuccess) return err;
  // O's map for the epilogue's bulk stores (16-row boxes: one warp's slice); strides that TMA
  // cannot take (not multiples of 16 bytes) keep the copy.
  p.o_tma = (Cfg::kStagedO || Cfg::kOInVBulkStore) &&
            make_tensor_map(&to, p.o, bf16, p.d_v, p.num_heads, e.total_q, p.o_head_stride, p.o_row_stride, 16) ==
                cudaSuccess;
  if (!p.o_tma) to = tq;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  p.num_m_blocks = (e.max_q_len + Cfg::BM - 1) / Cfg::BM;
  const int64_t bh = static_cast<int64_t>(p.batch) * p.num_heads;
  const int64_t items = p.num_m_blocks * bh * p.num_splits;
  if (items > INT32_MAX - 4096) return cudaErrorInvalidValue;
  // Sections of (sequence, head) pairs whose K/V (shared by a GQA group) take at most ~24 MB, half
  // the H200's L2: the CTAs running at one time then reread K/V from L2, not HBM (measured when
  // every CTA worked on a different head: 10-25% slower at S = 4k).
  // Where every query tile visits all of its sequence's keys (no causal mask, no window) there is no
  // longest item to put first: one pair per section, its query tiles consecutive, so that the CTAs
  // running at one time share the K/V of one or two heads (session 21, against 24 MB: non-causal
  // S = 1k d = 64 / 128 / 256 1.5 / 4.4 / 6.1% faster, S4k d128 3.0%, S16k d128 1.4%; the causal
  // shapes were 1-3% slower that way, and at 3 or 6 MB too).
  const bool uniform_items = !p.mask.causal && p.mask.window_left < 0 && p.mask.window_right < 0;
  const double kv_bytes = static_cast<double>(e.max_kv_len > 0 ? e.max_kv_len : 1) * (p.d_qk + p.d_v) * 2.0 / p.group;
  const double l2_pairs = 24.0 * (1 << 20) / kv_bytes;  // pairs whose K/V take ~24 MB
  p.sched_section = uniform_items ? 1 : static_cast<int32_t>(std::clamp<double>(l2_pairs, 1.0, static_cast<double>(bh)));
  // Uniform items whose longest sequence ends in a partial query tile (the 192-row d = 64 kernel
  // at S = 1k: 5 1/3 tiles): that tile is the shortest item of its pair (0.44 of a full one,
  // cuda_notes step 135), and in pair order the run ends on full items, finishing unevenly over
  // the CTAs. So the last pairs' partial tiles go to the end: as many as fit ~12 MB (their K/V
  // are read again, from L2 if still there), at most one per SM. The dense 192-row kernel only
  // (kTailOrder). H200, session 42, d64 S1k full (256 KB per pair), time against no tail: 16 / 32 /
  // 48 / 64 / 96 / 132 pairs -0.1 / -0.4 / -0.7..-0.9 / -0.5 / -0.5 / -0.2%; S4k full -0.4%.
  p.sched_tail = 0;
  if (Cfg::kConsumers == 3 && !kSplitPaged && uniform_items && p.num_m_blocks >= 2 && e.max_q_len % Cfg::BM != 0) {
    const int64_t automatic = std::min<int64_t>(e.sms, static_cast<int64_t>(std::max(1.0, l2_pairs / 2)));
    p.sched_tail = static_cast<int32_t>(std::min<int64_t>(bh, e.tail_pairs >= 0 ? e.tail_pairs : automatic));
  }
  // Persistent grid: one CTA per SM (the kernel takes all of an SM's registers); each CTA takes
  // its first item by its index and the next ones from the counter (zero here, and left zero).
  const int64_t ctas = std::min<int64_t>(items, e.sms);
  const dim3 grid(static_cast<unsigned>(ctas));
#ifdef ESCALA_SM90_TRACE
  sm90_trace::clear();
#endif
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, tq, tk, tv, tk_run, tv_run, to);
#ifdef ESCALA_SM90_TRACE
  sm90_trace::dump();
#endif
  return cudaGetLastError();
}

// Dense inputs run the plain variant; paged K/V or split-KV the kSplitPaged one, instantiated for
// the square head dims the merge kernel has (64, 128, 256); the dispatcher sends nothing else there.
template <class Cfg>
cudaError_t launch_fwd_sm90(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  constexpr bool kHasSplitPaged = Cfg::DQK == Cfg::DV && Cfg::DQK != 192;
  if (split_paged_call(p)) {
    if constexpr (kHasSplitPaged) {
      static_assert(Cfg::kConsumers == 2, "the paged/split variant's register split assumes two consumers");
      return launch_fwd_sm90_variant<Cfg, true>(p, bf16, e, stream);
    } else {
      return cudaErrorInvalidValue;
    }
  }
  return launch_fwd_sm90_variant<Cfg, false>(p, bf16, e, stream);
}

}  // namespace escala::attn::cuda
