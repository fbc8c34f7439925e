#include "engine/drive/instance_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "engine/context.h"
#include "engine/drive/call_metrics.h"
#include "engine/drive/code_runner.h"
#include "engine/drive/lookup_pages.h"
#include "engine/drive/request_body.h"
#include "engine/drive/target_settings.h"
#include "engine/redaction.h"
#include "model/condition.h"
#include "model/json_text.h"
#include "model/keys.h"
#include "model/template.h"
#include "rules/approvals.h"
#include "rules/state_machine.h"
#include "rules/transitions.h"
#include "store/business_statement.h"
#include "store/claims.h"

namespace waystone {
namespace {

using Json = nlohmann::json;

// A lookup answered 404 found nothing: that is an answer, not a failure.
const StatusOverrides kLookupStatuses = {{404, ErrorClass::kNone}};

// Returns true when a rendered header value would end its line (header injection).
bool BreaksHeaderLine(std::string_view value) {
  return value.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

AttemptPhase AttemptPhaseOf(CallPhase phase) {
  switch (phase) {
    case CallPhase::kCall:
      return AttemptPhase::kCall;
    case CallPhase::kLookup:
      return AttemptPhase::kLookup;
    case CallPhase::kCompensate:
      return AttemptPhase::kCompensate;
  }
  return AttemptPhase::kCall;
}

}  // namespace

// Carries out what Decide says is due: renders the request, checkpoints, sends it,
// and commits what the transitions (transitions.h) make of the outcome. The rules
// themselves live there; this class holds the I/O around them.
class InstanceRunner::Impl {
 public:
  Impl(const RunnerDeps& deps, Lease lease, std::optional<CreatedInstance> created)
      : d_(deps), lease_(std::move(lease)) {
    if (created) created_ = std::make_unique<CreatedInstance>(std::move(*created));
  }

  absl::StatusOr<DriveResult> Drive(std::stop_token stop, bool async) {
    async_ = async;
    WS_RETURN_IF_ERROR(Load());
    if (definition_->code) return DriveCodeWorkflow(d_, lease_, instance_, steps_, stop);
    return Loop(stop);
  }

  // Hands the calls due to the caller: from now on they are under way.
  std::vector<OutgoingCall> TakeRequests() {
    std::vector<OutgoingCall> outgoing;
    for (PendingCall& call : due_) {
      outgoing.push_back({call.id, std::move(call.request), std::move(call.admitted.slot)});
      const int id = call.id;
      out_.emplace(id, std::move(call));
    }
    // While they are out the runner keeps only its rows: the room of the calls due, and
    // the templates' context, built again from the rows once an answer comes (thousands
    // of runners may wait at once, each context as large as the answers it shows).
    std::vector<PendingCall>().swap(due_);  // (clear() and `= {}` keep the room)
    context_.Reset();
    return outgoing;
  }

  absl::StatusOr<DriveResult> Resume(int id, HttpResponse response, std::stop_token stop) {
    absl::Status status = Answered(id, std::move(response));
    if (!status.ok()) return Finish(status, std::nullopt);
    return Loop(stop);
  }

  int64_t instance_id() const { return lease_.instance_id; }
  const InstanceRecord* committed_row() const {
    return definition_ != nullptr && !definition_->code ? &instance_ : nullptr;
  }

 private:
  // What an outcome leads to once classified: the transition to commit.
  using Then = std::function<absl::Status(const CallResult&)>;

  // A request due to be sent (or on its way) and what its outcome leads to.
  struct PendingCall {
    int id;  // quoted back with its answer
    CallPhase phase;
    HttpRequest request;
    int step_index;
    StatusOverrides overrides;
    const std::vector<BodyErrorRule>* body_rules;  // the step's errors.body; null: none
    Then then;
    Millis started_at;                              // clock time, for the attempt record
    std::chrono::steady_clock::time_point sent_at;  // for the latency metric
    std::shared_ptr<std::atomic<Millis>> left_at;   // set by the client's last check
    AdmittedCall admitted;  // its target's permit (until answered) and rate slot
  };

  // Why and until when a target refused the calls due (of `steps`), while the
  // instance was in `state`.
  struct Parked {
    Millis until = 0;
    std::string reason;
    std::vector<int> steps;
    InstanceState state = InstanceState::kRunning;
  };

  // The answers to the calls a synchronous drive sent, as they come back (on the
  // client's thread); shared with the callbacks, which may outlive the runner.
  class Answers {
   public:
    void Put(int id, HttpResponse response) {
      {
        MutexLock lock(mu_);
        answers_.emplace_back(id, std::move(response));
      }
      arrived_.notify_one();
    }
    std::pair<int, HttpResponse> Take() {
      MutexLock lock(mu_);
      while (answers_.empty()) arrived_.wait(lock.native());
      std::pair<int, HttpResponse> answer = std::move(answers_.front());
      answers_.pop_front();
      return answer;
    }

   private:
    Mutex mu_;
    std::condition_variable arrived_;
    std::deque<std::pair<int, HttpResponse>> answers_ ABSL_GUARDED_BY(mu_);
  };

