#pragma once

#include <stop_token>

namespace waystone::cli {

// Blocks SIGTERM and SIGINT in this and every later thread and starts a thread
// that requests a stop on `source` when one arrives. Call before starting threads.
// Returns the token to watch. A second signal exits at once.
std::stop_token StopOnSignals();

}  // namespace waystone::cli
