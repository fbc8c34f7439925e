#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"

namespace waystone {

// Measures the baseline of PostgreSQL benchmarks: single-row INSERT transactions
// per second committed over one libpq connection to `conninfo`, for about `duration`.
absl::StatusOr<double> MeasurePostgresRawCommitRate(const std::string& conninfo, Millis duration);

// Creates database `name` on the server of `server_conninfo` (dropping it first).
absl::Status RecreatePostgresDatabase(const std::string& server_conninfo, const std::string& name);

}  // namespace waystone
