// The Hopper (sm_90a) prefill kernel, FlashAttention-3 design (first version): one CTA per
// (128-query tile, head, sequence) with three warpgroups. Warpgroup 0 is the producer: one thread
// issues TMA loads of Q and of the K/V tiles into a kStages-deep shared-memory ring, completed on
// mbarriers; it gives its registers away with setmaxnreg. Warpgroups 1 and 2 are consumers, 64
// query rows each: S = Q Kᵀ with wgmma (both operands in shared memory, 128-byte swizzle), online
// softmax on the accumulators in registers, O += P V with wgmma (P from registers, V N-major in
// shared memory), then release the stage; the softmax of tile i overlaps P V of tile i-1. Not yet:
// explicit ping-pong between the consumers (named barriers), a persistent tile scheduler.
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
  const uint32_t bars = base + Cfg::kBarOffset;           // q, full_k[S], empty_k[S], full_v[S], empty_v[S]
  const uint32_t bar_q = bars;
  auto full_k = [&](int s) { return bars + 8u * (1 + s); };
  auto empty_k = [&](int s) { return bars + 8u * (1 + S + s); };
  auto full_v = [&](int s) { return bars + 8u * (1 + 2 * S + s); };
  auto empty_v = [&](int s) { return bars + 8u * (1 + 3 * S + s); };

  const int b = blockIdx.z, h = blockIdx.y;
  const int m_block = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int q0 = p.cu_seqlens_q[b], q_len = p.cu_seqlens_q[b + 1] - q0;
  const int m0 = m_block * BM;
  if (m0 >= q_len) return;
  const int kv0 = p.cu_seqlens_k[b], kv_len = p.cu_seqlens_k[b + 1] - kv0;
  const int hk = h / p.group;
  const int64_t shift = static_cast<int64_t>(kv_len) - q_len;
  const int64_t qp_min = m0 + shift;
  const int64_t qp_max = (m0 + BM < q_len ? m0 + BM : q_len) - 1 + shift;
  const TileRange range = tile_range(p.mask, qp_min, qp_max, kv_len, BN);
  const int n_tiles = range.count();

  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < S; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), 256);
      mbar_init(empty_v(s), 256);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = tid / 128;
  if (wg == 0) {
    // Producer.
    setmaxnreg_dec<24>();
    if (tid == 0 && n_tiles > 0) {
      mbar_arrive_expect_tx(bar_q, Cfg::kQBytes);
#pragma unroll
      for (int c = 0; c < Cfg::kChunks; ++c) tma_load_3d(sQ + c * BM * 128, &tm_q, c * 64, h, q0 + m0, bar_q);
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % S;
        const uint32_t phase = (it / S) & 1;
        const int row = kv0 + range.at(n_tiles - 1 - it) * BN;
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
    return;
  }

  // Consumers. Software pipeline inside each warpgroup: Q Kᵀ of tile i and P V of tile i-1 are
  // issued together, and the softmax of tile i runs while P V of tile i-1 is still on the tensor
  // cores; O is rescaled once that product has landed.
  setmaxnreg_inc<240>();
  const int cw = wg - 1;               // consumer warpgroup: rows 64 cw .. 64 cw + 63 of the tile
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int row_base = m0 + 64 * cw + 16 * warp + g;  // this thread's rows: row_base, row_base + 8
  const int64_t qpos0 = row_base + shift;

  float o_acc[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
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
  auto softmax = [&](int it, float (&alpha)[2]) {
    const int k_lo = range.at(n_tiles - 1 - it) * BN;
    transform_and_mask(sacc, p, !tile_fully_visible(p.mask, qp_min, qp_max, k_lo, BN, kv_len), qpos0, k_lo,
                       kv_len, t4);
    softmax_update(sacc, row_max, row_sum, p.scale_log2, alpha);
  };

  if (n_tiles > 0) {
    mbar_wait(bar_q, 0);
    // Tile 0: Q Kᵀ alone.
    mbar_wait(full_k(0), 0);
    wgmma_fence();
    issue_qk(0);
    wgmma_wait<0>();
    reg_fence(sacc);
    mbar_arrive(empty_k(0));
    float alpha[2];
    softmax(0, alpha);
    pack_p<T>(sacc, pf);
  }
  for (int it = 1; it < n_tiles; ++it) {
    const int s = it % S, sp = (it - 1) % S;
    mbar_wait(full_k(s), (it / S) & 1);
    mbar_wait(full_v(sp), ((it - 1) / S) & 1);
    reg_fence(o_acc);
    wgmma_fence();
    issue_qk(s);
    issue_pv(sp);
    wgmma_wait<1>();  // Q Kᵀ of tile it has landed
    reg_fence(sacc);
    mbar_arrive(empty_k(s));
    float alpha[2];
    softmax(it, alpha);
    wgmma_wait<0>();  // P V of tile it-1 has landed
    reg_fence(o_acc);
    reg_fence_u32(pf);
    mbar_arrive(empty_v(sp));
    rescale_rows(o_acc, alpha);
    pack_p<T>(sacc, pf);
  }
  if (n_tiles > 0) {
    const int sp = (n_tiles - 1) % S;
    mbar_wait(full_v(sp), ((n_tiles - 1) / S) & 1);
    reg_fence(o_acc);
    wgmma_fence();
    issue_pv(sp);
    wgmma_wait<0>();
    reg_fence(o_acc);
    reg_fence_u32(pf);
    mbar_arrive(empty_v(sp));
  }
  store_output<T>(p, o_acc, row_max, row_sum, q0, q_len, row_base, h, t4);
#endif
}

}  // namespace escala::attn::cuda
