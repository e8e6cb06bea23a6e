// The portable (sm_80+) prefill/append kernel, FlashAttention-2 design: one CTA per (query tile,
// head, sequence), one warp per 16 query rows, mma.sync m16n8k16 with f32 accumulators, K/V tiles
// loaded with cp.async into XOR-swizzled shared memory (the K load of tile i+1 overlaps P·V of
// tile i, the V load of tile i overlaps Q·Kᵀ of tile i), online softmax in registers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/cuda/fwd_params.h"
#include "attention/cuda/online_softmax.cuh"
#include "attention/cuda/sm80/ptx.cuh"
#include "attention/cuda/tile_range.cuh"

namespace escala::attn::cuda {

// D: tile width (head dims d_qk, d_v <= D; the columns past them are read as zeros); BM/BN:
// query/key tile rows; Q stays in registers when kQInRegs (D <= 128).
template <class T_, int D_, int BN_, int MinBlocks_>
struct Sm80Config {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int kWarps = 4;
  static constexpr int BM = 16 * kWarps;
  static constexpr int BN = BN_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kMinBlocks = MinBlocks_;
  static constexpr bool kQInRegs = D <= 128;
  static constexpr int kSmemBytes = (BM + 2 * BN) * D * 2;
  static_assert(D % 64 == 0, "the swizzle needs rows of at least 8 chunks of 16 bytes");
  static_assert(BN % 16 == 0, "BN must be a multiple of 16");
};

// Element (r, c) of a [rows][D] tile, c a multiple of 8: 16-byte chunks XOR-swizzled by row so that
// ldmatrix on 8 consecutive rows hits 8 different bank groups.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * D + ((((c >> 3) ^ (r & 7))) << 3);
}

