#include "messaging/relay.h"

#include <algorithm>
#include <functional>
#include <set>

#include "absl/cleanup/cleanup.h"
#include "base/crash_point.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/redact.h"
#include "base/status_macros.h"
#include "messaging/cloudevent.h"
#include "model/outbox_events.h"
#include "store/lease_owners.h"

namespace waystone {
namespace {

constexpr int kExpandBatch = 500;
constexpr Millis kUnknownScanInterval = 5'000;
// How often a relay looks for leases of dead relays on this host, as the engine's
// dispatcher does: the look reads every pending delivery (2 ms at a backlog of
// 35,000 on PostgreSQL), too much for every round.
constexpr Millis kReapInterval = 1'000;
// How long Run waits after a round that failed before it tries again (at least).
constexpr Millis kErrorPause = 1'000;

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

// One round: its claims, the tasks that deliver them (they point into the round, so
// it does not move once started), and their outcomes.
struct Relay::Round {
  std::vector<DeliveryClaim> claims;
  Millis leases_end = 0;
  // A lane is the claims of one instance and sink.
  std::map<std::pair<std::string, int64_t>, std::vector<size_t>> lanes;
  // Claims (indexes) handed to a sink together: lanes of one claim to a sink that
  // takes batches.
  std::vector<std::vector<size_t>> batches;
  std::vector<std::function<void()>> tasks;
  std::vector<std::optional<DeliveryOutcome>> outcomes;
  Millis finished_at = 0;  // when its last delivery ended
};

void Relay::Start() {
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

void Relay::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

void Relay::Run(std::stop_token stop) {
  std::unique_ptr<Round> ahead;      // claimed, not yet delivered
  std::unique_ptr<Round> delivered;  // delivered, not yet recorded
  while (true) {
    const bool stopping = stop.stop_requested();
    if (stopping && ahead == nullptr && delivered == nullptr) return;
    absl::StatusOr<int> attempted = Turn(ahead, delivered, stop);
    if (stopping) continue;  // what it holds goes out and is recorded, then it returns
    if (!attempted.ok()) {
      Log(LogLevel::kWarning, "relay: " + attempted.status().ToString());
      clock_->WaitFor(std::max(config_.poll_interval, kErrorPause), stop);
    } else if (*attempted == 0 && ahead == nullptr && delivered == nullptr) {
      clock_->WaitFor(config_.poll_interval, stop);
    }
  }
}

bool Relay::Fits(const Round& round, const std::string& sink) const {
  return clock_->NowMillis() + sinks_.at(sink)->longest_attempt() < round.leases_end;
}

bool Relay::StillFits(const Round& round) const {
  return std::all_of(round.claims.begin(), round.claims.end(),
                     [&](const DeliveryClaim& claim) { return Fits(round, claim.sink); });
}

absl::StatusOr<int> Relay::Turn(std::unique_ptr<Round>& ahead, std::unique_ptr<Round>& delivered,
                                std::stop_token stop) {
  MutexLock lock(mu_);
  if (ahead != nullptr) {
    // Sinks that answered 410 in the round before: it is recorded (they are disabled,
    // with one alert each) before their next claims could go out, and those stay
    // back (leased until their lease ends). Claims that no longer fit in their leases
    // (the round before took longer than the ones before it) are let go, and claimed
    // afresh below once nothing else of this relay's is leased.
    std::set<std::string> gone;
    for (size_t i = 0; delivered != nullptr && i < delivered->claims.size(); ++i) {
      const std::optional<DeliveryOutcome>& outcome = delivered->outcomes[i];
      if (outcome && outcome->result == DeliveryOutcome::Result::kEndpointGone) {
        gone.insert(delivered->claims[i].sink);
      }
    }
    const bool fits = StillFits(*ahead);
    if (!gone.empty() || !fits) WS_RETURN_IF_ERROR(Record(delivered));
    if (!fits) {
      ahead.reset();
      WS_RETURN_IF_ERROR(store_->ExpireDeliveryLeases(owner_));
    } else {
      std::erase_if(ahead->claims,
                    [&](const DeliveryClaim& claim) { return gone.contains(claim.sink); });
    }
  }
  if (ahead == nullptr && !stop.stop_requested()) {
    // Nothing claimed ahead: the round before is recorded first, so that its
    // instances' next events can be claimed now; no claims over one not recorded.
    WS_RETURN_IF_ERROR(Record(delivered));
    WS_ASSIGN_OR_RETURN(ahead, Claim());
  }
  std::unique_ptr<Round> round = std::move(ahead);
  if (round != nullptr && round->claims.empty()) round.reset();
  const Millis started_at = clock_->NowMillis();
  absl::Status status;
  if (round != nullptr) StartDelivering(*round);
  {
    // Whatever happens below, the round's tasks end before it can go.
    absl::Cleanup wait = [this] { pool_->Wait(); };
    // While the sinks take the round: the one before is recorded, then the next
    // claimed, if this one should be out well within a lease (as the last one was).
    status.Update(Record(delivered));
    Millis longest = 0;
    for (const auto& [name, sink] : sinks_) longest = std::max(longest, sink->longest_attempt());
    if (round != nullptr && status.ok() && !stop.stop_requested() &&
        last_round_ + longest < config_.lease / 2) {
      absl::StatusOr<std::unique_ptr<Round>> claimed = Claim();
      if (claimed.ok() && !(*claimed)->claims.empty()) ahead = std::move(*claimed);
      status.Update(claimed.status());
    }
  }
  if (round == nullptr) {
    if (!status.ok()) return status;
    return 0;
  }
  round->finished_at = clock_->NowMillis();
  last_round_ = round->finished_at - started_at;
  const int attempted = static_cast<int>(round->claims.size());
  delivered = std::move(round);  // recorded by the next turn, while its round is out
  if (!status.ok()) return status;
  return attempted;
}

absl::StatusOr<int> Relay::RunOnce() {
  MutexLock lock(mu_);
  WS_ASSIGN_OR_RETURN(std::unique_ptr<Round> round, Claim());
  StartDelivering(*round);
  pool_->Wait();
  round->finished_at = clock_->NowMillis();
  // One transaction for the round: a relay killed before it commits delivers the
  // round's acknowledged events again, with the same ids (at least once).
  const int attempted = static_cast<int>(round->claims.size());
  WS_RETURN_IF_ERROR(Record(round));
  return attempted;
}

absl::StatusOr<std::unique_ptr<Relay::Round>> Relay::Claim() {
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
  auto round = std::make_unique<Round>();
  if (enabled.empty()) return round;
  const Millis claimed_at = clock_->NowMillis();
  WS_ASSIGN_OR_RETURN(round->claims, store_->ClaimDeliveries(owner_, claimed_at, config_.lease,
                                                             config_.batch, enabled));
  for (const DeliveryClaim& claim : round->claims) {
    if (!sinks_.contains(claim.sink)) return absl::InternalError("no sink named " + claim.sink);
  }
  round->leases_end = claimed_at + config_.lease;
  return round;
}

absl::Status Relay::Record(std::unique_ptr<Round>& delivered) {
  if (delivered == nullptr) return absl::OkStatus();
  // Recorded, or (on an error) left to its leases' end and delivered again.
  const std::unique_ptr<Round> kept = std::move(delivered);
  const Round& round = *kept;
  std::vector<FinishedDelivery> finished;
  for (size_t i = 0; i < round.claims.size(); ++i) {
    if (!round.outcomes[i]) continue;
    finished.push_back(
        {round.claims[i], UpdateFor(round.claims[i], *round.outcomes[i], round.finished_at)});
  }
  if (finished.empty()) return absl::OkStatus();
  WS_ASSIGN_OR_RETURN(std::vector<absl::Status> results, store_->FinishDeliveries(finished));
  for (const absl::Status& status : results) {
    if (!status.ok()) Log(LogLevel::kInfo, "relay: " + std::string(status.message()));
  }
  return absl::OkStatus();
}

absl::Status Relay::Expand() {
  for (const SinkConfig& sink : config_.sinks) {
    WS_ASSIGN_OR_RETURN(int64_t cursor, store_->OutboxCursor(sink.name));
    WS_ASSIGN_OR_RETURN(std::vector<EventRecord> rows, store_->ReadOutbox(cursor, kExpandBatch));
    if (rows.empty()) continue;
    std::vector<std::pair<int64_t, int64_t>> wanted;  // seq, instance id
    for (const EventRecord& row : rows) {
      if (!sink.Serves(row.tenant)) continue;  // another tenant's event
      const bool wants = IsAlertType(row.type)
                             ? sink.name == config_.alert_sink ||
                                   (!sink.events.empty() && sink.Wants(row.type, WorkflowOf(row)))
                             : sink.Wants(row.type, WorkflowOf(row));
      if (wants) wanted.emplace_back(row.seq, row.instance_id);
    }
    auto status =
        store_->AddDeliveries(sink.name, cursor, rows.back().seq, wanted, clock_->NowMillis());
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
    AlertRecord alert{0,
                      s.instance_id,
                      s.tenant,
                      s.step,
                      AlertKind::kUnknownUnresolved,
                      AlertState::kOpen,
                      "outcome of step '" + s.step + "' unknown since " +
                          std::to_string((now - s.unknown_since) / 1000) + "s ago",
                      now};
    WS_RETURN_IF_ERROR(store_->RaiseAlert(alert, AlertEvent(alert, now)).status());
  }
  return absl::OkStatus();
}

void Relay::StartDelivering(Round& round) {
  // The store claims only the oldest pending delivery of each instance and sink, so a
  // lane holds one claim; should it hold more, they go one after another in outbox
  // order and stop at the first not acknowledged (the rest keep their lease until it
  // expires), so no event overtakes an earlier one.
  for (size_t i = 0; i < round.claims.size(); ++i) {
    round.lanes[{round.claims[i].sink, round.claims[i].event.instance_id}].push_back(i);
  }
  round.outcomes.assign(round.claims.size(), std::nullopt);
  // A lane of one claim to a sink that takes batches goes in a batch (the sink's share
  // of the round split over the pool's threads); any other lane is a task of its own.
  std::map<std::string, std::vector<size_t>> batched;  // by sink
  round.tasks.reserve(round.lanes.size());
  for (const auto& [lane, indexes] : round.lanes) {
    if (indexes.size() == 1 && sinks_.at(lane.first)->delivers_batches()) {
      batched[lane.first].push_back(indexes.front());
      continue;
    }
    round.tasks.push_back([this, &round, indexes = &indexes] {
      for (size_t i : *indexes) {
        const DeliveryClaim& claim = round.claims[i];
        if (!Fits(round, claim.sink)) break;  // left to expire
        std::optional<DeliveryOutcome>& outcome = round.outcomes[i];
        try {
          outcome = Attempt(claim);
        } catch (const std::exception& e) {
          // A sink that throws is a failed attempt, retried like any other.
          outcome = DeliveryOutcome{DeliveryOutcome::Result::kRetry,
                                    std::string("delivery threw: ") + e.what()};
        }
        if (outcome->result != DeliveryOutcome::Result::kDelivered) break;
      }
    });
  }
  for (const auto& [sink, indexes] : batched) {
    const size_t share = (indexes.size() + config_.parallel - 1) / config_.parallel;
    for (size_t first = 0; first < indexes.size(); first += share) {
      const size_t last = std::min(indexes.size(), first + share);
      round.batches.emplace_back(indexes.begin() + first, indexes.begin() + last);
    }
  }
  for (const std::vector<size_t>& batch : round.batches) {  // complete: no more moves
    round.tasks.push_back([this, &round, &batch] { DeliverBatch(round, batch); });
  }
  pool_->Start(round.tasks);
}

void Relay::DeliverBatch(Round& round, const std::vector<size_t>& batch) {
  const std::string& name = round.claims[batch.front()].sink;
  if (!Fits(round, name)) return;  // left to expire
  Sink& sink = *sinks_.at(name);
  std::vector<const EventRecord*> events;
  std::vector<std::string> bodies;
  for (size_t i : batch) {
    events.push_back(&round.claims[i].event);
    bodies.push_back(ToCloudEventJson(round.claims[i].event, config_.deployment));
  }
  CrashPoint("before-deliver", name);
  std::vector<DeliveryOutcome> outcomes;
  try {
    outcomes = sink.DeliverBatch(events, bodies, [&] { return Fits(round, name); });
  } catch (const std::exception& e) {
    // A sink that throws is a failed attempt of each, retried like any other.
    outcomes.assign(batch.size(), DeliveryOutcome{DeliveryOutcome::Result::kRetry,
                                                  std::string("delivery threw: ") + e.what()});
  }
  CrashPoint("after-deliver", name);
  // Events past the last outcome were not attempted: left to expire, as a lane's are.
  for (size_t k = 0; k < std::min(batch.size(), outcomes.size()); ++k) {
    outcomes[k].detail = RedactSecrets(outcomes[k].detail);  // as Attempt does
    round.outcomes[batch[k]] = std::move(outcomes[k]);
  }
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

DeliveryUpdate Relay::UpdateFor(const DeliveryClaim& claim, DeliveryOutcome outcome, Millis now) {
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
        AlertRecord alert{0,
                          claim.event.instance_id,
                          claim.event.tenant,
                          "",
                          AlertKind::kDeliveryParked,
                          AlertState::kOpen,
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
      AlertRecord alert{0,
                        claim.event.instance_id,
                        claim.event.tenant,
                        "",
                        AlertKind::kSinkDisabled,
                        AlertState::kOpen,
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
