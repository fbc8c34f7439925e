#include "engine/instance_runner.h"

#include <chrono>

#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "engine/call_metrics.h"
#include "engine/context.h"
#include "engine/events.h"
#include "engine/state_machine.h"
#include "model/duration.h"
#include "model/json_text.h"
#include "model/keys.h"
#include "model/template.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxStoredMessage = 500;

std::string Shorten(std::string_view text) {
  if (text.size() <= kMaxStoredMessage) return std::string(text);
  return std::string(text.substr(0, kMaxStoredMessage)) + "...";
}

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

// Describes a failed call for checkpoints and alerts: "HTTP 422: <body>" or the
// transport error.
std::string Describe(const HttpResponse& response) {
  if (response.outcome.kind != CallOutcome::Kind::kResponse) return response.error;
  return "HTTP " + std::to_string(response.outcome.status) +
         (response.body.empty() ? "" : ": " + Shorten(response.body));
}

// A lookup answered 404 found nothing: that is an answer, not a failure.
const StatusOverrides kLookupStatuses = {{404, ErrorClass::kNone}};

// Returns true when a rendered header value would end its line (header injection).
bool BreaksHeaderLine(std::string_view value) {
  return value.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

// Returns true when a JSON value is a usable external id (not absent, null or "").
bool HasId(const Json* value) {
  return value != nullptr && !value->is_null() && !(value->is_string() && value->empty());
}

std::string EventTypeFor(InstanceState state) {
  return "waystone.instance." + std::string(ToString(state));
}

}  // namespace

class InstanceRunner::Impl {
 public:
  Impl(const RunnerDeps& deps, Lease lease) : d_(deps), lease_(std::move(lease)) {}

  absl::StatusOr<DriveResult> Drive(std::stop_token stop) {
    WS_RETURN_IF_ERROR(Load());
    while (true) {
      const Millis now = d_.clock->NowMillis();
      if (stop.stop_requested()) return Release(std::nullopt);
      const NextAction action = Decide(*definition_, instance_, steps_, now);
      absl::Status status;
      switch (action.kind) {
        case NextAction::Kind::kIdle:
          return Release(std::nullopt);
        case NextAction::Kind::kWait:
          return Release(action.wait_until);
        case NextAction::Kind::kAwaitEvent: {
          // Parked until POST /v1/events completes the step (which wakes it) or the deadline.
          auto result = Release(action.wait_until != 0 ? std::optional<Millis>(action.wait_until)
                                                       : std::nullopt,
                                kNoDueTime);
          if (result.ok()) result->awaiting_event = true;
          return result;
        }
        case NextAction::Kind::kFinish:
          return Finish(Complete(action.final_state), std::nullopt);
        case NextAction::Kind::kRunStep:
          status = RunStep(action.step);
          break;
        case NextAction::Kind::kRecoverRunning:
          status = RecoverRunning(action.step);
          break;
        case NextAction::Kind::kResolveUnknown:
          status = ResolveUnknown(action.step);
          break;
        case NextAction::Kind::kCompensate:
          status = Compensate(action.step);
          break;
      }
      if (!status.ok()) return Finish(status, std::nullopt);
    }
  }

 private:
  // Lets go of the instance until `wake_at` (its next_run_at; without one the
  // instance keeps `otherwise` when given, or its current due time).
  absl::StatusOr<DriveResult> Release(std::optional<Millis> wake_at,
                                      std::optional<Millis> otherwise = std::nullopt) {
    Change release = NewChange();
    release.lease_expires_at = 0;
    release.next_run_at = wake_at ? wake_at : otherwise;
    return Finish(CommitChange(release), wake_at);
  }

  absl::StatusOr<DriveResult> Finish(const absl::Status& status, std::optional<Millis> wake_at) {
    if (absl::IsAborted(status)) {
      Log(LogLevel::kInfo, "instance " + instance_.key + ": " + std::string(status.message()));
      return DriveResult{instance_.state, std::nullopt, true};
    }
    if (!status.ok()) return status;
    return DriveResult{instance_.state, wake_at, false};
  }

