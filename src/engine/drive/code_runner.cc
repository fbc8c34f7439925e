#include "engine/drive/code_runner.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "engine/code_workflow.h"
#include "engine/context.h"
#include "engine/drive/code_call_answers.h"
#include "engine/drive/code_transaction.h"
#include "engine/drive/rate_slot.h"
#include "engine/drive/target_settings.h"
#include "engine/lease_keeper.h"
#include "model/json_text.h"
#include "model/keys.h"
#include "model/outbox_events.h"
#include "model/target_gate.h"
#include "model/template.h"
#include "rules/transitions.h"
#include "store/business_statement.h"

namespace waystone {

ErrorClass ClassifyCodeFailure(const absl::Status& status) {
  if (absl::IsUnavailable(status) || absl::IsResourceExhausted(status)) {
    return ErrorClass::kTransient;
  }
  if (absl::IsDeadlineExceeded(status) || absl::IsUnknown(status)) return ErrorClass::kUnknown;
  return ErrorClass::kRejected;
}

namespace {

constexpr std::string_view kStoppedMessage = "the workflow run stopped here";
// How long an instance whose function this process lacks waits before a worker
// looks at it again (the process that has it may claim it meanwhile).
constexpr Millis kNoCodeRetry = 1000;
// The most pages a ctx.Call's lookup reads (CodeCallOptions::next_page).
constexpr int kMaxCodeLookupPages = 100;

absl::Status Stopped() { return absl::AbortedError(std::string(kStoppedMessage)); }

// Journal rows of the context's own (the clock, a UUID, a patch, a timer, the
// output) are named with a leading '$', which a step's name may not have.
constexpr char kNow[] = "$now";
constexpr char kRandom[] = "$random";
constexpr char kUuid[] = "$uuid";
constexpr char kSleep[] = "$sleep";
constexpr char kReturn[] = "$return";
constexpr char kPatchPrefix[] = "$patched:";

using code_call::BodyClassifier;
using code_call::ClassOf;
using code_call::Described;
using code_call::Failure;
using code_call::ResultJson;
using code_call::Unsendable;
using code_call::Unsent;

// Why the run stopped, and what the drive returns for it.
struct Stop {
  enum class Kind { kRest, kLeaseLost, kError } kind = Kind::kRest;
  std::optional<Millis> wake_at;  // kRest: due again then (a timer, a retry)
  absl::Status error;             // kError
};

class CodeRun final : public CodeContext {
 public:
  CodeRun(const RunnerDeps& deps, const Lease& lease, const InstanceRecord& instance,
          std::vector<StepRecord> steps, std::stop_token stop)
      : d_(deps),
        lease_(lease),
        instance_(instance),
        journal_(std::move(steps)),
        stop_token_(std::move(stop)),
        compensating_(instance.state == InstanceState::kCompensating) {}

  absl::StatusOr<DriveResult> Drive(const CodeWorkflow& workflow) {
    auto output = workflow.Run(*this, instance_.input_json);
    if (!stop_) {
      if (compensating_) {
        // However the function ended (its failure again, or where the record ends):
        // the compensations it registered run.
        Fail(output.ok() ? absl::OkStatus() : output.status());
      } else if (output.ok()) {
        Finish(*output);
      } else if (IsCodeRunStopped(output.status())) {
        // It returned the stop of a run that had not stopped: not ours to record.
        stop_ = Stop{Stop::Kind::kError, std::nullopt,
                     absl::InternalError("the workflow returned a stop that was not its own")};
      } else {
        Fail(output.status());
      }
    }
    DropAdmitted();
    const Stop& stop = *stop_;
    if (stop.kind == Stop::Kind::kError) return stop.error;
    DriveResult result{instance_.state, stop.wake_at, stop.kind == Stop::Kind::kLeaseLost};
    result.awaiting_event = awaiting_event_;
    if (result.wake_at == kNoDueTime) result.wake_at.reset();  // an event with no deadline
    return result;
  }

  absl::StatusOr<std::string> Step(const std::string& name, const std::string& input_json,
                                   const std::function<absl::StatusOr<std::string>()>& fn,
                                   const CodeStepOptions& options) override {
    if (restricted_) return Inside();
    if (stop_) return Stopped();
    if (absl::Status valid = ValidName("step", name); !valid.ok()) return valid;
    const std::string hash = Sha256Hex("step\n" + name + "\n" + input_json);
    if (const StepRecord* recorded = Recorded(name, hash)) {
      const int index = recorded->index;
      switch (recorded->state) {
        case StepState::kCompleted:
        case StepState::kCompensating:
        case StepState::kCompensated:
        case StepState::kCompensationFailed:
          Compensable(index, options);
          return recorded->response_json;
        case StepState::kFailed:
          if (!compensating_ && recorded->error_class != ErrorClass::kRejected &&
              !options.retry.Exhausted(Transients(*recorded))) {
            if (recorded->next_attempt_at > d_.clock->NowMillis()) {
              return Rest(recorded->next_attempt_at);
            }
            return Attempt(index, fn, options);
          }
          return FailedStep(*recorded);
        case StepState::kRunning:
        case StepState::kUnknown:
          if (compensating_) return Beyond(name);
          return Recover(index, fn, options);
        default:
          return Diverge("step '" + name + "' is recorded " +
                         std::string(ToString(recorded->state)));
      }
    }
    if (stop_) return Stopped();  // Recorded found another step: diverged
    if (compensating_) return Beyond(name);
    if (stop_token_.stop_requested()) return Rest(d_.clock->NowMillis());  // nothing new
    if (options.admit) {
      if (std::optional<CodeWait> wait = options.admit()) return WaitForTarget(*wait, Change());
    }
    CrashPoint("before-step", name);
    StepRecord row = NewRow(name, hash);
    row.state = StepState::kRunning;
    row.attempts = 1;
    row.idempotency_key = StepKey(name);
    Change change;
    change.added_steps.push_back(row);
    if (!Commit(std::move(change), options.timeout)) {
      DropAdmitted();
      return Stopped();
    }
    return Call(row.index, fn, options);
  }

