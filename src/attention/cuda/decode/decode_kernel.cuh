// The CUDA decode / append kernel (sm_80+, mma.sync): split-KV over contiguous or paged K/V in
// bf16/f16, int8 or fp8 e4m3, with every mask of the attention API.
//
// Work: one CTA per (key split, kv head x row tile, sequence). The rows of the tile are the packed
// (query token, query head of the group) pairs of one kv head, so a GQA group shares every K/V tile
// in m16n8k16 MMAs (FlashInfer's "tensor-core decode"): as their M side in tiles of 16 rows, or, in
// tiles of at most 8 rows (plain GQA decode), as their N side with keys and head dims on M (the
// "columns" form: a group of 4 fills half an MMA instead of a quarter). The CTA's 4 warps stream
// disjoint key tiles, each through its own ring (no block barriers in the main loop), keep their
// own online softmax, and are merged through shared memory at the end; the last CTA of each
// (sequence, kv head, row tile) to finish merges the splits by LSE (the wide form: a second kernel).
//
// 8-bit K/V are dequantised in registers into f16 MMA operands (int8 and e4m3 are exact in f16);
// the per-key scales multiply the score column (K) and the probability column (V), so no
// dequantised copy exists anywhere. To read 8-bit rows with 32-bit shared loads, the head
// dimension is permuted consistently: inside each 16-wide k-step the Q/K fragment element k maps to
// d = 4 (k % 8 / 2) + 2 (k / 8) + k % 2, and O column n of n-tile j is d = 32 (j / 4) + 4 n + j % 4.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/cuda/decode/decode_params.h"
#include "attention/cuda/online_softmax.cuh"
#include "attention/cuda/page_pos.h"
#include "attention/cuda/sm80/ptx.cuh"
#include "attention/cuda/sm90/ptx90.cuh"
#include "attention/cuda/tile_range.cuh"

namespace escala::attn::cuda {

// kRowsCta (query rows per CTA): 64, "wide": the CTA's 4 warps take 16 rows each and share every
// K/V tile (long query runs and cascade prefixes: 4x fewer K/V reads); 16: the warps share the rows
// and split the keys; 8 ("columns"): as 16, but the rows are the N side of the MMAs and keys / head
// dims their M side, so a GQA group of 4 fills half of each m16n8k16 instead of a quarter (half the
// MMAs, half the softmax work per tile).
template <int D, class T, KvFormat F, int kRowsCta>
struct DecodeCfg {
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kRows = kRowsCta;
  static constexpr bool kWide = kRows == 64;
  static constexpr bool kColumns = kRows == 8;
  static constexpr bool kQuant = F != KvFormat::kHalf;
  static_assert(kRows == 64 || kRows == 16 || kRows == 8, "row forms");
  using MmaT = std::conditional_t<kQuant, __half, T>;
  static constexpr int kElemBytes = kQuant ? 1 : 2;
  static constexpr int kRowBytes = D * kElemBytes;
  static constexpr int kKeys = decode_tile_keys(kRowBytes);  // keys per warp tile
  static constexpr int kNT = kKeys / 8;  // score n-tiles per warp tile
  static constexpr int kChunks = kRowBytes / 16;  // 16-byte chunks per row
  // Rows of 128 or 256 bytes (d = 64 or 128 at 16 bits, d = 128 or 256 at 8 bits) of the per-warp
  // form are stored as 128-byte column halves ([half][row][128 bytes]) with the 16-byte chunks of
  // row r XOR-swizzled by r % 8, the layout of TMA's 128-byte swizzle: on Hopper 16 rows of
  // 128 bytes are one TMA copy (256-byte rows measured faster filled by cp.async, so they are not
  // read by TMA). Other rows are padded by 16 bytes (rows start 4 banks apart). Either way ldmatrix
  // and the 32-bit loads of 8-bit rows are conflict-free.
  static constexpr bool kSwizzled = (kRowBytes == 128 || kRowBytes == 256) && !kWide;
  static constexpr int kRowPitch = kSwizzled ? kRowBytes : kRowBytes + 16;
  static constexpr int kTmaBoxRows = 16;
  // Bulk copies pay per request: worth it for the remaining rows of 512 bytes (cp.async otherwise).
  static constexpr bool kBulkRows = kRowBytes >= 256 && !kWide && !kSwizzled;
  static constexpr int kTileBytes = kKeys * kRowPitch;
  static constexpr int kScaleBytes = kQuant ? 2 * kKeys * 4 : 0;
  static constexpr int kStageRaw = 2 * kTileBytes + kScaleBytes;
  // TMA's 128-byte swizzle repeats every 1024 bytes: swizzled stages start 1024-byte aligned.
  static constexpr int kStageBytes = kSwizzled ? (kStageRaw + 1023) / 1024 * 1024 : kStageRaw;
  // ~28 KB of ring per warp: two CTAs (8 warps) per SM on Hopper for d <= 128. One shared ring of
  // about the same total in the wide form.
  static constexpr int kRings = kWide ? 1 : kWarps;
  // 128-byte rows: two stages per warp, so that three CTAs (12 warps) fit on an SM; but fp8 in the
  // columns form, whose tiles cost a warp little, keeps two tiles in flight per warp with three
  // stages at two CTAs per SM (H200: fp8 128 x 32k -3.5%, 64 x 4k -11%; int8, whose conversions
  // cost twice fp8's, was 6% slower so).
  static constexpr bool kThreeStages128 = F == KvFormat::kFp8 && kColumns;
  // 64-byte rows (8-bit d = 64) cost a warp as much math per key as 16-bit rows for half the bytes,
  // so the warp's latency bounds them, not bytes in flight: two stages (instead of five) fit four
  // CTAs per SM, and the split rule fills them (H200, SmolLM2's 9/3 at 64 x 4k, paged fp8: 45.3 ->
  // 41.4 us with two splits, int8 49.4 -> 43.3; 16 x 8k 35.6 -> 27.0; 128 x 8k 154 -> 139; but
  // 1 x 32k 14.8 -> 15.6; three stages were between).
  static constexpr bool kTwoStages64 = kQuant && kRowBytes == 64 && !kWide;
  static constexpr int kStagesRaw =
      kTwoStages64 ? 2 : (kWide ? 98304 : (kRowBytes == 128 && !kThreeStages128 ? 20480 : 28672)) / kStageBytes;
  static constexpr int kStageCap = kWide ? 8 : 6;
  static constexpr int kStages = kStagesRaw < 2 ? 2 : (kStagesRaw > kStageCap ? kStageCap : kStagesRaw);
  // When a warp refills a stage: at release (once its math on the stage is done, so all kStages
  // tiles are in flight while it waits) or after the next wait (kStages - 1 in flight, the wide
  // form's only choice: its shared ring frees a stage at the block barrier). At release pays where
  // a 16-bit warp has only two stages (H200: d = 256 at 16 x 8k 269.5 -> 248.0 us; SmolLM2's 9/3
  // d = 64 at 64 x 4k paged 55.2 -> 53.9, contiguous 52.0 -> 51.0), though it cost 3% where three
  // CTAs already fill an SM (d = 64 at 16 x 8k, 3 splits); in the other forms it measured -0.6% to
  // +2.4% (fp8 1 x 32k +2.4%).
  static constexpr bool kRefillAtRelease = !kWide && !kQuant && kStages == 2;
  static constexpr int kRingBytes = kRings * kStages * kStageBytes;
  // + the in-place merge's "last CTA" flag
  static constexpr int kMergeBytes = (kWarps * 16 * D + 2 * kWarps * 16 + 2 * kRows + 4) * 4;
  static constexpr int kBarOffset = kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes;
  // + one mbarrier per stage, + room to align the ring to 1024 bytes
  static constexpr int kSmemBytes = kBarOffset + kRings * kStages * 8 + (kSwizzled ? 1024 : 0);
};

__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// Hopper (sm_90a): whole rows by the bulk-copy engine, or TMA boxes, completing on a per-stage
// mbarrier (sm90/ptx90.cuh), instead of one cp.async per 16 bytes.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ESCALA_DECODE_BULK 1
using sm90::bulk_copy;
using sm90::mbar_arrive_expect_tx;
using sm90::mbar_wait;
using sm90::tma_load_3d;
__device__ __forceinline__ void bar_init(uint32_t bar) {
  sm90::mbar_init(bar, 1);
  sm90::mbar_init_fence();
}
#else
#define ESCALA_DECODE_BULK 0
#endif

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
    // sm_90: one cvt per pair (measured 17% faster at fp8 128 x 32k than the three integer
    // operations below, which every other architecture uses).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint16_t pair = static_cast<uint16_t>(hi ? w >> 16 : w & 0xffffu);
    uint32_t r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(pair));
    return r;
