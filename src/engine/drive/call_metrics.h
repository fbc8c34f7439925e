#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "base/mutex.h"
#include "model/states.h"

namespace waystone {

// Latency of the external calls this process made, by phase (call, lookup,
// compensate): a Prometheus histogram kept in memory. Counts start at zero when
// the process starts, like any Prometheus counter.
inline constexpr std::array<double, 12> kCallLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                               0.5,   1,    2.5,   5,    10,  30};

enum class CallPhase : uint8_t { kCall = 0, kLookup = 1, kCompensate = 2 };
inline constexpr std::array<std::string_view, 3> kCallPhaseNames = {"call", "lookup", "compensate"};

struct CallLatency {
  std::array<uint64_t, kCallLatencyBuckets.size()> buckets{};  // cumulative: <= bound
  uint64_t count = 0;
  double sum_seconds = 0;
};

// CallMetrics counts the external calls of the engine it is given to (through
// EngineOptions) and is read by whoever renders /metrics. Thread-safe.
class CallMetrics {
 public:
  // Records one call's duration.
  void RecordLatency(CallPhase phase, double seconds);
  // Records how one call ended: its error class (kNone for success).
  void RecordOutcome(CallPhase phase, ErrorClass error_class);
  // Returns the calls of one phase that ended with `error_class`, so far.
  uint64_t OutcomeCount(CallPhase phase, ErrorClass error_class) const;
  // Returns the histogram of one phase so far.
  CallLatency LatencySnapshot(CallPhase phase) const;

 private:
  mutable Mutex mu_;
  std::array<CallLatency, kCallPhaseNames.size()> phases_ ABSL_GUARDED_BY(mu_);
  std::array<std::array<uint64_t, 4>, kCallPhaseNames.size()> outcomes_ ABSL_GUARDED_BY(mu_){};
};

}  // namespace waystone
