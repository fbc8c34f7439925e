#include "engine/drive/call_metrics.h"

#include "base/mutex.h"

namespace waystone {

void CallMetrics::RecordLatency(CallPhase phase, double seconds) {
  MutexLock lock(mu_);
  CallLatency& latency = phases_[static_cast<size_t>(phase)];
  for (size_t i = 0; i < kCallLatencyBuckets.size(); ++i) {
    if (seconds <= kCallLatencyBuckets[i]) ++latency.buckets[i];
  }
  ++latency.count;
  latency.sum_seconds += seconds;
}

void CallMetrics::RecordOutcome(CallPhase phase, ErrorClass error_class) {
  MutexLock lock(mu_);
  ++outcomes_[static_cast<size_t>(phase)][static_cast<size_t>(error_class) % 4];
}

uint64_t CallMetrics::OutcomeCount(CallPhase phase, ErrorClass error_class) const {
  MutexLock lock(mu_);
  return outcomes_[static_cast<size_t>(phase)][static_cast<size_t>(error_class) % 4];
}

CallLatency CallMetrics::LatencySnapshot(CallPhase phase) const {
  MutexLock lock(mu_);
  return phases_[static_cast<size_t>(phase)];
}

}  // namespace waystone
