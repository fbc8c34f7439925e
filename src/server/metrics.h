#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "store/store.h"

namespace waystone {

class CallMetrics;

// Renders the store's state in the Prometheus text exposition format: instances by
// state, open alerts, and per relay sink the delivered and failed counters, the
// pending and parked gauges, the delivery lag in seconds and whether it is disabled;
// and the external calls counted in `calls` (null: this process made none).
absl::StatusOr<std::string> RenderMetrics(Store& store, Millis now, const CallMetrics* calls);

// The Content-Type of what RenderMetrics renders.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace waystone
