// Test fixtures for attention: random inputs of any shape, dtype and layout (contiguous or
// randomly permuted pages, plain or quantized), and the tolerances every kernel test uses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "attention/kv_layout.h"
#include "common/numeric.h"
#include "escala/attention.h"

namespace escala::test {

// Tolerances, written down once: |out - ref| <= atol + rtol * |ref|, per output dtype. The
// reference sees exactly the stored (rounded/quantized) inputs, so these bound only the kernel's
// f32 accumulation plus the rounding of the output itself.
struct Tolerance {
  double atol, rtol;
};
inline Tolerance tolerance_for(DType out) {
  switch (out) {
    case DType::kBF16: return {2e-3, 1e-2};  // 8-bit mantissa: one rounding is 2^-9 relative
    case DType::kF16: return {2e-4, 2e-3};   // 11-bit mantissa
    default: return {2e-5, 2e-4};            // f32 accumulation order
  }
}
constexpr double kLseTolerance = 2e-4;  // absolute, on the natural-log LSE
// The int8 K/V decode path (AVX-512 VNNI) rounds the queries and the softmax weights to 16-bit
// integers relative to a row's max (error 2^-16 of it; the keys and values are 8-bit, ~100x
// coarser): f16-class. For query rows whose largest element dwarfs the rest (10^4x) or whose
// logits reach the hundreds, the error relative to the output grows to bf16-class.
constexpr Tolerance kInt8DecodeTolerance = {2e-4, 2e-3};
constexpr Tolerance kInt8DecodeOutlierTolerance = {2e-3, 1e-2};
constexpr double kInt8DecodeLseTolerance = 2e-3;

struct AttnCase {
  int h = 4, h_kv = 2, d = 64, dv = 0;
  DType q_dtype = DType::kF32, kv_dtype = DType::kF32, o_dtype = DType::kF32;
  std::vector<int> q_lens{7}, kv_lens{7};
  bool causal = false;
  int window_left = -1, window_right = -1, num_sinks = 0;
  bool sink_logits = false;
  float softcap = 0.0f, scale = 0.0f;
  int page_size = 0;  // 0: contiguous
  float value_range = 1.0f;
  int rope = 0;  // keys stored before RoPE: 0 off, 1 pairs (2i, 2i+1), 2 NeoX pairs (i, i+d/2)
};

// Owns the inputs of one case and produces AttentionParams over them.
struct AttnBuffers {
  AttnCase c;
  std::vector<uint8_t> q, k, v;
  std::vector<float> k_scale, v_scale, sinks, inv_freq;
  std::vector<int32_t> cu_q{0}, cu_k{0}, page_indptr{0}, page_indices;
  int64_t total_q = 0, total_kv = 0, num_pages = 0;

  int dv() const { return c.dv ? c.dv : c.d; }