  absl::StatusOr<std::string> Call(const std::string& name, HttpRequest request,
                                   const CodeCallOptions& options) override {
    if (restricted_) return Inside();
    if (request.method.empty() || request.url.empty()) {
      return absl::InvalidArgumentError("call '" + name + "': a method and a URL are required");
    }
    const bool safe =
        request.method == "GET" || request.method == "HEAD" || request.method == "OPTIONS";
    CodeStepOptions step;
    step.repeatable = options.repeatable || safe;
    step.retry = options.retry;
    step.unknown = options.unknown;
    // Its target's protections are asked before each attempt's checkpoint: refused,
    // nothing is recorded. (Its lookup and compensation ask as they send.)
    step.admit = [this, &request]() { return AdmitCall(request); };
    StatusOverrides errors;
    for (int status : options.transient_statuses) errors[status] = ErrorClass::kTransient;
    for (int status : options.unknown_statuses) errors[status] = ErrorClass::kUnknown;
    for (int status : options.rejected_statuses) errors[status] = ErrorClass::kRejected;
    if (options.lookup) {
      if (!options.found) {
        return absl::InvalidArgumentError("call '" + name + "': a lookup needs `found`");
      }
      // Used while the call's step runs: what it captures lives as long. A 404 is an
      // answer (nothing there), as for a YAML step's lookup; `found` reads it.
      step.lookup = [this, &options]() -> absl::StatusOr<std::optional<std::string>> {
        const StatusOverrides answered = {{404, ErrorClass::kNone}};
        HttpRequest request = *options.lookup;
        for (int page = 1;; ++page) {
          // The first page asks the target (the next follow at once, as a YAML
          // lookup's do); only the first page's 404 says "nothing there".
          HttpResponse answer =
              page == 1 ? Send(request, "", answered) : Send(request, "", {}, /*admit=*/false);
          const std::string where = page > 1 ? " (page " + std::to_string(page) + ")" : "";
          if (ClassifyAnswer(answer, {page == 1 ? &answered : nullptr}).error_class !=
              ErrorClass::kNone) {
            return absl::UnavailableError("the lookup got " + Described(answer) + where);
          }
          const std::string json = ResultJson(answer);
          absl::StatusOr<std::optional<std::string>> found = options.found(json);
          if (!found.ok() || found->has_value() || !options.next_page) return found;
          absl::StatusOr<std::optional<HttpRequest>> next = options.next_page(json);
          if (!next.ok()) return next.status();
          if (!next->has_value()) return std::optional<std::string>();  // the last page
          if (page >= kMaxCodeLookupPages) {
            return absl::UnavailableError("the lookup went past " +
                                          std::to_string(kMaxCodeLookupPages) + " pages");
          }
          request = std::move(**next);
        }
      };
    }
    if (options.compensate) {
      // Runs after the function returned: it keeps copies.
      step.compensate = [this, undo = options.compensate, errors](CodeContext&,
                                                                  const std::string& result) {
        absl::StatusOr<std::optional<HttpRequest>> request = undo(result);
        if (!request.ok()) return absl::FailedPreconditionError(request.status().message());
        if (!request->has_value()) return absl::OkStatus();  // nothing to undo
        HttpResponse answer = Send(**request, current_key_, errors);
        return Failure(ClassifyAnswer(answer, {&errors}).error_class, answer);
      };
    }
    return Step(
        name, RequestHash(request.method, request.url, request.body),
        [&]() -> absl::StatusOr<std::string> {
          ErrorClass error = ErrorClass::kNone;  // classed once, as its history has it
          HttpResponse answer =
              Send(request, current_key_, errors, true, &options.classify, &error);
          if (error == ErrorClass::kNone) return ResultJson(answer);
          retry_after_ = answer.outcome.retry_after;  // when the server says to come back
          return Failure(error, answer);
        },
        step);
  }

  absl::StatusOr<std::string> Transaction(
      const std::string& name,
      const std::function<absl::StatusOr<std::string>(CodeTransaction&)>& fn) override {
    if (restricted_) return Inside();
    if (stop_) return Stopped();
    if (absl::Status valid = ValidName("transaction", name); !valid.ok()) return valid;
    const std::string hash = Sha256Hex("transaction\n" + name);
    if (const StepRecord* recorded = Recorded(name, hash)) {
      if (recorded->state != StepState::kFailed) return recorded->response_json;
      // Failed: the same again, unless an operator retried it (transient).
      if (recorded->error_class == ErrorClass::kRejected || compensating_) {
        return FailedStep(*recorded);
      }
      StepRecord row = *recorded;
      row.attempts += 1;
      return RunTransaction(std::move(row), /*added=*/false, fn);
    }
    if (stop_) return Stopped();
    if (compensating_) return Beyond(name);
    if (stop_token_.stop_requested()) return Rest(d_.clock->NowMillis());
    CrashPoint("before-step", name);
    StepRecord row = NewRow(name, hash);
    row.attempts = 1;
    return RunTransaction(std::move(row), /*added=*/true, fn);
  }

  // Commits `row` completed with the transaction that runs `fn` (the row added, or
  // updated when an operator retried it); when the transaction fails, commits the row
  // failed with its reason instead.
  absl::StatusOr<std::string> RunTransaction(
      StepRecord row, bool added,
      const std::function<absl::StatusOr<std::string>(CodeTransaction&)>& fn) {
    const Millis now = d_.clock->NowMillis();
    row.state = StepState::kCompleted;
    row.error_class = ErrorClass::kNone;
    row.error_message.clear();
    row.finished_at = now;
    auto work = std::make_shared<TransactionWork>(row.index, fn, instance_, *d_.random, now,
                                                  d_.tenant_scoped_sql);
    Change change;
    (added ? change.added_steps : change.steps).push_back(row);
    change.events.push_back(
        MakeEvent("waystone.step.completed", instance_, &row, "", *d_.random, now));
    change.work = work;
    absl::Status committed;
    {
      Restricted user(this, "", -1, AttemptPhase::kCall, /*keep_lease=*/false);
      committed = CommitStatus(change);
    }
    if (committed.ok()) {
      journal_[row.index].response_json = work->last_result();
      CrashPoint("after-checkpoint", row.name);
      return journal_[row.index].response_json;
    }
    if (stop_) return Stopped();
    // The statement (or the function) failed: nothing of it was written. The step
    // is recorded failed, so a later run fails it the same way.
    row.state = StepState::kFailed;
    row.error_class = ErrorClass::kRejected;
    row.error_message = std::string(committed.message());
    Change failed;
    (added ? failed.added_steps : failed.steps).push_back(row);
    if (!Commit(std::move(failed))) return Stopped();
    return FailedStep(row);
  }

