// Quantized matrix-vector / matrix-matrix products (y = W x), SIMD through Highway with runtime
// dispatch, multithreaded with OpenMP over output rows.
//
// As in llama.cpp, the activations are quantized on the fly to 8 bits (per 32 elements for the
// 32-element weight formats, per 256 for the K-quants) so the inner loops are integer dot
// products; each block's integer sum is scaled once by (weight scale x activation scale). The
// activation levels are stored widened to int16 so a 16-bit multiply-add (pmaddwd on x86)
// serves every format without unsigned/signed tricks.
#include <cmath>
#include <cstddef>
#include <cstring>

#include "common/numeric.h"
#include "model/quant_blocks.h"
#include "model/quant_matmul_internal.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/quant_matmul.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "common/f16-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace escala::model {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Up to 16 int16 lanes per step: one 32-element block is 1 (AVX2/AVX-512) or 2 (SSE4) steps.
using D16 = hn::CappedTag<int16_t, 16>;
using D32 = hn::Repartition<int32_t, D16>;
using DF = hn::Repartition<float, D16>;
using DU8 = hn::Rebind<uint8_t, D16>;
using DI8 = hn::Rebind<int8_t, D16>;
using DU16 = hn::Rebind<uint16_t, D16>;
using V16 = hn::Vec<D16>;
using V32 = hn::Vec<D32>;
using VF = hn::Vec<DF>;

// Block fields are read with memcpy: GGUF data may be aligned to as little as 1 byte.
HWY_INLINE uint16_t load16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

HWY_INLINE float half(uint16_t h) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(h);  // F16C is part of Highway's AVX2 and AVX-512 targets
#else
  return f16_to_f32(h);
#endif
}

// 16 (or fewer) unsigned bytes widened to int16 lanes.
HWY_INLINE V16 load_u8(const uint8_t* p) {
  return hn::BitCast(D16(), hn::PromoteTo(DU16(), hn::LoadU(DU8(), p)));
}

// acc += a . b pairwise (the lane order of the partial sums does not matter: only their total).
HWY_INLINE void mac(V16 a, const int16_t* b, V32& acc0, V32& acc1) {
  acc0 = hn::ReorderWidenMulAccumulate(D32(), a, hn::LoadU(D16(), b), acc0, acc1);
}

HWY_INLINE VF to_float(V32 acc0, V32 acc1) {
  return hn::ConvertTo(DF(), hn::RearrangeToOddPlusEven(acc0, acc1));
}

// ---- one weight row against R activation rows ----

// q4_0 and q4_1: value = d * nibble + m (q4_0: m = -8 d). The m term needs only the activation
// block sums, so the integer loop sees the raw nibbles 0..15.
template <int R, bool kHasMin>
HWY_INLINE void dot_q4(const uint8_t* row, int64_t nb, const QuantizedActs& a, int64_t r0,
                       float* out) {
  const D16 d16;
  const size_t n = hn::Lanes(d16);
  const V16 mask = hn::Set(d16, 15);
  VF facc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) {
    facc[r] = hn::Zero(DF());
    macc[r] = 0;
  }
  const size_t bsize = kHasMin ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * static_cast<int64_t>(bsize);
    uint16_t dh = load16(blk), mh = kHasMin ? load16(blk + 2) : 0;
    const uint8_t* qs = blk + (kHasMin ? 4 : 2);
    V32 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(D32());
    for (size_t j = 0; j < 16; j += n) {
      V16 w = load_u8(qs + j);
      V16 lo = hn::And(w, mask), hi = hn::ShiftRight<4>(w);
      for (int r = 0; r < R; ++r) {
        const int16_t* aq = a.row_q(r0 + r) + 32 * b + j;
        mac(lo, aq, acc0[r], acc1[r]);
        mac(hi, aq + 16, acc0[r], acc1[r]);
      }
    }
    float dw = half(dh);
    float mw = kHasMin ? half(mh) : -8.0f * dw;
    for (int r = 0; r < R; ++r) {
      facc[r] = hn::MulAdd(to_float(acc0[r], acc1[r]), hn::Set(DF(), dw * a.row_d(r0 + r)[b]), facc[r]);
      macc[r] += mw * a.row_s(r0 + r)[b];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hn::GetLane(hn::SumOfLanes(DF(), facc[r])) + macc[r];
}

