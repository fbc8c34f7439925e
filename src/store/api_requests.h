#pragma once

// Store-internal: the dialect-neutral rule of an Idempotency-Key claim.

#include <optional>
#include <string>

#include "model/records.h"

namespace waystone {

// Decides a claim of `request` against the record stored under its key, if any:
// kNew when there is none, it expired, or it is in flight since before
// `stale_before` or by `dead_owner`; else what the stored record says. Pure: each
// store applies it inside its transaction and writes the claim when kNew.
ApiRequestClaim DecideApiRequest(const std::optional<ApiRequestRecord>& stored,
                                 const ApiRequestRecord& request, Millis stale_before,
                                 const std::string& dead_owner);

}  // namespace waystone