  // Decides and acts until the instance rests, the lease is lost, or (asynchronous)
  // requests are due or every step that could go waits for a call under way.
  absl::StatusOr<DriveResult> Loop(std::stop_token stop) {
    while (true) {
      // The last commit finished the instance with its last step (FinishAfter).
      if (finished_) return Finish(absl::OkStatus(), std::nullopt);
      const Millis now = d_.clock->NowMillis();
      // A branch refused by its target while the instance ran forward does not hold
      // what follows a failure beside it (compensation, an operator's look).
      if (parked_ && parked_->state != instance_.state) parked_.reset();
      NextAction action{NextAction::Kind::kAwaitCalls, -1, 0};
      if (!stop.stop_requested()) {
        action = Decide(*definition_, instance_, steps_, now, HeldSteps());
      }
      absl::Status status;
      if (!Starts(action.kind)) {
        if (Busy()) {
          // The rest waits for a call under way (or, stopping, nothing new starts).
          if (async_) return Waiting();
          status = AwaitAnswer();
          if (!status.ok()) return Finish(status, std::nullopt);
          continue;
        }
        if (parked_) {
          if (action.kind == NextAction::Kind::kWait) {
            parked_->until = std::min(parked_->until, action.wait_until);
          }
          return Park();
        }
        if (stop.stop_requested()) return Release(std::nullopt);
      }
      switch (action.kind) {
        case NextAction::Kind::kIdle:
          return Release(std::nullopt);
        case NextAction::Kind::kWait:
          return Release(action.wait_until);
        case NextAction::Kind::kAwaitEvent: {
          // Parked until POST /v1/events completes the step (which wakes it) or the deadline.
          auto result = Release(
              action.wait_until != 0 ? std::optional<Millis>(action.wait_until) : std::nullopt,
              kNoDueTime);
          if (result.ok()) result->awaiting_event = true;
          return result;
        }
        case NextAction::Kind::kFinish: {
          Change finish = Stamped(waystone::Finish(Now(), action.final_state));
          finish.lease_expires_at = 0;
          return Finish(CommitChange(finish), std::nullopt);
        }
        case NextAction::Kind::kAwaitCalls:  // not reached: nothing is under way or parked
          return Finish(absl::InternalError("instance " + instance_.key +
                                            ": waits for a call that is not under way"),
                        std::nullopt);
        case NextAction::Kind::kRunStep:
          status = RunStep(action.step);
          break;
        case NextAction::Kind::kRecoverRunning:
          status = Commit(RecoverRunning(Now(), action.step));
          break;
        case NextAction::Kind::kResolveUnknown:
          status = ResolveUnknown(action.step);
          break;
        case NextAction::Kind::kCompensate:
          status = Compensate(action.step);
          break;
        case NextAction::Kind::kSettleFailure:
          status = Commit(SettleFailure(Now(), action.step));
          break;
      }
      if (!status.ok()) return Finish(status, std::nullopt);
    }
  }

  // True for an action that starts something now (and so goes beside calls under way).
  static bool Starts(NextAction::Kind kind) {
    switch (kind) {
      case NextAction::Kind::kRunStep:
      case NextAction::Kind::kRecoverRunning:
      case NextAction::Kind::kResolveUnknown:
      case NextAction::Kind::kCompensate:
      case NextAction::Kind::kSettleFailure:
        return true;
      case NextAction::Kind::kIdle:
      case NextAction::Kind::kWait:
      case NextAction::Kind::kAwaitEvent:
      case NextAction::Kind::kFinish:
      case NextAction::Kind::kAwaitCalls:
        return false;
    }
    return false;
  }

  // True while a call is due or under way.
  bool Busy() const { return !due_.empty() || !out_.empty(); }

  // The steps whose call is due or under way.
  std::vector<int> CallingSteps() const {
    std::vector<int> steps;
    for (const PendingCall& call : due_) steps.push_back(call.step_index);
    for (const auto& [id, call] : out_) steps.push_back(call.step_index);
    return steps;
  }

  // The steps Decide passes over: calling, or refused by their target in this drive.
  std::vector<int> HeldSteps() const {
    std::vector<int> steps = CallingSteps();
    if (parked_) steps.insert(steps.end(), parked_->steps.begin(), parked_->steps.end());
    return steps;
  }

  // Hands the calls due to the caller (asynchronous drive), or says it waits for those
  // under way; the lease is kept while any is out.
  DriveResult Waiting() {
    if (!held_) held_.emplace(d_.keeper, lease_);
    DriveResult result;
    result.state = instance_.state;
    if (due_.empty()) {
      result.awaiting_calls = true;
    } else {
      result.calling = true;
    }
    return result;
  }

  // Sends the calls due (synchronous drive) and records the first answer to come back.
  absl::Status AwaitAnswer() {
    if (!held_) held_.emplace(d_.keeper, lease_);
    for (OutgoingCall& call : TakeRequests()) {
      // The target's rate limit gave this call a slot (within kRateHorizon). Not cut
      // short by a stop: the call is admitted and goes, on time (retaking a slot that
      // passed).
      AwaitRateSlot(*d_.store, *d_.clock, call.slot);
      d_.http->SendAsync(std::move(call.request),
                         [answers = answers_, id = call.id](HttpResponse response) {
                           answers->Put(id, std::move(response));
                         });
    }
    auto [id, response] = answers_->Take();
    return Answered(id, std::move(response));
  }

  // Lets go of the instance until the target that refused its call may take it,
  // saying why in its reason (nothing was sent; the step is as it was).
  absl::StatusOr<DriveResult> Park() {
    const Parked parked = std::move(*parked_);
    parked_.reset();
    Change change = Stamped(AwaitTarget(Now(), parked.reason));
    change.lease_expires_at = 0;
    change.next_run_at = parked.until;
    return Finish(CommitChange(change), parked.until);
  }

