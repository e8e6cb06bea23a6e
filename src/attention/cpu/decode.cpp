// The CPU decode kernel (also speculative verification: up to 16 queries per sequence).
// Work items are (sequence, split of the key range), each over every kv head: the query heads of a
// GQA group and all queries of the sequence are processed together, so each K/V row is read once
// per group, and an item walks whole rows of the cache (all kv heads of a token are adjacent), which
// streams memory far better than one head's short runs at a stride. Splits (Flash-Decoding) give
// every thread work at batch 1; their partial results are merged exactly through the log-sum-exp.
//
// K and V are read in their stored type and converted in registers (bf16/f16 by promotion, int8 by
// conversion, fp8 e4m3 by moving its bits into an f32's fields: exact, no table); per-token and per-page
// scales multiply scores and weights, not elements. QK computes one score per (row, key) pair for
// a lane's worth of pairs at once (NR rows x L/NR keys), then reduces those L accumulators to one
// vector with a transpose-add tree (L-1 pairwise steps instead of one horizontal sum per pair).
// Keys stored before RoPE, or head dims that are not whole vectors, go through an f32 staging tile.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/cpu/decode.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "attention/cpu/exp-inl.h"
#include "common/f16-inl.h"
#include "attention/cpu/kernels.h"
#include "attention/cpu/tile_load-inl.h"
#include "attention/kv_layout.h"
#include "attention/variant.h"
#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#if HWY_ARCH_X86_64
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace escala::attn::cpu::HWY_NAMESPACE {
namespace {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int kLanes = int(hn::MaxLanes(DF()));

constexpr int kBlock = 32;              // keys per block
// int8 K/V with VNNI: queries and weights as 16-bit integers, i.e. two 8-bit digits (see qk_i8_vnni).
constexpr int kDigits = 2;
constexpr int64_t kMinSplitKeys = 256;  // a split shorter than this costs more to merge than it saves
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// e4m3 bits moved into an f32's sign, exponent and mantissa fields are the value times 2^-120
// (subnormals become f32 subnormals, exactly). The 2^120 is given back half through the queries
// and the K scales, half through the V scales and the output, so no intermediate overflows.
constexpr float kFp8Half = 1152921504606846976.0f;  // 2^60

struct Geometry {
  int32_t b;
  int64_t q0, q_len, kv_len;
  int64_t range_begin, range_end;  // keys any query of the sequence may see (window part)
  int64_t sink_end;                // keys [0, sink_end) visited as sinks before the window part
  int splits;
};

// Rows per QK/PV pass: 4 (padded) unless a kv head has only 1 or 2 rows (1 on one-lane targets).
int rows_per_pass(int rows) { return kLanes < 4 ? 1 : rows >= 3 ? 4 : std::max(rows, 1); }
int padded_rows(int rows) {
  const int nr = rows_per_pass(rows);
  return (rows + nr - 1) / nr * nr;
}

struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> q, kf, vf, s, o, m, l, alpha, ks, vs, qs;
  hwy::AlignedFreeUniquePtr<int32_t[]> qd, qcorr;  // int8 keys with VNNI: the queries' digits
  void init(int rows, int d, int dv) {  // rows: every kv head's padded rows
    q = hwy::AllocateAligned<float>(size_t(rows) * d);
    qd = hwy::AllocateAligned<int32_t>(size_t(rows) * kDigits * (d / 4));
    qcorr = hwy::AllocateAligned<int32_t>(size_t(rows) * kDigits);
    qs = hwy::AllocateAligned<float>(rows);
    kf = hwy::AllocateAligned<float>(size_t(kBlock) * d);
    vf = hwy::AllocateAligned<float>(size_t(kBlock) * dv);
    s = hwy::AllocateAligned<float>(size_t(rows) * kBlock);
    o = hwy::AllocateAligned<float>(size_t(rows) * dv);
    m = hwy::AllocateAligned<float>(size_t(rows) * kLanes);  // per pass of rows, one vector
    l = hwy::AllocateAligned<float>(size_t(rows) * kLanes);
    alpha = hwy::AllocateAligned<float>(rows);
    ks = hwy::AllocateAligned<float>(kBlock + kLanes);  // read a whole vector past any key
    vs = hwy::AllocateAligned<float>(kBlock + kLanes);
    std::fill(kf.get(), kf.get() + size_t(kBlock) * d, 0.0f);  // staged rows past a block's end are read
    std::fill(vf.get(), vf.get() + size_t(kBlock) * dv, 0.0f);
  }
};

// Lanes [c, c + L) of a stored row, in f32 and unscaled (fp8: times 2^-8).
template <DType T>
HWY_INLINE VF load_lanes(DF df, const uint8_t* HWY_RESTRICT row, size_t c) {
  if constexpr (T == DType::kF32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + c);
  } else if constexpr (T == DType::kBF16) {
    const hn::Rebind<uint16_t, DF> d16;
    const hn::Rebind<uint32_t, DF> du;
    const auto x = hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(row) + c));
    return hn::BitCast(df, hn::ShiftLeft<16>(x));
  } else if constexpr (T == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return escala::HWY_NAMESPACE::PromoteF16(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + c));
  } else if constexpr (T == DType::kI8) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> di;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(row) + c)));
  } else {
    // e4m3 (sign, 4 exponent bits, bias 7, 3 mantissa bits) shifted into f32's fields (exponent
    // bits 23-26, mantissa 20-22) is the value times 2^-120, subnormals included; the sign comes
    // along through the sign extension. Three instructions (f16 and vcvtph2ps: five).
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int32_t, DF> di;
    const auto x = hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(row) + c));
    return hn::BitCast(df, hn::And(hn::ShiftLeft<20>(x), hn::Set(di, int32_t(0x87F00000u))));
  }
}

// a[i] becomes the sum of the lanes of a[i] for i < L, all in one vector (lane i): log2(L) levels
// of pairwise odd+even concatenations. Levels are unrolled at compile time so that the
// accumulators stay in registers.
template <int N>
HWY_INLINE void reduce_level(DF df, VF* a) {
#if HWY_TARGET != HWY_SCALAR  // one lane: nothing to reduce
  if constexpr (N > 1) {
    for (int i = 0; i < N / 2; ++i)
      a[i] = hn::Add(hn::ConcatOdd(df, a[2 * i + 1], a[2 * i]), hn::ConcatEven(df, a[2 * i + 1], a[2 * i]));
    reduce_level<N / 2>(df, a);
  }
#else
  (void)df;
  (void)a;
#endif
}
HWY_INLINE VF reduce_transpose(DF df, VF* a) {
  reduce_level<kLanes>(df, a);
  return a[0];
}

template <DType T>
constexpr size_t kElemBytes = T == DType::kF32 ? 4 : (T == DType::kBF16 || T == DType::kF16) ? 2 : 1;

