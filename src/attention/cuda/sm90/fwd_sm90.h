// Entry points of the sm_90a prefill kernel, one per head dim (bf16 selects bf16, else fp16),
// and the TMA tensor-map helper they share. Host code.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/fwd_params.h"

namespace escala::attn::cuda {

struct Sm90Extents {
  int max_q_len = 0;
  int max_kv_len = 0;
  int64_t total_q = 0;
  int64_t total_kv = 0;
  int num_kv_heads = 0;
  // Head dims <= 64, dense inputs: query rows per tile, 128 or 192 (0: chosen by a cost model).
  int tile_rows = 0;
  // Pairs whose partial last query tile goes to the end of the work order (-1: the launcher's
  // choice; FwdParams::sched_tail).
  int tail_pairs = -1;
  int sms = 1;  // the device's SM count: the persistent grid's size
};

// A 3-D tensor map over [rows][heads][d] (strides in elements), box [box_rows][1][64] with the
// 128-byte swizzle the kernel's wgmma descriptors expect.
cudaError_t make_tensor_map(CUtensorMap* map, const void* base, bool bf16, int d, int heads, int64_t rows,
                            int64_t head_stride, int64_t row_stride, int box_rows);

// Key-tile rows of the kernel for tile widths (wq, wv) (the paged mode's boxes must divide it).
inline int sm90_block_n(int wq, int wv) {
  if (wq == 192 && wv == 128) return 128;
  const int w = wq > wv ? wq : wv;
  return w <= 128 ? 128 : (w == 192 ? 112 : 80);
}

// Tile widths (d_qk, d_v) with a kernel: (64, 64), (128, 128), (192, 192), (256, 256), (192, 128).
// p.tile_counter must point at two device int32s, both zero, that no other launch uses concurrently;
// the kernel leaves them zero.
cudaError_t run_fwd_sm90_hd64(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream);
cudaError_t run_fwd_sm90_hd128(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream);
cudaError_t run_fwd_sm90_hd192(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream);
cudaError_t run_fwd_sm90_hd256(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream);
cudaError_t run_fwd_sm90_hd192_128(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream);

}  // namespace escala::attn::cuda
