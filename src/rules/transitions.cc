#include "rules/transitions.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "base/redact.h"
#include "model/duration.h"
#include "model/json_text.h"
#include "model/keys.h"
#include "model/outbox_events.h"
#include "model/target_gate.h"
#include "rules/state_machine.h"
#include "rules/transition_parts.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxStoredMessage = 500;

std::string EventTypeFor(InstanceState state) {
  return "waystone.instance." + std::string(ToString(state));
}

// The instance's reason, or while it waits for a target the one it had before.
std::string ReasonBeforeWaiting(const InstanceRecord& instance) {
  return waystone::ReasonBeforeWaiting(instance.status_reason);
}

}  // namespace

// transition_parts.h: what the step kinds' rules share.

// Parses a response body; a body that is not JSON is kept as a JSON string. JSON
// nested deeper than kMaxJsonDepth is refused: what a step keeps is rendered,
// stored and serialized again, and must stay bounded.
absl::StatusOr<Json> ParseBody(const std::string& body) {
  if (body.empty()) return nullptr;
  Json parsed = Json::parse(body, nullptr, false);
  if (parsed.is_discarded()) return body;
  if (JsonNestsDeeperThan(body)) {
    return absl::InvalidArgumentError("the answer nests arrays and objects deeper than " +
                                      std::to_string(kMaxJsonDepth) + " levels");
  }
  return parsed;
}

std::string IdText(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "";
  return JsonText(value);
}

// Returns true when a JSON value is a usable external id (not absent, null or "").
bool HasId(const Json* value) {
  return value != nullptr && !value->is_null() && !(value->is_string() && value->empty());
}

// transition_parts.h: the pieces every transition builds with.

Change At(const Facts& facts) {
  Change change;
  change.now = facts.now;
  // Whatever happens next, the instance no longer waits for a target.
  if (facts.instance.status_reason.starts_with(kAwaitingTarget)) {
    change.status_reason = ReasonBeforeWaiting(facts.instance);
  }
  return change;
}

void AddEvent(const Facts& facts, Change& change, std::string_view type, const StepRecord* step,
              std::string_view message) {
  change.events.push_back(MakeEvent(type, facts.instance, step, message, facts.random, facts.now));
}

void AddAlert(const Facts& facts, Change& change, AlertKind kind, const std::string& step,
              const std::string& message) {
  AlertRecord alert{
      0,       facts.instance.id, facts.instance.tenant, step, kind, AlertState::kOpen,
      message, facts.now};
  change.events.push_back(MakeAlertEvent(alert, facts.instance, facts.random, facts.now));
  change.alerts.push_back(std::move(alert));
}

void SetInstanceState(const Facts& facts, Change& change, InstanceState state,
                      const std::string& reason) {
  change.state = state;
  change.status_reason = reason;
  change.next_run_at = facts.now;
  AddEvent(facts, change, EventTypeFor(state), nullptr, reason);
}

// Schedules the step's next attempt (or lookup) after a backoff.
Change Retry(const Facts& facts, StepRecord step, StepState state, int attempts_made,
             const RetryPolicy& policy, std::optional<Millis> retry_after) {
  Change change = At(facts);
  step.state = state;
  step.next_attempt_at = facts.now + policy.NextDelay(attempts_made, retry_after, facts.random);
  change.steps.push_back(step);
  return change;
}

// Marks `step` unknown (`what` happened), keeping when it first became so.
void MarkUnknown(StepRecord& step, const std::string& what, Millis now) {
  step.state = StepState::kUnknown;
  step.error_class = ErrorClass::kUnknown;
  step.error_message = ShortenMessage(what);
  step.unknowns += 1;
  if (step.unknown_since == 0) step.unknown_since = now;
}
// An audit record of a compensation the engine ran by itself, with its cause.
AuditRecord EngineAudit(const Facts& facts, const StepRecord& step, const std::string& key,
                        const std::string& action, const std::string& detail) {
  const Json about = {{"step", step.name},
                      {"external_id", step.external_id},
                      {"key", key},
                      {"attempt", step.compensation_attempts},
                      {"detail", detail}};
  const InstanceRecord& instance = facts.instance;
  const std::string reason = ReasonBeforeWaiting(instance);
  return {0,
          0,
          "engine",
          instance.tenant,
          instance.id,
          action,
          reason.empty() ? "compensation" : ShortenMessage(reason),
          JsonText(about)};
}

std::string ShortenMessage(std::string_view text) {
  // Redacted before it is cut: a secret the cut splits would keep its first part.
  std::string redacted = RedactSecrets(text);
  if (redacted.size() <= kMaxStoredMessage) return redacted;
  redacted.resize(kMaxStoredMessage);
  return redacted + "...";
}

