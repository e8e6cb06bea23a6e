// Per-target (Highway) helpers shared by the CPU kernels: reading Q rows and K/V rows of any
// storage type (f32, f16, bf16, int8 with scale, fp8 with scale; contiguous or paged) into f32.
// Dequantisation happens here, inside the kernels: no dequantised copy of the cache exists.

// Highway per-target include guard (toggles once per target).
#if defined(ESCALA_ATTENTION_CPU_TILE_LOAD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ESCALA_ATTENTION_CPU_TILE_LOAD_INL_H_
#undef ESCALA_ATTENTION_CPU_TILE_LOAD_INL_H_
#else
#define ESCALA_ATTENTION_CPU_TILE_LOAD_INL_H_
#endif

#include <cmath>

#include "attention/kv_layout.h"
#include "common/f16-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace escala::attn::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Converts `n` (a multiple of 8) elements of a float-typed row to f32, times `scale`.
inline void row_to_f32(const void* src, DType t, int n, float scale, float* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const size_t L = hn::Lanes(df);
  const auto vs = hn::Set(df, scale);
  int c = 0;
  switch (t) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      for (; c + int(L) <= n; c += int(L)) hn::StoreU(hn::Mul(hn::LoadU(df, s + c), vs), df, out + c);
      for (; c < n; ++c) out[c] = s[c] * scale;
      break;
    }
    case DType::kF16: {
      const hn::Rebind<hwy::float16_t, decltype(df)> dh;
      const auto* s = static_cast<const hwy::float16_t*>(src);
      for (; c + int(L) <= n; c += int(L))
        hn::StoreU(hn::Mul(escala::HWY_NAMESPACE::PromoteF16(df, hn::LoadU(dh, s + c)), vs), df, out + c);
      for (; c < n; ++c) out[c] = f16_to_f32(static_cast<const uint16_t*>(src)[c]) * scale;
      break;
    }
    case DType::kBF16: {
      const hn::Rebind<hwy::bfloat16_t, decltype(df)> db;
      const auto* s = static_cast<const hwy::bfloat16_t*>(src);
      for (; c + int(L) <= n; c += int(L))
        hn::StoreU(hn::Mul(hn::PromoteTo(df, hn::LoadU(db, s + c)), vs), df, out + c);
      for (; c < n; ++c) out[c] = bf16_to_f32(static_cast<const uint16_t*>(src)[c]) * scale;
      break;
    }
    case DType::kI8: {
      const hn::Rebind<int32_t, decltype(df)> di;
      const hn::Rebind<int8_t, decltype(df)> d8;
      const auto* s = static_cast<const int8_t*>(src);
      for (; c + int(L) <= n; c += int(L))
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, s + c))), vs), df, out + c);
      for (; c < n; ++c) out[c] = float(s[c]) * scale;
      break;
    }
    case DType::kFp8E4M3: {
      // 256-entry table, gathered with the bytes as indices (no fp8 arithmetic on x86).
      static const auto kTable = [] {
        struct T { alignas(64) float v[256]; } t{};
        for (int i = 0; i < 256; ++i) t.v[i] = fp8e4m3_to_f32(uint8_t(i));
        return t;
      }();
      const hn::Rebind<int32_t, decltype(df)> di;
      const hn::Rebind<uint8_t, decltype(df)> d8;
      const auto* s = static_cast<const uint8_t*>(src);
      for (; c + int(L) <= n; c += int(L)) {
        const auto idx = hn::BitCast(di, hn::PromoteTo(hn::Rebind<uint32_t, decltype(df)>(), hn::LoadU(d8, s + c)));
        hn::StoreU(hn::Mul(hn::GatherIndex(df, kTable.v, idx), vs), df, out + c);
      }
      for (; c < n; ++c) out[c] = kTable.v[s[c]] * scale;
      break;
    }
  }
}

// Loads keys/values [j0, j1) of kv head `h` into rows of `out` (row stride `ld`), dequantised;
// rows j1-j0 .. rows-1 are zero-filled. Keys stored before RoPE are rotated here.
inline void load_kv_tile(const KvSeq& s, int32_t h, int64_t j0, int64_t j1, int dim, int rows, float* out,
                         int ld, const float* rope_inv_freq = nullptr, bool rope_neox = false) {
  for (int64_t j = j0; j < j1; ++j) {
    float* dst = out + (j - j0) * ld;
    row_to_f32(s.row(j, h), s.dtype, dim, s.scale_of(j, h), dst);
    if (rope_inv_freq) apply_rope(dst, dim, j, rope_inv_freq, rope_neox);
  }
  for (int64_t r = j1 - j0; r < rows; ++r)
    for (int c = 0; c < dim; ++c) out[r * ld + c] = 0.0f;
}

}  // namespace escala::attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
