#pragma once

// Why an instance stopped where it did, in a code the API, the console and the docs
// share and in words an operator reads at 3 a.m. Pure: from the instance's records
// (no I/O), so the triage route and the instance route say the same thing.

#include <string>
#include <string_view>
#include <vector>

#include "store/store.h"

namespace waystone {

// The groups of the console's home view, in the order it shows them. Not persisted.
enum class StopReason : uint8_t {
  kCompensationFailed = 1,  // a compensation failed: the undo itself needs a human
  kConflict = 2,            // an idempotency or inbox conflict: same key, different data
  kOutcomeUnknown = 3,      // a call was sent and its outcome is not known
  kRetriesExhausted = 4,    // a step failed on every allowed attempt
  kNeedsOperator = 5,       // paused or failed until an operator decides
  kWaitingForEvent = 6,     // a wait step waits for an event (or approval)
  kRetrying = 7,            // a step failed transiently and runs again at next_attempt_at
  kStuck = 8,               // running, yet nothing changed for longer than the threshold
  kInProgress = 9,          // running normally: not stopped
  kFinished = 10,           // completed, compensated or closed: nothing to do
};

std::string_view ToString(StopReason reason);
// Every reason, in the order the home view shows them.
const std::vector<StopReason>& AllStopReasons();

struct StopExplanation {
  StopReason reason = StopReason::kInProgress;
  std::string words;           // one or two sentences naming the step and what happened
  int step = -1;               // index of the step it stopped at; -1 when none
  int attempt = 0;             // that step's attempts so far
  Millis next_attempt_at = 0;  // retrying: when; waiting: the wait's deadline
  bool overdue = false;        // waiting past its deadline
};

struct TriageOptions {
  // A running instance that has not changed for this long is stuck.
  Millis stuck_after = 15 * 60 * 1000;
};

// Explains why `instance` (with its `steps` and every `alerts` row) is where it is at `now`.
StopExplanation ExplainStop(const InstanceRecord& instance, const std::vector<StepRecord>& steps,
                            const std::vector<AlertRecord>& alerts, Millis now,
                            const TriageOptions& options);

}  // namespace waystone
