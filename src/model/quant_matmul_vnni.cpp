// AVX-512 VNNI kernels for q4_0, q4_1, q8_0, q4_K and q6_K, chosen at run time (cpuid) ahead of
// the portable Highway kernels in quant_matmul.cpp.
//
// Highway 1.0.3 has no 8-bit dot product and gates its AVX3_DL target behind a macro that would
// change the dispatch tables of every Highway user in the binary, so this one file uses
// intrinsics under a function-level target attribute instead.
//
// The 32-element formats are handled as "unsigned bytes u times int8 activations": q4 nibbles are
// 0..15 already, q8_0 levels are shifted by +128. With the activation block sums s = d_a * sum(a),
//   y += d_w * d_a * dot(u, a) + m_w * s,   m_w = m (q4_1), -8 d_w (q4_0), -128 d_w (q8_0).
// Their kernels put 16 weight rows in the 16 lanes (see pack_slab).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "model/quant_blocks.h"
#include "model/quant_matmul_internal.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers initialise their "undefined" vectors from themselves, which
// -Wmaybe-uninitialized reports at every use.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#define ESCALA_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#endif

namespace escala::model {

namespace {
std::atomic<bool> g_vnni_enabled{true};
}

void set_vnni_enabled(bool enabled) { g_vnni_enabled = enabled; }

bool vnni_handles(TensorType t) {
  return t == TensorType::kQ4_0 || t == TensorType::kQ4_1 || t == TensorType::kQ8_0 ||
         t == TensorType::kQ4_K || t == TensorType::kQ6_K;
}

#if defined(__x86_64__)

namespace {

enum class Kind { kQ4_0, kQ4_1, kQ8_0 };

template <Kind K>
constexpr int64_t kBytes = K == Kind::kQ4_0 ? 18 : K == Kind::kQ4_1 ? 20 : 34;
template <Kind K>
constexpr int64_t kQsOffset = K == Kind::kQ4_1 ? 4 : 2;

// ---- q4_0, q4_1, q8_0: 16 weight rows in the 16 lanes ----
//
// A slab of 16 weight rows is transposed once per call into `kUnpackedBlock` bytes per block:
// eight vectors of unsigned bytes, vector j holding bytes 4j..4j+3 of the block's levels in
// natural element order for each of the 16 rows (lane n = row n), then the rows' 16 weight scales
// d_w and offsets m_w as floats. Against that, vpdpbusd with one activation dword broadcast to
// every lane accumulates a whole block's integer dot product per lane in 8 instructions, so the
// float work per block and activation row is one convert, one multiply and two FMAs for 16 output
// rows, and the unpacking/transposing of the weights is paid once per slab however many
// activation rows use it.
//
// Every output element is accumulated in the same order whatever m and whichever microkernel
// width computes it: acc = 0; for each block b in order: acc = fma(float(isum_b), d_w * d_a, acc);
// acc = fma(m_w, s_a, acc). Integer sums are exact, so a row's result is bit-identical alone or
// in any batch.
constexpr int kSlab = 16;
constexpr int64_t kUnpackedBlock = 8 * 64 + 2 * 64;  // a block of a slab in the L1 buffer

// 4x4 transpose of dwords inside each 128-bit lane of a0..a3.
ESCALA_VNNI_TARGET inline void transpose4(__m512i a0, __m512i a1, __m512i a2, __m512i a3, __m512i v[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(a0, a1), t1 = _mm512_unpackhi_epi32(a0, a1);
  const __m512i t2 = _mm512_unpacklo_epi32(a2, a3), t3 = _mm512_unpackhi_epi32(a2, a3);
  v[0] = _mm512_unpacklo_epi64(t0, t2);
  v[1] = _mm512_unpackhi_epi64(t0, t2);
  v[2] = _mm512_unpacklo_epi64(t1, t3);
  v[3] = _mm512_unpackhi_epi64(t1, t3);
}

ESCALA_VNNI_TARGET inline __m128i load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
ESCALA_VNNI_TARGET inline __m256i load256(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// 16 weight rows p + n * stride, n = 0..15 (a tail slab is staged with its last row repeated).
// While a block is unpacked, `pf_per_block` lines of the next slab (from `pf`) are prefetched:
// the 16 rows are read one block apart, a pattern the hardware prefetchers do not follow well.
struct Slab {
  const uint8_t* p;
  int64_t stride;
  __m512i off;  // n * stride, for the scale gather
  const uint8_t* pf;
  int64_t pf_per_block;
};

// Block b of the slab in the lanes: w[j] = bytes 4j..4j+3 of each row's unsigned levels, d_w and
// m_w as floats.
template <Kind K>
ESCALA_VNNI_TARGET inline void unpack_block(const Slab& sl, int64_t b, __m512i w[8], __m512& dw, __m512& mw) {
  for (int64_t i = 0; i < sl.pf_per_block; ++i)
    _mm_prefetch(reinterpret_cast<const char*>(sl.pf + (b * sl.pf_per_block + i) * 64), _MM_HINT_T0);
  const uint8_t* p = sl.p + b * kBytes<K> + kQsOffset<K>;
  const int64_t st = sl.stride;
  if constexpr (K == Kind::kQ8_0) {
    // Rows j and 8 + j in the two halves; an 8x8 dword transpose inside each half.
    __m512i bj[8];
    for (int j = 0; j < 8; ++j)
      bj[j] = _mm512_inserti64x4(_mm512_castsi256_si512(load256(p + j * st)), load256(p + (8 + j) * st), 1);
    __m512i u[8];
    transpose4(bj[0], bj[1], bj[2], bj[3], u);
    transpose4(bj[4], bj[5], bj[6], bj[7], u + 4);
    // u[c] (c < 4): in 128-bit lane L of each half, rows 0-3 of dword 4L + c; u[4 + c]: rows 4-7.
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int c = 0; c < 4; ++c) {
      w[c] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[c], lo, u[4 + c]), flip);
      w[4 + c] = _mm512_xor_si512(_mm512_permutex2var_epi64(u[c], hi, u[4 + c]), flip);
    }
  } else {
    // 128-bit lane k of a[i] is row 4k + i, so after the transpose lane 4k + i is row 4k + i.
    __m512i a[4];
    for (int i = 0; i < 4; ++i) {
      __m512i v = _mm512_castsi128_si512(load128(p + i * st));
      v = _mm512_inserti32x4(v, load128(p + (4 + i) * st), 1);
      v = _mm512_inserti32x4(v, load128(p + (8 + i) * st), 2);
      a[i] = _mm512_inserti32x4(v, load128(p + (12 + i) * st), 3);
    }
    __m512i v[4];
    transpose4(a[0], a[1], a[2], a[3], v);
    // Byte i of qs holds element i (low nibble) and i + 16 (high nibble).
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      w[c] = _mm512_and_si512(v[c], m4);
      w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v[c], 4), m4);
    }
  }
  // d (and q4_1's m) are the block's first 4 bytes.
  const __m512i g = _mm512_i32gather_epi32(sl.off, sl.p + b * kBytes<K>, 1);
  dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
  if constexpr (K == Kind::kQ4_1) {
    mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
  } else {
    mw = _mm512_mul_ps(dw, _mm512_set1_ps(K == Kind::kQ4_0 ? -8.0f : -128.0f));
  }
}

