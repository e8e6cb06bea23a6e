// Tensor type traits, dequantizers and quantizers for the ggml block formats (quant_blocks.h).
//
// The quantizers are straightforward (min/max or abs-max per block, scales rounded through f16
// before the values are rounded, so each value is quantized against the scale that is stored);
// the K-quant ones do not search for optimal scales as ggml's do, so their error is somewhat
// larger but bounded (see quant_test.cpp).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "common/numeric.h"
#include "escala/quant.h"
#include "model/quant_blocks.h"

namespace escala::model {
namespace {

struct Traits {
  TensorType type;
  std::string_view name;
  int64_t elems;
  int64_t bytes;
};

constexpr Traits kTraits[] = {
    {TensorType::kF32, "f32", 1, 4},         {TensorType::kF16, "f16", 1, 2},
    {TensorType::kBF16, "bf16", 1, 2},       {TensorType::kQ8_0, "q8_0", 32, 34},
    {TensorType::kQ4_0, "q4_0", 32, 18},     {TensorType::kQ4_1, "q4_1", 32, 20},
    {TensorType::kQ5_0, "q5_0", 32, 22},     {TensorType::kQ5_1, "q5_1", 32, 24},
    {TensorType::kQ4_K, "q4_K", 256, 144},   {TensorType::kQ5_K, "q5_K", 256, 176},
    {TensorType::kQ6_K, "q6_K", 256, 210},
};

const Traits& traits(TensorType t) {
  for (const Traits& tr : kTraits)
    if (tr.type == t) return tr;
  return kTraits[0];  // unreachable for valid enum values
}

float h2f(uint16_t h) { return f16_to_f32(h); }

int nearest(float x) { return static_cast<int>(std::lrintf(x)); }
int clampi(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }

// ---- dequantizers (one block) ----

void dq_q4_0(const BlockQ4_0& b, float* y) {
  float d = h2f(b.d);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((b.qs[j] & 15) - 8);
    y[j + 16] = d * static_cast<float>((b.qs[j] >> 4) - 8);
  }
}
void dq_q4_1(const BlockQ4_1& b, float* y) {
  float d = h2f(b.d), m = h2f(b.m);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(b.qs[j] & 15) + m;
    y[j + 16] = d * static_cast<float>(b.qs[j] >> 4) + m;
  }
}
uint32_t qh32(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return h;
}
void dq_q5_0(const BlockQ5_0& b, float* y) {
  float d = h2f(b.d);
  uint32_t h = qh32(b.qh);
  for (int j = 0; j < 16; ++j) {
    int lo = (b.qs[j] & 15) | static_cast<int>(((h >> j) & 1) << 4);
    int hi = (b.qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + 16] = d * static_cast<float>(hi - 16);
  }
}
void dq_q5_1(const BlockQ5_1& b, float* y) {
  float d = h2f(b.d), m = h2f(b.m);
  uint32_t h = qh32(b.qh);
  for (int j = 0; j < 16; ++j) {
    int lo = (b.qs[j] & 15) | static_cast<int>(((h >> j) & 1) << 4);
    int hi = (b.qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + 16] = d * static_cast<float>(hi) + m;
  }
}
void dq_q8_0(const BlockQ8_0& b, float* y) {
  float d = h2f(b.d);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(b.qs[j]);
}
void dq_q4_k(const BlockQ4_K& b, float* y) {
  float d = h2f(b.d), dmin = h2f(b.dmin);
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    k_scale_min(b.scales, 2 * c, sc0, m0);
    k_scale_min(b.scales, 2 * c + 1, sc1, m1);
    const uint8_t* q = b.qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d * static_cast<float>(sc0 * (q[l] & 15)) - dmin * static_cast<float>(m0);
      y[64 * c + 32 + l] = d * static_cast<float>(sc1 * (q[l] >> 4)) - dmin * static_cast<float>(m1);
    }
  }
}
void dq_q5_k(const BlockQ5_K& b, float* y) {
  float d = h2f(b.d), dmin = h2f(b.dmin);
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    k_scale_min(b.scales, 2 * c, sc0, m0);
    k_scale_min(b.scales, 2 * c + 1, sc1, m1);
    const uint8_t* q = b.qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      int lo = (q[l] & 15) | (((b.qh[l] >> (2 * c)) & 1) << 4);
      int hi = (q[l] >> 4) | (((b.qh[l] >> (2 * c + 1)) & 1) << 4);
      y[64 * c + l] = d * static_cast<float>(sc0 * lo) - dmin * static_cast<float>(m0);
      y[64 * c + 32 + l] = d * static_cast<float>(sc1 * hi) - dmin * static_cast<float>(m1);
    }
  }
}
// Each 128-element half h takes ql[64h..64h+63] and qh[32h..32h+31]: for l < 32, element l is
// ql[l] low nibble + qh[l] bits 0-1, l+32 is ql[l+32] low + bits 2-3, l+64 is ql[l] high + bits
// 4-5, l+96 is ql[l+32] high + bits 6-7. Sub-block (16 elements) k uses scales[k].
int q6_value(const BlockQ6_K& b, int e) {
  int h = e / 128, r = e % 128, group = r / 32, l = r % 32;
  uint8_t ql = b.ql[64 * h + l + (group & 1) * 32];
  int lo = (group < 2) ? (ql & 15) : (ql >> 4);
  int hi = (b.qh[32 * h + l] >> (2 * group)) & 3;
  return (lo | (hi << 4)) - 32;
}
void dq_q6_k(const BlockQ6_K& b, float* y) {
  float d = h2f(b.d);
  for (int e = 0; e < 256; ++e)
    y[e] = d * static_cast<float>(b.scales[e / 16] * q6_value(b, e));
}

