// The rules of an HTTP call step (and a notification's send): its checkpoint before
// the call, what its answer does, how an unknown outcome is settled (lookup, resubmit
// under the same key, or an operator), what a restart finds of a call under way, and
// the one classification of an answer (ClassifyAnswer). Declared in transitions.h.

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/duration.h"
#include "model/json_text.h"
#include "rules/transition_parts.h"
#include "rules/transitions.h"

namespace waystone {

namespace {

using Json = nlohmann::json;

// A lookup answered 404 found nothing: that is an answer, not a failure.
constexpr int kNotFound = 404;
constexpr int kNoContent = 204;

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

// Returns when the lookup of an unknown step may run, given that its request may
// have left as late as `sent_by`: the target has the request's whole timeout to act
// on it, as it has after a timeout of our own, so a lookup that finds nothing then
// means nothing happened. Steps without a lookup settle otherwise: 0.
Millis LookupNotBefore(const StepDefinition& def, Millis sent_by) {
  if (!def.lookup || !def.request.SideEffecting()) return 0;
  return sent_by + def.request.timeout;
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

}  // namespace

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

}  // namespace waystone
