#pragma once

// The wire model as JSON values, for the server's own translation units (it
// includes nlohmann/json; wire.h is the light header for everyone else).

#include <string>

#include <nlohmann/json.hpp>

#include "base/public_id.h"
#include "store/store.h"

namespace waystone::wire {

// The summary of one instance as used in lists and answers.
nlohmann::json InstanceSummary(const InstanceRecord& instance);

// One alert, with the business key of its instance and its public id.
nlohmann::json Alert(const AlertRecord& alert, const std::string& instance_key,
                     const PublicIds& ids);

// One request a step sent: whether it left, on which connection, what came back.
nlohmann::json Attempt(const AttemptRecord& attempt);

// What gc left of an instance.
nlohmann::json Tombstone(const TombstoneRecord& tombstone);

}  // namespace waystone::wire
