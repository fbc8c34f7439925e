#include "model/target_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/time_format.h"

namespace waystone {
namespace {

std::string Waiting(const TargetControl& control, std::string why) {
  // An operator's words must not read as the reason kept behind the wait.
  for (size_t at; (at = why.find(kBeforeWaiting)) != std::string::npos;) {
    why.replace(at, kBeforeWaiting.size(), "; ");
  }
  return std::string(kAwaitingTarget) + control.target + "': " + why;
}

std::string Rate(double rate) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", rate);
  return text;
}

// The time between two rate slots.
int64_t SlotMicros(const TargetLimits& limits) { return std::llround(1'000'000.0 / limits.rate); }

// The first free rate slot at `now`, in microseconds: the next one not given out, or
// now (an idle target saves up no slots).
int64_t FreeSlotMicros(const TargetControl& control, Millis now) {
  return std::max(control.next_slot_us, now * 1000);
}

// Gives out the slot at `slot_us` (the next one a slot later): when its call leaves.
Millis TakeSlot(TargetControl& control, const TargetLimits& limits, int64_t slot_us) {
  control.next_slot_us = slot_us + SlotMicros(limits);
  return (slot_us + 999) / 1000;
}

}  // namespace

Millis LateSlotTolerance(const TargetLimits& limits) {
  if (limits.rate <= 0) return 0;
  return std::max<Millis>(50, SlotMicros(limits) / 1000);
}

Millis RetakeSlot(TargetControl& control, const TargetLimits& limits, Millis now) {
  if (limits.rate <= 0) return now;
  control.updated_at = now;
  return TakeSlot(control, limits, FreeSlotMicros(control, now));
}

std::string PausedReasonPattern(const std::string& target) {
  std::string pattern;
  for (char c : std::string(kAwaitingTarget) + target + "': paused by ") {
    if (c == '%' || c == '_' || c == '\\') pattern += '\\';
    pattern += c;
  }
  return pattern + "%";
}

Admission Admit(TargetControl& control, const TargetLimits& limits, Millis now, Millis horizon,
                Millis call_lease) {
  Admission refused;
  if (control.paused) {
    refused.retry_at = now + 1000;  // a resume also wakes the waiting at once
    refused.reason =
        Waiting(control, "paused by " + control.paused_by + " at " +
                             FormatRfc3339(control.paused_at) + ": " + control.pause_reason);
    return refused;
  }
  bool probe = false;
  if (limits.breaker_failures > 0 && control.failures >= limits.breaker_failures) {
    if (now < control.open_until) {
      refused.retry_at = control.open_until;
      refused.reason = Waiting(control, "circuit open after " + std::to_string(control.failures) +
                                            " consecutive transient failures, until " +
                                            FormatRfc3339(control.open_until));
      return refused;
    }
    if (now < control.probe_until) {
      refused.retry_at = std::min(control.probe_until, now + 1000);
      refused.reason = Waiting(control, "circuit half-open, a probe call is under way");
      return refused;
    }
    probe = true;
  }
  if (limits.concurrency > 0 && control.calls >= limits.concurrency) {
    refused.retry_at = now + 200;
    refused.reason =
        Waiting(control, std::to_string(control.calls) + " calls under way, its concurrency cap");
    return refused;
  }
  Millis send_at = now;
  if (limits.rate > 0) {
    const int64_t slot_us = FreeSlotMicros(control, now);
    if (slot_us - now * 1000 > horizon * 1000) {
      refused.retry_at = slot_us / 1000 - horizon;
      refused.reason = Waiting(control, "rate limit of " + Rate(limits.rate) + " calls a second");
      return refused;
    }
    send_at = TakeSlot(control, limits, slot_us);
  }
  if (probe) control.probe_until = now + call_lease;
  control.updated_at = now;
  Admission admitted;
  admitted.admitted = true;
  admitted.send_at = send_at;
  admitted.probe = probe;
  return admitted;
}

absl::Status ChangePause(TargetControl& control, bool pause, const std::string& actor,
                         const std::string& reason, Millis at) {
  if (control.paused == pause) {
    return absl::FailedPreconditionError("target '" + control.target + "' is " +
                                         (pause ? "paused" : "not paused") + " already");
  }
  control.paused = pause;
  control.paused_by = pause ? actor : "";
  control.pause_reason = pause ? reason : "";
  control.paused_at = pause ? at : 0;
  control.updated_at = at;
  return absl::OkStatus();
}

CallHealth HealthOf(const CallOutcome& outcome, ErrorClass error_class) {
  if (outcome.kind == CallOutcome::Kind::kInvalid || outcome.content_changed || outcome.withdrawn) {
    return CallHealth::kUntold;
  }
  if (error_class == ErrorClass::kTransient || error_class == ErrorClass::kUnknown) {
    return CallHealth::kFailing;
  }
  return CallHealth::kHealthy;
}

void Settle(TargetControl& control, const TargetLimits& limits, bool probe, CallHealth health,
            Millis now) {
  if (limits.breaker_failures <= 0) return;
  control.updated_at = now;
  switch (health) {
    case CallHealth::kUntold:
      if (probe) control.probe_until = 0;  // let another call probe
      return;
    case CallHealth::kHealthy:
      control.failures = 0;
      control.open_until = 0;
      control.probe_until = 0;
      return;
    case CallHealth::kFailing:
      control.failures = std::min(control.failures + 1, 1'000'000);
      if (probe || control.failures == limits.breaker_failures) {
        control.failures = std::max(control.failures, limits.breaker_failures);
        control.open_until = now + limits.cool_down;
        control.probe_until = 0;
      }
      return;
  }
}

}  // namespace waystone