// Memory requests ahead: while a pass reads row j of this block, it asks for row j of the next
// block (pk/pv: the same kv head there; null: none), a few lines at a time, spread over the
// arithmetic: a burst of requests per block fills the line fill buffers and stalls the core
// instead of overlapping the loads with the FMAs.
// Into L2 (prefetcht2): a block's rows of every head (64 KiB for int8 at 8 kv heads and d = 128)
// would not fit in L1 and evict the queries, scores and accumulators; at 2 threads int8 decode
// measured ~4% faster than with prefetcht0 in 3 quiet runs.
HWY_INLINE void request(const uint8_t* p) { __builtin_prefetch(p, 0, 1); }

// s[j * NR + r] = q[r] . k[j] for NR rows (stride dp) and nk keys: key j's row starts at kb[j] + off
// (kb padded to a multiple of L/NR keys). Each vector holds L/NR keys x NR rows, the lane layout the
// softmax and PV work in. pk (null: none): the rows to request meanwhile, at pk[j] + off.
template <DType T, int NR>
HWY_ATTR void qk_pass(const float* HWY_RESTRICT q, size_t dp, const uint8_t* const* kb, size_t off, int nk,
                      float* HWY_RESTRICT s, const uint8_t* const* pk, size_t poff) {
  const DF df;
  constexpr int NK = std::max(1, kLanes / NR);
  for (int j = 0; j < nk; j += NK) {
    VF acc[kLanes];
    for (int a = 0; a < kLanes; ++a) acc[a] = hn::Zero(df);
    const uint8_t* k[NK];
    for (int kk = 0; kk < NK; ++kk) k[kk] = kb[j + kk] + off;
    if (pk)
      for (int kk = 0; kk < NK; ++kk)
        for (size_t b = 0; b < dp * kElemBytes<T>; b += 64) request(pk[j + kk] + poff + b);
    for (size_t c = 0; c < dp; c += kLanes) {
      VF qv[NR];
      for (int r = 0; r < NR; ++r) qv[r] = hn::Load(df, q + r * dp + c);
      for (int kk = 0; kk < NK; ++kk) {
        const VF kv = load_lanes<T>(df, k[kk], c);
        for (int r = 0; r < NR; ++r) acc[kk * NR + r] = hn::MulAdd(qv[r], kv, acc[kk * NR + r]);
      }
    }
    hn::Store(reduce_transpose(df, acc), df, s + j * NR);
  }
}

// o[r][c0, c0 + NV L) = o * alpha[r] + sum_j w[j * NR + r] v[j][c0, c0 + NV L) for NR rows (stride
// dvp); NR x NV accumulators in registers.
template <DType T, int NR, int NV>
HWY_ATTR HWY_INLINE void pv_chunk(const float* HWY_RESTRICT w, const uint8_t* const* vb, size_t off,
                                  const float* alpha, int nk, size_t dvp, size_t c0, float* HWY_RESTRICT o,
                                  const uint8_t* const* pv, size_t poff) {
  const DF df;
  VF acc[NR][NV];
  for (int r = 0; r < NR; ++r) {
    const VF al = hn::Set(df, alpha[r]);
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Mul(hn::Load(df, o + r * dvp + c0 + v * kLanes), al);
  }
  for (int j = 0; j < nk; ++j, w += NR) {
    VF wr[NR];
    for (int r = 0; r < NR; ++r) wr[r] = hn::Set(df, w[r]);
    const uint8_t* vr = vb[j] + off;
    for (int v = 0; v < NV; ++v) {
      const size_t c = c0 + v * kLanes;
      if (pv && (c * kElemBytes<T>) % 64 == 0) request(pv[j] + poff + c * kElemBytes<T>);
      const VF x = load_lanes<T>(df, vr, c);
      for (int r = 0; r < NR; ++r) acc[r][v] = hn::MulAdd(wr[r], x, acc[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) hn::Store(acc[r][v], df, o + r * dvp + c0 + v * kLanes);
}

// o[r] = o[r] * alpha[r] + sum_j w[j * NR + r] v[j] for NR rows (stride dvp): chunks of NV vectors
// (as many accumulators as the registers hold), the rest one vector at a time.
template <DType T, int NR>
HWY_ATTR void pv_pass(const float* HWY_RESTRICT w, const uint8_t* const* vb, size_t off, const float* alpha, int nk,
                      size_t dvp, float* HWY_RESTRICT o, const uint8_t* const* pv, size_t poff) {
  constexpr int NV = std::max(1, (kLanes >= 16 ? 16 : 8) / NR);
  size_t c0 = 0;
  for (; c0 + NV * kLanes <= dvp; c0 += NV * kLanes) pv_chunk<T, NR, NV>(w, vb, off, alpha, nk, dvp, c0, o, pv, poff);
  for (; c0 < dvp; c0 += kLanes) pv_chunk<T, NR, 1>(w, vb, off, alpha, nk, dvp, c0, o, pv, poff);
}

// All rows of one kv head (rows a multiple of NR) against one block of keys; the first pass
// requests the next block's rows.
template <DType T, int NR>
HWY_ATTR void qk_rows(const float* q, size_t dp, const uint8_t* const* kb, size_t off, int nk, int rows, float* s,
                      const uint8_t* const* pk, size_t poff) {
  for (int r = 0; r < rows; r += NR)
    qk_pass<T, NR>(q + size_t(r) * dp, dp, kb, off, nk, s + size_t(r) * kBlock, r == 0 ? pk : nullptr, poff);
}
template <DType T, int NR>
HWY_ATTR void pv_rows(const float* w, const uint8_t* const* vb, size_t off, const float* alpha, int nk, int rows,
                      size_t dvp, float* o, const uint8_t* const* pv, size_t poff) {
  for (int r = 0; r < rows; r += NR)
    pv_pass<T, NR>(w + size_t(r) * kBlock, vb, off, alpha + r, nk, dvp, o + size_t(r) * dvp, r == 0 ? pv : nullptr,
                   poff);
}

using QkFn = void (*)(const float*, size_t, const uint8_t* const*, size_t, int, int, float*, const uint8_t* const*,
                      size_t);
using PvFn = void (*)(const float*, const uint8_t* const*, size_t, const float*, int, int, size_t, float*,
                      const uint8_t* const*, size_t);

template <DType T>
void pick_kernels(int nr, QkFn* qk, PvFn* pv) {
  if constexpr (kLanes < 4) {  // one-lane targets: one row per pass
    (void)nr;
    *qk = &qk_rows<T, 1>;
    *pv = &pv_rows<T, 1>;
  } else {
    switch (nr) {
      case 1: *qk = &qk_rows<T, 1>; *pv = &pv_rows<T, 1>; break;
      case 2: *qk = &qk_rows<T, 2>; *pv = &pv_rows<T, 2>; break;
      default: *qk = &qk_rows<T, 4>; *pv = &pv_rows<T, 4>; break;
    }
  }
}
void pick_kernels(DType t, int nr, QkFn* qk, PvFn* pv) {
  switch (t) {
    case DType::kBF16: pick_kernels<DType::kBF16>(nr, qk, pv); break;
    case DType::kF16: pick_kernels<DType::kF16>(nr, qk, pv); break;
    case DType::kI8: pick_kernels<DType::kI8>(nr, qk, pv); break;
    case DType::kFp8E4M3: pick_kernels<DType::kFp8E4M3>(nr, qk, pv); break;
    default: pick_kernels<DType::kF32>(nr, qk, pv); break;
  }
}

// int8 keys against the 4 query rows of a pass with AVX-512 VNNI (vpdpbusd: 64 u8 x s8 products
// summed in fours into 16 int32 lanes per instruction): each query row is rounded to a 16-bit
// integer relative to its max magnitude, q = qs * (256 q1 + q0) with signed 8-bit digits (error at
// most 2^-16 of the row max per element, f16-class and ~100x below the int8 keys' own rounding),
// and every digit product is summed exactly in int32. The keys are the unsigned operand:
// k xor 0x80 = k + 128, whose excess (128 times each digit's sum over the row) starts the
// accumulators negative. 16 keys are transposed (lane = key, one vector per 4 dims) so that one
// broadcast query dword serves 16 keys and no horizontal sums are needed; 16 instructions per
// (key, kv head) for the products of 4 rows instead of 32 FMAs and 16 conversions, plus the
// 8-step transpose of the keys. A third digit (24-bit queries, exact to f32) cost 1.3x the time:
// vpdpbusd issues on one port of this class of core, and it is the bound.
#if HWY_ARCH_X86_64 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
#undef ESCALA_DECODE_VNNI
#undef ESCALA_VNNI_ATTR
#define ESCALA_DECODE_VNNI 1
#define ESCALA_VNNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni,avx512vbmi")))
// GCC 12 reports the intrinsics' internal undefined vectors as maybe uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
bool cpu_has_vnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
  return has;
}
constexpr int32_t kQMax = 127 * 256;  // |q| in units of qs; the top digit stays within [-127, 127]
constexpr int kVnniRows = 4;

// acc + the sums of 4 products of k's unsigned bytes and *q's signed bytes (broadcast), per lane.
// Written in assembly: GCC 12 copies the accumulator of the intrinsic to a new register and back
// on every use.
HWY_INLINE __m512i dpbusd_bcast(__m512i acc, __m512i k, const int32_t* q) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(k), "m"(*q));
  return acc;
}
HWY_INLINE __m512i dpbusd(__m512i acc, __m512i k, __m512i q) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(k), "v"(q));
  return acc;
}

