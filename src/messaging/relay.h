#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "base/random.h"
#include "connectors/http/http_client.h"
#include "messaging/delivery_pool.h"
#include "messaging/relay_config.h"
#include "messaging/sink.h"
#include "store/store.h"

namespace waystone {

// Relay delivers committed outbox rows to sinks, at least once, in order per
// instance and sink. Each round it (1) raises alerts for unknown outcomes left
// unresolved too long, (2) expands new outbox rows into one delivery per wanting
// sink, (3) claims due deliveries — only the oldest undelivered one of each
// instance per sink, under a lease, so relays never deliver the same row at once
// — and (4) delivers them, up to `parallel` at once (each of another instance or
// sink, so never two of one instance and sink in flight), and marks the round's
// outcomes in one transaction: delivered only where the sink acknowledged.
// Failures are retried with backoff and jitter; a delivery that keeps failing is
// parked with an alert; a 410 disables the sink (its deliveries wait) with an
// alert. Owns one thread between Start() and Stop(), and a pool of `parallel`
// delivery threads for its lifetime. Thread-safe.
class Relay {
 public:
  // The pointers must outlive the relay. `owner` names it in leases.
  static absl::StatusOr<std::unique_ptr<Relay>> Create(Store* store, HttpClient* http,
                                                       const Clock* clock, Random* random,
                                                       const RelayConfig& config,
                                                       const std::string& owner);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Start runs Run on a thread of the relay's until Stop.
  void Start();
  void Stop();

  // Runs rounds until `stop`, each round's deliveries overlapping the store's work
  // around them: while the sinks take round N, the relay records round N-1's
  // outcomes and claims round N+1 (the lanes of round N stay leased, so no event
  // overtakes another). It claims ahead only while the last round and the sinks'
  // longest attempt fit in half a lease; claims that no longer fit when their turn
  // comes are let go and claimed afresh. On `stop` it delivers and records what it
  // holds. After an error it waits at least a second.
  void Run(std::stop_token stop) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs one round from claim to record; returns how many deliveries it claimed.
  absl::StatusOr<int> RunOnce() ABSL_LOCKS_EXCLUDED(mu_);

  // Replaces a sink (tests inject failing ones).
  void SetSinkForTest(const std::string& name, std::unique_ptr<Sink> sink);

 private:
  Relay(Store* store, const Clock* clock, Random* random, const RelayConfig& config,
        const std::string& owner);
  struct Round;

  absl::Status Expand();
  absl::Status RaiseStaleUnknownAlerts();
  // The store's work before a round: alerts for old unknown outcomes, the outbox
  // expanded into deliveries, dead local relays' leases taken, and the claims.
  absl::StatusOr<std::unique_ptr<Round>> Claim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts handing each of `round`'s claims to its sink on the pool, in parallel
  // across instances and sinks; pool_->Wait() ends it. One outcome per claim, none
  // for a claim left unattempted behind a failed one. A claim is attempted only while
  // its sink's longest attempt fits before the claims' leases end (in a lane, and
  // within a batch): past it, another relay may have claimed it (and the ones after)
  // and be delivering it; one left unattempted waits for its lease to end.
  void StartDelivering(Round& round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the outcomes of `delivered` (none: nothing) in one transaction, and lets
  // the round go.
  absl::Status Record(std::unique_ptr<Round>& delivered) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One turn of Run: delivers `ahead` (claimed now when there is none, unless
  // stopping), records `delivered` meanwhile and claims the next round into `ahead`;
  // then `delivered` is the round just delivered. Returns how many it claimed.
  absl::StatusOr<int> Turn(std::unique_ptr<Round>& ahead, std::unique_ptr<Round>& delivered,
                           std::stop_token stop) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether an attempt to `sink` begun now ends before `round`'s leases do: past
  // them, another relay may have claimed its deliveries and be delivering them.
  bool Fits(const Round& round, const std::string& sink) const;
  // Whether every claim of `round` Fits.
  bool StillFits(const Round& round) const;
  DeliveryOutcome Attempt(const DeliveryClaim& claim);
  // Hands the claims `batch` (indexes into `round`, of one sink) to the sink together;
  // the sink starts each only while it Fits. Sets the outcomes of those attempted.
  void DeliverBatch(Round& round, const std::vector<size_t>& batch);
  // What an outcome means for the delivery (a 410 carries the sink's alert; the store
  // writes one per sink disabled in a batch).
  DeliveryUpdate UpdateFor(const DeliveryClaim& claim, DeliveryOutcome outcome, Millis now);
  EventRecord AlertEvent(const AlertRecord& alert, Millis now);

  Store* store_;
  const Clock* clock_;
  Random* random_;
  RelayConfig config_;
  std::string owner_;
  Mutex mu_;  // one round at a time
  // Changed only under mu_ (SetSinkForTest); read by the delivery threads while a
  // round, which holds mu_, waits for them.
  std::map<std::string, std::unique_ptr<Sink>> sinks_;
  std::unique_ptr<DeliveryPool> pool_;
  Millis last_unknown_scan_ = 0;
  // When this relay last looked for dead relays' leases.
  std::optional<Millis> last_reap_ ABSL_GUARDED_BY(mu_);
  // How long Run's last round took to deliver; claims are taken ahead only after a
  // quick one.
  Millis last_round_ ABSL_GUARDED_BY(mu_) = 0;
  std::jthread thread_;
};

}  // namespace waystone
