#include "engine/call_metrics.h"

#include <mutex>

namespace waystone {
namespace {

struct Histograms {
  std::mutex mu;
  std::array<CallLatency, kCallPhaseNames.size()> phases;  // guarded by mu
  std::array<std::array<uint64_t, 4>, kCallPhaseNames.size()> outcomes{};  // guarded by mu
};

Histograms& Get() {
  static Histograms* histograms = new Histograms();  // never destroyed: used until exit
  return *histograms;
}

}  // namespace

void RecordCallLatency(CallPhase phase, double seconds) {
  Histograms& h = Get();
  std::lock_guard<std::mutex> lock(h.mu);
  CallLatency& latency = h.phases[static_cast<size_t>(phase)];
  for (size_t i = 0; i < kCallLatencyBuckets.size(); ++i) {
    if (seconds <= kCallLatencyBuckets[i]) ++latency.buckets[i];
  }
  ++latency.count;
  latency.sum_seconds += seconds;
}

void RecordCallOutcome(CallPhase phase, ErrorClass error_class) {
  Histograms& h = Get();
  std::lock_guard<std::mutex> lock(h.mu);
  ++h.outcomes[static_cast<size_t>(phase)][static_cast<size_t>(error_class) % 4];
}

uint64_t CallOutcomeCount(CallPhase phase, ErrorClass error_class) {
  Histograms& h = Get();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.outcomes[static_cast<size_t>(phase)][static_cast<size_t>(error_class) % 4];
}

CallLatency CallLatencySnapshot(CallPhase phase) {
  Histograms& h = Get();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.phases[static_cast<size_t>(phase)];
}

}  // namespace waystone
