#pragma once

#include <string_view>

namespace waystone {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Writes one line to stderr when `level` is at or above the threshold taken from
// WAYSTONE_LOG (debug|info|warning|error; default warning). Thread-safe.
void Log(LogLevel level, std::string_view message);

// Overrides the threshold (the CLI's --verbose).
void SetLogThreshold(LogLevel level);

}  // namespace waystone