  // The instance as last committed, now: what a transition reads.
  Facts Now() {
    calling_steps_ = CallingSteps();
    return {*definition_, instance_, steps_, d_.clock->NowMillis(), *d_.random, &calling_steps_};
  }

  // Lets go of the instance until `wake_at` (its next_run_at; without one the
  // instance keeps `otherwise` when given, or its current due time).
  absl::StatusOr<DriveResult> Release(std::optional<Millis> wake_at,
                                      std::optional<Millis> otherwise = std::nullopt) {
    Change release;
    release.now = d_.clock->NowMillis();
    release = Stamped(std::move(release));
    release.lease_expires_at = 0;
    release.next_run_at = wake_at ? wake_at : otherwise;
    return Finish(CommitChange(release), wake_at);
  }

  absl::StatusOr<DriveResult> Finish(const absl::Status& status, std::optional<Millis> wake_at) {
    DropPermit(admitted_.permit);  // taken for a call that was not made
    for (PendingCall& call : due_) DropPermit(call.admitted.permit);  // nor will these be
    due_.clear();
    if (!status.ok()) {
      // The drive ends with calls out (an error, a lost lease): their answers will not
      // be recorded here, so their permits go back now, and the lease is renewed no
      // longer (the next worker finds their steps running: unknown outcomes).
      for (auto& [id, call] : out_) DropPermit(call.admitted.permit);
      held_.reset();
    }
    if (absl::IsAborted(status)) {
      Log(LogLevel::kInfo, "instance " + instance_.key + ": " + std::string(status.message()));
      return DriveResult{instance_.state, std::nullopt, true};
    }
    if (!status.ok()) return status;
    return DriveResult{instance_.state, wake_at, false};
  }

  absl::Status Load() {
    context_.Reset();
    if (created_) {
      instance_ = std::move(created_->instance);
      steps_ = std::move(created_->steps);
      created_.reset();
    } else {
      WS_ASSIGN_OR_RETURN(instance_, d_.store->GetInstance(lease_.instance_id));
      WS_ASSIGN_OR_RETURN(steps_, d_.store->GetSteps(lease_.instance_id));
    }
    lease_until_ = instance_.lease_epoch == lease_.epoch ? instance_.lease_expires_at : 0;
    WS_ASSIGN_OR_RETURN(definition_, d_.catalog->Get(instance_.definition_hash));
    if (!definition_->code && steps_.size() != definition_->steps.size()) {
      return absl::DataLossError("instance " + instance_.key + " has " +
                                 std::to_string(steps_.size()) + " step rows but its definition " +
                                 std::to_string(definition_->steps.size()) + " steps");
    }
    return absl::OkStatus();
  }

  // Puts a transition's change under this drive's lease (renewed from its time) with
  // the attempt records of the requests sent since the last one first: they commit
  // with the outcome they led to.
  Change Stamped(Change change) {
    change.lease = lease_;
    change.lease_expires_at = change.now + d_.lease_duration;
    change.attempts.insert(change.attempts.begin(),
                           std::make_move_iterator(pending_attempts_.begin()),
                           std::make_move_iterator(pending_attempts_.end()));
    pending_attempts_.clear();
    return change;
  }

  // Commits `change` and, once durable, mirrors it into the in-memory view: every
  // column of the instance row the store's fence writes, as it writes them (the
  // reason redacted, as the commit queue stores it).
  absl::Status CommitChange(const Change& change) {
    WS_RETURN_IF_ERROR(d_.commits->Commit(change));
    lease_until_ = change.lease_expires_at;
    instance_.updated_at = change.now;
    instance_.lease_expires_at = change.lease_expires_at;
    if (change.lease_expires_at == 0) instance_.lease_owner.clear();
    if (change.state) instance_.state = *change.state;
    if (change.status_reason) instance_.status_reason = Redacted(*change.status_reason);
    if (change.next_run_at) instance_.next_run_at = *change.next_run_at;
    if (change.input_json) instance_.input_json = *change.input_json;
    for (const StepRecord& step : change.steps) steps_[step.index] = step;
    return absl::OkStatus();
  }

  // Commits what a transition returned, with the deliveries it makes owed. When the
  // instance finishes right after it (its last step settled), the finish commits in
  // the same transaction: one commit less per instance, and the step's outcome is as
  // durable as it was on its own.
  absl::Status Commit(Change change) {
    change.reservations = OwedDeliveries(*definition_, instance_, steps_, change, *d_.environment,
                                         d_.idempotency_retention);
    std::optional<Change> finish = FinishAfter(change);
    Change stamped = Stamped(std::move(change));
    if (finish) {
      stamped.state = finish->state;
      stamped.status_reason = std::move(finish->status_reason);
      stamped.next_run_at = finish->next_run_at;
      stamped.lease_expires_at = 0;
      std::move(finish->events.begin(), finish->events.end(), std::back_inserter(stamped.events));
      std::move(finish->alerts.begin(), finish->alerts.end(), std::back_inserter(stamped.alerts));
      std::move(finish->audits.begin(), finish->audits.end(), std::back_inserter(stamped.audits));
    }
    // A change that brings the instance to rest itself (a failure with nothing to
    // compensate, an operator's look), while nothing is due, out or refused: the
    // lease goes with it. The loop would release it next in a commit of its own, and
    // a reader between the two (AwaitRest, the API) would see the instance at rest and
    // still leased, its row about to change.
    const bool rests =
        finish.has_value() || (stamped.state && IsTerminal(*stamped.state) && !Busy() && !parked_);
    if (rests) stamped.lease_expires_at = 0;
    WS_RETURN_IF_ERROR(CommitChange(stamped));
    finished_ = rests;
    return absl::OkStatus();
  }

