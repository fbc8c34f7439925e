#pragma once

// Refusals a batch may take as one item's alone, marked so that the database's own
// errors of the same code are never taken for them.

#include <string>

#include "absl/status/status.h"

namespace waystone {

// The refusal of an exclusive idempotency claim (a notification's delivery identity)
// that another instance step holds. AlreadyExists, marked so that a unique violation
// elsewhere in the same change (an event, an attempt) is never taken for it.
absl::Status DeliveryOwnedError(const std::string& message);

// Returns true for the status DeliveryOwnedError made (and only for it).
bool IsDeliveryOwned(const absl::Status& status);

// A lease (an instance's, a delivery's) found no longer held, before anything of its
// item was written. Aborted, marked: PostgreSQL's lock timeout answers Aborted too,
// and only this may undo only its own item where the batch took no savepoint.
absl::Status LeaseLostError(const std::string& message);

// Returns true for the status LeaseLostError made (and only for it).
bool IsLeaseLost(const absl::Status& status);

}  // namespace waystone
