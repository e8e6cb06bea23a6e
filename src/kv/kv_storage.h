// The K/V pools themselves: per storage layer, K and V as [num_blocks, block_size, h_kv, d] in the
// cache dtype, plus the scales of quantized formats (int8: [num_blocks, block_size, h_kv];
// fp8: [num_blocks, h_kv]), exactly as attention.h reads them.
//
// fp8 block scale policy (appends to a partly filled block): the scale of (block, head) is the
// smallest power of two >= max|x| / 448 over the tokens written so far. When a token arrives with
// a larger max, the block's earlier tokens of that head are re-encoded at the new scale; since the
// ratio of two scales is a power of two, re-encoding a normal e4m3 value is exact (an exponent
// shift), so every element carries one rounding whatever the order of appends: |x - x'| <=
// |x| / 16 (3 mantissa bits) + 2 * scale / 1024 (values pushed into the subnormal range). A
// power-of-two scale costs nothing in relative precision (e4m3 is floating point); it only moves
// the subnormal threshold by at most 2x. The re-encode touches at most block_size - 1 rows, and
// only when the max grows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "escala/dtype.h"

namespace escala::kv {

class KvStorage {
 public:
  // `slots`: storage layers (layers per group); every group's layer j uses storage layer j. 0 slots:
  // no host pools (metadata-only cache); every method is then a no-op.
  KvStorage(int32_t slots, int32_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
            DType dtype, bool hadamard_keys);

  DType dtype() const { return dtype_; }
  int64_t row_elems() const { return int64_t(h_kv_) * d_; }                // one token slot
  int64_t page_elems() const { return int64_t(block_size_) * row_elems(); }  // one block
  bool allocated() const { return slots_ > 0; }
  const uint8_t* k(int32_t j) const { return allocated() ? k_[j].get() : nullptr; }
  const uint8_t* v(int32_t j) const { return allocated() ? v_[j].get() : nullptr; }
  const float* k_scale(int32_t j) const { return k_scale_.empty() ? nullptr : k_scale_[j].data(); }
  const float* v_scale(int32_t j) const { return v_scale_.empty() ? nullptr : v_scale_[j].data(); }

  // A freshly allocated block: fp8 scales start at 0 (no token yet).
  void reset_block(int32_t block);
  // Copy-on-write: the first `tokens` slots of every storage layer, K and V, with their scales.
  void copy_block(int32_t src, int32_t dst, int32_t tokens);
  // Writes one token: k and v are [h_kv, d] f32. Rotates K when enabled, quantizes.
  void write(int32_t j, int32_t block, int32_t slot, const float* k, const float* v);
  // Dequantized element (tests, debugging).
  float load(int32_t j, bool is_v, int32_t block, int32_t slot, int32_t head, int32_t c) const;

 private:
  void store_row(uint8_t* base, std::vector<float>& scales, int32_t block, int32_t slot, int32_t head,
                 const float* x);
  int32_t slots_, num_blocks_, block_size_, h_kv_, d_;
  DType dtype_;
  bool hadamard_;
  size_t eb_;
  std::vector<std::unique_ptr<uint8_t[]>> k_, v_;
  std::vector<std::vector<float>> k_scale_, v_scale_;
  std::vector<float> no_scales_;  // float formats: store_row never touches it
};

}  // namespace escala::kv
