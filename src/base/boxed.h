#pragma once

#include <memory>
#include <utility>

namespace waystone {

// A T kept on the heap and allocated only once it is given a value: for the parts of
// a small, often-copied struct that most copies leave empty (an HTTP request's TLS
// identity, say, of which thousands may be under way at once). An empty box reads as
// a default T. Copies are deep.
template <typename T>
class Boxed {
 public:
  Boxed() = default;
  Boxed(T value) : value_(std::make_unique<T>(std::move(value))) {}  // NOLINT: implicit
  Boxed(const Boxed& other) : value_(other.value_ ? std::make_unique<T>(*other.value_) : nullptr) {}
  Boxed(Boxed&&) noexcept = default;
  Boxed& operator=(const Boxed& other) {
    if (this != &other) value_ = other.value_ ? std::make_unique<T>(*other.value_) : nullptr;
    return *this;
  }
  Boxed& operator=(Boxed&&) noexcept = default;
  Boxed& operator=(T value) {
    value_ = std::make_unique<T>(std::move(value));
    return *this;
  }

  const T& operator*() const { return value_ ? *value_ : Empty(); }
  const T* operator->() const { return &**this; }
  // The value to change in place (allocated now if the box was empty).
  T& Mutable() {
    if (!value_) value_ = std::make_unique<T>();
    return *value_;
  }

  bool operator==(const Boxed& other) const { return **this == *other; }

 private:
  static const T& Empty() {
    static const T empty{};
    return empty;
  }

  std::unique_ptr<T> value_;
};

}  // namespace waystone
