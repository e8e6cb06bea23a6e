#include "kv/kv_storage.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/numeric.h"
#include "escala/kv_cache.h"
#include "kv/row_codec.h"

namespace escala::kv {

KvStorage::KvStorage(int32_t slots, int32_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                     DType dtype, bool hadamard_keys)
    : slots_(slots),
      num_blocks_(num_blocks),
      block_size_(block_size),
      h_kv_(num_kv_heads),
      d_(head_dim),
      dtype_(dtype),
      hadamard_(hadamard_keys),
      eb_(dtype_size(dtype)) {
  const size_t bytes = size_t(num_blocks) * size_t(page_elems()) * eb_;
  size_t scales = 0;
  if (dtype == DType::kI8) scales = size_t(num_blocks) * block_size * num_kv_heads;
  if (dtype == DType::kFp8E4M3) scales = size_t(num_blocks) * num_kv_heads;
  for (int32_t j = 0; j < slots; ++j) {
    // Uninitialised on purpose: a budget of many GiB is not touched until tokens are written.
    k_.push_back(std::make_unique_for_overwrite<uint8_t[]>(bytes));
    v_.push_back(std::make_unique_for_overwrite<uint8_t[]>(bytes));
    if (scales) {
      k_scale_.emplace_back(scales, 0.0f);
      v_scale_.emplace_back(scales, 0.0f);
    }
  }
}

void KvStorage::reset_block(int32_t block) {
  if (dtype_ != DType::kFp8E4M3) return;
  for (int32_t j = 0; j < slots_; ++j) {
    std::fill_n(k_scale_[j].begin() + int64_t(block) * h_kv_, h_kv_, 0.0f);
    std::fill_n(v_scale_[j].begin() + int64_t(block) * h_kv_, h_kv_, 0.0f);
  }
}

void KvStorage::copy_block(int32_t src, int32_t dst, int32_t tokens) {
  const size_t n = size_t(tokens) * size_t(row_elems()) * eb_;
  const size_t page = size_t(page_elems()) * eb_;
  for (int32_t j = 0; j < slots_; ++j) {
    std::memcpy(k_[j].get() + dst * page, k_[j].get() + src * page, n);
    std::memcpy(v_[j].get() + dst * page, v_[j].get() + src * page, n);
    if (dtype_ == DType::kI8) {
      const int64_t per = int64_t(block_size_) * h_kv_;
      std::copy_n(k_scale_[j].begin() + src * per, int64_t(tokens) * h_kv_, k_scale_[j].begin() + dst * per);
      std::copy_n(v_scale_[j].begin() + src * per, int64_t(tokens) * h_kv_, v_scale_[j].begin() + dst * per);
    } else if (dtype_ == DType::kFp8E4M3) {
      std::copy_n(k_scale_[j].begin() + int64_t(src) * h_kv_, h_kv_, k_scale_[j].begin() + int64_t(dst) * h_kv_);
      std::copy_n(v_scale_[j].begin() + int64_t(src) * h_kv_, h_kv_, v_scale_[j].begin() + int64_t(dst) * h_kv_);
    }
  }
}

void KvStorage::store_row(uint8_t* base, std::vector<float>& scales, int32_t block, int32_t slot, int32_t head,
                          const float* x) {
  const int64_t row = ((int64_t(block) * block_size_ + slot) * h_kv_ + head) * d_;
  switch (dtype_) {
    case DType::kI8:
      scales[(int64_t(block) * block_size_ + slot) * h_kv_ + head] =
          encode_i8_row(reinterpret_cast<int8_t*>(base) + row, x, d_);
      break;
    case DType::kFp8E4M3:
      encode_fp8_row(base + row, &scales[int64_t(block) * h_kv_ + head], x, d_, slot, [&](int32_t s) {
        return base + ((int64_t(block) * block_size_ + s) * h_kv_ + head) * d_;
      });
      break;
    default: encode_float_row(base + row * int64_t(eb_), dtype_, x, d_); break;
  }
}

void KvStorage::write(int32_t j, int32_t block, int32_t slot, const float* k, const float* v) {
  // Per thread, so that writes of different layers or sequences may run concurrently.
  thread_local std::vector<float> rotated;
  for (int32_t h = 0; h < h_kv_; ++h) {
    const float* kr = k + int64_t(h) * d_;
    if (hadamard_) {
      rotated.assign(kr, kr + d_);
      hadamard_rotate(rotated.data(), 1, d_);
      kr = rotated.data();
    }
    store_row(k_[j].get(), k_scale_.empty() ? no_scales_ : k_scale_[j], block, slot, h, kr);
    store_row(v_[j].get(), v_scale_.empty() ? no_scales_ : v_scale_[j], block, slot, h, v + int64_t(h) * d_);
  }
}

float KvStorage::load(int32_t j, bool is_v, int32_t block, int32_t slot, int32_t head, int32_t c) const {
  const uint8_t* base = is_v ? v_[j].get() : k_[j].get();
  const int64_t i = ((int64_t(block) * block_size_ + slot) * h_kv_ + head) * d_ + c;
  switch (dtype_) {
    case DType::kF32: return reinterpret_cast<const float*>(base)[i];
    case DType::kF16: return f16_to_f32(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::kBF16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(base)[i]);
    case DType::kI8: {
      const auto& s = is_v ? v_scale_[j] : k_scale_[j];
      return float(reinterpret_cast<const int8_t*>(base)[i]) * s[(int64_t(block) * block_size_ + slot) * h_kv_ + head];
    }
    case DType::kFp8E4M3: {
      const auto& s = is_v ? v_scale_[j] : k_scale_[j];
      return fp8e4m3_to_f32(base[i]) * s[int64_t(block) * h_kv_ + head];
    }
  }
  return 0.0f;
}

}  // namespace escala::kv