// ---- quantizers (one block) ----

// The element of largest magnitude, with its sign.
float signed_absmax(const float* x, int n) {
  float best = 0, amax = 0;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      best = x[j];
    }
  }
  return best;
}
void min_max(const float* x, int n, float& mn, float& mx) {
  mn = x[0];
  mx = x[0];
  for (int j = 1; j < n; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
}
float inv(float d) { return d != 0 ? 1.0f / d : 0.0f; }

void q_q8_0(const float* x, BlockQ8_0& b) {
  float amax = std::fabs(signed_absmax(x, 32));
  b.d = f32_to_f16(amax / 127.0f);
  float id = inv(h2f(b.d));
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(clampi(nearest(x[j] * id), -127, 127));
}
// Symmetric 4/5-bit: the extreme value maps to the most negative level (-8 / -16), so the
// full range of levels is used on that side.
void q_q4_0(const float* x, BlockQ4_0& b) {
  b.d = f32_to_f16(signed_absmax(x, 32) / -8.0f);
  float id = inv(h2f(b.d));
  for (int j = 0; j < 16; ++j) {
    int lo = clampi(nearest(x[j] * id) + 8, 0, 15);
    int hi = clampi(nearest(x[j + 16] * id) + 8, 0, 15);
    b.qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}
void q_q5_0(const float* x, BlockQ5_0& b) {
  b.d = f32_to_f16(signed_absmax(x, 32) / -16.0f);
  float id = inv(h2f(b.d));
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    int lo = clampi(nearest(x[j] * id) + 16, 0, 31);
    int hi = clampi(nearest(x[j + 16] * id) + 16, 0, 31);
    b.qs[j] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
    h |= static_cast<uint32_t>(lo >> 4) << j;
    h |= static_cast<uint32_t>(hi >> 4) << (j + 16);
  }
  std::memcpy(b.qh, &h, 4);
}
// Affine: min and step from the block's range, both rounded through f16 first.
template <class Block>
void q_affine(const float* x, Block& b, int levels, uint32_t* qh) {
  float mn, mx;
  min_max(x, 32, mn, mx);
  b.d = f32_to_f16((mx - mn) / static_cast<float>(levels));
  b.m = f32_to_f16(mn);
  float id = inv(h2f(b.d)), m = h2f(b.m);
  if (qh) *qh = 0;
  for (int j = 0; j < 16; ++j) {
    int lo = clampi(nearest((x[j] - m) * id), 0, levels);
    int hi = clampi(nearest((x[j + 16] - m) * id), 0, levels);
    b.qs[j] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
    if (qh) *qh |= (static_cast<uint32_t>(lo >> 4) << j) | (static_cast<uint32_t>(hi >> 4) << (j + 16));
  }
}
void q_q4_1(const float* x, BlockQ4_1& b) { q_affine(x, b, 15, nullptr); }
void q_q5_1(const float* x, BlockQ5_1& b) {
  uint32_t h;
  q_affine(x, b, 31, &h);
  std::memcpy(b.qh, &h, 4);
}

// q4_K / q5_K: per sub-block of 32 an affine range [mn, mx] with mn <= 0 (the format subtracts a
// non-negative min), 6-bit scale and min relative to the super-block's f16 d and dmin. Mins and
// then scales are rounded up, so the quantized range always covers the sub-block (no clipping).
// Writes the per-element levels to q[256].
void k_affine(const float* x, int levels, uint16_t& d_out, uint16_t& dmin_out, uint8_t* scales,
              uint8_t* q) {
  float mx[8], minv[8], max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float mn;
    min_max(x + 32 * j, 32, mn, mx[j]);
    minv[j] = -std::min(mn, 0.0f);
    max_min = std::max(max_min, minv[j]);
  }
  dmin_out = f32_to_f16(max_min / 63.0f);
  float dmin = h2f(dmin_out);
  int mq[8], sq[8];
  float range[8], max_scale = 0;
  for (int j = 0; j < 8; ++j) {
    mq[j] = clampi(static_cast<int>(std::ceil(minv[j] * inv(dmin))), 0, 63);
    range[j] = std::max(0.0f, mx[j] + dmin * static_cast<float>(mq[j]));
    max_scale = std::max(max_scale, range[j] / static_cast<float>(levels));
  }
  d_out = f32_to_f16(max_scale / 63.0f);
  float d = h2f(d_out);
  std::memset(scales, 0, 12);
  for (int j = 0; j < 8; ++j) {
    sq[j] = clampi(static_cast<int>(std::ceil(range[j] / static_cast<float>(levels) * inv(d))), 0, 63);
    int sc = sq[j], mn = mq[j];
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(scales[j] | sc);
      scales[j + 4] = static_cast<uint8_t>(scales[j + 4] | mn);
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc & 15) | ((mn & 15) << 4));
      scales[j - 4] = static_cast<uint8_t>(scales[j - 4] | ((sc >> 4) << 6));
      scales[j] = static_cast<uint8_t>(scales[j] | ((mn >> 4) << 6));
    }
    float step = d * static_cast<float>(sc), off = dmin * static_cast<float>(mn);
    for (int l = 0; l < 32; ++l)
      q[32 * j + l] = static_cast<uint8_t>(clampi(nearest((x[32 * j + l] + off) * inv(step)), 0, levels));
  }
}
void q_q4_k(const float* x, BlockQ4_K& b) {
  uint8_t q[256];
  k_affine(x, 15, b.d, b.dmin, b.scales, q);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      b.qs[32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}
void q_q5_k(const float* x, BlockQ5_K& b) {
  uint8_t q[256];
  k_affine(x, 31, b.d, b.dmin, b.scales, q);
  std::memset(b.qh, 0, 32);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      b.qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
      b.qh[l] = static_cast<uint8_t>(b.qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}
void q_q6_k(const float* x, BlockQ6_K& b) {
  float sub[16], amax = 0;
  for (int k = 0; k < 16; ++k) {
    sub[k] = signed_absmax(x + 16 * k, 16) / -32.0f;
    amax = std::max(amax, std::fabs(sub[k]));
  }
  b.d = f32_to_f16(amax / 127.0f);
  float d = h2f(b.d);
  int q[256];
  for (int k = 0; k < 16; ++k) {
    int sc = clampi(nearest(sub[k] * inv(d)), -128, 127);
    b.scales[k] = static_cast<int8_t>(sc);
    float id = inv(d * static_cast<float>(sc));
    for (int l = 0; l < 16; ++l) q[16 * k + l] = clampi(nearest(x[16 * k + l] * id), -32, 31) + 32;
  }
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const int* g = q + 128 * h + l;  // g[0], g[32], g[64], g[96]: the four groups
      b.ql[64 * h + l] = static_cast<uint8_t>((g[0] & 15) | ((g[64] & 15) << 4));
      b.ql[64 * h + l + 32] = static_cast<uint8_t>((g[32] & 15) | ((g[96] & 15) << 4));
      b.qh[32 * h + l] = static_cast<uint8_t>((g[0] >> 4) | ((g[32] >> 4) << 2) |
                                              ((g[64] >> 4) << 4) | ((g[96] >> 4) << 6));
    }
}

// Blocks are copied in and out: GGUF allows any power-of-two alignment (even 1), so tensor
// data need not be aligned for the blocks' u16 fields.
template <class Block, class Fn>
void each_block_dq(const void* src, float* dst, int64_t nb, int64_t elems, Fn fn) {
  const auto* p = static_cast<const uint8_t*>(src);
  Block b;
  for (int64_t i = 0; i < nb; ++i) {
    std::memcpy(&b, p + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
    fn(b, dst + i * elems);
  }
}
template <class Block, class Fn>
void each_block_q(const float* src, void* dst, int64_t nb, int64_t elems, Fn fn) {
  auto* p = static_cast<uint8_t*>(dst);
  Block b;
  for (int64_t i = 0; i < nb; ++i) {
    fn(src + i * elems, b);
    std::memcpy(p + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
  }
}
uint16_t load16(const void* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(p) + 2 * i, 2);
  return h;
}
void store16(void* p, int64_t i, uint16_t h) { std::memcpy(static_cast<uint8_t*>(p) + 2 * i, &h, 2); }

}  // namespace

std::optional<TensorType> tensor_type_from_id(uint32_t id) {
  for (const Traits& tr : kTraits)
    if (static_cast<uint32_t>(tr.type) == id) return tr.type;
  return std::nullopt;
}

std::string_view tensor_type_name(TensorType t) { return traits(t).name; }

std::optional<TensorType> parse_tensor_type(std::string_view name) {
  for (const Traits& tr : kTraits) {
    if (tr.name.size() != name.size()) continue;
    bool eq = true;
    for (size_t k = 0; k < name.size(); ++k)
      eq = eq && std::tolower(static_cast<unsigned char>(name[k])) ==
                     std::tolower(static_cast<unsigned char>(tr.name[k]));
    if (eq) return tr.type;
  }
  return std::nullopt;
}

int64_t block_elems(TensorType t) { return traits(t).elems; }
int64_t block_bytes(TensorType t) { return traits(t).bytes; }

std::optional<uint64_t> row_bytes(TensorType t, int64_t n) {
  const Traits& tr = traits(t);
  if (n < 0 || n % tr.elems != 0) return std::nullopt;
  uint64_t out;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n / tr.elems), static_cast<uint64_t>(tr.bytes), &out))
    return std::nullopt;
  return out;
}

