#pragma once

#include <string>

#include "store/store.h"

namespace waystone {

// Returns a lease owner name for this process: "<host>/<pid>/<nonce>".
std::string MakeOwnerName(const std::string& nonce);

// Returns true when `owner` names a process on this host that no longer exists.
bool IsDeadLocalOwner(const std::string& owner);

// Ends the leases of owners on this host whose process no longer exists, so a
// restarted worker does not wait for a dead one's leases to expire. Owners on
// other hosts are left to lease expiry. Returns how many owners were reaped.
absl::StatusOr<int> ReapDeadLocalOwners(LeaseStore& store, Millis now);

}  // namespace waystone