  absl::StatusOr<Millis> Now() override {
    WS_ASSIGN_OR_RETURN(std::string value,
                        Value(kNow, [&] { return std::to_string(d_.clock->NowMillis()); }));
    return std::stoll(value);
  }

  absl::StatusOr<uint64_t> Random() override {
    WS_ASSIGN_OR_RETURN(std::string value,
                        Value(kRandom, [&] { return std::to_string(d_.random->Next()); }));
    return std::stoull(value);
  }

  absl::StatusOr<std::string> Uuid() override {
    WS_ASSIGN_OR_RETURN(std::string value, Value(kUuid, [&] {
                          std::string hex = d_.random->Hex(16);
                          hex[12] = '4';  // RFC 9562 version 4, variant 10
                          hex[16] = "89ab"[std::stoi(hex.substr(16, 1), nullptr, 16) & 3];
                          return "\"" + hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" +
                                 hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" +
                                 hex.substr(20) + "\"";
                        }));
    return value.substr(1, value.size() - 2);
  }

  absl::Status Sleep(Millis duration) override {
    if (restricted_) return Inside();
    if (stop_) return Stopped();
    const std::string hash = Sha256Hex(std::string("sleep\n") + std::to_string(duration));
    if (const StepRecord* recorded = Recorded(kSleep, hash)) {
      if (recorded->state == StepState::kCompleted) return absl::OkStatus();
      if (compensating_) return Beyond(kSleep);
      if (recorded->next_attempt_at > d_.clock->NowMillis()) {
        return Rest(recorded->next_attempt_at);
      }
      StepRecord row = *recorded;
      row.state = StepState::kCompleted;
      row.finished_at = d_.clock->NowMillis();
      Change change;
      change.steps.push_back(row);
      if (!Commit(std::move(change))) return Stopped();
      return absl::OkStatus();
    }
    if (stop_) return Stopped();
    if (compensating_) return Beyond(kSleep);
    const Millis now = d_.clock->NowMillis();
    StepRecord row = NewRow(kSleep, hash);
    row.state = StepState::kWaiting;
    row.next_attempt_at = now + std::max<Millis>(duration, 0);
    Change change;
    change.added_steps.push_back(row);
    return Rest(row.next_attempt_at, std::move(change));
  }

  absl::StatusOr<std::string> WaitEvent(const std::string& event_type, Millis timeout) override {
    if (restricted_) return Inside();
    if (stop_) return Stopped();
    if (event_type.empty() || event_type.find('\n') != std::string::npos) {
      return absl::InvalidArgumentError("an event type is required");
    }
    const std::string name = CodeWaitRowName(event_type);
    const std::string hash = Sha256Hex("wait\n" + event_type + "\n" + std::to_string(timeout));
    auto timed_out = [&] {
      return absl::DeadlineExceededError("no event '" + event_type + "' came within " +
                                         std::to_string(timeout) + " ms");
    };
    if (const StepRecord* recorded = Recorded(name, hash)) {
      if (recorded->state == StepState::kCompleted) return recorded->response_json;
      if (recorded->state == StepState::kFailed) return timed_out();
      if (compensating_) return Beyond(name);
      if (recorded->next_attempt_at > d_.clock->NowMillis()) {
        awaiting_event_ = true;
        return Rest(recorded->next_attempt_at);
      }
      StepRecord row = *recorded;
      row.state = StepState::kFailed;
      row.error_class = ErrorClass::kRejected;
      row.error_message = std::string(timed_out().message());
      row.finished_at = d_.clock->NowMillis();
      row.next_attempt_at = 0;
      Change change;
      change.steps.push_back(row);
      if (!Commit(std::move(change))) return Stopped();
      return timed_out();
    }
    if (stop_) return Stopped();
    if (compensating_) return Beyond(name);
    StepRecord row = NewRow(name, hash);
    // An event of the type that came before this wait (Operations::Deliver kept it)
    // completes it at once: the oldest, taken in the transaction that records it.
    // Under the lease no other delivery commits meanwhile.
    auto kept = d_.store->GetKeptEvents(instance_.id);
    if (!kept.ok()) {
      stop_ = Stop{Stop::Kind::kError, std::nullopt, kept.status()};
      return Stopped();
    }
    for (const KeptEvent& event : *kept) {
      if (event.event_type != event_type) continue;
      row.state = StepState::kCompleted;
      row.response_json = event.data_json;
      row.external_id = event.event_id;
      row.finished_at = row.started_at;
      Change change;
      change.added_steps.push_back(row);
      change.take = KeptEventTake{event.seq, row.index};
      change.events.push_back(MakeEvent("waystone.step.completed", instance_, &row,
                                        "event " + event_type + " kept since it came", *d_.random,
                                        row.finished_at));
      if (!Commit(std::move(change))) return Stopped();
      return event.data_json;
    }
    row.state = StepState::kWaiting;
    row.next_attempt_at = timeout > 0 ? row.started_at + timeout : kNoDueTime;
    Change change;
    change.added_steps.push_back(row);
    awaiting_event_ = true;
    return Rest(row.next_attempt_at, std::move(change));
  }

  absl::StatusOr<bool> Patched(const std::string& patch) override {
    if (restricted_) return Inside();
    if (stop_) return Stopped();
    const std::string name = kPatchPrefix + patch;
    if (position_ < journal_.size()) {
      // Recorded with the patch: its path. Recorded without it (an older run went
      // on past this point): the old path, and the record is not consumed.
      if (journal_[position_].name != name) return false;
      ++position_;
      return true;
    }
    if (compensating_) return false;
    StepRecord row = NewRow(name, Sha256Hex("patched\n" + patch));
    row.state = StepState::kCompleted;
    row.finished_at = row.started_at;
    Change change;
    change.added_steps.push_back(row);
    if (!Commit(std::move(change))) return Stopped();
    return true;
  }

  const std::string& idempotency_key() const override { return current_key_; }
  const std::string& business_key() const override { return instance_.key; }

 private:
  // While the program's own code runs inside a step, a lookup, a compensation or a
  // transaction: idempotency_key() names that call, the lease is kept (but for a
  // transaction, which runs inside a commit), and every other context call is
  // refused: it would be recorded in the middle of a step (and inside a
  // transaction, on the commit thread, it would wait for itself).
  class Restricted {
   public:
    Restricted(CodeRun* run, std::string key, int index = -1,
               AttemptPhase phase = AttemptPhase::kCall, bool keep_lease = true, Millis until = 0)
        : run_(run), held_(keep_lease ? run->d_.keeper : nullptr, run->lease_, until) {
      run_->current_key_ = std::move(key);
      run_->current_index_ = index;
      run_->current_phase_ = phase;
      run_->restricted_.store(true);
    }
    ~Restricted() {
      run_->restricted_.store(false);
      run_->current_key_.clear();
    }
    Restricted(const Restricted&) = delete;
    Restricted& operator=(const Restricted&) = delete;

