#include "server/triage.h"

#include <nlohmann/json.hpp>

#include "base/time_format.h"

namespace waystone {
namespace {

bool Open(const AlertRecord& alert) { return alert.state != AlertState::kResolved; }

bool HasOpen(const std::vector<AlertRecord>& alerts, std::initializer_list<AlertKind> kinds) {
  for (const AlertRecord& a : alerts) {
    if (!Open(a)) continue;
    for (AlertKind kind : kinds) {
      if (a.kind == kind) return true;
    }
  }
  return false;
}

const AlertRecord* FirstOpen(const std::vector<AlertRecord>& alerts,
                             std::initializer_list<AlertKind> kinds) {
  for (const AlertRecord& a : alerts) {
    if (!Open(a)) continue;
    for (AlertKind kind : kinds) {
      if (a.kind == kind) return &a;
    }
  }
  return nullptr;
}

// The step the instance stands at: a compensation under way or failed, else the
// first step that is not done.
int StandingStep(const InstanceRecord& instance, const std::vector<StepRecord>& steps) {
  for (const StepRecord& s : steps) {
    if (s.state == StepState::kCompensationFailed) return s.index;
  }
  if (instance.state == InstanceState::kCompensating) {
    for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
      if (it->state == StepState::kCompensating) return it->index;
    }
  }
  for (const StepRecord& s : steps) {
    if (s.state != StepState::kCompleted && s.state != StepState::kSkipped &&
        s.state != StepState::kCompensated && s.resolution != Resolution::kPassedOver) {
      return s.index;
    }
  }
  return -1;
}

std::string LastError(const StepRecord& s) {
  if (s.error_message.empty()) return "";
  if (s.error_class == ErrorClass::kNone) return " (" + s.error_message + ")";
  return " (" + std::string(ToString(s.error_class)) + ": " + s.error_message + ")";
}

std::string Attempts(int n) { return std::to_string(n) + (n == 1 ? " attempt" : " attempts"); }

}  // namespace

std::string_view ToString(StopReason reason) {
  switch (reason) {
    case StopReason::kCompensationFailed:
      return "compensation_failed";
    case StopReason::kConflict:
      return "conflict";
    case StopReason::kOutcomeUnknown:
      return "outcome_unknown";
    case StopReason::kRetriesExhausted:
      return "retries_exhausted";
    case StopReason::kNeedsOperator:
      return "needs_operator";
    case StopReason::kWaitingForEvent:
      return "waiting_for_event";
    case StopReason::kRetrying:
      return "retrying";
    case StopReason::kStuck:
      return "stuck";
    case StopReason::kInProgress:
      return "in_progress";
    case StopReason::kFinished:
      return "finished";
  }
  return "?";
}

const std::vector<StopReason>& AllStopReasons() {
  static const std::vector<StopReason> kAll = {
      StopReason::kCompensationFailed, StopReason::kConflict,
      StopReason::kOutcomeUnknown,     StopReason::kRetriesExhausted,
      StopReason::kNeedsOperator,      StopReason::kWaitingForEvent,
      StopReason::kRetrying,           StopReason::kStuck,
      StopReason::kInProgress,         StopReason::kFinished};
  return kAll;
}

