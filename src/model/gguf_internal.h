// Helpers shared by the GGUF reader, accessors and writer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "escala/gguf.h"

namespace escala::model {

// Bytes of one element of a fixed-size value type; 0 for strings and arrays.
uint64_t gguf_fixed_size(GgufValueType t);

// A key or name as it can be printed in an error: non-printable bytes escaped, long ones cut.
std::string printable(std::string_view s);

}  // namespace escala::model
