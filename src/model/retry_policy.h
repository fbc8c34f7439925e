#pragma once

#include <cstdint>
#include <optional>

#include "base/clock.h"

namespace waystone {

class Random;

// Exponential backoff with full jitter and a firm attempt limit. A value type.
struct RetryPolicy {
  int max_attempts = 5;                // attempts in all, the first included
  Millis initial_interval = 200;       // ceiling of the first delay
  Millis max_interval = 10'000;        // the ceiling never grows past this
  double multiplier = 2.0;             // ceiling growth per attempt
  Millis max_retry_after = 3'600'000;  // a server's Retry-After is honoured up to this

  bool operator==(const RetryPolicy&) const = default;

  // Returns true when `attempts_made` attempts leave no attempt for a retry.
  bool Exhausted(int attempts_made) const { return attempts_made >= max_attempts; }

  // Returns the backoff ceiling after `attempts_made` (>= 1) failed attempts:
  // min(max_interval, initial_interval * multiplier^(attempts_made - 1)).
  Millis Ceiling(int attempts_made) const;

  // Returns the delay before the next attempt: uniform in [0, Ceiling] (full
  // jitter), but never less than the server's Retry-After (capped at max_retry_after).
  Millis NextDelay(int attempts_made, std::optional<Millis> retry_after, Random& random) const;
};

}  // namespace waystone
