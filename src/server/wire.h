#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "base/public_id.h"
#include "store/store.h"

namespace waystone {

// The JSON wire model shared by the HTTP API and `waystone status --json`.

// Returns one instance in full: its state and reason, steps (state, attempts,
// external id, last error and class, resolution, next retry), alerts, audit trail and
// event deliveries.
// Alert ids are public ids (`ids`), never database ids.
absl::StatusOr<std::string> InstanceViewJson(Store& store, const InstanceRecord& instance,
                                             const PublicIds& ids);

// The public ids of this database (its server key "public_ids").
absl::StatusOr<PublicIds> PublicIdsOf(AccessStore& store);

// Returns the summary of one instance as used in lists.
std::string InstanceSummaryJson(const InstanceRecord& instance);

// Formats milliseconds since the epoch as RFC 3339 UTC ("" for 0).
std::string Rfc3339(Millis at);

}  // namespace waystone