  attn::AttentionParams params(void* o, float* lse) const {
    attn::AttentionParams p;
    p.q = q.data(); p.k = k.data(); p.v = v.data(); p.o = o; p.lse = lse;
    p.q_dtype = c.q_dtype; p.kv_dtype = c.kv_dtype; p.o_dtype = c.o_dtype;
    p.q_head_stride = c.d; p.q_row_stride = int64_t(c.h) * c.d;
    p.k_head_stride = c.d; p.k_row_stride = int64_t(c.h_kv) * c.d;
    p.v_head_stride = dv(); p.v_row_stride = int64_t(c.h_kv) * dv();
    p.o_head_stride = dv(); p.o_row_stride = int64_t(c.h) * dv();
    p.batch = int32_t(c.q_lens.size());
    p.cu_seqlens_q = cu_q.data(); p.cu_seqlens_k = cu_k.data();
    p.num_heads = c.h; p.num_kv_heads = c.h_kv; p.head_dim = c.d; p.head_dim_v = dv();
    if (c.page_size > 0) {
      p.page_size = c.page_size;
      p.page_indptr = page_indptr.data(); p.page_indices = page_indices.data();
      p.k_page_stride = int64_t(c.page_size) * p.k_row_stride;
      p.v_page_stride = int64_t(c.page_size) * p.v_row_stride;
    }
    if (is_quantized(c.kv_dtype)) { p.k_scale = k_scale.data(); p.v_scale = v_scale.data(); }
    p.softmax_scale = c.scale; p.causal = c.causal;
    p.window_left = c.window_left; p.window_right = c.window_right; p.num_sinks = c.num_sinks;
    p.sink_logits = c.sink_logits ? sinks.data() : nullptr;
    p.softcap = c.softcap;
    if (c.rope) {
      p.rope_inv_freq = inv_freq.data();
      p.rope_neox = c.rope == 2;
    }
    return p;
  }
};

inline void store_as(uint8_t* base, DType t, int64_t i, float v) { attn::store_float(base, t, i, v); }

// Fills a KV tensor (contiguous rows or pages) with random values, quantizing when asked:
// int8 scale per (slot, head) = maxabs/127; fp8 scale per (page, head) = maxabs/448.
inline void fill_kv(std::vector<uint8_t>& out, std::vector<float>& scale, const AttnCase& c, int64_t slots,
                    int dim, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-c.value_range, c.value_range);
  std::vector<float> f(size_t(slots) * c.h_kv * dim);
  for (auto& x : f) x = u(rng);
  out.assign(f.size() * dtype_size(c.kv_dtype), 0);
  if (c.kv_dtype == DType::kI8) {
    scale.assign(size_t(slots) * c.h_kv, 0.0f);
    for (int64_t s = 0; s < slots * c.h_kv; ++s) {
      float mx = 0;
      for (int i = 0; i < dim; ++i) mx = std::max(mx, std::fabs(f[s * dim + i]));
      const float sc = mx > 0 ? mx / 127.0f : 1.0f;
      scale[s] = sc;
      for (int i = 0; i < dim; ++i)
        reinterpret_cast<int8_t*>(out.data())[s * dim + i] = int8_t(std::lrint(f[s * dim + i] / sc));
    }
  } else if (c.kv_dtype == DType::kFp8E4M3) {
    const int64_t pages = slots / c.page_size;
    scale.assign(size_t(pages) * c.h_kv, 0.0f);
    for (int64_t pg = 0; pg < pages; ++pg)
      for (int hh = 0; hh < c.h_kv; ++hh) {
        float mx = 0;
        for (int t = 0; t < c.page_size; ++t)
          for (int i = 0; i < dim; ++i)
            mx = std::max(mx, std::fabs(f[((pg * c.page_size + t) * c.h_kv + hh) * dim + i]));
        const float sc = mx > 0 ? mx / 448.0f : 1.0f;
        scale[pg * c.h_kv + hh] = sc;
        for (int t = 0; t < c.page_size; ++t)
          for (int i = 0; i < dim; ++i) {
            const int64_t idx = ((pg * c.page_size + t) * c.h_kv + hh) * dim + i;
            out[idx] = f32_to_fp8e4m3(f[idx] / sc);
          }
      }
  } else {
    for (size_t i = 0; i < f.size(); ++i) store_as(out.data(), c.kv_dtype, int64_t(i), f[i]);
  }
}

inline AttnBuffers make_buffers(const AttnCase& c, std::mt19937& rng) {
  AttnBuffers b;
  b.c = c;
  for (size_t i = 0; i < c.q_lens.size(); ++i) {
    b.cu_q.push_back(b.cu_q.back() + c.q_lens[i]);
    b.cu_k.push_back(b.cu_k.back() + c.kv_lens[i]);
  }
  b.total_q = b.cu_q.back();
  b.total_kv = b.cu_k.back();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  b.q.assign(size_t(b.total_q) * c.h * c.d * dtype_size(c.q_dtype), 0);
  for (int64_t i = 0; i < b.total_q * c.h * c.d; ++i) store_as(b.q.data(), c.q_dtype, i, u(rng));
  int64_t slots = b.total_kv;
  if (c.page_size > 0) {
    // Each sequence gets ceil(len / page) pages (plus one spare for kv_len == 0), from a random
    // permutation of the pool so that neighbouring pages are never neighbours in memory.
    std::vector<int32_t> counts;
    for (int len : c.kv_lens) counts.push_back((len + c.page_size - 1) / c.page_size + 1);
    b.num_pages = std::accumulate(counts.begin(), counts.end(), int64_t(0));
    std::vector<int32_t> perm(b.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int64_t at = 0;
    for (int32_t n : counts) {
      for (int32_t i = 0; i < n; ++i) b.page_indices.push_back(perm[at++]);
      b.page_indptr.push_back(int32_t(b.page_indices.size()));
    }
    slots = b.num_pages * c.page_size;
  }
  fill_kv(b.k, b.k_scale, c, slots, c.d, rng);
  fill_kv(b.v, b.v_scale, c, slots, b.dv(), rng);
  std::uniform_real_distribution<float> us(-2.0f, 3.0f);
  for (int i = 0; i < c.h; ++i) b.sinks.push_back(us(rng));
  for (int i = 0; i < c.d / 2; ++i) b.inv_freq.push_back(std::pow(10000.0f, -2.0f * float(i) / float(c.d)));
  return b;
}

// Output buffer pre-poisoned with NaN so that an unwritten element fails every comparison.
inline std::vector<uint8_t> poisoned_output(const AttnBuffers& b) {
  std::vector<uint8_t> o(size_t(b.total_q) * b.c.h * b.dv() * dtype_size(b.c.o_dtype));
  for (int64_t i = 0; i < b.total_q * b.c.h * b.dv(); ++i) store_as(o.data(), b.c.o_dtype, i, std::nanf(""));
  return o;
}

inline float output_at(const std::vector<uint8_t>& o, DType t, int64_t i) { return attn::load_float(o.data(), t, i); }

}  // namespace escala::test
