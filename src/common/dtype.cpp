#include "escala/dtype.h"

namespace escala {

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::kF32;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "int8" || name == "i8" || name == "q8") return DType::kI8;
  if (name == "fp8" || name == "fp8_e4m3" || name == "e4m3") return DType::kFp8E4M3;
  return std::nullopt;
}

}  // namespace escala
