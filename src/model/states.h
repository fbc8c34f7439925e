#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace waystone {

// Persisted enums: the numeric values are frozen (they are stored), the string
// forms below are the ones the CLI, API, console and docs use.

enum class StepState : uint8_t {
  kPending = 1,
  kRunning = 2,
  kCompleted = 3,
  kFailed = 4,
  kUnknown = 5,
  kCompensating = 6,
  kCompensated = 7,
  kCompensationFailed = 8,
  kSkipped = 9,
  kWaiting = 10,  // a wait step: waiting for an event (or its timeout)
};

enum class InstanceState : uint8_t {
  kRunning = 1,         // has work to do now or at next_run_at
  kCompleted = 2,       // every step completed
  kCompensating = 3,    // a step failed; compensations are running
  kCompensated = 4,     // compensations finished; the business action was undone
  kFailed = 5,          // a step failed and there was nothing to compensate
  kNeedsAttention = 6,  // paused until an operator acts
  kClosed = 7,          // closed by an operator
};

enum class ErrorClass : uint8_t {
  kNone = 0,
  kTransient = 1,  // nothing happened on the other side; retry with backoff
  kRejected = 2,   // the other side refused; never retry
  kUnknown = 3,    // the other side may have acted; look up before resubmitting
};

enum class RecoveryClass : uint8_t {
  kRepeatable = 1,
  kLookup = 2,
  kCompensable = 3,
  kManual = 4,
};

// How an `unknown` outcome was settled; recorded on the step.
enum class Resolution : uint8_t {
  kNone = 0,
  kLookupFound = 1,  // the lookup found the object; its id was adopted
  kResubmitted = 2,  // the lookup (or its absence) allowed resubmission
  kOperator = 3,     // an operator confirmed the outcome
  kPassedOver = 4,   // an optional step failed without having acted; the run went on
};

std::string_view ToString(StepState state);
std::string_view ToString(InstanceState state);
std::string_view ToString(ErrorClass error_class);
std::string_view ToString(RecoveryClass recovery);
std::string_view ToString(Resolution resolution);

std::optional<ErrorClass> ParseErrorClass(std::string_view text);
std::optional<RecoveryClass> ParseRecoveryClass(std::string_view text);
std::optional<InstanceState> ParseInstanceState(std::string_view text);
std::optional<StepState> ParseStepState(std::string_view text);

// Returns true for states no worker will move out of without an operator.
bool IsTerminal(InstanceState state);

}  // namespace waystone

namespace waystone {

// Why an alert was raised. Persisted; values frozen.
enum class AlertKind : uint8_t {
  kRetriesExhausted = 1,
  kLookupContradiction = 2,
  kCompensationFailed = 3,
  kIdempotencyConflict = 4,
  kNeedsOperator = 5,   // an unknown outcome on a manual step, or a failure that needs a decision
  kDeliveryParked = 6,  // an outbox event kept failing to reach a sink
  kSinkDisabled = 7,    // a sink answered 410; its events wait
  kUnknownUnresolved = 8,            // an unknown outcome stayed unresolved past the threshold
  kInboxConflict = 9,                // an event id came again with different data
  kResultMissing = 10,               // a 2xx answer lacked the external id the step records
  kOptionalStepFailed = 11,          // an optional step failed; the workflow went on without it
  kContradictingDecision = 12,       // a late approval decision contradicts the one that stood
  kApprovalRejected = 13,            // an approval was rejected; the step says an operator decides
  kInconsistencyAfterApproval = 14,  // a step after an approval failed; nothing undone
};

// Which request of a step an attempt record describes. Persisted; values frozen.
enum class AttemptPhase : uint8_t { kCall = 1, kLookup = 2, kCompensate = 3 };
std::string_view ToString(AttemptPhase phase);

// Where one outbox event stands with one sink. Persisted; values frozen.
enum class DeliveryState : uint8_t { kPending = 1, kDelivered = 2, kParked = 3 };
std::string_view ToString(DeliveryState state);

enum class AlertState : uint8_t { kOpen = 1, kAcknowledged = 2, kResolved = 3 };

std::string_view ToString(AlertKind kind);
std::string_view ToString(AlertState state);
std::optional<AlertKind> ParseAlertKind(std::string_view text);
std::optional<AlertState> ParseAlertState(std::string_view text);

}  // namespace waystone

namespace waystone {

// Where a batch (one operator action over the instances a filter matched) stands.
// Persisted; values frozen.
enum class BatchState : uint8_t {
  kRunning = 1,    // its runner takes pending items
  kPaused = 2,     // no new item is taken; items under way finish
  kFinished = 3,   // every item has its result
  kCancelled = 4,  // stopped for good; its pending items were cancelled
};

// Where one instance of a batch stands. Persisted; values frozen.
enum class BatchItemState : uint8_t {
  kPending = 1,    // not taken yet
  kApplying = 2,   // claimed by a runner, the action under way
  kApplied = 3,    // the action committed; waiting for the instance to come to rest
  kSucceeded = 4,  // the instance came to rest where the action aims (retried: completed)
  kStopped = 5,    // the instance came to rest elsewhere (stopped again); see its reason
  kUnsettled = 6,  // not at rest within the runner's patience; its state then
  kRefused = 7,    // the instance's state refused the action
  kFailed = 8,     // the action could not be applied (an error, not the state)
  kCancelled = 9,  // the batch was cancelled before the item was taken
};

std::string_view ToString(BatchState state);
std::string_view ToString(BatchItemState state);
std::optional<BatchState> ParseBatchState(std::string_view text);
std::optional<BatchItemState> ParseBatchItemState(std::string_view text);

}  // namespace waystone
