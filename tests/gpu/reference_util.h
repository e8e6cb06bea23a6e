// Shared by the GPU tests: the tolerances (written once) and the double-precision reference run
// one query head at a time, in parallel over heads.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "attention/kv_layout.h"
#include "attention/reference.h"
#include "escala/attention.h"
#include "gpu_util.h"

namespace escala::gputest {

using attn::AttentionParams;

// Tolerances, written once: |gpu - ref| <= atol + rtol * |ref| per element (ref in double, O
// stored in the kernel's dtype, so one rounding of the output is inside the bound).
struct Tolerance {
  double atol, rtol;
};
constexpr Tolerance kTolBf16{1.5e-2, 1.5e-2};
constexpr Tolerance kTolF16{3e-3, 3e-3};
constexpr Tolerance kTolLse{2e-3, 2e-4};

// Runs the reference one (query head) at a time, in parallel over heads.
inline void parallel_reference(const AttentionParams& p, std::vector<float>& o_ref, std::vector<float>& lse_ref,
                        int64_t total_q) {
  const int group = p.num_heads / p.num_kv_heads;
  const int d = p.head_dim_v ? p.head_dim_v : p.head_dim;  // O's row length
  std::vector<std::vector<float>> lse_h(p.num_heads, std::vector<float>(total_q));
  auto run = [&](int h) {
    AttentionParams r = p;
    const size_t qb = dtype_size(p.q_dtype), kb = dtype_size(p.kv_dtype);
    r.q = static_cast<const uint8_t*>(p.q) + h * p.q_head_stride * qb;
    r.k = static_cast<const uint8_t*>(p.k) + (h / group) * p.k_head_stride * kb;
    r.v = static_cast<const uint8_t*>(p.v) + (h / group) * p.v_head_stride * kb;
    r.num_heads = r.num_kv_heads = 1;
    r.o = o_ref.data() + static_cast<size_t>(h) * d;
    r.o_dtype = DType::kF32;
    r.o_row_stride = static_cast<int64_t>(p.num_heads) * d;
    r.o_head_stride = d;
    r.lse = lse_h[h].data();
    r.sink_logits = p.sink_logits ? p.sink_logits + h : nullptr;
    attn::attention_reference(r);
  };
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  for (int h0 = 0; h0 < p.num_heads; h0 += hw) {
    std::vector<std::thread> ts;
    for (int h = h0; h < std::min(p.num_heads, h0 + hw); ++h) ts.emplace_back(run, h);
    for (auto& t : ts) t.join();
  }
  for (int h = 0; h < p.num_heads; ++h)
    for (int64_t i = 0; i < total_q; ++i) lse_ref[i * p.num_heads + h] = lse_h[h][i];
}

// The reference over K/V as a kernel reads them: `hp` (host pointers, host cu_seqlens) may be paged
// and quantized; its K/V are dequantized into contiguous f32 rows (exactly the values a kernel
// reads) and the double-precision reference runs on those. O and LSE are sized here.
inline void reference_over_stored_kv(const AttentionParams& hp, std::vector<float>& o_ref,
                                     std::vector<float>& lse_ref) {
  const int hk = hp.num_kv_heads, d = hp.head_dim;
  const int64_t tk = hp.cu_seqlens_k[hp.batch], tq = hp.cu_seqlens_q[hp.batch];
  std::vector<float> kd(size_t(tk) * hk * d), vd(kd.size());
  for (int b = 0; b < hp.batch; ++b) {
    const attn::KvSeq ks = attn::make_kv_seq(hp, b, false), vs = attn::make_kv_seq(hp, b, true);
    for (int t = 0; t < hp.cu_seqlens_k[b + 1] - hp.cu_seqlens_k[b]; ++t)
      for (int h = 0; h < hk; ++h)
        for (int x = 0; x < d; ++x) {
          const size_t i = ((hp.cu_seqlens_k[b] + t) * int64_t(hk) + h) * d + x;
          kd[i] = ks.load(t, h, x), vd[i] = vs.load(t, h, x);
        }
  }
  AttentionParams r = hp;
  r.page_size = 0, r.page_indptr = r.page_indices = nullptr;
  r.kv_dtype = DType::kF32, r.k = kd.data(), r.v = vd.data(), r.k_scale = r.v_scale = nullptr;
  r.k_row_stride = r.v_row_stride = int64_t(hk) * d, r.k_head_stride = r.v_head_stride = d;
  o_ref.assign(size_t(tq) * hp.num_heads * d, 0.0f), lse_ref.assign(size_t(tq) * hp.num_heads, 0.0f);
  parallel_reference(r, o_ref, lse_ref, tq);
}

// Checks a GPU result (O as half bits of `dt`, LSE as float) against the reference: every element
// within `tol`, the relative RMS error below `rel_rms`, LSE within kTolLse (-inf exactly). Where
// the reference is NaN (non-finite inputs) the result must be NaN too, and only there.
inline void compare_outputs(const std::vector<uint16_t>& o, const std::vector<float>& lse, const std::vector<float>& o_ref,
                            const std::vector<float>& lse_ref, DType dt, Tolerance tol, double rel_rms, int heads,
                            int d) {
  int64_t bad = 0;
  double max_err = 0, err2 = 0, ref2 = 0;
  for (size_t i = 0; i < o_ref.size(); ++i) {
    const double x = half_to_float(o[i], dt), r = o_ref[i];
    const double e = std::fabs(x - r);
    const bool nan_ok = std::isnan(r) && std::isnan(x);
    if (!nan_ok) err2 += e * e, ref2 += r * r;
    if (!nan_ok && !(e <= tol.atol + tol.rtol * std::fabs(r))) {
      if (bad < 5)
        ADD_FAILURE() << "O[" << i << "] (row " << i / (size_t(heads) * d) << ", head " << (i / d) % heads << ", col "
                      << i % d << ") = " << x << ", ref " << r;
      ++bad;
    }
    if (!std::isnan(e)) max_err = std::max(max_err, e);
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance (max err " << max_err << ")";
  if (ref2 > 0) {
    EXPECT_LT(std::sqrt(err2 / ref2), rel_rms);
  }
  int64_t bad_lse = 0;
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    const float x = lse[i], r = lse_ref[i];
    const bool ok = std::isnan(r)   ? std::isnan(x)
                    : std::isinf(r) ? x == r
                                    : std::fabs(double(x) - r) <= kTolLse.atol + kTolLse.rtol * std::fabs(r);
    if (!ok) {
      if (bad_lse < 5) ADD_FAILURE() << "LSE[" << i << "] = " << x << ", ref " << r;
      ++bad_lse;
    }
  }
  EXPECT_EQ(bad_lse, 0);
}

}  // namespace escala::gputest
