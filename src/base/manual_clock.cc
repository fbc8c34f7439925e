#include "base/manual_clock.h"

namespace waystone {

std::unique_ptr<Clock> MakeManualClock(Millis start) { return std::make_unique<FakeClock>(start); }

void AdvanceManualClock(const Clock& clock, Millis by) {
  // Only MakeManualClock's clocks come here: a FakeClock, whose time is mutable.
  const_cast<FakeClock&>(static_cast<const FakeClock&>(clock)).Advance(by);
}

}  // namespace waystone
