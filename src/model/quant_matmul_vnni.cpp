// AVX-512 VNNI kernels for the 32-element formats q4_0, q4_1 and q8_0, chosen at run time
// (cpuid) ahead of the portable Highway kernels in quant_matmul.cpp.
//
// Highway 1.0.3 has no 8-bit dot product and gates its AVX3_DL target behind a macro that would
// change the dispatch tables of every Highway user in the binary, so this one file uses
// intrinsics under a function-level target attribute instead.
//
// All three formats are handled as "unsigned bytes u times int8 activations": q4 nibbles are
// 0..15 already, q8_0 levels are shifted by +128. With the activation block sums s = d_a * sum(a),
//   y += d_w * d_a * dot(u, a) + m_w * s,   m_w = m (q4_1), -8 d_w (q4_0), -128 d_w (q8_0).
// vpdpbusd does 64 u8 x s8 products per instruction: one pair of blocks. The per-block float
// scales of 16 blocks are built at once (a gather of the f16 fields), then spread to the lanes
// of each pair with a permute.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>

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

// The 64 unsigned weight bytes of blocks b0 and b0+1 (zeros when the second is absent), in the
// activation layout [b0 0-15, b1 0-15, b0 16-31, b1 16-31].
template <Kind K>
ESCALA_VNNI_TARGET inline __m512i load_pair(const uint8_t* b0, bool has_b1) {
  if constexpr (K == Kind::kQ8_0) {
    __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2));
    __m256i w1 = has_b1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 34 + 2))
                        : _mm256_setzero_si256();
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
    w = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), w);
    return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kQsOffset<K>));
    __m128i q1 = has_b1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + kBytes<K> + kQsOffset<K>))
                        : _mm_setzero_si128();
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(v, mask);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
}

// Weight scale and offset of `count` (<= 16) blocks starting at `blk`.
template <Kind K>
ESCALA_VNNI_TARGET inline void block_scales(const uint8_t* blk, int count, __m512& dw, __m512& mw) {
  // Lanes past `count` are masked off (not read) and stay zero.
  const __m512i idx = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(static_cast<int>(kBytes<K>)));
  const __mmask16 live = static_cast<__mmask16>((1u << count) - 1u);
  const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, idx, blk, 1);
  dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
  if constexpr (K == Kind::kQ4_1) {
    mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
  } else {
    mw = _mm512_mul_ps(dw, _mm512_set1_ps(K == Kind::kQ4_0 ? -8.0f : -128.0f));
  }
}

template <Kind K, int R>
ESCALA_VNNI_TARGET void dot_rows(const uint8_t* row, const VnniActs& a, int64_t t0, float* out) {
  // Two float accumulators per row (even and odd pairs) so consecutive FMAs do not wait on
  // each other's latency.
  __m512 facc[R][2], macc[R];
  for (int r = 0; r < R; ++r) facc[r][0] = facc[r][1] = macc[r] = _mm512_setzero_ps();
  // Lane l of a pair's products belongs to block 2p + ((l / 4) & 1).
  const __m512i pattern = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
  for (int64_t g = 0; g < a.nb; g += 16) {
    const int count = static_cast<int>(std::min<int64_t>(16, a.nb - g));
    const uint8_t* blk = row + g * kBytes<K>;
    __m512 dw, mw;
    block_scales<K>(blk, count, dw, mw);
    __m512 scale[R];
    for (int r = 0; r < R; ++r) {
      const int64_t at = (t0 + r) * a.nb_pad + g;
      scale[r] = _mm512_mul_ps(dw, _mm512_loadu_ps(a.d.data() + at));
      macc[r] = _mm512_fmadd_ps(mw, _mm512_loadu_ps(a.s.data() + at), macc[r]);
    }
    for (int p = 0; 2 * p < count; ++p) {
      const __m512i w = load_pair<K>(blk + 2 * p * kBytes<K>, 2 * p + 1 < count);
      const __m512i idx = _mm512_add_epi32(pattern, _mm512_set1_epi32(2 * p));
      for (int r = 0; r < R; ++r) {
        const int8_t* aq = a.q.data() + ((t0 + r) * a.nb_pad + g) * 32 + 64 * p;
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(aq));
        facc[r][p & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, scale[r]),
                                         facc[r][p & 1]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    out[r] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(facc[r][0], facc[r][1]), macc[r]));
}