  // The finish Decide would call for once `change` is committed, decided on this
  // runner's view with `change` applied; nullopt when something else comes next.
  // Only a change that settles steps and nothing the store computes (a statement's
  // rows, a code step's work), while no call is due, out or refused.
  std::optional<Change> FinishAfter(const Change& change) {
    if (change.state || change.steps.empty() || !change.statements.empty() || change.work ||
        !change.added_steps.empty() || Busy() || parked_) {
      return std::nullopt;
    }
    std::vector<StepRecord> before;
    before.reserve(change.steps.size());
    for (const StepRecord& step : change.steps) {
      before.push_back(std::exchange(steps_[step.index], step));
    }
    const std::string reason = instance_.status_reason;
    const Millis next_run_at = instance_.next_run_at;
    if (change.status_reason) instance_.status_reason = *change.status_reason;
    if (change.next_run_at) instance_.next_run_at = *change.next_run_at;

    std::optional<Change> finish;
    const NextAction next = Decide(*definition_, instance_, steps_, change.now);
    if (next.kind == NextAction::Kind::kFinish) {
      Facts facts = Now();
      facts.now = change.now;
      finish = waystone::Finish(facts, next.final_state);
    }

    instance_.status_reason = reason;
    instance_.next_run_at = next_run_at;
    for (auto it = before.rbegin(); it != before.rend(); ++it) steps_[it->index] = std::move(*it);
    return finish;
  }

  // What step `step_index`'s templates see. The instance's part (its input parsed,
  // its public id) is built once per load, not once per template, env and secrets
  // are read where the environment keeps them, and a step's result is parsed again
  // only when its record changed.
  // The result stays valid until the next call.
  TemplateScope Context(int step_index, const std::string& key) const {
    return context_.For(instance_, steps_, definition_->steps[step_index].name, key);
  }

  // Renders `spec` for sending; `body_identity` (when given) gets what the request
  // hash takes of its body (RenderBody).
  absl::StatusOr<HttpRequest> Render(const RequestSpec& spec, const TemplateScope& context,
                                     std::string* body_identity = nullptr) const {
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
    WS_ASSIGN_OR_RETURN(const std::string files, TenantFilesFolder(d_.files_dir, instance_.tenant));
    WS_ASSIGN_OR_RETURN(std::string identity, RenderBody(spec, context, files, request));
    if (body_identity != nullptr) *body_identity = std::move(identity);
    WS_RETURN_IF_ERROR(ApplyTarget(request, context));
    return request;
  }

  // The target `url` lies under (target_settings.h), or null.
  absl::StatusOr<const TargetSpec*> TargetOf(const std::string& url,
                                             const TemplateScope& context) const {
    return waystone::TargetOf(definition_->targets, url, context);
  }

  // Gives `request` its target's TLS identity and OAuth2 client (target_settings.h).
  absl::Status ApplyTarget(HttpRequest& request, const TemplateScope& context) const {
    return waystone::ApplyTarget(definition_->targets, request, context);
  }

  // Asks the shared control of the target `url` lies under whether a call may go
  // now (operator pause, circuit breaker, concurrency cap, rate limit: the store
  // decides for every worker on the database). True: go, holding the permit until
  // the answer. False: refused, the instance to be parked (Park) with the reason.
  absl::StatusOr<bool> Admitted(int step_index, const HttpRequest& request,
                                const TemplateScope& context) {
    const std::string& url = request.url;
    DropPermit(admitted_.permit);
    WS_ASSIGN_OR_RETURN(const TargetSpec* target, TargetOf(url, context));
    if (target == nullptr) return true;
    const Millis now = d_.clock->NowMillis();
    WS_ASSIGN_OR_RETURN(TargetAnswer answer,
                        AskTarget(*d_.store, instance_.tenant, *target, now, d_.lease_duration,
                                  request.timeout, lease_, *d_.random));
    if (answer.admitted) {
      admitted_ = std::move(*answer.admitted);
      return true;
    }
    if (!parked_) {
      parked_ = Parked{answer.retry_at, std::move(answer.reason), {step_index}, instance_.state};
    } else {  // a branch beside it was refused too: the instance wakes for the first
      parked_->until = std::min(parked_->until, answer.retry_at);
      parked_->steps.push_back(step_index);
    }
    return false;
  }

  // Returns the permit of an admitted call to its target, with what the call said
  // of the target's health (kUntold: not made).
  void DropPermit(std::optional<TargetCallSettle>& permit,
                  CallHealth health = CallHealth::kUntold) {
    ReturnPermit(*d_.store, permit, health, d_.clock->NowMillis());
  }