// Weights stored at load time (PackedWeights), per slab and block: q4_0/q4_1 the four transposed
// dwords of nibbles as they are (vector c, lane n = bytes 4c..4c+3 of row n's qs), then the 16
// rows' d and (q4_1) m as f16; q8_0 the eight transposed dwords of levels + 128, then d. Padded to
// whole cache lines. Unpacking gives exactly unpack_block's vectors.
template <Kind K>
constexpr int64_t kStoredBlock = K == Kind::kQ8_0 ? 576 : 320;

template <Kind K>
ESCALA_VNNI_TARGET inline void stored_block(const uint8_t* p, __m512i w[8], __m512& dw, __m512& mw) {
  if constexpr (K == Kind::kQ8_0) {
    for (int j = 0; j < 8; ++j) w[j] = _mm512_load_si512(p + 64 * j);
    dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 512)));
    mw = _mm512_mul_ps(dw, _mm512_set1_ps(-128.0f));
  } else {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_load_si512(p + 64 * c);
      w[c] = _mm512_and_si512(v, m4);
      w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 256)));
    if constexpr (K == Kind::kQ4_1) {
      mw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(p + 288)));
    } else {
      mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
    }
  }
}

// Where a slab's blocks come from: the GGUF rows (transposed per use) or the stored copy.
template <Kind K>
struct RawSrc {
  Slab sl;
  ESCALA_VNNI_TARGET void block(int64_t b, __m512i w[8], __m512& dw, __m512& mw) const {
    unpack_block<K>(sl, b, w, dw, mw);
  }
};
template <Kind K>
struct StoredSrc {
  const uint8_t* p;
  ESCALA_VNNI_TARGET void block(int64_t b, __m512i w[8], __m512& dw, __m512& mw) const {
    stored_block<K>(p + b * kStoredBlock<K>, w, dw, mw);
  }
};