// Copies rows [0, rows) of a [rows][D] tile; rows >= valid_rows and columns >= valid_cols (a head
// dim below the tile width) are zero-filled. Each thread owns one 16-byte column chunk and steps
// down the rows (few live registers: one pointer, one row).
template <int D, int Rows, int Threads, class T>
__device__ __forceinline__ void load_tile(T* s, const T* g, int64_t row_stride, int valid_rows, int valid_cols,
                                          int tid) {
  constexpr int kChunks = D / 8;
  static_assert(Threads % kChunks == 0 && (Rows * kChunks) % Threads == 0, "tile/threads mismatch");
  constexpr int kRowStep = Threads / kChunks;
  const int r0 = tid / kChunks, c = (tid % kChunks) * 8;
  const uint32_t base = smem_addr(s);
  const bool col_ok = c < valid_cols;
  const T* src = g + r0 * row_stride + c;
  const int64_t step = kRowStep * row_stride;
#pragma unroll
  for (int i = 0; i < Rows / kRowStep; ++i) {
    const int r = r0 + i * kRowStep;
    const bool ok = col_ok && r < valid_rows;
    cp_async_16(base + static_cast<uint32_t>(swz<D>(r, c) * 2), ok ? src : g, ok);
    src += step;
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) fwd_sm80_kernel(const FwdParams p) {
  using T = typename Cfg::T;
  using M = MmaType<T>;
  constexpr int D = Cfg::D, BM = Cfg::BM, BN = Cfg::BN, kThreads = Cfg::kThreads;
  constexpr int kNT = BN / 8;  // n-tiles of S
  constexpr int kDT = D / 8;   // n-tiles of O
  extern __shared__ __align__(128) uint8_t smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + BM * D;
  T* sV = sK + BN * D;

  const int b = blockIdx.z, h = blockIdx.y;
  const int m_block = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // longest tiles first
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

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;

  const T* gQ = static_cast<const T*>(p.q) + (q0 + m0) * p.q_row_stride + h * p.q_head_stride;
  const T* gK = static_cast<const T*>(p.k) + kv0 * p.k_row_stride + hk * p.k_head_stride;
  const T* gV = static_cast<const T*>(p.v) + kv0 * p.v_row_stride + hk * p.v_head_stride;

  float o_acc[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw dot units
  float row_sum[2] = {0.0f, 0.0f};            // this thread's partial sums

  // Per-lane ldmatrix byte offsets. Every ldmatrix row address of a lane has the same (row & 7), so
  // the swizzled chunk of logical chunk 8*hi + lo is 8*hi + (lo ^ (lane & 7)): four offsets per
  // operand (lo = 0, 2, 4, 6 plus the lane's half), the rest are compile-time constants.
  uint32_t q_off[4], k_off[4], v_off[4];
  {
    const int y = lane % 8;
    const int q_row = warp * 16 + y + ((lane / 8) % 2) * 8, q_half = lane / 16;
    const int k_row = y + (lane / 16) * 8, k_half = (lane / 8) % 2;
    const int v_row = y + ((lane / 8) % 2) * 8, v_half = lane / 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q_off[i] = static_cast<uint32_t>((q_row * D + (((2 * i + q_half) ^ y) << 3)) * 2);
      k_off[i] = static_cast<uint32_t>((k_row * D + (((2 * i + k_half) ^ y) << 3)) * 2);
      v_off[i] = static_cast<uint32_t>((v_row * D + (((2 * i + v_half) ^ y) << 3)) * 2);
    }
  }
  const uint32_t sQa = smem_addr(sQ), sKa = smem_addr(sK), sVa = smem_addr(sV);

  uint32_t q_frag[Cfg::kQInRegs ? D / 16 : 1][4];

  if (n_tiles > 0) {
    load_tile<D, BM, kThreads>(sQ, gQ, p.q_row_stride, q_len - m0, p.d_qk, tid);
    {
      const int kt = range.at(n_tiles - 1);
      load_tile<D, BN, kThreads>(sK, gK + static_cast<int64_t>(kt) * BN * p.k_row_stride, p.k_row_stride,
                                 kv_len - kt * BN, p.d_qk, tid);
    }
    cp_async_commit();
  }

  for (int it = 0; it < n_tiles; ++it) {
    const int kt = range.at(n_tiles - 1 - it);  // last tile first: it carries the mask boundary
    const int k_lo = kt * BN;
    cp_async_wait<0>();
    __syncthreads();
    if constexpr (Cfg::kQInRegs) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(q_frag[kk], sQa + q_off[kk % 4] + (kk / 4) * 128);
      }
    }
    load_tile<D, BN, kThreads>(sV, gV + static_cast<int64_t>(k_lo) * p.v_row_stride, p.v_row_stride,
                               kv_len - k_lo, p.d_v, tid);
    cp_async_commit();

    // S = Q Kᵀ (16 x BN per warp).
    float s[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4];
      if constexpr (Cfg::kQInRegs) {
        a[0] = q_frag[kk][0], a[1] = q_frag[kk][1], a[2] = q_frag[kk][2], a[3] = q_frag[kk][3];
      } else {
        ldmatrix_x4(a, sQa + q_off[kk % 4] + (kk / 4) * 128);
      }
#pragma unroll
      for (int j = 0; j < kNT; j += 2) {
        uint32_t bk[4];
        ldmatrix_x4(bk, sKa + k_off[kk % 4] + (j * 8 * D + (kk / 4) * 64) * 2);
        M::mma(s[j], a, bk[0], bk[1]);
        M::mma(s[j + 1], a, bk[2], bk[3]);
      }
    }

    // Soft-cap, mask, online softmax; O rows rescaled by alpha.
    transform_and_mask(s, p, !tile_fully_visible(p.mask, qp_min, qp_max, k_lo, BN, kv_len),
                       m0 + warp * 16 + g + shift, k_lo, kv_len, t4);
    float alpha[2];
    softmax_update(s, row_max, row_sum, p.scale_log2, alpha);
    rescale_rows(o_acc, alpha);

    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < n_tiles) {
      const int nt = range.at(n_tiles - 2 - it);
      load_tile<D, BN, kThreads>(sK, gK + static_cast<int64_t>(nt) * BN * p.k_row_stride, p.k_row_stride,
                                 kv_len - nt * BN, p.d_qk, tid);
      cp_async_commit();
    }

    // O += P V: the S accumulators of n-tiles 2kk, 2kk+1 are the A fragment of key chunk kk.
    uint32_t pf[kNT / 2][4];
    pack_p<T>(s, pf);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      const uint32_t (&a)[4] = pf[kk];
#pragma unroll
      for (int j = 0; j < kDT; j += 2) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, sVa + v_off[(j % 8) / 2] + (kk * 16 * D + (j / 8) * 64) * 2);
        M::mma(o_acc[j], a, bv[0], bv[1]);
        M::mma(o_acc[j + 1], a, bv[2], bv[3]);
      }
    }
  }

  store_output<T>(p, o_acc, row_max, row_sum, q0, q_len, m0 + warp * 16 + g, h, t4);
}

}  // namespace escala::attn::cuda
