#pragma once

// How fast a test target received calls, from the arrival times it records.

#include <algorithm>
#include <cstddef>
#include <vector>

namespace waystone::testing {

// Calls a second while calls queue for a rate limit: from the median time between an
// arrival and the one `span` after it. A span of several calls averages out the
// jitter of single sends: a busy machine (a sanitizer build beside other tests)
// sends one call tens of milliseconds late and the next on time, which bunches
// pairs, so the median of single gaps reads fast (29/s for a steady 20/s) while the
// pace is the limit's. (First to last arrival would also count the last instance's
// own wait to ask again: an instance's timing, not the limit's.)
inline double ReceivedRate(const std::vector<double>& arrivals, size_t span = 5) {
  span = std::min(span, arrivals.empty() ? size_t{1} : arrivals.size() - 1);
  if (span == 0) return 0;
  std::vector<double> per_call;
  for (size_t i = 0; i + span < arrivals.size(); ++i) {
    per_call.push_back((arrivals[i + span] - arrivals[i]) / static_cast<double>(span));
  }
  std::sort(per_call.begin(), per_call.end());
  const double median = per_call[per_call.size() / 2];
  return median > 0 ? 1.0 / median : 0;
}

// Calls a second from the first arrival to the last.
inline double OverallRate(const std::vector<double>& arrivals) {
  if (arrivals.size() < 2 || arrivals.back() <= arrivals.front()) return 0;
  return static_cast<double>(arrivals.size() - 1) / (arrivals.back() - arrivals.front());
}

}  // namespace waystone::testing