template <class Src>
ESCALA_VNNI_TARGET void pack_slab(const Src& src, int64_t nb, uint8_t* out) {
  for (int64_t b = 0; b < nb; ++b, out += kUnpackedBlock) {
    __m512i w[8];
    __m512 dw, mw;
    src.block(b, w, dw, mw);
    for (int j = 0; j < 8; ++j) _mm512_store_si512(out + 64 * j, w[j]);
    _mm512_store_ps(reinterpret_cast<float*>(out + 512), dw);
    _mm512_store_ps(reinterpret_cast<float*>(out + 576), mw);
  }
}

ESCALA_VNNI_TARGET inline __m512i bcast32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// One block of activation row `at / nb` (at = row * nb + block) into acc: the only float
// arithmetic of the 32-element kernels, so every path gives the same bits.
// `at` indexes the row's block in VnniActs' interleaved layout.
ESCALA_VNNI_TARGET inline void block_step(const __m512i w[8], __m512 dw, __m512 mw, const VnniActs& a,
                                          int64_t at, __m512& acc) {
  const int8_t* aq = a.q.data() + at * 32;
  // Two chains of four so the dependent vpdpbusd latencies overlap (integer sums: exact). The
  // first starts from the bits of 1.5 * 2^23, so the sum's bits are the float 1.5 * 2^23 + sum
  // and subtracting 1.5 * 2^23 converts it exactly (|sum| <= 32 * 255 * 127 < 2^22): the same
  // value as vcvtdq2ps, on the ports vpdpbusd leaves free (it and the conversion both need p0).
  __m512i s0 = _mm512_dpbusd_epi32(_mm512_set1_epi32(0x4B400000), w[0], bcast32(aq));
  __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast32(aq + 4));
  s0 = _mm512_dpbusd_epi32(s0, w[2], bcast32(aq + 8));
  s1 = _mm512_dpbusd_epi32(s1, w[3], bcast32(aq + 12));
  s0 = _mm512_dpbusd_epi32(s0, w[4], bcast32(aq + 16));
  s1 = _mm512_dpbusd_epi32(s1, w[5], bcast32(aq + 20));
  s0 = _mm512_dpbusd_epi32(s0, w[6], bcast32(aq + 24));
  s1 = _mm512_dpbusd_epi32(s1, w[7], bcast32(aq + 28));
  const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[static_cast<size_t>(at)]));
  const __m512 sum = _mm512_sub_ps(_mm512_castsi512_ps(_mm512_add_epi32(s0, s1)), _mm512_set1_ps(12582912.0f));
  acc = _mm512_fmadd_ps(sum, scale, acc);
  acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[static_cast<size_t>(at)]), acc);
}

// R activation rows from t0 against a packed slab; y + t * ystride is activation row t's output
// for the slab's first weight row; `live` masks the slab's valid rows.
// `pf_per_block` lines from `pf` (the next slab) are prefetched per block.
template <int R>
ESCALA_VNNI_TARGET void slab_rows(const uint8_t* pk, const VnniActs& a, int64_t t0, float* y,
                                  int64_t ystride, __mmask16 live, const uint8_t* pf = nullptr,
                                  int64_t pf_per_block = 0) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t nb = a.nb;
  for (int64_t b = 0; b < nb; ++b, pk += kUnpackedBlock) {
    for (int64_t i = 0; i < pf_per_block; ++i)
      _mm_prefetch(reinterpret_cast<const char*>(pf + (b * pf_per_block + i) * 64), _MM_HINT_T0);
    __m512i w[8];
    for (int j = 0; j < 8; ++j) w[j] = _mm512_load_si512(pk + 64 * j);
    const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(pk + 512));
    const __m512 mw = _mm512_load_ps(reinterpret_cast<const float*>(pk + 576));
    // Rows t0 .. t0 + R - 1 lie in one group of VnniActs::kGroup: one base index per block.
    const int64_t at = ((t0 / VnniActs::kGroup) * nb + b) * VnniActs::kGroup + t0 % VnniActs::kGroup;
    for (int r = 0; r < R; ++r) block_step(w, dw, mw, a, at + r, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (t0 + r) * ystride, live, acc[r]);
}

