// The Hopper (sm_90a) prefill kernel, FlashAttention-3 design (first version): one CTA per
// (128-query tile, head, sequence) with three warpgroups. Warpgroup 0 is the producer: one thread
// issues TMA loads of Q and of the K/V tiles into a kStages-deep shared-memory ring, completed on
// mbarriers; it gives its registers away with setmaxnreg. Warpgroups 1 and 2 are consumers, 64
// query rows each: S = Q Kᵀ with wgmma (both operands in shared memory, 128-byte swizzle), online
// softmax on the accumulators in registers, O += P V with wgmma (P from registers, V N-major in
// shared memory), then release the stage. Not yet: intra-warpgroup overlap of softmax with the next
// Q Kᵀ, explicit ping-pong between the consumers, a persistent tile scheduler.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/fwd_params.h"
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
  using M = MmaType<T>;
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

  // Consumers.
  setmaxnreg_inc<240>();
  const int cw = wg - 1;               // consumer warpgroup: rows 64 cw .. 64 cw + 63 of the tile
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int row_base = m0 + 64 * cw + 16 * warp + g;  // this thread's rows: row_base, row_base + 8

  float o_acc[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  if (n_tiles > 0) mbar_wait(bar_q, 0);
  for (int it = 0; it < n_tiles; ++it) {
    const int s = it % S;
    const uint32_t phase = (it / S) & 1;
    const int k_lo = range.at(n_tiles - 1 - it) * BN;

    float sacc[kNT][4];
    mbar_wait(full_k(s), phase);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;  // 16 elements along the 128-byte swizzled row
      const uint64_t da = smem_desc_sw128(sQ + (kk / 4) * BM * 128 + cw * 64 * 128 + off, 16, 1024);
      const uint64_t db = smem_desc_sw128(sK + s * Cfg::kTileBytes + (kk / 4) * BN * 128 + off, 16, 1024);
      wgmma_ss(sacc, da, db, kk > 0 ? 1 : 0, static_cast<const T*>(nullptr));
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(sacc);
    mbar_arrive(empty_k(s));

    if (p.softcap > 0.0f) {
      const float in = p.scale / p.softcap, out = p.softcap / p.scale;
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sacc[j][e] = out * accurate_tanh(sacc[j][e] * in);
    }
    if (!tile_fully_visible(p.mask, qp_min, qp_max, k_lo, BN, kv_len)) {
      const int64_t qp = row_base + shift;
      const RowMask rm[2] = {RowMask(p.mask, qp, kv_len), RowMask(p.mask, qp + 8, kv_len)};
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!rm[e / 2].visible(k_lo + j * 8 + 2 * t4 + (e & 1))) sacc[j][e] = -INFINITY;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = row_max[r];
#pragma unroll
      for (int j = 0; j < kNT; ++j) mx = fmaxf(mx, fmaxf(sacc[j][2 * r], sacc[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_use = mx == -INFINITY ? 0.0f : mx;
      const float alpha = fast_exp2((row_max[r] - m_use) * p.scale_log2);
      row_max[r] = mx;
      const float ms = m_use * p.scale_log2;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        sacc[j][2 * r] = fast_exp2(fmaf(sacc[j][2 * r], p.scale_log2, -ms));
        sacc[j][2 * r + 1] = fast_exp2(fmaf(sacc[j][2 * r + 1], p.scale_log2, -ms));
        sum += sacc[j][2 * r] + sacc[j][2 * r + 1];
      }
      row_sum[r] = row_sum[r] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        o_acc[j][2 * r] *= alpha;
        o_acc[j][2 * r + 1] *= alpha;
      }
    }
    uint32_t pf[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pf[kk][0] = M::pack(sacc[2 * kk][0], sacc[2 * kk][1]);
      pf[kk][1] = M::pack(sacc[2 * kk][2], sacc[2 * kk][3]);
      pf[kk][2] = M::pack(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
      pf[kk][3] = M::pack(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
    }

    mbar_wait(full_v(s), phase);
    reg_fence(o_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint64_t db = smem_desc_sw128(sV + s * Cfg::kTileBytes + kk * 16 * 128, BN * 128, 1024);
      wgmma_rs(o_acc, pf[kk], db, static_cast<const T*>(nullptr));
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o_acc);
    mbar_arrive(empty_v(s));
  }

  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float m2 = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * p.scale_log2;
    float ofac = 1.0f;
    if (p.sink_logits != nullptr) {
      const float s2 = p.sink_logits[h] * kLog2e;
      const float mn = fmaxf(m2, s2);
      if (mn == -INFINITY) {
        l = 0.0f;
      } else {
        ofac = fast_exp2(m2 - mn);
        l = l * ofac + fast_exp2(s2 - mn);
        m2 = mn;
      }
    }
    const float inv = l > 0.0f ? ofac / l : 0.0f;
    const int row = row_base + r * 8;
    if (row < q_len) {
      T* orow = static_cast<T*>(p.o) + (q0 + row) * p.o_row_stride + h * p.o_head_stride;
#pragma unroll
      for (int j = 0; j < kDT; ++j) {
        const uint32_t v = M::pack(o_acc[j][2 * r] * inv, o_acc[j][2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t4) = v;
      }
      if (p.lse != nullptr && t4 == 0) {
        p.lse[static_cast<int64_t>(q0 + row) * p.num_heads + h] = l > 0.0f ? (m2 + __log2f(l)) * kLn2 : -INFINITY;
      }
    }
  }
#endif
}

}  // namespace escala::attn::cuda
