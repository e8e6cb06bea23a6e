// The CUDA decode / append kernel (sm_80+, mma.sync): split-KV over contiguous or paged K/V in
// bf16/f16, int8 or fp8 e4m3, with every mask of the attention API.
//
// Work: one CTA per (key split, kv head x 16-row tile, sequence). The rows of the tile are the
// packed (query token, query head of the group) pairs of one kv head, so a GQA group shares every
// K/V tile as the M dimension of m16n8k16 MMAs (FlashInfer's "tensor-core decode"). The CTA's 4
// warps stream disjoint 16-key tiles, each through its own cp.async ring (no block barriers in the
// main loop), keep their own online softmax, and are merged through shared memory at the end; a
// second kernel merges the splits by LSE.
//
// 8-bit K/V are dequantised in registers into f16 MMA operands (int8 and e4m3 are exact in f16);
// the per-key scales multiply the score column (K) and the probability column (V), so no
// dequantised copy exists anywhere. To read 8-bit rows with 32-bit shared loads, the head
// dimension is permuted consistently: inside each 16-wide k-step the Q/K fragment element k maps to
// d = 4 (k % 8 / 2) + 2 (k / 8) + k % 2, and O column n of n-tile j is d = 32 (j / 4) + 4 n + j % 4.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/cuda/decode/decode_params.h"
#include "attention/cuda/online_softmax.cuh"
#include "attention/cuda/sm80/ptx.cuh"
#include "attention/cuda/tile_range.cuh"

namespace escala::attn::cuda {

template <int D, class T, KvFormat F>
struct DecodeCfg {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kKeys = 16;  // keys per warp tile
  static constexpr bool kQuant = F != KvFormat::kHalf;
  using MmaT = std::conditional_t<kQuant, __half, T>;
  static constexpr int kElemBytes = kQuant ? 1 : 2;
  static constexpr int kRowBytes = D * kElemBytes;
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per row
  static constexpr int kSwizzle = kChunks >= 8 ? 7 : kChunks - 1;
  static constexpr int kTileBytes = kKeys * kRowBytes;
  static constexpr int kScaleBytes = kQuant ? 2 * kKeys * 4 : 0;
  static constexpr int kStageBytes = 2 * kTileBytes + kScaleBytes;
  // ~24 KB in flight per warp: 2 CTAs per SM on Hopper for d <= 128.
  static constexpr int kStagesRaw = 24576 / kStageBytes;
  static constexpr int kStages = kStagesRaw < 2 ? 2 : (kStagesRaw > 6 ? 6 : kStagesRaw);
  static constexpr int kRingBytes = kWarps * kStages * kStageBytes;
  static constexpr int kMergeBytes = (kWarps * 16 * D + 2 * kWarps * 16 + 2 * 16) * 4;
  static constexpr int kSmemBytes = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
};

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

__device__ __forceinline__ int swizzle_chunk(int row, int chunk, int mask) { return chunk ^ (row & mask); }

// Two 8-bit values (bytes 0,1 when hi == 0, bytes 2,3 otherwise) as an f16 pair. int8: exact.
// fp8 e4m3: exact up to a factor 2^-8 that the caller folds into the scale.
template <KvFormat F>
__device__ __forceinline__ uint32_t cvt8x2(uint32_t w, bool hi) {
  if constexpr (F == KvFormat::kInt8) {
    // 0x64XX as f16 is 1024 + XX; XX = x + 128 (x ^ 0x80), so subtract 1152.
    const uint32_t t = __byte_perm(w ^ 0x80808080u, 0x64646464u, hi ? 0x4342 : 0x4140);
    __half2 h = *reinterpret_cast<const __half2*>(&t);
    h = __hsub2(h, __floats2half2_rn(1152.0f, 1152.0f));
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    // e4m3 sign|exp|mant moved into f16's fields: the value divided by 2^8 (bias 7 vs 15),
    // subnormals included.
    const uint32_t x = __byte_perm(w, 0u, hi ? 0x3424 : 0x1404);
    return (x & 0x80008000u) | ((x >> 1) & 0x3F803F80u);
  }
}

template <KvFormat F>
__device__ __forceinline__ float format_scale_factor() {
  return F == KvFormat::kFp8 ? 256.0f : 1.0f;
}

// Head-dimension index of O fragment column n of n-tile j.
template <bool kQuant>
__device__ __forceinline__ int o_column(int j, int n) {
  return kQuant ? 32 * (j / 4) + 4 * n + (j % 4) : 8 * j + n;
}

template <int D, class T, KvFormat F>
__global__ void __launch_bounds__(128) decode_kernel(const DecodeParams p) {
  using Cfg = DecodeCfg<D, T, F>;
  using MT = typename Cfg::MmaT;
  using M = MmaType<MT>;
  constexpr int kKT = D / 16;  // k-steps of QK
  constexpr int kDT = D / 8;   // n-tiles of PV
  constexpr bool kQuant = Cfg::kQuant;
  extern __shared__ __align__(128) uint8_t smem[];

  const int split = blockIdx.x;
  const int hk = blockIdx.y % p.num_kv_heads;
  const int rt = blockIdx.y / p.num_kv_heads;
  const int b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;

  const int q0 = p.cu_seqlens_q[b], q_len = p.cu_seqlens_q[b + 1] - q0;
  const int k0 = p.cu_seqlens_k[b], kv_len = p.cu_seqlens_k[b + 1] - k0;
  const int rows = q_len * p.group;
  if (rt * 16 >= rows) return;
  const int row_hi = min(rows, rt * 16 + 16) - 1;
  const int64_t shift = int64_t(kv_len) - q_len;  // aligned position = token + shift
  const int64_t qp_min = rt * 16 / p.group + shift, qp_max = row_hi / p.group + shift;

  // This thread's two rows (g, g + 8): token, query head, mask.
  int tok[2], head[2];
  bool valid[2];
  RowMask rmask[2] = {RowMask(p.mask, 0, 0), RowMask(p.mask, 0, 0)};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pr = rt * 16 + g + 8 * r;
    valid[r] = pr < rows;
    tok[r] = valid[r] ? pr / p.group : 0;
    head[r] = hk * p.group + (valid[r] ? pr % p.group : 0);
    rmask[r] = valid[r] ? RowMask(p.mask, tok[r] + shift, kv_len) : RowMask(p.mask, -1, 0);
  }

