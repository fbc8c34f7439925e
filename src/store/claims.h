#pragma once

// The refusal of an exclusive idempotency claim (a notification's delivery identity)
// that another instance step holds. AlreadyExists, marked so that a unique violation
// elsewhere in the same change (an event, an attempt) is never taken for it.

#include <string>

#include "absl/status/status.h"

namespace waystone {

absl::Status DeliveryOwnedError(const std::string& message);

// Returns true for the status DeliveryOwnedError made (and only for it).
bool IsDeliveryOwned(const absl::Status& status);

}  // namespace waystone