#else
    // e4m3 sign|exp|mant moved into f16's fields: the value divided by 2^8 (bias 7 vs 15),
    // subnormals included.
    const uint32_t x = __byte_perm(w, 0u, hi ? 0x3424 : 0x1404);
    return (x & 0x80008000u) | ((x >> 1) & 0x3F803F80u);
#endif
  }
}

// The factor cvt8x2 leaves out (folded into the per-key scales).
template <KvFormat F>
__device__ __forceinline__ float format_scale_factor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return 1.0f;
#else
  return F == KvFormat::kFp8 ? 256.0f : 1.0f;
#endif
}

// Head-dimension index of O fragment column n of n-tile j.
template <bool kQuant>
__device__ __forceinline__ int o_column(int j, int n) {
  return kQuant ? 32 * (j / 4) + 4 * n + (j % 4) : 8 * j + n;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a K or V tile.
template <class Cfg>
__device__ __forceinline__ int tile_offset(int row, int chunk) {
  if constexpr (Cfg::kSwizzled)
    return (chunk / 8) * (Cfg::kKeys * 128) + row * 128 + ((chunk % 8) ^ (row & 7)) * 16;
  else
    return row * Cfg::kRowPitch + chunk * 16;
}

// The 8-bit V bytes of this thread's P·V operands for keys 16 k16 + {2 t4, 2 t4 + 1, 2 t4 + 8,
// 2 t4 + 9} and head dims 32 q + 4 g .. + 3, each key pair interleaved: lo[i] / hi[i] hold bytes
// (d0 k0, d0 k1, d1 k0, d1 k1) / (d2 k0, d2 k1, d3 k0, d3 k1) of keys 2 t4 + 8 i and + 1.
template <class Cfg>
__device__ __forceinline__ void load_v8_pairs(const uint8_t* sv, int k16, int q, int g, int t4, uint32_t (&lo)[2],
                                              uint32_t (&hi)[2]) {
  const int k0 = 16 * k16 + 2 * t4;
  const int keys[4] = {k0, k0 + 1, k0 + 8, k0 + 9};
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = *reinterpret_cast<const uint32_t*>(sv + tile_offset<Cfg>(keys[k], 2 * q + (g >> 2)) + ((4 * g) & 15));
  lo[0] = __byte_perm(w[0], w[1], 0x5140), hi[0] = __byte_perm(w[0], w[1], 0x7362);
  lo[1] = __byte_perm(w[2], w[3], 0x5140), hi[1] = __byte_perm(w[2], w[3], 0x7362);
}

// The transpose of an 8 x 8 16-bit matrix held as an m8n8 fragment (each thread row lane / 4,
// columns 2 (lane % 4) and + 1).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The third and fourth components of a float2 / float4 (0 for a float2: not read).
__device__ __forceinline__ float vec_z(const float2&) { return 0.0f; }
__device__ __forceinline__ float vec_w(const float2&) { return 0.0f; }
__device__ __forceinline__ float vec_z(const float4& x) { return x.z; }
__device__ __forceinline__ float vec_w(const float4& x) { return x.w; }

// Merges the splits of one (sequence b, query token i, head h) row by LSE, with the sink logit as a
// partial of value 0, into O and LSE: one warp, each lane D / 32 elements. The lanes hold the
// weights of 32 splits at a time and hand them out by shuffle, so the loads of the splits' partial
// outputs do not wait on each other (a loop that read each split's LSE before its output ran at L2
// latency per split: 17 us for 30 splits). The partials are read through L2 (ld.cg): other CTAs of
// the same grid may have written them (the in-place merge).
template <int D, class T>
__device__ __forceinline__ void merge_split_row(const DecodeParams& p, int b, int i, int h, int lane) {
  const int64_t row = (int64_t(b) * p.max_q_len + i) * p.num_heads + h;
  const int64_t base = row * p.num_splits;  // == ((b * max_q_len + i) * heads + h) * splits
  const int n = p.num_splits;
  float mx = -INFINITY;
  bool nan_part = false;  // fmaxf skips NaN: a split that saw a NaN score makes the row NaN
  for (int s = lane; s < n; s += 32) {
    const float lse = __ldcg(p.part_lse + base + s);
    mx = fmaxf(mx, lse), nan_part |= lse != lse;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  nan_part = __any_sync(0xffffffffu, nan_part);
  const float sink = p.sink_logits != nullptr ? p.sink_logits[h] : -INFINITY;
  mx = fmaxf(mx, sink);
  constexpr int kPer = D / 32;
  using Vec = std::conditional_t<kPer == 2, float2, float4>;
  static_assert(kPer == 2 || kPer == 4 || kPer == 8, "D / 32 elements per lane");
  constexpr int kVecs = kPer * 4 / int(sizeof(Vec));  // Vec loads per lane and split
  float acc[kPer] = {};
  float l = 0.0f;
  // Adds split j's row (its lane's kPer floats, loaded as x) with weight w. A split with nothing
  // visible has weight 0 and wrote zeros; never let its bytes in.
  auto add = [&](float w, const Vec (&x)[kVecs]) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const float xs[4] = {x[v].x, x[v].y, vec_z(x[v]), vec_w(x[v])};
#pragma unroll
      for (int e = 0; e < int(sizeof(Vec)) / 4; ++e) acc[v * int(sizeof(Vec)) / 4 + e] += w != 0.0f ? w * xs[e] : 0.0f;
    }
  };
  auto load = [&](int64_t split, Vec (&x)[kVecs]) {
    const Vec* src = reinterpret_cast<const Vec*>(p.part_o + (base + split) * D + lane * kPer);
#pragma unroll
    for (int v = 0; v < kVecs; ++v) x[v] = __ldcg(src + v);
  };
  if (mx != -INFINITY) {
    for (int c = 0; c < n; c += 32) {
      const float lse = c + lane < n ? __ldcg(p.part_lse + base + c + lane) : -INFINITY;
      const float w_lane = lse == -INFINITY ? 0.0f : __expf(lse - mx);
      l += w_lane;
      const int m = min(32, n - c);
      // kBatch splits' loads (64 floats per lane) in flight before any is used: the merge is bound
      // by their latency (30 splits one group of 4 at a time took 9 us).
      constexpr int kBatch = 64 / kPer;
      static_assert(32 % kBatch == 0, "batches end at the 32 splits of a chunk");
      for (int j = 0; j < m; j += kBatch) {
        Vec x[kBatch][kVecs];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (j + u < m) {
            load(c + j + u, x[u]);
          } else {
#pragma unroll
            for (int v = 0; v < kVecs; ++v) x[u][v] = Vec{};
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const float w = __shfl_sync(0xffffffffu, w_lane, j + u);  // j + u < 32: kBatch divides 32
          add(j + u < m ? w : 0.0f, x[u]);
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (sink != -INFINITY) l += __expf(sink - mx);
  }
  if (nan_part) l = __int_as_float(0x7fffffff);
  const float inv = l != 0.0f ? 1.0f / l : 0.0f;
  const int q0 = p.cu_seqlens_q[b];
  T* orow = static_cast<T*>(p.o) + int64_t(q0 + i) * p.o_row_stride + h * p.o_head_stride + lane * kPer;
  using OM = MmaType<T>;
#pragma unroll
  for (int e = 0; e < kPer; e += 2) *reinterpret_cast<uint32_t*>(orow + e) = OM::pack(acc[e] * inv, acc[e + 1] * inv);
  if (lane == 0 && p.lse != nullptr)
    p.lse[int64_t(q0 + i) * p.num_heads + h] = l != 0.0f ? mx + __logf(l) : -INFINITY;
}

template <int D, class T, KvFormat F, int kRowsCta>
__global__ void __launch_bounds__(128)
    decode_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap tm_k,
                  const __grid_constant__ CUtensorMap tm_v) {
  using Cfg = DecodeCfg<D, T, F, kRowsCta>;
  constexpr bool kWide = Cfg::kWide, kCols = Cfg::kColumns;
  using MT = typename Cfg::MmaT;
  using M = MmaType<MT>;
  constexpr int kKT = D / 16;  // k-steps of QK
  constexpr int kDT = D / 8;   // n-tiles of PV
  constexpr bool kQuant = Cfg::kQuant;
  extern __shared__ __align__(128) uint8_t smem[];

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The merge kernel (launched as a programmatic dependent) may start now; it waits for this grid.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int split = blockIdx.x;
  const int hk = blockIdx.y % p.num_kv_heads;
  const int rt = blockIdx.y / p.num_kv_heads;
  const int b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;

  const int q0 = p.cu_seqlens_q[b], q_len = p.cu_seqlens_q[b + 1] - q0;
  const int k0 = p.cu_seqlens_k[b], kv_len = p.cu_seqlens_k[b + 1] - k0;
  const int rows = q_len * p.group;
  const int row0 = rt * Cfg::kRows;  // the CTA's first row
  if (row0 >= rows) return;
  const int row_hi = min(rows, row0 + Cfg::kRows) - 1;
  const int64_t shift = int64_t(kv_len) - q_len;  // aligned position = token + shift
  const int64_t qp_min = row0 / p.group + shift, qp_max = row_hi / p.group + shift;
  const int warp_row0 = row0 + (kWide ? 16 * warp : 0);  // this warp's 16 rows

  // This thread's two rows (g and g + 8 of the warp's 16; in the columns form 2 t4 and 2 t4 + 1 of
  // the CTA's 8): token, query head, mask.
  int tok[2], head[2];
  bool valid[2];
  RowMask rmask[2] = {RowMask(p.mask, 0, 0), RowMask(p.mask, 0, 0)};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int pr = kCols ? row0 + 2 * t4 + r : warp_row0 + g + 8 * r;
    valid[r] = pr < rows;
    tok[r] = valid[r] ? pr / p.group : 0;
    head[r] = hk * p.group + (valid[r] ? pr % p.group : 0);
    rmask[r] = valid[r] ? RowMask(p.mask, tok[r] + shift, kv_len) : RowMask(p.mask, -1, 0);
  }

  // Q fragments, loaded once (raw dot units; the scale is folded into exp2): A operands of rows g
  // and g + 8, or in the columns form B operands of CTA row g (qf[kk][0..1]).
  const int q_col_row = row0 + g;
  uint32_t qf[kKT][4];
#pragma unroll
  for (int kk = 0; kk < kKT; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e & 1;  // a0: row g, a1: row g+8, a2: row g, a3: row g+8
      const int half = kCols ? e : e >> 1;  // the fragment's k-half
      const int d = kQuant ? 16 * kk + 4 * t4 + 2 * half : 16 * kk + 8 * half + 2 * t4;
      const bool q_ok = kCols ? e < 2 && q_col_row < rows : valid[r];
      const int q_tok = kCols ? q_col_row / p.group : tok[r];
      const int q_head = kCols ? hk * p.group + q_col_row % p.group : head[r];
      uint32_t v = 0;
      if (q_ok) {
        const T* qrow = static_cast<const T*>(p.q) + int64_t(q0 + q_tok) * p.q_row_stride + q_head * p.q_head_stride;
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

  uint8_t* smem_base = smem;
  if constexpr (Cfg::kSwizzled) smem_base = smem + ((1024 - (smem_addr(smem) & 1023)) & 1023);
  uint8_t* ring = smem_base + (kWide ? 0 : warp) * Cfg::kStages * Cfg::kStageBytes;
  const uint8_t* kbase = static_cast<const uint8_t*>(p.k);
  const uint8_t* vbase = static_cast<const uint8_t*>(p.v);

  constexpr bool kBulk = ESCALA_DECODE_BULK && Cfg::kBulkRows;
  const uint32_t bars = smem_addr(smem_base + Cfg::kBarOffset) + (kWide ? 0 : warp) * Cfg::kStages * 8;
  // Hopper, 128-byte rows, pages of a multiple of 16 tokens laid out as the launcher checked: one
  // TMA box (16 rows of one head) per copy.
  const bool tma = ESCALA_DECODE_BULK && Cfg::kRowBytes == 128 && !kWide && p.use_tma;
#if ESCALA_DECODE_BULK
  if ((kBulk || tma) && lane == 0)
    for (int st = 0; st < Cfg::kStages; ++st) bar_init(bars + st * 8);
  __syncwarp();
#endif

  // The warp's i-th tile is t_begin + warp + 4 i (t_begin + i when wide: every warp, every tile).
  // Lane l looks up the page of key l % kKeys of the warp's tiles one tile ahead, so the page-table
  // read never stalls the copies it feeds; the copies of a row get its page from that lane by a
  // shuffle.
  const int r_lane = lane % Cfg::kKeys;
  const int tile_of0 = t_begin + (kWide ? 0 : warp), tile_step = kWide ? 1 : Cfg::kWarps;
  auto lane_key = [&](int i) {  // -1 past the warp's tiles
    const int t = tile_of0 + tile_step * i;
    if (t >= t_end) return -1;
    const int kpos = tr.at(t) * Cfg::kKeys + r_lane;
    // Rows past the end: zeros (cp.async) or a copy of the last row (bulk), masked either way.
    return kpos < kv_len ? kpos : (kBulk ? kv_len - 1 : kv_len);
  };
  auto page_of = [&](int key) {
    return p.page_size > 0 && key >= 0 && key < kv_len ? pages[page_pos(key, p.page_div).page] : 0;
  };
  int32_t next_page = page_of(lane_key(0));

  // Issues the loads of the warp's i-th tile into `stage` (K/V rows and, for 8-bit formats, their
  // scales). Called for i = 0, 1, 2, ... in order.
  auto load_tile = [&](int i, int stage) {
    const int t = tile_of0 + tile_step * i;
    const int32_t my_page = next_page;  // the page of key (lane % kKeys) of this tile
    next_page = page_of(lane_key(i + 1));
    if (t < t_end) {
      const int key_lo = tr.at(t) * Cfg::kKeys;
      const uint32_t st = smem_addr(ring + stage * Cfg::kStageBytes);
      // Where (key r, K or V) lives, for r < kKeys; `page` is key r's page.
      auto row_src = [&](int r, int is_v, int32_t page, bool& ok, int64_t& slot) {
        int key = key_lo + r;
        ok = key < kv_len;
        if (!ok) key = kBulk ? kv_len - 1 : 0;  // bulk: a copy of the last row; cp.async: zeros
        const int64_t row_stride = is_v ? p.v_row_stride : p.k_row_stride;
        const int64_t head_stride = is_v ? p.v_head_stride : p.k_head_stride;
        int64_t row;
        if (p.page_size > 0) {
          const int s_in = page_pos(key, p.page_div).row;
          slot = int64_t(page) * p.page_size + s_in;
          row = int64_t(page) * (is_v ? p.v_page_stride : p.k_page_stride) + s_in * row_stride + hk * head_stride;
        } else {
          slot = int64_t(k0) + key;
          row = slot * row_stride + hk * head_stride;
        }
        return (is_v ? vbase : kbase) + row * Cfg::kElemBytes;
      };
      if (tma) {
#if ESCALA_DECODE_BULK
        // Lane 0: kKeys / 16 boxes each of K and V. Rows past the end of the sequence are whatever
        // the pool holds there (a box wholly past it reads page 0): their scores are masked, and V
        // rows are zeroed before use.
        constexpr int kBoxes = Cfg::kKeys / Cfg::kTmaBoxRows;
        int32_t box_page[kBoxes];
#pragma unroll
        for (int bx = 0; bx < kBoxes; ++bx) box_page[bx] = __shfl_sync(0xffffffffu, my_page, bx * Cfg::kTmaBoxRows);
        if (lane == 0) {
          const uint32_t bar = bars + stage * 8;
          mbar_arrive_expect_tx(bar, 2 * Cfg::kKeys * Cfg::kRowBytes);
#pragma unroll
          for (int bx = 0; bx < kBoxes; ++bx) {
            const int key = key_lo + bx * Cfg::kTmaBoxRows;
            const int row = p.page_size > 0 ? box_page[bx] * p.page_size + page_pos(key, p.page_div).row
                                          : k0 + key;
            const uint32_t off = bx * Cfg::kTmaBoxRows * Cfg::kRowPitch;
            tma_load_3d(st + off, &tm_k, 0, hk, row, bar);
            tma_load_3d(st + Cfg::kTileBytes + off, &tm_v, 0, hk, row, bar);
          }
        }
#endif
      } else if constexpr (kBulk) {
#if ESCALA_DECODE_BULK
        // One lane per row (kKeys == 16): lanes 0-15 the K rows, 16-31 the V rows.
        const uint32_t bar = bars + stage * 8;
        if (lane == 0) mbar_arrive_expect_tx(bar, 2 * Cfg::kKeys * Cfg::kRowBytes);
        __syncwarp();
        bool ok;
        int64_t slot;
        const int is_v = lane / Cfg::kKeys;
        const uint8_t* src = row_src(r_lane, is_v, my_page, ok, slot);
        bulk_copy(st + is_v * Cfg::kTileBytes + r_lane * Cfg::kRowPitch, src, Cfg::kRowBytes, bar);
#endif
      } else {
        // Consecutive lanes take consecutive 16-byte chunks of a row: each instruction reads whole
        // 128-byte lines. Lane r computes where key r's K and V rows are; the copies fetch that by
        // shuffle. Wide: the warps share the tile's copies.
        bool ok;
        int64_t slot;
        const long long k_off = row_src(r_lane, 0, my_page, ok, slot) - kbase;
        const long long v_off = row_src(r_lane, 1, my_page, ok, slot) - vbase;
        constexpr int kCopies = 2 * Cfg::kKeys * Cfg::kChunks / 32 / (kWide ? Cfg::kWarps : 1);
#pragma unroll
        for (int j = 0; j < kCopies; ++j) {
          const int e = lane + 32 * (j + (kWide ? warp * kCopies : 0)), rho = e / Cfg::kChunks, c = e % Cfg::kChunks;
          const int is_v = rho / Cfg::kKeys, r = rho % Cfg::kKeys;
          const long long off = __shfl_sync(0xffffffffu, is_v ? v_off : k_off, r);
          cp_async_16(st + is_v * Cfg::kTileBytes + tile_offset<Cfg>(r, c), (is_v ? vbase : kbase) + off + c * 16,
                      key_lo + r < kv_len);
        }
      }
      if (kQuant && (!kWide || warp == 0)) {
#pragma unroll
        for (int rho = lane; rho < 2 * Cfg::kKeys; rho += 32) {
          const int is_v = rho / Cfg::kKeys;
          bool ok;
          int64_t slot;
          row_src(r_lane, is_v, my_page, ok, slot);
          const float* scales = is_v ? p.v_scale : p.k_scale;
          const int64_t idx = (F == KvFormat::kInt8 ? slot : int64_t(my_page)) * p.num_kv_heads + hk;
          cp_async_4(st + 2 * Cfg::kTileBytes + (is_v * Cfg::kKeys + r_lane) * 4, scales + idx, true);
        }
      }
    }
    cp_async_commit();  // an empty group keeps the wait counts uniform
  };

  // O accumulators: n-tiles of head dims (rows on M), or in the columns form O^T's m-tiles of 16
  // head dims (rows on N).
  constexpr int kOT = kCols ? D / 16 : kDT;
  float o[kOT][4];
#pragma unroll
  for (int j = 0; j < kOT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  const int my_tiles = kWide ? t_end - t_begin
                             : (t_begin + warp < t_end ? (t_end - t_begin - warp + Cfg::kWarps - 1) / Cfg::kWarps : 0);
  // Tiles in flight while a warp waits (Cfg::kRefillAtRelease).
  constexpr bool kAtRelease = Cfg::kRefillAtRelease;
  constexpr int kAhead = kAtRelease ? Cfg::kStages : Cfg::kStages - 1;
#pragma unroll
  for (int i = 0; i < kAhead; ++i) load_tile(i, i);

  for (int i = 0; i < my_tiles; ++i) {
    const int stage = i % Cfg::kStages;
#if ESCALA_DECODE_BULK
    if (kBulk || tma) mbar_wait(bars + stage * 8, (i / Cfg::kStages) & 1);
#endif
    cp_async_wait<kAhead - 1>();
    // Wide: every warp's copies of tile i have landed, and every warp is done with tile i - 1.
    if constexpr (kWide) __syncthreads(); else __syncwarp();
    // The stage of tile i - 1 is free: refill it now, so the copies run under this tile's math.
    if constexpr (!kAtRelease) load_tile(i + Cfg::kStages - 1, (i + Cfg::kStages - 1) % Cfg::kStages);
    const uint8_t* sk = ring + stage * Cfg::kStageBytes;
    const uint8_t* sv = sk + Cfg::kTileBytes;
    const int key_lo = tr.at(tile_of0 + tile_step * i) * Cfg::kKeys;
    if (tma && key_lo + Cfg::kKeys > kv_len) {
      // The last tile of a sequence: V rows past its end hold pool bytes (maybe NaN patterns) that
      // a zero probability would not cancel; zero them.
      if (lane < Cfg::kKeys && key_lo + lane >= kv_len) {
        uint8_t* vt = ring + stage * Cfg::kStageBytes + Cfg::kTileBytes;
#pragma unroll
        for (int c = 0; c < Cfg::kRowBytes / 16; ++c)
          *reinterpret_cast<uint4*>(vt + tile_offset<Cfg>(lane, c)) = make_uint4(0, 0, 0, 0);
      }
      __syncwarp();
    }

    if constexpr (kCols) {
      // S^T = K Q^T: keys on the M side (kKeys / 16 m-tiles), the CTA's 8 rows on N; s[m][e] is
      // key 16 m + g + 8 (e / 2) of row 2 t4 + (e & 1). Same shared loads and conversions as the
      // 16-row form, half the MMAs.
      constexpr int kMT = Cfg::kKeys / 16;
      float s[kMT][4];
#pragma unroll
      for (int m = 0; m < kMT; ++m) s[m][0] = s[m][1] = s[m][2] = s[m][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kKT; ++kk)
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          uint32_t a[4];
          if constexpr (kQuant) {
            const uint32_t w0 = *reinterpret_cast<const uint32_t*>(sk + tile_offset<Cfg>(16 * m + g, kk) + 4 * t4);
            const uint32_t w1 = *reinterpret_cast<const uint32_t*>(sk + tile_offset<Cfg>(16 * m + g + 8, kk) + 4 * t4);
            a[0] = cvt8x2<F>(w0, false), a[1] = cvt8x2<F>(w1, false), a[2] = cvt8x2<F>(w0, true), a[3] = cvt8x2<F>(w1, true);
          } else {
            // K rows 16 m + (lane & 15), head-dim halves by lane / 16: the A fragment as stored.
            ldmatrix_x4(a, smem_addr(sk + tile_offset<Cfg>(16 * m + (lane & 15), 2 * kk + (lane >> 4))));
          }
          M::mma(s[m], a, qf[kk][0], qf[kk][1]);
        }
      const float* ks = reinterpret_cast<const float*>(sk + 2 * Cfg::kTileBytes);
      const float* vs = ks + Cfg::kKeys;
      if constexpr (kQuant) {
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[m][e] *= ks[16 * m + g + 8 * (e >> 1)] * format_scale_factor<F>();
      }
      apply_softcap<kMT>(s, p.scale, p.softcap);
      if (!tile_fully_visible(p.mask, qp_min, qp_max, key_lo, Cfg::kKeys, kv_len)) {
#pragma unroll
        for (int m = 0; m < kMT; ++m)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!rmask[e & 1].visible(key_lo + 16 * m + g + 8 * (e >> 1))) s[m][e] = -INFINITY;
      }
      float alpha[2];
      softmax_update<kMT, false, true>(s, row_max, row_sum, p.scale_log2, alpha);
      if (warp_needs_rescale(alpha)) rescale_rows<kOT, true>(o, alpha);
      // P^T as B operands of O^T += V^T P^T: each 8 x 8 block (keys g, rows 2 t4 and + 1) transposed.
      uint32_t pb[kMT][2];
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        if constexpr (kQuant) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[m][e] *= vs[16 * m + g + 8 * (e >> 1)] * format_scale_factor<F>();
        }
        pb[m][0] = movmatrix_trans(M::pack(s[m][0], s[m][1]));
        pb[m][1] = movmatrix_trans(M::pack(s[m][2], s[m][3]));
      }
      // V^T as A operands. 16-bit: m-tile j holds head dims 16 j + g and + 8, each 8 x 8 block a
      // transposed load of the stored V. 8-bit, from the same words as the 16-row form: m-tile
      // 2 q + h holds head dims 32 q + 4 g + 2 h (row g) and + 1 (row g + 8).
#pragma unroll
      for (int m = 0; m < kMT && !kQuant; ++m) {
        const int key = 16 * m + (lane & 7) + ((lane >> 4) << 3);
#pragma unroll
        for (int j = 0; j < kOT; ++j) {
          uint32_t a[4];
          ldmatrix_x4_trans(a, smem_addr(sv + tile_offset<Cfg>(key, 2 * j + ((lane >> 3) & 1))));
          M::mma(o[j], a, pb[m][0], pb[m][1]);
        }
      }
#pragma unroll
      for (int m = 0; m < kMT && kQuant; ++m) {
#pragma unroll
        for (int q = 0; q < D / 32; ++q) {
          uint32_t lo[2], hi[2];
          load_v8_pairs<Cfg>(sv, m, q, g, t4, lo, hi);
          const uint32_t a0[4] = {cvt8x2<F>(lo[0], false), cvt8x2<F>(lo[0], true), cvt8x2<F>(lo[1], false),
                                  cvt8x2<F>(lo[1], true)};
          const uint32_t a1[4] = {cvt8x2<F>(hi[0], false), cvt8x2<F>(hi[0], true), cvt8x2<F>(hi[1], false),
                                  cvt8x2<F>(hi[1], true)};
          M::mma(o[2 * q], a0, pb[m][0], pb[m][1]);
          M::mma(o[2 * q + 1], a1, pb[m][0], pb[m][1]);
        }
      }
    } else {
      // S = Q K^T for 16 rows x kKeys keys.
      constexpr int kNT = Cfg::kNT;
      float s[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
      if constexpr (!kQuant) {
#pragma unroll
        for (int j2 = 0; j2 < kNT; j2 += 2) {
          const int key = 8 * j2 + ((lane >> 4) << 3) + (lane & 7);
#pragma unroll
          for (int kk = 0; kk < kKT; ++kk) {
            uint32_t bf[4];
            const int chunk = 2 * kk + ((lane >> 3) & 1);
            ldmatrix_x4(bf, smem_addr(sk + tile_offset<Cfg>(key, chunk)));
            M::mma(s[j2], qf[kk], bf[0], bf[1]);
            M::mma(s[j2 + 1], qf[kk], bf[2], bf[3]);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kKT; ++kk)
#pragma unroll
          for (int j = 0; j < kNT; ++j) {
            const int key = 8 * j + g;
            const uint32_t w = *reinterpret_cast<const uint32_t*>(sk + tile_offset<Cfg>(key, kk) + 4 * t4);
            M::mma(s[j], qf[kk], cvt8x2<F>(w, false), cvt8x2<F>(w, true));
          }
        const float* ks = reinterpret_cast<const float*>(sk + 2 * Cfg::kTileBytes);
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] *= ks[8 * j + 2 * t4 + (e & 1)] * format_scale_factor<F>();
      }

      // Soft-cap, mask, online softmax.
      apply_softcap<kNT>(s, p.scale, p.softcap);
      if (!tile_fully_visible(p.mask, qp_min, qp_max, key_lo, Cfg::kKeys, kv_len)) {
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!rmask[e / 2].visible(key_lo + 8 * j + 2 * t4 + (e & 1))) s[j][e] = -INFINITY;
      }
      float alpha[2];
      softmax_update<kNT>(s, row_max, row_sum, p.scale_log2, alpha);
      // Once the running max settles (most tiles of a long row), alpha is exactly 1: skip the pass.
      if (warp_needs_rescale(alpha)) rescale_rows<kDT>(o, alpha);
      if constexpr (kQuant) {
        const float* vs = reinterpret_cast<const float*>(sk + 2 * Cfg::kTileBytes) + Cfg::kKeys;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[j][e] *= vs[8 * j + 2 * t4 + (e & 1)] * format_scale_factor<F>();
      }
      uint32_t pf[kNT / 2][4];
      pack_p<MT, kNT>(s, pf);

      // O += P V, one 16-key k-step at a time.
#pragma unroll
      for (int ks16 = 0; ks16 < kNT / 2; ++ks16) {
        if constexpr (!kQuant) {
          const int key = 16 * ks16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
          for (int j = 0; j < kDT; j += 2) {
            uint32_t bf[4];
            const int chunk = j + (lane >> 4);
            ldmatrix_x4_trans(bf, smem_addr(sv + tile_offset<Cfg>(key, chunk)));
            M::mma(o[j], pf[ks16], bf[0], bf[1]);
            M::mma(o[j + 1], pf[ks16], bf[2], bf[3]);
          }
        } else {
#pragma unroll
          for (int q = 0; q < D / 32; ++q) {
            uint32_t lo[2], hi[2];  // each B register: one head dim of two keys
            load_v8_pairs<Cfg>(sv, ks16, q, g, t4, lo, hi);
            M::mma(o[4 * q + 0], pf[ks16], cvt8x2<F>(lo[0], false), cvt8x2<F>(lo[1], false));
            M::mma(o[4 * q + 1], pf[ks16], cvt8x2<F>(lo[0], true), cvt8x2<F>(lo[1], true));
            M::mma(o[4 * q + 2], pf[ks16], cvt8x2<F>(hi[0], false), cvt8x2<F>(hi[1], false));
            M::mma(o[4 * q + 3], pf[ks16], cvt8x2<F>(hi[0], true), cvt8x2<F>(hi[1], true));
          }
        }
      }
    }
    if constexpr (kAtRelease) {
      // Every lane is done reading this stage: refill it with the warp's tile i + kStages.
      __syncwarp();
      load_tile(i + Cfg::kStages, stage);
    }
  }
  cp_async_wait<0>();
  __syncthreads();

  // Merge the 4 warps' partial softmax states of the same 16 rows through shared memory (wide: the
  // warps hold different rows, so this only gathers them: slab row 16 w + r is CTA row 16 w + r).
  constexpr int kSum = kWide ? 1 : Cfg::kWarps;  // slabs summed per output row
  float* slab = reinterpret_cast<float*>(smem);  // [warp][row][D]
  float* sm_max = slab + Cfg::kWarps * 16 * D;   // [warp][row]
  float* sm_sum = sm_max + Cfg::kWarps * 16;
  float* row_m = sm_sum + Cfg::kWarps * 16;  // [CTA row]: merged max (raw units), merged sum
  float* row_l = row_m + Cfg::kRows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = row_total<kCols>(row_sum[r]);
    const int row = kCols ? 2 * t4 + r : g + 8 * r;
    if ((kCols ? g : t4) == 0) sm_max[warp * 16 + row] = row_max[r], sm_sum[warp * 16 + row] = l;
  }
  __syncthreads();
  if (kWide && threadIdx.x < Cfg::kRows) {
    row_m[threadIdx.x] = sm_max[threadIdx.x], row_l[threadIdx.x] = sm_sum[threadIdx.x];
  } else if (!kWide && threadIdx.x < Cfg::kRows) {
    float mx = -INFINITY;
    for (int w = 0; w < Cfg::kWarps; ++w) mx = fmaxf(mx, sm_max[w * 16 + threadIdx.x]);
    float l = 0.0f;
    for (int w = 0; w < Cfg::kWarps; ++w) {
      // A warp whose keys were all masked has sum 0, or NaN from a NaN score: add it as it is.
      const float mw = sm_max[w * 16 + threadIdx.x], lw = sm_sum[w * 16 + threadIdx.x];
      l += mw != -INFINITY ? lw * fast_exp2((mw - mx) * p.scale_log2) : lw;
    }
    row_m[threadIdx.x] = mx, row_l[threadIdx.x] = l;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = kCols ? 2 * t4 + r : g + 8 * r;
    float mx = -INFINITY;
    if (kWide) mx = row_max[r];
    else
      for (int w = 0; w < Cfg::kWarps; ++w) mx = fmaxf(mx, sm_max[w * 16 + row]);
    const float f = row_max[r] == -INFINITY ? 0.0f : fast_exp2((row_max[r] - mx) * p.scale_log2);
    float* dst = slab + (warp * 16 + row) * D;
    if constexpr (kCols) {
#pragma unroll
      for (int j = 0; j < kOT; ++j) {
        if constexpr (kQuant) {
          const int d = 32 * (j / 2) + 4 * g + 2 * (j % 2);
          dst[d] = o[j][r] * f, dst[d + 1] = o[j][r + 2] * f;
        } else {
          dst[16 * j + g] = o[j][r] * f, dst[16 * j + g + 8] = o[j][r + 2] * f;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kDT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) dst[o_column<kQuant>(j, 2 * t4 + e)] = o[j][2 * r + e] * f;
    }
  }
  __syncthreads();

  for (int idx = threadIdx.x; idx < Cfg::kRows * D / 2; idx += Cfg::kThreads) {
    const int row = idx / (D / 2), d = 2 * (idx % (D / 2));
    const int pr = row0 + row;
    if (pr >= rows) continue;
    const int i = pr / p.group, h = hk * p.group + pr % p.group;
    float a = 0.0f, c = 0.0f;
    for (int w = 0; w < kSum; ++w) a += slab[(w * 16 + row) * D + d], c += slab[(w * 16 + row) * D + d + 1];
    float l = row_l[row];
    float m2 = row_m[row] == -INFINITY ? -INFINITY : row_m[row] * p.scale_log2;  // log2 units
    if (p.num_splits == 1) {
      const float ofac = join_sink_logit(p.sink_logits ? p.sink_logits + h : nullptr, m2, l);
      const float inv = l != 0.0f ? ofac / l : 0.0f;
      T* orow = static_cast<T*>(p.o) + int64_t(q0 + i) * p.o_row_stride + h * p.o_head_stride;
      using OM = MmaType<T>;
      *reinterpret_cast<uint32_t*>(orow + d) = OM::pack(a * inv, c * inv);
      if (d == 0 && p.lse != nullptr)
        p.lse[int64_t(q0 + i) * p.num_heads + h] = row_lse(m2, l);
    } else {
      const int64_t part = ((int64_t(b) * p.max_q_len + i) * p.num_heads + h) * p.num_splits + split;
      const float inv = l != 0.0f ? 1.0f / l : 0.0f;
      *reinterpret_cast<float2*>(p.part_o + part * D + d) = make_float2(a * inv, c * inv);
      if (d == 0) p.part_lse[part] = row_lse(m2, l);
    }
  }

  // In-place merge (16-row CTAs): the last of a (sequence, kv head, row tile)'s split CTAs to
  // finish merges their partials, instead of a second kernel after the whole grid. Each CTA
  // publishes its partials (fence, then a counter increment); the one that brings the counter to
  // num_splits reads them all from L2 and resets the counter, so the next launch (or a CUDA graph
  // replay) starts from zero again.
  if constexpr (!kWide) {
    if (p.num_splits > 1 && p.merge_counters != nullptr) {
      __threadfence();
      __syncthreads();
      int* is_last = reinterpret_cast<int*>(row_l + Cfg::kRows);
      if (threadIdx.x == 0) {
        int* counter = p.merge_counters + (int64_t(b) * gridDim.y + blockIdx.y);
        const bool last = atomicAdd(counter, 1) == p.num_splits - 1;
        if (last) *counter = 0;
        *is_last = last;
      }
      __syncthreads();
      if (*is_last) {
        __threadfence();
        for (int pr = row0 + warp; pr <= row_hi; pr += Cfg::kWarps)
          merge_split_row<D, T>(p, b, pr / p.group, hk * p.group + pr % p.group, lane);
      }
    }
  }
}

// The merge as a kernel of its own (the wide form, and the sm_90 prefill kernel's splits): one warp
// per (sequence, query token, head) row; rows past a sequence's query count exit.
template <int D, class T>
__global__ void __launch_bounds__(128) decode_merge_kernel(const DecodeParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched early (programmatic dependent launch): wait until the decode grid has finished and
  // its partial results are visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t per_seq = int64_t(p.max_q_len) * p.num_heads;
  if (row >= per_seq * p.batch) return;
  const int b = static_cast<int>(row / per_seq);
  const int i = static_cast<int>((row / p.num_heads) % p.max_q_len), h = static_cast<int>(row % p.num_heads);
  if (i >= p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]) return;
  merge_split_row<D, T>(p, b, i, h, threadIdx.x % 32);
}

}  // namespace escala::attn::cuda
