// Weight tensor types as GGUF stores them (ggml block layouts), their (de)quantizers, and the
// quantized matrix products the model runtime uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "escala/status.h"

namespace escala::model {

// The numeric ids are ggml's `ggml_type` values, as written in GGUF tensor infos.
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

inline constexpr TensorType kAllTensorTypes[] = {
    TensorType::kF32,  TensorType::kF16,  TensorType::kBF16, TensorType::kQ8_0,
    TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1,
    TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K,
};

// The type with ggml id `id`, if Escala supports it.
std::optional<TensorType> tensor_type_from_id(uint32_t id);
std::string_view tensor_type_name(TensorType t);                 // "q4_1", "f32", ...
std::optional<TensorType> parse_tensor_type(std::string_view name);  // case-insensitive

// Elements per block (1 for plain floats, 32 or 256 for quantized types) and bytes per block.
int64_t block_elems(TensorType t);
int64_t block_bytes(TensorType t);
inline bool is_quantized(TensorType t) { return block_elems(t) > 1; }

// Bytes of one row of `n` elements; nullopt when `n` is not a whole number of blocks or the
// size overflows.
std::optional<uint64_t> row_bytes(TensorType t, int64_t n);

// Converts `n` elements (a whole number of blocks) between f32 and type `t`.
void dequantize_row(TensorType t, const void* src, float* dst, int64_t n);
void quantize_row(TensorType t, const float* src, void* dst, int64_t n);

// A read-only view of a 2-D weight: `rows` rows of `cols` elements, rows `row_stride` bytes apart
// (GGUF's ne0 = cols, ne1 = rows). y = W x computes y[r] = sum_c W[r][c] x[c].
struct WeightView {
  TensorType type = TensorType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t row_stride = 0;  // 0: packed rows (row_bytes(type, cols))
};

// Types with a SIMD kernel: q4_0, q4_1, q8_0, q4_K, q6_K (integer dot products, activations
// quantized to 8 bits on the fly; AVX-512 VNNI when the CPU has it, else Highway) and f32/f16
// (float dot). bf16, q5_0, q5_1 and q5_K go through dequantize + f32 dot: correct, slower.
bool has_fast_kernel(TensorType t);

// y[rows] = W x[cols]. `threads` <= 0: OpenMP's default; small products use fewer threads
// (at least 64K multiply-adds each). Errors on a bad view or null pointers only. Activation
// buffers are kept per calling thread and reused.
Status matvec(const WeightView& w, const float* x, float* y, int threads = 0);

// Y[m][rows] = X[m][cols] W^T for m activation rows (X row-major with stride cols, Y with stride
// rows) — the prefill product: weights are streamed once for the whole batch.
Status matmul(const WeightView& w, const float* x, int64_t m, float* y, int threads = 0);

// Reference: dequantize each row, then accumulate in double. Tests and the benchmark only.
void matmul_reference(const WeightView& w, const float* x, int64_t m, float* y);

}  // namespace escala::model