   private:
    CodeRun* run_;
    LeaseKeeper::Guard held_;
  };

  // What a target's settings render with: the instance's part (built once per run),
  // and env and secret where the environment keeps them.
  TemplateScope TargetContext() const {
    if (!target_context_) target_context_ = d_.environment->BuildOwnPart(instance_);
    return d_.environment->Scope(*target_context_, instance_.tenant);
  }

  // Asks the protections of the target `request` lies under whether it may go now
  // (an operator's pause, the circuit breaker, the concurrency cap, the rate limit:
  // the store answers for every worker on the database). Admitted: nullopt, its
  // permit and rate slot kept in admitted_ for Send. Refused: until when, and why.
  // A request under no target, or whose target does not render (Send says so), goes.
  std::optional<CodeWait> AdmitCall(const HttpRequest& request) {
    DropAdmitted();
    const std::shared_ptr<const std::vector<TargetSpec>> targets = d_.code->Targets();
    if (targets->empty()) return std::nullopt;
    absl::StatusOr<const TargetSpec*> target = TargetOf(*targets, request.url, TargetContext());
    if (!target.ok() || *target == nullptr) return std::nullopt;
    const Millis now = d_.clock->NowMillis();
    absl::StatusOr<TargetAnswer> answer =
        AskTarget(*d_.store, instance_.tenant, **target, now, d_.lease_duration, request.timeout,
                  lease_, *d_.random);
    if (!answer.ok()) {
      // The store could not answer: nothing goes, and it asks again shortly.
      return CodeWait{now + 1000, std::string(kAwaitingTarget) + (*target)->name +
                                      "': its protections could not be asked: " +
                                      std::string(answer.status().message())};
    }
    if (!answer->admitted) return CodeWait{answer->retry_at, std::move(answer->reason)};
    admitted_ = std::move(answer->admitted);
    return std::nullopt;
  }

  // Returns an admitted call's permit unused (its checkpoint did not commit).
  void DropAdmitted() {
    if (admitted_) {
      ReturnPermit(*d_.store, admitted_->permit, CallHealth::kUntold, d_.clock->NowMillis());
    }
    admitted_.reset();
  }

  // Sends `request` with the Idempotency-Key `key` (unless "" or set already), and
  // keeps its attempt record (classified with `errors`) for the step's next commit,
  // as a YAML step's requests are: the console's history of the step. A request
  // under a registered target goes with its TLS identity and OAuth2 client. The
  // step's call was admitted before its checkpoint (AdmitCall); a lookup or a
  // compensation asks here unless `admit` is false (a lookup's later pages):
  // refused, it is not sent (kNotSent, withdrawn) and `waiting_` says until when.
  HttpResponse Send(HttpRequest request, const std::string& key, const StatusOverrides& errors,
                    bool admit = true, const BodyClassifier* classify = nullptr,
                    ErrorClass* error_class = nullptr) {
    bool keyed = key.empty();
    for (const auto& [name, value] : request.headers) {
      std::string lower = name;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lower == "idempotency-key") keyed = true;
    }
    if (!keyed) request.headers.emplace_back("Idempotency-Key", key);
    std::optional<AdmittedCall> admitted;
    if (current_phase_ == AttemptPhase::kCall) admitted = std::exchange(admitted_, std::nullopt);
    const std::shared_ptr<const std::vector<TargetSpec>> targets = d_.code->Targets();
    if (!targets->empty()) {
      absl::Status applied = ApplyTarget(*targets, request, TargetContext());
      if (!applied.ok()) {
        // A deployment's mistake (a setting that does not render), not the target's
        // answer: the step's call waits for an operator, as for a refused identity.
        if (admitted) {
          ReturnPermit(*d_.store, admitted->permit, CallHealth::kUntold, d_.clock->NowMillis());
        }
        if (current_phase_ == AttemptPhase::kCall) identity_refused_ = true;
        return Unsent(Unsendable(std::string(applied.message())), errors, error_class);
      }
      if (current_phase_ != AttemptPhase::kCall && admit) {
        if (std::optional<CodeWait> wait = AdmitCall(request)) {
          waiting_ = std::move(wait);
          return Unsent(Unsendable(waiting_->reason, CallOutcome::Kind::kNotSent, true), errors,
                        error_class);
        }
        admitted = std::exchange(admitted_, std::nullopt);
      }
    }
    if (admitted) {
      // Its rate slot, within kRateHorizon: sent on time, retaking a slot that passed
      // (a stop waits for it too).
      AwaitRateSlot(*d_.store, *d_.clock, admitted->slot);
    }
    AttemptRecord attempt;
    attempt.started_at = d_.clock->NowMillis();
    HttpResponse answer = d_.http->Send(request);
    attempt.step_index = current_index_;
    attempt.phase = current_phase_;
    attempt.sent = answer.outcome.sent;
    attempt.connection = answer.outcome.connection;
    attempt.status =
        answer.outcome.kind == CallOutcome::Kind::kResponse ? answer.outcome.status : 0;
    attempt.error_class = ClassOf(answer, errors, classify);
    if (error_class != nullptr) *error_class = attempt.error_class;
    attempt.detail = ShortenMessage(DescribeResponse(answer));
    attempt.finished_at = d_.clock->NowMillis();
    attempt.worker = lease_.owner;
    attempt.lease_epoch = lease_.epoch;
    if (admitted) {
      ReturnPermit(*d_.store, admitted->permit, HealthOf(answer.outcome, attempt.error_class),
                   d_.clock->NowMillis());
    }
    if (answer.outcome.identity_refused && current_phase_ == AttemptPhase::kCall) {
      identity_refused_ = true;
    }
    if (attempt.step_index >= 0) {
      MutexLock lock(attempts_mu_);
      pending_attempts_.push_back(std::move(attempt));
    }
    return answer;
  }

