// The rules of compensation: a completed step's undo begins under its own key, its
// answer settles it (or it retries, or waits for an operator), and a restart finds
// what was under way. Declared in transitions.h.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "rules/transition_parts.h"
#include "rules/transitions.h"

namespace waystone {

namespace {

using Json = nlohmann::json;

// Why an at-most-once compensation (an email's correction) is not sent again.
std::string MayHaveArrived(const std::string& detail) {
  return "outcome unknown (" + detail +
         "): it may have arrived, and the server keeps no key, so it is not sent again; an "
         "operator checks the recipient's mailbox, then retries it or closes the case";
}

}  // namespace

Change BeginCompensation(const Facts& facts, int index, const std::string& key) {
  StepRecord step = facts.steps[index];
  Change change = At(facts);
  step.state = StepState::kCompensating;
  step.compensation_attempts += 1;
  step.next_attempt_at = 0;
  step.error_class = ErrorClass::kUnknown;  // until its outcome is recorded
  change.steps.push_back(step);
  change.audits.push_back(
      EngineAudit(facts, step, key, "compensate",
                  "attempt " + std::to_string(step.compensation_attempts) + " sent"));
  return change;
}

Change RecordCompensation(const Facts& facts, StepRecord step, const CallResult& result,
                          const std::string& key) {
  const CompensationSpec& spec = *facts.definition.steps[step.index].compensate;
  const std::string detail = DescribeResponse(result.response);
  step.error_class = result.error_class;
  switch (result.error_class) {
    case ErrorClass::kNone: {
      Change change = At(facts);
      step.state = StepState::kCompensated;
      step.error_message.clear();
      change.steps.push_back(step);
      change.audits.push_back(EngineAudit(facts, step, key, "compensated", detail));
      AddEvent(facts, change, "waystone.step.compensated", &step);
      return change;
    }
    case ErrorClass::kRejected:
      return CompensationFailed(facts, step, detail, key);
    case ErrorClass::kTransient:
    case ErrorClass::kUnknown:
      if (spec.at_most_once && result.error_class == ErrorClass::kUnknown) {
        return CompensationFailed(facts, step, MayHaveArrived(detail), key);
      }
      if (spec.retry.Exhausted(step.compensation_attempts)) {
        return CompensationFailed(facts, step, "retries exhausted; last: " + detail, key);
      }
      step.error_message = ShortenMessage(detail);
      return Retry(facts, step, StepState::kCompensating, step.compensation_attempts, spec.retry,
                   result.response.outcome.retry_after);
  }
  return CompensationFailed(facts, step, "unhandled error class", key);
}

std::optional<Change> CompensationInFlight(const Facts& facts, int index) {
  const StepRecord& step = facts.steps[index];
  const std::optional<CompensationSpec>& spec = facts.definition.steps[index].compensate;
  if (!spec || !spec->at_most_once || step.state != StepState::kCompensating ||
      step.error_class != ErrorClass::kUnknown) {
    return std::nullopt;
  }
  return CompensationFailed(facts, step,
                            MayHaveArrived("attempt " + std::to_string(step.compensation_attempts) +
                                           " was under way when its worker stopped"),
                            "");
}

Change CompensationFailed(const Facts& facts, StepRecord step, const std::string& message,
                          const std::string& key) {
  Change change = At(facts);
  step.state = StepState::kCompensationFailed;
  step.error_message = ShortenMessage(message);
  step.next_attempt_at = 0;
  change.steps.push_back(step);
  const std::string reason = "compensation of step '" + step.name + "' (external id '" +
                             step.external_id + "', key '" + key + "') failed after " +
                             std::to_string(step.compensation_attempts) +
                             " attempts: " + ShortenMessage(message);
  AddEvent(facts, change, "waystone.step.compensation_failed", &step, message);
  change.audits.push_back(
      EngineAudit(facts, step, key, "compensation_failed", ShortenMessage(message)));
  AddAlert(facts, change, AlertKind::kCompensationFailed, step.name, reason);
  SetInstanceState(facts, change, InstanceState::kNeedsAttention, reason);
  return change;
}

}  // namespace waystone