std::string DescribeResponse(const HttpResponse& response) {
  if (response.outcome.kind != CallOutcome::Kind::kResponse) return response.error;
  if (response.outcome.smtp) return "SMTP " + ShortenMessage(response.body);  // "250 2.0.0 Ok"
  return "HTTP " + std::to_string(response.outcome.status) +
         (response.body.empty() ? "" : ": " + ShortenMessage(response.body));
}

void MarkCompleted(StepRecord& step, Millis now) {
  step.state = StepState::kCompleted;
  step.unknown_since = 0;
  step.next_attempt_at = 0;
  step.error_class = ErrorClass::kNone;
  step.error_message.clear();
  step.finished_at = now;
}

namespace {

// The approval step before `index` that was approved (completed), or "".
std::string ApprovedBefore(const WorkflowDefinition& definition,
                           const std::vector<StepRecord>& steps, int index) {
  for (int i = index - 1; i >= 0; --i) {
    if (definition.steps[i].kind == StepKind::kApproval &&
        steps[i].state == StepState::kCompleted) {
      return steps[i].name;
    }
  }
  return "";
}

}  // namespace

// Fails `step` and moves the instance to `next`, or where StateAfterFailure says.
Change FailStepTo(const Facts& facts, StepRecord step, ErrorClass error_class,
                  const std::string& message, std::optional<AlertKind> alert,
                  std::optional<InstanceState> forced, Acted acted) {
  Change change = At(facts);
  // Non-critical: the workflow goes on without it, but only after a failure that
  // proves nothing was done. One that may have acted (an unknown outcome before on
  // a call that changes something, an answer of success it could not read, a key
  // conflict) waits for an operator, never undoing the business outcome.
  const StepDefinition& def = facts.definition.steps[step.index];
  const bool optional = !forced && def.optional;
  const bool may_have_acted =
      acted == Acted::kMaybe ||
      (step.unknowns > 0 && def.kind == StepKind::kHttp && def.request.SideEffecting());
  const bool passed_over =
      optional && !may_have_acted && (!alert || *alert == AlertKind::kRetriesExhausted);
  if (optional && !passed_over) forced = InstanceState::kNeedsAttention;
  step.state = StepState::kFailed;
  step.unknown_since = 0;
  step.error_class = error_class;
  step.error_message = ShortenMessage(message);
  step.finished_at = facts.now;
  step.next_attempt_at = 0;
  if (passed_over) step.resolution = Resolution::kPassedOver;
  change.steps.push_back(step);
  std::vector<StepRecord> after = facts.steps;
  after[step.index] = step;
  const std::string reason = "step '" + step.name + "' failed (" +
                             std::string(ToString(error_class)) + "): " + ShortenMessage(message);
  AddEvent(facts, change, "waystone.step.failed", &step, message);
  if (passed_over) {
    AddAlert(facts, change, AlertKind::kOptionalStepFailed, step.name,
             reason + "; the step is optional: the workflow went on without it");
    change.next_run_at = facts.now;
    return change;
  }
  static const std::vector<int> kNone;
  const InstanceState next = forced
                                 ? *forced
                                 : StateAfterFailure(facts.definition, after, step.index,
                                                     facts.busy != nullptr ? *facts.busy : kNone);
  if (alert) AddAlert(facts, change, *alert, step.name, reason);
  if (next == InstanceState::kRunning) {
    change.next_run_at = facts.now;  // a branch beside it is calling: SettleFailure follows
    return change;
  }
  if (facts.instance.state == InstanceState::kNeedsAttention &&
      next != InstanceState::kNeedsAttention) {
    // A branch beside it put the instance before an operator already: it stays there.
    return change;
  }
  if (next == InstanceState::kNeedsAttention && def.pause_on_failure && !forced) {
    const std::string approved = ApprovedBefore(facts.definition, facts.steps, step.index);
    AddAlert(facts, change,
             approved.empty() ? AlertKind::kNeedsOperator : AlertKind::kInconsistencyAfterApproval,
             step.name,
             reason + (approved.empty()
                           ? "; on_failure: pause: nothing before it is undone, an operator "
                             "decides"
                           : "; approval '" + approved +
                                 "' stood: nothing is undone, an "
                                 "operator reconciles (retry, confirm, compensate or close)"));
  } else if (next == InstanceState::kNeedsAttention && alert != AlertKind::kNeedsOperator) {
    AddAlert(facts, change, AlertKind::kNeedsOperator, step.name,
             reason + (optional ? "; an optional step that may have acted: an operator decides"
                                : "; manual step: an operator decides"));
  }
  SetInstanceState(facts, change, next, reason);
  return change;
}

Change FailStep(const Facts& facts, StepRecord step, ErrorClass error_class,
                const std::string& message, std::optional<AlertKind> alert) {
  return FailStepTo(facts, std::move(step), error_class, message, alert, std::nullopt);
}