// Few activation rows (decode): each block is unpacked in registers and used at once.
template <int R, class Src>
ESCALA_VNNI_TARGET void direct_rows(const Src& src, const VnniActs& a, float* y,
                                    int64_t ystride, __mmask16 live) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t nb = a.nb;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i w[8];
    __m512 dw, mw;
    src.block(b, w, dw, mw);
    for (int r = 0; r < R; ++r) block_step(w, dw, mw, a, b * VnniActs::kGroup + r, acc[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ystride, live, acc[r]);
}

struct AlignedBuf {
  uint8_t* p = nullptr;
  size_t cap = 0;
  ~AlignedBuf() { std::free(p); }
  uint8_t* get(size_t n) {
    if (n > cap) {
      std::free(p);
      cap = (n + 63) / 64 * 64;
      p = static_cast<uint8_t*>(std::aligned_alloc(64, cap));
    }
    return p;
  }
};

// Up to this many activation rows, blocks are unpacked in registers per use (direct_rows);
// beyond, each slab is unpacked once into a buffer that every group of rows reads.
constexpr int64_t kDirectMaxRows = 2;

// A slab's product with every activation row.
// `next` (null: none) is the next slab of stored weights, `next_bytes` long: prefetched while
// this one is multiplied, so its memory latency overlaps the arithmetic.
template <class Src>
ESCALA_VNNI_TARGET void slab_product(const Src& src, const VnniActs& a, uint8_t* pk, float* yb, int64_t ystride,
                                     __mmask16 live, const uint8_t* next = nullptr, int64_t next_bytes = 0) {
  if (a.m == 1) return direct_rows<1>(src, a, yb, ystride, live);
  if (a.m == 2) return direct_rows<2>(src, a, yb, ystride, live);
  pack_slab(src, a.nb, pk);
  int64_t t = 0;
  if (next && a.m >= 8) {
    slab_rows<8>(pk, a, t, yb, ystride, live, next, (next_bytes / 64 + a.nb - 1) / a.nb);
    t += 8;
  }
  for (; t + 8 <= a.m; t += 8) slab_rows<8>(pk, a, t, yb, ystride, live);
  if (t + 4 <= a.m) {
    slab_rows<4>(pk, a, t, yb, ystride, live);
    t += 4;
  }
  if (t + 2 <= a.m) {
    slab_rows<2>(pk, a, t, yb, ystride, live);
    t += 2;
  }
  if (t < a.m) slab_rows<1>(pk, a, t, yb, ystride, live);
}

template <Kind K>
ESCALA_VNNI_TARGET void rows_impl(const WeightView& w, const StoredWeight* st, const VnniActs& a, float* y,
                                  int64_t row_begin, int64_t row_end) {
  thread_local AlignedBuf buf, tail;
  uint8_t* pk = a.m > kDirectMaxRows ? buf.get(static_cast<size_t>(a.nb * kUnpackedBlock)) : nullptr;
  if (st) {  // row_begin is a multiple of kSlab (matmul's chunks)
    for (int64_t n0 = row_begin; n0 < row_end; n0 += kSlab) {
      const int valid = static_cast<int>(std::min<int64_t>(kSlab, row_end - n0));
      const int64_t slab_bytes = a.nb * kStoredBlock<K>;
      const StoredSrc<K> src{st->data + (n0 / kSlab) * slab_bytes};
      slab_product(src, a, pk, y + n0, w.rows, static_cast<__mmask16>((1u << valid) - 1u),
                   n0 + kSlab < row_end ? src.p + slab_bytes : nullptr, slab_bytes);
    }
    return;
  }
  const int64_t stride = static_cast<int64_t>(w.row_stride);
  const int64_t rbytes = a.nb * kBytes<K>;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const auto* end = base + w.rows * stride;  // prefetches stay inside the matrix
  const int64_t slab_lines = (kSlab * stride + 63) / 64;
  RawSrc<K> src;
  Slab& sl = src.sl;
  for (int64_t n0 = row_begin; n0 < row_end; n0 += kSlab) {
    const int valid = static_cast<int>(std::min<int64_t>(kSlab, row_end - n0));
    sl.p = base + n0 * stride;
    sl.stride = stride;
    if (valid < kSlab) {  // stage the rows, the last one repeated
      uint8_t* t = tail.get(static_cast<size_t>(kSlab * rbytes));
      for (int n = 0; n < kSlab; ++n) std::memcpy(t + n * rbytes, sl.p + std::min(n, valid - 1) * stride, size_t(rbytes));
      sl.p = t;
      sl.stride = rbytes;
    }
    sl.off = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                _mm512_set1_epi32(static_cast<int32_t>(sl.stride)));
    sl.pf = base + (n0 + kSlab) * stride;
    sl.pf_per_block = n0 + 2 * kSlab <= row_end ? (slab_lines + a.nb - 1) / a.nb : 0;
    if (sl.pf + slab_lines * 64 > end) sl.pf_per_block = 0;
    slab_product(src, a, pk, y + n0, w.rows, static_cast<__mmask16>((1u << valid) - 1u));
  }
}