  // Returns the values a lookup's `match` pointers must equal, rendered for step `index`.
  MatchValues RenderMatch(int index) const {
    std::vector<std::pair<std::string, std::string>> expected;
    const LookupSpec& lookup = *definition_->steps[index].lookup;
    if (lookup.match.empty()) return expected;
    const TemplateScope context = Context(index, steps_[index].idempotency_key);
    for (const auto& [pointer, value] : lookup.match) {
      WS_ASSIGN_OR_RETURN(Template parsed, Template::Parse(value));
      WS_ASSIGN_OR_RETURN(std::string text, parsed.RenderText(context));
      expected.emplace_back(pointer, std::move(text));
    }
    return expected;
  }

  // Returns Aborted when the lease ran out since the last commit (this process
  // was stopped or stalled): another worker may own the instance, so nothing is sent.
  absl::Status StillLeased() const {
    if (d_.clock->NowMillis() < lease_until_) return absl::OkStatus();
    return absl::AbortedError("lease of instance " + instance_.key +
                              " ran out before the call; the request was not sent");
  }

  // Makes `request` for step `step_index` the one to send next; its outcome, once
  // classified with `overrides`, goes to `then`.
  // The lease is checked twice: here, and by the client at the last moment before the
  // first byte leaves (may_send), since this thread can be paused between the two
  // for longer than the lease (SIGSTOP, a stalled VM); by then another worker may
  // have taken the instance over, looked the step up, found nothing and sent it.
  absl::Status Call(CallPhase phase, HttpRequest request, int step_index,
                    const StatusOverrides& overrides, Then then,
                    const std::vector<BodyErrorRule>* body_rules = nullptr) {
    WS_RETURN_IF_ERROR(StillLeased());
    CrashPoint("before-send", definition_->steps[step_index].name);
    // Shared by this pending call and the client's check, which notes when it let
    // the request go: the lookup of an unknown outcome waits a timeout from then.
    auto left_at = std::make_shared<std::atomic<Millis>>(0);
    request.may_send = [clock = d_.clock, until = lease_until_, left_at] {
      const Millis now = clock->NowMillis();
      if (now >= until) return false;
      left_at->store(now);
      return true;
    };
    due_.push_back(PendingCall{next_call_++, phase, std::move(request), step_index, overrides,
                               body_rules, std::move(then), d_.clock->NowMillis(),
                               std::chrono::steady_clock::now(), std::move(left_at),
                               std::move(admitted_)});
    admitted_ = AdmittedCall();  // a lookup's further pages go when their page is asked for
    return absl::OkStatus();
  }

  // Classifies the response to the pending call once, counts it in the call metrics,
  // keeps its attempt record for the next change (the store numbers it), and
  // commits what the call's transition makes of it.
  absl::Status Answered(int id, HttpResponse response) {
    auto found = out_.find(id);
    if (found == out_.end()) {
      return absl::InternalError("instance " + instance_.key + ": an answer to call " +
                                 std::to_string(id) + ", which is not under way");
    }
    PendingCall call = std::move(found->second);
    out_.erase(found);
    if (!Busy()) held_.reset();
    d_.metrics->RecordLatency(
        call.phase,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - call.sent_at).count());
    CallResult sent{std::move(response)};
    sent.left_at = call.left_at->load();
    const bool request = call.phase == CallPhase::kCall || call.phase == CallPhase::kCompensate;
    const AnswerClass read = ClassifyAnswer(
        sent.response,
        {&call.overrides, call.body_rules,
         request ? &definition_->steps[call.step_index].accepted_statuses : nullptr});
    sent.error_class = read.error_class;
    sent.exists = read.exists;
    sent.accepted = read.accepted;
    d_.metrics->RecordOutcome(call.phase, sent.error_class);
    DropPermit(call.admitted.permit, HealthOf(sent.response.outcome, sent.error_class));
    const HttpResponse& answer = sent.response;
    if (answer.token_renewed) {
      // Sent once before with a token the target refused: on the wire, so recorded,
      // but no business attempt (the step's count does not move).
      AttemptRecord refused;
      refused.step_index = call.step_index;
      refused.phase = AttemptPhaseOf(call.phase);
      refused.sent = true;
      refused.connection = ConnectionUsed::kNew;
      refused.status = 401;
      refused.error_class = ErrorClass::kTransient;
      refused.detail =
          "401 to an expired or revoked bearer token: token renewed, request sent "
          "again (not a business attempt)";
      refused.started_at = call.started_at;
      refused.finished_at = call.started_at;
      refused.worker = lease_.owner;
      refused.lease_epoch = lease_.epoch;
      pending_attempts_.push_back(std::move(refused));
    }
    AttemptRecord attempt;
    attempt.step_index = call.step_index;
    attempt.phase = AttemptPhaseOf(call.phase);
    attempt.sent = answer.outcome.sent;
    attempt.connection = answer.outcome.connection;
    attempt.status =
        answer.outcome.kind == CallOutcome::Kind::kResponse ? answer.outcome.status : 0;
    attempt.error_class = sent.error_class;
    attempt.detail = ShortenMessage(DescribeResponse(answer));
    attempt.started_at = call.started_at;
    attempt.finished_at = d_.clock->NowMillis();
    attempt.worker = lease_.owner;  // sent under the lease this runner holds
    attempt.lease_epoch = lease_.epoch;
    pending_attempts_.push_back(std::move(attempt));
    return call.then(sent);
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

  absl::Status Fail(int index, const std::string& message, std::optional<AlertKind> alert) {
    return Commit(FailStep(Now(), steps_[index], ErrorClass::kRejected, message, alert));
  }

