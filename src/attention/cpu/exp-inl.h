// Per-target (Highway) exp for the online softmax of the CPU kernels: arguments are scores minus a
// running maximum (x <= ~10, or -inf for masked scores). On AVX-512 it is a Cody-Waite reduction,
// a degree-7 polynomial (Highway's Exp coefficients, about 1 ulp) and one vscalefps, about 15
// instructions instead of ~25; elsewhere it is Highway's Exp. Arguments below -87 (e^-87 < 2^-125)
// give exactly 0, as -inf does, so masked scores contribute nothing and no denormal is produced.
// NaN gives NaN (Highway's Exp alone would give 0), so that a NaN score reaches the row's sum and
// output instead of reading as a masked key.

// Highway per-target include guard (toggles once per target).
#if defined(ESCALA_ATTENTION_CPU_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ESCALA_ATTENTION_CPU_EXP_INL_H_
#undef ESCALA_ATTENTION_CPU_EXP_INL_H_
#else
#define ESCALA_ATTENTION_CPU_EXP_INL_H_
#endif

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace escala::attn::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D, class V>
HWY_INLINE V SoftmaxExp(D d, V x) {
#if HWY_TARGET <= HWY_AVX3 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  if constexpr (sizeof(hn::TFromD<D>) == 4 && hn::MaxLanes(D()) == 16) {
    // live: x >= -87 or NaN ("not less than, unordered"). vmaxps returns its second operand, x,
    // when either is NaN, so NaN goes on through the arithmetic while -inf is kept out of it.
    const V lo = hn::Set(d, -87.0f);
    const __mmask16 live = _mm512_cmp_ps_mask(x.raw, lo.raw, _CMP_NLT_UQ);
    const V xc = hn::Max(lo, x);  // this order: Highway's x86 Max is vmaxps(a, b)
    // n = round(x / ln 2) by the 1.5 * 2^23 trick (exact for |x| < 2^21), r = x - n ln 2 in two parts.
    const V magic = hn::Set(d, 12582912.0f);
    const V n = hn::Sub(hn::MulAdd(xc, hn::Set(d, 1.44269504088896341f), magic), magic);
    V r = hn::MulAdd(n, hn::Set(d, -0.693145751953125f), xc);
    r = hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), r);
    // e^r - 1 = r + r^2 (k0 + k1 r + ... + k5 r^5) on |r| <= ln(2) / 2.
    V p = hn::Set(d, 0.000198527617612853646278381f);
    p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
    p = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));
    return V{_mm512_maskz_scalef_ps(live, p.raw, n.raw)};
  }
#endif
  return hn::IfThenElse(hn::IsNaN(x), x, hn::Exp(d, x));
}

}  // namespace escala::attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