// NR weight rows against one activation row (decode): the rows' loads and scale gathers are
// independent, so NR streams are in flight at once and the FMA chains interleave; the activation
// pair is loaded once for all NR rows.
template <Kind K, int NR>
ESCALA_VNNI_TARGET void dot_wrows(const uint8_t* row0, int64_t stride, const VnniActs& a, int64_t t, float* out) {
  // Accumulated exactly as dot_rows does (even/odd pairs, offsets last), so that a decode step
  // gives bit for bit what the same token gives inside a batch.
  __m512 facc[NR][2], macc[NR];
  for (int n = 0; n < NR; ++n) facc[n][0] = facc[n][1] = macc[n] = _mm512_setzero_ps();
  const __m512i pattern = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
  for (int64_t g = 0; g < a.nb; g += 16) {
    const int count = static_cast<int>(std::min<int64_t>(16, a.nb - g));
    const int64_t at = t * a.nb_pad + g;
    const __m512 ad = _mm512_loadu_ps(a.d.data() + at), as = _mm512_loadu_ps(a.s.data() + at);
    __m512 scale[NR];
    for (int n = 0; n < NR; ++n) {
      __m512 dw, mw;
      block_scales<K>(row0 + n * stride + g * kBytes<K>, count, dw, mw);
      scale[n] = _mm512_mul_ps(dw, ad);
      macc[n] = _mm512_fmadd_ps(mw, as, macc[n]);
    }
    const int8_t* aq = a.q.data() + at * 32;
    for (int p = 0; 2 * p < count; ++p) {
      const __m512i av = _mm512_loadu_si512(aq + 64 * p);
      const __m512i idx = _mm512_add_epi32(pattern, _mm512_set1_epi32(2 * p));
      for (int n = 0; n < NR; ++n) {
        const __m512i w = load_pair<K>(row0 + n * stride + (g + 2 * p) * kBytes<K>, 2 * p + 1 < count);
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, av);
        facc[n][p & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(idx, scale[n]),
                                         facc[n][p & 1]);
      }
    }
  }
  for (int n = 0; n < NR; ++n)
    out[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(facc[n][0], facc[n][1]), macc[n]));
}

template <Kind K>
void rows_impl(const WeightView& w, const VnniActs& a, float* y, int64_t row_begin, int64_t row_end) {
  if (a.m < 4) {  // decode and short appends: several weight rows per activation row
    const int64_t stride = static_cast<int64_t>(w.row_stride);
    int64_t row = row_begin;
    float out[4];
    for (; row + 4 <= row_end; row += 4) {
      const uint8_t* wr = static_cast<const uint8_t*>(w.data) + row * stride;
      for (int64_t t = 0; t < a.m; ++t) {
        dot_wrows<K, 4>(wr, stride, a, t, out);
        for (int n = 0; n < 4; ++n) y[t * w.rows + row + n] = out[n];
      }
    }
    for (; row < row_end; ++row) {
      const uint8_t* wr = static_cast<const uint8_t*>(w.data) + row * stride;
      for (int64_t t = 0; t < a.m; ++t) {
        dot_wrows<K, 1>(wr, stride, a, t, out);
        y[t * w.rows + row] = out[0];
      }
    }
    return;
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    const uint8_t* wr = static_cast<const uint8_t*>(w.data) + row * static_cast<int64_t>(w.row_stride);
    float out[4];
    int64_t t = 0;
    for (; t + 4 <= a.m; t += 4) {
      dot_rows<K, 4>(wr, a, t, out);
      for (int r = 0; r < 4; ++r) y[(t + r) * w.rows + row] = out[r];
    }
    for (; t < a.m; ++t) {
      dot_rows<K, 1>(wr, a, t, out);
      y[t * w.rows + row] = out[0];
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
    int8_t* q = a.q.data() + r * a.nb_pad * 32;
    for (int64_t b = 0; b < a.nb; ++b) {
      const __m512 x0 = _mm512_loadu_ps(x + r * k + 32 * b);
      const __m512 x1 = _mm512_loadu_ps(x + r * k + 32 * b + 16);
      const float amax = std::fmax(absmax(x0), absmax(x1));
      const float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
      // Round to nearest even (the MXCSR default), as lrintf would.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
      // Pair p = b / 2, half h = b % 2: elements 0-15 at 64p + 16h, 16-31 at 64p + 32 + 16h.
      int8_t* base = q + 64 * (b / 2) + 16 * (b % 2);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(base), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(base + 32), _mm512_cvtepi32_epi8(q1));
      const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      a.d[static_cast<size_t>(r * a.nb_pad + b)] = d;
      a.s[static_cast<size_t>(r * a.nb_pad + b)] = d * static_cast<float>(sum);
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

void vnni_rows(const WeightView& w, const VnniActs& a, float* y, int64_t row_begin,
               int64_t row_end) {
  switch (w.type) {
    case TensorType::kQ4_0: return rows_impl<Kind::kQ4_0>(w, a, y, row_begin, row_end);
    case TensorType::kQ4_1: return rows_impl<Kind::kQ4_1>(w, a, y, row_begin, row_end);
    case TensorType::kQ8_0: return rows_impl<Kind::kQ8_0>(w, a, y, row_begin, row_end);
    default: return;
  }
}

void quantize_acts_vnni(const float* x, int64_t m, int64_t k, VnniActs& a) {
  a.m = m;
  a.nb = k / 32;
  a.nb_pad = (a.nb + 15) / 16 * 16;
  // Only the padding must be zero; the rest is overwritten.
  a.q.assign(static_cast<size_t>(m * a.nb_pad * 32), 0);
  a.d.assign(static_cast<size_t>(m * a.nb_pad), 0.0f);
  a.s.assign(static_cast<size_t>(m * a.nb_pad), 0.0f);
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
void vnni_rows(const WeightView&, const VnniActs&, float*, int64_t, int64_t) {}
void vnni_rows_k(const WeightView&, const VnniActsK&, float*, int64_t, int64_t) {}

#endif

}  // namespace escala::model