  absl::Status RunStep(int index) {
    const StepDefinition& def = definition_->steps[index];
    // A condition is judged once, when the step is first due (a retry does not
    // judge it again: what it read has not changed).
    if (!def.when.Always() && steps_[index].state == StepState::kPending &&
        steps_[index].attempts == 0) {
      absl::StatusOr<bool> holds = Holds(def.when, Context(index, ""));
      if (!holds.ok()) {
        return Fail(index, "when: " + std::string(holds.status().message()), std::nullopt);
      }
      if (!*holds) return Commit(SkipStep(Now(), index, "when: " + def.when.shown + " is false"));
    }
    if (def.kind == StepKind::kTransform) {
      const Millis started = d_.clock->NowMillis();
      absl::StatusOr<std::string> output;
      if (auto tree = RenderTree(Json::parse(def.transform_json), Context(index, "")); tree.ok()) {
        output = JsonText(*tree);
      } else {
        output = tree.status();
      }
      return Commit(RecordTransform(Now(), index, output, started));
    }
    if (def.kind == StepKind::kSql) return RunSql(index);
    if (def.kind == StepKind::kWait) return Commit(RunWait(Now(), index));
    if (def.kind == StepKind::kApproval && steps_[index].state == StepState::kWaiting) {
      return Commit(ApprovalDue(Now(), index));  // a deadline of its open request
    }
    if (def.kind == StepKind::kApproval) {
      return Commit(OpenApproval(
          Now(), index, RenderApproval(def.approval, instance_.input_json, Context(index, ""))));
    }
    if (std::optional<Change> beyond = BeyondKeyWindow(Now(), index)) {
      return Commit(std::move(*beyond));
    }
    CrashPoint("before-step", def.name);
    const bool side_effecting = def.request.SideEffecting();
    const std::string key = side_effecting ? StepKey(index) : "";
    if (side_effecting && key.empty()) {
      return Fail(index, "idempotency key template did not render", std::nullopt);
    }
    if (BreaksHeaderLine(key)) {  // it is sent as the Idempotency-Key header
      return Fail(index, "the idempotency key would contain a line break or NUL; refused",
                  std::nullopt);
    }
    std::string body_identity;
    auto request = Render(def.request, Context(index, key), &body_identity);
    if (!request.ok()) return Fail(index, std::string(request.status().message()), std::nullopt);
    const std::string hash = RequestHash(request->method, request->url, body_identity);
    const StepRecord& recorded = steps_[index];
    if (side_effecting && !recorded.request_hash.empty() && recorded.request_hash != hash) {
      return Fail(index,
                  "the request changed since the last attempt under idempotency key '" + key +
                      "' (was " + recorded.request_hash.substr(0, 16) + ", now " +
                      hash.substr(0, 16) + ")",
                  AlertKind::kIdempotencyConflict);
    }

    WS_ASSIGN_OR_RETURN(bool admitted, Admitted(index, *request, Context(index, key)));
    if (!admitted) return absl::OkStatus();

    // Checkpoint `running` before the call: a crash from here on is an unknown outcome.
    const std::string span = Decorate(*request, key);
    const Millis retention = StepKeyRetention(*definition_, d_.idempotency_retention);
    // The test-only switch stands for a broken engine that calls without its
    // checkpoint: `waystone verify` must catch it (tests/verify).
    absl::Status claimed = TestSwitch("skip-running-checkpoint")
                               ? absl::OkStatus()
                               : Commit(BeginCall(Now(), index, key, hash, span, retention));
    if (absl::IsFailedPrecondition(claimed)) {
      return Fail(index, std::string(claimed.message()), AlertKind::kIdempotencyConflict);
    }
    if (IsDeliveryOwned(claimed)) {
      // One delivery per identity: another instance owns this one (nothing was sent).
      return Commit(
          SkipStep(Now(), index, std::string(claimed.message()) + "; not sent again from here"));
    }
    WS_RETURN_IF_ERROR(claimed);

    CrashPoint("before-call", def.name);
    return Call(
        CallPhase::kCall, std::move(*request), index, def.errors,
        [this, index, name = def.name](const CallResult& sent) {
          CrashPoint("after-call", name);
          WS_RETURN_IF_ERROR(Commit(RecordCall(Now(), steps_[index], sent)));
          CrashPoint("after-checkpoint", name);
          return absl::OkStatus();
        },
        &def.body_errors);
  }

  absl::Status ResolveUnknown(int index) {
    if (std::optional<Change> settled = ResolveWithoutLookup(Now(), index)) {
      return Commit(std::move(*settled));
    }
    const StepDefinition& def = definition_->steps[index];
    StepRecord step = steps_[index];
    auto request = Render(def.lookup->request, Context(index, step.idempotency_key));
    if (!request.ok()) {
      return Commit(Pause(Now(), step, AlertKind::kNeedsOperator,
                          "lookup of step '" + step.name +
                              "' cannot be built: " + std::string(request.status().message())));
    }
    WS_ASSIGN_OR_RETURN(bool admitted, Admitted(index, *request, Context(index, "")));
    if (!admitted) return absl::OkStatus();
    Decorate(*request, "");
    CrashPoint("before-lookup", def.name);
    step.lookups += 1;
    std::shared_ptr<LookupPages> pages;  // shared by the answers of this lookup's pages
    if (def.lookup->Paginated()) {
      if (!def.lookup->page_param.empty()) {  // numbered from `first`, never the API's default
        request->url = WithQueryParam(request->url, def.lookup->page_param,
                                      std::to_string(def.lookup->first_page));
      }
      pages = std::make_shared<LookupPages>(*def.lookup, request->url);
    }
    return AskLookupPage(index, step, std::move(*request), std::move(pages));
  }

