// The Hopper (sm_90a) prefill kernel, FlashAttention-3 design: a persistent grid (one CTA per SM)
// of a producer and two or three consumer warpgroups that take (sequence, head, query tile) work
// items from a global counter, longest tiles first. Warpgroup 0 is the producer: a scheduler thread
// claims the next item, hands it to the loader and the consumers through a two-slot ring in shared
// memory and loads its Q; a loader thread issues TMA loads of the K/V tiles into a kStages-deep
// shared-memory ring, completed on mbarriers; the warpgroup gives its registers away with
// setmaxnreg. The other warpgroups are consumers, 64 query rows each:
// S = Q Kᵀ with wgmma (both operands in shared memory, 128-byte swizzle), online softmax on the
// accumulators in registers, O += P V with wgmma (P from registers, V N-major in shared memory),
// then release the stage; O leaves through shared memory by TMA bulk stores. The softmax of tile i
// is placed to overlap P V of tile i-1 (ptxas keeps that order only where the wait is pinned, see
// the tile loop), the epilogue of one item overlaps the loads of the next, and the consumers take
// turns issuing GEMMs (ping-pong, named barriers).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention/cuda/fwd_params.h"
#include "attention/cuda/online_softmax.cuh"
#include "attention/cuda/page_pos.h"
#include "attention/cuda/sm90/epilogue.cuh"
#include "attention/cuda/sm80/ptx.cuh"
#include "attention/cuda/sm90/ptx90.cuh"
#include "attention/cuda/sm90/trace.cuh"
#include "attention/cuda/sm90/wgmma_ops.cuh"
#include "attention/cuda/sm90/work_order.h"
#include "attention/cuda/tile_range.cuh"

namespace escala::attn::cuda {

// DQK / DV: tile widths of Q·K and of V / O (multiples of 64: the TMA box and swizzle width). A
// head dim below the width (96 in a 128-wide tile) is read as zero-padded by TMA. Consumers: the
// consumer warpgroups, 64 query rows each (3 at d = 64 as FlashAttention-3: there the softmax's
// exp2 costs as much as the two GEMMs, and a third warpgroup has its softmax run under the other
// two's GEMMs).
template <class T_, int DQK_, int DV_, int BN_, int Stages_, int Consumers_ = 2>
struct Sm90Config {
  using T = T_;
  static constexpr int DQK = DQK_;
  static constexpr int DV = DV_;
  static constexpr int kConsumers = Consumers_;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int BM = 64 * kConsumers;
  static constexpr int BN = BN_;
  static constexpr int kStages = Stages_;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kChunksQK = DQK / 64;  // 128-byte column blocks
  static constexpr int kChunksV = DV / 64;
  static constexpr int kQBytes = BM * DQK * 2;
  static constexpr int kKTileBytes = BN * DQK * 2;
  static constexpr int kVTileBytes = BN * DV * 2;
  // The epilogue stages O through shared memory (epilogue.cuh), 16 rows per consumer warp: in a
  // buffer of its own where that fits (d_v <= 128), else over the V stages (FlashAttention-3's
  // layout; the producer then loads an item's first V tile only once the previous item's O has
  // left them). From its own buffer each warp writes its slice out with TMA bulk stores and does
  // not wait for them until it stages its next item (over the V stages: kOInVBulkStore). The
  // 192-row d = 64 kernel too since session 30 (staged with the copy-out it had measured 1% slower
  // than its stores from registers; with the bulk stores S1k full / causal 4.0 / 5.7% faster, S4k
  // 1.5 / 3.0%, S16k 0.6%).
  // Row sums by the tensor cores: at d_v = 64 with three consumer warpgroups P V runs as m64n72:
  // the ninth column tile reads, per V stage, a constant block whose first column is 1.0 (at the
  // descriptor's leading offset from the stage, after the V ring), so that column of O accumulates
  // each row's sum of P as rounded for P V, rescaled with O. It removes the softmax's FADDs; the
  // 128-row kernel measured 1.4-4.9% slower with it (its tensor pipe is nearer its bound), the
  // 192-row one 0.6-0.8% faster (cuda_notes step 118).
  static constexpr bool kGemmRowSums = kConsumers == 3 && DV == 64;
  static constexpr int kOnesOffset = kQBytes + kStages * (kKTileBytes + kVTileBytes);
  static constexpr int kOnesBytes = kGemmRowSums ? kStages * kVTileBytes : 0;
  static constexpr int kOOffset = kOnesOffset + kOnesBytes;
  static constexpr int kOBytes = BM * DV * 2;
  // After the tiles: barriers (192 bytes), the two item slots (80 bytes each), alignment slack.
  static constexpr int kSlotInt4s = 5;
  static constexpr int kTailBytes = 192 + 2 * 16 * kSlotInt4s + 1024;
  static constexpr bool kStagedO = kOOffset + kOBytes + kTailBytes <= 227 * 1024;
  static constexpr bool kStagedOInV = kConsumers == 2 && !kStagedO && kOBytes <= kStages * kVTileBytes;
  // O over the V stages also leaves by bulk stores at d_v > 128, each warp waiting for their reads
  // before the stages are released (session 19: d256 S1k 0.6-0.8% faster, d192 neutral; the
  // d192/128 kernel 0.6% slower, so it keeps the copy).
  static constexpr bool kOInVBulkStore = kStagedOInV && DV > 128;
  static constexpr int kBarOffset = kOOffset + (kStagedO ? kOBytes : 0);
  static constexpr int kSlotOffset = kBarOffset + 192;
  static constexpr int kSmemBytes = kBarOffset + kTailBytes;
  static_assert(8 * (8 + 4 * Stages_) <= 192, "barrier area");
  static_assert(DQK % 64 == 0 && DV % 64 == 0 && BN % 16 == 0, "tile shape");
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  // setmaxnreg moves registers within what the launch gave the CTA (65536 / kThreads each, rounded
  // down to 8, from the launch bounds: 168 at 384 threads, 128 at 512): a consumer's setmaxnreg.inc
  // waits for the producer's registers, so a sum above that never completes. 24 leaves the
  // producer threads some spills (per item). At d_v = 64 the producer takes 56 (consumers 224): its
  // spills, 176 bytes, go (session 21: d64 S1k 0.5-1.3%, S4k causal 0.9% faster). At d_v = 128
  // 56 / 224 and 40 / 232 were 0.4-1.4% slower at S4k-16k, so wider tiles keep 24 / 240.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr bool kWideProducer = kConsumers == 2 && DV <= 64;
  static constexpr int kProducerRegs = kWideProducer ? 56 : 24;
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : kWideProducer ? 224 : 240;
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kLaunchRegs * kThreads, "register budget");
  // The paged/split variant's producer holds a tile's page rows and its split bounds: at 24
  // registers the d = 128 kernel spilled 180 bytes (ptxas), at 56 (consumers 224) 12. At d = 256
  // the consumers need more: 40 / 232 spills least there (200 bytes, against 292 at 24 / 240).
  // (Two consumer warpgroups only: the launcher gives that variant a two-warpgroup config.)
  static constexpr int kSplitProducerRegs = DV > 128 ? 40 : 56, kSplitConsumerRegs = DV > 128 ? 232 : 224;
  // Sinks below the window cost a whole key tile for a few keys (4 in the benchmark's shape): the
  // dense d = 128 kernel reads at most kSinkKeys of them as a narrow tile instead (Q Kᵀ as a 16-key
  // wgmma, P V as one k-step), the item's last. Session 22: sinks + window 4096 at S16k 3.6-4.1%
  // faster, the dense shapes within -0.8..+0.4%. At d = 64 the sink shape did not gain and the
  // new code reshaped the tile loop: S1k full / causal 8 / 5% slower, so d = 64 keeps whole tiles.
  static constexpr bool kNarrowSinks = kConsumers == 2 && DV == 128 && DQK == DV;
  static constexpr int kSinkKeys = 16;
  static_assert(kConsumers != 2 || 128 * kSplitProducerRegs + 256 * kSplitConsumerRegs <= kLaunchRegs * kThreads,
                "register budget");
  // Dense calls with neither sink tokens nor a soft-cap run an instantiation without their code
  // (transform_and_mask's kSinksSoftcap; learned sink logits are the epilogue's and run on both):
  // in the d = 128 kernel that code was 56% of the key-tile loop's instructions (2298 -> 1009)
  // without being run there, and taking it out measured 0.7-2.1% faster on every such d = 128
  // shape in two runs (window 4096 0.7 / 1.6%; cuda_notes step 158). The other head dims keep
  // one instantiation (not measured; their loops carry the same code).
  static constexpr bool kPlainVariant = DQK == 128 && DV == 128 && kConsumers == 2;
};