template <int R>
HWY_INLINE void dot_q8_0(const uint8_t* row, int64_t nb, const QuantizedActs& a, int64_t r0,
                         float* out) {
  const D16 d16;
  const size_t n = hn::Lanes(d16);
  VF facc[R];
  for (int r = 0; r < R; ++r) facc[r] = hn::Zero(DF());
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    const auto* qs = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ8_0, qs));
    V32 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(D32());
    for (size_t j = 0; j < 32; j += n) {
      V16 w = hn::PromoteTo(d16, hn::LoadU(DI8(), qs + j));
      for (int r = 0; r < R; ++r) mac(w, a.row_q(r0 + r) + 32 * b + j, acc0[r], acc1[r]);
    }
    float dw = half(load16(blk + offsetof(BlockQ8_0, d)));
    for (int r = 0; r < R; ++r)
      facc[r] = hn::MulAdd(to_float(acc0[r], acc1[r]), hn::Set(DF(), dw * a.row_d(r0 + r)[b]), facc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hn::GetLane(hn::SumOfLanes(DF(), facc[r]));
}

// q4_K: the 6-bit sub-block scales multiply the nibbles in int16 (15 * 63 fits), so one int32
// accumulator serves the whole super-block; the mins go through the activation block sums.
template <int R>
HWY_INLINE void dot_q4_k(const uint8_t* row, int64_t nb, const QuantizedActs& a, int64_t r0,
                         float* out) {
  const D16 d16;
  const size_t n = hn::Lanes(d16);
  const V16 mask = hn::Set(d16, 15);
  VF facc[R];
  float macc[R];
  for (int r = 0; r < R; ++r) {
    facc[r] = hn::Zero(DF());
    macc[r] = 0;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * static_cast<int64_t>(sizeof(BlockQ4_K));
    const uint8_t* scales = blk + offsetof(BlockQ4_K, scales);
    const uint8_t* qs = blk + offsetof(BlockQ4_K, qs);
    V32 acc0[R], acc1[R];
    int32_t msum[R];
    for (int r = 0; r < R; ++r) {
      acc0[r] = acc1[r] = hn::Zero(D32());
      msum[r] = 0;
    }
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      k_scale_min(scales, 2 * c, sc0, m0);
      k_scale_min(scales, 2 * c + 1, sc1, m1);
      const V16 s0 = hn::Set(d16, static_cast<int16_t>(sc0));
      const V16 s1 = hn::Set(d16, static_cast<int16_t>(sc1));
      for (size_t j = 0; j < 32; j += n) {
        V16 w = load_u8(qs + 32 * c + j);
        V16 lo = hn::Mul(hn::And(w, mask), s0), hi = hn::Mul(hn::ShiftRight<4>(w), s1);
        for (int r = 0; r < R; ++r) {
          const int16_t* aq = a.row_q(r0 + r) + 256 * b + 64 * c + j;
          mac(lo, aq, acc0[r], acc1[r]);
          mac(hi, aq + 32, acc0[r], acc1[r]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const int32_t* bs = a.row_bsum(r0 + r) + 8 * b + 2 * c;
        msum[r] += m0 * bs[0] + m1 * bs[1];
      }
    }
    float dw = half(load16(blk + offsetof(BlockQ4_K, d)));
    float dmin = half(load16(blk + offsetof(BlockQ4_K, dmin)));
    for (int r = 0; r < R; ++r) {
      float da = a.row_d(r0 + r)[b];
      facc[r] = hn::MulAdd(to_float(acc0[r], acc1[r]), hn::Set(DF(), dw * da), facc[r]);
      macc[r] += dmin * da * static_cast<float>(msum[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hn::GetLane(hn::SumOfLanes(DF(), facc[r])) - macc[r];
}

// q6_K: levels (q - 32) times the int8 sub-block scale fit in int16 (32 * 128).
template <int R>
HWY_INLINE void dot_q6_k(const uint8_t* row, int64_t nb, const QuantizedActs& a, int64_t r0,
                         float* out) {
  const D16 d16;
  const size_t n = hn::Lanes(d16);
  const V16 k15 = hn::Set(d16, 15), k3 = hn::Set(d16, 3), k32 = hn::Set(d16, 32);
  VF facc[R];
  for (int r = 0; r < R; ++r) facc[r] = hn::Zero(DF());
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * static_cast<int64_t>(sizeof(BlockQ6_K));
    V32 acc0[R], acc1[R];
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = hn::Zero(D32());
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + offsetof(BlockQ6_K, ql) + 64 * h;
      const uint8_t* qh = blk + offsetof(BlockQ6_K, qh) + 32 * h;
      const auto* sc = reinterpret_cast<const int8_t*>(blk + offsetof(BlockQ6_K, scales)) + 8 * h;
      for (size_t l = 0; l < 32; l += n) {
        V16 la = load_u8(ql + l), lb = load_u8(ql + 32 + l), hb = load_u8(qh + l);
        const int is = static_cast<int>(l / 16);
        V16 q1 = hn::Or(hn::And(la, k15), hn::ShiftLeft<4>(hn::And(hb, k3)));
        V16 q2 = hn::Or(hn::And(lb, k15), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<2>(hb), k3)));
        V16 q3 = hn::Or(hn::ShiftRight<4>(la), hn::ShiftLeft<4>(hn::And(hn::ShiftRight<4>(hb), k3)));
        V16 q4 = hn::Or(hn::ShiftRight<4>(lb), hn::ShiftLeft<4>(hn::ShiftRight<6>(hb)));
        q1 = hn::Mul(hn::Sub(q1, k32), hn::Set(d16, static_cast<int16_t>(sc[is + 0])));
        q2 = hn::Mul(hn::Sub(q2, k32), hn::Set(d16, static_cast<int16_t>(sc[is + 2])));
        q3 = hn::Mul(hn::Sub(q3, k32), hn::Set(d16, static_cast<int16_t>(sc[is + 4])));
        q4 = hn::Mul(hn::Sub(q4, k32), hn::Set(d16, static_cast<int16_t>(sc[is + 6])));
        for (int r = 0; r < R; ++r) {
          const int16_t* aq = a.row_q(r0 + r) + 256 * b + 128 * h + l;
          mac(q1, aq, acc0[r], acc1[r]);
          mac(q2, aq + 32, acc0[r], acc1[r]);
          mac(q3, aq + 64, acc0[r], acc1[r]);
          mac(q4, aq + 96, acc0[r], acc1[r]);
        }
      }
    }
    float dw = half(load16(blk + offsetof(BlockQ6_K, d)));
    for (int r = 0; r < R; ++r)
      facc[r] = hn::MulAdd(to_float(acc0[r], acc1[r]), hn::Set(DF(), dw * a.row_d(r0 + r)[b]), facc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hn::GetLane(hn::SumOfLanes(DF(), facc[r]));
}

// f32 dot over any length (the tail in scalar code).
HWY_INLINE float dot_f32(const float* w, const float* x, int64_t k) {  // w may be unaligned
  const hn::ScalableTag<float> df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * n <= k; i += 2 * n) {
    acc0 = hn::MulAdd(hn::LoadU(df, w + i), hn::LoadU(df, x + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, w + i + n), hn::LoadU(df, x + i + n), acc1);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < k; ++i) {
    float wi;
    std::memcpy(&wi, w + i, 4);
    s += wi * x[i];
  }
  return s;
}

HWY_INLINE float dot_f16(const uint8_t* w, const float* x, int64_t k) {  // w may be unaligned
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  auto acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + n <= k; i += n) {
    auto wv = escala::HWY_NAMESPACE::PromoteF16(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(w + 2 * i)));
    acc = hn::MulAdd(wv, hn::LoadU(df, x + i), acc);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < k; ++i) s += f16_to_f32(load16(w + 2 * i)) * x[i];
  return s;
}