void dequantize_row(TensorType t, const void* src, float* dst, int64_t n) {
  int64_t nb = n / block_elems(t);
  switch (t) {
    case TensorType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case TensorType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load16(src, i));
      return;
    case TensorType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load16(src, i));
      return;
    case TensorType::kQ8_0: return each_block_dq<BlockQ8_0>(src, dst, nb, 32, dq_q8_0);
    case TensorType::kQ4_0: return each_block_dq<BlockQ4_0>(src, dst, nb, 32, dq_q4_0);
    case TensorType::kQ4_1: return each_block_dq<BlockQ4_1>(src, dst, nb, 32, dq_q4_1);
    case TensorType::kQ5_0: return each_block_dq<BlockQ5_0>(src, dst, nb, 32, dq_q5_0);
    case TensorType::kQ5_1: return each_block_dq<BlockQ5_1>(src, dst, nb, 32, dq_q5_1);
    case TensorType::kQ4_K: return each_block_dq<BlockQ4_K>(src, dst, nb, 256, dq_q4_k);
    case TensorType::kQ5_K: return each_block_dq<BlockQ5_K>(src, dst, nb, 256, dq_q5_k);
    case TensorType::kQ6_K: return each_block_dq<BlockQ6_K>(src, dst, nb, 256, dq_q6_k);
  }
}