// kSplitPaged: the variant for paged K/V and split-KV (the plain variant has neither, so their
// code and registers stay out of the dense prefill path; measured: one kernel for both cost
// 3-25% on the dense shapes). kSinksSoftcap = false: a dense kernel for calls with neither sinks
// nor a soft-cap (Sm90Config::kPlainVariant).
template <class Cfg, bool kSplitPaged, bool kSinksSoftcap = true>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fwd_sm90_kernel(const FwdParams p, const __grid_constant__ CUtensorMap tm_q,
                    const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                    const __grid_constant__ CUtensorMap tm_k_run, const __grid_constant__ CUtensorMap tm_v_run,
                    const __grid_constant__ CUtensorMap tm_o) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using T = typename Cfg::T;
  constexpr int DQK = Cfg::DQK, DV = Cfg::DV, BM = Cfg::BM, BN = Cfg::BN, S = Cfg::kStages;
  constexpr int kNT = BN / 8, kDT = DV / 8;
  constexpr bool kNarrow = Cfg::kNarrowSinks && !kSplitPaged;
  constexpr int kSinkNT = Cfg::kSinkKeys / 8;
  // The conditional O rescale (online_softmax.cuh) wherever the tile is wider than 64: session 20,
  // with the pin below, d128 S16k / S4k full -2.7 / -1.3%, paged d128 -2.7% against the rescale
  // on every tile; at d = 64 it was 3.6-4.1% slower (S = 1k, S4k causal).
  constexpr bool kLazyRescale = DQK > 64;
  constexpr int kProducerRegs = kSplitPaged ? Cfg::kSplitProducerRegs : Cfg::kProducerRegs;
  constexpr int kConsumerRegs = kSplitPaged ? Cfg::kSplitConsumerRegs : Cfg::kConsumerRegs;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t sQ = base;
  const uint32_t sK = sQ + Cfg::kQBytes;  // stage s at sK + s * kKTileBytes
  const uint32_t sV = sK + S * Cfg::kKTileBytes;
  const uint32_t sO = base + Cfg::kOOffset;  // staged O (Cfg::kStagedO)
  // Barriers: q_full, q_empty, full_k[S], empty_k[S], full_v[S], empty_v[S], item_full[2],
  // item_empty[2], o_free, claim_go; then the two item slots.
  const uint32_t bars = base + Cfg::kBarOffset;
  const uint32_t q_full = bars, q_empty = bars + 8u;
  auto full_k = [&](int s) { return bars + 8u * (2 + s); };
  auto empty_k = [&](int s) { return bars + 8u * (2 + S + s); };
  auto full_v = [&](int s) { return bars + 8u * (2 + 2 * S + s); };
  auto empty_v = [&](int s) { return bars + 8u * (2 + 3 * S + s); };
  auto item_full = [&](int s) { return bars + 8u * (2 + 4 * S + s); };
  auto item_empty = [&](int s) { return bars + 8u * (4 + 4 * S + s); };
  // Staged O over the V stages (dense variant), for items of 1..kOInVMaxTiles key tiles (short
  // items, where the epilogue is a large share; a long item keeps its producer running ahead): one
  // phase per such item, completed when its O has left shared memory.
  constexpr bool kOInV = Cfg::kStagedOInV && !kSplitPaged;
  constexpr int kOInVMaxTiles = 32;
  auto o_in_v = [&](int n_tiles) { return kOInV && n_tiles > 0 && n_tiles <= kOInVMaxTiles; };
  const uint32_t o_free = bars + 8u * (6 + 4 * S);
  // The loader lets the scheduler claim the next item (see the producer below).
  const uint32_t claim_go = bars + 8u * (7 + 4 * S);
  // Item slot s: kSlotInt4s x int4 at slots + kSlotInt4s s (the item index, then its decoded fields).
  constexpr int kSlotInt4s = Cfg::kSlotInt4s;
  int4* slots = reinterpret_cast<int4*>(smem_raw + (base - raw) + Cfg::kSlotOffset);

  const int tid = threadIdx.x;
  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, Cfg::kConsumerThreads);
    for (int s = 0; s < S; ++s) {
      mbar_init(full_k(s), 1);
      mbar_init(full_v(s), 1);
      mbar_init(empty_k(s), Cfg::kConsumerThreads);
      mbar_init(empty_v(s), Cfg::kConsumerThreads);
    }
    for (int s = 0; s < 2; ++s) {
      mbar_init(item_full(s), 1);
      mbar_init(item_empty(s), Cfg::kConsumerThreads + 1);  // and the loader
    }
    mbar_init(o_free, Cfg::kConsumerThreads);
    mbar_init(claim_go, 1);
    mbar_init_fence();
