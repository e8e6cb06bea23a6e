// The Hopper (sm_90a) prefill kernel, FlashAttention-3 design (first version): a persistent grid
// for unmasked shapes (one CTA per SM looping over (sequence, head, 128-query tile) items; one item
// per CTA under causal/window masks, longest tiles first)
// of three warpgroups. Warpgroup 0 is the producer: one thread issues TMA loads of Q and of the K/V
// tiles into a kStages-deep shared-memory ring, completed on mbarriers; it gives its registers
// away with setmaxnreg. Warpgroups 1 and 2 are consumers, 64 query rows each: S = Q Kᵀ with wgmma
// (both operands in shared memory, 128-byte swizzle), online softmax on the accumulators in
// registers, O += P V with wgmma (P from registers, V N-major in shared memory), then release the
// stage; the softmax of tile i overlaps P V of tile i-1, and the epilogue of one item overlaps the
// loads of the next, and the two consumers take turns issuing GEMMs (ping-pong, named barriers).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/fwd_params.h"
#include "attention/cuda/online_softmax.cuh"
#include "attention/cuda/sm80/ptx.cuh"
#include "attention/cuda/sm90/ptx90.cuh"
#include "attention/cuda/sm90/wgmma_ops.cuh"
#include "attention/cuda/tile_range.cuh"

