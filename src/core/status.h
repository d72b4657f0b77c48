// Status and Expected<T>: the error currency across module boundaries.
// Recoverable conditions (bad input, corrupt file, exhausted resources) travel as values;
// broken invariants use DI_CHECK (check.h) instead. Not an exception hierarchy.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace deepinfer {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // a caller-supplied value is out of range or malformed
  kNotFound,          // a file or tensor that must exist does not
  kCorrupt,           // a file exists but its contents violate its format
  kUnsupported,       // well-formed but not handled (unknown architecture, dtype)
  kOutOfRange,        // a request does not fit (context, memory)
  kResourceExhausted,
  kCancelled,
  kInternal,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code name>: <message>"
  std::string to_string() const;

  // Prefixes context ("while loading X: ") to the message; keeps the code.
  Status with_context(const std::string& context) const {
    if (is_ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_error(StatusCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

// A value or an error Status (std::expected arrives only in C++23).
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}                       // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {                 // NOLINT: implicit by design
    assert(!std::get<Status>(v_).is_ok() && "Expected built from an ok Status");
  }

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &std::get<T>(v_); }
  const T* operator->() const { return &std::get<T>(v_); }
  // The error, or an ok Status when a value is held.
  Status status() const { return has_value() ? Status::ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace deepinfer

// Propagate a non-ok Status out of the enclosing function.
#define DI_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::deepinfer::Status di_status_ = (expr);         \
    if (!di_status_.is_ok()) return di_status_;      \
  } while (0)

#define DI_CONCAT_INNER(a, b) a##b
#define DI_CONCAT(a, b) DI_CONCAT_INNER(a, b)
// DI_ASSIGN_OR_RETURN(auto x, f()); — binds the value or returns the error.
#define DI_ASSIGN_OR_RETURN(lhs, expr) DI_ASSIGN_OR_RETURN_IMPL(DI_CONCAT(di_expected_, __LINE__), lhs, expr)
#define DI_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.has_value()) return tmp.status();     \
  lhs = std::move(tmp).value()
