#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "store/store.h"

namespace waystone {

// Renders the store's state in the Prometheus text exposition format: instances by
// state, open alerts, and per relay sink the delivered and failed counters, the
// pending and parked gauges, the delivery lag in seconds and whether it is disabled.
absl::StatusOr<std::string> RenderMetrics(Store& store, Millis now);

// The Content-Type of what RenderMetrics renders.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace waystone
