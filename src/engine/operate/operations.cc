#include "engine/operate/operations.h"

#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/crash_point.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "engine/catalog.h"
#include "engine/code_workflow.h"
#include "engine/context.h"
#include "engine/redaction.h"
#include "model/json_text.h"
#include "model/outbox_events.h"
#include "model/template.h"
#include "rules/approvals.h"
#include "rules/transitions.h"

namespace waystone {
namespace {

// What a change stores: without the secrets a downstream or an operator echoed.
Change Redacted(Change change) {
  RedactChange(change);
  return change;
}

using Json = nlohmann::json;

// A signal waits this long for a worker to let go of the instance.
constexpr Millis kClaimPatience = 3000;

// A code workflow's instance keeps at most this many events its function has not
// waited for (a sender that keeps sending what nothing takes is refused).
constexpr size_t kMaxKeptEvents = 100;

// True when every placeholder of `url` names what an operator may see in the
// instance view anyway: the input, the instance, the step's key, a step's
// external id, or the base URL of a system (an env value at the very start).
// Never a secret, a response value or an env value elsewhere.
bool ShownInPreview(const Template& url, std::string_view text) {
  bool first = true;
  for (const std::vector<std::string>& path : url.references()) {
    const std::string& root = path.front();
    const bool base = first && text.starts_with("{{") && root == "env" && path.size() == 2;
    first = false;
    if (base || root == "input" || root == "instance") continue;
    if (root == "step" && path.size() == 2 && path[1] == "idempotency_key") continue;
    if (root == "steps" && path.size() == 3 && path[2] == "external_id") continue;
    return false;
  }
  return true;
}

// Drops "user:password@" from a URL: a base URL in the environment may carry it.
std::string WithoutUserinfo(std::string url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t host = scheme + 3;
  const size_t end = url.find_first_of("/?#", host);
  const size_t at = url.rfind('@', end == std::string::npos ? url.size() : end);
  if (at != std::string::npos && at >= host) url.erase(host, at + 1 - host);
  return url;
}

// Fills in each planned call's rendered_url: the URL the engine would send, from
// the instance as it stands after the action's changes. A URL that names anything
// the instance view does not show (ShownInPreview), or a value not known yet (a
// result of a step still to run), stays a template.
void RenderPlannedUrls(const WorkflowDefinition& definition, const InstanceRecord& instance,
                       std::vector<StepRecord> steps, const TemplateEnvironment& environment,
                       ActionPlan& plan) {
  for (const StepRecord& changed : plan.changed_steps) {
    if (changed.index >= 0 && changed.index < static_cast<int>(steps.size())) {
      steps[changed.index] = changed;
    }
  }
  for (PlannedCall& call : plan.would_execute) {
    if (call.url.empty()) continue;
    auto parsed = Template::Parse(call.url);
    if (!parsed.ok() || !ShownInPreview(*parsed, call.url)) continue;
    // A lookup is sent with its step's key too (the plan lists it without one).
    std::string key = call.idempotency_key;
    for (size_t i = 0; key.empty() && i < definition.steps.size(); ++i) {
      if (definition.steps[i].name == call.step) {
        key = StepIdempotencyKey(definition, instance, steps, static_cast<int>(i), environment);
      }
    }
    auto url = parsed->RenderUrl(environment.Build(instance, steps, call.step, key));
    if (url.ok()) call.rendered_url = WithoutUserinfo(*url);
  }
}
}  // namespace

Operations::Operations(Store* store, DefinitionCatalog* catalog,
                       const TemplateEnvironment* environment, const Clock* clock, Random* random,
                       std::string owner, Millis lease_duration, Millis idempotency_retention)
    : store_(store),
      catalog_(catalog),
      environment_(environment),
      clock_(clock),
      random_(random),
      owner_(std::move(owner)),
      lease_duration_(lease_duration),
      idempotency_retention_(idempotency_retention) {}

// Committed through Commit, the change carries the lease, which the commit releases,
// and is redacted; destroyed without a commit that took, it releases the lease, so an
// instance is never left locked until the lease runs out.
class Operations::Held {
 public:
  Held(Operations* operations, Lease lease) : operations_(operations), lease_(std::move(lease)) {}
  Held(Held&& other) noexcept
      : operations_(std::exchange(other.operations_, nullptr)), lease_(std::move(other.lease_)) {}
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  Held& operator=(Held&&) = delete;
  ~Held() {
    if (operations_ != nullptr) (void)operations_->Release(lease_);
  }

