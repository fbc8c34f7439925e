#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <stop_token>
#include <thread>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "engine/catalog.h"
#include "engine/code_workflow.h"
#include "engine/commit_queue.h"
#include "engine/context.h"
#include "engine/drive/call_metrics.h"
#include "engine/drive/instance_runner.h"
#include "engine/drive/target_settings.h"
#include "engine/lease_keeper.h"
#include "engine/operate/operations.h"
#include "engine/pacer.h"
#include "model/json_text.h"
#include "model/keys.h"
#include "model/outbox_events.h"
#include "model/template.h"
#include "store/lease_owners.h"

namespace waystone {

class Engine::Impl {
  // A lease not yet driven: claimed by the dispatcher, or taken by a start, which also
  // brings what it created so that the worker need not read it back.
  struct Ready {
    Lease lease;
    std::optional<CreatedInstance> created;
  };

 public:
  Impl(Store* store, HttpClient* http, const Clock* clock, Random* random,
       const EngineOptions& options, TemplateEnvironment environment)
      : store_(store),
        authorizing_(NewOAuth2HttpClient(http, clock)),
        http_(authorizing_.get()),
        clock_(clock),
        random_(random),
        options_(options),
        environment_(std::move(environment)),
        catalog_(store),
        commits_(store, CommitQueueOptions{options.max_batch}) {
    if (options_.owner.empty()) options_.owner = MakeOwnerName(random_->Hex(4));
    metrics_ = options_.call_metrics != nullptr ? options_.call_metrics : &own_metrics_;
    commits_.Start();
    keeper_ = std::make_unique<LeaseKeeper>(&commits_, clock_, options_.lease_duration);
    operations_ = std::make_unique<Operations>(store_, &catalog_, &environment_, clock_, random_,
                                               options_.owner + "/ops", options_.lease_duration,
                                               options_.idempotency_retention);
  }

  ~Impl() {
    Stop();
    keeper_.reset();
    commits_.Stop();
  }

  RunnerDeps Deps() {
    RunnerDeps deps{store_,
                    &commits_,
                    http_,
                    clock_,
                    random_,
                    &catalog_,
                    &environment_,
                    options_.lease_duration,
                    options_.idempotency_retention,
                    keeper_.get(),
                    metrics_,
                    options_.files_dir,
                    &code_};
    deps.tenant_scoped_sql = !options_.tenants.empty();
    return deps;
  }

  absl::Status AddCodeTargets(const std::vector<TargetSpec>& targets, const std::string& tenant) {
    InstanceRecord nobody;
    nobody.tenant = tenant;
    nobody.input_json = "{}";
    WS_RETURN_IF_ERROR(CheckTargetsRender(targets, environment_.BuildInstancePart(nobody)));
    code_.AddTargets(targets);
    return absl::OkStatus();
  }

  absl::StatusOr<WorkflowDefinition> RegisterCode(const std::string& name,
                                                  std::shared_ptr<const CodeWorkflow> workflow) {
    if (name.empty() || name.size() > 128 ||
        name.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
            std::string::npos) {
      return absl::InvalidArgumentError("workflow name '" + name +
                                        "': 1 to 128 letters, digits, '.', '_' or '-'");
    }
    WorkflowDefinition definition = CodeWorkflowDefinition(name);
    code_.Register(name, std::move(workflow));
    WS_RETURN_IF_ERROR(catalog_.Register(definition, clock_->NowMillis()));
    {
      MutexLock lock(mu_);
      work_arrived_ = true;  // instances waiting for this function may run now
    }
    dispatch_.notify_one();
    return definition;
  }

