// sm_90a prefill kernel instantiations for head dim 64 (bf16 and fp16).
#include <algorithm>

#include "attention/cuda/sm90/fwd_launch.cuh"
#include "attention/cuda/tile_range.cuh"

namespace escala::attn::cuda {
namespace {

// Query rows per tile for dense inputs: 192 (three consumer warpgroups, FlashAttention-3's d = 64
// tile) where its higher throughput pays for its padding rows and its wider diagonal. The cost of
// a tile height is the makespan of its items on the persistent grid, in 128-row x 128-key tile
// times: the larger of the total work over the SMs and the longest item. A 192-row tile takes
// 192 / 128 / kGain of that time. Under sustained load (graph timing, power-capped clocks; H200,
// session 13) the 192-row kernel did 6-8% more row x key tiles per second than the 128-row one:
// S = 1k non-causal 128 rows 6% faster (731 against 775 us, 192 rows visit 12.5% more tiles),
// S = 4k non-causal 192 rows 4% faster, causal 128 rows 3% faster, S = 16k 192 rows 4-7% faster,
// GQA 32/8 at 8k 6%. Every choice is right for kGain in (1.031, 1.091). (Session 7, each call
// timed alone at a cool card's clocks, had measured 12-16%.)
int dense_tile_rows(const FwdParams& p, const Sm90Extents& e) {
  if (e.tile_rows != 0) return e.tile_rows;
  const int64_t shift = int64_t(e.max_kv_len) - e.max_q_len;
  constexpr double kGain = 1.06;
  auto makespan = [&](int bm) {
    int64_t tiles = 0, longest = 0;
    for (int m0 = 0; m0 < e.max_q_len; m0 += bm) {
      const int64_t qp_max = std::min(m0 + bm, e.max_q_len) - 1 + shift;
      const int64_t n = tile_range(p.mask, m0 + shift, qp_max, e.max_kv_len, 128).count();
      tiles += n, longest = std::max(longest, n);
    }
    const double per_tile = bm == 192 ? 192.0 / 128.0 / kGain : 1.0;
    return std::max(double(tiles) * p.batch * p.num_heads / e.sms, double(longest)) * per_tile;
  };
  return makespan(192) < makespan(128) ? 192 : 128;
}

template <class T>
cudaError_t launch_hd64(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  using Rows128 = Sm90Config<T, 64, 64, 128, 2>;
  using Rows192 = Sm90Config<T, 64, 64, 128, 2, 3>;
  const bool dense = p.page_size == 0 && p.num_splits <= 1;
  if (dense && dense_tile_rows(p, e) == 192) return launch_fwd_sm90_variant<Rows192, false>(p, bf16, e, stream);
  return launch_fwd_sm90<Rows128>(p, bf16, e, stream);
}

}  // namespace

cudaError_t run_fwd_sm90_hd64(const FwdParams& p, bool bf16, const Sm90Extents& e, cudaStream_t stream) {
  return bf16 ? launch_hd64<__nv_bfloat16>(p, bf16, e, stream) : launch_hd64<__half>(p, bf16, e, stream);
}
}  // namespace escala::attn::cuda
