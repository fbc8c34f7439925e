#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
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

  void Start();
  void Stop();

  // Runs one round; returns how many deliveries were attempted.
  absl::StatusOr<int> RunOnce();

  // Replaces a sink (tests inject failing ones).
  void SetSinkForTest(const std::string& name, std::unique_ptr<Sink> sink);

 private:
  Relay(Store* store, const Clock* clock, Random* random, const RelayConfig& config,
        const std::string& owner);
  absl::Status Expand();
  absl::Status RaiseStaleUnknownAlerts();
  // Hands each claim to its sink, in parallel across instances and sinks; one
  // outcome per claim, none for a claim left unattempted behind a failed one. A claim
  // is attempted only while its sink's longest attempt fits before `leases_end`: past
  // it, another relay may have claimed it (and the ones after) and be delivering it.
  std::vector<std::optional<DeliveryOutcome>> DeliverAll(const std::vector<DeliveryClaim>& claims,
                                                         Millis leases_end);
  DeliveryOutcome Attempt(const DeliveryClaim& claim);
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
  std::jthread thread_;
};

}  // namespace waystone
