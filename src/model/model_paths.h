// Where the runtime finds its default model (no environment variables: see DESIGN.md).
#pragma once

#include <string>
#include <string_view>

#include "escala/status.h"

namespace escala::model {

inline constexpr std::string_view kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The default model: <exe_dir>/../models/<file> (the repository of a build folder), then
// ./models/<file>. An error lists where it looked and names --model.
Result<std::string> default_model_path();

}  // namespace escala::model
