#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace waystone {

// Signs a webhook per the Standard Webhooks specification: HMAC-SHA256 over
// "<id>.<timestamp>.<body>" keyed with the base64-decoded part of a "whsec_…"
// secret; returns "v1,<base64 signature>". InvalidArgument for a malformed secret.
absl::StatusOr<std::string> SignStandardWebhook(std::string_view secret, std::string_view id,
                                                long long timestamp, std::string_view body);

}  // namespace waystone