void quantize_row(TensorType t, const float* src, void* dst, int64_t n) {
  int64_t nb = n / block_elems(t);
  switch (t) {
    case TensorType::kF32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case TensorType::kF16:
      for (int64_t i = 0; i < n; ++i) store16(dst, i, f32_to_f16(src[i]));
      return;
    case TensorType::kBF16:
      for (int64_t i = 0; i < n; ++i) store16(dst, i, f32_to_bf16(src[i]));
      return;
    case TensorType::kQ8_0: return each_block_q<BlockQ8_0>(src, dst, nb, 32, q_q8_0);
    case TensorType::kQ4_0: return each_block_q<BlockQ4_0>(src, dst, nb, 32, q_q4_0);
    case TensorType::kQ4_1: return each_block_q<BlockQ4_1>(src, dst, nb, 32, q_q4_1);
    case TensorType::kQ5_0: return each_block_q<BlockQ5_0>(src, dst, nb, 32, q_q5_0);
    case TensorType::kQ5_1: return each_block_q<BlockQ5_1>(src, dst, nb, 32, q_q5_1);
    case TensorType::kQ4_K: return each_block_q<BlockQ4_K>(src, dst, nb, 256, q_q4_k);
    case TensorType::kQ5_K: return each_block_q<BlockQ5_K>(src, dst, nb, 256, q_q5_k);
    case TensorType::kQ6_K: return each_block_q<BlockQ6_K>(src, dst, nb, 256, q_q6_k);
  }
}

}  // namespace escala::model
