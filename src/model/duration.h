#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/clock.h"

namespace waystone {

// Parses "250ms", "2s", "1.5s", "3m", "1h" or a bare number of milliseconds.
// Returns nullopt for anything else, including negative values.
std::optional<Millis> ParseDuration(std::string_view text);

// Formats a duration in the largest unit that divides it: "3d", "90s", "250ms".
std::string FormatDuration(Millis duration);

}  // namespace waystone
