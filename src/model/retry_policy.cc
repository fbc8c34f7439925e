#include "model/retry_policy.h"

#include <algorithm>
#include <cmath>

#include "base/random.h"

namespace waystone {

Millis RetryPolicy::Ceiling(int attempts_made) const {
  const int exponent = std::max(0, attempts_made - 1);
  const double raw = static_cast<double>(initial_interval) * std::pow(multiplier, exponent);
  if (!std::isfinite(raw) || raw >= static_cast<double>(max_interval)) return max_interval;
  return std::max<Millis>(0, static_cast<Millis>(raw));
}

Millis RetryPolicy::NextDelay(int attempts_made, std::optional<Millis> retry_after,
                              Random& random) const {
  Millis delay = random.UniformInclusive(Ceiling(attempts_made));
  if (retry_after.has_value()) {
    delay = std::max(delay, std::min(*retry_after, max_retry_after));
  }
  return delay;
}

}  // namespace waystone
