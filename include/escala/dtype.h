// Element types of tensors and KV-cache storage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace escala {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI8,       // int8 with a float scale per (token, head) (KV cache only)
  kFp8E4M3,  // fp8 e4m3 with a float scale per (block, head) (KV cache only)
};

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kI8:
    case DType::kFp8E4M3: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI8: return "int8";
    case DType::kFp8E4M3: return "fp8";
  }
  return "?";
}

constexpr bool is_quantized(DType t) { return t == DType::kI8 || t == DType::kFp8E4M3; }

std::optional<DType> parse_dtype(std::string_view name);

}  // namespace escala
