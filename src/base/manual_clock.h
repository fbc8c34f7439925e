#pragma once

#include <memory>

#include "base/clock.h"

namespace waystone {

// A clock a test moves (a FakeClock's time), behind the Clock interface: its
// SleepFor waits in real time, so only the test moves it. Made here for code that
// must not instantiate FakeClock itself: the public library, whose instantiations of
// the standard library's waits would be exported from it. Thread-safe.
std::unique_ptr<Clock> MakeManualClock(Millis start);

// Moves a clock MakeManualClock made forward by `by`.
void AdvanceManualClock(const Clock& clock, Millis by);

}  // namespace waystone
