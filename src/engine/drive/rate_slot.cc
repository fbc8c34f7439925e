#include "engine/drive/rate_slot.h"

#include <stop_token>

#include "store/store.h"

namespace waystone {

Millis NextSendTime(Store& store, RateSlot& slot, Millis now) {
  if (slot.send_at > now) return slot.send_at;
  if (!SlotPassed(slot.limits, slot.send_at, now)) return now;
  TargetCallAsk ask;
  ask.tenant = slot.tenant;
  ask.target = slot.target;
  ask.limits = slot.limits;
  ask.now = now;
  absl::StatusOr<Millis> retaken = store.RetakeRateSlot(ask);
  if (!retaken.ok()) {
    slot.send_at = now;
    return now;
  }
  slot.send_at = *retaken;
  return *retaken;
}

void AwaitRateSlot(Store& store, const Clock& clock, RateSlot& slot) {
  // Each turn the slot is later than the last (a retaken slot is at least now), so
  // this ends unless the process keeps missing the slots it retakes.
  for (Millis now = clock.NowMillis(), at; (at = NextSendTime(store, slot, now)) > now;
       now = clock.NowMillis()) {
    clock.SleepFor(at - now, std::stop_token());
  }
}

}  // namespace waystone