  // Lets the instance go with nothing committed.
  absl::Status Release() {
    Operations* operations = std::exchange(operations_, nullptr);
    return operations == nullptr ? absl::OkStatus() : operations->Release(lease_);
  }

  // Commits `change` under the lease and returns the store's verdict on it (say
  // AlreadyExists for an inbox claim a concurrent delivery made first). A change the
  // store refused leaves the lease held, for Release or the destructor.
  absl::StatusOr<absl::Status> Commit(Change change) {
    change.lease = lease_;
    change.lease_expires_at = 0;
    WS_ASSIGN_OR_RETURN(std::vector<absl::Status> results,
                        operations_->store_->Commit({Redacted(change)}));
    if (results.front().ok()) operations_ = nullptr;  // the commit released it
    return results.front();
  }

 private:
  Operations* operations_;  // null once released
  Lease lease_;
};

absl::StatusOr<Operations::Held> Operations::Hold(int64_t instance_id) {
  const Millis deadline = clock_->NowMillis() + kClaimPatience;
  while (true) {
    auto lease = store_->ClaimInstance(instance_id, owner_, clock_->NowMillis(), lease_duration_);
    if (lease.ok()) return Held(this, *std::move(lease));
    if (!absl::IsFailedPrecondition(lease.status())) return lease.status();
    if (clock_->NowMillis() >= deadline) {
      return absl::AbortedError(std::string(lease.status().message()) +
                                "; a worker is on it, try again shortly");
    }
    clock_->SleepFor(50, {});
  }
}

absl::Status Operations::Release(const Lease& lease) {
  Change release;
  release.lease = lease;
  release.now = clock_->NowMillis();
  release.lease_expires_at = 0;
  WS_ASSIGN_OR_RETURN(std::vector<absl::Status> results, store_->Commit({release}));
  return results.front();
}

absl::StatusOr<ActionResult> Operations::Apply(const std::string& tenant, const std::string& key,
                                               const OperatorRequest& request) {
  WS_ASSIGN_OR_RETURN(InstanceRecord instance, store_->FindInstance(tenant, key));
  std::optional<Held> held;
  if (!request.dry_run) {
    absl::StatusOr<Held> hold = Hold(instance.id);
    if (!hold.ok()) return hold.status();
    held.emplace(*std::move(hold));
    // Read again under the lease: no worker changes it from here on.
    WS_ASSIGN_OR_RETURN(instance, store_->GetInstance(instance.id));
    // A batch's runner whose claim on the item expired while it applied this
    // action may have been followed by another runner: under the lease, the audit
    // trail says whether this batch's action is already in.
    if (!request.batch.empty()) {
      WS_ASSIGN_OR_RETURN(const std::vector<AuditRecord> audit, store_->ListAudit(instance.id));
      if (AuditHoldsBatchAction(audit, ToString(request.action), request.batch)) {
        return absl::AlreadyExistsError("batch " + request.batch + " applied its " +
                                        std::string(ToString(request.action)) +
                                        " to this instance already");
      }
    }
  }
  std::vector<StepRecord> steps;
  WS_ASSIGN_OR_RETURN(steps, store_->GetSteps(instance.id));
  WS_ASSIGN_OR_RETURN(std::shared_ptr<const WorkflowDefinition> definition,
                      catalog_->Get(instance.definition_hash));
  auto step_key = [&](int index) {
    return StepIdempotencyKey(*definition, instance, steps, index, *environment_);
  };
  WS_ASSIGN_OR_RETURN(ActionPlan plan, PlanOperatorAction(*definition, instance, steps, request,
                                                          clock_->NowMillis(), step_key));
  RenderPlannedUrls(*definition, instance, steps, *environment_, plan);
  if (request.dry_run) return ActionResult{plan, instance, false};

  Change change = ActionChange(instance, plan, request, clock_->NowMillis(), *random_);
  change.reservations =
      OwedDeliveries(*definition, instance, steps, change, *environment_, idempotency_retention_);
  WS_ASSIGN_OR_RETURN(const absl::Status committed, held->Commit(std::move(change)));
  WS_RETURN_IF_ERROR(committed);
  WS_ASSIGN_OR_RETURN(InstanceRecord after, store_->GetInstance(instance.id));
  return ActionResult{plan, after, true};
}

absl::StatusOr<AlertRecord> Operations::AcknowledgeAlert(const std::string& tenant, int64_t id,
                                                         const std::string& actor,
                                                         const std::string& reason, bool dry_run) {
  if (reason.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("a reason is required");
  }
  WS_ASSIGN_OR_RETURN(AlertRecord alert, store_->GetAlert(id));
  if (tenant != "*" && alert.tenant != tenant) {
    return absl::NotFoundError("no alert " + std::to_string(id));
  }
  if (alert.state != AlertState::kOpen) {
    // No id in the text: callers show public ids, not the database's.
    return absl::FailedPreconditionError("the alert is " + std::string(ToString(alert.state)) +
                                         ", not open");
  }
  if (dry_run) return alert;
  const Json detail = {{"alert", id}, {"kind", ToString(alert.kind)}, {"step", alert.step}};
  WS_RETURN_IF_ERROR(
      store_->AcknowledgeAlert(id, {0, clock_->NowMillis(), actor, alert.tenant, alert.instance_id,
                                    "acknowledge", reason, JsonText(detail)}));
  return store_->GetAlert(id);
}

std::string InboxConflictMessage(const std::string& source, const std::string& id,
                                 const std::string& stored_hash, const std::string& new_hash) {
  return "event " + source + " " + id +
         " came again with other data (received first with data "
         "hash " +
         stored_hash.substr(0, 16) + ", now " + new_hash.substr(0, 16) + "); it was not applied";
}

absl::Status RaiseInboxConflict(Store& store, Random& random, const InstanceRecord& instance,
                                const std::string& source, const std::string& id,
                                const std::string& stored_hash, const std::string& new_hash,
                                Millis now) {
  AlertRecord alert{0,
                    instance.id,
                    instance.tenant,
                    "",
                    AlertKind::kInboxConflict,
                    AlertState::kOpen,
                    InboxConflictMessage(source, id, stored_hash, new_hash),
                    now};
  return store.RaiseAlert(alert, MakeAlertEvent(alert, instance, random, now)).status();
}

std::string EventDataHash(const std::string& data_json) {
  const Json data = Json::parse(data_json, nullptr, false);
  return Sha256Hex(data.is_discarded() ? data_json : JsonText(data));
}

absl::StatusOr<SignalResult> Operations::SeenBefore(const Signal& signal,
                                                    const std::string& data_hash) {
  WS_ASSIGN_OR_RETURN(std::optional<InboxEntry> seen,
                      store_->LookupInbox(signal.tenant, signal.source, signal.id));
  if (!seen) return absl::NotFoundError("not in the inbox");
  // The instance may be gone (gc): the alert names what the claim remembers.
  InstanceRecord instance;
  instance.id = seen->instance_id;
  instance.tenant = signal.tenant;
  instance.key = signal.key;
  SignalResult result{SignalOutcome::kDuplicate, data_hash, seen->data_hash};
  if (!seen->data_hash.empty() && seen->data_hash != data_hash) {
    result.outcome = SignalOutcome::kConflict;
    WS_RETURN_IF_ERROR(RaiseInboxConflict(*store_, *random_, instance, signal.source, signal.id,
                                          seen->data_hash, data_hash, clock_->NowMillis()));
    return result;
  }
  WS_RETURN_IF_ERROR(store_->AddToCounter(kCounterInboxDuplicates, 1));
  return result;
}

absl::StatusOr<SignalResult> Operations::Deliver(const Signal& signal) {
  const std::string data_hash = EventDataHash(signal.data_json);
  // The inbox first: a redelivery is answered even after gc removed its instance.
  auto seen = SeenBefore(signal, data_hash);
  if (seen.ok() || !absl::IsNotFound(seen.status())) return seen;
  WS_ASSIGN_OR_RETURN(InstanceRecord instance, store_->FindInstance(signal.tenant, signal.key));
  WS_ASSIGN_OR_RETURN(Held held, Hold(instance.id));
  {
    // Under the lease, the inbox again: a concurrent delivery of the same event may
    // have committed while this one waited for the lease, and moved its step on.
    if (auto now_seen = SeenBefore(signal, data_hash); !absl::IsNotFound(now_seen.status())) {
      if (now_seen.ok()) WS_RETURN_IF_ERROR(held.Release());
      return now_seen;
    }
    WS_ASSIGN_OR_RETURN(instance, store_->GetInstance(instance.id));
    WS_ASSIGN_OR_RETURN(std::vector<StepRecord> steps, store_->GetSteps(instance.id));
    WS_ASSIGN_OR_RETURN(auto definition, catalog_->Get(instance.definition_hash));
    Change change;
    change.now = clock_->NowMillis();
    // A function waits in ctx.WaitEvent: its latest row "$wait:<type>" (code_runner.cc)
    // decides: waiting (the event completes it), or timed out, whether or not a worker
    // has recorded the timeout yet (and whatever became of the instance since).
    const StepRecord* wait = nullptr;
    for (const StepRecord& step : steps) {
      if (definition->code && step.name == CodeWaitRowName(signal.event_type)) wait = &step;
    }
    if (wait != nullptr &&
        ((wait->state == StepState::kWaiting && wait->next_attempt_at <= change.now) ||
         wait->state == StepState::kFailed)) {
      return absl::DeadlineExceededError("instance '" + instance.key +
                                         "' waited for event "
                                         "type '" +
                                         signal.event_type + "' until its timeout");
    }
    if (instance.state != InstanceState::kRunning &&
        instance.state != InstanceState::kNeedsAttention) {
      return absl::FailedPreconditionError("instance '" + instance.key + "' is " +
                                           std::string(ToString(instance.state)) +
                                           "; it takes no more events");
    }
    if (definition->code) {
      if (wait != nullptr && wait->state == StepState::kWaiting) {
        StepRecord arrived = *wait;
        arrived.state = StepState::kCompleted;
        arrived.response_json = signal.data_json;
        arrived.external_id = signal.id;
        arrived.next_attempt_at = 0;
        arrived.finished_at = change.now;
        change.steps.push_back(arrived);
        change.events.push_back(MakeEvent("waystone.step.completed", instance, &arrived,
                                          "event " + signal.event_type, *random_, change.now));
      }
      if (change.steps.empty()) {
        // Its function does not wait for this type now: kept for its next WaitEvent
        // of the type (one that never comes leaves it unused, shown with the instance).
        WS_ASSIGN_OR_RETURN(std::vector<KeptEvent> kept, store_->GetKeptEvents(instance.id));
        if (kept.size() >= kMaxKeptEvents) {
          return absl::FailedPreconditionError(
              "instance '" + instance.key + "' keeps " + std::to_string(kept.size()) +
              " events its function has not waited for; it takes no more");
        }
        change.keep =
            KeptEvent{0, signal.event_type, signal.source, signal.id, signal.data_json, change.now};
      }
    } else {
      const StepRecord* waiting = nullptr;
      for (const StepRecord& step : steps) {
        const StepDefinition& def = definition->steps[step.index];
        if (def.kind == StepKind::kWait && def.wait_event == signal.event_type &&
            (step.state == StepState::kPending || step.state == StepState::kWaiting)) {
          waiting = &step;
          break;
        }
      }
      if (waiting == nullptr) {
        return absl::FailedPreconditionError("instance '" + instance.key +
                                             "' has no step waiting for event type '" +
                                             signal.event_type + "'");
      }
      const Facts facts{*definition, instance, steps, clock_->NowMillis(), *random_};
      change = EventArrived(facts, waiting->index, signal.data_json, signal.id,
                            "event " + signal.event_type + " from " + signal.source);
    }
    // A kept event wakes nothing: the instance rests until what it waits for.
    if (instance.state == InstanceState::kRunning && !change.keep) change.next_run_at = change.now;
    change.inbox = InboxClaim{signal.tenant, signal.source, signal.id, data_hash};
    change.reservations =
        OwedDeliveries(*definition, instance, steps, change, *environment_, idempotency_retention_);
    Json detail = {{"type", signal.event_type}, {"source", signal.source}, {"id", signal.id}};
    if (change.keep) {
      detail["kept"] = true;
    } else {
      detail["step"] = change.steps.front().name;
    }
    change.audits.push_back({0, change.now, signal.actor, instance.tenant, instance.id, "signal",
                             "event " + signal.event_type +
                                 (change.keep ? ", kept until the function waits for it" : ""),
                             JsonText(detail)});
    const SignalOutcome outcome = change.keep ? SignalOutcome::kKept : SignalOutcome::kApplied;
    WS_ASSIGN_OR_RETURN(const absl::Status committed, held.Commit(std::move(change)));
    if (absl::IsAlreadyExists(committed)) {
      // Claimed by a concurrent delivery of the same event between the check and now.
      WS_RETURN_IF_ERROR(held.Release());
      return SeenBefore(signal, data_hash);
    }
    WS_RETURN_IF_ERROR(committed);
    return SignalResult{outcome, data_hash, ""};
  }
}

absl::StatusOr<bool> Operations::ReceivedBefore(const std::optional<InboxClaim>& event,
                                                const InstanceRecord& instance) {
  if (!event) return false;
  WS_ASSIGN_OR_RETURN(std::optional<InboxEntry> seen,
                      store_->LookupInbox(event->tenant, event->source, event->id));
  if (!seen) return false;
  if (seen->data_hash.empty() || seen->data_hash == event->data_hash) return true;
  WS_RETURN_IF_ERROR(RaiseInboxConflict(*store_, *random_, instance, event->source, event->id,
                                        seen->data_hash, event->data_hash, clock_->NowMillis()));
  return absl::FailedPreconditionError(
      InboxConflictMessage(event->source, event->id, seen->data_hash, event->data_hash));
}

absl::StatusOr<DecisionResult> Operations::Received(const InstanceRecord& instance, int index) {
  WS_ASSIGN_OR_RETURN(std::vector<StepRecord> steps, store_->GetSteps(instance.id));
  DecisionResult result{instance, steps[index], false, true};
  return result;
}

absl::StatusOr<DecisionResult> Operations::Decide(const std::string& tenant, const std::string& key,
                                                  const Decision& decision) {
  WS_ASSIGN_OR_RETURN(InstanceRecord instance, store_->FindInstance(tenant, key));
  WS_ASSIGN_OR_RETURN(auto definition, catalog_->Get(instance.definition_hash));
  const int index = definition->StepIndex(decision.step);
  if (index < 0 || definition->steps[index].kind != StepKind::kApproval) {
    return absl::NotFoundError("instance '" + key + "' has no approval step '" + decision.step +
                               "'");
  }
  WS_ASSIGN_OR_RETURN(const bool received, ReceivedBefore(decision.inbox, instance));
  if (received) return Received(instance, index);
  WS_ASSIGN_OR_RETURN(Held held, Hold(instance.id));
  {
    // Under the lease, the inbox again: a concurrent copy may have committed meanwhile.
    WS_ASSIGN_OR_RETURN(const bool received_meanwhile, ReceivedBefore(decision.inbox, instance));
    if (received_meanwhile) {
      WS_RETURN_IF_ERROR(held.Release());
      return Received(instance, index);
    }
    WS_ASSIGN_OR_RETURN(instance, store_->GetInstance(instance.id));
    WS_ASSIGN_OR_RETURN(std::vector<StepRecord> steps, store_->GetSteps(instance.id));
    const ApprovalSpec& spec = definition->steps[index].approval;
    // What a decision before the request opens is about: the request as it would open now.
    absl::StatusOr<ApprovalSnapshot> current = RenderApproval(
        spec, instance.input_json, environment_->Build(instance, steps, decision.step, ""));
    WS_ASSIGN_OR_RETURN(const std::vector<AlertRecord> alerts, store_->ListAlerts(instance.id));
    const Facts facts{*definition, instance, steps, clock_->NowMillis(), *random_};
    DecisionOutcome outcome =
        DecisionArrived(facts, index, decision,
                        current.ok() ? *current : MaterialOf(spec, instance.input_json), alerts);
    DecisionResult result{instance, steps[index], outcome.replayed};
    if (outcome.replayed) {
      WS_RETURN_IF_ERROR(held.Release());
      return result;
    }
    Change change = std::move(outcome.change);
    change.inbox = decision.inbox;
    change.reservations =
        OwedDeliveries(*definition, instance, steps, change, *environment_, idempotency_retention_);
    CrashPoint("before-decide", decision.step);
    WS_ASSIGN_OR_RETURN(const absl::Status committed, held.Commit(std::move(change)));
    if (decision.inbox && absl::IsAlreadyExists(committed)) {
      // Its event was received by another delivery between the check and now.
      WS_RETURN_IF_ERROR(held.Release());
      return Received(instance, index);
    }
    WS_RETURN_IF_ERROR(committed);
    CrashPoint("after-decide", decision.step);
    WS_RETURN_IF_ERROR(outcome.refusal);
    WS_ASSIGN_OR_RETURN(result.instance, store_->GetInstance(instance.id));
    WS_ASSIGN_OR_RETURN(steps, store_->GetSteps(instance.id));
    result.step = steps[index];
    return result;
  }
}

absl::StatusOr<RevisionResult> Operations::Revise(const std::string& tenant, const std::string& key,
                                                  const Revision& revision) {
  if (revision.reason.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("a reason is required");
  }
  WS_ASSIGN_OR_RETURN(InstanceRecord instance, store_->FindInstance(tenant, key));
  WS_ASSIGN_OR_RETURN(auto definition, catalog_->Get(instance.definition_hash));
  if (definition->code) {
    return absl::FailedPreconditionError("instance '" + key +
                                         "' runs a function: its input is not revised");
  }
  WS_ASSIGN_OR_RETURN(const bool received, ReceivedBefore(revision.inbox, instance));
  if (received) {
    RevisionResult duplicate;
    duplicate.instance = instance;
    duplicate.duplicate = true;
    return duplicate;
  }
  WS_ASSIGN_OR_RETURN(Held held, Hold(instance.id));
  {
    WS_ASSIGN_OR_RETURN(instance, store_->GetInstance(instance.id));
    WS_ASSIGN_OR_RETURN(std::vector<StepRecord> steps, store_->GetSteps(instance.id));
    const Facts facts{*definition, instance, steps, clock_->NowMillis(), *random_};
    WS_ASSIGN_OR_RETURN(RevisionOutcome outcome, waystone::Revise(facts, revision));
    RevisionResult result;
    result.instance = instance;
    result.unchanged = outcome.unchanged;
    result.material = outcome.material;
    result.cancelled = outcome.cancelled;
    result.reopened = outcome.reopened;
    result.reruns = outcome.reruns;
    result.input_hash = outcome.input_hash;
    if (outcome.unchanged) {
      WS_RETURN_IF_ERROR(held.Release());
      return result;
    }
    Change change = std::move(outcome.change);
    change.inbox = revision.inbox;
    WS_ASSIGN_OR_RETURN(const absl::Status committed, held.Commit(std::move(change)));
    if (revision.inbox && absl::IsAlreadyExists(committed)) {
      WS_RETURN_IF_ERROR(held.Release());
      result.duplicate = true;
      return result;
    }
    WS_RETURN_IF_ERROR(committed);
    WS_ASSIGN_OR_RETURN(result.instance, store_->GetInstance(instance.id));
    return result;
  }
}

}  // namespace waystone
