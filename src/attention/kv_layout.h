// Where a sequence's K or V rows live: contiguous or paged, plain or quantized. Shared by the
// reference, the CPU kernels and the CUDA kernels so that all read the cache the same way.
#pragma once

#include <cstdint>

#include "common/hd.h"
#include "common/numeric.h"
#include "escala/attention.h"

namespace escala::attn {

struct KvSeq {
  const uint8_t* data = nullptr;  // K or V base pointer (bytes)
  DType dtype = DType::kF32;
  int32_t elem_bytes = 4;
  int32_t num_kv_heads = 0;
  int64_t row_stride = 0, head_stride = 0, page_stride = 0;  // elements
  int32_t page_size = 0;             // 0: contiguous
  const int32_t* pages = nullptr;    // this sequence's page list (paged)
  int64_t first_row = 0;             // contiguous: cu_seqlens_k[b]
  const float* scale = nullptr;      // quantized only

  // Element offset of (token t, kv head h), t relative to the sequence.
  ESCALA_HD int64_t offset(int64_t t, int32_t h) const {
    if (page_size == 0) return (first_row + t) * row_stride + h * head_stride;
    int64_t page = pages[t / page_size];
    return page * page_stride + (t % page_size) * row_stride + h * head_stride;
  }
  ESCALA_HD const uint8_t* row(int64_t t, int32_t h) const { return data + offset(t, h) * elem_bytes; }

  // Dequantisation scale for (token t, kv head h); 1 for float storage.
  ESCALA_HD float scale_of(int64_t t, int32_t h) const {
    if (dtype == DType::kI8) {
      int64_t slot = page_size == 0 ? first_row + t
                                    : static_cast<int64_t>(pages[t / page_size]) * page_size + t % page_size;
      return scale[slot * num_kv_heads + h];
    }
    if (dtype == DType::kFp8E4M3) return scale[static_cast<int64_t>(pages[t / page_size]) * num_kv_heads + h];
    return 1.0f;
  }

  // Element c of (t, h), dequantised (slow path: reference and tails).
  ESCALA_HD float load(int64_t t, int32_t h, int32_t c) const {
    const uint8_t* r = row(t, h);
    switch (dtype) {
      case DType::kF32: return reinterpret_cast<const float*>(r)[c];
      case DType::kF16: return f16_to_f32(reinterpret_cast<const uint16_t*>(r)[c]);
      case DType::kBF16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(r)[c]);
      case DType::kI8: return static_cast<float>(reinterpret_cast<const int8_t*>(r)[c]) * scale_of(t, h);
      case DType::kFp8E4M3: return fp8e4m3_to_f32(r[c]) * scale_of(t, h);
    }
    return 0.0f;
  }
};

ESCALA_HD KvSeq make_kv_seq(const AttentionParams& p, int32_t b, bool is_v) {
  KvSeq s;
  s.data = static_cast<const uint8_t*>(is_v ? p.v : p.k);
  s.dtype = p.kv_dtype;
  s.elem_bytes = static_cast<int32_t>(dtype_size(p.kv_dtype));
  s.num_kv_heads = p.num_kv_heads;
  s.row_stride = is_v ? p.v_row_stride : p.k_row_stride;
  s.head_stride = is_v ? p.v_head_stride : p.k_head_stride;
  s.page_stride = is_v ? p.v_page_stride : p.k_page_stride;
  s.page_size = p.page_size;
  s.pages = p.page_size > 0 ? p.page_indices + p.page_indptr[b] : nullptr;
  s.first_row = p.page_size > 0 ? 0 : p.cu_seqlens_k[b];
  s.scale = is_v ? p.v_scale : p.k_scale;
  return s;
}

// Rotates a key row in place by RoPE at position `pos` (keys stored before RoPE).
template <class T>
ESCALA_HD void apply_rope(T* x, int32_t d, int64_t pos, const float* inv_freq, bool neox) {
  const int32_t half = d / 2;
  for (int32_t i = 0; i < half; ++i) {
    const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const double ang = double(pos) * double(inv_freq[i]);
    const T c = T(cos(ang)), s = T(sin(ang));
    const T xa = x[a], xb = x[b];
    x[a] = xa * c - xb * s;
    x[b] = xa * s + xb * c;
  }
}

// Reads element c of a float-typed (f32/f16/bf16) row.
ESCALA_HD float load_float(const void* row, DType t, int64_t c) {
  switch (t) {
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(row)[c]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(row)[c]);
    default: return static_cast<const float*>(row)[c];
  }
}

ESCALA_HD void store_float(void* row, DType t, int64_t c, float v) {
  switch (t) {
    case DType::kF16: static_cast<uint16_t*>(row)[c] = f32_to_f16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(row)[c] = f32_to_bf16(v); break;
    default: static_cast<float*>(row)[c] = v; break;
  }
}

}  // namespace escala::attn
