#pragma once

// A call's rate slot between the runner that admitted it and whoever sends it: the
// send waits for the slot and, when it comes too late for it (a stalled process, a
// loaded machine), retakes one instead of sending on the old one (model/target_gate.h,
// LateSlotTolerance): held calls are never sent together.

#include <string>

#include "base/clock.h"
#include "model/target_gate.h"

namespace waystone {

class Store;

struct RateSlot {
  Millis send_at = 0;  // no earlier than this clock time; 0: at once
  std::string tenant;  // the target whose rate limit gave the slot (limits.rate > 0)
  std::string target;
  TargetLimits limits;
};

// When a call holding `slot` leaves, seen at `now`: now when it may go (on time, or
// no rate limit), else a later time to look again, `slot.send_at` (its slot, or a new
// one taken from `store` because the old one passed). A store that cannot answer
// lets it go now, on the slot it was given.
Millis NextSendTime(Store& store, RateSlot& slot, Millis now);

// For a sender that waits itself: sleeps on `clock` until the call may go.
void AwaitRateSlot(Store& store, const Clock& clock, RateSlot& slot);

}  // namespace waystone
