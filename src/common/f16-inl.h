// Per-target (Highway) f16 -> f32 for vectors that keeps inf and NaN. Where the CPU has no F16C
// (Highway's SSE4, SSSE3 and scalar targets), Highway 1.0 converts in software and reads exponent
// 31 as an ordinary exponent: inf became 65536 and NaN a finite number. Those lanes are rebuilt
// here; targets with a hardware conversion (x86 AVX2 and up) use it as it is.

// Highway per-target include guard (toggles once per target).
#if defined(ESCALA_COMMON_F16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ESCALA_COMMON_F16_INL_H_
#undef ESCALA_COMMON_F16_INL_H_
#else
#define ESCALA_COMMON_F16_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace escala::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class DF>
HWY_INLINE hn::Vec<DF> PromoteF16(DF df, hn::Vec<hn::Rebind<hwy::float16_t, DF>> h) {
  const hn::Vec<DF> f = hn::PromoteTo(df, h);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
  return f;  // vcvtph2ps
#else
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::PromoteTo(du, hn::BitCast(du16, h));
  const auto exp_mask = hn::Set(du, 0x7C00);
  const auto inf_or_nan = hn::Eq(hn::And(bits, exp_mask), exp_mask);
  // sign, all-ones exponent, the mantissa moved to the top (a NaN stays a NaN)
  const auto wide = hn::Or(hn::ShiftLeft<16>(hn::And(bits, hn::Set(du, 0x8000))),
                           hn::Or(hn::Set(du, 0x7F800000), hn::ShiftLeft<13>(hn::And(bits, hn::Set(du, 0x3FF)))));
  return hn::IfThenElse(hn::RebindMask(df, inf_or_nan), hn::BitCast(df, wide), f);
#endif
}

}  // namespace escala::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ESCALA_COMMON_F16_INL_H_
