// Strict parsing of command-line values and the one-line error report shared by the subcommands.
// Numbers are taken as strings and parsed here, so that "12abc", "1e3" or an overflow is our own
// one-line error (exit 1) rather than a conversion message from the argument parser.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "escala/status.h"

namespace escala::cli {

// A decimal integer in [lo, hi]: optional '-', digits, nothing else.
inline Result<int64_t> parse_int(std::string_view text, std::string_view flag,
                                 int64_t lo = std::numeric_limits<int64_t>::min(),
                                 int64_t hi = std::numeric_limits<int64_t>::max()) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const bool plain = !text.empty() && (text[0] == '-' || (text[0] >= '0' && text[0] <= '9'));
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (!plain || ptr != end || ec == std::errc::invalid_argument)
    return Status::error(fmt::format("{}: '{}' is not an integer", flag, text));
  if (ec == std::errc::result_out_of_range)
    return Status::error(fmt::format("{}: {} does not fit in a signed 64-bit integer", flag, text));
  if (v < lo || v > hi) {
    if (hi == std::numeric_limits<int64_t>::max())
      return Status::error(fmt::format("{}: {} is out of range (must be >= {})", flag, text, lo));
    return Status::error(fmt::format("{}: {} is out of range (must be in [{}, {}])", flag, text, lo, hi));
  }
  return v;
}

// A finite decimal number (fixed or scientific notation).
inline Result<double> parse_number(std::string_view text, std::string_view flag) {
  double v = 0;
  const char* end = text.data() + text.size();
  const bool plain = !text.empty() && (text[0] == '-' || text[0] == '.' || (text[0] >= '0' && text[0] <= '9'));
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (!plain || ptr != end || ec != std::errc() || !std::isfinite(v))
    return Status::error(fmt::format("{}: '{}' is not a finite number", flag, text));
  return v;
}

// Prints "escala: error: <message>" as one line on stderr; returns the exit code 1.
inline int report_error(const Status& st) {
  std::string msg = st.message();
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "escala: error: %s\n", msg.c_str());
  return 1;
}

}  // namespace escala::cli