// Query row r of a pass of 4 (d elements, f32, d a multiple of 16) as digit dwords (4 digits of
// one part, for one broadcast) in the pass's layout digits[d / 4][4 rows][kDigits parts], its
// excess corrections corr[kDigits] and its step qs. q * (kQMax / max) is within 1.5 units of the exact quotient.
ESCALA_VNNI_ATTR void quantize_query_row(const float* q, int d, int r, int32_t* digits, int32_t* corr, float* qs) {
  // nonfinite stays 0 unless the row has a NaN or inf (times 0 gives NaN): then the step, and so
  // every score of the row, is NaN, as the float path would give, not a quantized number.
  __m512 mx = _mm512_setzero_ps(), nonfinite = _mm512_setzero_ps();
  for (int c = 0; c < d; c += 16) {
    const __m512 x = _mm512_loadu_ps(q + c);
    mx = _mm512_max_ps(mx, _mm512_abs_ps(x));
    nonfinite = _mm512_fmadd_ps(x, _mm512_setzero_ps(), nonfinite);
  }
  const float m = _mm512_reduce_max_ps(mx);
  const float step = (m > 0.0f ? m / float(kQMax) : 0.0f) + _mm512_reduce_add_ps(nonfinite);
  const __m512 inv = _mm512_set1_ps(m > 0.0f ? float(kQMax) / m : 0.0f);
  const __m512i lo = _mm512_set1_epi32(-kQMax), hi = _mm512_set1_epi32(kQMax), half = _mm512_set1_epi32(128),
                mask = _mm512_set1_epi32(255);
  __m512i sum[kDigits];
  for (int p = 0; p < kDigits; ++p) sum[p] = _mm512_setzero_si512();
  for (int c = 0; c < d; c += 16) {
    __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + c), inv));  // nearest
    x = _mm512_min_epi32(_mm512_max_epi32(x, lo), hi);
    for (int p = 0; p < kDigits; ++p) {
      // Balanced digits in [-128, 127]; the top one is what is left (|.| <= 127).
      const __m512i dig = p < kDigits - 1 ? _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(x, half), mask), half) : x;
      sum[p] = _mm512_add_epi32(sum[p], dig);
      x = _mm512_srai_epi32(_mm512_sub_epi32(x, dig), 8);
      alignas(16) int32_t b[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(b), _mm512_cvtepi32_epi8(dig));
      for (int g = 0; g < 4; ++g) digits[((c / 4 + g) * kVnniRows + r) * kDigits + p] = b[g];
    }
  }
  for (int p = 0; p < kDigits; ++p) corr[p] = -128 * _mm512_reduce_add_epi32(sum[p]);
  *qs = step;
}

// 16 keys (rows kb[j0 + pi(L)] + off, d bytes) transposed: kt[c] lane L = dword c of key
// j0 + pi(L) as unsigned (k xor 0x80), pi(4i + a) = 4a + i, which the two unpack stages of
// vnni_scores turn into the key-major layout of the scores. Per 64 bytes: 32 + 32 shuffles.
ESCALA_VNNI_ATTR HWY_INLINE void transpose_keys(const uint8_t* const* kb, size_t off, int d, __m512i* kt) {
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int h = 0; h < d / 64; ++h) {
    __m512i x[16], t[16];
    for (int sl = 0; sl < 16; ++sl)
      x[sl] = _mm512_xor_si512(_mm512_loadu_si512(kb[(sl % 4) * 4 + sl / 4] + off + 64 * h), flip);
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      x[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      x[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      x[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      x[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    // x[4i + e], 128-bit block b: dword 4b + e of rows 4i..4i+3; a 4x4 transpose of blocks.
    for (int e = 0; e < 4; ++e) {
      const __m512i v0 = _mm512_shuffle_i32x4(x[e], x[4 + e], 0x44), v1 = _mm512_shuffle_i32x4(x[e], x[4 + e], 0xEE);
      const __m512i v2 = _mm512_shuffle_i32x4(x[8 + e], x[12 + e], 0x44),
                    v3 = _mm512_shuffle_i32x4(x[8 + e], x[12 + e], 0xEE);
      kt[16 * h + 0 + e] = _mm512_shuffle_i32x4(v0, v2, 0x88);
      kt[16 * h + 4 + e] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
      kt[16 * h + 8 + e] = _mm512_shuffle_i32x4(v1, v3, 0x88);
      kt[16 * h + 12 + e] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
  }
}

// The 4 rows' scores of 16 transposed keys from their digit sums, stored key-major (s[j * 4 + r]).
ESCALA_VNNI_ATTR HWY_INLINE void vnni_scores(const __m512i (*acc)[kDigits], const float* qs, float* out) {
  static_assert(kDigits == 2, "the digit sums are combined for two digits");
  __m512 sc[kVnniRows];
  for (int r = 0; r < kVnniRows; ++r) {
    // q . k = 256 q1 . k + q0 . k, exact in int32: |q| <= kQMax = 127 * 256, |k| <= 128, d <= 256.
    const __m512i qk = _mm512_add_epi32(_mm512_slli_epi32(acc[r][1], 8), acc[r][0]);
    sc[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(qk), _mm512_set1_ps(qs[r]));
  }
  const __m512d x0 = _mm512_castps_pd(_mm512_unpacklo_ps(sc[0], sc[1]));
  const __m512d x1 = _mm512_castps_pd(_mm512_unpackhi_ps(sc[0], sc[1]));
  const __m512d x2 = _mm512_castps_pd(_mm512_unpacklo_ps(sc[2], sc[3]));
  const __m512d x3 = _mm512_castps_pd(_mm512_unpackhi_ps(sc[2], sc[3]));
  _mm512_store_ps(out + 0, _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2)));
  _mm512_store_ps(out + 16, _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2)));
  _mm512_store_ps(out + 32, _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3)));
  _mm512_store_ps(out + 48, _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3)));
}

