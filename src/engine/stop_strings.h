// Stop strings over streamed text: the text that is final (can be shown) and the text held back
// because the next token could still complete a stop string. Shared by generate() and the engine.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace escala::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {}) : stops_(std::move(stops)) {}

  // Appends newly decoded text. Returns the text that became final; `stopped` turns true when a
  // stop string appeared (the returned text then ends just before it, and nothing follows).
  std::string push(std::string_view text);
  // The held-back text (call at the end when no stop string completed).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

// Length of the longest suffix of `text` that is a proper prefix of one of `stops`.
size_t stop_prefix_suffix(std::string_view text, const std::vector<std::string>& stops);

}  // namespace escala::engine
