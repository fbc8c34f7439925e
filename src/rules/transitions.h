#pragma once

// The rules of recovery: what a step's outcome does to its checkpoint and to the
// instance. Each transition is a pure function of the instance as last committed,
// its steps, what just happened (a call's outcome, a lookup's answer, an event, an
// operator's action) and `now`; it returns the Change to commit — step rows,
// instance state, outbox events, alerts, audit records, claims — and touches
// nothing else. The runner renders requests, sends them, and commits what these
// return (adding its lease and the attempt records); signals and operator actions
// commit what the same builders return. Decide (state_machine.h) says which
// transition is due; tests/rules/transitions_test.cc is the table of every rule.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/random.h"
#include "model/definition.h"
#include "model/http_response.h"
#include "model/records.h"

namespace waystone {

// The instance a transition applies to, as of its last commit. `random` gives the
// outbox events their ids and retries their jitter (tests seed it).
struct Facts {
  const WorkflowDefinition& definition;
  const InstanceRecord& instance;
  const std::vector<StepRecord>& steps;
  Millis now;
  Random& random;
  // Steps whose call is under way in the runner's drive (parallel branches): a
  // failure beside one waits for its outcome (StateAfterFailure). Null: none.
  const std::vector<int>* busy = nullptr;
};

// One request sent and what it means: the answer (or the transport failure) and its
// error class by Classify, after the step's status overrides.
struct CallResult {
  HttpResponse response;
  ErrorClass error_class = ErrorClass::kNone;
  Millis left_at = 0;   // when the client let the request go (its last-moment check; 0: unknown)
  bool exists = false;  // an `errors.body` rule said the object exists already
  // The status is one of the step's accepted_statuses: the target accepted this very
  // request before, under its key (LINE's 409); classed kNone.
  bool accepted = false;
};

// How a step reads an answer: its `errors:` status overrides, its `errors.body` rules
// and the statuses that mean "accepted before under this key". Null: none.
struct AnswerRules {
  const StatusOverrides* overrides = nullptr;
  const std::vector<BodyErrorRule>* body = nullptr;
  const std::vector<int>* accepted = nullptr;
};

// What an answer means, as CallResult carries it.
struct AnswerClass {
  ErrorClass error_class = ErrorClass::kNone;
  bool exists = false;
  bool accepted = false;
};

// The one place an answer is classified; both drivers call it and the transitions
// receive what it returns. The class by status (Classify, after the overrides); then
// the first `errors.body` rule whose status (when set) and every match value hold on
// a complete answer gives the class (and for `exists`, the flag); then a status among
// the accepted ones means the target accepted this very request before (kNone,
// `accepted`).
AnswerClass ClassifyAnswer(const HttpResponse& response, const AnswerRules& rules);

// The values a lookup's `match` pointers must equal, rendered by the runner (or why
// they could not be).
using MatchValues = absl::StatusOr<std::vector<std::pair<std::string, std::string>>>;

// --- Builders shared by the engine, signals and operators -------------------------

// Marks `step` completed at `now`: no error, no longer unknown, nothing due.
void MarkCompleted(StepRecord& step, Millis now);

// --- Forward: calls ---------------------------------------------------------------

// The checkpoint before a call: the step `running` with one more attempt, its key,
// request hash and span, and for a side-effecting call the idempotency claim kept
// for `key_retention`. A crash from here on leaves an unknown outcome.
Change BeginCall(const Facts& facts, int index, const std::string& key, const std::string& hash,
                 const std::string& span, Millis key_retention);

// What a call's result does to the step `running` returned by BeginCall: completed
// (with its external id), pending with a backoff (transient), failed (rejected, or
// retries exhausted), unknown (sent, no answer; a 2xx without the external id too).
// An unknown step with a lookup looks no earlier than the request's whole timeout
// after it left (a reset or a proxy's early close does not mean the target has
// finished with it). A certificate refused at the TLS layer fails the step without
// a retry and waits for an operator instead of compensating.
Change RecordCall(const Facts& facts, StepRecord running, const CallResult& result);

// Fails `step` (with `error_class` and `message`) and moves the instance on:
// compensating, failed, or needs_attention for a manual step; raises `alert` if given.
// An optional step's failure alerts (optional_step_failed) and the instance goes on
// (the step's resolution passed_over) when it proves nothing was done; one that may
// have acted (an unknown outcome before on a call that changes something, an alert
// other than retries_exhausted) waits for an operator instead, nothing undone.
Change FailStep(const Facts& facts, StepRecord step, ErrorClass error_class,
                const std::string& message, std::optional<AlertKind> alert);

// Moves the instance on from step `index`, which failed while a call beside it was
// under way (the instance stayed running): where StateAfterFailure says now that the
// branches beside it are at rest, with the alert an operator needs when that is
// needs_attention.
Change SettleFailure(const Facts& facts, int index);

// Skips step `index` because its `when` does not hold (`why` says which): state
// skipped, nothing sent, no attempt; the workflow goes on.
Change SkipStep(const Facts& facts, int index, const std::string& why);

// Fails `step` (rejected, `message`) and pauses the instance for an operator
// (needs_attention, alerted) instead of compensating: for a failure an operator fixes
// outside the workflow (a certificate) before retrying the step.
Change FailStepAndWait(const Facts& facts, StepRecord step, const std::string& message);

// Pauses the instance for an operator (needs_attention, with `alert`), leaving the step.
Change Pause(const Facts& facts, const StepRecord& step, AlertKind alert,
             const std::string& reason);

// The instance waits for a target that refused its call (paused, circuit open, at
// its concurrency cap or rate limit): nothing was sent and no step changes. Its
// reason says so (model/target_gate.h, kAwaitingTarget), keeping the reason it had
// after kBeforeWaiting; the next transition gives that one back.
Change AwaitTarget(const Facts& facts, const std::string& reason);

// A step found `running` when its instance was claimed: the worker stopped during
// the call, so its outcome is unknown (with an attempt record saying so). A step
// with a lookup looks no earlier than one request timeout after `now`: the worker
// before may have sent its request up to the moment its lease ran out.
Change RecoverRunning(const Facts& facts, int index);

// A step about to be sent again after an unknown outcome (`unknowns` > 0) whose target
// deduplicates its key only for `key_window` after the first send (LINE's retry key:
// 24 h): once the window has passed (by the time the request could arrive), a resend
// could deliver twice, so the step becomes unknown and the instance waits for an
// operator instead. nullopt: inside the window (or no window), send.
std::optional<Change> BeyondKeyWindow(const Facts& facts, int index);

// --- Forward: unknown outcomes ----------------------------------------------------

// Settles an unknown step that needs no lookup: a read is repeated (or fails when
// its retries ran out); with an honoured idempotency key it is resubmitted under the
// same key; otherwise the instance pauses. nullopt: the step has a lookup to run.
std::optional<Change> ResolveWithoutLookup(const Facts& facts, int index);

// What a lookup's answer does to the unknown step (whose `lookups` counts this one):
// exactly one matching object adopts it (completed, lookup_found); none resubmits it
// under the same key; several, or one that contradicts the record, pause it. When
// the target answered success or "exists" to the step, none is asked again after a
// backoff (a search index may lag behind the write) until the retries run out, and
// is then a contradiction. A paginated lookup's answer holds every page's candidates.
Change RecordLookup(const Facts& facts, StepRecord step, const CallResult& result,
                    const MatchValues& expected);

// A lookup whose pages could not all be read (`why`: too many, an unusable next
// link): nothing is proven either way, so the instance pauses for an operator.
Change LookupUnproven(const Facts& facts, const StepRecord& step, const std::string& why);

// --- Forward: transforms and waits -----------------------------------------------

// A transform step's output (JSON text), or why it could not be rendered.
Change RecordTransform(const Facts& facts, int index, const absl::StatusOr<std::string>& output,
                       Millis started_at);

// A sql step commits: completed, with `statement` run in the same transaction (its
// rows become the step's result there); if the statement fails, nothing of this
// change is written and the runner fails the step (FailStep, rejected) instead.
Change RecordSql(const Facts& facts, int index, BusinessStatement statement, Millis started_at);

// A wait step becomes due: it starts waiting (until its timeout), or, when it was
// waiting already, its deadline passed and it fails.
Change RunWait(const Facts& facts, int index);

// The event a waiting step waits for arrived: the step completes with what it keeps
// of `data_json`, its external id the event's id. `event` describes it.
Change EventArrived(const Facts& facts, int index, const std::string& data_json,
                    const std::string& event_id, const std::string& event);

// --- Compensation -----------------------------------------------------------------

// The checkpoint before a compensation call (one more attempt, audited). Its error
// class is unknown until RecordCompensation writes the outcome.
Change BeginCompensation(const Facts& facts, int index, const std::string& key);

// A compensation the target cannot deduplicate (CompensationSpec::at_most_once: an
// email's correction) found begun but never recorded: its worker stopped while it
// was on its way, so it may have arrived. It is not sent again: compensation_failed,
// for an operator (who may retry it). nullopt: send it.
std::optional<Change> CompensationInFlight(const Facts& facts, int index);

// What a compensation call's result does: compensated, retried with a backoff, or
// compensation_failed (the instance needs attention). An at-most-once compensation
// whose outcome is unknown is not retried: compensation_failed, for an operator.
Change RecordCompensation(const Facts& facts, StepRecord compensating, const CallResult& result,
                          const std::string& key);

// A sql step's compensation commits: compensated (audited), `statement` run in the
// same transaction; if it fails, the runner records CompensationFailed instead.
Change RecordSqlCompensation(const Facts& facts, int index, BusinessStatement statement);

// The compensation of `step` failed for good (`message`): needs_attention, alerted.
Change CompensationFailed(const Facts& facts, StepRecord step, const std::string& message,
                          const std::string& key);

// --- The instance -----------------------------------------------------------------

// Moves the instance to its final state (completed, compensated or failed).
Change Finish(const Facts& facts, InstanceState final_state);

// Returns the text an outbox event and a stored message say about a failed call:
// "HTTP 422: <body>" or the transport error.
std::string DescribeResponse(const HttpResponse& response);

// Returns `text` cut to what a checkpoint stores.
std::string ShortenMessage(std::string_view text);

}  // namespace waystone