  absl::Status Register(const WorkflowDefinition& definition) {
    if (!options_.tenants.empty()) WS_RETURN_IF_ERROR(CheckTenantScoped(definition));
    for (const StepDefinition& step : definition.steps) {
      if (step.kind != StepKind::kHttp) continue;
      Millis longest = step.request.timeout;
      if (step.lookup) longest = std::max(longest, step.lookup->request.timeout);
      if (step.compensate) longest = std::max(longest, step.compensate->request.timeout);
      // Long calls keep their lease through the LeaseKeeper; a lease far shorter than
      // a call would still depend on many renewals in a row, so that is refused.
      if (longest > 20 * options_.lease_duration) {
        return absl::InvalidArgumentError(
            definition.source + ":" + std::to_string(step.line) + ": step '" + step.name +
            "': timeout " + std::to_string(longest) + "ms is more than 20 leases of " +
            std::to_string(options_.lease_duration) + "ms (raise --lease)");
      }
    }
    return catalog_.Register(definition, clock_->NowMillis());
  }

  absl::StatusOr<StartResult> StartInstance(const WorkflowDefinition& definition,
                                            const StartRequest& request) {
    if (request.input_json.size() > kMaxInputBytes) {
      return absl::InvalidArgumentError("input is " + std::to_string(request.input_json.size()) +
                                        " bytes; the limit is " + std::to_string(kMaxInputBytes));
    }
    if (!ValidTenantName(request.tenant)) {
      return absl::InvalidArgumentError("tenant '" + request.tenant +
                                        "' is not a tenant name (1 to 64 letters, digits, '.', "
                                        "'_' or '-')");
    }
    if (!options_.tenants.empty()) {
      auto policy = options_.tenants.find(request.tenant);
      if (policy == options_.tenants.end()) {
        return absl::PermissionDeniedError("tenant '" + request.tenant +
                                           "' is not configured on this server (tenants:)");
      }
      const auto& allowed = policy->second.workflows;
      if (std::find(allowed.begin(), allowed.end(), definition.name) == allowed.end()) {
        return absl::PermissionDeniedError("tenant '" + request.tenant + "' may not start '" +
                                           definition.name + "' (tenants." + request.tenant +
                                           ".workflows)");
      }
    }
    WS_ASSIGN_OR_RETURN(nlohmann::json input, ParseBoundedJson(request.input_json, "input"));
    absl::StatusOr<std::string> key;
    if (definition.code) {
      // A code workflow has no key template: the caller names the business action.
      if (request.key.empty()) {
        return absl::InvalidArgumentError("workflow '" + definition.name +
                                          "' is code: its start needs a business key");
      }
      key = request.key;
    } else {
      // (A code workflow's input is any JSON value its codec writes.)
      if (!input.is_object()) return absl::InvalidArgumentError("input must be a JSON object");
      WS_ASSIGN_OR_RETURN(Template key_template, Template::Parse(definition.key));
      key = key_template.RenderText(environment_.ForKey(input, request.tenant));
      if (!key.ok()) {
        return absl::InvalidArgumentError(
            "business key '" + definition.key +
            "' cannot be built from this input: " + std::string(key.status().message()));
      }
      if (key->empty()) return absl::InvalidArgumentError("business key renders empty");
      if (!request.key.empty() && request.key != *key) {
        return absl::InvalidArgumentError("business key '" + request.key +
                                          "' was asked for, but '" + definition.key + "' gives '" +
                                          *key +
                                          "' for this input; nothing was "
                                          "started");
      }
    }
    if (key->size() > kMaxBusinessKeyBytes) {
      return absl::InvalidArgumentError("business key is " + std::to_string(key->size()) +
                                        " bytes; the limit is " +
                                        std::to_string(kMaxBusinessKeyBytes));
    }
    // The key travels in headers (Idempotency-Key) and URLs: no control characters.
    for (unsigned char c : *key) {
      if (c < 0x20 || c == 0x7F) {
        return absl::InvalidArgumentError("business key contains a control character");
      }
    }
    // Registered once, not on every start: a write on the store per start would queue
    // behind (and on SQLite, take the write lock from) the checkpoints.
    if (!definition.code && !catalog_.IsCurrent(definition)) {
      WS_RETURN_IF_ERROR(Register(definition));
    }

    NewInstance in;
    in.tenant = request.tenant;
    in.key = *key;
    in.workflow = definition.name;
    in.definition_hash = definition.content_hash;
    in.input_json = JsonText(input);  // canonical: keys sorted
    in.input_hash = Sha256Hex(in.input_json);
    in.trace_id = random_->Hex(16);
    in.started_by = request.started_by;
    in.event_source = request.event_source;
    in.event_id = request.event_id;
    in.event_data_hash = in.input_hash;  // a start event's data is the input
    in.now = clock_->NowMillis();
    for (const auto& step : definition.steps) in.step_names.push_back(step.name);
    InstanceRecord shown;
    shown.key = in.key;
    shown.tenant = in.tenant;
    shown.workflow = in.workflow;
    shown.trace_id = in.trace_id;
    in.started_event = MakeEvent("waystone.instance.started", shown, nullptr, "", *random_, in.now);
    // With a worker of this engine free for it, the instance is created leased to this
    // engine and handed to that worker: no claim transaction, no dispatcher between.
    const bool reserved = ReserveWorker();
    if (reserved) {
      in.lease_owner = options_.owner;
      in.lease_expires_at = in.now + options_.lease_duration;
    }
    auto result = commits_.Start(in);  // group-committed with other callers' starts
    const bool created = result.ok() && result->outcome == StartOutcome::kCreated;
    if (reserved) {
      std::optional<Ready> ready;
      if (created && result->instance.lease_owner == options_.owner &&
          result->instance.lease_epoch == 1) {
        ready = Ready{Lease{result->instance.id, 1, options_.owner},
                      CreatedBy(result->instance, in.step_names)};
      }
      HandOver(std::move(ready));
    }
    if (created && !reserved) {
      {
        MutexLock lock(mu_);
        work_arrived_ = true;  // the dispatcher claims it now, not at its next poll
        backlog_ = true;
      }
      dispatch_.notify_one();
    }
    if (result.ok() && result->outcome == StartOutcome::kEventConflict) {
      InstanceRecord about = result->instance;
      about.tenant = in.tenant;
      WS_RETURN_IF_ERROR(RaiseInboxConflict(*store_, *random_, about, in.event_source, in.event_id,
                                            result->stored_data_hash, in.event_data_hash, in.now));
    }
    return result;
  }