  // Q fragments, loaded once (raw dot units; the scale is folded into exp2).
  uint32_t qf[kKT][4];
#pragma unroll
  for (int kk = 0; kk < kKT; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e & 1;  // a0: row g, a1: row g+8, a2: row g, a3: row g+8
      const int d = kQuant ? 16 * kk + 4 * t4 + 2 * (e >> 1) : 16 * kk + 8 * (e >> 1) + 2 * t4;
      uint32_t v = 0;
      if (valid[r]) {
        const T* qrow = static_cast<const T*>(p.q) + int64_t(q0 + tok[r]) * p.q_row_stride + head[r] * p.q_head_stride;
        const uint32_t raw = *reinterpret_cast<const uint32_t*>(qrow + d);
        if constexpr (kQuant && !std::is_same_v<T, __half>) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw));
          v = M::pack(f.x, f.y);
        } else {
          v = raw;
        }
      }
      qf[kk][e] = v;
    }

  // Key tiles this CTA visits: the mask's tile range, cut into num_splits contiguous parts.
  const TileRange tr = tile_range(p.mask, qp_min, qp_max, kv_len, Cfg::kKeys);
  const int n_tiles = tr.count();
  const int per_split = (n_tiles + p.num_splits - 1) / p.num_splits;
  const int t_begin = min(n_tiles, split * per_split), t_end = min(n_tiles, t_begin + per_split);
  const int32_t* pages = p.page_size > 0 ? p.page_indices + p.page_indptr[b] : nullptr;

  uint8_t* ring = smem + warp * Cfg::kStages * Cfg::kStageBytes;
  const uint8_t* kbase = static_cast<const uint8_t*>(p.k);
  const uint8_t* vbase = static_cast<const uint8_t*>(p.v);

  // Issues the cp.async loads of the warp's i-th tile (tile index t_begin + warp + 4 i) into `stage`.
  auto load_tile = [&](int i, int stage) {
    const int t = t_begin + warp + Cfg::kWarps * i;
    uint8_t* st = ring + stage * Cfg::kStageBytes;
    if (t < t_end) {
      const int key_lo = tr.at(t) * Cfg::kKeys;
      const int r = lane & 15, half = lane >> 4;
      const int kpos = key_lo + r;
      const bool ok = kpos < kv_len;
      int64_t krow = 0, vrow = 0, slot = 0;
      int32_t page = 0;
      if (ok) {
        if (p.page_size > 0) {
          page = pages[kpos / p.page_size];
          const int s = kpos % p.page_size;
          slot = int64_t(page) * p.page_size + s;
          krow = int64_t(page) * p.k_page_stride + s * p.k_row_stride + hk * p.k_head_stride;
          vrow = int64_t(page) * p.v_page_stride + s * p.v_row_stride + hk * p.v_head_stride;
        } else {
          slot = int64_t(k0) + kpos;
          krow = slot * p.k_row_stride + hk * p.k_head_stride;
          vrow = slot * p.v_row_stride + hk * p.v_head_stride;
        }
      }
      const uint8_t* ksrc = kbase + krow * Cfg::kElemBytes;
      const uint8_t* vsrc = vbase + vrow * Cfg::kElemBytes;
      const uint32_t sk = smem_addr(st), sv = sk + Cfg::kTileBytes;
#pragma unroll
      for (int c = half; c < Cfg::kChunks; c += 2) {
        const uint32_t off = r * Cfg::kRowBytes + swizzle_chunk(r, c, Cfg::kSwizzle) * 16;
        cp_async_16(sk + off, ksrc + c * 16, ok);
        cp_async_16(sv + off, vsrc + c * 16, ok);
      }
      if constexpr (kQuant) {
        const float* scales = half ? p.v_scale : p.k_scale;
        const int64_t idx = (F == KvFormat::kInt8 ? slot : int64_t(page)) * p.num_kv_heads + hk;
        cp_async_4(sk + 2 * Cfg::kTileBytes + (half * 16 + r) * 4, scales + (ok ? idx : 0), ok);
      }
    }
    cp_async_commit();  // an empty group keeps the wait counts uniform
  };

  float o[kDT][4];
