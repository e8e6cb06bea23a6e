// Shared by the GPU tests: the tolerances (written once) and the double-precision reference run
// one query head at a time, in parallel over heads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "attention/reference.h"
#include "escala/attention.h"

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
  const int d = p.head_dim;
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

}  // namespace escala::gputest