  void Start() {
    MutexLock lock(mu_);
    if (started_) return;  // running, or a Stop() under way
    started_ = true;
    stopping_ = false;
    stop_ = std::stop_source();
    for (int i = 0; i < options_.workers; ++i) {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
    dispatcher_ = std::jthread([this](std::stop_token stop) { DispatchLoop(stop); });
  }

  void Stop() {
    {
      MutexLock lock(mu_);
      if (!started_ || stopping_) return;
      stopping_ = true;  // started_ stays set until the end: a Start() meanwhile does nothing
    }
    // Runners see the stop between actions, so no new call begins from here on; the
    // workers stay until every call under way has come back and been recorded.
    stop_.request_stop();
    dispatcher_.request_stop();
    dispatch_.notify_all();
    wake_.notify_all();
    if (dispatcher_.joinable()) dispatcher_.join();
    wake_.notify_all();
    for (auto& worker : workers_) {
      if (worker.joinable()) worker.join();
    }
    workers_.clear();
    // Leases claimed but never started are handed back.
    std::deque<Ready> unstarted;
    {
      MutexLock lock(mu_);
      unstarted.swap(ready_);
      for (const Ready& ready : unstarted) held_.erase(ready.lease.instance_id);
    }
    for (const Ready& ready : unstarted) HandBack(ready.lease, /*due_now=*/false);
    MutexLock lock(mu_);
    started_ = false;
    stopping_ = false;
  }

  absl::StatusOr<InstanceState> RunUntilRest(int64_t instance_id, std::stop_token stop) {
    while (!stop.stop_requested()) {
      if (options_.reap_dead_local_owners) {
        (void)ReapDeadLocalOwners(*store_, clock_->NowMillis());
      }
      CrashPoint("before-claim", "instance");
      auto lease = store_->ClaimInstance(instance_id, options_.owner, clock_->NowMillis(),
                                         options_.lease_duration);
      if (absl::IsFailedPrecondition(lease.status())) {
        clock_->SleepFor(100, stop);  // another live worker holds it
        continue;
      }
      if (!lease.ok()) return lease.status();
      InstanceRunner runner(Deps(), *lease);
      WS_ASSIGN_OR_RETURN(DriveResult result, runner.Drive(stop));
      if (result.lease_lost) continue;
      if (result.awaiting_event && !result.wake_at) return result.state;  // until an event comes
      if (result.awaiting_event) {
        // An event may complete the step before its deadline: look again every second.
        clock_->SleepFor(std::min<Millis>(*result.wake_at - clock_->NowMillis(), 1000), stop);
        continue;
      }
      if (result.wake_at) {
        clock_->SleepFor(*result.wake_at - clock_->NowMillis(), stop);
        continue;
      }
      if (IsTerminal(result.state)) return result.state;
    }
    return absl::CancelledError("stopped before the instance came to rest");
  }

  absl::StatusOr<bool> Idle() {
    {
      MutexLock lock(mu_);
      if (busy_ > 0 || calling_ > 0 || reserved_ > 0 || !ready_.empty() || !answered_.empty()) {
        return false;
      }
    }
    WS_ASSIGN_OR_RETURN(std::optional<Millis> due, store_->NextDueTime());
    return !due.has_value();
  }

  DefinitionCatalog& catalog() { return catalog_; }
  Operations& operations() { return *operations_; }
  const std::string& owner() const { return options_.owner; }
  const CallMetrics& call_metrics() const { return *metrics_; }

 private:
  // An instance held by this engine's workers: its runner, the calls it has out (the
  // branches of a parallel group call side by side) and the answers come back. A
  // worker drives it, or it is queued in answered_, or it is parked until an answer.
  // Its fields are guarded by mu_ (the runner only by whoever drives it).
  struct Flight {
    std::unique_ptr<InstanceRunner> runner;
    int out = 0;  // sent, not yet answered
    // Answered, not yet recorded, oldest first: seldom more than one, and a vector
    // costs nothing while empty (a deque keeps a block for each of thousands waiting).
    std::vector<std::pair<int, HttpResponse>> answers;
    bool parked = false;  // waits for an answer (counted in calling_)
    bool broken = false;  // its drive ended with calls out: their answers are dropped
  };

  void DispatchLoop(std::stop_token stop) {
    Millis last_reap = 0;
    while (!stop.stop_requested()) {
      const Millis now = clock_->NowMillis();
      if (options_.reap_dead_local_owners && now - last_reap >= 1000) {
        last_reap = now;
        auto reaped = ReapDeadLocalOwners(*store_, now);
        if (!reaped.ok()) Log(LogLevel::kWarning, "lease reaper: " + reaped.status().ToString());
      }
      int free = 0;
      {
        MutexLock lock(mu_);
        free = FreeSlots();
      }
      int claimed = 0;
      if (free > 0) {
        // (A start meanwhile may reserve one of these slots too: the worker it
        // reserved then takes a claimed lease a little later, which holds.)
        auto leases = store_->ClaimRunnable(options_.owner, now, options_.lease_duration, free);
        MutexLock lock(mu_);
        if (!leases.ok()) {
          Log(LogLevel::kWarning, "claim: " + leases.status().ToString());
        } else {
          claimed = static_cast<int>(leases->size());
          for (auto& lease : *leases) {
            held_.insert(lease.instance_id);
            ready_.push_back(Ready{std::move(lease), std::nullopt});
          }
          backlog_ = claimed == free;  // all it asked for: maybe more are due
        }
      }
      for (int i = 0; i < claimed; ++i) wake_.notify_one();  // a worker for each
      if (claimed > 0 && claimed == free) {
        continue;  // maybe more are due; claim again
      }
      if (free > 0 && claimed == 0 && notifications_) {
        // Nothing due: sleep until the next timer, or until the store says work arrived.
        Millis wait = kIdleWait;
        auto due = store_->NextDueTime();
        if (due.ok() && due->has_value()) {
          wait = std::clamp<Millis>(**due - clock_->NowMillis(), 0, kIdleWait);
        }
        const auto waiting_since = std::chrono::steady_clock::now();
        auto waited = store_->WaitForWork(wait);
        if (absl::IsUnimplemented(waited)) notifications_ = false;
        if (waited.ok()) {
          if (std::chrono::steady_clock::now() - waiting_since < std::chrono::milliseconds(wait)) {
            MutexLock lock(mu_);
            backlog_ = true;  // woken: work may have arrived (the next claim says)
          }
          continue;
        }
      }
      MutexLock lock(mu_);
      dispatch_.wait_for(
          lock.native(), stop, std::chrono::milliseconds(options_.poll_interval),
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return slot_freed_ || work_arrived_; });
      slot_freed_ = false;
      work_arrived_ = false;
    }
  }

