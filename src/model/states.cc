#include "model/states.h"

namespace waystone {

std::string_view ToString(StepState state) {
  switch (state) {
    case StepState::kPending:
      return "pending";
    case StepState::kRunning:
      return "running";
    case StepState::kCompleted:
      return "completed";
    case StepState::kFailed:
      return "failed";
    case StepState::kUnknown:
      return "unknown";
    case StepState::kCompensating:
      return "compensating";
    case StepState::kCompensated:
      return "compensated";
    case StepState::kCompensationFailed:
      return "compensation_failed";
    case StepState::kSkipped:
      return "skipped";
    case StepState::kWaiting:
      return "waiting";
  }
  return "invalid";
}

std::string_view ToString(InstanceState state) {
  switch (state) {
    case InstanceState::kRunning:
      return "running";
    case InstanceState::kCompleted:
      return "completed";
    case InstanceState::kCompensating:
      return "compensating";
    case InstanceState::kCompensated:
      return "compensated";
    case InstanceState::kFailed:
      return "failed";
    case InstanceState::kNeedsAttention:
      return "needs_attention";
    case InstanceState::kClosed:
      return "closed";
  }
  return "invalid";
}

std::string_view ToString(ErrorClass error_class) {
  switch (error_class) {
    case ErrorClass::kNone:
      return "none";
    case ErrorClass::kTransient:
      return "transient";
    case ErrorClass::kRejected:
      return "rejected";
    case ErrorClass::kUnknown:
      return "unknown";
  }
  return "invalid";
}

std::string_view ToString(RecoveryClass recovery) {
  switch (recovery) {
    case RecoveryClass::kRepeatable:
      return "repeatable";
    case RecoveryClass::kLookup:
      return "lookup";
    case RecoveryClass::kCompensable:
      return "compensable";
    case RecoveryClass::kManual:
      return "manual";
  }
  return "invalid";
}

std::string_view ToString(Resolution resolution) {
  switch (resolution) {
    case Resolution::kNone:
      return "none";
    case Resolution::kLookupFound:
      return "lookup_found";
    case Resolution::kResubmitted:
      return "resubmitted";
    case Resolution::kOperator:
      return "operator";
    case Resolution::kPassedOver:
      return "passed_over";
  }
  return "invalid";
}

std::optional<ErrorClass> ParseErrorClass(std::string_view text) {
  for (ErrorClass c : {ErrorClass::kTransient, ErrorClass::kRejected, ErrorClass::kUnknown}) {
    if (ToString(c) == text) return c;
  }
  return std::nullopt;
}

std::optional<RecoveryClass> ParseRecoveryClass(std::string_view text) {
  for (RecoveryClass c : {RecoveryClass::kRepeatable, RecoveryClass::kLookup,
                          RecoveryClass::kCompensable, RecoveryClass::kManual}) {
    if (ToString(c) == text) return c;
  }
  return std::nullopt;
}

std::optional<InstanceState> ParseInstanceState(std::string_view text) {
  for (int i = 1; i <= 7; ++i) {
    auto state = static_cast<InstanceState>(i);
    if (ToString(state) == text) return state;
  }
  return std::nullopt;
}

std::optional<StepState> ParseStepState(std::string_view text) {
  for (int i = 1; i <= 10; ++i) {
    auto state = static_cast<StepState>(i);
    if (ToString(state) == text) return state;
  }
  return std::nullopt;
}

bool IsTerminal(InstanceState state) {
  switch (state) {
    case InstanceState::kRunning:
    case InstanceState::kCompensating:
      return false;
    case InstanceState::kCompleted:
    case InstanceState::kCompensated:
    case InstanceState::kFailed:
    case InstanceState::kNeedsAttention:
    case InstanceState::kClosed:
      return true;
  }
  return true;
}

}  // namespace waystone