// The stored copy of w: rows in slabs of 16 (the last padded with its last row), blocks in the
// layout stored_block reads. Serial on purpose (~70 ms for SmolLM2): an OpenMP team created here,
// on the thread that loads the model, made `escala serve` (whose engine thread runs the products
// with a team of its own) 1.5x slower per single-stream token — three OpenMP threads on two CPUs,
// and libgomp throttles its spin-wait when it manages more threads than there are CPUs.
template <Kind K>
void store_weight(const WeightView& w, uint8_t* out) {
  const int64_t nb = w.cols / 32, nslabs = (w.rows + kSlab - 1) / kSlab;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t s = 0; s < nslabs; ++s) {
    for (int n = 0; n < kSlab; ++n) {
      const uint8_t* row = base + std::min(s * kSlab + n, w.rows - 1) * static_cast<int64_t>(w.row_stride);
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * kBytes<K>;
        uint8_t* o = out + (s * nb + b) * kStoredBlock<K>;
        if constexpr (K == Kind::kQ8_0) {
          for (int j = 0; j < 8; ++j)
            for (int i = 0; i < 4; ++i) o[64 * j + 4 * n + i] = static_cast<uint8_t>(blk[2 + 4 * j + i] ^ 0x80);
          std::memcpy(o + 512 + 2 * n, blk, 2);
        } else {
          for (int c = 0; c < 4; ++c) std::memcpy(o + 64 * c + 4 * n, blk + kQsOffset<K> + 4 * c, 4);
          std::memcpy(o + 256 + 2 * n, blk, 2);
          if constexpr (K == Kind::kQ4_1) std::memcpy(o + 288 + 2 * n, blk + 2, 2);
        }
      }
    }
  }
}

