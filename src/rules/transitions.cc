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

// A lookup answered 404 found nothing: that is an answer, not a failure.
constexpr int kNotFound = 404;
constexpr int kNoContent = 204;

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

// Returns the value at a JSON pointer, or nullptr when absent or malformed.
const Json* AtPointer(const Json& root, const std::string& pointer) {
  try {
    const Json::json_pointer p(pointer);
    if (!root.contains(p)) return nullptr;
    return &root.at(p);
  } catch (const Json::exception&) {
    return nullptr;
  }
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

std::string EventTypeFor(InstanceState state) {
  return "waystone.instance." + std::string(ToString(state));
}

// The instance's reason, or while it waits for a target the one it had before.
std::string ReasonBeforeWaiting(const InstanceRecord& instance) {
  return waystone::ReasonBeforeWaiting(instance.status_reason);
}

// The first `errors.body` rule whose status (when set) and every match value hold on
// `response`'s JSON body; nullopt when none does (or the body is not a JSON object).
std::optional<AnswerClass> ByBodyRules(const std::vector<BodyErrorRule>& rules,
                                       const HttpResponse& response) {
  auto body = ParseBody(response.body);
  if (!body.ok() || !body->is_object()) return std::nullopt;
  for (const BodyErrorRule& rule : rules) {
    if (rule.status != 0 && rule.status != response.outcome.status) continue;
    bool holds = true;
    for (const auto& [pointer, expected] : rule.match) {
      const Json* value = AtPointer(*body, pointer);
      holds = holds && value != nullptr && IdText(*value) == expected;
    }
    if (!holds) continue;
    switch (rule.verdict) {
      case BodyVerdict::kTransient:
        return AnswerClass{ErrorClass::kTransient};
      case BodyVerdict::kRejected:
        return AnswerClass{ErrorClass::kRejected};
      case BodyVerdict::kUnknown:
        return AnswerClass{ErrorClass::kUnknown};
      case BodyVerdict::kExists:
        return AnswerClass{ErrorClass::kUnknown, /*exists=*/true};
    }
  }
  return std::nullopt;
}

}  // namespace

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

