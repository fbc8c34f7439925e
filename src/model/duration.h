#pragma once

#include <optional>
#include <string_view>

#include "base/clock.h"

namespace waystone {

// Parses "250ms", "2s", "1.5s", "3m", "1h" or a bare number of milliseconds.
// Returns nullopt for anything else, including negative values.
std::optional<Millis> ParseDuration(std::string_view text);

}  // namespace waystone
