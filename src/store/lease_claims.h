#pragma once

// Store-internal: what a claim of instances means, written once for both
// dialects. A dialect's claim statement returns, per row it took, the new epoch and
// the owner the row had before; the rules below turn those into leases and count
// takeovers (a row that still named an owner: its lease ran out unreleased).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "model/records.h"

namespace waystone {

// One row a claim took.
struct ClaimedRow {
  int64_t instance_id = 0;
  int64_t epoch = 0;
  std::string previous_owner;  // empty when the lease had been released
};

// Returns the leases `owner` now holds on `rows`; adds the takeovers among them
// to `*takeovers`.
std::vector<Lease> LeasesOf(const std::vector<ClaimedRow>& rows, const std::string& owner,
                            int64_t* takeovers);

// Returns the FailedPrecondition of a claim refused because `instance` is leased.
absl::Status LeasedByAnother(const InstanceRecord& instance);

}  // namespace waystone
