// The sm_90 prefill epilogue through shared memory: each warp writes its 16 rows of O (normalised,
// in the output type) into its own slice of a staging buffer with stmatrix, then copies them out as
// 16-byte row segments, so that one store instruction covers whole 128-byte lines. The direct form
// (store_output: each thread's 4-byte pieces, 8 rows per instruction) cost 11% at d = 128, S = 1k
// (measured with the stores left out), where an item is only 8 key tiles; staged, d = 128 S = 1k
// went 520 -> 556 TFLOP/s (causal 382 -> 442).
#pragma once

#include <cstdint>

#include "attention/cuda/fwd_params.h"
#include "attention/cuda/online_softmax.cuh"
#include "attention/cuda/sm80/ptx.cuh"
#include "attention/cuda/sm90/ptx90.cuh"

namespace escala::attn::cuda {

// Four 8x8 b16 matrices from mma/wgmma accumulator fragments into shared memory; lane l gives the
// address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

// 16 bytes from shared memory (an asm volatile load: ordered after the stmatrix writes it reads).
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// 16 bytes to global memory as one store (assigning a uint4 held in an array was split into four
// 4-byte stores).
__device__ __forceinline__ void st_global_v4(void* ptr, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Byte offset of 16-byte unit u (columns 8u .. 8u + 7) of row r (0..15) in a warp's slice: 64-column
// blocks of 16 rows x 128 bytes, the units of row r XOR-swizzled by r % 8, so that both the
// stmatrix writes (8 rows of one unit) and the row reads (8 units of one row) are conflict-free.
__device__ __forceinline__ uint32_t staged_offset(int r, int u) {
  return static_cast<uint32_t>((u / 8) * 16 * 128 + r * 128 + ((u % 8) ^ (r & 7)) * 16);
}

// The epilogue of one warp's 16 rows `row .. row + 15` (relative to the sequence; lane's rows are
// row + g and row + g + 8): full row sums, the learned sink logit, normalisation, O through the
// warp's staging slice `stage` (16 x DV output elements), and the LSE. With `tm_o` (O's tensor map,
// boxes of 64 columns x 16 rows, 128-byte swizzle: the slice's layout) one lane writes the slice
// out with bulk stores when all 16 rows lie in the sequence, instead of 32 lanes copying 16-byte
// pieces; it waits for their reads before the slice is written again (and the caller waits before
// it releases a slice staged over the V stages). `stamp(code)` marks its steps in a trace build
// (trace.cuh: 12 row factors done, 13 staged, 14 fenced); the default does nothing.
struct NoStamp {
  __device__ void operator()(int) const {}
};
template <class T, int DV, class Stamp = NoStamp>
__device__ __forceinline__ void store_output_staged(const FwdParams& p, float (&o)[DV / 8][4],
                                                    const float (&row_max)[2], const float (&row_sum)[2], int q0,
                                                    int q_len, int row, int h, int lane, uint32_t stage,
                                                    const CUtensorMap* tm_o, Stamp stamp = {}) {
  using M = MmaType<T>;
  constexpr int kDT = DV / 8;
  const int g = lane / 4, t4 = lane % 4;
  float inv[2];
  // Both rows at once made d = 64 / 256 0.4-1.3% faster at S = 1k and the d_v = 128 kernels' loop
  // 0.5-0.6% slower (ptxas laid it out anew; cuda_notes step 121), so those keep the row-by-row form.
  if constexpr (DV == 128) {
#pragma unroll
    for (int r = 0; r < 2; ++r) inv[r] = finish_row(p, row_max[r], row_sum[r], q0, q_len, row + g + 8 * r, h, t4);
  } else {
    finish_rows(p, row_max, row_sum, q0, q_len, row + g, h, t4, inv);
  }
  stamp(12);
  // The slice is free: this warp's reads of its previous item's rows are done (and the elected
  // lane's bulk stores have read them).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)  // the sm90 PTX wrappers' passes
  if (tm_o != nullptr) sm90::tma_store_wait_read();
#endif
  __syncwarp();
  // Column tiles j and j + 1 of rows 0-7 and 8-15: lane l addresses row l % 8 (+ 8 for odd l / 8)
  // of unit j + l / 16. The slice is 128-byte aligned and j even, so staged_offset(mr, j + hi) is
  // this lane's unit-0 address XOR a constant plus a constant (the compiler then keeps one address
  // instead of hoisting one per j, which spilled at d = 256).
  const int m = lane / 8, mr = (lane % 8) + 8 * (m & 1);
  const uint32_t lane_base = stage + staged_offset(mr, m >> 1);
#pragma unroll
  for (int j = 0; j < kDT; j += 2) {
    stmatrix_x4((lane_base ^ ((j % 8) * 16)) + (j / 8) * 2048, M::pack(o[j][0] * inv[0], o[j][1] * inv[0]),
                M::pack(o[j][2] * inv[1], o[j][3] * inv[1]), M::pack(o[j + 1][0] * inv[0], o[j + 1][1] * inv[0]),
                M::pack(o[j + 1][2] * inv[1], o[j + 1][3] * inv[1]));
  }
  stamp(13);
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The test broadcast from lane 0: a branch the compiler knows is warp-uniform (a lane-dependent
  // one moved the tile loop's descriptors out of uniform registers).
  if (tm_o != nullptr && __shfl_sync(0xffffffffu, row + 16 <= q_len, 0)) {
    sm90::fence_proxy_async();  // this lane's stmatrix writes, visible to the bulk store
    __syncwarp();
    stamp(14);
    for (int c = 0; c * 64 < p.d_v; ++c) sm90::tma_store_3d(tm_o, stage + c * 2048, c * 64, h, q0 + row);
    sm90::tma_store_commit();
    return;
  }
#endif
  __syncwarp();
  // Rows out: consecutive lanes take consecutive units of a row. Units past the real head dim
  // (d_v, a multiple of 8) and rows past the sequence are not written.
  const int units = p.d_v / 8;
  if constexpr (32 % kDT == 0) {
    // Each lane keeps one unit u and walks rows r0, r0 + c, ...: r0 < c, so row r0 + k c's swizzle
    // is r0's XOR a constant (addresses as in the stmatrix loop).
    constexpr int c = 32 / kDT, kRows = 16 / c;
    const int r0 = lane / kDT, u = lane % kDT;
    const uint32_t base = stage + staged_offset(r0, u);
    T* out = static_cast<T*>(p.o) + (q0 + row + r0) * p.o_row_stride + h * p.o_head_stride + 8 * u;
    if constexpr (kDT >= 16) {
      // d_v >= 128: up to 8 loads first, then their stores. With each load inside its row's bounds
      // check (the load is asm volatile, so it stays there) every store waited for its own load, one
      // row after another (ncu, d128 S1k: the copy-out's stores stalled on their loads, 1.7% of
      // samples). Measured (session 17): d256 S1k 1.5-2.3% faster, d128 unchanged; at d = 64 the
      // same form cost 14% (the compiler moved the tile loop's wgmma descriptors out of uniform
      // registers: 32 R2UR in its issue block, 83 -> 136 instructions), so d = 64 keeps the plain
      // loop. The slice always holds all 16 rows, so loading a row past the sequence's end is
      // harmless.
      constexpr int kBatch = kRows < 8 ? kRows : 8;
#pragma unroll
      for (int k0 = 0; k0 < kRows; k0 += kBatch) {
        uint4 v[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          const int r = (k0 + k) * c;
          v[k] = ld_shared_v4((base ^ ((r & 7) * 16)) + r * 128);
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          const int r = (k0 + k) * c;
          if (u < units && row + r0 + r < q_len) st_global_v4(out + r * p.o_row_stride, v[k]);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        if (u < units && row + r0 + k * c < q_len) {
          *reinterpret_cast<uint4*>(out + k * c * p.o_row_stride) =
              ld_shared_v4((base ^ (((k * c) & 7) * 16)) + k * c * 128);
        }
      }
    }
  } else {
#pragma unroll
    for (int e = lane; e < 16 * kDT; e += 32) {
      const int r = e / kDT, u = e % kDT;
      if (u < units && row + r < q_len) {
        T* orow = static_cast<T*>(p.o) + (q0 + row + r) * p.o_row_stride + h * p.o_head_stride;
        *reinterpret_cast<uint4*>(orow + 8 * u) = ld_shared_v4(stage + staged_offset(r, u));
      }
    }
  }
}

}  // namespace escala::attn::cuda