StopExplanation ExplainStop(const InstanceRecord& instance, const std::vector<StepRecord>& steps,
                            const std::vector<AlertRecord>& alerts, Millis now,
                            const TriageOptions& options) {
  StopExplanation out;
  if (instance.state == InstanceState::kCompleted ||
      instance.state == InstanceState::kCompensated || instance.state == InstanceState::kClosed) {
    out.reason = StopReason::kFinished;
    out.words = "Finished: " + std::string(ToString(instance.state)) +
                (instance.status_reason.empty() ? "." : " (" + instance.status_reason + ").");
    return out;
  }
  out.step = StandingStep(instance, steps);
  const StepRecord* step =
      out.step >= 0 && out.step < static_cast<int>(steps.size()) ? &steps[out.step] : nullptr;
  const std::string name = step != nullptr ? "Step '" + step->name + "'" : "The instance";
  if (step != nullptr) {
    out.attempt = step->attempts;
    out.next_attempt_at = step->next_attempt_at;
  }

  if ((step != nullptr && step->state == StepState::kCompensationFailed) ||
      HasOpen(alerts, {AlertKind::kCompensationFailed})) {
    out.reason = StopReason::kCompensationFailed;
    out.words = name + " could not be undone: its compensation failed after " +
                Attempts(step != nullptr ? step->compensation_attempts : 0) +
                (step != nullptr ? LastError(*step) : "") +
                ". What it did is still in place; retry the compensation or close the case.";
    return out;
  }
  if (const AlertRecord* conflict =
          FirstOpen(alerts, {AlertKind::kIdempotencyConflict, AlertKind::kInboxConflict})) {
    out.reason = StopReason::kConflict;
    out.words = (conflict->kind == AlertKind::kInboxConflict
                     ? "An event came again under the same id with different data: "
                     : "The same idempotency key was used with a different request: ") +
                conflict->message;
    return out;
  }
  const bool unknown =
      step != nullptr &&
      (step->state == StepState::kUnknown ||
       (step->state == StepState::kFailed && step->error_class == ErrorClass::kUnknown));
  if (unknown) {
    out.reason = StopReason::kOutcomeUnknown;
    out.words = name + " sent its request and got no usable answer" + LastError(*step) +
                ": whether the other side acted is not known.";
    if (step->unknown_since > 0)
      out.words += " Unknown since " + FormatRfc3339(step->unknown_since) + ".";
    out.words += instance.state == InstanceState::kRunning && step->next_attempt_at > 0
                     ? " A lookup runs again at " + FormatRfc3339(step->next_attempt_at) + "."
                     : " Confirm whether it happened (with the external id) or not.";
    return out;
  }
  if (const AlertRecord* exhausted = FirstOpen(alerts, {AlertKind::kRetriesExhausted})) {
    out.reason = StopReason::kRetriesExhausted;
    out.words = name + " failed on every allowed attempt (" + Attempts(out.attempt) + ")" +
                (step != nullptr ? LastError(*step) : ": " + exhausted->message) +
                ". Retry it once the other side is back, or compensate or close.";
    return out;
  }
  if (step != nullptr && step->state == StepState::kWaiting) {
    out.reason = StopReason::kWaitingForEvent;
    out.overdue = step->next_attempt_at > 0 && now > step->next_attempt_at;
    // An approval step's open request (rules/approvals.h): its record names it.
    const nlohmann::json request = nlohmann::json::parse(step->response_json, nullptr, false);
    if (request.is_object() && request.contains("data_version") && request.contains("snapshot")) {
      out.words = name + " waits for a decision on request " + std::to_string(step->attempts) +
                  " (data version " + step->request_hash.substr(0, 16) + ")" +
                  (step->next_attempt_at > 0
                       ? "; its next deadline is " + FormatRfc3339(step->next_attempt_at)
                       : std::string()) +
                  ". An approver decides it (POST .../decide, waystone decide or the console).";
      return out;
    }
    out.words =
        name + " is waiting for an event" +
        (step->next_attempt_at > 0 ? std::string(out.overdue ? "; it was due by " : " until ") +
                                         FormatRfc3339(step->next_attempt_at)
                                   : std::string(" with no deadline")) +
        ".";
    return out;
  }
  if (instance.state == InstanceState::kNeedsAttention ||
      instance.state == InstanceState::kFailed ||
      HasOpen(alerts, {AlertKind::kNeedsOperator, AlertKind::kLookupContradiction,
                       AlertKind::kResultMissing, AlertKind::kUnknownUnresolved})) {
    out.reason = StopReason::kNeedsOperator;
    const AlertRecord* alert =
        FirstOpen(alerts, {AlertKind::kNeedsOperator, AlertKind::kLookupContradiction,
                           AlertKind::kResultMissing, AlertKind::kUnknownUnresolved});
    out.words = name +
                (instance.state == InstanceState::kFailed ? " failed" : " needs an operator") +
                (step != nullptr ? LastError(*step) : "") + ": " +
                (alert != nullptr ? alert->message : instance.status_reason) + ".";
    return out;
  }
  if (step != nullptr && step->attempts > 0 && step->next_attempt_at > now &&
      (step->state == StepState::kPending || step->state == StepState::kFailed ||
       step->state == StepState::kCompensating)) {
    out.reason = StopReason::kRetrying;
    out.words = name + (step->state == StepState::kCompensating ? " (its compensation)" : "") +
                " failed on attempt " +
                std::to_string(step->state == StepState::kCompensating ? step->compensation_attempts
                                                                       : step->attempts) +
                LastError(*step) + "; it runs again at its next attempt.";
    return out;
  }
  if (now - instance.updated_at > options.stuck_after) {
    out.reason = StopReason::kStuck;
    out.words = "No progress since " + FormatRfc3339(instance.updated_at) + " (" +
                std::to_string((now - instance.updated_at) / 60000) + " min)" +
                (step != nullptr ? "; it stands at step '" + step->name + "', " +
                                       std::string(ToString(step->state))
                                 : std::string()) +
                (instance.lease_owner.empty() ? "; no worker holds it"
                                              : "; held by " + instance.lease_owner) +
                ".";
    return out;
  }
  out.reason = StopReason::kInProgress;
  out.words =
      step != nullptr ? name + " is " + std::string(ToString(step->state)) + "." : "Running.";
  return out;
}

}  // namespace waystone
