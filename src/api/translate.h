#pragma once

// Inside the API library only: from the engine's types to the public ones.

#include "absl/status/status.h"
#include "waystone/status.h"

namespace waystone::api {

Status FromAbsl(const absl::Status& status);

}  // namespace waystone::api