  // As many instances as there are idle workers, within the bound on instances held;
  // the slots reserved by starts under way count as held.
  int FreeSlots() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int queued = static_cast<int>(ready_.size() + answered_.size()) + reserved_;
    return std::min(options_.workers - busy_ - queued,
                    options_.max_in_flight - busy_ - calling_ - queued);
  }

  // Reserves a worker for a start, when the workers run, one is free and no instance
  // may be waiting for the dispatcher: a start does not go before those (under a
  // steady stream of starts they would wait for a gap in it).
  bool ReserveWorker() {
    MutexLock lock(mu_);
    if (!started_ || stopping_ || backlog_ || FreeSlots() <= 0) return false;
    ++reserved_;
    return true;
  }

  // Ends a start's reservation: its instance, created leased to this engine, goes to
  // the worker reserved for it. Without one (the start found an existing instance, or
  // failed) the slot goes back to the dispatcher. Once the workers stop, the lease is
  // handed back at once (Stop() has taken what was ready), due now, so that another
  // process's workers are woken for it.
  void HandOver(std::optional<Ready> ready) {
    if (!ready) {
      {
        MutexLock lock(mu_);
        --reserved_;
        slot_freed_ = true;
      }
      dispatch_.notify_one();
      return;
    }
    bool stopped = false;
    {
      MutexLock lock(mu_);
      --reserved_;
      if (stopping_ || !started_) {
        stopped = true;
      } else {
        held_.insert(ready->lease.instance_id);
        ready_.push_back(std::move(*ready));
      }
    }
    if (stopped) {
      HandBack(ready->lease, /*due_now=*/true);  // not moved from: it stayed here
    } else {
      wake_.notify_one();
    }
  }