#pragma unroll
  for (int j = 0; j < kDT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const int my_tiles = t_begin + warp < t_end ? (t_end - t_begin - warp + Cfg::kWarps - 1) / Cfg::kWarps : 0;
#pragma unroll
  for (int i = 0; i < Cfg::kStages - 1; ++i) load_tile(i, i);

  for (int i = 0; i < my_tiles; ++i) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncwarp();
    const int stage = i % Cfg::kStages;
    const uint8_t* sk = ring + stage * Cfg::kStageBytes;
    const uint8_t* sv = sk + Cfg::kTileBytes;
    const int key_lo = tr.at(t_begin + warp + Cfg::kWarps * i) * Cfg::kKeys;

    // S = Q K^T for 16 rows x 16 keys.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if constexpr (!kQuant) {
      const int key = ((lane >> 4) << 3) + (lane & 7);
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk) {
        uint32_t bf[4];
        const int chunk = 2 * kk + ((lane >> 3) & 1);
        ldmatrix_x4(bf, smem_addr(sk + key * Cfg::kRowBytes + swizzle_chunk(key, chunk, Cfg::kSwizzle) * 16));
        M::mma(s[0], qf[kk], bf[0], bf[1]);
        M::mma(s[1], qf[kk], bf[2], bf[3]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int key = 8 * j + g;
          const uint32_t w = *reinterpret_cast<const uint32_t*>(
              sk + key * Cfg::kRowBytes + swizzle_chunk(key, kk, Cfg::kSwizzle) * 16 + 4 * t4);
          M::mma(s[j], qf[kk], cvt8x2<F>(w, false), cvt8x2<F>(w, true));
        }
      const float* ks = reinterpret_cast<const float*>(sk + 2 * Cfg::kTileBytes);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= ks[8 * j + 2 * t4 + (e & 1)] * format_scale_factor<F>();
    }

    // Soft-cap, mask, online softmax.
    if (p.softcap > 0.0f) {
      const float in = p.scale / p.softcap, out = p.softcap / p.scale;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = out * accurate_tanh(s[j][e] * in);
    }
    if (!tile_fully_visible(p.mask, qp_min, qp_max, key_lo, Cfg::kKeys, kv_len)) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!rmask[e / 2].visible(key_lo + 8 * j + 2 * t4 + (e & 1))) s[j][e] = -INFINITY;
    }
    float alpha[2];
    softmax_update<2>(s, row_max, row_sum, p.scale_log2, alpha);
    rescale_rows<kDT>(o, alpha);
    if constexpr (kQuant) {
      const float* vs = reinterpret_cast<const float*>(sk + 2 * Cfg::kTileBytes) + 16;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= vs[8 * j + 2 * t4 + (e & 1)] * format_scale_factor<F>();
    }
    uint32_t pf[1][4];
    pack_p<MT, 2>(s, pf);

    // O += P V.
    if constexpr (!kQuant) {
      const int key = ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int j = 0; j < kDT; j += 2) {
        uint32_t bf[4];
        const int chunk = j + (lane >> 4);
        ldmatrix_x4_trans(bf, smem_addr(sv + key * Cfg::kRowBytes + swizzle_chunk(key, chunk, Cfg::kSwizzle) * 16));
        M::mma(o[j], pf[0], bf[0], bf[1]);
        M::mma(o[j + 1], pf[0], bf[2], bf[3]);
      }
    } else {
      const int keys[4] = {2 * t4, 2 * t4 + 1, 2 * t4 + 8, 2 * t4 + 9};
#pragma unroll
      for (int q = 0; q < D / 32; ++q) {
        uint32_t w[4];
        const int chunk = 2 * q + (g >> 2), within = (4 * g) & 15;
#pragma unroll
        for (int k = 0; k < 4; ++k)
          w[k] = *reinterpret_cast<const uint32_t*>(sv + keys[k] * Cfg::kRowBytes +
                                                    swizzle_chunk(keys[k], chunk, Cfg::kSwizzle) * 16 + within);
        // Interleave the two keys of each B register: bytes (d0 k0, d0 k1, d1 k0, d1 k1).
        const uint32_t lo0 = __byte_perm(w[0], w[1], 0x5140), hi0 = __byte_perm(w[0], w[1], 0x7362);
        const uint32_t lo1 = __byte_perm(w[2], w[3], 0x5140), hi1 = __byte_perm(w[2], w[3], 0x7362);
        M::mma(o[4 * q + 0], pf[0], cvt8x2<F>(lo0, false), cvt8x2<F>(lo1, false));
        M::mma(o[4 * q + 1], pf[0], cvt8x2<F>(lo0, true), cvt8x2<F>(lo1, true));
        M::mma(o[4 * q + 2], pf[0], cvt8x2<F>(hi0, false), cvt8x2<F>(hi1, false));
        M::mma(o[4 * q + 3], pf[0], cvt8x2<F>(hi0, true), cvt8x2<F>(hi1, true));
      }
    }
    __syncwarp();
    load_tile(i + Cfg::kStages - 1, (i + Cfg::kStages - 1) % Cfg::kStages);
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the 4 warps' partial softmax states through shared memory.
  float* slab = reinterpret_cast<float*>(smem);  // [warp][row][D]
  float* sm_max = slab + Cfg::kWarps * 16 * D;   // [warp][row]
  float* sm_sum = sm_max + Cfg::kWarps * 16;
  float* row_m = sm_sum + Cfg::kWarps * 16;  // [row]: merged max (raw units), merged sum
  float* row_l = row_m + 16;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = row_sum[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (t4 == 0) sm_max[warp * 16 + g + 8 * r] = row_max[r], sm_sum[warp * 16 + g + 8 * r] = l;
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    float mx = -INFINITY;
    for (int w = 0; w < Cfg::kWarps; ++w) mx = fmaxf(mx, sm_max[w * 16 + threadIdx.x]);
    float l = 0.0f;
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float mw = sm_max[w * 16 + threadIdx.x];
      if (mw != -INFINITY) l += sm_sum[w * 16 + threadIdx.x] * fast_exp2((mw - mx) * p.scale_log2);
    }
    row_m[threadIdx.x] = mx, row_l[threadIdx.x] = l;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    float mx = -INFINITY;
    for (int w = 0; w < Cfg::kWarps; ++w) mx = fmaxf(mx, sm_max[w * 16 + row]);
    const float f = row_max[r] == -INFINITY ? 0.0f : fast_exp2((row_max[r] - mx) * p.scale_log2);
    float* dst = slab + (warp * 16 + row) * D;
