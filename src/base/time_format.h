#pragma once

#include <string>

#include "base/clock.h"

namespace waystone {

// Formats milliseconds since the epoch as RFC 3339 UTC with milliseconds,
// e.g. "2026-11-29T12:00:00.123Z".
std::string FormatRfc3339(Millis at);

}  // namespace waystone