// q4_K: a 64-element chunk c is 32 bytes whose low nibbles are sub-block 2c and high nibbles
// 2c+1, so [low | high] is the chunk in natural order and one vpdpbusd covers it. Lanes 0-7 of
// the result belong to sub-block 2c, 8-15 to 2c+1; the 6-bit scales are applied in float.
template <int R>
ESCALA_VNNI_TARGET void dot_q4_k(const uint8_t* row, const VnniActsK& a, int64_t t0, float* out) {
  __m512 facc[R][2];
  float mins[R];
  for (int r = 0; r < R; ++r) {
    facc[r][0] = facc[r][1] = _mm512_setzero_ps();
    mins[r] = 0;
  }
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < a.nsb; ++b) {
    const uint8_t* blk = row + b * static_cast<int64_t>(sizeof(BlockQ4_K));
    uint16_t dh, mh;
    std::memcpy(&dh, blk + offsetof(BlockQ4_K, d), 2);
    std::memcpy(&mh, blk + offsetof(BlockQ4_K, dmin), 2);
    const float d = _cvtsh_ss(dh), dmin = _cvtsh_ss(mh);
    // The eight 6-bit scales and mins, unpacked four at a time in 32-bit words (the packing of
    // quant_blocks.h's k_scale_min).
    uint32_t u[3];
    std::memcpy(u, blk + offsetof(BlockQ4_K, scales), 12);
    const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, mn_lo = u[1] & 0x3f3f3f3fu;
    const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const __m128i sc_b = _mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo));
    const __m128i mn_b = _mm_set_epi32(0, 0, static_cast<int>(mn_hi), static_cast<int>(mn_lo));
    const __m512 sc8 = _mm512_castps256_ps512(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc_b)));
    // Each min covers two 16-element activation sums: [m0, m0, m1, m1, ...].
    const __m512i mn16 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(mn_b, mn_b));
    __m512 scale[R];
    for (int r = 0; r < R; ++r) {
      const int64_t at = (t0 + r) * a.nsb + b;
      const float da = a.d[static_cast<size_t>(at)];
      scale[r] = _mm512_mul_ps(sc8, _mm512_set1_ps(d * da));
      const __m512i bs = _mm512_loadu_si512(a.bsum.data() + at * 16);
      const int msum = _mm512_reduce_add_epi32(_mm512_mullo_epi32(mn16, bs));
      mins[r] += dmin * da * static_cast<float>(msum);
    }
    const uint8_t* qs = blk + offsetof(BlockQ4_K, qs);
    for (int c = 0; c < 4; ++c) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, mask)),
                                     _mm256_and_si256(_mm256_srli_epi16(v, 4), mask), 1);
      const __m512i idx = _mm512_setr_epi32(2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c, 2 * c,
                                            2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,
                                            2 * c + 1, 2 * c + 1, 2 * c + 1);
      for (int r = 0; r < R; ++r) {
        const int8_t* aq = a.q.data() + ((t0 + r) * a.nsb + b) * 256 + 64 * c;
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(aq));
        facc[r][c & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, scale[r]),
                                         facc[r][c & 1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(facc[r][0], facc[r][1])) - mins[r];
}

// q6_K: the unsigned 6-bit levels go through vpdpbusd, and the -32 offset comes back through
// the activation sums of each 16 elements: sum_k sc_k * 32 * bsum_k. Half h (128 elements)
// unpacks from 64 ql bytes and 32 qh bytes into elements 0-63 (low nibbles, qh bits 0-3) and
// 64-127 (high nibbles, qh bits 4-7), both in natural order.
template <int R>
ESCALA_VNNI_TARGET void dot_q6_k(const uint8_t* row, const VnniActsK& a, int64_t t0, float* out) {
  __m512 facc[R][2];
  for (int r = 0; r < R; ++r) facc[r][0] = facc[r][1] = _mm512_setzero_ps();
  float corr[R] = {};
  const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(0x03);
  for (int64_t b = 0; b < a.nsb; ++b) {
    const uint8_t* blk = row + b * static_cast<int64_t>(sizeof(BlockQ6_K));
    uint16_t dh;
    std::memcpy(&dh, blk + offsetof(BlockQ6_K, d), 2);
    const float d = _cvtsh_ss(dh);
    const __m512i sc_i = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + offsetof(BlockQ6_K, scales))));
    const __m512 sc_f = _mm512_cvtepi32_ps(sc_i);
    __m512 scale[R];
    for (int r = 0; r < R; ++r) {
      const int64_t at = (t0 + r) * a.nsb + b;
      const float dd = d * a.d[static_cast<size_t>(at)];
      scale[r] = _mm512_mul_ps(sc_f, _mm512_set1_ps(dd));
      const __m512i bs = _mm512_loadu_si512(a.bsum.data() + at * 16);
      corr[r] += 32.0f * dd * static_cast<float>(_mm512_reduce_add_epi32(_mm512_mullo_epi32(sc_i, bs)));
    }
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(blk + offsetof(BlockQ6_K, ql) + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ6_K, qh) + 32 * h));
      const __m512i qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      const __m512i lo = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                         _mm512_slli_epi16(_mm512_and_si512(qh2, m2), 4));
      const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                         _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), m2), 4));
      // Lane l of a 64-element product belongs to sub-block 8h + 4 * part + l / 4.
      const __m512i idx0 = _mm512_add_epi32(
          _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_set1_epi32(8 * h));
      const __m512i idx1 = _mm512_add_epi32(idx0, _mm512_set1_epi32(4));
      for (int r = 0; r < R; ++r) {
        const int8_t* aq = a.q.data() + ((t0 + r) * a.nsb + b) * 256 + 128 * h;
        __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(aq));
        __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512(aq + 64));
        facc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_permutexvar_ps(idx0, scale[r]), facc[r][0]);
        facc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_permutexvar_ps(idx1, scale[r]), facc[r][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(facc[r][0], facc[r][1])) - corr[r];
}

