#pragma once

// A definition's `redact:` list applied to what the API shows of one instance,
// for tokens without see_redacted (permissions.h). Inside the API server only.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "model/records.h"

namespace waystone {

struct ApiContext;
struct Principal;

constexpr char kRedactedValue[] = "[redacted]";

// Hides, in `shown`, the values `pointers` name in the instance's input and in its
// steps' results: at each pointer of shown["input"] (when present) the value is
// "[redacted]", and so is every string of `shown` that is one of those values or
// quotes one of 4 characters or more (an error message quoting a response body).
void RedactValues(const std::vector<std::string>& pointers, const InstanceRecord& instance,
                  const std::vector<StepRecord>& steps, nlohmann::json& shown);

// RedactValues with the instance's definition's list, unless `principal` may see
// redacted values in the instance's tenant.
void RedactFor(const ApiContext& ctx, const Principal& principal, const InstanceRecord& instance,
               const std::vector<StepRecord>& steps, nlohmann::json& shown);

// RedactFor for what is shown of `instance` where its steps are not at hand (a
// list row, an alert, a start's answer): reads them only when something is to be
// hidden (a token without see_redacted, a definition with a redact: list).
absl::Status RedactShownInstance(const ApiContext& ctx, const Principal& principal,
                                 const InstanceRecord& instance, nlohmann::json& shown);

// For what gc kept of a collected instance (a tombstone, answered to a start under its
// key): its definition and steps are gone, so what it redacted is unknown; the input
// hashes in `shown` are keyed for any principal without see_redacted (as RedactFor keys
// them where a definition redacts).
void KeyTombstoneHashes(const ApiContext& ctx, const Principal& principal,
                        const std::string& tenant, nlohmann::json& shown);

}  // namespace waystone