namespace {

// Schedules the step's next attempt (or lookup) after a backoff.
Change Retry(const Facts& facts, StepRecord step, StepState state, int attempts_made,
             const RetryPolicy& policy, std::optional<Millis> retry_after) {
  Change change = At(facts);
  step.state = state;
  step.next_attempt_at = facts.now + policy.NextDelay(attempts_made, retry_after, facts.random);
  change.steps.push_back(step);
  return change;
}

// Returns when the lookup of an unknown step may run, given that its request may
// have left as late as `sent_by`: the target has the request's whole timeout to act
// on it, as it has after a timeout of our own, so a lookup that finds nothing then
// means nothing happened. Steps without a lookup settle otherwise: 0.
Millis LookupNotBefore(const StepDefinition& def, Millis sent_by) {
  if (!def.lookup || !def.request.SideEffecting()) return 0;
  return sent_by + def.request.timeout;
}

// Marks `step` unknown (`what` happened), keeping when it first became so.
void MarkUnknown(StepRecord& step, const std::string& what, Millis now) {
  step.state = StepState::kUnknown;
  step.error_class = ErrorClass::kUnknown;
  step.error_message = ShortenMessage(what);
  step.unknowns += 1;
  if (step.unknown_since == 0) step.unknown_since = now;
}

// A 2xx without the external id the step records: something happened, but not
// what the definition expects (a truncated answer reads this way too). Later URLs
// would read "/orders//cancel", so it never completes this way: with a lookup the
// outcome is settled by looking (a lookup that then finds nothing is a
// contradiction), with an honoured key by asking again under the same key,
// otherwise an operator decides.
Change ResultMissing(const Facts& facts, StepRecord step, const Json& body, int status) {
  const StepDefinition& def = facts.definition.steps[step.index];
  const std::string what =
      "HTTP " + std::to_string(status) + " had no external id at " + def.result_external_id;
  Change change = At(facts);
  MarkUnknown(step, what, facts.now);
  step.response_json = body.is_null() ? "{}" : KeptAnswer(body, def);  // "the target said yes"
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.unknown", &step, what);
  const bool resubmit = def.idempotency_honored && def.recovery != RecoveryClass::kManual;
  if (def.lookup || resubmit) return change;
  const std::string reason =
      "step '" + step.name + "': " + what + "; confirm the outcome with its external reference";
  AddAlert(facts, change, AlertKind::kResultMissing, step.name, reason);
  SetInstanceState(facts, change, InstanceState::kNeedsAttention, reason);
  return change;
}

// An `errors.body` rule said the object exists already (a "DUPLICATE" answer): never
// sent again. With a lookup it is looked up at once and adopted (a lookup that keeps
// finding nothing is a contradiction); without one an operator confirms it.
Change TargetSaysExists(const Facts& facts, StepRecord step, const HttpResponse& response) {
  const StepDefinition& def = facts.definition.steps[step.index];
  const std::string what = "the target says the object exists already (" +
                           ShortenMessage(DescribeResponse(response)) + ")";
  Change change = At(facts);
  MarkUnknown(step, what, facts.now);
  auto body = ParseBody(response.body);
  step.response_json = body.ok() && !body->is_null() ? KeptAnswer(*body, def) : "{}";
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.unknown", &step, what);
  if (def.lookup) return change;
  const std::string reason = "step '" + step.name + "': " + what +
                             "; it has no lookup: confirm the outcome with its external reference";
  AddAlert(facts, change, AlertKind::kNeedsOperator, step.name, reason);
  SetInstanceState(facts, change, InstanceState::kNeedsAttention, reason);
  return change;
}

// The outcome is not known and nothing proves the call did not happen: either
// resubmit under the same key (the target deduplicates), or stop.
Change ResubmitOrStop(const Facts& facts, StepRecord step, const std::string& why) {
  const StepDefinition& def = facts.definition.steps[step.index];
  if (def.recovery == RecoveryClass::kManual) {
    return Pause(facts, step, AlertKind::kNeedsOperator,
                 "step '" + step.name + "' outcome unknown (" + why +
                     "); manual step: confirm what happened");
  }
  if (def.retry.Exhausted(step.attempts)) {
    // It may have happened: the step stays unknown (never failed, never skipped by
    // a compensation) until an operator confirms what the target did.
    return Pause(facts, step, AlertKind::kRetriesExhausted,
                 "step '" + step.name + "': retries exhausted after " +
                     std::to_string(step.attempts) +
                     " attempts; outcome of the last one "
                     "unknown (" +
                     why + "); confirm what happened");
  }
  Change change = At(facts);
  step.state = StepState::kPending;
  step.response_json.clear();
  step.resolution = Resolution::kResubmitted;
  step.next_attempt_at = 0;
  change.steps.push_back(step);
  return change;
}

// Returns the objects a lookup answer holds that could be the step's: the one at
// `found` or each at `items`, kept only when every `match` pointer equals its
// expected value. An `items` that is not an array is an error.
absl::StatusOr<std::vector<const Json*>> Candidates(const LookupSpec& lookup, const Json& body,
                                                    const MatchValues& expected) {
  std::vector<const Json*> all;
  if (body.is_null()) return all;
  if (!lookup.items.empty()) {
    const Json* items = AtPointer(body, lookup.items);
    if (items == nullptr || !items->is_array()) {
      return absl::InvalidArgumentError("the answer has no array at " + lookup.items);
    }
    for (const Json& item : *items) all.push_back(&item);
  } else if (const Json* found = AtPointer(body, lookup.found); found && !found->is_null()) {
    all.push_back(found);
  }
  if (lookup.match.empty()) return all;
  if (!expected.ok()) return expected.status();
  std::vector<const Json*> matching;
  for (const Json* candidate : all) {
    bool ok = true;
    for (const auto& [pointer, text] : *expected) {
      const Json* value = AtPointer(*candidate, pointer);
      ok = ok && value != nullptr && IdText(*value) == text;
    }
    if (ok) matching.push_back(candidate);
  }
  return matching;
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

}  // namespace

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

Change BeginCall(const Facts& facts, int index, const std::string& key, const std::string& hash,
                 const std::string& span, Millis key_retention) {
  const StepDefinition& def = facts.definition.steps[index];
  StepRecord step = facts.steps[index];
  Change change = At(facts);
  step.state = StepState::kRunning;
  step.attempts += 1;
  step.idempotency_key = key;
  step.request_hash = hash;
  step.response_json.clear();  // an earlier 2xx-without-id answer no longer speaks for it
  step.next_attempt_at = 0;
  if (step.started_at == 0) step.started_at = facts.now;
  step.span_id = span;
  change.steps.push_back(step);
  if (def.request.SideEffecting()) {
    change.idempotency = IdempotencyClaim{facts.instance.tenant,
                                          key,
                                          hash,
                                          facts.instance.id,
                                          def.name,
                                          facts.now + key_retention,
                                          /*exclusive=*/!def.notify.empty()};
  }
  return change;
}

namespace {

// Whether a failure could follow an effect on the other side: kMaybe after a 2xx
// the step cannot use. Decides whether an optional step may be passed over.
enum class Acted : uint8_t { kNo = 0, kMaybe = 1 };

// Fails `step`; `forced` overrides the instance's next state. FailStep's body.
Change FailStepTo(const Facts& facts, StepRecord step, ErrorClass error_class,
                  const std::string& message, std::optional<AlertKind> alert,
                  std::optional<InstanceState> forced, Acted acted = Acted::kNo);

Change RejectedAfterUnknown(const Facts& facts, StepRecord step, const std::string& detail);

}  // namespace

Change RecordCall(const Facts& facts, StepRecord step, const CallResult& result) {
  const StepDefinition& def = facts.definition.steps[step.index];
  const HttpResponse& response = result.response;
  const std::string detail = DescribeResponse(response);
  switch (result.error_class) {
    case ErrorClass::kNone: {
      auto parsed = ParseBody(response.body);
      if (!parsed.ok()) {  // it said yes: an optional step is not passed over
        return FailStepTo(facts, step, ErrorClass::kRejected,
                          "HTTP " + std::to_string(response.outcome.status) + ": " +
                              std::string(parsed.status().message()),
                          std::nullopt, std::nullopt, Acted::kMaybe);
      }
      const Json body = std::move(*parsed);
      const Json* id =
          def.result_external_id.empty() ? nullptr : AtPointer(body, def.result_external_id);
      if (!def.result_external_id.empty() && !HasId(id)) {
        return ResultMissing(facts, step, body, response.outcome.status);
      }
      Change change = At(facts);
      MarkCompleted(step, facts.now);
      step.response_json = KeptAnswer(body, def);
      if (id != nullptr) step.external_id = IdText(*id);
      for (const std::string& header : def.external_id_headers) {
        if (!step.external_id.empty()) break;
        step.external_id = response.Header(header);
      }
      change.steps.push_back(step);
      AddEvent(facts, change, "waystone.step.completed", &step,
               result.accepted ? "HTTP " + std::to_string(response.outcome.status) +
                                     ": accepted before under its key; not sent again"
                               : std::string());
      return change;
    }
    case ErrorClass::kTransient:
      step.error_class = result.error_class;
      step.error_message = ShortenMessage(detail);
      if (def.retry.Exhausted(step.attempts)) {
        return FailStep(facts, step, result.error_class,
                        "retries exhausted after " + std::to_string(step.attempts) +
                            " attempts; last: " + detail,
                        AlertKind::kRetriesExhausted);
      }
      return Retry(facts, step, StepState::kPending, step.attempts, def.retry,
                   response.outcome.retry_after);
    case ErrorClass::kRejected:
      if (response.outcome.identity_refused) {
        // A certificate or client secret to renew, not a business refusal: nothing is
        // undone for it.
        return FailStepAndWait(facts, step,
                               detail +
                                   "; fix the target's certificate, CA or "
                                   "client credentials, then retry the step");
      }
      // 409 Conflict for a resubmission under the same key after an unknown outcome:
      // the target has seen this key (or holds what it made), so the earlier attempt
      // may have taken effect. Any other refusal of a same-key resubmission is one: a
      // target that keeps keys would have answered as the first time had it acted.
      // (After a lookup that proved nothing took effect, even a 409 is a refusal.)
      if (response.outcome.status == 409 && step.unknowns > 0 && def.request.SideEffecting() &&
          !(def.lookup && step.resolution == Resolution::kResubmitted)) {
        return RejectedAfterUnknown(facts, step, detail);
      }
      return FailStep(facts, step, result.error_class, detail, std::nullopt);
    case ErrorClass::kUnknown: {
      if (result.exists) return TargetSaysExists(facts, step, response);
      Change change = At(facts);
      MarkUnknown(step, detail, facts.now);
      const Millis sent_by = result.left_at != 0 ? result.left_at : facts.now;
      if (const Millis settled = LookupNotBefore(def, sent_by); settled > facts.now) {
        step.next_attempt_at = settled;
      }
      change.steps.push_back(step);
      AddEvent(facts, change, "waystone.step.unknown", &step, detail);
      return change;
    }
  }
  return FailStep(facts, step, ErrorClass::kRejected, "unhandled error class", std::nullopt);
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

}  // namespace

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
namespace {

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

}  // namespace

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

Change RecoverRunning(const Facts& facts, int index) {
  Change change = At(facts);
  StepRecord step = facts.steps[index];
  // The request of the interrupted attempt may or may not have left.
  change.attempts.push_back({step.index, 0, AttemptPhase::kCall, false, ConnectionUsed::kNone, 0,
                             ErrorClass::kUnknown,
                             "the worker stopped during the call: whether the request left "
                             "is not known",
                             step.started_at, facts.now});
  MarkUnknown(step, "the worker stopped during the call; its outcome is not known", facts.now);
  // Its worker checked its lease before the first byte left, so a request of its
  // was sent before this claim at the latest.
  step.next_attempt_at = LookupNotBefore(facts.definition.steps[index], facts.now);
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.unknown", &step, step.error_message);
  return change;
}

std::optional<Change> BeyondKeyWindow(const Facts& facts, int index) {
  const StepDefinition& def = facts.definition.steps[index];
  StepRecord step = facts.steps[index];
  if (def.key_window <= 0 || step.unknowns == 0 || step.started_at == 0) return std::nullopt;
  // The request could arrive as late as its timeout from now; the window runs from
  // the first send at the latest (the target accepted it no earlier).
  if (facts.now + def.request.timeout < step.started_at + def.key_window) return std::nullopt;
  const std::string reason = "step '" + step.name +
                             "': an earlier attempt's outcome is unknown and the target keeps "
                             "its key only " +
                             FormatDuration(def.key_window) +
                             " after the first send, which has "
                             "passed: a resend could deliver twice; confirm what happened";
  step.state = StepState::kUnknown;  // not another unknown attempt: nothing was sent
  step.error_class = ErrorClass::kUnknown;
  step.error_message = ShortenMessage(reason);
  step.resolution = Resolution::kNone;
  if (step.unknown_since == 0) step.unknown_since = facts.now;
  return Pause(facts, step, AlertKind::kNeedsOperator, reason);
}

std::optional<Change> ResolveWithoutLookup(const Facts& facts, int index) {
  const StepDefinition& def = facts.definition.steps[index];
  const StepRecord& step = facts.steps[index];
  if (!def.request.SideEffecting()) {
    // A read is safe to repeat.
    if (def.retry.Exhausted(step.attempts)) {
      return FailStep(facts, step, ErrorClass::kUnknown,
                      "retries exhausted after " + std::to_string(step.attempts) + " attempts",
                      AlertKind::kRetriesExhausted);
    }
    return Retry(facts, step, StepState::kPending, step.attempts, def.retry, std::nullopt);
  }
  if (def.lookup) return std::nullopt;
  if (def.idempotency_honored && def.recovery != RecoveryClass::kManual) {
    return ResubmitOrStop(facts, step, "the target deduplicates on the idempotency key");
  }
  return Pause(
      facts, step, AlertKind::kNeedsOperator,
      "step '" + step.name + "' outcome unknown and it has no lookup; confirm what happened");
}

Change RecordLookup(const Facts& facts, StepRecord step, const CallResult& result,
                    const MatchValues& expected) {
  const StepDefinition& def = facts.definition.steps[step.index];
  const LookupSpec& lookup = *def.lookup;
  const HttpResponse& response = result.response;
  const std::string of = "lookup of step '" + step.name + "'";
  if (result.error_class == ErrorClass::kTransient || result.error_class == ErrorClass::kUnknown) {
    if (def.retry.Exhausted(step.lookups)) {
      return Pause(
          facts, step, AlertKind::kRetriesExhausted,
          of + " keeps failing: " + response.error +
              (response.outcome.status ? " HTTP " + std::to_string(response.outcome.status) : ""));
    }
    return Retry(facts, step, StepState::kUnknown, step.lookups, def.retry,
                 response.outcome.retry_after);
  }
  if (result.error_class == ErrorClass::kRejected) {
    return Pause(facts, step, AlertKind::kNeedsOperator,
                 of + " was refused: HTTP " + std::to_string(response.outcome.status));
  }
  if (response.outcome.status != kNotFound && response.outcome.status != kNoContent &&
      response.body.empty()) {
    // A 2xx without a body proves nothing: an answer cut after its head (a proxy, a
    // server stopping) reads this way. Only a 404, a 204 or a body that says so is
    // "none"; this one is asked again, never taken for nothing found (found by verify).
    if (def.retry.Exhausted(step.lookups)) {
      return Pause(facts, step, AlertKind::kRetriesExhausted,
                   of + " keeps answering HTTP " + std::to_string(response.outcome.status) +
                       " without a body");
    }
    return Retry(facts, step, StepState::kUnknown, step.lookups, def.retry, std::nullopt);
  }
  auto parsed = response.outcome.status == kNotFound ? absl::StatusOr<Json>(nullptr)
                                                     : ParseBody(response.body);
  if (!parsed.ok()) {
    return Pause(facts, step, AlertKind::kNeedsOperator,
                 of + ": " + std::string(parsed.status().message()));
  }
  const Json body = std::move(*parsed);
  auto candidates = Candidates(lookup, body, expected);
  if (!candidates.ok()) {
    return Pause(facts, step, AlertKind::kLookupContradiction,
                 of + ": " + std::string(candidates.status().message()));
  }
  if (candidates->size() > 1) {
    return Pause(facts, step, AlertKind::kLookupContradiction,
                 of + " found " + std::to_string(candidates->size()) +
                     " objects that each could be this step's; an operator decides which");
  }
  if (candidates->empty()) {
    if (!step.response_json.empty()) {
      // The target answered 2xx (or "exists") to this step, yet the lookup finds
      // nothing: a search may lag behind the write, so ask again before calling it
      // a contradiction. Never resubmitted.
      if (!def.retry.Exhausted(step.lookups)) {
        return Retry(facts, step, StepState::kUnknown, step.lookups, def.retry, std::nullopt);
      }
      return Pause(facts, step, AlertKind::kLookupContradiction,
                   "step '" + step.name + "' was answered with success (" + step.error_message +
                       ") but its lookup finds nothing after " + std::to_string(step.lookups) +
                       " lookups");
    }
    return ResubmitOrStop(facts, step, "the lookup found nothing");
  }
  const Json* found = candidates->front();
  std::string external_id;
  if (!lookup.external_id.empty()) {
    const Json& within = lookup.items.empty() ? body : *found;
    if (const Json* id = AtPointer(within, lookup.external_id); HasId(id)) {
      external_id = IdText(*id);
    }
  }
  if (!def.result_external_id.empty() && external_id.empty() && step.external_id.empty()) {
    return Pause(facts, step, AlertKind::kLookupContradiction,
                 of + " found an object without an external id at " + lookup.external_id);
  }
  if (!step.external_id.empty() && !external_id.empty() && external_id != step.external_id) {
    return Pause(facts, step, AlertKind::kLookupContradiction,
                 of + " found " + external_id + " but the recorded result is " + step.external_id);
  }
  Change change = At(facts);
  MarkCompleted(step, facts.now);
  step.resolution = Resolution::kLookupFound;
  if (!external_id.empty()) step.external_id = external_id;
  step.response_json = KeptAnswer(*found, def);
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.completed", &step, "outcome found by lookup");
  return change;
}

Change LookupUnproven(const Facts& facts, const StepRecord& step, const std::string& why) {
  return Pause(
      facts, step, AlertKind::kNeedsOperator,
      "lookup of step '" + step.name + "' proves nothing: " + why + "; confirm what happened");
}

AnswerClass ClassifyAnswer(const HttpResponse& response, const AnswerRules& rules) {
  static const StatusOverrides kNoOverrides;
  AnswerClass read;
  read.error_class =
      Classify(response.outcome, rules.overrides != nullptr ? *rules.overrides : kNoOverrides);
  if (response.outcome.kind != CallOutcome::Kind::kResponse) return read;
  if (rules.body != nullptr && !rules.body->empty()) {
    if (std::optional<AnswerClass> said = ByBodyRules(*rules.body, response)) read = *said;
  }
  if (rules.accepted != nullptr && std::find(rules.accepted->begin(), rules.accepted->end(),
                                             response.outcome.status) != rules.accepted->end()) {
    read.error_class = ErrorClass::kNone;
    read.accepted = true;
  }
  return read;
}

Change RecordTransform(const Facts& facts, int index, const absl::StatusOr<std::string>& output,
                       Millis started_at) {
  StepRecord step = facts.steps[index];
  step.attempts += 1;
  if (!output.ok()) {
    return FailStep(facts, step, ErrorClass::kRejected, std::string(output.status().message()),
                    std::nullopt);
  }
  Change change = At(facts);
  MarkCompleted(step, facts.now);
  step.response_json = *output;
  step.started_at = started_at;
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.completed", &step);
  return change;
}

Change RecordSql(const Facts& facts, int index, BusinessStatement statement, Millis started_at) {
  StepRecord step = facts.steps[index];
  step.attempts += 1;
  Change change = At(facts);
  MarkCompleted(step, facts.now);
  step.started_at = started_at;
  change.steps.push_back(step);
  statement.step_index = index;
  statement.records_result = true;
  change.statements.push_back(std::move(statement));
  AddEvent(facts, change, "waystone.step.completed", &step);
  return change;
}

Change RunWait(const Facts& facts, int index) {
  const StepDefinition& def = facts.definition.steps[index];
  StepRecord step = facts.steps[index];
  if (step.state == StepState::kWaiting) {
    step.attempts += 1;
    return FailStep(facts, step, ErrorClass::kRejected,
                    "no event of type '" + def.wait_event + "' arrived within " +
                        FormatDuration(def.wait_timeout),
                    std::nullopt);
  }
  Change change = At(facts);
  step.state = StepState::kWaiting;
  step.started_at = facts.now;
  step.next_attempt_at = def.wait_timeout > 0 ? facts.now + def.wait_timeout : 0;
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.waiting", &step, "waiting for event " + def.wait_event);
  return change;
}

Change EventArrived(const Facts& facts, int index, const std::string& data_json,
                    const std::string& event_id, const std::string& event) {
  StepRecord step = facts.steps[index];
  Change change = At(facts);
  step.attempts += 1;
  // What the workflow reads of the event's data, like any answer (store_response).
  step.response_json =
      KeptAnswer(Json::parse(data_json.empty() ? "null" : data_json, nullptr, false),
                 facts.definition.steps[index]);
  step.external_id = event_id;
  if (step.started_at == 0) step.started_at = facts.now;
  MarkCompleted(step, facts.now);
  change.steps.push_back(step);
  AddEvent(facts, change, "waystone.step.completed", &step, event);
  return change;
}

namespace {

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

Change RecordSqlCompensation(const Facts& facts, int index, BusinessStatement statement) {
  StepRecord step = facts.steps[index];
  Change change = At(facts);
  step.state = StepState::kCompensated;
  step.compensation_attempts += 1;
  step.error_class = ErrorClass::kNone;
  step.error_message.clear();
  step.next_attempt_at = 0;
  change.steps.push_back(step);
  statement.step_index = index;
  statement.records_result = false;
  change.statements.push_back(std::move(statement));
  change.audits.push_back(
      EngineAudit(facts, step, "", "compensated", "compensate.sql committed with the checkpoint"));
  AddEvent(facts, change, "waystone.step.compensated", &step);
  return change;
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