// s[j * 4 + r] = q[r] . k[j] (unscaled by the K scales) for every pass of 4 rows and nk keys (kb
// padded to whole groups of 16); the same lane layout as qk_pass<T, 4>. qd/corr/qs: the rows'
// digits (quantize_query_row: per pass of 4 rows, d / 4 x 4 x kDigits dwords), d a multiple of 64 up
// to 256.
// G groups of 16 keys at a time (the query digits loaded once for both); pk: the rows to request
// meanwhile (two lines per step of the first pass).
template <int G, int LINES>
ESCALA_VNNI_ATTR void qk_i8_vnni_groups(const int32_t* qd, const int32_t* corr, const float* qs, int d,
                                        const uint8_t* const* kb, size_t off, int rows, float* s,
                                        const uint8_t* const* pk, size_t poff) {
  const int nc = d / 4;  // dwords per key row
  alignas(64) __m512i kt[G][64];
  for (int g = 0; g < G; ++g) transpose_keys(kb + 16 * g, off, d, kt[g]);
  for (int r0 = 0; r0 < rows; r0 += kVnniRows) {
    const int32_t* qr = qd + size_t(r0) * kDigits * nc;  // this pass's d / 4 x 4 x kDigits dwords
    __m512i acc[G][kVnniRows][kDigits];
    for (int r = 0; r < kVnniRows; ++r)
      for (int p = 0; p < kDigits; ++p) {
        const __m512i c0 = _mm512_set1_epi32(corr[(r0 + r) * kDigits + p]);
        for (int g = 0; g < G; ++g) acc[g][r][p] = c0;
      }
    for (int c = 0; c < nc; ++c) {
      if (pk && r0 == 0)
        for (int i = 0; i < G; ++i) {
          const int li = c * G + i;  // line li of the G x 16 keys' rows (LINES per row)
          request(pk[li / LINES] + poff + 64 * (li % LINES));
        }
      for (int r = 0; r < kVnniRows; ++r)
        for (int p = 0; p < kDigits; ++p) {
          const int32_t* qw = qr + (c * kVnniRows + r) * kDigits + p;
          if constexpr (G == 1) {
            acc[0][r][p] = dpbusd_bcast(acc[0][r][p], kt[0][c], qw);
          } else {
            const __m512i qb = _mm512_set1_epi32(*qw);
            for (int g = 0; g < G; ++g) acc[g][r][p] = dpbusd(acc[g][r][p], kt[g][c], qb);
          }
        }
    }
    for (int g = 0; g < G; ++g)
      vnni_scores(acc[g], qs + r0, s + size_t(r0) * kBlock + size_t(16 * g) * kVnniRows);
  }
}

// P.V of int8 values for the passes of 4 rows with VNNI, like qk_i8_vnni: each row's weights of the
// block (w[j * 4 + r], >= 0, the V scales folded in) as 16-bit integers relative to the row's max
// over the block (two unsigned 8-bit digits, error at most 2^-17 of that max), against 4 keys'
// values interleaved bytewise (a dword per column: 8 unpacks per 4 keys and 64 columns); the
// products are summed exactly in int32 for a block, then o = o * alpha + step * (256 A1 + A0) in f32.
// o is kept in the column order of the interleave (vnni_column), undone when the split ends.
// Weights past nk are zero; vb is padded to whole groups of 4 keys.
constexpr int kWMax = (1 << (8 * kDigits)) - 1;
HWY_INLINE size_t vnni_column(int c) {  // where column c of a V row lives in a row of o
  const int w = c % 64;
  return size_t(c - w + (w % 16) / 4 * 16 + w / 16 * 4 + w % 4);
}
// One chunk of 32 columns of o (the half HALF of 64 columns at h) for a pass of 4 rows: the 4 keys
// of group g interleaved, 16 digit sums in registers over the block, then added to o.
template <int HALF>
ESCALA_VNNI_ATTR HWY_INLINE void pv_i8_chunk(const int32_t* wq, const uint8_t* const* vb, size_t off, int ng,
                                              const float* step, const float* alpha, size_t dvp, float* o,
                                              const uint8_t* const* pv, size_t poff) {
  __m512i acc[2][kVnniRows][kDigits];
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < kVnniRows; ++r)
      for (int p = 0; p < kDigits; ++p) acc[m][r][p] = _mm512_setzero_si512();
  for (int g = 0; g < ng; ++g) {
    const uint8_t* const* v4 = vb + 4 * g;
    if (HALF == 0 && pv)  // the same lines of the next block's rows
      for (int t = 0; t < 4; ++t) request(pv[4 * g + t] + poff);
    const __m512i a0 = _mm512_loadu_si512(v4[0] + off), a1 = _mm512_loadu_si512(v4[1] + off);
    const __m512i a2 = _mm512_loadu_si512(v4[2] + off), a3 = _mm512_loadu_si512(v4[3] + off);
    const __m512i b01 = HALF == 0 ? _mm512_unpacklo_epi8(a0, a1) : _mm512_unpackhi_epi8(a0, a1);
    const __m512i b23 = HALF == 0 ? _mm512_unpacklo_epi8(a2, a3) : _mm512_unpackhi_epi8(a2, a3);
    const __m512i e[2] = {_mm512_unpacklo_epi16(b01, b23), _mm512_unpackhi_epi16(b01, b23)};
    for (int r = 0; r < kVnniRows; ++r)
      for (int p = 0; p < kDigits; ++p) {
        const __m512i wb = _mm512_set1_epi32(wq[(g * kVnniRows + r) * kDigits + p]);
        for (int m = 0; m < 2; ++m) acc[m][r][p] = dpbusd(acc[m][r][p], wb, e[m]);
      }
  }
  for (int m = 0; m < 2; ++m)
    for (int r = 0; r < kVnniRows; ++r) {
      // 256 A1 + A0 = w . v, exact in int32: |w| <= 65535, |v| <= 127, 32 keys.
      const __m512i wv = _mm512_add_epi32(_mm512_slli_epi32(acc[m][r][1], 8), acc[m][r][0]);
      const __m512 res = _mm512_mul_ps(_mm512_cvtepi32_ps(wv), _mm512_set1_ps(step[r]));
      float* oc = o + size_t(r) * dvp + 16 * (2 * HALF + m);
      _mm512_store_ps(oc, _mm512_fmadd_ps(_mm512_load_ps(oc), _mm512_set1_ps(alpha[r]), res));
    }
}

