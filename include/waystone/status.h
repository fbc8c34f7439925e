#pragma once

// Status and Result<T>: how every call of Waystone's public API reports failure.
// No exceptions cross the API; no third-party type appears in it.
//
// Thread safety: a Status or Result is a value; distinct objects may be used from
// distinct threads, one object from one thread at a time (like std::string).

#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

#include "waystone/export.h"

namespace waystone::api {

class [[nodiscard]] WAYSTONE_API Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,  // bad input: a definition, an input document, an option
    kNotFound,         // no such workflow or instance
    kAlreadyExists,
    kFailedPrecondition,  // refused in the current state (e.g. the same key, other input)
    kUnavailable,         // the database cannot be reached now; try again
    kDeadlineExceeded,
    kInternal,
    // A workflow's run stops here (a timer, an operator, another worker): return it.
    kAborted,
  };

  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  // What went wrong, naming the file, line, field or step where there is one.
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// A value, or the Status that says why there is none. Reading the value of a
// Result that holds none aborts the program (as dereferencing a null pointer
// would, but always, and at once).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit, as absl::StatusOr
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Status(Status::Code::kInternal, "Result built from an OK Status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  // The value; only when ok().
  T& value() & { return Checked(); }
  const T& value() const& { return Checked(); }
  T&& value() && { return std::move(Checked()); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return Checked(); }
  T&& operator*() && { return std::move(Checked()); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &Checked(); }

 private:
  T& Checked() {
    if (!value_) std::abort();  // the value of an error: status() says what it is
    return *value_;
  }
  const T& Checked() const {
    if (!value_) std::abort();
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace waystone::api
