#pragma once

#include <string>
#include <string_view>

namespace waystone {

// Kills this process with SIGKILL at a named boundary: "<point>:<step>".
// Points: before-claim:instance (RunUntilRest, before it claims), before-step (the step is due,
// nothing recorded for it yet), before-send (every call, lookup and compensation: the lease
// checked, the request not yet handed to the HTTP client), before-call (the `running` checkpoint
// committed), after-call (response received, nothing recorded yet), after-checkpoint (the call's
// outcome committed), before-lookup, after-lookup, before-compensate, after-compensate,
// after-compensate-checkpoint; before-decide, after-decide (an approval's decision about to commit,
// committed and not yet answered); batch-applied:<instance key> (a batch's action committed on the
// instance, its item not yet recorded); before-deliver, after-deliver:<sink> (the relay);
// during-wait, after-signal (verify's worker, around the event or decision it
// delivers to a waiting step).
//
// Two ways to arm it:
// - ArmCrashPoint, always compiled: `waystone verify` arms the worker process it
//   runs (never a production process: nothing else calls it);
// - the test hook WAYSTONE_CRASH_AT="<point>:<step>", and WAYSTONE_PAUSE_AT=
//   "<point>:<step>=<milliseconds>" that pauses the calling thread (so tests can
//   make a worker outlive its lease), compiled only with WAYSTONE_CRASH_POINTS=ON.
void CrashPoint(std::string_view point, std::string_view step);

// Kills this process at the `occurrence`-th (1-based) time CrashPoint is reached
// with "<point>:<step>" == `at`. Call before any thread reaches a crash point. (The
// relay's "before-deliver"/"after-deliver" are reached once per batch: a sink's lanes
// of one claim go in batches, to webhooks and NATS; a lane of more claims reaches them
// once per delivery.)
void ArmCrashPoint(std::string at, int occurrence);

// True when the test-only switch `name` is on (WAYSTONE_TEST_SWITCH holds it,
// comma-separated), in builds with WAYSTONE_CRASH_POINTS=ON only; false otherwise.
// For tests that prove a check catches a deliberately broken engine.
bool TestSwitch(std::string_view name);

}  // namespace waystone