  absl::Status Load() {
    WS_ASSIGN_OR_RETURN(instance_, d_.store->GetInstance(lease_.instance_id));
    lease_until_ = instance_.lease_epoch == lease_.epoch ? instance_.lease_expires_at : 0;
    WS_ASSIGN_OR_RETURN(steps_, d_.store->GetSteps(lease_.instance_id));
    WS_ASSIGN_OR_RETURN(definition_, d_.catalog->Get(instance_.definition_hash));
    if (steps_.size() != definition_->steps.size()) {
      return absl::DataLossError("instance " + instance_.key + " has " +
                                 std::to_string(steps_.size()) + " step rows but its definition " +
                                 std::to_string(definition_->steps.size()) + " steps");
    }
    return absl::OkStatus();
  }

  // Returns a change under this drive's lease, carrying the attempt records of the
  // requests sent since the last one (they commit with the outcome they led to).
  Change NewChange() {
    Change change;
    change.lease = lease_;
    change.now = d_.clock->NowMillis();
    change.lease_expires_at = change.now + d_.lease_duration;
    change.attempts = std::move(pending_attempts_);
    pending_attempts_.clear();
    return change;
  }

  // Commits `change` and, once durable, mirrors it into the in-memory view.
  absl::Status CommitChange(const Change& change) {
    WS_RETURN_IF_ERROR(d_.commits->Commit(change));
    lease_until_ = change.lease_expires_at;
    if (change.state) instance_.state = *change.state;
    if (change.status_reason) instance_.status_reason = *change.status_reason;
    if (change.next_run_at) instance_.next_run_at = *change.next_run_at;
    for (const StepRecord& step : change.steps) steps_[step.index] = step;
    return absl::OkStatus();
  }

  void AddEvent(Change& change, std::string_view type, const StepRecord* step,
                std::string_view message = {}) {
    change.events.push_back(
        MakeEvent(type, instance_, step, message, *d_.random, change.now));
  }

  void AddAlert(Change& change, AlertKind kind, const std::string& step,
                const std::string& message) {
    change.alerts.push_back({0, instance_.id, instance_.tenant, step, kind, AlertState::kOpen,
                             message, change.now});
    // Alerts are pushed, not only listed: each leaves through the outbox once.
    StepRecord about;
    about.name = step;
    change.events.push_back(MakeEvent("waystone.alert." + std::string(ToString(kind)), instance_,
                                      step.empty() ? nullptr : &about, message, *d_.random,
                                      change.now));
  }

  // Moves the instance to `state` with its event and, for a pause, an alert.
  void SetInstanceState(Change& change, InstanceState state, const std::string& reason) {
    change.state = state;
    change.status_reason = reason;
    change.next_run_at = change.now;
    AddEvent(change, EventTypeFor(state), nullptr, reason);
  }

  absl::Status Complete(InstanceState final_state) {
    Change change = NewChange();
    change.lease_expires_at = 0;
    const std::string reason = final_state == InstanceState::kCompleted
                                   ? "all steps completed"
                                   : (final_state == InstanceState::kCompensated
                                          ? "completed steps were compensated"
                                          : instance_.status_reason);
    SetInstanceState(change, final_state, reason);
    return CommitChange(change);
  }

  Json Context(int step_index, const std::string& key) const {
    return d_.environment->Build(instance_, steps_, definition_->steps[step_index].name, key);
  }

  absl::StatusOr<HttpRequest> Render(const RequestSpec& spec, const Json& context) const {
    HttpRequest request;
    request.method = spec.method;
    request.timeout = spec.timeout;
    WS_ASSIGN_OR_RETURN(Template url, Template::Parse(spec.url));
    WS_ASSIGN_OR_RETURN(request.url, url.RenderUrl(context));
    for (const auto& [name, value] : spec.headers) {
      WS_ASSIGN_OR_RETURN(Template header, Template::Parse(value));
      WS_ASSIGN_OR_RETURN(std::string text, header.RenderText(context));
      if (BreaksHeaderLine(text)) {
        return absl::InvalidArgumentError("header '" + name +
                                          "' would contain a line break or NUL; refused");
      }
      request.headers.emplace_back(name, std::move(text));
    }
    if (!spec.body_json.empty()) {
      WS_ASSIGN_OR_RETURN(Json body, RenderTree(Json::parse(spec.body_json), context));
      request.body = JsonText(body);
    }
    return request;
  }