Change SettleFailure(const Facts& facts, int index) {
  Change change = At(facts);
  const StepRecord& step = facts.steps[index];
  const InstanceState next = StateAfterFailure(facts.definition, facts.steps, index);
  const std::string reason = "step '" + step.name + "' failed (" +
                             std::string(ToString(step.error_class)) + "): " + step.error_message;
  if (next == InstanceState::kNeedsAttention) {
    AddAlert(facts, change, AlertKind::kNeedsOperator, step.name,
             reason + "; a branch beside it has an unknown outcome: an operator decides");
  }
  SetInstanceState(facts, change, next, reason);
  return change;
}

Change SkipStep(const Facts& facts, int index, const std::string& why) {
  Change change = At(facts);
  StepRecord step = facts.steps[index];
  step.state = StepState::kSkipped;
  step.error_class = ErrorClass::kNone;
  step.error_message = ShortenMessage(why);
  step.started_at = facts.now;
  step.finished_at = facts.now;
  step.next_attempt_at = 0;
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.skipped", &step, step.error_message);
  change.next_run_at = facts.now;
  return change;
}

// A 409 for a resubmission proves only that this attempt did nothing: the earlier
// attempt, whose outcome was unknown, may have taken effect (a target that answers a
// key it has seen with 409). Neither failed (which would compensate around an effect
// that may be there) nor sent again: the step stays unknown and an operator confirms
// its outcome.
Change RejectedAfterUnknown(const Facts& facts, StepRecord step, const std::string& detail) {
  const std::string what = ShortenMessage(detail) +
                           " on a resubmission after an unknown outcome; the earlier attempt "
                           "may have taken effect";
  Change change = At(facts);
  MarkUnknown(step, what, facts.now);
  step.unknowns -= 1;  // this attempt's own outcome is known: it was refused
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.unknown", &step, what);
  const std::string reason = "step '" + step.name + "': " + what +
                             "; confirm its outcome with the target, then confirm or retry it";
  AddAlert(facts, change, AlertKind::kNeedsOperator, step.name, reason);
  SetInstanceState(facts, change, InstanceState::kNeedsAttention, reason);
  return change;
}

Change FailStepAndWait(const Facts& facts, StepRecord step, const std::string& message) {
  return FailStepTo(facts, std::move(step), ErrorClass::kRejected, message,
                    AlertKind::kNeedsOperator, InstanceState::kNeedsAttention);
}

Change Pause(const Facts& facts, const StepRecord& step, AlertKind alert,
             const std::string& reason) {
  Change change = At(facts);
  change.steps.push_back(step);
  AddAlert(facts, change, alert, step.name, reason);
  SetInstanceState(facts, change, InstanceState::kNeedsAttention, reason);
  return change;
}

Change AwaitTarget(const Facts& facts, const std::string& reason) {
  Change change = At(facts);
  const std::string before = ReasonBeforeWaiting(facts.instance);
  change.status_reason =
      ShortenMessage(reason) + (before.empty() ? "" : std::string(kBeforeWaiting) + before);
  return change;
}

Change Finish(const Facts& facts, InstanceState final_state) {
  Change change = At(facts);
  std::string passed_over;  // optional steps it went on without, by name
  for (const StepRecord& step : facts.steps) {
    if (step.resolution != Resolution::kPassedOver) continue;
    passed_over += (passed_over.empty() ? "'" : ", '") + step.name + "'";
  }
  const std::string reason =
      final_state == InstanceState::kCompleted
          ? (passed_over.empty()
                 ? "all steps completed"
                 : "completed without optional step(s) " + passed_over + ", which failed")
          : (final_state == InstanceState::kCompensated ? "completed steps were compensated"
                                                        : facts.instance.status_reason);
  SetInstanceState(facts, change, final_state, reason);
  return change;
}

std::string KeptAnswer(const nlohmann::json& answer, const StepDefinition& step) {
  using Json = nlohmann::json;
  switch (step.store_response) {
    case ResponseKeep::kAll:
      return JsonText(answer);
    case ResponseKeep::kNone:
      return "{}";
    case ResponseKeep::kNeeded:
    case ResponseKeep::kListed:
      break;
  }
  const auto& pointers = step.kept_pointers;
  if (std::find(pointers.begin(), pointers.end(), "") != pointers.end()) return JsonText(answer);
  Json kept = Json::object();
  for (const std::string& pointer : pointers) {
    try {
      const Json::json_pointer at(pointer);
      if (answer.contains(at)) kept[at] = answer.at(at);
    } catch (const Json::exception&) {
      // A pointer the answer's shape does not have: nothing to keep there.
    }
  }
  return JsonText(kept);
}

}  // namespace waystone