  // Lets go of a lease no worker started on; `due_now` also makes the instance due at
  // once (which on PostgreSQL wakes other processes' workers).
  void HandBack(const Lease& lease, bool due_now) {
    Change release;
    release.lease = lease;
    release.now = clock_->NowMillis();
    release.lease_expires_at = 0;
    if (due_now) release.next_run_at = release.now;
    auto status = commits_.Commit(release);
    if (!status.ok()) Log(LogLevel::kWarning, "releasing lease: " + status.ToString());
  }

  void WorkerLoop() {
    while (true) {
      Ready ready;
      std::shared_ptr<Flight> flight;
      std::pair<int, HttpResponse> answer;
      {
        // Answers first: their instance holds a lease and its outcome is not yet
        // durable. New claims only while not stopping; leave once every call is back.
        MutexLock lock(mu_);
        wake_.wait(lock.native(), [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !answered_.empty() || (!stopping_ && !ready_.empty()) ||
                 (stopping_ && calling_ == 0);
        });
        if (!answered_.empty()) {
          flight = std::move(answered_.front());
          answered_.pop_front();
          answer = std::move(flight->answers.front());
          flight->answers.erase(flight->answers.begin());
        } else if (!stopping_ && !ready_.empty()) {
          ready = std::move(ready_.front());
          ready_.pop_front();
        } else {
          return;
        }
        ++busy_;
      }
      absl::StatusOr<DriveResult> result;
      if (flight != nullptr) {
        result = flight->runner->Resume(answer.first, std::move(answer.second), stop_.get_token());
      } else {
        flight = std::make_shared<Flight>();
        flight->runner =
            std::make_unique<InstanceRunner>(Deps(), ready.lease, std::move(ready.created));
        result = flight->runner->Drive(stop_.get_token(), /*async=*/true);
      }
      const int64_t instance_id = flight->runner->instance_id();
      std::vector<OutgoingCall> calls;
      if (result.ok() && result->calling) calls = flight->runner->TakeRequests();
      const bool holds = result.ok() && (result->calling || result->awaiting_calls);
      bool rested = false;
      bool resumable = false;  // queued in answered_ for a worker
      bool stopping = false;
      {
        MutexLock lock(mu_);
        stopping = stopping_;
        --busy_;
        slot_freed_ = true;
        flight->out += static_cast<int>(calls.size());
        if (!holds && (flight->out > 0 || !flight->answers.empty())) {
          // Its drive ended (an error, a lost lease) with calls out: what they answer
          // is dropped (the steps stay running, recovered as unknown by the next drive).
          flight->broken = true;
          flight->answers.clear();
        }
        if (holds && !flight->answers.empty()) {
          answered_.push_back(flight);  // a worker resumes it with the next answer
          resumable = true;
        } else if (flight->out > 0) {
          flight->parked = true;  // until an answer comes back
          ++calling_;
        } else {
          rested = true;
          held_.erase(instance_id);
        }
      }
      dispatch_.notify_one();  // a slot is free
      if (stopping) {
        wake_.notify_all();  // the last call back lets every worker leave
      } else if (resumable) {
        wake_.notify_one();
      }
      for (OutgoingCall& call : calls) Send(flight, std::move(call));
      if (!result.ok()) {
        Log(LogLevel::kWarning,
            "instance " + std::to_string(instance_id) + ": " + result.status().ToString());
      }
      if (!rested) continue;
      if (result.ok() && IsTerminal(result->state)) {
        MutexLock lock(rest_mu_);
        if (auto it = awaited_.find(instance_id); it != awaited_.end()) {
          // Its waiters take the row as committed instead of reading it back; not
          // after a lost lease, when another worker may have written since.
          it->second.rest_row.reset();
          const InstanceRecord* row = flight->runner->committed_row();
          if (!result->lease_lost && row != nullptr) it->second.rest_row = *row;
          ++it->second.rests;  // every waiter on it looks again (none of another's)
          it->second.rested.notify_all();
        }
      }
      flight.reset();
    }
  }