template <template <int> class Kernel>
HWY_INLINE void run_quant_rows(const MatmulArgs& a, int64_t row_begin, int64_t row_end) {
  const int64_t nb = a.w.cols / block_elems(a.w.type);
  for (int64_t row = row_begin; row < row_end; ++row) {
    const uint8_t* wr = static_cast<const uint8_t*>(a.w.data) + row * static_cast<int64_t>(a.w.row_stride);
    int64_t t = 0;
    float out[4];
    for (; t + 4 <= a.m; t += 4) {
      Kernel<4>::run(wr, nb, *a.acts, t, out);
      for (int r = 0; r < 4; ++r) a.y[(t + r) * a.w.rows + row] = out[r];
    }
    for (; t < a.m; ++t) {
      Kernel<1>::run(wr, nb, *a.acts, t, out);
      a.y[t * a.w.rows + row] = out[0];
    }
  }
}

template <int R> struct KQ4_0 { static void run(const uint8_t* w, int64_t nb, const QuantizedActs& a, int64_t t, float* o) { dot_q4<R, false>(w, nb, a, t, o); } };
template <int R> struct KQ4_1 { static void run(const uint8_t* w, int64_t nb, const QuantizedActs& a, int64_t t, float* o) { dot_q4<R, true>(w, nb, a, t, o); } };
template <int R> struct KQ8_0 { static void run(const uint8_t* w, int64_t nb, const QuantizedActs& a, int64_t t, float* o) { dot_q8_0<R>(w, nb, a, t, o); } };
template <int R> struct KQ4_K { static void run(const uint8_t* w, int64_t nb, const QuantizedActs& a, int64_t t, float* o) { dot_q4_k<R>(w, nb, a, t, o); } };
template <int R> struct KQ6_K { static void run(const uint8_t* w, int64_t nb, const QuantizedActs& a, int64_t t, float* o) { dot_q6_k<R>(w, nb, a, t, o); } };

