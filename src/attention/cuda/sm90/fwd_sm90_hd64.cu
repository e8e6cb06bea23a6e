// sm_90a prefill kernel instantiations for head dim 64 (bf16 and fp16).
// The 128-row kernel's key-tile loop at 80 mod 128 bytes (three 16-byte instructions once per CTA,
// fwd_kernel.cuh) instead of 32: measured 0.2-0.6% faster on every d = 64 shape, never slower
// (sessions 39 and 41, cuda_notes step 174). Re-choose it with any change to this file's kernels.
#define ESCALA_SM90_LOOP_PAD 3
#include "attention/cuda/sm90/fwd_launch.cuh"
#include "attention/cuda/sm90/tile_rows.h"

namespace escala::attn::cuda {
namespace {

// Query rows per tile for dense inputs (tile_rows.h), unless the caller chose.
int dense_tile_rows(const FwdParams& p, const Sm90Extents& e) {
  if (e.tile_rows != 0) return e.tile_rows;
  return dense_tile_rows_d64(p.mask, e.max_q_len, e.max_kv_len, p.batch, p.num_heads, e.sms);
}

template <class T>
cudaError_t launch_hd64(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  using Rows128 = Sm90Config<T, 64, 64, 128, 2>;
  using Rows192 = Sm90Config<T, 64, 64, 128, 2, 3>;
  const bool dense = !split_paged_call(p);
  if (dense && dense_tile_rows(p, e) == 192) return launch_fwd_sm90_variant<Rows192, false>(p, bf16, e, stream);
  return launch_fwd_sm90<Rows128>(p, bf16, e, stream);
}

}  // namespace

cudaError_t run_fwd_sm90_hd64(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  return bf16 ? launch_hd64<__nv_bfloat16>(p, bf16, e, stream) : launch_hd64<__half>(p, bf16, e, stream);
}
}  // namespace escala::attn::cuda