#ifdef ESCALA_SM90_LOOP_PAD
    // Measurement aid (`#define ESCALA_SM90_LOOP_PAD n` at the top of one fwd_sm90_hd*.cu): n
    // 16-byte instructions here, run once per CTA, move the key-tile loop n x 16 bytes on with its
    // code unchanged. Where the loop starts moved S16k by up to 1.5% (cuda_notes step 157), so an
    // A/B of a change that moves it compares both builds with their loops at the same offset (mod
    // 128: bench/ptxas_report.py --sass --nvcc-flags=-DESCALA_SM90_LOOP_PAD=n).
#pragma unroll
    for (int i = 0; i < ESCALA_SM90_LOOP_PAD; ++i) asm volatile("nanosleep.u32 0;");
#endif
  }
  __syncthreads();

  // Work items. Item w lies in section w / (sec * M) of `sec` consecutive (sequence, head) pairs
  // (whose K/V fit in L2 together); inside a section the query tiles go from the last (the longest
  // under a causal mask) to the first, the pairs fastest, so that the dynamic scheduler hands out
  // the longest items first and the short ones fill the gaps at the end. Without such a mask the
  // last tile, where partial, is the shortest: the last pairs' ones go to the very end
  // (FwdParams::sched_tail).
  // With split-KV, item w is split w % num_splits of tile w / num_splits.
  const int num_bh = p.batch * p.num_heads;
  const int splits = kSplitPaged ? p.num_splits : 1;
  const int num_items = p.num_m_blocks * num_bh * splits;
  struct Item {
    int h, b, split, q0, q_len, m0, kv0, kv_len;
    int64_t shift, qp_min, qp_max;
    TileRange range;
    int lo, hi;  // this split's share [lo, hi) of the visited tiles range.at(0 .. count)
    int n_tiles;
  };
  auto decode = [&](int w, Item& it) {
    it.split = kSplitPaged ? w % splits : 0;
    if constexpr (kSplitPaged) w /= splits;
    const int per_section = p.sched_section * p.num_m_blocks;
    const int first_bh = (w / per_section) * p.sched_section;
    const int nb = min(p.sched_section, num_bh - first_bh);
    const int r = w - first_bh * p.num_m_blocks;
    const int m_block = p.num_m_blocks - 1 - r / nb;
    const int bh = first_bh + r % nb;
    it.h = bh % p.num_heads;
    const int b = bh / p.num_heads;
    it.b = b;
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
    const int visited = it.range.count();
    it.lo = kSplitPaged ? static_cast<int>(static_cast<int64_t>(visited) * it.split / splits) : 0;
    it.hi = kSplitPaged ? static_cast<int>(static_cast<int64_t>(visited) * (it.split + 1) / splits) : visited;
    it.n_tiles = it.hi - it.lo;
    return true;
  };
  // The item the scheduler's claim c takes (work_order.h: the partial last tiles of the last
  // sched_tail pairs at the end). Only the scheduler thread reorders; the slot carries the item's
  // own index. In the dense 192-row kernel only (the one whose tiles the cost model makes partial
  // at S = 1k): in the others this code re-scheduled the d = 128 key-tile loop (ptxas_report.py
  // --loop-dir).
  constexpr bool kTailOrder = Cfg::kConsumers == 3 && !kSplitPaged;
  auto claim_order = [&](int c) {
    if constexpr (!kTailOrder) return c;
    return tail_claim_order(c, num_bh, p.num_m_blocks, p.sched_tail);
  };
  // The i-th tile an item visits: its share from the last tile down (the last one carries the
  // causal / sequence-end boundary, so the running max starts from real scores).
  auto tile_of = [](const Item& it, int i) { return it.range.at(it.hi - 1 - i); };
  // The item's last tile is the narrow sink tile (kNarrow): the sinks' own tile below the window,
  // after at least one window tile.
  auto narrow_sink_tile = [&](const Item& it) {
    return kNarrow && p.narrow_sinks && it.range.sink_tiles == 1 && it.n_tiles >= 2;
  };
  // The consumers take the producer's decoded item (d128 / d64 S1k: 1-2.5% faster). At d_v = 256 the
  // fields held from the slot raised the dense kernel's spills (114 -> 306 bytes stored) and cost
  // 17%; the 192-row kernel's 160-register consumers spilled more too (152 -> 596). Those decode
  // the index again, which the compiler can rematerialise.
  constexpr bool kDecodedSlots = DV <= 128 && Cfg::kConsumers == 2;
  // Fewer instructions per key tile (session 15: d128 S1k full 0.6-2.5% faster, the 192-row d = 64
  // kernel 5%): the consumer warpgroup's index made warp-uniform, the per-item visible-tile range,
  // unsigned ring counters.
  // At d_v = 256, where the dense kernel's registers are at the edge, each of them raised its
  // per-item spills (134 -> 170-210 bytes) and cost 3-5% at S = 1k; it keeps the plain forms. (The
  // paged/split variant's spills there fell: 296 -> 160 bytes, 50 -> 13 spill instructions in its loop.)
  constexpr bool kLeanTile = DV <= 128 || kSplitPaged;
  using Counter = std::conditional_t<kLeanTile, uint32_t, int>;  // unsigned: % S, / S are a mask, a shift

  // Hands item w (-1: no more work) on, decoded (the consumers' own decode, ~200 instructions with
  // its divisions, sat between one item's epilogue and the next one's first Q Kᵀ).
  auto publish = [&](Counter& item_iter, int w, const Item& it) {
    const int slot = item_iter & 1;
    mbar_wait(item_empty(slot), ((item_iter >> 1) & 1) ^ 1);
    int4* d = slots + kSlotInt4s * slot;
    d[0] = make_int4(w, it.h, it.b, it.split);
    if (w >= 0) {
      d[1] = make_int4(it.q0, it.q_len, it.m0, it.kv_len);
      d[2] = make_int4(static_cast<int>(it.shift), static_cast<int>(it.qp_min), static_cast<int>(it.qp_max),
                       it.range.sink_tiles);
      d[3] = make_int4(it.range.first, it.range.end, it.hi, it.n_tiles);
      d[4] = make_int4(it.kv0, it.lo, 0, 0);
    }
    mbar_arrive(item_full(slot));
    ++item_iter;
  };
  // Item w and its fields from a slot publish() wrote (w < 0: no more work, no fields); the slot
  // carries the item whole, and each reader uses what it needs.
  auto read_slot = [&](const int4* src, Item& it) {
    const int4 a = src[0], b = src[1], c = src[2], e = src[3], f = src[4];
    it.h = a.y, it.b = a.z, it.split = a.w;
    it.q0 = b.x, it.q_len = b.y, it.m0 = b.z, it.kv_len = b.w;
    it.shift = c.x, it.qp_min = c.y, it.qp_max = c.z;
    it.range.sink_tiles = c.w, it.range.first = e.x, it.range.end = e.y;
    it.hi = e.z, it.n_tiles = e.w;
    it.kv0 = f.x, it.lo = f.y;
    return a.x;
  };

  const int wg = tid / 128;
  if (wg == 0) {
    // Producer.
    setmaxnreg_dec<kProducerRegs>();
    // Two threads. The scheduler (warp 1) claims items from the global counter, decodes them,
    // hands them to the loader and the consumers through a two-slot ring in shared memory and loads
    // each one's Q; the loader (warp 0) issues the K/V tile loads. Apart, the claim's atomic, the
    // decode's global loads and Q's wait for its buffer are off the K/V stream: the next item's
    // first tiles follow this item's last ones at once (one thread doing both issued them only
    // after that chain). Session 18: d128 S1k causal and paged d128 S4k causal 2% faster, d256
    // S1k 0.4-0.7%, d64 S1k 0.4% slower, the long shapes within 0.3%.
    if (tid == 32) {
      SM90_TRACE_DECL(tr, 3, true);
      Counter q_iter = 0, item_iter = 0, claims = 0;
      int c = blockIdx.x;  // the claim
      for (;;) {
        Item it;
        int w = 0;
        while (c < num_items && !decode(w = claim_order(c), it)) c = atomicAdd(p.tile_counter, 1) + gridDim.x;
        if (c >= num_items) break;
        SM90_TRACE(tr, 30);
        publish(item_iter, w, it);
        SM90_TRACE(tr, 31);
        if (it.n_tiles > 0) {
          mbar_wait(q_empty, (q_iter & 1) ^ 1);
          mbar_arrive_expect_tx(q_full, Cfg::kQBytes);
#pragma unroll
          for (int c = 0; c < Cfg::kChunksQK; ++c)
            tma_load_3d(sQ + c * BM * 128, &tm_q, c * 64, it.h, it.q0 + it.m0, q_full);
          SM90_TRACE(tr, 32);
          ++q_iter;
        }
        // The next item is claimed once the loader is near this one's end: late enough that a CTA
        // does not hold a claim through a long item while others run dry (the longest-first order
        // balances only if claims follow completion), early enough that the claim, the decode and
        // the hand-over are done when the loader wants the next item's first tile.
        mbar_wait(claim_go, claims & 1);
        ++claims;
        c = atomicAdd(p.tile_counter, 1) + gridDim.x;
      }
      publish(item_iter, -1, Item{});
      // This CTA claims nothing more. The last one to get here finds every claim of the launch
      // made and leaves the counters zero for the next launch (no memset between calls).
      __threadfence();
      if (atomicAdd(p.tile_counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
        __threadfence();
        p.tile_counter[0] = 0;
        p.tile_counter[1] = 0;
      }
    } else if (tid == 0) {
      SM90_TRACE_DECL(tr, 0, true);
      Counter kv_iter = 0, item_iter = 0;
      int o_staged = 0;          // items whose O went over the V stages so far
      bool prev_staged = false;  // the previous item with key tiles was one of them
      for (;;) {
        const int slot = item_iter & 1;
        mbar_wait(item_full(slot), (item_iter >> 1) & 1);
        Item it;
        const int w = read_slot(slots + kSlotInt4s * slot, it);
        mbar_arrive(item_empty(slot));
        ++item_iter;
        if (w < 0) break;
        SM90_TRACE(tr, 20);
        // Lets the scheduler claim the next item this many tiles before this one's last.
        constexpr int kClaimLead = 2;
        const int claim_at = it.n_tiles > kClaimLead ? it.n_tiles - 1 - kClaimLead : 0;
        if (it.n_tiles == 0) {
          mbar_arrive(claim_go);
          continue;
        }
        const int hk = it.h / p.group;
        // Paged: this item's page list and last page, once per item (the barrier waits' memory
        // clobbers keep the compiler from hoisting these loads out of the tile loop).
        const int32_t* pages = kSplitPaged && p.page_size > 0 ? p.page_indices + p.page_indptr[it.b] : nullptr;
        const int last_page = kSplitPaged && p.page_size > 0 ? page_pos(it.kv_len - 1, p.page_div).page : 0;
        for (int i = 0; i < it.n_tiles; ++i, ++kv_iter) {
          const int s = kv_iter % S;
          const uint32_t phase = (kv_iter / S) & 1;
          const int k_lo = tile_of(it, i) * BN;
          if (!kSplitPaged || p.page_size == 0) {
            const int row = it.kv0 + k_lo;
            // The narrow sink tile: kSinkKeys-row boxes (tm_k_run / tm_v_run) into the stage's
            // first rows.
            const bool narrow = narrow_sink_tile(it) && i == it.n_tiles - 1;
            const CUtensorMap* map_k = narrow ? &tm_k_run : &tm_k;
            const CUtensorMap* map_v = narrow ? &tm_v_run : &tm_v;
            const int box_rows = narrow ? Cfg::kSinkKeys : BN;
            mbar_wait(empty_k(s), phase ^ 1);
            mbar_arrive_expect_tx(full_k(s), Cfg::kChunksQK * box_rows * 128);
#pragma unroll
            for (int c = 0; c < Cfg::kChunksQK; ++c)
              tma_load_3d(sK + s * Cfg::kKTileBytes + c * BN * 128, map_k, c * 64, hk, row, full_k(s));
            SM90_TRACE(tr, 21);
            // The previous item with key tiles may still have its O staged over the V stages.
            if (kOInV && i == 0) {
              if (prev_staged) mbar_wait(o_free, (o_staged - 1) & 1);
              prev_staged = o_in_v(it.n_tiles);
              o_staged += prev_staged;
            }
            mbar_wait(empty_v(s), phase ^ 1);
            mbar_arrive_expect_tx(full_v(s), Cfg::kChunksV * box_rows * 128);
#pragma unroll
            for (int c = 0; c < Cfg::kChunksV; ++c)
              tma_load_3d(sV + s * Cfg::kVTileBytes + c * BN * 128, map_v, c * 64, hk, row, full_v(s));
            SM90_TRACE(tr, 22);
          } else {
            // Paged: one box per kv_box_rows rows, from the page that holds them (boxes past the
            // last page re-read it: masked keys, and V rows the consumers zero). (Copying the next
            // tile's page numbers to shared memory ahead with cp.async measured slower: cascade
            // 0.335 -> 0.375 ms.)
            const int box = p.kv_box_rows, boxes = BN / box;
            auto box_row = [&](int j) {
              const PagePos pos = page_pos(k_lo + j * box, p.page_div);
              return pages[min(pos.page, last_page)] * p.page_size + pos.row;
            };
            // Pages consecutive in the pool (a prefix allocated at once, say): the tile's rows are
            // one run, read as one BN-row box per chunk (the same shared-memory image; the boxes
            // per tile, not the bytes, were what the consumers waited on). The check's loads are
            // independent (no short circuit), so their latencies overlap.
            const int row0 = box_row(0);
            bool run = true;
#pragma unroll
            for (int j = 1; j < BN / 16; ++j)
              if (j < boxes) run &= box_row(j) == row0 + j * box;
            // One TMA call site per chunk and path: each site costs the loader thread a
            // uniform-register loop, and 8 unrolled box sites per chunk made it slower than the
            // consumers (paged 1.4x slower than contiguous at the same bytes, session 14).
            // The tile into `dst` (kChunks 128-byte column blocks of BN rows), completing on `bar`.
            auto load_tile = [&](auto chunks, uint32_t dst, const CUtensorMap* map_run, const CUtensorMap* map_box,
                                 uint32_t bar) {
              constexpr int kChunks = decltype(chunks)::value;
              if (run) {
#pragma unroll
                for (int c = 0; c < kChunks; ++c) tma_load_3d(dst + c * BN * 128, map_run, c * 64, hk, row0, bar);
              } else {
#pragma unroll 1
                for (int j = 0; j < boxes; ++j) {
                  const int row = box_row(j);
#pragma unroll
                  for (int c = 0; c < kChunks; ++c)
                    tma_load_3d(dst + c * BN * 128 + j * box * 128, map_box, c * 64, hk, row, bar);
                }
              }
            };
            mbar_wait(empty_k(s), phase ^ 1);
            mbar_arrive_expect_tx(full_k(s), Cfg::kKTileBytes);
            load_tile(std::integral_constant<int, Cfg::kChunksQK>{}, sK + s * Cfg::kKTileBytes, &tm_k_run, &tm_k, full_k(s));
            mbar_wait(empty_v(s), phase ^ 1);
            mbar_arrive_expect_tx(full_v(s), Cfg::kVTileBytes);
            load_tile(std::integral_constant<int, Cfg::kChunksV>{}, sV + s * Cfg::kVTileBytes, &tm_v_run, &tm_v, full_v(s));
          }
          if (i == claim_at) mbar_arrive(claim_go);
        }
      }
    }
    return;
  }

  // Consumers. Software pipeline inside each warpgroup: Q Kᵀ of tile i and P V of tile i-1 are
  // issued together, and the softmax of tile i comes before the wait for P V of tile i-1 (it runs
  // while that product is on the tensor cores where ptxas keeps the order: the pinned kernels);
  // O is rescaled once that product has landed.
  setmaxnreg_inc<kConsumerRegs>();
  // Consumer warpgroup: rows 64 cw .. 64 cw + 63 of the tile. Broadcast from lane 0 (kLeanTile),
  // the compiler knows it is warp-uniform: Q's wgmma descriptors, which depend on it, then stay in
  // uniform registers instead of taking two R2UR moves per wgmma.
  const int cw = kLeanTile ? __shfl_sync(0xffffffffu, wg - 1, 0) : wg - 1;
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int row_in_tile = 64 * cw + 16 * warp + g;  // this thread's rows: +0 and +8

  // The dense 192-row d_v = 64 kernel's P V also sums the rows (Cfg::kGemmRowSums): o_acc's last column
  // tile holds them (column 64: lane t4 == 0's elements 0 and 2).
  constexpr bool kSumsInPV = Cfg::kGemmRowSums && !kSplitPaged;
  float o_acc[kDT + (kSumsInPV ? 1 : 0)][4];
  float row_max[2], row_sum[2];
  float sacc[kNT][4];
  uint32_t pf[kNT / 2][4];

  // Descriptors are linear in the start address (its field is address >> 4, far from overflowing),
  // so each wgmma's descriptor is a base plus a compile-time offset.
  const uint64_t dq0 = smem_desc_sw128(sQ + cw * 64 * 128, 16, 1024);
  const uint64_t dk0 = smem_desc_sw128(sK, 16, 1024);
  const uint64_t dv0 = smem_desc_sw128(sV, kSumsInPV ? S * Cfg::kVTileBytes : BN * 128, 1024);
  if constexpr (kSumsInPV) {
    // The ones blocks: row r's logical first 16-byte unit (columns 64-71 of P V's B) sits at unit
    // r % 8 under the 128-byte swizzle; its first element is 1, everything else 0.
    const uint32_t one = std::is_same_v<T, __half> ? 0x3C00u : 0x3F80u;
    for (int u = tid - 128; u < S * BN * 8; u += Cfg::kConsumerThreads) {
      const int r = (u / 8) % BN, c = u % 8;
      *reinterpret_cast<uint4*>(smem_raw + (base - raw) + Cfg::kOnesOffset + u * 16) =
          make_uint4(c == r % 8 ? one : 0u, 0u, 0u, 0u);
    }
    fence_proxy_async();
    named_bar_sync<Cfg::kConsumers + 1, Cfg::kConsumerThreads>();
  }
  // Q Kᵀ into `acc` (sacc, or the narrow sink tile's sacc_sink: its width is the wgmma's N), and
  // O += P V over as many 16-key steps as `a` holds (pf, or pf_sink).
  auto issue_qk = [&](auto& acc, int s) {
    const uint64_t dk = dk0 + static_cast<uint64_t>(s * (Cfg::kKTileBytes >> 4));
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      // k16 step kk: 128-byte column block kk / 4, 32 bytes per step inside the swizzled row.
      wgmma_ss(acc, dq0 + static_cast<uint64_t>(((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
               dk + static_cast<uint64_t>(((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0 ? 1 : 0,
               static_cast<const T*>(nullptr));
    }
    wgmma_commit();
  };
  auto issue_pv = [&](const auto& a, int s) {
    constexpr int kSteps = std::extent_v<std::remove_reference_t<decltype(a)>>;
    const uint64_t dv = dv0 + static_cast<uint64_t>(s * (Cfg::kVTileBytes >> 4));
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
      wgmma_rs(o_acc, a[kk], dv + static_cast<uint64_t>((kk * 16 * 128) >> 4), static_cast<const T*>(nullptr));
    wgmma_commit();
  };
  // The narrow sink tile (kNarrow): the stage's first kSinkKeys keys.
  float sacc_sink[kSinkNT][4];
  uint32_t pf_sink[kSinkNT / 2][4];

  // Ping-pong: the consumer warpgroups take turns issuing their GEMMs (warpgroup c waits on named
  // barrier 1 + c, then arrives on its successor's), so one warpgroup's softmax runs while the
  // others' GEMMs occupy the tensor cores. All walk the same items, so all have the same number of
  // issue points; warpgroup 0 goes first without waiting and absorbs the last warpgroup's final
  // hand-over after the loop. Not in the dense 128-row d = 64 kernel: there one warpgroup's
  // softmax (64 exp2 per thread and tile, on 16 MUFU lanes per SM) takes as long as both
  // warpgroups' GEMMs, and strict turns only delayed issue (session 15: d64 S4k causal 1.5-2%
  // faster without them, S = 1k within 1%; without them d = 128 / 256 and the 192-row kernel
  // were 1-2% slower).
  constexpr bool kPingPong = kSplitPaged || !(DQK == 64 && Cfg::kConsumers == 2);
  // Warpgroups with no rows of the item skip it (below): the 192-row kernel only.
  constexpr bool kIdleWarpgroups = Cfg::kConsumers == 3;
  bool first_turn = true;
  auto take_turn = [&] {
    if constexpr (!kPingPong) return;
    if (cw == 0 && first_turn) {
      first_turn = false;
      return;
    }
    first_turn = false;
    if (cw == 0) named_bar_sync<1, 256>();
    else if (Cfg::kConsumers == 2 || cw == 1) named_bar_sync<2, 256>();
    else named_bar_sync<3, 256>();
  };
  auto pass_turn = [&] {
    if constexpr (!kPingPong) return;
    if (cw == 0) named_bar_arrive<2, 256>();
    else if (Cfg::kConsumers == 2 || cw == 2) named_bar_arrive<1, 256>();
    else named_bar_arrive<3, 256>();
  };

  // Waits until the ring holds key tile c's K (V): its stage c % S in the phase of its round.
  auto wait_k = [&](Counter c) { mbar_wait(full_k(c % S), (c / S) & 1); };
  auto wait_v = [&](Counter c) { mbar_wait(full_v(c % S), (c / S) & 1); };

  Counter kv_iter = 0, q_iter = 0, item_iter = 0;
  SM90_TRACE_DECL(tr, 1 + cw, tid % 128 == 0 && cw < 2);  // the first two warpgroups
  for (;;) {
    const int slot = item_iter & 1;
    mbar_wait(item_full(slot), (item_iter >> 1) & 1);
    SM90_TRACE(tr, 1);
    // The slot is read whole (read_slot) before it is released.
    const int4* src = slots + kSlotInt4s * slot;
    Item it;
    const int w = kDecodedSlots ? read_slot(src, it) : src[0].x;
    mbar_arrive(item_empty(slot));
    ++item_iter;
    if (w < 0) break;
    if constexpr (!kDecodedSlots) decode(w, it);
    const int item_tiles = it.n_tiles;
    const int64_t qpos0 = it.m0 + row_in_tile + it.shift;
#pragma unroll
    for (int j = 0; j < kDT + (kSumsInPV ? 1 : 0); ++j) o_acc[j][0] = o_acc[j][1] = o_acc[j][2] = o_acc[j][3] = 0.0f;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
    VisibleTiles visible = kLeanTile ? visible_tiles(p.mask, it.qp_min, it.qp_max, it.kv_len, BN) : VisibleTiles{};
    // Held in registers through the item where that measured faster: left to itself, the compiler
    // recomputed the sink bound from the parameters and the item's 64-bit fields in every key tile
    // (~10 instructions). Session 25, dense kernels, time against the plain form: d = 64 -0.9..+0.1%
    // (S1k full the +0.1%), d192/128 -0.6%, d = 128 -0.5..+0.5% (S1k full the +0.5%); so d = 128 and
    // the paged / split variants (unmeasured) keep the plain form.
    constexpr bool kPinVisible = kLeanTile && !kSplitPaged && (DQK == 64 || DQK != DV);
    if constexpr (kPinVisible) asm volatile("" : "+r"(visible.lo), "+r"(visible.hi), "+r"(visible.sinks));
    // This warpgroup's tile i is the item's tile skip + i (skip: tiles_past_rows below).
    int skip = 0;
    auto softmax = [&](int i, float (&alpha)[2]) {
      const int tile = tile_of(it, skip + i);
      const bool needs_mask = kLeanTile ? !visible.has(tile)
                                        : !tile_fully_visible(p.mask, it.qp_min, it.qp_max, tile * BN, BN, it.kv_len);
      transform_and_mask<kNT, kSinksSoftcap>(sacc, p, needs_mask, qpos0, tile * BN, it.kv_len, t4);
      softmax_update<kNT, kLazyRescale, false, kSumsInPV>(sacc, row_max, row_sum, p.scale_log2, alpha);
    };
    // Paged K/V: the V rows of tile i past the sequence's end hold whatever the pool has there
    // (NaN patterns included), which a zero probability would not cancel; both consumer
    // warpgroups zero them before either multiplies (same point in both: no ping-pong deadlock).
    auto zero_v_tail = [&](int i, int s) {
      if (!kSplitPaged || p.page_size == 0) return;
      const int valid = it.kv_len - tile_of(it, skip + i) * BN;
      if (valid >= BN) return;
      const int per_chunk = (BN - valid) * 8;  // 16-byte units
      uint8_t* v_stage = smem_raw + (sV - raw) + s * Cfg::kVTileBytes;
      for (int u = tid - 128; u < Cfg::kChunksV * per_chunk; u += Cfg::kConsumerThreads) {
        const int c = u / per_chunk, r = u % per_chunk;
        *reinterpret_cast<uint4*>(v_stage + c * BN * 128 + valid * 128 + r * 16) = make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async();
      named_bar_sync<Cfg::kConsumers + 1, Cfg::kConsumerThreads>();
    };

    // The visited tiles at the item's high end that none of this warpgroup's rows sees: whole key
    // tiles above its last row's causal (or right-window) end. A 128-row query tile with 128-key
    // tiles always sees part of its diagonal tile in both warpgroups; with narrower key tiles (d =
    // 256: 64 or 80 keys, d = 192: 112) the first warpgroup often skips one. At least one tile stays,
    // so that rows with no visible key still finish as they did. Session 28: d256 S1k / S4k causal
    // 1.8 / 0.7% faster, d192 S4k causal 0.8%; the 192-row d = 64 kernel, whose first two
    // warpgroups skip too, was 2.6% faster at S1k causal (still slower than 128 rows there) and
    // 0.7% slower at S16k causal, so it keeps the plain form.
    constexpr bool kSkipTiles = !kSplitPaged && BN < 128;
    static_assert(!(kSkipTiles && kNarrow), "the narrow sink tile (128-key kernels) must stay the item's last");
    auto tiles_past_rows = [&](const Item& item) {
      if constexpr (!kSkipTiles) return 0;
      const int last_row = min(item.m0 + 64 * cw + 63, item.q_len - 1);
      const int64_t kend = p.mask.key_end(last_row + item.shift, item.kv_len);
      const int end_tile = static_cast<int>((kend + BN - 1) / BN);
      return max(0, min(item.hi - item.range.count_below(end_tile), item.n_tiles - 1));
    };

    // A warpgroup whose 64 rows all lie past the sequence (in the 192-row kernel, the last tile of
    // a sequence: 1024 = 5 x 192 + 64) skips the GEMMs and the softmax. It keeps step with the
    // others: it releases each stage once the stage has been filled (an arrival before that would
    // count towards the stage's previous use), takes its turns and releases Q.
    const bool idle = kIdleWarpgroups && it.m0 + 64 * cw >= it.q_len;
    if (item_tiles > 0 && idle) {
      for (int i = 0; i <= item_tiles; ++i) {
        if (i < item_tiles) {
          const Counter cur = kv_iter + i;
          wait_k(cur);
          mbar_arrive(empty_k(cur % S));
        }
        if (i > 0) {
          const Counter prev = kv_iter + i - 1;
          wait_v(prev);
          mbar_arrive(empty_v(prev % S));
        }
        take_turn();
        pass_turn();
      }
      mbar_arrive(q_empty);
      kv_iter += item_tiles;
      ++q_iter;
    } else if (item_tiles > 0) {
      // Key tiles past this warpgroup's last row (the diagonal's upper tiles, for the first
      // warpgroups of a causal item) are released with a turn and no GEMMs; the rest is the item
      // as below, from its first tile this warpgroup sees.
      // (The count from lane 0, and added to the ring counter after the loop: incremented inside
      // it, the counter left the d = 256 tile loop's uniform registers, cuda_notes step 129.)
      if constexpr (kSkipTiles) skip = __shfl_sync(0xffffffffu, tiles_past_rows(it), 0);
      for (int j = 0; j < skip; ++j) {
        const Counter c = kv_iter + j;
        wait_k(c);
        mbar_arrive(empty_k(c % S));
        wait_v(c);
        mbar_arrive(empty_v(c % S));
        take_turn();
        pass_turn();
      }
      kv_iter += skip;
      const int n_tiles = item_tiles - skip;
      mbar_wait(q_full, q_iter & 1);
      SM90_TRACE(tr, 2);
      // Tile 0: Q Kᵀ alone.
      const int s0 = kv_iter % S;
      wait_k(kv_iter);
      SM90_TRACE(tr, 3);
      take_turn();
      SM90_TRACE(tr, 4);
      wgmma_fence();
      issue_qk(sacc, s0);
      pass_turn();
      SM90_TRACE(tr, 5);
      wgmma_wait<0>();
      reg_fence(sacc);
      SM90_TRACE(tr, 6);
      mbar_arrive(empty_k(s0));
      if (n_tiles == 1) mbar_arrive(q_empty);
      float alpha[2];
      softmax(0, alpha);
      pack_p<T>(sacc, pf);
      SM90_TRACE(tr, 7);
      const bool narrow = narrow_sink_tile(it);
      for (int i = 1; i < n_tiles - (narrow ? 1 : 0); ++i) {
        const Counter cur = kv_iter + i, prev = cur - 1;
        const int s = cur % S, sp = prev % S;
        wait_k(cur);
        wait_v(prev);
        zero_v_tail(i - 1, sp);
        SM90_TRACE(tr, 8);
        reg_fence(o_acc);
        take_turn();
        SM90_TRACE(tr, 4);
        wgmma_fence();
        issue_qk(sacc, s);
        issue_pv(pf, sp);
        pass_turn();
        SM90_TRACE(tr, 5);
        wgmma_wait<1>();  // Q Kᵀ of tile i has landed
        reg_fence(sacc);
        SM90_TRACE(tr, 6);
        mbar_arrive(empty_k(s));
        if (i == n_tiles - 1) mbar_arrive(q_empty);  // the Q buffer may take the next item's Q
        softmax(i, alpha);
        SM90_TRACE(tr, 7);
        // ptxas schedules the wait below at the softmax's start (it has no operands), so the
        // softmax does not overlap P V of tile i-1. A never-taken branch on the softmax's row sums
        // (the sums are never negative: their bits never match) keeps it after the softmax. Session
        // 19, against the hoisted wait: d256 S16k full -4.1%, d192 S4k full -1.8%, d256 S1k full /
        // causal +1.6 / +0.2%; d = 128 -0.5 to +0.3%, d = 64 +2 to +3%, paged d = 128 +2.3%. With
        // the conditional rescale (session 20) d = 128 gains from it too (the figures above).
        if constexpr (DV >= 128 && !kSplitPaged)
          if (__any_sync(0xffffffffu, __float_as_uint(row_sum[0] + row_sum[1]) == 0xFFFFFFFFu)) __nanosleep(1);
        wgmma_wait<0>();  // P V of tile i-1 has landed
        reg_fence(o_acc);
        reg_fence_u32(pf);
        SM90_TRACE(tr, 9);
        mbar_arrive(empty_v(sp));
        if (!kLazyRescale || warp_needs_rescale(alpha)) rescale_rows(o_acc, alpha);
        pack_p<T>(sacc, pf);
      }
      if (kNarrow && narrow) {
        // The sink tile, the item's last: the loop body with the narrow Q Kᵀ, its softmax and P.
        const Counter cur = kv_iter + n_tiles - 1, prev = cur - 1;
        const int s = cur % S, sp = prev % S;
        wait_k(cur);
        wait_v(prev);
        // (The first k-step overwrites the accumulator, so this zeroing is not needed for the result;
        // it is in the build that was measured, and without it the kernel's code differs.)
#pragma unroll
        for (int j = 0; j < kSinkNT; ++j) sacc_sink[j][0] = sacc_sink[j][1] = sacc_sink[j][2] = sacc_sink[j][3] = 0.0f;
        reg_fence(sacc_sink);
        reg_fence(o_acc);
        take_turn();
        wgmma_fence();
        issue_qk(sacc_sink, s);
        issue_pv(pf, sp);
        pass_turn();
        wgmma_wait<1>();
        reg_fence(sacc_sink);
        mbar_arrive(empty_k(s));
        mbar_arrive(q_empty);
        float alpha[2];
        transform_and_mask<kSinkNT, kSinksSoftcap>(sacc_sink, p, true, qpos0, 0, it.kv_len, t4);
        softmax_update<kSinkNT, kLazyRescale>(sacc_sink, row_max, row_sum, p.scale_log2, alpha);
        wgmma_wait<0>();
        reg_fence(o_acc);
        reg_fence_u32(pf);
        mbar_arrive(empty_v(sp));
        if (!kLazyRescale || warp_needs_rescale(alpha)) rescale_rows(o_acc, alpha);
        pack_p<T>(sacc_sink, pf_sink);
      }
      const Counter last = kv_iter + n_tiles - 1;
      const int sl = last % S;
      wait_v(last);
      zero_v_tail(n_tiles - 1, sl);
      SM90_TRACE(tr, 8);
      reg_fence(o_acc);
      take_turn();
      SM90_TRACE(tr, 4);
      // (The fence inside each branch: after it, a branch before the wgmma made ptxas serialise.)
      if (kNarrow && narrow) {
        wgmma_fence();
        issue_pv(pf_sink, sl);
      } else {
        wgmma_fence();
        issue_pv(pf, sl);
      }
      pass_turn();
      SM90_TRACE(tr, 5);
      wgmma_wait<0>();
      reg_fence(o_acc);
      reg_fence_u32(pf);
      if (kNarrow && narrow) reg_fence_u32(pf_sink);
      SM90_TRACE(tr, 10);
      mbar_arrive(empty_v(sl));
      kv_iter += n_tiles;
      ++q_iter;
    }
    if constexpr (kSumsInPV) row_sum[0] = o_acc[kDT][0], row_sum[1] = o_acc[kDT][2];
    // O without the sums' column tile.
    float(&o_out)[kDT][4] = *reinterpret_cast<float(*)[kDT][4]>(&o_acc[0][0]);
    if (idle) {
      // No rows to store.
    } else if (kSplitPaged && splits > 1)
      store_partial(p, o_out, row_max, row_sum, it.b, it.q_len, it.m0 + row_in_tile, it.h, it.split, t4);
    else if (Cfg::kStagedO || o_in_v(item_tiles)) {
      // Over the V stages: the other warpgroup's last P V may still be reading them.
      if (kOInV) named_bar_sync<Cfg::kConsumers + 2, Cfg::kConsumerThreads>();
      store_output_staged<T, DV>(p, o_out, row_max, row_sum, it.q0, it.q_len, it.m0 + 64 * cw + 16 * warp, it.h, lane,
                                 (Cfg::kStagedO ? sO : sV) + (4 * cw + warp) * 16 * DV * 2,
                                 (Cfg::kStagedO || Cfg::kOInVBulkStore) && p.o_tma ? &tm_o : nullptr
#ifdef ESCALA_SM90_TRACE
                                 , [&](int code) { SM90_TRACE(tr, code); }
#endif
      );
      if (kOInV) {
        // The bulk stores have read the V stages (returns at once after the copy).
        if constexpr (Cfg::kOInVBulkStore) tma_store_wait_read();
        mbar_arrive(o_free);
      }
    } else
      store_output<T>(p, o_out, row_max, row_sum, it.q0, it.q_len, it.m0 + row_in_tile, it.h, t4);
    // Reconverge each warp before the next item where that keeps the tile loop in uniform
    // registers. Without it the lane-dependent stores above left the compiler unsure that the ring
    // counters and the wgmma descriptors are warp-uniform, and it moved them to per-thread
    // registers with an R2UR before each use (bench/ptxas_report.py --sass: the tile loop's issue
    // block of the paged d = 128 kernel 283 instructions with it, 368 with 36 R2UR without; of the
    // dense d192/128 kernel 104 against 235 with 61 R2UR). Session 17: with it paged d = 64 / 128 /
    // 256 3.5-3.7% faster, d192/128 3.8-4.8%. The dense d_qk = d_v kernels kept their uniform
    // registers without it, and there it measured neutral (d = 128, 256) or 2% slower (d = 64).
    // The kernels with staged O need it since the epilogue's bulk stores (session 19: without it
    // their dense d = 64 / 128 loops took 32 / 45 R2UR).
    if constexpr (kSplitPaged || DQK != DV || Cfg::kStagedO) __syncwarp();
    SM90_TRACE(tr, 11);
  }
  if (kPingPong && cw == 0 && !first_turn) named_bar_sync<1, 256>();  // the last warpgroup's final hand-over
  if (Cfg::kStagedO && p.o_tma) tma_store_wait_read();  // the last bulk stores' reads
#endif
}

}  // namespace escala::attn::cuda