  // A step's name: not the context's own ('$...'), and nothing that would make its
  // idempotency key another's ("<step>#2", "<step key>:compensate").
  static absl::Status ValidName(const char* what, const std::string& name) {
    if (name.empty() || name.size() > 200 || name.front() == '$' ||
        name.find_first_of(":#\n") != std::string::npos) {
      return absl::InvalidArgumentError(std::string(what) + " name '" + name +
                                        "': 1 to 200 characters, not beginning with '$', "
                                        "without ':', '#' or a line break");
    }
    return absl::OkStatus();
  }

  absl::Status Inside() const {
    return absl::FailedPreconditionError(
        "a step, lookup, compensation or transaction may not call the workflow's context "
        "(only idempotency_key() and key()): call it from the workflow function");
  }

  // The record at the next position, checked against what the function asks for
  // now; nullptr when the record ends here (or it diverged: stop_ is set then).
  const StepRecord* Recorded(const std::string& name, const std::string& hash) {
    if (position_ >= journal_.size()) return nullptr;
    const StepRecord& recorded = journal_[position_];
    if (recorded.name != name) {
      (void)Diverge("recorded '" + recorded.name + "' at step " + std::to_string(position_ + 1) +
                    ", this run asks for '" + name + "'");
      return nullptr;
    }
    if (recorded.request_hash != hash) {
      (void)Diverge("step " + std::to_string(position_ + 1) + " '" + name +
                    "' was recorded with another input (hash " +
                    recorded.request_hash.substr(0, 12) + "), this run gives " +
                    hash.substr(0, 12));
      return nullptr;
    }
    ++position_;
    return &recorded;
  }

  // A row for the next position, not yet committed.
  StepRecord NewRow(const std::string& name, const std::string& hash) {
    StepRecord row;
    row.instance_id = instance_.id;
    row.index = static_cast<int>(journal_.size());
    row.name = name;
    row.request_hash = hash;
    row.started_at = d_.clock->NowMillis();
    return row;
  }

  // "<tenant>:<key>:<step>", and "#2", "#3", ... for later steps of the same name.
  std::string StepKey(const std::string& name) const {
    const auto earlier = std::count_if(journal_.begin(), journal_.end(),
                                       [&](const StepRecord& s) { return s.name == name; });
    std::string key = DefaultIdempotencyKey(instance_.tenant, instance_.key, name);
    if (earlier > 0) key += "#" + std::to_string(earlier + 1);
    return key;
  }

  // A value of the context's own (the clock, a random number): recorded once.
  absl::StatusOr<std::string> Value(const char* name, const std::function<std::string()>& make) {
    if (restricted_) return Inside();
    if (stop_) return Stopped();
    const std::string hash = Sha256Hex(name);
    if (const StepRecord* recorded = Recorded(name, hash)) return recorded->response_json;
    if (stop_) return Stopped();
    if (compensating_) return Beyond(name);
    StepRecord row = NewRow(name, hash);
    row.state = StepState::kCompleted;
    row.finished_at = row.started_at;
    row.response_json = make();
    Change change;
    change.added_steps.push_back(row);
    if (!Commit(std::move(change))) return Stopped();
    return row.response_json;
  }

  // Runs step `index` again: a retry after a transient failure, or a repeat after
  // an unknown outcome of a repeatable step (or a lookup that found nothing).
  absl::StatusOr<std::string> Attempt(int index,
                                      const std::function<absl::StatusOr<std::string>()>& fn,
                                      const CodeStepOptions& options) {
    if (stop_token_.stop_requested()) return Rest(d_.clock->NowMillis());
    if (options.admit) {
      if (std::optional<CodeWait> wait = options.admit()) {
        // The step stays as it is (failed, or unknown: looked up again), due then.
        StepRecord waiting = journal_[index];
        waiting.next_attempt_at = wait->until;
        if (wait->until - d_.clock->NowMillis() > kRateHorizon) {
          // A long hold (a pause, an open circuit): a lookup that found nothing before
          // it says little after it: looked up again.
          waiting.resolution = Resolution::kNone;
        }
        Change change;
        change.steps.push_back(waiting);
        return WaitForTarget(*wait, std::move(change));
      }
    }
    StepRecord row = journal_[index];
    row.state = StepState::kRunning;
    row.attempts += 1;
    row.next_attempt_at = 0;
    Change change;
    change.steps.push_back(row);
    if (!Commit(std::move(change), options.timeout)) {
      DropAdmitted();
      return Stopped();
    }
    return Call(index, fn, options);
  }

  // Runs the step whose `running` checkpoint is committed, and records its outcome.
  absl::StatusOr<std::string> Call(int index,
                                   const std::function<absl::StatusOr<std::string>()>& fn,
                                   const CodeStepOptions& options) {
    const std::string name = journal_[index].name;
    CrashPoint("before-call", name);
    absl::StatusOr<std::string> result;
    retry_after_.reset();
    identity_refused_ = false;
    {
      Restricted user(this, journal_[index].idempotency_key, index, AttemptPhase::kCall,
                      /*keep_lease=*/true, Deadline(options));
      result = fn();
    }
    CrashPoint("after-call", name);
    StepRecord row = journal_[index];
    if (result.ok()) return Complete(std::move(row), std::move(*result), options);
    const Millis now = d_.clock->NowMillis();
    Change change;
    row.error_class = ClassifyCodeFailure(result.status());
    row.error_message = std::string(result.status().message());
    if (identity_refused_) {
      // Our certificate or client credentials were refused: no business refusal, so
      // nothing is undone; an operator retries the step once they are fixed.
      row.state = StepState::kFailed;
      row.error_class = ErrorClass::kRejected;
      row.finished_at = now;
      change.steps.push_back(row);
      return Park("step '" + row.name + "': " + row.error_message +
                      "; an operator retries the step once that is fixed",
                  std::move(change));
    }
    if (row.error_class == ErrorClass::kUnknown) {
      row.state = StepState::kUnknown;
      row.resolution = Resolution::kNone;  // unresolved again: looked up again
      row.unknowns += 1;
      if (row.unknown_since == 0) row.unknown_since = now;
      change.steps.push_back(row);
      if (!Commit(std::move(change))) return Stopped();
      CrashPoint("after-checkpoint", name);
      return Recover(index, fn, options);
    }
    row.state = StepState::kFailed;
    row.finished_at = now;
    if (row.error_class == ErrorClass::kTransient && !options.retry.Exhausted(Transients(row))) {
      // Never sooner than a call's Retry-After (up to the policy's cap).
      row.next_attempt_at =
          now + options.retry.NextDelay(Transients(row), retry_after_, *d_.random);
      change.steps.push_back(row);
      return Rest(row.next_attempt_at, std::move(change));
    }
    change.steps.push_back(row);
    if (!Commit(std::move(change))) return Stopped();
    CrashPoint("after-checkpoint", name);
    return FailedStep(row);
  }

