#pragma once

#include <memory>

#include "base/clock.h"

namespace waystone {

// A FakeClock behind the Clock interface, for code that must not instantiate
// FakeClock itself: the public library, whose instantiations of the standard
// library's waits (FakeClock::WaitFor) would be exported from it.
std::unique_ptr<Clock> MakeManualClock(Millis start);

// Moves a clock MakeManualClock made forward by `by`.
void AdvanceManualClock(const Clock& clock, Millis by);

}  // namespace waystone