  // Asks for one page of step `index`'s lookup. Unpaginated, its answer goes to
  // RecordLookup; paginated, each 2xx page is added to `pages` and the next asked
  // for, and the last one goes to RecordLookup holding every page's candidates.
  absl::Status AskLookupPage(int index, const StepRecord& step, HttpRequest request,
                             std::shared_ptr<LookupPages> pages) {
    HttpRequest next_page = request;  // the same headers ask for the next page
    auto then = [this, index, step, pages, next_page](const CallResult& sent) -> absl::Status {
      CrashPoint("after-lookup", step.name);
      if (pages == nullptr) return Commit(RecordLookup(Now(), step, sent, RenderMatch(index)));
      if (sent.error_class != ErrorClass::kNone) {
        return Commit(RecordLookup(Now(), step, sent, RenderMatch(index)));  // retried whole
      }
      if (sent.response.outcome.status == 404) {
        if (pages->pages_read() == 0) {
          return Commit(RecordLookup(Now(), step, sent, RenderMatch(index)));  // nothing at all
        }
        return Commit(LookupUnproven(Now(), step,
                                     "page " + std::to_string(pages->pages_read() + 1) +
                                         " answered 404 after the pages before it"));
      }
      auto next = pages->Add(sent.response.body);
      if (!next.ok()) {
        return Commit(LookupUnproven(Now(), step, std::string(next.status().message())));
      }
      if (!next->has_value()) {
        CallResult all = sent;
        all.response.body = pages->Merged();
        return Commit(RecordLookup(Now(), step, all, RenderMatch(index)));
      }
      // Records the pages read so far and renews the lease (and this runner's view of
      // it): reading many pages may take longer than one lease.
      Change progress;
      progress.now = d_.clock->NowMillis();
      WS_RETURN_IF_ERROR(Commit(std::move(progress)));
      HttpRequest following = next_page;
      following.url = **next;
      WS_RETURN_IF_ERROR(ApplyTarget(following, Context(index, "")));
      return AskLookupPage(index, step, std::move(following), pages);
    };
    return Call(CallPhase::kLookup, std::move(request), index, kLookupStatuses, std::move(then));
  }

  // The key of step `index`'s compensation: its own template rendered (a
  // notification's correction has its own delivery identity), else "<step key>:compensate".
  std::string CompensationKeyOf(int index) {
    const std::string step_key = StepKey(index);
    const std::string& pattern = definition_->steps[index].compensate->idempotency_key;
    if (pattern.empty()) return CompensationKey(step_key);
    auto parsed = Template::Parse(pattern);
    if (!parsed.ok()) return CompensationKey(step_key);
    absl::StatusOr<std::string> rendered = parsed->RenderText(Context(index, step_key));
    return rendered.ok() && !rendered->empty() ? *rendered : CompensationKey(step_key);
  }

  // The statement of `spec` with its parameters rendered for step `index`.
  absl::StatusOr<BusinessStatement> Bound(const SqlSpec& spec, int index) const {
    if (d_.tenant_scoped_sql && !spec.statement.unscoped.empty()) {
      // Registration refuses such a definition; one stored before tenants were configured
      // must not run either.
      return absl::InvalidArgumentError("statement is not scoped to its tenant: " +
                                        spec.statement.unscoped);
    }
    const TemplateScope context = Context(index, "");
    BusinessStatement statement;
    statement.sqlite = spec.statement.sqlite;
    statement.postgres = spec.statement.postgres;
    for (const auto& [name, value] : spec.params) {
      SqlParam bound;
      if (value) {
        WS_ASSIGN_OR_RETURN(Template parsed, Template::Parse(*value));
        absl::StatusOr<Json> rendered = parsed.Render(context);
        if (!rendered.ok()) {
          return absl::InvalidArgumentError("params." + name + ": " +
                                            std::string(rendered.status().message()));
        }
        bound = ToSqlParam(*rendered);
      }
      statement.values.push_back(std::move(bound));
    }
    return statement;
  }

  static SqlParam ToSqlParam(const Json& value) {
    using Kind = SqlParam::Kind;
    if (value.is_null()) return {Kind::kNull, ""};
    if (value.is_boolean()) return {Kind::kBoolean, value.get<bool>() ? "true" : "false"};
    if (value.is_number_integer() &&
        (value.is_number_unsigned() ? value.get<uint64_t>() <= INT64_MAX : true)) {
      return {Kind::kInteger, value.dump()};
    }
    if (value.is_number()) return {Kind::kReal, value.dump()};
    if (value.is_string()) return {Kind::kText, value.get<std::string>()};
    return {Kind::kText, JsonText(value)};  // an object or array: its JSON (a json column)
  }