ESCALA_VNNI_ATTR void pv_i8_vnni(const float* w, const uint8_t* const* vb, size_t off, const float* alpha, int nk,
                                 int rows, int dv, size_t dvp, float* o, const uint8_t* const* pv, size_t poff) {
  const int ng = (nk + 3) / 4;
  // Byte (r * kDigits + p) * 4 + k of a group's 4 * 4 * kDigits = digit p (byte p) of key k's
  // weight for row r (lane 4k + r).
  struct Index {
    alignas(64) uint8_t bytes[64] = {};
    constexpr Index() {
      for (int r = 0; r < kVnniRows; ++r)
        for (int p = 0; p < kDigits; ++p)
          for (int k = 0; k < 4; ++k) bytes[(r * kDigits + p) * 4 + k] = uint8_t(16 * k + 4 * r + p);
    }
  };
  static constexpr Index kIdx;
  const __m512i idx = _mm512_load_si512(kIdx.bytes);
  constexpr uint64_t kGroupBytes = (uint64_t(1) << (16 * kDigits)) - 1;  // mask of a group's bytes
  alignas(64) int32_t wq[(kBlock / 4) * kVnniRows * kDigits + 16];
  for (int r0 = 0; r0 < rows; r0 += kVnniRows, w += size_t(kBlock) * kVnniRows) {
    // Each row's max over the block (lanes 4k + r), its step and the digits.
    __m512 mx = _mm512_setzero_ps();
    for (int g = 0; g < ng; ++g) mx = _mm512_max_ps(mx, _mm512_load_ps(w + 16 * g));  // keys 4g..4g+3
    mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0x4E));
    mx = _mm512_max_ps(mx, _mm512_shuffle_f32x4(mx, mx, 0xB1));
    const __mmask16 pos = _mm512_cmp_ps_mask(mx, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 inv = _mm512_maskz_div_ps(pos, _mm512_set1_ps(float(kWMax)), mx);
    alignas(64) float step[16];
    _mm512_store_ps(step, _mm512_mul_ps(mx, _mm512_set1_ps(1.0f / float(kWMax))));
    const __m512i top = _mm512_set1_epi32(kWMax);
    for (int g = 0; g < ng; ++g) {
      const __m512i x = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(w + 16 * g), inv)), top);
      _mm512_mask_storeu_epi8(wq + kVnniRows * kDigits * g, kGroupBytes, _mm512_permutexvar_epi8(idx, x));
    }
    float* orow = o + size_t(r0) * dvp;
    const uint8_t* const* rq = r0 == 0 ? pv : nullptr;
    for (int h = 0; h < dv / 64; ++h) {
      pv_i8_chunk<0>(wq, vb, off + 64 * size_t(h), ng, step, alpha + r0, dvp, orow + 64 * h, rq, poff + 64 * size_t(h));
      pv_i8_chunk<1>(wq, vb, off + 64 * size_t(h), ng, step, alpha + r0, dvp, orow + 64 * h, rq, poff + 64 * size_t(h));
    }
  }
}

ESCALA_VNNI_ATTR void qk_i8_vnni(const int32_t* qd, const int32_t* corr, const float* qs, int d,
                                 const uint8_t* const* kb, size_t off, int nk, int rows, float* s,
                                 const uint8_t* const* pk, size_t poff) {
  static_assert(kBlock % 32 == 0, "whole parts of 32 keys per block");
  int j0 = 0;
  auto run = [&](auto g, auto lines) {
    qk_i8_vnni_groups<decltype(g)::value, decltype(lines)::value>(qd, corr, qs, d, kb + j0, off, rows,
                                                                  s + size_t(j0) * kVnniRows, pk ? pk + j0 : nullptr, poff);
  };
  auto by_lines = [&](auto g) {
    switch (d / 64) {
      case 1: run(g, std::integral_constant<int, 1>()); break;
      case 2: run(g, std::integral_constant<int, 2>()); break;
      case 3: run(g, std::integral_constant<int, 3>()); break;
      default: run(g, std::integral_constant<int, 4>()); break;
    }
  };
  for (; j0 < nk; j0 += 32) {  // two groups of 16 keys at a time (the last part: one if it has no more)
    if (nk - j0 > 16)
      by_lines(std::integral_constant<int, 2>());
    else
      by_lines(std::integral_constant<int, 1>());
  }
}
#pragma GCC diagnostic pop
#else
#undef ESCALA_DECODE_VNNI
#define ESCALA_DECODE_VNNI 0
#endif

// The lane layout of a pass (lane kk * NR + r: key kk, row r): lane permutations that combine
// the lanes of one row (XOR by NR, 2 NR, ... L/2), and the one that spreads per-key values over it.
struct LaneLayout {
  using Idx = decltype(hn::SetTableIndices(DF(), static_cast<const int32_t*>(nullptr)));
  int nr = 1, steps = 0;
  Idx row_perm[4];
  Idx expand;
  explicit LaneLayout(int rows_per_pass) : nr(rows_per_pass) {
    const DF df;
    alignas(64) int32_t idx[kLanes];
    for (int step = nr; step < kLanes; step *= 2, ++steps) {
      for (int i = 0; i < kLanes; ++i) idx[i] = i ^ step;
      row_perm[steps] = hn::SetTableIndices(df, idx);
    }
    for (int i = 0; i < kLanes; ++i) idx[i] = i / nr;
    expand = hn::SetTableIndices(df, idx);
    if (steps == 0) row_perm[0] = expand;
  }
  HWY_INLINE VF row_max(VF v) const {
    for (int i = 0; i < steps; ++i) v = hn::Max(v, hn::TableLookupLanes(v, row_perm[i]));
    return v;
  }
  // Per-key values x[kk] of the keys of vector `vec`, spread over their rows' lanes.
  HWY_INLINE VF per_key(const float* x, int vec) const {
    return hn::TableLookupLanes(hn::LoadU(DF(), x + vec * (kLanes / nr)), expand);
  }
};