template <bool kQ6>
void rows_k_impl(const WeightView& w, const VnniActsK& a, float* y, int64_t row_begin, int64_t row_end) {
  for (int64_t row = row_begin; row < row_end; ++row) {
    const uint8_t* wr = static_cast<const uint8_t*>(w.data) + row * static_cast<int64_t>(w.row_stride);
    float out[4];
    int64_t t = 0;
    for (; t + 4 <= a.m; t += 4) {
      if constexpr (kQ6) dot_q6_k<4>(wr, a, t, out); else dot_q4_k<4>(wr, a, t, out);
      for (int r = 0; r < 4; ++r) y[(t + r) * w.rows + row] = out[r];
    }
    for (; t < a.m; ++t) {
      if constexpr (kQ6) dot_q6_k<1>(wr, a, t, out); else dot_q4_k<1>(wr, a, t, out);
      y[t * w.rows + row] = out[0];
    }
  }
}

// Activation quantization, vectorized: it runs once per product, and for SmolLM2's small
// matrices a scalar loop (lrintf per element) cost as much as the product itself.
ESCALA_VNNI_TARGET inline float absmax(__m512 a) { return _mm512_reduce_max_ps(_mm512_abs_ps(a)); }

ESCALA_VNNI_TARGET void quantize_acts_impl(const float* x, int64_t m, int64_t k, VnniActs& a) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < a.nb; ++b) {
      const __m512 x0 = _mm512_loadu_ps(x + r * k + 32 * b);
      const __m512 x1 = _mm512_loadu_ps(x + r * k + 32 * b + 16);
      const float amax = std::fmax(absmax(x0), absmax(x1));
      const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
      // Round to nearest even (the MXCSR default), as lrintf would.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
      const int64_t at = ((r / VnniActs::kGroup) * a.nb + b) * VnniActs::kGroup + r % VnniActs::kGroup;
      int8_t* q = a.q.data() + at * 32;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(q1));
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      a.d[static_cast<size_t>(at)] = d;
      a.s[static_cast<size_t>(at)] = d * static_cast<float>(sum);
    }
  }
}

ESCALA_VNNI_TARGET void quantize_acts_k_impl(const float* x, int64_t m, int64_t k, VnniActsK& a) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < a.nsb; ++b) {
      const float* xb = x + r * k + 256 * b;
      int8_t* q = a.q.data() + r * k + 256 * b;
      __m512 mx = _mm512_setzero_ps();
      for (int g = 0; g < 16; ++g) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(xb + 16 * g)));
      const float d = _mm512_reduce_max_ps(mx) / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
      int32_t* bs = a.bsum.data() + (r * a.nsb + b) * 16;
      for (int g = 0; g < 16; ++g) {
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * g), _mm512_set1_ps(id)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * g), _mm512_cvtepi32_epi8(v));
        bs[g] = _mm512_reduce_add_epi32(v);
      }
      a.d[static_cast<size_t>(r * a.nsb + b)] = d;
    }
  }
}

bool cpu_has_vnni() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma");  // F16C: implied
}

}  // namespace

bool vnni_active() {
  static const bool supported = cpu_has_vnni();
  return supported && g_vnni_enabled.load(std::memory_order_relaxed);
}

void vnni_rows(const WeightView& w, const StoredWeight* st, const VnniActs& a, float* y, int64_t row_begin,
               int64_t row_end) {
  switch (w.type) {
    case TensorType::kQ4_0: return rows_impl<Kind::kQ4_0>(w, st, a, y, row_begin, row_end);
    case TensorType::kQ4_1: return rows_impl<Kind::kQ4_1>(w, st, a, y, row_begin, row_end);
    case TensorType::kQ8_0: return rows_impl<Kind::kQ8_0>(w, st, a, y, row_begin, row_end);
    default: return;
  }
}

namespace {
std::shared_mutex g_stored_mu;
std::unordered_map<const void*, std::shared_ptr<const StoredWeight>> g_stored;
std::atomic<int> g_stored_count{0};
}  // namespace

StoredWeight::~StoredWeight() { std::free(data); }