  // Records step `row` completed with `result` (its run's, or what its lookup found).
  absl::StatusOr<std::string> Complete(StepRecord row, std::string result,
                                       const CodeStepOptions& options) {
    const Millis now = d_.clock->NowMillis();
    row.state = StepState::kCompleted;
    row.response_json = std::move(result);
    row.error_class = ErrorClass::kNone;
    row.error_message.clear();
    row.unknown_since = 0;
    row.finished_at = now;
    Change change;
    change.steps.push_back(row);
    change.events.push_back(
        MakeEvent("waystone.step.completed", instance_, &row, "", *d_.random, now));
    if (!Commit(std::move(change))) return Stopped();
    CrashPoint("after-checkpoint", row.name);
    Compensable(row.index, options);
    return row.response_json;
  }

  // Step `index` may have acted (found running after a crash, or its outcome was
  // unknown). First it waits a backoff (the target may still be at work on it), then
  // it is looked up, or run again when it is repeatable; a step that can be neither
  // waits for an operator, and so does one whose attempts ran out while its outcome
  // is still unknown.
  absl::StatusOr<std::string> Recover(int index,
                                      const std::function<absl::StatusOr<std::string>()>& fn,
                                      const CodeStepOptions& options) {
    StepRecord row = journal_[index];
    const Millis now = d_.clock->NowMillis();
    const bool interrupted = row.state == StepState::kRunning;
    row.state = StepState::kUnknown;
    row.error_class = ErrorClass::kUnknown;
    if (row.unknown_since == 0) row.unknown_since = now;
    if (interrupted) {
      // Found running: its run ended without a word (a crash, a lost lease, its timeout).
      row.resolution = Resolution::kNone;
      row.unknowns += 1;
      row.error_message = "interrupted before its outcome was recorded";
      if (options.timeout > 0) {
        row.error_message += " (its worker stopped, or it ran past its timeout of " +
                             std::to_string(options.timeout) + " ms)";
      }
    }
    if (!options.lookup && !options.repeatable) {
      Change change;
      change.steps.push_back(row);
      return Park("step '" + row.name +
                      "' may have acted: its outcome is unknown, it is not repeatable and has "
                      "no lookup; an operator finds out what happened",
                  std::move(change));
    }
    if (!options.lookup && options.unknown.Exhausted(row.unknowns)) {
      Change change;
      change.steps.push_back(row);
      return Park("step '" + row.name + "' may have acted: its outcome was unknown " +
                      std::to_string(row.unknowns) +
                      " times; an operator finds out what "
                      "happened",
                  std::move(change));
    }
    if (interrupted || row.next_attempt_at == 0) {
      row.next_attempt_at =
          now + options.unknown.NextDelay(std::max(1, row.unknowns), std::nullopt, *d_.random);
      Change change;
      change.steps.push_back(row);
      return Rest(row.next_attempt_at, std::move(change));
    }
    if (row.next_attempt_at > now) return Rest(row.next_attempt_at);
    // A lookup found nothing already (its resend was then held back by its target):
    // sent now, not looked up again.
    if (options.lookup && row.resolution == Resolution::kResubmitted) {
      return Attempt(index, fn, options);
    }
    if (options.lookup) {
      CrashPoint("before-lookup", row.name);
      absl::StatusOr<std::optional<std::string>> found;
      waiting_.reset();
      {
        Restricted user(this, row.idempotency_key, row.index, AttemptPhase::kLookup);
        found = options.lookup();
      }
      CrashPoint("after-lookup", row.name);
      if (waiting_) {  // its target refused the lookup: asked again when it may take it
        row.next_attempt_at = waiting_->until;
        Change change;
        change.steps.push_back(row);
        const CodeWait wait = *std::exchange(waiting_, std::nullopt);
        return WaitForTarget(wait, std::move(change));
      }
      row.lookups += 1;
      if (!found.ok()) {
        row.error_message = "lookup: " + std::string(found.status().message());
        Change change;
        if (options.unknown.Exhausted(row.lookups)) {
          change.steps.push_back(row);
          return Park("step '" + row.name + "' may have acted and its lookup failed (" +
                          row.error_message + ") after " + std::to_string(row.lookups) +
                          " lookups; an operator finds out what happened",
                      std::move(change));
        }
        row.next_attempt_at =
            now + options.unknown.NextDelay(row.lookups, std::nullopt, *d_.random);
        change.steps.push_back(row);
        return Rest(row.next_attempt_at, std::move(change));
      }
      if (found->has_value()) {
        row.resolution = Resolution::kLookupFound;
        return Complete(std::move(row), std::move(**found), options);
      }
      // Not found: it did not act, and runs again under the same key. Unless it
      // has a timeout and is not repeatable: a run past its timeout may still be
      // going (and act after this lookup), so an operator decides.
      if (options.timeout > 0 && !options.repeatable) {
        Change change;
        change.steps.push_back(row);
        return Park("step '" + row.name +
                        "': its lookup found nothing, but a run past its "
                        "timeout may still act, and it is not repeatable; an operator "
                        "confirms whether it happened",
                    std::move(change));
      }
      row.resolution = Resolution::kResubmitted;
      journal_[index] = row;
      if (options.unknown.Exhausted(row.unknowns)) {
        return GiveUp(index, "the lookup found nothing after " + std::to_string(row.unknowns) +
                                 " unknown outcomes");
      }
      return Attempt(index, fn, options);
    }
    return Attempt(index, fn, options);  // repeatable: again, under the same key
  }

  // Fails step `index` for good: its lookup found it never acted, and its attempts ran out.
  absl::StatusOr<std::string> GiveUp(int index, const std::string& why) {
    StepRecord row = journal_[index];
    row.state = StepState::kFailed;
    row.error_class = ErrorClass::kRejected;
    row.error_message = "gave up after " + std::to_string(row.attempts) + " attempts: " + why;
    row.finished_at = d_.clock->NowMillis();
    Change change;
    change.steps.push_back(row);
    if (!Commit(std::move(change))) return Stopped();
    return FailedStep(row);
  }

