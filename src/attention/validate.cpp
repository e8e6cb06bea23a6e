// Argument checking for the attention API: every bad shape or option is a one-line error.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "escala/attention.h"

namespace escala::attn {

namespace {
bool is_float_type(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
}  // namespace

Status validate(const AttentionParams& p) {
  ESCALA_CHECK_ARG(p.q && p.k && p.v && p.o, "attention: q, k, v and o must all be given");
  ESCALA_CHECK_ARG(p.batch >= 1, "attention: batch must be >= 1 (got {})", p.batch);
  ESCALA_CHECK_ARG(p.cu_seqlens_q && p.cu_seqlens_k, "attention: cu_seqlens_q and cu_seqlens_k are required");
  ESCALA_CHECK_ARG(p.num_heads >= 1 && p.num_kv_heads >= 1, "attention: head counts must be >= 1 (got h={}, h_kv={})",
                   p.num_heads, p.num_kv_heads);
  ESCALA_CHECK_ARG(p.num_heads % p.num_kv_heads == 0,
                   "attention: num_heads ({}) must be divisible by num_kv_heads ({})", p.num_heads, p.num_kv_heads);
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  ESCALA_CHECK_ARG(p.head_dim >= 8 && p.head_dim <= 256 && p.head_dim % 8 == 0,
                   "attention: head_dim must be a multiple of 8 in [8, 256] (got {})", p.head_dim);
  ESCALA_CHECK_ARG(dv >= 8 && dv <= 256 && dv % 8 == 0,
                   "attention: head_dim_v must be a multiple of 8 in [8, 256] (got {})", dv);
  ESCALA_CHECK_ARG(is_float_type(p.q_dtype), "attention: q dtype must be f32, f16 or bf16");
  ESCALA_CHECK_ARG(is_float_type(p.o_dtype), "attention: o dtype must be f32, f16 or bf16");
  ESCALA_CHECK_ARG(p.window_left >= -1 && p.window_right >= -1, "attention: window extents must be >= -1");
  ESCALA_CHECK_ARG(p.num_sinks >= 0, "attention: num_sinks must be >= 0 (got {})", p.num_sinks);
  ESCALA_CHECK_ARG(std::isfinite(p.softcap) && p.softcap >= 0.0f, "attention: softcap must be finite and >= 0");
  ESCALA_CHECK_ARG(std::isfinite(p.softmax_scale), "attention: softmax_scale must be finite");
  ESCALA_CHECK_ARG(p.q_row_stride > 0 && p.q_head_stride > 0 && p.o_row_stride > 0 && p.o_head_stride > 0 &&
                       p.k_row_stride > 0 && p.k_head_stride > 0 && p.v_row_stride > 0 && p.v_head_stride > 0,
                   "attention: all strides must be positive");
  if (is_quantized(p.kv_dtype)) {
    ESCALA_CHECK_ARG(p.k_scale && p.v_scale, "attention: quantized KV ({}) needs k_scale and v_scale",
                     dtype_name(p.kv_dtype));
  }
  if (p.kv_dtype == DType::kFp8E4M3) {
    ESCALA_CHECK_ARG(p.page_size > 0, "attention: fp8 KV (scale per page and head) needs the paged layout");
  }
  if (p.page_size > 0) {
    ESCALA_CHECK_ARG(p.page_indptr && p.page_indices, "attention: paged KV needs page_indptr and page_indices");
    ESCALA_CHECK_ARG(p.k_page_stride > 0 && p.v_page_stride > 0, "attention: paged KV needs page strides");
  } else {
    ESCALA_CHECK_ARG(p.page_size == 0, "attention: page_size must be >= 0");
  }
  ESCALA_CHECK_ARG(p.cu_seqlens_q[0] == 0 && p.cu_seqlens_k[0] == 0, "attention: cu_seqlens must start at 0");
  for (int b = 0; b < p.batch; ++b) {
    const int32_t lq = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const int32_t lk = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    ESCALA_CHECK_ARG(lq >= 0 && lk >= 0, "attention: cu_seqlens must be non-decreasing (sequence {})", b);
    if (p.page_size > 0) {
      const int64_t pages = p.page_indptr[b + 1] - p.page_indptr[b];
      ESCALA_CHECK_ARG(pages * p.page_size >= lk, "attention: sequence {} has {} keys but only {} pages of {}", b,
                       lk, pages, p.page_size);
    }
  }
  return {};
}

void merge_partial(float* o_a, float* lse_a, const float* o_b, float lse_b, int head_dim_v) {
  const float ninf = -std::numeric_limits<float>::infinity();
  if (lse_b == ninf) return;
  if (*lse_a == ninf) {
    for (int c = 0; c < head_dim_v; ++c) o_a[c] = o_b ? o_b[c] : 0.0f;
    *lse_a = lse_b;
    return;
  }
  const float m = std::max(*lse_a, lse_b);
  const float wa = std::exp(*lse_a - m), wb = std::exp(lse_b - m);
  const float inv = 1.0f / (wa + wb);
  for (int c = 0; c < head_dim_v; ++c) o_a[c] = (o_a[c] * wa + (o_b ? o_b[c] * wb : 0.0f)) * inv;
  *lse_a = m + std::log(wa + wb);
}

}  // namespace escala::attn