  // Sends one of `flight`'s calls in its rate slot (the pacer holds it until then,
  // and it retakes a slot that passed before it could go); its answer queues the
  // flight for a worker unless one holds it already.
  void Send(const std::shared_ptr<Flight>& flight, OutgoingCall call) {
    const Millis now = clock_->NowMillis();
    if (const Millis at = NextSendTime(*store_, call.slot, now); at > now) {
      pacer_.At(
          at, [this, flight, call = std::move(call)]() mutable { Send(flight, std::move(call)); });
      return;
    }
    http_->SendAsync(std::move(call.request),
                     [this, flight, id = call.id](HttpResponse response) mutable {
                       // Notified under the lock: once it is let go, Stop() may find calling_ at 0
                       // and the engine be gone, so nothing of it is touched after.
                       MutexLock lock(mu_);
                       --flight->out;
                       bool resumable = false;  // queued in answered_ for a worker
                       if (flight->broken) {
                         if (flight->out == 0 && flight->parked) {
                           flight->parked = false;
                           held_.erase(flight->runner->instance_id());
                           flight->runner.reset();  // before Stop() may go on and free what it uses
                           --calling_;
                         }
                       } else {
                         flight->answers.emplace_back(id, std::move(response));
                         if (flight->parked) {
                           flight->parked = false;
                           --calling_;
                           answered_.push_back(flight);
                           resumable = true;
                         }
                       }
                       // (Not parked: the worker driving it takes the answer when its drive ends.)
                       if (stopping_) {
                         wake_.notify_all();  // the last call back lets every worker leave
                       } else if (resumable) {
                         wake_.notify_one();  // a worker records the answer
                       }
                     });
  }