#pragma unroll
    for (int j = 0; j < kDT; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) dst[o_column<kQuant>(j, 2 * t4 + e)] = o[j][2 * r + e] * f;
  }
  __syncthreads();

  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  for (int idx = threadIdx.x; idx < 16 * D / 2; idx += Cfg::kThreads) {
    const int row = idx / (D / 2), d = 2 * (idx % (D / 2));
    const int pr = rt * 16 + row;
    if (pr >= rows) continue;
    const int i = pr / p.group, h = hk * p.group + pr % p.group;
    float a = 0.0f, c = 0.0f;
    for (int w = 0; w < Cfg::kWarps; ++w) a += slab[(w * 16 + row) * D + d], c += slab[(w * 16 + row) * D + d + 1];
    float l = row_l[row];
    float m2 = row_m[row] == -INFINITY ? -INFINITY : row_m[row] * p.scale_log2;  // log2 units
    if (p.num_splits == 1) {
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
      T* orow = static_cast<T*>(p.o) + int64_t(q0 + i) * p.o_row_stride + h * p.o_head_stride;
      using OM = MmaType<T>;
      *reinterpret_cast<uint32_t*>(orow + d) = OM::pack(a * inv, c * inv);
      if (d == 0 && p.lse != nullptr)
        p.lse[int64_t(q0 + i) * p.num_heads + h] = l > 0.0f ? (m2 + __log2f(l)) * kLn2 : -INFINITY;
    } else {
      const int64_t part = ((int64_t(b) * p.max_q_len + i) * p.num_heads + h) * p.num_splits + split;
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      *reinterpret_cast<float2*>(p.part_o + part * D + d) = make_float2(a * inv, c * inv);
      if (d == 0) p.part_lse[part] = l > 0.0f ? (m2 + __log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

// Merges the splits of every (sequence, query token, head) row by LSE, with the sink logit as a
// partial of value 0. One warp per row; rows past a sequence's query count exit.
template <int D, class T>
__global__ void __launch_bounds__(128) decode_merge_kernel(const DecodeParams p) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t per_seq = int64_t(p.max_q_len) * p.num_heads;
  if (row >= per_seq * p.batch) return;
  const int b = static_cast<int>(row / per_seq);
  const int i = static_cast<int>((row / p.num_heads) % p.max_q_len), h = static_cast<int>(row % p.num_heads);
  const int q0 = p.cu_seqlens_q[b];
  if (i >= p.cu_seqlens_q[b + 1] - q0) return;
  const int64_t base = row * p.num_splits;  // == ((b * max_q_len + i) * heads + h) * splits
  float mx = -INFINITY;
  for (int s = lane; s < p.num_splits; s += 32) mx = fmaxf(mx, p.part_lse[base + s]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float sink = p.sink_logits != nullptr ? p.sink_logits[h] : -INFINITY;
  mx = fmaxf(mx, sink);
  constexpr int kPer = D / 32;
  float acc[kPer] = {};
  float l = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float lse = p.part_lse[base + s];
      if (lse == -INFINITY) continue;
      const float w = __expf(lse - mx);
      l += w;
      const float* src = p.part_o + (base + s) * D + lane * kPer;
#pragma unroll
      for (int e = 0; e < kPer; ++e) acc[e] += w * src[e];
    }
    if (sink != -INFINITY) l += __expf(sink - mx);
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* orow = static_cast<T*>(p.o) + int64_t(q0 + i) * p.o_row_stride + h * p.o_head_stride + lane * kPer;
  using OM = MmaType<T>;
#pragma unroll
  for (int e = 0; e < kPer; e += 2) *reinterpret_cast<uint32_t*>(orow + e) = OM::pack(acc[e] * inv, acc[e + 1] * inv);
  if (lane == 0 && p.lse != nullptr)
    p.lse[int64_t(q0 + i) * p.num_heads + h] = l > 0.0f ? mx + __logf(l) : -INFINITY;
}

}  // namespace escala::attn::cuda
