#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"

namespace waystone {

// Measures the baseline that engine benchmarks are compared with: how many
// single-row INSERT transactions per second SQLite commits on a fresh file at
// `path` (WAL, the given synchronous mode), for about `duration`.
absl::StatusOr<double> MeasureSqliteRawCommitRate(const std::string& path,
                                                  const std::string& synchronous, Millis duration);

}  // namespace waystone