 public:
  // At rest means IsTerminal: completed, compensated, failed, closed, or waiting for
  // an operator; nothing runs until someone acts.
  absl::StatusOr<InstanceRecord> AwaitRest(int64_t instance_id, Millis timeout) {
    // Real time: the caller waits on a socket or a benchmark clock, not on the
    // engine's (possibly fake) clock.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout);
    Awaited* awaited = nullptr;  // stays until its last waiter erases it
    {
      MutexLock lock(rest_mu_);
      awaited = &awaited_[instance_id];
      ++awaited->waiters;
    }
    auto result = [&]() -> absl::StatusOr<InstanceRecord> {
      bool first = true;
      while (true) {
        uint64_t seen = 0;
        {
          MutexLock lock(rest_mu_);
          seen = awaited->rests;
        }
        // The store answers for what this engine's workers did not drive (another
        // process, an operator); a local worker's finish wakes the wait at once and
        // hands it the row it committed. While a local worker holds it (checked after
        // `seen`: its rest comes later), the first read would find it still running:
        // the wait goes first.
        const bool read = !first || !HeldHere(instance_id);
        first = false;
        if (read) {
          WS_ASSIGN_OR_RETURN(InstanceRecord instance, store_->GetInstance(instance_id));
          if (IsTerminal(instance.state) || std::chrono::steady_clock::now() >= deadline) {
            return instance;
          }
        }
        const auto now = std::chrono::steady_clock::now();
        MutexLock lock(rest_mu_);
        const bool rested = awaited->rested.wait_for(
            lock.native(),
            std::min<std::chrono::steady_clock::duration>(deadline - now,
                                                          std::chrono::milliseconds(250)),
            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rest_mu_) { return awaited->rests != seen; });
        if (rested && awaited->rest_row) return *awaited->rest_row;
      }
    }();
    MutexLock lock(rest_mu_);
    if (--awaited->waiters == 0) awaited_.erase(instance_id);
    return result;
  }

 private:
  bool HeldHere(int64_t instance_id) {
    MutexLock lock(mu_);
    return held_.contains(instance_id);
  }

  Store* store_;
  // Sends through the caller's client, with bearer tokens for targets that use OAuth2.
  std::unique_ptr<HttpClient> authorizing_;
  HttpClient* http_;  // authorizing_
  const Clock* clock_;
  Random* random_;
  EngineOptions options_;
  TemplateEnvironment environment_;
  CallMetrics own_metrics_;  // counts the calls when the options bring no CallMetrics
  CallMetrics* metrics_;     // options_.call_metrics or &own_metrics_
  DefinitionCatalog catalog_;
  CodeWorkflows code_;  // the code workflows registered with this engine
  CommitQueue commits_;
  std::unique_ptr<LeaseKeeper> keeper_;  // renews leases during long calls
  std::unique_ptr<Operations> operations_;

  Mutex mu_;
  std::condition_variable_any wake_;              // workers: an instance is ready or answered
  std::condition_variable_any dispatch_;          // the dispatcher: a slot freed or work arrived
  std::deque<Ready> ready_ ABSL_GUARDED_BY(mu_);  // not yet driven
  std::deque<std::shared_ptr<Flight>> answered_ ABSL_GUARDED_BY(mu_);  // to resume
  int busy_ ABSL_GUARDED_BY(mu_) = 0;      // instances a worker drives now
  int calling_ ABSL_GUARDED_BY(mu_) = 0;   // instances parked while their calls are under way
  int reserved_ ABSL_GUARDED_BY(mu_) = 0;  // slots held by starts under way
  // Instances whose lease this engine's workers hold (ready, driven, or waiting for
  // their calls): a local worker announces their rest, so AwaitRest need not read
  // them before it waits. (An id held twice, e.g. a broken flight's instance claimed
  // again once its lease ran out, leaves with the first hold to end: AwaitRest then
  // only reads once more than it needs to.)
  std::unordered_set<int64_t> held_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::stop_source stop_;  // runners stop between actions once Stop() requests it
  bool slot_freed_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool work_arrived_ ABSL_GUARDED_BY(mu_) = false;  // a start since the dispatcher last looked
  // Instances may be due that the dispatcher has not claimed: a start created for any
  // worker, a claim that got all it asked for, the store's signal. Cleared by a claim
  // that finds fewer than it asked for.
  bool backlog_ ABSL_GUARDED_BY(mu_) = false;
  Mutex rest_mu_;
  // An awaited instance: its waiters wait on its own condition, so one instance
  // coming to rest wakes only those who wait for it (64 callers each waiting for
  // their own instance were all woken by each one's finish).
  struct Awaited {
    int waiters = 0;     // callers of AwaitRest on this instance
    uint64_t rests = 0;  // times a local worker left it at rest since the first came
    std::condition_variable_any rested;  // a local worker left it at rest
    // The row as the worker that last left it at rest committed it (none when that
    // worker lost its lease or ran a code workflow: then the store answers).
    std::optional<InstanceRecord> rest_row;
  };
  std::map<int64_t, Awaited> awaited_ ABSL_GUARDED_BY(rest_mu_);
  bool notifications_ = true;  // the store can wake the dispatcher; dispatcher thread only
  static constexpr Millis kIdleWait = 1000;
  // Holds the calls a target's rate limit gave a later slot; after the members its
  // jobs touch, so it is gone (its last job run) before them.
  Pacer pacer_{clock_};
  std::jthread dispatcher_;
  std::vector<std::thread> workers_;
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(Store* store, HttpClient* http,
                                                       const Clock* clock, Random* random,
                                                       const EngineOptions& options) {
  if (options.workers < 1) return absl::InvalidArgumentError("workers must be at least 1");
  if (options.max_in_flight < options.workers) {
    return absl::InvalidArgumentError("max_in_flight must be at least the number of workers");
  }
  if (options.lease_duration < 2000) {
    return absl::InvalidArgumentError("lease duration must be at least 2s");
  }
  WS_ASSIGN_OR_RETURN(TemplateEnvironment environment,
                      TemplateEnvironment::Load(options.secrets_file, options.tenants));
  WS_ASSIGN_OR_RETURN(std::string public_ids_key, store->ServerKey("public_ids"));
  environment.set_public_ids(PublicIds(std::move(public_ids_key)));
  return std::unique_ptr<Engine>(new Engine(
      std::make_unique<Impl>(store, http, clock, random, options, std::move(environment))));
}

