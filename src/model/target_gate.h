#pragma once

// The protection of a fragile target, as rules without I/O: whether a call may go
// now (operator pause, circuit breaker, concurrency cap, rate limit) and what its
// outcome does to the circuit. The store keeps one TargetControl per (tenant,
// target) and applies these under a row lock, so every worker process sharing the
// database obeys the same limits.

#include <string>

#include "absl/status/status.h"
#include "base/clock.h"
#include "model/classify.h"
#include "model/states.h"

namespace waystone {

// What a definition says protects a target (`limits:` and `circuit_breaker:`).
struct TargetLimits {
  double rate = 0;            // calls per second; 0: no limit
  int concurrency = 0;        // calls under way at once; 0: no cap
  int breaker_failures = 0;   // consecutive transient failures that open the circuit; 0: none
  Millis cool_down = 30'000;  // how long an open circuit stays open before one probe

  bool Any() const { return rate > 0 || concurrency > 0 || breaker_failures > 0; }
};

// The shared state of one target of one tenant.
struct TargetControl {
  std::string tenant;
  std::string target;
  // Operator pause: no call leaves while set.
  bool paused = false;
  std::string paused_by;
  std::string pause_reason;
  Millis paused_at = 0;
  // Rate limit: the earliest time (microseconds) the next call may leave.
  int64_t next_slot_us = 0;
  // Circuit breaker: consecutive transient failures; open until `open_until` once
  // they reach the threshold; afterwards half-open, one probe call at a time, which
  // holds the circuit until `probe_until`.
  int failures = 0;
  Millis open_until = 0;
  Millis probe_until = 0;
  Millis updated_at = 0;
  // Calls admitted and not settled (their permits unexpired): read with the row.
  int calls = 0;
};

// What Admit decided.
struct Admission {
  bool admitted = false;
  Millis send_at = 0;   // admitted: the call leaves no earlier (rate limit)
  bool probe = false;   // admitted as the half-open circuit's probe
  Millis retry_at = 0;  // refused: when to ask again
  std::string reason;   // refused: why, in words for the instance's reason
};

// Decides whether a call to `control`'s target may go at `now` under `limits`; when
// it may, takes its rate slot (at most `horizon` ahead) and, half-open, makes it the
// probe (holding the circuit for `call_lease`). `control` is changed only then.
Admission Admit(TargetControl& control, const TargetLimits& limits, Millis now, Millis horizon,
                Millis call_lease);

// Pauses (`pause`) or resumes the target as `actor` did at `at` for `reason`;
// FailedPrecondition when it is paused (resumed) already.
absl::Status ChangePause(TargetControl& control, bool pause, const std::string& actor,
                         const std::string& reason, Millis at);

// How long after its rate slot a call may still leave: a slot or 50 ms, whichever is
// longer (a checkpoint's commit sits between the slot and the send). A process that
// falls further behind (a stall, a loaded machine) retakes a slot for the call
// instead, so that the calls it held are not sent together: the target then receives
// at most its rate, plus the calls of this tolerance, in any second.
Millis LateSlotTolerance(const TargetLimits& limits);

// Whether a call whose slot was `send_at` is too late to leave at `now` on it.
inline bool SlotPassed(const TargetLimits& limits, Millis send_at, Millis now) {
  return limits.rate > 0 && now - send_at > LateSlotTolerance(limits);
}

// Takes the next free rate slot for an admitted call whose slot passed (the call
// keeps its permit; pause, circuit and cap were asked already): returns when it
// leaves, now at the earliest.
Millis RetakeSlot(TargetControl& control, const TargetLimits& limits, Millis now);

// What an admitted call's outcome says about the target's health.
enum class CallHealth : uint8_t {
  kHealthy,  // it answered (2xx, or a refusal that is not about its health)
  kFailing,  // transient or unknown: down, overloaded, timed out
  kUntold,   // not sent for reasons of ours (a file changed, an invalid request, withdrawn)
};
CallHealth HealthOf(const CallOutcome& outcome, ErrorClass error_class);

// Records an admitted call's outcome in the circuit: failures count up to the
// threshold (opening it for `cool_down`), a failed probe opens it again, and any
// healthy answer closes it.
void Settle(TargetControl& control, const TargetLimits& limits, bool probe, CallHealth health,
            Millis now);

// A SQL LIKE pattern (escape character '\\') for the reasons of instances waiting
// for `target` because it is paused: a resume wakes them at once.
std::string PausedReasonPattern(const std::string& target);

// The prefix of an instance's reason while it waits for a target; the reason it had
// before follows kBeforeWaiting, and is its reason again once it goes on.
inline constexpr std::string_view kAwaitingTarget = "waiting for target '";
inline constexpr std::string_view kBeforeWaiting = "; before that: ";

// The reason an instance had before it waited for a target (`status_reason` itself
// when it does not wait for one).
inline std::string ReasonBeforeWaiting(const std::string& status_reason) {
  if (!status_reason.starts_with(kAwaitingTarget)) return status_reason;
  const size_t before = status_reason.find(kBeforeWaiting);
  return before == std::string::npos ? "" : status_reason.substr(before + kBeforeWaiting.size());
}

// The reason of an instance that waits for a target (`waiting`, a reason that begins
// with kAwaitingTarget), keeping the one it had before.
inline std::string WaitingReason(const std::string& waiting, const std::string& status_reason) {
  const std::string before = ReasonBeforeWaiting(status_reason);
  return before.empty() ? waiting : waiting + std::string(kBeforeWaiting) + before;
}

}  // namespace waystone
