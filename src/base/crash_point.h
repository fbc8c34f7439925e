#pragma once

#include <string_view>

namespace waystone {

// Kills this process with SIGKILL when WAYSTONE_CRASH_AT equals "<point>:<step>"
// (for example "before-call:create-order"). Tests use it to crash a worker at an
// exact place; builds configured with WAYSTONE_CRASH_POINTS=OFF compile it to nothing.
// Points: before-call, before-send (every call, lookup and compensation: the lease
// checked, the request not yet handed to the HTTP client), after-call (response
// received, nothing recorded yet),
// before-compensate, after-compensate; before-decide, after-decide (an approval's
// decision about to commit, committed and not yet answered); batch-applied:<instance
// key> (a batch's
// action committed on the instance, its item not yet recorded).
//
// Likewise pauses the calling thread when WAYSTONE_PAUSE_AT equals
// "<point>:<step>=<milliseconds>", so tests can make a worker outlive its lease.
void CrashPoint(std::string_view point, std::string_view step);

}  // namespace waystone