namespace waystone {

std::string_view ToString(AlertKind kind) {
  switch (kind) {
    case AlertKind::kRetriesExhausted:
      return "retries_exhausted";
    case AlertKind::kLookupContradiction:
      return "lookup_contradiction";
    case AlertKind::kCompensationFailed:
      return "compensation_failed";
    case AlertKind::kIdempotencyConflict:
      return "idempotency_conflict";
    case AlertKind::kNeedsOperator:
      return "needs_operator";
    case AlertKind::kDeliveryParked:
      return "delivery_parked";
    case AlertKind::kSinkDisabled:
      return "sink_disabled";
    case AlertKind::kUnknownUnresolved:
      return "unknown_unresolved";
    case AlertKind::kInboxConflict:
      return "inbox_conflict";
    case AlertKind::kResultMissing:
      return "result_missing";
    case AlertKind::kOptionalStepFailed:
      return "optional_step_failed";
    case AlertKind::kContradictingDecision:
      return "contradicting_decision";
    case AlertKind::kApprovalRejected:
      return "approval_rejected";
    case AlertKind::kInconsistencyAfterApproval:
      return "inconsistency_after_approval";
  }
  return "invalid";
}

std::string_view ToString(AttemptPhase phase) {
  switch (phase) {
    case AttemptPhase::kCall:
      return "call";
    case AttemptPhase::kLookup:
      return "lookup";
    case AttemptPhase::kCompensate:
      return "compensate";
  }
  return "invalid";
}

std::string_view ToString(AlertState state) {
  switch (state) {
    case AlertState::kOpen:
      return "open";
    case AlertState::kAcknowledged:
      return "acknowledged";
    case AlertState::kResolved:
      return "resolved";
  }
  return "invalid";
}

}  // namespace waystone

namespace waystone {

std::string_view ToString(DeliveryState state) {
  switch (state) {
    case DeliveryState::kPending:
      return "pending";
    case DeliveryState::kDelivered:
      return "delivered";
    case DeliveryState::kParked:
      return "parked";
  }
  return "invalid";
}

std::optional<AlertKind> ParseAlertKind(std::string_view text) {
  for (int i = 1; i <= 14; ++i) {
    auto kind = static_cast<AlertKind>(i);
    if (ToString(kind) == text) return kind;
  }
  return std::nullopt;
}

std::optional<AlertState> ParseAlertState(std::string_view text) {
  for (int i = 1; i <= 3; ++i) {
    auto state = static_cast<AlertState>(i);
    if (ToString(state) == text) return state;
  }
  return std::nullopt;
}

}  // namespace waystone

namespace waystone {

std::string_view ToString(BatchState state) {
  switch (state) {
    case BatchState::kRunning:
      return "running";
    case BatchState::kPaused:
      return "paused";
    case BatchState::kFinished:
      return "finished";
    case BatchState::kCancelled:
      return "cancelled";
  }
  return "invalid";
}

std::string_view ToString(BatchItemState state) {
  switch (state) {
    case BatchItemState::kPending:
      return "pending";
    case BatchItemState::kApplying:
      return "applying";
    case BatchItemState::kApplied:
      return "applied";
    case BatchItemState::kSucceeded:
      return "succeeded";
    case BatchItemState::kStopped:
      return "stopped";
    case BatchItemState::kUnsettled:
      return "unsettled";
    case BatchItemState::kRefused:
      return "refused";
    case BatchItemState::kFailed:
      return "failed";
    case BatchItemState::kCancelled:
      return "cancelled";
  }
  return "invalid";
}

std::optional<BatchState> ParseBatchState(std::string_view text) {
  for (int i = 1; i <= 4; ++i) {
    auto state = static_cast<BatchState>(i);
    if (ToString(state) == text) return state;
  }
  return std::nullopt;
}

std::optional<BatchItemState> ParseBatchItemState(std::string_view text) {
  for (int i = 1; i <= 9; ++i) {
    auto state = static_cast<BatchItemState>(i);
    if (ToString(state) == text) return state;
  }
  return std::nullopt;
}

}  // namespace waystone