namespace escala::attn::cuda {

template <class T_, int D_, int BN_, int Stages_>
struct Sm90Config {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int BM = 128;  // two consumer warpgroups x 64 rows
  static constexpr int BN = BN_;
  static constexpr int kStages = Stages_;
  static constexpr int kThreads = 384;
  static constexpr int kChunks = D / 64;  // 128-byte column blocks (the TMA box / swizzle width)
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kTileBytes = BN * D * 2;
  static constexpr int kBarOffset = kQBytes + 2 * kStages * kTileBytes;
  static constexpr int kSmemBytes = kBarOffset + 256 + 1024;  // barriers + alignment slack
  static_assert(8 * (2 + 4 * Stages_) <= 256, "barrier area");
  static_assert(D % 64 == 0 && BN % 16 == 0, "tile shape");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_sm90_kernel(const FwdParams p, const __grid_constant__ CUtensorMap tm_q,
                    const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using T = typename Cfg::T;
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, S = Cfg::kStages;
  constexpr int kNT = BN / 8, kDT = D / 8;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + Cfg::kQBytes;                 // stage s at sK + s * kTileBytes
  const uint32_t sV = sK + S * Cfg::kTileBytes;
  // Barriers: q_full, q_empty, full_k[S], empty_k[S], full_v[S], empty_v[S].
  const uint32_t bars = base + Cfg::kBarOffset;
  const uint32_t q_full = bars, q_empty = bars + 8u;
  auto full_k = [&](int s) { return bars + 8u * (2 + s); };
  auto empty_k = [&](int s) { return bars + 8u * (2 + S + s); };
  auto full_v = [&](int s) { return bars + 8u * (2 + 2 * S + s); };
  auto empty_v = [&](int s) { return bars + 8u * (2 + 3 * S + s); };

  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, 256);
    for (int s = 0; s < S; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), 256);
      mbar_init(empty_v(s), 256);
    }
    mbar_init_fence();
  }
  __syncthreads();

  // Tile scheduler: work item w = (sequence, head, query tile from the last), so within each head
  // the longest causal tiles come first; CTA c takes items c, c + grid, ... (one item per CTA when
  // the launcher sizes the grid to the item count). Producer and consumers walk the same list and
  // skip the same empty items, so the ring's stage/phase counters (`kv_iter`, and `q_iter` for the
  // Q buffer) agree between them.
  const int num_items = p.num_m_blocks * p.batch * p.num_heads;
  struct Item {
    int h, q0, q_len, m0, kv0, kv_len;
    int64_t shift, qp_min, qp_max;
    TileRange range;
    int n_tiles;
  };
  auto decode = [&](int w, Item& it) {
    // Query tiles of one (sequence, head) are consecutive, so the CTAs running at one time share
    // a few heads' K/V in L2 (head-fastest order measured 10-25% slower: K/V spilled to HBM).
    const int m_block = p.num_m_blocks - 1 - w % p.num_m_blocks;
    it.h = (w / p.num_m_blocks) % p.num_heads;
    const int b = w / (p.num_m_blocks * p.num_heads);
    it.q0 = p.cu_seqlens_q[b];
    it.q_len = p.cu_seqlens_q[b + 1] - it.q0;
    it.m0 = m_block * BM;
    if (it.m0 >= it.q_len) return false;
    it.kv0 = p.cu_seqlens_k[b];
    it.kv_len = p.cu_seqlens_k[b + 1] - it.kv0;
    it.shift = static_cast<int64_t>(it.kv_len) - it.q_len;
    it.qp_min = it.m0 + it.shift;
    it.qp_max = (it.m0 + BM < it.q_len ? it.m0 + BM : it.q_len) - 1 + it.shift;
    it.range = tile_range(p.mask, it.qp_min, it.qp_max, it.kv_len, BN);
    it.n_tiles = it.range.count();
    return true;
  };

  const int wg = tid / 128;
  if (wg == 0) {
    // Producer.
    setmaxnreg_dec<24>();
    if (tid == 0) {
      int kv_iter = 0, q_iter = 0;
      for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
        Item it;
        if (!decode(w, it) || it.n_tiles == 0) continue;
        const int hk = it.h / p.group;
        mbar_wait(q_empty, (q_iter & 1) ^ 1);
        mbar_arrive_expect_tx(q_full, Cfg::kQBytes);
#pragma unroll
        for (int c = 0; c < Cfg::kChunks; ++c)
          tma_load_3d(sQ + c * BM * 128, &tm_q, c * 64, it.h, it.q0 + it.m0, q_full);
        ++q_iter;
        for (int i = 0; i < it.n_tiles; ++i, ++kv_iter) {
          const int s = kv_iter % S;
          const uint32_t phase = (kv_iter / S) & 1;
          const int row = it.kv0 + it.range.at(it.n_tiles - 1 - i) * BN;
          mbar_wait(empty_k(s), phase ^ 1);
          mbar_arrive_expect_tx(full_k(s), Cfg::kTileBytes);
#pragma unroll
          for (int c = 0; c < Cfg::kChunks; ++c)
            tma_load_3d(sK + s * Cfg::kTileBytes + c * BN * 128, &tm_k, c * 64, hk, row, full_k(s));
          mbar_wait(empty_v(s), phase ^ 1);
          mbar_arrive_expect_tx(full_v(s), Cfg::kTileBytes);
#pragma unroll
          for (int c = 0; c < Cfg::kChunks; ++c)
            tma_load_3d(sV + s * Cfg::kTileBytes + c * BN * 128, &tm_v, c * 64, hk, row, full_v(s));
        }
      }
    }
    return;
  }

  // Consumers. Software pipeline inside each warpgroup: Q Kᵀ of tile i and P V of tile i-1 are
  // issued together, and the softmax of tile i runs while P V of tile i-1 is still on the tensor
  // cores; O is rescaled once that product has landed.
  setmaxnreg_inc<240>();
  const int cw = wg - 1;  // consumer warpgroup: rows 64 cw .. 64 cw + 63 of the tile
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int row_in_tile = 64 * cw + 16 * warp + g;  // this thread's rows: +0 and +8

  float o_acc[kDT][4];
  float row_max[2], row_sum[2];
  float sacc[kNT][4];
  uint32_t pf[kNT / 2][4];

  // Descriptors are linear in the start address (its field is address >> 4, far from overflowing),
  // so each wgmma's descriptor is a base plus a compile-time offset.
  const uint64_t dq0 = smem_desc_sw128(sQ + cw * 64 * 128, 16, 1024);
  const uint64_t dk0 = smem_desc_sw128(sK, 16, 1024);
  const uint64_t dv0 = smem_desc_sw128(sV, BN * 128, 1024);
  auto issue_qk = [&](int s) {
    const uint64_t dk = dk0 + static_cast<uint64_t>(s * (Cfg::kTileBytes >> 4));
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      // k16 step kk: 128-byte column block kk / 4, 32 bytes per step inside the swizzled row.
      wgmma_ss(sacc, dq0 + static_cast<uint64_t>(((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
               dk + static_cast<uint64_t>(((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0 ? 1 : 0,
               static_cast<const T*>(nullptr));
    }
    wgmma_commit();
  };
  auto issue_pv = [&](int s) {
    const uint64_t dv = dv0 + static_cast<uint64_t>(s * (Cfg::kTileBytes >> 4));
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wgmma_rs(o_acc, pf[kk], dv + static_cast<uint64_t>((kk * 16 * 128) >> 4), static_cast<const T*>(nullptr));
    wgmma_commit();
  };

  // Ping-pong: the two consumer warpgroups take turns issuing their GEMMs (named barriers 1 and
  // 2), so one warpgroup's softmax runs while the other's GEMMs occupy the tensor cores. Both walk
  // the same items, so both have the same number of issue points; warpgroup 0 goes first without
  // waiting and absorbs warpgroup 1's last hand-over after the loop.
  bool first_turn = true;
  auto take_turn = [&] {
    if (cw == 0 && first_turn) {
      first_turn = false;
      return;
    }
    first_turn = false;
    if (cw == 0) named_bar_sync<1, 256>();
    else named_bar_sync<2, 256>();
  };
  auto pass_turn = [&] {
    if (cw == 0) named_bar_arrive<2, 256>();
    else named_bar_arrive<1, 256>();
  };

  int kv_iter = 0, q_iter = 0;
  for (int w = blockIdx.x; w < num_items; w += gridDim.x) {
    Item it;
    if (!decode(w, it)) continue;
    const int n_tiles = it.n_tiles;
    const int64_t qpos0 = it.m0 + row_in_tile + it.shift;
#pragma unroll
    for (int j = 0; j < kDT; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
    auto softmax = [&](int i, float (&alpha)[2]) {
      const int k_lo = it.range.at(n_tiles - 1 - i) * BN;
      transform_and_mask(sacc, p, !tile_fully_visible(p.mask, it.qp_min, it.qp_max, k_lo, BN, it.kv_len), qpos0,
                         k_lo, it.kv_len, t4);
      softmax_update(sacc, row_max, row_sum, p.scale_log2, alpha);
    };

    if (n_tiles > 0) {
      mbar_wait(q_full, q_iter & 1);
      // Tile 0: Q Kᵀ alone.
      const int s0 = kv_iter % S;
      mbar_wait(full_k(s0), (kv_iter / S) & 1);
      take_turn();
      wgmma_fence();
      issue_qk(s0);
      pass_turn();
      wgmma_wait<0>();
      reg_fence(sacc);
      mbar_arrive(empty_k(s0));
      if (n_tiles == 1) mbar_arrive(q_empty);
      float alpha[2];
      softmax(0, alpha);
      pack_p<T>(sacc, pf);
      for (int i = 1; i < n_tiles; ++i) {
        const int cur = kv_iter + i, prev = cur - 1;
        const int s = cur % S, sp = prev % S;
        mbar_wait(full_k(s), (cur / S) & 1);
        mbar_wait(full_v(sp), (prev / S) & 1);
        reg_fence(o_acc);
        take_turn();
        wgmma_fence();
        issue_qk(s);
        issue_pv(sp);
        pass_turn();
        wgmma_wait<1>();  // Q Kᵀ of tile i has landed
        reg_fence(sacc);
        mbar_arrive(empty_k(s));
        if (i == n_tiles - 1) mbar_arrive(q_empty);  // the Q buffer may take the next item's Q
        softmax(i, alpha);
        wgmma_wait<0>();  // P V of tile i-1 has landed
        reg_fence(o_acc);
        reg_fence_u32(pf);
        mbar_arrive(empty_v(sp));
        rescale_rows(o_acc, alpha);
        pack_p<T>(sacc, pf);
      }
      const int last = kv_iter + n_tiles - 1, sl = last % S;
      mbar_wait(full_v(sl), (last / S) & 1);
      reg_fence(o_acc);
      take_turn();
      wgmma_fence();
      issue_pv(sl);
      pass_turn();
      wgmma_wait<0>();
      reg_fence(o_acc);
      reg_fence_u32(pf);
      mbar_arrive(empty_v(sl));
      kv_iter += n_tiles;
      ++q_iter;
    }
    store_output<T>(p, o_acc, row_max, row_sum, it.q0, it.q_len, it.m0 + row_in_tile, it.h, t4);
  }
  if (cw == 0 && !first_turn) named_bar_sync<1, 256>();  // warpgroup 1's last hand-over
#endif
}

}  // namespace escala::attn::cuda