  absl::Status FailedStep(const StepRecord& row) const {
    return absl::FailedPreconditionError("step '" + row.name + "' failed (" +
                                         std::string(ToString(row.error_class)) +
                                         "): " + row.error_message);
  }

  // Keeps the compensation of completed step `index`, for a failure later.
  void Compensable(int index, const CodeStepOptions& options) {
    if (options.compensate) compensations_.emplace_back(index, options.compensate);
  }

  // The function returned: its output is the instance's.
  void Finish(const std::string& output) {
    if (position_ < journal_.size()) {
      (void)Diverge("the function returned before step " + std::to_string(position_ + 1) + " '" +
                    journal_[position_].name + "', which it recorded");
      return;
    }
    const Millis now = d_.clock->NowMillis();
    StepRecord row = NewRow(kReturn, Sha256Hex(std::string(kReturn)));
    row.state = StepState::kCompleted;
    row.response_json = output;
    row.finished_at = now;
    Change change;
    change.added_steps.push_back(row);
    change.state = InstanceState::kCompleted;
    change.status_reason = "";
    change.next_run_at = kNoDueTime;
    InstanceRecord after = instance_;
    after.state = InstanceState::kCompleted;
    change.events.push_back(
        MakeEvent("waystone.instance.completed", after, nullptr, "", *d_.random, now));
    Release(std::move(change));
  }

  // The function failed with `error`: the completed steps' compensations run in
  // reverse order, each recorded on its step, then the instance rests compensated
  // (failed when there was nothing to undo).
  void Fail(const absl::Status& error) {
    const std::string reason = error.ok() ? "the function completed" : std::string(error.message());
    if (!compensating_) {
      if (compensations_.empty()) {
        Change change;
        change.state = InstanceState::kFailed;
        change.status_reason = reason;
        change.next_run_at = kNoDueTime;
        InstanceRecord after = instance_;
        after.state = InstanceState::kFailed;
        change.events.push_back(MakeEvent("waystone.instance.failed", after, nullptr, reason,
                                          *d_.random, d_.clock->NowMillis()));
        Release(std::move(change));
        return;
      }
      Change change;
      change.state = InstanceState::kCompensating;
      change.status_reason = reason;
      if (!Commit(std::move(change))) return;
      compensating_ = true;
    }
    for (auto it = compensations_.rbegin(); it != compensations_.rend(); ++it) {
      if (!Compensate(it->first, it->second)) return;
    }
    Change change;
    change.state = InstanceState::kCompensated;
    change.next_run_at = kNoDueTime;
    InstanceRecord after = instance_;
    after.state = InstanceState::kCompensated;
    change.events.push_back(MakeEvent("waystone.instance.compensated", after, nullptr,
                                      instance_.status_reason, *d_.random, d_.clock->NowMillis()));
    Release(std::move(change));
  }

  // Runs the compensation of step `index` unless it ran; false when the run stopped
  // (a retry timer, an operator, the lease).
  bool Compensate(int index,
                  const std::function<absl::Status(CodeContext&, const std::string&)>& undo) {
    StepRecord row = journal_[index];
    if (row.state == StepState::kCompensated) return true;
    if (row.state == StepState::kCompensationFailed) {
      (void)Park("the compensation of step '" + row.name + "' failed: " + row.error_message,
                 Change());
      return false;
    }
    const Millis now = d_.clock->NowMillis();
    if (row.next_attempt_at > now) {
      (void)Rest(row.next_attempt_at);
      return false;
    }
    if (stop_token_.stop_requested()) {
      (void)Rest(now);
      return false;
    }
    row.state = StepState::kCompensating;
    row.compensation_attempts += 1;
    row.next_attempt_at = 0;
    Change start;
    start.steps.push_back(row);
    if (!Commit(std::move(start))) return false;
    CrashPoint("before-compensate", row.name);
    absl::Status undone;
    waiting_.reset();
    {
      Restricted user(this, CompensationKey(row.idempotency_key), row.index,
                      AttemptPhase::kCompensate);
      undone = undo(*this, row.response_json);
    }
    CrashPoint("after-compensate", row.name);
    Change change;
    if (waiting_) {  // its target refused it: no attempt; again when it may take it
      row.state = StepState::kCompleted;
      row.compensation_attempts -= 1;
      row.next_attempt_at = waiting_->until;
      change.steps.push_back(row);
      const CodeWait wait = *std::exchange(waiting_, std::nullopt);
      (void)WaitForTarget(wait, std::move(change));
      return false;
    }
    if (undone.ok()) {
      row.state = StepState::kCompensated;
      row.error_message.clear();
      change.steps.push_back(row);
      if (!Commit(std::move(change))) return false;
      CrashPoint("after-compensate-checkpoint", row.name);
      return true;
    }
    row.error_message = "compensation: " + std::string(undone.message());
    const ErrorClass error = ClassifyCodeFailure(undone);
    // Nothing happened, or it may have: undone again (a compensation is expected to
    // be repeatable, under its own key), within the attempts.
    if (error != ErrorClass::kRejected &&
        !kCompensationRetry.Exhausted(row.compensation_attempts)) {
      row.state = StepState::kCompleted;
      row.next_attempt_at =
          now + kCompensationRetry.NextDelay(row.compensation_attempts, std::nullopt, *d_.random);
      change.steps.push_back(row);
      (void)Rest(row.next_attempt_at, std::move(change));
      return false;
    }
    row.state = StepState::kCompensationFailed;
    change.steps.push_back(row);
    (void)Park("the compensation of step '" + row.name + "' failed: " + row.error_message,
               std::move(change));
    return false;
  }

  // While compensating, the function asks for what the record does not hold (or
  // holds unfinished): its run ends here, and what it registered is compensated.
  absl::Status Beyond(const std::string& name) {
    Log(LogLevel::kInfo, "instance " + instance_.key + ": compensating from step " +
                             std::to_string(position_ + 1) + " ('" + name + "')");
    return Stopped();
  }

  // The function no longer matches the record: the instance waits for an operator
  // (never retried forever).
  absl::Status Diverge(const std::string& detail) {
    (void)Park("definition_diverged: " + detail, Change());
    return Stopped();
  }

  absl::Status Park(const std::string& reason, Change change) {
    change.state = InstanceState::kNeedsAttention;
    change.status_reason = reason;
    change.next_run_at = kNoDueTime;
    Log(LogLevel::kWarning, "instance " + instance_.key + ": " + reason);
    Release(std::move(change));
    return Stopped();
  }