// Rows [row_begin, row_end) of y for every activation row. `scratch` holds cols floats (the
// fallback's dequantized row).
void MatmulRows(const MatmulArgs& a, int64_t row_begin, int64_t row_end, float* scratch) {
  const int64_t k = a.w.cols;
  switch (a.w.type) {
    case TensorType::kQ4_0: return run_quant_rows<KQ4_0>(a, row_begin, row_end);
    case TensorType::kQ4_1: return run_quant_rows<KQ4_1>(a, row_begin, row_end);
    case TensorType::kQ8_0: return run_quant_rows<KQ8_0>(a, row_begin, row_end);
    case TensorType::kQ4_K: return run_quant_rows<KQ4_K>(a, row_begin, row_end);
    case TensorType::kQ6_K: return run_quant_rows<KQ6_K>(a, row_begin, row_end);
    default: break;
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    const uint8_t* wr = static_cast<const uint8_t*>(a.w.data) + row * static_cast<int64_t>(a.w.row_stride);
    for (int64_t t = 0; t < a.m; ++t) {
      const float* x = a.x + t * k;
      float v;
      if (a.w.type == TensorType::kF32) {
        v = dot_f32(reinterpret_cast<const float*>(wr), x, k);
      } else if (a.w.type == TensorType::kF16) {
        v = dot_f16(wr, x, k);
      } else {
        if (t == 0) dequantize_row(a.w.type, wr, scratch, k);
        v = dot_f32(scratch, x, k);
      }
      a.y[t * a.w.rows + row] = v;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace escala::model
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

namespace escala::model {

HWY_EXPORT(MatmulRows);

namespace {

// Activation quantization: symmetric, amax / 127 per `block` elements.
void quantize_acts(const float* x, int64_t m, int64_t k, int64_t block, QuantizedActs& a) {
  a.m = m;
  a.k = k;
  a.block = block;
  a.q.resize(static_cast<size_t>(m * k));
  a.d.resize(static_cast<size_t>(m * (k / block)));
  a.s.resize(block == 32 ? static_cast<size_t>(m * (k / 32)) : 0);
  a.bsum.resize(block == 256 ? static_cast<size_t>(m * (k / 32)) : 0);
  for (int64_t r = 0; r < m; ++r) {
    const float* xr = x + r * k;
    int16_t* q = a.q.data() + r * k;
    for (int64_t b = 0; b < k / block; ++b) {
      float amax = 0;
      for (int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(xr[b * block + j]));
      float d = amax / 127.0f;
      float id = d > 0 ? 1.0f / d : 0.0f;
      a.d[static_cast<size_t>(r * (k / block) + b)] = d;
      // Round half away from zero: vectorizes, unlike lrintf (any round-to-nearest meets the
      // error bound).
      for (int64_t j = 0; j < block; ++j) {
        float v = xr[b * block + j] * id;
        q[b * block + j] = static_cast<int16_t>(v + (v >= 0 ? 0.5f : -0.5f));
      }
    }
    for (int64_t b = 0; b < k / 32; ++b) {
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) sum += q[b * 32 + j];
      size_t idx = static_cast<size_t>(r * (k / 32) + b);
      if (block == 32) {
        a.s[idx] = a.d[idx] * static_cast<float>(sum);
      } else {
        a.bsum[idx] = sum;
      }
    }
  }
}

// Diagnostic: ESCALA_F32_ACTIVATIONS=1 keeps the activations in f32 (dequantized weight rows,
// double accumulation), to tell the error of the 8-bit activations from any other (slow).
bool f32_activations() {
  static const bool on = [] {
    const char* e = std::getenv("ESCALA_F32_ACTIVATIONS");
    return e && *e && *e != '0';
  }();
  return on;
}

Status check(const WeightView& w) {
  auto rb = row_bytes(w.type, w.cols);
  if (!w.data || w.rows <= 0 || !rb)
    return Status::error(fmt::format("matmul: bad weight view ({} x {} of {})", w.rows, w.cols,
                                     tensor_type_name(w.type)));
  if (w.row_stride != 0 && w.row_stride < *rb)
    return Status::error(fmt::format("matmul: row stride {} is smaller than a row ({} bytes)",
                                     w.row_stride, *rb));
  return {};
}

}  // namespace

bool has_fast_kernel(TensorType t) {
  switch (t) {
    case TensorType::kQ4_0:
    case TensorType::kQ4_1:
    case TensorType::kQ8_0:
    case TensorType::kQ4_K:
    case TensorType::kQ6_K:
    case TensorType::kF32:
    case TensorType::kF16: return true;
    default: return false;
  }
}

Status matmul(const WeightView& w_in, const float* x, int64_t m, float* y, int threads) {
  ESCALA_RETURN_IF_ERROR(check(w_in));
  if (m <= 0) return {};
  if (!x || !y) return Status::error("matmul: null activation or output pointer");
  MatmulArgs args;
  args.w = w_in;
  if (args.w.row_stride == 0) args.w.row_stride = *row_bytes(w_in.type, w_in.cols);
  args.x = x;
  args.m = m;
  args.y = y;
  const int64_t rows = w_in.rows;
  // Waking a thread costs microseconds: small products (SmolLM2's 192 x 576 k/v projection)
  // run faster on fewer threads, so each thread gets at least kMinWork multiply-adds.
  constexpr int64_t kMinWork = 1 << 16;
  const int64_t work = rows * w_in.cols * m;
  const int nthreads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(threads > 0 ? threads : omp_get_max_threads(), work / kMinWork)));
  // Chunks of rows small enough to balance, large enough to amortize the dispatch.
  // Multiples of 16 rows: the VNNI kernels work on slabs of 16 weight rows.
  const int64_t chunk = (std::min<int64_t>(64, rows / (4 * nthreads) + 1) + 15) / 16 * 16;
  const int64_t nchunks = (rows + chunk - 1) / chunk;

  if (f32_activations() && is_quantized(w_in.type)) {
#pragma omp parallel num_threads(nthreads) if (nchunks > 1 && nthreads > 1)
    {
      std::vector<float> scratch(static_cast<size_t>(w_in.cols));
#pragma omp for schedule(dynamic, 1)
      for (int64_t c = 0; c < nchunks; ++c) {
        const int64_t r0 = c * chunk, r1 = std::min(rows, r0 + chunk);
        for (int64_t row = r0; row < r1; ++row) {
          dequantize_row(w_in.type, static_cast<const uint8_t*>(args.w.data) + row * int64_t(args.w.row_stride),
                         scratch.data(), w_in.cols);
          for (int64_t t = 0; t < m; ++t) {
            double acc = 0;
            for (int64_t i = 0; i < w_in.cols; ++i) acc += double(scratch[size_t(i)]) * x[t * w_in.cols + i];
            y[t * rows + row] = float(acc);
          }
        }
      }
    }
    return {};
  }

  const bool k_quant = w_in.type == TensorType::kQ4_K || w_in.type == TensorType::kQ6_K;
  if (k_quant && vnni_active()) {
    thread_local VnniActsK vk_storage;
    const VnniActsK* vk = &vk_storage;
    quantize_acts_vnni_k(x, m, w_in.cols, vk_storage);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nchunks > 1 && nthreads > 1)
    for (int64_t c = 0; c < nchunks; ++c)
      vnni_rows_k(args.w, *vk, y, c * chunk, std::min(rows, (c + 1) * chunk));
    return {};
  }
  if (vnni_handles(w_in.type) && vnni_active()) {
    // Reused across calls (decode runs this for every weight of every token). The workers
    // must see this thread's instance, hence the pointer.
    thread_local VnniActs va_storage;
    const VnniActs* va = &va_storage;
    quantize_acts_vnni(x, m, w_in.cols, va_storage);
    const std::shared_ptr<const StoredWeight> st = find_stored(w_in);
    const StoredWeight* stp = st.get();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nchunks > 1 && nthreads > 1)
    for (int64_t c = 0; c < nchunks; ++c)
      vnni_rows(args.w, stp, *va, y, c * chunk, std::min(rows, (c + 1) * chunk));
    return {};
  }

  // Thread-local scratch would do too; one allocation per call is cheap next to the product.
  thread_local QuantizedActs acts;  // reused; the workers reach it through args.acts
  bool quantized = has_fast_kernel(w_in.type) && is_quantized(w_in.type);
  if (quantized) {
    quantize_acts(x, m, w_in.cols, block_elems(w_in.type) == 256 ? 256 : 32, acts);
    args.acts = &acts;
  }
  const bool fallback = !has_fast_kernel(w_in.type);