std::shared_ptr<const StoredWeight> find_stored(const WeightView& w) {
  if (g_stored_count.load(std::memory_order_acquire) == 0) return nullptr;
  std::shared_lock lock(g_stored_mu);
  auto it = g_stored.find(w.data);
  if (it == g_stored.end()) return nullptr;
  const StoredWeight& s = *it->second;
  const uint64_t stride = w.row_stride ? w.row_stride : row_bytes(w.type, w.cols).value_or(0);
  if (s.type != w.type || s.rows != w.rows || s.cols != w.cols || s.row_stride != stride) return nullptr;
  return it->second;
}

bool store_weight(const WeightView& w_in) {
  if (!vnni_active() || !(w_in.type == TensorType::kQ4_0 || w_in.type == TensorType::kQ4_1 ||
                          w_in.type == TensorType::kQ8_0))
    return false;
  WeightView w = w_in;
  auto rb = row_bytes(w.type, w.cols);
  if (!w.data || w.rows <= 0 || !rb) return false;
  if (w.row_stride == 0) w.row_stride = *rb;
  {
    std::shared_lock lock(g_stored_mu);
    if (g_stored.count(w.data)) return false;
  }
  const int64_t nb = w.cols / 32, nslabs = (w.rows + kSlab - 1) / kSlab;
  const int64_t block = w.type == TensorType::kQ8_0 ? kStoredBlock<Kind::kQ8_0> : kStoredBlock<Kind::kQ4_1>;
  const size_t bytes = static_cast<size_t>(nslabs * nb * block);
  auto st = std::make_shared<StoredWeight>();
  st->type = w.type;
  st->rows = w.rows;
  st->cols = w.cols;
  st->row_stride = w.row_stride;
  st->bytes = bytes;
  st->data = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (!st->data) return false;
  std::memset(st->data, 0, bytes);
  switch (w.type) {
    case TensorType::kQ4_0: store_weight<Kind::kQ4_0>(w, st->data); break;
    case TensorType::kQ4_1: store_weight<Kind::kQ4_1>(w, st->data); break;
    default: store_weight<Kind::kQ8_0>(w, st->data); break;
  }
  std::unique_lock lock(g_stored_mu);
  if (!g_stored.emplace(w.data, std::move(st)).second) return false;
  g_stored_count.fetch_add(1, std::memory_order_release);
  return true;
}

void release_stored(const void* data) {
  std::unique_lock lock(g_stored_mu);
  if (g_stored.erase(data)) g_stored_count.fetch_sub(1, std::memory_order_release);
}

void quantize_acts_vnni(const float* x, int64_t m, int64_t k, VnniActs& a) {
  a.m = m;
  a.nb = k / 32;
  const int64_t slots = (m + VnniActs::kGroup - 1) / VnniActs::kGroup * VnniActs::kGroup * a.nb;
  a.q.resize(static_cast<size_t>(slots * 32));
  a.d.resize(static_cast<size_t>(slots));
  a.s.resize(static_cast<size_t>(slots));
  quantize_acts_impl(x, m, k, a);
}

void quantize_acts_vnni_k(const float* x, int64_t m, int64_t k, VnniActsK& a) {
  a.m = m;
  a.nsb = k / 256;
  a.q.resize(static_cast<size_t>(m * k));
  a.d.resize(static_cast<size_t>(m * a.nsb));
  a.bsum.resize(static_cast<size_t>(m * a.nsb * 16));
  quantize_acts_k_impl(x, m, k, a);
}

void vnni_rows_k(const WeightView& w, const VnniActsK& a, float* y, int64_t row_begin,
                 int64_t row_end) {
  if (w.type == TensorType::kQ6_K) return rows_k_impl<true>(w, a, y, row_begin, row_end);
  return rows_k_impl<false>(w, a, y, row_begin, row_end);
}

#else  // not x86-64: the portable kernels serve every type

bool vnni_active() { return false; }
void quantize_acts_vnni(const float*, int64_t, int64_t, VnniActs&) {}
void quantize_acts_vnni_k(const float*, int64_t, int64_t, VnniActsK&) {}
void vnni_rows(const WeightView&, const StoredWeight*, const VnniActs&, float*, int64_t, int64_t) {}
StoredWeight::~StoredWeight() = default;
std::shared_ptr<const StoredWeight> find_stored(const WeightView&) { return nullptr; }
bool store_weight(const WeightView&) { return false; }
void release_stored(const void*) {}
void vnni_rows_k(const WeightView&, const VnniActsK&, float*, int64_t, int64_t) {}

#endif

}  // namespace escala::model