// Online softmax step of one pass over one block, in the lane layout: s (nvec vectors, masked)
// becomes the weights (times the per-key V scales vs, if any); m and l are the pass's running max
// (the same in every lane of a row) and per-lane sums; alpha gets each row's rescale factor.
HWY_ATTR void softmax_pass(float* HWY_RESTRICT s, int nvec, const LaneLayout& lay, const float* vs, float* m, float* l,
                           float* alpha) {
  const DF df;
  VF mx = hn::Load(df, m);
  for (int v = 0; v < nvec; ++v) mx = hn::Max(mx, hn::Load(df, s + v * kLanes));
  mx = lay.row_max(mx);
  // A row with nothing visible so far keeps max -inf: subtract 0 so that exp gives 0, not NaN.
  const VF ms = hn::IfThenElseZero(hn::Ne(mx, hn::Set(df, kNegInf)), mx);
  const VF al = SoftmaxExp(df, hn::Sub(hn::Load(df, m), ms));
  VF sum = hn::Zero(df);
  for (int v = 0; v < nvec; ++v) {
    const VF e = SoftmaxExp(df, hn::Sub(hn::Load(df, s + v * kLanes), ms));
    sum = hn::Add(sum, e);
    hn::Store(vs ? hn::Mul(e, lay.per_key(vs, v)) : e, df, s + v * kLanes);
  }
  hn::Store(hn::MulAdd(hn::Load(df, l), al, sum), df, l);
  hn::Store(mx, df, m);
  alignas(64) float a[kLanes];
  hn::Store(al, df, a);
  for (int r = 0; r < lay.nr; ++r) alpha[r] = a[r];
}

// Where keys [j0, j0 + n) of a sequence live: the kv-head-0 row of K and of V (bytes), and the
// index of their head-0 scale (quantized formats). The same addressing as KvSeq, walked page by
// page instead of dividing per row and head.
struct RowBases {
  // Padded past n (to whole passes of keys) with the last row: reading those rows is harmless and
  // their scores are dropped.
  const uint8_t* k[kBlock + kLanes];
  const uint8_t* v[kBlock + kLanes];
  int64_t scale[kBlock + kLanes];  // index of the head-0 scale
  int32_t rel[kBlock + kLanes];    // scale[j] - scale[0], for gathers (when rel_ok)
  bool rel_ok = true;
  int n = 0;
};
void row_bases(const KvSeq& K, const KvSeq& V, int64_t j0, int n, RowBases& rb) {
  const int64_t eb = K.elem_bytes;
  rb.n = n;
  if (n == 0) return;
  if (K.page_size == 0) {
    for (int j = 0; j < n; ++j) {
      const int64_t t = K.first_row + j0 + j;
      rb.k[j] = K.data + t * K.row_stride * eb;
      rb.v[j] = V.data + t * V.row_stride * eb;
      rb.scale[j] = t * K.num_kv_heads;  // int8: per token slot (fp8 needs pages)
    }
  } else {
    const int64_t ps = K.page_size;
    int64_t pi = j0 / ps, off = j0 % ps;
    for (int j = 0; j < n; ++j) {
      const int64_t page = K.pages[pi];
      rb.k[j] = K.data + (page * K.page_stride + off * K.row_stride) * eb;
      rb.v[j] = V.data + (page * V.page_stride + off * V.row_stride) * eb;
      rb.scale[j] = (K.dtype == DType::kFp8E4M3 ? page : page * ps + off) * K.num_kv_heads;
      if (++off == ps) {
        off = 0;
        ++pi;
      }
    }
  }
  for (int j = n; j < kBlock + kLanes; ++j) {
    rb.k[j] = rb.k[n - 1];
    rb.v[j] = rb.v[n - 1];
    rb.scale[j] = rb.scale[n - 1];
  }
  rb.rel_ok = true;
  for (int j = 0; j < kBlock + kLanes; ++j) {
    const int64_t r = rb.scale[j] - rb.scale[0];
    rb.rel_ok = rb.rel_ok && r >= INT32_MIN && r <= INT32_MAX;
    rb.rel[j] = int32_t(r);
  }
}