#pragma omp parallel num_threads(nthreads) if (nchunks > 1 && nthreads > 1)
  {
    std::vector<float> scratch(fallback ? static_cast<size_t>(w_in.cols) : 0);
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      int64_t r0 = c * chunk, r1 = std::min(rows, r0 + chunk);
      HWY_DYNAMIC_DISPATCH(MatmulRows)(args, r0, r1, scratch.data());
    }
  }
  return {};
}

Status matvec(const WeightView& w, const float* x, float* y, int threads) {
  return matmul(w, x, 1, y, threads);
}

Status matmul_group(std::span<const WeightView> ws, const float* x, int64_t m, std::span<float* const> ys,
                    int threads) {
  if (ws.size() != ys.size()) return Status::error("matmul_group: one output per weight");
  if (ws.empty() || m <= 0) return {};
  bool same = true;
  for (const WeightView& w : ws) {
    ESCALA_RETURN_IF_ERROR(check(w));
    same = same && w.type == ws[0].type && w.cols == ws[0].cols;
  }
  const TensorType type = ws[0].type;
  const bool k_quant = type == TensorType::kQ4_K || type == TensorType::kQ6_K;
  if (!same || !vnni_handles(type) || !vnni_active() || f32_activations()) {
    for (size_t i = 0; i < ws.size(); ++i) ESCALA_RETURN_IF_ERROR(matmul(ws[i], x, m, ys[i], threads));
    return {};
  }
  if (!x) return Status::error("matmul: null activation or output pointer");
  for (float* y : ys)
    if (!y) return Status::error("matmul: null activation or output pointer");
  const int64_t cols = ws[0].cols;
  int64_t rows_total = 0;
  for (const WeightView& w : ws) rows_total += w.rows;
  constexpr int64_t kMinWork = 1 << 16;  // as in matmul()
  const int nthreads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(threads > 0 ? threads : omp_get_max_threads(), rows_total * cols * m / kMinWork)));
  const int64_t chunk = (std::min<int64_t>(64, rows_total / (4 * nthreads) + 1) + 15) / 16 * 16;  // as in matmul()
  // Chunks of every weight, in one list: (weight, first row).
  thread_local std::vector<std::pair<int32_t, int64_t>> chunks;
  thread_local std::vector<WeightView> views;
  chunks.clear();
  views.assign(ws.begin(), ws.end());
  for (size_t i = 0; i < views.size(); ++i) {
    if (views[i].row_stride == 0) views[i].row_stride = *row_bytes(type, cols);
    for (int64_t r = 0; r < views[i].rows; r += chunk) chunks.emplace_back(int32_t(i), r);
  }
  const int64_t nchunks = int64_t(chunks.size());
  const auto* ch = &chunks;
  const auto* vw = &views;
  if (k_quant) {
    thread_local VnniActsK vk_storage;
    const VnniActsK* vk = &vk_storage;
    quantize_acts_vnni_k(x, m, cols, vk_storage);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nchunks > 1 && nthreads > 1)
    for (int64_t c = 0; c < nchunks; ++c) {
      const auto [i, r0] = (*ch)[size_t(c)];
      const WeightView& w = (*vw)[size_t(i)];
      vnni_rows_k(w, *vk, ys[size_t(i)], r0, std::min(w.rows, r0 + chunk));
    }
    return {};
  }
  thread_local VnniActs va_storage;
  const VnniActs* va = &va_storage;
  quantize_acts_vnni(x, m, cols, va_storage);
  thread_local std::vector<std::shared_ptr<const StoredWeight>> stored;
  stored.clear();
  for (const WeightView& w : views) stored.push_back(find_stored(w));
  const auto* sw = &stored;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nchunks > 1 && nthreads > 1)
  for (int64_t c = 0; c < nchunks; ++c) {
    const auto [i, r0] = (*ch)[size_t(c)];
    const WeightView& w = (*vw)[size_t(i)];
    vnni_rows(w, (*sw)[size_t(i)].get(), *va, ys[size_t(i)], r0, std::min(w.rows, r0 + chunk));
  }
  return {};
}

StoredWeights::~StoredWeights() {
  for (const void* k : keys_) release_stored(k);
}

bool StoredWeights::add(const WeightView& w) {
  if (!store_weight(w)) return false;
  keys_.push_back(w.data);
  if (auto st = find_stored(w)) bytes_ += st->bytes;
  return true;
}

void matmul_reference(const WeightView& w_in, const float* x, int64_t m, float* y) {
  uint64_t stride = w_in.row_stride ? w_in.row_stride : row_bytes(w_in.type, w_in.cols).value_or(0);
  std::vector<float> row(static_cast<size_t>(w_in.cols));
  for (int64_t r = 0; r < w_in.rows; ++r) {
    dequantize_row(w_in.type, static_cast<const uint8_t*>(w_in.data) + r * static_cast<int64_t>(stride),
                   row.data(), w_in.cols);
    for (int64_t t = 0; t < m; ++t) {
      double s = 0;
      for (int64_t c = 0; c < w_in.cols; ++c) s += static_cast<double>(row[c]) * x[t * w_in.cols + c];
      y[t * w_in.rows + r] = static_cast<float>(s);
    }
  }
}

}  // namespace escala::model
#endif  // HWY_ONCE
