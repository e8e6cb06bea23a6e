#include "engine/stop_strings.h"

#include <algorithm>

namespace escala::engine {

size_t stop_prefix_suffix(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const auto& s : stops) {
    if (s.empty()) continue;
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.substr(text.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
  }
  return hold;
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  pending_ += text;
  // The earliest occurrence of any stop string wins.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    const size_t at = pending_.find(s);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    return out;
  }
  const size_t hold = stop_prefix_suffix(pending_, stops_);
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, out.size());
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  pending_.clear();
  return out;
}

}  // namespace escala::engine
