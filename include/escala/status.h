// Errors as values: every module boundary returns Status or Result<T>.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace escala {

// A one-line, human-readable error. Empty optional == success.
class Status {
 public:
  Status() = default;
  static Status error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return !message_.has_value(); }
  explicit operator bool() const { return ok(); }
  const std::string& message() const {
    static const std::string kOk = "ok";
    return message_ ? *message_ : kOk;
  }

 private:
  std::optional<std::string> message_;
};

inline Status ok_status() { return {}; }

// A value or an error (std::expected is C++23; this is the subset we need).
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status error) : v_(std::move(error)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return ok() ? Status{} : std::get<1>(v_); }
  const std::string& message() const { return std::get<1>(v_).message(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace escala

// Return early from a function returning Status/Result when `expr` fails.
#define ESCALA_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::escala::Status _escala_st = (expr);     \
    if (!_escala_st.ok()) return _escala_st;  \
  } while (0)

// Host-side argument check: returns a Status error built from a message.
#define ESCALA_CHECK_ARG(cond, ...)                                            \
  do {                                                                         \
    if (!(cond)) return ::escala::Status::error(::fmt::format(__VA_ARGS__));   \
  } while (0)