  // A sql step: its statement commits in the transaction of its checkpoint, so there
  // is no moment at which one is written and the other not, and nothing to recover.
  absl::Status RunSql(int index) {
    const StepDefinition& def = definition_->steps[index];
    CrashPoint("before-step", def.name);
    const Millis started = d_.clock->NowMillis();
    absl::StatusOr<BusinessStatement> statement = Bound(def.sql, index);
    if (!statement.ok()) {
      return Fail(index, "sql." + std::string(statement.status().message()), std::nullopt);
    }
    const absl::Status committed = Commit(RecordSql(Now(), index, std::move(*statement), started));
    if (IsStatementFailure(committed)) {
      return Fail(index, "sql: " + std::string(committed.message()), std::nullopt);
    }
    WS_RETURN_IF_ERROR(committed);
    // The rows the store recorded as the step's result, for the templates after it.
    WS_ASSIGN_OR_RETURN(steps_, d_.store->GetSteps(lease_.instance_id));
    CrashPoint("after-checkpoint", def.name);
    return absl::OkStatus();
  }

  absl::Status CompensateSql(int index) {
    const StepDefinition& def = definition_->steps[index];
    CrashPoint("before-compensate", def.name);
    absl::StatusOr<BusinessStatement> statement = Bound(*def.compensate_sql, index);
    if (!statement.ok()) {
      return Commit(CompensationFailed(
          Now(), steps_[index], "compensate.sql." + std::string(statement.status().message()), ""));
    }
    const absl::Status committed =
        Commit(RecordSqlCompensation(Now(), index, std::move(*statement)));
    if (IsStatementFailure(committed)) {
      return Commit(CompensationFailed(Now(), steps_[index],
                                       "compensate.sql: " + std::string(committed.message()), ""));
    }
    WS_RETURN_IF_ERROR(committed);
    CrashPoint("after-compensate-checkpoint", def.name);
    return absl::OkStatus();
  }

  absl::Status Compensate(int index) {
    if (definition_->steps[index].compensate_sql) return CompensateSql(index);
    if (std::optional<Change> unsafe = CompensationInFlight(Now(), index)) {
      return Commit(std::move(*unsafe));
    }
    const StepDefinition& def = definition_->steps[index];
    const std::string key = CompensationKeyOf(index);
    auto request = Render(def.compensate->request, Context(index, key));
    if (!request.ok()) {
      return Commit(CompensationFailed(
          Now(), steps_[index],
          "compensation request cannot be built: " + std::string(request.status().message()), key));
    }
    WS_ASSIGN_OR_RETURN(bool admitted, Admitted(index, *request, Context(index, key)));
    if (!admitted) return absl::OkStatus();
    Decorate(*request, key);
    WS_RETURN_IF_ERROR(Commit(BeginCompensation(Now(), index, key)));

    CrashPoint("before-compensate", def.name);
    return Call(CallPhase::kCompensate, std::move(*request), index, {},
                [this, index, key, name = def.name](const CallResult& sent) {
                  CrashPoint("after-compensate", name);
                  WS_RETURN_IF_ERROR(Commit(RecordCompensation(Now(), steps_[index], sent, key)));
                  CrashPoint("after-compensate-checkpoint", name);
                  return absl::OkStatus();
                });
  }

  RunnerDeps d_;
  mutable InstanceContext context_{d_.environment};  // Context's, since Load
  bool async_ = false;              // Drive returns at each call instead of sending it
  std::vector<PendingCall> due_;    // checkpointed, to be sent
  std::map<int, PendingCall> out_;  // sent, by id, until answered
  int next_call_ = 1;
  std::shared_ptr<Answers> answers_ = std::make_shared<Answers>();  // synchronous drive
  std::vector<int> calling_steps_;               // what Now() last gave the transitions as busy
  std::optional<LeaseKeeper::Guard> held_;       // while a call is due or out
  std::vector<AttemptRecord> pending_attempts_;  // sent, not yet committed
  AdmittedCall admitted_;         // the call admitted last (permit, rate slot), until it is made
  std::optional<Parked> parked_;  // set when a target refused the call due
  Millis lease_until_ = 0;        // the lease as of the last commit (0: released)
  bool finished_ = false;         // the last commit finished the instance (FinishAfter)
  Lease lease_;
  std::unique_ptr<CreatedInstance> created_;  // until the first Load
  InstanceRecord instance_;
  std::vector<StepRecord> steps_;
  std::shared_ptr<const WorkflowDefinition> definition_;
};

CreatedInstance CreatedBy(const InstanceRecord& instance,
                          const std::vector<std::string>& step_names) {
  CreatedInstance created{instance, {}};
  created.steps.reserve(step_names.size());
  for (size_t i = 0; i < step_names.size(); ++i) {
    StepRecord step;
    step.instance_id = instance.id;
    step.index = static_cast<int>(i);
    step.name = step_names[i];
    step.state = StepState::kPending;
    created.steps.push_back(std::move(step));
  }
  return created;
}

InstanceRunner::InstanceRunner(const RunnerDeps& deps, Lease lease,
                               std::optional<CreatedInstance> created)
    : impl_(std::make_unique<Impl>(deps, std::move(lease), std::move(created))) {}
InstanceRunner::~InstanceRunner() = default;

absl::StatusOr<DriveResult> InstanceRunner::Drive(std::stop_token stop, bool async) {
  return impl_->Drive(stop, async);
}
std::vector<OutgoingCall> InstanceRunner::TakeRequests() { return impl_->TakeRequests(); }
absl::StatusOr<DriveResult> InstanceRunner::Resume(int id, HttpResponse response,
                                                   std::stop_token stop) {
  return impl_->Resume(id, std::move(response), stop);
}
int64_t InstanceRunner::instance_id() const { return impl_->instance_id(); }

const InstanceRecord* InstanceRunner::committed_row() const { return impl_->committed_row(); }

}  // namespace waystone
