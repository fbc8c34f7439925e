#pragma once

// Store-internal: the dialect-neutral rules of a start, applied by each store
// inside its transaction to the rows it read.

#include <string>

#include "absl/status/status.h"
#include "store/store.h"

namespace waystone {

// Checks a start against what already holds its business key (a live instance or
// a tombstone): OK when it is the same workflow with the same input, else
// FailedPrecondition naming both sides. A business key is unique per tenant.
absl::Status CheckStartAgainst(const std::string& held_by_workflow,
                               const std::string& held_input_hash, const NewInstance& start,
                               bool collected);

// Returns kDuplicateEvent when the inbox holds the event with the same data (or a
// claim made before data hashes were kept), kEventConflict otherwise.
StartOutcome DecideClaimedEvent(const InboxEntry& stored, const std::string& data_hash);

// Returns what an answer about a collected instance shows of it.
InstanceRecord InstanceFromTombstone(const TombstoneRecord& tombstone);

}  // namespace waystone
