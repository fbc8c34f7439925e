#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "base/mutex.h"

namespace waystone {

// Random is the injected source of randomness (jitter, event ids, trace ids).
// Implementations are thread-safe.
class Random {
 public:
  virtual ~Random() = default;
  // Returns a uniformly distributed 64-bit value.
  virtual uint64_t Next() = 0;

  // Returns a value uniformly distributed in [0, bound]; 0 when bound <= 0.
  int64_t UniformInclusive(int64_t bound);
  // Returns `bytes` random bytes as lowercase hex (2 * bytes characters).
  std::string Hex(int bytes);
  // Returns a UUID version 7 (RFC 9562 section 5.7) as 32 lowercase hex digits, no dashes:
  // 48 bits of `unix_ms`, then 74 random bits around the version and variant. Ids of later
  // milliseconds sort after earlier ones, so a unique index of them grows at its end instead
  // of at a random leaf per insert (one page per commit rather than one per row).
  std::string TimeOrderedHex(int64_t unix_ms);
};

// SeededRandom is a mutex-guarded mt19937_64; seeded from std::random_device
// unless a seed is given (tests). Thread-safe.
class SeededRandom final : public Random {
 public:
  SeededRandom();
  explicit SeededRandom(uint64_t seed) : engine_(seed) {}
  uint64_t Next() override;

 private:
  Mutex mu_;
  std::mt19937_64 engine_ ABSL_GUARDED_BY(mu_);
};

}  // namespace waystone
