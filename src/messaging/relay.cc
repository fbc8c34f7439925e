#include "messaging/relay.h"

#include <functional>
#include <set>

#include "base/mutex.h"
#include "base/crash_point.h"
#include "base/log.h"
#include "base/redact.h"
#include "base/status_macros.h"
#include "engine/events.h"
#include "engine/lease_reaper.h"
#include "messaging/cloudevent.h"

namespace waystone {
namespace {

constexpr int kExpandBatch = 500;
constexpr Millis kUnknownScanInterval = 5'000;
// How often a relay looks for leases of dead relays on this host, as the engine's
// dispatcher does: the look reads every pending delivery (2 ms at a backlog of
// 35,000 on PostgreSQL), too much for every round.
constexpr Millis kReapInterval = 1'000;

bool IsAlertType(const std::string& type) { return type.starts_with("waystone.alert."); }

}  // namespace

Relay::Relay(Store* store, const Clock* clock, Random* random, const RelayConfig& config,
             const std::string& owner)
    : store_(store),
      clock_(clock),
      random_(random),
      config_(config),
      owner_(owner),
      pool_(std::make_unique<DeliveryPool>(config.parallel)) {}

Relay::~Relay() { Stop(); }

absl::StatusOr<std::unique_ptr<Relay>> Relay::Create(Store* store, HttpClient* http,
                                                     const Clock* clock, Random* random,
                                                     const RelayConfig& config,
                                                     const std::string& owner) {
  if (config.sinks.empty()) return absl::InvalidArgumentError("the relay needs at least one sink");
  if (config.parallel < 1 || config.batch < 1) {
    return absl::InvalidArgumentError("the relay's parallel and batch must be at least 1");
  }
  auto relay = std::unique_ptr<Relay>(new Relay(store, clock, random, config, owner));
  for (const SinkConfig& sink : config.sinks) {
    switch (sink.kind) {
      case SinkKind::kWebhook:
        relay->sinks_[sink.name] = NewWebhookSink(sink, http, clock);
        break;
      case SinkKind::kNats:
        relay->sinks_[sink.name] = NewNatsSink(sink);
        break;
    }
  }
  return relay;
}

void Relay::SetSinkForTest(const std::string& name, std::unique_ptr<Sink> sink) {
  MutexLock lock(mu_);
  sinks_[name] = std::move(sink);
}

void Relay::Start() {
  thread_ = std::jthread([this](std::stop_token stop) {
    while (!stop.stop_requested()) {
      auto attempted = RunOnce();
      if (!attempted.ok()) {
        Log(LogLevel::kWarning, "relay: " + attempted.status().ToString());
      }
      if (!attempted.ok() || *attempted == 0) clock_->WaitFor(config_.poll_interval, stop);
    }
  });
}

void Relay::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

absl::StatusOr<int> Relay::RunOnce() {
  MutexLock lock(mu_);
  const Millis now = clock_->NowMillis();
  if (now - last_unknown_scan_ >= kUnknownScanInterval) {
    last_unknown_scan_ = now;
    WS_RETURN_IF_ERROR(RaiseStaleUnknownAlerts());
  }
  WS_RETURN_IF_ERROR(Expand());
  // A relay on this host that died mid-delivery leaves leases behind: take them at
  // the first round, then look again once a second.
  if (!last_reap_ || now - *last_reap_ >= kReapInterval) {
    last_reap_ = now;
    WS_ASSIGN_OR_RETURN(std::vector<std::string> owners, store_->DeliveryLeaseOwners(now));
    for (const std::string& owner : owners) {
      if (IsDeadLocalOwner(owner)) WS_RETURN_IF_ERROR(store_->ExpireDeliveryLeases(owner));
    }
  }
  WS_ASSIGN_OR_RETURN(std::vector<std::string> disabled, store_->DisabledSinks());
  std::vector<std::string> enabled;
  for (const auto& sink : config_.sinks) {
    if (std::find(disabled.begin(), disabled.end(), sink.name) == disabled.end()) {
      enabled.push_back(sink.name);
    }
  }
  if (enabled.empty()) return 0;
  const Millis claimed_at = clock_->NowMillis();
  WS_ASSIGN_OR_RETURN(std::vector<DeliveryClaim> claims,
                      store_->ClaimDeliveries(owner_, claimed_at, config_.lease,
                                              config_.batch, enabled));
  for (const DeliveryClaim& claim : claims) {
    if (!sinks_.contains(claim.sink)) return absl::InternalError("no sink named " + claim.sink);
  }
  const std::vector<std::optional<DeliveryOutcome>> outcomes = DeliverAll(claims, claimed_at + config_.lease);
  const Millis finished_at = clock_->NowMillis();
  std::vector<FinishedDelivery> finished;
  for (size_t i = 0; i < claims.size(); ++i) {
    if (!outcomes[i]) continue;
    finished.push_back({claims[i], UpdateFor(claims[i], *outcomes[i], finished_at)});
  }
  // One transaction for the round: a relay killed before it commits delivers the
  // round's acknowledged events again, with the same ids (at least once).
  WS_ASSIGN_OR_RETURN(std::vector<absl::Status> results, store_->FinishDeliveries(finished));
  for (const absl::Status& status : results) {
    if (!status.ok()) Log(LogLevel::kInfo, "relay: " + std::string(status.message()));
  }
  return static_cast<int>(claims.size());
}

absl::Status Relay::Expand() {
  for (const SinkConfig& sink : config_.sinks) {
    WS_ASSIGN_OR_RETURN(int64_t cursor, store_->OutboxCursor(sink.name));
    WS_ASSIGN_OR_RETURN(std::vector<EventRecord> rows, store_->ReadOutbox(cursor, kExpandBatch));
    if (rows.empty()) continue;
    std::vector<std::pair<int64_t, int64_t>> wanted;  // seq, instance id
    for (const EventRecord& row : rows) {
      const bool wants = IsAlertType(row.type) ? sink.name == config_.alert_sink ||
                                                     (!sink.events.empty() &&
                                                      sink.Wants(row.type, WorkflowOf(row)))
                                               : sink.Wants(row.type, WorkflowOf(row));
      if (wants) wanted.emplace_back(row.seq, row.instance_id);
    }
    auto status = store_->AddDeliveries(sink.name, cursor, rows.back().seq, wanted,
                                        clock_->NowMillis());
    if (absl::IsAborted(status)) continue;  // another relay expanded these rows
    WS_RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

EventRecord Relay::AlertEvent(const AlertRecord& alert, Millis now) {
  InstanceRecord instance;
  if (auto found = store_->GetInstance(alert.instance_id); found.ok()) instance = *found;
  instance.id = alert.instance_id;
  StepRecord step;
  step.name = alert.step;
  return MakeEvent("waystone.alert." + std::string(ToString(alert.kind)), instance,
                   alert.step.empty() ? nullptr : &step, alert.message, *random_, now);
}

absl::Status Relay::RaiseStaleUnknownAlerts() {
  const Millis now = clock_->NowMillis();
  WS_ASSIGN_OR_RETURN(std::vector<StaleUnknown> stale,
                      store_->StaleUnknownSteps(now - config_.unknown_alert_after));
  for (const StaleUnknown& s : stale) {
    AlertRecord alert{0, s.instance_id, s.tenant, s.step, AlertKind::kUnknownUnresolved,
                      AlertState::kOpen,
                      "outcome of step '" + s.step + "' unknown since " +
                          std::to_string((now - s.unknown_since) / 1000) + "s ago",
                      now};
    WS_RETURN_IF_ERROR(store_->RaiseAlert(alert, AlertEvent(alert, now)).status());
  }
  return absl::OkStatus();
}

std::vector<std::optional<DeliveryOutcome>> Relay::DeliverAll(
    const std::vector<DeliveryClaim>& claims, Millis leases_end) {
  // A lane is the claims of one instance and sink. The store claims only the oldest
  // pending delivery of each, so a lane holds one claim; should it hold more, they
  // go one after another in outbox order and stop at the first not acknowledged
  // (the rest keep their lease until it expires), so no event overtakes an earlier one.
  std::map<std::pair<std::string, int64_t>, std::vector<size_t>> lanes;
  for (size_t i = 0; i < claims.size(); ++i) {
    lanes[{claims[i].sink, claims[i].event.instance_id}].push_back(i);
  }
  std::vector<std::optional<DeliveryOutcome>> outcomes(claims.size());
  std::vector<std::function<void()>> tasks;
  tasks.reserve(lanes.size());
  for (const auto& lane : lanes) {
    const std::vector<size_t>* indexes = &lane.second;
    tasks.push_back([this, &claims, &outcomes, indexes, leases_end] {
      for (size_t i : *indexes) {
        const Millis longest = sinks_.at(claims[i].sink)->longest_attempt();
        if (clock_->NowMillis() + longest >= leases_end) break;  // left to expire, not sent
        try {
          outcomes[i] = Attempt(claims[i]);
        } catch (const std::exception& e) {
          // A sink that throws is a failed attempt, retried like any other.
          outcomes[i] = DeliveryOutcome{DeliveryOutcome::Result::kRetry,
                                        std::string("delivery threw: ") + e.what()};
        }
        if (outcomes[i]->result != DeliveryOutcome::Result::kDelivered) break;
      }
    });
  }
  pool_->Run(tasks);
  return outcomes;
}

DeliveryOutcome Relay::Attempt(const DeliveryClaim& claim) {
  const std::string body = ToCloudEventJson(claim.event, config_.deployment);
  CrashPoint("before-deliver", claim.sink);
  DeliveryOutcome outcome = sinks_.at(claim.sink)->Deliver(claim.event, body);
  CrashPoint("after-deliver", claim.sink);
  // A sink's answer may echo what it got (a signing secret, a template secret in
  // the event): kept and alerted only redacted.
  outcome.detail = RedactSecrets(outcome.detail);
  return outcome;
}

DeliveryUpdate Relay::UpdateFor(const DeliveryClaim& claim, DeliveryOutcome outcome,
                                Millis now) {
  DeliveryUpdate update;
  update.now = now;
  update.attempts = claim.attempts + 1;
  update.error = outcome.detail;
  switch (outcome.result) {
    case DeliveryOutcome::Result::kDelivered:
      update.state = DeliveryState::kDelivered;
      update.error.clear();
      break;
    case DeliveryOutcome::Result::kRetry:
      if (config_.retry.Exhausted(update.attempts)) {
        update.state = DeliveryState::kParked;
        AlertRecord alert{0, claim.event.instance_id, claim.event.tenant, "",
                          AlertKind::kDeliveryParked, AlertState::kOpen,
                          "event " + claim.event.event_id + " (" + claim.event.type +
                              ") parked for sink '" + claim.sink + "' after " +
                              std::to_string(update.attempts) + " attempts: " + outcome.detail,
                          now};
        update.alert = alert;
        update.alert_event = AlertEvent(alert, now);
      } else {
        update.state = DeliveryState::kPending;
        update.next_attempt_at =
            now + config_.retry.NextDelay(update.attempts, outcome.retry_after, *random_);
      }
      break;
    case DeliveryOutcome::Result::kEndpointGone: {
      // The endpoint refuses for good: stop sending to it, keep every delivery.
      update.state = DeliveryState::kPending;
      update.disable_sink = true;
      // Each carries the alert; the store writes it once per sink (the first disable
      // that commits), so a first one whose lease was lost cannot leave it unsaid.
      AlertRecord alert{0, claim.event.instance_id, claim.event.tenant, "",
                        AlertKind::kSinkDisabled, AlertState::kOpen,
                        "sink '" + claim.sink + "' answered " + outcome.detail +
                            " (gone); it is disabled and its events wait until it is enabled",
                        now};
      update.alert = alert;
      update.alert_event = AlertEvent(alert, now);
      break;
    }
  }
  return update;
}

}  // namespace waystone
