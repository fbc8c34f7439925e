#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/clock.h"

namespace waystone {

// Formats milliseconds since the epoch as RFC 3339 UTC with milliseconds,
// e.g. "2026-11-29T12:00:00.123Z".
std::string FormatRfc3339(Millis at);

// Parses an RFC 3339 timestamp ("2026-11-29T12:00:00Z", optional fraction and
// numeric offset) to milliseconds since the epoch; nullopt when malformed.
std::optional<Millis> ParseRfc3339(std::string_view text);

}  // namespace waystone