  // Returns Aborted when the lease ran out since the last commit (this process
  // was stopped or stalled): another worker may own the instance, so nothing is sent.
  absl::Status StillLeased() const {
    if (d_.clock->NowMillis() < lease_until_) return absl::OkStatus();
    return absl::AbortedError("lease of instance " + instance_.key +
                              " ran out before the call; the request was not sent");
  }

  // One request sent and what it means.
  struct Sent {
    HttpResponse response;
    ErrorClass error_class = ErrorClass::kNone;  // by Classify, after the step's overrides
  };

  // Sends one request for step `step_index`, classifies the outcome once (with
  // `overrides`), counts it in the call metrics, and keeps its attempt record for
  // the next change (the store numbers it).
  Sent TimedSend(CallPhase phase, const HttpRequest& request, int step_index,
                 const StatusOverrides& overrides) {
    const Millis started_at = d_.clock->NowMillis();
    const auto start = std::chrono::steady_clock::now();
    Sent sent{d_.http->Send(request)};
    const HttpResponse& response = sent.response;
    d_.metrics->RecordLatency(
        phase, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    sent.error_class = Classify(response.outcome, overrides);
    d_.metrics->RecordOutcome(phase, sent.error_class);
    AttemptRecord attempt;
    attempt.step_index = step_index;
    attempt.phase = phase == CallPhase::kCall     ? AttemptPhase::kCall
                    : phase == CallPhase::kLookup ? AttemptPhase::kLookup
                                                  : AttemptPhase::kCompensate;
    attempt.sent = response.outcome.sent;
    attempt.connection = response.outcome.connection;
    attempt.status = response.outcome.kind == CallOutcome::Kind::kResponse
                         ? response.outcome.status : 0;
    attempt.error_class = sent.error_class;
    attempt.detail = Shorten(Describe(response));
    attempt.started_at = started_at;
    attempt.finished_at = d_.clock->NowMillis();
    pending_attempts_.push_back(std::move(attempt));
    return sent;
  }

  // Adds trace context and, for a side-effecting call, the idempotency key.
  std::string Decorate(HttpRequest& request, const std::string& idempotency_key) {
    const std::string span = d_.random->Hex(8);
    request.headers.emplace_back("traceparent", "00-" + instance_.trace_id + "-" + span + "-01");
    if (!idempotency_key.empty()) request.headers.emplace_back("Idempotency-Key", idempotency_key);
    return span;
  }

  std::string StepKey(int index) {
    return StepIdempotencyKey(*definition_, instance_, steps_, index, *d_.environment);
  }

  // Records a failed step and moves the instance on: compensation, failed, or a pause.
  absl::Status FailStep(StepRecord step, ErrorClass error_class, const std::string& message,
                        std::optional<AlertKind> alert) {
    Change change = NewChange();
    step.state = StepState::kFailed;
    step.unknown_since = 0;
    step.error_class = error_class;
    step.error_message = Shorten(message);
    step.finished_at = change.now;
    step.next_attempt_at = 0;
    change.steps.push_back(step);
    std::vector<StepRecord> after = steps_;
    after[step.index] = step;
    const InstanceState next = StateAfterFailure(*definition_, after, step.index);
    const std::string reason = "step '" + step.name + "' failed (" +
                               std::string(ToString(error_class)) + "): " + Shorten(message);
    AddEvent(change, "waystone.step.failed", &step, message);
    if (alert) AddAlert(change, *alert, step.name, reason);
    if (next == InstanceState::kNeedsAttention && alert != AlertKind::kNeedsOperator) {
      AddAlert(change, AlertKind::kNeedsOperator, step.name,
               reason + "; manual step: an operator decides");
    }
    SetInstanceState(change, next, reason);
    return CommitChange(change);
  }

  // Pauses the instance for an operator, leaving the step as it is.
  absl::Status Pause(StepRecord step, AlertKind alert, const std::string& reason) {
    Change change = NewChange();
    change.steps.push_back(step);
    AddAlert(change, alert, step.name, reason);
    SetInstanceState(change, InstanceState::kNeedsAttention, reason);
    return CommitChange(change);
  }

  // Schedules the step's next attempt (or lookup) after a backoff.
  absl::Status Retry(StepRecord step, StepState state, int attempts_made,
                     const RetryPolicy& policy, std::optional<Millis> retry_after) {
    Change change = NewChange();
    step.state = state;
    step.next_attempt_at = change.now + policy.NextDelay(attempts_made, retry_after, *d_.random);
    change.steps.push_back(step);
    return CommitChange(change);
  }

  absl::Status RunTransform(int index) {
    const StepDefinition& def = definition_->steps[index];
    StepRecord step = steps_[index];
    const Millis started = d_.clock->NowMillis();
    auto output = RenderTree(Json::parse(def.transform_json), Context(index, ""));
    if (!output.ok()) {
      step.attempts += 1;
      return FailStep(step, ErrorClass::kRejected, std::string(output.status().message()),
                      std::nullopt);
    }
    Change change = NewChange();
    step.state = StepState::kCompleted;
    step.attempts += 1;
    step.response_json = JsonText(*output);
    step.started_at = started;
    step.finished_at = change.now;
    step.error_class = ErrorClass::kNone;
    step.error_message.clear();
    change.steps.push_back(step);
    AddEvent(change, "waystone.step.completed", &step);
    return CommitChange(change);
  }

  // Starts waiting for the step's event, or fails it when its deadline passed.
  absl::Status RunWait(int index) {
    const StepDefinition& def = definition_->steps[index];
    StepRecord step = steps_[index];
    if (step.state == StepState::kWaiting) {
      step.attempts += 1;
      return FailStep(step, ErrorClass::kRejected,
                      "no event of type '" + def.wait_event + "' arrived within " +
                          FormatDuration(def.wait_timeout),
                      std::nullopt);
    }
    Change change = NewChange();
    step.state = StepState::kWaiting;
    step.started_at = change.now;
    step.next_attempt_at = def.wait_timeout > 0 ? change.now + def.wait_timeout : 0;
    change.steps.push_back(step);
    AddEvent(change, "waystone.step.waiting", &step, "waiting for event " + def.wait_event);
    return CommitChange(change);
  }

  absl::Status RunStep(int index) {
    const StepDefinition& def = definition_->steps[index];
    if (def.kind == StepKind::kTransform) return RunTransform(index);
    if (def.kind == StepKind::kWait) return RunWait(index);
    StepRecord step = steps_[index];
    const bool side_effecting = def.request.SideEffecting();
    const std::string key = side_effecting ? StepKey(index) : "";
    if (side_effecting && key.empty()) {
      return FailStep(step, ErrorClass::kRejected,
                      "idempotency key template did not render", std::nullopt);
    }
    if (BreaksHeaderLine(key)) {  // it is sent as the Idempotency-Key header
      return FailStep(step, ErrorClass::kRejected,
                      "the idempotency key would contain a line break or NUL; refused",
                      std::nullopt);
    }
    auto request = Render(def.request, Context(index, key));
    if (!request.ok()) {
      return FailStep(step, ErrorClass::kRejected, std::string(request.status().message()),
                      std::nullopt);
    }
    const std::string hash = RequestHash(request->method, request->url, request->body);
    if (side_effecting && !step.request_hash.empty() && step.request_hash != hash) {
      return FailStep(step, ErrorClass::kRejected,
                      "the request changed since the last attempt under idempotency key '" + key +
                          "' (was " + step.request_hash.substr(0, 16) + ", now " +
                          hash.substr(0, 16) + ")",
                      AlertKind::kIdempotencyConflict);
    }

    // Checkpoint `running` before the call: a crash from here on is an unknown outcome.
    Change before = NewChange();
    step.state = StepState::kRunning;
    step.attempts += 1;
    step.idempotency_key = key;
    step.request_hash = hash;
    step.response_json.clear();  // an earlier 2xx-without-id answer no longer speaks for it
    step.next_attempt_at = 0;
    if (step.started_at == 0) step.started_at = before.now;
    step.span_id = Decorate(*request, key);
    before.steps.push_back(step);
    if (side_effecting) {
      before.idempotency = IdempotencyClaim{instance_.tenant, key, hash, instance_.id, def.name,
                                            before.now + (definition_->step_key_retention > 0
                                                              ? definition_->step_key_retention
                                                              : d_.idempotency_retention)};
    }
    absl::Status claimed = CommitChange(before);
    if (absl::IsFailedPrecondition(claimed)) {
      step = steps_[index];
      return FailStep(step, ErrorClass::kRejected, std::string(claimed.message()),
                      AlertKind::kIdempotencyConflict);
    }
    WS_RETURN_IF_ERROR(claimed);

    Sent sent;
    CrashPoint("before-call", def.name);
    WS_RETURN_IF_ERROR(StillLeased());
    {
      LeaseKeeper::Guard held(d_.keeper, lease_);  // a long call keeps the lease
      sent = TimedSend(CallPhase::kCall, *request, index, def.errors);
    }
    CrashPoint("after-call", def.name);
    return RecordOutcome(index, step, sent);
  }

  absl::Status RecordOutcome(int index, StepRecord step, const Sent& sent) {
    const StepDefinition& def = definition_->steps[index];
    const HttpResponse& response = sent.response;
    const ErrorClass error_class = sent.error_class;
    const std::string detail = Describe(response);
    switch (error_class) {
      case ErrorClass::kNone: {
        auto parsed = ParseBody(response.body);
        if (!parsed.ok()) {
          return FailStep(step, ErrorClass::kRejected,
                          "HTTP " + std::to_string(response.outcome.status) + ": " +
                              std::string(parsed.status().message()),
                          std::nullopt);
        }
        const Json body = std::move(*parsed);
        const Json* id = def.result_external_id.empty()
                             ? nullptr : AtPointer(body, def.result_external_id);
        if (!def.result_external_id.empty() && !HasId(id)) {
          return ResultMissing(index, step, body, response.outcome.status);
        }
        Change change = NewChange();
        step.state = StepState::kCompleted;
        step.unknown_since = 0;
        step.response_json = KeptAnswer(body, def);
        step.error_class = ErrorClass::kNone;
        step.error_message.clear();
        step.finished_at = change.now;
        if (id != nullptr) step.external_id = IdText(*id);
        change.steps.push_back(step);
        AddEvent(change, "waystone.step.completed", &step);
        return CommitChange(change);
      }
      case ErrorClass::kTransient: {
        step.error_class = error_class;
        step.error_message = Shorten(detail);
        if (def.retry.Exhausted(step.attempts)) {
          return FailStep(step, error_class,
                          "retries exhausted after " + std::to_string(step.attempts) +
                              " attempts; last: " + detail,
                          AlertKind::kRetriesExhausted);
        }
        return Retry(step, StepState::kPending, step.attempts, def.retry,
                     response.outcome.retry_after);
      }
      case ErrorClass::kRejected:
        return FailStep(step, error_class, detail, std::nullopt);
      case ErrorClass::kUnknown: {
        Change change = NewChange();
        step.state = StepState::kUnknown;
        step.error_class = ErrorClass::kUnknown;
        step.error_message = Shorten(detail);
        step.unknowns += 1;
        if (step.unknown_since == 0) step.unknown_since = change.now;
        change.steps.push_back(step);
        AddEvent(change, "waystone.step.unknown", &step, detail);
        return CommitChange(change);
      }
    }
    return absl::InternalError("unhandled error class");
  }

  // A 2xx without the external id the step records: something happened, but not
  // what the definition expects (a truncated answer reads this way too). Later URLs
  // would read "/orders//cancel", so it never completes this way: with a lookup the
  // outcome is settled by looking (a lookup that then finds nothing is a
  // contradiction), with an honoured key by asking again under the same key,
  // otherwise an operator decides.
  absl::Status ResultMissing(int index, StepRecord step, const Json& body, int status) {
    const StepDefinition& def = definition_->steps[index];
    const std::string what = "HTTP " + std::to_string(status) + " had no external id at " +
                             def.result_external_id;
    Change change = NewChange();
    step.state = StepState::kUnknown;
    step.error_class = ErrorClass::kUnknown;
    step.error_message = Shorten(what);
    step.response_json = body.is_null() ? "{}" : KeptAnswer(body, def);  // "the target said yes"
    step.unknowns += 1;
    if (step.unknown_since == 0) step.unknown_since = change.now;
    change.steps.push_back(step);
    AddEvent(change, "waystone.step.unknown", &step, what);
    const bool resubmit = def.idempotency_honored && def.recovery != RecoveryClass::kManual;
    if (def.lookup || resubmit) return CommitChange(change);
    const std::string reason = "step '" + step.name + "': " + what +
                               "; confirm the outcome with its external reference";
    AddAlert(change, AlertKind::kResultMissing, step.name, reason);
    SetInstanceState(change, InstanceState::kNeedsAttention, reason);
    return CommitChange(change);
  }

  absl::Status RecoverRunning(int index) {
    Change change = NewChange();
    StepRecord step = steps_[index];
    // The request of the interrupted attempt may or may not have left.
    change.attempts.push_back({step.index, 0, AttemptPhase::kCall, false, ConnectionUsed::kNone, 0,
                               ErrorClass::kUnknown,
                               "the worker stopped during the call: whether the request left "
                               "is not known",
                               step.started_at, change.now});
    step.state = StepState::kUnknown;
    step.error_class = ErrorClass::kUnknown;
    step.error_message = "the worker stopped during the call; its outcome is not known";
    step.unknowns += 1;
    if (step.unknown_since == 0) step.unknown_since = change.now;
    change.steps.push_back(step);
    AddEvent(change, "waystone.step.unknown", &step, step.error_message);
    return CommitChange(change);
  }

  // The outcome is not known and nothing proves the call did not happen: either
  // resubmit under the same key (the target deduplicates), or stop.
  absl::Status ResubmitOrStop(StepRecord step, const std::string& why) {
    const StepDefinition& def = definition_->steps[step.index];
    if (def.recovery == RecoveryClass::kManual) {
      return Pause(step, AlertKind::kNeedsOperator,
                   "step '" + step.name + "' outcome unknown (" + why +
                       "); manual step: confirm what happened");
    }
    if (def.retry.Exhausted(step.attempts)) {
      // It may have happened: the step stays unknown (never failed, never skipped by
      // a compensation) until an operator confirms what the target did.
      return Pause(step, AlertKind::kRetriesExhausted,
                   "step '" + step.name + "': retries exhausted after " +
                       std::to_string(step.attempts) + " attempts; outcome of the last one "
                       "unknown (" + why + "); confirm what happened");
    }
    Change change = NewChange();
    step.state = StepState::kPending;
    step.response_json.clear();
    step.resolution = Resolution::kResubmitted;
    step.next_attempt_at = 0;
    change.steps.push_back(step);
    return CommitChange(change);
  }

  absl::Status ResolveUnknown(int index) {
    const StepDefinition& def = definition_->steps[index];
    StepRecord step = steps_[index];
    if (!def.request.SideEffecting()) {
      // A read is safe to repeat.
      if (def.retry.Exhausted(step.attempts)) {
        return FailStep(step, ErrorClass::kUnknown,
                        "retries exhausted after " + std::to_string(step.attempts) + " attempts",
                        AlertKind::kRetriesExhausted);
      }
      return Retry(step, StepState::kPending, step.attempts, def.retry, std::nullopt);
    }
    if (!def.lookup) {
      if (def.idempotency_honored && def.recovery != RecoveryClass::kManual) {
        return ResubmitOrStop(step, "the target deduplicates on the idempotency key");
      }
      return Pause(step, AlertKind::kNeedsOperator,
                   "step '" + step.name +
                       "' outcome unknown and it has no lookup; confirm what happened");
    }

    auto request = Render(def.lookup->request, Context(index, step.idempotency_key));
    if (!request.ok()) {
      return Pause(step, AlertKind::kNeedsOperator,
                   "lookup of step '" + step.name +
                       "' cannot be built: " + std::string(request.status().message()));
    }
    Decorate(*request, "");
    WS_RETURN_IF_ERROR(StillLeased());
    step.lookups += 1;
    Sent sent;
    {
      LeaseKeeper::Guard held(d_.keeper, lease_);
      sent = TimedSend(CallPhase::kLookup, *request, index, kLookupStatuses);
    }
    const HttpResponse& response = sent.response;
    const ErrorClass error_class = sent.error_class;
    if (error_class == ErrorClass::kTransient || error_class == ErrorClass::kUnknown) {
      if (def.retry.Exhausted(step.lookups)) {
        return Pause(step, AlertKind::kRetriesExhausted,
                     "lookup of step '" + step.name + "' keeps failing: " + response.error +
                         (response.outcome.status ? " HTTP " + std::to_string(response.outcome.status)
                                                  : ""));
      }
      return Retry(step, StepState::kUnknown, step.lookups, def.retry,
                   response.outcome.retry_after);
    }
    if (error_class == ErrorClass::kRejected) {
      return Pause(step, AlertKind::kNeedsOperator,
                   "lookup of step '" + step.name + "' was refused: HTTP " +
                       std::to_string(response.outcome.status));
    }
    auto parsed = response.outcome.status == 404 ? absl::StatusOr<Json>(nullptr)
                                                 : ParseBody(response.body);
    if (!parsed.ok()) {
      return Pause(step, AlertKind::kNeedsOperator,
                   "lookup of step '" + step.name + "': " + std::string(parsed.status().message()));
    }
    const Json body = std::move(*parsed);
    auto candidates = Candidates(index, body);
    if (!candidates.ok()) {
      return Pause(step, AlertKind::kLookupContradiction,
                   "lookup of step '" + step.name + "': " + std::string(candidates.status().message()));
    }
    if (candidates->size() > 1) {
      return Pause(step, AlertKind::kLookupContradiction,
                   "lookup of step '" + step.name + "' found " +
                       std::to_string(candidates->size()) +
                       " objects that each could be this step's; an operator decides which");
    }
    if (candidates->empty()) {
      if (!step.response_json.empty()) {
        // The target answered 2xx to this step, yet the lookup finds nothing.
        return Pause(step, AlertKind::kLookupContradiction,
                     "step '" + step.name + "' was answered with success (" + step.error_message +
                         ") but its lookup finds nothing");
      }
      return ResubmitOrStop(step, "the lookup found nothing");
    }
    const Json* found = candidates->front();
    std::string external_id;
    if (!def.lookup->external_id.empty()) {
      const Json& within = def.lookup->items.empty() ? body : *found;
      if (const Json* id = AtPointer(within, def.lookup->external_id); HasId(id)) {
        external_id = IdText(*id);
      }
    }
    if (!def.result_external_id.empty() && external_id.empty() && step.external_id.empty()) {
      return Pause(step, AlertKind::kLookupContradiction,
                   "lookup of step '" + step.name + "' found an object without an external id at " +
                       def.lookup->external_id);
    }
    if (!step.external_id.empty() && !external_id.empty() && external_id != step.external_id) {
      return Pause(step, AlertKind::kLookupContradiction,
                   "lookup of step '" + step.name + "' found " + external_id +
                       " but the recorded result is " + step.external_id);
    }
    Change change = NewChange();
    step.state = StepState::kCompleted;
    step.unknown_since = 0;
    step.resolution = Resolution::kLookupFound;
    step.external_id = external_id.empty() ? step.external_id : external_id;
    step.response_json = KeptAnswer(*found, def);
    step.error_class = ErrorClass::kNone;
    step.error_message.clear();
    step.finished_at = change.now;
    change.steps.push_back(step);
    AddEvent(change, "waystone.step.completed", &step, "outcome found by lookup");
    return CommitChange(change);
  }

  // Returns the objects a lookup answer holds that could be step `index`'s: the one
  // at `found` or each at `items`, kept only when every `match` pointer equals its
  // rendered value. An `items` that is not an array is an error.
  absl::StatusOr<std::vector<const Json*>> Candidates(int index, const Json& body) {
    const LookupSpec& lookup = *definition_->steps[index].lookup;
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
    const Json context = Context(index, steps_[index].idempotency_key);
    std::vector<std::pair<std::string, std::string>> expected;
    for (const auto& [pointer, value] : lookup.match) {
      WS_ASSIGN_OR_RETURN(Template parsed, Template::Parse(value));
      WS_ASSIGN_OR_RETURN(std::string text, parsed.RenderText(context));
      expected.emplace_back(pointer, std::move(text));
    }
    std::vector<const Json*> matching;
    for (const Json* candidate : all) {
      bool ok = true;
      for (const auto& [pointer, text] : expected) {
        const Json* value = AtPointer(*candidate, pointer);
        ok = ok && value != nullptr && IdText(*value) == text;
      }
      if (ok) matching.push_back(candidate);
    }
    return matching;
  }

  // Returns the idempotency key of step's compensation: "<step key>:compensate".
  std::string CompensationKeyOf(const StepRecord& step) {
    return CompensationKey(StepKey(step.index));
  }

  // An audit record of a compensation the engine ran by itself, with its cause.
  AuditRecord EngineAudit(const StepRecord& step, const std::string& action,
                          const std::string& detail) {
    const Json about = {{"step", step.name},
                        {"external_id", step.external_id},
                        {"key", CompensationKeyOf(step)},
                        {"attempt", step.compensation_attempts},
                        {"detail", detail}};
    return {0, 0, "engine", instance_.tenant, instance_.id, action,
            instance_.status_reason.empty() ? "compensation" : Shorten(instance_.status_reason),
            JsonText(about)};
  }

  absl::Status CompensationFailed(StepRecord step, const std::string& message) {
    Change change = NewChange();
    step.state = StepState::kCompensationFailed;
    step.error_message = Shorten(message);
    step.next_attempt_at = 0;
    change.steps.push_back(step);
    const std::string reason = "compensation of step '" + step.name + "' (external id '" +
                               step.external_id + "', key '" +
                               CompensationKeyOf(step) + "') failed after " +
                               std::to_string(step.compensation_attempts) +
                               " attempts: " + Shorten(message);
    AddEvent(change, "waystone.step.compensation_failed", &step, message);
    change.audits.push_back(EngineAudit(step, "compensation_failed", Shorten(message)));
    AddAlert(change, AlertKind::kCompensationFailed, step.name, reason);
    SetInstanceState(change, InstanceState::kNeedsAttention, reason);
    return CommitChange(change);
  }

  absl::Status Compensate(int index) {
    const StepDefinition& def = definition_->steps[index];
    const CompensationSpec& spec = *def.compensate;
    StepRecord step = steps_[index];
    const std::string key = CompensationKeyOf(step);
    auto request = Render(spec.request, Context(index, key));
    if (!request.ok()) {
      return CompensationFailed(step, "compensation request cannot be built: " +
                                          std::string(request.status().message()));
    }
    Change before = NewChange();
    step.state = StepState::kCompensating;
    step.compensation_attempts += 1;
    step.next_attempt_at = 0;
    Decorate(*request, key);
    before.steps.push_back(step);
    before.audits.push_back(EngineAudit(step, "compensate", "attempt " +
                                        std::to_string(step.compensation_attempts) + " sent"));
    WS_RETURN_IF_ERROR(CommitChange(before));

    Sent sent;
    CrashPoint("before-compensate", def.name);
    WS_RETURN_IF_ERROR(StillLeased());
    {
      LeaseKeeper::Guard held(d_.keeper, lease_);
      sent = TimedSend(CallPhase::kCompensate, *request, index, {});
    }
    CrashPoint("after-compensate", def.name);

    const HttpResponse& response = sent.response;
    const ErrorClass error_class = sent.error_class;
    const std::string detail = Describe(response);
    switch (error_class) {
      case ErrorClass::kNone: {
        Change change = NewChange();
        step.state = StepState::kCompensated;
        step.error_message.clear();
        change.steps.push_back(step);
        change.audits.push_back(EngineAudit(step, "compensated", detail));
        AddEvent(change, "waystone.step.compensated", &step);
        return CommitChange(change);
      }
      case ErrorClass::kRejected:
        return CompensationFailed(step, detail);
      case ErrorClass::kTransient:
      case ErrorClass::kUnknown:
        if (spec.retry.Exhausted(step.compensation_attempts)) {
          return CompensationFailed(step, "retries exhausted; last: " + detail);
        }
        step.error_message = Shorten(detail);
        return Retry(step, StepState::kCompensating, step.compensation_attempts, spec.retry,
                     response.outcome.retry_after);
    }
    return absl::InternalError("unhandled error class");
  }

  RunnerDeps d_;
  std::vector<AttemptRecord> pending_attempts_;  // sent, not yet committed
  Millis lease_until_ = 0;  // the lease as of the last commit (0: released)
  Lease lease_;
  InstanceRecord instance_;
  std::vector<StepRecord> steps_;
  std::shared_ptr<const WorkflowDefinition> definition_;
};

InstanceRunner::InstanceRunner(const RunnerDeps& deps, Lease lease)
    : impl_(std::make_unique<Impl>(deps, std::move(lease))) {}
InstanceRunner::~InstanceRunner() = default;

absl::StatusOr<DriveResult> InstanceRunner::Drive(std::stop_token stop) {
  return impl_->Drive(stop);
}

}  // namespace waystone