// One split of one sequence, every kv head: writes normalised partial O rows and their LSE.
// Row r of kv head hk is (query r / group, query head hk * group + r % group); rows past
// q_len * group are padding (zero queries) whose results are dropped.
HWY_ATTR void run_split(const AttentionParams& p, const Geometry& g, int split, Scratch& sc, float* out_o,
                        float* out_lse) {
  const DF df;
  const int L = kLanes;
  const int d = p.head_dim, dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads, nh = p.num_kv_heads;
  const int real_rows = int(g.q_len) * group;  // per kv head
  const int nr = rows_per_pass(real_rows), rows = padded_rows(real_rows);
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  const KvSeq K = make_kv_seq(p, g.b, false), V = make_kv_seq(p, g.b, true);
  const int64_t pos0 = g.kv_len - g.q_len;  // aligned position of query 0

  // Rows are read straight from the cache when they are whole vectors and need no rotation;
  // otherwise they are staged in f32 (scaled, rotated, zero-padded to whole vectors).
  const bool direct = d % L == 0 && dv % L == 0 && p.rope_inv_freq == nullptr;
  const DType t = direct ? p.kv_dtype : DType::kF32;
  const bool quant = direct && is_quantized(p.kv_dtype);
  const float unbias = t == DType::kFp8E4M3 ? kFp8Half : 1.0f;  // on q and the scales; the output too
  QkFn qk;
  PvFn pv;
  pick_kernels(t, nr, &qk, &pv);
#if ESCALA_DECODE_VNNI
  const bool vnni_qk = t == DType::kI8 && nr == kVnniRows && d % 64 == 0 && d <= 256 && cpu_has_vnni();
  const bool vnni_pv = vnni_qk && dv % 64 == 0;
#else
  const bool vnni_qk = false, vnni_pv = false;
  (void)vnni_qk;
  (void)vnni_pv;
#endif

  // Queries, pre-scaled; head dims are multiples of 8, vectors may be 16 wide: pad with zeros.
  const int dp = (d + L - 1) / L * L, dvp = (dv + L - 1) / L * L;
  float* q = sc.q.get();
  const size_t qb = dtype_size(p.q_dtype);
  std::fill(q, q + size_t(nh) * rows * dp, 0.0f);
  for (int hk = 0; hk < nh; ++hk)
    for (int r = 0; r < real_rows; ++r) {
      const int64_t i = r / group;
      const int h = hk * group + r % group;
      float* dst = q + (size_t(hk) * rows + r) * dp;
      const auto* src = static_cast<const uint8_t*>(p.q) + ((g.q0 + i) * p.q_row_stride + h * p.q_head_stride) * qb;
      row_to_f32(src, p.q_dtype, d, effective_scale(p) * unbias, dst);
    }
#if ESCALA_DECODE_VNNI
  if (vnni_qk)
    for (int r = 0; r < nh * rows; ++r)
      quantize_query_row(q + size_t(r) * dp, d, r % kVnniRows, sc.qd.get() + size_t(r / kVnniRows) * kVnniRows * kDigits * (d / 4),
                         sc.qcorr.get() + r * kDigits, sc.qs.get() + r);
#endif
  float* o = sc.o.get();
  std::fill(o, o + size_t(nh) * rows * dvp, 0.0f);
  float* m = sc.m.get();
  float* l = sc.l.get();
  std::fill(m, m + size_t(nh) * rows / nr * L, kNegInf);  // per pass, lane layout
  std::fill(l, l + size_t(nh) * rows / nr * L, 0.0f);
  const LaneLayout lay(nr);

  // This split's share of the visited keys: sinks first, then the window part.
  const int64_t total = g.sink_end + (g.range_end - g.range_begin);
  const int64_t per = (total + g.splits - 1) / g.splits;
  const int64_t v_lo = std::min(total, int64_t(split) * per), v_hi = std::min(total, v_lo + per);
  auto key_of = [&](int64_t v) { return v < g.sink_end ? v : g.range_begin + (v - g.sink_end); };
  auto block_end = [&](int64_t v0) {  // a block never straddles the sink/window boundary
    int64_t v1 = std::min(v_hi, v0 + kBlock);
    if (v0 < g.sink_end) v1 = std::min(v1, g.sink_end);
    return v1;
  };

  float* kf = sc.kf.get();
  float* vf = sc.vf.get();
  float* s = sc.s.get();
  float* alpha = sc.alpha.get();
  float* ks = sc.ks.get();
  float* vs = sc.vs.get();
  // Staged rows (not direct): one f32 row per key, read at offset 0.
  RowBases staged;
  for (int j = 0; j < kBlock + kLanes; ++j) {
    staged.k[j] = reinterpret_cast<const uint8_t*>(kf + size_t(std::min(j, kBlock - 1)) * dp);
    staged.v[j] = reinterpret_cast<const uint8_t*>(vf + size_t(std::min(j, kBlock - 1)) * dvp);
  }
  // Scales are gathered with 32-bit indices: every pool this kernel reads has fewer than 2^31 of them.
  const hn::RebindToSigned<DF> di;
  RowBases bases[2];
  int cur_i = 0;
  for (int64_t v0 = v_lo; v0 < v_hi;) {
    const int64_t v1 = block_end(v0);
    const int nk = int(v1 - v0);
    const int64_t j0 = key_of(v0);
    const int next_i = 1 - cur_i;
    if (direct) {  // row addresses of this block (computed as the previous one's next) and the next
      if (v0 == v_lo) row_bases(K, V, j0, nk, bases[cur_i]);
      const int64_t v2 = v1 < v_hi ? block_end(v1) : v1;
      row_bases(K, V, v1 < v_hi ? key_of(v1) : 0, int(v2 - v1), bases[next_i]);
    }
    const RowBases& cur = direct ? bases[cur_i] : staged;
    const RowBases& next = bases[next_i];
    // Per-element masking only when some (query, key) pair of the block may be invisible.
    const int64_t jl = j0 + nk - 1, pos_hi = pos0 + g.q_len - 1;
    const bool full = (!p.causal || jl <= pos0) &&
                      (p.window_left < 0 || j0 >= pos_hi - p.window_left || jl < p.num_sinks) &&
                      (p.window_right < 0 || jl <= pos0 + p.window_right || jl < p.num_sinks);
    const int nkp = (nk + L - 1) / L * L;  // scores padded to whole vectors with -inf
    if (quant && next.n > 0)  // the next block's scales (every head's)
      for (int j = 0; j < next.n; ++j)
        if (j == 0 || next.scale[j] != next.scale[j - 1]) {
          request(reinterpret_cast<const uint8_t*>(K.scale + next.scale[j]));
          request(reinterpret_cast<const uint8_t*>(V.scale + next.scale[j]));
        }
    for (int hk = 0; hk < nh; ++hk) {
      float* qh = q + size_t(hk) * rows * dp;
      float* oh = o + size_t(hk) * rows * dvp;
      size_t koff = 0, voff = 0;
      if (direct) {
        koff = size_t(hk * K.head_stride * K.elem_bytes);
        voff = size_t(hk * V.head_stride * V.elem_bytes);
        if (quant && cur.rel_ok) {  // per-key scales of this head, zero past the block
          const VF ub = hn::Set(df, unbias);
          const float* kbase = K.scale + cur.scale[0] + hk;
          const float* vbase = V.scale + cur.scale[0] + hk;
          for (int j = 0; j < nkp; j += L) {
            const auto idx = hn::LoadU(di, cur.rel + j);
            const auto valid = hn::FirstN(df, size_t(std::max(0, nk - j)));
            hn::Store(hn::IfThenElseZero(valid, hn::Mul(hn::GatherIndex(df, kbase, idx), ub)), df, ks + j);
            hn::Store(hn::IfThenElseZero(valid, hn::Mul(hn::GatherIndex(df, vbase, idx), ub)), df, vs + j);
          }
        } else if (quant) {
          for (int j = 0; j < nkp; ++j) {
            ks[j] = j < nk ? K.scale[cur.scale[j] + hk] * unbias : 0.0f;
            vs[j] = j < nk ? V.scale[cur.scale[j] + hk] * unbias : 0.0f;
          }
        }
      } else {
        load_kv_tile(K, hk, j0, j0 + nk, d, nk, kf, dp, p.rope_inv_freq, p.rope_neox);
        load_kv_tile(V, hk, j0, j0 + nk, dv, nk, vf, dvp);
        if (dp != d || dvp != dv)
          for (int j = 0; j < nk; ++j) {
            std::fill(kf + size_t(j) * dp + d, kf + size_t(j) * dp + dp, 0.0f);
            std::fill(vf + size_t(j) * dvp + dv, vf + size_t(j) * dvp + dvp, 0.0f);
          }
      }
      // While a head reads its rows of this block, it requests its rows of the next block (a
      // request for the next head's rows of this block instead, closer ahead, was slower).
      const uint8_t* const* pfk = direct && next.n > 0 ? next.k : nullptr;
      const uint8_t* const* pfv = direct && next.n > 0 ? next.v : nullptr;
      const size_t pkoff = koff, pvoff = voff;
#if ESCALA_DECODE_VNNI
      if (vnni_qk)
        qk_i8_vnni(sc.qd.get() + size_t(hk) * rows * kDigits * (d / 4), sc.qcorr.get() + hk * rows * kDigits,
                   sc.qs.get() + hk * rows, d, cur.k, koff, nk, rows, s, pfk, pkoff);
      else
#endif
        qk(qh, size_t(dp), cur.k, koff, nk, rows, s, pfk, pkoff);
      const int nvec = nkp * nr / L;  // score vectors per pass
      for (int r0 = 0; r0 < rows; r0 += nr) {
        float* sp = s + size_t(r0) * kBlock;
        if (quant)
          for (int v = 0; v < nvec; ++v)
            hn::Store(hn::Mul(hn::Load(df, sp + v * L), lay.per_key(ks, v)), df, sp + v * L);
        if (p.softcap > 0.0f) {
          const VF cap = hn::Set(df, p.softcap), inv = hn::Set(df, 1.0f / p.softcap);
          for (int v = 0; v < nvec; ++v)
            hn::Store(hn::Mul(cap, hn::Tanh(df, hn::Mul(hn::Load(df, sp + v * L), inv))), df, sp + v * L);
        }
        for (int i = nk * nr; i < nvec * L; ++i) sp[i] = kNegInf;  // after the soft-cap, which would make it finite
        if (!full)
          for (int rr = 0; rr < nr; ++rr) {
            const int64_t pos = pos0 + (r0 + rr) / group;
            for (int j = 0; j < nk; ++j)
              if (!mask.visible(pos, j0 + j)) sp[j * nr + rr] = kNegInf;
          }
        const size_t st = (size_t(hk) * rows + r0) / nr * L;  // this pass's running state
        softmax_pass(sp, nvec, lay, quant ? vs : nullptr, m + st, l + st, alpha + r0);
      }
#if ESCALA_DECODE_VNNI
      if (vnni_pv)
        pv_i8_vnni(s, cur.v, voff, alpha, nk, rows, dv, size_t(dvp), oh, pfv, pvoff);
      else
#endif
        pv(s, cur.v, voff, alpha, nk, rows, size_t(dvp), oh, pfv, pvoff);
    }
    v0 = v1;
    cur_i = next_i;
  }
  for (int hk = 0; hk < nh; ++hk)
    for (int r = 0; r < real_rows; ++r) {
      const int rp = hk * rows + r, ro = hk * real_rows + r;
      const size_t st = size_t(rp) / nr * L;  // the row's pass state; its lanes kk * nr + r % nr
      float lr = 0.0f;
      for (int kk = 0; kk < L / nr; ++kk) lr += l[st + kk * nr + r % nr];
      const float mr = m[st + r % nr];
      const float inv = lr != 0.0f ? 1.0f / lr : 0.0f;  // 0: nothing visible; NaN goes on
      const float inv_o = inv * unbias;  // fp8: the V half of 2^120
      const float* orow = o + size_t(rp) * dvp;
#if ESCALA_DECODE_VNNI
      if (vnni_pv)  // o's columns in the order of the int8 interleave
        for (int c = 0; c < dv; ++c) out_o[size_t(ro) * dv + c] = orow[vnni_column(c)] * inv_o;
      else
#endif
        for (int c = 0; c < dv; ++c) out_o[size_t(ro) * dv + c] = orow[c] * inv_o;
      out_lse[ro] = lr != 0.0f ? mr + std::log(lr) : kNegInf;
    }
}

}  // namespace
HWY_ATTR void DecodeAttentionImpl(const AttentionParams& p, int num_threads, int num_splits, SeqRange range) {
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const int threads = num_threads > 0 ? num_threads : omp_get_max_threads();
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};

  // Geometry per sequence and its split count.
  std::vector<Geometry> geo;
  int max_rows = 0;      // rows of one item: every kv head's (queries x group)
  int max_pad_rows = 0;  // the same, each kv head's rows padded to whole passes
  for (int32_t b = 0; b < p.batch; ++b) {
    Geometry g{};
    g.b = b;
    g.q0 = p.cu_seqlens_q[b];
    g.q_len = p.cu_seqlens_q[b + 1] - g.q0;
    g.kv_len = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    if (!range.covers(g.q_len)) continue;
    const int64_t pos_lo = g.kv_len - g.q_len, pos_hi = g.kv_len - 1;
    g.range_end = mask.key_end(pos_hi, g.kv_len);
    g.range_begin = std::min(mask.window_begin(pos_lo), g.range_end);
    g.sink_end = std::min<int64_t>(p.num_sinks, g.range_begin);
    max_rows = std::max(max_rows, int(g.q_len) * p.num_heads);
    max_pad_rows = std::max(max_pad_rows, padded_rows(int(g.q_len) * group) * p.num_kv_heads);
    // Splits from this sequence alone (its length and the threads), never from the rest of the
    // batch: enough items to keep every thread busy, none shorter than kMinSplitKeys.
    const int64_t keys = g.sink_end + g.range_end - g.range_begin;
    // Four splits per thread: dynamic scheduling then evens out a thread that is slowed down (by
    // another process on a shared machine) instead of the whole call waiting for its last split.
    const int64_t wanted = std::min<int64_t>(4 * int64_t(threads), keys / kMinSplitKeys);
    g.splits = num_splits > 0 ? num_splits : int(std::clamp<int64_t>(wanted, 1, 256));
    geo.push_back(g);
  }
  if (geo.empty()) return;

  // Partials: one slot of [rows][dv] and [rows] per (sequence, split).
  std::vector<int64_t> first_item(geo.size() + 1, 0);
  for (size_t gi = 0; gi < geo.size(); ++gi) first_item[gi + 1] = first_item[gi] + geo[gi].splits;
  const int64_t n_items = first_item.back();
  const size_t stride_o = size_t(max_rows) * dv;
  std::vector<float> part_o(size_t(n_items) * stride_o), part_lse(size_t(n_items) * max_rows);
  const int d_pad = p.head_dim + 64, dv_pad = dv + 64;
