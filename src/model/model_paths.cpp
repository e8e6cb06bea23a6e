#include "model/model_paths.h"

#include <fmt/format.h>

#include <filesystem>
#include <system_error>
#include <vector>

namespace escala::model {

Result<std::string> default_model_path() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path()) candidates.push_back(exe.parent_path() / ".." / "models" / kDefaultModelFile);
  candidates.push_back(fs::path("models") / kDefaultModelFile);
  std::string tried;
  for (const fs::path& p : candidates) {
    if (fs::is_regular_file(p, ec)) return p.lexically_normal().string();
    tried += (tried.empty() ? "" : ", ") + p.lexically_normal().string();
  }
  return Status::error(fmt::format("no --model given and the default model {} is not in {}; pass --model FILE",
                                   kDefaultModelFile, tried));
}

}  // namespace escala::model