  // Lets go of the instance until its target may take the call `wait` names, with
  // what `change` records: its reason says why (the one before comes back after).
  absl::Status WaitForTarget(const CodeWait& wait, Change change) {
    change.status_reason = WaitingReason(ShortenMessage(wait.reason), instance_.status_reason);
    return Rest(wait.until, std::move(change));
  }

  // Lets go of the instance until `wake_at`, with what `change` records.
  absl::Status Rest(Millis wake_at, Change change = Change()) {
    change.next_run_at = wake_at;
    Release(std::move(change), wake_at);
    return Stopped();
  }

  // Commits `change` and releases the lease; the run stops (to run again at
  // `wake_at` when given).
  void Release(Change change, std::optional<Millis> wake_at = std::nullopt) {
    if (!change.steps.empty() || !change.added_steps.empty()) GoOn(change);
    change.lease = lease_;
    change.now = d_.clock->NowMillis();
    change.lease_expires_at = 0;
    if (CommitStamped(change)) stop_ = Stop{Stop::Kind::kRest, wake_at, {}};
  }

  // Commits `change` under the lease, renewed (for `timeout` when shorter than a
  // lease); false (the run stopped) when it fails.
  bool Commit(Change change, Millis timeout = 0) { return CommitStatus(change, timeout).ok(); }

  absl::Status CommitStatus(Change& change, Millis timeout = 0) {
    GoOn(change);
    change.lease = lease_;
    change.now = d_.clock->NowMillis();
    change.lease_expires_at =
        change.now + (timeout > 0 ? std::min(timeout, d_.lease_duration) : d_.lease_duration);
    return CommitStamped(change) ? absl::OkStatus() : last_error_;
  }

  // When the run of a step's function that begins now is given up: its lease is
  // renewed no further (0: no timeout).
  Millis Deadline(const CodeStepOptions& options) const {
    return options.timeout > 0 ? d_.clock->NowMillis() + options.timeout : 0;
  }

  // Once the instance goes on after waiting for a target (any commit under way but
  // a rest): its reason before.
  void GoOn(Change& change) const {
    if (!change.status_reason && instance_.status_reason.starts_with(kAwaitingTarget)) {
      change.status_reason = ReasonBeforeWaiting(instance_.status_reason);
    }
  }

  // The attempts of `row` that failed transiently (the others ended unknown, or run).
  static int Transients(const StepRecord& row) { return std::max(0, row.attempts - row.unknowns); }

  bool CommitStamped(Change change) {
    {
      MutexLock lock(attempts_mu_);
      change.attempts.insert(change.attempts.begin(),
                             std::make_move_iterator(pending_attempts_.begin()),
                             std::make_move_iterator(pending_attempts_.end()));
      pending_attempts_.clear();
    }
    absl::Status status = d_.commits->Commit(change);
    if (!status.ok()) {
      last_error_ = status;
      if (change.work && IsStatementFailure(status)) return false;  // its own failure
      if (absl::IsAborted(status)) {
        stop_ = Stop{Stop::Kind::kLeaseLost, std::nullopt, {}};
      } else {
        stop_ = Stop{Stop::Kind::kError, std::nullopt, status};
      }
      return false;
    }
    if (change.state) instance_.state = *change.state;
    if (change.status_reason) instance_.status_reason = *change.status_reason;
    for (const StepRecord& row : change.added_steps) {
      journal_.push_back(row);
      position_ = journal_.size();
    }
    for (const StepRecord& row : change.steps) journal_[row.index] = row;
    return true;
  }

  static constexpr RetryPolicy kCompensationRetry{10, 1000, 60'000, 2.0, 3'600'000};

  const RunnerDeps& d_;
  const Lease lease_;
  InstanceRecord instance_;
  std::vector<StepRecord> journal_;    // the step rows as committed, by index
  std::optional<Millis> retry_after_;  // the Retry-After of the step's call that just failed
  // Set by Send when a target refused a lookup or a compensation (not sent).
  std::optional<CodeWait> waiting_;
  bool identity_refused_ = false;  // the step's call: our identity or its target's settings
  // The call's admission (AdmitCall), taken before its checkpoint, for its Send.
  std::optional<AdmittedCall> admitted_;
  mutable std::optional<nlohmann::json> target_context_;  // input and instance, for targets
  size_t position_ = 0;                                   // the next step the function reaches
  std::stop_token stop_token_;
  bool compensating_;
  std::optional<Stop> stop_;
  absl::Status last_error_;
  std::string current_key_;
  int current_index_ = -1;  // the step whose function runs (Restricted), and what for
  AttemptPhase current_phase_ = AttemptPhase::kCall;
  // The requests ctx.Call sent since the last commit: they commit with what they led
  // to. (Guarded, though only the run's thread sends: the context refuses calls
  // from inside a step, and waiting_, admitted_ and the rest are the run thread's.)
  Mutex attempts_mu_;
  std::vector<AttemptRecord> pending_attempts_ ABSL_GUARDED_BY(attempts_mu_);
  std::atomic<bool> restricted_{false};  // see Restricted
  bool awaiting_event_ = false;          // it rests in WaitEvent
  std::vector<std::pair<int, std::function<absl::Status(CodeContext&, const std::string&)>>>
      compensations_;
};

}  // namespace

bool IsCodeRunStopped(const absl::Status& status) {
  return absl::IsAborted(status) && status.message() == std::string(kStoppedMessage);
}

absl::StatusOr<DriveResult> DriveCodeWorkflow(const RunnerDeps& deps, const Lease& lease,
                                              const InstanceRecord& instance,
                                              std::vector<StepRecord> steps, std::stop_token stop) {
  std::shared_ptr<const CodeWorkflow> workflow =
      deps.code != nullptr ? deps.code->Find(instance.workflow) : nullptr;
  if (workflow == nullptr) {
    // Another process registered it: this one lets go, and looks again later.
    Change release;
    release.lease = lease;
    release.now = deps.clock->NowMillis();
    release.lease_expires_at = 0;
    release.next_run_at = release.now + kNoCodeRetry;
    WS_RETURN_IF_ERROR(deps.commits->Commit(release));
    return DriveResult{instance.state, release.next_run_at, false};
  }
  CodeRun run(deps, lease, instance, std::move(steps), std::move(stop));
  return run.Drive(*workflow);
}

}  // namespace waystone
