// Shared between the per-target matmul kernels (quant_matmul.cpp, compiled once per SIMD
// target by Highway) and the dispatching code.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "escala/quant.h"

namespace escala::model {

// Activations quantized to 8-bit levels, stored widened to int16 so the kernels can use 16-bit
// multiply-add directly. `block` is the scale granularity: 32 for the 32-element weight formats
// (llama.cpp's q8_0/q8_1 counterpart), 256 for the K-quants (q8_K).
struct QuantizedActs {
  int64_t m = 0;      // rows
  int64_t k = 0;      // elements per row
  int64_t block = 32;
  std::vector<int16_t> q;     // m * k levels in [-127, 127]
  std::vector<float> d;       // m * (k / block) scales
  std::vector<float> s;       // m * (k / 32): scale * sum of the 32 levels (32-block rows only)
  std::vector<int32_t> bsum;  // m * (k / 32): sum of each 32 levels (256-block rows only)

  const int16_t* row_q(int64_t r) const { return q.data() + r * k; }
  const float* row_d(int64_t r) const { return d.data() + r * (k / block); }
  const float* row_s(int64_t r) const { return s.data() + r * (k / 32); }
  const int32_t* row_bsum(int64_t r) const { return bsum.data() + r * (k / 32); }
};

// Everything one kernel call needs: rows [row_begin, row_end) of W against all m activation rows.
struct MatmulArgs {
  WeightView w;
  const float* x = nullptr;          // m x cols, f32 (f32/f16 weights and the fallback)
  const QuantizedActs* acts = nullptr;  // quantized types with a fast kernel
  int64_t m = 0;
  float* y = nullptr;  // m x rows
};

}  // namespace escala::model

namespace escala::model {

// y_i = W_i x for several weights that read the same input (Q/K/V, gate/up): when they share a type
// and width, the activations are quantized once and every row of every weight runs in one parallel
// region (one barrier instead of one per weight); otherwise matmul() per weight.
Status matmul_group(std::span<const WeightView> ws, const float* x, int64_t m, std::span<float* const> ys,
                    int threads);

// ---- AVX-512 VNNI path (quant_matmul_vnni.cpp) for q4_0, q4_1, q8_0, q4_K and q6_K ----
//
// Activations as int8 in natural order, one scale per 32 elements (llama.cpp's q8_0 with the
// block sums of q8_1). Rows are interleaved in groups of kGroup, block by block: row t's block b is
// slot ((t / kGroup) * nb + b) * kGroup + t % kGroup, so a kernel over up to kGroup rows of one
// group reads each block's rows from one address (the last group's missing rows are never read).
struct VnniActs {
  static constexpr int64_t kGroup = 8;
  int64_t m = 0;
  int64_t nb = 0;         // 32-element blocks per row
  std::vector<int8_t> q;  // 32 levels per slot
  std::vector<float> d;   // per slot: activation scale
  std::vector<float> s;   // per slot: scale * sum of levels
};

// For q4_K and q6_K: int8 activations in natural order, one scale per 256 (llama.cpp's q8_K).
struct VnniActsK {
  int64_t m = 0;
  int64_t nsb = 0;            // 256-element super-blocks per row
  std::vector<int8_t> q;      // m * nsb * 256
  std::vector<float> d;       // m * nsb
  std::vector<int32_t> bsum;  // m * nsb * 16: sum of each 16 levels
};
void quantize_acts_vnni_k(const float* x, int64_t m, int64_t k, VnniActsK& a);
// Rows [row_begin, row_end) of y for w of type q4_K or q6_K.
void vnni_rows_k(const WeightView& w, const VnniActsK& a, float* y, int64_t row_begin,
                 int64_t row_end);

// True when this CPU has AVX-512 BW/VL/VNNI (checked once) and the path is enabled.
bool vnni_active();
// Tests turn the path off to compare it with the portable Highway kernels.
void set_vnni_enabled(bool enabled);
bool vnni_handles(TensorType t);
// Only when vnni_active(): these use AVX-512 themselves.
void quantize_acts_vnni(const float* x, int64_t m, int64_t k, VnniActs& a);

// A q4_0/q4_1/q8_0 weight stored once in the VNNI kernels' own layout (16 rows per slab, in the
// lanes), so a product reads it sequentially and transposes nothing. Same bits as the GGUF rows.
struct StoredWeight {
  TensorType type = TensorType::kF32;
  int64_t rows = 0, cols = 0;
  uint64_t row_stride = 0;  // of the view it was made from
  size_t bytes = 0;
  uint8_t* data = nullptr;  // 64-byte aligned
  StoredWeight() = default;
  StoredWeight(const StoredWeight&) = delete;
  StoredWeight& operator=(const StoredWeight&) = delete;
  ~StoredWeight();
};
// Stores w, keyed by w.data, when the VNNI path is active and w is q4_0/q4_1/q8_0; false when it
// did not (other type, no VNNI, already stored).
bool store_weight(const WeightView& w);
void release_stored(const void* data);
// The stored copy of w (same data pointer, type, shape and stride), or null.
std::shared_ptr<const StoredWeight> find_stored(const WeightView& w);

// Rows [row_begin, row_end) of y (m x w.rows) for w of type q4_0, q4_1 or q8_0, from `st` (w's
// stored copy; then row_begin must be a multiple of 16) or, when null, from w's rows.
void vnni_rows(const WeightView& w, const StoredWeight* st, const VnniActs& a, float* y, int64_t row_begin,
               int64_t row_end);

// The weights a model multiplies by, stored for the VNNI kernels for as long as this object lives
// (Model holds one). The products no longer read the GGUF mapping's pages of those weights, so the
// model drops them (GgufFile::release_pages) and the copy replaces them in memory.
class StoredWeights {
 public:
  StoredWeights() = default;
  StoredWeights(const StoredWeights&) = delete;
  StoredWeights& operator=(const StoredWeights&) = delete;
  ~StoredWeights();
  bool add(const WeightView& w);  // false (and no-op) when store_weight declines
  size_t bytes() const { return bytes_; }

 private:
  std::vector<const void*> keys_;
  size_t bytes_ = 0;
};

}  // namespace escala::model