absl::Status Engine::Register(const WorkflowDefinition& definition) {
  return impl_->Register(definition);
}
absl::StatusOr<WorkflowDefinition> Engine::RegisterCode(
    const std::string& name, std::shared_ptr<const CodeWorkflow> workflow) {
  return impl_->RegisterCode(name, std::move(workflow));
}
absl::Status Engine::AddCodeTargets(const std::vector<TargetSpec>& targets,
                                    const std::string& tenant) {
  return impl_->AddCodeTargets(targets, tenant);
}
absl::StatusOr<StartResult> Engine::StartInstance(const WorkflowDefinition& definition,
                                                  const StartRequest& request) {
  return impl_->StartInstance(definition, request);
}
void Engine::Start() { impl_->Start(); }
void Engine::Stop() { impl_->Stop(); }
absl::StatusOr<InstanceState> Engine::RunUntilRest(int64_t instance_id, std::stop_token stop) {
  return impl_->RunUntilRest(instance_id, stop);
}
absl::StatusOr<InstanceRecord> Engine::AwaitRest(int64_t instance_id, Millis timeout) {
  return impl_->AwaitRest(instance_id, timeout);
}
absl::StatusOr<bool> Engine::Idle() { return impl_->Idle(); }
DefinitionCatalog& Engine::catalog() { return impl_->catalog(); }
Operations& Engine::operations() { return impl_->operations(); }
const std::string& Engine::owner() const { return impl_->owner(); }
const CallMetrics& Engine::call_metrics() const { return impl_->call_metrics(); }

}  // namespace waystone