#pragma omp parallel num_threads(threads)
  {
    Scratch sc;
    sc.init(max_pad_rows, d_pad, dv_pad);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const size_t gi = size_t(std::upper_bound(first_item.begin(), first_item.end(), it) - first_item.begin() - 1);
      const int sp = int(it - first_item[gi]);
      run_split(p, geo[gi], sp, sc, part_o.data() + size_t(it) * stride_o, part_lse.data() + size_t(it) * max_rows);
    }
  }

  // Merge the splits (and the learned sink logit, a partial with no value), write O and LSE.
  const size_t ob = dtype_size(p.o_dtype);
  std::vector<float> acc(dv);
  for (size_t gi = 0; gi < geo.size(); ++gi) {
    const Geometry& g = geo[gi];
    const int rows = int(g.q_len) * group;  // per kv head
    for (int r = 0; r < rows * p.num_kv_heads; ++r) {
      const int64_t i = (r % rows) / group;
      const int h = (r / rows) * group + (r % rows) % group;
      float lse = kNegInf;
      for (int sp = 0; sp < g.splits; ++sp) {
        const size_t it = size_t(first_item[gi] + sp);
        merge_partial(acc.data(), &lse, part_o.data() + it * stride_o + size_t(r) * dv,
                      part_lse[it * max_rows + r], dv);
      }
      if (lse == kNegInf) std::fill(acc.begin(), acc.end(), 0.0f);
      if (p.sink_logits) merge_partial(acc.data(), &lse, nullptr, p.sink_logits[h], dv);
      auto* dst = static_cast<uint8_t*>(p.o) + ((g.q0 + i) * p.o_row_stride + h * p.o_head_stride) * ob;
      for (int c = 0; c < dv; ++c) store_float(dst, p.o_dtype, c, acc[c]);
      if (p.lse) p.lse[(g.q0 + i) * p.num_heads + h] = lse;
    }
  }
}

}  // namespace escala::attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace escala::attn::cpu {
HWY_EXPORT(DecodeAttentionImpl);
void decode_attention(const AttentionParams& p, int num_threads, int num_splits, SeqRange range) {
  HWY_DYNAMIC_DISPATCH(DecodeAttentionImpl)(p, num_threads, num_splits, range);
}
}  // namespace escala::attn::cpu
#endif
