// Host side of the CUDA decode kernels: one launcher per head dim (each in its own .cu file so the
// instantiations compile in parallel), and the split-count / workspace helpers.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "attention/cuda/decode/decode_params.h"

namespace escala::attn::cuda {

// Launches the decode kernel (grid num_splits x (kv heads * row tiles) x batch) and, when
// num_splits > 1, the merge kernel. `bf16`: q/o dtype (else f16). Returns the launch error.
// `maps`: the K and V tensor maps when p.use_tma (else unused).
struct KvMaps {
  CUtensorMap k, v;
};
cudaError_t run_decode_hd64(const DecodeParams& p, const KvMaps& maps, bool bf16, KvFormat f, cudaStream_t stream);
cudaError_t run_decode_hd128(const DecodeParams& p, const KvMaps& maps, bool bf16, KvFormat f, cudaStream_t stream);
cudaError_t run_decode_hd256(const DecodeParams& p, const KvMaps& maps, bool bf16, KvFormat f, cudaStream_t stream);

// The merge kernel alone over p.part_o / p.part_lse (p.num_splits partials of head dim D = d_v):
// for the sm_90 prefill kernel's split-KV mode.
cudaError_t run_merge_hd64(const DecodeParams& p, bool bf16, cudaStream_t stream);
cudaError_t run_merge_hd128(const DecodeParams& p, bool bf16, cudaStream_t stream);
cudaError_t run_merge_hd256(const DecodeParams& p, bool bf16, cudaStream_t stream);

// A 3-D map {d, kv head, row} over K or V with boxes of 128 bytes x 1 x box_rows, 128-byte swizzle
// (sm90/tensor_map.cu). cudaErrorNotSupported without the driver's encoder.
cudaError_t make_kv_box_map(CUtensorMap* map, const void* base, int elem_bytes, int d, int heads, int64_t rows,
                            int64_t head_stride, int64_t row_stride, int box_rows);

// CTAs of the decode kernel with `rows_per_cta` rows that fit on one SM at once (for the split
// heuristic).
int decode_ctas_per_sm_hd64(KvFormat f, int rows_per_cta);
int decode_ctas_per_sm_hd128(KvFormat f, int rows_per_cta);
int decode_ctas_per_sm_hd256(KvFormat f, int rows_per_cta);

// Rows (query token x head of a kv head's group) per CTA: 64 when a run has more than 16; 8, as the
// MMAs' N side, for runs of at most 8 (plain GQA decode: half the MMAs of 16 rows); else 16.
inline int decode_rows_per_cta(int max_q_len, int group) {
  const int rows = max_q_len * group;
  return rows > 16 ? 64 : rows <= 8 ? 8 : 16;
}

}  // namespace escala::attn::cuda
